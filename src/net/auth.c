/* auth.c - shared keys and the connection handshake (see net.h for the exchange).
 *
 * Payloads (little-endian, ps_wbuf/ps_rbuf encoding; str = u32 length + bytes, no NUL):
 *   hello        u8 role, i32 stage, i32 stage_count, i32 layer_begin, i32 layer_end,
 *                i32 n_layer, str model_fp, str shard_fp, u64 session, u32 flags
 *   HELLO        hello, nonce_c[32], u8 has_key
 *   HELLO_REPLY  hello, nonce_s[32], u8 has_key, proof_s[32]
 * has_key: 0 no key, 1 a key, 2 a key and frames in the clear asked for (ps_hello.plain).
 *   AUTH         proof_c[32]
 *   WELCOME      empty
 *   REFUSE       the reason, UTF-8, the whole payload; header flag NET_FLAG_REFUSE_AUTH set
 *                when the refusal is about keys or proofs
 * Every payload must be consumed exactly (trailing bytes are an error). A received hello
 * must have a known role (coordinator 1, previous stage 2, worker 3, link probe 4), 0 <=
 * stage < stage_count, 0 <= layer_begin <= layer_end <= n_layer, fingerprints that are empty
 * or exactly 32 hex digits, and no flag but PS_HELLO_TAKES_SHARDS, and that one only from a
 * worker; has_key is 0, 1 or 2, and a proof without a key is all zero. A worker started with
 * --cache and no shard loaded yet says stage 0 of 1, layers 0..0 of 0, empty fingerprints
 * and PS_HELLO_TAKES_SHARDS. A link probe (PS_ROLE_PROBE) holds no stage: it says stage 0 of
 * 1, layers 0..0 of 0, empty fingerprints, session 0 (anything else is refused); which
 * peers a server lets in is its check's business (a worker lets a probe in whatever it
 * serves).
 *
 * Keys never appear in messages; proofs are compared with crypto_auth_verify (constant
 * time). The nonces make every proof fresh, the distinct labels keep a server's proof from
 * being replayed as a client's, and the transcript (a hash of HELLO and of HELLO_REPLY up to
 * its proof) in every proof keeps anyone without the key from rewriting a hello on the way.
 *
 * With a key, the frames after WELCOME are sealed (seal.h) unless both hellos ask for plain
 * frames: the key of each direction is BLAKE2b-256 keyed with the shared key over a label
 * of the direction, both nonces and the transcript, so every connection has fresh keys and
 * frame numbers can start at 0.
 *
 * The top of src/net with link.c: it exchanges frames (frame.c) built with ps_wbuf/ps_rbuf
 * (buf.c), and starts sealing (seal.c). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net_internal.h"

#define KEY_MIN_BYTES  16
#define KEY_MAX_BYTES  (64 * 1024)
#define HS_NONCE_BYTES 32
#define HS_PROOF_BYTES crypto_auth_BYTES
#define HS_REASON_SHOW 400 /* longest refusal reason quoted in an error line */

_Static_assert(crypto_auth_BYTES == 32, "proofs are 32 bytes on the wire");
_Static_assert(crypto_auth_KEYBYTES == 32, "shared keys are 32 bytes");

static const char label_server[] = "pipeshard server";
static const char label_client[] = "pipeshard client";
static const char label_c2s[] = "pipeshard frames client to server";
static const char label_s2c[] = "pipeshard frames server to client";

/* sodium_init, once per process (it is idempotent and thread-safe). */
static ps_status sodium_ready(char *err, size_t errlen) {
    if (sodium_init() < 0) return ps_errf(err, errlen, PS_ERR_INTERNAL, "libsodium failed to initialise");
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Keys */

/* Reads at most KEY_MAX_BYTES + 1 bytes of fd into buf; returns the count or -1 (errno). */
static ssize_t read_upto(int fd, uint8_t *buf, size_t cap) {
    size_t got = 0;
    while (got < cap) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

ps_status ps_net_key_load(const char *path, uint8_t key[32], char *err, size_t errlen) {
    char eb[128];
    ps_status st = sodium_ready(err, errlen);
    if (st != PS_OK) return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ps_errf(err, errlen, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "cannot open key file %s: %s", path,
                       ps_net_errno_str(errno, eb, sizeof eb));
    uint8_t *buf = ps_malloc(KEY_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory reading key file %s", path);
    }
    ssize_t n = read_upto(fd, buf, KEY_MAX_BYTES + 1);
    int read_errno = errno;
    close(fd);
    if (n < 0)
        st = ps_errf(err, errlen, PS_ERR_IO, "cannot read key file %s: %s", path,
                     ps_net_errno_str(read_errno, eb, sizeof eb));
    else if (n < KEY_MIN_BYTES)
        st = ps_errf(err, errlen, PS_ERR_ARG, "key file %s is too short (%zd bytes; at least %d)", path, n,
                     KEY_MIN_BYTES);
    else if (n > KEY_MAX_BYTES)
        st = ps_errf(err, errlen, PS_ERR_ARG, "key file %s is too large (more than %d bytes)", path, KEY_MAX_BYTES);
    else
        crypto_generichash(key, 32, buf, (unsigned long long)n, NULL, 0);
    sodium_memzero(buf, KEY_MAX_BYTES + 1);
    free(buf);
    return st;
}

ps_status ps_net_key_write(const char *path, bool force, char *err, size_t errlen) {
    char eb[128];
    uint8_t key[32];
    for (size_t got = 0; got < sizeof key;) {
        ssize_t n = getrandom(key + got, sizeof key - got, 0);
        if (n < 0 && errno != EINTR)
            return ps_errf(err, errlen, PS_ERR_IO, "cannot get random bytes: %s",
                           ps_net_errno_str(errno, eb, sizeof eb));
        if (n > 0) got += (size_t)n;
    }
    /* a replaced file is unlinked first, so the new one is created 0600 whatever the old mode */
    if (force && unlink(path) != 0 && errno != ENOENT)
        return ps_errf(err, errlen, PS_ERR_IO, "cannot replace %s: %s", path, ps_net_errno_str(errno, eb, sizeof eb));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int e = errno;
        sodium_memzero(key, sizeof key);
        if (e == EEXIST) return ps_errf(err, errlen, PS_ERR_ARG, "%s exists (--force replaces it)", path);
        return ps_errf(err, errlen, PS_ERR_IO, "cannot create %s: %s", path, ps_net_errno_str(e, eb, sizeof eb));
    }
    ssize_t n = -1;
    if (fchmod(fd, 0600) == 0) {
        do n = write(fd, key, sizeof key);
        while (n < 0 && errno == EINTR);
    }
    int werr = errno;
    sodium_memzero(key, sizeof key);
    if (close(fd) != 0 && n == (ssize_t)sizeof key) n = -1, werr = errno;
    if (n == (ssize_t)sizeof key) return PS_OK;
    unlink(path);
    return ps_errf(err, errlen, PS_ERR_IO, "cannot write %s: %s", path,
                   n < 0 ? ps_net_errno_str(werr, eb, sizeof eb) : "short write");
}

/* The transcript: BLAKE2b-256 of the HELLO payload and of the HELLO_REPLY payload up to its
 * proof, as each side sent or received them. Proofs and frame keys cover it, so a hello
 * rewritten on the way (another stage, layer range or fingerprint) fails the proofs. */
typedef struct {
    crypto_generichash_state st;
    uint8_t hash[32]; /* once done */
} transcript;

static void transcript_init(transcript *t) { crypto_generichash_init(&t->st, NULL, 0, sizeof t->hash); }
static void transcript_add(transcript *t, const uint8_t *p, size_t n) { crypto_generichash_update(&t->st, p, n); }
static void transcript_done(transcript *t) { crypto_generichash_final(&t->st, t->hash, sizeof t->hash); }

#define PROOF_MSG (16 + 2 * HS_NONCE_BYTES + 32)
static void proof_msg(const char *label, const uint8_t *n1, const uint8_t *n2, const transcript *t,
                      uint8_t msg[PROOF_MSG]) {
    _Static_assert(sizeof label_server - 1 == 16 && sizeof label_client - 1 == 16, "labels are 16 bytes");
    memcpy(msg, label, 16);
    memcpy(msg + 16, n1, HS_NONCE_BYTES);
    memcpy(msg + 16 + HS_NONCE_BYTES, n2, HS_NONCE_BYTES);
    memcpy(msg + 16 + 2 * HS_NONCE_BYTES, t->hash, 32);
}

/* proof = HMAC-SHA-512-256(key, label || n1 || n2 || transcript), or all zero without a key. */
static void make_proof(const uint8_t *key, const char *label, const uint8_t *n1, const uint8_t *n2, const transcript *t,
                       uint8_t out[HS_PROOF_BYTES]) {
    uint8_t msg[PROOF_MSG];
    proof_msg(label, n1, n2, t, msg);
    if (key)
        crypto_auth(out, msg, sizeof msg, key);
    else
        memset(out, 0, HS_PROOF_BYTES);
}

/* Whether proof is the one key gives for label || n1 || n2 || transcript (constant time). */
static bool proof_ok(const uint8_t *key, const char *label, const uint8_t *n1, const uint8_t *n2, const transcript *t,
                     const uint8_t *proof) {
    uint8_t msg[PROOF_MSG];
    proof_msg(label, n1, n2, t, msg);
    return crypto_auth_verify(proof, msg, sizeof msg, key) == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hello */

static void hello_put(ps_wbuf *b, const ps_hello *h) {
    ps_wbuf_u8(b, h->role);
    ps_wbuf_i32(b, h->stage);
    ps_wbuf_i32(b, h->stage_count);
    ps_wbuf_i32(b, h->layer_begin);
    ps_wbuf_i32(b, h->layer_end);
    ps_wbuf_i32(b, h->n_layer);
    ps_wbuf_str(b, h->model_fp);
    ps_wbuf_str(b, h->shard_fp);
    ps_wbuf_u64(b, h->session);
    ps_wbuf_u32(b, h->flags);
}

/* Reads a hello (bad set when it is cut short or a fingerprint is too long). */
static void hello_get(ps_rbuf *r, ps_hello *h) {
    *h = (ps_hello){0};
    h->role = ps_rbuf_u8(r);
    h->stage = ps_rbuf_i32(r);
    h->stage_count = ps_rbuf_i32(r);
    h->layer_begin = ps_rbuf_i32(r);
    h->layer_end = ps_rbuf_i32(r);
    h->n_layer = ps_rbuf_i32(r);
    ps_rbuf_str(r, h->model_fp, sizeof h->model_fp);
    ps_rbuf_str(r, h->shard_fp, sizeof h->shard_fp);
    h->session = ps_rbuf_u64(r);
    h->flags = ps_rbuf_u32(r);
}

/* A fingerprint: empty or exactly 32 hex digits (NUL-terminated within 33 bytes). */
static bool fp_ok(const char fp[33]) {
    size_t n = strnlen(fp, 33);
    if (n != 0 && n != 32) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = fp[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))) return false;
    }
    return true;
}

/* Checks the fields of a hello; false with the first problem in why. */
static bool hello_valid(const ps_hello *h, char *why, size_t cap) {
    if (h->role < PS_ROLE_COORD || h->role > PS_ROLE_PROBE)
        snprintf(why, cap, "unknown role %u", (unsigned)h->role);
    else if (h->role == PS_ROLE_PROBE &&
             (h->stage != 0 || h->stage_count != 1 || h->layer_begin != 0 || h->layer_end != 0 || h->n_layer != 0 ||
              h->model_fp[0] || h->shard_fp[0] || h->session != 0))
        snprintf(why, cap, "a link probe claims no stage, layers, fingerprints or session");
    else if (h->stage_count < 1 || h->stage < 0 || h->stage >= h->stage_count)
        snprintf(why, cap, "stage %" PRId32 " of %" PRId32 " is out of range", h->stage, h->stage_count);
    else if (h->n_layer < 0 || h->layer_begin < 0 || h->layer_begin > h->layer_end || h->layer_end > h->n_layer)
        snprintf(why, cap, "layer range [%" PRId32 ", %" PRId32 ") does not fit a model of %" PRId32 " layers",
                 h->layer_begin, h->layer_end, h->n_layer);
    else if (!fp_ok(h->model_fp))
        snprintf(why, cap, "model fingerprint is not 32 hex digits");
    else if (!fp_ok(h->shard_fp))
        snprintf(why, cap, "shard fingerprint is not 32 hex digits");
    else if (h->flags & ~(uint32_t)PS_HELLO_TAKES_SHARDS)
        snprintf(why, cap, "unknown flags 0x%" PRIx32, h->flags & ~(uint32_t)PS_HELLO_TAKES_SHARDS);
    else if ((h->flags & PS_HELLO_TAKES_SHARDS) && h->role != PS_ROLE_WORKER)
        snprintf(why, cap, "only a worker takes shards");
    else
        return true;
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * Steps */

/* Sends REFUSE {reason} (best effort: the connection may be gone) and returns st with
 * "refused PEER: reason" in err. The auth flag is set when st is PS_ERR_AUTH. */
static ps_status refuse(ps_conn *c, ps_status st, int timeout_ms, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static ps_status refuse(ps_conn *c, ps_status st, int timeout_ms, char *err, size_t errlen, const char *fmt, ...) {
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    struct iovec iov = {.iov_base = reason, .iov_len = strlen(reason)};
    (void)ps_net_send_frame(c, PS_MSG_REFUSE, st == PS_ERR_AUTH ? NET_FLAG_REFUSE_AUTH : 0, &iov, 1, timeout_ms, NULL,
                            0);
    return ps_errf(err, errlen, st, "refused %s: %s", c->peer, reason);
}

/* Whether n bytes at p are all zero. */
static bool all_zero(const uint8_t *p, size_t n) {
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) acc |= p[i];
    return acc == 0;
}

/* Checks the peer's proof in message `what` (all zeros without a key); refuses on a mismatch. */
static ps_status check_proof(ps_conn *c, const uint8_t *key, const char *label, const uint8_t *n1, const uint8_t *n2,
                             const transcript *t, const uint8_t *proof, const char *what, int timeout_ms, char *err,
                             size_t errlen) {
    if (!key && !all_zero(proof, HS_PROOF_BYTES))
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "malformed %s: a proof without a key", what);
    if (key && !proof_ok(key, label, n1, n2, t, proof))
        return refuse(c, PS_ERR_AUTH, timeout_ms, err, errlen,
                      "wrong shared key: the peer's proof does not match our key (compare the --key-file of both "
                      "sides), or the handshake was altered on the way");
    return PS_OK;
}

/* Copies a peer's reason for an error line, cut at HS_REASON_SHOW bytes: only printable
 * ASCII (ps_printable). */
static void show_reason(char *out, size_t cap, const uint8_t *p, uint32_t len) {
    size_t n = 0;
    for (; n < len && n < HS_REASON_SHOW && n + 4 < cap; n++) out[n] = p[n] ? (char)p[n] : '?';
    if (n < len) out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n] = 0;
    ps_printable(out);
}

static const char *msg_name(uint16_t type) {
    switch (type) {
    case PS_MSG_HELLO: return "HELLO";
    case PS_MSG_HELLO_REPLY: return "HELLO_REPLY";
    case PS_MSG_AUTH: return "AUTH";
    case PS_MSG_WELCOME: return "WELCOME";
    case PS_MSG_REFUSE: return "REFUSE";
    default: return "?";
    }
}

/* Receives the next handshake frame, which must be of type want. A REFUSE becomes
 * "PEER refused: reason" (PS_ERR_AUTH when flagged so, else PS_ERR_PROTOCOL); another
 * type is refused. *h is as ps_net_recv_frame leaves it. */
static ps_status expect(ps_conn *c, uint16_t want, int timeout_ms, ps_frame_hdr *h, ps_rbuf *r, char *err,
                        size_t errlen) {
    const uint8_t *p = NULL;
    ps_status st = ps_net_recv_frame(c, timeout_ms, h, &p, err, errlen);
    if (st != PS_OK) return st;
    if (h->type == PS_MSG_REFUSE) {
        char why[HS_REASON_SHOW + 8];
        show_reason(why, sizeof why, p, h->len);
        return ps_errf(err, errlen, (h->flags & NET_FLAG_REFUSE_AUTH) ? PS_ERR_AUTH : PS_ERR_PROTOCOL, "%s refused: %s",
                       c->peer, why);
    }
    if (h->type != want)
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "expected %s, got message type %u", msg_name(want),
                      (unsigned)h->type);
    *r = (ps_rbuf){.p = p, .len = h->len};
    return PS_OK;
}

/* Sends a handshake frame from b (PS_ERR_NOMEM when building it failed). */
static ps_status send_buf(ps_conn *c, uint16_t type, const ps_wbuf *b, int timeout_ms, char *err, size_t errlen) {
    if (b->oom) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for a handshake message");
    struct iovec iov = {.iov_base = b->p, .iov_len = b->len};
    return ps_net_send_frame(c, type, 0, &iov, 1, timeout_ms, err, errlen);
}

/* Runs the application's check of the peer's hello; a failure is refused with its reason. */
static ps_status run_check(ps_conn *c, ps_hello_check_fn check, void *ctx, const ps_hello *peer, int timeout_ms,
                           char *err, size_t errlen) {
    if (!check) return PS_OK;
    char why[400] = "";
    ps_status st = check(ctx, peer, why, sizeof why);
    if (st == PS_OK) return PS_OK;
    return refuse(c, st, timeout_ms, err, errlen, "%s", why[0] ? why : ps_strerror(st));
}

/* Reads the body HELLO and HELLO_REPLY share — the hello, a nonce, the has_key flag, and for
 * HELLO_REPLY (proof non-NULL) the proof — and refuses a malformed one. what names the
 * message. */
static ps_status read_hello_body(ps_conn *c, ps_rbuf *r, const char *what, ps_hello *peer,
                                 uint8_t nonce[HS_NONCE_BYTES], uint8_t *has_key, const uint8_t **proof, int timeout_ms,
                                 char *err, size_t errlen) {
    char why[160];
    hello_get(r, peer);
    const uint8_t *n = ps_rbuf_bytes(r, HS_NONCE_BYTES);
    *has_key = ps_rbuf_u8(r);
    if (proof) *proof = ps_rbuf_bytes(r, HS_PROOF_BYTES);
    if (r->bad || r->off != r->len)
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "malformed %s (%zu bytes)", what, r->len);
    if (!hello_valid(peer, why, sizeof why))
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "malformed %s: %s", what, why);
    if (*has_key > 2)
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "malformed %s: has_key is %u", what,
                      (unsigned)*has_key);
    memcpy(nonce, n, HS_NONCE_BYTES);
    peer->plain = *has_key == 2;
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Sealing */

/* The key of one direction: BLAKE2b-256 keyed with the shared key over label || nonces ||
 * transcript. */
static void frame_key(const uint8_t *key, const char *label, const uint8_t *nonce_c, const uint8_t *nonce_s,
                      const transcript *t, uint8_t out[32]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, crypto_auth_KEYBYTES, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, nonce_c, HS_NONCE_BYTES);
    crypto_generichash_update(&st, nonce_s, HS_NONCE_BYTES);
    crypto_generichash_update(&st, t->hash, sizeof t->hash);
    crypto_generichash_final(&st, out, 32);
}

/* The hello's has_key byte: 0 without a key, 1 with one, 2 with one and plain frames asked for. */
static uint8_t has_key_byte(const uint8_t *key, const ps_hello *mine) { return key ? 1 + mine->plain : 0; }

/* Seals c's frames from here on (the client once it has WELCOME, the server once it has
 * sent it), when there is a key and not both hellos asked for plain frames. */
static ps_status start_sealing(ps_conn *c, const uint8_t *key, const ps_hello *mine, const ps_hello *peer,
                               const uint8_t *nonce_c, const uint8_t *nonce_s, const transcript *t, bool client,
                               char *err, size_t errlen) {
    if (!key || (mine->plain && peer->plain)) return PS_OK;
    net_seal *s = ps_net_seal_new();
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for the keys of %s", c->peer);
    frame_key(key, client ? label_c2s : label_s2c, nonce_c, nonce_s, t, s->tx);
    frame_key(key, client ? label_s2c : label_c2s, nonce_c, nonce_s, t, s->rx);
    c->seal = s;
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Client */

/* Parses HELLO_REPLY and checks the server's key and proof. */
static ps_status client_check_reply(ps_conn *c, const uint8_t *key, const uint8_t *nonce_c, ps_rbuf *r, transcript *t,
                                    ps_hello *peer, uint8_t nonce_s[HS_NONCE_BYTES], int timeout_ms, char *err,
                                    size_t errlen) {
    uint8_t has_key;
    const uint8_t *proof_s;
    ps_status st = read_hello_body(c, r, "HELLO_REPLY", peer, nonce_s, &has_key, &proof_s, timeout_ms, err, errlen);
    if (st != PS_OK) return st;
    transcript_add(t, r->p, r->len - HS_PROOF_BYTES); /* read_hello_body checked the length */
    transcript_done(t);
    if (key && !has_key)
        return refuse(c, PS_ERR_AUTH, timeout_ms, err, errlen,
                      "we require a shared key (--key-file) but the peer has none");
    if (!key && has_key)
        return refuse(c, PS_ERR_AUTH, timeout_ms, err, errlen, "the peer has a shared key but we have none");
    return check_proof(c, key, label_server, nonce_c, nonce_s, t, proof_s, "HELLO_REPLY", timeout_ms, err, errlen);
}

/* What both ends check before the first frame: libsodium is up, our own hello is valid. */
static ps_status handshake_ready(const ps_hello *mine, char *err, size_t errlen) {
    char why[160];
    ps_status st = sodium_ready(err, errlen);
    if (st != PS_OK) return st;
    if (!hello_valid(mine, why, sizeof why))
        return ps_errf(err, errlen, PS_ERR_ARG, "our own hello is invalid: %s", why);
    return PS_OK;
}

ps_status ps_net_handshake_client(ps_conn *c, const uint8_t *key, const ps_hello *mine, ps_hello_check_fn check,
                                  void *check_ctx, uint32_t max_payload, int timeout_ms, ps_hello *peer_out, char *err,
                                  size_t errlen) {
    ps_status st = handshake_ready(mine, err, errlen);
    if (st != PS_OK) return st;
    uint8_t nonce_c[HS_NONCE_BYTES], nonce_s[HS_NONCE_BYTES], proof[HS_PROOF_BYTES];
    randombytes_buf(nonce_c, sizeof nonce_c);
    ps_wbuf b = {0};
    hello_put(&b, mine);
    ps_wbuf_bytes(&b, nonce_c, sizeof nonce_c);
    ps_wbuf_u8(&b, has_key_byte(key, mine));
    transcript t;
    transcript_init(&t);
    if (!b.oom) transcript_add(&t, b.p, b.len);
    st = send_buf(c, PS_MSG_HELLO, &b, timeout_ms, err, errlen);
    ps_frame_hdr h;
    ps_rbuf r;
    ps_hello peer;
    if (st == PS_OK) st = expect(c, PS_MSG_HELLO_REPLY, timeout_ms, &h, &r, err, errlen);
    if (st == PS_OK) st = client_check_reply(c, key, nonce_c, &r, &t, &peer, nonce_s, timeout_ms, err, errlen);
    if (st == PS_OK) st = run_check(c, check, check_ctx, &peer, timeout_ms, err, errlen);
    if (st == PS_OK) {
        make_proof(key, label_client, nonce_s, nonce_c, &t, proof);
        b.len = 0;
        ps_wbuf_bytes(&b, proof, sizeof proof);
        st = send_buf(c, PS_MSG_AUTH, &b, timeout_ms, err, errlen);
    }
    if (st == PS_OK) st = expect(c, PS_MSG_WELCOME, timeout_ms, &h, &r, err, errlen);
    if (st == PS_OK && r.len != 0) st = ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s sent a malformed WELCOME", c->peer);
    if (st == PS_OK) st = start_sealing(c, key, mine, &peer, nonce_c, nonce_s, &t, true, err, errlen);
    ps_wbuf_free(&b);
    if (st != PS_OK) return st;
    if (max_payload) ps_conn_set_max_payload(c, max_payload);
    if (peer_out) *peer_out = peer;
    return PS_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Server */

/* Receives HELLO: refuses a stale protocol version, a malformed hello and a key mismatch. */
static ps_status server_get_hello(ps_conn *c, const uint8_t *key, int timeout_ms, transcript *t, ps_hello *peer,
                                  uint8_t nonce_c[HS_NONCE_BYTES], char *err, size_t errlen) {
    ps_frame_hdr h;
    ps_rbuf r;
    ps_status st = expect(c, PS_MSG_HELLO, timeout_ms, &h, &r, err, errlen);
    if (st == PS_ERR_PROTOCOL && h.magic == PS_NET_MAGIC && h.version != PS_NET_VERSION)
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen,
                      "protocol version %u is not supported; this worker speaks %d", (unsigned)h.version,
                      PS_NET_VERSION);
    if (st != PS_OK) return st;
    uint8_t has_key;
    if ((st = read_hello_body(c, &r, "HELLO", peer, nonce_c, &has_key, NULL, timeout_ms, err, errlen))) return st;
    transcript_add(t, r.p, r.len);
    if (key && !has_key)
        return refuse(c, PS_ERR_AUTH, timeout_ms, err, errlen, "this worker requires a shared key (--key-file)");
    if (!key && has_key)
        return refuse(c, PS_ERR_AUTH, timeout_ms, err, errlen, "the peer has a shared key but we have none");
    return PS_OK;
}

/* Receives AUTH and checks the client's proof. */
static ps_status server_get_auth(ps_conn *c, const uint8_t *key, const uint8_t *nonce_c, const uint8_t *nonce_s,
                                 const transcript *t, int timeout_ms, char *err, size_t errlen) {
    ps_frame_hdr h;
    ps_rbuf r;
    ps_status st = expect(c, PS_MSG_AUTH, timeout_ms, &h, &r, err, errlen);
    if (st != PS_OK) return st;
    const uint8_t *proof_c = ps_rbuf_bytes(&r, HS_PROOF_BYTES);
    if (r.bad || r.off != r.len)
        return refuse(c, PS_ERR_PROTOCOL, timeout_ms, err, errlen, "malformed AUTH (%zu bytes)", r.len);
    return check_proof(c, key, label_client, nonce_s, nonce_c, t, proof_c, "AUTH", timeout_ms, err, errlen);
}

ps_status ps_net_handshake_server(ps_conn *c, const uint8_t *key, const ps_hello *mine, ps_hello_check_fn check,
                                  void *check_ctx, uint32_t max_payload, int timeout_ms, ps_hello *peer_out, char *err,
                                  size_t errlen) {
    ps_status st = handshake_ready(mine, err, errlen);
    if (st != PS_OK) return st;
    uint8_t nonce_c[HS_NONCE_BYTES], nonce_s[HS_NONCE_BYTES], proof[HS_PROOF_BYTES];
    ps_hello peer;
    ps_wbuf b = {0};
    transcript t;
    transcript_init(&t);
    st = server_get_hello(c, key, timeout_ms, &t, &peer, nonce_c, err, errlen);
    if (st == PS_OK) {
        randombytes_buf(nonce_s, sizeof nonce_s);
        hello_put(&b, mine);
        ps_wbuf_bytes(&b, nonce_s, sizeof nonce_s);
        ps_wbuf_u8(&b, has_key_byte(key, mine));
        if (!b.oom) transcript_add(&t, b.p, b.len);
        transcript_done(&t);
        make_proof(key, label_server, nonce_c, nonce_s, &t, proof);
        ps_wbuf_bytes(&b, proof, sizeof proof);
        st = send_buf(c, PS_MSG_HELLO_REPLY, &b, timeout_ms, err, errlen);
    }
    if (st == PS_OK) st = server_get_auth(c, key, nonce_c, nonce_s, &t, timeout_ms, err, errlen);
    if (st == PS_OK) st = run_check(c, check, check_ctx, &peer, timeout_ms, err, errlen);
    if (st == PS_OK) st = ps_net_send_frame(c, PS_MSG_WELCOME, 0, NULL, 0, timeout_ms, err, errlen);
    if (st == PS_OK) st = start_sealing(c, key, mine, &peer, nonce_c, nonce_s, &t, false, err, errlen);
    ps_wbuf_free(&b);
    if (st != PS_OK) return st;
    if (max_payload) ps_conn_set_max_payload(c, max_payload);
    if (peer_out) *peer_out = peer;
    return PS_OK;
}
