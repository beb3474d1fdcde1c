/* ps_test.h - a tiny test harness: checks count failures, main returns the verdict.
 *
 *   PS_CHECK(cond)                 fails (and goes on) when cond is false
 *   PS_CHECK_EQ_INT(a, b)          compares two integers and prints both on failure
 *   PS_CHECK_OK(status_expr)       expects PS_OK
 *   return ps_test_done();         0 when every check passed, 1 otherwise (77 after a skipped part)
 *   return ps_test_skip("why");    prints the reason, exit code 77 (CTest "skipped")
 *   ps_test_skip_part("why");      a part that cannot run (a model absent): printed now, and
 *                                  ps_test_done() returns 77 if all else passed, so that
 *                                  CTest's "Passed" always means the whole test ran */
#ifndef PS_TEST_H
#define PS_TEST_H

#include <stdio.h>
#include <stdint.h>

extern int ps_test_failures;
extern int ps_test_checks;

#define PS_CHECK(cond)                                                                                                 \
    do {                                                                                                               \
        ps_test_checks++;                                                                                              \
        if (!(cond)) {                                                                                                 \
            ps_test_failures++;                                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                                   \
        }                                                                                                              \
    } while (0)

#define PS_CHECK_EQ_INT(a, b)                                                                                          \
    do {                                                                                                               \
        long long ps_a_ = (long long)(a), ps_b_ = (long long)(b);                                                      \
        ps_test_checks++;                                                                                              \
        if (ps_a_ != ps_b_) {                                                                                          \
            ps_test_failures++;                                                                                        \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a, ps_a_, #b, ps_b_);     \
        }                                                                                                              \
    } while (0)

#define PS_CHECK_OK(expr)                                                                                              \
    do {                                                                                                               \
        int ps_s_ = (int)(expr);                                                                                       \
        ps_test_checks++;                                                                                              \
        if (ps_s_ != 0) {                                                                                              \
            ps_test_failures++;                                                                                        \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #expr, ps_s_,                          \
                    ps_strerror((ps_status)ps_s_));                                                                    \
        }                                                                                                              \
    } while (0)

int ps_test_done(void);
int ps_test_skip(const char *why);
void ps_test_skip_part(const char *why);
/* Deterministic test data: xorshift64, one stream per test process. */
void ps_test_rng_seed(uint64_t seed);
uint32_t ps_test_rng_u32(void);
float ps_test_rng_f(void); /* uniform in [-1, 1) */
/* The whole file at path, malloc'd (*len bytes; *len 0 when it could not all be read), or
 * NULL when it cannot be opened. */
uint8_t *ps_test_read_file(const char *path, size_t *len);
/* Path of a file under $PS_TEST_TMP (or /tmp), in a static buffer overwritten by the next call. */
const char *ps_test_tmp(const char *name);
/* Path of ../shared/models/<name> (via $PS_SHARED_MODELS) or NULL when the file is absent. */
const char *ps_test_shared_model(const char *name);
/* Path of .cache/models/<name> (via $PS_MODEL_CACHE: scripts/setup.sh fetches them there) or NULL
 * when absent, in a static buffer overwritten by the next call. */
const char *ps_test_cached_model(const char *name);

#endif
