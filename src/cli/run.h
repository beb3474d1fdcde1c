/* run.h - what `run`, `chat` and `serve` share (run.c): the options that name and start a
 * model (-m, --fleet, --local-stages, threads, context, ...), their parsing and help text,
 * the start-up with its progress line, and the signals that stop a local fleet cleanly. */
#ifndef PS_CLI_RUN_H
#define PS_CLI_RUN_H

#include <stdbool.h>
#include <stdio.h>

#include "../coord/launch.h"
#include "../coord/session.h"

/* Which command parses: run's prompt and output flags, chat's (no prompt flags), or serve's
 * (the model, fleet and compute flags and --chat-template only: requests bring the rest). */
typedef enum { PS_RUN_RUN, PS_RUN_CHAT, PS_RUN_SERVE } ps_run_mode;

typedef struct {
    const char *model, *fleet, *prompt, *prompt_file, *prompt_ids, *dump_logits, *chat_template, *system, *key_file;
    long long threads, ctx, batch, local_stages, prefill_chunk, timeout_ms;
    int parallel;           /* sequences the fleet serves at once (serve's --parallel; else 1) */
    int kv_blocks;          /* KV blocks on every stage (serve's --kv-blocks; 0: parallel contexts) */
    const char *prefix_dir; /* local workers' --prefix-dir (serve's), or NULL */
    ps_link_sim sim;
    bool chat, stats, print_ids, seeded, pin, mmap, plain, host_hops, local_unix, local_transport, threads_given, n_set;
    ps_act act;
    int device;                       /* --device: PS_DEVICE_CPU or PS_DEVICE_CUDA(i) (stage 0's) */
    int devices[PS_SHARD_MAX_STAGES]; /* --device's list: one per local stage */
    int n_devices;
    char standby_list[1024];                  /* --standby's value */
    const char *standby[PS_SHARD_MAX_STAGES]; /* its addresses */
    int n_standby;
    ps_gen_params gp;  /* sampling, -n, --ignore-eos */
    ps_spec_opts spec; /* --spec, --spec-k, --draft */
    bool spec_k_set;
    const char *draft; /* --draft MODEL */
    long long draft_threads;
    bool overlap_set;
    const char *given; /* the first prompt, output or sampling flag given (serve refuses them) */
} ps_run_opts;

/* Valued flags a command takes beside run's (serve's --port, ...). */
typedef struct {
    const char *const *flags;                                    /* NULL-terminated long names */
    bool (*set)(void *ctx, const char *flag, const char *value); /* false after printing why */
    void *ctx;
} ps_run_extra;

/* Parses argv (argv[0] the command's name) into o, with extra's flags (may be NULL).
 * Returns -1 to go on, else the exit status: 0 after --help (PS_RUN_RUN prints run's;
 * the other modes print their own first), 2 after a usage error. */
int ps_run_parse(int argc, char **argv, ps_run_opts *o, ps_run_mode mode, const ps_run_extra *extra);

/* Help text sections that serve shares with run: the model and fleet flags, the compute flags. */
void ps_run_usage_launch(FILE *f);
void ps_run_usage_compute(FILE *f);

/* Starts o's model (ps_launch_start), drawing a progress line on stderr when it is a terminal,
 * and warns about a context longer than the model's. */
ps_status ps_run_launch(const ps_run_opts *o, bool tokenizer, ps_launch **out, char *err, size_t errlen);
/* With --draft: opens the draft model for `slots` sequences beside launch l (its context and
 * tokenizer; --draft-threads) into *out and turns spec to it; without, *out is NULL. */
ps_status ps_run_draft_open(const ps_run_opts *o, ps_launch *l, int slots, ps_spec_opts *spec, ps_draft **out,
                            char *err, size_t errlen);
/* Clears the progress line, if one is drawn, before other output. */
void ps_run_progress_clear(void);

/* SIGINT, SIGTERM and SIGHUP: while caught (ps_run_catch_signals(true)), the first one is
 * recorded for the command to stop cleanly (ps_run_signal says which); otherwise, or a
 * second one, the local workers are killed and the process exits at once with 128 + signal.
 * SIGPIPE is ignored. */
void ps_run_install_signals(void);
void ps_run_catch_signals(bool on);
int ps_run_signal(void);

#endif
