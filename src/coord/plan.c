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

bool ps_plan_evaluate(const ps_plan_problem *p, ps_plan *pl) {
    ctx c = {.p = p, .pre = malloc(((size_t)p->n_layer + 1) * sizeof(double))};
    if (!c.pre) return false;
    c.pre[0] = 0;
    for (int i = 0; i < p->n_layer; i++) c.pre[i + 1] = c.pre[i] + p->layer_bytes[i];
    bool ok = true;
    double t = 0, cmax = 0;
    int n = pl->n_stages;
    for (int k = 0; k < n; k++) {
        int h = pl->host[k], a = pl->bounds[k], b = pl->bounds[k + 1];
        ok = ok && b > a && fits(&c, h, a, b);
        pl->mem[k] = stage_mem(&c, a, b);
        pl->compute_ms[k] = compute(&c, h, a, b);
        pl->hop_ms[k] = n > 1 ? hop(p, h, pl->host[(k + 1) % n], k == n - 1) : 0;
        t += pl->compute_ms[k] + pl->hop_ms[k];
        if (pl->compute_ms[k] > cmax) cmax = pl->compute_ms[k];
    }
    free(c.pre);
    pl->token_ms = t;
    pl->tok_s = 1000 / t;
    double cycle = n * cmax > t ? n * cmax : t;
    pl->agg_tok_s = (p->parallel > 1 ? p->parallel : 1) * 1000 / cycle;
    return ok;
}

// ---------------------------------------------------------------------------------------
// Search

/* What the dynamic programming minimizes: T (one stream), or the largest stage compute
 * and then T (balanced). */
typedef struct {
    double a, b;
} cost;

static bool better(cost x, cost y) { return x.a < y.a || (x.a == y.a && x.b < y.b); }

/* A state: the hosts used (a mask, or in ordered mode the index of the last), the last
 * host, the layers placed. Its best cost and where it came from. */
typedef struct {
    cost v;
    int prev_mask, prev_j, prev_l;
    bool set;
} state;

typedef struct {
    ctx *c;
    bool balanced; /* minimize (largest compute, T) instead of T */
    bool ordered;  /* hosts in index order of perm[], no mask */
    const int *perm;
    int n_masks;
    state *st; /* [n_masks][n_hosts][n_layer + 1] */
} search;

static state *at(search *s, int mask, int j, int l) {
    int H = s->c->p->n_hosts, L = s->c->p->n_layer;
    return &s->st[((size_t)mask * H + j) * (L + 1) + l];
}

static cost extend(const search *s, cost v, double comp, double hop_ms) {
    if (s->balanced) return (cost){v.a > comp ? v.a : comp, v.b + comp + hop_ms};
    return (cost){v.a + comp + hop_ms, 0};
}

static void relax(search *s, int mask, int j, int l, cost v, int pm, int pj, int pl) {
    state *x = at(s, mask, j, l);
    if (x->set && !better(v, x->v)) return;
    *x = (state){v, pm, pj, pl, true};
}

/* The best plan with host f (a position in perm order when ordered) as stage 0; *found. */
static void search_from(search *s, int f, ps_plan *best, bool *found) {
    const ps_plan_problem *p = s->c->p;
    int H = p->n_hosts, L = p->n_layer;
    memset(s->st, 0, (size_t)s->n_masks * H * (L + 1) * sizeof(state));
    int hf = s->perm[f];
    int m0 = s->ordered ? 0 : 1 << f;
    for (int l = 1; l <= L; l++)
        if (fits(s->c, hf, 0, l)) relax(s, m0, f, l, extend(s, (cost){0, 0}, compute(s->c, hf, 0, l), 0), -1, -1, 0);
    for (int mask = 0; mask < s->n_masks; mask++)
        for (int j = 0; j < H; j++)
            for (int l = 1; l < L; l++) {
                state *x = at(s, mask, j, l);
                if (!x->set) continue;
                for (int k = 0; k < H; k++) {
                    if (s->ordered ? (k <= j || k == f) : (mask >> k & 1)) continue;
                    int hk = s->perm[k], nm = s->ordered ? 0 : mask | 1 << k;
                    double h = hop(p, s->perm[j], hk, false);
                    for (int l2 = l + 1; l2 <= L; l2++) {
                        if (!fits(s->c, hk, l, l2)) continue;
                        relax(s, nm, k, l2, extend(s, x->v, compute(s->c, hk, l, l2), h), mask, j, l);
                    }
                }
            }
    /* close the ring: the token hop from the last stage back to stage 0 */
    for (int mask = 0; mask < s->n_masks; mask++)
        for (int j = 0; j < H; j++) {
            state *x = at(s, mask, j, L);
            if (!x->set) continue;
            ps_plan pl = {0};
            int stages[PS_PLAN_MAX_HOSTS], cuts[PS_PLAN_MAX_HOSTS + 1], n = 0, m = mask, jj = j, l = L;
            while (jj >= 0) { /* walk back */
                state *y = at(s, m, jj, l);
                stages[n] = s->perm[jj], cuts[n] = l, n++;
                int pm = y->prev_mask, pj = y->prev_j, pl_ = y->prev_l;
                m = pm, jj = pj, l = pl_;
            }
            pl.n_stages = n;
            pl.bounds[0] = 0;
            for (int k = 0; k < n; k++) pl.host[k] = stages[n - 1 - k], pl.bounds[k + 1] = cuts[n - 1 - k];
            if (!ps_plan_evaluate(p, &pl)) continue;
            bool take = !*found;
            if (!take) {
                cost a = s->balanced ? (cost){0, 0} : (cost){pl.token_ms, 0};
                cost b = s->balanced ? (cost){0, 0} : (cost){best->token_ms, 0};
                if (s->balanced) {
                    double ca = 0, cb = 0;
                    for (int k = 0; k < pl.n_stages; k++) ca = pl.compute_ms[k] > ca ? pl.compute_ms[k] : ca;
                    for (int k = 0; k < best->n_stages; k++) cb = best->compute_ms[k] > cb ? best->compute_ms[k] : cb;
                    a = (cost){ca, pl.token_ms}, b = (cost){cb, best->token_ms};
                }
                take = better(a, b);
            }
            if (take) *best = pl, *found = true;
        }
}

/* The best plan of the search mode; false when none fits. */
static bool run_search(ctx *c, bool balanced, ps_plan *best) {
    const ps_plan_problem *p = c->p;
    int H = p->n_hosts, perm[PS_PLAN_MAX_HOSTS];
    for (int i = 0; i < H; i++) perm[i] = i;
    bool ordered = H > PS_PLAN_EXACT_HOSTS;
    if (ordered) /* fastest first (insertion sort: stable) */
        for (int i = 1; i < H; i++)
            for (int k = i; k > 0 && p->hosts[perm[k]].ms_per_gb < p->hosts[perm[k - 1]].ms_per_gb; k--) {
                int t = perm[k];
                perm[k] = perm[k - 1], perm[k - 1] = t;
            }
    search s = {.c = c, .balanced = balanced, .ordered = ordered, .perm = perm, .n_masks = ordered ? 1 : 1 << H};
    s.st = malloc((size_t)s.n_masks * H * (p->n_layer + 1) * sizeof(state));
    if (!s.st) return false;
    bool found = false;
    for (int f = 0; f < H; f++) search_from(&s, f, best, &found);
    free(s.st);
    best->exact = !ordered;
    return found;
}

ps_status ps_plan_solve(const ps_plan_problem *p, ps_plan *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (p->n_layer < 1 || p->n_hosts < 1 || p->n_hosts > PS_PLAN_MAX_HOSTS)
        return ps_errf(err, errlen, PS_ERR_ARG, "a plan needs 1..%d hosts and a model with layers", PS_PLAN_MAX_HOSTS);
    for (int h = 0; h < p->n_hosts; h++)
        if (!(p->hosts[h].ms_per_gb > 0) || !(p->hosts[h].mem > 0))
            return ps_errf(err, errlen, PS_ERR_ARG, "host %s: memory and ms_per_gb must be positive", p->hosts[h].name);
    ctx c = {.p = p, .pre = malloc(((size_t)p->n_layer + 1) * sizeof(double))};
    if (!c.pre) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    c.pre[0] = 0;
    for (int i = 0; i < p->n_layer; i++) c.pre[i + 1] = c.pre[i] + p->layer_bytes[i];
    ps_plan fast, bal;
    bool ok = run_search(&c, false, &fast);
    if (ok && p->parallel > 1 && run_search(&c, true, &bal) && bal.agg_tok_s > fast.agg_tok_s) {
        bal.exact = false;
        fast = bal;
    }
    double need = stage_mem(&c, 0, p->n_layer), have = 0;
    free(c.pre);
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
    *out = fast;
    return PS_OK;
}
