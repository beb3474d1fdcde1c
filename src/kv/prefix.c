/* prefix.c - the records of captured prefixes (prefix.h): one JSON file per prefix,
 *
 *     {"id": "<16 hex digits>", "model": "<32 hex digits>", "stages": N, "created": T,
 *      "tokens": [ids...]}
 */
#include "prefix.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "../model/model.h"
#include "../model/shard.h"

#define MAX_RECORD_BYTES (64u << 20) /* a record of 2M token ids is about 16 MB */

uint64_t ps_prefix_id(const char *model_fp, const int32_t *tokens, int n) {
    uint64_t id = XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, XXH3_64bits(model_fp, 32));
    return id ? id : 1;
}

ps_status ps_prefix_write(const char *dir, const ps_prefix *p, char *err, size_t errlen) {
    cJSON *j = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(j, "tokens");
    char id[17], path[4200], tmp[4300];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)p->id);
    bool ok = j && toks && cJSON_AddStringToObject(j, "id", id) && cJSON_AddStringToObject(j, "model", p->model_fp) &&
              cJSON_AddNumberToObject(j, "stages", p->n_stages) &&
              cJSON_AddNumberToObject(j, "created", (double)p->created);
    for (int i = 0; ok && i < p->n_tokens; i++) {
        cJSON *t = cJSON_CreateNumber(p->tokens[i]);
        ok = t && cJSON_AddItemToArray(toks, t);
    }
    char *text = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/%s.json", dir, id);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* a prompt's ids: the owner's alone */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0) close(fd);
    ok = f && fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (f && fclose(f) == 0) && ok;
    free(text);
    if (!ok || rename(tmp, path)) {
        ps_status s = ps_errf(err, errlen, PS_ERR_IO, "cannot write %s: %s", path, strerror(errno ? errno : EIO));
        unlink(tmp);
        return s;
    }
    return PS_OK;
}

/* Reads the whole of path (at most MAX_RECORD_BYTES) into a NUL-terminated malloc'd string. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (!fseek(f, 0, SEEK_END)) {
        long n = ftell(f);
        if (n >= 0 && (unsigned long)n <= MAX_RECORD_BYTES && !fseek(f, 0, SEEK_SET) &&
            (buf = ps_malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) == (size_t)n)
                buf[n] = 0;
            else
                free(buf), buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* Fills p from the record file path (named for id); p->why says what is wrong with it. */
static void read_record(const char *path, uint64_t id, ps_prefix *p) {
    *p = (ps_prefix){.id = id};
    char *text = slurp(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL, *t;
    free(text);
    const cJSON *fid = cJSON_GetObjectItemCaseSensitive(j, "id"), *model = cJSON_GetObjectItemCaseSensitive(j, "model"),
                *stages = cJSON_GetObjectItemCaseSensitive(j, "stages"),
                *created = cJSON_GetObjectItemCaseSensitive(j, "created"),
                *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    int n = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : 0;
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)id);
    if (!j || !cJSON_IsString(fid) || strcmp(fid->valuestring, want) || !cJSON_IsString(model) ||
        !ps_fingerprint_ok(model->valuestring, strlen(model->valuestring)) || !cJSON_IsNumber(stages) ||
        stages->valuedouble < 1 || stages->valuedouble > PS_SHARD_MAX_STAGES || !cJSON_IsNumber(created) || n < 1 ||
        n % PS_KV_BLOCK) {
        snprintf(p->why, sizeof p->why, "%.400s is not a prefix record", path);
        goto out;
    }
    snprintf(p->model_fp, sizeof p->model_fp, "%s", model->valuestring);
    p->n_stages = (int)stages->valuedouble, p->created = (long long)created->valuedouble;
    if (!(p->tokens = ps_malloc((size_t)n * sizeof *p->tokens))) {
        snprintf(p->why, sizeof p->why, "out of memory for %.400s", path);
        goto out;
    }
    int i = 0;
    cJSON_ArrayForEach(t, toks) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > INT32_MAX ||
            t->valuedouble != (int32_t)t->valuedouble) {
            snprintf(p->why, sizeof p->why, "%.400s holds a token id that is not one", path);
            goto out;
        }
        p->tokens[i++] = (int32_t)t->valuedouble;
    }
    p->n_tokens = n;
    if (ps_prefix_id(p->model_fp, p->tokens, n) != id)
        snprintf(p->why, sizeof p->why, "%.400s is damaged: its token ids do not hash to its id", path);
out:
    cJSON_Delete(j);
}

static int by_created(const void *a, const void *b) {
    const ps_prefix *x = a, *y = b;
    return x->created < y->created ? -1 : x->created > y->created ? 1 : x->id < y->id ? -1 : x->id > y->id;
}

ps_status ps_prefix_scan(const char *dir, ps_prefix **out, int *n, char *err, size_t errlen) {
    *out = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? PS_OK : ps_errf(err, errlen, PS_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    ps_status s = PS_OK;
    while (!s && (e = readdir(d))) {
        char *end;
        unsigned long long id = strtoull(e->d_name, &end, 16);
        if (strlen(e->d_name) != 21 || end != e->d_name + 16 || strcmp(end, ".json") || !id) continue;
        if (*n == cap) {
            ps_prefix *bigger = ps_realloc(*out, (size_t)(cap = 2 * cap + 8) * sizeof *bigger);
            if (!bigger) {
                s = ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
                break;
            }
            *out = bigger;
        }
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        read_record(path, id, &(*out)[(*n)++]);
    }
    closedir(d);
    if (s) {
        ps_prefix_free(*out, *n);
        *out = NULL, *n = 0;
        return s;
    }
    if (*n) qsort(*out, (size_t)*n, sizeof **out, by_created);
    return PS_OK;
}

void ps_prefix_free(ps_prefix *p, int n) {
    for (int i = 0; p && i < n; i++) free(p[i].tokens);
    free(p);
}
