/* test_net.c - frames, payload codecs, addresses, malformed and truncated input, the
 * handshake (keys, refusals, stale versions) and link emulation, over loopback TCP.
 *
 * Malformed frames are written byte by byte with the helpers below (not with the
 * module's encoder), so the receiver is checked against the wire format. Timing checks
 * are bounds on one emulated hop (a lower bound from the formula on every run, an upper
 * bound with generous slack on the fastest of up to 3 runs); the whole program runs in a
 * few seconds. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "net/net.h"
#include "ps.h"
#include "ps_test.h"

#define SLACK_MS 60.0 /* allowed delay beyond an emulated schedule (loaded CI machine, ASan) */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Checks that got equals want, printing both when not. */
static void check_str(const char *got, const char *want, int line) {
    ps_test_checks++;
    if (strcmp(got, want) != 0) {
        ps_test_failures++;
        fprintf(stderr, "test_net.c:%d: got \"%s\"\n                expected \"%s\"\n", line, got, want);
    }
}
#define CHECK_STR(got, want) check_str(got, want, __LINE__)

/* Checks that got contains want. */
static void check_has(const char *got, const char *want, int line) {
    ps_test_checks++;
    if (!strstr(got, want)) {
        ps_test_failures++;
        fprintf(stderr, "test_net.c:%d: \"%s\" does not contain \"%s\"\n", line, got, want);
    }
}
#define CHECK_HAS(got, want) check_has(got, want, __LINE__)
#define PS_XSTR(x)           #x
#define PS_STR(x)            PS_XSTR(x)

/* ---- helpers: connections and raw bytes ---------------------------------------------- */

/* A connected loopback pair: *cl dialed, *sv accepted. False (check failed) on error. */
static bool make_pair_at(const char *addr, ps_conn **cl, ps_conn **sv) {
    char bound[128], err[256];
    int lfd = -1;
    *cl = *sv = NULL;
    if (ps_net_listen(addr, &lfd, bound, sizeof bound, err, sizeof err) != PS_OK) {
        fprintf(stderr, "listen %s: %s\n", addr, err);
        return false;
    }
    ps_status s = ps_net_dial(bound, 1000, cl, err, sizeof err);
    if (s == PS_OK) s = ps_net_accept(lfd, 1000, sv, err, sizeof err);
    close(lfd);
    if (s != PS_OK) {
        fprintf(stderr, "pair: %s\n", err);
        ps_conn_free(*cl);
        *cl = NULL;
    }
    return s == PS_OK;
}

static bool make_pair(ps_conn **cl, ps_conn **sv) {
    bool ok = make_pair_at("127.0.0.1:0", cl, sv);
    PS_CHECK(ok);
    return ok;
}

static void raw_send(ps_conn *c, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(ps_conn_fd(c), b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            PS_CHECK(!"raw send failed");
            return;
        }
        b += w;
        n -= (size_t)w;
    }
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A header laid out by hand: magic, version, type, flags, len, checksum. */
static void raw_hdr(uint8_t out[24], uint32_t magic, uint16_t version, uint16_t type, uint32_t len, uint64_t sum) {
    put_le(out + 0, magic, 4);
    put_le(out + 4, version, 2);
    put_le(out + 6, type, 2);
    put_le(out + 8, 0, 4);
    put_le(out + 12, len, 4);
    put_le(out + 16, sum, 8);
}

/* A whole hand-made frame with a correct checksum. */
static void raw_frame(ps_conn *c, uint16_t version, uint16_t type, const void *p, uint32_t len) {
    uint8_t h[24];
    raw_hdr(h, 0x3144534e, version, type, len, XXH3_64bits(p, len));
    raw_send(c, h, 24);
    raw_send(c, p, len);
}

/* ---- header and payload codecs ------------------------------------------------------- */

static void test_header_codec(void) {
    ps_frame_hdr h = {.magic = PS_NET_MAGIC,
                      .version = 1,
                      .type = 18,
                      .flags = 0,
                      .len = 0x01020304,
                      .checksum = 0x1122334455667788ull};
    uint8_t enc[24], want[24];
    ps_frame_hdr_encode(&h, enc);
    raw_hdr(want, PS_NET_MAGIC, 1, 18, 0x01020304, 0x1122334455667788ull);
    PS_CHECK(memcmp(enc, want, 24) == 0);
    PS_CHECK(memcmp(enc, "NSD1", 4) == 0);
    ps_frame_hdr d;
    ps_frame_hdr_decode(enc, &d);
    PS_CHECK(d.magic == h.magic && d.version == h.version && d.type == h.type && d.flags == h.flags && d.len == h.len &&
             d.checksum == h.checksum);
}

static void test_wbuf_rbuf(void) {
    ps_wbuf w = {0};
    ps_wbuf_u8(&w, 0xab);
    ps_wbuf_u16(&w, 0xbeef);
    ps_wbuf_u32(&w, 0xdeadbeef);
    ps_wbuf_u64(&w, 0x0102030405060708ull);
    ps_wbuf_i32(&w, -7);
    ps_wbuf_f32(&w, 1.5f);
    ps_wbuf_str(&w, "hello");
    ps_wbuf_bytes(&w, "xyz", 3);
    for (int i = 0; i < 1000; i++) ps_wbuf_u32(&w, (uint32_t)i); /* growth */
    PS_CHECK(!w.oom);
    PS_CHECK_EQ_INT(w.len, 1 + 2 + 4 + 8 + 4 + 4 + 4 + 5 + 3 + 4000);
    PS_CHECK(w.p[1] == 0xef && w.p[2] == 0xbe); /* little-endian */

    ps_rbuf r = {.p = w.p, .len = w.len};
    char s[16];
    PS_CHECK_EQ_INT(ps_rbuf_u8(&r), 0xab);
    PS_CHECK_EQ_INT(ps_rbuf_u16(&r), 0xbeef);
    PS_CHECK_EQ_INT(ps_rbuf_u32(&r), 0xdeadbeef);
    PS_CHECK(ps_rbuf_u64(&r) == 0x0102030405060708ull);
    PS_CHECK_EQ_INT(ps_rbuf_i32(&r), -7);
    PS_CHECK(ps_rbuf_f32(&r) == 1.5f);
    ps_rbuf_str(&r, s, sizeof s);
    CHECK_STR(s, "hello");
    PS_CHECK(memcmp(ps_rbuf_bytes(&r, 3), "xyz", 3) == 0);
    bool seq = true;
    for (uint32_t i = 0; i < 1000; i++) seq &= ps_rbuf_u32(&r) == i;
    PS_CHECK(seq);
    PS_CHECK(!r.bad && r.off == r.len);

    /* past the end: zeros / NULL, bad stays set, the cursor does not move */
    PS_CHECK_EQ_INT(ps_rbuf_u8(&r), 0);
    PS_CHECK(r.bad);
    r = (ps_rbuf){.p = w.p, .len = 3};
    PS_CHECK_EQ_INT(ps_rbuf_u32(&r), 0);
    PS_CHECK(r.bad && r.off == 0);
    PS_CHECK_EQ_INT(ps_rbuf_u8(&r), 0); /* there are bytes, but bad sticks */
    PS_CHECK(ps_rbuf_bytes(&r, 1) == NULL);
    PS_CHECK(ps_rbuf_u64(&r) == 0 && ps_rbuf_i32(&r) == 0 && ps_rbuf_f32(&r) == 0.0f && ps_rbuf_u16(&r) == 0);
    r = (ps_rbuf){.p = w.p, .len = w.len};
    PS_CHECK(ps_rbuf_bytes(&r, w.len + 1) == NULL && r.bad);
    r = (ps_rbuf){.p = w.p, .len = w.len};
    PS_CHECK(ps_rbuf_bytes(&r, SIZE_MAX) == NULL && r.bad);

    /* strings: too long for out, containing a NUL, length past the end */
    w.len = 0;
    ps_wbuf_str(&w, "0123456789abcdef0123");
    r = (ps_rbuf){.p = w.p, .len = w.len};
    strcpy(s, "junk");
    ps_rbuf_str(&r, s, sizeof s);
    PS_CHECK(r.bad && s[0] == 0);
    w.len = 0;
    ps_wbuf_u32(&w, 3);
    ps_wbuf_bytes(&w, "a\0b", 3);
    r = (ps_rbuf){.p = w.p, .len = w.len};
    ps_rbuf_str(&r, s, sizeof s);
    PS_CHECK(r.bad && s[0] == 0);
    w.len = 0;
    ps_wbuf_u32(&w, 100);
    ps_wbuf_bytes(&w, "abc", 3);
    r = (ps_rbuf){.p = w.p, .len = w.len};
    ps_rbuf_str(&r, s, sizeof s);
    PS_CHECK(r.bad && s[0] == 0);
    w.len = 0;
    ps_wbuf_str(&w, "");
    r = (ps_rbuf){.p = w.p, .len = w.len};
    ps_rbuf_str(&r, s, sizeof s);
    PS_CHECK(!r.bad && s[0] == 0 && r.off == 4);
    ps_wbuf_free(&w);
    PS_CHECK(w.p == NULL && w.len == 0);
}

/* ---- addresses, dial, listen, accept ------------------------------------------------- */

static void test_parse_addr(void) {
    char host[64], err[256];
    int port = -1;
    PS_CHECK_OK(ps_net_parse_addr("10.0.0.2:7701", host, sizeof host, &port, err, sizeof err));
    CHECK_STR(host, "10.0.0.2");
    PS_CHECK_EQ_INT(port, 7701);
    PS_CHECK_OK(ps_net_parse_addr("[::1]:0", host, sizeof host, &port, err, sizeof err));
    CHECK_STR(host, "::1");
    PS_CHECK_EQ_INT(port, 0);
    PS_CHECK_OK(ps_net_parse_addr("worker-3.lan:65535", host, sizeof host, &port, err, sizeof err));
    CHECK_STR(host, "worker-3.lan");
    PS_CHECK_EQ_INT(port, 65535);
    static const char *const bad[] = {"",   "nohost", ":80",     "::1:80", "h:65536", "h:-1",
                                      "h:", "h:12a",  "[::1]80", "[::1",   "h:000001"};
    for (size_t i = 0; i < PS_ARRAY_LEN(bad); i++) {
        err[0] = 0;
        PS_CHECK_EQ_INT(ps_net_parse_addr(bad[i], host, sizeof host, &port, err, sizeof err), PS_ERR_ARG);
        PS_CHECK(err[0] != 0);
    }
    ps_net_parse_addr("::1:80", host, sizeof host, &port, err, sizeof err);
    CHECK_STR(err, "bad address \"::1:80\" (an IPv6 host goes in brackets: [::1]:PORT)");
    ps_net_parse_addr("h:65536", host, sizeof host, &port, err, sizeof err);
    CHECK_STR(err, "bad address \"h:65536\": port must be a number from 0 to 65535");
    PS_CHECK_EQ_INT(ps_net_parse_addr("averyveryverylonghostname:1", host, 8, &port, err, sizeof err), PS_ERR_ARG);
}

static void test_dial_errors(void) {
    char bound[128], err[256], want[256];
    int lfd;
    ps_conn *c = NULL;
    /* a port bound but not listening: refused, and held so that nobody else listens there */
    int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    PS_CHECK(held >= 0 && bind(held, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             getsockname(held, (struct sockaddr *)&sa, &sl) == 0);
    snprintf(bound, sizeof bound, "127.0.0.1:%d", ntohs(sa.sin_port));
    PS_CHECK_EQ_INT(ps_net_dial(bound, 1000, &c, err, sizeof err), PS_ERR_NET);
    close(held);
    snprintf(want, sizeof want, "cannot connect to %s: connection refused", bound);
    CHECK_STR(err, want);
    PS_CHECK(c == NULL);
    PS_CHECK_EQ_INT(ps_net_dial("nohost", 1000, &c, err, sizeof err), PS_ERR_ARG);
    /* accept with nobody calling */
    PS_CHECK_OK(ps_net_listen("127.0.0.1:0", &lfd, bound, sizeof bound, err, sizeof err));
    double t0 = now_ms();
    PS_CHECK_EQ_INT(ps_net_accept(lfd, 50, &c, err, sizeof err), PS_ERR_TIMEOUT);
    PS_CHECK(now_ms() - t0 >= 49);
    snprintf(want, sizeof want, "no connection on %s within 50 ms", bound);
    CHECK_STR(err, want);
    /* the port is taken */
    int lfd2 = -1;
    PS_CHECK_EQ_INT(ps_net_listen(bound, &lfd2, NULL, 0, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "cannot listen on %s: address already in use", bound);
    CHECK_STR(err, want);
    close(lfd);
    ps_conn_free(NULL);
}

/* ---- frames ------------------------------------------------------------------------------ */

typedef struct {
    ps_conn *c;
    uint32_t len;
    ps_status st;
} big_send;

static void *big_send_main(void *arg) {
    big_send *b = arg;
    uint8_t *p = malloc(b->len);
    for (uint32_t i = 0; i < b->len; i++) p[i] = (uint8_t)(i * 7 + 3);
    struct iovec iov[3] = {{p, 10}, {p + 10, 0}, {p + 10, b->len - 10}};
    char err[256];
    b->st = ps_conn_send(b->c, PS_MSG_FORWARD, iov, 3, 5000, err, sizeof err);
    free(p);
    return NULL;
}

static void test_round_trip_at(const char *addr) {
    ps_conn *a, *b;
    if (!make_pair_at(addr, &a, &b)) {
        char why[160];
        snprintf(why, sizeof why, "round trip on %s (no such address here)", addr);
        ps_test_skip_part(why);
        return;
    }
    char err[256];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    /* several shapes of iovec lists, payload sizes 0 .. 60000 */
    static uint8_t data[60000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 + 1);
    const uint32_t sizes[] = {0, 1, 23, 24, 1000, 60000};
    for (size_t k = 0; k < PS_ARRAY_LEN(sizes); k++) {
        uint32_t n = sizes[k], cut = n / 3;
        struct iovec iov[3] = {{data, cut}, {data + cut, 0}, {data + cut, n - cut}};
        PS_CHECK_OK(ps_conn_send(a, (uint16_t)(20 + k), iov, k == 0 ? 0 : 3, 1000, err, sizeof err));
        PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
        PS_CHECK_EQ_INT(type, 20 + k);
        PS_CHECK_EQ_INT(len, n);
        PS_CHECK(p != NULL && memcmp(p, data, n) == 0);
    }
    /* the other way, a single iovec */
    struct iovec one = {data, 500};
    PS_CHECK_OK(ps_conn_send(b, PS_MSG_TOKENS, &one, 1, 1000, err, sizeof err));
    PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK(type == PS_MSG_TOKENS && len == 500 && memcmp(p, data, 500) == 0);
    ps_conn_stats st;
    ps_conn_get_stats(a, &st);
    PS_CHECK_EQ_INT(st.frames, PS_ARRAY_LEN(sizes));
    PS_CHECK_EQ_INT(st.bytes, 24 * 6 + 0 + 1 + 23 + 24 + 1000 + 60000);
    PS_CHECK(st.send_ms >= 0);
    ps_conn_reset_stats(a);
    ps_conn_get_stats(a, &st);
    PS_CHECK(st.frames == 0 && st.bytes == 0 && st.send_ms == 0);

    /* a 3 MiB frame: over the default limit, then accepted once the limit is raised */
    big_send bs = {.c = a, .len = 3u << 20};
    pthread_t th;
    pthread_create(&th, NULL, big_send_main, &bs);
    ps_conn_set_max_payload(b, 4u << 20);
    PS_CHECK_OK(ps_conn_recv(b, 5000, &type, &p, &len, err, sizeof err));
    pthread_join(th, NULL);
    PS_CHECK_OK(bs.st);
    PS_CHECK(type == PS_MSG_FORWARD && len == bs.len);
    bool same = len == bs.len;
    for (uint32_t i = 0; same && i < len; i++) same = p[i] == (uint8_t)(i * 7 + 3);
    PS_CHECK(same);
    ps_conn_free(a);
    ps_conn_free(b);
}

/* "unix:PATH" addresses: frames both ways (test_round_trip_at), the accepted side named by
 * the path; a socket file nobody listens on is replaced, a live one or a file that is not a
 * socket is an error (and the file stays); bad paths are named. */
static void test_unix_sockets(void) {
    char dir[] = "/tmp/ps-test-net-XXXXXX", addr[256], other[256], err[256], want[512], bound[256];
    PS_CHECK(mkdtemp(dir) != NULL);
    snprintf(addr, sizeof addr, "unix:%s/s.sock", dir);
    test_round_trip_at(addr); /* leaves its socket file behind, nobody listening */
    int lfd = -1, lfd2 = -1;
    PS_CHECK_OK(ps_net_listen(addr, &lfd, bound, sizeof bound, err, sizeof err)); /* the stale file replaced */
    CHECK_STR(bound, addr);
    ps_conn *c = NULL, *sv = NULL;
    PS_CHECK_OK(ps_net_dial(addr, 1000, &c, err, sizeof err));
    PS_CHECK_OK(ps_net_accept(lfd, 1000, &sv, err, sizeof err));
    if (c && sv) {
        CHECK_STR(ps_conn_peer(c), addr);
        CHECK_STR(ps_conn_peer(sv), addr);
    }
    ps_conn_free(c);
    ps_conn_free(sv);
    PS_CHECK_EQ_INT(ps_net_listen(addr, &lfd2, NULL, 0, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "cannot listen on %s: another process listens there", addr);
    CHECK_STR(err, want);
    close(lfd);
    unlink(addr + 5);
    snprintf(other, sizeof other, "unix:%s/plain-file", dir);
    FILE *f = fopen(other + 5, "w");
    if (f) fclose(f);
    PS_CHECK_EQ_INT(ps_net_listen(other, &lfd2, NULL, 0, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "cannot listen on %s: file exists", other);
    CHECK_STR(err, want);
    PS_CHECK(access(other + 5, F_OK) == 0);
    unlink(other + 5);
    PS_CHECK_EQ_INT(ps_net_dial(addr, 1000, &c, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "cannot connect to %s: no such file or directory", addr);
    CHECK_STR(err, want);
    PS_CHECK_EQ_INT(ps_net_listen("unix:", &lfd2, NULL, 0, err, sizeof err), PS_ERR_ARG);
    CHECK_STR(err, "bad address \"unix:\": no socket path after unix:");
    char long_addr[200] = "unix:/tmp/";
    memset(long_addr + 10, 'x', 150);
    long_addr[160] = 0;
    PS_CHECK_EQ_INT(ps_net_dial(long_addr, 1000, &c, err, sizeof err), PS_ERR_ARG);
    CHECK_HAS(err, "a socket path holds at most 107 bytes");
    rmdir(dir);
}

/* One malformed or cut frame: the receiver's exact error. */
static void test_bad_frames(void) {
    ps_conn *a, *b;
    char err[512], want[512];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    uint8_t h[24], pay[100] = {0};

    /* bad magic */
    if (!make_pair(&a, &b)) return;
    raw_hdr(h, 0xdeadbeef, PS_NET_VERSION, 18, 0, XXH3_64bits("", 0));
    raw_send(a, h, 24);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    snprintf(want, sizeof want,
             "%s sent a frame with bad magic 0xdeadbeef (expected 0x3144534e): not a pipeshard peer?", ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);

    /* another version; its payload is skipped, so the next frame still reads */
    if (!make_pair(&a, &b)) return;
    raw_frame(a, PS_NET_VERSION + 1, 18, "0123456789", 10);
    raw_frame(a, PS_NET_VERSION, 19, "abc", 3);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "%s speaks protocol version %d; this build speaks %d", ps_conn_peer(b),
             PS_NET_VERSION + 1, PS_NET_VERSION);
    CHECK_STR(err, want);
    PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK(type == 19 && len == 3 && memcmp(p, "abc", 3) == 0);
    ps_conn_free(a);
    ps_conn_free(b);

    /* over the limit: the default 64 KiB, then a set one */
    if (!make_pair(&a, &b)) return;
    raw_hdr(h, PS_NET_MAGIC, PS_NET_VERSION, 18, 65537, 0);
    raw_send(a, h, 24);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "%s: frame of 65537 bytes exceeds the limit of 65536", ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    ps_conn_set_max_payload(b, 100);
    raw_frame(a, PS_NET_VERSION, 18, pay, 100);
    raw_hdr(h, PS_NET_MAGIC, PS_NET_VERSION, 18, 101, 0);
    raw_send(a, h, 24);
    PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "%s: frame of 101 bytes exceeds the limit of 100", ps_conn_peer(b));
    CHECK_STR(err, want);
    /* 4 GiB - 1 announced: refused before anything is allocated */
    ps_conn_free(a);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    raw_hdr(h, PS_NET_MAGIC, PS_NET_VERSION, 18, UINT32_MAX, 0);
    raw_send(a, h, 24);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    ps_conn_free(a);
    ps_conn_free(b);

    /* checksum mismatch: one payload byte flipped */
    if (!make_pair(&a, &b)) return;
    raw_hdr(h, PS_NET_MAGIC, PS_NET_VERSION, 18, 5, XXH3_64bits("hello", 5));
    raw_send(a, h, 24);
    raw_send(a, "hellp", 5);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "%s: checksum mismatch in a frame of type 18, 5 bytes (corrupted in transit)",
             ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);

    /* the peer closes: between frames, mid-header, mid-payload */
    if (!make_pair(&a, &b)) return;
    ps_conn_free(a);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "%s closed the connection", ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    raw_hdr(h, PS_NET_MAGIC, PS_NET_VERSION, 18, 100, 0);
    raw_send(a, h, 10);
    ps_conn_free(a);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "%s closed the connection in the middle of a frame header (got 10 of 24 bytes)",
             ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    raw_send(a, h, 24);
    raw_send(a, pay, 40);
    ps_conn_free(a);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_NET);
    snprintf(want, sizeof want, "%s closed the connection in the middle of a frame (got 40 of 100 payload bytes)",
             ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(b);

    /* a silent peer: timeouts before and inside a frame. Every timeout waits 100 ms; the
     * fastest of up to 3 (a stalled test only adds time) returns within the slack. */
    if (!make_pair(&a, &b)) return;
    double dt = INFINITY;
    for (int i = 0; i < 3 && !(dt < 100 + SLACK_MS); i++) {
        double t0 = now_ms();
        PS_CHECK_EQ_INT(ps_conn_recv(b, 100, &type, &p, &len, err, sizeof err), PS_ERR_TIMEOUT);
        dt = fmin(dt, now_ms() - t0);
    }
    PS_CHECK(dt >= 99 && dt < 100 + SLACK_MS);
    snprintf(want, sizeof want, "timed out after 100 ms waiting for a frame from %s", ps_conn_peer(b));
    CHECK_STR(err, want);
    raw_send(a, h, 5);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 100, &type, &p, &len, err, sizeof err), PS_ERR_TIMEOUT);
    snprintf(want, sizeof want, "timed out after 100 ms receiving a frame from %s (got 5 of 24 header bytes)",
             ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    raw_send(a, h, 24);
    raw_send(a, pay, 7);
    PS_CHECK_EQ_INT(ps_conn_recv(b, 100, &type, &p, &len, err, sizeof err), PS_ERR_TIMEOUT);
    snprintf(want, sizeof want, "timed out after 100 ms receiving a frame from %s (got 7 of 100 payload bytes)",
             ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);
}

/* Writing to a closed peer is an error naming it, never a SIGPIPE (not ignored here). */
static void test_send_to_closed_peer(void) {
    ps_conn *a, *b;
    if (!make_pair(&a, &b)) return;
    char err[256] = "";
    static uint8_t data[65536];
    struct iovec iov = {data, sizeof data};
    ps_conn_free(b);
    ps_status s = PS_OK;
    for (int i = 0; i < 100 && s == PS_OK; i++) {
        s = ps_conn_send(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err);
        if (s == PS_OK) sleep_ms(1);
    }
    PS_CHECK_EQ_INT(s, PS_ERR_NET);
    char want[256];
    snprintf(want, sizeof want, "cannot send to %s: ", ps_conn_peer(a));
    CHECK_HAS(err, want);
    ps_conn_free(a);
}

/* ---- keys ------------------------------------------------------------------------------ */

static bool write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void test_key_load(void) {
    static uint8_t data[65537];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 13 + 5);
    char path[4096], err[4200], want[4200];
    uint8_t key[32], key2[32], ref[32];
    snprintf(path, sizeof path, "%s", ps_test_tmp("test_net_key"));
    PS_CHECK(write_file(path, data, 16));
    PS_CHECK_OK(ps_net_key_load(path, key, err, sizeof err));
    PS_CHECK(sodium_init() >= 0);
    crypto_generichash(ref, 32, data, 16, NULL, 0);
    PS_CHECK(memcmp(key, ref, 32) == 0);
    PS_CHECK(write_file(path, data, 65536));
    PS_CHECK_OK(ps_net_key_load(path, key2, err, sizeof err));
    crypto_generichash(ref, 32, data, 65536, NULL, 0);
    PS_CHECK(memcmp(key2, ref, 32) == 0 && memcmp(key, key2, 32) != 0);

    PS_CHECK(write_file(path, data, 15));
    PS_CHECK_EQ_INT(ps_net_key_load(path, key, err, sizeof err), PS_ERR_ARG);
    snprintf(want, sizeof want, "key file %s is too short (15 bytes; at least 16)", path);
    CHECK_STR(err, want);
    PS_CHECK(write_file(path, data, 65537));
    PS_CHECK_EQ_INT(ps_net_key_load(path, key, err, sizeof err), PS_ERR_ARG);
    snprintf(want, sizeof want, "key file %s is too large (more than 65536 bytes)", path);
    CHECK_STR(err, want);
    unlink(path);
    PS_CHECK_EQ_INT(ps_net_key_load(path, key, err, sizeof err), PS_ERR_NOT_FOUND);
    snprintf(want, sizeof want, "cannot open key file %s: no such file or directory", path);
    CHECK_STR(err, want);
}

/* ---- handshake -------------------------------------------------------------------------- */

typedef struct {
    ps_conn *c;
    const uint8_t *key;
    ps_hello mine, peer;
    ps_hello_check_fn check;
    const char *refuse_with; /* check's reason, or NULL to accept */
    uint32_t max_payload;
    ps_status st;
    char err[512];
} hs_side;

/* A check that refuses with ctx's reason (PS_ERR_ARG) or accepts. */
static ps_status check_cb(void *ctx, const ps_hello *peer, char *err, size_t errlen) {
    const hs_side *s = ctx;
    (void)peer;
    if (!s->refuse_with) return PS_OK;
    return ps_errf(err, errlen, PS_ERR_ARG, "%s", s->refuse_with);
}

static void *hs_server_main(void *arg) {
    hs_side *s = arg;
    s->st = ps_net_handshake_server(s->c, s->key, &s->mine, s->check, s, s->max_payload, 1000, &s->peer, s->err,
                                    sizeof s->err);
    return NULL;
}

static ps_hello hello_of(uint8_t role, int stage, int begin, int end) {
    ps_hello h = {.role = role,
                  .stage = stage,
                  .stage_count = 3,
                  .layer_begin = begin,
                  .layer_end = end,
                  .n_layer = 30,
                  .session = role == PS_ROLE_COORD ? 0x1234567890abcdefull : 0};
    strcpy(h.model_fp, "0123456789abcdef0123456789ABCDEF");
    strcpy(h.shard_fp, stage == 0 ? "" : "ffffffffffffffffffffffffffffffff");
    return h;
}

/* Runs both ends of a handshake on a fresh loopback pair (server in a thread); returns the
 * client's connection or NULL (freed) when the handshake failed on either side. */
static ps_conn *run_handshake(hs_side *cl, hs_side *sv) {
    ps_conn *a, *b;
    if (!make_pair(&a, &b)) return NULL;
    cl->c = a;
    sv->c = b;
    cl->check = sv->check = check_cb;
    pthread_t th;
    pthread_create(&th, NULL, hs_server_main, sv);
    cl->st = ps_net_handshake_client(a, cl->key, &cl->mine, cl->check, cl, cl->max_payload, 1000, &cl->peer, cl->err,
                                     sizeof cl->err);
    pthread_join(th, NULL);
    if (cl->st == PS_OK && sv->st == PS_OK) return a;
    ps_conn_free(a);
    ps_conn_free(b);
    sv->c = NULL;
    return NULL;
}

static bool hello_eq(const ps_hello *x, const ps_hello *y) {
    return x->role == y->role && x->stage == y->stage && x->stage_count == y->stage_count &&
           x->layer_begin == y->layer_begin && x->layer_end == y->layer_end && x->n_layer == y->n_layer &&
           strcmp(x->model_fp, y->model_fp) == 0 && strcmp(x->shard_fp, y->shard_fp) == 0 && x->session == y->session &&
           x->flags == y->flags;
}

static void test_handshake_ok(const uint8_t *key) {
    hs_side cl = {.key = key, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10), .max_payload = 1u << 20};
    hs_side sv = {.key = key, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), .max_payload = 1u << 20};
    ps_conn *a = run_handshake(&cl, &sv);
    PS_CHECK_OK(cl.st);
    PS_CHECK_OK(sv.st);
    if (!a) {
        fprintf(stderr, "client: %s\nserver: %s\n", cl.err, sv.err);
        return;
    }
    PS_CHECK(hello_eq(&cl.peer, &sv.mine));
    PS_CHECK(hello_eq(&sv.peer, &cl.mine));
    /* the limit was raised: a 200 KB frame passes (sent by the sender thread) */
    static uint8_t data[200000];
    char err[256];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    struct iovec iov = {data, sizeof data};
    PS_CHECK_OK(ps_conn_start_sender(a, NULL, err, sizeof err));
    PS_CHECK_OK(ps_conn_send_async(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err));
    PS_CHECK_OK(ps_conn_recv(sv.c, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK(type == PS_MSG_FORWARD && len == sizeof data);
    PS_CHECK_OK(ps_conn_flush(a, 1000, err, sizeof err));
    ps_conn_free(a);
    ps_conn_free(sv.c);
}

/* Reads exactly n bytes off c's socket, as a listener on the wire would see them. */
static bool raw_recv(ps_conn *c, uint8_t *p, size_t n) {
    double end = now_ms() + 2000;
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(ps_conn_fd(c), p + got, n - got, MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EINTR) || now_ms() > end)
            return false;
        else
            usleep(1000);
    }
    return true;
}

/* With a shared key the frames after the handshake are sealed: the wire carries no
 * plaintext, both directions (sync, and through the sender thread) deliver the payload, and
 * a frame replayed, altered in its payload or in its header, or sent in the clear fails to
 * open with PS_ERR_AUTH, checksum fixed or not. Each case on a fresh connection, because a
 * frame is opened under the number the receiver expects next. */
static void test_sealed_frames(void) {
    uint8_t key[32];
    memset(key, 0x33, sizeof key);
    static const char *what[] = {"a replayed frame", "a payload byte flipped", "the header's type changed",
                                 "a frame in the clear"};
    for (int round = 0; round < 4; round++) {
        hs_side cl = {.key = key, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10), .max_payload = 1u << 20};
        hs_side sv = {.key = key, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), .max_payload = 1u << 20};
        ps_conn *a = run_handshake(&cl, &sv), *b = sv.c;
        PS_CHECK(a != NULL);
        if (!a) return;
        char err[512];
        uint16_t type;
        const uint8_t *p;
        uint32_t len;
        uint8_t msg[1000], wire[PS_NET_HDR_BYTES + sizeof msg + 16];
        memset(msg, 'x', sizeof msg);
        struct iovec iov = {msg, sizeof msg};
        PS_CHECK_OK(ps_conn_send(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err));
        PS_CHECK(raw_recv(b, wire, sizeof wire)); /* frame 0 as it crossed the wire */
        ps_frame_hdr h;
        ps_frame_hdr_decode(wire, &h);
        PS_CHECK(h.len == sizeof msg + 16 && h.checksum == XXH3_64bits(wire + PS_NET_HDR_BYTES, h.len));
        PS_CHECK(memmem(wire + PS_NET_HDR_BYTES, h.len, "xxxxxxxx", 8) == NULL);
        if (round == 0) { /* delivered once (the copy is frame 0 to b), then refused as a replay */
            raw_send(a, wire, sizeof wire);
            PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
            PS_CHECK(type == PS_MSG_FORWARD && len == sizeof msg && memcmp(p, msg, sizeof msg) == 0);
            PS_CHECK_OK(ps_conn_start_sender(b, NULL, err, sizeof err)); /* the other way, queued */
            for (int i = 0; i < 3; i++) {
                msg[0] = (uint8_t)i;
                PS_CHECK_OK(ps_conn_send_async(b, PS_MSG_TOKENS, &iov, 1, 1000, err, sizeof err));
            }
            for (int i = 0; i < 3; i++) {
                PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
                PS_CHECK(type == PS_MSG_TOKENS && len == sizeof msg && p[0] == i && p[1] == 'x');
            }
        } else if (round == 1) {
            wire[PS_NET_HDR_BYTES + 10] ^= 1;
            put_le(wire + 16, XXH3_64bits(wire + PS_NET_HDR_BYTES, h.len), 8);
        } else if (round == 2) {
            put_le(wire + 6, PS_MSG_TOKENS, 2);
        }
        if (round < 3)
            raw_send(a, wire, sizeof wire);
        else
            raw_frame(a, PS_NET_VERSION, PS_MSG_FORWARD, msg, sizeof msg);
        PS_CHECK_EQ_INT(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err), PS_ERR_AUTH);
        CHECK_HAS(err, "fails authentication");
        if (!strstr(err, "fails authentication")) fprintf(stderr, "%s: %s\n", what[round], err);
        ps_conn_free(a);
        ps_conn_free(b);
    }
}

/* With a key, frames go in the clear only when both ends ask (ps_hello.plain): the wire
 * then carries the payload as it is; when one end asks alone, sealed. */
static void test_plain_frames(void) {
    uint8_t key[32];
    memset(key, 0x55, sizeof key);
    for (int both = 0; both < 2; both++) {
        hs_side cl = {.key = key, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10), .max_payload = 1u << 20};
        hs_side sv = {.key = key, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), .max_payload = 1u << 20};
        cl.mine.plain = true;
        sv.mine.plain = both;
        ps_conn *a = run_handshake(&cl, &sv), *b = sv.c;
        PS_CHECK(a != NULL);
        if (!a) return;
        PS_CHECK(ps_conn_sealed(a) == !both && ps_conn_sealed(b) == !both);
        char err[256];
        uint8_t msg[100], wire[PS_NET_HDR_BYTES + sizeof msg + 16];
        memset(msg, 'y', sizeof msg);
        struct iovec iov = {msg, sizeof msg};
        PS_CHECK_OK(ps_conn_send(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err));
        size_t n = PS_NET_HDR_BYTES + sizeof msg + (both ? 0 : 16);
        PS_CHECK(raw_recv(b, wire, n));
        PS_CHECK((memcmp(wire + PS_NET_HDR_BYTES, msg, sizeof msg) == 0) == both);
        ps_conn_free(a);
        ps_conn_free(b);
    }
}

/* A man in the middle of a handshake with a key: forwards HELLO, HELLO_REPLY (its stage
 * field rewritten when bend is set, the checksum fixed), the client's answer, and WELCOME
 * when there is one. */
typedef struct {
    ps_conn *to_client, *to_server; /* the proxy's ends */
    bool bend;
} mitm;

static bool forward_frame(ps_conn *from, ps_conn *to, bool bend) {
    uint8_t hdr[PS_NET_HDR_BYTES], body[4096];
    ps_frame_hdr h;
    if (!raw_recv(from, hdr, sizeof hdr)) return false;
    ps_frame_hdr_decode(hdr, &h);
    if (h.len > sizeof body || !raw_recv(from, body, h.len)) return false;
    if (bend) { /* the hello's i32 stage follows its u8 role */
        body[1] ^= 1;
        put_le(hdr + 16, XXH3_64bits(body, h.len), 8);
    }
    raw_send(to, hdr, sizeof hdr);
    raw_send(to, body, h.len);
    return true;
}

static void *mitm_main(void *arg) {
    mitm *m = arg;
    if (forward_frame(m->to_client, m->to_server, false) && forward_frame(m->to_server, m->to_client, m->bend) &&
        forward_frame(m->to_client, m->to_server, false))
        forward_frame(m->to_server, m->to_client, false);
    return NULL;
}

/* The proofs cover the hellos: a HELLO_REPLY rewritten on the way by someone without the key
 * (here, another stage claimed, checksum fixed) fails the client's check of the server's
 * proof; the same proxy forwarding faithfully lets the handshake through. */
static void test_handshake_transcript(void) {
    uint8_t key[32];
    memset(key, 0x44, sizeof key);
    for (int bend = 0; bend < 2; bend++) {
        ps_conn *a, *p1, *p2, *b;
        if (!make_pair(&a, &p1)) return;
        if (!make_pair(&p2, &b)) return;
        hs_side cl = {.key = key, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10), .c = a, .check = check_cb};
        hs_side sv = {.key = key, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), .c = b, .check = check_cb};
        mitm m = {.to_client = p1, .to_server = p2, .bend = bend};
        pthread_t ts, tm;
        pthread_create(&ts, NULL, hs_server_main, &sv);
        pthread_create(&tm, NULL, mitm_main, &m);
        cl.st = ps_net_handshake_client(a, key, &cl.mine, check_cb, &cl, 0, 1000, &cl.peer, cl.err, sizeof cl.err);
        pthread_join(tm, NULL);
        shutdown(ps_conn_fd(p2), SHUT_RDWR); /* the server, if still waiting, sees the end */
        pthread_join(ts, NULL);
        if (!bend) {
            PS_CHECK_OK(cl.st);
            PS_CHECK_OK(sv.st);
            PS_CHECK(cl.peer.stage == 1);
        } else {
            PS_CHECK_EQ_INT(cl.st, PS_ERR_AUTH);
            CHECK_HAS(cl.err, "the peer's proof does not match our key");
            PS_CHECK(sv.st != PS_OK);
        }
        ps_conn_free(a), ps_conn_free(p1), ps_conn_free(p2), ps_conn_free(b);
    }
}

/* Both sides fail with the given statuses; each message contains its want. */
static void check_refused(hs_side *cl, hs_side *sv, ps_status cl_st, ps_status sv_st, const char *reason) {
    PS_CHECK(run_handshake(cl, sv) == NULL);
    PS_CHECK_EQ_INT(cl->st, cl_st);
    PS_CHECK_EQ_INT(sv->st, sv_st);
    CHECK_HAS(cl->err, reason);
    CHECK_HAS(sv->err, reason);
    CHECK_HAS(cl->err, "refused");
    CHECK_HAS(sv->err, "refused");
}

static void test_handshake_refusals(void) {
    uint8_t k1[32], k2[32];
    memset(k1, 1, 32);
    memset(k2, 2, 32);
    hs_side cl, sv;
#define RESET(ck, sk)                                                                                                  \
    cl = (hs_side){.key = ck, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10)};                                              \
    sv = (hs_side){.key = sk, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20)}

    RESET(k1, k2);
    check_refused(&cl, &sv, PS_ERR_AUTH, PS_ERR_AUTH, "wrong shared key");
    RESET(NULL, k1);
    check_refused(&cl, &sv, PS_ERR_AUTH, PS_ERR_AUTH, "this worker requires a shared key (--key-file)");
    RESET(k1, NULL);
    check_refused(&cl, &sv, PS_ERR_AUTH, PS_ERR_AUTH, "the peer has a shared key but we have none");
    /* the application's check: on the server (after the proofs), then on the client */
    RESET(k1, k1);
    sv.refuse_with = "stage 2 expects layers from 16, stage 1 ends at 14";
    check_refused(&cl, &sv, PS_ERR_PROTOCOL, PS_ERR_ARG, "stage 2 expects layers from 16, stage 1 ends at 14");
    RESET(NULL, NULL);
    cl.refuse_with = "model fingerprint 0123 differs from ours";
    check_refused(&cl, &sv, PS_ERR_ARG, PS_ERR_PROTOCOL, "model fingerprint 0123 differs from ours");
    /* our own hello is checked before anything is sent */
    RESET(NULL, NULL);
    cl.mine.layer_end = 31;
    ps_conn *a, *b;
    if (!make_pair(&a, &b)) return;
    PS_CHECK_EQ_INT(ps_net_handshake_client(a, NULL, &cl.mine, NULL, NULL, 0, 100, NULL, cl.err, sizeof cl.err),
                    PS_ERR_ARG);
    CHECK_STR(cl.err, "our own hello is invalid: layer range [0, 31) does not fit a model of 30 layers");
    /* flags: none but PS_HELLO_TAKES_SHARDS, and that one only from a worker */
    cl.mine.layer_end = 10;
    cl.mine.flags = 2;
    PS_CHECK_EQ_INT(ps_net_handshake_client(a, NULL, &cl.mine, NULL, NULL, 0, 100, NULL, cl.err, sizeof cl.err),
                    PS_ERR_ARG);
    CHECK_STR(cl.err, "our own hello is invalid: unknown flags 0x2");
    cl.mine.flags = PS_HELLO_TAKES_SHARDS;
    PS_CHECK_EQ_INT(ps_net_handshake_client(a, NULL, &cl.mine, NULL, NULL, 0, 100, NULL, cl.err, sizeof cl.err),
                    PS_ERR_ARG);
    CHECK_STR(cl.err, "our own hello is invalid: only a worker takes shards");
    ps_conn_free(a);
    ps_conn_free(b);
#undef RESET
}

/* A worker started with --cache and no shard yet: stage 0 of 1 over no layers, empty
 * fingerprints, PS_HELLO_TAKES_SHARDS; the coordinator sees all of it. */
static void test_handshake_takes_shards(void) {
    uint8_t key[32];
    memset(key, 7, sizeof key);
    hs_side cl = {.key = key, .mine = hello_of(PS_ROLE_COORD, 0, 0, 10)};
    hs_side sv = {.key = key, .mine = {.role = PS_ROLE_WORKER, .stage_count = 1, .flags = PS_HELLO_TAKES_SHARDS}};
    ps_conn *a = run_handshake(&cl, &sv);
    PS_CHECK_OK(cl.st);
    PS_CHECK_OK(sv.st);
    PS_CHECK(hello_eq(&cl.peer, &sv.mine));
    PS_CHECK_EQ_INT(cl.peer.flags, PS_HELLO_TAKES_SHARDS);
    PS_CHECK(cl.peer.n_layer == 0 && cl.peer.layer_end == 0 && !cl.peer.model_fp[0] && !cl.peer.shard_fp[0]);
    PS_CHECK_EQ_INT(sv.peer.flags, 0);
    ps_conn_free(a);
    ps_conn_free(sv.c);
}

/* The exact lines of a refusal on both sides, for one case. */
static void test_handshake_messages(void) {
    hs_side cl = {.mine = hello_of(PS_ROLE_COORD, 0, 0, 10)};
    hs_side sv = {.mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), .refuse_with = "no room for session 7"};
    PS_CHECK(run_handshake(&cl, &sv) == NULL);
    char want[600];
    /* the client's peer is the server's address and vice versa; rebuild both from the lines */
    const char *sp = strstr(cl.err, " refused: ");
    PS_CHECK(sp != NULL);
    if (sp) {
        snprintf(want, sizeof want, "%.*s refused: no room for session 7", (int)(sp - cl.err), cl.err);
        CHECK_STR(cl.err, want);
    }
    PS_CHECK(strncmp(sv.err, "refused ", 8) == 0);
    CHECK_HAS(sv.err, ": no room for session 7");
}

/* A peer that sends a hand-made HELLO of protocol version 0, and one that answers with
 * the version after ours; a HELLO with invalid fields; a silent client. */
static void test_handshake_stale_and_malformed(void) {
    ps_conn *a, *b;
    char err[512], want[512];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    ps_hello mine = hello_of(PS_ROLE_WORKER, 1, 10, 20), peer;

    if (!make_pair(&a, &b)) return;
    raw_frame(a, 0, PS_MSG_HELLO, "an old hello", 12);
    PS_CHECK_EQ_INT(ps_net_handshake_server(b, NULL, &mine, NULL, NULL, 0, 1000, &peer, err, sizeof err),
                    PS_ERR_PROTOCOL);
    CHECK_HAS(err, "protocol version 0 is not supported; this worker speaks " PS_STR(PS_NET_VERSION));
    PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK_EQ_INT(type, PS_MSG_REFUSE);
    const char *reason = "protocol version 0 is not supported; this worker speaks " PS_STR(PS_NET_VERSION);
    PS_CHECK(len == strlen(reason) && memcmp(p, reason, len) == 0);
    ps_conn_free(a);
    ps_conn_free(b);

    /* the client meets a server of the next version */
    if (!make_pair(&a, &b)) return;
    raw_frame(b, PS_NET_VERSION + 1, PS_MSG_HELLO_REPLY, "new", 3);
    ps_hello cm = hello_of(PS_ROLE_COORD, 0, 0, 10);
    PS_CHECK_EQ_INT(ps_net_handshake_client(a, NULL, &cm, NULL, NULL, 0, 1000, &peer, err, sizeof err),
                    PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "%s speaks protocol version %d; this build speaks %d", ps_conn_peer(a),
             PS_NET_VERSION + 1, PS_NET_VERSION);
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);

    /* well-framed HELLOs with bad fields */
    static const struct {
        uint8_t role;
        int32_t stage, count, begin, end, n_layer;
        const char *fp;
        uint32_t flags;
        const char *why;
    } bad[] = {
        {9, 0, 1, 0, 1, 1, "", 0, "malformed HELLO: unknown role 9"},
        {1, 3, 3, 0, 1, 1, "", 0, "malformed HELLO: stage 3 of 3 is out of range"},
        {1, 0, 1, 5, 4, 10, "", 0, "malformed HELLO: layer range [5, 4) does not fit a model of 10 layers"},
        {1, 0, 1, 0, 1, 1, "0123", 0, "malformed HELLO: model fingerprint is not 32 hex digits"},
        {1, 0, 1, 0, 1, 1, "0123456789abcdef0123456789abcdeg", 0,
         "malformed HELLO: model fingerprint is not 32 hex digits"},
        {3, 0, 1, 0, 0, 0, "", 0x80000001u, "malformed HELLO: unknown flags 0x80000000"},
        {1, 0, 1, 0, 1, 1, "", PS_HELLO_TAKES_SHARDS, "malformed HELLO: only a worker takes shards"},
        {2, 0, 1, 0, 1, 1, "", PS_HELLO_TAKES_SHARDS, "malformed HELLO: only a worker takes shards"},
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(bad); i++) {
        if (!make_pair(&a, &b)) return;
        ps_wbuf w = {0};
        ps_wbuf_u8(&w, bad[i].role);
        ps_wbuf_i32(&w, bad[i].stage);
        ps_wbuf_i32(&w, bad[i].count);
        ps_wbuf_i32(&w, bad[i].begin);
        ps_wbuf_i32(&w, bad[i].end);
        ps_wbuf_i32(&w, bad[i].n_layer);
        ps_wbuf_str(&w, bad[i].fp);
        ps_wbuf_str(&w, "");
        ps_wbuf_u64(&w, 0);
        ps_wbuf_u32(&w, bad[i].flags);
        uint8_t nonce[32] = {0};
        ps_wbuf_bytes(&w, nonce, 32);
        ps_wbuf_u8(&w, 0);
        struct iovec iov = {w.p, w.len};
        PS_CHECK_OK(ps_conn_send(a, PS_MSG_HELLO, &iov, 1, 1000, err, sizeof err));
        PS_CHECK_EQ_INT(ps_net_handshake_server(b, NULL, &mine, NULL, NULL, 0, 1000, &peer, err, sizeof err),
                        PS_ERR_PROTOCOL);
        snprintf(want, sizeof want, "refused %s: %s", ps_conn_peer(b), bad[i].why);
        CHECK_STR(err, want);
        PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
        PS_CHECK(type == PS_MSG_REFUSE && len == strlen(bad[i].why) && memcmp(p, bad[i].why, len) == 0);
        ps_wbuf_free(&w);
        ps_conn_free(a);
        ps_conn_free(b);
    }

    /* a valid HELLO cut at every byte, and one with a trailing byte */
    ps_wbuf w = {0};
    ps_hello cm2 = hello_of(PS_ROLE_COORD, 0, 0, 10);
    ps_wbuf_u8(&w, cm2.role);
    ps_wbuf_i32(&w, cm2.stage);
    ps_wbuf_i32(&w, cm2.stage_count);
    ps_wbuf_i32(&w, cm2.layer_begin);
    ps_wbuf_i32(&w, cm2.layer_end);
    ps_wbuf_i32(&w, cm2.n_layer);
    ps_wbuf_str(&w, cm2.model_fp);
    ps_wbuf_str(&w, cm2.shard_fp);
    ps_wbuf_u64(&w, cm2.session);
    uint8_t nonce[32] = {7};
    ps_wbuf_bytes(&w, nonce, 32);
    ps_wbuf_u8(&w, 0);
    ps_wbuf_u8(&w, 0); /* the trailing byte */
    int refused = 0;
    for (size_t cut = 0; cut <= w.len; cut++) {
        if (cut == w.len - 1) continue; /* the valid length */
        if (!make_pair(&a, &b)) break;
        struct iovec iov = {w.p, cut};
        PS_CHECK_OK(ps_conn_send(a, PS_MSG_HELLO, &iov, 1, 1000, err, sizeof err));
        ps_status s = ps_net_handshake_server(b, NULL, &mine, NULL, NULL, 0, 1000, &peer, err, sizeof err);
        snprintf(want, sizeof want, "refused %s: malformed HELLO (%zu bytes)", ps_conn_peer(b), cut);
        refused += s == PS_ERR_PROTOCOL && strcmp(err, want) == 0;
        ps_conn_free(a);
        ps_conn_free(b);
    }
    PS_CHECK_EQ_INT(refused, w.len);
    ps_wbuf_free(&w);

    /* a message of the wrong type first, then a silent client */
    if (!make_pair(&a, &b)) return;
    PS_CHECK_OK(ps_conn_send(a, PS_MSG_FORWARD, NULL, 0, 1000, err, sizeof err));
    PS_CHECK_EQ_INT(ps_net_handshake_server(b, NULL, &mine, NULL, NULL, 0, 1000, &peer, err, sizeof err),
                    PS_ERR_PROTOCOL);
    snprintf(want, sizeof want, "refused %s: expected HELLO, got message type 18", ps_conn_peer(b));
    CHECK_STR(err, want);
    ps_conn_free(a);
    ps_conn_free(b);
    if (!make_pair(&a, &b)) return;
    PS_CHECK_EQ_INT(ps_net_handshake_server(b, NULL, &mine, NULL, NULL, 0, 100, &peer, err, sizeof err),
                    PS_ERR_TIMEOUT);
    ps_conn_free(a);
    ps_conn_free(b);
}

/* ---- link emulation ------------------------------------------------------------------- */

/* When a frame of n payload bytes is due through sim (NULL: no emulation), in ms after queueing. */
static double due_ms(const ps_link_sim *sim, uint32_t n) {
    if (!sim) return 0;
    return sim->latency_ms + (sim->bandwidth_mbps > 0 ? (24.0 + n) * 8 / (sim->bandwidth_mbps * 1e3) : 0);
}

/* One frame through an emulated link: the time from queueing to its arrival; *queue_ms gets
 * the time send_async took to return. */
static double one_hop_ms(const ps_link_sim *sim, uint32_t n, double *queue_ms) {
    ps_conn *a, *b;
    *queue_ms = -1;
    if (!make_pair(&a, &b)) return -1;
    char err[256];
    uint8_t *data = calloc(1, n ? n : 1);
    struct iovec iov = {data, n};
    uint16_t type;
    const uint8_t *p;
    uint32_t len = 0;
    ps_conn_set_max_payload(b, n + 1);
    PS_CHECK_OK(ps_conn_start_sender(a, sim, err, sizeof err));
    double t0 = now_ms();
    PS_CHECK_OK(ps_conn_send_async(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err));
    *queue_ms = now_ms() - t0;
    PS_CHECK_OK(ps_conn_recv(b, 2000, &type, &p, &len, err, sizeof err));
    double dt = now_ms() - t0;
    PS_CHECK_EQ_INT(len, n);
    PS_CHECK_OK(ps_conn_flush(a, 1000, err, sizeof err));
    double flushed = now_ms() - t0;
    ps_conn_stats st;
    ps_conn_get_stats(a, &st);
    PS_CHECK_EQ_INT(st.frames, 1);
    PS_CHECK_EQ_INT(st.bytes, 24 + (uint64_t)n);
    /* The sender stamps its frame after its write returns, which may be after the receiver
     * already has it (a descheduled thread): bound it by the schedule and by the flush. */
    PS_CHECK(st.send_ms >= due_ms(sim, n) - 0.01 && st.send_ms <= flushed);
    free(data);
    ps_conn_free(a);
    ps_conn_free(b);
    return dt;
}

/* Up to 3 hops of a frame of n bytes through sim, each checked by one_hop_ms, until one
 * comes within the bounds: every hop takes at least sched_ms, and the fastest at most
 * SLACK_MS more; queueing returns at once, before the frame is due (a send_async that
 * waited out the emulated delay would not). A stalled test only adds time to a run, while
 * a scheduling bug slows every run, so the upper bounds apply to the fastest. */
static void timed_hop(const char *what, const ps_link_sim *sim, uint32_t n, double sched_ms) {
    double due = due_ms(sim, n), queue_max = due > 0 ? due : 500;
    double hop = INFINITY, queue = INFINITY;
    int runs = 0;
    while (runs < 3 && !(hop < sched_ms + SLACK_MS && queue < queue_max)) {
        double q, h = one_hop_ms(sim, n, &q);
        hop = fmin(hop, h);
        queue = fmin(queue, q);
        runs++;
    }
    printf("%s took %.1f ms (fastest of %d), queueing %.2f ms\n", what, hop, runs, queue);
    PS_CHECK(hop >= sched_ms && hop < sched_ms + SLACK_MS);
    PS_CHECK(queue >= 0 && queue < queue_max);
}

static void test_link_timing(void) {
    timed_hop("latency 30 ms: one hop", &(ps_link_sim){.latency_ms = 30}, 100, 30);
    /* 100,000 bytes + 24 at 8 Mbit/s: 100.024 ms */
    timed_hop("8 Mbit/s: a 100 KB frame", &(ps_link_sim){.bandwidth_mbps = 8}, 100000, 100);
    timed_hop("20 ms + 80 Mbit/s: a 100 KB frame", &(ps_link_sim){.latency_ms = 20, .bandwidth_mbps = 80}, 100000, 30);
    timed_hop("no emulation: a 100 KB frame", NULL, 100000, 0);

    char err[256];
    ps_conn *a, *b;
    if (!make_pair(&a, &b)) return;
    PS_CHECK_EQ_INT(ps_conn_start_sender(a, &(ps_link_sim){.latency_ms = -1}, err, sizeof err), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_conn_start_sender(a, &(ps_link_sim){.bandwidth_mbps = 1.0 / 0.0}, err, sizeof err), PS_ERR_ARG);
    PS_CHECK_OK(ps_conn_start_sender(a, NULL, err, sizeof err));
    PS_CHECK_EQ_INT(ps_conn_start_sender(a, NULL, err, sizeof err), PS_ERR_ARG);
    ps_conn_free(a);
    ps_conn_free(b);
}

/* 40 frames of 10 KB at 100 Mbit/s after 5 ms: in order, the last one due at
 * 5 + 40 * 10024 * 8 / 1e8 s = 37.1 ms, and sync sends keep their place in the queue.
 * Returns the time until the 40th frame arrived. */
static double link_order_ms(void) {
    ps_conn *a, *b;
    if (!make_pair(&a, &b)) return -1;
    char err[256];
    static uint8_t data[10000];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    PS_CHECK_OK(ps_conn_start_sender(a, &(ps_link_sim){.latency_ms = 5, .bandwidth_mbps = 100}, err, sizeof err));
    double t0 = now_ms();
    for (uint32_t i = 0; i < 40; i++) {
        memcpy(data, &i, 4);
        struct iovec iov[2] = {{data, 4}, {data + 4, sizeof data - 4}};
        PS_CHECK_OK(ps_conn_send_async(a, PS_MSG_FORWARD, iov, 2, 1000, err, sizeof err));
    }
    struct iovec last = {"sync", 4};
    PS_CHECK_OK(ps_conn_send(a, PS_MSG_TOKENS, &last, 1, 1000, err, sizeof err)); /* waits for its turn */
    bool in_order = true;
    for (uint32_t i = 0; i < 40; i++) {
        PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
        uint32_t seq = ~0u;
        if (len == sizeof data) memcpy(&seq, p, 4);
        in_order &= type == PS_MSG_FORWARD && seq == i;
    }
    double dt = now_ms() - t0;
    PS_CHECK(in_order);
    PS_CHECK_OK(ps_conn_recv(b, 1000, &type, &p, &len, err, sizeof err));
    PS_CHECK(type == PS_MSG_TOKENS && len == 4 && memcmp(p, "sync", 4) == 0);
    ps_conn_stats st;
    ps_conn_get_stats(a, &st);
    PS_CHECK_EQ_INT(st.frames, 41);
    PS_CHECK_EQ_INT(st.bytes, 41 * 24 + 40 * sizeof data + 4);
    PS_CHECK(st.send_ms >= 40 * 5);
    ps_conn_free(a);
    ps_conn_free(b);
    return dt;
}

/* Every run keeps the schedule; the fastest of up to 3 (see timed_hop) is within the slack. */
static void test_link_order(void) {
    double dt = INFINITY;
    int runs = 0;
    while (runs < 3 && !(dt < 37 + SLACK_MS)) {
        dt = fmin(dt, link_order_ms());
        runs++;
    }
    printf("40 frames of 10 KB, 5 ms + 100 Mbit/s: %.1f ms (schedule 37.1 ms, fastest of %d)\n", dt, runs);
    PS_CHECK(dt >= 37 && dt < 37 + SLACK_MS);
}

/* ps_conn_free while the thread sleeps out a long delay, or waits on a peer that does
 * not read; backpressure at 64 MiB; flush timeouts; a write error on the next call. */
static void test_link_stop_and_errors(void) {
    ps_conn *a, *b;
    char err[256], want[256];
    static uint8_t small[100];
    struct iovec iov = {small, sizeof small};

    if (!make_pair(&a, &b)) return;
    PS_CHECK_OK(ps_conn_start_sender(a, &(ps_link_sim){.latency_ms = 10000}, err, sizeof err));
    PS_CHECK_OK(ps_conn_send_async(a, PS_MSG_FORWARD, &iov, 1, 1000, err, sizeof err));
    double t0 = now_ms();
    PS_CHECK_EQ_INT(ps_conn_flush(a, 50, err, sizeof err), PS_ERR_TIMEOUT);
    PS_CHECK(now_ms() - t0 >= 49);
    snprintf(want, sizeof want, "timed out after 50 ms flushing to %s (1 frames queued)", ps_conn_peer(a));
    CHECK_STR(err, want);
    t0 = now_ms();
    ps_conn_free(a);
    double dt = now_ms() - t0;
    printf("free while sleeping out a 10 s delay: %.1f ms\n", dt);
    PS_CHECK(dt < 2000); /* not the 10 s */
    ps_conn_free(b);

    /* a peer that never reads: the queue fills to 64 MiB, then send_async times out. Small
     * socket buffers (the kernel doubles 1 MiB) hold far less than a frame, so the first
     * frame never leaves the queue, whatever the system's defaults. */
    if (!make_pair(&a, &b)) return;
    int mib = 1 << 20;
    PS_CHECK(setsockopt(ps_conn_fd(a), SOL_SOCKET, SO_SNDBUF, &mib, sizeof mib) == 0 &&
             setsockopt(ps_conn_fd(b), SOL_SOCKET, SO_RCVBUF, &mib, sizeof mib) == 0);
    enum { BIG = 8 << 20 };
    uint8_t *big = calloc(1, BIG);
    struct iovec biov = {big, BIG};
    PS_CHECK_OK(ps_conn_start_sender(a, NULL, err, sizeof err));
    ps_status s = PS_OK;
    int queued = 0;
    while (s == PS_OK && queued < 20) {
        s = ps_conn_send_async(a, PS_MSG_FORWARD, &biov, 1, 50, err, sizeof err);
        if (s == PS_OK) queued++;
    }
    printf("queued %d frames of 8 MiB before the 64 MiB limit held\n", queued);
    PS_CHECK_EQ_INT(s, PS_ERR_TIMEOUT);
    PS_CHECK(queued == 7); /* 7 x (8 MiB + 24) fit under 64 MiB, an 8th does not */
    CHECK_HAS(err, "waiting for room in the send queue to");
    t0 = now_ms();
    ps_conn_free(a); /* the thread is blocked writing */
    dt = now_ms() - t0;
    printf("free while blocked on a stalled peer: %.1f ms\n", dt);
    PS_CHECK(dt < 2000); /* not forever */
    ps_conn_free(b);
    free(big);

    /* the same peer, tiny frames: at most 4096 wait in the queue (beyond what the sockets'
     * buffers took), however little room they need */
    if (!make_pair(&a, &b)) return;
    PS_CHECK_OK(ps_conn_start_sender(a, NULL, err, sizeof err));
    s = PS_OK;
    for (int i = 0; i < 1000000 && s == PS_OK; i++)
        s = ps_conn_send_async(a, PS_MSG_FORWARD, &iov, 1, 50, err, sizeof err);
    PS_CHECK_EQ_INT(s, PS_ERR_TIMEOUT);
    CHECK_HAS(err, "(4096 frames queued)");
    ps_conn_free(a);
    ps_conn_free(b);

    /* the peer goes away: a later call reports the thread's write error, naming the peer */
    if (!make_pair(&a, &b)) return;
    PS_CHECK_OK(ps_conn_start_sender(a, NULL, err, sizeof err));
    ps_conn_free(b);
    s = PS_OK;
    static uint8_t mid[65536];
    struct iovec miov = {mid, sizeof mid};
    for (int i = 0; i < 200 && s == PS_OK; i++) {
        s = ps_conn_send_async(a, PS_MSG_FORWARD, &miov, 1, 1000, err, sizeof err);
        if (s == PS_OK) s = ps_conn_flush(a, 1000, err, sizeof err);
    }
    PS_CHECK_EQ_INT(s, PS_ERR_NET);
    snprintf(want, sizeof want, "cannot send to %s: ", ps_conn_peer(a));
    CHECK_HAS(err, want);
    char err2[256];
    PS_CHECK_EQ_INT(ps_conn_flush(a, 1000, err2, sizeof err2), PS_ERR_NET); /* sticky */
    CHECK_STR(err2, err);
    ps_conn_free(a);
}

/* ---- link probes ------------------------------------------------------------------------ */

/* A link probe's hello holds no stage: a worker sees role 4; one that claims a stage (or a
 * fingerprint, or a session) is refused. */
static void test_handshake_probe(void) {
    uint8_t key[32];
    memset(key, 9, sizeof key);
    hs_side cl = {.key = key, .mine = {.role = PS_ROLE_PROBE, .stage_count = 1}};
    hs_side sv = {.key = key, .mine = hello_of(PS_ROLE_WORKER, 1, 10, 20)};
    ps_conn *a = run_handshake(&cl, &sv);
    PS_CHECK_OK(cl.st);
    PS_CHECK_OK(sv.st);
    PS_CHECK_EQ_INT(sv.peer.role, PS_ROLE_PROBE);
    PS_CHECK(hello_eq(&cl.peer, &sv.mine));
    ps_conn_free(a);
    ps_conn_free(sv.c);
    const char *why = "a link probe claims no stage, layers, fingerprints or session";
    ps_hello bad[4];
    for (int i = 0; i < 4; i++) bad[i] = cl.mine;
    bad[0].stage_count = 3, bad[1].n_layer = 30, bad[2].session = 5;
    strcpy(bad[3].model_fp, "0123456789abcdef0123456789ABCDEF");
    for (int i = 0; i < 4; i++) {
        ps_conn *b;
        if (!make_pair(&a, &b)) return;
        char err[512];
        PS_CHECK_EQ_INT(ps_net_handshake_client(a, NULL, &bad[i], NULL, NULL, 0, 100, NULL, err, sizeof err),
                        PS_ERR_ARG);
        CHECK_HAS(err, why);
        ps_conn_free(a);
        ps_conn_free(b);
    }
}

static void test_host_info_codec(void) {
    ps_host_info hi = {.host = "gpu-box",
                       .mem_available = 123456789012ull,
                       .threads = 16,
                       .device = "cuda:0 (X)",
                       .ms_per_gb = 37.5f},
                 got;
    ps_wbuf b = {0};
    char err[256];
    ps_host_info_encode(&b, &hi);
    PS_CHECK_OK(ps_host_info_decode(b.p, b.len, &got, err, sizeof err));
    PS_CHECK(!strcmp(got.host, hi.host) && got.mem_available == hi.mem_available && got.threads == 16 &&
             !strcmp(got.device, hi.device) && got.ms_per_gb == 37.5f);
    const float bad_speed[] = {-1.0f, NAN, INFINITY};
    for (size_t i = 0; i < PS_ARRAY_LEN(bad_speed); i++) {
        ps_host_info odd = hi;
        odd.ms_per_gb = bad_speed[i];
        ps_host_info_encode(&b, &odd);
        PS_CHECK_EQ_INT(ps_host_info_decode(b.p, b.len, &got, err, sizeof err), PS_ERR_PROTOCOL);
        CHECK_HAS(err, "ms per GB");
    }
    ps_host_info_encode(&b, &hi);
    for (size_t cut = 0; cut < b.len; cut++)
        PS_CHECK_EQ_INT(ps_host_info_decode(b.p, cut, &got, err, sizeof err), PS_ERR_PROTOCOL);
    CHECK_HAS(err, "malformed HOST_INFO");
    ps_wbuf_u8(&b, 0); /* a trailing byte */
    PS_CHECK_EQ_INT(ps_host_info_decode(b.p, b.len, &got, err, sizeof err), PS_ERR_PROTOCOL);
    const char *odd[] = {"a\"b", "a\\b", "a\nb", "caf\xc3\xa9"};
    for (size_t i = 0; i < PS_ARRAY_LEN(odd); i++) {
        snprintf(hi.host, sizeof hi.host, "%s", odd[i]);
        ps_host_info_encode(&b, &hi);
        PS_CHECK_EQ_INT(ps_host_info_decode(b.p, b.len, &got, err, sizeof err), PS_ERR_PROTOCOL);
        CHECK_HAS(err, "not plain printable ASCII");
        ps_host_text_plain(hi.host); /* what a worker sends instead: each odd byte a '?' */
        ps_host_info_encode(&b, &hi);
        PS_CHECK_OK(ps_host_info_decode(b.p, b.len, &got, err, sizeof err));
        PS_CHECK(strlen(got.host) == strlen(odd[i]) && got.host[0] == odd[i][0] && strchr(got.host, '?'));
    }
    ps_wbuf_free(&b);
}

/* The worker's side of a link probe on a thread: sv's connection, limits lim. */
typedef struct {
    ps_conn *c;
    ps_echo_limits lim;
    ps_link_sim sim;
    ps_echo_stats st;
    ps_status s;
    char err[512];
} echo_side;

static void *echo_main(void *arg) {
    echo_side *e = arg;
    ps_host_info hi = {.host = "far", .mem_available = 1 << 30, .threads = 2, .device = "cpu"};
    e->s = ps_net_echo_serve(e->c, &hi, &e->sim, &e->lim, &e->st, e->err, sizeof e->err);
    return NULL;
}

/* A pair past a probe's handshake, its worker side answering on a thread (joined by the caller). */
static bool echo_pair(ps_conn **a, echo_side *e, pthread_t *th) {
    hs_side cl = {.mine = {.role = PS_ROLE_PROBE, .stage_count = 1}, .max_payload = PS_ECHO_MAX_BYTES + 64};
    hs_side sv = {.mine = hello_of(PS_ROLE_WORKER, 1, 10, 20)};
    *a = run_handshake(&cl, &sv);
    PS_CHECK(*a != NULL);
    if (!*a) return false;
    e->c = sv.c;
    pthread_create(th, NULL, echo_main, e);
    return true;
}

/* A whole measurement against the worker's side: HOST_INFO, a round trip, rates both ways,
 * the emulated delay of the worker's hop seen in the round trip; then the refusals: a reply
 * too large, a frame of another type, the byte and idle limits. */
static void test_link_probe(void) {
    ps_conn *a;
    pthread_t th;
    char err[512];
    echo_side e = {.lim = {.max_s = 30, .max_bytes = 1ull << 30, .idle_ms = 2000}, .sim = {.latency_ms = 3}};
    if (!echo_pair(&a, &e, &th)) return;
    ps_link_probe lp = {0};
    PS_CHECK_OK(ps_net_link_probe_conn(a, 2000, &lp, err, sizeof err));
    ps_conn_free(a); /* the probe's end: the worker's side returns PS_OK */
    pthread_join(th, NULL);
    PS_CHECK_OK(e.s);
    PS_CHECK(!strcmp(lp.host.host, "far") && lp.host.threads == 2 && lp.host.mem_available == 1 << 30);
    PS_CHECK(lp.rtt_ms >= 3 && lp.rtt_min_ms <= lp.rtt_ms && lp.rtt_ms <= lp.rtt_max_ms);
    PS_CHECK(lp.up_mbps > 0 && lp.down_mbps > 0 && lp.bulk_bytes >= (64u << 10));
    PS_CHECK(e.st.echoes >= 22 + 6 && e.st.bytes >= 6ull * lp.bulk_bytes);
    ps_conn_free(e.c);

    /* refusals, each an ERROR the probe reports, the worker's side ending with the reason */
    static const struct {
        int what; /* 0: reply too large, 1: another type, 2: the byte limit, 3: silence */
        ps_status st;
        const char *why;
    } cases[] = {{0, PS_ERR_PROTOCOL, "ECHO asks for a reply of 67108865 bytes (at most 67108864)"},
                 {1, PS_ERR_PROTOCOL, "expected ECHO, got message type 18"},
                 {2, PS_ERR_RANGE, "the probe would move more than 1000 B, the most a link probe may"},
                 {3, PS_ERR_TIMEOUT, "no ECHO within 100 ms"}};
    for (size_t i = 0; i < PS_ARRAY_LEN(cases); i++) {
        e = (echo_side){.lim = {.max_s = 30, .max_bytes = cases[i].what == 2 ? 1000 : 1ull << 30, .idle_ms = 100}};
        if (!echo_pair(&a, &e, &th)) return;
        uint16_t type;
        const uint8_t *p;
        uint32_t len;
        PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
        PS_CHECK_EQ_INT(type, PS_MSG_HOST_INFO);
        if (cases[i].what == 0) {
            uint8_t big[4];
            put_le(big, PS_ECHO_MAX_BYTES + 1, 4);
            struct iovec iov = {big, 4};
            PS_CHECK_OK(ps_conn_send(a, PS_MSG_ECHO, &iov, 1, 1000, err, sizeof err));
        } else if (cases[i].what == 1) {
            PS_CHECK_OK(ps_conn_send(a, PS_MSG_FORWARD, NULL, 0, 1000, err, sizeof err));
        }
        double ms;
        if (cases[i].what == 2) {
            PS_CHECK_OK(ps_net_echo(a, 0, 500, 1000, &ms, err, sizeof err));
            PS_CHECK_EQ_INT(ps_net_echo(a, 0, 500, 1000, &ms, err, sizeof err), PS_ERR_PROTOCOL);
        } else {
            PS_CHECK_OK(ps_conn_recv(a, 1000, &type, &p, &len, err, sizeof err));
            PS_CHECK_EQ_INT(type, PS_MSG_ERROR);
            ps_rbuf r = {.p = p, .len = len};
            ps_rbuf_u8(&r);
            ps_rbuf_str(&r, err, sizeof err);
        }
        CHECK_HAS(err, cases[i].why);
        pthread_join(th, NULL);
        PS_CHECK_EQ_INT(e.s, cases[i].st);
        CHECK_STR(e.err, cases[i].why);
        ps_conn_free(a);
        ps_conn_free(e.c);
    }
    /* the probe's own bounds */
    PS_CHECK_EQ_INT(ps_net_echo(NULL, PS_ECHO_MAX_BYTES + 1, 0, 100, &(double){0}, err, sizeof err), PS_ERR_ARG);
}

int main(void) {
    double t0 = now_ms();
    test_header_codec();
    test_wbuf_rbuf();
    test_parse_addr();
    test_dial_errors();
    test_round_trip_at("127.0.0.1:0");
    test_round_trip_at("[::1]:0");
    test_unix_sockets();
    test_bad_frames();
    test_send_to_closed_peer();
    test_key_load();
    test_handshake_ok(NULL);
    uint8_t key[32];
    memset(key, 0x5a, sizeof key);
    test_handshake_ok(key);
    test_sealed_frames();
    test_handshake_transcript();
    test_plain_frames();
    test_handshake_refusals();
    test_handshake_takes_shards();
    test_handshake_messages();
    test_handshake_stale_and_malformed();
    test_handshake_probe();
    test_host_info_codec();
    test_link_probe();
    test_link_timing();
    test_link_order();
    test_link_stop_and_errors();
    printf("test_net: %.0f ms\n", now_ms() - t0);
    return ps_test_done();
}
