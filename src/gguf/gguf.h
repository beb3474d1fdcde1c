/* gguf.h - GGUF v2/v3 reader (mmap or huge pages, validated), writer, and values as text.
 *
 * Reader: ps_gguf_open maps the file and checks every count, length, offset, size
 * and alignment against the file before anything is used; afterwards every value,
 * string and tensor pointer handed out points into the mapping (or into tables the
 * reader owns) and stays valid until ps_gguf_close. Strings are NOT NUL-terminated
 * unless noted: use ps_gguf_str's len. Numeric array data may be unaligned: read it
 * with the ps_gguf_arr_* accessors.
 *
 * Sources: gguf_read.c (parser, lookups, getters), gguf_load.c (open: map or huge pages),
 * gguf_write.c (writer), gguf_print.c (values as text); gguf_json.h has values as JSON. */
#ifndef PS_GGUF_H
#define PS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../ps.h"

typedef enum {
    PS_GGUF_U8 = 0,
    PS_GGUF_I8 = 1,
    PS_GGUF_U16 = 2,
    PS_GGUF_I16 = 3,
    PS_GGUF_U32 = 4,
    PS_GGUF_I32 = 5,
    PS_GGUF_F32 = 6,
    PS_GGUF_BOOL = 7,
    PS_GGUF_STRING = 8,
    PS_GGUF_ARRAY = 9,
    PS_GGUF_U64 = 10,
    PS_GGUF_I64 = 11,
    PS_GGUF_F64 = 12,
    PS_GGUF_VTYPE_COUNT
} ps_gguf_vtype;

typedef struct {
    uint64_t len;
    const char *data; /* len bytes, not NUL-terminated */
} ps_gguf_str;

typedef struct ps_gguf_value ps_gguf_value;
struct ps_gguf_value {
    ps_gguf_vtype type;
    union {
        uint64_t u64; /* U8/U16/U32/U64 widened */
        int64_t i64;  /* I8/I16/I32/I64 widened */
        double f64;   /* F32/F64 widened */
        bool b;
        ps_gguf_str str;
        struct {
            ps_gguf_vtype type;         /* element type */
            uint64_t n;                 /* element count */
            const void *data;           /* numeric/bool elements, raw little-endian, maybe unaligned */
            const ps_gguf_str *strs;    /* when type == STRING: n strings */
            const ps_gguf_value *elems; /* when type == ARRAY: n nested array values */
        } arr;
    };
};

typedef struct {
    const char *name; /* NUL-terminated, owned by the reader */
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* ne[0] is the innermost (row) length; unused dims are 1 */
    uint32_t type;    /* ps_type numbering */
    uint64_t offset;  /* from the start of the data section */
    const void *data; /* into the mapping */
    size_t nbytes;
} ps_gguf_tensor;

typedef struct ps_gguf ps_gguf;

/* Opens and validates a GGUF file. On failure *out is NULL and err says what is wrong
 * ("tensor 'blk.0.attn_q.weight' data [offset 123, 4096 bytes] runs past the end of the file").
 * Statuses: PS_ERR_IO (cannot open/map; the message has the path and strerror),
 * PS_ERR_FORMAT (malformed), PS_ERR_UNSUPPORTED (GGUF v1, big-endian, unknown version).
 * Messages from ps_gguf_open start with "<path>: "; those of ps_gguf_open_mem do not.
 * A reader is immutable once open: any number of threads may read from it at once. */
ps_status ps_gguf_open(const char *path, ps_gguf **out, char *err, size_t errlen);
/* How ps_gguf_open_with places the file in memory. PS_GGUF_MAP maps it (what ps_gguf_open
 * does): pages are read on first touch and shared with the page cache and other processes.
 * PS_GGUF_HUGE reads it into anonymous memory backed by 2 MiB pages where the system allows
 * them (transparent huge pages enabled: always or madvise; else, when the copy would take
 * more than 7/8 of the memory available or cannot be had, or when the file does not start
 * like a GGUF file, it maps): slower to open and not shared, but a pass over the weights
 * then misses the TLB far less (in a virtual machine, whose page walks are nested, decode
 * ran 25-30 % faster). */
typedef enum { PS_GGUF_MAP, PS_GGUF_HUGE } ps_gguf_load;
ps_status ps_gguf_open_with(const char *path, ps_gguf_load how, ps_gguf **out, char *err, size_t errlen);
/* Same over a caller's buffer, which must outlive the returned reader (used by tests/fuzzers). */
ps_status ps_gguf_open_mem(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen);
void ps_gguf_close(ps_gguf *g); /* NULL is a no-op */

uint32_t ps_gguf_version(const ps_gguf *g);
uint32_t ps_gguf_alignment(const ps_gguf *g);
size_t ps_gguf_file_size(const ps_gguf *g);
/* Byte offset in the file where the data section (tensor offset 0) starts. */
size_t ps_gguf_data_offset(const ps_gguf *g);
/* GGUF spelling of a value type ("UINT32", "FLOAT32", "STRING", "ARRAY", ...); "invalid"
 * for numbers outside the enum. Static, never NULL. */
const char *ps_gguf_vtype_name(ps_gguf_vtype t);

/* Key/value metadata, in file order. */
int64_t ps_gguf_n_kv(const ps_gguf *g);
const char *ps_gguf_kv_key(const ps_gguf *g, int64_t i); /* NUL-terminated, reader-owned */
const ps_gguf_value *ps_gguf_kv_value(const ps_gguf *g, int64_t i);
const ps_gguf_value *ps_gguf_get(const ps_gguf *g, const char *key); /* NULL when absent */

/* Typed getters. PS_ERR_NOT_FOUND when the key is absent, PS_ERR_FORMAT (with err naming
 * the key, the expected and the actual type) when the value cannot be represented:
 * integer getters accept any integer type whose value fits, float getters any float type. */
ps_status ps_gguf_get_u32(const ps_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen);
ps_status ps_gguf_get_i64(const ps_gguf *g, const char *key, int64_t *out, char *err, size_t errlen);
ps_status ps_gguf_get_f32(const ps_gguf *g, const char *key, float *out, char *err, size_t errlen);
ps_status ps_gguf_get_bool(const ps_gguf *g, const char *key, bool *out, char *err, size_t errlen);
ps_status ps_gguf_get_str(const ps_gguf *g, const char *key, ps_gguf_str *out, char *err, size_t errlen);
/* An array value of the given element type (PS_ERR_FORMAT if it is another). */
ps_status ps_gguf_get_arr(const ps_gguf *g, const char *key, ps_gguf_vtype elem, const ps_gguf_value **out, char *err,
                          size_t errlen);
/* True when s equals the NUL-terminated c string. */
bool ps_gguf_str_eq(ps_gguf_str s, const char *c);

/* Element i of a numeric array value (caller checks i < n and the element type). */
int64_t ps_gguf_arr_int(const ps_gguf_value *arr, uint64_t i);  /* any integer or bool type */
double ps_gguf_arr_float(const ps_gguf_value *arr, uint64_t i); /* F32 or F64 (or integer) */
/* Element i of an array value as a standalone value (caller checks i < n): numeric and bool
 * elements widened like scalars, a string element's bytes and a nested array's tables still
 * pointing into the reader (or wherever arr's did). */
ps_gguf_value ps_gguf_arr_elem(const ps_gguf_value *arr, uint64_t i);

/* Values as one line of text for people. ps_gguf_print_str writes the bytes of s (in double
 * quotes when quote) with '"' and '\\' backslashed, newline as \n and other control bytes as
 * \xHH, cut after max bytes with "..." after the cut. ps_gguf_print_value writes a scalar
 * (floats with 9 digits for F32, 17 for F64; strings quoted and cut after max_str bytes), or an
 * array as "[TYPE x n] [e0, e1, ...]" showing at most max_elems elements at every level. */
void ps_gguf_print_str(FILE *f, ps_gguf_str s, size_t max, bool quote);
void ps_gguf_print_value(FILE *f, const ps_gguf_value *v, uint64_t max_elems, size_t max_str);

/* Tensors, in file order. */
int64_t ps_gguf_n_tensors(const ps_gguf *g);
const ps_gguf_tensor *ps_gguf_tensor_at(const ps_gguf *g, int64_t i);
const ps_gguf_tensor *ps_gguf_find_tensor(const ps_gguf *g, const char *name); /* NULL when absent */

/* Writer. Metadata and tensor descriptions are collected in memory, then ps_gguf_writer_write
 * streams the file: header, metadata, tensor infos, then each tensor's bytes (padded to the
 * alignment), asking the tensor's fill callback for data it was not handed directly. */
typedef struct ps_gguf_writer ps_gguf_writer;

/* Fills buf (nbytes) with the bytes of tensor `index` (in add order). */
typedef ps_status (*ps_gguf_fill_fn)(void *ctx, int64_t index, void *buf, size_t nbytes, char *err, size_t errlen);
/* Called after each tensor is written: bytes written so far, total bytes of tensor data. */
typedef void (*ps_gguf_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* alignment: a power of two, 0 meaning the GGUF default 32; any other value is also written
 * as general.alignment. Setting general.alignment (it must be a UINT32 power of two) changes
 * the writer's alignment. Setters return PS_ERR_ARG for invalid input (empty key, value out
 * of its type's range, nesting deeper than 8, bad element type), PS_ERR_NOMEM. */
ps_status ps_gguf_writer_create(ps_gguf_writer **out, uint32_t version /* 2 or 3 */, uint32_t alignment);
void ps_gguf_writer_free(ps_gguf_writer *w); /* NULL is a no-op */

/* Setting a key that was already set replaces its value in place (keeps its position). */
ps_status ps_gguf_writer_set_u32(ps_gguf_writer *w, const char *key, uint32_t v);
ps_status ps_gguf_writer_set_i32(ps_gguf_writer *w, const char *key, int32_t v);
ps_status ps_gguf_writer_set_u64(ps_gguf_writer *w, const char *key, uint64_t v);
ps_status ps_gguf_writer_set_f32(ps_gguf_writer *w, const char *key, float v);
ps_status ps_gguf_writer_set_bool(ps_gguf_writer *w, const char *key, bool v);
ps_status ps_gguf_writer_set_str(ps_gguf_writer *w, const char *key, const char *v);
/* Numeric array: n elements of elem type, packed little-endian in data (copied). */
ps_status ps_gguf_writer_set_arr(ps_gguf_writer *w, const char *key, ps_gguf_vtype elem, const void *data, uint64_t n);
ps_status ps_gguf_writer_set_arr_str(ps_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Any value (nested arrays included), deep-copied: used to copy metadata from a reader. */
ps_status ps_gguf_writer_set_value(ps_gguf_writer *w, const char *key, const ps_gguf_value *v);

/* Tensor with bytes given now (data must stay valid until write) or, when data is NULL,
 * produced at write time by fill(ctx, index, ...). nbytes must equal ps_row_bytes(type, ne[0]) *
 * ne[1] * ne[2] * ne[3]. */
ps_status ps_gguf_writer_add_tensor(ps_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne, const void *data, ps_gguf_fill_fn fill, void *ctx);

ps_status ps_gguf_writer_write(ps_gguf_writer *w, const char *path, ps_gguf_progress_fn progress, void *progress_ctx,
                               char *err, size_t errlen);

#endif
