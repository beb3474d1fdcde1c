/* tok_encode.c - text -> ids: special tokens, BOS/EOS, and the kind's algorithm per fragment.
 *
 * The text is cut at special tokens (leftmost, longest first, as HF's added-vocabulary matcher
 * does); the plain fragments in between are encoded independently, like llama.cpp's
 * tokenizer_st_partition. Control and unknown tokens cut only with parse_special. User-defined
 * tokens always count: BPE cuts at them here (HF's non-special added tokens); SPM leaves them to
 * tok_spm.c, which matches them in the escaped text as sentencepiece does. For SPM a fragment at
 * the start of the text or right after a control token gets the space prefix (llama.cpp's rule). */
#include <string.h>

#include "tok_internal.h"

/* The special token that starts s[0..len) (longest first), or -1. Control and unknown tokens
 * count only with parse_special; user-defined ones always, but only for BPE. */
static int32_t match_special(const ps_tok *t, const char *s, size_t len, bool parse_special, size_t *mlen) {
    unsigned char b = (unsigned char)s[0];
    for (uint32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
        int32_t id = t->special[k];
        bool user = t->types[id] == PS_TOK_TYPE_USER_DEFINED;
        if (user ? t->kind == PS_TOK_SPM : !parse_special) continue;
        size_t n;
        const char *txt = tok_text(t, id, &n);
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

/* Cuts text at special tokens and encodes every piece into o. */
static ps_status encode_text(const ps_tok *t, const char *text, size_t len, bool parse_special, tok_out *o, char *err,
                             size_t errlen) {
    bool after_special = true;
    size_t frag = 0;
    bool any_special = t->special_start[256] > 0;
    for (size_t pos = 0; any_special && pos < len;) {
        size_t mlen;
        int32_t id = match_special(t, text + pos, len - pos, parse_special, &mlen);
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

ps_status ps_tok_encode(const ps_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t *ids, size_t cap, size_t *n_ids, char *err, size_t errlen) {
    *n_ids = 0;
    if (!t || (!text && len) || (!ids && cap))
        return ps_errf(err, errlen, PS_ERR_ARG, "ps_tok_encode: NULL tokenizer, text or id buffer");
    tok_out o = {ids, cap, 0};
    if (add_special && t->add_bos) tok_emit(&o, t->bos);
    ps_status s = encode_text(t, text, len, parse_special, &o, err, errlen);
    if (s) return s;
    if (add_special && t->add_eos) tok_emit(&o, t->eos);
    *n_ids = o.n;
    if (o.n > cap) return ps_errf(err, errlen, PS_ERR_RANGE, "%zu tokens do not fit in a buffer of %zu", o.n, cap);
    return PS_OK;
}
