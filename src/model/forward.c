/* forward.c - the run state of a stage (its paged KV cache and buffers) and the forward pass
 * over a layer range, for one sequence or several in one pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "../cuda/cuda.h"
#include "../tensor/gemm.h"
#include "../tensor/fmath.h"
#include "../tensor/pool.h"
#include "../tensor/types.h"
#include "../tensor/vec8.h"
#include "model.h"

/* Heads attended in one pass (at most): the heads of a key/value group share every K and V
 * row, which the first head brings into L1 for the others. */
#define ATT_HEADS 8
/* Floats per head in a thread's scores: every position, rounded up to whole 16-lane blocks. */
#define SCORES_ROW(n_ctx) ((size_t)(n_ctx) + 16)

struct ps_ctx {
    const ps_model *m;
    ps_pool *pool;    /* not owned */
    int n_ctx;        /* positions one sequence may hold */
    int n_blocks;     /* blocks of PS_KV_BLOCK positions in the KV pool */
    int max_batch;    /* tokens per forward chunk */
    ps_act act;       /* matmul arithmetic */
    int q_dim;        /* n_head * head_dim */
    int kv_dim;       /* n_head_kv * head_dim */
    float *x;         /* (max_batch, dim) residual stream */
    float *xb;        /* (max_batch, dim) normed input of a branch */
    float *q;         /* (max_batch, q_dim) */
    float *att;       /* (max_batch, q_dim) attention output */
    float *hb;        /* (max_batch, ffn_dim) gate, then silu(gate) * up */
    float *hb2;       /* (max_batch, ffn_dim) up */
    float *scores;    /* (threads, ATT_HEADS, SCORES_ROW(n_ctx)) attention weights of each thread's heads */
    float *rope_cs;   /* (max_batch, rope_dim / 2, 2) cos and sin for the chunk's positions */
    double *inv_freq; /* (rope_dim / 2) rotation frequency of each pair */
    float *kt, *vt;   /* (max_batch, kv_dim) the chunk's keys and values, before the cache */
    float *k_cache;   /* (layers, n_blocks, n_head_kv, PS_KV_BLOCK, head_dim), in kv_mem: a */
    float *v_cache;   /* block's positions of one head contiguous, as attention reads them */
    void *kv_mem;     /* kv_alloc */
    size_t kv_bytes;
    int32_t *ident;          /* (n_ctx / PS_KV_BLOCK rounded up) blocks 0, 1, 2, ...: the table of
                                ps_forward_stage's one sequence */
    int32_t *row_pos;        /* (max_batch) position of each row of the chunk */
    const int32_t **row_tab; /* (max_batch) block table of each row's sequence */
    int32_t *logit_rows;     /* (max_batch) rows of the chunk whose logits are asked for */
    void *scratch;           /* matmul scratch */
    ps_cuda *gpu;            /* on a GPU: the layers, cache and buffers there (the CPU's unused) */
};

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Zeroed memory for the KV cache (bytes > 0). On Linux, in huge pages where the kernel
 * gives them: a decode step reads the whole cache, and in 4 KiB pages that is a TLB miss
 * every 4 KiB (SmolLM2-135M decode at 1536 positions was 1.3x faster in huge pages). */
static void *kv_alloc(size_t bytes) {
#ifdef __linux__
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it, normal pages */
#endif
    return p;
#else
    return ps_calloc(1, bytes);
#endif
}

static void kv_free(void *p, size_t bytes) {
    if (!p) return;
#ifdef __linux__
    munmap(p, bytes);
#else
    (void)bytes;
    free(p);
#endif
}

// ---------------------------------------------------------------------------------------
// Vector helpers (fixed reduction order: 16 lanes, then a fixed tree)

/* The sum of 16 lanes in the one fixed tree: l + 8 into l, then l + 4, l + 2, l + 1. */
static ALWAYS_INLINE float tree_sum16(float l[16]) {
    for (int w = 8; w; w >>= 1)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}

/* sum a[i] * b[i] for i < n, in an order that depends only on n. */
static ALWAYS_INLINE float dot_f32(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return tree_sum16(acc);
}

/* out = x / rms(x) * w over n elements (out may alias x). */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float scale = 1.0f / sqrtf(dot_f32(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Rotates the first rope_dim elements of one head vector by the chunk row's cos/sin table. */
static void rope(float *v, const float *cs, int rope_dim, bool neox) {
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

// ---------------------------------------------------------------------------------------
// Context

/* Frequency of rotation pair i: base^(-2i/rope_dim), divided by Llama 3.1's factor. */
static void init_inv_freq(ps_ctx *c) {
    const ps_hparams *hp = &c->m->hp;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        double f = pow((double)hp->rope_base, -2.0 * i / hp->rope_dim);
        if (c->m->rope_freqs) f /= c->m->rope_freqs[i];
        c->inv_freq[i] = f / hp->rope_scale;
    }
}

/* Raises *best to the scratch that matrices ws[0..n) sharing one input need for max_batch tokens. */
static void consider(size_t *best, const ps_mat *const *ws, int n, ps_act act, int max_batch, int n_threads) {
    size_t need = 0;
    if (act == PS_ACT_Q8) need = ps_matmul_multi_scratch_bytes(ws, n, max_batch);
    for (int i = 0; act == PS_ACT_F32 && i < n; i++) {
        size_t one = ps_gemm_scratch_bytes(ws[i]->type, ws[i]->cols, max_batch, n_threads);
        if (one > need) need = one;
    }
    if (need > *best) *best = need;
}

/* Largest matmul scratch the model's weights need for max_batch tokens. */
static size_t scratch_bytes(const ps_model *m, ps_act act, int max_batch, int n_threads) {
    size_t best = 0;
    for (int i = 0; i < m->layer_end - m->layer_begin; i++) {
        const ps_layer *L = &m->layers[i];
        const ps_mat *qkv[] = {&L->wq, &L->wk, &L->wv}, *gate_up[] = {&L->w_gate, &L->w_up};
        consider(&best, qkv, 3, act, max_batch, n_threads);
        consider(&best, gate_up, 2, act, max_batch, n_threads);
        consider(&best, (const ps_mat *[]){&L->wo}, 1, act, max_batch, n_threads);
        consider(&best, (const ps_mat *[]){&L->w_down}, 1, act, max_batch, n_threads);
    }
    if (m->has_head) consider(&best, (const ps_mat *[]){&m->output}, 1, act, max_batch, n_threads);
    return best;
}

ps_status ps_act_from_name(const char *name, ps_act *out) {
    if (!strcmp(name, "q8"))
        *out = PS_ACT_Q8;
    else if (!strcmp(name, "f32"))
        *out = PS_ACT_F32;
    else
        return PS_ERR_ARG;
    return PS_OK;
}

const char *ps_act_name(ps_act a) { return a == PS_ACT_F32 ? "f32" : "q8"; }

ps_status ps_device_parse(const char *s, int *out, char *err, size_t errlen) {
    char *end;
    if (!strcmp(s, "cpu")) {
        *out = PS_DEVICE_CPU;
        return PS_OK;
    }
    if (!strcmp(s, "cuda")) {
        *out = PS_DEVICE_CUDA(0);
        return PS_OK;
    }
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
        long i = strtol(s + 5, &end, 10);
        if (!*end && i < 1024) {
            *out = PS_DEVICE_CUDA((int)i);
            return PS_OK;
        }
    }
    return ps_errf(err, errlen, PS_ERR_ARG, "unknown device '%s' (expected cpu, cuda or cuda:N)", s);
}

const char *ps_device_name(int device, char *buf, size_t n) {
    if (device == PS_DEVICE_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", device - PS_DEVICE_CUDA(0));
    return buf;
}

/* The cos/sin table of positions pos[0..n) (forward.c's rotation: every stage, CPU or GPU,
 * takes its numbers from here). */
static void rope_rows(const ps_ctx *c, const int32_t *pos, int n, float *out) {
    int half = c->m->hp.rope_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos[t] * c->inv_freq[i];
            out[((size_t)t * half + i) * 2] = (float)cos(a);
            out[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
        }
}

/* The context's stage on CUDA device p->device: the rotation of every position, then the
 * weights, cache and buffers in GPU memory. */
static ps_status gpu_create(ps_ctx *c, const ps_ctx_params *p, char *err, size_t errlen) {
    if (p->act != PS_ACT_Q8)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "--activations %s runs on the CPU only (the GPU takes q8)",
                       ps_act_name(p->act));
    int32_t *pos = ps_malloc((size_t)c->n_ctx * sizeof *pos);
    float *cs = ps_malloc((size_t)c->n_ctx * c->m->hp.rope_dim * sizeof *cs);
    ps_status s = pos && cs ? PS_OK : ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < c->n_ctx; i++) pos[i] = i;
    if (!s) rope_rows(c, pos, c->n_ctx, cs);
    ps_cuda_params gp = {.device = p->device - PS_DEVICE_CUDA(0),
                         .n_ctx = c->n_ctx,
                         .n_blocks = c->n_blocks,
                         .max_batch = c->max_batch,
                         .rope_cs = cs};
    if (!s) s = ps_cuda_create(c->m, &gp, &c->gpu, err, errlen);
    free(pos), free(cs);
    return s;
}

size_t ps_ctx_bytes(const ps_model *m, const ps_ctx_params *p, int threads) {
    const ps_hparams *hp = &m->hp;
    bool gpu = p->device != PS_DEVICE_CPU;
    size_t B = (size_t)p->max_batch, q_dim = (size_t)hp->n_head * hp->head_dim,
           kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    int seq_blocks = (p->n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK, n_blocks = p->n_blocks ? p->n_blocks : seq_blocks;
    size_t kv = gpu ? 0 : (size_t)(m->layer_end - m->layer_begin) * n_blocks * PS_KV_BLOCK * kv_dim;
    size_t floats = B * (2 * (size_t)hp->dim + 2 * q_dim + 2 * kv_dim + 2 * (size_t)hp->ffn_dim + hp->rope_dim) +
                    (size_t)threads * ATT_HEADS * SCORES_ROW(p->n_ctx) + 2 * kv;
    return floats * sizeof(float) + (gpu ? 0 : scratch_bytes(m, p->act, p->max_batch, threads)) +
           (size_t)seq_blocks * 4 + B * (4 + sizeof(int32_t *) + 4);
}

ps_status ps_ctx_create(const ps_model *m, const ps_ctx_params *p, ps_pool *pool, ps_ctx **out, char *err,
                        size_t errlen) {
    *out = NULL;
    const ps_hparams *hp = &m->hp;
    int n_ctx = p->n_ctx, max_batch = p->max_batch;
    int seq_blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK, n_blocks = p->n_blocks ? p->n_blocks : seq_blocks;
    if (n_ctx < 1 || max_batch < 1 || n_blocks < 1)
        return ps_errf(err, errlen, PS_ERR_ARG, "context size, KV blocks and batch size must be positive");
    if (p->act != PS_ACT_Q8 && p->act != PS_ACT_F32) return ps_errf(err, errlen, PS_ERR_ARG, "unknown activation mode");
    ps_ctx *c = ps_calloc(1, sizeof *c);
    if (!c) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    c->m = m;
    c->pool = pool;
    c->n_ctx = n_ctx;
    c->n_blocks = n_blocks;
    c->max_batch = max_batch;
    c->act = p->act;
    c->q_dim = hp->n_head * hp->head_dim;
    c->kv_dim = hp->n_head_kv * hp->head_dim;
    bool gpu = p->device != PS_DEVICE_CPU; /* the KV cache and matmul scratch live there */
    size_t B = (size_t)max_batch, layers = (size_t)(m->layer_end - m->layer_begin);
    size_t kv = gpu ? 0 : layers * (size_t)n_blocks * PS_KV_BLOCK * (size_t)c->kv_dim;
    int threads = ps_pool_size(pool);
    c->x = ps_malloc(B * hp->dim * sizeof(float));
    c->xb = ps_malloc(B * hp->dim * sizeof(float));
    c->q = ps_malloc(B * c->q_dim * sizeof(float));
    c->att = ps_malloc(B * c->q_dim * sizeof(float));
    c->kt = ps_malloc(B * c->kv_dim * sizeof(float));
    c->vt = ps_malloc(B * c->kv_dim * sizeof(float));
    c->hb = ps_malloc(B * hp->ffn_dim * sizeof(float));
    c->hb2 = ps_malloc(B * hp->ffn_dim * sizeof(float));
    c->scores = ps_malloc((size_t)threads * ATT_HEADS * SCORES_ROW(n_ctx) * sizeof(float));
    c->rope_cs = ps_malloc(B * hp->rope_dim * sizeof(float));
    c->inv_freq = ps_malloc((size_t)hp->rope_dim / 2 * sizeof(double) + 1);
    c->ident = ps_malloc((size_t)seq_blocks * sizeof(int32_t));
    c->row_pos = ps_malloc(B * sizeof(int32_t));
    c->row_tab = ps_malloc(B * sizeof(int32_t *));
    c->logit_rows = ps_malloc(B * sizeof(int32_t));
    c->kv_bytes = 2 * kv * sizeof(float) + 64; /* never 0 */
    if ((c->kv_mem = kv_alloc(c->kv_bytes))) c->k_cache = c->kv_mem, c->v_cache = c->k_cache + kv;
    size_t sb = gpu ? 0 : scratch_bytes(m, p->act, max_batch, threads);
    c->scratch = sb ? ps_malloc(sb) : NULL;
    if (!c->x || !c->xb || !c->q || !c->att || !c->kt || !c->vt || !c->hb || !c->hb2 || !c->scores || !c->rope_cs ||
        !c->inv_freq || !c->k_cache || !c->v_cache || !c->ident || !c->row_pos || !c->row_tab || !c->logit_rows ||
        (sb && !c->scratch)) {
        ps_ctx_free(c);
        return ps_errf(err, errlen, PS_ERR_NOMEM,
                       "out of memory for a %d-position context of %d KV blocks (KV cache %.1f MiB)", n_ctx, n_blocks,
                       2.0 * kv * sizeof(float) / (1 << 20));
    }
    for (int i = 0; i < seq_blocks; i++) c->ident[i] = i;
    init_inv_freq(c);
    ps_status s = gpu ? gpu_create(c, p, err, errlen) : PS_OK;
    if (s) {
        ps_ctx_free(c);
        return s;
    }
    *out = c;
    return PS_OK;
}

void ps_ctx_free(ps_ctx *c) {
    if (!c) return;
    free(c->x), free(c->xb), free(c->q), free(c->att), free(c->kt), free(c->vt), free(c->hb), free(c->hb2),
        free(c->scores);
    free(c->rope_cs), free(c->inv_freq), free(c->scratch);
    free(c->ident), free(c->row_pos), free(c->row_tab), free(c->logit_rows);
    kv_free(c->kv_mem, c->kv_bytes);
    ps_cuda_free(c->gpu);
    free(c);
}

int ps_ctx_n_ctx(const ps_ctx *c) { return c->n_ctx; }
int ps_ctx_n_blocks(const ps_ctx *c) { return c->n_blocks; }

size_t ps_ctx_kv_block_floats(const ps_ctx *c) { return (size_t)PS_KV_BLOCK * c->kv_dim; }

struct ps_cuda *ps_ctx_cuda(ps_ctx *c) {
    return c->gpu;
}

ps_status ps_ctx_kv_read(ps_ctx *c, int li, int32_t b, float *k, float *v) {
    if (c->gpu) return ps_cuda_kv_read(c->gpu, li, b, k, v);
    size_t at = ((size_t)li * c->n_blocks + (size_t)b) * PS_KV_BLOCK * c->kv_dim, n = ps_ctx_kv_block_floats(c);
    memcpy(k, c->k_cache + at, n * sizeof *k), memcpy(v, c->v_cache + at, n * sizeof *v);
    return PS_OK;
}

ps_status ps_ctx_kv_write(ps_ctx *c, int li, int32_t b, const float *k, const float *v) {
    if (c->gpu) return ps_cuda_kv_write(c->gpu, li, b, k, v);
    size_t at = ((size_t)li * c->n_blocks + (size_t)b) * PS_KV_BLOCK * c->kv_dim, n = ps_ctx_kv_block_floats(c);
    memcpy(c->k_cache + at, k, n * sizeof *k), memcpy(c->v_cache + at, v, n * sizeof *v);
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Attention

typedef struct {
    ps_ctx *c;
    int n;           /* rows in the chunk (their positions and block tables: c->row_pos, row_tab) */
    const float *kc; /* this layer's keys (n_blocks, n_head_kv, PS_KV_BLOCK, head_dim) */
    const float *vc; /* this layer's values */
} attn_job;

/* Where key/value head kvh of position p lives in a layer's pool, given the sequence's
 * block table. */
static ALWAYS_INLINE size_t kv_at(const ps_ctx *c, const int32_t *tab, int kvh, int p) {
    return (((size_t)tab[p / PS_KV_BLOCK] * c->m->hp.n_head_kv + (size_t)kvh) * PS_KV_BLOCK +
            (size_t)(p % PS_KV_BLOCK)) *
           (size_t)c->m->hp.head_dim;
}

/* Attention in 16-lane vectors (GCC vector extensions: AVX-512, two AVX2 or four SSE/NEON
 * registers, the same lane operations in each). The order of every sum is the one the
 * scalar definition gives (dot_f32's 16 lanes and tree for q·k, then positions in order in
 * chunks of PS_ATT_CHUNK, the chunks' sums in order),
 * so the bits do not depend on the vector width; the vectors only let 16 positions'
 * scores share one reduction network instead of a tree each. */
typedef float v16 __attribute__((vector_size(64)));
typedef ps_vf8 v8; /* vec8.h's, whose exponent the softmax uses */
/* No vector crosses a call (the helpers are always inlined), so the vector-ABI note that
 * GCC gives for the clones without AVX-512 (reported at the end of the file) does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* n (<= 16) floats from p, the other lanes 0 (head widths that are not a multiple of 16). */
static ALWAYS_INLINE v16 load_part(const float *p, int n) {
    v16 v = {0};
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}

static ALWAYS_INLINE v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Lane i of the result = dot_f32's tree over the 16 lanes of a[i]: halves (l + 8 into l),
 * quarters, pairs, then the last pair, done for 16 vectors at once. Each addition adds the
 * same two numbers as the scalar tree, so the sums are bit-identical. */
static ALWAYS_INLINE v16 tree16(v16 a[16]) {
    v16 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) /* w = 8: lanes 0-7 from a[2i], 8-15 from a[2i+1] */
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                       31);
    for (int i = 0; i < 4; i++) /* w = 4: four lanes per vector of a */
        c[i] =
            __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++) /* w = 2 */
        d[i] =
            __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
            __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    /* w = 1 */
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* Softmax of nh heads' scores (rows srow floats apart) over positions 0..n_pos-1: the largest
 * score; e = exp(score - max) and its 16 lane sums over positions p0 + lane, held as two
 * 8-lane halves (a tree at the end); weights e / sum. Lanes past the last position are 0.
 * Both attention passes use it (8-lane vectors are registers on every x86-64 target). */
static ALWAYS_INLINE void softmax_heads(float *scores, size_t srow, int nh, int n_pos) {
    int tail_pos = n_pos % 16, full = n_pos - tail_pos;
    for (int k = 0; k < nh; k++) {
        float *sk = scores + k * srow, max = -INFINITY;
        for (int p = 0; p < n_pos; p++)
            if (sk[p] > max) max = sk[p];
        v8 sum_lo = {0}, sum_hi = {0};
        for (int p0 = 0; p0 < n_pos; p0 += 16) {
            v8 lo = ps_exp_neg8(ps_load8(sk + p0) - max), hi = ps_exp_neg8(ps_load8(sk + p0 + 8) - max);
            if (p0 == full)
                for (int l = tail_pos; l < 16; l++) l < 8 ? (lo[l] = 0) : (hi[l - 8] = 0);
            memcpy(sk + p0, &lo, sizeof lo);
            memcpy(sk + p0 + 8, &hi, sizeof hi);
            sum_lo += lo, sum_hi += hi;
        }
        float l16[16];
        memcpy(l16, &sum_lo, sizeof sum_lo);
        memcpy(l16 + 8, &sum_hi, sizeof sum_hi);
        float sum = tree_sum16(l16);
        for (int p = 0; p < n_pos; p++) sk[p] /= sum;
    }
}

/* What a pass over heads h0.. of token t works with (attend_nv, attend_nv8): NV = hd / 16
 * when hd is a multiple of 16, else 0 (nv chunks of 16 and a tail of hd % 16). */
typedef struct {
    int hd, kvh, n_pos, nv, tail, nacc;
    size_t srow;
    const int32_t *tab;
    float scale;
} attn_pass;

static ALWAYS_INLINE attn_pass attn_pass_of(const attn_job *j, int t, int h0, const int NV) {
    const ps_hparams *hp = &j->c->m->hp;
    attn_pass a = {.hd = hp->head_dim,
                   .kvh = h0 / (hp->n_head / hp->n_head_kv),
                   .n_pos = j->c->row_pos[t] + 1,
                   .nv = NV ? NV : hp->head_dim / 16,
                   .tail = NV ? 0 : hp->head_dim % 16,
                   .srow = SCORES_ROW(j->c->n_ctx),
                   .tab = j->c->row_tab[t],
                   .scale = 1.0f / sqrtf((float)hp->head_dim)};
    a.nacc = a.nv + (a.tail != 0);
    return a;
}

/* The end of a chunk of positions: each head's chunk sums o added to its total, o zeroed. */
static ALWAYS_INLINE void fold16(v16 (*o)[17], v16 (*tot)[17], int nh, int nacc) {
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < nacc; i++) tot[k][i] += o[k][i], o[k][i] = (v16){0};
}

/* Causal attention of heads h0..h0+nh-1 of token t, all of one key/value group:
 * att = softmax(q·K / sqrt(hd)) V over positions 0..pos+t, each head's sums in position
 * order (the order does not depend on which heads share the pass). NV = hd / 16 when hd is
 * a multiple of 16 (the compiler keeps a head's vectors in registers), else 0 (any
 * hd <= 256). scores: nh rows of SCORES_ROW(n_ctx) floats. */
static ALWAYS_INLINE void attend_nv(const attn_job *j, int t, int h0, int nh, float *scores, const int NV) {
    const ps_ctx *c = j->c;
    const attn_pass a = attn_pass_of(j, t, h0, NV);
    const int hd = a.hd, kvh = a.kvh, n_pos = a.n_pos, nv = a.nv, tail = a.tail, nacc = a.nacc;
    const size_t srow = a.srow;
    const int32_t *tab = a.tab;
    /* scores, 16 positions at a time (past the end: the last row again, results unused) */
    for (int p0 = 0; p0 < n_pos; p0 += 16)
        for (int k = 0; k < nh; k++) {
            const float *q = c->q + (size_t)t * c->q_dim + (size_t)(h0 + k) * hd;
            v16 qv[17], acc[16];
            for (int i = 0; i < nv; i++) qv[i] = load16(q + 16 * i);
            if (tail) qv[nv] = load_part(q + 16 * nv, tail);
            for (int r = 0; r < 16; r++) {
                const float *kr = j->kc + kv_at(c, tab, kvh, p0 + r < n_pos ? p0 + r : n_pos - 1);
                v16 a = {0};
                for (int i = 0; i < nv; i++) a += qv[i] * load16(kr + 16 * i);
                if (tail) a += qv[nv] * load_part(kr + 16 * nv, tail);
                acc[r] = a;
            }
            v16 sc = tree16(acc) * a.scale;
            memcpy(scores + k * srow + p0, &sc, sizeof sc);
        }
    softmax_heads(scores, srow, nh, n_pos);
    /* outputs: each head's accumulators over one block of positions at a time, the sum of
     * each chunk (PS_ATT_CHUNK) added to the head's total (tot) where the chunk ends */
    v16 o[ATT_HEADS][17], tot[ATT_HEADS][17];
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < nacc; i++) o[k][i] = tot[k][i] = (v16){0};
    for (int p0 = 0; p0 < n_pos; p0 += 16) {
        if (p0 && p0 % PS_ATT_CHUNK == 0) fold16(o, tot, nh, nacc);
        int pe = p0 + 16 < n_pos ? p0 + 16 : n_pos;
        const float *vb = j->vc + kv_at(c, tab, kvh, p0); /* p0..pe-1: one block's rows */
        for (int k = 0; k < nh; k++) {
            const float *w = scores + k * srow;
            v16 ok[17];
            for (int i = 0; i < nacc; i++) ok[i] = o[k][i];
            for (int p = p0; p < pe; p++) {
                const float *vr = vb + (size_t)(p - p0) * hd;
                for (int i = 0; i < nv; i++) ok[i] += w[p] * load16(vr + 16 * i);
                if (tail) ok[nv] += w[p] * load_part(vr + 16 * nv, tail);
            }
            for (int i = 0; i < nacc; i++) o[k][i] = ok[i];
        }
    }
    fold16(o, tot, nh, nacc);
    for (int k = 0; k < nh; k++) {
        float *out = c->att + (size_t)t * c->q_dim + (size_t)(h0 + k) * hd;
        for (int i = 0; i < nv; i++) memcpy(out + 16 * i, &tot[k][i], sizeof tot[k][i]);
        if (tail) memcpy(out + 16 * nv, &tot[k][nv], (size_t)tail * sizeof(float));
    }
}

// The same attention in 8-lane vectors

/* Where the widest vectors are 256 bits (AVX2), GCC keeps a v16 in memory and every v16
 * operation goes through the stack (a 16-row decode step spent a quarter of its time in
 * attend_nv). attend_nv8 is attend_nv with each 16-lane vector held as its halves lo (lanes
 * 0-7) and hi (8-15): every lane's operations and every sum's order are attend_nv's, so the
 * bits are the same (tests/test_forward.c compares the two). */

/* n floats from p (none when n <= 0, at most 8), the other lanes 0. */
static ALWAYS_INLINE v8 load8_part(const float *p, int n) {
    v8 v = {0};
    memcpy(&v, p, (size_t)(n <= 0 ? 0 : n > 8 ? 8 : n) * sizeof(float));
    return v;
}

/* Lane r of the result = dot_f32's tree over position r's 16 lanes, given s[r] = lo + hi
 * (the tree's first step, l + 8 into l) for 8 positions: tree16's later steps. */
static ALWAYS_INLINE v8 tree8(const v8 s[8]) {
    v8 c[4], d[2];
    for (int i = 0; i < 4; i++) /* w = 4: positions 2i and 2i + 1, four lanes each */
        c[i] = __builtin_shufflevector(s[2 * i], s[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(s[2 * i], s[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++) /* w = 2 */
        d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    /* w = 1 */
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

/* fold16 on 8-lane halves. */
static ALWAYS_INLINE void fold8(v8 (*o)[2 * 17], v8 (*tot)[2 * 17], int nh, int nacc) {
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < 2 * nacc; i++) tot[k][i] += o[k][i], o[k][i] = (v8){0};
}

/* attend_nv in 8-lane vectors (its arguments; a head's 16-lane chunk i is lo[i], hi[i]). */
static ALWAYS_INLINE void attend_nv8(const attn_job *j, int t, int h0, int nh, float *scores, const int NV) {
    const ps_ctx *c = j->c;
    const attn_pass a = attn_pass_of(j, t, h0, NV);
    const int hd = a.hd, kvh = a.kvh, n_pos = a.n_pos, nv = a.nv, tail = a.tail, nacc = a.nacc;
    const size_t srow = a.srow;
    const int32_t *tab = a.tab;
    /* scores, 8 positions at a time (past the end: the last row again, results unused) */
    for (int p0 = 0; p0 < n_pos; p0 += 16) {
        const float *kb = j->kc + kv_at(c, tab, kvh, p0); /* p0..p0+15: one block's rows */
        int last = n_pos - 1 - p0;
        for (int k = 0; k < nh; k++) {
            const float *q = c->q + (size_t)t * c->q_dim + (size_t)(h0 + k) * hd;
            v8 ql[NV ? NV : 17], qh[NV ? NV : 17];
            for (int i = 0; i < nv; i++) ql[i] = ps_load8(q + 16 * i), qh[i] = ps_load8(q + 16 * i + 8);
            if (tail) ql[nv] = load8_part(q + 16 * nv, tail), qh[nv] = load8_part(q + 16 * nv + 8, tail - 8);
            for (int r0 = 0; r0 < 16; r0 += 8) {
                v8 s[8];
                for (int r = 0; r < 8; r++) {
                    const float *kr = kb + (size_t)(r0 + r < last ? r0 + r : last) * hd;
                    v8 lo = {0}, hi = {0};
                    for (int i = 0; i < nv; i++) {
                        lo += ql[i] * ps_load8(kr + 16 * i);
                        hi += qh[i] * ps_load8(kr + 16 * i + 8);
                    }
                    if (tail) {
                        lo += ql[nv] * load8_part(kr + 16 * nv, tail);
                        hi += qh[nv] * load8_part(kr + 16 * nv + 8, tail - 8);
                    }
                    s[r] = lo + hi;
                }
                v8 sc = tree8(s) * a.scale;
                memcpy(scores + k * srow + p0 + r0, &sc, sizeof sc);
            }
        }
    }
    softmax_heads(scores, srow, nh, n_pos);
    /* outputs, as attend_nv's */
    v8 o[ATT_HEADS][2 * 17], tot[ATT_HEADS][2 * 17];
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < 2 * nacc; i++) o[k][i] = tot[k][i] = (v8){0};
    for (int p0 = 0; p0 < n_pos; p0 += 16) {
        if (p0 && p0 % PS_ATT_CHUNK == 0) fold8(o, tot, nh, nacc);
        int pe = p0 + 16 < n_pos ? p0 + 16 : n_pos;
        const float *vb = j->vc + kv_at(c, tab, kvh, p0);
        for (int k = 0; k < nh; k++) {
            const float *w = scores + k * srow;
            v8 lo[NV ? NV : 17], hi[NV ? NV : 17];
            for (int i = 0; i < nacc; i++) lo[i] = o[k][2 * i], hi[i] = o[k][2 * i + 1];
            for (int p = p0; p < pe; p++) {
                const float *vr = vb + (size_t)(p - p0) * hd;
                for (int i = 0; i < nv; i++) {
                    lo[i] += w[p] * ps_load8(vr + 16 * i);
                    hi[i] += w[p] * ps_load8(vr + 16 * i + 8);
                }
                if (tail) {
                    lo[nv] += w[p] * load8_part(vr + 16 * nv, tail);
                    hi[nv] += w[p] * load8_part(vr + 16 * nv + 8, tail - 8);
                }
            }
            for (int i = 0; i < nacc; i++) o[k][2 * i] = lo[i], o[k][2 * i + 1] = hi[i];
        }
    }
    fold8(o, tot, nh, nacc);
    for (int k = 0; k < nh; k++) {
        float *out = c->att + (size_t)t * c->q_dim + (size_t)(h0 + k) * hd;
        for (int i = 0; i < nv; i++) memcpy(out + 16 * i, &tot[k][2 * i], 2 * sizeof tot[k][0]);
        if (tail) memcpy(out + 16 * nv, &tot[k][2 * nv], (size_t)tail * sizeof(float)); /* the halves adjoin */
    }
}

/* The vector width attention uses: 16 lanes where they are one register (AVX-512, the
 * clone for x86-64-v4) or where nothing else is known, 8 on the other x86-64 CPUs. Either
 * gives the same bits; ps_forward_set_attn_lanes sets it (tests). */
static _Atomic int attn_lanes_set;

void ps_forward_set_attn_lanes(int lanes) { attn_lanes_set = lanes == 8 || lanes == 16 ? lanes : 0; }

static int attn_lanes(void) {
    static _Atomic int by_cpu;
    if (attn_lanes_set) return attn_lanes_set;
    if (!by_cpu) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
        by_cpu = __builtin_cpu_supports("x86-64-v4") ? 16 : 8;
#else
        by_cpu = 16;
#endif
    }
    return by_cpu;
}

/* Heads h0..h1-1 of token t, in passes of at most ATT_HEADS heads of one group. */
static ALWAYS_INLINE void attend_heads(const attn_job *j, int t, int h0, int h1, float *scores) {
    int g = j->c->m->hp.n_head / j->c->m->hp.n_head_kv;
    for (int h = h0; h < h1;) {
        int end = (h / g + 1) * g, nh = (end < h1 ? end : h1) - h;
        nh = nh < ATT_HEADS ? nh : ATT_HEADS;
        bool w8 = attn_lanes() == 8;
        switch (j->c->m->hp.head_dim) { /* NV a constant in each call: its loops unroll */
        case 64: w8 ? attend_nv8(j, t, h, nh, scores, 4) : attend_nv(j, t, h, nh, scores, 4); break;
        case 128: w8 ? attend_nv8(j, t, h, nh, scores, 8) : attend_nv(j, t, h, nh, scores, 8); break;
        default: w8 ? attend_nv8(j, t, h, nh, scores, 0) : attend_nv(j, t, h, nh, scores, 0); break;
        }
        h += nh;
    }
}

/* Pool task. Enough (token, group) pairs: thread ith takes every nth, so that the later
 * tokens of a causal chunk, which attend to more positions, are spread over the threads.
 * Fewer (decode of a model with few key/value heads): thread ith takes its contiguous
 * share of the (token, head) pairs, so that the threads are balanced to a head and each
 * reads a group's rows once per pass. Which thread computes a head changes no bits. */
PS_SIMD_CLONES static void attend_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const ps_hparams *hp = &j->c->m->hp;
    int nh = hp->n_head, nkv = hp->n_head_kv, g = nh / nkv, units = j->n * nkv;
    float *scores = j->c->scores + (size_t)ith * ATT_HEADS * SCORES_ROW(j->c->n_ctx);
    if (units >= 4 * nth) {
        for (int u = ith; u < units; u += nth) attend_heads(j, u / nkv, (u % nkv) * g, (u % nkv + 1) * g, scores);
        return;
    }
    int total = j->n * nh, b = (int)((int64_t)total * ith / nth), e = (int)((int64_t)total * (ith + 1) / nth);
    for (int i = b; i < e;) { /* split at token boundaries */
        int t = i / nh, end = (t + 1) * nh < e ? (t + 1) * nh : e;
        attend_heads(j, t, i % nh, i % nh + (end - i), scores);
        i = end;
    }
}

// ---------------------------------------------------------------------------------------
// Forward pass

/* ys[i] (n, ws[i]->rows, rows y_strides[i] apart) = x (n, cols) · ws[i]ᵀ for matrices
 * sharing their input (q8 quantizes it once for all of them). */
static void mm_multi(ps_ctx *c, const ps_mat *const *ws, int nw, const float *x, int n, float *const *ys,
                     const int64_t *y_strides) {
    if (c->act == PS_ACT_Q8) {
        ps_matmul_multi(ws, nw, x, ws[0]->cols, n, ys, y_strides, c->scratch, c->pool);
        return;
    }
    for (int i = 0; i < nw; i++) ps_gemm(ws[i], x, ws[i]->cols, n, ys[i], y_strides[i], c->scratch, c->pool);
}

/* y (n, w->rows) = x (n, w->cols) · Wᵀ, with y rows y_stride apart. */
static void mm(ps_ctx *c, const ps_mat *w, const float *x, int n, float *y, int64_t y_stride) {
    mm_multi(c, &w, 1, x, n, &y, &y_stride);
}

/* Adds a bias to n rows of width d, when there is one. */
static void add_bias(float *y, const float *b, int n, int d) {
    if (!b) return;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) y[(size_t)t * d + i] += b[i];
}

/* Attention block of local layer li for the chunk's n rows in c->x; writes each row's key
 * and value at its position in its sequence's blocks. */
static void attention_block(ps_ctx *c, int li, int n) {
    const ps_hparams *hp = &c->m->hp;
    const ps_layer *L = &c->m->layers[li];
    int dim = hp->dim, hd = hp->head_dim;
    size_t layer = (size_t)c->n_blocks * PS_KV_BLOCK * c->kv_dim; /* one layer's pool */
    float *kc = c->k_cache + (size_t)li * layer, *vc = c->v_cache + (size_t)li * layer;
    float *k = c->kt, *v = c->vt;
    for (int t = 0; t < n; t++)
        rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)t * dim, L->attn_norm, dim, hp->rms_eps);
    const ps_mat *qkv[] = {&L->wq, &L->wk, &L->wv};
    mm_multi(c, qkv, 3, c->xb, n, (float *[]){c->q, k, v}, (int64_t[]){c->q_dim, c->kv_dim, c->kv_dim});
    add_bias(c->q, L->bq, n, c->q_dim);
    add_bias(k, L->bk, n, c->kv_dim);
    add_bias(v, L->bv, n, c->kv_dim);
    for (int t = 0; t < n; t++) {
        const float *cs = c->rope_cs + (size_t)t * hp->rope_dim;
        for (int h = 0; h < hp->n_head; h++) {
            float *qh = c->q + (size_t)t * c->q_dim + (size_t)h * hd;
            if (L->q_norm) rmsnorm(qh, qh, L->q_norm, hd, hp->rms_eps);
            rope(qh, cs, hp->rope_dim, hp->rope_neox);
        }
        for (int h = 0; h < hp->n_head_kv; h++) {
            float *kh = k + (size_t)t * c->kv_dim + (size_t)h * hd;
            if (L->k_norm) rmsnorm(kh, kh, L->k_norm, hd, hp->rms_eps);
            rope(kh, cs, hp->rope_dim, hp->rope_neox);
            size_t at = kv_at(c, c->row_tab[t], h, c->row_pos[t]);
            memcpy(kc + at, kh, (size_t)hd * sizeof(float));
            memcpy(vc + at, v + (size_t)t * c->kv_dim + (size_t)h * hd, (size_t)hd * sizeof(float));
        }
    }
    attn_job job = {.c = c, .n = n, .kc = kc, .vc = vc};
    ps_pool_run(c->pool, attend_task, &job);
    mm(c, &L->wo, c->att, n, c->xb, dim);
    for (size_t i = 0; i < (size_t)n * dim; i++) c->x[i] += c->xb[i];
}

typedef struct {
    float *gate;     /* (n) in: gate projection; out: silu(gate) * up */
    const float *up; /* (n) */
    size_t n;
} swiglu_job;

/* Pool task: an even share of gate = silu(gate) * up (element-wise, so any split is exact). */
PS_SIMD_CLONES static void swiglu_task(void *ctx, int ith, int nth) {
    swiglu_job *j = ctx;
    size_t b = j->n * ith / nth, e = j->n * (ith + 1) / nth;
    for (size_t i = b; i < e; i++) j->gate[i] = ps_swiglu(j->gate[i], j->up[i]);
}

/* Feed-forward block (SwiGLU) of local layer li for the chunk in c->x. */
static void ffn_block(ps_ctx *c, int li, int n) {
    const ps_hparams *hp = &c->m->hp;
    const ps_layer *L = &c->m->layers[li];
    int dim = hp->dim;
    for (int t = 0; t < n; t++) rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)t * dim, L->ffn_norm, dim, hp->rms_eps);
    const ps_mat *gate_up[] = {&L->w_gate, &L->w_up};
    mm_multi(c, gate_up, 2, c->xb, n, (float *[]){c->hb, c->hb2}, (int64_t[]){hp->ffn_dim, hp->ffn_dim});
    swiglu_job job = {.gate = c->hb, .up = c->hb2, .n = (size_t)n * hp->ffn_dim};
    ps_pool_run(c->pool, swiglu_task, &job);
    mm(c, &L->w_down, c->hb, n, c->xb, dim);
    for (size_t i = 0; i < (size_t)n * dim; i++) c->x[i] += c->xb[i];
}

/* One chunk of n <= max_batch rows (c->row_pos, row_tab filled). In: tokens (stage 0) or
 * x_in rows. Out: the logits of rows c->logit_rows[0..n_logits) when the model holds the
 * head, else all n rows of the residual stream. */
static ps_status forward_chunk(ps_ctx *c, const int32_t *tokens, const float *x_in, int n, float *out, int n_logits,
                               unsigned io, char *err, size_t errlen) {
    const ps_model *m = c->m;
    int dim = m->hp.dim;
    if (!m->has_embed && !c->gpu) memcpy(c->x, x_in, (size_t)n * dim * sizeof(float));
    for (int t = 0; m->has_embed && t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * ps_row_bytes(m->tok_embd.type, dim);
        ps_status s = ps_dequantize_row(m->tok_embd.type, row, c->x + (size_t)t * dim, dim);
        if (s) return ps_errf(err, errlen, s, "embedding lookup failed: %s", ps_strerror(s));
    }
    if (c->gpu)
        return ps_cuda_chunk(c->gpu, m->has_embed ? c->x : x_in, n, c->row_pos, c->row_tab, c->logit_rows, n_logits,
                             out, io, err, errlen);
    rope_rows(c, c->row_pos, n, c->rope_cs);
    for (int li = 0; li < m->layer_end - m->layer_begin; li++) {
        attention_block(c, li, n);
        ffn_block(c, li, n);
    }
    if (!m->has_head) {
        memcpy(out, c->x, (size_t)n * dim * sizeof(float));
        return PS_OK;
    }
    if (n_logits == 0) return PS_OK;
    for (int t = 0; t < n_logits; t++)
        rmsnorm(c->xb + (size_t)t * dim, c->x + (size_t)c->logit_rows[t] * dim, m->out_norm, dim, m->hp.rms_eps);
    mm(c, &m->output, c->xb, n_logits, out, m->hp.vocab);
    return PS_OK;
}

/* Checks the segments against the context: sizes, positions, block tables. */
static ps_status check_segs(const ps_ctx *c, const ps_seg *segs, int n_segs, const int32_t *tokens, const float *x_in,
                            char *err, size_t errlen) {
    const ps_model *m = c->m;
    if (n_segs < 1 || (m->has_embed ? !tokens : !x_in))
        return ps_errf(err, errlen, PS_ERR_ARG, "bad forward arguments (%d sequences, %s)", n_segs,
                       m->has_embed ? "tokens missing" : "activations missing");
    for (int i = 0; i < n_segs; i++) {
        const ps_seg *g = &segs[i];
        if (g->n < 1 || g->pos < 0 || g->n_logits < 0 || g->n_logits > g->n || !g->blocks)
            return ps_errf(err, errlen, PS_ERR_ARG, "bad forward arguments (n=%d, pos=%d, n_logits=%d)", g->n, g->pos,
                           g->n_logits);
        if ((long long)g->pos + g->n > c->n_ctx)
            return ps_errf(err, errlen, PS_ERR_RANGE, "%d tokens at position %d exceed the context size of %d", g->n,
                           g->pos, c->n_ctx);
        int need = (g->pos + g->n + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
        if (g->n_blocks < need)
            return ps_errf(err, errlen, PS_ERR_ARG, "%d positions need %d KV blocks, the table has %d", g->pos + g->n,
                           need, g->n_blocks);
        for (int b = 0; b < need; b++)
            if (g->blocks[b] < 0 || g->blocks[b] >= c->n_blocks)
                return ps_errf(err, errlen, PS_ERR_ARG, "KV block %d is outside the pool (0..%d)", g->blocks[b],
                               c->n_blocks - 1);
    }
    return PS_OK;
}

ps_status ps_forward_segs_io(ps_ctx *c, const ps_seg *segs, int n_segs, const int32_t *tokens, const float *x_in,
                             float *out, unsigned io, char *err, size_t errlen) {
    const ps_model *m = c->m;
    int dim = m->hp.dim;
    if (io && (!c->gpu || io > 3 || (m->has_embed && (io & PS_CUDA_X_DEV)) || (m->has_head && (io & PS_CUDA_OUT_DEV))))
        return ps_errf(err, errlen, PS_ERR_ARG, "activations in GPU memory need a GPU stage between two others");
    ps_status s = check_segs(c, segs, n_segs, tokens, x_in, err, errlen);
    if (s) return s;
    long long rows = 0;
    for (int i = 0; i < n_segs; i++) rows += segs[i].n;
    for (long long i = 0; m->has_embed && i < rows; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.vocab)
            return ps_errf(err, errlen, PS_ERR_ARG, "token id %d is outside the vocabulary (0..%d)", tokens[i],
                           m->hp.vocab - 1);
    /* rows in segment order, max_batch at a time (a segment may span chunks: same results) */
    int g = 0, in_g = 0, n = 0, n_logits = 0;
    size_t done = 0, logits_done = 0;
    while (g < n_segs) {
        const ps_seg *sg = &segs[g];
        c->row_pos[n] = sg->pos + in_g;
        c->row_tab[n] = sg->blocks;
        if (m->has_head && in_g >= sg->n - sg->n_logits) c->logit_rows[n_logits++] = n;
        n++;
        if (++in_g == sg->n) g++, in_g = 0;
        if (n < c->max_batch && g < n_segs) continue;
        float *o = m->has_head ? out + logits_done * m->hp.vocab : out + done * dim;
        s = forward_chunk(c, m->has_embed ? tokens + done : NULL, m->has_embed ? NULL : x_in + done * dim, n, o,
                          n_logits, io, err, errlen);
        if (s) return s;
        done += (size_t)n, logits_done += (size_t)n_logits;
        n = 0, n_logits = 0;
    }
    return PS_OK;
}

ps_status ps_forward_segs(ps_ctx *c, const ps_seg *segs, int n_segs, const int32_t *tokens, const float *x_in,
                          float *out, char *err, size_t errlen) {
    return ps_forward_segs_io(c, segs, n_segs, tokens, x_in, out, 0, err, errlen);
}

ps_status ps_forward_stage(ps_ctx *c, const int32_t *tokens, const float *x_in, int n, int pos, float *out,
                           int n_logits, char *err, size_t errlen) {
    if (!c->m->has_head) n_logits = 0;
    if (n < 1) { /* nothing to run (n = 0), or a bad count */
        if (n == 0 && n_logits == 0) return PS_OK;
        return ps_errf(err, errlen, PS_ERR_ARG, "bad forward arguments (n=%d, pos=%d, n_logits=%d)", n, pos, n_logits);
    }
    ps_seg seg = {.pos = pos,
                  .n = n,
                  .blocks = c->ident,
                  .n_blocks = (c->n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK,
                  .n_logits = n_logits};
    return ps_forward_segs(c, &seg, 1, tokens, x_in, out, err, errlen);
}

ps_status ps_forward(ps_ctx *c, const int32_t *tokens, int n, int pos, float *logits, int n_logits, char *err,
                     size_t errlen) {
    const ps_model *m = c->m;
    if (!m->has_embed || !m->has_head)
        return ps_errf(err, errlen, PS_ERR_ARG, "this model file holds layers %d..%d only, not the whole model",
                       m->layer_begin, m->layer_end);
    return ps_forward_stage(c, tokens, NULL, n, pos, logits, n_logits, err, errlen);
}
