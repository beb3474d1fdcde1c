/* worker.h - a stage behind a socket: `pipeshard worker`.
 *
 * A worker serves one shard to one coordinator session at a time. The coordinator
 * connects, authenticates and sends SETUP; the worker then connects to the next stage
 * (or, on the last stage, answers on the coordinator's connection), receives micro-batches
 * from the previous stage (stage 1: from the coordinator), runs them and passes them on.
 * When any connection of the session fails, the session ends and the worker waits for
 * the next one: a worker never exits because of a peer.
 *
 * Started with a cache directory instead of a shard, it takes whatever shard the coordinator
 * places (see stage.h): from its cache, or received, checked and kept there for the next
 * session and the next start. */
#ifndef PS_WORKER_H
#define PS_WORKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../net/net.h"
#include "../ps.h"

typedef struct {
    const char *shard;           /* shard file (stage 1 or later), or NULL with cache */
    const char *cache;           /* with no shard: the directory of shards placed by coordinators */
    uint64_t max_disk;           /* with cache: the most bytes its files may hold (0: no limit but free space) */
    const char *prefix_dir;      /* where the coordinator's captured prefixes are saved (KV_SAVE), or NULL */
    const char *listen;          /* "HOST:PORT" (PORT 0 = any free port) or "unix:PATH" */
    int threads;                 /* compute threads */
    bool pin;                    /* pin them to CPUs (ps_pool_pin) */
    bool mmap;                   /* map the shard rather than read it into huge pages */
    int device;                  /* PS_DEVICE_CPU or PS_DEVICE_CUDA(i): where the stage's layers run */
    bool plain;                  /* with a key: ask for frames in the clear (ps_hello.plain) */
    bool host_hops;              /* activations to a next stage on a GPU of this host by TCP too, not
                                    device to device (DHOP, stage.h) */
    const uint8_t *key;          /* 32-byte shared key, or NULL for none */
    ps_link_sim sim;             /* emulation of the outgoing hop */
    int timeout_ms;              /* handshakes, and a frame once it has begun to arrive */
    int ready_fd;                /* >= 0: write "PORT\n" there once listening, then close it */
    int max_ctx;                 /* most positions a session may ask for (0: the model's trained context) */
    uint64_t max_mem;            /* most bytes the shard and a session's KV cache and buffers may take (0: no cap) */
    bool verify;                 /* recompute the shard fingerprint at start-up (with cache: of a cached shard
                                    when placed; a received one is always checked) */
    volatile sig_atomic_t *stop; /* set by a signal handler: return after the current step */
} ps_worker_opts;

/* Loads the shard (or opens the cache) and serves sessions until *o->stop is set. Returns an
 * error only when it cannot start (bad shard or cache, address in use); logs one line per
 * event on stderr. */
ps_status ps_worker_serve(const ps_worker_opts *o, char *err, size_t errlen);

#endif
