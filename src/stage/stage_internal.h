/* stage_internal.h - the stage executor's state, shared by stage.c and kv_file.c. */
#ifndef PS_STAGE_INTERNAL_H
#define PS_STAGE_INTERNAL_H

#include "stage.h"

struct ps_stage {
    ps_model *m;
    ps_pool *pool;
    ps_ctx *ctx;
    ps_ctx_params cp;  /* of ctx */
    int device;        /* ps_stage_opts.device: every context's */
    int max_mb;        /* rows a micro-batch may carry */
    int max_segs;      /* segments a micro-batch may carry */
    int max_draft;     /* draft tokens a segment may carry */
    float *x_out;      /* (max_mb, dim) activations for the next stage */
    float *logits;     /* (ps_mb_max_results, vocab) last stage: the logits of the sampled rows */
    const float *last; /* the latest sampled segment's row of logits */
    uint8_t *filled;   /* (n_blocks) positions of each block written in this session (0..PS_KV_BLOCK) */
    int32_t *tok;      /* (n_blocks, PS_KV_BLOCK) last stage: the token at each position, for the penalties */
    int32_t *history;  /* (n_smp, n_ctx) last stage: a sequence's tokens gathered from tok, a sampler's each */
    ps_sampler **smp;  /* (n_smp) last stage: the pool's threads sample segments side by side */
    int n_smp;
    struct seg_sample *ss; /* (max_segs) last stage: each segment's sampling, apart */
    char path[4096];       /* the model or shard file */
    char model_fp[33];     /* ps_fingerprint_file of a whole model, once computed (kv_file.c) */
};

#endif
