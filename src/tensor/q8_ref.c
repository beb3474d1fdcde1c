/* q8_ref.c - scalar reference 8-bit-activation kernels of ps_matmul (q8_kern.h): the
 * definition every SIMD family is tested against, and the kernels of CPUs without one.
 *
 * Per weight block the integer part of the dot product is exact; the float part is
 * sum += (dw * dx) * isum (plus the type's minimum term), block after block. */
#include <math.h>
#include <string.h>

#include "q8_kern.h"

// Activation quantization (shared with the SIMD families)

float ps_xq_scale(const float *x, int n, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f;
    *d_out = d;
    return d != 0.0f ? 1.0f / d : 0.0f;
}

int8_t ps_xq_round(float v, float id) {
    float r = v * id;
    if (r != r) return 0;
    if (r >= 127.0f) return 127;
    if (r <= -127.0f) return -127;
    return (int8_t)nearbyintf(r);
}

/* Activation rows of the 32-element formats: cols / 32 ps_xq32 blocks. */
static size_t x32_bytes(int64_t cols) {
    size_t n = (size_t)(cols / PS_QK) * sizeof(ps_xq32);
    return (n + 63) & ~(size_t)63;
}

/* One activation row into cols / 32 ps_xq32 blocks (d, q and sum as q8_kern.h says). */
static void quant_x32(const float *x, void *xq, int64_t cols) {
    ps_xq32 *b = xq;
    for (int64_t i = 0; i < cols / PS_QK; i++, x += PS_QK) {
        float id = ps_xq_scale(x, PS_QK, &b[i].d);
        int32_t sum = 0;
        for (int j = 0; j < PS_QK; j++) {
            b[i].qs[j] = ps_xq_round(x[j], id);
            sum += b[i].qs[j];
        }
        b[i].sum = sum;
    }
}

/* Activation rows of the K formats: cols / 256 ps_block_q8_K. */
static size_t x256_bytes(int64_t cols) {
    size_t n = (size_t)(cols / PS_QK_K) * sizeof(ps_block_q8_K);
    return (n + 63) & ~(size_t)63;
}

/* One activation row into cols / 256 ps_block_q8_K (d, q, and bsums over each 16). */
static void quant_x256(const float *x, void *xq, int64_t cols) {
    ps_block_q8_K *b = xq;
    for (int64_t i = 0; i < cols / PS_QK_K; i++, x += PS_QK_K) {
        float id = ps_xq_scale(x, PS_QK_K, &b[i].d);
        for (int j = 0; j < PS_QK_K; j++) b[i].qs[j] = ps_xq_round(x[j], id);
        for (int k = 0; k < PS_QK_K / 16; k++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += b[i].qs[16 * k + l];
            b[i].bsums[k] = (int16_t)sum;
        }
    }
}

/* Bytes of an f32 activation row, rounded up to 64 (the float types read x in place). */
static size_t f32_bytes(int64_t cols) { return ((size_t)cols * sizeof(float) + 63) & ~(size_t)63; }

// Float weights: eight partial sums (element j into sum j % 8), combined pairwise

/* Per type T, dot_T(w, x, cols) is the dot of one weight row of T with one activation row
 * in the format its kernel consumes: f32 for the float types, ps_xq32 blocks for the
 * 32-element types, ps_block_q8_K for the K types. */

/* The eight partial sums added in one fixed tree: (0+4, 2+6), (1+5, 3+7). */
static float reduce8(float s[8]) { return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])); }

static float dot_f32(const void *w, const float *x, int64_t n) {
    const float *a = w;
    float s[8] = {0};
    for (int64_t j = 0; j < n; j++) s[j % 8] += a[j] * x[j];
    return reduce8(s);
}

static float dot_f16(const void *w, const float *x, int64_t n) {
    const ps_f16 *a = w;
    float s[8] = {0};
    for (int64_t j = 0; j < n; j++) s[j % 8] += ps_f16_to_f32(a[j]) * x[j];
    return reduce8(s);
}

static float dot_bf16(const void *w, const float *x, int64_t n) {
    const ps_bf16 *a = w;
    float s[8] = {0};
    for (int64_t j = 0; j < n; j++) s[j % 8] += ps_bf16_to_f32(a[j]) * x[j];
    return reduce8(s);
}

// 32-element formats

/* sum_j q_j * x_j over one block, with q_j = low/high nibble of qs (element j, j + 16). */
static int32_t dot_nibbles(const uint8_t qs[16], const int8_t x[32]) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (qs[j] & 0x0f) * x[j] + (qs[j] >> 4) * x[j + 16];
    return s;
}

/* As dot_nibbles, with the fifth bits of qh (bit j for element j) added as 16. */
static int32_t dot_nibbles5(const uint8_t qs[16], const uint8_t qh[4], const int8_t x[32]) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    int32_t s = dot_nibbles(qs, x);
    for (int j = 0; j < 32; j++) s += (int32_t)((h >> j) & 1) * 16 * x[j];
    return s;
}

static float dot_q4_0(const void *w, const void *xq, int64_t cols) {
    const ps_block_q4_0 *b = w;
    const ps_xq32 *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        int32_t isum = dot_nibbles(b[i].qs, x[i].qs) - 8 * x[i].sum;
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
    }
    return sum;
}

static float dot_q4_1(const void *w, const void *xq, int64_t cols) {
    const ps_block_q4_1 *b = w;
    const ps_xq32 *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        int32_t isum = dot_nibbles(b[i].qs, x[i].qs);
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
        sum += ps_f16_to_f32(b[i].m) * (x[i].d * (float)x[i].sum);
    }
    return sum;
}

static float dot_q5_0(const void *w, const void *xq, int64_t cols) {
    const ps_block_q5_0 *b = w;
    const ps_xq32 *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        int32_t isum = dot_nibbles5(b[i].qs, b[i].qh, x[i].qs) - 16 * x[i].sum;
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
    }
    return sum;
}

static float dot_q5_1(const void *w, const void *xq, int64_t cols) {
    const ps_block_q5_1 *b = w;
    const ps_xq32 *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        int32_t isum = dot_nibbles5(b[i].qs, b[i].qh, x[i].qs);
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
        sum += ps_f16_to_f32(b[i].m) * (x[i].d * (float)x[i].sum);
    }
    return sum;
}

static float dot_q8_0(const void *w, const void *xq, int64_t cols) {
    const ps_block_q8_0 *b = w;
    const ps_xq32 *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK; i++) {
        int32_t isum = 0;
        for (int j = 0; j < PS_QK; j++) isum += b[i].qs[j] * x[i].qs[j];
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
    }
    return sum;
}

// K formats

/* The eight 6-bit scales and minimums of a q4_K / q5_K super-block. */
static void k4_scales(const uint8_t s[PS_K_SCALE_SIZE], int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
}

/* The 256 quants of a q4_K (qh NULL) or q5_K super-block, in element order. */
static void k4_quants(const uint8_t qs[128], const uint8_t *qh, uint8_t q[256]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = qs[32 * g + l] & 0x0f;
            q[64 * g + 32 + l] = qs[32 * g + l] >> 4;
        }
    if (!qh) return;
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) q[32 * s + l] |= (uint8_t)(((qh[l] >> s) & 1) << 4);
}

/* One q4_K / q5_K super-block against a q8_K one: d dx sum_s sc_s (q.x)_s - dmin dx sum_s m_s bsum_s. */
static float k4_block(ps_f16 d, ps_f16 dmin, const uint8_t scales[12], const uint8_t q[256], const ps_block_q8_K *x) {
    int sc[8], m[8];
    k4_scales(scales, sc, m);
    int32_t isum = 0, imin = 0;
    for (int s = 0; s < 8; s++) {
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) dot += q[32 * s + l] * x->qs[32 * s + l];
        isum += sc[s] * dot;
        imin += m[s] * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
    }
    return (ps_f16_to_f32(d) * x->d) * (float)isum - (ps_f16_to_f32(dmin) * x->d) * (float)imin;
}

static float dot_q4_K(const void *w, const void *xq, int64_t cols) {
    const ps_block_q4_K *b = w;
    const ps_block_q8_K *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK_K; i++) {
        uint8_t q[256];
        k4_quants(b[i].qs, NULL, q);
        sum += k4_block(b[i].d, b[i].dmin, b[i].scales, q, &x[i]);
    }
    return sum;
}

static float dot_q5_K(const void *w, const void *xq, int64_t cols) {
    const ps_block_q5_K *b = w;
    const ps_block_q8_K *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK_K; i++) {
        uint8_t q[256];
        k4_quants(b[i].qs, b[i].qh, q);
        sum += k4_block(b[i].d, b[i].dmin, b[i].scales, q, &x[i]);
    }
    return sum;
}

/* The 256 six-bit quants of a q6_K super-block (0..63), in element order. */
static void k6_quants(const ps_block_q6_K *b, int8_t q[256]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *qq = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            qq[l] = (int8_t)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4);
            qq[l + 32] = (int8_t)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4);
            qq[l + 64] = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
            qq[l + 96] = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
    }
}

static float dot_q6_K(const void *w, const void *xq, int64_t cols) {
    const ps_block_q6_K *b = w;
    const ps_block_q8_K *x = xq;
    float sum = 0.0f;
    for (int64_t i = 0; i < cols / PS_QK_K; i++) {
        int8_t q[256];
        k6_quants(&b[i], q);
        int32_t isum = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) dot += (q[16 * s + l] - 32) * x[i].qs[16 * s + l];
            isum += b[i].scales[s] * dot;
        }
        sum += (ps_f16_to_f32(b[i].d) * x[i].d) * (float)isum;
    }
    return sum;
}

// Tables

/* Every (row, token) pair through one dot function: trivially batch-invariant. */
#define REF_GEMM(name, dot)                                                                                            \
    static void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y,          \
                            int64_t ys, int64_t nr, int64_t nt) {                                                      \
        for (int64_t r = 0; r < nr; r++)                                                                               \
            for (int64_t t = 0; t < nt; t++) y[t * ys + r] = dot(w + r * wb, (const void *)(x + t * xs), cols);        \
    }

REF_GEMM(f32, dot_f32)
REF_GEMM(f16, dot_f16)
REF_GEMM(bf16, dot_bf16)
REF_GEMM(q4_0, dot_q4_0)
REF_GEMM(q4_1, dot_q4_1)
REF_GEMM(q5_0, dot_q5_0)
REF_GEMM(q5_1, dot_q5_1)
REF_GEMM(q8_0, dot_q8_0)
REF_GEMM(q4_K, dot_q4_K)
REF_GEMM(q5_K, dot_q5_K)
REF_GEMM(q6_K, dot_q6_K)

/* The family's kernels by ps_type (q8_kern.h): one row per type. */
const ps_q8_kern ps_q8_ref_kerns[PS_TYPE_COUNT] = {
    [PS_TYPE_F32] = {NULL, f32_bytes, gemm_f32, 1, 1},
    [PS_TYPE_F16] = {NULL, f32_bytes, gemm_f16, 1, 1},
    [PS_TYPE_BF16] = {NULL, f32_bytes, gemm_bf16, 1, 1},
    [PS_TYPE_Q4_0] = {quant_x32, x32_bytes, gemm_q4_0, 1, 1},
    [PS_TYPE_Q4_1] = {quant_x32, x32_bytes, gemm_q4_1, 1, 1},
    [PS_TYPE_Q5_0] = {quant_x32, x32_bytes, gemm_q5_0, 1, 1},
    [PS_TYPE_Q5_1] = {quant_x32, x32_bytes, gemm_q5_1, 1, 1},
    [PS_TYPE_Q8_0] = {quant_x32, x32_bytes, gemm_q8_0, 1, 1},
    [PS_TYPE_Q4_K] = {quant_x256, x256_bytes, gemm_q4_K, 1, 1},
    [PS_TYPE_Q5_K] = {quant_x256, x256_bytes, gemm_q5_K, 1, 1},
    [PS_TYPE_Q6_K] = {quant_x256, x256_bytes, gemm_q6_K, 1, 1},
};
