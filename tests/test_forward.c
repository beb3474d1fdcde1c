/* test_forward.c - the forward pass over several sequences at once (ps_forward_segs): rows of
 * three sequences whose keys and values live in scattered blocks of one pool, run together
 * in mixed segments and chunks, give bit for bit the logits each sequence gives alone
 * (DESIGN.md invariant 1), with attention in 8-lane vectors (AVX2) and in 16-lane ones
 * alike, the longest sequence's attention crossing a chunk of its sums (PS_ATT_CHUNK) in
 * the middle of a segment; and the checks of segments and block tables. On stories260K
 * (head width 8) and SmolLM2-135M (head width 64), each skipped when absent. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "ps_test.h"
#include "tensor/pool.h"

enum { N_CTX = 224, MAX_BATCH = 128, N_SEQ = 3, POOL = 16 };

/* The three sequences: lengths, and their blocks in the shared pool (scattered, not in order). */
static const int LEN[N_SEQ] = {40, 7, 200};
static const int32_t TAB[N_SEQ][7] = {{5, 2, 9}, {0, -1, -1}, {11, 3, 7, 14, 1, 12, 8}};
static const int NB[N_SEQ] = {3, 3, 7};

/* Logits of every row of each sequence run alone (ps_forward: blocks 0, 1, 2, ...). */
static float *reference(const ps_model *m, ps_pool *pool, int32_t *const *toks) {
    int vocab = m->hp.vocab, total = 0;
    for (int s = 0; s < N_SEQ; s++) total += LEN[s];
    float *ref = malloc((size_t)total * vocab * sizeof(float));
    ps_ctx_params cp = {.n_ctx = N_CTX, .max_batch = MAX_BATCH};
    char err[256];
    for (int s = 0, row = 0; s < N_SEQ; row += LEN[s], s++) {
        ps_ctx *c = NULL;
        PS_CHECK_OK(ps_ctx_create(m, &cp, pool, &c, err, sizeof err));
        if (c) PS_CHECK_OK(ps_forward(c, toks[s], LEN[s], 0, ref + (size_t)row * vocab, LEN[s], err, sizeof err));
        ps_ctx_free(c);
    }
    return ref;
}

/* Runs the sequences together in steps: each step takes the next `take[step][s]` rows of
 * sequence s (0: none this step), and compares every row's logits with ref. */
static void run_mixed(const ps_model *m, ps_pool *pool, int32_t *const *toks, const float *ref) {
    static const int take[][N_SEQ] = {{20, 7, 30}, {19, 0, 99}, {1, 0, 71}}; /* rows 30..128: over the chunk edge */
    int vocab = m->hp.vocab, done[N_SEQ] = {0}, base[N_SEQ] = {0, LEN[0], LEN[0] + LEN[1]};
    ps_ctx_params cp = {.n_ctx = N_CTX, .n_blocks = POOL, .max_batch = MAX_BATCH};
    char err[256];
    ps_ctx *c = NULL;
    PS_CHECK_OK(ps_ctx_create(m, &cp, pool, &c, err, sizeof err));
    if (!c) return;
    PS_CHECK_EQ_INT(ps_ctx_n_blocks(c), POOL);
    float *out = malloc((size_t)N_CTX * N_SEQ * vocab * sizeof(float));
    int32_t tokens[N_CTX * N_SEQ];
    for (size_t step = 0; step < PS_ARRAY_LEN(take); step++) {
        ps_seg segs[N_SEQ];
        int n_segs = 0, rows = 0;
        for (int s = N_SEQ - 1; s >= 0; s--) { /* segment order differs from sequence order */
            int n = take[step][s];
            if (!n) continue;
            segs[n_segs++] = (ps_seg){.pos = done[s], .n = n, .blocks = TAB[s], .n_blocks = NB[s], .n_logits = n};
            memcpy(tokens + rows, toks[s] + done[s], (size_t)n * sizeof(int32_t));
            rows += n;
        }
        PS_CHECK_OK(ps_forward_segs(c, segs, n_segs, tokens, NULL, out, err, sizeof err));
        for (int g = 0, row = 0; g < n_segs; row += segs[g].n, g++) {
            int s = segs[g].blocks == TAB[0] ? 0 : segs[g].blocks == TAB[1] ? 1 : 2;
            const float *want = ref + (size_t)(base[s] + done[s]) * vocab;
            int same = !memcmp(out + (size_t)row * vocab, want, (size_t)segs[g].n * vocab * sizeof(float));
            if (!same)
                fprintf(stderr, "step %zu: sequence %d rows %d..%d differ from alone\n", step, s, done[s],
                        done[s] + segs[g].n);
            PS_CHECK(same);
        }
        for (int s = 0; s < N_SEQ; s++) done[s] += take[step][s];
    }
    for (int s = 0; s < N_SEQ; s++) PS_CHECK_EQ_INT(done[s], LEN[s]);

    /* only the last row's logits: the same bits as the last row of the full run */
    ps_seg last = {.pos = LEN[2] - 1, .n = 1, .blocks = TAB[2], .n_blocks = NB[2], .n_logits = 1};
    PS_CHECK_OK(ps_forward_segs(c, &last, 1, toks[2] + LEN[2] - 1, NULL, out, err, sizeof err));
    PS_CHECK(!memcmp(out, ref + (size_t)(base[2] + LEN[2] - 1) * vocab, (size_t)vocab * sizeof(float)));

    /* what the segments are checked for */
    int32_t bad_tab[3] = {1, POOL, 2};
    ps_seg bad = {.pos = 0, .n = 40, .blocks = bad_tab, .n_blocks = 3};
    PS_CHECK_EQ_INT(ps_forward_segs(c, &bad, 1, tokens, NULL, out, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "KV block 16 is outside the pool (0..15)") != NULL);
    bad = (ps_seg){.pos = 30, .n = 40, .blocks = TAB[0], .n_blocks = 2};
    PS_CHECK_EQ_INT(ps_forward_segs(c, &bad, 1, tokens, NULL, out, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "70 positions need 3 KV blocks, the table has 2") != NULL);
    bad = (ps_seg){.pos = N_CTX - 6, .n = 7, .blocks = TAB[0], .n_blocks = 3};
    PS_CHECK_EQ_INT(ps_forward_segs(c, &bad, 1, tokens, NULL, out, err, sizeof err), PS_ERR_RANGE);
    bad = (ps_seg){.pos = 0, .n = 2, .blocks = TAB[0], .n_blocks = 3, .n_logits = 3};
    PS_CHECK_EQ_INT(ps_forward_segs(c, &bad, 1, tokens, NULL, out, err, sizeof err), PS_ERR_ARG);
    int32_t oov = m->hp.vocab;
    bad = (ps_seg){.pos = 0, .n = 1, .blocks = TAB[0], .n_blocks = 3};
    PS_CHECK_EQ_INT(ps_forward_segs(c, &bad, 1, &oov, NULL, out, err, sizeof err), PS_ERR_ARG);
    free(out);
    ps_ctx_free(c);
}

static void test_model(const char *path) {
    ps_model *m = NULL;
    char err[512];
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    ps_pool *pool = NULL;
    PS_CHECK_OK(ps_pool_create(2, &pool));
    if (!m || !pool) return;
    int32_t *toks[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        toks[s] = malloc((size_t)LEN[s] * sizeof(int32_t));
        for (int i = 0; i < LEN[s]; i++) toks[s][i] = (int32_t)(ps_test_rng_u32() % (uint32_t)m->hp.vocab);
    }
    /* attention in 16-lane vectors alone, then mixed in 8- and 16-lane vectors: the same bits */
    ps_forward_set_attn_lanes(16);
    float *ref = reference(m, pool, toks);
    for (int lanes = 8; lanes <= 16; lanes += 8) {
        ps_forward_set_attn_lanes(lanes);
        run_mixed(m, pool, toks, ref);
    }
    ps_forward_set_attn_lanes(0);
    free(ref);
    for (int s = 0; s < N_SEQ; s++) free(toks[s]);
    ps_pool_free(pool);
    ps_model_free(m);
}

int main(void) {
    ps_test_rng_seed(7);
    const char *stories = ps_test_shared_model("stories260K.gguf");
    if (stories)
        test_model(stories);
    else
        ps_test_skip_part("stories260K.gguf is absent (../shared/models)");
    const char *smol = ps_test_cached_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    if (smol) {
        test_model(smol);
    } else {
        ps_test_skip_part("SmolLM2-135M-Instruct.Q4_1.gguf is absent (scripts/fetch_models.sh fetches it)");
    }
    return ps_test_done();
}
