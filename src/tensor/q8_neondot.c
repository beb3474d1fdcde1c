/* q8_neondot.c - the 8-bit-activation (q8_kern.h) NEON kernels with the ARMv8.2 dot
 * product (sdot: Cortex-A55, A75 and later, Neoverse, Apple M), bit-identical to the ref kernels; compiled per function
 * with a target attribute and picked at run time (cpu.c asks the OS for the feature). The
 * bodies are in q8_neon.h; the float types fall back to q8_neon.c. */
#include "q8_kern.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#define KTGT __attribute__((target("dotprod")))
#else
#define KTGT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define HAVE_DOTPROD 1
#define FAMILY_TABLE ps_q8_neondot_kerns
#include "q8_neon.h"
#else
const ps_q8_kern ps_q8_neondot_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */
#endif
