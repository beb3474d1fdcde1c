/* server.c - listening, libmicrohttpd's callbacks, routing, the API key, request bodies, and
 * the wait for a request's events (server.h).
 *
 * libmicrohttpd runs one thread per connection, so a connection's thread may block: a
 * non-streaming completion waits in the access handler for its DONE event, a streaming one in
 * the response's reader callback for the next tokens. Both wait in slices of WAIT_MS and look
 * at the socket between them: a peer that hung up (POLLRDHUP) gets its request cancelled, and
 * the thread still waits for the DONE that follows within a step, because the request's
 * events go to memory the thread owns. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server_internal.h"

#define WAIT_MS   50 /* a waiting connection looks at its socket this often */
#define MAX_DEPTH 64 /* JSON bodies nested deeper are refused before parsing */

const int sv_codes[SV_N_CODES] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 505, 431};

// ---------------------------------------------------------------------------------------
// A request's events

/* What one completion's connection thread and the engine share. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_event *ev; /* (n) events not yet taken, in order */
    size_t n, cap;
    sv_event done;       /* the DONE event, once has_done */
    bool has_done, lost; /* lost: an event could not be copied (out of memory) */
    /* the connection thread's */
    ps_server *sv;
    uint64_t id;
    int fd;         /* the client's socket, watched for a hang-up */
    bool cancelled; /* ps_sched_cancel was called */
    bool gone;      /* the client hung up */
    bool finished;  /* the DONE event was taken */
    sv_request r;
    sv_response a;
    sv_buf out; /* streaming: bytes not yet handed to libmicrohttpd */
    size_t out_pos;
} gen;

/* Frees what an event copy holds (not the event itself). */
static void event_free(sv_event *e) {
    free(e->text);
    free(e->error);
}

/* Copies ev off the engine thread (a DONE event never fails to be kept). */
static void on_event(void *ctx, const ps_sched_event *ev) {
    gen *g = ctx;
    sv_event e = {.kind = ev->kind,
                  .len = ev->len,
                  .token = ev->token,
                  .logprob = ev->logprob,
                  .n_top = ev->n_top,
                  .stop = ev->stop,
                  .status = ev->status,
                  .stats = ev->stats,
                  .prefix = ev->prefix};
    bool ok = true;
    if (ev->len && !(e.text = ps_strndup(ev->text, ev->len))) ok = false, e.len = 0;
    if (ev->error) e.error = ps_strdup(ev->error);
    for (int i = 0; i < ev->n_top; i++) e.top_ids[i] = ev->top_ids[i], e.top_lp[i] = ev->top_logprobs[i];
    pthread_mutex_lock(&g->mu);
    if (ev->kind == PS_SCHED_DONE) {
        g->done = e, g->has_done = true;
    } else if (ok && g->n == g->cap) {
        size_t cap = 2 * g->cap + 16;
        sv_event *t = ps_realloc(g->ev, cap * sizeof *t);
        if (t) g->ev = t, g->cap = cap;
        ok = t != NULL;
    }
    if (ev->kind == PS_SCHED_TOKEN && ok) g->ev[g->n++] = e;
    if (ev->kind == PS_SCHED_TOKEN && !ok) g->lost = true, event_free(&e);
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* A new gen for request r (taken over: r is cleared) of sv on the client socket fd. */
static gen *gen_create(ps_server *sv, sv_request *r, int fd) {
    gen *g = ps_calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->sv = sv, g->fd = fd, g->r = *r;
    g->r.req.prompt = g->r.ids;
    for (int i = 0; i < PS_STOP_MAX_STRINGS; i++) g->r.req.stop[i] = g->r.stops[i];
    *r = (sv_request){0};
    sv_response_init(&g->a, sv, &g->r);
    atomic_fetch_add(&sv->active, 1);
    return g;
}

/* Frees g; its request must be done (or never submitted). */
static void gen_free(gen *g) {
    for (size_t i = 0; i < g->n; i++) event_free(&g->ev[i]);
    free(g->ev);
    if (g->has_done) event_free(&g->done);
    sv_response_free(&g->a);
    sv_api_request_free(&g->r);
    sv_buf_free(&g->out);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    atomic_fetch_sub(&g->sv->active, 1);
    free(g);
}

/* Whether the client hung up (or its socket failed). */
static bool hung_up(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Cancels g's request once. */
static void gen_cancel(gen *g) {
    if (!g->cancelled) ps_sched_cancel(g->sv->sched, g->id);
    g->cancelled = true;
}

/* Takes g's new events into the response (chunks into g->out when streaming); waits up to
 * WAIT_MS for some when there are none, and cancels the request when the client hung up or
 * an event was lost. */
static void gen_pump(gen *g) {
    pthread_mutex_lock(&g->mu);
    if (!g->n && !g->has_done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    sv_event *ev = g->ev;
    size_t n = g->n;
    bool done = g->has_done, lost = g->lost;
    g->ev = NULL, g->n = g->cap = 0;
    pthread_mutex_unlock(&g->mu);
    for (size_t i = 0; i < n; i++) {
        if (!g->gone) sv_response_token(&g->a, &ev[i], &g->out);
        event_free(&ev[i]);
    }
    free(ev);
    if (done) { /* nothing more comes: has_done and g->done stay as they are */
        if (!g->gone && !(g->done.stop == PS_STOP_CANCELLED && !g->done.status))
            sv_response_done(&g->a, &g->done, &g->out);
        g->finished = true;
        return;
    }
    if (!g->gone && hung_up(g->fd)) g->gone = true;
    if (g->gone || lost || g->out.oom) gen_cancel(g);
}

// ---------------------------------------------------------------------------------------
// Responses

/* Queues a response with body (malloc'd, taken; NULL: out of memory) and an optional header. */
static enum MHD_Result respond(ps_server *sv, struct MHD_Connection *c, int status, const char *ctype, char *body,
                               size_t len, const char *hname, const char *hvalue) {
    if (!body) {
        status = 500, body = ps_strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        if (!body) return MHD_NO;
        len = strlen(body), ctype = "application/json", hname = NULL;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (hname) MHD_add_response_header(r, hname, hvalue);
    enum MHD_Result q = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    int k = 0;
    while (k < SV_N_CODES && sv_codes[k] != status) k++;
    atomic_fetch_add(&sv->responses[k], 1);
    return q;
}

/* A JSON body. */
static enum MHD_Result respond_json(ps_server *sv, struct MHD_Connection *c, int status, char *json) {
    return respond(sv, c, status, "application/json", json, json ? strlen(json) : 0, NULL, NULL);
}

/* An error in OpenAI's shape, with the headers its status asks for. */
static enum MHD_Result respond_error(ps_server *sv, struct MHD_Connection *c, const sv_error *e, const char *allow) {
    char *j = sv_error_json(e);
    size_t len = j ? strlen(j) : 0;
    if (e->status == 503 || e->status == 429)
        return respond(sv, c, e->status, "application/json", j, len, "Retry-After", "1");
    if (e->status == 401) return respond(sv, c, e->status, "application/json", j, len, "WWW-Authenticate", "Bearer");
    if (e->status == 405) return respond(sv, c, e->status, "application/json", j, len, "Allow", allow);
    return respond(sv, c, e->status, "application/json", j, len, NULL, NULL);
}

// ---------------------------------------------------------------------------------------
// Completions

/* The error for a status from ps_sched_submit. */
static void submit_error(ps_status st, const char *msg, bool chat, sv_error *e) {
    if (st == PS_ERR_BUSY)
        sv_fail(e, 503, NULL, "server_overloaded", "%s; try again later", msg);
    else if (st == PS_ERR_RANGE)
        sv_fail(e, 400, chat ? "messages" : "prompt", "context_length_exceeded", "%s", msg);
    else if (st == PS_ERR_ARG || st == PS_ERR_UNSUPPORTED)
        sv_fail(e, 400, NULL, "invalid_value", "%s", msg);
    else
        sv_fail(e, 500, NULL, NULL, "%s", msg);
}

/* The error of a request that ended without a text: failed, or cancelled by a shutdown. */
static void done_error(const sv_event *d, sv_error *e) {
    if (d->status)
        sv_fail(e, 500, NULL, NULL, "generation failed: %s", d->error ? d->error : ps_strerror(d->status));
    else
        sv_fail(e, 503, NULL, "server_shutting_down", "the request was cancelled: the server is shutting down");
}

/* libmicrohttpd's reader of a streaming response: the next bytes of server-sent events. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    for (;;) {
        if (g->out_pos < g->out.len) {
            size_t n = g->out.len - g->out_pos < max ? g->out.len - g->out_pos : max;
            memcpy(buf, g->out.s + g->out_pos, n);
            if ((g->out_pos += n) == g->out.len) g->out_pos = g->out.len = 0;
            return (ssize_t)n;
        }
        if (g->finished && g->has_done && g->done.stop == PS_STOP_CANCELLED && !g->done.status && !g->gone) {
            sv_error e; /* cancelled by a shutdown: say so, then end */
            done_error(&g->done, &e);
            char *j = sv_error_json(&e);
            sv_buf_addf(&g->out, "data: %s\n\ndata: [DONE]\n\n", j ? j : "{}");
            free(j);
            g->done.stop = PS_STOP_NONE; /* said once */
            continue;
        }
        if (g->finished) return g->gone ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        gen_pump(g);
    }
}

/* libmicrohttpd is done with a streaming response (sent, or the client went away). */
static void stream_free(void *cls) {
    gen *g = cls;
    if (!g->finished) g->gone = true;
    while (!g->finished) gen_pump(g); /* cancelled: its DONE comes within a step */
    gen_free(g);
}

/* Waits for a non-streaming request's end and answers with the whole completion. */
static enum MHD_Result complete_whole(ps_server *sv, struct MHD_Connection *c, gen *g) {
    while (!g->finished) gen_pump(g);
    enum MHD_Result q = MHD_NO; /* the client hung up: close */
    sv_error e;
    if (!g->gone && (g->done.status || g->done.stop == PS_STOP_CANCELLED)) {
        done_error(&g->done, &e);
        q = respond_error(sv, c, &e, NULL);
    } else if (!g->gone) {
        q = respond_json(sv, c, 200, sv_response_body(&g->a, &g->done));
    }
    gen_free(g);
    return q;
}

/* Whether JSON text s[0..n) nests arrays and objects at most MAX_DEPTH deep (strings skipped). */
static bool depth_ok(const char *s, size_t n) {
    int depth = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                str = false;
        } else if (ch == '"') {
            str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > MAX_DEPTH) return false;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return true;
}

/* The JSON of a request body, checked first for UTF-8 and nesting; NULL with e filled. */
static cJSON *body_json(const sv_buf *body, sv_error *e) {
    const char *text = body->s ? body->s : "";
    if (!sv_utf8_valid(text, body->len))
        return sv_fail(e, 400, NULL, "invalid_json", "the request body is not valid UTF-8"), NULL;
    if (!depth_ok(text, body->len))
        return sv_fail(e, 400, NULL, "invalid_json", "the JSON body nests deeper than %d levels", MAX_DEPTH), NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, body->len, &end, false);
    if (!j) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        sv_fail(e, 400, NULL, "invalid_json",
                body->len ? "the body is not valid JSON (at byte %zu of %zu)"
                          : "the body is empty: a JSON object is expected",
                at, body->len);
    }
    return j;
}

/* The request in body (a completion, chat or not, or with prefix a capture) checked, parsed
 * and submitted, as a gen on c's socket; NULL with e filled. */
static gen *submit(ps_server *sv, struct MHD_Connection *c, const sv_buf *body, bool chat, bool prefix, sv_error *e) {
    cJSON *j = body_json(body, e);
    if (!j) return NULL;
    sv_request r;
    bool ok = prefix ? sv_api_parse_prefix(sv, j, &r, e) : sv_api_parse(sv, chat, j, &r, e);
    cJSON_Delete(j);
    if (!ok) {
        sv_api_request_free(&r);
        return NULL;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    gen *g = gen_create(sv, &r, ci ? ci->connect_fd : -1);
    if (!g) {
        sv_api_request_free(&r);
        sv_fail(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    char err[512] = "";
    ps_status st = ps_sched_submit(sv->sched, &g->r.req, on_event, g, &g->id, err, sizeof err);
    if (st) {
        submit_error(st, err[0] ? err : ps_strerror(st), g->r.chat, e);
        gen_free(g);
        return NULL;
    }
    return g;
}

/* POST /v1/chat/completions and /v1/completions: the body checked, parsed and validated, the
 * request submitted, and its completion sent whole or as a stream. */
static enum MHD_Result handle_completion(ps_server *sv, struct MHD_Connection *c, bool chat, const sv_buf *body) {
    sv_error e;
    gen *g = submit(sv, c, body, chat, false, &e);
    if (!g) return respond_error(sv, c, &e, NULL);
    if (!g->r.stream) return complete_whole(sv, c, g);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, g, stream_free);
    if (!resp) {
        stream_free(g); /* cancels and waits */
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result q = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp); /* stream_free runs when libmicrohttpd is done with it */
    atomic_fetch_add(&sv->responses[0], 1);
    return q;
}

// ---------------------------------------------------------------------------------------
// Other endpoints

/* GET /v1/models: the one model. */
static enum MHD_Result handle_models(ps_server *sv, struct MHD_Connection *c) {
    cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddStringToObject(m, "id", sv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)sv->started);
    cJSON_AddStringToObject(m, "owned_by", "pipeshard");
    cJSON_AddNumberToObject(m, "context_length", sv->n_ctx);
    cJSON_AddNumberToObject(m, "stages", sv->n_stages);
    cJSON_AddItemToArray(data, m);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return respond_json(sv, c, 200, s);
}

/* POST /v1/prefixes: runs a prompt and saves its keys and values on every stage (sched.h,
 * capture); answers with the prefix's id once it is saved. */
static enum MHD_Result handle_prefix_new(ps_server *sv, struct MHD_Connection *c, const sv_buf *body) {
    sv_error e;
    gen *g = submit(sv, c, body, false, true, &e);
    if (!g) return respond_error(sv, c, &e, NULL);
    while (!g->finished) gen_pump(g);
    enum MHD_Result q = MHD_NO; /* the client hung up: close */
    const sv_event *d = &g->done;
    if (!g->gone && (d->status || d->stop == PS_STOP_CANCELLED)) {
        if (d->status)
            sv_fail(&e, 500, NULL, NULL, "the prefix was not saved: %s", d->error ? d->error : ps_strerror(d->status));
        else
            done_error(d, &e);
        q = respond_error(sv, c, &e, NULL);
    } else if (!g->gone) {
        char *s = ps_malloc(256);
        if (s)
            snprintf(s, 256,
                     "{\"id\":\"%016llx\",\"object\":\"prefix\",\"prompt_tokens\":%d,\"saved_tokens\":%d,"
                     "\"stages\":%d,\"created\":%lld}",
                     (unsigned long long)d->prefix, d->stats.n_prompt, d->stats.n_prompt / PS_KV_BLOCK * PS_KV_BLOCK,
                     sv->n_stages, (long long)time(NULL));
        q = respond_json(sv, c, 200, s);
    }
    gen_free(g);
    return q;
}

/* GET /v1/prefixes: the captured prefixes and whether each is in the KV cache. */
static enum MHD_Result handle_prefixes(ps_server *sv, struct MHD_Connection *c) {
    int n = ps_sched_prefixes(sv->sched, NULL, 0);
    ps_sched_prefix *p = ps_calloc((size_t)(n ? n : 1), sizeof *p);
    int now = p ? ps_sched_prefixes(sv->sched, p, n) : 0; /* one captured meanwhile waits for the next list */
    if (now < n) n = now;
    cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data");
    cJSON_AddStringToObject(j, "object", "list");
    static const char *const state[] = {
        [PS_PREFIX_RESTORED] = "restored", [PS_PREFIX_CAPTURED] = "captured", [PS_PREFIX_REFUSED] = "not_restored"};
    for (int i = 0; p && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        char id[17];
        snprintf(id, sizeof id, "%016llx", (unsigned long long)p[i].id);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "prefix");
        cJSON_AddNumberToObject(o, "tokens", p[i].n_tokens);
        cJSON_AddNumberToObject(o, "stages", p[i].n_stages);
        cJSON_AddNumberToObject(o, "created", (double)p[i].created);
        cJSON_AddStringToObject(o, "status", p[i].state ? state[p[i].state] : "not_restored");
        if (p[i].why[0]) cJSON_AddStringToObject(o, "reason", p[i].why);
        cJSON_AddItemToArray(data, o);
    }
    char *s = p ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    free(p);
    return respond_json(sv, c, 200, s);
}

/* GET /health. */
static enum MHD_Result handle_health(ps_server *sv, struct MHD_Connection *c) {
    ps_sched_metrics m;
    ps_sched_metrics_get(sv->sched, &m);
    char *s = ps_malloc(128);
    if (s) snprintf(s, 128, "{\"status\":\"ok\",\"queued\":%d,\"running\":%d}", m.queued, m.running);
    return respond_json(sv, c, 200, s);
}

/* GET /metrics. */
static enum MHD_Result handle_metrics(ps_server *sv, struct MHD_Connection *c) {
    sv_buf b = {0};
    sv_metrics_text(sv, &b);
    if (b.oom) sv_buf_free(&b);
    return respond(sv, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.s, b.len, NULL, NULL);
}

/* GET /: the chat page. */
static enum MHD_Result handle_page(ps_server *sv, struct MHD_Connection *c) {
    char *s = ps_malloc(ps_server_chat_html_len + 1);
    if (s) memcpy(s, ps_server_chat_html, ps_server_chat_html_len);
    return respond(sv, c, 200, "text/html; charset=utf-8", s, ps_server_chat_html_len, NULL, NULL);
}

// ---------------------------------------------------------------------------------------
// Routing

enum route { R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS, R_PAGE, R_PREFIX_NEW, R_PREFIXES };

static const struct {
    const char *path;
    bool post; /* POST, else GET (and HEAD) */
    bool key;  /* needs the API key when the server has one */
} routes[] = {
    [R_CHAT] = {"/v1/chat/completions", true, true}, [R_COMPLETIONS] = {"/v1/completions", true, true},
    [R_MODELS] = {"/v1/models", false, true},        [R_HEALTH] = {"/health", false, false},
    [R_METRICS] = {"/metrics", false, true},         [R_PAGE] = {"/", false, false},
    [R_PREFIX_NEW] = {"/v1/prefixes", true, true},   [R_PREFIXES] = {"/v1/prefixes", false, true},
};

/* One connection's request: its route and body. */
typedef struct {
    int route; /* -1: answered already (an error found with the headers); the body is dropped */
    sv_buf body;
    bool too_big;
} conn_req;

/* Whether the request carries the server's key as "Authorization: Bearer KEY" (compared as
 * BLAKE2b hashes in constant time, so that neither the bytes nor the length leak). */
static bool authorized(const ps_server *sv, struct MHD_Connection *c, sv_error *e) {
    if (!sv->has_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7))
        return sv_fail(e, 401, NULL, "missing_api_key",
                       "this server needs an API key: send the header 'Authorization: Bearer KEY'");
    uint8_t hash[32];
    crypto_generichash(hash, sizeof hash, (const uint8_t *)h + 7, strlen(h + 7), NULL, 0);
    if (sodium_memcmp(hash, sv->key_hash, sizeof hash))
        return sv_fail(e, 401, NULL, "invalid_api_key", "the API key is not this server's");
    return true;
}

/* The first call for a request: route, method, key and declared size; a response now for
 * any of them that fails (rq->route is then -1). */
static enum MHD_Result first_call(ps_server *sv, struct MHD_Connection *c, const char *url, const char *method,
                                  conn_req *rq) {
    sv_error e;
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), known = false;
    int route = -1;
    char allow[32] = "";
    rq->route = -1;
    for (int k = 0; k < (int)PS_ARRAY_LEN(routes) && route < 0; k++) {
        if (strcmp(url, routes[k].path)) continue;
        known = true;
        if (routes[k].post ? post : get) route = k;
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s", n ? ", " : "", routes[k].post ? "POST" : "GET, HEAD");
    }
    if (!known) {
        sv_fail(&e, 404, NULL, "unknown_url", "no endpoint at %.200s (see GET /v1/models, POST /v1/chat/completions)",
                url);
        return respond_error(sv, c, &e, NULL);
    }
    if (route < 0) {
        sv_fail(&e, 405, NULL, "method_not_allowed", "%.200s takes %s, not %.20s", url, allow, method);
        return respond_error(sv, c, &e, allow);
    }
    if (routes[route].key && !authorized(sv, c, &e)) return respond_error(sv, c, &e, NULL);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > PS_SERVER_MAX_BODY) {
        sv_fail(&e, 413, NULL, "request_too_large", "the body has %.30s bytes; this server takes at most %u", cl,
                PS_SERVER_MAX_BODY);
        return respond_error(sv, c, &e, NULL);
    }
    rq->route = route;
    return MHD_YES;
}

/* libmicrohttpd's access handler: called once with the headers, then for every piece of the
 * body, then once more with none. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    ps_server *sv = cls;
    conn_req *rq = *con_cls;
    if (!rq) {
        if (!(rq = ps_calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        return first_call(sv, c, url, method, rq);
    }
    if (*upload_data_size) { /* a piece of the body */
        if (rq->route < 0 || rq->body.len + *upload_data_size > PS_SERVER_MAX_BODY)
            rq->too_big = true;
        else
            sv_buf_add(&rq->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    sv_error e;
    if (rq->route < 0) return MHD_YES; /* answered with the headers */
    if (rq->too_big) {
        sv_fail(&e, 413, NULL, "request_too_large", "the body is larger than %u bytes", PS_SERVER_MAX_BODY);
        return respond_error(sv, c, &e, NULL);
    }
    if (rq->body.oom) return sv_fail(&e, 500, NULL, NULL, "out of memory"), respond_error(sv, c, &e, NULL);
    switch (rq->route) {
    case R_CHAT: return handle_completion(sv, c, true, &rq->body);
    case R_COMPLETIONS: return handle_completion(sv, c, false, &rq->body);
    case R_MODELS: return handle_models(sv, c);
    case R_HEALTH: return handle_health(sv, c);
    case R_METRICS: return handle_metrics(sv, c);
    case R_PREFIX_NEW: return handle_prefix_new(sv, c, &rq->body);
    case R_PREFIXES: return handle_prefixes(sv, c);
    default: return handle_page(sv, c);
    }
}

/* libmicrohttpd ended a request: frees what on_request kept for it. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_req *rq = *con_cls;
    if (!rq) return;
    sv_buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

// ---------------------------------------------------------------------------------------
// Start and stop

/* Loads the API key (the file's first line, trimmed) and keeps its hash. */
static ps_status load_key(ps_server *sv, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return ps_errf(err, errlen, PS_ERR_IO, "cannot open the API key file '%s': %s", path, strerror(errno));
    char line[4096];
    size_t n = fgets(line, sizeof line, f) ? strlen(line) : 0;
    fclose(f);
    char *s = line;
    while (n && strchr(" \t\r\n", s[n - 1])) n--;
    while (n && strchr(" \t", *s)) s++, n--;
    if (!n) return ps_errf(err, errlen, PS_ERR_ARG, "the API key file '%s' is empty", path);
    crypto_generichash(sv->key_hash, sizeof sv->key_hash, (const uint8_t *)s, n, NULL, 0);
    sodium_memzero(line, sizeof line);
    sv->has_key = true;
    return PS_OK;
}

/* Binds and listens on host:port; the socket into sv->listen_fd, the port into sv->port. */
static ps_status listen_on(ps_server *sv, const char *host, int port, bool *ipv6, char *err, size_t errlen) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res, *a;
    int rc = getaddrinfo(host, ps, &hints, &res), e = 0;
    if (rc) return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s:%d: %s", host, port, gai_strerror(rc));
    sv->listen_fd = -1;
    for (a = res; a && sv->listen_fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol), one = 1;
        if (fd < 0) continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128)) {
            e = errno;
            close(fd);
            continue;
        }
        sv->listen_fd = fd, *ipv6 = a->ai_family == AF_INET6;
    }
    freeaddrinfo(res);
    if (sv->listen_fd < 0)
        return ps_errf(err, errlen, PS_ERR_NET, "cannot listen on %s:%d: %s", host, port, strerror(e ? e : EINVAL));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(sv->listen_fd, (struct sockaddr *)&ss, &sl);
    sv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    return PS_OK;
}

/* The model's id: the given name, else general.name, else "pipeshard". */
static char *model_name(const ps_model *m, const char *given) {
    ps_gguf_str s;
    if (given) return ps_strdup(given);
    if (ps_gguf_get_str(m->gguf, "general.name", &s, NULL, 0) == PS_OK && s.len && s.len < 256)
        return ps_strndup(s.data, s.len);
    return ps_strdup("pipeshard");
}

ps_status ps_server_start(ps_launch *l, ps_sched *s, const ps_server_opts *o, ps_server **out, char *err,
                          size_t errlen) {
    *out = NULL;
    if (!ps_launch_tok(l)) return ps_errf(err, errlen, PS_ERR_ARG, "the server needs the model's tokenizer");
    if (sodium_init() < 0) return ps_errf(err, errlen, PS_ERR_INTERNAL, "libsodium failed to start");
    ps_server *sv = ps_calloc(1, sizeof *sv);
    if (!sv) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_coord *coord = ps_launch_coord(l);
    sv->launch = l, sv->sched = s, sv->tok = ps_launch_tok(l), sv->model = ps_coord_model(coord);
    sv->n_ctx = ps_coord_n_ctx(coord), sv->n_stages = ps_coord_n_stages(coord), sv->listen_fd = -1;
    sv->started = (long long)time(NULL);
    sv->model_name = model_name(sv->model, o->model_name);
    sv->chat_template = o->chat_template ? ps_strdup(o->chat_template) : NULL;
    ps_status st = !sv->model_name || (o->chat_template && !sv->chat_template)
                       ? ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory")
                       : PS_OK;
    bool ipv6 = false;
    if (!st && o->api_key_file) st = load_key(sv, o->api_key_file, err, errlen);
    if (!st) st = listen_on(sv, o->host ? o->host : "127.0.0.1", o->port, &ipv6, err, errlen);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC;
    if (!st && !(sv->mhd = MHD_start_daemon(flags | (ipv6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL, on_request, sv,
                                            MHD_OPTION_LISTEN_SOCKET, sv->listen_fd, MHD_OPTION_NOTIFY_COMPLETED,
                                            on_completed, sv, MHD_OPTION_CONNECTION_LIMIT,
                                            (unsigned)(o->max_connections > 0 ? o->max_connections : 256),
                                            MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_END)))
        st = ps_errf(err, errlen, PS_ERR_NET, "cannot start the HTTP server on port %d", sv->port);
    if (st) {
        ps_server_stop(sv);
        return st;
    }
    *out = sv;
    return PS_OK;
}

int ps_server_port(const ps_server *sv) { return sv->port; }

void ps_server_stop(ps_server *sv) {
    if (!sv) return;
    if (sv->mhd) {
        int fd = MHD_quiesce_daemon(sv->mhd); /* no new connections */
        ps_sched_close(sv->sched);            /* requests in flight end now (cancelled) */
        for (int i = 0; i < 5000 / WAIT_MS && atomic_load(&sv->active); i++)
            usleep(WAIT_MS * 1000); /* their clients get told so, for up to 5 s */
        MHD_stop_daemon(sv->mhd);   /* closes the connections, joins their threads */
        if (fd >= 0) close(fd);
    } else if (sv->listen_fd >= 0) {
        close(sv->listen_fd);
    }
    sodium_memzero(sv->key_hash, sizeof sv->key_hash);
    free(sv->model_name);
    free(sv->chat_template);
    free(sv);
}
