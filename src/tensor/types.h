/* types.h - tensor element types and quant block formats (GGUF / ggml numbering).
 *
 * A row of `n` elements of a quantized type is n / block_size consecutive blocks.
 * Every block struct below is bit-for-bit the on-disk layout; its size is checked
 * right after it. Half-precision fields hold raw IEEE binary16 bits. */
#ifndef PS_TENSOR_TYPES_H
#define PS_TENSOR_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ps.h"

#ifdef __cplusplus /* the CUDA backend (C++) reads these structs too */
#define _Static_assert static_assert
#endif

typedef enum {
    PS_TYPE_F32 = 0,
    PS_TYPE_F16 = 1,
    PS_TYPE_Q4_0 = 2,
    PS_TYPE_Q4_1 = 3,
    PS_TYPE_Q5_0 = 6,
    PS_TYPE_Q5_1 = 7,
    PS_TYPE_Q8_0 = 8,
    PS_TYPE_Q8_1 = 9,
    PS_TYPE_Q2_K = 10,
    PS_TYPE_Q3_K = 11,
    PS_TYPE_Q4_K = 12,
    PS_TYPE_Q5_K = 13,
    PS_TYPE_Q6_K = 14,
    PS_TYPE_Q8_K = 15,
    PS_TYPE_BF16 = 30,
    PS_TYPE_COUNT = 40 /* upper bound on the numbering, not a type */
} ps_type;

typedef uint16_t ps_f16;  /* IEEE binary16 bits */
typedef uint16_t ps_bf16; /* bfloat16 bits (upper half of an f32) */

#define PS_QK   32  /* elements per block of the 32-wide formats */
#define PS_QK_K 256 /* elements per super-block of the K formats */

typedef struct {
    ps_f16 d;              /* scale */
    uint8_t qs[PS_QK / 2]; /* nibbles: element j in low nibble of qs[j], j+16 in high; value (q - 8) * d */
} ps_block_q4_0;
_Static_assert(sizeof(ps_block_q4_0) == 18, "q4_0 block size");

typedef struct {
    ps_f16 d;              /* scale */
    ps_f16 m;              /* minimum; value q * d + m */
    uint8_t qs[PS_QK / 2]; /* nibbles, laid out as q4_0 */
} ps_block_q4_1;
_Static_assert(sizeof(ps_block_q4_1) == 20, "q4_1 block size");

typedef struct {
    ps_f16 d;              /* scale */
    uint8_t qh[4];         /* fifth bit of element j is bit j of this little-endian u32 */
    uint8_t qs[PS_QK / 2]; /* low four bits, laid out as q4_0; value (q - 16) * d */
} ps_block_q5_0;
_Static_assert(sizeof(ps_block_q5_0) == 22, "q5_0 block size");

typedef struct {
    ps_f16 d;              /* scale */
    ps_f16 m;              /* minimum; value q * d + m */
    uint8_t qh[4];         /* fifth bits, as q5_0 */
    uint8_t qs[PS_QK / 2]; /* low four bits, as q4_0 */
} ps_block_q5_1;
_Static_assert(sizeof(ps_block_q5_1) == 24, "q5_1 block size");

typedef struct {
    ps_f16 d;         /* scale */
    int8_t qs[PS_QK]; /* value q * d */
} ps_block_q8_0;
_Static_assert(sizeof(ps_block_q8_0) == 34, "q8_0 block size");

typedef struct {
    ps_f16 d;         /* scale */
    ps_f16 s;         /* d * sum(qs) */
    int8_t qs[PS_QK]; /* value q * d */
} ps_block_q8_1;
_Static_assert(sizeof(ps_block_q8_1) == 36, "q8_1 block size");

#define PS_K_SCALE_SIZE 12

typedef struct {
    ps_f16 d;                        /* super-block scale for the 6-bit scales */
    ps_f16 dmin;                     /* super-block scale for the 6-bit minimums */
    uint8_t scales[PS_K_SCALE_SIZE]; /* 8 scales and 8 minimums, 6 bits each, packed */
    uint8_t qs[PS_QK_K / 2];         /* 4-bit quants: 64-element groups, low nibbles then high */
} ps_block_q4_K;
_Static_assert(sizeof(ps_block_q4_K) == 144, "q4_K block size");

typedef struct {
    ps_f16 d;                        /* super-block scale for the 6-bit scales */
    ps_f16 dmin;                     /* super-block scale for the 6-bit minimums */
    uint8_t scales[PS_K_SCALE_SIZE]; /* packed as q4_K */
    uint8_t qh[PS_QK_K / 8];         /* fifth bits */
    uint8_t qs[PS_QK_K / 2];         /* low four bits, as q4_K */
} ps_block_q5_K;
_Static_assert(sizeof(ps_block_q5_K) == 176, "q5_K block size");

typedef struct {
    uint8_t ql[PS_QK_K / 2];     /* low four bits */
    uint8_t qh[PS_QK_K / 4];     /* high two bits */
    int8_t scales[PS_QK_K / 16]; /* 8-bit scale per 16 elements */
    ps_f16 d;                    /* super-block scale; value d * scale * (q - 32) */
} ps_block_q6_K;
_Static_assert(sizeof(ps_block_q6_K) == 210, "q6_K block size");

typedef struct {
    float d;                     /* scale */
    int8_t qs[PS_QK_K];          /* value q * d */
    int16_t bsums[PS_QK_K / 16]; /* sum of qs over each 16 elements */
} ps_block_q8_K;
_Static_assert(sizeof(ps_block_q8_K) == 292, "q8_K block size");

/* Static facts about a type. */
typedef struct {
    const char *name;    /* "Q4_K", as GGUF tools print it */
    uint32_t block_size; /* elements per block (1 for F32/F16/BF16) */
    uint32_t type_size;  /* bytes per block */
    bool supported;      /* we can load weights of this type */
} ps_type_info;

/* Facts for type t; NULL when t is not a type we know (not even by name). */
const ps_type_info *ps_type_get(uint32_t t);
/* "Q4_K", or "type 23" style text in a static buffer for unknown numbers (never NULL). */
const char *ps_type_name(uint32_t t);
/* Looks a type up by name, case-insensitively ("q4_0", "Q8_0", "f16", "bf16"). Names of
 * types we cannot load ("IQ2_XXS") are found too: check ps_type_get(t)->supported.
 * PS_ERR_NOT_FOUND for an unknown name. */
ps_status ps_type_from_name(const char *name, ps_type *out);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block size, n < 0, t is
 * unknown, or the size overflows size_t. Known-but-unsupported types have sizes too. */
size_t ps_row_bytes(uint32_t t, int64_t n);

/* Scalar conversions. */
float ps_f16_to_f32(ps_f16 h);
ps_f16 ps_f32_to_f16(float f); /* round to nearest even */
float ps_bf16_to_f32(ps_bf16 h);
ps_bf16 ps_f32_to_bf16(float f); /* round to nearest even */

/* Dequantizes n elements (a multiple of the block size) of type t from src into dst.
 * Reference code: the NumPy `gguf` package gives bit-identical values. src needs no
 * alignment. Both (de)quantizers return PS_ERR_UNSUPPORTED for a known type we cannot
 * handle, PS_ERR_ARG for an unknown type number, n < 0, n not a multiple of the block
 * size, or NULL pointers with n > 0, and PS_ERR_RANGE when the row's bytes overflow. */
ps_status ps_dequantize_row(ps_type t, const void *src, float *dst, int64_t n);

/* Quantizes n floats (a multiple of the block size) into type t. Reference
 * quantizers (round to nearest, K types search scales/minimums), used by `synth`
 * and by tests; not on the inference hot path. */
ps_status ps_quantize_row(ps_type t, const float *src, void *dst, int64_t n);

#endif
