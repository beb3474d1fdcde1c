/* prefix.h - captured prefixes: the coordinator's record of each (DIR/<id>.json), beside the
 * stages' files of its keys and values (stage.h: ps_kv_file_path, one per stage).
 *
 * A prefix is a run of whole KV blocks' token ids under one model. Its id hashes the model's
 * fingerprint and the ids: the same prompt captured twice is one prefix, the same ids under
 * another model another. The record keeps the ids (a restored prefix is found again by the
 * prefix cache, kv.h) and the fleet it was captured on. */
#ifndef PS_KV_PREFIX_H
#define PS_KV_PREFIX_H

#include <stdint.h>

#include "../ps.h"

typedef struct {
    uint64_t id;
    char model_fp[33]; /* the model's fingerprint (32 hex digits) */
    int n_stages;      /* of the fleet that captured it */
    int32_t *tokens;   /* (n_tokens) malloc'd */
    int n_tokens;      /* a multiple of PS_KV_BLOCK, >= PS_KV_BLOCK */
    long long created; /* unix time */
    char why[600];     /* non-empty: the record is unusable (ps_prefix_scan), and why */
} ps_prefix;

/* The id of tokens[0..n) under the model with fingerprint model_fp (never 0). */
uint64_t ps_prefix_id(const char *model_fp, const int32_t *tokens, int n);
/* Writes p's record to dir/<id>.json (a temporary name, then renamed). */
ps_status ps_prefix_write(const char *dir, const ps_prefix *p, char *err, size_t errlen);
/* Reads every record in dir (files named <16 hex digits>.json), oldest first, into *out
 * (malloc'd, *n of them; ps_prefix_free). A record that does not parse, holds no whole
 * blocks of ids, or whose ids do not hash to its id comes with why set. A missing dir is no
 * prefixes. */
ps_status ps_prefix_scan(const char *dir, ps_prefix **out, int *n, char *err, size_t errlen);
void ps_prefix_free(ps_prefix *p, int n); /* NULL is a no-op */

#endif
