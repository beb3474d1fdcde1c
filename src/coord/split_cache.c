/* split_cache.c - the split cache of local fleets (split_cache.h). */
#include "split_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Layer bounds of model for n stages that balance what a token costs each stage: the bytes of
 * its weights that every token reads. The embedding counts for nothing (a token reads one row
 * of it), the head in full (every sampled token runs it), so the last stage gets fewer layers
 * when the head is large (SmolLM2-135M's 49,152-row head: 19 + 11 layers, not 15 + 15). */
static ps_status plan(const char *model, int n, int *bounds, char *err, size_t errlen) {
    ps_gguf *g;
    ps_status s = ps_gguf_open(model, &g, err, errlen);
    if (s) return s;
    int n_layer = 0;
    s = ps_shard_n_layer(g, &n_layer, err, errlen);
    uint64_t *lb = s ? NULL : ps_calloc((size_t)n_layer, sizeof *lb), eb = 0, hb = 0;
    if (!s && !lb) s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    if (!s) s = ps_shard_layer_bytes(g, n_layer, lb, &eb, &hb, err, errlen);
    if (!s) s = ps_shard_plan(lb, n_layer, 0, hb, n, bounds, err, errlen);
    free(lb);
    ps_gguf_close(g);
    return s;
}

bool ps_split_cache_root(char *out, size_t cap) {
    const char *env = getenv("PIPESHARD_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && !strcmp(env, "off")) return false;
    if (env && *env)
        snprintf(out, cap, "%s", env);
    else if (xdg && *xdg)
        snprintf(out, cap, "%s/pipeshard", xdg);
    else if (home && *home)
        snprintf(out, cap, "%s/.cache/pipeshard", home);
    else
        return false;
    return true;
}

/* Whether dir holds a complete split of the model with fingerprint fp along bounds. */
static bool cached_split_ok(const char *dir, const char *fp, int n, const int *bounds, ps_fleet *fleet) {
    char path[4300];
    snprintf(path, sizeof path, "%s/fleet.json", dir);
    if (access(path, R_OK) || ps_fleet_load(path, fleet, NULL, 0) || strcmp(fleet->model_fp, fp) ||
        fleet->n_stages != n)
        return false;
    for (int k = 0; k < n; k++)
        if (fleet->stages[k].layer_begin != bounds[k] || fleet->stages[k].layer_end != bounds[k + 1] ||
            access(fleet->stages[k].shard, R_OK))
            return false;
    return true;
}

/* A split's bytes written, as progress "splitting model into N stages". */
typedef struct {
    const ps_progress *p;
    char what[64];
} split_progress;

static void on_split_bytes(void *ctx, uint64_t done, uint64_t total) {
    split_progress *sp = ctx;
    ps_progress_report(sp->p, sp->what, done, total);
}

/* See split_cache.h. */
ps_status ps_split_cache_get(const char *model, int n, const char *run_dir, const ps_progress *progress,
                             ps_fleet *fleet, char *err, size_t errlen) {
    int bounds[PS_SHARD_MAX_STAGES + 1];
    char dir[4200], fp[33], path[4300];
    ps_status s = plan(model, n, bounds, err, errlen);
    if (s) return s;
    if (ps_split_cache_root(dir, sizeof dir)) {
        if ((s = ps_fingerprint_file(model, fp, err, errlen))) return s;
        size_t len = strlen(dir);
        snprintf(dir + len, sizeof dir - len, "/splits/%s-%d", fp, n);
        if (cached_split_ok(dir, fp, n, bounds, fleet)) return PS_OK;
        char why[4400];
        if (ps_make_dirs(dir, 0700, why, sizeof why))
            return ps_errf(err, errlen, PS_ERR_IO,
                           "cannot create the split cache %s: %s (PIPESHARD_CACHE=off splits "
                           "into a temporary directory)",
                           dir, why);
    } else {
        snprintf(dir, sizeof dir, "%s/shards", run_dir);
        if (mkdir(dir, 0700)) return ps_errf(err, errlen, PS_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    }
    split_progress sp = {.p = progress};
    snprintf(sp.what, sizeof sp.what, "splitting model into %d stages", n);
    if ((s = ps_fleet_split(model, n, bounds, NULL, dir, on_split_bytes, &sp, err, errlen))) return s;
    snprintf(path, sizeof path, "%s/fleet.json", dir);
    return ps_fleet_load(path, fleet, err, errlen);
}
