/* seal.h - the cryptography of sealed frames (seal.c), below frames: a connection's keys and
 * frame numbers per direction, and the sealing and opening of one payload in place.
 *
 * After a handshake with a shared key, every payload travels encrypted and authenticated
 * (ChaCha20-Poly1305, IETF) under a key per direction derived from the shared key, both
 * handshake nonces and its transcript (auth.c); the nonce is the frame's number in its
 * direction (never sent), and the first 16 header bytes (magic .. len) are authenticated
 * too (frame.c). A frame forged, altered, replayed, dropped or reordered fails to open. */
#ifndef PS_NET_SEAL_H
#define PS_NET_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NET_TAG_BYTES 16 /* the tag after a sealed payload */

typedef struct {
    uint8_t tx[32], rx[32]; /* keys of our frames and of the peer's */
    uint64_t tx_n, rx_n;    /* numbers of the next frame sealed and opened */
} net_seal;

/* A seal with both frame numbers at 0, whose keys the caller fills in, in libsodium's
 * guarded memory (sodium_init must have run); NULL when out of memory. Owned by the caller
 * until ps_net_seal_free. */
net_seal *ps_net_seal_new(void);
/* Frees (and zeroes) the keys; NULL-safe. */
void ps_net_seal_free(net_seal *s);

/* Encrypts p[0..len) in place under s->tx and the next send number, and writes the tag at
 * p + len (the caller leaves room for NET_TAG_BYTES more); ad[0..adlen) is authenticated
 * with it. Callers seal in the order the frames go on the wire. */
void ps_net_seal_payload(net_seal *s, uint8_t *p, uint32_t len, const uint8_t *ad, size_t adlen);
/* Opens p[0..len) (its last NET_TAG_BYTES the tag) in place under s->rx and the next
 * receive number, which then advances. False, with nothing advanced, when len is shorter
 * than a tag or the payload or ad fail authentication. */
bool ps_net_open_payload(net_seal *s, uint8_t *p, uint32_t len, const uint8_t *ad, size_t adlen);

#endif
