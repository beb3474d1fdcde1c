/* launch.h - from what a user names (a whole model, a fleet.json, or a model to split into a
 * local fleet) to a connected coordinator and the model's tokenizer: what `run`, `bench
 * --stages` and the server share before their first session (session.h). */
#ifndef PS_COORD_LAUNCH_H
#define PS_COORD_LAUNCH_H

#include <stdbool.h>

#include "../net/net.h"
#include "../stage/stage.h"
#include "../tensor/types.h"
#include "../tokenize/tokenize.h"
#include "coord.h"

typedef struct {
    const char *model;          /* a whole model (-m), also the one to split with local_stages */
    const char *fleet;          /* or fleet.json (--fleet): stage 0 here, the rest on its workers */
    int local_stages;           /* > 1: split model and start stages 1.. as local worker processes
                                   of this binary (coord/local_fleet.h) */
    bool local_unix;            /* their connections on Unix sockets instead of loopback TCP */
    const int *devices;         /* with local_stages: stage k's device is devices[k] (the last for
                                   the stages past n_devices); NULL: stage.device for every stage */
    int n_devices;              /* how many devices */
    const char *key_file;       /* the workers' shared key, or NULL (local fleets: a fresh one) */
    bool plain;                 /* with a key: ask for frames in the clear (local fleets always do) */
    bool host_hops;             /* activations between GPU stages of this host by TCP (ps_coord_opts'; and
                                   local workers', --host-hops) */
    ps_link_sim sim;            /* link emulation of the coordinator's hop (and local workers') */
    int timeout_ms;             /* a stage silent for this long is reported as stalled */
    const char *const *standby; /* ps_coord_opts' (--standby) */
    int n_standby;
    ps_stage_opts stage;    /* threads, --pin, --mmap of stage 0 and of local workers */
    int n_ctx;              /* positions; 0 = the model's, at most 4096 */
    int max_batch;          /* prompt tokens per forward pass */
    int prefill_chunk;      /* positions per micro-batch on the ring; 0 = max_batch */
    int parallel;           /* sequences served at once (the scheduler's); 0 = 1 */
    int kv_blocks;          /* KV blocks on every stage; 0 = enough for `parallel` full contexts */
    int max_draft;          /* draft tokens a sequence's trip may carry (speculation; 0: none) */
    ps_act act;             /* matmul arithmetic of every stage */
    const char *prefix_dir; /* local workers' --prefix-dir (captured prefixes), or NULL */
    bool tokenizer;         /* load the model's tokenizer (false: token ids in and out) */
    ps_progress progress;   /* what start-up and a long prompt are doing (fleet.h); fn NULL: none */
} ps_launch_opts;

typedef struct ps_launch ps_launch;

/* Starts the fleet (local workers, or fleet.json's), creates the coordinator, connects it,
 * and loads the tokenizer (checked against the model's vocabulary). *out is owned by the
 * caller (ps_launch_stop); on failure it is NULL and everything started is stopped. */
ps_status ps_launch_start(const ps_launch_opts *o, ps_launch **out, char *err, size_t errlen);
/* Ends the coordinator's session, stops local workers, removes their directory. NULL is a no-op. */
void ps_launch_stop(ps_launch *l);

/* For a signal handler about to _exit (async-signal-safe): kills the local workers of every
 * launch of this process, started or starting, and removes their directories. */
void ps_launch_abort_all(void);

/* What was started; owned by l until ps_launch_stop. */
ps_coord *ps_launch_coord(ps_launch *l);
const ps_tok *ps_launch_tok(const ps_launch *l); /* NULL without opts.tokenizer */
double ps_launch_seconds(const ps_launch *l);    /* how long ps_launch_start took */

#endif
