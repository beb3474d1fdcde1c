/* stage.h - a stage executor and the messages that travel the ring.
 *
 * A ps_stage runs one stage (a shard, or a whole model as the only stage): its layers,
 * and on the last stage the head and the sampler. The same code serves stage 0 inside
 * the coordinator and every stage behind a worker socket, so a split model computes
 * exactly what the unsplit one does: the same kernels on the same f32 activations, the
 * same sampler fed the same (logits, history, params, position).
 *
 * The stage protocol (payloads of the frames of src/net/net.h, little-endian):
 *   SETUP   coordinator → worker: u64 session, i32 n_ctx, i32 max_batch, i32 max_mb,
 *           u8 activations (ps_act), str next ("" = the last stage: answer the coordinator)
 *   READY   worker → coordinator: empty (or ERROR with the reason)
 *   FORWARD stage k → stage k+1: a micro-batch (ps_mb_encode)
 *   TOKENS  last stage → coordinator: u64 seq, u32 mb, i32 position, i32 token, u32 n_stats,
 *           then n_stats stage stats (ps_stage_stat_encode)
 *   PROBE   coordinator → worker, when the ring is silent for too long: empty
 *   STATS   worker → coordinator, answering PROBE: i32 stage, u32 done (0/1), u32 mb (the
 *           latest micro-batch it finished)
 *   ERROR   worker → coordinator: u8 kind (ps_err_kind), str reason
 *   BYE     coordinator → worker: end of the session
 *
 * Shards that travel: a worker started with --cache (no --shard) says so in its hello
 * (PS_HELLO_TAKES_SHARDS). When its shard is not the one fleet.json names, the coordinator
 * places it, after the handshake and before SETUP:
 *   PLACE      coordinator → worker: str model_fp, str shard_fp, i32 stage, i32 stage_count,
 *              i32 layer_begin, i32 layer_end, i32 n_layer, u64 bytes (ps_place)
 *   PLACED     worker → coordinator: empty; the shard is loaded, SETUP may follow
 *   SEND_SHARD worker → coordinator: u64 offset; send bytes [offset, bytes) of the shard
 *              (offset > 0: the rest of a partial file kept from a transfer cut short)
 *   SHARD_DATA coordinator → worker: the next 1..PS_SHARD_CHUNK bytes of the shard file
 *   ERROR      worker → coordinator, instead of PLACED or SEND_SHARD: as above
 * The worker answers PLACE with PLACED when its cache holds the shard (checked as below), else
 * with SEND_SHARD; after the last byte it checks what it received (a GGUF shard whose metadata
 * is the offer's and whose recomputed fingerprint is the offered one) and answers PLACED,
 * SEND_SHARD {0} once more when a resumed file fails that check, or ERROR. */
#ifndef PS_STAGE_H
#define PS_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "../model/model.h"
#include "../net/net.h"
#include "../sample/sample.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "activations travel as little-endian f32: pipeshard needs a little-endian host"
#endif

/* Whose failure an ERROR reports: the coordinator blames a neighbour only when that
 * neighbour has not reported (or died) itself. */
enum { PS_ERR_KIND_SELF = 0, PS_ERR_KIND_PREV = 1, PS_ERR_KIND_NEXT = 2 };

// ---------------------------------------------------------------------------------------
// Micro-batches

enum { PS_MB_SAMPLE = 1 }; /* the last stage samples the token after the last position */

/* What a stage did in the session so far. Each stage appends its own to the micro-batch
 * it passes on, so the counters reach the coordinator with the token, at no extra hop. */
typedef struct {
    int32_t stage;
    double compute_ms; /* time in its forward passes */
    ps_conn_stats hop; /* its outgoing hop, cumulative (frames, bytes, send_ms) */
} ps_stage_stat;
#define PS_STAGE_STAT_BYTES 40
void ps_stage_stat_encode(ps_wbuf *b, const ps_stage_stat *st);
void ps_stage_stat_decode(ps_rbuf *r, ps_stage_stat *st);

/* One sequence's positions [pos, pos + n) on their way around the ring. Writing at pos
 * discards the sequence's KV beyond it on every stage. */
typedef struct {
    uint64_t seq;          /* sequence id */
    uint32_t mb;           /* micro-batch number in the session (stats, failure reports) */
    int32_t pos;           /* first position */
    int32_t n;             /* positions (>= 1) */
    uint32_t flags;        /* PS_MB_* */
    ps_sample_params sp;   /* used by the last stage when PS_MB_SAMPLE */
    const int32_t *tokens; /* (n) token ids: every stage sees them, the last keeps them
                              as the history the penalties look at */
    const float *x;        /* (n, dim) activations entering the stage; NULL into stage 0 */
    int32_t n_stats;       /* stats of the stages it went through */
    ps_stage_stat stats[PS_SHARD_MAX_STAGES];
} ps_mb;

/* Builds a FORWARD payload in b (restarted): the fields, the tokens, the stage stats,
 * then x (n × dim f32) when x is non-NULL. The x bytes are not copied when iov is given: iov[0] gets
 * b's bytes, iov[1] the activations, for ps_conn_send_async. */
void ps_mb_encode(ps_wbuf *b, const ps_mb *mb, int dim, struct iovec iov[2]);
/* The largest payload of a session's frames: a FORWARD of max_mb positions of dim-wide
 * activations with every stage's stats (and room to spare for the small messages). */
uint32_t ps_mb_max_bytes(int dim, int max_mb);
/* Parses a FORWARD payload; tokens and x point into it (x is NULL when it carries no
 * activations). Every count is checked against len, dim and max_n. */
ps_status ps_mb_decode(const uint8_t *p, size_t len, int dim, int max_n, ps_mb *out, char *err, size_t errlen);

// ---------------------------------------------------------------------------------------
// Placing a shard

#define PS_SHARD_CHUNK     (1u << 20)   /* most bytes of one SHARD_DATA frame */
#define PS_SHARD_MAX_BYTES (1ull << 48) /* a larger offered shard is refused */

/* The shard PLACE offers (validated by ps_place_decode). */
typedef struct {
    char model_fp[33], shard_fp[33]; /* 32 lowercase hex digits each */
    int32_t stage, stage_count;      /* 1 <= stage < stage_count <= PS_SHARD_MAX_STAGES */
    int32_t layer_begin, layer_end;  /* 0 < layer_begin < layer_end <= n_layer */
    int32_t n_layer;                 /* layers of the whole model */
    uint64_t bytes;                  /* the shard file's size, 1..PS_SHARD_MAX_BYTES */
} ps_place;

/* Builds a PLACE payload in b (restarted). */
void ps_place_encode(ps_wbuf *b, const ps_place *pl);
/* Parses and checks a PLACE payload: every field in range (stage 0, which runs in the
 * coordinator, and stage >= stage_count refused), ranges consistent with the stage
 * (only the last stage ends at n_layer), fingerprints 32 lowercase hex digits. */
ps_status ps_place_decode(const uint8_t *p, size_t len, ps_place *out, char *err, size_t errlen);

// ---------------------------------------------------------------------------------------
// The executor

typedef struct ps_stage ps_stage;

typedef struct {
    int threads; /* compute threads */
    bool pin;    /* pin them to CPUs (ps_pool_pin: the calling thread must be the one that runs the stage) */
    bool mmap;   /* map the file rather than read it into huge pages (ps_gguf_open_with) */
} ps_stage_opts;

/* Loads a model or shard and starts its threads. *out owned by the caller. */
ps_status ps_stage_open(const char *path, const ps_stage_opts *o, ps_stage **out, char *err, size_t errlen);
void ps_stage_free(ps_stage *s); /* NULL is a no-op */
const ps_model *ps_stage_model(const ps_stage *s);
ps_pool *ps_stage_pool(ps_stage *s);

/* (Re)makes the run state of a session: a context of p->n_ctx positions, and room for
 * micro-batches of up to max_mb positions. */
ps_status ps_stage_begin(ps_stage *s, const ps_ctx_params *p, int max_mb, char *err, size_t errlen);
int ps_stage_n_ctx(const ps_stage *s);
int ps_stage_max_mb(const ps_stage *s);

/* Runs a micro-batch. A stage without the head writes the activations for the next
 * stage to *x_out (n × dim, owned by s, valid until the next call). The last stage,
 * given PS_MB_SAMPLE, samples the token at position pos + n into *token (else -1). */
ps_status ps_stage_run(ps_stage *s, const ps_mb *mb, const float **x_out, int32_t *token, char *err, size_t errlen);
/* The logits the last stage's latest PS_MB_SAMPLE run sampled from (vocab floats). */
const float *ps_stage_logits(const ps_stage *s);

#endif
