/* run.c - `pipeshard run`: tokenize a prompt, run the model, print the generated text as
 * it is produced (or token ids with --print-ids), and optionally a JSON stats line. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../coord/coord.h"
#include "../model/model.h"
#include "../sample/sample.h"
#include "../tokenize/chat.h"
#include "../tokenize/tokenize.h"
#include "args.h"
#include "cli.h"
#include "../coord/local_fleet.h"

typedef struct {
    const char *model, *fleet, *prompt, *prompt_file, *prompt_ids, *dump_logits, *chat_template, *system, *key_file;
    long long n_predict, threads, ctx, batch, local_stages, prefill_chunk, timeout_ms;
    ps_link_sim sim;
    bool ignore_eos, chat, stats, print_ids, seeded, pin, mmap, plain, local_unix, local_transport;
    ps_act act;
    ps_sample_params sp;
} run_opts;

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: pipeshard run (-m MODEL | --fleet FLEET.json) [-p PROMPT | -f FILE] [options]\n"
            "  -m, --model FILE        GGUF model\n"
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
            "  -p, --prompt TEXT       prompt text\n"
            "  -f, --file FILE         read the prompt from FILE\n"
            "  -n, --n-predict N       tokens to generate (default 128; -1 = until end of text or context)\n"
            "  --temp T                temperature; 0 = greedy (default 0.8)\n"
            "  --top-k K               keep the K most likely tokens; 0 = off (default 40)\n"
            "  --top-p P               nucleus sampling; 1 = off (default 0.95)\n"
            "  --min-p P               drop tokens below P x the top probability; 0 = off (default 0.05)\n"
            "  --repeat-penalty R      penalty on recent tokens; 1 = off (default 1)\n"
            "  --repeat-last-n N       tokens the penalties look at (default 64; -1 = all)\n"
            "  --presence-penalty P    OpenAI presence penalty (default 0)\n"
            "  --frequency-penalty F   OpenAI frequency penalty (default 0)\n"
            "  --seed S                sampling seed (default: random, printed by --stats)\n"
            "  -t, --threads N         threads (default: all cores)\n"
            "  --pin                   pin thread i to the i-th CPU this process may use (with\n"
            "                          --local-stages, the workers' threads too): steadier, faster decode\n"
            "                          when the cores are this run's alone or its stages share them; not\n"
            "                          for processes that share cores with others (taskset them apart)\n"
            "  --mmap                  map the model file (pages read on first use, shared with the page\n"
            "                          cache) instead of reading it into huge pages at start (default\n"
            "                          where transparent huge pages are on: decode is faster, start-up\n"
            "                          slower); with --local-stages, the workers too\n"
            "  -c, --ctx-size N        context size in tokens (default: the model's, at most 4096)\n"
            "  -b, --batch-size N      prompt tokens per forward pass (default 128)\n"
            "  --activations q8|f32    matmul arithmetic: q8 = 8-bit activations, integer dot products\n"
            "                          (llama.cpp's numerics, fastest; default), f32 = float activations\n"
            "                          (closest to a float reference, slower prompt processing)\n"
            "  --ignore-eos            keep generating past the end-of-text token\n"
            "  --chat                  wrap the prompt in the model's chat template as a user message\n"
            "  --chat-template NAME    chat template family (chatml, llama2, llama3, mistral, gemma, phi3, zephyr)\n"
            "  --system TEXT           system message for --chat\n"
            "  --stats                 print a JSON line of timings on stderr at the end (with a fleet:\n"
            "                          per-stage compute and per-hop bytes and milliseconds)\n"
            "  --prompt-ids IDS        comma-separated token ids instead of a text prompt (no BOS added)\n"
            "  --print-ids             print generated token ids (space-separated) instead of text\n"
            "  --dump-logits FILE      write each generated step's logits (float32, vocab per step) to FILE\n");
}

/* The option table: flags taking a value. */
enum { O_MODEL, O_PROMPT, O_FILE, O_N, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REP, O_REPN, O_PRES, O_FREQ, O_SEED,
       O_THREADS, O_CTX, O_BATCH, O_TEMPLATE, O_SYSTEM, O_IDS, O_DUMP, O_ACT, O_FLEET, O_LOCAL, O_CHUNK, O_KEY,
       O_LAT, O_BW, O_TIMEOUT, O_TRANSPORT };
static const struct {
    const char *s, *l;
    int id;
} value_flags[] = {
    {"-m", "--model", O_MODEL}, {"-p", "--prompt", O_PROMPT}, {"-f", "--file", O_FILE}, {"-n", "--n-predict", O_N},
    {NULL, "--temp", O_TEMP}, {NULL, "--top-k", O_TOPK}, {NULL, "--top-p", O_TOPP}, {NULL, "--min-p", O_MINP},
    {NULL, "--repeat-penalty", O_REP}, {NULL, "--repeat-last-n", O_REPN}, {NULL, "--presence-penalty", O_PRES},
    {NULL, "--frequency-penalty", O_FREQ}, {NULL, "--seed", O_SEED}, {"-t", "--threads", O_THREADS},
    {"-c", "--ctx-size", O_CTX}, {"-b", "--batch-size", O_BATCH}, {NULL, "--chat-template", O_TEMPLATE},
    {NULL, "--system", O_SYSTEM}, {NULL, "--prompt-ids", O_IDS}, {NULL, "--dump-logits", O_DUMP},
    {NULL, "--activations", O_ACT}, {NULL, "--fleet", O_FLEET}, {NULL, "--local-stages", O_LOCAL},
    {NULL, "--prefill-chunk", O_CHUNK}, {NULL, "--key-file", O_KEY}, {NULL, "--sim-latency-ms", O_LAT},
    {NULL, "--sim-bandwidth-mbps", O_BW}, {NULL, "--stage-timeout-ms", O_TIMEOUT},
    {NULL, "--local-transport", O_TRANSPORT},
};

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
    case O_LOCAL: return ps_arg_int("run", flag, v, 1, PS_SHARD_MAX_STAGES, &o->local_stages);
    case O_CHUNK: return ps_arg_int("run", flag, v, 1, 1 << 16, &o->prefill_chunk);
    case O_TIMEOUT: return ps_arg_int("run", flag, v, 1, 86400000, &o->timeout_ms);
    case O_LAT: return ps_arg_float("run", flag, v, 0, 1e5, &o->sim.latency_ms);
    case O_BW: return ps_arg_mbps("run", flag, v, &o->sim.bandwidth_mbps);
    case O_TRANSPORT: o->local_transport = true; return ps_arg_transport("run", flag, v, &o->local_unix);
    case O_ACT:
        if (!ps_act_from_name(v, &o->act)) return true;
        fprintf(stderr, "pipeshard run: %s must be q8 or f32, got '%s'\n", flag, v);
        return false;
    case O_N: return ps_arg_int("run", flag, v, -1, 1 << 30, &o->n_predict);
    case O_THREADS: return ps_arg_int("run", flag, v, 1, 1024, &o->threads);
    case O_CTX: return ps_arg_int("run", flag, v, 1, 1 << 24, &o->ctx);
    case O_BATCH: return ps_arg_int("run", flag, v, 1, 1 << 16, &o->batch);
    case O_TOPK: return ps_arg_int("run", flag, v, 0, 1 << 30, &i) && ((o->sp.top_k = (int32_t)i), true);
    case O_REPN: return ps_arg_int("run", flag, v, -1, 1 << 30, &i) && ((o->sp.penalty_last_n = (int32_t)i), true);
    case O_SEED:
        o->seeded = true;
        return ps_arg_int("run", flag, v, 0, INT64_MAX, &i) && ((o->sp.seed = (uint64_t)i), true);
    case O_TEMP: return ps_arg_float("run", flag, v, 0, 1e6, &d) && ((o->sp.temperature = (float)d), true);
    case O_TOPP: return ps_arg_float("run", flag, v, 1e-9, 1, &d) && ((o->sp.top_p = (float)d), true);
    case O_MINP: return ps_arg_float("run", flag, v, 0, 1, &d) && ((o->sp.min_p = (float)d), true);
    case O_REP: return ps_arg_float("run", flag, v, 1e-6, 1e6, &d) && ((o->sp.repetition_penalty = (float)d), true);
    case O_PRES: return ps_arg_float("run", flag, v, -2, 2, &d) && ((o->sp.presence_penalty = (float)d), true);
    case O_FREQ: return ps_arg_float("run", flag, v, -2, 2, &d) && ((o->sp.frequency_penalty = (float)d), true);
    }
    return false;
}

/* Parses argv; returns -1 to go on, else the exit status (0 after --help). */
static int run_parse(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.n_predict = 128, .threads = ps_cpu_count(), .batch = 128, .local_stages = 1, .timeout_ms = 60000,
                    .sp = ps_sample_params_default()};
    o->sp.temperature = 0.8f, o->sp.top_k = 40, o->sp.top_p = 0.95f, o->sp.min_p = 0.05f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return run_usage(stdout), 0;
        if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = true; continue; }
        if (!strcmp(a, "--chat")) { o->chat = true; continue; }
        if (!strcmp(a, "--stats")) { o->stats = true; continue; }
        if (!strcmp(a, "--print-ids")) { o->print_ids = true; continue; }
        if (!strcmp(a, "--pin")) { o->pin = true; continue; }
        if (!strcmp(a, "--mmap")) { o->mmap = true; continue; }
        if (!strcmp(a, "--plain-frames")) { o->plain = true; continue; }
        size_t k = 0;
        while (k < PS_ARRAY_LEN(value_flags) &&
               !((value_flags[k].s && !strcmp(a, value_flags[k].s)) || !strcmp(a, value_flags[k].l)))
            k++;
        if (k == PS_ARRAY_LEN(value_flags)) {
            fprintf(stderr, "pipeshard run: unknown option '%s' (see pipeshard run --help)\n", a);
            return 2;
        }
        const char *v = ps_arg_value("run", argc, argv, &i);
        if (!v || !run_set(o, value_flags[k].id, a, v)) return 2;
    }
    const char *why = NULL;
    if (!o->model == !o->fleet) why = o->model ? "give -m MODEL or --fleet FLEET.json, not both" : "no model given (-m MODEL or --fleet FLEET.json)";
    else if (o->fleet && o->local_stages > 1) why = "--local-stages splits -m MODEL; --fleet runs a fleet already split";
    else if (o->local_transport && o->local_stages < 2) why = "--local-transport applies to --local-stages N (N >= 2)";
    else if (o->dump_logits && (o->fleet || o->local_stages > 1))
        why = "--dump-logits needs the whole model in this process (logits never cross the network)";
    else if (!!o->prompt + !!o->prompt_file + !!o->prompt_ids > 1) why = "give only one of -p, -f and --prompt-ids";
    else if (o->chat && o->prompt_ids) why = "--chat needs a text prompt, not --prompt-ids";
    if (why) {
        fprintf(stderr, "pipeshard run: %s\n", why);
        return 2;
    }
    if (!o->seeded && getrandom(&o->sp.seed, sizeof o->sp.seed, 0) != sizeof o->sp.seed) o->sp.seed = (uint64_t)ps_now();
    o->sp.seed &= INT64_MAX;
    return -1;
}

// ---------------------------------------------------------------------------------------
// Generation

typedef struct {
    const run_opts *o;
    ps_local_fleet *local; /* --local-stages > 1 */
    ps_fleet *fleet;       /* --fleet, or the local one */
    ps_coord *coord;
    const ps_model *m;     /* stage 0's model (the tokenizer's metadata) */
    ps_tok *tok;          /* NULL when ids go in and out (--prompt-ids with --print-ids) */
    ps_tok_stream *stream;
    int32_t *toks;        /* (n_ctx + 1) prompt then generated tokens */
    int n_toks;
    int n_prompt;
    FILE *dump;           /* --dump-logits */
    double t_load, t_prefill, t_first, t_decode;
    int n_decode;         /* single-token forward passes timed in t_decode */
    char err[1024];
} run_state;

/* Reads a whole file into a NUL-terminated malloc'd buffer (caller frees). */
static ps_status read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
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
    fclose(f);
    if (!buf) return ps_errf(err, errlen, PS_ERR_NOMEM, "prompt file '%s' is too large", path);
    if (bad) {
        free(buf);
        return ps_errf(err, errlen, PS_ERR_IO, "cannot read prompt file '%s'", path);
    }
    buf[n] = 0;
    *out = buf, *len = n;
    return PS_OK;
}

/* Parses "1,2,3" into st->toks (at most cap ids). */
static ps_status parse_ids(run_state *st, const char *s, int cap) {
    long long n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ','))
            return ps_errf(st->err, sizeof st->err, PS_ERR_ARG,
                           "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        if (n < cap) st->toks[n] = (int32_t)v;
        n++;
        p = *end ? end + 1 : end;
    }
    if (!n) return ps_errf(st->err, sizeof st->err, PS_ERR_ARG, "--prompt-ids is empty");
    if (n > cap)
        return ps_errf(st->err, sizeof st->err, PS_ERR_RANGE,
                       "the prompt has %lld tokens, more than the context size of %d (-c/--ctx-size)", n, cap);
    st->n_prompt = st->n_toks = (int)n;
    return PS_OK;
}

/* A NUL-terminated copy of token id's text, or NULL (caller frees). */
static char *token_text(const ps_tok *tok, int32_t id) {
    size_t len;
    const char *t = id >= 0 ? ps_tok_token_text(tok, id, &len) : NULL;
    return t ? strndup(t, len) : NULL;
}

/* Renders the user's prompt (and --system) through the model's chat template, or the
 * family named by --chat-template. *text is malloc'd; *writes_bos says whether it holds
 * the BOS text already. */
static ps_status chat_prompt(run_state *st, const char *user, char **text, bool *writes_bos) {
    const run_opts *o = st->o;
    ps_gguf_str t;
    char *tmpl = NULL, *bos = token_text(st->tok, ps_tok_bos(st->tok)), *eos = token_text(st->tok, ps_tok_eos(st->tok));
    if (ps_gguf_get_str(st->m->gguf, "tokenizer.chat_template", &t, NULL, 0) == PS_OK) tmpl = strndup(t.data, t.len);
    ps_chat *chat = NULL;
    ps_status s = ps_chat_create(tmpl, o->chat_template, bos, eos, &chat, st->err, sizeof st->err);
    if (!s) {
        ps_chat_msg msgs[2] = {{"system", o->system}, {"user", user}};
        size_t len;
        s = ps_chat_apply_alloc(chat, o->system ? msgs : msgs + 1, o->system ? 2 : 1, true, text, &len, st->err,
                                sizeof st->err);
        *writes_bos = ps_chat_writes_bos(chat);
    }
    ps_chat_free(chat);
    free(tmpl), free(bos), free(eos);
    return s;
}

/* The text to tokenize: -p, -f or nothing, wrapped in the chat template with --chat.
 * *text is malloc'd (caller frees); *add_bos says whether the tokenizer adds BOS. */
static ps_status prompt_text(run_state *st, char **text, size_t *len, bool *add_bos) {
    const run_opts *o = st->o;
    char *raw = NULL;
    size_t n = 0;
    ps_status s = PS_OK;
    *add_bos = true;
    if (o->prompt_file) s = read_file(o->prompt_file, &raw, &n, st->err, sizeof st->err);
    else if (!(raw = strdup(o->prompt ? o->prompt : ""))) s = PS_ERR_NOMEM;
    else n = strlen(raw);
    if (s || !o->chat) {
        *text = raw, *len = n;
        return s;
    }
    bool writes_bos = false;
    s = chat_prompt(st, raw, text, &writes_bos);
    free(raw);
    *add_bos = !writes_bos;
    if (!s) *len = strlen(*text);
    return s;
}

/* Fills st->toks with the prompt (text tokenized, or --prompt-ids). */
static ps_status tokenize_prompt(run_state *st, int cap) {
    if (st->o->prompt_ids) return parse_ids(st, st->o->prompt_ids, cap);
    char *text;
    size_t len, n = 0;
    bool add_bos;
    ps_status s = prompt_text(st, &text, &len, &add_bos);
    if (s) return s;
    s = ps_tok_encode(st->tok, text, len, add_bos, st->o->chat, st->toks, (size_t)cap, &n, st->err, sizeof st->err);
    free(text);
    if (s == PS_ERR_RANGE)
        return ps_errf(st->err, sizeof st->err, PS_ERR_RANGE,
                       "the prompt has %zu tokens, more than the context size of %d (-c/--ctx-size)", n, cap);
    if (s) return s;
    if (n == 0) return ps_errf(st->err, sizeof st->err, PS_ERR_ARG, "the prompt is empty (give -p, -f or --prompt-ids)");
    st->n_prompt = st->n_toks = (int)n;
    return PS_OK;
}

/* Starts the fleet: --local-stages workers, or --fleet's; NULL fleet = the whole model. */
static ps_status start_fleet(run_state *st, uint8_t *key, bool *have_key) {
    const run_opts *o = st->o;
    char *err = st->err;
    size_t el = sizeof st->err;
    ps_status s = PS_OK;
    *have_key = false;
    if (o->local_stages > 1) {
        if (!(st->local = calloc(1, sizeof *st->local))) return ps_errf(err, el, PS_ERR_NOMEM, "out of memory");
        ps_stage_opts so = {.threads = (int)o->threads, .pin = o->pin, .mmap = o->mmap};
        s = ps_local_fleet_start(o->model, (int)o->local_stages, &so, &o->sim, o->key_file, o->local_unix, st->local,
                                 err, el);
        if (s) return s;
        st->fleet = &st->local->fleet;
        memcpy(key, st->local->key, 32);
        *have_key = true;
        return PS_OK;
    }
    if (o->key_file && (s = ps_net_key_load(o->key_file, key, err, el))) return s;
    *have_key = o->key_file != NULL;
    if (!o->fleet) return PS_OK;
    if (!(st->fleet = malloc(sizeof *st->fleet))) return ps_errf(err, el, PS_ERR_NOMEM, "out of memory");
    return ps_fleet_load(o->fleet, st->fleet, err, el);
}

/* Starts the fleet and the coordinator, loads the tokenizer, tokenizes the prompt. */
static ps_status run_setup(run_state *st) {
    const run_opts *o = st->o;
    char *err = st->err;
    size_t el = sizeof st->err;
    double t0 = ps_now();
    uint8_t key[32];
    bool have_key;
    ps_status s = start_fleet(st, key, &have_key);
    if (s) return s;
    if ((s = ps_sample_params_check(&o->sp, err, el))) return s;
    ps_coord_opts co = {.model = st->fleet ? NULL : o->model, .fleet = st->fleet, .threads = (int)o->threads,
                        .pin = o->pin, .mmap = o->mmap, .plain = o->plain || o->local_stages > 1,
                        .n_ctx = (int)o->ctx, .max_batch = (int)o->batch, .prefill_chunk = (int)o->prefill_chunk,
                        .act = o->act, .key = have_key ? key : NULL, .sim = o->sim, .timeout_ms = (int)o->timeout_ms};
    if ((s = ps_coord_create(&co, &st->coord, err, el))) return s;
    if ((s = ps_coord_connect(st->coord, err, el))) return s;
    st->m = ps_coord_model(st->coord);
    bool need_tok = !(o->prompt_ids && o->print_ids);
    if (need_tok && (s = ps_tok_create(st->m->gguf, &st->tok, err, el))) return s;
    if (st->tok && ps_tok_n_vocab(st->tok) > st->m->hp.vocab)
        return ps_errf(err, el, PS_ERR_FORMAT, "the tokenizer has %d tokens but the model only %d rows",
                       ps_tok_n_vocab(st->tok), st->m->hp.vocab);
    int n_ctx = ps_coord_n_ctx(st->coord);
    if (st->tok && (s = ps_tok_stream_create(st->tok, 0, &st->stream))) return s;
    /* n_ctx positions, plus the last sampled token, which is printed but never fed */
    if (!(st->toks = malloc(((size_t)n_ctx + 1) * sizeof *st->toks))) return ps_errf(err, el, PS_ERR_NOMEM, "out of memory");
    if (o->dump_logits && !(st->dump = fopen(o->dump_logits, "wb")))
        return ps_errf(err, el, PS_ERR_IO, "cannot create '%s': %s", o->dump_logits, strerror(errno));
    st->t_load = ps_now() - t0;
    return tokenize_prompt(st, n_ctx);
}

/* Prints one generated token (text through the streaming detokenizer, or its id). */
static ps_status emit(run_state *st, int32_t tok) {
    if (st->o->print_ids) {
        printf(st->n_toks > st->n_prompt + 1 ? " %d" : "%d", tok);
    } else {
        const char *text;
        size_t len;
        ps_status s = ps_tok_stream_push(st->stream, tok, &text, &len);
        if (s) return ps_errf(st->err, sizeof st->err, s, "cannot decode token %d", tok);
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return PS_OK;
}

/* Writes the logits behind the latest token (--dump-logits). */
static ps_status dump_logits(run_state *st) {
    const float *lg = ps_coord_logits(st->coord);
    size_t v = (size_t)st->m->hp.vocab;
    if (st->dump && (!lg || fwrite(lg, sizeof(float), v, st->dump) != v))
        return ps_errf(st->err, sizeof st->err, PS_ERR_IO, "cannot write '%s'", st->o->dump_logits);
    return PS_OK;
}

/* Prefill, then print / feed / sample until -n tokens, end of text or the context is full.
 * The last stage samples each token at position n_toks from the logits and the history. */
static ps_status generate(run_state *st) {
    const run_opts *o = st->o;
    int n_ctx = ps_coord_n_ctx(st->coord);
    char *err = st->err;
    size_t el = sizeof st->err;
    double t0 = ps_now();
    int32_t tok;
    ps_status s = ps_coord_next(st->coord, st->toks, st->n_toks, 0, &o->sp, &tok, err, el);
    if (s) return s;
    st->t_prefill = st->t_first = ps_now() - t0;
    double td = 0;
    for (long long i = 0; o->n_predict < 0 || i < o->n_predict; i++) {
        if ((s = dump_logits(st))) return s;
        if (!o->ignore_eos && st->tok && ps_tok_is_eog(st->tok, tok)) break;
        st->toks[st->n_toks++] = tok;
        if ((s = emit(st, tok))) return s;
        if ((o->n_predict >= 0 && i + 1 == o->n_predict) || st->n_toks > n_ctx) break; /* nowhere to feed it */
        double t1 = ps_now();
        if ((s = ps_coord_next(st->coord, &st->toks[st->n_toks - 1], 1, st->n_toks - 1, &o->sp, &tok, err, el)))
            return s;
        td += ps_now() - t1;
        st->n_decode++;
    }
    st->t_decode = td;
    if (o->print_ids) {
        printf("\n");
    } else if (st->stream) {
        const char *text;
        size_t len;
        ps_tok_stream_flush(st->stream, &text, &len);
        fwrite(text, 1, len, stdout);
        printf("\n");
    }
    fflush(stdout);
    return PS_OK;
}

/* Per-stage compute and per-hop traffic, for --stats. */
static void add_fleet_stats(const run_state *st, cJSON *j) {
    ps_coord_stats cs;
    ps_coord_get_stats(st->coord, &cs);
    cJSON_AddNumberToObject(j, "stages", cs.n_stages);
    if (cs.n_stages > 1) {
        cJSON_AddNumberToObject(j, "wait_ms", cs.wait_ms);
        cJSON_AddNumberToObject(j, "ring_overhead_ms", ps_coord_ring_overhead_ms(&cs));
    }
    cJSON *stages = cJSON_AddArrayToObject(j, "stage_stats"), *hops = cJSON_AddArrayToObject(j, "hops");
    for (int k = 0; k < cs.n_stages; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "stage", k);
        cJSON_AddStringToObject(e, "address", st->fleet ? st->fleet->stages[k].address : "local");
        cJSON_AddNumberToObject(e, "compute_ms", cs.compute_ms[k]);
        cJSON_AddItemToArray(stages, e);
        if (cs.n_stages == 1) continue;
        cJSON *h = cJSON_CreateObject();
        cJSON_AddNumberToObject(h, "from", k);
        if (k + 1 < cs.n_stages) cJSON_AddNumberToObject(h, "to", k + 1);
        else cJSON_AddStringToObject(h, "to", "coordinator");
        cJSON_AddNumberToObject(h, "frames", (double)cs.hop[k].frames);
        cJSON_AddNumberToObject(h, "bytes", (double)cs.hop[k].bytes);
        cJSON_AddNumberToObject(h, "ms", cs.hop[k].send_ms);
        cJSON_AddItemToArray(hops, h);
    }
}

/* The --stats JSON line. */
static void print_stats(const run_state *st) {
    cJSON *j = cJSON_CreateObject();
    int gen = st->n_toks - st->n_prompt;
    cJSON_AddNumberToObject(j, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(j, "generated_tokens", gen);
    cJSON_AddNumberToObject(j, "load_ms", st->t_load * 1e3);
    cJSON_AddNumberToObject(j, "ttft_ms", st->t_first * 1e3);
    cJSON_AddNumberToObject(j, "prefill_tok_s", st->t_prefill > 0 ? st->n_prompt / st->t_prefill : 0);
    cJSON_AddNumberToObject(j, "decode_tok_s", st->t_decode > 0 ? st->n_decode / st->t_decode : 0);
    cJSON_AddNumberToObject(j, "threads", (double)st->o->threads);
    cJSON_AddNumberToObject(j, "n_ctx", ps_coord_n_ctx(st->coord));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)st->o->sp.seed);
    cJSON_AddRawToObject(j, "seed", seed); /* exact: a double would round seeds above 2^53 */
    cJSON_AddStringToObject(j, "isa", ps_matmul_isa());
    cJSON_AddStringToObject(j, "activations", ps_act_name(st->o->act));
    add_fleet_stats(st, j);
    char *txt = cJSON_PrintUnformatted(j);
    fprintf(stderr, "%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}

static void run_cleanup(run_state *st) {
    if (st->dump) fclose(st->dump);
    free(st->toks);
    ps_tok_stream_free(st->stream);
    ps_tok_free(st->tok);
    ps_coord_free(st->coord);
    if (st->local) ps_local_fleet_stop(st->local);
    else free(st->fleet);
    free(st->local);
}

int ps_cli_run(int argc, char **argv) {
    run_opts o;
    int rc = run_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    run_state st = {.o = &o};
    ps_status s = run_setup(&st);
    if (!s) s = generate(&st);
    if (s) fprintf(stderr, "pipeshard run: %s\n", st.err[0] ? st.err : ps_strerror(s));
    else if (o.stats) print_stats(&st);
    run_cleanup(&st);
    return s ? 1 : 0;
}
