/* Decode steps of the recurrent ops (max.graph.ops.recurrent), and the gated RMSNorm that follows the
 * Mamba-2 / DeltaNet mixers (max.graph.ops.gated_rms_norm).
 *
 * Decode steps: one token per request, the request's
 * state read and updated in place in its slot (no gather/scatter copies), float32 throughout.
 *
 * state slot s of a [num_slots, ...] buffer starts at state + slots[b] * slot_stride (elements).
 * Inner loops are plain element-wise loops the compiler vectorises; dot products over the state
 * dimension use 8 partial sums (lmx_dot8, common.h). */
#include "common.h"
#include <alloca.h>

/* y[i] = silu(y[i]) in place: exp through the 2^t polynomial of common.h on AVX-512 / AVX2 (t clamped to
 * [-126, 126]: silu's exp(-v) saturates there), expf elsewhere and in the tail. */
static void silu_inplace(float *y, int64_t n) {
    int64_t i = 0;
#if defined(LMX_AVX512)
    const __m512 l2e = _mm512_set1_ps(-1.4426950408889634f), lo = _mm512_set1_ps(-126.0f),
                 hi = _mm512_set1_ps(126.0f), one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(y + i);
        __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, l2e), lo), hi);
        _mm512_storeu_ps(y + i, _mm512_div_ps(v, _mm512_add_ps(one, lmx_exp2_ps(t))));
    }
#elif defined(LMX_AVX2)
    const __m256 l2e = _mm256_set1_ps(-1.4426950408889634f), lo = _mm256_set1_ps(-126.0f),
                 hi = _mm256_set1_ps(126.0f), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(y + i);
        __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, l2e), lo), hi);
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, lmx_exp2_ps256(t))));
    }
#endif
    for (; i < n; i++) y[i] = lmx_silu(y[i]);
}

/* Depthwise causal conv, one token per request: x [B, C] (row stride xs), w [C, K], bias [C] or NULL,
 * window [C, K-1] per slot (oldest first); y [B, C] (contiguous).  Per request: the taps (a 4-tap form the
 * compiler vectorises across channels, else a loop over K), then the window shifts as one memmove of the
 * slot (channel c's taps 1.. move to 0..; its last tap then takes x[c]), then SiLU over the row. */
LMX_API int lmx_conv1d_decode(int64_t B, int64_t C, int64_t K, const float *x, int64_t xs, const float *w,
                              const float *bias, float *state, const int64_t *slots, int64_t slot_stride,
                              int silu, float *y) {
#pragma omp parallel for schedule(static) if (B * C * K > (1 << 17))
    for (int64_t b = 0; b < B; b++) {
        float *win = state + slots[b] * slot_stride;
        const float *xb = x + b * xs;
        float *yb = y + b * C;
        if (K == 4) {
            for (int64_t c = 0; c < C; c++) {
                const float *wc = win + 3 * c, *kc = w + 4 * c;
                float acc = ((wc[0] * kc[0] + wc[1] * kc[1]) + wc[2] * kc[2]) + xb[c] * kc[3];
                yb[c] = bias ? acc + bias[c] : acc;
            }
        } else {
            for (int64_t c = 0; c < C; c++) {
                const float *wc = win + c * (K - 1), *kc = w + c * K;
                float acc = 0.0f;
                for (int64_t j = 0; j < K - 1; j++) acc += wc[j] * kc[j];
                acc += xb[c] * kc[K - 1];
                yb[c] = bias ? acc + bias[c] : acc;
            }
        }
        if (K > 1) {
            memmove(win, win + 1, (size_t)(C * (K - 1) - 1) * sizeof(float));
            for (int64_t c = 0; c < C; c++) win[c * (K - 1) + K - 2] = xb[c];
        }
        if (silu) silu_inplace(yb, C);
    }
    return 0;
}

/* softplus(x) = log(1 + exp(x)), written as the graph's softplus (max(x, 0) + log1p(exp(-|x|))) */
LMX_INLINE float lmx_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

/* Mamba-2 SSD, one token per request: x [B, H, P] (row stride xs), dt [B, H] (row stride dts), A [H],
 * Bm / Cm [B, G, N] (row stride bcs), D [H] or NULL, state [H, P, N] per slot; y [B, H, P] (contiguous).
 * With dt_bias (or dt_softplus) the step size is dt' = softplus(dt + dt_bias) (dt_bias NULL: 0), clamped
 * to [dt_min, dt_max]; else dt is used as given. */
LMX_API int lmx_ssd_decode(int64_t B, int64_t H, int64_t P, int64_t G, int64_t N, const float *x, int64_t xs,
                           const float *dt, int64_t dts, const float *A, const float *Bm, const float *Cm,
                           int64_t bcs, const float *D, const float *dt_bias, int dt_softplus, float dt_min,
                           float dt_max, float *state, const int64_t *slots, int64_t slot_stride, float *y) {
    const int64_t per = H / G;
#pragma omp parallel for schedule(static) if (B * H * P * N > (1 << 16))
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H, g = h / per;
        float *s = state + slots[b] * slot_stride + h * P * N;
        float d = dt[b * dts + h];
        if (dt_softplus) {
            d = lmx_softplus(d + (dt_bias ? dt_bias[h] : 0.0f));
            d = d < dt_min ? dt_min : (d > dt_max ? dt_max : d);
        }
        const float da = expf(d * A[h]);
        const float *bn = Bm + b * bcs + g * N;
        const float *cn = Cm + b * bcs + g * N;
        const float *xp = x + b * xs + h * P;
        float *yp = y + (b * H + h) * P;
        for (int64_t p = 0; p < P; p++) {
            float *sp = s + p * N;
            const float dx = d * xp[p];
            for (int64_t n = 0; n < N; n++) sp[n] = sp[n] * da + dx * bn[n];
            yp[p] = lmx_dot8(sp, cn, N) + (D ? D[h] * xp[p] : 0.0f);
        }
    }
    return 0;
}

/* q or k of one head, optionally L2-normalised (x / sqrt(sum x^2 + 1e-6), as the graph's) and scaled. */
LMX_INLINE void gdr_key(const float *src, int64_t K, int l2norm, float scale, float *dst) {
    float f = scale;
    if (l2norm) f *= 1.0f / sqrtf(lmx_dot8(src, src, K) + 1e-6f);
    for (int64_t i = 0; i < K; i++) dst[i] = src[i] * f;
}

/* Gated delta rule, one token per request: q, k [B, Hk, K] (row strides qs, ks), v [B, H, V] (row stride
 * vs), g, beta [B, H] (row stride gs), state [H, K, V] per slot; o [B, H, V] (contiguous).  Value head h
 * reads key head h / (H / Hk).  S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
 * Prepared in here when asked: q and k L2-normalised (l2norm), q times scale; with A ([H], not NULL) the
 * log decay is A[h] * softplus(g + dt_bias[h]) (dt_bias NULL: 0); beta_sigmoid: beta = sigmoid(beta). */
LMX_API int lmx_gdr_decode(int64_t B, int64_t H, int64_t Hk, int64_t K, int64_t V, const float *q, int64_t qs,
                           const float *k, int64_t ks, const float *v, int64_t vs, const float *g,
                           const float *beta, int64_t gs, const float *A, const float *dt_bias, int beta_sigmoid,
                           int l2norm, float scale, float *state, const int64_t *slots, int64_t slot_stride,
                           float *o) {
    const int64_t per = H / Hk;
#pragma omp parallel for schedule(static) if (B * H * K * V > (1 << 16))
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H, hk = h / per;
        float *S = state + slots[b] * slot_stride + h * K * V;
        const float *vh = v + b * vs + h * V;
        float *oh = o + bh * V;
        float *kv = (float *)alloca((size_t)(V + 2 * K) * sizeof(float));
        float *qh = kv + V, *kh = qh + K;
        gdr_key(q + b * qs + hk * K, K, l2norm, scale, qh);
        gdr_key(k + b * ks + hk * K, K, l2norm, 1.0f, kh);
        float lg = g[b * gs + h], bt = beta[b * gs + h];
        if (A) lg = A[h] * lmx_softplus(lg + (dt_bias ? dt_bias[h] : 0.0f));
        if (beta_sigmoid) bt = 1.0f / (1.0f + expf(-bt));
        const float eg = expf(lg);
        for (int64_t j = 0; j < V; j++) kv[j] = 0.0f;
        for (int64_t i = 0; i < K; i++) {
            float *row = S + i * V;
            const float ki = kh[i];
            for (int64_t j = 0; j < V; j++) {
                row[j] *= eg;
                kv[j] += row[j] * ki;
            }
        }
        for (int64_t j = 0; j < V; j++) {
            kv[j] = (vh[j] - kv[j]) * bt; /* delta */
            oh[j] = 0.0f;
        }
        for (int64_t i = 0; i < K; i++) {
            float *row = S + i * V;
            const float ki = kh[i], qi = qh[i];
            for (int64_t j = 0; j < V; j++) {
                row[j] += ki * kv[j];
                oh[j] += row[j] * qi;
            }
        }
    }
    return 0;
}

/* gated_rms_norm: x [M, D] (row stride xs), z [M, D] (row stride zs) or NULL, w [D]; out [M, D]
 * (contiguous).  g = silu(z) (1 without z); per group of D / G channels: h = x g, out = h / sqrt(mean(h^2) +
 * eps) w, or with norm_before_gate out = x / sqrt(mean(x^2) + eps) w g. */
LMX_API void lmx_gated_rmsnorm(const float *x, int64_t M, int64_t D, int64_t xs, const float *z, int64_t zs,
                               const float *w, int64_t G, float eps, int norm_before_gate, float *out) {
    const int64_t n = D / G;
#pragma omp parallel for schedule(static) if (M * D > (1 << 16))
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * xs;
        float *o = out + m * D;
        if (z) {
            memcpy(o, z + m * zs, (size_t)D * sizeof(float));
            silu_inplace(o, D); /* o = g */
        }
        for (int64_t gi = 0; gi < G; gi++) {
            const float *xg = xr + gi * n;
            float *og = o + gi * n;
            const float *wg = w + gi * n;
            if (z && !norm_before_gate) {
                for (int64_t i = 0; i < n; i++) og[i] *= xg[i]; /* h = x g */
                const float r = 1.0f / sqrtf(lmx_dot8(og, og, n) / (float)n + eps);
                for (int64_t i = 0; i < n; i++) og[i] = og[i] * r * wg[i];
            } else {
                const float r = 1.0f / sqrtf(lmx_dot8(xg, xg, n) / (float)n + eps);
                if (z)
                    for (int64_t i = 0; i < n; i++) og[i] = xg[i] * r * wg[i] * og[i];
                else
                    for (int64_t i = 0; i < n; i++) og[i] = xg[i] * r * wg[i];
            }
        }
    }
}
