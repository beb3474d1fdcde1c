/* test_kv.c - the book of KV blocks (src/kv/kv.h): allocation and release, admission when
 * blocks run out, the prefix cache (exact hits only, whole blocks, never the prompt's last
 * position, least recently used evicted first, a twin published once) and reset. */
#include <string.h>

#include "kv/kv.h"
#include "ps_test.h"

#define B PS_KV_BLOCK

static int32_t prompt_a[4 * B], prompt_b[4 * B];

/* Blocks of a table that are distinct and in 0..n-1. */
static int distinct(const int32_t *t, int n, int pool) {
    for (int i = 0; i < n; i++) {
        if (t[i] < 0 || t[i] >= pool) return 0;
        for (int j = 0; j < i; j++)
            if (t[i] == t[j]) return 0;
    }
    return 1;
}

static void test_alloc_release(void) {
    ps_kv *kv;
    char err[128];
    PS_CHECK_EQ_INT(ps_kv_create(0, true, &kv, err, sizeof err), PS_ERR_ARG);
    PS_CHECK_OK(ps_kv_create(8, false, &kv, err, sizeof err));
    int32_t t1[8], t2[8], t3[8];
    int cached;
    PS_CHECK(ps_kv_fits(kv, 8 * B) && !ps_kv_fits(kv, 8 * B + 1) && !ps_kv_fits(kv, 0));
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 2 * B, 3 * B, t1, &cached)); /* 3 blocks */
    PS_CHECK_EQ_INT(cached, 0);
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 10, 4 * B + 1, t2, &cached)); /* 5 blocks */
    PS_CHECK(distinct(t1, 3, 8) && distinct(t2, 5, 8));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) PS_CHECK(t1[i] != t2[j]);
    ps_kv_stats st;
    ps_kv_get_stats(kv, &st);
    PS_CHECK(st.used == 8 && st.free == 0 && st.cached == 0);
    /* full: the next waits, and takes nothing */
    PS_CHECK_EQ_INT(ps_kv_seq_alloc(kv, prompt_a, 1, 1, t3, &cached), PS_ERR_BUSY);
    ps_kv_seq_release(kv, t1, 3);
    ps_kv_get_stats(kv, &st);
    PS_CHECK(st.used == 5 && st.free == 3 && st.cached == 0); /* no prefix cache: nothing kept */
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 2 * B, 3 * B, t3, &cached));
    PS_CHECK_EQ_INT(cached, 0); /* the same prompt: no sharing without the prefix cache */
    ps_kv_free(kv);
}

static void test_prefix(void) {
    ps_kv *kv;
    char err[128];
    PS_CHECK_OK(ps_kv_create(10, true, &kv, err, sizeof err));
    int32_t t1[10], t2[10], t3[10], t4[10];
    int cached;
    /* sequence 1: 3 blocks' prompt and 1 more block; nothing published yet: no hit */
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 3 * B, 4 * B, t1, &cached));
    PS_CHECK_EQ_INT(cached, 0);
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 3 * B, 4 * B, t2, &cached));
    PS_CHECK_EQ_INT(cached, 0);
    /* sequence 1 publishes its prompt's blocks (and a partial block is not published) */
    ps_kv_seq_publish(kv, t1, prompt_a, 3 * B - 5);
    /* sequence 2 computed the same prompt: its twins stay private */
    ps_kv_seq_publish(kv, t2, prompt_a, 3 * B);
    /* a prompt of 3 whole blocks shares 2 (its last position is computed afresh) */
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 3 * B, 3 * B + 1, t3, &cached));
    PS_CHECK_EQ_INT(cached, 2 * B);
    PS_CHECK(t3[0] == t1[0] && t3[1] == t1[1] && t3[2] != t1[2] && t3[2] != t2[2]);
    ps_kv_stats st;
    ps_kv_get_stats(kv, &st);
    PS_CHECK(st.hits == 1 && st.hit_blocks == 2 && st.used == 10 && st.free == 0);
    /* a prompt that differs in block 1 shares block 0 only */
    memcpy(prompt_b, prompt_a, sizeof prompt_b);
    prompt_b[B + 3] ^= 1;
    ps_kv_seq_release(kv, t2, 4);
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_b, 4 * B, 4 * B, t4, &cached));
    PS_CHECK_EQ_INT(cached, B);
    PS_CHECK(t4[0] == t1[0] && t4[1] != t1[1]);
    ps_kv_seq_release(kv, t4, 4);
    /* sequences end: published blocks stay cached, the rest is free */
    ps_kv_seq_release(kv, t1, 4);
    ps_kv_seq_release(kv, t3, 4);
    ps_kv_get_stats(kv, &st);
    PS_CHECK_EQ_INT(st.used, 0);
    PS_CHECK_EQ_INT(st.cached, 3); /* sequence 1's blocks 0, 1 and sequence 2's block 2 */
    PS_CHECK_EQ_INT(st.free, 7);
    /* a hit on cached blocks nobody holds: they are taken out of the LRU list */
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 3 * B, 3 * B, t2, &cached));
    PS_CHECK_EQ_INT(cached, 2 * B);
    ps_kv_get_stats(kv, &st);
    PS_CHECK(st.used == 3 && st.cached == 1 && st.free == 6);
    /* the whole pool but the shared blocks: the free ones, then the cached one is evicted */
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_b + 1, 10, 7 * B, t4, &cached));
    ps_kv_get_stats(kv, &st);
    PS_CHECK(st.used == 10 && st.evictions == 1 && st.cached == 0);
    PS_CHECK_EQ_INT(ps_kv_seq_alloc(kv, prompt_b, 1, 1, t3, &cached), PS_ERR_BUSY);
    ps_kv_seq_release(kv, t4, 7);
    ps_kv_seq_release(kv, t2, 3);
    /* reset: nothing cached any more */
    ps_kv_reset(kv);
    PS_CHECK_OK(ps_kv_seq_alloc(kv, prompt_a, 3 * B, 3 * B, t1, &cached));
    PS_CHECK_EQ_INT(cached, 0);
    ps_kv_free(kv);
}

int main(void) {
    ps_test_rng_seed(11);
    for (int i = 0; i < 4 * B; i++) prompt_a[i] = (int32_t)(ps_test_rng_u32() % 50000);
    test_alloc_release();
    test_prefix();
    return ps_test_done();
}
