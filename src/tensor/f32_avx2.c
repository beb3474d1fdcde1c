/* f32_avx2.c - f32-activation kernels of ps_gemm (f32_kern.h) for AVX2 with FMA and F16C.
 *
 * The 16 lanes of one (row, token) accumulator of gemm.h's canonical arithmetic live in
 * two ymm registers: lanes 0-7 (columns c with c % 16 < 8) and lanes 8-15. Each weight
 * is dequantized with the float operations of types.c (d * (q - 8), (d * q) + m,
 * (d * sc) * q - dmin * m, q * d, ...), eight at a time, then meets its activation in
 * one vfmadd231ps; the reduction is gemm.h's tree (lo + hi, then halves, then pairs).
 * Where types.c rounds a product before adding (Q4_1, Q5_1: d * q + m; Q4_K, Q5_K:
 * (d * sc) * q - dmin * m) the product is exact in float32 (see f32_avx512.c), so an
 * explicit fmadd/fmsub gives the same bits. Nothing else may be fused: -std=c11 keeps
 * GCC at -ffp-contract=off and the pragmas below keep it so.
 *
 * K types first build a super-block's quants with byte operations, 32 at a time.
 *
 * Fused path (n_tok <= 8): passes of 4 rows × 1 token or 2 rows × 2 tokens (8 ymm
 * accumulators), the next row group prefetched into L2. Panel path: 2 rows × 3 tokens
 * (12 ymm accumulators), 10 loads per 12 FMAs. Only 16 ymm registers exist. */
#include <string.h>

#include "f32_kern.h"
#include "types.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

#define TGT __attribute__((target("avx2,fma,f16c")))
#define AI  static inline __attribute__((always_inline)) TGT

#define MR        2 /* panel micro-kernel rows */
#define NR        3 /* panel micro-kernel tokens */
#define FR_MAX    4 /* fused rows: 4 for one token, 2 for two */
#define FT        2 /* fused tokens per pass */
#define FUSED_MAX 8 /* n_tok handled by the fused path (passes of FT tokens beat panels up to 8) */
/* Panel column chunk: with 2-row strips the activations are re-read for every strip, so
 * 3 tokens' chunk (12 KiB) should stay in L1 beside the strip (measured on Zen 4: 1024
 * beats 2048 by 40%, 512 by 5%). */
#define KC 1024

/* 16 lanes: lo = lanes 0-7, hi = lanes 8-15. */
typedef struct {
    __m256 lo, hi;
} v16;

// Vector helpers

/* v + 0, ..., v + 7 as floats. */
AI __m256 iota8(float v) { return _mm256_add_ps(_mm256_set1_ps(v), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)); }

/* The binary16 at p (unaligned), converted exactly and broadcast. */
AI __m256 f16_bcast(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

/* 8 bytes at p zero- (sign-) extended to 8 int32. */
AI __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AI __m256i i8x8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

AI __m256i and_c(__m256i v, int c) { return _mm256_and_si256(v, _mm256_set1_epi32(c)); }

AI v16 fma16(v16 w, const float *x, v16 acc) {
    acc.lo = _mm256_fmadd_ps(w.lo, _mm256_loadu_ps(x), acc.lo);
    acc.hi = _mm256_fmadd_ps(w.hi, _mm256_loadu_ps(x + 8), acc.hi);
    return acc;
}

/* Sums of two 16-lane accumulators by gemm.h's tree: [sum a, sum b, -, -]. */
AI __m128 reduce2(v16 a, v16 b) {
    __m256 sa = _mm256_add_ps(a.lo, a.hi), sb = _mm256_add_ps(b.lo, b.hi); /* s8 */
    __m256 s4 = _mm256_add_ps(_mm256_permute2f128_ps(sa, sb, 0x20), _mm256_permute2f128_ps(sa, sb, 0x31));
    __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4e));
    __m256 s1 = _mm256_add_ps(s2, _mm256_permute_ps(s2, 0xb1));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1));
}

/* Stores the first n (1 or 2) floats of v at y. */
AI void store_n(float *y, __m128 v, int64_t n) {
    if (n >= 2)
        _mm_storel_pi((__m64 *)y, v);
    else
        _mm_store_ss(y, v);
}

// Dequantization: per type, prep() once per block, then unit() per 32 elements

typedef struct {
    __m256 d, m;                     /* scale and minimum (32-element types) */
    _Alignas(32) float sc[16];       /* K types: d * sc[0..8), dmin * m[0..8); q6_K: d * sc[0..16) */
    _Alignas(32) uint8_t q[PS_QK_K]; /* K types: the quants, element by element (q6_K: q - 32) */
} dq_state;

AI int blk_elems(int ty) { return ty == PS_TYPE_Q4_K || ty == PS_TYPE_Q5_K || ty == PS_TYPE_Q6_K ? PS_QK_K : PS_QK; }

AI bool is_k_type(int ty) { return ty == PS_TYPE_Q4_K || ty == PS_TYPE_Q5_K || ty == PS_TYPE_Q6_K; }

AI int blk_bytes(int ty) {
    switch (ty) {
    case PS_TYPE_Q4_0: return sizeof(ps_block_q4_0);
    case PS_TYPE_Q4_1: return sizeof(ps_block_q4_1);
    case PS_TYPE_Q5_0: return sizeof(ps_block_q5_0);
    case PS_TYPE_Q5_1: return sizeof(ps_block_q5_1);
    case PS_TYPE_Q8_0: return sizeof(ps_block_q8_0);
    case PS_TYPE_Q4_K: return sizeof(ps_block_q4_K);
    case PS_TYPE_Q5_K: return sizeof(ps_block_q5_K);
    default: return sizeof(ps_block_q6_K);
    }
}

AI __m256i bytes32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* d * sc[0..8) and dmin * m[0..8) of a q4_K / q5_K super-block into sc[0..16) (types.c's
 * unpacking, on four u32 at once as ggml does). */
AI void k4_scales(const uint8_t *blk, float *sc) {
    uint32_t u[4];
    memcpy(u, blk + 4, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t mins = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins;
    u[0] &= m1;
    _mm256_store_ps(sc, _mm256_mul_ps(f16_bcast(blk), _mm256_cvtepi32_ps(u8x8((const uint8_t *)u))));
    _mm256_store_ps(sc + 8, _mm256_mul_ps(f16_bcast(blk + 2), _mm256_cvtepi32_ps(u8x8((const uint8_t *)u + 8))));
}

/* q4_K / q5_K quants of the super-block at blk into q[0..256), 32 bytes at a time: for
 * each 64-element group g, elements 64g.. are the low nibbles of qs[32g ..+32) and
 * 64g + 32.. the high ones; q5_K adds 16 where bit s of qh[l] is set (element 32s + l). */
AI void k4_bytes(int ty, const uint8_t *blk, uint8_t *q) {
    const uint8_t *qs = blk + (ty == PS_TYPE_Q4_K ? 16 : 48);
    __m256i m0f = _mm256_set1_epi8(0x0f), qh = bytes32(blk + 16);
    for (int g = 0; g < 4; g++) {
        __m256i v = bytes32(qs + 32 * g);
        __m256i lo = _mm256_and_si256(v, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
        if (ty == PS_TYPE_Q5_K) {
            __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * g))), b1 = _mm256_set1_epi8((char)(2 << (2 * g)));
            __m256i k16 = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), k16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), k16));
        }
        _mm256_store_si256((__m256i *)(q + 64 * g), lo);
        _mm256_store_si256((__m256i *)(q + 64 * g + 32), hi);
    }
}

/* q6_K: q - 32 of the super-block at blk into q[0..256) (as int8), 32 bytes at a time: in
 * half h, elements 32j + l take nibble j / 2 of ql[64h + 32(j % 2) + l] and bits 2j, 2j + 1
 * of qh[32h + l] (types.c's layout). */
AI void q6_bytes(const uint8_t *blk, uint8_t *q) {
    __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = bytes32(blk + 64 * h), l1 = bytes32(blk + 64 * h + 32), qh = bytes32(blk + 128 + 32 * h);
        __m256i e[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
        };
        for (int j = 0; j < 4; j++) _mm256_store_si256((__m256i *)(q + 128 * h + 32 * j), _mm256_sub_epi8(e[j], k32));
    }
}

AI void dq_prep(int ty, const uint8_t *blk, dq_state *st) {
    switch (ty) {
    case PS_TYPE_Q4_0:
    case PS_TYPE_Q5_0:
    case PS_TYPE_Q8_0: st->d = f16_bcast(blk); break;
    case PS_TYPE_Q4_1:
    case PS_TYPE_Q5_1:
        st->d = f16_bcast(blk);
        st->m = f16_bcast(blk + 2);
        break;
    case PS_TYPE_Q4_K:
    case PS_TYPE_Q5_K:
        k4_scales(blk, st->sc);
        k4_bytes(ty, blk, st->q);
        break;
    default: { /* Q6_K */
        __m256 d = f16_bcast(blk + 208);
        _mm256_store_ps(st->sc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(blk + 192))));
        _mm256_store_ps(st->sc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(blk + 200))));
        q6_bytes(blk, st->q);
        break;
    }
    }
}

/* Fifth bits j0 .. j0 + 7 of the u32 qh, moved to bit 4. */
AI __m256i bit5(uint32_t qh, int j0) {
    __m256i b = _mm256_srlv_epi32(_mm256_set1_epi32((int)qh),
                                  _mm256_setr_epi32(j0, j0 + 1, j0 + 2, j0 + 3, j0 + 4, j0 + 5, j0 + 6, j0 + 7));
    return _mm256_slli_epi32(and_c(b, 1), 4);
}

/* 8 consecutive values of a 32-element block: q is their quant (0..31 or -128..127). */
AI __m256 val32(int ty, __m256i q, const dq_state *st) {
    switch (ty) {
    case PS_TYPE_Q4_0: return _mm256_mul_ps(st->d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
    case PS_TYPE_Q5_0: return _mm256_mul_ps(st->d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16))));
    case PS_TYPE_Q8_0: return _mm256_mul_ps(_mm256_cvtepi32_ps(q), st->d);
    default: return _mm256_fmadd_ps(st->d, _mm256_cvtepi32_ps(q), st->m); /* Q4_1, Q5_1: exact d * q */
    }
}

/* Elements 8j .. 8j + 7 of a 32-element block (j < 4). */
AI __m256 dq32(int ty, const uint8_t *blk, int j, const dq_state *st) {
    if (ty == PS_TYPE_Q8_0) return val32(ty, i8x8(blk + 2 + 8 * j), st);
    int o = ty == PS_TYPE_Q4_0 ? 2 : ty == PS_TYPE_Q4_1 ? 4 : ty == PS_TYPE_Q5_0 ? 6 : 8;
    __m256i q = u8x8(blk + o + 8 * (j & 1));
    q = j >= 2 ? _mm256_srli_epi32(q, 4) : and_c(q, 15);
    if (ty == PS_TYPE_Q5_0 || ty == PS_TYPE_Q5_1) {
        uint32_t qh;
        memcpy(&qh, blk + o - 4, 4);
        q = _mm256_or_si256(q, bit5(qh, 8 * j));
    }
    return val32(ty, q, st);
}

/* Elements 32u + 8j .. + 7 of a K-type super-block prepared by dq_prep: q4_K / q5_K
 * (d * sc) * q - dmin * m, q6_K (d * sc) * (q - 32). */
AI __m256 dq_k(int ty, int u, int j, const dq_state *st) {
    const uint8_t *q = st->q + 32 * u + 8 * j;
    if (ty == PS_TYPE_Q6_K) return _mm256_mul_ps(_mm256_set1_ps(st->sc[2 * u + (j >> 1)]), _mm256_cvtepi32_ps(i8x8(q)));
    return _mm256_fmsub_ps(_mm256_set1_ps(st->sc[u]), _mm256_cvtepi32_ps(u8x8(q)),
                           _mm256_set1_ps(st->sc[u + 8])); /* exact */
}

/* Elements [32u, 32u + 32) of the block at blk as two 16-lane vectors. */
AI void dq_unit(int ty, const uint8_t *blk, int u, const dq_state *st, v16 *v0, v16 *v1) {
    __m256 e[4];
    for (int j = 0; j < 4; j++) e[j] = is_k_type(ty) ? dq_k(ty, u, j, st) : dq32(ty, blk, j, st);
    *v0 = (v16){e[0], e[1]};
    *v1 = (v16){e[2], e[3]};
}

// Float types

AI int elem_bytes(int ty) { return ty == PS_TYPE_F32 ? 4 : 2; }

AI bool is_float_type(int ty) { return ty == PS_TYPE_F32 || ty == PS_TYPE_F16 || ty == PS_TYPE_BF16; }

/* 8 weights of float type ty at p. */
AI __m256 ld8(int ty, const uint8_t *p) {
    if (ty == PS_TYPE_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (ty == PS_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI v16 ld16(int ty, const uint8_t *p) { return (v16){ld8(ty, p), ld8(ty, p + 8 * elem_bytes(ty))}; }

/* The last n < 16 weights (at p) zero-padded to 16 lanes, through a local copy. */
AI v16 ld16_tail(int ty, const uint8_t *p, int64_t n) {
    uint8_t buf[64] = {0};
    memcpy(buf, p, (size_t)n * (size_t)elem_bytes(ty));
    return ld16(ty, buf);
}

/* acc + w * x on the first n < 16 lanes; the other lanes keep acc (x read only to n). */
AI v16 fma16_tail(v16 w, const float *x, int64_t n, v16 acc) {
    float xb[16] = {0};
    memcpy(xb, x, (size_t)n * sizeof(float));
    const int32_t idx[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    __m256i nn = _mm256_set1_epi32((int)n);
    __m256 klo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nn, _mm256_loadu_si256((const __m256i *)idx)));
    __m256 khi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nn, _mm256_loadu_si256((const __m256i *)(idx + 8))));
    v16 r = fma16(w, xb, acc);
    return (v16){_mm256_blendv_ps(acc.lo, r.lo, klo), _mm256_blendv_ps(acc.hi, r.hi, khi)};
}

// Fused path

/* Writes the sums of acc[0..R)[t] to y[t * ys + i], i < nrows (R is 2 or 4). */
AI void store_rows(v16 acc[FR_MAX][FT], int R, int T, float *y, int64_t ys, int64_t nrows) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < R && i < nrows; i += 2)
            store_n(y + t * ys + i, reduce2(acc[i][t], acc[i + 1][t]), nrows - i);
}

/* R rows (row i at p[i]) × T tokens of a float type, cols columns (a ragged tail of the
 * 16-lane steps goes through fma16_tail). */
AI void fused_f(int ty, const uint8_t *const p[FR_MAX], int R, int64_t cols, const float *x, int64_t xs, int T,
                v16 acc[FR_MAX][FT]) {
    const int es = elem_bytes(ty);
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
        for (int i = 0; i < R; i++) {
            v16 v = ld16(ty, p[i] + c * es);
            for (int t = 0; t < T; t++) acc[i][t] = fma16(v, x + t * xs + c, acc[i][t]);
        }
    if (c < cols)
        for (int i = 0; i < R; i++) {
            v16 v = ld16_tail(ty, p[i] + c * es, cols - c);
            for (int t = 0; t < T; t++) acc[i][t] = fma16_tail(v, x + t * xs + c, cols - c, acc[i][t]);
        }
}

/* R rows × T tokens of a block-quantized type; prefetches every line of each block pf
 * bytes further on (the next row group's) into L2. */
AI void fused_q(int ty, const uint8_t *const p[FR_MAX], int R, int64_t cols, const float *x, int64_t xs, int T,
                v16 acc[FR_MAX][FT], int64_t pf) {
    const int bs = blk_elems(ty), bb = blk_bytes(ty);
    for (int64_t b = 0; b < cols / bs; b++) {
        dq_state st[FR_MAX];
        for (int i = 0; i < R; i++) {
            for (int o = 0; o < bb; o += 64) _mm_prefetch((const char *)(p[i] + pf + b * bb + o), _MM_HINT_T1);
            dq_prep(ty, p[i] + b * bb, &st[i]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < bs / 32; u++) {
            const float *xb = x + b * bs + 32 * u;
            for (int i = 0; i < R; i++) {
                v16 v0, v1;
                dq_unit(ty, p[i] + b * bb, u, &st[i], &v0, &v1);
                for (int t = 0; t < T; t++) acc[i][t] = fma16(v1, xb + t * xs + 16, fma16(v0, xb + t * xs, acc[i][t]));
            }
        }
    }
}

/* One register tile: R rows × T tokens (both constants after inlining). */
AI void fused_tile(int ty, const uint8_t *const p[FR_MAX], int R, int64_t cols, const float *x, int64_t xs, int T,
                   float *y, int64_t ys, int64_t nrows, int64_t pf) {
    v16 acc[FR_MAX][FT];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < T; t++) acc[i][t] = (v16){_mm256_setzero_ps(), _mm256_setzero_ps()};
    if (is_float_type(ty))
        fused_f(ty, p, R, cols, x, xs, T, acc);
    else
        fused_q(ty, p, R, cols, x, xs, T, acc, pf);
    store_rows(acc, R, T, y, ys, nrows);
}

/* The ps_f32_fused_fn contract for type ty: groups of 4 rows for one token (the FMA
 * chains need the parallelism), of 2 rows × 2 tokens otherwise (16 ymm registers); a
 * short last row group repeats its last row (those sums are not stored). */
AI void fused(int ty, const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt, float *y,
              int64_t ys, int64_t nrows) {
    for (int64_t t0 = 0; t0 < nt; t0 += FT) {
        int64_t T = nt - t0 < FT ? nt - t0 : FT;
        int R = T == 1 ? 4 : 2;
        for (int64_t r0 = 0; r0 < nrows; r0 += R) {
            int64_t n = nrows - r0 < R ? nrows - r0 : R;
            const uint8_t *p[FR_MAX];
            for (int i = 0; i < FR_MAX; i++) p[i] = w + (size_t)(r0 + (i < n ? i : n - 1)) * wb;
            const float *xt = x + t0 * xs;
            float *yt = y + t0 * ys + r0;
            if (T == 1)
                fused_tile(ty, p, 4, cols, xt, xs, 1, yt, ys, n, 4 * (int64_t)wb);
            else
                fused_tile(ty, p, 2, cols, xt, xs, 2, yt, ys, n, 2 * (int64_t)wb);
        }
    }
}

// Panel path

/* Stores 16 lanes at d (aligned). */
AI void store16(float *d, v16 v) {
    _mm256_store_ps(d, v.lo);
    _mm256_store_ps(d + 8, v.hi);
}

/* Row of a strip, columns [0, kc) of the chunk, into dst (step k at dst + k * MR * 16). */
AI void pack_row(int ty, const uint8_t *row, int64_t kc, float *dst) {
    if (is_float_type(ty)) {
        const int es = elem_bytes(ty);
        for (int64_t c = 0; c < kc; c += 16)
            store16(dst + (c / 16) * MR * 16,
                    kc - c >= 16 ? ld16(ty, row + c * es) : ld16_tail(ty, row + c * es, kc - c));
        return;
    }
    const int bs = blk_elems(ty), bb = blk_bytes(ty);
    for (int64_t b = 0; b < kc / bs; b++) {
        dq_state st;
        dq_prep(ty, row + b * bb, &st);
        for (int u = 0; u < bs / 32; u++) {
            v16 v0, v1;
            dq_unit(ty, row + b * bb, u, &st, &v0, &v1);
            float *d = dst + (b * bs / 16 + 2 * u) * MR * 16;
            store16(d, v0);
            store16(d + MR * 16, v1);
        }
    }
}

/* The ps_f32_pack_fn contract for type ty. */
AI void pack(int ty, const uint8_t *w, size_t wb, int64_t c0, int64_t kc, int64_t nrows, float *panel) {
    int64_t kcp = (kc + 15) & ~(int64_t)15, n_strips = (nrows + MR - 1) / MR;
    const int64_t off = is_float_type(ty) ? c0 * elem_bytes(ty) : c0 / blk_elems(ty) * blk_bytes(ty);
    for (int64_t r = 0; r < n_strips * MR; r++) {
        float *dst = panel + (r / MR) * MR * kcp + (r % MR) * 16;
        if (r < nrows) {
            pack_row(ty, w + (size_t)r * wb + off, kc, dst);
            continue;
        }
        for (int64_t k = 0; k < kcp / 16; k++)
            store16(dst + k * MR * 16, (v16){_mm256_setzero_ps(), _mm256_setzero_ps()});
    }
}

/* Micro-kernel: MR strip rows × T tokens; T, first and last are constants after
 * inlining, so that the accumulators stay in registers from start to end. */
AI void tile_t(const float *strip, int64_t kc, const float *x, int64_t xs, int T, float *part, bool first, bool last,
               float *y, int64_t ys, int64_t nrows) {
    __m256 acc[MR][NR][2];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++)
                acc[i][t][h] = first ? _mm256_setzero_ps() : _mm256_load_ps(part + (t * MR + i) * 16 + 8 * h);
    int64_t steps = kc / 16;
    for (int64_t k = 0; k < steps; k++) {
        const float *wk = strip + k * MR * 16;
        for (int h = 0; h < 2; h++) {
            __m256 w0 = _mm256_load_ps(wk + 8 * h), w1 = _mm256_load_ps(wk + 16 + 8 * h);
            for (int t = 0; t < T; t++) {
                __m256 xv = _mm256_loadu_ps(x + t * xs + 16 * k + 8 * h);
                __asm__("" : "+x"(xv)); /* one load for both rows, not a memory operand in each FMA */
                acc[0][t][h] = _mm256_fmadd_ps(w0, xv, acc[0][t][h]);
                acc[1][t][h] = _mm256_fmadd_ps(w1, xv, acc[1][t][h]);
            }
        }
    }
    if (last && (kc & 15)) /* float types only: the masked last step of the last chunk */
        for (int t = 0; t < T; t++)
            for (int i = 0; i < MR; i++) {
                const float *wk = strip + (steps * MR + i) * 16;
                v16 a = fma16_tail((v16){_mm256_load_ps(wk), _mm256_load_ps(wk + 8)}, x + t * xs + 16 * steps, kc & 15,
                                   (v16){acc[i][t][0], acc[i][t][1]});
                acc[i][t][0] = a.lo;
                acc[i][t][1] = a.hi;
            }
    for (int t = 0; t < T; t++) {
        if (last) {
            store_n(y + t * ys, reduce2((v16){acc[0][t][0], acc[0][t][1]}, (v16){acc[1][t][0], acc[1][t][1]}), nrows);
            continue;
        }
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) _mm256_store_ps(part + (t * MR + i) * 16 + 8 * h, acc[i][t][h]);
    }
}

/* tile_t for one mode and any nt <= NR. */
AI void tile_m(const float *strip, int64_t kc, const float *x, int64_t xs, int64_t nt, float *part, bool first,
               bool last, float *y, int64_t ys, int64_t nrows) {
    switch (nt) {
    case 1: tile_t(strip, kc, x, xs, 1, part, first, last, y, ys, nrows); break;
    case 2: tile_t(strip, kc, x, xs, 2, part, first, last, y, ys, nrows); break;
    default: tile_t(strip, kc, x, xs, 3, part, first, last, y, ys, nrows); break;
    }
}

/* The ps_f32_tile_fn contract. */
static TGT void tile(const float *strip, int64_t kc, const float *x, int64_t xs, int64_t nt, float *part, int mode,
                     float *y, int64_t ys, int64_t nrows) {
    switch (mode & (PS_F32_FIRST | PS_F32_LAST)) {
    case 0: tile_m(strip, kc, x, xs, nt, part, false, false, y, ys, nrows); break;
    case PS_F32_FIRST: tile_m(strip, kc, x, xs, nt, part, true, false, y, ys, nrows); break;
    case PS_F32_LAST: tile_m(strip, kc, x, xs, nt, part, false, true, y, ys, nrows); break;
    default: tile_m(strip, kc, x, xs, nt, part, true, true, y, ys, nrows); break;
    }
}

// Tables

#define KERN(T)                                                                                                        \
    static TGT void fused_##T(const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt,       \
                              float *y, int64_t ys, int64_t nrows) {                                                   \
        fused(PS_TYPE_##T, w, wb, cols, x, xs, nt, y, ys, nrows);                                                      \
    }                                                                                                                  \
    static TGT void pack_##T(const uint8_t *w, size_t wb, int64_t c0, int64_t kc, int64_t nrows, float *p) {           \
        pack(PS_TYPE_##T, w, wb, c0, kc, nrows, p);                                                                    \
    }

KERN(F32)
KERN(F16)
KERN(BF16)
KERN(Q8_0)
KERN(Q4_0)
KERN(Q4_1)
KERN(Q5_0)
KERN(Q5_1)
KERN(Q4_K)
KERN(Q5_K)
KERN(Q6_K)

/* The family's kernels by ps_type (f32_kern.h): one row per type. */
#define ROW(T) [PS_TYPE_##T] = {fused_##T, pack_##T, tile, FUSED_MAX, MR, NR, KC}
const ps_f32_kern ps_f32_avx2_kerns[PS_TYPE_COUNT] = {
    ROW(F32),  ROW(F16),  ROW(BF16), ROW(Q8_0), ROW(Q4_0), ROW(Q4_1),
    ROW(Q5_0), ROW(Q5_1), ROW(Q4_K), ROW(Q5_K), ROW(Q6_K),
};

#else

const ps_f32_kern ps_f32_avx2_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */

#endif
