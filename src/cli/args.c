/* args.c - strict command-line value parsing. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/cuda.h"
#include "../model/model.h"

const char *ps_arg_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "pipeshard %s: option '%s' needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool ps_arg_int(const char *cmd, const char *flag, const char *s, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "pipeshard %s: %s expects an integer, got '%s'\n", cmd, flag, s);
        return false;
    }
    if (v < min || v > max) {
        fprintf(stderr, "pipeshard %s: %s must be between %lld and %lld, got %lld\n", cmd, flag, min, max, v);
        return false;
    }
    *out = v;
    return true;
}

bool ps_arg_float(const char *cmd, const char *flag, const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "pipeshard %s: %s expects a number, got '%s'\n", cmd, flag, s);
        return false;
    }
    if (v < min || v > max) {
        fprintf(stderr, "pipeshard %s: %s must be between %g and %g, got %g\n", cmd, flag, min, max, v);
        return false;
    }
    *out = v;
    return true;
}

bool ps_arg_mbps(const char *cmd, const char *flag, const char *s, double *out) {
    if (!ps_arg_float(cmd, flag, s, 0, 1e6, out)) return false;
    if (*out == 0 || *out >= PS_LINK_MIN_MBPS) return true;
    fprintf(stderr, "pipeshard %s: %s must be 0 (no limit) or between %g and 1e+06, got %g\n", cmd, flag,
            PS_LINK_MIN_MBPS, *out);
    return false;
}

bool ps_arg_on_off(const char *cmd, const char *flag, const char *s, bool *out) {
    *out = !strcmp(s, "on");
    if (*out || !strcmp(s, "off")) return true;
    fprintf(stderr, "pipeshard %s: %s must be on or off, got '%s'\n", cmd, flag, s);
    return false;
}

bool ps_arg_transport(const char *cmd, const char *flag, const char *s, bool *unix_sockets) {
    *unix_sockets = !strcmp(s, "unix");
    if (*unix_sockets || !strcmp(s, "tcp")) return true;
    fprintf(stderr, "pipeshard %s: %s must be tcp or unix, got '%s'\n", cmd, flag, s);
    return false;
}

int ps_cli_fail(const char *cmd, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pipeshard %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

bool ps_arg_device(const char *cmd, const char *flag, const char *s, int *out) {
    char err[512], name[256];
    size_t free_b, total_b;
    ps_status st = ps_device_parse(s, out, err, sizeof err);
    if (!st && *out != PS_DEVICE_CPU)
        st = ps_cuda_device_info(*out - PS_DEVICE_CUDA(0), name, sizeof name, &free_b, &total_b, err, sizeof err);
    if (st) fprintf(stderr, "pipeshard %s: %s: %s\n", cmd, flag, err);
    return !st;
}

bool ps_arg_devices(const char *cmd, const char *flag, const char *s, int *devs, int cap, int *n) {
    char one[64];
    *n = 0;
    for (const char *p = s;; p++) {
        size_t len = strcspn(p, ",");
        if (*n == cap || len >= sizeof one) {
            fprintf(stderr, "pipeshard %s: %s: %s\n", cmd, flag,
                    *n == cap ? "more devices than stages a fleet may have" : "a device name too long");
            return false;
        }
        memcpy(one, p, len), one[len] = 0;
        if (!ps_arg_device(cmd, flag, one, &devs[(*n)++])) return false;
        p += len;
        if (!*p) return true;
    }
}

/* Optimal string alignment distance between a[0..na) and b[0..nb) (Damerau-Levenshtein with
 * adjacent transpositions), or a value over 64 when either is longer than 64. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    enum { N = 64 };
    if (na > N || nb > N) return N + 1;
    int d[N + 1][N + 1];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int cost = a[i - 1] != b[j - 1], v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[na][nb];
}

const char *ps_arg_suggest(const char *word, const char *const *known) {
    size_t n = strcspn(word, "="), core = n - strspn(word, "-"); /* '-' is not '=': core <= n */
    /* edits allowed: none for a letter or two, then about one in four characters */
    int limit = core < 2 ? 0 : core <= 4 ? 1 : core <= 8 ? 2 : 3, best_d = limit + 1;
    const char *best = NULL;
    for (size_t k = 0; known[k]; k++) {
        int d = edit_distance(word, n, known[k], strlen(known[k]));
        if (d < best_d) best_d = d, best = known[k];
    }
    return best;
}

int ps_arg_unknown(const char *cmd, const char *a, const char *const *known, const char *hint) {
    if (a[0] != '-' || !a[1]) {
        if (hint)
            fprintf(stderr, "pipeshard %s: unexpected argument '%s': %s\n", cmd, a, hint);
        else
            fprintf(stderr, "pipeshard %s: unexpected argument '%s' (see pipeshard %s --help)\n", cmd, a, cmd);
        return 2;
    }
    const char *near = ps_arg_suggest(a, known);
    if (near)
        fprintf(stderr, "pipeshard %s: unknown option '%s'; did you mean '%s'? (see pipeshard %s --help)\n", cmd, a,
                near, cmd);
    else
        fprintf(stderr, "pipeshard %s: unknown option '%s' (see pipeshard %s --help)\n", cmd, a, cmd);
    return 2;
}

int ps_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}
