/* kern_avx512.c - AVX-512 kernels (not written yet: every type falls back). */
#include "cpu.h"

const ps_kernel *ps_kern_avx512(uint32_t t) {
    (void)t;
    return NULL;
}

const ps_kernel *ps_kern_avx512vnni(uint32_t t) {
    (void)t;
    return NULL;
}
