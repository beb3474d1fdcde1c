/* q8_neon.h - NEON 8-bit-activation kernel bodies (aarch64, q8_kern.h), included by
 * q8_neon.c (plain Advanced SIMD: every ARMv8-A core) and q8_neondot.c (with the ARMv8.2
 * dot product, sdot: Cortex-A55 / A75 and later, Neoverse, Apple M). Not a normal header:
 * it defines static functions, and the includer sets HAVE_DOTPROD (0 or 1), KTGT (the
 * attributes that enable the family's instructions, or nothing) and FAMILY_TABLE (the name
 * of the kernel table to define).
 *
 * Unlike the x86 families, these kernels give results bit-identical to the ref kernels
 * (q8_ref.c), not merely close: every (row, token) pair goes through exactly ref's float
 * operations in ref's order, and only integer work, exact in any order, is reorganized.
 *   - 32-element and K types: per block (super-block), the integer dot and its corrections
 *     in int32 (sdot; without the dot product smull + smlal2 + sadalp, whose int16 pair
 *     sums stay within range as |w| <= 128 and |x| <= 127), then ref's float step, e.g.
 *     q4_1:  sum += (dw * dx) * float(isum);  sum += m * (dx * float(sum of x)).
 *     Four (row, token) pairs share a vector: lane l holds pair l's running sum, so one
 *     vector instruction does the same scalar step for four pairs.
 *   - Float types (plain family only; the dot product family falls back to it): ref's eight
 *     partial sums s[j % 8] are two float32x4 per pair (a multiply, then an add, as ref),
 *     the columns after the last multiple of 8 go lane by lane in scalar, then ref's
 *     reduce8 order.
 *   - Activations are quantized to ref's d, q, sum and bsums: the maximum is exact (fmaxnm
 *     ignores NaN like fmaxf), and fcvtns rounds to nearest-even like nearbyintf, with the
 *     same clamp to [-127, 127] and NaN -> 0.
 * This relies on the compiler not fusing a * b + c on its own (-ffp-contract=off: GCC's
 * default in ISO C mode, and set in CMakeLists.txt for every compiler), in ref as here.
 *
 * Tiles: 4 rows x 1 token (lanes = rows) for a token tile of one token (decode), else
 * 2 rows x 4 tokens (lanes = tokens, two vectors). Rows or tokens missing at an edge repeat
 * the last real one and are not stored. Batch invariance is exact by construction: a
 * pair's value does not depend on the tile at all. */

#include <arm_neon.h>
#include <string.h>

#include "q8_kern.h"

#define KI static inline __attribute__((always_inline)) KTGT
#define KF static KTGT
/* Tile loops must unroll fully (so that tile arrays live in registers). */
#define UNROLL _Pragma("GCC unroll 16")

// Helpers

/* The binary16 value at p (unaligned) as float: exact (a signalling NaN comes out quiet). */
KI float f16_at(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* acc plus lanes whose total is sum_j a_j * b_j over 16 int8 pairs, exactly. Without the
 * dot product, each int16 lane holds two products: |a| <= 128 (weights), |b| <= 127
 * (quantized activations), so |sum| <= 32512. */
KI int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if HAVE_DOTPROD && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
    return vdotq_s32(acc, a, b);
#elif HAVE_DOTPROD /* clang before 17 declares vdotq_s32 only for a global +dotprod */
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b));
#endif
}

/* The lane totals of four vectors: [sum a, sum b, sum c, sum d]. */
KI int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* Tiles are 4 x 1 (lane l: row l) or R x 4 (vector g: row g, lane l: token l). The lanes
 * of vector g from per-row values v[r], and from per-token values v[t]. */
KI float32x4_t row_lanes_f32(int T, int g, const float *v) { return T == 1 ? vld1q_f32(v) : vdupq_n_f32(v[g]); }
KI float32x4_t tok_lanes_f32(int T, const float *v) { return T == 1 ? vdupq_n_f32(v[0]) : vld1q_f32(v); }

/* Stores lane p % 4 of acc[p / 4] to y[t * ys + r] for the real pairs p = r * T + t
 * (r < nr, t < nt) of an R x T tile. */
KI void store_pairs(int R, int T, const float32x4_t *acc, float *y, int64_t ys, int nr, int nt) {
    float v[8];
    UNROLL
    for (int g = 0; g < R * T / 4; g++) vst1q_f32(v + 4 * g, acc[g]);
    UNROLL
    for (int p = 0; p < R * T; p++)
        if (p / T < nr && p % T < nt) y[(p % T) * ys + p / T] = v[p];
}

// Activation quantization (the same numbers as the ref kernels)

/* ref's ps_xq_scale: d = max|x| / 127 over n (a multiple of 4) floats; returns 1 / d (0
 * when d is 0). */
KI float xq_scale(const float *x, int n, float *d_out) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    float d = vmaxnmvq_f32(m) / 127.0f;
    *d_out = d;
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* ref's ps_xq_round for 16 floats: nearest-even(x * id) clamped to [-127, 127], NaN -> 0. */
KI int8x16_t xq_round16(const float *x, float id) {
    int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x), id));
    int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4), id));
    int32x4_t c = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8), id));
    int32x4_t d = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 12), id));
    const int16x8_t lo = vdupq_n_s16(-127);
    int16x8_t ab = vmaxq_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)), lo);
    int16x8_t cd = vmaxq_s16(vcombine_s16(vqmovn_s32(c), vqmovn_s32(d)), lo);
    return vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)); /* saturates the top at 127 */
}

static size_t x32_bytes(int64_t cols) { return ((size_t)(cols / PS_QK) * sizeof(ps_xq32) + 63) & ~(size_t)63; }
static size_t x256_bytes(int64_t cols) { return ((size_t)(cols / PS_QK_K) * sizeof(ps_block_q8_K) + 63) & ~(size_t)63; }

KF void quant_x32(const float *x, void *xq, int64_t cols) {
    ps_xq32 *b = xq;
    for (int64_t i = 0; i < cols / PS_QK; i++, x += PS_QK) {
        float id = xq_scale(x, PS_QK, &b[i].d);
        int8x16_t q0 = xq_round16(x, id), q1 = xq_round16(x + 16, id);
        vst1q_s8(b[i].qs, q0);
        vst1q_s8(b[i].qs + 16, q1);
        b[i].sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
    }
}

KF void quant_x256(const float *x, void *xq, int64_t cols) {
    ps_block_q8_K *b = xq;
    for (int64_t i = 0; i < cols / PS_QK_K; i++, x += PS_QK_K) {
        float id = xq_scale(x, PS_QK_K, &b[i].d);
        for (int k = 0; k < PS_QK_K / 16; k++) {
            int8x16_t q = xq_round16(x + 16 * k, id);
            vst1q_s8(b[i].qs + 16 * k, q);
            b[i].bsums[k] = vaddlvq_s8(q);
        }
    }
}

// 32-element types: one block per step

enum { T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0 };

/* A weight block unpacked: quants of elements 0..15 and 16..31 (s8), scale, minimum. */
typedef struct {
    int8x16_t lo, hi;
    float d, m;
} wblock;

static inline int wblock_bytes(int type) {
    static const int bytes[] = {18, 20, 22, 24, 34};
    return bytes[type];
}
static inline int wblock_off(int type) { return type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : 0; }
static inline int wblock_min(int type) { return type == T_Q4_1 || type == T_Q5_1; }

/* 0x10 in byte j of *lo (elements 0..15) and *hi (16..31) where bit j of the
 * little-endian u32 at qh is set. */
KI void fifth_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t h;
    memcpy(&h, qh, 4);
    uint8x16_t hv = vreinterpretq_u8_u32(vdupq_n_u32(h)), bits = vld1q_u8(bit), v10 = vdupq_n_u8(0x10);
    *lo = vandq_u8(vtstq_u8(vqtbl1q_u8(hv, vld1q_u8(idx)), bits), v10);
    *hi = vandq_u8(vtstq_u8(vqtbl1q_u8(hv, vld1q_u8(idx + 16)), bits), v10);
}

KI wblock wblock_load(int type, const uint8_t *p) {
    wblock b;
    b.d = f16_at(p);
    b.m = wblock_min(type) ? f16_at(p + 2) : 0.0f;
    if (type == T_Q8_0) {
        b.lo = vld1q_s8((const int8_t *)p + 2);
        b.hi = vld1q_s8((const int8_t *)p + 18);
        return b;
    }
    static const int qs_off[] = {2, 4, 6, 8};
    uint8x16_t v = vld1q_u8(p + qs_off[type]);
    uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
    if (type == T_Q5_0 || type == T_Q5_1) {
        uint8x16_t lo5, hi5;
        fifth_bits(p + (type == T_Q5_0 ? 2 : 4), &lo5, &hi5);
        lo = vorrq_u8(lo, lo5);
        hi = vorrq_u8(hi, hi5);
    }
    b.lo = vreinterpretq_s8_u8(lo);
    b.hi = vreinterpretq_s8_u8(hi);
    return b;
}

/* An R x T tile (4 x 1 or 2 x 4) over all blocks, as ref's dot_q4_0 .. dot_q8_0:
 *     isum = q . x - off * sum(x)           (int32, exact)
 *     acc += (dw * dx) * float(isum)
 *     acc += m * (dx * float(sum(x)))      (q4_1, q5_1)
 * with pair p = r * T + t in lane p % 4 of acc[p / 4]. */
KI void q32_tile(int R, int T, int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,
                 float *y, int64_t ys, int nr, int nt) {
    const uint8_t *wr[4];
    const ps_xq32 *xt[4];
    float32x4_t acc[2];
    UNROLL
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(r < nr ? r : nr - 1) * wb;
    UNROLL
    for (int t = 0; t < T; t++) xt[t] = (const ps_xq32 *)(x + (size_t)(t < nt ? t : nt - 1) * xs);
    UNROLL
    for (int g = 0; g < R * T / 4; g++) acc[g] = vdupq_n_f32(0.0f);
    const int bb = wblock_bytes(type), off = wblock_off(type);
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        wblock b[4];
        int8x16_t xl[4], xh[4];
        UNROLL
        for (int r = 0; r < R; r++) b[r] = wblock_load(type, wr[r] + i * bb);
        UNROLL
        for (int t = 0; t < T; t++) xl[t] = vld1q_s8(xt[t][i].qs), xh[t] = vld1q_s8(xt[t][i].qs + 16);
        float dw[4], m[4], dx[4];
        int32_t s[4];
        UNROLL
        for (int r = 0; r < R; r++) dw[r] = b[r].d, m[r] = b[r].m;
        UNROLL
        for (int t = 0; t < T; t++) dx[t] = xt[t][i].d, s[t] = xt[t][i].sum;
        float32x4_t dxv = tok_lanes_f32(T, dx);
        int32x4_t sum = T == 1 ? vdupq_n_s32(s[0]) : vld1q_s32(s);
        float32x4_t xsum = vmulq_f32(dxv, vcvtq_f32_s32(sum));
        UNROLL
        for (int g = 0; g < R * T / 4; g++) {
            int32x4_t v[4];
            UNROLL
            for (int l = 0; l < 4; l++) {
                int r = (4 * g + l) / T, t = (4 * g + l) % T;
                v[l] = dot16(dot16(vdupq_n_s32(0), b[r].lo, xl[t]), b[r].hi, xh[t]);
            }
            int32x4_t isum = hsum4(v[0], v[1], v[2], v[3]);
            if (off) isum = vsubq_s32(isum, vmulq_n_s32(sum, off));
            acc[g] = vaddq_f32(acc[g], vmulq_f32(vmulq_f32(row_lanes_f32(T, g, dw), dxv), vcvtq_f32_s32(isum)));
            if (wblock_min(type)) acc[g] = vaddq_f32(acc[g], vmulq_f32(row_lanes_f32(T, g, m), xsum));
        }
    }
    store_pairs(R, T, acc, y, ys, nr, nt);
}

// K types: one super-block per step

enum { T_Q4_K, T_Q5_K, T_Q6_K };

static inline int kblock_bytes(int type) { return type == T_Q4_K ? 144 : type == T_Q5_K ? 176 : 210; }

/* Per row and super-block: the float scales and the integer sub-block scales. */
typedef struct {
    float d, dmin;
    int32_t sc[16]; /* q4_K/q5_K: the 8 scales; q6_K: the 16 scales */
    int16x8_t mins; /* q4_K/q5_K: the 8 minimums */
} kblock;

/* As ref's k4_scales (q4_K, q5_K), or q6_K's d and scales. */
KI void kblock_load(int type, const uint8_t *p, kblock *kb) {
    if (type == T_Q6_K) {
        const ps_block_q6_K *b = (const ps_block_q6_K *)p;
        kb->d = f16_at(p + offsetof(ps_block_q6_K, d));
        kb->dmin = 0.0f;
        for (int s = 0; s < 16; s++) kb->sc[s] = b->scales[s];
        return;
    }
    const uint8_t *s = p + 4;
    int16_t m[8];
    kb->d = f16_at(p);
    kb->dmin = f16_at(p + 2);
    for (int j = 0; j < 4; j++) {
        kb->sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        kb->sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (int16_t)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
    }
    kb->mins = vld1q_s16(m);
}

/* The quants of elements 32j..32j+31 of a super-block (s8; q6_K with 32 subtracted), as
 * ref's k4_quants / k6_quants: *lo the first 16, *hi the next 16. */
KI void kquants(int type, const uint8_t *p, int j, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    uint8x16_t a, b;
    if (type == T_Q6_K) {
        int h = j / 4, i = j % 4;
        const uint8_t *ql = p + 64 * h + 32 * (i % 2), *qh = p + 128 + 32 * h;
        a = vld1q_u8(ql), b = vld1q_u8(ql + 16);
        a = i < 2 ? vandq_u8(a, m4) : vshrq_n_u8(a, 4);
        b = i < 2 ? vandq_u8(b, m4) : vshrq_n_u8(b, 4);
        const int8x16_t sh = vdupq_n_s8((int8_t)(4 - 2 * i)); /* bits 2i..2i+1 to 4..5 */
        const uint8x16_t m30 = vdupq_n_u8(0x30);
        a = vorrq_u8(a, vandq_u8(vshlq_u8(vld1q_u8(qh), sh), m30));
        b = vorrq_u8(b, vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), m30));
        *lo = vsubq_s8(vreinterpretq_s8_u8(a), vdupq_n_s8(32));
        *hi = vsubq_s8(vreinterpretq_s8_u8(b), vdupq_n_s8(32));
        return;
    }
    const uint8_t *qs = p + (type == T_Q5_K ? 48 : 16) + 32 * (j / 2);
    a = vld1q_u8(qs), b = vld1q_u8(qs + 16);
    a = j % 2 ? vshrq_n_u8(a, 4) : vandq_u8(a, m4);
    b = j % 2 ? vshrq_n_u8(b, 4) : vandq_u8(b, m4);
    if (type == T_Q5_K) {
        const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j)), v10 = vdupq_n_u8(0x10);
        a = vorrq_u8(a, vandq_u8(vtstq_u8(vld1q_u8(p + 16), bit), v10));
        b = vorrq_u8(b, vandq_u8(vtstq_u8(vld1q_u8(p + 32), bit), v10));
    }
    *lo = vreinterpretq_s8_u8(a);
    *hi = vreinterpretq_s8_u8(b);
}

/* An R x T tile over all super-blocks, as ref's dot_q4_K / dot_q5_K / dot_q6_K:
 *     isum = sum_s sc_s (q . x)_s,  imin = sum_s m_s (bsum_2s + bsum_2s+1)   (int32, exact)
 *     acc += (d * dx) * float(isum) - (dmin * dx) * float(imin)             (q4_K, q5_K)
 *     acc += (d * dx) * float(isum)                                         (q6_K) */
KI void k_tile(int R, int T, int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
               int64_t ys, int nr, int nt) {
    const uint8_t *wr[4];
    const ps_block_q8_K *xt[4];
    float32x4_t acc[2];
    UNROLL
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(r < nr ? r : nr - 1) * wb;
    UNROLL
    for (int t = 0; t < T; t++) xt[t] = (const ps_block_q8_K *)(x + (size_t)(t < nt ? t : nt - 1) * xs);
    UNROLL
    for (int g = 0; g < R * T / 4; g++) acc[g] = vdupq_n_f32(0.0f);
    const int bb = kblock_bytes(type);
    for (int64_t i = 0; i < cols / PS_QK_K; i++) {
        kblock kb[4];
        int32x4_t ia[8];
        UNROLL
        for (int r = 0; r < R; r++) kblock_load(type, wr[r] + i * bb, &kb[r]);
        UNROLL
        for (int p = 0; p < R * T; p++) ia[p] = vdupq_n_s32(0);
        for (int j = 0; j < 8; j++) {
            int8x16_t ql[4], qh[4];
            UNROLL
            for (int r = 0; r < R; r++) kquants(type, wr[r] + i * bb, j, &ql[r], &qh[r]);
            UNROLL
            for (int t = 0; t < T; t++) {
                int8x16_t xl = vld1q_s8(xt[t][i].qs + 32 * j), xh = vld1q_s8(xt[t][i].qs + 32 * j + 16);
                UNROLL
                for (int r = 0; r < R; r++) {
                    int p = r * T + t;
                    if (type == T_Q6_K) {
                        ia[p] = vmlaq_n_s32(ia[p], dot16(vdupq_n_s32(0), ql[r], xl), kb[r].sc[2 * j]);
                        ia[p] = vmlaq_n_s32(ia[p], dot16(vdupq_n_s32(0), qh[r], xh), kb[r].sc[2 * j + 1]);
                    } else {
                        ia[p] = vmlaq_n_s32(ia[p], dot16(dot16(vdupq_n_s32(0), ql[r], xl), qh[r], xh), kb[r].sc[j]);
                    }
                }
            }
        }
        float d[4], dmin[4], dx[4];
        int16x8_t bs[4];
        UNROLL
        for (int r = 0; r < R; r++) d[r] = kb[r].d, dmin[r] = kb[r].dmin;
        UNROLL
        for (int t = 0; t < T; t++) {
            dx[t] = xt[t][i].d;
            if (type != T_Q6_K) bs[t] = vpaddq_s16(vld1q_s16(xt[t][i].bsums), vld1q_s16(xt[t][i].bsums + 8));
        }
        float32x4_t dxv = tok_lanes_f32(T, dx);
        UNROLL
        for (int g = 0; g < R * T / 4; g++) {
            int32x4_t isum = hsum4(ia[4 * g], ia[4 * g + 1], ia[4 * g + 2], ia[4 * g + 3]);
            float32x4_t v = vmulq_f32(vmulq_f32(row_lanes_f32(T, g, d), dxv), vcvtq_f32_s32(isum));
            if (type != T_Q6_K) {
                int32x4_t mi[4];
                UNROLL
                for (int l = 0; l < 4; l++) {
                    int r = (4 * g + l) / T, t = (4 * g + l) % T;
                    mi[l] = vmlal_high_s16(vmull_s16(vget_low_s16(kb[r].mins), vget_low_s16(bs[t])), kb[r].mins, bs[t]);
                }
                int32x4_t imin = hsum4(mi[0], mi[1], mi[2], mi[3]);
                v = vsubq_f32(v, vmulq_f32(vmulq_f32(row_lanes_f32(T, g, dmin), dxv), vcvtq_f32_s32(imin)));
            }
            acc[g] = vaddq_f32(acc[g], v);
        }
    }
    store_pairs(R, T, acc, y, ys, nr, nt);
}

// Float types: 8 columns per step (plain family only)

#if !HAVE_DOTPROD
enum { T_F32, T_F16, T_BF16 };

/* Weights c..c+3 of a row as floats (f16 exact; bf16 is the upper half of an f32). */
KI float32x4_t fw_load(int type, const uint8_t *row, int64_t c) {
    if (type == T_F32) return vld1q_f32((const float *)row + c);
    uint16x4_t h = vld1_u16((const uint16_t *)row + c);
    if (type == T_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* Weight c of a row as ref reads it. */
KI float fw_at(int type, const uint8_t *row, int64_t c) {
    if (type == T_F32) return ((const float *)row)[c];
    uint16_t h;
    memcpy(&h, row + 2 * c, 2);
    return type == T_F16 ? ps_f16_to_f32(h) : ps_bf16_to_f32(h);
}

/* An R x T tile as ref's dot_f32 / dot_f16 / dot_bf16: s[j % 8] += w_j * x_j, then
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). */
KI void f_tile(int R, int T, int type, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,
               int64_t ys, int nr, int nt) {
    const uint8_t *wr[4];
    const float *xt[4];
    float32x4_t a0[8], a1[8];
    UNROLL
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(r < nr ? r : nr - 1) * wb;
    UNROLL
    for (int t = 0; t < T; t++) xt[t] = (const float *)(x + (size_t)(t < nt ? t : nt - 1) * xs);
    UNROLL
    for (int p = 0; p < R * T; p++) a0[p] = a1[p] = vdupq_n_f32(0.0f);
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        float32x4_t w0[4], w1[4];
        UNROLL
        for (int r = 0; r < R; r++) w0[r] = fw_load(type, wr[r], c), w1[r] = fw_load(type, wr[r], c + 4);
        UNROLL
        for (int t = 0; t < T; t++) {
            float32x4_t x0 = vld1q_f32(xt[t] + c), x1 = vld1q_f32(xt[t] + c + 4);
            UNROLL
            for (int r = 0; r < R; r++) {
                a0[r * T + t] = vaddq_f32(a0[r * T + t], vmulq_f32(w0[r], x0));
                a1[r * T + t] = vaddq_f32(a1[r * T + t], vmulq_f32(w1[r], x1));
            }
        }
    }
    UNROLL
    for (int p = 0; p < R * T; p++) {
        int r = p / T, t = p % T;
        if (r >= nr || t >= nt) continue;
        float s[8];
        vst1q_f32(s, a0[p]);
        vst1q_f32(s + 4, a1[p]);
        for (int k = 0; c + k < cols; k++) s[k] += fw_at(type, wr[r], c + k) * xt[t][c + k];
        y[t * ys + r] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    }
}

static size_t f32_bytes(int64_t cols) { return ((size_t)cols * sizeof(float) + 63) & ~(size_t)63; }
#endif

// Tiles and gemm

typedef void tile_fn(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys,
                     int nr, int nt);

/* name_4x1 and name_2x4, and the gemm that covers nr x nt with them: token tiles of 4
 * outside, rows inside; a token tile of one token takes 4 rows at a time. */
#define DEF_TYPE(name, fn, type)                                                                                       \
    KF void name##_4x1(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys,   \
                       int nr, int nt) {                                                                               \
        fn(4, 1, type, w, wb, cols, x, xs, y, ys, nr, nt);                                                             \
    }                                                                                                                  \
    KF void name##_2x4(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys,   \
                       int nr, int nt) {                                                                               \
        fn(2, 4, type, w, wb, cols, x, xs, y, ys, nr, nt);                                                             \
    }                                                                                                                  \
    static void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,          \
                            int64_t ys, int64_t nr, int64_t nt) {                                                      \
        for (int64_t t = 0; t < nt; t += 4) {                                                                          \
            int T = nt - t >= 4 ? 4 : (int)(nt - t), R = T == 1 ? 4 : 2;                                               \
            tile_fn *tile = T == 1 ? name##_4x1 : name##_2x4;                                                          \
            for (int64_t r = 0; r < nr; r += R)                                                                        \
                tile(w + r * wb, wb, cols, x + t * xs, xs, y + t * ys + r, ys, nr - r >= R ? R : (int)(nr - r), T);    \
        }                                                                                                              \
    }

#if !HAVE_DOTPROD
DEF_TYPE(f32, f_tile, T_F32)
DEF_TYPE(f16, f_tile, T_F16)
DEF_TYPE(bf16, f_tile, T_BF16)
#endif
DEF_TYPE(q4_0, q32_tile, T_Q4_0)
DEF_TYPE(q4_1, q32_tile, T_Q4_1)
DEF_TYPE(q5_0, q32_tile, T_Q5_0)
DEF_TYPE(q5_1, q32_tile, T_Q5_1)
DEF_TYPE(q8_0, q32_tile, T_Q8_0)
DEF_TYPE(q4_K, k_tile, T_Q4_K)
DEF_TYPE(q5_K, k_tile, T_Q5_K)
DEF_TYPE(q6_K, k_tile, T_Q6_K)

// Table

/* The family's kernels by ps_type (q8_kern.h): one row per type; neondot leaves the
 * float rows empty (they fall back to neon's). */
const ps_q8_kern FAMILY_TABLE[PS_TYPE_COUNT] = {
#if !HAVE_DOTPROD
    [PS_TYPE_F32] = {NULL, f32_bytes, gemm_f32, 4, 4},
    [PS_TYPE_F16] = {NULL, f32_bytes, gemm_f16, 4, 4},
    [PS_TYPE_BF16] = {NULL, f32_bytes, gemm_bf16, 4, 4},
#endif
    [PS_TYPE_Q4_0] = {quant_x32, x32_bytes, gemm_q4_0, 4, 4},
    [PS_TYPE_Q4_1] = {quant_x32, x32_bytes, gemm_q4_1, 4, 4},
    [PS_TYPE_Q5_0] = {quant_x32, x32_bytes, gemm_q5_0, 4, 4},
    [PS_TYPE_Q5_1] = {quant_x32, x32_bytes, gemm_q5_1, 4, 4},
    [PS_TYPE_Q8_0] = {quant_x32, x32_bytes, gemm_q8_0, 4, 4},
    [PS_TYPE_Q4_K] = {quant_x256, x256_bytes, gemm_q4_K, 4, 4},
    [PS_TYPE_Q5_K] = {quant_x256, x256_bytes, gemm_q5_K, 4, 4},
    [PS_TYPE_Q6_K] = {quant_x256, x256_bytes, gemm_q6_K, 4, 4},
};
