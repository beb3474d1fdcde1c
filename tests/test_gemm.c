/* test_gemm.c - ps_gemm (f32 activations against quantized weights) for every weight type
 * and kernel family:
 *   - ref against a double-precision dot of ps_dequantize_row's weights (a tolerance
 *     from the f32 error bound), to catch a wrong formula;
 *   - every other available family against ref bit for bit (memcmp), on the full batch
 *     and for every thread count (1, 2, 3);
 *   - batch invariance bit for bit: n_tok = 1, 2, 3, 4, 5, 7, 64 taken from the front and
 *     the back of the n_tok = 300 batch (150 under ASan), a sub-range of rows, strided x
 *     and y;
 *   - y entries outside the output untouched; weights, activations and scratch allocated
 *     to the byte (weights at an odd address), so that the sanitizers catch overreads.
 * Shapes are small (a sanitizer build runs this too) but cross every boundary: several
 * row chunks, column chunks (with the chunk set to 256 columns) and token blocks, and
 * ragged tails of each. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "tensor/f32_kern.h"
#include "tensor/gemm.h"
#include "tensor/pool.h"

#define ROWS 101 /* > 65536 multiply-adds at n_tok = 1 with 768 columns: threads split rows */
#if defined(__SANITIZE_ADDRESS__)
#define N_TOK 150 /* > 1 token block of the panel path; the sanitizer build is slow */
#else
#define N_TOK 300 /* > 2 token blocks of the panel path */
#endif
#define XPAD     5 /* x_stride = cols + XPAD */
#define YPAD     3 /* y_stride = ROWS + YPAD */
#define SENTINEL 0x7fc0dead

// Random data (ps_test_rng_*, seeded in main)

/* Activations: mostly small, some outliers, a few -0.0 and some all-zero 32-runs. */
static void fill_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = ps_test_rng_f();
        if (ps_test_rng_u32() % 61 == 0) x[i] *= 40.0f;
        if (ps_test_rng_u32() % 97 == 0) x[i] = -0.0f;
    }
    if (n >= 64 && ps_test_rng_u32() % 3 == 0) memset(x + 32, 0, 32 * sizeof *x);
}

/* Quantized weights of rows × cols; row scales vary over three decades, and row 3 is all
 * zero (zero scales give -0.0 weights in some formats). */
static uint8_t *make_weights(ps_type t, int64_t rows, int64_t cols, size_t rb) {
    uint8_t *w = malloc(rb * (size_t)rows + 1);
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    if (!w || !tmp) abort();
    for (int64_t r = 0; r < rows; r++) {
        float scale = powf(10.0f, (float)(r % 7) / 2.0f - 1.5f);
        for (int64_t c = 0; c < cols; c++) tmp[c] = r == 3 ? 0.0f : ps_test_rng_f() * scale;
        if (ps_quantize_row(t, tmp, w + 1 + rb * (size_t)r, cols) != PS_OK) abort();
    }
    free(tmp);
    return w;
}

// A test problem

typedef struct {
    ps_type type;
    int64_t rows, cols;
    size_t rb;         /* bytes per weight row */
    uint8_t *wbuf;     /* rows × rb bytes at wbuf + 1 (an odd address) */
    float *x;          /* N_TOK rows of cols, stride cols + XPAD */
    float *y_ref;      /* N_TOK rows of ROWS, stride ROWS + YPAD, from the ref family */
    ps_pool *pools[3]; /* 1, 2 and 3 threads */
} problem;

static int64_t xs_of(const problem *p) { return p->cols + XPAD; }

static ps_mat mat_of(const problem *p, int64_t r0, int64_t nr) {
    return (ps_mat){.type = p->type, .rows = nr, .cols = p->cols, .data = p->wbuf + 1 + p->rb * (size_t)r0};
}

static float *alloc_y(int64_t n_tok) {
    float *y = malloc(sizeof(float) * (size_t)(n_tok * (ROWS + YPAD)));
    if (!y) abort();
    uint32_t s = SENTINEL;
    for (int64_t i = 0; i < n_tok * (ROWS + YPAD); i++) memcpy(y + i, &s, 4);
    return y;
}

/* ps_gemm of rows [r0, r0 + nr) against tokens [t0, t0 + n) into y (stride ROWS +
 * YPAD, row r at column r - r0), with scratch allocated to the byte. */
static void run(const problem *p, int64_t r0, int64_t nr, int64_t t0, int64_t n, float *y, ps_pool *pool) {
    size_t sb = ps_gemm_scratch_bytes(p->type, p->cols, n, ps_pool_size(pool));
    void *scratch = sb ? malloc(sb) : NULL;
    ps_mat m = mat_of(p, r0, nr);
    ps_gemm(&m, p->x + t0 * xs_of(p), xs_of(p), n, y, ROWS + YPAD, scratch, pool);
    free(scratch);
}

/* y[t][r - r0] == y_ref[t0 + t][r] bit for bit, and the rest of each y row untouched. */
static bool same(const problem *p, const float *y, int64_t r0, int64_t nr, int64_t t0, int64_t n) {
    for (int64_t t = 0; t < n; t++) {
        const float *a = y + t * (ROWS + YPAD), *b = p->y_ref + (t0 + t) * (ROWS + YPAD) + r0;
        if (memcmp(a, b, sizeof(float) * (size_t)nr) != 0) return false;
        for (int64_t r = nr; r < ROWS + YPAD; r++) {
            uint32_t s;
            memcpy(&s, a + r, 4);
            if (s != SENTINEL) return false;
        }
    }
    return true;
}

static void problem_init(problem *p, ps_type t, int64_t cols) {
    *p = (problem){.type = t, .rows = ROWS, .cols = cols, .rb = ps_row_bytes(t, cols)};
    p->wbuf = make_weights(t, ROWS, cols, p->rb);
    p->x = malloc(sizeof(float) * (size_t)(N_TOK * xs_of(p)));
    if (!p->x) abort();
    for (int64_t i = 0; i < N_TOK; i++) fill_x(p->x + i * xs_of(p), xs_of(p));
    for (int i = 0; i < 3; i++)
        if (ps_pool_create(i + 1, &p->pools[i]) != PS_OK) abort();
    p->y_ref = alloc_y(N_TOK);
    PS_CHECK_OK(ps_gemm_set_isa("ref"));
    run(p, 0, ROWS, 0, N_TOK, p->y_ref, p->pools[1]);
}

static void problem_free(problem *p) {
    for (int i = 0; i < 3; i++) ps_pool_free(p->pools[i]);
    free(p->wbuf);
    free(p->x);
    free(p->y_ref);
}

// Checks

/* ref against a double-precision dot of the dequantized weights: |err| <= (cols / 16 +
 * 8) ulp-ish of sum |w x| (16 running sums of cols / 16 terms, then 4 tree levels). */
static void check_ref_exactish(const problem *p) {
    float *w = malloc(sizeof(float) * (size_t)p->cols);
    if (!w) abort();
    int bad = 0;
    for (int64_t r = 0; r < p->rows; r++) {
        PS_CHECK_OK(ps_dequantize_row(p->type, p->wbuf + 1 + p->rb * (size_t)r, w, p->cols));
        for (int64_t t = 0; t < N_TOK; t++) {
            const float *x = p->x + t * xs_of(p);
            double dot = 0, mag = 0;
            for (int64_t c = 0; c < p->cols; c++) {
                dot += (double)w[c] * (double)x[c];
                mag += fabs((double)w[c] * (double)x[c]);
            }
            double tol = (double)(p->cols / 16 + 8) * 0x1p-24 * mag + 1e-30;
            if (fabs((double)p->y_ref[t * (ROWS + YPAD) + r] - dot) > tol && bad++ < 5)
                fprintf(stderr, "%s: ref y[%lld][%lld] = %.9g, double %.9g (tol %.3g)\n", ps_type_name(p->type),
                        (long long)t, (long long)r, p->y_ref[t * (ROWS + YPAD) + r], dot, tol);
        }
    }
    PS_CHECK_EQ_INT(bad, 0);
    free(w);
}

/* One family: the full batch on 1, 2 and 3 threads, sub-batches from both ends, and a
 * sub-range of rows, all bit-identical to ref's full batch. */
static void check_family(const problem *p, const char *isa) {
    if (ps_gemm_set_isa(isa) != PS_OK) return;
    float *y = alloc_y(N_TOK);
    bool ok_full = true, ok_sub = true, ok_rows = true;
    for (int i = strcmp(isa, "ref") == 0 ? 2 : 0; i < 3; i++) { /* ref's 2-thread run is y_ref */
        run(p, 0, ROWS, 0, N_TOK, y, p->pools[i]);
        ok_full &= same(p, y, 0, ROWS, 0, N_TOK);
    }
    static const int64_t subs[] = {1, 2, 3, 4, 5, 7, 64};
    for (size_t k = 0; k < PS_ARRAY_LEN(subs); k++) {
        for (int end = 0; end < 2; end++) {
            int64_t t0 = end ? N_TOK - subs[k] : (int64_t)k * 3;
            float *ys = alloc_y(subs[k]), *yr = alloc_y(subs[k]);
            run(p, 0, ROWS, t0, subs[k], ys, p->pools[k % 3]);
            ok_sub &= same(p, ys, 0, ROWS, t0, subs[k]);
            run(p, 5, 13, t0, subs[k], yr, p->pools[1]);
            ok_rows &= same(p, yr, 5, 13, t0, subs[k]);
            free(ys);
            free(yr);
        }
    }
    if (!ok_full || !ok_sub || !ok_rows)
        fprintf(stderr, "%s/%s: full %d, sub-batches %d, row range %d\n", isa, ps_type_name(p->type), ok_full, ok_sub,
                ok_rows);
    PS_CHECK(ok_full);
    PS_CHECK(ok_sub);
    PS_CHECK(ok_rows);
    free(y);
}

/* Every family, with the default column chunk (one chunk here) and with 256-column
 * chunks (partial sums carried across chunks, a ragged last chunk). */
static void test_type(ps_type t, int64_t cols) {
    problem p;
    problem_init(&p, t, cols);
    check_ref_exactish(&p);
    check_family(&p, "ref");
    for (int k = 0; k < 2; k++) {
        ps_gemm_set_chunk(k ? 256 : 0);
        check_family(&p, "avx2");
        check_family(&p, "avx512");
    }
    ps_gemm_set_chunk(0);
    problem_free(&p);
}

/* F32 rows shorter than one 16-lane step, and of 17 columns: the masked tails alone. */
static void test_short_rows(void) {
    for (int64_t cols = 1; cols <= 17; cols += 8) {
        problem p;
        problem_init(&p, PS_TYPE_F32, cols);
        check_ref_exactish(&p);
        check_family(&p, "avx2");
        check_family(&p, "avx512");
        problem_free(&p);
    }
}

/* Scratch-free calls (large batches then take the fused path), zero columns (y = +0) and
 * a column count that is no multiple of the block (y untouched) on the best family. */
static void test_edges(void) {
    problem p;
    problem_init(&p, PS_TYPE_Q4_K, 512);
    PS_CHECK_OK(ps_gemm_set_isa("ref"));
    ps_gemm_set_isa("avx2");
    ps_gemm_set_isa("avx512");
    float *y = alloc_y(N_TOK);
    ps_mat m = mat_of(&p, 0, ROWS);
    ps_gemm(&m, p.x, xs_of(&p), N_TOK, y, ROWS + YPAD, NULL, p.pools[1]);
    PS_CHECK(same(&p, y, 0, ROWS, 0, N_TOK));
    float *y0 = alloc_y(N_TOK);
    m.cols = 0;
    ps_gemm(&m, p.x, xs_of(&p), N_TOK, y0, ROWS + YPAD, NULL, p.pools[1]);
    bool zero = true;
    for (int64_t t = 0; t < N_TOK; t++)
        for (int64_t r = 0; r < ROWS; r++) zero &= memcmp(&y0[t * (ROWS + YPAD) + r], &(float){0.0f}, 4) == 0;
    PS_CHECK(zero);
    float *yb = alloc_y(N_TOK);
    m.cols = 100; /* not a multiple of 256 */
    ps_gemm(&m, p.x, xs_of(&p), N_TOK, yb, ROWS + YPAD, NULL, p.pools[1]);
    uint32_t first;
    memcpy(&first, yb, 4);
    PS_CHECK_EQ_INT(first, SENTINEL);
    free(y);
    free(y0);
    free(yb);
    problem_free(&p);
}

static void test_api(void) {
    static const ps_type yes[] = {PS_TYPE_F32,  PS_TYPE_F16,  PS_TYPE_BF16, PS_TYPE_Q8_0, PS_TYPE_Q4_0, PS_TYPE_Q4_1,
                                  PS_TYPE_Q5_0, PS_TYPE_Q5_1, PS_TYPE_Q4_K, PS_TYPE_Q5_K, PS_TYPE_Q6_K};
    for (size_t i = 0; i < PS_ARRAY_LEN(yes); i++) PS_CHECK(ps_gemm_supported(yes[i]));
    PS_CHECK(!ps_gemm_supported(PS_TYPE_Q8_1));
    PS_CHECK(!ps_gemm_supported(PS_TYPE_Q2_K));
    PS_CHECK(!ps_gemm_supported(999));
    PS_CHECK_EQ_INT(ps_gemm_scratch_bytes(PS_TYPE_Q4_0, 2048, 1, 2), 0);
    PS_CHECK_EQ_INT(ps_gemm_scratch_bytes(PS_TYPE_Q4_0, 2048, 0, 2), 0);
    PS_CHECK_EQ_INT(ps_gemm_set_isa("sse9"), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gemm_set_isa(NULL), PS_ERR_ARG);
    PS_CHECK_OK(ps_gemm_set_isa("ref"));
    PS_CHECK(strcmp(ps_gemm_isa(), "ref") == 0);
    printf("families: ref%s%s\n", ps_gemm_set_isa("avx2") == PS_OK ? " avx2" : "",
           ps_gemm_set_isa("avx512") == PS_OK ? " avx512" : "");
}

int main(void) {
    ps_test_rng_seed(0x2545f4914f6cdd1dULL);
    test_api();
    test_type(PS_TYPE_F32, 300);
    test_type(PS_TYPE_F16, 300);
    test_type(PS_TYPE_BF16, 300);
    test_type(PS_TYPE_Q8_0, 800);
    test_type(PS_TYPE_Q4_0, 800);
    test_type(PS_TYPE_Q4_1, 800);
    test_type(PS_TYPE_Q5_0, 800);
    test_type(PS_TYPE_Q5_1, 800);
    test_type(PS_TYPE_Q4_K, 768);
    test_type(PS_TYPE_Q5_K, 768);
    test_type(PS_TYPE_Q6_K, 768);
    test_short_rows();
    test_edges();
    return ps_test_done();
}
