/* A command-line driver of libremax's native kernels, for testing a kernel variant built for another
 * architecture under an emulator (tests/engine/test_native_kernels_arm.py cross-compiles it with the
 * kernel sources and runs it under qemu-user).
 *
 *   native_harness REQUEST RESULT
 *
 * REQUEST (little-endian): "LMXH", int32 number of cases, then per case
 *     int32 op, int32 nint, int32 nflt, int32 nbuf,
 *     int64 ints[nint], float64 flts[nflt],
 *     nbuf x (int64 nbytes, bytes padded to a multiple of 8)
 * RESULT: "LMXR", int32 number of cases, then per case
 *     int32 rc, int32 nbuf, nbuf x (int64 nbytes, bytes padded to a multiple of 8)
 *
 * Ops (ints; flts; input buffers -> output buffers):
 *   0 simd       -; -; -                                        -> lmx_simd() string
 *   1 packed     kind M N K scalar; -; blocks x [bias]            -> y [M, N] (lmx_pack + lmx_packed_matmul)
 *   2 ggml       kind M N K scalar; -; blocks x [bias]            -> y (lmx_qmatmul)
 *   3 dense      kind M N K scalar; -; w x [bias]                 -> y (lmx_dense_matmul)
 *   4 rmsnorm    M K has_w; eps; x [w]                          -> out [M, K]
 *   5 glu        M I act; -; gu [M, 2I]                         -> out [M, I]
 *   6 attention  T H Hkv D B lookup_stride page kv_kind s_page s_kv s_layer s_off layer window causal;
 *                scale; q offsets cache_len lookup cache          -> out [T, H, D]
 *   7 act        M K; -; x [M, K]                               -> codes int8 [M, K], scales [M, K/32],
 *                                                                  sums of 16 [M, K/16], int16 pairs of the
 *                                                                  integer sums [M, K/32] (lmx_act_prepare)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t lmx_packed_bytes(int kind, int64_t N, int64_t K);
int lmx_pack(int kind, const uint8_t *src, int64_t N, int64_t K, int64_t src_row_bytes, uint8_t *dst);
int lmx_packed_matmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw, const uint8_t *const *w,
                      const int *kinds, const int64_t *N, const float *const *bias, float *y, int64_t y_stride,
                      int force_scalar, const float *norm_w, float norm_eps);
int lmx_qmatmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw, const uint8_t *const *w,
                const int *kinds, const int64_t *N, const int64_t *row_bytes, const float *const *bias, float *y,
                int64_t y_stride, int force_scalar, const float *norm_w, float norm_eps);
int lmx_dense_matmul(int64_t M, int64_t K, const float *x, int64_t x_stride, int nw, const uint8_t *const *w,
                     const int *kinds, const int64_t *N, const int64_t *row_bytes, const float *const *bias, float *y,
                     int64_t y_stride, int force_scalar, const float *norm_w, float norm_eps);
void lmx_rmsnorm(const float *x, int64_t M, int64_t K, int64_t xs, const float *w, float eps, float *out, int64_t os);
void lmx_glu(const float *gu, int64_t M, int64_t I, int64_t gs, int act, float *out, int64_t os);
int lmx_paged_attention(const float *q, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t B,
                        const int64_t *offsets, const int64_t *cache_len, const int64_t *lookup, int64_t lookup_stride,
                        int64_t page_size, const void *cache, int kv_kind, int64_t s_page, int64_t s_kv,
                        int64_t s_layer, int64_t s_off, int64_t layer, float scale, int64_t window, int64_t chunk,
                        int causal, float *out);
int lmx_act_prepare(int64_t M, int64_t K, const float *x, int64_t xs, const int8_t **xq, const float **dxb,
                    const float **sxb, const float **sx16, const int32_t **ixp, int64_t *KP, int64_t *BP, int nt);
int64_t lmx_block_bytes(int kind);
int64_t lmx_block_elems(int kind);
const char *lmx_simd(void);

static void die(const char *msg) {
    fprintf(stderr, "native_harness: %s\n", msg);
    exit(2);
}

static void rd(FILE *f, void *p, size_t n) {
    if (n && fread(p, 1, n, f) != n) die("short request");
}

static void wr(FILE *f, const void *p, size_t n) {
    static const char zero[8] = {0};
    if (n && fwrite(p, 1, n, f) != n) die("write failed");
    if (n % 8 && fwrite(zero, 1, 8 - n % 8, f) != 8 - n % 8) die("write failed");
}

typedef struct {
    int64_t n;
    void *p;
} buf_t;

static void put(FILE *f, const void *p, int64_t n) {
    wr(f, &n, 8);
    wr(f, p, (size_t)n);
}

int main(int argc, char **argv) {
    if (argc != 3) die("usage: native_harness REQUEST RESULT");
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) die("cannot open the files");
    char magic[4];
    int32_t ncases;
    rd(in, magic, 4);
    if (memcmp(magic, "LMXH", 4)) die("bad magic");
    rd(in, &ncases, 4);
    fwrite("LMXR", 1, 4, out);
    fwrite(&ncases, 4, 1, out);
    for (int c = 0; c < ncases; c++) {
        int32_t hdr[4];
        rd(in, hdr, 16);
        const int op = hdr[0], nint = hdr[1], nflt = hdr[2], nbuf = hdr[3];
        int64_t iv[32] = {0};
        double fv[8] = {0};
        buf_t b[8] = {{0, NULL}};
        if (nint > 32 || nflt > 8 || nbuf > 8) die("too many arguments");
        rd(in, iv, (size_t)nint * 8);
        rd(in, fv, (size_t)nflt * 8);
        for (int i = 0; i < nbuf; i++) {
            rd(in, &b[i].n, 8);
            const size_t padded = (size_t)((b[i].n + 7) / 8 * 8);
            if (posix_memalign(&b[i].p, 64, padded ? padded : 8)) die("no memory");
            rd(in, b[i].p, padded);
        }
        int32_t rc = 0, nout = 0;
        buf_t o[4] = {{0, NULL}};
        switch (op) {
        case 0: {
            const char *s = lmx_simd();
            o[0].n = (int64_t)strlen(s);
            o[0].p = malloc((size_t)o[0].n + 1);
            memcpy(o[0].p, s, (size_t)o[0].n);
            nout = 1;
            break;
        }
        case 1: case 2: case 3: {
            const int kind = (int)iv[0], scalar = (int)iv[4];
            const int64_t M = iv[1], N = iv[2], K = iv[3];
            const float *bias[1] = {nbuf > 2 ? (const float *)b[2].p : NULL};
            const float *const *bp = nbuf > 2 ? bias : NULL;
            o[0].n = M * N * 4;
            o[0].p = calloc((size_t)(M * N) + 1, 4);
            nout = 1;
            int kinds[1] = {kind};
            int64_t ns[1] = {N}, rb[1] = {N ? b[0].n / N : 0};
            if (op == 1) {
                const int64_t pb = lmx_packed_bytes(kind, N, K);
                uint8_t *packed = NULL;
                if (pb < 0 || posix_memalign((void **)&packed, 64, (size_t)pb + 64)) { rc = -100; break; }
                rc = lmx_pack(kind, (const uint8_t *)b[0].p, N, K, rb[0], packed);
                const uint8_t *w[1] = {packed};
                if (!rc) rc = lmx_packed_matmul(M, K, (const float *)b[1].p, K, 1, w, kinds, ns, bp, (float *)o[0].p, N,
                                                scalar, NULL, 0.0f);
                free(packed);
            } else {
                const uint8_t *w[1] = {(const uint8_t *)b[0].p};
                rc = (op == 2 ? lmx_qmatmul : lmx_dense_matmul)(M, K, (const float *)b[1].p, K, 1, w, kinds, ns, rb, bp,
                                                               (float *)o[0].p, N, scalar, NULL, 0.0f);
            }
            break;
        }
        case 4: {
            const int64_t M = iv[0], K = iv[1];
            o[0].n = M * K * 4;
            o[0].p = malloc((size_t)o[0].n + 4);
            nout = 1;
            lmx_rmsnorm((const float *)b[0].p, M, K, K, iv[2] ? (const float *)b[1].p : NULL, (float)fv[0],
                        (float *)o[0].p, K);
            break;
        }
        case 5: {
            const int64_t M = iv[0], I = iv[1];
            o[0].n = M * I * 4;
            o[0].p = malloc((size_t)o[0].n + 4);
            nout = 1;
            lmx_glu((const float *)b[0].p, M, I, 2 * I, (int)iv[2], (float *)o[0].p, I);
            break;
        }
        case 6: {
            const int64_t T = iv[0], H = iv[1], D = iv[3];
            o[0].n = T * H * D * 4;
            o[0].p = calloc((size_t)(T * H * D) + 1, 4);
            nout = 1;
            rc = lmx_paged_attention((const float *)b[0].p, T, H, iv[2], D, iv[4], (const int64_t *)b[1].p,
                                     (const int64_t *)b[2].p, (const int64_t *)b[3].p, iv[5], iv[6], b[4].p, (int)iv[7],
                                     iv[8], iv[9], iv[10], iv[11], iv[12], (float)fv[0], iv[13], iv[14],
                                     (int)iv[15], (float *)o[0].p);
            break;
        }
        case 7: {
            const int64_t M = iv[0], K = iv[1];
            const int8_t *xq;
            const float *dxb, *sxb, *sx16;
            const int32_t *ixp;
            int64_t KP, BP;
            rc = lmx_act_prepare(M, K, (const float *)b[0].p, K, &xq, &dxb, &sxb, &sx16, &ixp, &KP, &BP, 1);
            if (rc) break;
            o[0].n = M * K;
            o[1].n = M * (K / 32) * 4;
            o[2].n = M * (K / 16) * 4;
            o[3].n = M * (K / 32) * 4;
            for (int i = 0; i < 4; i++) o[i].p = malloc((size_t)o[i].n + 4);
            for (int64_t m = 0; m < M; m++) {
                memcpy((int8_t *)o[0].p + m * K, xq + m * KP, (size_t)K);
                memcpy((float *)o[1].p + m * (K / 32), dxb + m * BP, (size_t)(K / 32) * 4);
                memcpy((float *)o[2].p + m * (K / 16), sx16 + m * 2 * BP, (size_t)(K / 16) * 4);
                memcpy((int32_t *)o[3].p + m * (K / 32), ixp + m * BP, (size_t)(K / 32) * 4);
            }
            nout = 4;
            break;
        }
        default:
            die("unknown op");
        }
        const int32_t rh[2] = {rc, nout};
        wr(out, rh, 8);
        for (int i = 0; i < nout; i++) {
            put(out, o[i].p, o[i].n);
            free(o[i].p);
        }
        for (int i = 0; i < nbuf; i++) free(b[i].p);
    }
    if (fclose(out)) die("write failed");
    fclose(in);
    return 0;
}
