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
    PS_SPEC_DRAFT = 2, /* a draft model's guesses (draft.h) */
} ps_spec_kind;

typedef struct ps_draft ps_draft;

#define PS_SPEC_NGRAM_MAX 4 /* the longest n-gram prompt lookup matches */

#define PS_SPEC_AUTO_MAX 10 /* the most guesses per trip --spec-k auto tries */

/* With --spec-k auto a draft model stops a trip's guesses early, after the one that takes its
 * probability of them all (the product of each guess's in its softmax) below PS_SPEC_SURE:
 * K is then the most a trip carries. The draft's probability says well where it will be wrong
 * (Qwen2.5-Coder 0.5B guessing the 1.5B's answers: right 99 % of the time when over 0.9, 40 %
 * under 0.5), so a trip of easy text carries many guesses and one of hard text few; the
 * threshold was chosen on tests/test_spec.c's real answers (docs/notes/spec-auto.md). */
#define PS_SPEC_SURE 0.1

/* Speculation of a generation. */
typedef struct {
    ps_spec_kind kind;
    int k;           /* guesses per trip, 1..PS_MAX_DRAFT (stage.h); with auto, the most */
    bool auto_k;     /* choose K per trip (ps_spec_auto) */
    ps_draft *draft; /* PS_SPEC_DRAFT: the draft model (borrowed) */
    bool overlap;    /* PS_SPEC_DRAFT: while a trip is out, draft the next one as if every guess is kept */
} ps_spec_opts;

/* How sure the draft must stay to guess on (ps_draft_req.sure_min): PS_SPEC_SURE with auto, else
 * 0 (a fixed K sends K). */
double ps_spec_sure_min(const ps_spec_opts *o);

/* --spec-k auto: K per trip from what the trips so far measured, per sequence.
 *
 * A trip of K guesses costs the drafting done before it is sent (the guesses the draft had not
 * made while the trip before was out) and the wait for its answer (the ring's latency and the
 * stages' work on K + 1 positions; with the overlap at most one guess more: the draft guesses
 * while the answer has not come). The rate of a K is the tokens its trips would give at the
 * acceptance measured so far (each guess checked kept with probability a: 1 + a + ... + a^K; the
 * guesses before a trip weigh 0.97 against its own, also when it is plain, so that the old ones
 * fade while guesses are not tried; a starts at 0.8; a plain trip during which the draft guessed
 * its token counts that guess) over that cost: the wait measured at K (the mean of its first
 * trips, then a moving average; not a plain trip's during which the draft also made the next
 * trip's guesses, nor in serve one crowded by prompts while K has a clearer measure: plain
 * decoding's is measured again once a trip of guesses comes back uncrowded), plus K guesses at
 * the draft's measured seconds a guess (before sending and while trips are out); with the overlap,
 * a trip that kept every guess and guessed its last token (a^(K+1) of them) has the next trip's
 * guesses drafted meanwhile, as many as fit in a wait (the mean made in the trips whose answer cut
 * the draft short; none cut yet: the wait's seconds over a guess's, less one for reading the
 * trip's tokens), so that only the rest are drafted before sending. A K not measured yet waits as
 * the two measured around it say (linearly) when they are at most 2 apart, or else as the
 * largest below it plus what each guess added between the two largest K > 0 measured there
 * (nothing with one: optimistic; a pass's cost is a step in its rows, flat to a kernel tile's
 * rows and then a jump, which a long line misjudges), or, below the smallest, as plain
 * decoding. The next trip takes the K of the highest rate (2 % above the others, so that a tie
 * takes fewer guesses; after a trip that kept a guess, plain decoding only when it is 5 % above
 * every K); one not measured yet is then measured, 2 trips (1 when it is the first after plain
 * ones). Plain decoding (K 0) is measured first, then 2 guesses, and plain wins when no K beats
 * it; while plain decoding has one measure, a K that beats it by less than 25 % waits for a
 * second. Where the caller reports each trip's compute (timed: run, chat, and serve for a
 * request alone), 2 guesses go first and plain decoding waits, until measured, what the hops
 * take of the trips' waits (a wait less the stages' compute): it is measured when guesses do
 * not beat that by 25 %, and a ring of slow hops loses no trip to it.
 * Every 16th trip at a K > 0 measures a neighbour again (either side in turn); after 16 plain
 * trips in a row the K that comes closest is measured again, then after 32, 64, ... 256 while
 * guesses never pay (with the overlap, where plain trips measure the acceptance, only when that K
 * comes within 10 % of plain decoding, or after 256). A draft model then sends fewer where it
 * is unsure (PS_SPEC_SURE); the trip is recorded at the K it carried. */
typedef struct {
    double wait[PS_SPEC_AUTO_MAX + 1]; /* per K: seconds from sending a trip to its answer */
    int n[PS_SPEC_AUTO_MAX + 1];       /* per K: trips measured */
    bool rough[PS_SPEC_AUTO_MAX + 1];  /* per K: measured by crowded trips only (ps_spec_trip.crowded) */
    double tested, kept;               /* guesses checked, kept (decaying) */
    double draft_s, drafted;           /* the draft's seconds guessing, its guesses (decaying) */
    double cut, cut_made;              /* trips whose answer came before the draft made the guesses it meant to
                                          make meanwhile, and the guesses it had made (decaying) */
    bool overlap;                      /* the draft works while a trip is out (set by the caller) */
    bool timed;                        /* the caller reports each trip's compute (set by it): the first trip carries
                                          guesses, and plain decoding waits at least the hops' part until measured */
    double floor_s;                    /* the hops' part of a wait (its less the stages' compute; moving average) */
    int last_k;                        /* the latest trip's K */
    bool last_kept;                    /* ... kept a guess */
    int plain_run, wait_plain;         /* plain trips in a row; how many before guesses are measured again */
    int spec_run;                      /* trips with guesses in a row */
    int since_probe, side;             /* trips at a K > 0 since a neighbour was measured; its side (+1, -1) */
} ps_spec_auto;

/* What one trip cost (ps_spec_auto_add). */
typedef struct {
    int k;              /* guesses it carried (0: plain) */
    int kept;           /* of them kept */
    int drafted;        /* of them drafted before it was sent (the others while the trip before was out) */
    double draft_s;     /* seconds drafting those */
    double wait_s;      /* seconds from sending it to its answer */
    bool predrafted;    /* plain, and the draft made the next trip's guesses meanwhile (the answer may have
                           waited for them: not plain decoding's wait) */
    int shadow;         /* plain: the draft's guess of its token, made meanwhile: 1 right, -1 wrong, 0 none */
    int meanwhile;      /* guesses the draft made while it was out, beyond the one reading its tokens ... */
    double meanwhile_s; /* ... and their seconds */
    bool cut;           /* the answer came before the draft made every guess it meant to make meanwhile */
    double compute_s;   /* of wait_s, the stages' compute (0: not known, as in serve beside other requests) */
    bool crowded;       /* serve: prompt rows went round (or the draft read a prompt) while it was out, so its
                           wait is not a token's: it counts only while K has no other measure, and gives way
                           to the first that is not crowded */
} ps_spec_trip;

/* The K for the next trip (0..k_max; 0: plain). */
int ps_spec_auto_k(const ps_spec_auto *a, int k_max);
/* The most guesses a trip may carry when auto asks k of a draft model that stops where it is
 * unsure (PS_SPEC_SURE): k, one more where the hops make half of a trip's wait at k or more (the
 * floor, so only when timed), two from 70 %: against such a trip a guess costs little, and the
 * draft's sureness stops the guesses that would be wasted (at most k_max). */
int ps_spec_auto_reach(const ps_spec_auto *a, int k, int k_max);
/* ... and for the trip after a plain one now out, so that the draft can guess them while it is
 * out (0 after plain decoding's first). */
int ps_spec_auto_k_after_plain(const ps_spec_auto *a, int k_max);
/* For a new generation over the same ring and draft, into to: what from (a generation's,
 * possibly to itself) measured of them (the wait at each K, the draft's seconds a guess, the
 * guesses a wait holds) as one trip's worth each (plain decoding's wait as two, so that it is
 * not measured again first) and its acceptance as eight guesses' worth, so that the new text's
 * trips soon outweigh them; nothing else. Its first trip then takes the best K at once, neither
 * the plain yardstick nor 2 guesses. to stays as it is when from measured no trip. */
void ps_spec_auto_carry(ps_spec_auto *to, const ps_spec_auto *from);
/* Records a trip (ignored when out of range). */
void ps_spec_auto_add(ps_spec_auto *a, const ps_spec_trip *t);

/* With PS_SPEC_TRACE=1 in the environment, one line on stderr for trip t of sequence seq just
 * recorded into a: the trip, then what auto now believes (acceptance, seconds a guess, the
 * guesses a wait holds, the plain trips its yardstick counts as measured, each K's wait and
 * rate), the K it takes next (of at most k_max) and what a draft model's trip may then carry
 * (ps_spec_auto_reach). */
void ps_spec_auto_trace(const ps_spec_auto *a, const ps_spec_trip *t, uint64_t seq, int k_max);

/* Prompt lookup: finds the latest earlier occurrence of the sequence's last n tokens (n from
 * PS_SPEC_NGRAM_MAX down to 1; the longest that occurred wins) and copies up to k of the
 * tokens that followed it to out. Returns how many (0: no n-gram recurs). */
int ps_spec_ngram(const int32_t *toks, int n_toks, int k, int32_t *out);

/* "off", "ngram", "draft". */
const char *ps_spec_kind_name(ps_spec_kind k);
/* Parses "ngram" (PS_ERR_ARG with a message naming what is accepted otherwise). */
ps_status ps_spec_kind_parse(const char *s, ps_spec_kind *out, char *err, size_t errlen);

#endif
