/* tok_encode.c - text -> ids: special tokens, BOS/EOS, and the kind's algorithm per fragment.
 *
 * The text is cut at special tokens (leftmost, longest first, as HF's added-vocabulary matcher
 * does); the plain fragments in between are encoded independently, like llama.cpp's
 * tokenizer_st_partition. Control and unknown tokens cut only with parse_special. User-defined
 * tokens always count: BPE cuts at them here (HF's non-special added tokens); SPM leaves them to
 * tok_spm.c, which matches them in the escaped text as sentencepiece does. For SPM a fragment at
 * the start of the text or right after a control token gets the space prefix (llama.cpp's rule).
 * ps_tok_encode_literal parses control tokens except within literal spans (a chat message's
 * content): the fragments between special tokens stay whole across a span's edges. */
#include <string.h>

#include "tok_internal.h"

/* The special token that starts s[0..len) (longest first), or -1. Control and unknown tokens
 * count only when they fit in the first ctl_max bytes (0: none; len: wherever parse_special
 * allows them); user-defined ones always, but only for BPE. */
static int32_t match_special(const ps_tok *t, const char *s, size_t len, size_t ctl_max, size_t *mlen) {
    unsigned char b = (unsigned char)s[0];
    for (uint32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
        int32_t id = t->special[k];
        bool user = t->types[id] == PS_TOK_TYPE_USER_DEFINED;
        size_t n;
        const char *txt = tok_text(t, id, &n);
        if (user ? t->kind == PS_TOK_SPM : n > ctl_max) continue;
        if (n <= len && memcmp(txt, s, n) == 0) {
            *mlen = n;
            return id;
        }
    }
    return -1;
}

/* Encodes plain text s[0..len); *after_special says whether it follows the start or a special
 * token (SPM space prefix) and is cleared when the fragment is not empty. */
static ps_status encode_fragment(const ps_tok *t, const char *s, size_t len, bool *after_special, tok_out *o, char *err,
                                 size_t errlen) {
    if (!len) return PS_OK;
    bool prefix = t->add_space_prefix && *after_special;
    *after_special = false;
    if (t->kind == PS_TOK_SPM) return ps_tok_spm_encode(t, s, len, prefix, o, err, errlen);
    return ps_tok_bpe_encode(t, s, len, o, err, errlen);
}

/* How many bytes from pos a control token may take: none inside a literal span, up to the next
 * span outside them (spans sorted; *next advances past those that end before pos). */
static size_t control_room(const ps_tok_span *lit, size_t n_lit, size_t *next, size_t pos, size_t len) {
    while (*next < n_lit && lit[*next].off + lit[*next].len <= pos) (*next)++;
    if (*next == n_lit) return len - pos;
    return lit[*next].off <= pos ? 0 : lit[*next].off - pos;
}

/* Cuts text at special tokens and encodes every piece into o. Control tokens are matched only
 * with parse_special, and never where they would overlap one of the n_lit literal spans. */
static ps_status encode_text(const ps_tok *t, const char *text, size_t len, bool parse_special, const ps_tok_span *lit,
                             size_t n_lit, tok_out *o, char *err, size_t errlen) {
    bool after_special = true;
    size_t frag = 0, next = 0;
    bool any_special = t->special_start[256] > 0;
    for (size_t pos = 0; any_special && pos < len;) {
        size_t mlen, room = parse_special ? control_room(lit, n_lit, &next, pos, len) : 0;
        int32_t id = match_special(t, text + pos, len - pos, room, &mlen);
        if (id < 0) {
            pos++;
            continue;
        }
        ps_status s = encode_fragment(t, text + frag, pos - frag, &after_special, o, err, errlen);
        if (s) return s;
        tok_emit(o, id);
        after_special = true;
        pos += mlen;
        frag = pos;
    }
    return encode_fragment(t, text + frag, len - frag, &after_special, o, err, errlen);
}

/* Both encoders: BOS/EOS around the text, and the ids' count checked against cap. */
static ps_status encode(const ps_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                        const ps_tok_span *lit, size_t n_lit, int32_t *ids, size_t cap, size_t *n_ids, char *err,
                        size_t errlen) {
    *n_ids = 0;
    if (!t || (!text && len) || (!ids && cap) || (!lit && n_lit))
        return ps_errf(err, errlen, PS_ERR_ARG, "ps_tok_encode: NULL tokenizer, text, span or id buffer");
    tok_out o = {ids, cap, 0};
    if (add_special && t->add_bos) tok_emit(&o, t->bos);
    ps_status s = encode_text(t, text, len, parse_special, lit, n_lit, &o, err, errlen);
    if (s) return s;
    if (add_special && t->add_eos) tok_emit(&o, t->eos);
    *n_ids = o.n;
    if (o.n > cap) return ps_errf(err, errlen, PS_ERR_RANGE, "%zu tokens do not fit in a buffer of %zu", o.n, cap);
    return PS_OK;
}

ps_status ps_tok_encode(const ps_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t *ids, size_t cap, size_t *n_ids, char *err, size_t errlen) {
    return encode(t, text, len, add_special, parse_special, NULL, 0, ids, cap, n_ids, err, errlen);
}

ps_status ps_tok_encode_literal(const ps_tok *t, const char *text, size_t len, bool add_special,
                                const ps_tok_span *literal, size_t n_literal, int32_t *ids, size_t cap, size_t *n_ids,
                                char *err, size_t errlen) {
    for (size_t i = 0; i < n_literal; i++)
        if (literal[i].off > len || literal[i].len > len - literal[i].off ||
            (i && literal[i].off < literal[i - 1].off + literal[i - 1].len))
            return ps_errf(err, errlen, PS_ERR_ARG, "literal span %zu is out of order or past the text", i);
    return encode(t, text, len, add_special, true, literal, n_literal, ids, cap, n_ids, err, errlen);
}
