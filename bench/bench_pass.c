/* bench_pass.c - one forward pass of N rows, as prefill and as serving's decode step.
 *
 *   bench_pass -m MODEL [-t threads] [-r reps] [-b N,...] [-c ctx] [-k kind] [--activations q8|f32]
 *
 * Per N (default 1,16,32,128), median milliseconds per pass over reps runs (min..max),
 * and rows per second:
 *   prefill   one sequence, N rows from position 0, logits of the last row (`bench -p N`);
 *   decode    N sequences, one row each at position ctx (default 64), logits of every
 *             row (a continuous-batching decode step);
 *   no head   the same decode step without logits (the layers alone).
 * The three kinds run in alternating turns, so that a machine whose speed drifts slows
 * them alike (-k prefill|decode|nohead runs one kind alone, e.g. under a profiler). The KV
 * cache holds whatever it holds (timing only).
 *
 * Build (CMake): bench/bench_*.c are linked with pscore. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tensor/pool.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    ps_ctx *c;
    int32_t *tabs; /* per sequence, seq_blocks entries */
    int seq_blocks;
    int32_t *toks;
    ps_seg *segs;
    float *out;
} bench;

enum { K_PREFILL, K_DECODE, K_NOHEAD, K_COUNT };
static const char *const kind_names[K_COUNT] = {"prefill", "decode", "no head"};

/* Seconds of one pass of kind k over n rows. */
static double pass(bench *b, int k, int n, int ctx) {
    int n_segs = k == K_PREFILL ? 1 : n;
    for (int i = 0; i < n_segs; i++)
        b->segs[i] = (ps_seg){.pos = k == K_PREFILL ? 0 : ctx,
                              .n = k == K_PREFILL ? n : 1,
                              .blocks = b->tabs + (size_t)i * b->seq_blocks,
                              .n_blocks = b->seq_blocks,
                              .n_logits = k == K_NOHEAD ? 0 : 1};
    char err[256];
    double t0 = ps_now();
    ps_status s = ps_forward_segs(b->c, b->segs, n_segs, b->toks, NULL, b->out, err, sizeof err);
    double t = ps_now() - t0;
    if (s) {
        fprintf(stderr, "bench_pass: %s\n", err);
        exit(1);
    }
    return t;
}

int main(int argc, char **argv) {
    const char *model = NULL, *ns = "1,16,32,128";
    int threads = 2, reps = 7, ctx = 64, only = -1;
    ps_act act = PS_ACT_Q8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-b") && i + 1 < argc)
            ns = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            only = !strcmp(argv[++i], "prefill") ? K_PREFILL : !strcmp(argv[i], "decode") ? K_DECODE : K_NOHEAD;
        else if (!strcmp(argv[i], "--activations") && i + 1 < argc && ps_act_from_name(argv[i + 1], &act) == PS_OK)
            i++;
        else
            model = NULL, i = argc;
    }
    if (!model || threads < 1 || reps < 1 || ctx < 0) {
        fprintf(stderr, "usage: bench_pass -m MODEL [-t threads] [-r reps] [-b N,...] [-c ctx] [-k kind] "
                        "[--activations q8|f32]\n");
        return 2;
    }
    int list[16], n_list = 0, max_n = 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ns);
    for (char *tok = strtok(buf, ","); tok && n_list < 16; tok = strtok(NULL, ",")) {
        list[n_list] = atoi(tok);
        if (list[n_list] < 1 || list[n_list] > 4096) return 2;
        if (list[n_list] > max_n) max_n = list[n_list];
        n_list++;
    }
    char err[512];
    ps_model *m = NULL;
    ps_pool *pool = NULL;
    bench b = {0};
    if (ps_model_load(model, PS_GGUF_HUGE, &m, err, sizeof err) || ps_pool_create(threads, &pool)) {
        fprintf(stderr, "bench_pass: %s\n", err);
        return 1;
    }
    int n_ctx = (ctx + 1 > max_n ? ctx + 1 : max_n);
    b.seq_blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    ps_ctx_params cp = {.n_ctx = n_ctx, .n_blocks = b.seq_blocks * max_n, .max_batch = max_n, .act = act};
    if (ps_ctx_create(m, &cp, pool, &b.c, err, sizeof err)) {
        fprintf(stderr, "bench_pass: %s\n", err);
        return 1;
    }
    b.tabs = malloc(sizeof(int32_t) * (size_t)(b.seq_blocks * max_n));
    b.toks = malloc(sizeof(int32_t) * (size_t)max_n);
    b.segs = malloc(sizeof(ps_seg) * (size_t)max_n);
    b.out = malloc(sizeof(float) * (size_t)max_n * (size_t)(m->hp.vocab > m->hp.dim ? m->hp.vocab : m->hp.dim));
    double *ts = malloc(sizeof(double) * (size_t)reps * K_COUNT);
    if (!b.tabs || !b.toks || !b.segs || !b.out || !ts) return 1;
    for (int i = 0; i < b.seq_blocks * max_n; i++) b.tabs[i] = i;
    for (int i = 0; i < max_n; i++) b.toks[i] = (int32_t)((i * 7919 + 13) % m->hp.vocab);
    printf("%s: %d threads, %s activations, decode at position %d, median of %d (min..max)\n", model, threads,
           ps_act_name(act), ctx, reps);
    printf("%5s  %-8s %9s  %-17s %9s\n", "rows", "pass", "ms", "spread", "rows/s");
    for (int li = 0; li < n_list; li++) {
        int n = list[li];
        for (int k = 0; k < K_COUNT; k++)
            if (only < 0 || k == only) pass(&b, k, n, ctx); /* warm-up */
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < K_COUNT; k++)
                if (only < 0 || k == only) ts[k * reps + r] = pass(&b, k, n, ctx);
        for (int k = 0; k < K_COUNT; k++) {
            if (only >= 0 && k != only) continue;
            double *v = ts + k * reps;
            qsort(v, (size_t)reps, sizeof *v, cmp_double);
            double med = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
            char spread[32];
            snprintf(spread, sizeof spread, "%.2f..%.2f", v[0] * 1e3, v[reps - 1] * 1e3);
            printf("%5d  %-8s %9.2f  %-17s %9.1f\n", n, kind_names[k], med * 1e3, spread, n / med);
        }
        fflush(stdout);
    }
    free(ts), free(b.tabs), free(b.toks), free(b.segs), free(b.out);
    ps_ctx_free(b.c);
    ps_pool_free(pool);
    ps_model_free(m);
    return 0;
}
