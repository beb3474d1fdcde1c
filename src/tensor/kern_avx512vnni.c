/* kern_avx512vnni.c - the AVX-512 kernels with VNNI (vpdpbusd), VBMI and BITALG: Ice
 * Lake, Zen 4 and later. The bodies are in kern_avx512.h. */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TGT "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
#define HAVE_VNNI 1
#define FAMILY_FN ps_kern_avx512vnni
#include "kern_avx512.h"
#else
const ps_kernel *ps_kern_avx512vnni(uint32_t t) {
    (void)t;
    return NULL;
}
#endif
