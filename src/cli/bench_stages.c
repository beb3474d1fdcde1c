/* bench_stages.c - `pipeshard bench --stages 2,3`: decode speed of the model split into
 * each of those stage counts (a local fleet, as `run --local-stages`), against
 * the unsplit model, measured side by side in one process.
 *
 * Every configuration holds its own coordinator (and workers) for the whole run. After each
 * has prefilled the same prompt, they decode in turns of --segment tokens, the order of the
 * turns rotating from round to round, so that every configuration decodes the same positions
 * within a fraction of a second of the others: a virtual machine whose speed drifts by tens
 * of per cent within seconds then slows them alike. A configuration's decode speed is its
 * tokens over its summed time; its ratio is that over the unsplit speed. Each round's ratio
 * (its turns alone) shows the spread. Decoding is greedy, and every configuration must
 * produce the unsplit model's tokens, or the benchmark fails. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../coord/launch.h"
#include "../coord/session.h"
#include "bench.h"

typedef struct {
    int stages;
    ps_launch *launch;              /* the coordinator, and its local fleet when stages > 1 */
    ps_session *session;            /* greedy, never stopping */
    double t_prefill, t_decode;     /* seconds */
    double compute_ms, overhead_ms; /* in decode: every stage's compute, the ring's overhead */
    long long n_decode;
    double *round_s; /* this configuration's time in each round */
} config;

static ps_status config_start(config *c, const bench_opts *o, char *err, size_t errlen) {
    ps_launch_opts lo = {.model = o->model,
                         .local_stages = c->stages,
                         .local_unix = o->unix_sockets,
                         .devices = o->devices,
                         .n_devices = o->n_devices,
                         .host_hops = o->host_hops,
                         .timeout_ms = 30000,
                         .stage = {.threads = (int)o->threads, .pin = o->pin, .mmap = o->mmap, .device = o->device},
                         .n_ctx = (int)(o->n_prompt + o->n_gen + 1),
                         .max_batch = (int)o->n_prompt,
                         .act = o->act};
    ps_status s = ps_launch_start(&lo, &c->launch, err, errlen);
    return s ? s : ps_session_create(ps_launch_coord(c->launch), NULL, &c->session, err, errlen);
}

static void config_stop(config *c) {
    ps_session_free(c->session);
    ps_launch_stop(c->launch);
    free(c->round_s);
}

/* Starts a generation of c's session over prompt (n tokens), prefilled whole (not kept from
 * the last repetition): greedy, to the end of the context. */
static ps_status set_prompt(config *c, const int32_t *prompt, int n, char *err, size_t errlen) {
    ps_gen_params gp = {.sp = ps_sample_params_default(), .n_predict = -1, .ignore_eos = true};
    gp.sp.temperature = 0;
    ps_session_reset(c->session);
    return ps_session_prompt_ids(c->session, prompt, n, &gp, err, errlen);
}

/* n steps of c's session: the first runs the prompt, the others decode one token each. */
static ps_status steps(config *c, int n, char *err, size_t errlen) {
    ps_session_step st;
    ps_status s = PS_OK;
    for (int i = 0; !s && i < n; i++) s = ps_session_next(c->session, &st, err, errlen);
    return s;
}

/* Faults every configuration's weights in (first touches of a mapped file are slow) and
 * starts its threads: the prompt and one turn of decode, untimed. */
static ps_status warm_up(config *cs, int nc, const bench_opts *o, const int32_t *prompt, char *err, size_t errlen) {
    int n = 1 + (int)(o->segment < o->n_gen ? o->segment : o->n_gen);
    for (int i = 0; i < nc; i++) {
        ps_status s = set_prompt(&cs[i], prompt, (int)o->n_prompt, err, errlen);
        if (!s) s = steps(&cs[i], n, err, errlen);
        if (s) return s;
    }
    return PS_OK;
}

/* Turns of decode per repetition: o->n_gen tokens in turns of o->segment (the last may be
 * shorter). */
static int rounds_per_rep(const bench_opts *o) { return (int)((o->n_gen - 1 + o->segment) / o->segment); }

/* One repetition: every configuration prefills the prompt, then they decode o->n_gen tokens
 * in turns. Fails when a configuration's token differs from the unsplit model's. */
static ps_status bench_rep(config *cs, int nc, const bench_opts *o, const int32_t *prompt, int rep, char *err,
                           size_t errlen) {
    int p = (int)o->n_prompt;
    for (int i = 0; i < nc; i++) {
        config *c = &cs[(i + rep) % nc];
        ps_status s = set_prompt(c, prompt, p, err, errlen);
        double t0 = ps_now();
        if (!s) s = steps(c, 1, err, errlen);
        if (s) return s;
        c->t_prefill += ps_now() - t0;
        ps_coord_reset_stats(ps_launch_coord(c->launch));
    }
    int rounds = rounds_per_rep(o);
    for (int r = 0; r < rounds; r++) {
        int from = p + (int)(r * o->segment), to = from + (int)o->segment;
        if (to > p + o->n_gen) to = p + (int)o->n_gen;
        for (int i = 0; i < nc; i++) {
            config *c = &cs[(i + r + rep) % nc];
            double t0 = ps_now();
            ps_status s = steps(c, to - from, err, errlen);
            if (s) return s;
            double dt = ps_now() - t0;
            c->t_decode += dt;
            c->round_s[rep * rounds + r] = dt;
        }
    }
    const int32_t *base = ps_session_tokens(cs[0].session, NULL, NULL);
    for (int i = 0; i < nc; i++) {
        config *c = &cs[i];
        c->n_decode += o->n_gen;
        ps_coord_stats st;
        ps_coord_get_stats(ps_launch_coord(c->launch), &st);
        for (int k = 0; k < st.n_stages; k++) c->compute_ms += st.compute_ms[k];
        if (c->stages > 1) c->overhead_ms += ps_coord_ring_overhead_ms(&st);
        const int32_t *toks = ps_session_tokens(c->session, NULL, NULL);
        for (int pos = p; pos <= p + o->n_gen; pos++)
            if (toks[pos] != base[pos])
                return ps_errf(err, errlen, PS_ERR_INTERNAL,
                               "%d stages generated token %d at position %d where the "
                               "unsplit model generated %d",
                               c->stages, toks[pos], pos, base[pos]);
    }
    return PS_OK;
}

/* rr: room for n_rounds ratios. */
static void report(const bench_opts *o, config *cs, int nc, int n_rounds, double *rr) {
    double base = (double)cs[0].n_decode / cs[0].t_decode;
    cJSON *j = o->json ? ps_bench_json(o) : NULL, *arr = NULL;
    if (j) {
        cJSON_AddNumberToObject(j, "segment", (double)o->segment);
        cJSON_AddNumberToObject(j, "reps", (double)o->reps);
        cJSON_AddNumberToObject(j, "rounds", n_rounds);
        arr = cJSON_AddArrayToObject(j, "configs");
    } else {
        printf("model      %s, %lld threads per stage, %s, %s activations\n", o->model, o->threads, ps_matmul_isa(),
               ps_act_name(o->act));
        if (o->device != PS_DEVICE_CPU) {
            char d[16];
            printf("devices    unsplit on %s, stage k of a split on the k-th of",
                   ps_device_name(o->device, d, sizeof d));
            for (int i = 0; i < o->n_devices; i++)
                printf("%s %s", i ? "," : "", ps_device_name(o->devices[i], d, sizeof d));
            printf(" (the last for the rest), hops %s\n", o->host_hops ? "by TCP (--host-hops)" : "device to device");
        }
        printf("decode     %lld tokens per configuration after a %lld-token prompt, x %lld repetitions, in turns of "
               "%lld tokens (%d rounds, order rotating); every configuration's tokens equal the unsplit model's\n",
               o->n_gen, o->n_prompt, o->reps, o->segment, n_rounds);
        printf("%6s %12s %8s %24s %16s %14s %14s\n", "stages", "decode tok/s", "ratio", "rounds' ratio p10/50/90",
               "compute us/token", "ring us/token", "prefill tok/s");
    }
    for (int i = 0; i < nc; i++) {
        config *c = &cs[i];
        double tps = (double)c->n_decode / c->t_decode, pps = (double)o->n_prompt * o->reps / c->t_prefill;
        double q[3] = {1, 1, 1}, hop = c->stages > 1 ? c->overhead_ms * 1e3 / (double)c->n_decode : 0;
        double compute = c->compute_ms * 1e3 / (double)c->n_decode;
        if (i > 0) {
            for (int r = 0; r < n_rounds; r++) rr[r] = cs[0].round_s[r] / c->round_s[r];
            static const double at[3] = {0.1, 0.5, 0.9};
            for (int k = 0; k < 3; k++) q[k] = ps_bench_quantile(rr, n_rounds, at[k]);
        }
        if (j) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "stages", c->stages);
            cJSON_AddNumberToObject(e, "decode_tok_s", tps);
            cJSON_AddNumberToObject(e, "ratio", tps / base);
            cJSON_AddNumberToObject(e, "round_ratio_p10", q[0]);
            cJSON_AddNumberToObject(e, "round_ratio_median", q[1]);
            cJSON_AddNumberToObject(e, "round_ratio_p90", q[2]);
            cJSON_AddNumberToObject(e, "compute_us_per_token", compute);
            cJSON_AddNumberToObject(e, "ring_overhead_us_per_token", hop);
            cJSON_AddNumberToObject(e, "prefill_tok_s", pps);
            cJSON_AddItemToArray(arr, e);
        } else {
            char h[32] = "";
            if (c->stages > 1) snprintf(h, sizeof h, "%.0f", hop);
            printf("%6d %12.2f %8.3f %10.3f/%.3f/%.3f %16.0f %14s %14.1f\n", c->stages, tps, tps / base, q[0], q[1],
                   q[2], compute, h, pps);
        }
    }
    if (j) ps_bench_json_print(j);
}

int ps_bench_stages(const bench_opts *o) {
    char err[1024] = "";
    int nc = o->n_split + 1;
    int n_rounds = rounds_per_rep(o) * (int)o->reps;
    config *cs = calloc((size_t)nc, sizeof *cs);
    double *rr = malloc((size_t)n_rounds * sizeof *rr);
    int32_t *prompt = malloc((size_t)o->n_prompt * sizeof *prompt);
    ps_status s = cs && rr && prompt ? PS_OK : ps_errf(err, sizeof err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < nc; i++) {
        config *c = &cs[i];
        c->stages = i ? o->split[i - 1] : 1;
        c->round_s = calloc((size_t)n_rounds, sizeof *c->round_s);
        if (!c->round_s)
            s = ps_errf(err, sizeof err, PS_ERR_NOMEM, "out of memory");
        else
            s = config_start(c, o, err, sizeof err);
    }
    if (!s) {
        int vocab = ps_coord_model(ps_launch_coord(cs[0].launch))->hp.vocab;
        for (long long k = 0; k < o->n_prompt; k++) prompt[k] = (int32_t)((k * 7919 + 13) % vocab);
    }
    if (!s) s = warm_up(cs, nc, o, prompt, err, sizeof err);
    for (int r = 0; !s && r < o->reps; r++) s = bench_rep(cs, nc, o, prompt, r, err, sizeof err);
    if (!s) report(o, cs, nc, n_rounds, rr);
    for (int i = 0; cs && i < nc; i++) config_stop(&cs[i]);
    free(cs);
    free(rr);
    free(prompt);
    if (s) fprintf(stderr, "pipeshard bench: %s\n", err[0] ? err : ps_strerror(s));
    return s ? 1 : 0;
}
