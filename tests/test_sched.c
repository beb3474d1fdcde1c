/* test_sched.c - the scheduler (coord/sched.h) on stories260K: a request's events add up to
 * what a session generates alone, stop strings cut the text and end with "stop", the queue
 * bound (PS_ERR_BUSY) while earlier requests complete, cancelling a queued and a running
 * request, log-probabilities beside the logits, the prefix cache, the metrics, the errors
 * found at submit, and ps_sched_free with requests in flight. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord/sched.h"
#include "ps_test.h"

/* What the callback saw of one request. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[8192];
    size_t len;
    int n_tokens;
    int32_t tokens[512];
    bool done;
    ps_stop_reason stop;
    ps_status status;
    ps_sched_seq_stats stats;
    bool logprob_ok; /* every TOKEN's top-1 was its token, descending, <= 0 */
    int n_top_seen;
    int allow; /* > 0: the callback holds the engine while n_tokens >= allow (a test's gate) */
} got;

static void got_init(got *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->logprob_ok = true;
}

/* The callback: records the event (never blocks for long). */
static void on_event(void *ctx, const ps_sched_event *ev) {
    got *g = ctx;
    pthread_mutex_lock(&g->mu);
    if (g->len + ev->len < sizeof g->text) memcpy(g->text + g->len, ev->text, ev->len), g->len += ev->len;
    g->text[g->len] = 0;
    if (ev->kind == PS_SCHED_TOKEN) {
        if (g->n_tokens < 512) g->tokens[g->n_tokens] = ev->token;
        g->n_tokens++;
        g->n_top_seen = ev->n_top;
        if (ev->n_top > 0 && (ev->top_ids[0] != ev->token || ev->logprob != ev->top_logprobs[0])) g->logprob_ok = false;
        for (int i = 0; i < ev->n_top; i++)
            if (ev->top_logprobs[i] > 0 || (i && ev->top_logprobs[i] > ev->top_logprobs[i - 1])) g->logprob_ok = false;
        pthread_cond_broadcast(&g->cv);
        while (g->allow > 0 && g->n_tokens >= g->allow) pthread_cond_wait(&g->cv, &g->mu);
    } else {
        g->done = true, g->stop = ev->stop, g->status = ev->status, g->stats = ev->stats;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

/* Waits until g is done (at most 60 s); false on time-out. */
static bool wait_done(got *g) {
    bool ok = true;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; !g->done && i < 600; i++) {
        pthread_mutex_unlock(&g->mu);
        usleep(100000);
        pthread_mutex_lock(&g->mu);
    }
    ok = g->done;
    pthread_mutex_unlock(&g->mu);
    PS_CHECK(ok);
    return ok;
}

/* Lets g's callback go on until it has n tokens (0: for good). */
static void set_allow(got *g, int n) {
    pthread_mutex_lock(&g->mu);
    g->allow = n;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Waits until g has n tokens or is done. */
static void wait_tokens(got *g, int n) {
    for (int i = 0; i < 6000; i++) {
        pthread_mutex_lock(&g->mu);
        bool ok = g->n_tokens >= n || g->done;
        pthread_mutex_unlock(&g->mu);
        if (ok) return;
        usleep(10000);
    }
}

#define N_CTX 256

static ps_launch *launch;
static int32_t prompt[64];
static int n_prompt;

/* A greedy request of n tokens over the test prompt (ignore_eos: stories260K's text goes on). */
static ps_sched_request greedy(int n) {
    ps_sched_request r = {.prompt = prompt, .n_prompt = n_prompt, .top_logprobs = -1};
    r.gp = (ps_gen_params){.sp = ps_sample_params_default(), .n_predict = n, .ignore_eos = true};
    r.gp.sp.temperature = 0;
    return r;
}

/* The text a session generates alone for r, into out. */
static void alone(const ps_sched_request *r, char *out, size_t cap) {
    char err[256];
    ps_session *se = NULL;
    PS_CHECK_OK(ps_session_create(ps_launch_coord(launch), ps_launch_tok(launch), &se, err, sizeof err));
    PS_CHECK_OK(ps_session_prompt_ids(se, r->prompt, r->n_prompt, &r->gp, err, sizeof err));
    ps_session_step st = {0};
    size_t n = 0;
    while (!st.stop && !ps_session_next(se, &st, err, sizeof err))
        if (n + st.len < cap) memcpy(out + n, st.text, st.len), n += st.len;
    const char *t;
    size_t len;
    ps_session_flush(se, &t, &len);
    if (n + len < cap) memcpy(out + n, t, len), n += len;
    out[n] = 0;
    ps_session_free(se);
}

/* One request, then a stop string taken from its text; the prefix cache on the repeat. */
static void test_one_and_stop(ps_sched *s, const char *ref) {
    got g;
    char err[256];
    uint64_t id;
    got_init(&g);
    ps_sched_request r = greedy(40);
    PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err));
    PS_CHECK(id > 0);
    if (!wait_done(&g)) return;
    PS_CHECK(!strcmp(g.text, ref));
    PS_CHECK_EQ_INT(g.stop, PS_STOP_LENGTH);
    PS_CHECK_EQ_INT(g.n_tokens, 40);
    PS_CHECK(g.stats.n_prompt == n_prompt && g.stats.n_generated == 40 && g.stats.ttft_s > 0);

    /* a stop string from the middle of that text: the text before its first appearance */
    size_t at = strlen(ref) / 2;
    char stop[8];
    memcpy(stop, ref + at, 4), stop[4] = 0;
    const char *first = strstr(ref, stop);
    got_init(&g);
    r.stop[0] = "\x01never", r.stop[1] = stop, r.n_stop = 2;
    PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err));
    if (!wait_done(&g)) return;
    PS_CHECK_EQ_INT(g.stop, PS_STOP_STOP);
    PS_CHECK(g.len == (size_t)(first - ref) && !memcmp(g.text, ref, g.len));
    PS_CHECK(g.n_tokens < 40);
}

/* The prefix cache: a prompt of 70 tokens run again shares its first two whole KV blocks
 * (its last position is always computed afresh), and gives the same text. */
static void test_prefix(ps_sched *s) {
    static int32_t ids[70];
    for (int i = 0; i < 70; i++) ids[i] = (int32_t)(1 + (i * 37) % 500);
    ps_sched_request r = greedy(20);
    r.prompt = ids, r.n_prompt = 70;
    static char text[2][8192];
    char err[256];
    for (int k = 0; k < 2; k++) {
        got g;
        uint64_t id;
        got_init(&g);
        PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err));
        if (!wait_done(&g)) return;
        PS_CHECK_EQ_INT(g.stats.n_cached, k ? 2 * PS_KV_BLOCK : 0);
        PS_CHECK_EQ_INT(g.n_tokens, 20);
        snprintf(text[k], sizeof text[k], "%s", g.text);
    }
    PS_CHECK(!strcmp(text[0], text[1]));
}

/* Queue bound: with one running and queue_max waiting, one more is PS_ERR_BUSY; cancelling a
 * queued request ends it while the running one goes on; the rest complete normally. The
 * running request's callback holds the engine (a gate), so that nothing races the checks. */
static void test_queue_and_cancel(ps_sched *s, const char *ref) {
    static got g[4];
    uint64_t id[4];
    char err[256] = "";
    for (int i = 0; i < 4; i++) got_init(&g[i]);
    ps_sched_request r = greedy(40), slow = greedy(400);
    g[0].allow = 1;
    PS_CHECK_OK(ps_sched_submit(s, &slow, on_event, &g[0], &id[0], err, sizeof err));
    wait_tokens(&g[0], 1); /* running, held at its first token: the queue is empty */
    PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g[1], &id[1], err, sizeof err));
    PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g[2], &id[2], err, sizeof err));
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g[3], &id[3], err, sizeof err), PS_ERR_BUSY);
    PS_CHECK(strstr(err, "queue is full") != NULL);
    ps_sched_metrics m;
    ps_sched_metrics_get(s, &m);
    PS_CHECK(m.queued == 2 && m.running == 1 && m.kv_blocks_used > 0);
    PS_CHECK_OK(ps_sched_cancel(s, id[1]));
    set_allow(&g[0], 3); /* the queued one ends within a step of the running one */
    wait_done(&g[1]);
    PS_CHECK(g[1].stop == PS_STOP_CANCELLED && g[1].n_tokens == 0);
    pthread_mutex_lock(&g[0].mu);
    PS_CHECK(!g[0].done && g[0].n_tokens <= 3); /* the running one goes on */
    pthread_mutex_unlock(&g[0].mu);
    PS_CHECK_OK(ps_sched_cancel(s, id[0]));
    set_allow(&g[0], 0);
    wait_done(&g[0]);
    PS_CHECK(g[0].stop == PS_STOP_CANCELLED && g[0].n_tokens <= 4);
    wait_done(&g[2]);
    PS_CHECK(g[2].stop == PS_STOP_LENGTH && !strcmp(g[2].text, ref));
    PS_CHECK_EQ_INT(ps_sched_cancel(s, id[2]), PS_ERR_NOT_FOUND); /* already done */
    ps_sched_metrics_get(s, &m);
    PS_CHECK(m.queued == 0 && m.running == 0 && m.kv_blocks_used == 0 && m.rejected == 1);
    PS_CHECK(m.ended[PS_STOP_CANCELLED] == 2 && m.ended[PS_STOP_LENGTH] >= 2 && m.ended[PS_STOP_STOP] == 1);
    PS_CHECK(m.prefix_hits >= 1 && m.ttft.n >= 4 && m.itl.n > 0 && m.kv_blocks_total == N_CTX / PS_KV_BLOCK);
    PS_CHECK(m.kv_blocks_cached > 0 && m.generated_tokens >= 80 && m.coord.compute_ms[0] > 0);
}

/* Log-probabilities: the top-1 is the greedy token, values descending and <= 0. */
static void test_logprobs(ps_sched *s, const char *ref) {
    got g;
    uint64_t id;
    char err[256];
    got_init(&g);
    ps_sched_request r = greedy(40);
    r.top_logprobs = 5;
    PS_CHECK_OK(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err));
    if (!wait_done(&g)) return;
    PS_CHECK(g.logprob_ok && g.n_top_seen == 5 && !strcmp(g.text, ref));
}

/* What submit refuses, with what it says. */
static void test_bad_requests(ps_sched *s) {
    char err[256] = "";
    uint64_t id;
    got g;
    got_init(&g);
    static int32_t big[N_CTX + 1];
    ps_sched_request r = greedy(4);
    r.prompt = big, r.n_prompt = N_CTX + 1;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_RANGE);
    PS_CHECK(strstr(err, "257 tokens") && strstr(err, "context size of 256"));
    r.n_prompt = 0;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_ARG);
    big[0] = 512, r.n_prompt = 1;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "vocabulary") != NULL);
    r = greedy(4), r.top_logprobs = 21;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_ARG);
    r = greedy(4), r.n_stop = 5;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_ARG);
    r = greedy(4), r.gp.sp.top_p = 2;
    PS_CHECK_EQ_INT(ps_sched_submit(s, &r, on_event, &g, &id, err, sizeof err), PS_ERR_ARG);
    PS_CHECK(strstr(err, "top_p") != NULL);
    PS_CHECK(!g.done && g.n_tokens == 0); /* no callback for a refused request */
}

/* Freeing with requests running and queued: each gets its DONE (cancelled, unless it ended
 * first), then nothing. */
static void test_free_in_flight(ps_sched *s) {
    static got g[3];
    uint64_t id;
    char err[256];
    ps_sched_request slow = greedy(400);
    for (int i = 0; i < 3; i++) {
        got_init(&g[i]);
        PS_CHECK_OK(ps_sched_submit(s, &slow, on_event, &g[i], &id, err, sizeof err));
        if (!i) wait_tokens(&g[0], 2); /* running: two more fit the queue */
    }
    ps_sched_free(s);
    for (int i = 0; i < 3; i++) PS_CHECK(g[i].done && (g[i].stop == PS_STOP_CANCELLED || g[i].stop == PS_STOP_CONTEXT));
}

int main(void) {
    const char *path = ps_test_shared_model("stories260K.gguf");
    if (!path) return ps_test_skip("stories260K.gguf is absent (../shared/models)");
    char err[512] = "", *ref = malloc(8192);
    ps_launch_opts lo = {.model = path,
                         .stage = {.threads = 2, .mmap = true},
                         .n_ctx = N_CTX,
                         .max_batch = 32,
                         .tokenizer = true,
                         .timeout_ms = 60000};
    PS_CHECK_OK(ps_launch_start(&lo, &launch, err, sizeof err));
    if (!launch) return fprintf(stderr, "launch: %s\n", err), ps_test_done();
    size_t n = 0;
    PS_CHECK_OK(
        ps_tok_encode(ps_launch_tok(launch), "Once upon a time", 16, true, false, prompt, 64, &n, err, sizeof err));
    n_prompt = (int)n;
    ps_sched_request r = greedy(40);
    alone(&r, ref, 8192);
    ps_sched *s = NULL;
    ps_sched_opts o = {.parallel = 1, .queue_max = 2, .prefix_cache = true};
    PS_CHECK_OK(ps_sched_create(launch, &o, &s, err, sizeof err));
    if (s) {
        test_one_and_stop(s, ref);
        test_prefix(s);
        test_queue_and_cancel(s, ref);
        test_logprobs(s, ref);
        test_bad_requests(s);
        test_free_in_flight(s);
    }
    ps_launch_stop(launch);
    free(ref);
    return ps_test_done();
}
