/* cuda.h - the CUDA backend: a stage's layers, KV cache and buffers on one NVIDIA GPU.
 *
 * forward.c hands it each chunk of rows as it would run them on the CPU; every kernel
 * does the CPU's floating-point operations in the CPU's order (the q8 matmuls' integer
 * block sums, then block after block; attention's 16-lane sums and trees; tensor/fmath.h
 * for exponentials; no fused multiply-adds), so a GPU stage gives the CPU's bits and a
 * fleet may mix the two freely. F16 and BF16 weights are the exception: they go through
 * the tensor cores (kernels.cuh's k_mm_h), with the activations kept to 22 or 16 bits and
 * only the f32 sums' order differing from the CPU's; their logits stay within 1e-5 (F16)
 * and 1e-4 (BF16) of the CPU's and, on one GPU, do not depend on the batch. The embedding
 * rows are looked up on the host (one row of a token is a few KiB; the table stays out of
 * GPU memory). Built when nvcc is found
 * (stage.cu); a build without it answers every call with "built without CUDA" (none.c). */
#ifndef PS_CUDA_H
#define PS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../ps.h"

struct ps_model;

/* Whether this build has the CUDA backend. */
bool ps_cuda_built(void);

/* GPUs this process can use (0 in a build without CUDA, or without a driver or device). */
int ps_cuda_device_count(void);

/* Device dev's name and memory ("NVIDIA H200", free and total bytes). */
ps_status ps_cuda_device_info(int dev, char *name, size_t name_len, size_t *free_bytes, size_t *total_bytes, char *err,
                              size_t errlen);

/* Device dev's read bandwidth in bytes/s: the best of 3 passes of a kernel that reads
 * 1 GiB (as decode reads weights: every byte once, in wide loads). 0 on failure. */
double ps_cuda_read_bandwidth(int dev);

typedef struct {
    int device;           /* CUDA device index */
    int n_ctx;            /* positions one sequence may hold */
    int n_blocks;         /* KV blocks in the pool (each PS_KV_BLOCK positions) */
    int max_batch;        /* rows per chunk */
    const float *rope_cs; /* (n_ctx, rope_dim / 2, 2) cos and sin of every position, as the CPU's */
} ps_cuda_params;

typedef struct ps_cuda ps_cuda;

/* Bytes of GPU memory a stage of model m with these parameters takes. */
size_t ps_cuda_bytes(const struct ps_model *m, const ps_cuda_params *p);

/* Uploads the stage's weights and allocates its KV cache and buffers on the device. A
 * stage that does not fit in the device's free memory is an error saying how much it
 * needs, before anything is allocated. *out owned by the caller (ps_cuda_free). */
ps_status ps_cuda_create(const struct ps_model *m, const ps_cuda_params *p, ps_cuda **out, char *err, size_t errlen);
void ps_cuda_free(ps_cuda *g); /* NULL is a no-op */

/* Where ps_cuda_chunk's x and out are: host memory unless these bits say device memory of
 * this host (a device hop's ring, below). */
enum { PS_CUDA_X_DEV = 1, PS_CUDA_OUT_DEV = 2 };

/* One chunk of n <= max_batch rows through the stage's layers, as forward.c's forward_chunk:
 * x (n × dim) the embedded tokens or the previous stage's activations; row_pos and row_tab
 * each row's position and block table. Out: with the head, the logits of rows
 * logit_rows[0..n_logits) (n_logits × vocab, host); else the n rows' activations. */
ps_status ps_cuda_chunk(ps_cuda *g, const float *x, int n, const int32_t *row_pos, const int32_t *const *row_tab,
                        const int32_t *logit_rows, int n_logits, float *out, unsigned io, char *err, size_t errlen);

/* Device hops: activations between GPU stages of one host go device to device (CUDA IPC),
 * not through the host. The receiving stage keeps a ring of slots in its GPU memory and
 * gives its handle to the stage before, which opens it, writes each micro-batch's
 * activations into the next slot and sends the micro-batch without them. The ring's
 * counter says how many micro-batches the receiver has taken out of it; the sender waits for
 * it before it overwrites a slot, so no slot is written before it was read. */
#define PS_CUDA_IPC_BYTES 64 /* a cudaIpcMemHandle_t */
typedef struct ps_cuda_ring ps_cuda_ring;

/* The receiver's side: n_slots slots of slot_bytes on g's device, their handle in handle. */
ps_status ps_cuda_ring_create(ps_cuda *g, int n_slots, size_t slot_bytes, uint8_t handle[PS_CUDA_IPC_BYTES],
                              ps_cuda_ring **out, char *err, size_t errlen);
/* The sender's side: another process's ring, opened from g's device (the same device or
 * another of this host). */
ps_status ps_cuda_ring_open(ps_cuda *g, const uint8_t handle[PS_CUDA_IPC_BYTES], int n_slots, size_t slot_bytes,
                            ps_cuda_ring **out, char *err, size_t errlen);
void ps_cuda_ring_free(ps_cuda_ring *r); /* NULL is a no-op */
/* Slot i's device memory (i mod the ring's slots). */
float *ps_cuda_ring_slot(ps_cuda_ring *r, uint64_t i);
/* The receiver: checks the count activations of slot i for non-finite values once the work
 * queued on its stage's stream so far is done (as a stage checks those that arrive by TCP);
 * after the stream has next been waited for, ps_cuda_ring_bad says whether one was found:
 * the first one's index and value. */
ps_status ps_cuda_ring_check(ps_cuda_ring *r, uint64_t i, size_t count, char *err, size_t errlen);
bool ps_cuda_ring_bad(const ps_cuda_ring *r, size_t *index, float *value);
/* The receiver: `taken` micro-batches have been read out of the ring once the work queued on
 * its stage's stream so far is done (the counter is set after it, without waiting). */
ps_status ps_cuda_ring_taken(ps_cuda_ring *r, uint64_t taken, char *err, size_t errlen);
/* The sender: waits until micro-batch i's slot is free (the receiver has taken i - slots + 1
 * or more), at most timeout_ms. */
ps_status ps_cuda_ring_wait(ps_cuda_ring *r, uint64_t i, int timeout_ms, char *err, size_t errlen);

/* Copies block b of local layer li out of (k, v: PS_KV_BLOCK × kv_dim floats each, host)
 * or into the device's cache. */
ps_status ps_cuda_kv_read(ps_cuda *g, int li, int32_t b, float *k, float *v);
ps_status ps_cuda_kv_write(ps_cuda *g, int li, int32_t b, const float *k, const float *v);

#ifdef __cplusplus
}
#endif

#endif
