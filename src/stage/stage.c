/* stage.c - the stage executor and the micro-batch message. */
#include "stage.h"

#include <stdlib.h>
#include <string.h>

struct ps_stage {
    ps_model *m;
    ps_pool *pool;
    ps_ctx *ctx;
    ps_ctx_params cp; /* of ctx */
    int max_mb;       /* positions a micro-batch may carry */
    float *x_out;     /* (max_mb, dim) activations for the next stage */
    float *logits;    /* (vocab) last stage */
    int32_t *history; /* (n_ctx) last stage: the sequence's tokens, for the penalties */
    ps_sampler *smp;  /* last stage */
};

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

void ps_mb_encode(ps_wbuf *b, const ps_mb *mb, int dim, struct iovec iov[2]) {
    const ps_sample_params *sp = &mb->sp;
    b->len = 0;
    ps_wbuf_u64(b, mb->seq);
    ps_wbuf_u32(b, mb->mb);
    ps_wbuf_i32(b, mb->pos);
    ps_wbuf_i32(b, mb->n);
    ps_wbuf_u32(b, mb->flags);
    ps_wbuf_u32(b, mb->x ? (uint32_t)dim : 0);
    ps_wbuf_i32(b, mb->n_stats);
    ps_wbuf_f32(b, sp->temperature);
    ps_wbuf_i32(b, sp->top_k);
    ps_wbuf_f32(b, sp->top_p);
    ps_wbuf_f32(b, sp->min_p);
    ps_wbuf_f32(b, sp->repetition_penalty);
    ps_wbuf_i32(b, sp->penalty_last_n);
    ps_wbuf_f32(b, sp->presence_penalty);
    ps_wbuf_f32(b, sp->frequency_penalty);
    ps_wbuf_u64(b, sp->seed);
    for (int i = 0; i < mb->n; i++) ps_wbuf_i32(b, mb->tokens[i]);
    for (int i = 0; i < mb->n_stats; i++) ps_stage_stat_encode(b, &mb->stats[i]);
    size_t xbytes = mb->x ? (size_t)mb->n * dim * sizeof(float) : 0;
    if (iov) {
        iov[0] = (struct iovec){b->p, b->len};
        iov[1] = (struct iovec){(void *)mb->x, xbytes};
    } else if (xbytes) {
        ps_wbuf_bytes(b, mb->x, xbytes);
    }
}

uint32_t ps_mb_max_bytes(int dim, int max_mb) {
    uint64_t b = 4096 + (uint64_t)max_mb * (4 + 4 * (uint64_t)dim); /* 4096 > fixed fields + 64 stats */
    return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}

ps_status ps_mb_decode(const uint8_t *p, size_t len, int dim, int max_n, ps_mb *out, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    ps_sample_params *sp = &out->sp;
    out->seq = ps_rbuf_u64(&r);
    out->mb = ps_rbuf_u32(&r);
    out->pos = ps_rbuf_i32(&r);
    out->n = ps_rbuf_i32(&r);
    out->flags = ps_rbuf_u32(&r);
    uint32_t xdim = ps_rbuf_u32(&r);
    out->n_stats = ps_rbuf_i32(&r);
    sp->temperature = ps_rbuf_f32(&r);
    sp->top_k = ps_rbuf_i32(&r);
    sp->top_p = ps_rbuf_f32(&r);
    sp->min_p = ps_rbuf_f32(&r);
    sp->repetition_penalty = ps_rbuf_f32(&r);
    sp->penalty_last_n = ps_rbuf_i32(&r);
    sp->presence_penalty = ps_rbuf_f32(&r);
    sp->frequency_penalty = ps_rbuf_f32(&r);
    sp->seed = ps_rbuf_u64(&r);
    if (r.bad || r.off != MB_FIXED_BYTES) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch header truncated");
    if (out->n < 1 || out->n > max_n || out->pos < 0)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d positions at %d (this stage takes 1..%d)",
                       out->n, out->pos, max_n);
    if (out->n_stats < 0 || out->n_stats >= (int32_t)PS_ARRAY_LEN(out->stats))
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch carries %d stage stats", out->n_stats);
    if (out->flags & ~(uint32_t)PS_MB_SAMPLE)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch has unknown flags 0x%x", out->flags);
    if (xdim && xdim != (uint32_t)dim)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch activations are %u wide, this model's are %d", xdim,
                       dim);
    out->tokens = ps_rbuf_bytes(&r, (size_t)out->n * sizeof(int32_t));
    for (int i = 0; i < out->n_stats; i++) ps_stage_stat_decode(&r, &out->stats[i]);
    out->x = xdim ? ps_rbuf_bytes(&r, (size_t)out->n * dim * sizeof(float)) : NULL;
    if (r.bad || r.off != len)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "micro-batch of %d positions has %zu bytes, expected %zu", out->n,
                       len,
                       (size_t)MB_FIXED_BYTES + (size_t)out->n * 4 + (size_t)out->n_stats * PS_STAGE_STAT_BYTES +
                           (xdim ? (size_t)out->n * dim * 4 : 0));
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

ps_status ps_stage_open(const char *path, const ps_stage_opts *o, ps_stage **out, char *err, size_t errlen) {
    *out = NULL;
    ps_stage *s = ps_calloc(1, sizeof *s);
    if (!s) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_status st = ps_model_load(path, o->mmap ? PS_GGUF_MAP : PS_GGUF_HUGE, &s->m, err, errlen);
    if (!st && (st = ps_pool_create(o->threads, &s->pool)))
        ps_errf(err, errlen, st, "cannot start %d threads", o->threads);
    if (!st && o->pin) st = ps_pool_pin(s->pool, err, errlen);
    if (!st && s->m->has_head && (st = ps_sampler_create(s->m->hp.vocab, &s->smp, err, errlen))) goto fail;
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
    free(s->x_out), free(s->logits), free(s->history);
    s->ctx = NULL, s->x_out = NULL, s->logits = NULL, s->history = NULL;
}

void ps_stage_free(ps_stage *s) {
    if (!s) return;
    end_session(s);
    ps_sampler_free(s->smp);
    ps_pool_free(s->pool);
    ps_model_free(s->m);
    free(s);
}

const ps_model *ps_stage_model(const ps_stage *s) { return s->m; }
ps_pool *ps_stage_pool(ps_stage *s) { return s->pool; }
int ps_stage_n_ctx(const ps_stage *s) { return s->ctx ? s->cp.n_ctx : 0; }
int ps_stage_max_mb(const ps_stage *s) { return s->max_mb; }
const float *ps_stage_logits(const ps_stage *s) { return s->logits; }

ps_status ps_stage_begin(ps_stage *s, const ps_ctx_params *p, int max_mb, char *err, size_t errlen) {
    if (max_mb < 1 || max_mb > p->n_ctx)
        return ps_errf(err, errlen, PS_ERR_ARG, "micro-batch size %d must be within 1..%d (the context size)", max_mb,
                       p->n_ctx);
    if (s->ctx && !memcmp(&s->cp, p, sizeof *p) && s->max_mb == max_mb) return PS_OK; /* reuse: pos rewrites KV */
    end_session(s);
    const ps_hparams *hp = &s->m->hp;
    ps_status st = ps_ctx_create(s->m, p, s->pool, &s->ctx, err, errlen);
    if (st) return st;
    s->cp = *p;
    s->max_mb = max_mb;
    if (s->m->has_head) {
        s->logits = ps_malloc((size_t)hp->vocab * sizeof(float));
        s->history = ps_malloc((size_t)p->n_ctx * sizeof(int32_t));
    } else {
        s->x_out = ps_malloc((size_t)max_mb * hp->dim * sizeof(float));
    }
    if (s->m->has_head ? !s->logits || !s->history : !s->x_out) {
        end_session(s);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory for micro-batches of %d positions", max_mb);
    }
    return PS_OK;
}

ps_status ps_stage_run(ps_stage *s, const ps_mb *mb, const float **x_out, int32_t *token, char *err, size_t errlen) {
    *token = -1;
    if (!s->ctx) return ps_errf(err, errlen, PS_ERR_INTERNAL, "stage run before its session began");
    if (mb->n < 1 || mb->n > s->max_mb || mb->pos < 0 || (long long)mb->pos + mb->n > s->cp.n_ctx)
        return ps_errf(err, errlen, PS_ERR_RANGE,
                       "micro-batch of %d positions at %d does not fit (%d positions, %d per "
                       "micro-batch)",
                       mb->n, mb->pos, s->cp.n_ctx, s->max_mb);
    const ps_model *m = s->m;
    bool sample = m->has_head && (mb->flags & PS_MB_SAMPLE);
    float *out = m->has_head ? s->logits : s->x_out;
    ps_status st = ps_forward_stage(s->ctx, mb->tokens, mb->x, mb->n, mb->pos, out, sample ? 1 : 0, err, errlen);
    if (st) return st;
    if (!m->has_head) {
        *x_out = s->x_out;
        return PS_OK;
    }
    for (int i = 0; i < mb->n; i++) s->history[mb->pos + i] = mb->tokens[i];
    if (!sample) return PS_OK;
    int n_hist = mb->pos + mb->n;
    if ((st = ps_sample(s->smp, &mb->sp, s->logits, s->history, n_hist, (uint64_t)n_hist, token)))
        return ps_errf(err, errlen, st, "sampling failed: %s", ps_sampler_error(s->smp));
    return PS_OK;
}
