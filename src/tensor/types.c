/* types.c - tensor element types: the type table, half-precision conversions, and the
 * per-type block (de)quantizers.
 *
 * Dequantization is the reference for every kernel: each ps_dequantize_row result is
 * bit-identical to the NumPy `gguf` package (gguf.quants.dequantize), which performs
 * every step in float32 in a fixed order (e.g. Q4_1 rounds d * q, then adds m; Q4_K rounds
 * d * sc and dmin * m first, then d*sc * q, then subtracts). Each dequantizer below
 * follows that order statement by statement, so the compiler must not fuse a multiply
 * and an add into one FMA (that skips a rounding): ISO C mode (-std=c11, which CMake
 * uses) makes GCC's default -ffp-contract=off, and the pragmas below keep it so
 * elsewhere.
 *
 * Blocks are read from and written to memory with memcpy into a local struct: rows in
 * a GGUF mapping need not be aligned for the f16/f32 fields. */
#include "types.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__STRICT_ANSI__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Half-precision conversions ------------------------------------------------------ */

/* The bits of f (memcpy: no type punning through pointers). */
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The float whose bits are u. */
static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact: every binary16 value is a binary32 value. NaN payloads are kept. Written with
 * selects rather than early returns so that row loops over it can vectorize. */
float ps_f16_to_f32(ps_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t em = h & 0x7fff;                        /* exponent and mantissa */
    uint32_t r = (em << 13) + (112u << 23);          /* normal: rebias the exponent 15 -> 127 */
    uint32_t special = r + (112u << 23);             /* inf, nan: exponent 31 -> 255 */
    uint32_t small = f32_bits((float)em * 0x1p-24f); /* zero, subnormal: exact */
    r = em >= 0x7c00 ? special : em < 0x0400 ? small : r;
    return f32_from_bits(sign | r);
}

/* Round to nearest, ties to even, with subnormal results and overflow to infinity
 * (|f| >= 65520). A NaN stays a NaN of the same sign with the top ten payload bits; a
 * payload that would vanish becomes the quiet NaN, so f16 -> f32 -> f16 is the identity
 * for all 65536 values. */
ps_f16 ps_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) { /* nan */
        uint16_t payload = (uint16_t)((ax >> 13) & 0x3ff);
        return (ps_f16)(sign | 0x7c00 | (payload ? payload : 0x200));
    }
    if (ax >= 0x477ff000) return (ps_f16)(sign | 0x7c00); /* >= 65520: inf */
    if (ax >= 0x38800000) {                               /* >= 2^-14: normal result */
        uint32_t h = ((ax >> 13) - (112u << 10));
        uint32_t rem = ax & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry may bump the exponent */
        return (ps_f16)(sign | h);
    }
    if (ax <= 0x33000000) return (ps_f16)sign; /* <= 2^-25 (a tie with 0): ±0 */
    /* subnormal result: the integer number of 2^-24 units, rounded */
    uint32_t m = (ax & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - (ax >> 23); /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++; /* 0x400 is the smallest normal */
    return (ps_f16)(sign | q);
}

float ps_bf16_to_f32(ps_bf16 h) { return f32_from_bits((uint32_t)h << 16); }

/* As ggml_compute_fp32_to_bf16 and gguf's BF16 quantizer: a NaN keeps its sign and top
 * payload bits and is made quiet; everything else rounds to nearest even (overflowing
 * to infinity). */
ps_bf16 ps_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (ps_bf16)(((x & 0xffff0000) | 0x00400000) >> 16);
    return (ps_bf16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Small helpers ------------------------------------------------------------------- */

/* Nearest integer to v (ties to even, as nearbyintf) clamped to [lo, hi]; NaN gives lo. */
static int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)nearbyintf(v);
}

/* trunc(v) clamped to [0, hi], NaN giving 0: the legacy formats' "+ 0.5 then truncate". */
static int trunc_clamp(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    if (v >= (float)hi) return hi;
    return (int)v;
}

/* Sign-carrying maximum magnitude of x[0..n): the first element of largest |x|. */
static float signed_absmax(const float *x, int n) {
    float max = x[0], amax = fabsf(x[0]);
    for (int j = 1; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Smallest and largest of x[0..n), n >= 1 (NaNs after x[0] never win a comparison). */
static void min_max(const float *x, int n, float *min, float *max) {
    *min = *max = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* Little-endian u32 from four bytes (q5_0 / q5_1 fifth bits). */
static uint32_t load_u32le(const uint8_t b[4]) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Plain float formats ---------------------------------------------------------------
 * Per type T: dequant_T(src, y, nb) expands the nb blocks at src (any alignment) into
 * y[0 .. nb * block size), and quant_T(x, dst, nb) writes nb blocks from as many floats
 * times the block size (for F32, F16 and BF16 a block is one element); type_table maps
 * each supported type to its pair. */

static void dequant_f32(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * sizeof *y); }

static void quant_f32(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * sizeof *x); }

static void dequant_f16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        ps_f16 h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = ps_f16_to_f32(h);
    }
}

static void quant_f16(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        ps_f16 h = ps_f32_to_f16(x[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

static void dequant_bf16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        ps_bf16 h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = ps_bf16_to_f32(h);
    }
}

static void quant_bf16(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        ps_bf16 h = ps_f32_to_bf16(x[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* 32-element formats ---------------------------------------------------------------
 * Nibble layout shared by q4_0, q4_1, q5_0, q5_1: qs[j] holds element j in its low
 * nibble and element j + 16 in its high nibble. The q5 formats keep each element's
 * fifth bit j in bit j of the little-endian u32 qh.
 *
 * The quantizers are ggml's reference ones, as the gguf package writes them (so the
 * bytes match it): symmetric types take d = (signed max) / -8 (or -16), so the element of
 * largest magnitude maps to q = 0 exactly; asymmetric types take d = (max - min) / 15
 * (or 31), m = min; quants are trunc(x / d + offset + 0.5) clipped. */

static void dequant_q4_0(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q4_0 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d);
        for (int j = 0; j < PS_QK / 2; j++) {
            y[j] = d * (float)((b.qs[j] & 0x0f) - 8);
            y[j + PS_QK / 2] = d * (float)((b.qs[j] >> 4) - 8);
        }
    }
}

static void quant_q4_0(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q4_0 b;
        float d = signed_absmax(x, PS_QK) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = ps_f32_to_f16(d);
        for (int j = 0; j < PS_QK / 2; j++) {
            int q0 = trunc_clamp(x[j] * id + 8.5f, 15);
            int q1 = trunc_clamp(x[j + PS_QK / 2] * id + 8.5f, 15);
            b.qs[j] = (uint8_t)(q0 | q1 << 4);
        }
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q4_1 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d), m = ps_f16_to_f32(b.m);
        for (int j = 0; j < PS_QK / 2; j++) {
            float v0 = d * (float)(b.qs[j] & 0x0f); /* round the product, then add m */
            float v1 = d * (float)(b.qs[j] >> 4);
            y[j] = v0 + m;
            y[j + PS_QK / 2] = v1 + m;
        }
    }
}

static void quant_q4_1(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q4_1 b;
        float min, max;
        min_max(x, PS_QK, &min, &max);
        float d = (max - min) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = ps_f32_to_f16(d);
        b.m = ps_f32_to_f16(min);
        for (int j = 0; j < PS_QK / 2; j++) {
            int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 15);
            int q1 = trunc_clamp((x[j + PS_QK / 2] - min) * id + 0.5f, 15);
            b.qs[j] = (uint8_t)(q0 | q1 << 4);
        }
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q5_0 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d);
        uint32_t qh = load_u32le(b.qh);
        for (int j = 0; j < PS_QK / 2; j++) {
            int q0 = (b.qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (b.qs[j] >> 4) | (int)((qh >> (j + PS_QK / 2)) & 1) << 4;
            y[j] = d * (float)(q0 - 16);
            y[j + PS_QK / 2] = d * (float)(q1 - 16);
        }
    }
}

/* Packs 32 five-bit quants q[] into qs (low nibbles) and qh (fifth bits). */
static void pack_q5(const int q[PS_QK], uint8_t qs[PS_QK / 2], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < PS_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + PS_QK / 2] & 0x0f) << 4);
        h |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + PS_QK / 2] >> 4) << (j + PS_QK / 2);
    }
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void quant_q5_0(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q5_0 b;
        float d = signed_absmax(x, PS_QK) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[PS_QK];
        for (int j = 0; j < PS_QK; j++) q[j] = trunc_clamp(x[j] * id + 16.5f, 31);
        b.d = ps_f32_to_f16(d);
        pack_q5(q, b.qs, b.qh);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q5_1 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d), m = ps_f16_to_f32(b.m);
        uint32_t qh = load_u32le(b.qh);
        for (int j = 0; j < PS_QK / 2; j++) {
            int q0 = (b.qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (b.qs[j] >> 4) | (int)((qh >> (j + PS_QK / 2)) & 1) << 4;
            float v0 = d * (float)q0; /* round the product, then add m */
            float v1 = d * (float)q1;
            y[j] = v0 + m;
            y[j + PS_QK / 2] = v1 + m;
        }
    }
}

static void quant_q5_1(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q5_1 b;
        float min, max;
        min_max(x, PS_QK, &min, &max);
        float d = (max - min) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[PS_QK];
        for (int j = 0; j < PS_QK; j++) q[j] = trunc_clamp((x[j] - min) * id + 0.5f, 31);
        b.d = ps_f32_to_f16(d);
        b.m = ps_f32_to_f16(min);
        pack_q5(q, b.qs, b.qh);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* q8_0: qs[j] is element j; d = max|x| / 127, q = round-half-away(x / d). */
static void dequant_q8_0(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q8_0 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d);
        for (int j = 0; j < PS_QK; j++) y[j] = (float)b.qs[j] * d;
    }
}

/* The 8-bit quants of x with scale 1/id, rounded half away from zero (roundf), as
 * ggml's quantize_row_q8_0_ref; returns their sum. */
static int quant_i8(const float *x, float id, int8_t *qs, int n) {
    int sum = 0;
    for (int j = 0; j < n; j++) {
        float v = roundf(x[j] * id);
        qs[j] = (int8_t)(isnan(v) ? 0 : v >= 127.0f ? 127 : v <= -127.0f ? -127 : (int)v);
        sum += qs[j];
    }
    return sum;
}

/* max |x[j]| over x[0..n), 0 for n == 0 (fmaxf: NaNs are passed over). */
static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

static void quant_q8_0(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q8_0 b;
        float d = absmax(x, PS_QK) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        quant_i8(x, id, b.qs, PS_QK);
        b.d = ps_f32_to_f16(d);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* q8_1: as q8_0, plus s = d * sum(qs) (computed in f32 before rounding to f16). The gguf
 * package has no q8_1 dequantizer; this is ggml's formula, d * q. */
static void dequant_q8_1(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK) {
        ps_block_q8_1 b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d);
        for (int j = 0; j < PS_QK; j++) y[j] = (float)b.qs[j] * d;
    }
}

static void quant_q8_1(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK) {
        ps_block_q8_1 b;
        float d = absmax(x, PS_QK) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = quant_i8(x, id, b.qs, PS_QK);
        b.d = ps_f32_to_f16(d);
        b.s = ps_f32_to_f16((float)sum * d);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* K formats: 256-element super-blocks -----------------------------------------------
 * q4_K / q5_K: eight sub-blocks of 32 elements, each with a 6-bit scale sc and 6-bit
 * minimum m; value = (d * sc) * q - (dmin * m). The twelve scale bytes pack them as
 *    byte 0..3   sc[j]   in bits 0-5, bits 4-5 of sc[j+4] in bits 6-7
 *    byte 4..7   m[j]    in bits 0-5, bits 4-5 of m[j+4]  in bits 6-7
 *    byte 8..11  bits 0-3 of sc[j+4] in bits 0-3, bits 0-3 of m[j+4] in bits 4-7
 * qs: for each 64-element group g (0..3), byte qs[32g + l] holds element 64g + l in its
 * low nibble and 64g + 32 + l in its high nibble. q5_K: bit i of qh[l] is the fifth bit
 * of element 32i + l. */

/* The 8 six-bit scales sc and minimums m of a q4_K / q5_K super-block from its 12 bytes. */
static void unpack_scales_k4(const uint8_t s[PS_K_SCALE_SIZE], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
    }
}

/* Inverse of unpack_scales_k4: sc[8], m[8] (each < 64) into the 12 scale bytes. */
static void pack_scales_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t s[PS_K_SCALE_SIZE]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] & 0x30) << 2);
        s[j + 4] = (uint8_t)(m[j] | (m[j + 4] & 0x30) << 2);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
}

/* y[0..32) = ds * q[l] - dm, rounding the product first (as gguf and ggml do). */
static void dequant_sub32(float ds, float dm, const uint8_t q[32], float *y) {
    for (int l = 0; l < 32; l++) {
        float v = ds * (float)q[l];
        y[l] = v - dm;
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK_K) {
        ps_block_q4_K b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d), dmin = ps_f16_to_f32(b.dmin);
        uint8_t sc[8], m[8], q[PS_QK_K];
        unpack_scales_k4(b.scales, sc, m);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                q[64 * g + l] = b.qs[32 * g + l] & 0x0f;
                q[64 * g + 32 + l] = b.qs[32 * g + l] >> 4;
            }
        }
        for (int s = 0; s < 8; s++) dequant_sub32(d * (float)sc[s], dmin * (float)m[s], q + 32 * s, y + 32 * s);
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK_K) {
        ps_block_q5_K b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d), dmin = ps_f16_to_f32(b.dmin);
        uint8_t sc[8], m[8], q[PS_QK_K];
        unpack_scales_k4(b.scales, sc, m);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                q[64 * g + l] = b.qs[32 * g + l] & 0x0f;
                q[64 * g + 32 + l] = b.qs[32 * g + l] >> 4;
            }
        }
        for (int s = 0; s < 8; s++)
            for (int l = 0; l < 32; l++) q[32 * s + l] |= (uint8_t)(((b.qh[l] >> s) & 1) << 4);
        for (int s = 0; s < 8; s++) dequant_sub32(d * (float)sc[s], dmin * (float)m[s], q + 32 * s, y + 32 * s);
    }
}

/* Least-squares fit of x[0..32) ≈ scale * L - min, L in [0, nmax], min >= 0 (the format
 * subtracts an unsigned minimum, so the offset can only move values down). Tries a few
 * grid spacings around (max - min) / nmax, refits scale and min to each rounding, and
 * keeps the one with least squared error. Writes *min_out; returns the scale (0 for a
 * constant sub-block). */
static float fit_scale_min(const float *x, int nmax, float *min_out) {
    float lo, hi;
    min_max(x, 32, &lo, &hi);
    if (lo > 0.0f) lo = 0.0f;
    if (hi == lo) {
        *min_out = -lo;
        return 0.0f;
    }
    float best_scale = (hi - lo) / (float)nmax, best_min = lo, best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        float sl = 0, sl2 = 0, sx = 0, sxl = 0, n = 32;
        int L[32];
        for (int l = 0; l < 32; l++) {
            L[l] = round_clamp(iscale * (x[l] - lo), 0, nmax);
            sl += (float)L[l];
            sl2 += (float)(L[l] * L[l]);
            sx += x[l];
            sxl += x[l] * (float)L[l];
        }
        float det = n * sl2 - sl * sl;
        if (det <= 0.0f) continue;
        float scale = (n * sxl - sx * sl) / det;
        float min = (sl2 * sx - sl * sxl) / det;
        if (min > 0.0f) { /* offset must be <= 0: refit the scale alone */
            min = 0.0f;
            scale = sxl / sl2;
        }
        float err = 0;
        for (int l = 0; l < 32; l++) {
            float diff = scale * (float)L[l] + min - x[l];
            err += diff * diff;
        }
        if (err < best_err && scale > 0.0f) {
            best_err = err;
            best_scale = scale;
            best_min = min;
        }
    }
    *min_out = -best_min;
    return best_scale;
}

/* Shared by q4_K (nmax 15) and q5_K (nmax 31): fits every sub-block, quantizes the
 * scales and minimums to 6 bits against d = max scale / 63 and dmin = max min / 63, and
 * rounds the elements against the stored (f16-rounded) scales. Writes d, dmin, the
 * packed scale bytes and L[256]. */
static void quant_k4_common(const float *x, int nmax, ps_f16 *d_out, ps_f16 *dmin_out, uint8_t scales[PS_K_SCALE_SIZE],
                            uint8_t L[PS_QK_K]) {
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < 8; s++) {
        scale[s] = fit_scale_min(x + 32 * s, nmax, &min[s]);
        max_scale = fmaxf(max_scale, scale[s]);
        max_min = fmaxf(max_min, min[s]);
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)round_clamp(inv_scale * scale[s], 0, 63);
        m[s] = (uint8_t)round_clamp(inv_min * min[s], 0, 63);
    }
    *d_out = ps_f32_to_f16(max_scale / 63.0f);
    *dmin_out = ps_f32_to_f16(max_min / 63.0f);
    pack_scales_k4(sc, m, scales);
    float d = ps_f16_to_f32(*d_out), dmin = ps_f16_to_f32(*dmin_out);
    for (int s = 0; s < 8; s++) {
        float ds = d * (float)sc[s], dm = dmin * (float)m[s];
        for (int l = 0; l < 32; l++)
            L[32 * s + l] = ds != 0.0f ? (uint8_t)round_clamp((x[32 * s + l] + dm) / ds, 0, nmax) : 0;
    }
}

/* Low nibbles of L[256] into qs[128] in the q4_K layout. */
static void pack_nibbles_k(const uint8_t L[PS_QK_K], uint8_t qs[PS_QK_K / 2]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            qs[32 * g + l] = (uint8_t)((L[64 * g + l] & 0x0f) | (L[64 * g + 32 + l] & 0x0f) << 4);
}

static void quant_q4_K(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK_K) {
        ps_block_q4_K b;
        uint8_t L[PS_QK_K];
        quant_k4_common(x, 15, &b.d, &b.dmin, b.scales, L);
        pack_nibbles_k(L, b.qs);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

static void quant_q5_K(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK_K) {
        ps_block_q5_K b;
        uint8_t L[PS_QK_K];
        quant_k4_common(x, 31, &b.d, &b.dmin, b.scales, L);
        pack_nibbles_k(L, b.qs);
        memset(b.qh, 0, sizeof b.qh);
        for (int s = 0; s < 8; s++)
            for (int l = 0; l < 32; l++) b.qh[l] |= (uint8_t)((L[32 * s + l] >> 4) << s);
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* q6_K: sixteen sub-blocks of 16 elements, each with a signed 8-bit scale; value =
 * (d * scale) * (q - 32), q six bits. Each 128-element half h (0, 1) uses ql[64h..+64)
 * and qh[32h..+32); for l < 32 its elements l, l+32, l+64, l+96 take
 *    low four bits:  ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high nibble
 *    high two bits:  qh[l] bits 0-1, 2-3, 4-5, 6-7. */
static void dequant_q6_K(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK_K) {
        ps_block_q6_K b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        float d = ps_f16_to_f32(b.d);
        int q[PS_QK_K];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
            int *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                qq[l] = (ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4;
                qq[l + 32] = (ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4;
                qq[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
                qq[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            }
        }
        for (int s = 0; s < PS_QK_K / 16; s++) {
            float ds = d * (float)b.scales[s];
            for (int l = 0; l < 16; l++) y[16 * s + l] = ds * (float)(q[16 * s + l] - 32);
        }
    }
}

/* Least-squares fit of x[0..16) ≈ scale * L with L in [-32, 31] (ggml's make_qx_quants
 * idea, unit weights): the grid is anchored so the element of largest magnitude lands on
 * -32 (the longer side of the range), a few neighbouring spacings are tried, and for
 * each the best scale for that rounding is sum(x L) / sum(L^2). Returns the scale with
 * the least squared error (0 for an all-zero sub-block); its sign may be negative. */
static float fit_scale_sym(const float *x) {
    float max = signed_absmax(x, 16);
    if (max == 0.0f) return 0.0f;
    float best_scale = 0.0f, best_gain = -1.0f;
    for (int step = -9; step <= 9; step++) {
        float iscale = -(32.0f + 0.1f * (float)step) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int l = 0; l < 16; l++) {
            int L = round_clamp(iscale * x[l], -32, 31);
            sxl += x[l] * (float)L;
            sl2 += (float)(L * L);
        }
        /* error = sum x^2 - sxl^2 / sl2 for the best scale, so maximize sxl^2 / sl2 */
        if (sl2 > 0.0f && sxl * sxl / sl2 > best_gain) {
            best_gain = sxl * sxl / sl2;
            best_scale = sxl / sl2;
        }
    }
    return best_scale;
}

static void quant_q6_K(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK_K) {
        ps_block_q6_K b;
        float scale[16];
        for (int s = 0; s < 16; s++) scale[s] = fit_scale_sym(x + 16 * s);
        float max_scale = signed_absmax(scale, 16);
        float iscale = max_scale != 0.0f ? -128.0f / max_scale : 0.0f;
        b.d = ps_f32_to_f16(max_scale != 0.0f ? 1.0f / iscale : 0.0f);
        float d = ps_f16_to_f32(b.d);
        uint8_t L[PS_QK_K];
        for (int s = 0; s < 16; s++) {
            b.scales[s] = (int8_t)round_clamp(iscale * scale[s], -128, 127);
            float ds = d * (float)b.scales[s];
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)(ds != 0.0f ? round_clamp(x[16 * s + l] / ds, -32, 31) + 32 : 32);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *LL = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                b.ql[64 * h + l] = (uint8_t)((LL[l] & 0x0f) | (LL[l + 64] & 0x0f) << 4);
                b.ql[64 * h + l + 32] = (uint8_t)((LL[l + 32] & 0x0f) | (LL[l + 96] & 0x0f) << 4);
                b.qh[32 * h + l] =
                    (uint8_t)((LL[l] >> 4) | (LL[l + 32] >> 4) << 2 | (LL[l + 64] >> 4) << 4 | (LL[l + 96] >> 4) << 6);
            }
        }
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* q8_K: f32 scale, value d * q; bsums[k] = sum of qs[16k..16k+16). The gguf package has
 * no q8_K dequantizer; this is ggml's formula. The quantizer is ggml's reference one:
 * the element of largest magnitude maps to -127, ties to even. */
static void dequant_q8_K(const void *src, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += PS_QK_K) {
        ps_block_q8_K b;
        memcpy(&b, (const uint8_t *)src + i * sizeof b, sizeof b);
        for (int j = 0; j < PS_QK_K; j++) y[j] = b.d * (float)b.qs[j];
    }
}

static void quant_q8_K(const float *x, void *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PS_QK_K) {
        ps_block_q8_K b;
        float max = signed_absmax(x, PS_QK_K);
        float iscale = max != 0.0f ? -127.0f / max : 0.0f;
        for (int j = 0; j < PS_QK_K; j++) b.qs[j] = (int8_t)round_clamp(iscale * x[j], -128, 127);
        for (int k = 0; k < PS_QK_K / 16; k++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += b.qs[16 * k + l];
            b.bsums[k] = (int16_t)sum;
        }
        b.d = max != 0.0f ? 1.0f / iscale : 0.0f;
        memcpy((uint8_t *)dst + i * sizeof b, &b, sizeof b);
    }
}

/* Type table -------------------------------------------------------------------------
 * Indexed by the ggml / GGUF type number. Types we cannot load still have their name
 * and block geometry, so a GGUF reader can lay out (and name) tensors it will refuse.
 * Numbers 4-5 (the long-removed Q4_2, Q4_3) are unknown. Block geometry as in ggml's
 * type_traits (and gguf's GGML_QUANT_SIZES, except Q8_1: see test_quant_dequant.py). */

typedef void (*dequant_fn)(const void *src, float *dst, int64_t n_blocks);
typedef void (*quant_fn)(const float *src, void *dst, int64_t n_blocks);

typedef struct {
    ps_type_info info;
    dequant_fn dequant; /* NULL unless supported */
    quant_fn quant;
} type_entry;

#define SUPPORTED(nm, bs, ts, fn)                                                                                      \
    { {nm, bs, ts, true}, dequant_##fn, quant_##fn }
#define NAMED(nm, bs, ts)                                                                                              \
    { {nm, bs, ts, false}, NULL, NULL }

static const type_entry type_table[] = {
    [PS_TYPE_F32] = SUPPORTED("F32", 1, 4, f32),
    [PS_TYPE_F16] = SUPPORTED("F16", 1, 2, f16),
    [PS_TYPE_Q4_0] = SUPPORTED("Q4_0", PS_QK, sizeof(ps_block_q4_0), q4_0),
    [PS_TYPE_Q4_1] = SUPPORTED("Q4_1", PS_QK, sizeof(ps_block_q4_1), q4_1),
    [PS_TYPE_Q5_0] = SUPPORTED("Q5_0", PS_QK, sizeof(ps_block_q5_0), q5_0),
    [PS_TYPE_Q5_1] = SUPPORTED("Q5_1", PS_QK, sizeof(ps_block_q5_1), q5_1),
    [PS_TYPE_Q8_0] = SUPPORTED("Q8_0", PS_QK, sizeof(ps_block_q8_0), q8_0),
    [PS_TYPE_Q8_1] = SUPPORTED("Q8_1", PS_QK, sizeof(ps_block_q8_1), q8_1),
    [PS_TYPE_Q2_K] = NAMED("Q2_K", PS_QK_K, 84),
    [PS_TYPE_Q3_K] = NAMED("Q3_K", PS_QK_K, 110),
    [PS_TYPE_Q4_K] = SUPPORTED("Q4_K", PS_QK_K, sizeof(ps_block_q4_K), q4_K),
    [PS_TYPE_Q5_K] = SUPPORTED("Q5_K", PS_QK_K, sizeof(ps_block_q5_K), q5_K),
    [PS_TYPE_Q6_K] = SUPPORTED("Q6_K", PS_QK_K, sizeof(ps_block_q6_K), q6_K),
    [PS_TYPE_Q8_K] = SUPPORTED("Q8_K", PS_QK_K, sizeof(ps_block_q8_K), q8_K),
    [16] = NAMED("IQ2_XXS", PS_QK_K, 66),
    [17] = NAMED("IQ2_XS", PS_QK_K, 74),
    [18] = NAMED("IQ3_XXS", PS_QK_K, 98),
    [19] = NAMED("IQ1_S", PS_QK_K, 50),
    [20] = NAMED("IQ4_NL", PS_QK, 18),
    [21] = NAMED("IQ3_S", PS_QK_K, 110),
    [22] = NAMED("IQ2_S", PS_QK_K, 82),
    [23] = NAMED("IQ4_XS", PS_QK_K, 136),
    [24] = NAMED("I8", 1, 1),
    [25] = NAMED("I16", 1, 2),
    [26] = NAMED("I32", 1, 4),
    [27] = NAMED("I64", 1, 8),
    [28] = NAMED("F64", 1, 8),
    [29] = NAMED("IQ1_M", PS_QK_K, 56),
    [PS_TYPE_BF16] = SUPPORTED("BF16", 1, 2, bf16),
    [31] = NAMED("Q4_0_4_4", PS_QK, 18), /* 31-33, 36-38: repacked layouts, since removed */
    [32] = NAMED("Q4_0_4_8", PS_QK, 18),
    [33] = NAMED("Q4_0_8_8", PS_QK, 18),
    [34] = NAMED("TQ1_0", PS_QK_K, 54),
    [35] = NAMED("TQ2_0", PS_QK_K, 66),
    [36] = NAMED("IQ4_NL_4_4", PS_QK, 18),
    [37] = NAMED("IQ4_NL_4_8", PS_QK, 18),
    [38] = NAMED("IQ4_NL_8_8", PS_QK, 18),
    [39] = NAMED("MXFP4", PS_QK, 17),
};
/* types.h promises numbers below PS_TYPE_COUNT, so newer ggml types (NVFP4 = 40,
 * Q1_0 = 41) stay unknown until the enum's bound grows. */
_Static_assert(PS_ARRAY_LEN(type_table) <= PS_TYPE_COUNT, "type numbers stay below PS_TYPE_COUNT");

static const type_entry *type_entry_get(uint32_t t) {
    if (t >= PS_ARRAY_LEN(type_table) || !type_table[t].info.name) return NULL;
    return &type_table[t];
}

const ps_type_info *ps_type_get(uint32_t t) {
    const type_entry *e = type_entry_get(t);
    return e ? &e->info : NULL;
}

const char *ps_type_name(uint32_t t) {
    static _Thread_local char buf[24];
    const type_entry *e = type_entry_get(t);
    if (e) return e->info.name;
    snprintf(buf, sizeof buf, "type %u", (unsigned)t);
    return buf;
}

ps_status ps_type_from_name(const char *name, ps_type *out) {
    if (!name || !out) return PS_ERR_ARG;
    for (uint32_t t = 0; t < PS_ARRAY_LEN(type_table); t++) {
        if (type_table[t].info.name && strcasecmp(type_table[t].info.name, name) == 0) {
            *out = (ps_type)t;
            return PS_OK;
        }
    }
    return PS_ERR_NOT_FOUND;
}

size_t ps_row_bytes(uint32_t t, int64_t n) {
    const type_entry *e = type_entry_get(t);
    if (!e || n < 0 || n % e->info.block_size != 0) return 0;
    uint64_t blocks = (uint64_t)n / e->info.block_size;
    if (blocks > SIZE_MAX / e->info.type_size) return 0;
    return (size_t)blocks * e->info.type_size;
}

/* Row (de)quantization ---------------------------------------------------------------- */

/* The entry for a (de)quantization of n elements of t, or a status saying why not. */
static ps_status check_row(ps_type t, const void *a, const void *b, int64_t n, const type_entry **out) {
    const type_entry *e = type_entry_get((uint32_t)t);
    if (!e) return PS_ERR_ARG;
    if (!e->info.supported) return PS_ERR_UNSUPPORTED;
    if (n < 0 || n % e->info.block_size != 0 || (n > 0 && (!a || !b))) return PS_ERR_ARG;
    if (ps_row_bytes((uint32_t)t, n) == 0 && n > 0) return PS_ERR_RANGE;
    *out = e;
    return PS_OK;
}

ps_status ps_dequantize_row(ps_type t, const void *src, float *dst, int64_t n) {
    const type_entry *e;
    ps_status s = check_row(t, src, dst, n, &e);
    if (s != PS_OK) return s;
    e->dequant(src, dst, n / e->info.block_size);
    return PS_OK;
}

ps_status ps_quantize_row(ps_type t, const float *src, void *dst, int64_t n) {
    const type_entry *e;
    ps_status s = check_row(t, src, dst, n, &e);
    if (s != PS_OK) return s;
    e->quant(src, dst, n / e->info.block_size);
    return PS_OK;
}
