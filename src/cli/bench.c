/* bench.c - `pipeshard bench`: prefill and decode speed of a model on this machine, and
 * decode's share of the memory-bandwidth limit (weight, key and value bytes read per
 * token ÷ measured read bandwidth). The bandwidth is measured just before each repetition,
 * and each repetition's share uses its own: a virtual machine's bandwidth drifts by tens of
 * per cent within a minute, so a figure taken once would compare different moments. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../coord/coord.h"
#include "../cuda/cuda.h"
#include "../model/model.h"
#include "../tensor/pool.h"
#include "../tensor/types.h"
#include "args.h"
#include "bench.h"
#include "cli.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: pipeshard bench -m MODEL [-p N] [-n N] [-t THREADS] [--pin] [--mmap] [-r REPS]\n"
            "                       [--activations q8|f32] [--device cpu|cuda[:N]] [--mem-bw GBS] [--json]\n"
            "       pipeshard bench -m MODEL --stages 2,3 [--segment N] [--local-transport tcp|unix] [-p N]\n"
            "                       [-n N] [-t THREADS] [--pin] [--mmap] [-r REPS] [--activations q8|f32]\n"
            "                       [--device D[,D...]] [--host-hops] [--json]\n"
            "  -p N        prompt tokens for the prefill measurement (default 128)\n"
            "  -n N        generated tokens for the decode measurement (default 64)\n"
            "  -t THREADS  threads (default: all cores)\n"
            "  --pin       pin thread i to the i-th CPU this process may use (see pipeshard run --help)\n"
            "  --mmap      map the model instead of reading it into huge pages (see pipeshard run --help)\n"
            "  -r REPS     repetitions; figures are medians (default 3)\n"
            "  --activations q8|f32  matmul arithmetic (default q8; see pipeshard run --help)\n"
            "  --device D  where the layers run: cpu (default), cuda (GPU 0) or cuda:N; on a GPU\n"
            "              the bandwidth is the GPU's, measured by a kernel reading 1 GiB\n"
            "  --mem-bw GBS  memory read bandwidth for the decode limit (default: measured here\n"
            "              before each repetition, best of 3 reads of 512 MiB with the same threads)\n"
            "  --json      one JSON object instead of a table\n"
            "  --stages LIST  decode of the model split into each of these stage counts (2..%d; a\n"
            "              local fleet, THREADS per stage) against the unsplit model, in one run:\n"
            "              after the same -p prompt they decode -n tokens in turns of --segment\n"
            "              tokens, the order rotating; greedy, and every split must give the\n"
            "              unsplit model's tokens. Ratio = split decode tok/s / unsplit's\n"
            "  --segment N decode tokens per turn with --stages (default 8)\n"
            "  --local-transport tcp|unix  the local fleets' connections with --stages (default tcp:\n"
            "              loopback; see pipeshard run --help)\n"
            "  --device D[,D...]  with --stages: stage k of each split on the k-th device (the last\n"
            "              for the stages after it), the unsplit model on the first: cuda:0,cuda:1\n"
            "              measures two GPUs against one\n"
            "  --host-hops with --stages: activations between GPU stages by TCP, not device to device\n",
            PS_SHARD_MAX_STAGES);
}

/* --stages: a comma-separated list of distinct stage counts, each 2..PS_SHARD_MAX_STAGES. */
static bool parse_stages(const char *v, bench_opts *o) {
    o->n_split = 0;
    for (const char *p = v;; p++) {
        char *end;
        long n = strtol(p, &end, 10);
        bool dup = false;
        for (int i = 0; i < o->n_split; i++) dup |= o->split[i] == n;
        if (*p < '0' || *p > '9' || (*end && *end != ',') || n < 2 || n > PS_SHARD_MAX_STAGES || dup ||
            o->n_split == PS_SHARD_MAX_STAGES) {
            fprintf(stderr,
                    "pipeshard bench: --stages takes distinct stage counts 2..%d separated by commas (the "
                    "unsplit model always runs), got '%s'\n",
                    PS_SHARD_MAX_STAGES, v);
            return false;
        }
        o->split[o->n_split++] = (int)n;
        if (!*(p = end)) return true;
    }
}

/* Parses argv into o; returns 0 to go on, else the exit status (0 after --help). */
static int bench_parse(int argc, char **argv, bench_opts *o, bool *done) {
    *o = (bench_opts){.n_prompt = 128, .n_gen = 64, .threads = ps_cpu_count(), .reps = 3, .segment = 8};
    bool segment = false, transport = false;
    *done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_usage(stdout);
            *done = true;
            return 0;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--pin")) {
            o->pin = true;
        } else if (!strcmp(a, "--host-hops")) {
            o->host_hops = true;
        } else if (!strcmp(a, "--mmap")) {
            o->mmap = true;
        } else if (!strcmp(a, "--mem-bw")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i)) || !ps_arg_float("bench", a, v, 0.1, 1e5, &o->mem_bw))
                return 2;
        } else if (!strcmp(a, "--stages")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i)) || !parse_stages(v, o)) return 2;
        } else if (!strcmp(a, "--segment")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i)) || !ps_arg_int("bench", a, v, 1, 1 << 20, &o->segment))
                return 2;
            segment = true;
        } else if (!strcmp(a, "--local-transport")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i)) || !ps_arg_transport("bench", a, v, &o->unix_sockets))
                return 2;
            transport = true;
        } else if (!strcmp(a, "--device")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i)) ||
                !ps_arg_devices("bench", a, v, o->devices, PS_SHARD_MAX_STAGES, &o->n_devices))
                return 2;
            o->device = o->devices[0];
        } else if (!strcmp(a, "--activations")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i))) return 2;
            if (ps_act_from_name(v, &o->act)) {
                fprintf(stderr, "pipeshard bench: --activations must be q8 or f32, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "-m") || !strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-t") || !strcmp(a, "-r")) {
            if (!(v = ps_arg_value("bench", argc, argv, &i))) return 2;
            bool ok = true;
            if (a[1] == 'm')
                o->model = v;
            else if (a[1] == 'p')
                ok = ps_arg_int("bench", a, v, 1, 1 << 20, &o->n_prompt);
            else if (a[1] == 'n')
                ok = ps_arg_int("bench", a, v, 1, 1 << 20, &o->n_gen);
            else if (a[1] == 't')
                ok = ps_arg_int("bench", a, v, 1, 1024, &o->threads);
            else
                ok = ps_arg_int("bench", a, v, 1, 1000, &o->reps);
            if (!ok) return 2;
        } else {
            static const char *const known[] = {"--help",
                                                "--json",
                                                "--pin",
                                                "--mmap",
                                                "--host-hops",
                                                "--mem-bw",
                                                "--stages",
                                                "--segment",
                                                "--local-transport",
                                                "--activations",
                                                "--device",
                                                "-m",
                                                "-p",
                                                "-n",
                                                "-t",
                                                "-r",
                                                NULL};
            return ps_arg_unknown("bench", a, known, NULL);
        }
    }
    if (!o->model) {
        fprintf(stderr, "pipeshard bench: no model given (-m MODEL)\n");
        return 2;
    }
    if (o->n_split && o->mem_bw > 0) {
        fprintf(stderr, "pipeshard bench: --mem-bw is for the engine's figures, not with --stages\n");
        return 2;
    }
    if (o->n_devices > 1 && !o->n_split) {
        fprintf(stderr, "pipeshard bench: --device with several devices goes with --stages (one per stage)\n");
        return 2;
    }
    if (o->host_hops && !o->n_split) {
        fprintf(stderr, "pipeshard bench: --host-hops goes with --stages\n");
        return 2;
    }
    if ((segment || transport) && !o->n_split) {
        fprintf(stderr, "pipeshard bench: %s goes with --stages\n", segment ? "--segment" : "--local-transport");
        return 2;
    }
    return 0;
}

typedef struct {
    const uint64_t *buf;
    size_t n;
    uint64_t sums[64];
} bw_job;

static void bw_task(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    size_t b = j->n * ith / nth, e = j->n * (ith + 1) / nth;
    uint64_t s = 0;
    for (size_t i = b; i < e; i++) s += j->buf[i];
    j->sums[ith & 63] = s;
}

#define BW_WORDS ((512u << 20) / sizeof(uint64_t))

/* Read bandwidth in bytes/s of the pool's threads over buf (BW_WORDS, best of 3). */
static double measure_bandwidth(ps_pool *pool, const uint64_t *buf) {
    bw_job j = {.buf = buf, .n = BW_WORDS};
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = ps_now();
        ps_pool_run(pool, bw_task, &j);
        double bw = (double)(BW_WORDS * sizeof *buf) / (ps_now() - t0);
        if (bw > best) best = bw;
    }
    return best;
}

/* One repetition: prefill n_prompt tokens in one forward, then decode n_gen tokens one by one
 * (each fed the argmax of the previous logits). Times in seconds. */
static ps_status bench_once(ps_ctx *c, const bench_opts *o, int vocab, int32_t *toks, float *logits, double *t_pp,
                            double *t_tg, char *err, size_t errlen) {
    double t0 = ps_now();
    ps_status s = ps_forward(c, toks, (int)o->n_prompt, 0, logits, 1, err, errlen);
    if (s) return s;
    *t_pp = ps_now() - t0;
    t0 = ps_now();
    for (int i = 0; i < o->n_gen; i++) {
        int32_t best = 0;
        for (int v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        if ((s = ps_forward(c, &best, 1, (int)o->n_prompt + i, logits, 1, err, errlen))) return s;
    }
    *t_tg = ps_now() - t0;
    return PS_OK;
}

/* bw and share are medians over the repetitions (each share with its repetition's bw). */
static void bench_report(const bench_opts *o, const ps_model *m, double pp, double tg, double bytes, double kv,
                         double bw, double share) {
    double limit = bw / bytes;
    if (o->json) {
        cJSON *j = ps_bench_json(o);
        cJSON_AddNumberToObject(j, "prefill_tok_s", pp);
        cJSON_AddNumberToObject(j, "decode_tok_s", tg);
        cJSON_AddNumberToObject(j, "decode_bytes_per_token", bytes);
        cJSON_AddNumberToObject(j, "kv_bytes_per_token", kv);
        cJSON_AddNumberToObject(j, "read_bandwidth_gb_s", bw / 1e9);
        cJSON_AddNumberToObject(j, "decode_limit_tok_s", limit);
        cJSON_AddNumberToObject(j, "bandwidth_share", share);
        ps_bench_json_print(j);
        return;
    }
    printf("model      %s (%s, %d layers, dim %d)\n", o->model, m->hp.arch_name, m->hp.n_layer, m->hp.dim);
    char name[256], err[160];
    size_t free_b, total_b;
    if (o->device != PS_DEVICE_CPU &&
        !ps_cuda_device_info(o->device - PS_DEVICE_CUDA(0), name, sizeof name, &free_b, &total_b, err, sizeof err))
        printf("device     %s (cuda:%d), %.1f of %.1f GiB free\n", name, o->device - PS_DEVICE_CUDA(0),
               free_b / 1073741824.0, total_b / 1073741824.0);
    else
        printf("kernels    %s, %s activations, %lld threads\n", ps_matmul_isa(), ps_act_name(o->act), o->threads);
    printf("prefill    %8.1f tok/s  (pp%lld, median of %lld)\n", pp, o->n_prompt, o->reps);
    printf("decode     %8.2f tok/s  (tg%lld, median of %lld)\n", tg, o->n_gen, o->reps);
    printf("bandwidth  %8.1f GB/s read; %.1f MB per token (%.1f MB of keys and values) -> limit %.2f tok/s; "
           "decode at %.0f%%\n",
           bw / 1e9, bytes / 1e6, kv / 1e6, limit, 100 * share);
    if (o->mem_bw <= 0)
        printf("           (bandwidth measured before each repetition; the share is the median of the\n"
               "            repetitions' own shares)\n");
}

int ps_cli_bench(int argc, char **argv) {
    bench_opts o;
    bool done;
    int rc = bench_parse(argc, argv, &o, &done);
    if (rc || done) return rc;
    if (o.n_split) return ps_bench_stages(&o);
    char err[512] = "";
    ps_model *m = NULL;
    ps_pool *pool = NULL;
    ps_ctx *c = NULL;
    int32_t *toks = malloc((size_t)o.n_prompt * sizeof *toks);
    double *pp = calloc((size_t)o.reps, sizeof *pp), *tg = calloc((size_t)o.reps, sizeof *tg);
    double *bw = calloc((size_t)o.reps, sizeof *bw), *share = calloc((size_t)o.reps, sizeof *share);
    uint64_t *bwbuf = NULL;
    float *logits = NULL;
    ps_status s = PS_ERR_NOMEM;
    if (!toks || !pp || !tg || !bw || !share) goto out;
    if ((s = ps_coord_refuse_shard(o.model, err, sizeof err))) goto out;
    if ((s = ps_model_load(o.model, o.mmap ? PS_GGUF_MAP : PS_GGUF_HUGE, &m, err, sizeof err))) goto out;
    if ((s = ps_pool_create((int)o.threads, &pool))) goto out;
    if (o.pin && (s = ps_pool_pin(pool, err, sizeof err))) goto out;
    ps_ctx_params cp = {
        .n_ctx = (int)(o.n_prompt + o.n_gen), .max_batch = (int)o.n_prompt, .act = o.act, .device = o.device};
    if ((s = ps_ctx_create(m, &cp, pool, &c, err, sizeof err))) goto out;
    s = PS_ERR_NOMEM;
    if (!(logits = malloc((size_t)m->hp.vocab * sizeof *logits))) goto out;
    if (o.mem_bw <= 0 && o.device == PS_DEVICE_CPU) {
        if (!(bwbuf = malloc(BW_WORDS * sizeof *bwbuf))) goto out;
        for (size_t i = 0; i < BW_WORDS; i++) bwbuf[i] = i;
    }
    s = PS_OK;
    for (long long i = 0; i < o.n_prompt; i++) toks[i] = (int32_t)((i * 7919 + 13) % m->hp.vocab);
    double kv = ps_model_decode_kv_bytes(m, o.n_prompt, o.n_gen), bytes = ps_model_decode_weight_bytes(m) + kv;
    for (int r = 0; r < o.reps; r++) {
        double a, b;
        bw[r] = o.mem_bw > 0                ? o.mem_bw * 1e9
                : o.device == PS_DEVICE_CPU ? measure_bandwidth(pool, bwbuf)
                                            : ps_cuda_read_bandwidth(o.device - PS_DEVICE_CUDA(0));
        if ((s = bench_once(c, &o, m->hp.vocab, toks, logits, &a, &b, err, sizeof err))) goto out;
        pp[r] = (double)o.n_prompt / a;
        tg[r] = (double)o.n_gen / b;
        share[r] = tg[r] * bytes / bw[r];
    }
    int n = (int)o.reps;
    bench_report(&o, m, ps_bench_quantile(pp, n, 0.5), ps_bench_quantile(tg, n, 0.5), bytes, kv,
                 ps_bench_quantile(bw, n, 0.5), ps_bench_quantile(share, n, 0.5));
out:
    if (s) fprintf(stderr, "pipeshard bench: %s\n", err[0] ? err : ps_strerror(s));
    free(logits), free(toks), free(pp), free(tg), free(bw), free(share), free(bwbuf);
    ps_ctx_free(c);
    ps_pool_free(pool);
    ps_model_free(m);
    return s ? 1 : 0;
}
