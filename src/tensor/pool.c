/* pool.c - a fork-join thread pool tuned for many short jobs.
 *
 * Decode runs a few hundred small matmuls per token, so a job must start within a
 * microsecond or so. Workers spin on a generation counter for a while after each job and
 * only then sleep on it (a futex on Linux, a condition variable elsewhere); the caller
 * wakes sleepers only when there are any. The calling thread runs part 0 itself, then
 * runs every part that no worker has claimed yet (a worker still waking up, or one whose
 * core another process took), then spins until the claimed parts are done. Which thread
 * runs a part never changes what the part computes, so results stay bit-identical. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"

#ifdef __linux__
#include <errno.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#ifndef PS_RELAX
#define PS_RELAX() _mm_pause()
#endif
#define cpu_relax() PS_RELAX()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before it sleeps. */
#define SPIN_NS 400000LL
/* How long a parked worker of a pinned pool yields its core before it sleeps: a stage's
 * next micro-batch usually comes within a few ms, and a worker that slept costs the thread
 * that wakes it 10-20 us (an inter-processor interrupt; measured in a 2-vCPU VM) and comes
 * 20-40 us later, after the caller has run its part. Yielding keeps it runnable without
 * taking the core from anyone (another stage's threads on a shared host). Unpinned, the
 * runnable yielders mislead the scheduler's load balancing (a 3-stage local fleet on 2
 * cores lost 10%), so those workers sleep at once. */
#define PARK_YIELD_NS 8000000LL

typedef struct {
    ps_pool *pool;
    int ith;
    pthread_t thread;
    atomic_uint claim; /* the generation for which part ith was last claimed (by anyone) */
} worker;

struct ps_pool {
    int n;               /* threads in all, the caller included */
    worker *workers;     /* n - 1 of them */
    atomic_uint gen;     /* bumped once per job (the futex word) */
    atomic_int pending;  /* workers that have not finished the current job */
    atomic_int sleepers; /* workers asleep or about to sleep on gen */
    atomic_bool stop;
    atomic_bool parked;         /* ps_pool_park: idle workers stop spinning */
    atomic_llong park_yield_ns; /* how long parked workers yield before they sleep: 0 unless pinned */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
#ifndef __linux__
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
};

// Sleeping and waking

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleeps while p->gen == seen (may return early: callers re-check). */
static void gen_wait(ps_pool *p, unsigned seen) {
#ifdef __linux__
    syscall(SYS_futex, &p->gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
#endif
}

/* Wakes every worker sleeping on gen. */
static void gen_wake(ps_pool *p) {
#ifdef __linux__
    syscall(SYS_futex, &p->gen, FUTEX_WAKE_PRIVATE, p->n, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
#endif
}

/* Yields the core until gen moves past `seen` (returns it), or the pool is unparked, or
 * park_yield_ns pass (returns seen). */
static unsigned yield_while_parked(ps_pool *p, unsigned seen, long long park_yield_ns) {
    long long t0 = now_ns();
    for (int i = 0; atomic_load_explicit(&p->parked, memory_order_relaxed); i++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        if ((i & 15) == 15 && now_ns() - t0 > park_yield_ns) break;
        sched_yield();
    }
    return seen;
}

/* Returns the generation after `seen`: spins for SPIN_NS (parked: not at all; parked and
 * pinned: yields for park_yield_ns instead), then sleeps. The sleepers count is raised
 * (seq_cst) before the futex re-checks gen, and the caller bumps gen (seq_cst) before it
 * reads sleepers, so one of them always sees the other; a yielding worker is no sleeper:
 * it sees gen move. */
static unsigned next_gen(ps_pool *p, unsigned seen) {
    for (;;) {
        long long t0 = now_ns();
        for (int i = 0;; i++) {
            unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen) return g;
            cpu_relax();
            if ((i & 255) != 255) continue;
            if (now_ns() - t0 > SPIN_NS || atomic_load_explicit(&p->parked, memory_order_relaxed)) break;
            if ((i & 4095) == 4095) sched_yield(); /* let a descheduled peer run */
        }
        long long park_yield_ns = atomic_load_explicit(&p->park_yield_ns, memory_order_relaxed);
        if (park_yield_ns > 0 && atomic_load_explicit(&p->parked, memory_order_relaxed)) {
            unsigned g = yield_while_parked(p, seen, park_yield_ns);
            if (g != seen) return g;
            if (!atomic_load_explicit(&p->parked, memory_order_relaxed)) continue; /* ps_pool_wake: spin */
        }
        do {
            atomic_fetch_add(&p->sleepers, 1);
            gen_wait(p, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen) return g;
        } while (atomic_load_explicit(&p->parked, memory_order_relaxed)); /* ps_pool_wake: spin again */
    }
}

// Workers

/* Claims part w->ith of job `gen` for the calling thread. A part can be claimed once per
 * job; a worker that wakes late (its gen already finished, or a later one running) finds
 * the part claimed for gen or later and leaves fn/ctx alone: the caller cannot start
 * another job while a part it did not claim is unfinished. */
static bool claim(worker *w, unsigned gen) {
    unsigned c = atomic_load(&w->claim);
    return (int)(c - gen) < 0 && atomic_compare_exchange_strong(&w->claim, &c, gen);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    ps_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = next_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        if (!claim(w, seen)) continue; /* the caller ran our part: that job is over for us */
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

/* Publishes a job (fn/ctx are read by workers after they see the new generation). */
static void start_job(ps_pool *p) {
    atomic_store_explicit(&p->parked, false, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) gen_wake(p);
}

/* Spins until every worker has finished; yields now and then in case one was descheduled. */
static void wait_job(ps_pool *p) {
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if ((i & 1023) == 1023) sched_yield();
    }
}

// Public API

ps_status ps_pool_create(int n_threads, ps_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return PS_ERR_ARG;
    ps_pool *p = ps_calloc(1, sizeof *p);
    if (!p) return PS_ERR_NOMEM;
    p->n = 1;
#ifndef __linux__
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
#endif
    if (n_threads > 1 && !(p->workers = ps_calloc((size_t)n_threads - 1, sizeof *p->workers))) goto err;
    /* every CPU the process may use, not the creator's: a pool made by a pinned thread (a
       draft model's, on the coordinator's thread 0) would otherwise have all its workers on
       that thread's one CPU */
    pthread_attr_t attr;
    if (pthread_attr_init(&attr)) goto err;
#ifdef __linux__
    int cpus[CPU_SETSIZE], m = ps_first_cpus(cpus, CPU_SETSIZE);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < m; i++) CPU_SET(cpus[i], &all);
    if (m > 0) pthread_attr_setaffinity_np(&attr, sizeof all, &all);
#endif
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->thread, &attr, worker_main, w) != 0) break;
        p->n = i + 1;
    }
    pthread_attr_destroy(&attr);
    if (p->n < n_threads) goto err;
    *out = p;
    return PS_OK;
err:
    ps_pool_free(p);
    return PS_ERR_NOMEM;
}

/* Stops and joins the workers started so far (p->n - 1 of them). */
void ps_pool_free(ps_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->gen, 1);
    gen_wake(p);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i - 1].thread, NULL);
#ifndef __linux__
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
#endif
    free(p->workers);
    free(p);
}

int ps_pool_size(const ps_pool *p) { return p ? p->n : 1; }

/* Pins the pool's threads i0, i0 + 1, ... (thread 0: the calling one) to the CPUs first,
 * first + 1, ... of ps_first_cpus, mod their count when wrap, else PS_ERR_RANGE (nothing pinned)
 * when there are not that many; pinned, parked workers yield before they sleep. */
static ps_status pin_from(ps_pool *p, int i0, int first, bool wrap, char *err, size_t errlen) {
#ifdef __linux__
    int cpus[CPU_SETSIZE], m = ps_first_cpus(cpus, CPU_SETSIZE), n = ps_pool_size(p) - i0;
    if (m <= 0)
        return ps_errf(err, errlen, PS_ERR_IO, "cannot read the CPUs this process may use: %s",
                       m ? strerror(-m) : "none");
    if (!wrap && (first < 0 || first + n > m))
        return ps_errf(err, errlen, PS_ERR_RANGE, "%d threads after the first %d of %d CPUs", n, first, m);
    for (int i = i0; i < ps_pool_size(p); i++) {
        int cpu = cpus[(first + i - i0) % m];
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        int e = i == 0 ? (sched_setaffinity(0, sizeof one, &one) ? errno : 0)
                       : pthread_setaffinity_np(p->workers[i - 1].thread, sizeof one, &one);
        if (e) return ps_errf(err, errlen, PS_ERR_IO, "cannot pin thread %d to CPU %d: %s", i, cpu, strerror(e));
    }
    ps_pool_set_park_yield(p, PARK_YIELD_NS);
    return PS_OK;
#else
    (void)p, (void)i0, (void)first, (void)wrap;
    return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "pinning threads to CPUs is supported on Linux only");
#endif
}

ps_status ps_pool_pin(ps_pool *p, char *err, size_t errlen) { return pin_from(p, 0, 0, true, err, errlen); }

ps_status ps_pool_pin_workers(ps_pool *p, int first, char *err, size_t errlen) {
    return pin_from(p, 1, first, false, err, errlen);
}

void ps_pool_set_park_yield(ps_pool *p, long long ns) {
    if (p) atomic_store_explicit(&p->park_yield_ns, ns > 0 ? ns : 0, memory_order_relaxed);
}

void ps_pool_park(ps_pool *p) {
    if (p) atomic_store_explicit(&p->parked, true, memory_order_relaxed);
}

void ps_pool_wake(ps_pool *p) {
    if (!p || p->n == 1) return;
    atomic_store(&p->parked, false);
    if (atomic_load(&p->sleepers) > 0) gen_wake(p);
}

void ps_pool_run(ps_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    start_job(p);
    unsigned gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
    fn(ctx, 0, p->n);
    for (int i = 1; i < p->n; i++) /* parts nobody took yet */
        if (claim(&p->workers[i - 1], gen)) {
            fn(ctx, i, p->n);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
        }
    wait_job(p);
}
