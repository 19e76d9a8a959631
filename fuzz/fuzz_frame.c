/* fuzz_frame.c - libFuzzer target for the cluster's wire format (wire.h).
 *
 * The first byte picks what the rest is:
 *   0  a peer's HELLO then AUTH, fed to a listener's handshake;
 *   1  raw bytes arriving on an established link, opened record by record
 *      (almost all fail authentication: this covers lengths and limits);
 *   2  plaintext frames of any shape, each "u16 length | bytes", sealed by
 *      an honest sender and opened and reassembled by the receiver - so the
 *      frame header and reassembly see arbitrary content.
 * Seeds: fuzz/corpus/frame.
 */
#include "base/err.h"
#include "cluster/wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t KEY[32] = { 0x52, 0x43 };
static const uint8_t ID_D[16] = { 1 }, ID_L[16] = { 2 };
static uint8_t plain[WIRE_FRAME_MAX], rec[WIRE_REC_MAX];

static int pair(wire_session *d, wire_session *l)
{
    uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
    wire_session_init(d, KEY, ID_D, WIRE_DIALER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hd);
    wire_session_init(l, KEY, ID_L, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hl);
    if (wire_on_hello(d, hl, ad) || wire_on_hello(l, hd, al) || wire_on_auth(l, ad) || wire_on_auth(d, al))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    wire_session d, l;
    wire_frame f;
    if (mode == 0) {
        uint8_t hl[WIRE_HELLO_BYTES], al[WIRE_AUTH_BYTES];
        wire_session_init(&l, KEY, ID_L, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hl);
        if (size < WIRE_HELLO_BYTES || wire_on_hello(&l, data, al))
            return 0;
        if (size >= WIRE_HELLO_BYTES + WIRE_AUTH_BYTES && wire_on_auth(&l, data + WIRE_HELLO_BYTES) == 0)
            abort();    /* nobody without the key can authenticate */
        return 0;
    }
    pair(&d, &l);
    wire_asm a;
    wire_asm_init(&a, 4u << 20);
    if (mode == 1) {
        size_t off = 0;
        for (;;) {
            long r = wire_open(&l, data + off, size - off, plain, &f);
            if (r <= 0)
                break;
            abort();    /* a record nobody sealed opened */
        }
    } else {
        size_t off = 0;
        while (off + 2 <= size) {
            size_t n = (size_t)data[off] << 8 | data[off + 1];
            off += 2;
            if (n > size - off)
                n = size - off;
            if (n == 0)
                break;
            long s = wire_seal_raw(&d, data + off, n, false, rec);
            if (s <= 0)
                abort();
            long r = wire_open(&l, rec, (size_t)s, plain, &f);
            if (r < 0 && data[off] != 0 && n >= WIRE_FRAME_HDR)
                abort();        /* only frames of type 0 may be refused */
            if (r > 0) {
                if (f.n_payload + WIRE_FRAME_HDR != n || memcmp(f.payload, data + off + WIRE_FRAME_HDR, f.n_payload))
                    abort();
                wire_msg m;
                if (wire_asm_add(&a, &f, &m) < 0)
                    break;
            }
            if (r < 0)
                break;
            off += n;
        }
    }
    wire_asm_free(&a);
    return 0;
}
