/* test_gguf.c - GGUF reader and writer: round trips, malformed files, truncation at every
 * byte, random corruption, I/O errors, and (when present) the real models.
 *
 * Malformed files are built byte by byte with a small builder below, independently of
 * our writer, so that the reader is checked against the format rather than against
 * the writer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "ps.h"
#include "ps_test.h"
#include "tensor/types.h"

/* Byte builder --------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} blob;

static void b_bytes(blob *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u8(blob *b, uint8_t v) { b_bytes(b, &v, 1); }
static void b_u32(blob *b, uint32_t v) { b_bytes(b, &v, 4); }
static void b_u64(blob *b, uint64_t v) { b_bytes(b, &v, 8); }
static void b_str(blob *b, const char *s) {
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}
static void b_zeros(blob *b, size_t n) {
    for (size_t i = 0; i < n; i++) b_u8(b, 0);
}
static void b_pad(blob *b, size_t align) {
    while (b->n % align) b_u8(b, 0);
}
static void b_hdr(blob *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_bytes(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(blob *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, PS_GGUF_U32);
    b_u32(b, v);
}
static void b_kv_str(blob *b, const char *key, const char *v) {
    b_str(b, key);
    b_u32(b, PS_GGUF_STRING);
    b_str(b, v);
}
/* Tensor info with n_dims dimensions from ne. */
static void b_tinfo(blob *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) b_u64(b, ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}

/* Opens a blob from an exactly sized heap copy (so that ASan sees any overread). */
static ps_status open_blob(const blob *b, size_t len, ps_gguf **g, char *err, size_t errlen, void **copy) {
    *copy = malloc(len ? len : 1);
    if (len) memcpy(*copy, b->p, len);
    return ps_gguf_open_mem(*copy, len, g, err, errlen);
}

/* Malformed files ------------------------------------------------------------------------- */

static void m_empty(blob *b) { (void)b; }
static void m_bad_magic(blob *b) {
    b_bytes(b, "GGML", 4);
    b_u32(b, 3);
    b_u64(b, 0);
    b_u64(b, 0);
}
static void m_v1(blob *b) { b_hdr(b, 1, 0, 0); }
static void m_v4(blob *b) { b_hdr(b, 4, 0, 0); }
static void m_big_endian(blob *b) { b_hdr(b, 0x03000000u, 0, 0); }
static void m_trunc_header(blob *b) {
    b_bytes(b, "GGUF", 4);
    b_u32(b, 3);
    b_u32(b, 0);
}
static void m_absurd_kv(blob *b) {
    b_hdr(b, 3, 0, 1ull << 60);
    b_kv_u32(b, "a", 1);
}
static void m_absurd_tensors(blob *b) {
    b_hdr(b, 3, UINT64_MAX, 1);
    b_kv_u32(b, "a", 1);
}
static void m_key_past_eof(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_u64(b, 1000000);
    b_bytes(b, "abcdefghijklmnop", 16);
}
static void m_str_past_eof(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, PS_GGUF_STRING);
    b_u64(b, 500);
    b_bytes(b, "xyz", 3);
}
static void m_arr_overflow(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, PS_GGUF_ARRAY);
    b_u32(b, PS_GGUF_U32);
    b_u64(b, 1ull << 62); /* * 4 bytes wraps to 0 in 64 bits */
    b_u32(b, 7);
}
static void m_str_arr_count(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, PS_GGUF_ARRAY);
    b_u32(b, PS_GGUF_STRING);
    b_u64(b, 1000);
    b_str(b, "one");
}
/* 100 nested arrays declared, the first one claiming the bytes the other 99 need. */
static void m_nested_claim(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, PS_GGUF_ARRAY);
    b_u32(b, PS_GGUF_ARRAY);
    b_u64(b, 100);
    b_u32(b, PS_GGUF_STRING);
    b_u64(b, 100);
    b_zeros(b, 1200);
}
/* A key whose value claims the bytes the next key needs. */
static void m_kv_claim(blob *b) {
    b_hdr(b, 3, 0, 3);
    b_str(b, "a");
    b_u32(b, PS_GGUF_ARRAY);
    b_u32(b, PS_GGUF_STRING);
    b_u64(b, 4);
    b_zeros(b, 32);
}
static void m_bad_vtype(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, 13);
    b_u32(b, 0);
}
static void m_bad_elem_type(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "a");
    b_u32(b, PS_GGUF_ARRAY);
    b_u32(b, 99);
    b_u64(b, 0);
}
/* A key holding `levels` nested arrays, the innermost an empty UINT8 array. */
static void b_nested(blob *b, int levels) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "deep");
    b_u32(b, PS_GGUF_ARRAY);
    for (int i = 1; i < levels; i++) {
        b_u32(b, PS_GGUF_ARRAY);
        b_u64(b, 1);
    }
    b_u32(b, PS_GGUF_U8);
    b_u64(b, 0);
}
static void m_too_deep(blob *b) { b_nested(b, 9); }
static void m_dup_key(blob *b) {
    b_hdr(b, 3, 0, 2);
    b_kv_u32(b, "general.x", 1);
    b_kv_u32(b, "general.x", 2);
}
static void m_empty_key(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_kv_u32(b, "", 1);
}
static void m_nul_key(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_u64(b, 3);
    b_bytes(b, "a\0b", 3);
    b_u32(b, PS_GGUF_U8);
    b_u8(b, 1);
}
static void m_bad_bool(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "flag");
    b_u32(b, PS_GGUF_BOOL);
    b_u8(b, 2);
}
static void m_align_48(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_kv_u32(b, "general.alignment", 48);
}
static void m_align_0(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_kv_u32(b, "general.alignment", 0);
}
static void m_align_type(blob *b) {
    b_hdr(b, 3, 0, 1);
    b_str(b, "general.alignment");
    b_u32(b, PS_GGUF_U64);
    b_u64(b, 32);
}
/* One tensor info, then padding and `data` bytes of tensor data. */
static void b_one_tensor(blob *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off, size_t data) {
    b_hdr(b, 3, 1, 1);
    b_kv_str(b, "general.architecture", "llama");
    b_tinfo(b, "blk.0.attn_q.weight", n_dims, ne, type, off);
    b_pad(b, 32);
    b_zeros(b, data);
}
static void m_ndims0(blob *b) { b_one_tensor(b, 0, (uint64_t[]){0}, PS_TYPE_F32, 0, 64); }
static void m_ndims5(blob *b) { b_one_tensor(b, 5, (uint64_t[]){1, 1, 1, 1, 1}, PS_TYPE_F32, 0, 64); }
static void m_dim_zero(blob *b) { b_one_tensor(b, 2, (uint64_t[]){4, 0}, PS_TYPE_F32, 0, 64); }
static void m_nel_overflow(blob *b) { b_one_tensor(b, 2, (uint64_t[]){1ull << 32, 1ull << 32}, PS_TYPE_F32, 0, 64); }
static void m_bad_ttype(blob *b) { b_one_tensor(b, 1, (uint64_t[]){32}, 99, 0, 64); }
static void m_row_block(blob *b) { b_one_tensor(b, 1, (uint64_t[]){33}, PS_TYPE_Q4_0, 0, 64); }
static void m_misaligned(blob *b) { b_one_tensor(b, 1, (uint64_t[]){4}, PS_TYPE_F32, 16, 64); }
static void m_past_eof(blob *b) { b_one_tensor(b, 1, (uint64_t[]){64}, PS_TYPE_F32, 0, 100); }
static void m_offset_huge(blob *b) { b_one_tensor(b, 1, (uint64_t[]){4}, PS_TYPE_F32, UINT64_MAX - 31, 64); }
static void m_overlap(blob *b) {
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "a", 1, (uint64_t[]){16}, PS_TYPE_F32, 0);
    b_tinfo(b, "b", 1, (uint64_t[]){16}, PS_TYPE_F32, 32);
    b_pad(b, 32);
    b_zeros(b, 128);
}
static void m_dup_tensor(blob *b) {
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "a", 1, (uint64_t[]){16}, PS_TYPE_F32, 0);
    b_tinfo(b, "a", 1, (uint64_t[]){16}, PS_TYPE_F32, 64);
    b_pad(b, 32);
    b_zeros(b, 128);
}
static void m_tinfo_trunc(blob *b) {
    b_hdr(b, 3, 1, 0);
    b_str(b, "tensor.name");
    b_u32(b, 2);
    b_u64(b, 4);
    b_u32(b, 0); /* half of ne[1], then the file ends */
}

static const struct {
    const char *name;
    void (*build)(blob *);
    ps_status want;
    const char *substr;
} malformed[] = {
    {"empty file", m_empty, PS_ERR_FORMAT, "only 0 bytes"},
    {"bad magic", m_bad_magic, PS_ERR_FORMAT, "not a GGUF file: magic is 'GGML'"},
    {"version 1", m_v1, PS_ERR_UNSUPPORTED, "GGUF version 1 is not supported"},
    {"version 4", m_v4, PS_ERR_UNSUPPORTED, "unknown GGUF version 4"},
    {"big-endian", m_big_endian, PS_ERR_UNSUPPORTED, "big-endian"},
    {"truncated header", m_trunc_header, PS_ERR_FORMAT, "truncated header"},
    {"absurd kv count", m_absurd_kv, PS_ERR_FORMAT, "declares 1152921504606846976 metadata keys"},
    {"absurd tensor count", m_absurd_tensors, PS_ERR_FORMAT, "declares 18446744073709551615 tensors"},
    {"key length past EOF", m_key_past_eof, PS_ERR_FORMAT, "key of 1000000 bytes at offset 24 runs past the end"},
    {"string length past EOF", m_str_past_eof, PS_ERR_FORMAT, "key 'a': string value of 500 bytes"},
    {"array count overflow", m_arr_overflow, PS_ERR_FORMAT, "array of 4611686018427387904 UINT32 elements"},
    {"string array count", m_str_arr_count, PS_ERR_FORMAT, "array of 1000 STRING elements"},
    {"nested count claims siblings' bytes", m_nested_claim, PS_ERR_FORMAT, "array of 100 STRING elements"},
    {"array claims later keys' bytes", m_kv_claim, PS_ERR_FORMAT, "array of 4 STRING elements"},
    {"bad value type", m_bad_vtype, PS_ERR_FORMAT, "key 'a': unknown value type 13"},
    {"bad element type", m_bad_elem_type, PS_ERR_FORMAT, "unknown array element type 99"},
    {"too-deep nesting", m_too_deep, PS_ERR_FORMAT, "nested more than 8 levels"},
    {"duplicate key", m_dup_key, PS_ERR_FORMAT, "duplicate metadata key 'general.x'"},
    {"empty key", m_empty_key, PS_ERR_FORMAT, "empty key"},
    {"NUL in key", m_nul_key, PS_ERR_FORMAT, "contains a NUL byte"},
    {"bool not 0/1", m_bad_bool, PS_ERR_FORMAT, "key 'flag': bool value"},
    {"alignment 48", m_align_48, PS_ERR_FORMAT, "general.alignment is 48, must be a nonzero power of two"},
    {"alignment 0", m_align_0, PS_ERR_FORMAT, "general.alignment is 0"},
    {"alignment type", m_align_type, PS_ERR_FORMAT, "general.alignment has type UINT64"},
    {"n_dims 0", m_ndims0, PS_ERR_FORMAT, "tensor 'blk.0.attn_q.weight': n_dims 0 is outside 1..4"},
    {"n_dims 5", m_ndims5, PS_ERR_FORMAT, "n_dims 5 is outside 1..4"},
    {"dimension 0", m_dim_zero, PS_ERR_FORMAT, "dimension 1 is 0"},
    {"element count overflow", m_nel_overflow, PS_ERR_FORMAT, "element count overflows"},
    {"unknown tensor type", m_bad_ttype, PS_ERR_FORMAT, "unknown tensor type 99"},
    {"row not whole blocks", m_row_block, PS_ERR_FORMAT, "row length 33 is not a multiple of the Q4_0 block size 32"},
    {"offset misaligned", m_misaligned, PS_ERR_FORMAT, "offset 16 is not a multiple of the alignment 32"},
    {"data past EOF", m_past_eof, PS_ERR_FORMAT,
     "tensor 'blk.0.attn_q.weight': data [offset 0, 256 bytes] runs past the end of the file"},
    {"offset near 2^64", m_offset_huge, PS_ERR_FORMAT, "runs past the end of the file"},
    {"overlapping tensors", m_overlap, PS_ERR_FORMAT,
     "tensors 'a' [offset 0, 64 bytes] and 'b' [offset 32, 64 bytes] overlap"},
    {"duplicate tensor", m_dup_tensor, PS_ERR_FORMAT, "duplicate tensor name 'a'"},
    {"truncated tensor info", m_tinfo_trunc, PS_ERR_FORMAT, "tensor 'tensor.name': dimension at offset"},
};

static void test_malformed(void) {
    for (size_t i = 0; i < PS_ARRAY_LEN(malformed); i++) {
        blob b = {0};
        char err[512] = "";
        void *copy;
        ps_gguf *g = (ps_gguf *)1;
        malformed[i].build(&b);
        ps_status s = open_blob(&b, b.n, &g, err, sizeof err, &copy);
        PS_CHECK_EQ_INT(s, malformed[i].want);
        PS_CHECK(g == NULL);
        if (!strstr(err, malformed[i].substr)) {
            PS_CHECK(!"error message lacks the expected text");
            fprintf(stderr, "  case '%s': got \"%s\", want \"...%s...\"\n", malformed[i].name, err,
                    malformed[i].substr);
        }
        ps_gguf_close(g);
        free(copy);
        free(b.p);
    }
    /* nesting at exactly the limit is fine */
    blob b = {0};
    char err[256] = "";
    void *copy;
    ps_gguf *g = NULL;
    b_nested(&b, 8);
    PS_CHECK_OK(open_blob(&b, b.n, &g, err, sizeof err, &copy));
    if (g) {
        const ps_gguf_value *v = ps_gguf_get(g, "deep");
        int depth = 0;
        while (v && v->type == PS_GGUF_ARRAY && v->arr.type == PS_GGUF_ARRAY) v = &v->arr.elems[0], depth++;
        PS_CHECK_EQ_INT(depth, 7);
        PS_CHECK(v && v->arr.type == PS_GGUF_U8 && v->arr.n == 0);
    }
    ps_gguf_close(g);
    free(copy);
    free(b.p);
}

/* Round trip ------------------------------------------------------------------------------ */

/* True when two values are equal, recursively (numeric arrays compared as bytes). */
static bool value_eq(const ps_gguf_value *a, const ps_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case PS_GGUF_U8:
    case PS_GGUF_U16:
    case PS_GGUF_U32:
    case PS_GGUF_U64: return a->u64 == b->u64;
    case PS_GGUF_I8:
    case PS_GGUF_I16:
    case PS_GGUF_I32:
    case PS_GGUF_I64: return a->i64 == b->i64;
    case PS_GGUF_F32:
    case PS_GGUF_F64: return memcmp(&a->f64, &b->f64, 8) == 0;
    case PS_GGUF_BOOL: return a->b == b->b;
    case PS_GGUF_STRING:
        return a->str.len == b->str.len && (!a->str.len || !memcmp(a->str.data, b->str.data, a->str.len));
    default: break;
    }
    if (a->arr.type != b->arr.type || a->arr.n != b->arr.n) return false;
    for (uint64_t i = 0; i < a->arr.n; i++) {
        if (a->arr.type == PS_GGUF_STRING) {
            ps_gguf_value x = {.type = PS_GGUF_STRING, .str = a->arr.strs[i]};
            ps_gguf_value y = {.type = PS_GGUF_STRING, .str = b->arr.strs[i]};
            if (!value_eq(&x, &y)) return false;
        } else if (a->arr.type == PS_GGUF_ARRAY) {
            if (!value_eq(&a->arr.elems[i], &b->arr.elems[i])) return false;
        } else {
            if (ps_gguf_arr_int(a, i) != ps_gguf_arr_int(b, i)) return false;
            double x = ps_gguf_arr_float(a, i), y = ps_gguf_arr_float(b, i);
            if (memcmp(&x, &y, 8)) return false;
        }
    }
    return true;
}

typedef struct {
    const char *key;
    ps_gguf_value v;
} kv_case;

static uint8_t u8s[] = {0, 1, 255};
static int8_t i8s[] = {-128, 0, 127};
static uint16_t u16s[] = {0, 65535};
static int16_t i16s[] = {-32768, 32767};
static uint32_t u32s[] = {0, 1, 4294967295u};
static int32_t i32s[] = {INT32_MIN, -1, INT32_MAX};
static float f32s[] = {0.5f, -1.25f, 3.0e38f, 1e-45f};
static uint8_t bools[] = {1, 0, 1};
static uint64_t u64s[] = {0, UINT64_MAX};
static int64_t i64s[] = {INT64_MIN, INT64_MAX};
static double f64s[] = {0.1, -2.5e300};
static ps_gguf_str strs_a[] = {{5, "hello"}, {0, ""}, {7, "w\0rld!!"}};
static ps_gguf_str strs_b[] = {{3, "\xc3\xa9t"}};
static ps_gguf_value inner_str_arrays[2];
static ps_gguf_value inner_i32_arrays[2], mid_arrays[1];

#define ARR(t, d)                                                                                                      \
    {                                                                                                                  \
        .type = PS_GGUF_ARRAY, .arr = {.type = (t), .n = PS_ARRAY_LEN(d), .data = (d) }                                \
    }

static kv_case kv_cases[] = {
    {"general.architecture", {.type = PS_GGUF_STRING, .str = {5, "llama"}}},
    {"t.u8", {.type = PS_GGUF_U8, .u64 = 200}},
    {"t.i8", {.type = PS_GGUF_I8, .i64 = -100}},
    {"t.u16", {.type = PS_GGUF_U16, .u64 = 60000}},
    {"t.i16", {.type = PS_GGUF_I16, .i64 = -30000}},
    {"t.u32", {.type = PS_GGUF_U32, .u64 = 4000000000u}},
    {"t.i32", {.type = PS_GGUF_I32, .i64 = -2000000000}},
    {"t.f32", {.type = PS_GGUF_F32, .f64 = 0.15625}},
    {"t.bool", {.type = PS_GGUF_BOOL, .b = true}},
    {"t.str", {.type = PS_GGUF_STRING, .str = {11, "a\0b \xe2\x82\xac quote\""}}},
    {"t.str_empty", {.type = PS_GGUF_STRING, .str = {0, ""}}},
    {"t.u64", {.type = PS_GGUF_U64, .u64 = UINT64_MAX}},
    {"t.i64", {.type = PS_GGUF_I64, .i64 = INT64_MIN}},
    {"t.f64", {.type = PS_GGUF_F64, .f64 = 1.0 / 3.0}},
    {"a.u8", ARR(PS_GGUF_U8, u8s)},
    {"a.i8", ARR(PS_GGUF_I8, i8s)},
    {"a.u16", ARR(PS_GGUF_U16, u16s)},
    {"a.i16", ARR(PS_GGUF_I16, i16s)},
    {"a.u32", ARR(PS_GGUF_U32, u32s)},
    {"a.i32", ARR(PS_GGUF_I32, i32s)},
    {"a.f32", ARR(PS_GGUF_F32, f32s)},
    {"a.bool", ARR(PS_GGUF_BOOL, bools)},
    {"a.u64", ARR(PS_GGUF_U64, u64s)},
    {"a.i64", ARR(PS_GGUF_I64, i64s)},
    {"a.f64", ARR(PS_GGUF_F64, f64s)},
    {"a.empty", {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_F32, .n = 0}}},
    {"a.str", {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_STRING, .n = 3, .strs = strs_a}}},
    {"a.arr_str", {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 2, .elems = inner_str_arrays}}},
    {"a.arr_arr_i32", {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 1, .elems = mid_arrays}}},
    {"a.arr_empty", {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 0}}},
};

static void init_nested(void) {
    inner_str_arrays[0] =
        (ps_gguf_value){.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_STRING, .n = 3, .strs = strs_a}};
    inner_str_arrays[1] =
        (ps_gguf_value){.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_STRING, .n = 1, .strs = strs_b}};
    inner_i32_arrays[0] = (ps_gguf_value)ARR(PS_GGUF_I32, i32s);
    inner_i32_arrays[1] = (ps_gguf_value)ARR(PS_GGUF_U8, u8s); /* elements of one array may differ in type */
    mid_arrays[0] =
        (ps_gguf_value){.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 2, .elems = inner_i32_arrays}};
}

/* Tensors of the round trip: shapes chosen so that most sizes are not multiples of the
 * alignment (padding between them), the last one a multiple (no padding at the end). */
static const struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    bool use_fill;
} rt_tensors[] = {
    {"token_embd.weight", PS_TYPE_F32, 2, {8, 3, 1, 1}, false},
    {"blk.0.attn_q.weight", PS_TYPE_Q4_0, 2, {64, 3, 1, 1}, true},
    {"blk.0.ffn_up.weight", PS_TYPE_F16, 3, {5, 3, 2, 1}, false},
    {"blk.1.attn_k.weight", PS_TYPE_Q8_0, 4, {32, 1, 1, 2}, true},
    {"output.weight", PS_TYPE_BF16, 1, {7, 1, 1, 1}, true},
    {"output_norm.weight", PS_TYPE_F32, 1, {64, 1, 1, 1}, false},
};

static uint8_t pattern(int64_t index, size_t j) { return (uint8_t)(index * 37 + j * 11 + (j >> 8)); }

static ps_status fill_pattern(void *ctx, int64_t index, void *buf, size_t nbytes, char *err, size_t errlen) {
    (void)err, (void)errlen;
    int *calls = ctx;
    (*calls)++;
    for (size_t j = 0; j < nbytes; j++) ((uint8_t *)buf)[j] = pattern(index, j);
    return PS_OK;
}

typedef struct {
    int calls;
    uint64_t last_done, total;
    bool monotone;
} progress_log;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_log *p = ctx;
    if (done < p->last_done || (p->total && total != p->total)) p->monotone = false;
    p->calls++;
    p->last_done = done;
    p->total = total;
}

/* Writes the round-trip file (all kv_cases, all rt_tensors) and returns its path. */
static const char *write_roundtrip(uint32_t version, uint32_t alignment, const char *name, uint8_t **given) {
    ps_gguf_writer *w = NULL;
    char err[256] = "";
    int fills = 0;
    progress_log prog = {.monotone = true};
    PS_CHECK_OK(ps_gguf_writer_create(&w, version, alignment));
    if (!w) return NULL;
    for (size_t i = 0; i < PS_ARRAY_LEN(kv_cases); i++)
        PS_CHECK_OK(ps_gguf_writer_set_value(w, kv_cases[i].key, &kv_cases[i].v));
    /* the typed setters, and replacing a value in place */
    PS_CHECK_OK(ps_gguf_writer_set_u32(w, "s.u32", 7));
    PS_CHECK_OK(ps_gguf_writer_set_i32(w, "s.i32", -7));
    PS_CHECK_OK(ps_gguf_writer_set_u64(w, "s.u64", 1ull << 40));
    PS_CHECK_OK(ps_gguf_writer_set_f32(w, "s.f32", 1e-5f));
    PS_CHECK_OK(ps_gguf_writer_set_bool(w, "s.bool", false));
    PS_CHECK_OK(ps_gguf_writer_set_str(w, "s.str", "first"));
    PS_CHECK_OK(ps_gguf_writer_set_arr(w, "s.arr", PS_GGUF_I32, i32s, 3));
    const char *toks[] = {"<s>", "</s>", "\xe2\x96\x81hi"};
    PS_CHECK_OK(ps_gguf_writer_set_arr_str(w, "s.toks", toks, 3));
    PS_CHECK_OK(ps_gguf_writer_set_u32(w, "s.u32", 8)); /* replace: keeps position */
    PS_CHECK_OK(ps_gguf_writer_set_str(w, "s.bool", "now a string"));
    for (size_t i = 0; i < PS_ARRAY_LEN(rt_tensors); i++) {
        size_t nbytes = ps_row_bytes(rt_tensors[i].type, rt_tensors[i].ne[0]) * rt_tensors[i].ne[1] *
                        rt_tensors[i].ne[2] * rt_tensors[i].ne[3];
        given[i] = malloc(nbytes);
        for (size_t j = 0; j < nbytes; j++) given[i][j] = pattern((int64_t)i, j);
        PS_CHECK_OK(ps_gguf_writer_add_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dims,
                                              rt_tensors[i].ne, rt_tensors[i].use_fill ? NULL : given[i],
                                              rt_tensors[i].use_fill ? fill_pattern : NULL, &fills));
    }
    const char *path = ps_test_tmp(name);
    PS_CHECK_OK(ps_gguf_writer_write(w, path, on_progress, &prog, err, sizeof err));
    PS_CHECK_EQ_INT(fills, 3);
    PS_CHECK_EQ_INT(prog.calls, PS_ARRAY_LEN(rt_tensors));
    PS_CHECK(prog.monotone && prog.last_done == prog.total && prog.total > 0);
    ps_gguf_writer_free(w);
    return path;
}

static void check_roundtrip(const ps_gguf *g, uint32_t version, uint32_t alignment, uint8_t **given) {
    char err[256] = "";
    PS_CHECK_EQ_INT(ps_gguf_version(g), version);
    PS_CHECK_EQ_INT(ps_gguf_alignment(g), alignment);
    PS_CHECK_EQ_INT(ps_gguf_data_offset(g) % alignment, 0);
    int64_t extra = alignment != 32; /* general.alignment comes first */
    PS_CHECK_EQ_INT(ps_gguf_n_kv(g), (int64_t)PS_ARRAY_LEN(kv_cases) + 8 + extra);
    if (extra) {
        PS_CHECK(!strcmp(ps_gguf_kv_key(g, 0), "general.alignment"));
        PS_CHECK(ps_gguf_kv_value(g, 0)->type == PS_GGUF_U32 && ps_gguf_kv_value(g, 0)->u64 == alignment);
    }
    for (size_t i = 0; i < PS_ARRAY_LEN(kv_cases); i++) {
        const char *key = ps_gguf_kv_key(g, (int64_t)i + extra);
        PS_CHECK(key && !strcmp(key, kv_cases[i].key));
        const ps_gguf_value *v = ps_gguf_get(g, kv_cases[i].key);
        PS_CHECK(v == ps_gguf_kv_value(g, (int64_t)i + extra));
        if (!v || !value_eq(v, &kv_cases[i].v)) {
            PS_CHECK(!"value differs after the round trip");
            fprintf(stderr, "  key %s\n", kv_cases[i].key);
        }
    }
    int64_t s0 = (int64_t)PS_ARRAY_LEN(kv_cases) + extra;
    PS_CHECK(!strcmp(ps_gguf_kv_key(g, s0), "s.u32") && ps_gguf_kv_value(g, s0)->u64 == 8);
    PS_CHECK(!strcmp(ps_gguf_kv_key(g, s0 + 4), "s.bool") && ps_gguf_kv_value(g, s0 + 4)->type == PS_GGUF_STRING);
    PS_CHECK(ps_gguf_get(g, "missing") == NULL);
    PS_CHECK(ps_gguf_kv_key(g, -1) == NULL && ps_gguf_kv_key(g, 1000) == NULL);

    /* typed getters */
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    ps_gguf_str str;
    const ps_gguf_value *arr;
    PS_CHECK_OK(ps_gguf_get_u32(g, "t.u8", &u32, err, sizeof err));
    PS_CHECK_EQ_INT(u32, 200);
    PS_CHECK_OK(ps_gguf_get_u32(g, "t.u32", &u32, err, sizeof err));
    PS_CHECK_EQ_INT(u32, 4000000000u);
    PS_CHECK_EQ_INT(ps_gguf_get_u32(g, "t.i8", &u32, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "'t.i8' = -100 does not fit in UINT32"));
    PS_CHECK_EQ_INT(ps_gguf_get_u32(g, "t.u64", &u32, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_EQ_INT(ps_gguf_get_u32(g, "t.str", &u32, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "'t.str' has type STRING"));
    PS_CHECK_EQ_INT(ps_gguf_get_u32(g, "nope", &u32, err, sizeof err), PS_ERR_NOT_FOUND);
    PS_CHECK(strstr(err, "'nope'"));
    PS_CHECK_OK(ps_gguf_get_i64(g, "t.i64", &i64, err, sizeof err));
    PS_CHECK(i64 == INT64_MIN);
    PS_CHECK_OK(ps_gguf_get_i64(g, "t.u32", &i64, err, sizeof err));
    PS_CHECK_EQ_INT(i64, 4000000000u);
    PS_CHECK_EQ_INT(ps_gguf_get_i64(g, "t.u64", &i64, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_EQ_INT(ps_gguf_get_i64(g, "t.f32", &i64, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_OK(ps_gguf_get_f32(g, "t.f32", &f32, err, sizeof err));
    PS_CHECK(f32 == 0.15625f);
    PS_CHECK_OK(ps_gguf_get_f32(g, "t.f64", &f32, err, sizeof err));
    PS_CHECK(f32 == (float)(1.0 / 3.0));
    PS_CHECK_EQ_INT(ps_gguf_get_f32(g, "t.u8", &f32, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_OK(ps_gguf_get_bool(g, "t.bool", &b, err, sizeof err));
    PS_CHECK(b);
    PS_CHECK_EQ_INT(ps_gguf_get_bool(g, "t.u8", &b, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_OK(ps_gguf_get_str(g, "general.architecture", &str, err, sizeof err));
    PS_CHECK(ps_gguf_str_eq(str, "llama") && !ps_gguf_str_eq(str, "llam") && !ps_gguf_str_eq(str, "llamas"));
    PS_CHECK_OK(ps_gguf_get_arr(g, "s.toks", PS_GGUF_STRING, &arr, err, sizeof err));
    PS_CHECK(arr->arr.n == 3 && ps_gguf_str_eq(arr->arr.strs[2], "\xe2\x96\x81hi"));
    PS_CHECK_EQ_INT(ps_gguf_get_arr(g, "s.toks", PS_GGUF_I32, &arr, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "is an array of STRING, expected an array of INT32"));
    PS_CHECK_EQ_INT(ps_gguf_get_arr(g, "t.u8", PS_GGUF_I32, &arr, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK_OK(ps_gguf_get_arr(g, "a.i16", PS_GGUF_I16, &arr, err, sizeof err));
    PS_CHECK_EQ_INT(ps_gguf_arr_int(arr, 0), -32768);
    PS_CHECK_OK(ps_gguf_get_arr(g, "a.f32", PS_GGUF_F32, &arr, err, sizeof err));
    PS_CHECK(ps_gguf_arr_float(arr, 1) == -1.25);
    PS_CHECK_OK(ps_gguf_get_arr(g, "a.u64", PS_GGUF_U64, &arr, err, sizeof err));
    PS_CHECK(ps_gguf_arr_float(arr, 1) == (double)UINT64_MAX);

    /* tensors */
    PS_CHECK_EQ_INT(ps_gguf_n_tensors(g), PS_ARRAY_LEN(rt_tensors));
    uint64_t end = 0;
    for (size_t i = 0; i < PS_ARRAY_LEN(rt_tensors); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, (int64_t)i);
        PS_CHECK(t && t == ps_gguf_find_tensor(g, rt_tensors[i].name));
        if (!t) continue;
        PS_CHECK(!strcmp(t->name, rt_tensors[i].name));
        PS_CHECK_EQ_INT(t->type, rt_tensors[i].type);
        PS_CHECK_EQ_INT(t->n_dims, rt_tensors[i].n_dims);
        for (int d = 0; d < 4; d++) PS_CHECK_EQ_INT(t->ne[d], rt_tensors[i].ne[d]);
        PS_CHECK_EQ_INT(t->offset % alignment, 0);
        PS_CHECK_EQ_INT(t->offset, end); /* packed in add order */
        PS_CHECK((const uint8_t *)t->data == (const uint8_t *)ps_gguf_tensor_at(g, 0)->data + t->offset);
        PS_CHECK(memcmp(t->data, given[i], t->nbytes) == 0);
        end = t->offset + (t->nbytes + alignment - 1) / alignment * alignment;
    }
    PS_CHECK_EQ_INT(ps_gguf_file_size(g), ps_gguf_data_offset(g) + end);
    PS_CHECK(ps_gguf_find_tensor(g, "nope") == NULL && ps_gguf_tensor_at(g, 99) == NULL);
}

/* Touches every byte a reader hands out, so that ASan sees any pointer past the buffer. */
static unsigned walk_value(const ps_gguf_value *v) {
    unsigned h = 0;
    if (v->type == PS_GGUF_STRING)
        for (uint64_t i = 0; i < v->str.len; i++) h += (uint8_t)v->str.data[i];
    if (v->type != PS_GGUF_ARRAY) return h + (unsigned)v->u64;
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (v->arr.type == PS_GGUF_STRING) {
            ps_gguf_value s = {.type = PS_GGUF_STRING, .str = v->arr.strs[i]};
            h += walk_value(&s);
        } else if (v->arr.type == PS_GGUF_ARRAY) {
            h += walk_value(&v->arr.elems[i]);
        } else {
            h += (unsigned)ps_gguf_arr_int(v, i);
        }
    }
    return h;
}

static unsigned walk(const ps_gguf *g) {
    unsigned h = 0;
    for (int64_t i = 0; i < ps_gguf_n_kv(g); i++)
        h += walk_value(ps_gguf_kv_value(g, i)) + (unsigned)strlen(ps_gguf_kv_key(g, i));
    for (int64_t i = 0; i < ps_gguf_n_tensors(g); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, i);
        for (size_t j = 0; j < t->nbytes; j++) h += ((const uint8_t *)t->data)[j];
        h += (unsigned)strlen(t->name);
    }
    return h;
}

/* Every prefix of a valid file that cuts into its tensor data is rejected; prefixes that
 * only drop trailing padding are still valid. */
static void test_truncation(const char *path) {
    size_t len = 0;
    uint8_t *file = ps_test_read_file(path, &len);
    PS_CHECK(file && len > 0);
    if (!file) return;
    ps_gguf *full = NULL;
    char err[512];
    PS_CHECK_OK(ps_gguf_open_mem(file, len, &full, err, sizeof err));
    size_t end = 0;
    for (int64_t i = 0; full && i < ps_gguf_n_tensors(full); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(full, i);
        size_t e = ps_gguf_data_offset(full) + t->offset + t->nbytes;
        if (e > end) end = e;
    }
    ps_gguf_close(full);
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        blob b = {file, len, len};
        void *copy;
        ps_gguf *g = NULL;
        err[0] = 0;
        ps_status s = open_blob(&b, n, &g, err, sizeof err, &copy);
        bool ok = n >= end ? s == PS_OK && g : s != PS_OK && !g && err[0];
        if (!ok && bad++ < 5)
            fprintf(stderr, "  truncated to %zu of %zu bytes: status %d, err \"%s\"\n", n, len, s, err);
        if (g) walk(g);
        ps_gguf_close(g);
        free(copy);
    }
    PS_CHECK_EQ_INT(bad, 0);
    free(file);
}

/* Random byte corruption in the header, metadata and tensor infos: never a crash; a file
 * that still opens is walked completely. */
static void test_corruption(const char *path) {
    size_t len = 0;
    uint8_t *file = ps_test_read_file(path, &len);
    if (!file) return;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int opened = 0, iters = 20000;
    for (int it = 0; it < iters; it++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, file, len);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % (len < 1024 ? len : 1024)); /* the head of the file */
            uint8_t v = (uint8_t)(rng >> 32);
            copy[at] = (it & 1) ? v : (uint8_t)(copy[at] ^ (1u << (v & 7)));
        }
        ps_gguf *g = NULL;
        char err[512] = "";
        ps_status s = ps_gguf_open_mem(copy, len, &g, err, sizeof err);
        if (s == PS_OK) {
            opened++;
            walk(g);
        } else {
            PS_CHECK(g == NULL && err[0] && strlen(err) < sizeof err - 1 && !strchr(err, '\n'));
        }
        ps_gguf_close(g);
        free(copy);
    }
    PS_CHECK(opened < iters);
    free(file);
}

static void test_roundtrip(void) {
    init_nested();
    uint8_t *given[PS_ARRAY_LEN(rt_tensors)];
    const struct {
        uint32_t version, alignment;
        const char *name;
    } variants[] = {{3, 32, "gguf_rt_v3.gguf"}, {2, 64, "gguf_rt_v2_a64.gguf"}, {3, 8, "gguf_rt_v3_a8.gguf"}};
    for (size_t v = 0; v < PS_ARRAY_LEN(variants); v++) {
        char path[4096], err[512] = "";
        const char *p = write_roundtrip(variants[v].version, variants[v].alignment, variants[v].name, given);
        if (!p) continue;
        snprintf(path, sizeof path, "%s", p);
        for (int how = PS_GGUF_MAP; how <= PS_GGUF_HUGE; how++) { /* mapped, and read into huge pages */
            ps_gguf *g = NULL;
            PS_CHECK_OK(ps_gguf_open_with(path, (ps_gguf_load)how, &g, err, sizeof err));
            if (*err) fprintf(stderr, "  %s\n", err);
            if (g) check_roundtrip(g, variants[v].version, variants[v].alignment, given);
            ps_gguf_close(g);
        }
        struct stat st;
        snprintf(path + strlen(path), sizeof path - strlen(path), ".tmp");
        PS_CHECK(stat(path, &st) < 0 && errno == ENOENT); /* no temporary left behind */
        path[strlen(path) - 4] = 0;
        if (v == 0) {
            test_truncation(path);
            test_corruption(path);
        }
        for (size_t i = 0; i < PS_ARRAY_LEN(rt_tensors); i++) free(given[i]);
    }
}

/* Writer errors --------------------------------------------------------------------------- */

static ps_status fill_fails(void *ctx, int64_t index, void *buf, size_t nbytes, char *err, size_t errlen) {
    (void)ctx, (void)buf, (void)nbytes;
    return ps_errf(err, errlen, PS_ERR_IO, "disk says no (tensor %lld)", (long long)index);
}

static void test_writer_errors(void) {
    ps_gguf_writer *w = NULL;
    char err[512] = "";
    int64_t ne[4] = {32, 2, 1, 1};
    static float zeros[64];
    PS_CHECK_EQ_INT(ps_gguf_writer_create(&w, 1, 32), PS_ERR_ARG);
    PS_CHECK(w == NULL);
    PS_CHECK_EQ_INT(ps_gguf_writer_create(&w, 3, 48), PS_ERR_ARG);
    PS_CHECK_OK(ps_gguf_writer_create(&w, 3, 0));
    if (!w) return;
    PS_CHECK_EQ_INT(ps_gguf_writer_set_u32(w, "", 1), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_u32(w, "general.alignment", 48), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_u64(w, "general.alignment", 64), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_value(w, "x", &(ps_gguf_value){.type = PS_GGUF_U8, .u64 = 256}), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_value(w, "x", &(ps_gguf_value){.type = PS_GGUF_I16, .i64 = -40000}), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_value(w, "x", &(ps_gguf_value){.type = (ps_gguf_vtype)13}), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_set_arr(w, "x", PS_GGUF_STRING, zeros, 1), PS_ERR_ARG);
    uint8_t two = 2;
    PS_CHECK_EQ_INT(ps_gguf_writer_set_arr(w, "x", PS_GGUF_BOOL, &two, 1), PS_ERR_ARG);
    /* nesting: 8 levels accepted, 9 refused */
    ps_gguf_value lv[10];
    lv[0] = (ps_gguf_value){.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_U8, .n = 0}};
    for (int i = 1; i < 10; i++)
        lv[i] = (ps_gguf_value){.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 1, .elems = &lv[i - 1]}};
    PS_CHECK_OK(ps_gguf_writer_set_value(w, "deep8", &lv[7]));
    PS_CHECK_EQ_INT(ps_gguf_writer_set_value(w, "deep9", &lv[8]), PS_ERR_ARG);
    ps_gguf_value not_arr = {.type = PS_GGUF_U8, .u64 = 1};
    ps_gguf_value bad_nest = {.type = PS_GGUF_ARRAY, .arr = {.type = PS_GGUF_ARRAY, .n = 1, .elems = &not_arr}};
    PS_CHECK_EQ_INT(ps_gguf_writer_set_value(w, "bad", &bad_nest), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", 99, 2, ne, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_Q4_0, 1, (int64_t[]){33}, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 0, ne, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 5, ne, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 2, (int64_t[]){4, 0}, zeros, NULL, NULL),
                    PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 2, ne, NULL, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "", PS_TYPE_F32, 2, ne, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_OK(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 2, ne, zeros, NULL, NULL));
    PS_CHECK_EQ_INT(ps_gguf_writer_add_tensor(w, "t", PS_TYPE_F32, 2, ne, zeros, NULL, NULL), PS_ERR_ARG);
    PS_CHECK_OK(ps_gguf_writer_add_tensor(w, "u", PS_TYPE_F32, 2, ne, NULL, fill_fails, NULL));

    /* a failing fill leaves neither the file nor its temporary, and keeps an old file */
    char path[4096], tmp[4100];
    snprintf(path, sizeof path, "%s", ps_test_tmp("gguf_fail.gguf"));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(path, "wb");
    PS_CHECK(f != NULL);
    if (f) fputs("old contents", f), fclose(f);
    PS_CHECK_EQ_INT(ps_gguf_writer_write(w, path, NULL, NULL, err, sizeof err), PS_ERR_IO);
    PS_CHECK(strstr(err, "tensor 'u': disk says no (tensor 1)"));
    size_t len = 0;
    uint8_t *old = ps_test_read_file(path, &len);
    PS_CHECK(old && len == 12 && !memcmp(old, "old contents", 12));
    free(old);
    PS_CHECK(access(tmp, F_OK) < 0);
    unlink(path);
    PS_CHECK_EQ_INT(ps_gguf_writer_write(w, path, NULL, NULL, err, sizeof err), PS_ERR_IO);
    PS_CHECK(access(path, F_OK) < 0 && access(tmp, F_OK) < 0);

    /* a directory that does not exist */
    PS_CHECK_EQ_INT(ps_gguf_writer_write(w, "/nonexistent-dir/x.gguf", NULL, NULL, err, sizeof err), PS_ERR_IO);
    PS_CHECK(strstr(err, "cannot create '/nonexistent-dir/x.gguf.tmp'") && strstr(err, strerror(ENOENT)));
    ps_gguf_writer_free(w);
    ps_gguf_writer_free(NULL);

    /* the nested value written at the depth limit reads back */
    PS_CHECK_OK(ps_gguf_writer_create(&w, 3, 32));
    PS_CHECK_OK(ps_gguf_writer_set_value(w, "deep8", &lv[7]));
    PS_CHECK_OK(ps_gguf_writer_write(w, path, NULL, NULL, err, sizeof err));
    ps_gguf_writer_free(w);
    ps_gguf *g = NULL;
    PS_CHECK_OK(ps_gguf_open(path, &g, err, sizeof err));
    PS_CHECK(g && value_eq(ps_gguf_get(g, "deep8"), &lv[7]) && ps_gguf_n_tensors(g) == 0);
    ps_gguf_close(g);
    unlink(path);
}

/* Opening things that are not GGUF files -------------------------------------------------- */

static void test_open_errors(void) {
    ps_gguf *g = (ps_gguf *)1;
    char err[512] = "";
    const char *missing = "/nonexistent-dir/model.gguf";
    PS_CHECK_EQ_INT(ps_gguf_open(missing, &g, err, sizeof err), PS_ERR_IO);
    PS_CHECK(g == NULL);
    PS_CHECK(strstr(err, missing) && strstr(err, strerror(ENOENT)));

    char path[4096];
    snprintf(path, sizeof path, "%s", ps_test_tmp("gguf_not.txt"));
    FILE *f = fopen(path, "wb");
    if (f) fputs("#!/bin/sh\necho this is not a model\n", f), fclose(f);
    PS_CHECK_EQ_INT(ps_gguf_open(path, &g, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, path) && strstr(err, "not a GGUF file"));
    f = fopen(path, "wb");
    if (f) fclose(f);
    PS_CHECK_EQ_INT(ps_gguf_open(path, &g, err, sizeof err), PS_ERR_FORMAT);
    PS_CHECK(strstr(err, "only 0 bytes"));
    unlink(path);

    snprintf(path, sizeof path, "%s", ps_test_tmp(""));
    PS_CHECK_EQ_INT(ps_gguf_open(path, &g, err, sizeof err), PS_ERR_IO);
    PS_CHECK(strstr(err, "not a regular file"));
    PS_CHECK_EQ_INT(ps_gguf_open_mem(NULL, 5, &g, err, sizeof err), PS_ERR_ARG);
    ps_gguf_close(NULL);
}

/* Real models ----------------------------------------------------------------------------- */

/* Copies every key and tensor of g into a new file, reopens it and compares. */
static void copy_and_compare(const ps_gguf *g, const char *name, bool with_tensors) {
    ps_gguf_writer *w = NULL;
    char err[512] = "", path[4096];
    PS_CHECK_OK(ps_gguf_writer_create(&w, 3, ps_gguf_alignment(g)));
    if (!w) return;
    for (int64_t i = 0; i < ps_gguf_n_kv(g); i++)
        PS_CHECK_OK(ps_gguf_writer_set_value(w, ps_gguf_kv_key(g, i), ps_gguf_kv_value(g, i)));
    for (int64_t i = 0; with_tensors && i < ps_gguf_n_tensors(g); i++) {
        const ps_gguf_tensor *t = ps_gguf_tensor_at(g, i);
        PS_CHECK_OK(ps_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    snprintf(path, sizeof path, "%s", ps_test_tmp(name));
    PS_CHECK_OK(ps_gguf_writer_write(w, path, NULL, NULL, err, sizeof err));
    ps_gguf_writer_free(w);
    ps_gguf *c = NULL;
    PS_CHECK_OK(ps_gguf_open(path, &c, err, sizeof err));
    if (!c) return;
    PS_CHECK_EQ_INT(ps_gguf_n_kv(c), ps_gguf_n_kv(g));
    for (int64_t i = 0; i < ps_gguf_n_kv(g) && i < ps_gguf_n_kv(c); i++) {
        PS_CHECK(!strcmp(ps_gguf_kv_key(c, i), ps_gguf_kv_key(g, i)));
        PS_CHECK(value_eq(ps_gguf_kv_value(c, i), ps_gguf_kv_value(g, i)));
    }
    PS_CHECK_EQ_INT(ps_gguf_n_tensors(c), with_tensors ? ps_gguf_n_tensors(g) : 0);
    for (int64_t i = 0; i < ps_gguf_n_tensors(c); i++) {
        const ps_gguf_tensor *a = ps_gguf_tensor_at(g, i), *b = ps_gguf_tensor_at(c, i);
        PS_CHECK(!strcmp(a->name, b->name) && a->type == b->type && a->n_dims == b->n_dims && a->nbytes == b->nbytes);
        PS_CHECK(!memcmp(a->ne, b->ne, sizeof a->ne) && !memcmp(a->data, b->data, a->nbytes));
    }
    ps_gguf_close(c);
    unlink(path);
}

static void check_model(const char *path, const char *arch, uint32_t layers, const char *copy_name, bool copy_tensors) {
    ps_gguf *g = NULL;
    char err[512] = "";
    ps_gguf_str s;
    uint32_t n;
    PS_CHECK_OK(ps_gguf_open(path, &g, err, sizeof err));
    if (!g) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    PS_CHECK_OK(ps_gguf_get_str(g, "general.architecture", &s, err, sizeof err));
    PS_CHECK(ps_gguf_str_eq(s, arch));
    char key[128];
    snprintf(key, sizeof key, "%s.block_count", arch);
    PS_CHECK_OK(ps_gguf_get_u32(g, key, &n, err, sizeof err));
    PS_CHECK_EQ_INT(n, layers);
    PS_CHECK(ps_gguf_find_tensor(g, "blk.0.attn_q.weight") != NULL);
    PS_CHECK(ps_gguf_find_tensor(g, "token_embd.weight") != NULL);
    walk(g);
    copy_and_compare(g, copy_name, copy_tensors);
    ps_gguf_close(g);
}

static int test_models(void) {
    int found = 0;
    const char *stories = ps_test_shared_model("stories260K.gguf");
    if (stories) {
        found++;
        check_model(stories, "llama", 5, "gguf_copy_stories.gguf", true);
    } else {
        ps_test_skip_part("stories260K.gguf is absent (only CI has ../shared/models): its checks");
    }
    const char *cache = getenv("PS_MODEL_CACHE");
    char smol[4096];
    snprintf(smol, sizeof smol, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache && *cache ? cache : ".cache/models");
    if (access(smol, R_OK) == 0) {
        found++;
        check_model(smol, "llama", 30, "gguf_copy_smol_meta.gguf", false);
    } else {
        ps_test_skip_part("SmolLM2-135M-Instruct.Q4_1.gguf is absent (scripts/setup.sh fetches it): its checks");
    }
    return found;
}

int main(void) {
    test_malformed();
    test_roundtrip();
    test_writer_errors();
    test_open_errors();
    test_models();
    return ps_test_done();
}
