/* split_cache.h - where a local fleet's shards come from: a model split once into N stages
 * (balanced by the weight bytes a token reads on each stage) is kept in $PIPESHARD_CACHE (else $XDG_CACHE_HOME/pipeshard, else
 * ~/.cache/pipeshard) under splits/<model fingerprint>-N and reused while the model file is
 * unchanged; PIPESHARD_CACHE=off splits into the run's own directory each time. */
#ifndef PS_COORD_SPLIT_CACHE_H
#define PS_COORD_SPLIT_CACHE_H

#include "fleet.h"

/* Finds the cached split of model into n stages, or writes it (into the cache, or with the
 * cache off into run_dir/shards, reporting the bytes written to progress, which may be
 * NULL), and loads its fleet.json into *fleet. */
ps_status ps_split_cache_get(const char *model, int n, const char *run_dir, const ps_progress *progress,
                             ps_fleet *fleet, char *err, size_t errlen);

/* pipeshard's cache directory ($PIPESHARD_CACHE, else $XDG_CACHE_HOME/pipeshard, else
 * ~/.cache/pipeshard), or false when caching is off (PIPESHARD_CACHE=off) or unknown. */
bool ps_split_cache_root(char *out, size_t cap);

#endif
