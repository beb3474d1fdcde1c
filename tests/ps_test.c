/* ps_test.c - the harness behind ps_test.h. */
#include "ps_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "ps.h"

int ps_test_failures = 0;
int ps_test_checks = 0;

int ps_test_done(void) {
    if (ps_test_failures) {
        fprintf(stderr, "FAILED: %d of %d checks\n", ps_test_failures, ps_test_checks);
        return 1;
    }
    printf("ok: %d checks\n", ps_test_checks);
    return 0;
}

int ps_test_skip(const char *why) {
    printf("SKIPPED: %s\n", why);
    return 77;
}

const char *ps_test_tmp(const char *name) {
    static char buf[4096];
    const char *dir = getenv("PS_TEST_TMP");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "/tmp", name);
    return buf;
}

const char *ps_test_shared_model(const char *name) {
    static char buf[4096];
    const char *dir = getenv("PS_SHARED_MODELS");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "../shared/models", name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}
