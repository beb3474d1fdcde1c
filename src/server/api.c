/* api.c - OpenAI's completion API: request bodies in (every known field type- and
 * range-checked, unknown fields ignored as OpenAI does), completion objects and stream chunks
 * out (server_internal.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server_internal.h"

// ---------------------------------------------------------------------------------------
// Strings, UTF-8 and errors

void sv_buf_add(sv_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = 2 * (b->len + n + 1) + 256;
        char *t = ps_realloc(b->s, cap);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t, b->cap = cap;
    }
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void sv_buf_addf(sv_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) return sv_buf_add(b, small, (size_t)n);
    char *big = ps_malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sv_buf_add(b, big, (size_t)n);
    free(big);
}

void sv_buf_free(sv_buf *b) {
    free(b->s);
    *b = (sv_buf){0};
}

/* The length of the valid UTF-8 character at s (n bytes available), or 0 when it is not one. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
    if (!len || len > n || s[0] > 0xF4) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (len == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0)))
        return 0; /* overlong, surrogate */
    if (len == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90)))
        return 0; /* overlong, > 10FFFF */
    return len;
}

bool sv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_char(u + i, n - i))) return false;
    return true;
}

void sv_utf8_sanitize(sv_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char(u + i, n - i);
        if (k)
            sv_buf_add(b, s + i, k), i += k;
        else
            sv_buf_add(b, "\xef\xbf\xbd", 3), i++;
    }
}

bool sv_fail(sv_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status, e->param = param, e->code = code;
    e->type = status == 401   ? "authentication_error"
              : status == 404 ? "not_found_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

char *sv_error_json(const sv_error *e) {
    cJSON *j = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(j, "error");
    sv_buf m = {0};
    sv_utf8_sanitize(&m, e->message, strlen(e->message)); /* a message may quote the request */
    cJSON_AddStringToObject(o, "message", m.s ? m.s : "");
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param)
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    sv_buf_free(&m);
    return s;
}

// ---------------------------------------------------------------------------------------
// Fields

/* JSON's name of v's type, for messages. */
static const char *type_name(const cJSON *v) {
    return cJSON_IsString(v)   ? "a string"
           : cJSON_IsNumber(v) ? "a number"
           : cJSON_IsBool(v)   ? "a boolean"
           : cJSON_IsArray(v)  ? "an array"
           : cJSON_IsObject(v) ? "an object"
                               : "null";
}

/* Field name of body, or NULL when absent or null (both mean "not given", as OpenAI takes them). */
static const cJSON *field(const cJSON *body, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* The error for a field of the wrong type. */
static bool wrong_type(sv_error *e, const char *name, const char *want, const cJSON *v) {
    return sv_fail(e, 400, name, "invalid_type", "'%s' must be %s, not %s", name, want, type_name(v));
}

/* A number field in [lo, hi] into *out (left alone when absent); false with e filled. */
static bool get_number(const cJSON *body, const char *name, double lo, double hi, double *out, sv_error *e) {
    const cJSON *v = field(body, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v)) return wrong_type(e, name, "a number", v);
    if (!isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return sv_fail(e, 400, name, "invalid_value", "'%s' is %g; it must be between %g and %g", name, v->valuedouble,
                       lo, hi);
    *out = v->valuedouble;
    return true;
}

/* An integer field in [lo, hi] into *out (left alone when absent). */
static bool get_int(const cJSON *body, const char *name, double lo, double hi, long long *out, sv_error *e) {
    const cJSON *v = field(body, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble))
        return wrong_type(e, name, "an integer", v);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return sv_fail(e, 400, name, "invalid_value", "'%s' is %.0f; it must be between %.0f and %.0f", name,
                       v->valuedouble, lo, hi);
    *out = (long long)v->valuedouble;
    return true;
}

/* A boolean field into *out (left alone when absent). */
static bool get_bool(const cJSON *body, const char *name, bool *out, sv_error *e) {
    const cJSON *v = field(body, name);
    if (!v) return true;
    if (!cJSON_IsBool(v)) return wrong_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return true;
}

/* A string field's presence and type (the value itself unused: model, user, ...). */
static bool check_string(const cJSON *body, const char *name, sv_error *e) {
    const cJSON *v = field(body, name);
    return !v || cJSON_IsString(v) || wrong_type(e, name, "a string", v);
}

/* "stop": a string or an array of up to four strings, copied into r. */
static bool get_stop(const cJSON *body, sv_request *r, sv_error *e) {
    const cJSON *v = field(body, "stop"), *s;
    if (!v) return true;
    if (cJSON_IsString(v)) {
        r->stops[0] = ps_strdup(v->valuestring);
        r->req.n_stop = 1;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > PS_STOP_MAX_STRINGS)
            return sv_fail(e, 400, "stop", "invalid_value", "'stop' has %d strings; at most %d", cJSON_GetArraySize(v),
                           PS_STOP_MAX_STRINGS);
        cJSON_ArrayForEach(s, v) {
            if (!cJSON_IsString(s))
                return sv_fail(e, 400, "stop", "invalid_type", "'stop' must hold strings, not %s", type_name(s));
            r->stops[r->req.n_stop++] = ps_strdup(s->valuestring);
        }
    } else {
        return wrong_type(e, "stop", "a string or an array of strings", v);
    }
    for (int i = 0; i < r->req.n_stop; i++) {
        if (!r->stops[i]) return sv_fail(e, 500, NULL, NULL, "out of memory");
        if (strlen(r->stops[i]) > PS_STOP_MAX_BYTES)
            return sv_fail(e, 400, "stop", "invalid_value", "a stop string has %zu bytes; at most %d",
                           strlen(r->stops[i]), PS_STOP_MAX_BYTES);
        r->req.stop[i] = r->stops[i];
    }
    return true;
}

/* The sampling and length fields both endpoints share, into r->req.gp. */
static bool get_sampling(const cJSON *body, sv_request *r, sv_error *e) {
    ps_gen_params *gp = &r->req.gp;
    double t = gp->sp.temperature, tp = gp->sp.top_p, mp = gp->sp.min_p, pp = 0, fp = 0;
    long long tk = 0, n = 1, seed = -1, max = -1, maxc = -1;
    bool seeded = field(body, "seed") != NULL;
    if (!get_number(body, "temperature", 0, 2, &t, e) || !get_number(body, "top_p", 0, 1, &tp, e) ||
        !get_number(body, "min_p", 0, 1, &mp, e) || !get_number(body, "presence_penalty", -2, 2, &pp, e) ||
        !get_number(body, "frequency_penalty", -2, 2, &fp, e) || !get_int(body, "top_k", 0, 1 << 30, &tk, e) ||
        !get_int(body, "n", -1e15, 1e15, &n, e) || !get_int(body, "seed", -9.2e18, 9.2e18, &seed, e) ||
        !get_int(body, "max_tokens", 1, 1 << 30, &max, e) ||
        !get_int(body, "max_completion_tokens", 1, 1 << 30, &maxc, e) ||
        !get_bool(body, "ignore_eos", &gp->ignore_eos, e))
        return false;
    if (n != 1) return sv_fail(e, 400, "n", "invalid_value", "'n' is %lld; this server makes one choice (n = 1)", n);
    if (tp == 0) return sv_fail(e, 400, "top_p", "invalid_value", "'top_p' must be more than 0 (1 keeps every token)");
    gp->sp.temperature = (float)t, gp->sp.top_p = (float)tp, gp->sp.min_p = (float)mp, gp->sp.top_k = (int32_t)tk;
    gp->sp.presence_penalty = (float)pp, gp->sp.frequency_penalty = (float)fp;
    if (seeded)
        gp->sp.seed = (uint64_t)seed & INT64_MAX;
    else if (getrandom(&gp->sp.seed, sizeof gp->sp.seed, 0) != sizeof gp->sp.seed)
        gp->sp.seed = (uint64_t)ps_now_ns();
    gp->n_predict = maxc > 0 ? maxc : max > 0 ? max : -1;
    char err[256];
    if (ps_sample_params_check(&gp->sp, err, sizeof err)) return sv_fail(e, 400, NULL, "invalid_value", "%s", err);
    return true;
}

/* "stream" and "stream_options". */
static bool get_stream(const cJSON *body, sv_request *r, sv_error *e) {
    if (!get_bool(body, "stream", &r->stream, e)) return false;
    const cJSON *so = field(body, "stream_options");
    if (!so) return true;
    if (!cJSON_IsObject(so)) return wrong_type(e, "stream_options", "an object", so);
    const cJSON *u = field(so, "include_usage");
    if (u && !cJSON_IsBool(u)) return wrong_type(e, "stream_options.include_usage", "a boolean", u);
    r->include_usage = u && cJSON_IsTrue(u);
    return true;
}

// ---------------------------------------------------------------------------------------
// Prompts

/* A message's content: a string, or an array of text parts ({"type": "text", "text": ...})
 * joined; null for an assistant message. Into *out (malloc'd). */
static bool message_content(const cJSON *m, int i, bool assistant, char **out, sv_error *e) {
    const cJSON *c = field(m, "content"), *p;
    if (!c && assistant) return (*out = ps_strdup("")) || sv_fail(e, 500, NULL, NULL, "out of memory");
    if (!c) return sv_fail(e, 400, "messages", "invalid_value", "message %d has no content", i);
    if (cJSON_IsString(c)) return (*out = ps_strdup(c->valuestring)) || sv_fail(e, 500, NULL, NULL, "out of memory");
    if (!cJSON_IsArray(c))
        return sv_fail(e, 400, "messages", "invalid_type",
                       "the content of message %d must be a string or an array of "
                       "text parts, not %s",
                       i, type_name(c));
    sv_buf b = {0};
    sv_buf_add(&b, "", 0);
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = field(p, "type"), *text = field(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            sv_buf_free(&b);
            return sv_fail(e, 400, "messages", "invalid_value",
                           "message %d: this server takes text content only ({\"type\": \"text\", \"text\": ...})", i);
        }
        sv_buf_add(&b, text->valuestring, strlen(text->valuestring));
    }
    if (b.oom) sv_buf_free(&b);
    return (*out = b.s) || sv_fail(e, 500, NULL, NULL, "out of memory");
}

/* The prompt ids of a chat body: "messages" through the chat template. */
static bool chat_prompt(const ps_server *sv, const cJSON *body, bool open_turn, sv_request *r, sv_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages"), *m;
    if (!msgs) return sv_fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return wrong_type(e, "messages", "an array", msgs);
    int n = cJSON_GetArraySize(msgs), i = 0;
    if (n < 1) return sv_fail(e, 400, "messages", "invalid_value", "'messages' is empty");
    ps_chat_msg *cm = ps_calloc((size_t)n, sizeof *cm);
    char **texts = ps_calloc((size_t)n, sizeof *texts);
    bool ok = cm && texts ? true : sv_fail(e, 500, NULL, NULL, "out of memory");
    cJSON_ArrayForEach(m, msgs) {
        if (!ok) break;
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m)) {
            ok = sv_fail(e, 400, "messages", "invalid_type", "message %d must be an object, not %s", i, type_name(m));
        } else if (!cJSON_IsString(role)) {
            ok = sv_fail(e, 400, "messages", "invalid_value", "message %d needs a 'role' string", i);
        } else {
            const char *ro = role->valuestring;
            cm[i].role = !strcmp(ro, "developer") ? "system" : ro; /* OpenAI's newer name for system */
            if (strcmp(cm[i].role, "system") && strcmp(ro, "user") && strcmp(ro, "assistant"))
                ok = sv_fail(e, 400, "messages", "invalid_value",
                             "message %d has role '%.64s'; supported: system, developer, user, assistant", i, ro);
            else if ((ok = message_content(m, i, !strcmp(ro, "assistant"), &texts[i], e)))
                cm[i].content = texts[i];
        }
        i++;
    }
    char err[512] = "";
    size_t n_ids = 0;
    if (ok) {
        ps_status st = ps_session_chat_tokens(sv->tok, sv->model, cm, (size_t)n, sv->chat_template, open_turn, &r->ids,
                                              &n_ids, err, sizeof err);
        if (st == PS_ERR_NOMEM)
            ok = sv_fail(e, 500, NULL, NULL, "%s", err);
        else if (st)
            ok = sv_fail(e, 400, "messages", "invalid_value", "%s", err);
    }
    for (int k = 0; texts && k < n; k++) free(texts[k]);
    free(texts), free(cm);
    r->req.prompt = r->ids, r->req.n_prompt = (int)n_ids;
    return ok;
}

/* The prompt ids of a completions body: "prompt" as a string (tokenized with BOS, special
 * strings as text, as `pipeshard run -p`), an array of one string, or an array of ids. */
static bool text_prompt(const ps_server *sv, const cJSON *body, sv_request *r, sv_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt"), *x;
    if (!p) return sv_fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0))) p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) {
        size_t len = strlen(p->valuestring), cap = len + 16, n_ids = 0;
        char err[256] = "";
        if (!(r->ids = ps_malloc(cap * sizeof *r->ids))) return sv_fail(e, 500, NULL, NULL, "out of memory");
        ps_status st = ps_tok_encode(sv->tok, p->valuestring, len, true, false, r->ids, cap, &n_ids, err, sizeof err);
        if (st) return sv_fail(e, 400, "prompt", NULL, "%s", err);
        r->req.prompt = r->ids, r->req.n_prompt = (int)n_ids;
        return true;
    }
    if (!cJSON_IsArray(p)) return wrong_type(e, "prompt", "a string or an array", p);
    if (n > 0 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        return sv_fail(e, 400, "prompt", "invalid_value", "'prompt' holds %d strings; this server takes one", n);
    if (!(r->ids = ps_malloc((size_t)(n ? n : 1) * sizeof *r->ids)))
        return sv_fail(e, 500, NULL, NULL, "out of memory");
    int i = 0;
    cJSON_ArrayForEach(x, p) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= ps_tok_n_vocab(sv->tok))
            return sv_fail(e, 400, "prompt", "invalid_value",
                           "'prompt' as an array must hold token ids (integers 0 to %d)", ps_tok_n_vocab(sv->tok) - 1);
        r->ids[i++] = (int32_t)x->valuedouble;
    }
    r->req.prompt = r->ids, r->req.n_prompt = n;
    return true;
}

/* Log-probability fields: chat's "logprobs" (boolean) and "top_logprobs" (0..20);
 * completions' "logprobs" (an integer 0..20: how many of the most likely). */
static bool get_logprobs(const cJSON *body, sv_request *r, sv_error *e) {
    long long top = -1;
    if (r->chat) {
        if (!get_bool(body, "logprobs", &r->logprobs, e) ||
            !get_int(body, "top_logprobs", 0, PS_SCHED_MAX_TOP_LOGPROBS, &top, e))
            return false;
        if (top >= 0 && !r->logprobs)
            return sv_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
        r->req.top_logprobs = r->logprobs ? (top > 0 ? (int)top : 0) : -1;
    } else {
        if (!get_int(body, "logprobs", 0, PS_SCHED_MAX_TOP_LOGPROBS, &top, e)) return false;
        r->logprobs = top >= 0;
        r->req.top_logprobs = (int)top;
    }
    return true;
}

/* The completions fields this server does not do: echo, suffix, best_of > 1. */
static bool refuse_unsupported(const cJSON *body, sv_error *e) {
    bool echo = false;
    long long best_of = 1;
    const cJSON *suffix = field(body, "suffix");
    if (!get_bool(body, "echo", &echo, e) || !get_int(body, "best_of", 1, 1e9, &best_of, e)) return false;
    if (suffix && !cJSON_IsString(suffix)) return wrong_type(e, "suffix", "a string", suffix);
    if (echo) return sv_fail(e, 400, "echo", "unsupported_value", "'echo' is not supported by this server");
    if (suffix && suffix->valuestring[0])
        return sv_fail(e, 400, "suffix", "unsupported_value", "'suffix' is not supported by this server");
    if (best_of != 1)
        return sv_fail(e, 400, "best_of", "unsupported_value", "this server makes one choice (best_of 1)");
    return true;
}

/* Whether r's prompt is neither empty nor longer than the context. */
static bool prompt_fits(const ps_server *sv, const sv_request *r, sv_error *e) {
    const char *param = r->chat ? "messages" : "prompt";
    if (r->req.n_prompt < 1) return sv_fail(e, 400, param, "invalid_value", "the prompt is empty");
    if (r->req.n_prompt > sv->n_ctx)
        return sv_fail(e, 400, param, "context_length_exceeded",
                       "the prompt has %d tokens, more than the context size of %d", r->req.n_prompt, sv->n_ctx);
    return true;
}

bool sv_api_parse(const ps_server *sv, bool chat, const cJSON *body, sv_request *r, sv_error *e) {
    *r = (sv_request){.chat = chat};
    r->req.gp = (ps_gen_params){.sp = ps_sample_params_default(), .n_predict = -1};
    r->req.top_logprobs = -1;
    if (!cJSON_IsObject(body)) return wrong_type(e, "body", "a JSON object", body);
    if (!check_string(body, "model", e) || !check_string(body, "user", e) || !get_stream(body, r, e) ||
        !get_sampling(body, r, e) || !get_stop(body, r, e) || !get_logprobs(body, r, e) ||
        (!chat && !refuse_unsupported(body, e)))
        return false;
    if (!(chat ? chat_prompt(sv, body, true, r, e) : text_prompt(sv, body, r, e))) return false;
    return prompt_fits(sv, r, e);
}

bool sv_api_parse_prefix(const ps_server *sv, const cJSON *body, sv_request *r, sv_error *e) {
    *r = (sv_request){.chat = cJSON_HasObjectItem(body, "messages")};
    r->req.gp = (ps_gen_params){.sp = ps_sample_params_default()};
    r->req.top_logprobs = -1, r->req.capture = true;
    if (!cJSON_IsObject(body)) return wrong_type(e, "body", "a JSON object", body);
    if (!check_string(body, "model", e)) return false;
    if (r->chat && cJSON_HasObjectItem(body, "prompt"))
        return sv_fail(e, 400, "prompt", "invalid_value", "give 'prompt' or 'messages', not both");
    if (!(r->chat ? chat_prompt(sv, body, false, r, e) : text_prompt(sv, body, r, e))) return false;
    return prompt_fits(sv, r, e);
}

void sv_api_request_free(sv_request *r) {
    free(r->ids);
    for (int i = 0; i < PS_STOP_MAX_STRINGS; i++) free(r->stops[i]);
    *r = (sv_request){0};
}

// ---------------------------------------------------------------------------------------
// Responses

const char *sv_finish_reason(ps_stop_reason r) {
    switch (r) {
    case PS_STOP_EOS:
    case PS_STOP_STOP: return "stop";
    case PS_STOP_LENGTH:
    case PS_STOP_CONTEXT: return "length";
    default: return "cancelled";
    }
}

void sv_response_init(sv_response *a, const ps_server *sv, const sv_request *r) {
    *a = (sv_response){.sv = sv, .r = r, .created = (long long)time(NULL)};
    uint8_t rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) memset(rnd, 0, sizeof rnd);
    int n = snprintf(a->id, sizeof a->id, "%s", r->chat ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof rnd; i++) n += snprintf(a->id + n, sizeof a->id - (size_t)n, "%02x", rnd[i]);
    if (r->logprobs && !r->stream) {
        a->lp = cJSON_CreateObject();
        if (r->chat) {
            cJSON_AddArrayToObject(a->lp, "content");
        } else {
            cJSON_AddArrayToObject(a->lp, "tokens");
            cJSON_AddArrayToObject(a->lp, "token_logprobs");
            cJSON_AddArrayToObject(a->lp, "top_logprobs");
            cJSON_AddArrayToObject(a->lp, "text_offset");
        }
    }
}

void sv_response_free(sv_response *a) {
    sv_buf_free(&a->text);
    cJSON_Delete(a->lp);
    a->lp = NULL;
}

/* A token's text as valid UTF-8 (special tokens as their text) into b (cleared first). */
static void token_string(const ps_server *sv, int32_t id, sv_buf *b, const char **raw, size_t *raw_len) {
    b->len = 0;
    if (ps_tok_piece(sv->tok, id, PS_TOK_DECODE_SPECIAL, raw, raw_len)) *raw = "", *raw_len = 0;
    sv_buf_add(b, "", 0);
    sv_utf8_sanitize(b, *raw, *raw_len);
}

/* Chat's logprobs entry of one token: {token, logprob, bytes, top_logprobs?}. */
static cJSON *chat_lp_entry(const ps_server *sv, int32_t id, float lp, sv_buf *tmp) {
    const char *raw;
    size_t n;
    token_string(sv, id, tmp, &raw, &n);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "token", tmp->s ? tmp->s : "");
    cJSON_AddNumberToObject(o, "logprob", lp);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)raw[i]));
    cJSON_AddItemToObject(o, "bytes", bytes);
    return o;
}

/* The chat logprobs entries of a TOKEN event appended to content. */
static void chat_lp(const ps_server *sv, const sv_event *ev, cJSON *content) {
    sv_buf tmp = {0};
    cJSON *o = chat_lp_entry(sv, ev->token, ev->logprob, &tmp), *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int i = 0; i < ev->n_top; i++)
        cJSON_AddItemToArray(top, chat_lp_entry(sv, ev->top_ids[i], ev->top_lp[i], &tmp));
    cJSON_AddItemToArray(content, o);
    sv_buf_free(&tmp);
}

/* The completions (legacy) logprobs of a TOKEN event appended to lp's four lists. */
static void text_lp(sv_response *a, const sv_event *ev, cJSON *lp) {
    sv_buf tmp = {0};
    const char *raw;
    size_t n;
    token_string(a->sv, ev->token, &tmp, &raw, &n);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(tmp.s ? tmp.s : ""));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)a->text_offset));
    a->text_offset += n;
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < ev->n_top; i++) {
        token_string(a->sv, ev->top_ids[i], &tmp, &raw, &n);
        if (!cJSON_GetObjectItemCaseSensitive(top, tmp.s ? tmp.s : ""))
            cJSON_AddNumberToObject(top, tmp.s ? tmp.s : "", ev->top_lp[i]);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    sv_buf_free(&tmp);
}

/* A usage object. */
static cJSON *usage(const ps_sched_seq_stats *st) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", st->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", st->n_prompt + st->n_generated);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", st->n_cached);
    return u;
}

/* The outer object of a response or chunk: id, object, created, model, choices []. */
static cJSON *envelope(const sv_response *a, bool chunk, cJSON **choices) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", a->id);
    cJSON_AddStringToObject(j, "object",
                            a->r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)a->created);
    cJSON_AddStringToObject(j, "model", a->sv->model_name);
    cJSON_AddNullToObject(j, "system_fingerprint");
    *choices = cJSON_AddArrayToObject(j, "choices");
    return j;
}

/* One choice of a chunk: text (valid UTF-8, NUL-terminated) as delta content or text, the
 * token's logprobs when ev is given and asked for, finish_reason or null. */
static cJSON *chunk_choice(sv_response *a, const char *text, const sv_event *ev, const char *finish) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (a->r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (!a->role_sent) cJSON_AddStringToObject(d, "role", "assistant"), a->role_sent = true;
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON *lp = NULL;
    if (ev && a->r->logprobs) {
        lp = cJSON_CreateObject();
        if (a->r->chat) {
            chat_lp(a->sv, ev, cJSON_AddArrayToObject(lp, "content"));
        } else {
            cJSON_AddArrayToObject(lp, "tokens"), cJSON_AddArrayToObject(lp, "token_logprobs");
            cJSON_AddArrayToObject(lp, "top_logprobs"), cJSON_AddArrayToObject(lp, "text_offset");
            text_lp(a, ev, lp);
        }
    }
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* Appends "data: JSON\n\n" of j to out and frees j. */
static void sse(sv_buf *out, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) {
        out->oom = true;
        return;
    }
    sv_buf_addf(out, "data: %s\n\n", s);
    free(s);
}

/* A chunk with text (len bytes, maybe 0) and ev's logprobs, appended to out. */
static void stream_text(sv_response *a, const char *text, size_t len, const sv_event *ev, sv_buf *out) {
    sv_buf t = {0};
    sv_buf_add(&t, "", 0);
    sv_utf8_sanitize(&t, text, len);
    cJSON *choices, *j = envelope(a, true, &choices);
    cJSON_AddItemToArray(choices, chunk_choice(a, t.s ? t.s : "", ev, NULL));
    a->role_sent = true; /* (completions have no role: the flag says that a chunk went out) */
    sse(out, j);
    sv_buf_free(&t);
}

void sv_response_token(sv_response *a, const sv_event *ev, sv_buf *out) {
    if (a->r->stream) {
        if (ev->len || a->r->logprobs || !a->role_sent) stream_text(a, ev->text ? ev->text : "", ev->len, ev, out);
        return;
    }
    sv_buf_add(&a->text, ev->text ? ev->text : "", ev->len);
    if (a->lp && a->r->chat) chat_lp(a->sv, ev, cJSON_GetObjectItem(a->lp, "content"));
    if (a->lp && !a->r->chat) text_lp(a, ev, a->lp);
}

void sv_response_done(sv_response *a, const sv_event *ev, sv_buf *out) {
    if (!a->r->stream) {
        sv_buf_add(&a->text, ev->text ? ev->text : "", ev->len);
        return;
    }
    if (ev->status) { /* an error after the stream began: an error event, then the end */
        sv_error e;
        sv_fail(&e, 500, NULL, NULL, "generation failed: %s", ev->error ? ev->error : ps_strerror(ev->status));
        char *s = sv_error_json(&e);
        sv_buf_addf(out, "data: %s\n\ndata: [DONE]\n\n", s ? s : "{}");
        free(s);
        return;
    }
    if (ev->len || !a->role_sent) stream_text(a, ev->text ? ev->text : "", ev->len, NULL, out);
    cJSON *choices, *j = envelope(a, true, &choices);
    cJSON_AddItemToArray(choices, chunk_choice(a, a->r->chat ? NULL : "", NULL, sv_finish_reason(ev->stop)));
    cJSON_AddItemToObject(j, "usage", usage(&ev->stats)); /* usage in every response, also here */
    sse(out, j);
    if (a->r->include_usage) { /* OpenAI's usage chunk: no choices */
        j = envelope(a, true, &choices);
        cJSON_AddItemToObject(j, "usage", usage(&ev->stats));
        sse(out, j);
    }
    sv_buf_add(out, "data: [DONE]\n\n", 14);
}

char *sv_response_body(sv_response *a, const sv_event *done) {
    sv_buf t = {0};
    sv_buf_add(&t, "", 0);
    sv_utf8_sanitize(&t, a->text.s ? a->text.s : "", a->text.len);
    cJSON *choices, *j = envelope(a, false, &choices), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (a->r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", t.s ? t.s : "");
        cJSON_AddNullToObject(m, "refusal");
    } else {
        cJSON_AddStringToObject(c, "text", t.s ? t.s : "");
    }
    if (a->lp) {
        cJSON_AddItemToObject(c, "logprobs", a->lp);
        a->lp = NULL;
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", sv_finish_reason(done->stop));
    cJSON_AddItemToArray(choices, c);
    cJSON_AddItemToObject(j, "usage", usage(&done->stats));
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    sv_buf_free(&t);
    return s;
}
