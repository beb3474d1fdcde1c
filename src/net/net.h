/* net.h - framed messages over TCP, the connection handshake with shared-key
 * authentication, and link emulation (one-way delay and rate limit on outgoing hops).
 *
 * Every message is a frame: a fixed 24-byte little-endian header followed by `len` payload
 * bytes. Everything read from a socket is checked before use (magic, version, length
 * against the receiver's limit, checksum); a bad frame is an error naming what is wrong,
 * never a crash. Every blocking call takes a timeout. After a handshake with a shared key,
 * every payload is sealed (encrypted and authenticated, see seal.h): the header's
 * len then counts the 16-byte tag, and the receiver gets the plaintext. */
#ifndef PS_NET_H
#define PS_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../ps.h"

// ---------------------------------------------------------------------------------------
// Frames

#define PS_NET_MAGIC 0x3144534eu /* "NSD1" read as little-endian bytes 'N' 'S' 'D' '1' */
#define PS_NET_VERSION                                                                                                 \
    8 /* bump on any incompatible change of a message (2: sealed frames; 3: hello flags, shards that travel;        \
       4: prefixes saved and restored; 5: draft tokens verified; 6: draft distributions; 7: link probes, the        \
       role PS_ROLE_PROBE and the messages ECHO and HOST_INFO; 8: device hops, DHOP and FORWARD's flags) */
#define PS_NET_HDR_BYTES 24

/* The header as it travels (little-endian, no padding; encoded/decoded field by field). */
typedef struct {
    uint32_t magic;    /* PS_NET_MAGIC */
    uint16_t version;  /* sender's PS_NET_VERSION */
    uint16_t type;     /* ps_msg_type */
    uint32_t flags;    /* reserved, 0 */
    uint32_t len;      /* payload bytes */
    uint64_t checksum; /* XXH3-64 of the payload (seed 0) */
} ps_frame_hdr;
_Static_assert(sizeof(ps_frame_hdr) == PS_NET_HDR_BYTES, "frame header is 24 bytes");

/* Message types. Never renumbered; new ones at the end. 1..15 belong to the handshake
 * (this module), 16..30 and 33, 34 to the stage protocol (src/stage), 31 and 32 to link
 * probes (this module, probe.c). */
typedef enum {
    PS_MSG_HELLO = 1,       /* client → server: who I am, my nonce */
    PS_MSG_HELLO_REPLY = 2, /* server → client: who I am, my nonce, my proof */
    PS_MSG_AUTH = 3,        /* client → server: my proof */
    PS_MSG_WELCOME = 4,     /* server → client: accepted */
    PS_MSG_REFUSE = 5,      /* either way: refused, payload = UTF-8 reason */
    PS_MSG_SETUP = 16,      /* coordinator → worker: start a session */
    PS_MSG_READY = 17,      /* worker → coordinator: session ready (or ERROR) */
    PS_MSG_FORWARD = 18,    /* stage → next stage: a micro-batch */
    PS_MSG_TOKENS = 19,     /* last stage → coordinator: sampled tokens */
    PS_MSG_STATS = 20,      /* worker → coordinator: its progress, answering PROBE */
    PS_MSG_ERROR = 21,      /* worker → coordinator: a failure, payload = UTF-8 reason */
    PS_MSG_BYE = 22,        /* coordinator → worker: end of session */
    PS_MSG_PROBE = 23,      /* coordinator → worker: which micro-batch did you finish last? */
    PS_MSG_PLACE = 24,      /* coordinator → worker (--cache): load this shard (from your cache or from me) */
    PS_MSG_PLACED = 25,     /* worker → coordinator: the shard PLACE named is loaded (or ERROR) */
    PS_MSG_SEND_SHARD = 26, /* worker → coordinator: send the shard's bytes from this offset */
    PS_MSG_SHARD_DATA = 27, /* coordinator → worker: the next bytes of the shard */
    PS_MSG_KV_SAVE = 28,    /* coordinator → worker (--prefix-dir): save a prefix's keys and values */
    PS_MSG_KV_LOAD = 29,    /* coordinator → worker: restore them into these blocks */
    PS_MSG_KV_DONE = 30,    /* worker → coordinator: KV_SAVE or KV_LOAD done, or why not */
    PS_MSG_ECHO = 31,       /* link probe → worker: u32 reply_bytes, then any padding; the worker
                               answers an ECHO of reply_bytes bytes (or ERROR, and closes) */
    PS_MSG_HOST_INFO = 32,  /* worker → link probe, right after the handshake: its host (ps_host_info) */
    PS_MSG_DHOP = 33,       /* GPU stage → next stage: may I write activations into your GPU memory? */
    PS_MSG_DHOP_REPLY = 34, /* next stage → GPU stage: here is a ring there, or why not (stage.h) */
} ps_msg_type;

/* Encodes h into 24 bytes / decodes 24 bytes (no validation on decode). */
void ps_frame_hdr_encode(const ps_frame_hdr *h, uint8_t out[PS_NET_HDR_BYTES]);
void ps_frame_hdr_decode(const uint8_t in[PS_NET_HDR_BYTES], ps_frame_hdr *h);

// ---------------------------------------------------------------------------------------
// Little-endian payload builders and bounded readers

/* A growable output buffer, reused across messages (len = 0 to restart). An allocation
 * failure sets oom and makes later appends no-ops. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} ps_wbuf;
void ps_wbuf_free(ps_wbuf *b); /* frees p; the struct may be reused */
void ps_wbuf_u8(ps_wbuf *b, uint8_t v);
void ps_wbuf_u16(ps_wbuf *b, uint16_t v);
void ps_wbuf_u32(ps_wbuf *b, uint32_t v);
void ps_wbuf_u64(ps_wbuf *b, uint64_t v);
void ps_wbuf_i32(ps_wbuf *b, int32_t v);
void ps_wbuf_f32(ps_wbuf *b, float v);
void ps_wbuf_bytes(ps_wbuf *b, const void *p, size_t n);
void ps_wbuf_str(ps_wbuf *b, const char *s); /* u32 length, then the bytes (no NUL) */

/* A bounded reader over a received payload: reading past the end sets bad and returns
 * zeros (or NULL), so a parser can read every field and check bad once at the end. */
typedef struct {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} ps_rbuf;
uint8_t ps_rbuf_u8(ps_rbuf *r);
uint16_t ps_rbuf_u16(ps_rbuf *r);
uint32_t ps_rbuf_u32(ps_rbuf *r);
uint64_t ps_rbuf_u64(ps_rbuf *r);
int32_t ps_rbuf_i32(ps_rbuf *r);
float ps_rbuf_f32(ps_rbuf *r);
const void *ps_rbuf_bytes(ps_rbuf *r, size_t n); /* pointer into the payload, or NULL */
/* Copies a ps_wbuf_str string into out (NUL-terminated); a string longer than cap - 1
 * bytes or containing a NUL sets bad. */
void ps_rbuf_str(ps_rbuf *r, char *out, size_t cap);

// ---------------------------------------------------------------------------------------
// Connections

typedef struct ps_conn ps_conn;

/* Parses "HOST:PORT" ("[v6]:PORT" too); PORT 0..65535. Clear error on anything else. */
ps_status ps_net_parse_addr(const char *hostport, char *host, size_t hostcap, int *port, char *err, size_t errlen);

/* Whether addr is "unix:PATH": a Unix-domain stream socket, for stages on one host (a
 * shorter path through the kernel than loopback TCP, reachable only as the file's
 * permissions allow). */
bool ps_net_is_unix(const char *addr);
/* Whether socket fd is bound to a loopback address (127.0.0.0/8, ::1) or is a Unix socket:
 * only this host can reach it. False for any other address, 0.0.0.0 and [::] included. */
bool ps_net_fd_is_local(int fd);
/* A listening TCP socket on HOST:PORT (SO_REUSEADDR; PORT 0 picks a free port), or a Unix
 * socket on "unix:PATH" (a stale socket file at PATH, left by a process that died, is
 * replaced; the caller removes the file when done). *fd_out is owned by the caller (close
 * it). bound receives the actual "HOST:PORT" (or "unix:PATH"). */
ps_status ps_net_listen(const char *hostport, int *fd_out, char *bound, size_t boundcap, char *err, size_t errlen);
/* Accepts one connection on a listening socket, waiting at most timeout_ms (-1 = forever).
 * PS_ERR_TIMEOUT when none came. *out is owned by the caller (ps_conn_free). */
ps_status ps_net_accept(int listen_fd, int timeout_ms, ps_conn **out, char *err, size_t errlen);
/* Connects to HOST:PORT (or "unix:PATH") within timeout_ms. Errors name the address
 * ("cannot connect to 10.0.0.2:7701: connection refused"). TCP_NODELAY is set on every TCP
 * connection. */
ps_status ps_net_dial(const char *hostport, int timeout_ms, ps_conn **out, char *err, size_t errlen);
/* Stops the sender thread (if any, without waiting for queued frames), closes, frees.
 * NULL is a no-op. */
void ps_conn_free(ps_conn *c);
int ps_conn_fd(const ps_conn *c);
const char *ps_conn_peer(const ps_conn *c); /* "HOST:PORT" (or "unix:PATH") of the other end */
bool ps_conn_sealed(const ps_conn *c);      /* whether its frames are sealed (after a keyed handshake) */

/* Largest payload ps_conn_recv accepts (default 64 KiB, until the handshake is done; a
 * larger frame is PS_ERR_PROTOCOL "frame of N bytes exceeds the limit of M"). */
void ps_conn_set_max_payload(ps_conn *c, uint32_t max);

/* Sends one frame (header + the payload gathered from iov) with writev, blocking at most
 * timeout_ms in all. Not to be mixed with a running sender thread (see below). */
ps_status ps_conn_send(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms, char *err,
                       size_t errlen);
/* Receives one whole frame within timeout_ms (-1 = forever). Reads exactly the frame's
 * bytes (never more), so poll() on ps_conn_fd stays accurate between frames. *payload
 * points into the connection's reusable buffer, valid until the next recv on c.
 * Errors: PS_ERR_TIMEOUT, PS_ERR_NET ("peer closed the connection", socket errors),
 * PS_ERR_PROTOCOL (bad magic, other version: "peer speaks protocol version 3, this
 * build speaks 1", payload over the limit, checksum mismatch). */
ps_status ps_conn_recv(ps_conn *c, int timeout_ms, uint16_t *type, const uint8_t **payload, uint32_t *len, char *err,
                       size_t errlen);

// ---------------------------------------------------------------------------------------
// Asynchronous sending and link emulation

/* Emulated link of one outgoing hop: every frame is delivered latency_ms after it was
 * queued, and frames leave no faster than bandwidth_mbps (megabits per second, 0 = no
 * limit): frame i starts transmitting at max(queued_i + latency, end_{i-1}) and takes
 * (24 + len) * 8 / (bandwidth_mbps * 1e6) seconds. Deterministic: no jitter. A rate is 0
 * or PS_LINK_MIN_MBPS (1 kbit/s) to 1e6. */
#define PS_LINK_MIN_MBPS 0.001
typedef struct {
    double latency_ms;
    double bandwidth_mbps;
} ps_link_sim;

/* Starts a sender thread on c: from now on, ps_conn_send_async queues frames (copying
 * the payload into reusable buffers) and the thread writes them in order, applying sim
 * (NULL or zeros = plain TCP). The caller keeps computing while its frame travels. */
ps_status ps_conn_start_sender(ps_conn *c, const ps_link_sim *sim, char *err, size_t errlen);
/* Queues one frame. Returns at once, unless the queue holds more than 64 MiB or 4096
 * frames, then waits for room (at most timeout_ms). A write error of the thread is returned by the next call
 * (and by ps_conn_flush), naming the peer. */
ps_status ps_conn_send_async(ps_conn *c, uint16_t type, const struct iovec *iov, int iovcnt, int timeout_ms, char *err,
                             size_t errlen);
/* Waits until every queued frame has been written (at most timeout_ms). */
ps_status ps_conn_flush(ps_conn *c, int timeout_ms, char *err, size_t errlen);

/* Counters of what c sent (sync and async), for --stats. */
typedef struct {
    uint64_t frames; /* frames sent */
    uint64_t bytes;  /* header + payload bytes */
    double send_ms;  /* sum over frames of queued → last byte written (emulated delay included) */
} ps_conn_stats;
void ps_conn_get_stats(const ps_conn *c, ps_conn_stats *out);
void ps_conn_reset_stats(ps_conn *c);

// ---------------------------------------------------------------------------------------
// Handshake and authentication

/* Loads a shared key: the file's bytes (at least 16, at most 64 KiB), hashed to 32 bytes
 * with BLAKE2b (libsodium crypto_generichash). Errors name the file. */
ps_status ps_net_key_load(const char *path, uint8_t key[32], char *err, size_t errlen);
/* Writes a fresh shared key to path: 32 random bytes (getrandom), mode 0600. An existing
 * path is an error (PS_ERR_ARG, "... exists") unless force, which replaces it. */
ps_status ps_net_key_write(const char *path, bool force, char *err, size_t errlen);

/* Who is on each end of a connection. A link probe (`pipeshard probe --link`) only measures
 * the link: any worker that accepts its key lets it in, whatever shard it holds or session it
 * serves, and it never becomes the worker's coordinator or previous stage. */
typedef enum { PS_ROLE_COORD = 1, PS_ROLE_PREV_STAGE = 2, PS_ROLE_WORKER = 3, PS_ROLE_PROBE = 4 } ps_role;
/* Bits of ps_hello.flags; the others are reserved (a hello with one set is refused). */
enum {
    PS_HELLO_TAKES_SHARDS = 1, /* a worker started with --cache: it loads whatever shard the coordinator
                                  names (PLACE); only a worker's hello may carry it */
};
typedef struct {
    uint8_t role;        /* ps_role */
    int32_t stage;       /* the sender's stage index (coordinator: 0) */
    int32_t stage_count; /* stages in the fleet */
    int32_t layer_begin; /* the sender's layer range [begin, end) */
    int32_t layer_end;
    int32_t n_layer;   /* layers of the whole model */
    char model_fp[33]; /* hex fingerprint of the whole model, NUL-terminated */
    char shard_fp[33]; /* hex fingerprint of the sender's shard */
    uint64_t session;  /* coordinator-chosen session id (0 from a worker) */
    uint32_t flags;    /* PS_HELLO_* */
    bool plain;        /* with a key: asks for frames in the clear after the handshake (they
                          are sealed unless both sides ask; for peers on one host) */
} ps_hello;

/* Application check of the peer's hello: returns PS_OK, or an error status with a reason
 * in err (e.g. "stage 2 expects layers from 16, stage 1 ends at 14"). */
typedef ps_status (*ps_hello_check_fn)(void *ctx, const ps_hello *peer, char *err, size_t errlen);

/* The handshake, run on a fresh connection before anything else:
 *   client → HELLO {hello, nonce_c (32 random bytes), has_key}
 *   server → HELLO_REPLY {hello, nonce_s, has_key, proof_s} or REFUSE {reason}
 *   client → AUTH {proof_c} or REFUSE {reason}
 *   server → WELCOME or REFUSE {reason}
 * proof_s = HMAC(key, "pipeshard server" || nonce_c || nonce_s), proof_c = HMAC(key,
 * "pipeshard client" || nonce_s || nonce_c) with libsodium's crypto_auth (HMAC-SHA-512-256),
 * checked with crypto_auth_verify (constant time); proofs are all-zero without a key.
 * A side with a key refuses a peer without one, and the reverse ("this worker requires a
 * shared key (--key-file)", "the peer has a shared key but we have none"). The server
 * checks the frame version first (a stale peer gets REFUSE "protocol version 0 is not
 * supported; this worker speaks 1"), then keys, then check(peer hello) after proof_c
 * verifies; the client checks proof_s, then check(peer hello). Whoever refuses sends
 * REFUSE with the reason and returns it in err; whoever receives REFUSE returns
 * PS_ERR_AUTH (proof or key) or PS_ERR_PROTOCOL (anything else) with
 * "HOST:PORT refused: <reason>". key may be NULL (no key). Each step waits at most
 * timeout_ms. On success *peer_out holds the peer's hello and the connection's payload
 * limit is raised to max_payload. */
ps_status ps_net_handshake_client(ps_conn *c, const uint8_t *key, const ps_hello *mine, ps_hello_check_fn check,
                                  void *check_ctx, uint32_t max_payload, int timeout_ms, ps_hello *peer_out, char *err,
                                  size_t errlen);
ps_status ps_net_handshake_server(ps_conn *c, const uint8_t *key, const ps_hello *mine, ps_hello_check_fn check,
                                  void *check_ctx, uint32_t max_payload, int timeout_ms, ps_hello *peer_out, char *err,
                                  size_t errlen);

// ---------------------------------------------------------------------------------------
// Link probes: the round trip and the rates between this host and a worker's

/* The most bytes an ECHO may carry either way (its reply_bytes, its padding). */
#define PS_ECHO_MAX_BYTES (64u << 20)

/* What a worker tells a link probe of its host (HOST_INFO: str host, u64 mem_available,
 * i32 threads, str device, f32 ms_per_gb; strings of printable ASCII without '"' or '\\'). */
typedef struct {
    char host[256];         /* its host name */
    uint64_t mem_available; /* MemAvailable of /proc/meminfo, bytes (0: unknown) */
    int32_t threads;        /* its compute threads */
    char device[128];       /* where its layers run: "cpu", "cuda:0 (NVIDIA H200)" */
    float ms_per_gb;        /* its decode speed (ps_decode_ms_per_gb; 0: not measured) */
} ps_host_info;
void ps_host_info_encode(ps_wbuf *b, const ps_host_info *h); /* restarts b */
/* Makes s text HOST_INFO takes (ps_host_info_decode refuses anything else): each character
 * that is not printable ASCII, '"' or '\\' becomes '?'. */
void ps_host_text_plain(char *s);
/* Parses and checks a HOST_INFO payload (PS_ERR_PROTOCOL "malformed HOST_INFO ..."). */
ps_status ps_host_info_decode(const uint8_t *p, size_t len, ps_host_info *out, char *err, size_t errlen);

/* Bounds on one link probe's connection, on the worker's side. */
typedef struct {
    double max_s;       /* the most the probe may take, seconds, from its HOST_INFO */
    uint64_t max_bytes; /* the most payload bytes it may move, both ways together */
    int idle_ms;        /* the longest wait for the next ECHO */
} ps_echo_limits;
/* What one link probe did. */
typedef struct {
    uint64_t echoes; /* ECHOs answered */
    uint64_t bytes;  /* payload bytes received and sent */
    double secs;     /* from HOST_INFO to the end */
} ps_echo_stats;

/* The worker's side of a link probe, on a connection whose handshake found a PS_ROLE_PROBE
 * peer: sends HOST_INFO hi, then answers each ECHO with reply_bytes bytes through the link
 * emulation sim (NULL or zeros: none, else the replies travel as the worker's outgoing hop
 * does), until the peer closes (PS_OK), or an error: a frame of another type, a reply over
 * PS_ECHO_MAX_BYTES, a limit of lim passed, a timeout, a socket error. Each but a socket error
 * is told to the peer first (ERROR: u8 0, str reason). Raises c's payload limit to
 * PS_ECHO_MAX_BYTES + 64; takes up to that much memory twice (a request and a sealed reply).
 * *st is filled either way; c stays the caller's (the sender thread, when one was started,
 * stops at ps_conn_free). */
ps_status ps_net_echo_serve(ps_conn *c, const ps_host_info *hi, const ps_link_sim *sim, const ps_echo_limits *lim,
                            ps_echo_stats *st, char *err, size_t errlen);

/* One ECHO on a link probe's connection: send_bytes of padding (0..PS_ECHO_MAX_BYTES) sent
 * asking for reply_bytes back; *ms: from the first byte sent to the last one received. An
 * ERROR answer is PS_ERR_PROTOCOL "HOST:PORT ended the probe: <reason>". */
ps_status ps_net_echo(ps_conn *c, uint32_t send_bytes, uint32_t reply_bytes, int timeout_ms, double *ms, char *err,
                      size_t errlen);

/* A link measured by ps_net_link_probe. */
typedef struct {
    ps_hello worker;   /* the worker's hello: its stage and layers */
    ps_host_info host; /* its HOST_INFO */
    bool sealed;       /* frames were sealed (a key) */
    double rtt_ms;     /* the median round trip of 20 empty ECHOs (after 2 not timed) */
    double rtt_min_ms, rtt_max_ms;
    double up_mbps, down_mbps; /* the best of 3 transfers each way, megabits/s, less a round trip */
    uint32_t bulk_bytes;       /* the size of those transfers (16 MiB, less on a slow link) */
} ps_link_probe;

/* Connects to the worker at addr as a link probe (PS_ROLE_PROBE, with key when not NULL),
 * reads its HOST_INFO and measures the link: the round trip, then the rate each way
 * (bulk_bytes up with an empty reply, and 4 bytes up with bulk_bytes back; rate = bytes × 8 ÷
 * (elapsed − round trip)). timeout_ms bounds connecting, each handshake step and each ECHO.
 * Errors name addr ("cannot connect to ...", "... refused: wrong shared key ..."). */
ps_status ps_net_link_probe(const char *addr, const uint8_t *key, int timeout_ms, ps_link_probe *out, char *err,
                            size_t errlen);
/* The same on a connection whose handshake (as PS_ROLE_PROBE) is done; out->worker is left
 * as the caller set it. */
ps_status ps_net_link_probe_conn(ps_conn *c, int timeout_ms, ps_link_probe *out, char *err, size_t errlen);

#endif
