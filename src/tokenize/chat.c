/* chat.c - chat template families: detection, variant details, rendering (see chat.h).
 *
 * Template texts are searched after resolving the escapes of Jinja string literals
 * (normalize), with small patterns in which QT stands for either quote character, WS
 * for optional whitespace and CONTENT for message['content'] / message["content"] /
 * message.content. */
#include "chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ---- families ----------------------------------------------------------------------

static const char *const family_names[PS_CHAT_FAMILY_COUNT] = {
    "chatml", "llama2", "mistral", "llama3", "gemma", "phi3", "zephyr",
};
#define NAME_LIST "chatml, llama2, mistral, llama3, gemma, phi3, zephyr"

/* The family's usual BOS / EOS text, for callers that pass none. */
static const char *const default_bos[PS_CHAT_FAMILY_COUNT] = {
    "", "<s>", "<s>", "<|begin_of_text|>", "<bos>", "<s>", "<s>",
};
static const char *const default_eos[PS_CHAT_FAMILY_COUNT] = {
    "<|im_end|>", "</s>", "</s>", "<|eot_id|>", "<eos>", "<|endoftext|>", "</s>",
};

struct ps_chat {
    ps_chat_family family;
    bool bos;              // the template writes bos_token
    char *bos_text;        // owned
    char *eos_text;        // owned
    char *default_system;  // chatml: written when the first message is not system; owned or NULL
    bool m_lead_space;     // mistral: " [INST]" (Mistral's updated v0.2 template)
    bool m_inst_space;     // mistral: "[INST] " (all but the tekken-style templates)
    bool m_close_space;    // mistral: " [/INST]" (v0.1, v0.2)
    bool m_sys_last;       // mistral: the system text goes before the last message (v0.3)
    bool m_asst_space;     // mistral: " " + content
    bool m_asst_trim;      // mistral: content|trim (v0.3)
    bool m_eos_space;      // mistral: eos_token + " " (v0.1)
    char *l3_cutoff;       // llama3.1+: "December 2023" of its system header; NULL for 3.0
    char *l3_date;         // llama3.1+: the template's default date_string
    bool p_eos_no_gen;     // phi3: eos_token when add_generation_prompt is false
    bool p_legacy;         // phi3: the user turn ends with "<|assistant|>\n"; no system, no gen
    bool p_skip_empty_sys; // phi3.5: an empty system message writes nothing
};

const char *ps_chat_family_name(ps_chat_family f) {
    return (unsigned)f < PS_CHAT_FAMILY_COUNT ? family_names[f] : "unknown";
}

ps_status ps_chat_family_from_name(const char *name, ps_chat_family *out, char *err, size_t errlen) {
    for (int f = 0; name && f < PS_CHAT_FAMILY_COUNT; f++)
        if (strcmp(name, family_names[f]) == 0) {
            *out = (ps_chat_family)f;
            return PS_OK;
        }
    return ps_errf(err, errlen, PS_ERR_ARG, "unknown chat template name '%s'; use one of: " NAME_LIST,
                   name ? name : "(null)");
}

// ---- template text ----------------------------------------------------------------

#define QT      "\x03" /* ' or " */
#define WS      "\x04" /* optional whitespace */
#define CONTENT "\x05" /* the message content expression */
#define ESC_SQ  '\x01' /* an escaped ' inside a literal, after normalize */
#define ESC_DQ  '\x02' /* an escaped " */

/* The escape character backslash-c stands for in a Jinja literal, or 0. */
static char unescape(char c) {
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case '\\': return '\\';
    case '\'': return ESC_SQ;
    case '"': return ESC_DQ;
    default: return 0;
    }
}

/* A malloc'd copy of template text t with literal escapes resolved, so that a newline
 * written "\n" or raw matches one pattern and an escaped quote never ends a literal
 * (it becomes ESC_SQ / ESC_DQ). NULL when out of memory. */
static char *normalize(const char *t) {
    char *o = ps_malloc(strlen(t) + 1), *q = o;
    if (!o) return NULL;
    for (const char *p = t; *p; p++) {
        char r = *p == '\\' ? unescape(p[1]) : 0;
        if (r) p++;
        *q++ = r ? r : *p;
    }
    *q = '\0';
    return o;
}

/* The end of a content expression at h, or NULL. */
static const char *match_content(const char *h) {
    static const char *const forms[] = {"message['content']", "message[\"content\"]", "message.content"};
    for (size_t i = 0; i < PS_ARRAY_LEN(forms); i++)
        if (strncmp(h, forms[i], strlen(forms[i])) == 0) return h + strlen(forms[i]);
    return NULL;
}

/* The end of pattern p matched at h, or NULL. */
static const char *match_at(const char *h, const char *p) {
    for (; *p; p++) {
        if (*p == QT[0]) {
            if (*h != '\'' && *h != '"') return NULL;
            h++;
        } else if (*p == WS[0]) {
            while (*h == ' ' || *h == '\n' || *h == '\t' || *h == '\r') h++;
        } else if (*p == CONTENT[0]) {
            if (!(h = match_content(h))) return NULL;
        } else if (*h++ != *p) {
            return NULL;
        }
    }
    return h;
}

/* Where pattern p first matches in h, or NULL. */
static const char *find(const char *h, const char *p) {
    for (; *h; h++)
        if (match_at(h, p)) return h;
    return NULL;
}

/* Whether pattern p matches anywhere in h. */
static bool has(const char *h, const char *p) { return find(h, p) != NULL; }

/* A malloc'd copy of [s, e) with ESC_SQ / ESC_DQ turned back into quotes. */
static char *dup_text(const char *s, const char *e) {
    char *o = ps_malloc((size_t)(e - s) + 1);
    if (!o) return NULL;
    for (size_t i = 0; s + i < e; i++) o[i] = s[i] == ESC_SQ ? '\'' : s[i] == ESC_DQ ? '"' : s[i];
    o[e - s] = '\0';
    return o;
}

/* Whether [s, e) lies inside one string literal: no quote or brace in it. */
static bool plain_text(const char *s, const char *e) {
    for (; s < e; s++)
        if (strchr("'\"{}", *s)) return false;
    return true;
}

// ---- detection ----------------------------------------------------------------------

/* Phi-3's shape: a role tag followed by a newline (Phi-4-mini has none). */
static bool phi3_shape(const char *t) {
    return has(t, "<|assistant|>") &&
           (has(t, "<|user|>\n") || has(t, "<|user|>" QT WS "+" WS QT "\n") || has(t, "|>" QT WS "+" WS QT "\n"));
}

/* Zephyr's shape: '<|user|>\n' + content + eos_token (Tulu's, without eos, differs). */
static bool zephyr_shape(const char *t) {
    return has(t, "<|assistant|>") && has(t, "<|user|>\n" QT WS "+" WS CONTENT WS "+" WS "eos_token");
}

/* The family of normalized template text t; false when none fits. */
static bool classify(const char *t, ps_chat_family *f) {
    if (has(t, "<|im_start|>")) {
        *f = PS_CHAT_CHATML;
        return has(t, "<|im_end|>") && !has(t, "<|im_sep|>"); /* Phi-4 uses <|im_sep|> */
    }
    if (has(t, "<|start_header_id|>")) {
        *f = PS_CHAT_LLAMA3;
        return has(t, "<|end_header_id|>");
    }
    if (has(t, "<start_of_turn>")) {
        *f = PS_CHAT_GEMMA;
        return true;
    }
    if (has(t, "[INST]")) {
        *f = has(t, "<<SYS>>") ? PS_CHAT_LLAMA2 : PS_CHAT_MISTRAL;
        return has(t, "[/INST]") && !has(t, "[SYSTEM_PROMPT]"); /* Mistral v7 templates differ */
    }
    if (has(t, "<|end|>")) {
        *f = PS_CHAT_PHI3;
        return phi3_shape(t);
    }
    *f = PS_CHAT_ZEPHYR;
    return has(t, "<|user|>") && zephyr_shape(t);
}

/* The error for a template of no known family, quoting its first 40 bytes. */
static ps_status unrecognised(const char *tmpl, char *err, size_t errlen) {
    char head[48];
    size_t n = 0;
    for (; tmpl[n] && n < 40; n++) head[n] = (unsigned char)tmpl[n] < 0x20 ? ' ' : tmpl[n];
    while (n > 0 && ((unsigned char)head[n - 1] & 0xC0) == 0x80) n--; /* no cut UTF-8 tail */
    if (n > 0 && (unsigned char)head[n - 1] >= 0xC0) n--;
    head[n] = '\0';
    return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                   "unrecognised chat template (starts with '%s%s'); pass --chat-template NAME, one of: " NAME_LIST,
                   head, tmpl[n] ? "..." : "");
}

/* The error for a model without a chat template: names the --chat-template choices. */
static ps_status no_template(char *err, size_t errlen) {
    return ps_errf(
        err, errlen, PS_ERR_NOT_FOUND,
        "the model has no chat template (tokenizer.chat_template); pass --chat-template NAME, one of: " NAME_LIST);
}

ps_status ps_chat_detect(const char *tmpl, ps_chat_family *out, char *err, size_t errlen) {
    if (!tmpl || !*tmpl) return no_template(err, errlen);
    char *t = normalize(tmpl);
    if (!t) return ps_errf(err, errlen, PS_ERR_NOMEM, "no memory to read the chat template");
    ps_chat_family f;
    bool ok = classify(t, &f);
    free(t);
    if (!ok) return unrecognised(tmpl, err, errlen);
    *out = f;
    return PS_OK;
}

// ---- variant details ----------------------------------------------------------------

/* ChatML: the literal '<|im_start|>system\n<text><|im_end|>' that SmolLM2 and Qwen 2.x
 * write when the first message is not system; its text, or NULL (none or no memory). */
static char *chatml_default_system(const char *t) {
    static const char tag[] = "<|im_start|>system\n";
    for (const char *p = strstr(t, tag); p; p = strstr(p + 1, tag)) {
        const char *s = p + strlen(tag), *e = strstr(s, "<|im_end|>");
        if (p > t && (p[-1] == '\'' || p[-1] == '"') && e && e > s && plain_text(s, e)) return dup_text(s, e);
    }
    return NULL;
}

/* The literal text after marker up to a newline or quote, malloc'd; NULL if absent. */
static char *text_after(const char *t, const char *marker) {
    const char *s = strstr(t, marker);
    if (!s) return NULL;
    s += strlen(marker);
    const char *e = s + strcspn(s, "\n'\"");
    return dup_text(s, e);
}

/* Llama 3.1+: the knowledge cutoff and default date of the system header. */
static ps_status llama3_details(ps_chat *c, const char *t) {
    if (!has(t, "Cutting Knowledge Date: ")) return PS_OK;
    c->l3_cutoff = text_after(t, "Cutting Knowledge Date: ");
    const char *d = find(t, "date_string" WS "=" WS QT);
    if (d) {
        const char *s = match_at(d, "date_string" WS "=" WS QT);
        c->l3_date = dup_text(s, s + strcspn(s, "'\"\n"));
    } else {
        static const char fallback[] = "26 Jul 2024"; /* the templates' own fallback */
        c->l3_date = dup_text(fallback, fallback + strlen(fallback));
    }
    return c->l3_cutoff && c->l3_date ? PS_OK : PS_ERR_NOMEM;
}

/* Mistral: which spaces, trims and system placement the template's version writes. */
static void mistral_details(ps_chat *c, const char *t) {
    c->m_lead_space = has(t, QT " [INST]");
    c->m_inst_space = has(t, "[INST] ");
    c->m_close_space = has(t, " [/INST]");
    c->m_sys_last = has(t, "loop.last and system_message");
    c->m_asst_space = has(t, QT " " QT WS "+" WS CONTENT);
    c->m_asst_trim = has(t, CONTENT WS "|" WS "trim");
    c->m_eos_space = has(t, "eos_token" WS "+" WS QT " " QT);
}

/* Whether the template writes eos_token in the else branch of add_generation_prompt. */
static bool eos_in_else(const char *t) {
    static const char *const forms[] = {"else" WS "%}" WS "{{" WS "eos_token", "else" WS "%}" WS "{{-" WS "eos_token",
                                        "else" WS "-%}" WS "{{" WS "eos_token",
                                        "else" WS "-%}" WS "{{-" WS "eos_token"};
    for (size_t i = 0; i < PS_ARRAY_LEN(forms); i++)
        if (has(t, forms[i])) return true;
    return false;
}

/* Phi-3: the legacy user-turn shape, eos without a generation prompt, empty systems skipped. */
static void phi3_details(ps_chat *c, const char *t) {
    c->p_eos_no_gen = eos_in_else(t);
    c->p_legacy = has(t, "<|end|>" QT WS "+" WS QT "\n" QT WS "+" WS QT "<|assistant|>");
    c->p_skip_empty_sys = has(t, QT "system" QT WS "and" WS CONTENT);
}

/* Reads the variant details of family c->family from normalized template text t. */
static ps_status read_details(ps_chat *c, const char *t) {
    c->bos = has(t, "bos_token");
    switch (c->family) {
    case PS_CHAT_CHATML: c->default_system = chatml_default_system(t); return PS_OK;
    case PS_CHAT_MISTRAL: mistral_details(c, t); return PS_OK;
    case PS_CHAT_LLAMA3: return llama3_details(c, t);
    case PS_CHAT_PHI3: phi3_details(c, t); return PS_OK;
    default: return PS_OK;
    }
}

/* The canonical variant of a family chosen by name. */
static void canonical_details(ps_chat *c) {
    c->bos = c->family == PS_CHAT_LLAMA2 || c->family == PS_CHAT_MISTRAL || c->family == PS_CHAT_LLAMA3 ||
             c->family == PS_CHAT_GEMMA;
    if (c->family == PS_CHAT_MISTRAL) { /* v0.3 */
        c->m_inst_space = c->m_sys_last = c->m_asst_space = c->m_asst_trim = true;
    }
    if (c->family == PS_CHAT_PHI3) c->p_eos_no_gen = c->p_skip_empty_sys = true; /* Phi-3.5 */
}

// ---- create / free ------------------------------------------------------------------

/* dup_text of a whole string; NULL for NULL or out of memory. */
static char *dup_str(const char *s) { return s ? dup_text(s, s + strlen(s)) : NULL; }

/* Fills c (family set) from the template or canonically, then the BOS/EOS texts. */
static ps_status fill(ps_chat *c, const char *tmpl, const char *bos, const char *eos) {
    if (tmpl) {
        char *t = normalize(tmpl);
        if (!t) return PS_ERR_NOMEM;
        ps_status st = read_details(c, t);
        free(t);
        if (st) return st;
    } else {
        canonical_details(c);
    }
    c->bos_text = dup_str(bos ? bos : default_bos[c->family]);
    c->eos_text = dup_str(eos ? eos : default_eos[c->family]);
    return c->bos_text && c->eos_text ? PS_OK : PS_ERR_NOMEM;
}

ps_status ps_chat_create(const char *tmpl, const char *name, const char *bos, const char *eos, ps_chat **out, char *err,
                         size_t errlen) {
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_chat_create: out is NULL");
    *out = NULL;
    ps_chat_family f;
    ps_status st = name ? ps_chat_family_from_name(name, &f, err, errlen) : ps_chat_detect(tmpl, &f, err, errlen);
    if (st) return st;
    ps_chat *c = ps_calloc(1, sizeof *c);
    if (!c) return ps_errf(err, errlen, PS_ERR_NOMEM, "no memory for a chat template");
    c->family = f;
    if ((st = fill(c, name ? NULL : tmpl, bos, eos))) {
        ps_chat_free(c);
        return ps_errf(err, errlen, st, "no memory for a chat template");
    }
    *out = c;
    return PS_OK;
}

void ps_chat_free(ps_chat *c) {
    if (!c) return;
    free(c->bos_text);
    free(c->eos_text);
    free(c->default_system);
    free(c->l3_cutoff);
    free(c->l3_date);
    free(c);
}

ps_chat_family ps_chat_get_family(const ps_chat *c) { return c->family; }
bool ps_chat_writes_bos(const ps_chat *c) { return c->bos; }
const char *ps_chat_default_system(const ps_chat *c) { return c->default_system; }

// ---- output and text helpers --------------------------------------------------------

/* Bounded output that counts everything it was given. */
typedef struct {
    char *buf;          // NULL when only measuring
    size_t cap;         // bytes of buf usable for text (buflen - 1)
    size_t len;         // bytes written or that would have been
    ps_tok_span *spans; // (n_spans) where the contents went, or NULL: only counted
    size_t n_spans;
} sink;

/* Appends s[0..n): copies what fits in k->buf (if any), counts all n bytes. */
static void put_n(sink *k, const char *s, size_t n) {
    if (k->buf && k->len < k->cap) memcpy(k->buf + k->len, s, n < k->cap - k->len ? n : k->cap - k->len);
    k->len += n;
}

/* put_n of a NUL-terminated string. */
static void put(sink *k, const char *s) { put_n(k, s, strlen(s)); }

/* Appends a message's content s[0..n) and records where it went (a literal span: text from
 * a user, never read as special tokens). */
static void put_lit(sink *k, const char *s, size_t n) {
    if (!n) return;
    if (k->spans) k->spans[k->n_spans] = (ps_tok_span){k->len, n};
    k->n_spans++;
    put_n(k, s, n);
}

/* put_lit of a NUL-terminated content. */
static void put_content(sink *k, const char *s) { put_lit(k, s, strlen(s)); }

/* Whether the 3-byte UTF-8 sequence at s is one of Python's whitespace characters
 * (U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). */
static bool ws3(const unsigned char *s) {
    if (s[0] == 0xE1) return s[1] == 0x9A && s[2] == 0x80;
    if (s[0] == 0xE2 && s[1] == 0x80) return s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF;
    if (s[0] == 0xE2) return s[1] == 0x81 && s[2] == 0x9F;
    return s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80;
}

/* Byte length of the whitespace character (str.isspace) that starts at s, or 0;
 * n bytes are available. */
static size_t ws_len(const unsigned char *s, size_t n) {
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1C && s[0] <= 0x1F))) return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n >= 3 && ws3(s)) return 3;
    return 0;
}

/* Byte length of the whitespace character that ends at s + n, or 0. */
static size_t ws_len_back(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (ws_len(s + n - k, k) == k) return k;
    return 0;
}

/* Python's str.strip() on s, as [*b, *b + *n): leading / trailing as asked. */
static void strip(const char *s, bool lead, bool trail, const char **b, size_t *n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t len = strlen(s), k;
    while (lead && (k = ws_len(u, len))) u += k, len -= k;
    while (trail && (k = ws_len_back(u, len))) len -= k;
    *b = (const char *)u;
    *n = len;
}

/* Appends content s with Python's str.strip() applied (the templates' content|trim). */
static void put_strip(sink *k, const char *s) {
    const char *b;
    size_t n;
    strip(s, true, true, &b, &n);
    put_lit(k, b, n);
}

// ---- messages -----------------------------------------------------------------------

enum role { R_SYSTEM, R_USER, R_ASSISTANT };

/* The role of a message already checked by check_messages. */
static enum role role_of(const ps_chat_msg *m) {
    return m->role[0] == 's' ? R_SYSTEM : m->role[0] == 'u' ? R_USER : R_ASSISTANT;
}

/* Checks that there is a message and each has a known role and content; names the first bad one. */
static ps_status check_messages(const ps_chat_msg *m, size_t n, char *err, size_t errlen) {
    if (!m || n == 0) return ps_errf(err, errlen, PS_ERR_ARG, "a chat needs at least one message");
    for (size_t i = 0; i < n; i++) {
        const char *r = m[i].role;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
            return ps_errf(err, errlen, PS_ERR_ARG, "message %zu has role '%s'; supported: system, user, assistant", i,
                           r ? r : "(null)");
        if (!m[i].content) return ps_errf(err, errlen, PS_ERR_ARG, "message %zu (%s) has no content", i, r);
    }
    return PS_OK;
}

/* The rule of llama2, mistral and gemma templates: an optional leading system
 * message, then user and assistant alternating, starting with user. */
static ps_status check_alternation(const ps_chat *c, const ps_chat_msg *m, size_t n, char *err, size_t errlen) {
    size_t start = role_of(&m[0]) == R_SYSTEM;
    for (size_t i = start; i < n; i++) {
        enum role want = (i - start) % 2 == 0 ? R_USER : R_ASSISTANT;
        if (role_of(&m[i]) != want)
            return ps_errf(err, errlen, PS_ERR_ARG,
                           "message %zu is a %s message where the %s template expects %s: after an optional "
                           "first system message, user and assistant messages must alternate, starting with user",
                           i, m[i].role, family_names[c->family], want == R_USER ? "user" : "assistant");
    }
    return PS_OK;
}

// ---- rendering, one function per family ---------------------------------------------

/* ChatML: "<|im_start|>role\ncontent<|im_end|>\n" per message, after the default system text if any. */
static void render_chatml(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    if (c->bos) put(k, c->bos_text);
    if (c->default_system && role_of(&m[0]) != R_SYSTEM) {
        put(k, "<|im_start|>system\n");
        put(k, c->default_system);
        put(k, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        put(k, "<|im_start|>");
        put(k, m[i].role);
        put(k, "\n");
        put_content(k, m[i].content);
        put(k, "<|im_end|>\n");
    }
    if (gen) put(k, "<|im_start|>assistant\n");
}

/* Llama 2's first user turn: ("<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + content).strip(). */
static void put_llama2_first(sink *k, const char *sys, const char *content) {
    const char *b;
    size_t len;
    put(k, "<<SYS>>\n");
    put_content(k, sys);
    put(k, "\n<</SYS>>");
    strip(content, false, true, &b, &len);
    if (len) put(k, "\n\n");
    put_lit(k, b, len);
}

/* Llama 2: "[INST] user [/INST] assistant </s>", the system text inside the first user turn. */
static void render_llama2(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    (void)gen; /* the template writes no generation prompt */
    size_t start = role_of(&m[0]) == R_SYSTEM;
    for (size_t i = start; i < n; i++) {
        if (role_of(&m[i]) == R_USER) {
            if (c->bos) put(k, c->bos_text);
            put(k, "[INST] ");
            if (i == 1 && start)
                put_llama2_first(k, m[0].content, m[i].content);
            else
                put_strip(k, m[i].content);
            put(k, " [/INST]");
        } else {
            put(k, " ");
            put_strip(k, m[i].content);
            put(k, " ");
            put(k, c->eos_text);
        }
    }
}

/* A Mistral user turn, with sys (when non-NULL) before its content; spacing per variant. */
static void put_mistral_user(const ps_chat *c, const char *sys, const char *content, sink *k) {
    put(k, c->m_lead_space ? " [INST]" : "[INST]");
    if (c->m_inst_space) put(k, " ");
    if (sys) {
        put_content(k, sys);
        put(k, "\n\n");
    }
    put_content(k, content);
    put(k, c->m_close_space ? " [/INST]" : "[/INST]");
}

/* A Mistral assistant turn followed by eos; spacing and trim per variant. */
static void put_mistral_assistant(const ps_chat *c, const char *content, sink *k) {
    if (c->m_asst_space) put(k, " ");
    if (c->m_asst_trim)
        put_strip(k, content);
    else
        put_content(k, content);
    put(k, c->eos_text);
    if (c->m_eos_space) put(k, " ");
}

/* Mistral: [INST] turns, the system text in the first or (v0.3) the last user turn. */
static void render_mistral(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    (void)gen; /* the template writes no generation prompt */
    size_t start = role_of(&m[0]) == R_SYSTEM;
    const char *sys = start ? m[0].content : NULL;
    if (c->bos) put(k, c->bos_text);
    for (size_t i = start; i < n; i++) {
        bool here = sys && (c->m_sys_last ? i == n - 1 : i == start);
        if (role_of(&m[i]) == R_USER)
            put_mistral_user(c, here ? sys : NULL, m[i].content, k);
        else
            put_mistral_assistant(c, m[i].content, k);
    }
}

/* "<|start_header_id|>role<|end_header_id|>\n\n". */
static void put_llama3_header(sink *k, const char *role) {
    put(k, "<|start_header_id|>");
    put(k, role);
    put(k, "<|end_header_id|>\n\n");
}

/* Llama 3.1+: the system header is always there, with the cutoff and date lines. */
static void put_llama31_system(const ps_chat *c, const char *sys, sink *k) {
    put_llama3_header(k, "system");
    put(k, "Cutting Knowledge Date: ");
    put(k, c->l3_cutoff);
    put(k, "\nToday Date: ");
    put(k, c->l3_date);
    put(k, "\n\n");
    put_strip(k, sys);
    put(k, "<|eot_id|>");
}

/* Llama 3: a header and the stripped content + "<|eot_id|>" per message (3.1+: system header first). */
static void render_llama3(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    size_t start = 0;
    if (c->bos) put(k, c->bos_text);
    if (c->l3_cutoff) {
        start = role_of(&m[0]) == R_SYSTEM;
        put_llama31_system(c, start ? m[0].content : "", k);
    }
    for (size_t i = start; i < n; i++) {
        put_llama3_header(k, m[i].role);
        put_strip(k, m[i].content);
        put(k, "<|eot_id|>");
    }
    if (gen) put_llama3_header(k, "assistant");
}

/* Gemma: user/model turns; a system text goes at the start of the first user turn. */
static void render_gemma(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    size_t start = role_of(&m[0]) == R_SYSTEM;
    if (c->bos) put(k, c->bos_text);
    for (size_t i = start; i < n; i++) {
        put(k, role_of(&m[i]) == R_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == start && start) {
            put_content(k, m[0].content);
            put(k, "\n\n");
        }
        put_strip(k, m[i].content);
        put(k, "<end_of_turn>\n");
    }
    if (gen) put(k, "<start_of_turn>model\n");
}

/* Phi-3's first template: "<|user|>\n" + content + "<|end|>\n<|assistant|>\n" per user
 * turn, assistant contents + "<|end|>\n", system messages dropped. */
static void render_phi3_legacy(const ps_chat_msg *m, size_t n, sink *k) {
    for (size_t i = 0; i < n; i++) {
        enum role r = role_of(&m[i]);
        if (r == R_SYSTEM) continue;
        if (r == R_USER) put(k, "<|user|>\n");
        put_content(k, m[i].content);
        put(k, r == R_USER ? "<|end|>\n<|assistant|>\n" : "<|end|>\n");
    }
}

/* Phi-3: "<|role|>\ncontent<|end|>\n" per message (or the legacy shape). */
static void render_phi3(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    if (c->bos) put(k, c->bos_text);
    if (c->p_legacy) {
        render_phi3_legacy(m, n, k);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (c->p_skip_empty_sys && role_of(&m[i]) == R_SYSTEM && !m[i].content[0]) continue;
        put(k, "<|");
        put(k, m[i].role);
        put(k, "|>\n");
        put_content(k, m[i].content);
        put(k, "<|end|>\n");
    }
    if (gen)
        put(k, "<|assistant|>\n");
    else if (c->p_eos_no_gen)
        put(k, c->eos_text);
}

/* Zephyr: "<|role|>\ncontent" + eos + "\n" per message. */
static void render_zephyr(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k) {
    if (c->bos) put(k, c->bos_text);
    for (size_t i = 0; i < n; i++) {
        put(k, "<|");
        put(k, m[i].role);
        put(k, "|>\n");
        put_content(k, m[i].content);
        put(k, c->eos_text);
        put(k, "\n");
    }
    if (gen) put(k, "<|assistant|>\n");
}

typedef void (*render_fn)(const ps_chat *, const ps_chat_msg *, size_t, bool, sink *);
static const render_fn renderers[PS_CHAT_FAMILY_COUNT] = {
    render_chatml, render_llama2, render_mistral, render_llama3, render_gemma, render_phi3, render_zephyr,
};

/* Validates the messages for c's family and renders them into k. */
static ps_status render(const ps_chat *c, const ps_chat_msg *m, size_t n, bool gen, sink *k, char *err, size_t errlen) {
    if (!c) return ps_errf(err, errlen, PS_ERR_ARG, "chat template is NULL");
    ps_status st = check_messages(m, n, err, errlen);
    if (st) return st;
    if (c->family == PS_CHAT_LLAMA2 || c->family == PS_CHAT_MISTRAL || c->family == PS_CHAT_GEMMA)
        if ((st = check_alternation(c, m, n, err, errlen))) return st;
    renderers[c->family](c, m, n, gen, k);
    return PS_OK;
}

ps_status ps_chat_apply(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt, char *buf,
                        size_t buflen, size_t *len, char *err, size_t errlen) {
    sink k = {.buf = buf && buflen ? buf : NULL, .cap = buflen ? buflen - 1 : 0};
    if (len) *len = 0;
    if (buf && buflen) buf[0] = '\0';
    ps_status st = render(c, msgs, n, add_generation_prompt, &k, err, errlen);
    if (st) return st;
    if (k.buf) k.buf[k.len < k.cap ? k.len : k.cap] = '\0';
    if (len) *len = k.len;
    if (buf && k.len > k.cap)
        return ps_errf(err, errlen, PS_ERR_RANGE, "the chat prompt needs %zu bytes and a NUL; the buffer has %zu",
                       k.len, buflen);
    return PS_OK;
}

ps_status ps_chat_apply_spans(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt,
                              char **out, size_t *len, ps_tok_span **spans, size_t *n_spans, char *err, size_t errlen) {
    if (!out || !spans || !n_spans) return ps_errf(err, errlen, PS_ERR_ARG, "ps_chat_apply_spans: NULL output");
    *out = NULL, *spans = NULL, *n_spans = 0;
    sink k = {0};
    ps_status st = render(c, msgs, n, add_generation_prompt, &k, err, errlen); /* measures */
    if (st) return st;
    char *text = ps_malloc(k.len + 1);
    ps_tok_span *sp = ps_malloc((k.n_spans ? k.n_spans : 1) * sizeof *sp);
    if (!text || !sp) {
        free(text), free(sp);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "no memory for a chat prompt of %zu bytes", k.len);
    }
    k = (sink){.buf = text, .cap = k.len, .spans = sp};
    render(c, msgs, n, add_generation_prompt, &k, err, errlen); /* the same messages: succeeds again */
    text[k.len] = '\0';
    if (len) *len = k.len;
    *out = text, *spans = sp, *n_spans = k.n_spans;
    return PS_OK;
}

ps_status ps_chat_apply_alloc(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt,
                              char **out, size_t *len, char *err, size_t errlen) {
    size_t need = 0;
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_chat_apply_alloc: out is NULL");
    *out = NULL;
    ps_status st = ps_chat_apply(c, msgs, n, add_generation_prompt, NULL, 0, &need, err, errlen);
    if (st) return st;
    char *s = ps_malloc(need + 1);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "no memory for a chat prompt of %zu bytes", need);
    if ((st = ps_chat_apply(c, msgs, n, add_generation_prompt, s, need + 1, len, err, errlen))) {
        free(s);
        return st;
    }
    *out = s;
    return PS_OK;
}
