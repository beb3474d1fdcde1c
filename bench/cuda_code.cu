/* cuda_code.cu - whether a kernel whose instructions each run once waits on fetching them:
 * the open question of session 35 (docs/notes/cuda-decode.md, "Decode attention in one
 * kernel"), where k_att_dec's phases took 10 to 50 times their instructions' issue time.
 *
 *   nvcc -arch=sm_90 -O3 -fmad=false -std=c++17 -o build/cuda_code bench/cuda_code.cu && build/cuda_code
 *
 * Not built by CMake (a one-off measurement). Every kernel runs on one block a multiprocessor
 * (128 threads) and stamps clock64() around its body in thread 0 of block 0; a row is the
 * median over 64 launches of those cycles (and of the body's cycles in every block, the
 * slowest), in a CUDA graph:
 *   warm    the kernel 64 times in a row: its code stays in the multiprocessor's caches
 *   cold    the kernel alternating with another kernel of 230 KB of code run before it
 *           (which evicts the first one's instructions, as a decode layer's other kernels do)
 * Kernels: straight N  N multiply-adds, 4 chains side by side, unrolled: a multiply and an add
 *                      (-fmad=false, as pipeshard's kernels), 32 bytes of code each (N = 256:
 *                      9 KB; 1,024: 33 KB; 4,096: 132 KB), every instruction run once
 *          loop N      the same multiply-adds as a loop of 64 (8 KB of code)
 *          dot HD      kernels.cuh's dot16<HD> (k_att_dec's score: a position's q · k from
 *                      shared memory, keys hd + 4 floats apart), each thread its position
 * If straight's cold cycles are far above its warm ones while loop's are not, instruction fetch
 * is what a decode kernel waits on, and code size is a decode kernel's cost. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../src/cuda/kernels.cuh"

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "cuda_code: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);                    \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define THREADS 128
#define LAUNCHES 64

/* stamps: (launch) -> thread 0 of block 0's cycles; most: the slowest block's */
struct stamp {
    long long *first, *most;
    int at;
};

__device__ __forceinline__ void stamp_end(stamp s, long long t0, float keep, float *sink) {
    long long dt = clock64() - t0;
    if (keep == 1.2345f) *sink = keep; /* the work is not optimized away */
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0) s.first[s.at] = dt;
        atomicMax((unsigned long long *)s.most + s.at, (unsigned long long)dt);
    }
}

/* N multiply-adds in 4 chains, unrolled (SALT makes another kernel's code differ) */
template <int N, int SALT> __device__ __forceinline__ void straight(float x, float *sink, stamp s) {
    float v[4] = {x, x + 1.0f, x + 2.0f, x + 3.0f};
    long long t0 = clock64();
#pragma unroll
    for (int i = 0; i < N; i++) v[i % 4] = v[i % 4] * (1.0f + (i + SALT) * 1e-7f) + (i + SALT) * 1e-6f;
    stamp_end(s, t0, v[0] + v[1] + v[2] + v[3], sink);
}
template <int N> __global__ void __launch_bounds__(THREADS) k_straight(float x, float *sink, stamp s) {
    straight<N, 0>(x, sink, s);
}

template <int N> __global__ void __launch_bounds__(THREADS) k_loop(float x, float *sink, stamp s) {
    float v[4] = {x, x + 1.0f, x + 2.0f, x + 3.0f};
    long long t0 = clock64();
#pragma unroll 1
    for (int j = 0; j < N; j += 64)
#pragma unroll
        for (int i = 0; i < 64; i++) v[i % 4] = v[i % 4] * (1.0f + (i + j) * 1e-7f) + (i + j) * 1e-6f;
    stamp_end(s, t0, v[0] + v[1] + v[2] + v[3], sink);
}

template <int HD> __global__ void __launch_bounds__(THREADS) k_dot(float x, float *sink, stamp s) {
    extern __shared__ float4 sh4[]; /* THREADS positions' keys, then q */
    float *k = (float *)sh4, *q = k + THREADS * (HD + 4);
    for (int i = threadIdx.x; i < THREADS * (HD + 4); i += THREADS) k[i] = x + i * 1e-3f;
    for (int i = threadIdx.x; i < HD; i += THREADS) q[i] = x - i * 1e-3f;
    __syncthreads();
    long long t0 = clock64();
    float d = dot16<HD>(q, k + threadIdx.x * (HD + 4));
    stamp_end(s, t0, d, sink);
}

typedef void (*kern)(float, float *, stamp);

/* the evictor: 230 KB of code that no measured kernel shares */
__global__ void __launch_bounds__(THREADS) k_evict(float x, float *sink, stamp s) {
    straight<16384, 7777>(x, sink, s);
}

static int sms;
static float *sink;
static long long *first, *most;

/* median cycles (thread 0 of block 0; slowest block) of k over LAUNCHES launches, each after
 * the evictor when cold */
static void measure(const char *name, kern k, size_t smem, bool cold) {
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaMemset(most, 0, LAUNCHES * 8));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    long long *junk = first + LAUNCHES, *junk2 = most + LAUNCHES;
    for (int i = 0; i < LAUNCHES; i++) {
        if (cold) k_evict<<<sms, THREADS, 0, st>>>(1.0f, sink, stamp{junk, junk2, 0});
        k<<<sms, THREADS, smem, st>>>(1.0f, sink, stamp{first, most, i});
    }
    CHECK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaGraphLaunch(ge, st)); /* once to load the module's code, then the measured run */
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemset(most, 0, LAUNCHES * 8));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaStreamSynchronize(st));
    std::vector<long long> a(LAUNCHES), b(LAUNCHES);
    CHECK(cudaMemcpy(a.data(), first, LAUNCHES * 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), most, LAUNCHES * 8, cudaMemcpyDeviceToHost));
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    printf("%-16s %-5s %10lld %12lld\n", name, cold ? "cold" : "warm", a[LAUNCHES / 2], b[LAUNCHES / 2]);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    sms = p.multiProcessorCount;
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMalloc(&first, 2 * LAUNCHES * 8));
    CHECK(cudaMalloc(&most, 2 * LAUNCHES * 8));
    printf("%s, %d multiprocessors; cycles of a kernel's body (median of %d launches)\n", p.name, sms, LAUNCHES);
    printf("%-16s %-5s %10s %12s\n", "kernel", "cache", "block 0", "slowest");
    size_t dot64 = (THREADS * 68 + 64) * 4, dot128 = (THREADS * 132 + 128) * 4;
    CHECK(cudaFuncSetAttribute(k_dot<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dot128));
    const struct {
        const char *name;
        kern k;
        size_t smem;
    } rows[] = {{"straight 256", k_straight<256>, 0},   {"loop 256", k_loop<256>, 0},
                {"straight 1024", k_straight<1024>, 0}, {"loop 1024", k_loop<1024>, 0},
                {"straight 4096", k_straight<4096>, 0}, {"loop 4096", k_loop<4096>, 0},
                {"dot 64", k_dot<64>, dot64},           {"dot 128", k_dot<128>, dot128}};
    for (const auto &r : rows)
        for (bool cold : {false, true}) measure(r.name, r.k, r.smem, cold);
    return 0;
}
