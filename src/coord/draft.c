/* draft.c - a draft model on the coordinator (draft.h): a ps_stage of a whole model whose KV
 * pool holds `slots` sequences, slot i on blocks [i B, (i + 1) B) for B blocks of a context; the
 * guesses of several sequences are made together, one forward pass per guess over all of them. */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#include "../stage/stage.h"
#include "../tensor/fmath.h"
#include "../tensor/vec8.h"

#define DRAFT_BATCH 64 /* positions per forward pass at least (a sequence's catch-up, or one row of each) */

typedef struct {
    int32_t *fed; /* (n_ctx) the tokens whose keys and values the slot holds, n_fed of them */
    int n_fed;
    int32_t *table; /* (blocks) its block table */
} slot;

struct ps_draft {
    ps_stage *stage;
    int n_ctx, vocab, blocks, n_slots, max_mb;
    int n_logits; /* a row of logits (the model's vocabulary; vocab: the tokenizer's) */
    slot *slots;
    ps_mb_seg *segs; /* (n_slots) a pass being built */
    int32_t *toks;   /* (max_mb) its tokens */
    ps_result *res;  /* (n_slots) */
    ps_sampler *smp; /* sampled guesses */
    int *seg_req;    /* (n_slots) the request of each segment */
    double seconds;
};

/* Whether the draft's tokenizer is target's, token for token; the first difference in err. */
static ps_status same_vocab(const ps_tok *target, const ps_tok *draft, const char *path, char *err, size_t errlen) {
    int n = ps_tok_n_vocab(target), m = ps_tok_n_vocab(draft);
    if (n != m)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "the draft %s has %d tokens, the model %d: a draft needs the model's "
                       "vocabulary",
                       path, m, n);
    for (int i = 0; i < n; i++) {
        size_t a, b;
        const char *x = ps_tok_token_text(target, i, &a), *y = ps_tok_token_text(draft, i, &b);
        if (a != b || memcmp(x, y, a))
            return ps_errf(err, errlen, PS_ERR_ARG,
                           "the draft %s does not have the model's vocabulary: token %d is '%.*s' in the model and "
                           "'%.*s' in the draft",
                           path, i, (int)(a > 40 ? 40 : a), x, (int)(b > 40 ? 40 : b), y);
    }
    return PS_OK;
}

ps_status ps_draft_open(const char *path, int threads, int n_ctx, int slots, const ps_tok *target, ps_draft **out,
                        char *err, size_t errlen) {
    *out = NULL;
    if (slots < 1 || slots > PS_MB_MAX_SEGS)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d draft sequences (1 to %d)", slots, PS_MB_MAX_SEGS);
    ps_draft *d = ps_calloc(1, sizeof *d);
    if (!d) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    d->n_ctx = n_ctx, d->n_slots = slots, d->vocab = ps_tok_n_vocab(target);
    d->blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    d->max_mb = slots > DRAFT_BATCH ? slots : DRAFT_BATCH;
    ps_stage_opts so = {.threads = threads};
    ps_tok *tok = NULL;
    ps_status s = ps_stage_open(path, &so, &d->stage, err, errlen);
    const ps_model *m = s ? NULL : ps_stage_model(d->stage);
    if (!s && (m->shard.present || !m->has_head))
        s = ps_errf(err, errlen, PS_ERR_ARG, "the draft %s is a shard: a draft is a whole model", path);
    if (!s) s = ps_tok_create(m->gguf, &tok, err, errlen);
    if (!s) d->n_logits = m->hp.vocab;
    if (!s) s = same_vocab(target, tok, path, err, errlen);
    ps_tok_free(tok);
    ps_ctx_params cp = {.n_ctx = n_ctx, .n_blocks = d->blocks * slots, .max_batch = d->max_mb, .act = PS_ACT_Q8};
    if (!s) s = ps_stage_begin(d->stage, &cp, d->max_mb, slots, 0, err, errlen);
    if (!s) s = ps_sampler_create(d->vocab, &d->smp, err, errlen);
    if (!s && (!(d->slots = ps_calloc((size_t)slots, sizeof *d->slots)) ||
               !(d->segs = ps_calloc((size_t)slots, sizeof *d->segs)) ||
               !(d->toks = ps_malloc((size_t)d->max_mb * sizeof *d->toks)) ||
               !(d->res = ps_malloc((size_t)slots * sizeof *d->res)) ||
               !(d->seg_req = ps_malloc((size_t)slots * sizeof *d->seg_req))))
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < slots; i++) {
        slot *sl = &d->slots[i];
        if (!(sl->fed = ps_malloc((size_t)n_ctx * sizeof *sl->fed)) ||
            !(sl->table = ps_malloc((size_t)d->blocks * sizeof *sl->table)))
            s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        for (int b = 0; !s && b < d->blocks; b++) sl->table[b] = i * d->blocks + b;
    }
    if (s) {
        ps_draft_free(d);
        return s;
    }
    *out = d;
    return PS_OK;
}

void ps_draft_free(ps_draft *d) {
    if (!d) return;
    ps_stage_free(d->stage);
    ps_sampler_free(d->smp);
    for (int i = 0; d->slots && i < d->n_slots; i++) free(d->slots[i].fed), free(d->slots[i].table);
    free(d->slots), free(d->segs), free(d->toks), free(d->res), free(d->seg_req);
    free(d);
}

ps_status ps_draft_pin(ps_draft *d, int first, char *err, size_t errlen) {
    return ps_pool_pin_workers(ps_stage_pool(d->stage), first, err, errlen);
}

double ps_draft_seconds(const ps_draft *d) { return d->seconds; }
int ps_draft_slots(const ps_draft *d) { return d->n_slots; }

/* The probability of token t in the softmax of v[0..n), v[top] its largest: e^(v[t] - v[top])
 * over the sum of e^(v[i] - v[top]), in 8 lanes. */
PS_SIMD_CLONES static double prob_of(const float *v, int n, int32_t top, int32_t t) {
    ps_vf8 lanes = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) lanes += ps_exp_neg8(ps_load8(v + i) - v[top]);
    float sum = 0;
    for (int l = 0; l < 8; l++) sum += lanes[l];
    for (; i < n; i++) sum += ps_exp_neg(v[i] - v[top]);
    return ps_exp_neg(v[t] - v[top]) / sum;
}

/* Runs the n_segs segments built in d->segs / d->toks (rows in all) as one pass, each recorded
 * as fed; the samples into d->res, in segment order. */
static ps_status pass(ps_draft *d, int n_segs, int rows, char *err, size_t errlen) {
    ps_mb mb = {.n_segs = n_segs, .segs = d->segs, .n = rows, .tokens = d->toks};
    const float *x;
    int n_res;
    double t0 = ps_now();
    ps_status s = ps_stage_run(d->stage, &mb, &x, d->res, &n_res, err, errlen);
    d->seconds += ps_now() - t0;
    const int32_t *t = d->toks;
    for (int i = 0; i < n_segs; t += d->segs[i].n, i++) {
        slot *sl = &d->slots[d->segs[i].seq];
        sl->n_fed = d->segs[i].pos; /* what it held beyond is gone; on failure, from pos on */
        if (s) continue;
        memcpy(sl->fed + d->segs[i].pos, t, (size_t)d->segs[i].n * sizeof *t);
        sl->n_fed += d->segs[i].n;
    }
    return s;
}

/* Adds to the pass being built a segment of slot sl: toks[0..n) at pos, sampled or not. */
static void add_seg(ps_draft *d, int *n_segs, int *rows, int sl, const int32_t *toks, int n, int pos, bool sample) {
    ps_sample_params greedy = ps_sample_params_default();
    greedy.temperature = 0, greedy.penalty_last_n = 0;
    d->segs[*n_segs] = (ps_mb_seg){.seq = (uint64_t)sl,
                                   .pos = pos,
                                   .n = n,
                                   .flags = sample ? PS_MB_SAMPLE : 0,
                                   .sp = greedy,
                                   .n_blocks = d->blocks,
                                   .blocks = d->slots[sl].table};
    memcpy(d->toks + *rows, toks, (size_t)n * sizeof *toks);
    ++*n_segs, *rows += n;
}

ps_status ps_draft_guess_many(ps_draft *d, ps_draft_req *r, int n, char *err, size_t errlen) {
    int from[PS_MB_MAX_SEGS];
    if (n > d->n_slots) return ps_errf(err, errlen, PS_ERR_ARG, "%d draft requests, %d slots", n, d->n_slots);
    for (int i = 0; i < n; i++) { /* what each slot holds already; long catch-ups alone first */
        slot *sl = &d->slots[r[i].slot];
        r[i].n_out = 0;
        if (r[i].n < 1 || r[i].n > d->n_ctx)
            r[i].k = 0;
        else if (r[i].k > d->n_ctx - r[i].n + 1)
            r[i].k = d->n_ctx - r[i].n + 1;
        int f = 0; /* at least the last token runs, for its logits */
        while (f < sl->n_fed && f < r[i].n - 1 && sl->fed[f] == r[i].toks[f]) f++;
        for (; r[i].k > 0 && r[i].n - f > d->max_mb / n; f += d->max_mb / n) {
            int segs = 0, rows = 0;
            add_seg(d, &segs, &rows, r[i].slot, r[i].toks + f, d->max_mb / n, f, false);
            ps_status s = pass(d, segs, rows, err, errlen);
            if (s) return s;
        }
        from[i] = f;
    }
    /* guess j of every request that wants one more: the first pass feeds the rest of each
       sequence, the later ones one guess each */
    for (int j = 0;; j++) {
        int segs = 0, rows = 0;
        for (int i = 0; i < n; i++) {
            if (r[i].k <= j || r[i].n_out < j || (j && r[i].sure < r[i].sure_min))
                continue; /* done, stopped at a token not the target's, or no longer sure enough */
            if (j == 0)
                add_seg(d, &segs, &rows, r[i].slot, r[i].toks + from[i], r[i].n - from[i], from[i], true);
            else
                add_seg(d, &segs, &rows, r[i].slot, &r[i].out[j - 1], 1, r[i].n + j - 1, true);
            d->seg_req[segs - 1] = i;
        }
        if (!segs) return PS_OK;
        ps_status s = pass(d, segs, rows, err, errlen);
        if (s) return s;
        for (int k = 0; k < segs; k++) {
            ps_draft_req *q = &r[d->seg_req[k]];
            int32_t t = d->res[k].token;
            const slot *sl = &d->slots[d->segs[k].seq]; /* it holds the sequence up to the guess */
            if (q->sp && q->sp->temperature > 0 &&
                ps_sample_draft(d->smp, q->sp, ps_stage_logits_row(d->stage, k), sl->fed, sl->n_fed,
                                (uint64_t)sl->n_fed, &q->dist[q->n_out], &t))
                return ps_errf(err, errlen, PS_ERR_ARG, "the draft's sampling failed: %s", ps_sampler_error(d->smp));
            if (t >= d->vocab) continue;
            if (q->sure_min > 0) /* the pass's greedy token is the row's largest */
                q->sure *= prob_of(ps_stage_logits_row(d->stage, k), d->n_logits, d->res[k].token, t);
            q->out[q->n_out++] = t;
        }
    }
}

ps_status ps_draft_guess(ps_draft *d, ps_draft_req *r, char *err, size_t errlen) {
    r->slot = 0;
    return ps_draft_guess_many(d, r, 1, err, errlen);
}
