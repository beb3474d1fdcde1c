/* test_cuda.c - GPU stages (src/cuda) give the bits of the CPU's reference kernels (the
 * "ref" family, which the NEON kernels and AVX2's row tiles reproduce too): for synthetic
 * models of every weight type (llama, qwen2 biases, qwen3 head norms, a head width that is
 * not a multiple of 16, the widest: 256) and for the real models present, every logit of a
 * chunked prompt and of greedy decode steps equals the CPU's bit for bit, whatever the
 * chunk size — but for F16 and BF16 weights, which the GPU multiplies on its tensor cores
 * in another order of f32 sums (kernels.cuh's k_mm_h): there every logit is within F16_TOL
 * (BF16_TOL) of the CPU's, the tokens are the CPU's, and the GPU's logits do not depend on
 * the chunk size; sequences run together in mixed segments on the GPU give what each gives
 * alone on the CPU; a fleet of a CPU stage and a GPU stage (either way round) gives the
 * whole model's logits. Against this CPU's fastest family (another float summation order)
 * it prints the largest logit difference, for the record (see family_gap). A 1,108-position
 * context (many more KV blocks than attention's ring holds) gives the CPU's bits too, for
 * head widths 64, 128 and 40. And the GPU's refusals (f32 activations, a device that is not
 * there, a stage too large for the device's memory). Skipped where there is no CUDA device
 * (CI): scripts/test-gpu.sh runs it on a machine with one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "ps_test.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"

/* family_gap: the GPU against this CPU's fastest family, a record, not a check. Those families sum each
 * dot product's blocks in 8 or 16 float lanes (test_matmul.c holds each matmul to 1e-5 of
 * sum |w x|), but the next matmul quantizes its input to 8 bits, and a value that moved by
 * an ulp across a rounding boundary moves its q by one step: about 1/254 of its block's
 * largest value. Over 30 layers (SmolLM2-135M) the logits then differ by 3e-3 to 9e-2 of the
 * row's largest and greedy tokens part within a few steps on some prompts, for the CPU's
 * families among themselves as for the GPU (which gives the ref family's bits: checked
 * above); stories260K's 5 layers stay near 1e-6. */

enum { N_CTX = 192, N_PROMPT = 70, N_SEQ = 3 };

/* F16 and BF16 on the GPU against the CPU: the largest logit difference, as a share of the
 * row's largest logit. The activations reach the tensor cores as two halves that keep 22
 * (F16) or 16 (BF16) bits and the products are exact, so what differs is the sums' order
 * (f32 rounding, some 1e-7 of each dot product's sum |w x|) and, for BF16, the activations'
 * last bits: seen up to 1.7e-6 (F16, every F16 model here, the scaled one too) and 1.4e-5
 * (BF16) through these models' two layers (H200, 2026-12-02). The bounds, 6 and 7 times
 * that, catch a mis-mapped element, a NaN, and a lost low half (about 2.5e-4 of a matmul's
 * largest output for F16, 2e-3 for BF16). */
#define F16_TOL  1e-5
#define BF16_TOL 1e-4

static ps_pool *pool;
static char best_isa[32]; /* this CPU's fastest kernel family */

/* Rows of logits that differ between a and b (rows × vocab floats); prints the first. */
static int differ(const float *a, const float *b, int rows, int vocab, const char *what) {
    int bad = 0;
    for (int r = 0; r < rows; r++)
        if (memcmp(a + (size_t)r * vocab, b + (size_t)r * vocab, (size_t)vocab * sizeof(float))) {
            if (!bad) {
                int i = 0;
                while (a[(size_t)r * vocab + i] == b[(size_t)r * vocab + i]) i++;
                fprintf(stderr, "%s: row %d logit %d: %.9g vs %.9g\n", what, r, i, a[(size_t)r * vocab + i],
                        b[(size_t)r * vocab + i]);
            }
            bad++;
        }
    return bad;
}

/* Rows of logits where a and b differ by more than tol of the row's largest |a| (a NaN in
 * one but not the other: by infinitely much), the first printed; the largest share of all
 * rows into *worst (tol INFINITY: only that). */
static int far(const float *a, const float *b, int rows, int vocab, double tol, double *worst, const char *what) {
    int bad = 0;
    *worst = 0;
    for (int r = 0; r < rows; r++) {
        double top = 0, d = 0;
        int at = 0;
        for (int i = 0; i < vocab; i++) {
            double x = a[(size_t)r * vocab + i], y = b[(size_t)r * vocab + i];
            double e = isnan(x) != isnan(y) ? INFINITY : fabs(x - y);
            top = fabs(x) > top ? fabs(x) : top;
            if (e > d) d = e, at = i;
        }
        d = top > 0 ? d / top : d;
        *worst = d > *worst ? d : *worst;
        if (d > tol && !bad++)
            fprintf(stderr, "%s: row %d logit %d: %.9g vs %.9g (%.2e of the row's largest)\n", what, r, at,
                    a[(size_t)r * vocab + at], b[(size_t)r * vocab + at], d);
    }
    return bad;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The logits of a prompt of n_prompt tokens (every row, chunks of max_batch) and of n_gen
 * greedy steps on device dev, in a context of n_ctx positions; the generated tokens into gen.
 * Returns (n_prompt + n_gen) × vocab logits, or NULL. */
static float *run_long(const ps_model *m, int dev, int max_batch, int n_ctx, const int32_t *prompt, int n_prompt,
                       int n_gen, int32_t *gen) {
    int vocab = m->hp.vocab;
    ps_ctx_params cp = {.n_ctx = n_ctx, .max_batch = max_batch, .act = PS_ACT_Q8, .device = dev};
    ps_ctx *c = NULL;
    char err[512];
    ps_status s = ps_ctx_create(m, &cp, pool, &c, err, sizeof err);
    if (s) fprintf(stderr, "%s\n", err);
    PS_CHECK_OK(s);
    float *out = c ? malloc((size_t)(n_prompt + n_gen) * vocab * sizeof(float)) : NULL;
    if (out) PS_CHECK_OK(ps_forward(c, prompt, n_prompt, 0, out, n_prompt, err, sizeof err));
    int32_t tok = out ? argmax(out + (size_t)(n_prompt - 1) * vocab, vocab) : 0;
    for (int i = 0; out && i < n_gen; i++) {
        gen[i] = tok;
        float *row = out + (size_t)(n_prompt + i) * vocab;
        PS_CHECK_OK(ps_forward(c, &tok, 1, n_prompt + i, row, 1, err, sizeof err));
        tok = argmax(row, vocab);
    }
    ps_ctx_free(c);
    return out;
}

/* run_long for an N_PROMPT-token prompt in N_CTX positions. */
static float *run(const ps_model *m, int dev, int max_batch, const int32_t *prompt, int n_gen, int32_t *gen) {
    return run_long(m, dev, max_batch, N_CTX, prompt, N_PROMPT, n_gen, gen);
}

/* Three sequences in scattered blocks of one pool, run on the GPU in mixed segments (as
 * test_forward.c's run_mixed): each row's logits equal ref's (the sequence alone, on the CPU).
 * In the second step the first segment (one row) asks for no logits, so the chunk's logit
 * rows start at 1: the head's norm then reads row r + 1 where it writes row r. The third
 * step's 4 rows take the decode path (a graph): two sequences, one with 3 rows whose
 * attention reads the cache the chunk itself writes. */
static void mixed(const ps_model *m, const int32_t *const *toks, const int *len, const float *const *ref) {
    static const int32_t tab[N_SEQ][3] = {{5, 2, 9}, {0, -1, -1}, {11, 3, 7}};
    static const int take[][N_SEQ] = {{20, 7, 30}, {19, 0, 1}, {1, 0, 3}, {0, 0, 36}};
    static const int logits[][N_SEQ] = {{20, 7, 30}, {19, 0, 0}, {1, 0, 3}, {0, 0, 36}}; /* each segment's last rows' */
    int vocab = m->hp.vocab, done[N_SEQ] = {0};
    ps_ctx_params cp = {.n_ctx = 96, .n_blocks = 12, .max_batch = 16, .device = PS_DEVICE_CUDA(0)};
    char err[512];
    ps_ctx *c = NULL;
    PS_CHECK_OK(ps_ctx_create(m, &cp, pool, &c, err, sizeof err));
    float *out = malloc((size_t)96 * N_SEQ * vocab * sizeof(float));
    int32_t tokens[96 * N_SEQ];
    for (size_t step = 0; c && step < PS_ARRAY_LEN(take); step++) {
        ps_seg segs[N_SEQ];
        int n_segs = 0, rows = 0, who[N_SEQ];
        for (int s = N_SEQ - 1; s >= 0; s--) {
            int n = take[step][s];
            if (!n) continue;
            who[n_segs] = s;
            segs[n_segs++] =
                (ps_seg){.pos = done[s], .n = n, .blocks = tab[s], .n_blocks = 3, .n_logits = logits[step][s]};
            memcpy(tokens + rows, toks[s] + done[s], (size_t)n * sizeof(int32_t));
            rows += n;
        }
        PS_CHECK_OK(ps_forward_segs(c, segs, n_segs, tokens, NULL, out, err, sizeof err));
        for (int g = 0, row = 0; g < n_segs; row += segs[g].n_logits, g++) {
            int s = who[g], first = done[s] + segs[g].n - segs[g].n_logits;
            PS_CHECK(
                !differ(out + (size_t)row * vocab, ref[s] + (size_t)first * vocab, segs[g].n_logits, vocab, "mixed"));
        }
        for (int s = 0; s < N_SEQ; s++) done[s] += take[step][s];
    }
    for (int s = 0; s < N_SEQ; s++) PS_CHECK_EQ_INT(done[s], len[s]);
    free(out);
    ps_ctx_free(c);
}

/* Logits of every prompt row through two shards, stage 0 on dev0 and stage 1 on dev1. */
static float *two_stages(const char *dir, int dev0, int dev1, const int32_t *prompt, int vocab, int dim) {
    char p0[600], p1[600], err[512];
    snprintf(p0, sizeof p0, "%s/stage-0.gguf", dir);
    snprintf(p1, sizeof p1, "%s/stage-1.gguf", dir);
    ps_model *m0 = NULL, *m1 = NULL;
    PS_CHECK_OK(ps_model_load(p0, PS_GGUF_MAP, &m0, err, sizeof err));
    PS_CHECK_OK(ps_model_load(p1, PS_GGUF_MAP, &m1, err, sizeof err));
    ps_ctx *c0 = NULL, *c1 = NULL;
    ps_ctx_params a = {.n_ctx = N_CTX, .max_batch = 32, .device = dev0}, b = a;
    b.device = dev1;
    if (m0) PS_CHECK_OK(ps_ctx_create(m0, &a, pool, &c0, err, sizeof err));
    if (m1) PS_CHECK_OK(ps_ctx_create(m1, &b, pool, &c1, err, sizeof err));
    float *x = malloc((size_t)N_PROMPT * dim * sizeof(float)), *out = malloc((size_t)N_PROMPT * vocab * sizeof(float));
    bool ok = c0 && c1 && x && out;
    if (ok) PS_CHECK_OK(ps_forward_stage(c0, prompt, NULL, N_PROMPT, 0, x, 0, err, sizeof err));
    if (ok) PS_CHECK_OK(ps_forward_stage(c1, NULL, x, N_PROMPT, 0, out, N_PROMPT, err, sizeof err));
    ps_ctx_free(c0), ps_ctx_free(c1);
    ps_model_free(m0), ps_model_free(m1);
    free(x);
    if (!ok) free(out);
    return ok ? out : NULL;
}

/* Everything above for one model file; n_gen greedy steps. split: also the two-stage fleets;
 * real: also against this CPU's fastest family; tol: 0, or F16_TOL / BF16_TOL for F16 / BF16
 * weights (then the mixed segments are held to the GPU's own logits, bit for bit). */
static void check_model(const char *path, int n_gen, bool split, bool real, double tol) {
    char err[512], what[700];
    ps_model *m = NULL;
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    if (!m) return;
    int vocab = m->hp.vocab;
    int32_t prompt[N_PROMPT], gen_cpu[64], gen_gpu[64], gen_gpu2[64], gen_gpu3[64];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(ps_test_rng_u32() % (uint32_t)vocab);
    PS_CHECK_OK(ps_matmul_set_isa("ref"));
    float *cpu = run(m, PS_DEVICE_CPU, 16, prompt, n_gen, gen_cpu);
    float *gpu = run(m, PS_DEVICE_CUDA(0), 8, prompt, n_gen, gen_gpu);
    float *gpu2 = run(m, PS_DEVICE_CUDA(0), 64, prompt, n_gen, gen_gpu2);
    setenv("PS_CUDA_MMA_N", "64", 1); /* these small matrices take tiles of 32 tokens by themselves */
    float *gpu3 = run(m, PS_DEVICE_CUDA(0), 64, prompt, n_gen, gen_gpu3);
    unsetenv("PS_CUDA_MMA_N");
    int rows = N_PROMPT + n_gen;
    if (cpu && gpu && gpu2 && gpu3) {
        snprintf(what, sizeof what, "%s: GPU vs CPU (ref)", path);
        double worst = 0;
        int bad = tol ? far(cpu, gpu, rows, vocab, tol, &worst, what) : differ(cpu, gpu, rows, vocab, what);
        snprintf(what, sizeof what, "%s: GPU chunks of 64 vs 8", path);
        int bad2 = differ(gpu, gpu2, rows, vocab, what);
        snprintf(what, sizeof what, "%s: GPU chunks of 64 in tiles of 64 tokens vs 8", path);
        bad2 += differ(gpu, gpu3, rows, vocab, what);
        if (tol)
            printf("%s: %d rows, largest logit difference from the CPU's (ref) %.2e of the row's largest (%d over "
                   "%.0e), %d differ between chunk sizes\n",
                   path, rows, worst, bad, tol, bad2);
        else
            printf("%s: %d rows, %d differ from the CPU's (ref), %d between chunk sizes\n", path, rows, bad, bad2);
        PS_CHECK(!bad && !bad2);
        PS_CHECK(!memcmp(gen_cpu, gen_gpu, (size_t)n_gen * sizeof(int32_t)));
        PS_CHECK(!memcmp(gen_gpu, gen_gpu2, (size_t)n_gen * sizeof(int32_t)));
        PS_CHECK(!memcmp(gen_gpu, gen_gpu3, (size_t)n_gen * sizeof(int32_t)));
        /* mixed segments: the prompt's prefixes of 40, 7 and 70 rows as three sequences */
        const int len[N_SEQ] = {40, 7, 70};
        const int32_t *toks[N_SEQ] = {prompt, prompt, prompt};
        const float *own = tol ? gpu : cpu, *ref[N_SEQ] = {own, own, own};
        mixed(m, toks, len, ref);
    }
    if (split && cpu) {
        char dir[600], cmd[2000];
        snprintf(dir, sizeof dir, "%s", ps_test_tmp("cuda-shards"));
        snprintf(cmd, sizeof cmd, "rm -rf \"%s\" && \"%s\" split -m \"%s\" --stages 2 -o \"%s\" >/dev/null", dir,
                 getenv("PIPESHARD_BIN"), path, dir);
        PS_CHECK_EQ_INT(system(cmd), 0);
        for (int way = 0; way < 2; way++) {
            float *two = two_stages(dir, way ? PS_DEVICE_CUDA(0) : PS_DEVICE_CPU,
                                    way ? PS_DEVICE_CPU : PS_DEVICE_CUDA(0), prompt, vocab, m->hp.dim);
            snprintf(what, sizeof what, "%s: stage 0 on the %s, stage 1 on the %s", path, way ? "GPU" : "CPU",
                     way ? "CPU" : "GPU");
            PS_CHECK(two && !differ(cpu, two, N_PROMPT, vocab, what));
            free(two);
        }
    }
    if (real && gpu) { /* this CPU's fastest family: the gap, printed (family_gap) */
        PS_CHECK_OK(ps_matmul_set_isa(best_isa));
        int32_t gen_best[64];
        float *best = run(m, PS_DEVICE_CPU, 16, prompt, n_gen, gen_best);
        double worst = 0;
        if (best) far(gpu, best, rows, vocab, INFINITY, &worst, path);
        printf("%s: GPU vs CPU (%s): largest logit difference %.2e of the row's largest, tokens %s\n", path, best_isa,
               worst, best && !memcmp(gen_best, gen_gpu, (size_t)n_gen * 4) ? "equal" : "DIFFER");
        free(best);
    }
    PS_CHECK_OK(ps_matmul_set_isa("ref"));
    free(cpu), free(gpu), free(gpu2), free(gpu3);
    ps_model_free(m);
}

/* A context of many KV blocks (attention streams them through a ring of a few; decode's
 * cluster of 8 blocks takes 9 chunks, block 0 two; with PS_CUDA_ATT_C 3 and 1, each block
 * three, or all nine): a 1,100-token prompt in chunks of 64, then 8 greedy steps, the GPU's
 * logits equal to the CPU's (ref). */
static void long_context(const char *path) {
    char err[512];
    ps_model *m = NULL;
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    if (!m) return;
    enum { N = 1100, GEN = 8, CTX = 1152 };
    int32_t *prompt = malloc(N * sizeof *prompt), gen_cpu[GEN], gen_gpu[GEN];
    for (int i = 0; i < N; i++) prompt[i] = (int32_t)(ps_test_rng_u32() % (uint32_t)m->hp.vocab);
    PS_CHECK_OK(ps_matmul_set_isa("ref"));
    float *cpu = run_long(m, PS_DEVICE_CPU, 64, CTX, prompt, N, GEN, gen_cpu);
    static const char *const cluster[] = {NULL, "3", "1"};
    for (size_t i = 0; i < PS_ARRAY_LEN(cluster); i++) {
        if (cluster[i]) setenv("PS_CUDA_ATT_C", cluster[i], 1);
        float *gpu = run_long(m, PS_DEVICE_CUDA(0), 64, CTX, prompt, N, GEN, gen_gpu);
        char what[700];
        snprintf(what, sizeof what, "%s: %d positions, GPU (decode attention's cluster: %s) vs CPU (ref)", path,
                 N + GEN, cluster[i] ? cluster[i] : "8");
        int bad = cpu && gpu ? differ(cpu, gpu, N + GEN, m->hp.vocab, what) : -1;
        printf("%s: %d rows, %d differ from the CPU's (ref)\n", what, N + GEN, bad);
        PS_CHECK(bad == 0 && !memcmp(gen_cpu, gen_gpu, sizeof gen_cpu));
        free(gpu);
    }
    unsetenv("PS_CUDA_ATT_C");
    free(cpu), free(prompt);
    ps_model_free(m);
}

/* Decode's matmul with g and 2g lanes a row (PS_CUDA_LANES; these small models' matrices
 * take 16 by themselves, k_mvs where the type has it, and a K type's 32, or 16 with an
 * epilogue): the GPU's logits and tokens equal to the CPU's (ref). */
static void lanes(const char *path, int g0) {
    char err[512], what[700];
    ps_model *m = NULL;
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    if (!m) return;
    enum { GEN = 12 };
    int vocab = m->hp.vocab, rows = N_PROMPT + GEN;
    int32_t prompt[N_PROMPT], gen_cpu[GEN], gen_gpu[GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(ps_test_rng_u32() % (uint32_t)vocab);
    PS_CHECK_OK(ps_matmul_set_isa("ref"));
    float *cpu = run(m, PS_DEVICE_CPU, 16, prompt, GEN, gen_cpu);
    for (int g = g0; g <= 2 * g0; g *= 2) {
        char v[4];
        snprintf(v, sizeof v, "%d", g);
        setenv("PS_CUDA_LANES", v, 1);
        float *gpu = run(m, PS_DEVICE_CUDA(0), 16, prompt, GEN, gen_gpu);
        snprintf(what, sizeof what, "%s: GPU with %d lanes a row vs CPU (ref)", path, g);
        int bad = cpu && gpu ? differ(cpu, gpu, rows, vocab, what) : -1;
        printf("%s: %d rows, %d differ\n", what, rows, bad);
        PS_CHECK(bad == 0 && !memcmp(gen_cpu, gen_gpu, sizeof gen_cpu));
        free(gpu);
    }
    unsetenv("PS_CUDA_LANES");
    free(cpu);
    ps_model_free(m);
}

/* PS_CUDA_LEAVE_OUT: a word no kernel's name holds changes no bit; k_rmsnorm left out changes
 * the logits (the norms are not run), and nothing fails. */
static void leave_out(const char *path) {
    char err[512];
    ps_model *m = NULL;
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    if (!m) return;
    enum { GEN = 4 };
    int vocab = m->hp.vocab, rows = N_PROMPT + GEN;
    int32_t prompt[N_PROMPT], gen[GEN], gen2[GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(ps_test_rng_u32() % (uint32_t)vocab);
    float *all = run(m, PS_DEVICE_CUDA(0), 16, prompt, GEN, gen);
    setenv("PS_CUDA_LEAVE_OUT", "no_such_kernel", 1);
    float *none = run(m, PS_DEVICE_CUDA(0), 16, prompt, GEN, gen2);
    PS_CHECK(all && none && !memcmp(all, none, (size_t)rows * vocab * sizeof(float)));
    setenv("PS_CUDA_LEAVE_OUT", "x,k_rmsnorm", 1);
    float *left = run(m, PS_DEVICE_CUDA(0), 16, prompt, GEN, gen2);
    PS_CHECK(all && left && memcmp(all, left, (size_t)rows * vocab * sizeof(float)));
    unsetenv("PS_CUDA_LEAVE_OUT");
    printf("%s: PS_CUDA_LEAVE_OUT: an unknown word changes no bit, k_rmsnorm left out changes the logits\n", path);
    free(all), free(none), free(left);
    ps_model_free(m);
}

/* What the GPU refuses, with the message. */
static void refusals(const char *path) {
    ps_model *m = NULL;
    char err[512];
    PS_CHECK_OK(ps_model_load(path, PS_GGUF_MAP, &m, err, sizeof err));
    if (!m) return;
    ps_ctx *c = NULL;
    ps_ctx_params f32 = {.n_ctx = 64, .max_batch = 8, .act = PS_ACT_F32, .device = PS_DEVICE_CUDA(0)};
    PS_CHECK_EQ_INT(ps_ctx_create(m, &f32, pool, &c, err, sizeof err), PS_ERR_UNSUPPORTED);
    PS_CHECK(strstr(err, "CPU only") != NULL);
    ps_ctx_params absent = {.n_ctx = 64, .max_batch = 8, .device = PS_DEVICE_CUDA(99)};
    PS_CHECK_EQ_INT(ps_ctx_create(m, &absent, pool, &c, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "no CUDA device 99") != NULL);
    /* a KV pool of 2^22 blocks: terabytes, more than any device holds */
    ps_ctx_params huge = {.n_ctx = 64, .n_blocks = 1 << 22, .max_batch = 8, .device = PS_DEVICE_CUDA(0)};
    PS_CHECK_EQ_INT(ps_ctx_create(m, &huge, pool, &c, err, sizeof err), PS_ERR_NOMEM);
    PS_CHECK(strstr(err, "GiB of GPU memory") != NULL);
    printf("refusals: %s\n", err);
    PS_CHECK(c == NULL);
    ps_model_free(m);
}

/* A copy of the model at path (in the test directory) whose F32 tensors named *suffix are
 * multiplied by k: ffn_norm × 1e5 puts F16 matmul inputs past the halves' 65,504 (gate and
 * up about 1e5, down about 1e10), which the GPU's rows scaled by a power of two must absorb. */
static const char *scaled(const char *path, const char *suffix, float k) {
    static char out[600];
    char err[512];
    snprintf(out, sizeof out, "%s", path);
    snprintf(out + strlen(out) - 5, sizeof out - strlen(out) + 5, "-scaled.gguf");
    size_t len = 0;
    uint8_t *buf = ps_test_read_file(path, &len);
    PS_CHECK(buf && len > 0);
    if (!buf || !len) {
        free(buf);
        return NULL;
    }
    ps_gguf *g = NULL;
    PS_CHECK_OK(ps_gguf_open_mem(buf, len, &g, err, sizeof err));
    int scaled = 0;
    for (int64_t i = 0; g && i < ps_gguf_n_tensors(g); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, i);
        size_t nl = strlen(t->name), sl = strlen(suffix);
        if (t->type != PS_TYPE_F32 || nl < sl || strcmp(t->name + nl - sl, suffix)) continue;
        float *v = (float *)(buf + ps_gguf_data_offset(g) + t->offset);
        for (size_t j = 0; j < t->nbytes / 4; j++) v[j] *= k;
        scaled++;
    }
    ps_gguf_close(g);
    PS_CHECK(scaled > 0);
    FILE *f = fopen(out, "wb");
    bool ok = scaled > 0 && f && fwrite(buf, 1, len, f) == len;
    PS_CHECK(ok);
    if (f) fclose(f);
    free(buf);
    return ok ? out : NULL;
}

/* A synthetic model of type type and architecture arch (written by `pipeshard synth`). */
static const char *synth(const char *type, const char *arch, const char *extra) {
    static char path[600];
    char cmd[2000];
    snprintf(path, sizeof path, "%s", ps_test_tmp("cuda-model.gguf"));
    snprintf(path + strlen(path) - 5, sizeof path - strlen(path) + 5, "-%s-%s%s.gguf", type, arch, *extra ? "-x" : "");
    snprintf(cmd, sizeof cmd,
             "\"%s\" synth --layers 2 --dim 256 --heads 4 --kv-heads 2 --ffn 1536 --vocab 600 --untied --type %s "
             "--arch %s %s -o \"%s\" >/dev/null",
             getenv("PIPESHARD_BIN"), type, arch, extra, path);
    PS_CHECK_EQ_INT(system(cmd), 0);
    return path;
}

int main(void) {
    int n = ps_cuda_device_count();
    if (n == 0) return ps_test_skip("no CUDA device here (or a build without CUDA): GPU tests skipped");
    if (!getenv("PIPESHARD_BIN")) return ps_test_skip("PIPESHARD_BIN is not set (ctest sets it)");
    char name[256], err[512];
    size_t free_b = 0, total_b = 0;
    PS_CHECK_OK(ps_cuda_device_info(0, name, sizeof name, &free_b, &total_b, err, sizeof err));
    printf("device 0: %s, %.1f of %.1f GiB free\n", name, free_b / 1073741824.0, total_b / 1073741824.0);
    snprintf(best_isa, sizeof best_isa, "%s", ps_matmul_isa());
    printf("CPU kernels: %s (and ref)\n", best_isa);
    ps_test_rng_seed(11);
    PS_CHECK_OK(ps_pool_create(4, &pool));
    static const char *const cases[][3] = {
        {"F32", "llama", ""},
        {"F16", "qwen2", ""},
        {"BF16", "qwen3", ""},
        {"Q8_0", "llama", ""},
        {"Q4_0", "qwen2", ""},
        {"Q4_1", "llama", ""},
        {"Q5_0", "qwen3", ""},
        {"Q5_1", "llama", ""},
        {"Q4_K", "llama", ""},
        {"Q5_K", "qwen2", ""},
        {"Q6_K", "qwen3", ""},
        {"Q4_K_M", "llama", ""},
        {"Q8_0", "llama", "--heads 8 --kv-heads 2 --head-dim 40"},
        {"Q4_0", "llama", "--dim 320 --ffn 800"}, /* rows of 10 and 25 blocks: a chunk's tail */
        {"Q5_1", "qwen2", "--dim 320 --ffn 800"},
        {"Q6_K", "llama", "--dim 512 --heads 8 --kv-heads 2 --ffn 1280"}, /* 5 super-blocks: 1,050-byte rows */
        {"Q4_K_M", "qwen2", "--dim 512 --heads 8 --kv-heads 2 --ffn 1280"},
        {"Q4_K_M", "llama", "--dim 2048 --heads 16 --kv-heads 4 --ffn 2304"}, /* K types in decode's k_mv */
        {"F16", "llama", "--dim 320 --ffn 800"},                    /* 32 elements past the last chunk of 64 */
        {"BF16", "qwen2", "--heads 8 --kv-heads 2 --head-dim 40"},  /* 80 rows: half a tile */
        {"Q8_0", "qwen3", "--heads 2 --kv-heads 1 --head-dim 256"}, /* the widest head: 69 KB for decode's scores */
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(cases); i++) {
        double tol = !strcmp(cases[i][0], "F16") ? F16_TOL : !strcmp(cases[i][0], "BF16") ? BF16_TOL : 0;
        check_model(synth(cases[i][0], cases[i][1], cases[i][2]), 24, i == 9, false, tol);
    }
    const char *big = scaled(synth("F16", "llama", ""), "ffn_norm.weight", 1e5f);
    if (big) check_model(big, 24, false, false, F16_TOL);
    long_context(synth("Q4_0", "llama", ""));                /* head width 64 */
    lanes(synth("Q4_1", "llama", "--dim 320 --ffn 800"), 4); /* two terms a block; rows of 10 and 25 blocks */
    lanes(synth("Q5_0", "qwen3", ""), 4);
    lanes(synth("Q4_K_M", "llama", "--dim 2048 --heads 16 --kv-heads 4 --ffn 2304"), 4); /* 8 and 9 super-blocks */
    leave_out(synth("Q4_0", "llama", ""));
    long_context(synth("Q8_0", "qwen2", "--heads 2 --kv-heads 1"));               /* 128 */
    long_context(synth("Q4_1", "llama", "--heads 8 --kv-heads 4 --head-dim 40")); /* 40 */
    refusals(synth("Q8_0", "llama", ""));
    const char *stories = ps_test_shared_model("stories260K.gguf");
    if (stories)
        check_model(stories, 64, false, true, 0);
    else
        ps_test_skip_part("stories260K.gguf is absent (../shared/models)");
    const char *real[] = {"SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"};
    for (size_t i = 0; i < PS_ARRAY_LEN(real); i++) {
        const char *p = ps_test_cached_model(real[i]);
        if (p)
            check_model(p, 64, i == 0, true, 0);
        else
            ps_test_skip_part("a real model is absent from .cache/models (scripts/fetch_models.sh)");
    }
    ps_pool_free(pool);
    return ps_test_done();
}
