/* worker.c - `pipeshard worker`: serve one shard on a TCP port (or a Unix socket), given as a
 * file or placed by the coordinator into a cache. */
#include "../stage/worker.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void worker_usage(FILE *f) {
    fprintf(
        f,
        "usage: pipeshard worker --shard FILE --listen HOST:PORT [options]\n"
        "       pipeshard worker --cache DIR --key-file F --listen HOST:PORT [--max-disk SIZE] [options]\n"
        "  --shard FILE              shard of stage 1 or later, written by `pipeshard split`\n"
        "  --cache DIR               instead of --shard: take the shard the coordinator names (sent over the\n"
        "                            connection, checked against its fingerprint) and keep it in DIR for the\n"
        "                            next session and the next start (DIR is created; needs --key-file)\n"
        "  --max-disk SIZE           with --cache: the most DIR's shards may take, e.g. 500M, 20G or bytes;\n"
        "                            least recently used shards go first (default: the free space)\n"
        "  --prefix-dir DIR          keep this stage's part of the prefixes a coordinator captures (`serve`'s\n"
        "                            POST /v1/prefixes) in DIR, one file per prefix, and restore them from\n"
        "                            there when a coordinator asks (DIR is created; needs --key-file)\n"
        "  --listen HOST:PORT        address to serve on (PORT 0 = any free port, printed on stderr);\n"
        "                            unix:PATH = a Unix socket, for a coordinator on this host\n"
        "  -t, --threads N           compute threads (default: all cores)\n"
        "  --device D                where the shard's layers run: cpu (default), cuda (GPU 0) or cuda:N; on\n"
        "                            a GPU it holds the layers and the KV cache in GPU memory (see pipeshard\n"
        "                            run --help)\n"
        "  --host-hops               send activations to a next stage on a GPU of this host by TCP too (by\n"
        "                            default two GPU stages of one host pass them device to device)\n"
        "  --pin                     pin thread i to the i-th CPU this process may use (see pipeshard run --help)\n"
        "  --mmap                    map the shard instead of reading it into huge pages (see pipeshard run --help)\n"
        "  --key-file F              shared key (`pipeshard keygen -o F` writes one): peers must prove they\n"
        "                            hold the same file; frames after the handshake are then sealed\n"
        "                            (encrypted, authenticated). Without one, a worker on a non-loopback\n"
        "                            address serves anyone who can reach it\n"
        "  --plain-frames            with a key: frames in the clear when the peer asks too (peers on\n"
        "                            this host only: sealing then buys nothing)\n"
        "  --sim-latency-ms MS       emulated one-way delay added to every outgoing hop (default 0)\n"
        "  --sim-bandwidth-mbps R    emulated rate limit of every outgoing hop, megabits/s (default 0 = none)\n"
        "  --timeout-ms MS           handshakes and frame transfers time out after MS (default 30000)\n"
        "  --max-ctx N               most positions a session may ask for (default: the model's trained context)\n"
        "  --max-mem SIZE            most memory the shard and a session's KV cache and buffers may take, e.g.\n"
        "                            6G: a larger shard is refused at start (or when placed), a session that\n"
        "                            asks for more context or sequences than fit when it begins\n"
        "  --no-verify               skip recomputing the shard's fingerprint at start-up (with --cache: of a\n"
        "                            cached shard when it is placed; a shard received is always checked)\n"
        "  --ready-fd N              (for --local-stages) write the port (or the unix: address) to file\n"
        "                            descriptor N once listening\n");
}

/* Whether --listen's value is HOST:PORT or unix:PATH; false after printing what is expected. */
static bool listen_ok(const char *addr) {
    char host[256], err[512];
    int port;
    if (ps_net_is_unix(addr) || !ps_net_parse_addr(addr, host, sizeof host, &port, err, sizeof err)) return true;
    if (*addr && strspn(addr, "0123456789") == strlen(addr))
        fprintf(stderr,
                "pipeshard worker: --listen expects HOST:PORT or unix:PATH, got '%s'; did you mean 0.0.0.0:%s (every "
                "interface) or 127.0.0.1:%s (this host only)?\n",
                addr, addr, addr);
    else
        fprintf(stderr, "pipeshard worker: --listen expects HOST:PORT or unix:PATH: %s\n", err);
    return false;
}

/* Whether --max-disk's value is a size; false after saying what is expected. */
static bool max_disk_ok(const char *v, uint64_t *out) {
    char err[256];
    if (!ps_size_parse(v, out, err, sizeof err)) return true;
    fprintf(stderr, "pipeshard worker: --max-disk: %s\n", err);
    return false;
}

/* Whether the flags say where the shard comes from: --shard FILE, or --cache DIR with
 * --key-file (only a coordinator that proves the key may place a shard on this machine);
 * false after saying what is wrong. */
static bool shard_flags_ok(const ps_worker_opts *o, const char *key_file) {
    const char *why = NULL;
    if (o->shard && o->cache)
        why = "--shard and --cache are one or the other: --shard FILE serves that file, --cache DIR takes the "
              "shard the coordinator sends";
    else if (!o->shard && !o->cache)
        why = "no shard given (--shard FILE, or --cache DIR to take it from the coordinator)";
    else if (o->cache && !key_file)
        why = "--cache needs --key-file: only a coordinator that holds the key may place a shard on this machine "
              "(`pipeshard keygen -o KEY` writes one)";
    else if (o->prefix_dir && !key_file)
        why = "--prefix-dir needs --key-file: only a coordinator that holds the key may write files on this machine";
    else if (o->max_disk && !o->cache)
        why = "--max-disk bounds the --cache directory: it needs --cache DIR";
    if (why) fprintf(stderr, "pipeshard worker: %s\n", why);
    return !why;
}

int ps_cli_worker(int argc, char **argv) {
    ps_worker_opts o = {
        .threads = ps_cpu_count(), .timeout_ms = 30000, .ready_fd = -1, .verify = true, .stop = &stop_flag};
    const char *key_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return worker_usage(stdout), 0;
        const struct {
            const char *flag;
            bool *field, value;
        } switches[] = {{"--no-verify", &o.verify, false},
                        {"--pin", &o.pin, true},
                        {"--mmap", &o.mmap, true},
                        {"--plain-frames", &o.plain, true},
                        {"--host-hops", &o.host_hops, true}};
        size_t k = 0;
        while (k < PS_ARRAY_LEN(switches) && strcmp(a, switches[k].flag)) k++;
        if (k < PS_ARRAY_LEN(switches)) {
            *switches[k].field = switches[k].value;
            continue;
        }
        static const char *const valued[] = {
            "--shard",      "--cache",   "--max-disk", "--prefix-dir",     "--listen",
            "--key-file",   "-t",        "--threads",  "--sim-latency-ms", "--sim-bandwidth-mbps",
            "--timeout-ms", "--max-ctx", "--ready-fd", "--device",         "--max-mem"};
        size_t j = 0;
        while (j < PS_ARRAY_LEN(valued) && strcmp(a, valued[j])) j++;
        if (j == PS_ARRAY_LEN(valued)) {
            const char *known[1 + PS_ARRAY_LEN(switches) + PS_ARRAY_LEN(valued) + 1] = {"--help"};
            size_t n = 1;
            for (k = 0; k < PS_ARRAY_LEN(switches); k++) known[n++] = switches[k].flag;
            for (j = 0; j < PS_ARRAY_LEN(valued); j++) known[n++] = valued[j];
            known[n] = NULL;
            return ps_arg_unknown("worker", a, known, NULL);
        }
        bool ok = (v = ps_arg_value("worker", argc, argv, &i)) != NULL;
        if (!ok) return 2;
        if (!strcmp(a, "--shard"))
            o.shard = v;
        else if (!strcmp(a, "--cache"))
            o.cache = v;
        else if (!strcmp(a, "--prefix-dir"))
            o.prefix_dir = v;
        else if (!strcmp(a, "--max-disk"))
            ok = max_disk_ok(v, &o.max_disk);
        else if (!strcmp(a, "--listen"))
            o.listen = v;
        else if (!strcmp(a, "--key-file"))
            key_file = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = ps_arg_int("worker", a, v, 1, 1024, &n) && ((o.threads = (int)n), 1);
        else if (!strcmp(a, "--sim-latency-ms"))
            ok = ps_arg_float("worker", a, v, 0, 1e5, &o.sim.latency_ms);
        else if (!strcmp(a, "--sim-bandwidth-mbps"))
            ok = ps_arg_mbps("worker", a, v, &o.sim.bandwidth_mbps);
        else if (!strcmp(a, "--timeout-ms"))
            ok = ps_arg_int("worker", a, v, 1, 86400000, &n) && ((o.timeout_ms = (int)n), 1);
        else if (!strcmp(a, "--max-ctx"))
            ok = ps_arg_int("worker", a, v, 1, 1 << 24, &n) && ((o.max_ctx = (int)n), 1);
        else if (!strcmp(a, "--device"))
            ok = ps_arg_device("worker", a, v, &o.device);
        else if (!strcmp(a, "--max-mem")) {
            char e[200];
            ok = !ps_size_parse(v, &o.max_mem, e, sizeof e);
            if (!ok) fprintf(stderr, "pipeshard worker: --max-mem: %s\n", e);
        } else /* --ready-fd */
            ok = ps_arg_int("worker", a, v, 0, 1 << 20, &n) && ((o.ready_fd = (int)n), 1);
        if (!ok) return 2;
    }
    if (!shard_flags_ok(&o, key_file)) return 2;
    if (!o.listen) {
        fprintf(stderr, "pipeshard worker: no address given (--listen HOST:PORT)\n");
        return 2;
    }
    char err[1024] = "";
    if (!listen_ok(o.listen)) return 2;
    uint8_t key[32];
    if (key_file && ps_net_key_load(key_file, key, err, sizeof err)) {
        fprintf(stderr, "pipeshard worker: %s\n", err);
        return 1;
    }
    o.key = key_file ? key : NULL;
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: poll returns on a signal */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ps_status s = ps_worker_serve(&o, err, sizeof err);
    if (s) fprintf(stderr, "pipeshard worker: %s\n", err[0] ? err : ps_strerror(s));
    return s ? 1 : 0;
}
