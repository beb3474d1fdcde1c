/* matmul.c - ps_matmul: quantizes the activations once, then runs the chosen 8-bit-
 * activation kernel family's tiles (q8_<isa>.c) over (token block, row chunk) work
 * items shared among the pool's threads.
 *
 * Splitting is by rows and tokens only; every output element comes from one kernel call
 * whose per-element arithmetic does not depend on the split (see q8_kern.h), so results are
 * bit-identical whatever the thread count or batch size. */
#include "matmul.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "q8_kern.h"

/* Activation bytes a token block may take: a work item sweeps its row chunk once per token
 * tile of the block, so the block's activations should stay in L2 beside the chunk. */
#define TOKEN_BLOCK_BYTES (384 * 1024)
/* The same for kernels with gemm_tiled, of their tiles: such a kernel sweeps each 16-row
 * tile's weights once and re-reads the tokens' tiles for every row tile; more tokens a call
 * spread its per-row-tile work (block scales, unpacked quants) wider. */
#define TILED_BLOCK_BYTES (1024 * 1024)
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

bool ps_matmul_supported(uint32_t type) { return ps_q8_kern_get(PS_ISA_REF, type) != NULL; }

/* Tiles of n_tok tokens: the whole ones and a partial last one of PS_Q8_TILE_MIN or more. */
static int64_t n_tiles(int64_t n_tok) {
    return n_tok / PS_Q8_TILE_TOKENS + (n_tok % PS_Q8_TILE_TOKENS >= PS_Q8_TILE_MIN);
}

/* Bytes of the tiles of n_tok tokens for kernel k (0: k does not take tiles). */
static size_t tiles_bytes(const ps_q8_kern *k, int64_t cols, int64_t n_tok) {
    return k->tiles_bytes ? k->tiles_bytes(cols) * (size_t)n_tiles(n_tok) : 0;
}

/* Scratch for the largest activation format (and tiles) any available family uses, plus
 * room to align the start to 64 bytes. */
size_t ps_matmul_scratch_bytes(uint32_t type, int64_t cols, int64_t n_tok) {
    size_t need = 0;
    for (int i = 0; n_tok > 0 && i < PS_ISA_COUNT; i++) {
        if (!ps_isa_available((ps_isa)i)) continue;
        const ps_q8_kern *k = ps_q8_kern_get((ps_isa)i, type);
        size_t n = k && k->quant ? k->x_bytes(cols) * (size_t)n_tok + tiles_bytes(k, cols, n_tok) : 0;
        if (n > need) need = n;
    }
    return need ? 64 + need : 0;
}

/* Room for each matrix's own activations: enough however they share formats. */
size_t ps_matmul_multi_scratch_bytes(const ps_mat *const *ws, int n, int64_t n_tok) {
    size_t sum = 0;
    for (int i = 0; i < n; i++) sum += ps_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, n_tok);
    return sum;
}

// Work plan

#define MULTI_MAX 8 /* matrices per job (ps_matmul_multi runs longer lists in batches) */

/* One matrix of a job. */
typedef struct {
    const ps_q8_kern *k;
    const uint8_t *w; /* weight rows, wb bytes each */
    size_t wb;
    int64_t rows;
    float *y;
    int64_t ys;
    const uint8_t *xq; /* activations as its kernel reads them, xs bytes per row */
    size_t xs;
    const uint8_t *xt; /* their 16-token tiles (kernels with gemm_tiled), tb bytes each; or NULL */
    size_t tb;
    int64_t chunk_rows, n_chunks; /* row chunks (multiples of the tile height) */
    int64_t tok_block, n_tblocks; /* token blocks */
    int64_t first_item;           /* its work items: [first_item, + n_chunks * n_tblocks) */
} mm_part;

typedef struct {
    const float *x; /* f32 activations, x_stride floats apart */
    int64_t x_stride, cols, n_tok;
    int n;
    mm_part p[MULTI_MAX];
    int quant[MULTI_MAX]; /* parts whose activations must be quantized (one per format) */
    int n_quant;
    int tiled[MULTI_MAX]; /* parts whose tiles must be made (one per format) */
    int n_tiled;
    int64_t n_items;
    atomic_llong next; /* next unclaimed work item beyond the first nth */
} mm_job;

/* Quantizes this thread's share of the (format, token) rows. */
static void quant_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t n = j->n_quant * j->n_tok, i0 = n * ith / nth, i1 = n * (ith + 1) / nth;
    for (int64_t i = i0; i < i1; i++) {
        const mm_part *p = &j->p[j->quant[i / j->n_tok]];
        int64_t t = i % j->n_tok;
        p->k->quant(j->x + t * j->x_stride, (void *)(p->xq + (size_t)t * p->xs), j->cols);
    }
}

/* Makes this thread's share of the (format, 16-token tile) tiles. */
static void tiles_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int64_t per = n_tiles(j->n_tok), n = j->n_tiled * per, i0 = n * ith / nth, i1 = n * (ith + 1) / nth;
    for (int64_t i = i0; i < i1; i++) {
        const mm_part *p = &j->p[j->tiled[i / per]];
        int64_t t0 = i % per * PS_Q8_TILE_TOKENS, left = j->n_tok - t0;
        p->k->tiles(p->xq + (size_t)t0 * p->xs, p->xs, left < PS_Q8_TILE_TOKENS ? (int)left : PS_Q8_TILE_TOKENS,
                    j->cols, (uint8_t *)p->xt + (size_t)(t0 / PS_Q8_TILE_TOKENS) * p->tb);
    }
}

/* Runs work item i of part p: token block, then row chunk. */
static void run_item(const mm_job *j, const mm_part *p, int64_t i) {
    int64_t tb = i / p->n_chunks, rc = i % p->n_chunks;
    int64_t r0 = rc * p->chunk_rows, t0 = tb * p->tok_block;
    int64_t nr = p->rows - r0 < p->chunk_rows ? p->rows - r0 : p->chunk_rows;
    int64_t nt = j->n_tok - t0 < p->tok_block ? j->n_tok - t0 : p->tok_block;
    const uint8_t *w = p->w + (size_t)r0 * p->wb, *x = p->xq + (size_t)t0 * p->xs;
    float *y = p->y + t0 * p->ys + r0;
    if (p->xt) /* t0 is a multiple of the tile (plan) */
        p->k->gemm_tiled(w, p->wb, j->cols, x, p->xs, p->xt + (size_t)(t0 / PS_Q8_TILE_TOKENS) * p->tb, y, p->ys, nr,
                         nt);
    else
        p->k->gemm(w, p->wb, j->cols, x, p->xs, y, p->ys, nr, nt);
}

/* Thread ith takes item ith first, then claims items from the shared counter. */
static void mm_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int part = 0;
    for (int64_t i = ith; i < j->n_items; i = nth + atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) {
        while (part > 0 && i < j->p[part].first_item) part--;
        while (part + 1 < j->n && i >= j->p[part + 1].first_item) part++;
        run_item(j, &j->p[part], i - j->p[part].first_item);
    }
}

/* Chooses token blocks that fit TOKEN_BLOCK_BYTES and row chunks aligned to the tile. */
static void plan(mm_part *p, int64_t n_tok, int nth) {
    int64_t tt = p->xt ? PS_Q8_TILE_TOKENS : p->k->tile_toks, tr = p->xt ? PS_Q8_TILE_ROWS : p->k->tile_rows;
    int64_t tb = p->xt ? (int64_t)(TILED_BLOCK_BYTES / (p->tb / PS_Q8_TILE_TOKENS))
                       : (int64_t)(TOKEN_BLOCK_BYTES / (p->xs ? p->xs : 1));
    tb = tb / tt * tt;
    p->tok_block = tb < tt ? tt : tb > n_tok ? n_tok : tb;
    p->n_tblocks = (n_tok + p->tok_block - 1) / p->tok_block;
    int64_t want = nth > 1 ? (int64_t)nth * CHUNKS_PER_THREAD : 1;
    int64_t cr = (p->rows + want - 1) / want;
    if (n_tok > tt && cr * (int64_t)p->wb > CHUNK_BYTES) cr = CHUNK_BYTES / (int64_t)p->wb;
    cr = (cr + tr - 1) / tr * tr;
    p->chunk_rows = cr;
    p->n_chunks = (p->rows + cr - 1) / cr;
}

/* Sets up part i for matrix w; activations (and tiles) that an earlier part already makes
 * in the same format are shared, others take the next slices of scratch (*at). */
static void part_init(mm_job *j, int i, const ps_mat *w, float *y, int64_t ys, const ps_q8_kern *k, uint8_t **at) {
    mm_part *p = &j->p[i];
    *p = (mm_part){.k = k, .w = w->data, .wb = ps_row_bytes(w->type, w->cols), .rows = w->rows, .y = y, .ys = ys};
    if (!k->quant) {
        p->xq = (const uint8_t *)j->x;
        p->xs = (size_t)j->x_stride * sizeof(float);
        return;
    }
    p->xs = k->x_bytes(j->cols);
    size_t tiles = tiles_bytes(k, j->cols, j->n_tok);
    p->tb = tiles ? k->tiles_bytes(j->cols) : 0;
    for (int q = 0; q < j->n_quant && !p->xq; q++) {
        const mm_part *o = &j->p[j->quant[q]];
        if (o->k->quant == k->quant && o->xs == p->xs) p->xq = o->xq;
    }
    if (!p->xq) {
        p->xq = *at;
        *at += p->xs * (size_t)j->n_tok;
        j->quant[j->n_quant++] = i;
    }
    for (int q = 0; q < j->n_tiled && tiles && !p->xt; q++) {
        const mm_part *o = &j->p[j->tiled[q]];
        if (o->xq == p->xq && o->k->tiles == k->tiles) p->xt = o->xt;
    }
    if (tiles && !p->xt) {
        p->xt = *at;
        *at += tiles;
        j->tiled[j->n_tiled++] = i;
    }
}

/* Quantizes, plans and runs a job of n <= MULTI_MAX matrices of equal cols. */
static void run_job(const ps_mat *const *ws, int n, const float *x, int64_t x_stride, int64_t n_tok, float *const *ys,
                    const int64_t *y_strides, void *scratch, ps_pool *pool) {
    mm_job *j = &(mm_job){.x = x, .x_stride = x_stride, .cols = ws[0]->cols, .n_tok = n_tok};
    uint8_t *at = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    double macs = 0;
    ps_isa isa = current_isa();
    for (int i = 0; i < n; i++) {
        const ps_q8_kern *k = ps_q8_kern_get(isa, ws[i]->type);
        if (!k || ws[i]->rows <= 0) continue;
        part_init(j, j->n, ws[i], ys[i], y_strides[i], k, &at);
        j->n++;
        macs += (double)ws[i]->rows * (double)ws[i]->cols * (double)n_tok;
    }
    int nth = macs < SERIAL_MACS ? 1 : ps_pool_size(pool);
    if (j->n_quant && n_tok * j->n_quant >= 8 && nth > 1)
        ps_pool_run(pool, quant_task, j);
    else if (j->n_quant)
        quant_task(j, 0, 1);
    if (j->n_tiled && nth > 1)
        ps_pool_run(pool, tiles_task, j);
    else if (j->n_tiled)
        tiles_task(j, 0, 1);
    for (int i = 0; i < j->n; i++) {
        plan(&j->p[i], n_tok, nth);
        j->p[i].first_item = j->n_items;
        j->n_items += j->p[i].n_chunks * j->p[i].n_tblocks;
    }
    atomic_init(&j->next, 0);
    if (nth > 1)
        ps_pool_run(pool, mm_task, j);
    else
        mm_task(j, 0, 1);
}

void ps_matmul(const ps_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
               void *scratch, ps_pool *pool) {
    if (n_tok <= 0) return;
    run_job(&w, 1, x, x_stride, n_tok, &y, &y_stride, scratch, pool);
}

void ps_matmul_multi(const ps_mat *const *ws, int n, const float *x, int64_t x_stride, int64_t n_tok, float *const *ys,
                     const int64_t *y_strides, void *scratch, ps_pool *pool) {
    if (n_tok <= 0) return;
    for (int i0 = 0; i0 < n;) {
        int m = 1; /* a batch: up to MULTI_MAX matrices with the same cols */
        while (i0 + m < n && m < MULTI_MAX && ws[i0 + m]->cols == ws[i0]->cols) m++;
        run_job(ws + i0, m, x, x_stride, n_tok, ys + i0, y_strides + i0, scratch, pool);
        i0 += m;
    }
}
