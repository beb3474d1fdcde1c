/* frame.c - frames on a connection: the header codec, sealing and opening a frame's payload
 * (the cryptography is seal.c's), and the synchronous send and receive of one frame, with
 * the connection's send counters.
 *
 * A frame is a 24-byte header (magic, version, type, flags, len, XXH3-64 checksum of the
 * payload) followed by len payload bytes. Receiving checks, in this order: magic, version
 * (the payload of a frame of another version is still read when within the limit, so that
 * the handshake can answer it with a REFUSE), length against the connection's limit, then
 * the checksum once the payload is in, then (sealed) the tag. Uses socket.c and seal.c;
 * link.c (the sender thread) and auth.c (the handshake) are built on it. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "net_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "frame.c writes little-endian fields with memcpy: port it before building on a big-endian host"
#endif

#define NET_IOV_BATCH 64 /* iovecs handed to one sendmsg */
#define AD_BYTES      16 /* the header's magic, version, type, flags and len: authenticated in a sealed frame */

/* ---------------------------------------------------------------------------------------------
 * Header */

void ps_frame_hdr_encode(const ps_frame_hdr *h, uint8_t out[PS_NET_HDR_BYTES]) {
    memcpy(out + 0, &h->magic, 4);
    memcpy(out + 4, &h->version, 2);
    memcpy(out + 6, &h->type, 2);
    memcpy(out + 8, &h->flags, 4);
    memcpy(out + 12, &h->len, 4);
    memcpy(out + 16, &h->checksum, 8);
}

void ps_frame_hdr_decode(const uint8_t in[PS_NET_HDR_BYTES], ps_frame_hdr *h) {
    memcpy(&h->magic, in + 0, 4);
    memcpy(&h->version, in + 4, 2);
    memcpy(&h->type, in + 6, 2);
    memcpy(&h->flags, in + 8, 4);
    memcpy(&h->len, in + 12, 4);
    memcpy(&h->checksum, in + 16, 8);
}

/* The bytes of iov[0..iovcnt) in *len, when they and `extra` more fit a frame's u32 length. */
static ps_status iov_len(const struct iovec *iov, int iovcnt, uint32_t extra, uint32_t *len, char *err, size_t errlen) {
    uint64_t total = 0;
    for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
    if (total + extra > UINT32_MAX)
        return ps_errf(err, errlen, PS_ERR_ARG, "payload of %" PRIu64 " bytes is too large for one frame", total);
    *len = (uint32_t)total;
    return PS_OK;
}

ps_status ps_net_payload_len(const ps_conn *c, const struct iovec *iov, int iovcnt, uint32_t *len, char *err,
                             size_t errlen) {
    return iov_len(iov, iovcnt, c->seal ? NET_TAG_BYTES : 0, len, err, errlen);
}

void ps_net_gather(uint8_t *out, const struct iovec *iov, int iovcnt) {
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len) memcpy(out, iov[i].iov_base, iov[i].iov_len);
        out += iov[i].iov_len;
    }
}

ps_status ps_net_frame_header(uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt,
                              uint8_t out[PS_NET_HDR_BYTES], uint32_t *len, char *err, size_t errlen) {
    ps_frame_hdr h = {.magic = PS_NET_MAGIC, .version = PS_NET_VERSION, .type = type, .flags = flags};
    ps_status s = iov_len(iov, iovcnt, 0, &h.len, err, errlen);
    if (s != PS_OK) return s;
    if (iovcnt == 1) {
        h.checksum = XXH3_64bits(iov[0].iov_base, iov[0].iov_len);
    } else {
        XXH3_state_t st;
        XXH3_INITSTATE(&st);
        XXH3_64bits_reset(&st);
        for (int i = 0; i < iovcnt; i++)
            if (iov[i].iov_len) XXH3_64bits_update(&st, iov[i].iov_base, iov[i].iov_len);
        h.checksum = XXH3_64bits_digest(&st);
    }
    ps_frame_hdr_encode(&h, out);
    *len = h.len;
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Sealed frames */

void ps_net_seal_frame(ps_conn *c, uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt, uint32_t len,
                       uint8_t *out, uint8_t hdr[PS_NET_HDR_BYTES], uint32_t *wire_len) {
    ps_net_gather(out, iov, iovcnt);
    ps_frame_hdr h = {
        .magic = PS_NET_MAGIC, .version = PS_NET_VERSION, .type = type, .flags = flags, .len = len + NET_TAG_BYTES};
    ps_frame_hdr_encode(&h, hdr); /* the authenticated part is final; the checksum comes last */
    ps_net_seal_payload(c->seal, out, len, hdr, AD_BYTES);
    h.checksum = XXH3_64bits(out, h.len);
    ps_frame_hdr_encode(&h, hdr);
    *wire_len = h.len;
}

/* With c->seal: opens a received payload in place (h->len bytes, tag included) under the
 * next receive number; h->len becomes the plaintext's length. PS_ERR_AUTH when it fails. */
static ps_status open_frame(ps_conn *c, ps_frame_hdr *h, const uint8_t hdr[PS_NET_HDR_BYTES], uint8_t *payload,
                            char *err, size_t errlen) {
    if (!ps_net_open_payload(c->seal, payload, h->len, hdr, AD_BYTES))
        return ps_errf(err, errlen, PS_ERR_AUTH,
                       "%s sent a frame (type %u, %" PRIu32 " bytes) that fails "
                       "authentication: altered, injected, replayed or lost on the way",
                       c->peer, (unsigned)h->type, h->len);
    h->len -= NET_TAG_BYTES;
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Sending */

int ps_net_write_all(int fd, int wake_fd, struct iovec *iov, int iovcnt, int64_t deadline_ns) {
    while (iovcnt > 0 && iov[0].iov_len == 0) iov++, iovcnt--;
    while (iovcnt > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(iovcnt < NET_IOV_BATCH ? iovcnt : NET_IOV_BATCH)};
        ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
            int ms = ps_ms_left(deadline_ns);
            if (ms == 0) return ETIMEDOUT;
            struct pollfd pfd[2] = {{.fd = fd, .events = POLLOUT}, {.fd = wake_fd, .events = POLLIN}};
            int r = poll(pfd, wake_fd >= 0 ? 2 : 1, ms);
            if (r < 0 && errno != EINTR) return errno;
            if (r > 0 && wake_fd >= 0 && (pfd[1].revents & POLLIN)) return ECANCELED;
            continue;
        }
        size_t left = (size_t)n;
        while (iovcnt > 0 && left >= iov[0].iov_len) left -= iov[0].iov_len, iov++, iovcnt--;
        if (iovcnt > 0) {
            iov[0].iov_base = (uint8_t *)iov[0].iov_base + left;
            iov[0].iov_len -= left;
        }
        while (iovcnt > 0 && iov[0].iov_len == 0) iov++, iovcnt--;
    }
    return 0;
}

ps_status ps_net_write_error(const ps_conn *c, int errnum, int timeout_ms, char *err, size_t errlen) {
    char eb[128];
    if (errnum == ETIMEDOUT)
        return ps_errf(err, errlen, PS_ERR_TIMEOUT, "timed out after %d ms sending to %s", timeout_ms, c->peer);
    if (errnum == EPIPE)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot send to %s: the peer closed the connection", c->peer);
    return ps_errf(err, errlen, PS_ERR_NET, "cannot send to %s: %s", c->peer, ps_net_errno_str(errnum, eb, sizeof eb));
}

void ps_net_stats_add(ps_conn *c, uint64_t bytes, double ms) {
    pthread_mutex_lock(&c->stats_mu);
    c->stats.frames++;
    c->stats.bytes += bytes;
    c->stats.send_ms += ms;
    pthread_mutex_unlock(&c->stats_mu);
}

ps_status ps_net_send_frame(ps_conn *c, uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt,
                            int timeout_ms, char *err, size_t errlen) {
    int64_t t0 = ps_now_ns(), deadline = ps_deadline(timeout_ms);
    if (iovcnt < 0 || (iovcnt > 0 && !iov)) return ps_errf(err, errlen, PS_ERR_ARG, "bad iovec list");
    uint8_t hdr[PS_NET_HDR_BYTES];
    uint32_t len;
    ps_status s = c->seal ? ps_net_payload_len(c, iov, iovcnt, &len, err, errlen)
                          : ps_net_frame_header(type, flags, iov, iovcnt, hdr, &len, err, errlen);
    if (s != PS_OK) return s;
    struct iovec sealed;
    if (c->seal) { /* sealed into sbuf: one contiguous payload */
        if (c->scap < (size_t)len + NET_TAG_BYTES) {
            uint8_t *p = ps_realloc(c->sbuf, (size_t)len + NET_TAG_BYTES);
            if (!p) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory sending to %s", c->peer);
            c->sbuf = p, c->scap = (size_t)len + NET_TAG_BYTES;
        }
        ps_net_seal_frame(c, type, flags, iov, iovcnt, len, c->sbuf, hdr, &len);
        sealed = (struct iovec){.iov_base = c->sbuf, .iov_len = len};
        iov = &sealed;
        iovcnt = 1;
    }
    struct iovec small[NET_IOV_BATCH], *v = small;
    if (iovcnt + 1 > NET_IOV_BATCH && !(v = ps_malloc(sizeof *v * ((size_t)iovcnt + 1))))
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory sending to %s", c->peer);
    v[0] = (struct iovec){.iov_base = hdr, .iov_len = PS_NET_HDR_BYTES};
    if (iovcnt) memcpy(v + 1, iov, sizeof *v * (size_t)iovcnt);
    int e = ps_net_write_all(c->fd, -1, v, iovcnt + 1, deadline);
    if (v != small) free(v);
    if (e) return ps_net_write_error(c, e, timeout_ms, err, errlen);
    ps_net_stats_add(c, PS_NET_HDR_BYTES + (uint64_t)len, (double)(ps_now_ns() - t0) / 1e6);
    return PS_OK;
}

void ps_conn_get_stats(const ps_conn *c, ps_conn_stats *out) {
    pthread_mutex_t *mu = (pthread_mutex_t *)&c->stats_mu; /* locking does not change the counters */
    pthread_mutex_lock(mu);
    *out = c->stats;
    pthread_mutex_unlock(mu);
}

void ps_conn_reset_stats(ps_conn *c) {
    pthread_mutex_lock(&c->stats_mu);
    c->stats = (ps_conn_stats){0};
    pthread_mutex_unlock(&c->stats_mu);
}

/* ---------------------------------------------------------------------------------------------
 * Receiving */

/* Reads exactly n bytes into p before deadline. Returns PS_OK, or an error with *got
 * bytes read: PS_ERR_TIMEOUT (no line in err: the caller knows what it was waiting for),
 * PS_ERR_NET with *closed set when the peer closed, or PS_ERR_NET for a socket error
 * (line in err). */
static ps_status read_exact(ps_conn *c, uint8_t *p, size_t n, int64_t deadline, size_t *got, bool *closed, char *err,
                            size_t errlen) {
    char eb[128];
    *got = 0;
    *closed = false;
    while (*got < n) {
        ssize_t r = recv(c->fd, p + *got, n - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) {
            *closed = true;
            return PS_ERR_NET;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return ps_errf(err, errlen, PS_ERR_NET, "cannot read from %s: %s", c->peer,
                           ps_net_errno_str(errno, eb, sizeof eb));
        int ms = ps_ms_left(deadline);
        if (ms == 0) return PS_ERR_TIMEOUT;
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
            return ps_errf(err, errlen, PS_ERR_NET, "cannot read from %s: %s", c->peer,
                           ps_net_errno_str(errno, eb, sizeof eb));
    }
    return PS_OK;
}

/* Makes the receive buffer hold at least n bytes (at least 1, so a payload pointer is
 * never NULL). */
static ps_status rbuf_reserve(ps_conn *c, size_t n, char *err, size_t errlen) {
    if (n <= c->rcap && c->rbuf) return PS_OK;
    size_t cap = c->rcap ? c->rcap : 256;
    while (cap < n) cap = cap > SIZE_MAX / 2 ? n : cap * 2;
    uint8_t *p = ps_realloc(c->rbuf, cap);
    if (!p) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for a frame of %zu bytes from %s", n, c->peer);
    c->rbuf = p;
    c->rcap = cap;
    return PS_OK;
}

/* Reads the h->len payload bytes of a frame into the receive buffer (grown as needed),
 * with the err lines of a payload cut short by a timeout or by the peer closing. */
static ps_status read_payload(ps_conn *c, const ps_frame_hdr *h, int64_t deadline, int timeout_ms, char *err,
                              size_t errlen) {
    size_t got;
    bool closed;
    ps_status s = rbuf_reserve(c, h->len, err, errlen);
    if (s == PS_OK) s = read_exact(c, c->rbuf, h->len, deadline, &got, &closed, err, errlen);
    if (s == PS_ERR_TIMEOUT)
        return ps_errf(err, errlen, s,
                       "timed out after %d ms receiving a frame from %s (got %zu of %" PRIu32 " payload bytes)",
                       timeout_ms, c->peer, got, h->len);
    if (s == PS_ERR_NET && closed)
        return ps_errf(err, errlen, s,
                       "%s closed the connection in the middle of a frame (got %zu of %" PRIu32 " payload bytes)",
                       c->peer, got, h->len);
    return s;
}

ps_status ps_net_recv_frame(ps_conn *c, int timeout_ms, ps_frame_hdr *h, const uint8_t **payload, char *err,
                            size_t errlen) {
    int64_t deadline = ps_deadline(timeout_ms);
    uint8_t raw[PS_NET_HDR_BYTES];
    size_t got;
    bool closed;
    *h = (ps_frame_hdr){0};
    ps_status s = read_exact(c, raw, sizeof raw, deadline, &got, &closed, err, errlen);
    if (s == PS_ERR_TIMEOUT && got == 0)
        return ps_errf(err, errlen, s, "timed out after %d ms waiting for a frame from %s", timeout_ms, c->peer);
    if (s == PS_ERR_TIMEOUT)
        return ps_errf(err, errlen, s, "timed out after %d ms receiving a frame from %s (got %zu of %d header bytes)",
                       timeout_ms, c->peer, got, PS_NET_HDR_BYTES);
    if (s == PS_ERR_NET && closed && got == 0) return ps_errf(err, errlen, s, "%s closed the connection", c->peer);
    if (s == PS_ERR_NET && closed)
        return ps_errf(err, errlen, s, "%s closed the connection in the middle of a frame header (got %zu of %d bytes)",
                       c->peer, got, PS_NET_HDR_BYTES);
    if (s != PS_OK) return s;
    ps_frame_hdr fh;
    ps_frame_hdr_decode(raw, &fh);
    if (fh.magic != PS_NET_MAGIC)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "%s sent a frame with bad magic 0x%08" PRIx32 " (expected 0x%08x): not a pipeshard peer?",
                       c->peer, fh.magic, PS_NET_MAGIC);
    *h = fh;
    if (fh.version != PS_NET_VERSION) {
        /* drop its payload when sane, so that the handshake can still answer with REFUSE */
        if (fh.len <= c->max_payload) (void)read_payload(c, &fh, deadline, timeout_ms, NULL, 0);
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s speaks protocol version %u; this build speaks %d", c->peer,
                       (unsigned)fh.version, PS_NET_VERSION);
    }
    uint32_t tag = c->seal ? NET_TAG_BYTES : 0;
    if (fh.len > (uint64_t)c->max_payload + tag)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "%s: frame of %" PRIu32 " bytes exceeds the limit of %" PRIu32 "%s", c->peer, fh.len - tag,
                       c->max_payload, tag ? " (its 16-byte tag not counted)" : "");
    s = read_payload(c, &fh, deadline, timeout_ms, err, errlen);
    if (s != PS_OK) return s;
    uint64_t sum = XXH3_64bits(c->rbuf, fh.len);
    if (sum != fh.checksum)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "%s: checksum mismatch in a frame of type %u, %" PRIu32 " bytes (corrupted in transit)", c->peer,
                       (unsigned)fh.type, fh.len);
    if (c->seal && (s = open_frame(c, h, raw, c->rbuf, err, errlen))) return s;
    *payload = c->rbuf;
    return PS_OK;
}

/* ps_net_recv_frame without the header; the out-parameters are set only on success. */
ps_status ps_conn_recv(ps_conn *c, int timeout_ms, uint16_t *type, const uint8_t **payload, uint32_t *len, char *err,
                       size_t errlen) {
    ps_frame_hdr h;
    const uint8_t *p = NULL;
    ps_status s = ps_net_recv_frame(c, timeout_ms, &h, &p, err, errlen);
    if (s != PS_OK) return s;
    *type = h.type;
    *payload = p;
    *len = h.len;
    return PS_OK;
}
