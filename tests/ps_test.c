/* ps_test.c - the harness behind ps_test.h. */
#include "ps_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "ps.h"

int ps_test_failures = 0;
int ps_test_checks = 0;
static int skipped_parts = 0;

int ps_test_done(void) {
    if (ps_test_failures) {
        fprintf(stderr, "FAILED: %d of %d checks\n", ps_test_failures, ps_test_checks);
        return 1;
    }
    printf("ok: %d checks\n", ps_test_checks);
    if (skipped_parts) {
        printf("SKIPPED: %d part(s) did not run (listed above)\n", skipped_parts);
        return 77;
    }
    return 0;
}

void ps_test_skip_part(const char *why) {
    skipped_parts++;
    printf("SKIPPED part: %s\n", why);
}

int ps_test_skip(const char *why) {
    printf("SKIPPED: %s\n", why);
    return 77;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

void ps_test_rng_seed(uint64_t seed) { rng_state = seed; }

uint32_t ps_test_rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

float ps_test_rng_f(void) { return (float)ps_test_rng_u32() / 2147483648.0f - 1.0f; }

uint8_t *ps_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*len ? *len : 1);
    if (fread(p, 1, *len, f) != *len) *len = 0;
    fclose(f);
    return p;
}

const char *ps_test_tmp(const char *name) {
    static char buf[4096];
    const char *dir = getenv("PS_TEST_TMP");
    snprintf(buf, sizeof buf, "%s/%s", dir && *dir ? dir : "/tmp", name);
    return buf;
}

/* dir/name into buf (dir from the environment variable env, else fallback), or NULL when the
 * file cannot be read. */
static const char *model_in(char *buf, size_t cap, const char *env, const char *fallback, const char *name) {
    const char *dir = getenv(env);
    snprintf(buf, cap, "%s/%s", dir && *dir ? dir : fallback, name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

const char *ps_test_shared_model(const char *name) {
    static char buf[4096];
    return model_in(buf, sizeof buf, "PS_SHARED_MODELS", "../shared/models", name);
}

const char *ps_test_cached_model(const char *name) {
    static char buf[4096];
    return model_in(buf, sizeof buf, "PS_MODEL_CACHE", ".cache/models", name);
}
