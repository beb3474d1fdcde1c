/* cpu.h - CPU feature detection and the per-ISA matmul kernel tables (internal to
 * src/tensor/ and its tests).
 *
 * Each kernel family (ref, avx2, avx512, avx512vnni, neon, neondot) gives, per weight type,
 * a ps_kernel: how to quantize one activation row into the format its dot products consume,
 * and a tile routine that fills a block of outputs. A family may lack a type; the lookup
 * then falls back to the next simpler family (avx512vnni -> avx512 -> avx2 -> ref,
 * neondot -> neon -> ref).
 *
 * Batch invariance (DESIGN.md invariant 1) is each kernel's contract: the value written
 * for (row r, token t) depends only on W row r and activation row t, never on nr, nt or
 * where the pair sits in the block. */
#ifndef PS_TENSOR_CPU_H
#define PS_TENSOR_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "types.h"

/* CPU features --------------------------------------------------------------------- */
typedef struct {
    bool avx2, fma, f16c;                 /* with OS support for ymm state */
    bool avx512f, avx512bw, avx512vl;     /* with OS support for zmm/opmask state */
    bool avx512dq, avx512vnni, avx512vbmi;
    bool avx512bitalg, avx512bf16;
    bool neon;                            /* aarch64 Advanced SIMD */
    bool neon_dot;                        /* ARMv8.2 dot product (sdot), as the OS reports it */
} ps_cpu_features;

/* Features of this CPU, detected once (thread-safe after the first call returns). */
const ps_cpu_features *ps_cpu_features_get(void);

typedef enum {
    PS_ISA_REF = 0,
    PS_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    PS_ISA_AVX512 = 2,     /* AVX-512 F/BW/VL/DQ + the above */
    PS_ISA_AVX512VNNI = 3, /* plus VNNI, VBMI and BITALG (Ice Lake, Zen 4 and later) */
    PS_ISA_NEON = 4,       /* aarch64 Advanced SIMD: bit-identical to ref */
    PS_ISA_NEONDOT = 5,    /* plus the ARMv8.2 dot product; bit-identical to ref */
    PS_ISA_COUNT
} ps_isa;

const char *ps_isa_name(ps_isa isa); /* "avx512vnni", ...; never NULL */
bool ps_isa_available(ps_isa isa);   /* this CPU (and this build) can run the family */
ps_isa ps_isa_best(void);            /* the best available family */

/* Kernels -------------------------------------------------------------------------- */

/* Quantizes one activation row x[0..cols) into xq (x_bytes(cols) bytes, 64-aligned). */
typedef void (*ps_quant_fn)(const float *x, void *xq, int64_t cols);

/* For r < nr and t < nt: y[t * ys + r] = dot(W row r, activation row t), where W row r
 * starts at w + r * wb and activation row t at x + t * xs (already quantized, or f32 when
 * the kernel has no quant function). */
typedef void (*ps_gemm_fn)(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
                           int64_t ys, int64_t nr, int64_t nt);

typedef struct {
    ps_quant_fn quant;                /* NULL: the kernel reads f32 activations in place */
    size_t (*x_bytes)(int64_t cols);  /* bytes of one quantized row (multiple of 64) */
    ps_gemm_fn gemm;
    int tile_rows;                    /* row chunks given to gemm are multiples of this */
    int tile_toks;                    /* tokens per register tile */
} ps_kernel;

/* Per-family tables: the kernel for weight type t, or NULL when the family lacks it
 * (or was not compiled for this architecture). */
const ps_kernel *ps_kern_ref(uint32_t t);
const ps_kernel *ps_kern_avx2(uint32_t t);
const ps_kernel *ps_kern_avx512(uint32_t t);
const ps_kernel *ps_kern_avx512vnni(uint32_t t);
const ps_kernel *ps_kern_neon(uint32_t t);
const ps_kernel *ps_kern_neondot(uint32_t t);

/* The kernel family isa uses for type t, after fallback; NULL for unsupported types. */
const ps_kernel *ps_kernel_get(ps_isa isa, uint32_t t);

/* Activation formats of the ref kernels ------------------------------------------------
 * The SIMD families reorder these (see their files) but hold the very same numbers: every
 * family quantizes a row to the same d and q values, so families differ only in the order
 * of float additions. */

/* 32-element activation block for the q4_0/q4_1/q5_0/q5_1/q8_0 weights. */
typedef struct {
    float d;           /* scale: value d * q */
    int32_t sum;       /* sum of qs */
    int8_t qs[PS_QK];  /* q = nearest-even(x / d) in [-127, 127] */
} ps_xq32;
_Static_assert(sizeof(ps_xq32) == 40, "xq32 size");

/* The K types take ps_block_q8_K (d = max|x| / 127, q as above, bsums over 16). */

/* Shared quantization step: d = max|x| / 127 over n floats (0 for an all-zero block) and
 * returns 1 / d (0 when d is 0). Every family uses exactly these float operations. */
float ps_xq_scale(const float *x, int n, float *d_out);

/* nearest-even(v * id) clamped to [-127, 127]: the one rounding rule of every family. */
int8_t ps_xq_round(float v, float id);

#endif
