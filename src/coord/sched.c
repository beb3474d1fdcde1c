/* sched.c - the scheduler (sched.h): a FIFO of requests and one engine thread that runs many
 * sequences at once (continuous batching, DESIGN.md "Data flow").
 *
 * Front: submit, cancel, close and the metrics, under one mutex. Engine: a loop of rounds.
 * A round admits queued requests while a sequence slot and the KV blocks of their longest
 * possible run are free (ps_kv: the coordinator decides which blocks each sequence uses, and
 * a prompt that starts like an earlier one shares its cached blocks); then it sends a
 * micro-batch for every group of sequences with none in flight, and receives one answer.
 *
 * The running sequences are split into as many groups as the fleet has stages, so that up to
 * that many micro-batches travel the ring at once and no stage waits while work is queued.
 * A group's micro-batch takes each of its sequences that waits for nothing: one row for a
 * sequence that decodes (first), then chunks of prompts within the micro-batch's rows
 * (chunked prefill rides with the decode tokens: it never stalls them). Each row gives the
 * bits it gives alone (DESIGN.md invariant 1), and seeded sampling is keyed by position
 * (invariant 2), so a sequence's tokens do not depend on what runs beside it.
 *
 * A fleet that fails loses every stage's KV cache: the book of blocks is reset and every
 * running sequence is fed again from its tokens (invariant 3); its tokens already reported
 * are not reported again. A fleet that cannot be reached fails the requests with its error.
 *
 * Captured prefixes (kv/prefix.h): a capture runs its prompt like any request; once its answer
 * is back, no micro-batch is sent until none is in flight, and its whole blocks are saved on
 * every stage (ps_coord_kv), then its record. At the start, and once a fleet that failed is
 * back, the records of this model are restored into free blocks and published in the prefix
 * cache.
 * Callbacks run outside the mutex, so that they may call ps_sched_cancel or ps_sched_submit. */
#include "sched.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kv/prefix.h"
#include "draft.h"
#include "spec.h"

const double ps_sched_hist_bounds[PS_SCHED_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                            0.25,  0.5,    1,     2.5,  5,     10,   INFINITY};

/* Micro-batches in flight at most: one per group, a group per stage. */
#define MAX_GROUPS PS_SHARD_MAX_STAGES
/* Prompt rows the micro-batches of one trip around the ring may carry beside fewer decoding
 * rows, shared among the groups (send_group). */
#define PROMPT_ROWS_BESIDE_DECODE 32

/* One request, from submit to DONE. */
typedef struct seq {
    struct seq *next; /* in the queue */
    uint64_t id;
    int32_t *toks; /* (n_ctx + 1) the prompt, then what was generated */
    int n_prompt, n_toks;
    int n_max;      /* positions it may ever feed: its blocks cover them */
    int n_done;     /* positions sent around the ring (their keys and values are, or will be, on every stage) */
    int32_t *table; /* (blocks for n_ctx) its KV blocks, while admitted */
    int n_table;
    int group;      /* the micro-batches it rides in */
    bool in_flight; /* its next token is on the way */
    ps_tok_stream *stream;
    ps_gen_params gp;
    ps_stop *stop;                         /* the stop strings' matcher */
    int top_n;                             /* -1: no log-probabilities */
    bool capture;                          /* a capture (ps_sched_request.capture) */
    bool saving;                           /* ... whose prompt has run: its blocks are to be saved */
    uint64_t prefix;                       /* ... the id of the prefix it saved */
    int32_t guess[PS_MAX_DRAFT + 1];       /* speculating: the token before, then the guesses in flight */
    ps_draft_dist dist[PS_MAX_DRAFT];      /* ... drawn by a draft model at a temperature: from these */
    int n_guess, guess_pos;                /* how many guesses, and the position of the first */
    double t_sent;                         /* when its latest trip was sent (ps_now) */
    int fresh;                             /* of them, those drafted before the trip left (the others meanwhile) */
    double draft_s;                        /* the seconds their drafting took (with the others') */
    bool decoding;                         /* the trip out is a decoding one (not a prompt's) ... */
    uint64_t crowd;                        /* ... s->crowd before it left (its own prompt rows crowd it) */
    int slot;                              /* with a draft model: its slot there, while it runs (else -1) */
    ps_spec_auto auto_k;                   /* --spec-k auto's measurements */
    int32_t pre[PS_MAX_DRAFT + 2];         /* overlap: the draft's next tokens had every guess in flight been kept */
    ps_draft_dist pre_q[PS_MAX_DRAFT + 2]; /* ... their distributions */
    int n_pre, pre_max;                    /* ... how many (pre[0]: its guess of the trip's last token), the most */
    double pre_sure;                       /* ... how sure the draft was of pre[1..n_pre) (spec.h, PS_SPEC_SURE) */
    int n_ready;                           /* the next trip's guesses, pre[1..1 + n_ready), when pre[0] came true */
    int n_meanwhile;                       /* guesses made after pre[0] while the trip was out ... */
    double meanwhile_s;                    /* ... and their seconds (auto's seconds a guess) */
    ps_sched_cb cb;
    void *ctx;
    atomic_bool cancelled;
    int n_generated, n_cached;
    double t_submit, t_start, t_first, t_last; /* ps_now(); t_first 0 until the first token */
} seq;

struct ps_sched {
    ps_launch *launch;
    ps_coord *coord;
    const ps_tok *tok;
    ps_sched_opts o;
    int n_ctx, vocab, n_groups;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu; /* guards everything below, up to the engine's own */
    pthread_cond_t cv;  /* the engine waits on it for work */
    seq *head, *tail;   /* the queue, FIFO */
    int queued;
    seq **run;       /* (parallel) the running sequences, for ps_sched_cancel and the metrics */
    bool *slot_used; /* (parallel) the draft model's slots that a running sequence holds */
    int n_run;
    bool closed;
    uint64_t next_id;
    ps_kv_stats kv_st;       /* the book's figures, as of the latest change */
    ps_sched_metrics m;      /* counters; queued, running and the KV blocks filled in on reading */
    ps_prefix *pfx;          /* the captured prefixes' records (written by the engine thread only) */
    ps_sched_prefix *pfx_st; /* ... and their states */
    int n_pfx, cap_pfx;
    /* the engine thread's own */
    ps_kv *kv;
    char model_fp[33];           /* with prefix_dir: the model's fingerprint (prefix ids, records) */
    bool kv_lost;                /* the stages' KV caches are gone: restore, then feed the running again */
    int fails;                   /* fleet failures in a row */
    int group_load[MAX_GROUPS];  /* sequences in each group */
    bool group_busy[MAX_GROUPS]; /* a micro-batch of the group awaits its tokens */
    int pend_group[MAX_GROUPS];  /* the groups of the micro-batches awaiting tokens, oldest first */
    int n_pend;
    ps_coord_seg *segs; /* (parallel) the micro-batch being built */
    seq **sent;         /* (parallel) the sequence of each of its segments */
    ps_result *res;     /* (parallel) the tokens of one */
    char *tail_text;    /* (tail_cap) the text a DONE carries */
    size_t tail_cap;
    ps_spec_auto ring_auto; /* --spec-k auto: the ring and the draft as the latest sequence measured them */
    uint64_t crowd;         /* micro-batches sent with prompt rows, and prompts the draft read: a trip out meanwhile
                       waited for them too (ps_spec_trip.crowded) */
    bool solo;              /* a lone request's micro-batch left when none was out, and none has left since: the
                               stages' compute from its leaving to its answer is its own (a prompt's chunk that
                               samples nothing may still be on a later stage: its share makes the hops' floor
                               lower) */
    double solo_compute;    /* the stages' compute (ps_coord_compute_s) when it left */
};

// ---------------------------------------------------------------------------------------
// Requests

/* Frees a request; NULL is a no-op. */
static void seq_free(seq *q) {
    if (!q) return;
    ps_stop_free(q->stop);
    ps_tok_stream_free(q->stream);
    free(q->toks), free(q->table);
    free(q);
}

/* The index of the first of ids[0..n) outside 0..vocab-1, or -1. */
static int bad_id(const int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return i;
    return -1;
}

/* Checks request r against what the scheduler runs; the message names what is wrong. */
static ps_status check_request(const ps_sched *s, const ps_sched_request *r, char *err, size_t errlen) {
    if (!r->prompt || r->n_prompt <= 0) return ps_errf(err, errlen, PS_ERR_ARG, "the prompt is empty");
    if (r->n_prompt > s->n_ctx)
        return ps_errf(err, errlen, PS_ERR_RANGE, "the prompt has %d tokens, more than the context size of %d",
                       r->n_prompt, s->n_ctx);
    int bad = bad_id(r->prompt, r->n_prompt, s->vocab);
    if (bad >= 0)
        return ps_errf(err, errlen, PS_ERR_ARG, "token id %d of the prompt is not in the model's vocabulary (0..%d)",
                       r->prompt[bad], s->vocab - 1);
    if (r->top_logprobs < -1 || r->top_logprobs > PS_SCHED_MAX_TOP_LOGPROBS)
        return ps_errf(err, errlen, PS_ERR_ARG, "top_logprobs is %d; it must be 0 to %d", r->top_logprobs,
                       PS_SCHED_MAX_TOP_LOGPROBS);
    if (r->gp.n_predict < -1) return ps_errf(err, errlen, PS_ERR_ARG, "n_predict is %lld", (long long)r->gp.n_predict);
    if (r->capture && (!s->o.prefix_cache || !s->o.prefix_dir))
        return ps_errf(err, errlen, PS_ERR_ARG, "prefixes are not kept here (%s)",
                       s->o.prefix_cache ? "no prefix directory" : "the prefix cache is off");
    if (r->capture && r->n_prompt < PS_KV_BLOCK)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "a prefix is kept in whole blocks of %d tokens; this prompt has %d tokens", PS_KV_BLOCK,
                       r->n_prompt);
    return ps_sample_params_check(&r->gp.sp, err, errlen);
}

/* The positions a request may ever feed: its prompt, and each token generated but the last
 * (which is never fed back), up to the context. */
static int positions_max(const ps_sched *s, const ps_sched_request *r) {
    long long n = r->capture            ? r->n_prompt
                  : r->gp.n_predict < 0 ? s->n_ctx
                                        : (long long)r->n_prompt + r->gp.n_predict - 1;
    if (n < r->n_prompt) n = r->n_prompt;
    return n > s->n_ctx ? s->n_ctx : (int)n;
}

/* A request made from r (copied), or NULL with the message in err. */
static seq *seq_make(const ps_sched *s, const ps_sched_request *r, ps_sched_cb cb, void *ctx, char *err, size_t errlen,
                     ps_status *st) {
    seq *q = ps_calloc(1, sizeof *q);
    if (!q || !(q->toks = ps_malloc(((size_t)s->n_ctx + 1) * sizeof *q->toks)) ||
        !(q->table = ps_malloc((size_t)ps_kv_blocks_for(s->n_ctx) * sizeof *q->table)) ||
        (s->tok && ps_tok_stream_create(s->tok, 0, &q->stream))) {
        seq_free(q);
        *st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if ((*st = ps_stop_create(r->stop, r->n_stop, &q->stop, err, errlen))) {
        seq_free(q);
        return NULL;
    }
    memcpy(q->toks, r->prompt, (size_t)r->n_prompt * sizeof *q->toks);
    q->n_prompt = q->n_toks = r->n_prompt, q->n_max = positions_max(s, r);
    q->gp = r->gp, q->top_n = r->top_logprobs, q->cb = cb, q->ctx = ctx, q->capture = r->capture;
    if (q->capture) q->gp.n_predict = 0, q->top_n = -1;
    atomic_init(&q->cancelled, false);
    q->t_submit = ps_now();
    q->slot = -1;
    return q;
}

ps_status ps_sched_submit(ps_sched *s, const ps_sched_request *r, ps_sched_cb cb, void *ctx, uint64_t *id, char *err,
                          size_t errlen) {
    *id = 0;
    ps_status st = check_request(s, r, err, errlen);
    seq *q = st ? NULL : seq_make(s, r, cb, ctx, err, errlen, &st);
    if (!q) return st;
    pthread_mutex_lock(&s->mu);
    if (s->closed || s->queued >= s->o.queue_max) {
        bool closed = s->closed;
        s->m.rejected++;
        pthread_mutex_unlock(&s->mu);
        seq_free(q);
        return closed ? ps_errf(err, errlen, PS_ERR_BUSY, "the server is shutting down")
                      : ps_errf(err, errlen, PS_ERR_BUSY, "the queue is full (%d requests waiting)", s->o.queue_max);
    }
    q->id = *id = ++s->next_id;
    if (s->tail)
        s->tail->next = q;
    else
        s->head = q;
    s->tail = q;
    s->queued++;
    s->m.submitted++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return PS_OK;
}

ps_status ps_sched_cancel(ps_sched *s, uint64_t id) {
    ps_status st = PS_ERR_NOT_FOUND;
    pthread_mutex_lock(&s->mu);
    for (seq *q = s->head; q && st; q = q->next)
        if (q->id == id) atomic_store(&q->cancelled, true), st = PS_OK;
    for (int i = 0; i < s->n_run && st; i++)
        if (s->run[i]->id == id) atomic_store(&s->run[i]->cancelled, true), st = PS_OK;
    if (!st) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return st;
}

// ---------------------------------------------------------------------------------------
// Events

/* Adds v to histogram h. */
static void hist_add(ps_sched_hist *h, double v) {
    int b = 0;
    while (b < PS_SCHED_HIST_BUCKETS - 1 && v > ps_sched_hist_bounds[b]) b++;
    h->count[b]++, h->n++, h->sum += v;
}

/* Appends b[0..n) to the DONE text; false when memory is out. */
static bool tail_add(ps_sched *s, size_t *len, const char *b, size_t n) {
    if (*len + n > s->tail_cap) {
        size_t cap = 2 * (*len + n) + 64;
        char *t = ps_realloc(s->tail_text, cap);
        if (!t) return false;
        s->tail_text = t, s->tail_cap = cap;
    }
    if (n) memcpy(s->tail_text + *len, b, n);
    *len += n;
    return true;
}

/* Takes q out of the running set (its blocks back to the book); q may be queued, never admitted. */
static void retire(ps_sched *s, seq *q) {
    if (q->n_table) {
        ps_kv_seq_release(s->kv, q->table, q->n_table);
        s->group_load[q->group]--;
        q->n_table = 0;
    }
    if (q->slot >= 0) s->slot_used[q->slot] = false, q->slot = -1;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == q) s->run[i] = s->run[--s->n_run];
    ps_kv_get_stats(s->kv, &s->kv_st);
    pthread_mutex_unlock(&s->mu);
}

/* Ends request q: the text still held back (the detokenizer's, then the stop matcher's) goes
 * with the DONE event, the counters are updated, and q is freed. A stop string completed by
 * that text makes the reason PS_STOP_STOP. status / msg: a failure (stop is then NONE); no
 * memory for the held-back text is one too. */
static void finish(ps_sched *s, seq *q, ps_stop_reason stop, ps_status status, const char *msg) {
    retire(s, q);
    ps_spec_auto_carry(&s->ring_auto, &q->auto_k); /* the next sequences start from it */
    size_t len = 0;
    const char *t;
    size_t n;
    bool stopped = stop == PS_STOP_STOP, ok = true;
    if (q->stream && !stopped && !status) {
        ps_tok_stream_flush(q->stream, &t, &n);
        ok = !ps_stop_push(q->stop, t, n, &t, &n, &stopped) && tail_add(s, &len, t, n);
        if (stopped) stop = PS_STOP_STOP;
    }
    ps_stop_flush(q->stop, &t, &n);
    if (!(ok = ok && tail_add(s, &len, t, n)) && !status) status = PS_ERR_NOMEM, msg = "out of memory", len = 0;
    double now = ps_now();
    if (!q->t_start) q->t_start = now;
    ps_sched_event ev = {.kind = PS_SCHED_DONE,
                         .id = q->id,
                         .text = s->tail_text ? s->tail_text : "",
                         .len = len,
                         .stop = status ? PS_STOP_NONE : stop,
                         .status = status,
                         .error = status ? (msg && msg[0] ? msg : ps_strerror(status)) : NULL,
                         .stats = {.n_prompt = q->n_prompt,
                                   .n_generated = q->n_generated,
                                   .n_cached = q->n_cached,
                                   .queue_s = q->t_start - q->t_submit,
                                   .ttft_s = q->t_first ? q->t_first - q->t_submit : 0,
                                   .total_s = now - q->t_submit},
                         .prefix = status ? 0 : q->prefix};
    pthread_mutex_lock(&s->mu);
    s->m.ended[ev.stop]++;
    s->m.prompt_tokens += (uint64_t)q->n_prompt;
    s->m.generated_tokens += (uint64_t)q->n_generated;
    s->m.cached_tokens += (uint64_t)q->n_cached;
    s->m.prefix_hits += q->n_cached > 0;
    pthread_mutex_unlock(&s->mu);
    q->cb(q->ctx, &ev);
    seq_free(q);
}

/* Reports token r->token of q, whose text is text[0..len): its log-probabilities when asked,
 * and the text the stop matcher releases. Returns PS_STOP_STOP when a stop string completed (q
 * is to end), PS_STOP_NONE otherwise; *nomem when the matcher had no memory (q is to fail). */
static ps_stop_reason emit_token(ps_sched *s, seq *q, const ps_result *r, const char *text, size_t len, double now,
                                 bool *nomem) {
    ps_sched_event ev = {.kind = PS_SCHED_TOKEN, .id = q->id, .token = r->token};
    if (q->top_n >= 0) {
        ev.logprob = r->logprob;
        ev.n_top = (int)r->n_top, ev.top_ids = r->top_id, ev.top_logprobs = r->top_logprob;
    }
    bool stopped = false;
    if ((*nomem = ps_stop_push(q->stop, text, len, &ev.text, &ev.len, &stopped) != PS_OK)) return PS_STOP_NONE;
    pthread_mutex_lock(&s->mu);
    if (q->n_generated)
        hist_add(&s->m.itl, now - q->t_last);
    else
        hist_add(&s->m.ttft, now - q->t_submit);
    pthread_mutex_unlock(&s->mu);
    if (!q->t_first) q->t_first = now;
    q->n_generated++, q->t_last = now;
    q->cb(q->ctx, &ev);
    return stopped ? PS_STOP_STOP : PS_STOP_NONE;
}

/* The token the last stage sampled for q: ends q at the end of text, its length or the
 * context, or a stop string; else q goes on. */
static void on_token(ps_sched *s, seq *q, const ps_result *r) {
    q->in_flight = false;
    int g = r->pos - q->guess_pos; /* a guess the last stage kept: its keys and values are on every stage */
    if (g >= 0 && g < q->n_guess && r->token == q->guess[1 + g]) q->n_done = r->pos + 1;
    if (atomic_load(&q->cancelled)) return finish(s, q, PS_STOP_CANCELLED, PS_OK, NULL);
    if (q->capture) { /* its prompt is on every stage: saved once nothing is in flight (round_once) */
        q->saving = true;
        return;
    }
    int64_t n_gen = q->n_toks - q->n_prompt;
    if (n_gen == q->gp.n_predict) return finish(s, q, PS_STOP_LENGTH, PS_OK, NULL); /* n_predict 0 */
    if (!q->gp.ignore_eos && s->tok && ps_tok_is_eog(s->tok, r->token)) return finish(s, q, PS_STOP_EOS, PS_OK, NULL);
    q->toks[q->n_toks++] = r->token;
    const char *text = "";
    size_t len = 0;
    char err[128];
    if (q->stream && ps_tok_stream_push(q->stream, r->token, &text, &len)) {
        snprintf(err, sizeof err, "cannot decode token %d", r->token);
        return finish(s, q, PS_STOP_NONE, PS_ERR_INTERNAL, err);
    }
    bool nomem = false;
    if (emit_token(s, q, r, text, len, ps_now(), &nomem) == PS_STOP_STOP)
        return finish(s, q, PS_STOP_STOP, PS_OK, NULL);
    if (nomem) return finish(s, q, PS_STOP_NONE, PS_ERR_NOMEM, "out of memory");
    if (n_gen + 1 == q->gp.n_predict) return finish(s, q, PS_STOP_LENGTH, PS_OK, NULL);
    if (q->n_toks > q->n_max) finish(s, q, PS_STOP_CONTEXT, PS_OK, NULL); /* nowhere to feed it */
}

// ---------------------------------------------------------------------------------------
// Engine

/* Takes the cancelled requests out of the queue (under s->mu) into a list. */
static seq *take_cancelled(ps_sched *s) {
    seq *out = NULL, **link = &s->head, *prev = NULL;
    while (*link) {
        seq *q = *link;
        if (!atomic_load(&q->cancelled)) {
            prev = q, link = &q->next;
            continue;
        }
        *link = q->next;
        if (s->tail == q) s->tail = prev;
        s->queued--;
        q->next = out, out = q;
    }
    return out;
}

/* Gives q its blocks (sharing a cached prefix) and a group; false when the blocks are not
 * there now (q waits). */
static bool admit(ps_sched *s, seq *q) {
    int n_cached;
    if (ps_kv_seq_alloc(s->kv, q->toks, q->n_toks, q->n_max, q->table, &n_cached)) return false;
    q->n_table = ps_kv_blocks_for(q->n_max);
    q->n_done = n_cached;
    if (!q->t_start) q->n_cached = n_cached, q->t_start = ps_now();
    int g = 0;
    for (int i = 1; i < s->n_groups; i++)
        if (s->group_load[i] < s->group_load[g]) g = i;
    q->group = g, s->group_load[g]++;
    return true;
}

/* Under s->mu: moves queued requests into the running set while a slot and their blocks are free. */
static void admit_queued(ps_sched *s) {
    while (s->head && s->n_run < s->o.parallel && !atomic_load(&s->head->cancelled) && admit(s, s->head)) {
        seq *q = s->head;
        if (!(s->head = q->next)) s->tail = NULL;
        q->next = NULL;
        s->queued--;
        s->run[s->n_run++] = q;
        q->auto_k = s->ring_auto;
        for (int k = 0; s->o.spec.kind == PS_SPEC_DRAFT && q->slot < 0; k++) /* a slot is free: n_run <= parallel */
            if (!s->slot_used[k]) s->slot_used[k] = true, q->slot = k;
    }
    ps_kv_get_stats(s->kv, &s->kv_st);
}

/* Every stage's KV cache is gone (the fleet failed, or reconnected as a new session): the
 * book starts empty and every running sequence is fed again from its tokens. */
static void lose_kv(ps_sched *s) {
    s->n_pend = 0;
    memset(s->group_busy, 0, sizeof s->group_busy);
    memset(s->group_load, 0, sizeof s->group_load);
    ps_kv_reset(s->kv);
    s->kv_lost = s->n_pfx > 0;           /* the captured prefixes are restored once the fleet is back */
    for (int i = 0; i < s->n_run; i++) { /* a capture saves what the new session computes */
        seq *q = s->run[i];
        q->n_table = q->n_guess = q->n_pre = q->pre_max = q->n_ready = 0, q->in_flight = q->saving = false;
    }
    for (int i = 0; i < s->n_run; i++) admit(s, s->run[i]); /* the book is empty: they all fit again */
}

/* The fleet failed (st, err say how). The running sequences start over on the next round
 * (which reconnects); after a second failure in a row, every request fails with err. */
static void fleet_failed(ps_sched *s, ps_status st, const char *err) {
    lose_kv(s);
    if (++s->fails < 2) return;
    while (s->n_run) finish(s, s->run[0], PS_STOP_NONE, st, err);
    pthread_mutex_lock(&s->mu);
    for (seq *q = s->head; q; q = q->next) atomic_store(&q->cancelled, true);
    seq *gone = take_cancelled(s);
    pthread_mutex_unlock(&s->mu);
    while (gone) {
        seq *q = gone;
        gone = q->next;
        finish(s, q, PS_STOP_NONE, st, err);
    }
    s->fails = 0;
}

/* Whether the draft model works while trips are out (over a ring): it reads a prompt then, so
 * that the first guesses do not pay for it; with the overlap (--spec-overlap) it guesses on. */
static bool reads(const ps_sched *s) { return s->o.spec.kind == PS_SPEC_DRAFT && ps_coord_n_stages(s->coord) > 1; }
static bool overlap(const ps_sched *s) { return reads(s) && s->o.spec.overlap; }

/* Whether the one running request is alone on the ring: only then do its trips know their
 * stages' compute (receive), does auto start as run's (timed) and a draft model's trips reach
 * past K (next_k). Beside other requests a guess more costs each of them its rows' compute, and
 * a first trip of guesses waits for their prompts: with 4 streams at 100 ms these took auto
 * from 0.85-1.08 of K=4 to 0.70-0.92 on code (bench/spec.py --serve --streams 4). */
static bool alone(const ps_sched *s) { return s->n_run == 1; }

/* The guesses q's next decoding trip asks: --spec-k's K, or auto's, with a draft model's reach
 * beyond it when q runs alone. */
static int next_k(const ps_sched *s, const seq *q) {
    if (!s->o.spec.auto_k) return s->o.spec.k;
    int k = ps_spec_auto_k(&q->auto_k, s->o.spec.k);
    return s->o.spec.kind == PS_SPEC_DRAFT && alone(s) ? ps_spec_auto_reach(&q->auto_k, k, s->o.spec.k) : k;
}

/* How many guesses q's next trip may carry: next_k, within room, q's blocks and the tokens it
 * may still generate. */
static int guess_room(const ps_sched *s, seq *q, int room) {
    if (q->n_toks == q->n_prompt) /* the first token is the prompt's, as in run, even when its last chunk is one */
        return 0;                 /* token (other rows, the prefix cache): guesses go where the text alone says */
    int k = next_k(s, q);
    int64_t left = q->gp.n_predict < 0 ? k : q->gp.n_predict - (q->n_toks - q->n_prompt) - 1;
    int fit = q->n_max - q->n_toks; /* the last guess at position n_toks - 1 + k, within n_max */
    k = k < room ? k : room;
    k = k < fit ? k : fit;
    return k > left ? (int)(left > 0 ? left : 0) : k;
}

/* The guesses of the n decoding sequences qs[0..n) into their q->guess (after the token before)
 * and q->n_guess, sharing room rows: prompt lookup's, or the draft model's, made together (after
 * those the overlap made while the trip before was out). A draft that fails costs the guesses
 * it had to make now, never a request. */
static void guess_all(ps_sched *s, seq **qs, int n, int room) {
    ps_draft_req req[PS_MB_MAX_SEGS];
    seq *of[PS_MB_MAX_SEGS]; /* the sequence of each request */
    int n_req = 0;
    for (int i = 0; i < n; i++) {
        seq *q = qs[i];
        int k = guess_room(s, q, room), ready = q->n_ready < k ? q->n_ready : k;
        q->guess[0] = q->toks[q->n_done], q->n_guess = q->fresh = 0, q->guess_pos = q->n_done + 1, q->draft_s = 0;
        q->n_ready = 0;
        if (k > 0 && s->o.spec.kind == PS_SPEC_NGRAM)
            q->n_guess = q->fresh = ps_spec_ngram(q->toks, q->n_toks, k, q->guess + 1);
        if (k > 0 && s->o.spec.kind == PS_SPEC_DRAFT) {
            memcpy(q->guess + 1, q->pre + 1, (size_t)ready * sizeof *q->guess); /* the overlap's */
            memcpy(q->dist, q->pre_q + 1, (size_t)ready * sizeof *q->dist);
            memcpy(q->toks + q->n_toks, q->pre + 1, (size_t)ready * sizeof *q->toks); /* beyond n_toks: scratch */
            q->n_guess = ready;
            double sure_min = ps_spec_sure_min(&s->o.spec);
            if (ready < k && (!ready || q->pre_sure >= sure_min)) { /* the rest, while the draft is sure enough */
                of[n_req] = q;
                req[n_req++] = (ps_draft_req){.slot = q->slot,
                                              .toks = q->toks,
                                              .n = q->n_toks + ready,
                                              .k = k - ready,
                                              .sp = &q->gp.sp,
                                              .out = q->guess + 1 + ready,
                                              .dist = q->dist + ready,
                                              .sure_min = sure_min,
                                              .sure = ready ? q->pre_sure : 1};
            }
        }
        room -= s->o.spec.kind == PS_SPEC_DRAFT && k > 0 ? k : q->n_guess;
    }
    char err[300];
    double t0 = ps_now();
    if (n_req && ps_draft_guess_many(s->o.spec.draft, req, n_req, err, sizeof err)) {
        fprintf(stderr, "pipeshard: the draft model failed (these trips go without its new guesses): %s\n", err);
        return;
    }
    double took = ps_now() - t0; /* each waited for all the guesses */
    for (int r = 0; r < n_req; r++) of[r]->n_guess += of[r]->fresh = req[r].n_out, of[r]->draft_s = took;
}

/* A trip of q's came back with the n tokens at got, after compute_s of the stages' compute
 * (0: not known, another micro-batch was out too): the overlap's guesses hold when it kept
 * every guess and pre[0] was its last token; --spec-k auto learns from a decoding trip, the
 * metrics count it. */
static void note_trip(ps_sched *s, seq *q, const ps_result *got, int n, double compute_s) {
    if (!s->o.spec.kind) return;
    q->n_ready = n == q->n_guess + 1 && q->n_pre > 1 && got[n - 1].token == q->pre[0] ? q->n_pre - 1 : 0;
    if (!q->decoding) return;                  /* a prompt's trip: not what a token's costs */
    bool shadow = !q->n_guess && q->n_pre > 0; /* plain: the draft guessed its token meanwhile */
    ps_spec_trip t = {.k = q->n_guess,
                      .kept = n - 1,
                      .drafted = s->o.spec.kind == PS_SPEC_DRAFT ? q->fresh : 0, /* prompt lookup's cost nothing */
                      .draft_s = q->draft_s,
                      .wait_s = ps_now() - q->t_sent,
                      .predrafted = shadow && q->pre_max > 1,
                      .shadow = shadow ? (got[0].token == q->pre[0] ? 1 : -1) : 0,
                      .meanwhile = q->n_meanwhile,
                      .meanwhile_s = q->meanwhile_s,
                      .cut = q->n_pre > 0 && q->n_pre < q->pre_max, /* the answer came first */
                      .crowded = s->crowd != q->crowd,
                      .compute_s = compute_s};
    q->auto_k.overlap = overlap(s);
    ps_spec_auto_add(&q->auto_k, &t);
    ps_spec_auto_trace(&q->auto_k, &t, q->id, s->o.spec.k);
    if (!q->n_guess) return;
    pthread_mutex_lock(&s->mu);
    s->m.spec_trips++, s->m.spec_drafted += (uint64_t)q->n_guess, s->m.spec_kept += (uint64_t)(n - 1);
    s->m.spec_overlapped += q->n_guess > q->fresh;
    pthread_mutex_unlock(&s->mu);
}

/* With the overlap, the guesses q's next trip asks if this one (just sent) keeps every guess:
 * as many as this one's K (which holds until its answer); after a plain trip, auto's next (so
 * that the draft guesses the token meanwhile: auto's acceptance), and after the prompt's, the
 * first decoding trip's. The draft makes them while the trip is out (predraft). */
static int pre_k(const ps_sched *s, seq *q) {
    int k = s->o.spec.k;
    if (q->decoding && !q->n_guess)
        return s->o.spec.auto_k ? ps_spec_auto_k_after_plain(&q->auto_k, k) : 0; /* fixed K: no room, or the end */
    k = next_k(s, q);
    return k > q->n_guess ? k : q->n_guess;
}

/* Whether q rides in group g's next micro-batch: admitted, not waiting for a token, with
 * positions to feed. */
static bool sendable(const seq *q, int g) {
    return q->group == g && !q->in_flight && q->n_table && q->n_toks - q->n_done >= 1;
}

/* Adds q's next segment to the micro-batch being built: n of its positions (and its guesses). */
static void add_seg(ps_sched *s, int *n_segs, seq *q, int n) {
    int left = q->n_toks - q->n_done;
    s->sent[*n_segs] = q;
    s->segs[(*n_segs)++] =
        (ps_coord_seg){.seq = q->id,
                       .pos = q->n_done,
                       .n = n + q->n_guess,
                       .n_draft = q->n_guess,
                       .dist = s->o.spec.kind == PS_SPEC_DRAFT && q->gp.sp.temperature > 0 ? q->dist : NULL,
                       .tokens = q->n_guess ? q->guess : q->toks + q->n_done,
                       .blocks = q->table,
                       .n_blocks = q->n_table,
                       .sample = n == left,
                       .n_top = n == left ? q->top_n : -1,
                       .sp = q->gp.sp};
}

/* Sends the next micro-batch of group g: one row for each of its sequences that decodes (with
 * its guesses when speculating), then chunks of prompts, within the coordinator's rows; beside
 * d decoding rows, at most max(d, PROMPT_ROWS_BESIDE_DECODE / groups) prompt rows, so that a
 * step costs the decoding sequences at most about twice a plain one (their inter-token latency
 * stays even while prompts arrive). The budget is shared by the groups because every stage runs
 * every group's micro-batch in turn: a long one delays the others' tokens too (on 2 and 3
 * stages of one core each, p99/p50 inter-token latency at 16 streams fell from 3.2-4.0 to
 * 2.3-2.6 with a budget of 16 rows per micro-batch instead of 32:
 * docs/bench/2026-12-01-prefixes-device.md). False when it has nothing to send. */
static bool send_group(ps_sched *s, int g) {
    int n_segs = 0, rows = 0, max_rows = ps_coord_max_rows(s->coord);
    bool sample = false;
    for (int i = 0; i < s->n_run && rows < max_rows; i++) /* decoding sequences first */
        if (sendable(s->run[i], g) && s->run[i]->n_toks - s->run[i]->n_done == 1) s->sent[n_segs++] = s->run[i], rows++;
    if (s->o.spec.kind) { /* else n_guess stays 0 */
        for (int k = 0; k < n_segs; k++) s->sent[k]->auto_k.timed = alone(s);
        guess_all(s, s->sent, n_segs, max_rows - rows);
    }
    int n_dec = n_segs;
    n_segs = 0;
    for (int k = 0; k < n_dec; k++) {
        seq *q = s->sent[k];
        rows += q->n_guess;
        add_seg(s, &n_segs, q, 1);
    }
    sample = n_segs > 0;
    if (rows) {
        int budget = PROMPT_ROWS_BESIDE_DECODE / s->n_groups, beside = rows + (rows > budget ? rows : budget);
        max_rows = beside < max_rows ? beside : max_rows;
    }
    for (int i = 0; i < s->n_run && rows < max_rows; i++) { /* then chunks of prompts */
        seq *q = s->run[i];
        int left = q->n_toks - q->n_done;
        if (!sendable(q, g) || left == 1) continue;
        int n = left < max_rows - rows ? left : max_rows - rows;
        q->n_guess = 0;
        add_seg(s, &n_segs, q, n);
        rows += n;
        sample |= n == left;
    }
    if (!n_segs) return false;
    char err[600];
    bool fresh;
    ps_status st = ps_coord_send(s->coord, s->segs, n_segs, &fresh, err, sizeof err);
    if (st) {
        fleet_failed(s, st, err);
        return true;
    }
    double now = ps_now();
    s->solo = sample && !s->n_pend && alone(s);
    if (s->solo) s->solo_compute = ps_coord_compute_s(s->coord);
    s->crowd += n_segs > n_dec;
    for (int k = 0; k < n_segs; k++) {
        seq *q = s->sent[k];
        q->decoding = k < n_dec, q->crowd = s->crowd - (n_segs > n_dec);
        q->n_done += s->segs[k].n - s->segs[k].n_draft; /* a guess counts once the last stage keeps it */
        q->t_sent = now;
        q->in_flight = s->segs[k].sample;
        q->n_pre = q->n_meanwhile = 0, q->meanwhile_s = 0, q->pre_sure = 1;
        q->pre_max = !q->in_flight || !reads(s) ? 0 : overlap(s) ? 1 + pre_k(s, q) : !q->decoding; /* 1: reads */
        ps_kv_seq_publish(s->kv, q->table, q->toks, q->n_done);
    }
    if (sample) s->group_busy[g] = true, s->pend_group[s->n_pend++] = g;
    return true;
}

/* The running sequence of id, or NULL (it ended). */
static seq *running(ps_sched *s, uint64_t id) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->id == id) return s->run[i];
    return NULL;
}

/* While micro-batches are out: for each sequence whose trip is out (a prompt's, or with the
 * overlap any), the draft's next tokens as if the trip keeps every guess, into q->pre, one pass
 * a guess for all of them: its guess of the trip's last token (which reads the trip's tokens)
 * whatever comes, then up to q->pre_max while no answer has come (it waits for one pass at
 * most). A failure only leaves fewer drafted: the next trips draft the rest as usual. */
static void predraft(ps_sched *s) {
    ps_draft_req req[PS_MB_MAX_SEGS];
    seq *of[PS_MB_MAX_SEGS];
    char err[300];
    for (;;) {
        bool heard = ps_coord_heard(s->coord);
        int n = 0;
        for (int i = 0; i < s->n_run; i++) {
            seq *q = s->run[i];
            int at = q->n_toks + q->n_guess + q->n_pre; /* the tokens it reads: the trip's, then its own */
            if (!q->in_flight || q->n_pre >= q->pre_max || (q->n_pre && heard) || at >= s->n_ctx) continue;
            memcpy(q->toks + q->n_toks, q->guess + 1, (size_t)q->n_guess * sizeof *q->toks); /* scratch */
            memcpy(q->toks + q->n_toks + q->n_guess, q->pre, (size_t)q->n_pre * sizeof *q->toks);
            s->crowd += !q->decoding && !q->n_pre; /* reading a prompt: the trips out wait for it */
            of[n] = q;
            req[n++] = (ps_draft_req){.slot = q->slot,
                                      .toks = q->toks,
                                      .n = at,
                                      .k = 1,
                                      .sp = &q->gp.sp,
                                      .out = q->pre + q->n_pre,
                                      .dist = q->pre_q + q->n_pre,
                                      .sure_min = ps_spec_sure_min(&s->o.spec),
                                      .sure = 1};
        }
        if (!n) return;
        double t0 = ps_now();
        if (ps_draft_guess_many(s->o.spec.draft, req, n, err, sizeof err)) {
            for (int r = 0; r < n; r++) of[r]->pre_max = of[r]->n_pre;
            return;
        }
        double took = ps_now() - t0;
        for (int r = 0; r < n; r++) {
            seq *q = of[r];
            if (req[r].n_out < 1)
                q->pre_max = q->n_pre; /* not one of the target's tokens */
            else if (q->n_pre++)       /* the others time a guess, and make the next trip's */
                q->n_meanwhile++, q->meanwhile_s += took, q->pre_sure *= req[r].sure;
            if (q->pre_sure < ps_spec_sure_min(&s->o.spec)) q->pre_max = q->n_pre; /* no longer sure enough */
        }
    }
}

/* Receives the tokens of the oldest micro-batch in flight and hands them to their sequences
 * (meanwhile the draft reads the prompts out, and with the overlap guesses on). */
static void receive(ps_sched *s) {
    int n_res;
    char err[600];
    if (reads(s)) predraft(s);
    ps_status st = ps_coord_recv(s->coord, s->res, &n_res, err, sizeof err);
    if (st) return fleet_failed(s, st, err);
    double compute = s->solo ? ps_coord_compute_s(s->coord) - s->solo_compute : 0; /* 0: not known */
    s->solo = false;
    s->fails = 0;
    s->group_busy[s->pend_group[0]] = false;
    memmove(s->pend_group, s->pend_group + 1, (size_t)--s->n_pend * sizeof *s->pend_group);
    for (int k = 0, e; k < n_res; k = e) { /* a sequence's results in a row: a trip's tokens, in order */
        for (e = k + 1; e < n_res && s->res[e].seq == s->res[k].seq;) e++;
        seq *q = running(s, s->res[k].seq);
        if (q) note_trip(s, q, s->res + k, e - k, compute);
        for (int j = k; j < e && (q = running(s, s->res[k].seq)); j++) on_token(s, q, &s->res[j]);
    }
}

// ---------------------------------------------------------------------------------------
// Captured prefixes

/* Sets the state of prefix record i (under s->mu: ps_sched_prefixes reads it) and says it on stderr. */
static void pfx_state(ps_sched *s, int i, ps_prefix_state state, const char *why) {
    pthread_mutex_lock(&s->mu);
    ps_sched_prefix *st = &s->pfx_st[i];
    st->state = state;
    snprintf(st->why, sizeof st->why, "%s", why ? why : "");
    pthread_mutex_unlock(&s->mu);
    const char *what = state == PS_PREFIX_RESTORED   ? "restored"
                       : state == PS_PREFIX_CAPTURED ? "captured"
                                                     : "not restored";
    fprintf(stderr, "pipeshard: prefix %016llx (%d tokens) %s%s%s\n", (unsigned long long)st->id, st->n_tokens, what,
            why && why[0] ? ": " : "", why ? why : "");
}

/* Adds record p (its tokens now the scheduler's), or finds the one of its id (p's tokens
 * are then freed); returns its index, or -1 when memory is out (p's tokens freed too). */
static int pfx_add(ps_sched *s, ps_prefix *p) {
    int i = 0;
    while (i < s->n_pfx && s->pfx[i].id != p->id) i++;
    if (i < s->n_pfx) return free(p->tokens), i;
    pthread_mutex_lock(&s->mu);
    if (s->n_pfx == s->cap_pfx) {
        int cap = 2 * s->cap_pfx + 8;
        ps_prefix *a = ps_realloc(s->pfx, (size_t)cap * sizeof *a);
        if (a) s->pfx = a;
        ps_sched_prefix *b = a ? ps_realloc(s->pfx_st, (size_t)cap * sizeof *b) : NULL;
        if (b) s->pfx_st = b, s->cap_pfx = cap;
    }
    if (s->n_pfx < s->cap_pfx) {
        i = s->n_pfx++;
        s->pfx[i] = *p;
        s->pfx_st[i] =
            (ps_sched_prefix){.id = p->id, .n_tokens = p->n_tokens, .n_stages = p->n_stages, .created = p->created};
    } else {
        free(p->tokens), i = -1;
    }
    pthread_mutex_unlock(&s->mu);
    return i;
}

/* Restores prefix record i into free blocks of every stage and publishes them in the prefix
 * cache; nothing runs on the blocks meanwhile. An error only when the fleet failed. */
static ps_status restore_one(ps_sched *s, int i, int32_t *table) {
    const ps_prefix *p = &s->pfx[i];
    int n = p->n_tokens / PS_KV_BLOCK, n_cached;
    char why[700] = "";
    ps_kv_stats kst;
    ps_kv_get_stats(s->kv, &kst);
    if (p->why[0])
        snprintf(why, sizeof why, "%s", p->why);
    else if (strcmp(p->model_fp, s->model_fp))
        snprintf(why, sizeof why, "it was captured under another model (fingerprint %s; this one's is %s)", p->model_fp,
                 s->model_fp);
    else if (bad_id(p->tokens, p->n_tokens, s->vocab) >= 0)
        snprintf(why, sizeof why, "it holds token ids outside the model's vocabulary (0..%d)", s->vocab - 1);
    else if (p->n_tokens > s->n_ctx)
        snprintf(why, sizeof why, "its %d tokens exceed this fleet's context of %d", p->n_tokens, s->n_ctx);
    else if (kst.free < n || ps_kv_seq_alloc(s->kv, p->tokens, p->n_tokens, p->n_tokens, table, &n_cached))
        snprintf(why, sizeof why, "it needs %d KV blocks and %d are free", n, kst.free);
    if (why[0]) return pfx_state(s, i, PS_PREFIX_REFUSED, why), PS_OK;
    ps_kv_msg m = {.id = p->id, .n = n, .blocks = table, .tokens = p->tokens};
    ps_status st = ps_coord_kv(s->coord, false, s->o.prefix_dir, &m, why, sizeof why);
    if (!st) ps_kv_seq_publish(s->kv, table, p->tokens, p->n_tokens);
    ps_kv_seq_release(s->kv, table, n);
    pfx_state(s, i, st ? PS_PREFIX_REFUSED : PS_PREFIX_RESTORED, st ? why : NULL);
    return ps_coord_connected(s->coord) ? PS_OK : st;
}

/* Restores every captured prefix (the stages' KV caches are fresh); an error (in err) only
 * when the fleet failed. */
static ps_status restore_prefixes(ps_sched *s, char *err, size_t errlen) {
    int32_t *table = ps_malloc((size_t)ps_kv_blocks_for(s->n_ctx) * sizeof *table);
    if (!table) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_status st = PS_OK;
    for (int i = 0; !st && i < s->n_pfx; i++) st = restore_one(s, i, table);
    free(table);
    if (st) ps_errf(err, errlen, st, "the fleet failed while prefixes were restored");
    s->kv_lost = false;
    return st;
}

/* Saves capture q's whole blocks on every stage and its record, then ends q (nothing is in
 * flight). */
static void save_prefix(ps_sched *s, seq *q) {
    int n = q->n_prompt / PS_KV_BLOCK;
    ps_prefix p = {.id = ps_prefix_id(s->model_fp, q->toks, n * PS_KV_BLOCK),
                   .n_stages = ps_coord_n_stages(s->coord),
                   .n_tokens = n * PS_KV_BLOCK,
                   .created = (long long)time(NULL)};
    memcpy(p.model_fp, s->model_fp, sizeof p.model_fp);
    ps_kv_msg m = {.id = p.id, .n = n, .blocks = q->table, .tokens = q->toks};
    char err[1200];
    ps_status st = ps_coord_kv(s->coord, true, s->o.prefix_dir, &m, err, sizeof err);
    bool lost = !ps_coord_connected(s->coord);
    if (!st && !(p.tokens = ps_malloc((size_t)p.n_tokens * sizeof *p.tokens)))
        st = ps_errf(err, sizeof err, PS_ERR_NOMEM, "out of memory");
    if (!st) memcpy(p.tokens, q->toks, (size_t)p.n_tokens * sizeof *p.tokens);
    if (!st) st = ps_prefix_write(s->o.prefix_dir, &p, err, sizeof err);
    if (!st) {
        int i = pfx_add(s, &p); /* the tokens are its now */
        p.tokens = NULL;
        if (i < 0)
            st = ps_errf(err, sizeof err, PS_ERR_NOMEM, "out of memory");
        else
            pfx_state(s, i, PS_PREFIX_CAPTURED, NULL);
    }
    free(p.tokens);
    q->prefix = p.id;
    finish(s, q, PS_STOP_LENGTH, st, err);
    if (lost) fleet_failed(s, st, err);
}

/* Records the coordinator's figures and the book's, after a round. */
static void snapshot(ps_sched *s) {
    ps_coord_stats cs;
    ps_coord_get_stats(s->coord, &cs);
    pthread_mutex_lock(&s->mu);
    s->m.coord = cs;
    ps_kv_get_stats(s->kv, &s->kv_st);
    pthread_mutex_unlock(&s->mu);
}

/* One round of the engine: the cancelled, then micro-batches for the groups that wait for
 * nothing, then one answer. False when there was nothing to do. */
static bool round_once(ps_sched *s, seq *gone) {
    bool did = gone != NULL;
    while (gone) {
        seq *q = gone;
        gone = q->next;
        finish(s, q, PS_STOP_CANCELLED, PS_OK, NULL);
    }
    for (int i = s->n_run - 1; i >= 0; i--)
        if (atomic_load(&s->run[i]->cancelled) && !s->run[i]->in_flight)
            finish(s, s->run[i], PS_STOP_CANCELLED, PS_OK, NULL), did = true;
    char err[600];
    ps_status st = PS_OK;
    if (s->n_run && !ps_coord_connected(s->coord)) /* after a failure: a new session, its KV empty */
        st = ps_coord_connect(s->coord, err, sizeof err);
    if (!st && s->kv_lost && ps_coord_connected(s->coord)) st = restore_prefixes(s, err, sizeof err);
    if (st) return fleet_failed(s, st, err), true;
    bool saving = false; /* a capture waits for the ring to empty */
    for (int i = 0; i < s->n_run; i++) saving |= s->run[i]->saving;
    for (int g = 0; g < s->n_groups && !saving; g++)
        while (!s->group_busy[g] && send_group(s, g)) did = true;
    if (s->n_pend) {
        receive(s), did = true;
    } else if (saving) {
        for (int i = s->n_run - 1; i >= 0; i--)
            if (i < s->n_run && s->run[i]->saving) save_prefix(s, s->run[i]);
        did = true;
    }
    snapshot(s);
    return did;
}

/* The engine thread: rounds until the scheduler is closed and nothing is left. */
static void *engine(void *arg) {
    ps_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        seq *gone = take_cancelled(s);
        admit_queued(s);
        bool idle = !gone && !s->n_run;
        if (idle && s->closed && !s->head) break;
        if (idle) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        bool did = round_once(s, gone);
        pthread_mutex_lock(&s->mu);
        if (!did && !s->closed) pthread_cond_wait(&s->cv, &s->mu); /* only cancels can move it on */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Create, close, free, metrics

/* The prefix directory (made when missing), the model's fingerprint, and the prefixes
 * captured before, restored. */
static ps_status open_prefixes(ps_sched *s, char *err, size_t errlen) {
    ps_prefix *recs;
    int n;
    ps_status st = ps_make_dirs(s->o.prefix_dir, 0700, err, errlen);
    if (!st) st = ps_coord_model_fp(s->coord, s->model_fp, err, errlen);
    if (!st) st = ps_prefix_scan(s->o.prefix_dir, &recs, &n, err, errlen);
    for (int i = 0; !st && i < n; i++)
        if (pfx_add(s, &recs[i]) < 0) { /* the tokens of those added are the scheduler's now */
            st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
            for (int j = i + 1; j < n; j++) free(recs[j].tokens);
        }
    free(recs);
    if (!st) st = restore_prefixes(s, err, errlen);
    return st;
}

ps_status ps_sched_create(ps_launch *l, const ps_sched_opts *o, ps_sched **out, char *err, size_t errlen) {
    *out = NULL;
    if (o->parallel < 1 || o->queue_max < 0)
        return ps_errf(err, errlen, PS_ERR_ARG, "parallel must be >= 1 and queue_max >= 0 (got %d, %d)", o->parallel,
                       o->queue_max);
    ps_coord *c = ps_launch_coord(l);
    if (o->parallel > ps_coord_max_segs(c))
        return ps_errf(err, errlen, PS_ERR_ARG, "%d sequences at once, but the fleet was set up for %d", o->parallel,
                       ps_coord_max_segs(c));
    if (o->spec.kind == PS_SPEC_DRAFT && (!o->spec.draft || ps_draft_slots(o->spec.draft) < o->parallel))
        return ps_errf(err, errlen, PS_ERR_ARG, "the draft model holds fewer sequences than %d", o->parallel);
    if (o->spec.kind && (o->spec.k < 1 || o->spec.k > ps_coord_max_draft(c)))
        return ps_errf(err, errlen, PS_ERR_ARG, "%d guesses per trip, but the fleet was set up for %d", o->spec.k,
                       ps_coord_max_draft(c));
    ps_sched *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    s->launch = l, s->coord = c, s->tok = ps_launch_tok(l), s->o = *o;
    s->n_ctx = ps_coord_n_ctx(c), s->vocab = ps_coord_model(c)->hp.vocab;
    s->n_groups = ps_coord_n_stages(c) < o->parallel ? ps_coord_n_stages(c) : o->parallel;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->run = ps_calloc((size_t)o->parallel, sizeof *s->run);
    s->segs = ps_calloc((size_t)o->parallel, sizeof *s->segs);
    s->sent = ps_calloc((size_t)o->parallel, sizeof *s->sent);
    s->res = ps_calloc((size_t)ps_coord_max_results(c), sizeof *s->res);
    s->slot_used = ps_calloc((size_t)o->parallel, sizeof *s->slot_used);
    ps_status st = !s->run || !s->segs || !s->sent || !s->res || !s->slot_used
                       ? ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory")
                       : PS_OK;
    if (!st) st = ps_kv_create(ps_coord_n_blocks(c), o->prefix_cache, &s->kv, err, errlen);
    if (!st && o->prefix_cache && o->prefix_dir) st = open_prefixes(s, err, errlen);
    if (st) {
        ps_sched_free(s);
        return st;
    }
    ps_coord_get_stats(s->coord, &s->m.coord);
    ps_kv_get_stats(s->kv, &s->kv_st);
    int rc = pthread_create(&s->thread, NULL, engine, s);
    if (rc) {
        ps_sched_free(s);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "cannot start the engine thread: %s", strerror(rc));
    }
    s->thread_started = true;
    ps_thread_unpin(); /* the engine thread keeps the caller's CPU (thread 0 of a pinned pool) */
    *out = s;
    return PS_OK;
}

void ps_sched_close(ps_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    for (seq *q = s->head; q; q = q->next) atomic_store(&q->cancelled, true);
    for (int i = 0; i < s->n_run; i++) atomic_store(&s->run[i]->cancelled, true);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ps_sched_free(ps_sched *s) {
    if (!s) return;
    ps_sched_close(s);
    if (s->thread_started) pthread_join(s->thread, NULL);
    ps_kv_free(s->kv);
    ps_prefix_free(s->pfx, s->n_pfx);
    free(s->pfx_st);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->run), free(s->segs), free(s->sent), free(s->res), free(s->slot_used), free(s->tail_text);
    free(s);
}

void ps_sched_metrics_get(ps_sched *s, ps_sched_metrics *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->m;
    out->queued = s->queued;
    out->running = s->n_run;
    out->parallel = s->o.parallel, out->queue_max = s->o.queue_max;
    out->kv_blocks_total = s->kv_st.n_blocks;
    out->kv_blocks_used = s->kv_st.used;
    out->kv_blocks_cached = s->kv_st.cached;
    pthread_mutex_unlock(&s->mu);
}

int ps_sched_prefixes(ps_sched *s, ps_sched_prefix *out, int cap) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_pfx;
    if (n && cap > 0) memcpy(out, s->pfx_st, (size_t)(n < cap ? n : cap) * sizeof *out);
    pthread_mutex_unlock(&s->mu);
    return n;
}
