/* ps.c - status messages, the clock, printable text, directories and paths, CPU sets. */
#include "ps.h"

#include <errno.h>
#include <pthread.h>
#ifdef __linux__
#include <sched.h>
#endif

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double ps_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t ps_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ps_deadline(int timeout_ms) { return timeout_ms < 0 ? -1 : ps_now_ns() + (int64_t)timeout_ms * 1000000; }

int ps_ms_left(int64_t deadline_ns) {
    if (deadline_ns < 0) return -1;
    int64_t left = deadline_ns - ps_now_ns();
    if (left <= 0) return 0;
    int64_t ms = (left + 999999) / 1000000;
    return ms > 1000000000 ? 1000000000 : (int)ms;
}

void ps_printable(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

static const char *const status_msg[PS_STATUS_COUNT] = {
    [PS_OK] = "ok",
    [PS_ERR_NOMEM] = "out of memory",
    [PS_ERR_IO] = "input/output error",
    [PS_ERR_FORMAT] = "malformed data",
    [PS_ERR_UNSUPPORTED] = "unsupported",
    [PS_ERR_ARG] = "invalid argument",
    [PS_ERR_RANGE] = "out of range",
    [PS_ERR_NOT_FOUND] = "not found",
    [PS_ERR_NET] = "network error",
    [PS_ERR_AUTH] = "authentication failed",
    [PS_ERR_TIMEOUT] = "timed out",
    [PS_ERR_PROTOCOL] = "protocol error",
    [PS_ERR_INTERNAL] = "internal error",
    [PS_ERR_BUSY] = "busy: try again later",
};

const char *ps_strerror(ps_status s) {
    if ((unsigned)s >= PS_STATUS_COUNT || !status_msg[s]) return "unknown status";
    return status_msg[s];
}

ps_status ps_errf(char *err, size_t errlen, ps_status s, const char *fmt, ...) {
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return s;
}

#ifdef __linux__
static cpu_set_t first_cpus;
static int first_err;
static pthread_once_t first_once = PTHREAD_ONCE_INIT;
static void read_first_cpus(void) { first_err = sched_getaffinity(0, sizeof first_cpus, &first_cpus) ? errno : 0; }
#endif

int ps_first_cpus(int *cpus, int cap) {
#ifdef __linux__
    pthread_once(&first_once, read_first_cpus);
    if (first_err) return -first_err;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &first_cpus)) cpus[n++] = c;
    return n;
#else
    (void)cpus, (void)cap;
    return -ENOSYS;
#endif
}

void ps_thread_unpin(void) {
#ifdef __linux__
    pthread_once(&first_once, read_first_cpus);
    if (!first_err) sched_setaffinity(0, sizeof first_cpus, &first_cpus);
#endif
}

/* See ps.h. */
uint64_t ps_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

/* See ps.h. */
ps_status ps_make_dirs(const char *dir, unsigned mode, char *err, size_t errlen) {
    char path[4096];
    size_t len = strlen(dir);
    if (!len || len >= sizeof path)
        return ps_errf(err, errlen, PS_ERR_ARG, "output directory name is empty or too long");
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        struct stat sb;
        if (mkdir(path, (mode_t)mode) < 0 && errno != EEXIST)
            return ps_errf(err, errlen, PS_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
        if (stat(path, &sb) < 0 || !S_ISDIR(sb.st_mode))
            return ps_errf(err, errlen, PS_ERR_IO, "cannot create directory '%s': '%s' is not a directory", dir, path);
        path[i] = c;
    }
    return PS_OK;
}

ps_status ps_path_join(char *out, size_t n, const char *dir, const char *name, char *err, size_t errlen) {
    int k = snprintf(out, n, "%s%s%s", dir, *dir && dir[strlen(dir) - 1] != '/' ? "/" : "", name);
    if (k < 0 || (size_t)k >= n) return ps_errf(err, errlen, PS_ERR_RANGE, "path '%s/%s' is too long", dir, name);
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Sizes

/* The multiplier of a size's unit (K, M, G, T, with an optional B or iB), or 0 when unit
 * is none of those; "" and "B" are bytes. */
static uint64_t size_unit(const char *unit) {
    static const char letters[] = "KMGT";
    if (!*unit || !strcmp(unit, "B") || !strcmp(unit, "b")) return 1;
    char c = (char)(unit[0] & ~0x20); /* upper case; a space or a NUL stays no letter */
    const char *l = c ? strchr(letters, c) : NULL;
    if (!l) return 0;
    const char *rest = unit + 1;
    if (*rest && strcmp(rest, "B") && strcmp(rest, "b") && strcmp(rest, "iB") && strcmp(rest, "ib")) return 0;
    return (uint64_t)1 << (10 * (l - letters + 1));
}

ps_status ps_size_parse(const char *s, uint64_t *out, char *err, size_t errlen) {
    const char *p = s;
    uint64_t whole = 0, frac = 0, frac_div = 1;
    bool digits = false, over = false;
    for (; *p >= '0' && *p <= '9'; p++, digits = true) {
        uint64_t d = (uint64_t)(*p - '0');
        over |= whole > (UINT64_MAX - d) / 10;
        whole = whole * 10 + d;
    }
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++, digits = true)
            if (frac_div <= 100000000000000000ull) frac = frac * 10 + (uint64_t)(*p - '0'), frac_div *= 10;
    uint64_t mult = digits ? size_unit(p) : 0;
    if (!mult)
        return ps_errf(err, errlen, PS_ERR_ARG, "expected a size such as 500M, 20G or a number of bytes, got '%s'", s);
    /* whole * mult + frac * mult / frac_div, each part checked; mult is a power of two <= 2^40 */
    over |= whole > UINT64_MAX / mult;
    unsigned __int128 f = (unsigned __int128)frac * mult / frac_div;
    if (!over) over = (unsigned __int128)whole * mult + f > UINT64_MAX;
    if (over) return ps_errf(err, errlen, PS_ERR_ARG, "size '%s' is too large (at most 2^64 - 1 bytes)", s);
    uint64_t v = whole * mult + (uint64_t)f;
    if (!v) return ps_errf(err, errlen, PS_ERR_ARG, "size '%s' is less than one byte", s);
    *out = v;
    return PS_OK;
}

void ps_size_format(uint64_t bytes, char *out, size_t cap) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(out, cap, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u + 1 < (int)PS_ARRAY_LEN(units)) v /= 1024, u++;
    snprintf(out, cap, "%.1f %s", v, units[u]);
}

// ---------------------------------------------------------------------------------------
// Allocation with failure injection

static atomic_long alloc_count; /* allocations since the last ps_alloc_fail_at */
static atomic_long alloc_fail;  /* the one that fails, counted from 1; 0 = none */

/* Counts an allocation; true when it is the one that must fail. */
static bool alloc_fails(void) {
    long k = atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed) + 1;
    return k == atomic_load_explicit(&alloc_fail, memory_order_relaxed);
}

long ps_alloc_fail_at(long n) {
    atomic_store(&alloc_fail, n > 0 ? n : 0);
    return atomic_exchange(&alloc_count, 0);
}

void *ps_malloc(size_t n) { return alloc_fails() ? NULL : malloc(n); }
void *ps_calloc(size_t n, size_t size) { return alloc_fails() ? NULL : calloc(n, size); }
void *ps_realloc(void *p, size_t n) { return alloc_fails() ? NULL : realloc(p, n); }
char *ps_strdup(const char *s) { return alloc_fails() ? NULL : strdup(s); }
char *ps_strndup(const char *s, size_t n) { return alloc_fails() ? NULL : strndup(s, n); }
