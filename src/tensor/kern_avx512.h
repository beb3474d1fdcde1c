/* kern_avx512.h - AVX-512 kernel bodies, included by kern_avx512.c (without VNNI) and
 * kern_avx512vnni.c (with VNNI, VBMI and BITALG). Not a normal header: it defines static
 * functions, and the includer sets TGT (the target attribute string), HAVE_VNNI (0 or 1)
 * and FAMILY_FN (the name of the table function to define). Without VNNI, vpdpbusd is
 * emulated (vpmaddubsw + vpmaddwd) and only the types whose pair sums fit int16 without
 * VBMI are offered (f32, f16, bf16, q4_0, q4_1); the others fall back to AVX2.
 *
 * Design (Zen 4 / Ice Lake class cores). The 512-bit multiply ports (vpdpbusd, vfmadd,
 * vpermt2b, vpmulld) are the bottleneck, at one instruction per cycle on Zen 4; loads
 * (one 512-bit per cycle), logic, 32/64-bit unpacks and int->float conversions use other
 * ports. So every per-(row, token) float operation is amortized over many blocks:
 *
 * 32-element block types (q4_0, q4_1, q5_0, q5_1, q8_0) work on groups of 16 blocks (512
 * columns) "transposed" so that each 32-bit lane holds one block: vector j (0..7) holds
 * quants 4j..4j+3 of every block (nibble types unpack them from packed dword j % 4 of the
 * block, low or high nibbles). Eight vpdpbusd give each lane its block's integer dot, and
 * one vmulps + one vfmadd per (row, token) apply the 16 block scales:
 *     acc = corr_t                     (int: -offset * sum(q_x), exact; 0 for q4_1/q5_1)
 *     acc += dpbusd(w_j, x_j)          (j = 0..7; weights unsigned, q8_0 biased by 128)
 *     facc += (dw ⊙ dx) ⊙ float(acc)   [+ m ⊙ (dx * sum q_x) for q4_1/q5_1]
 * The transposition is a 4x4 dword transpose of four vpermt2b-gathered 4-block windows;
 * lane m of a group holds block nib_block(m) (q8_0: q8_block(m)), and the activations are
 * quantized straight into that layout. A partial last group of up to 6 blocks is done
 * block by block in 256-bit lanes ("natural tail"), a longer one as a zero-padded group.
 *
 * K types (q4_K, q5_K, q6_K) work on groups of 4 super-blocks (1024 columns), lane m
 * holding one sub-block of super-block m % 4; sub-block scales are applied in integers
 * (vpmulld), q4_K/q5_K minimums with one vpmaddwd, then one float multiply-add per group.
 *
 * Float types keep one 16-lane f32 accumulator per (row, token): fma over 16 columns per
 * step, the last step masked.
 *
 * Register tiles cover R rows x T tokens (2 x 4 nibble types, 1 x 8 q8_0, 1 x 6 q4_K and
 * q5_K, 1 x 4 q6_K, 4 x 6 float types). Batch invariance holds by construction: every
 * (row, token) pair runs the same float operations in the same order whatever the tile
 * shape, its place in the tile, the column passes (accumulators saved and reloaded
 * exactly) or the thread; integer sums are exact, so GEMV (1 x 1 tiles) may split them
 * into parallel chains; the final horizontal sum has one fixed order. */

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu.h"

#define KI static inline __attribute__((always_inline, target(TGT)))
#define KF static __attribute__((target(TGT)))

#define RMAX 4
#define TMAX 8
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

/* GEMV streams one weight row after another from memory; asking for the bytes PF_AHEAD
 * ahead into L2 keeps more misses in flight than the hardware prefetchers alone (about
 * +15% on Zen 4 with two threads). Prefetches past the end of the weights are harmless.
 * GEMV tiles ask for a row's partial last group too: short rows (576 columns of q8_0 are
 * 16 + 2 blocks) otherwise leave about one line in ten to the hardware prefetchers, which
 * cost a fifth of SmolLM2-135M Q8_0 decode speed. */
#define PF_AHEAD 8192
KI void prefetch_ahead(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PF_AHEAD + o, _MM_HINT_T1);
}

/* GEMM: the next row tile's bytes of the same group, into L2 (rows are pages apart, so
 * the hardware prefetchers do not see them coming; +10-20% on matrices that come from L3). */
KI void prefetch_rows(int R, const uint8_t *p, size_t wb, int bytes) {
    UNROLL
    for (int r = 0; r < R; r++)
        for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + r * wb + o, _MM_HINT_T1);
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

/* Constant vectors a type's kernels need, made once per type (ctx_once). */
typedef struct {
    __m512i qs;      /* vpermt2b index: the quants of 4 (nibble types) or 2 (q8_0) blocks */
    __m512i d, m;    /* vpermt2w indices of the scales and minimums (q4_0, q4_1) */
    __m512i hd, hm, hq; /* vpermt2w indices of scale, minimum and fifth bits from (L0, L1) (q5_0, q5_1) */
    __m512i bits[8]; /* vpshufbitqmb controls picking the fifth bits of each step (q5_0, q5_1) */
} kctx;

// Activations of the 32-element types: groups of 16 blocks, transposed

/* Per group: int8 x[8][16][4] (vector j, lane m), int32 corr[16], float dx[16], float
 * xs[16] (dx * sum(q), for the types with a minimum). */
#define G16_CORR 512
#define G16_DX 576
#define G16_XS 640
#define G16_BYTES 704

/* A partial last group of at most NAT_TAIL_MAX blocks is not padded to 16 blocks: its
 * blocks keep their natural order ("tail blocks": float d, int32 corr, float xs, 4 bytes
 * unused, int8 q[32]) and the kernels take them one at a time in 256-bit vectors. */
#define NAT_TAIL_MAX 6
#define XT_BYTES 48

static size_t g16_bytes(int64_t cols) {
    int64_t nb = cols / PS_QK, rem = nb % 16;
    size_t n = (size_t)(nb / 16) * G16_BYTES + (size_t)(rem == 0 ? 0 : rem <= NAT_TAIL_MAX ? rem * XT_BYTES : G16_BYTES);
    return (n + 63) & ~(size_t)63;
}

/* Block of lane m in a group: nibble types (a 4x4 transpose of four 4-block loads) and
 * q8_0 (two 4x4 transposes of 2-block loads, then a 128-bit lane shuffle). */
static inline int nib_block(int m) { return 4 * (m % 4) + m / 4; }
static inline int q8_block(int m) { return 8 * (m / 8) + 2 * (m % 4) + (m / 4) % 2; }

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

/* n tail blocks in natural order. */
KI void quant_tail(const float *x, uint8_t *xt, int n, int off) {
    for (int b = 0; b < n; b++, xt += XT_BYTES) {
        float d;
        int32_t sum = quant_block32(x + b * PS_QK, (int8_t *)xt + 16, &d);
        int32_t corr = -off * sum;
        float xs = d * (float)sum;
        memcpy(xt, &d, 4);
        memcpy(xt + 4, &corr, 4);
        memcpy(xt + 8, &xs, 4);
        memset(xt + 12, 0, 4);
    }
}

/* One activation row into g16 groups, block b of a group going to lane lane_of[b];
 * corr = -off * sum(q) per block. Partial groups are zero-padded. */
KI void quant_g16(const float *x, uint8_t *xq, int64_t cols, int off, int (*block_of_lane)(int)) {
    int lane_of[16];
    for (int m = 0; m < 16; m++) lane_of[block_of_lane(m)] = m;
    int64_t nb = cols / PS_QK, rem = nb % 16;
    for (int64_t g = 0; g * 16 < nb; g++) {
        uint8_t *G = xq + g * G16_BYTES;
        int n = nb - g * 16 < 16 ? (int)(nb - g * 16) : 16;
        if (n < 16 && rem <= NAT_TAIL_MAX) {
            quant_tail(x + g * 16 * PS_QK, G, n, off);
            break;
        }
        if (n < 16) memset(G, 0, G16_BYTES);
        for (int b = 0; b < n; b++) {
            int8_t q[32];
            float d;
            int32_t sum = quant_block32(x + (g * 16 + b) * PS_QK, q, &d);
            int m = lane_of[b];
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

KF void quant_nib_off0(const float *x, void *xq, int64_t cols) { quant_g16(x, xq, cols, 0, nib_block); }
KF void quant_nib_off8(const float *x, void *xq, int64_t cols) { quant_g16(x, xq, cols, 8, nib_block); }
#if HAVE_VNNI
KF void quant_nib_off16(const float *x, void *xq, int64_t cols) { quant_g16(x, xq, cols, 16, nib_block); }
KF void quant_q8_off128(const float *x, void *xq, int64_t cols) { quant_g16(x, xq, cols, 128, q8_block); }
#endif

// Tiles and the gemm that covers a block of rows and tokens with them

/* Writes the horizontal sums of an R x T tile. */
KI void store_sums(int R, int T, __m512 facc[RMAX][TMAX], float *y, int64_t ys) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) y[t * ys + r] = hsum16(facc[r][t]);
}

/* A tile's share of one pass over the columns: groups [g0, g1) of the row. The first pass
 * starts from zero, the last writes the sums to y; in between, the R x T accumulators wait
 * in acc (16 floats each, 64-byte aligned). Saving and reloading them is exact, so the
 * arithmetic per output is the same however the columns are split into passes. */
typedef struct {
    int64_t g0, g1;
    int first, last;
    float *acc;
} span;

typedef void tile_fn(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, const span *sp,
                     float *y, int64_t ys, const kctx *cx);

KI void facc_begin(int R, int T, const span *sp, __m512 facc[RMAX][TMAX]) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++)
            facc[r][t] = sp->first ? _mm512_setzero_ps() : _mm512_load_ps(sp->acc + 16 * (r * T + t));
}

KI void facc_end(int R, int T, const span *sp, __m512 facc[RMAX][TMAX], float *y, int64_t ys) {
    if (sp->last) {
        store_sums(R, T, facc, y, ys);
        return;
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) _mm512_store_ps(sp->acc + 16 * (r * T + t), facc[r][t]);
}

/* Folds the 8 tail lanes into lanes 0-7 of the group accumulators (for every pair of a
 * row with a natural tail, once, after its last group). */
KI void add_tail(int R, int T, __m512 facc[RMAX][TMAX], __m256 tacc[RMAX][TMAX]) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_add_ps(facc[r][t], _mm512_zextps256_ps512(tacc[r][t]));
}

/* name_tile_RxT: groups [g0, g1) of R weight rows against T activation rows. A type
 * supplies name_group(R, T, w, wb, x, xs, cx, facc) and the sizes name_BE (elements per
 * block), name_BB (bytes per block), name_BPG (blocks per group), name_WG (= BPG * BB)
 * and name_XG (activation bytes per group). The partial last group runs on a zero-padded
 * copy of the weights (the activations are padded when quantized). */
#define DEF_TILE(name, R, T)                                                                                    \
    KF void name##_tile_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,        \
                                  const span *sp, float *y, int64_t ys, const kctx *cx) {                       \
        __m512 facc[RMAX][TMAX];                                                                                \
        facc_begin(R, T, sp, facc);                                                                             \
        int64_t nb = cols / name##_BE, nfull = nb / name##_BPG, rem = nb % name##_BPG;                          \
        int64_t gend = sp->g1 < nfull ? sp->g1 : nfull;                                                         \
        for (int64_t g = sp->g0; g < gend; g++) {                                                               \
            if (R * T == 1) prefetch_ahead(w + g * name##_WG, name##_WG);                                          \
            else prefetch_rows(R, w + R * wb + g * name##_WG, wb, name##_WG);                                     \
            name##_group(R, T, w + g * name##_WG, wb, x + g * name##_XG, xs, cx, facc);                         \
        }                                                                                                       \
        if (rem && sp->g1 > nfull && name##_NAT && rem <= NAT_TAIL_MAX) {                                       \
            __m256 tacc[RMAX][TMAX];                                                                            \
            if (R * T == 1) prefetch_ahead(w + nfull * name##_WG, (int)rem * name##_BB);                         \
            name##_tail(R, T, w + nfull * name##_WG, wb, x + nfull * name##_XG, xs, (int)rem, tacc);             \
            add_tail(R, T, facc, tacc);                                                                         \
        } else if (rem && sp->g1 > nfull) {                                                                     \
            uint8_t tail[R][name##_WG] __attribute__((aligned(64)));                                            \
            if (R * T == 1) prefetch_ahead(w + nfull * name##_WG, (int)rem * name##_BB);                         \
            memset(tail, 0, sizeof tail);                                                                       \
            for (int r = 0; r < R; r++) memcpy(tail[r], w + r * wb + nfull * name##_WG, (size_t)rem * name##_BB); \
            name##_group(R, T, tail[0], name##_WG, x + nfull * name##_XG, xs, cx, facc);                         \
        }                                                                                                       \
        facc_end(R, T, sp, facc, y, ys);                                                                        \
    }

/* Tiles up to 2 rows x 4 tokens, in a table indexed [R - 1][T - 1]. */
#define DEF_TILES_R2T4(name)                                                                                    \
    DEF_TILE(name, 1, 1) DEF_TILE(name, 1, 2) DEF_TILE(name, 1, 3) DEF_TILE(name, 1, 4)                         \
    DEF_TILE(name, 2, 1) DEF_TILE(name, 2, 2) DEF_TILE(name, 2, 3) DEF_TILE(name, 2, 4)                         \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4,  \
                                            name##_tile_2x1, name##_tile_2x2, name##_tile_2x3, name##_tile_2x4};

/* Tiles of 1 row x up to 8 tokens. */
#define DEF_TILES_R1T8(name)                                                                                    \
    DEF_TILE(name, 1, 1) DEF_TILE(name, 1, 2) DEF_TILE(name, 1, 3) DEF_TILE(name, 1, 4)                         \
    DEF_TILE(name, 1, 5) DEF_TILE(name, 1, 6) DEF_TILE(name, 1, 7) DEF_TILE(name, 1, 8)                         \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4,  \
                                            name##_tile_1x5, name##_tile_1x6, name##_tile_1x7, name##_tile_1x8};

/* Activation bytes a token tile's column block may take (so that it stays in L1 while the
 * rows of a sub-chunk are swept), and rows per sub-chunk (its accumulators wait on the
 * stack between column blocks). */
#define L1_X_BYTES (16 * 1024)
/* GEMV takes rows in pairs when a pair is this short (the two rows are then one stream). */
#ifndef GEMV_PAIR_BYTES
#define GEMV_PAIR_BYTES 1024
#endif
#define SUB_ROWS 64

/* Covers nr x nt with tiles of at most rm x tm (tiles[(R - 1) * tm + T - 1]): per
 * sub-chunk of rows, per token tile, per column block, all row tiles. A single token
 * takes one row at a time and no column blocks: one weight stream per thread is what
 * streams fastest from DRAM. ng groups per row, xg activation bytes per group. */
static void tile_drive(tile_fn *const *tiles, int rm, int tm, const kctx *cx, const uint8_t *w, size_t wb,
                       int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys, int64_t nr, int64_t nt,
                       int64_t ng, size_t xg) {
    float acc[SUB_ROWS * TMAX * 16] __attribute__((aligned(64)));
    if (nt == 1 && wb > GEMV_PAIR_BYTES) rm = 1;
    int64_t kb = (int64_t)(L1_X_BYTES / ((size_t)tm * xg));
    if (kb < 1) kb = 1;
    if (nt == 1 || kb > ng) kb = ng;
    for (int64_t rs = 0; rs < nr; rs += SUB_ROWS) {
        int64_t re = nr - rs < SUB_ROWS ? nr : rs + SUB_ROWS;
        for (int64_t t = 0; t < nt; t += tm) {
            int T = nt - t >= tm ? tm : (int)(nt - t);
            for (int64_t g0 = 0; g0 < ng; g0 += kb) {
                span sp = {g0, ng - g0 < kb ? ng : g0 + kb, g0 == 0, g0 + kb >= ng, NULL};
                for (int64_t r = rs; r < re; r += rm) {
                    int R = re - r >= rm ? rm : (int)(re - r);
                    sp.acc = acc + (r - rs) * tm * 16;
                    tiles[(R - 1) * tm + T - 1](w + r * wb, wb, cols, x + t * xs, xs, &sp, y + t * ys + r, ys, cx);
                }
            }
        }
    }
}

/* A type's constant vectors, made by the first caller (racing first callers each make a
 * copy; one publishes it, the others wait for it). */
static const kctx *ctx_once(kctx *cx, atomic_int *state, void (*make)(kctx *)) {
    if (atomic_load_explicit(state, memory_order_acquire) == 2) return cx;
    kctx tmp;
    make(&tmp);
    int expect = 0;
    if (atomic_compare_exchange_strong(state, &expect, 1)) {
        *cx = tmp;
        atomic_store_explicit(state, 2, memory_order_release);
    }
    while (atomic_load_explicit(state, memory_order_acquire) != 2) {
    }
    return cx;
}

#define DEF_GEMM(name, rm, tm, ctx_make)                                                                        \
    static inline int64_t name##_groups(int64_t cols) {                                                         \
        return (cols / name##_BE + name##_BPG - 1) / name##_BPG;                                                \
    }                                                                                                           \
    static kctx name##_cx;                                                                                      \
    static atomic_int name##_cx_state;                                                                          \
    KF void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,        \
                        int64_t ys, int64_t nr, int64_t nt) {                                                   \
        const kctx *cx = ctx_once(&name##_cx, &name##_cx_state, ctx_make);                                      \
        tile_drive(name##_tiles, rm, tm, cx, w, wb, cols, x, xs, y, ys, nr, nt, name##_groups(cols), name##_XG);  \
    }

// Nibble weights (q4_0, q4_1, q5_0, q5_1): groups of 16 blocks

/* The byte of (L0, L1) = (window [0, 64), window [4 bsize - 64, 4 bsize)) holding window
 * byte o. */
static inline int win_idx(int o, int bsize) { return o < 64 ? o : 64 + o - (4 * bsize - 64); }

/* Fills the index vectors of a nibble type (bsize-byte blocks, quants at qs_off, scale at
 * byte 0, minimum at byte 2, fifth bits at qh_off when qh_off > 0). */
static void nib_ctx(kctx *cx, int bsize, int qs_off, int qh_off) {
    uint8_t qs[64], bits[8][64];
    uint16_t d[32], m[32], hd[32], hm[32], hq[32];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 16; i++) qs[16 * k + i] = (uint8_t)win_idx(bsize * k + qs_off + i, bsize);
    for (int w = 0; w < 32; w++) {
        int k = (w % 16) / 4; /* words w and w + 16 are don't-cares alike */
        d[w] = (uint16_t)((w % 2 ? 32 : 0) + bsize * k / 2);
        m[w] = (uint16_t)(d[w] + 1);
    }
    for (int s = 0; s < 8; s++) /* step s = c + 4 h: byte 4 m + i takes bit 16 h + 4 c + i of lane m */
        for (int p = 0; p < 64; p++) bits[s][p] = (uint8_t)(32 * ((p / 4) % 2) + 16 * (s / 4) + 4 * (s % 4) + p % 4);
    for (int w = 0; w < 32; w++) { /* lane m's block is block m / 4 of every sub-group's window */
        int k = (w % 16) / 4, kq = w / 8;
        hd[w] = (uint16_t)(win_idx(bsize * k, bsize) / 2);
        hm[w] = (uint16_t)(win_idx(bsize * k + 2, bsize) / 2);
        hq[w] = (uint16_t)(win_idx(bsize * kq + qh_off + 2 * (w % 2), bsize) / 2);
    }
    memset(cx, 0, sizeof *cx);
    memcpy(&cx->qs, qs, 64);
    memcpy(&cx->d, d, 64);
    memcpy(&cx->m, m, 64);
    memcpy(&cx->hd, hd, 64);
    memcpy(&cx->hm, hm, 64);
    memcpy(&cx->hq, hq, 64);
    for (int s = 0; s < 8; s++) memcpy(&cx->bits[s], bits[s], 64);
}

/* Packed quants of 16 blocks: P[c] lane m = packed dword c of block nib_block(m); L0[g]
 * and L1[g] keep the two windows of sub-group g (L1 with VBMI only). */
KI void nib_load(const uint8_t *p, int bsize, int qs_off, const kctx *cx, __m512i P[4], __m512i L0[4],
                 __m512i L1[4]) {
    __m512i Q[4];
    UNROLL
    for (int g = 0; g < 4; g++) {
        const uint8_t *s = p + 4 * bsize * g;
        L0[g] = _mm512_loadu_si512(s);
#if HAVE_VNNI /* the VNNI family also has VBMI */
        (void)qs_off;
        L1[g] = _mm512_loadu_si512(s + 4 * bsize - 64);
        Q[g] = _mm512_permutex2var_epi8(L0[g], cx->qs, L1[g]);
#else
        (void)L1;
        (void)cx;
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

/* Words of the four sub-groups' windows picked by idx, sub-group g supplying the words
 * of mask << (g * (mask == 0x1111 ? 1 : 2)) (lanes m with m % 4 == g). */
KI __m512i win_words(const __m512i L0[4], const __m512i L1[4], __m512i idx, uint32_t mask) {
    int step = mask == 0x1111 ? 1 : 2;
    __m512i v = _mm512_permutex2var_epi16(L0[0], idx, L1[0]);
    UNROLL
    for (int g = 1; g < 4; g++)
        v = _mm512_mask_blend_epi16(mask << (step * g), v, _mm512_permutex2var_epi16(L0[g], idx, L1[g]));
    return v;
}

/* f16 words in the low halves of 16 dwords, as floats. */
KI __m512 f16_lo_to_ps(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

/* One group of a nibble type for an R x T tile:
 *     acc = corr_t + sum over steps (c, h) of dpbusd(quants, x_(c + 4h))
 *     facc += (dw ⊙ dx) ⊙ float(acc)   [+ m ⊙ (dx * sum x) for the types with a minimum]
 * q5 types add the fifth bit (16) of each quant from a mask picked out of qh. */
KI void nib_group(int R, int T, int bsize, int qs_off, int has_min, int qh_off, const uint8_t *w, size_t wb,
                  const uint8_t *x, size_t xs, const kctx *cx, __m512 facc[RMAX][TMAX]) {
    __m512i P[RMAX][4], H[RMAX], acc[RMAX][TMAX], acc2[RMAX][TMAX][3];
    /* GEMV pairs split their integer sums into 4 chains: exact, and 4x the parallelism */
    const int split = T == 1;
    __m512 S[RMAX], M[RMAX];
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    (void)H;
    UNROLL
    for (int r = 0; r < R; r++) {
        __m512i L0[4], L1[4];
        nib_load(w + r * wb, bsize, qs_off, cx, P[r], L0, L1);
        if (!qh_off) {
            S[r] = nib_scales(L0, cx->d);
            if (has_min) M[r] = nib_scales(L0, cx->m);
        } else {
            S[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(win_words(L0, L1, cx->hd, 0x1111)));
            if (has_min) M[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(win_words(L0, L1, cx->hm, 0x1111)));
            H[r] = win_words(L0, L1, cx->hq, 0x03030303);
        }
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512i c = _mm512_load_si512(x + t * xs + G16_CORR);
        UNROLL
        for (int r = 0; r < R; r++) {
            acc[r][t] = c;
            acc2[r][t][0] = acc2[r][t][1] = acc2[r][t][2] = _mm512_setzero_si512();
        }
    }
    UNROLL
    for (int c = 0; c < 4; c++) {
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i v[RMAX];
            UNROLL
            for (int r = 0; r < R; r++) {
                v[r] = _mm512_and_si512(h ? _mm512_srli_epi16(P[r][c], 4) : P[r][c], m0f);
#if HAVE_VNNI
                if (qh_off) {
                    __mmask64 k = _mm512_bitshuffle_epi64_mask(H[r], cx->bits[c + 4 * h]);
                    v[r] = _mm512_mask_add_epi8(v[r], k, v[r], _mm512_set1_epi8(16));
                }
#endif
            }
            UNROLL
            for (int t = 0; t < T; t++) {
                __m512i xv = load_reg(x + t * xs + 64 * (c + 4 * h));
                UNROLL
                for (int r = 0; r < R; r++) {
                    int chain = split ? (c % 2) * 2 + h : 0;
                    if (chain) acc2[r][t][chain - 1] = dpbusd(acc2[r][t][chain - 1], v[r], xv);
                    else acc[r][t] = dpbusd(acc[r][t], v[r], xv);
                }
            }
        }
    }
    if (split) {
        UNROLL
        for (int r = 0; r < R; r++)
            acc[r][0] = _mm512_add_epi32(_mm512_add_epi32(acc[r][0], acc2[r][0][0]),
                                         _mm512_add_epi32(acc2[r][0][1], acc2[r][0][2]));
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512 dx = _mm512_load_ps(x + t * xs + G16_DX);
        UNROLL
        for (int r = 0; r < R; r++)
            facc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(S[r], dx), _mm512_cvtepi32_ps(acc[r][t]), facc[r][t]);
        if (has_min) {
            __m512 xsum = _mm512_load_ps(x + t * xs + G16_XS);
            UNROLL
            for (int r = 0; r < R; r++) facc[r][t] = _mm512_fmadd_ps(M[r], xsum, facc[r][t]);
        }
    }
}

/* u8 x s8 dot of 4-byte groups into 8 lanes (256-bit). */
KI __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if HAVE_VNNI
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* The 32 unsigned quants of one block in element order: nibble types (qh_off > 0 adds the
 * fifth bits), or q8_0 (bsize 34) biased by +128. */
KI __m256i tail_quants(const uint8_t *p, int bsize, int qs_off, int qh_off) {
    if (bsize == 34) return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80));
    __m128i v = _mm_loadu_si128((const __m128i *)(p + qs_off));
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
#if HAVE_VNNI
    if (qh_off) {
        uint32_t h;
        memcpy(&h, p + qh_off, 4);
        q = _mm256_mask_add_epi8(q, (__mmask32)h, q, _mm256_set1_epi8(16));
    }
#else
    (void)qh_off;
#endif
    return q;
}

/* rem tail blocks for an R x T tile, one block per step, 8 lanes per pair:
 *     tacc += (dw * dx) * float(corr + dpbusd(q, x))   [+ m * xs into lane 0]. */
KI void tail_blocks(int R, int T, int bsize, int qs_off, int qh_off, int has_min, const uint8_t *w, size_t wb,
                    const uint8_t *x, size_t xs, int rem, __m256 tacc[RMAX][TMAX]) {
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) tacc[r][t] = _mm256_setzero_ps();
    for (int b = 0; b < rem; b++) {
        __m256i q[RMAX];
        float dw[RMAX], mw[RMAX];
        UNROLL
        for (int r = 0; r < R; r++) {
            const uint8_t *p = w + r * wb + b * bsize;
            ps_f16 h[2];
            memcpy(h, p, 4);
            dw[r] = _cvtsh_ss(h[0]);
            mw[r] = _cvtsh_ss(h[1]);
            q[r] = tail_quants(p, bsize, qs_off, qh_off);
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            const uint8_t *xb = x + t * xs + b * XT_BYTES;
            float dx, xsum;
            int32_t corr;
            memcpy(&dx, xb, 4);
            memcpy(&corr, xb + 4, 4);
            memcpy(&xsum, xb + 8, 4);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 16));
            __m256i c0 = _mm256_zextsi128_si256(_mm_cvtsi32_si128(corr));
            UNROLL
            for (int r = 0; r < R; r++) {
                __m256i i = dpbusd256(c0, q[r], xv);
                tacc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dx), _mm256_cvtepi32_ps(i), tacc[r][t]);
                if (has_min)
                    tacc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(mw[r]), _mm256_zextps128_ps256(_mm_set_ss(xsum)),
                                                 tacc[r][t]);
            }
        }
    }
}

#define NIB_TYPE(name, bsize, qs_off, has_min, qh_off)                                                          \
    enum { name##_BE = PS_QK, name##_BB = bsize, name##_BPG = 16, name##_WG = 16 * bsize, name##_XG = G16_BYTES,  \
           name##_NAT = 1 };                                                                                    \
    KI void name##_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,  \
                         __m512 facc[RMAX][TMAX]) {                                                             \
        nib_group(R, T, bsize, qs_off, has_min, qh_off, w, wb, x, xs, cx, facc);                                \
    }                                                                                                           \
    KI void name##_tail(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int rem,         \
                        __m256 tacc[RMAX][TMAX]) {                                                              \
        tail_blocks(R, T, bsize, qs_off, qh_off, has_min, w, wb, x, xs, rem, tacc);                             \
    }                                                                                                           \
    static void name##_ctx(kctx *cx) { nib_ctx(cx, bsize, qs_off, qh_off); }                                    \
    DEF_TILES_R2T4(name)                                                                                        \
    DEF_GEMM(name, 2, 4, name##_ctx)

NIB_TYPE(q4_0, 18, 2, 0, 0)
NIB_TYPE(q4_1, 20, 4, 1, 0)
#if HAVE_VNNI /* both windows of a sub-group (VBMI) and vpshufbitqmb (BITALG) */
NIB_TYPE(q5_0, 22, 6, 0, 2)
NIB_TYPE(q5_1, 24, 8, 1, 4)
#endif

// q8_0: groups of 16 blocks, 1 row x 8 token tiles (a row's eight weight vectors stay in registers)

#if HAVE_VNNI /* with the +128 bias, vpmaddubsw pair sums would saturate */
enum { q8_0_BE = PS_QK, q8_0_BB = 34, q8_0_BPG = 16, q8_0_WG = 16 * 34, q8_0_XG = G16_BYTES, q8_0_NAT = 1 };

KI void q8_0_tail(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int rem,
                  __m256 tacc[RMAX][TMAX]) {
    tail_blocks(R, T, 34, 2, 0, 0, w, wb, x, xs, rem, tacc);
}

static void q8_0_ctx(kctx *cx) {
    uint8_t qs[64];
    for (int i = 0; i < 64; i++) { /* block 0 quants at window bytes 2..33, block 1 at 36..67 */
        int o = i < 32 ? 2 + i : 36 + (i - 32);
        qs[i] = (uint8_t)(o < 64 ? o : 64 + o - 4);
    }
    uint16_t d[32] = {0};
    for (int lane = 0; lane < 16; lane++) { /* block b: window b / 2 (first or second of its pair), word 17 (b % 2) */
        int b = q8_block(lane);
        d[lane] = (uint16_t)(32 * ((b / 2) % 2) + 17 * (b % 2));
    }
    memset(cx, 0, sizeof *cx);
    memcpy(&cx->qs, qs, 64);
    memcpy(&cx->d, d, 64);
}

/* The 16 blocks' quants +128 (unsigned): W[j] lane m = dword j of block q8_block(m). */
KI void q8_0_load(const uint8_t *p, const kctx *cx, __m512i W[8], __m512 *S) {
    __m512i O[2][4], L0[8];
    UNROLL
    for (int half = 0; half < 2; half++) {
        __m512i Q[4];
        UNROLL
        for (int g = 0; g < 4; g++) {
            const uint8_t *s = p + 68 * (4 * half + g);
            L0[4 * half + g] = _mm512_loadu_si512(s);
            Q[g] = _mm512_permutex2var_epi8(L0[4 * half + g], cx->qs, _mm512_loadu_si512(s + 4));
        }
        transpose4(Q, O[half]);
    }
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    UNROLL
    for (int c = 0; c < 4; c++) {
        W[c] = _mm512_xor_si512(_mm512_shuffle_i64x2(O[0][c], O[1][c], 0x88), bias);
        W[4 + c] = _mm512_xor_si512(_mm512_shuffle_i64x2(O[0][c], O[1][c], 0xDD), bias);
    }
    /* scales: each pair of windows gives its 4 blocks' words in their final lanes */
    __m512i d = _mm512_permutex2var_epi16(L0[0], cx->d, L0[1]);
    d = _mm512_mask_blend_epi16(0x00cc, d, _mm512_permutex2var_epi16(L0[2], cx->d, L0[3]));
    d = _mm512_mask_blend_epi16(0x3300, d, _mm512_permutex2var_epi16(L0[4], cx->d, L0[5]));
    d = _mm512_mask_blend_epi16(0xcc00, d, _mm512_permutex2var_epi16(L0[6], cx->d, L0[7]));
    *S = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
}

KI void q8_0_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,
                   __m512 facc[RMAX][TMAX]) {
    __m512i W[RMAX][8], acc[RMAX][TMAX], acc2[3];
    const int split = R * T == 1; /* GEMV: 4 exact integer chains instead of one */
    __m512 S[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) q8_0_load(w + r * wb, cx, W[r], &S[r]);
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512i c = _mm512_load_si512(x + t * xs + G16_CORR);
        UNROLL
        for (int r = 0; r < R; r++) acc[r][t] = c;
    }
    acc2[0] = acc2[1] = acc2[2] = _mm512_setzero_si512();
    UNROLL
    for (int j = 0; j < 8; j++) {
        UNROLL
        for (int t = 0; t < T; t++) {
            __m512i xv = load_reg(x + t * xs + 64 * j);
            UNROLL
            for (int r = 0; r < R; r++) {
                if (split && j % 4) acc2[j % 4 - 1] = dpbusd(acc2[j % 4 - 1], W[r][j], xv);
                else acc[r][t] = dpbusd(acc[r][t], W[r][j], xv);
            }
        }
    }
    if (split) acc[0][0] = _mm512_add_epi32(_mm512_add_epi32(acc[0][0], acc2[0]), _mm512_add_epi32(acc2[1], acc2[2]));
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512 dx = _mm512_load_ps(x + t * xs + G16_DX);
        UNROLL
        for (int r = 0; r < R; r++)
            facc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(S[r], dx), _mm512_cvtepi32_ps(acc[r][t]), facc[r][t]);
    }
}

DEF_TILES_R1T8(q8_0)
DEF_GEMM(q8_0, 1, 8, q8_0_ctx)
#endif

#if HAVE_VNNI /* vpermb (VBMI) */
// K types: groups of 4 super-blocks (1024 columns)

/* Activations of the K types, per group of 4 super-blocks (lane m: super-block s = m % 4,
 * index k = m / 4):
 *   q4_K / q5_K ("k4"): x[16][16][4]: vector c (0..7) lane m = quants 64k + 4c..+3 of
 *     super-block s (sub-block 2k), vector 8 + c the same 32 further on (sub-block 2k + 1);
 *     then float dx[16] and int16 pairs bs[16] = (sum of sub-block 2k, of 2k + 1).
 *   q6_K ("k6"): x[16][16][4]: vector 4 (2h + u) + c lane m = quants 128h + 64u + 16k +
 *     4c..+3 (sub-block 8h + 4u + k); then int32 corr[4][16] (-32 * the sub-block's sum
 *     for the accumulator 2h + u) and float dx[16]. */
#define K4_DX 1024
#define K4_BS 1088
#define K4_BYTES 1152
#define K6_CORR 1024
#define K6_DX 1280
#define K6_BYTES 1344

static size_t k4_bytes(int64_t cols) { return (size_t)((cols / PS_QK_K + 3) / 4) * K4_BYTES; }
static size_t k6_bytes(int64_t cols) { return (size_t)((cols / PS_QK_K + 3) / 4) * K6_BYTES; }

/* Quantizes 256 floats as the ref kernels do (d = max|x| / 127, nearest-even). */
KI void quant_block256(const float *x, int8_t q[256], float *d_out) {
    __m512 a = _mm512_setzero_ps();
    for (int i = 0; i < 256; i += 16) a = _mm512_max_ps(a, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    float amax = _mm512_reduce_max_ps(a);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 256; i += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtsepi32_epi8(v));
    }
    *d_out = d;
}

static int32_t sum_i8(const int8_t *q, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; i++) s += q[i];
    return s;
}

/* Quantizes one row into k4 (six = 0) or k6 (six = 1) groups, zero-padding the last. */
KI void quant_k(const float *x, uint8_t *xq, int64_t cols, int six) {
    int64_t nsb = cols / PS_QK_K, gbytes = six ? K6_BYTES : K4_BYTES;
    for (int64_t g = 0; g * 4 < nsb; g++) {
        uint8_t *G = xq + g * gbytes;
        if (nsb - g * 4 < 4) memset(G, 0, (size_t)gbytes);
        for (int s = 0; s < 4 && g * 4 + s < nsb; s++) {
            int8_t q[256];
            float d;
            quant_block256(x + (g * 4 + s) * PS_QK_K, q, &d);
            for (int k = 0; k < 4; k++) {
                int m = 4 * k + s;
                memcpy(G + (six ? K6_DX : K4_DX) + 4 * m, &d, 4);
                if (six) {
                    for (int v = 0; v < 4; v++) { /* v = 2h + u: sub-block 8h + 4u + k */
                        const int8_t *sub = q + 128 * (v / 2) + 64 * (v % 2) + 16 * k;
                        for (int c = 0; c < 4; c++) memcpy(G + 64 * (4 * v + c) + 4 * m, sub + 4 * c, 4);
                        int32_t corr = -32 * sum_i8(sub, 16);
                        memcpy(G + K6_CORR + 64 * v + 4 * m, &corr, 4);
                    }
                } else {
                    for (int c = 0; c < 8; c++) {
                        memcpy(G + 64 * c + 4 * m, q + 64 * k + 4 * c, 4);
                        memcpy(G + 64 * (8 + c) + 4 * m, q + 64 * k + 32 + 4 * c, 4);
                    }
                    int16_t bs[2] = {(int16_t)sum_i8(q + 64 * k, 32), (int16_t)sum_i8(q + 64 * k + 32, 32)};
                    memcpy(G + K4_BS + 4 * m, bs, 4);
                }
            }
        }
    }
}

KF void quant_k4(const float *x, void *xq, int64_t cols) { quant_k(x, xq, cols, 0); }
KF void quant_k6(const float *x, void *xq, int64_t cols) { quant_k(x, xq, cols, 1); }

/* The 128-bit chunk at byte off of each of the 4 super-blocks (bsize bytes apart), as the
 * four 128-bit lanes of one vector. */
KI __m512i k_chunks(const uint8_t *p, int bsize, int off) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + bsize + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 2 * bsize + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 3 * bsize + off)), 3);
}

/* 64 bytes at off of each super-block, transposed: P[c] (c = 0..7) lane m = dword c of
 * 32-byte piece k = m / 4 of super-block s = m % 4. With bcast, 32 bytes are read and
 * repeated (P[c] then holds dword c of the 32 bytes in every k). */
KI void k_transpose8(const uint8_t *p, int bsize, int off, int bcast, __m512i P[8]) {
    __m512i L[2][4], O[2][4];
    UNROLL
    for (int s = 0; s < 4; s++) {
        if (bcast) {
            L[0][s] = L[1][s] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + bsize * s + off)));
        } else {
            L[0][s] = _mm512_loadu_si512(p + bsize * s + off);
            L[1][s] = _mm512_loadu_si512(p + bsize * s + off + 64);
        }
    }
    transpose4(L[0], O[0]);
    if (bcast) {
        UNROLL
        for (int c = 0; c < 4; c++) O[1][c] = O[0][c];
    } else {
        transpose4(L[1], O[1]);
    }
    UNROLL
    for (int c = 0; c < 4; c++) {
        P[c] = _mm512_shuffle_i64x2(O[0][c], O[1][c], 0x88);
        P[4 + c] = _mm512_shuffle_i64x2(O[0][c], O[1][c], 0xDD);
    }
}

/* Scales and minimums of 4 q4_K / q5_K super-blocks, per lane (s = m % 4, k = m / 4):
 * sc[2k], sc[2k + 1] as int32 (scl, sch), (m[2k], m[2k + 1]) as an int16 pair, d, dmin. */
typedef struct {
    __m512i scl, sch, mins;
    __m512 d, dmin;
} k4_scales;

static void k4_ctx(kctx *cx) {
    uint8_t e[64], f[64];
    uint16_t dw[32];
    for (int m = 0; m < 16; m++) {
        int s = m % 4, k = m / 4, j0 = 2 * k, b = 16 * s + 4; /* scale bytes of super-block s */
        const int lo[4] = {j0, j0 + 1, j0 + 4, j0 + 5}, hi[4] = {j0 + 4, j0 + 5, j0 + 4, j0 + 5};
        const int hf[4] = {j0 - 4, j0 - 3, j0, j0 + 1};
        for (int i = 0; i < 4; i++) {
            e[4 * m + i] = (uint8_t)(b + (k < 2 ? lo[i] : hi[i]));
            f[4 * m + i] = (uint8_t)(k < 2 ? b : b + hf[i]);
        }
    }
    for (int w = 0; w < 32; w++) dw[w] = (uint16_t)(8 * (w % 4) + w / 16); /* d: w < 16, dmin: w >= 16 */
    memset(cx, 0, sizeof *cx);
    memcpy(&cx->qs, e, 64);
    memcpy(&cx->m, f, 64);
    memcpy(&cx->d, dw, 64);
}

KI k4_scales k4_scales_load(const uint8_t *p, int bsize, const kctx *cx) {
    k4_scales ks;
    __m512i z = k_chunks(p, bsize, 0); /* d, dmin, scales[12] of each super-block */
    __m512i dd = _mm512_permutexvar_epi16(cx->d, z);
    ks.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dd));
    ks.dmin = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dd, 1));
    __m512i e = _mm512_permutexvar_epi8(cx->qs, z), f = _mm512_permutexvar_epi8(cx->m, z);
    __m512i lo = _mm512_and_si512(e, _mm512_set1_epi8(0x3f));
    __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(e, _mm512_set1_epi32(4 << 16)), _mm512_set1_epi8(0x0f)),
                                 _mm512_and_si512(_mm512_srli_epi16(f, 2), _mm512_set1_epi8(0x30)));
    __m512i r = _mm512_mask_blend_epi32(0xff00, lo, hi); /* bytes sc0, sc1, m0, m1 */
    ks.scl = _mm512_and_si512(r, _mm512_set1_epi32(0xff));
    ks.sch = _mm512_and_si512(_mm512_srli_epi32(r, 8), _mm512_set1_epi32(0xff));
    __m512i t = _mm512_srli_epi32(r, 16);
    ks.mins = _mm512_or_si512(_mm512_and_si512(t, _mm512_set1_epi32(0xff)),
                              _mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(0xff00)), 8));
    return ks;
}

/* One q4_K / q5_K group for a 1 x T tile (R must be 1):
 *     lo = sum_c dpbusd(sub-block 2k quants, x_c), hi likewise for 2k + 1 (exact ints)
 *     a = lo * sc[2k] + hi * sc[2k + 1];  i = m[2k] bs[2k] + m[2k + 1] bs[2k + 1]
 *     facc += (float(a) ⊙ d - float(i) ⊙ dmin) ⊙ dx */
KI void k4_group(int R, int T, int five, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,
                 __m512 facc[RMAX][TMAX]) {
    const int bsize = five ? 176 : 144, qs_off = five ? 48 : 16;
    /* each row's transposed quants wait in L1 (R rows of them do not fit in registers) */
    __m512i P[RMAX][8] __attribute__((aligned(64))), QH[RMAX][8] __attribute__((aligned(64)));
    __m512i lo[RMAX][TMAX], hi[RMAX][TMAX], lo2 = _mm512_setzero_si512(), hi2 = lo2;
    const int split = R * T == 1; /* GEMV: odd steps in their own exact integer chains */
    k4_scales ks[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) {
        k_transpose8(w + r * wb, bsize, qs_off, 0, P[r]);
        if (five) k_transpose8(w + r * wb, bsize, 16, 1, QH[r]);
        ks[r] = k4_scales_load(w + r * wb, bsize, cx);
    }
    const __m512i m0f = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    /* fifth bits: bit 2k (lo) / 2k + 1 (hi) of each qh byte, rotated to bit 4 */
    const __m512i rot_lo = _mm512_set_epi32(30, 30, 30, 30, 0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4);
    const __m512i rot_hi = _mm512_set_epi32(29, 29, 29, 29, 31, 31, 31, 31, 1, 1, 1, 1, 3, 3, 3, 3);
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) lo[r][t] = hi[r][t] = _mm512_setzero_si512();
    UNROLL
    for (int c = 0; c < 8; c++) {
        __m512i vl[RMAX], vh[RMAX];
        UNROLL
        for (int r = 0; r < R; r++) {
            __m512i pc = R > 1 ? load_reg(&P[r][c]) : P[r][c];
            vl[r] = _mm512_and_si512(pc, m0f);
            vh[r] = _mm512_and_si512(_mm512_srli_epi16(pc, 4), m0f);
            if (five) {
                __m512i qh = R > 1 ? load_reg(&QH[r][c]) : QH[r][c];
                vl[r] = _mm512_ternarylogic_epi32(vl[r], _mm512_rolv_epi32(qh, rot_lo), b4, 0xf8); /* a | (b & c) */
                vh[r] = _mm512_ternarylogic_epi32(vh[r], _mm512_rolv_epi32(qh, rot_hi), b4, 0xf8);
            }
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            __m512i xl = load_reg(x + t * xs + 64 * c), xh = load_reg(x + t * xs + 64 * (8 + c));
            UNROLL
            for (int r = 0; r < R; r++) {
                if (split && c % 2) {
                    lo2 = dpbusd(lo2, vl[r], xl);
                    hi2 = dpbusd(hi2, vh[r], xh);
                } else {
                    lo[r][t] = dpbusd(lo[r][t], vl[r], xl);
                    hi[r][t] = dpbusd(hi[r][t], vh[r], xh);
                }
            }
        }
    }
    if (split) {
        lo[0][0] = _mm512_add_epi32(lo[0][0], lo2);
        hi[0][0] = _mm512_add_epi32(hi[0][0], hi2);
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        __m512i bs = _mm512_load_si512(x + t * xs + K4_BS);
        __m512 dx = _mm512_load_ps(x + t * xs + K4_DX);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m512i a = _mm512_add_epi32(_mm512_mullo_epi32(lo[r][t], ks[r].scl), _mm512_mullo_epi32(hi[r][t], ks[r].sch));
            __m512i i = _mm512_madd_epi16(ks[r].mins, bs);
            __m512 f = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), ks[r].dmin, _mm512_mul_ps(_mm512_cvtepi32_ps(a), ks[r].d));
            facc[r][t] = _mm512_fmadd_ps(f, dx, facc[r][t]);
        }
    }
}

/* The K types pad their last group: their tail functions never run. */
#define NO_TAIL(name)                                                                                           \
    KI void name##_tail(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int rem,         \
                        __m256 tacc[RMAX][TMAX]) {                                                              \
        (void)R, (void)T, (void)w, (void)wb, (void)x, (void)xs, (void)rem, (void)tacc;                          \
    }
NO_TAIL(q4_K)
NO_TAIL(q5_K)
NO_TAIL(q6_K)

enum { q4_K_NAT = 0, q4_K_BE = PS_QK_K, q4_K_BB = 144, q4_K_BPG = 4, q4_K_WG = 576, q4_K_XG = K4_BYTES };
enum { q5_K_NAT = 0, q5_K_BE = PS_QK_K, q5_K_BB = 176, q5_K_BPG = 4, q5_K_WG = 704, q5_K_XG = K4_BYTES };

KI void q4_K_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,
                   __m512 facc[RMAX][TMAX]) {
    k4_group(R, T, 0, w, wb, x, xs, cx, facc);
}

KI void q5_K_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,
                   __m512 facc[RMAX][TMAX]) {
    k4_group(R, T, 1, w, wb, x, xs, cx, facc);
}

/* Tiles of 1 row x up to 6 tokens. */
#define DEF_TILES_R1T6(name)                                                                                    \
    DEF_TILE(name, 1, 1) DEF_TILE(name, 1, 2) DEF_TILE(name, 1, 3) DEF_TILE(name, 1, 4)                         \
    DEF_TILE(name, 1, 5) DEF_TILE(name, 1, 6)                                                                   \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4,  \
                                            name##_tile_1x5, name##_tile_1x6};

/* Tiles of 1 row x up to 4 tokens. */
#define DEF_TILES_R1T4(name)                                                                                    \
    DEF_TILE(name, 1, 1) DEF_TILE(name, 1, 2) DEF_TILE(name, 1, 3) DEF_TILE(name, 1, 4)                         \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4};

DEF_TILES_R1T6(q4_K)
DEF_GEMM(q4_K, 1, 6, k4_ctx)
DEF_TILES_R1T6(q5_K)
DEF_GEMM(q5_K, 1, 6, k4_ctx)

/* q6_K: scales (int8 per 16 quants) as int32 per accumulator v = 2h + u (lane m: scale
 * 8h + 4u + k of super-block s), and d. */
static void k6_ctx(kctx *cx) {
    uint8_t e[64];
    for (int v = 0; v < 4; v++)
        for (int m = 0; m < 16; m++) e[16 * v + m] = (uint8_t)(16 * (m % 4) + 8 * (v / 2) + 4 * (v % 2) + m / 4);
    memset(cx, 0, sizeof *cx);
    memcpy(&cx->qs, e, 64);
}

/* One q6_K group for a 1 x T tile: per half h, for u = 0 (low nibbles) and 1 (high):
 *     acc = corr + sum_c dpbusd(quants 0..63, x);  a += acc * scale   (exact ints)
 * then facc += (d ⊙ dx) ⊙ float(a). */
KI void q6_K_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,
                   __m512 facc[RMAX][TMAX]) {
    (void)R, (void)wb;
    const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    /* lanes k = m / 4 >= 2 take qh bits 2-3 (low nibbles) / 6-7 (high), else 0-1 / 4-5 */
    const __m512i rot = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i shr = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i sc = _mm512_permutexvar_epi8(cx->qs, k_chunks(w, 210, 192));
    ps_f16 dh[4];
    UNROLL
    for (int k = 0; k < 4; k++) memcpy(&dh[k], w + 210 * k + 208, 2);
    __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dh));
    __m512 d = _mm512_permutexvar_ps(_mm512_set_epi32(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0),
                                     _mm512_castps128_ps512(d4)); /* lane m: super-block m % 4 */
    __m512i a[TMAX];
    UNROLL
    for (int t = 0; t < T; t++) a[t] = _mm512_setzero_si512();
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i L[4], Hq[4], P[4], QH[4], acc[2][TMAX];
        UNROLL
        for (int s = 0; s < 4; s++) {
            L[s] = _mm512_loadu_si512(w + 210 * s + 64 * h);
            Hq[s] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 210 * s + 128 + 32 * h)));
        }
        transpose4(L, P);
        transpose4(Hq, QH);
        UNROLL
        for (int t = 0; t < T; t++) {
            acc[0][t] = _mm512_load_si512(x + t * xs + K6_CORR + 64 * (2 * h));
            acc[1][t] = _mm512_load_si512(x + t * xs + K6_CORR + 64 * (2 * h + 1));
        }
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m512i bl = _mm512_and_si512(_mm512_rolv_epi32(QH[c], rot), m30);
            __m512i bh = _mm512_and_si512(_mm512_srlv_epi32(QH[c], shr), m30);
            __m512i vl = _mm512_ternarylogic_epi32(P[c], m0f, bl, 0xea); /* (a & b) | c */
            __m512i vh = _mm512_ternarylogic_epi32(_mm512_srli_epi16(P[c], 4), m0f, bh, 0xea);
            UNROLL
            for (int t = 0; t < T; t++) {
                acc[0][t] = dpbusd(acc[0][t], vl, load_reg(x + t * xs + 64 * (8 * h + c)));
                acc[1][t] = dpbusd(acc[1][t], vh, load_reg(x + t * xs + 64 * (8 * h + 4 + c)));
            }
        }
        __m512i s0 = _mm512_cvtepi8_epi32(h ? _mm512_extracti32x4_epi32(sc, 2) : _mm512_castsi512_si128(sc));
        __m512i s1 = _mm512_cvtepi8_epi32(h ? _mm512_extracti32x4_epi32(sc, 3) : _mm512_extracti32x4_epi32(sc, 1));
        UNROLL
        for (int t = 0; t < T; t++)
            a[t] = _mm512_add_epi32(a[t], _mm512_add_epi32(_mm512_mullo_epi32(acc[0][t], s0),
                                                           _mm512_mullo_epi32(acc[1][t], s1)));
    }
    UNROLL
    for (int t = 0; t < T; t++)
        facc[0][t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(x + t * xs + K6_DX)),
                                     _mm512_cvtepi32_ps(a[t]), facc[0][t]);
}

enum { q6_K_NAT = 0, q6_K_BE = PS_QK_K, q6_K_BB = 210, q6_K_BPG = 4, q6_K_WG = 840, q6_K_XG = K6_BYTES };
DEF_TILES_R1T4(q6_K)
DEF_GEMM(q6_K, 1, 4, k6_ctx)

#endif

// Float weights (f32, f16, bf16) against f32 activations: 16 columns per step

enum { W_F32, W_F16, W_BF16 };

/* 16 weights at column c of a row (lanes beyond mask are 0), as floats. */
KI __m512 fw_load(int kind, const uint8_t *row, int64_t c, __mmask16 mask) {
    if (kind == W_F32)
        return mask == 0xffff ? _mm512_loadu_ps((const float *)row + c) : _mm512_maskz_loadu_ps(mask, (const float *)row + c);
    __m256i h = mask == 0xffff ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c))
                               : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + c);
    if (kind == W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* facc[r][t] = fma(w_r[c..c+16), x_t[c..c+16), facc[r][t]) for one step of 16 columns. */
KI void fstep(int R, int T, int kind, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int64_t c,
              __mmask16 mask, __m512 facc[RMAX][TMAX]) {
    __m512 wv[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) wv[r] = fw_load(kind, w + r * wb, c, mask);
    UNROLL
    for (int t = 0; t < T; t++) {
        const float *xp = (const float *)(x + t * xs) + c;
        __m512 xv = mask == 0xffff ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(mask, xp);
        __asm__("" : "+v"(xv));
        UNROLL
        for (int r = 0; r < R; r++) facc[r][t] = _mm512_fmadd_ps(wv[r], xv, facc[r][t]);
    }
}

/* An R x T tile over 16-column steps [g0, g1): one accumulator per pair, columns in
 * order, the last step masked. */
KI void ftile(int R, int T, int kind, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,
              const span *sp, float *y, int64_t ys) {
    __m512 facc[RMAX][TMAX];
    facc_begin(R, T, sp, facc);
    int64_t gfull = cols / 16 < sp->g1 ? cols / 16 : sp->g1;
    for (int64_t g = sp->g0; g < gfull; g++) {
        if (R * T == 1 && g % (kind == W_F32 ? 1 : 2) == 0) prefetch_ahead(w + 16 * g * (kind == W_F32 ? 4 : 2), 64);
        fstep(R, T, kind, w, wb, x, xs, 16 * g, 0xffff, facc);
    }
    if (gfull < sp->g1) fstep(R, T, kind, w, wb, x, xs, 16 * gfull, (__mmask16)((1u << (cols - 16 * gfull)) - 1), facc);
    facc_end(R, T, sp, facc, y, ys);
}

#define DEF_FTILE(name, kind, R, T)                                                                             \
    KF void name##_tile_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,        \
                                  const span *sp, float *y, int64_t ys, const kctx *cx) {                       \
        (void)cx;                                                                                               \
        ftile(R, T, kind, w, wb, cols, x, xs, sp, y, ys);                                                       \
    }
#define DEF_FROW(name, kind, R)                                                                                 \
    DEF_FTILE(name, kind, R, 1) DEF_FTILE(name, kind, R, 2) DEF_FTILE(name, kind, R, 3)                         \
    DEF_FTILE(name, kind, R, 4) DEF_FTILE(name, kind, R, 5) DEF_FTILE(name, kind, R, 6)
#define FROW_TABLE(name, R)                                                                                     \
    name##_tile_##R##x1, name##_tile_##R##x2, name##_tile_##R##x3, name##_tile_##R##x4, name##_tile_##R##x5,     \
        name##_tile_##R##x6
/* Tiles up to 4 rows x 6 tokens. */
#define FLOAT_TYPE(name, kind)                                                                                  \
    DEF_FROW(name, kind, 1) DEF_FROW(name, kind, 2) DEF_FROW(name, kind, 3) DEF_FROW(name, kind, 4)             \
    static tile_fn *const name##_tiles[] = {FROW_TABLE(name, 1), FROW_TABLE(name, 2), FROW_TABLE(name, 3),      \
                                            FROW_TABLE(name, 4)};                                               \
    static void name##_ctx(kctx *cx) { memset(cx, 0, sizeof *cx); }                                             \
    DEF_GEMM(name, 4, 6, name##_ctx)

enum { f32_BE = 1, f32_BPG = 16, f32_XG = 64, f16_BE = 1, f16_BPG = 16, f16_XG = 64 };
enum { bf16_BE = 1, bf16_BPG = 16, bf16_XG = 64 };
FLOAT_TYPE(f32, W_F32)
FLOAT_TYPE(f16, W_F16)
FLOAT_TYPE(bf16, W_BF16)

static size_t f32_bytes(int64_t cols) { return ((size_t)cols * sizeof(float) + 63) & ~(size_t)63; }

// Table

static const ps_kernel k_f32 = {NULL, f32_bytes, gemm_f32, 4, 6};
static const ps_kernel k_f16 = {NULL, f32_bytes, gemm_f16, 4, 6};
static const ps_kernel k_bf16 = {NULL, f32_bytes, gemm_bf16, 4, 6};
static const ps_kernel k_q4_0 = {quant_nib_off8, g16_bytes, gemm_q4_0, 2, 4};
static const ps_kernel k_q4_1 = {quant_nib_off0, g16_bytes, gemm_q4_1, 2, 4};
#if HAVE_VNNI
static const ps_kernel k_q5_0 = {quant_nib_off16, g16_bytes, gemm_q5_0, 2, 4};
static const ps_kernel k_q5_1 = {quant_nib_off0, g16_bytes, gemm_q5_1, 2, 4};
static const ps_kernel k_q8_0 = {quant_q8_off128, g16_bytes, gemm_q8_0, 1, 8};
static const ps_kernel k_q4_K = {quant_k4, k4_bytes, gemm_q4_K, 1, 6};
static const ps_kernel k_q5_K = {quant_k4, k4_bytes, gemm_q5_K, 1, 6};
static const ps_kernel k_q6_K = {quant_k6, k6_bytes, gemm_q6_K, 1, 4};
#endif

const ps_kernel *FAMILY_FN(uint32_t t) {
    switch (t) {
    case PS_TYPE_F32: return &k_f32;
    case PS_TYPE_F16: return &k_f16;
    case PS_TYPE_BF16: return &k_bf16;
    case PS_TYPE_Q4_0: return &k_q4_0;
    case PS_TYPE_Q4_1: return &k_q4_1;
#if HAVE_VNNI
    case PS_TYPE_Q5_0: return &k_q5_0;
    case PS_TYPE_Q5_1: return &k_q5_1;
    case PS_TYPE_Q8_0: return &k_q8_0;
    case PS_TYPE_Q4_K: return &k_q4_K;
    case PS_TYPE_Q5_K: return &k_q5_K;
    case PS_TYPE_Q6_K: return &k_q6_K;
#endif
    default: return NULL;
    }
}
