/* launch.c - a connected coordinator and its tokenizer from a model, a fleet.json or a local
 * fleet (launch.h). */
#include "launch.h"

#include <stdlib.h>
#include <string.h>

#include "local_fleet.h"

struct ps_launch {
    ps_local_fleet *local; /* local_stages > 1 */
    ps_fleet *fleet;       /* --fleet's, or the local one's; NULL for a whole model */
    ps_coord *coord;
    ps_tok *tok;
    double seconds;
};

/* Starts the fleet: local workers, or fleet.json's (l->fleet NULL: the whole model here).
 * The shared key goes to key (*have_key says whether there is one). */
static ps_status start_fleet(ps_launch *l, const ps_launch_opts *o, uint8_t key[32], bool *have_key, char *err,
                             size_t errlen) {
    ps_status s = PS_OK;
    *have_key = false;
    if (o->local_stages > 1) {
        if ((s = ps_coord_refuse_shard(o->model, err, errlen))) return s; /* before the splitter's message */
        if (!(l->local = ps_calloc(1, sizeof *l->local))) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
        ps_local_fleet_opts lo = {.stage = &o->stage,
                                  .sim = &o->sim,
                                  .key_file = o->key_file,
                                  .unix_sockets = o->local_unix,
                                  .host_hops = o->host_hops,
                                  .devices = o->devices,
                                  .n_devices = o->n_devices,
                                  .prefix_dir = o->prefix_dir,
                                  .progress = &o->progress};
        s = ps_local_fleet_start(o->model, o->local_stages, &lo, l->local, err, errlen);
        if (s) return s;
        l->fleet = &l->local->fleet;
        memcpy(key, l->local->key, 32);
        *have_key = true;
        return PS_OK;
    }
    if (o->key_file && (s = ps_net_key_load(o->key_file, key, err, errlen))) return s;
    *have_key = o->key_file != NULL;
    if (!o->fleet) return PS_OK;
    if (!(l->fleet = ps_malloc(sizeof *l->fleet))) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    return ps_fleet_load(o->fleet, l->fleet, err, errlen);
}

/* Loads the tokenizer of stage 0's model; it may not have more tokens than the model rows. */
static ps_status load_tokenizer(ps_launch *l, char *err, size_t errlen) {
    const ps_model *m = ps_coord_model(l->coord);
    ps_status s = ps_tok_create(m->gguf, &l->tok, err, errlen);
    if (s) return s;
    if (ps_tok_n_vocab(l->tok) > m->hp.vocab)
        return ps_errf(err, errlen, PS_ERR_FORMAT, "the tokenizer has %d tokens but the model only %d rows",
                       ps_tok_n_vocab(l->tok), m->hp.vocab);
    return PS_OK;
}

ps_status ps_launch_start(const ps_launch_opts *o, ps_launch **out, char *err, size_t errlen) {
    double t0 = ps_now();
    *out = NULL;
    ps_launch *l = ps_calloc(1, sizeof *l);
    if (!l) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    uint8_t key[32];
    bool have_key;
    ps_status s = start_fleet(l, o, key, &have_key, err, errlen);
    ps_coord_opts co = {.model = l->fleet ? NULL : o->model,
                        .fleet = l->fleet,
                        .threads = o->stage.threads,
                        .pin = o->stage.pin,
                        .mmap = o->stage.mmap,
                        .device = o->stage.device,
                        .plain = o->plain || o->local_stages > 1,
                        .host_hops = o->host_hops,
                        .n_ctx = o->n_ctx,
                        .max_batch = o->max_batch,
                        .prefill_chunk = o->prefill_chunk,
                        .max_segs = o->parallel,
                        .n_blocks = o->kv_blocks,
                        .max_draft = o->max_draft,
                        .parallel = o->parallel,
                        .act = o->act,
                        .key = have_key ? key : NULL,
                        .sim = o->sim,
                        .timeout_ms = o->timeout_ms,
                        .standby = o->standby,
                        .n_standby = o->n_standby,
                        .progress = o->progress};
    if (!s) ps_progress_report(&o->progress, "loading model", 0, 0);
    if (!s) s = ps_coord_create(&co, &l->coord, err, errlen);
    if (!s) s = ps_coord_connect(l->coord, err, errlen);
    if (!s && o->tokenizer) s = load_tokenizer(l, err, errlen);
    if (s) {
        ps_launch_stop(l);
        return s;
    }
    l->seconds = ps_now() - t0;
    *out = l;
    return PS_OK;
}

void ps_launch_stop(ps_launch *l) {
    if (!l) return;
    ps_tok_free(l->tok);
    ps_coord_free(l->coord);
    if (l->local)
        ps_local_fleet_stop(l->local);
    else
        free(l->fleet);
    free(l->local);
    free(l);
}

void ps_launch_abort_all(void) { ps_local_fleet_abort_all(); }

ps_coord *ps_launch_coord(ps_launch *l) { return l->coord; }
const ps_tok *ps_launch_tok(const ps_launch *l) { return l->tok; }
double ps_launch_seconds(const ps_launch *l) { return l->seconds; }
