/* kernels.cuh - the CUDA backend's kernels (stage.cu launches them). Each one does what
 * the CPU does for the same output, operation for operation (cuda.h): the notes name the
 * CPU function it follows. Compiled with -fmad=false: a * b + c stays two roundings. */
#ifndef PS_CUDA_KERNELS_CUH
#define PS_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

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

/* Rows of floats into ps_xq32 blocks (a row of cols floats: cols / 32 blocks). */
__global__ void k_quant32(const float *x, int n_blocks, ps_xq32 *out) {
    int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    float v = x[(size_t)b * 32 + lane], d;
    float id = xq_scale(warp_max(fabsf(v)), &d);
    int8_t q = xq_round(v, id);
    int sum = warp_isum(q);
    out[b].qs[lane] = q;
    if (lane == 0) out[b].d = d, out[b].sum = sum;
}

/* Rows into ps_block_q8_K (256 elements, bsums over each 16): lane l holds 8 elements. */
__global__ void k_quant256(const float *x, int n_blocks, ps_block_q8_K *out) {
    int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float *xb = x + (size_t)b * 256 + lane * 8;
    float amax = 0.0f, d;
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(xb[i]));
    float id = xq_scale(warp_max(amax), &d);
    int s = 0;
    for (int i = 0; i < 8; i++) {
        int8_t q = xq_round(xb[i], id);
        out[b].qs[lane * 8 + i] = q;
        s += q;
    }
    s += __shfl_down_sync(FULL, s, 1);
    if (!(lane & 1)) out[b].bsums[lane / 2] = (int16_t)s;
    if (lane == 0) out[b].d = d;
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
};

/* One lane's weights: a 32-element block (q: elements 0..15 then 16..31, four per int), or
 * one 32-element sub-block of a super-block (K types) with its scale(s) and minimum. */
struct wunit {
    int q[8];
    float d, m;
    int sc0, sc1, mn;
};

/* The 32-element block u of a row (q8_ref.c's dot_nibbles / dot_nibbles5 layouts). */
template <int T> __device__ __forceinline__ void load32(const uint8_t *blk, wunit &w) {
    w.d = f16(blk);
    if (T == PS_TYPE_Q8_0) {
        for (int k = 0; k < 8; k++) w.q[k] = (int)ld2x16(blk + 2 + 4 * k);
        return;
    }
    uint32_t h = 0;
    const uint8_t *qs;
    if (T == PS_TYPE_Q4_0) qs = blk + 2;
    if (T == PS_TYPE_Q4_1) w.m = f16(blk + 2), qs = blk + 4;
    if (T == PS_TYPE_Q5_0) h = ld2x16(blk + 2), qs = blk + 6;
    if (T == PS_TYPE_Q5_1) w.m = f16(blk + 2), h = ld32(blk + 4), qs = blk + 8;
    for (int k = 0; k < 4; k++) {
        uint32_t u = T == PS_TYPE_Q4_1 || T == PS_TYPE_Q5_1 ? ld32(qs + 4 * k) : ld2x16(qs + 4 * k);
        uint32_t lo = u & 0x0f0f0f0fu, hi = (u >> 4) & 0x0f0f0f0fu;
        if (T == PS_TYPE_Q5_0 || T == PS_TYPE_Q5_1) {
            lo |= spread4(h >> (4 * k)) << 4;
            hi |= spread4(h >> (16 + 4 * k)) << 4;
        }
        w.q[k] = (int)lo, w.q[4 + k] = (int)hi;
    }
}

/* Sub-block s (0..7) of super-block blk (q8_ref.c's k4_scales, k4_quants, k6_quants). */
template <int T> __device__ __forceinline__ void load_k(const uint8_t *blk, int s, wunit &w) {
    if (T == PS_TYPE_Q6_K) {
        int h = s >> 2, kk = s & 3;
        const uint8_t *ql = blk + 64 * h + (kk & 1) * 32, *qh = blk + 128 + 32 * h;
        for (int k = 0; k < 8; k++) {
            uint32_t v = ((ld2x16(ql + 4 * k) >> ((kk >> 1) * 4)) & 0x0f0f0f0fu) |
                         (((ld2x16(qh + 4 * k) >> (2 * kk)) & 0x03030303u) << 4);
            w.q[k] = (int)__vsub4(v, 0x20202020u); /* q - 32 in each byte */
        }
        w.sc0 = (int8_t)blk[192 + 2 * s], w.sc1 = (int8_t)blk[192 + 2 * s + 1];
        w.d = f16(blk + 208);
        return;
    }
    const uint8_t *sc = blk + 4, *qs = blk + (T == PS_TYPE_Q5_K ? 48 : 16), *qh = blk + 16;
    w.d = f16(blk), w.m = f16(blk + 2);
    if (s < 4)
        w.sc0 = sc[s] & 63, w.mn = sc[s + 4] & 63;
    else
        w.sc0 = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 2) & 0x30), w.mn = (sc[s + 4] >> 4) | ((sc[s] >> 2) & 0x30);
    int g = s >> 1, shift = (s & 1) * 4;
    for (int k = 0; k < 8; k++) {
        uint32_t v = (ld32(qs + 32 * g + 4 * k) >> shift) & 0x0f0f0f0fu;
        if (T == PS_TYPE_Q5_K) v |= ((ld32(qh + 4 * k) >> s) & 0x01010101u) << 4;
        w.q[k] = (int)v;
    }
}

/* The float term(s) of one 32-element block against activation block x. */
template <int T> __device__ __forceinline__ void term32(const wunit &w, const ps_xq32 *x, float *a, float *b) {
    const int *xi = (const int *)x->qs;
    int dot = 0;
    for (int k = 0; k < 8; k++) dot = __dp4a(w.q[k], xi[k], dot);
    if (T == PS_TYPE_Q4_0) dot -= 8 * x->sum;
    if (T == PS_TYPE_Q5_0) dot -= 16 * x->sum;
    *a = (w.d * x->d) * (float)dot;
    if (T == PS_TYPE_Q4_1 || T == PS_TYPE_Q5_1) *b = w.m * (x->d * (float)x->sum);
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

/* Y[t * ys + r] for rows r of W (row_bytes apart) and tokens t < nt of X (x_row bytes apart,
 * n_units blocks each). A thread block takes MM_R rows and TT tokens, and the row's blocks
 * in chunks of `chunk`: first every thread computes (row, block) units' terms for the TT
 * tokens into shared memory (the loads of MM_U units at a time go out together), then thread
 * (r, t) adds its terms in block order. Grid: (rows / MM_R, nt / TT), MM_THREADS threads,
 * mm_smem(T, TT, chunk) bytes of shared memory. */
#define MM_R       8
#define MM_THREADS 256
#define MM_U       4 /* units per thread per pass */

template <int T> __host__ __device__ constexpr int mm_stride(int chunk) { return chunk * wtype<T>::terms + 1; }

template <int T, int TT>
__global__ void __launch_bounds__(MM_THREADS)
    k_mm_q(const uint8_t *W, size_t row_bytes, int n_units, int chunk, const uint8_t *X, size_t x_row, int nt, float *Y,
           long long ys, int rows) {
    typedef wtype<T> ty;
    extern __shared__ float terms[]; /* [MM_R * TT][mm_stride(chunk)] */
    const int stride = mm_stride<T>(chunk), per_unit = ty::k ? 8 : 1;
    const int x_bytes = ty::k ? (int)sizeof(ps_block_q8_K) : (int)sizeof(ps_xq32);
    int r0 = blockIdx.x * MM_R, t0 = blockIdx.y * TT, tt = min(TT, nt - t0), nr = min(MM_R, rows - r0);
    int tid = threadIdx.x, cr = tid / TT, ct = tid % TT;
    bool chain = tid < MM_R * TT && cr < nr && ct < tt;
    float sum = 0.0f;
    for (int c0 = 0; c0 < n_units; c0 += chunk) {
        int nc = min(chunk, n_units - c0), work = nr * nc * per_unit;
        for (int base = 0; base < work; base += MM_THREADS * MM_U) { /* every thread the same trips (shuffles) */
            wunit wu[MM_U];
            int ur[MM_U], ub[MM_U];
#pragma unroll
            for (int k = 0; k < MM_U; k++) { /* the loads of MM_U units go out together */
                int i = base + k * MM_THREADS + tid;
                bool on = i < work;
                ur[k] = on ? i / (nc * per_unit) : -1, ub[k] = on ? (i / per_unit) % nc : 0;
                wu[k] = wunit{};
                const uint8_t *blk = W + (size_t)(r0 + (on ? ur[k] : 0)) * row_bytes + (size_t)(c0 + ub[k]) * ty::bytes;
                if (on) {
                    if (ty::k)
                        load_k<T>(blk, tid % per_unit, wu[k]);
                    else
                        load32<T>(blk, wu[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < MM_U; k++) {
                bool on = ur[k] >= 0;
                float *out = terms + (size_t)(on ? ur[k] : 0) * TT * stride + ub[k] * ty::terms;
                for (int t = 0; t < tt; t++) {
                    const uint8_t *xb = X + (size_t)(t0 + t) * x_row + (size_t)(c0 + ub[k]) * x_bytes;
                    if (ty::k) {
                        float a = term_k<T>(wu[k], (const ps_block_q8_K *)xb, tid % per_unit);
                        if (on && tid % per_unit == 0) out[t * stride] = a;
                    } else if (on) {
                        float a, m;
                        term32<T>(wu[k], (const ps_xq32 *)xb, &a, &m);
                        out[t * stride] = a;
                        if (ty::terms == 2) out[t * stride + 1] = m;
                    }
                }
            }
        }
        __syncthreads();
        if (chain) { /* eight terms' loads at a time, then their additions in order */
            const float *p = terms + (size_t)(cr * TT + ct) * stride;
            int n = nc * ty::terms, j = 0;
            for (; j + 8 <= n; j += 8) {
                float v[8];
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = p[j + k];
#pragma unroll
                for (int k = 0; k < 8; k++) sum += v[k];
            }
            for (; j < n; j++) sum += p[j];
        }
        __syncthreads();
    }
    if (chain) Y[(size_t)(t0 + ct) * ys + r0 + cr] = sum;
}

/* The chunk of blocks k_mm_q<T, TT> takes at a time within MM_SMEM bytes of shared memory,
 * and the bytes it then uses. */
#define MM_SMEM (48 * 1024)
template <int T> static int mm_chunk(int tt, int n_units) {
    int c = ((MM_SMEM / 4) / (MM_R * tt) - 1) / wtype<T>::terms;
    return c < n_units ? c : n_units;
}
template <int T> static size_t mm_smem(int tt, int chunk) { return (size_t)MM_R * tt * mm_stride<T>(chunk) * 4; }

/* Float weights against f32 activations (q8_ref.c's dot_f32 / dot_f16 / dot_bf16): eight
 * partial sums (element j into sum j % 8), combined ((0+4)+(2+6))+((1+5)+(3+7)). A warp
 * takes one row and 4 tokens: lane 8g + k holds token g's sum k. */
template <int T> __device__ __forceinline__ float wval(const uint8_t *w, int j) {
    if (T == PS_TYPE_F32) return ((const float *)w)[j];
    if (T == PS_TYPE_F16) return __half2float(((const __half *)w)[j]);
    return __uint_as_float((uint32_t)((const uint16_t *)w)[j] << 16);
}

#define MMF_ROWS 4 /* rows (warps) per thread block */
template <int T>
__global__ void __launch_bounds__(MMF_ROWS * 32)
    k_mm_f(const uint8_t *W, size_t row_bytes, int cols, const float *X, int nt, float *Y, long long ys, int rows) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = blockIdx.x * MMF_ROWS + warp;
    if (row >= rows) return;
    int t = blockIdx.y * 4 + (lane >> 3), k = lane & 7;
    const uint8_t *w = W + (size_t)row * row_bytes;
    float s = 0.0f;
    if (t < nt) {
        const float *x = X + (size_t)t * cols;
        for (int j = k; j < cols; j += 8) s += wval<T>(w, j) * x[j];
    }
    s += __shfl_down_sync(FULL, s, 4, 8);
    s += __shfl_down_sync(FULL, s, 2, 8);
    s += __shfl_down_sync(FULL, s, 1, 8);
    if (t < nt && k == 0) Y[(size_t)t * ys + row] = s;
}

/* ---------------------------------------------------------------------------------------
 * Norms, rotation, element-wise steps (forward.c) */

/* The sum of x[i]^2 for i < n in dot_f32's order (lane i % 16, then the tree), in every
 * lane of the warp. */
__device__ __forceinline__ float sumsq16(const float *x, int n) {
    int lane = threadIdx.x & 31;
    float acc = 0.0f;
    if (lane < 16)
        for (int i = lane; i < n; i += 16) acc += x[i] * x[i];
    return __shfl_sync(FULL, tree16(acc), 0);
}

/* forward.c's rmsnorm of one row per thread block (NORM_THREADS threads, dim floats of
 * shared memory): row rows[r] (or r) of x, after x += y on that row when y is given (the
 * residual add the CPU does before), into row r of out. The row goes to shared memory in
 * one sweep, then 16 threads sum it in dot_f32's order. out may be y: each thread writes
 * only the elements it read. */
#define NORM_THREADS 256
__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(float *__restrict__ x, const float *y, const int32_t *rows,
                                                          const float *__restrict__ w, float *out, int dim, float eps) {
    extern __shared__ float row[];
    __shared__ float scale;
    int r = blockIdx.x, tid = threadIdx.x;
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
        float acc = 0.0f;
        if (tid < 16)
            for (int i = tid; i < dim; i += 16) acc += row[i] * row[i];
        acc = tree16(acc);
        if (tid == 0) scale = 1.0f / sqrtf(acc / (float)dim + eps);
    }
    __syncthreads();
    for (int i = tid; i < dim; i += NORM_THREADS) out[(size_t)r * dim + i] = row[i] * scale * w[i];
}

/* Where key/value head kvh of position p lives in a layer's pool (forward.c's kv_at). */
__device__ __forceinline__ size_t kv_at(const int32_t *tab, int n_head_kv, int hd, int kvh, int p) {
    return (((size_t)tab[p / PS_KV_BLOCK] * n_head_kv + (size_t)kvh) * PS_KV_BLOCK + (size_t)(p % PS_KV_BLOCK)) *
           (size_t)hd;
}

/* The chunk's rows: position and block table (an offset into tabs) of each. */
struct rows_info {
    const int32_t *pos, *tab_off, *tabs;
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

/* attention_block's steps between the qkv matmuls and attention, for one head of one row
 * (grid: rows × (n_head + n_head_kv), one warp): bias, per-head norm, rotation; a key
 * head also writes its key and value into the cache. */
__global__ void k_qk(qk_args a, rows_info ri) {
    int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = a.hd;
    bool isq = h < a.n_head;
    int hh = isq ? h : h - a.n_head, qd = a.n_head * hd, kd = a.n_head_kv * hd;
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
    int pos = ri.pos[t], half = a.rope_dim / 2;
    const float *cs = a.rope + (size_t)pos * a.rope_dim;
    for (int i = lane; i < half; i += 32) {
        int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = vec[ia], x1 = vec[ib];
        vec[ia] = x0 * c - x1 * s;
        vec[ib] = x0 * s + x1 * c;
    }
    if (isq) return;
    float *v = a.v + (size_t)t * kd + (size_t)hh * hd;
    if (a.bv)
        for (int i = lane; i < hd; i += 32) v[i] += a.bv[hh * hd + i];
    __syncwarp();
    size_t at = kv_at(ri.tabs + ri.tab_off[t], a.n_head_kv, hd, hh, pos);
    for (int i = lane; i < hd; i += 32) a.kc[at + i] = vec[i], a.vc[at + i] = v[i];
}

/* gate = ps_swiglu(gate, up), element-wise. */
__global__ void k_swiglu(float *gate, const float *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gate[i] = ps_swiglu(gate[i], up[i]);
}

/* x += y, element-wise. */
__global__ void k_add(float *x, const float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

/* ---------------------------------------------------------------------------------------
 * Attention (forward.c's attend_nv): one thread block per (row, head). Scores q·k in 16
 * lanes and the tree, times 1/sqrt(hd); the softmax's max, e = ps_exp_neg(score - max),
 * the 16 lane sums over positions p0 + lane and their tree, e / sum; then each output
 * element sums weight × value over positions in order. Keys and values come into shared
 * memory a tile of KV blocks at a time (every thread's 16-byte loads out together); the
 * scores stay in shared memory (in global memory past ATT_SMEM_POS positions). */

#define ATT_THREADS  128
#define ATT_SMEM_POS 40960 /* scores in shared memory up to this many positions (160 KiB) */

struct att_args {
    const float *q;       /* (n, n_head * hd) */
    const float *kc, *vc; /* this layer's cache */
    float *out;           /* (n, n_head * hd) */
    float *scores;        /* (rows of this launch, n_head, srow): used past ATT_SMEM_POS */
    int n_head, n_head_kv, hd, srow, row0;
    int tile_blocks; /* KV blocks per shared-memory tile */
    float scale;
};

/* Copies KV blocks b0.. (at most nb, of the sequence's table) of head kvh into tile: the
 * blocks' rows side by side, PS_KV_BLOCK × hd floats each (16-byte loads: hd % 4 == 0). */
__device__ __forceinline__ void att_tile(float *tile, const float *cache, const int32_t *tab, int b0, int nb,
                                         int n_head_kv, int hd, int kvh) {
    int per = PS_KV_BLOCK * hd / 4; /* float4s per block */
    for (int i = threadIdx.x; i < nb * per; i += ATT_THREADS) {
        int b = i / per, j = i % per;
        const float4 *src = (const float4 *)(cache + ((size_t)tab[b0 + b] * n_head_kv + kvh) * PS_KV_BLOCK * hd);
        ((float4 *)tile)[i] = src[j];
    }
}

/* Shared memory: the tile (tile_blocks × PS_KV_BLOCK × hd floats), then the scores when SMEM. */
template <bool SMEM> __global__ void __launch_bounds__(ATT_THREADS) k_attention(att_args a, rows_info ri) {
    extern __shared__ float sh[];
    __shared__ float red[ATT_THREADS / 32];
    __shared__ float q[256];
    int t = a.row0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int hd = a.hd, kvh = h / (a.n_head / a.n_head_kv), n_pos = ri.pos[t] + 1, tb = a.tile_blocks;
    const int32_t *tab = ri.tabs + ri.tab_off[t];
    float *tile = sh, *S = SMEM ? sh + tb * PS_KV_BLOCK * hd : a.scores + ((size_t)blockIdx.x * a.n_head + h) * a.srow;
    for (int i = tid; i < hd; i += ATT_THREADS) q[i] = a.q[((size_t)t * a.n_head + h) * hd + i];
    int n_blk = (n_pos + PS_KV_BLOCK - 1) / PS_KV_BLOCK;
    /* scores: a tile of keys at a time; a half warp per position, lane l its elements l, l + 16, ... */
    for (int b0 = 0; b0 < n_blk; b0 += tb) {
        int nb = min(tb, n_blk - b0), l = lane & 15;
        __syncthreads(); /* the tile's last readers are done (and q is in) */
        att_tile(tile, a.kc, tab, b0, nb, a.n_head_kv, hd, kvh);
        __syncthreads();
        for (int j = tid >> 4; j < nb * PS_KV_BLOCK; j += ATT_THREADS / 16) { /* uniform per warp */
            const float *k = tile + (size_t)j * hd;
            float acc = 0.0f;
            for (int i = l; i < hd; i += 16) acc += q[i] * k[i];
            acc = tree16(acc);
            int p = b0 * PS_KV_BLOCK + j;
            if (l == 0 && p < n_pos) S[p] = acc * a.scale;
        }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int p = tid; p < n_pos; p += ATT_THREADS) mx = fmaxf(mx, S[p]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int i = 1; i < ATT_THREADS / 32; i++) mx = fmaxf(mx, red[i]);
    for (int p = tid; p < n_pos; p += ATT_THREADS) S[p] = ps_exp_neg(S[p] - mx);
    __syncthreads();
    if (warp == 0) { /* lane l < 16: positions l, l + 16, ... in order */
        float s = 0.0f;
        if (lane < 16)
            for (int p = lane; p < n_pos; p += 16) s += S[p];
        s = __shfl_sync(FULL, tree16(s), 0);
        if (lane == 0) red[0] = s;
    }
    __syncthreads();
    float sum = red[0];
    for (int p = tid; p < n_pos; p += ATT_THREADS) S[p] = S[p] / sum;
    /* outputs: a tile of values at a time; element i sums over positions in order */
    float o0 = 0.0f, o1 = 0.0f; /* elements tid and tid + ATT_THREADS (hd <= 256) */
    int i0 = tid, i1 = tid + ATT_THREADS;
    for (int b0 = 0; b0 < n_blk; b0 += tb) {
        int nb = min(tb, n_blk - b0), p0 = b0 * PS_KV_BLOCK, np = min(nb * PS_KV_BLOCK, n_pos - p0);
        __syncthreads();
        att_tile(tile, a.vc, tab, b0, nb, a.n_head_kv, hd, kvh);
        __syncthreads();
        if (i0 < hd)
            for (int j = 0; j < np; j++) o0 += S[p0 + j] * tile[(size_t)j * hd + i0];
        if (i1 < hd)
            for (int j = 0; j < np; j++) o1 += S[p0 + j] * tile[(size_t)j * hd + i1];
    }
    float *out = a.out + ((size_t)t * a.n_head + h) * hd;
    if (i0 < hd) out[i0] = o0;
    if (i1 < hd) out[i1] = o1;
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

#endif
