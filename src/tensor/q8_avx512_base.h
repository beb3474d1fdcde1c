/* q8_avx512_base.h - part of q8_avx512.h (its design comment, macros and table), included
 * only there, first: shared helpers (u8 x s8 dots, prefetches, the fixed horizontal sum,
 * the per-type constant vectors) and the activations of the 32-element types (groups of
 * 16 blocks, transposed). */

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
    __m512i qs;         /* vpermt2b index: the quants of 4 (nibble types) or 2 (q8_0) blocks */
    __m512i d, m;       /* vpermt2w indices of the scales and minimums (q4_0, q4_1) */
    __m512i hd, hm, hq; /* vpermt2w indices of scale, minimum and fifth bits from (L0, L1) (q5_0, q5_1) */
    __m512i bits[8];    /* vpshufbitqmb controls picking the fifth bits of each step (q5_0, q5_1) */
} kctx;

// Activations of the 32-element types: groups of 16 blocks, transposed

/* Per group: int8 x[8][16][4] (vector j, lane m), int32 corr[16], float dx[16], float
 * xs[16] (dx * sum(q), for the types with a minimum). */
#define G16_CORR  512
#define G16_DX    576
#define G16_XS    640
#define G16_BYTES 704

/* A partial last group of at most NAT_TAIL_MAX blocks is not padded to 16 blocks: its
 * blocks keep their natural order ("tail blocks": float d, int32 corr, float xs, 4 bytes
 * unused, int8 q[32]) and the kernels take them one at a time in 256-bit vectors. */
#define NAT_TAIL_MAX 6
#define XT_BYTES     48

static size_t g16_bytes(int64_t cols) {
    int64_t nb = cols / PS_QK, rem = nb % 16;
    size_t n = (size_t)(nb / 16) * G16_BYTES + (size_t)(rem == 0              ? 0
                                                        : rem <= NAT_TAIL_MAX ? rem * XT_BYTES
                                                                              : G16_BYTES);
    return (n + 63) & ~(size_t)63;
}

/* Block of lane m in a group: nibble types (a 4x4 transpose of four 4-block loads) and
 * q8_0 (two 4x4 transposes of 2-block loads, then a 128-bit lane shuffle). */
static inline int nib_block(int m) { return 4 * (m % 4) + m / 4; }
static inline int q8_block(int m) { return 8 * (m / 8) + 2 * (m % 4) + (m / 4) % 2; }

/* ps_xq_round of 16 lanes: nearest-even(v * id) clamped to [-127, 127], 0 where the product
 * is NaN (a NaN or infinite activation). The quants' sums (corr) then match the stored bytes,
 * which the AMX tiles multiply directly. */
KI __m512i quant_lanes(__m512 v, float id) {
    __m512 p = _mm512_mul_ps(v, _mm512_set1_ps(id));
    __m512 c = _mm512_min_ps(_mm512_max_ps(p, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), c);
}

/* Quantizes 32 floats exactly as the ref kernels do: d = max|x| / 127, q = nearest-even
 * (x * (1 / d)). Returns sum(q). */
KI int32_t quant_block32(const float *x, int8_t q[32], float *d_out) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    float amax = _mm512_reduce_max_ps(a);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512i q0 = quant_lanes(v0, id), q1 = quant_lanes(v1, id);
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
