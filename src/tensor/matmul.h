/* matmul.h - weight × activation products with 8-bit activations (ps_matmul_*): each
 * activation row is quantized to 8-bit blocks and meets the weights in integer dot
 * products, llama.cpp's numerics (kernels: q8_<isa>.c, q8_kern.h). The f32-activation
 * products are gemm.h's (kernels: f32_<isa>.c). ps_mat is shared by both.
 *
 * The one contract everything above relies on (DESIGN.md invariant 1): every output
 * element y[t][r] is computed by the same sequence of floating-point operations whatever
 * n_tok is, whatever the thread count, and however rows are split among threads. Work is
 * split over rows and tokens, never inside a reduction. */
#ifndef PS_TENSOR_MATMUL_H
#define PS_TENSOR_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ps.h"
#include "pool.h"
#include "types.h"

/* Matrices ------------------------------------------------------------------------- */
typedef struct {
    uint32_t type;    /* ps_type of the weights */
    int64_t rows;     /* output features */
    int64_t cols;     /* input features (a multiple of the type's block size) */
    const void *data; /* rows × ps_row_bytes(type, cols) bytes, row-major, e.g. into a mapping */
} ps_mat;

/* True when ps_matmul handles weights of this type. */
bool ps_matmul_supported(uint32_t type);

/* Bytes of scratch ps_matmul needs for n_tok activation rows of `cols` against weights of
 * `type` (the activations quantized to the format the type's kernel consumes). Allocate
 * once, at set-up, for the largest n_tok and cols. */
size_t ps_matmul_scratch_bytes(uint32_t type, int64_t cols, int64_t n_tok);

/* y[t * y_stride + r] = sum_c W[r, c] * x[t * x_stride + c] for t < n_tok, r < w->rows.
 * Scratch holds at least ps_matmul_scratch_bytes(w->type, w->cols, n_tok) bytes. */
void ps_matmul(const ps_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
               void *scratch, ps_pool *pool);

/* Several matrices that share their input: ys[i][t * y_strides[i] + r] = sum_c W_i[r, c] *
 * x[t * x_stride + c]. Types and row counts may differ; matrices of equal cols (the usual
 * case: wq/wk/wv, or w1/w3) go through one quantization per activation format and one
 * pool dispatch, which matters for the small matmuls of decode. Each output element is
 * bit-identical to what ps_matmul gives for it. Scratch: ps_matmul_multi_scratch_bytes. */
void ps_matmul_multi(const ps_mat *const *ws, int n, const float *x, int64_t x_stride, int64_t n_tok, float *const *ys,
                     const int64_t *y_strides, void *scratch, ps_pool *pool);
size_t ps_matmul_multi_scratch_bytes(const ps_mat *const *ws, int n, int64_t n_tok);

/* Name of the kernel family chosen for this CPU ("avx512vnni", "avx2", "ref", ...). The
 * environment variable PS_ISA=ref|avx2|avx512|avx512vnni|avx512amx|neon|neondot forces a
 * family (for tests). */
const char *ps_matmul_isa(void);

/* Forces the kernel family `name` (as PS_ISA does) for the calls that follow: PS_ERR_ARG
 * for an unknown name, PS_ERR_UNSUPPORTED when this CPU lacks the family. For tests and
 * benchmarks; not safe while another thread is inside ps_matmul. */
ps_status ps_matmul_set_isa(const char *name);

#endif
