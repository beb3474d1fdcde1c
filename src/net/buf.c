/* buf.c - little-endian payload builders (ps_wbuf) and bounded readers (ps_rbuf), the
 * encoding of every message's payload (see net.h). Uses nothing else of src/net. */
#include <stdlib.h>
#include <string.h>

#include "net.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "buf.c writes little-endian fields with memcpy: port it before building on a big-endian host"
#endif

/* ---------------------------------------------------------------------------------------------
 * Payload builder */

void ps_wbuf_free(ps_wbuf *b) {
    free(b->p);
    *b = (ps_wbuf){0};
}

/* Room for n more bytes (doubling); false (and oom set) when that fails. */
static bool wbuf_reserve(ps_wbuf *b, size_t n) {
    if (b->oom) return false;
    if (n <= b->cap - b->len) return true;
    if (n > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < n) cap *= 2;
    uint8_t *p = ps_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void ps_wbuf_bytes(ps_wbuf *b, const void *p, size_t n) {
    if (!wbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
}

void ps_wbuf_u8(ps_wbuf *b, uint8_t v) { ps_wbuf_bytes(b, &v, 1); }
void ps_wbuf_u16(ps_wbuf *b, uint16_t v) { ps_wbuf_bytes(b, &v, 2); }
void ps_wbuf_u32(ps_wbuf *b, uint32_t v) { ps_wbuf_bytes(b, &v, 4); }
void ps_wbuf_u64(ps_wbuf *b, uint64_t v) { ps_wbuf_bytes(b, &v, 8); }
void ps_wbuf_i32(ps_wbuf *b, int32_t v) { ps_wbuf_bytes(b, &v, 4); }
void ps_wbuf_f32(ps_wbuf *b, float v) { ps_wbuf_bytes(b, &v, 4); }

/* A string longer than 4 GiB - 1 cannot be encoded: it sets oom (the message is lost). */
void ps_wbuf_str(ps_wbuf *b, const char *s) {
    size_t n = strlen(s);
    if (n > UINT32_MAX) {
        b->oom = true;
        return;
    }
    ps_wbuf_u32(b, (uint32_t)n);
    ps_wbuf_bytes(b, s, n);
}

/* ---------------------------------------------------------------------------------------------
 * Bounded reader */

const void *ps_rbuf_bytes(ps_rbuf *r, size_t n) {
    if (r->bad || r->off > r->len || n > r->len - r->off) {
        r->bad = true;
        return NULL;
    }
    const void *p = r->p + r->off;
    r->off += n;
    return p;
}

/* Copies n bytes at the cursor into out, or zeros when they are not there. */
static void rbuf_copy(ps_rbuf *r, void *out, size_t n) {
    const void *p = ps_rbuf_bytes(r, n);
    if (p)
        memcpy(out, p, n);
    else
        memset(out, 0, n);
}

uint8_t ps_rbuf_u8(ps_rbuf *r) {
    uint8_t v;
    rbuf_copy(r, &v, 1);
    return v;
}
uint16_t ps_rbuf_u16(ps_rbuf *r) {
    uint16_t v;
    rbuf_copy(r, &v, 2);
    return v;
}
uint32_t ps_rbuf_u32(ps_rbuf *r) {
    uint32_t v;
    rbuf_copy(r, &v, 4);
    return v;
}
uint64_t ps_rbuf_u64(ps_rbuf *r) {
    uint64_t v;
    rbuf_copy(r, &v, 8);
    return v;
}
int32_t ps_rbuf_i32(ps_rbuf *r) {
    int32_t v;
    rbuf_copy(r, &v, 4);
    return v;
}
float ps_rbuf_f32(ps_rbuf *r) {
    float v;
    rbuf_copy(r, &v, 4);
    return v;
}

/* out always ends up NUL-terminated (empty on failure) when cap > 0. */
void ps_rbuf_str(ps_rbuf *r, char *out, size_t cap) {
    if (cap > 0) out[0] = 0;
    uint32_t n = ps_rbuf_u32(r);
    if (r->bad) return;
    if (cap == 0 || n > cap - 1) {
        r->bad = true;
        return;
    }
    const char *p = ps_rbuf_bytes(r, n);
    if (!p) return;
    if (memchr(p, 0, n)) {
        r->bad = true;
        return;
    }
    memcpy(out, p, n);
    out[n] = 0;
}
