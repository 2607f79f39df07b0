/* y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for GGML block-quantised W,
 * read in its file layout (no repacking: the weights can stay memory-mapped).
 *
 * The activations are quantised once per call to 8-bit codes with one scale
 * per 32 values.  Every weight kind is read as unsigned codes u with a scale s
 * and an offset o per 16 or 32 values (w = s * u + o), so one group's share of
 * a dot product is
 *     s * dx * sum(u * xq) + o * sum(x)
 * where sum(u * xq) is an exact integer sum (VNNI vpdpbusd on AVX-512) and
 * sum(x) is precomputed per group of the activations.
 */
#include "common.h"

/* Per-call activation data, per row m:
 *   xq   int8  [M][KP]    codes, KP = K + 64 (zero padding: the last chunk may read past K)
 *   dxb  float [M][BP]    scale of each 32 values, BP = K / 32 + 16 (zero padding)
 *   sxb  float [M][BP]    sum of each 32 (dequantised) values: dxb * sum(q)
 *   sx16 float [M][2 BP]  sum of each 16 values
 *   ixp  int32 [M][BP]    the integer sums s0, s1 of each 32 values' two halves' codes as an int16 pair
 *                         (s0 in the low 16 bits; |s| <= 16 * 127): for the kernels that scale integer sums */
typedef struct {
    int8_t *xq;
    float *dxb, *sxb, *sx16;
    int32_t *ixp;
    int64_t K, KP, BP, M;
} act_t;

/* One buffer per calling thread, grown on demand (activations are small). */
static __thread char *act_mem = NULL;
static __thread size_t act_cap = 0;

/* Bytes of the activation data of M rows of K values. */
static size_t act_bytes(int64_t M, int64_t K) {
    const int64_t KP = K + 64, BP = K / 32 + 16;
    return (((size_t)(M * KP) + 63) & ~(size_t)63) + (size_t)(M * BP) * 4 * 5;
}

/* Lay a's arrays out in mem (act_bytes(M, K) bytes, 64-byte aligned) and zero the padding after each row. */
static void act_view(act_t *a, char *mem, int64_t M, int64_t K) {
    a->K = K;
    a->KP = K + 64;
    a->BP = K / 32 + 16;
    a->M = M;
    size_t qbytes = ((size_t)(M * a->KP) + 63) & ~(size_t)63;
    a->xq = (int8_t *)mem;
    a->dxb = (float *)(mem + qbytes);
    a->sxb = a->dxb + M * a->BP;
    a->sx16 = a->sxb + M * a->BP;
    a->ixp = (int32_t *)(a->sx16 + 2 * M * a->BP);
    int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++) { /* zero the padding after each row */
        memset(a->xq + m * a->KP + K, 0, (size_t)(a->KP - K));
        memset(a->dxb + m * a->BP + nb, 0, (size_t)(a->BP - nb) * 4);
        memset(a->sxb + m * a->BP + nb, 0, (size_t)(a->BP - nb) * 4);
        memset(a->sx16 + m * 2 * a->BP + 2 * nb, 0, (size_t)(2 * (a->BP - nb)) * 4);
        memset(a->ixp + m * a->BP + nb, 0, (size_t)(a->BP - nb) * 4);
    }
}

/* Grow a thread's buffer *mem (capacity *cap) to at least bytes, 64-byte aligned; its contents are lost. */
static int grow(char **mem, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 0;
    free(*mem);
    *mem = NULL;
    *cap = 0;
    if (posix_memalign((void **)mem, 64, bytes)) return -1;
    *cap = bytes;
    return 0;
}

static int act_alloc(act_t *a, int64_t M, int64_t K) {
    if (grow(&act_mem, &act_cap, act_bytes(M, K))) return -1;
    act_view(a, act_mem, M, K);
    return 0;
}

/* Quantise the 32-value blocks b0 .. nb - 1 of activation row m (x: the row's first value): codes round to
 * nearest even, |q| <= 127, one scale per block; the SIMD and scalar paths give the same codes. */
static void act_blocks(act_t *a, const float *x, int64_t m, const int64_t b0, const int64_t nb) {
    int8_t *q = a->xq + m * a->KP;
    float *dxb = a->dxb + m * a->BP, *sxb = a->sxb + m * a->BP, *sx16 = a->sx16 + m * 2 * a->BP;
    int32_t *ixp = a->ixp + m * a->BP;
    int64_t b = b0;
#ifdef LMX_AVX512VNNI
    for (; b < nb; b++) {
        const float *xb = x + b * 32;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)),
                                                       _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        __m512i i1 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid)),
                                                       _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        _mm_storeu_si128((__m128i *)(q + b * 32), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + b * 32 + 16), _mm512_cvtepi32_epi8(i1));
        int s0 = _mm512_reduce_add_epi32(i0), s1 = _mm512_reduce_add_epi32(i1);
        dxb[b] = d;
        sx16[2 * b] = d * (float)s0;
        sx16[2 * b + 1] = d * (float)s1;
        ixp[b] = lmx_int16_pair(s0, s1);
        sxb[b] = d * (float)(s0 + s1);
    }
#elif defined(LMX_AVX2)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; b < nb; b++) {
        const float *xb = x + b * 32;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
               v3 = _mm256_loadu_ps(xb + 24);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                  _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), hi), lo);
        __m256i i1 = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v1, vid)), hi), lo);
        __m256i i2 = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), hi), lo);
        __m256i i3 = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v3, vid)), hi), lo);
        /* packs interleave 128-bit lanes: [i0 0-3, i1 0-3, i2 0-3, i3 0-3 | i0 4-7, ...] -> element order */
        __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(q + b * 32), _mm256_permutevar8x32_epi32(q8, order));
        const int s0 = lmx_hsum256i(_mm256_add_epi32(i0, i1)), s1 = lmx_hsum256i(_mm256_add_epi32(i2, i3));
        dxb[b] = d;
        sx16[2 * b] = d * (float)s0;
        sx16[2 * b + 1] = d * (float)s1;
        ixp[b] = lmx_int16_pair(s0, s1);
        sxb[b] = d * (float)(s0 + s1);
    }
#elif defined(LMX_NEON)
    for (; b < nb; b++) {
        const float *xb = x + b * 32;
        float32x4_t v[8];
        for (int j = 0; j < 8; j++) v[j] = vld1q_f32(xb + 4 * j);
        float32x4_t mx = vabsq_f32(v[0]);
        for (int j = 1; j < 8; j++) mx = vmaxnmq_f32(mx, vabsq_f32(v[j]));
        const float amax = vmaxnmvq_f32(mx);
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        const int32x4_t hi = vdupq_n_s32(127), lo = vdupq_n_s32(-127);
        int32x4_t iv[8];
        for (int j = 0; j < 8; j++) /* round to nearest even, as lrintf */
            iv[j] = vmaxq_s32(vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(v[j], id)), hi), lo);
        for (int h = 0; h < 2; h++) {
            const int32x4_t *w = iv + 4 * h;
            const int16x8_t a = vcombine_s16(vmovn_s32(w[0]), vmovn_s32(w[1]));
            const int16x8_t c = vcombine_s16(vmovn_s32(w[2]), vmovn_s32(w[3]));
            vst1q_s8(q + b * 32 + 16 * h, vcombine_s8(vmovn_s16(a), vmovn_s16(c)));
        }
        const int s0 = vaddvq_s32(vaddq_s32(vaddq_s32(iv[0], iv[1]), vaddq_s32(iv[2], iv[3])));
        const int s1 = vaddvq_s32(vaddq_s32(vaddq_s32(iv[4], iv[5]), vaddq_s32(iv[6], iv[7])));
        dxb[b] = d;
        sx16[2 * b] = d * (float)s0;
        sx16[2 * b + 1] = d * (float)s1;
        ixp[b] = lmx_int16_pair(s0, s1);
        sxb[b] = d * (float)(s0 + s1);
    }
#endif
    for (; b < nb; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = fabsf(xb[j]);
            amax = v > amax ? v : amax;
        }
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        int s[2] = {0, 0};
        for (int j = 0; j < 32; j++) {
            int v = (int)lrintf(xb[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            q[b * 32 + j] = (int8_t)v;
            s[j >> 4] += v;
        }
        dxb[b] = d;
        sx16[2 * b] = d * (float)s[0];
        sx16[2 * b + 1] = d * (float)s[1];
        ixp[b] = lmx_int16_pair(s[0], s[1]);
        sxb[b] = d * (float)(s[0] + s[1]);
    }
}

static void act_row(act_t *a, const float *x, int64_t m) { act_blocks(a, x, m, 0, a->K / 32); }

/* Quantise x [M, K] into the calling thread's activation buffer (rows in parallel with nt threads);
 * used by the packed kernels (qpacked.c).  The pointers stay valid until the thread's next call. */
int lmx_act_prepare(int64_t M, int64_t K, const float *x, int64_t xs, const int8_t **xq, const float **dxb,
                    const float **sxb, const float **sx16, const int32_t **ixp, int64_t *KP, int64_t *BP, int nt) {
    act_t a;
    if (K % 32 || act_alloc(&a, M, K)) return -1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && M > 1)
    for (int64_t m = 0; m < M; m++) act_row(&a, x + m * xs, m);
    *xq = a.xq;
    *dxb = a.dxb;
    *sxb = a.sxb;
    *sx16 = a.sx16;
    *ixp = a.ixp;
    *KP = a.KP;
    *BP = a.BP;
    return 0;
}

/* ------------------------------------------------------------------ refined codes (lmx_refine_t, common.h)
 * The fraction of a row's blocks that get residual codes: refine_num / refine_den (0: none). */
static int refine_num = 1, refine_den = 4;

LMX_API void lmx_set_act_refine(int num, int den) {
    if (den <= 0 || num <= 0) num = 0, den = 1;
    refine_num = num < den ? num : den;
    refine_den = den;
}

/* With t > 0 a row refines only its blocks whose squared scale d^2 is at least t times the mean of d^2 over the
 * row's blocks (still at most refine_count of them, the largest): the 8-bit codes' error in a block is
 * proportional to d, so those blocks carry most of the row's error (the outliers), and a row without outliers
 * refines few blocks or none.  0: the fixed fraction (refine_count blocks of every row). */
static float refine_thr = 2.0f;

LMX_API void lmx_set_act_refine_threshold(float t) { refine_thr = t > 0.0f ? t : 0.0f; }

LMX_API float lmx_act_refine_threshold(void) { return refine_thr; }

/* Blocks refined and blocks seen by lmx_act_refine since the last reset (approximate under concurrent calls). */
static int64_t refine_seen[2];

LMX_API void lmx_act_refine_stats(int64_t *out, int reset) {
    out[0] = refine_seen[0];
    out[1] = refine_seen[1];
    if (reset) refine_seen[0] = refine_seen[1] = 0;
}

/* refine_num / refine_den as a double (0 when off). */
LMX_API double lmx_act_refine_fraction(void) { return (double)refine_num / (double)refine_den; }

/* How many of n blocks (units) a row refines: ceil(n * fraction), at least one while refining. */
static int64_t refine_count(int64_t n) {
    if (!refine_num || n <= 0) return 0;
    const int64_t c = (n * refine_num + refine_den - 1) / refine_den;
    return c < 1 ? 1 : c > n ? n : c;
}

/* The k-th largest (k = 1 .. n) of v[0 .. n-1]; v is reordered (Hoare partition, descending). */
static float kth_largest(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    const int64_t t = k - 1;
    while (lo < hi) {
        const float p = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > p) i++;
            while (v[j] < p) j--;
            if (i <= j) {
                const float tmp = v[i];
                v[i++] = v[j];
                v[j--] = tmp;
            }
        }
        if (t <= j) hi = j;
        else if (t >= i) lo = i;
        else break;
    }
    return v[t];
}

/* Marks the k largest of val[0 .. n-1] in fl (1, else 0; ties: the lower indices first); scratch holds n floats. */
static void select_top(const float *val, int64_t n, int64_t k, float *scratch, uint8_t *fl) {
    memcpy(scratch, val, (size_t)n * 4);
    const float t = kth_largest(scratch, n, k);
    int64_t ties = k;
    for (int64_t i = 0; i < n; i++) ties -= val[i] > t;
    for (int64_t i = 0; i < n; i++) fl[i] = val[i] > t || (val[i] == t && ties-- > 0);
}

static __thread char *ref_mem = NULL;
static __thread size_t ref_cap = 0;

/* Refined codes of the M rows of x whose first codes are xq / dxb (lmx_act_prepare's, row strides KP / BP)
 * into the calling thread's second buffer (valid until its next call).  out->rows = NULL when refining is off. */
int lmx_act_refine(int64_t M, int64_t K, const float *x, int64_t xs, const int8_t *xq, const float *dxb,
                   int64_t KP, int64_t BP, int nt, lmx_refine_t *out) {
    memset(out, 0, sizeof *out);
    const int64_t nb = K / 32, k32 = refine_count(nb);
    const float thr = refine_thr;
    if (!k32 || M <= 0) return 0;
    const size_t abytes = act_bytes(M, K);
    const int nts = nt > 0 ? nt : 1;
    const size_t rbytes = ((size_t)(nts * K) * 4 + 63) & ~(size_t)63; /* one residual row per thread */
    const size_t fbytes = ((size_t)(M * BP) + 63) & ~(size_t)63;    /* per-row flags, folded into the masks */
    const int64_t rw = (M + 63) / 64;
    const size_t mbytes = (size_t)(BP * rw) * 8;                    /* row masks per block */
    const size_t tbytes = (size_t)nb * 4 * (size_t)nts + 64;
    if (grow(&ref_mem, &ref_cap, abytes + rbytes + fbytes + mbytes + tbytes)) return -1;
    act_t r;
    act_view(&r, ref_mem, M, K);
    float *res = (float *)(ref_mem + abytes), *scratch = (float *)(ref_mem + abytes + rbytes + fbytes + mbytes);
    uint8_t *fl = (uint8_t *)(ref_mem + abytes + rbytes);
    uint64_t *rows = (uint64_t *)(ref_mem + abytes + rbytes + fbytes);
#pragma omp parallel num_threads(nt) if (nt > 1 && M > 1)
    {
#ifdef _OPENMP
        const int64_t t = omp_get_thread_num();
#else
        const int64_t t = 0;
#endif
        float *tmp = scratch + t * nb, *rr = res + t * K;
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            const float *xr = x + m * xs, *d = dxb + m * BP;
            const int8_t *q = xq + m * KP;
            memset(fl + m * BP + nb, 0, (size_t)(BP - nb));
            if (thr > 0.0f && k32 < nb) {
                double e = 0.0;
                for (int64_t b = 0; b < nb; b++) e += (double)d[b] * (double)d[b];
                const double t2 = (double)thr * e / (double)nb;
                int64_t above = 0;
                for (int64_t b = 0; b < nb; b++) above += e > 0.0 && (double)d[b] * (double)d[b] >= t2;
                if (above > k32) /* the largest k32 of them: the largest k32 of the row */
                    select_top(d, nb, k32, tmp, fl + m * BP);
                else
                    for (int64_t b = 0; b < nb; b++) fl[m * BP + b] = e > 0.0 && (double)d[b] * (double)d[b] >= t2;
            } else
                select_top(d, nb, k32, tmp, fl + m * BP);
            /* residual codes of the selected blocks only (the kernels read no other block's) */
            for (int64_t b = 0; b < nb; b++) {
                if (!fl[m * BP + b]) continue;
                for (int j = 0; j < 32; j++) rr[b * 32 + j] = xr[b * 32 + j] - d[b] * (float)q[b * 32 + j];
                act_blocks(&r, rr, m, b, b + 1);
            }
        }
    }
    memset(rows, 0, mbytes);
    int64_t any = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++)
            if (fl[m * BP + b]) rows[b * rw + (m >> 6)] |= (uint64_t)1 << (m & 63), any++;
    refine_seen[0] += any;
    refine_seen[1] += M * nb;
    if (!any) return 0; /* no row refines a block (the threshold): the kernels skip the refinement altogether */
    out->rows = rows;
    out->rw = rw;
    out->rq = r.xq;
    out->rdxb = r.dxb;
    out->rsxb = r.sxb;
    out->rsx16 = r.sx16;
    out->rixp = r.ixp;
    return 0;
}

/* ------------------------------------------------------------------ scalar path
 * Decode one block into codes u and per-16 scale/offset (w = s * u + o). */
static void decode_block(int kind, const uint8_t *b, uint8_t *u, float *s, float *o) {
    switch (kind) {
    case LMX_Q4_0: case LMX_Q4_1: {
        float d = lmx_h2f(lmx_rd16(b));
        float m = kind == LMX_Q4_1 ? lmx_h2f(lmx_rd16(b + 2)) : -8.0f * d;
        const uint8_t *qs = b + (kind == LMX_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) { u[j] = qs[j] & 0x0F; u[j + 16] = qs[j] >> 4; }
        s[0] = s[1] = d; o[0] = o[1] = m;
        break;
    }
    case LMX_Q5_0: case LMX_Q5_1: {
        float d = lmx_h2f(lmx_rd16(b));
        float m = kind == LMX_Q5_1 ? lmx_h2f(lmx_rd16(b + 2)) : -16.0f * d;
        uint32_t qh;
        memcpy(&qh, b + (kind == LMX_Q5_1 ? 4 : 2), 4);
        const uint8_t *qs = b + (kind == LMX_Q5_1 ? 8 : 6);
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
            u[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        }
        s[0] = s[1] = d; o[0] = o[1] = m;
        break;
    }
    case LMX_Q8_0: {
        float d = lmx_h2f(lmx_rd16(b));
        for (int j = 0; j < 32; j++) u[j] = (uint8_t)(b[2 + j] ^ 0x80);
        s[0] = s[1] = d; o[0] = o[1] = -128.0f * d;
        break;
    }
    case LMX_Q2_K: {
        const uint8_t *sc = b;
        float d = lmx_h2f(lmx_rd16(b + 80)), dmin = lmx_h2f(lmx_rd16(b + 82));
        lmx_kquant_codes(kind, b, u);
        for (int j = 0; j < 16; j++) { s[j] = d * (float)(sc[j] & 0x0F); o[j] = -(dmin * (float)(sc[j] >> 4)); }
        break;
    }
    case LMX_Q3_K: {
        float d = lmx_h2f(lmx_rd16(b + 108));
        int8_t sc[16];
        lmx_q3k_scales(b + 96, sc);
        for (int j = 0; j < 16; j++) { s[j] = d * (float)sc[j]; o[j] = -4.0f * s[j]; }
        lmx_kquant_codes(kind, b, u);
        break;
    }
    case LMX_Q4_K: case LMX_Q5_K: {
        float d = lmx_h2f(lmx_rd16(b)), dmin = lmx_h2f(lmx_rd16(b + 2));
        uint8_t sc[8], mn[8];
        lmx_k4_scale_min(b + 4, sc, mn);
        lmx_kquant_codes(kind, b, u);
        for (int j = 0; j < 8; j++) {
            s[2 * j] = s[2 * j + 1] = d * (float)sc[j];
            o[2 * j] = o[2 * j + 1] = -(dmin * (float)mn[j]);
        }
        break;
    }
    case LMX_Q6_K: {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = lmx_h2f(lmx_rd16(b + 208));
        lmx_kquant_codes(kind, b, u);
        for (int j = 0; j < 16; j++) { s[j] = d * (float)sc[j]; o[j] = -32.0f * s[j]; }
        break;
    }
    }
}

static void rows_scalar(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, const act_t *a,
                        float *y, int64_t y_stride) {
    const int64_t be = lmx_block_elems(kind), bb = lmx_block_bytes(kind), nblk = a->K / be;
    uint8_t u[256];
    float s[16], o[16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * row_bytes;
        for (int64_t m = 0; m < a->M; m++) {
            const int8_t *xq = a->xq + m * a->KP;
            const float *dxb = a->dxb + m * a->BP, *sx16 = a->sx16 + m * 2 * a->BP;
            float acc = 0.0f;
            for (int64_t bl = 0; bl < nblk; bl++) {
                decode_block(kind, wr + bl * bb, u, s, o);
                for (int64_t g = 0; g < be / 16; g++) {
                    const int64_t e0 = bl * be + g * 16;
                    int32_t isum = 0;
                    for (int j = 0; j < 16; j++) isum += (int32_t)u[g * 16 + j] * (int32_t)xq[e0 + j];
                    acc += s[g] * dxb[e0 / 32] * (float)isum + o[g] * sx16[e0 / 16];
                }
            }
            y[m * y_stride + r] = acc;
        }
    }
}

/* ------------------------------------------------------------------ AVX-512 VNNI path */
#ifdef LMX_AVX512VNNI
#define MB 8

/* [lo nibbles of q16a, hi of q16a, lo of q16b, hi of q16b] as 64 bytes. */
LMX_INLINE __m512i nib2(const uint8_t *qa, const uint8_t *qb) {
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                        _mm_loadu_si128((const __m128i *)qb), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* lo_a lo_b hi_a hi_b */
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));       /* lo_a hi_a lo_b hi_b */
}

/* [lo nibbles of 32 bytes, hi nibbles of them]. */
LMX_INLINE __m512i nib32(const uint8_t *q) {
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
}

/* lanes 0-7 <- a, lanes 8-15 <- a + 1 */
LMX_INLINE __m512i pair_idx(int a) {
    return _mm512_add_epi32(_mm512_set1_epi32(a),
                            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
}

/* lanes 4k..4k+3 <- a + k */
LMX_INLINE __m512i quad_idx(int a) {
    return _mm512_add_epi32(_mm512_set1_epi32(a),
                            _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
}

/* acc[mm] += (sum(u * x) in 16 lanes of 4 values) * (per-lane scale from ds[mm] via idx) */
#define DOT_CHUNK(E0, U, IDX)                                                                             \
    do {                                                                                                  \
        for (int mm = 0; mm < mb; mm++) {                                                                 \
            __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), (U),                               \
                                               _mm512_loadu_si512((const void *)(xq + mm * KP + (E0))));  \
            acc[mm] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps((IDX), ds[mm]), acc[mm]); \
        }                                                                                                 \
    } while (0)

/* One weight row against activation rows m0 .. m0 + mb - 1 (inlined for each constant mb, so the
 * accumulators live in registers). */
LMX_INLINE void row_avx512(int kind, const uint8_t *wr, const act_t *a, int64_t m0, const int mb, float *out,
                           int64_t out_stride) {
    __m512 acc[MB], ds[MB];
    for (int i = 0; i < mb; i++) acc[i] = _mm512_setzero_ps();
    const int64_t K = a->K, KP = a->KP, BP = a->BP;
    const int8_t *xq = a->xq + m0 * KP;
    const float *dxb = a->dxb + m0 * BP, *sxb = a->sxb + m0 * BP, *sx16 = a->sx16 + m0 * 2 * BP;
    switch (kind) {
    case LMX_Q4_0: case LMX_Q4_1: case LMX_Q5_0: case LMX_Q5_1: case LMX_Q8_0: {
        const int64_t bb = lmx_block_bytes(kind), nb = K / 32;
        const int with_min = kind == LMX_Q4_1 || kind == LMX_Q5_1;
        const float cneg = kind == LMX_Q4_0 ? -8.0f : kind == LMX_Q5_0 ? -16.0f : kind == LMX_Q8_0 ? -128.0f : 0.0f;
        const __m512i gidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32((int)bb));
        for (int64_t g0 = 0; g0 < nb; g0 += 16) {
            const int nblk = nb - g0 < 16 ? (int)(nb - g0) : 16;
            const uint8_t *gw = wr + g0 * bb;
            /* the 16 blocks' first 4 bytes: d (and m) as fp16 */
            __m512i hdr = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << nblk) - 1), gidx,
                                                      (const void *)gw, 1);
            __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
            __m512 ow = with_min ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)))
                                 : _mm512_mul_ps(dw, _mm512_set1_ps(cneg));
            for (int mm = 0; mm < mb; mm++) {
                ds[mm] = _mm512_mul_ps(dw, _mm512_loadu_ps(dxb + mm * BP + g0));
                acc[mm] = _mm512_fmadd_ps(ow, _mm512_loadu_ps(sxb + mm * BP + g0), acc[mm]);
            }
            for (int c = 0; 2 * c < nblk; c++) {
                const uint8_t *b0 = gw + 2 * c * bb;
                const uint8_t *b1 = 2 * c + 1 < nblk ? b0 + bb : b0; /* never read past the row */
                const __m512i idx = pair_idx(2 * c);
                const int64_t e0 = (g0 + 2 * c) * 32;
                __m512i u;
                if (kind == LMX_Q8_0) {
                    u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                           _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
                    u = _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80));
                } else if (kind == LMX_Q4_0) {
                    u = nib2(b0 + 2, b1 + 2);
                } else if (kind == LMX_Q4_1) {
                    u = nib2(b0 + 4, b1 + 4);
                } else {
                    const int one = kind == LMX_Q5_1;
                    uint32_t q0, q1;
                    memcpy(&q0, b0 + 2 + 2 * one, 4);
                    memcpy(&q1, b1 + 2 + 2 * one, 4);
                    u = nib2(b0 + 6 + 2 * one, b1 + 6 + 2 * one);
                    __m512i hb = _mm512_movm_epi8((__mmask64)((uint64_t)q0 | ((uint64_t)q1 << 32)));
                    u = _mm512_or_si512(u, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
                }
                DOT_CHUNK(e0, u, idx);
            }
        }
        break;
    }
    case LMX_Q4_K: case LMX_Q5_K: {
        const int64_t bb = lmx_block_bytes(kind), nb = K / 256;
        const int five = kind == LMX_Q5_K;
        const __m256i m4 = _mm256_set1_epi8(0x0F), one8 = _mm256_set1_epi8(1);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + b * bb;
            uint32_t w3[3];
            memcpy(w3, blk + 4, 12);
            /* 6-bit scales and mins: [sc0-3, sc4-7, mn0-3, mn4-7] as bytes */
            const uint32_t sc_lo = w3[0] & 0x3F3F3F3Fu, mn_lo = w3[1] & 0x3F3F3F3Fu;
            const uint32_t sc_hi = (w3[2] & 0x0F0F0F0Fu) | ((w3[0] >> 2) & 0x30303030u);
            const uint32_t mn_hi = ((w3[2] >> 4) & 0x0F0F0F0Fu) | ((w3[1] >> 2) & 0x30303030u);
            __m512 scmn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo)));
            uint32_t hd;
            memcpy(&hd, blk, 4);
            __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)hd)); /* d, dmin */
            __m512 mult = _mm512_insertf32x8(_mm512_set1_ps(_mm_cvtss_f32(dd)),
                                             _mm256_set1_ps(-_mm_cvtss_f32(_mm_shuffle_ps(dd, dd, 1))), 1);
            scmn = _mm512_mul_ps(scmn, mult); /* lanes 0-7 d*sc, lanes 8-15 -dmin*mn */
            const __m256 mins = _mm512_extractf32x8_ps(scmn, 1);
            for (int mm = 0; mm < mb; mm++) {
                ds[mm] = _mm512_mul_ps(scmn, _mm512_loadu_ps(dxb + mm * BP + b * 8));
                acc[mm] = _mm512_fmadd_ps(_mm512_zextps256_ps512(mins),
                                          _mm512_zextps256_ps512(_mm256_loadu_ps(sxb + mm * BP + b * 8)), acc[mm]);
            }
            const uint8_t *qs = blk + (five ? 48 : 16);
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                __m512i u = nib32(qs + 32 * j);
                if (five) {
                    __m256i hl = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), one8);
                    __m256i hh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j + 1)), one8);
                    u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(hl), hh, 1), 4));
                }
                (void)m4;
                DOT_CHUNK(b * 256 + 64 * j, u, pair_idx(2 * j));
            }
        }
        break;
    }
    case LMX_Q6_K: {
        const int64_t bb = 210, nb = K / 256;
        const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
        const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + b * bb;
            uint16_t hd;
            memcpy(&hd, blk + 208, 2);
            const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(hd)));
            __m512 sc = _mm512_mul_ps(_mm512_set1_ps(d),
                                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)))));
            __m512 off = _mm512_mul_ps(sc, _mm512_set1_ps(-32.0f));
            for (int mm = 0; mm < mb; mm++) {
                /* per-16 scale times the scale of its 32-block */
                ds[mm] = _mm512_mul_ps(sc, _mm512_permutexvar_ps(dup, _mm512_loadu_ps(dxb + mm * BP + b * 8)));
                acc[mm] = _mm512_fmadd_ps(off, _mm512_loadu_ps(sx16 + mm * 2 * BP + b * 16), acc[mm]);
            }
            for (int h = 0; h < 2; h++) {
                __m256i qa = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                __m256i qb = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                __m256i p0 = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                __m256i p1 = _mm256_or_si256(_mm256_and_si256(qb, m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                __m256i p2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                __m256i p3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
                __m512i u0 = _mm512_inserti64x4(_mm512_castsi256_si512(p0), p1, 1);
                __m512i u1 = _mm512_inserti64x4(_mm512_castsi256_si512(p2), p3, 1);
                DOT_CHUNK(b * 256 + 128 * h, u0, quad_idx(8 * h));
                DOT_CHUNK(b * 256 + 128 * h + 64, u1, quad_idx(8 * h + 4));
            }
        }
        break;
    }
    default: { /* Q2_K, Q3_K: decode each super-block to codes, then the same SIMD sums */
        const int64_t bb = lmx_block_bytes(kind), nb = K / 256;
        const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        uint8_t uu[256] __attribute__((aligned(64)));
        float s[16], o[16];
        for (int64_t b = 0; b < nb; b++) {
            decode_block(kind, wr + b * bb, uu, s, o);
            const __m512 sc = _mm512_loadu_ps(s), off = _mm512_loadu_ps(o);
            for (int mm = 0; mm < mb; mm++) {
                ds[mm] = _mm512_mul_ps(sc, _mm512_permutexvar_ps(dup, _mm512_loadu_ps(dxb + mm * BP + b * 8)));
                acc[mm] = _mm512_fmadd_ps(off, _mm512_loadu_ps(sx16 + mm * 2 * BP + b * 16), acc[mm]);
            }
            for (int c = 0; c < 4; c++) {
                __m512i u = _mm512_load_si512((const void *)(uu + 64 * c));
                DOT_CHUNK(b * 256 + 64 * c, u, quad_idx(4 * c));
            }
        }
        break;
    }
    }
    for (int i = 0; i < mb; i++) out[i * out_stride] = _mm512_reduce_add_ps(acc[i]);
}

#define ROWS_MB(NM)                                                                                  \
    static void rows_mb##NM(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,       \
                            const act_t *a, int64_t m0, float *y, int64_t y_stride) {                   \
        for (int64_t r = r0; r < r1; r++) row_avx512(kind, w + r * row_bytes, a, m0, NM, y + m0 * y_stride + r, y_stride); \
    }
ROWS_MB(1) ROWS_MB(2) ROWS_MB(3) ROWS_MB(4) ROWS_MB(5) ROWS_MB(6) ROWS_MB(7) ROWS_MB(8)

static void rows_avx512(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, const act_t *a,
                        float *y, int64_t y_stride) {
    for (int64_t m0 = 0; m0 < a->M; m0 += MB) {
        const int mb = (int)(a->M - m0 < MB ? a->M - m0 : MB);
        switch (mb) {
        case 1: rows_mb1(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 2: rows_mb2(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 3: rows_mb3(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 4: rows_mb4(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 5: rows_mb5(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 6: rows_mb6(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 7: rows_mb7(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        default: rows_mb8(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        }
    }
}
#elif defined(LMX_AVX2)
/* AVX2: each block is decoded once into unsigned codes and per-16 scale/offset (decode_block), then
 * every activation row of the tile takes exact 16-value integer sums of it (codes widened to 16
 * bits, vpmaddwd) scaled into 8 float lanes; one horizontal sum per output. */
#define MB 4

LMX_INLINE void row_avx2(int kind, const uint8_t *wr, const act_t *a, int64_t m0, const int mb, float *out,
                         int64_t out_stride) {
    __m256 acc[MB];
    float offs[MB];
    for (int i = 0; i < mb; i++) { acc[i] = _mm256_setzero_ps(); offs[i] = 0.0f; }
    const int64_t be = lmx_block_elems(kind), bb = lmx_block_bytes(kind), nblk = a->K / be, KP = a->KP, BP = a->BP;
    uint8_t u[256];
    float s[16], o[16];
    for (int64_t bl = 0; bl < nblk; bl++) {
        decode_block(kind, wr + bl * bb, u, s, o);
        for (int64_t g = 0; g < be / 16; g++) {
            const int64_t e0 = bl * be + g * 16;
            const __m256i w16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(u + g * 16)));
            for (int i = 0; i < mb; i++) {
                const int8_t *xq = a->xq + (m0 + i) * KP;
                const __m256i p = _mm256_madd_epi16(w16, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xq + e0))));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[g] * a->dxb[(m0 + i) * BP + e0 / 32]), acc[i]);
                offs[i] += o[g] * a->sx16[(m0 + i) * 2 * BP + e0 / 16];
            }
        }
    }
    for (int i = 0; i < mb; i++) out[i * out_stride] = lmx_hsum256(acc[i]) + offs[i];
}

#define ROWS_MB(NM)                                                                                  \
    static void rows_mb##NM(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,       \
                            const act_t *a, int64_t m0, float *y, int64_t y_stride) {                   \
        for (int64_t r = r0; r < r1; r++) row_avx2(kind, w + r * row_bytes, a, m0, NM, y + m0 * y_stride + r, y_stride); \
    }
ROWS_MB(1) ROWS_MB(2) ROWS_MB(3) ROWS_MB(4)

static void rows_avx2(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, const act_t *a,
                      float *y, int64_t y_stride) {
    for (int64_t m0 = 0; m0 < a->M; m0 += MB) {
        const int mb = (int)(a->M - m0 < MB ? a->M - m0 : MB);
        switch (mb) {
        case 1: rows_mb1(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 2: rows_mb2(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        case 3: rows_mb3(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        default: rows_mb4(kind, w, row_bytes, r0, r1, a, m0, y, y_stride); break;
        }
    }
}
#endif

/* ------------------------------------------------------------------ NEON path
 * Each 256 values (one K-quant super-block, or 8 blocks of 32) are decoded once per 8 activation rows
 * into codes, per-16 scales and offsets (decode_block); then per 64 values four 16-value integer dots
 * (SDOT) give one vector of four group sums, scaled and offset in float32. */
#ifdef LMX_NEON
#define NMB 8

static void rows_neon(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, const act_t *a,
                      float *y, int64_t y_stride) {
    const int64_t be = lmx_block_elems(kind), bb = lmx_block_bytes(kind), K = a->K, KP = a->KP, BP = a->BP;
    uint8_t u[256] __attribute__((aligned(16)));
    float s[16], o[16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * row_bytes;
        for (int64_t m0 = 0; m0 < a->M; m0 += NMB) {
            const int mb = (int)(a->M - m0 < NMB ? a->M - m0 : NMB);
            float32x4_t acc[NMB];
            for (int i = 0; i < mb; i++) acc[i] = vdupq_n_f32(0.0f);
            for (int64_t c0 = 0; c0 < K; c0 += 256) {
                const int n = (int)(K - c0 < 256 ? K - c0 : 256); /* a multiple of 32 */
                for (int e = 0; e < n; e += (int)be) decode_block(kind, wr + (c0 + e) / be * bb, u + e, s + e / 16, o + e / 16);
                if (kind == LMX_Q8_0) { /* signed codes: the -128 d offset is not needed */
                    for (int e = 0; e < n; e += 16) vst1q_u8(u + e, veorq_u8(vld1q_u8(u + e), vdupq_n_u8(0x80)));
                    for (int j = 0; j < n / 16; j++) o[j] = 0.0f;
                }
                const int ng = n / 16, ng4 = (ng + 3) & ~3;
                for (int j = ng; j < ng4; j++) { /* pad to 64 values: zero codes, scales and offsets */
                    memset(u + 16 * j, 0, 16);
                    s[j] = o[j] = 0.0f;
                }
                for (int g = 0; g < ng4; g += 4) {
                    const int8x16_t u0 = vreinterpretq_s8_u8(vld1q_u8(u + 16 * g));
                    const int8x16_t u1 = vreinterpretq_s8_u8(vld1q_u8(u + 16 * g + 16));
                    const int8x16_t u2 = vreinterpretq_s8_u8(vld1q_u8(u + 16 * g + 32));
                    const int8x16_t u3 = vreinterpretq_s8_u8(vld1q_u8(u + 16 * g + 48));
                    const float32x4_t sv = vld1q_f32(s + g), ov = vld1q_f32(o + g);
                    const int64_t e0 = c0 + 16 * g; /* a multiple of 64: reads up to e0 + 64 <= KP */
                    for (int i = 0; i < mb; i++) {
                        const int8_t *x = a->xq + (m0 + i) * KP + e0;
                        const int32x4_t z = vdupq_n_s32(0);
                        const int32x4_t p0 = lmx_sdot(z, u0, vld1q_s8(x)), p1 = lmx_sdot(z, u1, vld1q_s8(x + 16));
                        const int32x4_t p2 = lmx_sdot(z, u2, vld1q_s8(x + 32)), p3 = lmx_sdot(z, u3, vld1q_s8(x + 48));
                        const int32x4_t is = vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3)); /* 4 group sums */
                        const float32x4_t dx = vld1q_f32(a->dxb + (m0 + i) * BP + e0 / 32); /* dx0 dx1 (pad) */
                        const float32x4_t dd = vzip1q_f32(dx, dx);                          /* dx0 dx0 dx1 dx1 */
                        acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(is), vmulq_f32(sv, dd));
                        acc[i] = vfmaq_f32(acc[i], ov, vld1q_f32(a->sx16 + (m0 + i) * 2 * BP + e0 / 16));
                    }
                }
            }
            for (int i = 0; i < mb; i++) y[(m0 + i) * y_stride + r] = vaddvq_f32(acc[i]);
        }
    }
}
#endif

static int quant_kind(int kind) {
    switch (kind) {
    case LMX_Q4_0: case LMX_Q4_1: case LMX_Q5_0: case LMX_Q5_1: case LMX_Q8_0:
    case LMX_Q2_K: case LMX_Q3_K: case LMX_Q4_K: case LMX_Q5_K: case LMX_Q6_K: return 1;
    default: return 0;
    }
}

/* Rows [r0, r1) of one weight into y (y points at the weight's first output column). */
static void run_rows(int kind, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, const act_t *a,
                     float *y, int64_t y_stride, int force_scalar) {
#ifdef LMX_AVX512VNNI
    if (!force_scalar) { rows_avx512(kind, w, row_bytes, r0, r1, a, y, y_stride); return; }
#elif defined(LMX_AVX2)
    if (!force_scalar) { rows_avx2(kind, w, row_bytes, r0, r1, a, y, y_stride); return; }
#elif defined(LMX_NEON)
    if (!force_scalar) { rows_neon(kind, w, row_bytes, r0, r1, a, y, y_stride); return; }
#endif
    (void)force_scalar;
    rows_scalar(kind, w, row_bytes, r0, r1, a, y, y_stride);
}

/* y[M, sum(N)] = x[M, K] @ concat(W_i)^T (+ bias_i), each W_i [N_i, K] of its own GGML kind.
 * Returns 0, or a negative code: -1 bad kind, -2 K not a multiple of the block, -3 no memory. */
LMX_API int lmx_qmatmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw, const uint8_t *const *w,
                        const int *kinds, const int64_t *N, const int64_t *row_bytes, const float *const *bias,
                        float *y, int64_t y_stride, int force_scalar, const float *norm_w, float norm_eps) {
    if (lmx_prenorm(&x, &x_stride, M, K, norm_w, norm_eps)) return -3; /* the fused RMSNorm, if any */

    int64_t total = 0;
    if (nw < 1 || nw > 64) return -1;
    for (int i = 0; i < nw; i++) {
        if (!quant_kind(kinds[i])) return -1;
        if (K % lmx_block_elems(kinds[i])) return -2;
        total += N[i];
    }
    if (K % 32) return -2;
    act_t a;
    if (act_alloc(&a, M, K)) return -3;
    int64_t offs[64];
    offs[0] = 0;
    for (int i = 1; i < nw; i++) offs[i] = offs[i - 1] + N[i - 1];
    const int64_t work = M * total * K;
    int nt = lmx_num_threads();
    if (work < (1 << 18)) nt = 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) act_row(&a, x + m * x_stride, m);
#ifdef _OPENMP
        int t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        int t = 0, T = 1;
#endif
        /* contiguous ranges of the concatenated rows, in units of 4 rows */
        int64_t units = (total + 3) / 4;
        int64_t u0 = units * t / T, u1 = units * (t + 1) / T;
        int64_t g0 = u0 * 4, g1 = u1 * 4 < total ? u1 * 4 : total;
        for (int i = 0; i < nw && g0 < g1; i++) {
            int64_t lo = offs[i], hi = offs[i] + N[i];
            int64_t s = g0 > lo ? g0 : lo, e = g1 < hi ? g1 : hi;
            if (s < e) run_rows(kinds[i], w[i], row_bytes[i], s - lo, e - lo, &a, y + lo, y_stride, force_scalar);
        }
        lmx_add_biases(M, nw, N, offs, bias, y, y_stride);
    }
    return 0;
}
