/* kern_avx512.c - the AVX-512 kernels without VNNI (Skylake-X class: vpdpbusd emulated
 * with vpmaddubsw + vpmaddwd). The bodies are in kern_avx512.h. */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TGT "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define HAVE_VNNI 0
#define FAMILY_FN ps_kern_avx512
#include "kern_avx512.h"
#else
const ps_kernel *ps_kern_avx512(uint32_t t) {
    (void)t;
    return NULL;
}
#endif
