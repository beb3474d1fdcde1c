/* sched.h - the scheduler: requests in, events out. What the HTTP server (src/server/) talks
 * to, shaped for many sequences in flight.
 *
 * A request is a prompt of token ids, how to generate (ps_gen_params), up to four stop strings
 * and whether to report log-probabilities. ps_sched_submit queues it and returns at once; the
 * scheduler's engine thread runs it and reports through the request's callback, on that
 * thread: a TOKEN event per generated token (its text as far as it is final: complete UTF-8,
 * and held back while it may begin a stop string), then one DONE event (why it ended, the
 * text still held back, the sequence's figures). After DONE no callback comes for that id.
 *
 *     ps_sched_submit(s, &req, on_event, ctx, &id, err, errlen);  // PS_ERR_BUSY: queue full
 *     ...                                                          // on_event(ctx, &ev) ...
 *     ps_sched_cancel(s, id);       // any thread: DONE(cancelled) within one step
 *
 * Up to `parallel` sequences run at once (continuous batching: they join and leave between
 * steps, in micro-batches shared with the others, as many in flight as the fleet has stages;
 * sched.c); the others wait in a bounded FIFO queue until a slot and the KV blocks of their
 * longest possible run are free. A sequence's tokens do not depend on what runs beside it. */
#ifndef PS_COORD_SCHED_H
#define PS_COORD_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "launch.h"
#include "session.h"
#include "spec.h"
#include "stop.h"
#include "../kv/kv.h"

#define PS_SCHED_MAX_TOP_LOGPROBS 20 /* OpenAI's limit for top_logprobs */
#define PS_SCHED_HIST_BUCKETS     14 /* latency histogram buckets, the last one +inf */

typedef struct {
    int parallel;           /* sequences to run at once (1..the launch's parallel) */
    int queue_max;          /* requests that may wait (>= 0); one more is PS_ERR_BUSY */
    bool prefix_cache;      /* keep full KV blocks of ended sequences and share them with later prompts
                          that start the same (a chat's earlier turns, a system prompt: kv.h) */
    ps_spec_opts spec;      /* speculative decoding of every sequence (spec.h; kind PS_SPEC_OFF: none) */
    const char *prefix_dir; /* with the prefix cache: where captured prefixes are kept (stage 0's
                               files and the records, kv/prefix.h; the workers keep theirs in
                               their --prefix-dir), restored at the start and after a fleet
                               reconnects; NULL: none */
} ps_sched_opts;

typedef struct ps_sched ps_sched;

/* A scheduler over launch l (borrowed: it must outlive the scheduler; its coordinator is the
 * engine thread's alone from now on) and its engine thread. Restores the prefixes captured
 * in o->prefix_dir under this model before it returns (a line each on stderr;
 * ps_sched_prefixes lists them). With --pin the engine thread
 * inherits the caller's CPU (thread 0 of stage 0's pool) and the caller gets back every
 * CPU, so that threads it starts later (the HTTP server's) do not crowd that one. *out is
 * the caller's (ps_sched_free). */
ps_status ps_sched_create(ps_launch *l, const ps_sched_opts *o, ps_sched **out, char *err, size_t errlen);
/* Refuses new requests from now on and cancels every one queued or running; their DONE
 * events still come from the engine thread. Idempotent; thread-safe. */
void ps_sched_close(ps_sched *s);
/* ps_sched_close, then waits for every DONE, joins the engine thread and frees. NULL is a
 * no-op. No callback comes after it returns. */
void ps_sched_free(ps_sched *s);

typedef struct {
    const int32_t *prompt;                 /* token ids, copied (BOS as the caller wants it) */
    int n_prompt;                          /* >= 1, at most the context */
    ps_gen_params gp;                      /* sampling, n_predict, ignore_eos */
    const char *stop[PS_STOP_MAX_STRINGS]; /* stop strings (NUL-terminated, copied) */
    int n_stop;                            /* 0..PS_STOP_MAX_STRINGS */
    int top_logprobs;                      /* -1: none; 0..20: the token's log-probability and
                                                 this many of the most likely ones' */
    bool capture; /* generate nothing: run the prompt, then save the keys and values of its whole
                     blocks on every stage (opts.prefix_dir) as a prefix that the prefix cache
                     keeps and a later start restores; DONE says its id (needs the prefix cache,
                     a prefix_dir and at least PS_KV_BLOCK prompt tokens) */
} ps_sched_request;

typedef enum {
    PS_SCHED_TOKEN = 1, /* a generated token (never an end-of-text token) */
    PS_SCHED_DONE = 2,  /* the request ended; the last event of its id */
} ps_sched_event_kind;

/* One request's figures, in DONE. */
typedef struct {
    int n_prompt;    /* prompt tokens */
    int n_generated; /* tokens generated (TOKEN events) */
    int n_cached;    /* prompt tokens whose keys and values the stages kept (prefix cache) */
    double queue_s;  /* submit to start */
    double ttft_s;   /* submit to the first token (0 when none came) */
    double total_s;  /* submit to DONE */
} ps_sched_seq_stats;

/* What a callback gets; every pointer is valid during the callback only. */
typedef struct {
    ps_sched_event_kind kind;
    uint64_t id;
    const char *text; /* TOKEN: the text that became final with this token (maybe ""); DONE: the
                         rest that was held back (an incomplete stop string, or UTF-8 bytes at
                         the end); never a stop string or what follows it */
    size_t len;
    /* TOKEN */
    int32_t token;
    float logprob;             /* the token's log-probability, when asked (top_logprobs >= 0) */
    int n_top;                 /* the request's top_logprobs (0 when not asked) */
    const int32_t *top_ids;    /* (n_top) most likely tokens, descending, ties by lower id */
    const float *top_logprobs; /* (n_top) their log-probabilities */
    /* DONE */
    ps_stop_reason stop; /* why it ended; PS_STOP_NONE when it failed */
    ps_status status;    /* PS_OK, or why it failed */
    const char *error;   /* NULL, or what failed (a worker lost, ...) */
    ps_sched_seq_stats stats;
    uint64_t prefix; /* a capture that succeeded: the prefix's id */
} ps_sched_event;

/* Called on the engine thread; must not block (queue the event and return). */
typedef void (*ps_sched_cb)(void *ctx, const ps_sched_event *ev);

/* Queues request r (copied) and returns its id (> 0) in *id; cb(ctx, ...) reports on it.
 * Checked now, with a message and no callback, for what can be known: an empty prompt or
 * one longer than the context (PS_ERR_RANGE, naming both numbers), token ids outside the
 * vocabulary, sampling parameters (ps_sample_params_check), stop strings (stop.h) and
 * top_logprobs (PS_ERR_ARG); a full queue or a closed scheduler (PS_ERR_BUSY). Thread-safe.
 * Log-probabilities come from the last stage, also on a fleet (only the top n travel). */
ps_status ps_sched_submit(ps_sched *s, const ps_sched_request *r, ps_sched_cb cb, void *ctx, uint64_t *id, char *err,
                          size_t errlen);
/* Cancels request id, queued or running: its DONE (PS_STOP_CANCELLED) comes within one step.
 * PS_ERR_NOT_FOUND when it is unknown or already done. Thread-safe; not from a signal
 * handler. */
ps_status ps_sched_cancel(ps_sched *s, uint64_t id);

/* A latency histogram: counts per bucket (not cumulative); bucket i holds values <= its
 * bound (ps_sched_hist_bounds) and above the one before. */
typedef struct {
    uint64_t count[PS_SCHED_HIST_BUCKETS];
    uint64_t n;
    double sum; /* seconds */
} ps_sched_hist;

/* The buckets' upper bounds in seconds, ascending; the last is INFINITY. */
extern const double ps_sched_hist_bounds[PS_SCHED_HIST_BUCKETS];

typedef struct {
    int queued, running; /* now */
    int parallel, queue_max;
    uint64_t submitted;                   /* requests accepted */
    uint64_t rejected;                    /* PS_ERR_BUSY at submit */
    uint64_t ended[PS_STOP_REASON_COUNT]; /* requests done, by stop reason; [PS_STOP_NONE]: failed */
    uint64_t prompt_tokens, generated_tokens;
    uint64_t cached_tokens;   /* prompt tokens the prefix cache saved */
    uint64_t spec_trips;      /* speculating: trips that carried guesses */
    uint64_t spec_drafted;    /* ... the guesses they carried */
    uint64_t spec_kept;       /* ... and those the last stage kept */
    uint64_t spec_overlapped; /* ... trips whose guesses the draft had made while the trip before was out */
    uint64_t prefix_hits;     /* requests that reused at least one token */
    ps_sched_hist ttft;       /* submit to first token */
    ps_sched_hist itl;        /* between consecutive tokens of a sequence */
    int kv_blocks_used;       /* KV blocks (PS_KV_BLOCK positions on every stage) held by running sequences */
    int kv_blocks_cached;     /* ... kept for the prefix cache, held by none (evictable) */
    int kv_blocks_total;      /* ... in the pool */
    ps_coord_stats coord;     /* per-stage compute and per-hop traffic since start */
} ps_sched_metrics;

/* A snapshot of the figures (coord as of the engine's last step). Thread-safe. */
void ps_sched_metrics_get(ps_sched *s, ps_sched_metrics *out);

typedef enum {
    PS_PREFIX_RESTORED = 1, /* in the prefix cache since the start (or the fleet's reconnection) */
    PS_PREFIX_CAPTURED = 2, /* captured by this scheduler */
    PS_PREFIX_REFUSED = 3,  /* not restored: why says why (another model or split, no room, ...) */
} ps_prefix_state;

/* A captured prefix, as ps_sched_prefixes lists it. Its blocks stay in the prefix cache like
 * any other's: evicted, least recently used first, when blocks run out. */
typedef struct {
    uint64_t id;
    int n_tokens, n_stages; /* its tokens; the stages of the fleet that captured it */
    long long created;      /* unix time */
    ps_prefix_state state;
    char why[700];
} ps_sched_prefix;

/* Copies up to cap of the prefixes in prefix_dir (oldest first) to out; returns how many there
 * are. Thread-safe. */
int ps_sched_prefixes(ps_sched *s, ps_sched_prefix *out, int cap);

#endif
