/* q8_avx512_amx.h - part of q8_avx512.h, included only there (HAVE_AMX): prompts of q8_0,
 * q4_0, q4_K, q5_K and q6_K weights on AMX tiles (Sapphire Rapids and later), with the very bits of
 * the avx512vnni kernels (the family avx512amx; its other types fall back to avx512vnni).
 *
 * The vnni kernel of the 32-element types (q8_avx512_q32.h) gives lane m of a (row, token)
 * accumulator the blocks lane_block(m) + 16g of group g, in order of g:
 *     facc[m] = fma(dw * dx, float(isum), facc[m])
 * then adds the natural tail's 8 lanes (add_tail) and sums the 16 lanes (hsum16). Here the
 * integer sums isum come from TDPBSSD, 16 rows x 16 tokens x one block a product (exact, as
 * vpdpbusd's), and the float step runs across tokens instead of lanes: for a tile of 16
 * rows x 16 tokens, lane m of every pair is one register a row (16 tokens wide) while the
 * groups are walked, with the same multiply and fused multiply-add per (row, token, block);
 * then the natural tail is added lane by lane, and hsum16's tree (halves, quarters, pairs)
 * is made with whole registers. Every (row, token) therefore runs the vnni kernel's float
 * operations in its order, whatever path its tile takes: batch invariance holds across the
 * two, and decode (one token, vnni) matches prefill (AMX). The K types (q8_avx512_k.h's
 * k4_group, q6_K_group) are made the same way, below.
 *
 * Operands: A = 16 weight rows x one block's 32 quants, loaded in place from q8_0's rows
 * (34-byte blocks, stride wb) or unpacked once a row tile (q4_0, the K types); B = the
 * block's quants of 16 tokens in the 4-byte quads TDPBSSD reads, re-laid once per matmul
 * (q8_kern.h's tiles: a 16 x 16 dword transpose per group and quad). Rows beyond tiles of 16
 * take the vnni kernel, and so do tokens past them unless 13 or more (a padded tile). Why
 * this speed and not more: docs/bench/2026-12-05-amx.md (the float step per block is the
 * floor). */

#define KA  static inline __attribute__((always_inline, target(TGT ",amx-tile,amx-int8")))
#define KAF static __attribute__((target(TGT ",amx-tile,amx-int8")))

/* A tile's re-laid activations, per group: 16 B operands (lane m: 8 quads x 16 tokens x 4
 * bytes), then dx (lane m: 16 tokens' block scales). */
#define AMX_B_BYTES  512
#define AMX_G_BYTES  (16 * AMX_B_BYTES + 16 * 64)
#define AMX_DX(g, m) ((size_t)(g)*AMX_G_BYTES + 16 * AMX_B_BYTES + 64 * (size_t)(m))

/* Groups that go through the tiles: the whole ones and a zero-padded partial last one; *nat:
 * the blocks of a natural tail (at most NAT_TAIL_MAX), done as the vnni kernel's tail_blocks
 * does them, 16 tokens at a time. */
static int64_t amx_groups(int64_t cols, int *nat) {
    int64_t nb = cols / PS_QK, rem = nb % 16;
    *nat = rem && rem <= NAT_TAIL_MAX ? (int)rem : 0;
    return nb / 16 + (rem > NAT_TAIL_MAX);
}

/* After the groups, per natural tail block: its 8 quads across the 16 tokens (a row of 64
 * bytes each), then dx and corr across them. */
#define AMX_T_BYTES (10 * 64)

static size_t amx_tiles_bytes(int64_t cols) { /* 0 (no tiles: vnni) for rows shorter than a group */
    int nat;
    int64_t ng = amx_groups(cols, &nat);
    return ng ? (size_t)ng * AMX_G_BYTES + (size_t)nat * AMX_T_BYTES : 0;
}

/* Transposes a 16 x 16 matrix of 32-bit values: v[i] lane j becomes v[j] lane i. */
KI void transpose16(__m512i v[16]) {
    __m512i t[16], u[16];
    UNROLL
    for (int i = 0; i < 16; i += 2) { /* per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3) */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    UNROLL
    for (int i = 0; i < 16; i += 4) { /* u[i + k] lane c: column 4c + k of rows i..i + 3 */
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    UNROLL
    for (int k = 0; k < 4; k++) { /* gather the four row quads' 128-bit pieces of each column */
        __m512i x0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), x1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
        __m512i y0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        __m512i y1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
        v[k] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        v[4 + k] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        v[8 + k] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
        v[12 + k] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
}

/* The dwords `lanes` of the 64 bytes at off of the n <= 16 rows at x (zeros elsewhere),
 * transposed: v[j] lane t = dword j of row t. */
KI void rows_transposed(const uint8_t *x, size_t xs, int n, size_t off, __mmask16 lanes, __m512i v[16]) {
    UNROLL
    for (int t = 0; t < 16; t++) v[t] = _mm512_maskz_loadu_epi32(t < n ? lanes : 0, x + t * xs + off);
    transpose16(v);
}

/* The re-laid activations of 16 tokens (q8_kern.h's tiles): per group, each of the 8 quad
 * vectors and dx transposed from (token, lane) to (lane, token). */
KF void amx_relay(const uint8_t *x, size_t xs, int n, int64_t cols, uint8_t *xt) {
    int nat;
    int64_t ng = amx_groups(cols, &nat);
    for (int64_t g = 0; g < ng; g++) {
        uint8_t *G = xt + g * AMX_G_BYTES;
        for (int j = 0; j <= 8; j++) { /* quads 0-7, then dx */
            __m512i v[16];
            rows_transposed(x, xs, n, (size_t)g * G16_BYTES + (j < 8 ? 64 * (size_t)j : G16_DX), 0xffff, v);
            UNROLL
            for (int m = 0; m < 16; m++)
                _mm512_storeu_si512(j < 8 ? G + m * AMX_B_BYTES + 64 * j : xt + AMX_DX(g, m), v[m]);
        }
    }
    for (int b = 0; b < nat; b++) { /* a tail block's 48 bytes: d, corr, xs, 4 unused, q[32] */
        uint8_t *T = xt + ng * AMX_G_BYTES + (size_t)b * AMX_T_BYTES;
        __m512i v[16]; /* v[j]: dword j of the 16 tokens */
        rows_transposed(x, xs, n, (size_t)ng * G16_BYTES + (size_t)b * XT_BYTES, 0x0fff, v);
        UNROLL
        for (int l = 0; l < 8; l++) _mm512_storeu_si512(T + 64 * l, v[4 + l]);
        _mm512_storeu_si512(T + 8 * 64, v[0]);
        _mm512_storeu_si512(T + 9 * 64, v[1]);
    }
}

/* Tile registers, two sets: 0 and 3 = A (16 rows x one block's 32 quants, or 16), 1 and 4 =
 * B (8 quads x 16 tokens, or 4), 2 and 5 = C (16 rows x 16 tokens of int32 sums). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

KA void amx_config(int kbytes) { /* quants a product: 32, or 16 (q6_K's sub-blocks) */
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 6; i += 3) {
        c.rows[i] = 16, c.colsb[i] = (uint16_t)kbytes;
        c.rows[i + 1] = (uint8_t)(kbytes / 4), c.colsb[i + 1] = 64;
        c.rows[i + 2] = 16, c.colsb[i + 2] = 64;
    }
    _tile_loadconfig(&c);
}

/* One block's products, 16 rows (A at a, a_row apart) x 16 tokens (B at bop), stored to c:
 * tile set 0 (tiles 0-2) or 1 (3-5), so that two blocks may be in flight. */
#define AMX_BLOCK(set, A, B, C)                                                                                        \
    KA void amx_block##set(const uint8_t *a, size_t a_row, const uint8_t *bop, int32_t c[16][16]) {                    \
        _tile_loadd(A, a, (long)a_row);                                                                                \
        _tile_loadd(B, bop, 64);                                                                                       \
        _tile_zero(C);                                                                                                 \
        _tile_dpbssd(C, A, B);                                                                                         \
        _tile_stored(C, c, 64);                                                                                        \
    }
AMX_BLOCK(0, 0, 1, 2)
AMX_BLOCK(1, 3, 4, 5)

/* Block k's products into C[k % 3], through tile set k % 2. */
KA void amx_issue(int64_t k, const uint8_t *a, size_t a_row, const uint8_t *bop, int32_t c[3][16][16]) {
    if (k % 2)
        amx_block1(a, a_row, bop, c[k % 3]);
    else
        amx_block0(a, a_row, bop, c[k % 3]);
}

/* dw[16 b + r]: the scale of block b of row r (16 rows; blocks of bsize bytes that start
 * with it), for the nbt blocks of the groups that go through the tiles (0 past nb). */
KI void amx_scales(const uint8_t *w, size_t wb, int bsize, int64_t nb, int64_t nbt, float *dw) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)wb));
    for (int64_t b = 0; b < nbt; b++) {
        __m512 d = _mm512_setzero_ps();
        if (b < nb) /* 4 bytes a row from the block's start: the scale and two more */
            d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rows, w + b * bsize, 1)));
        _mm512_store_ps(dw + 16 * b, d);
    }
}

/* q4_0's A operands: the nb blocks of 16 rows as signed quants (q - 8, elements in order),
 * 512 bytes a block (row r at 32 r). Exact: the vnni kernel's corr adds the same -8 sum(x). */
KI void amx_unpack_q4_0(const uint8_t *w, size_t wb, int64_t nb, uint8_t *u) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    for (int64_t b = 0; b < nb; b++) {
        UNROLL
        for (int r = 0; r < 16; r++) {
            __m128i q = _mm_loadu_si128((const __m128i *)(w + r * wb + b * 18 + 2));
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
            v = _mm256_sub_epi8(_mm256_and_si256(v, lo4), eight);
            _mm256_store_si256((__m256i *)(u + 512 * b + 32 * r), v);
        }
    }
}

/* y[t * ys + r] = hsum16 of the 16 lanes F[l][r] (lane t each), by hsum16's tree (halves,
 * quarters, pairs) made with whole registers. */
KI void amx_store_sums(__m512 F[16][16], float *y, int64_t ys) {
    __m512i s[16];
    UNROLL
    for (int r = 0; r < 16; r++) {
        __m512 h[8];
        UNROLL
        for (int l = 0; l < 8; l++) h[l] = _mm512_add_ps(F[l][r], F[l + 8][r]);
        UNROLL
        for (int l = 0; l < 4; l++) h[l] = _mm512_add_ps(h[l], h[l + 4]);
        h[0] = _mm512_add_ps(h[0], h[2]);
        h[1] = _mm512_add_ps(h[1], h[3]);
        s[r] = _mm512_castps_si512(_mm512_add_ps(h[0], h[1]));
    }
    transpose16(s);
    UNROLL
    for (int t = 0; t < 16; t++) _mm512_storeu_ps(y + t * ys, _mm512_castsi512_ps(s[t]));
}

/* The blocks (or units) of a tile in the order of the float steps: lane after lane, group
 * after group, without the padded ones (real[m]: lane m's groups). The products run ahead of
 * the float steps on a cursor of their own. */
typedef struct {
    int m; /* lane; 16 past the last block */
    int64_t g;
    const int64_t *real;
} amx_cursor;

KI amx_cursor amx_first(const int64_t real[16]) {
    amx_cursor c = {0, 0, real};
    while (c.m < 16 && !real[c.m]) c.m++;
    return c;
}

KI void amx_next(amx_cursor *c) {
    if (++c->g == c->real[c->m])
        for (c->g = 0, c->m++; c->m < 16 && !c->real[c->m];) c->m++;
}

/* 16 rows of w against the 16 tokens of xt into
 * y: the vnni kernel's operations per (row, token), made 16 tokens at a time. Block b's A
 * operand is at a + b * a_blk, its rows a_row apart; lane m of a group holds block
 * lane_block(m) (the vnni kernel's order). */
KA void amx_tile(const uint8_t *a, size_t a_row, size_t a_blk, int (*lane_block)(int), int bsize, const uint8_t *w,
                 size_t wb, int64_t nb, int64_t ng, int nat, const float *dw, const uint8_t *xt, float *y, int64_t ys,
                 const uint8_t *pf, int64_t pf_lines) {
    __m512 F[16][16]; /* [lane][row]: the vnni accumulators' lanes, across tokens */
    int32_t C[3][16][16] __attribute__((aligned(64)));
    int64_t real[16]; /* groups whose block of lane m is in the row (the rest are padding) */
    for (int m = 0; m < 16; m++) {
        int64_t b0 = lane_block(m);
        real[m] = b0 >= nb ? 0 : (nb - 1 - b0) / 16 + 1 < ng ? (nb - 1 - b0) / 16 + 1 : ng;
    }
    /* block k's products go to C[k % 3] through tile set k % 2, two blocks ahead of its float
     * step (a stored tile is read back only once it has left the store buffer) */
    amx_cursor is = amx_first(real);
    int64_t k = 0, ki = 0;
    for (; ki < 2 && is.m < 16; ki++, amx_next(&is))
        amx_issue(ki, a + (lane_block(is.m) + 16 * is.g) * a_blk, a_row, xt + is.g * AMX_G_BYTES + is.m * AMX_B_BYTES,
                  C);
    for (int m = 0; m < 16; m++) {
        for (int64_t l = m * pf_lines / 16; l < (m + 1) * pf_lines / 16; l++) /* spread: a burst stalls */
            _mm_prefetch((const char *)pf + 64 * l, _MM_HINT_T1);
        __m512 acc[16];
        UNROLL
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t g = 0, b = lane_block(m); g < real[m]; g++, b += 16, k++) {
            if (is.m < 16) {
                amx_issue(ki++, a + (lane_block(is.m) + 16 * is.g) * a_blk, a_row,
                          xt + is.g * AMX_G_BYTES + is.m * AMX_B_BYTES, C);
                amx_next(&is);
            }
            __m512 dx = _mm512_loadu_ps(xt + AMX_DX(g, m));
            UNROLL
            for (int r = 0; r < 16; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dw[16 * b + r]), dx),
                                         _mm512_cvtepi32_ps(_mm512_load_si512(C[k % 3][r])), acc[r]);
        }
        for (int64_t g = real[m]; g < ng; g++) { /* padded lanes: the vnni kernel adds (0 * 0) * 0 */
            UNROLL
            for (int r = 0; r < 16; r++) acc[r] = _mm512_add_ps(acc[r], _mm512_setzero_ps());
        }
        UNROLL
        for (int r = 0; r < 16; r++) F[m][r] = acc[r];
    }
    /* add_tail: lane l < 8 of the tail (tail_blocks: per block, the dot of quads l of the
     * unsigned weights and x, corr in lane 0, then one multiply-add), across the 16 tokens;
     * lanes 8-15 + 0 */
    const uint8_t *tw = w + nb / 16 * 16 * bsize, *tx = xt + ng * AMX_G_BYTES;
    for (int l = 0; nat && l < 16; l++) {
        UNROLL
        for (int r = 0; r < 16; r++) {
            __m512 tacc = _mm512_setzero_ps();
            for (int b = 0; b < nat && l < 8; b++) {
                const uint8_t *p = tw + r * wb + b * bsize;
                uint32_t q;
                memcpy(&q, p + 2 + 4 * (bsize == 34 ? l : l % 4), 4);
                q = bsize == 34 ? q ^ 0x80808080u : l < 4 ? q & 0x0f0f0f0fu : (q >> 4) & 0x0f0f0f0fu;
                const uint8_t *T = tx + (size_t)b * AMX_T_BYTES;
                __m512i c = l ? _mm512_setzero_si512() : _mm512_loadu_si512(T + 9 * 64);
                __m512i i = _mm512_dpbusd_epi32(c, _mm512_set1_epi32((int)q), _mm512_loadu_si512(T + 64 * l));
                ps_f16 h;
                memcpy(&h, p, 2);
                __m512 dwdx = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_loadu_ps(T + 8 * 64));
                tacc = _mm512_fmadd_ps(dwdx, _mm512_cvtepi32_ps(i), tacc);
            }
            F[l][r] = _mm512_add_ps(F[l][r], tacc);
        }
    }
    amx_store_sums(F, y, ys);
}

// q4_K and q5_K: groups of 4 super-blocks (q8_avx512_k.h's k4_group, 16 tokens wide)

/* k4_group gives lane m (super-block s = m % 4, k = m / 4) of a (row, token) accumulator
 *     lo, hi = the integer dots of sub-blocks 2k and 2k + 1
 *     a = float(hi) * sch + float(lo) * scl;  i = m[2k] bs[2k] + m[2k + 1] bs[2k + 1]
 *     facc += (a * d - float(i) * dmin) * dx
 * Here lo and hi come from two products of 16 rows x 16 tokens x 32 quants (unpacked once a
 * row tile, 5 bits at most: signed products give the same sums), the per-(row, lane)
 * scalars from a table made once a row tile, and the steps are k4_group's. */

/* The K types' re-laid activations per group: lane m's B operands (16 quads of 16 tokens x
 * 4 bytes: q4_K/q5_K's lo 0-7 and hi 8-15; q6_K's four sub-blocks of 4), then dx and the bs
 * pairs (q4_K, q5_K; q6_K leaves them unused) across the tokens. */
#define KT_B(g, m)  ((size_t)(g)*KT_G_BYTES + 1024 * (size_t)(m))
#define KT_DX(g, m) ((size_t)(g)*KT_G_BYTES + 16 * 1024 + 64 * (size_t)(m))
#define KT_BS(g, m) ((size_t)(g)*KT_G_BYTES + 17 * 1024 + 64 * (size_t)(m))
#define KT_G_BYTES  (18 * 1024)

static size_t kt_tiles_bytes(int64_t cols) { return (size_t)((cols / PS_QK_K + 3) / 4) * KT_G_BYTES; }

/* k4 (six 0: quads, dx, bs) or k6 groups (six 1: quads, then dx; corr is not needed, the
 * tiles take q6_K's quants signed) */
KI void k_relay(const uint8_t *x, size_t xs, int n, int64_t cols, uint8_t *xt, int six) {
    int64_t ng = (cols / PS_QK_K + 3) / 4;
    for (int64_t g = 0; g < ng; g++) {
        for (int j = 0; j < (six ? 17 : 18); j++) { /* quads 0-15, dx, bs */
            size_t off = (size_t)g * (six ? K6_BYTES : K4_BYTES) + (six && j == 16 ? K6_DX : 64 * (size_t)j);
            __m512i v[16];
            rows_transposed(x, xs, n, off, 0xffff, v);
            UNROLL
            for (int m = 0; m < 16; m++)
                _mm512_storeu_si512(xt + (j < 16 ? KT_B(g, m) + 64 * j : j == 16 ? KT_DX(g, m) : KT_BS(g, m)), v[m]);
        }
    }
}

KF void k4a_relay(const uint8_t *x, size_t xs, int n, int64_t cols, uint8_t *xt) { k_relay(x, xs, n, cols, xt, 0); }
KF void k6a_relay(const uint8_t *x, size_t xs, int n, int64_t cols, uint8_t *xt) { k_relay(x, xs, n, cols, xt, 1); }

/* A row tile's per-(group, lane, row) scalars: kt[(5 g + f) 256 + 16 m + r] for f = scl, sch,
 * d, dmin (floats) and the mins pair (int16 x 2), from k4_scales_load (a partial last group
 * from a zero-padded copy, as the vnni kernel's). */
KI void k4a_table(const uint8_t *w, size_t wb, int bsize, int64_t nsb, const kctx *cx, float *kt) {
    for (int64_t g = 0; 4 * g < nsb; g++) {
        __m512i v[5][16];
        UNROLL
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = w + r * wb + 4 * g * bsize;
            uint8_t pad[4 * 176];
            if (nsb - 4 * g < 4) {
                memset(pad, 0, sizeof pad);
                memcpy(pad, p, (size_t)(nsb - 4 * g) * bsize);
                p = pad;
            }
            k4_scales ks = k4_scales_load(p, bsize, cx);
            v[0][r] = _mm512_castps_si512(ks.scl), v[1][r] = _mm512_castps_si512(ks.sch);
            v[2][r] = _mm512_castps_si512(ks.d), v[3][r] = _mm512_castps_si512(ks.dmin), v[4][r] = ks.mins;
        }
        for (int f = 0; f < 5; f++) {
            transpose16(v[f]);
            for (int m = 0; m < 16; m++) _mm512_store_si512(kt + (5 * g + f) * 256 + 16 * m, v[f][m]);
        }
    }
}

/* A row tile's A operands: u + ((16 g + m) 2 + h) 512 + 32 r = the 32 quants of sub-block
 * 2k + h of super-block 4g + s, row r (with q5_K's fifth bits); padded super-blocks none. */
KI void k4a_unpack(const uint8_t *w, size_t wb, int five, int64_t nsb, uint8_t *u) {
    const int bsize = five ? 176 : 144, qs_off = five ? 48 : 16;
    const __m256i m0f = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    for (int64_t sb = 0; sb < nsb; sb++) {
        UNROLL
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = w + r * wb + sb * bsize;
            __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(p + qs_off + 32 * k));
                __m256i lo = _mm256_and_si256(v, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                if (five) {
                    __m256i bl = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), one);
                    __m256i bh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k + 1)), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(bl, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(bh, 4));
                }
                uint8_t *o = u + ((16 * (sb / 4) + 4 * k + sb % 4) * 2) * 512 + 32 * r;
                _mm256_store_si256((__m256i *)o, lo);
                _mm256_store_si256((__m256i *)(o + 512), hi);
            }
        }
    }
}

/* Unit k's products into c[k % 2]: lo and hi (q4_K, q5_K) or the four 16-quant sub-blocks
 * (q6_K), through tile sets 0, 1, 0, 1. */
KA void k_issue(int six, int64_t k, const uint8_t *a, const uint8_t *bop, int32_t c[2][4][16][16]) {
    if (!six) {
        amx_block0(a, 32, bop, c[k % 2][0]);
        amx_block1(a + 512, 32, bop + 512, c[k % 2][1]);
        return;
    }
    amx_block0(a, 16, bop, c[k % 2][0]);
    amx_block1(a + 256, 16, bop + 256, c[k % 2][1]);
    amx_block0(a + 512, 16, bop + 512, c[k % 2][2]);
    amx_block1(a + 768, 16, bop + 768, c[k % 2][3]);
}

/* 16 rows (u, kt) of q4_K / q5_K (six 0) or q6_K (six 1) against the 16 tokens of xt into
 * y; as amx_tile, with each unit's products (lane m, group g: lo and hi, or the four
 * sub-blocks) one unit ahead of its float step. */
KA void k_tile(int six, const uint8_t *u, const float *kt, int64_t nsb, const uint8_t *xt, float *y, int64_t ys,
               const uint8_t *pf, int64_t pf_lines) {
    int64_t ng = (nsb + 3) / 4;
    __m512 F[16][16];
    int32_t C[2][4][16][16] __attribute__((aligned(64)));
    int64_t real[16]; /* groups whose super-block of lane m is in the row */
    for (int m = 0; m < 16; m++) real[m] = 4 * (ng - 1) + m % 4 < nsb ? ng : ng - 1;
    amx_cursor is = amx_first(real);
    int64_t k = 0, ki = 0;
    if (is.m < 16) k_issue(six, ki++, u + (16 * is.g + is.m) * 1024, xt + KT_B(is.g, is.m), C), amx_next(&is);
    for (int m = 0; m < 16; m++) {
        for (int64_t l = m * pf_lines / 16; l < (m + 1) * pf_lines / 16; l++)
            _mm_prefetch((const char *)pf + 64 * l, _MM_HINT_T1);
        __m512 acc[16];
        UNROLL
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t g = 0; g < real[m]; g++, k++) {
            if (is.m < 16) k_issue(six, ki++, u + (16 * is.g + is.m) * 1024, xt + KT_B(is.g, is.m), C), amx_next(&is);
            __m512 dx = _mm512_loadu_ps(xt + KT_DX(g, m));
            const float *t = kt + 5 * g * 256 + 16 * m;
            if (six) {
                const int32_t *sc = (const int32_t *)t;
                UNROLL
                for (int r = 0; r < 16; r++) {
                    __m512i a = _mm512_setzero_si512();
                    UNROLL
                    for (int v = 0; v < 4; v++)
                        a = _mm512_add_epi32(a, _mm512_mullo_epi32(_mm512_load_si512(C[k % 2][v][r]),
                                                                   _mm512_set1_epi32(sc[256 * v + r])));
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(t[4 * 256 + r]), dx), _mm512_cvtepi32_ps(a),
                                             acc[r]);
                }
                continue;
            }
            __m512i bs = _mm512_loadu_si512(xt + KT_BS(g, m));
            UNROLL
            for (int r = 0; r < 16; r++) {
                __m512 lo = _mm512_cvtepi32_ps(_mm512_load_si512(C[k % 2][0][r]));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_load_si512(C[k % 2][1][r]));
                __m512 a = _mm512_fmadd_ps(hi, _mm512_set1_ps(t[256 + r]), _mm512_mul_ps(lo, _mm512_set1_ps(t[r])));
                int32_t mins;
                memcpy(&mins, t + 4 * 256 + r, 4);
                __m512i i = _mm512_madd_epi16(_mm512_set1_epi32(mins), bs);
                __m512 f = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(t[3 * 256 + r]),
                                            _mm512_mul_ps(a, _mm512_set1_ps(t[2 * 256 + r])));
                acc[r] = _mm512_fmadd_ps(f, dx, acc[r]);
            }
        }
        for (int64_t g = real[m]; g < ng; g++) { /* padded lanes: the vnni kernel adds 0 */
            UNROLL
            for (int r = 0; r < 16; r++) acc[r] = _mm512_add_ps(acc[r], _mm512_setzero_ps());
        }
        UNROLL
        for (int r = 0; r < 16; r++) F[m][r] = acc[r];
    }
    amx_store_sums(F, y, ys);
}

// q6_K: groups of 4 super-blocks (q8_avx512_k.h's q6_K_group, 16 tokens wide)

/* q6_K_group gives lane m (super-block s = m % 4, k = m / 4) of a (row, token) accumulator
 *     acc_v = the integer dot of sub-block 8h + 4u + k (16 quants - 32), v = 2h + u
 *     facc += (d * dx) * float(sum_v acc_v * scale_v)       (integers exact)
 * Here each acc_v is a product of 16 rows x 16 tokens x 16 quants (signed, unpacked once a
 * row tile), the scales and d come from a table made once a row tile. */

/* A row tile's scalars: kt[(5 g + f) 256 + 16 m + r] for f = scale_0..3 (int32) and d. */
KI void k6a_table(const uint8_t *w, size_t wb, int64_t nsb, const kctx *cx, float *kt) {
    for (int64_t g = 0; 4 * g < nsb; g++) {
        __m512i v[5][16];
        UNROLL
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = w + r * wb + 4 * g * 210;
            uint8_t pad[4 * 210];
            if (nsb - 4 * g < 4) {
                memset(pad, 0, sizeof pad);
                memcpy(pad, p, (size_t)(nsb - 4 * g) * 210);
                p = pad;
            }
            __m512i sc = _mm512_permutexvar_epi8(cx->qs, k_chunks(p, 210, 192));
            v[0][r] = _mm512_cvtepi8_epi32(_mm512_castsi512_si128(sc));
            v[1][r] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 1));
            v[2][r] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 2));
            v[3][r] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 3));
            ps_f16 dh[4];
            UNROLL
            for (int k = 0; k < 4; k++) memcpy(&dh[k], p + 210 * k + 208, 2);
            __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dh));
            v[4][r] = _mm512_castps_si512(_mm512_permutexvar_ps(
                _mm512_set_epi32(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0), _mm512_castps128_ps512(d4)));
        }
        for (int f = 0; f < 5; f++) {
            transpose16(v[f]);
            for (int m = 0; m < 16; m++) _mm512_store_si512(kt + (5 * g + f) * 256 + 16 * m, v[f][m]);
        }
    }
}

/* A row tile's A operands: u + (((16 g + m) 4 + v) 16 + r) 16 = the 16 quants - 32 of
 * sub-block 8h + 4u + k (v = 2h + u) of super-block 4g + s, row r. */
KI void k6a_unpack(const uint8_t *w, size_t wb, int64_t nsb, uint8_t *u) {
    const __m256i m0f = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3), b32 = _mm256_set1_epi8(32);
    for (int64_t sb = 0; sb < nsb; sb++) {
        UNROLL
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = w + r * wb + sb * 210;
            for (int h = 0; h < 2; h++) { /* k6_quants' four runs of 32 elements a half */
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)), q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m0f),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
                for (int e = 0; e < 4; e++) { /* elements 128h + 32e: sub-blocks 8h + 2e, + 1 */
                    __m256i v = _mm256_sub_epi8(q[e], b32);
                    for (int half = 0; half < 2; half++) {
                        int s16 = 8 * h + 2 * e + half, m = 4 * (s16 % 4) + (int)(sb % 4), vv = 2 * h + (s16 / 4) % 2;
                        uint8_t *o = u + (((16 * (sb / 4) + m) * 4 + vv) * 16 + r) * 16;
                        _mm_store_si128((__m128i *)o,
                                        half ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v));
                    }
                }
            }
        }
    }
}

// The gemm of each type

enum { AMX_Q8_0, AMX_Q4_0, AMX_Q4_K, AMX_Q5_K, AMX_Q6_K };
#define AMX_STACK_BYTES (256 * 1024)

/* gemm with the tiles of its whole 16-token tiles at xt: those tokens of whole 16-row tiles
 * on AMX, the other rows and tokens by the vnni kernel (the same bits either way). Per row
 * tile: its block scales (or the K types' table) and unpacked quants once, then the token
 * tiles, while the next row tile's weights are fetched into L2. */
KA void amx_gemm(int type, ps_q8_gemm_fn vnni, const kctx *cx, const uint8_t *w, size_t wb, int64_t cols,
                 const uint8_t *x, size_t xs, const uint8_t *xt, float *y, int64_t ys, int64_t nr, int64_t nt) {
    const int k4 = type >= AMX_Q4_K, bsize = (const int[]){34, 18, 144, 176, 210}[type];
    int nat = 0;
    int64_t nb = k4 ? cols / PS_QK_K : cols / PS_QK, ng = k4 ? (nb + 3) / 4 : amx_groups(cols, &nat);
    /* tiles: the whole ones, and a partial last one of PS_Q8_TILE_MIN tokens or more (padded;
     * its sums go through out) */
    int64_t nr16 = ng ? nr & ~(int64_t)15 : 0, part = nt % 16 >= PS_Q8_TILE_MIN ? nt % 16 : 0;
    int64_t ntt = nt / 16 + (part > 0), done = nt - nt % 16 + part;
    /* a row tile's scale table and unpacked quants: on the stack up to AMX_STACK_BYTES (a
     * 4,096-column K-type row tile takes 84 KiB), else on the heap (without it: vnni) */
    size_t tab_bytes = (size_t)ng * (k4 ? 5 : 1) * 1024, need = tab_bytes + (size_t)ng * 16 * (k4 ? 1024 : 512);
    uint8_t stack[need && need <= AMX_STACK_BYTES ? need : 64] __attribute__((aligned(64)));
    uint8_t *heap = nr16 && ntt && need > AMX_STACK_BYTES ? aligned_alloc(64, need) : NULL;
    if (!ntt || (need > AMX_STACK_BYTES && !heap)) nr16 = 0;
    if (nr16) {
        float *tab = (float *)(heap ? heap : stack);
        uint8_t *u = (heap ? heap : stack) + tab_bytes;
        size_t tb = k4 ? kt_tiles_bytes(cols) : amx_tiles_bytes(cols);
        amx_config(type == AMX_Q6_K ? 16 : PS_QK);
        for (int64_t r = 0; r < nr16; r += 16) {
            const uint8_t *wr = w + r * wb;
            if (type == AMX_Q6_K) {
                k6a_table(wr, wb, nb, cx, tab);
                k6a_unpack(wr, wb, nb, u);
            } else if (k4) {
                k4a_table(wr, wb, bsize, nb, cx, tab);
                k4a_unpack(wr, wb, type == AMX_Q5_K, nb, u);
            } else {
                amx_scales(wr, wb, bsize, nb, 16 * ng, tab);
                if (type == AMX_Q4_0) amx_unpack_q4_0(wr, wb, nb < 16 * ng ? nb : 16 * ng, u); /* not the tail */
            }
            int64_t lines = r + 16 < nr16 ? (int64_t)(16 * wb / 64) : 0;
            for (int64_t t = 0; t < ntt; t++) {
                int64_t l0 = t * lines / ntt, nl = (t + 1) * lines / ntt - l0;
                const uint8_t *pf = wr + 16 * wb + 64 * l0;
                float out[16 * 16], *yt = part && t == ntt - 1 ? out : y + 16 * t * ys + r;
                int64_t yst = yt == out ? 16 : ys;
                if (k4)
                    k_tile(type == AMX_Q6_K, u, tab, nb, xt + t * tb, yt, yst, pf, nl);
                else if (type == AMX_Q8_0)
                    amx_tile(wr + 2, wb, 34, q8_block, bsize, wr, wb, nb, ng, nat, tab, xt + t * tb, yt, yst, pf, nl);
                else
                    amx_tile(u, 32, 512, nib_block, bsize, wr, wb, nb, ng, nat, tab, xt + t * tb, yt, yst, pf, nl);
                for (int64_t i = 0; yt == out && i < part; i++) memcpy(y + (16 * t + i) * ys + r, out + 16 * i, 64);
            }
        }
        _tile_release();
    }
    free(heap);
    if (nr > nr16) vnni(w + nr16 * wb, wb, cols, x, xs, y + nr16, ys, nr - nr16, nt);
    if (nt > done && nr16) vnni(w, wb, cols, x + done * xs, xs, y + done * ys, ys, nr16, nt - done);
}

#define AMX_GEMM(name, type, cx)                                                                                       \
    KAF void gemm_##name##_tiled(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,               \
                                 const uint8_t *xt, float *y, int64_t ys, int64_t nr, int64_t nt) {                    \
        amx_gemm(type, gemm_##name, cx, w, wb, cols, x, xs, xt, y, ys, nr, nt);                                        \
    }
AMX_GEMM(q8_0, AMX_Q8_0, NULL)
AMX_GEMM(q4_0, AMX_Q4_0, NULL)
AMX_GEMM(q4_K, AMX_Q4_K, ctx_once(&q4_K_cx, &q4_K_cx_state, k4_ctx))
AMX_GEMM(q5_K, AMX_Q5_K, ctx_once(&q5_K_cx, &q5_K_cx_state, k4_ctx))
AMX_GEMM(q6_K, AMX_Q6_K, ctx_once(&q6_K_cx, &q6_K_cx_state, k6_ctx))

/* The vnni kernels' tile sizes: they steer matmul.c's plan for fewer than 16 tokens. */
const ps_q8_kern ps_q8_avx512amx_kerns[PS_TYPE_COUNT] = {
    [PS_TYPE_Q4_0] = {quant_nib_off8, g16_bytes, gemm_q4_0, 2, 4, amx_tiles_bytes, amx_relay, gemm_q4_0_tiled},
    [PS_TYPE_Q8_0] = {quant_q8_off128, g16_bytes, gemm_q8_0, 1, 8, amx_tiles_bytes, amx_relay, gemm_q8_0_tiled},
    [PS_TYPE_Q4_K] = {quant_k4, k4_bytes, gemm_q4_K, 1, 6, kt_tiles_bytes, k4a_relay, gemm_q4_K_tiled},
    [PS_TYPE_Q5_K] = {quant_k4, k4_bytes, gemm_q5_K, 1, 6, kt_tiles_bytes, k4a_relay, gemm_q5_K_tiled},
    [PS_TYPE_Q6_K] = {quant_k6, k6_bytes, gemm_q6_K, 1, 4, kt_tiles_bytes, k6a_relay, gemm_q6_K_tiled},
};
