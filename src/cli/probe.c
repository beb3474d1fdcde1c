/* probe.c - `pipeshard probe`: what `plan` needs to know of this host: the memory available
 * for weights and KV cache, and the decode speed of its kernels (milliseconds per GB of
 * weights one token reads, timed on a model's own matrices or on synthetic Q4_0 ones), as a
 * hosts.json entry; with --link, of the link between this host and a running worker's: the
 * round trip and the rate each way (net.h's link probe), as a hosts.json "links" entry.
 * Usage errors exit 2, runtime errors 1. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coord/coord.h"
#include "../coord/fleet.h"
#include "../model/model.h"
#include "../net/net.h"
#include "../tensor/matmul.h"
#include "args.h"
#include "cli.h"

#define CMD "probe"

static void usage(FILE *f) {
    fputs("usage: pipeshard probe [-m MODEL] [-t THREADS] [--name NAME] [--address HOST:PORT]\n"
          "       pipeshard probe --link HOST:PORT [--key-file F] [--name NAME] [--to NAME] [--timeout-ms MS]\n"
          "\n"
          "Measures this host for `pipeshard plan`: the memory available (MemAvailable) and the\n"
          "decode speed, milliseconds per GB of weights one token reads (timed for about a\n"
          "second). Prints a table, then the host's hosts.json entry.\n"
          "With --link, measures the link to a running worker instead (its session, if any, goes\n"
          "on undisturbed): the round trip (median of 20) and the rate each way (best of 3\n"
          "transfers of 16 MiB, less on a slow link); the worker reports its host's memory and\n"
          "its own decode speed (timed on its shard, on the CPU, at the first probe that finds it\n"
          "idle). Prints a table, then the worker's hosts.json entry (when it has a speed) and the\n"
          "\"links\" entry.\n"
          "\n"
          "  -m, --model FILE     time decode steps of this model or shard (every layer, attention,\n"
          "                       norms, head: its types and shapes); default: one-row products of\n"
          "                       synthetic Q4_0 matrices of a 1B model's layer shape, 2048 x 8192\n"
          "  -t, --threads N      threads, as the worker will use them (default: all cores)\n"
          "  --name NAME          the entry's name (default: the host name)\n"
          "  --address HOST:PORT  the entry's address (where this host's worker will listen)\n"
          "  --link HOST:PORT     measure the link to the worker listening there (or unix:PATH)\n"
          "  --key-file F         with --link: the shared key the worker requires\n"
          "  --to NAME            with --link: the worker's host's name in the entry (default: the host\n"
          "                       name the worker reports); --name is this end's (default: this host's)\n"
          "  --timeout-ms MS      with --link: bound on connecting and on each step (default 10000)\n"
          "  -h, --help           show this help\n",
          f);
}

/* The longest host name hosts.json takes (plan's ps_plan_host.name holds 64 bytes). */
#define NAME_MAX_BYTES 63

/* Whether s can name a host in hosts.json as printed here: 1 to NAME_MAX_BYTES bytes of
 * printable ASCII without '"' or '\\'. */
static bool name_ok(const char *s) {
    size_t n = strlen(s);
    for (const char *q = s; *q; q++)
        if (*q < ' ' || *q > '~' || *q == '"' || *q == '\\') return false;
    return n >= 1 && n <= NAME_MAX_BYTES;
}

/* v with three significant digits (at least one whole digit, at most 6 decimals), for the
 * table and the JSON entry: never 0 for a positive v of 1e-6 or more. */
static void fmt_num(char *out, size_t cap, double v) {
    int dec = v > 0 ? 2 - (int)floor(log10(v)) : 0;
    snprintf(out, cap, "%.*f", dec < 0 ? 0 : dec > 6 ? 6 : dec, v);
}

/* `probe --link`: measures the link to the worker at addr (with key_file's key when given)
 * and prints a table, then the "links" entry between name (NULL: this host's name) and to
 * (NULL: the worker's host name). */
static int probe_link(const char *addr, const char *key_file, const char *name, const char *to, int timeout_ms) {
    char err[1024] = "", host[256] = "";
    uint8_t key[32];
    if (key_file && ps_net_key_load(key_file, key, err, sizeof err)) return ps_cli_fail(CMD, 1, "%s", err);
    signal(SIGPIPE, SIG_IGN);
    ps_link_probe lp;
    if (ps_net_link_probe(addr, key_file ? key : NULL, timeout_ms, &lp, err, sizeof err))
        return ps_cli_fail(CMD, 1, "%s", err);
    if (!name) gethostname(host, sizeof host - 1), name = host;
    if (!to) to = lp.host.host;
    if (!name_ok(name) || !name_ok(to))
        return ps_cli_fail(CMD, 1,
                           "%s host name '%s' is not 1 to %d plain ASCII bytes as hosts.json takes: give %s NAME",
                           name_ok(name) ? "the worker's" : "this", name_ok(name) ? to : name, NAME_MAX_BYTES,
                           name_ok(name) ? "--to" : "--name");
    const ps_hello *wh = &lp.worker;
    char serves[160], rtt[32], lo[32], hi[32], up[32], down[32], mbps[32], bulk[32];
    if (wh->n_layer == 0)
        snprintf(serves, sizeof serves, "no shard yet");
    else
        snprintf(serves, sizeof serves, "stage %d of %d, layers %d..%d", wh->stage, wh->stage_count, wh->layer_begin,
                 wh->layer_end);
    fmt_num(rtt, sizeof rtt, lp.rtt_ms), fmt_num(lo, sizeof lo, lp.rtt_min_ms), fmt_num(hi, sizeof hi, lp.rtt_max_ms);
    fmt_num(up, sizeof up, lp.up_mbps), fmt_num(down, sizeof down, lp.down_mbps);
    fmt_num(mbps, sizeof mbps, fmin(lp.up_mbps, lp.down_mbps));
    ps_size_format(lp.bulk_bytes, bulk, sizeof bulk);
    printf("link         %s to %s (%s), frames %s\n", name, to, addr, lp.sealed ? "sealed" : "in the clear");
    printf("worker       host %s: %s; %d thread%s, %s, %.2f GiB available\n", lp.host.host, serves,
           (int)lp.host.threads, lp.host.threads == 1 ? "" : "s", lp.host.device, lp.host.mem_available / 1073741824.0);
    if (lp.host.ms_per_gb > 0)
        printf("decode       %.1f ms per GB of weights (the worker's, %s)\n", lp.host.ms_per_gb,
               wh->n_layer ? "timed on its shard" : "timed on synthetic Q4_0 matrices");
    else
        printf("decode       not measured by the worker (%s)\n",
               strcmp(lp.host.device, "cpu") ? "its layers run on a GPU"
                                             : "a session was running, or its --max-mem leaves no room to");
    printf("round trip   %s ms (median of 20; %s to %s)\n", rtt, lo, hi);
    printf("upload       %s Mbit/s (best of 3 transfers of %s)\n", up, bulk);
    printf("download     %s Mbit/s (best of 3 transfers of %s)\n", down, bulk);
    printf("\n");
    if (lp.host.ms_per_gb > 0) /* the worker's host as hosts.json takes it, then the link */
        printf("{\"name\": \"%s\", \"address\": \"%s\", \"mem\": \"%.1fG\", \"ms_per_gb\": %.2f}\n", to, addr,
               lp.host.mem_available / 1073741824.0, lp.host.ms_per_gb);
    printf("{\"between\": [\"%s\", \"%s\"], \"rtt_ms\": %s, \"mbps\": %s}\n", name, to, rtt, mbps);
    if (!strcmp(name, to))
        fprintf(stderr,
                "pipeshard probe: note: both ends are named '%s', which hosts.json cannot tell apart: give --name or "
                "--to\n",
                name);
    return 0;
}

int ps_cli_probe(int argc, char **argv) {
    const char *model = NULL, *name = NULL, *address = NULL, *link = NULL, *key_file = NULL, *to = NULL;
    const char *host_flag = NULL, *link_flag = NULL; /* a flag of each mode given, to refuse mixing them */
    long long threads = ps_cpu_count(), timeout_ms = 10000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
        static const char *const known[] = {"-m",     "--model",    "-t",   "--threads",    "--name", "--address",
                                            "--link", "--key-file", "--to", "--timeout-ms", "--help", NULL};
        bool valued = false;
        for (int k = 0; known[k]; k++) valued |= !strcmp(a, known[k]) && strcmp(a, "--help");
        if (!valued) return ps_arg_unknown(CMD, a, known, NULL);
        if (!(v = ps_arg_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--link") || !strcmp(a, "--key-file") || !strcmp(a, "--to") || !strcmp(a, "--timeout-ms"))
            link_flag = a;
        else if (strcmp(a, "--name"))
            host_flag = a;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--name") || !strcmp(a, "--to")) {
            if (!name_ok(v))
                return ps_cli_fail(CMD, 2, "%s must be 1 to %d bytes of printable ASCII without '\"' or '\\', got '%s'",
                                   a, NAME_MAX_BYTES, v);
            *(!strcmp(a, "--name") ? &name : &to) = v;
        } else if (!strcmp(a, "--address") || !strcmp(a, "--link")) {
            if (!ps_fleet_address_ok(v))
                return ps_cli_fail(CMD, 2, "%s must be HOST:PORT or unix:PATH, got '%s'", a, v);
            *(!strcmp(a, "--address") ? &address : &link) = v;
        } else if (!strcmp(a, "--key-file"))
            key_file = v;
        else if (!strcmp(a, "--timeout-ms") ? !ps_arg_int(CMD, a, v, 1, 3600000, &timeout_ms)
                                            : !ps_arg_int(CMD, a, v, 1, 1024, &threads))
            return 2;
    }
    if (link && host_flag)
        return ps_cli_fail(CMD, 2, "--link measures a link, %s this host: give them to two runs of probe", host_flag);
    if (!link && link_flag) return ps_cli_fail(CMD, 2, "%s goes with --link HOST:PORT", link_flag);
    if (link) return probe_link(link, key_file, name, to, (int)timeout_ms);
    char err[1024] = "", host[256] = "";
    if (!name) gethostname(host, sizeof host - 1), name = host;
    ps_model *m = NULL;
    int rc = 1;
    if (model && ps_model_load(model, PS_GGUF_HUGE, &m, err, sizeof err)) goto out;
    double ms_per_gb = ps_decode_ms_per_gb(m, (int)threads, err, sizeof err);
    double mem = (double)ps_mem_available();
    if (!ms_per_gb) goto out;
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
    ps_model_free(m);
    return rc;
}
