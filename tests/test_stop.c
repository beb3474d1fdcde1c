/* test_stop.c - the stop-string matcher (coord/stop.h): what each push releases and holds
 * back, stops within one piece and across pieces, the earliest of several, overlapping
 * prefixes, flush, the limits, and a randomized comparison with a plain search of the whole
 * text (the releases of any cut of a text into pieces add up to its text before the first
 * stop string). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/stop.h"
#include "ps_test.h"

/* Pushes the pieces (NULL-terminated) into m; returns the released text (static) and
 * whether a stop was found; the flush is added when flush is set and no stop was found. */
static const char *feed(ps_stop *m, const char *const *pieces, bool flush, bool *stopped) {
    static char got[4096];
    size_t n = 0;
    const char *out;
    size_t len;
    *stopped = false;
    for (; *pieces; pieces++) {
        PS_CHECK_OK(ps_stop_push(m, *pieces, strlen(*pieces), &out, &len, stopped));
        memcpy(got + n, out, len), n += len;
    }
    if (flush && !*stopped) {
        ps_stop_flush(m, &out, &len);
        memcpy(got + n, out, len), n += len;
    }
    got[n] = 0;
    return got;
}

/* Piece by piece: what each push releases while a stop string may be starting. */
static void test_hold_back(void) {
    const char *stops[] = {"\n\n", "END"};
    ps_stop *m = NULL;
    char err[256];
    PS_CHECK_OK(ps_stop_create(stops, 2, &m, err, sizeof err));
    const char *out;
    size_t len;
    bool stopped;
    static const struct {
        const char *in, *out;
    } steps[] = {{"abc", "abc"}, {"E", ""}, {"N", ""}, {"X", "ENX"}, {"\n", ""}, {"y", "\ny"}, {"E", ""}};
    for (size_t i = 0; i < PS_ARRAY_LEN(steps); i++) {
        PS_CHECK_OK(ps_stop_push(m, steps[i].in, strlen(steps[i].in), &out, &len, &stopped));
        PS_CHECK(len == strlen(steps[i].out) && !memcmp(out, steps[i].out, len) && !stopped);
    }
    ps_stop_flush(m, &out, &len);
    PS_CHECK(len == 1 && out[0] == 'E');
    ps_stop_flush(m, &out, &len);
    PS_CHECK_EQ_INT(len, 0);

    /* a stop completed across pieces; nothing after it, not even from later pushes */
    ps_stop_reset(m);
    const char *a[] = {"abc", "EN", "Dxyz", NULL};
    PS_CHECK(!strcmp(feed(m, a, true, &stopped), "abc") && stopped);
    PS_CHECK_OK(ps_stop_push(m, "more", 4, &out, &len, &stopped));
    PS_CHECK(len == 0 && stopped);
    ps_stop_flush(m, &out, &len);
    PS_CHECK_EQ_INT(len, 0);

    /* within one piece */
    ps_stop_reset(m);
    const char *b[] = {"fooENDbar", NULL};
    PS_CHECK(!strcmp(feed(m, b, true, &stopped), "foo") && stopped);
    /* at the very start */
    ps_stop_reset(m);
    const char *c[] = {"\n", "\nhello", NULL};
    PS_CHECK(!strcmp(feed(m, c, true, &stopped), "") && stopped);
    ps_stop_free(m);
}

/* The earliest stop string wins; a held tail may start several of them. */
static void test_several(void) {
    char err[256];
    bool stopped;
    ps_stop *m = NULL;
    const char *s1[] = {"abcd", "bce"};
    PS_CHECK_OK(ps_stop_create(s1, 2, &m, err, sizeof err));
    const char *p1[] = {"xab", "c", "e tail", NULL};
    PS_CHECK(!strcmp(feed(m, p1, true, &stopped), "xa") && stopped);
    ps_stop_reset(m);
    const char *p2[] = {"xab", "c", "d", NULL};
    PS_CHECK(!strcmp(feed(m, p2, true, &stopped), "x") && stopped);
    ps_stop_reset(m);
    const char *p3[] = {"xab", "c", NULL}; /* the end comes while "abc" is held */
    PS_CHECK(!strcmp(feed(m, p3, true, &stopped), "xabc") && !stopped);
    ps_stop_free(m);

    const char *s2[] = {"b", "xyz"};
    PS_CHECK_OK(ps_stop_create(s2, 2, &m, err, sizeof err));
    const char *p4[] = {"axyzb", NULL};
    PS_CHECK(!strcmp(feed(m, p4, true, &stopped), "a") && stopped);
    ps_stop_free(m);

    /* no stop strings (or only empty ones): everything at once */
    const char *s3[] = {""};
    PS_CHECK_OK(ps_stop_create(s3, 1, &m, err, sizeof err));
    const char *out;
    size_t len;
    PS_CHECK_OK(ps_stop_push(m, "END\n\n", 5, &out, &len, &stopped));
    PS_CHECK(len == 5 && !stopped);
    ps_stop_free(m);
}

/* UTF-8: a stop string of two-byte characters holds back whole characters only. */
static void test_utf8(void) {
    char err[256];
    bool stopped;
    ps_stop *m = NULL;
    const char *s[] = {"\xc3\xa9t\xc3\xa9"}; /* "été" */
    PS_CHECK_OK(ps_stop_create(s, 1, &m, err, sizeof err));
    const char *pieces[] = {"caf\xc3\xa9", " \xc3\xa9", "t", "\xc3\xa9!", NULL};
    const char *out;
    size_t len;
    PS_CHECK_OK(ps_stop_push(m, pieces[0], strlen(pieces[0]), &out, &len, &stopped));
    PS_CHECK(len == 3 && !memcmp(out, "caf", 3)); /* the é may start "été" */
    PS_CHECK_OK(ps_stop_push(m, pieces[1], strlen(pieces[1]), &out, &len, &stopped));
    PS_CHECK(len == 3 && !memcmp(out, "\xc3\xa9 ", 3));
    ps_stop_reset(m);
    PS_CHECK(!strcmp(feed(m, pieces, true, &stopped), "caf\xc3\xa9 ") && stopped);
    ps_stop_free(m);
}

/* Too many stop strings, or one too long: errors that say so. */
static void test_limits(void) {
    char err[256] = "", big[PS_STOP_MAX_BYTES + 2];
    ps_stop *m = NULL;
    const char *five[] = {"a", "b", "c", "d", "e"};
    PS_CHECK_EQ_INT(ps_stop_create(five, 5, &m, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(m == NULL && strstr(err, "at most 4"));
    memset(big, 'x', sizeof big - 1), big[sizeof big - 1] = 0;
    const char *one[] = {big};
    PS_CHECK_EQ_INT(ps_stop_create(one, 1, &m, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "513 bytes") != NULL);
    big[PS_STOP_MAX_BYTES] = 0; /* exactly the limit */
    PS_CHECK_OK(ps_stop_create(one, 1, &m, err, sizeof err));
    ps_stop_free(m);
    ps_stop_free(NULL);
}

/* Random texts over {a, b, c}, random stops, random cuts into pieces: the releases add up to
 * the text before the stop string that completes first (the longest of those completing at
 * that byte), found by a plain scan of the whole text, and stop iff there is one. */
static void test_random(void) {
    ps_test_rng_seed(11);
    char text[200], stops[3][8], got[256];
    for (int round = 0; round < 3000; round++) {
        int tl = (int)(ps_test_rng_u32() % 120), ns = 1 + (int)(ps_test_rng_u32() % 3);
        for (int i = 0; i < tl; i++) text[i] = (char)('a' + ps_test_rng_u32() % 3);
        text[tl] = 0;
        const char *sp[3];
        for (int k = 0; k < ns; k++) {
            int sl = 1 + (int)(ps_test_rng_u32() % 6);
            for (int i = 0; i < sl; i++) stops[k][i] = (char)('a' + ps_test_rng_u32() % 3);
            stops[k][sl] = 0;
            sp[k] = stops[k];
        }
        size_t first = (size_t)tl;
        for (size_t e = 1; e <= (size_t)tl && first == (size_t)tl; e++)
            for (int k = 0; k < ns; k++) {
                size_t sl = strlen(stops[k]);
                if (sl <= e && !memcmp(text + e - sl, stops[k], sl) && e - sl < first) first = e - sl;
            }
        ps_stop *m = NULL;
        char err[128];
        PS_CHECK_OK(ps_stop_create(sp, ns, &m, err, sizeof err));
        if (!m) return;
        size_t n = 0;
        bool stopped = false;
        const char *out;
        size_t len;
        for (int at = 0; at < tl;) {
            int pl = 1 + (int)(ps_test_rng_u32() % 5);
            if (pl > tl - at) pl = tl - at;
            PS_CHECK_OK(ps_stop_push(m, text + at, (size_t)pl, &out, &len, &stopped));
            memcpy(got + n, out, len), n += len;
            at += pl;
        }
        ps_stop_flush(m, &out, &len);
        memcpy(got + n, out, len), n += len;
        ps_stop_free(m);
        bool ok = n == first && !memcmp(got, text, n) && stopped == (first < (size_t)tl);
        PS_CHECK(ok);
        if (!ok) {
            fprintf(stderr, "text '%s', %d stops (first '%s'): got %zu bytes, want %zu\n", text, ns, sp[0], n, first);
            return;
        }
    }
}

int main(void) {
    test_hold_back();
    test_several();
    test_utf8();
    test_limits();
    test_random();
    return ps_test_done();
}
