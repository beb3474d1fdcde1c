/* f32_kern.h - the f32-activation kernels behind ps_gemm (internal to src/tensor/ and
 * tests). File scheme: f32_<isa>.c are the kernels whose activations stay float32, against
 * weights dequantized to float32 (gemm.h's canonical arithmetic); q8_<isa>.c (q8_kern.h)
 * are ps_matmul's, which quantize activations to 8-bit blocks. A family's kernels are one
 * table indexed by ps_type (ps_f32_<isa>_kerns): adding a type is one row per family.
 *
 * Every kernel follows the canonical arithmetic of gemm.h exactly; they differ only in
 * how many (row, token) accumulators they keep in registers at once.
 *
 * Two paths:
 *   fused  - small batches (decode, speculation: n_tok <= fused_max): each weight block
 *            is dequantized in registers and used at once against a pass of tokens;
 *            nothing is written but y.
 *   panel  - larger batches (prefill): `pack` dequantizes a block of rows × a column
 *            chunk into an f32 panel (cache resident), then `tile` runs a register-tiled
 *            micro-kernel of mr rows × up to nr tokens over it. The 16-lane accumulators
 *            of a tile survive from one column chunk to the next in a `part` buffer, so
 *            the per-lane FMA sequence is the same as the fused path's.
 *
 * Panel layout (pack writes, tile reads): rows are grouped in strips of mr rows; a strip
 * of a chunk of kc columns holds, for step k < ceil(kc / 16), for row i < mr, the 16
 * values W[i][16k .. 16k + 16) (relative to the strip's first row and the chunk's first
 * column): strip[(k * mr + i) * 16 + l]. Rows past the matrix's end and columns past kc
 * are zero. */
#ifndef PS_TENSOR_F32_KERN_H
#define PS_TENSOR_F32_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"

/* Rows per panel (per work item): a multiple of every ISA's mr (24 and 32 measured no
 * faster on Zen 4). */
#define PS_F32_MC 16
/* Tokens per token block of the panel path (bounds the partial-sum buffer). */
#define PS_F32_TB 128
/* Largest nr of any ISA (sizes the partial-sum buffer). */
#define PS_F32_NR_MAX 8

/* tile modes */
#define PS_F32_FIRST 1 /* start the accumulators at +0 (else load them from part) */
#define PS_F32_LAST  2 /* reduce and write y (else store the accumulators to part) */

/* For rows r < nrows and tokens t < nt: y[t * ys + r] = canonical dot of weight row r
 * (at w + r * wb, cols columns) with x + t * xs. */
typedef void (*ps_f32_fused_fn)(const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt,
                                float *y, int64_t ys, int64_t nrows);

/* Dequantizes columns [c0, c0 + kc) of rows [0, nrows) (row r at w + r * wb) into
 * ceil(nrows / mr) strips laid out as above, strip s at panel + s * mr * ceil16(kc).
 * nrows <= PS_F32_MC; c0 is a multiple of 256; kc is a multiple of the type's block
 * size. panel is 64-byte aligned. */
typedef void (*ps_f32_pack_fn)(const uint8_t *w, size_t wb, int64_t c0, int64_t kc, int64_t nrows, float *panel);

/* One micro-tile: strip rows [0, mr) × tokens [0, nt) (nt <= nr) over kc columns; x
 * points at token 0's first column of the chunk, token t at x + t * xs. Accumulators
 * start at +0 (mode & FIRST) or from part; at the end they are stored to part, or
 * (mode & LAST) reduced and written to y[t * ys + i] for i < nrows (<= mr). part holds
 * mr * nr * 16 floats, 64-byte aligned. */
typedef void (*ps_f32_tile_fn)(const float *strip, int64_t kc, const float *x, int64_t xs, int64_t nt, float *part,
                               int mode, float *y, int64_t ys, int64_t nrows);

typedef struct {
    ps_f32_fused_fn fused; /* NULL: the family lacks the type */
    ps_f32_pack_fn pack;   /* NULL: the family has no panel path (fused for every n_tok) */
    ps_f32_tile_fn tile;
    int fused_max; /* n_tok up to this go through fused, larger ones through panels */
    int mr, nr;    /* tile rows (divides PS_F32_MC) and tokens (<= PS_F32_NR_MAX) */
    int kc;        /* column chunk of a panel: a multiple of 256 (the K super-block) */
} ps_f32_kern;

/* Sets the column chunk of the panel path for every family (a positive multiple of 256;
 * 0 restores each family's own) for the calls that follow, scratch sizes included: for
 * tests, which need several chunks on small matrices, and for tuning. Not safe while
 * another thread is inside ps_gemm. */
void ps_gemm_set_chunk(int64_t kc);

/* Per-family tables, indexed by ps_type: an entry with fused NULL is a type the family
 * lacks (every entry, for a family not compiled for this architecture). */
extern const ps_f32_kern ps_f32_ref_kerns[PS_TYPE_COUNT];
extern const ps_f32_kern ps_f32_avx2_kerns[PS_TYPE_COUNT];
extern const ps_f32_kern ps_f32_avx512_kerns[PS_TYPE_COUNT];

#endif
