/* tokenize.h - the model's tokenizer: text <-> token ids.
 *
 * Two kinds, picked by tokenizer.ggml.model:
 *   "llama"  SentencePiece-style BPE over scores (space prefix, ' ' -> U+2581, byte fallback),
 *            equal to the sentencepiece library's BPE model with an identity normalizer.
 *   "gpt2"   byte-level BPE over ranked merges, pre-split by the regexes named by
 *            tokenizer.ggml.pre (llama3 / llama-bpe, qwen2, smollm, gpt-2, default, ...),
 *            equal to Hugging Face `tokenizers`.
 *
 * A ps_tok is immutable once created: any number of threads may encode and decode with one
 * tokenizer at the same time. It copies what it needs, so the ps_gguf it was made from may be
 * closed right after ps_tok_create. Token ids are int32_t in [0, ps_tok_n_vocab). */
#ifndef PS_TOKENIZE_H
#define PS_TOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../gguf/gguf.h"
#include "../ps.h"

typedef struct ps_tok ps_tok;

typedef enum {
    PS_TOK_SPM = 1, /* tokenizer.ggml.model = "llama" */
    PS_TOK_BPE = 2, /* tokenizer.ggml.model = "gpt2" */
} ps_tok_kind;

/* tokenizer.ggml.token_type values (sentencepiece's numbering; 0 is treated as normal). */
typedef enum {
    PS_TOK_TYPE_UNDEFINED = 0,
    PS_TOK_TYPE_NORMAL = 1,
    PS_TOK_TYPE_UNKNOWN = 2,
    PS_TOK_TYPE_CONTROL = 3,
    PS_TOK_TYPE_USER_DEFINED = 4,
    PS_TOK_TYPE_UNUSED = 5,
    PS_TOK_TYPE_BYTE = 6,
    PS_TOK_TYPE_COUNT
} ps_tok_type;

/* Everything a tokenizer is built from, as the GGUF metadata has it. Strings need not be
 * NUL-terminated; all pointers are only read during ps_tok_create_spec. */
typedef struct {
    ps_gguf_str model;         /* "llama" or "gpt2" (tokenizer.ggml.model) */
    ps_gguf_str pre;           /* gpt2 pre-tokenizer name; len 0 means "default" */
    uint32_t n_tokens;         /* vocabulary size, >= 1 */
    const ps_gguf_str *tokens; /* (n_tokens) token texts */
    const float *scores;       /* (n_tokens) or NULL: all 0 */
    const int32_t *types;      /* (n_tokens) ps_tok_type values, or NULL: all normal */
    uint64_t n_merges;
    const ps_gguf_str *merges;                      /* (n_merges) "left right", rank = index; gpt2 only */
    int64_t bos_id, eos_id, unk_id, pad_id, eot_id; /* -1: none */
    int8_t add_bos, add_eos;                        /* 0/1, or -1 for the kind's default (SPM: BOS yes; gpt2: no) */
    int8_t add_space_prefix;                        /* 0/1, or -1 for the kind's default (SPM: yes; gpt2: no) */
} ps_tok_spec;

/* A spec with every id -1, every flag -1 and nothing else set. */
ps_tok_spec ps_tok_spec_init(void);

/* Builds a tokenizer from a GGUF file's tokenizer.ggml.* metadata. Every value is checked
 * (types, array lengths, ids in range, merges parse and name vocabulary tokens, ...); on
 * failure *out is NULL and err says what is wrong, e.g. "unsupported tokenizer 'bert'"
 * (PS_ERR_UNSUPPORTED) or "tokenizer.ggml.bos_token_id = 600 is out of range (512 tokens)"
 * (PS_ERR_FORMAT). The caller owns *out (ps_tok_free). */
ps_status ps_tok_create(const ps_gguf *g, ps_tok **out, char *err, size_t errlen);
/* Same, opening (and closing again) the GGUF file at path. */
ps_status ps_tok_create_from_file(const char *path, ps_tok **out, char *err, size_t errlen);
/* Same from an explicit spec (tests, synthetic models); the GGUF paths go through here. */
ps_status ps_tok_create_spec(const ps_tok_spec *spec, ps_tok **out, char *err, size_t errlen);
void ps_tok_free(ps_tok *t); /* NULL is a no-op */

/* Encodes len bytes of text (any bytes; invalid UTF-8 falls back to byte tokens). With
 * add_special, BOS/EOS are added as the model's add_bos/add_eos flags say. With parse_special,
 * the text of control (and unknown) tokens, e.g. "<|im_start|>", becomes that token; without it
 * such text is ordinary text. User-defined tokens are always matched, as sentencepiece, HF
 * tokenizers and llama.cpp do. Writes min(n, cap) ids and sets *n_ids = n; when n > cap the
 * result is PS_ERR_RANGE (call again with cap >= *n_ids). */
ps_status ps_tok_encode(const ps_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t *ids, size_t cap, size_t *n_ids, char *err, size_t errlen);

/* A byte range [off, off + len) of a text. */
typedef struct {
    size_t off, len;
} ps_tok_span;

/* As ps_tok_encode with parse_special, except that no control or unknown token is matched
 * where its text would overlap one of the n_literal spans (sorted by offset, disjoint): text
 * that came from a user, such as a chat message's content, stays text even where it spells
 * "<|im_start|>", while the template around it gets its special tokens. Plain text is cut
 * only at special tokens, never at a span's edge, so a text without special-token strings in
 * its spans encodes exactly as with ps_tok_encode. Spans out of order or past the text:
 * PS_ERR_ARG. */
ps_status ps_tok_encode_literal(const ps_tok *t, const char *text, size_t len, bool add_special,
                                const ps_tok_span *literal, size_t n_literal, int32_t *ids, size_t cap, size_t *n_ids,
                                char *err, size_t errlen);

/* Decode flags. */
#define PS_TOK_DECODE_SPECIAL     1u /* render control and unknown tokens as their text (else empty) */
#define PS_TOK_DECODE_STRIP_SPACE 2u /* drop the space the SPM space prefix put before the first word */

/* The bytes of one token as decoding produces them (flags: PS_TOK_DECODE_SPECIAL only):
 * SPM "\xe2\x96\x81" -> ' ', byte tokens -> their byte; BPE: the byte-level mapping reversed.
 * *data points into the tokenizer (valid until ps_tok_free); it may be cut inside a UTF-8
 * character. PS_ERR_ARG for an id out of range. */
ps_status ps_tok_piece(const ps_tok *t, int32_t id, unsigned flags, const char **data, size_t *len);

/* Concatenates the pieces of n ids into out (cap bytes; not NUL-terminated), sets *n_out to the
 * full length; PS_ERR_RANGE when it does not fit (out then holds the first cap bytes), PS_ERR_ARG
 * with err naming the position for an id out of range. */
ps_status ps_tok_decode(const ps_tok *t, const int32_t *ids, size_t n, unsigned flags, char *out, size_t cap,
                        size_t *n_out, char *err, size_t errlen);

/* Streaming detokenizer: feed generated ids one at a time and print what comes back; a UTF-8
 * character whose bytes span several tokens is held back until it is complete, so printed text
 * never ends in half a character. Invalid sequences are passed on as they are, never held. */
typedef struct ps_tok_stream ps_tok_stream;

/* One stream per sequence; flags as for ps_tok_decode. The tokenizer must outlive the stream. */
ps_status ps_tok_stream_create(const ps_tok *t, unsigned flags, ps_tok_stream **out);
void ps_tok_stream_free(ps_tok_stream *s); /* NULL is a no-op */
/* Starts a new text: drops held bytes, re-arms PS_TOK_DECODE_STRIP_SPACE. */
void ps_tok_stream_reset(ps_tok_stream *s);
/* Adds token id; *text and *len receive the bytes that are ready (maybe none). *text points into the
 * stream and stays valid until the next push, flush, reset or free. PS_ERR_ARG for a bad id. */
ps_status ps_tok_stream_push(ps_tok_stream *s, int32_t id, const char **text, size_t *len);
/* Hands out whatever is still held (an incomplete character at the end of the text). */
void ps_tok_stream_flush(ps_tok_stream *s, const char **text, size_t *len);

/* Vocabulary facts. Ids are -1 when the model has none. */
ps_tok_kind ps_tok_get_kind(const ps_tok *t);
int32_t ps_tok_n_vocab(const ps_tok *t);
int32_t ps_tok_bos(const ps_tok *t);
int32_t ps_tok_eos(const ps_tok *t);
int32_t ps_tok_eot(const ps_tok *t);
int32_t ps_tok_unk(const ps_tok *t);
int32_t ps_tok_pad(const ps_tok *t);
bool ps_tok_add_bos(const ps_tok *t);
bool ps_tok_add_eos(const ps_tok *t);
/* True for tokens that end generation: EOS, EOT and tokens such as "<|im_end|>",
 * "<|endoftext|>", "<|eot_id|>", "<end_of_turn>" (as llama.cpp's list). */
bool ps_tok_is_eog(const ps_tok *t, int32_t id);
/* Type of a token (PS_TOK_TYPE_COUNT for an id out of range). */
ps_tok_type ps_tok_token_type(const ps_tok *t, int32_t id);
/* Raw vocabulary text of a token (as in tokenizer.ggml.tokens; NULL for an id out of range).
 * Points into the tokenizer; not NUL-terminated. */
const char *ps_tok_token_text(const ps_tok *t, int32_t id, size_t *len);
/* Id of the token whose raw text is exactly text[0..len), or -1. */
int32_t ps_tok_find(const ps_tok *t, const char *text, size_t len);
/* The pre-tokenizer name in use ("smollm", "default", ...; "" for SPM); NUL-terminated. */
const char *ps_tok_pre_name(const ps_tok *t);

#endif
