/* test_matmul.c - the thread pool, and ps_matmul for every weight type and kernel family:
 *   - the ref kernels against a double-precision dot of the dequantized weights and the
 *     exact quantized activations;
 *   - every other available family against ref, under a named tolerance per type, and
 *     bit for bit for the families that promise it (neon, neondot);
 *   - batch invariance: for each family, y[t][r] bit-identical whatever n_tok, the token's
 *     place in the batch, the thread count and the row range asked for;
 *   - scratch and weight buffers allocated to the byte, so that sanitizers catch overreads;
 *   - ps_pool_park: workers yield, then sleep (Linux);
 *   - ps_pool_pin / ps_thread_unpin (Linux). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/q8_kern.h"

// Random data (ps_test_rng_*, seeded in main)

/* Activation-like values: mostly small, a few outliers, some all-zero 32-blocks. */
static void fill_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = ps_test_rng_f();
        if (ps_test_rng_u32() % 61 == 0) x[i] *= 20.0f;
    }
    if (n >= 64 && ps_test_rng_u32() % 3 == 0) memset(x + 32, 0, 32 * sizeof *x);
}

// Thread pool

typedef struct {
    atomic_int calls[8];
    atomic_int bad_nth;
    int nth_expect;
} pool_probe;

static void probe_task(void *ctx, int ith, int nth) {
    pool_probe *p = ctx;
    if (nth != p->nth_expect) atomic_fetch_add(&p->bad_nth, 1);
    if (ith >= 0 && ith < 8) atomic_fetch_add(&p->calls[ith], 1);
}

/* Every part runs exactly once per job, many jobs in a row. */
static void test_pool(void) {
    for (int n = 1; n <= 5; n += 1) {
        ps_pool *pool = NULL;
        PS_CHECK_OK(ps_pool_create(n, &pool));
        if (!pool) continue;
        PS_CHECK_EQ_INT(ps_pool_size(pool), n);
        pool_probe p = {.nth_expect = n};
        int jobs = n <= 2 ? 20000 : 500; /* more threads than cores: every job waits for a time slice */
        for (int i = 0; i < jobs; i++) ps_pool_run(pool, probe_task, &p);
        for (int i = 0; i < 8; i++) PS_CHECK_EQ_INT(atomic_load(&p.calls[i]), i < n ? jobs : 0);
        PS_CHECK_EQ_INT(atomic_load(&p.bad_nth), 0);
        ps_pool_free(pool);
    }
    ps_pool *pool = NULL;
    PS_CHECK(ps_pool_create(0, &pool) == PS_ERR_ARG && pool == NULL);
    ps_pool_free(NULL);
    pool_probe p = {.nth_expect = 1};
    ps_pool_run(NULL, probe_task, &p);
    PS_CHECK_EQ_INT(atomic_load(&p.calls[0]), 1);
}

#ifdef __linux__
#include <dirent.h>
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The ids of this process's threads but the main one, sorted (the order they were started
 * in). Returns how many. */
static int thread_ids(int *out, int cap) {
    int n = 0, self = getpid();
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;)
        if (e->d_name[0] != '.' && atoi(e->d_name) != self) out[n++] = atoi(e->d_name);
    if (d) closedir(d);
    qsort(out, (size_t)n, sizeof *out, cmp_int);
    return n;
}

/* The ids (sorted) of this process's threads that are not among the nb in before: those a
 * pool started since before was taken. Returns how many. */
static int new_thread_ids(const int *before, int nb, int *out, int cap) {
    int all[64], na = thread_ids(all, 64), n = 0;
    for (int i = 0; i < na && n < cap; i++) {
        bool old = false;
        for (int j = 0; j < nb; j++) old |= all[i] == before[j];
        if (!old) out[n++] = all[i];
    }
    return n;
}

/* Whether thread tid (0: the calling thread) may run on cpu alone. */
static bool on_cpu(int tid, int cpu) {
    cpu_set_t got, want;
    CPU_ZERO(&want);
    CPU_SET(cpu, &want);
    return sched_getaffinity(tid, sizeof got, &got) == 0 && CPU_EQUAL(&got, &want);
}

/* The scheduler state letter (R, S, ...) of thread tid of this process, '?' if unknown. */
static char thread_state(int tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return close && close[1] == ' ' ? close[2] : '?';
}

static void sleep_us(int us) { nanosleep(&(struct timespec){us / 1000000, (us % 1000000) * 1000L}, NULL); }

/* Whether each of the n threads in tids was seen runnable (R) in one of 20 looks from 1 to
 * 3 ms from now (a single look may catch a runnable thread in a short sleep: emulators
 * take locks; a worker that sleeps at once is asleep by then). */
static bool all_runnable(const int *tids, int n) {
    bool seen[64] = {0};
    sleep_us(1000);
    for (int look = 0; look < 20; look++, sleep_us(100))
        for (int i = 0; i < n; i++) seen[i] |= thread_state(tids[i]) == 'R';
    for (int i = 0; i < n; i++)
        if (!seen[i]) return false;
    return true;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Milliseconds of real time from t0 (a now_ms() value) until the n threads in tids were
 * all seen sleeping (S) in three looks in a row, at least 1 ms apart; gives up once
 * limit_ms have passed (returns that). Real time, not a count of looks: on a loaded host a
 * look may come late, which only makes the figure larger, never smaller. */
static double ms_until_asleep(const int *tids, int n, double t0, double limit_ms) {
    for (int row = 0; row < 3 && now_ms() - t0 < limit_ms; sleep_us(1000)) {
        bool all = true;
        for (int i = 0; i < n; i++) all &= thread_state(tids[i]) == 'S';
        row = all ? row + 1 : 0;
    }
    return now_ms() - t0;
}

/* ps_pool_park: in a pinned pool the workers stay runnable (yielding their cores) for the
 * park-yield period, then sleep; unpinned, they sleep at once; jobs run every part once
 * whatever state the workers are in. Pins the test's thread (runs before test_pool_pin). */
static void test_pool_park(void) {
    int before[64], tids[64], nb = thread_ids(before, 64);
    ps_pool *pool = NULL;
    PS_CHECK_OK(ps_pool_create(3, &pool));
    int n = new_thread_ids(before, nb, tids, 64); /* the pool's threads */
    PS_CHECK_EQ_INT(n, 2);
    pool_probe p = {.nth_expect = 3};
    /* Unpinned, parked workers sleep at once. The bug this guards (they yield for the pinned
     * pool's park-yield period, 8 ms, first) keeps them runnable for 8 ms of real time after
     * ps_pool_park, and three sleeping looks need 2 ms more, so with the bug no attempt can
     * take under 10 ms, however fast or loaded the host: one attempt under 9 ms proves the
     * pool slept at once. A correct pool takes about 2-3 ms; a loaded host only delays it,
     * so it gets up to 20 attempts to find a quiet moment. */
    double waited = 1000;
    for (int attempt = 0; attempt < 20 && waited >= 9; attempt++) {
        ps_pool_run(pool, probe_task, &p);
        double t0 = now_ms();
        ps_pool_park(pool);
        double w = ms_until_asleep(tids, n, t0, 1000);
        if (w < waited) waited = w;
    }
    if (!(waited < 9)) fprintf(stderr, "unpinned parked pool: asleep after %.1f ms at best\n", waited);
    PS_CHECK(waited < 9);
    char err[256];
    PS_CHECK_OK(ps_pool_pin(pool, err, sizeof err));
    ps_pool_set_park_yield(pool, 300000000LL); /* 300 ms, not 8: a loaded host may delay the looks that long */
    for (int round = 0; round < 3; round++) {
        bool yielding = false; /* retried: a worker whose caller is preempted for longer than
                                  the spin before it parks has gone to sleep */
        for (int attempt = 0; attempt < 5 && !yielding; attempt++) {
            ps_pool_run(pool, probe_task, &p);
            ps_pool_park(pool);
            yielding = all_runnable(tids, n);
        }
        PS_CHECK(yielding);
        if (round == 1) ps_pool_run(pool, probe_task, &p); /* a job while they yield */
        if (round == 1) ps_pool_park(pool);
        PS_CHECK(ms_until_asleep(tids, n, now_ms(), 3000) < 3000); /* then asleep: no core kept busy */
        if (round == 2) ps_pool_wake(pool);
    }
    ps_pool_run(pool, probe_task, &p);
    for (int i = 0; i < 3; i++) PS_CHECK_EQ_INT(atomic_load(&p.calls[i]), atomic_load(&p.calls[0]));
    PS_CHECK(atomic_load(&p.calls[0]) >= 6);
    ps_pool_free(pool);
    ps_thread_unpin();
}

/* ps_pool_pin: thread i on the i-th CPU this process could use (the caller is thread 0),
 * a second pool pinned while the caller is pinned still spreads over every CPU, and
 * ps_thread_unpin gives the caller its CPUs back. Runs last, with no other pool alive:
 * it pins the test's thread. */
static void test_pool_pin(void) {
    cpu_set_t orig, now;
    PS_CHECK(sched_getaffinity(0, sizeof orig, &orig) == 0);
    int cpus[CPU_SETSIZE], m = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &orig)) cpus[m++] = c;
    char err[256];
    for (int round = 0; round < 2; round++) { /* round 1: the caller is pinned already */
        int before[64], tids[64], nb = thread_ids(before, 64);
        ps_pool *pool = NULL;
        PS_CHECK_OK(ps_pool_create(4, &pool));
        PS_CHECK_OK(ps_pool_pin(pool, err, sizeof err));
        int k = new_thread_ids(before, nb, tids, 64); /* the pool's threads, in the order started */
        PS_CHECK(on_cpu(0, cpus[0]));
        for (int i = 0; i < k; i++) PS_CHECK(on_cpu(tids[i], cpus[(i + 1) % m]));
        PS_CHECK_EQ_INT(k, 3);
        ps_pool_free(pool);
    }
    ps_thread_unpin();
    PS_CHECK(sched_getaffinity(0, sizeof now, &now) == 0 && CPU_EQUAL(&now, &orig));
}
#endif

// A test problem

typedef struct {
    ps_type type;
    int64_t rows, cols, n_tok;
    void *w;   /* rows x ps_row_bytes, allocated to the byte */
    float *wf; /* dequantized weights */
    float *x;  /* n_tok x x_stride */
    int64_t x_stride;
} problem;

static void problem_free(problem *p) {
    free(p->w);
    free(p->wf);
    free(p->x);
}

static ps_status problem_make(problem *p, ps_type type, int64_t rows, int64_t cols, int64_t n_tok) {
    *p = (problem){.type = type, .rows = rows, .cols = cols, .n_tok = n_tok, .x_stride = cols + 3};
    size_t rb = ps_row_bytes(type, cols);
    p->w = malloc(rb * (size_t)rows);
    p->wf = malloc(sizeof(float) * (size_t)(rows * cols));
    p->x = malloc(sizeof(float) * (size_t)(n_tok * p->x_stride));
    if (!p->w || !p->wf || !p->x) return PS_ERR_NOMEM;
    float *row = p->wf;
    for (int64_t r = 0; r < rows; r++, row += cols) {
        float scale = 0.5f + (float)(ps_test_rng_u32() % 100) / 50.0f;
        for (int64_t c = 0; c < cols; c++) row[c] = ps_test_rng_f() * scale;
        ps_status s = ps_quantize_row(type, row, (uint8_t *)p->w + rb * (size_t)r, cols);
        if (s == PS_OK) s = ps_dequantize_row(type, (uint8_t *)p->w + rb * (size_t)r, row, cols);
        if (s != PS_OK) return s;
    }
    for (int64_t t = 0; t < n_tok; t++) fill_x(p->x + t * p->x_stride, cols);
    return PS_OK;
}

/* y (n_tok x y_stride) for tokens [t0, t0 + n) and rows [r0, r0 + nr) of p, using a scratch
 * buffer of exactly the advertised size placed one byte past a malloc'd start. */
static void run(const problem *p, int64_t t0, int64_t n, int64_t r0, int64_t nr, float *y, int64_t y_stride,
                ps_pool *pool) {
    size_t rb = ps_row_bytes(p->type, p->cols);
    ps_mat m = {.type = p->type, .rows = nr, .cols = p->cols, .data = (const uint8_t *)p->w + rb * (size_t)r0};
    size_t sb = ps_matmul_scratch_bytes(p->type, p->cols, n);
    uint8_t *scratch = malloc(sb + 1);
    ps_matmul(&m, p->x + t0 * p->x_stride, p->x_stride, n, y, y_stride, scratch ? scratch + 1 : NULL, pool);
    free(scratch);
}

// Accuracy

/* The activation row as the ref kernel sees it, dequantized (exact in double). */
static void ref_activation(ps_type type, const float *x, int64_t cols, double *out) {
    const ps_q8_kern *k = ps_q8_kern_get(PS_ISA_REF, type);
    if (!k->quant) {
        for (int64_t c = 0; c < cols; c++) out[c] = x[c];
        return;
    }
    void *xq = malloc(k->x_bytes(cols));
    k->quant(x, xq, cols);
    if (ps_type_get(type)->block_size == PS_QK) {
        const ps_xq32 *b = xq;
        for (int64_t c = 0; c < cols; c++) out[c] = (double)b[c / PS_QK].d * b[c / PS_QK].qs[c % PS_QK];
    } else {
        const ps_block_q8_K *b = xq;
        for (int64_t c = 0; c < cols; c++) out[c] = (double)b[c / PS_QK_K].d * b[c / PS_QK_K].qs[c % PS_QK_K];
    }
    free(xq);
}

/* Relative tolerances (against sum |w x|) of ref vs the exact dot: a few float roundings
 * per block plus the block-by-block float sum. */
#define TOL_REF 2e-5
/* Family vs ref: same integers, other float summation order (and for the K types with
 * minimums, the minimum term summed in float rather than in integers). */
static double tol_family(ps_type t) {
    switch (t) {
    case PS_TYPE_F32:
    case PS_TYPE_F16:
    case PS_TYPE_BF16: return 1e-5;
    case PS_TYPE_Q4_K:
    case PS_TYPE_Q5_K: return 2e-5;
    default: return 1e-5;
    }
}

/* Families whose kernels reproduce ref's float operations exactly for type t (q8_neon.h;
 * q8_avx2.c's row-interleaved tiles). */
static bool family_bit_exact(int isa, ps_type t) {
    return isa == PS_ISA_NEON || isa == PS_ISA_NEONDOT ||
           (isa == PS_ISA_AVX2 &&
            (t == PS_TYPE_Q4_0 || t == PS_TYPE_Q8_0 || t == PS_TYPE_Q4_K || t == PS_TYPE_Q5_K || t == PS_TYPE_Q6_K));
}

/* sum |w x| and the exact dot for (row r, token t). */
static void exact_dot(const problem *p, const double *xa, int64_t r, double *dot, double *mag) {
    const float *w = p->wf + r * p->cols;
    double s = 0, m = 0;
    for (int64_t c = 0; c < p->cols; c++) {
        s += (double)w[c] * xa[c];
        m += fabs((double)w[c] * xa[c]);
    }
    *dot = s;
    *mag = m;
}

/* ref vs exact, then every other family vs ref, on problem p (freed). */
static void check_problem(problem *p_in, ps_pool *pool) {
    problem p = *p_in;
    ps_type type = p.type;
    int64_t rows = p.rows, cols = p.cols, n_tok = p.n_tok;
    float *yref = malloc(sizeof(float) * (size_t)(rows * n_tok)), *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
    double *xa = malloc(sizeof(double) * (size_t)cols), *mag = malloc(sizeof(double) * (size_t)(rows * n_tok));
    PS_CHECK_OK(ps_matmul_set_isa("ref"));
    run(&p, 0, n_tok, 0, rows, yref, rows, pool);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        ref_activation(type, p.x + t * p.x_stride, cols, xa);
        for (int64_t r = 0; r < rows; r++) {
            double dot, m;
            exact_dot(&p, xa, r, &dot, &m);
            mag[t * rows + r] = m;
            if (fabs(yref[t * rows + r] - dot) > TOL_REF * m + 1e-30 && bad++ < 3)
                fprintf(stderr, "%s ref: row %lld tok %lld: %.9g vs exact %.9g (|wx| %.3g)\n", ps_type_name(type),
                        (long long)r, (long long)t, yref[t * rows + r], dot, m);
        }
    }
    PS_CHECK_EQ_INT(bad, 0);
    for (int isa = 1; isa < PS_ISA_COUNT; isa++) {
        if (!ps_isa_available((ps_isa)isa)) continue;
        PS_CHECK_OK(ps_matmul_set_isa(ps_isa_name((ps_isa)isa)));
        run(&p, 0, n_tok, 0, rows, y, rows, pool);
        bad = 0;
        for (int64_t i = 0; i < rows * n_tok; i++)
            if (!(fabs(y[i] - yref[i]) <= tol_family(type) * mag[i] + 1e-30) && bad++ < 3)
                fprintf(stderr, "%s %s: row %lld tok %lld: %.9g vs ref %.9g (|wx| %.3g)\n", ps_type_name(type),
                        ps_isa_name((ps_isa)isa), (long long)(i % rows), (long long)(i / rows), y[i], yref[i], mag[i]);
        PS_CHECK_EQ_INT(bad, 0);
        if (!family_bit_exact(isa, type)) continue;
        bad = 0;
        for (int64_t i = 0; i < rows * n_tok; i++)
            if (memcmp(&y[i], &yref[i], sizeof(float)) != 0 && bad++ < 3)
                fprintf(stderr, "%s %s: row %lld tok %lld: %.9g differs from ref %.9g in its bits\n",
                        ps_type_name(type), ps_isa_name((ps_isa)isa), (long long)(i % rows), (long long)(i / rows),
                        y[i], yref[i]);
        PS_CHECK_EQ_INT(bad, 0);
    }
    free(yref);
    free(y);
    free(xa);
    free(mag);
    problem_free(&p);
}

static void test_accuracy(ps_type type, int64_t rows, int64_t cols, int64_t n_tok, ps_pool *pool) {
    problem p;
    if (problem_make(&p, type, rows, cols, n_tok) != PS_OK) {
        PS_CHECK(!"problem_make");
        problem_free(&p);
        return;
    }
    check_problem(&p, pool);
}

/* Weights at the ends of their ranges, where the kernels' int16 pair sums come closest to
 * overflowing: every byte of a block fill (0xff: the largest quants and, for q4_K / q5_K,
 * the largest scales and minimums; 0x80: q8_0's -128 and q6_K's -128 scales) or random,
 * with the binary16 scales at f16 (finite), against activations of equal magnitude (each
 * quantized to +-127) of one sign or random signs. */
static void test_extremes(ps_type type, ps_pool *pool) {
    static const struct {
        ps_type t;
        int f16_at[2]; /* offsets of the block's binary16 fields; -1 for none */
    } layout[] = {{PS_TYPE_Q4_0, {0, -1}},
                  {PS_TYPE_Q8_0, {0, -1}},
                  {PS_TYPE_Q4_K, {0, 2}},
                  {PS_TYPE_Q5_K, {0, 2}},
                  {PS_TYPE_Q6_K, {208, -1}}};
    const int *f16_at = NULL;
    for (size_t i = 0; i < PS_ARRAY_LEN(layout); i++)
        if (layout[i].t == type) f16_at = layout[i].f16_at;
    if (!f16_at) return;
    const int64_t rows = 11, cols = 512, n_tok = 3;
    const size_t rb = ps_row_bytes(type, cols), bb = ps_type_get(type)->type_size;
    const int fills[] = {0xff, 0x80, -1};
    for (size_t f = 0; f < PS_ARRAY_LEN(fills); f++) {
        for (int sign = 0; sign < 3; sign++) {
            problem p = {.type = type, .rows = rows, .cols = cols, .n_tok = n_tok, .x_stride = cols};
            p.w = malloc(rb * (size_t)rows);
            p.wf = malloc(sizeof(float) * (size_t)(rows * cols));
            p.x = malloc(sizeof(float) * (size_t)(n_tok * cols));
            if (!p.w || !p.wf || !p.x) {
                PS_CHECK(!"malloc");
                problem_free(&p);
                return;
            }
            uint8_t *w = p.w;
            for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = fills[f] >= 0 ? (uint8_t)fills[f] : ps_test_rng_u32();
            for (size_t b = 0; b < rb * (size_t)rows; b += bb)
                for (int k = 0; k < 2; k++)
                    if (f16_at[k] >= 0) memcpy(w + b + f16_at[k], &(uint16_t){k ? 0x2400 : 0x3c00}, 2); /* 1/64, 1 */
            for (int64_t r = 0; r < rows; r++)
                PS_CHECK_OK(ps_dequantize_row(type, w + rb * (size_t)r, p.wf + r * cols, cols));
            for (int64_t i = 0; i < n_tok * cols; i++)
                p.x[i] = sign == 0 ? 0.5f : sign == 1 ? -0.5f : ps_test_rng_u32() % 2 ? 0.5f : -0.5f;
            check_problem(&p, pool);
        }
    }
}

// Batch invariance

/* Compares y[t][r] (rows [r0, r0+nr), tokens [t0, t0+n)) bit for bit with full[t][r]. */
static int compare_bits(const float *full, int64_t rows, const float *y, int64_t ys, int64_t t0, int64_t n, int64_t r0,
                        int64_t nr) {
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        if (memcmp(full + (t0 + t) * rows + r0, y + t * ys, sizeof(float) * (size_t)nr) != 0) bad++;
    return bad;
}

/* For family isa: all tokens at once on 2 threads, then subsets of the batch at various
 * offsets, thread counts and row ranges, each bit-identical to the first. */
static void test_invariance(ps_type type, int64_t rows, int64_t cols, int64_t n_tok, ps_pool *pools[4]) {
    problem p;
    if (problem_make(&p, type, rows, cols, n_tok) != PS_OK) {
        PS_CHECK(!"problem_make");
        problem_free(&p);
        return;
    }
    int64_t ys = rows + 5;
    float *full = malloc(sizeof(float) * (size_t)(rows * n_tok)), *y = malloc(sizeof(float) * (size_t)(ys * n_tok));
    static const int64_t sizes[] = {1, 2, 7, 64, 300};
    for (int isa = 0; isa < PS_ISA_COUNT; isa++) {
        if (!ps_isa_available((ps_isa)isa)) continue;
        PS_CHECK_OK(ps_matmul_set_isa(ps_isa_name((ps_isa)isa)));
        run(&p, 0, n_tok, 0, rows, full, rows, pools[2]);
        int bad = 0;
        for (size_t s = 0; s < PS_ARRAY_LEN(sizes) && sizes[s] <= n_tok; s++) {
            int64_t n = sizes[s];
            int64_t t0 = (n * 7 + 3) % (n_tok - n + 1);
            for (int th = 1; th <= 3; th++) {
                run(&p, t0, n, 0, rows, y, ys, pools[th]);
                bad += compare_bits(full, rows, y, ys, t0, n, 0, rows);
            }
            int64_t r0 = 5 % rows, nr = rows - r0 > 3 ? rows - r0 - 3 : rows - r0;
            run(&p, t0, n, r0, nr, y, ys, pools[2]);
            bad += compare_bits(full, rows, y, ys, t0, n, r0, nr);
        }
        if (bad)
            fprintf(stderr, "%s %s: %d token rows differ from the full batch\n", ps_type_name(type),
                    ps_isa_name((ps_isa)isa), bad);
        PS_CHECK_EQ_INT(bad, 0);
    }
    free(full);
    free(y);
    problem_free(&p);
}

/* avx512amx's contract: avx512vnni's very bits (decode takes vnni, prefill AMX), for the
 * types it multiplies on tiles. Shapes that take each path: whole groups, a zero-padded last
 * group, a natural tail (32-element types), a row too short for a group; rows past whole
 * tiles of 16, tokens past them (1, 3: vnni; 13, 14: a padded tile); a call's tokens not
 * starting at 0; 1 and 2 threads; a NaN and an
 * infinite activation. */
static void test_amx_bits(ps_pool *pools[4]) {
    if (!ps_isa_available(PS_ISA_AVX512AMX)) {
        printf("avx512amx: not on this CPU (or not permitted by the OS), not compared\n");
        return;
    }
    static const ps_type types[] = {PS_TYPE_Q8_0, PS_TYPE_Q4_0, PS_TYPE_Q4_K, PS_TYPE_Q5_K, PS_TYPE_Q6_K};
    static const int64_t shapes[][4] = {/* rows, blocks of 32, super-blocks, tokens */
                                        {48, 48, 8, 48},          {37, 41, 5, 35},
                                        {67, 21, 3, 64},          {16, 16, 4, 16},
                                        {33, 9, 1, 46},           {20, 4, 2, 13},
                                        {50, 18, 6, 81},          {31, 16 * 7 + 5, 13, 19},
                                        {17, 16 * 29 + 6, 56, 80}}; /* the last: buffers on the heap, 2 token blocks */
    for (size_t i = 0; i < PS_ARRAY_LEN(types) * PS_ARRAY_LEN(shapes); i++) {
        ps_type type = types[i % PS_ARRAY_LEN(types)];
        const int64_t *sh = shapes[i / PS_ARRAY_LEN(types)];
        int64_t rows = sh[0], cols = ps_type_get(type)->block_size == PS_QK ? PS_QK * sh[1] : PS_QK_K * sh[2];
        int64_t n_tok = sh[3];
        problem p;
        PS_CHECK_OK(problem_make(&p, type, rows, cols, n_tok));
        p.x[3 * p.x_stride + 5] = NAN; /* non-finite activations: the same bits too */
        p.x[(n_tok - 1) * p.x_stride + 1] = INFINITY;
        float *y[2];
        for (int f = 0; f < 2; f++) {
            y[f] = malloc(sizeof(float) * (size_t)(rows * n_tok));
            PS_CHECK_OK(ps_matmul_set_isa(f ? "avx512amx" : "avx512vnni"));
            run(&p, 0, n_tok, 0, rows, y[f], rows, pools[1 + (int)(i % 2)]);
        }
        int bad = 0;
        for (int64_t k = 0; k < rows * n_tok; k++) bad += memcmp(&y[0][k], &y[1][k], sizeof(float)) != 0;
        if (bad)
            fprintf(stderr, "avx512amx %s %lld x %lld x %lld: %d outputs differ from avx512vnni\n", ps_type_name(type),
                    (long long)rows, (long long)cols, (long long)n_tok, bad);
        PS_CHECK_EQ_INT(bad, 0);
        free(y[0]);
        free(y[1]);
        problem_free(&p);
    }
}

// Several matrices sharing an input

/* ps_matmul_multi against one ps_matmul per matrix, bit for bit, for every family: mixed
 * types (shared and separate activation formats and 16-token tiles) and one matrix of other
 * cols (its own batch, reading the first 512 columns of the same rows); 1, 7 and 37 tokens.
 * Scratch is sized to the byte. */
static void test_multi(ps_pool *pool) {
    static const ps_type types[] = {PS_TYPE_Q4_K, PS_TYPE_Q6_K, PS_TYPE_Q4_K, PS_TYPE_Q8_0, PS_TYPE_F32, PS_TYPE_Q4_0};
    enum { N = 6, NT = 37, XS = 771 };
    problem p[N];
    ps_mat m[N];
    const ps_mat *ws[N];
    float *ys[N], *ref[N], x[NT * XS];
    int64_t strides[N];
    int ok = 1;
    fill_x(x, NT * XS);
    for (int i = 0; i < N; i++) {
        ok &= problem_make(&p[i], types[i], 11 + 7 * i, i == 5 ? 512 : 768, 1) == PS_OK;
        m[i] = (ps_mat){.type = p[i].type, .rows = p[i].rows, .cols = p[i].cols, .data = p[i].w};
        ws[i] = &m[i];
        strides[i] = p[i].rows + 2;
        ys[i] = calloc((size_t)(strides[i] * NT), sizeof(float));
        ref[i] = calloc((size_t)(strides[i] * NT), sizeof(float));
    }
    PS_CHECK(ok);
    for (int isa = 0; ok && isa < PS_ISA_COUNT; isa++) {
        if (!ps_isa_available((ps_isa)isa)) continue;
        PS_CHECK_OK(ps_matmul_set_isa(ps_isa_name((ps_isa)isa)));
        static const int64_t counts[] = {1, 7, NT};
        for (size_t c = 0; c < PS_ARRAY_LEN(counts); c++) {
            int64_t n_tok = counts[c];
            for (int i = 0; i < N; i++) {
                uint8_t *sc = malloc(ps_matmul_scratch_bytes(m[i].type, m[i].cols, n_tok) + 1);
                ps_matmul(&m[i], x, XS, n_tok, ref[i], strides[i], sc ? sc + 1 : NULL, pool);
                free(sc);
            }
            uint8_t *scratch = malloc(ps_matmul_multi_scratch_bytes(ws, N, n_tok) + 1);
            ps_matmul_multi(ws, N, x, XS, n_tok, ys, strides, scratch ? scratch + 1 : NULL, pool);
            free(scratch);
            int bad = 0;
            for (int i = 0; i < N; i++)
                for (int64_t t = 0; t < n_tok; t++)
                    bad +=
                        memcmp(ys[i] + t * strides[i], ref[i] + t * strides[i], sizeof(float) * (size_t)m[i].rows) != 0;
            if (bad)
                fprintf(stderr, "multi %s n_tok %lld: %d rows differ\n", ps_isa_name((ps_isa)isa), (long long)n_tok,
                        bad);
            PS_CHECK_EQ_INT(bad, 0);
        }
    }
    for (int i = 0; i < N; i++) {
        free(ys[i]);
        free(ref[i]);
        problem_free(&p[i]);
    }
}

// Main

static const ps_type all_types[] = {PS_TYPE_F32,  PS_TYPE_F16,  PS_TYPE_BF16, PS_TYPE_Q4_0, PS_TYPE_Q4_1, PS_TYPE_Q5_0,
                                    PS_TYPE_Q5_1, PS_TYPE_Q8_0, PS_TYPE_Q4_K, PS_TYPE_Q5_K, PS_TYPE_Q6_K};

/* Column counts that exercise whole SIMD groups and the tails after them; the third is
 * long enough for the kernels to split rows into several column passes. */
static void cols_for(ps_type t, int64_t out[3]) {
    uint32_t bs = ps_type_get(t)->block_size;
    if (bs == 1)
        out[0] = 1031, out[1] = 100, out[2] = 2000;
    else if (bs == PS_QK)
        out[0] = 32 * 41, out[1] = 32 * 18, out[2] = 32 * (16 * 7 + 5);
    else
        out[0] = 256 * 5, out[1] = 256 * 3, out[2] = 256 * 22;
}

int main(void) {
    ps_test_rng_seed(0x9e3779b97f4a7c15ULL);
    test_pool();
    ps_pool *pools[4] = {NULL};
    for (int i = 1; i < 4; i++) PS_CHECK_OK(ps_pool_create(i, &pools[i]));
    printf("best kernel family: %s\n", ps_matmul_isa());
    printf("kernel families tested:");
    for (int isa = 0; isa < PS_ISA_COUNT; isa++)
        if (ps_isa_available((ps_isa)isa)) printf(" %s", ps_isa_name((ps_isa)isa));
    printf("\n");
    for (size_t i = 0; i < PS_ARRAY_LEN(all_types); i++) {
        ps_type t = all_types[i];
        PS_CHECK(ps_matmul_supported(t));
        int64_t cols[3];
        cols_for(t, cols);
        test_accuracy(t, 37, cols[0], 5, pools[2]);
        test_accuracy(t, 9, cols[1], 3, pools[3]);
        test_accuracy(t, 29, cols[2], 37, pools[2]); /* tiles' edges: rows and tokens past a tile */
        test_invariance(t, 67, cols[1], 300, pools);
        test_invariance(t, 1, cols[0], 9, pools);
        test_invariance(t, 13, cols[2], 11, pools);
        test_extremes(t, pools[2]);
    }
    test_multi(pools[2]);
    test_amx_bits(pools);
    PS_CHECK(!ps_matmul_supported(PS_TYPE_Q2_K));
    PS_CHECK(ps_matmul_set_isa("nonsense") == PS_ERR_ARG);
    for (int i = 1; i < 4; i++) ps_pool_free(pools[i]);
#ifdef __linux__
    test_pool_park();
    test_pool_pin();
#endif
    return ps_test_done();
}
