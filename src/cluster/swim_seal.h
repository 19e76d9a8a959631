/* swim_seal.h - sealing SWIM datagrams (swim.h) with the cluster key.
 *
 * A datagram is nonce[24] || XChaCha20-Poly1305(K_swim, nonce, packet,
 * aad = "racimo swim 1"), K_swim being subkey 4 of the cluster key
 * (docs/cluster-protocol.md, sections 1 and 14).  Opening proves the sender
 * holds the cluster key; the member id inside is not otherwise proven.
 */
#ifndef RC_SWIM_SEAL_H
#define RC_SWIM_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define SWIM_SEAL_KEY_BYTES 32
#define SWIM_SEAL_OVERHEAD  (24 + 16)     /* nonce and tag */

/* K_swim from the 32-byte cluster key */
void swim_seal_key(const uint8_t cluster_key[32], uint8_t out[SWIM_SEAL_KEY_BYTES]);

/* Seals len bytes into out (cap >= len + SWIM_SEAL_OVERHEAD); returns the
 * datagram's length, or RC_ELIMIT when out is too small. */
int swim_seal(const uint8_t key[SWIM_SEAL_KEY_BYTES], const uint8_t *packet, size_t len,
              uint8_t *out, size_t cap);

/* Opens a datagram from the network into out (cap >= len - overhead);
 * returns the packet's length, or RC_EFORMAT (too short, or it does not
 * open: another key, altered, or not ours). */
int swim_open(const uint8_t key[SWIM_SEAL_KEY_BYTES], const uint8_t *dgram, size_t len,
              uint8_t *out, size_t cap);

#endif
