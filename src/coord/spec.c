/* spec.c - drafting for speculative decoding (spec.h). */
#include "spec.h"

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

#define AUTO_DECAY    0.75 /* weight of a K's trip times before its latest (a slow one fades fast) */
#define AUTO_ACCEPT   0.97 /* ... and of the guesses before the latest trip's, for the acceptance */
#define AUTO_PROBE    2    /* trips that measure a K */
#define AUTO_AROUND   16   /* trips at a K > 0 between measures of a neighbour */
#define AUTO_WAIT     16   /* plain trips before guesses are measured again; 4 times more while they lose */
#define AUTO_WAIT_MAX 256

/* The rate of K (spec.h): its tokens per trip at the acceptance measured so far, in its trips'
 * time: measured, else that of the K > 0 measured nearest below it (a trip never gets faster
 * with more guesses) plus, when a second K > 0 is measured below that, the cost of each guess
 * between the two (a draft that costs much a guess does not double K on a bound alone), or of
 * the one above (what a trip of guesses costs at least, mostly), or plain decoding's before any. */
static double rate(const ps_spec_auto *a, int k) {
    double acc = (a->kept + 0.5) / (a->tested + 1), tokens = 1, p = 1; /* 1/2 before any guess */
    for (int i = 0; i < k; i++) tokens += p *= acc;
    if (a->n[k] > 0) return tokens / a->sec[k];
    int lo = k - 1, hi = k + 1;
    while (lo > 0 && a->n[lo] == 0) lo--;
    while (hi <= PS_SPEC_AUTO_MAX && a->n[hi] == 0) hi++;
    double t = lo > 0 ? a->sec[lo] : hi <= PS_SPEC_AUTO_MAX ? a->sec[hi] : a->sec[0];
    if (lo > 0 && hi > PS_SPEC_AUTO_MAX) {
        int lo2 = lo - 1;
        while (lo2 > 0 && a->n[lo2] == 0) lo2--;
        if (lo2 > 0 && a->sec[lo] > a->sec[lo2]) t += (k - lo) * (a->sec[lo] - a->sec[lo2]) / (lo - lo2);
    }
    return tokens / t;
}

/* The K of the highest rate among 0..k_max, 2 % above the others (a tie takes fewer guesses):
 * among those measured, or also those that may be tried next: the neighbours of the best one
 * measured, and twice the most measured (K doubles while guesses would pay, then settles by
 * steps). */
static int best_k(const ps_spec_auto *a, int k_max, bool measured_only) {
    int best = 0, most = 0;
    for (int k = 1; k <= k_max; k++) {
        if (a->n[k] > 0 && rate(a, k) > rate(a, best) * 1.02) best = k;
        if (a->n[k] > 0) most = k;
    }
    if (measured_only) return best;
    int next[3] = {best - 1, best + 1, most ? (2 * most < k_max ? 2 * most : k_max) : 2};
    for (int i = 0; i < 3; i++)
        if (next[i] >= 1 && next[i] <= k_max && a->n[next[i]] == 0 && rate(a, next[i]) > rate(a, best) * 1.02)
            best = next[i];
    return best;
}

int ps_spec_auto_k(const ps_spec_auto *a, int k_max) {
    if (k_max > PS_SPEC_AUTO_MAX) k_max = PS_SPEC_AUTO_MAX;
    if (k_max < 1 || a->n[0] == 0) return 0; /* a plain trip first: the yardstick */
    int last = a->last_k;
    if (last > 0 && last <= k_max && a->n[last] < AUTO_PROBE) return last; /* a measure runs on */
    bool measured = false;                                                 /* any K > 0 */
    for (int k = 1; k <= PS_SPEC_AUTO_MAX; k++) measured |= a->sec[k] > 0;
    if (!measured) return k_max < 2 ? k_max : 2; /* the first guesses: a few */
    int best = best_k(a, k_max, false);
    if (best > 0 && a->n[best] == 0) return best; /* it may pay: measure it */
    if (best == 0) {
        if (a->plain_run < (a->wait ? a->wait : AUTO_WAIT)) return 0;
        for (int k = 1; k <= k_max; k++) /* again, the K measured that came closest */
            if (a->n[k] > 0 && (best == 0 || rate(a, k) > rate(a, best))) best = k;
        return best ? best : 1;
    }
    if (a->since_probe < AUTO_AROUND) return best;
    int side = a->side < 0 ? -1 : 1, k = best + side;
    return k >= 1 && k <= k_max ? k : best - side >= 1 && best - side <= k_max ? best - side : best;
}

void ps_spec_auto_add(ps_spec_auto *a, int k, int kept, double seconds) {
    if (k < 0 || k > PS_SPEC_AUTO_MAX || kept < 0 || kept > k || !(seconds > 0)) return;
    if (k > 0) { /* each guess checked: kept, or the one that ended the trip */
        a->tested = AUTO_ACCEPT * a->tested + kept + (kept < k);
        a->kept = AUTO_ACCEPT * a->kept + kept;
    }
    if (k > a->last_k && a->n[0] > 0) { /* more guesses than the trip before: drafted while it waited, */
        a->n[k] = 0;                    /* the draft catching up: measured afresh, from the next trip */
    } else {
        a->n[k]++; /* the mean of the first trips, then a moving average */
        double w = 1.0 / a->n[k] > 1 - AUTO_DECAY ? 1.0 / a->n[k] : 1 - AUTO_DECAY;
        a->sec[k] += (seconds - a->sec[k]) * w;
    }
    if (k == 0 && a->last_k > 0) /* back to plain: after guesses that did not pay from the start, wait longer */
        a->wait = a->spec_run <= 2 * (AUTO_PROBE + 1) ? (a->wait ? 4 * a->wait : 4 * AUTO_WAIT) : AUTO_WAIT;
    if (a->wait > AUTO_WAIT_MAX) a->wait = AUTO_WAIT_MAX;
    a->plain_run = k ? 0 : a->plain_run + 1;
    a->spec_run = k ? a->spec_run + 1 : 0;
    if (k > 0 && k != best_k(a, PS_SPEC_AUTO_MAX, true) && a->n[k] >= AUTO_PROBE && a->last_k == k) {
        a->since_probe = 0; /* a neighbour measured: the other side next time */
        a->side = a->side < 0 ? 1 : -1;
    } else if (k > 0) {
        a->since_probe++;
    }
    a->last_k = k;
}
