/* Shared definitions of libremax's native CPU kernels.
 *
 * The library is compiled on the machine that runs it (see ../build.py), so
 * the SIMD paths are chosen at compile time from the compiler's target
 * macros (__AVX512F__, __AVX512VNNI__, __AVX512BF16__, __AVX2__ ...); every
 * kernel also has a portable scalar path, which the tests compile and check
 * separately.  Parallel loops use OpenMP; the library links the same
 * libgomp that torch loaded, so torch's operators and these kernels share
 * one thread pool (never two pools spinning against each other).
 */
#ifndef LIBREMAX_COMMON_H
#define LIBREMAX_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* The variant being compiled (build.py passes explicit target flags, one library per variant);
   LMX_PORTABLE (the generic variant) compiles none of the SIMD paths, whatever the target has. */
#if !defined(LMX_PORTABLE) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LMX_AVX512 1
#include <immintrin.h>
#endif
#if defined(LMX_AVX512) && defined(__AVX512VNNI__)
#define LMX_AVX512VNNI 1
#endif
#if defined(LMX_AVX512) && defined(__AVX512BF16__)
#define LMX_AVX512BF16 1
#endif
#if !defined(LMX_PORTABLE) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LMX_AVX2 1
#include <immintrin.h>
#endif
#if defined(LMX_AVX2) && defined(__AVXVNNI__)
#define LMX_AVXVNNI 1 /* VEX-encoded vpdpbusd on 256-bit vectors */
#endif
#if !defined(LMX_PORTABLE) && defined(__aarch64__) && defined(__ARM_NEON)
#define LMX_NEON 1
#include <arm_neon.h>
#endif
#if defined(LMX_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define LMX_NEONDOT 1
#endif

#define LMX_API __attribute__((visibility("default")))
#define LMX_INLINE static inline __attribute__((always_inline))

/* IEEE half -> float, exact for every input (NaN payloads kept). */
/* Two int16 values in one int32 (lo in the low 16 bits): the layout vpmaddwd reads as a pair. */
LMX_INLINE int32_t lmx_int16_pair(int lo, int hi) { return (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16)); }

LMX_INLINE float lmx_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            man &= 0x3FFu;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> IEEE half, round to nearest even (overflow -> inf, NaN stays NaN), as numpy's astype. */
LMX_INLINE uint16_t lmx_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                   /* below the smallest normal half */
        if (ax < 0x33000000u) return (uint16_t)sign;           /* < 2^-25: rounds to zero */
        const uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126 - e;                        /* 14 + (113 - e) */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax - 0x38000000u) >> 13);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

LMX_INLINE float lmx_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

LMX_INLINE uint16_t lmx_f2bf(float f) { /* round to nearest even, NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#ifdef LMX_AVX512
/* 2^t per lane (t in about [-127, 127]): exp2 of the fraction by a degree-6 polynomial, scaled by
   the integer part.  exp(x) = lmx_exp2_ps(x * log2(e)). */
LMX_INLINE __m512 lmx_exp2_ps(__m512 t) {
    __m512 fi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, fi);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, fi);
}
#endif

#ifdef LMX_AVX2
/* 2^t per lane for t in about [-127, 127] (the AVX2 form of lmx_exp2_ps): the same polynomial; the
   integer part scales through the exponent field (2^-127 flushes to zero). */
LMX_INLINE __m256 lmx_exp2_ps256(__m256 t) {
    __m256 fi = _mm256_floor_ps(t);
    __m256 f = _mm256_sub_ps(t, fi);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_max_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fi), _mm256_set1_epi32(127)), _mm256_setzero_si256());
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}
#endif

#ifdef LMX_AVX2
LMX_INLINE float lmx_hsum256(__m256 v) { /* horizontal sum, a fixed order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

LMX_INLINE int32_t lmx_hsum256i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Lanes i < n all ones (for masked loads of a tail of n < 8 floats). */
LMX_INLINE __m256i lmx_tailmask256(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

#ifdef LMX_NEON
/* The NEON lmx_exp2_ps: 2^t per lane (t in about [-127, 127]), the same degree-6 polynomial of the
   fraction, times 2^fi built as two normal powers of two (2^(fi/2) twice, so fi = -127 is not
   flushed to zero). */
LMX_INLINE float32x4_t lmx_exp2_f32x4(float32x4_t t) {
    const float32x4_t fi = vrndmq_f32(t);
    const float32x4_t f = vsubq_f32(t, fi);
    float32x4_t p = vdupq_n_f32(1.535336188319500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.339887440266574e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(9.618437357674640e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(5.550332471162809e-2f), p, f);
    p = vfmaq_f32(vdupq_n_f32(2.402264791363012e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(6.931472028550421e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t e = vcvtq_s32_f32(fi);
    const int32x4_t e1 = vshrq_n_s32(e, 1), e2 = vsubq_s32(e, e1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e1, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

/* 4 fp16 (IEEE half) at p widened exactly to float32. */
LMX_INLINE float32x4_t lmx_h4(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)p)));
}

/* 4 signed / unsigned bytes at p as float32. */
LMX_INLINE float32x4_t lmx_i8x4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    const int16x8_t w = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(v)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
}
LMX_INLINE float32x4_t lmx_u8x4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    const uint16x8_t w = vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(v)));
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
}

/* acc + per 32-bit lane r: sum_{i<4} c[4r+i] * x[4l+i] (x's 4-byte lane l broadcast), the SDOT by
   element; without the dotprod extension, widening products summed pairwise. */
#ifdef LMX_NEONDOT
#define LMX_SDOT_LANE(ACC, C, X, L) vdotq_laneq_s32((ACC), (C), (X), (L))
#else
#define LMX_SDOT_LANE(ACC, C, X, L) lmx_sdot_lane_emul((ACC), (C), vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(X), (L))))
LMX_INLINE int32x4_t lmx_sdot_lane_emul(int32x4_t acc, int8x16_t c, int8x16_t xb) {
    const int16x8_t lo = vmull_s8(vget_low_s8(c), vget_low_s8(xb)), hi = vmull_high_s8(c, xb);
    /* |product| <= 128 * 127, so a pair fits int16; then pairs of pairs into 32 bits */
    return vaddq_s32(acc, vpaddlq_s16(vpaddq_s16(lo, hi)));
}
#endif

/* acc + per lane r: sum_{i<4} a[4r+i] * b[4r+i] (the plain SDOT). */
LMX_INLINE int32x4_t lmx_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef LMX_NEONDOT
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddlq_s16(vpaddq_s16(lo, hi)));
#endif
}
#endif

LMX_INLINE uint16_t lmx_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* GGML block kinds (values of gguf's GGMLQuantizationType). */
enum {
    LMX_F32 = 0, LMX_F16 = 1, LMX_Q4_0 = 2, LMX_Q4_1 = 3, LMX_Q5_0 = 6, LMX_Q5_1 = 7, LMX_Q8_0 = 8,
    LMX_Q2_K = 10, LMX_Q3_K = 11, LMX_Q4_K = 12, LMX_Q5_K = 13, LMX_Q6_K = 14, LMX_BF16 = 30,
};

/* Field decoders of the GGML K-quant super-blocks (256 values each), shared by dequantisation
   (quant.c), the GGML-layout kernel (qmatmul.c) and the repacker (qpacked.c). */

/* The 8 six-bit scales and mins of a Q4_K / Q5_K super-block (s = its 12 scale bytes). */
LMX_INLINE void lmx_k4_scale_min(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30));
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
    }
}

/* The 16 signed six-bit scales of a Q3_K super-block (s = its 12 scale bytes). */
LMX_INLINE void lmx_q3k_scales(const uint8_t *s, int8_t sc[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
        int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* The 256 unsigned codes of a Q2_K (0..3), Q3_K (0..7; value = code - 4), Q4_K (0..15), Q5_K
   (0..31) or Q6_K (0..63; value = code - 32) super-block, in element order; the scale of element e
   is that of sub-block e / 16 (Q2_K, Q3_K, Q6_K) or e / 32 (Q4_K, Q5_K). */
LMX_INLINE void lmx_kquant_codes(int kind, const uint8_t *b, uint8_t u[256]) {
    if (kind == LMX_Q2_K || kind == LMX_Q3_K) {
        const uint8_t *qs = b + (kind == LMX_Q2_K ? 16 : 32), *hm = b;
        for (int e = 0; e < 256; e++) {
            int ql = (qs[(e >> 7) * 32 + (e & 31)] >> (((e >> 5) & 3) * 2)) & 3;
            u[e] = (uint8_t)(kind == LMX_Q2_K ? ql : ql + 4 * ((hm[e & 31] >> (e >> 5)) & 1));
        }
    } else if (kind == LMX_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        for (int e = 0; e < 256; e++) {
            int h = e >> 7, r = e & 127, part = r >> 5, l = r & 31;
            int lo = (ql[64 * h + (part & 1) * 32 + l] >> ((part >> 1) * 4)) & 0x0F;
            int hi = (qh[32 * h + l] >> (2 * part)) & 3;
            u[e] = (uint8_t)(lo | (hi << 4));
        }
    } else { /* Q4_K, Q5_K */
        const uint8_t *qh = b + 16, *qs = kind == LMX_Q4_K ? b + 16 : b + 48;
        for (int e = 0; e < 256; e++) {
            int j = e >> 5, l = e & 31;
            int q = (qs[(j >> 1) * 32 + l] >> ((j & 1) * 4)) & 0x0F;
            if (kind == LMX_Q5_K) q |= ((qh[l] >> j) & 1) << 4;
            u[e] = (uint8_t)q;
        }
    }
}

int lmx_num_threads(void);

/* Refined activation codes (qmatmul.c, read by the packed kernels in qpacked.c).  Per activation row, the
 * 32-value blocks with the largest scales (at most a fraction of them, lmx_set_act_refine; with a threshold t > 0,
 * lmx_set_act_refine_threshold, only those whose squared scale is at least t times the row's mean: the blocks
 * that hold most of the row's quantisation error) carry a second set of 8-bit codes: those of the residual x - d q of the first codes, with their own scale.  The kernels add, for
 * each selected block, the sums of its residual codes (in a separate accumulator of the row, added to the row's
 * result at the end), reusing the unpacked weight codes: about 16 bits of precision where the 8-bit codes lose
 * most.  The selection depends on
 * the row alone, so a row's result does not depend on the batch around it.
 *   rq, rdxb, rsxb, rsx16, rixp  the residual codes and sums, laid out as the first codes (same KP and BP);
 *   rows, rw               per block, a bit mask of the rows that refine it (rows = NULL: refining is off). */
typedef struct {
    const int8_t *rq;
    const float *rdxb, *rsxb, *rsx16;
    const int32_t *rixp;
    const uint64_t *rows; /* rows[b * rw + w]: bit j set when row 64 w + j refines block b (NULL: none does) */
    int64_t rw;
} lmx_refine_t;

int lmx_act_refine(int64_t M, int64_t K, const float *x, int64_t xs, const int8_t *xq, const float *dxb,
                   int64_t KP, int64_t BP, int nt, lmx_refine_t *out);
int64_t lmx_block_bytes(int kind);
int64_t lmx_block_elems(int kind);
int lmx_dequant_row(int kind, const uint8_t *src, float *dst, int64_t n);
void lmx_rmsnorm(const float *x, int64_t M, int64_t K, int64_t xs, const float *w, float eps, float *out, int64_t os);
int lmx_prenorm(const float **x, int64_t *xs, int64_t M, int64_t K, const float *w, float eps);
void lmx_dense_rows(int kind, const uint8_t *w, int64_t rb, int64_t r0, int64_t r1, const float *x, int64_t xs,
                    int64_t M, int64_t K, float *y, int64_t ys);

/* y[m, offs[i] + n] += bias[i][n] for every weight i that has a bias.  Called by every thread of the
   matmul entries' parallel region once their columns are written (the barrier waits for all). */
LMX_INLINE void lmx_add_biases(int64_t M, int nw, const int64_t *N, const int64_t *offs,
                               const float *const *bias, float *y, int64_t y_stride) {
    if (!bias) return;
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < nw; i++)
            if (bias[i])
                for (int64_t n = 0; n < N[i]; n++) y[m * y_stride + offs[i] + n] += bias[i][n];
}


/* Dot product with 8 partial sums (the compiler vectorises them; their order is fixed, so results do not
   depend on the ISA variant beyond float rounding of the partial sums). */
LMX_INLINE float lmx_dot8(const float *a, const float *b, int64_t n) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += a[i + j] * b[i + j];
    float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

LMX_INLINE float lmx_silu(float v) { return v / (1.0f + expf(-v)); }

#endif
