/* test_alloc.c - allocation failures, SQLite's way: for N = 1, 2, ... the N-th allocation of
 * an operation fails (ps_alloc_fail_at), until the operation completes. Every failure on the
 * way must be clean: an error status with a message, no crash, and (under the sanitizers,
 * whose leak check runs at exit) no leak. Operations: loading a model (mapped and read),
 * the tokenizer, a stage, the coordinator and a session generating tokens, a chat prompt's
 * tokens, the stop-string matcher, the scheduler running a request to its DONE event, and a
 * connection's send path (dial, accept, sender thread, queued frames). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "coord/coord.h"
#include "coord/sched.h"
#include "coord/session.h"
#include "coord/stop.h"
#include "model/model.h"
#include "net/net.h"
#include "ps.h"
#include "ps_test.h"
#include "stage/stage.h"
#include "tokenize/tokenize.h"

static const char *model_path;

/* One operation: does its work and frees what it made, whether it failed or not. */
typedef ps_status (*op_fn)(char *err, size_t errlen);

/* Raises N until op completes; checks each failure before it. */
static void sweep(const char *name, op_fn op) {
    long n;
    for (n = 1; n < 1000000; n++) {
        char err[600] = "";
        ps_alloc_fail_at(n);
        ps_status s = op(err, sizeof err);
        long used = ps_alloc_fail_at(0);
        if (s == PS_OK) {
            PS_CHECK(used > 0 && used < n); /* it allocated, and the failing one never came */
            printf("  ok: %s completes once %ld allocations succeed; the %ld failures before were clean\n", name, used,
                   n - 1);
            return;
        }
        ps_test_checks++;
        if (!err[0] || used < n) {
            ps_test_failures++;
            fprintf(stderr, "%s: allocation %ld failed: status %d (%s), message '%s', %ld allocations\n", name, n,
                    (int)s, ps_strerror(s), err, used);
        }
    }
    PS_CHECK(n < 1000000);
}

static ps_status op_model_map(char *err, size_t errlen) {
    ps_model *m = NULL;
    ps_status s = ps_model_load(model_path, PS_GGUF_MAP, &m, err, errlen);
    ps_model_free(m);
    return s;
}

static ps_status op_model_read(char *err, size_t errlen) {
    ps_model *m = NULL;
    ps_status s = ps_model_load(model_path, PS_GGUF_HUGE, &m, err, errlen);
    ps_model_free(m);
    return s;
}

/* The tokenizer: made from the model's metadata, then a round trip of a text. */
static ps_status op_tokenizer(char *err, size_t errlen) {
    ps_gguf *g = NULL;
    ps_tok *t = NULL;
    ps_tok_stream *st = NULL;
    int32_t ids[64];
    size_t n = 0;
    ps_status s = ps_gguf_open(model_path, &g, err, errlen);
    if (!s) s = ps_tok_create(g, &t, err, errlen);
    if (!s) s = ps_tok_encode(t, "Once upon a time, there was", 27, true, false, ids, 64, &n, err, errlen);
    if (!s && (s = ps_tok_stream_create(t, 0, &st))) ps_errf(err, errlen, s, "stream: %s", ps_strerror(s));
    for (size_t i = 0; !s && i < n; i++) {
        const char *text;
        size_t len;
        if ((s = ps_tok_stream_push(st, ids[i], &text, &len))) ps_errf(err, errlen, s, "push: %s", ps_strerror(s));
    }
    ps_tok_stream_free(st);
    ps_tok_free(t);
    ps_gguf_close(g);
    return s;
}

/* A stage: its model, threads and run state. */
static ps_status op_stage(char *err, size_t errlen) {
    ps_stage *st = NULL;
    ps_stage_opts so = {.threads = 2};
    ps_ctx_params cp = {.n_ctx = 64, .max_batch = 16};
    ps_status s = ps_stage_open(model_path, &so, &st, err, errlen);
    if (!s) s = ps_stage_begin(st, &cp, 2, 1, 0, err, errlen);
    ps_stage_free(st);
    return s;
}

/* The coordinator of a whole model and a session on it: a prompt and four greedy tokens. */
static ps_status op_session(char *err, size_t errlen) {
    ps_coord *c = NULL;
    ps_session *ss = NULL;
    ps_coord_opts co = {.model = model_path, .threads = 2, .mmap = true, .n_ctx = 64, .max_batch = 16};
    ps_gen_params gp = ps_gen_params_default();
    gp.sp.temperature = 0, gp.n_predict = 4;
    int32_t prompt[] = {1, 400, 401, 402};
    ps_status s = ps_coord_create(&co, &c, err, errlen);
    if (!s) s = ps_session_create(c, NULL, &ss, err, errlen);
    if (!s) s = ps_session_prompt_ids(ss, prompt, 4, &gp, err, errlen);
    ps_session_step step = {0};
    while (!s && !step.stop) s = ps_session_next(ss, &step, err, errlen);
    if (!s && step.stop != PS_STOP_LENGTH)
        s = ps_errf(err, errlen, PS_ERR_INTERNAL, "stopped for %s", ps_stop_reason_name(step.stop));
    ps_session_free(ss);
    ps_coord_free(c);
    return s;
}

/* The stop-string matcher: made, fed a text in pieces that hold back and release, flushed. */
static ps_status op_stop(char *err, size_t errlen) {
    const char *stops[] = {"the end", "\n\n"};
    ps_stop *m = NULL;
    ps_status s = ps_stop_create(stops, 2, &m, err, errlen);
    const char *pieces[] = {"Once upon a time th", "e e", "nding came\n", "x"}, *out;
    size_t n;
    bool stopped;
    for (size_t i = 0; !s && i < PS_ARRAY_LEN(pieces); i++)
        if ((s = ps_stop_push(m, pieces[i], strlen(pieces[i]), &out, &n, &stopped)))
            ps_errf(err, errlen, s, "push: %s", ps_strerror(s));
    if (!s) ps_stop_flush(m, &out, &n);
    ps_stop_free(m);
    return s;
}

/* A chat prompt's tokens: the model's tokenizer, a template by name, contents as literal spans. */
static ps_status op_chat_tokens(char *err, size_t errlen) {
    ps_model *m = NULL;
    ps_tok *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    ps_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Tell me a story <|im_end|>."}};
    ps_status s = ps_model_load(model_path, PS_GGUF_MAP, &m, err, errlen);
    if (!s) s = ps_tok_create(m->gguf, &t, err, errlen);
    if (!s) s = ps_session_chat_tokens(t, m, msgs, 2, "chatml", true, &ids, &n, err, errlen);
    free(ids);
    ps_tok_free(t);
    ps_model_free(m);
    return s;
}

/* What the scheduler's callback saw. */
typedef struct {
    volatile int done;
    ps_status status;
    char error[256];
} sched_seen;

static void sched_cb(void *ctx, const ps_sched_event *ev) {
    sched_seen *w = ctx;
    if (ev->kind != PS_SCHED_DONE) return;
    w->status = ev->status;
    snprintf(w->error, sizeof w->error, "%s", ev->error ? ev->error : "");
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
}

/* The scheduler: a launch, its engine thread, one request with a stop string run to its DONE
 * event (whose failure, on the engine thread, is the operation's). */
static ps_status op_sched(char *err, size_t errlen) {
    ps_launch *l = NULL;
    ps_sched *sc = NULL;
    ps_launch_opts lo = {.model = model_path,
                         .stage = {.threads = 1, .mmap = true},
                         .n_ctx = 64,
                         .max_batch = 16,
                         .tokenizer = true,
                         .timeout_ms = 10000};
    ps_sched_opts so = {.parallel = 1, .queue_max = 4, .prefix_cache = true};
    int32_t prompt[] = {1, 400, 401, 402};
    ps_sched_request r = {.prompt = prompt, .n_prompt = 4, .stop = {"zzz"}, .n_stop = 1, .top_logprobs = 2};
    r.gp = (ps_gen_params){.sp = ps_sample_params_default(), .n_predict = 6, .ignore_eos = true};
    r.gp.sp.temperature = 0;
    sched_seen w = {0};
    uint64_t id;
    ps_status s = ps_launch_start(&lo, &l, err, errlen);
    if (!s) s = ps_sched_create(l, &so, &sc, err, errlen);
    if (!s) s = ps_sched_submit(sc, &r, sched_cb, &w, &id, err, errlen);
    while (!s && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE)) usleep(1000);
    if (!s && w.status) s = ps_errf(err, errlen, w.status, "DONE: %s", w.error);
    ps_sched_free(sc);
    ps_launch_stop(l);
    return s;
}

/* A connection on loopback: dial, accept, a sender thread queueing three frames, received. */
static ps_status op_conn(char *err, size_t errlen) {
    int lfd = -1;
    char bound[128];
    ps_conn *a = NULL, *b = NULL;
    uint8_t payload[3000];
    memset(payload, 7, sizeof payload);
    struct iovec iov = {payload, sizeof payload};
    ps_status s = ps_net_listen("127.0.0.1:0", &lfd, bound, sizeof bound, err, errlen);
    if (!s) s = ps_net_dial(bound, 5000, &a, err, errlen);
    if (!s) s = ps_net_accept(lfd, 5000, &b, err, errlen);
    if (!s) s = ps_conn_start_sender(a, NULL, err, errlen);
    for (int i = 0; !s && i < 3; i++) s = ps_conn_send_async(a, PS_MSG_FORWARD, &iov, 1, 5000, err, errlen);
    if (!s) s = ps_conn_flush(a, 5000, err, errlen);
    for (int i = 0; !s && i < 3; i++) {
        uint16_t type;
        const uint8_t *p;
        uint32_t len;
        s = ps_conn_recv(b, 5000, &type, &p, &len, err, errlen);
        if (!s && (type != PS_MSG_FORWARD || len != sizeof payload))
            s = ps_errf(err, errlen, PS_ERR_INTERNAL, "frame %d came back as type %u, %u bytes", i, type, len);
    }
    ps_conn_free(a);
    ps_conn_free(b);
    if (lfd >= 0) close(lfd);
    return s;
}

int main(void) {
    model_path = ps_test_shared_model("stories260K.gguf");
    sweep("a connection's send path", op_conn);
    if (!model_path) {
        ps_test_skip_part("stories260K.gguf is absent (../shared/models): the model, tokenizer, stage and session "
                          "sweeps did not run");
        return ps_test_done();
    }
    sweep("loading a mapped model", op_model_map);
    sweep("loading a model into memory", op_model_read);
    sweep("the tokenizer", op_tokenizer);
    sweep("a stage", op_stage);
    sweep("the coordinator and a session", op_session);
    sweep("a chat prompt's tokens", op_chat_tokens);
    sweep("the stop-string matcher", op_stop);
    sweep("the scheduler", op_sched);
    return ps_test_done();
}
