/* spec.c - drafting for speculative decoding (spec.h). */
#include "spec.h"

#include <math.h>
#include <string.h>

#define AUTO_DECAY   0.95 /* weight of the guesses counted before the latest trip */
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

/* Expected tokens of a trip of k guesses each kept with probability a, in a row. */
static double tokens_per_trip(double a, int k) { return a >= 1 ? k + 1 : (1 - pow(a, k + 1)) / (1 - a); }

int ps_spec_auto_k(const ps_spec_auto *a, int k_max) {
    if (k_max < 1 || a->t_plain <= 0) return 0; /* a plain trip first: its time is the yardstick */
    if (a->kept + a->stopped == 0 || a->plain_run >= AUTO_EXPLORE) return k_max < 2 ? k_max : 2;
    double p = (a->kept + 1) / (a->kept + a->stopped + 2); /* a guess's chance, with a uniform prior */
    int best = 0;
    double best_rate = 1 / a->t_plain;
    for (int k = 1; k <= k_max; k++) {
        double rate = tokens_per_trip(p, k) / (a->t_plain + k * a->t_row);
        if (rate > best_rate * 1.02) best = k, best_rate = rate; /* 2 %: a tie goes to fewer guesses */
    }
    return best;
}

/* An exponential moving average: old, or v for the first value. */
static double ema(double old, double v) { return old > 0 ? TIME_DECAY * old + (1 - TIME_DECAY) * v : v; }

void ps_spec_auto_add(ps_spec_auto *a, int k, int kept, double seconds) {
    if (k == 0) {
        a->t_plain = ema(a->t_plain, seconds);
        a->plain_run++;
        return;
    }
    a->plain_run = 0;
    a->kept = AUTO_DECAY * a->kept + kept;
    a->stopped = AUTO_DECAY * a->stopped + (kept < k);
    if (a->t_plain > 0) a->t_row = ema(a->t_row, fmax(0, seconds - a->t_plain) / k);
}
