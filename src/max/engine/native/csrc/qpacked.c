/* GGML block-quantised weights repacked once at load into a 16-row
 * interleaved layout, and the matmul over it.
 *
 * Layout: rows are taken 16 at a time (a "group"; N is padded with zero rows
 * to a multiple of 16).  Within a group, for every 32 values of K, the codes
 * of the 16 rows are stored so that one 64-byte vector holds 4 consecutive
 * codes of each row in its 16 32-bit lanes: one VNNI vpdpbusd then advances
 * 16 dot products by 4 values each, against 4 activation codes broadcast to
 * every lane.  Scales and offsets of the 16 rows are stored as contiguous
 * vectors.  Nothing is rounded: the layout holds exactly the information of
 * the GGML blocks (the same bytes, re-ordered; K-quant 6-bit scales are
 * widened to bytes).  Per group and 32 values of K ("block"):
 *
 *   nibble vector j (j = 0..3): lane r, byte i: low nibble  = code(r, 8j + i)
 *                                               high nibble = code(r, 8j + 4 + i)
 *   Q5 high-bit vector:  lane r, byte i, bit g = bit 4 of code(r, 4g + i)
 *   Q6 2-bit plane p (p = 0, 1): lane r, byte i, bits 2h..2h+1 = bits 4..5 of code(r, 4(4p + h) + i)
 *   Q8: 8 vectors of 64 code bytes (code + 128, unsigned), vector g: lane r byte i = code(r, 4g + i)
 *
 * Q4_0  [4 nib][d]                  Q4_1 [4 nib][d][m]        (d, m: 16 x fp16)
 * Q5_0  [4 nib][hb][d]              Q5_1 [4 nib][hb][d][m]
 * Q8_0  [8 x 64 codes][d]
 * Q4_K per 256: [d][dmin][sc: 8 x 16 u8][mn: 8 x 16 u8] then 8 x [4 nib]
 * Q5_K per 256: [d][dmin][sc][mn] then 8 x [4 nib][hb]
 * Q6_K per 256: [d][sc: 16 x 16 i8] then 8 x [4 nib][2 planes]
 * Codes are unsigned; the value is  scale * code + offset  with
 *   Q4_0: d, -8d    Q4_1: d, m    Q5_0: d, -16d    Q5_1: d, m    Q8_0: d, -128d
 *   Q4_K/Q5_K: d*sc, -dmin*mn per 32    Q6_K: d*sc, -32*d*sc per 16
 *
 * LMX_PACK_LAYOUT names this layout in the packed-weight cache's keys (native/pack_cache.py): change it
 * whenever what lmx_pack writes changes (tests/engine/test_pack_cache.py pins the bytes of one weight per kind).
 */
#include "common.h"

#define GR 16 /* rows per group */
#define LMX_PACK_LAYOUT "g16-1"

/* The name of the layout lmx_pack writes (a variant with another layout would name its own). */
LMX_API const char *lmx_pack_layout(void) { return LMX_PACK_LAYOUT; }

static int packable(int kind) {
    switch (kind) {
    case LMX_Q4_0: case LMX_Q4_1: case LMX_Q5_0: case LMX_Q5_1: case LMX_Q8_0:
    case LMX_Q4_K: case LMX_Q5_K: case LMX_Q6_K: return 1;
    default: return 0;
    }
}

/* Bytes of one group's data per 32 values (32-blocks) or per 256 values (K-quants). */
static int64_t unit_bytes(int kind) {
    switch (kind) {
    case LMX_Q4_0: return 256 + 32;
    case LMX_Q4_1: return 256 + 64;
    case LMX_Q5_0: return 256 + 64 + 32;
    case LMX_Q5_1: return 256 + 64 + 64;
    case LMX_Q8_0: return 512 + 32;
    case LMX_Q4_K: return 64 + 256 + 8 * 256;
    case LMX_Q5_K: return 64 + 256 + 8 * 320;
    case LMX_Q6_K: return 32 + 256 + 8 * 384;
    default: return 0;
    }
}

static int64_t unit_elems(int kind) { return kind == LMX_Q4_K || kind == LMX_Q5_K || kind == LMX_Q6_K ? 256 : 32; }

LMX_API int64_t lmx_packed_bytes(int kind, int64_t N, int64_t K) {
    if (!packable(kind) || K % unit_elems(kind)) return -1;
    return (N + GR - 1) / GR * (K / unit_elems(kind)) * unit_bytes(kind);
}

/* ---------------------------------------------------------------- packing */

/* Decode one GGML block into unsigned codes and per-16 float scale/offset (qmatmul.c's decoder
 * reads the same formats; here we only need codes plus the raw scale fields). */
static void put_nibbles(uint8_t *nib, int r, const uint8_t *code /* 32 codes */) {
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++)
            nib[64 * j + 4 * r + i] = (uint8_t)((code[8 * j + i] & 0x0F) | ((code[8 * j + 4 + i] & 0x0F) << 4));
}

static void put_highbits(uint8_t *hb, int r, const uint8_t *code) {
    for (int i = 0; i < 4; i++) {
        uint8_t v = 0;
        for (int g = 0; g < 8; g++) v |= (uint8_t)(((code[4 * g + i] >> 4) & 1) << g);
        hb[4 * r + i] = v;
    }
}

static void put_planes(uint8_t *pl, int r, const uint8_t *code) {
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 4; i++) {
            uint8_t v = 0;
            for (int h = 0; h < 4; h++) v |= (uint8_t)(((code[4 * (4 * p + h) + i] >> 4) & 3) << (2 * h));
            pl[64 * p + 4 * r + i] = v;
        }
}

static void pack_group(int kind, const uint8_t *src, int64_t rows, int64_t src_rb, int64_t K, uint8_t *dst) {
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const int64_t bb = lmx_block_bytes(kind);
    memset(dst, 0, (size_t)(nu * ub));
    uint8_t code[256];
    for (int64_t u = 0; u < nu; u++) {
        uint8_t *o = dst + u * ub;
        for (int r = 0; r < rows; r++) {
            const uint8_t *b = src + r * src_rb + u * bb;
            switch (kind) {
            case LMX_Q4_0: case LMX_Q4_1: {
                const uint8_t *qs = b + (kind == LMX_Q4_1 ? 4 : 2);
                for (int j = 0; j < 16; j++) { code[j] = qs[j] & 0x0F; code[j + 16] = qs[j] >> 4; }
                put_nibbles(o, r, code);
                memcpy(o + 256 + 2 * r, b, 2);
                if (kind == LMX_Q4_1) memcpy(o + 288 + 2 * r, b + 2, 2);
                break;
            }
            case LMX_Q5_0: case LMX_Q5_1: {
                const int one = kind == LMX_Q5_1;
                uint32_t qh;
                memcpy(&qh, b + 2 + 2 * one, 4);
                const uint8_t *qs = b + 6 + 2 * one;
                for (int j = 0; j < 16; j++) {
                    code[j] = (uint8_t)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
                    code[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
                }
                put_nibbles(o, r, code);
                put_highbits(o + 256, r, code);
                memcpy(o + 320 + 2 * r, b, 2);
                if (one) memcpy(o + 352 + 2 * r, b + 2, 2);
                break;
            }
            case LMX_Q8_0:
                for (int g = 0; g < 8; g++)
                    for (int i = 0; i < 4; i++) o[64 * g + 4 * r + i] = (uint8_t)(b[2 + 4 * g + i] ^ 0x80);
                memcpy(o + 512 + 2 * r, b, 2);
                break;
            case LMX_Q4_K: case LMX_Q5_K: {
                const int five = kind == LMX_Q5_K;
                memcpy(o + 2 * r, b, 2);
                memcpy(o + 32 + 2 * r, b + 2, 2);
                uint8_t sc[8], mn[8], u[256];
                lmx_k4_scale_min(b + 4, sc, mn);
                for (int j = 0; j < 8; j++) { o[64 + 16 * j + r] = sc[j]; o[64 + 128 + 16 * j + r] = mn[j]; }
                lmx_kquant_codes(kind, b, u);
                const int64_t sub = five ? 320 : 256;
                for (int s = 0; s < 8; s++) {
                    uint8_t *so = o + 320 + s * sub;
                    put_nibbles(so, r, u + 32 * s);
                    if (five) put_highbits(so + 256, r, u + 32 * s);
                }
                break;
            }
            case LMX_Q6_K: {
                uint8_t u[256];
                memcpy(o + 2 * r, b + 208, 2);
                for (int j = 0; j < 16; j++) o[32 + 16 * j + r] = b[192 + j];
                lmx_kquant_codes(kind, b, u);
                for (int s = 0; s < 8; s++) {
                    uint8_t *so = o + 288 + s * 384;
                    put_nibbles(so, r, u + 32 * s);
                    put_planes(so + 256, r, u + 32 * s);
                }
                break;
            }
            }
        }
    }
}

/* Repack src [N, src_row_bytes] (GGML blocks of kind) into dst (lmx_packed_bytes(kind, N, K) bytes). */
LMX_API int lmx_pack(int kind, const uint8_t *src, int64_t N, int64_t K, int64_t src_row_bytes, uint8_t *dst) {
    if (!packable(kind) || K % unit_elems(kind)) return -1;
    if (src_row_bytes < K / lmx_block_elems(kind) * lmx_block_bytes(kind)) return -2;
    const int64_t groups = (N + GR - 1) / GR, gbytes = K / unit_elems(kind) * unit_bytes(kind);
#pragma omp parallel for schedule(static) if (groups > 4)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t rows = N - g * GR < GR ? N - g * GR : GR;
        pack_group(kind, src + g * GR * src_row_bytes, rows, src_row_bytes, K, dst + g * gbytes);
    }
    return 0;
}

/* A 64-bit checksum of n bytes, the packed-weight cache's integrity check against damaged or truncated files
 * (not a cryptographic hash: the cache's keys are the source file's sha256).  Each 1 MiB chunk is summed in
 * 8 lanes of 64-bit words, Fletcher style (s1 += w; s2 += s1: a changed word changes s1, a moved one s2;
 * plain additions, so it runs at memory speed), in parallel; the chunks' sums are mixed in order, so the
 * value does not depend on the thread count. */
static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static uint64_t chunk_checksum(const uint8_t *p, int64_t n, uint64_t seed) {
    uint64_t s1[8] = {0}, s2[8] = {0};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int l = 0; l < 8; l++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * l, 8);
            s1[l] += w;
            s2[l] += s1[l];
        }
    uint64_t h = mix64(seed ^ ((uint64_t)n << 1));
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
    for (int l = 0; l < 8; l++) h = mix64(h ^ s1[l]) ^ mix64(h + s2[l] + (uint64_t)l);
    return h;
}

#define CK_CHUNK ((int64_t)1 << 20)

LMX_API uint64_t lmx_checksum(const uint8_t *p, int64_t n) {
    if (n <= 0) return mix64(0);
    const int64_t nc = (n + CK_CHUNK - 1) / CK_CHUNK;
    uint64_t *cs = (uint64_t *)malloc((size_t)nc * 8);
    uint64_t h = mix64((uint64_t)n ^ 0x5bd1e995ULL);
    if (!cs) { /* no memory for the chunk sums: the same value, one chunk at a time */
        for (int64_t c = 0; c < nc; c++) {
            const int64_t off = c * CK_CHUNK, len = n - off < CK_CHUNK ? n - off : CK_CHUNK;
            h = mix64(h ^ chunk_checksum(p + off, len, (uint64_t)c));
        }
        return h;
    }
#pragma omp parallel for schedule(static) if (nc > 4)
    for (int64_t c = 0; c < nc; c++) {
        const int64_t off = c * CK_CHUNK, len = n - off < CK_CHUNK ? n - off : CK_CHUNK;
        cs[c] = chunk_checksum(p + off, len, (uint64_t)c);
    }
    for (int64_t c = 0; c < nc; c++) h = mix64(h ^ cs[c]);
    free(cs);
    return h;
}

/* ---------------------------------------------------------------- unpacking (for tests and gathers) */

/* Row r of a packed tensor back to float32 (exactly the GGML dequantisation). */
LMX_API int lmx_packed_row(int kind, const uint8_t *packed, int64_t N, int64_t K, int64_t row, float *out) {
    if (!packable(kind) || row < 0 || row >= N) return -1;
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const uint8_t *g = packed + row / GR * nu * ub;
    const int r = (int)(row % GR);
    for (int64_t u = 0; u < nu; u++) {
        const uint8_t *o = g + u * ub;
        float *y = out + u * ue;
        if (ue == 32) {
            const float d = lmx_h2f(lmx_rd16(o + (kind == LMX_Q8_0 ? 512 : kind <= LMX_Q4_1 ? 256 : 320) + 2 * r));
            const int has_m = kind == LMX_Q4_1 || kind == LMX_Q5_1;
            const float m = has_m ? lmx_h2f(lmx_rd16(o + (kind == LMX_Q4_1 ? 288 : 352) + 2 * r)) : 0.0f;
            for (int k = 0; k < 32; k++) {
                const int j = k / 8, i = k % 4, hi = (k % 8) >= 4;
                int q;
                if (kind == LMX_Q8_0) q = (int)o[64 * (k / 4) + 4 * r + i] - 128;
                else {
                    q = (o[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                    if (kind == LMX_Q5_0 || kind == LMX_Q5_1) q |= ((o[256 + 4 * r + i] >> (k / 4)) & 1) << 4;
                }
                /* the same float32 operations as gguf's dequantisation */
                switch (kind) {
                case LMX_Q4_0: y[k] = d * (float)(q - 8); break;
                case LMX_Q5_0: y[k] = d * (float)(q - 16); break;
                case LMX_Q8_0: y[k] = (float)q * d; break;
                default: y[k] = d * (float)q + m; break;
                }
            }
        } else if (kind == LMX_Q6_K) {
            const float d = lmx_h2f(lmx_rd16(o + 2 * r));
            for (int k = 0; k < 256; k++) {
                const uint8_t *so = o + 288 + (k / 32) * 384;
                const int kk = k % 32, j = kk / 8, i = kk % 4, hi = (kk % 8) >= 4, g = kk / 4;
                int q = (so[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                q |= ((so[256 + 64 * (g / 4) + 4 * r + i] >> (2 * (g % 4))) & 3) << 4;
                const int8_t sc = (int8_t)o[32 + 16 * (k / 16) + r];
                y[k] = (d * (float)sc) * (float)(q - 32);
            }
        } else {
            const int five = kind == LMX_Q5_K;
            const float d = lmx_h2f(lmx_rd16(o + 2 * r)), dmin = lmx_h2f(lmx_rd16(o + 32 + 2 * r));
            for (int k = 0; k < 256; k++) {
                const int s = k / 32, kk = k % 32, j = kk / 8, i = kk % 4, hi = (kk % 8) >= 4;
                const uint8_t *so = o + 320 + s * (five ? 320 : 256);
                int q = (so[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                if (five) q |= ((so[256 + 4 * r + i] >> (kk / 4)) & 1) << 4;
                const float dd = d * (float)o[64 + 16 * s + r], dm = dmin * (float)o[192 + 16 * s + r];
                y[k] = dd * (float)q - dm;
            }
        }
    }
    return 0;
}

/* Rows [r0, r1) of a packed weight as float32 into out [r1 - r0, K] (threads over rows): the torch
 * fallback dequantises a block of rows at a time into a reused buffer and runs its GEMM on it. */
LMX_API int lmx_packed_rows_f32(int kind, const uint8_t *packed, int64_t N, int64_t K, int64_t r0, int64_t r1,
                                float *out) {
    if (!packable(kind) || r0 < 0 || r1 > N || r0 > r1 || K % unit_elems(kind)) return -1;
    const int nt = (r1 - r0) * K > (1 << 16) ? lmx_num_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = r0; r < r1; r++) lmx_packed_row(kind, packed, N, K, r, out + (r - r0) * K);
    return 0;
}

/* ---------------------------------------------------------------- matmul */

/* Activations: codes xq (row stride KP), per-32 scales dxb and sums sxb, per-16 sums sx16; rf: the refined codes
 * of each row's selected blocks (lmx_refine_t, common.h; rf.rows = NULL: none).  Every kernel below sums a
 * selected block's residual codes against the weight codes it unpacked for the block, into a second accumulator
 * per row (racc), added to the row's result at the end: the same float operations whatever the tile, so a row's
 * result does not depend on the rows beside it. */
typedef struct {
    const int8_t *xq;
    const float *dxb, *sxb, *sx16;
    const int32_t *ixp; /* per 32 values: the int16 pair of the two halves' integer code sums */
    int64_t KP, BP;
    lmx_refine_t rf;
} pact_t;

/* Bit i set: tile row i (activation row m0 + i, i < mb <= 32) refines block b. */
LMX_INLINE uint32_t refine_rows(const pact_t *a, int64_t m0, int mb, int64_t b) {
    if (!a->rf.rows) return 0;
    const uint64_t *w = a->rf.rows + b * a->rf.rw + (m0 >> 6);
    const int sh = (int)(m0 & 63);
    uint64_t v = w[0] >> sh;
    if (sh && sh + mb > 64) v |= w[1] << (64 - sh);
    return (uint32_t)v & (mb >= 32 ? 0xFFFFFFFFu : (1u << mb) - 1u);
}

/* The refined codes of activation rows m0.. (as xq, dxb, sxb, sx16 of those rows); refining: any row refines. */
#define REFINE_ROWS(m0)                                                                                           \
    const int refining = a->rf.rows != NULL;                                                                      \
    const int8_t *rq = refining ? a->rf.rq + (m0) * a->KP : NULL;                                                 \
    const float *rdxb = refining ? a->rf.rdxb + (m0) * a->BP : NULL;                                              \
    const float *rsxb = refining ? a->rf.rsxb + (m0) * a->BP : NULL;                                              \
    const float *rsx16 = refining ? a->rf.rsx16 + (m0) * 2 * a->BP : NULL;                                        \
    const int32_t *rixp = refining ? a->rf.rixp + (m0) * a->BP : NULL;                                           \
    (void)rq, (void)rdxb, (void)rsxb, (void)rsx16, (void)rixp
#define FOR_REFINED(i, m0, mb, b) for (uint32_t bits_ = refine_rows(a, m0, mb, b), i; bits_ && ((i = (uint32_t)__builtin_ctz(bits_)), 1); bits_ &= bits_ - 1)

/* Portable path: one group of 16 rows against activation row m. */
static void group_scalar(int kind, const uint8_t *g, int64_t K, const pact_t *a, int64_t m, float *y16) {
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const int8_t *xq = a->xq + m * a->KP;
    const float *dxb = a->dxb + m * a->BP, *sxb = a->sxb + m * a->BP, *sx16 = a->sx16 + m * 2 * a->BP;
    REFINE_ROWS(m);
    float acc[GR] = {0}, racc[GR] = {0};
    for (int64_t u = 0; u < nu; u++) {
        const uint8_t *o = g + u * ub;
        for (int r = 0; r < GR; r++) {
            if (ue == 32) {
                const int64_t b = u;
                const int ref = refining && (refine_rows(a, m, 1, b) & 1);
                int32_t isum = 0, rsum = 0;
                for (int k = 0; k < 32; k++) {
                    const int j = k / 8, i = k % 4, hi = (k % 8) >= 4;
                    int q;
                    if (kind == LMX_Q8_0) q = o[64 * (k / 4) + 4 * r + i];
                    else {
                        q = (o[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                        if (kind == LMX_Q5_0 || kind == LMX_Q5_1) q |= ((o[256 + 4 * r + i] >> (k / 4)) & 1) << 4;
                    }
                    isum += q * xq[b * 32 + k];
                    if (ref) rsum += q * rq[b * 32 + k];
                }
                const float d = lmx_h2f(lmx_rd16(o + (kind == LMX_Q8_0 ? 512 : kind <= LMX_Q4_1 ? 256 : 320) + 2 * r));
                float off;
                switch (kind) {
                case LMX_Q4_0: off = -8.0f * d; break;
                case LMX_Q5_0: off = -16.0f * d; break;
                case LMX_Q8_0: off = -128.0f * d; break;
                default: off = lmx_h2f(lmx_rd16(o + (kind == LMX_Q4_1 ? 288 : 352) + 2 * r)); break;
                }
                acc[r] += d * dxb[b] * (float)isum + off * sxb[b];
                if (ref) racc[r] += d * rdxb[b] * (float)rsum + off * rsxb[b];
            } else if (kind == LMX_Q6_K) {
                const float d = lmx_h2f(lmx_rd16(o + 2 * r));
                for (int sb = 0; sb < 16; sb++) {
                    const int ref = refining && (refine_rows(a, m, 1, u * 8 + sb / 2) & 1);
                    int32_t isum = 0, rsum = 0;
                    for (int kk16 = 0; kk16 < 16; kk16++) {
                        const int k = sb * 16 + kk16;
                        const uint8_t *so = o + 288 + (k / 32) * 384;
                        const int kk = k % 32, j = kk / 8, i = kk % 4, hi = (kk % 8) >= 4, gq = kk / 4;
                        int q = (so[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                        q |= ((so[256 + 64 * (gq / 4) + 4 * r + i] >> (2 * (gq % 4))) & 3) << 4;
                        isum += q * xq[u * 256 + k];
                        if (ref) rsum += q * rq[u * 256 + k];
                    }
                    const float s = d * (float)(int8_t)o[32 + 16 * sb + r];
                    acc[r] += s * dxb[u * 8 + sb / 2] * (float)isum - 32.0f * s * sx16[u * 16 + sb];
                    if (ref) racc[r] += s * rdxb[u * 8 + sb / 2] * (float)rsum - 32.0f * s * rsx16[u * 16 + sb];
                }
            } else {
                const int five = kind == LMX_Q5_K;
                const float d = lmx_h2f(lmx_rd16(o + 2 * r)), dmin = lmx_h2f(lmx_rd16(o + 32 + 2 * r));
                for (int s = 0; s < 8; s++) {
                    const uint8_t *so = o + 320 + s * (five ? 320 : 256);
                    const int ref = refining && (refine_rows(a, m, 1, u * 8 + s) & 1);
                    int32_t isum = 0, rsum = 0;
                    for (int kk = 0; kk < 32; kk++) {
                        const int j = kk / 8, i = kk % 4, hi = (kk % 8) >= 4;
                        int q = (so[64 * j + 4 * r + i] >> (4 * hi)) & 0x0F;
                        if (five) q |= ((so[256 + 4 * r + i] >> (kk / 4)) & 1) << 4;
                        isum += q * xq[u * 256 + s * 32 + kk];
                        if (ref) rsum += q * rq[u * 256 + s * 32 + kk];
                    }
                    const float dd = d * (float)o[64 + 16 * s + r], dm = dmin * (float)o[192 + 16 * s + r];
                    acc[r] += dd * dxb[u * 8 + s] * (float)isum - dm * sxb[u * 8 + s];
                    if (ref) racc[r] += dd * rdxb[u * 8 + s] * (float)rsum - dm * rsxb[u * 8 + s];
                }
            }
        }
    }
    if (refining)
        for (int r = 0; r < GR; r++) acc[r] += racc[r];
    memcpy(y16, acc, sizeof acc);
}

#ifdef LMX_AVX512VNNI
#define PMB 8
#ifndef LMX_PF_DIST
#define LMX_PF_DIST 2048
#endif

LMX_INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The 8 code vectors of one 32-value block (k-groups 0..7) of a nibble-coded kind (+ Q5 high bits). */
LMX_INLINE void unpack_nib(const uint8_t *o, const uint8_t *hb, const uint8_t *pl, __m512i c[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(o + 64 * j));
        c[2 * j] = _mm512_and_si512(v, m4);
        c[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (hb) { /* bit g of each byte -> bit 4 of k-group g's codes */
        const __m512i h = _mm512_loadu_si512((const void *)hb);
        c[0] = _mm512_or_si512(c[0], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x01)), 4));
        c[1] = _mm512_or_si512(c[1], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x02)), 3));
        c[2] = _mm512_or_si512(c[2], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x04)), 2));
        c[3] = _mm512_or_si512(c[3], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x08)), 1));
        c[4] = _mm512_or_si512(c[4], _mm512_and_si512(h, _mm512_set1_epi8(0x10)));
        c[5] = _mm512_or_si512(c[5], _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x20)), 1));
        c[6] = _mm512_or_si512(c[6], _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(0x40)), 2));
        c[7] = _mm512_or_si512(c[7], _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8((char)0x80)), 3));
    }
    if (pl) { /* 2-bit fields (bits 2h..2h+1 of plane p) -> bits 4..5 of k-group 4p + h */
        const __m512i p0 = _mm512_loadu_si512((const void *)pl), p1 = _mm512_loadu_si512((const void *)(pl + 64));
        const __m512i m0 = _mm512_set1_epi8(0x03), m1 = _mm512_set1_epi8(0x0C), m2 = _mm512_set1_epi8(0x30),
                      m3 = _mm512_set1_epi8((char)0xC0);
        c[0] = _mm512_or_si512(c[0], _mm512_slli_epi16(_mm512_and_si512(p0, m0), 4));
        c[1] = _mm512_or_si512(c[1], _mm512_slli_epi16(_mm512_and_si512(p0, m1), 2));
        c[2] = _mm512_or_si512(c[2], _mm512_and_si512(p0, m2));
        c[3] = _mm512_or_si512(c[3], _mm512_srli_epi16(_mm512_and_si512(p0, m3), 2));
        c[4] = _mm512_or_si512(c[4], _mm512_slli_epi16(_mm512_and_si512(p1, m0), 4));
        c[5] = _mm512_or_si512(c[5], _mm512_slli_epi16(_mm512_and_si512(p1, m1), 2));
        c[6] = _mm512_or_si512(c[6], _mm512_and_si512(p1, m2));
        c[7] = _mm512_or_si512(c[7], _mm512_srli_epi16(_mm512_and_si512(p1, m3), 2));
    }
}

/* The sums over values 0..15 (a0) and 16..31 (a1) of one block's codes c against the activation codes at x (Q6_K
 * scales each half on its own). */
LMX_INLINE void dot8_halves(const __m512i c[8], const int8_t *x, __m512i *a0, __m512i *a1) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[0], bcast4(x));
    __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[4], bcast4(x + 16));
    s = _mm512_dpbusd_epi32(s, c[1], bcast4(x + 4));
    t = _mm512_dpbusd_epi32(t, c[5], bcast4(x + 20));
    s = _mm512_dpbusd_epi32(s, c[2], bcast4(x + 8));
    t = _mm512_dpbusd_epi32(t, c[6], bcast4(x + 24));
    *a0 = _mm512_dpbusd_epi32(s, c[3], bcast4(x + 12));
    *a1 = _mm512_dpbusd_epi32(t, c[7], bcast4(x + 28));
}

/* Q6_K: acc plus a block's sums a0, a1 at scales s0, s1 (times the activation scale dx) and offsets -32 s x16. */
LMX_INLINE __m512 acc6(__m512 acc, __m512i a0, __m512i a1, __m512 s0, __m512 s1, __m512 dx, const float *x16) {
    /* value = s * (code - 32): offset -32 s times the sum of the 16 values */
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(s0, dx), acc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(s1, dx), acc);
    acc = _mm512_fmadd_ps(s0, _mm512_set1_ps(-32.0f * x16[0]), acc);
    return _mm512_fmadd_ps(s1, _mm512_set1_ps(-32.0f * x16[1]), acc);
}

/* The sums over all 32 values (exact integers: the same as any other order). */
LMX_INLINE __m512i dot8(const __m512i c[8], const int8_t *x) {
    __m512i a0, a1;
    dot8_halves(c, x, &a0, &a1);
    return _mm512_add_epi32(a0, a1);
}

/* One group of 16 rows against activation rows m0 .. m0 + mb - 1; results to y[m * ys + 0..15]. */
LMX_INLINE void group_avx512(int kind, const uint8_t *g, int64_t K, const pact_t *a, int64_t m0, const int mb,
                             float *y, int64_t ys) {
    __m512 acc[PMB];
    for (int i = 0; i < mb; i++) acc[i] = _mm512_setzero_ps();
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sxb = a->sxb + m0 * a->BP, *sx16 = a->sx16 + m0 * 2 * a->BP;
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[PMB * GR] __attribute__((aligned(64)));
    if (refining) memset(racc, 0, sizeof racc);
    __m512i c[8];
    if (ue == 32) {
        const int five = kind == LMX_Q5_0 || kind == LMX_Q5_1;
        const int64_t doff = kind == LMX_Q8_0 ? 512 : five ? 320 : 256;
        const int has_m = kind == LMX_Q4_1 || kind == LMX_Q5_1;
        const float cneg = kind == LMX_Q4_0 ? -8.0f : kind == LMX_Q5_0 ? -16.0f : -128.0f;
        for (int64_t b = 0; b < nu; b++) {
            const uint8_t *o = g + b * ub;
#if LMX_PF_DIST > 0
            for (int64_t l = 0; l < ub; l += 64) _mm_prefetch((const char *)(o + LMX_PF_DIST + l), _MM_HINT_T0);
#endif
            if (kind == LMX_Q8_0)
                for (int q = 0; q < 8; q++) c[q] = _mm512_loadu_si512((const void *)(o + 64 * q));
            else
                unpack_nib(o, five ? o + 256 : NULL, NULL, c);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + doff)));
            const __m512 off = has_m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + doff + 32)))
                                     : _mm512_mul_ps(d, _mm512_set1_ps(cneg));
            for (int i = 0; i < mb; i++) {
                const __m512i is = dot8(c, xq + i * KP + b * 32);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d, _mm512_set1_ps(dxb[i * BP + b])), acc[i]);
                acc[i] = _mm512_fmadd_ps(off, _mm512_set1_ps(sxb[i * BP + b]), acc[i]);
            }
            FOR_REFINED(i, m0, mb, b) {
                const __m512i rs = dot8(c, rq + i * KP + b * 32);
                __m512 r = _mm512_load_ps(racc + i * GR);
                r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(rs), _mm512_mul_ps(d, _mm512_set1_ps(rdxb[i * BP + b])), r);
                _mm512_store_ps(racc + i * GR, _mm512_fmadd_ps(off, _mm512_set1_ps(rsxb[i * BP + b]), r));
            }
        }
    } else if (kind == LMX_Q6_K) {
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 288 + s * 384;
                unpack_nib(so, NULL, so + 256, c);
                const __m512 s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(o + 32 + 16 * (2 * s))))));
                const __m512 s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(o + 32 + 16 * (2 * s + 1))))));
                for (int i = 0; i < mb; i++) {
                    __m512i a0, a1;
                    dot8_halves(c, xq + i * KP + u * 256 + s * 32, &a0, &a1);
                    acc[i] = acc6(acc[i], a0, a1, s0, s1, _mm512_set1_ps(dxb[i * BP + u * 8 + s]),
                                  sx16 + i * 2 * BP + u * 16 + 2 * s);
                }
                FOR_REFINED(i, m0, mb, u * 8 + s) {
                    __m512i a0, a1;
                    dot8_halves(c, rq + i * KP + u * 256 + s * 32, &a0, &a1);
                    _mm512_store_ps(racc + i * GR, acc6(_mm512_load_ps(racc + i * GR), a0, a1, s0, s1,
                                                        _mm512_set1_ps(rdxb[i * BP + u * 8 + s]),
                                                        rsx16 + i * 2 * BP + u * 16 + 2 * s));
                }
            }
        }
    } else { /* Q4_K, Q5_K */
        const int five = kind == LMX_Q5_K;
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32)));
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 320 + s * (five ? 320 : 256);
                unpack_nib(so, five ? so + 256 : NULL, NULL, c);
                const __m512 dd = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(o + 64 + 16 * s)))));
                const __m512 dm = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(o + 192 + 16 * s)))));
                for (int i = 0; i < mb; i++) {
                    const __m512i is = dot8(c, xq + i * KP + u * 256 + s * 32);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                             _mm512_mul_ps(dd, _mm512_set1_ps(dxb[i * BP + u * 8 + s])), acc[i]);
                    acc[i] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(sxb[i * BP + u * 8 + s]), acc[i]);
                }
                FOR_REFINED(i, m0, mb, u * 8 + s) {
                    const __m512i rs = dot8(c, rq + i * KP + u * 256 + s * 32);
                    __m512 r = _mm512_load_ps(racc + i * GR);
                    r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(rs), _mm512_mul_ps(dd, _mm512_set1_ps(rdxb[i * BP + u * 8 + s])), r);
                    _mm512_store_ps(racc + i * GR, _mm512_fnmadd_ps(dm, _mm512_set1_ps(rsxb[i * BP + u * 8 + s]), r));
                }
            }
        }
    }
    if (refining)
        for (int i = 0; i < mb; i++) acc[i] = _mm512_add_ps(acc[i], _mm512_load_ps(racc + i * GR));
    for (int i = 0; i < mb; i++) _mm512_storeu_ps(y + i * ys, acc[i]);
}

#elif defined(LMX_AVX2)
/* AVX2 (+ AVX-VNNI): a 64-byte vector of the layout is two 32-byte halves, rows 0-7 and 8-15; each
 * half is run over every activation row before the next, so 8 code vectors stay in registers. */
#define PMB 4
#ifndef LMX_PF2_DIST
#define LMX_PF2_DIST 4096
#endif
/* Software prefetch of the n bytes at p + LMX_PF2_DIST (one per 64-byte line). */
LMX_INLINE void pf_ahead(const uint8_t *p, int64_t n) {
#if LMX_PF2_DIST > 0
    for (int64_t l = 0; l < n; l += 64) _mm_prefetch((const char *)(p + LMX_PF2_DIST + l), _MM_HINT_T0);
#else
    (void)p, (void)n;
#endif
}

LMX_INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Q6_K: the 8 code vectors (k-groups 0..7) of one half of a 32-value block: nibbles (+ Q5 high bits at hb,
 * + Q6 2-bit planes at pl), each pointer already offset to the half. */
LMX_INLINE void unpack_nib(const uint8_t *o, const uint8_t *hb, const uint8_t *pl, __m256i c[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(o + 64 * j));
        c[2 * j] = _mm256_and_si256(v, m4);
        c[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if (hb) { /* bit g of each byte -> bit 4 of k-group g's codes */
        const __m256i h = _mm256_loadu_si256((const __m256i *)hb);
        c[0] = _mm256_or_si256(c[0], _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x01)), 4));
        c[1] = _mm256_or_si256(c[1], _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x02)), 3));
        c[2] = _mm256_or_si256(c[2], _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x04)), 2));
        c[3] = _mm256_or_si256(c[3], _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x08)), 1));
        c[4] = _mm256_or_si256(c[4], _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
        c[5] = _mm256_or_si256(c[5], _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x20)), 1));
        c[6] = _mm256_or_si256(c[6], _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x40)), 2));
        c[7] = _mm256_or_si256(c[7], _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8((char)0x80)), 3));
    }
    if (pl) { /* 2-bit fields (bits 2h..2h+1 of plane p) -> bits 4..5 of k-group 4p + h */
        const __m256i p0 = _mm256_loadu_si256((const __m256i *)pl), p1 = _mm256_loadu_si256((const __m256i *)(pl + 64));
        const __m256i m0 = _mm256_set1_epi8(0x03), m1 = _mm256_set1_epi8(0x0C), m2 = _mm256_set1_epi8(0x30),
                      m3 = _mm256_set1_epi8((char)0xC0);
        c[0] = _mm256_or_si256(c[0], _mm256_slli_epi16(_mm256_and_si256(p0, m0), 4));
        c[1] = _mm256_or_si256(c[1], _mm256_slli_epi16(_mm256_and_si256(p0, m1), 2));
        c[2] = _mm256_or_si256(c[2], _mm256_and_si256(p0, m2));
        c[3] = _mm256_or_si256(c[3], _mm256_srli_epi16(_mm256_and_si256(p0, m3), 2));
        c[4] = _mm256_or_si256(c[4], _mm256_slli_epi16(_mm256_and_si256(p1, m0), 4));
        c[5] = _mm256_or_si256(c[5], _mm256_slli_epi16(_mm256_and_si256(p1, m1), 2));
        c[6] = _mm256_or_si256(c[6], _mm256_and_si256(p1, m2));
        c[7] = _mm256_or_si256(c[7], _mm256_srli_epi16(_mm256_and_si256(p1, m3), 2));
    }
}

/* Per lane (row): sum over k-groups c[0..n-1] of 4 unsigned codes times 4 activation codes at x.
 * Without VNNI, vpmaddubsw pairs are summed in 16 bits over `run` k-groups before widening: the
 * callers pick run so that no sum can overflow (codes < 16: 8, < 32: 4, < 64: 2). */
LMX_INLINE __m256i udot(const __m256i *c, const int8_t *x, const int n, const int run) {
#ifdef LMX_AVXVNNI
    (void)run;
    __m256i s = _mm256_setzero_si256(), t = _mm256_setzero_si256();
    for (int i = 0; i + 1 < n; i += 2) {
        s = _mm256_dpbusd_avx_epi32(s, c[i], bcast4(x + 4 * i));
        t = _mm256_dpbusd_avx_epi32(t, c[i + 1], bcast4(x + 4 * i + 4));
    }
    return _mm256_add_epi32(s, t);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int i0 = 0; i0 < n; i0 += run) {
        __m256i p = _mm256_maddubs_epi16(c[i0], bcast4(x + 4 * i0));
        for (int i = i0 + 1; i < i0 + run; i++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[i], bcast4(x + 4 * i)));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
    }
    return s;
#endif
}

LMX_INLINE __m256 cvt8_u8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
LMX_INLINE __m256 cvt8_i8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
LMX_INLINE __m256 cvt8_h(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* k-group j's code vector of half h (rows 8h..8h+7) of one 32-value block: nibbles at o (+ Q5 high bits
 * hb) or, for Q8 (q8), the code bytes themselves.  j and h are constants once
 * inlined into the unrolled loops, so each shift is an immediate. */
LMX_INLINE __m256i code_at(const uint8_t *o, const uint8_t *hb, const int q8, const int j, const int h) {
    if (q8) return _mm256_loadu_si256((const __m256i *)(o + 64 * j + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(o + 64 * (j >> 1) + 32 * h));
    __m256i c = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    if (hb) { /* bit j of each byte -> bit 4 */
        const __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(hb + 32 * h)),
                                           _mm256_set1_epi8((char)(1 << j)));
        c = _mm256_or_si256(c, j < 4 ? _mm256_slli_epi16(b, 4 - j) : j > 4 ? _mm256_srli_epi16(b, j - 4) : b);
    }
    return c;
}

/* Exact integer sums of one 32-value block of the 16-row group against activation rows 0..mb-1 (codes at
 * x + i * KP): per row i and half h, lane r = sum over the k-groups of code * activation code.  The
 * k-group loop is outermost, so each code vector is unpacked once and each activation broadcast serves
 * both halves (1.2-1.5x the half-major order of Q6_K below at M = 8-128).  Without VNNI, vpmaddubsw pairs are
 * summed in 16 bits over `run` k-groups before widening: at most 4 (codes < 32; < 64: 2), also for 4-bit codes,
 * which could run 8 without overflow, but the longer chain of dependent 16-bit adds was 7-12 % slower at
 * M = 1 and M = 2-128 (2-core Zen 3, AVX2; the sums are the same exact integers either way); Q8 (codes + 128 up
 * to 255) goes through the signed codes instead, so its sums are sum(signed code * x) (the caller drops the -128
 * offset).  extra (a constant 0 or 1): one more row, mb, whose codes are at x2 (a decoded row's refined codes,
 * summed in the same pass over the unpacked codes instead of unpacking them again). */
LMX_INLINE void block_sums(const uint8_t *o, const uint8_t *hb, const int q8, const int run,
                           const int8_t *x, int64_t KP, const int mb, __m256i sa[PMB][2], const int8_t *x2,
                           const int extra) {
#ifndef LMX_AVXVNNI
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p[PMB][2];
#endif
    for (int i = 0; i < mb + extra; i++)
        for (int h = 0; h < 2; h++) sa[i][h] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i c0 = code_at(o, hb, q8, j, 0), c1 = code_at(o, hb, q8, j, 1);
        for (int i = 0; i < mb + extra; i++) {
            const __m256i bx = bcast4((i < mb ? x + i * KP : x2) + 4 * j);
#ifdef LMX_AVXVNNI
            (void)run;
            sa[i][0] = _mm256_dpbusd_avx_epi32(sa[i][0], c0, bx);
            sa[i][1] = _mm256_dpbusd_avx_epi32(sa[i][1], c1, bx);
#else
            __m256i q0, q1;
            if (q8) {
                const __m256i flip = _mm256_set1_epi8((char)0x80);
                const __m256i s0 = _mm256_xor_si256(c0, flip), s1 = _mm256_xor_si256(c1, flip);
                q0 = _mm256_maddubs_epi16(_mm256_sign_epi8(s0, s0), _mm256_sign_epi8(bx, s0));
                q1 = _mm256_maddubs_epi16(_mm256_sign_epi8(s1, s1), _mm256_sign_epi8(bx, s1));
            } else {
                q0 = _mm256_maddubs_epi16(c0, bx);
                q1 = _mm256_maddubs_epi16(c1, bx);
            }
            const int r = q8 ? 1 : run;
            if (j % r == 0) {
                p[i][0] = q0;
                p[i][1] = q1;
            } else {
                p[i][0] = _mm256_add_epi16(p[i][0], q0);
                p[i][1] = _mm256_add_epi16(p[i][1], q1);
            }
            if ((j + 1) % r == 0) {
                const __m256i w0 = _mm256_madd_epi16(p[i][0], ones), w1 = _mm256_madd_epi16(p[i][1], ones);
                sa[i][0] = j + 1 == r ? w0 : _mm256_add_epi32(sa[i][0], w0);
                sa[i][1] = j + 1 == r ? w1 : _mm256_add_epi32(sa[i][1], w1);
            }
#endif
        }
    }
}

/* block_sums of rows 0..mb-1, plus the refined codes x1 of a single decoded row when x1 is not NULL (in sa[mb]):
 * one call site per kind instead of one per kind and case (extra must be a constant inside block_sums). */
LMX_INLINE void block_sums_r(const uint8_t *o, const uint8_t *hb, const int q8, const int run, const int8_t *x,
                             int64_t KP, const int mb, __m256i sa[PMB][2], const int8_t *x1) {
    if (x1)
        block_sums(o, hb, q8, run, x, KP, mb, sa, x1, 1);
    else
        block_sums(o, hb, q8, run, x, KP, mb, sa, NULL, 0);
}

#ifndef LMX_AVXVNNI
/* Q6_K without VNNI: a block's sums are scaled in integers.  Per half h (rows 8h..8h+7) of a 32-value block, lane r
 * gets
 *     T = sc0 * sum_{values 0..15} (code - 32) * xq  +  sc1 * sum_{values 16..31} (code - 32) * xq
 * exactly: the scales multiply the 16-bit pair sums in vpmaddwd (in place of ones), and the -32 offsets come from
 * the activation codes' integer sums (act ixp) in one more vpmaddwd.  |T| <= 2 * 128 * 16 * 32 * 127 < 2^24, so its
 * conversion to float is exact too; then acc += T * (d * dx): one conversion and one fma per block and half (the
 * float epilogue had two of each, two more fmas for the offsets, and the float scales d * sc to compute).  The
 * one-row / register-tile path (group_avx2) and the weight-stationary one (ws_group6) share q6_acc, so a row's
 * result is the same bits in both. */

/* The scale vectors of block s of a super-block (sc = o + 32 + 32 s: the 16 rows' sc0 bytes, then their sc1 bytes):
 * per half h, lane r holds the int16 pair (sc0, sc0) in SC0[h], (sc1, sc1) in SC1[h], (sc0, sc1) in SCX[h]. */
LMX_INLINE void q6_scales(const uint8_t *sc, __m256i SC0[2], __m256i SC1[2], __m256i SCX[2]) {
    const __m128i a = _mm_loadu_si128((const __m128i *)sc), b = _mm_loadu_si128((const __m128i *)(sc + 16));
    const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                          0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i odd = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                         2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
    SCX[0] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
    SCX[1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
    for (int h = 0; h < 2; h++) {
        SC0[h] = _mm256_shuffle_epi8(SCX[h], even);
        SC1[h] = _mm256_shuffle_epi8(SCX[h], odd);
    }
}

/* The codes of k-group 2 jp + odd, half h, of a Q6_K block: nibbles at o (vector jp), bits 4-5 from 2-bit plane
 * jp / 2 at pl (field (2 jp + odd) % 4).  jp, odd and h are constants once inlined. */
LMX_INLINE __m256i code6_at(const uint8_t *o, const uint8_t *pl, const int jp, const int odd, const int h) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(o + 64 * jp + 32 * h));
    const __m256i p = _mm256_loadu_si256((const __m256i *)(pl + 64 * (jp >> 1) + 32 * h));
    const int f = (2 * jp + odd) & 3;
    const __m256i n = odd ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    const __m256i t = f == 0 ? _mm256_slli_epi16(p, 4) : f == 1 ? _mm256_slli_epi16(p, 2) : f == 2 ? p
                                                                                           : _mm256_srli_epi16(p, 2);
    return _mm256_or_si256(n, _mm256_and_si256(t, m30));
}

/* The scaled sums of two k-groups (codes ce, co against activation broadcasts b0, b1) of one half, as int32 lanes:
 * sc * (the 16-bit sum of both vpmaddubsw pairs), sc the int16 pair (sc, sc) of their sub-block (codes < 64, so
 * the 16-bit sum of two k-groups cannot overflow). */
LMX_INLINE __m256i q6_pair(__m256i ce, __m256i co, __m256i b0, __m256i b1, __m256i sc) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ce, b0), _mm256_maddubs_epi16(co, b1)), sc);
}

/* A[i][h] = sc0 * sum(code * xq over values 0..15) + sc1 * sum(... 16..31) of one Q6_K block (so: its 384 bytes) for
 * activation rows i < mb (codes at x + i * KP) and, with extra (a constant 0 or 1), row mb whose codes are at x2 (a
 * decoded row's refined codes, in the same pass over the unpacked codes).  k-group-major: each code vector is
 * unpacked once and each activation broadcast serves both halves. */
LMX_INLINE void q6_sums(const uint8_t *so, const int8_t *x, int64_t KP, const int mb, const __m256i SC0[2],
                        const __m256i SC1[2], __m256i A[PMB][2], const int8_t *x2, const int extra) {
    for (int i = 0; i < mb + extra; i++) A[i][0] = A[i][1] = _mm256_setzero_si256();
    for (int jp = 0; jp < 4; jp++) {
        const __m256i c00 = code6_at(so, so + 256, jp, 0, 0), c01 = code6_at(so, so + 256, jp, 0, 1);
        const __m256i c10 = code6_at(so, so + 256, jp, 1, 0), c11 = code6_at(so, so + 256, jp, 1, 1);
        const __m256i s0 = jp >> 1 ? SC1[0] : SC0[0], s1 = jp >> 1 ? SC1[1] : SC0[1];
        for (int i = 0; i < mb + extra; i++) {
            const int8_t *xi = (i < mb ? x + i * KP : x2) + 8 * jp;
            const __m256i b0 = bcast4(xi), b1 = bcast4(xi + 4);
            A[i][0] = _mm256_add_epi32(A[i][0], q6_pair(c00, c10, b0, b1, s0));
            A[i][1] = _mm256_add_epi32(A[i][1], q6_pair(c01, c11, b0, b1, s1));
        }
    }
}

/* acc + T * (d * dx) for one half: T = A - 32 * (sc0 * ix0 + sc1 * ix1) (ixp: the row's int16 pair ix0, ix1). */
LMX_INLINE __m256 q6_acc(__m256 acc, __m256i A, __m256i SCX, int32_t ixp, __m256 d, float dx) {
    const __m256i off = _mm256_madd_epi16(SCX, _mm256_set1_epi32(ixp));
    const __m256i T = _mm256_sub_epi32(A, _mm256_slli_epi32(off, 5));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(T), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc);
}
#endif

/* Weight-stationary order for batch decode (from the M that ws_wins gives): the code vectors of one 32-value
 * block of the group (both halves) are unpacked once into an L1 buffer and serve every activation row of
 * the tile, whose accumulators live in memory (acc [mb][16]); each code vector is a memory operand of vpmaddubsw /
 * vpdpbusd, so nothing spills and the unpacking is amortised over all mb rows instead of PMB.  The float
 * operations per (block, row, half) are those of group_avx2, in the same order: the results are the same
 * bits. */
#define WS_MT 16 /* activation rows per tile */

typedef struct {
    __m256i c[8][2]; /* codes per k-group and half */
} wsbuf_t;

/* Unpack one 32-value block (nibbles at o, + Q5 high bits hb) into w. */
LMX_INLINE void ws_unpack(const uint8_t *o, const uint8_t *hb, wsbuf_t *w) {
    for (int j = 0; j < 8; j++)
        for (int h = 0; h < 2; h++) _mm256_store_si256(&w->c[j][h], code_at(o, hb, 0, j, h));
}

/* Exact sums of one unpacked block against the 32 activation codes at x: lane r of s[h] = row 8h + r. The
 * 16-bit runs are those of block_sums. */
LMX_INLINE void ws_sums(const wsbuf_t *w, const int run, const int8_t *x, __m256i s[2]) {
#ifdef LMX_AVXVNNI
    (void)run;
    __m256i e0 = _mm256_setzero_si256(), e1 = _mm256_setzero_si256();
    __m256i o0 = _mm256_setzero_si256(), o1 = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
        const __m256i b0 = bcast4(x + 4 * j), b1 = bcast4(x + 4 * j + 4);
        e0 = _mm256_dpbusd_avx_epi32(e0, _mm256_load_si256(&w->c[j][0]), b0);
        e1 = _mm256_dpbusd_avx_epi32(e1, _mm256_load_si256(&w->c[j][1]), b0);
        o0 = _mm256_dpbusd_avx_epi32(o0, _mm256_load_si256(&w->c[j + 1][0]), b1);
        o1 = _mm256_dpbusd_avx_epi32(o1, _mm256_load_si256(&w->c[j + 1][1]), b1);
    }
    s[0] = _mm256_add_epi32(e0, o0);
    s[1] = _mm256_add_epi32(e1, o1);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
    s[0] = s[1] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i bx = bcast4(x + 4 * j);
        const __m256i q0 = _mm256_maddubs_epi16(_mm256_load_si256(&w->c[j][0]), bx);
        const __m256i q1 = _mm256_maddubs_epi16(_mm256_load_si256(&w->c[j][1]), bx);
        if (j % run == 0) {
            p0 = q0;
            p1 = q1;
        } else {
            p0 = _mm256_add_epi16(p0, q0);
            p1 = _mm256_add_epi16(p1, q1);
        }
        if ((j + 1) % run == 0) {
            s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(p0, ones));
            s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(p1, ones));
        }
    }
#endif
}

/* One activation row (codes x, scale dx, sum sx) against an unpacked block with row scales d0/d1 (rows 0-7 / 8-15)
 * and offsets o0/o1, into ar[0..15]: ar += sums * d * dx, then + o * sx (32-value kinds) or - o * sx (neg: the
 * K-quants' -dmin * mn). */
LMX_INLINE void ws_row(const wsbuf_t *w, const int run, const int8_t *x, float dx, float sx, __m256 d0, __m256 d1,
                       __m256 o0, __m256 o1, const int neg, float *ar) {
    __m256i t[2];
    ws_sums(w, run, x, t);
    const __m256 vdx = _mm256_set1_ps(dx), vsx = _mm256_set1_ps(sx);
    __m256 a0 = _mm256_loadu_ps(ar), a1 = _mm256_loadu_ps(ar + 8);
    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[0]), _mm256_mul_ps(d0, vdx), a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[1]), _mm256_mul_ps(d1, vdx), a1);
    a0 = neg ? _mm256_fnmadd_ps(o0, vsx, a0) : _mm256_fmadd_ps(o0, vsx, a0);
    a1 = neg ? _mm256_fnmadd_ps(o1, vsx, a1) : _mm256_fmadd_ps(o1, vsx, a1);
    _mm256_storeu_ps(ar, a0);
    _mm256_storeu_ps(ar + 8, a1);
}

/* acc[0 .. mb*16-1] += racc[...]: the tile rows' refined sums added to their results. */
LMX_INLINE void ws_add(float *acc, const float *racc, int mb) {
    for (int i = 0; i < mb * GR; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_load_ps(racc + i)));
}

/* acc[i][0..15] = rows of the tile m0 .. m0 + mb - 1 against the group (Q4_0/1, Q5_0/1); five is a
 * constant at each call site, so the inner loops have no branches. */
LMX_INLINE void ws_group32(int kind, const int five, const uint8_t *g, int64_t K, const pact_t *a,
                           int64_t m0, int mb, float *acc) {
    wsbuf_t w __attribute__((aligned(32)));
    const int64_t ub = unit_bytes(kind), nu = K / 32;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sxb = a->sxb + m0 * a->BP;
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[WS_MT * GR] __attribute__((aligned(32)));
    if (refining) memset(racc, 0, sizeof racc);
    const int64_t doff = five ? 320 : 256;
    const int has_m = kind == LMX_Q4_1 || kind == LMX_Q5_1;
    const float cneg = kind == LMX_Q4_0 ? -8.0f : -16.0f;
    const int run = 4; /* 16-bit runs of 4 k-groups (block_sums' note) */
    for (int i = 0; i < mb * GR; i++) acc[i] = 0.0f;
    for (int64_t b = 0; b < nu; b++) {
        const uint8_t *o = g + b * ub;
        if (b + 1 < nu) _mm_prefetch((const char *)(o + ub), _MM_HINT_T0);
        ws_unpack(o, five ? o + 256 : NULL, &w);
        const __m256 d0 = cvt8_h(o + doff), d1 = cvt8_h(o + doff + 16);
        const __m256 f0 = has_m ? cvt8_h(o + doff + 32) : _mm256_mul_ps(d0, _mm256_set1_ps(cneg));
        const __m256 f1 = has_m ? cvt8_h(o + doff + 48) : _mm256_mul_ps(d1, _mm256_set1_ps(cneg));
        for (int i = 0; i < mb; i++)
            ws_row(&w, run, xq + i * KP + b * 32, dxb[i * BP + b], sxb[i * BP + b], d0, d1, f0, f1, 0, acc + i * GR);
        FOR_REFINED(i, m0, mb, b)
            ws_row(&w, run, rq + i * KP + b * 32, rdxb[i * BP + b], rsxb[i * BP + b], d0, d1, f0, f1, 0, racc + i * GR);
    }
    if (refining) ws_add(acc, racc, mb);
}

/* The same for Q4_K / Q5_K (per 32 values: scale d*sc, offset -dmin*mn, as in group_avx2). */
LMX_INLINE void ws_groupk(const int five, const uint8_t *g, int64_t K, const pact_t *a, int64_t m0, int mb,
                          float *acc) {
    wsbuf_t w __attribute__((aligned(32)));
    const int64_t ub = unit_bytes(five ? LMX_Q5_K : LMX_Q4_K), nu = K / 256, sub = five ? 320 : 256;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sxb = a->sxb + m0 * a->BP;
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[WS_MT * GR] __attribute__((aligned(32)));
    if (refining) memset(racc, 0, sizeof racc);
    for (int i = 0; i < mb * GR; i++) acc[i] = 0.0f;
    for (int64_t u = 0; u < nu; u++) {
        const uint8_t *o = g + u * ub;
        for (int s = 0; s < 8; s++) {
            const uint8_t *so = o + 320 + s * sub;
            _mm_prefetch((const char *)(so + sub), _MM_HINT_T0);
            ws_unpack(so, five ? so + 256 : NULL, &w);
            const __m256 dd0 = _mm256_mul_ps(cvt8_h(o), cvt8_u8(o + 64 + 16 * s));
            const __m256 dd1 = _mm256_mul_ps(cvt8_h(o + 16), cvt8_u8(o + 64 + 16 * s + 8));
            const __m256 dm0 = _mm256_mul_ps(cvt8_h(o + 32), cvt8_u8(o + 192 + 16 * s));
            const __m256 dm1 = _mm256_mul_ps(cvt8_h(o + 48), cvt8_u8(o + 192 + 16 * s + 8));
            const int64_t e = u * 256 + s * 32, bl = u * 8 + s; /* the block's first value and index */
            for (int i = 0; i < mb; i++)
                ws_row(&w, 4, xq + i * KP + e, dxb[i * BP + bl], sxb[i * BP + bl], dd0, dd1, dm0, dm1, 1,
                       acc + i * GR);
            FOR_REFINED(i, m0, mb, bl)
                ws_row(&w, 4, rq + i * KP + e, rdxb[i * BP + bl], rsxb[i * BP + bl], dd0, dd1, dm0, dm1, 1,
                       racc + i * GR);
        }
    }
    if (refining) ws_add(acc, racc, mb);
}

#ifdef LMX_AVXVNNI
/* Exact sums of both halves h (rows 8h..8h+7) of one unpacked Q6_K block against the 32 activation codes at x:
 * t0[h] over values 0..15, t1[h] over 16..31.  Each activation broadcast serves both halves. */
LMX_INLINE void ws6_sums(const wsbuf_t *w, const int8_t *x, __m256i t0[2], __m256i t1[2]) {
    for (int h = 0; h < 2; h++) t0[h] = t1[h] = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i b0 = bcast4(x + 4 * j), b1 = bcast4(x + 4 * j + 16);
        for (int h = 0; h < 2; h++) {
            t0[h] = _mm256_dpbusd_avx_epi32(t0[h], _mm256_load_si256(&w->c[j][h]), b0);
            t1[h] = _mm256_dpbusd_avx_epi32(t1[h], _mm256_load_si256(&w->c[j + 4][h]), b1);
        }
    }
}

/* Adds the Q6_K sums t0, t1 of half h at scales s0, s1 (times the activation scale dx) and offsets -32 s x16
 * to the 8 floats at ar. */
LMX_INLINE void ws6_acc(float *ar, __m256i t0, __m256i t1, __m256 s0, __m256 s1, __m256 dx, __m256 n0, __m256 n1) {
    __m256 v = _mm256_load_ps(ar);
    v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t0), _mm256_mul_ps(s0, dx), v);
    v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t1), _mm256_mul_ps(s1, dx), v);
    v = _mm256_fmadd_ps(s0, n0, v);
    v = _mm256_fmadd_ps(s1, n1, v);
    _mm256_store_ps(ar, v);
}

/* One activation row (codes x, scale dx, sums of 16 x16) against an unpacked Q6_K block, both halves, into ar[0..15]. */
LMX_INLINE void ws6_row(const wsbuf_t *w, const int8_t *x, float dx, const float *x16, const __m256 s0[2],
                        const __m256 s1[2], float *ar) {
    const __m256 vdx = _mm256_set1_ps(dx);
    const __m256 n0 = _mm256_set1_ps(-32.0f * x16[0]), n1 = _mm256_set1_ps(-32.0f * x16[1]);
    __m256i t0[2], t1[2];
    ws6_sums(w, x, t0, t1);
    for (int h = 0; h < 2; h++) ws6_acc(ar + 8 * h, t0[h], t1[h], s0[h], s1[h], vdx, n0, n1);
}
#else
/* One activation row (codes x, scale dx, code sums ixp) against an unpacked Q6_K block, both halves, into
 * ar[0..15]: q6_sums' integer scaling and q6_acc's epilogue (the same integers and float operations). */
LMX_INLINE void ws6_row(const wsbuf_t *w, const int8_t *x, float dx, int32_t ixp, const __m256i SC0[2],
                        const __m256i SC1[2], const __m256i SCX[2], const __m256 d[2], float *ar) {
    __m256i A[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int jp = 0; jp < 4; jp++) {
        const __m256i b0 = bcast4(x + 8 * jp), b1 = bcast4(x + 8 * jp + 4);
        for (int h = 0; h < 2; h++)
            A[h] = _mm256_add_epi32(A[h], q6_pair(_mm256_load_si256(&w->c[2 * jp][h]),
                                                  _mm256_load_si256(&w->c[2 * jp + 1][h]), b0, b1,
                                                  jp >> 1 ? SC1[h] : SC0[h]));
    }
    for (int h = 0; h < 2; h++)
        _mm256_store_ps(ar + 8 * h, q6_acc(_mm256_load_ps(ar + 8 * h), A[h], SCX[h], ixp, d[h], dx));
}
#endif

/* Q6_K: per 32 values, two 16-value halves (k-groups 0..3, 4..7) with their own scales d*sc; the value is
 * s * (code - 32).  The float operations per (row, half) are group_avx2's, in its order. */
LMX_INLINE void ws_group6(const uint8_t *g, int64_t K, const pact_t *a, int64_t m0, int mb, float *acc) {
    wsbuf_t w __attribute__((aligned(32)));
    const int64_t ub = unit_bytes(LMX_Q6_K), nu = K / 256;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sx16 = a->sx16 + m0 * 2 * a->BP;
    const int32_t *ixp = a->ixp + m0 * a->BP;
    (void)sx16, (void)ixp;
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[WS_MT * GR] __attribute__((aligned(32)));
    if (refining) memset(racc, 0, sizeof racc);
    for (int i = 0; i < mb * GR; i++) acc[i] = 0.0f;
    for (int64_t u = 0; u < nu; u++) {
        const uint8_t *o = g + u * ub;
        const __m256 d[2] = {cvt8_h(o), cvt8_h(o + 16)};
        for (int s = 0; s < 8; s++) {
            const uint8_t *so = o + 288 + s * 384;
            _mm_prefetch((const char *)(so + 384), _MM_HINT_T0);
            _mm_prefetch((const char *)(so + 448), _MM_HINT_T0);
            for (int h = 0; h < 2; h++) {
                __m256i c[8];
                unpack_nib(so + 32 * h, NULL, so + 256 + 32 * h, c);
                for (int j = 0; j < 8; j++) _mm256_store_si256(&w.c[j][h], c[j]);
            }
            const int64_t e = u * 256 + s * 32, bl = u * 8 + s; /* the block's first value and index */
#ifdef LMX_AVXVNNI
            __m256 s0[2], s1[2];
            for (int h = 0; h < 2; h++) {
                s0[h] = _mm256_mul_ps(d[h], cvt8_i8(o + 32 + 16 * (2 * s) + 8 * h));
                s1[h] = _mm256_mul_ps(d[h], cvt8_i8(o + 32 + 16 * (2 * s + 1) + 8 * h));
            }
            for (int i = 0; i < mb; i++)
                ws6_row(&w, xq + i * KP + e, dxb[i * BP + bl], sx16 + i * 2 * BP + 2 * bl, s0, s1, acc + i * GR);
            FOR_REFINED(i, m0, mb, bl)
                ws6_row(&w, rq + i * KP + e, rdxb[i * BP + bl], rsx16 + i * 2 * BP + 2 * bl, s0, s1, racc + i * GR);
#else
            __m256i SC0[2], SC1[2], SCX[2];
            q6_scales(o + 32 + 32 * s, SC0, SC1, SCX);
            for (int i = 0; i < mb; i++)
                ws6_row(&w, xq + i * KP + e, dxb[i * BP + bl], ixp[i * BP + bl], SC0, SC1, SCX, d, acc + i * GR);
            FOR_REFINED(i, m0, mb, bl)
                ws6_row(&w, rq + i * KP + e, rdxb[i * BP + bl], rixp[i * BP + bl], SC0, SC1, SCX, d, racc + i * GR);
#endif
        }
    }
    if (refining) ws_add(acc, racc, mb);
}

/* Whether the weight-stationary order beats group_avx2's register tiles for M activation rows
 * (bench/qmatmul.py --baseline, 1 thread): it wins from M = 2 wherever unpacking costs (nibbles without
 * VNNI, Q5 high bits; from M = 3 with VNNI), and for Q6_K (whose register tiles already share each
 * unpacked half) from M = 5 (6 with VNNI).  With VNNI the plain 4-bit kinds stay on the register tiles
 * (within +-5% of them at M = 8-64, the prefill of 128 tokens a little slower), and Q8_0, which has
 * nothing to unpack, does everywhere (the copy through the buffer lost 20% at M = 64). */
static int ws_wins(int kind, int64_t M) {
    switch (kind) {
#ifdef LMX_AVXVNNI
    case LMX_Q5_0: case LMX_Q5_1: case LMX_Q5_K: return M >= 3;
    case LMX_Q6_K: return M >= 6;
#else
    case LMX_Q4_0: case LMX_Q4_1: case LMX_Q4_K: case LMX_Q5_0: case LMX_Q5_1: case LMX_Q5_K: return M >= 2;
    case LMX_Q6_K: return M >= 5;
#endif
    default: return 0;
    }
}

__attribute__((noinline)) static void group_avx2_ws(int kind, const uint8_t *g, int64_t K, const pact_t *a,
                                                    int64_t m0, int mb, float *acc) {
    switch (kind) {
    case LMX_Q5_0: case LMX_Q5_1: ws_group32(kind, 1, g, K, a, m0, mb, acc); break;
    case LMX_Q4_K: ws_groupk(0, g, K, a, m0, mb, acc); break;
    case LMX_Q5_K: ws_groupk(1, g, K, a, m0, mb, acc); break;
    case LMX_Q6_K: ws_group6(g, K, a, m0, mb, acc); break;
    default: ws_group32(kind, 0, g, K, a, m0, mb, acc); break;
    }
}

/* One group of 16 rows against activation rows m0 .. m0 + mb - 1; results to y[m * ys + 0..15]. */
LMX_INLINE void group_avx2(int kind, const uint8_t *g, int64_t K, const pact_t *a, int64_t m0, const int mb,
                           float *y, int64_t ys) {
    __m256 acc[PMB][2];
    __m256i sa[PMB][2], ra[PMB][2];
    for (int i = 0; i < mb; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sxb = a->sxb + m0 * a->BP, *sx16 = a->sx16 + m0 * 2 * a->BP;
    (void)sx16; /* (Q6_K with VNNI) */
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[PMB * GR] __attribute__((aligned(32)));
    if (refining) memset(racc, 0, sizeof racc);
    if (ue == 32) {
        const int five = kind == LMX_Q5_0 || kind == LMX_Q5_1, q8 = kind == LMX_Q8_0;
        const int64_t doff = q8 ? 512 : five ? 320 : 256;
        const int has_m = kind == LMX_Q4_1 || kind == LMX_Q5_1;
        const float cneg = kind == LMX_Q4_0 ? -8.0f : kind == LMX_Q5_0 ? -16.0f : -128.0f;
#ifdef LMX_AVXVNNI
        const int q8_offset = 1; /* vpdpbusd summed the unsigned codes */
#else
        const int q8_offset = 0;
#endif
        for (int64_t b = 0; b < nu; b++) {
            const uint8_t *o = g + b * ub;
            /* a single row refining this block: its refined codes go through the same pass (sums in sa[1]); not
             * for Q8_0, whose sign-flipping sums made that copy of the loop 10 % slower even when nothing refines */
            const int8_t *x1 = !q8 && mb == 1 && refining && (refine_rows(a, m0, 1, b) & 1) ? rq + b * 32 : NULL;
            if (q8)
                block_sums(o, NULL, 1, 1, xq + b * 32, KP, mb, sa, NULL, 0);
            else if (five)
                block_sums_r(o, o + 256, 0, 4, xq + b * 32, KP, mb, sa, x1);
            else
                block_sums_r(o, NULL, 0, 4, xq + b * 32, KP, mb, sa, x1);
            for (int h = 0; h < 2; h++) {
                const __m256 d = cvt8_h(o + doff + 16 * h);
                const __m256 off = has_m ? cvt8_h(o + doff + 32 + 16 * h) : _mm256_mul_ps(d, _mm256_set1_ps(cneg));
                for (int i = 0; i < mb; i++) {
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa[i][h]),
                                                _mm256_mul_ps(d, _mm256_set1_ps(dxb[i * BP + b])), acc[i][h]);
                    if (!q8 || q8_offset) acc[i][h] = _mm256_fmadd_ps(off, _mm256_set1_ps(sxb[i * BP + b]), acc[i][h]);
                }
            }
            FOR_REFINED(i, m0, mb, b) {
                const int8_t *x = rq + i * KP + b * 32;
                if (x1) /* summed above */
                    ra[0][0] = sa[1][0], ra[0][1] = sa[1][1];
                else if (q8)
                    block_sums(o, NULL, 1, 1, x, KP, 1, ra, NULL, 0);
                else if (five)
                    block_sums(o, o + 256, 0, 4, x, KP, 1, ra, NULL, 0);
                else
                    block_sums(o, NULL, 0, 4, x, KP, 1, ra, NULL, 0);
                for (int h = 0; h < 2; h++) {
                    const __m256 d = cvt8_h(o + doff + 16 * h);
                    const __m256 off = has_m ? cvt8_h(o + doff + 32 + 16 * h) : _mm256_mul_ps(d, _mm256_set1_ps(cneg));
                    __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ra[0][h]), _mm256_mul_ps(d, _mm256_set1_ps(rdxb[i * BP + b])),
                                               _mm256_load_ps(racc + i * GR + 8 * h));
                    if (!q8 || q8_offset) r = _mm256_fmadd_ps(off, _mm256_set1_ps(rsxb[i * BP + b]), r);
                    _mm256_store_ps(racc + i * GR + 8 * h, r);
                }
            }
        }
    } else if (kind == LMX_Q6_K) {
#ifndef LMX_AVXVNNI /* integer-scaled sums (q6_sums' note) */
        const int32_t *ixp = a->ixp + m0 * a->BP;
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            const __m256 d[2] = {cvt8_h(o), cvt8_h(o + 16)};
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 288 + s * 384;
                const int64_t bl = u * 8 + s, e = u * 256 + s * 32;
                pf_ahead(so, 384);
                __m256i SC0[2], SC1[2], SCX[2];
                q6_scales(o + 32 + 32 * s, SC0, SC1, SCX);
                /* a single row refining this block: its refined codes go through the same pass (sums in sa[1]) */
                const int8_t *x1 = mb == 1 && refining && (refine_rows(a, m0, 1, bl) & 1) ? rq + e : NULL;
                if (x1)
                    q6_sums(so, xq + e, KP, mb, SC0, SC1, sa, x1, 1);
                else
                    q6_sums(so, xq + e, KP, mb, SC0, SC1, sa, NULL, 0);
                for (int i = 0; i < mb; i++)
                    for (int h = 0; h < 2; h++)
                        acc[i][h] = q6_acc(acc[i][h], sa[i][h], SCX[h], ixp[i * BP + bl], d[h], dxb[i * BP + bl]);
                FOR_REFINED(i, m0, mb, bl) {
                    if (x1) /* summed above (with mb == 1 the other branch is not compiled, as for Q4_K) */
                        ra[0][0] = sa[1][0], ra[0][1] = sa[1][1];
                    else if (mb > 1)
                        q6_sums(so, rq + i * KP + e, KP, 1, SC0, SC1, ra, NULL, 0);
                    for (int h = 0; h < 2; h++)
                        _mm256_store_ps(racc + i * GR + 8 * h,
                                        q6_acc(_mm256_load_ps(racc + i * GR + 8 * h), ra[0][h], SCX[h], rixp[i * BP + bl],
                                               d[h], rdxb[i * BP + bl]));
                }
            }
        }
#else /* k-group sums split in two 16-value halves: the half-major order keeps them in registers */
        __m256i c[8];
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            for (int h = 0; h < 2; h++) {
                const __m256 d = cvt8_h(o + 16 * h);
                for (int s = 0; s < 8; s++) {
                    const uint8_t *so = o + 288 + s * 384;
                    if (!h) pf_ahead(so, 384);
                    unpack_nib(so + 32 * h, NULL, so + 256 + 32 * h, c);
                    const __m256 s0 = _mm256_mul_ps(d, cvt8_i8(o + 32 + 16 * (2 * s) + 8 * h));
                    const __m256 s1 = _mm256_mul_ps(d, cvt8_i8(o + 32 + 16 * (2 * s + 1) + 8 * h));
                    for (int i = 0; i < mb; i++) {
                        const int8_t *x = xq + i * KP + u * 256 + s * 32;
                        const __m256i a0 = udot(c, x, 4, 2), a1 = udot(c + 4, x + 16, 4, 2);
                        const __m256 dx = _mm256_set1_ps(dxb[i * BP + u * 8 + s]);
                        const float *x16 = sx16 + i * 2 * BP + u * 16 + 2 * s;
                        /* value = s * (code - 32): offset -32 s times the sum of the 16 values */
                        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(s0, dx), acc[i][h]);
                        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(s1, dx), acc[i][h]);
                        acc[i][h] = _mm256_fmadd_ps(s0, _mm256_set1_ps(-32.0f * x16[0]), acc[i][h]);
                        acc[i][h] = _mm256_fmadd_ps(s1, _mm256_set1_ps(-32.0f * x16[1]), acc[i][h]);
                    }
                    FOR_REFINED(i, m0, mb, u * 8 + s) {
                        const int8_t *x = rq + i * KP + u * 256 + s * 32;
                        const __m256i a0 = udot(c, x, 4, 2), a1 = udot(c + 4, x + 16, 4, 2);
                        const __m256 dx = _mm256_set1_ps(rdxb[i * BP + u * 8 + s]);
                        const float *x16 = rsx16 + i * 2 * BP + u * 16 + 2 * s;
                        __m256 r = _mm256_load_ps(racc + i * GR + 8 * h);
                        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(s0, dx), r);
                        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(s1, dx), r);
                        r = _mm256_fmadd_ps(s0, _mm256_set1_ps(-32.0f * x16[0]), r);
                        _mm256_store_ps(racc + i * GR + 8 * h, _mm256_fmadd_ps(s1, _mm256_set1_ps(-32.0f * x16[1]), r));
                    }
                }
            }
        }
#endif
    } else { /* Q4_K, Q5_K */
        const int five = kind == LMX_Q5_K;
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 320 + s * (five ? 320 : 256);
                pf_ahead(so, five ? 320 : 256);
                const int8_t *x1 = mb == 1 && refining && (refine_rows(a, m0, 1, u * 8 + s) & 1) /* as above */
                                       ? rq + u * 256 + s * 32
                                       : NULL;
                if (five)
                    block_sums_r(so, so + 256, 0, 4, xq + u * 256 + s * 32, KP, mb, sa, x1);
                else
                    block_sums_r(so, NULL, 0, 4, xq + u * 256 + s * 32, KP, mb, sa, x1);
                for (int h = 0; h < 2; h++) {
                    const __m256 dd = _mm256_mul_ps(cvt8_h(o + 16 * h), cvt8_u8(o + 64 + 16 * s + 8 * h));
                    const __m256 dm = _mm256_mul_ps(cvt8_h(o + 32 + 16 * h), cvt8_u8(o + 192 + 16 * s + 8 * h));
                    for (int i = 0; i < mb; i++) {
                        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa[i][h]),
                                                    _mm256_mul_ps(dd, _mm256_set1_ps(dxb[i * BP + u * 8 + s])), acc[i][h]);
                        acc[i][h] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(sxb[i * BP + u * 8 + s]), acc[i][h]);
                    }
                }
                FOR_REFINED(i, m0, mb, u * 8 + s) {
                    if (x1) /* summed above: with mb == 1 the other branches are not compiled, so the unpacked codes
                             * are not kept (spilled to the stack) for them (1.15x at M = 1 in cache) */
                        ra[0][0] = sa[1][0], ra[0][1] = sa[1][1];
                    else if (mb > 1 && five)
                        block_sums(so, so + 256, 0, 4, rq + i * KP + u * 256 + s * 32, KP, 1, ra, NULL, 0);
                    else if (mb > 1)
                        block_sums(so, NULL, 0, 4, rq + i * KP + u * 256 + s * 32, KP, 1, ra, NULL, 0);
                    for (int h = 0; h < 2; h++) {
                        const __m256 dd = _mm256_mul_ps(cvt8_h(o + 16 * h), cvt8_u8(o + 64 + 16 * s + 8 * h));
                        const __m256 dm = _mm256_mul_ps(cvt8_h(o + 32 + 16 * h), cvt8_u8(o + 192 + 16 * s + 8 * h));
                        __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ra[0][h]),
                                                   _mm256_mul_ps(dd, _mm256_set1_ps(rdxb[i * BP + u * 8 + s])),
                                                   _mm256_load_ps(racc + i * GR + 8 * h));
                        _mm256_store_ps(racc + i * GR + 8 * h, _mm256_fnmadd_ps(dm, _mm256_set1_ps(rsxb[i * BP + u * 8 + s]), r));
                    }
                }
            }
        }
    }
    if (refining)
        for (int i = 0; i < mb; i++)
            for (int h = 0; h < 2; h++) acc[i][h] = _mm256_add_ps(acc[i][h], _mm256_load_ps(racc + i * GR + 8 * h));
    for (int i = 0; i < mb; i++) {
        _mm256_storeu_ps(y + i * ys, acc[i][0]);
        _mm256_storeu_ps(y + i * ys + 8, acc[i][1]);
    }
}
#elif defined(LMX_NEON)
/* A 64-byte vector of the layout is four q-registers, register h holding 4 codes of rows 4h..4h+3;
 * one SDOT (by element) advances those 4 rows by 4 values.  Per 32-value block and row quad, the 8
 * code registers (k-groups 0..7) are unpacked once and reused for every activation row. */
#define PMB 4

/* The 8 code registers of row quad h (bytes 16h..16h+15 of each vector) of a nibble-coded kind (+ Q5
 * high bits hb, + Q6 2-bit planes pl), as in unpack_nib. */
LMX_INLINE void unpack_nib_neon(const uint8_t *o, const uint8_t *hb, const uint8_t *pl, int h, int8x16_t c[8]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    uint8x16_t u[8];
    for (int j = 0; j < 4; j++) {
        const uint8x16_t v = vld1q_u8(o + 64 * j + 16 * h);
        u[2 * j] = vandq_u8(v, m4);
        u[2 * j + 1] = vshrq_n_u8(v, 4);
    }
    if (hb) { /* bit g of each byte -> bit 4 of k-group g's codes */
        const uint8x16_t b = vld1q_u8(hb + 16 * h), m = vdupq_n_u8(0x10);
        u[0] = vorrq_u8(u[0], vandq_u8(vshlq_n_u8(b, 4), m));
        u[1] = vorrq_u8(u[1], vandq_u8(vshlq_n_u8(b, 3), m));
        u[2] = vorrq_u8(u[2], vandq_u8(vshlq_n_u8(b, 2), m));
        u[3] = vorrq_u8(u[3], vandq_u8(vshlq_n_u8(b, 1), m));
        u[4] = vorrq_u8(u[4], vandq_u8(b, m));
        u[5] = vorrq_u8(u[5], vandq_u8(vshrq_n_u8(b, 1), m));
        u[6] = vorrq_u8(u[6], vandq_u8(vshrq_n_u8(b, 2), m));
        u[7] = vorrq_u8(u[7], vandq_u8(vshrq_n_u8(b, 3), m));
    }
    if (pl) { /* bits 2k..2k+1 of plane p -> bits 4..5 of k-group 4p + k */
        const uint8x16_t m = vdupq_n_u8(0x30);
        for (int p = 0; p < 2; p++) {
            const uint8x16_t b = vld1q_u8(pl + 64 * p + 16 * h);
            u[4 * p] = vorrq_u8(u[4 * p], vandq_u8(vshlq_n_u8(b, 4), m));
            u[4 * p + 1] = vorrq_u8(u[4 * p + 1], vandq_u8(vshlq_n_u8(b, 2), m));
            u[4 * p + 2] = vorrq_u8(u[4 * p + 2], vandq_u8(b, m));
            u[4 * p + 3] = vorrq_u8(u[4 * p + 3], vandq_u8(vshrq_n_u8(b, 2), m));
        }
    }
    for (int g = 0; g < 8; g++) c[g] = vreinterpretq_s8_u8(u[g]); /* codes <= 63: valid as signed */
}

/* Sums over 16 values (k-groups 4t..4t+3, activation codes x16) of 4 rows. */
LMX_INLINE int32x4_t dot16_neon(const int8x16_t c[4], int8x16_t x16) {
    int32x4_t s = LMX_SDOT_LANE(vdupq_n_s32(0), c[0], x16, 0);
    int32x4_t t = LMX_SDOT_LANE(vdupq_n_s32(0), c[1], x16, 1);
    s = LMX_SDOT_LANE(s, c[2], x16, 2);
    t = LMX_SDOT_LANE(t, c[3], x16, 3);
    return vaddq_s32(s, t);
}

/* One group of 16 rows against activation rows m0 .. m0 + mb - 1; results to y[m * ys + 0..15]. */
LMX_INLINE void group_neon(int kind, const uint8_t *g, int64_t K, const pact_t *a, int64_t m0, const int mb,
                           float *y, int64_t ys) {
    float32x4_t acc[PMB][4];
    for (int i = 0; i < mb; i++)
        for (int h = 0; h < 4; h++) acc[i][h] = vdupq_n_f32(0.0f);
    const int64_t ue = unit_elems(kind), ub = unit_bytes(kind), nu = K / ue;
    const int8_t *xq = a->xq + m0 * a->KP;
    const float *dxb = a->dxb + m0 * a->BP, *sxb = a->sxb + m0 * a->BP, *sx16 = a->sx16 + m0 * 2 * a->BP;
    const int64_t KP = a->KP, BP = a->BP;
    REFINE_ROWS(m0);
    float racc[PMB * GR] __attribute__((aligned(16)));
    if (refining) memset(racc, 0, sizeof racc);
    int8x16_t c[8];
    if (ue == 32) {
        const int five = kind == LMX_Q5_0 || kind == LMX_Q5_1;
        const int64_t doff = kind == LMX_Q8_0 ? 512 : five ? 320 : 256;
        const int has_m = kind == LMX_Q4_1 || kind == LMX_Q5_1;
        const float cneg = kind == LMX_Q4_0 ? -8.0f : -16.0f;
        for (int64_t b = 0; b < nu; b++) {
            const uint8_t *o = g + b * ub;
            for (int h = 0; h < 4; h++) {
                if (kind == LMX_Q8_0) /* code + 128 -> signed code; then no offset term */
                    for (int q = 0; q < 8; q++)
                        c[q] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(o + 64 * q + 16 * h), vdupq_n_u8(0x80)));
                else
                    unpack_nib_neon(o, five ? o + 256 : NULL, NULL, h, c);
                const float32x4_t d = lmx_h4(o + doff + 8 * h);
                const float32x4_t off = has_m ? lmx_h4(o + doff + 32 + 8 * h) : vmulq_n_f32(d, cneg);
                for (int i = 0; i < mb; i++) {
                    const int8_t *x = xq + i * KP + b * 32;
                    const int32x4_t is = vaddq_s32(dot16_neon(c, vld1q_s8(x)), dot16_neon(c + 4, vld1q_s8(x + 16)));
                    acc[i][h] = vfmaq_f32(acc[i][h], vcvtq_f32_s32(is), vmulq_n_f32(d, dxb[i * BP + b]));
                    if (kind != LMX_Q8_0) acc[i][h] = vfmaq_n_f32(acc[i][h], off, sxb[i * BP + b]);
                }
                FOR_REFINED(i, m0, mb, b) {
                    const int8_t *x = rq + i * KP + b * 32;
                    const int32x4_t is = vaddq_s32(dot16_neon(c, vld1q_s8(x)), dot16_neon(c + 4, vld1q_s8(x + 16)));
                    float32x4_t r = vfmaq_f32(vld1q_f32(racc + i * GR + 4 * h), vcvtq_f32_s32(is), vmulq_n_f32(d, rdxb[i * BP + b]));
                    if (kind != LMX_Q8_0) r = vfmaq_n_f32(r, off, rsxb[i * BP + b]);
                    vst1q_f32(racc + i * GR + 4 * h, r);
                }
            }
        }
    } else if (kind == LMX_Q6_K) {
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 288 + s * 384;
                for (int h = 0; h < 4; h++) {
                    unpack_nib_neon(so, NULL, so + 256, h, c);
                    const float32x4_t d = lmx_h4(o + 8 * h);
                    const float32x4_t s0 = vmulq_f32(d, lmx_i8x4(o + 32 + 16 * (2 * s) + 4 * h));
                    const float32x4_t s1 = vmulq_f32(d, lmx_i8x4(o + 32 + 16 * (2 * s + 1) + 4 * h));
                    for (int i = 0; i < mb; i++) {
                        const int8_t *x = xq + i * KP + u * 256 + s * 32;
                        const int32x4_t a0 = dot16_neon(c, vld1q_s8(x)), a1 = dot16_neon(c + 4, vld1q_s8(x + 16));
                        const float dx = dxb[i * BP + u * 8 + s];
                        const float *x16 = sx16 + i * 2 * BP + u * 16 + 2 * s;
                        /* value = s * (code - 32): offset -32 s times the sum of the 16 values */
                        float32x4_t v = vfmaq_f32(acc[i][h], vcvtq_f32_s32(a0), vmulq_n_f32(s0, dx));
                        v = vfmaq_f32(v, vcvtq_f32_s32(a1), vmulq_n_f32(s1, dx));
                        v = vfmaq_n_f32(v, s0, -32.0f * x16[0]);
                        acc[i][h] = vfmaq_n_f32(v, s1, -32.0f * x16[1]);
                    }
                    FOR_REFINED(i, m0, mb, u * 8 + s) {
                        const int8_t *x = rq + i * KP + u * 256 + s * 32;
                        const int32x4_t a0 = dot16_neon(c, vld1q_s8(x)), a1 = dot16_neon(c + 4, vld1q_s8(x + 16));
                        const float dx = rdxb[i * BP + u * 8 + s];
                        const float *x16 = rsx16 + i * 2 * BP + u * 16 + 2 * s;
                        float32x4_t v = vfmaq_f32(vld1q_f32(racc + i * GR + 4 * h), vcvtq_f32_s32(a0), vmulq_n_f32(s0, dx));
                        v = vfmaq_f32(v, vcvtq_f32_s32(a1), vmulq_n_f32(s1, dx));
                        v = vfmaq_n_f32(v, s0, -32.0f * x16[0]);
                        vst1q_f32(racc + i * GR + 4 * h, vfmaq_n_f32(v, s1, -32.0f * x16[1]));
                    }
                }
            }
        }
    } else { /* Q4_K, Q5_K */
        const int five = kind == LMX_Q5_K;
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *o = g + u * ub;
            for (int s = 0; s < 8; s++) {
                const uint8_t *so = o + 320 + s * (five ? 320 : 256);
                for (int h = 0; h < 4; h++) {
                    unpack_nib_neon(so, five ? so + 256 : NULL, NULL, h, c);
                    const float32x4_t dd = vmulq_f32(lmx_h4(o + 8 * h), lmx_u8x4(o + 64 + 16 * s + 4 * h));
                    const float32x4_t dm = vmulq_f32(lmx_h4(o + 32 + 8 * h), lmx_u8x4(o + 192 + 16 * s + 4 * h));
                    for (int i = 0; i < mb; i++) {
                        const int8_t *x = xq + i * KP + u * 256 + s * 32;
                        const int32x4_t is = vaddq_s32(dot16_neon(c, vld1q_s8(x)), dot16_neon(c + 4, vld1q_s8(x + 16)));
                        const float32x4_t v = vfmaq_f32(acc[i][h], vcvtq_f32_s32(is),
                                                        vmulq_n_f32(dd, dxb[i * BP + u * 8 + s]));
                        acc[i][h] = vfmsq_f32(v, dm, vdupq_n_f32(sxb[i * BP + u * 8 + s]));
                    }
                    FOR_REFINED(i, m0, mb, u * 8 + s) {
                        const int8_t *x = rq + i * KP + u * 256 + s * 32;
                        const int32x4_t is = vaddq_s32(dot16_neon(c, vld1q_s8(x)), dot16_neon(c + 4, vld1q_s8(x + 16)));
                        const float32x4_t v = vfmaq_f32(vld1q_f32(racc + i * GR + 4 * h), vcvtq_f32_s32(is),
                                                        vmulq_n_f32(dd, rdxb[i * BP + u * 8 + s]));
                        vst1q_f32(racc + i * GR + 4 * h, vfmsq_f32(v, dm, vdupq_n_f32(rsxb[i * BP + u * 8 + s])));
                    }
                }
            }
        }
    }
    if (refining)
        for (int i = 0; i < mb; i++)
            for (int h = 0; h < 4; h++) acc[i][h] = vaddq_f32(acc[i][h], vld1q_f32(racc + i * GR + 4 * h));
    for (int i = 0; i < mb; i++)
        for (int h = 0; h < 4; h++) vst1q_f32(y + i * ys + 4 * h, acc[i][h]);
}

#endif

/* Packed matmul of one weight: rows [g0*16, g1*16) for all M rows into y (columns of this weight). */
/* y[m * ys + 0 .. rows - 1] = v (+ r[m * rs + ...] when r is given: the fused residual add). */
LMX_INLINE void put_rows(float *y, const float *v, int64_t rows, const float *r) {
    if (!r) {
        memcpy(y, v, (size_t)rows * 4);
        return;
    }
    for (int64_t j = 0; j < rows; j++) y[j] = r[j] + v[j];
}

static void packed_rows(int kind, const uint8_t *p, int64_t N, int64_t K, int64_t g0, int64_t g1, const pact_t *a,
                        int64_t M, float *y, int64_t ys, int force_scalar, const float *res, int64_t rs) {
    const int64_t gbytes = K / unit_elems(kind) * unit_bytes(kind);
    float out16[GR * 8];
#if defined(LMX_AVX2) && !defined(LMX_AVX512VNNI)
    const int ws = !force_scalar && ws_wins(kind, M);
#endif
    for (int64_t gi = g0; gi < g1; gi++) {
        const uint8_t *g = p + gi * gbytes;
        const int64_t rows = N - gi * GR < GR ? N - gi * GR : GR;
#if defined(LMX_AVX512VNNI) || defined(LMX_AVX2) || defined(LMX_NEON)
#if defined(LMX_AVX512VNNI)
#define GROUP_SIMD group_avx512
#elif defined(LMX_AVX2)
#define GROUP_SIMD group_avx2
#else
#define GROUP_SIMD group_neon
#endif
#if defined(LMX_AVX2) && !defined(LMX_AVX512VNNI)
        if (ws) {
            float acc[WS_MT * GR] __attribute__((aligned(32)));
            for (int64_t m0 = 0; m0 < M; m0 += WS_MT) {
                const int mb = (int)(M - m0 < WS_MT ? M - m0 : WS_MT);
                group_avx2_ws(kind, g, K, a, m0, mb, acc);
                for (int i = 0; i < mb; i++)
                    put_rows(y + (m0 + i) * ys + gi * GR, acc + i * GR, rows, res ? res + (m0 + i) * rs + gi * GR : NULL);
            }
            continue;
        }
#endif
        if (!force_scalar) {
            for (int64_t m0 = 0; m0 < M; m0 += PMB) {
                const int mb = (int)(M - m0 < PMB ? M - m0 : PMB);
                switch (mb) { /* a constant mb per call: the accumulators stay in registers */
                case 1: GROUP_SIMD(kind, g, K, a, m0, 1, out16, GR); break;
                case 2: GROUP_SIMD(kind, g, K, a, m0, 2, out16, GR); break;
                case 3: GROUP_SIMD(kind, g, K, a, m0, 3, out16, GR); break;
#if PMB > 4
                case 4: GROUP_SIMD(kind, g, K, a, m0, 4, out16, GR); break;
                case 5: GROUP_SIMD(kind, g, K, a, m0, 5, out16, GR); break;
                case 6: GROUP_SIMD(kind, g, K, a, m0, 6, out16, GR); break;
                case 7: GROUP_SIMD(kind, g, K, a, m0, 7, out16, GR); break;
#endif
                default: GROUP_SIMD(kind, g, K, a, m0, PMB, out16, GR); break;
                }
                for (int i = 0; i < mb; i++)
                    put_rows(y + (m0 + i) * ys + gi * GR, out16 + i * GR, rows, res ? res + (m0 + i) * rs + gi * GR : NULL);
            }
            continue;
        }
#endif
        (void)force_scalar;
        for (int64_t m = 0; m < M; m++) {
            group_scalar(kind, g, K, a, m, out16);
            put_rows(y + m * ys + gi * GR, out16, rows, res ? res + m * rs + gi * GR : NULL);
        }
    }
}

/* Groups per work item of a packed matmul's parallel loop.  The threads take items in turn (dynamic
 * schedule) instead of one fixed share each: with the same bytes to stream, one core's share still takes
 * 10-20 % longer than the other's (measured on a 2-core AVX2 host: the slower thread's extra time summed to
 * 7 ms of a 1.5B model's 50 ms decode step), and a core taken by another process stalls a fixed split for
 * its whole share.  An item is ~LMX_CHUNK_BYTES of weights: long runs keep the hardware prefetchers on
 * one stream (96 KiB items cost 6 % of the step against a fixed split, 1 MiB ones the same time as it);
 * fewer bytes per item when M makes the work compute-bound; at least 2 items per thread.  A weight under
 * 4 items' worth is split in one share per thread, as before (small models' calls are a few microseconds). */
#ifndef LMX_CHUNK_BYTES
#define LMX_CHUNK_BYTES (1 << 20)
#endif
static int64_t packed_chunk(int64_t groups, int kind, int64_t K, int64_t M, int nt) {
    if (nt <= 1) return groups > 0 ? groups : 1;
    const int64_t gbytes = K / unit_elems(kind) * unit_bytes(kind); /* (the first weight's kind) */
    if (groups * gbytes < 4 * LMX_CHUNK_BYTES) return (groups + nt - 1) / nt; /* small: one share per thread */
    int64_t c = LMX_CHUNK_BYTES / (gbytes * (M < 8 ? 1 : M / 8));
    const int64_t most = groups / (2 * nt);
    if (c > most) c = most;
    return c > 0 ? c : 1;
}

/* Activation quantisation is shared with qmatmul.c. */
int lmx_act_prepare(int64_t M, int64_t K, const float *x, int64_t xs, const int8_t **xq, const float **dxb,
                    const float **sxb, const float **sx16, const int32_t **ixp, int64_t *KP, int64_t *BP, int nt);

LMX_API int lmx_packed_matmul_res(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw,
                                  const uint8_t *const *w, const int *kinds, const int64_t *N,
                                  const float *const *bias, float *y, int64_t y_stride, int force_scalar,
                                  const float *norm_w, float norm_eps, const float *res, int64_t res_stride);

/* y[M, sum(N)] = x[M, K] @ concat(W_i)^T (+ bias_i), each W_i packed by lmx_pack from kind kinds[i].
 * Returns 0, -1 for a kind that is not packable, -2 for a bad K, -3 without memory. */
LMX_API int lmx_packed_matmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw,
                              const uint8_t *const *w, const int *kinds, const int64_t *N, const float *const *bias,
                              float *y, int64_t y_stride, int force_scalar, const float *norm_w, float norm_eps) {
    return lmx_packed_matmul_res(M, K, x, x_stride, nw, w, kinds, N, bias, y, y_stride, force_scalar, norm_w, norm_eps,
                                 NULL, 0);
}

/* lmx_packed_matmul, then y += res (res [M, sum(N)], row stride res_stride; NULL: nothing added): the residual
 * add that follows a projection, fused.  Each output is (x @ W^T (+ bias)) + res, rounded once more, exactly
 * as the separate add.  res must not overlap y. */
LMX_API int lmx_packed_matmul_res(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw,
                                  const uint8_t *const *w, const int *kinds, const int64_t *N,
                                  const float *const *bias, float *y, int64_t y_stride, int force_scalar,
                                  const float *norm_w, float norm_eps, const float *res, int64_t res_stride) {
    if (lmx_prenorm(&x, &x_stride, M, K, norm_w, norm_eps)) return -3; /* the fused RMSNorm, if any */

    if (nw < 1 || nw > 64) return -1;
    int64_t offs[64], goffs[65], total = 0;
    goffs[0] = 0;
    for (int i = 0; i < nw; i++) {
        if (!packable(kinds[i])) return -1;
        if (K % unit_elems(kinds[i])) return -2;
        offs[i] = total;
        total += N[i];
        goffs[i + 1] = goffs[i] + (N[i] + GR - 1) / GR;
    }
    int nt = lmx_num_threads();
    if (M * total * K < (1 << 17)) nt = 1;
    pact_t a;
    if (lmx_act_prepare(M, K, x, x_stride, &a.xq, &a.dxb, &a.sxb, &a.sx16, &a.ixp, &a.KP, &a.BP, nt)) return -3;
    if (lmx_act_refine(M, K, x, x_stride, a.xq, a.dxb, a.KP, a.BP, nt, &a.rf)) return -3;
    const int64_t groups = goffs[nw];
    const int64_t chunk = packed_chunk(groups, kinds[0], K, M, nt), nchunks = (groups + chunk - 1) / chunk;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t q0 = c * chunk, q1 = q0 + chunk < groups ? q0 + chunk : groups;
            for (int i = 0; i < nw; i++) {
                const int64_t s = q0 > goffs[i] ? q0 : goffs[i], e = q1 < goffs[i + 1] ? q1 : goffs[i + 1];
                if (s < e) packed_rows(kinds[i], w[i], N[i], K, s - goffs[i], e - goffs[i], &a, M, y + offs[i], y_stride,
                                       force_scalar, bias ? NULL : (res ? res + offs[i] : NULL), res_stride);
            }
        }
        lmx_add_biases(M, nw, N, offs, bias, y, y_stride);
        if (bias && res) { /* after the biases: (x W^T + b) + res, as the graph adds them */
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < total; n++) y[m * y_stride + n] += res[m * res_stride + n];
        }
    }
    return 0;
}

/* lmx_packed_matmul of a gate and an up projection (their columns [gate | up], I each), then
 * out[m, i] = act(gate) * up (lmx_glu; act 0 = silu, 1 = gelu tanh), in one call: the [M, 2I] product lives
 * in this thread's buffer.  Bit for bit the two calls.  Returns what lmx_packed_matmul returns; -1 for an
 * odd number of columns, -3 without memory. */
LMX_API void lmx_glu(const float *gu, int64_t M, int64_t I, int64_t gs, int act, float *out, int64_t os);

static __thread float *glu_mem = NULL;
static __thread size_t glu_cap = 0;

LMX_API int lmx_packed_matmul_glu(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw,
                                  const uint8_t *const *w, const int *kinds, const int64_t *N,
                                  const float *const *bias, float *out, int64_t out_stride, int force_scalar,
                                  const float *norm_w, float norm_eps, int act) {
    int64_t total = 0;
    for (int i = 0; i < nw && i < 64; i++) total += N[i];
    if (total % 2) return -1;
    const size_t need = (size_t)(M * total > 0 ? M * total : 1);
    if (need > glu_cap) {
        free(glu_mem);
        glu_mem = (float *)malloc(need * 4);
        glu_cap = glu_mem ? need : 0;
        if (!glu_mem) return -3;
    }
    const int rc = lmx_packed_matmul_res(M, K, x, x_stride, nw, w, kinds, N, bias, glu_mem, total, force_scalar,
                                         norm_w, norm_eps, NULL, 0);
    if (rc) return rc;
    lmx_glu(glu_mem, M, total / 2, total, act, out, out_stride);
    return 0;
}

/* A projection over packed weights with everything but the activations bound once (engine/kernels/fused.py
 * prepares one per graph node): one call per step passes only x, the output and the residual. */
typedef struct {
    int64_t K;
    int64_t nw;
    const uint8_t *const *w;
    const int *kinds;
    const int64_t *N;
    const float *const *bias;
    const float *norm_w;
    float norm_eps;
    int32_t act; /* -1: none; 0 silu / 1 gelu (tanh) of [gate | up]: lmx_packed_matmul_glu */
} lmx_packed_plan_t;

/* y = x @ W^T (+ b) (+ res, when res is not NULL), or the gated product when p->act >= 0. */
LMX_API int lmx_packed_call(const lmx_packed_plan_t *p, int64_t M, const float *x, int64_t x_stride, float *y,
                            int64_t y_stride, const float *res, int64_t res_stride) {
    if (p->act >= 0) {
        if (res) return -1;
        return lmx_packed_matmul_glu(M, p->K, x, x_stride, (int)p->nw, p->w, p->kinds, p->N, p->bias, y, y_stride, 0,
                                     p->norm_w, p->norm_eps, p->act);
    }
    return lmx_packed_matmul_res(M, p->K, x, x_stride, (int)p->nw, p->w, p->kinds, p->N, p->bias, y, y_stride, 0,
                                 p->norm_w, p->norm_eps, res, res_stride);
}
