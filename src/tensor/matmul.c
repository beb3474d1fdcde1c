/* matmul.c - ps_matmul: quantizes the activations once, then runs the chosen kernel
 * family's tiles over (token block, row chunk) work items shared among the pool's threads.
 *
 * Splitting is by rows and tokens only; every output element comes from one kernel call
 * whose per-element arithmetic does not depend on the split (see cpu.h), so results are
 * bit-identical whatever the thread count or batch size. */
#include "matmul.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cpu.h"

/* Activation bytes a token block may take (it is re-read once per row tile, from L2). */
#define TOKEN_BLOCK_BYTES (384 * 1024)
/* Below this many multiply-adds a matmul runs on the calling thread alone. */
#define SERIAL_MACS 65536
/* Row chunks per thread (more balance the load, fewer cost less claiming). */
#define CHUNKS_PER_THREAD 4
/* Weight bytes of a row chunk when there are several token tiles: the kernels sweep the
 * chunk once per token tile, so it should stay in L2. */
#define CHUNK_BYTES (256 * 1024)

// Kernel family

static atomic_int g_isa = -1; /* ps_isa, or -1 before the first use */

/* The family named by name (case-insensitive), or -1. */
static int isa_from_name(const char *name) {
    for (int i = 0; i < PS_ISA_COUNT; i++)
        if (strcasecmp(name, ps_isa_name((ps_isa)i)) == 0) return i;
    return -1;
}

/* The family in use: PS_ISA when set and available, else the best one. */
static ps_isa current_isa(void) {
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa >= 0) return (ps_isa)isa;
    const char *env = getenv("PS_ISA");
    isa = env && *env ? isa_from_name(env) : -1;
    if (isa < 0 || !ps_isa_available((ps_isa)isa)) isa = ps_isa_best();
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return (ps_isa)isa;
}

const char *ps_matmul_isa(void) { return ps_isa_name(current_isa()); }

ps_status ps_matmul_set_isa(const char *name) {
    int isa = name ? isa_from_name(name) : -1;
    if (isa < 0) return PS_ERR_ARG;
    if (!ps_isa_available((ps_isa)isa)) return PS_ERR_UNSUPPORTED;
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return PS_OK;
}

bool ps_matmul_supported(uint32_t type) { return ps_kern_ref(type) != NULL; }

/* Scratch for the largest activation format any available family uses, plus room to
 * align the start to 64 bytes. */
size_t ps_matmul_scratch_bytes(uint32_t type, int64_t cols, int64_t n_tok) {
    size_t row = 0;
    for (int i = 0; i < PS_ISA_COUNT; i++) {
        if (!ps_isa_available((ps_isa)i)) continue;
        const ps_kernel *k = ps_kernel_get((ps_isa)i, type);
        if (k && k->quant && k->x_bytes(cols) > row) row = k->x_bytes(cols);
    }
    return n_tok > 0 && row ? 64 + row * (size_t)n_tok : 0;
}

// Work plan

typedef struct {
    const ps_kernel *k;
    const float *x;      /* f32 activations */
    int64_t x_stride;    /* floats */
    const uint8_t *w;    /* weight rows */
    size_t wb;           /* bytes per weight row */
    int64_t rows, cols;
    const uint8_t *xq;   /* activations as the kernel reads them */
    size_t xs;           /* bytes per activation row */
    int64_t n_tok;
    float *y;
    int64_t ys;
    int64_t chunk_rows, n_chunks; /* row chunks (multiples of the tile height) */
    int64_t tok_block, n_tblocks; /* token blocks */
    atomic_llong next;            /* next unclaimed work item beyond the first nth */
} mm_job;

/* Quantizes this thread's share of the activation rows. */
static void quant_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t t0 = j->n_tok * ith / nth, t1 = j->n_tok * (ith + 1) / nth;
    for (int64_t t = t0; t < t1; t++)
        j->k->quant(j->x + t * j->x_stride, (void *)(j->xq + (size_t)t * j->xs), j->cols);
}

/* Runs work item i: token block i / n_chunks, row chunk i % n_chunks. */
static void run_item(mm_job *j, int64_t i) {
    int64_t tb = i / j->n_chunks, rc = i % j->n_chunks;
    int64_t r0 = rc * j->chunk_rows, t0 = tb * j->tok_block;
    int64_t nr = j->rows - r0 < j->chunk_rows ? j->rows - r0 : j->chunk_rows;
    int64_t nt = j->n_tok - t0 < j->tok_block ? j->n_tok - t0 : j->tok_block;
    j->k->gemm(j->w + (size_t)r0 * j->wb, j->wb, j->cols, j->xq + (size_t)t0 * j->xs, j->xs,
               j->y + t0 * j->ys + r0, j->ys, nr, nt);
}

/* Thread ith takes item ith first, then claims items from the shared counter. */
static void mm_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t n = j->n_chunks * j->n_tblocks;
    for (int64_t i = ith; i < n; i = nth + atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed))
        run_item(j, i);
}

/* Chooses token blocks that fit TOKEN_BLOCK_BYTES and row chunks aligned to the tile. */
static void plan(mm_job *j, int nth) {
    int64_t tt = j->k->tile_toks, tr = j->k->tile_rows;
    int64_t tb = (int64_t)(TOKEN_BLOCK_BYTES / (j->xs ? j->xs : 1));
    tb = tb / tt * tt;
    j->tok_block = tb < tt ? tt : tb > j->n_tok ? j->n_tok : tb;
    j->n_tblocks = (j->n_tok + j->tok_block - 1) / j->tok_block;
    int64_t want = nth > 1 ? (int64_t)nth * CHUNKS_PER_THREAD : 1;
    int64_t cr = (j->rows + want - 1) / want;
    if (j->n_tok > tt && cr * (int64_t)j->wb > CHUNK_BYTES) cr = CHUNK_BYTES / (int64_t)j->wb;
    cr = (cr + tr - 1) / tr * tr;
    j->chunk_rows = cr;
    j->n_chunks = (j->rows + cr - 1) / cr;
}

void ps_matmul(const ps_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
               void *scratch, ps_pool *pool) {
    const ps_kernel *k = ps_kernel_get(current_isa(), w->type);
    if (!k || n_tok <= 0 || w->rows <= 0) return;
    mm_job *j = &(mm_job){.k = k, .x = x, .x_stride = x_stride, .w = w->data, .rows = w->rows, .cols = w->cols,
                          .n_tok = n_tok, .y = y, .ys = y_stride};
    j->wb = ps_row_bytes(w->type, w->cols);
    int nth = (double)w->rows * (double)w->cols * (double)n_tok < SERIAL_MACS ? 1 : ps_pool_size(pool);
    if (k->quant) {
        j->xq = (const uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        j->xs = k->x_bytes(w->cols);
        if (n_tok >= 8 && nth > 1) ps_pool_run(pool, quant_task, j);
        else quant_task(j, 0, 1);
    } else {
        j->xq = (const uint8_t *)x;
        j->xs = (size_t)x_stride * sizeof(float);
    }
    plan(j, nth);
    atomic_init(&j->next, 0);
    if (nth > 1) ps_pool_run(pool, mm_task, j);
    else mm_task(j, 0, 1);
}
