/* ps.h - status codes and small helpers shared by every pipeshard module.
 *
 * Every fallible function returns a ps_status and, where detail helps, takes an
 * optional `char *err, size_t errlen` buffer that receives one human-readable line.
 * Codes are never renumbered: new ones go at the end, before PS_STATUS_COUNT. */
#ifndef PS_H
#define PS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PS_OK = 0,
    PS_ERR_NOMEM = 1,       /* allocation failed */
    PS_ERR_IO = 2,          /* open/read/write/mmap failed */
    PS_ERR_FORMAT = 3,      /* malformed file or message */
    PS_ERR_UNSUPPORTED = 4, /* valid but not supported (architecture, tensor type) */
    PS_ERR_ARG = 5,         /* bad argument or input from a user */
    PS_ERR_RANGE = 6,       /* out of range: prompt longer than the context, index too large */
    PS_ERR_NOT_FOUND = 7,   /* key, tensor or file absent */
    PS_ERR_NET = 8,         /* socket error, peer gone */
    PS_ERR_AUTH = 9,        /* authentication refused */
    PS_ERR_TIMEOUT = 10,    /* a peer did not answer in time */
    PS_ERR_PROTOCOL = 11,   /* peer speaks another protocol version or breaks it */
    PS_ERR_INTERNAL = 12,   /* a bug: an invariant of our own was broken */
    PS_ERR_BUSY = 13,       /* no room now (a full queue, every KV block taken): try again later */
    PS_STATUS_COUNT
} ps_status;

/* Static message for a status code ("out of memory", ...); never NULL. */
const char *ps_strerror(ps_status s);

/* Formats one line into err (when err is non-NULL and errlen > 0) and returns s,
 * so that callers can write `return ps_errf(err, errlen, PS_ERR_FORMAT, "...", ...)`. */
ps_status ps_errf(char *err, size_t errlen, ps_status s, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Monotonic clock in seconds. */
double ps_now(void);
/* The same clock (CLOCK_MONOTONIC) in nanoseconds. */
int64_t ps_now_ns(void);
/* The ps_now_ns deadline timeout_ms from now; -1 (no deadline) for a negative timeout. */
int64_t ps_deadline(int timeout_ms);
/* Milliseconds left before a ps_deadline, for poll(): -1 without a deadline, 0 once past it,
 * rounded up so that a poll never returns just before the deadline (at most 1e9). */
int ps_ms_left(int64_t deadline_ns);

/* Replaces every byte of s outside printable ASCII (0x20..0x7e) with '?', in place: for
 * text from a peer on its way to a terminal or a log (no escape sequences, no line
 * breaks, no bidi controls). */
void ps_printable(char *s);

/* The CPUs this process could use when first asked (the first call must come before any
 * thread is pinned: ps_pool_pin makes it), in cpus[0..n) ascending: n, or -errno (-ENOSYS
 * off Linux). */
int ps_first_cpus(int *cpus, int cap);
/* Gives the calling thread those CPUs back (a no-op before any ps_first_cpus): for threads
 * started by a pinned thread (they inherit its one CPU), and a forked child about to exec. */
void ps_thread_unpin(void);

/* This host's MemAvailable (/proc/meminfo) in bytes, or 0 when unknown. */
uint64_t ps_mem_available(void);

/* Creates dir and any missing parents with the given mode (like mkdir -p); an existing
 * path that is not a directory is an error. */
ps_status ps_make_dirs(const char *dir, unsigned mode, char *err, size_t errlen);
/* dir + "/" + name into out (n bytes; no second '/' when dir ends with one); PS_ERR_RANGE
 * when it does not fit. */
ps_status ps_path_join(char *out, size_t n, const char *dir, const char *name, char *err, size_t errlen);

/* Parses a size: a number of bytes, or a number (a decimal fraction allowed) followed by K, M,
 * G or T (binary multiples: 500M = 500 × 2^20 bytes; lower case, and a trailing "B" or "iB",
 * accepted too: 20g, 20GB, 20GiB). At least 1 byte, at most 2^64 - 1; fractions of a byte are
 * rounded down. Anything else is PS_ERR_ARG with err saying what is expected. */
ps_status ps_size_parse(const char *s, uint64_t *out, char *err, size_t errlen);
/* Writes bytes as a short text with a binary unit ("512 B", "12.3 MiB", "20.0 GiB") into out. */
void ps_size_format(uint64_t bytes, char *out, size_t cap);

/* Library code allocates through these (and frees with free), so that a test can make the
 * Nth allocation fail, as SQLite's tests do: raise N until an operation completes, and
 * check that every failure before it was clean (an error, no leak, no crash). */
void *ps_malloc(size_t n);
void *ps_calloc(size_t n, size_t size);
void *ps_realloc(void *p, size_t n);
char *ps_strdup(const char *s);
char *ps_strndup(const char *s, size_t n);
/* Failure injection, for tests: the n-th allocation from now fails (n >= 1; 0 turns it off).
 * Returns how many allocations there were since the previous call. Thread-safe. */
long ps_alloc_fail_at(long n);

#define PS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
