/* session.c - a generation's token loop on the coordinator (session.h). */
#include "session.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "draft.h"
#include "spec.h"

struct ps_session {
    ps_coord *coord;
    const ps_tok *tok;     /* NULL: ids in and out */
    const ps_model *m;     /* stage 0's model: the chat template, the vocabulary size */
    ps_tok_stream *stream; /* with tok */
    int n_ctx;
    int32_t *toks; /* (n_ctx + 1) prompt, then generated tokens; the last one
                      generated is never fed when the context is full */
    int n_toks, n_prompt;
    int32_t *next; /* (n_ctx) a new prompt, before it replaces toks */
    int n_fed;     /* positions of toks whose keys and values every stage holds */
    int n_reused;  /* of them, those the current prompt kept from the last one */
    ps_gen_params gp;
    bool started; /* the prompt went around the ring */
    ps_stop_reason stop;
    atomic_bool cancel;
    double ttft_s, decode_s;
    int n_decode;
    ps_spec_opts spec;                     /* speculation (kind PS_SPEC_OFF: none) */
    int32_t got[PS_MAX_DRAFT + 1];         /* the tokens of the latest trip not yet returned */
    int n_got, i_got;                      /* got[i_got..n_got) are still to come */
    int n_trips, n_drafted, n_kept;        /* speculative trips, guesses sent, guesses kept */
    int by_k[PS_MAX_DRAFT + 1];            /* decoding trips by their guesses */
    ps_spec_auto auto_k;                   /* --spec-k auto's measurements */
    int32_t trip[PS_MAX_DRAFT + 1];        /* the trip out: the token before, then its guesses */
    ps_draft_dist trip_q[PS_MAX_DRAFT];    /* a sampling draft model's: the guesses' distributions */
    int n_trip;                            /* its guesses */
    int32_t pre[PS_MAX_DRAFT + 2];         /* overlap: the draft's next tokens had every guess been kept */
    ps_draft_dist pre_q[PS_MAX_DRAFT + 2]; /* ... their distributions */
    int n_pre;                             /* ... how many; pre[0] is its guess of the trip's last token */
    int pre_k;                             /* ... the guesses the next trip asks (draft(): this trip's K, which
                                              holds until its answer; a plain trip: auto's next) */
    int n_ready;                           /* the next trip's guesses, pre[1..1 + n_ready), when pre[0] came true */
    int n_meanwhile;                       /* overlap: guesses made after pre[0] while the trip was out */
    double meanwhile_s;                    /* ... their seconds (auto's seconds a guess) */
    bool pre_cut;                          /* ... fewer than it meant to make: the answer came first */
    double pre_sure;                       /* ... how sure the draft was of pre[1..n_pre) (spec.h, PS_SPEC_SURE) */
    int n_overlap;                         /* trips whose guesses the overlap had drafted */
};

const char *ps_stop_reason_name(ps_stop_reason r) {
    static const char *const names[] = {"none", "eos", "length", "context", "cancelled", "stop"};
    return (unsigned)r < PS_ARRAY_LEN(names) ? names[r] : "unknown";
}

ps_gen_params ps_gen_params_default(void) { return (ps_gen_params){.sp = ps_sample_params_cli(), .n_predict = 128}; }

ps_status ps_session_create(ps_coord *c, const ps_tok *tok, ps_session **out, char *err, size_t errlen) {
    *out = NULL;
    ps_session *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    s->coord = c, s->tok = tok, s->m = ps_coord_model(c), s->n_ctx = ps_coord_n_ctx(c);
    atomic_init(&s->cancel, false);
    if (!(s->toks = ps_malloc(((size_t)s->n_ctx + 1) * sizeof *s->toks)) ||
        !(s->next = ps_malloc((size_t)s->n_ctx * sizeof *s->next)) ||
        (tok && ps_tok_stream_create(tok, 0, &s->stream))) {
        ps_session_free(s);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return PS_OK;
}

void ps_session_free(ps_session *s) {
    if (!s) return;
    ps_tok_stream_free(s->stream);
    free(s->toks);
    free(s->next);
    free(s);
}

/* Starts a generation over the n_prompt tokens in s->next. The longest prefix they share
 * with what every stage already holds is kept (at least one token runs, for the logits). */
static ps_status start(ps_session *s, int n_prompt, const ps_gen_params *gp, char *err, size_t errlen) {
    ps_status st = ps_sample_params_check(&gp->sp, err, errlen);
    if (st) return st;
    int keep = 0;
    int fed = s->n_fed < s->n_toks ? s->n_fed : s->n_toks; /* a guess fed after an end counts not */
    while (keep < fed && keep < n_prompt - 1 && s->toks[keep] == s->next[keep]) keep++;
    memcpy(s->toks + keep, s->next + keep, (size_t)(n_prompt - keep) * sizeof *s->toks);
    s->gp = *gp;
    s->n_prompt = s->n_toks = n_prompt;
    s->n_fed = s->n_reused = keep;
    s->started = false;
    s->stop = PS_STOP_NONE;
    atomic_store(&s->cancel, false);
    s->ttft_s = s->decode_s = 0;
    s->n_decode = 0;
    s->n_got = s->i_got = 0;
    s->n_trips = s->n_drafted = s->n_kept = 0;
    memset(s->by_k, 0, sizeof s->by_k);
    s->n_pre = s->n_ready = s->n_overlap = 0;
    ps_spec_auto_carry(&s->auto_k, &s->auto_k); /* the ring and the draft as the generation before measured them */
    if (s->stream) ps_tok_stream_reset(s->stream);
    return PS_OK;
}

void ps_session_reset(ps_session *s) { s->n_fed = 0; }

/* The message of a prompt of n tokens that does not fit the context. */
static ps_status too_long(const ps_session *s, long long n, char *err, size_t errlen) {
    return ps_errf(err, errlen, PS_ERR_RANGE,
                   "the prompt has %lld tokens, more than the context size of %d "
                   "(-c/--ctx-size)",
                   n, s->n_ctx);
}

ps_status ps_session_prompt_ids(ps_session *s, const int32_t *ids, int n, const ps_gen_params *gp, char *err,
                                size_t errlen) {
    if (n <= 0) return ps_errf(err, errlen, PS_ERR_ARG, "the prompt is empty");
    if (n > s->n_ctx) return too_long(s, n, err, errlen);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->m->hp.vocab)
            return ps_errf(err, errlen, PS_ERR_ARG,
                           "token id %d of the prompt is not in the model's vocabulary (0..%d)", ids[i],
                           s->m->hp.vocab - 1);
    memcpy(s->next, ids, (size_t)n * sizeof *ids);
    return start(s, n, gp, err, errlen);
}

/* Tokenizes text into the sequence and starts the generation. */
static ps_status prompt_tokens(ps_session *s, const char *text, size_t len, bool add_bos, bool parse_special,
                               const ps_gen_params *gp, char *err, size_t errlen) {
    if (!s->tok) return ps_errf(err, errlen, PS_ERR_ARG, "a text prompt needs the model's tokenizer");
    size_t n = 0;
    ps_status st = ps_tok_encode(s->tok, text, len, add_bos, parse_special, s->next, (size_t)s->n_ctx, &n, err, errlen);
    if (st == PS_ERR_RANGE) return too_long(s, (long long)n, err, errlen);
    if (st) return st;
    if (n == 0) return ps_errf(err, errlen, PS_ERR_ARG, "the prompt is empty");
    return start(s, (int)n, gp, err, errlen);
}

ps_status ps_session_prompt_text(ps_session *s, const char *text, size_t len, const ps_gen_params *gp, char *err,
                                 size_t errlen) {
    return prompt_tokens(s, text, len, true, false, gp, err, errlen);
}

/* A NUL-terminated copy of token id's text into *out (caller frees), or NULL for no token;
 * false when memory is out. */
static bool token_text(const ps_tok *tok, int32_t id, char **out) {
    size_t len;
    const char *t = id >= 0 ? ps_tok_token_text(tok, id, &len) : NULL;
    *out = t ? ps_strndup(t, len) : NULL;
    return !t || *out;
}

/* See session.h. The template is the model's unless template_name names a family; BOS is
 * added by the tokenizer only when the template does not write it itself. */
ps_status ps_session_chat_tokens(const ps_tok *tok, const ps_model *m, const ps_chat_msg *msgs, size_t n,
                                 const char *template_name, bool open_turn, int32_t **ids, size_t *n_ids, char *err,
                                 size_t errlen) {
    *ids = NULL, *n_ids = 0;
    ps_gguf_str t;
    char *tmpl = NULL, *text = NULL, *bos = NULL, *eos = NULL;
    ps_chat *chat = NULL;
    ps_tok_span *spans = NULL;
    size_t len = 0, n_spans = 0, cap = 0;
    bool have = ps_gguf_get_str(m->gguf, "tokenizer.chat_template", &t, NULL, 0) == PS_OK;
    ps_status st = PS_OK;
    if (!token_text(tok, ps_tok_bos(tok), &bos) || !token_text(tok, ps_tok_eos(tok), &eos) ||
        (have && !(tmpl = ps_strndup(t.data, t.len))))
        st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    if (!st) st = ps_chat_create(tmpl, template_name, bos, eos, &chat, err, errlen);
    if (!st) st = ps_chat_apply_spans(chat, msgs, n, open_turn, &text, &len, &spans, &n_spans, err, errlen);
    bool add_bos = chat && !ps_chat_writes_bos(chat);
    for (cap = len + 16; !st;) { /* a guess, then what the first try counted */
        free(*ids);
        if (!(*ids = ps_malloc(cap * sizeof **ids))) {
            st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
            break;
        }
        st = ps_tok_encode_literal(tok, text, len, add_bos, spans, n_spans, *ids, cap, n_ids, err, errlen);
        if (st != PS_ERR_RANGE || cap >= *n_ids) break;
        st = PS_OK, cap = *n_ids;
    }
    if (st) free(*ids), *ids = NULL, *n_ids = 0;
    ps_chat_free(chat);
    free(tmpl), free(bos), free(eos), free(text), free(spans);
    return st;
}

ps_status ps_session_prompt_chat(ps_session *s, const ps_chat_msg *msgs, size_t n, const char *template_name,
                                 const ps_gen_params *gp, char *err, size_t errlen) {
    if (!s->tok) return ps_errf(err, errlen, PS_ERR_ARG, "a chat prompt needs the model's tokenizer");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ps_status st = ps_session_chat_tokens(s->tok, s->m, msgs, n, template_name, true, &ids, &n_ids, err, errlen);
    if (!st && n_ids > (size_t)s->n_ctx) st = too_long(s, (long long)n_ids, err, errlen);
    if (!st) st = ps_session_prompt_ids(s, ids, (int)n_ids, gp, err, errlen);
    free(ids);
    return st;
}

ps_status ps_session_set_spec(ps_session *s, const ps_spec_opts *o, char *err, size_t errlen) {
    int most = ps_coord_max_draft(s->coord);
    if (o->kind == PS_SPEC_DRAFT && !o->draft) return ps_errf(err, errlen, PS_ERR_ARG, "no draft model");
    if (o->kind != PS_SPEC_OFF && (o->k < 1 || o->k > most))
        return ps_errf(err, errlen, PS_ERR_ARG, "%d guesses per trip: the coordinator takes 1 to %d", o->k, most);
    s->spec = *o;
    s->auto_k = (ps_spec_auto){.timed = true}; /* the stages report their compute: sample_next's trips */
    return PS_OK;
}

/* How many guesses the next trip carries: what the draft source finds, at most spec.k (with
 * auto, the K it picks, a draft model's reach beyond it, less where the draft is unsure), within
 * the context and the tokens still to generate; into d (a sampling draft model's distributions
 * into q). *fresh: how many of them were drafted now (the others while the trip before was out). */
static ps_status draft(ps_session *s, int32_t *d, ps_draft_dist *q, int *n, int *fresh, char *err, size_t errlen) {
    int k = s->spec.auto_k ? ps_spec_auto_k(&s->auto_k, s->spec.k) : s->spec.k;
    if (s->spec.auto_k && s->spec.kind == PS_SPEC_DRAFT) k = ps_spec_auto_reach(&s->auto_k, k, s->spec.k);
    s->pre_k = k;
    int room = s->n_ctx - s->n_toks; /* the last guess at position n_toks - 1 + k */
    int64_t left = s->gp.n_predict < 0 ? k : s->gp.n_predict - (s->n_toks - s->n_prompt) - 1;
    if (k > room) k = room;
    if (k > left) k = (int)left;
    int ready = s->n_ready; /* drafted while the trip before was out: for this trip only */
    s->n_ready = 0, *n = *fresh = 0;
    if (k <= 0) return PS_OK;
    if (s->spec.kind == PS_SPEC_NGRAM) return *n = *fresh = ps_spec_ngram(s->toks, s->n_toks, k, d), PS_OK;
    ps_draft_req r = {.toks = s->toks,
                      .n = s->n_toks,
                      .k = k,
                      .sp = &s->gp.sp,
                      .out = d,
                      .dist = q,
                      .sure_min = ps_spec_sure_min(&s->spec),
                      .sure = 1};
    if (ready) { /* the draft goes on after them if k asks more, and it was sure enough */
        *n = k < ready ? k : ready;
        memcpy(d, s->pre + 1, (size_t)*n * sizeof *d);
        memcpy(q, s->pre_q + 1, (size_t)*n * sizeof *q);
        s->n_overlap++;
        if (*n == k || s->pre_sure < r.sure_min) return PS_OK;
        memcpy(s->toks + s->n_toks, d, (size_t)*n * sizeof *d); /* beyond n_toks: scratch */
        r.n += *n, r.k -= *n, r.out += *n, r.dist += *n, r.sure = s->pre_sure;
    }
    ps_status st = ps_draft_guess(s->spec.draft, &r, err, errlen);
    *fresh = st ? 0 : r.n_out;
    *n += *fresh;
    return st;
}

/* While trip s->trip is out: the draft's next guesses as if it keeps every guess, into s->pre
 * (its guess of the trip's last token, which reads the trip's tokens, then up to as many
 * guesses as the trip's or the next one's after it, one at a time while the answer has not come:
 * it waits for one guess at most). A failure only leaves fewer drafted: the next trip drafts the
 * rest as usual. */
static void predraft(void *arg) {
    ps_session *s = arg;
    int n = s->n_toks + s->n_trip, k = 1 + (s->pre_k > s->n_trip ? s->pre_k : s->n_trip);
    double sure_min = ps_spec_sure_min(&s->spec);
    char err[256];
    s->n_pre = 0, s->pre_sure = 1;
    if (n + k > s->n_ctx) return;
    memcpy(s->toks + s->n_toks, s->trip + 1, (size_t)s->n_trip * sizeof *s->toks); /* beyond n_toks: scratch */
    /* the first (reading) whatever comes, then while the answer has not come and the draft is sure enough */
    while (s->n_pre < k && (!s->n_pre || (!ps_coord_heard(s->coord) && s->pre_sure >= sure_min))) {
        if (s->n_pre) s->toks[n + s->n_pre - 1] = s->pre[s->n_pre - 1];
        ps_draft_req r = {.toks = s->toks,
                          .n = n + s->n_pre,
                          .k = 1,
                          .sp = &s->gp.sp,
                          .out = s->pre + s->n_pre,
                          .dist = s->pre_q + s->n_pre,
                          .sure_min = sure_min,
                          .sure = 1};
        double t0 = ps_now();
        if (ps_draft_guess(s->spec.draft, &r, err, sizeof err) || r.n_out < 1) return;
        if (s->n_pre++) s->n_meanwhile++, s->meanwhile_s += ps_now() - t0, s->pre_sure *= r.sure; /* the others */
    }
    s->pre_cut = s->n_pre < k && s->pre_sure >= sure_min;
}

/* While the prompt is out: the draft model reads it (its first guess is thrown away), so that the
 * first trip with guesses does not pay for it. */
static void prime_draft(void *arg) {
    ps_session *s = arg;
    int32_t guess;
    char err[256];
    ps_draft_guess(s->spec.draft, &(ps_draft_req){.toks = s->toks, .n = s->n_toks, .k = 1, .out = &guess}, err,
                   sizeof err); /* fails later */
}

/* Runs the model for the next token: the prompt (beyond what the stages kept) on the first
 * step, else the token before with a draft's guesses after it when speculating (the tokens
 * a trip gives beyond the first are returned by the next calls, without running the model).
 * The last stage samples at position n_toks. On failure no stage's keys and values are
 * trusted any more. */
static ps_status sample_next(ps_session *s, int32_t *tok, char *err, size_t errlen) {
    if (s->i_got < s->n_got) { /* a guess kept by the latest trip, fed already; or its last token */
        *tok = s->got[s->i_got++];
        if (s->i_got < s->n_got) s->n_fed = s->n_toks + 1;
        return PS_OK;
    }
    double t0 = ps_now();
    int from = s->started ? s->n_toks - 1 : s->n_fed, n_draft = 0, fresh = 0;
    ps_status st = PS_OK;
    if (s->started && s->spec.kind != PS_SPEC_OFF &&
        (st = draft(s, s->trip + 1, s->trip_q, &n_draft, &fresh, err, errlen)))
        return st;
    double t_sent = ps_now(), computed = s->spec.kind ? ps_coord_compute_s(s->coord) : 0;
    bool overlap = s->spec.kind == PS_SPEC_DRAFT && s->spec.overlap && ps_coord_n_stages(s->coord) > 1, shadow = false;
    s->n_fed = 0;
    s->n_trip = n_draft, s->n_pre = s->n_meanwhile = 0, s->meanwhile_s = 0, s->pre_cut = false;
    if (n_draft) {
        s->trip[0] = s->toks[from];
        bool sampled = s->spec.kind == PS_SPEC_DRAFT && s->gp.sp.temperature > 0;
        st = ps_coord_next_draft(s->coord, s->trip, n_draft + 1, from, n_draft, sampled ? s->trip_q : NULL, &s->gp.sp,
                                 overlap ? predraft : NULL, s, s->got, &s->n_got, err, errlen);
        s->n_trips++, s->n_drafted += n_draft, s->n_kept += s->n_got - 1;
    } else { /* the prompt's trip gives the draft model time to read the prompt; a plain one (auto, with the
                overlap) to read its token and guess the next, and the next trip's guesses if auto will ask some */
        bool prime = !s->started && s->spec.kind == PS_SPEC_DRAFT;
        shadow = overlap && s->started && s->spec.auto_k;
        s->pre_k = shadow ? ps_spec_auto_k_after_plain(&s->auto_k, s->spec.k) : 0;
        st = ps_coord_next_draft(s->coord, s->toks + from, s->n_toks - from, from, 0, NULL, &s->gp.sp,
                                 prime    ? prime_draft
                                 : shadow ? predraft
                                          : NULL,
                                 s, s->got, &s->n_got, err, errlen);
    }
    if (st) return st;
    if (s->n_got == n_draft + 1 && s->n_pre > 1 && s->got[n_draft] == s->pre[0]) s->n_ready = s->n_pre - 1;
    s->n_fed = s->n_toks;
    s->i_got = 0;
    if (!s->started) {
        s->ttft_s = ps_now() - t0;
        s->started = true;
    } else {
        double t = ps_now() - t0;
        s->decode_s += t;
        s->n_decode += s->n_got;
        s->auto_k.overlap = overlap;
        ps_spec_trip trip = {.k = n_draft,
                             .kept = s->n_got - 1,
                             .drafted = fresh,
                             .draft_s = t_sent - t0,
                             .wait_s = ps_now() - t_sent,
                             .predrafted = shadow && s->pre_k > 0,
                             .shadow = shadow && s->n_pre ? (s->got[0] == s->pre[0] ? 1 : -1) : 0,
                             .meanwhile = s->n_meanwhile,
                             .meanwhile_s = s->meanwhile_s,
                             .cut = s->pre_cut,
                             .compute_s = s->spec.kind ? ps_coord_compute_s(s->coord) - computed : 0};
        ps_spec_auto_add(&s->auto_k, &trip);
        if (s->spec.kind) ps_spec_auto_trace(&s->auto_k, &trip, 0, s->spec.k);
        s->by_k[n_draft]++;
    }
    return sample_next(s, tok, err, errlen);
}

/* See session.h. A stop found after sampling (end of text) leaves the token out of the
 * sequence; one found after keeping it (length, context) keeps it. */
ps_status ps_session_next(ps_session *s, ps_session_step *out, char *err, size_t errlen) {
    *out = (ps_session_step){.token = -1, .text = "", .stop = s->stop};
    if (s->stop) return PS_OK;
    if (atomic_load(&s->cancel)) return out->stop = s->stop = PS_STOP_CANCELLED, PS_OK;
    int32_t tok;
    ps_status st = sample_next(s, &tok, err, errlen);
    if (st) return st;
    int64_t n_gen = s->n_toks - s->n_prompt;
    if (n_gen == s->gp.n_predict) return out->stop = s->stop = PS_STOP_LENGTH, PS_OK; /* n_predict 0 */
    out->token = tok;
    if (!s->gp.ignore_eos && s->tok && ps_tok_is_eog(s->tok, tok)) return out->stop = s->stop = PS_STOP_EOS, PS_OK;
    s->toks[s->n_toks++] = tok;
    if (s->stream && (st = ps_tok_stream_push(s->stream, tok, &out->text, &out->len)))
        return ps_errf(err, errlen, st, "cannot decode token %d", tok);
    if (n_gen + 1 == s->gp.n_predict)
        s->stop = PS_STOP_LENGTH;
    else if (s->n_toks > s->n_ctx)
        s->stop = PS_STOP_CONTEXT; /* nowhere to feed it */
    out->stop = s->stop;
    return PS_OK;
}

void ps_session_flush(ps_session *s, const char **text, size_t *len) {
    if (s->stream) return ps_tok_stream_flush(s->stream, text, len);
    *text = "", *len = 0;
}

void ps_session_cancel(ps_session *s) { atomic_store(&s->cancel, true); }

const int32_t *ps_session_tokens(const ps_session *s, int *n_tokens, int *n_prompt) {
    if (n_tokens) *n_tokens = s->n_toks;
    if (n_prompt) *n_prompt = s->n_prompt;
    return s->toks;
}

void ps_session_get_stats(const ps_session *s, ps_session_stats *out) {
    *out = (ps_session_stats){.n_prompt = s->n_prompt,
                              .n_generated = s->n_toks - s->n_prompt,
                              .n_reused = s->n_reused,
                              .ttft_s = s->ttft_s,
                              .decode_s = s->decode_s,
                              .n_decode = s->n_decode,
                              .n_held = s->n_fed < s->n_toks ? s->n_fed : s->n_toks,
                              .n_trips = s->n_trips,
                              .n_drafted = s->n_drafted,
                              .n_kept = s->n_kept,
                              .n_overlap = s->n_overlap};
    memcpy(out->by_k, s->by_k, sizeof out->by_k);
}
