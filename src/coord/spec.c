/* spec.c - drafting for speculative decoding (spec.h). */
#include "spec.h"

#include <string.h>

#define TIME_DECAY   0.75 /* weight of the times measured before the latest trip (a slow one fades fast) */
#define AUTO_EXPLORE 16   /* plain trips in a row before a trip of guesses measures again */

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

/* The K whose trips gave the most tokens per second (0: plain decoding), among 0..k_max. */
static int best_k(const ps_spec_auto *a, int k_max) {
    int best = 0;
    for (int k = 1; k <= k_max && k <= PS_SPEC_AUTO_MAX; k++)
        if (a->rate[k] > a->rate[best] * 1.02) best = k; /* 2 %: a tie goes to fewer guesses */
    return best;
}

int ps_spec_auto_k(const ps_spec_auto *a, int k_max) {
    if (k_max > PS_SPEC_AUTO_MAX) k_max = PS_SPEC_AUTO_MAX;
    if (k_max < 1 || a->rate[0] <= 0) return 0; /* a plain trip first: the yardstick */
    int best = best_k(a, k_max), two = k_max < 2 ? k_max : 2;
    bool tried = false;
    for (int k = 1; k <= k_max; k++) tried |= a->rate[k] > 0;
    if (!tried || (best == 0 && a->plain_run >= AUTO_EXPLORE)) return two;
    if (best == 0 && a->last_k > 0 && a->streak < PS_SPEC_TRIAL) return a->last_k; /* a trial runs on */
    if (best == 0 || a->since_move < PS_SPEC_EXPLORE) return best;
    int n = best + (a->dir < 0 ? -1 : 1);
    return n < 1 ? 1 : n > k_max ? k_max : n;
}

/* An exponential moving average: old, or v for the first value. */
static double ema(double old, double v) { return old > 0 ? TIME_DECAY * old + (1 - TIME_DECAY) * v : v; }

void ps_spec_auto_add(ps_spec_auto *a, int k, int kept, double seconds) {
    if (k < 0 || k > PS_SPEC_AUTO_MAX || !(seconds > 0)) return;
    a->rate[k] = ema(a->rate[k], (kept + 1) / seconds);
    a->plain_run = k ? 0 : a->plain_run + 1;
    a->streak = k == a->last_k ? a->streak + 1 : 1, a->last_k = k;
    if (a->since_move < PS_SPEC_EXPLORE) {
        a->since_move++;
        return;
    }
    a->since_move = 0; /* that was a neighbour: go on that way while it becomes the best */
    if (best_k(a, PS_SPEC_AUTO_MAX) != k) a->dir = a->dir < 0 ? 1 : -1;
}
