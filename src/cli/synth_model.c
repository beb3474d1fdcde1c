/* synth_model.c - metadata, tensor plan and random weights of a synthetic GGUF model.
 *
 * Weights are drawn at write time, tensor by tensor, inside the GGUF writer's fill callback,
 * so only one tensor is ever in memory. Every row of every tensor has its own counter-based
 * random stream keyed by (seed, tensor name, row): the file does not depend on the thread
 * count, and a tensor's values do not depend on which other tensors the model has.
 *
 * Speed: the 32-wide formats and the float types are quantized row by row with
 * ps_quantize_row. The K formats' reference quantizer searches scales and costs ~100 ns per
 * element, which would take 10+ CPU minutes for an 8B model; so a K-type tensor of more than
 * POOL_MIN_BLOCKS super-blocks, with rows of at least POOL_MIN_ROW_BLOCKS, is assembled from
 * a pool of POOL_BLOCKS super-blocks (drawn the same way and quantized with ps_quantize_row,
 * one pool per type and row width), each super-block of the tensor picked from the pool by
 * its own counter-based draw. The values have the same distribution and rows still all
 * differ (with 4+ blocks a row, a repeat is astronomically unlikely). `exact` turns this off.
 *
 * Values (chosen so that activations stay O(1) through any number of layers, logits have a
 * standard deviation of about 1 and the softmax is neither flat nor one-hot):
 *   matrices   bell-shaped (Irwin-Hall of 4 uniforms), mean 0, std 1/sqrt(fan-in = ne[0])
 *   norms      1 + 0.05 * that shape (F32)
 *   biases     0.02 * that shape (F32)
 *   rope_freqs the Llama 3.1 "llama3" rope-scaling factors (F32), see rope_factors()
 *
 * Q4_K_M / Q5_K_M recipe (llama.cpp's llama_tensor_get_type, for dense models):
 *   base = Q4_K (Q5_K for Q5_K_M), hi = Q6_K;
 *   output.weight -> hi; token_embd.weight -> hi when tied (it is then the head), else base;
 *   blk.i.attn_v.weight and blk.i.ffn_down.weight -> hi when more_bits(i, n_layer):
 *     i < n/8, or i >= 7n/8, or (i - n/8) % 3 == 2 (the first and last eighth and every third
 *     layer between: about half the layers);
 *   every other matrix -> base; norms, biases and rope_freqs stay F32. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gguf/gguf.h"
#include "args.h"
#include "synth.h"

// ---------------------------------------------------------------------------------------
// Types per tensor

/* llama.cpp's use_more_bits: the layers a _M mix gives more bits. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* See synth.h; the recipe is in this file's header comment. */
ps_type ps_cli_synth_tensor_type(const ps_cli_synth_quant *q, const char *suffix, int il, int n_layer, bool tied) {
    if (!q->mix) return q->base;
    if (!strcmp(suffix, "output.weight")) return q->hi;
    if (!strcmp(suffix, "token_embd.weight")) return tied ? q->hi : q->base;
    if ((!strcmp(suffix, "attn_v.weight") || !strcmp(suffix, "ffn_down.weight")) && more_bits(il, n_layer))
        return q->hi;
    return q->base;
}

// ---------------------------------------------------------------------------------------
// Random numbers

/* SplitMix64 finalizer: a bijective mix of x. */
static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Key of a tensor's random streams: seed mixed with the FNV-1a hash of its name. */
static uint64_t tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return mix64(h ^ mix64(seed + 0x9E3779B97F4A7C15ull));
}

/* dst[i] = mean + std * z_i, z_i of mean 0 and variance 1 (sum of four 16-bit uniforms of
 * one 64-bit draw; bounded by +-3.46), element i drawn from counter (key, row, i). */
static void random_row(uint64_t key, int64_t row, float mean, float std, float *dst, int64_t n) {
    uint64_t base = mix64(key ^ ((uint64_t)row * 0xD1B54A32D192ED03ull));
    const float scale = std * 1.7320508f / 65536.0f;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mix64(base + (uint64_t)i * 0x9E3779B97F4A7C15ull);
        int32_t s = (int32_t)(r & 0xFFFF) + (int32_t)(r >> 16 & 0xFFFF) + (int32_t)(r >> 32 & 0xFFFF) +
                    (int32_t)(r >> 48) - 131070;
        dst[i] = mean + scale * (float)s;
    }
}

/* Llama 3.1 frequency factors (convert_hf_to_gguf's "llama3" rope scaling) for head_dim/2
 * pairs: 1 for short wavelengths, `factor` for long ones, smoothly between; low_freq_factor 1,
 * high_freq_factor 4, original context 8192. */
static void rope_factors(float base, int head_dim, float factor, float *out) {
    const double old_ctx = 8192, low = 1, high = 4;
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    for (int i = 0; i < head_dim / 2; i++) {
        double freq = 1.0 / pow(base, (2.0 * i) / head_dim);
        double wavelen = 2 * M_PI / freq;
        if (wavelen < high_wavelen)
            out[i] = 1.0f;
        else if (wavelen > low_wavelen)
            out[i] = factor;
        else {
            double smooth = (old_ctx / wavelen - low) / (high - low);
            out[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tensor plan

typedef enum { KIND_MAT, KIND_NORM, KIND_BIAS, KIND_ROPE } tensor_kind;

typedef struct {
    char name[64];
    ps_type type;
    uint32_t n_dims;
    int64_t ne[2]; /* ne[0] = row length (fan-in), ne[1] = rows (1 for vectors) */
    tensor_kind kind;
    uint64_t key; /* random stream key */
    float std;    /* of a matrix's values: 1/sqrt(fan-in) */
    size_t nbytes;
} tensor_spec;

#define POOL_BLOCKS         16384 /* super-blocks per pool (4M values, ~0.4 s of K quantization) */
#define POOL_MIN_BLOCKS     2048  /* smaller K-type tensors are quantized row by row */
#define POOL_MIN_ROW_BLOCKS 4     /* and so are narrower rows (rows of 1-3 pool blocks could repeat) */

/* Quantized super-blocks of one type for matrices of one row width (fan-in). */
typedef struct {
    ps_type type;
    int64_t width;
    uint8_t *data; /* POOL_BLOCKS blocks */
} block_pool;

typedef struct {
    const ps_cli_synth_shape *s;
    tensor_spec *t;
    int n, cap;
    int n_threads;
    bool show_progress;
    bool exact; /* never use pools */
    double t0;
    uint64_t seed;
    block_pool pools[8]; /* at most {base, hi} x {dim, heads x head size, ffn} */
    int n_pools;
} plan;

/* Appends a tensor to the plan; il >= 0 prefixes "blk.<il>.". A matrix's type comes from
 * the recipe, vectors are F32. */
static ps_status plan_add(plan *p, const ps_cli_synth_quant *q, int il, const char *suffix, tensor_kind kind,
                          int64_t ne0, int64_t ne1) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        tensor_spec *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return PS_ERR_NOMEM;
        p->t = t;
        p->cap = cap;
    }
    tensor_spec *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    if (il >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s", il, suffix);
    else
        snprintf(t->name, sizeof t->name, "%s", suffix);
    t->kind = kind;
    t->n_dims = kind == KIND_MAT ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = kind == KIND_MAT ? ne1 : 1;
    t->type = kind == KIND_MAT ? ps_cli_synth_tensor_type(q, suffix, il, p->s->n_layer, p->s->tied) : PS_TYPE_F32;
    t->key = tensor_key(p->seed, t->name);
    t->std = 1.0f / sqrtf((float)ne0);
    t->nbytes = ps_row_bytes(t->type, ne0) * (size_t)t->ne[1];
    return t->nbytes ? PS_OK : PS_ERR_ARG;
}

/* Appends the tensors of layer il in llama.cpp's order. */
static ps_status plan_layer(plan *p, const ps_cli_synth_quant *q, int il) {
    const ps_cli_synth_shape *s = p->s;
    int64_t qd = (int64_t)s->n_head * s->head_dim, kvd = (int64_t)s->n_head_kv * s->head_dim;
    bool bias = !strcmp(s->arch, "qwen2"), qk_norm = !strcmp(s->arch, "qwen3");
    ps_status st;
    if ((st = plan_add(p, q, il, "attn_norm.weight", KIND_NORM, s->dim, 1)) ||
        (st = plan_add(p, q, il, "attn_q.weight", KIND_MAT, s->dim, qd)) ||
        (bias && (st = plan_add(p, q, il, "attn_q.bias", KIND_BIAS, qd, 1))) ||
        (st = plan_add(p, q, il, "attn_k.weight", KIND_MAT, s->dim, kvd)) ||
        (bias && (st = plan_add(p, q, il, "attn_k.bias", KIND_BIAS, kvd, 1))) ||
        (st = plan_add(p, q, il, "attn_v.weight", KIND_MAT, s->dim, kvd)) ||
        (bias && (st = plan_add(p, q, il, "attn_v.bias", KIND_BIAS, kvd, 1))) ||
        (qk_norm && (st = plan_add(p, q, il, "attn_q_norm.weight", KIND_NORM, s->head_dim, 1))) ||
        (qk_norm && (st = plan_add(p, q, il, "attn_k_norm.weight", KIND_NORM, s->head_dim, 1))) ||
        (st = plan_add(p, q, il, "attn_output.weight", KIND_MAT, qd, s->dim)) ||
        (st = plan_add(p, q, il, "ffn_norm.weight", KIND_NORM, s->dim, 1)) ||
        (st = plan_add(p, q, il, "ffn_gate.weight", KIND_MAT, s->dim, s->ffn)) ||
        (st = plan_add(p, q, il, "ffn_up.weight", KIND_MAT, s->dim, s->ffn)) ||
        (st = plan_add(p, q, il, "ffn_down.weight", KIND_MAT, s->ffn, s->dim)))
        return st;
    return PS_OK;
}

/* The whole model: rope_freqs, token_embd, the layers, output_norm, output (untied). */
static ps_status plan_build(plan *p, const ps_cli_synth_quant *q) {
    const ps_cli_synth_shape *s = p->s;
    ps_status st;
    if (s->rope_factor > 0 && (st = plan_add(p, q, -1, "rope_freqs.weight", KIND_ROPE, s->head_dim / 2, 1))) return st;
    if ((st = plan_add(p, q, -1, "token_embd.weight", KIND_MAT, s->dim, s->vocab))) return st;
    for (int il = 0; il < s->n_layer; il++)
        if ((st = plan_layer(p, q, il))) return st;
    if ((st = plan_add(p, q, -1, "output_norm.weight", KIND_NORM, s->dim, 1))) return st;
    if (!s->tied && (st = plan_add(p, q, -1, "output.weight", KIND_MAT, s->dim, s->vocab))) return st;
    return PS_OK;
}

ps_status ps_cli_synth_sizes(const ps_cli_synth_shape *s, const ps_cli_synth_quant *q, uint64_t *layer_bytes,
                             uint64_t *embed_bytes, uint64_t *head_bytes) {
    plan p = {.s = s};
    ps_status st = plan_build(&p, q);
    memset(layer_bytes, 0, (size_t)s->n_layer * sizeof *layer_bytes);
    *embed_bytes = *head_bytes = 0;
    for (int i = 0; !st && i < p.n; i++) {
        const tensor_spec *t = &p.t[i];
        int il;
        if (sscanf(t->name, "blk.%d.", &il) == 1 && il >= 0 && il < s->n_layer)
            layer_bytes[il] += t->nbytes;
        else if (!strcmp(t->name, "token_embd.weight"))
            *embed_bytes = t->nbytes;
        else if (!strcmp(t->name, "output_norm.weight") || !strcmp(t->name, "output.weight"))
            *head_bytes += t->nbytes;
    }
    if (s->tied) *head_bytes += *embed_bytes;
    free(p.t);
    return st;
}

// ---------------------------------------------------------------------------------------
// Fill: rows drawn and quantized on n_threads threads

typedef struct {
    const tensor_spec *t;
    const uint8_t *pool; /* non-NULL: pick the blocks of each row from this pool */
    uint8_t *buf;
    int64_t r0, r1; /* rows [r0, r1) */
    ps_status st;
} fill_job;

/* Row r of a pooled matrix: block b is pool block (draw of (key, r, b)) mod POOL_BLOCKS. */
static void pooled_row(const tensor_spec *t, const uint8_t *pool, int64_t r, uint8_t *dst) {
    const ps_type_info *ti = ps_type_get(t->type);
    int64_t nb = t->ne[0] / ti->block_size;
    uint64_t base = mix64(t->key ^ ((uint64_t)r * 0xD1B54A32D192ED03ull));
    for (int64_t b = 0; b < nb; b++) {
        uint64_t k = mix64(base + (uint64_t)b * 0x9E3779B97F4A7C15ull) % POOL_BLOCKS;
        memcpy(dst + b * ti->type_size, pool + k * ti->type_size, ti->type_size);
    }
}

/* Draws and quantizes (or picks from the pool) rows [r0, r1) into their place in buf. */
static void *fill_rows(void *arg) {
    fill_job *j = arg;
    const tensor_spec *t = j->t;
    size_t row_bytes = ps_row_bytes(t->type, t->ne[0]);
    float *row = j->pool ? NULL : malloc((size_t)t->ne[0] * sizeof *row);
    j->st = row || j->pool ? PS_OK : PS_ERR_NOMEM;
    for (int64_t r = j->r0; r < j->r1 && !j->st; r++) {
        if (j->pool) {
            pooled_row(t, j->pool, r, j->buf + (size_t)r * row_bytes);
            continue;
        }
        random_row(t->key, r, 0.0f, t->std, row, t->ne[0]);
        j->st = ps_quantize_row(t->type, row, j->buf + (size_t)r * row_bytes, t->ne[0]);
    }
    free(row);
    return NULL;
}

/* Fills a matrix, splitting its rows in contiguous ranges among up to n_threads threads
 * (the calling thread takes the first range). pool as in fill_job. */
static ps_status fill_matrix(const tensor_spec *t, const uint8_t *pool, uint8_t *buf, int n_threads) {
    enum { MAX_THREADS = 64 };
    fill_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    int64_t rows = t->ne[1];
    int nth = n_threads < 1 ? 1 : n_threads > MAX_THREADS ? MAX_THREADS : n_threads;
    if (rows < 4 * nth) nth = 1;
    for (int i = 0; i < nth; i++)
        jobs[i] = (fill_job){.t = t, .pool = pool, .buf = buf, .r0 = rows * i / nth, .r1 = rows * (i + 1) / nth};
    for (int i = 1; i < nth; i++) started[i] = pthread_create(&tid[i], NULL, fill_rows, &jobs[i]) == 0;
    fill_rows(&jobs[0]);
    ps_status st = jobs[0].st;
    for (int i = 1; i < nth; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            fill_rows(&jobs[i]); /* no thread: do its share here */
        if (!st) st = jobs[i].st;
    }
    return st;
}

/* The pool for matrices of t's type and row width, made on first use (owned by the plan);
 * *out stays NULL when t is to be quantized row by row instead. */
static ps_status pool_for(plan *p, const tensor_spec *t, const uint8_t **out) {
    const ps_type_info *ti = ps_type_get(t->type);
    *out = NULL;
    int64_t per_row = t->ne[0] / PS_QK_K;
    if (p->exact || ti->block_size != PS_QK_K || per_row < POOL_MIN_ROW_BLOCKS || per_row * t->ne[1] <= POOL_MIN_BLOCKS)
        return PS_OK;
    for (int i = 0; i < p->n_pools; i++)
        if (p->pools[i].type == t->type && p->pools[i].width == t->ne[0]) return *out = p->pools[i].data, PS_OK;
    if (p->n_pools == (int)PS_ARRAY_LEN(p->pools)) return PS_OK; /* cannot happen: fall back to exact */
    block_pool *bp = &p->pools[p->n_pools];
    tensor_spec ps = {.type = t->type, .n_dims = 2, .ne = {PS_QK_K, POOL_BLOCKS}, .kind = KIND_MAT, .std = t->std};
    snprintf(ps.name, sizeof ps.name, "pool.%s.%lld", ti->name, (long long)t->ne[0]);
    ps.key = tensor_key(p->seed, ps.name);
    if (!(bp->data = malloc((size_t)POOL_BLOCKS * ti->type_size))) return PS_ERR_NOMEM;
    ps_status st = fill_matrix(&ps, NULL, bp->data, p->n_threads);
    if (st) {
        free(bp->data);
        return st;
    }
    bp->type = t->type;
    bp->width = t->ne[0];
    p->n_pools++;
    *out = bp->data;
    return PS_OK;
}

/* The writer's fill callback: tensor `index` of the plan. */
static ps_status fill(void *ctx, int64_t index, void *buf, size_t nbytes, char *err, size_t errlen) {
    plan *p = ctx;
    if (index < 0 || index >= p->n || nbytes != p->t[index].nbytes)
        return ps_errf(err, errlen, PS_ERR_INTERNAL, "fill asked for tensor %lld of %zu bytes", (long long)index,
                       nbytes);
    const tensor_spec *t = &p->t[index];
    switch (t->kind) {
    case KIND_MAT: {
        const uint8_t *pool;
        ps_status st = pool_for(p, t, &pool);
        if (!st) st = fill_matrix(t, pool, buf, p->n_threads);
        if (st) return ps_errf(err, errlen, st, "cannot quantize to %s: %s", ps_type_name(t->type), ps_strerror(st));
        return PS_OK;
    }
    case KIND_NORM: random_row(t->key, 0, 1.0f, 0.05f, buf, t->ne[0]); return PS_OK;
    case KIND_BIAS: random_row(t->key, 0, 0.0f, 0.02f, buf, t->ne[0]); return PS_OK;
    case KIND_ROPE: rope_factors(p->s->rope_base, p->s->head_dim, p->s->rope_factor, buf); return PS_OK;
    }
    return PS_ERR_INTERNAL;
}

/* Progress callback: one stderr line rewritten in place with bytes and percent. */
static void progress(void *ctx, uint64_t done, uint64_t total) {
    plan *p = ctx;
    if (!p->show_progress) return;
    double el = ps_now() - p->t0, mb = 1024.0 * 1024.0;
    fprintf(stderr, "\rpipeshard synth: %8.1f / %.1f MiB (%3d%%) %6.1f s", done / mb, total / mb,
            total ? (int)(100 * done / total) : 100, el);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

// ---------------------------------------------------------------------------------------
// Metadata

typedef struct {
    ps_gguf_writer *w;
    const char *arch;
    ps_status st; /* first failure; later setters do nothing */
} meta;

/* "<arch>.<suffix>" in buf. */
static const char *arch_key(const meta *m, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", m->arch, suffix);
    return buf;
}

/* Setters: m_u32 / m_f32 set "<arch>.<suffix>", m_str / m_id a full key; each does nothing
 * after a failure and records the first one in m->st. */
static void m_u32(meta *m, const char *suffix, uint32_t v) {
    char k[96];
    if (!m->st) m->st = ps_gguf_writer_set_u32(m->w, arch_key(m, suffix, k, sizeof k), v);
}

static void m_f32(meta *m, const char *suffix, float v) {
    char k[96];
    if (!m->st) m->st = ps_gguf_writer_set_f32(m->w, arch_key(m, suffix, k, sizeof k), v);
}

static void m_str(meta *m, const char *key, const char *v) {
    if (!m->st) m->st = ps_gguf_writer_set_str(m->w, key, v);
}

static void m_id(meta *m, const char *key, uint32_t v) {
    if (!m->st) m->st = ps_gguf_writer_set_u32(m->w, key, v);
}

/* A ChatML template (as SmolLM2 / Qwen2.5 instruct models ship), for --chat. */
static const char chat_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* general.* and the architecture's hyper-parameters. */
static void set_hparams(meta *m, const ps_cli_synth_shape *s, const ps_cli_synth_quant *q, uint64_t seed) {
    char desc[160];
    snprintf(desc, sizeof desc,
             "random weights (seed %llu, %s) written by pipeshard synth: for speed and "
             "bit-exactness tests, not for quality",
             (unsigned long long)seed, q->name);
    m_str(m, "general.architecture", s->arch);
    m_str(m, "general.name", s->name);
    m_str(m, "general.description", desc);
    m_id(m, "general.file_type", q->file_type);
    m_id(m, "general.quantization_version", 2);
    m_u32(m, "block_count", (uint32_t)s->n_layer);
    m_u32(m, "context_length", (uint32_t)s->ctx);
    m_u32(m, "embedding_length", (uint32_t)s->dim);
    m_u32(m, "feed_forward_length", (uint32_t)s->ffn);
    m_u32(m, "attention.head_count", (uint32_t)s->n_head);
    m_u32(m, "attention.head_count_kv", (uint32_t)s->n_head_kv);
    m_f32(m, "attention.layer_norm_rms_epsilon", s->rms_eps);
    m_f32(m, "rope.freq_base", s->rope_base);
    m_u32(m, "rope.dimension_count", (uint32_t)s->head_dim);
    if (s->head_dim * s->n_head != s->dim) {
        m_u32(m, "attention.key_length", (uint32_t)s->head_dim);
        m_u32(m, "attention.value_length", (uint32_t)s->head_dim);
    }
    m_u32(m, "vocab_size", (uint32_t)s->vocab);
}

/* tokenizer.* : the byte-level BPE vocabulary and the chat template. */
static void set_tokenizer(meta *m, const ps_cli_synth_shape *s, const ps_cli_synth_vocab *v) {
    m_str(m, "tokenizer.ggml.model", "gpt2");
    m_str(m, "tokenizer.ggml.pre", s->pre);
    if (!m->st)
        m->st = ps_gguf_writer_set_arr_str(m->w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                           (uint64_t)v->n_tokens);
    if (!m->st)
        m->st = ps_gguf_writer_set_arr(m->w, "tokenizer.ggml.token_type", PS_GGUF_I32, v->types, (uint64_t)v->n_tokens);
    if (!m->st)
        m->st = ps_gguf_writer_set_arr_str(m->w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                           (uint64_t)v->n_merges);
    m_id(m, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    m_id(m, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    m_id(m, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    if (!m->st) m->st = ps_gguf_writer_set_bool(m->w, "tokenizer.ggml.add_bos_token", false);
    m_str(m, "tokenizer.chat_template", chat_template);
}

// ---------------------------------------------------------------------------------------
// Public

/* Adds every planned tensor to the writer, to be filled at write time. */
static ps_status add_tensors(ps_gguf_writer *w, plan *p) {
    for (int i = 0; i < p->n; i++) {
        ps_status st =
            ps_gguf_writer_add_tensor(w, p->t[i].name, p->t[i].type, p->t[i].n_dims, p->t[i].ne, NULL, fill, p);
        if (st) return st;
    }
    return PS_OK;
}

/* See synth.h. */
ps_status ps_cli_synth_write(const ps_cli_synth_shape *s, const ps_cli_synth_quant *q, const ps_cli_synth_vocab *v,
                             uint64_t seed, int n_threads, bool exact, const char *path, bool show_progress, char *err,
                             size_t errlen) {
    plan p = {
        .s = s, .n_threads = n_threads, .show_progress = show_progress, .exact = exact, .t0 = ps_now(), .seed = seed};
    ps_gguf_writer *w = NULL;
    ps_status st = plan_build(&p, q);
    if (st) {
        ps_errf(err, errlen, st, "cannot plan tensor '%s' (%s)", p.n ? p.t[p.n - 1].name : "?", ps_strerror(st));
        goto out;
    }
    if ((st = ps_gguf_writer_create(&w, 3, 32))) {
        ps_errf(err, errlen, st, "cannot create the GGUF writer: %s", ps_strerror(st));
        goto out;
    }
    meta m = {.w = w, .arch = s->arch};
    set_hparams(&m, s, q, seed);
    set_tokenizer(&m, s, v);
    if ((st = m.st) || (st = add_tensors(w, &p))) {
        ps_errf(err, errlen, st, "cannot describe the model: %s", ps_strerror(st));
        goto out;
    }
    st = ps_gguf_writer_write(w, path, progress, &p, err, errlen);
out:
    ps_gguf_writer_free(w);
    for (int i = 0; i < p.n_pools; i++) free(p.pools[i].data);
    free(p.t);
    return st;
}
