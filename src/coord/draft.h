/* draft.h - a draft model on the coordinator (`--draft MODEL`): a small model with the target's
 * vocabulary that guesses the next tokens of a sequence for speculative decoding (spec.h), one
 * forward pass per guess, on threads of its own. Its guesses are greedy, or, for a sequence that
 * samples with a temperature, drawn from its own distribution, which goes with them to the last
 * stage for the rejection rule (ps_sample_verify): either way the tokens are distributed as the
 * target's, and greedy ones are the target's exactly.
 *
 * Its keys and values follow the sequence: each call feeds only what differs from what it
 * holds (the guesses the last stage did not keep are overwritten, as on the stages). */
#ifndef PS_COORD_DRAFT_H
#define PS_COORD_DRAFT_H

#include <stdint.h>

#include "../ps.h"
#include "../sample/sample.h"
#include "../tokenize/tokenize.h"

typedef struct ps_draft ps_draft;

/* Loads the whole model at path (not a shard) with `threads` compute threads, room for `slots`
 * sequences of n_ctx positions (slot 0..slots-1: the caller's numbering). Its tokenizer must be
 * target's token for token: PS_ERR_ARG otherwise, with a message naming the first difference
 * (the sizes, or a token id and its two texts). */
ps_status ps_draft_open(const char *path, int threads, int n_ctx, int slots, const ps_tok *target, ps_draft **out,
                        char *err, size_t errlen);
void ps_draft_free(ps_draft *d); /* NULL is a no-op */
/* Pins the draft's threads but the caller's to the CPUs from first (ps_pool_pin_workers): the
 * cores after a pinned fleet's stages. PS_ERR_RANGE when there are not enough. */
ps_status ps_draft_pin(ps_draft *d, int first, char *err, size_t errlen);

/* One sequence's guesses in ps_draft_guess_many. */
typedef struct {
    int slot;                   /* its slot (a sequence keeps one while it runs) */
    const int32_t *toks;        /* (n) the sequence */
    int n, k;                   /* its length; guesses wanted */
    const ps_sample_params *sp; /* NULL (greedy), or how the sequence samples */
    int32_t *out;               /* (k) the guesses */
    ps_draft_dist *dist;        /* (k) with sp at a temperature: the distributions they were drawn from */
    double sure_min;            /* > 0: stop after the guess that takes sure below it (PS_SPEC_SURE) */
    double sure;                /* with sure_min: in, how sure the draft was of the trip's guesses before these
                                   (1: none); out, times its probability of each of these (its logits' softmax) */
    int n_out;                  /* out: how many */
} ps_draft_req;

/* Up to r->k guesses of the tokens after r->toks[0..r->n) into r->out (r->n_out of them: fewer
 * when a greedy guess is not one of the target's tokens, the context ends, or the draft became
 * less sure than r->sure_min), in slot 0 (r->slot is ignored): greedy when r->sp is NULL or its
 * temperature 0, else drawn with r->sp by ps_sample_draft, their distributions into r->dist. */
ps_status ps_draft_guess(ps_draft *d, ps_draft_req *r, char *err, size_t errlen);

/* ps_draft_guess for n sequences of distinct slots at once: one forward pass per guess over
 * all of them (after long catch-ups, each alone). */
ps_status ps_draft_guess_many(ps_draft *d, ps_draft_req *r, int n, char *err, size_t errlen);

/* The sequences it holds at once. */
int ps_draft_slots(const ps_draft *d);
/* The draft's compute time so far, in seconds. */
double ps_draft_seconds(const ps_draft *d);

#endif
