/* gguf_print.c - GGUF strings and metadata values as one line of text for people (the text
 * report of `pipeshard inspect`): control bytes escaped, long strings and arrays cut short. */
#include <inttypes.h>
#include <stdio.h>

#include "gguf.h"

/* Writes the len bytes of s (quoted when `quote`): see gguf.h. */
void ps_gguf_print_str(FILE *f, ps_gguf_str s, size_t max, bool quote) {
    if (quote) fputc('"', f);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    if (quote) fputc('"', f);
    if (s.len > max) fputs("...", f);
}

/* Prints a scalar (non-array) value; strings quoted and cut after max_str bytes. */
static void print_scalar(FILE *f, const ps_gguf_value *v, size_t max_str) {
    switch (v->type) {
    case PS_GGUF_U8:
    case PS_GGUF_U16:
    case PS_GGUF_U32:
    case PS_GGUF_U64: fprintf(f, "%" PRIu64, v->u64); break;
    case PS_GGUF_I8:
    case PS_GGUF_I16:
    case PS_GGUF_I32:
    case PS_GGUF_I64: fprintf(f, "%" PRId64, v->i64); break;
    case PS_GGUF_F32: fprintf(f, "%.9g", v->f64); break;
    case PS_GGUF_F64: fprintf(f, "%.17g", v->f64); break;
    case PS_GGUF_BOOL: fputs(v->b ? "true" : "false", f); break;
    case PS_GGUF_STRING: ps_gguf_print_str(f, v->str, max_str, true); break;
    default: break;
    }
}

/* Prints a value on one line: see gguf.h. Nested arrays recurse with the same limits. */
void ps_gguf_print_value(FILE *f, const ps_gguf_value *v, uint64_t max_elems, size_t max_str) {
    if (v->type != PS_GGUF_ARRAY) {
        print_scalar(f, v, max_str);
        return;
    }
    fprintf(f, "[%s x %" PRIu64 "]", ps_gguf_vtype_name(v->arr.type), v->arr.n);
    if (v->arr.n == 0) return;
    fputs(" [", f);
    for (uint64_t i = 0; i < v->arr.n && i < max_elems; i++) {
        ps_gguf_value e = ps_gguf_arr_elem(v, i);
        if (i) fputs(", ", f);
        ps_gguf_print_value(f, &e, max_elems, max_str);
    }
    fputs(v->arr.n > max_elems ? ", ...]" : "]", f);
}
