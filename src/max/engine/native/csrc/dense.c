/* y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for dense float32 / bfloat16 /
 * float16 W in its natural [N, K] layout (the checkpoint's; no transposed copy).
 *
 * Written for the small-M (decode) regime, where the cost is streaming W once.
 * A register-tiled micro-kernel computes TR weight rows x TC activation rows at
 * a time (4 x 6 with AVX-512, 3 x 3 with AVX2, 4 x 2 with NEON, 4 x 4 portable):
 * per step of VW values it loads TR weight vectors and TC activation vectors for
 * TR * TC fused multiply-adds.  The weight is walked once per call in panels of
 * TR rows (each thread a contiguous range of rows), a panel PF_AHEAD panels on
 * (the next one at M = 1) prefetched while the current one is computed, its lines
 * spread evenly over the blocks of TC activation rows that run over the current
 * panel from L1/L2 (so memory stays busy while the later blocks compute).  At
 * M = 1 the tile is 2 * TR rows x 1 (x86).
 *
 * Half-precision weights are widened exactly to float32: once per vector and
 * shared by the TC activation rows of a tile; with more than SCRATCH_MIN_M activation
 * rows a panel is widened once into a float32 scratch panel that every block reads.
 *
 * Batch invariance: each output element y[m, n] has its own vector accumulator,
 * summed over k in steps of VW in k order (lane j holds k = j mod VW), the
 * masked (x86) or scalar (NEON) tail last, then one fixed horizontal reduction.
 * Neither the tile shape nor M nor the other activation rows change that
 * arithmetic, so a row's result is bit-identical at every M.  The portable
 * variant sums each dot product in plain k order, the same in every tile.
 */
#include "common.h"

#if defined(LMX_AVX512)
#define VW 16
#define TR 4
#define TC 6
#define TR1 8 /* weight rows of the M = 1 tile */
#define VTAIL 1
typedef __m512 vacc;
typedef __m512 vwt;
typedef __m512 vxt;
typedef __mmask16 tmask;
LMX_INLINE vacc v_zero(void) { return _mm512_setzero_ps(); }
LMX_INLINE vwt w_load(const int kind, const uint8_t *w, int64_t k) {
    if (kind == LMX_F32) return _mm512_loadu_ps((const float *)w + k);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(w + 2 * k));
    if (kind == LMX_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}
LMX_INLINE vxt x_load(const float *x, int64_t k) { return _mm512_loadu_ps(x + k); }
LMX_INLINE vacc v_fma(vacc a, vwt w, vxt x) { return _mm512_fmadd_ps(w, x, a); }
LMX_INLINE void w_store(float *d, vwt w) { _mm512_storeu_ps(d, w); }
LMX_INLINE tmask t_mask(int64_t n) { return (__mmask16)((1u << n) - 1); }
LMX_INLINE vwt w_tail(const int kind, const uint8_t *w, int64_t k, int64_t n, tmask m) {
    (void)n;
    if (kind == LMX_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + k);
    const __m256i h = _mm256_maskz_loadu_epi16(m, w + 2 * k);
    if (kind == LMX_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}
LMX_INLINE vxt x_tail(const float *x, int64_t k, tmask m) { return _mm512_maskz_loadu_ps(m, x + k); }
LMX_INLINE float v_fin(vacc a) { return _mm512_reduce_add_ps(a); }

#elif defined(LMX_AVX2)
#define VW 8
#define TR 3
#define TC 3
#define TR1 8
#define VTAIL 1
typedef __m256 vacc;
typedef __m256 vwt;
typedef __m256 vxt;
typedef __m256i tmask;
LMX_INLINE vacc v_zero(void) { return _mm256_setzero_ps(); }
LMX_INLINE vwt w_load(const int kind, const uint8_t *w, int64_t k) {
    if (kind == LMX_F32) return _mm256_loadu_ps((const float *)w + k);
    const __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * k));
    if (kind == LMX_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}
LMX_INLINE vxt x_load(const float *x, int64_t k) { return _mm256_loadu_ps(x + k); }
LMX_INLINE vacc v_fma(vacc a, vwt w, vxt x) { return _mm256_fmadd_ps(w, x, a); }
LMX_INLINE void w_store(float *d, vwt w) { _mm256_storeu_ps(d, w); }
LMX_INLINE tmask t_mask(int64_t n) { return lmx_tailmask256(n); }
LMX_INLINE vwt w_tail(const int kind, const uint8_t *w, int64_t k, int64_t n, tmask m) {
    if (kind == LMX_F32) return _mm256_maskload_ps((const float *)w + k, m);
    uint16_t t[8] = {0};
    memcpy(t, w + 2 * k, (size_t)n * 2);
    const __m128i h = _mm_loadu_si128((const __m128i *)t);
    if (kind == LMX_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}
LMX_INLINE vxt x_tail(const float *x, int64_t k, tmask m) { return _mm256_maskload_ps(x + k, m); }
LMX_INLINE float v_fin(vacc a) { return lmx_hsum256(a); }

#elif defined(LMX_NEON)
#define VW 8
#define TR 4
#define TC 2
#define TR1 4
#define VTAIL 0
typedef struct { float32x4_t a, b; } vacc;
typedef vacc vwt;
typedef vacc vxt;
LMX_INLINE vacc v_zero(void) { vacc r = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; return r; }
LMX_INLINE vwt w_load(const int kind, const uint8_t *w, int64_t k) {
    vwt r;
    if (kind == LMX_F32) {
        r.a = vld1q_f32((const float *)w + k);
        r.b = vld1q_f32((const float *)w + k + 4);
    } else if (kind == LMX_BF16) {
        const uint16x8_t h = vld1q_u16((const uint16_t *)(const void *)(w + 2 * k));
        r.a = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        r.b = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    } else {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(const void *)(w + 2 * k)));
        r.a = vcvt_f32_f16(vget_low_f16(h));
        r.b = vcvt_high_f32_f16(h);
    }
    return r;
}
LMX_INLINE vxt x_load(const float *x, int64_t k) { vxt r = {vld1q_f32(x + k), vld1q_f32(x + k + 4)}; return r; }
LMX_INLINE vacc v_fma(vacc a, vwt w, vxt x) {
    a.a = vfmaq_f32(a.a, w.a, x.a);
    a.b = vfmaq_f32(a.b, w.b, x.b);
    return a;
}
LMX_INLINE void w_store(float *d, vwt w) { vst1q_f32(d, w.a); vst1q_f32(d + 4, w.b); }
LMX_INLINE float v_fin(vacc a) { return vaddvq_f32(vaddq_f32(a.a, a.b)); }

#else /* portable: plain k order per dot product */
#define VW 1
#define TR 4
#define TC 4
#define TR1 4
#define VTAIL 0
typedef float vacc;
typedef float vwt;
typedef float vxt;
LMX_INLINE vacc v_zero(void) { return 0.0f; }
LMX_INLINE vwt w_load(const int kind, const uint8_t *w, int64_t k) {
    if (kind == LMX_F32) return ((const float *)w)[k];
    return kind == LMX_BF16 ? lmx_bf2f(lmx_rd16(w + 2 * k)) : lmx_h2f(lmx_rd16(w + 2 * k));
}
LMX_INLINE vxt x_load(const float *x, int64_t k) { return x[k]; }
LMX_INLINE vacc v_fma(vacc a, vwt w, vxt x) { return a + x * w; }
LMX_INLINE void w_store(float *d, vwt w) { *d = w; }
LMX_INLINE float v_fin(vacc a) { return a; }
#endif

#define TRMAX (TR1 > TR ? TR1 : TR)

/* One weight element widened exactly to float32. */
LMX_INLINE float w_one(int kind, const uint8_t *w, int64_t j) {
    if (kind == LMX_F32) return ((const float *)w)[j];
    return kind == LMX_BF16 ? lmx_bf2f(lmx_rd16(w + 2 * j)) : lmx_h2f(lmx_rd16(w + 2 * j));
}

/* The scalar tail after the vector steps (NEON; nothing on the portable variant, whose VW is 1). */
LMX_INLINE float s_tail(float s, int kind, const uint8_t *w, const float *x, int64_t k, int64_t K) {
    for (int64_t j = k; j < K; j++) s += x[j] * w_one(kind, w, j);
    return s;
}

/* Prefetching: the bytes [pf, end) (a slice of a later panel) are prefetched into L2, pq cache lines
   each time the tile has consumed 64 bytes of one weight row, so a panel's blocks of activation rows
   share the stream evenly (memory stays busy while the later blocks compute from cache). */
typedef struct {
    const uint8_t *pf, *end;
    int64_t pq;
} pfq;

#ifndef PF_AHEAD
/* Half weights are widened into a float32 scratch panel only above this many activation rows: below it,
   widening each vector again per block of TC rows was faster (bench/qmatmul.py --kinds BF16 --baseline, 2
   threads: M = 4-16 0.75-0.92x with the scratch panel against direct widening on AVX-512 and AVX2; M = 32
   about even).  The widening is exact either way, so the results do not depend on it. */
#define SCRATCH_MIN_M 16
#define PF_AHEAD 2 /* panels (M > 1; 1 and 3 made no clear difference on the shared test host) */
#endif
#ifndef LMX_PF_LOCALITY
#define LMX_PF_LOCALITY 2
#endif
LMX_INLINE void pf_some(pfq *q) {
    for (int64_t i = 0; i < q->pq && q->pf < q->end; i++, q->pf += 64) __builtin_prefetch(q->pf, 0, LMX_PF_LOCALITY);
}

/* y[c * ys + r] = x[c] . W[r] for r < R, c < C (weight rows at stride rb bytes, x rows at stride xs). */
LMX_INLINE void tile(const int kind, const int R, const int C, const uint8_t *w, int64_t rb, const float *x,
                     int64_t xs, int64_t K, float *y, int64_t ys, pfq q) {
    const int64_t es = kind == LMX_F32 ? 4 : 2;
    vacc acc[TRMAX][TC];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = v_zero();
    int64_t k = 0;
    for (; k + VW <= K; k += VW) {
        vwt wv[TRMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = w_load(kind, w + r * rb, k);
        if (q.pf < q.end && ((k * es) & 63) == 0) pf_some(&q);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const vxt xv = x_load(x + c * xs, k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = v_fma(acc[r][c], wv[r], xv);
        }
    }
#if VTAIL
    if (k < K) {
        const tmask m = t_mask(K - k);
        vwt wv[TRMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = w_tail(kind, w + r * rb, k, K - k, m);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const vxt xv = x_tail(x + c * xs, k, m);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = v_fma(acc[r][c], wv[r], xv);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ys + r] = v_fin(acc[r][c]);
#else
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ys + r] = s_tail(v_fin(acc[r][c]), kind, w + r * rb, x + c * xs, k, K);
#endif
}

typedef void (*tile_fn)(const uint8_t *w, int64_t rb, const float *x, int64_t xs, int64_t K, float *y, int64_t ys,
                        pfq q);

#define DEF_TILE(KN, KIND, R, C) DEF_TILE_(KN, KIND, R, C)
#define DEF_TILE_(KN, KIND, R, C)                                                                              \
    static void tile_##KN##_##R##_##C(const uint8_t *w, int64_t rb, const float *x, int64_t xs, int64_t K,   \
                                      float *y, int64_t ys, pfq q) {                                          \
        tile(KIND, R, C, w, rb, x, xs, K, y, ys, q);                                                         \
    }
#define PTR_TILE(KN, KIND, R, C) PTR_TILE_(KN, KIND, R, C)
#define PTR_TILE_(KN, KIND, R, C) tile_##KN##_##R##_##C,

#if TC == 6
#define FOR_C(M, KN, KIND, R) M(KN, KIND, R, 1) M(KN, KIND, R, 2) M(KN, KIND, R, 3) M(KN, KIND, R, 4) \
                              M(KN, KIND, R, 5) M(KN, KIND, R, 6)
#elif TC == 4
#define FOR_C(M, KN, KIND, R) M(KN, KIND, R, 1) M(KN, KIND, R, 2) M(KN, KIND, R, 3) M(KN, KIND, R, 4)
#elif TC == 3
#define FOR_C(M, KN, KIND, R) M(KN, KIND, R, 1) M(KN, KIND, R, 2) M(KN, KIND, R, 3)
#else
#define FOR_C(M, KN, KIND, R) M(KN, KIND, R, 1) M(KN, KIND, R, 2)
#endif

/* Per kind: TR-row tiles and one-row tiles for C = 1 .. TC activation rows, and the TR1-row M = 1 tile. */
#define KIND_TILES(KN, KIND) FOR_C(DEF_TILE, KN, KIND, TR) FOR_C(DEF_TILE, KN, KIND, 1) \
    DEF_TILE(KN, KIND, TR1, 1)
#if TR1 != TR
KIND_TILES(f32, LMX_F32)
KIND_TILES(bf16, LMX_BF16)
KIND_TILES(f16, LMX_F16)
#else /* the TR1-row tile is the TR-row one */
FOR_C(DEF_TILE, f32, LMX_F32, TR) FOR_C(DEF_TILE, f32, LMX_F32, 1)
FOR_C(DEF_TILE, bf16, LMX_BF16, TR) FOR_C(DEF_TILE, bf16, LMX_BF16, 1)
FOR_C(DEF_TILE, f16, LMX_F16, TR) FOR_C(DEF_TILE, f16, LMX_F16, 1)
#endif

/* [kind index][0: TR rows, 1: one row][C - 1] */
static const tile_fn TILES[3][2][TC] = {
    {{FOR_C(PTR_TILE, f32, LMX_F32, TR)}, {FOR_C(PTR_TILE, f32, LMX_F32, 1)}},
    {{FOR_C(PTR_TILE, bf16, LMX_BF16, TR)}, {FOR_C(PTR_TILE, bf16, LMX_BF16, 1)}},
    {{FOR_C(PTR_TILE, f16, LMX_F16, TR)}, {FOR_C(PTR_TILE, f16, LMX_F16, 1)}},
};
#define M1_TILE(KN) M1_TILE_(KN, TR1)
#define M1_TILE_(KN, R) M1_TILE__(KN, R)
#define M1_TILE__(KN, R) tile_##KN##_##R##_1
static const tile_fn TILES_M1[3] = {M1_TILE(f32), M1_TILE(bf16), M1_TILE(f16)};

static inline int kind_index(int kind) { return kind == LMX_F32 ? 0 : kind == LMX_BF16 ? 1 : 2; }

/* R (TR or 1) rows widened exactly into the float32 panel d (row stride dk floats). */
static void widen_panel(int kind, int R, const uint8_t *w, int64_t rb, int64_t K, float *d, int64_t dk) {
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + r * rb;
        float *dr = d + r * dk;
        int64_t k = 0;
        for (; k + VW <= K; k += VW) w_store(dr + k, w_load(kind, wr, k));
        for (; k < K; k++) dr[k] = w_one(kind, wr, k);
    }
}

/* Weight rows [0, R) at w (R = TR or 1) against all M activation rows, in blocks of TC; the next panel's
   bytes [pf, pf + pfn) prefetched, a slice per block. */
static void panel(int kind, int ri, const uint8_t *w, int64_t rb, const float *x, int64_t xs, int64_t M,
                  int64_t K, float *y, int64_t ys, const uint8_t *pf, int64_t pfn, float *buf, int64_t bk) {
    if (buf) { /* half weights, more than one block of activation rows: widen the panel once */
        widen_panel(kind, ri ? 1 : TR, w, rb, K, buf, bk);
        w = (const uint8_t *)buf;
        rb = bk * 4;
        kind = LMX_F32;
    }
    const tile_fn *t = TILES[kind_index(kind)][ri];
    const int64_t nb = (M + TC - 1) / TC, lines = (pfn + 63) / 64;
    const int64_t steps = (K * (kind == LMX_F32 ? 4 : 2) + 63) / 64; /* prefetch points per tile */
    for (int64_t b = 0; b < nb; b++) {
        const int64_t m0 = b * TC, c = M - m0 < TC ? M - m0 : TC;
        const int64_t l0 = lines * b / nb, l1 = lines * (b + 1) / nb;
        pfq q = {pf ? pf + 64 * l0 : NULL, pf ? pf + 64 * l1 : NULL, (l1 - l0 + steps - 1) / steps};
        t[c - 1](w, rb, x + m0 * xs, xs, K, y + m0 * ys, ys, q);
    }
}

static void drows(int kind, const uint8_t *w, int64_t rb, int64_t r0, int64_t r1, const float *x, int64_t xs,
                  int64_t M, int64_t K, float *y, int64_t ys, int force_scalar) {
    if (M <= 0 || r1 <= r0) return;
    if (force_scalar) { /* the plain k-order dot products (the portable variant's arithmetic) */
        for (int64_t r = r0; r < r1; r++)
            for (int64_t m = 0; m < M; m++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) acc += x[m * xs + k] * w_one(kind, w + r * rb, k);
                y[m * ys + r] = acc;
            }
        return;
    }
    int64_t r = r0;
    const pfq none = {NULL, NULL, 0};
    if (M == 1) {
        const tile_fn t1 = TILES_M1[kind_index(kind)];
        const int64_t steps = (K * (kind == LMX_F32 ? 4 : 2) + 63) / 64, pq = (TR1 * rb / 64 + steps - 1) / steps;
        for (; r + TR1 <= r1; r += TR1) {
            const uint8_t *nx = w + (r + TR1) * rb;
            const pfq q = {nx, nx + (r + 2 * TR1 <= r1 ? TR1 : r1 - r - TR1) * rb, pq};
            t1(w + r * rb, rb, x, xs, K, y + r, ys, q);
        }
        for (; r < r1; r++) TILES[kind_index(kind)][1][0](w + r * rb, rb, x, xs, K, y + r, ys, none);
        return;
    }
    float *buf = NULL;
    const int64_t bk = (K + 15) & ~(int64_t)15;
    if (kind != LMX_F32 && M > SCRATCH_MIN_M) buf = (float *)malloc((size_t)(TR * bk) * sizeof(float)); /* NULL: direct */
    for (; r + TR <= r1; r += TR) {
        const int64_t p0 = r + PF_AHEAD * TR, p1 = p0 + TR < r1 ? p0 + TR : r1;
        panel(kind, 0, w + r * rb, rb, x, xs, M, K, y + r, ys, w + p0 * rb, p1 > p0 ? (p1 - p0) * rb : 0, buf, bk);
    }
    for (; r < r1; r++) panel(kind, 1, w + r * rb, rb, x, xs, M, K, y + r, ys, NULL, 0, buf, bk);
    free(buf);
}

/* Rows r0 .. r1 of one weight (kind, row stride rb bytes) against M activation rows: y[m, r] = x[m] . W[r]
 * (the caller splits the rows between its threads; moe.c runs each expert's rows this way). */
void lmx_dense_rows(int kind, const uint8_t *w, int64_t rb, int64_t r0, int64_t r1, const float *x, int64_t xs,
                    int64_t M, int64_t K, float *y, int64_t ys) {
    drows(kind, w, rb, r0, r1, x, xs, M, K, y, ys, 0);
}

/* y[M, sum(N)] = x[M, K] @ concat(W_i)^T (+ bias_i), W_i [N_i, K] float32/bfloat16/float16 with row
 * stride row_bytes[i].  Returns 0, -1 for a bad kind, -3 without memory. */
LMX_API int lmx_dense_matmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw,
                             const uint8_t *const *w, const int *kinds, const int64_t *N, const int64_t *row_bytes,
                             const float *const *bias, float *y, int64_t y_stride, int force_scalar, const float *norm_w, float norm_eps) {
    if (lmx_prenorm(&x, &x_stride, M, K, norm_w, norm_eps)) return -3; /* the fused RMSNorm, if any */

    int64_t total = 0, offs[64];
    if (nw < 1 || nw > 64) return -1;
    for (int i = 0; i < nw; i++) {
        if (kinds[i] != LMX_F32 && kinds[i] != LMX_BF16 && kinds[i] != LMX_F16) return -1;
        offs[i] = total;
        total += N[i];
    }
    int nt = lmx_num_threads();
    if (M * total * K < (1 << 17)) nt = 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        int t = 0, T = 1;
#endif
        /* each thread one contiguous range of whole M = 1 tiles (TR1 rows) */
        int64_t units = (total + TR1 - 1) / TR1;
        int64_t g0 = units * t / T * TR1, g1 = units * (t + 1) / T * TR1;
        if (g1 > total) g1 = total;
        for (int i = 0; i < nw && g0 < g1; i++) {
            int64_t lo = offs[i], hi = offs[i] + N[i];
            int64_t s = g0 > lo ? g0 : lo, e = g1 < hi ? g1 : hi;
            if (s < e) drows(kinds[i], w[i], row_bytes[i], s - lo, e - lo, x, x_stride, M, K, y + lo, y_stride,
                             force_scalar);
        }
        lmx_add_biases(M, nw, N, offs, bias, y, y_stride);
    }
    return 0;
}
