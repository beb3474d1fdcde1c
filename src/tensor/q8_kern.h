/* q8_kern.h - the 8-bit-activation kernels behind ps_matmul (internal to src/tensor/ and
 * its tests). File scheme: q8_<isa>.c are the kernels that quantize activations to 8-bit
 * blocks and take integer dot products against the weights (llama.cpp's numerics);
 * f32_<isa>.c (f32_kern.h) are the kernels of ps_gemm, whose activations stay float32.
 *
 * Each kernel family (ref, avx2, avx512, avx512vnni, avx512amx, neon, neondot) gives, per weight type,
 * a ps_q8_kern: how to quantize one activation row into the format its dot products consume,
 * and a tile routine that fills a block of outputs. A family's kernels are one table
 * indexed by ps_type (ps_q8_<isa>_kerns); a row left empty (gemm NULL) means the family
 * lacks the type, and the lookup then falls back to the next simpler family (avx512amx ->
 * avx512vnni -> avx512 -> avx2 -> ref, neondot -> neon -> ref). Adding a type is one row per family.
 *
 * Batch invariance (DESIGN.md invariant 1) is each kernel's contract: the value written
 * for (row r, token t) depends only on W row r and activation row t, never on nr, nt or
 * where the pair sits in the block. */
#ifndef PS_TENSOR_Q8_KERN_H
#define PS_TENSOR_Q8_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "types.h"

/* Quantizes one activation row x[0..cols) into xq (x_bytes(cols) bytes, 64-aligned). */
typedef void (*ps_q8_quant_fn)(const float *x, void *xq, int64_t cols);

/* For r < nr and t < nt: y[t * ys + r] = dot(W row r, activation row t), where W row r
 * starts at w + r * wb and activation row t at x + t * xs (already quantized, or f32 when
 * the kernel has no quant function). */
typedef void (*ps_q8_gemm_fn)(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
                              int64_t ys, int64_t nr, int64_t nt);

/* Kernels that multiply tiles of PS_Q8_TILE_TOKENS tokens (AMX) take those tokens' quantized
 * rows re-laid once per matmul, shared by its threads: tiles re-lays the n <= 16 rows at x
 * (xs bytes apart; a partial tile is padded) into one tile's tiles_bytes(cols) bytes at xt,
 * and gemm_tiled is gemm with the tiles of its tokens at xt (tiles of tokens 0-15, 16-31,
 * ...). A matmul's last partial tile has one when it holds at least PS_Q8_TILE_MIN tokens
 * (fewer go through gemm's kernels: AVX-512 VNNI is faster than a padded AMX tile below 13
 * of 16, docs/bench/2026-12-05-amx.md). */
#define PS_Q8_TILE_TOKENS 16
#define PS_Q8_TILE_MIN    13
#define PS_Q8_TILE_ROWS   16 /* gemm_tiled's row tiles (row chunks of tiled matmuls are multiples) */
typedef void (*ps_q8_tiles_fn)(const uint8_t *x, size_t xs, int n, int64_t cols, uint8_t *xt);
typedef void (*ps_q8_gemm_tiled_fn)(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,
                                    const uint8_t *xt, float *y, int64_t ys, int64_t nr, int64_t nt);

typedef struct {
    ps_q8_quant_fn quant;                /* NULL: the kernel reads f32 activations in place */
    size_t (*x_bytes)(int64_t cols);     /* bytes of one quantized row (multiple of 64) */
    ps_q8_gemm_fn gemm;                  /* NULL: the family lacks the type */
    int tile_rows;                       /* row chunks given to gemm are multiples of this */
    int tile_toks;                       /* tokens per register tile */
    size_t (*tiles_bytes)(int64_t cols); /* NULL: no tiled gemm (the rest unused) */
    ps_q8_tiles_fn tiles;
    ps_q8_gemm_tiled_fn gemm_tiled;
} ps_q8_kern;

/* Per-family tables, indexed by ps_type: an entry with gemm NULL is a type the family
 * lacks (every entry, for a family not compiled for this architecture). */
extern const ps_q8_kern ps_q8_ref_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_avx2_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_avx512_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_avx512vnni_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_neon_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_neondot_kerns[PS_TYPE_COUNT];
extern const ps_q8_kern ps_q8_avx512amx_kerns[PS_TYPE_COUNT];

/* The kernel family isa uses for type t, after fallback; NULL for unsupported types. */
const ps_q8_kern *ps_q8_kern_get(ps_isa isa, uint32_t t);

/* Activation formats of the ref kernels ------------------------------------------------
 * The SIMD families reorder these (see their files) but hold the very same numbers: every
 * family quantizes a row to the same d and q values, so families differ only in the order
 * of float additions. */

/* 32-element activation block for the q4_0/q4_1/q5_0/q5_1/q8_0 weights. */
typedef struct {
    float d;          /* scale: value d * q */
    int32_t sum;      /* sum of qs */
    int8_t qs[PS_QK]; /* q = nearest-even(x / d) in [-127, 127] */
} ps_xq32;
_Static_assert(sizeof(ps_xq32) == 40, "xq32 size");

/* The K types take ps_block_q8_K (d = max|x| / 127, q as above, bsums over 16). */

/* Shared quantization step: d = max|x| / 127 over n floats (0 for an all-zero block) and
 * returns 1 / d (0 when d is 0). Every family uses exactly these float operations. */
float ps_xq_scale(const float *x, int n, float *d_out);

/* nearest-even(v * id) clamped to [-127, 127]: the one rounding rule of every family. */
int8_t ps_xq_round(float v, float id);

#endif
