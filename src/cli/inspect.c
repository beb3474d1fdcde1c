/* inspect.c - `pipeshard inspect MODEL [--json] [--dump-tensor NAME -o FILE]`.
 *
 * Describes a GGUF file: version, architecture and hyper-parameters, tokenizer, tensor
 * counts per type, bytes in total, per layer (tensors named blk.N.*) and outside layers.
 * --json prints the same as one JSON object, with every metadata key and the full tensor
 * list. --dump-tensor writes one tensor dequantized to little-endian float32, which the
 * tests use to compare our dequantization with other implementations.
 *
 * Exit status: 0 done, 1 error (one line on stderr), 2 usage error. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gguf/gguf.h"
#include "../tensor/types.h"
#include "cli.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "--dump-tensor writes host floats as little-endian: add a byte swap for this host"
#endif

#define JSON_ARRAY_MAX 16 /* longer metadata arrays are summarized as {"type", "n"} */
#define TEXT_ARRAY_MAX 8  /* elements of an array shown in the text report */
#define MAX_TYPES 256     /* tensor type numbers counted per type */

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
    int64_t index;    /* N of blk.N.* */
    int64_t tensors;  /* tensors in the layer */
    uint64_t bytes;   /* their data bytes */
} layer_stat;

typedef struct {
    const char *arch;        /* general.architecture as a C string, or NULL (owned here) */
    int64_t type_count[MAX_TYPES];
    uint64_t type_bytes[MAX_TYPES];
    uint64_t total_bytes;
    layer_stat *layers;      /* distinct layer indices, ascending */
    int64_t n_layers;
    int64_t *non_layer;      /* indices of tensors not named blk.N.* */
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

/* Prints a string (quoted when `quote`), escaping control characters, cut after max bytes. */
static void print_text(FILE *f, ps_gguf_str s, size_t max, bool quote) {
    if (quote) fputc('"', f);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    if (quote) fputc('"', f);
    if (s.len > max) fputs("...", f);
}

static void print_str(FILE *f, ps_gguf_str s, size_t max) { print_text(f, s, max, true); }

/* Prints a scalar (non-array) value. */
static void print_scalar(FILE *f, const ps_gguf_value *v) {
    switch (v->type) {
    case PS_GGUF_U8: case PS_GGUF_U16: case PS_GGUF_U32: case PS_GGUF_U64: fprintf(f, "%" PRIu64, v->u64); break;
    case PS_GGUF_I8: case PS_GGUF_I16: case PS_GGUF_I32: case PS_GGUF_I64: fprintf(f, "%" PRId64, v->i64); break;
    case PS_GGUF_F32: fprintf(f, "%.9g", v->f64); break;
    case PS_GGUF_F64: fprintf(f, "%.17g", v->f64); break;
    case PS_GGUF_BOOL: fputs(v->b ? "true" : "false", f); break;
    case PS_GGUF_STRING: print_str(f, v->str, 72); break;
    default: break;
    }
}

/* Element i of an array as a standalone value (numeric, bool or string element). */
static ps_gguf_value elem_at(const ps_gguf_value *arr, uint64_t i) {
    ps_gguf_value e = {.type = arr->arr.type};
    switch (arr->arr.type) {
    case PS_GGUF_STRING: e.str = arr->arr.strs[i]; break;
    case PS_GGUF_ARRAY: e = arr->arr.elems[i]; break;
    case PS_GGUF_F32: case PS_GGUF_F64: e.f64 = ps_gguf_arr_float(arr, i); break;
    case PS_GGUF_BOOL: e.b = ps_gguf_arr_int(arr, i) != 0; break;
    case PS_GGUF_U64: { uint64_t x; memcpy(&x, (const uint8_t *)arr->arr.data + 8 * i, 8); e.u64 = x; break; }
    case PS_GGUF_U8: case PS_GGUF_U16: case PS_GGUF_U32: e.u64 = (uint64_t)ps_gguf_arr_int(arr, i); break;
    default: e.i64 = ps_gguf_arr_int(arr, i); break;
    }
    return e;
}

/* Prints a value on one line: arrays show their first few elements. */
static void print_value(FILE *f, const ps_gguf_value *v) {
    if (v->type != PS_GGUF_ARRAY) {
        print_scalar(f, v);
        return;
    }
    fprintf(f, "[%s x %" PRIu64 "]", ps_gguf_vtype_name(v->arr.type), v->arr.n);
    if (v->arr.n == 0) return;
    fputs(" [", f);
    for (uint64_t i = 0; i < v->arr.n && i < TEXT_ARRAY_MAX; i++) {
        ps_gguf_value e = elem_at(v, i);
        if (i) fputs(", ", f);
        print_value(f, &e);
    }
    fputs(v->arr.n > TEXT_ARRAY_MAX ? ", ...]" : "]", f);
}

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
    if (ps_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL, 0) == PS_OK) print_text(f, s, 40, false);
    else fputs("(no tokenizer.ggml.model)", f);
    if (ps_gguf_get_str(g, "tokenizer.ggml.pre", &s, NULL, 0) == PS_OK) fputs(", pre ", f), print_text(f, s, 40, false);
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
    if (tmin == tmax) fprintf(f, "%" PRId64 " tensors each", tmin);
    else fprintf(f, "%" PRId64 "..%" PRId64 " tensors", tmin, tmax);
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
    if (name && name->type == PS_GGUF_STRING) fprintf(f, "%-14s ", "name"), print_str(f, name->str, 72), fputc('\n', f);
    fprintf(f, "%-14s %s\n", "architecture", s->arch ? s->arch : "(no general.architecture)");
    size_t plen = s->arch ? strlen(s->arch) : 0;
    for (int64_t i = 0; s->arch && i < ps_gguf_n_kv(g); i++) {
        const char *key = ps_gguf_kv_key(g, i);
        if (strncmp(key, s->arch, plen) || key[plen] != '.') continue;
        fprintf(f, "  %-36s ", key + plen + 1);
        print_value(f, ps_gguf_kv_value(g, i));
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
    fprintf(f, "%-14s %" PRIu64 " bytes (%s)\n", "tensor bytes", s->total_bytes, human_bytes(a, sizeof a, (double)s->total_bytes));
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

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0 when it is not valid
 * (overlong forms, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_len(const unsigned char *p, size_t n) {
    if (p[0] < 0x80) return 1;
    size_t len = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (!len || len > n || p[0] > 0xf4) return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (len == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0;
    if (len == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) return 0;
    return len;
}

/* A JSON string literal (quotes included) for the bytes of s, malloc'd: control characters
 * escaped, bytes that are not valid UTF-8 replaced by U+FFFD. NULL when out of memory. */
static char *json_quote(const char *s, size_t n) {
    if (n > (SIZE_MAX - 3) / 6) return NULL;
    char *out = malloc(n * 6 + 3), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(p + i, n - i);
        if (k == 0) {
            o += sprintf(o, "\\ufffd");
            i++;
        } else if (k > 1) {
            memcpy(o, p + i, k), o += k, i += k;
        } else {
            unsigned char c = p[i++];
            if (c == '"' || c == '\\') *o++ = '\\', *o++ = (char)c;
            else if (c == '\n') *o++ = '\\', *o++ = 'n';
            else if (c == '\t') *o++ = '\\', *o++ = 't';
            else if (c < 0x20 || c == 0x7f) o += sprintf(o, "\\u%04x", c);
            else *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

/* A JSON string node for n bytes (see json_quote); NULL when out of memory. */
static cJSON *json_raw_str(const char *s, size_t n) {
    char *q = json_quote(s, n);
    cJSON *j = q ? cJSON_CreateRaw(q) : NULL;
    free(q);
    return j;
}

/* Integers printed exactly (cJSON numbers are doubles, which lose 64-bit values). */
static cJSON *json_u64(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

static cJSON *json_i64(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

/* Floats printed with 17 digits: the exact double (for F32, the float widened), so that
 * a reader gets the stored value back bit for bit. NaN and infinities become strings. */
static cJSON *json_f64(double v) {
    char buf[40];
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

/* Adds item to obj under key (sanitized to valid UTF-8); frees item and returns false if
 * either is missing. */
static bool json_put(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return false;
    char *k = strdup(key);
    if (!k) {
        cJSON_Delete(item);
        return false;
    }
    for (size_t i = 0, n = strlen(k); i < n;) {
        size_t len = utf8_len((unsigned char *)k + i, n - i);
        if (!len) k[i++] = '?';
        else i += len;
    }
    cJSON_AddItemToObject(obj, k, item);
    free(k);
    return true;
}

/* Appends item to arr; false when item is NULL (out of memory). */
static bool json_push(cJSON *arr, cJSON *item) {
    if (!item) return false;
    cJSON_AddItemToArray(arr, item);
    return true;
}

/* A metadata value as JSON: scalars as numbers, bools and strings; arrays of at most
 * JSON_ARRAY_MAX elements in full, longer ones as {"type": elem type, "n": count}. */
static cJSON *json_value(const ps_gguf_value *v) {
    switch (v->type) {
    case PS_GGUF_U8: case PS_GGUF_U16: case PS_GGUF_U32: case PS_GGUF_U64: return json_u64(v->u64);
    case PS_GGUF_I8: case PS_GGUF_I16: case PS_GGUF_I32: case PS_GGUF_I64: return json_i64(v->i64);
    case PS_GGUF_F32: case PS_GGUF_F64: return json_f64(v->f64);
    case PS_GGUF_BOOL: return cJSON_CreateBool(v->b);
    case PS_GGUF_STRING: return json_raw_str(v->str.data, (size_t)v->str.len);
    default: break;
    }
    if (v->arr.n > JSON_ARRAY_MAX) {
        cJSON *o = cJSON_CreateObject();
        if (o && json_put(o, "type", cJSON_CreateString(ps_gguf_vtype_name(v->arr.type))) &&
            json_put(o, "n", json_u64(v->arr.n)))
            return o;
        cJSON_Delete(o);
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    for (uint64_t i = 0; a && i < v->arr.n; i++) {
        ps_gguf_value e = elem_at(v, i);
        if (!json_push(a, json_value(&e))) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Every <arch>.* key without its prefix, plus vocab_size when it comes from the token list. */
static cJSON *json_hparams(const ps_gguf *g, const stats *s) {
    cJSON *o = cJSON_CreateObject();
    size_t plen = s->arch ? strlen(s->arch) : 0;
    for (int64_t i = 0; o && s->arch && i < ps_gguf_n_kv(g); i++) {
        const char *key = ps_gguf_kv_key(g, i);
        if (strncmp(key, s->arch, plen) || key[plen] != '.') continue;
        if (!json_put(o, key + plen + 1, json_value(ps_gguf_kv_value(g, i)))) goto err;
    }
    const char *from = NULL;
    int64_t nv = vocab_size(g, s->arch, &from);
    if (o && nv >= 0 && from && strcmp(from, "vocab_size") && !json_put(o, "vocab_size", json_i64(nv))) goto err;
    return o;
err:
    cJSON_Delete(o);
    return NULL;
}

/* Tokenizer summary: model, pre, vocab_size, n_merges, special token ids, chat_template. */
static cJSON *json_tokenizer(const ps_gguf *g, const char *arch) {
    static const struct { const char *key, *name; } ids[] = {
        {"tokenizer.ggml.bos_token_id", "bos_token_id"},         {"tokenizer.ggml.eos_token_id", "eos_token_id"},
        {"tokenizer.ggml.unknown_token_id", "unknown_token_id"}, {"tokenizer.ggml.padding_token_id", "padding_token_id"},
    };
    cJSON *o = cJSON_CreateObject();
    ps_gguf_str str;
    int64_t id;
    const char *from;
    if (!o) return NULL;
    bool ok = true;
    if (ps_gguf_get_str(g, "tokenizer.ggml.model", &str, NULL, 0) == PS_OK)
        ok = ok && json_put(o, "model", json_raw_str(str.data, (size_t)str.len));
    if (ps_gguf_get_str(g, "tokenizer.ggml.pre", &str, NULL, 0) == PS_OK)
        ok = ok && json_put(o, "pre", json_raw_str(str.data, (size_t)str.len));
    int64_t nv = vocab_size(g, arch, &from);
    if (nv >= 0) ok = ok && json_put(o, "vocab_size", json_i64(nv));
    const ps_gguf_value *m = ps_gguf_get(g, "tokenizer.ggml.merges");
    if (m && m->type == PS_GGUF_ARRAY) ok = ok && json_put(o, "n_merges", json_u64(m->arr.n));
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ps_gguf_get_i64(g, ids[i].key, &id, NULL, 0) == PS_OK) ok = ok && json_put(o, ids[i].name, json_i64(id));
    ok = ok && json_put(o, "chat_template", cJSON_CreateBool(ps_gguf_get(g, "tokenizer.chat_template") != NULL));
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* Adds an empty object or array under key; NULL (and nothing added) when out of memory. */
static cJSON *json_child(cJSON *obj, const char *key, bool array) {
    cJSON *c = array ? cJSON_CreateArray() : cJSON_CreateObject();
    return c && json_put(obj, key, c) ? c : NULL;
}

/* Layer summary: count, min/max/mean bytes, and one entry per layer. */
static cJSON *json_layers(const stats *s) {
    uint64_t min = 0, max = 0;
    double mean = 0;
    int64_t tmin, tmax;
    cJSON *o = cJSON_CreateObject();
    if (s->n_layers) layer_range(s, &min, &max, &mean, &tmin, &tmax);
    bool ok = o && json_put(o, "count", json_i64(s->n_layers)) && json_put(o, "min_bytes", json_u64(min)) &&
              json_put(o, "max_bytes", json_u64(max)) && json_put(o, "mean_bytes", json_f64(mean));
    cJSON *per = ok ? json_child(o, "per_layer", true) : NULL;
    ok = per != NULL;
    for (int64_t i = 0; ok && i < s->n_layers; i++) {
        cJSON *l = cJSON_CreateObject();
        ok = json_push(per, l) && json_put(l, "index", json_i64(s->layers[i].index)) &&
             json_put(l, "n_tensors", json_i64(s->layers[i].tensors)) && json_put(l, "bytes", json_u64(s->layers[i].bytes));
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* One tensor: name, type, shape, offset in the data section and in the file, bytes. */
static cJSON *json_tensor(const ps_gguf *g, const ps_gguf_tensor *t) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && json_put(o, "name", json_raw_str(t->name, strlen(t->name))) &&
              json_put(o, "type", cJSON_CreateString(ps_type_name(t->type))) && json_put(o, "type_id", json_u64(t->type));
    cJSON *shape = ok ? json_child(o, "shape", true) : NULL;
    ok = shape != NULL;
    for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = json_push(shape, json_i64(t->ne[d]));
    if (ok && json_put(o, "offset", json_u64(t->offset)) &&
        json_put(o, "file_offset", json_u64(ps_gguf_data_offset(g) + t->offset)) && json_put(o, "bytes", json_u64(t->nbytes)))
        return o;
    cJSON_Delete(o);
    return NULL;
}

/* The whole JSON report (caller deletes it), or NULL when out of memory. Children are
 * attached to the root as soon as they are made, so deleting the root frees everything. */
static cJSON *json_report(const char *path, const ps_gguf *g, const stats *s) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && json_put(o, "file", json_raw_str(path, strlen(path))) &&
              json_put(o, "file_size", json_u64(ps_gguf_file_size(g))) && json_put(o, "version", json_u64(ps_gguf_version(g))) &&
              json_put(o, "alignment", json_u64(ps_gguf_alignment(g))) &&
              json_put(o, "data_offset", json_u64(ps_gguf_data_offset(g))) &&
              json_put(o, "architecture", s->arch ? json_raw_str(s->arch, strlen(s->arch)) : cJSON_CreateNull()) &&
              json_put(o, "hparams", json_hparams(g, s)) && json_put(o, "tokenizer", json_tokenizer(g, s->arch)) &&
              json_put(o, "n_tensors", json_i64(ps_gguf_n_tensors(g)));
    cJSON *types = ok ? json_child(o, "tensor_types", false) : NULL;
    cJSON *tbytes = types ? json_child(o, "tensor_type_bytes", false) : NULL;
    ok = tbytes && json_put(o, "total_bytes", json_u64(s->total_bytes)) && json_put(o, "layers", json_layers(s));
    for (int t = 0; ok && t < MAX_TYPES; t++)
        if (s->type_count[t])
            ok = json_put(types, ps_type_name((uint32_t)t), json_i64(s->type_count[t])) &&
                 json_put(tbytes, ps_type_name((uint32_t)t), json_u64(s->type_bytes[t]));
    cJSON *non_layer = ok ? json_child(o, "non_layer_tensors", true) : NULL;
    ok = non_layer && json_put(o, "non_layer_bytes", json_u64(s->non_layer_bytes));
    for (int64_t i = 0; ok && i < s->n_non_layer; i++) {
        const char *name = ps_gguf_tensor_at(g, s->non_layer[i])->name;
        ok = json_push(non_layer, json_raw_str(name, strlen(name)));
    }
    cJSON *meta = ok && json_put(o, "n_kv", json_i64(ps_gguf_n_kv(g))) ? json_child(o, "metadata", false) : NULL;
    ok = meta != NULL;
    for (int64_t i = 0; ok && i < ps_gguf_n_kv(g); i++) ok = json_put(meta, ps_gguf_kv_key(g, i), json_value(ps_gguf_kv_value(g, i)));
    cJSON *tensors = ok ? json_child(o, "tensors", true) : NULL;
    ok = tensors != NULL;
    for (int64_t i = 0; ok && i < ps_gguf_n_tensors(g); i++) ok = json_push(tensors, json_tensor(g, ps_gguf_tensor_at(g, i)));
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
    if (!ti || !ti->supported) return fail("tensor '%s' has type %s, which cannot be dequantized", name, ps_type_name(t->type));
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t row_bytes = ps_row_bytes(t->type, ne0);
    if ((uint64_t)ne0 > SIZE_MAX / sizeof(float)) return fail("tensor '%s': rows of %" PRId64 " values are too long", name, ne0);
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
        if (s) rc = fail("cannot dequantize tensor '%s' (%s): %s", name, ps_type_name(t->type), ps_strerror(s));
        else if (fwrite(row, sizeof *row, (size_t)ne0, f) != (size_t)ne0)
            rc = fail("cannot write '%s': %s", out_path, strerror(errno));
    }
    if (fclose(f) != 0 && !rc) rc = fail("cannot write '%s': %s", out_path, strerror(errno));
    free(row);
    if (rc) {
        unlink(out_path);
        return rc;
    }
    fprintf(stderr, "pipeshard inspect: wrote %" PRId64 " float32 values of '%s' (%s ", ne0 * rows, name, ps_type_name(t->type));
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
            return usage_error("unknown option '%s'", a);
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
            if (text) printf("%s\n", text);
            else rc = fail("out of memory while building the JSON report");
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
