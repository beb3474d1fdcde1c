/* tok_gguf.c - reading tokenizer.ggml.* metadata from a GGUF file into a ps_tok_spec.
 *
 * Kept apart from tok_load.c so that code building tokenizers from a spec (tests, synthetic
 * models) does not pull in the GGUF reader. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* Optional string key: absent leaves *out empty; a value of another type is an error. */
static ps_status opt_str(const ps_gguf *g, const char *key, ps_gguf_str *out, char *err, size_t errlen) {
    ps_status s = ps_gguf_get_str(g, key, out, err, errlen);
    if (s == PS_ERR_NOT_FOUND) {
        out->len = 0;
        out->data = NULL;
        return PS_OK;
    }
    return s;
}

/* Optional token id: absent gives def when def < n (else none); 0xFFFFFFFF and negative
 * values mean none; anything else is range-checked by the builder. */
static ps_status opt_id(const ps_gguf *g, const char *key, int64_t def, uint32_t n, int64_t *out, char *err,
                        size_t errlen) {
    int64_t v;
    ps_status s = ps_gguf_get_i64(g, key, &v, err, errlen);
    if (s == PS_ERR_NOT_FOUND) {
        *out = def < (int64_t)n ? def : -1;
        return PS_OK;
    }
    if (s) return s;
    *out = (v < 0 || v == (int64_t)UINT32_MAX) ? -1 : v;
    return PS_OK;
}

/* Optional bool: absent leaves -1 (the kind's default). */
static ps_status opt_bool(const ps_gguf *g, const char *key, int8_t *out, char *err, size_t errlen) {
    bool v;
    ps_status s = ps_gguf_get_bool(g, key, &v, err, errlen);
    if (s == PS_ERR_NOT_FOUND) return PS_OK;
    if (s) return s;
    *out = v;
    return PS_OK;
}

/* An optional numeric array of exactly n elements (NULL when absent). */
static ps_status opt_num_arr(const ps_gguf *g, const char *key, uint32_t n, bool want_float, const ps_gguf_value **out,
                             char *err, size_t errlen) {
    const ps_gguf_value *v = ps_gguf_get(g, key);
    *out = NULL;
    if (!v) return PS_OK;
    if (v->type != PS_GGUF_ARRAY) return ps_errf(err, errlen, PS_ERR_FORMAT, "%s is not an array", key);
    ps_gguf_vtype et = v->arr.type;
    bool is_float = et == PS_GGUF_F32 || et == PS_GGUF_F64;
    bool is_int = et <= PS_GGUF_I32 || et == PS_GGUF_U64 || et == PS_GGUF_I64;
    if (want_float ? !is_float : !is_int)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "%s has elements of GGUF type %d, expected %s", key, (int)et,
                       want_float ? "float" : "integer");
    if (v->arr.n != n)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "%s has %llu elements for %u tokens", key,
                       (unsigned long long)v->arr.n, n);
    *out = v;
    return PS_OK;
}

/* Reads the token list, scores and types; scores/types are copied into arrays the caller frees. */
static ps_status read_vocab(const ps_gguf *g, ps_tok_spec *sp, float **scores, int32_t **types, char *err,
                            size_t errlen) {
    const ps_gguf_value *tv, *sv, *yv;
    ps_status s = ps_gguf_get_arr(g, "tokenizer.ggml.tokens", PS_GGUF_STRING, &tv, err, errlen);
    if (s == PS_ERR_NOT_FOUND) return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens is missing");
    if (s) return s;
    if (tv->arr.n == 0 || tv->arr.n >= INT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens has %llu tokens",
                       (unsigned long long)tv->arr.n);
    sp->n_tokens = (uint32_t)tv->arr.n;
    sp->tokens = tv->arr.strs;
    if ((s = opt_num_arr(g, "tokenizer.ggml.scores", sp->n_tokens, true, &sv, err, errlen))) return s;
    if ((s = opt_num_arr(g, "tokenizer.ggml.token_type", sp->n_tokens, false, &yv, err, errlen))) return s;
    if (sv && !(*scores = ps_malloc(sp->n_tokens * sizeof **scores))) return PS_ERR_NOMEM;
    if (yv && !(*types = ps_malloc(sp->n_tokens * sizeof **types))) return PS_ERR_NOMEM;
    for (uint32_t i = 0; sv && i < sp->n_tokens; i++) (*scores)[i] = (float)ps_gguf_arr_float(sv, i);
    for (uint32_t i = 0; yv && i < sp->n_tokens; i++) {
        int64_t ty = ps_gguf_arr_int(yv, i);
        (*types)[i] = ty < 0 || ty > 1000 ? 1000 : (int32_t)ty; /* out of range: rejected by the builder */
    }
    sp->scores = *scores;
    sp->types = *types;
    return PS_OK;
}

/* Reads tokenizer.ggml.model and .pre; a file without a tokenizer is PS_ERR_NOT_FOUND. */
static ps_status read_model(const ps_gguf *g, ps_tok_spec *sp, char *err, size_t errlen) {
    ps_status s = ps_gguf_get_str(g, "tokenizer.ggml.model", &sp->model, err, errlen);
    if (s == PS_ERR_NOT_FOUND)
        return ps_errf(err, errlen, PS_ERR_NOT_FOUND, "the file has no tokenizer (tokenizer.ggml.model is missing)");
    if (s) return s;
    if (!ps_gguf_str_eq(sp->model, "llama") && !ps_gguf_str_eq(sp->model, "gpt2"))
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "unsupported tokenizer '%.*s' (tokenizer.ggml.model; supported: llama, gpt2)",
                       (int)(sp->model.len > 40 ? 40 : sp->model.len), sp->model.data ? sp->model.data : "");
    return opt_str(g, "tokenizer.ggml.pre", &sp->pre, err, errlen);
}

/* Reads what follows the vocabulary: merges, special ids, flags. */
static ps_status read_rest(const ps_gguf *g, ps_tok_spec *sp, char *err, size_t errlen) {
    const ps_gguf_value *mv;
    ps_status s = ps_gguf_get_arr(g, "tokenizer.ggml.merges", PS_GGUF_STRING, &mv, err, errlen);
    if (s && s != PS_ERR_NOT_FOUND) return s;
    if (!s) {
        sp->n_merges = mv->arr.n;
        sp->merges = mv->arr.strs;
    }
    bool spm = ps_gguf_str_eq(sp->model, "llama"); /* llama.cpp's SPM defaults: unk 0, bos 1, eos 2 */
    uint32_t n = sp->n_tokens;
    if ((s = opt_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n, &sp->bos_id, err, errlen)) ||
        (s = opt_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n, &sp->eos_id, err, errlen)) ||
        (s = opt_id(g, "tokenizer.ggml.eot_token_id", -1, n, &sp->eot_id, err, errlen)) ||
        (s = opt_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n, &sp->unk_id, err, errlen)) ||
        (s = opt_id(g, "tokenizer.ggml.padding_token_id", -1, n, &sp->pad_id, err, errlen)) ||
        (s = opt_bool(g, "tokenizer.ggml.add_bos_token", &sp->add_bos, err, errlen)) ||
        (s = opt_bool(g, "tokenizer.ggml.add_eos_token", &sp->add_eos, err, errlen)) ||
        (s = opt_bool(g, "tokenizer.ggml.add_space_prefix", &sp->add_space_prefix, err, errlen)))
        return s;
    return PS_OK;
}

ps_status ps_tok_create(const ps_gguf *g, ps_tok **out, char *err, size_t errlen) {
    *out = NULL;
    ps_tok_spec sp = ps_tok_spec_init();
    float *scores = NULL;
    int32_t *types = NULL;
    ps_status s = read_model(g, &sp, err, errlen);
    if (!s) s = read_vocab(g, &sp, &scores, &types, err, errlen);
    if (!s) s = read_rest(g, &sp, err, errlen);
    if (s == PS_ERR_NOMEM) ps_errf(err, errlen, s, "out of memory reading the tokenizer");
    if (!s) s = ps_tok_create_spec(&sp, out, err, errlen);
    free(scores);
    free(types);
    return s;
}

ps_status ps_tok_create_from_file(const char *path, ps_tok **out, char *err, size_t errlen) {
    ps_gguf *g = NULL;
    *out = NULL;
    ps_status s = ps_gguf_open(path, &g, err, errlen);
    if (s) return s;
    s = ps_tok_create(g, out, err, errlen);
    ps_gguf_close(g);
    return s;
}
