/* shard_cache.h - a worker's shard cache (`pipeshard worker --cache DIR`): the shards
 * coordinators sent it, kept for the next session and the next start.
 *
 * DIR holds only files named <shard fingerprint>.gguf (a complete shard, checked when it was
 * received) and <shard fingerprint>.part (one transfer under way, or cut short and resumable);
 * the fingerprint is 32 lowercase hex digits (ps_fingerprint_ok), so no name from a peer can
 * reach outside DIR. Other files there are neither counted nor touched. A file's mtime says
 * when it was last used: the least recently used go first when room is needed, within
 * --max-disk and the filesystem's free space. */
#ifndef PS_SHARD_CACHE_H
#define PS_SHARD_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "stage.h"

typedef struct ps_shard_cache ps_shard_cache;

/* Opens DIR as a cache (created with mode 0700 when absent, parents too; it must be a
 * directory this process may write). max_bytes: the most its files may hold together (0: no
 * limit but the filesystem's free space). *out owned by the caller. */
ps_status ps_shard_cache_open(const char *dir, uint64_t max_bytes, ps_shard_cache **out, char *err, size_t errlen);
void ps_shard_cache_free(ps_shard_cache *c); /* NULL is a no-op */
const char *ps_shard_cache_dir(const ps_shard_cache *c);

/* DIR/<fp>.gguf (part false) or DIR/<fp>.part into out; PS_ERR_ARG when fp is not 32
 * lowercase hex digits, PS_ERR_RANGE when the path does not fit cap. */
ps_status ps_shard_cache_path(const ps_shard_cache *c, const char *fp, bool part, char *out, size_t cap, char *err,
                              size_t errlen);

/* How many complete shards the cache holds, and the bytes of all its files. */
void ps_shard_cache_usage(const ps_shard_cache *c, int *n_shards, uint64_t *bytes);

/* Makes room for fp's shard of `bytes`, `have` of them already in its .part: the cache's
 * other files plus `bytes` must fit max_bytes, and the filesystem must have bytes - have
 * free. Removes other files, least recently used first, until both hold; *evicted (may be
 * NULL) counts them. PS_ERR_RANGE, with both sizes in err, when the shard alone is larger
 * than max_bytes (then nothing is removed) or the free space cannot be found. */
ps_status ps_shard_cache_make_room(ps_shard_cache *c, const char *fp, uint64_t bytes, uint64_t have, int *evicted,
                                   char *err, size_t errlen);

/* Removes every .part file but keep's (keep NULL: all). */
void ps_shard_cache_drop_parts(ps_shard_cache *c, const char *keep);

/* Marks fp's .gguf as used now (its mtime), so that it is evicted last. */
void ps_shard_cache_touch(ps_shard_cache *c, const char *fp);

/* Checks the shard file at path against what PLACE offered: a GGUF shard whose pipeshard.*
 * metadata (model fingerprint, stage and count, layers, the model's layer count, shard
 * fingerprint) is the offer's and, when recompute, whose fingerprint recomputed from its
 * tensors (ps_shard_fingerprint) is the offered one. PS_ERR_FORMAT with what differs (both
 * values) in err; only reads the file. */
ps_status ps_shard_check(const char *path, const ps_place *offer, bool recompute, char *err, size_t errlen);

#endif
