/* spec.c - drafting for speculative decoding (spec.h). */
#include "spec.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_spec_ngram(const int32_t *toks, int n_toks, int k, int32_t *out) {
    for (int n = n_toks - 1 < PS_SPEC_NGRAM_MAX ? n_toks - 1 : PS_SPEC_NGRAM_MAX; n >= 1 && k > 0; n--) {
        const int32_t *tail = toks + n_toks - n;
        for (int i = n_toks - n - 1; i >= 0; i--) { /* latest first; toks[i + n] follows the match */
            if (memcmp(toks + i, tail, (size_t)n * sizeof *toks)) continue;
            int m = n_toks - (i + n) < k ? n_toks - (i + n) : k;
            memcpy(out, toks + i + n, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

const char *ps_spec_kind_name(ps_spec_kind k) {
    return k == PS_SPEC_NGRAM ? "ngram" : k == PS_SPEC_DRAFT ? "draft" : "off";
}

ps_status ps_spec_kind_parse(const char *s, ps_spec_kind *out, char *err, size_t errlen) {
    if (!strcmp(s, "ngram")) return *out = PS_SPEC_NGRAM, PS_OK;
    return ps_errf(err, errlen, PS_ERR_ARG, "unknown draft source '%s' (ngram: prompt lookup)", s);
}

double ps_spec_sure_min(const ps_spec_opts *o) { return o->auto_k ? PS_SPEC_SURE : 0; }

#define AUTO_DECAY    0.75 /* weight of a K's waits before its latest (a slow one fades fast) */
#define AUTO_ACCEPT   0.97 /* ... and of the guesses before the latest trip's, for the acceptance and drafting */
#define AUTO_PROBE    2    /* trips that measure a K */
#define AUTO_AROUND   16   /* trips at a K > 0 between measures of a neighbour */
#define AUTO_WAIT     16   /* plain trips before guesses are measured again; twice more while they lose */
#define AUTO_WAIT_MAX 256
#define AUTO_AGAIN    0.9  /* with the overlap, guesses are measured again when within 10 % of plain decoding */
#define AUTO_CLOSE    1.25 /* plain decoding is measured twice before a K less than 25 % faster wins over it */
#define AUTO_SPAN     2    /* a K between two measured ones at most this far apart waits as they say */
#define AUTO_REACH    0.5  /* a draft's trip may carry a guess past K where the hops make this much of a wait */
#define AUTO_REACH2   0.7  /* ... and two from this much */

/* The wait for an answer to k guesses (spec.h): measured, else between the two K > 0 measured
 * around it when they are at most AUTO_SPAN apart, else beyond the largest below it at the pace
 * of the two largest there, else (below the smallest) plain decoding's. */
static double wait_at(const ps_spec_auto *a, int k) {
    if (a->n[k] > 0) return a->wait[k];
    if (k == 0) return a->floor_s; /* plain decoding not measured yet: at least the hops' */
    int lo = k - 1, hi = k + 1;
    while (lo >= 0 && a->n[lo] == 0) lo--;
    while (hi <= PS_SPEC_AUTO_MAX && a->n[hi] == 0) hi++;
    double w = lo >= 0 ? a->wait[lo] : hi <= PS_SPEC_AUTO_MAX ? a->wait[hi] : 0; /* none: fixed K only */
    if (lo > 0 && hi <= PS_SPEC_AUTO_MAX && hi - lo <= AUTO_SPAN) {
        w += (k - lo) * (a->wait[hi] - a->wait[lo]) / (hi - lo);
    } else if (lo > 0) {
        int lo2 = lo - 1;
        while (lo2 > 0 && a->n[lo2] == 0) lo2--;
        if (lo2 > 0 && a->wait[lo] > a->wait[lo2]) w += (k - lo) * (a->wait[lo] - a->wait[lo2]) / (lo - lo2);
    }
    return w;
}

/* The acceptance measured so far (0.8 before any guess), the draft's seconds a guess, and the
 * guesses a wait holds (-1: no trip cut short yet). */
static double accept(const ps_spec_auto *a) { return (a->kept + 0.8) / (a->tested + 1); }
static double guess_s(const ps_spec_auto *a) { return a->drafted > 0 ? a->draft_s / a->drafted : 0; }
static double holds(const ps_spec_auto *a) { return a->cut > 0 ? a->cut_made / a->cut : -1; }

/* The rate of K: its tokens per trip at the acceptance measured so far over its trip's seconds
 * (spec.h). Plain decoding's (K 0) is measured before auto asks any other (a fixed K's trips
 * are recorded too, with no plain one). */
static double rate(const ps_spec_auto *a, int k) {
    double acc = accept(a), tokens = 1, p = 1;
    for (int i = 0; i < k; i++) tokens += p *= acc;
    double g = guess_s(a), w = wait_at(a, k), all = p * acc;                   /* a^(k+1) */
    double fit = a->cut > 0 ? holds(a) : g > 0 ? w / g - 1 : k;                /* guesses drafted in a wait */
    double s = w + k * g - (a->overlap ? all * fmin(k, fmax(fit, 0)) * g : 0); /* the drafting before sending */
    return s > 0 ? tokens / s : 0;
}

/* The K of the highest rate among 0..k_max, 2 % above the others (a tie takes fewer guesses):
 * among those measured, or among all. */
static int best_k(const ps_spec_auto *a, int k_max, bool measured_only) {
    int best = 0;
    for (int k = 1; k <= k_max; k++)
        if ((a->n[k] > 0 || !measured_only) && rate(a, k) > rate(a, best) * 1.02) best = k;
    return best;
}

/* The K > 0 of the highest rate among 1..k_max (a tie takes fewer guesses). */
static int best_guessing(const ps_spec_auto *a, int k_max) {
    int best = 1;
    for (int k = 2; k <= k_max; k++)
        if (rate(a, k) > rate(a, best)) best = k;
    return best;
}

int ps_spec_auto_k(const ps_spec_auto *a, int k_max) {
    if (k_max > PS_SPEC_AUTO_MAX) k_max = PS_SPEC_AUTO_MAX;
    bool measured = false; /* any K > 0 */
    for (int k = 1; k <= PS_SPEC_AUTO_MAX; k++) measured |= a->n[k] > 0;
    /* plain decoding's yardstick first, or (timed) once guesses have given the hops' floor */
    if (k_max < 1 || (a->n[0] == 0 && (!a->timed || (measured && !(a->floor_s > 0))))) return 0;
    int last = a->last_k;
    if (last > 0 && last <= k_max && a->n[last] < AUTO_PROBE && a->spec_run > 1)
        return last; /* a measure runs on (but one trip after plain ones says what guesses get) */
    if (!measured) return k_max < 2 ? k_max : 2; /* the first guesses: a few */
    int best = best_k(a, k_max, false);
    if (best > 0 && a->n[0] < AUTO_PROBE && rate(a, best) < AUTO_CLOSE * rate(a, 0)) return 0;
    if (best == 0 && last > 0 && a->last_kept) { /* guesses that keep some give way to plain only 5 % behind it */
        int k = best_guessing(a, k_max);
        if (rate(a, k) > 0.95 * rate(a, 0)) best = k;
    }
    if (best > 0 && a->n[best] == 0) return best; /* it may pay: measure it */
    if (best == 0) { /* again, the K that comes closest, unless its acceptance is still measured too low */
        if (a->plain_run < (a->wait_plain ? a->wait_plain : AUTO_WAIT)) return 0;
        int k = best_guessing(a, k_max);
        return !a->overlap || a->plain_run >= AUTO_WAIT_MAX || rate(a, k) >= AUTO_AGAIN * rate(a, 0) ? k : 0;
    }
    if (a->since_probe < AUTO_AROUND) return best;
    int side = a->side < 0 ? -1 : 1, k = best + side;
    return k >= 1 && k <= k_max ? k : best - side >= 1 && best - side <= k_max ? best - side : best;
}

int ps_spec_auto_reach(const ps_spec_auto *a, int k, int k_max) {
    if (k < 1 || !(a->floor_s > 0)) return k;
    double hops = a->floor_s / wait_at(a, k);
    k += (hops >= AUTO_REACH) + (hops >= AUTO_REACH2);
    return k < k_max ? k : k_max;
}

int ps_spec_auto_k_after_plain(const ps_spec_auto *a, int k_max) {
    if (a->n[0] == 0) return 0; /* the yardstick: its wait measured */
    ps_spec_auto after = *a;
    ps_spec_auto_add(&after, &(ps_spec_trip){.wait_s = a->wait[0], .predrafted = true});
    return ps_spec_auto_k(&after, k_max);
}

void ps_spec_auto_carry(ps_spec_auto *to, const ps_spec_auto *from) {
    int trips = 0;
    for (int k = 0; k <= PS_SPEC_AUTO_MAX; k++) trips += from->n[k];
    if (!trips) return;
    ps_spec_auto c = {.overlap = from->overlap, .timed = from->timed, .floor_s = from->floor_s};
    for (int k = 0; k <= PS_SPEC_AUTO_MAX; k++)
        c.wait[k] = from->wait[k], c.n[k] = from->n[k] > 0, c.rough[k] = from->rough[k];
    c.n[0] *= AUTO_PROBE; /* a yardstick trusted as measured twice: the new answer starts at the best K */
    if (from->drafted > 0) c.draft_s = guess_s(from), c.drafted = 1;
    if (from->cut > 0) c.cut_made = holds(from), c.cut = 1;
    if (from->tested > 0) c.tested = 8, c.kept = 8 * from->kept / from->tested;
    *to = c;
}

void ps_spec_auto_add(ps_spec_auto *a, const ps_spec_trip *t) {
    int k = t->k;
    if (k < 0 || k > PS_SPEC_AUTO_MAX || t->kept < 0 || t->kept > k || t->drafted < 0 || t->drafted > k ||
        !(t->wait_s > 0) || !(t->draft_s >= 0) || t->shadow < -1 || t->shadow > 1 || t->meanwhile < 0 ||
        !(t->meanwhile_s >= 0))
        return;
    if (t->drafted > 0 || t->meanwhile > 0) { /* the draft's seconds a guess: before sending and while out */
        a->draft_s = AUTO_ACCEPT * a->draft_s + (t->drafted > 0 ? t->draft_s : 0) + t->meanwhile_s;
        a->drafted = AUTO_ACCEPT * a->drafted + t->drafted + t->meanwhile;
    }
    if (t->compute_s > 0 && t->wait_s > t->compute_s) /* the hops' part of a wait: plain decoding's floor */
        a->floor_s += (t->wait_s - t->compute_s - a->floor_s) * (a->floor_s > 0 ? 1 - AUTO_DECAY : 1);
    if (t->cut) /* the guesses a wait holds */
        a->cut = AUTO_ACCEPT * a->cut + 1, a->cut_made = AUTO_ACCEPT * a->cut_made + t->meanwhile;
    /* each guess checked: kept, or the one that ended the trip; older ones fade, also while plain */
    a->tested = AUTO_ACCEPT * a->tested + t->kept + (t->kept < k) + (!k && t->shadow);
    a->kept = AUTO_ACCEPT * a->kept + t->kept + (!k && t->shadow > 0);
    if ((k > 0 || !t->predrafted) && (!t->crowded || !a->n[k] || a->rough[k])) {
        if (a->rough[k] && !t->crowded) a->n[k] = 0; /* a clear wait at last: it alone */
        a->rough[k] = t->crowded;                    /* the mean of the first trips, then a moving average */
        a->n[k]++;
        double w = 1.0 / a->n[k] > 1 - AUTO_DECAY ? 1.0 / a->n[k] : 1 - AUTO_DECAY;
        a->wait[k] += (t->wait_s - a->wait[k]) * w;
    }
    if (k == 0 && a->last_k > 0) /* back to plain: after guesses that did not pay from the start, twice longer */
        a->wait_plain =
            a->spec_run <= 2 * (AUTO_PROBE + 1) ? (a->wait_plain ? 2 * a->wait_plain : 2 * AUTO_WAIT) : AUTO_WAIT;
    if (a->wait_plain > AUTO_WAIT_MAX) a->wait_plain = AUTO_WAIT_MAX;
    a->plain_run = k ? 0 : a->plain_run + 1;
    a->spec_run = k ? a->spec_run + 1 : 0;
    if (k > 0 && k != best_k(a, PS_SPEC_AUTO_MAX, true) && a->n[k] >= AUTO_PROBE && a->last_k == k) {
        a->since_probe = 0; /* a neighbour measured: the other side next time */
        a->side = a->side < 0 ? 1 : -1;
    } else if (k > 0) {
        a->since_probe++;
    }
    if (k > 0 && !t->crowded && a->rough[0]) /* the crowd has gone: plain decoding's wait measured again */
        a->n[0] = 0, a->rough[0] = false;
    a->last_k = k;
    a->last_kept = t->kept > 0;
}

void ps_spec_auto_trace(const ps_spec_auto *a, const ps_spec_trip *t, uint64_t seq, int k_max) {
    static atomic_int on = -1;
    if (atomic_load(&on) < 0) {
        const char *e = getenv("PS_SPEC_TRACE");
        atomic_store(&on, e && !strcmp(e, "1"));
    }
    if (!atomic_load(&on)) return;
    char line[1024];
    int n = snprintf(
        line, sizeof line,
        "spec trace: seq %" PRIu64 " k %d kept %d drafted %d draft_ms %.1f wait_ms %.3f compute_ms %.3f "
        "shadow %d meanwhile %d cut %d crowded %d | accept %.2f guess_ms %.1f holds %.1f plain_n %d | k:wait_ms/tok_s",
        seq, t->k, t->kept, t->drafted, t->draft_s * 1e3, t->wait_s * 1e3, t->compute_s * 1e3, t->shadow, t->meanwhile,
        t->cut, t->crowded, accept(a), guess_s(a) * 1e3, holds(a), a->n[0]);
    for (int k = 0; k <= PS_SPEC_AUTO_MAX && k <= k_max && n < (int)sizeof line; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %d:%.1f/%.1f", k, wait_at(a, k) * 1e3, rate(a, k));
    int next = ps_spec_auto_k(a, k_max);
    if (n < (int)sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, " | next %d reach %d", next, ps_spec_auto_reach(a, next, k_max));
    fprintf(stderr, "%s\n", line);
}
