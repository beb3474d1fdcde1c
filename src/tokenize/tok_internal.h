/* tok_internal.h - the tokenizer's private state, shared by the files of src/tokenize/.
 *
 * tok_load.c   builds a ps_tok from a spec or GGUF metadata and checks it
 * tok_map.c    hash tables: token text -> id, (left id, right id) -> merge
 * tok_spm.c    SentencePiece-style encoding
 * tok_bpe.c    byte-level BPE encoding (PCRE2 pre-split, ranked merges)
 * tok_encode.c special-token partition, BOS/EOS, dispatch
 * tok_decode.c pieces, decode, streaming detokenizer */
#ifndef PS_TOK_INTERNAL_H
#define PS_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenize.h"

/* ---- hash tables (tok_map.c) ---- */

/* Token text -> id, open addressing over ids; the texts live in the owning ps_tok. */
typedef struct {
    int32_t *slots; /* (mask + 1) token ids, -1 = empty */
    uint32_t mask;  /* capacity - 1, capacity a power of two */
} tok_strmap;

/* One merge rule: (left, right) -> merged token, lower rank merges first. */
typedef struct {
    uint64_t key;   /* left << 32 | right; UINT64_MAX = empty slot */
    int32_t rank;   /* index in tokenizer.ggml.merges */
    int32_t merged; /* id of left's text followed by right's */
} tok_merge;

typedef struct {
    tok_merge *slots; /* (mask + 1) */
    uint32_t mask;
} tok_mergemap;

/* XXH3-64 of s[0..len) (seed 0). */
uint64_t ps_tok_hash_bytes(const char *s, size_t len);
ps_status ps_tok_strmap_init(tok_strmap *m, uint32_t n_keys);
void ps_tok_strmap_free(tok_strmap *m);
/* Inserts id (keyed by its text in t); returns the id already there with the same text, or -1. */
int32_t ps_tok_strmap_put(tok_strmap *m, const ps_tok *t, int32_t id);
/* Id whose text equals s[0..len), or -1. */
int32_t ps_tok_strmap_get(const tok_strmap *m, const ps_tok *t, const char *s, size_t len);

ps_status ps_tok_mergemap_init(tok_mergemap *m, uint64_t n_keys);
void ps_tok_mergemap_free(tok_mergemap *m);
/* Inserts a rule unless (left, right) is already there (the first rule wins, as llama.cpp). */
void ps_tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* The rule for (left, right), or NULL. */
const tok_merge *ps_tok_mergemap_get(const tok_mergemap *m, int32_t left, int32_t right);

/* ---- the tokenizer ---- */

#define TOK_MAX_REGEX 4

struct ps_tok {
    ps_tok_kind kind;
    int32_t n_vocab;
    char *text;            /* all raw token texts, back to back */
    uint32_t *text_off;    /* (n_vocab + 1) token i is text[text_off[i] .. text_off[i + 1]) */
    float *scores;         /* (n_vocab) */
    uint8_t *types;        /* (n_vocab) ps_tok_type */
    char *piece;           /* decoded bytes of every token, back to back */
    uint32_t *piece_off;   /* (n_vocab + 1) like text_off */
    uint32_t max_piece;    /* longest piece in bytes */
    uint8_t *eog;          /* (n_vocab) 1 for end-of-generation tokens */
    tok_strmap vocab;      /* raw text -> id */
    tok_mergemap merges;   /* BPE only */
    int32_t byte_tok[256]; /* SPM: id of "<0xXX>"; BPE: id of the byte's byte-level character; -1 none */
    /* special-token matcher: ids of control/unknown/user-defined tokens grouped by first byte,
     * longest first within a group */
    int32_t *special; /* (n_special) */
    uint32_t special_start[257];
    int32_t n_user; /* how many of them are user-defined */
    int32_t bos, eos, eot, unk, pad;
    bool add_bos, add_eos, add_space_prefix;
    bool ignore_merges;            /* BPE: a word that is a whole vocabulary token skips merging (llama3) */
    bool has_unused;               /* SPM: some token is of type unused (needs resegmentation) */
    bool byte_fallback;            /* SPM: all 256 byte tokens exist (else unknown pieces become unk) */
    pcre2_code *re[TOK_MAX_REGEX]; /* BPE pre-split, applied in order */
    int n_re;
    char pre_name[32];
};

static inline const char *tok_text(const ps_tok *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}

/* Output ids: writes while there is room, counts always. */
typedef struct {
    int32_t *ids;
    size_t cap;
    size_t n;
} tok_out;

static inline void tok_emit(tok_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* Byte-level BPE: the GPT-2 byte -> code point table (tok_bpe.c). */
uint32_t ps_tok_bpe_byte_cp(uint8_t b);
/* Inverse of ps_tok_bpe_byte_cp: the byte for code point cp, or -1 when cp is not in the table. */
int ps_tok_bpe_cp_byte(uint32_t cp);
/* Compiles the pre-split regexes named by pre (len 0: "default") into t->re; sets
 * t->ignore_merges and t->pre_name. PS_ERR_UNSUPPORTED for an unknown name. */
ps_status ps_tok_bpe_setup(ps_tok *t, ps_gguf_str pre, bool *default_add_bos, char *err, size_t errlen);
/* Encodes one fragment of plain text (no special tokens in it). */
ps_status ps_tok_bpe_encode(const ps_tok *t, const char *s, size_t len, tok_out *o, char *err, size_t errlen);
/* Encodes one fragment of plain text; the caller has already decided about the space prefix. */
ps_status ps_tok_spm_encode(const ps_tok *t, const char *s, size_t len, bool space_prefix, tok_out *o, char *err,
                            size_t errlen);
/* Builds t->piece / piece_off / max_piece from the token texts (tok_decode.c). */
ps_status ps_tok_build_pieces(ps_tok *t, char *err, size_t errlen);

#endif
