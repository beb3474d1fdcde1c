/* q8_avx512.h - AVX-512 8-bit-activation kernel bodies (q8_kern.h), included by
 * q8_avx512.c (without VNNI) and q8_avx512vnni.c (with VNNI, VBMI and BITALG). Not a
 * normal header: it and the section headers it includes (q8_avx512_*.h) define static
 * functions, and the includer sets TGT (the target attribute string), HAVE_VNNI (0 or 1),
 * FAMILY_TABLE (the name of the kernel table to define) and HAVE_AMX (0 or 1: define the
 * avx512amx family's table too, q8_avx512_amx.h). Without VNNI, vpdpbusd is emulated
 * (vpmaddubsw + vpmaddwd) and only the types whose pair sums fit int16 without VBMI are
 * offered (f32, f16, bf16, q4_0, q4_1); the others fall back to AVX2.
 *
 * Design (Zen 4 / Ice Lake class cores). The 512-bit multiply ports (vpdpbusd, vfmadd,
 * vpermt2b, vpmulld) are the bottleneck, at one instruction per cycle on Zen 4; loads
 * (one 512-bit per cycle), logic, 32/64-bit unpacks and int->float conversions use other
 * ports. So every per-(row, token) float operation is amortized over many blocks:
 *
 * 32-element block types (q4_0, q4_1, q5_0, q5_1, q8_0) work on groups of 16 blocks (512
 * columns) "transposed" so that each 32-bit lane holds one block: vector j (0..7) holds
 * quants 4j..4j+3 of every block (nibble types unpack them from packed dword j % 4 of the
 * block, low or high nibbles). Eight vpdpbusd give each lane its block's integer dot, and
 * one vmulps + one vfmadd per (row, token) apply the 16 block scales:
 *     acc = corr_t                     (int: -offset * sum(q_x), exact; 0 for q4_1/q5_1)
 *     acc += dpbusd(w_j, x_j)          (j = 0..7; weights unsigned, q8_0 biased by 128)
 *     facc += (dw ⊙ dx) ⊙ float(acc)   [+ m ⊙ (dx * sum q_x) for q4_1/q5_1]
 * The transposition is a 4x4 dword transpose of four vpermt2b-gathered 4-block windows;
 * lane m of a group holds block nib_block(m) (q8_0: q8_block(m)), and the activations are
 * quantized straight into that layout. A partial last group of up to 6 blocks is done
 * block by block in 256-bit lanes ("natural tail"), a longer one as a zero-padded group.
 *
 * K types (q4_K, q5_K, q6_K) work on groups of 4 super-blocks (1024 columns), lane m
 * holding one sub-block of super-block m % 4; sub-block scales are applied in integers
 * (vpmulld), q4_K/q5_K minimums with one vpmaddwd, then one float multiply-add per group.
 *
 * Float types keep one 16-lane f32 accumulator per (row, token): fma over 16 columns per
 * step, the last step masked.
 *
 * Register tiles cover R rows x T tokens (2 x 4 nibble types, 1 x 8 q8_0, 1 x 6 q4_K and
 * q5_K, 1 x 4 q6_K, 4 x 6 float types). Batch invariance holds by construction: every
 * (row, token) pair runs the same float operations in the same order whatever the tile
 * shape, its place in the tile, the column passes (accumulators saved and reloaded
 * exactly) or the thread; integer sums are exact, so GEMV (1 x 1 tiles) may split them
 * into parallel chains; the final horizontal sum has one fixed order. */

#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "q8_kern.h"

#define KI static inline __attribute__((always_inline, target(TGT)))
#define KF static __attribute__((target(TGT)))

#define RMAX 4
#define TMAX 8
/* Tile loops must unroll fully (so that tile arrays live in registers) at -O2 too. */
#define UNROLL _Pragma("GCC unroll 16")

#include "q8_avx512_base.h"
#include "q8_avx512_tile.h"
#include "q8_avx512_q32.h"
#include "q8_avx512_k.h"
#include "q8_avx512_float.h"

// Table

/* The family's kernels by ps_type (q8_kern.h): one row per type; without VNNI the
 * rows after q4_1 stay empty (those types fall back to AVX2). */
const ps_q8_kern FAMILY_TABLE[PS_TYPE_COUNT] = {
    [PS_TYPE_F32] = {NULL, f32_bytes, gemm_f32, 4, 6},
    [PS_TYPE_F16] = {NULL, f32_bytes, gemm_f16, 4, 6},
    [PS_TYPE_BF16] = {NULL, f32_bytes, gemm_bf16, 4, 6},
    [PS_TYPE_Q4_0] = {quant_nib_off8, g16_bytes, gemm_q4_0, 2, 4},
    [PS_TYPE_Q4_1] = {quant_nib_off0, g16_bytes, gemm_q4_1, 2, 4},
#if HAVE_VNNI
    [PS_TYPE_Q5_0] = {quant_nib_off16, g16_bytes, gemm_q5_0, 2, 4},
    [PS_TYPE_Q5_1] = {quant_nib_off0, g16_bytes, gemm_q5_1, 2, 4},
    [PS_TYPE_Q8_0] = {quant_q8_off128, g16_bytes, gemm_q8_0, 1, 8},
    [PS_TYPE_Q4_K] = {quant_k4, k4_bytes, gemm_q4_K, 1, 6},
    [PS_TYPE_Q5_K] = {quant_k4, k4_bytes, gemm_q5_K, 1, 6},
    [PS_TYPE_Q6_K] = {quant_k6, k6_bytes, gemm_q6_K, 1, 4},
#endif
};

#if HAVE_AMX
#include "q8_avx512_amx.h"
#endif
