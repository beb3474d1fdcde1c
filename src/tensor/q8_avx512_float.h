/* q8_avx512_float.h - part of q8_avx512.h, included only there, after q8_avx512_k.h:
 * float weights (f32, f16, bf16) against f32 activations, 16 columns per step. */

// Float weights (f32, f16, bf16) against f32 activations: 16 columns per step

enum { W_F32, W_F16, W_BF16 };

/* 16 weights at column c of a row (lanes beyond mask are 0), as floats. */
KI __m512 fw_load(int kind, const uint8_t *row, int64_t c, __mmask16 mask) {
    if (kind == W_F32)
        return mask == 0xffff ? _mm512_loadu_ps((const float *)row + c)
                              : _mm512_maskz_loadu_ps(mask, (const float *)row + c);
    __m256i h = mask == 0xffff ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c))
                               : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + c);
    if (kind == W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* facc[r][t] = fma(w_r[c..c+16), x_t[c..c+16), facc[r][t]) for one step of 16 columns. */
KI void fstep(int R, int T, int kind, const uint8_t *w, size_t wb, const uint8_t *x, size_t xs, int64_t c,
              __mmask16 mask, __m512 facc[RMAX][TMAX]) {
    __m512 wv[RMAX];
    UNROLL
    for (int r = 0; r < R; r++) wv[r] = fw_load(kind, w + r * wb, c, mask);
    UNROLL
    for (int t = 0; t < T; t++) {
        const float *xp = (const float *)(x + t * xs) + c;
        __m512 xv = mask == 0xffff ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(mask, xp);
        __asm__("" : "+v"(xv));
        UNROLL
        for (int r = 0; r < R; r++) facc[r][t] = _mm512_fmadd_ps(wv[r], xv, facc[r][t]);
    }
}

/* An R x T tile over 16-column steps [g0, g1): one accumulator per pair, columns in
 * order, the last step masked. */
KI void ftile(int R, int T, int kind, const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,
              const span *sp, float *y, int64_t ys) {
    __m512 facc[RMAX][TMAX];
    facc_begin(R, T, sp, facc);
    int64_t gfull = cols / 16 < sp->g1 ? cols / 16 : sp->g1;
    for (int64_t g = sp->g0; g < gfull; g++) {
        if (R * T == 1 && g % (kind == W_F32 ? 1 : 2) == 0) prefetch_ahead(w + 16 * g * (kind == W_F32 ? 4 : 2), 64);
        fstep(R, T, kind, w, wb, x, xs, 16 * g, 0xffff, facc);
    }
    if (gfull < sp->g1) fstep(R, T, kind, w, wb, x, xs, 16 * gfull, (__mmask16)((1u << (cols - 16 * gfull)) - 1), facc);
    facc_end(R, T, sp, facc, y, ys);
}

#define DEF_FTILE(name, kind, R, T)                                                                                    \
    KF void name##_tile_##R##x##T(const uint8_t *w, size_t wb, int64_t cols, const uint8_t *x, size_t xs,              \
                                  const span *sp, float *y, int64_t ys, const kctx *cx) {                              \
        (void)cx;                                                                                                      \
        ftile(R, T, kind, w, wb, cols, x, xs, sp, y, ys);                                                              \
    }
#define DEF_FROW(name, kind, R)                                                                                        \
    DEF_FTILE(name, kind, R, 1)                                                                                        \
    DEF_FTILE(name, kind, R, 2)                                                                                        \
    DEF_FTILE(name, kind, R, 3)                                                                                        \
    DEF_FTILE(name, kind, R, 4)                                                                                        \
    DEF_FTILE(name, kind, R, 5)                                                                                        \
    DEF_FTILE(name, kind, R, 6)
#define FROW_TABLE(name, R)                                                                                            \
    name##_tile_##R##x1, name##_tile_##R##x2, name##_tile_##R##x3, name##_tile_##R##x4, name##_tile_##R##x5,           \
        name##_tile_##R##x6
/* Tiles up to 4 rows x 6 tokens. */
#define FLOAT_TYPE(name, kind)                                                                                         \
    DEF_FROW(name, kind, 1)                                                                                            \
    DEF_FROW(name, kind, 2)                                                                                            \
    DEF_FROW(name, kind, 3)                                                                                            \
    DEF_FROW(name, kind, 4)                                                                                            \
    static tile_fn *const name##_tiles[] = {FROW_TABLE(name, 1), FROW_TABLE(name, 2), FROW_TABLE(name, 3),             \
                                            FROW_TABLE(name, 4)};                                                      \
    static void name##_ctx(kctx *cx) { memset(cx, 0, sizeof *cx); }                                                    \
    DEF_GEMM(name, 4, 6, name##_ctx)

enum { f32_BE = 1, f32_BPG = 16, f32_XG = 64, f16_BE = 1, f16_BPG = 16, f16_XG = 64 };
enum { bf16_BE = 1, bf16_BPG = 16, bf16_XG = 64 };
FLOAT_TYPE(f32, W_F32)
FLOAT_TYPE(f16, W_F16)
FLOAT_TYPE(bf16, W_BF16)

static size_t f32_bytes(int64_t cols) { return ((size_t)cols * sizeof(float) + 63) & ~(size_t)63; }
