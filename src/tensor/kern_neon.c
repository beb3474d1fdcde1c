/* kern_neon.c - the NEON family's table. No NEON kernels are written yet: on ARM every
 * type falls back to the scalar ref kernels (ps_kernel_get), which are correct and
 * batch-invariant but not fast. */
#include "cpu.h"

const ps_kernel *ps_kern_neon(uint32_t t) {
    (void)t;
    return NULL;
}
