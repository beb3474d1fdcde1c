/* probe.c - `pipeshard probe`: what `plan` needs to know of this host: the memory available
 * for weights and KV cache, and the decode speed of its kernels (milliseconds per GB of
 * weights one token reads, timed on a model's own matrices or on synthetic Q4_0 ones), as a
 * hosts.json entry. Usage errors exit 2, runtime errors 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coord/coord.h"
#include "../coord/fleet.h"
#include "../model/model.h"
#include "../tensor/matmul.h"
#include "../tensor/pool.h"
#include "args.h"
#include "cli.h"

#define CMD "probe"

static void usage(FILE *f) {
    fputs("usage: pipeshard probe [-m MODEL] [-t THREADS] [--name NAME] [--address HOST:PORT]\n"
          "\n"
          "Measures this host for `pipeshard plan`: the memory available (MemAvailable) and the\n"
          "decode speed, milliseconds per GB of weights one token reads (timed for about a\n"
          "second). Prints a table, then the host's hosts.json entry.\n"
          "\n"
          "  -m, --model FILE     time decode steps of this model or shard (every layer, attention,\n"
          "                       norms, head: its types and shapes); default: one-row products of\n"
          "                       synthetic Q4_0 matrices of a 1B model's layer shape, 2048 x 8192\n"
          "  -t, --threads N      threads, as the worker will use them (default: all cores)\n"
          "  --name NAME          the entry's name (default: the host name)\n"
          "  --address HOST:PORT  the entry's address (where this host's worker will listen)\n"
          "  -h, --help           show this help\n",
          f);
}

/* MemAvailable of /proc/meminfo in bytes, or 0. */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* Milliseconds per GB for one-row products over the matrices ws[0..n), timed for about a second. */
static double time_matrices(const ps_mat *const *ws, int n, ps_pool *pool, char *err, size_t errlen, bool *ok) {
    int64_t cols = 0, rows = 0;
    size_t scratch = 0;
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        cols = ws[i]->cols > cols ? ws[i]->cols : cols, rows = ws[i]->rows > rows ? ws[i]->rows : rows;
        size_t s = ps_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, 1);
        scratch = s > scratch ? s : scratch;
        bytes += (double)ws[i]->rows * ps_row_bytes(ws[i]->type, ws[i]->cols);
    }
    float *x = malloc((size_t)cols * sizeof *x), *y = malloc((size_t)rows * sizeof *y);
    void *sc = scratch ? malloc(scratch) : NULL;
    *ok = x && y && (!scratch || sc);
    double ms = 0;
    int reps = 0;
    if (!*ok) ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; *ok && i < cols; i++) x[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    double t0 = ps_now();
    for (; *ok && (reps < 3 || ps_now() - t0 < 1.0); reps++) {
        double a = ps_now();
        for (int i = 0; i < n; i++) ps_matmul(ws[i], x, ws[i]->cols, 1, y, ws[i]->rows, sc, pool);
        if (reps) ms += (ps_now() - a) * 1000; /* the first pass warms the caches and pages up */
    }
    free(x), free(y), free(sc);
    return reps > 1 ? ms / (reps - 1) / (bytes / 1e9) : 0;
}

/* Milliseconds per GB for decode steps of model m (a whole model or a shard: every layer,
 * attention, norms and head included), after a 16-token prompt, timed for about a second. */
static double time_model(const ps_model *m, ps_pool *pool, char *err, size_t errlen, bool *ok) {
    ps_ctx_params cp = {.n_ctx = 512, .max_batch = 16, .act = PS_ACT_Q8};
    ps_ctx *c = NULL;
    int dim = m->hp.dim;
    float *x = calloc((size_t)16 * dim, sizeof *x),
          *out = malloc((size_t)16 * (dim > m->hp.vocab ? dim : m->hp.vocab) * 4);
    int32_t toks[16] = {1};
    *ok = x && out && !ps_ctx_create(m, &cp, pool, &c, err, errlen);
    if (*ok && !x) ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < dim * 16 && x; i++) x[i] = (float)((i * 37 % 101) - 50) / 500.0f;
    double ms = 0;
    int steps = 0, pos = 16;
    if (*ok) *ok = !ps_forward_stage(c, toks, x, 16, 0, out, 1, err, errlen);
    for (double t0 = ps_now(); *ok && pos < cp.n_ctx && (steps < 4 || ps_now() - t0 < 1.0); steps++, pos++) {
        double a = ps_now();
        *ok = !ps_forward_stage(c, toks, x, 1, pos, out, 1, err, errlen);
        if (steps) ms += (ps_now() - a) * 1000; /* the first step warms up */
    }
    ps_ctx_free(c);
    free(x), free(out);
    return steps > 1 ? ms / (steps - 1) / (ps_model_decode_weight_bytes(m) / 1e9) : 0;
}

int ps_cli_probe(int argc, char **argv) {
    const char *model = NULL, *name = NULL, *address = NULL;
    long long threads = ps_cpu_count();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
        static const char *const known[] = {"-m", "--model", "-t", "--threads", "--name", "--address", "--help", NULL};
        bool valued = false;
        for (int k = 0; known[k]; k++) valued |= !strcmp(a, known[k]) && strcmp(a, "--help");
        if (!valued) return ps_arg_unknown(CMD, a, known, NULL);
        if (!(v = ps_arg_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--address")) {
            address = v;
            if (!ps_fleet_address_ok(v)) {
                fprintf(stderr, "pipeshard probe: --address must be HOST:PORT or unix:PATH, got '%s'\n", v);
                return 2;
            }
        } else if (!ps_arg_int(CMD, a, v, 1, 1024, &threads))
            return 2;
    }
    char err[1024] = "", host[256] = "";
    if (!name) gethostname(host, sizeof host - 1), name = host;
    ps_model *m = NULL;
    ps_pool *pool = NULL;
    void *synth = NULL;
    int rc = 1;
    if (model && ps_model_load(model, PS_GGUF_HUGE, &m, err, sizeof err)) goto out;
    if (ps_pool_create((int)threads, &pool)) {
        snprintf(err, sizeof err, "cannot start %lld threads", threads);
        goto out;
    }
    const ps_mat *ws[2];
    int n = 0;
    ps_mat syn[2];
    if (!m) { /* two Q4_0 matrices of a 1B layer's feed-forward shape, random bytes (scales tame) */
        size_t rb = ps_row_bytes(PS_TYPE_Q4_0, 2048), bytes = rb * 8192;
        synth = malloc(2 * bytes);
        if (!synth) {
            snprintf(err, sizeof err, "out of memory");
            goto out;
        }
        uint8_t *p = synth;
        for (size_t i = 0; i < 2 * bytes; i++) p[i] = (uint8_t)(i * 2654435761u >> 13);
        for (size_t b = 0; b < 2 * bytes / 18; b++) p[b * 18] = 0, p[b * 18 + 1] = 0x2c; /* d = 1/16 */
        syn[0] = (ps_mat){PS_TYPE_Q4_0, 8192, 2048, p};
        syn[1] = (ps_mat){PS_TYPE_Q4_0, 2048, 8192, p + bytes};
        ws[n++] = &syn[0], ws[n++] = &syn[1];
    }
    bool ok;
    double ms_per_gb = m ? time_model(m, pool, err, sizeof err, &ok) : time_matrices(ws, n, pool, err, sizeof err, &ok);
    double mem = mem_available();
    if (!ok) goto out;
    printf("host         %s\n", name);
    printf("memory       %.2f GiB available (MemAvailable)\n", mem / 1073741824.0);
    printf("decode       %.1f ms per GB of weights, %lld threads, %s kernels, %s\n", ms_per_gb, threads,
           ps_matmul_isa(), m ? model : "synthetic Q4_0");
    printf("\n{\"name\": \"%s\", %s%s%s\"mem\": \"%.1fG\", \"ms_per_gb\": %.2f}\n", name,
           address ? "\"address\": \"" : "", address ? address : "", address ? "\", " : "", mem / 1073741824.0,
           ms_per_gb);
    rc = 0;
out:
    if (rc) fprintf(stderr, "pipeshard probe: %s\n", err);
    free(synth);
    ps_pool_free(pool);
    ps_model_free(m);
    return rc;
}
