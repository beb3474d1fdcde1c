/* plan.h - placing a model on uneven hosts (`pipeshard plan`): the order of the hosts on the
 * ring and each one's layer range, for the fastest decode that fits every host's memory.
 *
 * The cost model. A token's trip around the ring takes T = the sum over stages of their
 * compute (ms_per_gb × the gigabytes of weights a token reads there: its layers, and the head
 * on the last stage) plus the sum of the hops (half the link's round trip, plus the
 * activations' bytes at the link's rate; the last hop back to stage 0 carries token ids
 * only). One stream decodes at 1000 / T tokens a second; with P sequences in flight over N
 * stages (as many micro-batches in flight as stages, decode reading each stage's weights once
 * per micro-batch), at P × 1000 / max(T, N × the largest stage compute). A stage fits when its
 * weights (the embedding on stage 0, the head on the last), its layers' KV cache for the
 * context and sequences asked, and its buffers fit in the host's memory. Every stage has at
 * least one layer; a host may be left out.
 *
 * The search. Up to PS_PLAN_EXACT_HOSTS hosts, exact: dynamic programming over (the set of
 * hosts used, the last one, the layers placed), every host as stage 0 — the least T. With
 * P > 1 sequences, the better (by the aggregate above) of that plan and the one whose largest
 * stage compute is least (ties: the least T) — a heuristic for the aggregate. More hosts: the
 * ring visits them in order of speed (fastest first), the cuts and the hosts left out chosen
 * by the same dynamic programming — also a heuristic. */
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
    double buf_bytes;          /* each stage's buffers */
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
    double agg_tok_s;                                                /* with p->parallel sequences */
    bool exact;                                                      /* the search was exhaustive (for one stream) */
} ps_plan;

/* The plan with the fastest decode (one stream; with parallel > 1, see above). PS_ERR_RANGE
 * when no placement fits, err saying how much memory is missing (the weights, KV cache and
 * buffers against all hosts' memory together, or, when that suffices, that no cut of the
 * layers fits each host); PS_ERR_ARG for a malformed problem. */
ps_status ps_plan_solve(const ps_plan_problem *p, ps_plan *out, char *err, size_t errlen);

/* Fills a plan's per-stage figures, T and tok/s from its hosts and bounds (n_stages and
 * host[], bounds[] set); false when a stage does not fit its host. For the solver and tests. */
bool ps_plan_evaluate(const ps_plan_problem *p, ps_plan *pl);

#endif
