/* f32_avx512.c - f32-activation kernels of ps_gemm (f32_kern.h) for AVX-512 (F, BW, VL, DQ) with FMA and F16C.
 *
 * A zmm register holds the 16 lanes of one (row, token) accumulator of gemm.h's
 * canonical arithmetic: step k of a row multiplies W[r][16k .. 16k + 16) by the same
 * columns of x, lane by lane, with one vfmadd231ps. Weights are dequantized 16 at a time
 * into zmm registers holding exactly ps_dequantize_row's values:
 *   - Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K look their values up (vpermps / vpermt2ps) in a
 *     16- or 32-entry table of the block (or sub-block) built with the float operations
 *     of types.c (d * (q - 8), (d * q) + m, (d * sc) * q - dmin * m), one entry per q;
 *   - Q8_0, Q5_K and Q6_K convert q to float and scale it, as types.c does; Q5_K and
 *     Q6_K first build a super-block's quants 64 at a time with byte operations;
 *   - F16 / BF16 convert exactly, F32 is loaded as is.
 * types.c rounds d * q before adding m (Q4_1, Q5_1) and (d * sc) * q before subtracting
 * dmin * m (Q4_K, Q5_K). Those products are exact in float32: an f16 scale has at most 11
 * significant bits, d * sc (6- or 8-bit sc) at most 19, and times a q of at most 6 bits
 * at most 24, never below 2^-24 (no underflow). So fma(d, q, m) rounds exactly once, as
 * (d * q) + m does, and gives the same bits with one operation fewer; the explicit
 * _mm512_fmadd/fmsub_ps below rely on that and on nothing else. The compiler must not
 * fuse anything by itself: with -std=c11 GCC keeps -ffp-contract=off, and the pragmas
 * below keep it so.
 *
 * Fused path (n_tok <= 12: decode, speculation): passes of 4 rows × up to 4 tokens of
 * accumulators, weights dequantized in registers, the next row group prefetched into
 * L2. Panel path (prefill): a micro-kernel of 4 rows × 6 tokens = 24 zmm accumulators
 * over a dequantized panel, 10 loads per 24 FMAs (90% of the FMA peak on Zen 4).
 *
 * Every function that uses AVX-512 carries the TGT target attribute; the file is built
 * for the baseline ISA, and the table lookup at the end runs on any x86-64 CPU. */
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

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AI  static inline __attribute__((always_inline)) TGT

#define MR        4  /* panel micro-kernel rows */
#define NR        6  /* panel micro-kernel tokens */
#define FR        4  /* fused rows */
#define FT        4  /* fused tokens per pass */
#define FUSED_MAX 12 /* n_tok handled by the fused path (passes of FT tokens beat panels up to 12) */
/* Panel column chunk: large, as the 16-lane partial sums a tile saves and reloads between
 * chunks cost about as much as 100 FMA cycles; strips and activations stream from L2
 * (measured on Zen 4: 2048 beats 256 by 50%, 512 by 25%). */
#define KC      2048
#define PF_HINT _MM_HINT_T1 /* fused path: prefetch the next row group into L2 */

// Vector helpers

/* v + 0, v + 1, ..., v + 15 as floats. */
AI __m512 iota(float v) {
    return _mm512_add_ps(_mm512_set1_ps(v), _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* The binary16 at p (unaligned), converted exactly and broadcast. */
AI __m512 f16_bcast(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

/* 16 bytes at p zero-extended to 16 int32. */
AI __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

/* q | 16 in the lanes selected by k. */
AI __m512i or16(__m512i q, __mmask16 k) { return _mm512_mask_or_epi32(q, k, q, _mm512_set1_epi32(16)); }

/* Sums of four 16-lane accumulators by gemm.h's tree: lane i of the result is a_i's sum. */
AI __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xee)); /* s8 */
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xee));
    __m512 s4 = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
    __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0x4e)); /* lanes 0,1: s4[0]+s4[2], s4[1]+s4[3] */
    __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0xb1)); /* lane 0: s2[0] + s2[1] */
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s1));
}

// Dequantization: per type, prep() once per block, then unit() per 32 elements

typedef struct {
    __m512 a, b;                    /* tables of the current block (32-element types) */
    _Alignas(64) float sc[16];      /* K types: scales, broadcast from memory (no shuffle) */
    _Alignas(64) int8_t q[PS_QK_K]; /* q5_K: q (as uint8_t); q6_K: q - 32; element by element */
} dq_state;

/* Elements per block of a block-quantized type. */
AI int blk_elems(int ty) { return ty == PS_TYPE_Q4_K || ty == PS_TYPE_Q5_K || ty == PS_TYPE_Q6_K ? PS_QK_K : PS_QK; }

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

/* [d * sc[0..8), dmin * m[0..8)] of a q4_K / q5_K super-block (types.c's unpacking,
 * on four u32 at once as ggml does). */
AI __m512 k4_scales(const uint8_t *blk) {
    uint32_t u[4];
    memcpy(u, blk + 4, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t mins = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins;
    u[0] &= m1;
    __m512 scm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)u)));
    uint32_t dd;
    memcpy(&dd, blk, 4);
    __m512 d2 = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)));
    __m512 d16 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d2);
    return _mm512_mul_ps(d16, scm);
}

/* q4_K unit u (sub-block u): the indices are the low nibbles of qs[32(u/2) ..+32) for
 * even u (vpermps reads index bits 0-3 only, so no masking), the high ones for odd u;
 * ds, dm are the sub-block's d * sc and dmin * m. */
AI void dq_k4(const uint8_t *qs, int u, const dq_state *st, __m512i *q0, __m512i *q1, __m512 *ds, __m512 *dm) {
    *q0 = u8x16(qs + 32 * (u >> 1));
    *q1 = u8x16(qs + 32 * (u >> 1) + 16);
    if (u & 1) {
        *q0 = _mm512_srli_epi32(*q0, 4);
        *q1 = _mm512_srli_epi32(*q1, 4);
    }
    *ds = _mm512_set1_ps(st->sc[u]);
    *dm = _mm512_set1_ps(st->sc[u + 8]);
}

/* q5_K: the quants (0..31) of the 128-element half h of the super-block at blk into
 * out[0..128), 64 at a time: sub-blocks 4h and 4h + 2 are the low nibbles of
 * qs[64h ..+64), sub-blocks 4h + 1 and 4h + 3 the high ones; the fifth bit of element
 * 32s + l is bit s of qh[l] (a byte test gives the lanes that take + 16). */
AI void q5k_bytes(const uint8_t *blk, int h, uint8_t *out) {
    __m512i qs = _mm512_loadu_si512(blk + 48 + 64 * h);
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
    __m512i m0f = _mm512_set1_epi8(0x0f), k16 = _mm512_set1_epi8(16);
    __m512i bit_lo =
        _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h))), _mm256_set1_epi8((char)(1 << (4 * h + 2))), 1);
    __m512i lo = _mm512_and_si512(qs, m0f), hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m0f);
    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bit_lo), lo, k16);
    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, _mm512_add_epi8(bit_lo, bit_lo)), hi, k16);
    /* lo holds sub-blocks 4h, 4h + 2 and hi 4h + 1, 4h + 3: interleave by 32-byte halves */
    _mm256_store_si256((__m256i *)out, _mm512_castsi512_si256(lo));
    _mm256_store_si256((__m256i *)(out + 32), _mm512_castsi512_si256(hi));
    _mm256_store_si256((__m256i *)(out + 64), _mm512_extracti64x4_epi64(lo, 1));
    _mm256_store_si256((__m256i *)(out + 96), _mm512_extracti64x4_epi64(hi, 1));
}

/* q6_K: q - 32 of the 128-element half h of the super-block at blk into out[0..128),
 * with byte-wide operations on 64 elements at a time (types.c's layout): elements 0-63
 * are the low nibbles of ql[64h ..+64) with bits 0-1 (first 32) or 2-3 (next 32) of
 * qh[32h ..+32) on top, elements 64-127 the high nibbles with bits 4-5 or 6-7. The 16-bit
 * shifts leak bits between neighbouring bytes only where the masks clear them. */
AI void q6_bytes(const uint8_t *blk, int h, int8_t *out) {
    __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1); /* qh, qh >> 2 */
    __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, m0f), _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m30));
    __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m0f), _mm512_and_si512(qh2, m30));
    _mm512_store_si512(out, _mm512_sub_epi8(lo, k32));
    _mm512_store_si512(out + 64, _mm512_sub_epi8(hi, k32));
}

/* q6_K: elements 32u + 16i .. + 16 of a super-block prepared by dq_prep: (d * sc) * (q - 32). */
AI __m512 dq_q6(const dq_state *st, int u, int i) {
    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(st->q + 32 * u + 16 * i))));
    return _mm512_mul_ps(_mm512_set1_ps(st->sc[2 * u + i]), q);
}

/* Per-block set-up of type ty at blk: tables (32-element types), or scales and quants
 * (K types) for dq_unit. */
AI void dq_prep(int ty, const uint8_t *blk, dq_state *st) {
    switch (ty) {
    case PS_TYPE_Q4_0: st->a = _mm512_mul_ps(f16_bcast(blk), iota(-8)); break;
    case PS_TYPE_Q4_1: st->a = _mm512_fmadd_ps(f16_bcast(blk), iota(0), f16_bcast(blk + 2)); break; /* exact d * q */
    case PS_TYPE_Q5_0:
        st->a = _mm512_mul_ps(f16_bcast(blk), iota(-16));
        st->b = _mm512_mul_ps(f16_bcast(blk), iota(0));
        break;
    case PS_TYPE_Q5_1:
        st->a = _mm512_fmadd_ps(f16_bcast(blk), iota(0), f16_bcast(blk + 2)); /* exact d * q */
        st->b = _mm512_fmadd_ps(f16_bcast(blk), iota(16), f16_bcast(blk + 2));
        break;
    case PS_TYPE_Q8_0: st->a = f16_bcast(blk); break;
    case PS_TYPE_Q4_K: _mm512_store_ps(st->sc, k4_scales(blk)); break;
    case PS_TYPE_Q5_K:
        _mm512_store_ps(st->sc, k4_scales(blk));
        q5k_bytes(blk, 0, (uint8_t *)st->q);
        q5k_bytes(blk, 1, (uint8_t *)st->q + 128);
        break;
    case PS_TYPE_Q6_K: {
        __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
        _mm512_store_ps(st->sc, _mm512_mul_ps(f16_bcast(blk + 208), sc));
        q6_bytes(blk, 0, st->q);
        q6_bytes(blk, 1, st->q + 128);
        break;
    }
    }
}

/* Elements [32u, 32u + 32) of the block at blk: v0 gets the first 16, v1 the rest. */
AI void dq_unit(int ty, const uint8_t *blk, int u, const dq_state *st, __m512 *v0, __m512 *v1) {
    switch (ty) {
    case PS_TYPE_Q4_0:
    case PS_TYPE_Q4_1: {
        __m512i q = u8x16(blk + (ty == PS_TYPE_Q4_0 ? 2 : 4)); /* vpermps reads index bits 0-3 only */
        *v0 = _mm512_permutexvar_ps(q, st->a);
        *v1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), st->a);
        break;
    }
    case PS_TYPE_Q5_0:
    case PS_TYPE_Q5_1: {
        int o = ty == PS_TYPE_Q5_0 ? 2 : 4;
        uint32_t qh;
        memcpy(&qh, blk + o, 4);
        __m512i q = u8x16(blk + o + 4);
        __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
        *v0 = _mm512_permutex2var_ps(st->a, or16(lo, (__mmask16)qh), st->b);
        *v1 = _mm512_permutex2var_ps(st->a, or16(hi, (__mmask16)(qh >> 16)), st->b);
        break;
    }
    case PS_TYPE_Q8_0:
        *v0 =
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))), st->a);
        *v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))),
                            st->a);
        break;
    case PS_TYPE_Q4_K: {
        __m512i q0, q1;
        __m512 ds, dm;
        dq_k4(blk + 16, u, st, &q0, &q1, &ds, &dm);
        __m512 t = _mm512_fmsub_ps(ds, iota(0), dm); /* exact ds * q */
        *v0 = _mm512_permutexvar_ps(q0, t);
        *v1 = _mm512_permutexvar_ps(q1, t);
        break;
    }
    case PS_TYPE_Q5_K: { /* (d * sc) * q - (dmin * m), q prepared by dq_prep */
        const uint8_t *q = (const uint8_t *)st->q + 32 * u;
        __m512 ds = _mm512_set1_ps(st->sc[u]), dm = _mm512_set1_ps(st->sc[u + 8]);
        __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)q)));
        __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(q + 16))));
        *v0 = _mm512_fmsub_ps(ds, f0, dm); /* exact ds * q */
        *v1 = _mm512_fmsub_ps(ds, f1, dm);
        break;
    }
    default: /* Q6_K */
        *v0 = dq_q6(st, u, 0);
        *v1 = dq_q6(st, u, 1);
        break;
    }
}

/* 16 weights of float type ty at p, lanes outside k zero (and not read). */
AI __m512 ld_wf(int ty, const uint8_t *p, __mmask16 k) {
    if (ty == PS_TYPE_F32) return _mm512_maskz_loadu_ps(k, p);
    __m256i h = _mm256_maskz_loadu_epi16(k, p);
    if (ty == PS_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 weights of float type ty at p, all lanes. */
AI __m512 ld_wf_full(int ty, const uint8_t *p) {
    if (ty == PS_TYPE_F32) return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (ty == PS_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI int elem_bytes(int ty) { return ty == PS_TYPE_F32 ? 4 : 2; }

AI bool is_float_type(int ty) { return ty == PS_TYPE_F32 || ty == PS_TYPE_F16 || ty == PS_TYPE_BF16; }

// Fused path

/* Writes the sums of acc[0..FR)[t] to y[t * ys + i], i < nrows. */
AI void store_rows(__m512 acc[FR][FT], int T, float *y, int64_t ys, int64_t nrows) {
    __mmask8 k = (__mmask8)((1u << nrows) - 1);
    for (int t = 0; t < T; t++) _mm_mask_storeu_ps(y + t * ys, k, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
}

/* FR rows (row i at p[i]) × T tokens of a block-quantized type, nb blocks; prefetches
 * every line of the block pf bytes further on (the next row group's). */
AI void fused_q_tile(int ty, const uint8_t *const p[FR], int64_t nb, const float *x, int64_t xs, int T, float *y,
                     int64_t ys, int64_t nrows, int64_t pf) {
    const int bs = blk_elems(ty), bb = blk_bytes(ty);
    __m512 acc[FR][FT];
    for (int i = 0; i < FR; i++)
        for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        dq_state st[FR];
        for (int i = 0; i < FR; i++) {
            for (int o = 0; o < bb; o += 64) _mm_prefetch((const char *)(p[i] + pf + b * bb + o), PF_HINT);
            dq_prep(ty, p[i] + b * bb, &st[i]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < bs / 32; u++) {
            const float *xb = x + b * bs + 32 * u;
            for (int i = 0; i < FR; i++) {
                __m512 v0, v1;
                dq_unit(ty, p[i] + b * bb, u, &st[i], &v0, &v1);
                for (int t = 0; t < T; t++) {
                    acc[i][t] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(xb + t * xs), acc[i][t]);
                    acc[i][t] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xb + t * xs + 16), acc[i][t]);
                }
            }
        }
    }
    store_rows(acc, T, y, ys, nrows);
}

/* FR rows × T tokens of a float type, cols columns (a tail of cols % 16 is masked). */
AI void fused_f_tile(int ty, const uint8_t *const p[FR], int64_t cols, const float *x, int64_t xs, int T, float *y,
                     int64_t ys, int64_t nrows) {
    const int es = elem_bytes(ty);
    __m512 acc[FR][FT];
    for (int i = 0; i < FR; i++)
        for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        for (int i = 0; i < FR; i++) {
            __m512 v = ld_wf_full(ty, p[i] + c * es);
            for (int t = 0; t < T; t++) acc[i][t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + t * xs + c), acc[i][t]);
        }
    }
    if (c < cols) {
        __mmask16 k = (__mmask16)((1u << (cols - c)) - 1);
        for (int i = 0; i < FR; i++) {
            __m512 v = ld_wf(ty, p[i] + c * es, k);
            for (int t = 0; t < T; t++)
                acc[i][t] = _mm512_mask3_fmadd_ps(v, _mm512_maskz_loadu_ps(k, x + t * xs + c), acc[i][t], k);
        }
    }
    store_rows(acc, T, y, ys, nrows);
}

/* One fused tile of T tokens (T a constant after inlining). */
AI void fused_tile(int ty, const uint8_t *const p[FR], int64_t cols, const float *x, int64_t xs, int T, float *y,
                   int64_t ys, int64_t nrows, int64_t pf) {
    if (is_float_type(ty))
        fused_f_tile(ty, p, cols, x, xs, T, y, ys, nrows);
    else
        fused_q_tile(ty, p, cols / blk_elems(ty), x, xs, T, y, ys, nrows, pf);
}

/* The ps_f32_fused_fn contract for type ty: FR-row groups × FT-token passes; a short
 * last row group repeats its last row (those sums are not stored). */
AI void fused(int ty, const uint8_t *w, size_t wb, int64_t cols, const float *x, int64_t xs, int64_t nt, float *y,
              int64_t ys, int64_t nrows) {
    for (int64_t t0 = 0; t0 < nt; t0 += FT) {
        int64_t T = nt - t0 < FT ? nt - t0 : FT;
        for (int64_t r0 = 0; r0 < nrows; r0 += FR) {
            int64_t n = nrows - r0 < FR ? nrows - r0 : FR;
            const uint8_t *p[FR];
            for (int i = 0; i < FR; i++) p[i] = w + (size_t)(r0 + (i < n ? i : n - 1)) * wb;
            const float *xt = x + t0 * xs;
            float *yt = y + t0 * ys + r0;
            int64_t pf = FR * (int64_t)wb; /* prefetch the next row group (lines past the end are harmless) */
            switch (T) {
            case 1: fused_tile(ty, p, cols, xt, xs, 1, yt, ys, n, pf); break;
            case 2: fused_tile(ty, p, cols, xt, xs, 2, yt, ys, n, pf); break;
            case 3: fused_tile(ty, p, cols, xt, xs, 3, yt, ys, n, pf); break;
            default: fused_tile(ty, p, cols, xt, xs, 4, yt, ys, n, pf); break;
            }
        }
    }
}

// Panel path

/* Row i of a strip, columns [0, kc) relative to the chunk, into dst (step k at
 * dst + k * MR * 16), block-quantized types. */
AI void pack_q_row(int ty, const uint8_t *row, int64_t kc, float *dst) {
    const int bs = blk_elems(ty), bb = blk_bytes(ty);
    for (int64_t b = 0; b < kc / bs; b++) {
        dq_state st;
        dq_prep(ty, row + b * bb, &st);
        for (int u = 0; u < bs / 32; u++) {
            __m512 v0, v1;
            dq_unit(ty, row + b * bb, u, &st, &v0, &v1);
            float *d = dst + (b * bs / 16 + 2 * u) * MR * 16;
            _mm512_store_ps(d, v0);
            _mm512_store_ps(d + MR * 16, v1);
        }
    }
}

/* The same for float types; the last step is zero-padded past kc. */
AI void pack_f_row(int ty, const uint8_t *row, int64_t kc, float *dst) {
    const int es = elem_bytes(ty);
    for (int64_t c = 0; c < kc; c += 16) {
        __mmask16 k = kc - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (kc - c)) - 1);
        _mm512_store_ps(dst + (c / 16) * MR * 16, ld_wf(ty, row + c * es, k));
    }
}

/* The ps_f32_pack_fn contract for type ty. */
AI void pack(int ty, const uint8_t *w, size_t wb, int64_t c0, int64_t kc, int64_t nrows, float *panel) {
    int64_t kcp = (kc + 15) & ~(int64_t)15, n_strips = (nrows + MR - 1) / MR;
    const int64_t off = is_float_type(ty) ? c0 * elem_bytes(ty) : c0 / blk_elems(ty) * blk_bytes(ty);
    for (int64_t r = 0; r < n_strips * MR; r++) {
        float *dst = panel + (r / MR) * MR * kcp + (r % MR) * 16;
        if (r >= nrows) {
            for (int64_t k = 0; k < kcp / 16; k++) _mm512_store_ps(dst + k * MR * 16, _mm512_setzero_ps());
        } else if (is_float_type(ty)) {
            pack_f_row(ty, w + (size_t)r * wb + off, kc, dst);
        } else {
            pack_q_row(ty, w + (size_t)r * wb + off, kc, dst);
        }
    }
}

/* Micro-kernel: MR strip rows × T tokens; T, first and last are constants after
 * inlining, so that the 24 accumulators stay in registers from start to end. */
AI void tile_t(const float *strip, int64_t kc, const float *x, int64_t xs, int T, float *part, bool first, bool last,
               float *y, int64_t ys, int64_t nrows) {
    __m512 acc[MR][NR];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < MR; i++) acc[i][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(part + (t * MR + i) * 16);
    int64_t steps = kc / 16;
    for (int64_t k = 0; k < steps; k++) {
        const float *wk = strip + k * MR * 16;
        __m512 w0 = _mm512_load_ps(wk), w1 = _mm512_load_ps(wk + 16);
        __m512 w2 = _mm512_load_ps(wk + 32), w3 = _mm512_load_ps(wk + 48);
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * xs + 16 * k);
            acc[0][t] = _mm512_fmadd_ps(w0, xv, acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(w1, xv, acc[1][t]);
            acc[2][t] = _mm512_fmadd_ps(w2, xv, acc[2][t]);
            acc[3][t] = _mm512_fmadd_ps(w3, xv, acc[3][t]);
        }
    }
    if (last && (kc & 15)) { /* float types only: the masked last step of the last chunk */
        __mmask16 m = (__mmask16)((1u << (kc & 15)) - 1);
        const float *wk = strip + steps * MR * 16;
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * xs + 16 * steps);
            for (int i = 0; i < MR; i++)
                acc[i][t] = _mm512_mask3_fmadd_ps(_mm512_load_ps(wk + 16 * i), xv, acc[i][t], m);
        }
    }
    if (last) {
        __mmask8 k = (__mmask8)((1u << nrows) - 1);
        for (int t = 0; t < T; t++)
            _mm_mask_storeu_ps(y + t * ys, k, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    } else {
        for (int t = 0; t < T; t++)
            for (int i = 0; i < MR; i++) _mm512_store_ps(part + (t * MR + i) * 16, acc[i][t]);
    }
}

/* tile_t for one mode (FIRST, LAST bits) and any nt <= NR. */
AI void tile_m(const float *strip, int64_t kc, const float *x, int64_t xs, int64_t nt, float *part, bool first,
               bool last, float *y, int64_t ys, int64_t nrows) {
    switch (nt) {
    case 1: tile_t(strip, kc, x, xs, 1, part, first, last, y, ys, nrows); break;
    case 2: tile_t(strip, kc, x, xs, 2, part, first, last, y, ys, nrows); break;
    case 3: tile_t(strip, kc, x, xs, 3, part, first, last, y, ys, nrows); break;
    case 4: tile_t(strip, kc, x, xs, 4, part, first, last, y, ys, nrows); break;
    case 5: tile_t(strip, kc, x, xs, 5, part, first, last, y, ys, nrows); break;
    default: tile_t(strip, kc, x, xs, 6, part, first, last, y, ys, nrows); break;
    }
}

/* The ps_f32_tile_fn contract (only the last chunk can end inside a 16-column step). */
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
const ps_f32_kern ps_f32_avx512_kerns[PS_TYPE_COUNT] = {
    ROW(F32),  ROW(F16),  ROW(BF16), ROW(Q8_0), ROW(Q4_0), ROW(Q4_1),
    ROW(Q5_0), ROW(Q5_1), ROW(Q4_K), ROW(Q5_K), ROW(Q6_K),
};

#else

const ps_f32_kern ps_f32_avx512_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */

#endif
