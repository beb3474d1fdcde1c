/* server.h - the OpenAI-compatible HTTP API over a scheduler (coord/sched.h), on
 * libmicrohttpd, one thread per connection.
 *
 *   POST /v1/chat/completions   chat messages through the model's chat template
 *   POST /v1/completions        a text prompt (or token ids)
 *   GET  /v1/models             the one model served
 *   GET  /health                {"status": "ok"} (no key needed)
 *   GET  /metrics               Prometheus text: requests, tokens, queue, KV blocks, latencies,
 *                               per-stage compute and per-hop traffic
 *   GET  /                      the chat page (no key needed)
 *
 * Completions stream as server-sent events (`data: {...}` chunks, then `data: [DONE]`) when
 * the body says "stream": true, else come as one JSON body; errors are OpenAI's JSON error
 * shape with the HTTP status that fits (400, 401, 404, 405, 413, 500, 503 with Retry-After).
 * A client that goes away cancels its request within one step: the connection's thread
 * watches its socket for the peer's hang-up while it waits for tokens. */
#ifndef PS_SERVER_H
#define PS_SERVER_H

#include <stddef.h>

#include "../coord/launch.h"
#include "../coord/sched.h"

#define PS_SERVER_MAX_BODY (8u << 20) /* request bodies over 8 MiB: 413 */

typedef struct {
    const char *host;          /* address to listen on (a name or a numeric IPv4/IPv6 address) */
    int port;                  /* 0: any free port (ps_server_port says which) */
    const char *api_key_file;  /* NULL: no key; else requests need "Authorization: Bearer KEY",
                                  KEY the file's first line (surrounding whitespace removed) */
    const char *model_name;    /* the model's id in the API; NULL: general.name, else "pipeshard" */
    const char *chat_template; /* a chat template family for every chat request, or NULL: the model's */
    int max_connections;       /* open connections at once (0: 256); more are refused */
} ps_server_opts;

typedef struct ps_server ps_server;

/* Listens on host:port and serves requests through s (both l and s borrowed: they must
 * outlive the server). *out is the caller's (ps_server_stop). Errors: the key file
 * (PS_ERR_IO, PS_ERR_ARG for an empty one), the address (PS_ERR_NET: "cannot listen on
 * HOST:PORT: ..."). */
ps_status ps_server_start(ps_launch *l, ps_sched *s, const ps_server_opts *o, ps_server **out, char *err,
                          size_t errlen);
/* The port listened on. */
int ps_server_port(const ps_server *sv);
/* Stops serving: closes the scheduler (every request still running ends, cancelled, and its
 * client gets what it had), waits for the connections' threads and frees. NULL is a no-op.
 * The scheduler itself is the caller's to free afterwards. */
void ps_server_stop(ps_server *sv);

#endif
