/* plan.c - the planner's cost model and search (plan.h). */
#include "plan.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The search's working state: prefix sums of the layers' bytes. */
typedef struct {
    const ps_plan_problem *p;
    double *pre; /* [n_layer + 1] bytes of layers [0, l) */
} ctx;

static double layers_bytes(const ctx *c, int a, int b) { return c->pre[b] - c->pre[a]; }

/* Bytes a stage of host h with layers [a, b) needs. */
static double stage_mem(const ctx *c, int a, int b) {
    const ps_plan_problem *p = c->p;
    return layers_bytes(c, a, b) + (a == 0 ? p->embed_bytes : 0) + (b == p->n_layer ? p->head_bytes : 0) +
           (b - a) * p->kv_bytes_per_layer + p->buf_bytes;
}

static bool fits(const ctx *c, int h, int a, int b) { return stage_mem(c, a, b) <= c->p->hosts[h].mem; }

/* Compute of a stage of host h with layers [a, b), ms per token. */
static double compute(const ctx *c, int h, int a, int b) {
    const ps_plan_problem *p = c->p;
    double bytes = layers_bytes(c, a, b) + (b == p->n_layer ? p->head_bytes : 0);
    return p->hosts[h].ms_per_gb * bytes / 1e9;
}

/* A hop from host a to host b carrying activations (tokens: ids only). */
static double hop(const ps_plan_problem *p, int a, int b, bool tokens) {
    int n = p->n_hosts;
    double ms = p->rtt_ms[a * n + b] / 2;
    if (!tokens) ms += p->act_bytes * 8 / (p->mbps[a * n + b] * 1e6) * 1000;
    return ms;
}

/* Fills pl's per-stage figures, T, the cycle and tok/s from its hosts and bounds; false when
 * a stage does not fit its host (or has no layers). */
static bool evaluate(const ctx *c, ps_plan *pl) {
    const ps_plan_problem *p = c->p;
    bool ok = true;
    double t = 0, cmax = 0;
    int n = pl->n_stages, par = p->parallel > 1 ? p->parallel : 1;
    for (int k = 0; k < n; k++) {
        int h = pl->host[k], a = pl->bounds[k], b = pl->bounds[k + 1];
        ok = ok && b > a && fits(c, h, a, b);
        pl->mem[k] = stage_mem(c, a, b);
        pl->compute_ms[k] = compute(c, h, a, b);
        pl->hop_ms[k] = n > 1 ? hop(p, h, pl->host[(k + 1) % n], k == n - 1) : 0;
        t += pl->compute_ms[k] + pl->hop_ms[k];
        if (pl->compute_ms[k] > cmax) cmax = pl->compute_ms[k];
    }
    pl->token_ms = t;
    pl->tok_s = 1000 / t;
    double busy = (par < n ? par : n) * cmax; /* the slowest stage's work per cycle */
    pl->cycle_ms = busy > t ? busy : t;
    pl->agg_tok_s = par * 1000 / pl->cycle_ms;
    return ok;
}

bool ps_plan_evaluate(const ps_plan_problem *p, ps_plan *pl) {
    ctx c = {.p = p, .pre = ps_malloc(((size_t)p->n_layer + 1) * sizeof(double))};
    if (!c.pre) return false;
    c.pre[0] = 0;
    for (int i = 0; i < p->n_layer; i++) c.pre[i + 1] = c.pre[i] + p->layer_bytes[i];
    bool ok = evaluate(&c, pl);
    free(c.pre);
    return ok;
}

// ---------------------------------------------------------------------------------------
// Search

/* A state of the dynamic programming: the least time of the stages placed so far (each one's
 * compute and its hop into the next), for the hosts used (a mask of perm positions; in
 * ordered mode always 0), the last stage's host (its perm position) and the layers placed;
 * and where it came from: the previous stage's host (-1: this is stage 0) and the layers
 * placed before this stage. */
typedef struct {
    double v;
    int pl;
    signed char pj;
    bool set;
} state;

/* One run of the dynamic programming (a probe): every host as stage 0, every stage's compute
 * at most cap. Its results: per number of stages, the least T found and that plan. */
typedef struct {
    ctx *c;
    bool ordered; /* past PS_PLAN_EXACT_HOSTS: the stages' hosts in perm order, no mask */
    int perm[PS_PLAN_MAX_HOSTS];
    int n_masks;
    double cap;                /* the most compute a stage may have, ms (INFINITY: no cap) */
    double *act_hop, *tok_hop; /* [H * H] a hop between perm positions: activations, token ids */
    state *st;                 /* [n_masks][H][L + 1] */
    double *e, *w;             /* [L + 1] the best state before a hop into the host being placed, its window key */
    int *ej, *dq;              /* [L + 1] that state's host; the window's deque */
    double best_t[PS_PLAN_MAX_HOSTS + 1]; /* per number of stages: the least T of the probe */
    ps_plan *best;                        /* [PS_PLAN_MAX_HOSTS + 1] its hosts and bounds */
} search;

static state *at(search *s, int mask, int j, int l) {
    int H = s->c->p->n_hosts, L = s->c->p->n_layer;
    return &s->st[((size_t)mask * H + j) * (L + 1) + l];
}

/* Whether host h may take layers [a, b): it fits, and its compute is within the cap. */
static bool allowed(const search *s, int h, int a, int b) {
    return fits(s->c, h, a, b) && compute(s->c, h, a, b) <= s->cap;
}

/* Fills the states (nm, k, l2) for every l2: a stage of host k (a perm position) with layers
 * [l, l2) after the best state s->e[l] (the time up to the hop into k, from host s->ej[l]),
 * for l in [1, L) (INFINITY: none). The l allowed for l2 are a window [lo, l2) whose lo only
 * grows with l2 (a stage needs more memory and compute the more layers it has), so a monotone
 * deque keeps the window's least e[l] + compute(k, l, l2): e[l] - rate × pre[l] orders them
 * as the sum does. O(L) instead of O(L²). */
static void place(search *s, int nm, int k) {
    const ctx *c = s->c;
    int L = c->p->n_layer, h = s->perm[k], head = 0, tail = 0, lo = 1;
    double rate = c->p->hosts[h].ms_per_gb / 1e9;
    state *out = at(s, nm, k, 0);
    out[0].set = out[1].set = false; /* a row has L + 1 >= 2 states */
    for (int l2 = 2; l2 <= L; l2++) {
        int l = l2 - 1;
        if (s->e[l] < INFINITY) {
            s->w[l] = s->e[l] - rate * c->pre[l];
            while (tail > head && s->w[s->dq[tail - 1]] >= s->w[l]) tail--;
            s->dq[tail++] = l;
        }
        while (lo < l2 && !allowed(s, h, lo, l2)) lo++;
        while (head < tail && s->dq[head] < lo) head++;
        if (head == tail) {
            out[l2].set = false;
            continue;
        }
        int b = s->dq[head];
        out[l2] = (state){s->e[b] + compute(c, h, b, l2), b, (signed char)s->ej[b], true};
    }
}

/* s->e[l], s->ej[l]: the best state (mask, j, l) over the perm positions j in [j0, j1) that
 * mask holds (all, in ordered mode), followed by the hop into k. Host f (stage 0) is a
 * source only while it is the only stage. */
static void gather(search *s, int mask, int f, int j0, int j1, int k) {
    int H = s->c->p->n_hosts, L = s->c->p->n_layer;
    for (int l = 1; l < L; l++) s->e[l] = INFINITY;
    for (int j = j0; j < j1; j++) {
        if (!s->ordered && (!(mask >> j & 1) || (j == f && mask != 1 << f))) continue;
        double hop_ms = s->act_hop[j * H + k];
        state *x = at(s, mask, j, 0);
        for (int l = 1; l < L; l++)
            if (x[l].set && x[l].v + hop_ms < s->e[l]) s->e[l] = x[l].v + hop_ms, s->ej[l] = j;
    }
}

/* The plan that ends in state (mask, j, L) into pl (hosts and bounds). */
static void walk_back(search *s, int mask, int j, ps_plan *pl) {
    int stages[PS_PLAN_MAX_HOSTS], cuts[PS_PLAN_MAX_HOSTS], n = 0, l = s->c->p->n_layer;
    while (j >= 0) {
        const state *y = at(s, mask, j, l);
        stages[n] = s->perm[j], cuts[n] = l, n++;
        if (!s->ordered) mask &= ~(1 << j);
        j = y->pj, l = y->pl;
    }
    memset(pl, 0, sizeof *pl);
    pl->n_stages = n;
    for (int k = 0; k < n; k++) pl->host[k] = stages[n - 1 - k], pl->bounds[k + 1] = cuts[n - 1 - k];
}

/* The dynamic programming with host f (a perm position) as stage 0; improves s->best_t[]. */
static void search_from(search *s, int f) {
    const ps_plan_problem *p = s->c->p;
    int H = p->n_hosts, L = p->n_layer, hf = s->perm[f], m0 = s->ordered ? 0 : 1 << f;
    state *first = at(s, m0, f, 0);
    first[0].set = false;
    for (int l = 1; l <= L; l++)
        first[l] = allowed(s, hf, 0, l) ? (state){compute(s->c, hf, 0, l), 0, -1, true} : (state){0, 0, 0, false};
    if (s->ordered) /* the stages after f: hosts later in perm order */
        for (int k = f + 1; k < H; k++) gather(s, 0, f, f, k, k), place(s, 0, k);
    else /* masks grow: every mask is complete before it is extended */
        for (int mask = m0; mask < s->n_masks; mask++) {
            if (!(mask & m0)) continue;
            for (int k = 0; k < H; k++)
                if (!(mask >> k & 1)) gather(s, mask, f, 0, H, k), place(s, mask | 1 << k, k);
        }
    /* close the ring: the token hop from the last stage back to stage 0 */
    for (int mask = m0; mask < s->n_masks; mask++) {
        if (!s->ordered && !(mask & m0)) continue;
        for (int j = s->ordered ? f : 0; j < H; j++) {
            if (!s->ordered && (!(mask >> j & 1) || (j == f && mask != m0))) continue;
            state *x = at(s, mask, j, L);
            if (!x->set) continue;
            double t = x->v + (j == f ? 0 : s->tok_hop[j * H + f]);
            ps_plan pl;
            int n = 0;
            if (s->ordered)
                walk_back(s, mask, j, &pl), n = pl.n_stages;
            else
                for (int b = mask; b; b &= b - 1) n++;
            if (!(t < s->best_t[n])) continue;
            s->best_t[n] = t;
            if (s->ordered)
                s->best[n] = pl;
            else
                walk_back(s, mask, j, &s->best[n]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The objective

/* The order of plans: the shorter cycle (with P sequences: the time in which each gets a
 * token), then the shorter T. Cycles equal within rounding count as equal. */
static bool plan_better(const ps_plan *a, const ps_plan *b) {
    double tol = 1e-12 * b->cycle_ms;
    if (a->cycle_ms != b->cycle_ms && fabs(a->cycle_ms - b->cycle_ms) > tol) return a->cycle_ms < b->cycle_ms;
    return a->token_ms < b->token_ms;
}

#define MEMO_MAX 256 /* probes remembered: the searches for different numbers of stages share their first ones */

/* The whole search: the probes' state, the candidate caps, the best plan so far. */
typedef struct {
    search s;
    double *cand; /* every stage's compute (a host and a layer range that fits it), sorted, distinct */
    int n_cand;
    int n_memo, memo_i[MEMO_MAX];
    double memo_t[MEMO_MAX][PS_PLAN_EXACT_HOSTS + 1];
    ps_plan best;
    bool found;
    int probes;
} solver;

/* Runs the dynamic programming with every stage's compute at most cap; each number of
 * stages' least-T plan is evaluated and kept when it beats the best. */
static void probe(solver *v, double cap) {
    search *s = &v->s;
    int H = s->c->p->n_hosts;
    s->cap = cap;
    for (int n = 0; n <= H; n++) s->best_t[n] = INFINITY;
    for (int f = 0; f < H; f++) search_from(s, f);
    for (int n = 1; n <= H; n++) {
        if (s->best_t[n] == INFINITY) continue;
        ps_plan *pl = &s->best[n];
        if (!evaluate(s->c, pl)) continue; /* cannot happen: the search placed only stages that fit */
        if (!v->found || plan_better(pl, &v->best)) v->best = *pl, v->found = true;
    }
    v->probes++;
}

/* s->best_t[] of the probe with cap v->cand[i] (exact mode), remembered. */
static const double *probe_at(solver *v, int i) {
    for (int k = 0; k < v->n_memo; k++)
        if (v->memo_i[k] == i) return v->memo_t[k];
    probe(v, v->cand[i]);
    if (v->n_memo == MEMO_MAX) return v->s.best_t;
    v->memo_i[v->n_memo] = i;
    memcpy(v->memo_t[v->n_memo], v->s.best_t, sizeof v->memo_t[0]);
    return v->memo_t[v->n_memo++];
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* v->cand: the compute of every stage some host may hold, sorted, without repeats. */
static bool candidates(solver *v) {
    const ps_plan_problem *p = v->s.c->p;
    int H = p->n_hosts, L = p->n_layer, n = 0;
    v->cand = ps_malloc((size_t)H * L * (L + 1) / 2 * sizeof(double));
    if (!v->cand) return false;
    for (int h = 0; h < H; h++)
        for (int a = 0; a < L; a++)
            for (int b = a + 1; b <= L && fits(v->s.c, h, a, b); b++) v->cand[n++] = compute(v->s.c, h, a, b);
    qsort(v->cand, (size_t)n, sizeof(double), cmp_double);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!k || v->cand[i] != v->cand[k - 1]) v->cand[k++] = v->cand[i];
    v->n_cand = k;
    return true;
}

/* With P > 1 sequences, exact (up to PS_PLAN_EXACT_HOSTS hosts). The cycle of a plan of N
 * stages is max(T, G × its largest stage compute), G = min(P, N). Let T_N(c) be the least T of
 * N stages each computing at most c: non-increasing in c, while G × c grows. Then the best
 * cycle of N stages is min(T_N(c'), G × c*), c* the least candidate cap with T_N(c*) <= G × c*
 * and c' the one below it (any other cap gives no less), found by bisection over the
 * candidates; each probe's plans are evaluated as they are. A number of stages whose least T
 * (no cap) is no shorter than the best cycle found is skipped, and so is a cap that would give
 * a cycle no shorter. The probe without a cap has been run: it is the probe of the largest
 * candidate (every stage's compute is at most that). */
static void search_parallel_exact(solver *v, const double *t_inf) {
    const ps_plan_problem *p = v->s.c->p;
    int K = v->n_cand;
    for (int n = 1; n <= p->n_hosts; n++) {
        if (t_inf[n] == INFINITY || t_inf[n] >= v->best.cycle_ms) continue;
        double g = p->parallel < n ? p->parallel : n;
        if (t_inf[n] > g * v->cand[K - 1]) continue; /* T dominates at every cap: the probe without one is best */
        int lo = -1, hi = K - 1;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            if (g * v->cand[mid] >= v->best.cycle_ms) {
                hi = mid;
                continue;
            }
            const double *t = probe_at(v, mid);
            if (t[n] <= g * v->cand[mid])
                hi = mid;
            else
                lo = mid;
        }
    }
}

/* With P > 1 past PS_PLAN_EXACT_HOSTS hosts, a heuristic over the ordered search: the least
 * cap at which a plan fits (the most balanced plan), and the cap where the least-T plan's T
 * meets G × the cap, each found by bisection; every probe's plans are evaluated. */
static void search_parallel_ordered(solver *v) {
    const ps_plan_problem *p = v->s.c->p;
    int K = v->n_cand;
    for (int pass = 0; pass < 2; pass++) {
        int lo = -1, hi = K - 1;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2, n = 0;
            probe(v, v->cand[mid]);
            for (int k = 1; k <= p->n_hosts; k++)
                if (v->s.best_t[k] < v->s.best_t[n]) n = k;
            double g = p->parallel < n ? p->parallel : n;
            bool yes = n > 0 && (pass == 0 || v->s.best_t[n] <= g * v->cand[mid]);
            if (yes)
                hi = mid;
            else
                lo = mid;
        }
    }
}

/* The best plan into v->best (v->found: whether one fits); PS_ERR_NOMEM. */
static ps_status run_search(solver *v) {
    search *s = &v->s;
    const ps_plan_problem *p = s->c->p;
    int H = p->n_hosts, L = p->n_layer;
    for (int i = 0; i < H; i++) s->perm[i] = i;
    s->ordered = H > PS_PLAN_EXACT_HOSTS;
    if (s->ordered) /* fastest first (insertion sort: stable) */
        for (int i = 1; i < H; i++)
            for (int k = i; k > 0 && p->hosts[s->perm[k]].ms_per_gb < p->hosts[s->perm[k - 1]].ms_per_gb; k--) {
                int t = s->perm[k];
                s->perm[k] = s->perm[k - 1], s->perm[k - 1] = t;
            }
    s->n_masks = s->ordered ? 1 : 1 << H;
    s->st = ps_malloc((size_t)s->n_masks * H * (L + 1) * sizeof(state));
    s->act_hop = ps_malloc((size_t)H * H * sizeof(double));
    s->tok_hop = ps_malloc((size_t)H * H * sizeof(double));
    s->e = ps_malloc((size_t)(L + 1) * sizeof(double));
    s->w = ps_malloc((size_t)(L + 1) * sizeof(double));
    s->ej = ps_malloc((size_t)(L + 1) * sizeof(int));
    s->dq = ps_malloc((size_t)(L + 1) * sizeof(int));
    s->best = ps_malloc((PS_PLAN_MAX_HOSTS + 1) * sizeof(ps_plan));
    bool ok = s->st && s->act_hop && s->tok_hop && s->e && s->w && s->ej && s->dq && s->best;
    if (ok) {
        for (int a = 0; a < H; a++)
            for (int b = 0; b < H; b++)
                s->act_hop[a * H + b] = hop(p, s->perm[a], s->perm[b], false),
                                   s->tok_hop[a * H + b] = hop(p, s->perm[a], s->perm[b], true);
        probe(v, INFINITY);
        double t_inf[PS_PLAN_MAX_HOSTS + 1];
        memcpy(t_inf, s->best_t, sizeof t_inf);
        if (v->found && p->parallel > 1 && (ok = candidates(v))) {
            if (s->ordered)
                search_parallel_ordered(v);
            else
                search_parallel_exact(v, t_inf);
        }
        v->best.exact = !s->ordered;
    }
    free(s->st), free(s->act_hop), free(s->tok_hop), free(s->e), free(s->w), free(s->ej), free(s->dq), free(s->best);
    free(v->cand);
    return ok ? PS_OK : PS_ERR_NOMEM;
}

ps_status ps_plan_solve(const ps_plan_problem *p, ps_plan *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (p->n_layer < 1 || p->n_hosts < 1 || p->n_hosts > PS_PLAN_MAX_HOSTS)
        return ps_errf(err, errlen, PS_ERR_ARG, "a plan needs 1..%d hosts and a model with layers", PS_PLAN_MAX_HOSTS);
    for (int h = 0; h < p->n_hosts; h++)
        if (!(p->hosts[h].ms_per_gb > 0) || !(p->hosts[h].mem > 0))
            return ps_errf(err, errlen, PS_ERR_ARG, "host %s: memory and ms_per_gb must be positive", p->hosts[h].name);
    ctx c = {.p = p, .pre = ps_malloc(((size_t)p->n_layer + 1) * sizeof(double))};
    solver *v = ps_calloc(1, sizeof *v);
    if (!c.pre || !v) {
        free(c.pre), free(v);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    }
    c.pre[0] = 0;
    for (int i = 0; i < p->n_layer; i++) c.pre[i + 1] = c.pre[i] + p->layer_bytes[i];
    v->s.c = &c;
    ps_status st = run_search(v);
    bool ok = v->found;
    if (!st && ok) *out = v->best;
    free(v);
    double need = stage_mem(&c, 0, p->n_layer), have = 0;
    free(c.pre);
    if (st) return ps_errf(err, errlen, st, "out of memory");
    if (!ok) {
        for (int h = 0; h < p->n_hosts; h++) have += p->hosts[h].mem;
        need += (p->n_hosts - 1) * p->buf_bytes; /* every host's buffers, were all used */
        if (have < need)
            return ps_errf(err, errlen, PS_ERR_RANGE,
                           "no placement fits: the model's weights, KV cache and buffers need %.2f GiB and the "
                           "hosts have %.2f GiB together: %.2f GiB missing",
                           need / 1073741824.0, have / 1073741824.0, (need - have) / 1073741824.0);
        double big = 0, room = 0;
        for (int l = 0; l < p->n_layer; l++) big = p->layer_bytes[l] > big ? p->layer_bytes[l] : big;
        for (int h = 0; h < p->n_hosts; h++) room = p->hosts[h].mem > room ? p->hosts[h].mem : room;
        return ps_errf(err, errlen, PS_ERR_RANGE,
                       "no placement fits: the hosts have %.2f GiB together for the %.2f GiB needed, but no cut of "
                       "the layers fits each host's memory (the largest layer takes %.2f GiB with its KV cache and "
                       "the buffers; the largest host has %.2f GiB)",
                       have / 1073741824.0, need / 1073741824.0,
                       (big + p->kv_bytes_per_layer + p->buf_bytes) / 1073741824.0, room / 1073741824.0);
    }
    return PS_OK;
}
