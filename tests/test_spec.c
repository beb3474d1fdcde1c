/* test_spec.c - prompt lookup (coord/spec.h): the longest n-gram wins, the latest occurrence
 * of it, at most k tokens, never past the end; nothing when no n-gram recurs; and a
 * comparison with a plain search over random short sequences. */
#include <stdlib.h>
#include <string.h>

#include "coord/spec.h"
#include "ps_test.h"

/* ps_spec_ngram on toks[0..n) with k; checks it returns want[0..n_want). */
static void expect(const int32_t *toks, int n, int k, const int32_t *want, int n_want) {
    int32_t out[16];
    int m = ps_spec_ngram(toks, n, k, out);
    PS_CHECK_EQ_INT(m, n_want);
    for (int i = 0; i < m && i < n_want; i++) PS_CHECK_EQ_INT(out[i], want[i]);
}

static void test_cases(void) {
    /* "a b c d a b" -> the 2-gram "a b" occurred at 0: "c d a b" follows */
    int32_t t1[] = {1, 2, 3, 4, 1, 2};
    expect(t1, 6, 4, (int32_t[]){3, 4, 1, 2}, 4);
    expect(t1, 6, 2, (int32_t[]){3, 4}, 2);
    /* the latest occurrence of the longest n-gram: "x 5 6" twice, then "9 5 6" at the end:
       the 2-gram "5 6" latest at 4 -> 8; the 3-gram "9 5 6" never recurs */
    int32_t t2[] = {7, 5, 6, 1, 5, 6, 8, 9, 5, 6};
    expect(t2, 10, 3, (int32_t[]){8, 9, 5}, 3);
    /* a longer match beats a later shorter one: "1 2 3" recurs at 0, "3" alone later at 5 */
    int32_t t3[] = {1, 2, 3, 4, 0, 3, 9, 1, 2, 3};
    expect(t3, 10, 2, (int32_t[]){4, 0}, 2);
    /* the continuation stops at the end of the sequence */
    int32_t t4[] = {5, 5, 5};
    expect(t4, 3, 8, (int32_t[]){5}, 1);
    /* nothing recurs; too short; k 0 */
    int32_t t5[] = {1, 2, 3, 4};
    expect(t5, 4, 4, NULL, 0);
    expect(t5, 1, 4, NULL, 0);
    expect(t1, 6, 0, NULL, 0);
}

/* Random sequences over a small alphabet against a direct search. */
static void test_random(void) {
    srand(7);
    for (int trial = 0; trial < 2000; trial++) {
        int32_t t[40], out[16];
        int n = 1 + rand() % 40, k = 1 + rand() % 16;
        for (int i = 0; i < n; i++) t[i] = rand() % 3;
        int m = ps_spec_ngram(t, n, k, out), want_at = -1, want_n = 0;
        for (int g = n - 1 < PS_SPEC_NGRAM_MAX ? n - 1 : PS_SPEC_NGRAM_MAX; g >= 1 && want_at < 0; g--)
            for (int i = n - g - 1; i >= 0 && want_at < 0; i--)
                if (!memcmp(t + i, t + n - g, (size_t)g * sizeof *t)) want_at = i + g;
        if (want_at >= 0) want_n = n - want_at < k ? n - want_at : k;
        PS_CHECK_EQ_INT(m, want_n);
        for (int i = 0; i < m && i < want_n; i++) PS_CHECK_EQ_INT(out[i], t[want_at + i]);
    }
}

/* --spec-k auto: plain first, then a trip of 2 guesses, then the K the measurements favour. */
static void test_auto(void) {
    ps_spec_auto a = {0};
    PS_CHECK_EQ_INT(ps_spec_auto_k(&a, 10), 0); /* nothing measured: a plain trip */
    ps_spec_auto_add(&a, 0, 0, 0.100);
    PS_CHECK_EQ_INT(ps_spec_auto_k(&a, 10), 2); /* no guess tried yet */
    PS_CHECK_EQ_INT(ps_spec_auto_k(&a, 1), 1);
    /* a hop-bound ring: guesses cost 1 ms each on a 100 ms trip, and 9 in 10 are kept: many */
    ps_spec_auto good = a;
    for (int i = 0; i < 50; i++) ps_spec_auto_add(&good, 8, i % 10 ? 8 : 3, 0.108);
    PS_CHECK(ps_spec_auto_k(&good, 10) >= 6);
    /* guesses never kept: plain decoding, and after 16 plain trips a trip of 2 measures again */
    ps_spec_auto bad = a;
    for (int i = 0; i < 30; i++) ps_spec_auto_add(&bad, 2, 0, 0.110);
    PS_CHECK_EQ_INT(ps_spec_auto_k(&bad, 10), 0);
    for (int i = 0; i < 15; i++) ps_spec_auto_add(&bad, 0, 0, 0.100);
    PS_CHECK_EQ_INT(ps_spec_auto_k(&bad, 10), 0);
    ps_spec_auto_add(&bad, 0, 0, 0.100);
    PS_CHECK_EQ_INT(ps_spec_auto_k(&bad, 10), 2);
    /* compute-bound: each guess costs as much as the trip, half are kept: no K pays */
    ps_spec_auto dear = a;
    for (int i = 0; i < 30; i++) ps_spec_auto_add(&dear, 2, i % 2 ? 2 : 0, 0.300);
    PS_CHECK_EQ_INT(ps_spec_auto_k(&dear, 10), 0);
}

int main(void) {
    test_cases();
    test_random();
    test_auto();
    return ps_test_done();
}
