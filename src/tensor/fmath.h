/* fmath.h - float functions whose bits do not depend on the machine or the compiler: plain
 * IEEE operations in a fixed order, with no fused multiply-adds (GCC builds with
 * -ffp-contract=off, nvcc with -fmad=false), so that the CPU and the CUDA backend compute
 * the same numbers. libm's expf is not one of them: glibc picks a different code path on
 * CPUs with FMA, and CUDA's expf is another approximation again. */
#ifndef PS_TENSOR_FMATH_H
#define PS_TENSOR_FMATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PS_FMATH static __host__ __device__ __forceinline__
#else
#define PS_FMATH static inline
#endif

/* The float whose bits are b. */
PS_FMATH float ps_f32_from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* e^r for |r| <= ln 2 / 2: Cephes' degree-6 polynomial (within 2 ulp of e^r). */
PS_FMATH float ps_exp_poly(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3333452677e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * (r * r) + r + 1.0f;
}

/* n = x / ln 2 rounded to an integer (as a float; |x| < 2^22), and r = x - n ln 2 in two steps. */
PS_FMATH float ps_exp_reduce(float x, float *r) {
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + big) - big;
    *r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    return n;
}

/* e^x for every float x: e^r times 2^n, the power applied in two exact halves so that
 * results near overflow and subnormal ones come out right (x > 88.73 gives infinity,
 * x <= -104 gives 0, NaN stays NaN). Within 2 ulp of e^x. */
PS_FMATH float ps_expf(float x) {
    if (x != x) return x;
    if (x <= -104.0f) return 0.0f;
    if (x > 89.0f) x = 89.0f; /* e^89 overflows anyway */
    float r, n = ps_exp_reduce(x, &r);
    int ni = (int)n, h = ni / 2;
    return ps_exp_poly(r) * ps_f32_from_bits((uint32_t)(h + 127) << 23) *
           ps_f32_from_bits((uint32_t)(ni - h + 127) << 23);
}

/* The softmax's e^x for x <= 0: as ps_expf, but x < -87 (below the smallest normal float)
 * gives 0. forward.c's vexp_neg8 is the same operations in 8 lanes. */
PS_FMATH float ps_exp_neg(float x) {
    if (x != x) return x;
    if (x < -87.0f) return 0.0f;
    float r, n = ps_exp_reduce(x, &r);
    return ps_exp_poly(r) * ps_f32_from_bits((uint32_t)((int)n + 127) << 23);
}

/* SwiGLU's gate: silu(g) * u = g / (1 + e^-g) * u. */
PS_FMATH float ps_swiglu(float g, float u) { return g / (1.0f + ps_expf(-g)) * u; }

#endif
