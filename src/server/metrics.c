/* metrics.c - GET /metrics: the server's and the scheduler's figures in Prometheus' text
 * exposition format (version 0.0.4). Names and what they count are listed in README.md. */
#include <math.h>
#include <stdio.h>

#include "server_internal.h"

/* "# HELP" and "# TYPE" lines of a metric. */
static void head(sv_buf *b, const char *name, const char *type, const char *help) {
    sv_buf_addf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A metric without labels. */
static void single(sv_buf *b, const char *name, const char *type, const char *help, double v) {
    head(b, name, type, help);
    sv_buf_addf(b, "%s %.17g\n", name, v);
}

/* A histogram: cumulative buckets, sum and count. */
static void histogram(sv_buf *b, const char *name, const char *help, const ps_sched_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < PS_SCHED_HIST_BUCKETS; i++) {
        cum += h->count[i];
        if (isinf(ps_sched_hist_bounds[i]))
            sv_buf_addf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
        else
            sv_buf_addf(b, "%s_bucket{le=\"%g\"} %llu\n", name, ps_sched_hist_bounds[i], (unsigned long long)cum);
    }
    sv_buf_addf(b, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

/* Requests by outcome: how each ended (stop reasons, failures) and how many were refused. */
static void requests(sv_buf *b, const ps_sched_metrics *m) {
    head(b, "pipeshard_requests_total", "counter",
         "Completion requests by outcome: eos (the model ended), stop (a stop string), length (max_tokens), "
         "context (the context filled), cancelled (client gone or shutdown), error, rejected (queue full)");
    static const ps_stop_reason reasons[] = {PS_STOP_EOS, PS_STOP_STOP, PS_STOP_LENGTH, PS_STOP_CONTEXT,
                                             PS_STOP_CANCELLED};
    for (size_t i = 0; i < PS_ARRAY_LEN(reasons); i++)
        sv_buf_addf(b, "pipeshard_requests_total{outcome=\"%s\"} %llu\n", ps_stop_reason_name(reasons[i]),
                    (unsigned long long)m->ended[reasons[i]]);
    sv_buf_addf(b, "pipeshard_requests_total{outcome=\"error\"} %llu\n", (unsigned long long)m->ended[PS_STOP_NONE]);
    sv_buf_addf(b, "pipeshard_requests_total{outcome=\"rejected\"} %llu\n", (unsigned long long)m->rejected);
}

/* Per-stage compute and per-hop traffic since the server started. */
static void fleet(sv_buf *b, const ps_coord_stats *cs) {
    head(b, "pipeshard_stage_compute_seconds_total", "counter", "Compute time of each stage (stage 0 runs here)");
    for (int k = 0; k < cs->n_stages; k++)
        sv_buf_addf(b, "pipeshard_stage_compute_seconds_total{stage=\"%d\"} %.9g\n", k, cs->compute_ms[k] / 1e3);
    if (cs->n_stages < 2) return;
    head(b, "pipeshard_fleet_failures_total", "counter", "Times the fleet failed (a stage died, stalled or refused)");
    sv_buf_addf(b, "pipeshard_fleet_failures_total %d\n", cs->failures);
    head(b, "pipeshard_fleet_recoveries_total", "counter",
         "Times the fleet was connected again after a failure (a standby in a lost stage's place)");
    sv_buf_addf(b, "pipeshard_fleet_recoveries_total %d\n", cs->recoveries);
    head(b, "pipeshard_fleet_recovery_seconds_total", "counter", "From each failure to the fleet connected again");
    sv_buf_addf(b, "pipeshard_fleet_recovery_seconds_total %.9g\n", cs->recovery_ms / 1e3);
    static const char *const names[] = {"pipeshard_hop_bytes_total", "pipeshard_hop_frames_total",
                                        "pipeshard_hop_seconds_total"};
    static const char *const helps[] = {"Bytes sent on each hop (header and payload)", "Frames sent on each hop",
                                        "Time from queuing to the last byte written, summed over each hop's frames"};
    for (int w = 0; w < 3; w++) {
        head(b, names[w], "counter", helps[w]);
        for (int k = 0; k < cs->n_stages; k++) {
            char to[16];
            snprintf(to, sizeof to, k + 1 < cs->n_stages ? "%d" : "coordinator", k + 1);
            double v = w == 0   ? (double)cs->hop[k].bytes
                       : w == 1 ? (double)cs->hop[k].frames
                                : cs->hop[k].send_ms / 1e3;
            sv_buf_addf(b, "%s{from=\"%d\",to=\"%s\"} %.17g\n", names[w], k, to, v);
        }
    }
}

void sv_metrics_text(ps_server *sv, sv_buf *b) {
    ps_sched_metrics m;
    ps_sched_metrics_get(sv->sched, &m);
    requests(b, &m);
    single(b, "pipeshard_prompt_tokens_total", "counter", "Prompt tokens of finished requests",
           (double)m.prompt_tokens);
    single(b, "pipeshard_generated_tokens_total", "counter", "Tokens generated", (double)m.generated_tokens);
    single(b, "pipeshard_prefix_cache_hits_total", "counter", "Requests that reused the keys and values of a prefix",
           (double)m.prefix_hits);
    single(b, "pipeshard_prefix_cache_tokens_total", "counter", "Prompt tokens the prefix cache saved from prefill",
           (double)m.cached_tokens);
    single(b, "pipeshard_queue_length", "gauge", "Requests waiting to start", m.queued);
    single(b, "pipeshard_queue_capacity", "gauge", "Requests that may wait (--queue-size)", m.queue_max);
    single(b, "pipeshard_running_sequences", "gauge", "Sequences being generated", m.running);
    single(b, "pipeshard_kv_blocks_used", "gauge", "KV cache blocks of 32 positions held by running sequences",
           m.kv_blocks_used);
    single(b, "pipeshard_kv_blocks_cached", "gauge", "KV cache blocks kept for the prefix cache", m.kv_blocks_cached);
    single(b, "pipeshard_kv_blocks_free", "gauge", "KV cache blocks free",
           m.kv_blocks_total - m.kv_blocks_used - m.kv_blocks_cached);
    single(b, "pipeshard_spec_trips_total", "counter", "Trips that carried guesses (serve --spec)",
           (double)m.spec_trips);
    single(b, "pipeshard_spec_drafted_tokens_total", "counter", "Guesses sent", (double)m.spec_drafted);
    single(b, "pipeshard_spec_kept_tokens_total", "counter", "Guesses the last stage kept", (double)m.spec_kept);
    single(b, "pipeshard_spec_overlapped_trips_total", "counter",
           "Trips whose guesses the draft had made while the trip before was out (--spec-overlap)",
           (double)m.spec_overlapped);
    double trips = (double)m.spec_trips;
    single(b, "pipeshard_spec_acceptance", "gauge", "Guesses kept / guesses sent, since the start",
           m.spec_drafted ? (double)m.spec_kept / (double)m.spec_drafted : 0);
    single(b, "pipeshard_spec_tokens_per_trip", "gauge", "Tokens per trip that carried guesses, since the start",
           trips ? ((double)m.spec_kept + trips) / trips : 0);
    single(b, "pipeshard_spec_k_mean", "gauge", "Guesses per trip that carried guesses (the K in use), since the start",
           trips ? (double)m.spec_drafted / trips : 0);
    histogram(b, "pipeshard_time_to_first_token_seconds", "From a request's arrival to its first token", &m.ttft);
    histogram(b, "pipeshard_inter_token_seconds", "Between consecutive tokens of a sequence", &m.itl);
    fleet(b, &m.coord);
    head(b, "pipeshard_http_responses_total", "counter", "HTTP responses by status");
    for (int k = 0; k <= SV_N_CODES; k++) {
        unsigned long long n = atomic_load(&sv->responses[k]);
        if (k < SV_N_CODES)
            sv_buf_addf(b, "pipeshard_http_responses_total{code=\"%d\"} %llu\n", sv_codes[k], n);
        else
            sv_buf_addf(b, "pipeshard_http_responses_total{code=\"other\"} %llu\n", n);
    }
}
