/* The routed experts of a mixture-of-experts layer for a few tokens (decode batches): one call, float32.
 *
 * x [T, H] (row stride xs), ids / wts [T, k] (each token's experts and their weights), gate / up [E, I, H],
 * down [E, H, I] (contiguous), optional biases gb / ub [E, I] and db [E, H] (NULL when absent).
 *
 *   out[t] = sum_j wts[t, j] * (down_e @ act(gate_e @ x[t] + gb_e, up_e @ x[t] + ub_e) + db_e),  e = ids[t, j]
 *
 * act: 0 silu (SwiGLU), 1 gelu (tanh approximation), 2 gelu (erf), 3 GPT-OSS's clamped
 * (u + 1) * g * sigmoid(alpha * g).  The (token, slot) pairs are grouped by expert here (a counting sort,
 * the tokens' rows copied in that order), and each active expert's rows run through the dense small-M
 * matmul rows (dense.c, lmx_dense_rows) over all of its pairs at once: each weight row is read once per
 * step, as in a grouped matmul, without the host-side sorting, gathering and scatter-add.  The threads
 * split the active experts' rows evenly.  Each output element sums its token's slots in slot order (no
 * atomics, deterministic).  Scratch: ws floats, at least T*k * (H + 3 * I + H).  Returns 1 for an expert id
 * outside [0, E), 2 when out of memory. */
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

/* Rows [u0, u1) of the active experts' stacked rows (n_rows per expert): expert a's rows r0 .. r1 of
   weight w_e (row length K) against its pairs' activation rows xin + start[e] * xs. */
static void moe_rows(const int64_t *active, const int64_t *start, int64_t n_rows, int64_t u0, int64_t u1,
                     const float *w, int64_t K, const float *xin, int64_t xs, float *yout, int64_t ys) {
    for (int64_t a = u0 / n_rows; a * n_rows < u1; a++) {
        const int64_t e = active[a];
        const int64_t r0 = u0 > a * n_rows ? u0 - a * n_rows : 0;
        const int64_t r1 = u1 < (a + 1) * n_rows ? u1 - a * n_rows : n_rows;
        if (r0 < r1)
            lmx_dense_rows(LMX_F32, (const uint8_t *)(w + e * n_rows * K), K * 4, r0, r1, xin + start[e] * xs, xs,
                           start[e + 1] - start[e], K, yout + start[e] * ys, ys);
    }
}

LMX_API int lmx_moe_ffn(int64_t T, int64_t H, int64_t I, int64_t k, int64_t E, const float *x, int64_t xs,
                        const int64_t *ids, const float *wts, const float *gate, const float *up, const float *down,
                        const float *gb, const float *ub, const float *db, int act, float alpha, float limit,
                        float *ws, float *out) {
    const int64_t P = T * k;
    for (int64_t p = 0; p < P; p++)
        if (ids[p] < 0 || ids[p] >= E) return 1;
    /* pairs grouped by expert (stable): sorted position n holds pair order[n]; pos[p] is pair p's position */
    int64_t *idx = (int64_t *)malloc((size_t)(3 * E + 1 + 2 * P) * sizeof(int64_t));
    if (!idx) return 2;
    int64_t *start = idx, *active = idx + E + 1, *fill = active + E, *order = fill + E, *pos = order + P;
    memset(start, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < P; p++) start[ids[p] + 1]++;
    int64_t na = 0;
    for (int64_t e = 0; e < E; e++) {
        if (start[e + 1]) active[na++] = e;
        start[e + 1] += start[e];
    }
    memcpy(fill, start, (size_t)E * sizeof(int64_t));
    for (int64_t p = 0; p < P; p++) {
        const int64_t n = fill[ids[p]]++;
        order[n] = p;
        pos[p] = n;
    }
    float *xe = ws, *g = xe + P * H, *u = g + P * I, *h = u + P * I, *y = h + P * I;
    int nt = lmx_num_threads();
    if (P * I * H < (1 << 15)) nt = 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nth = omp_get_num_threads();
#else
        const int t = 0, nth = 1;
#endif
#pragma omp for schedule(static)
        for (int64_t n = 0; n < P; n++) memcpy(xe + n * H, x + (order[n] / k) * xs, (size_t)H * sizeof(float));
        /* gate and up rows of the active experts, split evenly between the threads */
        int64_t u0 = na * I * t / nth, u1 = na * I * (t + 1) / nth;
        moe_rows(active, start, I, u0, u1, gate, H, xe, H, g, I);
        moe_rows(active, start, I, u0, u1, up, H, xe, H, u, I);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t n = 0; n < P; n++) {
            const int64_t e = ids[order[n]];
            const float *gn = g + n * I, *un = u + n * I;
            float *hn = h + n * I;
            for (int64_t i = 0; i < I; i++)
                hn[i] = lmx_moe_act(gn[i] + (gb ? gb[e * I + i] : 0.0f), un[i] + (ub ? ub[e * I + i] : 0.0f), act,
                                    alpha, limit);
        }
        u0 = na * H * t / nth;
        u1 = na * H * (t + 1) / nth;
        moe_rows(active, start, H, u0, u1, down, I, h, I, y, H);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t tk = 0; tk < T; tk++) { /* each token's slots, in slot order */
            float *o = out + tk * H;
            for (int64_t c = 0; c < H; c++) o[c] = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const int64_t p = tk * k + j;
                const float w = wts[p];
                const float *yp = y + pos[p] * H;
                const float *bp = db ? db + ids[p] * H : NULL;
                for (int64_t c = 0; c < H; c++) o[c] += w * (yp[c] + (bp ? bp[c] : 0.0f));
            }
        }
    }
    free(idx);
    return 0;
}
