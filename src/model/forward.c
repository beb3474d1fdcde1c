/* forward.c - the run state of one sequence and the forward pass over a layer range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/gemm.h"
#include "../tensor/types.h"
#include "model.h"

struct ps_ctx {
    const ps_model *m;
    ps_pool *pool;      /* not owned */
    int n_ctx;          /* positions the KV cache holds */
    int max_batch;      /* tokens per forward chunk */
    ps_act act;         /* matmul arithmetic */
    int q_dim;          /* n_head * head_dim */
    int kv_dim;         /* n_head_kv * head_dim */
    float *x;           /* (max_batch, dim) residual stream */
    float *xb;          /* (max_batch, dim) normed input of a branch */
    float *q;           /* (max_batch, q_dim) */
    float *att;         /* (max_batch, q_dim) attention output */
    float *hb;          /* (max_batch, ffn_dim) gate, then silu(gate) * up */
    float *hb2;         /* (max_batch, ffn_dim) up */
    float *scores;      /* (threads, n_ctx) attention weights, one row per thread */
    float *rope_cs;     /* (max_batch, rope_dim / 2, 2) cos and sin for the chunk's positions */
    double *inv_freq;   /* (rope_dim / 2) rotation frequency of each pair */
    float *k_cache;     /* (layers, n_ctx, kv_dim) */
    float *v_cache;     /* (layers, n_ctx, kv_dim) */
    void *scratch;      /* matmul scratch */
};

/* The attention loops are plain C whose order of operations is fixed in the source; built
 * for the baseline x86-64 they would run on SSE2. Clones for AVX2 and AVX-512 (picked by
 * the loader) let the compiler use wider vectors for the same operations in the same order
 * (no fused multiply-adds: floating-point contraction is off), so the bits do not change. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SIMD_CLONES
#endif
#define ALWAYS_INLINE inline __attribute__((always_inline))

// ---------------------------------------------------------------------------------------
// Vector helpers (fixed reduction order: 16 lanes, then a fixed tree)

/* sum a[i] * b[i] for i < n, in an order that depends only on n. */
static ALWAYS_INLINE float dot_f32(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w; w >>= 1)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* out = x / rms(x) * w over n elements (out may alias x). */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float scale = 1.0f / sqrtf(dot_f32(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Rotates the first rope_dim elements of one head vector by the chunk row's cos/sin table. */
static void rope(float *v, const float *cs, int rope_dim, bool neox) {
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

// ---------------------------------------------------------------------------------------
// Context

/* Frequency of rotation pair i: base^(-2i/rope_dim), divided by Llama 3.1's factor. */
static void init_inv_freq(ps_ctx *c) {
    const ps_hparams *hp = &c->m->hp;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        double f = pow((double)hp->rope_base, -2.0 * i / hp->rope_dim);
        if (c->m->rope_freqs) f /= c->m->rope_freqs[i];
        c->inv_freq[i] = f / hp->rope_scale;
    }
}

/* Raises *best to the scratch that matrices ws[0..n) sharing one input need for max_batch tokens. */
static void consider(size_t *best, const ps_mat *const *ws, int n, ps_act act, int max_batch, int n_threads) {
    size_t need = 0;
    if (act == PS_ACT_Q8) need = ps_matmul_multi_scratch_bytes(ws, n, max_batch);
    for (int i = 0; act == PS_ACT_F32 && i < n; i++) {
        size_t one = ps_gemm_scratch_bytes(ws[i]->type, ws[i]->cols, max_batch, n_threads);
        if (one > need) need = one;
    }
    if (need > *best) *best = need;
}

/* Largest matmul scratch the model's weights need for max_batch tokens. */
static size_t scratch_bytes(const ps_model *m, ps_act act, int max_batch, int n_threads) {
    size_t best = 0;
    for (int i = 0; i < m->layer_end - m->layer_begin; i++) {
        const ps_layer *L = &m->layers[i];
        const ps_mat *qkv[] = {&L->wq, &L->wk, &L->wv}, *gate_up[] = {&L->w_gate, &L->w_up};
        consider(&best, qkv, 3, act, max_batch, n_threads);
        consider(&best, gate_up, 2, act, max_batch, n_threads);
        consider(&best, (const ps_mat *[]){&L->wo}, 1, act, max_batch, n_threads);
        consider(&best, (const ps_mat *[]){&L->w_down}, 1, act, max_batch, n_threads);
    }
    if (m->has_head) consider(&best, (const ps_mat *[]){&m->output}, 1, act, max_batch, n_threads);
    return best;
}

ps_status ps_act_from_name(const char *name, ps_act *out) {
    if (!strcmp(name, "q8")) *out = PS_ACT_Q8;
    else if (!strcmp(name, "f32")) *out = PS_ACT_F32;
    else return PS_ERR_ARG;
    return PS_OK;
}

const char *ps_act_name(ps_act a) { return a == PS_ACT_F32 ? "f32" : "q8"; }

ps_status ps_ctx_create(const ps_model *m, const ps_ctx_params *p, ps_pool *pool, ps_ctx **out, char *err,
                        size_t errlen) {
    *out = NULL;
    const ps_hparams *hp = &m->hp;
    int n_ctx = p->n_ctx, max_batch = p->max_batch;
    if (n_ctx < 1 || max_batch < 1)
        return ps_errf(err, errlen, PS_ERR_ARG, "context size and batch size must be positive");
    if (p->act != PS_ACT_Q8 && p->act != PS_ACT_F32) return ps_errf(err, errlen, PS_ERR_ARG, "unknown activation mode");
    ps_ctx *c = calloc(1, sizeof *c);
    if (!c) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    c->m = m;
    c->pool = pool;
    c->n_ctx = n_ctx;
    c->max_batch = max_batch;
    c->act = p->act;
    c->q_dim = hp->n_head * hp->head_dim;
    c->kv_dim = hp->n_head_kv * hp->head_dim;
    size_t B = (size_t)max_batch, layers = (size_t)(m->layer_end - m->layer_begin);
    size_t kv = layers * (size_t)n_ctx * (size_t)c->kv_dim;
    int threads = ps_pool_size(pool);
    c->x = malloc(B * hp->dim * sizeof(float));
    c->xb = malloc(B * hp->dim * sizeof(float));
    c->q = malloc(B * c->q_dim * sizeof(float));
    c->att = malloc(B * c->q_dim * sizeof(float));
    c->hb = malloc(B * hp->ffn_dim * sizeof(float));
    c->hb2 = malloc(B * hp->ffn_dim * sizeof(float));
    c->scores = malloc((size_t)threads * n_ctx * sizeof(float));
    c->rope_cs = malloc(B * hp->rope_dim * sizeof(float));
    c->inv_freq = malloc((size_t)hp->rope_dim / 2 * sizeof(double) + 1);
    c->k_cache = calloc(kv, sizeof(float));
    c->v_cache = calloc(kv, sizeof(float));
    size_t sb = scratch_bytes(m, p->act, max_batch, threads);
    c->scratch = sb ? malloc(sb) : NULL;
    if (!c->x || !c->xb || !c->q || !c->att || !c->hb || !c->hb2 || !c->scores || !c->rope_cs || !c->inv_freq ||
        !c->k_cache || !c->v_cache || (sb && !c->scratch)) {
        ps_ctx_free(c);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for a %d-position context (KV cache %.1f MiB)", n_ctx,
                       2.0 * kv * sizeof(float) / (1 << 20));
    }
    init_inv_freq(c);
    *out = c;
    return PS_OK;
}

void ps_ctx_free(ps_ctx *c) {
    if (!c) return;
    free(c->x), free(c->xb), free(c->q), free(c->att), free(c->hb), free(c->hb2), free(c->scores);
    free(c->rope_cs), free(c->inv_freq), free(c->k_cache), free(c->v_cache), free(c->scratch);
    free(c);
}

int ps_ctx_n_ctx(const ps_ctx *c) { return c->n_ctx; }

// ---------------------------------------------------------------------------------------
// Attention

typedef struct {
    ps_ctx *c;
    int n;           /* tokens in the chunk */
    int pos;         /* position of the first */
    const float *kc; /* this layer's key cache (n_ctx, kv_dim) */
    const float *vc; /* this layer's value cache */
} attn_job;

/* Causal attention of one (token, head) pair: att = softmax(q·K / sqrt(hd)) V over
 * positions 0..pos+t, each sum taken in position order. */
static ALWAYS_INLINE void attend_one(const attn_job *j, int t, int h, float *scores) {
    const ps_ctx *c = j->c;
    const ps_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, kvh = h / (hp->n_head / hp->n_head_kv), last = j->pos + t;
    const float *q = c->q + (size_t)t * c->q_dim + (size_t)h * hd;
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY;
    for (int p = 0; p <= last; p++) {
        scores[p] = dot_f32(q, j->kc + (size_t)p * c->kv_dim + (size_t)kvh * hd, hd) * scale;
        if (scores[p] > max) max = scores[p];
    }
    float sum = 0;
    for (int p = 0; p <= last; p++) sum += scores[p] = expf(scores[p] - max);
    float *o = c->att + (size_t)t * c->q_dim + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int p = 0; p <= last; p++) {
        const float *v = j->vc + (size_t)p * c->kv_dim + (size_t)kvh * hd;
        float w = scores[p] / sum;
        for (int d = 0; d < hd; d++) o[d] += w * v[d];
    }
}

/* Pool task: thread ith takes every nth (token, head) pair, so that the later tokens of a
 * causal chunk, which attend to more positions, are spread over the threads. */
SIMD_CLONES static void attend_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    int nh = j->c->m->hp.n_head, total = j->n * nh;
    float *scores = j->c->scores + (size_t)ith * j->c->n_ctx;
    for (int i = ith; i < total; i += nth) attend_one(j, i / nh, i % nh, scores);
}

// ---------------------------------------------------------------------------------------
// Forward pass

/* Fills the cos/sin table for the chunk's positions pos..pos+n-1. */
static void rope_table(ps_ctx *c, int n, int pos) {
    int half = c->m->hp.rope_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)(pos + t) * c->inv_freq[i];
            c->rope_cs[((size_t)t * half + i) * 2] = (float)cos(a);
            c->rope_cs[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
        }
}

/* ys[i] (n, ws[i]->rows, rows y_strides[i] apart) = x (n, cols) · ws[i]ᵀ for matrices
 * sharing their input (q8 quantizes it once for all of them). */
static void mm_multi(ps_ctx *c, const ps_mat *const *ws, int nw, const float *x, int n, float *const *ys,
                     const int64_t *y_strides) {
    if (c->act == PS_ACT_Q8) {
        ps_matmul_multi(ws, nw, x, ws[0]->cols, n, ys, y_strides, c->scratch, c->pool);
        return;
    }
    for (int i = 0; i < nw; i++) ps_gemm(ws[i], x, ws[i]->cols, n, ys[i], y_strides[i], c->scratch, c->pool);
}

/* y (n, w->rows) = x (n, w->cols) · Wᵀ, with y rows y_stride apart. */
static void mm(ps_ctx *c, const ps_mat *w, const float *x, int n, float *y, int64_t y_stride) {
    mm_multi(c, &w, 1, x, n, &y, &y_stride);
}

/* Adds a bias to n rows of width d, when there is one. */
static void add_bias(float *y, const float *b, int n, int d) {
    if (!b) return;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) y[(size_t)t * d + i] += b[i];
}

/* Attention block of local layer li for the chunk in c->x; writes K/V at pos..pos+n-1. */
static void attention_block(ps_ctx *c, int li, int n, int pos) {
    const ps_hparams *hp = &c->m->hp;
    const ps_layer *L = &c->m->layers[li];
    int dim = hp->dim, hd = hp->head_dim;
    float *kc = c->k_cache + (size_t)li * c->n_ctx * c->kv_dim, *vc = c->v_cache + (size_t)li * c->n_ctx * c->kv_dim;
    float *k = kc + (size_t)pos * c->kv_dim, *v = vc + (size_t)pos * c->kv_dim;
    for (int t = 0; t < n; t++) rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)t * dim, L->attn_norm, dim, hp->rms_eps);
    const ps_mat *qkv[] = {&L->wq, &L->wk, &L->wv};
    mm_multi(c, qkv, 3, c->xb, n, (float *[]){c->q, k, v}, (int64_t[]){c->q_dim, c->kv_dim, c->kv_dim});
    add_bias(c->q, L->bq, n, c->q_dim);
    add_bias(k, L->bk, n, c->kv_dim);
    add_bias(v, L->bv, n, c->kv_dim);
    for (int t = 0; t < n; t++) {
        const float *cs = c->rope_cs + (size_t)t * hp->rope_dim;
        for (int h = 0; h < hp->n_head; h++) {
            float *qh = c->q + (size_t)t * c->q_dim + (size_t)h * hd;
            if (L->q_norm) rmsnorm(qh, qh, L->q_norm, hd, hp->rms_eps);
            rope(qh, cs, hp->rope_dim, hp->rope_neox);
        }
        for (int h = 0; h < hp->n_head_kv; h++) {
            float *kh = k + (size_t)t * c->kv_dim + (size_t)h * hd;
            if (L->k_norm) rmsnorm(kh, kh, L->k_norm, hd, hp->rms_eps);
            rope(kh, cs, hp->rope_dim, hp->rope_neox);
        }
    }
    attn_job job = {.c = c, .n = n, .pos = pos, .kc = kc, .vc = vc};
    ps_pool_run(c->pool, attend_task, &job);
    mm(c, &L->wo, c->att, n, c->xb, dim);
    for (size_t i = 0; i < (size_t)n * dim; i++) c->x[i] += c->xb[i];
}

typedef struct {
    float *gate;       /* (n) in: gate projection; out: silu(gate) * up */
    const float *up;   /* (n) */
    size_t n;
} swiglu_job;

/* Pool task: an even share of gate = silu(gate) * up (element-wise, so any split is exact). */
static void swiglu_task(void *ctx, int ith, int nth) {
    swiglu_job *j = ctx;
    size_t b = j->n * ith / nth, e = j->n * (ith + 1) / nth;
    for (size_t i = b; i < e; i++) j->gate[i] = j->gate[i] / (1.0f + expf(-j->gate[i])) * j->up[i];
}

/* Feed-forward block (SwiGLU) of local layer li for the chunk in c->x. */
static void ffn_block(ps_ctx *c, int li, int n) {
    const ps_hparams *hp = &c->m->hp;
    const ps_layer *L = &c->m->layers[li];
    int dim = hp->dim;
    for (int t = 0; t < n; t++) rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)t * dim, L->ffn_norm, dim, hp->rms_eps);
    const ps_mat *gate_up[] = {&L->w_gate, &L->w_up};
    mm_multi(c, gate_up, 2, c->xb, n, (float *[]){c->hb, c->hb2}, (int64_t[]){hp->ffn_dim, hp->ffn_dim});
    swiglu_job job = {.gate = c->hb, .up = c->hb2, .n = (size_t)n * hp->ffn_dim};
    ps_pool_run(c->pool, swiglu_task, &job);
    mm(c, &L->w_down, c->hb, n, c->xb, dim);
    for (size_t i = 0; i < (size_t)n * dim; i++) c->x[i] += c->xb[i];
}

/* One chunk of at most max_batch tokens. In: tokens (stage 0) or x_in rows. Out: logits
 * of chunk rows [first_logit, n) when the model holds the head, else all n rows of the
 * residual stream. */
static ps_status forward_chunk(ps_ctx *c, const int32_t *tokens, const float *x_in, int n, int pos, float *out,
                               int first_logit) {
    const ps_model *m = c->m;
    int dim = m->hp.dim;
    if (!m->has_embed) memcpy(c->x, x_in, (size_t)n * dim * sizeof(float));
    for (int t = 0; m->has_embed && t < n; t++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * ps_row_bytes(m->tok_embd.type, dim);
        ps_status s = ps_dequantize_row(m->tok_embd.type, row, c->x + (size_t)t * dim, dim);
        if (s) return s;
    }
    rope_table(c, n, pos);
    for (int li = 0; li < m->layer_end - m->layer_begin; li++) {
        attention_block(c, li, n, pos);
        ffn_block(c, li, n);
    }
    if (!m->has_head) {
        memcpy(out, c->x, (size_t)n * dim * sizeof(float));
        return PS_OK;
    }
    int nl = n - first_logit;
    if (nl <= 0) return PS_OK;
    for (int t = 0; t < nl; t++)
        rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)(first_logit + t) * dim, m->out_norm, dim, m->hp.rms_eps);
    mm(c, &m->output, c->xb, nl, out, m->hp.vocab);
    return PS_OK;
}

ps_status ps_forward_stage(ps_ctx *c, const int32_t *tokens, const float *x_in, int n, int pos, float *out,
                           int n_logits, char *err, size_t errlen) {
    const ps_model *m = c->m;
    int dim = m->hp.dim;
    if (!m->has_head) n_logits = 0;
    if (n < 0 || n_logits < 0 || n_logits > n || pos < 0 || (m->has_embed ? !tokens : !x_in))
        return ps_errf(err, errlen, PS_ERR_ARG, "bad forward arguments (n=%d, pos=%d, n_logits=%d)", n, pos, n_logits);
    if ((long long)pos + n > c->n_ctx)
        return ps_errf(err, errlen, PS_ERR_RANGE, "%d tokens at position %d exceed the context size of %d", n, pos,
                       c->n_ctx);
    for (int i = 0; m->has_embed && i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.vocab)
            return ps_errf(err, errlen, PS_ERR_ARG, "token id %d is outside the vocabulary (0..%d)", tokens[i],
                           m->hp.vocab - 1);
    int first_logit = n - n_logits;
    for (int done = 0; done < n;) {
        int chunk = n - done < c->max_batch ? n - done : c->max_batch;
        int fl = first_logit > done ? first_logit - done : 0;
        float *o = m->has_head ? out + (size_t)(done + fl - first_logit) * m->hp.vocab : out + (size_t)done * dim;
        ps_status s = forward_chunk(c, m->has_embed ? tokens + done : NULL, m->has_embed ? NULL : x_in + (size_t)done * dim,
                                    chunk, pos + done, o, fl);
        if (s) return ps_errf(err, errlen, s, "forward pass failed: %s", ps_strerror(s));
        done += chunk;
    }
    return PS_OK;
}

ps_status ps_forward(ps_ctx *c, const int32_t *tokens, int n, int pos, float *logits, int n_logits, char *err,
                     size_t errlen) {
    const ps_model *m = c->m;
    if (!m->has_embed || !m->has_head)
        return ps_errf(err, errlen, PS_ERR_ARG, "this model file holds layers %d..%d only, not the whole model",
                       m->layer_begin, m->layer_end);
    return ps_forward_stage(c, tokens, NULL, n, pos, logits, n_logits, err, errlen);
}
