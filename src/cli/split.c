/* split.c - `pipeshard split`: cuts a model by layers into shards (one GGUF file per stage)
 * and writes fleet.json next to them (src/model/shard.h). Prints a table of the stages on
 * stdout at the end. Usage errors exit 2, runtime errors 1, each one stderr line starting
 * with "pipeshard split: ". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coord/fleet.h"
#include "args.h"
#include "cli.h"

#define CMD "split"

/* Prints the command's usage to f. */
static void usage(FILE *f) {
    fprintf(f,
            "usage: pipeshard split -m MODEL (--stages N | --layers SPEC) -o DIR [options]\n"
            "\n"
            "Cuts a GGUF model by layers into shards, one per pipeline stage, and writes\n"
            "DIR/stage-K.gguf and DIR/fleet.json (each stage's layers, shard, fingerprint and\n"
            "address). Stage 0 also holds the token embedding, the last stage the final norm and\n"
            "the output head. By default the layers are placed so that the largest shard is as\n"
            "small as possible.\n"
            "\n"
            "  -m, --model FILE        GGUF model to split\n"
            "  --stages N              number of stages, 1 to %d (at most the model's layer count)\n"
            "  --layers SPEC           the layers of each stage instead of the default plan, as\n"
            "                          BEGIN:END ranges from 0 to the layer count, e.g. 0:8,8:16,16:30\n"
            "                          (with --stages, the two must agree); the first may be 0:0: stage 0\n"
            "                          then holds the embedding alone, every layer on the workers\n"
            "  --workers LIST          HOST:PORT (or unix:PATH) of stages 1..N-1, comma-separated (default\n"
            "                          127.0.0.1:7701, 127.0.0.1:7702, ...); stage 0 runs in the\n"
            "                          coordinator. Edit fleet.json to change them later.\n"
            "  -o, --output DIR        directory to write (created if absent; files there are replaced)\n"
            "  --quiet                 no progress or closing line on stderr\n"
            "  -h, --help              show this help\n",
            PS_SHARD_MAX_STAGES);
}

// ---------------------------------------------------------------------------------------
// Command line

typedef struct {
    const char *model, *layers, *workers, *out;
    long long stages; /* 0: not given */
    bool quiet, help;
} opts;

/* The destination of a string flag, or NULL when flag is not one. */
static const char **str_flag(opts *o, const char *flag) {
    if (!strcmp(flag, "-m") || !strcmp(flag, "--model")) return &o->model;
    if (!strcmp(flag, "--layers")) return &o->layers;
    if (!strcmp(flag, "--workers")) return &o->workers;
    if (!strcmp(flag, "-o") || !strcmp(flag, "--output")) return &o->out;
    return NULL;
}

/* Parses argv (argv[0] is "split") into o; false after printing a usage error. A flag
 * given twice is an error, not a silent override. */
static bool parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], **sp;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            o->help = true;
        else if (!strcmp(a, "--quiet"))
            o->quiet = true;
        else if ((sp = str_flag(o, a))) {
            if (*sp) return ps_cli_fail(CMD, 0, "option '%s' is given twice", a), false;
            if (!(*sp = ps_arg_value(CMD, argc, argv, &i))) return false;
            if (!**sp) return ps_cli_fail(CMD, 0, "option '%s' needs a non-empty value", a), false;
        } else if (!strcmp(a, "--stages")) {
            if (o->stages) return ps_cli_fail(CMD, 0, "option '%s' is given twice", a), false;
            const char *v = ps_arg_value(CMD, argc, argv, &i);
            if (!v || !ps_arg_int(CMD, a, v, 1, PS_SHARD_MAX_STAGES, &o->stages)) return false;
        } else {
            static const char *const known[] = {"--help",    "--quiet", "-m",       "--model",  "--layers",
                                                "--workers", "-o",      "--output", "--stages", NULL};
            ps_arg_unknown(CMD, a, known, NULL);
            return false;
        }
    }
    return true;
}

/* The required flags are there; false after printing which one is missing. */
static bool check_required(const opts *o) {
    if (!o->model) return ps_cli_fail(CMD, 0, "missing -m MODEL (the model to split)"), false;
    if (!o->stages && !o->layers) return ps_cli_fail(CMD, 0, "missing --stages N (or --layers SPEC)"), false;
    if (!o->out) return ps_cli_fail(CMD, 0, "missing -o DIR (the directory to write the shards into)"), false;
    return true;
}

/* Splits --workers into n_stages - 1 addresses (pointers into buf, a copy of the list);
 * false after printing what is wrong. */
static bool parse_workers(const char *list, int n_stages, char *buf, size_t cap, const char **addr) {
    size_t len = strlen(list);
    if (n_stages == 1)
        return ps_cli_fail(CMD, 0, "--workers names the workers of stages 1..N-1, but there is only one stage"), false;
    if (len >= cap) return ps_cli_fail(CMD, 0, "--workers is too long"), false;
    memcpy(buf, list, len + 1);
    int n = 0;
    for (char *p = buf;; n++) {
        char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        if (comma) *comma = 0;
        if (!ps_fleet_address_ok(p))
            return ps_cli_fail(CMD, 0, "--workers: '%.*s' is not HOST:PORT or unix:PATH", (int)(l > 80 ? 80 : l), p),
                   false;
        if (n < n_stages - 1) addr[n] = p;
        if (!comma) break;
        p = comma + 1;
    }
    n++;
    if (n != n_stages - 1)
        return ps_cli_fail(CMD, 0,
                           "--workers gives %d address%s, but %d stage%s need%s one (stages 1..%d; stage 0 runs in the "
                           "coordinator)",
                           n, n == 1 ? "" : "es", n_stages - 1, n_stages == 2 ? "" : "s", n_stages == 2 ? "s" : "",
                           n_stages - 1),
               false;
    return true;
}

// ---------------------------------------------------------------------------------------
// Plan

/* Opens the model and decides the layer bounds (from --layers or the default plan) and the
 * stage count; returns -1 to go on, else the exit status. */
static int plan(const opts *o, int *bounds, int *n_stages) {
    char err[512] = "";
    ps_gguf *g = NULL;
    uint64_t *lb = NULL, eb, hb;
    int n_layer = 0, rc = 1;
    ps_status s = ps_gguf_open(o->model, &g, err, sizeof err);
    if (s) return ps_cli_fail(CMD, 1, "%s", err);
    ps_shard_meta meta;
    if ((s = ps_shard_meta_read(g, &meta, err, sizeof err))) {
        ps_cli_fail(CMD, 1, "%s: %s", o->model, err);
        goto out;
    }
    if (meta.present) {
        ps_cli_fail(CMD, 1, "%s is a shard (stage %d of %d), not a whole model", o->model, meta.stage_index,
                    meta.stage_count);
        goto out;
    }
    if ((s = ps_shard_n_layer(g, &n_layer, err, sizeof err))) {
        ps_cli_fail(CMD, 1, "%s: %s", o->model, err);
        goto out;
    }
    if (!(lb = malloc((size_t)n_layer * sizeof *lb))) {
        ps_cli_fail(CMD, 1, "out of memory");
        goto out;
    }
    if ((s = ps_shard_layer_bytes(g, n_layer, lb, &eb, &hb, err, sizeof err))) {
        ps_cli_fail(CMD, 1, "%s: %s", o->model, err);
        goto out;
    }
    rc = 2;
    if (o->layers) {
        if (ps_shard_parse_layers(o->layers, n_layer, (int)o->stages, bounds, n_stages, err, sizeof err)) {
            ps_cli_fail(CMD, 2, "--layers %s: %s", o->layers, err);
            goto out;
        }
    } else if (o->stages > n_layer) {
        ps_cli_fail(CMD, 2, "--stages %lld is more than the model's %d layers (every stage needs at least one layer)",
                    o->stages, n_layer);
        goto out;
    } else {
        *n_stages = (int)o->stages;
        if (ps_shard_plan(lb, n_layer, eb, hb, *n_stages, bounds, err, sizeof err)) {
            ps_cli_fail(CMD, 1, "%s", err);
            rc = 1;
            goto out;
        }
    }
    rc = -1;
out:
    free(lb);
    ps_gguf_close(g);
    return rc;
}

// ---------------------------------------------------------------------------------------
// Writing

typedef struct {
    bool show; /* draw the progress line */
    bool open; /* a progress line is on the screen without its newline */
    double t0;
} progress_state;

/* Progress callback: one stderr line rewritten in place with bytes and percent. */
static void progress(void *ctx, uint64_t done, uint64_t total) {
    progress_state *p = ctx;
    if (!p->show) return;
    double mb = 1024.0 * 1024.0;
    fprintf(stderr, "\rpipeshard split: %8.1f / %.1f MiB (%3d%%) %6.1f s", done / mb, total / mb,
            total ? (int)(100 * done / total) : 100, ps_now() - p->t0);
    p->open = done != total;
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* Prints the stages of the fleet just written: a table on stdout. */
static int print_table(const char *dir, double t0, bool quiet) {
    char path[4200], err[512] = "";
    snprintf(path, sizeof path, "%s%sfleet.json", dir, dir[strlen(dir) - 1] == '/' ? "" : "/");
    ps_fleet *f = malloc(sizeof *f);
    if (!f) return ps_cli_fail(CMD, 1, "out of memory");
    if (ps_fleet_load(path, f, err, sizeof err)) {
        free(f);
        return ps_cli_fail(CMD, 1, "the fleet just written does not load: %s", err);
    }
    uint64_t total = 0;
    printf("%-6s %-9s %13s %9s  %-21s %s\n", "stage", "layers", "bytes", "MiB", "address", "shard");
    for (int k = 0; k < f->n_stages; k++) {
        const ps_fleet_stage *s = &f->stages[k];
        char layers[32];
        snprintf(layers, sizeof layers, "%d:%d", s->layer_begin, s->layer_end);
        printf("%-6d %-9s %13llu %9.1f  %-21s %s\n", k, layers, (unsigned long long)s->bytes,
               (double)s->bytes / (1024.0 * 1024.0), s->address, s->shard);
        total += s->bytes;
    }
    fflush(stdout);
    if (!quiet)
        fprintf(stderr, "pipeshard split: wrote %d shard%s (%.1f MiB) and %s in %.1f s\n", f->n_stages,
                f->n_stages == 1 ? "" : "s", (double)total / (1024.0 * 1024.0), path, ps_now() - t0);
    free(f);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Entry point

/* See cli.h: parse and check the flags (exit 2), plan against the model (exit 2 when the
 * flags do not fit it), write the shards and fleet.json (exit 1 on failure). */
int ps_cli_split(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) return 2;
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (!check_required(&o)) return 2;
    double t0 = ps_now();
    int bounds[PS_SHARD_MAX_STAGES + 1], n_stages = 0;
    char wbuf[PS_SHARD_MAX_STAGES * 256];
    const char *addr[PS_SHARD_MAX_STAGES];
    if (o.workers && o.stages && !parse_workers(o.workers, (int)o.stages, wbuf, sizeof wbuf, addr)) return 2;
    int rc = plan(&o, bounds, &n_stages);
    if (rc >= 0) return rc;
    if (o.workers && !o.stages && !parse_workers(o.workers, n_stages, wbuf, sizeof wbuf, addr)) return 2;
    progress_state ps = {.show = !o.quiet && isatty(STDERR_FILENO), .t0 = t0};
    char err[512] = "";
    ps_status s =
        ps_fleet_split(o.model, n_stages, bounds, o.workers ? addr : NULL, o.out, progress, &ps, err, sizeof err);
    if (s) {
        if (ps.open) fputc('\n', stderr);
        return ps_cli_fail(CMD, 1, "%s", *err ? err : ps_strerror(s));
    }
    return print_table(o.out, t0, o.quiet);
}
