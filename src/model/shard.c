/* shard.c - cutting a model by layers into shards, and their fingerprints (shard.h).
 *
 * A split reads the model through the validated mmap reader and writes each shard with the
 * streaming GGUF writer, handing it pointers into the model's mapping: no tensor is copied
 * in memory. Every shard's fingerprint is computed from the same tensor list, in the same
 * order, that the writer puts in the file, so that ps_shard_fingerprint of the written
 * shard gives it back. */
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_LAYERS PS_SHARD_MAX_LAYERS
#define HASH_CHUNK (4u << 20) /* ps_fingerprint_file reads this much at a time */

// ---------------------------------------------------------------------------------------
// Fingerprints

/* Writes h as 32 lowercase hex digits, high 64 bits first (XXH128_canonical order). */
static void hex128(XXH128_hash_t h, char hex[33]) {
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

bool ps_fingerprint_ok(const char *s, size_t len) {
    if (len != 32) return false;
    for (size_t i = 0; i < 32; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* See shard.h. Reads the file in HASH_CHUNK pieces; a file that shrinks or fails while
 * being read is an I/O error. */
ps_status ps_fingerprint_file(const char *path, char hex[33], char *err, size_t errlen) {
    if (!path || !hex) return ps_errf(err, errlen, PS_ERR_ARG, "ps_fingerprint_file: NULL path or output");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ps_errf(err, errlen, PS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    ps_status s = PS_OK;
    XXH3_state_t *st = XXH3_createState();
    void *buf = ps_malloc(HASH_CHUNK);
    if (!st || !buf) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory hashing '%s'", path);
        goto out;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_128bits_reset(st);
    for (;;) {
        ssize_t n = read(fd, buf, HASH_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            s = ps_errf(err, errlen, PS_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
            goto out;
        }
        if (n == 0) break;
        XXH3_128bits_update(st, buf, (size_t)n);
    }
    hex128(XXH3_128bits_digest(st), hex);
out:
    XXH3_freeState(st);
    free(buf);
    close(fd);
    return s;
}

/* Little-endian u32 / u64 into a hash state (the fingerprint's byte layout does not depend
 * on the host). */
static void hash_u32(XXH3_state_t *st, uint32_t v) {
    unsigned char b[4];
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
    XXH3_128bits_update(st, b, sizeof b);
}

static void hash_u64(XXH3_state_t *st, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    XXH3_128bits_update(st, b, sizeof b);
}

/* Starts a shard fingerprint: the model's fingerprint and the placement (shard.h). */
static void fp_begin(XXH3_state_t *st, const char *model_fp, int index, int count, int begin, int end) {
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, model_fp, 32);
    hash_u32(st, (uint32_t)index);
    hash_u32(st, (uint32_t)count);
    hash_u32(st, (uint32_t)begin);
    hash_u32(st, (uint32_t)end);
}

/* Adds one tensor, as it is (or will be) stored under `name`, to a shard fingerprint. */
static void fp_tensor(XXH3_state_t *st, const char *name, const ps_gguf_tensor *t) {
    size_t len = strlen(name);
    hash_u32(st, (uint32_t)len);
    XXH3_128bits_update(st, name, len);
    hash_u32(st, t->type);
    hash_u32(st, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) hash_u64(st, (uint64_t)t->ne[d]);
    XXH3_128bits_update(st, t->data, t->nbytes);
}

// ---------------------------------------------------------------------------------------
// Tensor placement

typedef enum {
    PLACE_LAYER, /* blk.N.*: the stage holding layer N */
    PLACE_EMBED, /* token_embd.*: stage 0 */
    PLACE_HEAD,  /* output_norm.*, output.*: the last stage */
    PLACE_ALL,   /* rope_freqs.*: every stage */
} place_kind;

/* True when name starts with prefix. */
static bool starts(const char *name, const char *prefix) { return !strncmp(name, prefix, strlen(prefix)); }

/* Where tensor `name` goes: its kind and, for blk.N.*, N (< n_layer). A tensor of no known
 * kind is refused rather than dropped, so that no shard silently lacks a weight. */
static ps_status classify(const char *name, int n_layer, place_kind *kind, int *layer, char *err, size_t errlen) {
    if (starts(name, "blk.")) {
        const char *p = name + 4;
        long n = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 9) n = n * 10 + (*p++ - '0'), digits++;
        if (!digits || *p != '.' || (digits > 1 && p[-digits] == '0'))
            return ps_errf(err, errlen, PS_ERR_FORMAT, "tensor '%s': cannot read its layer number", name);
        if (n >= n_layer)
            return ps_errf(err, errlen, PS_ERR_FORMAT, "tensor '%s' belongs to layer %ld, but block_count is %d", name,
                           n, n_layer);
        *kind = PLACE_LAYER;
        *layer = (int)n;
        return PS_OK;
    }
    *layer = -1;
    if (starts(name, "token_embd."))
        *kind = PLACE_EMBED;
    else if (starts(name, "output_norm.") || starts(name, "output."))
        *kind = PLACE_HEAD;
    else if (starts(name, "rope_freqs."))
        *kind = PLACE_ALL;
    else
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "tensor '%s' belongs to no stage (split places blk.N.*, token_embd.*, output_norm.*, "
                       "output.* and rope_freqs.*)",
                       name);
    return PS_OK;
}

/* True when stage k of n (layers [begin, end)) holds a tensor of this kind and layer. */
static bool stage_holds(place_kind kind, int layer, int k, int n, int begin, int end) {
    switch (kind) {
    case PLACE_LAYER: return layer >= begin && layer < end;
    case PLACE_EMBED: return k == 0;
    case PLACE_HEAD: return k == n - 1;
    case PLACE_ALL: return true;
    }
    return false;
}

ps_status ps_shard_n_layer(const ps_gguf *g, int *n_layer, char *err, size_t errlen) {
    ps_gguf_str arch;
    char key[160], why[256] = "";
    if (ps_gguf_get_str(g, "general.architecture", &arch, why, sizeof why))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "%s", *why ? why : "metadata lacks 'general.architecture'");
    snprintf(key, sizeof key, "%.*s.block_count", (int)(arch.len > 100 ? 100 : arch.len), arch.data);
    uint32_t v;
    ps_status s = ps_gguf_get_u32(g, key, &v, why, sizeof why);
    if (s == PS_ERR_NOT_FOUND) return ps_errf(err, errlen, s, "metadata lacks '%s'", key);
    if (s) return ps_errf(err, errlen, s, "%s", why);
    if (v < 1 || v > 1u << 20) return ps_errf(err, errlen, PS_ERR_RANGE, "%s = %u is out of range", key, v);
    *n_layer = (int)v;
    return PS_OK;
}

/* See shard.h. Every tensor must have a place (classify) and every layer at least one
 * tensor; the embedding must be present. Tied models (no output.weight) count the
 * embedding's bytes in the head too, since the last stage gets a copy. */
ps_status ps_shard_layer_bytes(const ps_gguf *g, int n_layer, uint64_t *layer_bytes, uint64_t *embed_bytes,
                               uint64_t *head_bytes, char *err, size_t errlen) {
    if (!g || !layer_bytes || !embed_bytes || !head_bytes)
        return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_layer_bytes: NULL argument");
    if (n_layer < 1 || n_layer > MAX_LAYERS)
        return ps_errf(err, errlen, PS_ERR_RANGE, "block_count %d is out of range (1..%d)", n_layer, MAX_LAYERS);
    memset(layer_bytes, 0, (size_t)n_layer * sizeof *layer_bytes);
    *embed_bytes = *head_bytes = 0;
    int *count = ps_calloc((size_t)n_layer, sizeof *count);
    if (!count) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_status s = PS_OK;
    for (int64_t i = 0; i < ps_gguf_n_tensors(g) && !s; i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, i);
        place_kind kind;
        int layer;
        if ((s = classify(t->name, n_layer, &kind, &layer, err, errlen))) break;
        if (kind == PLACE_LAYER)
            layer_bytes[layer] += t->nbytes, count[layer]++;
        else if (kind == PLACE_EMBED)
            *embed_bytes += t->nbytes;
        else if (kind == PLACE_HEAD)
            *head_bytes += t->nbytes;
    }
    for (int l = 0; l < n_layer && !s; l++)
        if (!count[l])
            s = ps_errf(err, errlen, PS_ERR_FORMAT, "the model has no tensors for layer %d (blk.%d.*) of %d", l, l,
                        n_layer);
    free(count);
    if (s) return s;
    const ps_gguf_tensor *emb = ps_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return ps_errf(err, errlen, PS_ERR_FORMAT, "the model lacks tensor 'token_embd.weight'");
    if (!ps_gguf_find_tensor(g, "output.weight")) *head_bytes += emb->nbytes;
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Plan

/* Bytes of the stage [i, j) (prefix sums pre) as stage k of n. */
static uint64_t stage_cost(const uint64_t *pre, int i, int j, int k, int n, uint64_t embed, uint64_t head) {
    return pre[j] - pre[i] + (k == 0 ? embed : 0) + (k == n - 1 ? head : 0);
}

/* The smallest possible largest stage: best[k][j] is the minimax cost of cutting layers
 * [0, j) into stages 0..k (k < n - 1 in the sense that the head is only added on stage
 * n - 1). Scanning i downwards, the last stage's cost only grows, so the scan stops once it
 * passes the best found. */
static uint64_t plan_minimax(const uint64_t *pre, int L, int n, uint64_t embed, uint64_t head, uint64_t *best) {
#define B(k, j) best[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    for (int k = 0; k < n; k++)
        for (int j = 0; j <= L; j++) {
            B(k, j) = UINT64_MAX;
            if (j < k + 1 || (k == n - 1 && j != L)) continue;
            if (k == 0) {
                B(k, j) = stage_cost(pre, 0, j, 0, n, embed, head);
                continue;
            }
            for (int i = j - 1; i >= k; i--) {
                uint64_t c = stage_cost(pre, i, j, k, n, embed, head);
                if (c >= B(k, j)) break;
                uint64_t m = B(k - 1, i) > c ? B(k - 1, i) : c;
                if (m < B(k, j)) B(k, j) = m;
            }
        }
    return B(n - 1, L);
#undef B
}

/* Among the cuts whose every stage costs at most cap, the one with the smallest sum of
 * squared stage sizes (the most even one); writes bounds. sq[k][j] is that sum for layers
 * [0, j) in stages 0..k, from[k][j] the start of stage k. Ties keep the later cut. */
static void plan_even(const uint64_t *pre, int L, int n, uint64_t embed, uint64_t head, uint64_t cap, double *sq,
                      int *from, int *bounds) {
#define S(k, j) sq[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
#define F(k, j) from[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    for (int k = 0; k < n; k++)
        for (int j = 0; j <= L; j++) {
            S(k, j) = INFINITY;
            F(k, j) = -1;
            if (j < k + 1 || (k == n - 1 && j != L)) continue;
            if (k == 0) {
                uint64_t c = stage_cost(pre, 0, j, 0, n, embed, head);
                if (c <= cap) S(k, j) = (double)c * (double)c, F(k, j) = 0;
                continue;
            }
            for (int i = j - 1; i >= k; i--) {
                uint64_t c = stage_cost(pre, i, j, k, n, embed, head);
                if (c > cap) break;
                double v = S(k - 1, i) + (double)c * (double)c;
                if (v < S(k, j)) S(k, j) = v, F(k, j) = i;
            }
        }
    bounds[n] = L;
    for (int k = n - 1; k >= 0; k--) bounds[k] = F(k, bounds[k + 1]);
#undef S
#undef F
}

/* See shard.h. Exact: a dynamic programme finds the smallest possible largest stage, and a
 * second one picks, among the cuts that reach it, the most even. O(n_stages * n_layer^2)
 * at worst, far less in practice. */
ps_status ps_shard_plan(const uint64_t *layer_bytes, int n_layer, uint64_t embed_bytes, uint64_t head_bytes,
                        int n_stages, int *bounds, char *err, size_t errlen) {
    if (!layer_bytes || !bounds) return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_plan: NULL argument");
    if (n_layer < 1 || n_layer > MAX_LAYERS)
        return ps_errf(err, errlen, PS_ERR_RANGE, "layer count %d is out of range (1..%d)", n_layer, MAX_LAYERS);
    if (n_stages < 1 || n_stages > PS_SHARD_MAX_STAGES)
        return ps_errf(err, errlen, PS_ERR_RANGE, "stage count %d is out of range (1..%d)", n_stages,
                       PS_SHARD_MAX_STAGES);
    if (n_stages > n_layer)
        return ps_errf(err, errlen, PS_ERR_RANGE,
                       "cannot cut %d layer%s into %d stages: every stage needs at least one layer", n_layer,
                       n_layer == 1 ? "" : "s", n_stages);
    size_t cells = (size_t)n_stages * (size_t)(n_layer + 1);
    uint64_t *pre = ps_malloc((size_t)(n_layer + 1) * sizeof *pre);
    uint64_t *best = ps_malloc(cells * sizeof *best);
    double *sq = ps_malloc(cells * sizeof *sq);
    int *from = ps_malloc(cells * sizeof *from);
    ps_status s = PS_OK;
    if (!pre || !best || !sq || !from) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory planning %d stages", n_stages);
        goto out;
    }
    pre[0] = 0;
    for (int l = 0; l < n_layer; l++) {
        if (layer_bytes[l] > UINT64_MAX / 4 - pre[l]) {
            s = ps_errf(err, errlen, PS_ERR_RANGE, "layer sizes overflow");
            goto out;
        }
        pre[l + 1] = pre[l] + layer_bytes[l];
    }
    if (embed_bytes > UINT64_MAX / 4 || head_bytes > UINT64_MAX / 4) {
        s = ps_errf(err, errlen, PS_ERR_RANGE, "embedding or head size overflows");
        goto out;
    }
    uint64_t cap = plan_minimax(pre, n_layer, n_stages, embed_bytes, head_bytes, best);
    plan_even(pre, n_layer, n_stages, embed_bytes, head_bytes, cap, sq, from, bounds);
    for (int k = 0; k < n_stages; k++)
        if (bounds[k] < 0 || bounds[k] >= bounds[k + 1]) {
            s = ps_errf(err, errlen, PS_ERR_INTERNAL, "plan: stage %d has no layers", k);
            break;
        }
out:
    free(pre);
    free(best);
    free(sq);
    free(from);
    return s;
}

/* Parses a decimal int of at most 9 digits at *p (advancing it); false when there is none. */
static bool parse_uint(const char **p, int *out) {
    int v = 0, digits = 0;
    while (**p >= '0' && **p <= '9') {
        if (++digits > 9) return false;
        v = v * 10 + (*(*p)++ - '0');
    }
    *out = v;
    return digits > 0;
}

/* See shard.h. bounds needs PS_SHARD_MAX_STAGES + 1 entries when n_stages <= 0. Messages
 * name the offending range by its position (1-based) and text. */
ps_status ps_shard_parse_layers(const char *spec, int n_layer, int n_stages, int *bounds, int *n_out, char *err,
                                size_t errlen) {
    if (!spec || !bounds) return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_parse_layers: NULL argument");
    if (n_out) *n_out = 0;
    const char *p = spec;
    int n = 0, prev_end = 0;
    if (!*p) return ps_errf(err, errlen, PS_ERR_ARG, "empty layer ranges (expected BEGIN:END,... e.g. 0:8,8:16)");
    for (;;) {
        const char *start = p;
        int b, e;
        if (!parse_uint(&p, &b) || *p++ != ':' || !parse_uint(&p, &e) || (*p && *p != ',')) {
            size_t len = strcspn(start, ",");
            return ps_errf(err, errlen, PS_ERR_ARG, "range %d '%.*s' is not BEGIN:END (expected e.g. 0:8,8:16,16:30)",
                           n + 1, (int)(len > 64 ? 64 : len), start);
        }
        if (n >= PS_SHARD_MAX_STAGES)
            return ps_errf(err, errlen, PS_ERR_RANGE, "more than %d ranges", PS_SHARD_MAX_STAGES);
        if (b > e || (b == e && n > 0)) /* the first may be 0:0: stage 0 with the embedding alone */
            return ps_errf(err, errlen, PS_ERR_ARG, "range %d '%d:%d' is empty (only the first may be: 0:0)", n + 1, b,
                           e);
        if (n == 0 && b != 0) return ps_errf(err, errlen, PS_ERR_ARG, "the first range '%d:%d' must start at 0", b, e);
        if (n > 0 && b != prev_end)
            return ps_errf(err, errlen, PS_ERR_ARG, "range %d '%d:%d' must start at %d where range %d ends (%s)", n + 1,
                           b, e, prev_end, n, b < prev_end ? "overlap" : "gap");
        if (e > n_layer)
            return ps_errf(err, errlen, PS_ERR_RANGE, "range %d '%d:%d' goes past the model's %d layers", n + 1, b, e,
                           n_layer);
        if (n_stages > 0 && n >= n_stages)
            return ps_errf(err, errlen, PS_ERR_ARG, "more than the %d ranges --stages %d asks for", n_stages, n_stages);
        bounds[n++] = b;
        prev_end = e;
        if (!*p) break;
        p++;
    }
    if (prev_end != n_layer)
        return ps_errf(err, errlen, PS_ERR_ARG, "the last range ends at %d, but the model has %d layers", prev_end,
                       n_layer);
    if (n_stages > 0 && n != n_stages)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d range%s given, but --stages is %d", n, n == 1 ? "" : "s", n_stages);
    bounds[n] = n_layer;
    if (n_out) *n_out = n;
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Split

/* One tensor of a shard: its name in the shard and the model tensor that holds its bytes. */
typedef struct {
    const char *name;
    const ps_gguf_tensor *src;
} shard_tensor;

/* What a split knows about the model while it writes shards. */
typedef struct {
    const ps_gguf *g;
    int n_layer, n_stages;
    const int *bounds;
    bool tied;      /* no output.weight: the last stage gets a copy of token_embd */
    uint32_t vocab; /* rows of token_embd.weight */
    char model_fp[33];
    shard_tensor *list; /* tensors of the stage being written (n_tensors + 1 capacity) */
    int n_list;
    ps_shard_progress_fn progress;
    void *progress_ctx;
    uint64_t done, total; /* tensor bytes written in earlier shards, in all shards */
} split_ctx;

/* Fills sc->list with stage k's tensors in the order they go into its file: the model's
 * order, with the tied copy of token_embd.weight (as output.weight) where the embedding is. */
static void stage_tensors(split_ctx *sc, int k) {
    int n = sc->n_stages, begin = sc->bounds[k], end = sc->bounds[k + 1];
    sc->n_list = 0;
    for (int64_t i = 0; i < ps_gguf_n_tensors(sc->g); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(sc->g, i);
        place_kind kind;
        int layer;
        if (classify(t->name, sc->n_layer, &kind, &layer, NULL, 0)) continue; /* checked before */
        if (stage_holds(kind, layer, k, n, begin, end)) sc->list[sc->n_list++] = (shard_tensor){t->name, t};
        if (sc->tied && k == n - 1 && !strcmp(t->name, "token_embd.weight"))
            sc->list[sc->n_list++] = (shard_tensor){"output.weight", t};
    }
}

/* The fingerprint of stage k from sc->list (shard.h). */
static ps_status stage_fingerprint(const split_ctx *sc, int k, char hex[33], char *err, size_t errlen) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    fp_begin(st, sc->model_fp, k, sc->n_stages, sc->bounds[k], sc->bounds[k + 1]);
    for (int i = 0; i < sc->n_list; i++) fp_tensor(st, sc->list[i].name, sc->list[i].src);
    hex128(XXH3_128bits_digest(st), hex);
    XXH3_freeState(st);
    return PS_OK;
}

/* Copies every metadata key of the model but pipeshard.* into w. general.alignment is
 * written as the reader understood it (a UINT32), whatever integer type the file used. */
static ps_status copy_metadata(const ps_gguf *g, ps_gguf_writer *w) {
    for (int64_t i = 0; i < ps_gguf_n_kv(g); i++) {
        const char *key = ps_gguf_kv_key(g, i);
        ps_status s;
        if (starts(key, "pipeshard.")) continue;
        if (!strcmp(key, "general.alignment"))
            s = ps_gguf_writer_set_u32(w, key, ps_gguf_alignment(g));
        else
            s = ps_gguf_writer_set_value(w, key, ps_gguf_kv_value(g, i));
        if (s) return s;
    }
    return PS_OK;
}

/* Writer progress over one shard, reported as progress over all shards. */
static void write_progress(void *ctx, uint64_t done, uint64_t total) {
    (void)total;
    split_ctx *sc = ctx;
    if (sc->progress) sc->progress(sc->progress_ctx, sc->done + done, sc->total);
}

/* Writes stage k to path, with its fingerprint in hex (computed here). */
static ps_status write_stage(split_ctx *sc, int k, const char *path, char hex[33], char *err, size_t errlen) {
    ps_gguf_writer *w = NULL;
    uint64_t bytes = 0;
    ps_status s;
    stage_tensors(sc, k);
    if ((s = stage_fingerprint(sc, k, hex, err, errlen))) return s;
    if ((s = ps_gguf_writer_create(&w, ps_gguf_version(sc->g), 0))) goto describe;
    if ((s = copy_metadata(sc->g, w)) || (s = ps_gguf_writer_set_u32(w, "pipeshard.shard.version", 1)) ||
        (s = ps_gguf_writer_set_u32(w, "pipeshard.stage.index", (uint32_t)k)) ||
        (s = ps_gguf_writer_set_u32(w, "pipeshard.stage.count", (uint32_t)sc->n_stages)) ||
        (s = ps_gguf_writer_set_u32(w, "pipeshard.layer_begin", (uint32_t)sc->bounds[k])) ||
        (s = ps_gguf_writer_set_u32(w, "pipeshard.layer_end", (uint32_t)sc->bounds[k + 1])) ||
        (s = ps_gguf_writer_set_u32(w, "pipeshard.vocab_size", sc->vocab)) ||
        (s = ps_gguf_writer_set_str(w, "pipeshard.model_fingerprint", sc->model_fp)) ||
        (s = ps_gguf_writer_set_str(w, "pipeshard.shard_fingerprint", hex)))
        goto describe;
    for (int i = 0; i < sc->n_list; i++) {
        const ps_gguf_tensor *t = sc->list[i].src;
        if ((s = ps_gguf_writer_add_tensor(w, sc->list[i].name, t->type, t->n_dims, t->ne, t->data, NULL, NULL)))
            goto describe;
        bytes += t->nbytes;
    }
    s = ps_gguf_writer_write(w, path, write_progress, sc, err, errlen);
    sc->done += bytes;
    ps_gguf_writer_free(w);
    return s;
describe:
    ps_gguf_writer_free(w);
    return ps_errf(err, errlen, s, "cannot describe stage %d: %s", k, ps_strerror(s));
}

/* Reads "<general.architecture>.block_count" into *n (1..MAX_LAYERS). */
static ps_status read_block_count(const ps_gguf *g, int *n, char *err, size_t errlen) {
    ps_gguf_str arch;
    ps_status s = ps_gguf_get_str(g, "general.architecture", &arch, err, errlen);
    if (s == PS_ERR_NOT_FOUND) return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata lacks 'general.architecture'");
    if (s) return s;
    char key[128];
    int k = snprintf(key, sizeof key, "%.*s.block_count", (int)(arch.len > 100 ? 100 : arch.len), arch.data);
    if (k < 0 || arch.len > 100 || memchr(arch.data, 0, arch.len))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "general.architecture is not a plain name");
    uint32_t v;
    s = ps_gguf_get_u32(g, key, &v, err, errlen);
    if (s == PS_ERR_NOT_FOUND) return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata lacks '%s'", key);
    if (s) return s;
    if (v < 1 || v > MAX_LAYERS)
        return ps_errf(err, errlen, PS_ERR_RANGE, "%s = %u is out of range (1..%d)", key, v, MAX_LAYERS);
    *n = (int)v;
    return PS_OK;
}

/* Checks bounds: 0 = bounds[0] < ... < bounds[n] = n_layer, but for stage 0 of several,
 * which may hold no layer (bounds[1] = 0: the embedding alone). */
static ps_status check_bounds(const int *bounds, int n, int n_layer, char *err, size_t errlen) {
    if (bounds[0] != 0 || bounds[n] != n_layer)
        return ps_errf(err, errlen, PS_ERR_ARG, "layer ranges must run from 0 to %d, not %d to %d", n_layer, bounds[0],
                       bounds[n]);
    for (int k = 0; k < n; k++)
        if (bounds[k] > bounds[k + 1] || (bounds[k] == bounds[k + 1] && (k > 0 || n < 2)))
            return ps_errf(err, errlen, PS_ERR_ARG, "stage %d has no layers (%d:%d)", k, bounds[k], bounds[k + 1]);
    return PS_OK;
}

/* Opens the model for a split and fills what sc needs about it: the layer count (which
 * must match the plan), the tied flag, the vocabulary. Refuses a shard as input. */
static ps_status open_model(const char *model_path, int n_stages, const int *bounds, ps_gguf **g, split_ctx *sc,
                            char *err, size_t errlen) {
    ps_status s = ps_gguf_open(model_path, g, err, errlen);
    if (s) return s;
    ps_shard_meta meta;
    if ((s = ps_shard_meta_read(*g, &meta, err, errlen))) return s;
    if (meta.present)
        return ps_errf(err, errlen, PS_ERR_ARG, "'%s' is a shard (stage %d of %d), not a whole model", model_path,
                       meta.stage_index, meta.stage_count);
    if ((s = read_block_count(*g, &sc->n_layer, err, errlen))) return s;
    if (n_stages > sc->n_layer + (bounds[1] == 0))
        return ps_errf(err, errlen, PS_ERR_RANGE,
                       "cannot cut %d layer%s into %d stages: every stage needs at least one layer", sc->n_layer,
                       sc->n_layer == 1 ? "" : "s", n_stages);
    if ((s = check_bounds(bounds, n_stages, sc->n_layer, err, errlen))) return s;
    uint64_t *lb = ps_malloc((size_t)sc->n_layer * sizeof *lb), eb, hb;
    if (!lb) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    s = ps_shard_layer_bytes(*g, sc->n_layer, lb, &eb, &hb, err, errlen); /* every tensor has a place */
    free(lb);
    if (s) return s;
    const ps_gguf_tensor *emb = ps_gguf_find_tensor(*g, "token_embd.weight");
    if (emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > UINT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "tensor 'token_embd.weight' does not have a vocabulary shape");
    sc->vocab = (uint32_t)emb->ne[1];
    sc->tied = ps_gguf_find_tensor(*g, "output.weight") == NULL;
    return PS_OK;
}

/* See shard.h. Order: check arguments, open the model, hash it, then write every shard
 * (each with its fingerprint). out->bytes is each shard's file size. */
ps_status ps_shard_split(const char *model_path, int n_stages, const int *bounds, const char *dir,
                         ps_shard_progress_fn progress, void *progress_ctx, ps_shard_files *out, char *err,
                         size_t errlen) {
    if (!model_path || !bounds || !dir || !out)
        return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_split: NULL argument");
    if (n_stages < 1 || n_stages > PS_SHARD_MAX_STAGES)
        return ps_errf(err, errlen, PS_ERR_RANGE, "stage count %d is out of range (1..%d)", n_stages,
                       PS_SHARD_MAX_STAGES);
    memset(out, 0, sizeof *out);
    split_ctx sc = {.n_stages = n_stages, .bounds = bounds, .progress = progress, .progress_ctx = progress_ctx};
    ps_gguf *g = NULL;
    char path[4096];
    ps_status s;
    if ((s = open_model(model_path, n_stages, bounds, &g, &sc, err, errlen))) goto out;
    sc.g = g;
    if (!(sc.list = ps_calloc((size_t)ps_gguf_n_tensors(g) + 1, sizeof *sc.list))) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int k = 0; k < n_stages; k++) {
        stage_tensors(&sc, k);
        for (int i = 0; i < sc.n_list; i++) sc.total += sc.list[i].src->nbytes;
    }
    if ((s = ps_fingerprint_file(model_path, sc.model_fp, err, errlen)) || (s = ps_make_dirs(dir, 0755, err, errlen)))
        goto out;
    for (int k = 0; k < n_stages; k++) {
        snprintf(out->file[k], sizeof out->file[k], "stage-%d.gguf", k);
        struct stat sb;
        if ((s = ps_path_join(path, sizeof path, dir, out->file[k], err, errlen)) ||
            (s = write_stage(&sc, k, path, out->fingerprint[k], err, errlen)))
            goto out;
        if (stat(path, &sb) < 0) {
            s = ps_errf(err, errlen, PS_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
            goto out;
        }
        out->bytes[k] = (uint64_t)sb.st_size;
    }
    memcpy(out->model_fp, sc.model_fp, sizeof out->model_fp);
    out->n_layer = sc.n_layer;
out:
    ps_gguf_close(g);
    free(sc.list);
    return s;
}

// ---------------------------------------------------------------------------------------
// Shard metadata

/* A pipeshard.* u32 key: present and of type UINT32. */
static ps_status meta_u32(const ps_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen) {
    const ps_gguf_value *v = ps_gguf_get(g, key);
    if (!v) return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata lacks '%s'", key);
    if (v->type != PS_GGUF_U32)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata '%s' is %s, expected UINT32", key,
                       ps_gguf_vtype_name(v->type));
    *out = (uint32_t)v->u64;
    return PS_OK;
}

/* A pipeshard.* fingerprint key: a STRING of 32 lowercase hex digits, copied to out. */
static ps_status meta_fp(const ps_gguf *g, const char *key, char out[33], char *err, size_t errlen) {
    const ps_gguf_value *v = ps_gguf_get(g, key);
    if (!v) return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata lacks '%s'", key);
    if (v->type != PS_GGUF_STRING)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata '%s' is %s, expected STRING", key,
                       ps_gguf_vtype_name(v->type));
    if (!ps_fingerprint_ok(v->str.data, v->str.len))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata '%s' is not 32 lowercase hex digits", key);
    memcpy(out, v->str.data, 32);
    out[32] = 0;
    return PS_OK;
}

/* See shard.h. Any pipeshard.* key makes the file a shard; then every key must be there,
 * typed as written, and consistent: index < count <= layers, begin < end <= block_count,
 * stage 0 (and only it) starting at layer 0, the last stage (and only it) ending at
 * block_count. */
ps_status ps_shard_meta_read(const ps_gguf *g, ps_shard_meta *out, char *err, size_t errlen) {
    if (!g || !out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_meta_read: NULL argument");
    memset(out, 0, sizeof *out);
    bool any = false;
    for (int64_t i = 0; i < ps_gguf_n_kv(g) && !any; i++) any = starts(ps_gguf_kv_key(g, i), "pipeshard.");
    if (!any) return PS_OK;
    uint32_t ver = 0, idx = 0, cnt = 0, beg = 0, end = 0, voc = 0;
    int n_layer = 0;
    ps_status s;
    if ((s = meta_u32(g, "pipeshard.shard.version", &ver, err, errlen))) return s;
    if (ver != 1)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "shard format version %u is not supported (only 1)", ver);
    if ((s = meta_u32(g, "pipeshard.stage.index", &idx, err, errlen)) ||
        (s = meta_u32(g, "pipeshard.stage.count", &cnt, err, errlen)) ||
        (s = meta_u32(g, "pipeshard.layer_begin", &beg, err, errlen)) ||
        (s = meta_u32(g, "pipeshard.layer_end", &end, err, errlen)) ||
        (s = meta_u32(g, "pipeshard.vocab_size", &voc, err, errlen)) ||
        (s = meta_fp(g, "pipeshard.model_fingerprint", out->model_fp, err, errlen)) ||
        (s = meta_fp(g, "pipeshard.shard_fingerprint", out->shard_fp, err, errlen)) ||
        (s = read_block_count(g, &n_layer, err, errlen))) {
        memset(out, 0, sizeof *out);
        return s;
    }
    if (cnt < 1 || cnt > PS_SHARD_MAX_STAGES || cnt > (uint32_t)n_layer + 1 || idx >= cnt)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata: stage %u of %u is out of range (count 1..%d)", idx,
                       cnt, n_layer < PS_SHARD_MAX_STAGES ? n_layer + 1 : PS_SHARD_MAX_STAGES);
    if (beg > end || end > (uint32_t)n_layer || (beg == end && (idx != 0 || cnt < 2)))
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "shard metadata: layers %u:%u are not a range within 0:%d (only stage 0 of several may hold "
                       "none)",
                       beg, end, n_layer);
    if ((idx == 0 && beg != 0) || (beg == 0 && idx > 1) || /* stage 1 starts at 0 after an empty stage 0 */
        (idx == cnt - 1) != (end == (uint32_t)n_layer))
        return ps_errf(err, errlen, PS_ERR_FORMAT,
                       "shard metadata: stage %u of %u cannot hold layers %u:%u of %d (the first stage starts at 0, "
                       "the last ends at block_count)",
                       idx, cnt, beg, end, n_layer);
    if (voc < 1 || voc > INT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "shard metadata: vocab_size %u is out of range", voc);
    out->present = true;
    out->stage_index = (int)idx;
    out->stage_count = (int)cnt;
    out->layer_begin = (int)beg;
    out->layer_end = (int)end;
    out->vocab = (int)voc;
    return PS_OK;
}

/* See shard.h. meta supplies the model fingerprint and placement (normally read from the
 * same file by ps_shard_meta_read); the tensors come from the file, in its order. */
ps_status ps_shard_fingerprint(const ps_gguf *shard, const ps_shard_meta *meta, char hex[33], char *err,
                               size_t errlen) {
    if (!shard || !meta || !hex) return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_fingerprint: NULL argument");
    if (!meta->present) return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_fingerprint: the file is not a shard");
    if (!ps_fingerprint_ok(meta->model_fp, strnlen(meta->model_fp, 33)))
        return ps_errf(err, errlen, PS_ERR_ARG, "ps_shard_fingerprint: malformed model fingerprint");
    XXH3_state_t *st = XXH3_createState();
    if (!st) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    fp_begin(st, meta->model_fp, meta->stage_index, meta->stage_count, meta->layer_begin, meta->layer_end);
    for (int64_t i = 0; i < ps_gguf_n_tensors(shard); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(shard, i);
        fp_tensor(st, t->name, t);
    }
    hex128(XXH3_128bits_digest(st), hex);
    XXH3_freeState(st);
    return PS_OK;
}
