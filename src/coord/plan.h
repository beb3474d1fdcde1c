/* plan.h - placing a model on uneven hosts (`pipeshard plan`): the order of the hosts on the
 * ring and each one's layer range, for the fastest decode that fits every host's memory.
 *
 * The cost model. A token's trip around the ring takes T = the sum over stages of their
 * compute (ms_per_gb × the gigabytes of weights a token reads there: its layers, and the head
 * on the last stage) plus the sum of the hops (half the link's round trip, plus the
 * activations' bytes at the link's rate; the last hop back to stage 0 carries token ids
 * only). One stream decodes at 1000 / T tokens a second. With P sequences over N stages the
 * coordinator keeps G = min(P, N) micro-batches in flight (serve's scheduler, sched.c: the
 * sequences in G groups, a micro-batch each), and decode reads each stage's weights once per
 * micro-batch, however many rows it has. In a cycle every micro-batch goes once around the
 * ring (T) and the slowest stage works G × its compute, so the cycle takes max(T, G × the
 * largest stage compute) and yields P tokens: P × 1000 / the cycle tokens a second. With
 * P < N only P micro-batches are in flight, each of one sequence: the slowest stage works P
 * times a cycle, not N times (N × would understate what fewer sequences get from an uneven
 * split). Left out: a micro-batch of r rows carries r rows' activations on each hop (32 KB a
 * row for a 70B model: 0.26 ms at 1 Gbit/s), and its compute beyond the weights' reads.
 * A stage fits when its weights (the embedding on stage 0, the head on the last), its
 * layers' KV cache for the context and sequences asked, and its buffers fit in the host's
 * memory. Every stage has at least one layer; a host may be left out.
 *
 * The search. Up to PS_PLAN_EXACT_HOSTS hosts, exact: dynamic programming over (the set of
 * hosts used, the last one, the layers placed), every host as stage 0 — the least T, per
 * number of stages, optionally with every stage's compute capped. With P > 1 sequences the
 * least cycle of N stages is min over caps c of max(T_N(c), G × c), T_N(c) the least T with
 * every stage's compute at most c: T_N falls as c grows and G × c rises, so a bisection over
 * the stages' possible computes (each host and layer range) finds where they cross, for each
 * N (plan.c). More hosts: the ring visits them in order of speed (fastest first), the cuts
 * and the hosts left out chosen by the same dynamic programming, and with P > 1 the best of
 * the least-T plan, the most balanced one and the one where T meets G × the cap — a
 * heuristic. */
#ifndef PS_COORD_PLAN_H
#define PS_COORD_PLAN_H

#include <stdbool.h>

#include "../ps.h"

#define PS_PLAN_MAX_HOSTS   64
#define PS_PLAN_EXACT_HOSTS 8

typedef struct {
    char name[64];     /* as hosts.json names it */
    char address[128]; /* HOST:PORT its worker listens on (fleet.json), may be "" */
    double mem;        /* bytes for weights, KV cache and buffers */
    double ms_per_gb;  /* decode: milliseconds per GB of weights one token reads */
} ps_plan_host;

typedef struct {
    int n_layer;
    const double *layer_bytes; /* [n_layer] weights of each layer */
    double embed_bytes;        /* token embedding (stage 0 holds it) */
    double head_bytes;         /* output norm and head (the last stage holds and reads it) */
    double kv_bytes_per_layer; /* one layer's KV cache for the context and sequences asked */
    double buf_bytes;          /* each stage's buffers, scratch and file metadata */
    double act_bytes;          /* one token's activations on a hop */
    int n_hosts;
    const ps_plan_host *hosts;
    const double *rtt_ms; /* [a * n_hosts + b]: round trip between hosts a and b */
    const double *mbps;   /* [a * n_hosts + b]: rate from a to b, megabits/s */
    int parallel;         /* sequences in flight (1: one stream) */
} ps_plan_problem;

typedef struct {
    int n_stages;
    int host[PS_PLAN_MAX_HOSTS];                                     /* each stage's host, in ring order */
    int bounds[PS_PLAN_MAX_HOSTS + 1];                               /* stage k has layers [bounds[k], bounds[k+1]) */
    double mem[PS_PLAN_MAX_HOSTS];                                   /* bytes each stage needs */
    double compute_ms[PS_PLAN_MAX_HOSTS], hop_ms[PS_PLAN_MAX_HOSTS]; /* hop: the stage's outgoing one */
    double token_ms;                                                 /* T: one token's trip */
    double tok_s;                                                    /* one stream */
    double cycle_ms;  /* with p->parallel sequences: the time in which each gets a token */
    double agg_tok_s; /* with p->parallel sequences */
    bool exact;       /* the search was exhaustive: no plan has a shorter cycle (one stream: T) */
} ps_plan;

/* The plan with the fastest decode: the least T for one stream; with parallel > 1 the least
 * cycle (the most tok/s in aggregate), ties to the least T. PS_ERR_RANGE
 * when no placement fits, err saying how much memory is missing (the weights, KV cache and
 * buffers against all hosts' memory together, or, when that suffices, that no cut of the
 * layers fits each host); PS_ERR_ARG for a malformed problem; PS_ERR_NOMEM. */
ps_status ps_plan_solve(const ps_plan_problem *p, ps_plan *out, char *err, size_t errlen);

/* Fills a plan's per-stage figures, T, the cycle and tok/s from its hosts and bounds (n_stages and
 * host[], bounds[] set); false when a stage does not fit its host. For the solver and tests. */
bool ps_plan_evaluate(const ps_plan_problem *p, ps_plan *pl);

#endif
