/* test_tokenize.c - unit tests of src/tokenize on small hand-made vocabularies.
 *
 * The vocabularies are built in memory (ps_tok_create_spec) or written as GGUF files with the
 * project's writer and read back (ps_tok_create_from_file). Agreement with sentencepiece and HF
 * tokenizers on real models is tests/test_tokenize_ref.py's job. */
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "ps.h"
#include "ps_test.h"
#include "tokenize/tokenize.h"

// ---- helpers

static ps_gguf_str S(const char *c) { return (ps_gguf_str){strlen(c), c}; }

/* True when err contains the substring want (and says so otherwise). */
static int err_has(const char *err, const char *want) {
    if (strstr(err, want)) return 1;
    fprintf(stderr, "error message \"%s\" lacks \"%s\"\n", err, want);
    return 0;
}

/* Checks that b[0..n) is valid UTF-8 (structurally; enough for these tests). */
static int utf8_ok(const char *b, size_t n) {
    const unsigned char *s = (const unsigned char *)b;
    for (size_t i = 0; i < n;) {
        size_t l = s[i] < 0x80                   ? 1
                   : s[i] >= 0xC2 && s[i] < 0xE0 ? 2
                   : s[i] >= 0xE0 && s[i] < 0xF0 ? 3
                   : s[i] >= 0xF0 && s[i] < 0xF5 ? 4
                                                 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* Encodes a C string; returns the id count (-1 on error, printed). */
static int enc(const ps_tok *t, const char *text, bool add_special, bool parse_special, int32_t *ids, size_t cap) {
    size_t n;
    char err[256] = "";
    ps_status s = ps_tok_encode(t, text, strlen(text), add_special, parse_special, ids, cap, &n, err, sizeof err);
    if (s) {
        fprintf(stderr, "encode(\"%s\"): %s: %s\n", text, ps_strerror(s), err);
        return -1;
    }
    return (int)n;
}

/* Decodes ids into a static NUL-terminated buffer. */
static const char *dec(const ps_tok *t, const int32_t *ids, int n, unsigned flags) {
    static char buf[4096];
    size_t len;
    char err[256] = "";
    if (ps_tok_decode(t, ids, (size_t)n, flags, buf, sizeof buf - 1, &len, err, sizeof err)) {
        fprintf(stderr, "decode: %s\n", err);
        return "<error>";
    }
    buf[len] = 0;
    return buf;
}

/* Id of a token by text (-1 when absent). */
static int32_t id_of(const ps_tok *t, const char *text) { return ps_tok_find(t, text, strlen(text)); }

// ---- a small SentencePiece vocabulary

#define SPM_MAX 300
static char spm_bytes[256][8];
static ps_gguf_str spm_toks[SPM_MAX];
static float spm_scores[SPM_MAX];
static int32_t spm_types[SPM_MAX];

/* <unk> <s> </s>, the 256 byte tokens, a user-defined and a control token, then pieces whose
 * scores favour the later (longer) ones. */
static ps_tok_spec spm_spec(void) {
#define LB "\xe2\x96\x81" /* U+2581 */
    static const char *pieces[] = {LB, "a", "b", "c", LB "a", "ab", LB "ab", "h", "i"};
    int n = 0;
    memset(spm_scores, 0, sizeof spm_scores);
    spm_toks[n] = S("<unk>"), spm_types[n++] = PS_TOK_TYPE_UNKNOWN;
    spm_toks[n] = S("<s>"), spm_types[n++] = PS_TOK_TYPE_CONTROL;
    spm_toks[n] = S("</s>"), spm_types[n++] = PS_TOK_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(spm_bytes[b], sizeof spm_bytes[b], "<0x%02X>", b);
        spm_toks[n] = S(spm_bytes[b]), spm_types[n++] = PS_TOK_TYPE_BYTE;
    }
    spm_toks[n] = S("<ud>"), spm_types[n++] = PS_TOK_TYPE_USER_DEFINED;
    spm_toks[n] = S("<|sep|>"), spm_types[n++] = PS_TOK_TYPE_CONTROL;
    for (size_t i = 0; i < PS_ARRAY_LEN(pieces); i++) {
        spm_scores[n] = (float)i;
        spm_toks[n] = S(pieces[i]), spm_types[n++] = PS_TOK_TYPE_NORMAL;
    }
    ps_tok_spec sp = ps_tok_spec_init();
    sp.model = S("llama");
    sp.n_tokens = (uint32_t)n;
    sp.tokens = spm_toks;
    sp.scores = spm_scores;
    sp.types = spm_types;
    sp.unk_id = 0, sp.bos_id = 1, sp.eos_id = 2;
    return sp;
}

// ---- a small byte-level BPE vocabulary

#define BPE_MAX 300
static char bpe_chars[256][4];
static ps_gguf_str bpe_toks[BPE_MAX];
static int32_t bpe_types[BPE_MAX];
static const char *bpe_merges_c[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "o r", "\xc4\xa0w or", "l d"};
static ps_gguf_str bpe_merges[PS_ARRAY_LEN(bpe_merges_c)];

/* GPT-2's byte -> character table, written out independently of the library. */
static unsigned byte_char(unsigned b) {
    unsigned n = 0;
    for (unsigned c = 0; c < 256; c++) {
        bool keep = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (c == b) return keep ? c : 256 + n;
        if (!keep) n++;
    }
    return 0;
}

/* The 256 byte characters (token b is byte b), merged tokens, then special tokens. */
static ps_tok_spec bpe_spec(void) {
    static const char *words[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "or", "\xc4\xa0wor", "ld"};
    int n = 0;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_char(b);
        char *c = bpe_chars[b];
        if (cp < 0x80)
            c[0] = (char)cp, c[1] = 0;
        else
            c[0] = (char)(0xC0 | cp >> 6), c[1] = (char)(0x80 | (cp & 0x3F)), c[2] = 0;
        bpe_toks[n] = S(bpe_chars[b]), bpe_types[n++] = PS_TOK_TYPE_NORMAL;
    }
    for (size_t i = 0; i < PS_ARRAY_LEN(words); i++) bpe_toks[n] = S(words[i]), bpe_types[n++] = PS_TOK_TYPE_NORMAL;
    bpe_toks[n] = S("<|im_start|>"), bpe_types[n++] = PS_TOK_TYPE_CONTROL;
    bpe_toks[n] = S("<|im_end|>"), bpe_types[n++] = PS_TOK_TYPE_CONTROL;
    bpe_toks[n] = S("<|im"), bpe_types[n++] = PS_TOK_TYPE_CONTROL;
    bpe_toks[n] = S("<ud>"), bpe_types[n++] = PS_TOK_TYPE_USER_DEFINED;
    for (size_t i = 0; i < PS_ARRAY_LEN(bpe_merges_c); i++) bpe_merges[i] = S(bpe_merges_c[i]);
    ps_tok_spec sp = ps_tok_spec_init();
    sp.model = S("gpt2");
    sp.pre = S("smollm");
    sp.n_tokens = (uint32_t)n;
    sp.tokens = bpe_toks;
    sp.types = bpe_types;
    sp.n_merges = PS_ARRAY_LEN(bpe_merges);
    sp.merges = bpe_merges;
    sp.eos_id = 256 + 8 + 1; /* "<|im_end|>" */
    return sp;
}

static ps_tok *make(ps_tok_spec sp) {
    ps_tok *t = NULL;
    char err[256] = "";
    ps_status s = ps_tok_create_spec(&sp, &t, err, sizeof err);
    if (s) fprintf(stderr, "ps_tok_create_spec: %s: %s\n", ps_strerror(s), err);
    PS_CHECK_OK(s);
    return t;
}

// ---- SentencePiece

static void test_spm_encode(void) {
    ps_tok *t = make(spm_spec());
    if (!t) return;
    int32_t ids[64];
    int n = enc(t, "ab a", true, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3); /* <s> ▁ab ▁a */
    PS_CHECK_EQ_INT(ids[0], 1);
    PS_CHECK_EQ_INT(ids[1], id_of(t, "\xe2\x96\x81"
                                     "ab"));
    PS_CHECK_EQ_INT(ids[2], id_of(t, "\xe2\x96\x81"
                                     "a"));
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_STRIP_SPACE), "ab a") == 0);
    PS_CHECK(strcmp(dec(t, ids, n, 0), " ab a") == 0);
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_SPECIAL | PS_TOK_DECODE_STRIP_SPACE), "<s>ab a") == 0);
    /* byte fallback: é is not a piece */
    n = enc(t, "\xc3\xa9", false, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3);
    PS_CHECK_EQ_INT(ids[1], 3 + 0xC3);
    PS_CHECK_EQ_INT(ids[2], 3 + 0xA9);
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_STRIP_SPACE), "\xc3\xa9") == 0);
    /* invalid UTF-8 survives as bytes */
    n = enc(t, "a\xff\xc3", false, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3);
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_STRIP_SPACE), "a\xff\xc3") == 0);
    /* empty text: nothing, or BOS alone */
    PS_CHECK_EQ_INT(enc(t, "", false, false, ids, 64), 0);
    PS_CHECK_EQ_INT(enc(t, "", true, false, ids, 64), 1);
    PS_CHECK(ps_tok_add_bos(t) && !ps_tok_add_eos(t));
    PS_CHECK(ps_tok_is_eog(t, 2) && !ps_tok_is_eog(t, 1));
    ps_tok_free(t);
}

static void test_spm_special(void) {
    ps_tok *t = make(spm_spec());
    if (!t) return;
    int32_t ids[64], sep = id_of(t, "<|sep|>"), ud = id_of(t, "<ud>");
    int n = enc(t, "a<|sep|>a", false, true, ids, 64);
    PS_CHECK_EQ_INT(n, 3); /* ▁a <|sep|> ▁a: the space prefix comes back after a control token */
    PS_CHECK_EQ_INT(ids[1], sep);
    PS_CHECK_EQ_INT(ids[2], id_of(t, "\xe2\x96\x81"
                                     "a"));
    n = enc(t, "a<|sep|>a", false, false, ids, 64);
    for (int i = 0; i < n; i++) PS_CHECK(ids[i] != sep);
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_STRIP_SPACE), "a<|sep|>a") == 0);
    /* user-defined pieces are matched always, as sentencepiece does: ▁a <ud> a */
    n = enc(t, "a<ud>a", false, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3);
    PS_CHECK_EQ_INT(ids[1], ud);
    PS_CHECK_EQ_INT(ids[2], id_of(t, "a"));
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_STRIP_SPACE), "a<ud>a") == 0);
    ps_tok_free(t);
}

// ---- byte-level BPE

static void test_bpe_encode(void) {
    ps_tok *t = make(bpe_spec());
    if (!t) return;
    PS_CHECK(strcmp(ps_tok_pre_name(t), "smollm") == 0);
    int32_t ids[64];
    int n = enc(t, "hello world", true, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3); /* hello Ġwor ld; gpt2 adds no BOS by default */
    PS_CHECK_EQ_INT(ids[0], id_of(t, "hello"));
    PS_CHECK_EQ_INT(ids[1], id_of(t, "\xc4\xa0wor"));
    PS_CHECK_EQ_INT(ids[2], id_of(t, "ld"));
    PS_CHECK(strcmp(dec(t, ids, n, 0), "hello world") == 0);
    /* digits are split one by one (smollm) */
    n = enc(t, "a123", false, false, ids, 64);
    PS_CHECK_EQ_INT(n, 4);
    /* bytes of every kind come back */
    const char raw[] = "\x01\x7f\xff\xc3\xa9 \t\n";
    n = enc(t, raw, false, false, ids, 64);
    PS_CHECK(strcmp(dec(t, ids, n, 0), raw) == 0);
    ps_tok_free(t);
}

static void test_bpe_special(void) {
    ps_tok *t = make(bpe_spec());
    if (!t) return;
    int32_t ids[64], st = id_of(t, "<|im_start|>"), en = id_of(t, "<|im_end|>"), im = id_of(t, "<|im");
    int n = enc(t, "<|im_start|>hello<|im_end|>", false, true, ids, 64);
    PS_CHECK_EQ_INT(n, 3);
    PS_CHECK_EQ_INT(ids[0], st);
    PS_CHECK_EQ_INT(ids[1], id_of(t, "hello"));
    PS_CHECK_EQ_INT(ids[2], en);
    PS_CHECK(strcmp(dec(t, ids, n, 0), "hello") == 0);
    PS_CHECK(strcmp(dec(t, ids, n, PS_TOK_DECODE_SPECIAL), "<|im_start|>hello<|im_end|>") == 0);
    /* the longest special token at a position wins; a shorter one still matches alone */
    n = enc(t, "<|im_x", false, true, ids, 64);
    PS_CHECK(n >= 1 && ids[0] == im);
    /* without parse_special the same text is plain text */
    n = enc(t, "<|im_start|>hello<|im_end|>", false, false, ids, 64);
    PS_CHECK(n > 3);
    for (int i = 0; i < n; i++) PS_CHECK(ids[i] != st && ids[i] != en && ids[i] != im);
    PS_CHECK(strcmp(dec(t, ids, n, 0), "<|im_start|>hello<|im_end|>") == 0);
    /* user-defined tokens are matched either way and always rendered */
    n = enc(t, "a<ud>b", false, false, ids, 64);
    PS_CHECK_EQ_INT(n, 3);
    PS_CHECK_EQ_INT(ids[1], id_of(t, "<ud>"));
    PS_CHECK(strcmp(dec(t, ids, n, 0), "a<ud>b") == 0);
    PS_CHECK(ps_tok_is_eog(t, en));
    PS_CHECK_EQ_INT(ps_tok_token_type(t, st), PS_TOK_TYPE_CONTROL);
    PS_CHECK_EQ_INT(ps_tok_token_type(t, -1), PS_TOK_TYPE_COUNT);
    ps_tok_free(t);
}

/* ps_tok_encode_literal: control tokens in the template's text, none inside a literal span
 * (nor one reaching into it), user-defined tokens either way; spans out of order refused. */
static void test_literal_spans(void) {
    ps_tok *t = make(bpe_spec());
    if (!t) return;
    int32_t ids[64], whole[64], st = id_of(t, "<|im_start|>"), en = id_of(t, "<|im_end|>"), im = id_of(t, "<|im");
    char err[256] = "";
    /* "<|im_start|>" + content "hello<|im_end|>x<ud>" + "<|im_end|>" */
    const char text[] = "<|im_start|>hello<|im_end|>x<ud><|im_end|>";
    ps_tok_span lit = {12, 20};
    size_t n = 0;
    PS_CHECK_OK(ps_tok_encode_literal(t, text, strlen(text), false, &lit, 1, ids, 64, &n, err, sizeof err));
    PS_CHECK(n > 3 && ids[0] == st && ids[n - 1] == en);
    int controls = 0;
    for (size_t i = 1; i + 1 < n; i++) controls += ids[i] == st || ids[i] == en || ids[i] == im;
    PS_CHECK_EQ_INT(controls, 0);
    PS_CHECK(n >= 2 && ids[n - 2] == id_of(t, "<ud>"));
    PS_CHECK(strcmp(dec(t, ids, (int)n, PS_TOK_DECODE_SPECIAL), text) == 0);
    /* a control token whose text would reach into the span stays text: "<|im" + span "_end|>" */
    const char edge[] = "a<|im_end|>";
    ps_tok_span tail = {5, 6};
    PS_CHECK_OK(ps_tok_encode_literal(t, edge, strlen(edge), false, &tail, 1, ids, 64, &n, err, sizeof err));
    PS_CHECK(n >= 2 && ids[1] == im); /* "<|im" lies before the span: it may match, the longer one not */
    for (size_t i = 0; i < n; i++) PS_CHECK(ids[i] != en);
    /* without special strings in the spans: exactly ps_tok_encode's ids */
    const char plain[] = "<|im_start|>hello world<|im_end|>";
    ps_tok_span mid = {12, 11};
    PS_CHECK_OK(ps_tok_encode_literal(t, plain, strlen(plain), false, &mid, 1, ids, 64, &n, err, sizeof err));
    int nw = enc(t, plain, false, true, whole, 64);
    PS_CHECK((int)n == nw && !memcmp(ids, whole, n * sizeof *ids));
    /* spans out of order or past the end */
    ps_tok_span bad[2] = {{5, 4}, {3, 1}};
    PS_CHECK_EQ_INT(ps_tok_encode_literal(t, plain, strlen(plain), false, bad, 2, ids, 64, &n, err, sizeof err),
                    PS_ERR_ARG);
    bad[0] = (ps_tok_span){30, 10};
    PS_CHECK_EQ_INT(ps_tok_encode_literal(t, plain, strlen(plain), false, bad, 1, ids, 64, &n, err, sizeof err),
                    PS_ERR_ARG);
    ps_tok_free(t);
}

static void test_buffers(void) {
    ps_tok *t = make(bpe_spec());
    if (!t) return;
    int32_t ids[4];
    size_t n;
    const char *text = "a1 b2 c3 d4";
    PS_CHECK_EQ_INT(ps_tok_encode(t, text, strlen(text), false, false, ids, 4, &n, NULL, 0), PS_ERR_RANGE);
    PS_CHECK_EQ_INT(n, 11);
    char out[4];
    int32_t hello = id_of(t, "hello");
    PS_CHECK_EQ_INT(ps_tok_decode(t, &hello, 1, 0, out, sizeof out, &n, NULL, 0), PS_ERR_RANGE);
    PS_CHECK_EQ_INT(n, 5);
    int32_t bad = 100000;
    char err[128] = "";
    PS_CHECK_EQ_INT(ps_tok_decode(t, &bad, 1, 0, out, sizeof out, &n, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(err_has(err, "out of range"));
    ps_tok_free(t);
}

// ---- streaming

/* Pushes ids through a stream and checks that every chunk is whole UTF-8 and that the chunks
 * add up to want. */
static void stream_check(const ps_tok *t, const int32_t *ids, int n, unsigned flags, const char *want) {
    ps_tok_stream *s;
    PS_CHECK_OK(ps_tok_stream_create(t, flags, &s));
    char got[512];
    size_t k = 0, len;
    const char *p;
    for (int i = 0; i < n; i++) {
        PS_CHECK_OK(ps_tok_stream_push(s, ids[i], &p, &len));
        PS_CHECK(utf8_ok(p, len));
        memcpy(got + k, p, len);
        k += len;
    }
    ps_tok_stream_flush(s, &p, &len);
    PS_CHECK_EQ_INT(len, 0);
    got[k] = 0;
    PS_CHECK(strcmp(got, want) == 0);
    ps_tok_stream_free(s);
}

static void test_stream(void) {
    ps_tok *t = make(spm_spec());
    if (!t) return;
    /* é, 😀 and 中 only exist as byte tokens: each character spans several tokens */
    const char *text = "a \xc3\xa9\xf0\x9f\x98\x80 b\xe4\xb8\xad";
    int32_t ids[64];
    int n = enc(t, text, true, false, ids, 64);
    PS_CHECK(n > 8);
    stream_check(t, ids, n, PS_TOK_DECODE_STRIP_SPACE, text);
    ps_tok_stream *s;
    PS_CHECK_OK(ps_tok_stream_create(t, 0, &s));
    const char *p;
    size_t len;
    /* an incomplete character is held, then handed out by flush */
    PS_CHECK_OK(ps_tok_stream_push(s, 3 + 0xF0, &p, &len));
    PS_CHECK_EQ_INT(len, 0);
    PS_CHECK_OK(ps_tok_stream_push(s, 3 + 0x9F, &p, &len));
    PS_CHECK_EQ_INT(len, 0);
    ps_tok_stream_flush(s, &p, &len);
    PS_CHECK(len == 2 && memcmp(p, "\xf0\x9f", 2) == 0);
    /* a stray continuation byte is never held */
    PS_CHECK_OK(ps_tok_stream_push(s, 3 + 0x80, &p, &len));
    PS_CHECK(len == 1 && (unsigned char)p[0] == 0x80);
    /* a lead byte followed by a non-continuation goes out with it */
    PS_CHECK_OK(ps_tok_stream_push(s, 3 + 0xC3, &p, &len));
    PS_CHECK_EQ_INT(len, 0);
    PS_CHECK_OK(ps_tok_stream_push(s, id_of(t, "a"), &p, &len));
    PS_CHECK(len == 2 && memcmp(p,
                                "\xc3"
                                "a",
                                2) == 0);
    /* control tokens: hidden unless asked for */
    PS_CHECK_OK(ps_tok_stream_push(s, 1, &p, &len));
    PS_CHECK_EQ_INT(len, 0);
    PS_CHECK_EQ_INT(ps_tok_stream_push(s, -5, &p, &len), PS_ERR_ARG);
    ps_tok_stream_free(s);
    ps_tok_stream_free(NULL);
    ps_tok_free(t);

    t = make(bpe_spec()); /* BPE: "é" is two byte tokens too */
    if (!t) return;
    n = enc(t, "hello \xc3\xa9\xe4\xb8\xad world", false, false, ids, 64);
    stream_check(t, ids, n, 0, "hello \xc3\xa9\xe4\xb8\xad world");
    ps_tok_free(t);
}

// ---- bad metadata

typedef struct {
    const char *what;
    ps_status want;
    const char *msg;
} bad_case;

/* Creates from sp and expects status want with msg in the error. */
static void expect_bad(ps_tok_spec sp, bad_case c) {
    ps_tok *t = (ps_tok *)1;
    char err[512] = "";
    ps_status s = ps_tok_create_spec(&sp, &t, err, sizeof err);
    if (s != c.want) fprintf(stderr, "case '%s': status %d (%s), want %d\n", c.what, s, err, c.want);
    PS_CHECK_EQ_INT(s, c.want);
    PS_CHECK(t == NULL);
    PS_CHECK(err_has(err, c.msg));
}

static void test_bad_spec(void) {
    ps_tok_spec sp = spm_spec();
    sp.model = S("bert");
    expect_bad(sp, (bad_case){"model", PS_ERR_UNSUPPORTED, "unsupported tokenizer 'bert'"});
    sp = bpe_spec();
    sp.pre = S("klingon");
    expect_bad(sp, (bad_case){"pre", PS_ERR_UNSUPPORTED, "unsupported pre-tokenizer 'klingon'"});
    sp = spm_spec();
    sp.bos_id = 100000;
    expect_bad(sp, (bad_case){"bos", PS_ERR_FORMAT, "bos_token_id = 100000 is out of range"});
    sp = spm_spec();
    sp.bos_id = -1;
    expect_bad(sp, (bad_case){"add_bos without bos", PS_ERR_FORMAT, "adds BOS"});
    sp = spm_spec();
    spm_types[5] = 9;
    expect_bad(sp, (bad_case){"type", PS_ERR_FORMAT, "token_type[5] = 9"});
    sp = spm_spec();
    spm_toks[10] = S("<0xZZ>");
    expect_bad(sp, (bad_case){"byte token", PS_ERR_FORMAT, "not <0xXX>"});
    sp = spm_spec();
    spm_toks[269] = S("a");
    expect_bad(sp, (bad_case){"duplicate", PS_ERR_FORMAT, "repeats token"});
    sp = spm_spec();
    for (int i = 3; i < 259; i++) spm_types[i] = PS_TOK_TYPE_NORMAL;
    sp.unk_id = -1;
    expect_bad(sp, (bad_case){"no fallback", PS_ERR_FORMAT, "no unknown token"});
    sp = spm_spec();
    spm_scores[3] = 0.0f / 0.0f;
    expect_bad(sp, (bad_case){"nan", PS_ERR_FORMAT, "scores[3] is NaN"});
    sp = spm_spec();
    sp.n_tokens = 0;
    expect_bad(sp, (bad_case){"empty", PS_ERR_FORMAT, "tokens is missing or empty"});
    sp = bpe_spec();
    sp.n_merges = 0;
    expect_bad(sp, (bad_case){"no merges", PS_ERR_FORMAT, "without tokenizer.ggml.merges"});
    sp = bpe_spec();
    bpe_merges[2] = S("hell");
    expect_bad(sp, (bad_case){"merge parse", PS_ERR_FORMAT, "merges[2] 'hell' is not two tokens"});
    sp = bpe_spec();
    bpe_merges[1] = S("l q\xc3");
    expect_bad(sp, (bad_case){"merge token", PS_ERR_FORMAT, "not in the vocabulary"});
    sp = bpe_spec();
    bpe_merges[0] = S("w o");
    expect_bad(sp, (bad_case){"merge result", PS_ERR_FORMAT, "makes 'wo'"});
}

// ---- the GGUF front end

/* Writes a small SPM tokenizer (plus whatever tweak adds) and tries to load it. */
static ps_status gguf_try(int tweak, char *err, size_t errlen, ps_tok **out) {
    ps_tok_spec sp = spm_spec();
    const char *strs[SPM_MAX];
    for (uint32_t i = 0; i < sp.n_tokens; i++) strs[i] = spm_toks[i].data;
    ps_gguf_writer *w;
    PS_CHECK_OK(ps_gguf_writer_create(&w, 3, 32));
    ps_gguf_writer_set_str(w, "general.architecture", "llama");
    if (tweak != 1) ps_gguf_writer_set_str(w, "tokenizer.ggml.model", tweak == 2 ? "t5" : "llama");
    ps_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, sp.n_tokens);
    ps_gguf_writer_set_arr(w, "tokenizer.ggml.scores", PS_GGUF_F32, spm_scores, sp.n_tokens - (tweak == 3));
    if (tweak == 4)
        ps_gguf_writer_set_arr_str(w, "tokenizer.ggml.token_type", strs, sp.n_tokens);
    else
        ps_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", PS_GGUF_I32, spm_types, sp.n_tokens);
    ps_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", UINT32_MAX); /* none */
    if (tweak == 5) ps_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 70000);
    if (tweak == 6) ps_gguf_writer_set_str(w, "tokenizer.ggml.add_bos_token", "yes");
    ps_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    const char *path = ps_test_tmp("tokenize_unit.gguf");
    PS_CHECK_OK(ps_gguf_writer_write(w, path, NULL, NULL, err, errlen));
    ps_gguf_writer_free(w);
    return ps_tok_create_from_file(path, out, err, errlen);
}

static void test_gguf(void) {
    static const struct {
        ps_status want;
        const char *msg;
    } cases[] = {
        {PS_OK, ""},
        {PS_ERR_NOT_FOUND, "no tokenizer"},
        {PS_ERR_UNSUPPORTED, "unsupported tokenizer 't5'"},
        {PS_ERR_FORMAT, "tokenizer.ggml.scores has"},
        {PS_ERR_FORMAT, "tokenizer.ggml.token_type"},
        {PS_ERR_FORMAT, "eos_token_id = 70000"},
        {PS_ERR_FORMAT, "add_bos_token"},
    };
    for (int i = 0; i < (int)PS_ARRAY_LEN(cases); i++) {
        ps_tok *t = NULL;
        char err[512] = "";
        ps_status s = gguf_try(i, err, sizeof err, &t);
        if (s != cases[i].want) fprintf(stderr, "gguf case %d: %d (%s)\n", i, s, err);
        PS_CHECK_EQ_INT(s, cases[i].want);
        if (s) PS_CHECK(err_has(err, cases[i].msg));
        if (i == 0 && t) { /* the defaults and the file's flags */
            PS_CHECK_EQ_INT(ps_tok_pad(t), -1);
            PS_CHECK_EQ_INT(ps_tok_bos(t), 1);
            PS_CHECK(ps_tok_add_bos(t) && ps_tok_add_eos(t));
            int32_t ids[16];
            int n = enc(t, "ab", true, false, ids, 16);
            PS_CHECK(n == 3 && ids[0] == 1 && ids[2] == 2);
        }
        ps_tok_free(t);
    }
}

int main(void) {
    test_spm_encode();
    test_spm_special();
    test_bpe_encode();
    test_bpe_special();
    test_literal_spans();
    test_buffers();
    test_stream();
    test_bad_spec();
    test_gguf();
    ps_tok_free(NULL);
    return ps_test_done();
}
