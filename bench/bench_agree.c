/* bench_agree.c - where a draft model guesses the target's next token: the acceptance that
 * speculative decoding meets on a real answer, position by position.
 *
 *   bench_agree -m TARGET -d DRAFT (-p PROMPT | -f FILE) [-n 256] [-t 2]
 *
 * The target answers the prompt greedily (-n tokens, past an end of text: a pattern, not a
 * reply); then the draft reads the prompt and the answer in one pass, and for each answer
 * token j says whether its greedy guess from the true prefix (the prompt and tokens 0..j-1)
 * is token j. Prints the answer's token ids on one line, then one character per token, 1 for
 * a right guess and 0 for a wrong one, then the draft's probability of each guess (its softmax's
 * largest, three decimals: how sure the draft was, right or wrong). In greedy speculation a trip
 * of K guesses sent after token j - 1 keeps the run of 1s from j, at most K (its guesses are the
 * draft's from the true prefix while they are kept), so the lines are all a trip-by-trip replay
 * needs: tests/test_spec.c replays such lines of the Qwen2.5-Coder pair through --spec-k auto. The prompt is tokenized
 * as `pipeshard run -p` does (BOS as the model asks, no special tokens parsed).
 *
 * Build (CMake): bench/bench_*.c are linked with pscore. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tensor/pool.h"
#include "tokenize/tokenize.h"

#define PROMPT_MAX (1 << 20) /* bytes of a prompt file */

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* The softmax's largest probability over v[0..n) (v[best] its largest logit). */
static double top_p(const float *v, int n, int best) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)v[i] - v[best]);
    return 1 / sum;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_agree: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    const char *target = NULL, *draft = NULL, *prompt = NULL, *file = NULL;
    int n = 256, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            target = NULL;
            break;
        }
        if (!strcmp(argv[i], "-m"))
            target = v;
        else if (!strcmp(argv[i], "-d"))
            draft = v;
        else if (!strcmp(argv[i], "-p"))
            prompt = v;
        else if (!strcmp(argv[i], "-f"))
            file = v;
        else if (!strcmp(argv[i], "-n"))
            n = atoi(v);
        else if (!strcmp(argv[i], "-t"))
            threads = atoi(v);
        else {
            target = NULL;
            break;
        }
        i++;
    }
    if (!target || !draft || !prompt == !file || n < 1 || n > 4096 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: bench_agree -m TARGET -d DRAFT (-p PROMPT | -f FILE) [-n 1..4096] [-t threads]\n");
        return 2;
    }
    static char text[PROMPT_MAX];
    size_t len = 0;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) return fail("cannot open the prompt file");
        len = fread(text, 1, sizeof text, f);
        fclose(f);
        if (len == sizeof text) return fail("the prompt file is over 1 MiB");
    } else {
        len = strlen(prompt);
        if (len >= sizeof text) return fail("the prompt is over 1 MiB");
        memcpy(text, prompt, len);
    }
    char err[512];
    ps_model *mt = NULL, *md = NULL;
    ps_pool *pool = NULL;
    ps_tok *tok = NULL;
    if (ps_model_load(target, PS_GGUF_HUGE, &mt, err, sizeof err) ||
        ps_model_load(draft, PS_GGUF_HUGE, &md, err, sizeof err) || ps_tok_create(mt->gguf, &tok, err, sizeof err))
        return fail(err);
    if (md->hp.vocab != mt->hp.vocab) return fail("the draft's vocabulary is not the target's size");
    if (ps_pool_create(threads, &pool)) return fail("no thread pool");
    int vocab = mt->hp.vocab, cap = 8192;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    float *logits = malloc(sizeof(float) * (size_t)vocab * (size_t)n);
    if (!ids || !logits) return fail("out of memory");
    size_t n_prompt = 0;
    if (ps_tok_encode(tok, text, len, true, false, ids, (size_t)(cap - n), &n_prompt, err, sizeof err))
        return fail(err);
    if (n_prompt == 0) return fail("the prompt is empty");
    int L = (int)n_prompt;
    ps_ctx_params cp = {.n_ctx = L + n, .max_batch = 128};
    ps_ctx *ct = NULL, *cd = NULL;
    if (ps_ctx_create(mt, &cp, pool, &ct, err, sizeof err) || ps_ctx_create(md, &cp, pool, &cd, err, sizeof err))
        return fail(err);
    /* the target's answer, one token a pass */
    if (ps_forward(ct, ids, L, 0, logits, 1, err, sizeof err)) return fail(err);
    for (int j = 0; j < n; j++) {
        ids[L + j] = argmax(logits, vocab);
        if (j + 1 < n && ps_forward(ct, ids + L + j, 1, L + j, logits, 1, err, sizeof err)) return fail(err);
    }
    /* the draft's guesses at every answer position, in one pass (rows L - 1 .. L + n - 2) */
    if (ps_forward(cd, ids, L + n - 1, 0, logits, n, err, sizeof err)) return fail(err);
    for (int j = 0; j < n; j++) printf("%d%c", ids[L + j], j + 1 < n ? ' ' : '\n');
    int right = 0;
    for (int j = 0; j < n; j++) {
        bool r = argmax(logits + (size_t)j * vocab, vocab) == ids[L + j];
        right += r;
        putchar(r ? '1' : '0');
    }
    putchar('\n');
    for (int j = 0; j < n; j++) {
        const float *v = logits + (size_t)j * vocab;
        printf("%.3f%c", top_p(v, vocab, argmax(v, vocab)), j + 1 < n ? ' ' : '\n');
    }
    fprintf(stderr, "bench_agree: prompt %d tokens, %d of %d guesses right\n", L, right, n);
    ps_ctx_free(ct), ps_ctx_free(cd), ps_tok_free(tok), ps_model_free(mt), ps_model_free(md), ps_pool_free(pool);
    free(ids), free(logits);
    return 0;
}
