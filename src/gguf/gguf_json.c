/* gguf_json.c - GGUF values and tensors as cJSON trees: JSON string escaping with UTF-8
 * validation, exact numbers, metadata values and objects, tensor descriptions. */
#include "gguf_json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/types.h"

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
    char *out = ps_malloc(n * 6 + 3), *o = out;
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
            if (c == '"' || c == '\\')
                *o++ = '\\', *o++ = (char)c;
            else if (c == '\n')
                *o++ = '\\', *o++ = 'n';
            else if (c == '\t')
                *o++ = '\\', *o++ = 't';
            else if (c < 0x20 || c == 0x7f)
                o += sprintf(o, "\\u%04x", c);
            else
                *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

/* A JSON string for n bytes: see gguf_json.h. The literal is made here (json_quote), since
 * cJSON would copy invalid UTF-8 through. */
cJSON *ps_gguf_json_str(const char *s, size_t n) {
    char *q = json_quote(s, n);
    cJSON *j = q ? cJSON_CreateRaw(q) : NULL;
    free(q);
    return j;
}

/* Integers printed exactly (cJSON numbers are doubles, which lose 64-bit values): unsigned... */
cJSON *ps_gguf_json_u64(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

/* ... and signed. */
cJSON *ps_gguf_json_i64(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

/* Floats printed with 17 digits: the exact double (for F32, the float widened), so that
 * a reader gets the stored value back bit for bit. NaN and infinities become strings. */
cJSON *ps_gguf_json_f64(double v) {
    char buf[40];
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

/* Adds item to obj under key (sanitized to valid UTF-8); frees item and returns false if
 * either is missing. */
bool ps_gguf_json_put(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return false;
    char *k = ps_strdup(key);
    if (!k) {
        cJSON_Delete(item);
        return false;
    }
    for (size_t i = 0, n = strlen(k); i < n;) {
        size_t len = utf8_len((unsigned char *)k + i, n - i);
        if (!len)
            k[i++] = '?';
        else
            i += len;
    }
    cJSON_AddItemToObject(obj, k, item);
    free(k);
    return true;
}

/* Appends item to arr; false when item is NULL (out of memory). */
bool ps_gguf_json_push(cJSON *arr, cJSON *item) {
    if (!item) return false;
    cJSON_AddItemToArray(arr, item);
    return true;
}

/* A metadata value as JSON: scalars as numbers, bools and strings; arrays of at most
 * max_array elements in full, longer ones as {"type": elem type, "n": count}. */
cJSON *ps_gguf_json_value(const ps_gguf_value *v, uint64_t max_array) {
    switch (v->type) {
    case PS_GGUF_U8:
    case PS_GGUF_U16:
    case PS_GGUF_U32:
    case PS_GGUF_U64: return ps_gguf_json_u64(v->u64);
    case PS_GGUF_I8:
    case PS_GGUF_I16:
    case PS_GGUF_I32:
    case PS_GGUF_I64: return ps_gguf_json_i64(v->i64);
    case PS_GGUF_F32:
    case PS_GGUF_F64: return ps_gguf_json_f64(v->f64);
    case PS_GGUF_BOOL: return cJSON_CreateBool(v->b);
    case PS_GGUF_STRING: return ps_gguf_json_str(v->str.data, (size_t)v->str.len);
    default: break;
    }
    if (v->arr.n > max_array) {
        cJSON *o = cJSON_CreateObject();
        if (o && ps_gguf_json_put(o, "type", cJSON_CreateString(ps_gguf_vtype_name(v->arr.type))) &&
            ps_gguf_json_put(o, "n", ps_gguf_json_u64(v->arr.n)))
            return o;
        cJSON_Delete(o);
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    for (uint64_t i = 0; a && i < v->arr.n; i++) {
        ps_gguf_value e = ps_gguf_arr_elem(v, i);
        if (!ps_gguf_json_push(a, ps_gguf_json_value(&e, max_array))) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Keys of g (those "<prefix>.<rest>" when prefix is set, named <rest>) with their values:
 * see gguf_json.h. */
cJSON *ps_gguf_json_metadata(const ps_gguf *g, const char *prefix, uint64_t max_array) {
    cJSON *o = cJSON_CreateObject();
    size_t plen = prefix ? strlen(prefix) : 0;
    for (int64_t i = 0; o && i < ps_gguf_n_kv(g); i++) {
        const char *key = ps_gguf_kv_key(g, i);
        if (prefix && (strncmp(key, prefix, plen) || key[plen] != '.')) continue;
        cJSON *v = ps_gguf_json_value(ps_gguf_kv_value(g, i), max_array);
        if (!ps_gguf_json_put(o, prefix ? key + plen + 1 : key, v)) {
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* One tensor: name, type, shape, offset in the data section and in the file, bytes. */
cJSON *ps_gguf_json_tensor(const ps_gguf *g, const ps_gguf_tensor *t) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ps_gguf_json_put(o, "name", ps_gguf_json_str(t->name, strlen(t->name))) &&
              ps_gguf_json_put(o, "type", cJSON_CreateString(ps_type_name(t->type))) &&
              ps_gguf_json_put(o, "type_id", ps_gguf_json_u64(t->type));
    cJSON *shape = ok ? cJSON_CreateArray() : NULL;
    ok = shape && ps_gguf_json_put(o, "shape", shape); /* on failure put frees shape */
    for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = ps_gguf_json_push(shape, ps_gguf_json_i64(t->ne[d]));
    if (ok && ps_gguf_json_put(o, "offset", ps_gguf_json_u64(t->offset)) &&
        ps_gguf_json_put(o, "file_offset", ps_gguf_json_u64(ps_gguf_data_offset(g) + t->offset)) &&
        ps_gguf_json_put(o, "bytes", ps_gguf_json_u64(t->nbytes)))
        return o;
    cJSON_Delete(o);
    return NULL;
}
