/* gguf_json.h - GGUF metadata values and tensor descriptions as JSON (cJSON trees), and the
 * JSON leaves a report about a GGUF file needs (`pipeshard inspect --json`).
 *
 * Strings become JSON strings whatever their bytes: control characters escaped, bytes that
 * are not valid UTF-8 replaced by U+FFFD. Integers print exactly (cJSON numbers are doubles,
 * which lose 64-bit values), floats with 17 digits. Every function returning a cJSON * gives
 * a new tree that the caller deletes with cJSON_Delete (or hands to a parent), or NULL when
 * out of memory. */
#ifndef PS_GGUF_JSON_H
#define PS_GGUF_JSON_H

#include <cjson/cJSON.h>

#include "gguf.h"

/* A JSON string for the n bytes at s. */
cJSON *ps_gguf_json_str(const char *s, size_t n);
/* Exact integer numbers. */
cJSON *ps_gguf_json_u64(uint64_t v);
cJSON *ps_gguf_json_i64(int64_t v);
/* The double v with 17 digits (for F32, the float widened), so that a reader gets the stored
 * value back bit for bit; NaN and infinities as the strings "nan", "inf", "-inf". */
cJSON *ps_gguf_json_f64(double v);

/* Adds item to obj under key (bytes of key that are not valid UTF-8 shown as '?'). False when
 * item is NULL or the key cannot be copied; item is then freed. */
bool ps_gguf_json_put(cJSON *obj, const char *key, cJSON *item);
/* Appends item to arr; false when item is NULL (out of memory). */
bool ps_gguf_json_push(cJSON *arr, cJSON *item);

/* A metadata value: scalars as numbers, bools and strings; arrays of at most max_array
 * elements in full (nested arrays likewise), longer ones as {"type": elem type, "n": count}. */
cJSON *ps_gguf_json_value(const ps_gguf_value *v, uint64_t max_array);
/* An object of the metadata keys in file order, values as ps_gguf_json_value. prefix NULL:
 * every key; else only the keys "<prefix>.<rest>", named <rest>. */
cJSON *ps_gguf_json_metadata(const ps_gguf *g, const char *prefix, uint64_t max_array);
/* One tensor of g: name, type, type_id, shape, offset (in the data section), file_offset, bytes. */
cJSON *ps_gguf_json_tensor(const ps_gguf *g, const ps_gguf_tensor *t);

#endif
