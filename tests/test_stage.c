/* test_stage.c - the stage messages (src/stage/stage.c): the micro-batch of several
 * sequences and the TOKENS answer: encoding round trips, the byte layout of the fixed
 * fields, and rejection of every truncated or inconsistent payload. */
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "stage/stage.h"

enum { DIM = 8, N = 5, VOCAB = 1000 };

static const int32_t TAB_A[2] = {7, 3}, TAB_B[1] = {4};

/* A micro-batch with recognisable contents: sequence A's 3 positions at 30 (sampled, 2 top
 * log-probabilities asked), sequence B's 2 at 0, 2 stage stats, activations. */
static void make_mb(ps_mb *mb, ps_mb_seg *segs, int32_t *tokens, float *x) {
    memset(mb, 0, sizeof *mb);
    for (int i = 0; i < N; i++) tokens[i] = 100 + i;
    for (int i = 0; i < N * DIM; i++) x[i] = (float)i * 0.25f - 1.0f;
    segs[0] = (ps_mb_seg){.seq = 0x1122334455667788ull,
                          .pos = 30,
                          .n = 3,
                          .flags = PS_MB_SAMPLE,
                          .n_top = 2,
                          .sp = ps_sample_params_default(),
                          .n_blocks = 2,
                          .blocks = TAB_A};
    segs[0].sp.temperature = 0.7f, segs[0].sp.top_k = 40, segs[0].sp.seed = 99;
    segs[1] = (ps_mb_seg){.seq = 9, .pos = 0, .n = 2, .sp = ps_sample_params_default(), .n_blocks = 1, .blocks = TAB_B};
    mb->mb = 42;
    mb->n_segs = 2;
    mb->segs = segs;
    mb->n = N;
    mb->tokens = tokens;
    mb->x = x;
    mb->n_stats = 2;
    for (int k = 0; k < 2; k++)
        mb->stats[k] =
            (ps_stage_stat){.stage = k + 1, .compute_ms = 1.5 * (k + 1), .hop = {k + 10, 1000 * (k + 1), 0.125}};
}

/* Flattens an iovec pair into buf; returns the length. */
static size_t flatten(const struct iovec iov[2], uint8_t *buf) {
    memcpy(buf, iov[0].iov_base, iov[0].iov_len);
    memcpy(buf + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
    return iov[0].iov_len + iov[1].iov_len;
}

static void test_round_trip(void) {
    int32_t tokens[N];
    float x[N * DIM];
    ps_mb_seg segs[2], osegs[4];
    ps_mb mb, out = {.segs = osegs};
    make_mb(&mb, segs, tokens, x);
    ps_wbuf b = {0};
    struct iovec iov[2];
    ps_mb_encode(&b, &mb, DIM, iov);
    static uint8_t buf[4096];
    size_t len = flatten(iov, buf);
    PS_CHECK_EQ_INT(len, 24 + 2 * 72 + 3 * 4 + N * 4 + 2 * PS_STAGE_STAT_BYTES + N * DIM * 4);
    /* the header (mb, n_segs, n), then the first segment: seq (u64 LE), pos, n, flags, n_top */
    PS_CHECK(buf[0] == 42 && buf[4] == 2 && buf[8] == N && buf[12] == DIM && buf[16] == 2);
    PS_CHECK(buf[24] == 0x88 && buf[31] == 0x11 && buf[32] == 30 && buf[36] == 3 && buf[40] == PS_MB_SAMPLE &&
             buf[44] == 2);
    char err[256];
    PS_CHECK_OK(ps_mb_decode(buf, len, DIM, 16, 4, &out, err, sizeof err));
    PS_CHECK(out.mb == 42 && out.n == N && out.n_segs == 2);
    const ps_mb_seg *a = &out.segs[0], *c = &out.segs[1];
    PS_CHECK(a->seq == segs[0].seq && a->pos == 30 && a->n == 3 && a->flags == PS_MB_SAMPLE && a->n_top == 2);
    PS_CHECK(a->sp.temperature == 0.7f && a->sp.top_k == 40 && a->sp.seed == 99);
    PS_CHECK(a->n_blocks == 2 && a->blocks[0] == 7 && a->blocks[1] == 3);
    PS_CHECK(c->seq == 9 && c->pos == 0 && c->n == 2 && c->flags == 0 && c->n_blocks == 1 && c->blocks[0] == 4);
    PS_CHECK(!memcmp(out.tokens, tokens, sizeof tokens) && out.x && !memcmp(out.x, x, sizeof x));
    PS_CHECK_EQ_INT(out.n_stats, 2);
    PS_CHECK(out.stats[1].stage == 2 && out.stats[1].compute_ms == 3.0 && out.stats[1].hop.frames == 11 &&
             out.stats[1].hop.bytes == 2000 && out.stats[1].hop.send_ms == 0.125);
    /* without activations (into stage 0 of a one-stage fleet), and encoded without iov */
    mb.x = NULL;
    ps_mb_encode(&b, &mb, DIM, NULL);
    PS_CHECK_OK(ps_mb_decode(b.p, b.len, DIM, 16, 4, &out, err, sizeof err));
    PS_CHECK(out.x == NULL && out.n == N);
    PS_CHECK(ps_mb_max_bytes(DIM, 16, 4, 0, 64) >= len);
    ps_wbuf_free(&b);
}

/* A segment whose last token is a guess drawn from a distribution it carries: the 132 bytes
 * travel after the block table and come back as they went; every truncation is refused. */
static void test_draft_dist(void) {
    int32_t tokens[N];
    float x[N * DIM];
    ps_mb_seg segs[2], osegs[4];
    ps_mb mb, out = {.segs = osegs};
    make_mb(&mb, segs, tokens, x);
    ps_draft_dist q = {.n = 3, .id = {104, 7, 9}, .p = {0.5f, 0.25f, 0.25f}};
    segs[0].n_draft = 1, segs[0].flags |= PS_MB_DRAFT_DIST, segs[0].dist = &q;
    ps_wbuf b = {0};
    ps_mb_encode(&b, &mb, DIM, NULL);
    PS_CHECK_EQ_INT(b.len, 24 + 2 * 72 + 3 * 4 + 132 + N * 4 + 2 * PS_STAGE_STAT_BYTES + N * DIM * 4);
    char err[256];
    PS_CHECK_OK(ps_mb_decode(b.p, b.len, DIM, 16, 4, &out, err, sizeof err));
    PS_CHECK(out.segs[0].n_draft == 1 && out.segs[0].dist && !memcmp(out.segs[0].dist, &q, sizeof q));
    PS_CHECK(out.segs[1].dist == NULL && !memcmp(out.tokens, tokens, sizeof tokens));
    PS_CHECK(ps_mb_max_bytes(DIM, 16, 4, 1, 64) >= b.len);
    int bad = 0;
    for (size_t cut = 0; cut < b.len; cut++)
        bad += ps_mb_decode(b.p, cut, DIM, 16, 4, &out, err, sizeof err) == PS_ERR_PROTOCOL;
    PS_CHECK_EQ_INT(bad, b.len);
    ps_wbuf_free(&b);
}

static void test_rejects(void) {
    int32_t tokens[N];
    float x[N * DIM];
    ps_mb_seg segs[2], osegs[4];
    ps_mb mb, out = {.segs = osegs};
    make_mb(&mb, segs, tokens, x);
    ps_wbuf b = {0};
    ps_mb_encode(&b, &mb, DIM, NULL);
    char err[256];
    /* every truncation, and one byte too many */
    int bad = 0;
    for (size_t cut = 0; cut < b.len; cut++)
        bad += ps_mb_decode(b.p, cut, DIM, 16, 4, &out, err, sizeof err) == PS_ERR_PROTOCOL;
    PS_CHECK_EQ_INT(bad, b.len);
    uint8_t *longer = calloc(1, b.len + 1);
    memcpy(longer, b.p, b.len);
    PS_CHECK(ps_mb_decode(longer, b.len + 1, DIM, 16, 4, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    free(longer);
    /* a model of another width, too many positions or sequences for this stage */
    PS_CHECK(ps_mb_decode(b.p, b.len, DIM + 1, 16, 4, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "activations are 8 wide") != NULL && strstr(err, "model's are 9") != NULL);
    PS_CHECK(ps_mb_decode(b.p, b.len, DIM, N - 1, 4, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "of 5 positions") != NULL && strstr(err, "takes 1..4") != NULL);
    PS_CHECK(ps_mb_decode(b.p, b.len, DIM, 16, 1, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "of 2 sequences") != NULL);
    /* corrupt fields: header n, n_segs, n_stats; segment n, pos, flags, n_top, n_blocks */
    struct {
        size_t off;
        uint32_t v;
    } fields[] = {{8, 0},  {8, 0x7fffffff},  {8, 4},  {4, 0},   {4, 3},           {16, 1000}, {36, 0},
                  {36, 4}, {32, 0xffffffff}, {40, 4}, {44, 21}, {88, 0xffffffff}, {88, 3}};
    for (size_t i = 0; i < PS_ARRAY_LEN(fields); i++) {
        uint8_t *c = malloc(b.len);
        memcpy(c, b.p, b.len);
        memcpy(c + fields[i].off, &fields[i].v, 4);
        int s = ps_mb_decode(c, b.len, DIM, 16, 4, &out, err, sizeof err);
        if (s != PS_ERR_PROTOCOL) fprintf(stderr, "field at %zu = %u was accepted\n", fields[i].off, fields[i].v);
        PS_CHECK(s == PS_ERR_PROTOCOL);
        free(c);
    }
    ps_wbuf_free(&b);
}

static void test_results(void) {
    ps_result res[2] = {{.seq = 5,
                         .pos = 33,
                         .token = 17,
                         .logprob = -0.5f,
                         .n_top = 2,
                         .top_id = {17, 3},
                         .top_logprob = {-0.5f, -1.25f}},
                        {.seq = 6, .pos = 2, .token = 999, .logprob = -3.0f}};
    ps_stage_stat st = {.stage = 1, .compute_ms = 2.5, .hop = {1, 2, 3}};
    ps_wbuf b = {0};
    ps_result_encode(&b, 77, res, 2, &st, 1);
    PS_CHECK_EQ_INT(b.len, 12 + 24 + 2 * 8 + 24 + PS_STAGE_STAT_BYTES);
    uint32_t mb;
    ps_result out[2];
    ps_stage_stat ost[PS_SHARD_MAX_STAGES];
    int n_res, n_stats;
    char err[256];
    PS_CHECK_OK(ps_result_decode(b.p, b.len, VOCAB, &mb, out, 2, &n_res, ost, &n_stats, err, sizeof err));
    PS_CHECK(mb == 77 && n_res == 2 && n_stats == 1 && ost[0].compute_ms == 2.5);
    PS_CHECK(out[0].seq == 5 && out[0].pos == 33 && out[0].token == 17 && out[0].n_top == 2 && out[0].top_id[1] == 3 &&
             out[0].top_logprob[1] == -1.25f);
    PS_CHECK(out[1].seq == 6 && out[1].token == 999 && out[1].n_top == 0 && out[1].logprob == -3.0f);
    /* every truncation; a token outside the vocabulary; more results than room */
    int bad = 0;
    for (size_t cut = 0; cut < b.len; cut++)
        bad += ps_result_decode(b.p, cut, VOCAB, &mb, out, 2, &n_res, ost, &n_stats, err, sizeof err) != PS_OK;
    PS_CHECK_EQ_INT(bad, b.len);
    PS_CHECK(ps_result_decode(b.p, b.len, 999, &mb, out, 2, &n_res, ost, &n_stats, err, sizeof err) != PS_OK);
    PS_CHECK(ps_result_decode(b.p, b.len, VOCAB, &mb, out, 1, &n_res, ost, &n_stats, err, sizeof err) != PS_OK);
    ps_wbuf_free(&b);
}

int main(void) {
    test_round_trip();
    test_draft_dist();
    test_rejects();
    test_results();
    return ps_test_done();
}
