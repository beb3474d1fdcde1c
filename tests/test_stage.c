/* test_stage.c - the micro-batch message (src/stage/stage.c): encoding round trip, byte
 * layout of the fixed fields, and rejection of every truncated or inconsistent payload. */
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "stage/stage.h"

enum { DIM = 8, N = 3 };

/* A micro-batch with recognisable contents: 3 positions at 5, 2 stage stats, activations. */
static void make_mb(ps_mb *mb, int32_t *tokens, float *x) {
    memset(mb, 0, sizeof *mb);
    for (int i = 0; i < N; i++) tokens[i] = 100 + i;
    for (int i = 0; i < N * DIM; i++) x[i] = (float)i * 0.25f - 1.0f;
    mb->seq = 0x1122334455667788ull;
    mb->mb = 42;
    mb->pos = 5;
    mb->n = N;
    mb->flags = PS_MB_SAMPLE;
    mb->sp = ps_sample_params_default();
    mb->sp.temperature = 0.7f, mb->sp.top_k = 40, mb->sp.seed = 99;
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
    ps_mb mb, out;
    make_mb(&mb, tokens, x);
    ps_wbuf b = {0};
    struct iovec iov[2];
    ps_mb_encode(&b, &mb, DIM, iov);
    static uint8_t buf[4096];
    size_t len = flatten(iov, buf);
    PS_CHECK_EQ_INT(len, 72 + N * 4 + 2 * PS_STAGE_STAT_BYTES + N * DIM * 4);
    /* the fixed fields, byte by byte: seq (u64 LE) first, then mb, pos, n */
    PS_CHECK(buf[0] == 0x88 && buf[7] == 0x11 && buf[8] == 42 && buf[12] == 5 && buf[16] == N);
    char err[256];
    PS_CHECK_OK(ps_mb_decode(buf, len, DIM, 16, &out, err, sizeof err));
    PS_CHECK(out.seq == mb.seq && out.mb == 42 && out.pos == 5 && out.n == N && out.flags == PS_MB_SAMPLE);
    PS_CHECK(out.sp.temperature == 0.7f && out.sp.top_k == 40 && out.sp.seed == 99);
    PS_CHECK(!memcmp(out.tokens, tokens, sizeof tokens) && out.x && !memcmp(out.x, x, sizeof x));
    PS_CHECK_EQ_INT(out.n_stats, 2);
    PS_CHECK(out.stats[1].stage == 2 && out.stats[1].compute_ms == 3.0 && out.stats[1].hop.frames == 11 &&
             out.stats[1].hop.bytes == 2000 && out.stats[1].hop.send_ms == 0.125);
    /* without activations (into stage 0 of a one-stage fleet), and encoded without iov */
    mb.x = NULL;
    ps_mb_encode(&b, &mb, DIM, NULL);
    PS_CHECK_OK(ps_mb_decode(b.p, b.len, DIM, 16, &out, err, sizeof err));
    PS_CHECK(out.x == NULL && out.n == N);
    ps_wbuf_free(&b);
}

static void test_rejects(void) {
    int32_t tokens[N];
    float x[N * DIM];
    ps_mb mb, out;
    make_mb(&mb, tokens, x);
    ps_wbuf b = {0};
    ps_mb_encode(&b, &mb, DIM, NULL);
    char err[256];
    /* every truncation, and one byte too many */
    int bad = 0;
    for (size_t cut = 0; cut < b.len; cut++)
        bad += ps_mb_decode(b.p, cut, DIM, 16, &out, err, sizeof err) == PS_ERR_PROTOCOL;
    PS_CHECK_EQ_INT(bad, b.len);
    uint8_t *longer = calloc(1, b.len + 1);
    memcpy(longer, b.p, b.len);
    PS_CHECK(ps_mb_decode(longer, b.len + 1, DIM, 16, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    free(longer);
    /* a model of another width, too many positions for this stage */
    PS_CHECK(ps_mb_decode(b.p, b.len, DIM + 1, 16, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "activations are 8 wide") != NULL && strstr(err, "model's are 9") != NULL);
    PS_CHECK(ps_mb_decode(b.p, b.len, DIM, N - 1, &out, err, sizeof err) == PS_ERR_PROTOCOL);
    PS_CHECK(strstr(err, "of 3 positions") != NULL && strstr(err, "takes 1..2") != NULL);
    /* corrupt fields: n, pos, flags, n_stats */
    struct {
        size_t off;
        uint32_t v;
    } fields[] = {{16, 0}, {16, 0x7fffffff}, {12, 0xffffffff}, {20, 2}, {28, 1000}};
    for (size_t i = 0; i < PS_ARRAY_LEN(fields); i++) {
        uint8_t *c = malloc(b.len);
        memcpy(c, b.p, b.len);
        memcpy(c + fields[i].off, &fields[i].v, 4);
        PS_CHECK(ps_mb_decode(c, b.len, DIM, 16, &out, err, sizeof err) == PS_ERR_PROTOCOL);
        free(c);
    }
    ps_wbuf_free(&b);
}

int main(void) {
    test_round_trip();
    test_rejects();
    return ps_test_done();
}
