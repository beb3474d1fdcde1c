/* tok_load.c - building a tokenizer from a ps_tok_spec, with every value checked.
 *
 * ps_tok_create_spec copies the vocabulary into two arenas (raw texts, decoded pieces), builds
 * the hash tables, resolves byte tokens, merges, special tokens and the pre-tokenizer, and
 * unwinds through one `goto fail` on any error. The GGUF front end is tok_gguf.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

// ---- small helpers

ps_tok_spec ps_tok_spec_init(void) {
    ps_tok_spec s;
    memset(&s, 0, sizeof s);
    s.bos_id = s.eos_id = s.unk_id = s.pad_id = s.eot_id = -1;
    s.add_bos = s.add_eos = s.add_space_prefix = -1;
    return s;
}

/* At most 40 bytes of s for error messages, as a printf precision. */
static int shown(uint64_t len) { return len > 40 ? 40 : (int)len; }

/* Case-sensitive comparison of a GGUF string and a C string. */
static bool str_is(ps_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

// ---- vocabulary: texts, scores, types, lookup table

/* Copies the token texts into one arena with offsets. */
static ps_status copy_texts(ps_tok *t, const ps_tok_spec *sp, char *err, size_t errlen) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < sp->n_tokens; i++) {
        if (sp->tokens[i].len && !sp->tokens[i].data)
            return ps_errf(err, errlen, PS_ERR_ARG, "token %u has no text pointer", i);
        total += sp->tokens[i].len;
    }
    if (total >= UINT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens: %llu bytes of text is too much",
                       (unsigned long long)total);
    t->text = ps_malloc(total ? total : 1);
    t->text_off = ps_malloc((sp->n_tokens + 1ULL) * sizeof *t->text_off);
    if (!t->text || !t->text_off) return PS_ERR_NOMEM;
    uint32_t off = 0;
    for (uint32_t i = 0; i < sp->n_tokens; i++) {
        t->text_off[i] = off;
        if (sp->tokens[i].len) memcpy(t->text + off, sp->tokens[i].data, sp->tokens[i].len);
        off += (uint32_t)sp->tokens[i].len;
    }
    t->text_off[sp->n_tokens] = off;
    return PS_OK;
}

/* Copies scores (no NaN) and types (0..6, 0 read as normal). */
static ps_status copy_scores_types(ps_tok *t, const ps_tok_spec *sp, char *err, size_t errlen) {
    t->scores = ps_calloc(sp->n_tokens, sizeof *t->scores);
    t->types = ps_malloc(sp->n_tokens);
    if (!t->scores || !t->types) return PS_ERR_NOMEM;
    for (uint32_t i = 0; i < sp->n_tokens; i++) {
        if (sp->scores && isnan(sp->scores[i]))
            return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.scores[%u] is NaN", i);
        if (sp->scores) t->scores[i] = sp->scores[i];
        int32_t ty = sp->types ? sp->types[i] : PS_TOK_TYPE_NORMAL;
        if (ty < 0 || ty >= PS_TOK_TYPE_COUNT)
            return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.token_type[%u] = %d is not a token type (0..6)",
                           i, (int)ty);
        t->types[i] = (uint8_t)(ty == PS_TOK_TYPE_UNDEFINED ? PS_TOK_TYPE_NORMAL : ty);
        if (ty == PS_TOK_TYPE_UNUSED) t->has_unused = true;
    }
    return PS_OK;
}

/* Fills the text -> id table; two tokens with one text are an error (llama.cpp refuses them
 * too). Empty texts are kept out of the table: no text can ever produce them. */
static ps_status build_vocab_map(ps_tok *t, char *err, size_t errlen) {
    if (ps_tok_strmap_init(&t->vocab, (uint32_t)t->n_vocab) != PS_OK) return PS_ERR_NOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t len;
        const char *s = tok_text(t, i, &len);
        if (!len) continue;
        int32_t dup = ps_tok_strmap_put(&t->vocab, t, i);
        if (dup >= 0)
            return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens[%d] '%.*s' repeats token %d", (int)i,
                           shown(len), s, (int)dup);
    }
    return PS_OK;
}

// ---- special ids and flags

/* Checks one special-token id: -1 (none) or in range. */
static ps_status check_id(const ps_tok *t, const char *key, int64_t id, int32_t *out, char *err, size_t errlen) {
    if (id < -1 || id >= t->n_vocab)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.%s = %lld is out of range (%d tokens)", key,
                       (long long)id, (int)t->n_vocab);
    *out = (int32_t)id;
    return PS_OK;
}

/* Special ids, then the add_bos / add_eos / add_space_prefix flags with the kind's defaults. */
static ps_status set_specials(ps_tok *t, const ps_tok_spec *sp, bool default_bos, char *err, size_t errlen) {
    ps_status s;
    if ((s = check_id(t, "bos_token_id", sp->bos_id, &t->bos, err, errlen)) ||
        (s = check_id(t, "eos_token_id", sp->eos_id, &t->eos, err, errlen)) ||
        (s = check_id(t, "eot_token_id", sp->eot_id, &t->eot, err, errlen)) ||
        (s = check_id(t, "unknown_token_id", sp->unk_id, &t->unk, err, errlen)) ||
        (s = check_id(t, "padding_token_id", sp->pad_id, &t->pad, err, errlen)))
        return s;
    bool spm = t->kind == PS_TOK_SPM;
    t->add_bos = sp->add_bos < 0 ? default_bos : sp->add_bos != 0;
    t->add_eos = sp->add_eos < 0 ? false : sp->add_eos != 0;
    t->add_space_prefix = sp->add_space_prefix < 0 ? spm : sp->add_space_prefix != 0;
    if (t->add_bos && t->bos < 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "the tokenizer adds BOS but tokenizer.ggml.bos_token_id is not set");
    if (t->add_eos && t->eos < 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "the tokenizer adds EOS but tokenizer.ggml.eos_token_id is not set");
    return PS_OK;
}

/* End-of-generation tokens: EOS, EOT and the texts llama.cpp recognises. */
static ps_status mark_eog(ps_tok *t) {
    static const char *const names[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>",
                                        "<end_of_turn>", "<|endoftext|>",   "<|eom_id|>",
                                        "<EOT>",         "<|end_of_text|>", "<end_of_utterance>"};
    t->eog = ps_calloc((size_t)t->n_vocab, 1);
    if (!t->eog) return PS_ERR_NOMEM;
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    for (size_t i = 0; i < PS_ARRAY_LEN(names); i++) {
        int32_t id = ps_tok_strmap_get(&t->vocab, t, names[i], strlen(names[i]));
        if (id >= 0) t->eog[id] = 1;
    }
    return PS_OK;
}

// ---- byte tokens

/* Value of a hex digit, or -1. */
static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* SPM: every byte-type token must read "<0xXX>"; byte_tok[XX] = its id. Text outside the
 * vocabulary needs either all 256 byte tokens or an unknown token. */
static ps_status spm_bytes(ps_tok *t, char *err, size_t errlen) {
    int missing = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->types[i] != PS_TOK_TYPE_BYTE) continue;
        size_t len;
        const char *s = tok_text(t, i, &len);
        int hi = len == 6 ? hexval(s[3]) : -1, lo = len == 6 ? hexval(s[4]) : -1;
        if (hi < 0 || lo < 0 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
            return ps_errf(err, errlen, PS_ERR_FORMAT, "byte token %d is '%.*s', not <0xXX>", (int)i, shown(len), s);
        t->byte_tok[hi * 16 + lo] = i;
    }
    for (int b = 0; b < 256; b++) missing += t->byte_tok[b] < 0;
    t->byte_fallback = missing == 0;
    if (missing && t->unk < 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "%d of the 256 byte tokens <0xXX> are missing and there is no unknown token", missing);
    return PS_OK;
}

/* UTF-8 encoding of code point cp (< 0x800 here) into buf; returns its length. */
static size_t utf8_put(char *buf, uint32_t cp) {
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    buf[0] = (char)(0xC0 | (cp >> 6));
    buf[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* BPE: byte_tok[b] = id of the token made of b's byte-level character (-1 when absent). */
static void bpe_bytes(ps_tok *t) {
    for (int b = 0; b < 256; b++) {
        char buf[4];
        size_t n = utf8_put(buf, ps_tok_bpe_byte_cp((uint8_t)b));
        t->byte_tok[b] = ps_tok_strmap_get(&t->vocab, t, buf, n);
    }
}

// ---- merges

/* Parses merge i "left right" into the ids of left, right and left+right. buf holds
 * left+right while it is looked up (grown as needed). */
static ps_status parse_merge(ps_tok *t, ps_gguf_str m, uint64_t i, char **buf, size_t *cap, char *err, size_t errlen) {
    const char *sp = m.len > 1 && m.data ? memchr(m.data + 1, ' ', m.len - 1) : NULL;
    if (!sp || sp + 1 == m.data + m.len)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s' is not two tokens and a space",
                       (unsigned long long)i, shown(m.len), m.data ? m.data : "");
    size_t ll = (size_t)(sp - m.data), rl = m.len - ll - 1;
    int32_t left = ps_tok_strmap_get(&t->vocab, t, m.data, ll);
    int32_t right = ps_tok_strmap_get(&t->vocab, t, sp + 1, rl);
    if (left < 0 || right < 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "tokenizer.ggml.merges[%llu] '%.*s' names a token not in the vocabulary", (unsigned long long)i,
                       shown(m.len), m.data);
    if (*cap < ll + rl) {
        char *nb = ps_realloc(*buf, ll + rl);
        if (!nb) return PS_ERR_NOMEM;
        *buf = nb;
        *cap = ll + rl;
    }
    memcpy(*buf, m.data, ll);
    memcpy(*buf + ll, sp + 1, rl);
    int32_t merged = ps_tok_strmap_get(&t->vocab, t, *buf, ll + rl);
    if (merged < 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "tokenizer.ggml.merges[%llu] '%.*s' makes '%.*s', which is not in the vocabulary",
                       (unsigned long long)i, shown(m.len), m.data, shown(ll + rl), *buf);
    ps_tok_mergemap_put(&t->merges, left, right, (int32_t)i, merged);
    return PS_OK;
}

/* All merges of a BPE vocabulary, rank = position. */
static ps_status build_merges(ps_tok *t, const ps_tok_spec *sp, char *err, size_t errlen) {
    if (!sp->n_merges || !sp->merges)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "gpt2 tokenizer without tokenizer.ggml.merges");
    if (sp->n_merges >= INT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.merges: %llu merges is too many",
                       (unsigned long long)sp->n_merges);
    if (ps_tok_mergemap_init(&t->merges, sp->n_merges) != PS_OK) return PS_ERR_NOMEM;
    char *buf = NULL;
    size_t cap = 0;
    ps_status s = PS_OK;
    for (uint64_t i = 0; i < sp->n_merges && s == PS_OK; i++)
        s = parse_merge(t, sp->merges[i], i, &buf, &cap, err, errlen);
    free(buf);
    return s;
}

// ---- special-token matcher

/* A special token while the matcher is sorted. */
typedef struct {
    uint32_t first; /* first byte of its text */
    uint32_t len;   /* length of its text */
    int32_t id;
} special_key;

/* Orders special tokens by first byte, then longest first, then id. */
static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* True for the types the special-token matcher looks for. */
static bool is_special_type(uint8_t ty) {
    return ty == PS_TOK_TYPE_CONTROL || ty == PS_TOK_TYPE_UNKNOWN || ty == PS_TOK_TYPE_USER_DEFINED;
}

/* Collects the non-empty control, unknown and user-defined tokens, grouped by first byte,
 * longest first in each group, so that the first match at a position is the longest. */
static ps_status build_special(ps_tok *t) {
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) n += is_special_type(t->types[i]) && t->text_off[i + 1] > t->text_off[i];
    special_key *keys = ps_malloc((size_t)(n ? n : 1) * sizeof *keys);
    t->special = ps_malloc((size_t)(n ? n : 1) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        return PS_ERR_NOMEM;
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint32_t len = t->text_off[i + 1] - t->text_off[i];
        if (is_special_type(t->types[i]) && len)
            keys[n++] = (special_key){(unsigned char)t->text[t->text_off[i]], len, i};
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    memset(t->special_start, 0, sizeof t->special_start);
    for (int32_t k = 0; k < n; k++) {
        t->special[k] = keys[k].id;
        t->n_user += t->types[keys[k].id] == PS_TOK_TYPE_USER_DEFINED;
        t->special_start[keys[k].first + 1]++;
    }
    for (int b = 0; b < 256; b++) t->special_start[b + 1] += t->special_start[b];
    free(keys);
    return PS_OK;
}

// ---- create / free

/* Kind from tokenizer.ggml.model; PS_ERR_UNSUPPORTED names anything else. */
static ps_status pick_kind(ps_tok *t, ps_gguf_str model, char *err, size_t errlen) {
    if (str_is(model, "llama"))
        t->kind = PS_TOK_SPM;
    else if (str_is(model, "gpt2"))
        t->kind = PS_TOK_BPE;
    else if (!model.len)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.model is empty");
    else
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "unsupported tokenizer '%.*s' (tokenizer.ggml.model; supported: llama, gpt2)", shown(model.len),
                       model.data);
    return PS_OK;
}

/* The checks and tables that depend on the kind. */
static ps_status build_kind(ps_tok *t, const ps_tok_spec *sp, char *err, size_t errlen) {
    ps_status s;
    bool default_bos = t->kind == PS_TOK_SPM;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    if (t->kind == PS_TOK_BPE) {
        if ((s = ps_tok_bpe_setup(t, sp->pre, &default_bos, err, errlen))) return s;
        if ((s = build_merges(t, sp, err, errlen))) return s;
        bpe_bytes(t);
    }
    if ((s = set_specials(t, sp, default_bos, err, errlen))) return s;
    if (t->kind == PS_TOK_SPM && (s = spm_bytes(t, err, errlen))) return s;
    return PS_OK;
}

ps_status ps_tok_create_spec(const ps_tok_spec *sp, ps_tok **out, char *err, size_t errlen) {
    *out = NULL;
    if (!sp || !sp->tokens || sp->n_tokens == 0)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens is missing or empty");
    if (sp->n_tokens >= INT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tokenizer.ggml.tokens: %u tokens is too many", sp->n_tokens);
    ps_tok *t = ps_calloc(1, sizeof *t);
    if (!t) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory creating the tokenizer");
    t->n_vocab = (int32_t)sp->n_tokens;
    ps_status s;
    if ((s = pick_kind(t, sp->model, err, errlen))) goto fail;
    if ((s = copy_texts(t, sp, err, errlen))) goto fail;
    if ((s = copy_scores_types(t, sp, err, errlen))) goto fail;
    if ((s = build_vocab_map(t, err, errlen))) goto fail;
    if ((s = build_kind(t, sp, err, errlen))) goto fail;
    if ((s = build_special(t))) goto fail;
    if ((s = mark_eog(t))) goto fail;
    if ((s = ps_tok_build_pieces(t, err, errlen))) goto fail;
    *out = t;
    return PS_OK;
fail:
    if (s == PS_ERR_NOMEM) ps_errf(err, errlen, s, "out of memory creating the tokenizer");
    ps_tok_free(t);
    return s;
}

void ps_tok_free(ps_tok *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    ps_tok_strmap_free(&t->vocab);
    ps_tok_mergemap_free(&t->merges);
    free(t->text);
    free(t->text_off);
    free(t->scores);
    free(t->types);
    free(t->piece);
    free(t->piece_off);
    free(t->eog);
    free(t->special);
    free(t);
}

// ---- accessors

ps_tok_kind ps_tok_get_kind(const ps_tok *t) { return t->kind; }
int32_t ps_tok_n_vocab(const ps_tok *t) { return t->n_vocab; }
int32_t ps_tok_bos(const ps_tok *t) { return t->bos; }
int32_t ps_tok_eos(const ps_tok *t) { return t->eos; }
int32_t ps_tok_eot(const ps_tok *t) { return t->eot; }
int32_t ps_tok_unk(const ps_tok *t) { return t->unk; }
int32_t ps_tok_pad(const ps_tok *t) { return t->pad; }
bool ps_tok_add_bos(const ps_tok *t) { return t->add_bos; }
bool ps_tok_add_eos(const ps_tok *t) { return t->add_eos; }
const char *ps_tok_pre_name(const ps_tok *t) { return t->pre_name; }

bool ps_tok_is_eog(const ps_tok *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }

ps_tok_type ps_tok_token_type(const ps_tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? (ps_tok_type)t->types[id] : PS_TOK_TYPE_COUNT;
}

const char *ps_tok_token_text(const ps_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    return tok_text(t, id, len);
}

int32_t ps_tok_find(const ps_tok *t, const char *text, size_t len) {
    return len ? ps_tok_strmap_get(&t->vocab, t, text, len) : -1;
}
