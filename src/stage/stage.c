/* stage.c - the stage executor and the micro-batch message. */
#include "stage_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/cuda.h"

// ---------------------------------------------------------------------------------------
// Micro-batch encoding

/* Bytes of the fixed fields of a FORWARD payload (a multiple of 4, so that the tokens
 * and activations after them stay 4-byte aligned in a malloc'd receive buffer). */
#define MB_FIXED_BYTES 72

void ps_stage_stat_encode(ps_wbuf *b, const ps_stage_stat *st) {
    uint64_t bits;
    ps_wbuf_i32(b, st->stage);
    ps_wbuf_u32(b, 0);
    memcpy(&bits, &st->compute_ms, 8);
    ps_wbuf_u64(b, bits);
    ps_wbuf_u64(b, st->hop.frames);
    ps_wbuf_u64(b, st->hop.bytes);
    memcpy(&bits, &st->hop.send_ms, 8);
    ps_wbuf_u64(b, bits);
}

void ps_stage_stat_decode(ps_rbuf *r, ps_stage_stat *st) {
    uint64_t bits;
    st->stage = ps_rbuf_i32(r);
    ps_rbuf_u32(r);
    bits = ps_rbuf_u64(r);
    memcpy(&st->compute_ms, &bits, 8);
    st->hop.frames = ps_rbuf_u64(r);
    st->hop.bytes = ps_rbuf_u64(r);
    bits = ps_rbuf_u64(r);
    memcpy(&st->hop.send_ms, &bits, 8);
}

/* Bytes of the header and of a segment's fixed fields (multiples of 4, so that the tables,
 * tokens and activations after them stay 4-byte aligned in a malloc'd receive buffer). */
#define MB_HDR_BYTES 24
#define MB_SEG_BYTES 72
#define MB_X_RING    1u /* header flags: the activations are in the next stage's ring, not here */
_Static_assert(sizeof(ps_draft_dist) == 132, "a draft distribution travels as it lies in memory");

static void sp_encode(ps_wbuf *b, const ps_sample_params *sp) {
    ps_wbuf_f32(b, sp->temperature);
    ps_wbuf_i32(b, sp->top_k);
    ps_wbuf_f32(b, sp->top_p);
    ps_wbuf_f32(b, sp->min_p);
    ps_wbuf_f32(b, sp->repetition_penalty);
    ps_wbuf_i32(b, sp->penalty_last_n);
    ps_wbuf_f32(b, sp->presence_penalty);
    ps_wbuf_f32(b, sp->frequency_penalty);
    ps_wbuf_u64(b, sp->seed);
}

static void sp_decode(ps_rbuf *r, ps_sample_params *sp) {
    sp->temperature = ps_rbuf_f32(r);
    sp->top_k = ps_rbuf_i32(r);
    sp->top_p = ps_rbuf_f32(r);
    sp->min_p = ps_rbuf_f32(r);
    sp->repetition_penalty = ps_rbuf_f32(r);
    sp->penalty_last_n = ps_rbuf_i32(r);
    sp->presence_penalty = ps_rbuf_f32(r);
    sp->frequency_penalty = ps_rbuf_f32(r);
    sp->seed = ps_rbuf_u64(r);
}

void ps_mb_encode(ps_wbuf *b, const ps_mb *mb, int dim, struct iovec iov[2]) {
    b->len = 0;
    ps_wbuf_u32(b, mb->mb);
    ps_wbuf_i32(b, mb->n_segs);
    ps_wbuf_i32(b, mb->n);
    ps_wbuf_u32(b, mb->x ? (uint32_t)dim : 0);
    ps_wbuf_i32(b, mb->n_stats);
    ps_wbuf_u32(b, mb->x_ring ? MB_X_RING : 0);
    for (int i = 0; i < mb->n_segs; i++) {
        const ps_mb_seg *g = &mb->segs[i];
        ps_wbuf_u64(b, g->seq);
        ps_wbuf_i32(b, g->pos);
        ps_wbuf_i32(b, g->n);
        ps_wbuf_u32(b, g->flags);
        ps_wbuf_u32(b, g->n_top);
        sp_encode(b, &g->sp);
        ps_wbuf_i32(b, g->n_blocks);
        ps_wbuf_u32(b, g->n_draft);
        ps_wbuf_bytes(b, g->blocks, (size_t)g->n_blocks * sizeof(int32_t));
        if (g->flags & PS_MB_DRAFT_DIST) ps_wbuf_bytes(b, g->dist, (size_t)g->n_draft * sizeof *g->dist);
    }
    ps_wbuf_bytes(b, mb->tokens, (size_t)mb->n * sizeof(int32_t));
    for (int i = 0; i < mb->n_stats; i++) ps_stage_stat_encode(b, &mb->stats[i]);
    size_t xbytes = mb->x && !mb->x_ring ? (size_t)mb->n * dim * sizeof(float) : 0;
    if (iov) {
        iov[0] = (struct iovec){b->p, b->len};
        iov[1] = (struct iovec){(void *)mb->x, xbytes};
    } else if (xbytes) {
        ps_wbuf_bytes(b, mb->x, xbytes);
    }
}

int ps_mb_max_results(int max_mb, int max_segs, int max_draft) {
    long long n = (long long)max_segs * (1 + max_draft); /* and no more than rows */
    return n < max_mb ? (int)n : max_mb;
}

uint32_t ps_mb_max_bytes(int dim, int max_mb, int max_segs, int max_draft, int n_ctx) {
    uint64_t tables = (uint64_t)max_segs * (MB_SEG_BYTES + 4 * (uint64_t)((n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK) +
                                            (uint64_t)max_draft * sizeof(ps_draft_dist));
    uint64_t results =
        (uint64_t)ps_mb_max_results(max_mb, max_segs, max_draft) * (24 + 8 * PS_MAX_TOP_LOGPROBS); /* a TOKENS answer */
    uint64_t b = 4096 + (uint64_t)max_mb * (4 + 4 * (uint64_t)dim) + (tables > results ? tables : results);
    return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b; /* 4096 > header + 64 stats */
}

/* Parses one segment's fixed fields and table; false with the problem in err. */
static bool seg_decode(ps_rbuf *r, int i, ps_mb_seg *g, char *err, size_t errlen) {
    g->seq = ps_rbuf_u64(r);
    g->pos = ps_rbuf_i32(r);
    g->n = ps_rbuf_i32(r);
    g->flags = ps_rbuf_u32(r);
    g->n_top = ps_rbuf_u32(r);
    sp_decode(r, &g->sp);
    g->n_blocks = ps_rbuf_i32(r);
    g->n_draft = ps_rbuf_u32(r);
    if (r->bad) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch segment %d truncated", i), false;
    if (g->n < 1 || g->pos < 0 || g->n_blocks < 0 || g->n_blocks > (1 << 24))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch segment %d: %d positions at %d, %d blocks", i, g->n,
                       g->pos, g->n_blocks),
               false;
    if (g->flags & ~(uint32_t)(PS_MB_SAMPLE | PS_MB_LOGPROBS | PS_MB_DRAFT_DIST))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch segment %d has unknown flags 0x%x", i, g->flags),
               false;
    if (g->n_top > PS_MAX_TOP_LOGPROBS)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "micro-batch segment %d asks for %u top log-probabilities (at most %d)", i, g->n_top,
                       PS_MAX_TOP_LOGPROBS),
               false;
    if (g->n_draft && (g->n_draft > PS_MAX_DRAFT || (int64_t)g->n_draft >= g->n || !(g->flags & PS_MB_SAMPLE)))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "micro-batch segment %d: %u draft tokens in %d positions (fewer than its positions, at most "
                       "%d, and only in a segment that samples)",
                       i, g->n_draft, g->n, PS_MAX_DRAFT),
               false;
    if ((g->flags & PS_MB_DRAFT_DIST) && !g->n_draft)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch segment %d: draft distributions without guesses", i),
               false;
    g->blocks = ps_rbuf_bytes(r, (size_t)g->n_blocks * sizeof(int32_t));
    g->dist = g->flags & PS_MB_DRAFT_DIST ? ps_rbuf_bytes(r, (size_t)g->n_draft * sizeof *g->dist) : NULL;
    if (r->bad) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch segment %d truncated", i), false;
    return true;
}

ps_status ps_mb_decode(const uint8_t *p, size_t len, int dim, int max_n, int max_segs, ps_mb *out, char *err,
                       size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    out->mb = ps_rbuf_u32(&r);
    out->n_segs = ps_rbuf_i32(&r);
    out->n = ps_rbuf_i32(&r);
    uint32_t xdim = ps_rbuf_u32(&r);
    out->n_stats = ps_rbuf_i32(&r);
    uint32_t flags = ps_rbuf_u32(&r);
    if (r.bad) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch header truncated");
    if (flags & ~(uint32_t)MB_X_RING)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch header has unknown flags 0x%x", flags);
    out->x_ring = flags & MB_X_RING;
    if (out->x_ring && xdim != (uint32_t)dim)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch in the ring with activations %u wide", xdim);
    if (out->n < 1 || out->n > max_n)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d positions (this stage takes 1..%d)", out->n,
                       max_n);
    if (out->n_segs < 1 || out->n_segs > max_segs)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d sequences (this stage takes 1..%d)",
                       out->n_segs, max_segs);
    if (out->n_stats < 0 || out->n_stats >= (int32_t)PS_ARRAY_LEN(out->stats))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch carries %d stage stats", out->n_stats);
    if (xdim && xdim != (uint32_t)dim)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch activations are %u wide, this model's are %d", xdim,
                       dim);
    long long rows = 0;
    for (int i = 0; i < out->n_segs; i++) {
        if (!seg_decode(&r, i, &out->segs[i], err, errlen)) return PS_ERR_PROTOCOL;
        rows += out->segs[i].n;
    }
    if (rows != out->n)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d positions has segments of %lld", out->n, rows);
    out->tokens = ps_rbuf_bytes(&r, (size_t)out->n * sizeof(int32_t));
    for (int i = 0; i < out->n_stats; i++) ps_stage_stat_decode(&r, &out->stats[i]);
    bool x_here = xdim && !out->x_ring;
    size_t want = r.off + (x_here ? (size_t)out->n * dim * 4 : 0);
    out->x = x_here ? ps_rbuf_bytes(&r, (size_t)out->n * dim * sizeof(float)) : NULL;
    if (r.bad || r.off != len)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d positions has %zu bytes, expected %zu", out->n,
                       len, r.bad ? want : r.off);
    return PS_OK;
}

void ps_result_encode(ps_wbuf *b, uint32_t mb, const ps_result *res, int n_res, const ps_stage_stat *stats,
                      int n_stats) {
    b->len = 0;
    ps_wbuf_u32(b, mb);
    ps_wbuf_i32(b, n_res);
    ps_wbuf_i32(b, n_stats);
    for (int i = 0; i < n_res; i++) {
        const ps_result *x = &res[i];
        ps_wbuf_u64(b, x->seq);
        ps_wbuf_i32(b, x->pos);
        ps_wbuf_i32(b, x->token);
        ps_wbuf_f32(b, x->logprob);
        ps_wbuf_u32(b, x->n_top);
        for (uint32_t k = 0; k < x->n_top; k++) ps_wbuf_i32(b, x->top_id[k]), ps_wbuf_f32(b, x->top_logprob[k]);
    }
    for (int i = 0; i < n_stats; i++) ps_stage_stat_encode(b, &stats[i]);
}

ps_status ps_result_decode(const uint8_t *p, size_t len, int vocab, uint32_t *mb, ps_result *res, int max_res,
                           int *n_res, ps_stage_stat *stats, int *n_stats, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    *mb = ps_rbuf_u32(&r);
    int32_t nr = ps_rbuf_i32(&r), ns = ps_rbuf_i32(&r);
    if (r.bad || nr < 0 || nr > max_res || ns < 0 || ns > PS_SHARD_MAX_STAGES)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed TOKENS message (%d results, %d stats)", nr, ns);
    for (int i = 0; i < nr; i++) {
        ps_result *x = &res[i];
        x->seq = ps_rbuf_u64(&r);
        x->pos = ps_rbuf_i32(&r);
        x->token = ps_rbuf_i32(&r);
        x->logprob = ps_rbuf_f32(&r);
        x->n_top = ps_rbuf_u32(&r);
        if (r.bad || x->n_top > PS_MAX_TOP_LOGPROBS || x->token < 0 || x->token >= vocab)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed TOKENS message (result %d)", i);
        for (uint32_t k = 0; k < x->n_top; k++) {
            x->top_id[k] = ps_rbuf_i32(&r);
            x->top_logprob[k] = ps_rbuf_f32(&r);
            if (x->top_id[k] < 0 || x->top_id[k] >= vocab) r.bad = true;
        }
    }
    for (int i = 0; i < ns; i++) ps_stage_stat_decode(&r, &stats[i]);
    if (r.bad || r.off != len)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed TOKENS message (%zu bytes)", len);
    *n_res = nr, *n_stats = ns;
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Placing a shard

void ps_place_encode(ps_wbuf *b, const ps_place *pl) {
    b->len = 0;
    ps_wbuf_str(b, pl->model_fp);
    ps_wbuf_str(b, pl->shard_fp);
    ps_wbuf_i32(b, pl->stage);
    ps_wbuf_i32(b, pl->stage_count);
    ps_wbuf_i32(b, pl->layer_begin);
    ps_wbuf_i32(b, pl->layer_end);
    ps_wbuf_i32(b, pl->n_layer);
    ps_wbuf_u64(b, pl->bytes);
}

ps_status ps_place_decode(const uint8_t *p, size_t len, ps_place *out, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    *out = (ps_place){0};
    ps_rbuf_str(&r, out->model_fp, sizeof out->model_fp);
    ps_rbuf_str(&r, out->shard_fp, sizeof out->shard_fp);
    out->stage = ps_rbuf_i32(&r);
    out->stage_count = ps_rbuf_i32(&r);
    out->layer_begin = ps_rbuf_i32(&r);
    out->layer_end = ps_rbuf_i32(&r);
    out->n_layer = ps_rbuf_i32(&r);
    out->bytes = ps_rbuf_u64(&r);
    const ps_place *o = out;
    if (r.bad || r.off != len) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed PLACE message (%zu bytes)", len);
    if (!ps_fingerprint_ok(o->model_fp, strlen(o->model_fp)) || !ps_fingerprint_ok(o->shard_fp, strlen(o->shard_fp)))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "PLACE: a fingerprint is not 32 lowercase hex digits");
    if (o->stage_count < 2 || o->stage_count > PS_SHARD_MAX_STAGES || o->stage < 1 || o->stage >= o->stage_count)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "PLACE of stage %d of %d: a worker serves stage 1 or later of a fleet of 2 to %d stages (stage "
                       "0 runs in the coordinator)",
                       o->stage, o->stage_count, PS_SHARD_MAX_STAGES);
    if (o->n_layer < o->stage_count || o->n_layer > PS_SHARD_MAX_LAYERS || o->layer_begin < 1 ||
        o->layer_begin >= o->layer_end || o->layer_end > o->n_layer ||
        (o->layer_end == o->n_layer) != (o->stage == o->stage_count - 1))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "PLACE of stage %d of %d: layers %d..%d of %d are not its range",
                       o->stage, o->stage_count, o->layer_begin, o->layer_end, o->n_layer);
    if (o->bytes < 1 || o->bytes > PS_SHARD_MAX_BYTES)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "PLACE of a shard of %llu bytes (1 to 2^48)",
                       (unsigned long long)o->bytes);
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Executor

#define STAGE_SAMPLERS 8 /* at most: a sampler holds some 30 bytes a vocabulary token */

/* One segment's sampling (run's): where its tokens and rows of logits are, where its results
 * go (as many places as rows); what came of it. */
struct seg_sample {
    const ps_mb_seg *g;
    const int32_t *tokens;
    const float *logits, *last; /* last: the row sampled last */
    ps_result *res;
    int n; /* results */
    ps_status st;
    char err[256];
};

ps_status ps_stage_open(const char *path, const ps_stage_opts *o, ps_stage **out, char *err, size_t errlen) {
    *out = NULL;
    ps_stage *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    snprintf(s->path, sizeof s->path, "%s", path);
    s->device = o->device;
    ps_status st = ps_model_load(path, o->mmap ? PS_GGUF_MAP : PS_GGUF_HUGE, &s->m, err, errlen);
    if (!st && (st = ps_pool_create(o->threads, &s->pool)))
        ps_errf(err, errlen, st, "cannot start %d threads", o->threads);
    if (!st && o->pin) st = ps_pool_pin(s->pool, err, errlen);
    if (!st && s->m->has_head) { /* a sampler a pool thread, up to STAGE_SAMPLERS */
        int n = ps_pool_size(s->pool) < STAGE_SAMPLERS ? ps_pool_size(s->pool) : STAGE_SAMPLERS;
        if (!(s->smp = ps_calloc((size_t)n, sizeof *s->smp))) st = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        for (; !st && s->n_smp < n; s->n_smp++) st = ps_sampler_create(s->m->hp.vocab, &s->smp[s->n_smp], err, errlen);
    }
    if (st) goto fail;
    *out = s;
    return PS_OK;
fail:
    ps_stage_free(s);
    return st;
}

/* Frees the run state of the current session. */
static void end_session(ps_stage *s) {
    ps_ctx_free(s->ctx);
    free(s->x_out), free(s->logits), free(s->filled), free(s->tok), free(s->history), free(s->ss);
    s->ctx = NULL, s->x_out = NULL, s->logits = NULL, s->filled = NULL, s->tok = NULL, s->history = NULL, s->ss = NULL;
    s->last = NULL;
}

void ps_stage_free(ps_stage *s) {
    if (!s) return;
    end_session(s);
    for (int i = 0; i < s->n_smp; i++) ps_sampler_free(s->smp[i]);
    free(s->smp);
    ps_pool_free(s->pool);
    ps_model_free(s->m);
    free(s);
}

const ps_model *ps_stage_model(const ps_stage *s) { return s->m; }
ps_pool *ps_stage_pool(ps_stage *s) { return s->pool; }
int ps_stage_n_ctx(const ps_stage *s) { return s->ctx ? s->cp.n_ctx : 0; }
int ps_stage_max_mb(const ps_stage *s) { return s->max_mb; }
int ps_stage_max_segs(const ps_stage *s) { return s->max_segs; }
int ps_stage_max_draft(const ps_stage *s) { return s->max_draft; }
const float *ps_stage_logits(const ps_stage *s) { return s->last; }
const float *ps_stage_logits_row(const ps_stage *s, int i) { return s->logits + (size_t)i * s->m->hp.vocab; }

ps_status ps_stage_begin(ps_stage *s, const ps_ctx_params *p_in, int max_mb, int max_segs, int max_draft, char *err,
                         size_t errlen) {
    ps_ctx_params pd = *p_in, *p = &pd;
    pd.device = s->device; /* the stage's own choice, not the coordinator's */
    if (max_segs < 1 || max_segs > PS_MB_MAX_SEGS)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d sequences per micro-batch: must be within 1..%d", max_segs,
                       PS_MB_MAX_SEGS);
    if (max_draft < 0 || max_draft > PS_MAX_DRAFT)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d draft tokens per sequence: must be within 0..%d", max_draft,
                       PS_MAX_DRAFT);
    long long most = (long long)p->n_ctx * max_segs < PS_MB_MAX_ROWS ? (long long)p->n_ctx * max_segs : PS_MB_MAX_ROWS;
    if (max_mb < 1 || max_mb > most)
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "micro-batch size %d must be within 1..%lld (%d sequences of %d positions, at most %d)", max_mb,
                       most, max_segs, p->n_ctx, PS_MB_MAX_ROWS);
    bool reuse = s->ctx && !memcmp(&s->cp, p, sizeof *p) && s->max_mb == max_mb && s->max_segs == max_segs &&
                 s->max_draft == max_draft;
    if (!reuse) {
        end_session(s);
        ps_status st = ps_ctx_create(s->m, p, s->pool, &s->ctx, err, errlen);
        if (st) return st;
        s->cp = *p;
        s->max_mb = max_mb, s->max_segs = max_segs, s->max_draft = max_draft;
        const ps_hparams *hp = &s->m->hp;
        int n_blocks = ps_ctx_n_blocks(s->ctx);
        s->filled = ps_malloc((size_t)n_blocks);
        if (s->m->has_head) {
            s->logits = ps_malloc((size_t)ps_mb_max_results(max_mb, max_segs, max_draft) * hp->vocab * sizeof(float));
            s->tok = ps_malloc((size_t)n_blocks * PS_KV_BLOCK * sizeof(int32_t));
            s->history = ps_malloc((size_t)s->n_smp * p->n_ctx * sizeof(int32_t));
            s->ss = ps_malloc((size_t)max_segs * sizeof *s->ss);
        } else {
            s->x_out = ps_malloc((size_t)max_mb * hp->dim * sizeof(float));
        }
        if (!s->filled || (s->m->has_head ? !s->logits || !s->tok || !s->history || !s->ss : !s->x_out)) {
            end_session(s);
            return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for micro-batches of %d positions", max_mb);
        }
    }
    memset(s->filled, 0, (size_t)ps_ctx_n_blocks(s->ctx)); /* nothing of an earlier session is readable */
    return PS_OK;
}

/* Checks that segment g reads only what this session wrote (positions [0, pos) of its
 * blocks) and that its blocks lie in the pool. */
static ps_status check_filled(const ps_stage *s, int i, const ps_mb_seg *g, char *err, size_t errlen) {
    int n_blocks = ps_ctx_n_blocks(s->ctx);
    long long end = (long long)g->pos + g->n;
    int need = end > s->cp.n_ctx ? 0 : (int)((end + PS_KV_BLOCK - 1) / PS_KV_BLOCK);
    if (end > s->cp.n_ctx || g->n_blocks < need)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "segment %d: %d positions at %d do not fit (%d positions per sequence, a table of %d blocks)", i,
                       g->n, g->pos, s->cp.n_ctx, g->n_blocks);
    for (int b = 0; b < need; b++) {
        int32_t blk = g->blocks[b];
        if (blk < 0 || blk >= n_blocks)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "segment %d: KV block %d is outside the pool (0..%d)", i, blk,
                           n_blocks - 1);
        int read = g->pos - b * PS_KV_BLOCK; /* positions of this block the segment reads before writing */
        read = read < 0 ? 0 : read > PS_KV_BLOCK ? PS_KV_BLOCK : read;
        if (s->filled[blk] < read)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                           "segment %d at position %d reads positions %d..%d, never written in this session", i, g->pos,
                           b * PS_KV_BLOCK + s->filled[blk], b * PS_KV_BLOCK + read - 1);
    }
    return PS_OK;
}

/* Marks what segment g wrote: positions [pos, pos + n), and nothing of the sequence beyond
 * them (its later blocks count as unwritten: a draft's rejected guesses are gone); on the
 * last stage keeps its tokens. */
static void mark_written(ps_stage *s, const ps_mb_seg *g, const int32_t *tokens) {
    for (int t = 0; t < g->n; t++) {
        int p = g->pos + t, blk = g->blocks[p / PS_KV_BLOCK];
        s->filled[blk] = (uint8_t)(p % PS_KV_BLOCK + 1);
        if (s->tok) s->tok[(size_t)blk * PS_KV_BLOCK + p % PS_KV_BLOCK] = tokens[t];
    }
    int n_pool = ps_ctx_n_blocks(s->ctx);
    for (int b = (g->pos + g->n - 1) / PS_KV_BLOCK + 1; b < g->n_blocks; b++)
        if (g->blocks[b] >= 0 && g->blocks[b] < n_pool) s->filled[g->blocks[b]] = 0;
}

/* The token at position `at` of segment g's sequence from its row of logits, with the top
 * log-probabilities it asks for: sampled, or, when guess >= 0, the draft's guess kept or
 * replaced (*kept says which) by the rejection rule for its distribution q (NULL: kept when it
 * is the sample). The penalties' history: the sequence's last penalty_last_n tokens before
 * `at` (all of them for -1: the window the sampler reads), gathered from its blocks. */
static ps_status sample_at(const ps_stage *s, ps_sampler *smp, int32_t *history, const ps_mb_seg *g, int at,
                           const float *logits, int32_t guess, const ps_draft_dist *q, ps_result *r, bool *kept,
                           char *err, size_t errlen) {
    int last_n = g->sp.penalty_last_n, from = last_n >= 0 && last_n < at ? at - last_n : 0;
    for (int p = from; p < at; p++)
        history[p - from] = s->tok[(size_t)g->blocks[p / PS_KV_BLOCK] * PS_KV_BLOCK + p % PS_KV_BLOCK];
    bool lp = g->flags & PS_MB_LOGPROBS;
    *r = (ps_result){.seq = g->seq, .pos = at, .n_top = lp ? g->n_top : 0};
    ps_status st =
        q ? ps_sample_verify(smp, &g->sp, logits, history, at - from, (uint64_t)at, q, guess, &r->token, kept)
          : ps_sample(smp, &g->sp, logits, history, at - from, (uint64_t)at, &r->token);
    if (st) return ps_errf(err, errlen, q ? PS_ERR_PROTOCOL : st, "sampling failed: %s", ps_sampler_error(smp));
    if (!q) *kept = guess >= 0 && r->token == guess;
    if (lp) {
        double lse = ps_sample_top_logprobs(logits, s->m->hp.vocab, (int)r->n_top, r->top_id, r->top_logprob);
        r->logprob = (float)((double)logits[r->token] - lse);
    }
    return PS_OK;
}

/* The tokens after segment a->g, whose n_draft + 1 rows of logits begin at a->logits: one per
 * row, in order, while each keeps the draft's guess there (mb_seg.n_draft); into a->res. */
static void sample_seg(const ps_stage *s, ps_sampler *smp, int32_t *history, struct seg_sample *a) {
    const ps_mb_seg *g = a->g;
    int vocab = s->m->hp.vocab, k = (int)g->n_draft, first = g->pos + g->n - k;
    bool kept = true;
    a->n = 0, a->st = PS_OK;
    for (int i = 0; i <= k && kept && !a->st; i++) {
        a->last = a->logits + (size_t)i * vocab;
        int32_t guess = i < k ? a->tokens[g->n - k + i] : -1;
        const ps_draft_dist *q = i < k && g->dist ? g->dist + i : NULL;
        a->st =
            sample_at(s, smp, history, g, first + i, a->last, guess, q, &a->res[a->n++], &kept, a->err, sizeof a->err);
    }
}

/* ps_pool_run's job: the pool's first n_smp threads take the n segments to sample in turn. */
struct sample_job {
    const ps_stage *s;
    struct seg_sample *ss;
    int n, next;
};

static void sample_segs(void *ctx, int ith, int nth) {
    (void)nth;
    struct sample_job *j = ctx;
    if (ith >= j->s->n_smp) return;
    int32_t *history = j->s->history + (size_t)ith * j->s->cp.n_ctx;
    for (int i; (i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n;)
        sample_seg(j->s, j->s->smp[ith], history, &j->ss[i]);
}

/* ps_stage_run, with the activations for the next stage to x_dev (GPU memory) when not NULL. */
static ps_status run(ps_stage *s, const ps_mb *mb, float *x_dev, const float **x_out, ps_result *res, int *n_res,
                     char *err, size_t errlen) {
    *n_res = 0;
    if (!s->ctx) return ps_errf(err, errlen, PS_ERR_INTERNAL, "stage run before its session began");
    if (mb->n < 1 || mb->n > s->max_mb || mb->n_segs < 1 || mb->n_segs > s->max_segs)
        return ps_errf(err, errlen, PS_ERR_RANGE,
                       "micro-batch of %d positions in %d sequences does not fit (at most %d in %d)", mb->n, mb->n_segs,
                       s->max_mb, s->max_segs);
    ps_seg segs[PS_MB_MAX_SEGS];
    const ps_model *m = s->m;
    for (int i = 0; i < mb->n_segs; i++) {
        const ps_mb_seg *g = &mb->segs[i];
        ps_status st = check_filled(s, i, g, err, errlen);
        if (st) return st;
        if ((int)g->n_draft > s->max_draft)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "segment %d carries %u draft tokens; the session allows %d", i,
                           g->n_draft, s->max_draft);
        int n_logits = m->has_head && (g->flags & PS_MB_SAMPLE) ? 1 + (int)g->n_draft : 0;
        segs[i] =
            (ps_seg){.pos = g->pos, .n = g->n, .blocks = g->blocks, .n_blocks = g->n_blocks, .n_logits = n_logits};
    }
    float *out = m->has_head ? s->logits : x_dev ? x_dev : s->x_out;
    unsigned io = (mb->x_ring ? PS_CUDA_X_DEV : 0) | (x_dev ? PS_CUDA_OUT_DEV : 0);
    ps_status st = ps_forward_segs_io(s->ctx, segs, mb->n_segs, mb->tokens, mb->x, out, io, err, errlen);
    if (st) return st;
    const int32_t *tokens = mb->tokens;
    for (int i = 0; i < mb->n_segs; tokens += mb->segs[i].n, i++) mark_written(s, &mb->segs[i], tokens);
    if (!m->has_head) {
        if (x_out) *x_out = s->x_out;
        return PS_OK;
    }
    /* the segments to sample, each with as many places for results as rows of logits; several
     * side by side on the pool's threads (each token depends on its own inputs alone) */
    struct sample_job job = {s, s->ss, 0, 0};
    const float *logits = s->logits;
    ps_result *r = res;
    tokens = mb->tokens;
    for (int i = 0; i < mb->n_segs; tokens += mb->segs[i].n, i++)
        if (segs[i].n_logits) {
            job.ss[job.n++] = (struct seg_sample){.g = &mb->segs[i], .tokens = tokens, .logits = logits, .res = r};
            logits += (size_t)segs[i].n_logits * m->hp.vocab, r += segs[i].n_logits;
        }
    if (job.n > 1 && s->n_smp > 1)
        ps_pool_run(s->pool, sample_segs, &job);
    else
        for (int i = 0; i < job.n; i++) sample_seg(s, s->smp[0], s->history, &job.ss[i]);
    for (int i = 0; i < job.n; i++) { /* in order: the first failure's error; the results packed */
        struct seg_sample *a = &job.ss[i];
        if (a->st) return ps_errf(err, errlen, a->st, "%s", a->err);
        memmove(res + *n_res, a->res, (size_t)a->n * sizeof *res);
        *n_res += a->n, s->last = a->last;
    }
    return PS_OK;
}

ps_status ps_stage_run(ps_stage *s, const ps_mb *mb, const float **x_out, ps_result *res, int *n_res, char *err,
                       size_t errlen) {
    return run(s, mb, NULL, x_out, res, n_res, err, errlen);
}

ps_status ps_stage_run_into(ps_stage *s, const ps_mb *mb, float *x_dev, char *err, size_t errlen) {
    int n_res;
    if (s->m->has_head || !x_dev)
        return ps_errf(err, errlen, PS_ERR_INTERNAL, "activations into GPU memory from a stage with the head");
    return run(s, mb, x_dev, NULL, NULL, &n_res, err, errlen);
}

struct ps_cuda *ps_stage_cuda(ps_stage *s) {
    return s->ctx ? ps_ctx_cuda(s->ctx) : NULL;
}

// ---------------------------------------------------------------------------------------
// Prefixes on disk

void ps_kv_msg_encode(ps_wbuf *b, const ps_kv_msg *m) {
    b->len = 0;
    ps_wbuf_u64(b, m->id);
    ps_wbuf_i32(b, m->n);
    ps_wbuf_bytes(b, m->blocks, (size_t)m->n * sizeof(int32_t));
    ps_wbuf_bytes(b, m->tokens, (size_t)m->n * PS_KV_BLOCK * sizeof(int32_t));
}

ps_status ps_kv_msg_decode(const uint8_t *p, size_t len, int vocab, ps_kv_msg *out, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    *out = (ps_kv_msg){.id = ps_rbuf_u64(&r), .n = ps_rbuf_i32(&r)};
    if (r.bad || out->n < 1 || out->n > PS_KV_MSG_MAX_BLOCKS)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed prefix message: %d blocks (1 to %d)", out->n,
                       PS_KV_MSG_MAX_BLOCKS);
    out->blocks = ps_rbuf_bytes(&r, (size_t)out->n * sizeof(int32_t));
    out->tokens = ps_rbuf_bytes(&r, (size_t)out->n * PS_KV_BLOCK * sizeof(int32_t));
    if (r.bad || r.off != len)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed prefix message: %zu bytes for %d blocks", len, out->n);
    for (int i = 0; i < out->n; i++)
        if (out->blocks[i] < 0)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "prefix message: block %d", out->blocks[i]);
    for (int i = 0; i < out->n * PS_KV_BLOCK; i++)
        if (out->tokens[i] < 0 || out->tokens[i] >= vocab)
            return ps_errf(err, errlen, PS_ERR_PROTOCOL, "prefix message: token id %d outside the vocabulary (0..%d)",
                           out->tokens[i], vocab - 1);
    return PS_OK;
}

void ps_kv_file_path(char *out, size_t cap, const char *dir, uint64_t id, int stage) {
    snprintf(out, cap, "%s/%016llx-%d.kv", dir, (unsigned long long)id, stage);
}
