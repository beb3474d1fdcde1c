/* tok_bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2").
 *
 * Encoding one fragment of plain text:
 *   1. pre-split: the regexes of the model's pre-tokenizer, applied in turn, each to every piece
 *      the previous one produced (matches and the text between matches both become pieces), as
 *      llama.cpp's unicode_regex_split and HF's Split(behavior = Isolated) do;
 *   2. each piece's bytes become their byte-level tokens (GPT-2's byte -> code point table);
 *   3. merges: repeatedly merge the adjacent pair of lowest rank (leftmost on ties), with a
 *      binary heap and lazy invalidation, as HF tokenizers' Word::merge_all does.
 * The regexes are the ones in HF's tokenizer.json files, which PCRE2 runs as written (llama.cpp
 * had to rewrite (?i:...) for std::regex). One adaptation: PCRE2's \s (with UCP) also matches
 * U+180E and misses nothing else, while Oniguruma's (HF) is exactly Unicode White_Space, so \s
 * is spelled out as the White_Space class below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

// ---- the byte-level alphabet

/* Bytes GPT-2 shows as themselves: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. */
static bool byte_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t ps_tok_bpe_byte_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    if (b <= 0x20) return 256u + b;               /* 0x00..0x20 -> 256..288 */
    if (b <= 0xA0) return 256u + 33 + (b - 0x7F); /* 0x7F..0xA0 -> 289..322 */
    return 256u + 67;                             /* 0xAD -> 323 */
}

int ps_tok_bpe_cp_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(0x7F + cp - 256 - 33);
    return cp == 256 + 67 ? 0xAD : -1;
}

// ---- pre-tokenizers

/* Unicode White_Space, which is what \s means in Oniguruma (HF) and llama.cpp. */
#define WS             "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"
#define RE_GPT2        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_LLAMA3_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"

typedef struct {
    const char *names;             /* NUL-separated, double-NUL-terminated */
    const char *re[TOK_MAX_REGEX]; /* applied in order; NULL ends */
    bool ignore_merges;            /* whole-token words skip merging (llama.cpp's LLAMA3) */
    bool add_bos;                  /* llama.cpp's default for add_bos_token */
} pre_def;

static const pre_def pre_defs[] = {
    {"llama3\0llama-v3\0llama-bpe\0falcon3\0falcon-h1\0pixtral\0",
     {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL},
     true,
     true},
    {"smaug-bpe\0dbrx\0", {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL}, false, false},
    {"qwen2\0deepseek-r1-qwen\0megrez\0stablelm2\0", {RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL}, false, false},
    {"smollm\0starcoder\0refact\0command-r\0codeshell\0exaone\0minerva-7b\0", {"\\p{N}", RE_GPT2}, false, false},
    {"gpt-2\0gpt2\0phi-2\0mpt\0olmo\0jais\0", {RE_GPT2}, false, false},
    {"falcon\0", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {"default\0", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
};

/* The definition whose name list holds pre, or NULL. */
static const pre_def *find_pre(ps_gguf_str pre) {
    for (size_t i = 0; i < PS_ARRAY_LEN(pre_defs); i++)
        for (const char *n = pre_defs[i].names; *n; n += strlen(n) + 1)
            if (pre.len == strlen(n) && memcmp(pre.data, n, pre.len) == 0) return &pre_defs[i];
    return NULL;
}

/* Compiles one pattern (UTF, Unicode properties, invalid UTF-8 tolerated) and JIT-compiles it
 * when the platform allows (the interpreter is used otherwise). */
static ps_status compile_re(const char *pat, pcre2_code **out, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec,
                         &eo, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ps_errf(err, errlen, PS_ERR_INTERNAL, "pre-tokenizer regex does not compile at %zu: %s", (size_t)eo,
                       (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return PS_OK;
}

ps_status ps_tok_bpe_setup(ps_tok *t, ps_gguf_str pre, bool *default_add_bos, char *err, size_t errlen) {
    ps_gguf_str def = {7, "default"};
    const pre_def *d = find_pre(pre.len ? pre : def);
    if (!d)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "unsupported pre-tokenizer '%.*s' (tokenizer.ggml.pre; supported: llama3, llama-bpe, qwen2, "
                       "smollm, gpt-2, starcoder, falcon, default and their aliases)",
                       (int)(pre.len > 40 ? 40 : pre.len), pre.data);
    ps_gguf_str name = pre.len ? pre : def;
    snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)name.len, name.data);
    for (int i = 0; i < TOK_MAX_REGEX && d->re[i]; i++) {
        ps_status s = compile_re(d->re[i], &t->re[i], err, errlen);
        if (s) return s;
        t->n_re = i + 1;
    }
    t->ignore_merges = d->ignore_merges;
    *default_add_bos = d->add_bos;
    return PS_OK;
}

// ---- merging one word

typedef struct {
    int32_t id;   /* token id; -1: byte with no token; -2: merged away */
    int32_t prev; /* index of the previous live symbol, -1 at the start */
    int32_t next; /* index of the next live symbol, -1 at the end */
} bpe_sym;

typedef struct {
    int32_t rank;        /* merge rank: lower first */
    int32_t pos;         /* left symbol: lower first on equal ranks */
    int32_t left, right; /* the ids it was made for (stale when they changed) */
} bpe_cand;

/* Scratch for one encode call: grown as needed, freed at the end of the call. */
typedef struct {
    const ps_tok *t;
    tok_out *o;
    pcre2_match_data *md;
    bpe_sym *sym;
    size_t sym_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
    char *map; /* ignore_merges: the word in byte-level characters */
    size_t map_cap;
} bpe_ctx;

/* Grows *buf to hold n elements of size sz. */
static bool grow(void **buf, size_t *cap, size_t n, size_t sz) {
    if (n <= *cap) return true;
    size_t nc = *cap ? *cap : 64;
    while (nc < n) nc *= 2;
    void *nb = ps_realloc(*buf, nc * sz);
    if (!nb) return false;
    *buf = nb;
    *cap = nc;
    return true;
}

/* Heap order: lower rank first, then the leftmost pair (HF's Merge ordering). */
static bool cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

/* Pushes the candidate for the pair starting at symbol pos, if that pair has a merge. */
static bool heap_push_pair(bpe_ctx *c, int32_t pos) {
    int32_t nx = c->sym[pos].next;
    if (nx < 0 || c->sym[pos].id < 0 || c->sym[nx].id < 0) return true;
    const tok_merge *m = ps_tok_mergemap_get(&c->t->merges, c->sym[pos].id, c->sym[nx].id);
    if (!m) return true;
    if (!grow((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap)) return false;
    bpe_cand x = {m->rank, pos, c->sym[pos].id, c->sym[nx].id};
    size_t i = c->heap_n++;
    while (i > 0 && cand_less(&x, &c->heap[(i - 1) / 2])) {
        c->heap[i] = c->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    c->heap[i] = x;
    return true;
}

/* Removes the smallest candidate into *out. */
static void heap_pop(bpe_ctx *c, bpe_cand *out) {
    *out = c->heap[0];
    bpe_cand x = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && cand_less(&c->heap[k + 1], &c->heap[k])) k++;
        if (!cand_less(&c->heap[k], &x)) break;
        c->heap[i] = c->heap[k];
        i = k;
    }
    if (n) c->heap[i] = x;
}

/* Applies candidate x if it is still current: its left symbol absorbs the right one. */
static bool apply_cand(bpe_ctx *c, const bpe_cand *x) {
    bpe_sym *l = &c->sym[x->pos];
    if (l->id != x->left || l->next < 0 || c->sym[l->next].id != x->right) return true; /* stale */
    const tok_merge *m = ps_tok_mergemap_get(&c->t->merges, x->left, x->right);
    bpe_sym *r = &c->sym[l->next];
    l->id = m->merged;
    l->next = r->next;
    if (r->next >= 0) c->sym[r->next].prev = x->pos;
    r->id = -2;
    return (l->prev < 0 || heap_push_pair(c, l->prev)) && heap_push_pair(c, x->pos);
}

/* Writes the word's bytes as byte-level characters into c->map; returns the length or -1. */
static long map_word(bpe_ctx *c, const char *s, size_t len) {
    if (!grow((void **)&c->map, &c->map_cap, 2 * len, 1)) return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t cp = ps_tok_bpe_byte_cp((uint8_t)s[i]);
        if (cp < 0x80)
            c->map[n++] = (char)cp;
        else {
            c->map[n++] = (char)(0xC0 | (cp >> 6));
            c->map[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return (long)n;
}

/* Encodes one pre-split word. */
static ps_status bpe_word(bpe_ctx *c, const char *s, size_t len) {
    const ps_tok *t = c->t;
    if (t->ignore_merges && len > 1) {
        long n = map_word(c, s, len);
        if (n < 0) return PS_ERR_NOMEM;
        int32_t id = ps_tok_strmap_get(&t->vocab, t, c->map, (size_t)n);
        if (id >= 0) {
            tok_emit(c->o, id);
            return PS_OK;
        }
    }
    if (!grow((void **)&c->sym, &c->sym_cap, len, sizeof *c->sym)) return PS_ERR_NOMEM;
    c->heap_n = 0;
    for (size_t i = 0; i < len; i++)
        c->sym[i] = (bpe_sym){t->byte_tok[(uint8_t)s[i]], (int32_t)i - 1, i + 1 < len ? (int32_t)i + 1 : -1};
    for (size_t i = 0; i + 1 < len; i++)
        if (!heap_push_pair(c, (int32_t)i)) return PS_ERR_NOMEM;
    while (c->heap_n) {
        bpe_cand x;
        heap_pop(c, &x);
        if (!apply_cand(c, &x)) return PS_ERR_NOMEM;
    }
    for (int32_t i = 0; i >= 0; i = c->sym[i].next) {
        int32_t id = c->sym[i].id >= 0 ? c->sym[i].id : t->unk; /* a byte the vocabulary lacks */
        if (id >= 0) tok_emit(c->o, id);
    }
    return PS_OK;
}

// ---- pre-splitting

/* Splits s[0..len) with regex `stage` and hands every piece to the next stage (the last stage
 * hands words to bpe_word). Text between matches is a piece too. */
static ps_status split(bpe_ctx *c, int stage, const char *s, size_t len) {
    if (stage == c->t->n_re) return bpe_word(c, s, len);
    size_t pos = 0, gap = 0;
    ps_status st = PS_OK;
    while (pos < len && st == PS_OK) {
        int rc = pcre2_match(c->t->re[stage], (PCRE2_SPTR)s, len, pos, 0, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return PS_ERR_INTERNAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match (none of our patterns has one): step over a character */
            for (pos = ms + 1; pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80; pos++) {}
            continue;
        }
        if (ms > gap) st = split(c, stage + 1, s + gap, ms - gap);
        if (st == PS_OK) st = split(c, stage + 1, s + ms, me - ms);
        gap = pos = me;
    }
    if (st == PS_OK && gap < len) st = split(c, stage + 1, s + gap, len - gap);
    return st;
}

ps_status ps_tok_bpe_encode(const ps_tok *t, const char *s, size_t len, tok_out *o, char *err, size_t errlen) {
    if (!len) return PS_OK;
    bpe_ctx c = {.t = t, .o = o};
    c.md = pcre2_match_data_create(4, NULL);
    ps_status st = c.md ? split(&c, 0, s, len) : PS_ERR_NOMEM;
    pcre2_match_data_free(c.md);
    free(c.sym);
    free(c.heap);
    free(c.map);
    if (st == PS_ERR_NOMEM) return ps_errf(err, errlen, st, "out of memory encoding %zu bytes", len);
    if (st) return ps_errf(err, errlen, st, "pre-tokenizer regex failed to match");
    return PS_OK;
}
