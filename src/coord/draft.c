/* draft.c - a draft model on the coordinator (draft.h): a ps_stage of a whole model, run one
 * sequence at a time on blocks 0, 1, 2, ... of its own KV pool. */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#include "../stage/stage.h"

#define DRAFT_BATCH 64 /* positions per forward pass when it catches up with the sequence */

struct ps_draft {
    ps_stage *stage;
    int n_ctx, vocab; /* positions; the target's vocabulary */
    int32_t *fed;     /* (n_ctx) the tokens whose keys and values it holds, n_fed of them */
    int n_fed;
    int32_t *ident; /* (blocks of n_ctx) its block table 0, 1, 2, ... */
    ps_result res[1];
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

ps_status ps_draft_open(const char *path, int threads, int n_ctx, const ps_tok *target, ps_draft **out, char *err,
                        size_t errlen) {
    *out = NULL;
    ps_draft *d = ps_calloc(1, sizeof *d);
    if (!d) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_stage_opts so = {.threads = threads};
    ps_tok *tok = NULL;
    ps_status s = ps_stage_open(path, &so, &d->stage, err, errlen);
    const ps_model *m = s ? NULL : ps_stage_model(d->stage);
    if (!s && (m->shard.present || !m->has_head))
        s = ps_errf(err, errlen, PS_ERR_ARG, "the draft %s is a shard: a draft is a whole model", path);
    if (!s) s = ps_tok_create(m->gguf, &tok, err, errlen);
    if (!s) s = same_vocab(target, tok, path, err, errlen);
    ps_tok_free(tok);
    int blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    ps_ctx_params cp = {.n_ctx = n_ctx, .n_blocks = blocks, .max_batch = DRAFT_BATCH, .act = PS_ACT_Q8};
    if (!s) s = ps_stage_begin(d->stage, &cp, DRAFT_BATCH, 1, 0, err, errlen);
    if (!s && (!(d->fed = ps_malloc((size_t)n_ctx * sizeof *d->fed)) ||
               !(d->ident = ps_malloc((size_t)blocks * sizeof *d->ident))))
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    if (s) {
        ps_draft_free(d);
        return s;
    }
    for (int i = 0; i < blocks; i++) d->ident[i] = i;
    d->n_ctx = n_ctx, d->vocab = ps_tok_n_vocab(target);
    *out = d;
    return PS_OK;
}

void ps_draft_free(ps_draft *d) {
    if (!d) return;
    ps_stage_free(d->stage);
    free(d->fed), free(d->ident);
    free(d);
}

double ps_draft_seconds(const ps_draft *d) { return d->seconds; }

/* Runs toks[0..n) at positions pos.. (the last one sampled, greedily, when sample) and records
 * them as fed; the sample into *tok. */
static ps_status feed(ps_draft *d, const int32_t *toks, int n, int pos, bool sample, int32_t *tok, char *err,
                      size_t errlen) {
    ps_sample_params greedy = ps_sample_params_default();
    greedy.temperature = 0, greedy.penalty_last_n = 0;
    ps_mb_seg g = {.seq = 1,
                   .pos = pos,
                   .n = n,
                   .flags = sample ? PS_MB_SAMPLE : 0,
                   .sp = greedy,
                   .n_blocks = (d->n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK,
                   .blocks = d->ident};
    ps_mb mb = {.n_segs = 1, .segs = &g, .n = n, .tokens = toks};
    const float *x;
    int n_res;
    double t0 = ps_now();
    ps_status s = ps_stage_run(d->stage, &mb, &x, d->res, &n_res, err, errlen);
    d->seconds += ps_now() - t0;
    d->n_fed = pos; /* what it held beyond pos is gone; on failure, from pos on */
    if (s) return s;
    memcpy(d->fed + pos, toks, (size_t)n * sizeof *toks);
    d->n_fed = pos + n;
    if (sample) *tok = d->res[0].token;
    return PS_OK;
}

ps_status ps_draft_guess(ps_draft *d, const int32_t *toks, int n, int k, int32_t *out, int *n_out, char *err,
                         size_t errlen) {
    *n_out = 0;
    if (n < 1 || n + k - 1 > d->n_ctx) k = d->n_ctx - n + 1;
    if (n < 1 || k < 1) return PS_OK;
    int from = 0; /* the tokens it holds already: at least the last one runs, for its logits */
    while (from < d->n_fed && from < n - 1 && d->fed[from] == toks[from]) from++;
    while (n - from > DRAFT_BATCH) { /* catching up: a prompt, or a long run of kept guesses */
        ps_status s = feed(d, toks + from, DRAFT_BATCH, from, false, NULL, err, errlen);
        if (s) return s;
        from += DRAFT_BATCH;
    }
    int32_t tok;
    ps_status s = feed(d, toks + from, n - from, from, true, &tok, err, errlen);
    for (int pos = n; !s && tok < d->vocab; pos++) {
        out[(*n_out)++] = tok;
        if (*n_out == k) break;
        s = feed(d, &tok, 1, pos, true, &tok, err, errlen);
    }
    return s;
}
