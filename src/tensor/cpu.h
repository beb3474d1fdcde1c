/* cpu.h - CPU feature detection and the kernel families (ISAs) ps_matmul picks from
 * (internal to src/tensor/ and its tests). The kernels themselves: q8_kern.h. */
#ifndef PS_TENSOR_CPU_H
#define PS_TENSOR_CPU_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    PS_ISA_REF = 0,
    PS_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    PS_ISA_AVX512 = 2,     /* AVX-512 F/BW/VL/DQ + the above */
    PS_ISA_AVX512VNNI = 3, /* plus VNNI, VBMI and BITALG (Ice Lake, Zen 4 and later) */
    PS_ISA_NEON = 4,       /* aarch64 Advanced SIMD: bit-identical to ref */
    PS_ISA_NEONDOT = 5,    /* plus the ARMv8.2 dot product; bit-identical to ref */
    PS_ISA_AVX512AMX = 6,  /* avx512vnni plus AMX tiles (Sapphire Rapids and later): same bits */
    PS_ISA_COUNT
} ps_isa;

const char *ps_isa_name(ps_isa isa); /* "avx512vnni", ...; never NULL */
bool ps_isa_available(ps_isa isa);   /* this CPU (and this build) can run the family */
ps_isa ps_isa_best(void);            /* the best available family */
size_t ps_cpu_l1d_bytes(void);       /* a core's L1 data cache as the OS reports it; 0 if unknown */

#endif
