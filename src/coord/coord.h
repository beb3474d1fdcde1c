/* coord.h - the coordinator: runs stage 0 in-process and drives the rest of the fleet
 * around the ring (DESIGN.md, "Data flow").
 *
 * For each call the coordinator cuts the positions into micro-batches (prefill chunks),
 * runs each through stage 0 and sends it on; the stages pass it along; the last stage
 * samples and answers with the token alone. While stage k works on chunk i, stage k-1
 * already works on chunk i+1, so a long prompt's time to first token falls as stages are
 * added. The coordinator watches every worker's connection while it waits: a worker that
 * dies, fails or stalls is reported by stage index and address within the timeout, and
 * the fleet is reconnected on the next call. */
#ifndef PS_COORD_H
#define PS_COORD_H

#include <stdint.h>

#include "../model/model.h"
#include "fleet.h"
#include "../net/net.h"
#include "../sample/sample.h"
#include "../stage/stage.h"

typedef struct {
    const char *model;          /* a whole model run as the only stage, or NULL with fleet */
    const ps_fleet *fleet;      /* the fleet: stage 0 runs here, the others on workers */
    int threads;                /* threads of stage 0 */
    bool pin;                   /* pin them to CPUs (ps_pool_pin; ps_coord_next's caller is thread 0) */
    bool mmap;                  /* map stage 0's file rather than read it into huge pages */
    int device;                 /* where stage 0's layers run: PS_DEVICE_CPU or PS_DEVICE_CUDA(i) */
    int n_ctx;                  /* positions; 0 = the model's context, at most 4096 */
    int max_batch;              /* tokens per forward pass */
    int max_segs;               /* sequences per micro-batch; 0 = 1 */
    int parallel;               /* sequences held at once; 0 = 1 */
    int n_blocks;               /* KV blocks of PS_KV_BLOCK positions on every stage; 0 = enough for
                              `parallel` sequences of n_ctx positions (never fewer than one's) */
    int prefill_chunk;          /* positions per micro-batch; 0 = max_batch */
    int max_draft;              /* draft tokens a segment may carry for verification (0..PS_MAX_DRAFT) */
    ps_act act;                 /* matmul arithmetic of every stage */
    const uint8_t *key;         /* 32-byte shared key, or NULL */
    bool plain;                 /* with a key: ask for frames in the clear (ps_hello.plain) */
    bool host_hops;             /* activations to stage 1 on a GPU of this host by TCP too, not device to
                                   device (DHOP, stage.h) */
    ps_link_sim sim;            /* emulation of the coordinator's outgoing hop */
    int timeout_ms;             /* a stage silent for this long is reported as stalled */
    const char *const *standby; /* addresses of workers started with --cache, each to take the place of a
                                   stage that fails (in order; NULL: none) */
    int n_standby;
    ps_progress progress; /* "prompt": positions stage 0 has run of a prompt of several chunks */
} ps_coord_opts;

typedef struct ps_coord ps_coord;

/* Loads stage 0 (checked against the fleet) and starts its threads; workers are
 * connected on the first ps_coord_next. *out owned by the caller. A shard given as the
 * whole model (o->model) is refused before it is loaded (ps_coord_refuse_shard). */
ps_status ps_coord_create(const ps_coord_opts *o, ps_coord **out, char *err, size_t errlen);
/* PS_ERR_ARG when path is a shard written by `pipeshard split` (which needs its fleet), with
 * a message that says which shard and how its fleet runs; PS_OK otherwise, also for a file
 * that does not open (the loader's message says why). Reads only the metadata. */
ps_status ps_coord_refuse_shard(const char *path, char *err, size_t errlen);
/* Ends the session on every worker (BYE) and frees. NULL is a no-op. */
void ps_coord_free(ps_coord *c);

/* Connects the workers now (ps_coord_next does it when needed), so that the first
 * request's timings do not include the handshakes. */
ps_status ps_coord_connect(ps_coord *c, char *err, size_t errlen);

const ps_model *ps_coord_model(const ps_coord *c); /* stage 0's model (tokenizer metadata) */
int ps_coord_n_ctx(const ps_coord *c);
int ps_coord_n_stages(const ps_coord *c);

int ps_coord_max_rows(const ps_coord *c);    /* positions per micro-batch */
int ps_coord_max_segs(const ps_coord *c);    /* sequences per micro-batch */
int ps_coord_max_results(const ps_coord *c); /* results of a micro-batch at most */
int ps_coord_max_draft(const ps_coord *c);   /* draft tokens a segment may carry */
int ps_coord_n_blocks(const ps_coord *c);    /* KV blocks on every stage */

/* One sequence's positions in a micro-batch (stage.h's ps_mb_seg, as the caller gives it). */
typedef struct {
    uint64_t seq;          /* the caller's sequence id, returned with its token */
    int32_t pos, n;        /* positions [pos, pos + n) */
    const int32_t *tokens; /* (n) */
    const int32_t *blocks; /* the sequence's block table (at least ceil((pos + n) / PS_KV_BLOCK)) */
    int32_t n_blocks;
    bool sample;               /* sample the token after pos + n - 1 */
    int n_top;                 /* with it, this many top log-probabilities (0..PS_MAX_TOP_LOGPROBS) */
    int n_draft;               /* with sample: the last n_draft tokens are a draft's guesses (stage.h, ps_mb_seg),
                                  at most the coordinator's max_draft */
    const ps_draft_dist *dist; /* NULL, or (n_draft) the distributions they were drawn from */
    ps_sample_params sp;
} ps_coord_seg;

/* Runs a micro-batch (at most ps_coord_max_rows positions in ps_coord_max_segs segments)
 * through stage 0 and sends it around the ring; returns once it is on its way. Its tokens,
 * when a segment samples, come from ps_coord_recv, in the order sent; on one stage, recv
 * must follow each such send. Connects the fleet when needed: *reconnected then says the
 * workers start a new session, whose KV cache holds nothing (the caller replays its
 * sequences: DESIGN.md invariant 3). The caller decides which blocks each sequence uses:
 * two segments of a micro-batch, or of micro-batches in flight together, must not write
 * the same block. On error the fleet is disconnected and nothing is pending. */
ps_status ps_coord_send(ps_coord *c, const ps_coord_seg *segs, int n_segs, bool *reconnected, char *err, size_t errlen);
/* Waits for the tokens of the oldest micro-batch sent that samples (watching every worker:
 * a failure or a stall is an error naming the stage), and copies its results (one per
 * sampling segment, in segment order; a segment with a draft: one per token it returns) to
 * res (room for ps_coord_max_results). */
ps_status ps_coord_recv(ps_coord *c, ps_result *res, int *n_res, char *err, size_t errlen);
/* Micro-batches sent whose tokens have not been received. */
int ps_coord_pending(const ps_coord *c);
/* How stage 0's activations reach stage 1 in the fleet's session: "device to device: ..." or
 * "by TCP: " and why ("the next stage is on another host"); "" with one stage or before
 * connecting. */
const char *ps_coord_hop0(const ps_coord *c);
/* Whether the workers hold a session (always, on one stage). After a failure they do not:
 * the next send or ps_coord_connect starts a new one, whose KV cache is empty. */
bool ps_coord_connected(const ps_coord *c);

/* Saves (KV_SAVE) or restores (KV_LOAD) the keys and values of prefix m on every stage at
 * once: stage 0's part in dir (ps_kv_file_path), each worker's in its --prefix-dir. Only
 * with nothing in flight and the fleet connected. A stage that refuses (a file of another
 * model or split, a worker without --prefix-dir, a full disk) makes it fail with that
 * stage's message and the session goes on (a restore may have filled the blocks on some
 * stages: the caller does not use them); a worker that fails otherwise fails the fleet. */
ps_status ps_coord_kv(ps_coord *c, bool save, const char *dir, const ps_kv_msg *m, char *err, size_t errlen);
/* The whole model's fingerprint (for a whole model, computed from its file once). */
ps_status ps_coord_model_fp(ps_coord *c, char out[33], char *err, size_t errlen);

/* One sequence at a time, on blocks 0, 1, 2, ...: runs tokens[0..n) at positions
 * pos..pos+n-1 around the ring (discarding every stage's KV beyond pos) and returns the
 * token the last stage samples at position pos + n. After a reconnection it replays the
 * sequence from position 0. Not to be mixed with ps_coord_send on the same blocks. */
ps_status ps_coord_next(ps_coord *c, const int32_t *tokens, int n, int pos, const ps_sample_params *sp, int32_t *token,
                        char *err, size_t errlen);
/* ps_coord_next with a draft: the last n_draft of tokens[0..n) (fewer than n, at most
 * max_draft) are a draft's guesses, drawn from dist[0..n_draft) when dist is not NULL, which
 * the last stage checks in turn (stage.h, ps_mb_seg.n_draft). *n_out tokens (1..n_draft + 1)
 * into out: the guesses kept, then the token sampled in place of the next one or after them
 * (without dist, the same as n_out plain steps would give). The next call
 * starts at pos + n - n_draft + *n_out - 1 (after the last guess kept: the others' keys and
 * values are discarded). meanwhile(arg), when not NULL, runs once the trip is on its way and
 * before its tokens are awaited (on one stage: after the tokens are known). */
ps_status ps_coord_next_draft(ps_coord *c, const int32_t *tokens, int n, int pos, int n_draft,
                              const ps_draft_dist *dist, const ps_sample_params *sp, void (*meanwhile)(void *arg),
                              void *arg, int32_t *out, int *n_out, char *err, size_t errlen);
/* Whether a worker has written to the coordinator since it last read (while a trip is out: its
 * answer, most likely, or a failure's report), without waiting. False on one stage. */
bool ps_coord_heard(ps_coord *c);
/* The address stage k is served from now ("local" for stage 0): fleet.json's, or the standby's
 * that took its place. */
const char *ps_coord_stage_address(const ps_coord *c, int k);

/* The logits behind the latest token when the model runs as one stage, else NULL
 * (logits never cross the network). */
const float *ps_coord_logits(const ps_coord *c);

/* What the fleet did since the last reset. Hop k goes from stage k to stage k+1; the
 * last hop goes from the last stage back to the coordinator. */
typedef struct {
    int n_stages;
    double compute_ms[PS_SHARD_MAX_STAGES];
    double wait_ms; /* from stage 0's last chunk to the token, summed: the other stages' compute
                       plus every hop, wake-up and queue on the way (minus their compute: the
                       ring's overhead; during a pipelined prefill their compute overlaps ours) */
    ps_conn_stats hop[PS_SHARD_MAX_STAGES];
    int failures;       /* times the fleet failed (a stage died, stalled or refused), cumulative */
    int recoveries;     /* times it was connected again after one (a standby in the place of a stage
                           that is gone); the sequences in flight are then replayed */
    double recovery_ms; /* from each failure to the fleet connected again (a standby's shard placed),
                           summed */
} ps_coord_stats;
void ps_coord_get_stats(ps_coord *c, ps_coord_stats *out);
/* The stages' compute so far, seconds: stage 0's (run here, within ps_coord_send) and the
 * others' as their answers report it. */
double ps_coord_compute_s(ps_coord *c);
/* The ring's overhead in st: wait_ms minus the other stages' compute (hops, wake-ups, queues). */
double ps_coord_ring_overhead_ms(const ps_coord_stats *st);
void ps_coord_reset_stats(ps_coord *c);

#endif
