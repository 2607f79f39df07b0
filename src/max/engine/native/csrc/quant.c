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

/* The 8 six-bit scales and mins of a Q4_K / Q5_K super-block. */
static void scale_min_k4(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30));
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
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
        const uint8_t *sc = b, *qs = b + 16;
        float d = lmx_h2f(lmx_rd16(b + 80)), dmin = lmx_h2f(lmx_rd16(b + 82));
        for (int e = 0; e < 256; e++) {
            int g = e >> 7, sh = ((e >> 5) & 3) * 2, l = e & 31;
            int q = (qs[g * 32 + l] >> sh) & 3;
            int s = e >> 4;
            float dl = d * (float)(sc[s] & 0x0F), ml = dmin * (float)(sc[s] >> 4);
            y[e] = dl * (float)q - ml;
        }
        break;
    }
    case LMX_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
        float d = lmx_h2f(lmx_rd16(b + 108));
        int8_t sc[16];
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
            int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            sc[j] = (int8_t)((lo | (hi << 4)) - 32);
        }
        for (int e = 0; e < 256; e++) {
            int g = e >> 7, sh = ((e >> 5) & 3) * 2, l = e & 31;
            int ql = (qs[g * 32 + l] >> sh) & 3;
            int h = (hm[l] >> (e >> 5)) & 1;
            int q = ql - ((h ^ 1) << 2);
            y[e] = (d * (float)sc[e >> 4]) * (float)q;
        }
        break;
    }
    case LMX_Q4_K: case LMX_Q5_K: {
        float d = lmx_h2f(lmx_rd16(b)), dmin = lmx_h2f(lmx_rd16(b + 2));
        uint8_t sc[8], mn[8];
        scale_min_k4(b + 4, sc, mn);
        const uint8_t *qh = b + 16, *qs = kind == LMX_Q4_K ? b + 16 : b + 48;
        for (int e = 0; e < 256; e++) {
            int j = e >> 5, l = e & 31;
            int q = (qs[(j >> 1) * 32 + l] >> ((j & 1) * 4)) & 0x0F;
            if (kind == LMX_Q5_K) q |= ((qh[l] >> j) & 1) << 4;
            float dd = d * (float)sc[j], dm = dmin * (float)mn[j];
            y[e] = dd * (float)q - dm;
        }
        break;
    }
    case LMX_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = lmx_h2f(lmx_rd16(b + 208));
        for (int e = 0; e < 256; e++) {
            int h = e >> 7, r = e & 127, part = r >> 5, l = r & 31;
            int lo = (ql[64 * h + (part & 1) * 32 + l] >> ((part >> 1) * 4)) & 0x0F;
            int hi = (qh[32 * h + l] >> (2 * part)) & 3;
            int q = (lo | (hi << 4)) - 32;
            y[e] = (d * (float)sc[e >> 4]) * (float)q;
        }
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
