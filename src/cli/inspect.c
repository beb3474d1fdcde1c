/* inspect.c - `pipeshard inspect MODEL [--json] [--dump-tensor NAME -o FILE]`.
 *
 * Describes a GGUF file: version, architecture and hyper-parameters, tokenizer, tensor
 * counts per type, bytes in total, per layer (tensors named blk.N.*) and outside layers.
 * --json prints the same as one JSON object, with every metadata key and the full tensor
 * list. --dump-tensor writes one tensor dequantized to little-endian float32, which the
 * tests use to compare our dequantization with other implementations.
 *
 * Values, strings and tensors are turned into text and JSON by src/gguf (ps_gguf_print_*,
 * gguf_json.h); this file parses the arguments, gathers the per-type and per-layer figures
 * and lays the report out.
 *
 * Exit status: 0 done, 1 error (one line on stderr), 2 usage error. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gguf/gguf.h"
#include "../gguf/gguf_json.h"
#include "../tensor/types.h"
#include "args.h"
#include "cli.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "--dump-tensor writes host floats as little-endian: add a byte swap for this host"
#endif

#define JSON_ARRAY_MAX 16  /* longer metadata arrays are summarized as {"type", "n"} */
#define TEXT_ARRAY_MAX 8   /* elements of an array shown in the text report */
#define TEXT_STR_MAX   72  /* bytes of a string value shown in the text report */
#define MAX_TYPES      256 /* tensor type numbers counted per type */

/* The --help text. */
static void usage(FILE *f) {
    fprintf(f,
            "usage: pipeshard inspect MODEL [--json] [--dump-tensor NAME -o FILE]\n"
            "\n"
            "Describes a GGUF model: version, architecture and hyper-parameters, tokenizer,\n"
            "tensor types, and bytes in total, per layer and outside the layers.\n"
            "\n"
            "  --json              print one JSON object: the report, every metadata key\n"
            "                      (arrays over %d elements as {\"type\", \"n\"}) and every tensor\n"
            "  --dump-tensor NAME  write tensor NAME dequantized to little-endian float32 ...\n"
            "  -o, --output FILE   ... into FILE (row after row, ne[0] values per row)\n"
            "  -h, --help          show this help\n",
            JSON_ARRAY_MAX);
}

/* Prints "pipeshard inspect: <message>" on stderr and returns the exit status 1. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pipeshard inspect: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* Prints a usage error with the synopsis on one line; returns the exit status 2. */
static int usage_error(const char *fmt, const char *arg) {
    fputs("pipeshard inspect: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs(" (usage: pipeshard inspect MODEL [--json] [--dump-tensor NAME -o FILE]; --help for more)\n", stderr);
    return 2;
}

/* Statistics -------------------------------------------------------------------------------- */

typedef struct {
    int64_t index;   /* N of blk.N.* */
    int64_t tensors; /* tensors in the layer */
    uint64_t bytes;  /* their data bytes */
} layer_stat;

typedef struct {
    const char *arch; /* general.architecture as a C string, or NULL (owned here) */
    int64_t type_count[MAX_TYPES];
    uint64_t type_bytes[MAX_TYPES];
    uint64_t total_bytes;
    layer_stat *layers; /* distinct layer indices, ascending */
    int64_t n_layers;
    int64_t *non_layer; /* indices of tensors not named blk.N.* */
    int64_t n_non_layer;
    uint64_t non_layer_bytes;
} stats;

/* N when name is "blk.N.<rest>" (N up to 9 digits), else -1. */
static int64_t layer_of(const char *name) {
    if (strncmp(name, "blk.", 4)) return -1;
    const char *p = name + 4;
    int64_t n = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 10; p++, digits++) n = n * 10 + (*p - '0');
    return digits > 0 && digits <= 9 && *p == '.' && p[1] ? n : -1;
}

/* qsort order of layer entries: by layer index. */
static int layer_cmp(const void *a, const void *b) {
    const layer_stat *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Frees what stats_build allocated (also after it failed half way). */
static void stats_free(stats *s) {
    free((void *)s->arch);
    free(s->layers);
    free(s->non_layer);
}

/* A malloc'd NUL-terminated copy of a GGUF string (NUL bytes inside cut it short). */
static char *str_dup(ps_gguf_str s) {
    char *c = malloc((size_t)s.len + 1);
    if (!c) return NULL;
    memcpy(c, s.data, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

/* Fills s from g; PS_ERR_NOMEM when a table cannot be allocated. */
static ps_status stats_build(const ps_gguf *g, stats *s) {
    int64_t n = ps_gguf_n_tensors(g);
    memset(s, 0, sizeof *s);
    ps_gguf_str arch;
    if (ps_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == PS_OK && !(s->arch = str_dup(arch)))
        return PS_ERR_NOMEM;
    s->layers = calloc((size_t)n + 1, sizeof *s->layers);
    s->non_layer = calloc((size_t)n + 1, sizeof *s->non_layer);
    if (!s->layers || !s->non_layer) return PS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, i);
        if (t->type < MAX_TYPES) s->type_count[t->type]++, s->type_bytes[t->type] += t->nbytes;
        s->total_bytes += t->nbytes;
        int64_t l = layer_of(t->name);
        if (l < 0) {
            s->non_layer[s->n_non_layer++] = i;
            s->non_layer_bytes += t->nbytes;
        } else {
            s->layers[s->n_layers++] = (layer_stat){l, 1, t->nbytes};
        }
    }
    /* merge the per-tensor entries into one per layer */
    qsort(s->layers, (size_t)s->n_layers, sizeof *s->layers, layer_cmp);
    int64_t k = 0;
    for (int64_t i = 0; i < s->n_layers; i++) {
        if (k > 0 && s->layers[k - 1].index == s->layers[i].index) {
            s->layers[k - 1].tensors++;
            s->layers[k - 1].bytes += s->layers[i].bytes;
        } else {
            s->layers[k++] = s->layers[i];
        }
    }
    s->n_layers = k;
    return PS_OK;
}

/* Smallest, largest and mean bytes per layer, and the range of tensors per layer. */
static void layer_range(const stats *s, uint64_t *min, uint64_t *max, double *mean, int64_t *tmin, int64_t *tmax) {
    uint64_t sum = 0;
    *min = UINT64_MAX, *max = 0, *tmin = INT64_MAX, *tmax = 0;
    for (int64_t i = 0; i < s->n_layers; i++) {
        const layer_stat *l = &s->layers[i];
        if (l->bytes < *min) *min = l->bytes;
        if (l->bytes > *max) *max = l->bytes;
        if (l->tensors < *tmin) *tmin = l->tensors;
        if (l->tensors > *tmax) *tmax = l->tensors;
        sum += l->bytes;
    }
    *mean = s->n_layers ? (double)sum / (double)s->n_layers : 0;
}

/* The vocabulary size: <arch>.vocab_size, else the length of tokenizer.ggml.tokens; -1 if
 * neither. *from names the key used. */
static int64_t vocab_size(const ps_gguf *g, const char *arch, const char **from) {
    char key[256];
    int64_t v;
    if (arch) {
        snprintf(key, sizeof key, "%s.vocab_size", arch);
        if (ps_gguf_get_i64(g, key, &v, NULL, 0) == PS_OK) {
            *from = "vocab_size";
            return v;
        }
    }
    const ps_gguf_value *t = ps_gguf_get(g, "tokenizer.ggml.tokens");
    if (t && t->type == PS_GGUF_ARRAY) {
        *from = "tokenizer.ggml.tokens";
        return (int64_t)t->arr.n;
    }
    return -1;
}

/* "90.7 MiB" style size into buf. */
static const char *human_bytes(char *buf, size_t n, double bytes) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

/* Text report ------------------------------------------------------------------------------- */

/* "[ne0, ne1, ...]" over the tensor's n_dims dimensions. */
static void print_shape(FILE *f, const ps_gguf_tensor *t) {
    fputc('[', f);
    for (uint32_t d = 0; d < t->n_dims; d++) fprintf(f, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
    fputc(']', f);
}

/* One line: tokenizer model, pre-tokenizer, vocabulary, merges, special token ids. */
static void print_tokenizer(FILE *f, const ps_gguf *g, const char *arch) {
    ps_gguf_str s;
    int64_t id;
    const char *from = NULL;
    fprintf(f, "%-14s ", "tokenizer");
    if (ps_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL, 0) == PS_OK)
        ps_gguf_print_str(f, s, 40, false);
    else
        fputs("(no tokenizer.ggml.model)", f);
    if (ps_gguf_get_str(g, "tokenizer.ggml.pre", &s, NULL, 0) == PS_OK)
        fputs(", pre ", f), ps_gguf_print_str(f, s, 40, false);
    int64_t nv = vocab_size(g, arch, &from);
    if (nv >= 0) fprintf(f, ", vocab %" PRId64, nv);
    const ps_gguf_value *m = ps_gguf_get(g, "tokenizer.ggml.merges");
    if (m && m->type == PS_GGUF_ARRAY) fprintf(f, ", %" PRIu64 " merges", m->arr.n);
    if (ps_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &id, NULL, 0) == PS_OK) fprintf(f, ", bos %" PRId64, id);
    if (ps_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &id, NULL, 0) == PS_OK) fprintf(f, ", eos %" PRId64, id);
    if (ps_gguf_get(g, "tokenizer.chat_template")) fputs(", chat template", f);
    fputc('\n', f);
}

/* One line on the blk.N.* layers: count, tensors and bytes per layer. */
static void print_layers(FILE *f, const stats *s) {
    char a[32], b[32], c[32];
    uint64_t min, max;
    double mean;
    int64_t tmin, tmax;
    if (!s->n_layers) {
        fprintf(f, "%-14s none (no tensors named blk.N.*)\n", "layers");
        return;
    }
    layer_range(s, &min, &max, &mean, &tmin, &tmax);
    fprintf(f, "%-14s %" PRId64 " (blk.%" PRId64 " .. blk.%" PRId64 "), ", "layers", s->n_layers, s->layers[0].index,
            s->layers[s->n_layers - 1].index);
    if (tmin == tmax)
        fprintf(f, "%" PRId64 " tensors each", tmin);
    else
        fprintf(f, "%" PRId64 "..%" PRId64 " tensors", tmin, tmax);
    if (min == max)
        fprintf(f, ", %s (%" PRIu64 " bytes) per layer\n", human_bytes(a, sizeof a, (double)min), min);
    else
        fprintf(f, "; bytes per layer min %s, max %s, mean %s\n", human_bytes(a, sizeof a, (double)min),
                human_bytes(b, sizeof b, (double)max), human_bytes(c, sizeof c, mean));
}

/* The text report of the whole file. */
static void print_report(FILE *f, const char *path, const ps_gguf *g, const stats *s) {
    char a[32];
    fprintf(f, "%-14s %s\n", "file", path);
    fprintf(f, "%-14s %zu bytes (%s), GGUF version %" PRIu32 ", alignment %" PRIu32 ", data at offset %zu\n", "size",
            ps_gguf_file_size(g), human_bytes(a, sizeof a, (double)ps_gguf_file_size(g)), ps_gguf_version(g),
            ps_gguf_alignment(g), ps_gguf_data_offset(g));
    fprintf(f, "%-14s %" PRId64 " keys\n", "metadata", ps_gguf_n_kv(g));
    const ps_gguf_value *name = ps_gguf_get(g, "general.name");
    if (name && name->type == PS_GGUF_STRING)
        fprintf(f, "%-14s ", "name"), ps_gguf_print_str(f, name->str, TEXT_STR_MAX, true), fputc('\n', f);
    fprintf(f, "%-14s %s\n", "architecture", s->arch ? s->arch : "(no general.architecture)");
    size_t plen = s->arch ? strlen(s->arch) : 0;
    for (int64_t i = 0; s->arch && i < ps_gguf_n_kv(g); i++) {
        const char *key = ps_gguf_kv_key(g, i);
        if (strncmp(key, s->arch, plen) || key[plen] != '.') continue;
        fprintf(f, "  %-36s ", key + plen + 1);
        ps_gguf_print_value(f, ps_gguf_kv_value(g, i), TEXT_ARRAY_MAX, TEXT_STR_MAX);
        fputc('\n', f);
    }
    const char *from = NULL;
    int64_t nv = vocab_size(g, s->arch, &from);
    if (nv >= 0 && from && strcmp(from, "vocab_size"))
        fprintf(f, "  %-36s %" PRId64 " (length of %s)\n", "vocab_size", nv, from);
    print_tokenizer(f, g, s->arch);
    fprintf(f, "%-14s %" PRId64 ":", "tensors", ps_gguf_n_tensors(g));
    for (int t = 0; t < MAX_TYPES; t++)
        if (s->type_count[t]) fprintf(f, " %s x%" PRId64, ps_type_name((uint32_t)t), s->type_count[t]);
    fputc('\n', f);
    fprintf(f, "%-14s %" PRIu64 " bytes (%s)\n", "tensor bytes", s->total_bytes,
            human_bytes(a, sizeof a, (double)s->total_bytes));
    print_layers(f, s);
    fprintf(f, "%-14s %" PRId64 " tensors, %" PRIu64 " bytes (%s)\n", "non-layer", s->n_non_layer, s->non_layer_bytes,
            human_bytes(a, sizeof a, (double)s->non_layer_bytes));
    for (int64_t i = 0; i < s->n_non_layer; i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, s->non_layer[i]);
        fprintf(f, "  %-36s %-6s ", t->name, ps_type_name(t->type));
        print_shape(f, t);
        fprintf(f, " %zu bytes\n", t->nbytes);
    }
}

/* JSON report ------------------------------------------------------------------------------- */

/* Every <arch>.* key without its prefix, plus vocab_size when it comes from the token list. */
static cJSON *json_hparams(const ps_gguf *g, const stats *s) {
    cJSON *o = s->arch ? ps_gguf_json_metadata(g, s->arch, JSON_ARRAY_MAX) : cJSON_CreateObject();
    const char *from = NULL;
    int64_t nv = vocab_size(g, s->arch, &from);
    if (o && nv >= 0 && from && strcmp(from, "vocab_size") &&
        !ps_gguf_json_put(o, "vocab_size", ps_gguf_json_i64(nv))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Tokenizer summary: model, pre, vocab_size, n_merges, special token ids, chat_template. */
static cJSON *json_tokenizer(const ps_gguf *g, const char *arch) {
    static const struct {
        const char *key, *name;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", "bos_token_id"},
        {"tokenizer.ggml.eos_token_id", "eos_token_id"},
        {"tokenizer.ggml.unknown_token_id", "unknown_token_id"},
        {"tokenizer.ggml.padding_token_id", "padding_token_id"},
    };
    cJSON *o = cJSON_CreateObject();
    ps_gguf_str str;
    int64_t id;
    const char *from;
    if (!o) return NULL;
    bool ok = true;
    if (ps_gguf_get_str(g, "tokenizer.ggml.model", &str, NULL, 0) == PS_OK)
        ok = ok && ps_gguf_json_put(o, "model", ps_gguf_json_str(str.data, (size_t)str.len));
    if (ps_gguf_get_str(g, "tokenizer.ggml.pre", &str, NULL, 0) == PS_OK)
        ok = ok && ps_gguf_json_put(o, "pre", ps_gguf_json_str(str.data, (size_t)str.len));
    int64_t nv = vocab_size(g, arch, &from);
    if (nv >= 0) ok = ok && ps_gguf_json_put(o, "vocab_size", ps_gguf_json_i64(nv));
    const ps_gguf_value *m = ps_gguf_get(g, "tokenizer.ggml.merges");
    if (m && m->type == PS_GGUF_ARRAY) ok = ok && ps_gguf_json_put(o, "n_merges", ps_gguf_json_u64(m->arr.n));
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ps_gguf_get_i64(g, ids[i].key, &id, NULL, 0) == PS_OK)
            ok = ok && ps_gguf_json_put(o, ids[i].name, ps_gguf_json_i64(id));
    ok =
        ok && ps_gguf_json_put(o, "chat_template", cJSON_CreateBool(ps_gguf_get(g, "tokenizer.chat_template") != NULL));
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* Adds an empty object or array under key; NULL (and nothing added) when out of memory. */
static cJSON *json_child(cJSON *obj, const char *key, bool array) {
    cJSON *c = array ? cJSON_CreateArray() : cJSON_CreateObject();
    return c && ps_gguf_json_put(obj, key, c) ? c : NULL;
}

/* Layer summary: count, min/max/mean bytes, and one entry per layer. */
static cJSON *json_layers(const stats *s) {
    uint64_t min = 0, max = 0;
    double mean = 0;
    int64_t tmin, tmax;
    cJSON *o = cJSON_CreateObject();
    if (s->n_layers) layer_range(s, &min, &max, &mean, &tmin, &tmax);
    bool ok = o && ps_gguf_json_put(o, "count", ps_gguf_json_i64(s->n_layers)) &&
              ps_gguf_json_put(o, "min_bytes", ps_gguf_json_u64(min)) &&
              ps_gguf_json_put(o, "max_bytes", ps_gguf_json_u64(max)) &&
              ps_gguf_json_put(o, "mean_bytes", ps_gguf_json_f64(mean));
    cJSON *per = ok ? json_child(o, "per_layer", true) : NULL;
    ok = per != NULL;
    for (int64_t i = 0; ok && i < s->n_layers; i++) {
        cJSON *l = cJSON_CreateObject();
        ok = ps_gguf_json_push(per, l) && ps_gguf_json_put(l, "index", ps_gguf_json_i64(s->layers[i].index)) &&
             ps_gguf_json_put(l, "n_tensors", ps_gguf_json_i64(s->layers[i].tensors)) &&
             ps_gguf_json_put(l, "bytes", ps_gguf_json_u64(s->layers[i].bytes));
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* The whole JSON report (caller deletes it), or NULL when out of memory. Children are
 * attached to the root as soon as they are made, so deleting the root frees everything. */
static cJSON *json_report(const char *path, const ps_gguf *g, const stats *s) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ps_gguf_json_put(o, "file", ps_gguf_json_str(path, strlen(path))) &&
              ps_gguf_json_put(o, "file_size", ps_gguf_json_u64(ps_gguf_file_size(g))) &&
              ps_gguf_json_put(o, "version", ps_gguf_json_u64(ps_gguf_version(g))) &&
              ps_gguf_json_put(o, "alignment", ps_gguf_json_u64(ps_gguf_alignment(g))) &&
              ps_gguf_json_put(o, "data_offset", ps_gguf_json_u64(ps_gguf_data_offset(g))) &&
              ps_gguf_json_put(o, "architecture",
                               s->arch ? ps_gguf_json_str(s->arch, strlen(s->arch)) : cJSON_CreateNull()) &&
              ps_gguf_json_put(o, "hparams", json_hparams(g, s)) &&
              ps_gguf_json_put(o, "tokenizer", json_tokenizer(g, s->arch)) &&
              ps_gguf_json_put(o, "n_tensors", ps_gguf_json_i64(ps_gguf_n_tensors(g)));
    cJSON *types = ok ? json_child(o, "tensor_types", false) : NULL;
    cJSON *tbytes = types ? json_child(o, "tensor_type_bytes", false) : NULL;
    ok = tbytes && ps_gguf_json_put(o, "total_bytes", ps_gguf_json_u64(s->total_bytes)) &&
         ps_gguf_json_put(o, "layers", json_layers(s));
    for (int t = 0; ok && t < MAX_TYPES; t++)
        if (s->type_count[t])
            ok = ps_gguf_json_put(types, ps_type_name((uint32_t)t), ps_gguf_json_i64(s->type_count[t])) &&
                 ps_gguf_json_put(tbytes, ps_type_name((uint32_t)t), ps_gguf_json_u64(s->type_bytes[t]));
    cJSON *non_layer = ok ? json_child(o, "non_layer_tensors", true) : NULL;
    ok = non_layer && ps_gguf_json_put(o, "non_layer_bytes", ps_gguf_json_u64(s->non_layer_bytes));
    for (int64_t i = 0; ok && i < s->n_non_layer; i++) {
        const char *name = ps_gguf_tensor_at(g, s->non_layer[i])->name;
        ok = ps_gguf_json_push(non_layer, ps_gguf_json_str(name, strlen(name)));
    }
    ok = ok && ps_gguf_json_put(o, "n_kv", ps_gguf_json_i64(ps_gguf_n_kv(g))) &&
         ps_gguf_json_put(o, "metadata", ps_gguf_json_metadata(g, NULL, JSON_ARRAY_MAX));
    cJSON *tensors = ok ? json_child(o, "tensors", true) : NULL;
    ok = tensors != NULL;
    for (int64_t i = 0; ok && i < ps_gguf_n_tensors(g); i++)
        ok = ps_gguf_json_push(tensors, ps_gguf_json_tensor(g, ps_gguf_tensor_at(g, i)));
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* --dump-tensor -------------------------------------------------------------------------- */

/* Writes tensor name of g to out_path as float32 rows; returns an exit status. A partial
 * output file is removed on error. */
static int dump_tensor(const ps_gguf *g, const char *model, const char *name, const char *out_path) {
    const ps_gguf_tensor *t = ps_gguf_find_tensor(g, name);
    if (!t) return fail("%s: no tensor named '%s'", model, name);
    const ps_type_info *ti = ps_type_get(t->type);
    if (!ti || !ti->supported)
        return fail("tensor '%s' has type %s, which cannot be dequantized", name, ps_type_name(t->type));
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t row_bytes = ps_row_bytes(t->type, ne0);
    if ((uint64_t)ne0 > SIZE_MAX / sizeof(float))
        return fail("tensor '%s': rows of %" PRId64 " values are too long", name, ne0);
    float *row = malloc((size_t)ne0 * sizeof *row);
    if (!row) return fail("out of memory for a row of %" PRId64 " values", ne0);
    FILE *f = fopen(out_path, "wb");
    if (!f) {
        free(row);
        return fail("cannot create '%s': %s", out_path, strerror(errno));
    }
    int rc = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
        ps_status s = ps_dequantize_row((ps_type)t->type, (const uint8_t *)t->data + (size_t)r * row_bytes, row, ne0);
        if (s)
            rc = fail("cannot dequantize tensor '%s' (%s): %s", name, ps_type_name(t->type), ps_strerror(s));
        else if (fwrite(row, sizeof *row, (size_t)ne0, f) != (size_t)ne0)
            rc = fail("cannot write '%s': %s", out_path, strerror(errno));
    }
    if (fclose(f) != 0 && !rc) rc = fail("cannot write '%s': %s", out_path, strerror(errno));
    free(row);
    if (rc) {
        unlink(out_path);
        return rc;
    }
    fprintf(stderr, "pipeshard inspect: wrote %" PRId64 " float32 values of '%s' (%s ", ne0 * rows, name,
            ps_type_name(t->type));
    print_shape(stderr, t);
    fprintf(stderr, ") to %s\n", out_path);
    return 0;
}

/* Entry point -------------------------------------------------------------------------------- */

/* `pipeshard inspect`: argv[0] is "inspect". Returns the exit status. */
int ps_cli_inspect(int argc, char **argv) {
    const char *model = NULL, *dump = NULL, *out = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--dump-tensor")) {
            if (i + 1 >= argc) return usage_error("%s needs a tensor name", a);
            dump = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) return usage_error("%s needs a file name", a);
            out = argv[++i];
        } else if (!strncmp(a, "--dump-tensor=", 14)) {
            dump = a + 14;
        } else if (!strncmp(a, "--output=", 9)) {
            out = a + 9;
        } else if (a[0] == '-' && a[1]) {
            static const char *const known[] = {"--help", "--json", "--dump-tensor", "-o", "--output", NULL};
            return ps_arg_unknown("inspect", a, known, NULL);
        } else if (model) {
            return usage_error("unexpected argument '%s' (one MODEL only)", a);
        } else {
            model = a;
        }
    }
    if (!model) return usage_error("%s", "missing MODEL");
    if (dump && !out) return usage_error("%s", "--dump-tensor needs -o FILE");
    if (out && !dump) return usage_error("%s", "-o needs --dump-tensor NAME");

    ps_gguf *g = NULL;
    char err[1024];
    ps_status st = ps_gguf_open(model, &g, err, sizeof err);
    if (st) return fail("%s", err);
    int rc = 0;
    if (dump) rc = dump_tensor(g, model, dump, out);
    stats s;
    if (!rc && (json || !dump)) {
        if (stats_build(g, &s)) {
            rc = fail("out of memory");
        } else if (json) {
            cJSON *j = json_report(model, g, &s);
            char *text = j ? cJSON_Print(j) : NULL;
            if (text)
                printf("%s\n", text);
            else
                rc = fail("out of memory while building the JSON report");
            free(text);
            cJSON_Delete(j);
        } else {
            print_report(stdout, model, g, &s);
        }
        stats_free(&s);
    }
    ps_gguf_close(g);
    if (!rc && fflush(stdout) != 0) rc = fail("cannot write the report: %s", strerror(errno));
    return rc;
}
