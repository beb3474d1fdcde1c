/* tok_map.c - the tokenizer's hash tables (open addressing, linear probing).
 *
 * Both tables are built once when the tokenizer is created and only read afterwards, so
 * lookups need no locking. Capacities are powers of two at least twice the key count. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tok_internal.h"

// ---- helpers

uint64_t ps_tok_hash_bytes(const char *s, size_t len) { return XXH3_64bits(s, len); }

/* A 64-bit mixer (splitmix64 finaliser) for merge keys. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Smallest power of two >= 2 * n (at least 16); 0 when that does not fit in 32 bits. */
static uint64_t table_cap(uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return cap > (1ULL << 31) ? 0 : cap;
}

// ---- text -> id

ps_status ps_tok_strmap_init(tok_strmap *m, uint32_t n_keys) {
    uint64_t cap = table_cap(n_keys);
    m->slots = cap ? ps_malloc(cap * sizeof *m->slots) : NULL;
    if (!m->slots) return PS_ERR_NOMEM;
    memset(m->slots, 0xff, cap * sizeof *m->slots); /* all -1 */
    m->mask = (uint32_t)(cap - 1);
    return PS_OK;
}

void ps_tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

int32_t ps_tok_strmap_put(tok_strmap *m, const ps_tok *t, int32_t id) {
    size_t len;
    const char *s = tok_text(t, id, &len);
    uint32_t i = (uint32_t)ps_tok_hash_bytes(s, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) {
            m->slots[i] = id;
            return -1;
        }
        size_t clen;
        const char *cs = tok_text(t, cur, &clen);
        if (clen == len && memcmp(cs, s, len) == 0) return cur;
    }
}

int32_t ps_tok_strmap_get(const tok_strmap *m, const ps_tok *t, const char *s, size_t len) {
    uint32_t i = (uint32_t)ps_tok_hash_bytes(s, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) return -1;
        size_t clen;
        const char *cs = tok_text(t, cur, &clen);
        if (clen == len && memcmp(cs, s, len) == 0) return cur;
    }
}

// ---- (left, right) -> merge

ps_status ps_tok_mergemap_init(tok_mergemap *m, uint64_t n_keys) {
    uint64_t cap = table_cap(n_keys);
    m->slots = cap ? ps_malloc(cap * sizeof *m->slots) : NULL;
    if (!m->slots) return PS_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = (uint32_t)(cap - 1);
    return PS_OK;
}

void ps_tok_mergemap_free(tok_mergemap *m) {
    free(m->slots);
    m->slots = NULL;
}

void ps_tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return;
        if (m->slots[i].key == UINT64_MAX) {
            m->slots[i] = (tok_merge){key, rank, merged};
            return;
        }
    }
}

const tok_merge *ps_tok_mergemap_get(const tok_mergemap *m, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == UINT64_MAX) return NULL;
    }
}
