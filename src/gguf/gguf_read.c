/* gguf_read.c - GGUF v2/v3 reader: parsing and validation of an image in memory, the
 * metadata and tensor lookups, and the typed, validated getters.
 *
 * The reader validates the whole image in ps_gguf_parse before handing anything out: every
 * count is checked against the bytes left before anything is allocated for it, so a lying
 * header cannot make us allocate more than a small multiple of the file size. How the file
 * gets into memory is gguf_load.c's business; the layout is described in gguf_internal.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../tensor/types.h"
#include "gguf_internal.h"

#define GGUF_HEADER_BYTES     24u /* magic, version, n_tensors, n_kv */
#define GGUF_MIN_KV_BYTES     14u /* u64 key len, >= 1 key byte, u32 type, >= 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 33u /* u64 name len, >= 1 name byte, u32 n_dims, u64 ne, u32 type, u64 offset */
#define GGUF_NAME_SHOW        80  /* longest name quoted in an error message */

/* ---------------------------------------------------------------------------------------------
 * Value types */

static const struct {
    const char *name;
    size_t size; /* bytes of one element on disk; 0 for STRING and ARRAY */
} vtypes[PS_GGUF_VTYPE_COUNT] = {
    [PS_GGUF_U8] = {"UINT8", 1},    [PS_GGUF_I8] = {"INT8", 1},    [PS_GGUF_U16] = {"UINT16", 2},
    [PS_GGUF_I16] = {"INT16", 2},   [PS_GGUF_U32] = {"UINT32", 4}, [PS_GGUF_I32] = {"INT32", 4},
    [PS_GGUF_F32] = {"FLOAT32", 4}, [PS_GGUF_BOOL] = {"BOOL", 1},  [PS_GGUF_STRING] = {"STRING", 0},
    [PS_GGUF_ARRAY] = {"ARRAY", 0}, [PS_GGUF_U64] = {"UINT64", 8}, [PS_GGUF_I64] = {"INT64", 8},
    [PS_GGUF_F64] = {"FLOAT64", 8},
};

/* The GGUF spelling of a value type ("UINT32", "STRING", ...); "invalid" for numbers
 * outside the enum. Static string, never NULL. */
const char *ps_gguf_vtype_name(ps_gguf_vtype t) {
    return (unsigned)t < PS_GGUF_VTYPE_COUNT ? vtypes[t].name : "invalid";
}

/* Unsigned integer value types (BOOL is not an integer here). */
static bool vtype_is_uint(uint32_t t) {
    return t == PS_GGUF_U8 || t == PS_GGUF_U16 || t == PS_GGUF_U32 || t == PS_GGUF_U64;
}

/* Signed integer value types. */
static bool vtype_is_sint(uint32_t t) {
    return t == PS_GGUF_I8 || t == PS_GGUF_I16 || t == PS_GGUF_I32 || t == PS_GGUF_I64;
}

/* Float value types. */
static bool vtype_is_float(uint32_t t) { return t == PS_GGUF_F32 || t == PS_GGUF_F64; }

/* Numeric and bool types: a fixed number of bytes per element. */
static bool vtype_is_fixed(uint32_t t) { return t < PS_GGUF_VTYPE_COUNT && vtypes[t].size > 0; }

/* Bytes of one element on disk: see gguf_internal.h. */
size_t ps_gguf_vtype_size(uint32_t t) { return t < PS_GGUF_VTYPE_COUNT ? vtypes[t].size : 0; }

/* Reads one fixed-size element of type t at p (little-endian, maybe unaligned) into v. */
static void scalar_load(ps_gguf_value *v, uint32_t t, const uint8_t *p) {
    v->type = (ps_gguf_vtype)t;
    switch (t) {
    case PS_GGUF_U8: v->u64 = p[0]; break;
    case PS_GGUF_I8: v->i64 = (int8_t)p[0]; break;
    case PS_GGUF_BOOL: v->b = p[0] != 0; break;
    case PS_GGUF_U16: {
        uint16_t x;
        memcpy(&x, p, 2);
        v->u64 = x;
        break;
    }
    case PS_GGUF_I16: {
        int16_t x;
        memcpy(&x, p, 2);
        v->i64 = x;
        break;
    }
    case PS_GGUF_U32: {
        uint32_t x;
        memcpy(&x, p, 4);
        v->u64 = x;
        break;
    }
    case PS_GGUF_I32: {
        int32_t x;
        memcpy(&x, p, 4);
        v->i64 = x;
        break;
    }
    case PS_GGUF_F32: {
        float x;
        memcpy(&x, p, 4);
        v->f64 = x;
        break;
    }
    case PS_GGUF_U64: memcpy(&v->u64, p, 8); break;
    case PS_GGUF_I64: memcpy(&v->i64, p, 8); break;
    case PS_GGUF_F64: memcpy(&v->f64, p, 8); break;
    default: break;
    }
}

/* Copies a name into buf for an error message: at most GGUF_NAME_SHOW bytes, anything
 * that is not printable ASCII shown as '?', "..." appended when cut. */
static const char *show_name(char *buf, size_t bufsize, const char *s, size_t len) {
    size_t n = 0, max = bufsize - 4;
    if (max > GGUF_NAME_SHOW) max = GGUF_NAME_SHOW;
    for (; n < len && n < max; n++) buf[n] = (s[n] >= 0x20 && s[n] < 0x7f) ? s[n] : '?';
    if (n < len) buf[n++] = '.', buf[n++] = '.', buf[n++] = '.';
    buf[n] = 0;
    return buf;
}

/* FNV-1a over a NUL-terminated string: the hash of the key and tensor-name tables. */
static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* ---------------------------------------------------------------------------------------------
 * Arena: the reader's tables (keys, names, string and nested-array tables) live in a few
 * chunks freed together by ps_gguf_close. */

#define ARENA_CHUNK (64 * 1024)

typedef struct arena_chunk arena_chunk;
struct arena_chunk {
    arena_chunk *next;
    size_t used, cap;
    max_align_t mem[];
};

/* Zeroed memory of n bytes (suitably aligned for any type) owned by the arena, or NULL
 * when out of memory. Chunks come from calloc and are never reused, so they are already
 * zero; a large block's untouched pages cost nothing until used. */
static void *arena_alloc(arena_chunk **head, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0) n = sizeof(max_align_t);
    arena_chunk *c = *head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = ps_calloc(1, sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        if (*head && n > ARENA_CHUNK) { /* a big block: keep the current chunk in front */
            c->next = (*head)->next;
            (*head)->next = c;
        } else {
            c->next = *head;
            *head = c;
        }
    }
    void *p = (char *)c->mem + c->used;
    c->used += n;
    return p;
}

/* Frees every chunk of an arena; NULL is a no-op. */
static void arena_free(arena_chunk *c) {
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Parser */

/* Parsing state: a cursor over the file and the item being read, for error messages.
 * `reserve` is the number of bytes still owed to items declared but not yet read (the
 * rest of an enclosing array, the remaining keys and tensor infos): a count is only
 * believed if its elements fit in the bytes left after that reserve, which keeps
 * everything allocated for counts within a small multiple of the file size. */
typedef struct {
    ps_gguf *g;
    size_t pos;
    size_t reserve;
    char what[GGUF_NAME_SHOW + 32]; /* "key 'general.name'", "tensor #3", ... */
    char *err;
    size_t errlen;
} parser;

/* Bytes of the file after the cursor. */
static size_t left(const parser *ps) { return ps->g->size - ps->pos; }

/* Fails with PS_ERR_FORMAT unless n more bytes are in the file; `thing` names the field. */
static ps_status need(parser *ps, size_t n, const char *thing) {
    if (n <= left(ps)) return PS_OK;
    return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: %s at offset %zu runs past the end of the file (%zu bytes)",
                   ps->what, thing, ps->pos, ps->g->size);
}

/* Reads a little-endian u32 at the cursor, or fails naming `thing`. */
static ps_status rd_u32(parser *ps, uint32_t *out, const char *thing) {
    ps_status s = need(ps, 4, thing);
    if (s) return s;
    memcpy(out, ps->g->base + ps->pos, 4);
    ps->pos += 4;
    return PS_OK;
}

/* Reads a little-endian u64 at the cursor, or fails naming `thing`. */
static ps_status rd_u64(parser *ps, uint64_t *out, const char *thing) {
    ps_status s = need(ps, 8, thing);
    if (s) return s;
    memcpy(out, ps->g->base + ps->pos, 8);
    ps->pos += 8;
    return PS_OK;
}

/* Reads a string (u64 length, bytes) whose bytes stay in the file. */
static ps_status rd_str(parser *ps, ps_gguf_str *out, const char *thing) {
    uint64_t len;
    size_t at = ps->pos;
    ps_status s = rd_u64(ps, &len, thing);
    if (s) return s;
    if (len > left(ps))
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "%s: %s of %" PRIu64 " bytes at offset %zu runs past the end of the file (%zu bytes)", ps->what,
                       thing, len, at, ps->g->size);
    out->len = len;
    out->data = (const char *)ps->g->base + ps->pos;
    ps->pos += (size_t)len;
    return PS_OK;
}

/* Reads a key or tensor name and returns a NUL-terminated arena copy in *out. Names must be
 * nonempty and free of NUL bytes (they are used as C strings). */
static ps_status rd_name(parser *ps, const char **out, const char *thing) {
    ps_gguf_str s = {0};
    ps_status st = rd_str(ps, &s, thing);
    if (st) return st;
    if (s.len == 0) return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: empty %s", ps->what, thing);
    if (memchr(s.data, 0, s.len))
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: %s contains a NUL byte", ps->what, thing);
    char *c = arena_alloc(&ps->g->arena, s.len + 1);
    if (!c) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "%s: out of memory", ps->what);
    memcpy(c, s.data, s.len);
    *out = c;
    return PS_OK;
}

/* Fails unless n elements of at least `min_size` bytes each fit in the rest of the file
 * (less the bytes reserved for items declared after them). */
static ps_status check_count(parser *ps, uint64_t n, size_t min_size, uint32_t elem, size_t at) {
    size_t avail = left(ps) > ps->reserve ? left(ps) - ps->reserve : 0;
    if (n <= avail / min_size) return PS_OK;
    return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                   "%s: array of %" PRIu64 " %s elements at offset %zu does not fit in the remaining %zu bytes "
                   "of the file",
                   ps->what, n, ps_gguf_vtype_name((ps_gguf_vtype)elem), at, avail);
}

static ps_status parse_value(parser *ps, uint32_t type, ps_gguf_value *v, int depth);

/* Reads the body of an array value (element type, count, elements) into v. depth is the
 * nesting level of this array (1 for a top-level array). */
static ps_status parse_array(parser *ps, ps_gguf_value *v, int depth) {
    uint32_t elem;
    uint64_t n;
    size_t at = ps->pos;
    ps_status s;
    if (depth > GGUF_MAX_DEPTH)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: arrays nested more than %d levels deep (at offset %zu)",
                       ps->what, GGUF_MAX_DEPTH, at);
    if ((s = rd_u32(ps, &elem, "array element type")) || (s = rd_u64(ps, &n, "array length"))) return s;
    if (elem >= PS_GGUF_VTYPE_COUNT)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: unknown array element type %" PRIu32 " at offset %zu",
                       ps->what, elem, at);
    v->type = PS_GGUF_ARRAY;
    v->arr.type = (ps_gguf_vtype)elem;
    v->arr.n = n;
    if (vtype_is_fixed(elem)) {
        size_t esz = vtypes[elem].size;
        if ((s = check_count(ps, n, esz, elem, at))) return s;
        const uint8_t *p = ps->g->base + ps->pos;
        if (elem == PS_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1)
                    return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                                   "%s: bool array element %" PRIu64 " is %u, not 0 or 1", ps->what, i, p[i]);
        v->arr.data = p;
        ps->pos += (size_t)n * esz;
        return PS_OK;
    }
    /* strings take at least their 8-byte length, nested arrays their 12-byte type and count */
    if ((s = check_count(ps, n, elem == PS_GGUF_STRING ? 8 : 12, elem, at))) return s;
    if (n == 0) return PS_OK;
    if (elem == PS_GGUF_STRING) {
        ps_gguf_str *strs = arena_alloc(&ps->g->arena, (size_t)n * sizeof *strs);
        if (!strs) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "%s: out of memory", ps->what);
        for (uint64_t i = 0; i < n; i++)
            if ((s = rd_str(ps, &strs[i], "array string"))) return s;
        v->arr.strs = strs;
        return PS_OK;
    }
    ps_gguf_value *elems = arena_alloc(&ps->g->arena, (size_t)n * sizeof *elems);
    if (!elems) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "%s: out of memory", ps->what);
    size_t outer = ps->reserve;
    for (uint64_t i = 0; i < n; i++) {
        ps->reserve = outer + (size_t)(n - 1 - i) * 12; /* n * 12 fits in the file: no overflow */
        if ((s = parse_value(ps, PS_GGUF_ARRAY, &elems[i], depth))) return s;
    }
    ps->reserve = outer;
    v->arr.elems = elems;
    return PS_OK;
}

/* Reads one value of the given type (its type tag already read). depth counts the arrays
 * around it. */
static ps_status parse_value(parser *ps, uint32_t type, ps_gguf_value *v, int depth) {
    if (type >= PS_GGUF_VTYPE_COUNT)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: unknown value type %" PRIu32 " at offset %zu", ps->what,
                       type, ps->pos - 4);
    if (type == PS_GGUF_ARRAY) return parse_array(ps, v, depth + 1);
    v->type = (ps_gguf_vtype)type;
    if (type == PS_GGUF_STRING) return rd_str(ps, &v->str, "string value");
    ps_status s = need(ps, vtypes[type].size, "value");
    if (s) return s;
    const uint8_t *p = ps->g->base + ps->pos;
    if (type == PS_GGUF_BOOL && p[0] > 1)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: bool value at offset %zu is %u, not 0 or 1", ps->what,
                       ps->pos, p[0]);
    scalar_load(v, type, p);
    ps->pos += vtypes[type].size;
    return PS_OK;
}

/* Inserts entry idx named `name` into an open-addressing table; returns the index of an
 * earlier entry with the same name, or -1. name_of(g, i) gives entry i's name. */
static int64_t table_insert(int64_t *table, size_t cap, const char *name, int64_t idx,
                            const char *(*name_of)(const ps_gguf *, int64_t), const ps_gguf *g) {
    size_t mask = cap - 1;
    for (size_t h = (size_t)hash_str(name) & mask;; h = (h + 1) & mask) {
        if (!table[h]) {
            table[h] = idx + 1;
            return -1;
        }
        if (!strcmp(name_of(g, table[h] - 1), name)) return table[h] - 1;
    }
}

/* Index of the entry named `name` in a table, or -1. */
static int64_t table_find(const int64_t *table, size_t cap, const char *name,
                          const char *(*name_of)(const ps_gguf *, int64_t), const ps_gguf *g) {
    if (!cap) return -1;
    size_t mask = cap - 1;
    for (size_t h = (size_t)hash_str(name) & mask; table[h]; h = (h + 1) & mask)
        if (!strcmp(name_of(g, table[h] - 1), name)) return table[h] - 1;
    return -1;
}

/* Entry i's name for table_insert and table_find: a metadata key, a tensor name. */
static const char *key_of(const ps_gguf *g, int64_t i) { return g->keys[i]; }
static const char *tensor_name_of(const ps_gguf *g, int64_t i) { return g->tensors[i].name; }

/* A zeroed table with room for n entries at most half full, in the arena; *cap gets its size. */
static int64_t *table_new(ps_gguf *g, int64_t n, size_t *cap) {
    size_t c = 16;
    while (c < (size_t)n * 2) c *= 2;
    *cap = c;
    return arena_alloc(&g->arena, c * sizeof(int64_t));
}

/* Header: magic, version, counts. Counts are checked against the file size so that the
 * tables allocated for them stay proportional to the file. */
static ps_status parse_header(parser *ps, uint64_t *n_tensors, uint64_t *n_kv) {
    ps_gguf *g = ps->g;
    snprintf(ps->what, sizeof ps->what, "header");
    if (g->size < 4)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "not a GGUF file: only %zu bytes long", g->size);
    if (memcmp(g->base, GGUF_MAGIC, 4)) {
        char m[16];
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "not a GGUF file: magic is '%s', expected 'GGUF'",
                       show_name(m, sizeof m, (const char *)g->base, 4));
    }
    if (g->size < GGUF_HEADER_BYTES)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "truncated header: the file is %zu bytes, a GGUF header needs %u", g->size, GGUF_HEADER_BYTES);
    ps->pos = 4;
    uint32_t v = 0;
    rd_u32(ps, &v, "version");
    uint32_t swapped = __builtin_bswap32(v);
    if ((v & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
        return ps_errf(
            ps->err, ps->errlen, PS_ERR_UNSUPPORTED,
            "big-endian GGUF file (version %" PRIu32 " byte-swapped): only little-endian files are supported", swapped);
    if (v == 1)
        return ps_errf(ps->err, ps->errlen, PS_ERR_UNSUPPORTED,
                       "GGUF version 1 is not supported (it has 32-bit counts); convert the file to version 3");
    if (v != 2 && v != 3)
        return ps_errf(ps->err, ps->errlen, PS_ERR_UNSUPPORTED,
                       "unknown GGUF version %" PRIu32 " (only versions 2 and 3 are supported)", v);
    g->version = v;
    rd_u64(ps, n_tensors, "tensor count");
    rd_u64(ps, n_kv, "metadata key count");
    size_t rest = left(ps);
    if (*n_kv > rest / GGUF_MIN_KV_BYTES)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "header declares %" PRIu64 " metadata keys, but the file (%zu bytes) can hold at most %zu",
                       *n_kv, g->size, rest / GGUF_MIN_KV_BYTES);
    if (*n_tensors > rest / GGUF_MIN_TENSOR_BYTES)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "header declares %" PRIu64 " tensors, but the file (%zu bytes) can hold at most %zu", *n_tensors,
                       g->size, rest / GGUF_MIN_TENSOR_BYTES);
    if (*n_kv * GGUF_MIN_KV_BYTES + *n_tensors * GGUF_MIN_TENSOR_BYTES > rest)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "header declares %" PRIu64 " metadata keys and %" PRIu64
                       " tensors, more than the file (%zu bytes) can hold",
                       *n_kv, *n_tensors, g->size);
    return PS_OK;
}

/* Metadata: every key/value pair, then the duplicate check and general.alignment. */
static ps_status parse_metadata(parser *ps, uint64_t n_kv, uint64_t n_tensors) {
    ps_gguf *g = ps->g;
    ps_status s;
    char shown[GGUF_NAME_SHOW + 4];
    size_t n_tensors_reserve = (size_t)n_tensors * GGUF_MIN_TENSOR_BYTES; /* checked by parse_header */
    g->keys = arena_alloc(&g->arena, (size_t)n_kv * sizeof *g->keys);
    g->values = arena_alloc(&g->arena, (size_t)n_kv * sizeof *g->values);
    g->kv_table = table_new(g, (int64_t)n_kv, &g->kv_cap);
    if (!g->keys || !g->values || !g->kv_table) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n_kv; i++) {
        uint32_t type;
        snprintf(ps->what, sizeof ps->what, "metadata key #%" PRIu64, i);
        if ((s = rd_name(ps, &g->keys[i], "key"))) return s;
        snprintf(ps->what, sizeof ps->what, "key '%s'", show_name(shown, sizeof shown, g->keys[i], strlen(g->keys[i])));
        if ((s = rd_u32(ps, &type, "value type"))) return s;
        ps->reserve = (size_t)(n_kv - 1 - i) * GGUF_MIN_KV_BYTES + n_tensors_reserve;
        if ((s = parse_value(ps, type, &g->values[i], 0))) return s;
        g->n_kv = (int64_t)i + 1;
        int64_t dup = table_insert(g->kv_table, g->kv_cap, g->keys[i], (int64_t)i, key_of, g);
        if (dup >= 0)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "duplicate metadata key '%s' (entries #%" PRId64 " and #%" PRIu64 ")", shown, dup, i);
    }
    ps->reserve = 0;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const ps_gguf_value *a = ps_gguf_get(g, "general.alignment");
    if (a) {
        if (a->type != PS_GGUF_U32)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "general.alignment has type %s, expected UINT32",
                           ps_gguf_vtype_name(a->type));
        if (a->u64 == 0 || (a->u64 & (a->u64 - 1)))
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "general.alignment is %" PRIu64 ", must be a nonzero power of two", a->u64);
        g->alignment = (uint32_t)a->u64;
    }
    return PS_OK;
}

/* One tensor info: name, shape, type, offset; sets size fields, checks the shape and type. */
static ps_status parse_tensor_info(parser *ps, ps_gguf_tensor *t, uint64_t i) {
    ps_status s;
    char shown[GGUF_NAME_SHOW + 4];
    snprintf(ps->what, sizeof ps->what, "tensor #%" PRIu64, i);
    if ((s = rd_name(ps, &t->name, "tensor name"))) return s;
    snprintf(ps->what, sizeof ps->what, "tensor '%s'", show_name(shown, sizeof shown, t->name, strlen(t->name)));
    if ((s = rd_u32(ps, &t->n_dims, "n_dims"))) return s;
    if (t->n_dims < 1 || t->n_dims > 4)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: n_dims %" PRIu32 " is outside 1..4", ps->what,
                       t->n_dims);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < 4; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && (s = rd_u64(ps, &ne, "dimension"))) return s;
        if (ne == 0 || ne > INT64_MAX)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "%s: dimension %" PRIu32 " is %" PRIu64 ", must be 1..2^63-1", ps->what, d, ne);
        if (nel > (uint64_t)INT64_MAX / ne)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: element count overflows (more than 2^63 elements)",
                           ps->what);
        nel *= ne;
        t->ne[d] = (int64_t)ne;
    }
    if ((s = rd_u32(ps, &t->type, "tensor type")) || (s = rd_u64(ps, &t->offset, "tensor offset"))) return s;
    const ps_type_info *ti = ps_type_get(t->type);
    if (!ti) return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: unknown tensor type %" PRIu32, ps->what, t->type);
    if (!ti->block_size || !ti->type_size)
        return ps_errf(ps->err, ps->errlen, PS_ERR_UNSUPPORTED, "%s: tensor type %s has no known block layout",
                       ps->what, ti->name);
    if (t->ne[0] % ti->block_size)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                       "%s: row length %" PRId64 " is not a multiple of the %s block size %" PRIu32, ps->what, t->ne[0],
                       ti->name, ti->block_size);
    size_t row = ps_row_bytes(t->type, t->ne[0]);
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3]; /* <= nel: no overflow */
    if (!row || rows > SIZE_MAX / row)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: data size overflows (%" PRIu64 " rows of %zu bytes)",
                       ps->what, rows, row);
    t->nbytes = row * (size_t)rows;
    return PS_OK;
}

typedef struct {
    uint64_t offset;
    size_t nbytes;
    int64_t index;
} extent;

/* qsort order of extents: by offset. */
static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Data placement: every tensor aligned, inside the file, and no two overlapping. */
static ps_status check_placement(parser *ps) {
    ps_gguf *g = ps->g;
    char a[GGUF_NAME_SHOW + 4], b[GGUF_NAME_SHOW + 4];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        ps_gguf_tensor *t = &g->tensors[i];
        show_name(a, sizeof a, t->name, strlen(t->name));
        if (t->offset % g->alignment)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu32, a, t->offset,
                           g->alignment);
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->nbytes > g->size - g->data_offset - t->offset)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "tensor '%s': data [offset %" PRIu64 ", %zu bytes] runs past the end of the file (%zu "
                           "bytes, data section at %zu)",
                           a, t->offset, t->nbytes, g->size, g->data_offset);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors < 2) return PS_OK;
    extent *ex = ps_malloc((size_t)g->n_tensors * sizeof *ex);
    if (!ex) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_tensors; i++) ex[i] = (extent){g->tensors[i].offset, g->tensors[i].nbytes, i};
    qsort(ex, (size_t)g->n_tensors, sizeof *ex, extent_cmp);
    ps_status s = PS_OK;
    for (int64_t i = 0; i + 1 < g->n_tensors && !s; i++) {
        if (ex[i].offset + ex[i].nbytes <= ex[i + 1].offset) continue;
        const ps_gguf_tensor *t = &g->tensors[ex[i].index], *u = &g->tensors[ex[i + 1].index];
        s = ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                    "tensors '%s' [offset %" PRIu64 ", %zu bytes] and '%s' [offset %" PRIu64 ", %zu bytes] overlap",
                    show_name(a, sizeof a, t->name, strlen(t->name)), t->offset, t->nbytes,
                    show_name(b, sizeof b, u->name, strlen(u->name)), u->offset, u->nbytes);
    }
    free(ex);
    return s;
}

/* Tensor infos, then the data section's start and the placement checks. */
static ps_status parse_tensors(parser *ps, uint64_t n_tensors) {
    ps_gguf *g = ps->g;
    ps_status s;
    char shown[GGUF_NAME_SHOW + 4];
    g->tensors = arena_alloc(&g->arena, (size_t)n_tensors * sizeof *g->tensors);
    g->tensor_table = table_new(g, (int64_t)n_tensors, &g->tensor_cap);
    if (!g->tensors || !g->tensor_table) return ps_errf(ps->err, ps->errlen, PS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((s = parse_tensor_info(ps, &g->tensors[i], i))) return s;
        g->n_tensors = (int64_t)i + 1;
        int64_t dup = table_insert(g->tensor_table, g->tensor_cap, g->tensors[i].name, (int64_t)i, tensor_name_of, g);
        if (dup >= 0)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                           "duplicate tensor name '%s' (tensors #%" PRId64 " and #%" PRIu64 ")",
                           show_name(shown, sizeof shown, g->tensors[i].name, strlen(g->tensors[i].name)), dup, i);
    }
    /* pos <= size, alignment <= 2^31: no overflow in size_t */
    g->data_offset = (ps->pos + g->alignment - 1) / g->alignment * g->alignment;
    return check_placement(ps);
}

/* Validates the file in buf (len bytes) and builds a reader over it: see gguf_internal.h. */
ps_status ps_gguf_parse(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen) {
    ps_status s;
    uint64_t n_tensors = 0, n_kv = 0;
    ps_gguf *g = ps_calloc(1, sizeof *g);
    if (!g) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    g->base = buf;
    g->size = len;
    parser ps = {.g = g, .err = err, .errlen = errlen};
    if ((s = parse_header(&ps, &n_tensors, &n_kv))) goto err;
    if ((s = parse_metadata(&ps, n_kv, n_tensors))) goto err;
    if ((s = parse_tensors(&ps, n_tensors))) goto err;
    *out = g;
    return PS_OK;
err:
    ps_gguf_close(g);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Reader: lifetime and lookups */

/* Frees the reader's tables and unmaps the region the loader recorded (none for a caller's
 * buffer); every pointer it handed out dies here. */
void ps_gguf_close(ps_gguf *g) {
    if (!g) return;
    if (g->region) munmap(g->region, g->region_len);
    arena_free(g->arena);
    free(g);
}

uint32_t ps_gguf_version(const ps_gguf *g) { return g->version; }
uint32_t ps_gguf_alignment(const ps_gguf *g) { return g->alignment; }
size_t ps_gguf_file_size(const ps_gguf *g) { return g->size; }
/* Byte offset in the file where the data section (tensor offset 0) starts. */
size_t ps_gguf_data_offset(const ps_gguf *g) { return g->data_offset; }
int64_t ps_gguf_n_kv(const ps_gguf *g) { return g->n_kv; }
int64_t ps_gguf_n_tensors(const ps_gguf *g) { return g->n_tensors; }

/* Key i (0 <= i < n_kv), or NULL when i is out of range. */
const char *ps_gguf_kv_key(const ps_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv ? g->keys[i] : NULL; }

/* Value i (0 <= i < n_kv), or NULL when i is out of range. */
const ps_gguf_value *ps_gguf_kv_value(const ps_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->values[i] : NULL;
}

/* The value of key, or NULL when absent (or key is NULL). */
const ps_gguf_value *ps_gguf_get(const ps_gguf *g, const char *key) {
    if (!key) return NULL;
    int64_t i = table_find(g->kv_table, g->kv_cap, key, key_of, g);
    return i < 0 ? NULL : &g->values[i];
}

/* Tensor i (0 <= i < n_tensors), or NULL when i is out of range. */
const ps_gguf_tensor *ps_gguf_tensor_at(const ps_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* The tensor called name, or NULL. */
const ps_gguf_tensor *ps_gguf_find_tensor(const ps_gguf *g, const char *name) {
    if (!name) return NULL;
    int64_t i = table_find(g->tensor_table, g->tensor_cap, name, tensor_name_of, g);
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---------------------------------------------------------------------------------------------
 * Typed getters */

/* Looks key up for a typed getter: PS_ERR_NOT_FOUND (with a message) when absent. */
static ps_status lookup(const ps_gguf *g, const char *key, const ps_gguf_value **v, char *err, size_t errlen) {
    *v = ps_gguf_get(g, key);
    if (*v) return PS_OK;
    return ps_errf(err, errlen, PS_ERR_NOT_FOUND, "metadata key '%s' is missing", key ? key : "(null)");
}

/* Magnitude and sign of an integer value; false for types that are not integers. */
static bool int_value(const ps_gguf_value *v, uint64_t *mag, bool *neg) {
    if (vtype_is_uint(v->type)) {
        *mag = v->u64;
        *neg = false;
        return true;
    }
    if (vtype_is_sint(v->type)) {
        *neg = v->i64 < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)v->i64 : (uint64_t)v->i64;
        return true;
    }
    return false;
}

/* Any integer value in 0..UINT32_MAX. */
ps_status ps_gguf_get_u32(const ps_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen) {
    const ps_gguf_value *v;
    uint64_t mag;
    bool neg;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (!int_value(v, &mag, &neg))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected an integer (UINT32)", key,
                       ps_gguf_vtype_name(v->type));
    if (neg || mag > UINT32_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' = %s%" PRIu64 " does not fit in UINT32", key,
                       neg ? "-" : "", mag);
    *out = (uint32_t)mag;
    return PS_OK;
}

/* Any integer value in INT64_MIN..INT64_MAX. */
ps_status ps_gguf_get_i64(const ps_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
    const ps_gguf_value *v;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (vtype_is_sint(v->type)) {
        *out = v->i64;
        return PS_OK;
    }
    if (!vtype_is_uint(v->type))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected an integer (INT64)", key,
                       ps_gguf_vtype_name(v->type));
    if (v->u64 > INT64_MAX)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' = %" PRIu64 " does not fit in INT64", key,
                       v->u64);
    *out = (int64_t)v->u64;
    return PS_OK;
}

/* A FLOAT32 or FLOAT64 value, rounded to float. */
ps_status ps_gguf_get_f32(const ps_gguf *g, const char *key, float *out, char *err, size_t errlen) {
    const ps_gguf_value *v;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (!vtype_is_float(v->type))
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected FLOAT32", key,
                       ps_gguf_vtype_name(v->type));
    *out = (float)v->f64;
    return PS_OK;
}

/* A BOOL value. */
ps_status ps_gguf_get_bool(const ps_gguf *g, const char *key, bool *out, char *err, size_t errlen) {
    const ps_gguf_value *v;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (v->type != PS_GGUF_BOOL)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected BOOL", key,
                       ps_gguf_vtype_name(v->type));
    *out = v->b;
    return PS_OK;
}

/* A STRING value; out points into the mapping. */
ps_status ps_gguf_get_str(const ps_gguf *g, const char *key, ps_gguf_str *out, char *err, size_t errlen) {
    const ps_gguf_value *v;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (v->type != PS_GGUF_STRING)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected STRING", key,
                       ps_gguf_vtype_name(v->type));
    *out = v->str;
    return PS_OK;
}

/* An ARRAY value whose elements have type elem. */
ps_status ps_gguf_get_arr(const ps_gguf *g, const char *key, ps_gguf_vtype elem, const ps_gguf_value **out, char *err,
                          size_t errlen) {
    const ps_gguf_value *v;
    ps_status s = lookup(g, key, &v, err, errlen);
    if (s) return s;
    if (v->type != PS_GGUF_ARRAY)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' has type %s, expected an array of %s", key,
                       ps_gguf_vtype_name(v->type), ps_gguf_vtype_name(elem));
    if (v->arr.type != elem)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' is an array of %s, expected an array of %s", key,
                       ps_gguf_vtype_name(v->arr.type), ps_gguf_vtype_name(elem));
    *out = v;
    return PS_OK;
}

/* True when the len bytes of s equal the NUL-terminated c. */
bool ps_gguf_str_eq(ps_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || !memcmp(s.data, c, n));
}

/* Element i of a numeric array as an integer; 0 for element types that are not numeric. */
int64_t ps_gguf_arr_int(const ps_gguf_value *arr, uint64_t i) {
    ps_gguf_value e;
    uint32_t t = arr->arr.type;
    if (!vtype_is_fixed(t)) return 0;
    scalar_load(&e, t, (const uint8_t *)arr->arr.data + i * vtypes[t].size);
    if (t == PS_GGUF_BOOL) return e.b;
    if (vtype_is_float(t)) return (int64_t)e.f64;
    return vtype_is_sint(t) ? e.i64 : (int64_t)e.u64;
}

/* Element i of a numeric array as a double; 0 for element types that are not numeric. */
double ps_gguf_arr_float(const ps_gguf_value *arr, uint64_t i) {
    ps_gguf_value e;
    uint32_t t = arr->arr.type;
    if (!vtype_is_fixed(t)) return 0;
    scalar_load(&e, t, (const uint8_t *)arr->arr.data + i * vtypes[t].size);
    if (t == PS_GGUF_BOOL) return e.b;
    if (vtype_is_float(t)) return e.f64;
    return vtype_is_sint(t) ? (double)e.i64 : (double)e.u64;
}

/* Element i of an array as a standalone value (see gguf.h); numeric elements are widened as
 * the reader widens scalars. */
ps_gguf_value ps_gguf_arr_elem(const ps_gguf_value *arr, uint64_t i) {
    ps_gguf_value e = {.type = arr->arr.type};
    switch (arr->arr.type) {
    case PS_GGUF_STRING: e.str = arr->arr.strs[i]; break;
    case PS_GGUF_ARRAY: e = arr->arr.elems[i]; break;
    case PS_GGUF_F32:
    case PS_GGUF_F64: e.f64 = ps_gguf_arr_float(arr, i); break;
    case PS_GGUF_BOOL: e.b = ps_gguf_arr_int(arr, i) != 0; break;
    case PS_GGUF_U64: {
        uint64_t x;
        memcpy(&x, (const uint8_t *)arr->arr.data + 8 * i, 8);
        e.u64 = x;
        break;
    }
    case PS_GGUF_U8:
    case PS_GGUF_U16:
    case PS_GGUF_U32: e.u64 = (uint64_t)ps_gguf_arr_int(arr, i); break;
    default: e.i64 = ps_gguf_arr_int(arr, i); break;
    }
    return e;
}
