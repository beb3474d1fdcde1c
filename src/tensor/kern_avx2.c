/* kern_avx2.c - AVX2 + FMA + F16C kernels (not written yet: every type falls back). */
#include "cpu.h"

const ps_kernel *ps_kern_avx2(uint32_t t) {
    (void)t;
    return NULL;
}
