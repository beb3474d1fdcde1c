/* vec8.h - 8-lane float vectors (GCC's vector extension: a register on every x86-64 target
 * with AVX, two of SSE or NEON elsewhere), 16-lane ones (an AVX-512 register), and the
 * softmax's exponent in them (host code only). Plain lane operations in a fixed order, so that
 * every vector width gives the same bits: ps_exp_neg8 and ps_exp_neg16 are fmath.h's
 * ps_exp_neg lane by lane. */
#ifndef PS_TENSOR_VEC8_H
#define PS_TENSOR_VEC8_H

#include <stdint.h>
#include <string.h>

/* Loops of plain C whose order of operations is fixed in the source, built for the baseline
 * x86-64, would run on SSE2. Clones for AVX2 and AVX-512 (picked by the loader) let the
 * compiler use wider vectors for the same operations in the same order (no fused
 * multiply-adds: floating-point contraction is off), so the bits do not change. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define PS_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PS_SIMD_CLONES
#endif

/* No vector crosses a call (these are always inlined), so the vector-ABI note GCC gives
 * for code built without AVX does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float ps_vf8 __attribute__((vector_size(32)));
typedef int32_t ps_vi8 __attribute__((vector_size(32)));
typedef float ps_vf16 __attribute__((vector_size(64)));
typedef int32_t ps_vi16 __attribute__((vector_size(64)));

/* ps_select8 / ps_select16: lanes of a where m is all ones, of b where m is 0.
 * ps_exp_neg8 / ps_exp_neg16: e^x for x <= 0 in every lane (the softmax's exponent):
 * x = n ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-6 polynomial (within 2 ulp of
 * e^x), times 2^n built in the exponent bits; x < -87 (e^x below the smallest normal float)
 * gives 0. One definition for both widths. */
#define PS_VEC_EXP(L, VF, VI)                                                                                          \
    static inline __attribute__((always_inline)) VF ps_select##L(VI m, VF a, VF b) {                                   \
        VI ia, ib;                                                                                                     \
        memcpy(&ia, &a, sizeof ia);                                                                                    \
        memcpy(&ib, &b, sizeof ib);                                                                                    \
        ia = (ia & m) | (ib & ~m);                                                                                     \
        memcpy(&a, &ia, sizeof a);                                                                                     \
        return a;                                                                                                      \
    }                                                                                                                  \
    static inline __attribute__((always_inline)) VF ps_exp_neg##L(VF x) {                                              \
        const VF big = (VF){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */                         \
        VI tiny = x < -87.0f;                                                                                          \
        VF xc = ps_select##L(tiny, (VF){0} - 87.0f, x);                                                                \
        VF n = (xc * 1.44269504088896341f + big) - big;                                                                \
        VF r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;                                                          \
        VF p = (VF){0} + 1.9875691500e-4f;                                                                             \
        p = p * r + 1.3981999507e-3f;                                                                                  \
        p = p * r + 8.3333452677e-3f;                                                                                  \
        p = p * r + 4.1665795894e-2f;                                                                                  \
        p = p * r + 1.6666665459e-1f;                                                                                  \
        p = p * r + 5.0000001201e-1f;                                                                                  \
        p = p * (r * r) + r + 1.0f;                                                                                    \
        VI bits = (__builtin_convertvector(n, VI) + 127) << 23;                                                        \
        VF scale;                                                                                                      \
        memcpy(&scale, &bits, sizeof scale);                                                                           \
        return ps_select##L(tiny, (VF){0}, p * scale);                                                                 \
    }
PS_VEC_EXP(8, ps_vf8, ps_vi8)
PS_VEC_EXP(16, ps_vf16, ps_vi16)

/* 8 or 16 floats from p (any alignment). */
static inline __attribute__((always_inline)) ps_vf8 ps_load8(const float *p) {
    ps_vf8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) ps_vf16 ps_load16(const float *p) {
    ps_vf16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
