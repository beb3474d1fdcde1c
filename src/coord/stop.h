/* stop.h - stop strings: a request's texts that end its generation where they first appear,
 * the stop string and everything after it cut off (OpenAI's `stop`).
 *
 * The text is cut before the stop string that completes first (of two completing at the same
 * byte, the longer): what generation sees first, whatever pieces the text comes in. It
 * arrives piece by piece (a token's text at a time), so a stop string may begin in one piece
 * and end in a later one. The matcher releases only the text that can no
 * longer be part of a stop string: a tail that is the start of one is held back until the
 * next pieces decide (the stop string completes: cut there; or the text departs from it:
 * released). Released text is therefore final, and the text released in all equals the
 * whole text up to the first stop string.
 *
 *     ps_stop_push(m, piece, len, &out, &n, &stopped);  // print out[0..n); stopped: the end
 *     ps_stop_flush(m, &out, &n);                       // at the end: what was held back
 *
 * With valid UTF-8 stop strings and text, released pieces end on character boundaries. */
#ifndef PS_COORD_STOP_H
#define PS_COORD_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "../ps.h"

#define PS_STOP_MAX_STRINGS 4   /* stop strings per request: OpenAI's limit */
#define PS_STOP_MAX_BYTES   512 /* bytes per stop string */

typedef struct ps_stop ps_stop;

/* A matcher for stops[0..n) (NUL-terminated, copied; n <= PS_STOP_MAX_STRINGS). Empty
 * strings are ignored (they would match before any text); one longer than
 * PS_STOP_MAX_BYTES, or too many, is PS_ERR_ARG with a message. n = 0 makes a matcher that
 * releases everything at once. *out is the caller's (ps_stop_free). */
ps_status ps_stop_create(const char *const *stops, int n, ps_stop **out, char *err, size_t errlen);
/* NULL is a no-op. */
void ps_stop_free(ps_stop *m);
/* Starts a new text (drops what is held, forgets a stop found). */
void ps_stop_reset(ps_stop *m);

/* Adds text[0..len). *out / *out_len receive the bytes released now (maybe none), owned by m
 * until its next call. *stopped is set when a stop string has completed: the released bytes
 * end right before it, and everything from it on is dropped, also what later pushes add.
 * PS_ERR_NOMEM when the held text cannot grow (nothing released then). */
ps_status ps_stop_push(ps_stop *m, const char *text, size_t len, const char **out, size_t *out_len, bool *stopped);
/* The end of the text: releases what is held back (nothing after a stop). Owned by m until
 * its next call. */
void ps_stop_flush(ps_stop *m, const char **out, size_t *out_len);

#endif
