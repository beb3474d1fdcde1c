/* fleet.c - fleet.json: the address rule, writing it after a split, reading it back (fleet.h). */
#include "fleet.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FLEET_MAX_BYTES (1u << 20) /* fleet.json larger than this is refused */
#define DEFAULT_PORT    7701       /* stage k defaults to 127.0.0.1:(DEFAULT_PORT + k - 1) */

// ---------------------------------------------------------------------------------------
// Addresses

/* The address rule of fleet.json and `split --workers`: "HOST:PORT", HOST a name or IPv4
 * address (letters, digits, '-', '.', '_') or a bracketed IPv6 address, PORT a decimal
 * 1..65535; or "unix:PATH", a Unix-domain socket for stages on one host (PATH printable,
 * no spaces or commas, short enough for a socket address). */
bool ps_fleet_address_ok(const char *s) {
    size_t len = strlen(s);
    if (!len || len >= sizeof(((ps_fleet_stage *)0)->address)) return false;
    if (!strncmp(s, "unix:", 5)) {
        if (len == 5 || len - 5 > PS_UNIX_PATH_MAX) return false;
        for (const char *p = s + 5; *p; p++)
            if (*p <= ' ' || *p > '~' || *p == ',') return false;
        return true;
    }
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || !colon[1]) return false;
    if (s[0] == '[') {
        if (colon[-1] != ']' || colon - s < 3) return false;
        for (const char *p = s + 1; p < colon - 1; p++)
            if (!(strchr("0123456789abcdefABCDEF:.", *p))) return false;
    } else {
        for (const char *p = s; p < colon; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                  *p == '.' || *p == '_'))
                return false;
    }
    const char *port = colon + 1;
    size_t digits = strspn(port, "0123456789");
    return port[0] != '0' && digits <= 5 && !port[digits] && atoi(port) <= 65535;
}

// ---------------------------------------------------------------------------------------
// Writing fleet.json

/* The last path component of path. */
static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Appends s to the growing malloc'd string *buf (length *len); false when out of memory. */
static bool append(char **buf, size_t *len, const char *s) {
    size_t n = strlen(s);
    char *p = ps_realloc(*buf, *len + n + 1);
    if (!p) return false;
    memcpy(p + *len, s, n + 1);
    *buf = p;
    *len += n;
    return true;
}

/* fleet.json's text: one top-level key per line and one stage per line, so that a user can
 * edit addresses with any editor. A malloc'd string (free with free), NULL when out of memory. */
static char *fleet_text(const cJSON *root) {
    char *buf = NULL;
    size_t len = 0;
    bool ok = append(&buf, &len, "{");
    for (const cJSON *it = root->child; ok && it; it = it->next) {
        cJSON *name = cJSON_CreateStringReference(it->string);
        char *key = name ? cJSON_PrintUnformatted(name) : NULL, *val = NULL;
        cJSON_Delete(name);
        ok = key && append(&buf, &len, it == root->child ? "\n  " : ",\n  ") && append(&buf, &len, key) &&
             append(&buf, &len, ": ");
        if (ok && cJSON_IsArray(it)) {
            ok = append(&buf, &len, "[");
            for (const cJSON *e = it->child; ok && e; e = e->next) {
                char *v = cJSON_PrintUnformatted(e);
                ok = v && append(&buf, &len, e == it->child ? "\n    " : ",\n    ") && append(&buf, &len, v);
                cJSON_free(v);
            }
            ok = ok && append(&buf, &len, "\n  ]");
        } else if (ok) {
            ok = (val = cJSON_PrintUnformatted(it)) && append(&buf, &len, val);
        }
        cJSON_free(key);
        cJSON_free(val);
    }
    if (ok && append(&buf, &len, "\n}")) return buf;
    free(buf);
    return NULL;
}

/* Writes fleet.json (fleet.h) to path through path.tmp + rename: the n stages along bounds
 * that ps_shard_split wrote (sf), at addresses (NULL: the defaults). */
static ps_status write_fleet(const char *path, const char *model_name, int n, const int *bounds,
                             const ps_shard_files *sf, const char *const *addresses, char *err, size_t errlen) {
    cJSON *root = cJSON_CreateObject(), *stages = NULL;
    char *text = NULL, tmp[4200];
    ps_status s = PS_OK;
    bool ok = root && cJSON_AddNumberToObject(root, "pipeshard_fleet", 1) &&
              cJSON_AddStringToObject(root, "model", model_name) &&
              cJSON_AddStringToObject(root, "model_fingerprint", sf->model_fp) &&
              cJSON_AddNumberToObject(root, "n_layer", sf->n_layer) &&
              (stages = cJSON_AddArrayToObject(root, "stages"));
    for (int k = 0; ok && k < n; k++) {
        char addr[64];
        cJSON *st = cJSON_CreateObject();
        int layers[2] = {bounds[k], bounds[k + 1]};
        if (k) snprintf(addr, sizeof addr, "127.0.0.1:%d", DEFAULT_PORT + k - 1);
        ok = st && cJSON_AddItemToArray(stages, st) && cJSON_AddNumberToObject(st, "stage", k) &&
             cJSON_AddStringToObject(st, "shard", sf->file[k]) &&
             cJSON_AddItemToObject(st, "layers", cJSON_CreateIntArray(layers, 2)) &&
             cJSON_AddNumberToObject(st, "bytes", (double)sf->bytes[k]) &&
             cJSON_AddStringToObject(st, "fingerprint", sf->fingerprint[k]) &&
             cJSON_AddStringToObject(st, "address",
                                     k == 0      ? "local"
                                     : addresses ? addresses[k - 1]
                                                 : addr);
    }
    if (!ok || !(text = fleet_text(root))) {
        s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory building fleet.json");
        goto out;
    }
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        s = ps_errf(err, errlen, PS_ERR_RANGE, "path '%s' is too long", path);
        goto out;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    bool wrote = fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && wrote) wrote = false, e = errno;
    if (!wrote || rename(tmp, path) < 0) {
        if (wrote) e = errno;
        unlink(tmp);
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    }
out:
    free(text);
    cJSON_Delete(root);
    return s;
}

/* See fleet.h. The addresses are checked before anything is written. */
ps_status ps_fleet_split(const char *model_path, int n_stages, const int *bounds, const char *const *addresses,
                         const char *dir, ps_shard_progress_fn progress, void *progress_ctx, char *err, size_t errlen) {
    for (int k = 1; addresses && k < n_stages && k < PS_SHARD_MAX_STAGES; k++)
        if (!addresses[k - 1] || !ps_fleet_address_ok(addresses[k - 1]))
            return ps_errf(err, errlen, PS_ERR_ARG, "address '%s' of stage %d is not HOST:PORT or unix:PATH",
                           addresses[k - 1] ? addresses[k - 1] : "(null)", k);
    ps_shard_files *sf = ps_malloc(sizeof *sf);
    if (!sf) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    char path[4096];
    ps_status s = ps_shard_split(model_path, n_stages, bounds, dir, progress, progress_ctx, sf, err, errlen);
    if (!s) s = ps_path_join(path, sizeof path, dir, "fleet.json", err, errlen);
    if (!s) s = write_fleet(path, base_name(model_path), n_stages, bounds, sf, addresses, err, errlen);
    free(sf);
    return s;
}

// ---------------------------------------------------------------------------------------
// Reading fleet.json

/* Reading context: the file name for messages. */
typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} fleet_rd;

/* An integer field: present, a number, integral, within [min, max]. where names it. */
static ps_status json_int(const fleet_rd *r, const cJSON *obj, const char *key, const char *where, double min,
                          double max, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %s%s is missing", r->path, where, key);
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < min || d > max)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %s%s must be an integer from %.0f to %.0f", r->path,
                       where, key, min, max);
    *out = d;
    return PS_OK;
}

/* A string field: present, a string; its value in *out. */
static ps_status json_str(const fleet_rd *r, const cJSON *obj, const char *key, const char *where, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %s%s is missing", r->path, where, key);
    if (!cJSON_IsString(v) || !v->valuestring)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %s%s must be a string", r->path, where, key);
    *out = v->valuestring;
    return PS_OK;
}

/* A fingerprint field: a string of 32 lowercase hex digits, copied to out. */
static ps_status json_fp(const fleet_rd *r, const cJSON *obj, const char *key, const char *where, char out[33]) {
    const char *s = NULL;
    ps_status st = json_str(r, obj, key, where, &s);
    if (st) return st;
    if (!ps_fingerprint_ok(s, strlen(s)))
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %s%s must be 32 lowercase hex digits", r->path, where,
                       key);
    memcpy(out, s, 33);
    return PS_OK;
}

/* The shard path: absolute kept, else relative to the fleet file's directory. */
static ps_status resolve_shard(const fleet_rd *r, const char *shard, const char *where, char *out, size_t n) {
    if (!*shard) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %sshard is empty", r->path, where);
    const char *slash = strrchr(r->path, '/');
    int k = shard[0] == '/' || !slash ? snprintf(out, n, "%s", shard)
                                      : snprintf(out, n, "%.*s/%s", (int)(slash - r->path), r->path, shard);
    if (k < 0 || (size_t)k >= n)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %sshard is too long", r->path, where);
    return PS_OK;
}

/* Reads stages[k] (of n) into st; prev_end is where stage k - 1 ended (0 for k = 0). Stage 0
 * of several may hold no layer ([0, 0]: the embedding alone). */
static ps_status fleet_stage(const fleet_rd *r, const cJSON *obj, int k, int n, int n_layer, int prev_end,
                             ps_fleet_stage *st) {
    char where[48];
    snprintf(where, sizeof where, "stages[%d].", k);
    if (!cJSON_IsObject(obj))
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: stages[%d] must be an object", r->path, k);
    double d = 0;
    const char *shard = NULL, *addr = NULL;
    ps_status s;
    if ((s = json_int(r, obj, "stage", where, 0, PS_SHARD_MAX_STAGES, &d))) return s;
    if ((int)d != k)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %sstage must be %d, not %d", r->path, where, k, (int)d);
    st->index = k;
    if ((s = json_str(r, obj, "shard", where, &shard)) ||
        (s = resolve_shard(r, shard, where, st->shard, sizeof st->shard)))
        return s;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(obj, "layers");
    if (!layers) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %slayers is missing", r->path, where);
    const cJSON *b = cJSON_GetArrayItem(layers, 0), *e = cJSON_GetArrayItem(layers, 1);
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != 2 || !cJSON_IsNumber(b) || !cJSON_IsNumber(e) ||
        b->valuedouble != floor(b->valuedouble) || e->valuedouble != floor(e->valuedouble) || b->valuedouble < 0 ||
        e->valuedouble > n_layer || b->valuedouble > e->valuedouble ||
        (b->valuedouble == e->valuedouble && (k > 0 || n < 2)))
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT,
                       "%s: %slayers must be [BEGIN, END] with 0 <= BEGIN < END <= %d (stage 0 of several may be "
                       "[0, 0])",
                       r->path, where, n_layer);
    st->layer_begin = (int)b->valuedouble;
    st->layer_end = (int)e->valuedouble;
    if (st->layer_begin != prev_end)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %slayers must start at %d where %s", r->path, where,
                       prev_end, k ? "the stage before ends" : "the model starts");
    if ((s = json_int(r, obj, "bytes", where, 0, 9007199254740992.0, &d))) return s;
    st->bytes = (uint64_t)d;
    if ((s = json_fp(r, obj, "fingerprint", where, st->fingerprint)) || (s = json_str(r, obj, "address", where, &addr)))
        return s;
    if (k == 0 && strcmp(addr, "local"))
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT,
                       "%s: stages[0].address must be \"local\" (stage 0 runs in the "
                       "coordinator), not \"%.64s\"",
                       r->path, addr);
    if (k > 0 && !ps_fleet_address_ok(addr))
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: %saddress \"%.64s\" is not HOST:PORT or unix:PATH",
                       r->path, where, addr);
    snprintf(st->address, sizeof st->address, "%s", addr);
    return PS_OK;
}

/* Validates the parsed document into out. */
static ps_status fleet_parse(const fleet_rd *r, const cJSON *root, ps_fleet *out) {
    double d = 0;
    const char *model = NULL;
    ps_status s;
    if (!cJSON_IsObject(root)) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: not a JSON object", r->path);
    if ((s = json_int(r, root, "pipeshard_fleet", "", 0, 1e9, &d))) return s;
    if (d != 1)
        return ps_errf(r->err, r->errlen, PS_ERR_UNSUPPORTED, "%s: pipeshard_fleet %.0f is not supported (only 1)",
                       r->path, d);
    if ((s = json_str(r, root, "model", "", &model)) ||
        (s = json_fp(r, root, "model_fingerprint", "", out->model_fp)) ||
        (s = json_int(r, root, "n_layer", "", 1, PS_SHARD_MAX_LAYERS, &d)))
        return s;
    out->n_layer = (int)d;
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(root, "stages");
    if (!stages) return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: stages is missing", r->path);
    int n = cJSON_GetArraySize(stages);
    if (!cJSON_IsArray(stages) || n < 1 || n > PS_SHARD_MAX_STAGES || n > out->n_layer + 1)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: stages must be an array of 1 to %d stages", r->path,
                       out->n_layer < PS_SHARD_MAX_STAGES ? out->n_layer + 1 : PS_SHARD_MAX_STAGES);
    out->n_stages = n;
    int prev_end = 0, k = 0;
    for (const cJSON *it = stages->child; it; it = it->next, k++) {
        if ((s = fleet_stage(r, it, k, n, out->n_layer, prev_end, &out->stages[k]))) return s;
        prev_end = out->stages[k].layer_end;
    }
    if (prev_end != out->n_layer)
        return ps_errf(r->err, r->errlen, PS_ERR_FORMAT, "%s: stages[%d].layers must end at n_layer (%d), not %d",
                       r->path, n - 1, out->n_layer, prev_end);
    return PS_OK;
}

/* Refuses what is plainly not a fleet.json before reading it: a directory (naming its
 * fleet.json when it holds one) or a GGUF file (a model or a shard given to --fleet). */
static ps_status not_a_fleet(const char *path, FILE *f, char *err, size_t errlen) {
    struct stat st;
    char magic[4];
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        char inside[4200];
        size_t n = strlen(path);
        snprintf(inside, sizeof inside, "%s%sfleet.json", path, n && path[n - 1] == '/' ? "" : "/");
        bool has = access(inside, R_OK) == 0;
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "'%s' is a directory: --fleet takes the fleet.json that `pipeshard split` wrote%s%s%s", path,
                       has ? " (" : "", has ? inside : "", has ? "?)" : "");
    }
    if (fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4))
        return ps_errf(err, errlen, PS_ERR_ARG,
                       "'%s' is a GGUF file, not a fleet.json: --fleet takes the fleet.json that `pipeshard split` "
                       "wrote next to the shards; run a whole model with -m",
                       path);
    rewind(f);
    return PS_OK;
}

/* Reads the whole file (at most FLEET_MAX_BYTES) into a malloc'd buffer. */
static ps_status read_small_file(const char *path, char **buf, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return ps_errf(err, errlen, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "cannot open '%s': %s", path,
                       strerror(errno));
    ps_status s = not_a_fleet(path, f, err, errlen);
    if (s) {
        fclose(f);
        return s;
    }
    *buf = ps_malloc(FLEET_MAX_BYTES + 1);
    if (!*buf) {
        fclose(f);
        return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    }
    *len = fread(*buf, 1, FLEET_MAX_BYTES + 1, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || *len > FLEET_MAX_BYTES) {
        free(*buf);
        *buf = NULL;
        return ps_errf(err, errlen, bad ? PS_ERR_IO : PS_ERR_FORMAT,
                       bad ? "%s: read error" : "%s: larger than %u bytes: not a fleet.json", path, FLEET_MAX_BYTES);
    }
    return PS_OK;
}

/* See fleet.h. JSON syntax errors give the line and column. */
ps_status ps_fleet_load(const char *path, ps_fleet *out, char *err, size_t errlen) {
    if (!path || !out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_fleet_load: NULL argument");
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t len = 0;
    ps_status s = read_small_file(path, &buf, &len, err, errlen);
    if (s) return s;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, false);
    if (!root) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            col = buf[i] == '\n' ? 1 : col + 1;
            line += buf[i] == '\n';
        }
        s = ps_errf(err, errlen, PS_ERR_FORMAT, "%s: not valid JSON (line %d, column %d)", path, line, col);
    } else {
        fleet_rd r = {path, err, errlen};
        s = fleet_parse(&r, root, out);
    }
    cJSON_Delete(root);
    free(buf);
    if (s) memset(out, 0, sizeof *out);
    return s;
}

void ps_progress_report(const ps_progress *p, const char *what, uint64_t done, uint64_t total) {
    if (p && p->fn) p->fn(p->ctx, what, done, total);
}
