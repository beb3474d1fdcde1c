/* link.c - the sender thread of a connection: a FIFO of frames written in order, with
 * optional link emulation (one-way delay and rate limit).
 *
 * The queue is a ring of slots; each slot keeps its payload buffer after its frame has
 * gone (up to LINK_KEEP_BYTES of them beyond the queued frames' own), so once the ring and
 * its buffers have grown to the traffic's size, queuing a frame allocates nothing.
 * Producers copy payloads in under the lock; the thread copies the head slot's pointers
 * out, writes without the lock, then pops the head. Only the thread pops, and producers
 * only touch the tail slot, so the buffer being written never moves (growing the ring
 * moves slot structs, not buffers).
 *
 * Emulation (ps_link_sim): frame i is due at end_i = start_i + (24 + len) * 8 / rate, with
 * start_i = max(queued_i + latency, end_{i-1}): computed from the queue times alone, so the
 * schedule does not depend on when the thread wakes up. The thread sleeps until end_i
 * (pthread_cond_timedwait on CLOCK_MONOTONIC, absolute, so that ps_conn_free can wake it)
 * and then writes the whole frame: the receiver sees it complete at end_i.
 *
 * Stopping: ps_conn_free sets stop, signals the condition and writes to an eventfd that
 * the thread polls beside the socket while a write waits for room, so neither an emulated
 * delay nor a peer that stopped reading can hold it.
 *
 * ps_conn_send and ps_conn_free are here too: each must know whether a sender thread runs
 * (a synchronous frame then goes through its queue; the thread stops before the socket
 * closes). Uses frame.c (and seal.c to free the keys); nothing in src/net calls up into it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net_internal.h"

#define LINK_QUEUE_LIMIT  (64ull << 20) /* queued header + payload bytes before send_async waits */
#define LINK_QUEUE_FRAMES 4096          /* queued frames before send_async waits */
#define LINK_KEEP_BYTES   (64ull << 20) /* payload buffers kept for reuse beyond those of queued frames */

typedef struct {
    uint8_t hdr[PS_NET_HDR_BYTES]; /* encoded header, checksum included */
    uint8_t *p;                    /* (cap) payload copy; kept for the next frame in this slot */
    size_t cap;
    uint32_t len;      /* payload bytes */
    size_t off;        /* bytes of header + payload already written (by the fast path) */
    int64_t queued_ns; /* CLOCK_MONOTONIC when queued */
} link_frame;

struct net_sender {
    ps_conn *c;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work; /* to the thread: a frame was queued, or stop */
    pthread_cond_t room; /* to producers: a frame left the queue, or the thread failed */
    int wake_fd;         /* eventfd, readable once stop is set */
    link_frame *q;       /* ring of qcap slots; frames at head .. head + count - 1 */
    size_t qcap, head, count;
    uint64_t queued_bytes; /* header + payload bytes in the ring */
    uint64_t buf_bytes;    /* capacity of every slot's payload buffer, queued or kept */
    int64_t latency_ns;
    double ns_per_byte;  /* 0 = no rate limit */
    int64_t prev_end_ns; /* emulated end of the previous frame */
    bool stop;
    ps_status fail;                    /* first write error of the thread, sticky */
    char fail_msg[NET_PEER_MAX + 160]; /* its line, naming the peer */
};

/* Waits on cond until deadline_ns (CLOCK_MONOTONIC, -1 = forever). False once the deadline
 * has passed. The condition variables are made with a CLOCK_MONOTONIC attribute. */
static bool cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, int64_t deadline_ns) {
    if (deadline_ns < 0) {
        pthread_cond_wait(cond, mu);
        return true;
    }
    if (ps_now_ns() >= deadline_ns) return false;
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    pthread_cond_timedwait(cond, mu, &ts);
    return true;
}

/* When the head frame may be written: its emulated end (see the top of the file), or
 * now (0) without emulation. Advances prev_end_ns; called once per frame. */
static int64_t due_time(net_sender *s, const link_frame *f) {
    if (s->latency_ns == 0 && s->ns_per_byte == 0) return 0;
    int64_t start = f->queued_ns + s->latency_ns;
    if (start < s->prev_end_ns) start = s->prev_end_ns;
    int64_t end = start + (int64_t)llround((double)(PS_NET_HDR_BYTES + (uint64_t)f->len) * s->ns_per_byte);
    s->prev_end_ns = end;
    return end;
}

/* Records the thread's write error and drops the queue; producers learn of it from fail. */
static void sender_fail(net_sender *s, int errnum) {
    s->fail = ps_net_write_error(s->c, errnum, -1, s->fail_msg, sizeof s->fail_msg);
    s->head = s->count = 0;
    s->queued_bytes = 0;
    pthread_cond_broadcast(&s->room);
}

/* Drops the first n bytes of a frame's [header, payload] pair. */
static void skip_bytes(struct iovec iov[2], size_t n) {
    for (int i = 0; i < 2; i++) {
        size_t k = n < iov[i].iov_len ? n : iov[i].iov_len;
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + k;
        iov[i].iov_len -= k;
        n -= k;
    }
}

/* The thread: writes queued frames in order, each at its due time, until stop. */
static void *sender_main(void *arg) {
    net_sender *s = arg;
    ps_thread_unpin(); /* not on the one CPU of a pinned compute thread that started it */
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->count == 0 || s->fail) {
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        link_frame f = s->q[s->head]; /* pointers only; the buffer stays put (see top) */
        int64_t due = due_time(s, &f);
        while (!s->stop && ps_now_ns() < due) cond_wait_until(&s->work, &s->mu, due);
        if (s->stop) break;
        pthread_mutex_unlock(&s->mu);
        struct iovec iov[2] = {{.iov_base = f.hdr, .iov_len = PS_NET_HDR_BYTES}, {.iov_base = f.p, .iov_len = f.len}};
        skip_bytes(iov, f.off);
        int e = ps_net_write_all(s->c->fd, s->wake_fd, iov, 2, -1);
        int64_t done = ps_now_ns();
        pthread_mutex_lock(&s->mu);
        if (s->stop) break;
        if (e) {
            sender_fail(s, e);
            continue;
        }
        ps_net_stats_add(s->c, PS_NET_HDR_BYTES + (uint64_t)f.len, (double)(done - f.queued_ns) / 1e6);
        link_frame *sent = &s->q[s->head];
        s->head = (s->head + 1) % s->qcap;
        s->count--;
        s->queued_bytes -= PS_NET_HDR_BYTES + (uint64_t)f.len;
        if (s->buf_bytes > s->queued_bytes + LINK_KEEP_BYTES) { /* enough kept: let this one go */
            s->buf_bytes -= sent->cap;
            free(sent->p);
            sent->p = NULL;
            sent->cap = 0;
        }
        pthread_cond_broadcast(&s->room);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Stops and frees the sender thread; NULL-safe. Queued frames are dropped. */
static void sender_free(net_sender *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->room);
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    while (write(s->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {}
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->qcap; i++) free(s->q[i].p);
    free(s->q);
    close(s->wake_fd);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->room);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Checks a link emulation setting: finite, non-negative, latency at most a day. */
static ps_status check_sim(const ps_link_sim *sim, char *err, size_t errlen) {
    if (!(sim->latency_ms >= 0 && sim->latency_ms <= 86400e3))
        return ps_errf(err, errlen, PS_ERR_ARG, "link latency %g ms is out of range (0 to 86400000)", sim->latency_ms);
    if (!(sim->bandwidth_mbps == 0 || (sim->bandwidth_mbps >= PS_LINK_MIN_MBPS && sim->bandwidth_mbps <= 1e6)))
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "link bandwidth %g Mbit/s is out of range (0 = no limit, else %g to "
                       "1e+06)",
                       sim->bandwidth_mbps, PS_LINK_MIN_MBPS);
    return PS_OK;
}

ps_status ps_conn_start_sender(ps_conn *c, const ps_link_sim *sim, char *err, size_t errlen) {
    if (c->snd) return ps_errf(err, errlen, PS_ERR_ARG, "the connection to %s already has a sender thread", c->peer);
    ps_link_sim none = {0};
    if (!sim) sim = &none;
    ps_status st = check_sim(sim, err, errlen);
    if (st != PS_OK) return st;
    net_sender *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for the sender to %s", c->peer);
    s->c = c;
    s->latency_ns = (int64_t)llround(sim->latency_ms * 1e6);
    s->ns_per_byte = sim->bandwidth_mbps > 0 ? 8e9 / (sim->bandwidth_mbps * 1e6) : 0;
    s->wake_fd = eventfd(0, EFD_CLOEXEC);
    pthread_condattr_t ca;
    int stage = 0; /* how much to unwind: 1 mutex, 2 work, 3 room */
    if (s->wake_fd < 0 || pthread_condattr_init(&ca) != 0) goto err;
    if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 || pthread_mutex_init(&s->mu, NULL) != 0) goto err_ca;
    stage = 1;
    if (pthread_cond_init(&s->work, &ca) != 0) goto err_ca;
    stage = 2;
    if (pthread_cond_init(&s->room, &ca) != 0) goto err_ca;
    stage = 3;
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->thread, NULL, sender_main, s) != 0) goto err;
    c->snd = s;
    return PS_OK;
err_ca:
    pthread_condattr_destroy(&ca);
err:
    if (stage >= 3) pthread_cond_destroy(&s->room);
    if (stage >= 2) pthread_cond_destroy(&s->work);
    if (stage >= 1) pthread_mutex_destroy(&s->mu);
    if (s->wake_fd >= 0) close(s->wake_fd);
    free(s);
    return ps_errf(err, errlen, PS_ERR_NOMEM, "cannot start the sender thread for %s", c->peer);
}

/* Doubles the ring (at least 16 slots), moving the frames to slots 0 .. count - 1. */
static bool ring_grow(net_sender *s) {
    size_t cap = s->qcap ? s->qcap * 2 : 16;
    link_frame *q = ps_calloc(cap, sizeof *q);
    if (!q) return false;
    for (size_t i = 0; i < s->qcap; i++) q[i] = s->q[(s->head + i) % s->qcap];
    free(s->q);
    s->q = q;
    s->qcap = cap;
    s->head = 0;
    return true;
}

/* The sticky error of the thread, copied to err. Called with the lock held. */
static ps_status sender_error(const net_sender *s, char *err, size_t errlen) {
    return ps_errf(err, errlen, s->fail, "%s", s->fail_msg);
}

/* Writes frame f (header and payload, from byte f->off) now without blocking; true when all
 * of it went, else f->off says how much did. False with s->fail set on a socket error. */
static bool write_now(net_sender *s, link_frame *f, const struct iovec *payload, int iovcnt) {
    struct iovec v[17] = {{.iov_base = f->hdr, .iov_len = PS_NET_HDR_BYTES}};
    if (iovcnt) memcpy(v + 1, payload, sizeof *v * (size_t)iovcnt);
    struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)iovcnt + 1};
    ssize_t n;
    while ((n = sendmsg(s->c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT)) < 0 && errno == EINTR) {}
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        sender_fail(s, errno);
        return false;
    }
    f->off = n > 0 ? (size_t)n : 0;
    return f->off == PS_NET_HDR_BYTES + (size_t)f->len;
}

ps_status ps_conn_send_async(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms, char *err,
                             size_t errlen) {
    net_sender *s = c->snd;
    if (!s) return ps_net_send_frame(c, type, 0, iov, iovcnt, timeout_ms, err, errlen); /* no thread: send now */
    if (iovcnt < 0 || (iovcnt > 0 && !iov)) return ps_errf(err, errlen, PS_ERR_ARG, "bad iovec list");
    int64_t deadline = ps_deadline(timeout_ms);
    uint32_t len; /* the payload's bytes; on the wire, with the tag of a sealed frame */
    link_frame nf = {.off = 0};
    ps_status st = c->seal ? ps_net_payload_len(c, iov, iovcnt, &len, err, errlen)
                           : ps_net_frame_header(type, 0, iov, iovcnt, nf.hdr, &len, err, errlen);
    if (st != PS_OK) return st;
    uint64_t bytes = PS_NET_HDR_BYTES + (uint64_t)len + (c->seal ? NET_TAG_BYTES : 0);
    pthread_mutex_lock(&s->mu);
    while (!s->fail && s->count > 0 && (s->queued_bytes + bytes > LINK_QUEUE_LIMIT || s->count >= LINK_QUEUE_FRAMES)) {
        if (!cond_wait_until(&s->room, &s->mu, deadline)) {
            size_t n = s->count;
            pthread_mutex_unlock(&s->mu);
            return ps_errf(err, errlen, PS_ERR_TIMEOUT,
                           "timed out after %d ms waiting for room in the send queue to %s (%zu frames queued)",
                           timeout_ms, c->peer, n);
        }
    }
    if (s->fail) goto fail;
    int64_t t0 = ps_now_ns();
    /* the thread is idle and there is nothing to emulate: write now, saving the thread's
       wake-up on every hop, and queue only what the socket did not take */
    bool now = s->count == 0 && s->latency_ns == 0 && s->ns_per_byte == 0 && iovcnt < 16;
    if (now && !c->seal) { /* straight from the caller's buffers */
        nf.len = len;
        if (write_now(s, &nf, iov, iovcnt)) goto sent;
        if (s->fail) goto fail;
    }
    if (s->count == s->qcap && !ring_grow(s)) goto nomem;
    link_frame *f = &s->q[(s->head + s->count) % s->qcap];
    size_t need = (size_t)bytes - PS_NET_HDR_BYTES;
    if (f->cap < need) {
        uint8_t *p = ps_realloc(f->p, need);
        if (!p) goto nomem;
        s->buf_bytes += need - f->cap;
        f->p = p;
        f->cap = need;
    }
    if (c->seal) { /* sealed in the slot, under the lock: frame numbers follow the queue's order */
        ps_net_seal_frame(c, type, 0, iov, iovcnt, len, f->p, f->hdr, &f->len);
        f->off = 0;
        if (now && write_now(s, f, &(struct iovec){.iov_base = f->p, .iov_len = f->len}, 1)) goto sent;
        if (s->fail) goto fail;
    } else {
        ps_net_gather(f->p, iov, iovcnt);
        memcpy(f->hdr, nf.hdr, sizeof nf.hdr);
        f->len = len;
        f->off = nf.off; /* what the write from the caller's buffers took */
    }
    f->queued_ns = ps_now_ns();
    s->count++;
    s->queued_bytes += bytes;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return PS_OK;
sent:
    pthread_mutex_unlock(&s->mu);
    ps_net_stats_add(c, bytes, (double)(ps_now_ns() - t0) / 1e6);
    return PS_OK;
fail:
    st = sender_error(s, err, errlen);
    pthread_mutex_unlock(&s->mu);
    return st;
nomem:
    if (nf.off > 0) sender_fail(s, ENOMEM); /* the socket took part of the frame: the stream is broken */
    pthread_mutex_unlock(&s->mu);
    return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory queuing a frame of %u bytes to %s", (unsigned)len,
                   c->peer);
}

ps_status ps_conn_flush(ps_conn *c, int timeout_ms, char *err, size_t errlen) {
    net_sender *s = c->snd;
    if (!s) return PS_OK; /* synchronous sends are written when they return */
    int64_t deadline = ps_deadline(timeout_ms);
    ps_status st = PS_OK;
    pthread_mutex_lock(&s->mu);
    while (!s->fail && s->count > 0) {
        if (!cond_wait_until(&s->room, &s->mu, deadline)) {
            st = ps_errf(err, errlen, PS_ERR_TIMEOUT, "timed out after %d ms flushing to %s (%zu frames queued)",
                         timeout_ms, c->peer, s->count);
            break;
        }
    }
    if (s->fail) st = sender_error(s, err, errlen);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Queues one frame and waits for it to be written (what ps_conn_send does while a sender
 * runs, so that a synchronous frame cannot interleave with queued ones on the socket). */
static ps_status sender_send_sync(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms,
                                  char *err, size_t errlen) {
    int64_t deadline = ps_deadline(timeout_ms);
    ps_status st = ps_conn_send_async(c, type, iov, iovcnt, timeout_ms, err, errlen);
    if (st != PS_OK) return st;
    int left = timeout_ms;
    if (deadline >= 0) {
        int64_t ns = deadline - ps_now_ns();
        left = ns <= 0 ? 0 : (int)((ns + 999999) / 1000000);
    }
    return ps_conn_flush(c, left, err, errlen);
}

/* ---------------------------------------------------------------------------------------------
 * The connection's sync send and teardown */

/* While a sender thread runs, the frame goes through its queue (and this waits until it
 * is written), so that frames never interleave on the socket. */
ps_status ps_conn_send(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms, char *err,
                       size_t errlen) {
    if (c->snd) return sender_send_sync(c, type, iov, iovcnt, timeout_ms, err, errlen);
    return ps_net_send_frame(c, type, 0, iov, iovcnt, timeout_ms, err, errlen);
}

/* The sender thread goes first: it writes to fd until it is stopped. */
void ps_conn_free(ps_conn *c) {
    if (!c) return;
    sender_free(c->snd);
    close(c->fd);
    free(c->rbuf);
    free(c->sbuf);
    ps_net_seal_free(c->seal);
    pthread_mutex_destroy(&c->stats_mu);
    free(c);
}
