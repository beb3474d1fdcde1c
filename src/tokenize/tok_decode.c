/* tok_decode.c - ids -> text: the piece of every token (built once), decode, streaming.
 *
 * Pieces are decoded when the tokenizer is created (SPM: U+2581 -> ' ', <0xXX> -> the byte;
 * BPE: byte-level characters -> bytes; control and unknown tokens, and BPE user-defined ones:
 * their raw text), so decoding is a copy per token and allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

// ---- building the pieces

/* Code point of the UTF-8 character at s[0..n) and its length in *len; -1 when invalid. */
static long utf8_decode(const unsigned char *s, size_t n, size_t *len) {
    size_t l = s[0] < 0x80 ? 1 : s[0] < 0xC2 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF5 ? 4 : 0;
    if (!l || l > n) return -1;
    long cp = l == 1 ? s[0] : s[0] & (0x7F >> l);
    for (size_t i = 1; i < l; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *len = l;
    return cp;
}

/* SPM normal piece: the text with every U+2581 made a space. Returns the length written. */
static size_t spm_piece(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            out[k++] = ' ';
            i += 3;
        } else {
            out[k++] = s[i++];
        }
    }
    return k;
}

/* BPE normal piece: byte-level characters back to bytes; anything else is kept as it is. */
static size_t bpe_piece(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t l = 1;
        long cp = utf8_decode((const unsigned char *)s + i, n - i, &l);
        int b = cp >= 0 ? ps_tok_bpe_cp_byte((uint32_t)cp) : -1;
        if (b >= 0)
            out[k++] = (char)b;
        else {
            if (cp < 0) l = 1;
            memcpy(out + k, s + i, l);
            k += l;
        }
        i += l;
    }
    return k;
}

/* The piece of token id into out (never longer than its raw text). */
static size_t make_piece(const ps_tok *t, int32_t id, char *out) {
    size_t n;
    const char *s = tok_text(t, id, &n);
    switch (t->types[id]) {
    case PS_TOK_TYPE_CONTROL:
    case PS_TOK_TYPE_UNKNOWN: memcpy(out, s, n); return n;
    case PS_TOK_TYPE_USER_DEFINED: /* SPM: like a normal piece (sentencepiece); BPE: raw (HF added token) */
        if (t->kind == PS_TOK_SPM) break;
        memcpy(out, s, n);
        return n;
    case PS_TOK_TYPE_BYTE:
        if (t->kind == PS_TOK_SPM) { /* checked to be <0xXX> when loading */
            for (int b = 0; b < 256; b++)
                if (t->byte_tok[b] == id) {
                    out[0] = (char)b;
                    return 1;
                }
        }
        break;
    default: break;
    }
    return t->kind == PS_TOK_SPM ? spm_piece(s, n, out) : bpe_piece(s, n, out);
}

ps_status ps_tok_build_pieces(ps_tok *t, char *err, size_t errlen) {
    size_t total = t->text_off[t->n_vocab];
    t->piece = ps_malloc(total ? total : 1);
    t->piece_off = ps_malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->piece || !t->piece_off) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory building pieces");
    uint32_t off = 0;
    t->max_piece = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = off;
        size_t n = make_piece(t, i, t->piece + off);
        if (n > t->max_piece) t->max_piece = (uint32_t)n;
        off += (uint32_t)n;
    }
    t->piece_off[t->n_vocab] = off;
    return PS_OK;
}

// ---- pieces and decode

/* True when the token renders as nothing unless PS_TOK_DECODE_SPECIAL is given. */
static bool hidden(const ps_tok *t, int32_t id, unsigned flags) {
    uint8_t ty = t->types[id];
    return !(flags & PS_TOK_DECODE_SPECIAL) && (ty == PS_TOK_TYPE_CONTROL || ty == PS_TOK_TYPE_UNKNOWN);
}

ps_status ps_tok_piece(const ps_tok *t, int32_t id, unsigned flags, const char **data, size_t *len) {
    *data = "";
    *len = 0;
    if (id < 0 || id >= t->n_vocab) return PS_ERR_ARG;
    if (hidden(t, id, flags)) return PS_OK;
    *data = t->piece + t->piece_off[id];
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return PS_OK;
}

/* The piece of id as the text's first word would show it: *strip (still armed) drops one
 * leading space of the first non-control token's piece, then disarms. */
static void piece_at(const ps_tok *t, int32_t id, unsigned flags, bool *strip, const char **p, size_t *n) {
    ps_tok_piece(t, id, flags, p, n);
    if (!*strip || t->types[id] == PS_TOK_TYPE_CONTROL) return;
    *strip = false;
    uint8_t ty = t->types[id];
    bool worded = ty == PS_TOK_TYPE_NORMAL || ty == PS_TOK_TYPE_UNUSED || ty == PS_TOK_TYPE_USER_DEFINED;
    if (worded && *n && (*p)[0] == ' ') {
        (*p)++;
        (*n)--;
    }
}

ps_status ps_tok_decode(const ps_tok *t, const int32_t *ids, size_t n, unsigned flags, char *out, size_t cap,
                        size_t *n_out, char *err, size_t errlen) {
    bool strip = (flags & PS_TOK_DECODE_STRIP_SPACE) && t->kind == PS_TOK_SPM && t->add_space_prefix;
    size_t k = 0;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return ps_errf(err, errlen, PS_ERR_ARG, "token id %d at position %zu is out of range (%d tokens)",
                           (int)ids[i], i, (int)t->n_vocab);
        const char *p;
        size_t len;
        piece_at(t, ids[i], flags, &strip, &p, &len);
        if (k < cap) memcpy(out + k, p, len < cap - k ? len : cap - k);
        k += len;
    }
    *n_out = k;
    if (k > cap) return ps_errf(err, errlen, PS_ERR_RANGE, "%zu bytes of text do not fit in a buffer of %zu", k, cap);
    return PS_OK;
}

// ---- streaming

struct ps_tok_stream {
    const ps_tok *t;
    unsigned flags;
    bool strip; /* the leading-space rule is still armed */
    unsigned char held[4];
    size_t n_held; /* bytes of an incomplete character held back, <= 3 */
    char *buf;     /* (max_piece + 4) what the last call handed out */
};

ps_status ps_tok_stream_create(const ps_tok *t, unsigned flags, ps_tok_stream **out) {
    *out = NULL;
    ps_tok_stream *s = ps_calloc(1, sizeof *s);
    if (!s || !(s->buf = ps_malloc(t->max_piece + 4))) {
        free(s);
        return PS_ERR_NOMEM;
    }
    s->t = t;
    s->flags = flags;
    ps_tok_stream_reset(s);
    *out = s;
    return PS_OK;
}

void ps_tok_stream_free(ps_tok_stream *s) {
    if (!s) return;
    free(s->buf);
    free(s);
}

void ps_tok_stream_reset(ps_tok_stream *s) {
    s->n_held = 0;
    s->strip = (s->flags & PS_TOK_DECODE_STRIP_SPACE) && s->t->kind == PS_TOK_SPM && s->t->add_space_prefix;
}

/* Length of the prefix of b[0..n) that does not end inside a UTF-8 character which later
 * bytes could still complete (structurally: a lead byte followed by too few continuations). */
static size_t complete_prefix(const unsigned char *b, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 3 && (b[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0) return n;
    unsigned char lead = b[i - 1];
    size_t need = lead < 0xC2 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF5 ? 4 : 1;
    return need > 1 && n - (i - 1) < need ? i - 1 : n;
}

ps_status ps_tok_stream_push(ps_tok_stream *s, int32_t id, const char **text, size_t *len) {
    *text = s->buf;
    *len = 0;
    if (id < 0 || id >= s->t->n_vocab) return PS_ERR_ARG;
    const char *p;
    size_t n;
    piece_at(s->t, id, s->flags, &s->strip, &p, &n);
    memcpy(s->buf, s->held, s->n_held);
    memcpy(s->buf + s->n_held, p, n);
    size_t total = s->n_held + n;
    size_t k = complete_prefix((const unsigned char *)s->buf, total);
    s->n_held = total - k;
    memcpy(s->held, s->buf + k, s->n_held);
    *len = k;
    return PS_OK;
}

void ps_tok_stream_flush(ps_tok_stream *s, const char **text, size_t *len) {
    memcpy(s->buf, s->held, s->n_held);
    *text = s->buf;
    *len = s->n_held;
    s->n_held = 0;
}
