/* test_plan.c - the planner (coord/plan.h) against brute force: on 400 small random
 * instances (1-4 hosts of random speed and memory, random links, 1-7 layers of random size)
 * every ordered choice of hosts and every cut of the layers is evaluated, and the solver's
 * one-stream time per token equals the least found (or both find none); with several
 * sequences its plan fits and predicts an aggregate at least that of the fastest one-stream
 * plan. Nine hosts (past the exact search): a plan that fits. The refusals: memory missing
 * in total (how much), and enough in total but no cut that fits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coord/plan.h"
#include "ps_test.h"

enum { MAX_H = 9, MAX_L = 7 };

static ps_plan_host hosts[MAX_H];
static double layer_bytes[MAX_L], rtt[MAX_H * MAX_H], mbps[MAX_H * MAX_H];

static double rnd(double lo, double hi) { return lo + (hi - lo) * (ps_test_rng_u32() / 4294967296.0); }

static ps_plan_problem random_problem(int H, int L, int parallel) {
    for (int l = 0; l < L; l++) layer_bytes[l] = rnd(0.5e9, 2e9);
    for (int h = 0; h < H; h++) {
        snprintf(hosts[h].name, sizeof hosts[h].name, "h%d", h);
        hosts[h].mem = rnd(1e9, 9e9);
        hosts[h].ms_per_gb = rnd(5, 100);
    }
    for (int a = 0; a < H; a++)
        for (int b = 0; b < H; b++) rtt[a * H + b] = a == b ? 0 : rnd(0.05, 40), mbps[a * H + b] = rnd(10, 10000);
    return (ps_plan_problem){.n_layer = L,
                             .layer_bytes = layer_bytes,
                             .embed_bytes = rnd(0, 1e9),
                             .head_bytes = rnd(0, 1e9),
                             .kv_bytes_per_layer = rnd(0, 0.3e9),
                             .buf_bytes = rnd(0, 0.2e9),
                             .act_bytes = rnd(1e3, 64e3),
                             .n_hosts = H,
                             .hosts = hosts,
                             .rtt_ms = rtt,
                             .mbps = mbps,
                             .parallel = parallel};
}

/* Every ordered choice of n distinct hosts (used[]) extended into pl, then every cut. */
static void cuts(const ps_plan_problem *p, ps_plan *pl, int k, double *best) {
    int n = pl->n_stages, L = p->n_layer;
    if (k == n) {
        if (pl->bounds[n] != L) return;
        ps_plan e = *pl;
        if (ps_plan_evaluate(p, &e) && e.token_ms < *best) *best = e.token_ms;
        return;
    }
    for (int b = pl->bounds[k] + 1; b <= L - (n - 1 - k); b++) {
        pl->bounds[k + 1] = b;
        cuts(p, pl, k + 1, best);
    }
}

static void orders(const ps_plan_problem *p, ps_plan *pl, int k, int used, double *best) {
    if (k == pl->n_stages) {
        pl->bounds[0] = 0;
        cuts(p, pl, 0, best);
        return;
    }
    for (int h = 0; h < p->n_hosts; h++)
        if (!(used >> h & 1)) {
            pl->host[k] = h;
            orders(p, pl, k + 1, used | 1 << h, best);
        }
}

static double brute(const ps_plan_problem *p) {
    double best = INFINITY;
    for (int n = 1; n <= p->n_hosts && n <= p->n_layer; n++) {
        ps_plan pl = {.n_stages = n};
        orders(p, &pl, 0, 0, &best);
    }
    return best;
}

int main(void) {
    ps_test_rng_seed(5);
    char err[512];
    int solved = 0, none = 0;
    for (int i = 0; i < 400; i++) {
        int H = 1 + (int)(ps_test_rng_u32() % 4), L = 1 + (int)(ps_test_rng_u32() % MAX_L);
        ps_plan_problem p = random_problem(H, L, 1);
        ps_plan pl;
        double want = brute(&p);
        ps_status s = ps_plan_solve(&p, &pl, err, sizeof err);
        if (isinf(want)) {
            PS_CHECK_EQ_INT(s, PS_ERR_RANGE);
            none++;
            continue;
        }
        PS_CHECK_OK(s);
        if (s) continue;
        solved++;
        PS_CHECK(pl.exact);
        if (fabs(pl.token_ms - want) > 1e-9 * want) {
            fprintf(stderr, "instance %d (%d hosts, %d layers): solver %.9g ms, brute force %.9g ms\n", i, H, L,
                    pl.token_ms, want);
            PS_CHECK(0);
        }
        ps_plan again = pl; /* its figures are its own evaluation */
        PS_CHECK(ps_plan_evaluate(&p, &again) && again.token_ms == pl.token_ms);
        /* several sequences: a plan that fits, no worse in aggregate than the fastest one-stream plan */
        p.parallel = 8;
        ps_plan par, fast = pl;
        PS_CHECK(ps_plan_evaluate(&p, &fast));
        PS_CHECK_OK(ps_plan_solve(&p, &par, err, sizeof err));
        PS_CHECK(ps_plan_evaluate(&p, &par) && par.agg_tok_s >= fast.agg_tok_s * (1 - 1e-12));
    }
    printf("%d instances planned exactly as brute force, %d without a placement (both agree)\n", solved, none);
    PS_CHECK(solved > 200 && none > 5);

    /* past the exact search: nine hosts, a plan that fits */
    ps_plan_problem p9 = random_problem(9, 7, 1);
    for (int h = 0; h < 9; h++) hosts[h].mem = 30e9;
    ps_plan pl9;
    PS_CHECK_OK(ps_plan_solve(&p9, &pl9, err, sizeof err));
    PS_CHECK(!pl9.exact && ps_plan_evaluate(&p9, &pl9) && pl9.n_stages >= 1);

    /* refusals */
    ps_plan_problem small = random_problem(2, 4, 1), split = small;
    hosts[0].mem = hosts[1].mem = 1e9; /* far less than four layers of 0.5-2 GB */
    ps_plan pl;
    PS_CHECK_EQ_INT(ps_plan_solve(&small, &pl, err, sizeof err), PS_ERR_RANGE);
    PS_CHECK(strstr(err, "GiB missing") != NULL);
    printf("refusal: %s\n", err);
    /* enough in total, but one layer larger than either host */
    for (int l = 0; l < 4; l++) layer_bytes[l] = l == 2 ? 3e9 : 0.1e9;
    split.embed_bytes = split.head_bytes = split.kv_bytes_per_layer = split.buf_bytes = 0;
    hosts[0].mem = hosts[1].mem = 2e9;
    PS_CHECK_EQ_INT(ps_plan_solve(&split, &pl, err, sizeof err), PS_ERR_RANGE);
    PS_CHECK(strstr(err, "no cut of the layers") != NULL);
    printf("refusal: %s\n", err);
    return ps_test_done();
}
