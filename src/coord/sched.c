/* sched.c - the scheduler (sched.h): a FIFO of requests and one engine thread that runs them,
 * one at a time, through a ps_session.
 *
 * Front: submit, cancel, close and the metrics, under one mutex. Engine: a loop of rounds; a
 * round hands out DONE for queued requests that were cancelled, starts the queue's head
 * when nothing runs, or takes one step of the running sequence. Callbacks run outside the
 * mutex, so that they may call ps_sched_cancel or ps_sched_submit. A multi-sequence engine
 * replaces the round's "start one, step one" by "admit what fits, step every running
 * sequence in micro-batches"; the front and the events stay. */
#include "sched.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

const double ps_sched_hist_bounds[PS_SCHED_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                            0.25,  0.5,    1,     2.5,  5,     10,   INFINITY};

/* One request, from submit to DONE. */
typedef struct seq {
    struct seq *next; /* in the queue */
    uint64_t id;
    int32_t *prompt; /* (n_prompt) */
    int n_prompt;
    ps_gen_params gp;
    ps_stop *stop; /* the stop strings' matcher */
    int top_n;     /* -1: no log-probabilities */
    ps_sched_cb cb;
    void *ctx;
    atomic_bool cancelled;
    bool started; /* the prompt was given to the session */
    int n_generated, n_cached;
    double t_submit, t_start, t_first, t_last; /* ps_now(); t_first 0 until the first step */
} seq;

struct ps_sched {
    ps_launch *launch;
    ps_coord *coord;
    const ps_tok *tok;
    ps_session *session; /* the engine thread's */
    ps_sched_opts o;
    int n_ctx, vocab, n_stages;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* the engine waits on it for work */
    seq *head, *tail;   /* the queue, FIFO */
    int queued;
    seq *running; /* the engine's sequence, for ps_sched_cancel */
    bool closed;
    uint64_t next_id;
    int held;           /* positions the stages hold (the running sequence's, or the prefix kept) */
    ps_sched_metrics m; /* counters; queued, running and the KV blocks filled in on reading */
    /* engine-thread buffers */
    int32_t top_ids[PS_SCHED_MAX_TOP_LOGPROBS];
    float top_lp[PS_SCHED_MAX_TOP_LOGPROBS];
    char *tail_text; /* (tail_cap) the text a DONE carries */
    size_t tail_cap;
};

// ---------------------------------------------------------------------------------------
// Requests

/* Frees a request; NULL is a no-op. */
static void seq_free(seq *q) {
    if (!q) return;
    ps_stop_free(q->stop);
    free(q->prompt);
    free(q);
}

/* Checks request r against what the scheduler runs; the message names what is wrong. */
static ps_status check_request(const ps_sched *s, const ps_sched_request *r, char *err, size_t errlen) {
    if (!r->prompt || r->n_prompt <= 0) return ps_errf(err, errlen, PS_ERR_ARG, "the prompt is empty");
    if (r->n_prompt > s->n_ctx)
        return ps_errf(err, errlen, PS_ERR_RANGE, "the prompt has %d tokens, more than the context size of %d",
                       r->n_prompt, s->n_ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->vocab)
            return ps_errf(err, errlen, PS_ERR_ARG,
                           "token id %d of the prompt is not in the model's vocabulary (0..%d)", r->prompt[i],
                           s->vocab - 1);
    if (r->top_logprobs < -1 || r->top_logprobs > PS_SCHED_MAX_TOP_LOGPROBS)
        return ps_errf(err, errlen, PS_ERR_ARG, "top_logprobs is %d; it must be 0 to %d", r->top_logprobs,
                       PS_SCHED_MAX_TOP_LOGPROBS);
    if (r->top_logprobs >= 0 && s->n_stages > 1)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "log-probabilities need the whole model in one process: on a fleet of %d stages the logits "
                       "stay on the last stage (they never cross the network)",
                       s->n_stages);
    if (r->gp.n_predict < -1) return ps_errf(err, errlen, PS_ERR_ARG, "n_predict is %lld", (long long)r->gp.n_predict);
    return ps_sample_params_check(&r->gp.sp, err, errlen);
}

/* A request made from r (copied), or NULL with the message in err. */
static seq *seq_make(const ps_sched_request *r, ps_sched_cb cb, void *ctx, char *err, size_t errlen, ps_status *st) {
    seq *q = ps_calloc(1, sizeof *q);
    if (!q || !(q->prompt = ps_malloc((size_t)r->n_prompt * sizeof *q->prompt))) {
        seq_free(q);
        *st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if ((*st = ps_stop_create(r->stop, r->n_stop, &q->stop, err, errlen))) {
        seq_free(q);
        return NULL;
    }
    memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof *q->prompt);
    q->n_prompt = r->n_prompt, q->gp = r->gp, q->top_n = r->top_logprobs, q->cb = cb, q->ctx = ctx;
    atomic_init(&q->cancelled, false);
    q->t_submit = ps_now();
    return q;
}

ps_status ps_sched_submit(ps_sched *s, const ps_sched_request *r, ps_sched_cb cb, void *ctx, uint64_t *id, char *err,
                          size_t errlen) {
    *id = 0;
    ps_status st = check_request(s, r, err, errlen);
    seq *q = st ? NULL : seq_make(r, cb, ctx, err, errlen, &st);
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
    if (st && s->running && s->running->id == id) atomic_store(&s->running->cancelled, true), st = PS_OK;
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

/* Ends request q: the text still held back (the detokenizer's, then the stop matcher's) goes
 * with the DONE event, the counters are updated, and q is freed. A stop string completed by
 * that text makes the reason PS_STOP_STOP. status / msg: a failure (stop is then NONE); no
 * memory for the held-back text is one too. */
static void finish(ps_sched *s, seq *q, ps_stop_reason stop, ps_status status, const char *msg) {
    size_t len = 0;
    const char *t;
    size_t n;
    bool stopped = stop == PS_STOP_STOP, ok = true;
    if (q->started && !stopped && !status) {
        ps_session_flush(s->session, &t, &n);
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
                                   .total_s = now - q->t_submit}};
    pthread_mutex_lock(&s->mu);
    s->m.ended[ev.stop]++;
    s->m.prompt_tokens += (uint64_t)q->n_prompt;
    s->m.generated_tokens += (uint64_t)q->n_generated;
    s->m.cached_tokens += (uint64_t)q->n_cached;
    s->m.prefix_hits += q->n_cached > 0;
    if (s->running == q) s->running = NULL;
    pthread_mutex_unlock(&s->mu);
    q->cb(q->ctx, &ev);
    seq_free(q);
}

/* Reports one generated token of q: its log-probabilities when asked, and the text that the
 * stop matcher releases. Returns PS_STOP_STOP when a stop string completed (q is to end),
 * PS_STOP_NONE otherwise; *nomem when the matcher had no memory (q is to fail). */
static ps_stop_reason emit_token(ps_sched *s, seq *q, const ps_session_step *st, double now, bool *nomem) {
    ps_sched_event ev = {.kind = PS_SCHED_TOKEN, .id = q->id, .token = st->token};
    if (q->top_n >= 0) {
        const float *logits = ps_coord_logits(s->coord);
        if (logits) {
            double lse = ps_sample_top_logprobs(logits, s->vocab, q->top_n, s->top_ids, s->top_lp);
            ev.logprob = (float)((double)logits[st->token] - lse);
            ev.n_top = q->top_n < s->vocab ? q->top_n : s->vocab;
            ev.top_ids = s->top_ids, ev.top_logprobs = s->top_lp;
        }
    }
    bool stopped = false;
    if ((*nomem = ps_stop_push(q->stop, st->text, st->len, &ev.text, &ev.len, &stopped) != PS_OK)) return PS_STOP_NONE;
    pthread_mutex_lock(&s->mu);
    if (q->n_generated) hist_add(&s->m.itl, now - q->t_last);
    pthread_mutex_unlock(&s->mu);
    q->n_generated++, q->t_last = now;
    q->cb(q->ctx, &ev);
    return stopped ? PS_STOP_STOP : PS_STOP_NONE;
}

// ---------------------------------------------------------------------------------------
// Engine

/* Records what the stages hold and the coordinator's figures, after a step or an end. */
static void snapshot(ps_sched *s) {
    ps_session_stats ss;
    ps_coord_stats cs;
    ps_session_get_stats(s->session, &ss);
    ps_coord_get_stats(s->coord, &cs);
    pthread_mutex_lock(&s->mu);
    s->held = ss.n_held;
    s->m.coord = cs;
    pthread_mutex_unlock(&s->mu);
}

/* Gives q's prompt to the session (the stages keep the prefix it shares with what they hold,
 * unless the prefix cache is off). */
static void begin(ps_sched *s, seq *q) {
    char err[512] = "";
    q->t_start = ps_now();
    if (atomic_load(&q->cancelled)) return finish(s, q, PS_STOP_CANCELLED, PS_OK, NULL);
    if (!s->o.prefix_cache) ps_session_reset(s->session);
    ps_status st = ps_session_prompt_ids(s->session, q->prompt, q->n_prompt, &q->gp, err, sizeof err);
    if (st) return finish(s, q, PS_STOP_NONE, st, err);
    ps_session_stats ss;
    ps_session_get_stats(s->session, &ss);
    q->n_cached = ss.n_reused;
    q->started = true;
}

/* One step of q: a token (the prompt's first), or its end. */
static void step(ps_sched *s, seq *q) {
    char err[512] = "";
    if (atomic_load(&q->cancelled)) return finish(s, q, PS_STOP_CANCELLED, PS_OK, NULL);
    ps_session_step st;
    ps_status e = ps_session_next(s->session, &st, err, sizeof err);
    double now = ps_now();
    snapshot(s);
    if (e) return finish(s, q, PS_STOP_NONE, e, err);
    if (!q->t_first) {
        q->t_first = now;
        pthread_mutex_lock(&s->mu);
        hist_add(&s->m.ttft, now - q->t_submit);
        pthread_mutex_unlock(&s->mu);
    }
    bool nomem = false;
    if (st.token >= 0 && st.stop != PS_STOP_EOS && emit_token(s, q, &st, now, &nomem) == PS_STOP_STOP)
        return finish(s, q, PS_STOP_STOP, PS_OK, NULL);
    if (nomem) return finish(s, q, PS_STOP_NONE, PS_ERR_NOMEM, "out of memory");
    if (st.stop) finish(s, q, st.stop, PS_OK, NULL);
}

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

/* The engine thread: rounds until the scheduler is closed and nothing is left. */
static void *engine(void *arg) {
    ps_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        seq *gone = take_cancelled(s), *start = NULL, *run = s->running;
        if (!gone && !run && s->head) {
            start = s->running = s->head;
            if (!(s->head = start->next)) s->tail = NULL;
            start->next = NULL;
            s->queued--;
        }
        if (!gone && !run && !start) {
            if (s->closed) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        while (gone) {
            seq *q = gone;
            gone = q->next;
            finish(s, q, PS_STOP_CANCELLED, PS_OK, NULL);
        }
        if (start) {
            begin(s, start);
            snapshot(s);
        } else if (run) {
            step(s, run);
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Create, close, free, metrics

ps_status ps_sched_create(ps_launch *l, const ps_sched_opts *o, ps_sched **out, char *err, size_t errlen) {
    *out = NULL;
    if (o->parallel < 1 || o->queue_max < 0)
        return ps_errf(err, errlen, PS_ERR_ARG, "parallel must be >= 1 and queue_max >= 0 (got %d, %d)", o->parallel,
                       o->queue_max);
    ps_sched *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    s->launch = l, s->coord = ps_launch_coord(l), s->tok = ps_launch_tok(l), s->o = *o;
    s->n_ctx = ps_coord_n_ctx(s->coord), s->vocab = ps_coord_model(s->coord)->hp.vocab;
    s->n_stages = ps_coord_n_stages(s->coord);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    ps_status st = ps_session_create(s->coord, s->tok, &s->session, err, errlen);
    if (st) {
        ps_sched_free(s);
        return st;
    }
    ps_coord_get_stats(s->coord, &s->m.coord);
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
    if (s->running) atomic_store(&s->running->cancelled, true);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ps_sched_free(ps_sched *s) {
    if (!s) return;
    ps_sched_close(s);
    if (s->thread_started) pthread_join(s->thread, NULL);
    ps_session_free(s->session);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->tail_text);
    free(s);
}

/* Positions in KV blocks, rounded up. */
static int blocks(int positions) { return (positions + PS_SCHED_KV_BLOCK - 1) / PS_SCHED_KV_BLOCK; }

void ps_sched_metrics_get(ps_sched *s, ps_sched_metrics *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->m;
    out->queued = s->queued;
    out->running = s->running != NULL;
    out->parallel = s->o.parallel, out->queue_max = s->o.queue_max;
    out->kv_blocks_total = blocks(s->n_ctx);
    out->kv_blocks_used = s->running ? blocks(s->held) : 0;
    out->kv_blocks_cached = !s->running && s->o.prefix_cache ? blocks(s->held) : 0;
    pthread_mutex_unlock(&s->mu);
}
