/* local_fleet.h - `run --local-stages N`: split a model (or reuse its split from the cache,
 * split_cache.h), start N-1 workers as child processes of this `pipeshard` binary (on
 * loopback TCP, or on Unix sockets in the run's directory), and stop them afterwards. */
#ifndef PS_COORD_LOCAL_FLEET_H
#define PS_COORD_LOCAL_FLEET_H

#include <sys/types.h>

#include "../net/net.h"
#include "../stage/stage.h"
#include "fleet.h"

typedef struct {
    char dir[4096];                  /* the run's temporary directory: key, logs (and the
                                        shards when the cache is off) */
    int n;                           /* stages */
    pid_t pids[PS_SHARD_MAX_STAGES]; /* workers (index 0 unused) */
    ps_fleet fleet;                  /* with the workers' addresses */
    uint8_t key[32];                 /* the shared key every process of the fleet holds */
} ps_local_fleet;

/* How the workers run. */
typedef struct {
    const ps_stage_opts *stage;  /* threads, --pin, --mmap, --device */
    const ps_link_sim *sim;      /* link emulation of their outgoing hops */
    const char *key_file;        /* NULL: a fresh random key */
    bool unix_sockets;           /* listen on Unix sockets instead of loopback TCP */
    bool host_hops;              /* their --host-hops */
    const int *devices;          /* stage k's --device: devices[k] (the last past n_devices); NULL:
                                    stage->device */
    int n_devices;               /* how many devices */
    const char *prefix_dir;      /* their --prefix-dir, or NULL */
    const ps_progress *progress; /* the split and the start are reported here (may be NULL) */
} ps_local_fleet_opts;

/* Splits model into n_stages (bytes balanced; reusing the cached split of an unchanged
 * model) and starts the workers as o says. */
ps_status ps_local_fleet_start(const char *model, int n_stages, const ps_local_fleet_opts *o, ps_local_fleet *lf,
                               char *err, size_t errlen);
/* Stops the workers and removes the directory. Safe on a partly started fleet. */
void ps_local_fleet_stop(ps_local_fleet *lf);
/* For a signal handler about to _exit: kills the workers of every fleet of this process
 * that is started (or starting) and not yet stopped, waits for them, and removes their
 * directories, through async-signal-safe calls only. Nothing is freed: the process ends. */
void ps_local_fleet_abort_all(void);

#endif
