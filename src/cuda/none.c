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
                        const int32_t *logit_rows, int n_logits, float *out, char *err, size_t errlen) {
    (void)g, (void)x, (void)n, (void)row_pos, (void)row_tab, (void)logit_rows, (void)n_logits, (void)out;
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
