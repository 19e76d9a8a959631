/* fwd_wire.h - the FWD_REQUEST message (docs/cluster-protocol.md §12): its
 * encoding, and the bounds-checked parse of what a peer sent. */
#ifndef RC_API_FWD_WIRE_H
#define RC_API_FWD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define FWD_PROOF_BYTES 32

typedef struct {
    uint32_t id;
    char path[64];                    /* NUL-terminated */
    const uint8_t *client;            /* the client's address, as sent (not terminated) */
    size_t client_len;
    const uint8_t *proof;             /* FWD_PROOF_BYTES, or NULL: no key presented */
    const uint8_t *body;
    size_t body_len;
} fwd_request;

/* The size of the message that holds r. */
size_t fwd_request_size(const fwd_request *r);

/* Writes r into out (fwd_request_size bytes). */
void fwd_request_encode(const fwd_request *r, uint8_t *out);

/* Fills *r with pointers into d.  -1 with `why` when a field overruns the
 * message, the path is longer than 63 bytes or holds a NUL, or the proof is
 * neither absent nor FWD_PROOF_BYTES long.  Whether the path may be
 * forwarded is the caller's check. */
int fwd_request_parse(const uint8_t *d, size_t len, fwd_request *r, char *why, size_t cap);

#endif
