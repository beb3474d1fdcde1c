/* cuda_barrier.cu - what a grid-wide barrier costs against the gap between two kernels: the
 * first measurement of the persistent decode kernel's plan (docs/notes/cuda-decode.md).
 *
 *   nvcc -arch=sm_90 -O2 -o build/cuda_barrier bench/cuda_barrier.cu && build/cuda_barrier [BLOCKS]
 *
 * Not built by CMake (a one-off measurement, no pipeshard code). Each row is the mean over N
 * back-to-back steps of empty work on BLOCKS blocks of 256 threads (default: one per
 * multiprocessor), timed with CUDA events after a warm-up:
 *   launch      N empty kernels in one stream
 *   launch PDL  the same with programmatic dependent launch (each kernel lets the next start,
 *               then waits for the one before), as the decode kernels are launched
 *   graph       N empty kernels captured in a CUDA graph, the graph replayed
 *   grid.sync   one cooperative kernel doing N cooperative-groups grid barriers
 *   counter     one cooperative kernel doing N barriers of its own: an atomic arrival counter in
 *               global memory and a generation flag (the plan's barrier) */
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "cuda_barrier: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);                 \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

__global__ void k_empty(int *sink) {
    if (sink && threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

__global__ void k_empty_pdl(int *sink) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (sink && threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

__global__ void k_grid_sync(int n) {
    cg::grid_group g = cg::this_grid();
    for (int i = 0; i < n; i++) g.sync();
}

/* count: arrivals of the current generation; gen: the generation, bumped by the last to arrive */
__global__ void k_counter(int n, unsigned *count, volatile unsigned *gen) {
    unsigned blocks = gridDim.x;
    for (int i = 0; i < n; i++) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned g0 = *gen;
            __threadfence();
            if (atomicAdd(count, 1) == blocks - 1) {
                *count = 0;
                __threadfence();
                *gen = g0 + 1;
            } else {
                while (*gen == g0) {}
            }
            __threadfence();
        }
        __syncthreads();
    }
}

static float time_ms(cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
    float ms;
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    (void)s;
    return ms;
}

int main(int argc, char **argv) {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    int blocks = argc > 1 ? atoi(argv[1]) : p.multiProcessorCount, threads = 256, n = 20000;
    if (blocks < 1 || blocks > 4 * p.multiProcessorCount) {
        fprintf(stderr, "cuda_barrier: BLOCKS must be 1..%d\n", 4 * p.multiProcessorCount);
        return 2;
    }
    cudaStream_t s;
    cudaEvent_t a, b;
    int *sink;
    unsigned *count, *gen;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaMalloc(&sink, sizeof *sink));
    CHECK(cudaMalloc(&count, sizeof *count));
    CHECK(cudaMalloc(&gen, sizeof *gen));
    CHECK(cudaMemset(count, 0, sizeof *count));
    CHECK(cudaMemset(gen, 0, sizeof *gen));
    printf("%s, %d multiprocessors; %d blocks of %d threads, %d steps\n", p.name, p.multiProcessorCount, blocks,
           threads, n);

    for (int rep = 0; rep < 2; rep++) { /* the first round warms up */
        CHECK(cudaEventRecord(a, s));
        for (int i = 0; i < n; i++) k_empty<<<blocks, threads, 0, s>>>(sink);
        CHECK(cudaEventRecord(b, s));
        float launch = time_ms(s, a, b);

        cudaLaunchAttribute at = {};
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = blocks, cfg.blockDim = threads, cfg.stream = s, cfg.attrs = &at, cfg.numAttrs = 1;
        CHECK(cudaEventRecord(a, s));
        for (int i = 0; i < n; i++) CHECK(cudaLaunchKernelEx(&cfg, k_empty_pdl, sink));
        CHECK(cudaEventRecord(b, s));
        float pdl = time_ms(s, a, b);

        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 1000; i++) k_empty<<<blocks, threads, 0, s>>>(sink);
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaEventRecord(a, s));
        for (int i = 0; i < n / 1000; i++) CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaEventRecord(b, s));
        float graphed = time_ms(s, a, b);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));

        void *args_sync[] = {&n};
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaLaunchCooperativeKernel((void *)k_grid_sync, blocks, threads, args_sync, 0, s));
        CHECK(cudaEventRecord(b, s));
        float sync = time_ms(s, a, b);

        void *args_counter[] = {&n, &count, &gen};
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaLaunchCooperativeKernel((void *)k_counter, blocks, threads, args_counter, 0, s));
        CHECK(cudaEventRecord(b, s));
        float counter = time_ms(s, a, b);
        CHECK(cudaGetLastError());

        if (rep)
            printf("us a step: launch %.2f  launch PDL %.2f  graph %.2f  grid.sync %.2f  counter %.2f\n",
                   1e3 * launch / n, 1e3 * pdl / n, 1e3 * graphed / n, 1e3 * sync / n, 1e3 * counter / n);
    }
    return 0;
}
