/* bench_matmul.c - ps_matmul speed per weight type and kernel family.
 *
 *   bench_matmul [-t threads] [-r reps] [-f family] [-T types] [-s] [-p n_tok] [-c]
 *   bench_matmul -L dim,kv_dim,ffn_dim [-t threads] [-r reps] [-f family] [-T types] [-P n,...]
 *
 * Per type: GEMV (n_tok = 1) on a 2048 x 8192 matrix, reported as GB/s of weights read,
 * and GEMM (n_tok = 128, 2048 x 2048 and 8192 x 2048) as GFLOP/s (2 flops per multiply-
 * add); medians over reps runs. -s adds the output-head shapes (49152 and 128256 rows
 * x 2048 GEMV). -c times with the process's CPU clock instead of the wall clock (useful
 * with -t 1 on a busy machine). Weights are random, quantized with ps_quantize_row.
 *
 * -L: one transformer layer's matmuls as the forward pass calls them (wq/wk/wv in one
 * ps_matmul_multi, wo, w_gate/w_up in one, w_down), for each n_tok of -P (default
 * 1,16,32,128), with enough layers' copies to exceed the L3 cache (the weights come from
 * memory, as in a forward pass). Per n_tok: microseconds per layer, GFLOP/s, and the
 * per-row rate relative to the last n_tok of the list; the n_tok run in alternating turns
 * (medians over reps turns, min..max of the rate). A turn in which the process did not
 * hold all its threads' cores (another process took one: pool workers spin) is run again,
 * up to 20 times. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensor/matmul.h"
#include "tensor/pool.h"

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* Quantized random weights (rows x cols of type t); rows are made from a few distinct
 * random rows so that setting up big matrices stays quick. */
static void *make_weights(ps_type t, int64_t rows, int64_t cols) {
    size_t rb = ps_row_bytes(t, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    if (!w || !tmp) exit(1);
    enum { DISTINCT = 64 };
    for (int64_t r = 0; r < rows && r < DISTINCT; r++) {
        for (int64_t c = 0; c < cols; c++) tmp[c] = frand();
        if (ps_quantize_row(t, tmp, w + rb * (size_t)r, cols) != PS_OK) exit(1);
    }
    for (int64_t r = DISTINCT; r < rows; r++) memcpy(w + rb * (size_t)r, w + rb * (size_t)(r % DISTINCT), rb);
    free(tmp);
    return w;
}

/* Median seconds of one ps_matmul call over reps runs (after a warm-up call), cycling
 * through n_mats copies of the weights (so that GEMV reads them from memory, not L3). */
static double time_matmul(const ps_mat *m, int n_mats, int64_t n_tok, int reps, ps_pool *pool) {
    float *x = malloc(sizeof(float) * (size_t)(m->cols * n_tok));
    float *y = malloc(sizeof(float) * (size_t)(m->rows * n_tok));
    void *scratch = malloc(ps_matmul_scratch_bytes(m->type, m->cols, n_tok) + 1);
    double *ts = malloc(sizeof(double) * (size_t)reps);
    for (int64_t i = 0; i < m->cols * n_tok; i++) x[i] = frand();
    ps_matmul(m, x, m->cols, n_tok, y, m->rows, scratch, pool);
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        ps_matmul(&m[i % n_mats], x, m->cols, n_tok, y, m->rows, scratch, pool);
        ts[i] = now_s() - t0;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    double med = ts[reps / 2];
    free(x), free(y), free(scratch), free(ts);
    return med;
}

/* GEMV weights in all: more than the last-level cache, so that they come from memory. */
#define COLD_BYTES (160u << 20)
#define MAX_COPIES 64

static void bench_type(ps_type t, int reps, int64_t n_tok, int shapes, ps_pool *pool) {
    printf("%-5s", ps_type_name(t));
    int64_t gemv[][2] = {{2048, 8192}, {8192, 2048}, {49152, 2048}, {128256, 2048}};
    for (int i = 0; i < (shapes ? 4 : 2); i++) {
        ps_mat m[MAX_COPIES];
        size_t bytes = ps_row_bytes(t, gemv[i][1]) * (size_t)gemv[i][0];
        int n = (int)((COLD_BYTES + bytes - 1) / bytes);
        n = n < 1 ? 1 : n > MAX_COPIES ? MAX_COPIES : n;
        for (int k = 0; k < n; k++) {
            m[k] = (ps_mat){.type = t, .rows = gemv[i][0], .cols = gemv[i][1]};
            m[k].data = make_weights(t, m[k].rows, m[k].cols);
        }
        double s = time_matmul(m, n, 1, reps * 4 > n ? reps * 4 : n, pool);
        printf("  %7.1f GB/s", (double)bytes / s * 1e-9);
        for (int k = 0; k < n; k++) free((void *)m[k].data);
        fflush(stdout);
    }
    int64_t gemm[][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
    for (int i = 0; i < 3; i++) {
        ps_mat m = {.type = t, .rows = gemm[i][0], .cols = gemm[i][1]};
        m.data = make_weights(t, m.rows, m.cols);
        double s = time_matmul(&m, 1, n_tok, reps, pool);
        printf("  %7.1f GFLOP/s", 2.0 * (double)m.rows * (double)m.cols * (double)n_tok / s * 1e-9);
        free((void *)m.data);
        fflush(stdout);
    }
    printf("\n");
}

// Layer mode

#define LAYER_MATS       7
#define LAYER_MAX_COPIES 64

/* One layer's matrices: wq, wk, wv, wo, w_gate, w_up, w_down. */
typedef struct {
    ps_mat m[LAYER_MATS];
} layer;

/* One layer's matmuls on n_tok rows: as forward.c's attention and feed-forward blocks. */
static void layer_run(const layer *L, const float *x, float *const y[4], int64_t n_tok, void *scratch, ps_pool *pool) {
    const ps_mat *qkv[] = {&L->m[0], &L->m[1], &L->m[2]}, *gu[] = {&L->m[4], &L->m[5]};
    int64_t dim = L->m[0].cols, kv = L->m[1].rows, ffn = L->m[4].rows;
    ps_matmul_multi(qkv, 3, x, dim, n_tok, (float *[]){y[0], y[1], y[2]}, (int64_t[]){dim, kv, kv}, scratch, pool);
    ps_matmul(&L->m[3], y[0], dim, n_tok, y[3], dim, scratch, pool);
    ps_matmul_multi(gu, 2, x, dim, n_tok, (float *[]){y[0], y[1]}, (int64_t[]){ffn, ffn}, scratch, pool);
    ps_matmul(&L->m[6], y[0], ffn, n_tok, y[3], dim, scratch, pool);
}

static void bench_layer(ps_type t, int64_t dim, int64_t kv, int64_t ffn, const int64_t *nts, int n_nt, int reps,
                        ps_pool *pool) {
    int64_t shape[LAYER_MATS][2] = {{dim, dim}, {kv, dim}, {kv, dim}, {dim, dim}, {ffn, dim}, {ffn, dim}, {dim, ffn}};
    size_t bytes = 0;
    for (int i = 0; i < LAYER_MATS; i++) bytes += ps_row_bytes(t, shape[i][1]) * (size_t)shape[i][0];
    int copies = (int)((COLD_BYTES + bytes - 1) / bytes);
    copies = copies < 1 ? 1 : copies > LAYER_MAX_COPIES ? LAYER_MAX_COPIES : copies;
    layer *Ls = malloc(sizeof(layer) * (size_t)copies);
    for (int i = 0; i < LAYER_MATS; i++) {
        ps_mat m = {.type = t, .rows = shape[i][0], .cols = shape[i][1]};
        m.data = make_weights(t, m.rows, m.cols);
        size_t mb = ps_row_bytes(t, m.cols) * (size_t)m.rows;
        for (int c = 0; c < copies; c++) {
            Ls[c].m[i] = m;
            if (c) {
                void *d = malloc(mb);
                memcpy(d, m.data, mb);
                Ls[c].m[i].data = d;
            }
        }
    }
    int64_t max_nt = 1, big = dim > ffn ? dim : ffn;
    for (int i = 0; i < n_nt; i++) max_nt = nts[i] > max_nt ? nts[i] : max_nt;
    float *x = malloc(sizeof(float) * (size_t)(big * max_nt)), *y[4];
    for (int i = 0; i < 4; i++) y[i] = malloc(sizeof(float) * (size_t)(big * max_nt));
    for (int64_t i = 0; i < big * max_nt; i++) x[i] = frand() * 0.1f;
    size_t sb = 0;
    for (int i = 0; i < LAYER_MATS; i++) sb += ps_matmul_scratch_bytes(t, shape[i][1], max_nt);
    void *scratch = malloc(sb + 64);
    double *ts = malloc(sizeof(double) * (size_t)(reps * n_nt));
    for (int k = 0; k < n_nt; k++)
        for (int c = 0; c < copies; c++) layer_run(&Ls[c], x, y, nts[k], scratch, pool); /* warm-up */
    for (int r = 0, c = 0; r < reps; r++)
        for (int k = 0; k < n_nt; k++) {
            for (int tries = 0; tries < 20; tries++) { /* a turn counts when no other process took a core */
                double t0 = now_s(), c0 = cpu_s();
                for (int i = 0; i < copies; i++, c = (c + 1) % copies) layer_run(&Ls[c], x, y, nts[k], scratch, pool);
                double wall = now_s() - t0;
                ts[k * reps + r] = wall / copies;
                if (cpu_s() - c0 >= 0.95 * wall * ps_pool_size(pool)) break;
            }
        }
    double macs = 0;
    for (int i = 0; i < LAYER_MATS; i++) macs += (double)shape[i][0] * (double)shape[i][1];
    double ref = 0;
    for (int k = n_nt - 1; k >= 0; k--) {
        double *v = ts + k * reps;
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        double med = v[reps / 2], rate = (double)nts[k] / med;
        if (k == n_nt - 1) ref = rate;
        printf("%-5s n_tok %4lld  %9.1f us/layer  %6.1f GFLOP/s  rows/s x %.3f (%.3f..%.3f)\n", ps_type_name(t),
               (long long)nts[k], med * 1e6, 2 * macs * (double)nts[k] / med * 1e-9, rate / ref,
               (double)nts[k] / v[reps - 1] / ref, (double)nts[k] / v[0] / ref);
    }
    fflush(stdout);
    for (int i = 0; i < LAYER_MATS; i++)
        for (int c = 0; c < copies; c++) free((void *)Ls[c].m[i].data);
    free(Ls), free(x), free(scratch), free(ts);
    for (int i = 0; i < 4; i++) free(y[i]);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 9, shapes = 0;
    int64_t L[3] = {0}, nts[16] = {1, 16, 32, 128};
    int n_nt = 4;
    int64_t n_tok = 128;
    const char *family = NULL, *types = "F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc)
            family = argv[++i];
        else if (!strcmp(argv[i], "-T") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc)
            n_tok = atoll(argv[++i]);
        else if (!strcmp(argv[i], "-s"))
            shapes = 1;
        else if (!strcmp(argv[i], "-L") && i + 1 < argc)
            sscanf(argv[++i], "%" SCNd64 ",%" SCNd64 ",%" SCNd64, &L[0], &L[1], &L[2]);
        else if (!strcmp(argv[i], "-P") && i + 1 < argc) {
            char *s = argv[++i];
            for (n_nt = 0; n_nt < 16 && *s; n_nt++) {
                nts[n_nt] = strtoll(s, &s, 10);
                if (*s == ',') s++;
            }
        } else if (!strcmp(argv[i], "-c"))
            clock_id = CLOCK_PROCESS_CPUTIME_ID;
        else {
            fprintf(stderr,
                    "usage: %s [-t threads] [-r reps] [-f family] [-T types] [-p n_tok] [-s] [-c] "
                    "[-L dim,kv,ffn [-P n,...]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (family && ps_matmul_set_isa(family) != PS_OK) {
        fprintf(stderr, "family %s not available\n", family);
        return 1;
    }
    ps_pool *pool = NULL;
    if (ps_pool_create(threads, &pool) != PS_OK) return 1;
    if (L[0] > 0) {
        printf("family %s, %d threads, median of %d; layer %lld,%lld,%lld\n", ps_matmul_isa(), threads, reps,
               (long long)L[0], (long long)L[1], (long long)L[2]);
        char buf[256];
        snprintf(buf, sizeof buf, "%s",
                 strcmp(types, "F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K") ? types : "Q8_0,Q4_0");
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            ps_type t;
            if (ps_type_from_name(tok, &t) == PS_OK && ps_matmul_supported(t))
                bench_layer(t, L[0], L[1], L[2], nts, n_nt, reps, pool);
        }
        ps_pool_free(pool);
        return 0;
    }
    printf("family %s, %d threads, median of %d; GEMV 2048x8192, 8192x2048%s; GEMM n_tok=%lld 2048x2048, "
           "8192x2048, 2048x8192\n",
           ps_matmul_isa(), threads, reps, shapes ? ", 49152x2048, 128256x2048" : "", (long long)n_tok);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", types);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        ps_type t;
        if (ps_type_from_name(tok, &t) != PS_OK || !ps_matmul_supported(t)) {
            fprintf(stderr, "unknown type %s\n", tok);
            continue;
        }
        bench_type(t, reps, n_tok, shapes, pool);
    }
    ps_pool_free(pool);
    return 0;
}
