/* ps.c - status messages, the clock, printable text. */
#include "ps.h"

#include <errno.h>
#include <pthread.h>
#ifdef __linux__
#include <sched.h>
#endif

#include <stdarg.h>
#include <stdio.h>
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
