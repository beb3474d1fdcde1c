/* spec.h - drafting for speculative decoding: guesses of the tokens that follow a sequence,
 * which the last stage checks in one trip around the ring (stage.h, ps_mb_seg.n_draft).
 *
 * A trip costs at least a round of hop latencies whatever it carries, so the tokens it
 * yields decide the speed: with k guesses of which a are kept, a trip gives a + 1 tokens.
 * Guesses never change the tokens (the last stage keeps a guess only when it is the token
 * it samples there), only how many come per trip. */
#ifndef PS_COORD_SPEC_H
#define PS_COORD_SPEC_H

#include <stdint.h>

#include "../ps.h"

typedef enum {
    PS_SPEC_OFF = 0,
    PS_SPEC_NGRAM = 1, /* prompt lookup: the continuation of an earlier n-gram of the sequence */
} ps_spec_kind;

#define PS_SPEC_NGRAM_MAX 4 /* the longest n-gram prompt lookup matches */

/* Speculation of a generation. */
typedef struct {
    ps_spec_kind kind;
    int k; /* guesses per trip, 1..PS_MAX_DRAFT (stage.h) */
} ps_spec_opts;

/* Prompt lookup: finds the latest earlier occurrence of the sequence's last n tokens (n from
 * PS_SPEC_NGRAM_MAX down to 1; the longest that occurred wins) and copies up to k of the
 * tokens that followed it to out. Returns how many (0: no n-gram recurs). */
int ps_spec_ngram(const int32_t *toks, int n_toks, int k, int32_t *out);

/* "off", "ngram". */
const char *ps_spec_kind_name(ps_spec_kind k);
/* Parses "ngram" (PS_ERR_ARG with a message naming what is accepted otherwise). */
ps_status ps_spec_kind_parse(const char *s, ps_spec_kind *out, char *err, size_t errlen);

#endif
