/* shard_cache.c - a worker's shard cache (shard_cache.h). */
#include "shard_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

struct ps_shard_cache {
    char dir[4096];
    uint64_t max_bytes; /* 0: no limit but free space */
};

/* One file of the cache. */
typedef struct {
    char fp[33];
    bool part;             /* <fp>.part, else <fp>.gguf */
    uint64_t bytes;        /* its size */
    struct timespec mtime; /* last use */
} entry;

ps_status ps_shard_cache_open(const char *dir, uint64_t max_bytes, ps_shard_cache **out, char *err, size_t errlen) {
    *out = NULL;
    if (strlen(dir) >= sizeof((ps_shard_cache *)0)->dir - 40)
        return ps_errf(err, errlen, PS_ERR_ARG, "cache directory name is too long");
    ps_status s = ps_make_dirs(dir, 0700, err, errlen);
    if (s) return s;
    if (access(dir, W_OK | X_OK))
        return ps_errf(err, errlen, PS_ERR_IO, "cannot write to cache directory '%s': %s", dir, strerror(errno));
    ps_shard_cache *c = ps_calloc(1, sizeof *c);
    if (!c) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->max_bytes = max_bytes;
    *out = c;
    return PS_OK;
}

void ps_shard_cache_free(ps_shard_cache *c) { free(c); }

const char *ps_shard_cache_dir(const ps_shard_cache *c) { return c->dir; }

ps_status ps_shard_cache_path(const ps_shard_cache *c, const char *fp, bool part, char *out, size_t cap, char *err,
                              size_t errlen) {
    if (!ps_fingerprint_ok(fp, strnlen(fp, 33)))
        return ps_errf(err, errlen, PS_ERR_ARG, "'%.40s' is not a shard fingerprint (32 lowercase hex digits)", fp);
    char name[40];
    snprintf(name, sizeof name, "%s.%s", fp, part ? "part" : "gguf");
    return ps_path_join(out, cap, c->dir, name, err, errlen);
}

/* Whether name is <fp>.gguf or <fp>.part; fills e's fp and part. */
static bool parse_name(const char *name, entry *e) {
    size_t n = strlen(name);
    if (n != 37 || !ps_fingerprint_ok(name, 32) || name[32] != '.') return false;
    if (strcmp(name + 33, "gguf") && strcmp(name + 33, "part")) return false;
    memcpy(e->fp, name, 32);
    e->fp[32] = 0;
    e->part = !strcmp(name + 33, "part");
    return true;
}

/* The cache's files (regular files with our names only), in *out (caller frees), *n of
 * them; false when the directory cannot be read or memory runs out (then none). */
static bool list(const ps_shard_cache *c, entry **out, size_t *n) {
    *out = NULL, *n = 0;
    DIR *d = opendir(c->dir);
    if (!d) return false;
    entry *v = NULL;
    size_t cnt = 0, cap = 0;
    bool ok = true;
    for (struct dirent *de; ok && (de = readdir(d));) {
        entry e;
        struct stat sb;
        if (!parse_name(de->d_name, &e) || fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) ||
            !S_ISREG(sb.st_mode))
            continue;
        e.bytes = (uint64_t)sb.st_size, e.mtime = sb.st_mtim;
        if (cnt == cap) {
            entry *p = ps_realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!p) {
                ok = false;
                break;
            }
            v = p;
        }
        v[cnt++] = e;
    }
    closedir(d);
    if (!ok) {
        free(v);
        return false;
    }
    *out = v, *n = cnt;
    return true;
}

void ps_shard_cache_usage(const ps_shard_cache *c, int *n_shards, uint64_t *bytes) {
    entry *v;
    size_t n;
    *n_shards = 0, *bytes = 0;
    if (!list(c, &v, &n)) return;
    for (size_t i = 0; i < n; i++) *n_shards += !v[i].part, *bytes += v[i].bytes;
    free(v);
}

/* Removes e's file (ENOENT is fine: someone else removed it). */
static void remove_entry(const ps_shard_cache *c, const entry *e) {
    char path[4200];
    if (!ps_shard_cache_path(c, e->fp, e->part, path, sizeof path, NULL, 0)) unlink(path);
}

/* Bytes free for this process on the cache's filesystem (UINT64_MAX when unknown). */
static uint64_t free_bytes(const ps_shard_cache *c) {
    struct statvfs sv;
    if (statvfs(c->dir, &sv)) return UINT64_MAX;
    return (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
}

/* Whether entry a was used before b. */
static bool older(const entry *a, const entry *b) {
    return a->mtime.tv_sec != b->mtime.tv_sec ? a->mtime.tv_sec < b->mtime.tv_sec : a->mtime.tv_nsec < b->mtime.tv_nsec;
}

ps_status ps_shard_cache_make_room(ps_shard_cache *c, const char *fp, uint64_t bytes, uint64_t have, int *evicted,
                                   char *err, size_t errlen) {
    char a[32], b[32];
    if (evicted) *evicted = 0;
    if (c->max_bytes && bytes > c->max_bytes) {
        ps_size_format(bytes, a, sizeof a), ps_size_format(c->max_bytes, b, sizeof b);
        return ps_errf(err, errlen, PS_ERR_RANGE, "the shard is %s (%llu bytes), more than --max-disk %s (%llu bytes)",
                       a, (unsigned long long)bytes, b, (unsigned long long)c->max_bytes);
    }
    entry *v;
    size_t n;
    if (!list(c, &v, &n))
        return ps_errf(err, errlen, PS_ERR_IO, "cannot read cache directory '%s': %s", c->dir, strerror(errno));
    uint64_t others = 0, need = bytes > have ? bytes - have : 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].fp, fp)) others += v[i].bytes;
    for (;;) {
        bool over = c->max_bytes && others + bytes > c->max_bytes, short_of = free_bytes(c) < need;
        if (!over && !short_of) break;
        size_t old = n; /* the least recently used file of another shard */
        for (size_t i = 0; i < n; i++)
            if (strcmp(v[i].fp, fp) && (old == n || older(&v[i], &v[old]))) old = i;
        if (old == n) { /* nothing left to remove: only the free space can be short here */
            free(v);
            ps_size_format(need, a, sizeof a), ps_size_format(free_bytes(c), b, sizeof b);
            return ps_errf(err, errlen, PS_ERR_RANGE,
                           "the shard needs %s (%llu bytes) more on the filesystem of '%s', which has %s free", a,
                           (unsigned long long)need, c->dir, b);
        }
        remove_entry(c, &v[old]);
        others -= v[old].bytes;
        v[old] = v[--n];
        if (evicted) ++*evicted;
    }
    free(v);
    return PS_OK;
}

void ps_shard_cache_drop_parts(ps_shard_cache *c, const char *keep) {
    entry *v;
    size_t n;
    if (!list(c, &v, &n)) return;
    for (size_t i = 0; i < n; i++)
        if (v[i].part && (!keep || strcmp(v[i].fp, keep))) remove_entry(c, &v[i]);
    free(v);
}

void ps_shard_cache_touch(ps_shard_cache *c, const char *fp) {
    char path[4200];
    if (!ps_shard_cache_path(c, fp, false, path, sizeof path, NULL, 0)) utimensat(AT_FDCWD, path, NULL, 0);
}

ps_status ps_shard_check(const char *path, const ps_place *o, bool recompute, char *err, size_t errlen) {
    ps_gguf *g = NULL;
    ps_shard_meta sm;
    int n_layer = 0;
    char e[400] = "", fp[33];
    ps_status s = ps_gguf_open(path, &g, e, sizeof e);
    if (!s) s = ps_shard_meta_read(g, &sm, e, sizeof e);
    if (!s) s = ps_shard_n_layer(g, &n_layer, e, sizeof e);
    if (s == PS_ERR_NOMEM) {
        ps_gguf_close(g);
        return ps_errf(err, errlen, s, "%s", e);
    }
    if (s) {
        ps_gguf_close(g);
        return ps_errf(err, errlen, PS_ERR_FORMAT, "it is not a shard: %s", e);
    }
    if (!sm.present || sm.stage_index != o->stage || sm.stage_count != o->stage_count ||
        sm.layer_begin != o->layer_begin || sm.layer_end != o->layer_end || n_layer != o->n_layer ||
        strcmp(sm.model_fp, o->model_fp) || strcmp(sm.shard_fp, o->shard_fp)) {
        ps_gguf_close(g);
        if (!sm.present) return ps_errf(err, errlen, PS_ERR_FORMAT, "it is a whole model, not a shard");
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "it says stage %d of %d, layers %d..%d of %d, model %s, shard %s; the offer was stage %d of "
                       "%d, layers %d..%d of %d, model %s, shard %s",
                       sm.stage_index, sm.stage_count, sm.layer_begin, sm.layer_end, n_layer, sm.model_fp, sm.shard_fp,
                       o->stage, o->stage_count, o->layer_begin, o->layer_end, o->n_layer, o->model_fp, o->shard_fp);
    }
    s = recompute ? ps_shard_fingerprint(g, &sm, fp, e, sizeof e) : PS_OK;
    ps_gguf_close(g);
    if (s) return ps_errf(err, errlen, s, "%s", e);
    if (recompute && strcmp(fp, o->shard_fp))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "its contents have fingerprint %s, not the offered %s", fp,
                       o->shard_fp);
    return PS_OK;
}
