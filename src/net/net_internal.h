/* net_internal.h - the connection's private state, and what the files of src/net/ share.
 *
 * The files, bottom up; each uses only those above it in this list (and ../ps.c):
 * buf.c     little-endian payload builders and bounded readers (ps_wbuf, ps_rbuf)
 * seal.c    the cryptography of sealed frames (seal.h): keys, frame numbers, AEAD in place
 * socket.c  addresses, listen/accept/dial, the connection object and its accessors
 * frame.c   header codec, sealing and opening a frame, the synchronous send and receive of
 *           one frame, send counters
 * link.c    the sender thread (a FIFO of frames, link emulation); ps_conn_send and
 *           ps_conn_free, which must know whether that thread runs
 * auth.c    shared keys and the handshake, which starts sealing
 *
 * Every connection socket is non-blocking (O_NONBLOCK): each read and write waits in
 * poll() with the time left before its deadline, so no call can block past its timeout. */
#ifndef PS_NET_INTERNAL_H
#define PS_NET_INTERNAL_H

#include <pthread.h>

#include "net.h"
#include "seal.h"

#define NET_DEFAULT_MAX_PAYLOAD (64u * 1024u) /* payload limit until the handshake raises it */
#define NET_PEER_MAX            320           /* "[host]:port" with a 255-byte host name */

/* Header flags. Bit 0 of a REFUSE frame: the refusal is about keys or proofs (the
 * receiver returns PS_ERR_AUTH rather than PS_ERR_PROTOCOL). Other bits are reserved:
 * sent as 0, ignored on receipt. */
#define NET_FLAG_REFUSE_AUTH 1u

typedef struct net_sender net_sender; /* link.c */

struct ps_conn {
    int fd;                  /* connected TCP or Unix socket, O_NONBLOCK, owned */
    char peer[NET_PEER_MAX]; /* "HOST:PORT" (or "unix:PATH") of the other end, for messages */
    uint32_t max_payload;    /* largest payload recv accepts */
    uint8_t *rbuf;           /* (rcap) receive buffer, grown to the largest payload seen */
    size_t rcap;
    pthread_mutex_t stats_mu; /* guards stats: the sender thread adds to them too */
    ps_conn_stats stats;
    net_sender *snd; /* NULL until ps_conn_start_sender */
    net_seal *seal;  /* NULL: plain frames (no shared key) */
    uint8_t *sbuf;   /* (scap) sealed payload of a frame sent without the sender thread */
    size_t scap;
};

// ---------------------------------------------------------------------------------------
// socket.c

/* errno's message for err lines: lowercase first letter ("connection refused"), in buf. */
const char *ps_net_errno_str(int errnum, char *buf, size_t cap);

// ---------------------------------------------------------------------------------------
// frame.c

/* Encodes the header of a frame of type/flags whose payload is iov[0..iovcnt): len and
 * the XXH3-64 checksum are computed here. Fails (PS_ERR_ARG) when the payload exceeds
 * 4 GiB - 1. */
ps_status ps_net_frame_header(uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt,
                              uint8_t out[PS_NET_HDR_BYTES], uint32_t *len, char *err, size_t errlen);
/* The payload length of iov[0..iovcnt) in *len; fails (PS_ERR_ARG) when the frame (with a
 * tag when c is sealed) would exceed 4 GiB - 1. */
ps_status ps_net_payload_len(const ps_conn *c, const struct iovec *iov, int iovcnt, uint32_t *len, char *err,
                             size_t errlen);
/* Copies the bytes of iov[0..iovcnt) one after the other into out. */
void ps_net_gather(uint8_t *out, const struct iovec *iov, int iovcnt);

/* With c->seal: copies the payload iov[0..iovcnt) (len bytes) into out (room for len +
 * NET_TAG_BYTES), seals it there under the next send number, and encodes the header (len
 * and checksum of what goes on the wire: *wire_len bytes). Callers seal in the order the
 * frames go on the wire. */
void ps_net_seal_frame(ps_conn *c, uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt, uint32_t len,
                       uint8_t *out, uint8_t hdr[PS_NET_HDR_BYTES], uint32_t *wire_len);

/* Writes every byte of iov[0..iovcnt) to fd (sendmsg, MSG_NOSIGNAL, restarting after
 * EINTR and partial writes; iov is advanced in place). Waits in poll() until deadline_ns
 * (-1 = none) and, when wake_fd >= 0, until wake_fd becomes readable. Returns 0, or the
 * errno that stopped it: ETIMEDOUT past the deadline, ECANCELED when woken. */
int ps_net_write_all(int fd, int wake_fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
/* The err line for a write to c that ps_net_write_all stopped with errnum (PS_ERR_TIMEOUT
 * for ETIMEDOUT, naming timeout_ms; else PS_ERR_NET naming the peer). */
ps_status ps_net_write_error(const ps_conn *c, int errnum, int timeout_ms, char *err, size_t errlen);
/* Adds one sent frame to c's stats (thread-safe). */
void ps_net_stats_add(ps_conn *c, uint64_t bytes, double ms);

/* ps_conn_send with header flags; never goes through the sender thread. */
ps_status ps_net_send_frame(ps_conn *c, uint16_t type, uint32_t flags, const struct iovec *iov, int iovcnt,
                            int timeout_ms, char *err, size_t errlen);
/* ps_conn_recv returning the whole header. *h is zeroed first and filled as soon as a
 * header has been read, so after an error the caller can tell a frame of another
 * protocol version (PS_ERR_PROTOCOL with h->magic == PS_NET_MAGIC and h->version !=
 * PS_NET_VERSION; its payload has been read and dropped when it was within the limit, so
 * the connection can still carry a REFUSE). */
ps_status ps_net_recv_frame(ps_conn *c, int timeout_ms, ps_frame_hdr *h, const uint8_t **payload, char *err,
                            size_t errlen);

#endif
