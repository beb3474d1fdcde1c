/* matmul.h - weight × activation products and the thread pool that runs them.
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
#include "types.h"

/* Thread pool ---------------------------------------------------------------------- */
typedef struct ps_pool ps_pool;

/* A pool of n_threads workers in all (the calling thread is one of them, so n_threads == 1
 * starts no thread). */
ps_status ps_pool_create(int n_threads, ps_pool **out);
void ps_pool_free(ps_pool *p); /* NULL is a no-op */
/* Pins thread i of the pool to the i-th CPU (mod their count) of those this process could
 * use when ps_pool_pin was first called (ps_first_cpus); thread 0 is the calling thread,
 * which must be the one that calls ps_pool_run (threads it starts later inherit its CPU:
 * they call ps_thread_unpin). Keeps the scheduler from stacking two of the pool's threads
 * on one core, or moving them, when other processes (the other stages of a split model on
 * one host) wake and sleep beside it. Linux only; elsewhere PS_ERR_UNSUPPORTED. */
ps_status ps_pool_pin(ps_pool *p, char *err, size_t errlen);
int ps_pool_size(const ps_pool *p);
/* Runs fn(ctx, ith, nth) for ith in [0, nth) on the pool's threads (the caller runs ith 0)
 * and returns when all have returned. Not reentrant: fn must not call ps_pool_run. */
void ps_pool_run(ps_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);
/* Tells idle workers to stop spinning: call it before blocking on something slow (a
 * network hop), so that spinning threads do not take the cores from another process
 * (another stage on the same host). They sleep; in a pinned pool (ps_pool_pin) they
 * first yield their cores for a few ms, so that the next ps_pool_run finds them awake
 * without having to wake them. The next ps_pool_run, or ps_pool_wake, ends it. */
void ps_pool_park(ps_pool *p);
/* How long parked workers yield their cores before they sleep, in ns: 0 (sleep at once)
 * until ps_pool_pin sets 8 ms. Tests lengthen it, so that a loaded host that delays their
 * look cannot outlast it. */
void ps_pool_set_park_yield(ps_pool *p, long long ns);
/* Undoes ps_pool_park ahead of time: sleeping workers wake and spin, so that the next
 * ps_pool_run does not wait for them to be scheduled (call it when input arrives, before
 * decoding it). */
void ps_pool_wake(ps_pool *p);

/* Matrices ------------------------------------------------------------------------- */
typedef struct {
    uint32_t type;     /* ps_type of the weights */
    int64_t rows;      /* output features */
    int64_t cols;      /* input features (a multiple of the type's block size) */
    const void *data;  /* rows × ps_row_bytes(type, cols) bytes, row-major, e.g. into a mapping */
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
 * environment variable PS_ISA=ref|avx2|avx512|avx512vnni|neon|neondot forces a family (for
 * tests). */
const char *ps_matmul_isa(void);

/* Forces the kernel family `name` (as PS_ISA does) for the calls that follow: PS_ERR_ARG
 * for an unknown name, PS_ERR_UNSUPPORTED when this CPU lacks the family. For tests and
 * benchmarks; not safe while another thread is inside ps_matmul. */
ps_status ps_matmul_set_isa(const char *name);

#endif
