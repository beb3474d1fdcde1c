/* sample.c - Philox4x32-10 and the sampler chain (see sample.h for the contract).
 *
 * Candidates are kept as 64-bit keys (~order(logit) << 32 | id): ascending key order
 * is exactly the draw order (logit descending, ties by lower id), keys are distinct,
 * and integer sorting or selection gives a deterministic result. ps_sample sorts at
 * most a few keys: top-k is a heap (small k) or a quickselect, and top-p and the draw
 * are a *weighted* quickselect, which finds the candidate where the cumulative weight
 * in draw order crosses a target in expected O(n) (partition, sum the weights of the
 * smaller side, descend into the side that holds the crossing); where every token is a
 * candidate, first among the few that usually hold the crossing (LEVELS). Weights are
 * fmath.h's exponent, 16 tokens at a time. */
#include "sample.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/fmath.h"
#include "../tensor/vec8.h"

// ---- Philox4x32-10 ----------------------------------------------------------------

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* Weyl key increments (golden ratio, sqrt(3) - 1) */
#define PHILOX_W1 0xBB67AE85u

/* One Philox round: two 32x32->64 multiplies whose halves are mixed with the key. */
static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0];
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = (uint32_t)p1;
    c[2] = n2;
    c[3] = (uint32_t)p0;
}

/* Ten rounds, bumping the key before every round but the first (Random123's order). */
void ps_rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(c, k);
    }
    memcpy(out, c, sizeof c);
}

/* The counter/key layout documented in sample.h. */
uint64_t ps_rng_u64(uint64_t seed, uint64_t position, uint32_t stream) {
    const uint32_t ctr[4] = {(uint32_t)position, (uint32_t)(position >> 32), stream, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    ps_rng_philox4x32_10(ctr, key, out);
    return (uint64_t)out[0] << 32 | out[1];
}

/* 53 high bits scaled into [0, 1): every value is a multiple of 2^-53, never 1. */
double ps_rng_uniform(uint64_t seed, uint64_t position, uint32_t stream) {
    return (double)(ps_rng_u64(seed, position, stream) >> 11) * 0x1p-53;
}

// ---- parameters -------------------------------------------------------------------

ps_sample_params ps_sample_params_default(void) {
    ps_sample_params p = {
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .penalty_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

ps_sample_params ps_sample_params_cli(void) {
    ps_sample_params p = ps_sample_params_default();
    p.temperature = 0.8f, p.top_k = 40, p.top_p = 0.95f, p.min_p = 0.05f;
    return p;
}

/* Comparisons are written so that NaN fails every range check. */
ps_status ps_sample_params_check(const ps_sample_params *p, char *err, size_t errlen) {
    const ps_status e = PS_ERR_ARG;
    if (!p) return ps_errf(err, errlen, e, "sampling parameters are NULL");
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return ps_errf(err, errlen, e, "temperature %g must be a finite number >= 0 (0 = greedy)", p->temperature);
    if (p->top_k < 0) return ps_errf(err, errlen, e, "top_k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return ps_errf(err, errlen, e, "top_p %g must be in (0, 1] (1 = off)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ps_errf(err, errlen, e, "min_p %g must be in [0, 1] (0 = off)", p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return ps_errf(err, errlen, e, "repetition_penalty %g must be a finite number > 0 (1 = off)",
                       p->repetition_penalty);
    if (p->penalty_last_n < -1)
        return ps_errf(err, errlen, e, "penalty_last_n %d must be >= -1 (-1 = whole history, 0 = off)",
                       p->penalty_last_n);
    if (!isfinite(p->presence_penalty))
        return ps_errf(err, errlen, e, "presence_penalty %g must be finite", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return ps_errf(err, errlen, e, "frequency_penalty %g must be finite", p->frequency_penalty);
    return PS_OK;
}

// ---- sampler state ----------------------------------------------------------------

/* Where every finite token is a candidate (no top-k, the API's default), ps_sample's draw and
 * top-p first look among the tokens of weight at least e^-8, then e^-16 of the best's: the
 * crossing is usually among the first (SmolLM2-135M at T = 1: 97 % of the mass in some 150
 * of 49,152 tokens; 99.99 % within e^-16), and then only those get keys and weights. */
#define LEVELS   2
#define LIST_CAP 4096 /* level 0's tokens weigh_all lists as it goes */
static const float level_x[LEVELS] = {-8.0f, -16.0f};
static const float level_w[LEVELS] = {3.3546262790e-4f, 1.1253517472e-7f}; /* e^level_x */

/* What the lazy weighing pass learns besides the sum. */
struct levels {
    float sum[LEVELS]; // the sums of the weights of at least level_w[k] (a guide)
    int32_t *list;     // the tokens of level 0, in id order (LIST_CAP)
    int32_t n_list;    // their number; -1: more than LIST_CAP (a flat distribution)
    int32_t w_from;    // then w[] holds the weights of the tokens from w_from on (n_vocab: none)
};

struct ps_sampler {
    int32_t n_vocab;
    float *logit;     // (n_vocab) penalised copy of the caller's logits
    const float *lg;  // the logits the chain reads: logit, or the caller's where no penalty applies
    uint64_t *key;    // (n_vocab) candidate keys, [0, n_cand) live
    float *w;         // (n_vocab) by token id: weight() of a live candidate (of every token after weigh_all)
    int32_t *count;   // (n_vocab) by token id: occurrences in the penalty window; 0 between calls
    int32_t *touched; // (n_vocab) ids whose count is non-zero, in first-seen order
    int32_t *out_id;  // (n_vocab) ps_sample_dist's ids
    float *out_p;     // (n_vocab) ps_sample_dist's probabilities
    int32_t n_cand;   // live candidates, key[0, n_cand) (unless lazy)
    bool all;         // every finite token is a candidate
    bool lazy;        // ... and neither key[] nor w[] is built (ps_sample's draw builds what it needs)
    float max, inv;   // lazy: the weights' max logit and 1 / temperature (weigh's)
    struct levels lv; // lazy: what weigh's pass learned
    double max_logit; // the largest finite logit (truncation never removes its token)
    char err[256];
};

/* Records a message for ps_sampler_error and returns st. */
static ps_status fail(ps_sampler *s, ps_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ps_status fail(ps_sampler *s, ps_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return st;
}

/* One allocation of n elements of size sz; count is zeroed (it must start at 0). */
static void *alloc_n(int32_t n, size_t sz) { return ps_calloc((size_t)n, sz); }

ps_status ps_sampler_create(int32_t n_vocab, ps_sampler **out, char *err, size_t errlen) {
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_sampler_create: out is NULL");
    *out = NULL;
    if (n_vocab < 1) return ps_errf(err, errlen, PS_ERR_ARG, "vocabulary size %d must be >= 1", n_vocab);
    ps_sampler *s = ps_calloc(1, sizeof *s);
    if (!s) goto err;
    s->n_vocab = n_vocab;
    s->logit = alloc_n(n_vocab, sizeof *s->logit);
    s->key = alloc_n(n_vocab, sizeof *s->key);
    s->w = alloc_n(n_vocab, sizeof *s->w);
    s->count = alloc_n(n_vocab, sizeof *s->count);
    s->touched = alloc_n(n_vocab, sizeof *s->touched);
    s->out_id = alloc_n(n_vocab, sizeof *s->out_id);
    s->out_p = alloc_n(n_vocab, sizeof *s->out_p);
    s->lv.list = alloc_n(LIST_CAP, sizeof *s->lv.list);
    if (!s->logit || !s->key || !s->w || !s->count || !s->touched || !s->out_id || !s->out_p || !s->lv.list) goto err;
    *out = s;
    return PS_OK;
err:
    ps_sampler_free(s);
    return ps_errf(err, errlen, PS_ERR_NOMEM, "no memory for a sampler over %d tokens", n_vocab);
}

void ps_sampler_free(ps_sampler *s) {
    if (!s) return;
    free(s->logit);
    free(s->key);
    free(s->w);
    free(s->count);
    free(s->touched);
    free(s->out_id);
    free(s->out_p);
    free(s->lv.list);
    free(s);
}

int32_t ps_sampler_n_vocab(const ps_sampler *s) { return s->n_vocab; }

const char *ps_sampler_error(const ps_sampler *s) { return s ? s->err : "sampler is NULL"; }

// ---- candidate keys and selection ---------------------------------------------------

/* Maps a float (not NaN) to a uint32 whose unsigned order is the float's order;
 * -0 and +0 map alike. */
static uint32_t float_order(float f) {
    uint32_t b;
    f = f + 0.0f; /* -0 + 0 = +0; branch-free on random signs */
    memcpy(&b, &f, sizeof b);
    uint32_t neg = (uint32_t) - (int32_t)(b >> 31); /* all ones when negative */
    return b ^ (neg | 0x80000000u);
}

static uint64_t cand_key(float logit, int32_t id) { return (uint64_t)(~float_order(logit)) << 32 | (uint32_t)id; }

static int32_t key_id(uint64_t k) { return (int32_t)(uint32_t)k; }

/* The logit of live candidate j. */
static double cand_logit(const ps_sampler *s, int32_t j) { return s->lg[key_id(s->key[j])]; }

static void swap_u64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Restores the max-heap property of h[0, n) below index i. */
static void sift_down(uint64_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && h[c + 1] > h[c]) c++;
        if (h[c] <= h[i]) return;
        swap_u64(&h[c], &h[i]);
        i = c;
    }
}

/* Sorts a[0, n) ascending in place. Heapsort: unlike the C library's sort it never
 * allocates (glibc's merge sort mallocs a buffer), and it is O(n log n) always. */
static void sort_keys(uint64_t *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(a, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        swap_u64(&a[0], &a[end]);
        sift_down(a, end, 0);
    }
}

/* 2 log2(n) + 8: partitions allowed before a selection gives up and sorts the rest,
 * which bounds the worst case by O(n log n). */
static int select_depth(int32_t n) {
    int depth = 8;
    for (int32_t x = n; x > 1; x >>= 1) depth += 2;
    return depth;
}

/* Partitions a[lo, hi) (hi - lo >= 3, distinct keys) around the median of its first,
 * middle and last keys; returns the pivot's final index p: a[lo, p) < a[p] < a(p, hi).
 * When w is non-NULL, *left gets the sum of w[id] over a[lo, p), in array order. */
static int32_t partition(uint64_t *a, int32_t lo, int32_t hi, const float *w, double *left) {
    int32_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (a[mid] < a[lo]) swap_u64(&a[mid], &a[lo]);
    if (a[last] < a[lo]) swap_u64(&a[last], &a[lo]);
    if (a[mid] < a[last]) swap_u64(&a[mid], &a[last]);
    const uint64_t pivot = a[last];
    int32_t p = lo;
    double sum = 0.0;
    for (int32_t i = lo; i < last; i++) { /* branch-free Lomuto: always swap, advance if smaller */
        uint64_t x = a[i];
        int lt = x < pivot;
        a[i] = a[p];
        a[p] = x;
        p += lt;
        if (w) sum += (double)w[key_id(x)] * lt; /* weights are finite: w * 0 == 0 */
    }
    swap_u64(&a[p], &a[last]);
    if (left) *left = sum;
    return p;
}

/* Reorders a[0, n) so that a[0, m) holds its m smallest keys, in no particular order
 * (0 < m < n). Quickselect. Deterministic. */
static void select_smallest(uint64_t *a, int32_t n, int32_t m) {
    int32_t lo = 0, hi = n, depth = select_depth(n);
    while (hi - lo > 16 && depth-- > 0) {
        int32_t p = partition(a, lo, hi, NULL, NULL);
        if (p == m || p == m - 1) return;
        if (p < m)
            lo = p + 1;
        else
            hi = p;
    }
    sort_keys(a + lo, hi - lo);
}

/* Whether a cumulative weight has reached target: cum > target when strict (the
 * inverse CDF), cum >= target otherwise (top-p). */
static bool reaches(double cum, double target, bool strict) { return strict ? cum > target : cum >= target; }

/* Weighted quickselect over the live keys: finds j such that, in draw order, the
 * cumulative weight (s->w by id) of the first j + 1 candidates reaches target and that
 * of the first j does not. Reorders key[] so that key[0, j] are the j + 1 smallest
 * keys and key[j] the largest of them; returns j, or -1 when the total weight stays
 * short of target (rounding only). Expected O(n_cand). */
static int32_t weighted_select(ps_sampler *s, double target, bool strict) {
    uint64_t *a = s->key;
    int32_t lo = 0, hi = s->n_cand, depth = select_depth(s->n_cand);
    double base = 0.0; /* weight of a[0, lo), all smaller than a[lo, hi) */
    while (hi - lo > 16 && depth-- > 0) {
        double left;
        int32_t p = partition(a, lo, hi, s->w, &left);
        if (reaches(base + left, target, strict)) {
            hi = p;
            continue;
        }
        base += left;
        base += s->w[key_id(a[p])];
        if (reaches(base, target, strict)) return p;
        lo = p + 1;
    }
    sort_keys(a + lo, hi - lo);
    for (int32_t j = lo; j < hi; j++) {
        base += s->w[key_id(a[j])];
        if (reaches(base, target, strict)) return j;
    }
    return -1;
}

// ---- penalties ----------------------------------------------------------------------

static bool penalties_off(const ps_sample_params *p) {
    return p->penalty_last_n == 0 ||
           (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f);
}

/* llama.cpp's penalty for a token seen c > 0 times: the repetition penalty scales the
 * logit towards (below) zero, then OpenAI's frequency and presence terms subtract. */
static float penalise(float l, int32_t c, const ps_sample_params *p) {
    if (l <= 0.0f)
        l *= p->repetition_penalty;
    else
        l /= p->repetition_penalty;
    return l - ((float)c * p->frequency_penalty + (float)(c > 0) * p->presence_penalty);
}

/* Applies the penalties of p over the last penalty_last_n tokens of history to
 * s->logit. Leaves count[] all zero again, on success and on failure. */
static ps_status apply_penalties(ps_sampler *s, const ps_sample_params *p, const int32_t *history, int64_t n_history) {
    int64_t n = p->penalty_last_n < 0 || n_history < p->penalty_last_n ? n_history : p->penalty_last_n;
    const int32_t *win = history + (n_history - n);
    if (n > INT32_MAX) return fail(s, PS_ERR_RANGE, "penalty window of %lld tokens is too long", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (win[i] < 0 || win[i] >= s->n_vocab)
            return fail(s, PS_ERR_ARG, "history[%lld] = %d is not a token id in [0, %d)",
                        (long long)(n_history - n + i), win[i], s->n_vocab);
    int32_t n_touched = 0;
    for (int64_t i = 0; i < n; i++)
        if (s->count[win[i]]++ == 0) s->touched[n_touched++] = win[i];
    ps_status st = PS_OK;
    for (int32_t i = 0; i < n_touched; i++) {
        int32_t t = s->touched[i];
        float l = penalise(s->logit[t], s->count[t], p);
        s->count[t] = 0;
        if ((isnan(l) || l == INFINITY) && st == PS_OK)
            st = fail(s, PS_ERR_ARG, "the penalties turned the logit of token %d into %g", t, l);
        s->logit[t] = l;
    }
    return st;
}

// ---- the chain ----------------------------------------------------------------------

/* The error for the first NaN or +inf among logits (there is one). */
static ps_status bad_logit(ps_sampler *s, const float *logits) {
    int32_t i = 0;
    while (logits[i] < INFINITY) i++;
    return fail(s, PS_ERR_ARG, "logit of token %d is %s; logits must be finite or -inf", i,
                isnan(logits[i]) ? "NaN" : "+inf");
}

/* Rejects NaN and +inf logits (one branch-free pass; the culprit is looked for only when
 * there is one). */
PS_SIMD_CLONES static ps_status check_logits(ps_sampler *s, const float *logits) {
    int bad = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) bad |= !(logits[i] < INFINITY);
    return bad ? bad_logit(s, logits) : PS_OK;
}

/* Puts every token with a finite logit into key[] (in id order); there is at least one
 * (see argmax). Without -inf logits (the usual case) a loop the compiler makes vector
 * instructions of. */
PS_SIMD_CLONES static void collect_candidates(ps_sampler *s) {
    int32_t n = 0, nv = s->n_vocab;
    uint64_t *key = s->key;
    const float *logit = s->lg;
    bool finite = true;
    for (int32_t i = 0; i < nv; i++) finite &= logit[i] != -INFINITY;
    if (finite)
        for (int32_t i = 0; i < nv; i++) key[i] = cand_key(logit[i], i);
    for (int32_t i = 0; !finite && i < nv; i++) {
        key[n] = cand_key(logit[i], i);
        n += logit[i] != -INFINITY;
    }
    s->n_cand = finite ? nv : n;
    s->all = true, s->lazy = false;
}

/* The greedy token: the largest logit, the lowest id among ties. Fails when every
 * logit is -inf. Also sets s->max_logit. ARGMAX_LANES running maxima side by side (lane l
 * the ids l, l + ARGMAX_LANES, ...: each keeps its first maximum), then the lanes' best,
 * the lowest id among equal values: the same token as one sequential pass, in a loop the
 * compiler makes vector instructions of (the logits hold no NaN here: check_logits). */
#define ARGMAX_LANES 16
PS_SIMD_CLONES static ps_status argmax(ps_sampler *s, int32_t *out) {
    const float *lg = s->lg;
    float m[ARGMAX_LANES];
    int32_t at[ARGMAX_LANES];
    for (int l = 0; l < ARGMAX_LANES; l++) m[l] = -INFINITY, at[l] = 0;
    int32_t i = 0, n = s->n_vocab;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int l = 0; l < ARGMAX_LANES; l++) {
            bool more = lg[i + l] > m[l];
            m[l] = more ? lg[i + l] : m[l];
            at[l] = more ? i + l : at[l];
        }
    int32_t best = 0;
    float bl = -INFINITY;
    for (int l = 0; l < ARGMAX_LANES; l++)
        if (m[l] > bl || (m[l] == bl && at[l] < best)) bl = m[l], best = at[l];
    for (; i < n; i++)
        if (lg[i] > bl) bl = lg[i], best = i;
    if (bl == -INFINITY) return fail(s, PS_ERR_ARG, "every logit is -inf: no token can be sampled");
    s->max_logit = bl;
    *out = best;
    return PS_OK;
}

/* Validates the call, copies and penalises the logits, and finds the argmax. */
static ps_status prepare(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                         int64_t n_history, int32_t *best) {
    s->err[0] = '\0';
    ps_status st = ps_sample_params_check(p, s->err, sizeof s->err);
    if (st) return st;
    if (!logits) return fail(s, PS_ERR_ARG, "logits are NULL");
    if (n_history < 0 || (n_history > 0 && !history))
        return fail(s, PS_ERR_ARG, "history of %lld tokens is %s", (long long)n_history, history ? "negative" : "NULL");
    if ((st = check_logits(s, logits))) return st;
    s->lg = logits;
    if (!penalties_off(p) && n_history > 0) { /* a copy to change */
        memcpy(s->logit, logits, (size_t)s->n_vocab * sizeof *logits);
        if ((st = apply_penalties(s, p, history, n_history))) return st;
        s->lg = s->logit;
    }
    return argmax(s, best);
}

/* Puts the k best finite tokens into key[0, n_cand) straight from the logits, with a
 * max-heap of the k smallest keys seen so far: about one comparison per token, for
 * small k. */
static void top_k_heap(ps_sampler *s, int32_t k) {
    uint64_t *h = s->key;
    const float *lg = s->lg;
    int32_t n = 0, nv = s->n_vocab;
    float low = INFINITY; /* once the heap is full: its worst logit; a token below it stays out */
    for (int32_t i = 0; i < nv; i++) {
        if (n == k && i % 16 == 0 && i + 16 <= nv) { /* 16 at a time: none can enter, the usual case */
            bool any = false;
            for (int l = 0; l < 16; l++) any |= lg[i + l] >= low;
            if (!any) {
                i += 15;
                continue;
            }
        }
        if (lg[i] == -INFINITY) continue;
        uint64_t key = cand_key(lg[i], i);
        if (n < k) {
            h[n++] = key;
            if (n == k) {
                for (int32_t j = k / 2 - 1; j >= 0; j--) sift_down(h, k, j);
                low = lg[key_id(h[0])];
            }
        } else if (key < h[0]) {
            h[0] = key;
            sift_down(h, k, 0);
            low = lg[key_id(h[0])];
        }
    }
    s->n_cand = n, s->all = s->lazy = false;
}

/* Collects the candidates and keeps the k best (k = 0: all, lazily): a heap for small k,
 * else a quickselect over all candidates. */
static void collect_top_k(ps_sampler *s, int32_t k) {
    if (k <= 0) {
        s->all = s->lazy = true;
        return;
    }
    if (k <= s->n_vocab / 16) {
        top_k_heap(s, k);
        return;
    }
    collect_candidates(s);
    if (k >= s->n_cand) return;
    select_smallest(s->key, s->n_cand, k);
    s->n_cand = k, s->all = false;
}

/* A candidate's weight e^((logit - max) / T), inv = 1 / T (at most FLT_MAX: a temperature
 * below 1 / FLT_MAX keeps the best alone), with fmath.h's exponent: the same bits on every
 * machine (libm's exp is not), within 2 ulp. */
static float weight(float logit, float max, float inv) { return ps_exp_neg((logit - max) * inv); }
static float inverse(float temperature) { return fminf(1.0f / temperature, FLT_MAX); }

typedef double ps_vd16 __attribute__((vector_size(128)));

/* weight() of every token (-inf: 0), 16 tokens at a time (ps_exp_neg16 gives weight()'s
 * bits), into w when given; returns their sum: each lane's in double, in id order, then the
 * lanes' in turn. With lv (the lazy pass): its sums and level 0's list, and, once the list
 * overflows, the weights from there on into w. */
PS_SIMD_CLONES static double weigh_all(const float *logit, int32_t n, float max, float inv, float *w,
                                       struct levels *lv) {
    ps_vd16 z16 = {0};
    ps_vf16 lv0 = {0}, lv1 = {0};
    int32_t i = 0, nl = 0, from = n;
    bool store = !lv;
    for (; i + 16 <= n; i += 16) {
        ps_vf16 e = ps_exp_neg16((ps_load16(logit + i) - max) * inv);
        z16 += __builtin_convertvector(e, ps_vd16);
        if (store) memcpy(w + i, &e, sizeof e);
        if (!lv) continue;
        ps_vi16 in0 = e >= level_w[0];
        lv0 += ps_select16(in0, e, (ps_vf16){0});
        lv1 += ps_select16(e >= level_w[1], e, (ps_vf16){0});
        uint64_t any[8], some = 0;
        memcpy(any, &in0, sizeof any);
        for (int l = 0; l < 8; l++) some |= any[l];
        if (!store && some) /* rare where the distribution has a head */
            for (int l = 0; l < 16 && !store; l++) {
                if (!in0[l]) continue;
                if (nl < LIST_CAP)
                    lv->list[nl++] = i + l;
                else
                    store = true, from = i + 16; /* a flat distribution: the weights from here on */
            }
    }
    double z = 0.0;
    for (int l = 0; l < 16; l++) z += z16[l];
    for (int k = 0; lv && k < LEVELS; k++) {
        lv->sum[k] = 0.0f;
        for (int l = 0; l < 16; l++) lv->sum[k] += k ? lv1[l] : lv0[l];
    }
    for (; i < n; i++) {
        float e = weight(logit[i], max, inv);
        z += e;
        if (store) w[i] = e;
        for (int k = 0; lv && k < LEVELS; k++) lv->sum[k] += e >= level_w[k] ? e : 0.0f;
        if (lv && !store && e >= level_w[0]) {
            if (nl < LIST_CAP)
                lv->list[nl++] = i;
            else
                store = true, from = i + 1;
        }
    }
    if (lv) lv->n_list = store ? -1 : nl, lv->w_from = from;
    return z;
}

/* Sets w[id] = weight() for every live candidate and returns their sum (in key[] order, or
 * weigh_all's where every finite token is one: either way ps_sample and ps_sample_dist
 * agree). Lazy: the sum and the levels (struct levels), and every weight only for a flat
 * distribution; the others come with the keys a draw needs. */
static double weigh(ps_sampler *s, float temperature) {
    const float max = (float)s->max_logit, inv = inverse(temperature);
    if (s->lazy) {
        s->max = max, s->inv = inv;
        return weigh_all(s->lg, s->n_vocab, max, inv, s->w, &s->lv);
    }
    if (s->all) return weigh_all(s->lg, s->n_vocab, max, inv, s->w, NULL);
    double z = 0.0;
    for (int32_t j = 0; j < s->n_cand; j++) {
        int32_t id = key_id(s->key[j]);
        z += s->w[id] = weight(s->lg[id], max, inv);
    }
    return z;
}

/* Makes token i a candidate with weight e. */
static void take(ps_sampler *s, int32_t i, float e) {
    s->w[i] = e;
    s->key[s->n_cand++] = cand_key(s->lg[i], i);
}

/* Lazy: the candidates of level k (keys and weights, in id order): level 0's from its list,
 * level 1's from the tokens whose logit can reach it (a nat of margin for the rounding). */
static void collect_level(ps_sampler *s, int k) {
    const float max = s->max, inv = s->inv;
    s->n_cand = 0;
    if (k == 0) {
        for (int32_t j = 0; j < s->lv.n_list; j++) take(s, s->lv.list[j], weight(s->lg[s->lv.list[j]], max, inv));
        return;
    }
    const float below = max + (level_x[k] - 1.0f) / inv;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (s->lg[i] >= below) {
            float e = weight(s->lg[i], max, inv);
            if (e >= level_w[k]) take(s, i, e);
        }
}

/* Builds key[] where the candidates are still every finite token without keys. */
static void materialize(ps_sampler *s) {
    if (s->lazy) collect_candidates(s);
}

/* weighted_select after weigh(). Lazy: first among the tokens of the first level whose
 * weights pass target, then among all (at once where level 0 holds more than LIST_CAP
 * tokens: a flat distribution). */
static int32_t select_weighing(ps_sampler *s, double target, bool strict) {
    for (int k = 0; s->lazy && s->lv.n_list >= 0 && k < LEVELS; k++)
        if ((double)s->lv.sum[k] > target) {
            collect_level(s, k);
            int32_t j = weighted_select(s, target, strict);
            if (j >= 0) {
                s->lazy = s->all = false;
                return j;
            }
        }
    if (s->lazy) { /* the weights the lazy pass did not store */
        collect_candidates(s);
        weigh_all(s->lg, s->lv.w_from, s->max, s->inv, s->w, NULL);
    }
    return weighted_select(s, target, strict);
}

/* Keeps the shortest prefix (in draw order) whose probability at temperature 1 is at
 * least top_p, as llama.cpp does (the token that crosses top_p is kept). */
static void apply_top_p(ps_sampler *s, float top_p) {
    if (top_p >= 1.0f) return;
    double z = weigh(s, 1.0f);
    int32_t j = select_weighing(s, (double)top_p * z, false);
    if (j >= 0) s->n_cand = j + 1;
    s->all = s->lazy = false;
}

/* Keeps the candidates whose probability is at least min_p times the best one's,
 * i.e. logit >= max_logit + log(min_p), in their current order (id order where every
 * token was one). */
static void apply_min_p(ps_sampler *s, float min_p) {
    if (min_p <= 0.0f) return;
    const double thr = s->max_logit + log((double)min_p);
    int32_t out = 0;
    if (s->lazy)
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (s->lg[i] >= thr) s->key[out++] = cand_key(s->lg[i], i);
    for (int32_t j = 0; !s->lazy && j < s->n_cand; j++)
        if (cand_logit(s, j) >= thr) s->key[out++] = s->key[j];
    s->n_cand = out, s->all = s->lazy = false;
}

/* Collects the candidates and applies top-k, top-p and min-p, in that order. */
static void truncate_candidates(ps_sampler *s, const ps_sample_params *p) {
    collect_top_k(s, p->top_k);
    apply_top_p(s, p->top_p);
    apply_min_p(s, p->min_p);
}

/* The inverse CDF at u over the weighted candidates (total z). Should rounding leave
 * u * z at or above the total, the last candidate of non-zero weight is taken. */
static int32_t draw(ps_sampler *s, double z, double u) {
    int32_t j = select_weighing(s, u * z, true);
    if (j >= 0) return key_id(s->key[j]);
    uint64_t last = 0;
    for (int32_t i = 0; i < s->n_cand; i++)
        if (s->w[key_id(s->key[i])] > 0.0f && s->key[i] > last) last = s->key[i];
    return key_id(last);
}

ps_status ps_sample(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                    int64_t n_history, uint64_t position, int32_t *out_token) {
    if (out_token) *out_token = -1;
    if (!s) return PS_ERR_ARG;
    if (!out_token) return fail(s, PS_ERR_ARG, "out_token is NULL");
    int32_t best;
    ps_status st = prepare(s, p, logits, history, n_history, &best);
    if (st) return st;
    if (p->temperature == 0.0f) {
        *out_token = best;
        return PS_OK;
    }
    truncate_candidates(s, p);
    double z = weigh(s, p->temperature);
    *out_token = draw(s, z, ps_rng_uniform(p->seed, position, PS_RNG_STREAM_SAMPLE));
    return PS_OK;
}

ps_status ps_sample_dist(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                         int64_t n_history, const int32_t **ids, const float **probs, int32_t *n_kept) {
    if (!s) return PS_ERR_ARG;
    if (!ids || !probs || !n_kept) return fail(s, PS_ERR_ARG, "ps_sample_dist: NULL output");
    *n_kept = 0;
    *ids = s->out_id;
    *probs = s->out_p;
    int32_t best;
    ps_status st = prepare(s, p, logits, history, n_history, &best);
    if (st) return st;
    if (p->temperature == 0.0f) {
        s->out_id[0] = best;
        s->out_p[0] = 1.0f;
        *n_kept = 1;
        return PS_OK;
    }
    truncate_candidates(s, p);
    materialize(s);
    double z = weigh(s, p->temperature);
    sort_keys(s->key, s->n_cand);
    for (int32_t j = 0; j < s->n_cand; j++) {
        int32_t id = key_id(s->key[j]);
        s->out_id[j] = id;
        s->out_p[j] = (float)(s->w[id] / z);
    }
    *n_kept = s->n_cand;
    return PS_OK;
}

// ---- speculative decoding with a sampled draft ---------------------------------------

ps_status ps_sample_draft(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                          int64_t n_history, uint64_t position, ps_draft_dist *q, int32_t *out_token) {
    if (out_token) *out_token = -1;
    if (!s) return PS_ERR_ARG;
    if (!q || !out_token) return fail(s, PS_ERR_ARG, "ps_sample_draft: NULL output");
    int32_t best;
    ps_status st = prepare(s, p, logits, history, n_history, &best);
    if (st) return st;
    *q = (ps_draft_dist){.n = 1, .id = {best}, .p = {1.0f}};
    *out_token = best;
    if (p->temperature == 0.0f) return PS_OK;
    truncate_candidates(s, p);
    if (s->lazy) top_k_heap(s, PS_DRAFT_DIST); /* every token a candidate: only the first few count */
    weigh(s, p->temperature);
    int32_t n = s->n_cand < PS_DRAFT_DIST ? s->n_cand : PS_DRAFT_DIST;
    if (n < s->n_cand) select_smallest(s->key, s->n_cand, n);
    sort_keys(s->key, n);
    double z = 0.0, total = 0.0, cum = 0.0;
    for (int32_t j = 0; j < n; j++) z += s->w[key_id(s->key[j])];
    q->n = 0; /* the first token has weight 1; one that rounds to probability 0 ends the list */
    for (int32_t j = 0; j < n; j++) {
        float pj = (float)(s->w[key_id(s->key[j])] / z);
        if (!(pj > 0.0f)) break;
        q->id[q->n] = key_id(s->key[j]), q->p[q->n++] = pj, total += pj;
    }
    /* drawn from the floats that travel, so that the guess is distributed as q exactly */
    double t = ps_rng_uniform(p->seed, position, PS_RNG_STREAM_DRAFT) * total;
    *out_token = q->id[q->n - 1];
    for (int32_t j = 0; j < q->n; j++)
        if ((cum += q->p[j]) > t) {
            *out_token = q->id[j];
            break;
        }
    return PS_OK;
}

/* Whether q is a distribution over s's vocabulary that holds guess; its index there into *at. */
static ps_status check_dist(ps_sampler *s, const ps_draft_dist *q, int32_t guess, int32_t *at) {
    if (q->n < 1 || q->n > PS_DRAFT_DIST)
        return fail(s, PS_ERR_ARG, "a draft distribution of %d tokens (1 to %d)", q->n, PS_DRAFT_DIST);
    double sum = 0.0;
    *at = -1;
    for (int32_t i = 0; i < q->n; i++) {
        int32_t id = q->id[i];
        if (id < 0 || id >= s->n_vocab)
            return fail(s, PS_ERR_ARG, "draft distribution: token %d is not in [0, %d)", id, s->n_vocab);
        if (!(q->p[i] > 0.0f && q->p[i] <= 1.0f))
            return fail(s, PS_ERR_ARG, "draft distribution: token %d has probability %g (must be in (0, 1])", id,
                        q->p[i]);
        for (int32_t j = 0; j < i; j++)
            if (q->id[j] == id) return fail(s, PS_ERR_ARG, "draft distribution: token %d appears twice", id);
        if (id == guess) *at = i;
        sum += q->p[i];
    }
    if (!(fabs(sum - 1.0) <= 1e-3)) return fail(s, PS_ERR_ARG, "draft distribution sums to %g, not 1", sum);
    if (*at < 0) return fail(s, PS_ERR_ARG, "the guess %d is not in its draft distribution", guess);
    return PS_OK;
}

ps_status ps_sample_verify(ps_sampler *s, const ps_sample_params *p, const float *logits, const int32_t *history,
                           int64_t n_history, uint64_t position, const ps_draft_dist *q, int32_t guess,
                           int32_t *out_token, bool *kept) {
    if (out_token) *out_token = -1;
    if (kept) *kept = false;
    if (!s) return PS_ERR_ARG;
    if (!q || !out_token || !kept) return fail(s, PS_ERR_ARG, "ps_sample_verify: NULL argument");
    int32_t at = -1, best;
    ps_status st = check_dist(s, q, guess, &at);
    if (!st) st = prepare(s, p, logits, history, n_history, &best);
    if (st) return st;
    if (p->temperature == 0.0f) { /* p is the argmax alone: kept when it is the guess, else it */
        *out_token = best, *kept = best == guess;
        return PS_OK;
    }
    truncate_candidates(s, p);
    double u = ps_rng_uniform(p->seed, position, PS_RNG_STREAM_ACCEPT) * (double)q->p[at];
    if (s->lazy) { /* every token a candidate: the guess's weight and the sum decide a keep */
        double z = weigh(s, p->temperature);
        if (u < (double)weight(s->lg[guess], s->max, s->inv) / z) {
            *out_token = guess, *kept = true;
            return PS_OK;
        }
    } /* (a rejection is made again below, with the same numbers, for the residual's weights) */
    materialize(s);
    for (int32_t i = 0; i < q->n; i++) s->w[q->id[i]] = -1.0f; /* weigh overwrites the live ones */
    double z = weigh(s, p->temperature);
    double px = s->w[guess] > 0.0 ? s->w[guess] / z : 0.0;
    if (u < px) {
        *out_token = guess, *kept = true;
        return PS_OK;
    }
    for (int32_t i = 0; i < q->n; i++) { /* the residual, in weights: z max(0, p - q) */
        float *w = &s->w[q->id[i]];
        if (*w > 0.0f) *w = (float)fmax(0.0, *w - (double)q->p[i] * z);
    }
    double r = 0.0;
    for (int32_t j = 0; j < s->n_cand; j++) r += s->w[key_id(s->key[j])];
    /* a rejection means p(guess) < q(guess), so some token has p > q: r > 0 but for rounding */
    *out_token = r > 0.0 ? draw(s, r, ps_rng_uniform(p->seed, position, PS_RNG_STREAM_RESAMPLE)) : best;
    return PS_OK;
}

// ---- log-probabilities ----------------------------------------------------------------

/* Whether (la, a) ranks before (lb, b): the larger logit first, ties by the lower id. */
static bool ranks_before(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

/* See sample.h. One pass for the normalizer (in double: max + log sum exp(l - max)), one for
 * the top n by insertion into a sorted list, which a token enters only when it beats the
 * list's last: O(vocab) for the usual n of a few. */
double ps_sample_top_logprobs(const float *logits, int vocab, int n, int32_t *ids, float *logprobs) {
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = (double)mx + log(sum);
    if (n > vocab) n = vocab;
    int have = 0;
    for (int32_t i = 0; i < vocab && n > 0; i++) {
        if (have == n && !ranks_before(logits[i], i, logits[ids[n - 1]], ids[n - 1])) continue;
        int at = have < n ? have++ : n - 1; /* a full list drops its last */
        while (at > 0 && ranks_before(logits[i], i, logits[ids[at - 1]], ids[at - 1])) ids[at] = ids[at - 1], at--;
        ids[at] = i;
    }
    for (int k = 0; k < have; k++) logprobs[k] = (float)((double)logits[ids[k]] - lse);
    return lse;
}
