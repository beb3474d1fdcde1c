/* speed.c - this host's decode speed, as `pipeshard probe` and a worker answering a link
 * probe measure it (model.h, ps_decode_ms_per_gb). */
#include <stdlib.h>

#include "../tensor/matmul.h"
#include "../tensor/pool.h"
#include "model.h"

/* Milliseconds per GB for one-row products over the matrices ws[0..n), timed for about a second. */
static double time_matrices(const ps_mat *const *ws, int n, ps_pool *pool, char *err, size_t errlen) {
    int64_t cols = 0, rows = 0;
    size_t scratch = 0;
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        cols = ws[i]->cols > cols ? ws[i]->cols : cols, rows = ws[i]->rows > rows ? ws[i]->rows : rows;
        size_t s = ps_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, 1);
        scratch = s > scratch ? s : scratch;
        bytes += (double)ws[i]->rows * ps_row_bytes(ws[i]->type, ws[i]->cols);
    }
    float *x = malloc((size_t)cols * sizeof *x), *y = malloc((size_t)rows * sizeof *y);
    void *sc = scratch ? malloc(scratch) : NULL;
    bool ok = x && y && (!scratch || sc);
    double ms = 0;
    int reps = 0;
    if (!ok) ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; ok && i < cols; i++) x[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    double t0 = ps_now();
    for (; ok && (reps < 3 || ps_now() - t0 < 1.0); reps++) {
        double a = ps_now();
        for (int i = 0; i < n; i++) ps_matmul(ws[i], x, ws[i]->cols, 1, y, ws[i]->rows, sc, pool);
        if (reps) ms += (ps_now() - a) * 1000; /* the first pass warms the caches and pages up */
    }
    free(x), free(y), free(sc);
    return ok && reps > 1 ? ms / (reps - 1) / (bytes / 1e9) : 0;
}

/* The synthetic matrices: two Q4_0 matrices of a 1B layer's feed-forward shape. */
#define SYN_ROWS 8192
#define SYN_COLS 2048

/* Bytes of one synthetic matrix. */
static size_t syn_bytes(void) { return ps_row_bytes(PS_TYPE_Q4_0, SYN_COLS) * SYN_ROWS; }

/* The synthetic matrices (random bytes, tame scales), timed. */
static double time_synthetic(ps_pool *pool, char *err, size_t errlen) {
    size_t bytes = syn_bytes();
    uint8_t *p = malloc(2 * bytes);
    if (!p) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory"), 0;
    for (size_t i = 0; i < 2 * bytes; i++) p[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t b = 0; b < 2 * bytes / 18; b++) p[b * 18] = 0, p[b * 18 + 1] = 0x2c; /* d = 1/16 */
    ps_mat a = {PS_TYPE_Q4_0, SYN_ROWS, SYN_COLS, p}, b = {PS_TYPE_Q4_0, SYN_COLS, SYN_ROWS, p + bytes};
    const ps_mat *ws[] = {&a, &b};
    double ms = time_matrices(ws, 2, pool, err, errlen);
    free(p);
    return ms;
}

/* The context a model's decode steps are timed in, after a prompt of PROMPT rows. */
#define PROMPT 16
static const ps_ctx_params TIMED_CTX = {.n_ctx = 512, .max_batch = PROMPT, .act = PS_ACT_Q8};

/* Floats of time_model's input rows and of its output rows (logits or activations). */
static size_t x_floats(const ps_model *m) { return (size_t)PROMPT * m->hp.dim; }
static size_t out_floats(const ps_model *m) {
    return (size_t)PROMPT * (m->hp.dim > m->hp.vocab ? m->hp.dim : m->hp.vocab);
}

/* Milliseconds per GB for decode steps of model m, after a PROMPT-token prompt, timed for
 * about a second. */
static double time_model(const ps_model *m, ps_pool *pool, char *err, size_t errlen) {
    ps_ctx_params cp = TIMED_CTX;
    ps_ctx *c = NULL;
    float *x = calloc(x_floats(m), sizeof *x), *out = malloc(out_floats(m) * sizeof *out);
    int32_t toks[PROMPT] = {1};
    bool ok = x && out;
    if (!ok) ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ok = ok && !ps_ctx_create(m, &cp, pool, &c, err, errlen);
    for (size_t i = 0; x && i < x_floats(m); i++) x[i] = (float)((int)(i * 37 % 101) - 50) / 500.0f;
    double ms = 0;
    int steps = 0, pos = PROMPT;
    if (ok) ok = !ps_forward_stage(c, toks, x, PROMPT, 0, out, 1, err, errlen);
    for (double t0 = ps_now(); ok && pos < cp.n_ctx && (steps < 4 || ps_now() - t0 < 1.0); steps++, pos++) {
        double a = ps_now();
        ok = !ps_forward_stage(c, toks, x, 1, pos, out, 1, err, errlen);
        if (steps) ms += (ps_now() - a) * 1000; /* the first step warms up */
    }
    ps_ctx_free(c);
    free(x), free(out);
    return ok && steps > 1 ? ms / (steps - 1) / (ps_model_decode_weight_bytes(m) / 1e9) : 0;
}

double ps_decode_ms_per_gb(const ps_model *m, int threads, char *err, size_t errlen) {
    ps_pool *pool = NULL;
    if (ps_pool_create(threads, &pool))
        return ps_errf(err, errlen, PS_ERR_NOMEM, "cannot start %d threads", threads), 0;
    double ms = m ? time_model(m, pool, err, errlen) : time_synthetic(pool, err, errlen);
    ps_pool_free(pool);
    return ms;
}

size_t ps_decode_ms_per_gb_bytes(const ps_model *m, int threads) {
    if (!m) return 2 * syn_bytes();
    return ps_ctx_bytes(m, &TIMED_CTX, threads) + (x_floats(m) + out_floats(m)) * sizeof(float);
}
