/* Decode steps of the recurrent ops (max.graph.ops.recurrent): one token per request, the request's
 * state read and updated in place in its slot (no gather/scatter copies), float32 throughout.
 *
 * state slot s of a [num_slots, ...] buffer starts at state + slots[b] * slot_stride (elements).
 * Inner loops are plain element-wise loops the compiler vectorises; dot products over the state
 * dimension use 8 partial sums (lmx_dot8, common.h). */
#include "common.h"
#include <alloca.h>

/* Depthwise causal conv, one token per request: x [B, C] (row stride xs), w [C, K], bias [C] or NULL,
 * window [C, K-1] per slot (oldest first); y [B, C] (contiguous). */
LMX_API int lmx_conv1d_decode(int64_t B, int64_t C, int64_t K, const float *x, int64_t xs, const float *w,
                              const float *bias, float *state, const int64_t *slots, int64_t slot_stride,
                              int silu, float *y) {
#pragma omp parallel for schedule(static) if (B * C * K > (1 << 16))
    for (int64_t b = 0; b < B; b++) {
        float *win = state + slots[b] * slot_stride;
        const float *xb = x + b * xs;
        float *yb = y + b * C;
        for (int64_t c = 0; c < C; c++) {
            float *wc = win + c * (K - 1);
            const float *kc = w + c * K;
            float acc = 0.0f;
            for (int64_t j = 0; j < K - 1; j++) acc += wc[j] * kc[j];
            acc += xb[c] * kc[K - 1];
            if (bias) acc += bias[c];
            for (int64_t j = 0; j + 1 < K - 1; j++) wc[j] = wc[j + 1];
            if (K > 1) wc[K - 2] = xb[c];
            yb[c] = silu ? lmx_silu(acc) : acc;
        }
    }
    return 0;
}

/* Mamba-2 SSD, one token per request: x [B, H, P], dt [B, H], A [H], Bm / Cm [B, G, N], D [H] or NULL,
 * state [H, P, N] per slot; y [B, H, P] (all contiguous). */
LMX_API int lmx_ssd_decode(int64_t B, int64_t H, int64_t P, int64_t G, int64_t N, const float *x, const float *dt,
                           const float *A, const float *Bm, const float *Cm, const float *D, float *state,
                           const int64_t *slots, int64_t slot_stride, float *y) {
    const int64_t per = H / G;
#pragma omp parallel for schedule(static) if (B * H * P * N > (1 << 16))
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H, g = h / per;
        float *s = state + slots[b] * slot_stride + h * P * N;
        const float d = dt[b * H + h];
        const float da = expf(d * A[h]);
        const float *bn = Bm + (b * G + g) * N;
        const float *cn = Cm + (b * G + g) * N;
        const float *xp = x + (b * H + h) * P;
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

/* Gated delta rule, one token per request: q, k [B, H, K], v [B, H, V], g, beta [B, H], state [H, K, V] per
 * slot; o [B, H, V] (all contiguous).  S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. */
LMX_API int lmx_gdr_decode(int64_t B, int64_t H, int64_t K, int64_t V, const float *q, const float *k,
                           const float *v, const float *g, const float *beta, float *state, const int64_t *slots,
                           int64_t slot_stride, float *o) {
#pragma omp parallel for schedule(static) if (B * H * K * V > (1 << 16))
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        float *S = state + slots[b] * slot_stride + h * K * V;
        const float *qh = q + bh * K, *kh = k + bh * K, *vh = v + bh * V;
        float *oh = o + bh * V;
        const float eg = expf(g[bh]), bt = beta[bh];
        float *kv = (float *)alloca((size_t)V * sizeof(float));
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
