/* model.c - hyper-parameters, weight binding and the forward pass (llama, qwen2, qwen3).
 *
 * Every reduction here (norms, attention dots, softmax sums) uses a fixed order that
 * depends only on the vector length, never on the batch size or thread count, so that a
 * sequence's logits are bit-identical however its tokens are batched (DESIGN.md, inv. 1). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/types.h"

// ---------------------------------------------------------------------------------------
// Hyper-parameters

static const struct {
    const char *name;
    ps_arch arch;
    bool rope_neox;
} arch_table[] = {
    {"llama", PS_ARCH_LLAMA, false},
    {"qwen2", PS_ARCH_QWEN2, true},
    {"qwen3", PS_ARCH_QWEN3, true},
};

/* Reads "<arch>.<suffix>" as a positive int; absent and `def` >= 0 gives def. */
static ps_status hp_int(const ps_gguf *g, const char *arch, const char *suffix, int def, int *out, char *err,
                        size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    ps_status s = ps_gguf_get_u32(g, key, &v, err, errlen);
    if (s == PS_ERR_NOT_FOUND && def >= 0) {
        *out = def;
        return PS_OK;
    }
    if (s == PS_ERR_NOT_FOUND) return ps_errf(err, errlen, PS_ERR_FORMAT, "model metadata lacks '%s'", key);
    if (s != PS_OK) return s;
    if (v == 0 || v > (1u << 24))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "model metadata '%s' = %u is out of range", key, v);
    *out = (int)v;
    return PS_OK;
}

/* Reads "<arch>.<suffix>" as a finite float; absent gives def. */
static ps_status hp_float(const ps_gguf *g, const char *arch, const char *suffix, float def, float *out, char *err,
                          size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    ps_status s = ps_gguf_get_f32(g, key, out, err, errlen);
    if (s == PS_ERR_NOT_FOUND) {
        *out = def;
        return PS_OK;
    }
    if (s == PS_OK && !isfinite(*out))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "model metadata '%s' is not a finite number", key);
    return s;
}

/* Fills hp from the metadata (vocab is set later from the embedding's shape). */
static ps_status read_hparams(const ps_gguf *g, ps_hparams *hp, char *err, size_t errlen) {
    ps_gguf_str a;
    ps_status s = ps_gguf_get_str(g, "general.architecture", &a, err, errlen);
    if (s == PS_ERR_NOT_FOUND)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "model metadata lacks 'general.architecture'");
    if (s != PS_OK) return s;
    size_t i = 0;
    while (i < PS_ARRAY_LEN(arch_table) && !ps_gguf_str_eq(a, arch_table[i].name)) i++;
    if (i == PS_ARRAY_LEN(arch_table))
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)",
                       (int)(a.len > 64 ? 64 : a.len), a.data);
    memset(hp, 0, sizeof *hp);
    hp->arch = arch_table[i].arch;
    hp->rope_neox = arch_table[i].rope_neox;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch_table[i].name);
    const char *an = hp->arch_name;
    if ((s = hp_int(g, an, "block_count", -1, &hp->n_layer, err, errlen)) ||
        (s = hp_int(g, an, "embedding_length", -1, &hp->dim, err, errlen)) ||
        (s = hp_int(g, an, "feed_forward_length", -1, &hp->ffn_dim, err, errlen)) ||
        (s = hp_int(g, an, "attention.head_count", -1, &hp->n_head, err, errlen)) ||
        (s = hp_int(g, an, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, err, errlen)) ||
        (s = hp_int(g, an, "context_length", 2048, &hp->ctx_train, err, errlen)) ||
        (s = hp_int(g, an, "attention.key_length", hp->dim / hp->n_head, &hp->head_dim, err, errlen)) ||
        (s = hp_int(g, an, "rope.dimension_count", hp->head_dim, &hp->rope_dim, err, errlen)) ||
        (s = hp_float(g, an, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err, errlen)) ||
        (s = hp_float(g, an, "rope.freq_base", 10000.0f, &hp->rope_base, err, errlen)))
        return s;
    int vlen;
    if ((s = hp_int(g, an, "attention.value_length", hp->head_dim, &vlen, err, errlen))) return s;
    if (vlen != hp->head_dim)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "value head size %d differs from key head size %d", vlen,
                       hp->head_dim);
    if (hp->n_head % hp->n_head_kv)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d", hp->n_head,
                       hp->n_head_kv);
    if (hp->head_dim > 256)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "head size %d is not supported (at most 256)", hp->head_dim);
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 || hp->head_dim % 2)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "rope dimension %d does not fit head size %d", hp->rope_dim,
                       hp->head_dim);
    if (!(hp->rms_eps > 0) || !(hp->rope_base > 0))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "rms epsilon and rope base must be positive");
    hp->rope_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", an);
    ps_gguf_str st;
    if (ps_gguf_get_str(g, key, &st, NULL, 0) == PS_OK && !ps_gguf_str_eq(st, "none")) {
        if (!ps_gguf_str_eq(st, "linear"))
            return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "rope scaling '%.*s' is not supported (only linear)",
                           (int)(st.len > 32 ? 32 : st.len), st.data);
        if ((s = hp_float(g, an, "rope.scaling.factor", 1.0f, &hp->rope_scale, err, errlen))) return s;
        if (!(hp->rope_scale > 0)) return ps_errf(err, errlen, PS_ERR_FORMAT, "rope scaling factor must be positive");
    }
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Weight binding

typedef struct {
    ps_model *m;
    float *arena;      /* converted small vectors are carved from here */
    size_t arena_used; /* floats */
    size_t arena_cap;
    char *err;
    size_t errlen;
} binder;

/* Finds tensor `name` ("blk.%d.attn_q.weight" formatted with layer); NULL and, unless optional,
 * an error when absent. */
static const ps_gguf_tensor *find(binder *b, const char *name, bool optional, ps_status *s) {
    const ps_gguf_tensor *t = ps_gguf_find_tensor(b->m->gguf, name);
    *s = PS_OK;
    if (!t && !optional) *s = ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "model lacks tensor '%s'", name);
    return t;
}

/* Binds a 2-D weight (rows, cols) that the matmul kernels can use in place. */
static ps_status bind_mat(binder *b, const char *name, int64_t rows, int64_t cols, ps_mat *out) {
    ps_status s;
    const ps_gguf_tensor *t = find(b, name, false, &s);
    if (!t) return s;
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)rows);
    if (!ps_matmul_supported(t->type))
        return ps_errf(b->err, b->errlen, PS_ERR_UNSUPPORTED, "tensor '%s' has type %s, which is not supported", name,
                       ps_type_name(t->type));
    *out = (ps_mat){.type = t->type, .rows = rows, .cols = cols, .data = t->data};
    return PS_OK;
}

/* Binds a 1-D vector of n elements, converted to f32 in the arena; *out stays NULL when
 * the tensor is optional and absent. */
static ps_status bind_vec(binder *b, const char *name, int64_t n, bool optional, const float **out) {
    ps_status s;
    const ps_gguf_tensor *t = find(b, name, optional, &s);
    *out = NULL;
    if (!t) return s;
    if (t->n_dims != 1 || t->ne[0] != n)
        return ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "tensor '%s' has %lld elements in %u dims, expected %lld",
                       name, (long long)t->ne[0], t->n_dims, (long long)n);
    const ps_type_info *ti = ps_type_get(t->type);
    if (!ti || !ti->supported || n % ti->block_size)
        return ps_errf(b->err, b->errlen, PS_ERR_UNSUPPORTED, "tensor '%s' has type %s, which is not supported", name,
                       ps_type_name(t->type));
    if (b->arena_used + (size_t)n > b->arena_cap)
        return ps_errf(b->err, b->errlen, PS_ERR_INTERNAL, "vector arena too small for '%s'", name);
    float *dst = b->arena + b->arena_used;
    if ((s = ps_dequantize_row(t->type, t->data, dst, n)) != PS_OK)
        return ps_errf(b->err, b->errlen, s, "cannot convert tensor '%s'", name);
    b->arena_used += (size_t)n;
    *out = dst;
    return PS_OK;
}

/* Binds the tensors of layer il (global index) into L. */
static ps_status bind_layer(binder *b, int il, ps_layer *L) {
    const ps_hparams *hp = &b->m->hp;
    int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    bool biases = hp->arch == PS_ARCH_QWEN2, qk_norm = hp->arch == PS_ARCH_QWEN3;
    char n[96];
    ps_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d.%s", il, suffix), n)
    if ((s = bind_vec(b, NAME("attn_norm.weight"), hp->dim, false, &L->attn_norm)) ||
        (s = bind_mat(b, NAME("attn_q.weight"), qd, hp->dim, &L->wq)) ||
        (s = bind_mat(b, NAME("attn_k.weight"), kvd, hp->dim, &L->wk)) ||
        (s = bind_mat(b, NAME("attn_v.weight"), kvd, hp->dim, &L->wv)) ||
        (s = bind_vec(b, NAME("attn_q.bias"), qd, !biases, &L->bq)) ||
        (s = bind_vec(b, NAME("attn_k.bias"), kvd, !biases, &L->bk)) ||
        (s = bind_vec(b, NAME("attn_v.bias"), kvd, !biases, &L->bv)) ||
        (s = bind_vec(b, NAME("attn_q_norm.weight"), hp->head_dim, !qk_norm, &L->q_norm)) ||
        (s = bind_vec(b, NAME("attn_k_norm.weight"), hp->head_dim, !qk_norm, &L->k_norm)) ||
        (s = bind_mat(b, NAME("attn_output.weight"), hp->dim, qd, &L->wo)) ||
        (s = bind_vec(b, NAME("ffn_norm.weight"), hp->dim, false, &L->ffn_norm)) ||
        (s = bind_mat(b, NAME("ffn_gate.weight"), hp->ffn_dim, hp->dim, &L->w_gate)) ||
        (s = bind_mat(b, NAME("ffn_up.weight"), hp->ffn_dim, hp->dim, &L->w_up)) ||
        (s = bind_mat(b, NAME("ffn_down.weight"), hp->dim, hp->ffn_dim, &L->w_down)))
        return s;
#undef NAME
    return PS_OK;
}

/* Binds the embedding (stage 0), the head (last stage) and the rope factors, and sets
 * hp.vocab (from the embedding or head, or a shard's metadata when it holds neither). */
static ps_status bind_ends(binder *b) {
    ps_model *m = b->m;
    ps_hparams *hp = &m->hp;
    ps_status s;
    const ps_gguf_tensor *emb = ps_gguf_find_tensor(m->gguf, "token_embd.weight");
    const ps_gguf_tensor *out = ps_gguf_find_tensor(m->gguf, "output.weight");
    const ps_gguf_tensor *shape = emb ? emb : out;
    m->has_embed = m->shard.present ? m->shard.stage_index == 0 : true; /* stage 1 may start at layer 0 too */
    m->has_head = m->layer_end == hp->n_layer;
    if (!shape && (m->has_embed || m->has_head))
        return ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "model lacks tensor 'token_embd.weight'");
    if (shape && (shape->n_dims != 2 || shape->ne[1] < 1 || shape->ne[1] > (1 << 24)))
        return ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "tensor '%s' does not have a vocabulary shape", shape->name);
    hp->vocab = shape ? (int)shape->ne[1] : m->shard.vocab;
    if (m->shard.present && hp->vocab != m->shard.vocab)
        return ps_errf(b->err, b->errlen, PS_ERR_FORMAT, "shard metadata says %d vocabulary rows, tensors have %d",
                       m->shard.vocab, hp->vocab);
    if (m->has_embed && (s = bind_mat(b, "token_embd.weight", hp->vocab, hp->dim, &m->tok_embd))) return s;
    if (m->has_head) {
        if ((s = bind_vec(b, "output_norm.weight", hp->dim, false, &m->out_norm))) return s;
        if ((s = bind_mat(b, out ? "output.weight" : "token_embd.weight", hp->vocab, hp->dim, &m->output))) return s;
    }
    return bind_vec(b, "rope_freqs.weight", hp->rope_dim / 2, true, &m->rope_freqs);
}

/* Floats needed for every converted vector of the model (an upper bound). */
static size_t arena_floats(const ps_hparams *hp, int n_layers) {
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t per_layer = 2 * (size_t)hp->dim + qd + 2 * kvd + 2 * (size_t)hp->head_dim;
    return per_layer * (size_t)n_layers + (size_t)hp->dim + (size_t)hp->rope_dim / 2;
}

ps_status ps_model_load(const char *path, ps_gguf_load how, ps_model **out, char *err, size_t errlen) {
    *out = NULL;
    ps_model *m = ps_calloc(1, sizeof *m);
    if (!m) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_status s = ps_gguf_open_with(path, how, &m->gguf, err, errlen);
    if (s) goto err;
    if ((s = read_hparams(m->gguf, &m->hp, err, errlen))) goto err;
    if ((s = ps_shard_meta_read(m->gguf, &m->shard, err, errlen))) goto err;
    m->layer_begin = m->shard.present ? m->shard.layer_begin : 0;
    m->layer_end = m->shard.present ? m->shard.layer_end : m->hp.n_layer;
    int nl = m->layer_end - m->layer_begin;
    binder b = {.m = m, .arena_cap = arena_floats(&m->hp, nl), .err = err, .errlen = errlen};
    m->owned = b.arena = ps_malloc(b.arena_cap * sizeof(float));
    m->layers = nl ? ps_calloc((size_t)nl, sizeof *m->layers) : NULL; /* none: stage 0 with the embedding alone */
    if (!m->owned || (nl && !m->layers)) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory binding %d layers", nl);
        goto err;
    }
    if ((s = bind_ends(&b))) goto err;
    for (int i = 0; i < nl; i++)
        if ((s = bind_layer(&b, m->layer_begin + i, &m->layers[i]))) goto err;
    *out = m;
    return PS_OK;
err:
    ps_model_free(m);
    return s;
}

void ps_model_free(ps_model *m) {
    if (!m) return;
    ps_gguf_close(m->gguf);
    free(m->layers);
    free(m->owned);
    free(m);
}

double ps_model_decode_weight_bytes(const ps_model *m) {
    double b = 0;
#define MB(mat) ((double)ps_row_bytes((mat).type, (mat).cols) * (double)(mat).rows)
    for (int i = 0; i < m->layer_end - m->layer_begin; i++) {
        const ps_layer *L = &m->layers[i];
        b += MB(L->wq) + MB(L->wk) + MB(L->wv) + MB(L->wo) + MB(L->w_gate) + MB(L->w_up) + MB(L->w_down);
    }
    b += MB(m->output) + (double)ps_row_bytes(m->tok_embd.type, m->tok_embd.cols);
#undef MB
    return b;
}

double ps_model_decode_kv_bytes(const ps_model *m, long long n_prompt, long long n_gen) {
    double per_pos = 2.0 * sizeof(float) * m->hp.n_head_kv * m->hp.head_dim * (m->layer_end - m->layer_begin);
    return per_pos * ((double)n_prompt + (double)(n_gen + 1) / 2);
}
