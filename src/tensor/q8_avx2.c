/* q8_avx2.c - 8-bit-activation kernels of ps_matmul (q8_kern.h) for AVX2 + FMA + F16C
 * (Haswell, Zen 1-3 and other CPUs without AVX-512), compiled per function with target
 * attributes.
 *
 * Activations use the ref formats (ps_xq32 for the 32-element types, ps_block_q8_K for
 * the K types, f32 in place for the float types), quantized with the very same d and q as
 * the ref kernels. Per weight block the integer dot is exact (vpmaddubsw pair sums stay
 * within int16: each type's bound is stated where it is summed).
 *   - q4_0, q8_0, q4_K, q5_K, q6_K (the row-interleaved tiles): 8 rows in the 8 lanes of
 *     a vector, the block's integer dot whole in each lane, then ref's float step lane for
 *     lane, so these give ref's bits (see that section).
 *   - The other types: per (row, token) pair, 8 float lanes accumulate block after block:
 *         acc = fma(dw * dx, float(isum lanes), acc)
 *     and the lanes are summed in one fixed order at the end. Register tiles of R rows x
 *     T tokens give every pair this same instruction sequence.
 * Either way outputs are batch-invariant. Scalar multiply-adds are written as fmaf, so
 * that no compiler setting for contraction can make two tile shapes round differently. */
#include "q8_kern.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT    "avx2,fma,f16c"
#define KI     static inline __attribute__((always_inline, target(TGT)))
#define KF     static __attribute__((target(TGT)))
#define UNROLL _Pragma("GCC unroll 16")
#define RMAX   2
#define TMAX   4

// Helpers

/* Sum of the 8 lanes in one fixed order: halves, then pairs. */
KI float hsum8(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* Exact int32 lanes of sum(u8 * s8) over 4-byte groups (pair sums within int16). */
KI __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* The 32 nibbles of a 16-byte block: element j low nibble of qs[j], j + 16 high nibble. */
KI __m256i nibbles32(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

/* 0x10 in byte j where bit j of the little-endian u32 at qh is set. */
KI __m256i fifth_bits32(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i shuf =
        _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL);
    b = _mm256_cmpeq_epi8(_mm256_or_si256(b, bit), _mm256_set1_epi64x(-1));
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

// Activation quantization (the same numbers as the ref kernels)

/* d = max|x| / 127 over n (multiple of 8) floats; returns 1 / d (0 when d is 0). */
KI float xq_scale(const float *x, int n, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float d = _mm_cvtss_f32(m) / 127.0f;
    *d_out = d;
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* q = nearest-even(x * id) for 32 floats; returns their sum. */
KI int32_t xq_round32(const float *x, float id, int8_t q[32]) {
    __m256 s = _mm256_set1_ps(id);
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s));
    __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), s));
    __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), s));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, q8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}

static size_t x32_bytes(int64_t cols) { return ((size_t)(cols / PS_QK) * sizeof(ps_xq32) + 63) & ~(size_t)63; }
static size_t x256_bytes(int64_t cols) { return ((size_t)(cols / PS_QK_K) * sizeof(ps_block_q8_K) + 63) & ~(size_t)63; }
static size_t f32_bytes(int64_t cols) { return ((size_t)cols * sizeof(float) + 63) & ~(size_t)63; }

KF void quant_x32(const float *x, void *xq, int64_t cols) {
    ps_xq32 *b = xq;
    for (int64_t i = 0; i < cols / PS_QK; i++, x += PS_QK) {
        float id = xq_scale(x, PS_QK, &b[i].d);
        b[i].sum = xq_round32(x, id, b[i].qs);
    }
}

KF void quant_x256(const float *x, void *xq, int64_t cols) {
    ps_block_q8_K *b = xq;
    for (int64_t i = 0; i < cols / PS_QK_K; i++, x += PS_QK_K) {
        float id = xq_scale(x, PS_QK_K, &b[i].d);
        for (int j = 0; j < PS_QK_K; j += 32) xq_round32(x + j, id, b[i].qs + j);
        for (int k = 0; k < PS_QK_K / 16; k++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += b[i].qs[16 * k + l];
            b[i].bsums[k] = (int16_t)sum;
        }
    }
}

// 32-element types: one block per step

/* A weight block unpacked: quants (u8, or s8 for q8_0), scale, minimum. */
typedef struct {
    __m256i q;
    float d, m;
} wblock;

enum { T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0 };

KI wblock wblock_load(int type, const uint8_t *p) {
    wblock b;
    ps_f16 d, m;
    memcpy(&d, p, 2);
    memcpy(&m, p + 2, 2);
    b.d = _cvtsh_ss(d);
    b.m = _cvtsh_ss(m);
    switch (type) {
    case T_Q4_0: b.q = nibbles32(p + 2); break;
    case T_Q4_1: b.q = nibbles32(p + 4); break;
    case T_Q5_0: b.q = _mm256_or_si256(nibbles32(p + 6), fifth_bits32(p + 2)); break;
    case T_Q5_1: b.q = _mm256_or_si256(nibbles32(p + 8), fifth_bits32(p + 4)); break;
    default: b.q = _mm256_loadu_si256((const __m256i *)(p + 2)); break;
    }
    return b;
}

/* Block bytes and the offset subtracted from its (unsigned) quants. */
static inline int wblock_bytes(int type) {
    static const int bytes[] = {18, 20, 22, 24, 34};
    return bytes[type];
}
static inline int wblock_off(int type) { return type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : 0; }

/* One block for an R x T tile:
 *     isum = lanes of q . x  (+ -off * sum(x) in lane 0)
 *     acc += (dw * dx) * float(isum);  macc += m * (dx * sum(x))  (types with a minimum) */
KI void q32_step(int R, int T, int type, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int64_t i,
                 __m256 acc[RMAX][TMAX], float macc[RMAX][TMAX]) {
    wblock b[RMAX];
    __m256i au[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) {
        b[r] = wblock_load(type, w + r * wb + i * wblock_bytes(type));
        if (type == T_Q8_0) au[r] = _mm256_sign_epi8(b[r].q, b[r].q);
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        const ps_xq32 *xb = (const ps_xq32 *)(x + t * xs) + i;
        __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
        __m256i corr = _mm256_setr_epi32(-wblock_off(type) * xb->sum, 0, 0, 0, 0, 0, 0, 0);
        float xsum = xb->d * (float)xb->sum;
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256i isum = type == T_Q8_0 ? dot_u8s8(au[r], _mm256_sign_epi8(xv, b[r].q)) : dot_u8s8(b[r].q, xv);
            if (wblock_off(type)) isum = _mm256_add_epi32(isum, corr);
            acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(b[r].d * xb->d), _mm256_cvtepi32_ps(isum), acc[r][t]);
            if (type == T_Q4_1 || type == T_Q5_1) macc[r][t] = fmaf(b[r].m, xsum, macc[r][t]);
        }
    }
}

/* Writes hsum8(acc) (+ macc) for an R x T tile. */
KI void store_tile(int R, int T, __m256 acc[RMAX][TMAX], float macc[RMAX][TMAX], int use_macc, float *y, int64_t ys) {
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) y[t * ys + r] = use_macc ? hsum8(acc[r][t]) + macc[r][t] : hsum8(acc[r][t]);
    }
}

KI void q32_tile(int R, int T, int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,
                 float *y, int64_t ys) {
    __m256 acc[RMAX][TMAX];
    float macc[RMAX][TMAX];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(), macc[r][t] = 0.0f;
    }
    for (int64_t i = 0; i < cols / PS_QK; i++) q32_step(R, T, type, w, wb, x, xs, i, acc, macc);
    store_tile(R, T, acc, macc, type == T_Q4_1 || type == T_Q5_1, y, ys);
}

// Float types: 8 columns per step

enum { T_F32, T_F16, T_BF16 };

/* 8 weights at column c (n valid, the rest 0) as floats. */
KI __m256 fw_load(int type, const uint8_t *row, int64_t c, int n) {
    if (n < 8) {
        float f[8] = {0};
        for (int k = 0; k < n; k++)
            f[k] = type == T_F32   ? ((const float *)row)[c + k]
                   : type == T_F16 ? _cvtsh_ss(((const ps_f16 *)row)[c + k])
                                   : ps_bf16_to_f32(((const ps_bf16 *)row)[c + k]);
        return _mm256_loadu_ps(f);
    }
    if (type == T_F32) return _mm256_loadu_ps((const float *)row + c);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
    if (type == T_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

KI __m256 fx_load(const float *x, int64_t c, int n) {
    if (n >= 8) return _mm256_loadu_ps(x + c);
    float f[8] = {0};
    memcpy(f, x + c, sizeof(float) * (size_t)n);
    return _mm256_loadu_ps(f);
}

/* acc[r][t] = fma(w_r[c..c+8), x_t[c..c+8), acc[r][t]) (n valid columns, the rest 0). */
KI void f_step(int R, int T, int type, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int64_t c, int n,
               __m256 acc[RMAX][TMAX]) {
    __m256 wv[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) wv[r] = fw_load(type, w + r * wb, c, n);
    UNROLL
    for (int t = 0; t < T; t++) {
        __m256 xv = fx_load((const float *)(x + t * xs), c, n);
        UNROLL
        for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}

KI void f_tile(int R, int T, int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
               int64_t ys) {
    __m256 acc[RMAX][TMAX];
    float macc[RMAX][TMAX];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(), macc[r][t] = 0.0f;
    }
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) f_step(R, T, type, w, wb, x, xs, c, 8, acc);
    if (c < cols) f_step(R, T, type, w, wb, x, xs, c, (int)(cols - c), acc);
    store_tile(R, T, acc, macc, 0, y, ys);
}

// Row-interleaved tiles (q4_0, q8_0; the K types below): lanes = rows, ref's float steps

/* Up to 8 rows x T tokens per tile, one lane per row: per block, the rows' 32-element
 * runs are transposed in registers so that int32 lane r of vector k holds row r's
 * elements 4k..4k+3 (k < 8), and each token's 4-byte group k is broadcast against it.
 * The integer dot of (row, token) then ends whole in lane r, and the float step is ref's,
 * lane for lane (q8_ref.c, with -ffp-contract=off), for q4_0 and q8_0:
 *     sum = sum + (dw * dx) * float(isum)
 * so these types give ref's bits, whatever the tile (rows missing at the edge repeat the
 * last real one and are not stored). Float sums live in acc[t][8] on the stack, so a
 * block's transposed weights serve every token of the tile. */
#define RT_TOKS 32

/* The binary16 values at p[r] + off (r < 8) as 8 floats. */
KI __m256 rows_f16(const uint8_t *const p[8], size_t off) {
    uint16_t h[8];
    UNROLL
    for (int r = 0; r < 8; r++) memcpy(&h[r], p[r] + off, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* The 8 rows' 16 bytes at p[r] + off, transposed: g[k] (k < 4) int32 lane r = row r's
 * bytes 4k..4k+3. */
KI void rows_t16(const uint8_t *const p[8], size_t off, __m256i g[4]) {
    __m256i a[4];
    UNROLL
    for (int r = 0; r < 4; r++)
        a[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[r] + off))),
                                       _mm_loadu_si128((const __m128i *)(p[r + 4] + off)), 1);
    __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    g[0] = _mm256_unpacklo_epi64(t0, t2);
    g[1] = _mm256_unpackhi_epi64(t0, t2);
    g[2] = _mm256_unpacklo_epi64(t1, t3);
    g[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* The 8 rows' 32 bytes at p[r] + off, transposed: g[k] (k < 8) int32 lane r = row r's
 * bytes 4k..4k+3. */
KI void rows_t32(const uint8_t *const p[8], size_t off, __m256i g[8]) {
    __m256i a[8], t[8], u[8];
    UNROLL
    for (int r = 0; r < 8; r++) a[r] = _mm256_loadu_si256((const __m256i *)(p[r] + off));
    UNROLL
    for (int r = 0; r < 8; r += 2) {
        t[r] = _mm256_unpacklo_epi32(a[r], a[r + 1]);
        t[r + 1] = _mm256_unpackhi_epi32(a[r], a[r + 1]);
    }
    UNROLL
    for (int h = 0; h < 8; h += 4) {
        u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    UNROLL
    for (int k = 0; k < 4; k++) {
        g[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        g[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* q4_0: the 8 rows' nibbles at p[r] + 2, transposed: g[k] int32 lane r = row r's
 * elements 4k..4k+3 (u8). */
KI void q4_0_rows(const uint8_t *const p[8], __m256i g[8]) {
    __m256i d[4];
    rows_t16(p, 2, d);
    const __m256i lo = _mm256_set1_epi8(0x0f);
    UNROLL
    for (int k = 0; k < 4; k++) {
        g[k] = _mm256_and_si256(d[k], lo);
        g[k + 4] = _mm256_and_si256(_mm256_srli_epi16(d[k], 4), lo);
    }
}

/* Token block xb against the transposed rows g: lane r = the exact integer dot of row r
 * with the block (q4_0: minus 8 * sum(x), as ref). q4_0's pair sums add up in int16:
 * 8 steps x 2 x 15 x 127 = 30480. */
KI __m256i rows_dot(int type, const __m256i g[8], const __m256i ga[8], const ps_xq32 *xb) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == T_Q4_0) {
        __m256i s16 = _mm256_setzero_si256();
        UNROLL
        for (int k = 0; k < 8; k++) {
            int32_t xk;
            memcpy(&xk, xb->qs + 4 * k, 4);
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(g[k], _mm256_set1_epi32(xk)));
        }
        return _mm256_sub_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(8 * xb->sum));
    }
    __m256i s = _mm256_setzero_si256();
    UNROLL
    for (int k = 0; k < 8; k++) {
        int32_t xk;
        memcpy(&xk, xb->qs + 4 * k, 4);
        __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(xk), g[k]);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(ga[k], xs), ones));
    }
    return s;
}

/* One block of the 8 rows p[r] against nt tokens, in ref's float step per lane:
 *     acc[t] = acc[t] + (dw * dx) * float(isum) */
KI void q32_rows_block(int type, const uint8_t *const p[8], const uint8_t *x, size_t xs, int64_t i, int nt,
                       __m256 acc[RT_TOKS]) {
    __m256i g[8], ga[8];
    if (type == T_Q4_0) {
        q4_0_rows(p, g);
    } else {
        rows_t32(p, 2, g);
        UNROLL
        for (int k = 0; k < 8; k++) ga[k] = _mm256_sign_epi8(g[k], g[k]);
    }
    __m256 dw = rows_f16(p, 0);
    for (int t = 0; t < nt; t++) {
        const ps_xq32 *xb = (const ps_xq32 *)(x + (size_t)t * xs) + i;
        __m256 f = _mm256_cvtepi32_ps(rows_dot(type, g, ga, xb));
        __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xb->d));
        acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(s, f));
    }
}

// The K types in row-interleaved tiles (one 256-element super-block per step)

enum { T_Q4_K = 8, T_Q5_K, T_Q6_K };

static inline int kblock_bytes(int type) { return type == T_Q4_K ? 144 : type == T_Q5_K ? 176 : 210; }

/* Byte b (< 4) of each int32 lane into both int16 halves: zero-extended (sgn 0), or
 * sign-extended (sgn 1). With pair 1, bytes b and b + 1 into the two halves. */
KI __m256i lane_bytes16(__m256i v, int b, int pair, int sgn) {
    __m256i idx = sgn ? _mm256_setr_epi8(-128, 0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128,
                                         0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12)
                      : _mm256_setr_epi8(0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128, 0,
                                         -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128);
    idx = _mm256_add_epi8(idx, _mm256_set1_epi8((char)b)); /* -128 + b keeps the zeroing bit */
    if (pair) idx = _mm256_add_epi8(idx, _mm256_set1_epi32(sgn ? 0x01000000 : 0x00010000));
    __m256i r = _mm256_shuffle_epi8(v, idx);
    return sgn ? _mm256_srai_epi16(r, 8) : r;
}

/* q4_K / q5_K: the 8 rows' scales (sc[j]: int32 lane r = row r's scale j in both int16
 * halves) and minimums (mn[h]: lane r = row r's minimums 2h and 2h + 1). The 12 packed
 * bytes at 4..15 unpack as ref's k4_scales, four bytes of a row per lane at a time. */
KI void k4_rows_scales(const uint8_t *const p[8], __m256i sc[8], __m256i mn[4]) {
    __m256i w[4];
    rows_t16(p, 4, w);
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256i s_lo = _mm256_and_si256(w[0], m6), m_lo = _mm256_and_si256(w[1], m6);
    __m256i s_hi = _mm256_or_si256(_mm256_and_si256(w[2], m4), _mm256_and_si256(_mm256_srli_epi32(w[0], 2), m30));
    __m256i m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[2], 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi32(w[1], 2), m30));
    UNROLL
    for (int b = 0; b < 4; b++) {
        sc[b] = lane_bytes16(s_lo, b, 0, 0);
        sc[b + 4] = lane_bytes16(s_hi, b, 0, 0);
    }
    mn[0] = lane_bytes16(m_lo, 0, 1, 0);
    mn[1] = lane_bytes16(m_lo, 2, 1, 0);
    mn[2] = lane_bytes16(m_hi, 0, 1, 0);
    mn[3] = lane_bytes16(m_hi, 2, 1, 0);
}

/* Bit j of each byte of v, moved to bit 4 (q5_K's fifth bits; shifts within int16 are
 * byte-safe under the mask). */
KI __m256i bit_to_4(__m256i v, int j) {
    v = j < 4 ? _mm256_slli_epi16(v, 4 - j) : _mm256_srli_epi16(v, j - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Bits 2i, 2i + 1 of each byte of v, moved to bits 4, 5 (q6_K's high bits). */
KI __m256i bits_to_45(__m256i v, int i) {
    v = i < 2 ? _mm256_slli_epi16(v, 4 - 2 * i) : _mm256_srli_epi16(v, 2 * i - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x30));
}

/* sum over k in [k0, k1) of maddubs(q[k], token's bytes 4k..4k+3 broadcast): int16 pair sums. */
KI __m256i rows_pairs(const __m256i q[8], const int8_t *xq, int k0, int k1) {
    __m256i s = _mm256_setzero_si256();
    UNROLL
    for (int k = k0; k < k1; k++) {
        int32_t xk;
        memcpy(&xk, xq + 4 * k, 4);
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(q[k], _mm256_set1_epi32(xk)));
    }
    return s;
}

/* q4_K / q5_K super-block i of the 8 rows against nt tokens. Per run j of 32 quants the
 * int16 pair sums stay exact (q4_K: 8 x 2 x 15 x 127 = 30480; q5_K sums 4 at a time),
 * times the run's scale into int32; then ref's float step:
 *     acc = acc + ((d * dx) * float(isum) - (dmin * dx) * float(imin)) */
KI void k4_rows_block(int type, const uint8_t *const p[8], const uint8_t *x, size_t xs, int64_t i, int nt,
                      __m256 acc[RT_TOKS]) {
    __m256i sc[8], mn[4], qh[8], isum[RT_TOKS];
    k4_rows_scales(p, sc, mn);
    if (type == T_Q5_K) rows_t32(p, 16, qh);
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
    UNROLL
    for (int c = 0; c < 4; c++) {
        __m256i g[8];
        rows_t32(p, (type == T_Q5_K ? 48 : 16) + 32 * c, g);
        UNROLL
        for (int h = 0; h < 2; h++) {
            const int j = 2 * c + h;
            __m256i q[8];
            UNROLL
            for (int k = 0; k < 8; k++) {
                q[k] = _mm256_and_si256(h ? _mm256_srli_epi16(g[k], 4) : g[k], _mm256_set1_epi8(0x0f));
                if (type == T_Q5_K) q[k] = _mm256_or_si256(q[k], bit_to_4(qh[k], j));
            }
            for (int t = 0; t < nt; t++) {
                const int8_t *xq = ((const ps_block_q8_K *)(x + (size_t)t * xs))[i].qs + 32 * j;
                __m256i d = type == T_Q5_K ? _mm256_add_epi32(_mm256_madd_epi16(rows_pairs(q, xq, 0, 4), sc[j]),
                                                              _mm256_madd_epi16(rows_pairs(q, xq, 4, 8), sc[j]))
                                           : _mm256_madd_epi16(rows_pairs(q, xq, 0, 8), sc[j]);
                isum[t] = _mm256_add_epi32(isum[t], d);
            }
        }
    }
    __m256 dw = rows_f16(p, 0), mw = rows_f16(p, 2);
    for (int t = 0; t < nt; t++) {
        const ps_block_q8_K *xb = (const ps_block_q8_K *)(x + (size_t)t * xs) + i;
        int32_t b8[4]; /* int16 pairs: bsums of runs 2h, 2h + 1 */
        _mm_storeu_si128((__m128i *)b8, _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xb->bsums),
                                                       _mm_loadu_si128((const __m128i *)xb->bsums + 1)));
        __m256i imin = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 4; h++) imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mn[h], _mm256_set1_epi32(b8[h])));
        __m256 dx = _mm256_set1_ps(xb->d);
        __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[t]));
        __m256 b = _mm256_mul_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(imin));
        acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(a, b));
    }
}

/* q6_K super-block i of the 8 rows against nt tokens: quants 0..63 as u8 (pair sums of 2
 * at a time stay in int16: 2 x 2 x 63 x 127 = 32004) times the signed scale of each 16,
 * minus 32 * sum(scale * bsum) for the offset; then ref's float step:
 *     acc = acc + (d * dx) * float(isum) */
KI void k6_rows_block(const uint8_t *const p[8], const uint8_t *x, size_t xs, int64_t i, int nt, __m256 acc[RT_TOKS]) {
    __m256i sw[4], sp[8], isum[RT_TOKS];
    rows_t16(p, 192, sw);
    UNROLL
    for (int k = 0; k < 8; k++) sp[k] = lane_bytes16(sw[k / 2], 2 * (k % 2), 1, 1); /* scales 2k, 2k + 1 */
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m256i l0[8], l1[8], hb[8];
        rows_t32(p, 64 * h, l0);
        rows_t32(p, 64 * h + 32, l1);
        rows_t32(p, 128 + 32 * h, hb);
        UNROLL
        for (int n = 0; n < 4; n++) { /* run 4h + n: elements 128h + 32n.., scales s, s + 1 */
            const int s = 8 * h + 2 * n;
            __m256i sa = lane_bytes16(sw[s / 4], s % 4, 0, 1), sb = lane_bytes16(sw[s / 4], s % 4 + 1, 0, 1);
            __m256i q[8];
            UNROLL
            for (int k = 0; k < 8; k++) {
                __m256i lo = n % 2 ? l1[k] : l0[k];
                lo = _mm256_and_si256(n < 2 ? lo : _mm256_srli_epi16(lo, 4), _mm256_set1_epi8(0x0f));
                q[k] = _mm256_or_si256(lo, bits_to_45(hb[k], n));
            }
            for (int t = 0; t < nt; t++) {
                const int8_t *xq = ((const ps_block_q8_K *)(x + (size_t)t * xs))[i].qs + 128 * h + 32 * n;
                __m256i d = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(rows_pairs(q, xq, 0, 2), sa),
                                                              _mm256_madd_epi16(rows_pairs(q, xq, 2, 4), sa)),
                                             _mm256_add_epi32(_mm256_madd_epi16(rows_pairs(q, xq, 4, 6), sb),
                                                              _mm256_madd_epi16(rows_pairs(q, xq, 6, 8), sb)));
                isum[t] = _mm256_add_epi32(isum[t], d);
            }
        }
    }
    __m256 dw = rows_f16(p, 208);
    for (int t = 0; t < nt; t++) {
        const ps_block_q8_K *xb = (const ps_block_q8_K *)(x + (size_t)t * xs) + i;
        int32_t bs[8]; /* int16 pairs: bsums 2k, 2k + 1 */
        memcpy(bs, xb->bsums, sizeof bs);
        __m256i off = _mm256_setzero_si256();
        UNROLL
        for (int k = 0; k < 8; k++) off = _mm256_add_epi32(off, _mm256_madd_epi16(sp[k], _mm256_set1_epi32(bs[k])));
        __m256i s = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(off, 5));
        __m256 a = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(s));
        acc[t] = _mm256_add_ps(acc[t], a);
    }
}

/* y[t * ys + r] for r < nr <= 8, t < nt <= RT_TOKS: rows w + r * wb against tokens
 * x + t * xs, each pair in ref's float steps. Block by block, the matching share of the
 * next_bytes at next (the next row group) is prefetched: the hardware's prefetchers miss
 * 8 short interleaved row streams, and with few tokens the tile would wait on memory. */
KI void rows_tile(int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
                  int64_t ys, int nr, int nt, const uint8_t *next, size_t next_bytes) {
    const int kt = type >= T_Q4_K, bs = kt ? kblock_bytes(type) : wblock_bytes(type);
    __m256 acc[RT_TOKS];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    const uint8_t *p[8];
    UNROLL
    for (int r = 0; r < 8; r++) p[r] = w + (size_t)(r < nr ? r : nr - 1) * wb;
    for (int64_t i = 0; i < cols / (kt ? PS_QK_K : PS_QK); i++) {
        for (size_t o = (size_t)i * 8 * bs; o < (size_t)(i + 1) * 8 * bs && o < next_bytes; o += 64)
            _mm_prefetch((const char *)(next + o), _MM_HINT_T0);
        if (type == T_Q6_K)
            k6_rows_block(p, x, xs, i, nt, acc);
        else if (kt)
            k4_rows_block(type, p, x, xs, i, nt, acc);
        else
            q32_rows_block(type, p, x, xs, i, nt, acc);
        UNROLL
        for (int r = 0; r < 8; r++) p[r] += bs;
    }
    __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < nt; t++) _mm256_maskstore_ps(y + t * ys, keep, acc[t]);
}

/* The tiles over nr x nt: row groups of 8 outside (their weights stay in L1 for every
 * token group), token groups of RT_TOKS inside. */
#define DEF_ROWS_GEMM(name, type)                                                                                      \
    KF void name##_rows_tile(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,         \
                             int64_t ys, int nr, int nt, const uint8_t *next, size_t next_bytes) {                     \
        rows_tile(type, w, wb, cols, x, xs, y, ys, nr, nt, next, next_bytes);                                          \
    }                                                                                                                  \
    static void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,          \
                            int64_t ys, int64_t nr, int64_t nt) {                                                      \
        for (int64_t r = 0; r < nr; r += 8) {                                                                          \
            int R = nr - r < 8 ? (int)(nr - r) : 8;                                                                    \
            int64_t next_rows = nr - r - R < 8 ? nr - r - R : 8;                                                       \
            for (int64_t t = 0; t < nt; t += RT_TOKS)                                                                  \
                name##_rows_tile(w + r * wb, wb, cols, x + t * xs, xs, y + t * ys + r, ys, R,                          \
                                 nt - t < RT_TOKS ? (int)(nt - t) : RT_TOKS, w + (r + R) * wb,                         \
                                 (size_t)next_rows * wb);                                                              \
        }                                                                                                              \
    }

// Tiles and gemm

typedef void tile_fn(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys);

#define DEF_TILE(name, fn, type, R, T)                                                                                 \
    KF void name##_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,         \
                             int64_t ys) {                                                                             \
        fn(R, T, type, w, wb, cols, x, xs, y, ys);                                                                     \
    }
/* Tiles up to 2 rows x 4 tokens and the gemm that covers nr x nt with them: token tiles
 * outside, so that a row chunk (in L2) meets each tile's tokens (in L1) in turn; up to
 * SMALL_NT tokens, rows outside, so that a row pair comes from memory once and serves
 * every token tile from L1 (with few tokens, a sweep per tile would wait on memory for
 * the first of only a few). A single token takes one row at a time, one weight stream
 * per thread. */
#define SMALL_NT 32
#define DEF_TYPE(name, fn, type)                                                                                       \
    DEF_TILE(name, fn, type, 1, 1)                                                                                     \
    DEF_TILE(name, fn, type, 1, 2)                                                                                     \
    DEF_TILE(name, fn, type, 1, 3)                                                                                     \
    DEF_TILE(name, fn, type, 1, 4)                                                                                     \
    DEF_TILE(name, fn, type, 2, 1)                                                                                     \
    DEF_TILE(name, fn, type, 2, 2)                                                                                     \
    DEF_TILE(name, fn, type, 2, 3)                                                                                     \
    DEF_TILE(name, fn, type, 2, 4)                                                                                     \
    static tile_fn *const name##_tiles[2][4] = {{name##_1x1, name##_1x2, name##_1x3, name##_1x4},                      \
                                                {name##_2x1, name##_2x2, name##_2x3, name##_2x4}};                     \
    static void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,          \
                            int64_t ys, int64_t nr, int64_t nt) {                                                      \
        int rm = nt == 1 ? 1 : 2;                                                                                      \
        for (int64_t t = 0; t < nt; t += nt <= SMALL_NT ? nt : 4) {                                                    \
            for (int64_t r = 0; r < nr; r += rm) {                                                                     \
                int R = nr - r >= rm ? rm : (int)(nr - r);                                                             \
                for (int64_t u = t; u < t + (nt <= SMALL_NT ? nt : 4); u += 4) {                                       \
                    int T = nt - u >= 4 ? 4 : (int)(nt - u);                                                           \
                    name##_tiles[R - 1][T - 1](w + r * wb, wb, cols, x + u * xs, xs, y + u * ys + r, ys);              \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

DEF_TYPE(f32, f_tile, T_F32)
DEF_TYPE(f16, f_tile, T_F16)
DEF_TYPE(bf16, f_tile, T_BF16)
DEF_ROWS_GEMM(q4_0, T_Q4_0)
DEF_TYPE(q4_1, q32_tile, T_Q4_1)
DEF_TYPE(q5_0, q32_tile, T_Q5_0)
DEF_TYPE(q5_1, q32_tile, T_Q5_1)
DEF_ROWS_GEMM(q8_0, T_Q8_0)
DEF_ROWS_GEMM(q4_K, T_Q4_K)
DEF_ROWS_GEMM(q5_K, T_Q5_K)
DEF_ROWS_GEMM(q6_K, T_Q6_K)

// Table

/* The family's kernels by ps_type (q8_kern.h): one row per type. */
const ps_q8_kern ps_q8_avx2_kerns[PS_TYPE_COUNT] = {
    [PS_TYPE_F32] = {NULL, f32_bytes, gemm_f32, 2, 4},
    [PS_TYPE_F16] = {NULL, f32_bytes, gemm_f16, 2, 4},
    [PS_TYPE_BF16] = {NULL, f32_bytes, gemm_bf16, 2, 4},
    [PS_TYPE_Q4_0] = {quant_x32, x32_bytes, gemm_q4_0, 8, RT_TOKS},
    [PS_TYPE_Q4_1] = {quant_x32, x32_bytes, gemm_q4_1, 2, 4},
    [PS_TYPE_Q5_0] = {quant_x32, x32_bytes, gemm_q5_0, 2, 4},
    [PS_TYPE_Q5_1] = {quant_x32, x32_bytes, gemm_q5_1, 2, 4},
    [PS_TYPE_Q8_0] = {quant_x32, x32_bytes, gemm_q8_0, 8, RT_TOKS},
    [PS_TYPE_Q4_K] = {quant_x256, x256_bytes, gemm_q4_K, 8, RT_TOKS},
    [PS_TYPE_Q5_K] = {quant_x256, x256_bytes, gemm_q5_K, 8, RT_TOKS},
    [PS_TYPE_Q6_K] = {quant_x256, x256_bytes, gemm_q6_K, 8, RT_TOKS},
};

#else
const ps_q8_kern ps_q8_avx2_kerns[PS_TYPE_COUNT]; /* not built for this architecture: every row empty */
#endif
