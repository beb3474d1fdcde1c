/* frame.c - frames over TCP: the header codec, little-endian payload builders and bounded
 * readers, addresses, listen/accept/dial, and the synchronous send and receive of one frame.
 *
 * A frame is a 24-byte header (magic, version, type, flags, len, XXH3-64 checksum of the
 * payload) followed by len payload bytes. Receiving checks, in this order: magic, version
 * (the payload of a frame of another version is still read when within the limit, so that
 * the handshake can answer it with a REFUSE), length against the connection's limit, then
 * the checksum once the payload is in. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "net_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "frame.c writes little-endian fields with memcpy: port it before building on a big-endian host"
#endif

#define NET_IOV_BATCH 64 /* iovecs handed to one sendmsg */

/* ---------------------------------------------------------------------------------------------
 * Small helpers */

const char *ps_net_errno_str(int errnum, char *buf, size_t cap) {
    char tmp[128];
    const char *s = strerror_r(errnum, tmp, sizeof tmp); /* GNU variant (_GNU_SOURCE) */
    snprintf(buf, cap, "%s", s);
    if (cap > 1 && buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z')) buf[0] += 'a' - 'A';
    return buf;
}

/* Formats "host:port", bracketing hosts that contain ':' (IPv6). */
static void format_hostport(char *out, size_t cap, const char *host, int port) {
    if (strchr(host, ':'))
        snprintf(out, cap, "[%s]:%d", host, port);
    else
        snprintf(out, cap, "%s:%d", host, port);
}

/* Numeric "HOST:PORT" of a socket address. */
static void format_sockaddr(char *out, size_t cap, const struct sockaddr *sa, socklen_t salen) {
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (sa->sa_family == AF_UNIX) {
        const struct sockaddr_un *su = (const struct sockaddr_un *)sa;
        size_t off = offsetof(struct sockaddr_un, sun_path), n = salen > off ? strnlen(su->sun_path, salen - off) : 0;
        snprintf(out, cap, "unix:%.*s", (int)n, su->sun_path);
        return;
    }
    if (getnameinfo(sa, salen, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "(unknown address)");
        return;
    }
    format_hostport(out, cap, host, atoi(serv));
}

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
static ps_status iov_len(const struct iovec *iov, int iovcnt, uint32_t extra, uint32_t *len, char *err,
                         size_t errlen) {
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
 * Payload builder */

void ps_wbuf_free(ps_wbuf *b) {
    free(b->p);
    *b = (ps_wbuf){0};
}

/* Room for n more bytes (doubling); false (and oom set) when that fails. */
static bool wbuf_reserve(ps_wbuf *b, size_t n) {
    if (b->oom) return false;
    if (n <= b->cap - b->len) return true;
    if (n > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void ps_wbuf_bytes(ps_wbuf *b, const void *p, size_t n) {
    if (!wbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
}

void ps_wbuf_u8(ps_wbuf *b, uint8_t v) { ps_wbuf_bytes(b, &v, 1); }
void ps_wbuf_u16(ps_wbuf *b, uint16_t v) { ps_wbuf_bytes(b, &v, 2); }
void ps_wbuf_u32(ps_wbuf *b, uint32_t v) { ps_wbuf_bytes(b, &v, 4); }
void ps_wbuf_u64(ps_wbuf *b, uint64_t v) { ps_wbuf_bytes(b, &v, 8); }
void ps_wbuf_i32(ps_wbuf *b, int32_t v) { ps_wbuf_bytes(b, &v, 4); }
void ps_wbuf_f32(ps_wbuf *b, float v) { ps_wbuf_bytes(b, &v, 4); }

/* A string longer than 4 GiB - 1 cannot be encoded: it sets oom (the message is lost). */
void ps_wbuf_str(ps_wbuf *b, const char *s) {
    size_t n = strlen(s);
    if (n > UINT32_MAX) {
        b->oom = true;
        return;
    }
    ps_wbuf_u32(b, (uint32_t)n);
    ps_wbuf_bytes(b, s, n);
}

/* ---------------------------------------------------------------------------------------------
 * Bounded reader */

const void *ps_rbuf_bytes(ps_rbuf *r, size_t n) {
    if (r->bad || r->off > r->len || n > r->len - r->off) {
        r->bad = true;
        return NULL;
    }
    const void *p = r->p + r->off;
    r->off += n;
    return p;
}

/* Copies n bytes at the cursor into out, or zeros when they are not there. */
static void rbuf_copy(ps_rbuf *r, void *out, size_t n) {
    const void *p = ps_rbuf_bytes(r, n);
    if (p)
        memcpy(out, p, n);
    else
        memset(out, 0, n);
}

uint8_t ps_rbuf_u8(ps_rbuf *r) { uint8_t v; rbuf_copy(r, &v, 1); return v; }
uint16_t ps_rbuf_u16(ps_rbuf *r) { uint16_t v; rbuf_copy(r, &v, 2); return v; }
uint32_t ps_rbuf_u32(ps_rbuf *r) { uint32_t v; rbuf_copy(r, &v, 4); return v; }
uint64_t ps_rbuf_u64(ps_rbuf *r) { uint64_t v; rbuf_copy(r, &v, 8); return v; }
int32_t ps_rbuf_i32(ps_rbuf *r) { int32_t v; rbuf_copy(r, &v, 4); return v; }
float ps_rbuf_f32(ps_rbuf *r) { float v; rbuf_copy(r, &v, 4); return v; }

/* out always ends up NUL-terminated (empty on failure) when cap > 0. */
void ps_rbuf_str(ps_rbuf *r, char *out, size_t cap) {
    if (cap > 0) out[0] = 0;
    uint32_t n = ps_rbuf_u32(r);
    if (r->bad) return;
    if (cap == 0 || n > cap - 1) {
        r->bad = true;
        return;
    }
    const char *p = ps_rbuf_bytes(r, n);
    if (!p) return;
    if (memchr(p, 0, n)) {
        r->bad = true;
        return;
    }
    memcpy(out, p, n);
    out[n] = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Addresses */

/* Port: 1 to 5 decimal digits, at most 65535. */
static bool parse_port(const char *s, int *port) {
    size_t n = strlen(s);
    if (n == 0 || n > 5) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v > 65535) return false;
    *port = v;
    return true;
}

ps_status ps_net_parse_addr(const char *hostport, char *host, size_t hostcap, int *port, char *err, size_t errlen) {
    if (!hostport || !*hostport) return ps_errf(err, errlen, PS_ERR_ARG, "empty address (expected HOST:PORT)");
    const char *h = hostport, *colon;
    size_t hlen;
    if (hostport[0] == '[') {
        const char *close = strchr(hostport, ']');
        if (!close || close[1] != ':')
            return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\" (expected [IPV6]:PORT)", hostport);
        h = hostport + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(hostport, ':');
        if (!colon) return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\" (expected HOST:PORT)", hostport);
        hlen = (size_t)(colon - hostport);
        if (memchr(hostport, ':', hlen))
            return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\" (an IPv6 host goes in brackets: [%.*s]:PORT)",
                           hostport, (int)hlen, hostport);
    }
    if (hlen == 0)
        return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\": no host (use 0.0.0.0:PORT or [::]:PORT for any)",
                       hostport);
    if (hlen >= hostcap) return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\": host name too long", hostport);
    if (!parse_port(colon + 1, port))
        return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\": port must be a number from 0 to 65535", hostport);
    memcpy(host, h, hlen);
    host[hlen] = 0;
    return PS_OK;
}

/* getaddrinfo for host and port (numeric port, TCP). *res is freed by the caller. */
static ps_status resolve(const char *host, int port, bool passive, struct addrinfo **res, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    char serv[8];
    snprintf(serv, sizeof serv, "%d", port);
    int rc = getaddrinfo(host, serv, &hints, res);
    char eb[128];
    if (rc != 0)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot resolve %s: %s", host,
                       rc == EAI_SYSTEM ? ps_net_errno_str(errno, eb, sizeof eb) : gai_strerror(rc));
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Connections */

/* A ps_conn around a connected socket (made non-blocking here; on TCP, TCP_NODELAY set and
 * keepalive probes after 10 s of silence, so that a peer whose host vanished without a word
 * is noticed within about 25 s even by a side that only waits; a Unix socket's peer is on
 * this host, and its end is seen at once). Takes ownership of fd, also on failure. */
static ps_status conn_new(int fd, const char *peer, ps_conn **out, char *err, size_t errlen) {
    int one = 1, idle = 10, intvl = 5, cnt = 3;
    int fl = fcntl(fd, F_GETFL);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    bool tcp = getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family != AF_UNIX;
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
        (tcp && (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
                 setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) < 0 ||
                 setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
                 setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) < 0 ||
                 setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) < 0))) {
        char eb[128];
        ps_status s = ps_errf(err, errlen, PS_ERR_NET, "cannot set up the connection to %s: %s", peer,
                              ps_net_errno_str(errno, eb, sizeof eb));
        close(fd);
        return s;
    }
    ps_conn *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->stats_mu, NULL) != 0) {
        free(c);
        close(fd);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for a connection to %s", peer);
    }
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->max_payload = NET_DEFAULT_MAX_PAYLOAD;
    *out = c;
    return PS_OK;
}

/* The sender thread goes first: it writes to fd until it is stopped. */
void ps_conn_free(ps_conn *c) {
    if (!c) return;
    ps_net_sender_free(c->snd);
    close(c->fd);
    free(c->rbuf);
    free(c->sbuf);
    ps_net_seal_free(c->seal);
    pthread_mutex_destroy(&c->stats_mu);
    free(c);
}

int ps_conn_fd(const ps_conn *c) { return c->fd; }
const char *ps_conn_peer(const ps_conn *c) { return c->peer; }
bool ps_conn_sealed(const ps_conn *c) { return c->seal != NULL; }
void ps_conn_set_max_payload(ps_conn *c, uint32_t max) { c->max_payload = max; }

bool ps_net_is_unix(const char *addr) { return !strncmp(addr, "unix:", 5); }

/* The socket address of "unix:PATH". */
static ps_status unix_addr(const char *addr, struct sockaddr_un *su, socklen_t *len, char *err, size_t errlen) {
    const char *path = addr + 5;
    size_t n = strlen(path);
    if (n == 0) return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%s\": no socket path after unix:", addr);
    if (n >= sizeof su->sun_path)
        return ps_errf(err, errlen, PS_ERR_ARG, "bad address \"%.80s...\": a socket path holds at most %zu bytes", addr,
                       sizeof su->sun_path - 1);
    memset(su, 0, sizeof *su);
    su->sun_family = AF_UNIX;
    memcpy(su->sun_path, path, n);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return PS_OK;
}

/* Binds and listens on a Unix socket. A socket file nobody listens on any more (left by a
 * process that died) is replaced; a live one, or a file that is not a socket, is an error. */
static ps_status unix_listen(const char *addr, int *fd_out, char *err, size_t errlen) {
    struct sockaddr_un su;
    socklen_t sl = 0;
    char eb[128];
    ps_status s = unix_addr(addr, &su, &sl, err, errlen);
    if (s) return s;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s: %s", addr,
                       ps_net_errno_str(errno, eb, sizeof eb));
    int r = bind(fd, (struct sockaddr *)&su, sl);
    struct stat st;
    if (r < 0 && errno == EADDRINUSE && lstat(su.sun_path, &st) == 0 && S_ISSOCK(st.st_mode)) {
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && (connect(probe, (struct sockaddr *)&su, sl) == 0 || errno != ECONNREFUSED);
        if (probe >= 0) close(probe);
        if (live) {
            close(fd);
            return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s: another process listens there", addr);
        }
        r = unlink(su.sun_path) == 0 ? bind(fd, (struct sockaddr *)&su, sl) : -1;
    } else if (r < 0 && errno == EADDRINUSE) {
        errno = EEXIST; /* a file that is not a socket: never removed */
    }
    if (r < 0 || listen(fd, 64) < 0) {
        int e = errno;
        close(fd);
        return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s: %s", addr, ps_net_errno_str(e, eb, sizeof eb));
    }
    *fd_out = fd;
    return PS_OK;
}

/* The listening socket is non-blocking, so that ps_net_accept never blocks in accept4
 * when a connection vanished between poll and accept. */
ps_status ps_net_listen(const char *hostport, int *fd_out, char *bound, size_t boundcap, char *err,
                        size_t errlen) {
    char host[256], eb[128];
    int port;
    struct addrinfo *res;
    if (ps_net_is_unix(hostport)) {
        ps_status s = unix_listen(hostport, fd_out, err, errlen);
        if (!s && bound && boundcap) snprintf(bound, boundcap, "%s", hostport);
        return s;
    }
    ps_status s = ps_net_parse_addr(hostport, host, sizeof host, &port, err, errlen);
    if (s == PS_OK) s = resolve(host, port, true, &res, err, errlen);
    if (s != PS_OK) return s;
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int one = 1;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
            break;
        last = errno;
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s: %s", hostport,
                       ps_net_errno_str(last, eb, sizeof eb));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (bound && boundcap) {
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            format_sockaddr(bound, boundcap, (struct sockaddr *)&ss, sl);
        else
            snprintf(bound, boundcap, "%s", hostport);
    }
    *fd_out = fd;
    return PS_OK;
}

/* Polls the listening socket, then accept4; a connection that vanished in between (or a
 * spurious wake-up) goes back to waiting until the deadline. */
ps_status ps_net_accept(int listen_fd, int timeout_ms, ps_conn **out, char *err, size_t errlen) {
    int64_t deadline = ps_deadline(timeout_ms);
    char eb[128];
    for (;;) {
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        int n = poll(&pfd, 1, ps_ms_left(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ps_errf(err, errlen, PS_ERR_NET, "accept: %s", ps_net_errno_str(errno, eb, sizeof eb));
        if (n == 0) {
            char self[NET_PEER_MAX] = "?";
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            if (getsockname(listen_fd, (struct sockaddr *)&ss, &sl) == 0)
                format_sockaddr(self, sizeof self, (struct sockaddr *)&ss, sl);
            return ps_errf(err, errlen, PS_ERR_TIMEOUT, "no connection on %s within %d ms", self, timeout_ms);
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd < 0) {
            /* the connection may have gone between poll and accept: wait again */
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) continue;
            return ps_errf(err, errlen, PS_ERR_NET, "accept: %s", ps_net_errno_str(errno, eb, sizeof eb));
        }
        char peer[NET_PEER_MAX];
        if (ss.ss_family == AF_UNIX && (sl = sizeof ss, getsockname(fd, (struct sockaddr *)&ss, &sl) != 0))
            sl = 0; /* a client's end has no name: say where it came in */
        format_sockaddr(peer, sizeof peer, (struct sockaddr *)&ss, sl);
        return conn_new(fd, peer, out, err, errlen);
    }
}

/* One non-blocking connect to ai, waiting until deadline. Returns the socket or -1 with
 * *errnum set (ETIMEDOUT when the deadline passed). */
static int connect_one(const struct addrinfo *ai, int64_t deadline, int *errnum) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
        *errnum = errno;
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) goto fail;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int n = poll(&pfd, 1, ps_ms_left(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) goto fail;
        if (n == 0) {
            errno = ETIMEDOUT;
            goto fail;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) goto fail;
        if (soerr == 0) return fd;
        errno = soerr;
        goto fail;
    }
fail:
    *errnum = errno;
    close(fd);
    return -1;
}

/* Connects to the Unix socket of "unix:PATH" (peer = the address), or tries every address
 * of the host in turn (IPv4 and IPv6) until one connects; the deadline covers them all (name
 * resolution itself is not bounded: use numeric addresses where that matters). */
ps_status ps_net_dial(const char *hostport, int timeout_ms, ps_conn **out, char *err, size_t errlen) {
    char host[256], peer[NET_PEER_MAX], eb[128];
    int port, fd = -1, last = ECONNREFUSED;
    int64_t deadline = ps_deadline(timeout_ms);
    if (ps_net_is_unix(hostport)) {
        struct sockaddr_un su;
        struct addrinfo ai = {.ai_family = AF_UNIX, .ai_socktype = SOCK_STREAM, .ai_addr = (struct sockaddr *)&su};
        ps_status s = unix_addr(hostport, &su, &ai.ai_addrlen, err, errlen);
        if (s) return s;
        snprintf(peer, sizeof peer, "%s", hostport);
        fd = connect_one(&ai, deadline, &last);
    } else {
        struct addrinfo *res;
        ps_status s = ps_net_parse_addr(hostport, host, sizeof host, &port, err, errlen);
        if (s == PS_OK) s = resolve(host, port, false, &res, err, errlen);
        if (s != PS_OK) return s;
        format_hostport(peer, sizeof peer, host, port);
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            fd = connect_one(ai, deadline, &last);
            if (fd < 0 && last == ETIMEDOUT) break;
        }
        freeaddrinfo(res);
    }
    if (fd < 0 && last == ETIMEDOUT)
        return ps_errf(err, errlen, PS_ERR_TIMEOUT, "cannot connect to %s: timed out after %d ms", peer, timeout_ms);
    if (fd < 0)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot connect to %s: %s", peer,
                       ps_net_errno_str(last, eb, sizeof eb));
    return conn_new(fd, peer, out, err, errlen);
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
            uint8_t *p = realloc(c->sbuf, (size_t)len + NET_TAG_BYTES);
            if (!p) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory sending to %s", c->peer);
            c->sbuf = p, c->scap = (size_t)len + NET_TAG_BYTES;
        }
        ps_net_seal_frame(c, type, flags, iov, iovcnt, len, c->sbuf, hdr, &len);
        sealed = (struct iovec){.iov_base = c->sbuf, .iov_len = len};
        iov = &sealed;
        iovcnt = 1;
    }
    struct iovec small[NET_IOV_BATCH], *v = small;
    if (iovcnt + 1 > NET_IOV_BATCH && !(v = malloc(sizeof *v * ((size_t)iovcnt + 1))))
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory sending to %s", c->peer);
    v[0] = (struct iovec){.iov_base = hdr, .iov_len = PS_NET_HDR_BYTES};
    if (iovcnt) memcpy(v + 1, iov, sizeof *v * (size_t)iovcnt);
    int e = ps_net_write_all(c->fd, -1, v, iovcnt + 1, deadline);
    if (v != small) free(v);
    if (e) return ps_net_write_error(c, e, timeout_ms, err, errlen);
    ps_net_stats_add(c, PS_NET_HDR_BYTES + (uint64_t)len, (double)(ps_now_ns() - t0) / 1e6);
    return PS_OK;
}

/* While a sender thread runs, the frame goes through its queue (and this waits until it
 * is written), so that frames never interleave on the socket. */
ps_status ps_conn_send(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms, char *err,
                       size_t errlen) {
    if (c->snd) return ps_net_sender_send_sync(c, type, iov, iovcnt, timeout_ms, err, errlen);
    return ps_net_send_frame(c, type, 0, iov, iovcnt, timeout_ms, err, errlen);
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
static ps_status read_exact(ps_conn *c, uint8_t *p, size_t n, int64_t deadline, size_t *got, bool *closed,
                            char *err, size_t errlen) {
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
    uint8_t *p = realloc(c->rbuf, cap);
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
        return ps_errf(err, errlen, s, "timed out after %d ms receiving a frame from %s (got %zu of %" PRIu32
                       " payload bytes)", timeout_ms, c->peer, got, h->len);
    if (s == PS_ERR_NET && closed)
        return ps_errf(err, errlen, s, "%s closed the connection in the middle of a frame (got %zu of %" PRIu32
                       " payload bytes)", c->peer, got, h->len);
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
    if (s == PS_ERR_NET && closed && got == 0)
        return ps_errf(err, errlen, s, "%s closed the connection", c->peer);
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
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s: frame of %" PRIu32 " bytes exceeds the limit of %" PRIu32 "%s",
                       c->peer, fh.len - tag, c->max_payload, tag ? " (its 16-byte tag not counted)" : "");
    s = read_payload(c, &fh, deadline, timeout_ms, err, errlen);
    if (s != PS_OK) return s;
    uint64_t sum = XXH3_64bits(c->rbuf, fh.len);
    if (sum != fh.checksum)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "%s: checksum mismatch in a frame of type %u, %" PRIu32 " bytes (corrupted in transit)",
                       c->peer, (unsigned)fh.type, fh.len);
    if (c->seal && (s = ps_net_open_frame(c, h, raw, c->rbuf, err, errlen))) return s;
    *payload = c->rbuf;
    return PS_OK;
}

/* ps_net_recv_frame without the header; the out-parameters are set only on success. */
ps_status ps_conn_recv(ps_conn *c, int timeout_ms, uint16_t *type, const uint8_t **payload, uint32_t *len,
                       char *err, size_t errlen) {
    ps_frame_hdr h;
    const uint8_t *p = NULL;
    ps_status s = ps_net_recv_frame(c, timeout_ms, &h, &p, err, errlen);
    if (s != PS_OK) return s;
    *type = h.type;
    *payload = p;
    *len = h.len;
    return PS_OK;
}
