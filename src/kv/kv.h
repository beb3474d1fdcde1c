/* kv.h - the coordinator's book of KV blocks (DESIGN.md, "KV cache"): which block of every
 * stage's pool each sequence uses, and the prefix cache.
 *
 * Every stage holds a pool of n_blocks blocks of PS_KV_BLOCK positions; the coordinator is
 * the only authority on who uses which, and sends each sequence's block table with its
 * micro-batches. A block is free, owned by sequences (a reference count), or cached: full,
 * identified by a hash of (its parent block's hash, its PS_KV_BLOCK token ids), kept after
 * its sequences end and found again by a later prompt with the same prefix (its prefill is
 * then skipped), until it is evicted, least recently used first, when blocks run out.
 *
 * Shared blocks are never written: a sequence writes only the blocks it allocated afresh
 * (ps_kv_seq_alloc recomputes at least the prompt's last position in a fresh block). A block
 * is published (ps_kv_seq_publish) as soon as the micro-batch that fills it is sent: every
 * micro-batch travels the ring in order, so a later one that reads the block finds it
 * written on every stage. Lookups compare token ids and parents, not only hashes: a hit is
 * exact. */
#ifndef PS_KV_H
#define PS_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "../model/model.h"
#include "../ps.h"

typedef struct ps_kv ps_kv;

/* A book of n_blocks blocks (all free); prefix_cache false: blocks are never shared or kept.
 * *out owned by the caller (ps_kv_free). */
ps_status ps_kv_create(int n_blocks, bool prefix_cache, ps_kv **out, char *err, size_t errlen);
void ps_kv_free(ps_kv *kv); /* NULL is a no-op */

/* Blocks for n positions. */
static inline int ps_kv_blocks_for(int n) { return (n + PS_KV_BLOCK - 1) / PS_KV_BLOCK; }

/* Gives a sequence the blocks for n_max positions (its prompt and what it may generate)
 * into table[0..ps_kv_blocks_for(n_max)): first the cached blocks that hold a prefix of
 * prompt (shared, when the prefix cache is on), then fresh ones. *n_cached: the prompt
 * positions whose keys and values the shared blocks hold (a multiple of PS_KV_BLOCK, less
 * than n_prompt). PS_ERR_BUSY when the free and evictable blocks do not suffice (nothing is
 * taken then: the caller waits for sequences to end). */
ps_status ps_kv_seq_alloc(ps_kv *kv, const int32_t *prompt, int n_prompt, int n_max, int32_t *table, int *n_cached);
/* Whether a sequence of n_max positions could ever be given blocks (the pool is that large). */
bool ps_kv_fits(const ps_kv *kv, int n_max);
/* Publishes the full blocks among the first n positions of a sequence (tokens[0..n)) in the
 * prefix cache; call when the micro-batch that writes them has been sent. Blocks published
 * already are skipped. No-op without the prefix cache. */
void ps_kv_seq_publish(ps_kv *kv, const int32_t *table, const int32_t *tokens, int n);
/* Returns a sequence's n_blocks blocks: shared and published ones stay cached (reference
 * count 0: evictable), the others are free again. */
void ps_kv_seq_release(ps_kv *kv, const int32_t *table, int n_blocks);
/* Forgets everything (the stages' pools were lost: a reconnected fleet): every block free,
 * the prefix cache empty. Sequences holding tables must allocate again. */
void ps_kv_reset(ps_kv *kv);

typedef struct {
    int n_blocks;        /* in the pool */
    int used;            /* referenced by a sequence */
    int cached;          /* kept for the prefix cache, referenced by none (evictable) */
    int free;            /* neither */
    uint64_t hits;       /* prompts that found a cached prefix */
    uint64_t hit_blocks; /* blocks found */
    uint64_t evictions;  /* cached blocks given to another use */
} ps_kv_stats;
void ps_kv_get_stats(const ps_kv *kv, ps_kv_stats *out);

#endif
