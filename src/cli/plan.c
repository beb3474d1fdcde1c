/* plan.c - `pipeshard plan`: the placement of a model on the hosts of hosts.json
 * (coord/plan.h), printed as a table; -o writes the shards and fleet.json as `split` does.
 * Usage errors exit 2, runtime errors 1, each one stderr line starting "pipeshard plan: ". */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../coord/coord.h"
#include "../coord/fleet.h"
#include "../coord/plan.h"
#include "../model/model.h"
#include "args.h"
#include "cli.h"
#include "synth.h"

#define CMD "plan"

static void usage(FILE *f) {
    fputs("usage: pipeshard plan (-m MODEL | --like SHAPE --type TYPE) --hosts hosts.json [--ctx N]\n"
          "                      [--parallel N] [-o DIR]\n"
          "\n"
          "Chooses the order of the hosts on the ring and each one's layers for the fastest decode\n"
          "that fits every host's memory (weights, the KV cache of --ctx positions for --parallel\n"
          "sequences, buffers), and prints each stage's memory, compute and hop time and the\n"
          "predicted tok/s. Exact up to 8 hosts, for one stream and for --parallel; beyond, the\n"
          "hosts go on the ring fastest first.\n"
          "\n"
          "  -m, --model FILE   the GGUF model\n"
          "  --like SHAPE       instead of -m: a model of a `pipeshard synth` preset's shape (e.g.\n"
          "  --type TYPE        llama-3.1-70b) and type (e.g. Q4_0), planned without the file\n"
          "  --hosts FILE       the hosts: {\"hosts\": [{\"name\", \"address\", \"mem\", \"ms_per_gb\"}, ...],\n"
          "                     \"links\": [{\"between\": [A, B], \"rtt_ms\", \"mbps\"}, ...],\n"
          "                     \"default_link\": {\"rtt_ms\", \"mbps\"}} (see README, pipeshard plan)\n"
          "  --ctx N            positions per sequence (default: the model's, at most 4096)\n"
          "  --parallel N       sequences in flight (1); the plan then maximizes their aggregate tok/s:\n"
          "                     P x 1000 / max(one token's trip, min(P, stages) x the slowest stage)\n"
          "  -o, --output DIR   also write DIR/stage-K.gguf and DIR/fleet.json (the hosts' addresses)\n"
          "  -h, --help         show this help\n",
          f);
}

/* A positive number field of o, or (bytes) a size string; false after saying what is wrong. */
static bool num_field(const cJSON *o, const char *key, const char *where, bool bytes, double *out, char *err,
                      size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    uint64_t b;
    char e[200];
    if (bytes && cJSON_IsString(v)) {
        if (ps_size_parse(v->valuestring, &b, e, sizeof e))
            return ps_errf(err, errlen, PS_ERR_ARG, "%s: \"%s\": %s", where, key, e), false;
        *out = (double)b;
        return true;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e18)
        return ps_errf(err, errlen, PS_ERR_ARG, "%s: \"%s\" must be a positive number%s", where, key,
                       bytes ? " of bytes or a size such as \"16G\"" : ""),
               false;
    *out = v->valuedouble;
    return true;
}

/* hosts.json into hosts[] and the link matrices (n × n); *n set. */
static ps_status load_hosts(const char *path, ps_plan_host *hosts, int *n, double *rtt, double *mbps, char *err,
                            size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return ps_errf(err, errlen, PS_ERR_IO, "cannot open %s", path);
    char *text = malloc(1 << 20);
    size_t len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    bool big = text && !feof(f);
    fclose(f);
    if (!text) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    text[len] = 0;
    cJSON *j = big ? NULL : cJSON_Parse(text);
    free(text);
    if (!j) return ps_errf(err, errlen, PS_ERR_FORMAT, "%s is not JSON%s", path, big ? " of at most 1 MiB" : "");
    ps_status s = PS_OK;
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(j, "hosts"), *h, *links, *l;
    int k = 0;
    if (!cJSON_IsArray(hs) || cJSON_GetArraySize(hs) < 1 || cJSON_GetArraySize(hs) > PS_PLAN_MAX_HOSTS)
        s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: \"hosts\" must be a list of 1 to %d hosts", path,
                    PS_PLAN_MAX_HOSTS);
    const cJSON *host_list = s ? NULL : hs;
    cJSON_ArrayForEach(h, host_list) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(h, "name");
        const cJSON *addr = cJSON_GetObjectItemCaseSensitive(h, "address");
        char where[128];
        snprintf(where, sizeof where, "%s: host %d", path, k);
        if (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) >= sizeof hosts[k].name) {
            s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: \"name\" must be a string of 1 to 63 bytes", where);
            break;
        }
        for (int i = 0; i < k; i++)
            if (!strcmp(hosts[i].name, name->valuestring))
                s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: two hosts are named \"%s\"", path, name->valuestring);
        if (!s && addr && (!cJSON_IsString(addr) || !ps_fleet_address_ok(addr->valuestring)))
            s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: \"address\" must be HOST:PORT or unix:PATH", where);
        snprintf(hosts[k].name, sizeof hosts[k].name, "%s", name->valuestring);
        snprintf(hosts[k].address, sizeof hosts[k].address, "%s", addr ? addr->valuestring : "");
        if (s || !num_field(h, "mem", where, true, &hosts[k].mem, err, errlen) ||
            !num_field(h, "ms_per_gb", where, false, &hosts[k].ms_per_gb, err, errlen)) {
            s = s ? s : PS_ERR_FORMAT;
            break;
        }
        k++;
    }
    *n = k;
    double d_rtt = 0.5, d_mbps = 1000;
    const cJSON *dl = cJSON_GetObjectItemCaseSensitive(j, "default_link");
    char where[128];
    snprintf(where, sizeof where, "%s: \"default_link\"", path);
    if (!s && dl &&
        (!num_field(dl, "rtt_ms", where, false, &d_rtt, err, errlen) ||
         !num_field(dl, "mbps", where, false, &d_mbps, err, errlen)))
        s = PS_ERR_FORMAT;
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++) rtt[a * k + b] = a == b ? 0 : d_rtt, mbps[a * k + b] = d_mbps;
    links = cJSON_GetObjectItemCaseSensitive(j, "links");
    if (!s && links && !cJSON_IsArray(links))
        s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: \"links\" must be a list", path);
    int li = 0;
    const cJSON *link_list = s ? NULL : links;
    cJSON_ArrayForEach(l, link_list) {
        snprintf(where, sizeof where, "%s: link %d", path, li++);
        const cJSON *bt = cJSON_GetObjectItemCaseSensitive(l, "between");
        int ends[2] = {-1, -1};
        for (int e = 0; e < 2 && cJSON_IsArray(bt) && cJSON_GetArraySize(bt) == 2; e++) {
            const cJSON *nm = cJSON_GetArrayItem(bt, e);
            for (int i = 0; i < k && cJSON_IsString(nm); i++)
                if (!strcmp(hosts[i].name, nm->valuestring)) ends[e] = i;
        }
        double r, m;
        if (ends[0] < 0 || ends[1] < 0 || ends[0] == ends[1]) {
            s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: \"between\" must name two different hosts", where);
            break;
        }
        if (!num_field(l, "rtt_ms", where, false, &r, err, errlen) ||
            !num_field(l, "mbps", where, false, &m, err, errlen)) {
            s = PS_ERR_FORMAT;
            break;
        }
        rtt[ends[0] * k + ends[1]] = rtt[ends[1] * k + ends[0]] = r;
        mbps[ends[0] * k + ends[1]] = mbps[ends[1] * k + ends[0]] = m;
    }
    cJSON_Delete(j);
    return s;
}

/* What a stage takes beside its layers' weights and KV cache, as a worker counts it against
 * --max-mem (the shard file, ps_ctx_bytes): the forward pass's buffers and scratch for a batch
 * of PLAN_BATCH rows on up to PLAN_THREADS threads, and (-m) the shard file's metadata, which
 * split copies into every shard (the model file's size less its tensors: the vocabulary and
 * the rest). For --like, no file: the buffers' main terms. */
#define PLAN_BATCH   128 /* run's and serve's chunks of prompt */
#define PLAN_THREADS 16
static double stage_extra_bytes(const ps_model *m, int ctx, int parallel, double weights, int dim, int q_dim,
                                int kv_dim, int ffn) {
    if (!m) return (double)PLAN_BATCH * (2.0 * dim + 2.0 * q_dim + 2.0 * kv_dim + 2.0 * ffn) * 4;
    int blocks = (ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK * parallel;
    ps_ctx_params cp = {.n_ctx = ctx, .max_batch = PLAN_BATCH, .n_blocks = blocks, .act = PS_ACT_Q8};
    double kv_all = (double)m->hp.n_layer * blocks * PS_KV_BLOCK * kv_dim * 2 * sizeof(float);
    double meta = (double)ps_gguf_file_size(m->gguf) - weights;
    return (double)ps_ctx_bytes(m, &cp, PLAN_THREADS) - kv_all + (meta > 0 ? meta : 0);
}

int ps_cli_plan(int argc, char **argv) {
    const char *model = NULL, *hosts_path = NULL, *out = NULL, *like = NULL, *type = NULL;
    long long ctx = 0, parallel = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
        static const char *const known[] = {"-m",         "--model", "--like",   "--type", "--hosts", "--ctx",
                                            "--parallel", "-o",      "--output", "--help", NULL};
        bool valued = false;
        for (int k = 0; known[k]; k++) valued |= !strcmp(a, known[k]) && strcmp(a, "--help");
        if (!valued) return ps_arg_unknown(CMD, a, known, NULL);
        if (!(v = ps_arg_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--hosts"))
            hosts_path = v;
        else if (!strcmp(a, "--like"))
            like = v;
        else if (!strcmp(a, "--type"))
            type = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            out = v;
        else if (!strcmp(a, "--ctx") ? !ps_arg_int(CMD, a, v, 1, 1 << 24, &ctx)
                                     : !ps_arg_int(CMD, a, v, 1, PS_MB_MAX_SEGS, &parallel))
            return 2;
    }
    if (!model == !like || !like != !type)
        return ps_cli_fail(CMD, 2, "%s",
                           model && like  ? "-m and --like are two ways to name the model: give one"
                           : like || type ? "--like SHAPE and --type TYPE go together"
                                          : "no model given (-m MODEL, or --like SHAPE --type TYPE)");
    if (!hosts_path) return ps_cli_fail(CMD, 2, "no hosts given (--hosts FILE)");
    if (like && out) return ps_cli_fail(CMD, 2, "-o writes shards of a model file: it needs -m MODEL, not --like");
    char err[1024];
    static ps_plan_host hosts[PS_PLAN_MAX_HOSTS];
    static double rtt[PS_PLAN_MAX_HOSTS * PS_PLAN_MAX_HOSTS], mbps[PS_PLAN_MAX_HOSTS * PS_PLAN_MAX_HOSTS];
    int n_hosts = 0;
    if (load_hosts(hosts_path, hosts, &n_hosts, rtt, mbps, err, sizeof err)) return ps_cli_fail(CMD, 1, "%s", err);
    ps_model *m = NULL;
    ps_cli_synth_shape sh;
    const ps_cli_synth_quant *q = NULL;
    if (like) {
        if (!ps_cli_synth_find(like, type, &sh, &q)) return 2;
    } else if (ps_coord_refuse_shard(model, err, sizeof err) || ps_model_load(model, PS_GGUF_MAP, &m, err, sizeof err))
        return ps_cli_fail(CMD, 1, "%s", err);
    /* the shape: the file's, or the preset's */
    int L = m ? m->hp.n_layer : sh.n_layer, dim = m ? m->hp.dim : sh.dim, ffn = m ? m->hp.ffn_dim : sh.ffn;
    int ctx_train = m ? m->hp.ctx_train : sh.ctx;
    int q_dim = m ? m->hp.n_head * m->hp.head_dim : sh.n_head * sh.head_dim;
    int kv_dim = m ? m->hp.n_head_kv * m->hp.head_dim : sh.n_head_kv * sh.head_dim;
    uint64_t *lb = malloc((size_t)L * sizeof *lb), eb = 0, hb = 0;
    double *layer = malloc((size_t)L * sizeof *layer);
    int rc = 1;
    if (!lb || !layer) {
        ps_cli_fail(CMD, 1, "out of memory");
        goto out;
    }
    ps_status st =
        m ? ps_shard_layer_bytes(m->gguf, L, lb, &eb, &hb, err, sizeof err) : ps_cli_synth_sizes(&sh, q, lb, &eb, &hb);
    if (st) {
        ps_cli_fail(CMD, 1, "%s", m ? err : "cannot size the preset's tensors");
        goto out;
    }
    double weights = (double)eb + (double)hb;
    for (int i = 0; i < L; i++) layer[i] = (double)lb[i], weights += layer[i];
    if (!ctx) ctx = ctx_train < 4096 ? ctx_train : 4096;
    /* the KV cache in whole blocks, as the coordinator asks for it */
    double kv_positions = (double)((ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK * PS_KV_BLOCK) * parallel;
    ps_plan_problem p = {.n_layer = L,
                         .layer_bytes = layer,
                         .embed_bytes = (double)eb,
                         .head_bytes = (double)hb,
                         .kv_bytes_per_layer = kv_positions * kv_dim * 2 * sizeof(float),
                         .buf_bytes = stage_extra_bytes(m, (int)ctx, (int)parallel, weights, dim, q_dim, kv_dim, ffn),
                         .act_bytes = (double)dim * sizeof(float),
                         .n_hosts = n_hosts,
                         .hosts = hosts,
                         .rtt_ms = rtt,
                         .mbps = mbps,
                         .parallel = (int)parallel};
    ps_plan pl;
    if (ps_plan_solve(&p, &pl, err, sizeof err)) {
        ps_cli_fail(CMD, 1, "%s", err);
        goto out;
    }
    char what[160];
    if (like) snprintf(what, sizeof what, "a %s-shaped %s model (not written)", like, q->name);
    printf("plan for %s: %d layers, %.2f GiB of weights; %lld positions x %lld sequence%s\n\n", like ? what : model, L,
           weights / 1073741824.0, ctx, parallel, parallel == 1 ? "" : "s");
    printf("stage  host                layers     memory GiB (host's)   compute ms  hop ms\n");
    for (int k = 0; k < pl.n_stages; k++) {
        const ps_plan_host *h = &hosts[pl.host[k]];
        char lr[32];
        snprintf(lr, sizeof lr, "%d:%d", pl.bounds[k], pl.bounds[k + 1]);
        printf("%5d  %-18s  %-9s  %7.2f (%7.2f)      %10.2f  %6.2f\n", k, h->name, lr, pl.mem[k] / 1073741824.0,
               h->mem / 1073741824.0, pl.compute_ms[k], pl.hop_ms[k]);
    }
    printf("\npredicted: %.2f ms per token, %.1f tok/s one stream", pl.token_ms, pl.tok_s);
    if (parallel > 1) printf("; %.1f tok/s with %lld sequences", pl.agg_tok_s, parallel);
    printf(" (%s)\n", pl.exact ? "exact search" : "heuristic: hosts on the ring fastest first");
    printf("each stage's memory: its layers' weights and KV cache, the embedding on stage 0, the head on the last, "
           "and %.0f bytes of buffers (%d rows on %d threads)%s\n",
           p.buf_bytes, PLAN_BATCH, PLAN_THREADS, m ? " and file metadata" : "");
    if (n_hosts > pl.n_stages) printf("hosts left out: %d (they would slow the ring)\n", n_hosts - pl.n_stages);
    if (out) {
        const char *addrs[PS_PLAN_MAX_HOSTS];
        for (int k = 1; k < pl.n_stages; k++) {
            addrs[k - 1] = hosts[pl.host[k]].address;
            if (!*addrs[k - 1]) {
                ps_cli_fail(CMD, 1, "-o: host %s (stage %d) has no \"address\" for fleet.json", hosts[pl.host[k]].name,
                            k);
                goto out;
            }
        }
        if (ps_fleet_split(model, pl.n_stages, pl.bounds, addrs, out, NULL, NULL, err, sizeof err)) {
            ps_cli_fail(CMD, 1, "%s", err);
            goto out;
        }
        printf("wrote %d shard%s and %s/fleet.json: run `pipeshard run --fleet %s/fleet.json` on %s\n", pl.n_stages,
               pl.n_stages == 1 ? "" : "s", out, out, hosts[pl.host[0]].name);
    }
    rc = 0;
out:
    free(lb), free(layer);
    ps_model_free(m);
    return rc;
}
