/* f32_ref.c - the reference f32-activation kernel of ps_gemm (f32_kern.h): the
 * canonical arithmetic of gemm.h written out in plain C, one (row, token) pair at a time.
 *
 * Weights come from ps_dequantize_row itself (a chunk of a row at a time), and every
 * multiply-add is fmaf(), which rounds once: plain `a * b + c` must not appear here, as
 * whether the compiler fuses it depends on flags. Slow, and meant to be: the SIMD
 * families are tested against it bit for bit. */
#include <math.h>

#include "f32_kern.h"
#include "types.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

#define CHUNK 256 /* columns dequantized at a time (a multiple of every block size) */
#define TOKS  8   /* tokens served per pass over a weight row */

/* The fixed 16 -> 1 reduction tree of gemm.h. */
static float reduce16(const float acc[16]) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* Lane c % 16 of token t's accumulator takes w[j] * x_t[c], c = c0 + j, for j < n, in
 * increasing c. x points at column 0 of token 0; token t is at x + t * xs. */
static void fma_chunk(const float *w, int64_t c0, int64_t n, const float *x, int64_t xs, int nt, float acc[][16]) {
    for (int t = 0; t < nt; t++) {
        const float *xt = x + t * xs;
        for (int64_t j = 0; j < n; j++) {
            int64_t c = c0 + j;
            acc[t][c & 15] = fmaf(w[j], xt[c], acc[t][c & 15]);
        }
    }
}

/* y[t * ys] = canonical dot of one weight row with tokens t < nt (nt <= TOKS). */
static void row_dot(uint32_t type, const uint8_t *row, int64_t cols, const float *x, int64_t xs, int nt, float *y,
                    int64_t ys) {
    float acc[TOKS][16] = {{0}}; /* +0.0f */
    float w[CHUNK];
    for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        ps_dequantize_row((ps_type)type, row + ps_row_bytes(type, c0), w, n);
        fma_chunk(w, c0, n, x, xs, nt, acc);
    }
    for (int t = 0; t < nt; t++) y[t * ys] = reduce16(acc[t]);
}

/* The ps_f32_fused_fn contract, for weights of `type`. */
static void ref_fused(uint32_t type, const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt,
                      float *y, int64_t ys, int64_t nrows) {
    for (int64_t t0 = 0; t0 < nt; t0 += TOKS) {
        int n = nt - t0 < TOKS ? (int)(nt - t0) : TOKS;
        for (int64_t r = 0; r < nrows; r++)
            row_dot(type, w + (size_t)r * wb, cols, x + t0 * xs, xs, n, y + t0 * ys + r, ys);
    }
}

#define REF_KERN(T)                                                                                                    \
    static void fused_##T(const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt, float *y, \
                          int64_t ys, int64_t nrows) {                                                                 \
        ref_fused(PS_TYPE_##T, w, wb, cols, x, xs, nt, y, ys, nrows);                                                  \
    }

REF_KERN(F32)
REF_KERN(F16)
REF_KERN(BF16)
REF_KERN(Q8_0)
REF_KERN(Q4_0)
REF_KERN(Q4_1)
REF_KERN(Q5_0)
REF_KERN(Q5_1)
REF_KERN(Q4_K)
REF_KERN(Q5_K)
REF_KERN(Q6_K)

/* The family's kernels by ps_type (f32_kern.h): one row per type. */
#define ROW(T) [PS_TYPE_##T] = {.fused = fused_##T, .fused_max = INT32_MAX, .mr = 1, .nr = 1, .kc = 256}
const ps_f32_kern ps_f32_ref_kerns[PS_TYPE_COUNT] = {
    ROW(F32),  ROW(F16),  ROW(BF16), ROW(Q8_0), ROW(Q4_0), ROW(Q4_1),
    ROW(Q5_0), ROW(Q5_1), ROW(Q4_K), ROW(Q5_K), ROW(Q6_K),
};
