/* GGML block formats: sizes, exact row dequantisation (the same float32
 * operations, in the same order, as gguf.quants.dequantize), and the
 * per-call quantisation of float activations to 8-bit codes that the
 * integer dot-product kernels in qmatmul.c consume. */
#include "common.h"

int lmx_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

LMX_API int64_t lmx_block_bytes(int kind) {
    switch (kind) {
    case LMX_F32: return 4;
    case LMX_F16: case LMX_BF16: return 2;
    case LMX_Q4_0: return 18;
    case LMX_Q4_1: return 20;
    case LMX_Q5_0: return 22;
    case LMX_Q5_1: return 24;
    case LMX_Q8_0: return 34;
    case LMX_Q2_K: return 84;
    case LMX_Q3_K: return 110;
    case LMX_Q4_K: return 144;
    case LMX_Q5_K: return 176;
    case LMX_Q6_K: return 210;
    default: return 0;
    }
}

LMX_API int64_t lmx_block_elems(int kind) {
    switch (kind) {
    case LMX_F32: case LMX_F16: case LMX_BF16: return 1;
    case LMX_Q4_0: case LMX_Q4_1: case LMX_Q5_0: case LMX_Q5_1: case LMX_Q8_0: return 32;
    case LMX_Q2_K: case LMX_Q3_K: case LMX_Q4_K: case LMX_Q5_K: case LMX_Q6_K: return 256;
    default: return 0;
    }
}

static void dq_block(int kind, const uint8_t *b, float *y) {
    switch (kind) {
    case LMX_Q4_0: {
        float d = lmx_h2f(lmx_rd16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(b[2 + j] & 0x0F) - 8);
            y[j + 16] = d * (float)((int)(b[2 + j] >> 4) - 8);
        }
        break;
    }
    case LMX_Q4_1: {
        float d = lmx_h2f(lmx_rd16(b)), m = lmx_h2f(lmx_rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0x0F) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case LMX_Q5_0: {
        float d = lmx_h2f(lmx_rd16(b));
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
            int hi = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case LMX_Q5_1: {
        float d = lmx_h2f(lmx_rd16(b)), m = lmx_h2f(lmx_rd16(b + 2));
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
            int hi = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
        break;
    }
    case LMX_Q8_0: {
        float d = lmx_h2f(lmx_rd16(b));
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case LMX_Q2_K: {
        const uint8_t *sc = b;
        float d = lmx_h2f(lmx_rd16(b + 80)), dmin = lmx_h2f(lmx_rd16(b + 82));
        uint8_t u[256];
        lmx_kquant_codes(kind, b, u);
        for (int e = 0; e < 256; e++) {
            int s = e >> 4;
            float dl = d * (float)(sc[s] & 0x0F), ml = dmin * (float)(sc[s] >> 4);
            y[e] = dl * (float)u[e] - ml;
        }
        break;
    }
    case LMX_Q3_K: {
        float d = lmx_h2f(lmx_rd16(b + 108));
        int8_t sc[16];
        uint8_t u[256];
        lmx_q3k_scales(b + 96, sc);
        lmx_kquant_codes(kind, b, u);
        for (int e = 0; e < 256; e++) y[e] = (d * (float)sc[e >> 4]) * (float)((int)u[e] - 4);
        break;
    }
    case LMX_Q4_K: case LMX_Q5_K: {
        float d = lmx_h2f(lmx_rd16(b)), dmin = lmx_h2f(lmx_rd16(b + 2));
        uint8_t sc[8], mn[8], u[256];
        lmx_k4_scale_min(b + 4, sc, mn);
        lmx_kquant_codes(kind, b, u);
        for (int e = 0; e < 256; e++) {
            int j = e >> 5;
            float dd = d * (float)sc[j], dm = dmin * (float)mn[j];
            y[e] = dd * (float)u[e] - dm;
        }
        break;
    }
    case LMX_Q6_K: {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = lmx_h2f(lmx_rd16(b + 208));
        uint8_t u[256];
        lmx_kquant_codes(kind, b, u);
        for (int e = 0; e < 256; e++) y[e] = (d * (float)sc[e >> 4]) * (float)((int)u[e] - 32);
        break;
    }
    }
}

/* Dequantise ``n`` values (a whole number of blocks) of ``kind`` starting at ``src``. */
LMX_API int lmx_dequant_row(int kind, const uint8_t *src, float *dst, int64_t n) {
    int64_t be = lmx_block_elems(kind), bb = lmx_block_bytes(kind);
    if (be == 0 || n % be) return -1;
    if (kind == LMX_F32) { memcpy(dst, src, (size_t)n * 4); return 0; }
    if (kind == LMX_F16) { for (int64_t i = 0; i < n; i++) dst[i] = lmx_h2f(lmx_rd16(src + 2 * i)); return 0; }
    if (kind == LMX_BF16) { for (int64_t i = 0; i < n; i++) dst[i] = lmx_bf2f(lmx_rd16(src + 2 * i)); return 0; }
    for (int64_t i = 0; i < n / be; i++) dq_block(kind, src + i * bb, dst + i * be);
    return 0;
}

/* Gather rows ``ids`` of a [rows, row_bytes] table of ``kind`` into float32 ``out`` [n, K]. */
LMX_API int lmx_gather_rows(int kind, const uint8_t *table, int64_t rows, int64_t row_bytes, int64_t K,
                            const int64_t *ids, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows) return (int)(i + 1);
#pragma omp parallel for schedule(static) if (n * K > (1 << 16))
    for (int64_t i = 0; i < n; i++) lmx_dequant_row(kind, table + ids[i] * row_bytes, out + i * K, K);
    return 0;
}

/* ------------------------------------------------------------------ quantisation (GGML reference rounding)
 * The same float32 operations as ggml's reference quantizers (and gguf.quants.quantize), so the
 * blocks are bit-identical to theirs: Q8_0 rounds half away from zero; Q4_x/Q5_x truncate after
 * adding a half. */

static void put_h(uint8_t *p, float v) {
    const uint16_t h = lmx_f2h(v);
    memcpy(p, &h, 2);
}

static void q_block(int kind, const float *x, uint8_t *b) {
    switch (kind) {
    case LMX_Q8_0: {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_h(b, d);
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        break;
    }
    case LMX_Q4_0: case LMX_Q5_0: {
        const int five = kind == LMX_Q5_0;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
        const float d = mx / (five ? -16.0f : -8.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
        const float add = five ? 16.5f : 8.5f;
        const int top = five ? 31 : 15;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            float t = truncf(x[j] * id + add);
            int v = (int)t;
            q[j] = (uint8_t)(v < 0 ? 0 : v > top ? top : v);
        }
        put_h(b, d);
        uint8_t *qs = b + (five ? 6 : 2);
        for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        if (five) {
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
            memcpy(b + 2, &qh, 4);
        }
        break;
    }
    case LMX_Q4_1: case LMX_Q5_1: {
        const int five = kind == LMX_Q5_1;
        float mn = x[0], mx = x[0];
        for (int j = 1; j < 32; j++) { mn = x[j] < mn ? x[j] : mn; mx = x[j] > mx ? x[j] : mx; }
        const float d = (mx - mn) / (five ? 31.0f : 15.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
        const int top = five ? 31 : 15;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            float t = truncf((x[j] - mn) * id + 0.5f);
            int v = (int)t;
            q[j] = (uint8_t)(v < 0 ? 0 : v > top ? top : v);
        }
        put_h(b, d);
        put_h(b + 2, mn);
        uint8_t *qs = b + (five ? 8 : 4);
        for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        if (five) {
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
            memcpy(b + 4, &qh, 4);
        }
        break;
    }
    }
}

/* Quantise float32 x [N, K] (row stride xs) into GGML blocks of kind (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
 * dst [N, K / 32 * block_bytes].  Returns 0, -1 for another kind, -2 if K is not a multiple of 32. */
LMX_API int lmx_quantize(int kind, const float *x, int64_t N, int64_t K, int64_t xs, uint8_t *dst) {
    if (kind != LMX_Q8_0 && kind != LMX_Q4_0 && kind != LMX_Q4_1 && kind != LMX_Q5_0 && kind != LMX_Q5_1) return -1;
    if (K % 32) return -2;
    const int64_t bb = lmx_block_bytes(kind), nb = K / 32;
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
    for (int64_t r = 0; r < N; r++)
        for (int64_t b = 0; b < nb; b++) q_block(kind, x + r * xs + b * 32, dst + (r * nb + b) * bb);
    return 0;
}

/* The SIMD paths compiled into this library, for reports and tests (0 = portable C only). */
LMX_API const char *lmx_simd(void) {
#if defined(LMX_AVX512VNNI)
    return "avx512vnni";
#elif defined(LMX_AVX512)
    return "avx512";
#elif defined(LMX_AVXVNNI)
    return "avx2+avxvnni";
#elif defined(LMX_AVX2)
    return "avx2";
#elif defined(LMX_NEONDOT)
    return "neon+dotprod";
#elif defined(LMX_NEON)
    return "neon";
#else
    return "generic";
#endif
}
