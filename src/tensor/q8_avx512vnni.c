/* q8_avx512vnni.c - the 8-bit-activation (q8_kern.h) AVX-512 kernels with VNNI
 * (vpdpbusd), VBMI and BITALG: Ice Lake, Zen 4 and later; and the avx512amx family, which adds
 * AMX tiles for prompts (Sapphire Rapids and later). The bodies are in q8_avx512.h. */
#include "q8_kern.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TGT          "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
#define HAVE_VNNI    1
#define FAMILY_TABLE ps_q8_avx512vnni_kerns
#define HAVE_AMX     1
#include "q8_avx512.h"
#else
const ps_q8_kern ps_q8_avx512vnni_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */
const ps_q8_kern ps_q8_avx512amx_kerns[PS_TYPE_COUNT];
#endif
