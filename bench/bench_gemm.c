/* bench_gemm.c - ps_gemm speed per weight type and kernel family, beside the machine's
 * limits measured in the same run.
 *
 *   bench_gemm [-t threads] [-r reps] [-i isa,...] [-T type,...] [-s] [-q] [-p]
 *
 * Baselines first: plain read bandwidth (AVX streaming loads over 256 MiB) and the FMA
 * peak (register-only vfmadd231ps, zmm or ymm), both on the pool's threads. Then per
 * type and family:
 *   gemv cold  2048 x 8192, n_tok = 1, cycling through copies of the matrix that exceed
 *              the L3 cache (what decode sees: every matrix comes from DRAM), GB/s of
 *              weight bytes;
 *   gemv hot   the same matrix again and again (L3-resident), GB/s;
 *   576 us     a 576 x 576 decode matmul (SmolLM2-135M's), microseconds per call;
 *   pp128      n_tok = 128 on 2048 x 2048, 8192 x 2048 and 2048 x 8192 (rows x cols),
 *              GFLOP/s (2 flops per multiply-add); -s adds the 128256 x 2048 output head.
 * Medians over reps runs in which the process held all its threads' cores (a '*' marks a
 * figure for which no run did: another process took a core). Weights are random rows quantized with ps_quantize_row (a few
 * distinct rows, copied). -q skips the baselines, -p the decode (gemv) columns.
 *
 * Build (CMake): add_executable(bench_gemm bench/bench_gemm.c)
 *                target_link_libraries(bench_gemm PRIVATE pscore) */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensor/f32_kern.h"
#include "tensor/gemm.h"
#include "tensor/pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

static void *xmalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

// Baselines

#define BW_BYTES ((size_t)256 << 20)

typedef struct {
    const uint8_t *buf;
    atomic_int isa512;
    double sink[64];
} base_ctx;

#if defined(__x86_64__)
/* Sums this thread's share of the buffer with 256-bit loads (no store traffic). */
__attribute__((target("avx2"))) static void read_task(void *c, int ith, int nth) {
    base_ctx *b = c;
    size_t per = BW_BYTES / (size_t)nth;
    const uint8_t *p = b->buf + per * (size_t)ith;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < per; i += 128) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps((const float *)(p + i)));
        s1 = _mm256_add_ps(s1, _mm256_load_ps((const float *)(p + i + 32)));
        s2 = _mm256_add_ps(s2, _mm256_load_ps((const float *)(p + i + 64)));
        s3 = _mm256_add_ps(s3, _mm256_load_ps((const float *)(p + i + 96)));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    b->sink[ith] = o[0];
}

#define FMA_ITERS 20000000L
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* FMA_ITERS × 12 independent zmm FMAs. */
__attribute__((target("avx512f"))) static float fma512(void) {
#define D(i) __m512 a##i = _mm512_set1_ps((float)i * 1e-3f);
#define F(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define S(i) s = _mm512_add_ps(s, a##i);
    CHAINS(D)
    __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f), s = _mm512_setzero_ps();
    for (long k = 0; k < FMA_ITERS; k++) { CHAINS(F) }
    CHAINS(S)
    return _mm512_reduce_add_ps(s);
#undef D
#undef F
#undef S
}

/* FMA_ITERS × 12 independent ymm FMAs. */
__attribute__((target("avx2,fma"))) static float fma256(void) {
#define D(i) __m256 a##i = _mm256_set1_ps((float)i * 1e-3f);
#define F(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define S(i) s = _mm256_add_ps(s, a##i);
    CHAINS(D)
    __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f), s = _mm256_setzero_ps();
    for (long k = 0; k < FMA_ITERS; k++) { CHAINS(F) }
    CHAINS(S)
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0];
#undef D
#undef F
#undef S
}

static void fma_task(void *c, int ith, int nth) {
    base_ctx *b = c;
    (void)nth;
    b->sink[ith] = atomic_load(&b->isa512) ? fma512() : fma256();
}

/* Prints the read bandwidth and FMA peaks of the pool's threads. */
static void baselines(ps_pool *pool, int reps) {
    base_ctx *b = xmalloc(sizeof *b);
    memset(b, 0, sizeof *b);
    uint8_t *buf = xmalloc(BW_BYTES);
    memset(buf, 1, BW_BYTES);
    b->buf = buf;
    double t[64];
    int n = reps < 64 ? reps : 64;
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        ps_pool_run(pool, read_task, b);
        t[i] = now_s() - t0;
    }
    printf("read bandwidth   %6.1f GB/s (%d threads, median of %d)\n", (double)BW_BYTES / median(t, n) / 1e9,
           ps_pool_size(pool), n);
    for (int z = 0; z < 2; z++) {
        if (z == 1 && !__builtin_cpu_supports("avx512f")) break;
        atomic_store(&b->isa512, z);
        for (int i = 0; i < 3; i++) {
            double t0 = now_s();
            ps_pool_run(pool, fma_task, b);
            t[i] = now_s() - t0;
        }
        double flops = (double)FMA_ITERS * 12 * (z ? 16 : 8) * 2 * ps_pool_size(pool);
        printf("FMA peak (%s)   %6.1f GFLOP/s (%d threads, register-only)\n", z ? "zmm" : "ymm",
               flops / median(t, 3) / 1e9, ps_pool_size(pool));
    }
    free(buf);
    free(b);
}
#else
static void baselines(ps_pool *pool, int reps) {
    (void)pool;
    (void)reps;
}
#endif

// Problems

typedef struct {
    ps_mat m[64]; /* copies of one matrix (m[0] owns the data of all) */
    int copies;
    float *x, *y;
    void *scratch;
} problem;

/* rows × cols of type t with enough copies to exceed min_bytes, activations for n_tok. */
static void problem_make(problem *p, ps_type t, int64_t rows, int64_t cols, int64_t n_tok, size_t min_bytes,
                         int threads) {
    size_t rb = ps_row_bytes(t, cols), mb = rb * (size_t)rows;
    p->copies = (int)((min_bytes + mb - 1) / mb);
    if (p->copies < 1) p->copies = 1;
    if (p->copies > 64) p->copies = 64;
    uint8_t *w = xmalloc(mb * (size_t)p->copies);
    float *tmp = xmalloc(sizeof(float) * (size_t)cols);
    enum { DISTINCT = 64 };
    for (int64_t r = 0; r < rows; r++) {
        if (r < DISTINCT) {
            for (int64_t c = 0; c < cols; c++) tmp[c] = frand();
            if (ps_quantize_row(t, tmp, w + rb * (size_t)r, cols) != PS_OK) exit(1);
        } else {
            memcpy(w + rb * (size_t)r, w + rb * (size_t)(r % DISTINCT), rb);
        }
    }
    for (int i = 0; i < p->copies; i++) {
        if (i) memcpy(w + mb * (size_t)i, w, mb);
        p->m[i] = (ps_mat){.type = t, .rows = rows, .cols = cols, .data = w + mb * (size_t)i};
    }
    free(tmp);
    p->x = xmalloc(sizeof(float) * (size_t)(cols * n_tok));
    p->y = xmalloc(sizeof(float) * (size_t)(rows * n_tok));
    for (int64_t i = 0; i < cols * n_tok; i++) p->x[i] = frand();
    size_t sb = ps_gemm_scratch_bytes(t, cols, n_tok, threads);
    p->scratch = sb ? xmalloc(sb) : NULL;
}

static void problem_free(problem *p) {
    free((void *)p->m[0].data);
    free(p->x);
    free(p->y);
    free(p->scratch);
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Set when a figure had no clean repetition (printed with a '*'). */
static bool g_contended;

/* Median seconds per ps_gemm call over reps runs of `calls` calls each (after a warm-up
 * pass), cycling through the matrix's copies. This machine is shared: only runs in which
 * the process got at least 95% of its threads' time (pool workers spin, so anything less
 * means another process took a core) count, unless none did. */
static double time_gemm(problem *p, int64_t n_tok, int reps, int calls, ps_pool *pool) {
    double *ts = xmalloc(sizeof(double) * (size_t)reps), *clean = xmalloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < p->copies; i++)
        ps_gemm(&p->m[i], p->x, p->m[i].cols, n_tok, p->y, p->m[i].rows, p->scratch, pool);
    int k = 0, n_clean = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int c = 0; c < calls; c++, k = (k + 1) % p->copies)
            ps_gemm(&p->m[k], p->x, p->m[k].cols, n_tok, p->y, p->m[k].rows, p->scratch, pool);
        double wall = now_s() - t0, cpu = cpu_s() - c0;
        ts[r] = wall / calls;
        if (cpu >= 0.95 * wall * ps_pool_size(pool)) clean[n_clean++] = ts[r];
    }
    if (!n_clean) g_contended = true;
    double med = n_clean ? median(clean, n_clean) : median(ts, reps);
    free(ts);
    free(clean);
    return med;
}

/* Prints v in a field of width w, with a '*' when it came from contended runs only. */
static void put(double v, int w) {
    printf(" %*.1f%s", w, v, g_contended ? "*" : "");
    g_contended = false;
    fflush(stdout);
}

// Report

typedef struct {
    int threads, reps;
    bool head, pp_only;
    ps_pool *pool;
} opts;

/* GB/s of weight bytes at n_tok = 1: cold (copies beyond L3) or hot. */
static double gemv_gbs(ps_type t, int64_t rows, int64_t cols, bool cold, const opts *o) {
    problem p;
    problem_make(&p, t, rows, cols, 1, cold ? (size_t)96 << 20 : 0, o->threads);
    double s = time_gemm(&p, 1, o->reps * 3, 4, o->pool);
    problem_free(&p);
    return (double)ps_row_bytes(t, cols) * (double)rows / s / 1e9;
}

static double gemv_us(ps_type t, int64_t rows, int64_t cols, const opts *o) {
    problem p;
    problem_make(&p, t, rows, cols, 1, 0, o->threads);
    double s = time_gemm(&p, 1, o->reps * 3, 200, o->pool);
    problem_free(&p);
    return s * 1e6;
}

static double gemm_gflops(ps_type t, int64_t rows, int64_t cols, int64_t n_tok, const opts *o) {
    problem p;
    problem_make(&p, t, rows, cols, n_tok, 0, o->threads);
    int reps = rows > 100000 ? 3 : o->reps;
    double s = time_gemm(&p, n_tok, reps, 1, o->pool);
    problem_free(&p);
    return 2.0 * (double)rows * (double)cols * (double)n_tok / s / 1e9;
}

static void bench_row(ps_type t, const char *isa, const opts *o) {
    if (ps_gemm_set_isa(isa) != PS_OK) return;
    printf("%-5s %-7s", ps_type_name(t), isa);
    if (o->pp_only)
        printf(" %9s %8s %7s", "", "", "");
    else
        put(gemv_gbs(t, 2048, 8192, true, o), 9);
    if (!o->pp_only) put(gemv_gbs(t, 2048, 8192, false, o), 8);
    if (o->pp_only) {
    } else if (ps_row_bytes(t, 576)) {
        put(gemv_us(t, 576, 576, o), 7);
    } else {
        printf(" %7s", "-"); /* 576 is no multiple of a K super-block */
    }
    put(gemm_gflops(t, 2048, 2048, 128, o), 9);
    put(gemm_gflops(t, 8192, 2048, 128, o), 9);
    put(gemm_gflops(t, 2048, 8192, 128, o), 9);
    if (o->head) put(gemm_gflops(t, 128256, 2048, 128, o), 10);
    printf("\n");
}

static int parse_types(const char *s, ps_type *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
        if (ps_type_from_name(tok, &out[n]) != PS_OK || !ps_gemm_supported(out[n])) {
            fprintf(stderr, "bench_gemm: unsupported type '%s'\n", tok);
            exit(2);
        }
        n++;
    }
    return n;
}

int main(int argc, char **argv) {
    opts o = {.threads = 2, .reps = 7};
    const char *isas = "avx512,avx2", *types = "Q4_0,Q8_0,Q4_1,Q4_K,Q5_K,Q6_K,Q5_0,Q5_1,F16,BF16,F32";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-i") && i + 1 < argc)
            isas = argv[++i];
        else if (!strcmp(argv[i], "-T") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "-s"))
            o.head = true;
        else if (!strcmp(argv[i], "-q"))
            quick = true;
        else if (!strcmp(argv[i], "-p"))
            o.pp_only = true;
        else {
            fprintf(stderr, "usage: bench_gemm [-t threads] [-r reps] [-i isa,...] [-T type,...] [-s] [-q] [-p]\n");
            return 2;
        }
    }
    if (getenv("PS_GEMM_CHUNK")) ps_gemm_set_chunk(atoi(getenv("PS_GEMM_CHUNK"))); /* tuning */
    if (o.threads < 1 || o.reps < 1 || ps_pool_create(o.threads, &o.pool) != PS_OK) return 2;
    if (!quick) baselines(o.pool, o.reps);
    ps_type ts[16];
    int nt = parse_types(types, ts, 16);
    printf("\n%-5s %-7s %9s %8s %7s %9s %9s %9s%s\n", "type", "isa", "gemv cold", "gemv hot", "576", "pp128", "pp128",
           "pp128", o.head ? "      pp128" : "");
    printf("%-5s %-7s %9s %8s %7s %9s %9s %9s%s\n", "", "", "2048x8192", "GB/s", "us", "2048x2048", "8192x2048",
           "2048x8192", o.head ? " 128256x2048" : "");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", isas);
    char *isa_list[8];
    int ni = 0;
    for (char *tok = strtok(buf, ","); tok && ni < 8; tok = strtok(NULL, ",")) isa_list[ni++] = tok;
    for (int i = 0; i < nt; i++)
        for (int k = 0; k < ni; k++) bench_row(ts[i], isa_list[k], &o);
    ps_pool_free(o.pool);
    return 0;
}
