/* kern_neondot.c - the NEON kernels with the ARMv8.2 dot product (sdot: Cortex-A55, A75
 * and later, Neoverse, Apple M), bit-identical to the ref kernels; compiled per function
 * with a target attribute and picked at run time (cpu.c asks the OS for the feature). The
 * bodies are in kern_neon.h; the float types fall back to kern_neon.c. */
#include "cpu.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#define KTGT __attribute__((target("dotprod")))
#else
#define KTGT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define HAVE_DOTPROD 1
#define FAMILY_FN ps_kern_neondot
#include "kern_neon.h"
#else
const ps_kernel *ps_kern_neondot(uint32_t t) {
    (void)t;
    return NULL;
}
#endif
