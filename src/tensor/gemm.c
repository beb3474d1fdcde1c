/* gemm.c - ps_gemm: picks the f32-activation kernel family (f32_<isa>.c), then shares
 * row chunks among the pool's threads.
 *
 * Small batches (n_tok <= the family's fused_max) run the fused kernel over row chunks:
 * weights are dequantized in registers and nothing is written but y. Larger batches
 * run, per work item of PS_F32_MC rows and per token block, over column chunks (the
 * family's kc): dequantize the rows' chunk into this thread's panel, then run the
 * register-tiled micro-kernel over every token group and row strip, keeping each tile's
 * 16-lane accumulators in this thread's partial-sum buffer between chunks.
 *
 * Work is split by rows only (items are claimed from a shared counter); every output
 * element comes from one thread, in the canonical arithmetic of gemm.h, so results do
 * not depend on the split. */
#include "gemm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>

#include "f32_kern.h"

/* Below this many multiply-adds a call runs on the calling thread alone. */
#define SERIAL_MACS 65536
/* Row chunks per thread on the fused path (more balance the load, fewer cost less). */
#define CHUNKS_PER_THREAD 4
/* Row chunks are multiples of this (a multiple of every family's row group). */
#define ROW_ALIGN 16

// Kernel family

enum { ISA_REF, ISA_AVX2, ISA_AVX512, ISA_COUNT };

static const char *const isa_names[ISA_COUNT] = {"ref", "avx2", "avx512"};

static atomic_int g_isa = -1; /* the family in use, or -1 before the first call */
static int64_t g_kc = 0;      /* column chunk forced by ps_gemm_set_chunk, or 0 */

/* True when this CPU (with OS support for the registers) runs family isa. */
static bool isa_available(int isa) {
    if (isa == ISA_REF) return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (isa == ISA_AVX2) return avx2;
    if (isa == ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return false;
}

static int isa_best(void) {
    for (int i = ISA_COUNT - 1; i > 0; i--)
        if (isa_available(i)) return i;
    return ISA_REF;
}

/* The family named (case-insensitively) by name, or -1; "avx512vnni" and "avx512amx"
 * (ps_matmul's families) map to avx512. */
static int isa_from_name(const char *name) {
    if (strcasecmp(name, "avx512vnni") == 0 || strcasecmp(name, "avx512amx") == 0) return ISA_AVX512;
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcasecmp(name, isa_names[i]) == 0) return i;
    return -1;
}

/* The family in use: PS_ISA when set and available, else the best one. */
static int current_isa(void) {
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa >= 0) return isa;
    const char *env = getenv("PS_ISA");
    isa = env && *env ? isa_from_name(env) : -1;
    if (isa < 0 || !isa_available(isa)) isa = isa_best();
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return isa;
}

/* Each family's table of kernels, indexed by ps_type. */
static const ps_f32_kern *const f32_tables[ISA_COUNT] = {
    [ISA_REF] = ps_f32_ref_kerns, [ISA_AVX2] = ps_f32_avx2_kerns, [ISA_AVX512] = ps_f32_avx512_kerns};

/* Family isa's kernels for type t (NULL when it lacks them). */
static const ps_f32_kern *kern_get(int isa, uint32_t t) {
    if (t >= PS_TYPE_COUNT) return NULL;
    const ps_f32_kern *k = &f32_tables[isa][t];
    return k->fused ? k : NULL;
}

const char *ps_gemm_isa(void) { return isa_names[current_isa()]; }

ps_status ps_gemm_set_isa(const char *name) {
    int isa = name ? isa_from_name(name) : -1;
    if (isa < 0) return PS_ERR_ARG;
    if (!isa_available(isa)) return PS_ERR_UNSUPPORTED;
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return PS_OK;
}

bool ps_gemm_supported(uint32_t type) { return kern_get(ISA_REF, type) != NULL; }

void ps_gemm_set_chunk(int64_t kc) { g_kc = kc > 0 && kc % 256 == 0 ? kc : 0; }

/* The column chunk family k uses. */
static int64_t chunk_of(const ps_f32_kern *k) { return g_kc ? g_kc : k->kc; }

// Scratch

/* Bytes of one thread's panel (chunks of kc columns) and partial sums for token blocks of
 * up to n_tok tokens (a multiple of 64). */
static size_t per_thread_bytes(int64_t n_tok, int64_t kc) {
    int64_t tb = n_tok < PS_F32_TB ? n_tok : PS_F32_TB;
    size_t panel = (size_t)PS_F32_MC * (size_t)kc * sizeof(float);
    size_t part = (size_t)(tb + PS_F32_NR_MAX) * PS_F32_MC * 16 * sizeof(float);
    return (panel + part + 63) & ~(size_t)63;
}

/* The most any available family needs: panels when it would take n_tok tokens that way. */
size_t ps_gemm_scratch_bytes(uint32_t type, int64_t cols, int64_t n_tok, int n_threads) {
    (void)cols;
    size_t most = 0;
    for (int i = 0; i < ISA_COUNT && n_tok > 0 && n_threads > 0; i++) {
        const ps_f32_kern *k = isa_available(i) ? kern_get(i, type) : NULL;
        if (!k || !k->pack || n_tok <= k->fused_max) continue;
        size_t b = 64 + (size_t)n_threads * per_thread_bytes(n_tok, chunk_of(k));
        most = b > most ? b : most;
    }
    return most;
}

// Work items

typedef struct {
    const ps_f32_kern *k;
    const uint8_t *w; /* weight rows */
    size_t wb;        /* bytes per weight row */
    int64_t rows, cols;
    const float *x;
    int64_t xs, n_tok;
    float *y;
    int64_t ys;
    uint8_t *scratch; /* 64-aligned; thread ith's part at ith * per_thread */
    size_t per_thread;
    int64_t kc; /* column chunk of the panel path */
    int64_t chunk_rows, n_chunks;
    void (*item)(const void *job, int64_t i, int ith);
    atomic_llong next; /* next unclaimed item beyond the first nth */
} gemm_job;

/* Fused path: rows [i * chunk_rows, ...) against every token. */
static void fused_item(const void *job, int64_t i, int ith) {
    const gemm_job *j = job;
    (void)ith;
    int64_t r0 = i * j->chunk_rows;
    int64_t nr = j->rows - r0 < j->chunk_rows ? j->rows - r0 : j->chunk_rows;
    j->k->fused(j->w + (size_t)r0 * j->wb, j->wb, j->cols, j->x, j->xs, j->n_tok, j->y + r0, j->ys, nr);
}

/* Every token group and row strip of one column chunk (panel already packed): rows
 * [r0, r0 + nr) × tokens [t0, t0 + nt). */
static void run_tiles(const gemm_job *j, const float *panel, float *part, int64_t r0, int64_t nr, int64_t t0,
                      int64_t nt, int64_t c0, int64_t kc, int mode) {
    const ps_f32_kern *k = j->k;
    int64_t strip = (int64_t)k->mr * ((kc + 15) & ~(int64_t)15);
    int64_t n_strips = (nr + k->mr - 1) / k->mr, tile_floats = (int64_t)k->mr * k->nr * 16;
    for (int64_t g = 0; g * k->nr < nt; g++) {
        int64_t tg = t0 + g * k->nr, ntg = nt - g * k->nr < k->nr ? nt - g * k->nr : k->nr;
        for (int64_t s = 0; s < n_strips; s++) {
            int64_t rs = s * k->mr, nrs = nr - rs < k->mr ? nr - rs : k->mr;
            k->tile(panel + s * strip, kc, j->x + tg * j->xs + c0, j->xs, ntg, part + (g * n_strips + s) * tile_floats,
                    mode, j->y + tg * j->ys + r0 + rs, j->ys, nrs);
        }
    }
}

/* Panel path for rows [r0, r0 + nr) × tokens [t0, t0 + nt): column chunk by chunk. */
static void panel_block(const gemm_job *j, float *panel, float *part, int64_t r0, int64_t nr, int64_t t0, int64_t nt) {
    for (int64_t c0 = 0; c0 < j->cols; c0 += j->kc) {
        int64_t kc = j->cols - c0 < j->kc ? j->cols - c0 : j->kc;
        j->k->pack(j->w + (size_t)r0 * j->wb, j->wb, c0, kc, nr, panel);
        int mode = (c0 == 0 ? PS_F32_FIRST : 0) | (c0 + kc >= j->cols ? PS_F32_LAST : 0);
        run_tiles(j, panel, part, r0, nr, t0, nt, c0, kc, mode);
    }
}

/* Panel path: rows [i * PS_F32_MC, ...) against every token, in balanced token blocks
 * of at most PS_F32_TB (the weights are dequantized once per block). */
static void panel_item(const void *job, int64_t i, int ith) {
    const gemm_job *j = job;
    float *panel = (float *)(j->scratch + (size_t)ith * j->per_thread);
    float *part = panel + PS_F32_MC * j->kc;
    int64_t r0 = i * PS_F32_MC, nr = j->rows - r0 < PS_F32_MC ? j->rows - r0 : PS_F32_MC;
    int64_t nb = (j->n_tok + PS_F32_TB - 1) / PS_F32_TB;
    for (int64_t b = 0; b < nb; b++) {
        int64_t t0 = j->n_tok * b / nb, t1 = j->n_tok * (b + 1) / nb;
        panel_block(j, panel, part, r0, nr, t0, t1 - t0);
    }
}

/* Thread ith takes item ith first, then claims items from the shared counter. */
static void gemm_task(void *ctx, int ith, int nth) {
    gemm_job *j = ctx;
    for (int64_t i = ith; i < j->n_chunks; i = nth + atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed))
        j->item(j, i, ith);
}

/* Row chunks of the fused path: about CHUNKS_PER_THREAD per thread, ROW_ALIGN-aligned. */
static int64_t fused_chunk_rows(int64_t rows, int nth) {
    int64_t want = nth > 1 ? (int64_t)nth * CHUNKS_PER_THREAD : 1;
    int64_t cr = (rows + want - 1) / want;
    return (cr + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
}

/* Fused path or panels: panels for large batches, when the family has them, there are
 * columns to chunk and scratch to hold them (both paths give the same bits). */
static bool use_panels(const ps_f32_kern *k, int64_t cols, int64_t n_tok, const void *scratch) {
    return k->pack && n_tok > k->fused_max && cols > 0 && scratch;
}

void ps_gemm(const ps_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
             void *scratch, ps_pool *pool) {
    const ps_f32_kern *k = kern_get(current_isa(), w->type);
    size_t wb = ps_row_bytes(w->type, w->cols);
    if (!k || n_tok <= 0 || w->rows <= 0 || w->cols < 0 || (!wb && w->cols)) return;
    gemm_job *j = &(gemm_job){.k = k,
                              .w = w->data,
                              .wb = wb,
                              .rows = w->rows,
                              .cols = w->cols,
                              .x = x,
                              .xs = x_stride,
                              .n_tok = n_tok,
                              .y = y,
                              .ys = y_stride};
    int nth = (double)w->rows * (double)w->cols * (double)n_tok < SERIAL_MACS ? 1 : ps_pool_size(pool);
    if (!use_panels(k, w->cols, n_tok, scratch)) {
        j->item = fused_item;
        j->chunk_rows = fused_chunk_rows(w->rows, nth);
    } else {
        j->item = panel_item;
        j->chunk_rows = PS_F32_MC;
        j->scratch = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        j->kc = chunk_of(k);
        j->per_thread = per_thread_bytes(n_tok, j->kc);
    }
    j->n_chunks = (w->rows + j->chunk_rows - 1) / j->chunk_rows;
    atomic_init(&j->next, 0);
    if (nth > 1)
        ps_pool_run(pool, gemm_task, j);
    else
        gemm_task(j, 0, 1);
}
