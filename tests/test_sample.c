/* test_sample.c - the counter-based RNG and the sampler chain.
 *
 * Expected values are computed here from the formulas (in double), never by the
 * sampler itself; statistical checks use chi-square goodness of fit at the 0.999
 * level with fixed seeds, so they are deterministic (a pass stays a pass). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps.h"
#include "ps_test.h"
#include "sample/sample.h"

/* Upper 0.999 quantiles of the chi-square distribution, by degrees of freedom
 * (standard tables; recomputed from the regularised incomplete gamma function). */
#define CHI2_999_DF3  16.266
#define CHI2_999_DF4  18.467
#define CHI2_999_DF9  27.877
#define CHI2_999_DF15 37.697
#define CHI2_999_DF19 43.820
#define CHI2_999_DF99 148.230

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

// ---- RNG ----------------------------------------------------------------------------

/* Random123's kat_vectors, the three "philox4x32 10" lines. */
static void test_philox_kat(void) {
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
    static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        ps_rng_philox4x32_10(ctr[i], key[i], out);
        for (int j = 0; j < 4; j++) PS_CHECK_EQ_INT(out[j], want[i][j]);
    }
    /* the documented layout: key = seed, counter = (position, stream, 0) */
    uint32_t out[4];
    ps_rng_philox4x32_10(ctr[2], key[2], out);
    uint64_t seed = (uint64_t)0x299f31d0 << 32 | 0xa4093822;
    uint64_t pos = (uint64_t)0x85a308d3 << 32 | 0x243f6a88;
    ps_rng_philox4x32_10((const uint32_t[4]){0x243f6a88, 0x85a308d3, 7, 0}, key[2], out);
    PS_CHECK(ps_rng_u64(seed, pos, 7) == ((uint64_t)out[0] << 32 | out[1]));
}

/* Purity, range, and that seed, position and stream each change the draw. */
static void test_rng_basics(void) {
    PS_CHECK(ps_rng_uniform(1, 2, 0) == ps_rng_uniform(1, 2, 0));
    PS_CHECK(ps_rng_u64(1, 2, 0) != ps_rng_u64(1, 3, 0));
    PS_CHECK(ps_rng_u64(1, 2, 0) != ps_rng_u64(2, 2, 0));
    PS_CHECK(ps_rng_u64(1, 2, 0) != ps_rng_u64(1, 2, 1));
    PS_CHECK(ps_rng_u64(1, 2, 0) != ps_rng_u64(1, 2 + (1ull << 32), 0));
    PS_CHECK(ps_rng_u64(1, 2, 0) != ps_rng_u64(1 + (1ull << 32), 2, 0));
    int in_range = 1;
    for (uint64_t i = 0; i < 10000; i++) {
        double u = ps_rng_uniform(99, i, 0);
        in_range &= u >= 0.0 && u < 1.0;
    }
    PS_CHECK(in_range);
}

/* 10^6 draws at positions 0..N-1 into 100 equal bins. */
static void test_rng_uniformity(void) {
    enum { BINS = 100, N = 1000000 };
    static long count[BINS];
    for (uint64_t seed = 0; seed < 2; seed++) {
        memset(count, 0, sizeof count);
        for (uint64_t i = 0; i < N; i++) count[(int)(ps_rng_uniform(seed * 0x9e3779b97f4a7c15ull, i, 0) * BINS)]++;
        double chi2 = 0, e = (double)N / BINS;
        for (int b = 0; b < BINS; b++) chi2 += (count[b] - e) * (count[b] - e) / e;
        printf("rng uniformity, seed %llu: chi2 = %.2f (99 dof, 0.999 critical %.2f)\n", (unsigned long long)seed, chi2,
               CHI2_999_DF99);
        PS_CHECK(chi2 < CHI2_999_DF99);
    }
}

// ---- helpers ------------------------------------------------------------------------

static ps_sampler *make(int32_t n) {
    ps_sampler *s = NULL;
    char err[128];
    PS_CHECK_OK(ps_sampler_create(n, &s, err, sizeof err));
    return s;
}

/* The kept set of ps_sample_dist equals want[0, n_want) in this order. */
static void check_kept(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *want,
                       int32_t n_want) {
    const int32_t *ids;
    const float *probs;
    int32_t n = -1;
    PS_CHECK_OK(ps_sample_dist(s, p, logits, NULL, 0, &ids, &probs, &n));
    PS_CHECK_EQ_INT(n, n_want);
    for (int32_t i = 0; i < n && i < n_want; i++) PS_CHECK_EQ_INT(ids[i], want[i]);
}

/* softmax((logits[ids[i]]) / T) over the listed ids, in double. */
static void ref_softmax(const float *logits, const int32_t *ids, int n, double t, double *out) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, logits[ids[i]]);
    for (int i = 0; i < n; i++) z += out[i] = exp((logits[ids[i]] - mx) / t);
    for (int i = 0; i < n; i++) out[i] /= z;
}

// ---- greedy and truncation ----------------------------------------------------------

static void test_greedy(void) {
    ps_sampler *s = make(6);
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0;
    const float a[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -INFINITY};
    int32_t tok = -7;
    PS_CHECK_OK(ps_sample(s, &p, a, NULL, 0, 0, &tok));
    PS_CHECK_EQ_INT(tok, 1); /* tie between 1 and 3: lowest id */
    const float b[6] = {-INFINITY, -INFINITY, -5.0f, -INFINITY, -6.0f, -INFINITY};
    PS_CHECK_OK(ps_sample(s, &p, b, NULL, 0, 123, &tok));
    PS_CHECK_EQ_INT(tok, 2);
    const float c[6] = {-0.0f, 0.0f, -1.0f, -0.0f, -2.0f, -3.0f}; /* -0 ties with +0 */
    PS_CHECK_OK(ps_sample(s, &p, c, NULL, 0, 0, &tok));
    PS_CHECK_EQ_INT(tok, 0);
    p.top_k = 1, p.top_p = 0.1f, p.min_p = 0.9f; /* truncation cannot change the argmax */
    PS_CHECK_OK(ps_sample(s, &p, a, NULL, 0, 5, &tok));
    PS_CHECK_EQ_INT(tok, 1);
    const int32_t want[1] = {1};
    check_kept(s, &p, a, want, 1);
    ps_sampler_free(s);
}

/* Greedy against one sequential pass (the first of the largest logits) over vocabularies
 * of 1 to 300 tokens and 50,000, whose logits take few values (many ties, -0 beside +0,
 * -inf runs), the maximum anywhere: argmax's lanes and its tail give the same token. */
static void test_greedy_lanes(void) {
    static float l[50000];
    static const float vals[] = {-INFINITY, -1.0f, -0.0f, 0.0f, 0.5f, 2.0f};
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0;
    int bad = 0, runs = 0;
    for (int n = 1; n <= 50000; n = n < 300 ? n + 1 : n == 300 ? 50000 : 50001) {
        ps_sampler *s = make(n);
        for (int rep = 0; s && rep < (n < 300 ? 4 : 40); rep++, runs++) {
            for (int i = 0; i < n; i++) l[i] = vals[ps_test_rng_u32() % (rep % 2 ? 4 : 6)];
            if (rep % 4 == 3) l[ps_test_rng_u32() % n] = 3.0f; /* one maximum, anywhere */
            int32_t want = 0, tok = -7;
            for (int i = 1; i < n; i++)
                if (l[i] > l[want]) want = i;
            if (l[want] == -INFINITY) continue; /* refused: test_greedy */
            PS_CHECK_OK(ps_sample(s, &p, l, NULL, 0, 0, &tok));
            bad += tok != want;
        }
        ps_sampler_free(s);
    }
    printf("greedy: %d of %d vocabularies' tokens differ from one sequential pass\n", bad, runs);
    PS_CHECK(bad == 0);
}

/* Hand-made logits; draw order: 1, 3 (tie at 3.0, lower id first), 6, 2, 0, 4, 7. */
static const float trunc_logits[8] = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, -INFINITY, 2.5f, 0.0f};
static const int32_t trunc_order[7] = {1, 3, 6, 2, 0, 4, 7};

static void test_top_k(void) {
    ps_sampler *s = make(8);
    ps_sample_params p = ps_sample_params_default();
    p.top_k = 3;
    check_kept(s, &p, trunc_logits, trunc_order, 3);
    p.top_k = 1;
    check_kept(s, &p, trunc_logits, trunc_order, 1);
    p.top_k = 7;
    check_kept(s, &p, trunc_logits, trunc_order, 7);
    p.top_k = 1000;
    check_kept(s, &p, trunc_logits, trunc_order, 7);
    p.top_k = 0;
    check_kept(s, &p, trunc_logits, trunc_order, 7);
    ps_sampler_free(s);
}

/* top_p halfway between two cumulative sums keeps the prefix that crosses it. */
static void test_top_p(void) {
    ps_sampler *s = make(8);
    ps_sample_params p = ps_sample_params_default();
    double prob[7], cum[7];
    ref_softmax(trunc_logits, trunc_order, 7, 1.0, prob);
    for (int i = 0; i < 7; i++) cum[i] = prob[i] + (i ? cum[i - 1] : 0);
    for (int k = 1; k <= 6; k++) {
        p.top_p = (float)((k == 1 ? 0 : cum[k - 2]) + cum[k - 1]) / 2;
        check_kept(s, &p, trunc_logits, trunc_order, k);
    }
    p.top_p = 1.0f;
    check_kept(s, &p, trunc_logits, trunc_order, 7);
    /* top_p is measured at temperature 1, whatever the temperature */
    p.top_p = (float)((cum[1] + cum[2]) / 2);
    p.temperature = 5.0f;
    check_kept(s, &p, trunc_logits, trunc_order, 3);
    ps_sampler_free(s);
}

/* min_p keeps logit >= max + log(min_p): max is 3.0. */
static void test_min_p(void) {
    ps_sampler *s = make(8);
    ps_sample_params p = ps_sample_params_default();
    p.min_p = 0.5f; /* threshold 3 - 0.693 = 2.307 */
    check_kept(s, &p, trunc_logits, trunc_order, 3);
    p.min_p = 0.3f; /* 3 - 1.204 = 1.796 */
    check_kept(s, &p, trunc_logits, trunc_order, 4);
    p.min_p = 1.0f; /* only the ties of the max */
    check_kept(s, &p, trunc_logits, trunc_order, 2);
    p.min_p = 0.01f; /* 3 - 4.6: all */
    check_kept(s, &p, trunc_logits, trunc_order, 7);
    /* in the chain: top-k 5 then top-p then min-p */
    p.top_k = 5, p.top_p = 0.99f, p.min_p = 0.3f;
    check_kept(s, &p, trunc_logits, trunc_order, 4);
    p.top_k = 2, p.min_p = 0.01f;
    check_kept(s, &p, trunc_logits, trunc_order, 2);
    ps_sampler_free(s);
}

/* Kept probabilities equal the renormalised softmax at T. */
static void test_dist_probs(void) {
    ps_sampler *s = make(8);
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0.5f;
    p.top_k = 4;
    const int32_t *ids;
    const float *probs;
    int32_t n;
    double want[7];
    PS_CHECK_OK(ps_sample_dist(s, &p, trunc_logits, NULL, 0, &ids, &probs, &n));
    ref_softmax(trunc_logits, trunc_order, 4, 0.5, want);
    PS_CHECK_EQ_INT(n, 4);
    for (int i = 0; i < n && i < 4; i++) PS_CHECK(near(probs[i], want[i], 1e-6));
    p.top_k = 0;
    PS_CHECK_OK(ps_sample_dist(s, &p, trunc_logits, NULL, 0, &ids, &probs, &n));
    ref_softmax(trunc_logits, trunc_order, 7, 0.5, want);
    PS_CHECK_EQ_INT(n, 7);
    for (int i = 0; i < n && i < 7; i++) PS_CHECK(near(probs[i], want[i], 1e-6));
    ps_sampler_free(s);
}

// ---- large vocabulary: partial sorting against a full sort --------------------------

static const float *big_logits;
/* logit descending, ties by id: the documented draw order. */
static int cmp_draw_order(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (big_logits[x] != big_logits[y]) return big_logits[x] > big_logits[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* Logits quantised to 1/16 so that there are many ties; a few -inf. */
static void make_big(float *l, int32_t n, uint64_t seed) {
    for (int32_t i = 0; i < n; i++) {
        double u = ps_rng_uniform(seed, (uint64_t)i, 9);
        l[i] = (float)(floor(u * 160.0) / 16.0 - 5.0);
        if (i % 1000 == 999) l[i] = -INFINITY;
    }
    l[n / 2] = 6.0f; /* a clear favourite */
}

/* Logits shaped like a language model's (SmolLM2-135M's, read off 64 steps of a story at
 * T = 1: the bulk normal with a spread of 3 to 4 and some 18 to 20 below the best, a few
 * tokens within 2 of it): 3.5 N(0, 1), then 8 tokens at 19 above the mean and just below. */
static void make_model_like(float *l, int32_t n, uint64_t seed) {
    for (int32_t i = 0; i < n; i++) {
        double u1 = ps_rng_uniform(seed, (uint64_t)i, 10), u2 = ps_rng_uniform(seed, (uint64_t)i, 11);
        l[i] = (float)(3.5 * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
    static const float head[8] = {0.0f, -0.3f, -1.0f, -1.4f, -1.8f, -2.0f, -2.5f, -3.0f};
    for (int k = 0; k < 8; k++) l[(int32_t)((uint64_t)(k + 1) * 7919 % (uint64_t)n)] = 19.0f + head[k];
}

static void test_big_vocab(void) {
    enum { N = 128256 };
    float *l = malloc(N * sizeof *l);
    int32_t *order = malloc(N * sizeof *order);
    ps_sampler *s = make(N);
    make_big(l, N, 5);
    big_logits = l;
    int32_t n_fin = 0;
    for (int32_t i = 0; i < N; i++)
        if (l[i] != -INFINITY) order[n_fin++] = i;
    qsort(order, (size_t)n_fin, sizeof *order, cmp_draw_order);

    ps_sample_params p = ps_sample_params_default();
    const int32_t ks[] = {1, 40, 1000, 100000};
    for (size_t i = 0; i < PS_ARRAY_LEN(ks); i++) {
        p.top_k = ks[i];
        check_kept(s, &p, l, order, ks[i]);
    }
    p.top_k = 0;
    check_kept(s, &p, l, order, n_fin);
    /* top-p against a cumulative sum over the full sort */
    p.top_p = 0.6f;
    double z = 0, cum = 0;
    for (int32_t i = 0; i < n_fin; i++) z += exp(l[order[i]] - 6.0);
    int32_t want = 0;
    while (cum < 0.6f * z) cum += exp(l[order[want++]] - 6.0);
    printf("big vocab: top_p 0.6 keeps %d of %d\n", want, n_fin);
    check_kept(s, &p, l, order, want);
    ps_sampler_free(s);
    free(order);
    free(l);
}

// ---- penalties ----------------------------------------------------------------------

/* Compares the distribution at T = 1 with softmax of the expected penalised logits. */
static void check_penalised(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *hist,
                            int64_t n_hist, const double *want_logit, int n) {
    const int32_t *ids;
    const float *probs;
    int32_t k;
    PS_CHECK_OK(ps_sample_dist(s, p, logits, hist, n_hist, &ids, &probs, &k));
    PS_CHECK_EQ_INT(k, n);
    double z = 0;
    for (int i = 0; i < n; i++) z += exp(want_logit[i]);
    for (int i = 0; i < k && i < n; i++) PS_CHECK(near(probs[i], exp(want_logit[ids[i]]) / z, 1e-6));
}

static void test_penalties(void) {
    ps_sampler *s = make(4);
    const float l[4] = {2.0f, -1.0f, 1.5f, 0.5f};
    const int32_t hist[5] = {0, 0, 1, 3, 0};
    float copy[4];
    memcpy(copy, l, sizeof l);
    ps_sample_params p = ps_sample_params_default();
    p.repetition_penalty = 2.0f; /* >0 divided, <=0 multiplied */
    check_penalised(s, &p, l, hist, 5, (const double[4]){1.0, -2.0, 1.5, 0.25}, 4);
    p.frequency_penalty = 0.1f, p.presence_penalty = 0.2f; /* then - (count*freq + presence) */
    check_penalised(s, &p, l, hist, 5, (const double[4]){1.0 - 0.5, -2.0 - 0.3, 1.5, 0.25 - 0.3}, 4);
    p.penalty_last_n = 2; /* window {3, 0} */
    check_penalised(s, &p, l, hist, 5, (const double[4]){1.0 - 0.3, -1.0, 1.5, 0.25 - 0.3}, 4);
    p.penalty_last_n = 0; /* off */
    check_penalised(s, &p, l, hist, 5, (const double[4]){2.0, -1.0, 1.5, 0.5}, 4);
    p.penalty_last_n = -1, p.repetition_penalty = 1.0f; /* OpenAI terms alone, whole history */
    check_penalised(s, &p, l, hist, 5, (const double[4]){2.0 - 0.5, -1.0 - 0.3, 1.5, 0.5 - 0.3}, 4);
    PS_CHECK(memcmp(copy, l, sizeof l) == 0); /* the caller's logits are not touched */
    /* the penalty moves the argmax */
    ps_sample_params g = ps_sample_params_default();
    g.temperature = 0, g.repetition_penalty = 1.5f;
    int32_t tok;
    PS_CHECK_OK(ps_sample(s, &g, l, hist, 5, 0, &tok));
    PS_CHECK_EQ_INT(tok, 2);
    PS_CHECK_OK(ps_sample(s, &g, l, NULL, 0, 0, &tok));
    PS_CHECK_EQ_INT(tok, 0);
    /* a bad history token is rejected and leaves no counts behind */
    const int32_t bad[3] = {0, 4, 1};
    PS_CHECK_EQ_INT(ps_sample(s, &g, l, bad, 3, 0, &tok), PS_ERR_ARG);
    PS_CHECK_EQ_INT(tok, -1);
    PS_CHECK(strstr(ps_sampler_error(s), "history[1] = 4") != NULL);
    PS_CHECK_EQ_INT(ps_sample(s, &g, l, (const int32_t[1]){-1}, 1, 0, &tok), PS_ERR_ARG);
    p = ps_sample_params_default();
    p.repetition_penalty = 2.0f;
    check_penalised(s, &p, l, hist, 5, (const double[4]){1.0, -2.0, 1.5, 0.25}, 4);
    ps_sampler_free(s);
}

// ---- reproducibility ----------------------------------------------------------------

static void test_reproducible(void) {
    enum { N = 1000 };
    const float l[8] = {0.1f, 0.3f, 0.2f, 0.0f, 0.25f, 0.15f, 0.05f, 0.3f};
    ps_sampler *a = make(8), *b = make(8);
    ps_sample_params p = ps_sample_params_default();
    p.seed = 777;
    int32_t seq[N], hist[8] = {0};
    int seen[8] = {0}, distinct = 0, same_other_seed = 0;
    for (int i = 0; i < N; i++) PS_CHECK_OK(ps_sample(a, &p, l, NULL, 0, (uint64_t)i, &seq[i]));
    for (int i = 0; i < N; i++) distinct += !seen[seq[i]]++;
    PS_CHECK_EQ_INT(distinct, 8);
    /* another sampler, positions visited backwards, other calls in between: same tokens */
    int ok = 1;
    for (int i = N - 1; i >= 0; i--) {
        int32_t t, junk;
        PS_CHECK_OK(ps_sample(b, &p, l, hist, 8, 5000 + (uint64_t)i, &junk));
        PS_CHECK_OK(ps_sample(b, &p, l, NULL, 0, (uint64_t)i, &t));
        ok &= t == seq[i];
    }
    PS_CHECK(ok);
    p.seed = 778;
    for (int i = 0; i < N; i++) {
        int32_t t;
        PS_CHECK_OK(ps_sample(a, &p, l, NULL, 0, (uint64_t)i, &t));
        same_other_seed += t == seq[i];
    }
    PS_CHECK(same_other_seed < N / 2); /* about N/7 expected */
    ps_sampler_free(a);
    ps_sampler_free(b);
}

/* ps_sample is the inverse CDF of ps_sample_dist at u = ps_rng_uniform(seed, pos, 0). */
/* Draws of ps_sample at positions 0 .. n_pos - 1 that differ from the inverse CDF over
 * ps_sample_dist's list (its order and probabilities, cumulated in double). */
static int32_t dist_mismatches(ps_sampler *s, const ps_sample_params *p, const float *l, int n_pos) {
    const int32_t *ids;
    const float *probs;
    int32_t n, mismatches = 0;
    PS_CHECK_OK(ps_sample_dist(s, p, l, NULL, 0, &ids, &probs, &n));
    int32_t *kid = malloc((size_t)n * sizeof *kid);
    double *kcum = malloc((size_t)n * sizeof *kcum);
    for (int32_t j = 0; j < n; j++) kid[j] = ids[j], kcum[j] = probs[j] + (j ? kcum[j - 1] : 0);
    for (uint64_t pos = 0; pos < (uint64_t)n_pos; pos++) {
        double u = ps_rng_uniform(p->seed, pos, PS_RNG_STREAM_SAMPLE) * kcum[n - 1];
        int32_t lo = 0, hi = n - 1, t; /* the first j with u < kcum[j] */
        while (lo < hi) {
            int32_t mid = lo + (hi - lo) / 2;
            if (u < kcum[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        PS_CHECK_OK(ps_sample(s, p, l, NULL, 0, pos, &t));
        mismatches += t != kid[lo];
    }
    free(kid);
    free(kcum);
    return mismatches;
}

/* ps_sample's draw is the inverse CDF of ps_sample_dist's distribution, whichever way it
 * finds it: where every token is a candidate (no top-k) it first looks among the tokens of
 * weight e^-8 of the best's, then e^-16, then all (sample.c's levels); a flat distribution
 * (more than 4,096 tokens in the first) goes to all at once. Float rounding of the listed
 * probabilities may move a boundary draw: at most 1 in 1,000. */
static void test_sample_matches_dist(void) {
    enum { N = 4096, BIG = 128256, HUGE = 1 << 21 };
    float *l = malloc(HUGE * sizeof *l);
    ps_sampler *s = make(N);
    ps_sample_params p = ps_sample_params_default();
    p.seed = 3, p.temperature = 1.3f, p.top_p = 0.95f;
    make_big(l, N, 11);
    l[N / 2] = 2.0f;
    PS_CHECK(dist_mismatches(s, &p, l, 2000) <= 2);
    ps_sampler_free(s);

    s = make(BIG);
    struct {
        const char *what;
        float t, top_p, min_p;
    } cfg[] = {{"T=1", 1, 1, 0},
               {"T=0.7, top_p 0.9", 0.7f, 0.9f, 0},
               {"T=2, min_p 0.001", 2, 1, 0.001f},
               {"T=1e-39", 1e-39f, 1, 0}};
    make_model_like(l, BIG, 12);
    for (int32_t i = 5; i < BIG; i += 997) l[i] = -INFINITY;
    for (size_t c = 0; c < PS_ARRAY_LEN(cfg); c++) {
        p = ps_sample_params_default();
        p.seed = 5 + c, p.temperature = cfg[c].t, p.top_p = cfg[c].top_p, p.min_p = cfg[c].min_p;
        int32_t bad = dist_mismatches(s, &p, l, 3000);
        printf("sample vs dist, model-like logits, %s: %d of 3000 draws differ\n", cfg[c].what, bad);
        PS_CHECK(bad <= 3);
    }
    make_big(l, BIG, 13); /* flat */
    p = ps_sample_params_default();
    p.seed = 9;
    PS_CHECK(dist_mismatches(s, &p, l, 1000) <= 1);
    ps_sampler_free(s);

    /* 2M tokens at e^-16.3 of the best's: 17 % of the draws fall past the second level */
    s = make(HUGE);
    for (int32_t i = 0; i < HUGE; i++) l[i] = -16.3f - (float)(i % 7) * 0.01f;
    l[HUGE / 3] = 0.0f, l[HUGE / 5] = -9.0f;
    p = ps_sample_params_default();
    p.seed = 17;
    int32_t bad = dist_mismatches(s, &p, l, 400);
    printf("sample vs dist, a heavy tail over %d tokens: %d of 400 draws differ\n", HUGE, bad);
    PS_CHECK(bad <= 1);
    ps_sampler_free(s);
    free(l);
}

// ---- chi-square goodness of fit -----------------------------------------------------

/* 200000 draws at positions 0..N-1 against the renormalised softmax at T over the
 * kept set want[0, k); tokens outside it must never appear. */
static void chi2_check(const char *name, const ps_sample_params *p, const float *l, int n_vocab, const int32_t *want,
                       int k, double critical) {
    enum { N = 200000 };
    ps_sampler *s = make(n_vocab);
    long count[16] = {0};
    double prob[16], chi2 = 0;
    for (uint64_t i = 0; i < N; i++) {
        int32_t t = -1;
        ps_sample(s, p, l, NULL, 0, i, &t);
        if (t >= 0 && t < n_vocab) count[t]++;
    }
    ref_softmax(l, want, k, p->temperature, prob);
    long in_set = 0;
    for (int i = 0; i < k; i++) {
        double e = prob[i] * N;
        chi2 += (count[want[i]] - e) * (count[want[i]] - e) / e;
        in_set += count[want[i]];
    }
    printf("%s: chi2 = %.2f (%d dof, 0.999 critical %.3f)\n", name, chi2, k - 1, critical);
    PS_CHECK_EQ_INT(in_set, N);
    PS_CHECK(chi2 < critical);
    ps_sampler_free(s);
}

static void test_chi_square(void) {
    /* draw order: 4 8 1 6 0 9 2 5 3 7 */
    const float l[10] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 1.5f, -2.0f, 2.5f, 0.2f};
    const int32_t order[10] = {4, 8, 1, 6, 0, 9, 2, 5, 3, 7};
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0.7f, p.seed = 20240611;
    chi2_check("softmax(l/0.7)", &p, l, 10, order, 10, CHI2_999_DF9);
    p.top_k = 4, p.seed = 1;
    chi2_check("top_k 4", &p, l, 10, order, 4, CHI2_999_DF3);
    /* top_p between the cumulative T=1 sums of 4 and 5 tokens keeps 5 */
    double prob[10], cum = 0;
    ref_softmax(l, order, 10, 1.0, prob);
    for (int i = 0; i < 4; i++) cum += prob[i];
    p.top_k = 0, p.top_p = (float)(cum + prob[4] / 2), p.seed = 2;
    chi2_check("top_p (5 kept)", &p, l, 10, order, 5, CHI2_999_DF4);
}

// ---- speculative decoding with a sampled draft -----------------------------------------

/* A draft of 20 tokens drawn with ps_sample_draft (cut to its 16 most likely) and checked by
 * ps_sample_verify against other logits: the guesses are distributed as the draft's cut
 * softmax, the tokens as the target's softmax, and the share of guesses kept is
 * sum_y min(p(y), q(y)), each computed here from the formulas. */
static void test_spec_verify(void) {
    enum { V = 20, N = 200000 };
    float target[V], draft[V];
    int32_t ids[V], by_draft[V];
    for (int i = 0; i < V; i++) {
        target[i] = (float)sin(1.3 * i) * 2.0f, draft[i] = target[i] + (float)cos(0.7 * i); /* alike, not equal */
        ids[i] = i;
    }
    for (int i = 0; i < V; i++) by_draft[i] = i; /* the draft's 16 most likely, in draw order */
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && draft[by_draft[j]] > draft[by_draft[j - 1]]; j--) {
            int32_t t = by_draft[j];
            by_draft[j] = by_draft[j - 1], by_draft[j - 1] = t;
        }
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0.9f, p.seed = 77;
    double pt[V], qd[PS_DRAFT_DIST], q_of[V] = {0}, accept = 0;
    ref_softmax(target, ids, V, p.temperature, pt);
    ref_softmax(draft, by_draft, PS_DRAFT_DIST, p.temperature, qd);
    for (int i = 0; i < PS_DRAFT_DIST; i++) q_of[by_draft[i]] = qd[i];
    for (int i = 0; i < V; i++) accept += fmin(pt[i], q_of[i]);
    ps_sampler *sd = make(V), *st = make(V);
    long guessed[V] = {0}, got[V] = {0}, kept = 0;
    int bad = 0;
    for (uint64_t pos = 0; pos < N; pos++) {
        ps_draft_dist q;
        int32_t g = -1, t = -1;
        bool k = false;
        PS_CHECK_OK(ps_sample_draft(sd, &p, draft, NULL, 0, pos, &q, &g));
        PS_CHECK_OK(ps_sample_verify(st, &p, target, NULL, 0, pos, &q, g, &t, &k));
        bad += q.n != PS_DRAFT_DIST || q.id[0] != by_draft[0] || fabs(q.p[0] - qd[0]) > 1e-6 || (k && t != g) ||
               (!k && t == g) || t < 0 || g < 0;
        if (t >= 0 && g >= 0) guessed[g]++, got[t]++, kept += k;
    }
    PS_CHECK_EQ_INT(bad, 0);
    double chi_q = 0, chi_p = 0;
    for (int i = 0; i < PS_DRAFT_DIST; i++) {
        double e = qd[i] * N;
        chi_q += (guessed[by_draft[i]] - e) * (guessed[by_draft[i]] - e) / e;
    }
    for (int i = 0; i < V; i++) chi_p += (got[i] - pt[i] * N) * (got[i] - pt[i] * N) / (pt[i] * N);
    double rate = (double)kept / N, sd_rate = sqrt(accept * (1 - accept) / N);
    printf("sampled draft: guesses chi2 = %.2f (15 dof, critical %.3f), tokens chi2 = %.2f (19 dof, critical %.3f), "
           "kept %.4f (sum min(p, q) = %.4f)\n",
           chi_q, CHI2_999_DF15, chi_p, CHI2_999_DF19, rate, accept);
    PS_CHECK(chi_q < CHI2_999_DF15);
    PS_CHECK(chi_p < CHI2_999_DF19);
    PS_CHECK(fabs(rate - accept) < 4 * sd_rate);
    PS_CHECK(accept > 0.5 && accept < 0.99); /* the case is neither trivial nor hopeless */

    /* greedy: the argmax, kept when guessed */
    ps_sample_params g0 = p;
    g0.temperature = 0;
    ps_draft_dist q;
    int32_t g = -1, t = -1;
    bool k = false;
    PS_CHECK_OK(ps_sample_draft(sd, &g0, draft, NULL, 0, 0, &q, &g));
    PS_CHECK(q.n == 1 && q.id[0] == by_draft[0] && q.p[0] == 1.0f && g == by_draft[0]);
    PS_CHECK_OK(ps_sample_verify(st, &g0, target, NULL, 0, 0, &q, g, &t, &k));
    int32_t best = 0;
    for (int i = 1; i < V; i++) best = target[i] > target[best] ? i : best;
    PS_CHECK(t == best && k == (g == best));

    /* a distribution that is not one over this vocabulary holding the guess */
    static const struct {
        int n, id1;
        float p0, p1;
        int guess;
        const char *needle;
    } cases[] = {{0, 1, 0.5f, 0.5f, 0, "of 0 tokens"},
                 {17, 1, 0.5f, 0.5f, 0, "of 17 tokens"},
                 {2, 20, 0.5f, 0.5f, 0, "token 20 is not in [0, 20)"},
                 {2, -1, 0.5f, 0.5f, 0, "token -1 is not"},
                 {2, 0, 0.5f, 0.5f, 0, "token 0 appears twice"},
                 {2, 1, NAN, 0.5f, 0, "has probability nan"},
                 {2, 1, 0.0f, 1.0f, 0, "has probability 0"},
                 {2, 1, 0.25f, 0.25f, 0, "sums to 0.5"},
                 {2, 1, 0.5f, 0.5f, 3, "the guess 3 is not in its draft distribution"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_draft_dist b = {.n = cases[i].n, .id = {0, cases[i].id1}, .p = {cases[i].p0, cases[i].p1}};
        PS_CHECK_EQ_INT(ps_sample_verify(st, &p, target, NULL, 0, 0, &b, cases[i].guess, &t, &k), PS_ERR_ARG);
        const char *msg = ps_sampler_error(st);
        if (!strstr(msg, cases[i].needle)) fprintf(stderr, "message '%s' lacks '%s'\n", msg, cases[i].needle);
        PS_CHECK(strstr(msg, cases[i].needle) != NULL && t == -1 && !k);
    }
    ps_sampler_free(sd);
    ps_sampler_free(st);
}

// ---- bad input ----------------------------------------------------------------------

static void expect_bad(ps_sample_params p, const char *needle) {
    char err[160] = "";
    PS_CHECK_EQ_INT(ps_sample_params_check(&p, err, sizeof err), PS_ERR_ARG);
    if (!strstr(err, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", err, needle);
    PS_CHECK(strstr(err, needle) != NULL);
}

static void test_bad_params(void) {
    ps_sample_params d = ps_sample_params_default(), p;
    PS_CHECK_OK(ps_sample_params_check(&d, NULL, 0));
    p = d, p.temperature = -0.5f, expect_bad(p, "temperature");
    p = d, p.temperature = NAN, expect_bad(p, "temperature");
    p = d, p.temperature = INFINITY, expect_bad(p, "temperature");
    p = d, p.top_k = -1, expect_bad(p, "top_k");
    p = d, p.top_p = 0.0f, expect_bad(p, "top_p 0 must be in (0, 1]");
    p = d, p.top_p = 1.5f, expect_bad(p, "top_p");
    p = d, p.top_p = NAN, expect_bad(p, "top_p");
    p = d, p.min_p = -0.1f, expect_bad(p, "min_p");
    p = d, p.min_p = 1.01f, expect_bad(p, "min_p");
    p = d, p.repetition_penalty = 0.0f, expect_bad(p, "repetition_penalty");
    p = d, p.repetition_penalty = -1.0f, expect_bad(p, "repetition_penalty");
    p = d, p.penalty_last_n = -2, expect_bad(p, "penalty_last_n");
    p = d, p.presence_penalty = NAN, expect_bad(p, "presence_penalty");
    p = d, p.frequency_penalty = INFINITY, expect_bad(p, "frequency_penalty");
    PS_CHECK_EQ_INT(ps_sample_params_check(NULL, NULL, 0), PS_ERR_ARG);

    ps_sampler *s = make(4);
    int32_t tok = 9;
    p = d, p.top_p = 2.0f;
    PS_CHECK_EQ_INT(ps_sample(s, &p, (const float[4]){0, 1, 2, 3}, NULL, 0, 0, &tok), PS_ERR_ARG);
    PS_CHECK_EQ_INT(tok, -1);
    PS_CHECK(strstr(ps_sampler_error(s), "top_p") != NULL);
    PS_CHECK_EQ_INT(ps_sample(s, &d, (const float[4]){0, NAN, 2, 3}, NULL, 0, 0, &tok), PS_ERR_ARG);
    PS_CHECK(strstr(ps_sampler_error(s), "token 1 is NaN") != NULL);
    PS_CHECK_EQ_INT(ps_sample(s, &d, (const float[4]){0, 1, INFINITY, 3}, NULL, 0, 0, &tok), PS_ERR_ARG);
    PS_CHECK(strstr(ps_sampler_error(s), "+inf") != NULL);
    const float all_inf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    PS_CHECK_EQ_INT(ps_sample(s, &d, all_inf, NULL, 0, 0, &tok), PS_ERR_ARG);
    PS_CHECK(strstr(ps_sampler_error(s), "-inf") != NULL);
    PS_CHECK_EQ_INT(ps_sample(s, &d, NULL, NULL, 0, 0, &tok), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_sample(s, &d, all_inf, NULL, 3, 0, &tok), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_sample(s, &d, all_inf, NULL, 0, 0, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_sample(NULL, &d, all_inf, NULL, 0, 0, &tok), PS_ERR_ARG);
    /* penalties that overflow a logit to +inf are reported, not sampled from */
    p = d, p.repetition_penalty = 1e-38f;
    PS_CHECK_EQ_INT(ps_sample(s, &p, (const float[4]){0, 1e30f, 2, 3}, (const int32_t[1]){1}, 1, 0, &tok), PS_ERR_ARG);
    PS_CHECK(strstr(ps_sampler_error(s), "penalties") != NULL);
    PS_CHECK_OK(ps_sample(s, &d, (const float[4]){0, 1, 2, 3}, NULL, 0, 0, &tok));
    PS_CHECK(strcmp(ps_sampler_error(s), "") == 0);
    ps_sampler_free(s);

    ps_sampler *z = (ps_sampler *)1;
    char err[64] = "";
    PS_CHECK_EQ_INT(ps_sampler_create(0, &z, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(z == NULL);
    PS_CHECK(strstr(err, "vocabulary size 0") != NULL);
    ps_sampler_free(NULL);
}

// ---- speed (printed, not asserted) --------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void report_speed(void) {
    enum { N = 128256, ITERS = 100 };
    float *flat = malloc(N * sizeof *flat), *model = malloc(N * sizeof *model);
    int32_t hist[64];
    make_big(flat, N, 21);
    make_model_like(model, N, 21);
    for (int i = 0; i < 64; i++) hist[i] = i * 1999 % N;
    ps_sampler *s = make(N);
    struct {
        const char *name;
        float t;
        int32_t k;
        float top_p, min_p;
        const float *l;
    } cfg[] = {
        {"greedy", 0, 0, 1, 0, flat},
        {"T=1 no truncation", 1, 0, 1, 0, model},
        {"T=1, flat logits", 1, 0, 1, 0, flat},
        {"top_k 40", 0.8f, 40, 1, 0, model},
        {"llama.cpp defaults", 0.8f, 40, 0.95f, 0.05f, model},
        {"top_p 0.95 alone", 0.8f, 0, 0.95f, 0, model},
        {"top_p 0.95, flat", 0.8f, 0, 0.95f, 0, flat},
    };
    for (size_t c = 0; c < PS_ARRAY_LEN(cfg); c++) {
        ps_sample_params p = ps_sample_params_default();
        p.temperature = cfg[c].t, p.top_k = cfg[c].k, p.top_p = cfg[c].top_p, p.min_p = cfg[c].min_p;
        p.repetition_penalty = 1.1f;
        double t0 = now_s();
        int32_t tok;
        for (int i = 0; i < ITERS; i++) ps_sample(s, &p, cfg[c].l, hist, 64, (uint64_t)i, &tok);
        printf("speed, vocab %d, %-20s %8.1f us/token\n", N, cfg[c].name, (now_s() - t0) / ITERS * 1e6);
    }
    /* speculation's sampled guesses at T = 1 (the draft's logits the target's: most are kept) */
    ps_sample_params p = ps_sample_params_default();
    p.repetition_penalty = 1.1f;
    ps_draft_dist q[ITERS];
    int32_t guess[ITERS], tok;
    bool kept;
    double t0 = now_s();
    for (int i = 0; i < ITERS; i++) ps_sample_draft(s, &p, model, hist, 64, (uint64_t)i, &q[i], &guess[i]);
    double t1 = now_s();
    for (int i = 0; i < ITERS; i++) ps_sample_verify(s, &p, model, hist, 64, (uint64_t)i, &q[i], guess[i], &tok, &kept);
    printf("speed, vocab %d, %-20s %8.1f us/token\n", N, "a sampled draft guess", (t1 - t0) / ITERS * 1e6);
    printf("speed, vocab %d, %-20s %8.1f us/token\n", N, "its verification", (now_s() - t1) / ITERS * 1e6);
    ps_sampler_free(s);
    free(flat), free(model);
}

/* The reference order of ps_sample_top_logprobs: logit descending, ties by lower id. */
static const float *ref_logits;
static int cmp_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = ref_logits[x], ly = ref_logits[y];
    return lx > ly ? -1 : lx < ly ? 1 : (x > y) - (x < y);
}

/* ps_sample_top_logprobs against the straightforward reference: every log-probability as
 * logit - log(sum(exp(logits))) in long double, all ids sorted, the first n taken. Logits
 * drawn from few values (many ties), and from a wide range; n from 0 to past the vocabulary. */
static void test_top_logprobs(void) {
    enum { V = 1000 };
    static float l[V];
    static int32_t order[V], ids[V + 5];
    static float lp[V + 5];
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < V; i++) l[i] = round % 2 ? (float)(ps_test_rng_u32() % 7) - 3 : 20 * ps_test_rng_f();
        if (round == 4) l[17] = -INFINITY;
        long double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < V; i++) sum += expl((long double)l[i] - mx);
        long double lse = mx + logl(sum);
        for (int i = 0; i < V; i++) order[i] = i;
        ref_logits = l;
        qsort(order, V, sizeof *order, cmp_rank);
        static const int ns[] = {0, 1, 2, 5, 20, V, V + 5};
        for (size_t k = 0; k < PS_ARRAY_LEN(ns); k++) {
            int n = ns[k];
            double got = ps_sample_top_logprobs(l, V, n, ids, lp);
            PS_CHECK(fabsl(got - lse) < 1e-9);
            int m = n < V ? n : V;
            double total = 0;
            for (int j = 0; j < m; j++) {
                PS_CHECK_EQ_INT(ids[j], order[j]);
                if (isinf(l[order[j]]))
                    PS_CHECK(isinf(lp[j]) && lp[j] < 0); /* the banned token: probability 0 */
                else
                    PS_CHECK(fabsl(lp[j] - ((long double)l[order[j]] - lse)) < 1e-5);
                PS_CHECK(lp[j] <= 0 && (j == 0 || lp[j] <= lp[j - 1]));
                total += exp(lp[j]);
            }
            PS_CHECK(total <= 1 + 1e-5);
            if (m == V) PS_CHECK(fabs(total - 1) < 1e-4);
        }
    }
}

int main(void) {
    test_philox_kat();
    test_rng_basics();
    test_rng_uniformity();
    test_greedy();
    test_greedy_lanes();
    test_top_k();
    test_top_p();
    test_min_p();
    test_dist_probs();
    test_big_vocab();
    test_penalties();
    test_reproducible();
    test_sample_matches_dist();
    test_chi_square();
    test_spec_verify();
    test_bad_params();
    test_top_logprobs();
    report_speed();
    return ps_test_done();
}
