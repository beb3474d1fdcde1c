/* sample.h - turning a row of logits into a token: a counter-based RNG and a sampler.
 *
 * RNG (ps_rng_): Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11; the Random123 library's known-answer vectors are in the tests).
 * A draw is a pure function of (seed, position, stream): there is no generator state,
 * so the token at sequence position p of a seeded request uses the same u wherever
 * and in whatever batch it is computed (DESIGN.md, invariant 2).
 *
 * Sampler (ps_sample_): the chain of llama.cpp's default sampler, in this order:
 *   penalties -> top-k -> top-p -> min-p -> temperature -> softmax -> draw.
 * Top-p and min-p therefore look at the distribution at temperature 1 (as llama.cpp
 * does; Hugging Face's transformers applies the temperature first). The draw is the
 * inverse CDF at u = ps_rng_uniform(seed, position, PS_RNG_STREAM_SAMPLE) over the
 * kept tokens in one fixed order: logit descending, ties by lower token id first.
 * So u near 0 picks the most likely token, and the result depends only on
 * (logits, history, params, position).
 *
 * A ps_sampler owns every buffer it needs (allocated once, for one vocabulary size);
 * ps_sample allocates nothing. One sampler serves one thread at a time. */
#ifndef PS_SAMPLE_H
#define PS_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ps.h"

/* ---- counter-based RNG ---------------------------------------------------------- */

/* Streams keep independent uses of one (seed, position) apart. Never renumbered. */
enum {
    PS_RNG_STREAM_SAMPLE = 0,   /* the draw of ps_sample */
    PS_RNG_STREAM_ACCEPT = 1,   /* speculative decoding: accept/reject a draft token */
    PS_RNG_STREAM_RESAMPLE = 2, /* speculative decoding: draw from the residual */
    PS_RNG_STREAM_DRAFT = 3,    /* speculative decoding: a draft model's sampled guess */
};

/* The Philox4x32-10 block function: out = philox(ctr, key), exactly as Random123's
 * philox4x32_R(10, ctr, key). Pure; out may not alias ctr. */
void ps_rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* 64 random bits for (seed, position, stream): Philox with key = (seed low, seed high)
 * and counter = (position low, position high, stream, 0); the result is
 * out[0] << 32 | out[1]. Pure. */
uint64_t ps_rng_u64(uint64_t seed, uint64_t position, uint32_t stream);

/* A uniform double in [0, 1) with 53 random bits: (ps_rng_u64(...) >> 11) * 2^-53. Pure. */
double ps_rng_uniform(uint64_t seed, uint64_t position, uint32_t stream);

/* ---- sampler -------------------------------------------------------------------- */

/* Sampling parameters. Fill with ps_sample_params_default() (or _cli()) and change what
 * you need; every field has an "off" value. */
typedef struct {
    float temperature;        /* >= 0; 0 = greedy argmax (ties -> lowest id); default 1 */
    int32_t top_k;            /* >= 0; keep the k most likely tokens; 0 = off (default) */
    float top_p;              /* (0, 1]; smallest prefix with probability >= top_p; 1 = off */
    float min_p;              /* [0, 1]; keep p >= min_p * p_max; 0 = off (default) */
    float repetition_penalty; /* > 0; llama.cpp: logit > 0 divided, <= 0 multiplied; 1 = off */
    int32_t penalty_last_n;   /* >= -1; the penalties look at the last n history tokens;
                                 -1 = all of it, 0 = penalties off; default 64 */
    float presence_penalty;   /* OpenAI: logit -= presence if the token occurs; 0 = off */
    float frequency_penalty;  /* OpenAI: logit -= frequency * count; 0 = off */
    uint64_t seed;            /* key of the RNG; default 0 */
} ps_sample_params;

/* The API's defaults: everything off (temperature 1: the model's own distribution, as
 * OpenAI's API), penalty_last_n 64, seed 0. */
ps_sample_params ps_sample_params_default(void);
/* The command line's defaults, llama.cpp's: temperature 0.8, top_k 40, top_p 0.95,
 * min_p 0.05, the rest as ps_sample_params_default. The one place that holds them: `run`
 * and its help text read them here. */
ps_sample_params ps_sample_params_cli(void);

/* Checks every field; on failure returns PS_ERR_ARG and writes one line naming the
 * field, its value and the allowed range into err (when err is non-NULL). */
ps_status ps_sample_params_check(const ps_sample_params *p, char *err, size_t errlen);

typedef struct ps_sampler ps_sampler;

/* Makes a sampler for logit rows of n_vocab floats (n_vocab >= 1),
 * allocating all its buffers (36 bytes per vocabulary entry). On failure *out
 * is NULL. Free with ps_sampler_free. */
ps_status ps_sampler_create(int32_t n_vocab, ps_sampler **out, char *err, size_t errlen);

/* Frees s and its buffers; NULL is a no-op. */
void ps_sampler_free(ps_sampler *s);

/* The vocabulary size s was made for. */
int32_t ps_sampler_n_vocab(const ps_sampler *s);

/* Samples one token from logits (n_vocab floats, read only; never modified).
 * history: the tokens the penalties look at (oldest first; the last penalty_last_n
 * are used), may be NULL when n_history is 0; which tokens to pass (prompt and
 * generated, or generated only) is the caller's policy. position: the sequence
 * position of the token being sampled, the RNG counter.
 * Logits may be -inf (token banned); a NaN or +inf logit, a history token outside
 * [0, n_vocab), invalid params, or no finite logit at all give PS_ERR_ARG.
 * On failure *out_token is -1 and ps_sampler_error(s) says why. */
ps_status ps_sample(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                    int64_t n_history, uint64_t position, int32_t *out_token);

/* The distribution ps_sample draws from: runs the same penalties and truncation and
 * the softmax at the temperature, and points *ids / *probs at the kept tokens in draw
 * order (logit descending, ties by id) and their probabilities (summing to 1), *n_kept
 * of them. Temperature 0 gives the argmax alone with probability 1. The arrays belong
 * to s and stay valid until the next call on s. Costs a sort of the kept tokens
 * (meant for speculative verification, log-probabilities and tests). Errors as ps_sample. */
ps_status ps_sample_dist(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                         int64_t n_history, const int32_t **ids, const float **probs, int32_t *n_kept);

/* Log-probabilities of the model's own distribution (the log-softmax of the raw logits: no
 * penalties, truncation or temperature; what OpenAI's logprobs report): the n (>= 0) most
 * likely tokens of logits[0..vocab) into ids[0..n) and their log-probabilities into
 * logprobs[0..n), descending, ties by the lower id first (min(n, vocab) entries written).
 * Returns log(sum(exp(logits))), so that any token t's log-probability is logits[t] minus
 * it. Allocates nothing; pure. Logits are expected finite (-inf allowed: probability 0). */
double ps_sample_top_logprobs(const float *logits, int vocab, int n, int32_t *ids, float *logprobs);

/* ---- speculative decoding with a sampled draft ------------------------------------ */

#define PS_DRAFT_DIST 16 /* most tokens of the draft distribution a sampled guess carries */

/* The distribution a draft drew a guess from: n tokens (distinct ids) and their
 * probabilities (each in (0, 1], summing to 1). It travels as it lies in memory (132 bytes). */
typedef struct {
    int32_t n;
    int32_t id[PS_DRAFT_DIST];
    float p[PS_DRAFT_DIST];
} ps_draft_dist;

/* A draft model's guess of the token at `position`: the distribution ps_sample_dist gives
 * for its logits, cut to its first PS_DRAFT_DIST tokens in draw order and renormalized, into
 * *q, and the token drawn from *q by the inverse CDF at ps_rng_uniform(seed, position,
 * PS_RNG_STREAM_DRAFT). Temperature 0: the argmax with probability 1. Errors as ps_sample. */
ps_status ps_sample_draft(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                          int64_t n_history, uint64_t position, ps_draft_dist *q, int32_t *out_token);

/* The rejection rule of Leviathan et al. (ICML 2023) and Chen et al. (2023) for a guess drawn
 * from q at `position`, against the distribution p that ps_sample would draw from (the same
 * penalties, truncation and temperature): the guess is kept with probability
 * min(1, p(guess) / q(guess)), by u = ps_rng_uniform(seed, position, PS_RNG_STREAM_ACCEPT);
 * otherwise the token is drawn from the residual max(0, p - q), normalized, by the inverse CDF
 * in draw order at ps_rng_uniform(seed, position, PS_RNG_STREAM_RESAMPLE). Either way the
 * token is distributed as p. *out_token gets it, *kept whether it is the guess kept. A q
 * that is not a distribution over this vocabulary holding the guess is PS_ERR_ARG, with
 * ps_sampler_error saying what is wrong. */
ps_status ps_sample_verify(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                           int64_t n_history, uint64_t position, const ps_draft_dist *q, int32_t guess,
                           int32_t *out_token, bool *kept);

/* The message of the last failed call on s ("" after a success); owned by s, valid
 * until the next call on s. */
const char *ps_sampler_error(const ps_sampler *s);

#endif
