/* socket.c - addresses ("HOST:PORT", "[v6]:PORT", "unix:PATH"), listen, accept and dial,
 * and the connection object around a connected socket (made here; ps_conn_free is in link.c,
 * which stops the sender thread before the socket closes).
 *
 * Every connection socket is made non-blocking here; TCP ones get TCP_NODELAY and keepalive
 * probes. Uses nothing else of src/net: frames (frame.c) are written on these sockets. */
#include <errno.h>
#include <fcntl.h>
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
#include <unistd.h>

#include "net_internal.h"

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
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
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
    ps_conn *c = ps_calloc(1, sizeof *c);
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

int ps_conn_fd(const ps_conn *c) { return c->fd; }
const char *ps_conn_peer(const ps_conn *c) { return c->peer; }
bool ps_conn_sealed(const ps_conn *c) { return c->seal != NULL; }
void ps_conn_set_max_payload(ps_conn *c, uint32_t max) { c->max_payload = max; }

bool ps_net_is_unix(const char *addr) { return !strncmp(addr, "unix:", 5); }

bool ps_net_fd_is_local(int fd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return false;
    if (ss.ss_family == AF_UNIX) return true;
    if (ss.ss_family == AF_INET) return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family != AF_INET6) return false;
    const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

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
ps_status ps_net_listen(const char *hostport, int *fd_out, char *bound, size_t boundcap, char *err, size_t errlen) {
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
