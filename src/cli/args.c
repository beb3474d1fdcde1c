/* args.c - strict command-line value parsing. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool ps_arg_transport(const char *cmd, const char *flag, const char *s, bool *unix_sockets) {
    *unix_sockets = !strcmp(s, "unix");
    if (*unix_sockets || !strcmp(s, "tcp")) return true;
    fprintf(stderr, "pipeshard %s: %s must be tcp or unix, got '%s'\n", cmd, flag, s);
    return false;
}

int ps_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}
