/* gguf.c - GGUF v2/v3 reader (mmap, validated) and writer.
 *
 * File layout (all little-endian):
 *   header   magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   metadata n_kv x { string key, u32 value type, value }
 *   infos    n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding  to general.alignment (default 32)
 *   data     tensor bytes; each offset is relative to the start of this section
 * where a string is { u64 len, len bytes } and an array value is { u32 elem type, u64 n, n elems }.
 *
 * The reader validates the whole file in ps_gguf_open before handing anything out: every
 * count is checked against the bytes left before anything is allocated for it, so a lying
 * header cannot make us allocate more than a small multiple of the file size. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tensor/types.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields with memcpy: port it before building on a big-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24u      /* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8           /* deepest nesting of arrays we accept */
#define GGUF_MIN_KV_BYTES 14u      /* u64 key len, >= 1 key byte, u32 type, >= 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 33u  /* u64 name len, >= 1 name byte, u32 n_dims, u64 ne, u32 type, u64 offset */
#define GGUF_NAME_SHOW 80          /* longest name quoted in an error message */

/* ---------------------------------------------------------------------------------------------
 * Value types */

static const struct {
    const char *name;
    size_t size; /* bytes of one element on disk; 0 for STRING and ARRAY */
} vtypes[PS_GGUF_VTYPE_COUNT] = {
    [PS_GGUF_U8] = {"UINT8", 1},     [PS_GGUF_I8] = {"INT8", 1},       [PS_GGUF_U16] = {"UINT16", 2},
    [PS_GGUF_I16] = {"INT16", 2},    [PS_GGUF_U32] = {"UINT32", 4},    [PS_GGUF_I32] = {"INT32", 4},
    [PS_GGUF_F32] = {"FLOAT32", 4},  [PS_GGUF_BOOL] = {"BOOL", 1},     [PS_GGUF_STRING] = {"STRING", 0},
    [PS_GGUF_ARRAY] = {"ARRAY", 0},  [PS_GGUF_U64] = {"UINT64", 8},    [PS_GGUF_I64] = {"INT64", 8},
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

static bool vtype_is_float(uint32_t t) { return t == PS_GGUF_F32 || t == PS_GGUF_F64; }

/* Numeric and bool types: a fixed number of bytes per element. */
static bool vtype_is_fixed(uint32_t t) { return t < PS_GGUF_VTYPE_COUNT && vtypes[t].size > 0; }

/* Reads one fixed-size element of type t at p (little-endian, maybe unaligned) into v. */
static void scalar_load(ps_gguf_value *v, uint32_t t, const uint8_t *p) {
    v->type = (ps_gguf_vtype)t;
    switch (t) {
    case PS_GGUF_U8: v->u64 = p[0]; break;
    case PS_GGUF_I8: v->i64 = (int8_t)p[0]; break;
    case PS_GGUF_BOOL: v->b = p[0] != 0; break;
    case PS_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); v->u64 = x; break; }
    case PS_GGUF_I16: { int16_t x; memcpy(&x, p, 2); v->i64 = x; break; }
    case PS_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); v->u64 = x; break; }
    case PS_GGUF_I32: { int32_t x; memcpy(&x, p, 4); v->i64 = x; break; }
    case PS_GGUF_F32: { float x; memcpy(&x, p, 4); v->f64 = x; break; }
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
        c = calloc(1, sizeof *c + cap);
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
 * Reader */

struct ps_gguf {
    const uint8_t *base; /* the file's bytes */
    size_t size;
    void *region;        /* what close unmaps: the file's mapping, or the memory it was read into */
    size_t region_len;
    uint32_t version;
    uint32_t alignment;
    size_t data_offset; /* start of the data section */
    int64_t n_kv;
    const char **keys;     /* n_kv NUL-terminated keys */
    ps_gguf_value *values; /* n_kv values */
    int64_t n_tensors;
    ps_gguf_tensor *tensors;
    int64_t *kv_table; /* open addressing: index + 1, 0 = empty; kv_cap slots (a power of two) */
    size_t kv_cap;
    int64_t *tensor_table;
    size_t tensor_cap;
    arena_chunk *arena;
};

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

static size_t left(const parser *ps) { return ps->g->size - ps->pos; }

/* Fails with PS_ERR_FORMAT unless n more bytes are in the file; `thing` names the field. */
static ps_status need(parser *ps, size_t n, const char *thing) {
    if (n <= left(ps)) return PS_OK;
    return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT,
                   "%s: %s at offset %zu runs past the end of the file (%zu bytes)", ps->what, thing, ps->pos,
                   ps->g->size);
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
                       "%s: %s of %" PRIu64 " bytes at offset %zu runs past the end of the file (%zu bytes)",
                       ps->what, thing, len, at, ps->g->size);
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
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: unknown value type %" PRIu32 " at offset %zu",
                       ps->what, type, ps->pos - 4);
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
 * earlier entry with the same name, or -1. names[i] gives entry i's name. */
static int64_t table_insert(int64_t *table, size_t cap, const char *name, int64_t idx, const char *(*name_of)(const ps_gguf *, int64_t),
                            const ps_gguf *g) {
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
        return ps_errf(ps->err, ps->errlen, PS_ERR_UNSUPPORTED,
                       "big-endian GGUF file (version %" PRIu32 " byte-swapped): only little-endian files are supported",
                       swapped);
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
                       "header declares %" PRIu64 " tensors, but the file (%zu bytes) can hold at most %zu",
                       *n_tensors, g->size, rest / GGUF_MIN_TENSOR_BYTES);
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
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "duplicate metadata key '%s' (entries #%" PRId64 " and #%" PRIu64 ")",
                           shown, dup, i);
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
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: n_dims %" PRIu32 " is outside 1..4", ps->what, t->n_dims);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < 4; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && (s = rd_u64(ps, &ne, "dimension"))) return s;
        if (ne == 0 || ne > INT64_MAX)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: dimension %" PRIu32 " is %" PRIu64 ", must be 1..2^63-1",
                           ps->what, d, ne);
        if (nel > (uint64_t)INT64_MAX / ne)
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: element count overflows (more than 2^63 elements)",
                           ps->what);
        nel *= ne;
        t->ne[d] = (int64_t)ne;
    }
    if ((s = rd_u32(ps, &t->type, "tensor type")) || (s = rd_u64(ps, &t->offset, "tensor offset"))) return s;
    const ps_type_info *ti = ps_type_get(t->type);
    if (!ti)
        return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "%s: unknown tensor type %" PRIu32, ps->what, t->type);
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
    extent *ex = malloc((size_t)g->n_tensors * sizeof *ex);
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
            return ps_errf(ps->err, ps->errlen, PS_ERR_FORMAT, "duplicate tensor name '%s' (tensors #%" PRId64 " and #%" PRIu64 ")",
                           show_name(shown, sizeof shown, g->tensors[i].name, strlen(g->tensors[i].name)), dup, i);
    }
    /* pos <= size, alignment <= 2^31: no overflow in size_t */
    g->data_offset = (ps->pos + g->alignment - 1) / g->alignment * g->alignment;
    return check_placement(ps);
}

/* Validates the file in buf (len bytes) and builds a reader over it; the reader does not own
 * buf. On failure *out is NULL and err holds one line. */
static ps_status gguf_parse(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen) {
    ps_status s;
    uint64_t n_tensors = 0, n_kv = 0;
    ps_gguf *g = calloc(1, sizeof *g);
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

#define HUGE_BYTES ((size_t)2 << 20)

/* Whether transparent huge pages back memory that asks for them (enabled: always or madvise). */
static bool huge_pages_on(void) {
#ifdef MADV_HUGEPAGE
    char line[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && !fgets(line, sizeof line, f)) line[0] = 0;
    if (f) fclose(f);
    return strstr(line, "[always]") || strstr(line, "[madvise]");
#else
    return false;
#endif
}

/* Whether a copy of size bytes leaves at least 1/8 of the memory the system could give now
 * (MemAvailable) to everything else; else the file is mapped, and the kernel pages it. */
static bool copy_fits(size_t size) {
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (double)size < 0.875 * (double)kb * 1024;
}

/* Reads the size bytes of fd into anonymous memory aligned to 2 MiB and advised to use huge
 * pages, read-only afterwards; *region and *region_len are what close unmaps. */
static ps_status read_huge(int fd, const char *path, size_t size, const uint8_t **base, void **region,
                           size_t *region_len, char *err, size_t errlen) {
#ifdef MADV_HUGEPAGE
    size_t len = size + HUGE_BYTES;
    uint8_t *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return ps_errf(err, errlen, PS_ERR_NOMEM, "cannot allocate %zu bytes for '%s': %s", size, path, strerror(errno));
    uint8_t *p = (uint8_t *)(((uintptr_t)r + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    madvise(p, size, MADV_HUGEPAGE); /* hints: without them, normal pages, and a forked child's copy */
    madvise(r, len, MADV_DONTFORK);
    for (size_t got = 0; got < size;) {
        ssize_t n = pread(fd, p + got, size - got < ((size_t)1 << 30) ? size - got : (size_t)1 << 30, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ps_status s = ps_errf(err, errlen, PS_ERR_IO, "cannot read '%s': %s", path,
                                  n < 0 ? strerror(errno) : "the file shrank while it was read");
            munmap(r, len);
            return s;
        }
        got += (size_t)n;
    }
    mprotect(p, size, PROT_READ);
    *base = p, *region = r, *region_len = len;
    return PS_OK;
#else
    (void)fd, (void)size, (void)base, (void)region, (void)region_len;
    return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "'%s': huge pages are not supported here", path);
#endif
}

/* Opens and validates the GGUF file at path: see gguf.h. The descriptor is closed before
 * returning. Errors name the path. */
ps_status ps_gguf_open_with(const char *path, ps_gguf_load how, ps_gguf **out, char *err, size_t errlen) {
    ps_status s;
    char detail[512];
    const uint8_t *base = NULL;
    void *region = NULL;
    size_t size = 0, region_len = 0;
    int fd = -1;
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open: path is NULL");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
        goto err;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        goto err;
    }
    if (!S_ISREG(st.st_mode)) {
        s = ps_errf(err, errlen, PS_ERR_IO, "'%s' is not a regular file", path);
        goto err;
    }
    if ((uint64_t)st.st_size > SIZE_MAX - HUGE_BYTES) {
        s = ps_errf(err, errlen, PS_ERR_IO, "'%s' is too large to map", path);
        goto err;
    }
    size = (size_t)st.st_size;
    char magic[4] = "";
    bool huge = size > 0 && how == PS_GGUF_HUGE && huge_pages_on() && copy_fits(size) &&
                pread(fd, magic, 4, 0) == 4 && !memcmp(magic, GGUF_MAGIC, 4); /* else mapped (the parser
                                                                                  says what is wrong) */
    if (huge && (s = read_huge(fd, path, size, &base, &region, &region_len, err, errlen)) != PS_ERR_NOMEM && s)
        goto err;
    if (size > 0 && !region) { /* mapped by choice, or because memory for a copy was short */
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            s = ps_errf(err, errlen, PS_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
            goto err;
        }
        base = map, region = map, region_len = size;
    }
    close(fd);
    fd = -1;
    s = gguf_parse(size ? base : (const uint8_t *)"", size, out, detail, sizeof detail);
    if (s) {
        ps_errf(err, errlen, s, "%s: %s", path, detail);
        goto err;
    }
    (*out)->region = region;
    (*out)->region_len = region_len;
    return PS_OK;
err:
    if (region) munmap(region, region_len);
    if (fd >= 0) close(fd);
    return s;
}

ps_status ps_gguf_open(const char *path, ps_gguf **out, char *err, size_t errlen) {
    return ps_gguf_open_with(path, PS_GGUF_MAP, out, err, errlen);
}

/* Validates the GGUF image in buf: see gguf.h. The reader points into buf, which the caller
 * keeps alive (and unchanged) until ps_gguf_close. */
ps_status ps_gguf_open_mem(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen) {
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open_mem: buf is NULL");
    return gguf_parse(buf ? buf : "", len, out, err, errlen);
}

/* Frees the reader and unmaps the file; every pointer it handed out dies here. */
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
        return ps_errf(err, errlen, PS_ERR_FORMAT, "metadata key '%s' = %" PRIu64 " does not fit in INT64", key, v->u64);
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
ps_status ps_gguf_get_arr(const ps_gguf *g, const char *key, ps_gguf_vtype elem, const ps_gguf_value **out,
                          char *err, size_t errlen) {
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

/* ---------------------------------------------------------------------------------------------
 * Writer */

typedef struct {
    char *key;
    ps_gguf_value v; /* deep-owned: strings, tables and numeric data malloc'd by value_copy */
} wkv;

typedef struct {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    size_t nbytes;
    uint64_t offset; /* in the data section, set by write */
    const void *data;
    ps_gguf_fill_fn fill;
    void *ctx;
} wtensor;

struct ps_gguf_writer {
    uint32_t version, alignment;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

/* Frees what value_copy allocated inside v (not v itself); safe on partial copies. */
static void value_free(ps_gguf_value *v) {
    if (v->type == PS_GGUF_STRING) {
        free((void *)v->str.data);
    } else if (v->type == PS_GGUF_ARRAY) {
        if (v->arr.type == PS_GGUF_STRING && v->arr.strs) {
            for (uint64_t i = 0; i < v->arr.n; i++) free((void *)v->arr.strs[i].data);
        } else if (v->arr.type == PS_GGUF_ARRAY && v->arr.elems) {
            for (uint64_t i = 0; i < v->arr.n; i++) value_free((ps_gguf_value *)&v->arr.elems[i]);
        }
        free((void *)v->arr.data);
        free((void *)v->arr.strs);
        free((void *)v->arr.elems);
    }
    memset(v, 0, sizeof *v);
}

/* A malloc'd copy of s with a NUL after its len bytes. */
static ps_status str_copy(ps_gguf_str *dst, ps_gguf_str src) {
    if (src.len >= SIZE_MAX || (src.len && !src.data)) return PS_ERR_ARG;
    char *c = malloc((size_t)src.len + 1);
    if (!c) return PS_ERR_NOMEM;
    if (src.len) memcpy(c, src.data, (size_t)src.len);
    c[src.len] = 0;
    dst->len = src.len;
    dst->data = c;
    return PS_OK;
}

/* True when a widened scalar fits its declared type (narrowing at write time is lossless). */
static bool scalar_fits(const ps_gguf_value *v) {
    switch (v->type) {
    case PS_GGUF_U8: return v->u64 <= UINT8_MAX;
    case PS_GGUF_U16: return v->u64 <= UINT16_MAX;
    case PS_GGUF_U32: return v->u64 <= UINT32_MAX;
    case PS_GGUF_I8: return v->i64 >= INT8_MIN && v->i64 <= INT8_MAX;
    case PS_GGUF_I16: return v->i64 >= INT16_MIN && v->i64 <= INT16_MAX;
    case PS_GGUF_I32: return v->i64 >= INT32_MIN && v->i64 <= INT32_MAX;
    default: return true;
    }
}

/* Deep-copies src into dst (zeroed by the caller), validating types, ranges and nesting.
 * PS_ERR_ARG for an invalid value; on failure dst may hold a partial copy for value_free. */
static ps_status value_copy(ps_gguf_value *dst, const ps_gguf_value *src, int depth) {
    ps_status s;
    if ((unsigned)src->type >= PS_GGUF_VTYPE_COUNT) return PS_ERR_ARG;
    if (src->type == PS_GGUF_STRING) {
        dst->type = PS_GGUF_STRING;
        return str_copy(&dst->str, src->str);
    }
    if (src->type != PS_GGUF_ARRAY) {
        if (!scalar_fits(src)) return PS_ERR_ARG;
        *dst = *src;
        return PS_OK;
    }
    uint32_t elem = src->arr.type;
    uint64_t n = src->arr.n;
    if (depth >= GGUF_MAX_DEPTH || elem >= PS_GGUF_VTYPE_COUNT) return PS_ERR_ARG;
    dst->type = PS_GGUF_ARRAY;
    dst->arr.type = (ps_gguf_vtype)elem;
    if (n == 0) return PS_OK;
    if (vtype_is_fixed(elem)) {
        size_t esz = vtypes[elem].size;
        if (!src->arr.data || n > SIZE_MAX / esz) return PS_ERR_ARG;
        if (elem == PS_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (((const uint8_t *)src->arr.data)[i] > 1) return PS_ERR_ARG;
        void *d = malloc((size_t)n * esz);
        if (!d) return PS_ERR_NOMEM;
        memcpy(d, src->arr.data, (size_t)n * esz);
        dst->arr.data = d;
        dst->arr.n = n;
        return PS_OK;
    }
    size_t esz = elem == PS_GGUF_STRING ? sizeof(ps_gguf_str) : sizeof(ps_gguf_value);
    const void *from = elem == PS_GGUF_STRING ? (const void *)src->arr.strs : (const void *)src->arr.elems;
    if (!from || n > SIZE_MAX / esz) return PS_ERR_ARG;
    void *table = calloc((size_t)n, esz);
    if (!table) return PS_ERR_NOMEM;
    dst->arr.n = n;
    if (elem == PS_GGUF_STRING) {
        ps_gguf_str *strs = table;
        dst->arr.strs = strs;
        for (uint64_t i = 0; i < n; i++)
            if ((s = str_copy(&strs[i], src->arr.strs[i]))) return s;
        return PS_OK;
    }
    ps_gguf_value *elems = table;
    dst->arr.elems = elems;
    for (uint64_t i = 0; i < n; i++) {
        if (src->arr.elems[i].type != PS_GGUF_ARRAY) return PS_ERR_ARG;
        if ((s = value_copy(&elems[i], &src->arr.elems[i], depth + 1))) return s;
    }
    return PS_OK;
}

/* Creates an empty writer for GGUF `version` (2 or 3) aligning tensor data to `alignment`
 * (a power of two; 0 means the GGUF default 32). A non-default alignment is recorded as
 * general.alignment. The caller frees the writer with ps_gguf_writer_free. */
ps_status ps_gguf_writer_create(ps_gguf_writer **out, uint32_t version, uint32_t alignment) {
    if (!out) return PS_ERR_ARG;
    *out = NULL;
    if (version != 2 && version != 3) return PS_ERR_ARG;
    if (alignment == 0) alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1)) return PS_ERR_ARG;
    ps_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return PS_ERR_NOMEM;
    w->version = version;
    w->alignment = alignment;
    if (alignment != GGUF_DEFAULT_ALIGNMENT) {
        ps_status s = ps_gguf_writer_set_u32(w, "general.alignment", alignment);
        if (s) {
            ps_gguf_writer_free(w);
            return s;
        }
    }
    *out = w;
    return PS_OK;
}

/* Frees the writer and its copies of keys and values; NULL is a no-op. Tensor data the
 * caller handed to add_tensor stays the caller's. */
void ps_gguf_writer_free(ps_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].v);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

/* Grows *arr (elements of esz bytes) so that it holds at least n + 1. */
static ps_status grow(void **arr, size_t *cap, size_t n, size_t esz) {
    if (n < *cap) return PS_OK;
    size_t c = *cap ? *cap * 2 : 16;
    if (c > SIZE_MAX / esz) return PS_ERR_NOMEM;
    void *p = realloc(*arr, c * esz);
    if (!p) return PS_ERR_NOMEM;
    *arr = p;
    *cap = c;
    return PS_OK;
}

/* Sets key to a deep copy of v, replacing an earlier value in place. general.alignment
 * must be a UINT32 power of two, and sets the writer's alignment. */
ps_status ps_gguf_writer_set_value(ps_gguf_writer *w, const char *key, const ps_gguf_value *v) {
    if (!w || !key || !*key || !v) return PS_ERR_ARG;
    if (!strcmp(key, "general.alignment") &&
        (v->type != PS_GGUF_U32 || v->u64 == 0 || v->u64 > UINT32_MAX || (v->u64 & (v->u64 - 1))))
        return PS_ERR_ARG;
    ps_gguf_value copy = {0};
    ps_status s = value_copy(&copy, v, 0);
    if (s) {
        value_free(&copy);
        return s;
    }
    size_t i = 0;
    while (i < w->n_kv && strcmp(w->kv[i].key, key)) i++;
    if (i < w->n_kv) {
        value_free(&w->kv[i].v);
    } else {
        char *k = strdup(key);
        if (!k || (s = grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv))) {
            free(k);
            value_free(&copy);
            return PS_ERR_NOMEM;
        }
        w->kv[w->n_kv++].key = k;
    }
    w->kv[i].v = copy;
    if (!strcmp(key, "general.alignment")) w->alignment = (uint32_t)copy.u64;
    return PS_OK;
}

/* Typed setters: each wraps v in a ps_gguf_value for ps_gguf_writer_set_value. */
ps_status ps_gguf_writer_set_u32(ps_gguf_writer *w, const char *key, uint32_t v) {
    return ps_gguf_writer_set_value(w, key, &(ps_gguf_value){.type = PS_GGUF_U32, .u64 = v});
}

ps_status ps_gguf_writer_set_i32(ps_gguf_writer *w, const char *key, int32_t v) {
    return ps_gguf_writer_set_value(w, key, &(ps_gguf_value){.type = PS_GGUF_I32, .i64 = v});
}

ps_status ps_gguf_writer_set_u64(ps_gguf_writer *w, const char *key, uint64_t v) {
    return ps_gguf_writer_set_value(w, key, &(ps_gguf_value){.type = PS_GGUF_U64, .u64 = v});
}

ps_status ps_gguf_writer_set_f32(ps_gguf_writer *w, const char *key, float v) {
    return ps_gguf_writer_set_value(w, key, &(ps_gguf_value){.type = PS_GGUF_F32, .f64 = v});
}

ps_status ps_gguf_writer_set_bool(ps_gguf_writer *w, const char *key, bool v) {
    return ps_gguf_writer_set_value(w, key, &(ps_gguf_value){.type = PS_GGUF_BOOL, .b = v});
}

ps_status ps_gguf_writer_set_str(ps_gguf_writer *w, const char *key, const char *v) {
    if (!v) return PS_ERR_ARG;
    ps_gguf_value val = {.type = PS_GGUF_STRING, .str = {strlen(v), v}};
    return ps_gguf_writer_set_value(w, key, &val);
}

/* Numeric (or BOOL) array of n elements packed little-endian in data. */
ps_status ps_gguf_writer_set_arr(ps_gguf_writer *w, const char *key, ps_gguf_vtype elem, const void *data,
                                 uint64_t n) {
    if (!vtype_is_fixed(elem)) return PS_ERR_ARG;
    ps_gguf_value val = {.type = PS_GGUF_ARRAY};
    val.arr.type = elem;
    val.arr.n = n;
    val.arr.data = data;
    return ps_gguf_writer_set_value(w, key, &val);
}

/* Array of n NUL-terminated strings. */
ps_status ps_gguf_writer_set_arr_str(ps_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (n && !strs) return PS_ERR_ARG;
    if (n > SIZE_MAX / sizeof(ps_gguf_str)) return PS_ERR_NOMEM;
    ps_gguf_str *tmp = n ? malloc((size_t)n * sizeof *tmp) : NULL;
    if (n && !tmp) return PS_ERR_NOMEM;
    ps_status s = PS_OK;
    for (uint64_t i = 0; i < n && !s; i++) {
        if (!strs[i]) s = PS_ERR_ARG;
        else tmp[i] = (ps_gguf_str){strlen(strs[i]), strs[i]};
    }
    if (!s) {
        ps_gguf_value val = {.type = PS_GGUF_ARRAY};
        val.arr.type = PS_GGUF_STRING;
        val.arr.n = n;
        val.arr.strs = tmp;
        s = ps_gguf_writer_set_value(w, key, &val);
    }
    free(tmp);
    return s;
}

/* Adds a tensor description (see gguf.h). PS_ERR_ARG for an empty or duplicate name, a bad
 * shape, an unknown type, a row length that is not a whole number of blocks, or neither
 * data nor fill. */
ps_status ps_gguf_writer_add_tensor(ps_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne, const void *data, ps_gguf_fill_fn fill, void *ctx) {
    if (!w || !name || !*name || !ne || n_dims < 1 || n_dims > 4 || (!data && !fill)) return PS_ERR_ARG;
    const ps_type_info *ti = ps_type_get(type);
    if (!ti || !ti->block_size || !ti->type_size) return PS_ERR_ARG;
    wtensor t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill, .ctx = ctx};
    uint64_t nel = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0 || nel > (uint64_t)INT64_MAX / (uint64_t)t.ne[d]) return PS_ERR_ARG;
        nel *= (uint64_t)t.ne[d];
    }
    size_t row = ps_row_bytes(type, t.ne[0]);
    uint64_t rows = (uint64_t)t.ne[1] * (uint64_t)t.ne[2] * (uint64_t)t.ne[3];
    if (!row || rows > SIZE_MAX / row) return PS_ERR_ARG;
    t.nbytes = row * (size_t)rows;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return PS_ERR_ARG;
    if (grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t)) return PS_ERR_NOMEM;
    if (!(t.name = strdup(name))) return PS_ERR_NOMEM;
    w->t[w->n_t++] = t;
    return PS_OK;
}

/* Buffered output to a file descriptor; the first error sticks in st. */
typedef struct {
    int fd;
    const char *path;
    unsigned char *buf;
    size_t used, cap;
    uint64_t written; /* bytes accepted so far (buffered or written) */
    char *err;
    size_t errlen;
} wbuf;

/* Writes all n bytes to fd, retrying short writes and EINTR. */
static ps_status write_all(wbuf *b, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(b->fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ps_errf(b->err, b->errlen, PS_ERR_IO, "cannot write '%s': %s", b->path,
                           k < 0 ? strerror(errno) : "no progress");
        c += k;
        n -= (size_t)k;
    }
    return PS_OK;
}

/* Writes out and empties the buffer. */
static ps_status wb_flush(wbuf *b) {
    ps_status s = write_all(b, b->buf, b->used);
    b->used = 0;
    return s;
}

/* Appends n bytes; large blocks bypass the buffer. */
static ps_status wb_put(wbuf *b, const void *p, size_t n) {
    ps_status s;
    if (n == 0) return PS_OK;
    b->written += n;
    if (n > b->cap - b->used) {
        if ((s = wb_flush(b))) return s;
        if (n >= b->cap) return write_all(b, p, n);
    }
    memcpy(b->buf + b->used, p, n);
    b->used += n;
    return PS_OK;
}

static ps_status wb_u32(wbuf *b, uint32_t v) { return wb_put(b, &v, 4); }
static ps_status wb_u64(wbuf *b, uint64_t v) { return wb_put(b, &v, 8); }

/* A GGUF string: u64 length, then the bytes. */
static ps_status wb_str(wbuf *b, const char *s, uint64_t len) {
    ps_status st = wb_u64(b, len);
    return st ? st : wb_put(b, s, (size_t)len);
}

/* Zero bytes up to the next multiple of align. */
static ps_status wb_pad(wbuf *b, uint32_t align) {
    static const unsigned char zeros[256];
    size_t pad = (size_t)((align - b->written % align) % align);
    ps_status s = PS_OK;
    while (pad > 0 && !s) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        s = wb_put(b, zeros, k);
        pad -= k;
    }
    return s;
}

/* Serializes one value (validated by value_copy); with_type writes its type tag first. */
static ps_status wb_value(wbuf *b, const ps_gguf_value *v, bool with_type) {
    ps_status s;
    if (with_type && (s = wb_u32(b, v->type))) return s;
    switch (v->type) {
    case PS_GGUF_U8: case PS_GGUF_I8: { uint8_t x = (uint8_t)v->u64; return wb_put(b, &x, 1); }
    case PS_GGUF_BOOL: { uint8_t x = v->b; return wb_put(b, &x, 1); }
    case PS_GGUF_U16: case PS_GGUF_I16: { uint16_t x = (uint16_t)v->u64; return wb_put(b, &x, 2); }
    case PS_GGUF_U32: case PS_GGUF_I32: { uint32_t x = (uint32_t)v->u64; return wb_put(b, &x, 4); }
    case PS_GGUF_F32: { float x = (float)v->f64; return wb_put(b, &x, 4); }
    case PS_GGUF_U64: case PS_GGUF_I64: case PS_GGUF_F64: return wb_put(b, &v->u64, 8);
    case PS_GGUF_STRING: return wb_str(b, v->str.data, v->str.len);
    case PS_GGUF_ARRAY: break;
    default: return PS_ERR_INTERNAL;
    }
    if ((s = wb_u32(b, v->arr.type)) || (s = wb_u64(b, v->arr.n))) return s;
    if (vtype_is_fixed(v->arr.type)) return wb_put(b, v->arr.data, (size_t)v->arr.n * vtypes[v->arr.type].size);
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (v->arr.type == PS_GGUF_STRING) s = wb_str(b, v->arr.strs[i].data, v->arr.strs[i].len);
        else s = wb_value(b, &v->arr.elems[i], false);
        if (s) return s;
    }
    return PS_OK;
}

/* Header, metadata and tensor infos (offsets assigned here), padded to the alignment. */
static ps_status write_head(ps_gguf_writer *w, wbuf *b) {
    ps_status s;
    uint64_t off = 0;
    if ((s = wb_put(b, GGUF_MAGIC, 4)) || (s = wb_u32(b, w->version)) || (s = wb_u64(b, w->n_t)) ||
        (s = wb_u64(b, w->n_kv)))
        return s;
    for (size_t i = 0; i < w->n_kv; i++)
        if ((s = wb_str(b, w->kv[i].key, strlen(w->kv[i].key))) || (s = wb_value(b, &w->kv[i].v, true))) return s;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off += (t->nbytes + w->alignment - 1) / w->alignment * w->alignment;
        if ((s = wb_str(b, t->name, strlen(t->name))) || (s = wb_u32(b, t->n_dims))) return s;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((s = wb_u64(b, (uint64_t)t->ne[d]))) return s;
        if ((s = wb_u32(b, t->type)) || (s = wb_u64(b, t->offset))) return s;
    }
    return wb_pad(b, w->alignment);
}

/* Every tensor's bytes, each padded to the alignment, asking fill callbacks for data that
 * was not given; progress is called after each tensor. */
static ps_status write_data(ps_gguf_writer *w, wbuf *b, ps_gguf_progress_fn progress, void *pctx) {
    ps_status s = PS_OK;
    uint64_t total = 0, done = 0;
    size_t fill_max = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        total += w->t[i].nbytes;
        if (!w->t[i].data && w->t[i].nbytes > fill_max) fill_max = w->t[i].nbytes;
    }
    void *tmp = fill_max ? malloc(fill_max) : NULL;
    if (fill_max && !tmp) return ps_errf(b->err, b->errlen, PS_ERR_NOMEM, "out of memory for a %zu-byte tensor", fill_max);
    for (size_t i = 0; i < w->n_t && !s; i++) {
        wtensor *t = &w->t[i];
        const void *data = t->data;
        if (!data) {
            char detail[256] = "";
            s = t->fill(t->ctx, (int64_t)i, tmp, t->nbytes, detail, sizeof detail);
            if (s) {
                ps_errf(b->err, b->errlen, s, "tensor '%s': %s", t->name, *detail ? detail : ps_strerror(s));
                break;
            }
            data = tmp;
        }
        if ((s = wb_put(b, data, t->nbytes)) || (s = wb_pad(b, w->alignment))) break;
        done += t->nbytes;
        if (progress) progress(pctx, done, total);
    }
    free(tmp);
    return s ? s : wb_flush(b);
}

/* Writes the whole file to path + ".tmp", syncs it and renames it over path; on any error
 * the temporary file is removed and path is left as it was. */
ps_status ps_gguf_writer_write(ps_gguf_writer *w, const char *path, ps_gguf_progress_fn progress,
                               void *progress_ctx, char *err, size_t errlen) {
    ps_status s;
    char *tmp = NULL;
    bool created = false;
    wbuf b = {.fd = -1, .err = err, .errlen = errlen, .cap = 1 << 20};
    if (!w || !path) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_writer_write: NULL writer or path");
    size_t plen = strlen(path);
    tmp = malloc(plen + 5);
    b.buf = malloc(b.cap);
    if (!tmp || !b.buf) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        goto err;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    b.path = tmp;
    b.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (b.fd < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        goto err;
    }
    created = true;
    if ((s = write_head(w, &b)) || (s = write_data(w, &b, progress, progress_ctx))) goto err;
    if (fsync(b.fd) < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot sync '%s': %s", tmp, strerror(errno));
        goto err;
    }
    int fd = b.fd;
    b.fd = -1;
    if (close(fd) < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot close '%s': %s", tmp, strerror(errno));
        goto err;
    }
    if (rename(tmp, path) < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto err;
    }
    free(tmp);
    free(b.buf);
    return PS_OK;
err:
    if (b.fd >= 0) close(b.fd);
    if (created) unlink(tmp);
    free(tmp);
    free(b.buf);
    return s;
}
