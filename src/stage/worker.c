/* worker.c - the worker's event loop: one poll() over the listening socket, the
 * coordinator's connection and the previous stage's, on one thread; compute runs on the
 * stage's pool, outgoing frames on the connection's sender thread.
 *
 * Incoming handshakes run on threads of their own, at most MAX_HANDSHAKES at once, so that
 * a peer that connects and stays silent holds its thread for up to HANDSHAKE_MS a step,
 * never the loop and the session it serves. When all are taken, a new connection cuts the
 * oldest short: peers that connect and stay silent cannot keep a coordinator out unless
 * they open MAX_HANDSHAKES connections within the time its handshake takes (a round trip or
 * two). A thread's result comes back to the loop through a pipe; the loop adopts the
 * connection. The handshake's check of the peer reads the session fields (ctrl, in, out,
 * session) under mu; the loop, their only writer, changes them under mu. It checks the peer
 * against its own copy of our hello (handshake.mine), never w->me, which a placed shard changes.
 *
 * A link probe (`pipeshard probe --link`, role PS_ROLE_PROBE) is let in whatever the worker
 * serves, and measured on its handshake's thread: HOST_INFO, then an answer to each ECHO
 * (net.h), for at most PROBE_MAX_S and PROBE_MAX_BYTES, never touching the session. It holds
 * its handshake slot meanwhile, so probes count among the MAX_HANDSHAKES under way: a
 * connection that finds them all taken cuts the oldest short, a probe as any other. The loop
 * then only frees the connection, with a line saying what the probe did.
 *
 * With --cache, the worker starts without a shard and the coordinator places one (PLACE,
 * see stage.h) before SETUP: from the cache, or streamed in SHARD_DATA frames into
 * DIR/<fingerprint>.part, which the loop appends to one frame at a time (a transfer never
 * holds it), checks after the last byte, renames to DIR/<fingerprint>.gguf and loads. */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cuda/cuda.h"
#include "shard_cache.h"
#include "stage.h"

/* Longest wait for each step of an incoming handshake, and how many run at once. */
#define HANDSHAKE_MS   5000
#define MAX_HANDSHAKES 8
/* The most one link probe's connection may take, and move both ways together. */
#define PROBE_MAX_S     30.0
#define PROBE_MAX_BYTES (1ull << 30)
/* Lines about connections that failed or were dropped: a burst of PEER_LINES_BURST, then
 * PEER_LINES_PER_S a second (a peer can open connections faster than a log should grow);
 * the lines left out are counted in one line when there is room again. */
#define PEER_LINES_BURST 100
#define PEER_LINES_PER_S 10

typedef struct worker worker;

/* One incoming handshake: its thread owns c until it says done through the pipe. */
typedef struct {
    worker *w;
    pthread_t thread;
    ps_conn *c;
    ps_hello mine, peer;
    ps_status s;        /* the handshake's */
    ps_status probe_s;  /* a link probe's, after its handshake (err then says why it ended) */
    ps_echo_stats echo; /* what the link probe did */
    char err[512];
    double since;     /* when the connection was accepted */
    atomic_bool done; /* the thread has finished (set before it writes its slot to the pipe) */
    bool busy;        /* a thread runs or ran here and the loop has not collected it (the loop's own flag) */
} handshake;

/* A shard arriving in SHARD_DATA frames (--cache). */
typedef struct {
    bool on;        /* bytes are arriving */
    ps_place offer; /* what PLACE offered */
    int fd;         /* DIR/<fp>.part, open for appending (-1: none) */
    uint64_t got;   /* bytes in it */
    uint64_t from;  /* where this transfer began (> 0: the rest of a file cut short) */
    double t0;      /* when it began (ps_now) */
} transfer;

struct worker {
    const ps_worker_opts *o;
    ps_stage *stage;       /* NULL: a --cache worker before its first shard */
    const ps_model *m;     /* stage's model */
    ps_shard_cache *cache; /* --cache: where placed shards are kept (NULL: --shard) */
    transfer rx;
    ps_hello coord;                 /* the coordinator's hello, checked against a placed shard at SETUP */
    ps_hello me;                    /* our hello (session filled per session) */
    int lfd;                        /* listening socket */
    ps_conn *ctrl;                  /* the coordinator's connection (NULL: no session) */
    double ctrl_since;              /* when it connected (ps_now): SETUP must follow within --timeout-ms */
    ps_conn *in;                    /* the previous stage's connection (stage 1: ctrl) */
    ps_conn *out;                   /* the next stage's connection (last stage: ctrl) */
    ps_dhop hop_in, hop_out;        /* device hops from the previous stage and to the next (DHOP) */
    bool out_failed;                /* the last error came from the next stage's connection */
    double compute_ms;              /* in forward passes, this session */
    bool done;                      /* done_mb is valid */
    uint32_t done_mb;               /* the latest micro-batch finished */
    ps_mb mb;                       /* the one being run */
    ps_mb_seg segs[PS_MB_MAX_SEGS]; /* its segments */
    ps_result *res;                 /* (cap_res) last stage: what it sampled */
    int cap_res;
    uint64_t session;
    ps_wbuf wb; /* reusable payload buffer */
    char err[512];
    pthread_mutex_t mu;  /* ctrl, in, out and session against the handshake threads' reads */
    handshake *in_claim; /* a previous stage's handshake that passed its check, not yet adopted:
                            the slot is its (under mu; written by handshake threads too) */
    handshake hs[MAX_HANDSHAKES];
    int hs_pipe[2];           /* a finished handshake writes its slot number */
    double peer_room, peer_t; /* lines that may be shown now, and when that was counted (ps_now) */
    int peer_hidden;          /* lines left out since the last one shown */
    char device[128];         /* where the layers run, for link probes' HOST_INFO ("cpu", "cuda:0 (NAME)") */
    float ms_per_gb;          /* this host's decode speed for HOST_INFO, once measured (under mu) */
};

static double now_ms(void) { return ps_now() * 1e3; }

/* One line on stderr: "pipeshard worker: stage K: ..." ("pipeshard worker: ..." before a
 * --cache worker has a shard). */
static void say(const worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const worker *w, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (w->stage)
        fprintf(stderr, "pipeshard worker: stage %d: %s\n", w->me.stage, line);
    else
        fprintf(stderr, "pipeshard worker: %s\n", line);
}

// ---------------------------------------------------------------------------------------
// Sessions

/* Sends a frame to the coordinator (through ctrl's sender thread, and its link emulation,
 * on the last stage, whose outgoing hop it is). */
static ps_status ctrl_send(worker *w, uint16_t type, const void *p, size_t len) {
    struct iovec iov = {(void *)p, len};
    return ps_conn_send_async(w->ctrl, type, &iov, 1, w->o->timeout_ms, w->err, sizeof w->err);
}

/* Closes the .part of a transfer under way (kept, to be resumed), or of one that failed
 * (removed when drop). */
static void rx_stop(worker *w, bool drop) {
    if (w->rx.fd >= 0) close(w->rx.fd);
    if (drop && w->rx.on) {
        char path[4200];
        if (!ps_shard_cache_path(w->cache, w->rx.offer.shard_fp, true, path, sizeof path, NULL, 0)) unlink(path);
    }
    w->rx.fd = -1, w->rx.on = false;
}

/* Tells the coordinator why the session failed (best effort: an ERROR of the given
 * ps_err_kind, reason why) and ends the session; why NULL = a normal end. line: what the
 * log says (NULL: the reason, with the session, or before SETUP the coordinator). */
static void end_session_line(worker *w, int kind, const char *why, const char *line) {
    if (line)
        say(w, "%s", line);
    else if (why && w->session)
        say(w, "session %016llx ended: %s", (unsigned long long)w->session, why);
    else if (why && w->ctrl && !strstr(why, ps_conn_peer(w->ctrl)))
        say(w, "coordinator %s: %s", ps_conn_peer(w->ctrl), why);
    else if (why)
        say(w, "%s", why);
    rx_stop(w, false);
    if (w->ctrl && why) {
        w->wb.len = 0;
        ps_wbuf_u8(&w->wb, (uint8_t)kind);
        ps_wbuf_str(&w->wb, why);
        if (!w->wb.oom && !ctrl_send(w, PS_MSG_ERROR, w->wb.p, w->wb.len)) ps_conn_flush(w->ctrl, 1000, NULL, 0);
    }
    ps_conn *ctrl = w->ctrl, *in = w->in, *out = w->out;
    pthread_mutex_lock(&w->mu);
    w->ctrl = w->in = w->out = NULL;
    w->session = 0;
    w->in_claim = NULL;
    pthread_mutex_unlock(&w->mu);
    if (in != ctrl) ps_conn_free(in);
    if (out != ctrl) ps_conn_free(out);
    ps_conn_free(ctrl);
    ps_dhop_end(&w->hop_in), ps_dhop_end(&w->hop_out);
}

static void end_session(worker *w, int kind, const char *why) { end_session_line(w, kind, why, NULL); }

/* Whether the coordinator's connection is closed (peeked without blocking). */
static bool ctrl_closed(const worker *w) {
    char b;
    ssize_t r = recv(ps_conn_fd(w->ctrl), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Whether the current session leaves no room for peer p, whose handshake is h (under mu):
 * a coordinator while another one's session runs; a previous stage of another session,
 * before SETUP has started one (its id is 0 until then), once the session has its previous
 * stage (on stage 1, the coordinator itself), or while another previous stage's handshake,
 * past its check, holds the slot (in_claim). */
static ps_status session_refuses(const worker *w, const ps_hello *p, const handshake *h, char *err, size_t errlen) {
    if (p->role == PS_ROLE_COORD && w->ctrl && !ctrl_closed(w))
        return ps_errf(err, errlen, PS_ERR_ARG, "busy: serving a session of coordinator %s", ps_conn_peer(w->ctrl));
    if (p->role == PS_ROLE_PREV_STAGE && (!w->ctrl || !w->out || p->session != w->session))
        return ps_errf(err, errlen, PS_ERR_ARG, "no session %016llx here", (unsigned long long)p->session);
    if (p->role == PS_ROLE_PREV_STAGE && (w->in || (w->in_claim && w->in_claim != h)))
        return ps_errf(err, errlen, PS_ERR_ARG, "session %016llx has its previous stage already",
                       (unsigned long long)p->session);
    return PS_OK;
}

/* Whether peer p belongs to the fleet of our shard (me): the same model, stage count and
 * layer count. */
static ps_status fleet_refuses(const ps_hello *me, const ps_hello *p, char *err, size_t errlen) {
    if (strcmp(p->model_fp, me->model_fp))
        return ps_errf(err, errlen, PS_ERR_ARG, "model fingerprint %s does not match this shard's model %s",
                       p->model_fp, me->model_fp);
    if (p->stage_count != me->stage_count || p->n_layer != me->n_layer)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "a fleet of %d stages over %d layers does not match this shard (stage %d "
                       "of %d, %d layers)",
                       p->stage_count, p->n_layer, me->stage, me->stage_count, me->n_layer);
    return PS_OK;
}

/* Whether peer p may connect to a worker whose hello is me, sessions aside: a coordinator of
 * our fleet (of any, when we take shards: it places one before SETUP), a previous stage, or a
 * link probe (of anyone: it only measures the link). */
static ps_status peer_refuses(const ps_hello *me, const ps_hello *p, char *err, size_t errlen) {
    ps_status s;
    if (p->role == PS_ROLE_PROBE) return PS_OK;
    if (!(p->role == PS_ROLE_COORD && (me->flags & PS_HELLO_TAKES_SHARDS)) && (s = fleet_refuses(me, p, err, errlen)))
        return s;
    if (p->role != PS_ROLE_COORD && p->role != PS_ROLE_PREV_STAGE)
        return ps_errf(err, errlen, PS_ERR_ARG, "a peer of role %d cannot connect to a worker", p->role);
    return PS_OK;
}

/* Whether previous stage p ends where our shard (me) begins. */
static ps_status feed_refuses(const ps_hello *me, const ps_hello *p, char *err, size_t errlen) {
    if (p->role == PS_ROLE_PREV_STAGE && (p->stage != me->stage - 1 || p->layer_end != me->layer_begin))
        return ps_errf(err, errlen, PS_ERR_ARG, "stage %d (layers %d..%d) cannot feed stage %d (layers %d..%d)",
                       p->stage, p->layer_begin, p->layer_end, me->stage, me->layer_begin, me->layer_end);
    return PS_OK;
}

/* The handshake's check of whoever connects (ctx: its handshake slot, whose copy of our
 * hello it reads): a coordinator with no session running, the previous stage of the current
 * session, or a link probe (the session's fields untouched). */
static ps_status check_peer(void *ctx, const ps_hello *p, char *err, size_t errlen) {
    handshake *h = ctx;
    worker *w = h->w;
    ps_status s = peer_refuses(&h->mine, p, err, errlen);
    if (s || p->role == PS_ROLE_PROBE) return s;
    pthread_mutex_lock(&w->mu);
    s = session_refuses(w, p, h, err, errlen);
    if (!s) s = feed_refuses(&h->mine, p, err, errlen);
    if (!s && p->role == PS_ROLE_PREV_STAGE) w->in_claim = h; /* a second one is refused until adoption */
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* The check of the next stage, which we dial. */
static ps_status check_next(void *ctx, const ps_hello *p, char *err, size_t errlen) {
    const ps_hello *me = &((worker *)ctx)->me;
    if (p->role != PS_ROLE_WORKER || strcmp(p->model_fp, me->model_fp))
        return ps_errf(err, errlen, PS_ERR_ARG, "the next stage serves another model (%s, ours %s)", p->model_fp,
                       me->model_fp);
    if (p->stage != me->stage + 1 || p->layer_begin != me->layer_end)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the next stage is stage %d (layers %d..%d), expected stage %d from layer "
                       "%d",
                       p->stage, p->layer_begin, p->layer_end, me->stage + 1, me->layer_end);
    return PS_OK;
}

/* Whether s is a plausible HOST:PORT: printable ASCII, no spaces (it is dialled and logged). */
static bool printable(const char *s) {
    for (const unsigned char *q = (const unsigned char *)s; *q; q++)
        if (*q <= ' ' || *q > '~') return false;
    return true;
}

/* With --max-mem: whether the loaded shard and, with cp, a session's KV cache and buffers fit in
 * it (PS_ERR_RANGE saying what takes how much). */
static ps_status mem_check(const worker *w, const ps_ctx_params *cp, char *err, size_t errlen) {
    if (!w->o->max_mem || !w->m) return PS_OK;
    uint64_t shard = ps_gguf_file_size(w->m->gguf), ctx = 0;
    if (cp) {
        ps_ctx_params dp = *cp;
        dp.device = w->o->device;
        ctx = ps_ctx_bytes(w->m, &dp, w->o->threads);
    }
    if (shard + ctx <= w->o->max_mem) return PS_OK;
    char a[32], b[32], c[32];
    ps_size_format(shard, a, sizeof a), ps_size_format(ctx, b, sizeof b), ps_size_format(w->o->max_mem, c, sizeof c);
    if (!cp) return ps_errf(err, errlen, PS_ERR_RANGE, "the shard takes %s, more than --max-mem %s", a, c);
    return ps_errf(err, errlen, PS_ERR_RANGE,
                   "SETUP asks for %d positions in %d KV blocks: their cache and the buffers take %s, with the "
                   "shard's %s more than this worker's --max-mem %s",
                   cp->n_ctx, cp->n_blocks, b, a, c);
}

/* SETUP: starts the session's run state and the outgoing hop, answers READY. Once per
 * connection: a second one would dial the next stage again. */
static ps_status setup(worker *w, const uint8_t *p, uint32_t len) {
    if (w->out)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "a second SETUP in session %016llx",
                       (unsigned long long)w->session);
    if (w->rx.on)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "SETUP while stage %d's shard is arriving",
                       w->rx.offer.stage);
    if (!w->stage)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "SETUP before any shard was placed here (this worker started with --cache: PLACE comes first)");
    ps_status s;
    if (w->cache && (s = fleet_refuses(&w->me, &w->coord, w->err, sizeof w->err))) return s; /* placed, or not */
    ps_rbuf r = {.p = p, .len = len};
    uint64_t session = ps_rbuf_u64(&r);
    ps_ctx_params cp = {.n_ctx = ps_rbuf_i32(&r), .max_batch = ps_rbuf_i32(&r)};
    int max_mb = ps_rbuf_i32(&r);
    uint8_t act = ps_rbuf_u8(&r);
    char next[256];
    ps_rbuf_str(&r, next, sizeof next);
    cp.n_blocks = ps_rbuf_i32(&r);
    int max_segs = ps_rbuf_i32(&r), max_draft = ps_rbuf_i32(&r);
    if (r.bad || r.off != len || act > PS_ACT_F32 || session == 0)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "malformed SETUP message");
    if (!printable(next))
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "malformed SETUP message: the next stage's address has a control, space or non-ASCII byte");
    if (cp.n_ctx < 1 || cp.n_ctx > (1 << 24) || cp.max_batch < 1 || cp.max_batch > (1 << 16))
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "SETUP asks for %d positions in batches of %d (at most "
                       "%d and %d)",
                       cp.n_ctx, cp.max_batch, 1 << 24, 1 << 16);
    if (cp.n_blocks < 1 || cp.n_blocks > (1 << 24) || max_segs < 1 || max_segs > PS_MB_MAX_SEGS)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "SETUP asks for %d KV blocks and %d sequences per micro-batch (at most %d and %d)", cp.n_blocks,
                       max_segs, 1 << 24, PS_MB_MAX_SEGS);
    int max_ctx = w->o->max_ctx ? w->o->max_ctx : w->m->hp.ctx_train;
    if (cp.n_ctx > max_ctx)
        return ps_errf(w->err, sizeof w->err, PS_ERR_ARG,
                       "SETUP asks for %d positions; this worker serves at most %d "
                       "(--max-ctx)",
                       cp.n_ctx, max_ctx);
    if (cp.max_batch > (long long)cp.n_ctx * max_segs) /* no pass is longer (same bits: invariant 1) */
        cp.max_batch = (int)((long long)cp.n_ctx * max_segs);
    cp.act = (ps_act)act;
    bool last = w->m->has_head;
    if (last != !next[0])
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "SETUP %s a next stage, but this is %sthe last stage",
                       next[0] ? "names" : "lacks", last ? "" : "not ");
    pthread_mutex_lock(&w->mu);
    w->session = w->me.session = session;
    pthread_mutex_unlock(&w->mu);
    w->compute_ms = 0, w->done = false;
    if ((s = mem_check(w, &cp, w->err, sizeof w->err))) return s;
    s = ps_stage_begin(w->stage, &cp, max_mb, max_segs, max_draft, w->err, sizeof w->err);
    if (s) return s;
    int max_res = ps_mb_max_results(max_mb, max_segs, max_draft);
    if (max_res > w->cap_res) {
        ps_result *res = ps_realloc(w->res, (size_t)max_res * sizeof *res);
        if (!res) return ps_errf(w->err, sizeof w->err, PS_ERR_NOMEM, "out of memory for %d results", max_res);
        w->res = res, w->cap_res = max_res;
    }
    uint32_t limit = ps_mb_max_bytes(w->m->hp.dim, max_mb, max_segs, max_draft, cp.n_ctx);
    ps_conn_set_max_payload(w->ctrl, limit);
    ps_conn *out = w->ctrl;
    char hop[300] = "by TCP (--host-hops)";
    if (!last) {
        ps_hello me = w->me, peer;
        me.role = PS_ROLE_PREV_STAGE;
        me.flags = 0; /* a worker's flags: PS_HELLO_TAKES_SHARDS is no previous stage's to claim */
        s = ps_net_dial(next, w->o->timeout_ms, &out, w->err, sizeof w->err);
        if (!s)
            s = ps_net_handshake_client(out, w->o->key, &me, check_next, w, limit, w->o->timeout_ms, &peer, w->err,
                                        sizeof w->err);
        if (!s && !w->o->host_hops)
            s = ps_dhop_offer(&w->hop_out, out, w->stage, w->o->timeout_ms, hop, sizeof hop, w->err, sizeof w->err);
    }
    if (!s) s = ps_conn_start_sender(out, &w->o->sim, w->err, sizeof w->err);
    if (s) {
        if (out != w->ctrl) ps_conn_free(out);
        return s;
    }
    pthread_mutex_lock(&w->mu);
    w->out = out;
    if (w->me.stage == 1) w->in = w->ctrl;
    pthread_mutex_unlock(&w->mu);
    ps_conn_reset_stats(w->out);
    say(w,
        "session %016llx: %d positions per sequence, %d KV blocks, activations %s, micro-batches of up to %d "
        "positions in %d sequences, next %s%s%s%s, frames %s",
        (unsigned long long)session, cp.n_ctx, cp.n_blocks, ps_act_name(cp.act), max_mb, max_segs,
        last ? "the coordinator" : next, last ? "" : " (", last ? "" : hop, last ? "" : ")",
        ps_conn_sealed(w->ctrl) ? "sealed"
        : w->o->key             ? "in the clear (both ends asked)"
                                : "in the clear (no key)");
    return ctrl_send(w, PS_MSG_READY, NULL, 0);
}

/* The error for the micro-batch's non-finite activation i (of value v): it names the stage
 * that made them, not the sampler. */
static ps_status nonfinite(worker *w, const ps_mb *mb, long long i, float v) {
    int dim = w->m->hp.dim, row = (int)(i / dim), g = 0;
    while (row >= mb->segs[g].n) row -= mb->segs[g++].n;
    return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                   "the micro-batch from stage %d carries a non-finite activation (%g at position %d, element %d, of "
                   "sequence %llu)",
                   w->me.stage - 1, (double)v, mb->segs[g].pos + row, (int)(i % dim),
                   (unsigned long long)mb->segs[g].seq);
}

/* DHOP: the previous stage offers to write its activations into our GPU's memory. */
static ps_status dhop(worker *w, const uint8_t *p, uint32_t len) {
    if (!w->out) return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "a device hop's offer before SETUP");
    if (w->hop_in.ring) /* the stage before may be writing into the ring: it stays */
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "a second device hop's offer in one session");
    char why[300];
    ps_status s =
        ps_dhop_answer(&w->hop_in, w->in, w->stage, p, len, w->o->timeout_ms, why, sizeof why, w->err, sizeof w->err);
    if (!s)
        say(w, "activations from stage %d: %s%s", w->me.stage - 1, w->hop_in.ring ? "" : "by TCP: this stage ", why);
    return s;
}

/* FORWARD: runs a micro-batch and passes it on with our stats appended; the last stage
 * answers the coordinator with the sampled tokens and everyone's stats. */
static ps_status forward(worker *w, const uint8_t *p, uint32_t len) {
    if (!w->out) return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "micro-batch before SETUP");
    ps_mb *mb = &w->mb;
    mb->segs = w->segs;
    int dim = w->m->hp.dim;
    ps_status s =
        ps_mb_decode(p, len, dim, ps_stage_max_mb(w->stage), ps_stage_max_segs(w->stage), mb, w->err, sizeof w->err);
    if (s) return s;
    bool in_ring = mb->x_ring; /* (checked on the GPU while the stage runs) */
    if (in_ring && (s = ps_dhop_take(&w->hop_in, mb, dim, w->err, sizeof w->err))) return s;
    if (!mb->x) return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "micro-batch without activations");
    for (size_t i = 0; !in_ring && i < (size_t)mb->n * dim; i++)
        if (!isfinite(mb->x[i])) return nonfinite(w, mb, (long long)i, mb->x[i]);
    double t0 = now_ms();
    const float *x = NULL;
    int n_res = 0;
    if (w->hop_out.ring) {
        s = ps_dhop_run(&w->hop_out, w->stage, mb, w->o->timeout_ms, w->err, sizeof w->err);
        w->out_failed = s == PS_ERR_NET; /* the next stage is gone */
    } else
        s = ps_stage_run(w->stage, mb, &x, w->res, &n_res, w->err, sizeof w->err);
    if (s) return s;
    w->compute_ms += now_ms() - t0;
    if (in_ring) {
        long long bad;
        float v;
        if ((s = ps_dhop_done(&w->hop_in, &bad, &v, w->err, sizeof w->err))) return s;
        if (bad >= 0) return nonfinite(w, mb, bad, v);
    }
    /* idle threads sleep before the send: on a shared host, the receiver may run on this core */
    ps_pool_park(ps_stage_pool(w->stage));
    w->done_mb = mb->mb, w->done = true;
    ps_stage_stat *me = &mb->stats[mb->n_stats++];
    *me = (ps_stage_stat){.stage = w->me.stage, .compute_ms = w->compute_ms};
    ps_conn_get_stats(w->out, &me->hop);
    if (!w->m->has_head) {
        struct iovec iov[2];
        if (!w->hop_out.ring) mb->x = x, mb->x_ring = false;
        ps_mb_encode(&w->wb, mb, dim, iov);
        if (w->wb.oom) return ps_errf(w->err, sizeof w->err, PS_ERR_NOMEM, "out of memory");
        s = ps_conn_send_async(w->out, PS_MSG_FORWARD, iov, 2, w->o->timeout_ms, w->err, sizeof w->err);
        w->out_failed = s != PS_OK;
        return s;
    }
    if (!n_res) return PS_OK;
    ps_result_encode(&w->wb, mb->mb, w->res, n_res, mb->stats, mb->n_stats);
    if (w->wb.oom) return ps_errf(w->err, sizeof w->err, PS_ERR_NOMEM, "out of memory");
    return ctrl_send(w, PS_MSG_TOKENS, w->wb.p, w->wb.len);
}

/* PROBE: tells the coordinator which micro-batch we finished last. */
static ps_status probe(worker *w) {
    w->wb.len = 0;
    ps_wbuf_i32(&w->wb, w->me.stage);
    ps_wbuf_u32(&w->wb, w->done);
    ps_wbuf_u32(&w->wb, w->done_mb);
    return ctrl_send(w, PS_MSG_STATS, w->wb.p, w->wb.len);
}

/* KV_SAVE / KV_LOAD: a prefix's keys and values to or from --prefix-dir; answers KV_DONE.
 * What the stage refuses (a block not full, a file of another shard) is the answer, and the
 * session goes on; only a malformed message ends it. */
static ps_status kv_file(worker *w, bool save, const uint8_t *p, uint32_t len) {
    if (!w->out) return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "prefix message before SETUP");
    ps_kv_msg m;
    ps_status s = ps_kv_msg_decode(p, len, w->m->hp.vocab, &m, w->err, sizeof w->err);
    if (s) return s;
    char path[4200], why[1024] = "";
    if (!w->o->prefix_dir) {
        snprintf(why, sizeof why, "the worker at %s keeps no prefixes (start it with --prefix-dir DIR)", w->o->listen);
    } else {
        ps_kv_file_path(path, sizeof path, w->o->prefix_dir, m.id, w->me.stage);
        s = save ? ps_stage_kv_save(w->stage, path, m.id, m.blocks, m.n, m.tokens, why, sizeof why)
                 : ps_stage_kv_load(w->stage, path, m.id, m.blocks, m.n, m.tokens, why, sizeof why);
        if (!s)
            say(w, "prefix %016llx: %d blocks %s %s", (unsigned long long)m.id, m.n,
                save ? "saved to" : "restored from", path);
    }
    if (why[0]) say(w, "prefix %016llx not %s: %s", (unsigned long long)m.id, save ? "saved" : "restored", why);
    w->wb.len = 0;
    ps_wbuf_u8(&w->wb, why[0] != 0);
    ps_wbuf_str(&w->wb, why);
    if (w->wb.oom) return ps_errf(w->err, sizeof w->err, PS_ERR_NOMEM, "out of memory");
    return ctrl_send(w, PS_MSG_KV_DONE, w->wb.p, w->wb.len);
}

// ---------------------------------------------------------------------------------------
// Placing a shard (--cache)

/* Makes our hello say which shard is loaded: its stage, layers and fingerprints, or, before
 * the first one, stage 0 of 1 over no layers with empty fingerprints. */
static void hello_of_shard(worker *w) {
    ps_hello me = {.role = PS_ROLE_WORKER,
                   .stage_count = 1,
                   .plain = w->o->plain,
                   .flags = w->cache ? PS_HELLO_TAKES_SHARDS : 0,
                   .session = w->me.session};
    if (w->m) {
        const ps_shard_meta *sm = &w->m->shard;
        me.stage = sm->present ? sm->stage_index : 0;
        me.stage_count = sm->present ? sm->stage_count : 1;
        me.layer_begin = w->m->layer_begin, me.layer_end = w->m->layer_end, me.n_layer = w->m->hp.n_layer;
        snprintf(me.model_fp, sizeof me.model_fp, "%s", sm->model_fp);
        snprintf(me.shard_fp, sizeof me.shard_fp, "%s", sm->shard_fp);
    }
    pthread_mutex_lock(&w->mu);
    w->me = me;
    pthread_mutex_unlock(&w->mu);
}

/* Loads the shard at path (checked already) in place of the one loaded, which goes first:
 * the machine may have room for one only. */
static ps_status load_shard(worker *w, const char *path) {
    ps_stage_free(w->stage);
    w->stage = NULL, w->m = NULL;
    ps_stage_opts so = {.threads = w->o->threads, .pin = w->o->pin, .mmap = w->o->mmap, .device = w->o->device};
    ps_status s = ps_stage_open(path, &so, &w->stage, w->err, sizeof w->err);
    if (!s) w->m = ps_stage_model(w->stage);
    hello_of_shard(w);
    return s ? s : mem_check(w, NULL, w->err, sizeof w->err);
}

/* Answers PLACED: the offered shard is loaded; SETUP is due within --timeout-ms from now. */
static ps_status placed(worker *w) {
    w->ctrl_since = ps_now();
    return ctrl_send(w, PS_MSG_PLACED, NULL, 0);
}

/* Refuses the offered shard: logs "refused stage K's shard from PEER: why", tells the
 * coordinator why (ERROR) and ends the session. Returns PS_OK: there is nothing more to end. */
static ps_status refuse_shard(worker *w, const ps_place *o, const char *why) {
    char line[1400];
    snprintf(line, sizeof line, "refused stage %d's shard from %s: %s", o->stage, ps_conn_peer(w->ctrl), why);
    end_session_line(w, PS_ERR_KIND_SELF, why, line);
    return PS_OK;
}

/* Asks the coordinator for the offered shard's bytes from rx.got on. */
static ps_status ask_bytes(worker *w) {
    w->wb.len = 0;
    ps_wbuf_u64(&w->wb, w->rx.got);
    if (w->wb.oom) return ps_errf(w->err, sizeof w->err, PS_ERR_NOMEM, "out of memory");
    return ctrl_send(w, PS_MSG_SEND_SHARD, w->wb.p, w->wb.len);
}

static ps_status rx_finish(worker *w);

/* Starts receiving the offered shard into DIR/<fp>.part, after the bytes a transfer cut
 * short left there unless from_start; first makes room for it in the cache (or refuses it). */
static ps_status rx_start(worker *w, const ps_place *o, bool from_start) {
    char path[4200], e[700], size[32], note[96] = "";
    ps_status s = ps_shard_cache_path(w->cache, o->shard_fp, true, path, sizeof path, w->err, sizeof w->err);
    if (s) return s;
    ps_shard_cache_drop_parts(w->cache, o->shard_fp); /* one transfer at a time: the others cannot resume */
    /* O_NONBLOCK: a fifo planted there fails at once instead of holding the loop */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    struct stat sb = {0};
    int e_no = fd < 0 || fstat(fd, &sb) ? errno : 0;
    bool odd = !e_no && !S_ISREG(sb.st_mode); /* O_NOFOLLOW refused a link; a fifo or the like is left */
    if (!e_no && !odd && (from_start || (uint64_t)sb.st_size > o->bytes) && ftruncate(fd, 0)) e_no = errno;
    if (e_no || odd) {
        s = ps_errf(w->err, sizeof w->err, PS_ERR_IO, "cannot write %s: %s", path,
                    odd ? "not a regular file" : strerror(e_no));
        if (fd >= 0) close(fd);
        return s;
    }
    uint64_t have = from_start || (uint64_t)sb.st_size > o->bytes ? 0 : (uint64_t)sb.st_size;
    int evicted = 0;
    if ((s = ps_shard_cache_make_room(w->cache, o->shard_fp, o->bytes, have, &evicted, e, sizeof e))) {
        close(fd);
        unlink(path);
        return s == PS_ERR_RANGE ? refuse_shard(w, o, e) : ps_errf(w->err, sizeof w->err, s, "%s", e);
    }
    w->rx = (transfer){.on = true, .offer = *o, .fd = fd, .got = have, .from = have, .t0 = ps_now()};
    ps_conn_set_max_payload(w->ctrl, PS_SHARD_CHUNK);
    ps_size_format(o->bytes, size, sizeof size);
    if (have)
        snprintf(note, sizeof note, ", resuming after the %llu bytes of a transfer cut short",
                 (unsigned long long)have);
    if (evicted)
        snprintf(note + strlen(note), sizeof note - strlen(note), " (%d older cached file%s removed for room)", evicted,
                 evicted == 1 ? "" : "s");
    say(w, "receiving stage %d's shard (%s) from %s%s", o->stage, size, ps_conn_peer(w->ctrl), note);
    return have == o->bytes ? rx_finish(w) : ask_bytes(w);
}

/* Makes a renamed file's directory entry durable (best effort). */
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
}

/* The offered shard's last byte is in: checks the file, keeps it as DIR/<fp>.gguf, loads it
 * and answers PLACED. A file that fails the check is removed, then asked for again from the
 * start when it was resumed (its first part came from an earlier transfer), else refused. */
static ps_status rx_finish(worker *w) {
    ps_place o = w->rx.offer;
    char part[4200], path[4200], e[700], why[800], size[32];
    bool resumed = w->rx.from > 0;
    double secs = ps_now() - w->rx.t0;
    int sync_err = fsync(w->rx.fd) ? errno : 0;
    close(w->rx.fd);
    w->rx.fd = -1, w->rx.on = false;
    ps_status s = ps_shard_cache_path(w->cache, o.shard_fp, true, part, sizeof part, w->err, sizeof w->err);
    if (!s) s = ps_shard_cache_path(w->cache, o.shard_fp, false, path, sizeof path, w->err, sizeof w->err);
    if (s) return s;
    if (sync_err) {
        unlink(part);
        return ps_errf(w->err, sizeof w->err, PS_ERR_IO, "cannot write %s: %s", part, strerror(sync_err));
    }
    if ((s = ps_shard_check(part, &o, true, e, sizeof e))) {
        unlink(part);
        if (s != PS_ERR_FORMAT) return ps_errf(w->err, sizeof w->err, s, "%s", e);
        if (resumed) {
            say(w, "stage %d's shard, resumed from a transfer cut short, fails its check (%s): receiving it again",
                o.stage, e);
            return rx_start(w, &o, true);
        }
        snprintf(why, sizeof why, "%s (deleted)", e);
        return refuse_shard(w, &o, why);
    }
    if (rename(part, path)) {
        s = ps_errf(w->err, sizeof w->err, PS_ERR_IO, "cannot rename %s: %s", part, strerror(errno));
        unlink(part);
        return s;
    }
    sync_dir(ps_shard_cache_dir(w->cache));
    if ((s = load_shard(w, path))) return s;
    ps_size_format(o.bytes, size, sizeof size);
    say(w, "shard received: %s in %.1f s, kept as %s", size, secs, path);
    return placed(w);
}

/* SHARD_DATA: the next bytes of the shard being received, appended to its .part. */
static ps_status shard_data(worker *w, const uint8_t *p, uint32_t len) {
    transfer *rx = &w->rx;
    if (!rx->on) return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "SHARD_DATA while no shard is arriving");
    if (len == 0 || len > rx->offer.bytes - rx->got) {
        uint64_t at = rx->got, total = rx->offer.bytes;
        rx_stop(w, true);
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "SHARD_DATA of %u bytes at offset %llu: the shard offered has %llu bytes (the part received "
                       "is deleted)",
                       len, (unsigned long long)at, (unsigned long long)total);
    }
    for (uint32_t off = 0; off < len;) {
        ssize_t n = write(rx->fd, p + off, len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            char path[4200] = "";
            ps_shard_cache_path(w->cache, rx->offer.shard_fp, true, path, sizeof path, NULL, 0);
            rx_stop(w, true);
            return ps_errf(w->err, sizeof w->err, PS_ERR_IO, "cannot write %s: %s", path, strerror(e));
        }
        off += (uint32_t)n;
    }
    rx->got += len;
    w->ctrl_since = ps_now(); /* the clock of "no SETUP within --timeout-ms" starts again */
    return rx->got == rx->offer.bytes ? rx_finish(w) : PS_OK;
}

/* PLACE: loads the offered shard, from memory (loaded already), from the cache (checked
 * again), or from the coordinator (SEND_SHARD; SHARD_DATA follows). */
static ps_status place(worker *w, const uint8_t *p, uint32_t len) {
    if (!w->cache)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL,
                       "PLACE to a worker that serves its --shard (only a --cache worker takes shards)");
    if (w->out || w->rx.on)
        return ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "PLACE %s",
                       w->out ? "after SETUP" : "while a shard is arriving");
    ps_place o;
    ps_status s = ps_place_decode(p, len, &o, w->err, sizeof w->err);
    if (s) return s;
    w->ctrl_since = ps_now();
    const ps_hello *me = &w->me;
    if (w->stage && !strcmp(me->shard_fp, o.shard_fp) && !strcmp(me->model_fp, o.model_fp) && me->stage == o.stage &&
        me->stage_count == o.stage_count && me->layer_begin == o.layer_begin && me->layer_end == o.layer_end &&
        me->n_layer == o.n_layer)
        return placed(w); /* loaded already */
    char path[4200], e[700];
    if ((s = ps_shard_cache_path(w->cache, o.shard_fp, false, path, sizeof path, w->err, sizeof w->err))) return s;
    if (!access(path, F_OK)) {
        if (!(s = ps_shard_check(path, &o, w->o->verify, e, sizeof e))) {
            if ((s = load_shard(w, path))) return s;
            ps_shard_cache_touch(w->cache, o.shard_fp);
            say(w, "stage %d's shard from the cache: %s", o.stage, path);
            return placed(w);
        }
        if (s == PS_ERR_NOMEM) return ps_errf(w->err, sizeof w->err, s, "%s", e);
        say(w, "the cached %s fails its check (%s): deleted, asking %s for the shard", path, e, ps_conn_peer(w->ctrl));
        unlink(path);
    }
    return rx_start(w, &o, false);
}

/* Adds the room the time since the last count gives, and says how many lines were left
 * out once there is room for that line. */
static void peer_refill(worker *w) {
    double now = ps_now();
    w->peer_room = fmin(PEER_LINES_BURST, w->peer_room + (now - w->peer_t) * PEER_LINES_PER_S);
    w->peer_t = now;
    if (w->peer_hidden && w->peer_room >= 1) {
        say(w, "%d more lines about failed or dropped connections left out", w->peer_hidden);
        w->peer_room -= 1, w->peer_hidden = 0;
    }
}

/* Whether a line about a failed or dropped connection may be shown now (else it is counted). */
static bool peer_line(worker *w) {
    peer_refill(w);
    if (w->peer_room >= 1) return w->peer_room -= 1, true;
    w->peer_hidden++;
    return false;
}

/* This host's decode speed for HOST_INFO (ms per GB, 0: not measured): measured on the first
 * link probe that finds no session running (a session's passes would slow both), with our
 * threads on the CPU, on our shard (a --cache worker's shard may be replaced meanwhile: it
 * times synthetic Q4_0 matrices), then kept. Not measured on a GPU worker, nor where the
 * measure's memory would pass --max-mem beside the shard (a --cache worker under --max-mem:
 * its shard may change meanwhile, so never). A --shard worker's model is set before any
 * handshake starts. */
static float host_speed(worker *w) {
    pthread_mutex_lock(&w->mu);
    float ms = w->ms_per_gb;
    bool idle = !w->ctrl;
    pthread_mutex_unlock(&w->mu);
    const ps_worker_opts *o = w->o;
    if (ms || !idle || o->device != PS_DEVICE_CPU) return ms;
    const ps_model *timed = o->cache ? NULL : w->m;
    if (o->max_mem &&
        (!timed || ps_gguf_file_size(timed->gguf) + ps_decode_ms_per_gb_bytes(timed, o->threads) > o->max_mem))
        return 0;
    char err[256];
    ms = (float)ps_decode_ms_per_gb(timed, o->threads, err, sizeof err);
    pthread_mutex_lock(&w->mu);
    w->ms_per_gb = ms;
    pthread_mutex_unlock(&w->mu);
    return ms;
}

/* A link probe, on its handshake's thread: HOST_INFO (this host, our threads, device and
 * speed), then ECHOs answered through our outgoing hop's emulation, within PROBE_MAX_S and
 * PROBE_MAX_BYTES, a silence of --timeout-ms ending it. */
static void answer_probe(handshake *h) {
    worker *w = h->w;
    ps_host_info hi = {.mem_available = ps_mem_available(), .threads = w->o->threads, .ms_per_gb = host_speed(w)};
    gethostname(hi.host, sizeof hi.host - 1);
    snprintf(hi.device, sizeof hi.device, "%s", w->device);
    ps_host_text_plain(hi.host);
    ps_host_text_plain(hi.device);
    ps_echo_limits lim = {.max_s = PROBE_MAX_S, .max_bytes = PROBE_MAX_BYTES, .idle_ms = w->o->timeout_ms};
    h->probe_s = ps_net_echo_serve(h->c, &hi, &w->o->sim, &lim, &h->echo, h->err, sizeof h->err);
}

/* The thread of one incoming handshake: runs it (and a link probe's measurement after it),
 * then hands its slot to the loop. */
static void *handshake_main(void *arg) {
    handshake *h = arg;
    ps_thread_unpin(); /* not on the one CPU of the pinned loop */
    worker *w = h->w;
    int ms = w->o->timeout_ms < HANDSHAKE_MS ? w->o->timeout_ms : HANDSHAKE_MS;
    h->s = ps_net_handshake_server(h->c, w->o->key, &h->mine, check_peer, h, 64 << 10, ms, &h->peer, h->err,
                                   sizeof h->err);
    if (!h->s && h->peer.role == PS_ROLE_PROBE) answer_probe(h);
    uint8_t slot = (uint8_t)(h - w->hs);
    atomic_store(&h->done, true);
    (void)!write(w->hs_pipe[1], &slot, 1); /* the pipe holds far more than MAX_HANDSHAKES bytes */
    return NULL;
}

/* Tells a peer whose handshake passed, but for whom the session has no room any more (two
 * coordinators whose handshakes overlapped), why it is dropped: an ERROR (best effort; a
 * coordinator reads it as the answer to its SETUP), then the end of our side. What it sent
 * meanwhile is read and dropped, so that closing does not reset the connection before the
 * peer has read the ERROR. */
static void drop_late(worker *w, ps_conn *c, const char *why) {
    w->wb.len = 0;
    ps_wbuf_u8(&w->wb, PS_ERR_KIND_SELF);
    ps_wbuf_str(&w->wb, why);
    struct iovec iov = {w->wb.p, w->wb.len};
    if (!w->wb.oom) ps_conn_send(c, PS_MSG_ERROR, &iov, 1, 100, NULL, 0);
    shutdown(ps_conn_fd(c), SHUT_WR);
    char junk[4096];
    for (int i = 0; i < 64 && recv(ps_conn_fd(c), junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {}
    ps_conn_free(c);
}

/* Gives up h's claim on the previous-stage slot, if it holds it. */
static void drop_claim(worker *w, const handshake *h) {
    pthread_mutex_lock(&w->mu);
    if (w->in_claim == h) w->in_claim = NULL;
    pthread_mutex_unlock(&w->mu);
}

/* session_refuses of h's peer, by the loop (handshake threads write in_claim under mu). */
static ps_status locked_session_refuses(worker *w, const handshake *h) {
    pthread_mutex_lock(&w->mu);
    ps_status s = session_refuses(w, &h->peer, h, w->err, sizeof w->err);
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Frees a link probe's connection, its measurement done, with a line saying what it did. */
static void end_probe(worker *w, handshake *h) {
    const ps_echo_stats *e = &h->echo;
    if (peer_line(w))
        say(w, "link probe from %s: %llu echo%s, %.1f MB in %.1f s%s%s", ps_conn_peer(h->c),
            (unsigned long long)e->echoes, e->echoes == 1 ? "" : "es", e->bytes / 1e6, e->secs,
            h->probe_s ? "; ended: " : "", h->probe_s ? h->err : "");
    ps_conn_free(h->c);
    h->busy = false;
}

/* Takes a finished handshake's connection: a coordinator starting a session, or the
 * previous stage joining (a link probe's is only freed). The session may have changed while
 * it ran: checked again. */
static void adopt_peer(worker *w, handshake *h) {
    pthread_join(h->thread, NULL);
    ps_conn *c = h->c;
    ps_status s = h->s;
    if (!s && h->peer.role == PS_ROLE_PROBE) return end_probe(w, h);
    if (s && peer_line(w)) {
        /* the handshake's errors name the peer already ("refused P: why", "P refused: why") */
        if (strstr(h->err, ps_conn_peer(c)))
            say(w, "%s", h->err);
        else
            say(w, "handshake with %s failed: %s", ps_conn_peer(c), h->err);
    } else if (!s && ((s = locked_session_refuses(w, h)) ||
                      (h->peer.role == PS_ROLE_PREV_STAGE &&
                       ((s = peer_refuses(&w->me, &h->peer, w->err, sizeof w->err)) ||
                        (s = feed_refuses(&w->me, &h->peer, w->err, sizeof w->err)))))) {
        /* checked again against our shard now: a shard placed while it ran changed it */
        if (peer_line(w)) say(w, "dropped %s after its handshake: %s", ps_conn_peer(c), w->err);
        drop_late(w, c, w->err);
        c = NULL;
    }
    if (s) {
        ps_conn_free(c);
    } else if (h->peer.role == PS_ROLE_COORD) {
        if (w->ctrl) {
            say(w, "the coordinator of session %016llx went away", (unsigned long long)w->session);
            end_session(w, 0, NULL);
        }
        pthread_mutex_lock(&w->mu);
        w->ctrl = c;
        pthread_mutex_unlock(&w->mu);
        w->coord = h->peer;
        w->ctrl_since = ps_now();
        say(w, "coordinator %s connected", ps_conn_peer(c));
    } else {
        ps_conn_set_max_payload(c, ps_mb_max_bytes(w->m->hp.dim, ps_stage_max_mb(w->stage), ps_stage_max_segs(w->stage),
                                                   ps_stage_max_draft(w->stage), ps_stage_n_ctx(w->stage)));
        pthread_mutex_lock(&w->mu);
        w->in = c;
        pthread_mutex_unlock(&w->mu);
    }
    drop_claim(w, h);
    h->busy = false;
}

/* Adopts the handshakes whose threads have written their slot to the pipe. */
static void adopt_finished(worker *w) {
    uint8_t slots[MAX_HANDSHAKES];
    ssize_t n = read(w->hs_pipe[0], slots, sizeof slots);
    for (ssize_t i = 0; i < n; i++) {
        handshake *h = slots[i] < MAX_HANDSHAKES ? &w->hs[slots[i]] : NULL;
        if (h && h->busy && atomic_load(&h->done)) adopt_peer(w, h);
    }
}

/* Whether handshake a goes before b when one must be cut short: one still under way before
 * one that has finished (about to be adopted), then the older. */
static bool cut_first(handshake *a, handshake *b) {
    bool da = atomic_load(&a->done), db = atomic_load(&b->done);
    return da != db ? !da : a->since < b->since;
}

/* Frees a slot for the connection from `newcomer`: cuts a handshake short (see cut_first;
 * its peer gets no answer, its thread returns at once), or adopts one that has finished. */
static handshake *evict_oldest(worker *w, const char *newcomer) {
    handshake *h = &w->hs[0];
    for (int i = 1; i < MAX_HANDSHAKES; i++)
        if (cut_first(&w->hs[i], h)) h = &w->hs[i];
    if (atomic_load(&h->done)) { /* all eight have finished: adopt one (its pipe byte then finds nothing) */
        adopt_peer(w, h);
        return h;
    }
    shutdown(ps_conn_fd(h->c), SHUT_RDWR);
    pthread_join(h->thread, NULL);
    if (peer_line(w))
        say(w, "cut the handshake with %s short after %.0f ms: %d were under way and %s connected", ps_conn_peer(h->c),
            (ps_now() - h->since) * 1e3, MAX_HANDSHAKES, newcomer);
    ps_conn_free(h->c);
    drop_claim(w, h);
    h->busy = false; /* its byte in the pipe finds the slot's next handshake not done, or the slot free */
    return h;
}

/* Accepts a connection and starts its handshake on a thread of its own; with
 * MAX_HANDSHAKES under way already, in the slot of the oldest. */
static void accept_peer(worker *w) {
    ps_conn *c;
    if (ps_net_accept(w->lfd, 0, &c, w->err, sizeof w->err)) return;
    handshake *h = NULL;
    for (int i = 0; i < MAX_HANDSHAKES && !h; i++)
        if (!w->hs[i].busy) h = &w->hs[i];
    if (!h) h = evict_oldest(w, ps_conn_peer(c));
    *h = (handshake){.w = w, .c = c, .mine = w->me, .since = ps_now()};
    h->mine.session = 0; /* told to nobody before they prove the key */
    h->busy = true;
    if (pthread_create(&h->thread, NULL, handshake_main, h)) {
        if (peer_line(w)) say(w, "dropped %s: cannot start a thread for its handshake", ps_conn_peer(c));
        ps_conn_free(c);
        h->busy = false;
    }
}

/* At the end: cuts the handshakes still under way short and collects every thread. */
static void stop_handshakes(worker *w) {
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        if (w->hs[i].busy) shutdown(ps_conn_fd(w->hs[i].c), SHUT_RDWR);
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        if (w->hs[i].busy) {
            pthread_join(w->hs[i].thread, NULL);
            ps_conn_free(w->hs[i].c);
        }
}

/* Handles one frame from the coordinator or the previous stage. */
static void on_frame(worker *w, ps_conn *c) {
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    ps_status s = ps_conn_recv(c, w->o->timeout_ms, &type, &p, &len, w->err, sizeof w->err);
    if (!s && c == w->ctrl && type == PS_MSG_SETUP)
        s = setup(w, p, len);
    else if (!s && c == w->ctrl && type == PS_MSG_BYE)
        return end_session(w, 0, NULL);
    else if (!s && c == w->ctrl && type == PS_MSG_PROBE)
        s = probe(w);
    else if (!s && c == w->ctrl && type == PS_MSG_PLACE)
        s = place(w, p, len);
    else if (!s && c == w->ctrl && type == PS_MSG_SHARD_DATA)
        s = shard_data(w, p, len);
    else if (!s && c == w->ctrl && (type == PS_MSG_KV_SAVE || type == PS_MSG_KV_LOAD))
        s = kv_file(w, type == PS_MSG_KV_SAVE, p, len);
    else if (!s && c == w->in && type == PS_MSG_FORWARD)
        s = forward(w, p, len);
    else if (!s && c == w->in && type == PS_MSG_DHOP)
        s = dhop(w, p, len);
    else if (!s)
        s = ps_errf(w->err, sizeof w->err, PS_ERR_PROTOCOL, "unexpected message type %u from %s", type,
                    ps_conn_peer(c));
    if (!s) return;
    int kind = PS_ERR_KIND_SELF;
    if (w->out_failed)
        kind = PS_ERR_KIND_NEXT;
    else if (c != w->ctrl && (s == PS_ERR_NET || s == PS_ERR_TIMEOUT))
        kind = PS_ERR_KIND_PREV;
    w->out_failed = false;
    end_session(w, kind, w->err);
}

/* Loads --shard and checks it (stage 1 or later; its fingerprint unless --no-verify), or
 * opens the --cache, with no shard loaded yet; fills our hello either way. */
static ps_status start_shard(worker *w, char *err, size_t errlen) {
    const ps_worker_opts *o = w->o;
    if (o->cache) {
        ps_status s = ps_shard_cache_open(o->cache, o->max_disk, &w->cache, err, errlen);
        if (!s) hello_of_shard(w);
        return s;
    }
    ps_stage_opts so = {.threads = o->threads, .pin = o->pin, .mmap = o->mmap, .device = o->device};
    ps_status s = ps_stage_open(o->shard, &so, &w->stage, err, errlen);
    if (s) return s;
    w->m = ps_stage_model(w->stage);
    hello_of_shard(w);
    if ((s = mem_check(w, NULL, err, errlen))) return s;
    const ps_shard_meta *sm = &w->m->shard;
    if (!sm->present || sm->stage_index == 0)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "%s is %s; a worker serves a shard of stage 1 or later (stage 0 runs in "
                       "the coordinator)",
                       o->shard, sm->present ? "the stage-0 shard" : "a whole model, not a shard");
    char fp[33];
    if (o->verify && (s = ps_shard_fingerprint(w->m->gguf, sm, fp, err, errlen))) return s;
    if (o->verify && strcmp(fp, sm->shard_fp))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "%s: shard fingerprint %s does not match its contents (%s)",
                       o->shard, sm->shard_fp, fp);
    return PS_OK;
}

ps_status ps_worker_serve(const ps_worker_opts *o, char *err, size_t errlen) {
    worker w = {.o = o,
                .lfd = -1,
                .hs_pipe = {-1, -1},
                .mu = PTHREAD_MUTEX_INITIALIZER,
                .peer_room = PEER_LINES_BURST,
                .peer_t = ps_now(),
                .rx.fd = -1};
    ps_status s = start_shard(&w, err, errlen);
    if (!s && o->prefix_dir) s = ps_make_dirs(o->prefix_dir, 0700, err, errlen);
    if (s) goto out;
    if (pipe2(w.hs_pipe, O_CLOEXEC | O_NONBLOCK)) {

        s = ps_errf(err, errlen, PS_ERR_IO, "cannot make a pipe: %s", strerror(errno));
        goto out;
    }
    char bound[300];
    if ((s = ps_net_listen(o->listen, &w.lfd, bound, sizeof bound, err, errlen))) goto out;
    if (w.cache) {
        int n_shards;
        uint64_t bytes;
        char used[32], max[32] = "";
        ps_shard_cache_usage(w.cache, &n_shards, &bytes);
        ps_size_format(bytes, used, sizeof used);
        if (o->max_disk) ps_size_format(o->max_disk, max, sizeof max);
        say(&w, "no shard yet: the coordinator places one; cache %s (%d shard%s, %s%s%s), listening on %s%s",
            ps_shard_cache_dir(w.cache), n_shards, n_shards == 1 ? "" : "s", used, o->max_disk ? " of --max-disk " : "",
            max, bound, o->key ? " (shared key required)" : "");
    } else {
        say(&w, "layers %d..%d of %d, listening on %s%s", w.me.layer_begin, w.me.layer_end, w.me.n_layer, bound,
            o->key ? " (shared key required)" : "");
    }
    char gpu[256], e[256];
    size_t free_b, total_b;
    int gpu_i = o->device - PS_DEVICE_CUDA(0);
    snprintf(w.device, sizeof w.device, o->device == PS_DEVICE_CPU ? "cpu" : "cuda:%d", gpu_i);
    if (o->device != PS_DEVICE_CPU && !ps_cuda_device_info(gpu_i, gpu, sizeof gpu, &free_b, &total_b, e, sizeof e)) {
        snprintf(w.device, sizeof w.device, "cuda:%d (%.100s)", gpu_i, gpu);
        say(&w,
            "layers run on %s (cuda:%d): %.1f GiB of GPU memory free of %.1f; each session's layers and KV "
            "cache go there",
            gpu, gpu_i, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    if (!o->key && !ps_net_fd_is_local(w.lfd))
        say(&w,
            "warning: no --key-file, so anyone who can reach %s may use this worker (`pipeshard keygen -o KEY` "
            "writes a key: give it to each worker and to the coordinator with --key-file KEY)",
            bound);
    if (o->ready_fd >= 0) {
        const char *colon = strrchr(bound, ':');
        dprintf(o->ready_fd, "%s\n", !ps_net_is_unix(bound) && colon ? colon + 1 : bound);
        close(o->ready_fd);
    }
    while (!*o->stop) {
        if (w.peer_hidden) peer_refill(&w); /* says what was left out, once it can */
        if (w.ctrl && !w.out && (ps_now() - w.ctrl_since) * 1e3 > o->timeout_ms) { /* it would hold us: busy */
            snprintf(w.err, sizeof w.err, "coordinator %s sent no SETUP within %d ms", ps_conn_peer(w.ctrl),
                     o->timeout_ms);
            end_session(&w, PS_ERR_KIND_SELF, w.err);
        }
        struct pollfd fds[4] = {{.fd = w.lfd, .events = POLLIN}, {.fd = w.hs_pipe[0], .events = POLLIN}};
        int n = 2, ctrl = -1, in = -1;
        if (w.ctrl) fds[ctrl = n++] = (struct pollfd){.fd = ps_conn_fd(w.ctrl), .events = POLLIN};
        if (w.in && w.in != w.ctrl) fds[in = n++] = (struct pollfd){.fd = ps_conn_fd(w.in), .events = POLLIN};
        if (w.stage) ps_pool_park(ps_stage_pool(w.stage));
        if (poll(fds, (nfds_t)n, 1000) <= 0) continue;
        if (ctrl >= 0 && w.stage && w.out)
            ps_pool_wake(ps_stage_pool(w.stage)); /* likely a micro-batch: wake the threads meanwhile */
        /* the coordinator's frames first: at the end of a session its BYE is already here when
           the previous stage hangs up (it says BYE from the last stage back), so the hang-up
           is no error */
        ps_conn *prev = in >= 0 ? w.in : NULL;
        if (ctrl >= 0 && fds[ctrl].revents) on_frame(&w, w.ctrl);
        if (prev && w.in == prev && fds[in].revents) on_frame(&w, prev);
        if (fds[1].revents) adopt_finished(&w);
        if (fds[0].revents) accept_peer(&w);
    }
    say(&w, "stopping");
out:
    stop_handshakes(&w);
    if (w.ctrl) end_session(&w, 0, NULL);
    if (w.lfd >= 0) {
        close(w.lfd);
        if (ps_net_is_unix(o->listen)) unlink(o->listen + 5); /* our socket file */
    }
    for (int i = 0; i < 2; i++)
        if (w.hs_pipe[i] >= 0) close(w.hs_pipe[i]);
    ps_wbuf_free(&w.wb);
    free(w.res);
    ps_stage_free(w.stage);
    ps_shard_cache_free(w.cache);
    return s;
}
