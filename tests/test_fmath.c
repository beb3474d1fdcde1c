/* test_fmath.c - tensor/fmath.h: ps_expf and ps_exp_neg against exp in double over every
 * float of their ranges (at most 2 ulp; the edges exact), and the softmax's exponent
 * against forward.c's claim (ps_exp_neg is what vexp_neg8 computes: test_forward checks
 * attention bits on both widths, test_cuda the GPU against the CPU). */
#include <math.h>
#include <string.h>

#include "ps_test.h"
#include "tensor/fmath.h"

/* Distance in units in the last place between f and the double d (rounded to float). */
static double ulps(float f, double d) {
    if (isinf(d) || d > 3.4028234663852886e38) return isinf(f) && f > 0 ? 0 : 1e9;
    float g = (float)d;
    if (f == g) return 0;
    double ulp = (double)nextafterf(g, INFINITY) - (double)g;
    if (ulp == 0 || !isfinite(ulp)) ulp = (double)g - (double)nextafterf(g, -INFINITY);
    return fabs((double)f - d) / ulp;
}

/* Every float in [lo, hi] (same sign), stepping bit patterns by `step`: the worst ulp error. */
static double sweep(float (*fn)(float), float lo, float hi, uint32_t step, double floor) {
    uint32_t a, b;
    memcpy(&a, &lo, 4), memcpy(&b, &hi, 4);
    if (a > b) {
        uint32_t t = a;
        a = b;
        b = t;
    }
    double worst = 0;
    for (uint64_t u = a; u <= b; u += step) {
        float x;
        uint32_t v = (uint32_t)u;
        memcpy(&x, &v, 4);
        double want = exp((double)x);
        if (want < floor) continue; /* flushed to 0 by design: checked apart */
        double e = ulps(fn(x), want);
        if (e > worst) worst = e;
    }
    return worst;
}

int main(void) {
    /* ps_expf: every float of [-103.9, 88.7] (both signs), every 29th bit pattern */
    double pos = sweep(ps_expf, 0.0f, 88.72f, 29, 0), neg = sweep(ps_expf, -0.0f, -103.9f, 29, 0);
    printf("ps_expf: worst %.2f ulp on [0, 88.72], %.2f on [-103.9, 0]\n", pos, neg);
    PS_CHECK(pos <= 2.0);
    PS_CHECK(neg <= 2.0);
    PS_CHECK(ps_expf(0.0f) == 1.0f);
    PS_CHECK(ps_expf(-0.0f) == 1.0f);
    PS_CHECK(ps_expf(1.0f) == 2.71828183f);
    PS_CHECK(isinf(ps_expf(88.73f)) && isinf(ps_expf(1e30f)) && isinf(ps_expf(INFINITY)));
    PS_CHECK(ps_expf(-104.0f) == 0.0f && ps_expf(-1e30f) == 0.0f && ps_expf(-INFINITY) == 0.0f);
    PS_CHECK(isnan(ps_expf(NAN)));
    PS_CHECK(ps_expf(88.7f) > 3.3e38f); /* near overflow: the power applied in halves */
    PS_CHECK(ps_expf(-100.0f) > 0.0f);  /* subnormal results */
    /* ps_exp_neg: [-87, 0] within 2 ulp; below -87 zero */
    double sm = sweep(ps_exp_neg, -0.0f, -87.0f, 13, 0);
    printf("ps_exp_neg: worst %.2f ulp on [-87, 0]\n", sm);
    PS_CHECK(sm <= 2.0);
    PS_CHECK(ps_exp_neg(-87.01f) == 0.0f && ps_exp_neg(-INFINITY) == 0.0f);
    PS_CHECK(ps_exp_neg(0.0f) == 1.0f);
    /* the two agree where both are defined (same reduction and polynomial) */
    int same = 1;
    for (float x = -86.9f; x <= 0.0f; x += 0.0137f) same &= ps_exp_neg(x) == ps_expf(x);
    PS_CHECK(same);
    /* SwiGLU's gate: silu(g) * u = g sigmoid(g) u */
    const float gs[] = {-120.0f, -20.0f, -1.5f, -0.0f, 0.0f, 0.25f, 3.0f, 40.0f, 120.0f};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        double g = gs[i], want = g / (1.0 + exp(-g)) * 1.75;
        float got = ps_swiglu(gs[i], 1.75f);
        PS_CHECK(fabs(got - want) <= 4e-7 * fabs(want) + 1e-37);
    }
    return ps_test_done();
}
