/* bench.h - the options of `pipeshard bench`, shared by its two modes: the engine alone
 * (bench.c) and the split model against the unsplit one (bench_stages.c), and what both
 * report with (bench_report.c). */
#ifndef PS_CLI_BENCH_H
#define PS_CLI_BENCH_H

#include <stdbool.h>

#include "../model/model.h"
#include "../model/shard.h"
#include "../tensor/types.h"

typedef struct {
    const char *model;
    long long n_prompt, n_gen, threads, reps;
    double mem_bw; /* GB/s given by --mem-bw, or 0: measure */
    ps_act act;
    int device;                       /* --device: PS_DEVICE_CPU or PS_DEVICE_CUDA(i) (the first) */
    int devices[PS_SHARD_MAX_STAGES]; /* --device's list: with --stages, one per stage */
    int n_devices;
    bool json, pin, mmap, host_hops;
    bool unix_sockets;              /* --local-transport unix */
    int n_split;                    /* --stages: how many stage counts (0: engine mode) */
    int split[PS_SHARD_MAX_STAGES]; /* the stage counts, each 2.. */
    long long segment;              /* --segment: decode tokens per turn */
} bench_opts;

/* `bench --stages`: prints the table (or JSON) and returns the exit status. */
int ps_bench_stages(const bench_opts *o);

/* Shared by both modes (bench_report.c): the q-quantile of v[0..n) by linear interpolation (sorts v); a JSON
 * object with the fields of o both report (model, isa, activations, threads, n_prompt, n_gen);
 * printing it on one line (and freeing it). */
double ps_bench_quantile(double *v, int n, double q);
struct cJSON *ps_bench_json(const bench_opts *o);
void ps_bench_json_print(struct cJSON *j);

#endif
