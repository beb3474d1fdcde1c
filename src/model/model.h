/* model.h - architectures (hyper-parameters, weight binding) and the forward pass of a
 * range of layers.
 *
 * A ps_model binds the tensors of one GGUF file (mapped, never copied, but for small
 * vectors such as norms and biases, which are converted to f32 once). A ps_ctx is the
 * run state of one sequence: its KV cache and every buffer the forward pass uses,
 * allocated once at creation; the forward pass allocates nothing. */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../gguf/gguf.h"
#include "../ps.h"
#include "../tensor/matmul.h"
#include "shard.h"

typedef enum { PS_ARCH_LLAMA, PS_ARCH_QWEN2, PS_ARCH_QWEN3 } ps_arch;

typedef struct {
    ps_arch arch;
    char arch_name[32]; /* "llama", "qwen2", "qwen3" */
    int n_layer;        /* transformer blocks in the whole model */
    int dim;            /* embedding width */
    int n_head;         /* query heads */
    int n_head_kv;      /* key/value heads (grouped-query attention when < n_head) */
    int head_dim;       /* per head (key_length; dim / n_head unless the file says) */
    int ffn_dim;        /* feed-forward hidden width */
    int vocab;          /* rows of the embedding and of the output head */
    int ctx_train;      /* context length the model was trained for */
    float rms_eps;      /* RMSNorm epsilon */
    float rope_base;    /* RoPE theta */
    int rope_dim;       /* rotated dimensions per head (<= head_dim) */
    bool rope_neox;     /* pairs (i, i + rope_dim/2) instead of (2i, 2i+1) */
    float rope_scale;   /* linear position scaling (1 = none) */
} ps_hparams;

typedef struct {
    const float *attn_norm; /* (dim) */
    ps_mat wq;              /* (n_head * head_dim, dim) */
    ps_mat wk;              /* (n_head_kv * head_dim, dim) */
    ps_mat wv;              /* (n_head_kv * head_dim, dim) */
    const float *bq;        /* (n_head * head_dim) qwen2 bias, else NULL */
    const float *bk;        /* (n_head_kv * head_dim) qwen2 bias, else NULL */
    const float *bv;        /* (n_head_kv * head_dim) qwen2 bias, else NULL */
    const float *q_norm;    /* (head_dim) qwen3 per-head RMSNorm, else NULL */
    const float *k_norm;    /* (head_dim) qwen3 per-head RMSNorm, else NULL */
    ps_mat wo;              /* (dim, n_head * head_dim) */
    const float *ffn_norm;  /* (dim) */
    ps_mat w_gate;          /* (ffn_dim, dim) */
    ps_mat w_up;            /* (ffn_dim, dim) */
    ps_mat w_down;          /* (dim, ffn_dim) */
} ps_layer;

typedef struct ps_model {
    ps_gguf *gguf; /* owned: the mapping every ps_mat points into */
    ps_hparams hp;
    int layer_begin;         /* first layer this file holds */
    int layer_end;           /* one past the last */
    bool has_embed;          /* holds token_embd (stage 0) */
    bool has_head;           /* holds output_norm and the output head (last stage) */
    ps_mat tok_embd;         /* (vocab, dim), rows dequantized on lookup */
    const float *out_norm;   /* (dim) */
    ps_mat output;           /* (vocab, dim): output.weight, or tok_embd when tied */
    const float *rope_freqs; /* (rope_dim / 2) Llama 3.1 frequency divisors, else NULL */
    ps_layer *layers;        /* [layer_end - layer_begin] */
    float *owned;            /* one block holding every converted small vector */
    ps_shard_meta shard;     /* pipeshard.* metadata (shard.present = false for a whole model) */
} ps_model;

/* Opens a GGUF model, or one shard of it (a file written by `pipeshard split`: then only
 * its layer range, and the embedding / head it holds), and binds its tensors.
 * Unsupported architectures, missing tensors and wrong shapes are errors naming the
 * thing. how: map the file, or read it into huge pages (ps_gguf_open_with). *out is owned
 * by the caller (ps_model_free). */
ps_status ps_model_load(const char *path, ps_gguf_load how, ps_model **out, char *err, size_t errlen);
void ps_model_free(ps_model *m); /* NULL is a no-op */

/* Bytes of weights one decode step reads: every layer matrix, the output head and one
 * embedding row (the small norm vectors aside). */
double ps_model_decode_weight_bytes(const ps_model *m);

/* This host's decode speed on the CPU: milliseconds per GB of weights one token reads, timed
 * for about a second on `threads` threads of its own: decode steps of m (a whole model or a
 * shard: every layer, attention, norms and head), or, m NULL, one-row products of two
 * synthetic Q4_0 matrices of a 1B model's feed-forward shape (2048 x 8192). 0 with err on
 * failure. (speed.c) */
double ps_decode_ms_per_gb(const ps_model *m, int threads, char *err, size_t errlen);
/* About the memory that measure takes beside the model (its context and buffers). */
size_t ps_decode_ms_per_gb_bytes(const ps_model *m, int threads);
/* Bytes of keys and values (f32) a decode step reads, averaged over n_gen steps after an
 * n_prompt-token prompt: step i attends to n_prompt + i + 1 positions. */
double ps_model_decode_kv_bytes(const ps_model *m, long long n_prompt, long long n_gen);

/* Run state of a stage: the KV cache of its sequences, in a pool of blocks of
 * PS_KV_BLOCK positions (DESIGN.md, "KV cache"), and the buffers of the forward pass. A
 * sequence's keys and values live in the blocks its block table names: entry i holds
 * positions [i * PS_KV_BLOCK, (i + 1) * PS_KV_BLOCK). Who owns which block is decided
 * above (the coordinator); the context only reads and writes where it is told. */
typedef struct ps_ctx ps_ctx;

/* Positions per KV block (a multiple of 16: attention reads 16 positions at a time). */
#define PS_KV_BLOCK 32

/* Attention's weighted sum of values goes in chunks of PS_ATT_CHUNK positions (a multiple
 * of PS_KV_BLOCK): each chunk's sum over its positions in order, from zero, then the
 * chunks' sums in order. Every backend keeps this order, so that a GPU's decode step can
 * sum a long context's chunks side by side and still give the bits of any other chunking
 * of the rows. */
#define PS_ATT_CHUNK 128

/* How activations meet the weights in every matmul. Both are batch-invariant; they give
 * different (each reproducible) numbers, so every stage of a fleet must use the same one. */
typedef enum {
    PS_ACT_Q8 = 0,  /* activations quantized per token to 8-bit blocks, integer dot products
                       (llama.cpp's numerics; fastest) */
    PS_ACT_F32 = 1, /* float32 activations against dequantized weights, fused multiply-adds in
                       one canonical order (closest to a float reference; slower prefill) */
} ps_act;

/* Where a context runs: the CPU (0, the default) or CUDA device i (src/cuda/cuda.h; the
 * same bits as the CPU's, with q8 activations). */
#define PS_DEVICE_CPU     0
#define PS_DEVICE_CUDA(i) ((i) + 1)

typedef struct {
    int n_ctx;     /* positions one sequence may hold */
    int n_blocks;  /* KV blocks in the pool; 0 = enough for one sequence of n_ctx positions */
    int max_batch; /* tokens per forward chunk (longer inputs are chunked, same results) */
    ps_act act;    /* matmul arithmetic */
    int device;    /* PS_DEVICE_CPU or PS_DEVICE_CUDA(i) */
} ps_ctx_params;

/* Parses --device "cpu", "cuda" (device 0) or "cuda:N" into *out; err says what is expected. */
ps_status ps_device_parse(const char *s, int *out, char *err, size_t errlen);
/* "cpu" or "cuda:N" into buf (n >= 16 bytes); returns buf. */
const char *ps_device_name(int device, char *buf, size_t n);

/* Parses "q8" / "f32" (the --activations flag). */
ps_status ps_act_from_name(const char *name, ps_act *out);
const char *ps_act_name(ps_act a);

/* A context with the given parameters; the pool (not owned) runs the matmuls and attention. */
ps_status ps_ctx_create(const ps_model *m, const ps_ctx_params *p, ps_pool *pool, ps_ctx **out, char *err,
                        size_t errlen);
void ps_ctx_free(ps_ctx *c); /* NULL is a no-op */

/* Bytes of host memory a context with these parameters allocates (its KV cache and buffers;
 * on a GPU, the few host buffers: the rest is the device's), for threads threads. */
size_t ps_ctx_bytes(const ps_model *m, const ps_ctx_params *p, int threads);

/* Attention's vector width, 8 or 16 lanes (0: chosen by the CPU, the default). Both give
 * the same bits; for tests and benchmarks. */
void ps_forward_set_attn_lanes(int lanes);
int ps_ctx_n_ctx(const ps_ctx *c);
int ps_ctx_n_blocks(const ps_ctx *c);
/* Copies the keys (k) and values (v) of block b of local layer li out of the cache, or into
 * it: ps_ctx_kv_block_floats floats each (n_head_kv × PS_KV_BLOCK × head_dim). For saving
 * and restoring prefixes (stage/kv_file.c); b must lie in the pool. */
size_t ps_ctx_kv_block_floats(const ps_ctx *c);
ps_status ps_ctx_kv_read(ps_ctx *c, int li, int32_t b, float *k, float *v);
/* The GPU a context runs on (cuda.h), or NULL on the CPU. */
struct ps_cuda *ps_ctx_cuda(ps_ctx *c);
ps_status ps_ctx_kv_write(ps_ctx *c, int li, int32_t b, const float *k, const float *v);

/* One sequence's rows in a forward pass over several sequences: positions [pos, pos + n)
 * of the sequence whose block table is blocks[0..n_blocks) (covering at least pos + n
 * positions). Each row attends to its own sequence's positions up to its own. */
typedef struct {
    int32_t pos, n;        /* first position, rows (>= 1) */
    const int32_t *blocks; /* the sequence's block table */
    int32_t n_blocks;
    int32_t n_logits; /* with the head: logits of the segment's last n_logits rows (0..n) */
} ps_seg;

/* The forward pass of one stage over several sequences at once: the rows of segs[0], then
 * segs[1], ... (tokens or x_in hold them in that order) run through the stage's layers
 * together: every weight is read once per chunk of max_batch rows, and each row gives the
 * bits it gives alone (the kernels are batch-invariant: DESIGN.md invariant 1). Each row's
 * key and value are written at its position in its sequence's blocks (writing at pos
 * discards nothing else: what a sequence holds beyond is for the block owner to forget).
 * Out: with the head, the logits of each segment's last n_logits rows, in segment order
 * (rows × vocab); else the activations of every row (rows × dim). Two segments must not
 * write the same block. PS_ERR_RANGE past n_ctx, PS_ERR_ARG for a block outside the pool,
 * a table too short or a token id out of range. */
ps_status ps_forward_segs(ps_ctx *c, const ps_seg *segs, int n_segs, const int32_t *tokens, const float *x_in,
                          float *out, char *err, size_t errlen);
/* The same with x_in or out in the GPU's memory (io: PS_CUDA_X_DEV, PS_CUDA_OUT_DEV of
 * cuda.h; a device hop's ring) on a context that runs on a GPU. */
ps_status ps_forward_segs_io(ps_ctx *c, const ps_seg *segs, int n_segs, const int32_t *tokens, const float *x_in,
                             float *out, unsigned io, char *err, size_t errlen);

/* Runs tokens[0..n) at positions pos..pos+n-1 through the whole model, overwriting the KV
 * cache from pos on (so rewinding is writing at an earlier pos), and writes the logits of
 * the last n_logits tokens (n_logits <= n, may be 0) to logits (n_logits × vocab).
 * n may exceed max_batch: the tokens are processed in chunks, with identical results.
 * PS_ERR_RANGE when pos + n > n_ctx, PS_ERR_ARG for token ids out of range. */
ps_status ps_forward(ps_ctx *c, const int32_t *tokens, int n, int pos, float *logits, int n_logits, char *err,
                     size_t errlen);

/* The forward pass of one stage: runs n positions from pos through the model's layers.
 * In: tokens when the model holds the embedding (stage 0), else x_in (n × dim), the
 * activations the previous stage produced. Out: when the model holds the head, the
 * logits of the last n_logits tokens (n_logits × vocab); else the activations
 * (n × dim, n_logits ignored) for the next stage. Same results as ps_forward however the
 * layers are split: activations pass as exact f32. */
ps_status ps_forward_stage(ps_ctx *c, const int32_t *tokens, const float *x_in, int n, int pos, float *out,
                           int n_logits, char *err, size_t errlen);
/* ps_forward and ps_forward_stage run one sequence whose block table is 0, 1, 2, ... */

#endif
