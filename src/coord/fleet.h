/* fleet.h - fleet.json: the ordered stages of a split model and where each runs.
 *
 *   {"pipeshard_fleet": 1, "model": "<file name>", "model_fingerprint": "<hex>",
 *    "n_layer": L, "stages": [
 *      {"stage": 0, "shard": "stage-0.gguf", "layers": [0, 10], "bytes": B,
 *       "fingerprint": "<hex>", "address": "local"},
 *      {"stage": 1, "shard": "stage-1.gguf", "layers": [10, 30], "bytes": B,
 *       "fingerprint": "<hex>", "address": "127.0.0.1:7701"}, ...]}
 *
 * `split` writes it next to the shards (model/shard.h), one stage per line; the user edits
 * the addresses. Stage 0 always runs in the coordinator ("local"). Only the coordinator
 * and `split` read it. */
#ifndef PS_COORD_FLEET_H
#define PS_COORD_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include "../model/shard.h"
#include "../ps.h"

/* A loaded fleet.json. Paths are resolved relative to the directory of fleet.json. */
typedef struct {
    int index;
    char shard[4096];  /* path of the shard file */
    char address[256]; /* "local" for stage 0, else "HOST:PORT" or "unix:PATH" */
    int layer_begin, layer_end;
    char fingerprint[33];
    uint64_t bytes;
} ps_fleet_stage;

typedef struct {
    char model_fp[33];
    int n_layer;
    int n_stages;
    ps_fleet_stage stages[PS_SHARD_MAX_STAGES];
} ps_fleet;

/* Reads and validates fleet.json (every field present and typed, stages in order and
 * contiguous from 0 to n_layer, addresses parse, stage 0 "local"). Errors name the file
 * and the field. *out is caller-allocated. */
ps_status ps_fleet_load(const char *path, ps_fleet *out, char *err, size_t errlen);

/* Where a long wait reports what it is doing, for a progress line (the library prints
 * nothing): what ("splitting model into 2 stages", "starting 1 worker", "loading model",
 * "prompt") and done of total (total 0: no measure). Called on the waiting thread. */
typedef struct {
    void (*fn)(void *ctx, const char *what, uint64_t done, uint64_t total); /* NULL: none */
    void *ctx;
} ps_progress;

/* Calls p->fn when there is one (p may be NULL). */
void ps_progress_report(const ps_progress *p, const char *what, uint64_t done, uint64_t total);

/* Cuts the model into dir/stage-K.gguf along bounds (ps_shard_split) and writes
 * dir/fleet.json last, so that a fleet.json on disk never names shards that were not
 * written. addresses: n_stages - 1 addresses for stages 1.., or NULL for the defaults
 * 127.0.0.1:7701, 7702, ... fleet.json's "bytes" is each shard's file size. */
ps_status ps_fleet_split(const char *model_path, int n_stages, const int *bounds, const char *const *addresses,
                         const char *dir, ps_shard_progress_fn progress, void *progress_ctx, char *err, size_t errlen);

/* Longest PATH of a "unix:PATH" address (a socket address holds 108 bytes with its NUL). */
#define PS_UNIX_PATH_MAX 107
/* Whether s is a stage's address as fleet.json and `split --workers` take it: "HOST:PORT"
 * (a name, an IPv4 address or a bracketed IPv6 one; port 1..65535) or "unix:PATH". */
bool ps_fleet_address_ok(const char *s);

#endif
