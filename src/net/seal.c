/* seal.c - the cryptography of sealed frames (see seal.h): ChaCha20-Poly1305 (IETF,
 * libsodium) over one payload in place, the nonce being the frame's number in its direction.
 *
 * The bottom of the frame stack: it knows nothing of sockets, connections or headers (the
 * caller hands it the header bytes to authenticate) and uses nothing else of src/net. */
#include <sodium.h>
#include <string.h>

#include "seal.h"

_Static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == NET_TAG_BYTES, "tags are 16 bytes");
_Static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == 32, "frame keys are 32 bytes");

net_seal *ps_net_seal_new(void) {
    net_seal *s = sodium_malloc(sizeof *s);
    if (s) s->tx_n = s->rx_n = 0;
    return s;
}

void ps_net_seal_free(net_seal *s) {
    if (s) sodium_free(s); /* zeroes it */
}

/* The 96-bit nonce of frame number n: n little-endian, then zeros. */
static void frame_nonce(uint64_t n, uint8_t out[crypto_aead_chacha20poly1305_ietf_NPUBBYTES]) {
    memset(out, 0, crypto_aead_chacha20poly1305_ietf_NPUBBYTES);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(n >> (8 * i));
}

void ps_net_seal_payload(net_seal *s, uint8_t *p, uint32_t len, const uint8_t *ad, size_t adlen) {
    uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
    frame_nonce(s->tx_n++, nonce);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(p, p + len, NULL, p, len, ad, adlen, NULL, nonce, s->tx);
}

bool ps_net_open_payload(net_seal *s, uint8_t *p, uint32_t len, const uint8_t *ad, size_t adlen) {
    uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
    frame_nonce(s->rx_n, nonce);
    uint32_t n = len - NET_TAG_BYTES;
    if (len < NET_TAG_BYTES ||
        crypto_aead_chacha20poly1305_ietf_decrypt_detached(p, NULL, p, n, p + n, ad, adlen, nonce, s->rx) != 0)
        return false;
    s->rx_n++;
    return true;
}
