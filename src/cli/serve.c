/* serve.c - `pipeshard serve`: parse the options (run's model, fleet and compute flags, and
 * the server's own), start the model (run.h), the scheduler (coord/sched.h) and the HTTP
 * server (server/server.h), say where it listens, and stop all three cleanly on a signal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coord/draft.h"
#include "../coord/split_cache.h"
#include "../server/server.h"
#include "../stage/stage.h"
#include "args.h"
#include "cli.h"
#include "run.h"

/* The server's own options. */
typedef struct {
    const char *host, *api_key_file, *prefix_dir;
    long long port, parallel, queue, kv_blocks;
    bool prefix_cache;
} serve_opts;

/* serve --help: its own flags, then run's model, fleet and compute flags it shares. */
static void serve_usage(FILE *f) {
    fprintf(f, "usage: pipeshard serve (-m MODEL | --fleet FLEET.json | -m MODEL --local-stages N) [options]\n"
               "  An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (streamed\n"
               "  as server-sent events with \"stream\": true), GET /v1/models, /health, /metrics (Prometheus),\n"
               "  and a chat page at /. Requests give their prompt, length and sampling; up to --parallel run\n"
               "  at once (continuous batching), the others wait in a queue. Ctrl-C or SIGTERM stops it\n"
               "  (local workers too).\n"
               "  --host H                address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every\n"
               "                          interface)\n"
               "  --port P                TCP port (default 8080; 0: any free port, printed at start)\n"
               "  --api-key-file F        require 'Authorization: Bearer KEY' on /v1/* and /metrics, KEY the\n"
               "                          first line of F (default: no key)\n"
               "  --parallel N            sequences to generate at once (default 4, at most 256)\n"
               "  --kv-blocks N           KV blocks of 32 positions on every stage (default: --parallel\n"
               "                          contexts of -c positions); more leave the prefix cache room\n"
               "                          beside the running requests, fewer admit fewer long ones\n"
               "  --queue-size N          requests that may wait to start (default 64); one more is answered\n"
               "                          503 with Retry-After\n"
               "  --prefix-cache on|off   keep whole KV blocks of ended requests and share them with later\n"
               "                          prompts that start the same (a conversation's earlier turns, a\n"
               "                          system prompt), so that they are not computed again (default on)\n"
               "  --prefix-dir DIR        where POST /v1/prefixes saves a prompt's keys and values (stage 0's\n"
               "                          and the prefix's record; local workers' too, remote workers' in\n"
               "                          their own --prefix-dir) and where a restarted server restores them\n"
               "                          from (default $PIPESHARD_CACHE/prefixes, else\n"
               "                          $XDG_CACHE_HOME/pipeshard/prefixes, else ~/.cache/pipeshard/prefixes;\n"
               "                          none with PIPESHARD_CACHE=off)\n"
               "  --spec ngram            speculative decoding of every request: each trip around the ring\n"
               "                          carries prompt lookup's guesses of the next tokens and the last stage\n"
               "                          keeps those it samples itself (the same text, in fewer trips)\n"
               "  --draft MODEL           speculative decoding with a draft model (this model's vocabulary),\n"
               "                          run here; every sequence's guesses are made in one pass a guess\n"
               "  --draft-threads N       the draft model's compute threads (default 1)\n"
               "  --spec-k K|auto         guesses per trip, 1 to 16, or auto (default: per sequence, the K up\n"
               "                          to 10 that pays most, or none)\n"
               "  --spec-overlap on|off   with --draft: while trips are out, the draft guesses the next ones\n"
               "                          of their sequences as if every guess is kept, until an answer comes\n"
               "                          (default on)\n"
               "  --chat-template NAME    chat template family for every chat request (chatml, llama2, llama3,\n"
               "                          mistral, gemma, phi3, zephyr; default: the model's own)\n");
    ps_run_usage_launch(f);
    ps_run_usage_compute(f);
}

static const char *const serve_flags[] = {"--host",         "--port",       "--api-key-file",
                                          "--parallel",     "--queue-size", "--kv-blocks",
                                          "--prefix-cache", "--prefix-dir", NULL};

/* Applies one of the server's flags (ps_run_extra.set). */
static bool serve_set(void *ctx, const char *flag, const char *v) {
    serve_opts *o = ctx;
    if (!strcmp(flag, "--host")) return (o->host = v), true;
    if (!strcmp(flag, "--api-key-file")) return (o->api_key_file = v), true;
    if (!strcmp(flag, "--prefix-dir")) return (o->prefix_dir = v), true;
    if (!strcmp(flag, "--port")) return ps_arg_int("serve", flag, v, 0, 65535, &o->port);
    if (!strcmp(flag, "--parallel")) return ps_arg_int("serve", flag, v, 1, PS_MB_MAX_SEGS, &o->parallel);
    if (!strcmp(flag, "--kv-blocks")) return ps_arg_int("serve", flag, v, 1, 1 << 24, &o->kv_blocks);
    if (!strcmp(flag, "--queue-size")) return ps_arg_int("serve", flag, v, 0, 1 << 20, &o->queue);
    return ps_arg_on_off("serve", flag, v, &o->prefix_cache);
}

/* The model's id in the API: -m's file name without ".gguf" (NULL for a fleet: the server
 * takes general.name). Points into path or a static buffer. */
static const char *model_id(const char *path) {
    static char name[256];
    if (!path) return NULL;
    const char *b = strrchr(path, '/');
    snprintf(name, sizeof name, "%s", b ? b + 1 : path);
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = 0;
    return name;
}

int ps_cli_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return serve_usage(stdout), 0;
    serve_opts so = {.host = "127.0.0.1", .port = 8080, .parallel = 4, .queue = 64, .prefix_cache = true};
    ps_run_extra ex = {serve_flags, serve_set, &so};
    ps_run_opts o;
    int rc = ps_run_parse(argc, argv, &o, PS_RUN_SERVE, &ex);
    if (rc >= 0) return rc;
    ps_run_install_signals(); /* a signal while starting kills local workers and exits at once */
    char err[1024] = "";
    ps_launch *l = NULL;
    ps_sched *sched = NULL;
    ps_server *sv = NULL;
    char prefix_dir[4200];
    if (!so.prefix_dir && ps_split_cache_root(prefix_dir, sizeof prefix_dir - 16)) {
        strcat(prefix_dir, "/prefixes");
        so.prefix_dir = prefix_dir;
    }
    ps_sched_opts sco = {.parallel = (int)so.parallel,
                         .queue_max = (int)so.queue,
                         .prefix_cache = so.prefix_cache,
                         .prefix_dir = so.prefix_cache ? so.prefix_dir : NULL,
                         .spec = o.spec};
    ps_server_opts svo = {.host = so.host,
                          .port = (int)so.port,
                          .api_key_file = so.api_key_file,
                          .model_name = model_id(o.fleet ? NULL : o.model),
                          .chat_template = o.chat_template};
    o.parallel = (int)so.parallel, o.kv_blocks = (int)so.kv_blocks, o.prefix_dir = sco.prefix_dir;
    ps_draft *draft = NULL;
    ps_status s = ps_run_launch(&o, true, &l, err, sizeof err);
    ps_run_progress_clear();
    if (!s) s = ps_run_draft_open(&o, l, (int)so.parallel, &sco.spec, &draft, err, sizeof err);
    if (!s) s = ps_sched_create(l, &sco, &sched, err, sizeof err);
    if (!s) s = ps_server_start(l, sched, &svo, &sv, err, sizeof err);
    if (s) {
        fprintf(stderr, "pipeshard serve: %s\n", err[0] ? err : ps_strerror(s));
    } else {
        ps_coord *c = ps_launch_coord(l);
        bool v6 = strchr(so.host, ':') != NULL;
        printf("pipeshard serve: listening on http://%s%s%s:%d/ (%d stage%s, context %d, queue %lld%s)\n",
               v6 ? "[" : "", so.host, v6 ? "]" : "", ps_server_port(sv), ps_coord_n_stages(c),
               ps_coord_n_stages(c) == 1 ? "" : "s", ps_coord_n_ctx(c), so.queue, so.api_key_file ? ", API key" : "");
        fflush(stdout);
        ps_run_catch_signals(true);
        while (!ps_run_signal()) usleep(50000);
        fprintf(stderr, "pipeshard serve: stopping (signal %d)\n", ps_run_signal());
    }
    ps_server_stop(sv); /* in-flight requests end (cancelled) and their clients get what they had */
    ps_sched_free(sched);
    ps_draft_free(draft); /* after the scheduler: it drafts until it stops */
    ps_launch_stop(l);    /* local workers stopped, their directory removed */
    return s ? 1 : 128 + ps_run_signal();
}
