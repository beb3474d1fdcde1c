/* synth_vocab.c - a deterministic GPT-2-style byte-level BPE vocabulary for synthetic models.
 *
 * Layout of the vocabulary (ids):
 *   [0, 256)               the byte symbols of GPT-2's byte-to-unicode map, by byte value
 *   [256, V - 3)           merged tokens: first those a BPE trainer learns from a small built-in
 *                          English/code text (pair counting over pre-tokenized words), then
 *                          synthetic ones (existing token + a lowercase letter) until V is reached
 *   V-3, V-2, V-1          <|endoftext|>, <|im_start|>, <|im_end|> (control tokens)
 * Every merge "left right" is listed in creation order (its rank), and left, right and
 * left+right are all tokens, so any byte-level BPE implementation can load the result. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

// ---------------------------------------------------------------------------------------
// Built-in training text (ASCII only; it must never contain "<|", so no merge can spell a
// control token).

static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A language model reads a sequence of tokens and "
    "predicts the next one. It was the best of times, it was the worst of times, it was the age of "
    "wisdom, it was the age of foolishness. Once upon a time there was a little girl who lived in a "
    "village near the forest. Whenever she went out, the little girl wore a red riding cloak, so "
    "everyone in the village called her Little Red Riding Hood. She said that she would come back "
    "before the evening, and her mother told her to stay on the path and not to talk to strangers.\n"
    "In the beginning of the project, we wrote down what the system should do and how we would know "
    "that it works. The model is cut by layers into shards; every machine runs one shard and passes "
    "the activations to the next machine over the network. There are many ways to make this faster, "
    "and the simplest one is to keep every stage busy with another request while it waits.\n"
    "Question: What is the capital of France? Answer: The capital of France is Paris. Question: How "
    "many days are there in a week? Answer: There are seven days in a week. Thank you for your help! "
    "You're welcome; I'm happy that it helped, and we'll talk again when you've tried it. They'd "
    "said it isn't hard, but it doesn't always work the first time.\n"
    "Hello, world! How are you today? I am fine, thanks for asking. What would you like to do this "
    "afternoon? We could go for a walk in the park, read a book, or write some code together.\n"
    "#include <stdio.h>\n#include <stdlib.h>\n\n/* Returns the sum of the first n numbers. */\n"
    "static int sum(const int *values, int count) {\n    int total = 0;\n    for (int i = 0; i < count; "
    "i++) {\n        total += values[i];\n    }\n    return total;\n}\n\nint main(int argc, char **argv) "
    "{\n    if (argc < 2) {\n        fprintf(stderr, \"usage: %s FILE\\n\", argv[0]);\n        return 2;\n"
    "    }\n    const char *path = argv[1];\n    FILE *f = fopen(path, \"rb\");\n    if (!f) {\n"
    "        perror(path);\n        return 1;\n    }\n    char buffer[4096];\n    size_t n = fread(buffer, "
    "1, sizeof buffer, f);\n    printf(\"read %zu bytes\\n\", n);\n    fclose(f);\n    return 0;\n}\n\n"
    "def tokenize(text, vocab, merges):\n    \"\"\"Split text into tokens with byte pair encoding.\"\"\"\n"
    "    words = text.split()\n    result = []\n    for word in words:\n        symbols = list(word)\n"
    "        while len(symbols) > 1:\n            pairs = [(symbols[i], symbols[i + 1]) for i in "
    "range(len(symbols) - 1)]\n            best = min(pairs, key=lambda p: merges.get(p, float('inf')))\n"
    "            if best not in merges:\n                break\n            symbols = merge(symbols, best)\n"
    "        result.extend(vocab[s] for s in symbols)\n    return result\n\n"
    "class Model:\n    def __init__(self, path):\n        self.path = path\n        self.layers = []\n\n"
    "    def forward(self, tokens, start_pos=0):\n        x = self.embed(tokens)\n        for layer in "
    "self.layers:\n            x = layer(x, start_pos)\n        return self.head(self.norm(x))\n\n"
    "The weather was warm and the sky was clear, so the children played outside until the sun went "
    "down. Their parents watched them from the porch and talked about the news of the day: the price "
    "of bread, the new school, and the train that would soon connect the town with the city.\n"
    "Science is the study of the natural world through observation and experiment. Mathematics gives "
    "science its language: numbers, functions, matrices and probabilities. A matrix multiplication "
    "takes two matrices and returns a third one whose elements are sums of products.\n"
    "Please write a short story about a robot who learns to paint. The robot was built to sort "
    "packages in a large warehouse, but every night, after the workers had gone home, it looked at "
    "the colors of the boxes and wondered what they would look like on a canvas.\n";

// ---------------------------------------------------------------------------------------
// GPT-2 byte-to-unicode map

/* Writes the UTF-8 text of byte b's symbol (1 or 2 bytes, NUL-terminated) to out[3]:
 * printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards in byte order. */
static void byte_symbol(int b, char out[3]) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

// ---------------------------------------------------------------------------------------
// Builder: tokens and merges as offsets into one growing string arena, plus a hash set of
// token strings (open addressing, ids; -1 is empty).

static const char *const specials[PS_CLI_SYNTH_N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

typedef struct {
    char *buf;
    size_t len, cap;
    size_t *tok; /* [limit + N_SPECIAL] token offsets */
    int n_tok;
    int limit;     /* tokens before the specials */
    size_t *merge; /* merge offsets */
    int n_merge, merge_cap;
    int32_t *slot; /* hash set of token ids */
    uint64_t mask;
} builder;

/* FNV-1a of s[0..n). */
static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* Appends s[0..n) and a NUL to the arena; its offset in *off. */
static ps_status arena_put(builder *b, const char *s, size_t n, size_t *off) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->buf, cap);
        if (!p) return PS_ERR_NOMEM;
        b->buf = p;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->buf[b->len + n] = 0;
    *off = b->len;
    b->len += n + 1;
    return PS_OK;
}

/* Id of the token spelled s[0..n), or -1. */
static int find_token(const builder *b, const char *s, size_t n) {
    for (uint64_t h = hash_str(s, n) & b->mask;; h = (h + 1) & b->mask) {
        int id = b->slot[h];
        if (id < 0) return -1;
        const char *t = b->buf + b->tok[id];
        if (strlen(t) == n && !memcmp(t, s, n)) return id;
    }
}

/* True when s[0..n) spells one of the control tokens. */
static int is_special(const char *s, size_t n) {
    for (int i = 0; i < PS_CLI_SYNTH_N_SPECIAL; i++)
        if (strlen(specials[i]) == n && !memcmp(specials[i], s, n)) return 1;
    return 0;
}

/* Adds a new token (the caller checked it is absent); its id in *id. */
static ps_status add_token(builder *b, const char *s, size_t n, int *id) {
    ps_status st = arena_put(b, s, n, &b->tok[b->n_tok]);
    if (st) return st;
    uint64_t h = hash_str(s, n) & b->mask;
    while (b->slot[h] >= 0) h = (h + 1) & b->mask;
    b->slot[h] = b->n_tok;
    *id = b->n_tok++;
    return PS_OK;
}

/* Records the merge "tokens[l] tokens[r]" as the next rank. */
static ps_status add_merge(builder *b, int l, int r) {
    if (b->n_merge == b->merge_cap) {
        int cap = b->merge_cap ? 2 * b->merge_cap : 1024;
        size_t *p = realloc(b->merge, (size_t)cap * sizeof *p);
        if (!p) return PS_ERR_NOMEM;
        b->merge = p;
        b->merge_cap = cap;
    }
    const char *ls = b->buf + b->tok[l], *rs = b->buf + b->tok[r];
    size_t ln = strlen(ls), rn = strlen(rs);
    char tmp[512];
    if (ln + rn + 2 > sizeof tmp) return PS_ERR_INTERNAL;
    memcpy(tmp, ls, ln);
    tmp[ln] = ' ';
    memcpy(tmp + ln + 1, rs, rn);
    return arena_put(b, tmp, ln + 1 + rn, &b->merge[b->n_merge++]);
}

/* Merges tokens l and r: the merge is recorded and *id is the token left+right (new, or
 * existing when another merge spelled it already). PS_ERR_ARG when left+right would spell a
 * control token or grow past 250 bytes (the caller skips the pair). */
static ps_status merge_pair(builder *b, int l, int r, int *id) {
    const char *ls = b->buf + b->tok[l], *rs = b->buf + b->tok[r];
    size_t ln = strlen(ls), rn = strlen(rs);
    char tmp[256];
    if (ln + rn > 250) return PS_ERR_ARG;
    memcpy(tmp, ls, ln);
    memcpy(tmp + ln, rs, rn);
    if (is_special(tmp, ln + rn)) return PS_ERR_ARG;
    ps_status st = PS_OK;
    *id = find_token(b, tmp, ln + rn);
    if (*id < 0 && (st = add_token(b, tmp, ln + rn, id))) return st;
    return add_merge(b, l, r);
}

// ---------------------------------------------------------------------------------------
// Training on the built-in text

/* Length of the pre-token starting at s[i] (an ASCII approximation of the GPT-2 regex after
 * splitting digits one by one): a contraction, one digit, " ?letters", " ?punctuation",
 * or a whitespace run that leaves a final space to the word after it. */
static size_t pretoken_len(const char *s, size_t i, size_t n) {
    static const char *const contr[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t k = 0; k < PS_ARRAY_LEN(contr); k++)
        if (!strncmp(s + i, contr[k], strlen(contr[k]))) return strlen(contr[k]);
    if (isdigit((unsigned char)s[i])) return 1;
    size_t j = i + (s[i] == ' ' && i + 1 < n && !isspace((unsigned char)s[i + 1]) && !isdigit((unsigned char)s[i + 1]));
    unsigned char c = (unsigned char)s[j];
    size_t k = j + 1;
    if (isalpha(c))
        while (k < n && isalpha((unsigned char)s[k])) k++;
    else if (!isspace(c))
        while (k < n && !isspace((unsigned char)s[k]) && !isalnum((unsigned char)s[k])) k++;
    else {
        while (k < n && isspace((unsigned char)s[k])) k++;
        if (k < n && k - i > 1 && s[k - 1] == ' ') k--;
    }
    return k - i;
}

/* The training words: each a run of symbol ids inside sym, shrinking as pairs merge. */
typedef struct {
    int32_t *sym;   /* every word's symbols, back to back */
    int32_t *start; /* [n] first symbol of each word */
    int32_t *len;   /* [n] current symbol count of each word */
    int n;
} words;

/* Splits the corpus into pre-tokens whose symbols are their bytes (= byte token ids). */
static ps_status words_init(words *w) {
    size_t n = sizeof corpus - 1;
    w->sym = malloc(n * sizeof *w->sym);
    w->start = malloc(n * sizeof *w->start);
    w->len = malloc(n * sizeof *w->len);
    if (!w->sym || !w->start || !w->len) return PS_ERR_NOMEM;
    w->n = 0;
    for (size_t i = 0; i < n;) {
        size_t l = pretoken_len(corpus, i, n);
        w->start[w->n] = (int32_t)i;
        w->len[w->n++] = (int32_t)l;
        for (size_t k = 0; k < l; k++) w->sym[i + k] = (uint8_t)corpus[i + k];
        i += l;
    }
    return PS_OK;
}

/* Frees the word arrays (a partly initialized w included). */
static void words_free(words *w) {
    free(w->sym);
    free(w->start);
    free(w->len);
}

/* Pair counts of one round: open addressing keyed by (left << 32 | right); a slot is live
 * when its stamp equals the round, so no clearing between rounds. */
typedef struct {
    uint64_t key;
    int32_t count;
    uint32_t stamp;
} pair_slot;

/* Counts adjacent pairs over all words in round `stamp`; the most frequent (ties: the
 * smallest key) in *best_key and its count in *best_count. */
static void count_pairs(const words *w, pair_slot *tab, uint64_t mask, uint32_t stamp, uint64_t *best_key,
                        int *best_count) {
    *best_count = 0;
    *best_key = 0;
    for (int i = 0; i < w->n; i++) {
        const int32_t *s = w->sym + w->start[i];
        for (int k = 0; k + 1 < w->len[i]; k++) {
            uint64_t key = (uint64_t)(uint32_t)s[k] << 32 | (uint32_t)s[k + 1];
            uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
            while (tab[h].stamp == stamp && tab[h].key != key) h = (h + 1) & mask;
            if (tab[h].stamp != stamp) tab[h] = (pair_slot){.key = key, .count = 0, .stamp = stamp};
            int c = ++tab[h].count;
            if (c > *best_count || (c == *best_count && key < *best_key)) {
                *best_count = c;
                *best_key = key;
            }
        }
    }
}

/* Replaces every (l, r) in every word, left to right, by id. */
static void apply_merge(words *w, int l, int r, int id) {
    for (int i = 0; i < w->n; i++) {
        int32_t *s = w->sym + w->start[i];
        int j = 0;
        for (int k = 0; k < w->len[i]; k++) {
            if (k + 1 < w->len[i] && s[k] == l && s[k + 1] == r) {
                s[j++] = id;
                k++;
            } else
                s[j++] = s[k];
        }
        w->len[i] = j;
    }
}

/* Learns merges from the corpus until the vocabulary is full or no pair occurs twice. */
static ps_status train(builder *b) {
    words w = {0};
    size_t cap = 1;
    while (cap < 4 * sizeof corpus) cap *= 2;
    pair_slot *tab = calloc(cap, sizeof *tab);
    ps_status st = tab ? words_init(&w) : PS_ERR_NOMEM;
    for (uint32_t round = 1; st == PS_OK && b->n_tok < b->limit; round++) {
        uint64_t key;
        int count, id;
        count_pairs(&w, tab, cap - 1, round, &key, &count);
        if (count < 2) break;
        int l = (int)(key >> 32), r = (int)(uint32_t)key;
        st = merge_pair(b, l, r, &id);
        if (st == PS_ERR_ARG) { /* cannot happen with this corpus; stop learning instead */
            st = PS_OK;
            break;
        }
        if (st == PS_OK) apply_merge(&w, l, r, id);
    }
    free(tab);
    words_free(&w);
    return st;
}

/* Adds merges (tokens[l], letter) for every lowercase letter whose result is new, while
 * the vocabulary has room. */
static ps_status extend_with_letters(builder *b, int l) {
    for (int c = 'a'; c <= 'z' && b->n_tok < b->limit; c++) {
        const char *ls = b->buf + b->tok[l];
        size_t ln = strlen(ls);
        char tmp[256];
        if (ln + 1 >= sizeof tmp) break;
        memcpy(tmp, ls, ln);
        tmp[ln] = (char)c;
        if (find_token(b, tmp, ln + 1) >= 0) continue;
        int id;
        ps_status st = merge_pair(b, l, c, &id);
        if (st && st != PS_ERR_ARG) return st;
    }
    return PS_OK;
}

/* Fills the vocabulary up to b->limit with synthetic merges (token, lowercase letter): first
 * for the byte tokens of space and of the letters (so that " q", "qu" exist), then for every
 * merged token in id order, new ones included. */
static ps_status fill_synthetic(builder *b) {
    static const char firsts[] = " abcdefghijklmnopqrstuvwxyz";
    ps_status st = PS_OK;
    for (const char *f = firsts; *f && !st; f++) st = extend_with_letters(b, (uint8_t)*f);
    for (int cursor = 256; !st && b->n_tok < b->limit; cursor++) {
        if (cursor >= b->n_tok) return PS_ERR_INTERNAL;
        st = extend_with_letters(b, cursor);
    }
    return st;
}

// ---------------------------------------------------------------------------------------
// Public

/* Allocates the builder's tables for n_tokens tokens and adds the 256 byte symbols. */
static ps_status builder_init(builder *b, int n_tokens) {
    memset(b, 0, sizeof *b);
    b->limit = n_tokens - PS_CLI_SYNTH_N_SPECIAL;
    uint64_t cap = 1;
    while (cap < 2 * (uint64_t)n_tokens) cap *= 2;
    b->mask = cap - 1;
    b->tok = malloc((size_t)n_tokens * sizeof *b->tok);
    b->slot = malloc(cap * sizeof *b->slot);
    if (!b->tok || !b->slot) return PS_ERR_NOMEM;
    memset(b->slot, 0xFF, cap * sizeof *b->slot);
    for (int i = 0; i < 256; i++) {
        char sym[3];
        int id;
        byte_symbol(i, sym);
        ps_status st = add_token(b, sym, strlen(sym), &id);
        if (st) return st;
    }
    return PS_OK;
}

/* Moves the builder's strings into v (pointer arrays into the arena). */
static ps_status builder_finish(builder *b, ps_cli_synth_vocab *v) {
    int n = b->n_tok;
    v->tokens = malloc((size_t)n * sizeof *v->tokens);
    v->types = malloc((size_t)n * sizeof *v->types);
    v->merges = malloc(((size_t)b->n_merge + 1) * sizeof *v->merges);
    if (!v->tokens || !v->types || !v->merges) return PS_ERR_NOMEM;
    v->arena = b->buf;
    b->buf = NULL;
    for (int i = 0; i < n; i++) {
        v->tokens[i] = v->arena + b->tok[i];
        v->types[i] = i >= b->limit ? 3 : 1;
    }
    for (int i = 0; i < b->n_merge; i++) v->merges[i] = v->arena + b->merge[i];
    v->n_tokens = n;
    v->n_merges = b->n_merge;
    v->bos = v->pad = b->limit;
    v->eos = b->limit + 2;
    return PS_OK;
}

/* See synth.h. */
ps_status ps_cli_synth_vocab_build(int n_tokens, ps_cli_synth_vocab *v, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    if (n_tokens < 256 + PS_CLI_SYNTH_N_SPECIAL)
        return ps_errf(err, errlen, PS_ERR_ARG, "a vocabulary needs at least %d tokens, got %d",
                       256 + PS_CLI_SYNTH_N_SPECIAL, n_tokens);
    builder b;
    ps_status st = builder_init(&b, n_tokens);
    if (!st) st = train(&b);
    if (!st) st = fill_synthetic(&b);
    for (int i = 0; !st && i < PS_CLI_SYNTH_N_SPECIAL; i++) {
        int id;
        st = add_token(&b, specials[i], strlen(specials[i]), &id);
    }
    if (!st) st = builder_finish(&b, v);
    free(b.buf);
    free(b.tok);
    free(b.merge);
    free(b.slot);
    if (st) {
        ps_cli_synth_vocab_free(v);
        return ps_errf(err, errlen, st, "cannot build a vocabulary of %d tokens: %s", n_tokens, ps_strerror(st));
    }
    return PS_OK;
}

/* See synth.h. */
void ps_cli_synth_vocab_free(ps_cli_synth_vocab *v) {
    free(v->tokens);
    free(v->types);
    free(v->merges);
    free(v->arena);
    memset(v, 0, sizeof *v);
}
