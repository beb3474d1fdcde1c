/* coord.c - the coordinator's side of the ring. */
#include "coord.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../stage/stage.h"

/* What the coordinator knows of one stage. */
typedef struct {
    ps_conn *conn;      /* worker stages: its connection (stage 1: also the data hop) */
    ps_stage_stat cur;  /* this session's counters, as the latest token brought them */
    ps_stage_stat base; /* ... at the last reset */
    int probe;          /* PROBE_*: its answer when the ring went silent */
    int fail;           /* FAIL_*: what went wrong, when something did */
    char why[512];
    int kv;            /* KV_*: its answer to KV_SAVE or KV_LOAD */
    char kv_why[1024]; /* why it refused */
} stage_view;

enum { FAIL_NONE, FAIL_DEAD, FAIL_SELF, FAIL_PREV, FAIL_NEXT };
enum { KV_IDLE, KV_WAIT, KV_DONE, KV_REFUSED };
enum { PROBE_SILENT, PROBE_BEHIND, PROBE_DONE };

/* Most micro-batches that sample in flight at once (a ring of up to PS_SHARD_MAX_STAGES
 * stages has at most that many busy, and a few queued). */
#define MAX_PENDING 64

struct ps_coord {
    ps_coord_opts o;
    ps_fleet fleet; /* a copy (one stage when running a whole model) */
    int n;          /* stages */
    ps_stage *stage0;
    ps_dhop hop;       /* stage 0's activations into stage 1's GPU memory (DHOP, stage.h) */
    char hop_why[300]; /* what that hop is: "device to device: ..." or "by TCP: " and why */
    ps_hello me;
    bool connected;
    uint32_t mb;                   /* micro-batches sent in this session */
    uint32_t pending[MAX_PENDING]; /* micro-batches that sample, sent and not answered, oldest first */
    double sent_at[MAX_PENDING];   /* when stage 0 had run each (ms): the ring's part begins */
    int n_pending;
    bool got;        /* the oldest pending answer came: res[0..n_res) */
    ps_result *res;  /* (max_res) */
    ps_result *res1; /* (max_res) ps_coord_next's */
    int n_res;
    double wait_ms, wait_base; /* time spent waiting for answers, and its value at the last reset */
    int32_t *hist;             /* (n_ctx) ps_coord_next's sequence, to rebuild the workers' KV
                                  after a reconnection (DESIGN.md, invariant 3) */
    int32_t *ident;            /* (blocks of one sequence) ps_coord_next's block table 0, 1, 2, ... */
    ps_mb_seg *segs;           /* (max_segs) the micro-batch being sent */
    int32_t *toks;             /* (max_mb) its tokens */
    int max_mb, max_segs, max_res, n_blocks;
    stage_view st[PS_SHARD_MAX_STAGES];
    ps_wbuf wb;
    char err[600];
    char what[320];  /* the progress line of a shard being sent */
    uint8_t key[32]; /* o.key's copy (the caller's may go before a reconnection) */
    char standby[PS_SHARD_MAX_STAGES][sizeof(((ps_fleet_stage *)0)->address)]; /* o.standby's copies */
    int next_standby;              /* standby[next_standby..] are still free */
    int failures, recoveries;      /* ps_coord_stats' */
    double recovery_ms, failed_at; /* failed_at: when the last failure was (0: recovered since) */
    int stalled_stage;             /* the stage the last failure found stalled (0: none): a standby takes
                                      its place without waiting for it again */
};

/* A worker takes this long at most to check and load a shard of B bytes after its last
 * byte (or from its cache): timeout_ms plus B at 50 MB/s. */
#define PLACE_BYTES_PER_MS 50000.0

static double now_ms(void) { return ps_now() * 1e3; }

// ---------------------------------------------------------------------------------------
// Connecting the fleet

/* The handshake's check of worker k against fleet.json. */
typedef struct {
    const ps_coord *c;
    int k;
    bool place; /* the worker takes shards and holds another: place stage k's on it */
} expect;

/* Whether worker p serves stage k's shard as fleet.json describes it. */
static ps_status shard_differs(const expect *e, const ps_hello *p, char *err, size_t errlen) {
    const ps_fleet_stage *fs = &e->c->fleet.stages[e->k];
    if (strcmp(p->model_fp, e->c->fleet.model_fp))
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the worker serves a shard of another model (fingerprint %s; "
                       "fleet.json's model is %s)",
                       p->model_fp, e->c->fleet.model_fp);
    if (p->stage != e->k || p->layer_begin != fs->layer_begin || p->layer_end != fs->layer_end)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the worker serves stage %d (layers %d..%d), but fleet.json puts stage "
                       "%d (layers %d..%d) there",
                       p->stage, p->layer_begin, p->layer_end, e->k, fs->layer_begin, fs->layer_end);
    if (fs->fingerprint[0] && strcmp(p->shard_fp, fs->fingerprint))
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the worker serves stage %d with shard fingerprint %s, fleet.json lists "
                       "%s (split again?)",
                       e->k, p->shard_fp, fs->fingerprint);
    return PS_OK;
}

/* A worker that serves stage k's shard, or takes shards (PS_HELLO_TAKES_SHARDS): then it
 * gets stage k's before SETUP (e->place) unless it holds it already. */
static ps_status check_worker(void *ctx, const ps_hello *p, char *err, size_t errlen) {
    expect *e = ctx;
    if (p->role != PS_ROLE_WORKER) return ps_errf(err, errlen, PS_ERR_ARG, "the peer is not a worker");
    ps_status s = shard_differs(e, p, err, errlen);
    e->place = s && (p->flags & PS_HELLO_TAKES_SHARDS);
    return e->place ? PS_OK : s;
}

/* Closes every worker connection (after telling them the session is over, when asked).
 * BYE goes from the last stage back to stage 1: each worker has its BYE before its previous
 * stage, ending the session, hangs up on it. */
static void disconnect(ps_coord *c, bool bye) {
    if (!bye && c->connected) c->failures++, c->failed_at = now_ms(); /* a fleet that failed */
    for (int k = c->n - 1; k >= 1; k--) {
        stage_view *v = &c->st[k];
        if (bye && v->conn) ps_conn_send(v->conn, PS_MSG_BYE, NULL, 0, 1000, NULL, 0);
        ps_conn_free(v->conn);
        v->conn = NULL;
    }
    c->connected = false;
    c->n_pending = 0, c->got = false; /* what was in flight is lost */
    ps_dhop_end(&c->hop);
}

/* Drops the connection to stage k (a standby is about to take its place). */
static void disconnect_stage(ps_coord *c, int k) {
    ps_conn_free(c->st[k].conn);
    c->st[k].conn = NULL;
    if (k == 1) ps_dhop_end(&c->hop);
}

/* Names stage k in messages: "stage 2 (10.0.0.3:7702)". */
static const char *stage_name(const ps_coord *c, int k, char *buf, size_t cap) {
    snprintf(buf, cap, "stage %d (%s)", k, c->fleet.stages[k].address);
    return buf;
}

/* Reads n bytes at off of fd into buf; false when the file ends first or fails (errno). */
static bool pread_all(int fd, uint8_t *buf, size_t n, uint64_t off) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return false;
        }
        got += (size_t)r;
    }
    return true;
}

/* Sends bytes [from, size) of stage k's shard file (fd) in SHARD_DATA frames, reporting the
 * progress. Stops early, with PS_OK, when the worker says something meanwhile (an ERROR:
 * the caller reads it). */
static ps_status send_shard(ps_coord *c, int k, int fd, uint64_t from, uint64_t size, const char *name) {
    stage_view *v = &c->st[k];
    const char *path = c->fleet.stages[k].shard;
    char e[500];
    uint8_t *buf = ps_malloc(PS_SHARD_CHUNK);
    if (!buf) return ps_errf(c->err, sizeof c->err, PS_ERR_NOMEM, "out of memory");
    snprintf(c->what, sizeof c->what, "sending stage %d's shard to %s", k, c->fleet.stages[k].address);
    ps_status s = PS_OK;
    for (uint64_t off = from; off < size && !s;) {
        size_t n = size - off < PS_SHARD_CHUNK ? (size_t)(size - off) : PS_SHARD_CHUNK;
        struct pollfd pfd = {ps_conn_fd(v->conn), POLLIN, 0};
        if (poll(&pfd, 1, 0) > 0) break; /* the worker answers early: an ERROR */
        if (!pread_all(fd, buf, n, off)) {
            s = ps_errf(c->err, sizeof c->err, PS_ERR_IO, "cannot read %s to send it to %s: %s", path, name,
                        errno ? strerror(errno) : "the file is shorter than when the transfer began");
            break;
        }
        struct iovec iov = {buf, n};
        if ((s = ps_conn_send(v->conn, PS_MSG_SHARD_DATA, &iov, 1, c->o.timeout_ms, e, sizeof e))) {
            ps_errf(c->err, sizeof c->err, s, "%s: %s", name, e);
            break;
        }
        off += n;
        ps_progress_report(&c->o.progress, c->what, off, size);
    }
    free(buf);
    return s;
}

/* Places stage k's shard on its worker, which takes shards and holds another: PLACE, then
 * the bytes it asks for (SEND_SHARD, at most twice: a resumed file that fails its check is
 * asked for again from the start), until it answers PLACED. */
static ps_status place_stage(ps_coord *c, int k, const char *name) {
    stage_view *v = &c->st[k];
    const ps_fleet_stage *fs = &c->fleet.stages[k];
    char e[500];
    struct stat sb = {0};
    int fd = open(fs->shard, O_RDONLY | O_CLOEXEC);
    int open_err = fd < 0 || fstat(fd, &sb) ? errno : 0;
    if (open_err || sb.st_size <= 0) {
        ps_errf(c->err, sizeof c->err, PS_ERR_IO, "cannot send stage %d's shard %s to %s: %s", k, fs->shard, name,
                open_err ? strerror(open_err) : "the file is empty");
        if (fd >= 0) close(fd);
        return PS_ERR_IO;
    }
    ps_place pl = {.stage = k,
                   .stage_count = c->n,
                   .layer_begin = fs->layer_begin,
                   .layer_end = fs->layer_end,
                   .n_layer = c->fleet.n_layer,
                   .bytes = (uint64_t)sb.st_size};
    snprintf(pl.model_fp, sizeof pl.model_fp, "%s", c->fleet.model_fp);
    snprintf(pl.shard_fp, sizeof pl.shard_fp, "%s", fs->fingerprint);
    ps_place_encode(&c->wb, &pl);
    struct iovec iov = {c->wb.p, c->wb.len};
    double wait = c->o.timeout_ms + (double)pl.bytes / PLACE_BYTES_PER_MS;
    int wait_ms = wait > INT_MAX ? INT_MAX : (int)wait;
    ps_status s = c->wb.oom ? ps_errf(e, sizeof e, PS_ERR_NOMEM, "out of memory")
                            : ps_conn_send(v->conn, PS_MSG_PLACE, &iov, 1, c->o.timeout_ms, e, sizeof e);
    bool sent = false;
    for (int asks = 0; !s;) {
        uint16_t type;
        const uint8_t *p;
        uint32_t len;
        if ((s = ps_conn_recv(v->conn, wait_ms, &type, &p, &len, e, sizeof e))) break;
        ps_rbuf r = {.p = p, .len = len};
        if (type == PS_MSG_PLACED && len == 0) break;
        if (type == PS_MSG_ERROR) {
            ps_rbuf_u8(&r);
            ps_rbuf_str(&r, e, sizeof e);
            ps_printable(e);
            s = ps_errf(c->err, sizeof c->err, PS_ERR_NET,
                        sent ? "%s: the shard sent was refused: %s" : "%s cannot take its shard: %s", name,
                        r.bad ? "(malformed error message)" : e);
            close(fd);
            return s;
        }
        uint64_t from = ps_rbuf_u64(&r);
        if (type != PS_MSG_SEND_SHARD || r.bad || r.off != len || from > pl.bytes || ++asks > 2) {
            s = ps_errf(e, sizeof e, PS_ERR_PROTOCOL, "answered PLACE with message type %u (%u bytes)%s", type, len,
                        asks > 2 ? ", asking for the shard a third time" : "");
            break;
        }
        sent = true;
        if ((s = send_shard(c, k, fd, from, pl.bytes, name))) {
            close(fd);
            return s;
        }
    }
    close(fd);
    if (s) return ps_errf(c->err, sizeof c->err, s, "%s: %s", name, e);
    return PS_OK;
}

/* Connects, authenticates and sets up worker k; its next stage is already set up. */
static ps_status connect_stage(ps_coord *c, int k) {
    stage_view *v = &c->st[k];
    const ps_fleet_stage *fs = &c->fleet.stages[k];
    char name[300];
    stage_name(c, k, name, sizeof name);
    char e[500];
    ps_status s = ps_net_dial(fs->address, c->o.timeout_ms, &v->conn, e, sizeof e);
    expect ex = {c, k, false};
    ps_hello peer;
    uint32_t limit =
        ps_mb_max_bytes(ps_stage_model(c->stage0)->hp.dim, c->max_mb, c->max_segs, c->o.max_draft, ps_coord_n_ctx(c));
    if (!s)
        s = ps_net_handshake_client(v->conn, c->o.key, &c->me, check_worker, &ex, limit, c->o.timeout_ms, &peer, e,
                                    sizeof e);
    if (s) return ps_errf(c->err, sizeof c->err, s, "%s: %s", name, e);
    if (ex.place && (s = place_stage(c, k, name))) return s;
    c->wb.len = 0;
    ps_wbuf_u64(&c->wb, c->me.session);
    ps_wbuf_i32(&c->wb, ps_stage_n_ctx(c->stage0));
    ps_wbuf_i32(&c->wb, c->o.max_batch);
    ps_wbuf_i32(&c->wb, c->max_mb);
    ps_wbuf_u8(&c->wb, (uint8_t)c->o.act);
    ps_wbuf_str(&c->wb, k + 1 < c->n ? c->fleet.stages[k + 1].address : "");
    ps_wbuf_i32(&c->wb, c->n_blocks);
    ps_wbuf_i32(&c->wb, c->max_segs);
    ps_wbuf_i32(&c->wb, c->o.max_draft);
    struct iovec iov = {c->wb.p, c->wb.len};
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    if ((s = ps_conn_send(v->conn, PS_MSG_SETUP, &iov, 1, c->o.timeout_ms, e, sizeof e)) ||
        (s = ps_conn_recv(v->conn, c->o.timeout_ms, &type, &p, &len, e, sizeof e)))
        return ps_errf(c->err, sizeof c->err, s, "%s: %s", name, e);
    if (type == PS_MSG_ERROR) {
        ps_rbuf r = {.p = p, .len = len};
        ps_rbuf_u8(&r);
        ps_rbuf_str(&r, e, sizeof e);
        ps_printable(e);
        return ps_errf(c->err, sizeof c->err, PS_ERR_NET, "%s could not start the session: %s", name,
                       r.bad ? "(malformed error message)" : e);
    }
    if (type != PS_MSG_READY)
        return ps_errf(c->err, sizeof c->err, PS_ERR_PROTOCOL, "%s answered SETUP with message type %u", name, type);
    if (k == 1 && c->o.host_hops) snprintf(c->hop_why, sizeof c->hop_why, "by TCP (--host-hops)");
    if (k == 1 && !c->o.host_hops &&
        (s = ps_dhop_offer(&c->hop, v->conn, c->stage0, c->o.timeout_ms, c->hop_why, sizeof c->hop_why, e, sizeof e)))
        return ps_errf(c->err, sizeof c->err, s, "%s: %s", name, e);
    v->fail = FAIL_NONE, v->why[0] = 0;
    memset(&v->cur, 0, sizeof v->cur), memset(&v->base, 0, sizeof v->base);
    return PS_OK;
}

/* Starts a session on every worker, last stage first (each connects to its next). */
static ps_status connect_fleet(ps_coord *c) {
    if (getrandom(&c->me.session, sizeof c->me.session, 0) != sizeof c->me.session || !c->me.session)
        c->me.session = (uint64_t)now_ms() | 1;
    c->mb = 0, c->n_pending = 0, c->got = false;
    memset(&c->st[0].base.hop, 0, sizeof c->st[0].base.hop);
    for (int k = c->n - 1; k >= 1; k--) {
        /* after a failure, a stage that stalled, or that cannot be reached (or does not answer),
           gets a standby in its place, sent its shard (stage k-1, connected after, learns the
           new address); one that died may have been restarted: it is tried first */
        bool stalled = c->stalled_stage == k && c->next_standby < c->o.n_standby;
        ps_status s = stalled ? PS_ERR_TIMEOUT : connect_stage(c, k);
        while (s && c->failures && c->next_standby < c->o.n_standby && (s == PS_ERR_NET || s == PS_ERR_TIMEOUT)) {
            const char *addr = c->standby[c->next_standby++];
            ps_progress_report(&c->o.progress, "a standby takes the failed stage's place", 0, 0);
            snprintf(c->fleet.stages[k].address, sizeof c->fleet.stages[k].address, "%s", addr);
            disconnect_stage(c, k);
            s = connect_stage(c, k);
        }
        if (stalled) c->stalled_stage = 0;
        if (s) {
            disconnect(c, false);
            return s;
        }
    }
    ps_status s = ps_conn_start_sender(c->st[1].conn, &c->o.sim, c->err, sizeof c->err);
    if (s) {
        disconnect(c, false);
        return s;
    }
    ps_conn_reset_stats(c->st[1].conn);
    c->connected = true;
    if (c->failed_at) c->recoveries++, c->recovery_ms += now_ms() - c->failed_at, c->failed_at = 0;
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Waiting for the last stage

/* Handles one frame from worker k, read within ms: the answer to micro-batch want_mb
 * (TOKENS: sets c->got and c->res), a PROBE answer about want_mb, or an ERROR; anything
 * else is a failure of k. */
static void on_frame(ps_coord *c, int k, uint32_t want_mb, int ms) {
    stage_view *v = &c->st[k];
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    ps_status s = ps_conn_recv(v->conn, ms, &type, &p, &len, v->why, sizeof v->why);
    if (s) {
        v->fail = s == PS_ERR_AUTH ? FAIL_SELF : FAIL_DEAD; /* a frame that fails to open: no hang-up */
        return;
    }
    ps_rbuf r = {.p = p, .len = len};
    if (type == PS_MSG_TOKENS && k == c->n - 1) {
        uint32_t mb;
        int n_stats;
        ps_stage_stat stats[PS_SHARD_MAX_STAGES];
        char e[200];
        if (!ps_result_decode(p, len, ps_stage_model(c->stage0)->hp.vocab, &mb, c->res, c->max_res, &c->n_res, stats,
                              &n_stats, e, sizeof e) &&
            mb == want_mb) {
            for (int i = 0; i < n_stats; i++)
                if (stats[i].stage > 0 && stats[i].stage < c->n) c->st[stats[i].stage].cur = stats[i];
            c->got = true;
            return;
        }
    } else if (type == PS_MSG_STATS) {
        int32_t stage = ps_rbuf_i32(&r);
        uint32_t done = ps_rbuf_u32(&r), mb = ps_rbuf_u32(&r);
        if (!r.bad && r.off == len && stage == k) {
            v->probe = done && mb >= want_mb ? PROBE_DONE : PROBE_BEHIND;
            return;
        }
    } else if (type == PS_MSG_KV_DONE && v->kv == KV_WAIT) {
        uint8_t refused = ps_rbuf_u8(&r);
        ps_rbuf_str(&r, v->kv_why, sizeof v->kv_why);
        ps_printable(v->kv_why);
        if (!r.bad && r.off == len && refused <= 1) {
            v->kv = refused ? KV_REFUSED : KV_DONE;
            return;
        }
    } else if (type == PS_MSG_ERROR) {
        uint8_t kind = ps_rbuf_u8(&r);
        ps_rbuf_str(&r, v->why, sizeof v->why);
        ps_printable(v->why);
        v->fail = r.bad || kind > PS_ERR_KIND_NEXT ? FAIL_SELF : FAIL_SELF + kind;
        return;
    }
    v->fail = FAIL_SELF;
    snprintf(v->why, sizeof v->why, "sent a malformed or unexpected message (type %u, %u bytes)", type, len);
}

static bool never(const ps_coord *c) {
    (void)c;
    return false;
}

/* The connections of the workers that have not failed, to poll for reading, into fds (and their
 * stages into ks, when not NULL); returns how many. */
static int live_fds(const ps_coord *c, struct pollfd *fds, int *ks) {
    int m = 0;
    for (int k = 1; k < c->n; k++) {
        if (c->st[k].fail) continue;
        if (ks) ks[m] = k;
        fds[m++] = (struct pollfd){ps_conn_fd(c->st[k].conn), POLLIN, 0};
    }
    return m;
}

/* Polls the connections of the workers that have not failed for up to ms, handling what
 * arrives; stops early when done(c) holds, or (unless done is `never`: the grace period
 * after a failure, when the others' reports are collected) when a worker fails. A failed
 * worker is not polled again: its first report stands (the hang-up that follows an ERROR
 * must not turn it into "died"). Returns false when a worker failed. */
static bool pump(ps_coord *c, double ms, uint32_t want_mb, bool (*done)(const ps_coord *c)) {
    double end = now_ms() + ms;
    for (double left; (left = end - now_ms()) > 0 && !done(c);) {
        struct pollfd fds[PS_SHARD_MAX_STAGES];
        int ks[PS_SHARD_MAX_STAGES], m = live_fds(c, fds, ks);
        int r = m ? poll(fds, (nfds_t)m, (int)left + 1) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        ps_pool_wake(ps_stage_pool(c->stage0)); /* likely the token: stage 0 runs next */
        for (int i = 0; i < m; i++)             /* within what is left: a worker dripping a frame cannot stretch it */
            if (fds[i].revents) on_frame(c, ks[i], want_mb, (int)fmax(1, end - now_ms()));
        for (int k = 1; done != never && k < c->n; k++)
            if (c->st[k].fail) return false;
    }
    for (int k = 1; k < c->n; k++)
        if (c->st[k].fail) return false;
    return true;
}

/* After a first failure, listens to the other workers for a moment, then writes the
 * error that names the culprit: a stage that died, else one that failed by itself, else
 * the neighbour a stage lost. */
static ps_status blame(ps_coord *c) {
    pump(c, 300, UINT32_MAX, never);
    char name[300];
    for (int want = FAIL_DEAD; want <= FAIL_NEXT; want++)
        for (int k = 1; k < c->n; k++) {
            const stage_view *v = &c->st[k];
            if (v->fail != want) continue;
            int culprit = want == FAIL_PREV ? k - 1 : want == FAIL_NEXT ? k + 1 : k;
            if (culprit < 0 || culprit >= c->n) culprit = k;
            stage_name(c, culprit, name, sizeof name);
            if (want == FAIL_DEAD)
                ps_errf(c->err, sizeof c->err, PS_ERR_NET, "%s failed: %s (did the worker stop?)", name, v->why);
            else if (want == FAIL_SELF)
                ps_errf(c->err, sizeof c->err, PS_ERR_NET, "%s failed: %s", name, v->why);
            else
                ps_errf(c->err, sizeof c->err, PS_ERR_NET, "%s failed: stage %d lost it: %s", name, k, v->why);
            disconnect(c, false);
            return PS_ERR_NET;
        }
    disconnect(c, false);
    return ps_errf(c->err, sizeof c->err, PS_ERR_NET, "the fleet failed for no reason a worker gave");
}

static bool all_probed(const ps_coord *c) {
    for (int k = 1; k < c->n; k++)
        if (c->st[k].probe == PROBE_SILENT) return false;
    return true;
}

/* The ring has been silent for the whole timeout: asks every worker which micro-batch it
 * finished last. The first stage (in ring order) that has not finished want_mb, or does
 * not answer within a second, is the one that stalled. */
static ps_status stalled(ps_coord *c, uint32_t want_mb) {
    for (int k = 1; k < c->n; k++) {
        c->st[k].probe = PROBE_SILENT;
        ps_conn_send(c->st[k].conn, PS_MSG_PROBE, NULL, 0, 1000, NULL, 0);
    }
    if (!pump(c, 1000, want_mb, all_probed)) return blame(c);
    int k = 1;
    while (k < c->n - 1 && c->st[k].probe == PROBE_DONE) k++;
    char name[300];
    ps_errf(c->err, sizeof c->err, PS_ERR_TIMEOUT, "%s did not answer within %.1f s (stalled?)",
            stage_name(c, k, name, sizeof name), c->o.timeout_ms / 1e3);
    c->stalled_stage = k;
    disconnect(c, false);
    return PS_ERR_TIMEOUT;
}

static bool have_answer(const ps_coord *c) { return c->got; }

/* Waits for the answer to micro-batch want_mb, watching every worker. */
static ps_status wait_answer(ps_coord *c, uint32_t want_mb) {
    c->got = false;
    if (!pump(c, c->o.timeout_ms, want_mb, have_answer)) return blame(c);
    if (!c->got) return stalled(c, want_mb);
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Public API

/* Checks the stage-0 shard's metadata against the fleet. */
static ps_status check_stage0(ps_coord *c, char *err, size_t errlen) {
    const ps_model *m = ps_stage_model(c->stage0);
    const ps_fleet_stage *fs = &c->fleet.stages[0];
    const ps_shard_meta *sm = &m->shard;
    if (!c->o.fleet) return PS_OK;
    if (!sm->present || sm->stage_index != 0 || sm->stage_count != c->n || strcmp(sm->model_fp, c->fleet.model_fp) ||
        m->layer_begin != fs->layer_begin || m->layer_end != fs->layer_end ||
        (fs->fingerprint[0] && strcmp(sm->shard_fp, fs->fingerprint)))
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "%s is not the stage-0 shard fleet.json describes (stage %d of %d, layers "
                       "%d..%d, model %s)",
                       fs->shard, sm->stage_index, sm->stage_count, m->layer_begin, m->layer_end, sm->model_fp);
    return PS_OK;
}

/* See coord.h. A file that does not open is left to the loader, whose message is the more
 * precise; running out of memory is not. */
ps_status ps_coord_refuse_shard(const char *path, char *err, size_t errlen) {
    ps_gguf *g = NULL;
    ps_shard_meta sm = {0};
    ps_status s = ps_gguf_open(path, &g, err, errlen);
    if (!s) s = ps_shard_meta_read(g, &sm, err, errlen);
    ps_gguf_close(g);
    if (s == PS_ERR_NOMEM) return s;
    if (s || !sm.present) return ps_errf(err, errlen, PS_OK, "%s", ""); /* no stale message */
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0; /* fleet.json is written next to the shards */
    if (sm.stage_index == 0)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "'%s' is shard 0 of %d (layers %d..%d) of a split model: run the fleet with "
                       "`pipeshard run --fleet %.*sfleet.json` (stage 0 runs in that process, the others on "
                       "`pipeshard worker --shard` processes)",
                       path, sm.stage_count, sm.layer_begin, sm.layer_end, dir_len, path);
    return ps_errf(err, errlen, PS_ERR_ARG,
                   "'%s' is shard %d of %d (layers %d..%d) of a split model: serve it with `pipeshard worker "
                   "--shard %s`, and run the fleet with `pipeshard run --fleet %.*sfleet.json`",
                   path, sm.stage_index, sm.stage_count, sm.layer_begin, sm.layer_end, path, dir_len, path);
}

ps_status ps_coord_create(const ps_coord_opts *o, ps_coord **out, char *err, size_t errlen) {
    *out = NULL;
    if (!o->fleet && o->model) {
        ps_status s = ps_coord_refuse_shard(o->model, err, errlen);
        if (s) return s;
    }
    ps_coord *c = ps_calloc(1, sizeof *c);
    if (!c) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    c->o = *o;
    if (o->key) memcpy(c->key, o->key, sizeof c->key), c->o.key = c->key;
    c->o.n_standby = o->n_standby < PS_SHARD_MAX_STAGES ? o->n_standby : PS_SHARD_MAX_STAGES;
    for (int i = 0; i < c->o.n_standby; i++) snprintf(c->standby[i], sizeof c->standby[i], "%s", o->standby[i]);
    c->o.standby = NULL; /* the copies above */
    if (o->fleet) {
        c->fleet = *o->fleet;
    } else {
        c->fleet.n_stages = 1;
        snprintf(c->fleet.stages[0].shard, sizeof c->fleet.stages[0].shard, "%s", o->model);
        snprintf(c->fleet.stages[0].address, sizeof c->fleet.stages[0].address, "local");
    }
    c->n = c->fleet.n_stages;
    ps_stage_opts so = {.threads = o->threads, .pin = o->pin, .mmap = o->mmap, .device = o->device};
    ps_status s = ps_stage_open(c->fleet.stages[0].shard, &so, &c->stage0, err, errlen);
    if (!s) s = check_stage0(c, err, errlen);
    if (s) goto fail;
    const ps_model *m = ps_stage_model(c->stage0);
    if (!o->fleet && !m->has_head) {
        s = ps_errf(err, errlen, PS_ERR_ARG, "%s is a shard (layers %d..%d of %d); run a fleet with --fleet FLEET.json",
                    o->model, m->layer_begin, m->layer_end, m->hp.n_layer);
        goto fail;
    }
    int n_ctx = o->n_ctx ? o->n_ctx : (m->hp.ctx_train < 4096 ? m->hp.ctx_train : 4096);
    int seq_blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    c->max_mb = o->prefill_chunk ? o->prefill_chunk : o->max_batch;
    c->max_segs = o->max_segs ? o->max_segs : 1;
    if (c->max_mb > n_ctx * c->max_segs) c->max_mb = n_ctx * c->max_segs;
    c->n_blocks = o->n_blocks ? o->n_blocks : seq_blocks * (o->parallel > 1 ? o->parallel : 1);
    if (c->n_blocks < seq_blocks) c->n_blocks = seq_blocks;
    ps_ctx_params cp = {.n_ctx = n_ctx, .n_blocks = c->n_blocks, .max_batch = o->max_batch, .act = o->act};
    if (o->max_draft < 0 || o->max_draft > PS_MAX_DRAFT || o->max_draft >= c->max_mb) {
        s = ps_errf(err, errlen, PS_ERR_ARG,
                    "%d draft tokens per trip: at most %d, and fewer than the %d positions of a micro-batch (-b, "
                    "--prefill-chunk)",
                    o->max_draft, PS_MAX_DRAFT, c->max_mb);
        goto fail;
    }
    c->max_res = ps_mb_max_results(c->max_mb, c->max_segs, o->max_draft);
    if ((s = ps_stage_begin(c->stage0, &cp, c->max_mb, c->max_segs, o->max_draft, err, errlen))) goto fail;
    c->hist = ps_malloc((size_t)n_ctx * sizeof *c->hist);
    c->ident = ps_malloc((size_t)seq_blocks * sizeof *c->ident);
    c->res = ps_malloc((size_t)c->max_res * sizeof *c->res);
    c->res1 = ps_malloc((size_t)c->max_res * sizeof *c->res1);
    c->segs = ps_malloc((size_t)c->max_segs * sizeof *c->segs);
    c->toks = ps_malloc((size_t)c->max_mb * sizeof *c->toks);
    if (!c->hist || !c->ident || !c->res || !c->res1 || !c->segs || !c->toks) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < seq_blocks; i++) c->ident[i] = i;
    const ps_shard_meta *sm = &m->shard;
    c->me = (ps_hello){.role = PS_ROLE_COORD,
                       .stage = 0,
                       .stage_count = c->n,
                       .layer_begin = m->layer_begin,
                       .layer_end = m->layer_end,
                       .n_layer = m->hp.n_layer,
                       .plain = o->plain};
    snprintf(c->me.model_fp, sizeof c->me.model_fp, "%s", sm->model_fp);
    snprintf(c->me.shard_fp, sizeof c->me.shard_fp, "%s", sm->shard_fp);
    *out = c;
    return PS_OK;
fail:
    ps_coord_free(c);
    return s;
}

void ps_coord_free(ps_coord *c) {
    if (!c) return;
    if (c->connected) disconnect(c, true);
    ps_stage_free(c->stage0);
    ps_wbuf_free(&c->wb);
    free(c->hist), free(c->ident), free(c->res), free(c->res1), free(c->segs), free(c->toks);
    free(c);
}

ps_status ps_coord_connect(ps_coord *c, char *err, size_t errlen) {
    if (c->n == 1 || c->connected) return PS_OK;
    ps_status s = connect_fleet(c);
    if (s) ps_errf(err, errlen, s, "%s", c->err);
    return s;
}

const ps_model *ps_coord_model(const ps_coord *c) { return ps_stage_model(c->stage0); }
ps_status ps_coord_model_fp(ps_coord *c, char out[33], char *err, size_t errlen) {
    return ps_stage_model_fp(c->stage0, out, err, errlen);
}
int ps_coord_n_ctx(const ps_coord *c) { return ps_stage_n_ctx(c->stage0); }
int ps_coord_n_stages(const ps_coord *c) { return c->n; }
const char *ps_coord_stage_address(const ps_coord *c, int k) { return k ? c->fleet.stages[k].address : "local"; }
int ps_coord_max_rows(const ps_coord *c) { return c->max_mb; }
int ps_coord_max_segs(const ps_coord *c) { return c->max_segs; }
int ps_coord_max_results(const ps_coord *c) { return c->max_res; }
int ps_coord_max_draft(const ps_coord *c) { return c->o.max_draft; }
int ps_coord_n_blocks(const ps_coord *c) { return c->n_blocks; }
int ps_coord_pending(const ps_coord *c) { return c->n_pending; }
const char *ps_coord_hop0(const ps_coord *c) { return c->n > 1 && c->connected ? c->hop_why : ""; }
bool ps_coord_connected(const ps_coord *c) { return c->n == 1 || c->connected; }
const float *ps_coord_logits(const ps_coord *c) { return c->n == 1 ? ps_stage_logits(c->stage0) : NULL; }

/* Runs the micro-batch in c->segs / c->toks through stage 0 and sends it on (on one stage,
 * keeps its results for ps_coord_recv). */
static ps_status run_and_send(ps_coord *c, int n_segs, int rows, bool sample) {
    ps_mb mb = {.mb = c->mb++, .n_segs = n_segs, .segs = c->segs, .n = rows, .tokens = c->toks};
    const float *x = NULL;
    double t0 = now_ms();
    int n_res = 0;
    ps_status s = c->hop.ring ? ps_dhop_run(&c->hop, c->stage0, &mb, c->o.timeout_ms, c->err, sizeof c->err)
                              : ps_stage_run(c->stage0, &mb, &x, c->res, &n_res, c->err, sizeof c->err);
    if (s == PS_ERR_NET && c->hop.ring) { /* stage 1's process has exited: a failure of stage 1 */
        c->st[1].fail = FAIL_DEAD;
        snprintf(c->st[1].why, sizeof c->st[1].why, "its process has exited");
        return blame(c);
    }
    if (s) return s;
    double t1 = now_ms();
    c->st[0].cur.compute_ms += t1 - t0;
    if (c->n == 1) {
        c->n_res = n_res, c->got = true;
        if (sample) c->pending[c->n_pending++] = mb.mb;
        return PS_OK;
    }
    if (sample) ps_pool_park(ps_stage_pool(c->stage0)); /* before the send: see worker.c */
    struct iovec iov[2];
    if (!c->hop.ring) mb.x = x;
    ps_mb_encode(&c->wb, &mb, ps_stage_model(c->stage0)->hp.dim, iov);
    if (c->wb.oom) return ps_errf(c->err, sizeof c->err, PS_ERR_NOMEM, "out of memory");
    char e[400];
    if ((s = ps_conn_send_async(c->st[1].conn, PS_MSG_FORWARD, iov, 2, c->o.timeout_ms, e, sizeof e))) {
        c->st[1].fail = FAIL_DEAD;
        snprintf(c->st[1].why, sizeof c->st[1].why, "%s", e);
        return blame(c);
    }
    if (sample) c->sent_at[c->n_pending] = t1, c->pending[c->n_pending++] = mb.mb;
    return PS_OK;
}

ps_status ps_coord_send(ps_coord *c, const ps_coord_seg *segs, int n_segs, bool *reconnected, char *err,
                        size_t errlen) {
    c->err[0] = 0;
    *reconnected = false;
    int rows = 0;
    bool sample = false;
    if (n_segs < 1 || n_segs > c->max_segs)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d sequences in a micro-batch (1..%d)", n_segs, c->max_segs);
    for (int i = 0; i < n_segs; i++) {
        const ps_coord_seg *g = &segs[i];
        if (g->n < 1 || g->n > c->max_mb - rows)
            return ps_errf(err, errlen, PS_ERR_ARG, "micro-batch of more than %d positions", c->max_mb);
        if (g->n_draft < 0 || g->n_draft > c->o.max_draft || (g->n_draft && (!g->sample || g->n_draft >= g->n)))
            return ps_errf(err, errlen, PS_ERR_ARG, "%d draft tokens in a segment of %d positions (at most %d)",
                           g->n_draft, g->n, c->o.max_draft);
        c->segs[i] = (ps_mb_seg){.seq = g->seq,
                                 .pos = g->pos,
                                 .n = g->n,
                                 .flags = (g->sample ? PS_MB_SAMPLE : 0) | (g->n_top >= 0 ? PS_MB_LOGPROBS : 0) |
                                          (g->n_draft && g->dist ? PS_MB_DRAFT_DIST : 0),
                                 .n_top = g->n_top > 0 ? (uint32_t)g->n_top : 0,
                                 .sp = g->sp,
                                 .n_blocks = g->n_blocks,
                                 .blocks = g->blocks,
                                 .n_draft = (uint32_t)g->n_draft,
                                 .dist = g->n_draft ? g->dist : NULL};
        memcpy(c->toks + rows, g->tokens, (size_t)g->n * sizeof(int32_t));
        rows += g->n;
        sample |= g->sample;
    }
    if (c->n_pending == (c->n == 1 ? 1 : MAX_PENDING))
        return ps_errf(err, errlen, PS_ERR_ARG, "%d micro-batches await their tokens already", c->n_pending);
    ps_status s = PS_OK;
    if (c->n > 1 && !c->connected) {
        if ((s = connect_fleet(c))) goto out;
        *reconnected = true; /* a new session: the workers' KV is empty */
    }
    s = run_and_send(c, n_segs, rows, sample);
out:
    if (s) ps_errf(err, errlen, s, "%s", c->err[0] ? c->err : ps_strerror(s));
    return s;
}

bool ps_coord_heard(ps_coord *c) {
    if (!c->connected) return false;
    struct pollfd fds[PS_SHARD_MAX_STAGES];
    int m = live_fds(c, fds, NULL); /* frames are read whole (frame.c): nothing waits in a buffer */
    return m && poll(fds, (nfds_t)m, 0) > 0;
}

ps_status ps_coord_recv(ps_coord *c, ps_result *res, int *n_res, char *err, size_t errlen) {
    *n_res = 0;
    c->err[0] = 0;
    if (!c->n_pending) return ps_errf(err, errlen, PS_ERR_ARG, "no micro-batch awaits its tokens");
    ps_status s = PS_OK;
    if (c->n > 1) {
        s = wait_answer(c, c->pending[0]);
        c->wait_ms += now_ms() - c->sent_at[0]; /* with several in flight, the waits overlap */
        if (s) {
            c->n_pending = 0;
            return ps_errf(err, errlen, s, "%s", c->err[0] ? c->err : ps_strerror(s));
        }
    }
    c->n_pending--;
    memmove(c->pending, c->pending + 1, (size_t)c->n_pending * sizeof *c->pending);
    memmove(c->sent_at, c->sent_at + 1, (size_t)c->n_pending * sizeof *c->sent_at);
    memcpy(res, c->res, (size_t)c->n_res * sizeof *res);
    *n_res = c->n_res;
    c->got = false;
    return PS_OK;
}

static bool all_kv(const ps_coord *c) {
    for (int k = 1; k < c->n; k++)
        if (c->st[k].kv == KV_WAIT) return false;
    return true;
}

ps_status ps_coord_kv(ps_coord *c, bool save, const char *dir, const ps_kv_msg *m, char *err, size_t errlen) {
    if (c->n_pending) return ps_errf(err, errlen, PS_ERR_INTERNAL, "prefix files with micro-batches in flight");
    if (!ps_coord_connected(c)) return ps_errf(err, errlen, PS_ERR_NET, "the fleet is not connected");
    ps_kv_msg_encode(&c->wb, m);
    if (c->wb.oom) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    struct iovec iov = {c->wb.p, c->wb.len};
    for (int k = 1; k < c->n; k++) {
        c->st[k].kv = KV_WAIT;
        if (ps_conn_send(c->st[k].conn, save ? PS_MSG_KV_SAVE : PS_MSG_KV_LOAD, &iov, 1, c->o.timeout_ms, c->st[k].why,
                         sizeof c->st[k].why))
            c->st[k].fail = FAIL_DEAD;
    }
    char path[4200], why0[1024] = "", name[300];
    ps_kv_file_path(path, sizeof path, dir, m->id, 0); /* stage 0's part, while the workers do theirs */
    ps_status s = save ? ps_stage_kv_save(c->stage0, path, m->id, m->blocks, m->n, m->tokens, why0, sizeof why0)
                       : ps_stage_kv_load(c->stage0, path, m->id, m->blocks, m->n, m->tokens, why0, sizeof why0);
    if (s) ps_errf(err, errlen, s, "%s: %s", stage_name(c, 0, name, sizeof name), why0);
    if (!pump(c, c->o.timeout_ms, UINT32_MAX, all_kv)) {
        s = blame(c);
        ps_errf(err, errlen, s, "%s", c->err);
    }
    for (int k = 1; c->connected && k < c->n; k++) {
        stage_view *v = &c->st[k];
        if (v->kv == KV_WAIT) {
            s = ps_errf(err, errlen, PS_ERR_TIMEOUT, "%s did not answer within %.1f s",
                        stage_name(c, k, name, sizeof name), c->o.timeout_ms / 1e3);
            disconnect(c, false);
        } else if (v->kv == KV_REFUSED && !s) {
            s = ps_errf(err, errlen, PS_ERR_ARG, "%s: %s", stage_name(c, k, name, sizeof name), v->kv_why);
        }
    }
    for (int k = 1; k < c->n; k++) c->st[k].kv = KV_IDLE;
    return s;
}

ps_status ps_coord_next(ps_coord *c, const int32_t *tokens, int n, int pos, const ps_sample_params *sp, int32_t *token,
                        char *err, size_t errlen) {
    int n_out;
    return ps_coord_next_draft(c, tokens, n, pos, 0, NULL, sp, NULL, NULL, token, &n_out, err, errlen);
}

ps_status ps_coord_next_draft(ps_coord *c, const int32_t *tokens, int n, int pos, int n_draft,
                              const ps_draft_dist *dist, const ps_sample_params *sp, void (*meanwhile)(void *arg),
                              void *arg, int32_t *out, int *n_out, char *err, size_t errlen) {
    *n_out = 0, out[0] = -1;
    if (n < 1 || pos < 0 || (long long)pos + n > ps_coord_n_ctx(c))
        return ps_errf(err, errlen, PS_ERR_RANGE, "%d tokens at position %d do not fit the context of %d", n, pos,
                       ps_coord_n_ctx(c));
    if (n_draft < 0 || n_draft >= n || n_draft > c->o.max_draft)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d draft tokens among %d (at most %d)", n_draft, n, c->o.max_draft);
    memcpy(c->hist + pos, tokens, (size_t)n * sizeof *tokens);
    ps_coord_seg g = {.seq = 1,
                      .blocks = c->ident,
                      .n_blocks = (ps_coord_n_ctx(c) + PS_KV_BLOCK - 1) / PS_KV_BLOCK,
                      .n_top = -1,
                      .sp = *sp};
    int end = pos + n, tail = n_draft + 1; /* the last micro-batch holds the draft and the token before */
    char first[600] = "";                  /* the failure's own message, kept for when recovering fails too */
    for (int attempt = 0;; attempt++) {
        int from = pos;
        ps_status s = PS_OK;
        if (c->n > 1 && !c->connected) {
            s = ps_coord_connect(c, err, errlen);
            from = 0; /* fresh workers: replay the sequence from the start */
        }
        while (!s && from < end) {
            g.pos = from, g.n = end - from < c->max_mb ? end - from : c->max_mb, g.tokens = c->hist + from;
            if (from + g.n < end && end - (from + g.n) < tail) g.n = end - from - tail;
            g.sample = from + g.n == end;
            g.n_draft = g.sample ? n_draft : 0, g.dist = g.sample ? dist : NULL;
            bool fresh;
            s = ps_coord_send(c, &g, 1, &fresh, err, errlen);
            from += g.n;
            if (!s && end - pos > c->max_mb)
                ps_progress_report(&c->o.progress, "prompt", (uint64_t)(from - pos), (uint64_t)n);
        }
        if (!s && meanwhile && !attempt) meanwhile(arg); /* the ring has the trip: stage 0's threads are free */
        if (!s) s = ps_coord_recv(c, c->res1, n_out, err, errlen);
        if (!s) {
            for (int i = 0; i < *n_out; i++) out[i] = c->res1[i].token;
            return PS_OK;
        }
        /* A stage died, stalled or dropped the session: while standbys last, reconnect (the
           worker restarted at its address, or a standby in the place of a stage that is gone)
           and replay the sequence: its tokens are the coordinator's, and the same tokens give
           the same bits (DESIGN.md, invariants 1 and 3). Without one: the failure's error. */
        bool again = (s == PS_ERR_NET || s == PS_ERR_TIMEOUT) && c->n > 1 && c->next_standby < c->o.n_standby;
        if (!again && attempt) {
            char last[600];
            snprintf(last, sizeof last, "%s", err);
            return ps_errf(err, errlen, s, "%s; recovering failed: %s", first, last);
        }
        if (!again) return s;
        if (c->connected) disconnect(c, false);
        if (!attempt) snprintf(first, sizeof first, "%s", err);
    }
}

/* Stage 0's hop is the coordinator's own connection to stage 1. */
static void refresh_stage0(ps_coord *c) {
    if (c->n > 1 && c->st[1].conn) ps_conn_get_stats(c->st[1].conn, &c->st[0].cur.hop);
}

double ps_coord_ring_overhead_ms(const ps_coord_stats *st) {
    double workers = 0;
    for (int k = 1; k < st->n_stages; k++) workers += st->compute_ms[k];
    return st->wait_ms - workers;
}

void ps_coord_get_stats(ps_coord *c, ps_coord_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_stages = c->n;
    out->wait_ms = c->wait_ms - c->wait_base;
    out->failures = c->failures, out->recoveries = c->recoveries, out->recovery_ms = c->recovery_ms;
    refresh_stage0(c);
    for (int k = 0; k < c->n; k++) {
        const ps_stage_stat *a = &c->st[k].cur, *b = &c->st[k].base;
        out->compute_ms[k] = a->compute_ms - b->compute_ms;
        out->hop[k] = (ps_conn_stats){a->hop.frames - b->hop.frames, a->hop.bytes - b->hop.bytes,
                                      a->hop.send_ms - b->hop.send_ms};
    }
}

double ps_coord_compute_s(ps_coord *c) {
    ps_coord_stats st;
    ps_coord_get_stats(c, &st);
    double ms = 0;
    for (int k = 0; k < st.n_stages; k++) ms += st.compute_ms[k];
    return ms / 1e3;
}

void ps_coord_reset_stats(ps_coord *c) {
    c->wait_base = c->wait_ms;
    refresh_stage0(c);
    for (int k = 0; k < c->n; k++) c->st[k].base = c->st[k].cur;
}
