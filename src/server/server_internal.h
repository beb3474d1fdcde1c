/* server_internal.h - what the files of src/server/ share.
 *
 * server.c   listening, libmicrohttpd's callbacks, routing, keys, bodies, waiting for events
 * api.c      OpenAI's request bodies in (validated), completion objects and chunks out
 * metrics.c  the Prometheus text of GET /metrics
 * chat.html  the chat page of GET / (compiled in as ps_server_chat_html by CMake) */
#ifndef PS_SERVER_INTERNAL_H
#define PS_SERVER_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "server.h"

/* The HTTP statuses /metrics counts responses of (others count as "other"). */
#define SV_N_CODES 11
extern const int sv_codes[SV_N_CODES];

struct ps_server {
    ps_launch *launch;
    ps_sched *sched;
    const ps_tok *tok;
    const ps_model *model;
    char *model_name;
    char *chat_template; /* NULL: the model's */
    int n_ctx, n_stages;
    bool has_key;
    uint8_t key_hash[32]; /* BLAKE2b of the API key: compared in constant time */
    struct MHD_Daemon *mhd;
    int listen_fd;
    int port;
    long long started;                       /* unix time, for "created" */
    atomic_ullong responses[SV_N_CODES + 1]; /* by sv_codes, then other */
    atomic_int active;                       /* completions not yet answered in full */
};

// ---- a growing string ------------------------------------------------------------------

typedef struct {
    char *s; /* NUL-terminated; NULL until the first append */
    size_t len, cap;
    bool oom; /* an append failed: the contents are incomplete */
} sv_buf;

void sv_buf_add(sv_buf *b, const char *s, size_t n);
void sv_buf_addf(sv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sv_buf_free(sv_buf *b);

/* Whether s[0..n) is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). */
bool sv_utf8_valid(const char *s, size_t n);
/* s[0..n) as valid UTF-8 appended to b: every invalid byte becomes U+FFFD. */
void sv_utf8_sanitize(sv_buf *b, const char *s, size_t n);

// ---- errors ------------------------------------------------------------------------------

/* An error for the client, in OpenAI's shape. */
typedef struct {
    int status;        /* HTTP status */
    const char *type;  /* "invalid_request_error", "server_error", ... */
    const char *param; /* the request field at fault, or NULL */
    const char *code;  /* "context_length_exceeded", ..., or NULL */
    char message[1024];
} sv_error;

/* Fills e; returns false (for `return sv_fail(...)`). */
bool sv_fail(sv_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *sv_error_json(const sv_error *e);

// ---- requests and responses (api.c) --------------------------------------------------------

/* A completion request, validated. */
typedef struct {
    bool chat;          /* /v1/chat/completions (else /v1/completions) */
    bool stream;        /* server-sent events */
    bool include_usage; /* stream_options.include_usage: a last chunk with usage alone */
    bool logprobs;      /* log-probabilities asked for */
    ps_sched_request req;
    int32_t *ids; /* the prompt (req.prompt), malloc'd */
    char *stops[PS_STOP_MAX_STRINGS];
} sv_request;

/* Reads a completion body (chat or not) into r: every known field type- and range-checked,
 * unknown fields ignored, the prompt rendered and tokenized. False with e filled (400s). */
bool sv_api_parse(const ps_server *sv, bool chat, const cJSON *body, sv_request *r, sv_error *e);
/* Reads a POST /v1/prefixes body: {"prompt": ...} (as /v1/completions takes it) or
 * {"messages": [...]} (rendered as a chat's beginning: no assistant turn opened). */
bool sv_api_parse_prefix(const ps_server *sv, const cJSON *body, sv_request *r, sv_error *e);
void sv_api_request_free(sv_request *r);

/* One event of a request, copied off the engine thread. */
typedef struct {
    ps_sched_event_kind kind;
    char *text; /* malloc'd (NULL: empty) */
    size_t len;
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[PS_SCHED_MAX_TOP_LOGPROBS];
    float top_lp[PS_SCHED_MAX_TOP_LOGPROBS];
    ps_stop_reason stop;
    ps_status status;
    char *error; /* malloc'd, or NULL */
    ps_sched_seq_stats stats;
    uint64_t prefix; /* a capture's prefix id */
} sv_event;

/* A response being built: the whole body, or chunk by chunk. */
typedef struct {
    const ps_server *sv;
    const sv_request *r;
    char id[48];
    long long created;
    bool role_sent; /* chat streams: the first chunk carries the role */
    sv_buf text;    /* the whole text (not streaming) */
    cJSON *lp;      /* the whole logprobs (not streaming), or NULL */
    size_t text_offset;
} sv_response;

void sv_response_init(sv_response *a, const ps_server *sv, const sv_request *r);
void sv_response_free(sv_response *a);
/* Adds a TOKEN event: to the whole body, or as a chunk "data: {...}\n\n" appended to out. */
void sv_response_token(sv_response *a, const sv_event *ev, sv_buf *out);
/* Adds the DONE event's text and, streaming, the finishing chunk(s) and "data: [DONE]". */
void sv_response_done(sv_response *a, const sv_event *ev, sv_buf *out);
/* The whole body after the DONE event (not streaming); malloc'd. */
char *sv_response_body(sv_response *a, const sv_event *done);
/* OpenAI's finish_reason for a stop reason. */
const char *sv_finish_reason(ps_stop_reason r);

// ---- metrics.c ------------------------------------------------------------------------------

/* The Prometheus text exposition of the server's and the scheduler's figures. */
void sv_metrics_text(ps_server *sv, sv_buf *out);

// ---- the chat page (generated from chat.html) ---------------------------------------------

extern const unsigned char ps_server_chat_html[];
extern const size_t ps_server_chat_html_len;

#endif
