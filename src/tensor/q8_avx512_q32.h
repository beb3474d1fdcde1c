/* q8_avx512_q32.h - part of q8_avx512.h, included only there, after q8_avx512_tile.h:
 * the 32-element block types, nibble weights (q4_0, q4_1, q5_0, q5_1) and q8_0, in groups
 * of 16 blocks. */

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
KI void nib_load(const uint8_t *p, int bsize, int qs_off, const kctx *cx, __m512i P[4], __m512i L0[4], __m512i L1[4]) {
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
                    if (chain)
                        acc2[r][t][chain - 1] = dpbusd(acc2[r][t][chain - 1], v[r], xv);
                    else
                        acc[r][t] = dpbusd(acc[r][t], v[r], xv);
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
    if (bsize == 34)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80));
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
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) tacc[r][t] = _mm256_setzero_ps();
    }
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
                    tacc[r][t] =
                        _mm256_fmadd_ps(_mm256_set1_ps(mw[r]), _mm256_zextps128_ps256(_mm_set_ss(xsum)), tacc[r][t]);
            }
        }
    }
}

#define NIB_TYPE(name, bsize, qs_off, has_min, qh_off)                                                                 \
    enum {                                                                                                             \
        name##_BE = PS_QK,                                                                                             \
        name##_BB = bsize,                                                                                             \
        name##_BPG = 16,                                                                                               \
        name##_WG = 16 * bsize,                                                                                        \
        name##_XG = G16_BYTES,                                                                                         \
        name##_NAT = 1                                                                                                 \
    };                                                                                                                 \
    KI void name##_group(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, const kctx *cx,       \
                         __m512 facc[RMAX][TMAX]) {                                                                    \
        nib_group(R, T, bsize, qs_off, has_min, qh_off, w, wb, x, xs, cx, facc);                                       \
    }                                                                                                                  \
    KI void name##_tail(int R, int T, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int rem,               \
                        __m256 tacc[RMAX][TMAX]) {                                                                     \
        tail_blocks(R, T, bsize, qs_off, qh_off, has_min, w, wb, x, xs, rem, tacc);                                    \
    }                                                                                                                  \
    static void name##_ctx(kctx *cx) { nib_ctx(cx, bsize, qs_off, qh_off); }                                           \
    DEF_TILES_R2T4(name)                                                                                               \
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
                if (split && j % 4)
                    acc2[j % 4 - 1] = dpbusd(acc2[j % 4 - 1], W[r][j], xv);
                else
                    acc[r][t] = dpbusd(acc[r][t], W[r][j], xv);
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
