/* fuzz_fwd_request.c - libFuzzer target for FWD_REQUEST as a peer may send
 * it (src/api/fwd_wire.c, docs/cluster-protocol.md §12): the input is the
 * message.  A parse that succeeds must point inside the message, with a
 * terminated path of the length sent, a proof of 0 or 32 bytes, and fields
 * that add up to the whole; encoding what it parsed must give the message
 * back byte for byte.  Seeds: fuzz/corpus/fwd_request. */
#include "api/fwd_wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t out[1 << 17];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fwd_request r;
    char why[128];
    if (fwd_request_parse(data, size, &r, why, sizeof why)) {
        if (!why[0])
            abort();                          /* a refusal always says why */
        return 0;
    }
    const uint8_t *end = data + size;
    size_t pl = strlen(r.path);
    if (pl >= sizeof r.path || r.client < data || r.client + r.client_len > end ||
        r.body < data || r.body + r.body_len != end ||
        (r.proof && (r.proof < data || r.proof + FWD_PROOF_BYTES > end)))
        abort();
    size_t n = fwd_request_size(&r);
    if (n != size || n > sizeof out)
        abort();
    fwd_request_encode(&r, out);
    if (memcmp(out, data, size))
        abort();
    return 0;
}
