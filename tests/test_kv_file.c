/* test_kv_file.c - a stage's prefix saved to a file and restored (stage/kv_file.c): restored in a
 * new session, into other blocks, the rest of the prompt gives the logits and the token it gives
 * computed whole, bit for bit; and every refusal: another id, other tokens, a damaged or cut
 * file, a missing one, other activations, another model, a block not full. On stories260K (and
 * SmolLM2-135M for "another model"), each skipped when absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "stage/stage.h"

enum { N_PROMPT = 70 };

static int32_t prompt[N_PROMPT];

/* Runs one segment of prompt[pos..pos+n) on table through s; the token it samples (or -1 on error). */
static ps_status run(ps_stage *s, int pos, int n, const int32_t *table, int n_table, int32_t *tok, char *err,
                     size_t errlen) {
    ps_mb_seg g = {.seq = 1,
                   .pos = pos,
                   .n = n,
                   .flags = PS_MB_SAMPLE,
                   .sp = ps_sample_params_default(),
                   .n_blocks = n_table,
                   .blocks = table};
    g.sp.temperature = 0;
    ps_mb mb = {.n_segs = 1, .segs = &g, .n = n, .tokens = prompt + pos};
    ps_result res;
    int n_res = 0;
    const float *x;
    *tok = -1;
    ps_status st = ps_stage_run(s, &mb, &x, &res, &n_res, err, errlen);
    if (!st && n_res == 1) *tok = res.token;
    return st;
}

/* Writes a copy of src with the byte at off changed (or cut to off bytes when cut). */
static void bent_copy(const char *src, const char *dst, long off, bool cut) {
    size_t n = 0;
    uint8_t *b = ps_test_read_file(src, &n);
    FILE *f = b && (size_t)off < n ? fopen(dst, "wb") : NULL;
    PS_CHECK(f != NULL); /* the file written just before, longer than off */
    if (!f) {
        free(b);
        return;
    }
    if (!cut) b[off] ^= 0x40;
    size_t len = cut ? (size_t)off : n;
    PS_CHECK_EQ_INT((long)fwrite(b, 1, len, f), (long)len);
    fclose(f);
    free(b);
}

int main(void) {
    const char *stories = ps_test_shared_model("stories260K.gguf");
    if (!stories) return ps_test_skip("stories260K.gguf is absent (../shared/models)");
    ps_test_rng_seed(5);
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(1 + ps_test_rng_u32() % 500);
    char err[512], path[4096], bent[4096];
    snprintf(path, sizeof path, "%s", ps_test_tmp("prefix.kv"));
    snprintf(bent, sizeof bent, "%s", ps_test_tmp("prefix-bent.kv"));
    ps_stage_opts so = {.threads = 2, .mmap = true};
    ps_stage *s = NULL;
    PS_CHECK_OK(ps_stage_open(stories, &so, &s, err, sizeof err));
    ps_ctx_params cp = {.n_ctx = 128, .n_blocks = 8, .max_batch = 64, .act = PS_ACT_Q8};
    PS_CHECK_OK(ps_stage_begin(s, &cp, 128, 2, 0, err, sizeof err));
    if (!s) return ps_test_done();
    int vocab = ps_stage_model(s)->hp.vocab;
    float *want = malloc((size_t)vocab * sizeof *want);

    /* the whole prompt in blocks 5, 2, 6: the reference token and logits */
    const int32_t first[3] = {5, 2, 6}, second[3] = {1, 4, 7};
    int32_t want_tok, tok;
    PS_CHECK_OK(run(s, 0, N_PROMPT, first, 3, &want_tok, err, sizeof err));
    memcpy(want, ps_stage_logits(s), (size_t)vocab * sizeof *want);
    PS_CHECK_EQ_INT(ps_stage_kv_save(s, path, 42, first + 2, 1, prompt + 64, err, sizeof err), PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "KV block 6 is not full: 6 of 32 positions written") != NULL);
    PS_CHECK_OK(ps_stage_kv_save(s, path, 42, first, 2, prompt, err, sizeof err));

    /* a new session reads nothing of the old one; restored into blocks 1 and 4, the rest of the
       prompt gives the same token and logits as the whole run */
    PS_CHECK_OK(ps_stage_begin(s, &cp, 128, 2, 0, err, sizeof err));
    PS_CHECK_EQ_INT(run(s, 64, N_PROMPT - 64, second, 3, &tok, err, sizeof err), PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "never written in this session") != NULL);
    PS_CHECK_OK(ps_stage_kv_load(s, path, 42, second, 2, prompt, err, sizeof err));
    PS_CHECK_OK(run(s, 64, N_PROMPT - 64, second, 3, &tok, err, sizeof err));
    PS_CHECK_EQ_INT(tok, want_tok);
    PS_CHECK(!memcmp(ps_stage_logits(s), want, (size_t)vocab * sizeof *want));

    /* refusals, each with its message; the pool untouched */
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, path, 43, second, 2, prompt, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "holds prefix 000000000000002a of 2 blocks, not 000000000000002b of 2") != NULL);
    int32_t other[64];
    memcpy(other, prompt, sizeof other);
    other[40] ^= 1;
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, path, 42, second, 2, other, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "keys of other tokens") != NULL);
    bent_copy(path, bent, 5000, false);
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, bent, 42, second, 2, prompt, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "is damaged") != NULL);
    bent_copy(path, bent, 3000, true);
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, bent, 42, second, 2, prompt, err, sizeof err), PS_ERR_FORMAT);
    bent_copy(path, bent, 3, false);
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, bent, 42, second, 2, prompt, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "is not a pipeshard prefix file") != NULL);
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, ps_test_tmp("no-such.kv"), 42, second, 2, prompt, err, sizeof err),
                    PS_ERR_NOT_FOUND);
    const int32_t twice[2] = {1, 1}, outside[2] = {1, 8};
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, path, 42, twice, 2, prompt, err, sizeof err), PS_ERR_PROTOCOL);
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, path, 42, outside, 2, prompt, err, sizeof err), PS_ERR_PROTOCOL);
    ps_ctx_params f32 = cp;
    f32.act = PS_ACT_F32;
    PS_CHECK_OK(ps_stage_begin(s, &f32, 128, 2, 0, err, sizeof err));
    PS_CHECK_EQ_INT(ps_stage_kv_load(s, path, 42, second, 2, prompt, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "computed with q8 activations, this session uses f32") != NULL);

    /* another model's stage refuses the file, naming both */
    const char *smol = ps_test_cached_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    if (smol) {
        ps_stage *o = NULL;
        PS_CHECK_OK(ps_stage_open(smol, &so, &o, err, sizeof err));
        PS_CHECK_OK(ps_stage_begin(o, &cp, 128, 2, 0, err, sizeof err));
        PS_CHECK_EQ_INT(ps_stage_kv_load(o, path, 42, second, 2, prompt, err, sizeof err), PS_ERR_ARG);
        PS_CHECK(strstr(err, "holds layers 0..5 of model") != NULL &&
                 strstr(err, "this stage runs layers 0..30") != NULL);
        ps_stage_free(o);
    } else {
        ps_test_skip_part("SmolLM2-135M-Instruct.Q4_1.gguf is absent (scripts/fetch_models.sh fetches it)");
    }
    free(want);
    ps_stage_free(s);
    remove(path), remove(bent);
    return ps_test_done();
}
