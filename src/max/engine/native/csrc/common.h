/* Shared definitions of libremax's native CPU kernels.
 *
 * The library is compiled on the machine that runs it (see ../build.py), so
 * the SIMD paths are chosen at compile time from the compiler's target
 * macros (__AVX512F__, __AVX512VNNI__, __AVX512BF16__, __AVX2__ ...); every
 * kernel also has a portable scalar path, which the tests compile and check
 * separately.  Parallel loops use OpenMP; the library links the same
 * libgomp that torch loaded, so torch's operators and these kernels share
 * one thread pool (never two pools spinning against each other).
 */
#ifndef LIBREMAX_COMMON_H
#define LIBREMAX_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LMX_AVX512 1
#include <immintrin.h>
#endif
#if defined(LMX_AVX512) && defined(__AVX512VNNI__)
#define LMX_AVX512VNNI 1
#endif
#if defined(LMX_AVX512) && defined(__AVX512BF16__)
#define LMX_AVX512BF16 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LMX_AVX2 1
#include <immintrin.h>
#endif

#define LMX_API __attribute__((visibility("default")))
#define LMX_INLINE static inline __attribute__((always_inline))

/* IEEE half -> float, exact for every input (NaN payloads kept). */
LMX_INLINE float lmx_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            man &= 0x3FFu;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> IEEE half, round to nearest even (overflow -> inf, NaN stays NaN), as numpy's astype. */
LMX_INLINE uint16_t lmx_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                   /* below the smallest normal half */
        if (ax < 0x33000000u) return (uint16_t)sign;           /* < 2^-25: rounds to zero */
        const uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126 - e;                        /* 14 + (113 - e) */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax - 0x38000000u) >> 13);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

LMX_INLINE float lmx_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

LMX_INLINE uint16_t lmx_f2bf(float f) { /* round to nearest even, NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

LMX_INLINE uint16_t lmx_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* GGML block kinds (values of gguf's GGMLQuantizationType). */
enum {
    LMX_F32 = 0, LMX_F16 = 1, LMX_Q4_0 = 2, LMX_Q4_1 = 3, LMX_Q5_0 = 6, LMX_Q5_1 = 7, LMX_Q8_0 = 8,
    LMX_Q2_K = 10, LMX_Q3_K = 11, LMX_Q4_K = 12, LMX_Q5_K = 13, LMX_Q6_K = 14, LMX_BF16 = 30,
};

int lmx_num_threads(void);
int64_t lmx_block_bytes(int kind);
int64_t lmx_block_elems(int kind);
int lmx_dequant_row(int kind, const uint8_t *src, float *dst, int64_t n);
void lmx_rmsnorm(const float *x, int64_t M, int64_t K, int64_t xs, const float *w, float eps, float *out, int64_t os);
const float *lmx_prenorm(const float *x, int64_t M, int64_t K, int64_t xs, const float *w, float eps);

#endif
