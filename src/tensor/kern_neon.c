/* kern_neon.c - NEON kernels (not written yet: every type falls back). */
#include "cpu.h"

const ps_kernel *ps_kern_neon(uint32_t t) {
    (void)t;
    return NULL;
}
