/* run.c - `pipeshard run`: parse the options, start the model (coord/launch.h), give a
 * session the prompt (coord/session.h), print the generated text as it is produced (or
 * token ids with --print-ids), and optionally a JSON stats line. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../coord/draft.h"
#include "../coord/launch.h"
#include "../coord/session.h"
#include "args.h"
#include "cli.h"
#include "repl.h"
#include "run.h"

/* The command's name in messages: "run", "chat" or "serve" (ps_run_parse). */
static const char *cmd = "run";

typedef ps_run_opts run_opts;

void ps_run_usage_launch(FILE *f) {
    fputs("  -m, --model FILE        GGUF model\n"
          "  --fleet FILE            run a split model: fleet.json written by `pipeshard split`; stage 0\n"
          "                          runs here, the other stages on the workers it lists\n"
          "  --local-stages N        split -m MODEL into N stages and run stages 1..N-1 as local worker\n"
          "                          processes on loopback (default 1: no split); the split is cached in\n"
          "                          $PIPESHARD_CACHE or ~/.cache/pipeshard (PIPESHARD_CACHE=off: no cache)\n"
          "  --local-transport T     how --local-stages connects its processes: tcp (loopback, default) or\n"
          "                          unix (Unix sockets in a private directory: a shorter kernel path)\n"
          "  --prefill-chunk N       prompt positions per micro-batch travelling the ring (default: -b)\n"
          "  --key-file F            shared key the workers require (--local-stages: default a fresh one);\n"
          "                          with a key, frames after the handshake are sealed (encrypted and\n"
          "                          authenticated) unless both ends ask for --plain-frames\n"
          "  --plain-frames          with a key: ask the workers for frames in the clear (the key still\n"
          "                          authenticates each connection); for workers on this host, where\n"
          "                          sealing only costs time (--local-stages asks by itself)\n"
          "  --sim-latency-ms MS     emulated one-way delay on every outgoing hop (with --local-stages,\n"
          "                          on the workers' hops too)\n"
          "  --sim-bandwidth-mbps R  emulated rate limit of every outgoing hop, megabits/s (0 = none)\n"
          "  --stage-timeout-ms MS   report a stage that does not answer within MS (default 60000)\n"
          "  --standby LIST          HOST:PORT (or unix:PATH) of workers started with --cache and the key,\n"
          "                          comma-separated: when a stage dies or stalls, the next one takes its\n"
          "                          place (it is sent the shard), the sequences are replayed from their\n"
          "                          tokens and generation goes on with the same output (a stage that\n"
          "                          died is tried again at its address first)\n",
          f);
}

void ps_run_usage_compute(FILE *f) {
    fputs("  -t, --threads N         threads (default: all cores; more is allowed, with a warning)\n"
          "  --pin                   pin thread i to the i-th CPU this process may use (with\n"
          "                          --local-stages, the workers' threads too; --draft's on the CPUs\n"
          "                          after the stages' where there are enough): steadier, faster decode\n"
          "                          when the cores are this run's alone or its stages share them; not\n"
          "                          for processes that share cores with others (taskset them apart)\n"
          "  --mmap                  map the model file (pages read on first use, shared with the page\n"
          "                          cache) instead of reading it into huge pages at start (default\n"
          "                          where transparent huge pages are on: decode is faster, start-up\n"
          "                          slower); with --local-stages, the workers too\n"
          "  -c, --ctx-size N        context size in tokens (default: the model's, at most 4096; more\n"
          "                          than the model's is allowed, with a warning)\n"
          "  -b, --batch-size N      prompt tokens per forward pass (default 128)\n"
          "  --activations q8|f32    matmul arithmetic: q8 = 8-bit activations, integer dot products\n"
          "                          (llama.cpp's numerics, fastest; default), f32 = float activations\n"
          "                          (closest to a float reference, slower prompt processing)\n"
          "  --device D              where the layers run: cpu (default), cuda (GPU 0) or cuda:N, in\n"
          "                          this process (stage 0 of a fleet; with --local-stages, every\n"
          "                          stage); a GPU holds the layers and the KV cache in its memory and\n"
          "                          gives the bits of the CPU's reference kernels (q8 only). With\n"
          "                          --local-stages, a list gives each stage its own: cuda:0,cuda:1\n"
          "                          (the last for the stages after it)\n"
          "  --host-hops             send activations between GPU stages of this host by TCP, as between\n"
          "                          hosts (by default they go device to device; with --local-stages, the\n"
          "                          workers' too)\n",
          f);
}

static void run_usage(FILE *f) {
    ps_gen_params d = ps_gen_params_default();
    fprintf(f, "usage: pipeshard run (-m MODEL | --fleet FLEET.json) [-p PROMPT | -f FILE] [options]\n"
               "       ... | pipeshard run -m MODEL [options]    (no -p, -f or --prompt-ids: the prompt is\n"
               "                                                   read from standard input)\n");
    ps_run_usage_launch(f);
    fprintf(f,
            "  -p, --prompt TEXT       prompt text\n"
            "  -f, --file FILE         read the prompt from FILE (- = standard input)\n"
            "  -n, --n-predict N       tokens to generate (default %lld; -1 = until end of text or context)\n"
            "  --temp T                temperature; 0 = greedy (default %g)\n"
            "  --top-k K               keep the K most likely tokens; 0 = off (default %d)\n"
            "  --top-p P               nucleus sampling; 1 = off (default %g)\n"
            "  --min-p P               drop tokens below P x the top probability; 0 = off (default %g)\n"
            "  --repeat-penalty R      penalty on recent tokens; 1 = off (default %g)\n"
            "  --repeat-last-n N       tokens the penalties look at (default %d; -1 = all)\n"
            "  --presence-penalty P    OpenAI presence penalty (default %g)\n"
            "  --frequency-penalty F   OpenAI frequency penalty (default %g)\n"
            "  --seed S                sampling seed (default: random, printed by --stats)\n",
            (long long)d.n_predict, d.sp.temperature, d.sp.top_k, d.sp.top_p, d.sp.min_p, d.sp.repetition_penalty,
            d.sp.penalty_last_n, d.sp.presence_penalty, d.sp.frequency_penalty);
    ps_run_usage_compute(f);
    fputs("  --ignore-eos            keep generating past the end-of-text token\n"
          "  --chat                  wrap the prompt in the model's chat template as a user message\n"
          "  --chat-template NAME    chat template family (chatml, llama2, llama3, mistral, gemma, phi3, zephyr)\n"
          "  --system TEXT           system message for --chat\n"
          "  --stats                 print a JSON line of timings on stderr at the end (with a fleet:\n"
          "                          per-stage compute and per-hop bytes and milliseconds)\n"
          "  --prompt-ids IDS        comma-separated token ids instead of a text prompt (no BOS added)\n"
          "  --print-ids             print generated token ids (space-separated) instead of text\n"
          "  --dump-logits FILE      write each generated step's logits (float32, vocab per step) to FILE\n"
          "  --spec ngram            speculative decoding: each trip around the ring carries guesses of the\n"
          "                          next tokens after the last one, and the last stage keeps those it would\n"
          "                          have sampled itself (the same tokens, greedy or seeded, in fewer trips);\n"
          "                          ngram guesses what followed the latest earlier occurrence of the text's\n"
          "                          last 1-4 tokens (prompt lookup: no draft model)\n"
          "  --draft MODEL           speculative decoding with a draft model: a small model with this\n"
          "                          model's vocabulary, run here (instead of --spec); at a temperature\n"
          "                          its guesses are sampled and checked by the rejection rule\n"
          "  --draft-threads N       the draft model's compute threads (default 1)\n"
          "  --spec-overlap on|off   with --draft: while a trip is out, draft the next one as if every\n"
          "                          guess is kept, a guess at a time until the answer comes; used when\n"
          "                          that came true (default on)\n"
          "  --spec-k K|auto         guesses per trip, 1 to 16, or auto (the default): per sequence, the K\n"
          "                          (up to 10) whose measured trip time and acceptance give the most\n"
          "                          tokens per second; plain decoding when none beats it\n",
          f);
}

/* The option table: flags taking a value. */
enum {
    O_MODEL,
    O_PROMPT,
    O_FILE,
    O_N,
    O_TEMP,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_REP,
    O_REPN,
    O_PRES,
    O_FREQ,
    O_SEED,
    O_THREADS,
    O_CTX,
    O_BATCH,
    O_TEMPLATE,
    O_SYSTEM,
    O_IDS,
    O_DUMP,
    O_ACT,
    O_FLEET,
    O_LOCAL,
    O_CHUNK,
    O_KEY,
    O_LAT,
    O_BW,
    O_TIMEOUT,
    O_TRANSPORT,
    O_SPEC,
    O_SPEC_K,
    O_DRAFT,
    O_DRAFT_THREADS,
    O_OVERLAP,
    O_DEVICE,
    O_STANDBY
};
static const struct {
    const char *s, *l;
    int id;
} value_flags[] = {
    {"-m", "--model", O_MODEL},
    {"-p", "--prompt", O_PROMPT},
    {"-f", "--file", O_FILE},
    {"-n", "--n-predict", O_N},
    {NULL, "--temp", O_TEMP},
    {NULL, "--top-k", O_TOPK},
    {NULL, "--top-p", O_TOPP},
    {NULL, "--min-p", O_MINP},
    {NULL, "--repeat-penalty", O_REP},
    {NULL, "--repeat-last-n", O_REPN},
    {NULL, "--presence-penalty", O_PRES},
    {NULL, "--frequency-penalty", O_FREQ},
    {NULL, "--seed", O_SEED},
    {"-t", "--threads", O_THREADS},
    {"-c", "--ctx-size", O_CTX},
    {"-b", "--batch-size", O_BATCH},
    {NULL, "--chat-template", O_TEMPLATE},
    {NULL, "--system", O_SYSTEM},
    {NULL, "--prompt-ids", O_IDS},
    {NULL, "--dump-logits", O_DUMP},
    {NULL, "--activations", O_ACT},
    {NULL, "--fleet", O_FLEET},
    {NULL, "--local-stages", O_LOCAL},
    {NULL, "--prefill-chunk", O_CHUNK},
    {NULL, "--key-file", O_KEY},
    {NULL, "--sim-latency-ms", O_LAT},
    {NULL, "--sim-bandwidth-mbps", O_BW},
    {NULL, "--stage-timeout-ms", O_TIMEOUT},
    {NULL, "--local-transport", O_TRANSPORT},
    {NULL, "--spec", O_SPEC},
    {NULL, "--spec-k", O_SPEC_K},
    {NULL, "--draft", O_DRAFT},
    {NULL, "--draft-threads", O_DRAFT_THREADS},
    {NULL, "--spec-overlap", O_OVERLAP},
    {NULL, "--device", O_DEVICE},
    {NULL, "--standby", O_STANDBY},
};

/* --standby ADDRESS,...: workers started with --cache, in the order they take failed stages' places. */
static bool parse_standby(run_opts *o, const char *flag, const char *v) {
    if (strlen(v) >= sizeof o->standby_list) {
        fprintf(stderr, "pipeshard %s: %s: the list is longer than %zu bytes\n", cmd, flag, sizeof o->standby_list - 1);
        return false;
    }
    snprintf(o->standby_list, sizeof o->standby_list, "%s", v);
    o->n_standby = 0;
    for (char *p = o->standby_list, *save = NULL, *a; (a = strtok_r(p, ",", &save)); p = NULL) {
        if (!ps_fleet_address_ok(a) || o->n_standby == PS_SHARD_MAX_STAGES) {
            fprintf(stderr,
                    "pipeshard %s: %s takes HOST:PORT or unix:PATH addresses separated by commas (at most %d), got "
                    "'%s'\n",
                    cmd, flag, PS_SHARD_MAX_STAGES, a);
            return false;
        }
        o->standby[o->n_standby++] = a;
    }
    if (!o->n_standby) fprintf(stderr, "pipeshard %s: %s needs at least one address\n", cmd, flag);
    return o->n_standby > 0;
}

/* Applies one valued flag; false after printing what is wrong. */
static bool run_set(run_opts *o, int id, const char *flag, const char *v) {
    long long i;
    double d;
    switch (id) {
    case O_MODEL: o->model = v; return true;
    case O_PROMPT: o->prompt = v; return true;
    case O_FILE: o->prompt_file = v; return true;
    case O_TEMPLATE: o->chat_template = v; return true;
    case O_SYSTEM: o->system = v; return true;
    case O_IDS: o->prompt_ids = v; return true;
    case O_DUMP: o->dump_logits = v; return true;
    case O_FLEET: o->fleet = v; return true;
    case O_KEY: o->key_file = v; return true;
    case O_LOCAL: return ps_arg_int(cmd, flag, v, 1, PS_SHARD_MAX_STAGES, &o->local_stages);
    case O_CHUNK: return ps_arg_int(cmd, flag, v, 1, 1 << 16, &o->prefill_chunk);
    case O_TIMEOUT: return ps_arg_int(cmd, flag, v, 1, 86400000, &o->timeout_ms);
    case O_LAT: return ps_arg_float(cmd, flag, v, 0, 1e5, &o->sim.latency_ms);
    case O_BW: return ps_arg_mbps(cmd, flag, v, &o->sim.bandwidth_mbps);
    case O_TRANSPORT: o->local_transport = true; return ps_arg_transport(cmd, flag, v, &o->local_unix);
    case O_SPEC: {
        char err[200];
        if (!ps_spec_kind_parse(v, &o->spec.kind, err, sizeof err)) return true;
        fprintf(stderr, "pipeshard %s: %s: %s\n", cmd, flag, err);
        return false;
    }
    case O_DRAFT: o->draft = v; return true;
    case O_DEVICE:
        if (!ps_arg_devices(cmd, flag, v, o->devices, PS_SHARD_MAX_STAGES, &o->n_devices)) return false;
        o->device = o->devices[0];
        return true;
    case O_STANDBY: return parse_standby(o, flag, v);
    case O_OVERLAP: o->overlap_set = true; return ps_arg_on_off(cmd, flag, v, &o->spec.overlap);
    case O_DRAFT_THREADS: return ps_arg_int(cmd, flag, v, 1, 1024, &o->draft_threads);
    case O_SPEC_K:
        o->spec_k_set = true;
        if (!strcmp(v, "auto")) return o->spec.k = PS_SPEC_AUTO_MAX, o->spec.auto_k = true;
        o->spec.auto_k = false;
        return ps_arg_int(cmd, flag, v, 1, PS_MAX_DRAFT, &i) && ((o->spec.k = (int)i), true);
    case O_ACT:
        if (!ps_act_from_name(v, &o->act)) return true;
        fprintf(stderr, "pipeshard %s: %s must be q8 or f32, got '%s'\n", cmd, flag, v);
        return false;
    case O_N: return ps_arg_int(cmd, flag, v, -1, 1 << 30, &i) && ((o->gp.n_predict = i), o->n_set = true);
    case O_THREADS: o->threads_given = true; return ps_arg_int(cmd, flag, v, 1, 1024, &o->threads);
    case O_CTX: return ps_arg_int(cmd, flag, v, 1, 1 << 24, &o->ctx);
    case O_BATCH: return ps_arg_int(cmd, flag, v, 1, 1 << 16, &o->batch);
    case O_TOPK: return ps_arg_int(cmd, flag, v, 0, 1 << 30, &i) && ((o->gp.sp.top_k = (int32_t)i), true);
    case O_REPN: return ps_arg_int(cmd, flag, v, -1, 1 << 30, &i) && ((o->gp.sp.penalty_last_n = (int32_t)i), true);
    case O_SEED:
        o->seeded = true;
        return ps_arg_int(cmd, flag, v, 0, INT64_MAX, &i) && ((o->gp.sp.seed = (uint64_t)i), true);
    case O_TEMP: return ps_arg_float(cmd, flag, v, 0, 1e6, &d) && ((o->gp.sp.temperature = (float)d), true);
    case O_TOPP: return ps_arg_float(cmd, flag, v, 1e-9, 1, &d) && ((o->gp.sp.top_p = (float)d), true);
    case O_MINP: return ps_arg_float(cmd, flag, v, 0, 1, &d) && ((o->gp.sp.min_p = (float)d), true);
    case O_REP: return ps_arg_float(cmd, flag, v, 1e-6, 1e6, &d) && ((o->gp.sp.repetition_penalty = (float)d), true);
    case O_PRES: return ps_arg_float(cmd, flag, v, -2, 2, &d) && ((o->gp.sp.presence_penalty = (float)d), true);
    case O_FREQ: return ps_arg_float(cmd, flag, v, -2, 2, &d) && ((o->gp.sp.frequency_penalty = (float)d), true);
    }
    return false;
}

/* Whether valued flag id is one of run's prompt, output or sampling flags (serve refuses them). */
static bool run_only(int id) {
    return id == O_PROMPT || id == O_FILE || id == O_N || (id >= O_TEMP && id <= O_SEED) || id == O_SYSTEM ||
           id == O_IDS || id == O_DUMP;
}

/* The index of a's valued flag in value_flags, or -1. */
static int find_flag(const char *a) {
    for (size_t k = 0; k < PS_ARRAY_LEN(value_flags); k++)
        if ((value_flags[k].s && !strcmp(a, value_flags[k].s)) || !strcmp(a, value_flags[k].l)) return (int)k;
    return -1;
}

/* Applies switch a; false when a is none. */
static bool run_switch(run_opts *o, const char *a) {
    bool *b = !strcmp(a, "--ignore-eos")     ? &o->gp.ignore_eos
              : !strcmp(a, "--chat")         ? &o->chat
              : !strcmp(a, "--stats")        ? &o->stats
              : !strcmp(a, "--print-ids")    ? &o->print_ids
              : !strcmp(a, "--pin")          ? &o->pin
              : !strcmp(a, "--mmap")         ? &o->mmap
              : !strcmp(a, "--plain-frames") ? &o->plain
              : !strcmp(a, "--host-hops")    ? &o->host_hops
                                             : NULL;
    if (!b) return false;
    if (b != &o->pin && b != &o->mmap && b != &o->plain && b != &o->host_hops && !o->given) o->given = a;
    return *b = true;
}

/* Reports an argument no parser takes (a typo is matched against every flag) and returns 2. */
static int unknown_arg(const char *a, ps_run_mode mode, const ps_run_extra *extra) {
    static const char *const switches[] = {"--help", "--ignore-eos", "--chat",         "--stats",    "--print-ids",
                                           "--pin",  "--mmap",       "--plain-frames", "--host-hops"};
    const char *known[PS_ARRAY_LEN(switches) + 2 * PS_ARRAY_LEN(value_flags) + 32];
    size_t n = 0;
    for (size_t j = 0; j < PS_ARRAY_LEN(switches); j++) known[n++] = switches[j];
    for (size_t j = 0; j < PS_ARRAY_LEN(value_flags); j++) {
        if (value_flags[j].s) known[n++] = value_flags[j].s;
        known[n++] = value_flags[j].l;
    }
    for (size_t j = 0; extra && extra->flags[j] && n + 1 < PS_ARRAY_LEN(known); j++) known[n++] = extra->flags[j];
    known[n] = NULL;
    return ps_arg_unknown(cmd, a, known,
                          mode == PS_RUN_CHAT    ? "(see pipeshard chat --help)"
                          : mode == PS_RUN_SERVE ? "(see pipeshard serve --help)"
                                                 : "give the prompt with -p TEXT (see pipeshard run --help)");
}

/* A flag of extra's: its value applied (1), a usage error (2), or not one of them (0). */
static int extra_flag(const ps_run_extra *extra, int argc, char **argv, int *i) {
    for (size_t j = 0; extra && extra->flags[j]; j++) {
        if (strcmp(argv[*i], extra->flags[j])) continue;
        const char *flag = argv[*i], *v = ps_arg_value(cmd, argc, argv, i);
        return v && extra->set(extra->ctx, flag, v) ? 1 : 2;
    }
    return 0;
}

int ps_run_parse(int argc, char **argv, run_opts *o, ps_run_mode mode, const ps_run_extra *extra) {
    bool interactive = mode != PS_RUN_RUN;
    cmd = mode == PS_RUN_CHAT ? "chat" : mode == PS_RUN_SERVE ? "serve" : "run";
    *o = (run_opts){.threads = ps_cpu_count(),
                    .batch = 128,
                    .local_stages = 1,
                    .timeout_ms = 60000,
                    .gp = ps_gen_params_default(),
                    .spec = {.k = PS_SPEC_AUTO_MAX, .auto_k = true, .overlap = true}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return run_usage(stdout), 0;
        if (run_switch(o, a)) continue;
        int k = find_flag(a), x = k < 0 ? extra_flag(extra, argc, argv, &i) : 0;
        if (x) {
            if (x == 2) return 2;
            continue;
        }
        if (k < 0) return unknown_arg(a, mode, extra);
        if (run_only(value_flags[k].id) && !o->given) o->given = a;
        const char *v = ps_arg_value(cmd, argc, argv, &i);
        if (!v || !run_set(o, value_flags[k].id, a, v)) return 2;
    }
    if (mode == PS_RUN_SERVE && o->given) {
        fprintf(stderr,
                "pipeshard serve: %s is an option of `pipeshard run`: each request gives its prompt, length and "
                "sampling (see pipeshard serve --help)\n",
                o->given);
        return 2;
    }
    const char *why = NULL;
    if (!o->model == !o->fleet)
        why = o->model ? "give -m MODEL or --fleet FLEET.json, not both"
                       : "no model given (-m MODEL or --fleet FLEET.json)";
    else if (o->fleet && o->local_stages > 1)
        why = "--local-stages splits -m MODEL; --fleet runs a fleet already split";
    else if (o->local_transport && o->local_stages < 2)
        why = "--local-transport applies to --local-stages N (N >= 2)";
    else if (o->n_devices > 1 && o->n_devices > o->local_stages)
        why = o->local_stages > 1 ? "--device lists more devices than --local-stages has stages"
                                  : "--device with several devices gives one to each of --local-stages N";
    else if (o->dump_logits && (o->fleet || o->local_stages > 1))
        why = "--dump-logits needs the whole model in this process (logits never cross the network)";
    else if (o->draft && o->spec.kind)
        why = "--spec ngram guesses by prompt lookup, --draft MODEL with a draft model: give one of them";
    else if ((o->draft_threads || o->overlap_set) && !o->draft)
        why = o->overlap_set ? "--spec-overlap drafts with --draft MODEL while a trip is out: add --draft"
                             : "--draft-threads sets the threads of --draft MODEL: add --draft";
    else if (o->spec_k_set && !o->spec.kind && !o->draft)
        why = "--spec-k sets the guesses of --spec ngram or --draft MODEL: add one";
    else if ((o->spec.kind || o->draft) && o->dump_logits)
        why = "--dump-logits writes the logits of every step: it does not go with --spec (a trip gives several "
              "tokens)";
    else if (!!o->prompt + !!o->prompt_file + !!o->prompt_ids > 1)
        why = "give only one of -p, -f and --prompt-ids";
    else if (o->chat && o->prompt_ids)
        why = "--chat needs a text prompt, not --prompt-ids";
    else if (!o->chat && !interactive && (o->system || o->chat_template))
        why = o->system ? "--system is the system message of --chat: add --chat"
                        : "--chat-template picks the template of --chat: add --chat";
    else if (!interactive && !o->prompt && !o->prompt_file && !o->prompt_ids && isatty(STDIN_FILENO))
        why = "no prompt: give -p TEXT, -f FILE or --prompt-ids IDS, or pipe the prompt on standard input";
    if (why) {
        fprintf(stderr, "pipeshard %s: %s\n", cmd, why);
        return 2;
    }
    char err[256];
    ps_chat_family fam;
    if (o->chat_template && ps_chat_family_from_name(o->chat_template, &fam, err, sizeof err)) {
        fprintf(stderr, "pipeshard %s: %s\n", cmd, err);
        return 2;
    }
    if (!interactive && !o->prompt && !o->prompt_file && !o->prompt_ids)
        o->prompt_file = "-"; /* stdin is not a terminal */
    if (o->threads_given && o->threads > ps_cpu_count())
        fprintf(stderr,
                "pipeshard %s: warning: -t %lld is more than the %d CPUs this process may use; using %lld threads "
                "(they share cores: slower)\n",
                cmd, o->threads, ps_cpu_count(), o->threads);
    if (!o->seeded && getrandom(&o->gp.sp.seed, sizeof o->gp.sp.seed, 0) != sizeof o->gp.sp.seed)
        o->gp.sp.seed = (uint64_t)ps_now();
    o->gp.sp.seed &= INT64_MAX;
    return -1;
}

// ---------------------------------------------------------------------------------------
// Signals

/* Whether generate() is in its loop, and the first SIGINT / SIGTERM / SIGHUP that came
 * then (0: none). Lock-free atomics: safe in a handler on any thread. */
static atomic_int run_generating, run_signal;
/* Whether a progress line is on the terminal (on_progress), for on_signal to clear. */
static atomic_bool run_line_open;

/* The first signal during generation is recorded: generate() then cancels the session, so
 * that the run ends cleanly (newline, --stats, everything freed, exit 128 + signal). Any
 * other (during start-up or clean-up, or a second one) kills the local workers, removes
 * their directory and exits at once, through async-signal-safe calls only. */
static void on_signal(int sig) {
    int none = 0;
    if (atomic_load(&run_generating) && atomic_compare_exchange_strong(&run_signal, &none, sig)) return;
    ps_launch_abort_all();
    if (atomic_load(&run_line_open)) {
        ssize_t w = write(STDERR_FILENO, "\r\033[K", 4); /* clear the progress line */
        (void)w;
    }
    _exit(128 + sig);
}

/* Installs on_signal; SIGPIPE is ignored, so that a closed stdout (`| head`) is a write
 * error that generate() sees. */
void ps_run_install_signals(void) {
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void ps_run_catch_signals(bool on) { atomic_store(&run_generating, on); }
int ps_run_signal(void) { return atomic_load(&run_signal); }

// ---------------------------------------------------------------------------------------
// Progress

/* The progress line on stderr, drawn only on a terminal. */
typedef struct {
    bool show;      /* stderr is a terminal */
    bool open;      /* a line is on the screen, to be cleared before anything else */
    int pct;        /* the percentage drawn last (-1: none) */
    char what[256]; /* what was drawn last (a copy: a caller may reuse its buffer for another text) */
} progress_line;

/* ps_progress callback: rewrites one stderr line in place ("splitting model into 2 stages:
 * 43%", "starting 1 worker", "loading model", "sending stage 1's shard to HOST:PORT: 43%",
 * "prompt: 512/1024 tokens"). */
static void on_progress(void *ctx, const char *what, uint64_t done, uint64_t total) {
    progress_line *p = ctx;
    if (!p->show) return;
    bool prompt = !strcmp(what, "prompt");
    int pct = total && !prompt ? (int)(100 * done / total) : -1;
    if (!prompt && p->open && !strcmp(p->what, what) && pct == p->pct) return; /* nothing new to draw */
    if (prompt)
        fprintf(stderr, "\r\033[K%s: %llu/%llu tokens", what, (unsigned long long)done, (unsigned long long)total);
    else if (pct >= 0)
        fprintf(stderr, "\r\033[K%s: %d%%", what, pct);
    else
        fprintf(stderr, "\r\033[K%s", what);
    fflush(stderr);
    p->open = true, p->pct = pct;
    snprintf(p->what, sizeof p->what, "%s", what);
    atomic_store(&run_line_open, true);
}

/* Clears the progress line, if one is drawn, before other output. */
static void progress_clear(progress_line *p) {
    if (!p->open) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->open = false;
    atomic_store(&run_line_open, false);
}

/* The one progress line of this process (one launch at a time). */
static progress_line run_progress = {.pct = -1};

void ps_run_progress_clear(void) { progress_clear(&run_progress); }

ps_status ps_run_draft_open(const run_opts *o, ps_launch *l, int slots, ps_spec_opts *spec, ps_draft **out, char *err,
                            size_t errlen) {
    *out = NULL;
    if (!o->draft) return PS_OK;
    int threads = o->draft_threads ? (int)o->draft_threads : 1;
    ps_status s =
        ps_draft_open(o->draft, threads, ps_coord_n_ctx(ps_launch_coord(l)), slots, ps_launch_tok(l), out, err, errlen);
    if (!s) spec->kind = PS_SPEC_DRAFT, spec->draft = *out;
    char e[200]; /* pinned: the draft's threads on the cores after the stages' here, where there are enough (else
                    they go where the system puts them) */
    if (!s && o->pin)
        ps_draft_pin(*out, (o->local_stages > 1 ? (int)o->local_stages : 1) * (int)o->threads, e, sizeof e);
    return s;
}

ps_status ps_run_launch(const run_opts *o, bool tokenizer, ps_launch **out, char *err, size_t errlen) {
    run_progress.show = isatty(STDERR_FILENO);
    ps_launch_opts lo = {.model = o->model,
                         .fleet = o->fleet,
                         .local_stages = (int)o->local_stages,
                         .local_unix = o->local_unix,
                         .devices = o->devices,
                         .n_devices = o->n_devices,
                         .key_file = o->key_file,
                         .plain = o->plain,
                         .host_hops = o->host_hops,
                         .sim = o->sim,
                         .timeout_ms = (int)o->timeout_ms,
                         .standby = o->standby,
                         .n_standby = o->n_standby,
                         .stage = {.threads = (int)o->threads, .pin = o->pin, .mmap = o->mmap, .device = o->device},
                         .n_ctx = (int)o->ctx,
                         .max_batch = (int)o->batch,
                         .prefill_chunk = (int)o->prefill_chunk,
                         .parallel = o->parallel,
                         .kv_blocks = o->kv_blocks,
                         .max_draft = o->spec.kind || o->draft ? o->spec.k : 0,
                         .prefix_dir = o->prefix_dir,
                         .act = o->act,
                         .tokenizer = tokenizer,
                         .progress = {on_progress, &run_progress}};
    ps_status s = ps_launch_start(&lo, out, err, errlen);
    if (s) return s;
    int trained = ps_coord_model(ps_launch_coord(*out))->hp.ctx_train;
    if (o->ctx > trained) {
        progress_clear(&run_progress);
        fprintf(stderr,
                "pipeshard %s: warning: -c %lld is more than the %d positions the model was trained on; using %lld "
                "(text past %d may degrade)\n",
                cmd, o->ctx, trained, o->ctx, trained);
    }
    return PS_OK;
}

// ---------------------------------------------------------------------------------------
// Generation

/* What one run holds besides its options. */
typedef struct {
    const run_opts *o;
    ps_launch *launch;
    ps_session *session;
    ps_draft *draft;     /* --draft */
    FILE *dump;          /* --dump-logits */
    ps_stop_reason stop; /* why generation ended */
    bool usage;          /* the error is in what the command line gives (exit 2) */
    bool interactive;    /* `pipeshard chat`: the prompts come from the terminal (repl.c) */
    bool stdout_gone;    /* a write to stdout failed: the reader went away (`| head`) */
    char err[1024];
} run_state;

/* Reads a whole file ("-": standard input) into a NUL-terminated malloc'd buffer (caller frees). */
static ps_status read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    bool in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "rb");
    if (in) path = "(standard input)";
    if (!f) return ps_errf(err, errlen, PS_ERR_IO, "cannot open prompt file '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = cap > (1u << 30) ? NULL : realloc(buf, 2 * cap + 1);
            if (!nb) free(buf);
            buf = nb, cap *= 2;
        }
    }
    bool bad = ferror(f);
    if (!in) fclose(f);
    if (!buf) return ps_errf(err, errlen, PS_ERR_NOMEM, "prompt file '%s' is too large", path);
    if (bad) {
        free(buf);
        return ps_errf(err, errlen, PS_ERR_IO, "cannot read prompt file '%s'", path);
    }
    buf[n] = 0;
    *out = buf, *len = n;
    return PS_OK;
}

/* Parses --prompt-ids "1,2,3" into a malloc'd array (caller frees). */
static ps_status parse_ids(const char *s, int32_t **ids, int *n_ids, char *err, size_t errlen) {
    long long n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    if (n > INT32_MAX || !(*ids = malloc((size_t)n * sizeof **ids)))
        return ps_errf(err, errlen, PS_ERR_NOMEM, "--prompt-ids: too many ids");
    n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ','))
            return ps_errf(err, errlen, PS_ERR_ARG, "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        (*ids)[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!n) return ps_errf(err, errlen, PS_ERR_ARG, "--prompt-ids is empty");
    *n_ids = (int)n;
    return PS_OK;
}

/* Gives the session the prompt: --prompt-ids, or -p / -f / standard input text (a user
 * message of the chat template with --chat, after --system's). Errors in what the user gave
 * (ids that do not parse or are not tokens, an empty or over-long prompt) set st->usage. */
static ps_status set_prompt(run_state *st) {
    const run_opts *o = st->o;
    char *err = st->err, *text = NULL;
    size_t el = sizeof st->err, len = 0;
    ps_status s;
    if (o->prompt_ids) {
        int32_t *ids = NULL;
        int n = 0;
        s = parse_ids(o->prompt_ids, &ids, &n, err, el);
        if (!s) s = ps_session_prompt_ids(st->session, ids, n, &o->gp, err, el);
        free(ids);
        st->usage = s == PS_ERR_ARG || s == PS_ERR_RANGE;
        return s;
    }
    if (o->prompt_file)
        s = read_file(o->prompt_file, &text, &len, err, el);
    else if (!(text = strdup(o->prompt ? o->prompt : "")))
        s = ps_errf(err, el, PS_ERR_NOMEM, "out of memory");
    else
        s = PS_OK, len = strlen(text);
    ps_chat_msg msgs[2] = {{"system", o->system}, {"user", text}};
    if (!s && o->chat)
        s = ps_session_prompt_chat(st->session, o->system ? msgs : msgs + 1, o->system ? 2 : 1, o->chat_template,
                                   &o->gp, err, el);
    else if (!s)
        s = ps_session_prompt_text(st->session, text, len, &o->gp, err, el);
    st->usage = s == PS_ERR_ARG || s == PS_ERR_RANGE; /* empty or longer than the context */
    free(text);
    return s;
}

/* Starts the fleet, the coordinator and the session, and sets the prompt. */
static ps_status run_setup(run_state *st) {
    const run_opts *o = st->o;
    char *err = st->err;
    size_t el = sizeof st->err;
    ps_status s = ps_sample_params_check(&o->gp.sp, err, el);
    if (s) return st->usage = true, s; /* sampling flags that do not go together */
    if ((s = ps_run_launch(o, o->draft || !(o->prompt_ids && o->print_ids), &st->launch, err, el))) return s;
    ps_spec_opts spec = o->spec;
    if ((s = ps_run_draft_open(o, st->launch, 1, &spec, &st->draft, err, el))) return st->usage = s == PS_ERR_ARG, s;
    if ((s = ps_session_create(ps_launch_coord(st->launch), ps_launch_tok(st->launch), &st->session, err, el)) ||
        (s = ps_session_set_spec(st->session, &spec, err, el)))
        return s;
    if (o->dump_logits && !(st->dump = fopen(o->dump_logits, "wb")))
        return ps_errf(err, el, PS_ERR_IO, "cannot create '%s': %s", o->dump_logits, strerror(errno));
    return st->interactive ? PS_OK : set_prompt(st);
}

/* Writes the logits behind the latest token (--dump-logits). */
static ps_status dump_logits(run_state *st) {
    ps_coord *c = ps_launch_coord(st->launch);
    const float *lg = ps_coord_logits(c);
    size_t v = (size_t)ps_coord_model(c)->hp.vocab;
    if (st->dump && (!lg || fwrite(lg, sizeof(float), v, st->dump) != v))
        return ps_errf(st->err, sizeof st->err, PS_ERR_IO, "cannot write '%s'", st->o->dump_logits);
    return PS_OK;
}

/* Ends the output with what the detokenizer held back and a newline. */
static void finish_output(run_state *st) {
    const char *text;
    size_t len;
    ps_session_flush(st->session, &text, &len);
    if (!st->o->print_ids) fwrite(text, 1, len, stdout);
    printf("\n");
    fflush(stdout);
    if (st->stop == PS_STOP_CONTEXT) {
        ps_session_stats ss;
        ps_session_get_stats(st->session, &ss);
        fprintf(stderr,
                "pipeshard run: stopped after %d token%s: the context of %d positions is full (-c/--ctx-size)\n",
                ss.n_generated, ss.n_generated == 1 ? "" : "s", ps_coord_n_ctx(ps_launch_coord(st->launch)));
    }
}

/* Generates until the session stops, printing each token's text (or its id with
 * --print-ids) as it comes, then what the detokenizer held back and a newline. A signal
 * (on_signal) cancels the session before the next step; a failed write to stdout ends the
 * generation quietly (st->stdout_gone) when the reader went away (EPIPE). */
static ps_status generate(run_state *st) {
    ps_session_step step;
    ps_status s;
    bool first = true;
    atomic_store(&run_generating, 1);
    for (;;) {
        if (atomic_load(&run_signal)) ps_session_cancel(st->session);
        s = ps_session_next(st->session, &step, st->err, sizeof st->err);
        progress_clear(&run_progress); /* the prompt's progress ends with its first step */
        if (s) break;
        if (step.token >= 0 && (s = dump_logits(st))) break;
        if (step.token >= 0 && step.stop != PS_STOP_EOS) {
            if (st->o->print_ids)
                printf(first ? "%d" : " %d", step.token);
            else
                fwrite(step.text, 1, step.len, stdout);
            first = false;
            if (fflush(stdout) || ferror(stdout)) {
                st->stdout_gone = errno == EPIPE;
                if (!st->stdout_gone)
                    s = ps_errf(st->err, sizeof st->err, PS_ERR_IO, "cannot write: %s", strerror(errno));
                break;
            }
        }
        if (step.stop) break;
    }
    atomic_store(&run_generating, 0);
    if (!s) st->stop = step.stop;
    if (!s && !st->stdout_gone) finish_output(st);
    return s;
}

/* Per-stage compute and per-hop traffic, for --stats. */
static void add_fleet_stats(const run_state *st, cJSON *j) {
    ps_coord_stats cs;
    ps_coord *coord = ps_launch_coord(st->launch);
    ps_coord_get_stats(coord, &cs);
    cJSON_AddNumberToObject(j, "stages", cs.n_stages);
    if (cs.n_stages > 1) {
        cJSON_AddNumberToObject(j, "wait_ms", cs.wait_ms);
        cJSON_AddNumberToObject(j, "ring_overhead_ms", ps_coord_ring_overhead_ms(&cs));
        cJSON_AddNumberToObject(j, "failures", cs.failures);
        cJSON_AddNumberToObject(j, "recoveries", cs.recoveries);
        cJSON_AddNumberToObject(j, "recovery_ms", cs.recovery_ms);
    }
    cJSON *stages = cJSON_AddArrayToObject(j, "stage_stats"), *hops = cJSON_AddArrayToObject(j, "hops");
    for (int k = 0; k < cs.n_stages; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "stage", k);
        cJSON_AddStringToObject(e, "address", ps_coord_stage_address(coord, k));
        cJSON_AddNumberToObject(e, "compute_ms", cs.compute_ms[k]);
        cJSON_AddItemToArray(stages, e);
        if (cs.n_stages == 1) continue;
        cJSON *h = cJSON_CreateObject();
        cJSON_AddNumberToObject(h, "from", k);
        if (k + 1 < cs.n_stages)
            cJSON_AddNumberToObject(h, "to", k + 1);
        else
            cJSON_AddStringToObject(h, "to", "coordinator");
        cJSON_AddNumberToObject(h, "frames", (double)cs.hop[k].frames);
        cJSON_AddNumberToObject(h, "bytes", (double)cs.hop[k].bytes);
        cJSON_AddNumberToObject(h, "ms", cs.hop[k].send_ms);
        if (k == 0) cJSON_AddStringToObject(h, "path", ps_coord_hop0(coord));
        cJSON_AddItemToArray(hops, h);
    }
}

/* With speculation, how the guesses fared into j's "spec" (the session's latest generation; the
 * draft model's seconds since it was loaded). */
static void add_spec_stats(const run_state *st, const ps_session_stats *ss, cJSON *j) {
    if (!st->o->spec.kind && !st->draft) return;
    cJSON *sp = cJSON_AddObjectToObject(j, "spec");
    cJSON_AddStringToObject(sp, "draft", st->draft ? "model" : ps_spec_kind_name(st->o->spec.kind));
    if (st->draft) cJSON_AddNumberToObject(sp, "draft_ms", ps_draft_seconds(st->draft) * 1e3);
    if (st->draft) cJSON_AddNumberToObject(sp, "overlapped", ss->n_overlap);
    if (st->o->spec.auto_k)
        cJSON_AddStringToObject(sp, "k", "auto");
    else
        cJSON_AddNumberToObject(sp, "k", st->o->spec.k);
    cJSON_AddNumberToObject(sp, "trips", ss->n_trips);
    cJSON_AddNumberToObject(sp, "drafted", ss->n_drafted);
    cJSON_AddNumberToObject(sp, "kept", ss->n_kept);
    cJSON_AddNumberToObject(sp, "acceptance", ss->n_drafted ? (double)ss->n_kept / ss->n_drafted : 0);
    cJSON_AddNumberToObject(sp, "tokens_per_trip", ss->n_trips ? (double)(ss->n_kept + ss->n_trips) / ss->n_trips : 0);
    int top = PS_MAX_DRAFT;
    while (top > 0 && !ss->by_k[top]) top--;
    cJSON_AddItemToObject(sp, "trips_by_k", cJSON_CreateIntArray(ss->by_k, top + 1));
}

/* `pipeshard chat --stats`: each turn's line gets the speculation's figures too. */
static void add_turn_stats(void *ctx, cJSON *j) {
    const run_state *st = ctx;
    ps_session_stats ss;
    ps_session_get_stats(st->session, &ss);
    add_spec_stats(st, &ss, j);
}

/* The --stats JSON line. */
static void print_stats(const run_state *st) {
    ps_session_stats ss;
    ps_session_get_stats(st->session, &ss);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "prompt_tokens", ss.n_prompt);
    cJSON_AddNumberToObject(j, "generated_tokens", ss.n_generated);
    cJSON_AddStringToObject(j, "stop", ps_stop_reason_name(st->stop));
    cJSON_AddNumberToObject(j, "load_ms", ps_launch_seconds(st->launch) * 1e3);
    cJSON_AddNumberToObject(j, "ttft_ms", ss.ttft_s * 1e3);
    cJSON_AddNumberToObject(j, "prefill_tok_s", ss.ttft_s > 0 ? ss.n_prompt / ss.ttft_s : 0);
    cJSON_AddNumberToObject(j, "decode_tok_s", ss.decode_s > 0 ? ss.n_decode / ss.decode_s : 0);
    add_spec_stats(st, &ss, j);
    cJSON_AddNumberToObject(j, "threads", (double)st->o->threads);
    cJSON_AddNumberToObject(j, "n_ctx", ps_coord_n_ctx(ps_launch_coord(st->launch)));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)st->o->gp.sp.seed);
    cJSON_AddRawToObject(j, "seed", seed); /* exact: a double would round seeds above 2^53 */
    cJSON_AddStringToObject(j, "isa", ps_matmul_isa());
    cJSON_AddStringToObject(j, "activations", ps_act_name(st->o->act));
    add_fleet_stats(st, j);
    char *txt = cJSON_PrintUnformatted(j);
    fprintf(stderr, "%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}

int ps_cli_run(int argc, char **argv) {
    run_opts o;
    int rc = ps_run_parse(argc, argv, &o, PS_RUN_RUN, NULL);
    if (rc >= 0) return rc;
    ps_run_install_signals();
    run_state st = {.o = &o};
    ps_status s = run_setup(&st);
    if (!s) s = generate(&st);
    progress_clear(&run_progress);
    if (s)
        fprintf(stderr, "pipeshard run: %s\n", st.err[0] ? st.err : ps_strerror(s));
    else if (o.stats)
        print_stats(&st);
    if (st.dump) fclose(st.dump);
    ps_session_free(st.session);
    ps_draft_free(st.draft);
    ps_launch_stop(st.launch);
    int sig = atomic_load(&run_signal);
    return s ? (st.usage ? 2 : 1) : sig ? 128 + sig : st.stdout_gone ? 128 + SIGPIPE : 0;
}

static void chat_usage(FILE *f) {
    fprintf(f, "usage: pipeshard chat (-m MODEL | --fleet FLEET.json | -m MODEL --local-stages N) [options]\n"
               "  A conversation in the terminal: type a message, read the answer as it is written.\n"
               "  Each turn goes through the model's chat template; the conversation's keys and values\n"
               "  stay on the stages between turns, so only the new turn is prefilled. Commands: /reset,\n"
               "  /system TEXT, /exit, /help; Ctrl-C stops an answer, Ctrl-D ends the chat. Without a\n"
               "  terminal, each line of standard input is a turn.\n"
               "  --system TEXT           the system message\n"
               "  --chat-template NAME    chat template family (default: the model's)\n"
               "  -n, --n-predict N       tokens per answer at most (default -1: until its end or the context)\n"
               "  --stats                 a JSON line per turn on stderr: prompt_tokens, reused_tokens (kept\n"
               "                          from the turns before), generated_tokens, ttft_ms, decode_tok_s, stop\n"
               "  and every option of `pipeshard run` but -p, -f, --prompt-ids, --print-ids and\n"
               "  --dump-logits (see pipeshard run --help)\n");
}

int ps_cli_chat(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return chat_usage(stdout), 0;
    run_opts o;
    int rc = ps_run_parse(argc, argv, &o, PS_RUN_CHAT, NULL);
    if (rc >= 0) return rc;
    if (o.prompt || o.prompt_file || o.prompt_ids || o.print_ids || o.dump_logits) {
        fprintf(stderr, "pipeshard chat: the turns come from the terminal; -p, -f, --prompt-ids, --print-ids and "
                        "--dump-logits are options of `pipeshard run`\n");
        return 2;
    }
    if (!o.n_set) o.gp.n_predict = -1;
    ps_run_install_signals(); /* SIGTERM and SIGHUP clean up a local fleet; the conversation takes SIGINT */
    run_state st = {.o = &o, .interactive = true};
    ps_status s = run_setup(&st);
    if (s) fprintf(stderr, "pipeshard chat: %s\n", st.err[0] ? st.err : ps_strerror(s));
    ps_repl_opts ro = {.gp = o.gp,
                       .system = o.system,
                       .template_name = o.chat_template,
                       .stats = o.stats,
                       .more_stats = add_turn_stats,
                       .more_ctx = &st};
    if (!s) rc = ps_repl_run(st.session, &ro);
    ps_session_free(st.session);
    ps_draft_free(st.draft);
    ps_launch_stop(st.launch);
    return s ? 1 : rc;
}
