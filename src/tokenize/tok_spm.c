/* tok_spm.c - SentencePiece-style BPE (tokenizer.ggml.model = "llama").
 *
 * The algorithm of sentencepiece's bpe_model.cc (and llama.cpp's llm_tokenizer_spm):
 *   1. optional "▁" prefix, every ' ' becomes "▁" (U+2581);
 *   2. one symbol per UTF-8 character (a byte that starts no valid character is a symbol alone),
 *      except that a user-defined piece found in the escaped text (longest first) is one frozen
 *      symbol, as sentencepiece's PrefixMatcher does;
 *   3. repeatedly merge the adjacent pair of unfrozen symbols whose concatenation is a normal,
 *      user-defined or unused vocabulary piece of highest score (leftmost on ties), with a
 *      max-heap and lazy invalidation;
 *   4. each final symbol: its token; an unused piece is split back into the two pieces it was
 *      merged from (sentencepiece's resegmentation); a piece outside the vocabulary becomes its
 *      bytes' <0xXX> tokens (byte fallback) or, without byte tokens, the unknown token. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct {
    uint32_t start; /* offset in the escaped text */
    uint32_t n;     /* length in bytes; 0: merged away */
    int32_t prev, next;
    bool frozen; /* a user-defined piece: never merged */
} spm_sym;

typedef struct {
    float score;         /* higher first */
    int32_t left, right; /* symbol indices; lower left first on equal scores */
    uint32_t size;       /* bytes of the pair when pushed (stale when it changed) */
} spm_cand;

/* Remembered merge of an unused piece: text [start, start + n) came from a left part of left_n. */
typedef struct {
    uint32_t start, n, left_n;
} spm_rev;

typedef struct {
    const ps_tok *t;
    tok_out *o;
    char *text; /* escaped text */
    spm_sym *sym;
    spm_cand *heap; /* capacity 3 * symbols: each merge pushes at most two */
    size_t heap_n;
    spm_rev *rev; /* open addressing on text, only when the vocabulary has unused pieces */
    uint32_t rev_mask;
} spm_ctx;

// ---- text preparation

/* Length of the valid UTF-8 character at s[0..n), or 1 when s does not start one. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    size_t len = s[0] < 0x80 ? 1 : s[0] < 0xC2 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF5 ? 4 : 0;
    if (len <= 1 || len > n) return 1;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 1;
    return len;
}

/* Writes the escaped text into c->text and returns its length. */
static size_t escape(spm_ctx *c, const char *s, size_t len, bool space_prefix) {
    size_t n = 0;
    if (space_prefix) {
        memcpy(c->text, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(c->text + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            c->text[n++] = s[i];
        }
    }
    return n;
}

/* Length of the longest user-defined piece starting at s[0..n), or 0. */
static size_t match_user(const ps_tok *t, const char *s, size_t n) {
    unsigned char b = (unsigned char)s[0];
    for (uint32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
        int32_t id = t->special[k];
        if (t->types[id] != PS_TOK_TYPE_USER_DEFINED) continue;
        size_t len;
        const char *txt = tok_text(t, id, &len);
        if (len <= n && memcmp(txt, s, len) == 0) return len;
    }
    return 0;
}

/* One symbol per character or user-defined piece; returns the symbol count. */
static int32_t make_symbols(spm_ctx *c, size_t n) {
    int32_t k = 0;
    for (size_t i = 0; i < n; k++) {
        size_t l = c->t->n_user ? match_user(c->t, c->text + i, n - i) : 0;
        bool frozen = l > 0;
        if (!l) l = utf8_char_len((const unsigned char *)c->text + i, n - i);
        c->sym[k] = (spm_sym){(uint32_t)i, (uint32_t)l, k - 1, i + l < n ? k + 1 : -1, frozen};
        i += l;
    }
    return k;
}

// ---- the heap

/* Heap order: higher score first, then the leftmost pair (sentencepiece's comparator). */
static bool cand_before(const spm_cand *a, const spm_cand *b) {
    return a->score != b->score ? a->score > b->score : a->left < b->left;
}

/* Adds x to the heap (capacity is reserved up front: see spm_ctx). */
static void heap_push(spm_ctx *c, spm_cand x) {
    size_t i = c->heap_n++;
    while (i > 0 && cand_before(&x, &c->heap[(i - 1) / 2])) {
        c->heap[i] = c->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    c->heap[i] = x;
}

/* Removes and returns the best candidate; the heap must not be empty. */
static spm_cand heap_pop(spm_ctx *c) {
    spm_cand top = c->heap[0], x = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && cand_before(&c->heap[k + 1], &c->heap[k])) k++;
        if (!cand_before(&c->heap[k], &x)) break;
        c->heap[i] = c->heap[k];
        i = k;
    }
    if (n) c->heap[i] = x;
    return top;
}

// ---- resegmentation memory (unused pieces)

/* Slot of text [start, start + n) in the rev table (an empty one when absent). */
static spm_rev *rev_slot(spm_ctx *c, uint32_t start, uint32_t n) {
    uint32_t i = (uint32_t)ps_tok_hash_bytes(c->text + start, n) & c->rev_mask;
    for (;; i = (i + 1) & c->rev_mask) {
        spm_rev *r = &c->rev[i];
        if (r->n == 0 || (r->n == n && memcmp(c->text + r->start, c->text + start, n) == 0)) return r;
    }
}

// ---- merging

/* Pushes the pair (left, right) when their concatenation is a mergeable piece. */
static void try_pair(spm_ctx *c, int32_t left, int32_t right) {
    if (left < 0 || right < 0 || c->sym[left].frozen || c->sym[right].frozen) return;
    const ps_tok *t = c->t;
    uint32_t n = c->sym[left].n + c->sym[right].n;
    int32_t id = ps_tok_strmap_get(&t->vocab, t, c->text + c->sym[left].start, n);
    if (id < 0) return;
    uint8_t ty = t->types[id];
    if (ty != PS_TOK_TYPE_NORMAL && ty != PS_TOK_TYPE_USER_DEFINED && ty != PS_TOK_TYPE_UNUSED) return;
    heap_push(c, (spm_cand){t->scores[id], left, right, n});
    if (ty == PS_TOK_TYPE_UNUSED && c->rev) /* remembered as sentencepiece does: last push wins */
        *rev_slot(c, c->sym[left].start, n) = (spm_rev){c->sym[left].start, n, c->sym[left].n};
}

/* Runs the merges to completion. */
static void merge_all(spm_ctx *c, int32_t n_sym) {
    for (int32_t i = 1; i < n_sym; i++) try_pair(c, i - 1, i);
    while (c->heap_n) {
        spm_cand x = heap_pop(c);
        spm_sym *l = &c->sym[x.left], *r = &c->sym[x.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != x.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = x.left;
        try_pair(c, l->prev, x.left);
        try_pair(c, x.left, l->next);
    }
}

/* Emits the tokens of text [start, start + n). */
static void resegment(spm_ctx *c, uint32_t start, uint32_t n) {
    const ps_tok *t = c->t;
    int32_t id = ps_tok_strmap_get(&t->vocab, t, c->text + start, n);
    if (id >= 0 && t->types[id] == PS_TOK_TYPE_UNUSED && c->rev) {
        spm_rev *r = rev_slot(c, start, n);
        if (r->n) {
            uint32_t ln = r->left_n;
            resegment(c, start, ln);
            resegment(c, start + ln, n - ln);
            return;
        }
    }
    if (id >= 0)
        tok_emit(c->o, id);
    else if (!t->byte_fallback)
        tok_emit(c->o, t->unk);
    else
        for (uint32_t i = 0; i < n; i++) tok_emit(c->o, t->byte_tok[(unsigned char)c->text[start + i]]);
}

// ---- entry point

/* Allocates the scratch of one call for an escaped text of at most n bytes. */
static bool ctx_alloc(spm_ctx *c, size_t n) {
    c->text = ps_malloc(n);
    c->sym = ps_malloc(n * sizeof *c->sym);
    c->heap = ps_malloc(3 * n * sizeof *c->heap);
    if (c->t->has_unused) {
        size_t cap = 16;
        while (cap < 6 * n) cap *= 2;
        c->rev = cap <= (1u << 31) ? ps_calloc(cap, sizeof *c->rev) : NULL;
        c->rev_mask = (uint32_t)(cap - 1);
        if (!c->rev) return false;
    }
    return c->text && c->sym && c->heap;
}

ps_status ps_tok_spm_encode(const ps_tok *t, const char *s, size_t len, bool space_prefix, tok_out *o, char *err,
                            size_t errlen) {
    if (!len) return PS_OK;
    size_t max = 3 * len + 3;
    if (max >= UINT32_MAX / 4)
        return ps_errf(err, errlen, PS_ERR_RANGE, "text of %zu bytes is too long to encode", len);
    spm_ctx c = {.t = t, .o = o};
    ps_status st = PS_OK;
    if (ctx_alloc(&c, max)) {
        size_t n = escape(&c, s, len, space_prefix);
        int32_t n_sym = make_symbols(&c, n);
        merge_all(&c, n_sym);
        for (int32_t i = 0; i >= 0; i = c.sym[i].next) resegment(&c, c.sym[i].start, c.sym[i].n);
    } else {
        st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory encoding %zu bytes", len);
    }
    free(c.text);
    free(c.sym);
    free(c.heap);
    free(c.rev);
    return st;
}
