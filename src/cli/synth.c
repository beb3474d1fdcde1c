/* synth.c - `pipeshard synth`: writes a GGUF v3 model of a given shape with random weights
 * and a usable byte-level BPE vocabulary (synth_vocab.c), quantized to a given type as it is
 * written (synth_model.c). Usage errors exit 2, runtime errors 1, each one stderr line
 * starting with "pipeshard synth: ". */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "synth.h"

#define CMD "synth"

// ---------------------------------------------------------------------------------------
// Presets and types

/* head_dim 0 means dim / n_head (computed after any override of dim or heads). */
static const ps_cli_synth_shape presets[] = {
    {.name = "tiny",
     .arch = "llama",
     .n_layer = 2,
     .dim = 64,
     .n_head = 4,
     .n_head_kv = 2,
     .ffn = 128,
     .vocab = 512,
     .ctx = 2048,
     .rope_base = 10000,
     .rms_eps = 1e-5f,
     .tied = true,
     .pre = "smollm"},
    {.name = "smollm2-135m",
     .arch = "llama",
     .n_layer = 30,
     .dim = 576,
     .n_head = 9,
     .n_head_kv = 3,
     .ffn = 1536,
     .vocab = 49152,
     .ctx = 8192,
     .rope_base = 100000,
     .rms_eps = 1e-5f,
     .tied = true,
     .pre = "smollm"},
    {.name = "llama-3.2-1b",
     .arch = "llama",
     .n_layer = 16,
     .dim = 2048,
     .n_head = 32,
     .n_head_kv = 8,
     .ffn = 8192,
     .vocab = 128256,
     .ctx = 8192,
     .rope_base = 500000,
     .rms_eps = 1e-5f,
     .rope_factor = 32,
     .tied = true,
     .pre = "llama-bpe"},
    {.name = "llama-3.1-8b",
     .arch = "llama",
     .n_layer = 32,
     .dim = 4096,
     .n_head = 32,
     .n_head_kv = 8,
     .ffn = 14336,
     .vocab = 128256,
     .ctx = 8192,
     .rope_base = 500000,
     .rms_eps = 1e-5f,
     .rope_factor = 8,
     .tied = false,
     .pre = "llama-bpe"},
    {.name = "llama-3.1-70b",
     .arch = "llama",
     .n_layer = 80,
     .dim = 8192,
     .n_head = 64,
     .n_head_kv = 8,
     .ffn = 28672,
     .vocab = 128256,
     .ctx = 8192,
     .rope_base = 500000,
     .rms_eps = 1e-5f,
     .rope_factor = 8,
     .tied = false,
     .pre = "llama-bpe"},
    {.name = "qwen2.5-1.5b",
     .arch = "qwen2",
     .n_layer = 28,
     .dim = 1536,
     .n_head = 12,
     .n_head_kv = 2,
     .ffn = 8960,
     .vocab = 151936,
     .ctx = 32768,
     .rope_base = 1000000,
     .rms_eps = 1e-6f,
     .tied = true,
     .pre = "qwen2"},
    {.name = "qwen3-0.6b",
     .arch = "qwen3",
     .n_layer = 28,
     .dim = 1024,
     .n_head = 16,
     .n_head_kv = 8,
     .head_dim = 128,
     .ffn = 3072,
     .vocab = 151936,
     .ctx = 40960,
     .rope_base = 1000000,
     .rms_eps = 1e-6f,
     .tied = true,
     .pre = "qwen2"},
};

/* --type values; general.file_type in llama.cpp's llama_ftype numbering (plain K types are
 * recorded as the _S variants, the nearest llama.cpp names). */
static const ps_cli_synth_quant quants[] = {
    {"F32", PS_TYPE_F32, PS_TYPE_F32, false, 0},      {"F16", PS_TYPE_F16, PS_TYPE_F16, false, 1},
    {"BF16", PS_TYPE_BF16, PS_TYPE_BF16, false, 32},  {"Q8_0", PS_TYPE_Q8_0, PS_TYPE_Q8_0, false, 7},
    {"Q4_0", PS_TYPE_Q4_0, PS_TYPE_Q4_0, false, 2},   {"Q4_1", PS_TYPE_Q4_1, PS_TYPE_Q4_1, false, 3},
    {"Q5_0", PS_TYPE_Q5_0, PS_TYPE_Q5_0, false, 8},   {"Q5_1", PS_TYPE_Q5_1, PS_TYPE_Q5_1, false, 9},
    {"Q4_K", PS_TYPE_Q4_K, PS_TYPE_Q4_K, false, 14},  {"Q5_K", PS_TYPE_Q5_K, PS_TYPE_Q5_K, false, 16},
    {"Q6_K", PS_TYPE_Q6_K, PS_TYPE_Q6_K, false, 18},  {"Q4_K_M", PS_TYPE_Q4_K, PS_TYPE_Q6_K, true, 15},
    {"Q5_K_M", PS_TYPE_Q5_K, PS_TYPE_Q6_K, true, 17},
};

/* Prints the command's usage, presets and types to f. */
static void usage(FILE *f) {
    fprintf(f, "usage: pipeshard synth (--like NAME | --layers L --dim D --heads H [--kv-heads KV] --ffn F --vocab V)\n"
               "                       --type TYPE -o OUT [--arch llama|qwen2|qwen3] [--ctx N] [--seed S]\n"
               "                       [--head-dim HD] [--untied] [--exact] [--threads N]\n\n"
               "Writes a GGUF v3 model with random weights (seeded, deterministic) and a usable byte-level\n"
               "BPE vocabulary of exactly V tokens with a ChatML chat template. Shape flags given with --like\n"
               "override the preset's values.\n\n"
               "  --like NAME     preset shape:");
    for (size_t i = 0; i < PS_ARRAY_LEN(presets); i++) fprintf(f, "%s %s", i ? "," : "", presets[i].name);
    fprintf(f, "\n  --type TYPE     weight type:");
    for (size_t i = 0; i < PS_ARRAY_LEN(quants); i++) fprintf(f, "%s %s", i ? "," : "", quants[i].name);
    fprintf(f, "\n                  (K types need row lengths that are multiples of 256, the others of 32)\n"
               "  -o, --output OUT  file to write\n"
               "  --arch A        llama (default), qwen2 (Q/K/V biases) or qwen3 (per-head Q/K norms)\n"
               "  --kv-heads KV   key/value heads (default: --heads)\n"
               "  --head-dim HD   per-head width (default: dim / heads)\n"
               "  --ctx N         context length in the metadata (default 2048 or the preset's)\n"
               "  --seed S        random seed (default 0)\n"
               "  --untied        write a separate output.weight (default: tied to token_embd)\n"
               "  --threads N     generating threads (default: all cores)\n"
               "  --exact         quantize every row of K-type tensors (slow) instead of assembling those\n"
               "                  of more than 2048 super-blocks (rows of 1024+) from pools of 16384\n");
}

/* Writes "a, b, c" of the names in a table to buf. */
#define NAME_LIST(tab, field, buf)                                                                                     \
    do {                                                                                                               \
        size_t o_ = 0;                                                                                                 \
        for (size_t i_ = 0; i_ < PS_ARRAY_LEN(tab) && o_ < sizeof(buf); i_++)                                          \
            o_ += (size_t)snprintf((buf) + o_, sizeof(buf) - o_, "%s%s", i_ ? ", " : "", tab[i_].field);               \
    } while (0)

// ---------------------------------------------------------------------------------------
// Command line

typedef struct {
    const char *like, *type, *out, *arch;
    long long layers, dim, heads, kv_heads, ffn, vocab, ctx, head_dim, seed, threads; /* 0: not given */
    bool untied, exact, help;
} opts;

/* An integer flag's destination and range, or NULL when flag is not one. */
static long long *int_flag(opts *o, const char *flag, long long *max) {
    static const struct {
        const char *flag;
        size_t off;
        long long max;
    } tab[] = {
        {"--layers", offsetof(opts, layers), 4096}, {"--dim", offsetof(opts, dim), 1 << 16},
        {"--heads", offsetof(opts, heads), 4096},   {"--kv-heads", offsetof(opts, kv_heads), 4096},
        {"--ffn", offsetof(opts, ffn), 1 << 20},    {"--vocab", offsetof(opts, vocab), 1 << 22},
        {"--ctx", offsetof(opts, ctx), 1 << 24},    {"--head-dim", offsetof(opts, head_dim), 1 << 14},
        {"--threads", offsetof(opts, threads), 64},
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(tab); i++)
        if (!strcmp(flag, tab[i].flag)) {
            *max = tab[i].max;
            return (long long *)((char *)o + tab[i].off);
        }
    return NULL;
}

/* The string flag's destination, or NULL when flag is not one. */
static const char **str_flag(opts *o, const char *flag) {
    if (!strcmp(flag, "--like")) return &o->like;
    if (!strcmp(flag, "--type")) return &o->type;
    if (!strcmp(flag, "-o") || !strcmp(flag, "--output")) return &o->out;
    if (!strcmp(flag, "--arch")) return &o->arch;
    return NULL;
}

/* Parses argv (argv[0] is "synth") into o; false after printing a usage error. */
static bool parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], **sp;
        long long *ip, max;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            o->help = true;
        else if (!strcmp(a, "--untied"))
            o->untied = true;
        else if (!strcmp(a, "--exact"))
            o->exact = true;
        else if ((sp = str_flag(o, a))) {
            if (!(*sp = ps_arg_value(CMD, argc, argv, &i))) return false;
        } else if ((ip = int_flag(o, a, &max))) {
            const char *v = ps_arg_value(CMD, argc, argv, &i);
            if (!v || !ps_arg_int(CMD, a, v, 1, max, ip)) return false;
        } else if (!strcmp(a, "--seed")) {
            const char *v = ps_arg_value(CMD, argc, argv, &i);
            if (!v || !ps_arg_int(CMD, a, v, 0, INT64_MAX, &o->seed)) return false;
        } else {
            static const char *const known[] = {"--help",     "--untied",   "--exact", "--like",   "--type",
                                                "-o",         "--output",   "--arch",  "--layers", "--dim",
                                                "--heads",    "--kv-heads", "--ffn",   "--vocab",  "--ctx",
                                                "--head-dim", "--threads",  "--seed",  NULL};
            ps_arg_unknown(CMD, a, known, NULL);
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------
// Shape resolution and validation (each failure prints one line and returns false)

/* The preset named like, or NULL after listing the presets. */
static const ps_cli_synth_shape *find_preset(const char *cmd, const char *like) {
    for (size_t i = 0; i < PS_ARRAY_LEN(presets); i++)
        if (!strcasecmp(like, presets[i].name)) return &presets[i];
    char list[256];
    NAME_LIST(presets, name, list);
    fprintf(stderr, "pipeshard %s: unknown preset '%s' (presets: %s)\n", cmd, like, list);
    return NULL;
}

/* The --type entry, or NULL after listing the types. */
static const ps_cli_synth_quant *find_quant(const char *cmd, const char *name) {
    if (!name) {
        fprintf(stderr, "pipeshard %s: missing --type TYPE (see pipeshard %s --help)\n", cmd, cmd);
        return NULL;
    }
    for (size_t i = 0; i < PS_ARRAY_LEN(quants); i++)
        if (!strcasecmp(name, quants[i].name)) return &quants[i];
    char list[256];
    NAME_LIST(quants, name, list);
    fprintf(stderr, "pipeshard %s: unknown type '%s' (types: %s)\n", cmd, name, list);
    return NULL;
}

bool ps_cli_synth_find(const char *like, const char *type, ps_cli_synth_shape *s, const ps_cli_synth_quant **q) {
    const ps_cli_synth_shape *p = find_preset("plan", like);
    if (!p || !(*q = find_quant("plan", type))) return false;
    *s = *p;
    if (!s->head_dim) s->head_dim = s->dim / s->n_head;
    return true;
}

/* Defaults of a custom shape for the architecture (which the caller checked). */
static void custom_defaults(ps_cli_synth_shape *s, const char *arch) {
    bool qwen = strcmp(arch, "llama") != 0;
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "synthetic");
    s->ctx = 2048;
    s->rope_base = qwen ? 1000000.0f : 10000.0f;
    s->rms_eps = qwen ? 1e-6f : 1e-5f;
    s->tied = true;
    snprintf(s->pre, sizeof s->pre, "%s", qwen ? "qwen2" : "smollm");
}

/* Applies the shape flags to s; without a preset, the five shape flags are required. */
static bool apply_flags(const opts *o, ps_cli_synth_shape *s, bool preset) {
    static const char *const need[] = {"--layers", "--dim", "--heads", "--ffn", "--vocab"};
    const long long *given[] = {&o->layers, &o->dim, &o->heads, &o->ffn, &o->vocab};
    for (size_t i = 0; !preset && i < PS_ARRAY_LEN(need); i++)
        if (!*given[i]) {
            fprintf(stderr, "pipeshard synth: missing %s (or use --like NAME for a preset shape)\n", need[i]);
            return false;
        }
    if (o->layers) s->n_layer = (int)o->layers;
    if (o->dim) s->dim = (int)o->dim;
    if (o->heads) s->n_head = (int)o->heads;
    if (o->kv_heads)
        s->n_head_kv = (int)o->kv_heads;
    else if (!preset || o->heads)
        s->n_head_kv = s->n_head;
    if (o->ffn) s->ffn = (int)o->ffn;
    if (o->vocab) s->vocab = (int)o->vocab;
    if (o->ctx) s->ctx = (int)o->ctx;
    if (o->head_dim) s->head_dim = (int)o->head_dim;
    if (o->untied) s->tied = false;
    if (o->arch) snprintf(s->arch, sizeof s->arch, "%s", o->arch);
    return true;
}

/* Heads, head size and vocabulary size make sense together. */
static bool check_heads(ps_cli_synth_shape *s) {
    if (!s->head_dim && s->dim % s->n_head) {
        fprintf(stderr, "pipeshard synth: --dim %d is not a multiple of --heads %d (or give --head-dim)\n", s->dim,
                s->n_head);
        return false;
    }
    if (!s->head_dim) s->head_dim = s->dim / s->n_head;
    if (s->n_head_kv > s->n_head || s->n_head % s->n_head_kv) {
        fprintf(stderr, "pipeshard synth: --heads %d is not a multiple of --kv-heads %d\n", s->n_head, s->n_head_kv);
        return false;
    }
    if (s->head_dim % 2) {
        fprintf(stderr, "pipeshard synth: the head size %d must be even (rotary embeddings rotate pairs)\n",
                s->head_dim);
        return false;
    }
    if (s->vocab < 256 + PS_CLI_SYNTH_N_SPECIAL) {
        fprintf(stderr,
                "pipeshard synth: --vocab %d is too small: 256 byte tokens and %d control tokens need at "
                "least %d\n",
                s->vocab, PS_CLI_SYNTH_N_SPECIAL, 256 + PS_CLI_SYNTH_N_SPECIAL);
        return false;
    }
    return true;
}

/* Every matrix row length (dim, heads * head_dim, ffn) is a multiple of the block size of
 * every type the recipe uses. */
static bool check_blocks(const ps_cli_synth_shape *s, const ps_cli_synth_quant *q) {
    const struct {
        const char *what;
        long long n;
    } rows[] = {{"--dim", s->dim}, {"--ffn", s->ffn}, {"heads x head size", (long long)s->n_head * s->head_dim}};
    uint32_t bs = ps_type_get(q->base)->block_size, hs = ps_type_get(q->hi)->block_size;
    uint32_t b = bs > hs ? bs : hs;
    for (size_t i = 0; i < PS_ARRAY_LEN(rows); i++)
        if (rows[i].n % b) {
            fprintf(stderr,
                    "pipeshard synth: --type %s needs matrix row lengths that are a multiple of %u, but %s is %lld%s\n",
                    q->name, b, rows[i].what, rows[i].n,
                    b == PS_QK_K ? " (use a 32-wide type such as Q4_0 or Q8_0)" : "");
            return false;
        }
    return true;
}

/* Resolves and validates the whole request; false after printing a usage error. */
static bool resolve(const opts *o, ps_cli_synth_shape *s, const ps_cli_synth_quant **q) {
    if (o->arch && strcmp(o->arch, "llama") && strcmp(o->arch, "qwen2") && strcmp(o->arch, "qwen3")) {
        fprintf(stderr, "pipeshard synth: unknown architecture '%s' (architectures: llama, qwen2, qwen3)\n", o->arch);
        return false;
    }
    if (o->like) {
        const ps_cli_synth_shape *p = find_preset("synth", o->like);
        if (!p) return false;
        *s = *p;
    } else {
        custom_defaults(s, o->arch ? o->arch : "llama");
        snprintf(s->arch, sizeof s->arch, "llama");
    }
    if (!apply_flags(o, s, o->like != NULL) || !check_heads(s) || !(*q = find_quant("synth", o->type))) return false;
    if (!check_blocks(s, *q)) return false;
    if (!o->out || !*o->out) {
        fprintf(stderr, "pipeshard synth: missing -o OUT (the file to write)\n");
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------
// Entry point

/* Builds the vocabulary and writes the model; returns the exit status. */
static int synth(const opts *o, const ps_cli_synth_shape *s, const ps_cli_synth_quant *q) {
    char err[512] = "";
    double t0 = ps_now();
    ps_cli_synth_vocab v;
    ps_status st = ps_cli_synth_vocab_build(s->vocab, &v, err, sizeof err);
    int threads = o->threads ? (int)o->threads : ps_cpu_count();
    if (!st)
        st = ps_cli_synth_write(s, q, &v, (uint64_t)o->seed, threads, o->exact, o->out, isatty(STDERR_FILENO), err,
                                sizeof err);
    ps_cli_synth_vocab_free(&v);
    if (st) {
        fprintf(stderr, "pipeshard synth: %s\n", *err ? err : ps_strerror(st));
        return 1;
    }
    struct stat sb;
    double mib = stat(o->out, &sb) == 0 ? (double)sb.st_size / (1024.0 * 1024.0) : 0;
    fprintf(stderr, "pipeshard synth: wrote %s (%s %s, %d layers, dim %d, vocab %d, %s, %.1f MiB) in %.1f s\n", o->out,
            s->name, s->arch, s->n_layer, s->dim, s->vocab, q->name, mib, ps_now() - t0);
    return 0;
}

/* See cli.h: parse (exit 2 on a usage error), validate (exit 2), write (exit 1 on failure). */
int ps_cli_synth(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) return 2;
    if (o.help) {
        usage(stdout);
        return 0;
    }
    ps_cli_synth_shape s;
    const ps_cli_synth_quant *q;
    if (!resolve(&o, &s, &q)) return 2;
    return synth(&o, &s, q);
}
