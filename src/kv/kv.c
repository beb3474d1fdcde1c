/* kv.c - the book of KV blocks: a free list, reference counts, and the prefix cache (a hash
 * table of published blocks, chained per bucket, and an LRU list of those no sequence uses). */
#include "kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NONE      (-1)
#define ROOT_HASH 0x9e3779b97f4a7c15ull /* the parent hash of a sequence's first block */

typedef struct {
    int32_t ref;                /* sequences using the block */
    bool hashed;                /* hash and parent are set (the block was full when published) */
    bool published;             /* in the hash table */
    uint64_t hash;              /* of (parent's hash, the block's tokens) */
    int32_t parent;             /* the published block before it in its prefix (NONE for the first) */
    int32_t canon;              /* hashed: itself when published, else its published twin */
    int32_t hnext;              /* next in its hash bucket */
    int32_t lru_prev, lru_next; /* in the LRU list (published, ref 0), oldest first */
    int32_t next_free;
} blk;

struct ps_kv {
    int n;
    bool prefix;
    blk *b;          /* (n) */
    int32_t *tok;    /* (n, PS_KV_BLOCK) the tokens of hashed blocks */
    int32_t *bucket; /* (n_buckets) first block of each hash bucket */
    uint32_t mask;   /* n_buckets - 1 */
    int32_t free_head;
    int n_free;
    int32_t lru_head, lru_tail;
    int n_cached;
    uint64_t hits, hit_blocks, evictions;
};

ps_status ps_kv_create(int n_blocks, bool prefix_cache, ps_kv **out, char *err, size_t errlen) {
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (1 << 24))
        return ps_errf(err, errlen, PS_ERR_ARG, "%d KV blocks: must be within 1..%d", n_blocks, 1 << 24);
    ps_kv *kv = ps_calloc(1, sizeof *kv);
    uint32_t nb = 1;
    while (nb < (uint32_t)n_blocks) nb <<= 1;
    if (kv) {
        kv->n = n_blocks, kv->prefix = prefix_cache, kv->mask = nb - 1;
        kv->b = ps_malloc((size_t)n_blocks * sizeof *kv->b);
        kv->tok = ps_malloc((size_t)n_blocks * PS_KV_BLOCK * sizeof *kv->tok);
        kv->bucket = ps_malloc((size_t)nb * sizeof *kv->bucket);
    }
    if (!kv || !kv->b || !kv->tok || !kv->bucket) {
        ps_kv_free(kv);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for the book of %d KV blocks", n_blocks);
    }
    ps_kv_reset(kv);
    *out = kv;
    return PS_OK;
}

void ps_kv_free(ps_kv *kv) {
    if (!kv) return;
    free(kv->b), free(kv->tok), free(kv->bucket);
    free(kv);
}

void ps_kv_reset(ps_kv *kv) {
    for (int i = 0; i < kv->n; i++)
        kv->b[i] = (blk){.parent = NONE, .hnext = NONE, .lru_prev = NONE, .lru_next = NONE, .next_free = i + 1};
    kv->b[kv->n - 1].next_free = NONE;
    kv->free_head = 0, kv->n_free = kv->n;
    for (uint32_t i = 0; i <= kv->mask; i++) kv->bucket[i] = NONE;
    kv->lru_head = kv->lru_tail = NONE, kv->n_cached = 0;
}

// ---------------------------------------------------------------------------------------
// Lists

static void lru_unlink(ps_kv *kv, int32_t i) {
    blk *b = &kv->b[i];
    if (b->lru_prev != NONE)
        kv->b[b->lru_prev].lru_next = b->lru_next;
    else
        kv->lru_head = b->lru_next;
    if (b->lru_next != NONE)
        kv->b[b->lru_next].lru_prev = b->lru_prev;
    else
        kv->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = NONE;
    kv->n_cached--;
}

static void lru_push(ps_kv *kv, int32_t i) {
    blk *b = &kv->b[i];
    b->lru_prev = kv->lru_tail, b->lru_next = NONE;
    if (kv->lru_tail != NONE)
        kv->b[kv->lru_tail].lru_next = i;
    else
        kv->lru_head = i;
    kv->lru_tail = i;
    kv->n_cached++;
}

static void unpublish(ps_kv *kv, int32_t i) {
    int32_t *p = &kv->bucket[kv->b[i].hash & kv->mask];
    while (*p != i) p = &kv->b[*p].hnext;
    *p = kv->b[i].hnext;
    kv->b[i].hnext = NONE, kv->b[i].published = false;
}

static void free_push(ps_kv *kv, int32_t i) {
    kv->b[i].hashed = false, kv->b[i].parent = NONE;
    kv->b[i].next_free = kv->free_head;
    kv->free_head = i, kv->n_free++;
}

/* A block for a new use: a free one, else the least recently used cached one. */
static int32_t take_block(ps_kv *kv) {
    int32_t i = kv->free_head;
    if (i != NONE) {
        kv->free_head = kv->b[i].next_free, kv->n_free--;
    } else {
        i = kv->lru_head;
        lru_unlink(kv, i);
        unpublish(kv, i);
        kv->evictions++;
    }
    kv->b[i].hashed = false, kv->b[i].parent = NONE, kv->b[i].ref = 1;
    return i;
}

// ---------------------------------------------------------------------------------------
// Sequences

static uint64_t block_hash(const int32_t *tokens, uint64_t parent_hash) {
    return XXH3_64bits_withSeed(tokens, PS_KV_BLOCK * sizeof *tokens, parent_hash);
}

/* The published block holding tokens after parent (whose hash is parent_hash), or NONE. */
static int32_t lookup(const ps_kv *kv, const int32_t *tokens, int32_t parent, uint64_t parent_hash, uint64_t *hash) {
    *hash = block_hash(tokens, parent_hash);
    for (int32_t i = kv->bucket[*hash & kv->mask]; i != NONE; i = kv->b[i].hnext)
        if (kv->b[i].hash == *hash && kv->b[i].parent == parent &&
            !memcmp(kv->tok + (size_t)i * PS_KV_BLOCK, tokens, PS_KV_BLOCK * sizeof *tokens))
            return i;
    return NONE;
}

bool ps_kv_fits(const ps_kv *kv, int n_max) { return n_max >= 1 && ps_kv_blocks_for(n_max) <= kv->n; }

ps_status ps_kv_seq_alloc(ps_kv *kv, const int32_t *prompt, int n_prompt, int n_max, int32_t *table, int *n_cached) {
    *n_cached = 0;
    int need = ps_kv_blocks_for(n_max), k = 0, idle = 0;
    if (n_max < 1 || need > kv->n) return PS_ERR_BUSY;
    /* the cached prefix: whole blocks, leaving at least the prompt's last position to compute */
    uint64_t h = ROOT_HASH;
    int32_t parent = NONE;
    for (int most = kv->prefix ? (n_prompt - 1) / PS_KV_BLOCK : 0; k < most && k < need; k++) {
        int32_t i = lookup(kv, prompt + (size_t)k * PS_KV_BLOCK, parent, h, &h);
        if (i == NONE) break;
        table[k] = parent = i;
        idle += kv->b[i].ref == 0;
    }
    if (need - k > kv->n_free + kv->n_cached - idle) return PS_ERR_BUSY;
    for (int j = 0; j < k; j++) {
        blk *b = &kv->b[table[j]];
        if (b->ref++ == 0) lru_unlink(kv, table[j]);
    }
    for (int j = k; j < need; j++) table[j] = take_block(kv);
    if (k) kv->hits++, kv->hit_blocks += (uint64_t)k;
    *n_cached = k * PS_KV_BLOCK;
    return PS_OK;
}

void ps_kv_seq_publish(ps_kv *kv, const int32_t *table, const int32_t *tokens, int n) {
    if (!kv->prefix) return;
    uint64_t h = ROOT_HASH;
    int32_t parent = NONE;
    for (int j = 0; j < n / PS_KV_BLOCK; parent = kv->b[table[j]].canon, j++) {
        blk *b = &kv->b[table[j]];
        if (b->hashed) {
            h = b->hash;
            continue;
        }
        const int32_t *t = tokens + (size_t)j * PS_KV_BLOCK;
        uint64_t hj;
        int32_t twin = lookup(kv, t, parent, h, &hj);
        b->hashed = true, b->hash = hj, b->parent = parent, b->canon = twin == NONE ? table[j] : twin;
        memcpy(kv->tok + (size_t)table[j] * PS_KV_BLOCK, t, PS_KV_BLOCK * sizeof *t);
        if (twin == NONE) { /* else another sequence published the same block first: this one stays private */
            uint32_t bk = (uint32_t)(hj & kv->mask);
            b->hnext = kv->bucket[bk], kv->bucket[bk] = table[j], b->published = true;
        }
        h = hj;
    }
}

void ps_kv_seq_release(ps_kv *kv, const int32_t *table, int n_blocks) {
    for (int j = n_blocks - 1; j >= 0; j--) { /* last first: a prefix's tail is evicted before its head */
        blk *b = &kv->b[table[j]];
        if (--b->ref > 0) continue;
        if (b->published)
            lru_push(kv, table[j]);
        else
            free_push(kv, table[j]);
    }
}

void ps_kv_get_stats(const ps_kv *kv, ps_kv_stats *out) {
    *out = (ps_kv_stats){.n_blocks = kv->n,
                         .cached = kv->n_cached,
                         .free = kv->n_free,
                         .used = kv->n - kv->n_cached - kv->n_free,
                         .hits = kv->hits,
                         .hit_blocks = kv->hit_blocks,
                         .evictions = kv->evictions};
}
