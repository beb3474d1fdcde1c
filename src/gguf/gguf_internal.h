/* gguf_internal.h - what the GGUF reader, loader and writer share, private to src/gguf.
 *
 * File layout (all little-endian):
 *   header   magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   metadata n_kv x { string key, u32 value type, value }
 *   infos    n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding  to general.alignment (default 32)
 *   data     tensor bytes; each offset is relative to the start of this section
 * where a string is { u64 len, len bytes } and an array value is { u32 elem type, u64 n, n elems }.
 *
 * gguf_read.c parses and validates an image in memory and answers the getters; gguf_load.c
 * decides how a file's bytes get into memory (mapped, or read into huge pages) and records
 * the region in the reader; gguf_write.c streams a new file. */
#ifndef PS_GGUF_INTERNAL_H
#define PS_GGUF_INTERNAL_H

#include "gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "src/gguf reads and writes little-endian fields with memcpy: port it before building on a big-endian host"
#endif

#define GGUF_MAGIC             "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH         8 /* deepest nesting of arrays we accept (reader) and write (writer) */

struct arena_chunk; /* gguf_read.c */

struct ps_gguf {
    const uint8_t *base; /* the file's bytes */
    size_t size;
    void *region; /* what close unmaps: the file's mapping, or the memory it was read into */
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
    struct arena_chunk *arena;
};

/* Validates the GGUF image in buf (len bytes) and builds a reader over it; the reader does not
 * own buf and records no region (the loader sets region and region_len afterwards for close to
 * unmap). On failure *out is untouched and err holds one line without a path. */
ps_status ps_gguf_parse(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen);

/* Bytes of one element of value type t on disk: 1, 2, 4 or 8 for numeric and bool types, 0 for
 * STRING, ARRAY and numbers outside the enum. */
size_t ps_gguf_vtype_size(uint32_t t);

#endif
