/* swim_seal.c - SWIM datagrams sealed with the cluster key (swim_seal.h). */
#include "cluster/swim_seal.h"

#include "base/err.h"

#include <sodium.h>

#define KDF_SWIM 4                 /* after wire.c's subkeys 1-3 */
static const char kdf_ctx[crypto_kdf_CONTEXTBYTES] = { 'r', 'a', 'c', 'i', 'm', 'o', 'C', 'L' };
static const uint8_t aad[] = "racimo swim 1";

_Static_assert(SWIM_SEAL_OVERHEAD == crypto_aead_xchacha20poly1305_ietf_NPUBBYTES +
               crypto_aead_xchacha20poly1305_ietf_ABYTES, "seal overhead");

void swim_seal_key(const uint8_t cluster_key[32], uint8_t out[SWIM_SEAL_KEY_BYTES])
{
    crypto_kdf_derive_from_key(out, SWIM_SEAL_KEY_BYTES, KDF_SWIM, kdf_ctx, cluster_key);
}

int swim_seal(const uint8_t key[SWIM_SEAL_KEY_BYTES], const uint8_t *packet, size_t len,
              uint8_t *out, size_t cap)
{
    if (len > (size_t)1 << 30 || cap < len + SWIM_SEAL_OVERHEAD)
        return rc_fail(RC_ELIMIT, "membership datagram: %zu bytes, room for %zu", len, cap);
    uint8_t *nonce = out;
    randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
    unsigned long long clen;
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
                                               &clen, packet, len, aad, sizeof aad - 1, NULL,
                                               nonce, key);
    return (int)(clen + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
}

int swim_open(const uint8_t key[SWIM_SEAL_KEY_BYTES], const uint8_t *dgram, size_t len,
              uint8_t *out, size_t cap)
{
    if (len < SWIM_SEAL_OVERHEAD || len > (size_t)1 << 30)
        return rc_fail(RC_EFORMAT, "membership datagram: %zu bytes, too short", len);
    if (cap < len - SWIM_SEAL_OVERHEAD)
        return rc_fail(RC_ELIMIT, "membership datagram: %zu bytes, room for %zu", len, cap);
    unsigned long long plen;
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(
            out, &plen, NULL, dgram + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
            len - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, aad, sizeof aad - 1, dgram, key) != 0)
        return rc_fail(RC_EFORMAT, "membership datagram does not open with the cluster key "
                       "(another cluster, or altered)");
    return (int)plen;
}
