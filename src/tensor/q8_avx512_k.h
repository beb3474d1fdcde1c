/* q8_avx512_k.h - part of q8_avx512.h, included only there, after q8_avx512_q32.h: the
 * K types (q4_K, q5_K, q6_K; VNNI family only), in groups of 4 super-blocks. */

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
#define K4_DX    1024
#define K4_BS    1088
#define K4_BYTES 1152
#define K6_CORR  1024
#define K6_DX    1280
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
        __m512i v = quant_lanes(_mm512_loadu_ps(x + i), id);
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
 * sc[2k], sc[2k + 1] as floats (scl, sch), (m[2k], m[2k + 1]) as an int16 pair, d, dmin. */
typedef struct {
    __m512 scl, sch;
    __m512i mins;
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
    __m512i hi =
        _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(e, _mm512_set1_epi32(4 << 16)), _mm512_set1_epi8(0x0f)),
                        _mm512_and_si512(_mm512_srli_epi16(f, 2), _mm512_set1_epi8(0x30)));
    __m512i r = _mm512_mask_blend_epi32(0xff00, lo, hi); /* bytes sc0, sc1, m0, m1 */
    ks.scl = _mm512_cvtepi32_ps(_mm512_and_si512(r, _mm512_set1_epi32(0xff)));
    ks.sch = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(r, 8), _mm512_set1_epi32(0xff)));
    __m512i t = _mm512_srli_epi32(r, 16);
    ks.mins = _mm512_or_si512(_mm512_and_si512(t, _mm512_set1_epi32(0xff)),
                              _mm512_slli_epi32(_mm512_and_si512(t, _mm512_set1_epi32(0xff00)), 8));
    return ks;
}

/* One q4_K / q5_K group for a 1 x T tile (R must be 1):
 *     lo = sum_c dpbusd(sub-block 2k quants, x_c), hi likewise for 2k + 1 (exact ints)
 *     a = lo * sc[2k] + hi * sc[2k + 1]  (in floats, exact: |a| <= 2 * 32 * 31 * 127 * 63 < 2^24)
 *     i = m[2k] bs[2k] + m[2k + 1] bs[2k + 1]
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
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) lo[r][t] = hi[r][t] = _mm512_setzero_si512();
    }
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
            __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[r][t]), ks[r].sch,
                                       _mm512_mul_ps(_mm512_cvtepi32_ps(lo[r][t]), ks[r].scl));
            __m512i i = _mm512_madd_epi16(ks[r].mins, bs);
            __m512 f = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), ks[r].dmin, _mm512_mul_ps(a, ks[r].d));
            facc[r][t] = _mm512_fmadd_ps(f, dx, facc[r][t]);
        }
    }
}

/* The K types pad their last group: their tail functions never run. */
#define NO_TAIL(name)                                                                                                  \
    KI void name##_tail(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int rem,               \
                        __m256 tacc[RMAX][TMAX]) {                                                                     \
        (void)R, (void)T, (void)w, (void)wb, (void)x, (void)xs, (void)rem, (void)tacc;                                 \
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
#define DEF_TILES_R1T6(name)                                                                                           \
    DEF_TILE(name, 1, 1)                                                                                               \
    DEF_TILE(name, 1, 2)                                                                                               \
    DEF_TILE(name, 1, 3)                                                                                               \
    DEF_TILE(name, 1, 4)                                                                                               \
    DEF_TILE(name, 1, 5)                                                                                               \
    DEF_TILE(name, 1, 6)                                                                                               \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3,                         \
                                            name##_tile_1x4, name##_tile_1x5, name##_tile_1x6};

/* Tiles of 1 row x up to 4 tokens. */
#define DEF_TILES_R1T4(name)                                                                                           \
    DEF_TILE(name, 1, 1)                                                                                               \
    DEF_TILE(name, 1, 2)                                                                                               \
    DEF_TILE(name, 1, 3)                                                                                               \
    DEF_TILE(name, 1, 4)                                                                                               \
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
            a[t] = _mm512_add_epi32(
                a[t], _mm512_add_epi32(_mm512_mullo_epi32(acc[0][t], s0), _mm512_mullo_epi32(acc[1][t], s1)));
    }
    UNROLL
    for (int t = 0; t < T; t++)
        facc[0][t] =
            _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(x + t * xs + K6_DX)), _mm512_cvtepi32_ps(a[t]), facc[0][t]);
}

enum { q6_K_NAT = 0, q6_K_BE = PS_QK_K, q6_K_BB = 210, q6_K_BPG = 4, q6_K_WG = 840, q6_K_XG = K6_BYTES };
DEF_TILES_R1T4(q6_K)
DEF_GEMM(q6_K, 1, 4, k6_ctx)

#endif
