/* bench.h - the options of `pipeshard bench`, shared by its two modes: the engine alone
 * (bench.c) and the split model against the unsplit one (bench_stages.c). */
#ifndef PS_CLI_BENCH_H
#define PS_CLI_BENCH_H

#include <stdbool.h>

#include "../model/shard.h"
#include "../tensor/types.h"

typedef struct {
    const char *model;
    long long n_prompt, n_gen, threads, reps;
    double mem_bw;      /* GB/s given by --mem-bw, or 0: measure */
    ps_act act;
    bool json, pin;
    int n_split;                          /* --stages: how many stage counts (0: engine mode) */
    int split[PS_SHARD_MAX_STAGES];       /* the stage counts, each 2.. */
    long long segment;                    /* --segment: decode tokens per turn */
} bench_opts;

/* `bench --stages`: prints the table (or JSON) and returns the exit status. */
int ps_bench_stages(const bench_opts *o);

#endif
