/* q8_neon.c - the 8-bit-activation (q8_kern.h) NEON kernels without the dot product
 * (every ARMv8-A core: Cortex-A53, A57, A72, ...), bit-identical to the ref kernels. The bodies are in q8_neon.h; the
 * float types are only here (q8_neondot.c falls back to them). */
#include "q8_kern.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define KTGT
#define HAVE_DOTPROD 0
#define FAMILY_TABLE ps_q8_neon_kerns
#include "q8_neon.h"
#else
const ps_q8_kern ps_q8_neon_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */
#endif
