/* q8_avx512_tile.h - part of q8_avx512.h, included only there, after q8_avx512_base.h:
 * register tiles, the column passes that save and reload their accumulators, and the
 * driver (tile_drive, DEF_GEMM) that covers a block of rows and tokens with them. */

// Tiles and the gemm that covers a block of rows and tokens with them

/* Writes the horizontal sums of an R x T tile. */
KI void store_sums(int R, int T, __m512 facc[RMAX][TMAX], float *y, int64_t ys) {
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) y[t * ys + r] = hsum16(facc[r][t]);
    }
}

/* A tile's share of one pass over the columns: groups [g0, g1) of the row. The first pass
 * starts from zero, the last writes the sums to y; in between, the R x T accumulators wait
 * in acc (16 floats each, 64-byte aligned). Saving and reloading them is exact, so the
 * arithmetic per output is the same however the columns are split into passes. */
typedef struct {
    int64_t g0, g1;
    int first, last;
    int stream; /* the rows stream whole, one after another: prefetched ahead (else the next tile's) */
    float *acc;
} span;

typedef void tile_fn(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, const span *sp, float *y,
                     int64_t ys, const kctx *cx);

KI void facc_begin(int R, int T, const span *sp, __m512 facc[RMAX][TMAX]) {
    UNROLL
    for (int r = 0; r < R; r++) UNROLL
    for (int t = 0; t < T; t++)
        facc[r][t] = sp->first ? _mm512_setzero_ps() : _mm512_load_ps(sp->acc + 16 * (r * T + t));
}

KI void facc_end(int R, int T, const span *sp, __m512 facc[RMAX][TMAX], float *y, int64_t ys) {
    if (sp->last) {
        store_sums(R, T, facc, y, ys);
        return;
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) _mm512_store_ps(sp->acc + 16 * (r * T + t), facc[r][t]);
    }
}

/* Folds the 8 tail lanes into lanes 0-7 of the group accumulators (for every pair of a
 * row with a natural tail, once, after its last group). */
KI void add_tail(int R, int T, __m512 facc[RMAX][TMAX], __m256 tacc[RMAX][TMAX]) {
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_add_ps(facc[r][t], _mm512_zextps256_ps512(tacc[r][t]));
    }
}

/* name_tile_RxT: groups [g0, g1) of R weight rows against T activation rows. A type
 * supplies name_group(R, T, w, wb, x, xs, cx, facc) and the sizes name_BE (elements per
 * block), name_BB (bytes per block), name_BPG (blocks per group), name_WG (= BPG * BB)
 * and name_XG (activation bytes per group). The partial last group runs on a zero-padded
 * copy of the weights (the activations are padded when quantized). */
#define DEF_TILE(name, R, T)                                                                                           \
    KF void name##_tile_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,              \
                                  const span *sp, float *y, int64_t ys, const kctx *cx) {                              \
        __m512 facc[RMAX][TMAX];                                                                                       \
        facc_begin(R, T, sp, facc);                                                                                    \
        int64_t nb = cols / name##_BE, nfull = nb / name##_BPG, rem = nb % name##_BPG;                                 \
        int64_t gend = sp->g1 < nfull ? sp->g1 : nfull;                                                                \
        for (int64_t g = sp->g0; g < gend; g++) {                                                                      \
            if (sp->stream)                                                                                            \
                for (int r = 0; r < R; r++) prefetch_ahead(w + r * wb + g * name##_WG, name##_WG);                     \
            else                                                                                                       \
                prefetch_rows(R, w + R * wb + g * name##_WG, wb, name##_WG);                                           \
            name##_group(R, T, w + g * name##_WG, wb, x + g * name##_XG, xs, cx, facc);                                \
        }                                                                                                              \
        if (rem && sp->g1 > nfull && name##_NAT && rem <= NAT_TAIL_MAX) {                                              \
            __m256 tacc[RMAX][TMAX];                                                                                   \
            if (sp->stream)                                                                                            \
                for (int r = 0; r < R; r++) prefetch_ahead(w + r * wb + nfull * name##_WG, (int)rem * name##_BB);      \
            name##_tail(R, T, w + nfull * name##_WG, wb, x + nfull * name##_XG, xs, (int)rem, tacc);                   \
            add_tail(R, T, facc, tacc);                                                                                \
        } else if (rem && sp->g1 > nfull) {                                                                            \
            uint8_t tail[R][name##_WG] __attribute__((aligned(64)));                                                   \
            if (sp->stream)                                                                                            \
                for (int r = 0; r < R; r++) prefetch_ahead(w + r * wb + nfull * name##_WG, (int)rem * name##_BB);      \
            memset(tail, 0, sizeof tail);                                                                              \
            for (int r = 0; r < R; r++) memcpy(tail[r], w + r * wb + nfull * name##_WG, (size_t)rem * name##_BB);      \
            name##_group(R, T, tail[0], name##_WG, x + nfull * name##_XG, xs, cx, facc);                               \
        }                                                                                                              \
        facc_end(R, T, sp, facc, y, ys);                                                                               \
    }

/* Tiles up to 2 rows x 4 tokens, in a table indexed [R - 1][T - 1]. */
#define DEF_TILES_R2T4(name)                                                                                           \
    DEF_TILE(name, 1, 1)                                                                                               \
    DEF_TILE(name, 1, 2)                                                                                               \
    DEF_TILE(name, 1, 3)                                                                                               \
    DEF_TILE(name, 1, 4)                                                                                               \
    DEF_TILE(name, 2, 1)                                                                                               \
    DEF_TILE(name, 2, 2)                                                                                               \
    DEF_TILE(name, 2, 3)                                                                                               \
    DEF_TILE(name, 2, 4)                                                                                               \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4,        \
                                            name##_tile_2x1, name##_tile_2x2, name##_tile_2x3, name##_tile_2x4};

/* Tiles of 1 row x up to 8 tokens. */
#define DEF_TILES_R1T8(name)                                                                                           \
    DEF_TILE(name, 1, 1)                                                                                               \
    DEF_TILE(name, 1, 2)                                                                                               \
    DEF_TILE(name, 1, 3)                                                                                               \
    DEF_TILE(name, 1, 4)                                                                                               \
    DEF_TILE(name, 1, 5)                                                                                               \
    DEF_TILE(name, 1, 6)                                                                                               \
    DEF_TILE(name, 1, 7)                                                                                               \
    DEF_TILE(name, 1, 8)                                                                                               \
    static tile_fn *const name##_tiles[] = {name##_tile_1x1, name##_tile_1x2, name##_tile_1x3, name##_tile_1x4,        \
                                            name##_tile_1x5, name##_tile_1x6, name##_tile_1x7, name##_tile_1x8};

/* Activation bytes a token tile's column block may take (so that it stays in L1 while the
 * rows of a sub-chunk are swept): half the L1 data cache, 16 to 32 KiB (16 where the size
 * is not reported). A 48 KiB cache's 24 KiB took pp128 of the 1B shape 3 % (Q4_K_M) to 14 %
 * (Q8_0) above 16 KiB (docs/bench/2026-12-04-session36.md). */
static size_t l1_x_bytes(void) {
    size_t half = ps_cpu_l1d_bytes() / 2;
    return half < 16 * 1024 ? 16 * 1024 : half > 32 * 1024 ? 32 * 1024 : half;
}
/* GEMV takes rows in pairs when a pair is this short (the two rows are then one stream). */
#ifndef GEMV_PAIR_BYTES
#define GEMV_PAIR_BYTES 1024
#endif
/* Rows per sub-chunk (their accumulators wait on the stack between column blocks). */
#define SUB_ROWS 64
/* Up to this many tokens a row is not cut into column blocks either: the rows stream whole,
 * prefetched ahead as in GEMV, and the activations come from L1 or L2 (a pass of 2 tokens of
 * the 1.5B's layer: 1.36x one token's time with 5 column blocks of ffn_down, 1.12x whole;
 * 5 to 8 tokens of q8_0 23-43 % faster whole than blocked, the K types and q4_0 0-20 %). */
#define STREAM_TOKENS 8

/* Covers nr x nt with tiles of at most rm x tm (tiles[(R - 1) * tm + T - 1]): per
 * sub-chunk of rows, per token tile, per column block, all row tiles. A single token
 * takes one row at a time and no column blocks: one weight stream per thread is what
 * streams fastest from DRAM; up to STREAM_TOKENS tokens take no column blocks either.
 * ng groups per row, xg activation bytes per group. */
static void tile_drive(tile_fn *const *tiles, int rm, int tm, const kctx *cx, const uint8_t *w, size_t wb, int64_t cols,
                       const uint8_t *x, size_t xs, float *y, int64_t ys, int64_t nr, int64_t nt, int64_t ng,
                       size_t xg) {
    float acc[SUB_ROWS * TMAX * 16] __attribute__((aligned(64)));
    if (nt == 1 && wb > GEMV_PAIR_BYTES) rm = 1;
    int64_t kb = (int64_t)(l1_x_bytes() / ((size_t)tm * xg));
    if (kb < 1) kb = 1;
    if (nt <= STREAM_TOKENS || kb > ng) kb = ng;
    for (int64_t rs = 0; rs < nr; rs += SUB_ROWS) {
        int64_t re = nr - rs < SUB_ROWS ? nr : rs + SUB_ROWS;
        for (int64_t t = 0; t < nt; t += tm) {
            int T = nt - t >= tm ? tm : (int)(nt - t);
            for (int64_t g0 = 0; g0 < ng; g0 += kb) {
                span sp = {g0, ng - g0 < kb ? ng : g0 + kb, g0 == 0, g0 + kb >= ng, 0, NULL};
                for (int64_t r = rs; r < re; r += rm) {
                    int R = re - r >= rm ? rm : (int)(re - r);
                    sp.stream = nt <= STREAM_TOKENS || R * T == 1;
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
    while (atomic_load_explicit(state, memory_order_acquire) != 2) {}
    return cx;
}

#define DEF_GEMM(name, rm, tm, ctx_make)                                                                               \
    static inline int64_t name##_groups(int64_t cols) { return (cols / name##_BE + name##_BPG - 1) / name##_BPG; }     \
    static kctx name##_cx;                                                                                             \
    static atomic_int name##_cx_state;                                                                                 \
    KF void gemm_##name(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs, float *y, int64_t ys,  \
                        int64_t nr, int64_t nt) {                                                                      \
        const kctx *cx = ctx_once(&name##_cx, &name##_cx_state, ctx_make);                                             \
        tile_drive(name##_tiles, rm, tm, cx, w, wb, cols, x, xs, y, ys, nr, nt, name##_groups(cols), name##_XG);       \
    }
