/* The routed experts of a mixture-of-experts layer for a few tokens (decode batches): one call, float32.
 *
 * x [T, H] (row stride xs), ids / wts [T, k] (each token's experts and their weights), gate / up [E, I, H],
 * down [E, H, I] (contiguous), optional biases gb / ub [E, I] and db [E, H] (NULL when absent).
 *
 *   out[t] = sum_j wts[t, j] * (down_e @ act(gate_e @ x[t] + gb_e, up_e @ x[t] + ub_e) + db_e),  e = ids[t, j]
 *
 * act: 0 silu (SwiGLU), 1 gelu (tanh approximation), 2 gelu (erf), 3 GPT-OSS's clamped
 * (u + 1) * g * sigmoid(alpha * g).  The (token, slot) pairs are grouped by expert here (a counting sort),
 * and each weight row of an active expert is read once for all of its pairs: the weights stream through
 * the cache once per step, as in a grouped matmul, without the host-side sorting, gathering and
 * scatter-add.  Each output element sums its token's slots in slot order (no atomics, deterministic).
 * Scratch: h [T*k, I] and y [T*k, H] floats.  Returns 1 for an expert id outside [0, E), 2 when out of
 * memory. */
#include "common.h"

LMX_INLINE float lmx_moe_act(float g, float u, int act, float alpha, float limit) {
    switch (act) {
    case 0:
        return lmx_silu(g) * u;
    case 1: {
        const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
        return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
    }
    case 2:
        return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f)) * u;
    default:
        g = g < limit ? g : limit;
        u = u < -limit ? -limit : (u > limit ? limit : u);
        return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}

LMX_API int lmx_moe_ffn(int64_t T, int64_t H, int64_t I, int64_t k, int64_t E, const float *x, int64_t xs,
                        const int64_t *ids, const float *wts, const float *gate, const float *up, const float *down,
                        const float *gb, const float *ub, const float *db, int act, float alpha, float limit,
                        float *h, float *y, float *out) {
    const int64_t P = T * k;
    for (int64_t p = 0; p < P; p++)
        if (ids[p] < 0 || ids[p] >= E) return 1;
    /* pairs grouped by expert (stable): order[start[e] .. start[e + 1]) are expert e's pairs */
    int64_t *start = (int64_t *)calloc((size_t)(E + 1), sizeof(int64_t));
    int64_t *order = (int64_t *)malloc((size_t)(P > 0 ? P : 1) * sizeof(int64_t));
    int64_t *active = (int64_t *)malloc((size_t)E * sizeof(int64_t));
    if (!start || !order || !active) {
        free(start);
        free(order);
        free(active);
        return 2;
    }
    for (int64_t p = 0; p < P; p++) start[ids[p] + 1]++;
    int64_t na = 0;
    for (int64_t e = 0; e < E; e++) {
        if (start[e + 1]) active[na++] = e;
        start[e + 1] += start[e];
    }
    {
        int64_t *fill = (int64_t *)malloc((size_t)E * sizeof(int64_t));
        if (!fill) {
            free(start);
            free(order);
            free(active);
            return 2;
        }
        memcpy(fill, start, (size_t)E * sizeof(int64_t));
        for (int64_t p = 0; p < P; p++) order[fill[ids[p]]++] = p;
        free(fill);
    }
    const int big = P * I * H > (1 << 15);
    /* gate / up: one task per (active expert, row); the row is read once for every pair of the expert */
#pragma omp parallel for schedule(static) if (big)
    for (int64_t q = 0; q < na * I; q++) {
        const int64_t e = active[q / I], i = q % I;
        const float *gr = gate + (e * I + i) * H, *ur = up + (e * I + i) * H;
        const float gbi = gb ? gb[e * I + i] : 0.0f, ubi = ub ? ub[e * I + i] : 0.0f;
        for (int64_t n = start[e]; n < start[e + 1]; n++) {
            const int64_t p = order[n];
            const float *xt = x + (p / k) * xs;
            h[p * I + i] = lmx_moe_act(lmx_dot8(gr, xt, H) + gbi, lmx_dot8(ur, xt, H) + ubi, act, alpha, limit);
        }
    }
    /* down: one task per (active expert, output row) */
#pragma omp parallel for schedule(static) if (big)
    for (int64_t q = 0; q < na * H; q++) {
        const int64_t e = active[q / H], c = q % H;
        const float *dr = down + (e * H + c) * I;
        const float dbc = db ? db[e * H + c] : 0.0f;
        for (int64_t n = start[e]; n < start[e + 1]; n++) {
            const int64_t p = order[n];
            y[p * H + c] = lmx_dot8(dr, h + p * I, I) + dbc;
        }
    }
    /* each token's slots, in slot order */
#pragma omp parallel for schedule(static) if (big)
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * H;
        for (int64_t c = 0; c < H; c++) o[c] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float w = wts[t * k + j];
            const float *yp = y + (t * k + j) * H;
            for (int64_t c = 0; c < H; c++) o[c] += w * yp[c];
        }
    }
    free(start);
    free(order);
    free(active);
    return 0;
}
