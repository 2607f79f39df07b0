/* Row-wise float32 kernels of the decode step: RMSNorm and gated activations. */
#include "common.h"

/* out[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * w (w may be NULL). */
LMX_API void lmx_rmsnorm(const float *x, int64_t M, int64_t K, int64_t xs, const float *w, float eps, float *out,
                         int64_t os) {
#pragma omp parallel for schedule(static) if (M * K > (1 << 16))
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * xs;
        float *o = out + m * os;
        int64_t k = 0;
        float ss = 0.0f;
#ifdef LMX_AVX512
        __m512 acc = _mm512_setzero_ps();
        for (; k + 16 <= K; k += 16) {
            __m512 v = _mm512_loadu_ps(xr + k);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        ss = _mm512_reduce_add_ps(acc);
#elif defined(LMX_AVX2)
        __m256 acc = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        ss = lmx_hsum256(acc);
#elif defined(LMX_NEON)
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
        for (; k + 8 <= K; k += 8) {
            const float32x4_t v0 = vld1q_f32(xr + k), v1 = vld1q_f32(xr + k + 4);
            a0 = vfmaq_f32(a0, v0, v0);
            a1 = vfmaq_f32(a1, v1, v1);
        }
        ss = vaddvq_f32(vaddq_f32(a0, a1));
#endif
        for (; k < K; k++) ss += xr[k] * xr[k];
        const float r = 1.0f / sqrtf(ss / (float)K + eps);
        k = 0;
#ifdef LMX_AVX512
        const __m512 vr = _mm512_set1_ps(r);
        for (; k + 16 <= K; k += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xr + k), vr);
            if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + k));
            _mm512_storeu_ps(o + k, v);
        }
#elif defined(LMX_AVX2)
        const __m256 vr = _mm256_set1_ps(r);
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + k), vr);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + k));
            _mm256_storeu_ps(o + k, v);
        }
#elif defined(LMX_NEON)
        for (; k + 4 <= K; k += 4) {
            float32x4_t v = vmulq_n_f32(vld1q_f32(xr + k), r);
            if (w) v = vmulq_f32(v, vld1q_f32(w + k));
            vst1q_f32(o + k, v);
        }
#endif
        for (; k < K; k++) o[k] = w ? xr[k] * r * w[k] : xr[k] * r;
    }
}

static __thread float *prenorm_mem = NULL;
static __thread size_t prenorm_cap = 0;

/* With a norm weight w: RMS-normalise *x [M, K] (row stride *xs) into the calling thread's scratch
 * buffer and point *x / *xs at it (row stride K), for a matmul that consumes the normalised rows right
 * away (valid until the thread's next call).  Without w: nothing.  Returns 0, -3 without memory. */
int lmx_prenorm(const float **x, int64_t *xs, int64_t M, int64_t K, const float *w, float eps) {
    if (!w) return 0;
    size_t need = (size_t)(M * K);
    if (need > prenorm_cap) {
        free(prenorm_mem);
        prenorm_mem = (float *)malloc(need * 4);
        prenorm_cap = prenorm_mem ? need : 0;
        if (!prenorm_mem) return -3;
    }
    lmx_rmsnorm(*x, M, K, *xs, w, eps, prenorm_mem, K);
    *x = prenorm_mem;
    *xs = K;
    return 0;
}

LMX_INLINE float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* out[m, i] = act(g[m, i]) * u[m, i] with g = gu[m, 0:I], u = gu[m, I:2I];
 * act 0 = silu, 1 = gelu (tanh approximation). */
LMX_API void lmx_glu(const float *gu, int64_t M, int64_t I, int64_t gs, int act, float *out, int64_t os) {
#pragma omp parallel for schedule(static) if (M * I > (1 << 15))
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * gs, *u = g + I;
        float *o = out + m * os;
        int64_t i = 0;
#ifdef LMX_AVX512
        if (act == 0) {
            const __m512 one = _mm512_set1_ps(1.0f);
            for (; i + 16 <= I; i += 16) {
                __m512 x = _mm512_loadu_ps(g + i);
                /* silu(x) = x / (1 + exp(-x)) */
                __m512 e = lmx_exp2_ps(_mm512_mul_ps(_mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)),
                                                                   _mm512_set1_ps(-88.0f)),
                                                     _mm512_set1_ps(-1.4426950408889634f)));
                __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
                _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
            }
        }
#elif defined(LMX_AVX2)
        if (act == 0 || act == 1) {
            /* silu(x) = x / (1 + exp(-x));  gelu_tanh(x) = x / (1 + exp(-2 c (x + 0.044715 x^3))) */
            const __m256 one = _mm256_set1_ps(1.0f);
            for (; i + 8 <= I; i += 8) {
                __m256 x = _mm256_loadu_ps(g + i), z = x;
                if (act != 0) {
                    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                    z = _mm256_mul_ps(_mm256_add_ps(x, _mm256_mul_ps(x3, _mm256_set1_ps(0.044715f))),
                                      _mm256_set1_ps(2.0f * 0.7978845608028654f));
                }
                __m256 e = lmx_exp2_ps256(_mm256_mul_ps(_mm256_max_ps(_mm256_min_ps(z, _mm256_set1_ps(88.0f)),
                                                                      _mm256_set1_ps(-88.0f)),
                                                        _mm256_set1_ps(-1.4426950408889634f)));
                __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
                _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
            }
        }
#elif defined(LMX_NEON)
        if (act == 0 || act == 1) {
            /* silu(x) = x / (1 + exp(-x));  gelu_tanh(x) = x / (1 + exp(-2 c (x + 0.044715 x^3))) */
            const float32x4_t one = vdupq_n_f32(1.0f), lim = vdupq_n_f32(88.0f), nlim = vdupq_n_f32(-88.0f);
            const float l2e = -1.4426950408889634f;
            for (; i + 4 <= I; i += 4) {
                const float32x4_t x = vld1q_f32(g + i);
                float32x4_t z = x;
                if (act != 0) {
                    const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
                    z = vmulq_n_f32(vaddq_f32(x, vmulq_n_f32(x3, 0.044715f)), 2.0f * 0.7978845608028654f);
                }
                const float32x4_t e = lmx_exp2_f32x4(vmulq_n_f32(vmaxq_f32(vminq_f32(z, lim), nlim), l2e));
                vst1q_f32(o + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), vld1q_f32(u + i)));
            }
        }
#endif
        for (; i < I; i++) {
            float x = g[i];
            float a = act == 0 ? x / (1.0f + expf(-x)) : gelu_tanh(x);
            o[i] = a * u[i];
        }
    }
}
