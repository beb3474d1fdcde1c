/* probe.c - link probes: a worker's answer to `pipeshard probe --link` (HOST_INFO, then an
 * ECHO for each ECHO) and the probe's side, which times them: the round trip and the rate
 * each way between two hosts, for hosts.json's "links".
 *
 * After the handshake (the probe's hello: role PS_ROLE_PROBE, no stage), payloads in the
 * ps_wbuf/ps_rbuf encoding:
 *   HOST_INFO  worker → probe, first: str host, u64 mem_available, i32 threads, str device,
 *              f32 ms_per_gb
 *   ECHO       probe → worker: u32 reply_bytes, then padding (any bytes, not read)
 *              worker → probe: reply_bytes bytes (zeros)
 *   ERROR      worker → probe, instead of an answer: u8 0, str reason; then the worker closes
 * A probe closes the connection when done. Padding and replies are at most PS_ECHO_MAX_BYTES;
 * what one connection may take (time, bytes) is the worker's ps_echo_limits.
 *
 * The top of src/net with auth.c, whose handshake comes first: it dials and shakes hands
 * (socket.c, auth.c) and exchanges frames (frame.c, link.c for the worker's emulated hop). */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net_internal.h"

#define ZERO_BLOCK (1u << 20) /* the padding and replies are gathered from this block, repeated */
#define ZERO_IOVS  (PS_ECHO_MAX_BYTES / ZERO_BLOCK + 2)
#define ECHO_HEAD  4  /* an ECHO request's u32 reply_bytes */
#define ECHO_SLACK 64 /* a probe connection's payload limit: PS_ECHO_MAX_BYTES + this */
#define RTT_WARM   2  /* empty ECHOs not timed */
#define RTT_TIMED  20 /* empty ECHOs timed: the round trip is their median */
#define RATE_TIMED 3  /* transfers timed each way: the rate is the best */
#define RAMP_FIRST (64u << 10)
#define RAMP_LAST  (16u << 20) /* the size of the timed transfers, unless one of RAMP_MS comes first */
#define RAMP_MS    300.0       /* a ramp transfer taking longer fixes the size of the timed ones */

static uint8_t zeros[ZERO_BLOCK]; /* never written */

/* Points iov[0..) at n bytes of zeros (ZERO_BLOCK at a time); returns how many iovecs. */
static int zero_iov(struct iovec *iov, size_t n) {
    int k = 0;
    for (; n; k++) {
        size_t m = n < ZERO_BLOCK ? n : ZERO_BLOCK;
        iov[k] = (struct iovec){.iov_base = zeros, .iov_len = m};
        n -= m;
    }
    return k;
}

// ---------------------------------------------------------------------------------------
// HOST_INFO

void ps_host_info_encode(ps_wbuf *b, const ps_host_info *h) {
    b->len = 0;
    ps_wbuf_str(b, h->host);
    ps_wbuf_u64(b, h->mem_available);
    ps_wbuf_i32(b, h->threads);
    ps_wbuf_str(b, h->device);
    ps_wbuf_f32(b, h->ms_per_gb);
}

/* Whether c may stand in HOST_INFO's text: printable ASCII but '"' and '\\' (the text goes
 * into JSON and onto a terminal). */
static bool plain_char(char c) { return c >= ' ' && c <= '~' && c != '"' && c != '\\'; }

static bool plain_text(const char *s) {
    for (; *s; s++)
        if (!plain_char(*s)) return false;
    return true;
}

void ps_host_text_plain(char *s) {
    for (; *s; s++)
        if (!plain_char(*s)) *s = '?';
}

ps_status ps_host_info_decode(const uint8_t *p, size_t len, ps_host_info *out, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    *out = (ps_host_info){0};
    ps_rbuf_str(&r, out->host, sizeof out->host);
    out->mem_available = ps_rbuf_u64(&r);
    out->threads = ps_rbuf_i32(&r);
    ps_rbuf_str(&r, out->device, sizeof out->device);
    out->ms_per_gb = ps_rbuf_f32(&r);
    if (r.bad || r.off != len) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed HOST_INFO (%zu bytes)", len);
    if (!plain_text(out->host) || !plain_text(out->device) || out->threads < 0 ||
        !(out->ms_per_gb >= 0 && out->ms_per_gb < 1e9f))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "malformed HOST_INFO: a host name or device that is not plain printable ASCII, %d threads, or "
                       "%g ms per GB",
                       (int)out->threads, out->ms_per_gb);
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// The worker's side

/* Tells the probe why its connection ends (ERROR, best effort, through the emulated hop when
 * there is one, flushed) and returns s with the reason in err. */
static ps_status echo_fail(ps_conn *c, ps_status s, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static ps_status echo_fail(ps_conn *c, ps_status s, char *err, size_t errlen, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    ps_wbuf b = {0};
    ps_wbuf_u8(&b, 0);
    ps_wbuf_str(&b, why);
    struct iovec iov = {b.p, b.len};
    if (!b.oom && !ps_conn_send_async(c, PS_MSG_ERROR, &iov, 1, 1000, NULL, 0)) ps_conn_flush(c, 1000, NULL, 0);
    ps_wbuf_free(&b);
    return ps_errf(err, errlen, s, "%s", why);
}

/* Waits up to lim->idle_ms (and no later than end) for the next frame. PS_OK: one is
 * arriving (or the socket has an error for recv to report); *closed: the probe closed the
 * connection between frames, its normal end. */
static ps_status echo_wait(ps_conn *c, const ps_echo_limits *lim, int64_t end, bool *closed, char *err, size_t errlen) {
    *closed = false;
    for (;;) {
        int left = ps_ms_left(end), wait = lim->idle_ms < left ? lim->idle_ms : left;
        if (left == 0)
            return echo_fail(c, PS_ERR_TIMEOUT, err, errlen, "the probe took %.0f s, the most a link probe may take",
                             lim->max_s);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = poll(&pfd, 1, wait);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 && wait == left) continue; /* the time limit, said above */
        if (r == 0) return echo_fail(c, PS_ERR_TIMEOUT, err, errlen, "no ECHO within %d ms", lim->idle_ms);
        char one;
        *closed = r > 0 && recv(c->fd, &one, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
        return PS_OK;
    }
}

/* Reads one ECHO request and answers it, within the limits; counts it in st. */
static ps_status echo_one(ps_conn *c, const ps_echo_limits *lim, int64_t end, ps_echo_stats *st, char *err,
                          size_t errlen) {
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    ps_status s = ps_conn_recv(c, ps_ms_left(end), &type, &p, &len, err, errlen);
    if (s == PS_ERR_NET) return s; /* the connection is gone: nobody to tell */
    if (s) return echo_fail(c, s, err, errlen, "%s", err);
    if (type != PS_MSG_ECHO)
        return echo_fail(c, PS_ERR_PROTOCOL, err, errlen, "expected ECHO, got message type %u", (unsigned)type);
    ps_rbuf r = {.p = p, .len = len};
    uint32_t reply = ps_rbuf_u32(&r);
    if (r.bad) return echo_fail(c, PS_ERR_PROTOCOL, err, errlen, "malformed ECHO (%u bytes)", len);
    if (reply > PS_ECHO_MAX_BYTES)
        return echo_fail(c, PS_ERR_PROTOCOL, err, errlen, "ECHO asks for a reply of %u bytes (at most %u)", reply,
                         PS_ECHO_MAX_BYTES);
    st->bytes += len;
    if (st->bytes + reply > lim->max_bytes) {
        char most[32];
        ps_size_format(lim->max_bytes, most, sizeof most);
        return echo_fail(c, PS_ERR_RANGE, err, errlen, "the probe would move more than %s, the most a link probe may",
                         most);
    }
    struct iovec iov[ZERO_IOVS];
    int n = zero_iov(iov, reply);
    int left = ps_ms_left(end);
    if ((s = ps_conn_send_async(c, PS_MSG_ECHO, iov, n, left ? left : 1, err, errlen))) return s;
    st->bytes += reply;
    st->echoes++;
    return PS_OK;
}

ps_status ps_net_echo_serve(ps_conn *c, const ps_host_info *hi, const ps_link_sim *sim, const ps_echo_limits *lim,
                            ps_echo_stats *st, char *err, size_t errlen) {
    double t0 = ps_now();
    int64_t end = ps_now_ns() + (int64_t)(lim->max_s * 1e9);
    *st = (ps_echo_stats){0};
    ps_conn_set_max_payload(c, PS_ECHO_MAX_BYTES + ECHO_SLACK);
    ps_wbuf b = {0};
    ps_host_info_encode(&b, hi);
    ps_status s = b.oom ? ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for HOST_INFO") : PS_OK;
    if (!s && sim && (sim->latency_ms > 0 || sim->bandwidth_mbps > 0))
        s = ps_conn_start_sender(c, sim, err, errlen); /* the replies travel as the worker's hop does */
    struct iovec iov = {b.p, b.len};
    if (!s) s = ps_conn_send_async(c, PS_MSG_HOST_INFO, &iov, 1, lim->idle_ms, err, errlen);
    ps_wbuf_free(&b);
    bool closed = false;
    while (!s && !(s = echo_wait(c, lim, end, &closed, err, errlen)) && !closed)
        s = echo_one(c, lim, end, st, err, errlen);
    if (!s) ps_conn_flush(c, 1000, NULL, 0);
    st->secs = ps_now() - t0;
    return s;
}

// ---------------------------------------------------------------------------------------
// The probe's side

ps_status ps_net_echo(ps_conn *c, uint32_t send_bytes, uint32_t reply_bytes, int timeout_ms, double *ms, char *err,
                      size_t errlen) {
    if (send_bytes > PS_ECHO_MAX_BYTES || reply_bytes > PS_ECHO_MAX_BYTES)
        return ps_errf(err, errlen, PS_ERR_ARG, "an ECHO carries at most %u bytes either way", PS_ECHO_MAX_BYTES);
    uint8_t head[ECHO_HEAD] = {(uint8_t)reply_bytes, (uint8_t)(reply_bytes >> 8), (uint8_t)(reply_bytes >> 16),
                               (uint8_t)(reply_bytes >> 24)};
    struct iovec iov[ZERO_IOVS + 1] = {{.iov_base = head, .iov_len = sizeof head}};
    int n = 1 + zero_iov(iov + 1, send_bytes);
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    double t0 = ps_now();
    ps_status s = ps_conn_send(c, PS_MSG_ECHO, iov, n, timeout_ms, err, errlen);
    if (!s) s = ps_conn_recv(c, timeout_ms, &type, &p, &len, err, errlen);
    *ms = (ps_now() - t0) * 1e3;
    if (s) return s;
    if (type == PS_MSG_ERROR) {
        char why[400];
        ps_rbuf r = {.p = p, .len = len};
        ps_rbuf_u8(&r);
        ps_rbuf_str(&r, why, sizeof why);
        ps_printable(why);
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s ended the probe: %s", c->peer,
                       r.bad ? "(a malformed ERROR)" : why);
    }
    if (type != PS_MSG_ECHO || len != reply_bytes)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "%s answered an ECHO asking for %u bytes with a frame of type %u and %u bytes", c->peer,
                       reply_bytes, (unsigned)type, len);
    return PS_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Megabits per second of bytes that took ms, a round trip of rtt_ms included. */
static double rate_mbps(double bytes, double ms, double rtt_ms) {
    double t = ms - rtt_ms > 0 ? ms - rtt_ms : ms;
    return bytes * 8 / (t / 1e3) / 1e6;
}

/* The round trip: RTT_WARM empty ECHOs, then the median of RTT_TIMED. */
static ps_status time_rtt(ps_conn *c, int timeout_ms, ps_link_probe *out, char *err, size_t errlen) {
    double ms[RTT_TIMED], t;
    for (int i = 0; i < RTT_WARM + RTT_TIMED; i++) {
        ps_status s = ps_net_echo(c, 0, 0, timeout_ms, &t, err, errlen);
        if (s) return s;
        if (i >= RTT_WARM) ms[i - RTT_WARM] = t;
    }
    qsort(ms, RTT_TIMED, sizeof *ms, cmp_double);
    out->rtt_ms = (ms[RTT_TIMED / 2 - 1] + ms[RTT_TIMED / 2]) / 2;
    out->rtt_min_ms = ms[0], out->rtt_max_ms = ms[RTT_TIMED - 1];
    return PS_OK;
}

/* The size of the timed transfers: one up and one down of RAMP_FIRST bytes, then four times
 * as many, until one takes RAMP_MS or RAMP_LAST bytes went (on a slow link a smaller size
 * keeps each transfer to about a second; the ramp also opens TCP's windows). */
static ps_status ramp(ps_conn *c, int timeout_ms, uint32_t *bulk, char *err, size_t errlen) {
    uint32_t n = RAMP_FIRST;
    for (;; n *= 4) {
        double up, down;
        ps_status s = ps_net_echo(c, n - ECHO_HEAD, 0, timeout_ms, &up, err, errlen);
        if (!s) s = ps_net_echo(c, 0, n, timeout_ms, &down, err, errlen);
        if (s) return s;
        if (up > RAMP_MS || down > RAMP_MS || n >= RAMP_LAST) break;
    }
    *bulk = n;
    return PS_OK;
}

ps_status ps_net_link_probe_conn(ps_conn *c, int timeout_ms, ps_link_probe *out, char *err, size_t errlen) {
    ps_hello worker = out->worker;
    *out = (ps_link_probe){.worker = worker, .sealed = ps_conn_sealed(c)};
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    ps_status s = ps_conn_recv(c, timeout_ms, &type, &p, &len, err, errlen);
    if (!s && type != PS_MSG_HOST_INFO)
        s = ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s sent message type %u, not HOST_INFO", c->peer, (unsigned)type);
    char e[300];
    if (!s && (s = ps_host_info_decode(p, len, &out->host, e, sizeof e)))
        return ps_errf(err, errlen, s, "%s sent a %s", c->peer, e);
    if (!s) s = time_rtt(c, timeout_ms, out, err, errlen);
    if (!s) s = ramp(c, timeout_ms, &out->bulk_bytes, err, errlen);
    double best_up = 0, best_down = 0;
    for (int i = 0; !s && i < RATE_TIMED; i++) {
        double up, down;
        if (!(s = ps_net_echo(c, out->bulk_bytes - ECHO_HEAD, 0, timeout_ms, &up, err, errlen)))
            s = ps_net_echo(c, 0, out->bulk_bytes, timeout_ms, &down, err, errlen);
        if (s) break;
        double ru = rate_mbps(out->bulk_bytes, up, out->rtt_ms), rd = rate_mbps(out->bulk_bytes, down, out->rtt_ms);
        best_up = ru > best_up ? ru : best_up, best_down = rd > best_down ? rd : best_down;
    }
    out->up_mbps = best_up, out->down_mbps = best_down;
    return s;
}

/* The probe's check of the peer: a worker, whatever it serves. */
static ps_status check_worker(void *ctx, const ps_hello *p, char *err, size_t errlen) {
    (void)ctx;
    if (p->role != PS_ROLE_WORKER)
        return ps_errf(err, errlen, PS_ERR_ARG, "the peer is not a worker (role %d)", (int)p->role);
    return PS_OK;
}

ps_status ps_net_link_probe(const char *addr, const uint8_t *key, int timeout_ms, ps_link_probe *out, char *err,
                            size_t errlen) {
    ps_conn *c = NULL;
    ps_hello me = {.role = PS_ROLE_PROBE, .stage_count = 1};
    *out = (ps_link_probe){0};
    ps_status s = ps_net_dial(addr, timeout_ms, &c, err, errlen);
    if (!s)
        s = ps_net_handshake_client(c, key, &me, check_worker, NULL, PS_ECHO_MAX_BYTES + ECHO_SLACK, timeout_ms,
                                    &out->worker, err, errlen);
    if (!s) s = ps_net_link_probe_conn(c, timeout_ms, out, err, errlen);
    ps_conn_free(c);
    return s;
}
