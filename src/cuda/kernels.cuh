/* kernels.cuh - the CUDA backend's kernels (stage.cu launches them). Each one does what
 * the CPU does for the same output, operation for operation (cuda.h): the notes name the
 * CPU function it follows; k_mm_h and k_mm_hp (F16 and BF16 weights) alone do not.
 * Compiled with -fmad=false: a * b + c stays two roundings. */
#ifndef PS_CUDA_KERNELS_CUH
#define PS_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <stdint.h>

#include <type_traits>

extern "C" {
#include "../model/model.h"
#include "../tensor/q8_kern.h"
#include "../tensor/types.h"
}
#include "../tensor/fmath.h"

#define FULL 0xffffffffu

/* ---------------------------------------------------------------------------------------
 * Small helpers */

__device__ __forceinline__ float f16(const uint8_t *p) { return __half2float(*(const __half *)p); }

/* Four bytes from an address that is 2-aligned (GGUF blocks of 18, 22, 34, 210 bytes). */
__device__ __forceinline__ uint32_t ld2x16(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | (uint32_t)h[1] << 16;
}
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return *(const uint32_t *)p; }
/* ld2x16 evict-first (__ldcs), as the matmuls load weights: a step reads each once, and the
 * L2 is left to what is read again (activations, the KV cache, code). */
__device__ __forceinline__ uint32_t ldcs2x16(const uint8_t *p) {
    const unsigned short *h = (const unsigned short *)p;
    return (uint32_t)__ldcs(h) | (uint32_t)__ldcs(h + 1) << 16;
}

/* Bits 0..3 of u as the low bits of four bytes. */
__device__ __forceinline__ uint32_t spread4(uint32_t u) {
    return (u & 1) | (u & 2) << 7 | (u & 4) << 14 | (u & 8) << 21;
}

/* dot_f32's 16-lane tree (l + 8 into l, then 4, 2, 1) over lanes 0..15 of each half warp;
 * the sum lands in lane 0 of the half. Each addition adds the same two numbers. */
__device__ __forceinline__ float tree16(float a) {
    for (int w = 8; w; w >>= 1) a += __shfl_down_sync(FULL, a, w, 16);
    return a;
}

/* Programmatic dependent launch (sm_90 on): a matmul launched so (stage.cu's launch_after)
 * starts while the kernel before it finishes, loads weights, and waits (pdl_wait) before it
 * reads what that kernel wrote or writes anything. The kernels that come before a matmul
 * let it start at once (pdl_start). Both are no-ops below sm_90. */
__device__ __forceinline__ void pdl_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Starts copying bytes (a multiple of 4) from global to shared memory, every copy in flight
 * at once (16-byte asynchronous copies where both ends allow, else 4-byte ones): one copy
 * group, the caller's threads 0 .. threads - 1 sharing it. */
__device__ __forceinline__ void copy_to_shared_async(void *dst, const void *src, int bytes, int tid, int threads) {
    int wide = ((uintptr_t)dst | (uintptr_t)src) % 16 == 0 ? bytes / 16 : 0;
    for (int i = tid; i < wide; i += threads) __pipeline_memcpy_async((uint4 *)dst + i, (const uint4 *)src + i, 16);
    for (int i = wide * 4 + tid; i < bytes / 4; i += threads)
        __pipeline_memcpy_async((int *)dst + i, (const int *)src + i, 4);
    __pipeline_commit();
}

/* The same, each thread's own copies landed when it returns (a __syncthreads after it makes
 * them everyone's). */
__device__ __forceinline__ void copy_to_shared(void *dst, const void *src, int bytes, int tid, int threads) {
    copy_to_shared_async(dst, src, bytes, tid, threads);
    __pipeline_wait_prior(0);
}

/* ---------------------------------------------------------------------------------------
 * Activation quantization (q8_ref.c's quant_x32 / quant_x256 with ps_xq_scale and
 * ps_xq_round): one warp per block. */

__device__ __forceinline__ float warp_max(float v) {
    for (int w = 16; w; w >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, w));
    return v;
}

__device__ __forceinline__ int warp_isum(int v) {
    for (int w = 16; w; w >>= 1) v += __shfl_xor_sync(FULL, v, w);
    return v;
}

__device__ __forceinline__ int8_t xq_round(float v, float id) {
    float r = v * id;
    if (r != r) return 0;
    if (r >= 127.0f) return 127;
    if (r <= -127.0f) return -127;
    return (int8_t)rintf(r);
}

/* amax / 127 into *d; 1 / d (0 when d is 0). fmaxf's order does not matter: max is exact. */
__device__ __forceinline__ float xq_scale(float amax, float *d) {
    *d = amax / 127.0f;
    return *d != 0.0f ? 1.0f / *d : 0.0f;
}

/* The ps_xq32 block of a warp's 32 values, one per lane (every lane calls it). */
__device__ __forceinline__ void quant_warp(float v, ps_xq32 *out) {
    int lane = threadIdx.x & 31;
    float d, id = xq_scale(warp_max(fabsf(v)), &d);
    int8_t q = xq_round(v, id);
    int sum = warp_isum(q);
    out->qs[lane] = q;
    if (lane == 0) out->d = d, out->sum = sum;
}

/* Rows of floats into ps_xq32 blocks (a row of cols floats: cols / 32 blocks). */
__global__ void k_quant32(const float *x, int n_blocks, ps_xq32 *out) {
    pdl_start();
    pdl_wait();
    int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (b < n_blocks) quant_warp(x[(size_t)b * 32 + lane], out + b);
}

/* The ps_block_q8_K of 256 values (bsums over each 16): lane l quantizes 8 of them. Every
 * lane calls it. */
__device__ __forceinline__ void quant_warp256(const float *x, ps_block_q8_K *out) {
    int lane = threadIdx.x & 31;
    const float *xb = x + lane * 8;
    float amax = 0.0f, d;
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(xb[i]));
    float id = xq_scale(warp_max(amax), &d);
    int s = 0;
    for (int i = 0; i < 8; i++) {
        int8_t q = xq_round(xb[i], id);
        out->qs[lane * 8 + i] = q;
        s += q;
    }
    s += __shfl_down_sync(FULL, s, 1);
    if (!(lane & 1)) out->bsums[lane / 2] = (int16_t)s;
    if (lane == 0) out->d = d;
}

/* Rows into ps_block_q8_K. */
__global__ void k_quant256(const float *x, int n_blocks, ps_block_q8_K *out) {
    pdl_start();
    pdl_wait();
    int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (b < n_blocks) quant_warp256(x + (size_t)b * 256, out + b);
}

/* ---------------------------------------------------------------------------------------
 * Matmuls with 8-bit activations (q8_ref.c's dot_<type>): per weight block an exact
 * integer dot product and its float term(s), then sum += term block after block. The K
 * types' super-blocks are worked by 8 threads (one 32-element sub-block each). */

template <int T> struct wtype {
    static constexpr bool k = T == PS_TYPE_Q4_K || T == PS_TYPE_Q5_K || T == PS_TYPE_Q6_K;
    static constexpr int terms = T == PS_TYPE_Q4_1 || T == PS_TYPE_Q5_1 ? 2 : 1; /* the minimum's term */
    static constexpr int bytes = T == PS_TYPE_Q4_0   ? 18
                                 : T == PS_TYPE_Q4_1 ? 20
                                 : T == PS_TYPE_Q5_0 ? 22
                                 : T == PS_TYPE_Q5_1 ? 24
                                 : T == PS_TYPE_Q8_0 ? 34
                                 : T == PS_TYPE_Q4_K ? 144
                                 : T == PS_TYPE_Q5_K ? 176
                                                     : 210;
    /* a 32-element block's head (scale, minimum, Q5's fifth bits) and quants, as split_row splits it */
    static constexpr int head = bytes - (T == PS_TYPE_Q8_0 ? 32 : 16), quant = bytes - head;
    static constexpr int stride = (bytes + 15) & ~15; /* a K type's super-blocks apart on the device */
};

/* The quantized types as the GPU holds them, each row padded to 16 bytes. The 32-element
 * types: each row split into its blocks' quants (16 bytes each, Q8_0's 32), then their
 * heads (the block's first wtype::head bytes). A lane then reads a block's quants with one
 * 16-byte load, and a warp 32 blocks' in 512 consecutive bytes. The K types: GGUF's
 * super-blocks, each 16-aligned (wtype::stride: Q6_K's 210 bytes take 224), so that a lane
 * reads a sub-block's quants in 16-byte loads and they travel to shared memory in 16-byte
 * copies. */
__host__ __device__ constexpr bool split_type(uint32_t t) {
    return t == PS_TYPE_Q4_0 || t == PS_TYPE_Q4_1 || t == PS_TYPE_Q5_0 || t == PS_TYPE_Q5_1 || t == PS_TYPE_Q8_0;
}
static inline size_t pad16(size_t bytes) { return (bytes + 15) & ~(size_t)15; }
/* Bytes a block of quantized type t takes in a device row (a K type's stride: wtype::stride). */
static inline size_t dev_block_bytes(uint32_t t) {
    size_t b = ps_type_get(t)->type_size;
    return split_type(t) ? b : (b + 15) & ~(size_t)15;
}
/* Bytes of a row of cols elements of quantized type t on the device. */
static inline size_t dev_row_bytes(uint32_t t, size_t cols) {
    return pad16(cols / ps_type_get(t)->block_size * dev_block_bytes(t));
}
/* A row of cols elements of type t as the device holds it into out (out_bytes of them). */
static inline void dev_row(const uint8_t *in, size_t cols, uint32_t t, uint8_t *out, size_t out_bytes) {
    const ps_type_info *ti = ps_type_get(t);
    size_t n = cols / ti->block_size, bytes = ti->type_size;
    memset(out, 0, out_bytes);
    if (!split_type(t)) { /* the K types: each super-block 16-aligned */
        for (size_t b = 0; b < n; b++) memcpy(out + b * dev_block_bytes(t), in + b * bytes, bytes);
        return;
    }
    size_t quant = t == PS_TYPE_Q8_0 ? 32 : 16, head = bytes - quant;
    for (size_t b = 0; b < n; b++) {
        memcpy(out + b * quant, in + b * bytes + head, quant);
        memcpy(out + n * quant + b * head, in + b * bytes, head);
    }
}

/* One lane's weights: a 32-element block (q: elements 0..15 then 16..31, four per int), or
 * one 32-element sub-block of a super-block (K types) with its scale(s) and minimum. */
struct wunit {
    int q[8];
    float d, m;
    int sc0, sc1, mn;
};

/* A split row's block as loaded (quants, head), unpacked when its terms are computed. */
struct wraw {
    uint4 q0, q1;
    uint32_t h0, h1;
};

/* Block b of a split row (n_blocks blocks), evict-first (ldcs2x16). */
template <int T> __device__ __forceinline__ void load_split(const uint8_t *row, int n_blocks, int b, wraw &r) {
    typedef wtype<T> ty;
    const uint8_t *q = row + (size_t)b * ty::quant, *h = row + (size_t)n_blocks * ty::quant + (size_t)b * ty::head;
    r.q0 = __ldcs((const uint4 *)q);
    if (T == PS_TYPE_Q8_0) r.q1 = __ldcs((const uint4 *)(q + 16));
    if (ty::head == 2) r.h0 = __ldcs((const unsigned short *)h);
    if (ty::head == 4) r.h0 = __ldcs((const unsigned int *)h);
    if (ty::head == 6) r.h0 = ldcs2x16(h), r.h1 = __ldcs((const unsigned short *)(h + 4));
    if (ty::head == 8) {
        uint2 v = __ldcs((const uint2 *)h);
        r.h0 = v.x, r.h1 = v.y;
    }
}

__device__ __forceinline__ float f16_bits(uint32_t b) { return __half2float(__ushort_as_half((unsigned short)b)); }

/* q8_ref.c's dot_nibbles / dot_nibbles5 layouts: the block's elements as four-byte groups. */
template <int T> __device__ __forceinline__ void unpack(const wraw &r, wunit &w) {
    w.d = f16_bits(r.h0 & 0xffff);
    const uint32_t u[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    if (T == PS_TYPE_Q8_0) {
        for (int k = 0; k < 8; k++) w.q[k] = (int)u[k];
        return;
    }
    uint32_t h = 0;
    if (T == PS_TYPE_Q4_1 || T == PS_TYPE_Q5_1) w.m = f16_bits(r.h0 >> 16);
    if (T == PS_TYPE_Q5_0) h = r.h0 >> 16 | r.h1 << 16;
    if (T == PS_TYPE_Q5_1) h = r.h1;
    for (int k = 0; k < 4; k++) {
        uint32_t lo = u[k] & 0x0f0f0f0fu, hi = (u[k] >> 4) & 0x0f0f0f0fu;
        if (T == PS_TYPE_Q5_0 || T == PS_TYPE_Q5_1) {
            lo |= spread4(h >> (4 * k)) << 4;
            hi |= spread4(h >> (16 + 4 * k)) << 4;
        }
        w.q[k] = (int)lo, w.q[4 + k] = (int)hi;
    }
}

/* Sub-block s (0..7) of a K type's super-block as loaded: the words of its quants (q: Q4_K's
 * and Q5_K's qs, Q6_K's ql; e: Q5_K's and Q6_K's high bits) and of its head (h: Q4_K's and
 * Q5_K's d, dmin and scales; Q6_K's scale pair and d), unpacked when its term is computed. */
template <int T> struct kraw { uint32_t q[8], e[8], h[4]; };

__device__ __forceinline__ void words(uint4 v, uint32_t *w) { w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w; }

/* Super-blocks lie 16-aligned (Q6_K's 210 bytes padded to 224). */
template <int T> __device__ __forceinline__ void load_kraw(const uint8_t *blk, int s, kraw<T> &r) {
    if (T == PS_TYPE_Q6_K) {
        const uint4 *ql = (const uint4 *)(blk + 64 * (s >> 2) + (s & 1) * 32),
                    *qh = (const uint4 *)(blk + 128 + 32 * (s >> 2));
        words(ql[0], r.q), words(ql[1], r.q + 4), words(qh[0], r.e), words(qh[1], r.e + 4);
        r.h[0] = ld32(blk + 192 + 4 * (s >> 1)), r.h[1] = ld32(blk + 208);
        return;
    }
    const uint4 *qs = (const uint4 *)(blk + (T == PS_TYPE_Q5_K ? 48 : 16) + 32 * (s >> 1));
    words(*(const uint4 *)blk, r.h), words(qs[0], r.q), words(qs[1], r.q + 4);
    if (T == PS_TYPE_Q5_K) words(*(const uint4 *)(blk + 16), r.e), words(*(const uint4 *)(blk + 32), r.e + 4);
}

/* q8_ref.c's k4_scales, k4_quants, k6_quants. Byte i of the scales is byte i & 3 of h[1 + i / 4]. */
template <int T> __device__ __forceinline__ void unpack_k(const kraw<T> &r, int s, wunit &w) {
    if (T == PS_TYPE_Q6_K) {
        int kk = s & 3;
        for (int k = 0; k < 8; k++) {
            uint32_t v = ((r.q[k] >> ((kk >> 1) * 4)) & 0x0f0f0f0fu) | (((r.e[k] >> (2 * kk)) & 0x03030303u) << 4);
            w.q[k] = (int)__vsub4(v, 0x20202020u); /* q - 32 in each byte */
        }
        uint32_t sc = r.h[0] >> (16 * (s & 1));
        w.sc0 = (int8_t)(sc & 0xff), w.sc1 = (int8_t)(sc >> 8 & 0xff);
        w.d = f16_bits(r.h[1] & 0xffff);
        return;
    }
    w.d = f16_bits(r.h[0] & 0xffff), w.m = f16_bits(r.h[0] >> 16);
    int sh = 8 * (s & 3);
    uint32_t a = r.h[1] >> sh & 0xff, b = r.h[2] >> sh & 0xff, c = r.h[3] >> sh & 0xff; /* scales s&3, +4, +8 */
    if (s < 4)
        w.sc0 = a & 63, w.mn = b & 63;
    else
        w.sc0 = (c & 0x0f) | ((a >> 2) & 0x30), w.mn = (c >> 4) | ((b >> 2) & 0x30);
    int shift = (s & 1) * 4;
    for (int k = 0; k < 8; k++) {
        uint32_t v = (r.q[k] >> shift) & 0x0f0f0f0fu;
        if (T == PS_TYPE_Q5_K) v |= ((r.e[k] >> s) & 0x01010101u) << 4;
        w.q[k] = (int)v;
    }
}

template <int T> __device__ __forceinline__ void load_k(const uint8_t *blk, int s, wunit &w) {
    kraw<T> r;
    load_kraw<T>(blk, s, r);
    unpack_k<T>(r, s, w);
}

/* The float term(s) of one 32-element block against activation block x. */
template <int T> __device__ __forceinline__ void term32(const wunit &w, const ps_xq32 *x, float *a, float *b) {
    const int2 *x2 = (const int2 *)x; /* 8-byte loads: in shared memory, lanes 40 bytes apart share no bank */
    int2 head = x2[0], xi[4];         /* d, sum */
    for (int k = 0; k < 4; k++) xi[k] = x2[1 + k];
    int dot = 0, sum = head.y;
    float d = __int_as_float(head.x);
    for (int k = 0; k < 4; k++) dot = __dp4a(w.q[2 * k + 1], xi[k].y, __dp4a(w.q[2 * k], xi[k].x, dot));
    if (T == PS_TYPE_Q4_0) dot -= 8 * sum;
    if (T == PS_TYPE_Q5_0) dot -= 16 * sum;
    *a = (w.d * d) * (float)dot;
    if (T == PS_TYPE_Q4_1 || T == PS_TYPE_Q5_1) *b = w.m * (d * (float)sum);
}

/* The term(s) of a split row's block as loaded (raw) against activation block x, unpacked
 * into w; 0 where !on. */
template <int T>
__device__ __forceinline__ void raw_terms(const wraw &raw, const ps_xq32 *x, bool on, wunit &w, float *a, float *b) {
    *a = 0.0f, *b = 0.0f;
    if (!on) return;
    unpack<T>(raw, w);
    term32<T>(w, x, a, b);
}

/* The term of one super-block: each of 8 lanes (s = lane & 7) its sub-block's integer sums,
 * added over the 8 lanes (exact), the float step in every lane. All 32 lanes call it. */
template <int T> __device__ __forceinline__ float term_k(const wunit &w, const ps_block_q8_K *x, int s) {
    const int *xi = (const int *)(x->qs + 32 * s);
    int isum = 0, imin = 0;
    if (T == PS_TYPE_Q6_K) {
        int d0 = 0, d1 = 0;
        for (int k = 0; k < 4; k++) d0 = __dp4a(w.q[k], xi[k], d0);
        for (int k = 4; k < 8; k++) d1 = __dp4a(w.q[k], xi[k], d1);
        isum = w.sc0 * d0 + w.sc1 * d1;
    } else {
        int dot = 0;
        for (int k = 0; k < 8; k++) dot = __dp4a(w.q[k], xi[k], dot);
        isum = w.sc0 * dot;
        imin = w.mn * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
    }
    for (int o = 4; o; o >>= 1) {
        isum += __shfl_xor_sync(FULL, isum, o, 8);
        imin += __shfl_xor_sync(FULL, imin, o, 8);
    }
    if (T == PS_TYPE_Q6_K) return (w.d * x->d) * (float)isum;
    return (w.d * x->d) * (float)isum - (w.m * x->d) * (float)imin;
}

/* Decode's share of a K-type super-block for one of 4 lanes (c): two 32-element sub-blocks
 * whose quants share bytes, so that each quant byte is loaded once (the header by all 4 lanes,
 * Q5_K's fifth bits by all 4, Q6_K's high bits by 2). Q4_K and Q5_K: 2c
 * and 2c + 1 (the low and high nibbles of the same 32 bytes, the same 32 bytes of high bits);
 * Q6_K: 4 (c / 2) + c % 2 and that + 2 (ql's low and high nibbles, the same qh). As loaded: q
 * the quants' 32 bytes, e the high bits' (Q5_K, Q6_K), h the header (Q6_K: its 8 scales of
 * the half, then d). Evict-first, as load_split. */
template <int T> struct kquad { uint32_t q[8], e[8], h[4]; };

template <int T> __device__ __forceinline__ void load_kquad(const uint8_t *blk, int c, kquad<T> &r) {
    if (T == PS_TYPE_Q6_K) {
        int half = c >> 1;
        const uint4 *ql = (const uint4 *)(blk + 64 * half + (c & 1) * 32), *qh = (const uint4 *)(blk + 128 + 32 * half);
        words(__ldcs(ql), r.q), words(__ldcs(ql + 1), r.q + 4), words(__ldcs(qh), r.e), words(__ldcs(qh + 1), r.e + 4);
        uint2 sc = __ldcs((const uint2 *)(blk + 192 + 8 * half));
        r.h[0] = sc.x, r.h[1] = sc.y, r.h[2] = __ldcs((const unsigned int *)(blk + 208));
        return;
    }
    const uint4 *qs = (const uint4 *)(blk + (T == PS_TYPE_Q5_K ? 48 : 16) + 32 * c);
    words(__ldcs((const uint4 *)blk), r.h), words(__ldcs(qs), r.q), words(__ldcs(qs + 1), r.q + 4);
    if (T == PS_TYPE_Q5_K)
        words(__ldcs((const uint4 *)(blk + 16)), r.e), words(__ldcs((const uint4 *)(blk + 32)), r.e + 4);
}

/* The dot of sub-block s's 32 quants (w: eight words of four) with x's. */
__device__ __forceinline__ int dot32(const int *w, const ps_block_q8_K *x, int s) {
    const int *xi = (const int *)(x->qs + 32 * s);
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) dot = __dp4a(w[k], xi[k], dot);
    return dot;
}

/* term_k's float term of a super-block from the 4 lanes that hold it as load_kquad left it
 * (c = lane % 4): each its two sub-blocks' integer sums, added over the 4 (exact), then
 * term_k's float step in every lane. All 32 lanes call it. */
template <int T> __device__ __forceinline__ float term_kquad(const kquad<T> &r, const ps_block_q8_K *x, int c) {
    int isum = 0, imin = 0, w[8];
    if (T == PS_TYPE_Q6_K) {
#pragma unroll
        for (int j = 0; j < 2; j++) { /* kk = c % 2 + 2 j: quants' nibble j, high bits 2 kk up */
            int kk = (c & 1) + 2 * j, s = 4 * (c >> 1) + kk;
#pragma unroll
            for (int k = 0; k < 8; k++)
                w[k] = (int)__vsub4(((r.q[k] >> (4 * j)) & 0x0f0f0f0fu) | (((r.e[k] >> (2 * kk)) & 0x03030303u) << 4),
                                    0x20202020u);
            const int *xi = (const int *)(x->qs + 32 * s);
            int d0 = 0, d1 = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) d0 = __dp4a(w[k], xi[k], d0);
#pragma unroll
            for (int k = 4; k < 8; k++) d1 = __dp4a(w[k], xi[k], d1);
            uint32_t sc = (kk < 2 ? r.h[0] : r.h[1]) >> (16 * (kk & 1)); /* scales 2 kk, 2 kk + 1 of the half */
            isum += (int8_t)(sc & 0xff) * d0 + (int8_t)(sc >> 8 & 0xff) * d1;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 2; j++) { /* sub-block s = 2c + j: nibble j */
            int s = 2 * c + j, sh = 8 * (s & 3), sc, mn;
            uint32_t a = r.h[1] >> sh & 0xff, b = r.h[2] >> sh & 0xff, e = r.h[3] >> sh & 0xff;
            if (s < 4)
                sc = a & 63, mn = b & 63;
            else
                sc = (e & 0x0f) | ((a >> 2) & 0x30), mn = (e >> 4) | ((b >> 2) & 0x30);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t v = (r.q[k] >> (4 * j)) & 0x0f0f0f0fu;
                if (T == PS_TYPE_Q5_K) v |= ((r.e[k] >> s) & 0x01010101u) << 4;
                w[k] = (int)v;
            }
            isum += sc * dot32(w, x, s);
            imin += mn * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
        }
    }
    for (int o = 2; o; o >>= 1) {
        isum += __shfl_xor_sync(FULL, isum, o, 4);
        if (T != PS_TYPE_Q6_K) imin += __shfl_xor_sync(FULL, imin, o, 4);
    }
    if (T == PS_TYPE_Q6_K) return (f16_bits(r.h[2] & 0xffff) * x->d) * (float)isum;
    return (f16_bits(r.h[0] & 0xffff) * x->d) * (float)isum - (f16_bits(r.h[0] >> 16) * x->d) * (float)imin;
}

/* Y[t * ys + r] for rows r of W (row_bytes apart) and tokens t < nt of X (x_row bytes apart,
 * n_units blocks each). A thread block takes MM_R rows, a warp each, and TT tokens, and the
 * rows' blocks in chunks of `chunk`: first each warp computes its row's terms for the TT
 * tokens into shared memory (lane l the blocks l, l + 32, ...: a warp's loads are 32
 * consecutive blocks; a K type's super-block takes 8 lanes), MM_U blocks' loads out at a
 * time, then thread (r, t) adds its terms in block order. With few tokens (mm_xs) the
 * chunk's activations are first copied to shared memory. Grid: (the group's blocks,
 * nt / TT), MM_THREADS threads, mm_smem<T, TT>(chunk) bytes of shared memory. */
#define MM_R       8
#define MM_THREADS (MM_R * 32)
#define MM_U       4 /* a lane's units per step */

template <int T> __host__ __device__ constexpr int mm_stride(int chunk) { return chunk * wtype<T>::terms + 1; }
template <int T, int TT> __host__ __device__ constexpr bool mm_xs() { return !wtype<T>::k && TT <= 8; }

/* Matrices of one type and width that one launch computes (the grid's x blocks in turn). */
#define MM_GROUP 3
struct mm_group {
    int n;
    const uint8_t *W[MM_GROUP];
    float *Y[MM_GROUP];
    long long ys[MM_GROUP];
    int rows[MM_GROUP], blocks[MM_GROUP]; /* blocks: rows / MM_R, rounded up */
};

/* The matrix of a group that thread block blockIdx.x works on, and the block's index within
 * it: by selects, not an index (that would copy grp to the stack). */
struct mm_one {
    const uint8_t *W;
    float *Y;
    long long ys;
    int rows, bx, nbx; /* nbx: the matrix's thread blocks */
};
__device__ __forceinline__ mm_one mm_pick(const mm_group &grp) {
    int bx = blockIdx.x, mi = 0;
    if (grp.n > 1 && bx >= grp.blocks[0]) bx -= grp.blocks[0], mi = 1;
    if (grp.n > 2 && mi == 1 && bx >= grp.blocks[1]) bx -= grp.blocks[1], mi = 2;
    return {mi == 0   ? grp.W[0]
            : mi == 1 ? grp.W[1]
                      : grp.W[2],
            mi == 0   ? grp.Y[0]
            : mi == 1 ? grp.Y[1]
                      : grp.Y[2],
            mi == 0   ? grp.ys[0]
            : mi == 1 ? grp.ys[1]
                      : grp.ys[2],
            mi == 0   ? grp.rows[0]
            : mi == 1 ? grp.rows[1]
                      : grp.rows[2],
            bx,
            mi == 0   ? grp.blocks[0]
            : mi == 1 ? grp.blocks[1]
                      : grp.blocks[2]};
}

template <int T, int TT>
__global__ void __launch_bounds__(MM_THREADS, 4)
    k_mm_q(mm_group grp, size_t row_bytes, int n_units, int chunk, const uint8_t *X, size_t x_row, int nt) {
    typedef wtype<T> ty;
    int bx = blockIdx.x, mi = 0; /* the matrix: selects (mm_pick's: through it the K types spill more here) */
    if (grp.n > 1 && bx >= grp.blocks[0]) bx -= grp.blocks[0], mi = 1;
    if (grp.n > 2 && mi == 1 && bx >= grp.blocks[1]) bx -= grp.blocks[1], mi = 2;
    const uint8_t *W = mi == 0 ? grp.W[0] : mi == 1 ? grp.W[1] : grp.W[2];
    float *Y = mi == 0 ? grp.Y[0] : mi == 1 ? grp.Y[1] : grp.Y[2];
    long long ys = mi == 0 ? grp.ys[0] : mi == 1 ? grp.ys[1] : grp.ys[2];
    int rows = mi == 0 ? grp.rows[0] : mi == 1 ? grp.rows[1] : grp.rows[2];
    constexpr bool XS = mm_xs<T, TT>();
    constexpr int PU = ty::k ? 8 : 1, STEP = 32 / PU; /* lanes per unit, units per warp */
    constexpr int XB = ty::k ? (int)sizeof(ps_block_q8_K) : (int)sizeof(ps_xq32);
    extern __shared__ float terms[]; /* [MM_R * TT][mm_stride(chunk)], then (XS) the activations */
    int *xs = (int *)(terms + MM_R * TT * mm_stride<T>(chunk)); /* [TT][nc] ps_xq32 blocks as ints */
    const int stride = mm_stride<T>(chunk);
    int r0 = bx * MM_R, t0 = blockIdx.y * TT, tt = min(TT, nt - t0), nr = min(MM_R, rows - r0);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, sub = lane % PU, cr = tid / TT, ct = tid % TT;
    bool live = warp < nr, chain = tid < MM_R * TT && cr < nr && ct < tt;
    const uint8_t *row = W + (size_t)(r0 + (live ? warp : 0)) * row_bytes;
    float *mine = terms + (size_t)warp * TT * stride;
    float sum = 0.0f;
    for (int c0 = 0; c0 < n_units; c0 += chunk) {
        int nc = min(chunk, n_units - c0);
        for (int j0 = 0; j0 < nc; j0 += STEP * MM_U) { /* the same trips in every warp (shuffles, barrier) */
            wunit wu[MM_U];
            wraw wr[MM_U];
#pragma unroll
            for (int k = 0; k < MM_U; k++) { /* the loads of MM_U units go out together */
                int u = j0 + k * STEP + lane / PU;
                bool on = live && u < nc;
                if (ty::k) {
                    wu[k] = wunit{};
                    if (on) load_k<T>(row + (size_t)(c0 + u) * ty::stride, sub, wu[k]);
                } else if (on) {
                    load_split<T>(row, n_units, c0 + u, wr[k]);
                }
            }
            if (XS && j0 == 0) { /* the activations, while the weights are on their way */
                for (int t = 0; t < tt; t++)
                    copy_to_shared(xs + t * nc * XB / 4, X + (size_t)(t0 + t) * x_row + (size_t)c0 * XB, nc * XB, tid,
                                   MM_THREADS);
                __syncthreads();
            }
#pragma unroll
            for (int k = 0; k < MM_U; k++) {
                int u = j0 + k * STEP + lane / PU;
                bool on = live && u < nc;
                float *out = mine + (on ? u : 0) * ty::terms;
                if (ty::k) { /* every lane: term_k's shuffles */
                    for (int t = 0; t < tt; t++) {
                        const uint8_t *xb = X + (size_t)(t0 + t) * x_row + (size_t)(c0 + (on ? u : 0)) * XB;
                        float a = term_k<T>(wu[k], (const ps_block_q8_K *)xb, sub);
                        if (on && sub == 0) out[t * stride] = a;
                    }
                } else if (on) {
                    wunit w;
                    unpack<T>(wr[k], w);
                    for (int t = 0; t < tt; t++) {
                        const ps_xq32 *x = XS ? (const ps_xq32 *)(xs + (t * nc + u) * (XB / 4))
                                              : (const ps_xq32 *)(X + (size_t)(t0 + t) * x_row + (size_t)(c0 + u) * XB);
                        float a, m;
                        term32<T>(w, x, &a, &m);
                        out[t * stride] = a;
                        if (ty::terms == 2) out[t * stride + 1] = m;
                    }
                }
            }
        }
        __syncthreads();
        if (chain) { /* the terms in order, the next eight loaded while eight are added */
            const float *p = terms + (size_t)(cr * TT + ct) * stride;
            int n = nc * ty::terms, j = 0;
            float v[8], w[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = k < n ? p[k] : 0.0f;
            for (; j + 8 <= n; j += 8) {
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = j + 8 + k < n ? p[j + 8 + k] : 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) sum += v[k];
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = w[k];
            }
#pragma unroll
            for (int k = 0; k < 8; k++) /* the last n % 8 */
                if (j + k < n) sum += v[k];
        }
        __syncthreads();
    }
    if (chain) Y[(size_t)(t0 + ct) * ys + r0 + cr] = sum;
}

/* The chunk of blocks k_mm_q<T, TT> takes at a time within MM_SMEM bytes of shared memory,
 * and the bytes it then uses. */
#define MM_SMEM (48 * 1024)
template <int T, int TT> static int mm_chunk(int n_units) {
    int c = (MM_SMEM / 4 - MM_R * TT) / (MM_R * TT * wtype<T>::terms + (mm_xs<T, TT>() ? TT * 10 : 0));
    return c < n_units ? c : n_units;
}
template <int T, int TT> static size_t mm_smem(int chunk) {
    return ((size_t)MM_R * TT * mm_stride<T>(chunk) + (mm_xs<T, TT>() ? (size_t)TT * 10 * chunk : 0)) * 4;
}

/* Where key/value head kvh of position p lives in a layer's pool (forward.c's kv_at). */
__device__ __forceinline__ size_t kv_at(const int32_t *tab, int n_head_kv, int hd, int kvh, int p) {
    return (((size_t)tab[p / PS_KV_BLOCK] * n_head_kv + (size_t)kvh) * PS_KV_BLOCK + (size_t)(p % PS_KV_BLOCK)) *
           (size_t)hd;
}

/* The chunk's rows: position and block table (an offset into tabs) of each. */
struct rows_info {
    const int32_t *pos, *tab_off, *tabs;
    const int32_t *fresh; /* row r's sequence's first position this chunk writes (its cache is older below) */
};

struct qk_args {
    float *q, *k, *v;             /* (n, q_dim), (n, kv_dim), (n, kv_dim) */
    const float *bq, *bk, *bv;    /* biases or NULL */
    const float *q_norm, *k_norm; /* per-head norms or NULL */
    const float *rope;            /* (n_ctx, rope_dim) cos/sin */
    float *kc, *vc;               /* this layer's cache */
    int n_head, n_head_kv, hd, rope_dim, neox;
    float eps;
};

/* k_qk's work done by decode's q/k/v matmul as it finishes each row (k_mv<T, G, MV_QK>), for
 * a llama (pairs of adjacent elements rotated, no per-head norms): row of q, k or v (which
 * one: by its output Y) gets its bias, q's and k's pairs their rotation, k's and v's rows go
 * into the cache. The partner of a pair is the row L lanes away (a warp's rows come in
 * pairs); every lane of the warp calls it, the writer lane of a live row stores. The same
 * operations as k_qk's. */
template <int L>
__device__ __forceinline__ void qk_row(const qk_args &a, rows_info ri, float *Y, int row, bool live, bool writer,
                                       float sum) {
    int which = Y == a.q ? 0 : Y == a.k ? 1 : 2, hd = a.hd, i = row % hd;
    const float *bias = which == 0 ? a.bq : which == 1 ? a.bk : a.bv;
    if (bias && live) sum += bias[row];
    float other = __shfl_xor_sync(FULL, sum, L);
    int pos = ri.pos[0];
    if (which < 2 && i < a.rope_dim) {
        const float *cs = a.rope + (size_t)pos * a.rope_dim + (i & ~1);
        float c = cs[0], s = cs[1], x0 = i & 1 ? other : sum, x1 = i & 1 ? sum : other;
        sum = i & 1 ? x0 * s + x1 * c : x0 * c - x1 * s;
    }
    if (!live || !writer) return;
    Y[row] = sum;
    if (which) (which == 1 ? a.kc : a.vc)[kv_at(ri.tabs + ri.tab_off[0], a.n_head_kv, hd, row / hd, pos) + i] = sum;
}

/* Decode's gate/up matmul with the SwiGLU as its epilogue (k_mv<T, G, MV_SWIGLU>): the two
 * matrices walked as one of interleaved rows (gate row r is row 2r, up's 2r + 1, the partner
 * L lanes away), the gate's writer lane storing ps_swiglu(gate, up) into Y[r]; where xq is
 * given, the last warp to finish a block of 32 such rows (count: arrivals, zero between
 * launches) quantizes it, as k_swiglu does. */
struct mv_ffn {
    ps_xq32 *xq;
    unsigned *count; /* (rows / 32) */
};
template <int L>
__device__ __forceinline__ void swiglu_rows(const mv_ffn &f, float *Y, int row, bool live, bool writer, float sum) {
    float up = __shfl_xor_sync(FULL, sum, L);
    if (live && writer && !(row & 1)) Y[row >> 1] = ps_swiglu(sum, up);
    if (!f.xq) return;
    constexpr int per_set = 16 / L, arrivals = 32 / per_set; /* a set's rows of Y; a block's sets */
    int b = (row >> 1) / 32, lane = threadIdx.x & 31;
    __threadfence(); /* the rows stored before the count (threadFenceReduction's order) */
    __syncwarp();
    unsigned n = 0;
    if (lane == 0) n = atomicAdd(f.count + b, 1u);
    if (__shfl_sync(FULL, n, 0) != arrivals - 1) return;
    __threadfence();
    quant_warp(__ldcg(Y + (size_t)b * 32 + lane), f.xq + b);
    if (lane == 0) f.count[b] = 0;
}

/* ---------------------------------------------------------------------------------------
 * Decode's matmul (one token): Y[r] for the rows of the group's matrices. A warp takes
 * 32 / G rows of a split type at a time, G lanes a row, and walks them from the first block
 * to the last, G * mv_u blocks a step (lane s of a row the blocks s, s + G, ...: a row's
 * lanes read G consecutive blocks at a time); each block's terms go round the row's lanes
 * by shuffles, so that every lane adds them in block order, as q8_ref.c does. A K type:
 * 4 lanes a super-block, two sub-blocks each (term_kquad gives each of them the term), G / 4
 * super-blocks of a row side by side, their terms passed round the row's lanes in order;
 * G / 4 * mv_u super-blocks a step. Then the warp takes the rows as many warps further on as the matrix
 * has (one wave of thread blocks, no tail). The next step's weights are on their way while
 * a step is worked, across rows too; the token's activations wait in shared memory. Grid:
 * (the group's blocks), MV_THREADS threads, mv_smem(wtype<T>::k, units) bytes of shared memory. */
#define MV_WARPS     4
#define MV_THREADS   (MV_WARPS * 32)
#define MV_MIN_UNITS 8
#define MV_SMEM      (40 * 1024)

template <int T> __host__ __device__ constexpr int mv_u() { return wtype<T>::k ? 2 : 4; } /* blocks a lane a step */
/* The most lanes a row: 32-element blocks lost at 32 (8B Q4_0 357 -> 346); the K types take
 * 32 where rows are few (8B Q6_K 231 against 228 at 16 at most, docs/bench/2026-12-03-cuda-mvs.md). */
template <int T> __host__ __device__ constexpr int mv_max_lanes() { return wtype<T>::k ? 32 : 16; }
/* Units a row's G lanes take side by side (a K type's super-block takes 4 lanes: kquad). */
template <int T, int G> __host__ __device__ constexpr int mv_p() { return wtype<T>::k ? G / 4 : G; }
static inline size_t mv_smem(bool k_type, int units) { /* the token's activations */
    return (size_t)units * (k_type ? sizeof(ps_block_q8_K) : sizeof(ps_xq32));
}

template <int T> using mv_raw = typename std::conditional<wtype<T>::k, kquad<T>, wraw>::type;

/* The weights of a step from block u0 of a row (none when !live): lane sub of the row's G
 * takes blocks u0 + k * G + sub, or quarter sub % 4 of super-blocks u0 + k * G / 4 + sub / 4. */
template <int T, int G>
__device__ __forceinline__ void mv_load(const uint8_t *row, int units, int u0, int sub, bool live,
                                        mv_raw<T> (&r)[mv_u<T>()]) {
#pragma unroll
    for (int k = 0; k < mv_u<T>(); k++) {
        int u = u0 + k * mv_p<T, G>() + (wtype<T>::k ? sub / 4 : sub);
        if (!live || u >= units) continue;
        if constexpr (wtype<T>::k)
            load_kquad<T>(row + (size_t)u * wtype<T>::stride, sub % 4, r[k]);
        else
            load_split<T>(row, units, u, r[k]);
    }
}

enum { MV_PLAIN, MV_QK, MV_SWIGLU }; /* k_mv's epilogues */
template <int T, int G, int MODE>
__global__ void __launch_bounds__(MV_THREADS)
    k_mv(mm_group grp, size_t row_bytes, int units, const uint8_t *__restrict__ X, qk_args qk, rows_info ri,
         mv_ffn ffn) {
    typedef wtype<T> ty;
    constexpr int U = mv_u<T>(), L = G, P = mv_p<T, G>(), STEP = U * P; /* L: lanes a row */
    constexpr int XB = ty::k ? (int)sizeof(ps_block_q8_K) : (int)sizeof(ps_xq32);
    extern __shared__ int xs[];
    mm_one m = mm_pick(grp);
    int lane = threadIdx.x & 31, sub = lane % L, n_sets = (m.rows + 32 / L - 1) / (32 / L);
    int set = m.bx * MV_WARPS + threadIdx.x / 32, stride = m.nbx * MV_WARPS; /* sets of 32 / L rows */
    auto row_of = [&](int st) { return st * (32 / L) + lane / L; };
    auto row_ptr = [&](int r) {
        r = r < m.rows ? r : 0;
        if constexpr (MODE == MV_SWIGLU) return (r & 1 ? grp.W[1] : grp.W[0]) + (size_t)(r >> 1) * row_bytes;
        return m.W + (size_t)r * row_bytes;
    };
    mv_raw<T> ra[U], rb[U]; /* two steps' weights: arrays indexed by constants only */
    if (set < n_sets) mv_load<T, G>(row_ptr(row_of(set)), units, 0, sub, row_of(set) < m.rows, ra);
    pdl_wait(); /* the activations are the kernel before's */
    copy_to_shared(xs, X, units * XB, threadIdx.x, MV_THREADS);
    __syncthreads();
    float sum = 0.0f;
    /* step (st, u0): this step's weights in raw, the next one's loaded into next */
    auto step = [&](int &st, int &u0, const mv_raw<T>(&raw)[U], mv_raw<T>(&next)[U]) {
        int nst = u0 + STEP < units ? st : st + stride, nu0 = u0 + STEP < units ? u0 + STEP : 0;
        if (nst < n_sets) mv_load<T, G>(row_ptr(row_of(nst)), units, nu0, sub, row_of(nst) < m.rows, next);
        int row = row_of(st);
        bool live = row < m.rows;
#pragma unroll
        for (int k = 0; k < U; k++) {
            if constexpr (ty::k) { /* every lane of 4: term_kquad's shuffles; then the P super-blocks in order */
                int u = u0 + k * P + sub / 4;
                float a = term_kquad<T>(raw[k], (const ps_block_q8_K *)xs + (u < units ? u : 0), sub % 4);
                a = live && u < units ? a : 0.0f; /* (raw not loaded) */
#pragma unroll
                for (int p = 0; p < P; p++) {
                    float ap = P == 1 ? a : __shfl_sync(FULL, a, 4 * p, G);
                    if (u0 + k * P + p < units) sum += ap;
                }
            } else {
                wunit wu = {};
                int u = u0 + k * G + sub;
                float a, c;
                raw_terms<T>(raw[k], (const ps_xq32 *)xs + u, live && u < units, wu, &a, &c);
#pragma unroll
                for (int i = 0; i < G; i++) { /* block u0 + k * G + i, from the row's lane i */
                    float ai = __shfl_sync(FULL, a, i, G), ci = ty::terms == 2 ? __shfl_sync(FULL, c, i, G) : 0.0f;
                    if (u0 + k * G + i < units) {
                        sum += ai;
                        if (ty::terms == 2) sum += ci;
                    }
                }
            }
        }
        if (nu0 == 0) { /* the rows' last step */
            if constexpr (MODE == MV_QK)
                qk_row<L>(qk, ri, m.Y, row, live, sub == 0, sum);
            else if constexpr (MODE == MV_SWIGLU)
                swiglu_rows<L>(ffn, m.Y, row, live, sub == 0, sum);
            else if (live && sub == 0)
                m.Y[row] = sum;
            sum = 0.0f;
        }
        st = nst, u0 = nu0;
    };
    for (int st = set, u0 = 0; st < n_sets;) {
        step(st, u0, ra, rb);
        if (st < n_sets) step(st, u0, rb, ra);
    }
}

/* Decode's matmul for the matrices with few rows (a split type but Q8_0): k_mv at 16 lanes a
 * row spends its time passing terms round by shuffles and adding every term in every lane.
 * Here a thread block takes MVS_R rows and walks them in slices of MVS_S blocks: compute warp
 * w makes rows 2w and 2w + 1's terms as k_mv<T, 16> would (lane s the blocks s, s + 16, ...;
 * 16-byte loads, the next slice's on their way) and writes them to shared memory; after one
 * barrier, lane r of the last warp (which reads no weights) adds row r's terms in block order:
 * k_mv's chain, each term added once, while the compute warps make the next slice's (two
 * buffers). Then the plain epilogue or k_qk's (qk_row, the partner row one lane away). Grid:
 * rows / MVS_R, MVS_THREADS threads, mvs_smem<T>(units) bytes of shared memory.
 * Measured on the H200 (docs/bench/2026-12-03-cuda-mvs.md): the 8B's decode +4.5 % (Q4_0) to
 * +12 % (Q4_1); Q8_0's 34-byte blocks already keep k_mv's lanes busy, and k_mvs loses 6 %. */
#define MVS_R       16
#define MVS_S       64 /* 16 lanes × mv_u blocks */
#define MVS_THREADS ((MVS_R / 2 + 1) * 32)
#define MVS_SMEM    (48 * 1024) /* a launch's shared memory without opting in */
template <int T> __host__ __device__ constexpr bool mvs_type() { return split_type(T) && T != PS_TYPE_Q8_0; }
template <int T> __host__ __device__ constexpr int mvs_stride() { return MVS_S * wtype<T>::terms + 1; } /* odd */
template <int T> static size_t mvs_smem(int units) {
    return (size_t)2 * MVS_R * mvs_stride<T>() * 4 + (size_t)units * sizeof(ps_xq32);
}

/* Thread blocks a multiprocessor keeps (72 registers a thread): three, for the 8B's 384
 * blocks of q/k/v in one wave (+3 % decode, 8B Q4_0); Q5_0 and Q5_1 would spill there. */
template <int T> __host__ __device__ constexpr int mvs_blocks() {
    return T == PS_TYPE_Q5_0 || T == PS_TYPE_Q5_1 ? 2 : 3;
}

template <int T, int MODE>
__global__ void __launch_bounds__(MVS_THREADS, mvs_blocks<T>())
    k_mvs(mm_group grp, size_t row_bytes, int units, const uint8_t *__restrict__ X, qk_args qk, rows_info ri) {
    typedef wtype<T> ty;
    constexpr int U = mv_u<T>(), G = 16, TS = mvs_stride<T>();
    static_assert(U * G == MVS_S, "a slice is one step of 16 lanes");
    extern __shared__ float terms[]; /* [2][MVS_R][TS], then the activations */
    ps_xq32 *xs = (ps_xq32 *)(terms + 2 * MVS_R * TS);
    mm_one m = mm_pick(grp);
    int lane = threadIdx.x & 31, sub = lane % G, n_slices = (units + MVS_S - 1) / MVS_S;
    bool adder = threadIdx.x / 32 == MVS_THREADS / 32 - 1;
    int r = adder ? lane % MVS_R : threadIdx.x / 32 * 2 + lane / G; /* the row this lane works for */
    int row = m.bx * MVS_R + r;
    bool live = row < m.rows && !(adder && lane >= MVS_R);
    const uint8_t *w = m.W + (size_t)(live ? row : 0) * row_bytes;
    wraw ra[U], rb[U];
    if (!adder) mv_load<T, G>(w, units, 0, sub, live, ra);
    pdl_wait(); /* the activations are the kernel before's */
    copy_to_shared((int *)xs, X, units * (int)sizeof(ps_xq32), threadIdx.x, MVS_THREADS);
    __syncthreads();
    float sum = 0.0f; /* the adder's: row r's chain */
    auto slice = [&](int sl, const wraw(&raw)[U], wraw(&next)[U]) {
        int u0 = sl * MVS_S;
        float *t = terms + (sl & 1) * MVS_R * TS + r * TS;
        if (!adder) {
            if (sl + 1 < n_slices) mv_load<T, G>(w, units, u0 + MVS_S, sub, live, next);
#pragma unroll
            for (int k = 0; k < U; k++) {
                int u = u0 + k * G + sub;
                float a, c;
                wunit wu;
                raw_terms<T>(raw[k], xs + u, live && u < units, wu, &a, &c);
                t[(k * G + sub) * ty::terms] = a;
                if (ty::terms == 2) t[(k * G + sub) * 2 + 1] = c;
            }
        }
        __syncthreads(); /* this slice's terms made; the adder is done with the buffer's last */
        if (!adder) return;
        int nb = units - u0 < MVS_S ? units - u0 : MVS_S;
        for (int b = 0; b < nb * ty::terms; b++) sum += t[b];
        if (sl < n_slices - 1) return;
        if constexpr (MODE == MV_QK)
            qk_row<1>(qk, ri, m.Y, row, live, true, sum);
        else if (live)
            m.Y[row] = sum;
    };
    for (int sl = 0; sl < n_slices; sl += 2) {
        slice(sl, ra, rb);
        if (sl + 1 < n_slices) slice(sl + 1, rb, ra);
    }
}

/* ---------------------------------------------------------------------------------------
 * Prefill matmuls on the tensor cores (split types). mma.sync.m16n8k32 gives a 32-element
 * block's exact integer dot products for 16 rows × 8 tokens at once, and the lane that
 * holds a (row, token) pair's dot adds its float term(s) in block order, as k_mm_q's chain
 * does: the same bits. A thread block takes MMA_M rows (16 a warp) and N tokens (MMA_N, or
 * 32 where MMA_N would leave multiprocessors without a block); the
 * rows' quants and heads and the tokens' blocks come MMA_CH blocks at a time through shared
 * memory (asynchronous copies, two stages). Grid: (the group's tiles of MMA_M rows,
 * nt / MMA_N), MMA_THREADS threads, mma_tile<T>::smem bytes of shared memory. */
#define MMA_WARPS   8 /* 4: 8B Q4_0 pp512 17 % slower (1B 4 %) */
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_M       (16 * MMA_WARPS)
#define MMA_N       64
#define MMA_CH      8  /* blocks a stage (4, 3 CTAs a multiprocessor: 4 % slower, 2026-12-05) */
#define MMA_MIN     16 /* the fewest tokens that take it */

/* Bytes of a row's (or token's) share of a stage in shared memory: 16-byte aligned, and 4
 * times an odd number of words apart, so that a lane group's 4 words of 8 rows (tokens)
 * fall in 32 different banks. */
__host__ __device__ constexpr int mma_pad(int bytes) {
    int words = (bytes + 15) / 16 * 4;
    return (words % 8 ? words : words + 4) * 4;
}

/* A stage: each row's quants, heads, each token's blocks. */
template <int T, int N = MMA_N> struct mma_tile {
    static constexpr int a = mma_pad(MMA_CH * wtype<T>::quant), h = (MMA_CH * wtype<T>::head + 15) & ~15;
    /* the heads' copies: 16 bytes where a stage's heads are a multiple of 16, else 8 or 4 */
    static constexpr int hu = (MMA_CH * wtype<T>::head) % 16 == 0 ? 16 : (MMA_CH * wtype<T>::head) % 8 == 0 ? 8 : 4;
    static constexpr int b = mma_pad(MMA_CH * (int)sizeof(ps_xq32));
    static constexpr int stage = MMA_M * (a + h) + N * b, smem = 2 * stage;
};

/* d = c + the int8 products of A (16 × 32: a0, a2 row g's elements 4q.. and 16 + 4q.., a1,
 * a3 row g + 8's) and B (32 × 8: b0, b1 token g's); d0, d1 row g's tokens 2q, 2q + 1, d2, d3
 * row g + 8's (lane = 4g + q). Exact. */
__device__ __forceinline__ void mma_s8(int d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1, const int c[4] = nullptr) {
    int c0 = c ? c[0] : 0, c1 = c ? c[1] : 0, c2 = c ? c[2] : 0, c3 = c ? c[3] : 0;
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}

/* (float)v for |v| < 2^22 (a block's dot, an activation block's sum), exactly, by the
 * integer and float pipes rather than the slower conversion unit: 1.5 * 2^23 + v is a float
 * whose last mantissa bit is worth 1. */
__device__ __forceinline__ float small_float(int v) { return __int_as_float(0x4b400000 + v) - 12582912.0f; }

/* A lane's results (acc[i]: rows row, row + 8 × tokens tok + 8 i, + 1; N tokens) into Y. */
template <int N = MMA_N>
__device__ __forceinline__ void mma_store(const float (*acc)[4], float *Y, long long ys, int rows, int row, int tok,
                                          int nt) {
#pragma unroll
    for (int i = 0; i < N / 8; i++)
        for (int k = 0; k < 4; k++) {
            int r = row + (k >> 1) * 8, t = tok + 8 * i + (k & 1);
            if (r < rows && t < nt) Y[(size_t)t * ys + r] = acc[i][k];
        }
}

/* Elements 4q..4q+3 (lo) and 16+4q.. (hi) of block j of a row's quants qa and heads ha in
 * shared memory, as signed bytes whose dot with x's is term32's dot (Q4_0's q - 8 and
 * Q5_0's q - 16 fold in its minus 8 or 16 times x's sum). */
template <int T>
__device__ __forceinline__ void mma_a(const uint8_t *qa, const uint8_t *ha, int j, int q, uint32_t &lo, uint32_t &hi) {
    typedef wtype<T> ty;
    if (T == PS_TYPE_Q8_0) {
        lo = ld32(qa + 32 * j + 4 * q), hi = ld32(qa + 32 * j + 16 + 4 * q);
        return;
    }
    uint32_t u = ld32(qa + 16 * j + 4 * q);
    lo = u & 0x0f0f0f0fu, hi = (u >> 4) & 0x0f0f0f0fu;
    if (T == PS_TYPE_Q5_0 || T == PS_TYPE_Q5_1) {
        uint32_t h = T == PS_TYPE_Q5_0 ? ld2x16(ha + ty::head * j + 2) : ld32(ha + ty::head * j + 4);
        lo |= spread4(h >> (4 * q)) << 4;
        hi |= spread4(h >> (16 + 4 * q)) << 4;
    }
    if (T == PS_TYPE_Q4_0) lo = __vsub4(lo, 0x08080808u), hi = __vsub4(hi, 0x08080808u);
    if (T == PS_TYPE_Q5_0) lo = __vsub4(lo, 0x10101010u), hi = __vsub4(hi, 0x10101010u);
}

/* Starts the asynchronous copies of n rows of pieces U-byte pieces each: piece k of row r from
 * src(r) + U k to dst + r · stride + U k, shared among the block's THREADS threads (the
 * (row, piece) pair stepped without dividing). */
template <int U, int THREADS, typename S>
__device__ __forceinline__ void copy_pieces(uint8_t *dst, int stride, int n, int pieces, S src) {
    if (pieces <= 0) return;
    int dr = THREADS / pieces, dk = THREADS % pieces, r = threadIdx.x / pieces, k = threadIdx.x % pieces;
    for (; r < n; r += dr, k += dk) {
        if (k >= pieces) r++, k -= pieces;
        if (r >= n) break;
        __pipeline_memcpy_async(dst + r * stride + U * k, src(r) + U * k, U);
    }
}

template <int T, int N>
__global__ void __launch_bounds__(MMA_THREADS)
    k_mm_mma(mm_group grp, size_t row_bytes, int n_units, const uint8_t *X, size_t x_row, int nt) {
    typedef wtype<T> ty;
    typedef mma_tile<T, N> tl;
    mm_one mo = mm_pick(grp);
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
    const int r0 = mo.bx * MMA_M, t0 = blockIdx.y * N, XB = (int)sizeof(ps_xq32);
    const size_t heads = (size_t)n_units * ty::quant; /* where a row's heads start */
    const bool x16 = (x_row | (size_t)X) % 16 == 0 && MMA_CH * XB % 16 == 0 && n_units % MMA_CH % 2 == 0;
    /* chunk c (blocks c * MMA_CH ..) into stage c & 1: rows and tokens past the end repeat the
     * last (their results are not stored) */
    auto load = [&](int c) {
        uint8_t *A = sm + (c & 1) * tl::stage, *H = A + MMA_M * tl::a, *B = H + MMA_M * tl::h;
        int c0 = c * MMA_CH, nc = min(MMA_CH, n_units - c0);
        auto w_row = [&](int r) { return mo.W + (size_t)min(r0 + r, mo.rows - 1) * row_bytes; };
        auto x_tok = [&](int t) { return X + (size_t)min(t0 + t, nt - 1) * x_row + (size_t)c0 * XB; };
        copy_pieces<16, MMA_THREADS>(A, tl::a, MMA_M, nc * ty::quant / 16,
                                     [&](int r) { return w_row(r) + (size_t)c0 * ty::quant; });
        copy_pieces<tl::hu, MMA_THREADS>(H, tl::h, MMA_M, (nc * ty::head + tl::hu - 1) / tl::hu,
                                         [&](int r) { return w_row(r) + heads + (size_t)c0 * ty::head; });
        if (x16) /* the tokens' blocks in 16-byte pieces where they allow it */
            copy_pieces<16, MMA_THREADS>(B, tl::b, N, nc * XB / 16, x_tok);
        else
            copy_pieces<8, MMA_THREADS>(B, tl::b, N, nc * XB / 8, x_tok);
        __pipeline_commit();
    };
    float acc[N / 8][4] = {};
    const int n_chunks = (n_units + MMA_CH - 1) / MMA_CH, lo_row = warp * 16 + g;
    load(0);
    for (int c = 0; c < n_chunks; c++) {
        if (c + 1 < n_chunks)
            load(c + 1);
        else
            __pipeline_commit(); /* an empty group: wait_prior(1) below still means chunk c */
        __pipeline_wait_prior(1);
        __syncthreads();
        const uint8_t *A = sm + (c & 1) * tl::stage, *H = A + MMA_M * tl::a, *B = H + MMA_M * tl::h;
        const uint8_t *qa = A + lo_row * tl::a, *ha = H + lo_row * tl::h;
        int nc = min(MMA_CH, n_units - c * MMA_CH);
        for (int j = 0; j < nc; j++) {
            uint32_t a0, a1, a2, a3;
            mma_a<T>(qa, ha, j, q, a0, a2);
            mma_a<T>(qa + 8 * tl::a, ha + 8 * tl::h, j, q, a1, a3);
            float d0 = f16(ha + ty::head * j), d1 = f16(ha + 8 * tl::h + ty::head * j), m0 = 0, m1 = 0;
            if (ty::terms == 2) m0 = f16(ha + ty::head * j + 2), m1 = f16(ha + 8 * tl::h + ty::head * j + 2);
#pragma unroll
            for (int i = 0; i < N / 8; i++) {
                const uint8_t *x0 = B + (8 * i + 2 * q) * tl::b + XB * j;
                const uint8_t *bt = B + (8 * i + g) * tl::b + XB * j;
                int dot[4];
                mma_s8(dot, a0, a1, a2, a3, ld32(bt + 8 + 4 * q), ld32(bt + 24 + 4 * q));
                const ps_xq32 *xa = (const ps_xq32 *)x0, *xb = (const ps_xq32 *)(x0 + tl::b);
                acc[i][0] += (d0 * xa->d) * small_float(dot[0]);
                if (ty::terms == 2) acc[i][0] += m0 * (xa->d * small_float(xa->sum));
                acc[i][1] += (d0 * xb->d) * small_float(dot[1]);
                if (ty::terms == 2) acc[i][1] += m0 * (xb->d * small_float(xb->sum));
                acc[i][2] += (d1 * xa->d) * small_float(dot[2]);
                if (ty::terms == 2) acc[i][2] += m1 * (xa->d * small_float(xa->sum));
                acc[i][3] += (d1 * xb->d) * small_float(dot[3]);
                if (ty::terms == 2) acc[i][3] += m1 * (xb->d * small_float(xb->sum));
            }
        }
        __syncthreads(); /* the stage is free for chunk c + 2 */
    }
    mma_store<N>(acc, mo.Y, mo.ys, mo.rows, r0 + lo_row, t0 + 2 * q, nt);
}

/* The K types on the tensor cores, a super-block a stage: each 32-element sub-block's dot
 * is an mma (Q6_K's two 16-element halves one each), scaled by the sub-block's scale and
 * summed as integers (term_k's isum); the minimums' sum (imin: each sub-block's minimum
 * times its activations' sum) is an mma of the minimums against the same activations,
 * accumulated in the tensor core; then each (row, token) adds term_k's float term. */
#define MMA_KWARPS   4 /* the K kernel's 154 registers a thread */
#define MMA_KTHREADS (MMA_KWARPS * 32)
#define MMA_KM       (16 * MMA_KWARPS)
template <int T> struct mma_ktile {
    static constexpr int a = mma_pad(wtype<T>::stride), b = mma_pad((int)sizeof(ps_block_q8_K));
    static constexpr int stage = MMA_KM * a + MMA_N * b, smem = 2 * stage;
};

/* Sub-block s of a super-block blk in shared memory: elements 4q.. (lo) and 16 + 4q.. (hi),
 * signed; its scale(s) (Q6_K: the halves' sc0, sc1) and minimum (as four equal bytes). */
template <int T>
__device__ __forceinline__ void mma_k_a(const uint8_t *blk, int s, int q, uint32_t &lo, uint32_t &hi, int &sc0,
                                        int &sc1, uint32_t &mn) {
    if (T == PS_TYPE_Q6_K) {
        int h = s >> 2, kk = s & 3;
        const uint8_t *ql = blk + 64 * h + (kk & 1) * 32, *qh = blk + 128 + 32 * h;
        uint32_t v[2];
        for (int k = 0; k < 2; k++) {
            int w = 4 * q + 16 * k;
            v[k] = __vsub4(((ld32(ql + w) >> ((kk >> 1) * 4)) & 0x0f0f0f0fu) |
                               (((ld32(qh + w) >> (2 * kk)) & 0x03030303u) << 4),
                           0x20202020u);
        }
        lo = v[0], hi = v[1];
        sc0 = (int8_t)blk[192 + 2 * s], sc1 = (int8_t)blk[193 + 2 * s];
        return;
    }
    const uint8_t *sc = blk + 4, *qs = blk + (T == PS_TYPE_Q5_K ? 48 : 16), *qh = blk + 16;
    int m;
    if (s < 4)
        sc0 = sc[s] & 63, m = sc[s + 4] & 63;
    else
        sc0 = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 2) & 0x30), m = (sc[s + 4] >> 4) | ((sc[s] >> 2) & 0x30);
    mn = (uint32_t)m * 0x01010101u;
    int shift = (s & 1) * 4;
    lo = (ld32(qs + 32 * (s >> 1) + 4 * q) >> shift) & 0x0f0f0f0fu;
    hi = (ld32(qs + 32 * (s >> 1) + 16 + 4 * q) >> shift) & 0x0f0f0f0fu;
    if (T == PS_TYPE_Q5_K) {
        lo |= ((ld32(qh + 4 * q) >> s) & 0x01010101u) << 4;
        hi |= ((ld32(qh + 16 + 4 * q) >> s) & 0x01010101u) << 4;
    }
}

template <int T>
__global__ void __launch_bounds__(MMA_KTHREADS)
    k_mm_mma_k(mm_group grp, size_t row_bytes, int n_units, const uint8_t *X, size_t x_row, int nt) {
    typedef wtype<T> ty;
    typedef mma_ktile<T> tl;
    mm_one mo = mm_pick(grp);
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
    const int r0 = mo.bx * MMA_KM, t0 = blockIdx.y * MMA_N, XB = (int)sizeof(ps_block_q8_K);
    auto load = [&](int c) { /* super-block c into stage c & 1 (rows, tokens past the end: the last) */
                             uint8_t *A = sm + (c & 1) * tl::stage, *B = A + MMA_KM * tl::a;
                             constexpr int AP = ty::stride % 16 ? ty::stride / 4 : ty::stride / 16,
                                           AB = ty::stride / AP;
                             for (int i = tid; i < MMA_KM * AP; i += MMA_KTHREADS) {
                                 int r = i / AP, k = i - r * AP;
                                 const uint8_t *src = mo.W + (size_t)min(r0 + r, mo.rows - 1) * row_bytes +
                                                      (size_t)c * ty::stride + AB * k;
                                 __pipeline_memcpy_async(A + r * tl::a + AB * k, src, AB);
                             }
                             for (int i = tid; i < MMA_N * (XB / 4); i += MMA_KTHREADS) {
                                 int t = i / (XB / 4), k = i - t * (XB / 4);
                                 const uint8_t *src = X + (size_t)min(t0 + t, nt - 1) * x_row + (size_t)c * XB + 4 * k;
                                 __pipeline_memcpy_async(B + t * tl::b + 4 * k, src, 4);
                             }
                             __pipeline_commit();
    };
    float acc[MMA_N / 8][4] = {};
    const int lo_row = warp * 16 + g;
    load(0);
    for (int c = 0; c < n_units; c++) {
        if (c + 1 < n_units)
            load(c + 1);
        else
            __pipeline_commit();
        __pipeline_wait_prior(1);
        __syncthreads();
        const uint8_t *A = sm + (c & 1) * tl::stage, *B = A + MMA_KM * tl::a;
        const uint8_t *w0 = A + lo_row * tl::a, *w1 = w0 + 8 * tl::a;
        int isum[MMA_N / 8][4] = {}, imin[MMA_N / 8][4] = {};
        for (int s = 0; s < 8; s++) {
            uint32_t a0, a1, a2, a3, m0 = 0, m1 = 0;
            int s00, s01 = 0, s10, s11 = 0;
            mma_k_a<T>(w0, s, q, a0, a2, s00, s01, m0);
            mma_k_a<T>(w1, s, q, a1, a3, s10, s11, m1);
#pragma unroll
            for (int i = 0; i < MMA_N / 8; i++) {
                const uint8_t *bt = B + (8 * i + g) * tl::b + 4 + 32 * s + 4 * q;
                uint32_t b0 = ld32(bt), b1 = ld32(bt + 16);
                int d[4];
                if (T == PS_TYPE_Q6_K) {
                    int e[4];
                    mma_s8(d, a0, a1, 0, 0, b0, 0); /* the first half */
                    mma_s8(e, 0, 0, a2, a3, 0, b1); /* the second half */
                    isum[i][0] += s00 * d[0] + s01 * e[0], isum[i][1] += s00 * d[1] + s01 * e[1];
                    isum[i][2] += s10 * d[2] + s11 * e[2], isum[i][3] += s10 * d[3] + s11 * e[3];
                } else {
                    mma_s8(d, a0, a1, a2, a3, b0, b1);
                    isum[i][0] += s00 * d[0], isum[i][1] += s00 * d[1];
                    isum[i][2] += s10 * d[2], isum[i][3] += s10 * d[3];
                    mma_s8(imin[i], m0, m1, m0, m1, b0, b1, imin[i]);
                }
            }
        }
        float dw0 = f16(w0 + (T == PS_TYPE_Q6_K ? 208 : 0)), dw1 = f16(w1 + (T == PS_TYPE_Q6_K ? 208 : 0));
        float mw0 = T == PS_TYPE_Q6_K ? 0.0f : f16(w0 + 2), mw1 = T == PS_TYPE_Q6_K ? 0.0f : f16(w1 + 2);
#pragma unroll
        for (int i = 0; i < MMA_N / 8; i++) {
            float xd[2] = {*(const float *)(B + (8 * i + 2 * q) * tl::b),
                           *(const float *)(B + (8 * i + 2 * q + 1) * tl::b)};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float dw = k < 2 ? dw0 : dw1, mw = k < 2 ? mw0 : mw1, x = xd[k & 1];
                if (T == PS_TYPE_Q6_K)
                    acc[i][k] += (dw * x) * (float)isum[i][k];
                else
                    acc[i][k] += (dw * x) * (float)isum[i][k] - (mw * x) * (float)imin[i][k];
            }
        }
        __syncthreads(); /* the stage is free for super-block c + 2 */
    }
    mma_store(acc, mo.Y, mo.ys, mo.rows, r0 + lo_row, t0 + 2 * q, nt);
}

/* F32 weights against f32 activations (q8_ref.c's dot_f32): eight partial sums (element j
 * into sum j % 8), combined ((0+4)+(2+6))+((1+5)+(3+7)). A warp takes one row and 4
 * tokens: lane 8g + k holds token g's sum k. */
#define MMF_ROWS 4 /* rows (warps) per thread block */
__global__ void __launch_bounds__(MMF_ROWS * 32)
    k_mm_f(const uint8_t *W, size_t row_bytes, int cols, const float *X, int nt, float *Y, long long ys, int rows) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = blockIdx.x * MMF_ROWS + warp;
    if (row >= rows) return;
    int t = blockIdx.y * 4 + (lane >> 3), k = lane & 7;
    const uint8_t *w = W + (size_t)row * row_bytes;
    float s = 0.0f;
    if (t < nt) {
        const float *x = X + (size_t)t * cols;
        for (int j = k; j < cols; j += 8) s += ((const float *)w)[j] * x[j];
    }
    s += __shfl_down_sync(FULL, s, 4, 8);
    s += __shfl_down_sync(FULL, s, 2, 8);
    s += __shfl_down_sync(FULL, s, 1, 8);
    if (t < nt && k == 0) Y[(size_t)t * ys + row] = s;
}

/* ---------------------------------------------------------------------------------------
 * F16 and BF16 weights on the tensor cores (mma.sync m16n8k16, f32 accumulation). The one
 * place the GPU does not give the CPU's bits: the CPU's eight sequential f32 sums per row
 * (dot_f16) cannot be had from tensor cores, and on CUDA cores prefill would run at a
 * tenth of llama.cpp's at best. What holds instead:
 *  - precision: each activation is split into two halves of the weight's type, x = hi + lo
 *    (halves_row, in the RMSNorm or k_halves), so that W·x is W·hi + W·lo with x kept to
 *    22 (F16) or 16 (BF16) bits; the products are exact in f32, only the order of the f32
 *    sums differs from the CPU's (as the CPU's kernel families differ among themselves).
 *    F16 rows are scaled by a power of two first (exact) so that no half overflows or
 *    loses bits to subnormals.
 *  - batch invariance: a row's K range is dealt in chunks of 64 round the MMH_KS warps of a
 *    thread block, each warp sums its chunks in order, and the warps' sums are added in
 *    warp order: the same operations for a (row, token) whatever the batch, the tile or the
 *    token's place in it. */
#define MMH_KS 8 /* warps a thread block: K-slices */

/* Half activations of n rows of cols floats (activation formats XQ_F16, XQ_BF16): hi and lo
 * (n × hs each, hs = cols rounded up to 64, zeros past cols), then the exponent e of each
 * row's scale (the row was multiplied by 2^-e before splitting; 0 for BF16). */
#define XQ_F16  16
#define XQ_BF16 17
__host__ __device__ constexpr int half_stride(int cols) { return (cols + 63) & ~63; }

struct halves {
    uint16_t *hi, *lo;
    int *ex;
};
__host__ __device__ inline halves halves_at(void *xq, int n, int cols) {
    uint16_t *hi = (uint16_t *)xq, *lo = hi + (size_t)n * half_stride(cols);
    return {hi, lo, (int *)(lo + (size_t)n * half_stride(cols))};
}

template <int T> __device__ __forceinline__ uint16_t to_half(float v) {
    if (T == PS_TYPE_F16) return __half_as_ushort(__float2half_rn(v));
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <int T> __device__ __forceinline__ float from_half(uint16_t h) {
    return T == PS_TYPE_F16 ? f16_bits(h) : __uint_as_float((uint32_t)h << 16);
}

/* Row r of n (xr: cols floats) into the halves at xq. Every thread of the block calls it;
 * wmax: blockDim.x / 32 floats of shared memory. */
template <int T>
__device__ __forceinline__ void halves_row(const float *xr, int cols, int r, int n, void *xq, float *wmax) {
    int tid = threadIdx.x, hs = half_stride(cols);
    halves h = halves_at(xq, n, cols);
    uint16_t *hi = h.hi + (size_t)r * hs, *lo = h.lo + (size_t)r * hs;
    int e = 0;
    if (T == PS_TYPE_F16) { /* the largest |x| to [2^14, 2^15) */
        float m = 0.0f;
        for (int i = tid; i < cols; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
        m = warp_max(m);
        if ((tid & 31) == 0) wmax[tid >> 5] = m;
        __syncthreads();
        m = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) m = fmaxf(m, wmax[w]);
        if (m > 0.0f && isfinite(m)) e = (int)(__float_as_uint(m) >> 23) - 126 - 15; /* m < 2^(e + 15) */
    }
    for (int i = tid; i < hs; i += blockDim.x) {
        float v = i < cols ? ldexpf(xr[i], -e) : 0.0f;
        uint16_t h = to_half<T>(v);
        hi[i] = h, lo[i] = to_half<T>(v - from_half<T>(h));
    }
    if (tid == 0) h.ex[r] = e;
}

/* Rows of floats into halves: a thread block a row. */
#define HALVES_THREADS 1024
template <int T> __global__ void __launch_bounds__(HALVES_THREADS) k_halves(const float *x, int cols, void *xq) {
    __shared__ float wmax[HALVES_THREADS / 32];
    pdl_start();
    pdl_wait();
    halves_row<T>(x + (size_t)blockIdx.x * cols, cols, blockIdx.x, gridDim.x, xq, wmax);
}

template <int T>
__device__ __forceinline__ void mma_h(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
    if (T == PS_TYPE_F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

/* One chunk of 64 for n-tile n of a warp's MT m-tiles: a[m][h][s] holds row (16m + 8h + g)'s
 * elements 8q.. (s = 0) or 32 + 8q.. (s = 1), bh and bl token g's. k_mm_h and k_mm_hp both
 * come here, so that a (row, token)'s MMAs are the same in either. */
template <int T, int MT, int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[MT][NT][4], int n, const uint4 (&a)[MT][2][2],
                                          const uint4 (&bh)[2], const uint4 (&bl)[2]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int s = j >> 1, w = 2 * (j & 1);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            uint32_t a0 = word(a[m][0][s], w), a2 = word(a[m][0][s], w + 1);
            uint32_t a1 = word(a[m][1][s], w), a3 = word(a[m][1][s], w + 1);
            mma_h<T>(acc[m][n], a0, a1, a2, a3, word(bh[s], w), word(bh[s], w + 1));
            mma_h<T>(acc[m][n], a0, a1, a2, a3, word(bl[s], w), word(bl[s], w + 1));
        }
    }
}

/* Y (nt <= 8 tokens, ys apart) = x · Wᵀ for F16 or BF16 W (rows × cols, row_bytes apart, cols
 * % 8 == 0); x as halves_row left it. A thread block: 16 rows; warp w takes the K-chunks w,
 * w + MMH_KS, ..., U of them loaded at once (the first U before it waits for the kernel
 * before: the weights are not that kernel's). Within a chunk of 64, lane (g, q) holds
 * elements 8q..8q+7 and 32+8q.. of rows g and g + 8 and of token g's activations:
 * mma_chunk's mapping. */
#ifndef MMH_U
#define MMH_U 2
#endif
template <int T, int U>
__global__ void __launch_bounds__(MMH_KS * 32)
    k_mm_h(mm_group grp, size_t row_bytes, int cols, const uint16_t *xh, const uint16_t *xl, const int *ex, int nt) {
    __shared__ float part[MMH_KS][16][9];
    mm_one mo = mm_pick(grp);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int r0 = mo.bx * 16, hs = half_stride(cols), chunks = hs / 64;
    float acc[1][1][4] = {};
    const uint4 zero = {0, 0, 0, 0};
    pdl_start();
    for (int c0 = warp; c0 < chunks; c0 += U * MMH_KS) {
        uint4 a[U][1][2][2], bh[U][2], bl[U][2]; /* a: chunk, -, row g / g + 8, elements 8q.. / 32 + 8q.. */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = r0 + 8 * h + g, k = 64 * (c0 + u * MMH_KS) + 8 * q;
                const uint4 *p = (const uint4 *)(mo.W + (size_t)r * row_bytes + 2 * (size_t)k);
                a[u][0][h][0] = r < mo.rows && k < cols ? __ldg(p) : zero;
                a[u][0][h][1] = r < mo.rows && k + 32 < cols ? __ldg(p + 4) : zero;
            }
        if (c0 == warp) pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * MMH_KS;
            bool ok = g < nt && c < chunks;
            const uint4 *h = (const uint4 *)(xh + (size_t)g * hs + 64 * c + 8 * q);
            const uint4 *l = (const uint4 *)(xl + (size_t)g * hs + 64 * c + 8 * q);
            bh[u][0] = ok ? h[0] : zero, bh[u][1] = ok ? h[4] : zero;
            bl[u][0] = ok ? l[0] : zero, bl[u][1] = ok ? l[4] : zero;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + u * MMH_KS >= chunks) break;
            mma_chunk<T, 1, 1>(acc, 0, a[u], bh[u], bl[u]);
        }
    }
    pdl_wait(); /* (for a warp without chunks) before ex and Y */
#pragma unroll
    for (int k = 0; k < 4; k++) part[warp][g + 8 * (k >> 1)][2 * q + (k & 1)] = acc[0][0][k];
    __syncthreads();
    if (threadIdx.x < 16 * 8) {
        int rr = threadIdx.x / 8, t = threadIdx.x % 8, r = r0 + rr;
        float s = part[0][rr][t];
        for (int w = 1; w < MMH_KS; w++) s += part[w][rr][t];
        if (r < mo.rows && t < nt) mo.Y[(size_t)t * mo.ys + r] = ldexpf(s, ex[t]);
    }
}

/* k_mm_h's sums for many tokens, through shared memory: a thread block takes 128 rows × 64
 * tokens, every warp 32 × 32 of them; the chunks of 64 are walked slice by slice (k_mm_h's
 * warp w's chunks w, w + MMH_KS, ..., then w + 1's), each slice's sum added to the total
 * as k_mm_h adds its warps' — the same operations for every (row, token). Chunks reach
 * shared memory by cp.async, MMHP_STAGES ahead; a row's 16-byte pieces p stored at
 * p ^ 4 on odd rows, so that the 8 lanes of a load phase (rows g, g + 1, pieces q) find 8
 * bank groups. */
#define MMHP_M       128
#define MMHP_N       64
#define MMHP_STAGES  3
#define MMHP_STAGE   (MMHP_M * 128 + 2 * MMHP_N * 128)
#define MMHP_SMEM    (MMHP_STAGES * MMHP_STAGE)
#define MMHP_THREADS 256

/* The chunks of slice w among n (k_mm_h's warp w's). */
__device__ __forceinline__ int slice_chunks(int w, int n) { return w < n ? (n - w + MMH_KS - 1) / MMH_KS : 0; }

/* The next step of the slice-by-slice walk: chunk k of slice w, past empty slices. */
__device__ __forceinline__ void next_chunk(int &w, int &k, int n) {
    k++;
    while (w < MMH_KS && k == slice_chunks(w, n)) w++, k = 0;
}

__device__ __forceinline__ uint4 ld_piece(const uint8_t *rows, int r, int p) {
    return *(const uint4 *)(rows + r * 128 + 16 * (p ^ ((r & 1) << 2)));
}

template <int T>
__global__ void __launch_bounds__(MMHP_THREADS)
    k_mm_hp(mm_group grp, size_t row_bytes, int cols, const uint16_t *xh, const uint16_t *xl, const int *ex, int nt) {
    extern __shared__ __align__(16) uint8_t sm[];
    mm_one mo = mm_pick(grp);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    int wm = warp & 3, wn = warp >> 2, r0 = mo.bx * MMHP_M, t0 = blockIdx.y * MMHP_N;
    int hs = half_stride(cols), chunks = hs / 64;
    float acc[2][4][4] = {}, tot[2][4][4];
    pdl_start();
    pdl_wait();
    auto load = [&](int stage, int c) {
        uint8_t *A = sm + stage * MMHP_STAGE, *Bh = A + MMHP_M * 128, *Bl = Bh + MMHP_N * 128;
#pragma unroll
        for (int i = 0; i < MMHP_M * 8 / MMHP_THREADS; i++) {
            int at = tid + MMHP_THREADS * i, r = at >> 3, p = at & 7, k = 64 * c + 8 * p;
            bool ok = r0 + r < mo.rows && k < cols;
            const uint8_t *src = ok ? mo.W + (size_t)(r0 + r) * row_bytes + 2 * (size_t)k : mo.W;
            __pipeline_memcpy_async(A + r * 128 + 16 * (p ^ ((r & 1) << 2)), src, 16, ok ? 0 : 16);
        }
#pragma unroll
        for (int i = 0; i < MMHP_N * 8 / MMHP_THREADS; i++) {
            int at = tid + MMHP_THREADS * i, t = at >> 3, p = at & 7, d = t * 128 + 16 * (p ^ ((t & 1) << 2));
            bool ok = t0 + t < nt;
            size_t from = ok ? (size_t)(t0 + t) * hs + 64 * c + 8 * p : 0;
            __pipeline_memcpy_async(Bh + d, xh + from, 16, ok ? 0 : 16);
            __pipeline_memcpy_async(Bl + d, xl + from, 16, ok ? 0 : 16);
        }
    };
    int lw = 0, lk = 0; /* the loads' walk */
    for (int s = 0; s < MMHP_STAGES - 1; s++) {
        if (lw < MMH_KS) load(s, lw + MMH_KS * lk), next_chunk(lw, lk, chunks);
        __pipeline_commit();
    }
    int cw = 0, ck = 0; /* the sums' walk */
    for (int i = 0; i < chunks; i++) {
        if (lw < MMH_KS) load((i + MMHP_STAGES - 1) % MMHP_STAGES, lw + MMH_KS * lk), next_chunk(lw, lk, chunks);
        __pipeline_commit();
        __pipeline_wait_prior(MMHP_STAGES - 1);
        __syncthreads();
        const uint8_t *A = sm + (i % MMHP_STAGES) * MMHP_STAGE, *Bh = A + MMHP_M * 128, *Bl = Bh + MMHP_N * 128;
        uint4 a[2][2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int s = 0; s < 2; s++) a[m][h][s] = ld_piece(A, 32 * wm + 16 * m + 8 * h + g, 4 * s + q);
#pragma unroll
        for (int n = 0; n < 4; n++) {
            int t = 32 * wn + 8 * n + g;
            uint4 bh[2] = {ld_piece(Bh, t, q), ld_piece(Bh, t, 4 + q)},
                  bl[2] = {ld_piece(Bl, t, q), ld_piece(Bl, t, 4 + q)};
            mma_chunk<T, 2, 4>(acc, n, a, bh, bl);
        }
        int w0 = cw;
        next_chunk(cw, ck, chunks);
        for (int w = w0; w < cw; w++) { /* slices w0 .. cw - 1 ended: the last with chunks, then empty ones */
            float *ac = &acc[0][0][0], *to = &tot[0][0][0];
#pragma unroll
            for (int i = 0; i < 2 * 4 * 4; i++) to[i] = w ? to[i] + ac[i] : ac[i], ac[i] = 0.0f;
        }
        __syncthreads(); /* the stage is free for the load MMHP_STAGES - 1 ahead */
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int r = r0 + 32 * wm + 16 * m + g + 8 * (k >> 1), t = t0 + 32 * wn + 8 * n + 2 * q + (k & 1);
                if (r < mo.rows && t < nt) mo.Y[(size_t)t * mo.ys + r] = ldexpf(tot[m][n][k], ex[t]);
            }
}

/* ---------------------------------------------------------------------------------------
 * Norms, rotation, element-wise steps (forward.c) */

/* Lane l < 16's share of a sum over x[0 .. n - 1] in dot_f32's order: x[l], x[l + 16], ...
 * (squared when SQ) added in turn, eight loaded at a time; 0 in the other lanes. */
template <bool SQ> __device__ __forceinline__ float lane_sum16(const float *x, int n) {
    int l = threadIdx.x & 31, i = l;
    float acc = 0.0f;
    if (l >= 16) return acc;
    for (; i + 16 * 7 < n; i += 16 * 8) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = x[i + 16 * k];
#pragma unroll
        for (int k = 0; k < 8; k++) acc += SQ ? v[k] * v[k] : v[k];
    }
    for (; i < n; i += 16) acc += SQ ? x[i] * x[i] : x[i];
    return acc;
}

/* The sum of x[i]^2 for i < n in dot_f32's order (the 16 lanes, then the tree), in every
 * lane of the warp. */
__device__ __forceinline__ float sumsq16(const float *x, int n) {
    return __shfl_sync(FULL, tree16(lane_sum16<true>(x, n)), 0);
}

#define NORM_THREADS 1024 /* 32 warps quantize the row */

/* k_rmsnorm's shared memory: the row, the weights. */
static inline size_t rmsnorm_smem(int dim) { return (size_t)dim * 8; }

/* forward.c's rmsnorm of row r of x (rows[r], or r) into row r of out, after x += y on it
 * when y is given (the residual add the CPU does before); then the row made into the next
 * matmul's activations in xq: ps_xq32 (fmt 32) or ps_block_q8_K (256) blocks, a warp a
 * block, or the halves (XQ_F16, XQ_BF16). The weights are on their way to shared memory
 * before the kernel before is waited for; the row goes there in one sweep, then 16 threads
 * sum it in dot_f32's order. out may be y only without rows (a thread block then writes
 * just the row it read; with rows, block r would write row r while the block of rows[r'] =
 * r might still read it). Grid: rows, NORM_THREADS threads, rmsnorm_smem(dim) bytes of
 * shared memory. */
__global__ void __launch_bounds__(NORM_THREADS, 1)
    k_rmsnorm(float *__restrict__ x, const float *y, const int32_t *rows, const float *__restrict__ w, float *out,
              int dim, float eps, int fmt, void *xq) {
    extern __shared__ float row[];
    __shared__ float scale;
    float *ws = row + dim;
    int r = blockIdx.x, tid = threadIdx.x;
    pdl_start();
    copy_to_shared_async(ws, w, dim * 4, tid, NORM_THREADS);
    pdl_wait();
    float4 *x4 = (float4 *)(x + (size_t)(rows ? rows[r] : r) * dim);
    const float4 *y4 = y ? (const float4 *)(y + (size_t)(rows ? rows[r] : r) * dim) : NULL;
    for (int i = tid; i < dim / 4; i += NORM_THREADS) { /* dim % 4 == 0: the model's widths are */
        float4 v = x4[i];
        if (y4) {
            float4 u = y4[i];
            v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
            x4[i] = v;
        }
        ((float4 *)row)[i] = v;
    }
    __syncthreads();
    if (tid < 32) {
        float acc = tree16(lane_sum16<true>(row, dim));
        if (tid == 0) scale = 1.0f / sqrtf(acc / (float)dim + eps);
    }
    __pipeline_wait_prior(0); /* the weights */
    __syncthreads();
    for (int i = tid; i < dim; i += NORM_THREADS) out[(size_t)r * dim + i] = row[i] = row[i] * scale * ws[i];
    if (!fmt) return;
    __syncthreads();
    if (fmt == XQ_F16 || fmt == XQ_BF16) {
        __shared__ float wmax[NORM_THREADS / 32];
        if (fmt == XQ_F16)
            halves_row<PS_TYPE_F16>(row, dim, r, gridDim.x, xq, wmax);
        else
            halves_row<PS_TYPE_BF16>(row, dim, r, gridDim.x, xq, wmax);
        return;
    }
    int warp = tid / 32, lane = tid & 31, nb = dim / fmt;
    for (int b = warp; b < nb; b += NORM_THREADS / 32)
        if (fmt == 32)
            quant_warp(row[b * 32 + lane], (ps_xq32 *)xq + (size_t)r * nb + b);
        else
            quant_warp256(row + b * 256, (ps_block_q8_K *)xq + (size_t)r * nb + b);
}

/* attention_block's steps between the qkv matmuls and attention, for one head of one row
 * (grid: rows × (n_head + n_head_kv), one warp): bias, per-head norm, rotation; a key
 * head also writes its key and value into the cache. */
#define QK_PAIRS 4 /* rotated pairs a lane: rope_dim <= head_dim <= 256 */
__global__ void k_qk(qk_args a, rows_info ri) {
    pdl_start();
    int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = a.hd;
    bool isq = h < a.n_head;
    int hh = isq ? h : h - a.n_head, qd = a.n_head * hd, kd = a.n_head_kv * hd;
    /* before the wait: what no kernel of the step writes (the row's position and table were
     * copied before its first kernel; the rotation's table is the model's) */
    int pos = ri.pos[t], half = a.rope_dim / 2;
    const float *cs = a.rope + (size_t)pos * a.rope_dim;
    float rc[QK_PAIRS], rs[QK_PAIRS]; /* cos, sin of this lane's pairs lane + 32 k */
#pragma unroll
    for (int k = 0; k < QK_PAIRS; k++)
        if (lane + 32 * k < half) rc[k] = cs[2 * (lane + 32 * k)], rs[k] = cs[2 * (lane + 32 * k) + 1];
    size_t at = isq ? 0 : kv_at(ri.tabs + ri.tab_off[t], a.n_head_kv, hd, hh, pos);
    pdl_wait();
    float *vec = isq ? a.q + (size_t)t * qd + (size_t)hh * hd : a.k + (size_t)t * kd + (size_t)hh * hd;
    const float *bias = isq ? a.bq : a.bk, *norm = isq ? a.q_norm : a.k_norm;
    if (bias)
        for (int i = lane; i < hd; i += 32) vec[i] += bias[hh * hd + i];
    __syncwarp();
    if (norm) {
        float scale = 1.0f / sqrtf(sumsq16(vec, hd) / (float)hd + a.eps);
        __syncwarp();
        for (int i = lane; i < hd; i += 32) vec[i] = vec[i] * scale * norm[i];
        __syncwarp();
    }
#pragma unroll
    for (int k = 0; k < QK_PAIRS; k++) {
        int i = lane + 32 * k;
        if (i >= half) break;
        int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        float c = rc[k], s = rs[k], x0 = vec[ia], x1 = vec[ib];
        vec[ia] = x0 * c - x1 * s;
        vec[ib] = x0 * s + x1 * c;
    }
    if (isq) return;
    float *v = a.v + (size_t)t * kd + (size_t)hh * hd;
    if (a.bv)
        for (int i = lane; i < hd; i += 32) v[i] += a.bv[hh * hd + i];
    __syncwarp();
    for (int i = lane; i < hd; i += 32) a.kc[at + i] = vec[i], a.vc[at + i] = v[i];
}

/* gate = ps_swiglu(gate, up), element-wise, and (xq given, n % 32 == 0) its ps_xq32 blocks. */
__global__ void k_swiglu(float *gate, const float *up, size_t n, ps_xq32 *xq) {
    pdl_start();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? ps_swiglu(gate[i], up[i]) : 0.0f;
    if (i < n) gate[i] = v;
    if (xq && i - (threadIdx.x & 31) < n) quant_warp(v, xq + i / 32); /* n % 32 == 0: whole warps */
}

/* x += y, element-wise. */
__global__ void k_add(float *x, const float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

/* ---------------------------------------------------------------------------------------
 * Attention (forward.c's attend_nv), in two kernels. k_att_scores: scores q·k in 16 lanes and
 * the tree, times 1/sqrt(hd), a thread block per (rows, head, share of the positions), into a
 * buffer of scores. k_attention, a thread block per (rows, head): the softmax's max,
 * e = ps_exp_neg(score - max), the 16 lane sums over positions p0 + lane and their tree,
 * e / sum; then each output element sums weight × value over positions in order, in chunks
 * of PS_ATT_CHUNK (each chunk's sum from zero, added to the total where it ends), the values
 * streaming through a ring of KV blocks in shared memory (ATT_RING_BYTES: while one block is
 * worked, the copies of the next ones are in flight, 16-byte asynchronous copies). One row's
 * scores are copied into shared memory when the context's positions fit beside the ring;
 * several rows' softmaxes work in place. Decode's rows take k_att_dec (sm_90) or
 * k_att_chunks instead: the same sums, the chunks side by side. */

#define ATT_THREADS 128
/* 32 KiB: two KV blocks of head width 128 in flight and 4 thread blocks a multiprocessor; 64
 * KiB (four, 2 thread blocks) prefilled 4-6 % slower on an H200 (docs/bench/2026-12-05-device.md) */
#ifndef ATT_RING_BYTES
#define ATT_RING_BYTES (32 * 1024)
#endif

struct att_args {
    const float *q;       /* (n, n_head * hd) */
    const float *kc, *vc; /* this layer's cache */
    float *out;           /* (n, n_head * hd) */
    float *scores;        /* (rows of this launch, n_head, srow): used when the scores are not in shared memory */
    ps_xq32 *xq;          /* NULL, or the output's ps_xq32 blocks too (hd % 32 == 0), for the o matmul */
    int n_head, n_head_kv, hd, srow, row0, n_rows; /* the launch's rows: row0 .. row0 + n_rows - 1 */
    int ring;                                      /* KV blocks in the ring */
    float scale;
    float *part;     /* k_att_chunks: (rows of the launch, n_head, max_chunks, hd) chunks' sums */
    unsigned *count; /* k_att_chunks: (rows of the launch, n_head) blocks arrived, 0 between launches */
    int max_chunks;  /* the context's chunks */
};

/* KV blocks a chunk of the values' sums (PS_ATT_CHUNK). */
#define ATT_CB (PS_ATT_CHUNK / PS_KV_BLOCK)

/* KV blocks in the ring for head width hd (at least 2), and its bytes. */
static inline int att_ring_blocks(int hd) {
    int r = ATT_RING_BYTES / (PS_KV_BLOCK * hd * 4);
    return r < 2 ? 2 : r;
}
static inline size_t att_ring_bytes(int hd) { return (size_t)att_ring_blocks(hd) * PS_KV_BLOCK * hd * 4; }

/* Starts the copy of the sequence's KV block b (head kvh, one run of PS_KV_BLOCK × hd
 * floats, hd % 4 == 0) into ring slot b % ring. */
__device__ __forceinline__ void ring_fetch(float *ring, const float *cache, const int32_t *tab, int b, int n_ring,
                                           int n_head_kv, int hd, int kvh) {
    const float4 *src = (const float4 *)(cache + ((size_t)tab[b] * n_head_kv + kvh) * PS_KV_BLOCK * hd);
    float4 *dst = (float4 *)(ring + (size_t)(b % n_ring) * PS_KV_BLOCK * hd);
    for (int i = threadIdx.x; i < PS_KV_BLOCK * hd / 4; i += ATT_THREADS) __pipeline_memcpy_async(dst + i, src + i, 16);
}

/* work(b, rows) for the sequence's KV blocks b = 0 .. n_blk - 1 in order, rows = block b of
 * the cache (head kvh) in shared memory, with the next n_ring - 1 blocks' copies in flight.
 * Every thread of the block calls it. */
template <typename F>
__device__ __forceinline__ void ring_walk(float *ring, const float *cache, const int32_t *tab, int n_blk, int n_ring,
                                          int n_head_kv, int hd, int kvh, F work) {
    for (int b = 0; b < n_ring - 1; b++) {
        if (b < n_blk) ring_fetch(ring, cache, tab, b, n_ring, n_head_kv, hd, kvh);
        __pipeline_commit();
    }
    for (int b = 0; b < n_blk; b++) {
        if (b + n_ring - 1 < n_blk) ring_fetch(ring, cache, tab, b + n_ring - 1, n_ring, n_head_kv, hd, kvh);
        __pipeline_commit();
        __pipeline_wait_prior(n_ring - 1); /* this thread's copies of block b have landed */
        __syncthreads();                   /* everyone's */
        work(b, ring + (size_t)(b % n_ring) * PS_KV_BLOCK * hd);
        __syncthreads(); /* block b's slot is free for block b + n_ring */
    }
}

/* Attention's thread blocks take AR rows of a launch each (ATT_ROWS in prefill, 1 for a few
 * rows): the rows that share a sequence's KV blocks (the same table) read each block once
 * for all of them. Rows of other tables in the same AR (a batch of several sequences) make
 * groups of their own, taken in turn. */
#define ATT_ROWS 8

/* The rows of (the block's AR rows, n_rows of them from local row lr0) whose table is that
 * of the first row in todo. */
__device__ __forceinline__ unsigned att_group(rows_info ri, int row0, int lr0, int n_rows, unsigned todo) {
    int off = ri.tab_off[row0 + lr0 + __ffs(todo) - 1];
    unsigned grp = 0;
    for (int r = 0; r < n_rows; r++)
        if ((todo >> r & 1) && ri.tab_off[row0 + lr0 + r] == off) grp |= 1u << r;
    return grp;
}

/* Floats apart of the keys of two positions in k_att_scores<AR>' shared memory. AR 1: the
 * two half warps of a warp, at consecutive positions, read different banks. More rows: a lane
 * a position, reading 16 bytes at a time; an odd number of 16-byte units apart, so that the 8
 * lanes of each quarter warp read 8 different groups of 4 banks. */
__host__ __device__ constexpr int att_key_stride(int hd, int ar) {
    return ar == 1 ? (hd + 31) / 32 * 32 + 16 : (hd / 4 | 1) * 4;
}

/* Starts the copy of KV block b's keys of head kvh (when b < n_blk) to dst, PS_KV_BLOCK
 * positions kst floats apart: one copy group, the thread block's threads sharing it
 * (copy i is position j's float4 e, i = j · hd / 4 + e, the pair stepped without dividing). */
__device__ __forceinline__ void keys_fetch(float *dst, const float *kc, const int32_t *tab, int b, int n_blk,
                                           int n_head_kv, int hd, int kst, int kvh) {
    if (b < n_blk) {
        const float4 *src = (const float4 *)(kc + ((size_t)tab[b] * n_head_kv + kvh) * PS_KV_BLOCK * hd);
        int per = hd / 4, tid = threadIdx.x;
        for (int i = tid, j = tid / per, e = tid % per; i < PS_KV_BLOCK * per; i += ATT_THREADS) {
            __pipeline_memcpy_async(dst + j * kst + 4 * e, src + i, 16);
            j += ATT_THREADS / per, e += ATT_THREADS % per;
            if (e >= per) j++, e -= per;
        }
    }
    __pipeline_commit();
}

/* Key buffers of k_att_scores<AR>: decode's few rows keep the next KV block's copies in
 * flight while one is worked; prefill's AR rows have work enough per block to hide them, and
 * one buffer leaves room for more thread blocks a multiprocessor. */
__host__ __device__ constexpr int att_scores_bufs(int ar) { return ar == 1 ? 2 : 1; }

/* k_att_scores' sums for AR > 1 rows, one KV block's keys (kb, kst floats apart) against
 * the rows' q (qs): lane j takes position p0 + j, warp w rows w, w + 4, ...; for each it
 * keeps the 16 sums of attend_nv's lanes (element i into sum i % 16, in order), reading
 * four elements at a time, then adds them in tree16's pairs: the same operations as a half
 * warp, with no shuffles and a quarter of the shared memory's loads. */
template <int AR>
__device__ __forceinline__ void scores_rows(const att_args &a, const float *qs, const float *kb, int kst, int lr0,
                                            int h, int p0, unsigned grp, const int (&n_pos)[AR]) {
    constexpr int W = ATT_THREADS / 32, RW = AR / W;
    static_assert(PS_KV_BLOCK == 32 && AR % W == 0, "a lane a position, a warp AR / 4 rows");
    int warp = threadIdx.x >> 5, j = threadIdx.x & 31, hd = a.hd;
    const float *kr = kb + j * kst;
    float acc[RW][16];
#pragma unroll
    for (int w = 0; w < RW; w++)
#pragma unroll
        for (int u = 0; u < 16; u++) acc[w][u] = 0.0f;
    /* elements i .. i + 3 into sums u .. u + 3 */
    auto four = [&](int i, int u) {
        float4 k4 = *(const float4 *)(kr + i);
#pragma unroll
        for (int w = 0; w < RW; w++) {
            float4 q4 = *(const float4 *)(qs + (warp + W * w) * hd + i);
            acc[w][u] += q4.x * k4.x, acc[w][u + 1] += q4.y * k4.y;
            acc[w][u + 2] += q4.z * k4.z, acc[w][u + 3] += q4.w * k4.w;
        }
    };
    int i = 0;
    for (; i + 16 <= hd; i += 16)
#pragma unroll
        for (int u = 0; u < 16; u += 4) four(i + u, u);
#pragma unroll
    for (int u = 0; u < 12; u += 4) /* hd % 16: a multiple of 4 */
        if (i + u < hd) four(i + u, u);
#pragma unroll
    for (int w = 0; w < RW; w++) {
        int r = warp + W * w, p = p0 + j;
        float t[8];
#pragma unroll
        for (int u = 0; u < 8; u++) t[u] = acc[w][u] + acc[w][u + 8];
#pragma unroll
        for (int u = 0; u < 4; u++) t[u] += t[u + 4];
        t[0] += t[2], t[1] += t[3];
        if ((grp >> r & 1) && p < n_pos[r])
            a.scores[((size_t)(lr0 + r) * a.n_head + h) * a.srow + p] = (t[0] + t[1]) * a.scale;
    }
}

/* The scores of a launch's rows, into a.scores (rows of the launch, n_head, srow): a thread
 * block per (AR rows, head, z), z taking the sequences' KV blocks z, z + gridDim.z, ...: the
 * positions spread over the device (a decode step's 32 heads alone would keep 32 SMs busy).
 * Each KV block's keys come to shared memory once for the rows that share it (keys_fetch
 * into att_scores_bufs buffers). One row (decode): a half warp per position, lane l its
 * elements l, l + 16, ..., then the tree and the scale (attend_nv's); both halves of a warp
 * take the same row (the shuffles name the whole warp). More rows: scores_rows. Shared
 * memory: AR rows' q, then the buffers of PS_KV_BLOCK keys att_key_stride(hd, AR) apart. */
template <int AR> __global__ void __launch_bounds__(ATT_THREADS) k_att_scores(att_args a, rows_info ri) {
    pdl_start();
    pdl_wait();
    extern __shared__ float sh[];
    constexpr int NB = att_scores_bufs(AR);
    int lr0 = blockIdx.x * AR, h = blockIdx.y, tid = threadIdx.x, l = tid & 15, hd = a.hd, Z = gridDim.z;
    int nr = min(AR, a.n_rows - lr0), kvh = h / (a.n_head / a.n_head_kv), kst = att_key_stride(hd, AR);
    float *qs = sh, *keys = sh + AR * hd;
    for (int r = 0; r < nr; r++)
        for (int i = tid; i < hd; i += ATT_THREADS)
            qs[r * hd + i] = a.q[((size_t)(a.row0 + lr0 + r) * a.n_head + h) * hd + i];
    for (unsigned todo = (1u << nr) - 1, grp; todo; todo &= ~grp) {
        grp = att_group(ri, a.row0, lr0, nr, todo);
        int n_pos[AR], n_blk = 0;
#pragma unroll
        for (int r = 0; r < AR; r++) {
            n_pos[r] = r < nr ? ri.pos[a.row0 + lr0 + r] + 1 : 0;
            if (grp >> r & 1) n_blk = max(n_blk, (n_pos[r] + PS_KV_BLOCK - 1) / PS_KV_BLOCK);
        }
        const int32_t *tab = ri.tabs + ri.tab_off[a.row0 + lr0 + __ffs(grp) - 1];
        auto fetch = [&](int b, int k) {
            keys_fetch(keys + (k % NB) * PS_KV_BLOCK * kst, a.kc, tab, b, n_blk, a.n_head_kv, hd, kst, kvh);
        };
        fetch(blockIdx.z, 0);
        for (int b = blockIdx.z, k = 0; b < n_blk; b += Z, k++) {
            if (NB > 1) fetch(b + Z, k + 1); /* into the buffer the step before freed */
            __pipeline_wait_prior(NB - 1);   /* this thread's copies of block b have landed */
            __syncthreads();                 /* everyone's (and, first, the q's are in) */
            const float *kb = keys + (k % NB) * PS_KV_BLOCK * kst;
            if constexpr (AR == 1) {
                for (int pi = tid >> 4; pi < AR * PS_KV_BLOCK; pi += ATT_THREADS / 16) {
                    int r = pi / PS_KV_BLOCK, j = pi - r * PS_KV_BLOCK, p = b * PS_KV_BLOCK + j;
                    if (!(grp >> r & 1)) continue;
                    const float *q = qs + r * hd, *kr = kb + j * kst;
                    float acc = 0.0f;
#pragma unroll 8
                    for (int i = l; i < hd; i += 16) acc += q[i] * kr[i];
                    acc = tree16(acc);
                    if (l == 0 && p < n_pos[r])
                        a.scores[((size_t)(lr0 + r) * a.n_head + h) * a.srow + p] = acc * a.scale;
                }
            } else
                scores_rows<AR>(a, qs, kb, kst, lr0, h, b * PS_KV_BLOCK, grp, n_pos);
            __syncthreads(); /* buffer k % NB is free */
            if (NB == 1) fetch(b + Z, k + 1);
        }
        __pipeline_wait_prior(0); /* the last copies, empty or unused */
    }
}

/* Shared memory of k_att_scores<AR>. */
static inline size_t att_scores_smem(int ar, int hd) {
    return ((size_t)ar * hd + att_scores_bufs(ar) * PS_KV_BLOCK * att_key_stride(hd, ar)) * 4;
}

/* Thread blocks along z for k_att_scores<AR>: enough for a context of n_ctx positions to
 * spread over the device, at most one per KV block; at most 128 for decode's few rows, 32
 * for prefill's (whose rows fill the device: more blocks, each reading the rows' q, cost it
 * 5 % at 2,048 positions). */
static inline int att_scores_z(int n_ctx, int ar) {
    int blocks = (n_ctx + PS_KV_BLOCK - 1) / PS_KV_BLOCK, most = ar == 1 ? 128 : 32;
    return blocks < most ? blocks : most;
}

/* One row's softmax (attend_nv's) over its np scores in s, by the whole thread block: the
 * max, e = ps_exp_neg(score - max), the 16 lane sums over positions l, l + 16, ... in order
 * (eight loads at a time) and their tree, then e / sum into dst (s itself, or elsewhere). */
__device__ __forceinline__ void softmax(float *s, float *dst, int np, float *red) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float mx = -INFINITY;
    for (int p = tid; p < np; p += ATT_THREADS) mx = fmaxf(mx, s[p]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int i = 1; i < ATT_THREADS / 32; i++) mx = fmaxf(mx, red[i]);
    for (int p = tid; p < np; p += ATT_THREADS) s[p] = ps_exp_neg(s[p] - mx);
    __syncthreads();
    if (warp == 0) {
        float sum = tree16(lane_sum16<false>(s, np));
        if (lane == 0) red[0] = sum;
    }
    __syncthreads();
    float sum = red[0];
    for (int p = tid; p < np; p += ATT_THREADS) dst[p] = s[p] / sum;
    __syncthreads();
}

/* The softmaxes (softmax's operations) of AR rows at once, a half warp a row: row r's np
 * scores at G[r] (none where np is 0) become their probabilities in place. Lane l sums the
 * exponentials of positions l, l + 16, ... in order as it makes them. */
template <int AR> __device__ __forceinline__ void softmax_rows16(float *const (&G)[AR], const int (&n_pos)[AR]) {
    static_assert(AR * 16 == ATT_THREADS, "a half warp a row");
    int hw = threadIdx.x >> 4, l = threadIdx.x & 15, np = 0;
    float *s = G[0];
#pragma unroll
    for (int r = 0; r < AR; r++) /* this half warp's row, without indexing the arrays at run time */
        if (r == hw) s = G[r], np = n_pos[r];
    float mx = -INFINITY;
#pragma unroll 4
    for (int p = l; p < np; p += 16) mx = fmaxf(mx, s[p]);
    for (int w = 8; w; w >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, w, 16));
    float acc = 0.0f;
#pragma unroll 4
    for (int p = l; p < np; p += 16) {
        float e = ps_exp_neg(s[p] - mx);
        s[p] = e, acc += e;
    }
    float sum = __shfl_sync(FULL, tree16(acc), 0, 16);
#pragma unroll 4
    for (int p = l; p < np; p += 16) s[p] = s[p] / sum;
}

/* What k_attention's value sums walk: the ring, the staged probabilities (position j's
 * AR rows at stage + j · AR), S (KEEP: one row's probabilities), the table, its KV blocks, the
 * key/value head, the block's first local row, its rows and their positions, the head and the
 * rows of the table. */
struct att_walk {
    float *ring, *stage;
    const float *S;
    const int32_t *tab, *pos;
    int n_blk, kvh, lr0, nr, h;
    unsigned grp;
};

/* k_attention's value sums for the rows of w.grp: this thread's are RT rows from rb, elements
 * e (and e + ATT_THREADS when E is 2); each sums weight × value over positions in order, in
 * chunks of PS_ATT_CHUNK. For each position the thread reads the value once and its rows'
 * weights 16 bytes at a time; positions every row has are summed without a test. Then each
 * row's output, and its ps_xq32 blocks (a warp's 32 elements are one block of one row). */
template <bool KEEP, int AR, int RT, int E>
__device__ __forceinline__ void att_values(const att_args &a, const att_walk &w, int e, int rb) {
    static_assert(!KEEP || (AR == 1 && RT == 1), "KEEP: one row");
    int tid = threadIdx.x, hd = a.hd;
    /* row r's positions and probabilities (computed, not arrays indexed at run time) */
    auto n_pos = [&](int r) { return r < w.nr ? w.pos[r] + 1 : 0; };
    auto probs = [&](int r) { return a.scores + ((size_t)(w.lr0 + r) * a.n_head + w.h) * a.srow; };
    float o[RT][E], c[RT][E]; /* the totals, the chunk's sums */
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int k = 0; k < E; k++) o[r][k] = c[r][k] = 0.0f;
    bool mine[E];
#pragma unroll
    for (int k = 0; k < E; k++) mine[k] = e + k * ATT_THREADS < hd;
    ring_walk(w.ring, a.vc, w.tab, w.n_blk, a.ring, a.n_head_kv, hd, w.kvh, [&](int b, const float *vals) {
        int p0 = b * PS_KV_BLOCK;
        if (!KEEP) {
            for (int k = tid; k < AR * PS_KV_BLOCK; k += ATT_THREADS) {
                int r = k / PS_KV_BLOCK, j = k - r * PS_KV_BLOCK, p = p0 + j;
                if ((w.grp >> r & 1) && p < n_pos(r)) w.stage[j * AR + r] = probs(r)[p];
            }
            __syncthreads();
        }
        int np[RT], lo = PS_KV_BLOCK, hi = 0; /* each row's positions in this block; all rows', any row's */
#pragma unroll
        for (int r = 0; r < RT; r++) {
            np[r] = w.grp >> (rb + r) & 1 ? min(PS_KV_BLOCK, max(0, n_pos(rb + r) - p0)) : 0;
            if (w.grp >> (rb + r) & 1) lo = min(lo, np[r]), hi = max(hi, np[r]);
        }
        lo = min(lo, hi);
        auto step = [&](int j, bool test) {
            float v[E], pr[RT];
#pragma unroll
            for (int k = 0; k < E; k++) v[k] = mine[k] ? vals[(size_t)j * hd + e + k * ATT_THREADS] : 0.0f;
            if (KEEP)
                pr[0] = w.S[p0 + j];
            else if (RT % 4 == 0)
#pragma unroll
                for (int r = 0; r < RT; r += 4) *(float4 *)&pr[r] = *(const float4 *)(w.stage + j * AR + rb + r);
            else
#pragma unroll
                for (int r = 0; r < RT; r++) pr[r] = w.stage[j * AR + rb + r];
#pragma unroll
            for (int r = 0; r < RT; r++)
                if (!test || j < np[r])
#pragma unroll
                    for (int k = 0; k < E; k++) c[r][k] += pr[r] * v[k];
        };
        int j = 0;
        for (; j < lo; j++) step(j, false);
        for (; j < hi; j++) step(j, true);
#pragma unroll
        for (int r = 0; r < RT; r++) /* a chunk ends */
            if (np[r] > 0 && ((b + 1) % ATT_CB == 0 || np[r] < PS_KV_BLOCK || p0 + PS_KV_BLOCK == n_pos(rb + r)))
#pragma unroll
                for (int k = 0; k < E; k++) o[r][k] += c[r][k], c[r][k] = 0.0f;
    });
#pragma unroll
    for (int r = 0; r < RT; r++) {
        if (!(w.grp >> (rb + r) & 1)) continue;
        size_t t = (size_t)(a.row0 + w.lr0 + rb + r);
        float *out = a.out + (t * a.n_head + w.h) * hd;
#pragma unroll
        for (int k = 0; k < E; k++)
            if (mine[k]) {
                out[e + k * ATT_THREADS] = o[r][k];
                if (a.xq) /* hd % 32 == 0: a warp's 32 elements, one block */
                    quant_warp(o[r][k], a.xq + (t * a.n_head + w.h) * hd / 32 + (e + k * ATT_THREADS) / 32);
            }
    }
}

/* The rest of attention for AR rows and a head whose scores k_att_scores wrote. First each
 * row's softmax: one row (decode) by the whole block (SMEM: its scores in shared memory),
 * several side by side in place (softmax_rows16; SMEM then makes no difference); then, for the rows that share a table, the values (att_values): a
 * KV block of values at a time through the ring, with the rows' probabilities of that block
 * staged beside it; where the head width is half the threads (64), each half of them takes
 * half the rows. Shared memory: the ring (att_ring_bytes), the staged probabilities
 * (AR × PS_KV_BLOCK), then (SMEM) a row's scores. */
template <bool SMEM, int AR> __global__ void __launch_bounds__(ATT_THREADS, 4) k_attention(att_args a, rows_info ri) {
    extern __shared__ float sh[];
    __shared__ float red[ATT_THREADS / 32];
    pdl_start();
    pdl_wait();
    /* several rows: the last rows (the longest contexts) first, so that the launch does not end
     * on its longest blocks */
    int bx = AR > 1 ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    int lr0 = bx * AR, h = blockIdx.y, tid = threadIdx.x, hd = a.hd;
    int nr = min(AR, a.n_rows - lr0), kvh = h / (a.n_head / a.n_head_kv);
    constexpr bool KEEP = SMEM && AR == 1; /* the probabilities stay in S */
    float *ring = sh, *stage = sh + a.ring * PS_KV_BLOCK * hd, *S = stage + AR * PS_KV_BLOCK;
    int n_pos[AR];
    float *G[AR];
#pragma unroll
    for (int r = 0; r < AR; r++) {
        n_pos[r] = r < nr ? ri.pos[a.row0 + lr0 + r] + 1 : 0;
        G[r] = a.scores + ((size_t)(lr0 + (r < nr ? r : 0)) * a.n_head + h) * a.srow;
    }
    if constexpr (AR > 1) { /* the rows' softmaxes side by side, in place */
        softmax_rows16<AR>(G, n_pos);
        __syncthreads();
    } else
        for (int r = 0; r < nr; r++) {
            float *g = G[r], *s = SMEM ? S : g;
            int np = n_pos[r];
            if (SMEM) copy_to_shared(s, g, np * 4, tid, ATT_THREADS);
            __syncthreads();
            softmax(s, KEEP ? s : g, np, red);
        }
    for (unsigned todo = (1u << nr) - 1, grp; todo; todo &= ~grp) {
        grp = att_group(ri, a.row0, lr0, nr, todo);
        int n_blk = 0;
#pragma unroll
        for (int r = 0; r < AR; r++)
            if (grp >> r & 1) n_blk = max(n_blk, (n_pos[r] + PS_KV_BLOCK - 1) / PS_KV_BLOCK);
        const int32_t *tab = ri.tabs + ri.tab_off[a.row0 + lr0 + __ffs(grp) - 1];
        att_walk w = {ring, stage, S, tab, ri.pos + a.row0 + lr0, n_blk, kvh, lr0, nr, h, grp};
        if constexpr (AR > 1)
            if (2 * hd == ATT_THREADS) { /* two groups of threads, each half the rows */
                att_values<KEEP, AR, AR / 2, 1>(a, w, tid % hd, tid / hd * (AR / 2));
                continue;
            }
        if (hd <= ATT_THREADS)
            att_values<KEEP, AR, AR, 1>(a, w, tid, 0);
        else
            att_values<KEEP, AR, AR, 2>(a, w, tid, 0);
    }
}

/* Shared memory of k_attention with n_scores scores in it (SMEM: the context's; else 0). */
static inline size_t att_smem_bytes(int hd, size_t n_scores) {
    return att_ring_bytes(hd) + ATT_ROWS * PS_KV_BLOCK * 4 + n_scores * 4;
}

/* Decode's attention after k_att_scores, for rows of their own (AR 1), hd % 32 == 0: the
 * values' chunks (PS_ATT_CHUNK positions) summed side by side, so that a step's few (row,
 * head) pairs spread over the device. A thread block per (row, head, z) holds
 * att_workers(hd) workers (hd threads, an element each; 128 threads, two, for hd > 128),
 * worker w taking chunks z · W + w, then gridDim.z · W further on. Each block with a chunk
 * makes the row's softmax (every block the same numbers); then each worker sums its chunks'
 * weight × value in position order into a.part, and the block that arrives last (the count
 * a.count) adds the chunks' sums in order and writes the head's output (and its ps_xq32
 * blocks for the o matmul). Shared memory: att_chunks_smem(n_ctx). */
__host__ __device__ constexpr int att_workers(int hd) { return hd < ATT_THREADS ? ATT_THREADS / hd : 1; }

/* The table entries of chunk ch's KV blocks (0 past the sequence's n_blk). */
__device__ __forceinline__ void chunk_tab(int (&tb)[ATT_CB], const int32_t *tab, int ch, int n_blk) {
#pragma unroll
    for (int k = 0; k < ATT_CB; k++) tb[k] = ch * ATT_CB + k < n_blk ? tab[ch * ATT_CB + k] : 0;
}

/* Chunk ch's sum of weight (S) × value (element e) over its positions below np, in order,
 * a KV block's values loaded at a time. (A partial block's later positions are selected
 * away, not branched around: a branch a product would keep each weight's load waiting for
 * the add before it.) */
__device__ __forceinline__ float chunk_sum(const float *vc, const int (&tb)[ATT_CB], int n_head_kv, int hd, int kvh,
                                           int e, int ch, int np, const float *S) {
    float c = 0.0f;
#pragma unroll
    for (int k = 0; k < ATT_CB; k++) {
        int b = ch * ATT_CB + k, n = np - b * PS_KV_BLOCK;
        if (n <= 0) break;
        const float *v = vc + ((size_t)tb[k] * n_head_kv + kvh) * PS_KV_BLOCK * hd + e, *w = S + b * PS_KV_BLOCK;
        float x[PS_KV_BLOCK];
#pragma unroll
        for (int j = 0; j < PS_KV_BLOCK; j++) x[j] = j < n ? v[j * hd] : 0.0f;
        if (n >= PS_KV_BLOCK) {
#pragma unroll
            for (int j = 0; j < PS_KV_BLOCK; j++) c += w[j] * x[j];
        } else {
#pragma unroll
            for (int j = 0; j < PS_KV_BLOCK; j++) {
                float s = c + w[j] * x[j];
                c = j < n ? s : c;
            }
        }
    }
    return c;
}

__global__ void __launch_bounds__(ATT_THREADS) k_att_chunks(att_args a, rows_info ri) {
    extern __shared__ float S[];
    __shared__ float red[ATT_THREADS / 32];
    __shared__ bool last;
    pdl_start();
    int lr = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, hd = a.hd, W = att_workers(hd);
    size_t t = (size_t)(a.row0 + lr), head = (size_t)lr * a.n_head + h;
    int np = ri.pos[t] + 1, n_chunks = (np + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK,
        n_blk = (np + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    int e = W > 1 ? tid % hd : tid, ch0 = blockIdx.z * W + (W > 1 ? tid / hd : 0), kvh = h / (a.n_head / a.n_head_kv);
    bool mine = e < hd && ch0 < n_chunks; /* a worker with a chunk (element e, and e + 128 when hd > 128) */
    const int32_t *tab = ri.tabs + ri.tab_off[t];
    float *part = a.part + head * a.max_chunks * hd;
    int tb[ATT_CB];
    if (mine) chunk_tab(tb, tab, ch0, n_blk); /* the tables are the chunk's input, not the kernel before's */
    pdl_wait();
    if ((int)blockIdx.z * W < n_chunks) {
        copy_to_shared(S, a.scores + head * a.srow, np * 4, tid, ATT_THREADS);
        __syncthreads();
        softmax(S, S, np, red);
        for (int ch = ch0; mine && ch < n_chunks; ch += gridDim.z * W) {
            if (ch != ch0) chunk_tab(tb, tab, ch, n_blk);
            for (int k = 0; e + k < hd; k += ATT_THREADS)
                part[ch * hd + e + k] = chunk_sum(a.vc, tb, a.n_head_kv, hd, kvh, e + k, ch, np, S);
        }
    }
    __threadfence(); /* the chunks' sums, seen by the last block */
    __syncthreads();
    if (tid == 0) {
        last = atomicAdd(a.count + head, 1u) == gridDim.z - 1;
        if (last) a.count[head] = 0; /* for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = tid; i < hd; i += ATT_THREADS) { /* whole warps (hd % 32 == 0) */
        float o = 0.0f, y[8];
        for (int c0 = 0; c0 < n_chunks; c0 += 8) {
#pragma unroll
            for (int c = 0; c < 8; c++) y[c] = c0 + c < n_chunks ? __ldcg(part + (c0 + c) * hd + i) : 0.0f;
#pragma unroll
            for (int c = 0; c < 8; c++)
                if (c0 + c < n_chunks) o += y[c];
        }
        size_t at = (t * a.n_head + h) * hd + i;
        a.out[at] = o;
        if (a.xq) quant_warp(o, a.xq + at / 32);
    }
}

/* Shared memory of k_att_chunks: the scores of whole chunks (the sums read a partial
 * chunk's weights to its end, and select the products past the row away). */
static inline size_t att_chunks_smem(int n_ctx) {
    return (size_t)(n_ctx + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK * PS_ATT_CHUNK * 4;
}

/* Thread blocks along z for k_att_chunks: a worker a chunk of an n_ctx context, at most 64. */
static inline int att_chunks_z(int n_ctx, int hd) {
    int chunks = (n_ctx + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK, z = (chunks + att_workers(hd) - 1) / att_workers(hd);
    return z < 64 ? z : 64;
}

/* ---------------------------------------------------------------------------------------
 * Decode's attention in one kernel (rows of their own, head width HD 64 or 128; attend_nv's
 * operations, k_att_scores' and k_att_chunks' bits): a cluster of C thread blocks per (row,
 * head), block z of it taking the context's chunks (PS_ATT_CHUNK positions) z, z + C, ...
 * (its slots 0, 1, ...), a thread a position. The keys of slot 0's chunk are on their way to
 * shared memory before the kernel before is waited for, where they are older than this
 * launch (below ri.fresh: the q/k/v matmul before writes the rows' own positions). A
 * thread makes its position's score: the 16 lanes' sums of dot_f32 (elements l, l + 16, ...)
 * side by side, their tree, the scale; the block keeps its slots' scores. Then the values
 * come into the keys' buffer while, after the cluster's barrier, each block gathers the
 * row's scores from the cluster's blocks and makes the softmax (every block the same
 * numbers); thread e sums its chunks' weight × value for element e in position order; after
 * a second barrier block 0 adds each element's chunk sums in chunk order from the cluster's
 * blocks and writes the head's output (and the o matmul's ps_xq32 blocks); a third keeps
 * the blocks' shared memory until it has. Grid (rows, n_head, C), cluster (1, 1, C),
 * ATT_THREADS threads, att_dec_layout's floats of shared memory. */
#define ATD_MOST 8 /* the most blocks a cluster (a portable cluster size) */
static_assert(ATT_THREADS == PS_ATT_CHUNK, "a thread a position of a chunk");

/* att_dec's shared memory in floats: a chunk's keys, then its values (rows hd + 4 apart: a
 * quarter warp's 16-byte loads of 8 consecutive rows fall on 32 different banks), q, the
 * block's published scores (slots), the row's scores gathered (ctx_pad), the chunk sums. */
struct att_dec_lay {
    int ks, q, pub, full, parts, floats;
};
__host__ __device__ inline att_dec_lay att_dec_layout(int hd, int slots, int ctx_pad) {
    att_dec_lay l;
    l.ks = hd + 4;
    l.q = PS_ATT_CHUNK * l.ks;
    l.pub = l.q + hd;
    l.full = l.pub + slots * PS_ATT_CHUNK;
    l.parts = l.full + ctx_pad;
    l.floats = l.parts + slots * hd;
    return l;
}

/* Starts the copies of chunk ch's KV blocks below n_blk (of head kvh, from cache) to dst,
 * positions hd + 4 floats apart: those wholly below lo when old, the others when not. One
 * copy group; every thread of the block calls it. (A kernel that runs once a layer runs
 * most of its instructions once: fetching them is much of its time, so what it does in
 * several places is a call, and its loops stay loops.) */
template <int HD>
__device__ __noinline__ void chunk_fetch(float *dst, const float *cache, const int32_t *tab, int ch, int n_blk,
                                         int n_head_kv, int kvh, int lo, bool old) {
    constexpr int PER = HD / 4; /* float4s a position */
#pragma unroll 1
    for (int k = 0; k < ATT_CB; k++) {
        int b = ch * ATT_CB + k;
        if (b >= n_blk || ((b + 1) * PS_KV_BLOCK <= lo) != old) continue;
        const float4 *src = (const float4 *)(cache + ((size_t)tab[b] * n_head_kv + kvh) * PS_KV_BLOCK * HD);
        float *d = dst + k * PS_KV_BLOCK * (HD + 4);
#pragma unroll 4
        for (int i = threadIdx.x; i < PS_KV_BLOCK * PER; i += ATT_THREADS)
            __pipeline_memcpy_async(d + i / PER * (HD + 4) + 4 * (i % PER), src + i, 16);
    }
    __pipeline_commit();
}

/* q · k in dot_f32's order: 16 lanes' sums of elements l, l + 16, ..., then tree16's tree. */
template <int HD> __device__ __forceinline__ float dot16(const float *q, const float *k) {
    float a[16];
#pragma unroll
    for (int l = 0; l < 16; l++) a[l] = 0.0f;
#pragma unroll 1
    for (int i0 = 0; i0 < HD; i0 += 16)
#pragma unroll
        for (int l = 0; l < 16; l += 4) {
            float4 kv = *(const float4 *)(k + i0 + l), qv = *(const float4 *)(q + i0 + l);
            a[l] += qv.x * kv.x, a[l + 1] += qv.y * kv.y, a[l + 2] += qv.z * kv.z, a[l + 3] += qv.w * kv.w;
        }
#pragma unroll
    for (int l = 0; l < 8; l++) a[l] += a[l + 8];
#pragma unroll
    for (int l = 0; l < 4; l++) a[l] += a[l + 4];
    a[0] += a[2], a[1] += a[3];
    return a[0] + a[1];
}

/* A chunk's sum of w[j] × x[j · (HD + 4)] over j < n, in order, from zero. */
template <int HD> __device__ __forceinline__ float chunk_dot(const float *w, const float *x, int n) {
    float c = 0.0f;
#pragma unroll 8
    for (int j = 0; j < n; j++) c += w[j] * x[j * (HD + 4)];
    return c;
}

/* f(ch, x) for the chunks ch < n in order, x the float at base + s · stride + threadIdx.x in
 * the shared memory of the cluster's block ch % C (s = ch / C: its slot), the C blocks'
 * loads in flight at once. */
template <typename CL, typename F>
__device__ __forceinline__ void cluster_read(const CL &cl, const float *base, int n, int C, int stride, F f) {
    for (int s = 0; s * C < n; s++) {
        float v[ATD_MOST];
#pragma unroll
        for (int r = 0; r < ATD_MOST; r++)
            if (r < C && s * C + r < n) v[r] = cl.map_shared_rank(base, r)[s * stride + threadIdx.x];
#pragma unroll
        for (int r = 0; r < ATD_MOST; r++)
            if (r < C && s * C + r < n) f(s * C + r, v[r]);
    }
}

template <int HD> __global__ void __launch_bounds__(ATT_THREADS) k_att_dec(att_args a, rows_info ri, int ctx_pad) {
#if __CUDA_ARCH__ >= 900 /* clusters (stage.cu launches it on sm_90 on only) */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    extern __shared__ float4 sh4[];
    __shared__ float red[ATT_THREADS / 32];
    float *sh = (float *)sh4;
    pdl_start();
    constexpr int KS = HD + 4;
    int t = threadIdx.x, C = gridDim.z, z = blockIdx.z, slots = (ctx_pad / PS_ATT_CHUNK + C - 1) / C;
    att_dec_lay L = att_dec_layout(HD, slots, ctx_pad);
    float *kv = sh, *qs = sh + L.q, *pub = sh + L.pub, *full = sh + L.full, *parts = sh + L.parts;
    size_t row = (size_t)a.row0 + blockIdx.x;
    int h = blockIdx.y, kvh = h / (a.n_head / a.n_head_kv);
    int np = ri.pos[row] + 1, lo = ri.fresh[row], n_blk = (np + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    int n_chunks = (np + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK;
    const int32_t *tab = ri.tabs + ri.tab_off[row];
    bool mine = z < n_chunks;
    if (mine) chunk_fetch<HD>(kv, a.kc, tab, z, n_blk, a.n_head_kv, kvh, lo, true); /* older than this launch */
    pdl_wait();
    if (mine) {
        if (t < HD / 4)
            __pipeline_memcpy_async((float4 *)qs + t, (const float4 *)(a.q + (row * a.n_head + h) * HD) + t, 16);
        chunk_fetch<HD>(kv, a.kc, tab, z, n_blk, a.n_head_kv, kvh, lo, false);
        __pipeline_wait_prior(0);
        __syncthreads();
    }
    for (int s = 0, ch = z; ch < n_chunks; s++, ch += C) { /* the scores of this block's chunks */
        if (s > 0) {
            __syncthreads();                                                       /* the buffer is free */
            chunk_fetch<HD>(kv, a.kc, tab, ch, n_blk, a.n_head_kv, kvh, 0, false); /* all of it */
            __pipeline_wait_prior(0);
            __syncthreads();
        }
        if (ch * PS_ATT_CHUNK + t < np) pub[s * PS_ATT_CHUNK + t] = dot16<HD>(qs, kv + t * KS) * a.scale;
    }
    __syncthreads(); /* the buffer is free: the first chunk's values come while the scores are shared */
    if (mine) chunk_fetch<HD>(kv, a.vc, tab, z, n_blk, a.n_head_kv, kvh, 0, false);
    cl.sync(); /* every block's scores are in */
    if (mine) {
        cluster_read(cl, pub, n_chunks, C, PS_ATT_CHUNK, [&](int ch, float v) {
            if (ch * PS_ATT_CHUNK + t < np) full[ch * PS_ATT_CHUNK + t] = v;
        });
        __syncthreads();
        softmax(full, full, np, red);
        __pipeline_wait_prior(0);
        __syncthreads();
        for (int s = 0, ch = z; ch < n_chunks; s++, ch += C) { /* the values of this block's chunks */
            if (s > 0) {
                __syncthreads(); /* the buffer is free */
                chunk_fetch<HD>(kv, a.vc, tab, ch, n_blk, a.n_head_kv, kvh, 0, false);
                __pipeline_wait_prior(0);
                __syncthreads();
            }
            int p0 = ch * PS_ATT_CHUNK;
            if (t < HD) parts[s * HD + t] = chunk_dot<HD>(full + p0, kv + t, min(PS_ATT_CHUNK, np - p0));
        }
    }
    cl.sync();              /* every block's chunk sums are in */
    if (z == 0 && t < HD) { /* whole warps (HD % 32 == 0) */
        float o = 0.0f;
        cluster_read(cl, parts, n_chunks, C, HD, [&](int, float v) { o += v; });
        size_t at = (row * a.n_head + h) * HD + t;
        a.out[at] = o;
        if (a.xq) quant_warp(o, a.xq + at / 32);
    }
    cl.sync(); /* block 0 has read the others' shared memory */
#endif
}

/* Clusters' blocks for att_dec with an n_ctx context: a block a chunk, up to ATD_MOST. */
static inline int att_dec_c(int n_ctx) {
    int chunks = (n_ctx + PS_ATT_CHUNK - 1) / PS_ATT_CHUNK;
    return chunks < ATD_MOST ? chunks : ATD_MOST;
}

/* Reads n 16-byte words (the bandwidth measure); a sum that is never zero in practice keeps
 * the loads from being optimized away. */
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* The first non-finite of x[0..n) into *first (set to ~0 before) as (index << 32 | its
 * bits): each thread's first in its stride, the smallest of them by atomicMin, so the first
 * of all. */
__global__ void k_nonfinite(const float *x, unsigned n, unsigned long long *first) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (!isfinite(x[i])) {
            atomicMin(first, (unsigned long long)i << 32 | __float_as_uint(x[i]));
            return;
        }
}

/* A device hop's ring counter (cuda.h): set after the work before it on the stream. */
__global__ void k_ring_set(unsigned long long *counter, unsigned long long v) {
    *(volatile unsigned long long *)counter = v;
    __threadfence_system();
}

#endif
