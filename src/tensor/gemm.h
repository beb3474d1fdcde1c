/* gemm.h - f32-activation matmul against quantized weights (ps_gemm_*; kernels:
 * f32_<isa>.c, f32_kern.h). The 8-bit-activation products are matmul.h's (q8_<isa>.c).
 *
 * Activations stay float32 (8-bit activations lose too much accuracy); weights are
 * dequantized to float32 exactly as ps_dequantize_row does and multiplied with fused
 * multiply-adds, accumulated in float32.
 *
 * Canonical arithmetic (every ISA, every batch size, every thread count):
 *
 *     w[c]   = ps_dequantize_row's value of W[r][c]          (bit for bit)
 *     acc[l] = +0.0f                                      for l < 16
 *     for c = 0, 1, ..., cols - 1:                        (increasing c)
 *         acc[c % 16] = fmaf(w[c], x[t][c], acc[c % 16])  (one rounding)
 *     s8[i] = acc[i] + acc[i + 8]                         for i < 8
 *     s4[i] = s8[i] + s8[i + 4]                           for i < 4
 *     s2[i] = s4[i] + s4[i + 2]                           for i < 2
 *     y[t][r] = s2[0] + s2[1]
 *
 * The ref kernel spells this out with fmaf(); the AVX2 kernels hold the 16 lanes in two
 * ymm registers, the AVX-512 kernels in one zmm. Hence y is bit-identical whatever the
 * ISA, n_tok, a token's place in the batch, the thread count or the row split
 * (DESIGN.md invariant 1, and beyond: across ISAs too). */
#ifndef PS_TENSOR_GEMM_H
#define PS_TENSOR_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ps.h"
#include "matmul.h"
#include "types.h"

/* True when ps_gemm handles weights of this type (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). */
bool ps_gemm_supported(uint32_t type);

/* Bytes of scratch ps_gemm needs for weights of `type` with `cols` columns, up to n_tok
 * activation rows, run on a pool of at most n_threads threads (per-thread dequantized
 * weight panels and partial sums; 0 when such calls need none). Allocate once, at
 * set-up, for the largest n_tok and cols; it covers every ISA ps_gemm_set_isa may pick. */
size_t ps_gemm_scratch_bytes(uint32_t type, int64_t cols, int64_t n_tok, int n_threads);

/* y[t * y_stride + r] = sum_c W[r, c] * x[t * x_stride + c] for t < n_tok, r < w->rows,
 * in the canonical arithmetic above. Scratch holds ps_gemm_scratch_bytes(w->type,
 * w->cols, n_tok, n) bytes for some n >= ps_pool_size(pool) (any alignment); NULL makes
 * large batches take the slower scratch-free path (same results). pool may be NULL (one
 * thread). Allocates nothing. Does nothing for an unsupported type, or when w->cols is
 * not a multiple of the type's block size. */
void ps_gemm(const ps_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
             void *scratch, ps_pool *pool);

/* Name of the kernel family in use: "avx512", "avx2" or "ref". The environment variable
 * PS_ISA=ref|avx2|avx512 forces one (read at the first call; a family this CPU lacks,
 * or an unknown name, gives the best available; "avx512vnni" means "avx512"). */
const char *ps_gemm_isa(void);

/* Forces the family `name` for the calls that follow (as PS_ISA does): PS_ERR_ARG for an
 * unknown name, PS_ERR_UNSUPPORTED when this CPU lacks it. For tests and benchmarks; not
 * safe while another thread is inside ps_gemm. */
ps_status ps_gemm_set_isa(const char *name);

#endif
