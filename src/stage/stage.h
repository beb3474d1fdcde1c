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
 *           u8 activations (ps_act), str next ("" = the last stage: answer the coordinator),
 *           i32 n_blocks (the KV pool), i32 max_segs (sequences per micro-batch), i32 max_draft
 *           (draft tokens per segment, 0..PS_MAX_DRAFT)
 *   READY   worker → coordinator: empty (or ERROR with the reason)
 *   FORWARD stage k → stage k+1: a micro-batch (ps_mb_encode)
 *   TOKENS  last stage → coordinator: the sampled tokens of a micro-batch (ps_result_encode)
 *   PROBE   coordinator → worker, when the ring is silent for too long: empty
 *   STATS   worker → coordinator, answering PROBE: i32 stage, u32 done (0/1), u32 mb (the
 *           latest micro-batch it finished)
 *   ERROR   worker → coordinator: u8 kind (ps_err_kind), str reason
 *   BYE     coordinator → worker: end of the session
 *   DHOP    stage k → stage k+1, before the first FORWARD, from a GPU stage: str host (this
 *           boot's id, /proc/sys/kernel/random/boot_id)
 *   DHOP_REPLY stage k+1 → stage k: u8 1, i32 slots, u64 slot bytes, 64 bytes of a CUDA IPC
 *           handle (its ring: cuda.h's device hops), u64 its pid, u64 its start time (field 22
 *           of /proc/PID/stat), or u8 0, str why not (another host, a CPU stage, no memory);
 *           stage k then writes each micro-batch's activations into the ring, after checking
 *           that stage k+1's process lives (a pidfd), and sends the FORWARD without them
 *           (x_ring), or, refused, sends them as before
 *
 * A session's KV cache is a pool of n_blocks blocks of PS_KV_BLOCK positions on every
 * stage; the coordinator alone decides which blocks each sequence uses and sends the block
 * table with every segment. A stage reads only blocks written in the session (a new
 * session cannot read what an earlier one left).
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

enum {
    PS_MB_SAMPLE = 1,     /* the last stage samples the token after the segment's last position */
    PS_MB_LOGPROBS = 2,   /* ... and returns its log-probability and n_top others' */
    PS_MB_DRAFT_DIST = 4, /* its guesses were drawn from the distributions it carries (ps_mb_seg.dist) */
};

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

/* Most sequences in one micro-batch, and most top log-probabilities returned per token. */
#define PS_MB_MAX_SEGS      256
#define PS_MB_MAX_ROWS      65536 /* rows (positions) in one micro-batch */
#define PS_MAX_TOP_LOGPROBS 20
#define PS_MAX_DRAFT        16 /* draft tokens a segment may carry for verification */

/* One sequence's positions [pos, pos + n) in a micro-batch. Writing at pos discards the
 * sequence's KV beyond it (the next micro-batch may start anywhere up to pos + n). */
typedef struct {
    uint64_t seq;              /* sequence id (the coordinator's) */
    int32_t pos;               /* first position */
    int32_t n;                 /* positions (>= 1) */
    uint32_t flags;            /* PS_MB_* */
    uint32_t n_top;            /* with PS_MB_LOGPROBS: top log-probabilities to return (0..PS_MAX_TOP_LOGPROBS) */
    ps_sample_params sp;       /* used by the last stage when PS_MB_SAMPLE */
    int32_t n_blocks;          /* the sequence's block table: at least ceil((pos + n) / PS_KV_BLOCK) */
    const int32_t *blocks;     /* entries */
    uint32_t n_draft;          /* with PS_MB_SAMPLE: the segment's last n_draft tokens (< n, at most the
                                  session's max_draft) are a draft's guesses. The last stage checks them
                                  in turn and stops at the first it does not keep: it returns the guesses
                                  kept, then the token it sampled in place of the first one not kept (or,
                                  all kept, the one after them). The next segment of the sequence starts
                                  after the last guess kept, which discards the others' keys and values.
                                  A guess without a distribution (a draft that proposes one token per
                                  position) is kept when it is the token the last stage samples there as
                                  it would one token at a time: the tokens are those of plain decoding,
                                  and this is the rejection rule of Leviathan et al. for that draft. */
    const ps_draft_dist *dist; /* with PS_MB_DRAFT_DIST: (n_draft) the distributions the guesses were
                                  drawn from; the last stage keeps or replaces each by the rejection rule
                                  (ps_sample_verify), so the tokens are distributed as the model's */
} ps_mb_seg;

/* A micro-batch: the segments of one or more sequences, their rows in segment order. */
typedef struct {
    uint32_t mb;           /* micro-batch number in the session (stats, failure reports) */
    int32_t n_segs;        /* 1..PS_MB_MAX_SEGS */
    ps_mb_seg *segs;       /* (n_segs) */
    int32_t n;             /* rows: the sum of the segments' n */
    const int32_t *tokens; /* (n) token ids: every stage sees them, the last keeps them as
                              the history the penalties look at */
    const float *x;        /* (n, dim) activations entering the stage; NULL into stage 0 */
    bool x_ring;           /* x is not in the FORWARD message: the stage before wrote it into this
                              stage's ring in GPU memory (a device hop: DHOP below), where x points */
    int32_t n_stats;       /* stats of the stages it went through */
    ps_stage_stat stats[PS_SHARD_MAX_STAGES];
} ps_mb;

/* Builds a FORWARD payload in b (restarted): a header (u32 mb, i32 n_segs, i32 n, u32 dim
 * of x or 0, i32 n_stats, u32 flags: 1 = x_ring), per segment u64 seq, i32 pos, i32 n, u32
 * flags, u32 n_top, the sample parameters (f32 temperature, i32 top_k, f32 top_p, f32 min_p,
 * f32 repetition_penalty, i32 penalty_last_n, f32 presence, f32 frequency, u64 seed), i32
 * n_blocks, u32 n_draft and the block table, and with PS_MB_DRAFT_DIST its n_draft
 * ps_draft_dist (i32 n, 16 × i32 id, 16 × f32 p), then the tokens, the stage stats, then x (n ×
 * dim f32) when x is non-NULL and not in the ring. The x bytes are not copied when iov is
 * given: iov[0] gets b's bytes, iov[1] the activations, for ps_conn_send_async. */
void ps_mb_encode(ps_wbuf *b, const ps_mb *mb, int dim, struct iovec iov[2]);
/* The largest payload of a session's frames: a FORWARD of max_mb rows of dim-wide
 * activations in max_segs segments whose tables cover n_ctx positions, or the TOKENS of
 * such a micro-batch with up to max_draft guesses per segment, with every stage's stats (and
 * room to spare for the small messages). */
uint32_t ps_mb_max_bytes(int dim, int max_mb, int max_segs, int max_draft, int n_ctx);
/* The most results a micro-batch of max_mb rows in max_segs segments with up to max_draft
 * guesses each may have. */
int ps_mb_max_results(int max_mb, int max_segs, int max_draft);
/* Parses a FORWARD payload into *out, whose segs must have room for max_segs entries;
 * tokens, x, the block tables and the draft distributions point into the payload (x is NULL
 * when x_ring). Every count is checked against len, dim, max_n rows and max_segs. */
ps_status ps_mb_decode(const uint8_t *p, size_t len, int dim, int max_n, int max_segs, ps_mb *out, char *err,
                       size_t errlen);

/* What the last stage sampled for one segment: the token after its last position (a segment
 * with a draft: one result for each token it returns, in order). */
typedef struct {
    uint64_t seq;
    int32_t pos;    /* position of the sampled token (the segment's pos + n) */
    int32_t token;  /* sampled id */
    float logprob;  /* log-softmax of the raw logits at token */
    uint32_t n_top; /* top entries below (as the segment asked) */
    int32_t top_id[PS_MAX_TOP_LOGPROBS];
    float top_logprob[PS_MAX_TOP_LOGPROBS];
} ps_result;

/* A TOKENS payload: u32 mb, i32 n_results, i32 n_stats, per result u64 seq, i32 pos, i32
 * token, f32 logprob, u32 n_top and n_top × (i32 id, f32 logprob), then the stage stats. */
void ps_result_encode(ps_wbuf *b, uint32_t mb, const ps_result *res, int n_res, const ps_stage_stat *stats,
                      int n_stats);
/* Parses a TOKENS payload; res has room for max_res, stats for PS_SHARD_MAX_STAGES. Token
 * ids are checked against vocab. */
ps_status ps_result_decode(const uint8_t *p, size_t len, int vocab, uint32_t *mb, ps_result *res, int max_res,
                           int *n_res, ps_stage_stat *stats, int *n_stats, char *err, size_t errlen);

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
// Prefixes on disk

/* KV_SAVE and KV_LOAD: the keys and values of a prefix, blocks[0..n) of the session's pool
 * holding tokens[0..n × PS_KV_BLOCK), to or from the worker's file of prefix id
 * (ps_kv_file_path). The worker answers KV_DONE: u8 0 (done) or 1 (not done), then a
 * string saying why not (the session goes on either way). */
typedef struct {
    uint64_t id;
    int32_t n;             /* 1..PS_KV_MSG_MAX_BLOCKS */
    const int32_t *blocks; /* (n) */
    const int32_t *tokens; /* (n × PS_KV_BLOCK) */
} ps_kv_msg;

#define PS_KV_MSG_MAX_BLOCKS (1 << 16) /* a prefix of 2M positions: longer than any context */

/* Builds a KV_SAVE or KV_LOAD payload in b (restarted). */
void ps_kv_msg_encode(ps_wbuf *b, const ps_kv_msg *m);
/* Parses one (the arrays point into p); token ids are checked against vocab, blocks only for
 * being >= 0 (the stage checks them against its pool). */
ps_status ps_kv_msg_decode(const uint8_t *p, size_t len, int vocab, ps_kv_msg *out, char *err, size_t errlen);
/* The file of stage `stage`'s part of prefix id in dir: DIR/<id, 16 hex digits>-<stage>.kv. */
void ps_kv_file_path(char *out, size_t cap, const char *dir, uint64_t id, int stage);

// ---------------------------------------------------------------------------------------
// The executor

typedef struct ps_stage ps_stage;

typedef struct {
    int threads; /* compute threads */
    bool pin;    /* pin them to CPUs (ps_pool_pin: the calling thread must be the one that runs the stage) */
    bool mmap;   /* map the file rather than read it into huge pages (ps_gguf_open_with) */
    int device;  /* where its layers run: PS_DEVICE_CPU or PS_DEVICE_CUDA(i) (model.h) */
} ps_stage_opts;

/* Loads a model or shard and starts its threads. *out owned by the caller. */
ps_status ps_stage_open(const char *path, const ps_stage_opts *o, ps_stage **out, char *err, size_t errlen);
void ps_stage_free(ps_stage *s); /* NULL is a no-op */
const ps_model *ps_stage_model(const ps_stage *s);
ps_pool *ps_stage_pool(ps_stage *s);

/* The run state of a session on stage s: a context of p->n_ctx positions per sequence over
 * a pool of p->n_blocks KV blocks (none of them written yet), and room for micro-batches
 * of up to max_mb rows in max_segs segments with up to max_draft (0..PS_MAX_DRAFT) draft
 * tokens each. */
ps_status ps_stage_begin(ps_stage *s, const ps_ctx_params *p, int max_mb, int max_segs, int max_draft, char *err,
                         size_t errlen);
int ps_stage_n_ctx(const ps_stage *s);
int ps_stage_max_mb(const ps_stage *s);
int ps_stage_max_segs(const ps_stage *s);
int ps_stage_max_draft(const ps_stage *s);

/* Runs a micro-batch. A stage without the head writes the activations for the next
 * stage to *x_out (n × dim, owned by s, valid until the next call). The last stage samples
 * every segment flagged PS_MB_SAMPLE into res[0..*n_res) (room for ps_mb_max_results of the
 * session; a segment with a draft gives one result per token it returns). A segment
 * that would attend to a position its blocks have not been written at in this session is
 * refused (PS_ERR_PROTOCOL), as is a block outside the pool. */
ps_status ps_stage_run(ps_stage *s, const ps_mb *mb, const float **x_out, ps_result *res, int *n_res, char *err,
                       size_t errlen);
/* As ps_stage_run on a GPU stage without the head whose next stage reads its activations
 * from GPU memory (a device hop): they go to x_dev (n × dim floats of this host's GPU memory). */
ps_status ps_stage_run_into(ps_stage *s, const ps_mb *mb, float *x_dev, char *err, size_t errlen);
/* The GPU a stage's session runs on (cuda.h), or NULL (the CPU, or before ps_stage_begin). */
struct ps_cuda *ps_stage_cuda(ps_stage *s);
/* The logits of the latest sampled segment (vocab floats) on the last stage. */
const float *ps_stage_logits(const ps_stage *s);
/* Row i of the latest run's logits on the last stage: the sampling segments' rows in order,
 * n_draft + 1 of them each. */
const float *ps_stage_logits_row(const ps_stage *s, int i);

/* The whole model's fingerprint: a shard's model_fp, or a whole model's file's (computed once). */
ps_status ps_stage_model_fp(ps_stage *s, char out[33], char *err, size_t errlen);

/* Saves the keys and values of a prefix: blocks[0..n) of this session's pool (each full:
 * written at all PS_KV_BLOCK positions), which hold tokens[0..n × PS_KV_BLOCK), to path (a
 * temporary name, then renamed), under the prefix's id and the identity of what computed
 * them (model and shard fingerprints, layers, shape, activations: kv_file.c). */
ps_status ps_stage_kv_save(ps_stage *s, const char *path, uint64_t id, const int32_t *blocks, int n,
                           const int32_t *tokens, char *err, size_t errlen);
/* Restores a prefix saved by ps_stage_kv_save into blocks[0..n) of this session's pool (which
 * then count as written): refused, with a message naming both sides, when the file was made by
 * another model, shard, layer range or arithmetic, holds another id, block count or tokens, or
 * is damaged (checksum). Nothing is written to the pool unless the whole file checks out. */
ps_status ps_stage_kv_load(ps_stage *s, const char *path, uint64_t id, const int32_t *blocks, int n,
                           const int32_t *tokens, char *err, size_t errlen);

// ---------------------------------------------------------------------------------------
// Device hops (DHOP: dhop.c)

#define PS_DHOP_SLOTS     4  /* slots of a receiver's ring: micro-batches the sender may be ahead */
#define PS_DHOP_MAX_SLOTS 64 /* a reply offering more is refused */

/* One end of a device hop: the ring (NULL: activations travel in the FORWARD messages) and
 * the micro-batches through it so far. Zero-initialized; ps_dhop_end frees. */
typedef struct {
    struct ps_cuda_ring *ring;
    uint64_t n;
    int peer_fd; /* the sender: a pidfd of the receiver's process, readable once it has exited
                    (0: none; with stdin open, no pidfd is 0) */
} ps_dhop;

/* The sending stage s, on its connection c to the next stage, before the first FORWARD:
 * when s runs on a GPU, offers a device hop and, accepted, opens the next stage's ring. Why
 * says what the hop will be: "device to device: ..." or "by TCP: " and why (a CPU stage, another host,
 * a ring that could not be made or opened); then activations travel by TCP as before. An
 * error only when c fails or the answer is malformed. */
ps_status ps_dhop_offer(ps_dhop *h, ps_conn *c, ps_stage *s, int timeout_ms, char *why, size_t whylen, char *err,
                        size_t errlen);
/* The receiving stage s, given a DHOP payload on c: answers with a ring of PS_DHOP_SLOTS
 * slots of its largest micro-batch in its GPU's memory when s runs on a GPU of the sender's
 * host, else with why not (also written to why). */
ps_status ps_dhop_answer(ps_dhop *h, ps_conn *c, ps_stage *s, const uint8_t *p, uint32_t len, int timeout_ms, char *why,
                         size_t whylen, char *err, size_t errlen);
/* The sender: runs mb on s (as ps_stage_run) with its activations into the ring's next slot,
 * once the receiver has read what was there (waiting at most timeout_ms), and marks mb
 * x_ring for ps_mb_encode. PS_ERR_NET when the receiver's process has exited (its ring is
 * then not touched). */
ps_status ps_dhop_run(ps_dhop *h, ps_stage *s, ps_mb *mb, int timeout_ms, char *err, size_t errlen);
/* The receiver, given a FORWARD with x_ring (refused without a ring): points mb->x at the
 * ring's next slot and has its n × dim values checked while the stage runs them. */
ps_status ps_dhop_take(ps_dhop *h, ps_mb *mb, int dim, char *err, size_t errlen);
/* The receiver, after ps_stage_run of that micro-batch: frees its slot for the sender; *bad
 * is the index of its first non-finite activation (its value in *value), or -1. */
ps_status ps_dhop_done(ps_dhop *h, long long *bad, float *value, char *err, size_t errlen);
void ps_dhop_end(ps_dhop *h);

#endif
