/* gguf_write.c - GGUF v2/v3 writer: metadata and tensor descriptions collected in memory
 * (values deep-copied and validated), then streamed to path.tmp through a buffer, synced and
 * renamed over path. The layout is described in gguf_internal.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tensor/types.h"
#include "gguf_internal.h"

/* Numeric and bool types: a fixed number of bytes per element. */
static bool vtype_is_fixed(uint32_t t) { return ps_gguf_vtype_size(t) > 0; }

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
    char *c = ps_malloc((size_t)src.len + 1);
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
        size_t esz = ps_gguf_vtype_size(elem);
        if (!src->arr.data || n > SIZE_MAX / esz) return PS_ERR_ARG;
        if (elem == PS_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (((const uint8_t *)src->arr.data)[i] > 1) return PS_ERR_ARG;
        void *d = ps_malloc((size_t)n * esz);
        if (!d) return PS_ERR_NOMEM;
        memcpy(d, src->arr.data, (size_t)n * esz);
        dst->arr.data = d;
        dst->arr.n = n;
        return PS_OK;
    }
    size_t esz = elem == PS_GGUF_STRING ? sizeof(ps_gguf_str) : sizeof(ps_gguf_value);
    const void *from = elem == PS_GGUF_STRING ? (const void *)src->arr.strs : (const void *)src->arr.elems;
    if (!from || n > SIZE_MAX / esz) return PS_ERR_ARG;
    void *table = ps_calloc((size_t)n, esz);
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
    ps_gguf_writer *w = ps_calloc(1, sizeof *w);
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
    void *p = ps_realloc(*arr, c * esz);
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
        char *k = ps_strdup(key);
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
ps_status ps_gguf_writer_set_arr(ps_gguf_writer *w, const char *key, ps_gguf_vtype elem, const void *data, uint64_t n) {
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
    ps_gguf_str *tmp = n ? ps_malloc((size_t)n * sizeof *tmp) : NULL;
    if (n && !tmp) return PS_ERR_NOMEM;
    ps_status s = PS_OK;
    for (uint64_t i = 0; i < n && !s; i++) {
        if (!strs[i])
            s = PS_ERR_ARG;
        else
            tmp[i] = (ps_gguf_str){strlen(strs[i]), strs[i]};
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
    if (!(t.name = ps_strdup(name))) return PS_ERR_NOMEM;
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

/* A u32 and a u64, little-endian as the host (gguf_internal.h refuses big-endian hosts). */
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
    case PS_GGUF_U8:
    case PS_GGUF_I8: {
        uint8_t x = (uint8_t)v->u64;
        return wb_put(b, &x, 1);
    }
    case PS_GGUF_BOOL: {
        uint8_t x = v->b;
        return wb_put(b, &x, 1);
    }
    case PS_GGUF_U16:
    case PS_GGUF_I16: {
        uint16_t x = (uint16_t)v->u64;
        return wb_put(b, &x, 2);
    }
    case PS_GGUF_U32:
    case PS_GGUF_I32: {
        uint32_t x = (uint32_t)v->u64;
        return wb_put(b, &x, 4);
    }
    case PS_GGUF_F32: {
        float x = (float)v->f64;
        return wb_put(b, &x, 4);
    }
    case PS_GGUF_U64:
    case PS_GGUF_I64:
    case PS_GGUF_F64: return wb_put(b, &v->u64, 8);
    case PS_GGUF_STRING: return wb_str(b, v->str.data, v->str.len);
    case PS_GGUF_ARRAY: break;
    default: return PS_ERR_INTERNAL;
    }
    if ((s = wb_u32(b, v->arr.type)) || (s = wb_u64(b, v->arr.n))) return s;
    if (vtype_is_fixed(v->arr.type)) return wb_put(b, v->arr.data, (size_t)v->arr.n * ps_gguf_vtype_size(v->arr.type));
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (v->arr.type == PS_GGUF_STRING)
            s = wb_str(b, v->arr.strs[i].data, v->arr.strs[i].len);
        else
            s = wb_value(b, &v->arr.elems[i], false);
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
    void *tmp = fill_max ? ps_malloc(fill_max) : NULL;
    if (fill_max && !tmp)
        return ps_errf(b->err, b->errlen, PS_ERR_NOMEM, "out of memory for a %zu-byte tensor", fill_max);
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
ps_status ps_gguf_writer_write(ps_gguf_writer *w, const char *path, ps_gguf_progress_fn progress, void *progress_ctx,
                               char *err, size_t errlen) {
    ps_status s;
    char *tmp = NULL;
    bool created = false;
    wbuf b = {.fd = -1, .err = err, .errlen = errlen, .cap = 1 << 20};
    if (!w || !path) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_writer_write: NULL writer or path");
    size_t plen = strlen(path);
    tmp = ps_malloc(plen + 5);
    b.buf = ps_malloc(b.cap);
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
