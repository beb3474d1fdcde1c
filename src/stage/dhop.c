/* dhop.c - device hops (stage.h, DHOP): activations between GPU stages of one host through
 * a ring in the receiving stage's GPU memory (cuda.h) instead of the host's TCP stack. */
#include "stage.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../cuda/cuda.h"

/* This boot of this host ("" when unknown): two processes that read the same id share the
 * GPUs that CUDA IPC joins. */
static void boot_id(char out[64]) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f || !fgets(out, 64, f)) out[0] = 0;
    if (f) fclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* When process pid started (field 22 of /proc/PID/stat, clock ticks after boot), or 0. With
 * the pid it names one process of this boot, whatever pid namespace the reader is in. */
static unsigned long long start_time(long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* after the command name, which may hold spaces */
    unsigned long long t = 0;
    for (int field = 2; p && *p; p++)
        if (*p == ' ' && ++field == 22) {
            t = strtoull(p + 1, NULL, 10);
            break;
        }
    return t;
}

/* A descriptor that becomes readable when the next stage's process pid, started at t, exits
 * (pidfd_open), or -1 when that process cannot be watched (another pid namespace, an old
 * kernel): the sender must not write into the memory of a process that may be gone (CUDA IPC
 * leaves that undefined), so the hop then stays TCP. */
static int watch(long pid, unsigned long long t) {
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd >= 0 && (!t || start_time(pid) != t)) close(fd), fd = -1;
    return fd;
#else
    (void)pid, (void)t;
    return -1;
#endif
}

/* The bytes a slot takes: a micro-batch of s's session at its largest, in 256-byte units. */
static size_t slot_bytes(ps_stage *s) {
    size_t b = (size_t)ps_stage_max_mb(s) * (size_t)ps_stage_model(s)->hp.dim * sizeof(float);
    return (b + 255) / 256 * 256;
}

/* Sends b's bytes on c as one frame of type and frees b. */
static ps_status send_free(ps_conn *c, uint16_t type, ps_wbuf *b, int timeout_ms, char *err, size_t errlen) {
    struct iovec iov = {b->p, b->len};
    ps_status st = b->oom ? ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory")
                          : ps_conn_send(c, type, &iov, 1, timeout_ms, err, errlen);
    ps_wbuf_free(b);
    return st;
}

void ps_dhop_end(ps_dhop *h) {
    ps_cuda_ring_free(h->ring);
    if (h->peer_fd > 0) close(h->peer_fd);
    *h = (ps_dhop){0};
}

ps_status ps_dhop_offer(ps_dhop *h, ps_conn *c, ps_stage *s, int timeout_ms, char *why, size_t whylen, char *err,
                        size_t errlen) {
    ps_dhop_end(h);
    ps_cuda *g = ps_stage_cuda(s);
    char id[64];
    boot_id(id);
    snprintf(why, whylen, "by TCP: %s", !g ? "this stage runs on the CPU" : "this host's boot id is unknown");
    if (!g || !id[0]) return PS_OK;
    ps_wbuf b = {0};
    ps_wbuf_str(&b, id);
    ps_status st = send_free(c, PS_MSG_DHOP, &b, timeout_ms, err, errlen);
    uint16_t type;
    const uint8_t *p;
    uint32_t len;
    if (!st) st = ps_conn_recv(c, timeout_ms, &type, &p, &len, err, errlen);
    if (st) return st;
    if (type != PS_MSG_DHOP_REPLY)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "%s answered a device hop's offer with message type %u",
                       ps_conn_peer(c), type);
    ps_rbuf r = {.p = p, .len = len};
    uint8_t ok = ps_rbuf_u8(&r);
    if (!ok) {
        char no[400];
        ps_rbuf_str(&r, no, sizeof no);
        ps_printable(no);
        if (r.bad || r.off != len) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed DHOP_REPLY message");
        snprintf(why, whylen, "by TCP: the next stage %s", no);
        return PS_OK;
    }
    int32_t slots = ps_rbuf_i32(&r);
    uint64_t bytes = ps_rbuf_u64(&r);
    const uint8_t *handle = ps_rbuf_bytes(&r, PS_CUDA_IPC_BYTES);
    uint64_t pid = ps_rbuf_u64(&r);
    uint64_t started = ps_rbuf_u64(&r);
    if (r.bad || r.off != len || slots < 1 || slots > PS_DHOP_MAX_SLOTS || bytes < slot_bytes(s) ||
        bytes > ((uint64_t)1 << 40) || bytes % 256)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL,
                       "malformed DHOP_REPLY message (%d slots of %llu bytes; micro-batches take %zu)", slots,
                       (unsigned long long)bytes, slot_bytes(s));
    char e[300];
    if (pid < 1 || pid > INT32_MAX || (h->peer_fd = watch((long)pid, started)) < 0)
        snprintf(why, whylen, "by TCP: the next stage's process cannot be watched from here");
    else if (ps_cuda_ring_open(g, handle, slots, (size_t)bytes, &h->ring, e, sizeof e))
        snprintf(why, whylen, "by TCP: %s", e);
    else
        snprintf(why, whylen, "device to device: %d slots of %.1f MiB", slots, bytes / 1048576.0);
    if (!h->ring) ps_dhop_end(h);
    return PS_OK;
}

ps_status ps_dhop_answer(ps_dhop *h, ps_conn *c, ps_stage *s, const uint8_t *p, uint32_t len, int timeout_ms, char *why,
                         size_t whylen, char *err, size_t errlen) {
    ps_rbuf r = {.p = p, .len = len};
    char theirs[64], ours[64];
    ps_rbuf_str(&r, theirs, sizeof theirs);
    if (r.bad || r.off != len) return ps_errf(err, errlen, PS_ERR_PROTOCOL, "malformed DHOP message");
    ps_dhop_end(h);
    boot_id(ours);
    ps_cuda *g = ps_stage_cuda(s);
    uint8_t handle[PS_CUDA_IPC_BYTES];
    char e[300];
    if (!g)
        snprintf(why, whylen, "runs on the CPU");
    else if (!ours[0] || strcmp(theirs, ours))
        snprintf(why, whylen, "is on another host");
    else if (ps_cuda_ring_create(g, PS_DHOP_SLOTS, slot_bytes(s), handle, &h->ring, e, sizeof e))
        snprintf(why, whylen, "could not make a ring: %s", e);
    ps_wbuf b = {0};
    ps_wbuf_u8(&b, h->ring != NULL);
    if (h->ring) {
        ps_wbuf_i32(&b, PS_DHOP_SLOTS);
        ps_wbuf_u64(&b, slot_bytes(s));
        ps_wbuf_bytes(&b, handle, sizeof handle);
        ps_wbuf_u64(&b, (uint64_t)getpid());
        ps_wbuf_u64(&b, start_time((long)getpid()));
        snprintf(why, whylen, "device to device: %d slots of %.1f MiB", PS_DHOP_SLOTS, slot_bytes(s) / 1048576.0);
    } else {
        ps_wbuf_str(&b, why);
    }
    return send_free(c, PS_MSG_DHOP_REPLY, &b, timeout_ms, err, errlen);
}

ps_status ps_dhop_run(ps_dhop *h, ps_stage *s, ps_mb *mb, int timeout_ms, char *err, size_t errlen) {
    struct pollfd pf = {.fd = h->peer_fd, .events = POLLIN};
    if (poll(&pf, 1, 0) != 0) /* its memory may be gone: not one more touch */
        return ps_errf(err, errlen, PS_ERR_NET, "the next stage's process has exited");
    float *slot = ps_cuda_ring_slot(h->ring, h->n);
    ps_status st = ps_cuda_ring_wait(h->ring, h->n, timeout_ms, err, errlen);
    if (!st) st = ps_stage_run_into(s, mb, slot, err, errlen);
    if (st) return st;
    h->n++;
    mb->x = slot, mb->x_ring = true;
    return PS_OK;
}

ps_status ps_dhop_take(ps_dhop *h, ps_mb *mb, int dim, char *err, size_t errlen) {
    if (!h->ring)
        return ps_errf(err, errlen, PS_ERR_PROTOCOL, "a micro-batch whose activations are in a ring never offered");
    mb->x = ps_cuda_ring_slot(h->ring, h->n);
    return ps_cuda_ring_check(h->ring, h->n, (size_t)mb->n * (size_t)dim, err, errlen);
}

ps_status ps_dhop_done(ps_dhop *h, long long *bad, float *value, char *err, size_t errlen) {
    size_t i;
    *bad = ps_cuda_ring_bad(h->ring, &i, value) ? (long long)i : -1;
    return ps_cuda_ring_taken(h->ring, ++h->n, err, errlen);
}
