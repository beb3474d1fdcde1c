/* q8_avx512.c - the 8-bit-activation (q8_kern.h) AVX-512 kernels without VNNI
 * (Skylake-X class: vpdpbusd emulated with vpmaddubsw + vpmaddwd). The bodies are in q8_avx512.h. */
#include "q8_kern.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TGT          "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define HAVE_VNNI    0
#define FAMILY_TABLE ps_q8_avx512_kerns
#define HAVE_AMX     0
#include "q8_avx512.h"
#else
const ps_q8_kern ps_q8_avx512_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */
#endif
