/* kern_avx512.h - AVX-512 kernel bodies, included by kern_avx512.c (without VNNI) and
 * kern_avx512vnni.c (with it). Not a normal header: it defines static functions, and the
 * includer sets TGT (the target attribute string), HAVE_VNNI (0 or 1) and FAMILY_FN (the
 * name of the table function to define).
 *
 * Design (Zen 4 and Ice Lake class cores: the vector multiply ports are the bottleneck;
 * shuffles of 32/64-bit elements, logic and int->float conversion run on other ports).
 *
 * 32-element block types work on groups of 16 blocks (512 columns). A group is
 * "transposed" so that each 32-bit lane of a vector holds one block: vector j (0..7) holds
 * bytes 4j..4j+3 of the block's 32 quants (for nibble types, quants 4c..4c+3 and
 * 16+4c..16+4c+3 come from packed dword c of the block, c = 0..3). Eight vpdpbusd then
 * give every lane the whole integer dot of its block, and one float multiply-add per
 * (row, token) applies all 16 block scales at once:
 *     acc = corr_t                     (int: -offset * sum(q_x), exact)
 *     acc += dpbusd(w_j, x_j)          (j = 0..7)
 *     facc += (dw ⊙ dx) ⊙ float(acc)   (one vmulps, one vfmadd per group)
 * Lane m of a group holds block pi(m) = 4 (m % 4) + m / 4 (what a 4x4 dword transpose of
 * four 4-block loads yields). Activations are quantized straight into this layout.
 *
 * Register tiles cover R rows x T tokens (R <= 2, T <= 4); every (row, token) pair runs
 * the very same instruction sequence on its own accumulators whatever R, T, the position
 * in the tile or the tail handling, and the final horizontal sum has one fixed order:
 * outputs are batch-invariant by construction. Partial last groups are copied to a zeroed
 * 16-block buffer (weights) or zero-padded at quantization (activations). */

#include <immintrin.h>
#include <string.h>

#include "cpu.h"

#define KI static inline __attribute__((always_inline, target(TGT)))
#define KF static __attribute__((target(TGT)))

#define RMAX 2
#define TMAX 4
/* Tile loops must unroll fully (so that tile arrays live in registers) at -O2 too. */
#define UNROLL _Pragma("GCC unroll 16")

// Shared helpers

/* u8 x s8 dot of 4-byte groups, accumulated into 32-bit lanes (exact: callers keep the
 * pair sums of the emulation within int16). */
KI __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
#if HAVE_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

/* An aligned load kept in a register: the compiler would otherwise fold the load into
 * every instruction that uses it, and one 512-bit load per cycle is all Zen 4 does. */
KI __m512i load_reg(const void *p) {
    __m512i v = _mm512_load_si512(p);
    __asm__("" : "+v"(v));
    return v;
}

/* Sum of the 16 lanes in one fixed order: halves, quarters, then pairs. */
KI float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* 4x4 transpose of dwords inside each 128-bit lane: P[c] lane (4k + g) = Q[g] lane (4k + c). */
KI void transpose4(const __m512i Q[4], __m512i P[4]) {
    __m512i t0 = _mm512_unpacklo_epi32(Q[0], Q[1]), t1 = _mm512_unpackhi_epi32(Q[0], Q[1]);
    __m512i t2 = _mm512_unpacklo_epi32(Q[2], Q[3]), t3 = _mm512_unpackhi_epi32(Q[2], Q[3]);
    P[0] = _mm512_unpacklo_epi64(t0, t2);
    P[1] = _mm512_unpackhi_epi64(t0, t2);
    P[2] = _mm512_unpacklo_epi64(t1, t3);
    P[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Activations of the 32-element types: groups of 16 blocks, transposed

/* Per group: int8 x[8][16][4] (vector j, lane m), int32 corr[16], float dx[16], float
 * xs[16] (dx * sum(q), for the types with a minimum). */
#define G16_CORR 512
#define G16_DX 576
#define G16_XS 640
#define G16_BYTES 704

static size_t g16_bytes(int64_t cols) { return (size_t)((cols / PS_QK + 15) / 16) * G16_BYTES; }

/* Block b of a group sits in lane m = 4 (b % 4) + b / 4 (the inverse of pi). */
static inline int g16_lane(int b) { return 4 * (b % 4) + b / 4; }

/* Quantizes 32 floats exactly as the ref kernels do: d = max|x| / 127, q = nearest-even
 * (x * (1 / d)). Returns sum(q). */
KI int32_t quant_block32(const float *x, int8_t q[32], float *d_out) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    float amax = _mm512_reduce_max_ps(a);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(q1));
    *d_out = d;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

/* One activation row into g16 groups; corr = -off * sum(q) per block. */
KI void quant_g16(const float *x, uint8_t *xq, int64_t cols, int off) {
    int64_t nb = cols / PS_QK;
    for (int64_t g = 0; g * 16 < nb; g++) {
        uint8_t *G = xq + g * G16_BYTES;
        int n = nb - g * 16 < 16 ? (int)(nb - g * 16) : 16;
        if (n < 16) memset(G, 0, G16_BYTES);
        for (int b = 0; b < n; b++) {
            int8_t q[32];
            float d;
            int32_t sum = quant_block32(x + (g * 16 + b) * PS_QK, q, &d);
            int m = g16_lane(b);
            UNROLL
            for (int j = 0; j < 8; j++) memcpy(G + 64 * j + 4 * m, q + 4 * j, 4);
            int32_t corr = -off * sum;
            float xs = d * (float)sum;
            memcpy(G + G16_CORR + 4 * m, &corr, 4);
            memcpy(G + G16_DX + 4 * m, &d, 4);
            memcpy(G + G16_XS + 4 * m, &xs, 4);
        }
    }
}

KF void quant_g16_off8(const float *x, void *xq, int64_t cols) { quant_g16(x, xq, cols, 8); }

// Nibble weights: loading a group of 16 blocks

/* Index vectors for one weight type's 16-block groups. Four blocks (bsize bytes each) are
 * read as two overlapping 64-byte loads L0 = [0, 64) and L1 = [4 bsize - 64, 4 bsize). */
typedef struct {
    __m512i qs; /* bytes: out 16k + i <- quant byte i of block k */
    __m512i d;  /* words: out word m <- scale word of block m / 4 in L0 of sub-group m % 2 (pairs) */
    __m512i m;  /* as d, for the minimum */
} nib_idx;

/* Byte index into (L0, L1) of window byte o. */
static inline int win_idx(int o, int bsize) { return o < 64 ? o : 64 + o - (4 * bsize - 64); }

KI nib_idx nib_idx_make(int bsize, int qs_off) {
    uint8_t qs[64];
    uint16_t d[32], m[32];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 16; i++) qs[16 * k + i] = (uint8_t)win_idx(bsize * k + qs_off + i, bsize);
    for (int w = 0; w < 32; w++) {
        int k = (w % 16) / 4, word = bsize * k / 2;
        d[w] = (uint16_t)((w % 2 ? 32 : 0) + word);
        m[w] = (uint16_t)(d[w] + 1);
    }
    nib_idx ix;
    ix.qs = _mm512_loadu_si512(qs);
    ix.d = _mm512_loadu_si512(d);
    ix.m = _mm512_loadu_si512(m);
    return ix;
}

/* Packed quants of 16 blocks: P[c] lane m = packed dword c of block pi(m); L0[g] keeps the
 * first 64 bytes of sub-group g (its scales). */
KI void nib_load(const uint8_t *p, int bsize, int qs_off, const nib_idx *ix, __m512i P[4], __m512i L0[4]) {
    __m512i Q[4];
    UNROLL
    for (int g = 0; g < 4; g++) {
        const uint8_t *s = p + 4 * bsize * g;
        L0[g] = _mm512_loadu_si512(s);
#if HAVE_VNNI /* the VNNI family also has VBMI */
        (void)qs_off;
        Q[g] = _mm512_permutex2var_epi8(L0[g], ix->qs, _mm512_loadu_si512(s + 4 * bsize - 64));
#else
        (void)ix;
        __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(s + qs_off)));
        q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(s + bsize + qs_off)), 1);
        q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(s + 2 * bsize + qs_off)), 2);
        Q[g] = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(s + 3 * bsize + qs_off)), 3);
#endif
    }
    transpose4(Q, P);
}

/* The 16 f16 words at index idx (scale or minimum) of the four sub-groups, as floats in
 * lane order. Needs every block header within L0 (true for bsize <= 21). */
KI __m512 nib_scales(const __m512i L0[4], __m512i idx) {
    __m512i a = _mm512_permutex2var_epi16(L0[0], idx, L0[1]);
    __m512i b = _mm512_permutex2var_epi16(L0[2], idx, L0[3]);
    __m512i ab = _mm512_mask_blend_epi16(0xCCCCCCCCu, a, b);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(ab));
}

// q4_0

/* One group for an R x T tile: facc[r][t] += (dw_r ⊙ dx_t) ⊙ float(corr_t + sum_j dp). */
KI void q4_0_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const nib_idx *ix,
                   __m512 facc[RMAX][TMAX]) {
    __m512i P[RMAX][4], acc[RMAX][TMAX];
    __m512 S[RMAX];
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    UNROLL
    for (int r = 0; r < R; r++) {
        __m512i L0[4];
        nib_load(w + r * wb, 18, 2, ix, P[r], L0);
        S[r] = nib_scales(L0, ix->d);
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512i c = _mm512_load_si512(x + t * xs + G16_CORR);
        UNROLL
        for (int r = 0; r < R; r++) acc[r][t] = c;
    }
    UNROLL
    for (int c = 0; c < 4; c++) {
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i v[RMAX];
            UNROLL
            for (int r = 0; r < R; r++)
                v[r] = _mm512_and_si512(h ? _mm512_srli_epi16(P[r][c], 4) : P[r][c], m0f);
            UNROLL
            for (int t = 0; t < T; t++) {
                __m512i xv = load_reg(x + t * xs + 64 * (c + 4 * h));
                UNROLL
                for (int r = 0; r < R; r++) acc[r][t] = dpbusd(acc[r][t], v[r], xv);
            }
        }
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512 dx = _mm512_load_ps(x + t * xs + G16_DX);
        UNROLL
        for (int r = 0; r < R; r++)
            facc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(S[r], dx), _mm512_cvtepi32_ps(acc[r][t]), facc[r][t]);
    }
}

/* An R x T tile over all groups of a row; the partial last group reads a zero-padded copy. */
KI void q4_0_tile(int R, int T, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
                  int64_t ys, const nib_idx *ix) {
    __m512 facc[RMAX][TMAX];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    int64_t nb = cols / PS_QK, nfull = nb / 16, rem = nb % 16;
    for (int64_t g = 0; g < nfull; g++) {
        q4_0_group(R, T, w + g * 16 * 18, wb, x + g * G16_BYTES, xs, ix, facc);
    }
    if (rem) {
        uint8_t tail[RMAX][16 * 18];
        memset(tail, 0, sizeof tail);
        UNROLL
        for (int r = 0; r < R; r++) memcpy(tail[r], w + r * wb + nfull * 16 * 18, (size_t)rem * 18);
        q4_0_group(R, T, tail[0], sizeof tail[0], x + nfull * G16_BYTES, xs, ix, facc);
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) y[t * ys + r] = hsum16(facc[r][t]);
}

#define TILE_FN(name, R, T)                                                                                     \
    KF void name##_tile_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,        \
                                  float *y, int64_t ys, const nib_idx *ix) {                                    \
        name##_tile(R, T, w, wb, cols, x, xs, y, ys, ix);                                                       \
    }

/* Tiles of every shape, and the gemm that covers nr x nt with them. */
#define TILES(name, idx_init)                                                                                   \
    TILE_FN(name, 2, 4)                                                                                         \
    TILE_FN(name, 2, 3)                                                                                         \
    TILE_FN(name, 2, 2)                                                                                         \
    TILE_FN(name, 2, 1)                                                                                         \
    TILE_FN(name, 1, 4)                                                                                         \
    TILE_FN(name, 1, 3)                                                                                         \
    TILE_FN(name, 1, 2)                                                                                         \
    TILE_FN(name, 1, 1)                                                                                         \
    KF void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,        \
                        int64_t ys, int64_t nr, int64_t nt) {                                                   \
        static void (*const fns[2][4])(const uint8_t *, size_t, int64_t, const uint8_t *, size_t, float *,      \
                                       int64_t, const nib_idx *) = {                                            \
            {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4},                              \
            {name##_tile_2x1, name##_tile_2x2, name##_tile_2x3, name##_tile_2x4}};                             \
        nib_idx ix = idx_init;                                                                                  \
        for (int64_t t = 0; t < nt; t += 4) {                                                                   \
            int T = nt - t >= 4 ? 4 : (int)(nt - t);                                                            \
            int rmax = nt == 1 ? 1 : 2; /* one weight stream at a time streams best from DRAM */        \
            for (int64_t r = 0; r < nr; r += rmax) {                                                            \
                int R = nr - r >= rmax ? rmax : 1;                                                              \
                fns[R - 1][T - 1](w + r * wb, wb, cols, x + t * xs, xs, y + t * ys + r, ys, &ix);              \
            }                                                                                                   \
        }                                                                                                       \
    }

TILES(q4_0, nib_idx_make(18, 2))

// Table

static const ps_kernel k_q4_0 = {quant_g16_off8, g16_bytes, gemm_q4_0, 2, 4};

const ps_kernel *FAMILY_FN(uint32_t t) {
    switch (t) {
    case PS_TYPE_Q4_0: return &k_q4_0;
    default: return NULL;
    }
}
