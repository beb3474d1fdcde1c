/* kv_file.c - a stage's keys and values of a prefix, saved to a file and restored (stage.h:
 * ps_stage_kv_save / ps_stage_kv_load).
 *
 * The file (little-endian): a 120-byte header (kv_hdr), the prefix's token ids (n_blocks ×
 * PS_KV_BLOCK i32), then per block and per local layer its keys and its values (n_head_kv ×
 * PS_KV_BLOCK × head_dim f32 each), then the XXH3-64 of everything before. The header names
 * what made the numbers: the model's and the shard's fingerprints, the layer range, the shape
 * and the matmul arithmetic (q8 and f32 give different keys); a file is restored only by a
 * stage that would have computed the same bits. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "stage_internal.h"

#define KV_MAGIC "PSKVBLK1"

typedef struct {
    char magic[8];       /* KV_MAGIC */
    uint32_t block;      /* PS_KV_BLOCK */
    uint32_t n_blocks;   /* blocks saved */
    char model_fp[32];   /* the whole model's fingerprint (hex, no NUL) */
    char shard_fp[32];   /* the shard's (zeros for a whole model) */
    int32_t layer_begin; /* the stage's layers */
    int32_t layer_end;
    int32_t n_head_kv; /* the shape of a block's keys and values */
    int32_t head_dim;
    uint32_t act;          /* ps_act of the session that computed them */
    uint32_t reserved;     /* 0 */
    uint64_t id;           /* the prefix's id (the coordinator's) */
    uint64_t reserved2[1]; /* 0 */
} kv_hdr;
_Static_assert(sizeof(kv_hdr) == 120, "kv file header is 120 bytes");

ps_status ps_stage_model_fp(ps_stage *s, char out[33], char *err, size_t errlen) {
    if (s->m->shard.present) {
        snprintf(out, 33, "%s", s->m->shard.model_fp);
        return PS_OK;
    }
    if (!s->model_fp[0]) {
        ps_status st = ps_fingerprint_file(s->path, s->model_fp, err, errlen);
        if (st) return st;
    }
    snprintf(out, 33, "%s", s->model_fp);
    return PS_OK;
}

/* This stage's header for n blocks of prefix id: the identity of what computes its keys. */
static ps_status stage_hdr(ps_stage *s, uint64_t id, int n, kv_hdr *h, char *err, size_t errlen) {
    const ps_model *m = s->m;
    memset(h, 0, sizeof *h);
    memcpy(h->magic, KV_MAGIC, 8);
    char fp[33];
    ps_status st = ps_stage_model_fp(s, fp, err, errlen);
    if (st) return st;
    memcpy(h->model_fp, fp, 32);
    if (m->shard.present) memcpy(h->shard_fp, m->shard.shard_fp, 32);
    h->block = PS_KV_BLOCK, h->n_blocks = (uint32_t)n, h->id = id;
    h->layer_begin = m->layer_begin, h->layer_end = m->layer_end;
    h->n_head_kv = m->hp.n_head_kv, h->head_dim = m->hp.head_dim, h->act = (uint32_t)s->cp.act;
    return PS_OK;
}

/* Checks the blocks of a save or load: the session's pool, no block twice. */
static ps_status check_blocks(const ps_stage *s, const int32_t *blocks, int n, char *err, size_t errlen) {
    if (!s->ctx) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "no session: no KV blocks to save or load");
    int pool = ps_ctx_n_blocks(s->ctx);
    if (n < 1 || n > pool) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "%d KV blocks (the pool has %d)", n, pool);
    for (int i = 0; i < n; i++) {
        if (blocks[i] < 0 || blocks[i] >= pool)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "KV block %d is outside the pool (0..%d)", blocks[i],
                           pool - 1);
        for (int j = 0; j < i; j++)
            if (blocks[j] == blocks[i])
                return ps_errf(err, errlen, PS_ERR_PROTOCOL, "KV block %d is named twice", blocks[i]);
    }
    return PS_OK;
}

/* Writes p[0..n) to f, adding it to the running hash. */
static bool put(FILE *f, XXH3_state_t *h, const void *p, size_t n) {
    XXH3_64bits_update(h, p, n);
    return fwrite(p, 1, n, f) == n;
}

ps_status ps_stage_kv_save(ps_stage *s, const char *path, uint64_t id, const int32_t *blocks, int n,
                           const int32_t *tokens, char *err, size_t errlen) {
    ps_status st = check_blocks(s, blocks, n, err, errlen);
    for (int i = 0; !st && i < n; i++)
        if (s->filled[blocks[i]] != PS_KV_BLOCK)
            st = ps_errf(err, errlen, PS_ERR_PROTOCOL, "KV block %d is not full: %d of %d positions written", blocks[i],
                         s->filled[blocks[i]], PS_KV_BLOCK);
    kv_hdr h;
    if (st || (st = stage_hdr(s, id, n, &h, err, errlen))) return st;
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ps_errf(err, errlen, PS_ERR_ARG, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* a prompt's keys: the owner's alone */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f && fd >= 0) close(fd);
    if (!f) return ps_errf(err, errlen, PS_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    XXH3_state_t *xh = XXH3_createState();
    bool ok = xh && XXH3_64bits_reset(xh) == XXH_OK && put(f, xh, &h, sizeof h) &&
              put(f, xh, tokens, (size_t)n * PS_KV_BLOCK * sizeof *tokens);
    size_t floats = ps_ctx_kv_block_floats(s->ctx);
    float *k = ps_malloc(2 * floats * sizeof *k), *v = k ? k + floats : NULL;
    ok = ok && k;
    for (int i = 0; ok && i < n; i++)
        for (int li = 0; ok && li < s->m->layer_end - s->m->layer_begin; li++)
            ok = !ps_ctx_kv_read(s->ctx, li, blocks[i], k, v) && put(f, xh, k, floats * sizeof *k) &&
                 put(f, xh, v, floats * sizeof *v);
    free(k);
    uint64_t sum = ok ? XXH3_64bits_digest(xh) : 0;
    ok = ok && fwrite(&sum, 8, 1, f) == 1 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    XXH3_freeState(xh);
    if (!ok || rename(tmp, path)) {
        st = ps_errf(err, errlen, PS_ERR_IO, "cannot write %s: %s", path, strerror(errno ? errno : EIO));
        unlink(tmp);
    }
    return st;
}

/* Reads n bytes of f into p, adding them to the running hash. */
static bool get(FILE *f, XXH3_state_t *h, void *p, size_t n) {
    if (fread(p, 1, n, f) != n) return false;
    XXH3_64bits_update(h, p, n);
    return true;
}

/* Compares a file's header with what this stage would write; the message names both sides. */
static ps_status same_maker(const kv_hdr *got, const kv_hdr *want, const char *path, char *err, size_t errlen) {
    if (memcmp(got->magic, KV_MAGIC, 8) || got->block != PS_KV_BLOCK)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "%s is not a pipeshard prefix file", path);
    if (memcmp(got->model_fp, want->model_fp, 32) || memcmp(got->shard_fp, want->shard_fp, 32) ||
        got->layer_begin != want->layer_begin || got->layer_end != want->layer_end ||
        got->n_head_kv != want->n_head_kv || got->head_dim != want->head_dim)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "%s holds layers %d..%d of model %.32s (shard %.32s); this stage runs layers %d..%d of model "
                       "%.32s (shard %.32s)",
                       path, got->layer_begin, got->layer_end, got->model_fp, got->shard_fp[0] ? got->shard_fp : "-",
                       want->layer_begin, want->layer_end, want->model_fp, want->shard_fp[0] ? want->shard_fp : "-");
    if (got->act != want->act)
        return ps_errf(err, errlen, PS_ERR_ARG, "%s was computed with %s activations, this session uses %s", path,
                       ps_act_name((ps_act)got->act), ps_act_name((ps_act)want->act));
    if (got->id != want->id || got->n_blocks != want->n_blocks)
        return ps_errf(err, errlen, PS_ERR_ARG, "%s holds prefix %016llx of %u blocks, not %016llx of %u", path,
                       (unsigned long long)got->id, got->n_blocks, (unsigned long long)want->id, want->n_blocks);
    return PS_OK;
}

ps_status ps_stage_kv_load(ps_stage *s, const char *path, uint64_t id, const int32_t *blocks, int n,
                           const int32_t *tokens, char *err, size_t errlen) {
    kv_hdr want, got;
    ps_status st = check_blocks(s, blocks, n, err, errlen);
    if (st || (st = stage_hdr(s, id, n, &want, err, errlen))) return st;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ps_errf(err, errlen, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "cannot read %s: %s", path,
                       strerror(errno));
    size_t floats = ps_ctx_kv_block_floats(s->ctx), n_tok = (size_t)n * PS_KV_BLOCK;
    int layers = s->m->layer_end - s->m->layer_begin;
    int32_t *file_tok = ps_malloc(n_tok * sizeof *file_tok);
    /* all of it, checked first (+ 1: stage 0 may hold no layer) */
    float *buf = ps_malloc((2 * floats * (size_t)layers * (size_t)n + 1) * sizeof *buf);
    XXH3_state_t *xh = XXH3_createState();
    if (!file_tok || !buf || !xh || XXH3_64bits_reset(xh) != XXH_OK) {
        st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for %s", path);
        goto out;
    }
    uint64_t sum;
    if (!get(f, xh, &got, sizeof got)) {
        st = ps_errf(err, errlen, PS_ERR_FORMAT, "%s is not a pipeshard prefix file (too short)", path);
        goto out;
    }
    if ((st = same_maker(&got, &want, path, err, errlen))) goto out;
    if (!get(f, xh, file_tok, n_tok * sizeof *file_tok) || !get(f, xh, buf, 2 * floats * layers * (size_t)n * 4) ||
        fread(&sum, 8, 1, f) != 1 || fgetc(f) != EOF || sum != XXH3_64bits_digest(xh)) {
        st = ps_errf(err, errlen, PS_ERR_FORMAT, "%s is damaged (its size or checksum is wrong)", path);
        goto out;
    }
    if (memcmp(file_tok, tokens, n_tok * sizeof *tokens)) {
        st = ps_errf(err, errlen, PS_ERR_ARG, "%s holds the keys of other tokens than the prefix asked for", path);
        goto out;
    }
    const float *p = buf;
    for (int i = 0; i < n; i++) {
        for (int li = 0; li < layers; li++, p += 2 * floats)
            if ((st = ps_ctx_kv_write(s->ctx, li, blocks[i], p, p + floats))) {
                st = ps_errf(err, errlen, st, "cannot restore the KV cache from %s: %s", path, ps_strerror(st));
                goto out;
            }
        s->filled[blocks[i]] = PS_KV_BLOCK;
        if (s->tok) memcpy(s->tok + (size_t)blocks[i] * PS_KV_BLOCK, tokens + (size_t)i * PS_KV_BLOCK, PS_KV_BLOCK * 4);
    }
out:
    XXH3_freeState(xh);
    free(file_tok), free(buf);
    fclose(f);
    return st;
}
