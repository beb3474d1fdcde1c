/* stop.c - the stop-string matcher (stop.h). The held text is short (less than the longest
 * stop string) and every push looks at it whole with the new bytes: the stop string that
 * completes first cuts, else the longest tail that starts a stop string stays held. */
#include "stop.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ps_stop {
    char *str[PS_STOP_MAX_STRINGS]; /* the stop strings, each non-empty */
    size_t len[PS_STOP_MAX_STRINGS];
    int n;
    char *buf; /* (cap) released bytes [0, start), then the held ones [start, n_buf) */
    size_t cap, start, n_buf;
    bool stopped; /* a stop string was found: nothing more is released */
};

ps_status ps_stop_create(const char *const *stops, int n, ps_stop **out, char *err, size_t errlen) {
    *out = NULL;
    if (n < 0 || n > PS_STOP_MAX_STRINGS)
        return ps_errf(err, errlen, PS_ERR_ARG, "%d stop strings; at most %d", n, PS_STOP_MAX_STRINGS);
    for (int i = 0; i < n; i++)
        if (strlen(stops[i]) > PS_STOP_MAX_BYTES)
            return ps_errf(err, errlen, PS_ERR_ARG, "stop string %d has %zu bytes; at most %d", i, strlen(stops[i]),
                           PS_STOP_MAX_BYTES);
    ps_stop *m = ps_calloc(1, sizeof *m);
    if (!m) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!stops[i][0]) continue;
        if (!(m->str[m->n] = ps_strdup(stops[i]))) {
            ps_stop_free(m);
            return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        }
        m->len[m->n++] = strlen(stops[i]);
    }
    *out = m;
    return PS_OK;
}

void ps_stop_free(ps_stop *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) free(m->str[i]);
    free(m->buf);
    free(m);
}

void ps_stop_reset(ps_stop *m) { m->start = m->n_buf = 0, m->stopped = false; }

/* Where the stop string that completes first in b[0..n) begins (of those completing at the
 * same byte, the longest), or n when none is there: the text is cut where generation would
 * have seen a stop first, whatever pieces it came in. */
static size_t first_stop(const ps_stop *m, const char *b, size_t n) {
    size_t at = n, end = SIZE_MAX;
    for (int i = 0; i < m->n; i++) {
        const char *p = m->len[i] <= n ? memmem(b, n, m->str[i], m->len[i]) : NULL;
        size_t s = p ? (size_t)(p - b) : 0, e = s + m->len[i];
        if (p && (e < end || (e == end && s < at))) at = s, end = e;
    }
    return at;
}

/* The length of the longest tail of b[0..n) that is the start of a stop string (shorter
 * than it: a whole one was looked for first). */
static size_t held_tail(const ps_stop *m, const char *b, size_t n) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++)
        for (size_t k = m->len[i] - 1 < n ? m->len[i] - 1 : n; k > best; k--)
            if (!memcmp(b + n - k, m->str[i], k)) {
                best = k;
                break;
            }
    return best;
}

/* See stop.h. The held bytes move to the front, the new ones follow them, and the buffer
 * is cut into released [0, start) and held [start, n_buf). */
ps_status ps_stop_push(ps_stop *m, const char *text, size_t len, const char **out, size_t *out_len, bool *stopped) {
    *out = "", *out_len = 0, *stopped = m->stopped;
    if (m->stopped) return PS_OK;
    size_t held = m->n_buf - m->start;
    if (held + len > m->cap) {
        size_t cap = 2 * (held + len) + 64;
        char *nb = ps_malloc(cap);
        if (!nb) return PS_ERR_NOMEM;
        if (held) memcpy(nb, m->buf + m->start, held);
        free(m->buf);
        m->buf = nb, m->cap = cap;
    } else if (held) {
        memmove(m->buf, m->buf + m->start, held);
    }
    if (len) memcpy(m->buf + held, text, len);
    size_t n = held + len, at = first_stop(m, m->buf, n);
    if (at < n) {
        m->stopped = *stopped = true;
        m->start = m->n_buf = at;
    } else {
        m->n_buf = n, m->start = n - held_tail(m, m->buf, n);
    }
    *out = m->buf, *out_len = m->start;
    return PS_OK;
}

void ps_stop_flush(ps_stop *m, const char **out, size_t *out_len) {
    *out = m->buf ? m->buf + m->start : "", *out_len = m->n_buf - m->start;
    m->start = m->n_buf;
}
