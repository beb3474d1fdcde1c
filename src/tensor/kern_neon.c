/* kern_neon.c - the NEON kernels without the dot product (every ARMv8-A core: Cortex-A53,
 * A57, A72, ...), bit-identical to the ref kernels. The bodies are in kern_neon.h; the
 * float types are only here (kern_neondot.c falls back to them). */
#include "cpu.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define KTGT
#define HAVE_DOTPROD 0
#define FAMILY_FN ps_kern_neon
#include "kern_neon.h"
#else
const ps_kernel *ps_kern_neon(uint32_t t) {
    (void)t;
    return NULL;
}
#endif
