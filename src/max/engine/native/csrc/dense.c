/* y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for dense float32 / bfloat16 /
 * float16 W in its natural [N, K] layout (the checkpoint's; no transposed copy).
 *
 * Written for the small-M (decode) regime, where the cost is streaming W once:
 * float32 accumulation throughout; half-precision weights are widened exactly
 * to float32 (once per 16 values, shared by up to 8 activation rows), so the
 * result is that of float32 x times the widened weight.
 */
#include "common.h"

#define DMB 8

static inline float dot_scalar(int kind, const float *x, const uint8_t *w, int64_t K) {
    float acc = 0.0f;
    if (kind == LMX_F32) {
        const float *wf = (const float *)w;
        for (int64_t k = 0; k < K; k++) acc += x[k] * wf[k];
    } else if (kind == LMX_BF16) {
        for (int64_t k = 0; k < K; k++) acc += x[k] * lmx_bf2f(lmx_rd16(w + 2 * k));
    } else {
        for (int64_t k = 0; k < K; k++) acc += x[k] * lmx_h2f(lmx_rd16(w + 2 * k));
    }
    return acc;
}

#ifdef LMX_AVX512
/* One weight row against activation rows 0..mb-1 (x rows at stride xs). */
LMX_INLINE void drow(int kind, const uint8_t *w, const float *x, int64_t xs, int64_t K,
                     const int mb, float *out, int64_t os) {
    __m512 acc[DMB];
    for (int i = 0; i < mb; i++) acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    if (kind == LMX_F32) {
        const float *wf = (const float *)w;
        for (; k + 16 <= K; k += 16) {
            __m512 wv = _mm512_loadu_ps(wf + k);
            for (int i = 0; i < mb; i++) acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * xs + k), acc[i]);
        }
        if (k < K) {
            __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
            __m512 wv = _mm512_maskz_loadu_ps(mk, wf + k);
            for (int i = 0; i < mb; i++)
                acc[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * xs + k), acc[i]);
        }
    } else if (kind == LMX_BF16) {
        for (; k + 16 <= K; k += 16) {
            __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + 2 * k))), 16));
            for (int i = 0; i < mb; i++) acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * xs + k), acc[i]);
        }
        if (k < K) {
            __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
            __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, w + 2 * k)), 16));
            for (int i = 0; i < mb; i++)
                acc[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * xs + k), acc[i]);
        }
    } else { /* F16 */
        for (; k + 16 <= K; k += 16) {
            __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k)));
            for (int i = 0; i < mb; i++) acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * xs + k), acc[i]);
        }
        if (k < K) {
            __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
            __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, w + 2 * k));
            for (int i = 0; i < mb; i++)
                acc[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * xs + k), acc[i]);
        }
    }
    for (int i = 0; i < mb; i++) out[i * os] = _mm512_reduce_add_ps(acc[i]);
}
#elif defined(LMX_NEON)
/* 8 weights widened exactly to float32 (two vectors). */
LMX_INLINE void wload8(int kind, const uint8_t *w, int64_t k, float32x4_t *w0, float32x4_t *w1) {
    if (kind == LMX_F32) {
        *w0 = vld1q_f32((const float *)w + k);
        *w1 = vld1q_f32((const float *)w + k + 4);
    } else if (kind == LMX_BF16) {
        const uint16x8_t h = vld1q_u16((const uint16_t *)(const void *)(w + 2 * k));
        *w0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *w1 = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    } else {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(const void *)(w + 2 * k)));
        *w0 = vcvt_f32_f16(vget_low_f16(h));
        *w1 = vcvt_high_f32_f16(h);
    }
}

/* One weight row against activation rows 0..mb-1 (x rows at stride xs): two accumulators per row
   over 8 values, then the last K % 8 values in scalar order. */
LMX_INLINE void drow(int kind, const uint8_t *w, const float *x, int64_t xs, int64_t K,
                     const int mb, float *out, int64_t os) {
    float32x4_t a0[DMB], a1[DMB];
    for (int i = 0; i < mb; i++) a0[i] = a1[i] = vdupq_n_f32(0.0f);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        float32x4_t w0, w1;
        wload8(kind, w, k, &w0, &w1);
        for (int i = 0; i < mb; i++) {
            a0[i] = vfmaq_f32(a0[i], w0, vld1q_f32(x + i * xs + k));
            a1[i] = vfmaq_f32(a1[i], w1, vld1q_f32(x + i * xs + k + 4));
        }
    }
    for (int i = 0; i < mb; i++) {
        float s = vaddvq_f32(vaddq_f32(a0[i], a1[i]));
        const float *xi = x + i * xs;
        for (int64_t j = k; j < K; j++) {
            const float wj = kind == LMX_F32 ? ((const float *)w)[j]
                             : kind == LMX_BF16 ? lmx_bf2f(lmx_rd16(w + 2 * j)) : lmx_h2f(lmx_rd16(w + 2 * j));
            s += xi[j] * wj;
        }
        out[i * os] = s;
    }
}

#elif defined(LMX_AVX2)
/* The weight's 8 values at w + k (of kind) as float32, exactly widened; a tail of n < 8 reads only n. */
LMX_INLINE __m256 wload8(int kind, const uint8_t *w, int64_t k, int64_t n) {
    if (kind == LMX_F32) {
        const float *wf = (const float *)w + k;
        return n >= 8 ? _mm256_loadu_ps(wf) : _mm256_maskload_ps(wf, lmx_tailmask256(n));
    }
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)(w + 2 * k));
    } else {
        uint16_t t[8] = {0};
        memcpy(t, w + 2 * k, (size_t)n * 2);
        h = _mm_loadu_si128((const __m128i *)t);
    }
    if (kind == LMX_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

LMX_INLINE void drow(int kind, const uint8_t *w, const float *x, int64_t xs, int64_t K,
                     const int mb, float *out, int64_t os) {
    __m256 acc[DMB];
    for (int i = 0; i < mb; i++) acc[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        const __m256 wv = wload8(kind, w, k, 8);
        for (int i = 0; i < mb; i++) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * xs + k), acc[i]);
    }
    if (k < K) {
        const __m256i mk = lmx_tailmask256(K - k);
        const __m256 wv = wload8(kind, w, k, K - k);
        for (int i = 0; i < mb; i++) acc[i] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x + i * xs + k, mk), acc[i]);
    }
    for (int i = 0; i < mb; i++) out[i * os] = lmx_hsum256(acc[i]);
}
#endif

#if defined(LMX_AVX512) || defined(LMX_AVX2) || defined(LMX_NEON)
#define LMX_DENSE_SIMD 1
#define DROWS(NM)                                                                                       \
    static void drows_##NM(int kind, const uint8_t *w, int64_t rb, int64_t r0, int64_t r1, const float *x, \
                           int64_t xs, int64_t K, float *y, int64_t ys) {                             \
        for (int64_t r = r0; r < r1; r++) drow(kind, w + r * rb, x, xs, K, NM, y + r, ys);              \
    }
DROWS(1) DROWS(2) DROWS(3) DROWS(4) DROWS(5) DROWS(6) DROWS(7) DROWS(8)
#endif

static void drows(int kind, const uint8_t *w, int64_t rb, int64_t r0, int64_t r1, const float *x, int64_t xs,
                  int64_t M, int64_t K, float *y, int64_t ys, int force_scalar) {
#if defined(LMX_DENSE_SIMD)
    if (!force_scalar) {
        /* More than DMB activation rows: walk the weight in chunks that stay in L2 (about 128 KiB)
           and run every block of activation rows over a chunk before the next, so the weight is
           read from memory once, not once per block of DMB rows. */
        int64_t chunk = M > DMB ? (int64_t)(131072 / (rb > 0 ? rb : 1)) : (r1 - r0);
        if (chunk < 1) chunk = 1;
        for (int64_t c0 = r0; c0 < r1; c0 += chunk) {
            const int64_t c1 = c0 + chunk < r1 ? c0 + chunk : r1;
            for (int64_t m0 = 0; m0 < M; m0 += DMB) {
                const int mb = (int)(M - m0 < DMB ? M - m0 : DMB);
                const float *xm = x + m0 * xs;
                float *ym = y + m0 * ys;
                switch (mb) {
                case 1: drows_1(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 2: drows_2(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 3: drows_3(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 4: drows_4(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 5: drows_5(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 6: drows_6(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                case 7: drows_7(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                default: drows_8(kind, w, rb, c0, c1, xm, xs, K, ym, ys); break;
                }
            }
        }
        return;
    }
#endif
    (void)force_scalar;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m = 0; m < M; m++) y[m * ys + r] = dot_scalar(kind, x + m * xs, w + r * rb, K);
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
        int64_t units = (total + 3) / 4;
        int64_t g0 = units * t / T * 4, g1 = units * (t + 1) / T * 4;
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
