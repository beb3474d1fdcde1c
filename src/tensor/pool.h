/* pool.h - a fork-join thread pool for many short jobs (the matmuls of a forward pass):
 * a job is a function run once per thread, on the pool's threads and the caller's. */
#ifndef PS_TENSOR_POOL_H
#define PS_TENSOR_POOL_H

#include <stddef.h>

#include "../ps.h"

typedef struct ps_pool ps_pool;

/* A pool of n_threads workers in all (the calling thread is one of them, so n_threads == 1
 * starts no thread). The workers may run on every CPU the process may use (ps_first_cpus),
 * whatever CPUs the calling thread is pinned to. */
ps_status ps_pool_create(int n_threads, ps_pool **out);
void ps_pool_free(ps_pool *p); /* NULL is a no-op */
/* Pins thread i of the pool to the i-th CPU (mod their count) of those this process could
 * use when ps_pool_pin was first called (ps_first_cpus); thread 0 is the calling thread,
 * which must be the one that calls ps_pool_run (threads it starts later inherit its CPU:
 * they call ps_thread_unpin). Keeps the scheduler from stacking two of the pool's threads
 * on one core, or moving them, when other processes (the other stages of a split model on
 * one host) wake and sleep beside it. Linux only; elsewhere PS_ERR_UNSUPPORTED. */
ps_status ps_pool_pin(ps_pool *p, char *err, size_t errlen);
/* Pins the pool's workers (threads 1..) to the CPUs first, first + 1, ... of those
 * ps_first_cpus lists, leaving the calling thread's alone: PS_ERR_RANGE, nothing pinned, when
 * there are not that many. For a pool that works beside pinned ones (a draft model's, on the
 * CPUs after the stages'). */
ps_status ps_pool_pin_workers(ps_pool *p, int first, char *err, size_t errlen);
int ps_pool_size(const ps_pool *p);
/* Runs fn(ctx, ith, nth) for ith in [0, nth) on the pool's threads (the caller runs ith 0)
 * and returns when all have returned. Not reentrant: fn must not call ps_pool_run. */
void ps_pool_run(ps_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);
/* Tells idle workers to stop spinning: call it before blocking on something slow (a
 * network hop), so that spinning threads do not take the cores from another process
 * (another stage on the same host). They sleep; in a pinned pool (ps_pool_pin) they
 * first yield their cores for a few ms, so that the next ps_pool_run finds them awake
 * without having to wake them. The next ps_pool_run, or ps_pool_wake, ends it. */
void ps_pool_park(ps_pool *p);
/* How long parked workers yield their cores before they sleep, in ns: 0 (sleep at once)
 * until ps_pool_pin sets 8 ms. Tests lengthen it, so that a loaded host that delays their
 * look cannot outlast it. */
void ps_pool_set_park_yield(ps_pool *p, long long ns);
/* Undoes ps_pool_park ahead of time: sleeping workers wake and spin, so that the next
 * ps_pool_run does not wait for them to be scheduled (call it when input arrives, before
 * decoding it). */
void ps_pool_wake(ps_pool *p);

#endif
