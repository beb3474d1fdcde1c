/* spec.h - drafting for speculative decoding: guesses of the tokens that follow a sequence,
 * which the last stage checks in one trip around the ring (stage.h, ps_mb_seg.n_draft).
 *
 * A trip costs at least a round of hop latencies whatever it carries, so the tokens it
 * yields decide the speed: with k guesses of which a are kept, a trip gives a + 1 tokens.
 * Guesses never change the tokens (the last stage keeps a guess only when it is the token
 * it samples there), only how many come per trip. */
#ifndef PS_COORD_SPEC_H
#define PS_COORD_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "../ps.h"

typedef enum {
    PS_SPEC_OFF = 0,
    PS_SPEC_NGRAM = 1, /* prompt lookup: the continuation of an earlier n-gram of the sequence */
    PS_SPEC_DRAFT = 2, /* a draft model's greedy guesses (draft.h) */
} ps_spec_kind;

typedef struct ps_draft ps_draft;

#define PS_SPEC_NGRAM_MAX 4 /* the longest n-gram prompt lookup matches */

#define PS_SPEC_AUTO_MAX 10 /* the most guesses per trip --spec-k auto tries */
#define PS_SPEC_EXPLORE  4  /* --spec-k auto tries a neighbour of its best K every this many trips */
#define PS_SPEC_TRIAL    4  /* ... and a K it tries after plain decoding for this many trips in a row */

/* Speculation of a generation. */
typedef struct {
    ps_spec_kind kind;
    int k;           /* guesses per trip, 1..PS_MAX_DRAFT (stage.h); with auto, the most */
    bool auto_k;     /* choose K per trip (ps_spec_auto) */
    ps_draft *draft; /* PS_SPEC_DRAFT: the draft model (borrowed) */
    bool overlap;    /* PS_SPEC_DRAFT: while a trip is out, draft the next one as if every guess is kept */
} ps_spec_opts;

/* --spec-k auto: K per trip from what the trips so far measured. Each K tried has the tokens
 * per second its trips gave (a moving average: the text, the draft's cost, the overlap and the
 * ring's latency all show in it), and the next trip takes the K that gave the most, 0 (plain
 * decoding) when none beat it. Plain decoding is measured first, then 2 guesses for 4 trips in a
 * row (a lone trip of guesses pays what a run of them shares: the draft catching up, the overlap
 * not yet ready); every 4th trip tries a neighbour of the best K, on the side that paid last
 * time (one more at first; the other side after a neighbour that did not become the best), so
 * that K climbs to where the rate peaks and follows it; after 16 plain trips in a row 2 guesses
 * are tried again, 4 trips long. */
typedef struct {
    double rate[PS_SPEC_AUTO_MAX + 1]; /* tokens per second of the trips with K guesses (0: not tried) */
    int since_move;                    /* trips since the last neighbour was tried */
    int dir;                           /* the next neighbour: +1 or -1 (0 counts as +1) */
    int plain_run;                     /* plain trips in a row */
    int last_k, streak;                /* the latest trip's K, and how many in a row had it */
} ps_spec_auto;

/* The K for the next trip (0..k_max; 0: plain). */
int ps_spec_auto_k(const ps_spec_auto *a, int k_max);
/* Records a trip of k guesses (0: plain) that kept `kept` of them in `seconds`. */
void ps_spec_auto_add(ps_spec_auto *a, int k, int kept, double seconds);

/* Prompt lookup: finds the latest earlier occurrence of the sequence's last n tokens (n from
 * PS_SPEC_NGRAM_MAX down to 1; the longest that occurred wins) and copies up to k of the
 * tokens that followed it to out. Returns how many (0: no n-gram recurs). */
int ps_spec_ngram(const int32_t *toks, int n_toks, int k, int32_t *out);

/* "off", "ngram", "draft". */
const char *ps_spec_kind_name(ps_spec_kind k);
/* Parses "ngram" (PS_ERR_ARG with a message naming what is accepted otherwise). */
ps_status ps_spec_kind_parse(const char *s, ps_spec_kind *out, char *err, size_t errlen);

#endif
