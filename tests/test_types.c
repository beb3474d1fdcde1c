/* test_types.c - element types: table and names, row sizes, f16/bf16 conversions,
 * hand-built blocks, quantize -> dequantize error bounds, argument checks.
 * (Bit-exactness against the Python gguf package: tests/test_quant_dequant.py.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "tensor/types.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Deterministic test data ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float rng_gauss(void) {
    double u1 = (rng_u32() + 1.0) / 4294967297.0, u2 = rng_u32() / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Type table and names --------------------------------------------------------------- */

static const struct {
    ps_type t;
    const char *name;
    uint32_t block_size, type_size;
} supported[] = {
    {PS_TYPE_F32, "F32", 1, 4},
    {PS_TYPE_F16, "F16", 1, 2},
    {PS_TYPE_BF16, "BF16", 1, 2},
    {PS_TYPE_Q4_0, "Q4_0", 32, sizeof(ps_block_q4_0)},
    {PS_TYPE_Q4_1, "Q4_1", 32, sizeof(ps_block_q4_1)},
    {PS_TYPE_Q5_0, "Q5_0", 32, sizeof(ps_block_q5_0)},
    {PS_TYPE_Q5_1, "Q5_1", 32, sizeof(ps_block_q5_1)},
    {PS_TYPE_Q8_0, "Q8_0", 32, sizeof(ps_block_q8_0)},
    {PS_TYPE_Q8_1, "Q8_1", 32, sizeof(ps_block_q8_1)},
    {PS_TYPE_Q4_K, "Q4_K", 256, sizeof(ps_block_q4_K)},
    {PS_TYPE_Q5_K, "Q5_K", 256, sizeof(ps_block_q5_K)},
    {PS_TYPE_Q6_K, "Q6_K", 256, sizeof(ps_block_q6_K)},
    {PS_TYPE_Q8_K, "Q8_K", 256, sizeof(ps_block_q8_K)},
};

static void test_table(void) {
    int n_supported = 0;
    for (uint32_t t = 0; t < 64; t++) {
        const ps_type_info *info = ps_type_get(t);
        if (!info) continue;
        PS_CHECK(info->name && info->block_size > 0 && info->type_size > 0);
        PS_CHECK(strcmp(ps_type_name(t), info->name) == 0);
        ps_type back;
        PS_CHECK_OK(ps_type_from_name(info->name, &back));
        PS_CHECK_EQ_INT(back, t);
        n_supported += info->supported;
    }
    PS_CHECK_EQ_INT(n_supported, (int)PS_ARRAY_LEN(supported));
    for (size_t i = 0; i < PS_ARRAY_LEN(supported); i++) {
        const ps_type_info *info = ps_type_get(supported[i].t);
        PS_CHECK(info && info->supported);
        if (!info) continue;
        PS_CHECK(strcmp(info->name, supported[i].name) == 0);
        PS_CHECK_EQ_INT(info->block_size, supported[i].block_size);
        PS_CHECK_EQ_INT(info->type_size, supported[i].type_size);
    }
    /* known by name, not supported: the ggml numbering */
    static const struct {
        uint32_t t;
        const char *name;
        uint32_t bs, ts;
    } named[] = {
        {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110}, {16, "IQ2_XXS", 256, 66}, {20, "IQ4_NL", 32, 18},
        {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},       {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
        {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66}, {39, "MXFP4", 32, 17},
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(named); i++) {
        const ps_type_info *info = ps_type_get(named[i].t);
        PS_CHECK(info && !info->supported);
        if (!info) continue;
        PS_CHECK(strcmp(info->name, named[i].name) == 0);
        PS_CHECK_EQ_INT(info->block_size, named[i].bs);
        PS_CHECK_EQ_INT(info->type_size, named[i].ts);
    }
    /* unknown numbers */
    PS_CHECK(ps_type_get(4) == NULL);
    PS_CHECK(ps_type_get(5) == NULL);
    PS_CHECK(ps_type_get(PS_TYPE_COUNT) == NULL); /* the enum's promise: numbers below it */
    PS_CHECK(ps_type_get(1000) == NULL);
    PS_CHECK(ps_type_get(UINT32_MAX) == NULL);
    PS_CHECK(strcmp(ps_type_name(4), "type 4") == 0);
    PS_CHECK(strcmp(ps_type_name(4000000000u), "type 4000000000") == 0);
}

static void test_names(void) {
    ps_type t = PS_TYPE_F32;
    PS_CHECK_OK(ps_type_from_name("q4_k", &t));
    PS_CHECK_EQ_INT(t, PS_TYPE_Q4_K);
    PS_CHECK_OK(ps_type_from_name("Q8_0", &t));
    PS_CHECK_EQ_INT(t, PS_TYPE_Q8_0);
    PS_CHECK_OK(ps_type_from_name("f16", &t));
    PS_CHECK_EQ_INT(t, PS_TYPE_F16);
    PS_CHECK_OK(ps_type_from_name("bf16", &t));
    PS_CHECK_EQ_INT(t, PS_TYPE_BF16);
    PS_CHECK_OK(ps_type_from_name("iq2_xxs", &t)); /* found; the caller checks ->supported */
    PS_CHECK_EQ_INT(t, 16);
    PS_CHECK_EQ_INT(ps_type_from_name("q4_9", &t), PS_ERR_NOT_FOUND);
    PS_CHECK_EQ_INT(ps_type_from_name("", &t), PS_ERR_NOT_FOUND);
    PS_CHECK_EQ_INT(ps_type_from_name("Q4_K_M", &t), PS_ERR_NOT_FOUND);
    PS_CHECK_EQ_INT(ps_type_from_name(NULL, &t), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_type_from_name("f32", NULL), PS_ERR_ARG);
}

static void test_row_bytes(void) {
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_F32, 3), 12);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_F16, 7), 14);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_BF16, 576), 1152);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q4_0, 32), 18);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q4_1, 576), 18 * 20);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q8_0, 4096), 128 * 34);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q4_K, 4096), 16 * 144);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q6_K, 256), 210);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q8_K, 512), 584);
    PS_CHECK_EQ_INT(ps_row_bytes(16, 512), 132); /* unsupported types still have a size */
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_F32, 0), 0);
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q4_0, 33), 0);  /* not a whole block */
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_Q4_K, 576), 0); /* 576 = 2.25 super-blocks */
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_F32, -4), 0);
    PS_CHECK_EQ_INT(ps_row_bytes(4, 32), 0);    /* unknown type */
    PS_CHECK_EQ_INT(ps_row_bytes(1000, 32), 0); /* unknown type */
    /* overflow of blocks * type_size is refused, not wrapped (type 28 is F64, 8 bytes) */
    PS_CHECK_EQ_INT(ps_row_bytes(PS_TYPE_F32, INT64_MAX), 0);
    if (SIZE_MAX / 8 < (uint64_t)INT64_MAX) {
        int64_t n = (int64_t)(SIZE_MAX / 8); /* exactly fits */
        PS_CHECK(ps_row_bytes(28, n) == (size_t)n * 8);
        PS_CHECK_EQ_INT(ps_row_bytes(28, n + 1), 0);
    }
}

/* f16 / bf16 ------------------------------------------------------------------------- */

/* The value of binary16 bits h, from the definition (finite h only). */
static double f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

static void test_f16_exhaustive(void) {
    int bad_value = 0, bad_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ps_f16_to_f32((ps_f16)h);
        uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 0x1f && man == 0)
            bad_value += !(isinf(f) && (signbit(f) != 0) == (h >> 15));
        else if (exp == 0x1f)
            bad_value += !(isnan(f) && (signbit(f) != 0) == (h >> 15) && (bits_of(f) >> 13 & 0x3ff) == man);
        else
            bad_value += (double)f != f16_value((uint16_t)h) || (signbit(f) != 0) != (h >> 15);
        bad_trip += ps_f32_to_f16(f) != h;
    }
    PS_CHECK_EQ_INT(bad_value, 0);
    PS_CHECK_EQ_INT(bad_trip, 0);
}

/* Rounding, checked at every boundary: for each pair of neighbouring positive f16 values
 * a < b (including 65504 -> inf, whose midpoint 65520 rounds to inf, and 0 -> the
 * smallest subnormal), the exact midpoint goes to the one with an even mantissa, and the
 * floats just below and above the midpoint go to a and b. */
static void test_f16_rounding(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double a = f16_value((uint16_t)h);
        double b = h + 1 < 0x7c00 ? f16_value((uint16_t)(h + 1)) : 65536.0; /* 2^16: where inf "is" */
        float mid = (float)((a + b) / 2);                                   /* exact: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        for (int s = 0; s < 2; s++) {
            uint16_t sg = s ? 0x8000 : 0;
            float m = s ? -mid : mid;
            bad += ps_f32_to_f16(m) != (sg | even);
            bad += ps_f32_to_f16(nextafterf(m, 0.0f)) != (sg | h);
            bad += ps_f32_to_f16(nextafterf(m, s ? -INFINITY : INFINITY)) != (sg | (h + 1));
            bad += ps_f32_to_f16(s ? -(float)a : (float)a) != (sg | h); /* exact values stay */
        }
    }
    PS_CHECK_EQ_INT(bad, 0);
    PS_CHECK_EQ_INT(ps_f32_to_f16(65504.0f), 0x7bff);
    PS_CHECK_EQ_INT(ps_f32_to_f16(65519.996f), 0x7bff);
    PS_CHECK_EQ_INT(ps_f32_to_f16(65520.0f), 0x7c00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(1e30f), 0x7c00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(-INFINITY), 0xfc00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(1e-30f), 0x0000);
    PS_CHECK_EQ_INT(ps_f32_to_f16(-1e-30f), 0x8000);
    PS_CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie with 0: even */
    PS_CHECK_EQ_INT(ps_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 units: tie, to even 2 */
    PS_CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* smallest normal */
    PS_CHECK_EQ_INT(ps_f32_to_f16(1.0f), 0x3c00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(-2.0f), 0xc000);
    PS_CHECK_EQ_INT(ps_f32_to_f16(0.1f), 0x2e66);
    /* NaN stays NaN of the same sign; a payload below f16 precision becomes quiet */
    PS_CHECK_EQ_INT(ps_f32_to_f16(float_of(0x7fc00000)), 0x7e00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(float_of(0xff800001)), 0xfe00);
    PS_CHECK_EQ_INT(ps_f32_to_f16(float_of(0x7f802000)), 0x7c01);
#if defined(__FLT16_MAX__)
    /* and against the compiler's _Float16 conversion on a sweep of f32 bit patterns */
    int bad_cc = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = float_of((uint32_t)u);
        if (isnan(f)) continue;
        _Float16 g = (_Float16)f;
        uint16_t gb;
        memcpy(&gb, &g, 2);
        bad_cc += ps_f32_to_f16(f) != gb;
    }
    PS_CHECK_EQ_INT(bad_cc, 0);
#endif
}

static void test_bf16(void) {
    PS_CHECK_EQ_INT(ps_f32_to_bf16(1.0f), 0x3f80);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(-2.0f), 0xc000);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x3f808000)), 0x3f80); /* tie, to even */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x3f818000)), 0x3f82); /* tie, to even */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x3f808001)), 0x3f81); /* above the tie */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x3f807fff)), 0x3f80); /* below the tie */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x7f7fffff)), 0x7f80); /* FLT_MAX rounds to inf */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(INFINITY), 0x7f80);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(-INFINITY), 0xff80);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x00008000)), 0x0000); /* subnormal tie */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x80018000)), 0x8002);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x7f800001)), 0x7fc0); /* signalling -> quiet */
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0xffc00000)), 0xffc0);
    PS_CHECK_EQ_INT(ps_f32_to_bf16(float_of(0x7fa5ffff)), 0x7fe5); /* payload kept, not rounded */
    PS_CHECK(bits_of(ps_bf16_to_f32(0x3f80)) == 0x3f800000);
    PS_CHECK(bits_of(ps_bf16_to_f32(0xff81)) == 0xff810000); /* NaN preserved as is */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ps_bf16_to_f32((ps_bf16)h);
        bad += bits_of(f) != h << 16;
        ps_bf16 back = ps_f32_to_bf16(f);
        if (isnan(f))
            bad += back != (h | 0x0040); /* made quiet, otherwise unchanged */
        else
            bad += back != h;
    }
    PS_CHECK_EQ_INT(bad, 0);
}

/* Hand-built blocks ------------------------------------------------------------------ */

static void test_known_blocks(void) {
    float y[256];
    ps_block_q4_0 b40 = {.d = 0x3c00}; /* d = 1 */
    for (int j = 0; j < 16; j++) b40.qs[j] = (uint8_t)(j | (15 - j) << 4);
    PS_CHECK_OK(ps_dequantize_row(PS_TYPE_Q4_0, &b40, y, 32));
    for (int j = 0; j < 16; j++) {
        PS_CHECK(y[j] == (float)(j - 8));
        PS_CHECK(y[j + 16] == (float)(7 - j));
    }

    ps_block_q5_1 b51 = {.d = 0x4000, .m = 0xbc00, .qh = {0x01, 0x00, 0x00, 0x80}}; /* d 2, m -1 */
    memset(b51.qs, 0x00, sizeof b51.qs);
    PS_CHECK_OK(ps_dequantize_row(PS_TYPE_Q5_1, &b51, y, 32));
    PS_CHECK(y[0] == 2.0f * 16 - 1 && y[1] == -1.0f && y[31] == 2.0f * 16 - 1 && y[30] == -1.0f);

    /* q4_K: scales sc[s] = s + 1, mins m[s] = 2 s (s 4..7 use the split high bits), q = 1
     * everywhere but the first element of each sub-block, which is 15 */
    ps_block_q4_K bk = {.d = 0x3c00, .dmin = 0x3800}; /* d 1, dmin 0.5 */
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)(s == 7 ? 63 : s + 1);
        m[s] = (uint8_t)(2 * s + (s >= 4 ? 40 : 0));
    }
    for (int j = 0; j < 4; j++) {
        bk.scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        bk.scales[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        bk.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    memset(bk.qs, 0x11, sizeof bk.qs);
    for (int g = 0; g < 4; g++) bk.qs[32 * g] = 0xff;
    PS_CHECK_OK(ps_dequantize_row(PS_TYPE_Q4_K, &bk, y, 256));
    for (int s = 0; s < 8; s++) {
        PS_CHECK(y[32 * s] == (float)(15 * sc[s]) - 0.5f * (float)m[s]);
        PS_CHECK(y[32 * s + 5] == (float)sc[s] - 0.5f * (float)m[s]);
    }

    /* q6_K: scale s = s - 8, d 1, element e has q = (e % 64) */
    ps_block_q6_K b6 = {.d = 0x3c00};
    for (int s = 0; s < 16; s++) b6.scales[s] = (int8_t)(s - 8);
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            int q[4] = {l % 64, (l + 32) % 64, (l + 64) % 64, (l + 96) % 64};
            b6.ql[64 * h + l] = (uint8_t)((q[0] & 15) | (q[2] & 15) << 4);
            b6.ql[64 * h + l + 32] = (uint8_t)((q[1] & 15) | (q[3] & 15) << 4);
            b6.qh[32 * h + l] = (uint8_t)(q[0] >> 4 | (q[1] >> 4) << 2 | (q[2] >> 4) << 4 | (q[3] >> 4) << 6);
        }
    }
    PS_CHECK_OK(ps_dequantize_row(PS_TYPE_Q6_K, &b6, y, 256));
    int bad = 0;
    for (int e = 0; e < 256; e++) bad += y[e] != (float)((e / 16 - 8) * (e % 64 - 32));
    PS_CHECK_EQ_INT(bad, 0);
}

/* Quantize -> dequantize -------------------------------------------------------------- */

#define N_ROW 4096

/* Relative RMS error bounds on N(0, 1) data and on N(3, 1) data (all-positive-ish,
 * where a minimum helps): about 1.25 x what the quantizers reach. */
static const struct {
    ps_type t;
    double gauss, shifted;
} bounds[] = {
    {PS_TYPE_F32, 0.0, 0.0},       {PS_TYPE_F16, 0.0004, 0.0004}, {PS_TYPE_BF16, 0.003, 0.003},
    {PS_TYPE_Q4_0, 0.11, 0.072},   {PS_TYPE_Q4_1, 0.10, 0.031},   {PS_TYPE_Q5_0, 0.053, 0.036},
    {PS_TYPE_Q5_1, 0.047, 0.016},  {PS_TYPE_Q8_0, 0.007, 0.0046}, {PS_TYPE_Q8_1, 0.007, 0.0046},
    {PS_TYPE_Q4_K, 0.09, 0.035},   {PS_TYPE_Q5_K, 0.044, 0.017},  {PS_TYPE_Q6_K, 0.022, 0.015},
    {PS_TYPE_Q8_K, 0.009, 0.0055},
};

static double rel_rms(const float *x, const float *y, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_roundtrip(void) {
    static float x[N_ROW], y[N_ROW];
    static uint8_t q[N_ROW * 4 + 64];
    for (size_t k = 0; k < PS_ARRAY_LEN(bounds); k++) {
        ps_type t = bounds[k].t;
        for (int shifted = 0; shifted < 2; shifted++) {
            for (int i = 0; i < N_ROW; i++) x[i] = rng_gauss() + (shifted ? 3.0f : 0.0f);
            PS_CHECK_OK(ps_quantize_row(t, x, q, N_ROW));
            PS_CHECK_OK(ps_dequantize_row(t, q, y, N_ROW));
            double err = rel_rms(x, y, N_ROW), bound = shifted ? bounds[k].shifted : bounds[k].gauss;
            printf("  %-5s %s relative RMS error %.5f (bound %.4f)\n", ps_type_name(t), shifted ? "N(3,1)" : "N(0,1)",
                   err, bound);
            PS_CHECK(err <= bound);
        }
        /* a zero row gives zeros; a constant row comes back close */
        memset(x, 0, sizeof x);
        PS_CHECK_OK(ps_quantize_row(t, x, q, N_ROW));
        PS_CHECK_OK(ps_dequantize_row(t, q, y, N_ROW));
        int nonzero = 0;
        for (int i = 0; i < N_ROW; i++) nonzero += y[i] != 0.0f;
        PS_CHECK_EQ_INT(nonzero, 0);
        for (int i = 0; i < N_ROW; i++) x[i] = -0.75f;
        PS_CHECK_OK(ps_quantize_row(t, x, q, N_ROW));
        PS_CHECK_OK(ps_dequantize_row(t, q, y, N_ROW));
        PS_CHECK(rel_rms(x, y, N_ROW) <= bounds[k].shifted);
        /* tiny and large magnitudes stay finite and roughly right */
        for (int i = 0; i < N_ROW; i++) x[i] = rng_gauss() * (i < N_ROW / 2 ? 1e-3f : 1e3f);
        PS_CHECK_OK(ps_quantize_row(t, x, q, N_ROW));
        PS_CHECK_OK(ps_dequantize_row(t, q, y, N_ROW));
        PS_CHECK(rel_rms(x, y, N_ROW / 2) <= bounds[k].gauss * 1.5);
        PS_CHECK(rel_rms(x + N_ROW / 2, y + N_ROW / 2, N_ROW / 2) <= bounds[k].gauss * 1.5);
    }
}

/* Extra fields: q8_1's s = d * sum(q), q8_K's bsums. */
static void test_sums(void) {
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = rng_gauss();
    ps_block_q8_1 b1[8];
    PS_CHECK_OK(ps_quantize_row(PS_TYPE_Q8_1, x, b1, 256));
    for (int i = 0; i < 8; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += b1[i].qs[j];
        /* s was computed from the unrounded d: close to, not equal to, sum * stored d */
        PS_CHECK(fabsf(ps_f16_to_f32(b1[i].s) - (float)sum * ps_f16_to_f32(b1[i].d)) <=
                 1e-3f * fabsf((float)sum * ps_f16_to_f32(b1[i].d)) + 1e-3f);
    }
    ps_block_q8_K bk;
    PS_CHECK_OK(ps_quantize_row(PS_TYPE_Q8_K, x, &bk, 256));
    for (int k = 0; k < 16; k++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += bk.qs[16 * k + l];
        PS_CHECK_EQ_INT(bk.bsums[k], sum);
    }
}

/* Rows at odd addresses (GGUF tensors need not be aligned for the f16 fields): the same
 * values, and no misaligned access under UBSan. */
static void test_unaligned(void) {
    static float x[512], y[512], y2[512];
    static uint8_t q[4096], q2[4096 + 1];
    for (int i = 0; i < 512; i++) x[i] = rng_gauss();
    for (size_t k = 0; k < PS_ARRAY_LEN(supported); k++) {
        ps_type t = supported[k].t;
        size_t bytes = ps_row_bytes(t, 512);
        PS_CHECK_OK(ps_quantize_row(t, x, q, 512));
        PS_CHECK_OK(ps_quantize_row(t, x, q2 + 1, 512));
        PS_CHECK(memcmp(q, q2 + 1, bytes) == 0);
        PS_CHECK_OK(ps_dequantize_row(t, q, y, 512));
        PS_CHECK_OK(ps_dequantize_row(t, q2 + 1, y2, 512));
        PS_CHECK(memcmp(y, y2, sizeof y) == 0);
    }
}

static void test_rejects(void) {
    float x[64] = {0}, y[64];
    uint8_t q[512] = {0};
    PS_CHECK_EQ_INT(ps_dequantize_row((ps_type)16, q, y, 256), PS_ERR_UNSUPPORTED); /* IQ2_XXS */
    PS_CHECK_EQ_INT(ps_quantize_row(PS_TYPE_Q2_K, x, q, 256), PS_ERR_UNSUPPORTED);
    PS_CHECK_EQ_INT(ps_dequantize_row((ps_type)4, q, y, 32), PS_ERR_ARG); /* unknown */
    PS_CHECK_EQ_INT(ps_dequantize_row((ps_type)1000, q, y, 32), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_dequantize_row(PS_TYPE_Q4_0, q, y, 33), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_quantize_row(PS_TYPE_Q4_K, x, q, 64), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_dequantize_row(PS_TYPE_F32, q, y, -1), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_dequantize_row(PS_TYPE_F32, NULL, y, 4), PS_ERR_ARG);
    PS_CHECK_EQ_INT(ps_quantize_row(PS_TYPE_F32, x, NULL, 4), PS_ERR_ARG);
    PS_CHECK_OK(ps_dequantize_row(PS_TYPE_Q4_0, NULL, NULL, 0));
    PS_CHECK_EQ_INT(ps_dequantize_row(PS_TYPE_F32, q, y, INT64_MAX), PS_ERR_RANGE); /* bytes overflow */
}

int main(void) {
    test_table();
    test_names();
    test_row_bytes();
    test_f16_exhaustive();
    test_f16_rounding();
    test_bf16();
    test_known_blocks();
    test_roundtrip();
    test_sums();
    test_unaligned();
    test_rejects();
    return ps_test_done();
}
