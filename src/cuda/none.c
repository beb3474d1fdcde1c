/* none.c - the CUDA backend's calls in a build without nvcc: no device, and a clear error
 * for anyone who asks for one. */
#include "cuda.h"

bool ps_cuda_built(void) { return false; }

int ps_cuda_device_count(void) { return 0; }

static ps_status no_cuda(char *err, size_t errlen) {
    return ps_errf(err, errlen, PS_ERR_UNSUPPORTED,
                   "this pipeshard was built without CUDA (nvcc was not found when it was configured; "
                   "see README, \"GPU stages\")");
}

ps_status ps_cuda_device_info(int dev, char *name, size_t name_len, size_t *free_bytes, size_t *total_bytes, char *err,
                              size_t errlen) {
    (void)dev, (void)name, (void)name_len, (void)free_bytes, (void)total_bytes;
    return no_cuda(err, errlen);
}

double ps_cuda_read_bandwidth(int dev) {
    (void)dev;
    return 0;
}

size_t ps_cuda_bytes(const struct ps_model *m, const ps_cuda_params *p) {
    (void)m, (void)p;
    return 0;
}

ps_status ps_cuda_create(const struct ps_model *m, const ps_cuda_params *p, ps_cuda **out, char *err, size_t errlen) {
    (void)m, (void)p;
    *out = NULL;
    return no_cuda(err, errlen);
}

void ps_cuda_free(ps_cuda *g) { (void)g; }

ps_status ps_cuda_chunk(ps_cuda *g, const float *x, int n, const int32_t *row_pos, const int32_t *const *row_tab,
                        const int32_t *logit_rows, int n_logits, float *out, unsigned io, char *err, size_t errlen) {
    (void)g, (void)x, (void)n, (void)row_pos, (void)row_tab, (void)logit_rows, (void)n_logits, (void)out, (void)io;
    return no_cuda(err, errlen);
}

ps_status ps_cuda_ring_create(ps_cuda *g, int n_slots, size_t slot_bytes, uint8_t handle[PS_CUDA_IPC_BYTES],
                              ps_cuda_ring **out, char *err, size_t errlen) {
    (void)g, (void)n_slots, (void)slot_bytes, (void)handle;
    *out = NULL;
    return no_cuda(err, errlen);
}

ps_status ps_cuda_ring_open(ps_cuda *g, const uint8_t handle[PS_CUDA_IPC_BYTES], int n_slots, size_t slot_bytes,
                            ps_cuda_ring **out, char *err, size_t errlen) {
    (void)g, (void)handle, (void)n_slots, (void)slot_bytes;
    *out = NULL;
    return no_cuda(err, errlen);
}

void ps_cuda_ring_free(ps_cuda_ring *r) { (void)r; }

float *ps_cuda_ring_slot(ps_cuda_ring *r, uint64_t i) {
    (void)r, (void)i;
    return NULL;
}

ps_status ps_cuda_ring_check(ps_cuda_ring *r, uint64_t i, size_t count, char *err, size_t errlen) {
    (void)r, (void)i, (void)count;
    return no_cuda(err, errlen);
}

bool ps_cuda_ring_bad(const ps_cuda_ring *r, size_t *index, float *value) {
    (void)r, (void)index, (void)value;
    return false;
}

ps_status ps_cuda_ring_taken(ps_cuda_ring *r, uint64_t taken, char *err, size_t errlen) {
    (void)r, (void)taken;
    return no_cuda(err, errlen);
}

ps_status ps_cuda_ring_wait(ps_cuda_ring *r, uint64_t i, int timeout_ms, char *err, size_t errlen) {
    (void)r, (void)i, (void)timeout_ms;
    return no_cuda(err, errlen);
}

ps_status ps_cuda_kv_read(ps_cuda *g, int li, int32_t b, float *k, float *v) {
    (void)g, (void)li, (void)b, (void)k, (void)v;
    return PS_ERR_UNSUPPORTED;
}

ps_status ps_cuda_kv_write(ps_cuda *g, int li, int32_t b, const float *k, const float *v) {
    (void)g, (void)li, (void)b, (void)k, (void)v;
    return PS_ERR_UNSUPPORTED;
}
