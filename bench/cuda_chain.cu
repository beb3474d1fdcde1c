/* cuda_chain.cu - what a chain of dependent matrix-vector products loses at its boundaries,
 * launched as kernels or run as one persistent kernel: the second measurement of the
 * persistent decode kernel's plan (docs/notes/cuda-decode.md), after bench/cuda_barrier.cu
 * found a grid barrier no cheaper than the gap between two empty kernels.
 *
 *   nvcc -arch=sm_90 -O3 -o build/cuda_chain bench/cuda_chain.cu && build/cuda_chain [1b|8b]
 *
 * Not built by CMake (a one-off measurement, no pipeshard code). A step is a llama decode
 * step's matrices, shaped as Llama-3.2-1B's (16 layers: q/k/v 3,072 × 2,048, o 2,048 ×
 * 2,048, gate/up 16,384 × 2,048, down 2,048 × 8,192) or Llama-3.1-8B's (32 layers, 4,096
 * wide): 4-bit weights (no scales: the bytes, not the arithmetic, are measured), each
 * product reading the one before's output, one warp a row, the input vector copied to shared
 * memory first (as 8-bit values, summed with dp4a). Rows: the best of three rounds' mean over
 * the steps, variants in turns after a warm-up, timed with CUDA events:
 *   read        one kernel reading a step's weight bytes once, no chain (the floor)
 *   graph       a kernel a product, the step's kernels captured in a CUDA graph
 *   graph PDL   the same with programmatic dependent launch: each kernel lets the next start,
 *               loads its first weights, then waits for the one before (as pipeshard's do)
 *   … N rows    the same with N rows a warp, the first weights of all loaded before any sum
 *   persist     one cooperative kernel a step, a grid barrier (cooperative groups) between
 *               products, as many blocks as fit
 *   persist pre the same, each warp loading its next row's first weights before the barrier
 *   persist pipe the same, and each warp loading its next row's first weights while it sums
 *               the row before
 *   +norm …     a llama layer's two RMS norms (before q/k/v and gate/up) added: as a kernel
 *               of one block of 1,024 threads (graph PDL, as pipeshard's k_rmsnorm), or done
 *               again by every block of the product that reads it (persist pre: the plan's
 *               redundant norm)
 * Every variant's last output is compared bit for bit with graph's (+norm persist pre's with
 * +norm graph PDL's): a product that read its input before the one before had written it
 * would show. Figures: docs/bench/2026-12-04-session34.md. */
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "cuda_chain: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define THREADS 256
#define WARPS   (THREADS / 32)
#define PRE     4 /* uint4 of a row a lane loads ahead: 4 KB of the row, all of it at 2,048 columns */

struct product {
    const uint4 *w; /* rows × cols/32 uint4, 32 four-bit weights each */
    const float *x; /* cols */
    float *y;       /* rows */
    int rows, cols;
    float scale;
    int norm; /* x is RMS-normalized first (q/k/v and gate/up, as in a llama layer) */
};

/* the RMS norm's scale of x (n values, in shared memory) in pipeshard's order: 16 lanes each
 * summing every 16th square in turn, then a tree; every lane of the warp gets it */
__device__ __forceinline__ float norm_scale(const float *x, int n, int lane) {
    float acc = 0.0f;
    for (int i = lane & 15; i < n; i += 16) acc = fmaf(x[i], x[i], acc);
#pragma unroll
    for (int o = 8; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    acc = __shfl_sync(0xffffffffu, acc, 0);
    return 1.0f / sqrtf(acc / (float)n + 1e-5f);
}

/* x (n values) into shared memory, its norm's scale into *scale */
__device__ __forceinline__ void norm_row(const float *x, int n, float *row, float *scale) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) ((float4 *)row)[i] = __ldcg((const float4 *)x + i);
    __syncthreads();
    if (threadIdx.x < 32) {
        float sc = norm_scale(row, n, threadIdx.x);
        if (threadIdx.x == 0) *scale = sc;
    }
    __syncthreads();
}

/* the norm as a kernel of its own (one block of 1,024 threads, as pipeshard's k_rmsnorm) */
__global__ void k_norm(const float *x, float *out, int n) {
    extern __shared__ float row[];
    __shared__ float scale;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    norm_row(x, n, row, &scale);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = row[i] * scale;
}

/* 32 weights (a uint4: its words' low nibbles, then their high nibbles) against 32 of the row's
 * 8-bit inputs, lane-interleaved in xs (word g of iteration i at xs[(i·8 + g)·32 + lane]) */
__device__ __forceinline__ int dot32(uint4 q, const int *xv, int acc) {
    unsigned words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = __dp4a((int)(words[k] & 0x0F0F0F0Fu), xv[(2 * k) * 32], acc);
        acc = __dp4a((int)((words[k] >> 4) & 0x0F0F0F0Fu), xv[(2 * k + 1) * 32], acc);
    }
    return acc;
}

/* one warp's row r: the lane's uint4 i·32 + lane for i = 0 … cols/1024 - 1, the first PRE
 * given in pre; xsum: the inputs' sum (the weights are stored as w + 8) */
template <int P = PRE>
__device__ __forceinline__ float row_dot(const product &p, int r, const int *xs, int xsum, const uint4 *pre, int lane) {
    const uint4 *w = p.w + (size_t)r * (p.cols / 32);
    int n = p.cols / 1024, acc = 0;
#pragma unroll
    for (int i = 0; i < P; i++)
        if (i < n) acc = dot32(pre[i], xs + i * 256 + lane, acc);
    for (int i = P; i < n; i++) acc = dot32(__ldcs(w + i * 32 + lane), xs + i * 256 + lane, acc);
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return (float)(acc - 8 * xsum) * p.scale;
}

template <int P = PRE> __device__ __forceinline__ void load_pre(const product &p, int r, uint4 *pre, int lane) {
    const uint4 *w = p.w + (size_t)r * (p.cols / 32);
    int n = p.cols / 1024;
#pragma unroll
    for (int i = 0; i < P; i++)
        if (i < n) pre[i] = __ldcs(w + i * 32 + lane);
}

/* the input vector into shared memory as 8-bit values (x · 16, clamped), 4 a word; returns
 * their sum (every thread) */
__device__ __forceinline__ int copy_x(const product &p, int *xs) {
    __shared__ int part[WARPS];
    __shared__ float scale;
    int sum = 0;
    const float *xf = NULL; /* the normalized input's source in shared memory, after xs */
    if (p.norm) {           /* every block redoes the norm: the plan's redundant norm */
        norm_row(p.x, p.cols, (float *)(xs + p.cols / 4), &scale);
        xf = (const float *)(xs + p.cols / 4);
    }
    for (int i = threadIdx.x; i < p.cols / 4; i += THREADS) {
        float4 v = xf ? ((const float4 *)xf)[i] : __ldcg((const float4 *)p.x + i);
        float f[4] = {v.x, v.y, v.z, v.w};
        unsigned word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int q = max(-127, min(127, __float2int_rn((xf ? f[j] * scale : f[j]) * 16.0f)));
            sum += q;
            word |= (unsigned)(q & 255) << (8 * j);
        }
        xs[i] = (int)word;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = sum;
    __syncthreads();
    sum = 0;
#pragma unroll
    for (int k = 0; k < WARPS; k++) sum += part[k];
    __syncthreads(); /* part is read before the next product's copy writes it */
    return sum;
}

/* a kernel a product: each warp takes ROWS rows, block b's warps rows b·WARPS·ROWS …, and
 * loads the first weights of all of them before summing any */
template <bool PDL, int ROWS> __global__ void __launch_bounds__(THREADS) k_product(product p) {
    extern __shared__ int xs[];
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * WARPS + threadIdx.x / 32) * ROWS;
    uint4 pre[ROWS][PRE];
    if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
    for (int j = 0; j < ROWS; j++)
        if (r0 + j < p.rows) load_pre(p, r0 + j, pre[j], lane);
    if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    int xsum = copy_x(p, xs);
#pragma unroll
    for (int j = 0; j < ROWS; j++)
        if (r0 + j < p.rows) {
            float v = row_dot(p, r0 + j, xs, xsum, pre[j], lane);
            if (lane == 0) p.y[r0 + j] = v;
        }
}

/* one step in one kernel: every warp takes rows warp, warp + all warps, … of each product.
 * MODE 0: a row's first weights loaded when the row starts; 1: also the next product's first
 * row's before the barrier; 2: also each next row's while the row before is summed */
template <int MODE> __global__ void __launch_bounds__(THREADS, 4) k_persist(const product *ps, int n) {
    extern __shared__ int xs[];
    cg::grid_group g = cg::this_grid();
    int lane = threadIdx.x & 31, warp = blockIdx.x * WARPS + threadIdx.x / 32, all = gridDim.x * WARPS;
    uint4 pre[PRE], next[PRE];
    if (warp < ps[0].rows) load_pre(ps[0], warp, pre, lane);
    for (int k = 0; k < n; k++) {
        product p = ps[k];
        bool ahead = MODE >= 1 && k + 1 < n && warp < ps[k + 1].rows;
        int xsum = copy_x(p, xs);
        for (int r = warp; r < p.rows; r += all) {
            if (MODE < 2) {
                if (r != warp) load_pre(p, r, pre, lane);
            } else if (r + all < p.rows)
                load_pre(p, r + all, next, lane);
            else if (ahead)
                load_pre(ps[k + 1], warp, next, lane);
            float v = row_dot(p, r, xs, xsum, pre, lane);
            if (lane == 0) p.y[r] = v;
            if (MODE == 2)
#pragma unroll
                for (int i = 0; i < PRE; i++) pre[i] = next[i];
        }
        if (MODE == 2 && ahead && warp >= p.rows) load_pre(ps[k + 1], warp, pre, lane);
        if (MODE == 1 && ahead) load_pre(ps[k + 1], warp, pre, lane);
        g.sync();
        if (k + 1 < n && !ahead && warp < ps[k + 1].rows) load_pre(ps[k + 1], warp, pre, lane);
    }
}

__global__ void k_read(const uint4 *w, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * THREADS) {
        uint4 q = __ldcs(w + i);
        acc ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (acc == 0x12345678u) *sink = acc; /* keeps the loads */
}

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms;
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main(int argc, char **argv) {
    bool big = argc > 1 && !strcmp(argv[1], "8b");
    if (argc > 1 && !big && strcmp(argv[1], "1b")) {
        fprintf(stderr, "usage: cuda_chain [1b|8b]\n");
        return 2;
    }
    int dim = big ? 4096 : 2048, ffn = big ? 14336 : 8192, kv = big ? 1024 : 512, layers = big ? 32 : 16;
    int shapes[4][2] = {{dim + 2 * kv, dim}, {dim, dim}, {2 * ffn, dim}, {dim, ffn}}; /* rows, cols */
    int n = 4 * layers, steps = big ? 50 : 200;

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t bytes = 0;
    for (int s = 0; s < 4; s++) bytes += (size_t)shapes[s][0] * shapes[s][1] / 2;
    bytes *= layers;
    uint4 *w;
    CHECK(cudaMalloc(&w, bytes));
    { /* random nibbles, the same for every run */
        std::vector<uint32_t> h(bytes / 4);
        uint32_t s = 12345;
        for (auto &v : h) s = s * 1664525u + 1013904223u, v = s;
        CHECK(cudaMemcpy(w, h.data(), bytes, cudaMemcpyHostToDevice));
    }
    size_t widest = (size_t)2 * ffn;
    float *x0, *out[4];
    CHECK(cudaMalloc(&x0, dim * 4));
    for (auto &o : out) CHECK(cudaMalloc(&o, widest * 4));
    {
        std::vector<float> h(dim);
        for (int i = 0; i < dim; i++) h[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
        CHECK(cudaMemcpy(x0, h.data(), dim * 4, cudaMemcpyHostToDevice));
    }
    /* ps: the products; psn: the same with the norms, done by the product (persistent) */
    std::vector<product> ps(n), psn(n);
    const uint4 *at = w;
    for (int k = 0; k < n; k++) {
        int s = k % 4;
        product &p = ps[k];
        p.rows = shapes[s][0], p.cols = shapes[s][1], p.w = at, p.y = out[s];
        p.x = k ? out[(s + 3) % 4] : x0; /* q/k/v reads down's output (the residual stream's stand-in) */
        p.scale = 1.0f / (4.6f * sqrtf((float)p.cols));
        at += (size_t)p.rows * p.cols / 32;
        psn[k] = p;
        psn[k].norm = s == 0 || s == 2;
    }
    product *dps, *dpsn;
    CHECK(cudaMalloc(&dps, n * sizeof(product)));
    CHECK(cudaMalloc(&dpsn, n * sizeof(product)));
    CHECK(cudaMemcpy(dps, ps.data(), n * sizeof(product), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dpsn, psn.data(), n * sizeof(product), cudaMemcpyHostToDevice));
    float *normed;
    CHECK(cudaMalloc(&normed, dim * 4));
    size_t smem = (size_t)ffn + (size_t)dim * 4; /* the widest input, a byte a value; a normalized row */
    const void *persist[3] = {(const void *)k_persist<0>, (const void *)k_persist<1>, (const void *)k_persist<2>};
    int per_sm = 1 << 30;
    for (const void *f : persist) {
        int m;
        CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&m, f, THREADS, smem));
        if (m < per_sm) per_sm = m;
    }
    int pblocks = per_sm * prop.multiProcessorCount;

    cudaStream_t st;
    cudaEvent_t a, b;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    unsigned *sink;
    CHECK(cudaMalloc(&sink, 4));

    /* a step's graph: products of ROWS rows a warp, with programmatic launch or not, with the
     * norms as kernels of their own or not */
    auto capture = [&](bool pdl, int rows, bool norms) {
        const void *f = pdl ? (rows == 1   ? (const void *)k_product<true, 1>
                               : rows == 2 ? (const void *)k_product<true, 2>
                                           : (const void *)k_product<true, 4>)
                            : (const void *)k_product<false, 1>;
        CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < n; k++) {
            product p = ps[k];
            cudaLaunchConfig_t cfg = {};
            cfg.stream = st, cfg.attrs = &attr, cfg.numAttrs = pdl && k ? 1 : 0;
            if (norms && psn[k].norm) {
                cfg.gridDim = 1, cfg.blockDim = 1024, cfg.dynamicSmemBytes = (size_t)p.cols * 4;
                CHECK(cudaLaunchKernelEx(&cfg, k_norm, p.x, normed, p.cols));
                p.x = normed, cfg.numAttrs = 1;
            }
            cfg.gridDim = (p.rows + WARPS * rows - 1) / (WARPS * rows), cfg.blockDim = THREADS;
            cfg.dynamicSmemBytes = (size_t)p.cols;
            void *args[] = {&p};
            CHECK(cudaLaunchKernelExC(&cfg, f, args));
        }
        CHECK(cudaStreamEndCapture(st, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaGraphDestroy(graph));
        return exec;
    };
    cudaGraphExec_t exec[] = {capture(false, 1, false), capture(true, 1, false), capture(true, 2, false),
                              capture(true, 4, false), capture(true, 1, true)};

    struct variant {
        const char *name;
        int graph;  /* exec[graph], or -1 */
        int mode;   /* k_persist<mode>, or -1 */
        bool norms; /* the output is compared with the first variant with norms, else with graph's */
    } vs[] = {{"read", -1, -1, false},          {"graph", 0, -1, false},         {"graph PDL", 1, -1, false},
              {"graph PDL 2 rows", 2, -1, false}, {"graph PDL 4 rows", 3, -1, false},
              {"persist", -1, 0, false},        {"persist pre", -1, 1, false},   {"persist pipe", -1, 2, false},
              {"+norm graph PDL", 4, -1, true}, {"+norm persist pre", -1, 1, true}};
    const int nv = sizeof vs / sizeof vs[0];
    std::vector<float> best(nv, 1e30f), got(dim), ref[2] = {std::vector<float>(), std::vector<float>()};
    std::vector<bool> same(nv, true);
    for (int round = 0; round < 4; round++) /* variants in turns; the first round warms up */
        for (int v = 0; v < nv; v++) {
            int reps = round ? steps : 3;
            CHECK(cudaMemset(out[3], 0, widest * 4));
            CHECK(cudaEventRecord(a, st));
            for (int i = 0; i < reps; i++) {
                if (vs[v].graph >= 0)
                    CHECK(cudaGraphLaunch(exec[vs[v].graph], st));
                else if (vs[v].mode >= 0) {
                    void *args[] = {vs[v].norms ? &dpsn : &dps, &n};
                    CHECK(cudaLaunchCooperativeKernel(persist[vs[v].mode], pblocks, THREADS, args, smem, st));
                } else
                    k_read<<<prop.multiProcessorCount * 8, THREADS, 0, st>>>(w, bytes / 16, sink);
            }
            CHECK(cudaEventRecord(b, st));
            float ms = elapsed(a, b) / reps;
            CHECK(cudaGetLastError());
            if (round && ms < best[v]) best[v] = ms;
            if (v) {
                std::vector<float> &r = ref[vs[v].norms];
                CHECK(cudaMemcpy(got.data(), out[3], dim * 4, cudaMemcpyDeviceToHost));
                if (r.empty())
                    r = got;
                else if (memcmp(r.data(), got.data(), dim * 4))
                    same[v] = false;
            }
        }
    printf("%s, %d multiprocessors; %s-shaped step: %d products, %.1f MB of weights; persistent: %d blocks "
           "(%d a multiprocessor) of %d threads\n",
           prop.name, prop.multiProcessorCount, big ? "8B" : "1B", n, bytes / 1e6, pblocks, per_sm, THREADS);
    printf("%-18s %10s %10s %8s %s\n", "variant", "us a step", "us a layer", "TB/s", "output");
    for (int v = 0; v < nv; v++)
        printf("%-18s %10.1f %10.2f %8.2f %s\n", vs[v].name, 1e3 * best[v], 1e3 * best[v] / layers,
               bytes / (best[v] * 1e-3) / 1e12,
               v == 0    ? ""
               : same[v] ? "same bits"
                         : "DIFFERS");
    return 0;
}
