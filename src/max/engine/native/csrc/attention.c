/* Attention over the paged KV cache, for ragged batches (prefill and decode
 * of different requests in one call), and the step's K/V write with RoPE.
 *
 * Cache pool layout (element strides given by the caller):
 *   blocks[page][0 = K | 1 = V][layer][offset in page][kv_head][row]
 * stored as float32 or bfloat16 (row = head_dim values), or as scaled 8-bit codes (int8 or fp8 e4m3fn:
 * row = head_dim codes then the row's float32 scale, head_dim + 4 bytes; value = code * scale, one
 * symmetric scale per (token, kv head) row).  kv_kind names which.
 */
#include "common.h"

#define LMX_KV_I8 24      /* int8 codes + float32 scale per row */
#define LMX_KV_F8E4M3 66  /* fp8 e4m3fn codes + float32 scale per row */

#define ATT_TK 4  /* keys per score tile (SIMD variants) */
#define ATT_VB 32 /* keys per value block (SIMD variants; 32 rows of D floats stay in L1) */

typedef struct {
    void *base;
    int64_t s_page, s_kv, s_layer, s_off; /* element strides */
    int kind;                              /* LMX_F32, LMX_BF16, LMX_KV_I8 or LMX_KV_F8E4M3 */
    int64_t hs;                            /* elements per kv_head row: head_dim (+ 4 when quantised) */
} cache_t;

LMX_INLINE int kv_quantised(int kind) { return kind == LMX_KV_I8 || kind == LMX_KV_F8E4M3; }

/* fp8 e4m3fn (bias 7, no infinities, S.1111.111 = NaN) -> float, every code. */
static float e4m3_lut[256];
static int e4m3_ready = 0;

static void e4m3_init(void) {
    if (__atomic_load_n(&e4m3_ready, __ATOMIC_ACQUIRE)) return;
    for (int c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        float v;
        if (e == 15 && m == 7) v = NAN;
        else if (e == 0) v = (float)m * (1.0f / 512.0f);
        else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
        e4m3_lut[c] = (c & 0x80) ? -v : v;
    }
    __atomic_store_n(&e4m3_ready, 1, __ATOMIC_RELEASE);
}

/* float (|y| <= 448) -> fp8 e4m3fn, round to nearest even (as torch's conversion). */
LMX_INLINE uint8_t f2e4m3(float y) {
    uint32_t b;
    memcpy(&b, &y, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
    uint32_t a = b & 0x7FFFFFFFu;
    float ay;
    memcpy(&ay, &a, 4);
    if (ay < 0.015625f) return (uint8_t)(sign | (uint8_t)nearbyintf(ay * 512.0f)); /* subnormals: 2^-9 steps */
    a += 0x7FFFFu + ((a >> 20) & 1u);
    return (uint8_t)(sign | ((((a >> 23) - 120u) << 3) | ((a >> 20) & 7u)));
}

/* One row of n values as codes + scale: scale = amax / qmax, code = round_half_even(x * (qmax / amax))
   clamped to +-qmax (the torch kernels' kv_encode computes the same, bit for bit). */
static void quant_row(int kind, uint8_t *dst, const float *src, int64_t n) {
    const float qmax = kind == LMX_KV_I8 ? 127.0f : 448.0f;
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
    const float inv = amax > 0 ? qmax / amax : 0.0f;
    const float scale = amax / qmax;
    if (kind == LMX_KV_I8) {
        for (int64_t i = 0; i < n; i++) {
            float y = nearbyintf(src[i] * inv);
            y = y > qmax ? qmax : (y < -qmax ? -qmax : y);
            dst[i] = (uint8_t)(int8_t)y;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float y = src[i] * inv;
            y = y > qmax ? qmax : (y < -qmax ? -qmax : y);
            dst[i] = f2e4m3(y);
        }
    }
    memcpy(dst + n, &scale, 4);
}

/* codes + scale -> n floats */
LMX_INLINE void dequant_row(int kind, const uint8_t *src, float *dst, int64_t n) {
    float scale;
    memcpy(&scale, src + n, 4);
    int64_t i = 0;
    if (kind == LMX_KV_I8) {
        const int8_t *s8 = (const int8_t *)src;
#ifdef LMX_AVX512
        const __m512 vs = _mm512_set1_ps(scale);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(s8 + i)))), vs));
#elif defined(LMX_AVX2)
        const __m256 vs = _mm256_set1_ps(scale);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(s8 + i)))), vs));
#elif defined(LMX_NEON)
        for (; i + 8 <= n; i += 8) {
            const int16x8_t w = vmovl_s8(vld1_s8(s8 + i));
            vst1q_f32(dst + i, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), scale));
            vst1q_f32(dst + i + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), scale));
        }
#endif
        for (; i < n; i++) dst[i] = (float)s8[i] * scale;
    } else {
#ifdef LMX_AVX512
        const __m512 vs = _mm512_set1_ps(scale);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_i32gather_ps(_mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i *)(src + i))), e4m3_lut, 4), vs));
#elif defined(LMX_AVX2)
        const __m256 vs = _mm256_set1_ps(scale);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_i32gather_ps(e4m3_lut, _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(src + i))), 4), vs));
#endif
        for (; i < n; i++) dst[i] = e4m3_lut[src[i]] * scale;
    }
}

LMX_INLINE void cache_store(const cache_t *c, int64_t idx, const float *src, int64_t n) {
    if (c->kind == LMX_F32) {
        memcpy((float *)c->base + idx, src, (size_t)n * 4);
    } else if (kv_quantised(c->kind)) {
        quant_row(c->kind, (uint8_t *)c->base + idx, src, n);
    } else {
        uint16_t *d = (uint16_t *)c->base + idx;
        for (int64_t i = 0; i < n; i++) d[i] = lmx_f2bf(src[i]);
    }
}

LMX_INLINE void cache_load(const cache_t *c, int64_t idx, float *dst, int64_t n) {
    if (c->kind == LMX_F32) {
        memcpy(dst, (const float *)c->base + idx, (size_t)n * 4);
    } else if (kv_quantised(c->kind)) {
        dequant_row(c->kind, (const uint8_t *)c->base + idx, dst, n);
    } else {
        const uint16_t *s = (const uint16_t *)c->base + idx;
        for (int64_t i = 0; i < n; i++) dst[i] = lmx_bf2f(s[i]);
    }
}

/* Checks kv_kind and sets up what it needs; the row stride in elements (-1: unknown kind). */
static int64_t kv_row_stride(int kind, int64_t D) {
    if (kind == LMX_F32 || kind == LMX_BF16) return D;
    if (kind == LMX_KV_I8) return D + 4;
    if (kind == LMX_KV_F8E4M3) { e4m3_init(); return D + 4; }
    return -1;
}

static void head_rmsnorm(float *x, int64_t D, const float *g, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) x[i] = x[i] * r * g[i];
}

/* Rotate the first R dims of x (R even): cs holds R/2 (cos, sin) pairs of one position;
 * interleaved pairs are (2i, 2i+1), else (i, i + R/2).  Dims R.. pass through. */
static void rope(float *x, int64_t R, const float *cs, int interleaved) {
    const int64_t h = R / 2;
    if (interleaved) {
        for (int64_t i = 0; i < h; i++) {
            float a = x[2 * i], b = x[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    } else {
        for (int64_t i = 0; i < h; i++) {
            float a = x[i], b = x[i + h], c = cs[2 * i], s = cs[2 * i + 1];
            x[i] = a * c - b * s;
            x[i + h] = a * s + b * c;
        }
    }
}

/* Split qkv [T, (H + 2 Hkv) D] into Q (returned in q_out [T, H, D]) and this step's K, V (written to the
 * cache at (page, offset) of each token), applying per-head RMSNorm (q_gamma/k_gamma, optional) and then
 * RoPE at each token's position on the first R dims of each head (freqs [max_pos, R] of (cos, sin)
 * pairs; NULL: no rotation). */
LMX_API int lmx_qkv_rope_store(const float *qkv, int64_t T, int64_t qkv_stride, int64_t H, int64_t Hkv, int64_t D,
                               const int64_t *pos, const float *freqs, int64_t max_pos, int64_t R, int interleaved,
                               const float *q_gamma, const float *k_gamma, float eps, float *q_out,
                               void *cache, int kv_kind, int64_t s_page, int64_t s_kv, int64_t s_layer,
                               int64_t s_off, int64_t layer, const int64_t *wpage, const int64_t *woff) {
    if (D > 1024 || (freqs && (R % 2 || R > D || R <= 0))) return -1;
    for (int64_t t = 0; t < T; t++)
        if (freqs && (pos[t] < 0 || pos[t] >= max_pos)) return -2;
    const int64_t hs = kv_row_stride(kv_kind, D);
    if (hs < 0) return -1;
    cache_t c = {cache, s_page, s_kv, s_layer, s_off, kv_kind, hs};
#pragma omp parallel for schedule(static) if (T * (H + 2 * Hkv) * D > (1 << 16))
    for (int64_t t = 0; t < T; t++) {
        const float *row = qkv + t * qkv_stride;
        const float *cs = freqs ? freqs + pos[t] * R : NULL;
        float buf[1024];
        for (int64_t h = 0; h < H; h++) {
            float *q = q_out + (t * H + h) * D;
            memcpy(q, row + h * D, (size_t)D * 4);
            if (q_gamma) head_rmsnorm(q, D, q_gamma, eps);
            if (cs) rope(q, R, cs, interleaved);
        }
        const int64_t base = wpage[t] * s_page + layer * s_layer + woff[t] * s_off;
        for (int64_t h = 0; h < Hkv; h++) {
            memcpy(buf, row + (H + h) * D, (size_t)D * 4);
            if (k_gamma) head_rmsnorm(buf, D, k_gamma, eps);
            if (cs) rope(buf, R, cs, interleaved);
            cache_store(&c, base + h * hs, buf, D);
            cache_store(&c, base + s_kv + h * hs, row + (H + Hkv + h) * D, D);
        }
    }
    return 0;
}

LMX_INLINE float dotf(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#ifdef LMX_AVX512
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(LMX_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = lmx_hsum256(acc);
#elif defined(LMX_NEON)
    float32x4_t c0 = vdupq_n_f32(0.0f), c1 = c0, c2 = c0, c3 = c0;
    for (; i + 16 <= n; i += 16) {
        c0 = vfmaq_f32(c0, vld1q_f32(a + i), vld1q_f32(b + i));
        c1 = vfmaq_f32(c1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        c2 = vfmaq_f32(c2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        c3 = vfmaq_f32(c3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) c0 = vfmaq_f32(c0, vld1q_f32(a + i), vld1q_f32(b + i));
    s = vaddvq_f32(vaddq_f32(vaddq_f32(c0, c1), vaddq_f32(c2, c3)));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

#if defined(LMX_AVX512) || defined(LMX_AVX2)
#ifdef LMX_AVX512
#define AV __m512
#define AW 16
#define AV_ZERO _mm512_setzero_ps
#define AV_FMA _mm512_fmadd_ps
#define AV_LOAD _mm512_loadu_ps
#define AV_HSUM _mm512_reduce_add_ps
#define AV_SET1 _mm512_set1_ps
#define AV_STORE _mm512_storeu_ps
#else
#define AV __m256
#define AW 8
#define AV_ZERO _mm256_setzero_ps
#define AV_FMA _mm256_fmadd_ps
#define AV_LOAD _mm256_loadu_ps
#define AV_HSUM lmx_hsum256
#define AV_SET1 _mm256_set1_ps
#define AV_STORE _mm256_storeu_ps
#endif
/* nh (1..4) heads' dot products with one key, as independent chains (the key is loaded once). */
LMX_INLINE void dots_n(const float *q, int64_t D, const float *k, float *out, int64_t os, float scale, const int nh) {
    AV acc[4];
    for (int t = 0; t < nh; t++) acc[t] = AV_ZERO();
    for (int64_t d = 0; d < D; d += AW) {
        const AV kv = AV_LOAD(k + d);
        for (int t = 0; t < nh; t++) acc[t] = AV_FMA(AV_LOAD(q + t * D + d), kv, acc[t]);
    }
    for (int t = 0; t < nh; t++) out[t * os] = AV_HSUM(acc[t]) * scale;
}
#endif

/* out[hh * os] = scale * dot(q[hh], k) for the G query heads sharing one KV head. */
LMX_INLINE void dots_heads(const float *q, int64_t G, int64_t D, const float *k, float *out, int64_t os,
                           float scale) {
    int64_t hh = 0;
#if defined(LMX_AVX512) || defined(LMX_AVX2)
    if (D % AW == 0)
        for (; hh < G; hh += 4) {
            const float *qh = q + hh * D;
            float *o = out + hh * os;
            switch (G - hh < 4 ? G - hh : 4) {
            case 1: dots_n(qh, D, k, o, os, scale, 1); break;
            case 2: dots_n(qh, D, k, o, os, scale, 2); break;
            case 3: dots_n(qh, D, k, o, os, scale, 3); break;
            default: dots_n(qh, D, k, o, os, scale, 4); break;
            }
        }
#endif
    for (; hh < G; hh++) out[hh * os] = dotf(q + hh * D, k, D) * scale;
}

#if defined(LMX_AVX512) || defined(LMX_AVX2)
/* Decode attention is latency-bound when each key is taken alone (G chains of D / AW dependent FMAs, then an
 * axpy per head that loads and stores the accumulator for every key): tiles keep 8-12 independent chains in
 * registers and each key row in L1.  Used when AW divides D. */
#define ATT_TH 3  /* heads per score tile */

/* out[h * os + k] = scale * dot(q[h], kr[k]) for h < nh, k < nk. */
LMX_INLINE void dots_tile(const float *q, int64_t D, const float *const *kr, float *out, int64_t os, float scale,
                          const int nh, const int nk) {
    AV acc[ATT_TH][ATT_TK];
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < nk; k++) acc[h][k] = AV_ZERO();
    for (int64_t d = 0; d < D; d += AW) {
        AV qv[ATT_TH];
        for (int h = 0; h < nh; h++) qv[h] = AV_LOAD(q + h * D + d);
        for (int k = 0; k < nk; k++) {
            const AV kv = AV_LOAD(kr[k] + d);
            for (int h = 0; h < nh; h++) acc[h][k] = AV_FMA(qv[h], kv, acc[h][k]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < nk; k++) out[h * os + k] = AV_HSUM(acc[h][k]) * scale;
}

/* The scores of the G heads against nk (1..ATT_TK) keys. */
static void dots_keys(const float *q, int64_t G, int64_t D, const float *const *kr, int nk, float *out, int64_t os,
                      float scale) {
    for (int64_t hh = 0; hh < G; hh += ATT_TH) {
        const int nh = G - hh < ATT_TH ? (int)(G - hh) : ATT_TH;
        const float *qh = q + hh * D;
        float *o = out + hh * os;
#define DT(a, b) case (a) * 8 + (b): dots_tile(qh, D, kr, o, os, scale, a, b); break;
        switch (nh * 8 + nk) {
            DT(1, 1) DT(1, 2) DT(1, 3) DT(1, 4) DT(2, 1) DT(2, 2) DT(2, 3) DT(2, 4) DT(3, 1) DT(3, 2) DT(3, 3)
            default: dots_tile(qh, D, kr, o, os, scale, 3, 4); break;
        }
#undef DT
    }
}

/* acc[h * D + d] += p[h * ps + j] * vr[j][d] for every head h < G and key j < nb: two heads and nc AW-wide
 * slices of D at a time (nc a constant: their 2 nc accumulators stay in registers across the keys). */
LMX_INLINE void av_block_nc(float *acc, const float *p, int64_t ps, int64_t G, int64_t D, const float *const *vr,
                            int nb, const int nc) {
    for (int64_t hh = 0; hh < G; hh += 2) {
        const int two = G - hh >= 2;
        const float *p0 = p + hh * ps, *p1 = two ? p0 + ps : p0;
        for (int64_t d = 0; d < D; d += nc * AW) {
            float *a0 = acc + hh * D + d, *a1 = two ? a0 + D : a0;
            AV x0[4], x1[4];
            for (int c = 0; c < nc; c++) x0[c] = AV_LOAD(a0 + c * AW), x1[c] = AV_LOAD(a1 + c * AW);
            for (int j = 0; j < nb; j++) {
                const AV w0 = AV_SET1(p0[j]), w1 = AV_SET1(p1[j]);
                const float *v = vr[j] + d;
                for (int c = 0; c < nc; c++) {
                    const AV vv = AV_LOAD(v + c * AW);
                    x0[c] = AV_FMA(w0, vv, x0[c]);
                    x1[c] = AV_FMA(w1, vv, x1[c]);
                }
            }
            for (int c = 0; c < nc; c++) AV_STORE(a0 + c * AW, x0[c]);
            if (two)
                for (int c = 0; c < nc; c++) AV_STORE(a1 + c * AW, x1[c]);
        }
    }
}

static void av_block(float *acc, const float *p, int64_t ps, int64_t G, int64_t D, const float *const *vr, int nb) {
    if (D % (4 * AW) == 0) av_block_nc(acc, p, ps, G, D, vr, nb, 4);
    else if (D % (2 * AW) == 0) av_block_nc(acc, p, ps, G, D, vr, nb, 2);
    else av_block_nc(acc, p, ps, G, D, vr, nb, 1);
}
#endif

LMX_INLINE void axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef LMX_AVX512
    const __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif defined(LMX_AVX2)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#elif defined(LMX_NEON)
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

/* p[j] = exp(p[j] - mx) for j < n; returns their sum. */
static float exp_shift_sum(float *p, int64_t n, float mx) {
    int64_t j = 0;
    float sum = 0.0f;
#ifdef LMX_AVX512
    __m512 acc = _mm512_setzero_ps();
    const __m512 vm = _mm512_set1_ps(mx);
    for (; j + 16 <= n; j += 16) {
        __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(p + j), vm), _mm512_set1_ps(-88.0f));
        __m512 e = lmx_exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)));
        _mm512_storeu_ps(p + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(LMX_AVX2)
    __m256 acc = _mm256_setzero_ps();
    const __m256 vm = _mm256_set1_ps(mx);
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(p + j), vm), _mm256_set1_ps(-88.0f));
        __m256 e = lmx_exp2_ps256(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = lmx_hsum256(acc);
#elif defined(LMX_NEON)
    float32x4_t acc = vdupq_n_f32(0.0f);
    const float32x4_t vm = vdupq_n_f32(mx);
    for (; j + 4 <= n; j += 4) {
        const float32x4_t x = vmaxq_f32(vsubq_f32(vld1q_f32(p + j), vm), vdupq_n_f32(-88.0f));
        const float32x4_t e = lmx_exp2_f32x4(vmulq_n_f32(x, 1.4426950408889634f));
        vst1q_f32(p + j, e);
        acc = vaddq_f32(acc, e);
    }
    sum = vaddvq_f32(acc);
#endif
    for (; j < n; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    return sum;
}

/* The float row of position p of one request's pages lk (off: g * hs for head g's key, + s_kv for its value):
 * in the cache itself (float32) or converted into buf (D floats). */
LMX_INLINE const float *kv_row(const cache_t *c, const int64_t *lk, int64_t page_size, int64_t layer, int64_t p,
                               int64_t off, float *buf, int64_t D) {
    const int64_t base = lk[p / page_size] * c->s_page + layer * c->s_layer + (p % page_size) * c->s_off + off;
    if (c->kind == LMX_F32) return (const float *)c->base + base;
    cache_load(c, base, buf, D);
    return buf;
}

/* rows[k] = kv_row(.. position p0 + k ..) for k < n, converted rows (other kinds) into buf + k * D. */
LMX_INLINE void kv_rows(const cache_t *c, const int64_t *lk, int64_t page_size, int64_t layer, int64_t p0, int n,
                        int64_t off, float *buf, int64_t D, const float **rows) {
    for (int k = 0; k < n; k++) rows[k] = kv_row(c, lk, page_size, layer, p0 + k, off, buf + k * D, D);
}

static __thread float *att_scratch = NULL;
static __thread size_t att_cap = 0;

static float *scratch(size_t n) {
    if (n > att_cap) {
        free(att_scratch);
        att_scratch = (float *)malloc(n * 4);
        att_cap = att_scratch ? n : 0;
    }
    return att_scratch;
}

/* Self-attention of each request's new tokens over its cached positions.
 * q [T, H, D] float32; offsets [B + 1] (row offsets of the requests in q); cache_len [B] (positions
 * before this step); lookup [B, lookup_stride] page ids; window > 0: sliding window of that many
 * positions; chunk > 0: chunked local attention, a query at position p sees keys from
 * (p / chunk) * chunk on (both bounds intersect); causal = 0: every query sees every position of its
 * request (window and chunk apply only to causal attention).
 * Returns 0, -1 for unsupported sizes, -3 without memory. */
/* kv_kind: LMX_F32, LMX_BF16, LMX_KV_I8 or LMX_KV_F8E4M3 (rows of head_dim + 4 bytes). */
LMX_API int lmx_paged_attention(const float *q, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t B,
                                const int64_t *offsets, const int64_t *cache_len, const int64_t *lookup,
                                int64_t lookup_stride, int64_t page_size, const void *cache, int kv_kind,
                                int64_t s_page, int64_t s_kv, int64_t s_layer, int64_t s_off, int64_t layer,
                                float scale, int64_t window, int64_t chunk, int causal, float *out) {
    if (D > 1024 || Hkv <= 0 || H % Hkv || H / Hkv > 256) return -1;
    const int64_t G = H / Hkv;
    const int64_t hs = kv_row_stride(kv_kind, D);
    if (hs < 0) return -1;
    cache_t c = {(void *)cache, s_page, s_kv, s_layer, s_off, kv_kind, hs};
    int64_t items = 0, work = 0, lmax = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = offsets[b + 1] - offsets[b];
        if (n < 0) return -1;
        items += n * Hkv;
        work += n * (cache_len[b] + n);
        if (cache_len[b] + n > lmax) lmax = cache_len[b] + n;
    }
    int rc = 0;
#pragma omp parallel if (work * H * D > (1 << 15))
    {
        float *sc = scratch((size_t)(G * (lmax + 16) + (ATT_TK + ATT_VB) * D + G * D));
        if (!sc) {
#pragma omp atomic write
            rc = -3;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!sc) continue;
            int64_t rem = it, b = 0; /* item -> (request b, kv head g, token i) */
            while (rem >= (offsets[b + 1] - offsets[b]) * Hkv) { rem -= (offsets[b + 1] - offsets[b]) * Hkv; b++; }
            const int64_t n = offsets[b + 1] - offsets[b];
            const int64_t g = rem / n, i = rem % n, t = offsets[b] + i;
            const int64_t qpos = cache_len[b] + i;
            const int64_t last = causal ? qpos : cache_len[b] + n - 1;
            int64_t first = (window > 0 && causal && qpos - window + 1 > 0) ? qpos - window + 1 : 0;
            if (chunk > 0 && causal && (qpos / chunk) * chunk > first) first = (qpos / chunk) * chunk;
            const int64_t L = last - first + 1;
            const int64_t LS = lmax + 16;
            float *kt = sc + G * LS, *vt = kt + ATT_TK * D, *acc = vt + ATT_VB * D; /* K tile, V block (converted) */
            const float *qg = q + (t * H + g * G) * D;
            const int64_t *lk = lookup + b * lookup_stride;
            int64_t j = 0;
            /* scores of every (head of the group, key) */
#if defined(LMX_AVX512) || defined(LMX_AVX2)
            if (D % AW == 0)
                for (; j < L; j += ATT_TK) {
                    const int nk = L - j < ATT_TK ? (int)(L - j) : ATT_TK;
                    const float *kr[ATT_TK];
                    kv_rows(&c, lk, page_size, layer, first + j, nk, g * hs, kt, D, kr);
                    dots_keys(qg, G, D, kr, nk, sc + j, LS, scale);
                }
#endif
            for (; j < L; j++)
                dots_heads(qg, G, D, kv_row(&c, lk, page_size, layer, first + j, g * hs, kt, D), sc + j, LS, scale);
            float inv[256];
            for (int64_t hh = 0; hh < G; hh++) {
                float mx = -INFINITY;
                for (int64_t j = 0; j < L; j++) mx = sc[hh * LS + j] > mx ? sc[hh * LS + j] : mx;
                const float den = exp_shift_sum(sc + hh * LS, L, mx);
                inv[hh & 255] = den > 0 ? 1.0f / den : 0.0f;
            }
            memset(acc, 0, (size_t)(G * D) * 4);
            j = 0;
#if defined(LMX_AVX512) || defined(LMX_AVX2)
            if (D % AW == 0)
                for (; j < L; j += ATT_VB) {
                    const int nb = L - j < ATT_VB ? (int)(L - j) : ATT_VB;
                    const float *vr[ATT_VB];
                    kv_rows(&c, lk, page_size, layer, first + j, nb, g * hs + s_kv, vt, D, vr);
                    av_block(acc, sc + j, LS, G, D, vr, nb);
                }
#endif
            for (; j < L; j++) {
                const float *vr = kv_row(&c, lk, page_size, layer, first + j, g * hs + s_kv, vt, D);
                for (int64_t hh = 0; hh < G; hh++) axpy(acc + hh * D, sc[hh * LS + j], vr, D);
            }
            for (int64_t hh = 0; hh < G; hh++) {
                float *o = out + (t * H + g * G + hh) * D;
                for (int64_t d = 0; d < D; d++) o[d] = acc[hh * D + d] * inv[hh & 255];
            }
        }
    }
    return rc;
}

/* A layer's attention settings, bound once by the caller (engine/kernels/ragged.py) and reused every step. */
typedef struct {
    int64_t H, Hkv, D;
    const float *freqs; /* NULL: no RoPE */
    int64_t max_pos, R;
    int64_t interleaved;
    const float *q_gamma, *k_gamma; /* per-head RMSNorm weights (NULL: none) */
    float eps, scale;
    int64_t kv_kind, s_page, s_kv, s_layer, s_off, layer, page_size, window, chunk, causal;
} lmx_qkv_attn_t;

/* lmx_qkv_rope_store then lmx_paged_attention of its Q, in one call: this step's K/V are written to the
 * cache and its queries attend over it.  The Q lives in a buffer of this call only.  Returns what the two
 * calls return (0; -1 unsupported sizes; -2 a position beyond the rotary table; -3 without memory). */
LMX_API int lmx_qkv_attention(const lmx_qkv_attn_t *p, const float *qkv, int64_t T, int64_t qkv_stride,
                              const int64_t *pos, const int64_t *wpage, const int64_t *woff, int64_t B,
                              const int64_t *offsets, const int64_t *cache_len, const int64_t *lookup,
                              int64_t lookup_stride, void *cache, float *out) {
    float *q = (float *)malloc((size_t)(T * p->H * p->D > 0 ? T * p->H * p->D : 1) * 4);
    if (!q) return -3;
    int rc = lmx_qkv_rope_store(qkv, T, qkv_stride, p->H, p->Hkv, p->D, pos, p->freqs, p->max_pos, p->R,
                                (int)p->interleaved, p->q_gamma, p->k_gamma, p->eps, q, cache, (int)p->kv_kind,
                                p->s_page, p->s_kv, p->s_layer, p->s_off, p->layer, wpage, woff);
    if (rc == 0)
        rc = lmx_paged_attention(q, T, p->H, p->Hkv, p->D, B, offsets, cache_len, lookup, lookup_stride,
                                 p->page_size, cache, (int)p->kv_kind, p->s_page, p->s_kv, p->s_layer, p->s_off,
                                 p->layer, p->scale, p->window, p->chunk, (int)p->causal, out);
    free(q);
    return rc;
}
