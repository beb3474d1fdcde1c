/* stage.cu - the CUDA backend (cuda.h): a stage's weights, KV cache and buffers in one
 * device's memory, and the forward pass of a chunk as forward.c's forward_chunk runs it. */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda.h"
#include "kernels.cuh"

/* A matrix in device memory: a float type's bytes as the file holds them, a quantized
 * type's rows as kernels.cuh's dev_row lays them. */
struct dmat {
    uint32_t type;
    int rows, cols;
    size_t row_bytes;
    const uint8_t *d;
};

struct dlayer {
    const float *attn_norm, *bq, *bk, *bv, *q_norm, *k_norm, *ffn_norm;
    dmat wq, wk, wv, wo, gate, up, down;
};

/* Chunks of up to GRAPH_ROWS rows (decode, speculation's few tokens, a few sequences) run
 * as one CUDA graph each: a decode step is some 20 kernels per layer, and launched one by
 * one their launch costs would rival their work. */
#define GRAPH_ROWS 8

struct ps_cuda {
    const ps_model *m;
    int dev, sms;          /* sms: the device's multiprocessors */
    int mv_lanes;          /* PS_CUDA_LANES: k_mv's lanes a row, for tests (0: by size) */
    int mma_n;             /* PS_CUDA_MMA_N: k_mm_mma's tokens a tile, 32 or 64, for tests (0: by grid) */
    int pdl;               /* kernels may start before the one they wait for ends (sm_90 on) */
    const char *leave_out; /* PS_CUDA_LEAVE_OUT: kernels not launched, for measuring (NULL: none) */
    const qk_args *qk;     /* while decode's q/k/v matmul is enqueued doing k_qk's work: its arguments */
    rows_info qk_ri;
    const mv_ffn *ffn; /* while decode's gate/up matmul is enqueued doing the SwiGLU: its arguments */
    cudaStream_t st;
    int n_ctx, n_blocks, max_batch, q_dim, kv_dim, n_layer, seq_blocks;
    int att_rows;         /* rows per attention launch (the scores buffer's) */
    bool att_smem_scores; /* one row's k_attention copies its scores from g->scores into shared memory */
    int atd_c;            /* decode's k_att_dec: blocks a cluster (0: not taken) */
    size_t atd_smem;      /* its shared memory */
    void *mem;            /* one allocation: everything below */
    dlayer *L;            /* host array of device pointers */
    const float *out_norm;
    dmat output;
    float *rope;                                /* (n_ctx, rope_dim) */
    float *x, *xb, *q, *att, *k, *v, *hb, *hb2; /* as forward.c's */
    float *xo;              /* the head's normed rows: apart from xb, whose rows they are made from */
    float *logits, *scores; /* (max_batch, vocab), (att_rows, n_head, n_ctx) */
    float *att_part;        /* k_att_chunks' chunk sums: (GRAPH_ROWS, n_head, att_chunks, head_dim) */
    unsigned *att_count;    /* k_att_chunks' arrivals: (GRAPH_ROWS, n_head), zero between launches */
    int att_chunks;         /* chunks of the values' sums in a context (PS_ATT_CHUNK) */
    uint8_t *xq;            /* quantized activations */
    uint8_t *xq2;           /* the fused SwiGLU's, swapped with xq after it (gate/up still read xq) */
    unsigned *ffn_count;    /* its arrivals: (ffn_dim / 32), zero between launches */
    float *kc, *vc;         /* (layers, n_blocks, n_head_kv, PS_KV_BLOCK, hd) */
    int32_t *meta;          /* pos, tab_off, logit rows, fresh (max_batch each), tables */
    int32_t *hmeta;         /* its host staging (pinned) */
    size_t meta_ints;
    float *hx, *hout; /* pinned staging of a graph's input and output */
    /* by where x and out are (PS_CUDA_X_DEV, PS_CUDA_OUT_DEV), rows and logits, made when first needed */
    cudaGraphExec_t graphs[4][GRAPH_ROWS + 1][GRAPH_ROWS + 1];
};

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            return ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s (%s, %s:%d)", cudaGetErrorString(e_), #call, __FILE__,    \
                           __LINE__);                                                                                  \
    } while (0)

static bool is_float(uint32_t t) { return t == PS_TYPE_F32 || t == PS_TYPE_F16 || t == PS_TYPE_BF16; }
static bool is_k(uint32_t t) { return t == PS_TYPE_Q4_K || t == PS_TYPE_Q5_K || t == PS_TYPE_Q6_K; }

bool ps_cuda_built(void) { return true; }

int ps_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error to keep */
        return 0;
    }
    return n;
}

ps_status ps_cuda_device_info(int dev, char *name, size_t name_len, size_t *free_bytes, size_t *total_bytes, char *err,
                              size_t errlen) {
    int n = ps_cuda_device_count();
    if (dev < 0 || dev >= n) return ps_errf(err, errlen, PS_ERR_ARG, "no CUDA device %d (this machine has %d)", dev, n);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaSetDevice(dev));
    CK(cudaMemGetInfo(free_bytes, total_bytes));
    snprintf(name, name_len, "%s", prop.name);
    return PS_OK;
}

double ps_cuda_read_bandwidth(int dev) {
    const size_t bytes = (size_t)1 << 30;
    void *buf = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double best = 0;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&buf, bytes + 256) != cudaSuccess) goto out;
    if (cudaMemset(buf, 1, bytes + 256) != cudaSuccess) goto out;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto out;
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    for (int r = 0; r < 4; r++) { /* the first pass warms up */
        cudaEventRecord(a);
        k_read<<<sms * 8, 512>>>((const uint4 *)buf, bytes / 16, (unsigned *)((uint8_t *)buf + bytes));
        cudaEventRecord(b);
        float ms = 0;
        if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) goto out;
        if (r && ms > 0 && bytes / (ms * 1e-3) > best) best = bytes / (ms * 1e-3);
    }
out:
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    if (buf) cudaFree(buf);
    return best;
}

/* ---------------------------------------------------------------------------------------
 * Memory layout: one allocation carved in order; a first pass with base NULL measures it. */

typedef struct {
    uint8_t *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes) {
    size_t at = (a->used + 255) & ~(size_t)255;
    a->used = at + bytes;
    return a->base ? a->base + at : NULL;
}

/* Bytes of the quantized activations of n rows of cols against weights w (the halves for
 * F16 and BF16: halves_at's layout). */
static size_t xq_bytes(const ps_mat *w, int n) {
    if (w->type == PS_TYPE_F32) return 0;
    if (is_float(w->type)) return (size_t)n * ((size_t)half_stride((int)w->cols) * 4 + 4);
    return (size_t)n * (is_k(w->type) ? w->cols / 256 * sizeof(ps_block_q8_K) : w->cols / 32 * sizeof(ps_xq32));
}

static void lay_mat(arena *a, dmat *d, const ps_mat *w) {
    d->type = w->type, d->rows = (int)w->rows, d->cols = (int)w->cols;
    d->row_bytes = is_float(w->type) ? ps_row_bytes(w->type, w->cols) : dev_row_bytes(w->type, w->cols);
    d->d = (const uint8_t *)take(a, (size_t)w->rows * d->row_bytes);
}

static const float *lay_vec(arena *a, const float *v, int n) { return v ? (const float *)take(a, n * 4) : NULL; }

/* Carves everything; g->L must hold n_layer entries. */
static void layout(ps_cuda *g, arena *a) {
    const ps_model *m = g->m;
    const ps_hparams *hp = &m->hp;
    size_t B = (size_t)g->max_batch, xq = 0;
    for (int i = 0; i < g->n_layer; i++) {
        const ps_layer *l = &m->layers[i];
        dlayer *d = &g->L[i];
        d->attn_norm = lay_vec(a, l->attn_norm, hp->dim), d->ffn_norm = lay_vec(a, l->ffn_norm, hp->dim);
        d->bq = lay_vec(a, l->bq, g->q_dim), d->bk = lay_vec(a, l->bk, g->kv_dim), d->bv = lay_vec(a, l->bv, g->kv_dim);
        d->q_norm = lay_vec(a, l->q_norm, hp->head_dim), d->k_norm = lay_vec(a, l->k_norm, hp->head_dim);
        const ps_mat *src[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        dmat *dst[] = {&d->wq, &d->wk, &d->wv, &d->wo, &d->gate, &d->up, &d->down};
        for (int j = 0; j < 7; j++) {
            lay_mat(a, dst[j], src[j]);
            size_t b = xq_bytes(src[j], g->max_batch);
            xq = b > xq ? b : xq;
        }
    }
    if (m->has_head) {
        g->out_norm = lay_vec(a, m->out_norm, hp->dim);
        lay_mat(a, &g->output, &m->output);
        size_t b = xq_bytes(&m->output, g->max_batch);
        xq = b > xq ? b : xq;
        g->logits = (float *)take(a, B * hp->vocab * 4);
        g->xo = (float *)take(a, B * hp->dim * 4);
    }
    g->rope = (float *)take(a, (size_t)g->n_ctx * hp->rope_dim * 4);
    g->x = (float *)take(a, B * hp->dim * 4), g->xb = (float *)take(a, B * hp->dim * 4);
    g->q = (float *)take(a, B * g->q_dim * 4), g->att = (float *)take(a, B * g->q_dim * 4);
    g->k = (float *)take(a, B * g->kv_dim * 4), g->v = (float *)take(a, B * g->kv_dim * 4);
    g->hb = (float *)take(a, B * hp->ffn_dim * 4), g->hb2 = (float *)take(a, B * hp->ffn_dim * 4);
    g->scores = (float *)take(a, (size_t)g->att_rows * hp->n_head * g->n_ctx * 4);
    g->att_part = (float *)take(a, (size_t)GRAPH_ROWS * hp->n_head * g->att_chunks * hp->head_dim * 4);
    g->att_count = (unsigned *)take(a, (size_t)GRAPH_ROWS * hp->n_head * 4);
    g->xq = (uint8_t *)take(a, xq), g->xq2 = (uint8_t *)take(a, xq);
    g->ffn_count = (unsigned *)take(a, (size_t)hp->ffn_dim / 32 * 4);
    size_t kv = (size_t)g->n_layer * g->n_blocks * PS_KV_BLOCK * g->kv_dim;
    g->kc = (float *)take(a, kv * 4), g->vc = (float *)take(a, kv * 4);
    g->meta = (int32_t *)take(a, g->meta_ints * 4);
}

/* The launch attribute of clusters of (1, 1, z) thread blocks. */
static cudaLaunchAttribute cluster_of(unsigned z) {
    cudaLaunchAttribute at = {};
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 1, at.val.clusterDim.y = 1, at.val.clusterDim.z = z;
    return at;
}

/* Sets the sizes layout() depends on. */
static void dims(ps_cuda *g, const ps_model *m, const ps_cuda_params *p) {
    g->m = m;
    g->dev = p->device;
    g->n_ctx = p->n_ctx, g->n_blocks = p->n_blocks, g->max_batch = p->max_batch;
    g->q_dim = m->hp.n_head * m->hp.head_dim, g->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    g->n_layer = m->layer_end - m->layer_begin;
    g->seq_blocks = (p->n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    g->att_chunks = (p->n_ctx + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK;
    /* scores of at most 64 MiB per attention launch */
    size_t per_row = (size_t)m->hp.n_head * p->n_ctx * 4, rows = ((size_t)64 << 20) / per_row;
    g->att_rows = rows < 1 ? 1 : rows > (size_t)p->max_batch ? p->max_batch : (int)rows;
    g->meta_ints = 4 * (size_t)p->max_batch + (size_t)p->max_batch * g->seq_blocks;
    int optin = 0; /* the most shared memory a thread block may have; 4 KiB kept for the static */
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p->device) != cudaSuccess)
        cudaGetLastError(), optin = 48 * 1024;
    g->att_smem_scores = att_smem_bytes(m->hp.head_dim, (size_t)p->n_ctx) + 4096 <= (size_t)optin;
    if (cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, p->device) != cudaSuccess)
        cudaGetLastError(), g->sms = 1;
    const char *leave = getenv("PS_CUDA_LEAVE_OUT");
    g->leave_out = leave && *leave ? leave : NULL;
    const char *mma_n = getenv("PS_CUDA_MMA_N");
    g->mma_n = !mma_n ? 0 : !strcmp(mma_n, "32") ? 32 : !strcmp(mma_n, "64") ? 64 : 0;
    const char *lanes = getenv("PS_CUDA_LANES");
    g->mv_lanes = !lanes                 ? 0
                  : !strcmp(lanes, "4")  ? 4
                  : !strcmp(lanes, "8")  ? 8
                  : !strcmp(lanes, "16") ? 16
                  : !strcmp(lanes, "32") ? 32
                                         : 0;
    /* the kernels wait for the one before (pdl_wait) where they were compiled for sm_90 on:
     * not where the driver made them from the sm_80 PTX (a GPU this build has no code for) */
    cudaFuncAttributes fa = {};
    if (cudaSetDevice(p->device) != cudaSuccess || cudaFuncGetAttributes(&fa, k_rmsnorm) != cudaSuccess)
        cudaGetLastError();
    g->pdl = fa.ptxVersion >= 90;
    /* k_att_dec where its shared memory fits and the kernels are sm_90's (clusters: its body
     * is empty in the sm_80 PTX) */
    int hd = m->hp.head_dim, c = att_dec_c(p->n_ctx);
    const char *att_c = getenv("PS_CUDA_ATT_C"); /* fewer blocks a cluster, for measuring and tests */
    if (att_c && *att_c >= '1' && *att_c <= '8' && !att_c[1] && *att_c - '0' < c) c = *att_c - '0';
    g->atd_smem = (size_t)att_dec_layout(hd, (g->att_chunks + c - 1) / c, g->att_chunks * PS_ATT_CHUNK).floats * 4;
    g->atd_c = g->pdl && (hd == 64 || hd == 128) && g->atd_smem + 4096 <= (size_t)optin ? c : 0;
}

size_t ps_cuda_bytes(const ps_model *m, const ps_cuda_params *p) {
    ps_cuda g = {};
    dlayer *L = (dlayer *)calloc((size_t)(m->layer_end - m->layer_begin) + 1, sizeof *L);
    if (!L) return SIZE_MAX;
    dims(&g, m, p);
    g.L = L;
    arena a = {NULL, 0};
    layout(&g, &a);
    free(L);
    return a.used;
}

static ps_status upload(const void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    if (dst && src && bytes) CK(cudaMemcpy((void *)dst, src, bytes, cudaMemcpyHostToDevice));
    return PS_OK;
}

/* Matrix w into d: float types as they are, quantized ones a few MiB of rows at a time
 * through host memory as kernels.cuh's dev_row lays them. */
static ps_status upload_mat(const dmat *d, const ps_mat *w, char *err, size_t errlen) {
    if (is_float(w->type)) return upload(d->d, w->data, (size_t)w->rows * d->row_bytes, err, errlen);
    size_t in_row = ps_row_bytes(w->type, w->cols), per = ((size_t)8 << 20) / d->row_bytes + 1;
    uint8_t *buf = (uint8_t *)malloc(per * d->row_bytes);
    if (!buf) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_status s = PS_OK;
    for (size_t r0 = 0; r0 < (size_t)w->rows && !s; r0 += per) {
        size_t n = (size_t)w->rows - r0 < per ? (size_t)w->rows - r0 : per;
        for (size_t r = 0; r < n; r++)
            dev_row((const uint8_t *)w->data + (r0 + r) * in_row, (size_t)w->cols, w->type, buf + r * d->row_bytes,
                    d->row_bytes);
        s = upload(d->d + r0 * d->row_bytes, buf, n * d->row_bytes, err, errlen);
    }
    free(buf);
    return s;
}

static ps_status upload_weights(ps_cuda *g, const ps_cuda_params *p, char *err, size_t errlen) {
    const ps_model *m = g->m;
    const ps_hparams *hp = &m->hp;
    ps_status s = PS_OK;
    for (int i = 0; i < g->n_layer && !s; i++) {
        const ps_layer *l = &m->layers[i];
        const dlayer *d = &g->L[i];
        const void *pairs[][2] = {{d->attn_norm, l->attn_norm}, {d->ffn_norm, l->ffn_norm}};
        for (int j = 0; j < 2 && !s; j++) s = upload(pairs[j][0], pairs[j][1], (size_t)hp->dim * 4, err, errlen);
        if (!s) s = upload(d->bq, l->bq, (size_t)g->q_dim * 4, err, errlen);
        if (!s) s = upload(d->bk, l->bk, (size_t)g->kv_dim * 4, err, errlen);
        if (!s) s = upload(d->bv, l->bv, (size_t)g->kv_dim * 4, err, errlen);
        if (!s) s = upload(d->q_norm, l->q_norm, (size_t)hp->head_dim * 4, err, errlen);
        if (!s) s = upload(d->k_norm, l->k_norm, (size_t)hp->head_dim * 4, err, errlen);
        const ps_mat *src[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        const dmat *dst[] = {&d->wq, &d->wk, &d->wv, &d->wo, &d->gate, &d->up, &d->down};
        for (int j = 0; j < 7 && !s; j++) s = upload_mat(dst[j], src[j], err, errlen);
    }
    if (!s && m->has_head) {
        s = upload(g->out_norm, m->out_norm, (size_t)hp->dim * 4, err, errlen);
        if (!s) s = upload_mat(&g->output, &m->output, err, errlen);
    }
    if (!s) s = upload(g->rope, p->rope_cs, (size_t)g->n_ctx * hp->rope_dim * 4, err, errlen);
    return s;
}

/* The attention kernel's shared memory. */
static size_t att_smem(const ps_cuda *g) {
    return att_smem_bytes(g->m->hp.head_dim, g->att_smem_scores ? (size_t)g->n_ctx : 0);
}

/* PS_OK if the GPU has a kernel for matrix w; else why not. */
static ps_status mat_ok(const ps_mat *w, char *err, size_t errlen) {
    switch (w->type) {
    case PS_TYPE_F16:
    case PS_TYPE_BF16:
        if (w->cols % 8) /* k_mm_h's 16-byte loads */
            return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                           "the GPU takes %s matrices whose width is a multiple of 8 (this one: %lld)",
                           ps_type_name(w->type), (long long)w->cols);
        return PS_OK;
    case PS_TYPE_F32:
    case PS_TYPE_Q4_0:
    case PS_TYPE_Q4_1:
    case PS_TYPE_Q5_0:
    case PS_TYPE_Q5_1:
    case PS_TYPE_Q8_0:
    case PS_TYPE_Q4_K:
    case PS_TYPE_Q5_K:
    case PS_TYPE_Q6_K: return PS_OK;
    default:
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "the GPU has no kernel for %s weights", ps_type_name(w->type));
    }
}

ps_status ps_cuda_create(const ps_model *m, const ps_cuda_params *p, ps_cuda **out, char *err, size_t errlen) {
    *out = NULL;
    char name[256];
    size_t free_b, total_b;
    ps_status s = ps_cuda_device_info(p->device, name, sizeof name, &free_b, &total_b, err, errlen);
    if (s) return s;
    if (m->hp.head_dim > 256 || m->hp.head_dim % 4 || m->hp.dim % 4)
        return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                       "the GPU takes head widths up to 256 and widths that are multiples of 4 (this model: %d, %d)",
                       m->hp.head_dim, m->hp.dim);
    for (int i = 0; i < m->layer_end - m->layer_begin; i++) {
        const ps_layer *l = &m->layers[i];
        const ps_mat *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (int j = 0; j < 7 && !s; j++) s = mat_ok(ws[j], err, errlen);
    }
    if (!s && m->has_head) s = mat_ok(&m->output, err, errlen);
    if (s) return s;
    size_t need = ps_cuda_bytes(m, p);
    if (need > free_b)
        return ps_errf(err, errlen, PS_ERR_NOMEM,
                       "the stage needs %.2f GiB of GPU memory (weights, a %d-position KV cache of %d blocks, "
                       "buffers) and %s has %.2f GiB free of %.2f",
                       need / 1073741824.0, p->n_ctx, p->n_blocks, name, free_b / 1073741824.0, total_b / 1073741824.0);
    ps_cuda *g = (ps_cuda *)calloc(1, sizeof *g);
    if (!g) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    dims(g, m, p);
    g->L = (dlayer *)calloc((size_t)g->n_layer + 1, sizeof *g->L);
    arena a = {NULL, 0};
    if (!g->L) s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaSuccess;
    if (!s) e = cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking);
    if (!s && e == cudaSuccess) e = cudaMalloc(&g->mem, need);
    size_t hout = (size_t)GRAPH_ROWS * (m->has_head ? m->hp.vocab : m->hp.dim) * 4;
    if (!s && e == cudaSuccess) e = cudaMallocHost((void **)&g->hmeta, g->meta_ints * 4);
    if (!s && e == cudaSuccess) e = cudaMallocHost((void **)&g->hx, (size_t)GRAPH_ROWS * m->hp.dim * 4);
    if (!s && e == cudaSuccess) e = cudaMallocHost((void **)&g->hout, hout);
    if (!s && e != cudaSuccess)
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "CUDA: %s (allocating %.2f GiB on %s)", cudaGetErrorString(e),
                    need / 1073741824.0, name);
    /* the kernels' shared memory, where more than the default 48 KB (k_att_chunks only where the
     * context's scores fit) */
    const void *att1 = g->att_smem_scores ? (const void *)k_attention<true, 1> : (const void *)k_attention<false, 1>;
    const void *att8 = (const void *)k_attention<false, ATT_ROWS>;
    const char *att = "attention's", *mms = "the matmuls'";
    const struct {
        const void *k;
        size_t bytes;
        const char *of;
    } smem[] = {{att1, att_smem(g), att},
                {att8, att_smem_bytes(m->hp.head_dim, 0), att},
                {(const void *)k_att_chunks, g->att_smem_scores ? att_chunks_smem(g->n_ctx) : 0, att},
                {(const void *)k_att_dec<64>, m->hp.head_dim == 64 && g->atd_c ? g->atd_smem : 0, att},
                {(const void *)k_att_dec<128>, m->hp.head_dim == 128 && g->atd_c ? g->atd_smem : 0, att},
                {(const void *)k_att_scores<1>, att_scores_smem(1, m->hp.head_dim), att},
                {(const void *)k_att_scores<ATT_ROWS>, att_scores_smem(ATT_ROWS, m->hp.head_dim), att},
                {(const void *)k_mm_hp<PS_TYPE_F16>, MMHP_SMEM, mms},
                {(const void *)k_mm_hp<PS_TYPE_BF16>, MMHP_SMEM, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q4_0, MMA_N>, mma_tile<PS_TYPE_Q4_0>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q4_1, MMA_N>, mma_tile<PS_TYPE_Q4_1>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q5_0, MMA_N>, mma_tile<PS_TYPE_Q5_0>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q5_1, MMA_N>, mma_tile<PS_TYPE_Q5_1>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q8_0, MMA_N>, mma_tile<PS_TYPE_Q8_0>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q4_0, 32>, mma_tile<PS_TYPE_Q4_0, 32>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q4_1, 32>, mma_tile<PS_TYPE_Q4_1, 32>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q5_0, 32>, mma_tile<PS_TYPE_Q5_0, 32>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q5_1, 32>, mma_tile<PS_TYPE_Q5_1, 32>::smem, mms},
                {(const void *)k_mm_mma<PS_TYPE_Q8_0, 32>, mma_tile<PS_TYPE_Q8_0, 32>::smem, mms},
                {(const void *)k_mm_mma_k<PS_TYPE_Q4_K>, mma_ktile<PS_TYPE_Q4_K>::smem, mms},
                {(const void *)k_mm_mma_k<PS_TYPE_Q5_K>, mma_ktile<PS_TYPE_Q5_K>::smem, mms},
                {(const void *)k_mm_mma_k<PS_TYPE_Q6_K>, mma_ktile<PS_TYPE_Q6_K>::smem, mms},
                {(const void *)k_rmsnorm, rmsnorm_smem(m->hp.dim), "the norm's"}};
    for (size_t i = 0; i < sizeof smem / sizeof *smem && !s; i++)
        if (smem[i].bytes > 48 * 1024 &&
            (e = cudaFuncSetAttribute(smem[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem[i].bytes)) !=
                cudaSuccess)
            s = ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s (%s shared memory)", cudaGetErrorString(e), smem[i].of);
    if (!s && g->atd_c) { /* k_att_dec's clusters fit the device (else the two kernels) */
        cudaLaunchAttribute at = cluster_of(g->atd_c);
        cudaLaunchConfig_t cfg = {dim3(1, 1, g->atd_c), dim3(ATT_THREADS), g->atd_smem, 0, &at, 1};
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, m->hp.head_dim == 64 ? k_att_dec<64> : k_att_dec<128>, &cfg) !=
                cudaSuccess ||
            n < 1)
            cudaGetLastError(), g->atd_c = 0;
    }
    if (!s) {
        a.base = (uint8_t *)g->mem;
        layout(g, &a);
        s = upload_weights(g, p, err, errlen);
    }
    if (!s &&
        (e = cudaMemset(g->kc, 0, 2 * (size_t)g->n_layer * g->n_blocks * PS_KV_BLOCK * g->kv_dim * 4)) != cudaSuccess)
        s = ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s", cudaGetErrorString(e));
    if (!s && (e = cudaMemset(g->ffn_count, 0, (size_t)m->hp.ffn_dim / 32 * 4)) != cudaSuccess)
        s = ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s", cudaGetErrorString(e));
    if (!s && (e = cudaMemset(g->att_count, 0, (size_t)GRAPH_ROWS * m->hp.n_head * 4)) != cudaSuccess)
        s = ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s", cudaGetErrorString(e));
    /* cudaMemset returns before it is done, and cudaMemcpy from pageable memory (the weights)
     * before its last DMA lands; g->st, a non-blocking stream, waits for neither */
    if (!s && (e = cudaDeviceSynchronize()) != cudaSuccess)
        s = ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s (uploading the weights)", cudaGetErrorString(e));
    if (s) {
        ps_cuda_free(g);
        return s;
    }
    if (g->leave_out)
        fprintf(stderr,
                "pipeshard: PS_CUDA_LEAVE_OUT=%s: the kernels whose names hold these are not run; the tokens "
                "are wrong (for measuring what a kernel costs)\n",
                g->leave_out);
    *out = g;
    return PS_OK;
}

void ps_cuda_free(ps_cuda *g) {
    if (!g) return;
    cudaSetDevice(g->dev);
    if (g->mem) cudaFree(g->mem);
    for (int io = 0; io < 4; io++)
        for (int i = 0; i <= GRAPH_ROWS; i++)
            for (int j = 0; j <= GRAPH_ROWS; j++)
                if (g->graphs[io][i][j]) cudaGraphExecDestroy(g->graphs[io][i][j]);
    if (g->hmeta) cudaFreeHost(g->hmeta);
    if (g->hx) cudaFreeHost(g->hx);
    if (g->hout) cudaFreeHost(g->hout);
    if (g->st) cudaStreamDestroy(g->st);
    free(g->L);
    free(g);
}

/* ---------------------------------------------------------------------------------------
 * The forward pass */

static unsigned blocks_for(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

/* The activation format a matmul of type t reads: f32 (0), ps_xq32 (32), ps_block_q8_K
 * (256), F16 (XQ_F16) or BF16 (XQ_BF16) halves. */
static int xq_format(uint32_t t) {
    return t == PS_TYPE_F32 ? 0 : t == PS_TYPE_F16 ? XQ_F16 : t == PS_TYPE_BF16 ? XQ_BF16 : is_k(t) ? 256 : 32;
}

/* The group of matrices ws[0..nw) (outputs ys, strides) for a kernel that takes `per` rows
 * a thread block; *blocks: the thread blocks of all of them. */
static mm_group group(const dmat *const *ws, int nw, float *const *ys, const long long *strides, int per, int *blocks) {
    mm_group grp = {nw};
    *blocks = 0;
    for (int i = 0; i < nw; i++) {
        grp.W[i] = ws[i]->d, grp.Y[i] = ys[i], grp.ys[i] = strides[i], grp.rows[i] = ws[i]->rows;
        grp.blocks[i] = (int)blocks_for(ws[i]->rows, per);
        *blocks += grp.blocks[i];
    }
    return grp;
}

/* Launches the matmul kernel of type T for matrices ws[0..nw) (one type and width, nw <=
 * MM_GROUP): ys[i] (n rows, strides[i] apart) = x · ws[i]ᵀ, x in the type's format. */
template <int T, int TT>
static void launch_qt(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, size_t x_row, int n,
                      float *const *ys, const long long *strides) {
    int blocks;
    mm_group grp = group(ws, nw, ys, strides, MM_R, &blocks);
    int units = ws[0]->cols / (is_k(T) ? 256 : 32), chunk = mm_chunk<T, TT>(units);
    dim3 grid(blocks, blocks_for(n, TT));
    k_mm_q<T, TT>
        <<<grid, MM_THREADS, mm_smem<T, TT>(chunk), g->st>>>(grp, ws[0]->row_bytes, units, chunk, xq, x_row, n);
}

/* PS_CUDA_LEAVE_OUT: whether kernel f's (mangled) name holds one of the list's comma-separated
 * words. What a kernel costs in a decode step, overlaps included, is the step's time without
 * it less the step's time (the tokens are then wrong). */
static bool left_out(const char *list, const void *f) {
    const char *name = NULL;
    if (cudaFuncGetName(&name, f) != cudaSuccess || !name) {
        cudaGetLastError();
        return false;
    }
    for (const char *w = list; *w;) {
        size_t n = strcspn(w, ",");
        if (n && memmem(name, strlen(name), w, n)) return true;
        w += n + (w[n] == ',');
    }
    return false;
}

/* Launches kernel k, which calls pdl_wait, so that it may start while the kernel before it
 * on g's stream finishes (kernels.cuh's pdl_start); in clusters of (1, 1, cluster) thread
 * blocks where cluster is not 0. */
template <typename... P, typename... A>
static void launch_in(ps_cuda *g, unsigned cluster, void (*k)(P...), dim3 blocks, unsigned threads, size_t smem,
                      A... args) {
    if (g->leave_out && left_out(g->leave_out, (const void *)k)) return;
    cudaLaunchAttribute at[2] = {{}, cluster_of(cluster)};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = g->pdl;
    cudaLaunchConfig_t cfg = {blocks, dim3(threads), smem, g->st, at, cluster ? 2u : 1u};
    cudaLaunchKernelEx(&cfg, k, args...);
}
template <typename... P, typename... A>
static void launch_after(ps_cuda *g, void (*k)(P...), dim3 blocks, unsigned threads, size_t smem, A... args) {
    launch_in(g, 0, k, blocks, threads, smem, args...);
}

/* Decode's k_mv: G lanes a row, the fewest that give every warp the device holds rows to
 * work; one wave of thread blocks, shared among the matrices by their rows. */
template <int T, int G, int MODE>
static void launch_mv(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, float *const *ys,
                      const long long *strides, int units, long long rows) {
    int per_sm = 1, blocks = 0, nm = MODE == MV_SWIGLU ? 1 : nw; /* SwiGLU: one matrix of gate's and up's rows */
    size_t smem = mv_smem(wtype<T>::k, units);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_mv<T, G, MODE>, MV_THREADS, smem);
    long long wave = (long long)per_sm * g->sms, set_rows = MV_WARPS * (32 / G); /* a block's rows at once */
    mm_group grp = group(ws, nm, ys, strides, (int)set_rows, &blocks);           /* blocks: each one's rows once */
    if (MODE == MV_SWIGLU)
        grp.W[1] = ws[1]->d, grp.rows[0] = (int)rows, blocks = grp.blocks[0] = (int)blocks_for(rows, set_rows);
    if (blocks > wave) {
        blocks = 0;
        for (int i = 0; i < nm; i++) {
            grp.blocks[i] = (int)((wave * grp.rows[i] + rows - 1) / rows);
            blocks += grp.blocks[i];
        }
    }
    qk_args no_qk = {};
    mv_ffn no_ffn = {};
    launch_after(g, k_mv<T, G, MODE>, blocks, MV_THREADS, smem, grp, ws[0]->row_bytes, units, xq,
                 MODE == MV_QK ? *g->qk : no_qk, g->qk_ri, MODE == MV_SWIGLU ? *g->ffn : no_ffn);
}
/* k_mvs: MVS_R rows a thread block, the plain or the q/k/v epilogue. */
template <int T>
static void launch_mvs(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, float *const *ys,
                       const long long *strides, int units) {
    int blocks;
    mm_group grp = group(ws, nw, ys, strides, MVS_R, &blocks);
    size_t smem = mvs_smem<T>(units);
    qk_args no_qk = {};
    if (g->qk)
        launch_after(g, k_mvs<T, MV_QK>, blocks, MVS_THREADS, smem, grp, ws[0]->row_bytes, units, xq, *g->qk, g->qk_ri);
    else
        launch_after(g, k_mvs<T, MV_PLAIN>, blocks, MVS_THREADS, smem, grp, ws[0]->row_bytes, units, xq, no_qk,
                     g->qk_ri);
}
template <int T>
static void launch_mv(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, float *const *ys,
                      const long long *strides, int units) {
    long long rows = 0, want = 24LL * 32 * g->sms; /* rows * G: 24 warps a multiprocessor */
    for (int i = 0; i < nw; i++) rows += ws[i]->rows;
    int G = g->mv_lanes ? g->mv_lanes : rows * 4 >= want ? 4 : rows * 8 >= want ? 8 : rows * 16 >= want ? 16 : 32;
    G = std::min(std::max(G, 4), mv_max_lanes<T>());
    if (g->qk || g->ffn) G = std::min(G, 16); /* the epilogues' partner row G lanes away */
    /* mode: std::integral_constant of the epilogue */
    auto go = [&](auto mode) {
        constexpr int M = decltype(mode)::value;
        if (G == 4) return launch_mv<T, 4, M>(g, ws, nw, xq, ys, strides, units, rows);
        if constexpr (mv_max_lanes<T>() == 32 && M == MV_PLAIN)
            if (G == 32) return launch_mv<T, 32, M>(g, ws, nw, xq, ys, strides, units, rows);
        if (G == 8) return launch_mv<T, 8, M>(g, ws, nw, xq, ys, strides, units, rows);
        launch_mv<T, 16, M>(g, ws, nw, xq, ys, strides, units, rows);
    };
    if constexpr (mvs_type<T>())
        if (G == 16 && !g->ffn && mvs_smem<T>(units) <= MVS_SMEM)
            return launch_mvs<T>(g, ws, nw, xq, ys, strides, units);
    if (g->qk)
        go(std::integral_constant<int, MV_QK>{});
    else if (g->ffn)
        go(std::integral_constant<int, MV_SWIGLU>{});
    else
        go(std::integral_constant<int, MV_PLAIN>{});
}

/* The same on the tensor cores (k_mm_mma, k_mm_mma_k). */
template <int T>
static void launch_mma(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, size_t x_row, int n,
                       float *const *ys, const long long *strides) {
    const void *k;
    if constexpr (split_type(T))
        k = (const void *)k_mm_mma<T, MMA_N>; /* (the 32-token tile has the same name) */
    else
        k = (const void *)k_mm_mma_k<T>;
    if (g->leave_out && left_out(g->leave_out, k)) return; /* (launch_in's) */
    int blocks;
    mm_group grp = group(ws, nw, ys, strides, split_type(T) ? MMA_M : MMA_KM, &blocks);
    dim3 grid(blocks, blocks_for(n, MMA_N));
    if constexpr (split_type(T)) {
        bool n32 = g->mma_n ? g->mma_n == 32 : grid.x * grid.y < (unsigned)g->sms; /* too few blocks: 32 tokens */
        if (n32)
            k_mm_mma<T, 32><<<dim3(blocks, blocks_for(n, 32)), MMA_THREADS, mma_tile<T, 32>::smem, g->st>>>(
                grp, ws[0]->row_bytes, ws[0]->cols / 32, xq, x_row, n);
        else
            k_mm_mma<T, MMA_N><<<grid, MMA_THREADS, mma_tile<T>::smem, g->st>>>(grp, ws[0]->row_bytes, ws[0]->cols / 32,
                                                                                xq, x_row, n);
    } else
        k_mm_mma_k<T>
            <<<grid, MMA_KTHREADS, mma_ktile<T>::smem, g->st>>>(grp, ws[0]->row_bytes, ws[0]->cols / 256, xq, x_row, n);
}

/* Whether decode's k_mv takes the product of w with n tokens. */
static bool takes_mv(const dmat *w, int n) {
    if (n != 1 || is_float(w->type)) return false;
    int units = w->cols / (is_k(w->type) ? 256 : 32);
    return units >= MV_MIN_UNITS && mv_smem(is_k(w->type), units) <= MV_SMEM;
}

/* Tokens per thread block by batch: decode's 1, a few (speculation, several sequences), 32;
 * MMA_MIN or more on the tensor cores. */
template <int T>
static void launch_q(ps_cuda *g, const dmat *const *ws, int nw, const uint8_t *xq, size_t x_row, int n,
                     float *const *ys, const long long *strides) {
    if (n >= MMA_MIN) return launch_mma<T>(g, ws, nw, xq, x_row, n, ys, strides);
    int units = ws[0]->cols / (is_k(T) ? 256 : 32);
    if (takes_mv(ws[0], n))
        launch_mv<T>(g, ws, nw, xq, ys, strides, units);
    else if (n <= 1)
        launch_qt<T, 1>(g, ws, nw, xq, x_row, n, ys, strides);
    else if (n <= 4)
        launch_qt<T, 4>(g, ws, nw, xq, x_row, n, ys, strides);
    else if (n <= 8)
        launch_qt<T, 8>(g, ws, nw, xq, x_row, n, ys, strides);
    else
        launch_qt<T, 32>(g, ws, nw, xq, x_row, n, ys, strides);
}

static void launch_f32(ps_cuda *g, const dmat *w, const float *x, int n, float *y, long long ys) {
    dim3 grid(blocks_for(w->rows, MMF_ROWS), blocks_for(n, 4));
    k_mm_f<<<grid, MMF_ROWS * 32, 0, g->st>>>(w->d, w->row_bytes, w->cols, x, n, y, ys, w->rows);
}

/* F16 and BF16 on the tensor cores, x's halves in g->xq: k_mm_h for a few tokens, k_mm_hp
 * for more (the same sums). */
template <int T>
static void launch_h(ps_cuda *g, const dmat *const *ws, int nw, int n, float *const *ys, const long long *strides) {
    halves h = halves_at(g->xq, n, ws[0]->cols);
    const uint16_t *hi = h.hi, *lo = h.lo;
    const int *ex = h.ex;
    int blocks;
    if (n <= 8) {
        mm_group grp = group(ws, nw, ys, strides, 16, &blocks);
        launch_after(g, k_mm_h<T, MMH_U>, blocks, MMH_KS * 32, 0, grp, ws[0]->row_bytes, ws[0]->cols, hi, lo, ex, n);
    } else {
        mm_group grp = group(ws, nw, ys, strides, MMHP_M, &blocks);
        launch_after(g, k_mm_hp<T>, dim3(blocks, blocks_for(n, MMHP_N)), MMHP_THREADS, MMHP_SMEM, grp, ws[0]->row_bytes,
                     ws[0]->cols, hi, lo, ex, n);
    }
}

/* forward.c's mm_multi: matrices sharing input x (n rows of ws[0]->cols), the input
 * quantized once per format (have: the format g->xq holds already, 0 for none); matrices
 * of one type next to each other in one launch. */
static void mm_multi(ps_cuda *g, const dmat *const *ws, int nw, const float *x, int n, float *const *ys,
                     const long long *strides, int have) {
    int cols = ws[0]->cols, fmt = have; /* the format in g->xq */
    for (int i = 0, k; i < nw; i = k) {
        const dmat *w = ws[i];
        for (k = i + 1; k < nw && k - i < MM_GROUP && ws[k]->type == w->type; k++) {}
        int want = xq_format(w->type);
        if (want && want != fmt) {
            size_t nb = (size_t)n * cols / (want == 256 ? 256 : 32);
            if (want == 32)
                launch_after(g, k_quant32, blocks_for(nb, 8), 256, 0, x, (int)nb, (ps_xq32 *)g->xq);
            else if (want == 256)
                launch_after(g, k_quant256, blocks_for(nb, 8), 256, 0, x, (int)nb, (ps_block_q8_K *)g->xq);
            else if (want == XQ_F16)
                launch_after(g, k_halves<PS_TYPE_F16>, n, HALVES_THREADS, 0, x, cols, (void *)g->xq);
            else
                launch_after(g, k_halves<PS_TYPE_BF16>, n, HALVES_THREADS, 0, x, cols, (void *)g->xq);
            fmt = want;
        }
        size_t x32 = (size_t)cols / 32 * sizeof(ps_xq32), x256 = (size_t)cols / 256 * sizeof(ps_block_q8_K);
        const dmat *const *g_ws = ws + i;
        float *const *g_ys = ys + i;
        const long long *g_st = strides + i;
        switch (w->type) {
        case PS_TYPE_F32: launch_f32(g, w, x, n, ys[i], strides[i]), k = i + 1; break;
        case PS_TYPE_F16: launch_h<PS_TYPE_F16>(g, g_ws, k - i, n, g_ys, g_st); break;
        case PS_TYPE_BF16: launch_h<PS_TYPE_BF16>(g, g_ws, k - i, n, g_ys, g_st); break;
        case PS_TYPE_Q4_0: launch_q<PS_TYPE_Q4_0>(g, g_ws, k - i, g->xq, x32, n, g_ys, g_st); break;
        case PS_TYPE_Q4_1: launch_q<PS_TYPE_Q4_1>(g, g_ws, k - i, g->xq, x32, n, g_ys, g_st); break;
        case PS_TYPE_Q5_0: launch_q<PS_TYPE_Q5_0>(g, g_ws, k - i, g->xq, x32, n, g_ys, g_st); break;
        case PS_TYPE_Q5_1: launch_q<PS_TYPE_Q5_1>(g, g_ws, k - i, g->xq, x32, n, g_ys, g_st); break;
        case PS_TYPE_Q8_0: launch_q<PS_TYPE_Q8_0>(g, g_ws, k - i, g->xq, x32, n, g_ys, g_st); break;
        case PS_TYPE_Q4_K: launch_q<PS_TYPE_Q4_K>(g, g_ws, k - i, g->xq, x256, n, g_ys, g_st); break;
        case PS_TYPE_Q5_K: launch_q<PS_TYPE_Q5_K>(g, g_ws, k - i, g->xq, x256, n, g_ys, g_st); break;
        case PS_TYPE_Q6_K: launch_q<PS_TYPE_Q6_K>(g, g_ws, k - i, g->xq, x256, n, g_ys, g_st); break;
        }
    }
}

static void mm(ps_cuda *g, const dmat *w, const float *x, int n, float *y, long long ys, int have) {
    mm_multi(g, &w, 1, x, n, &y, &ys, have);
}

/* out (n rows) = rmsnorm of x's rows (rows[r], or r), after x += y on them when y is given:
 * the residual add of the block before, put off to here. Returns the format it quantized
 * out into g->xq for w's matmul (mm_multi's have). */
static int rmsnorm(ps_cuda *g, float *x, const float *y, const int32_t *rows, const float *w, float *out, int n,
                   const dmat *next) {
    const ps_hparams *hp = &g->m->hp;
    int fmt = xq_format(next->type);
    launch_after(g, k_rmsnorm, n, NORM_THREADS, rmsnorm_smem(hp->dim), x, y, rows, w, out, hp->dim, hp->rms_eps, fmt,
                 g->xq);
    return fmt;
}

static void add(ps_cuda *g, float *x, const float *y, size_t n) {
    k_add<<<blocks_for(n, 256), 256, 0, g->st>>>(x, y, n);
}

/* Attention's launches for rows aa.row0 .. + aa.n_rows, AR rows a thread block: decode's
 * one (k_att_dec) where it is taken, else the scores' and the rest's. */
template <int AR> static void attend(ps_cuda *g, const att_args &aa, rows_info ri) {
    unsigned blocks = blocks_for(aa.n_rows, AR);
    if (AR == 1 && g->atd_c) { /* decode: one kernel, a cluster per (row, head) */
        dim3 grid(blocks, aa.n_head, g->atd_c);
        int pad = g->att_chunks * PS_ATT_CHUNK;
        launch_in(g, g->atd_c, aa.hd == 64 ? k_att_dec<64> : k_att_dec<128>, grid, ATT_THREADS, g->atd_smem, aa, ri,
                  pad);
        return;
    }
    launch_after(g, k_att_scores<AR>, dim3(blocks, aa.n_head, att_scores_z(g->n_ctx, AR)), ATT_THREADS,
                 att_scores_smem(AR, aa.hd), aa, ri);
    if (g->att_smem_scores && AR == 1 && aa.hd % 32 == 0)
        launch_after(g, k_att_chunks, dim3(blocks, aa.n_head, att_chunks_z(g->n_ctx, aa.hd)), ATT_THREADS,
                     att_chunks_smem(g->n_ctx), aa, ri);
    else if constexpr (AR > 1) /* several rows' softmaxes work in place */
        launch_after(g, k_attention<false, AR>, dim3(blocks, aa.n_head), ATT_THREADS, att_smem_bytes(aa.hd, 0), aa, ri);
    else if (g->att_smem_scores)
        launch_after(g, k_attention<true, AR>, dim3(blocks, aa.n_head), ATT_THREADS, att_smem(g), aa, ri);
    else
        launch_after(g, k_attention<false, AR>, dim3(blocks, aa.n_head), ATT_THREADS, att_smem(g), aa, ri);
}

/* The attention block of local layer li (forward.c's attention_block). *res: the residual
 * the block before left to add to x (NULL: none); on return, this block's. */
static void attention_block(ps_cuda *g, int li, int n, rows_info ri, const float **res) {
    const ps_hparams *hp = &g->m->hp;
    const dlayer *L = &g->L[li];
    size_t layer = (size_t)g->n_blocks * PS_KV_BLOCK * g->kv_dim;
    float *kc = g->kc + li * layer, *vc = g->vc + li * layer;
    int have = rmsnorm(g, g->x, *res, NULL, L->attn_norm, g->xb, n, &L->wq);
    const dmat *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *outs[] = {g->q, g->k, g->v};
    long long strides[] = {g->q_dim, g->kv_dim, g->kv_dim};
    qk_args qa = {g->q, g->k, g->v,       L->bq,         L->bk,        L->bv,        L->q_norm,     L->k_norm,  g->rope,
                  kc,   vc,   hp->n_head, hp->n_head_kv, hp->head_dim, hp->rope_dim, hp->rope_neox, hp->rms_eps};
    /* decode of a llama: the matmul's last steps rotate and store (k_mv's qk_row) */
    bool fused =
        !hp->rope_neox && !L->q_norm && !L->k_norm && takes_mv(&L->wq, n) && takes_mv(&L->wk, n) && takes_mv(&L->wv, n);
    g->qk = fused ? &qa : NULL, g->qk_ri = ri;
    mm_multi(g, qkv, 3, g->xb, n, outs, strides, have);
    g->qk = NULL;
    if (!fused) launch_after(g, k_qk, dim3(n, hp->n_head + hp->n_head_kv), 32, 0, qa, ri);
    att_args aa = {};
    aa.q = g->q, aa.kc = kc, aa.vc = vc, aa.out = g->att, aa.scores = g->scores;
    have = xq_format(L->wo.type) == 32 && hp->head_dim % 32 == 0 ? 32 : 0; /* attention quantizes for wo */
    aa.xq = have ? (ps_xq32 *)g->xq : NULL;
    aa.n_head = hp->n_head, aa.n_head_kv = hp->n_head_kv, aa.hd = hp->head_dim, aa.srow = g->n_ctx;
    aa.ring = att_ring_blocks(hp->head_dim), aa.scale = 1.0f / sqrtf((float)hp->head_dim);
    aa.part = g->att_part, aa.count = g->att_count, aa.max_chunks = g->att_chunks;
    for (aa.row0 = 0; aa.row0 < n; aa.row0 += g->att_rows) {
        aa.n_rows = n - aa.row0 < g->att_rows ? n - aa.row0 : g->att_rows;
        if (n > GRAPH_ROWS)
            attend<ATT_ROWS>(g, aa, ri);
        else
            attend<1>(g, aa, ri);
    }
    mm(g, &L->wo, g->att, n, g->xb, hp->dim, have);
    *res = g->xb;
}

/* The feed-forward block of local layer li (forward.c's ffn_block); *res as above. */
static void ffn_block(ps_cuda *g, int li, int n, const float **res) {
    const ps_hparams *hp = &g->m->hp;
    const dlayer *L = &g->L[li];
    int have = rmsnorm(g, g->x, *res, NULL, L->ffn_norm, g->xb, n, &L->gate);
    const dmat *gu[] = {&L->gate, &L->up};
    float *outs[] = {g->hb, g->hb2};
    long long strides[] = {hp->ffn_dim, hp->ffn_dim};
    int down_fmt = xq_format(L->down.type) == 32 ? 32 : 0; /* SwiGLU's output quantized as it is made */
    /* decode: the gate/up matmul's last steps make the SwiGLU (k_mv's swiglu_rows) */
    bool fused = L->gate.type == L->up.type && takes_mv(&L->gate, n) && takes_mv(&L->up, n);
    mv_ffn ffn = {down_fmt ? (ps_xq32 *)g->xq2 : NULL, g->ffn_count};
    g->ffn = fused ? &ffn : NULL;
    mm_multi(g, gu, 2, g->xb, n, outs, strides, have);
    g->ffn = NULL;
    size_t e = (size_t)n * hp->ffn_dim;
    have = down_fmt;
    if (!fused)
        launch_after(g, k_swiglu, blocks_for(e, 256), 256, 0, g->hb, g->hb2, e, have ? (ps_xq32 *)g->xq : NULL);
    else if (have) { /* down reads the SwiGLU's blocks */
        uint8_t *t = g->xq;
        g->xq = g->xq2, g->xq2 = t;
    }
    mm(g, &L->down, g->hb, n, g->xb, hp->dim, have);
    *res = g->xb;
}

/* Enqueues a chunk on g's stream: its rows' positions and tables (meta_bytes of g->hmeta),
 * x (n × dim) in, the layers, the head's logits or the activations out. */
static ps_status enqueue_chunk(ps_cuda *g, const float *x, int n, int n_logits, size_t meta_bytes, float *out,
                               unsigned io, char *err, size_t errlen) {
    const ps_model *m = g->m;
    int dim = m->hp.dim, B = g->max_batch;
    CK(cudaMemcpyAsync(g->meta, g->hmeta, meta_bytes, cudaMemcpyHostToDevice, g->st));
    if (x != g->x) /* (a graph's device input is copied in before it) */
        CK(cudaMemcpyAsync(g->x, x, (size_t)n * dim * 4,
                           io & PS_CUDA_X_DEV ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, g->st));
    rows_info ri = {g->meta, g->meta + B, g->meta + 4 * B, g->meta + 3 * B};
    const float *res = NULL; /* each block's residual, added where the next norm reads x */
    for (int li = 0; li < g->n_layer; li++) {
        attention_block(g, li, n, ri, &res);
        ffn_block(g, li, n, &res);
    }
    CK(cudaGetLastError());
    if (!m->has_head) {
        add(g, g->x, res, (size_t)n * dim);
        if (out) /* (a graph's device output is copied out after it) */
            CK(cudaMemcpyAsync(out, g->x, (size_t)n * dim * 4,
                               io & PS_CUDA_OUT_DEV ? cudaMemcpyDefault : cudaMemcpyDeviceToHost, g->st));
    } else if (n_logits > 0) { /* the last residual only on the rows whose logits are asked for */
        int have = rmsnorm(g, g->x, res, g->meta + 2 * B, g->out_norm, g->xo, n_logits, &g->output);
        mm(g, &g->output, g->xo, n_logits, g->logits, m->hp.vocab, have);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(out, g->logits, (size_t)n_logits * m->hp.vocab * 4, cudaMemcpyDeviceToHost, g->st));
    }
    return PS_OK;
}

ps_status ps_cuda_chunk(ps_cuda *g, const float *x, int n, const int32_t *row_pos, const int32_t *const *row_tab,
                        const int32_t *logit_rows, int n_logits, float *out, unsigned io, char *err, size_t errlen) {
    const ps_model *m = g->m;
    int dim = m->hp.dim, B = g->max_batch;
    if (n < 1 || n > B || n_logits < 0 || n_logits > n || io > 3 || (m->has_head && (io & PS_CUDA_OUT_DEV)))
        return ps_errf(err, errlen, PS_ERR_ARG, "bad chunk (%d rows, %d logits, io %u)", n, n_logits, io);
    CK(cudaSetDevice(g->dev));
    /* rows' positions and tables: a sequence's table once for its consecutive rows */
    int32_t *pos = g->hmeta, *off = pos + B, *lr = off + B, *fresh = lr + B, *tabs = fresh + B;
    int nt = 0;
    for (int t = 0; t < n; t++) {
        pos[t] = row_pos[t];
        if (t > 0 && row_tab[t] == row_tab[t - 1]) {
            off[t] = off[t - 1];
            continue;
        }
        int last = t; /* the run's last row has its largest position */
        while (last + 1 < n && row_tab[last + 1] == row_tab[t]) last++;
        int need = row_pos[last] / PS_KV_BLOCK + 1;
        if ((size_t)(nt + need) > (size_t)B * g->seq_blocks)
            return ps_errf(err, errlen, PS_ERR_INTERNAL, "block tables overflow the chunk's buffer");
        off[t] = nt;
        memcpy(tabs + nt, row_tab[t], (size_t)need * 4);
        nt += need;
    }
    for (int i = 0; i < n_logits; i++) lr[i] = logit_rows[i];
    for (int t = 0; t < n && n <= GRAPH_ROWS; t++) { /* decode: its sequence's first position written here */
        fresh[t] = pos[t];
        for (int u = 0; u < n; u++)
            if (row_tab[u] == row_tab[t] && pos[u] < fresh[t]) fresh[t] = pos[u];
    }
    size_t out_bytes = (size_t)(m->has_head ? n_logits * m->hp.vocab : n * dim) * 4;
    if (n > GRAPH_ROWS) { /* prefill: straight from and to the caller's memory */
        ps_status s = enqueue_chunk(g, x, n, n_logits, (4 * (size_t)B + nt) * 4, out, io, err, errlen);
        if (s) return s;
        CK(cudaStreamSynchronize(g->st));
        return PS_OK;
    }
    /* decode and small batches: one CUDA graph per (io, rows, logits), through pinned buffers
     * (device memory is copied in and out around the graph: a ring's slot changes) */
    cudaGraphExec_t *ge = &g->graphs[io][n][n_logits];
    if (!*ge) {
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeThreadLocal));
        size_t meta = (4 * (size_t)B + (size_t)n * g->seq_blocks) * 4;
        ps_status s = enqueue_chunk(g, io & PS_CUDA_X_DEV ? g->x : g->hx, n, n_logits, meta,
                                    io & PS_CUDA_OUT_DEV ? NULL : g->hout, io, err, errlen);
        cudaError_t e = cudaStreamEndCapture(g->st, &graph);
        if (s) return s;
        CK(e);
        e = cudaGraphInstantiate(ge, graph, 0);
        cudaGraphDestroy(graph);
        CK(e);
    }
    if (io & PS_CUDA_X_DEV)
        CK(cudaMemcpyAsync(g->x, x, (size_t)n * dim * 4, cudaMemcpyDeviceToDevice, g->st));
    else
        memcpy(g->hx, x, (size_t)n * dim * 4);
    CK(cudaGraphLaunch(*ge, g->st));
    if (io & PS_CUDA_OUT_DEV) CK(cudaMemcpyAsync(out, g->x, out_bytes, cudaMemcpyDefault, g->st));
    CK(cudaStreamSynchronize(g->st));
    if (!(io & PS_CUDA_OUT_DEV)) memcpy(out, g->hout, out_bytes);
    return PS_OK;
}

static ps_status kv_copy(ps_cuda *g, int li, int32_t b, float *k, float *v, bool to_host, char *err, size_t errlen) {
    size_t n = (size_t)PS_KV_BLOCK * g->kv_dim, at = ((size_t)li * g->n_blocks + (size_t)b) * n;
    CK(cudaSetDevice(g->dev));
    cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    /* on g->st, after its kernels and before the next (cudaMemcpy would be ordered with neither) */
    CK(cudaMemcpyAsync(to_host ? (void *)k : (void *)(g->kc + at), to_host ? (void *)(g->kc + at) : (void *)k, n * 4,
                       kind, g->st));
    CK(cudaMemcpyAsync(to_host ? (void *)v : (void *)(g->vc + at), to_host ? (void *)(g->vc + at) : (void *)v, n * 4,
                       kind, g->st));
    CK(cudaStreamSynchronize(g->st));
    return PS_OK;
}

ps_status ps_cuda_kv_read(ps_cuda *g, int li, int32_t b, float *k, float *v) {
    char err[16];
    return kv_copy(g, li, b, k, v, true, err, sizeof err);
}

ps_status ps_cuda_kv_write(ps_cuda *g, int li, int32_t b, const float *k, const float *v) {
    char err[16];
    return kv_copy(g, li, b, (float *)k, (float *)v, false, err, sizeof err);
}

/* ---------------------------------------------------------------------------------------
 * Device hops (cuda.h) */

/* A ring's memory: the counter (u64), the receiver's first non-finite value (u64), then the
 * slots from byte RING_HEAD. */
#define RING_HEAD 256

struct ps_cuda_ring {
    ps_cuda *g;
    int dev;
    uint8_t *base;
    bool opened; /* another process's (cudaIpcOpenMemHandle), else ours (cudaMalloc) */
    int n_slots;
    size_t slot_bytes;
    uint64_t seen;  /* the sender: the counter as last read */
    uint64_t *hbad; /* the receiver: pinned copy of the first non-finite value's word */
};

ps_status ps_cuda_ring_create(ps_cuda *g, int n_slots, size_t slot_bytes, uint8_t handle[PS_CUDA_IPC_BYTES],
                              ps_cuda_ring **out, char *err, size_t errlen) {
    static_assert(sizeof(cudaIpcMemHandle_t) == PS_CUDA_IPC_BYTES, "an IPC handle is 64 bytes");
    *out = NULL;
    if (n_slots < 1 || slot_bytes < 1 || slot_bytes % 256 || (uint64_t)n_slots * slot_bytes > ((uint64_t)1 << 40))
        return ps_errf(err, errlen, PS_ERR_ARG, "a ring of %d slots of %zu bytes", n_slots, slot_bytes);
    CK(cudaSetDevice(g->dev));
    ps_cuda_ring *r = (ps_cuda_ring *)calloc(1, sizeof *r);
    if (!r) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    *r = (ps_cuda_ring){g, g->dev, NULL, false, n_slots, slot_bytes, 0, NULL};
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaMalloc((void **)&r->base, RING_HEAD + (size_t)n_slots * slot_bytes);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&r->hbad, sizeof *r->hbad);
    if (e == cudaSuccess) e = cudaMemsetAsync(r->base, 0, RING_HEAD, g->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, r->base);
    if (e != cudaSuccess) {
        ps_cuda_ring_free(r);
        return ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s (a ring of %d slots of %.1f MiB for the stage's input)",
                       cudaGetErrorString(e), n_slots, slot_bytes / 1048576.0);
    }
    memcpy(handle, &h, sizeof h);
    *out = r;
    return PS_OK;
}

/* The size of the allocation that holds p (the driver's cuMemGetAddressRange, reached through
 * the runtime), or 0 when it cannot be had. */
static size_t allocation_bytes(const void *p) {
    typedef int (*range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    unsigned long long base;
    size_t size = 0;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn || ((range_fn)fn)(&base, &size, (unsigned long long)p) != 0)
        return 0;
    return size;
}

ps_status ps_cuda_ring_open(ps_cuda *g, const uint8_t handle[PS_CUDA_IPC_BYTES], int n_slots, size_t slot_bytes,
                            ps_cuda_ring **out, char *err, size_t errlen) {
    *out = NULL;
    if (n_slots < 1 || slot_bytes < 1 || slot_bytes % 256)
        return ps_errf(err, errlen, PS_ERR_ARG, "a ring of %d slots of %zu bytes", n_slots, slot_bytes);
    CK(cudaSetDevice(g->dev));
    ps_cuda_ring *r = (ps_cuda_ring *)calloc(1, sizeof *r);
    if (!r) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    *r = (ps_cuda_ring){g, g->dev, NULL, true, n_slots, slot_bytes, 0, NULL};
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    cudaError_t e = cudaIpcOpenMemHandle((void **)&r->base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(r);
        return ps_errf(err, errlen, PS_ERR_IO, "CUDA: %s (opening the next stage's ring)", cudaGetErrorString(e));
    }
    /* a ring smaller than its offer would have our copies write past it */
    size_t need = RING_HEAD + (size_t)n_slots * slot_bytes, have = allocation_bytes(r->base);
    if (have < need) {
        ps_cuda_ring_free(r);
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "the next stage's ring holds %zu bytes, not the %zu it offered",
                       have, need);
    }
    *out = r;
    return PS_OK;
}

void ps_cuda_ring_free(ps_cuda_ring *r) {
    if (!r) return;
    cudaSetDevice(r->dev);
    if (r->base && r->opened) cudaIpcCloseMemHandle(r->base);
    if (r->base && !r->opened) cudaFree(r->base);
    if (r->hbad) cudaFreeHost(r->hbad);
    free(r);
}

float *ps_cuda_ring_slot(ps_cuda_ring *r, uint64_t i) {
    return (float *)(r->base + RING_HEAD + (size_t)(i % (uint64_t)r->n_slots) * r->slot_bytes);
}

ps_status ps_cuda_ring_check(ps_cuda_ring *r, uint64_t i, size_t count, char *err, size_t errlen) {
    if (count > r->slot_bytes / 4 || count >= ((size_t)1 << 32))
        return ps_errf(err, errlen, PS_ERR_ARG, "%zu activations in a slot of %zu bytes", count, r->slot_bytes);
    CK(cudaSetDevice(r->dev));
    unsigned long long *bad = (unsigned long long *)(r->base + 8);
    CK(cudaMemsetAsync(bad, 0xff, sizeof *bad, r->g->st));
    k_nonfinite<<<std::min(blocks_for(count, 256), 1024u), 256, 0, r->g->st>>>(ps_cuda_ring_slot(r, i), (unsigned)count,
                                                                               bad);
    CK(cudaMemcpyAsync(r->hbad, bad, sizeof *bad, cudaMemcpyDeviceToHost, r->g->st));
    return PS_OK;
}

bool ps_cuda_ring_bad(const ps_cuda_ring *r, size_t *index, float *value) {
    uint64_t w = *(volatile uint64_t *)r->hbad;
    if (w == ~(uint64_t)0) return false;
    uint32_t bits = (uint32_t)w;
    *index = (size_t)(w >> 32);
    memcpy(value, &bits, sizeof bits);
    return true;
}

ps_status ps_cuda_ring_taken(ps_cuda_ring *r, uint64_t taken, char *err, size_t errlen) {
    CK(cudaSetDevice(r->dev));
    k_ring_set<<<1, 1, 0, r->g->st>>>((unsigned long long *)r->base, taken);
    CK(cudaGetLastError());
    return PS_OK;
}

ps_status ps_cuda_ring_wait(ps_cuda_ring *r, uint64_t i, int timeout_ms, char *err, size_t errlen) {
    if (i < (uint64_t)r->n_slots) return PS_OK;
    uint64_t need = i - (uint64_t)r->n_slots + 1;
    CK(cudaSetDevice(r->dev));
    double t0 = ps_now();
    while (r->seen < need) {
        unsigned long long v;
        CK(cudaMemcpy(&v, r->base, sizeof v, cudaMemcpyDeviceToHost));
        r->seen = v;
        if (r->seen >= need) break;
        if ((ps_now() - t0) * 1e3 > timeout_ms)
            return ps_errf(err, errlen, PS_ERR_TIMEOUT,
                           "the next stage has not read micro-batch %llu out of its ring in %d ms (it has read %llu)",
                           (unsigned long long)need - 1, timeout_ms, (unsigned long long)r->seen);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return PS_OK;
}
