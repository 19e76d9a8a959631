/* fuzz_frame.c - libFuzzer target for the cluster's wire format (wire.h).
 *
 * The first byte picks what the rest is:
 *   0  a peer's HELLO then AUTH, fed to a listener's handshake (the version
 *      prefix first, then the HELLO with its node id and static key, then
 *      the two tags);
 *   3  an honest dialer's HELLO with fuzzer bytes laid over it (u8 offset,
 *      u8 value pairs), then a listener's handshake, then AUTH bytes: a
 *      HELLO altered in flight must never establish;
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
static uint8_t plain[WIRE_FRAME_MAX], rec[WIRE_REC_MAX];
static wire_identity id_d, id_l;

/* Fixed identities, so a crashing input replays the same way. */
static void identities(void)
{
    static int made;
    if (!made) {
        uint8_t sk[32] = { 1 };
        wire_identity_from_secret(&id_d, sk);
        sk[0] = 2;
        wire_identity_from_secret(&id_l, sk);
        made = 1;
    }
}

static int pair(wire_session *d, wire_session *l)
{
    uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
    wire_session_init(d, KEY, &id_d, WIRE_DIALER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hd);
    wire_session_init(l, KEY, &id_l, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hl);
    if (wire_on_hello(d, hl, ad) || wire_on_hello(l, hd, al) || wire_on_auth(l, ad) || wire_on_auth(d, al))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 4;
    data++;
    size--;
    identities();
    wire_session d, l;
    wire_frame f;
    if (mode == 0) {
        uint8_t hl[WIRE_HELLO_BYTES], al[WIRE_AUTH_BYTES];
        wire_session_init(&l, KEY, &id_l, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hl);
        if (wire_hello_prefix(&l, data, size) || size < WIRE_HELLO_BYTES ||
            wire_on_hello(&l, data, al))
            return 0;
        if (size >= WIRE_HELLO_BYTES + WIRE_AUTH_BYTES && wire_on_auth(&l, data + WIRE_HELLO_BYTES) == 0)
            abort();    /* nobody without the keys can authenticate */
        return 0;
    }
    if (mode == 3) {
        uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
        uint8_t sent[WIRE_HELLO_BYTES];
        wire_session_init(&d, KEY, &id_d, WIRE_DIALER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hd);
        wire_session_init(&l, KEY, &id_l, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hl);
        memcpy(sent, hd, sizeof sent);
        size_t off = 0;
        for (; off + 2 <= size && data[off] != 0xff; off += 2)
            hd[data[off] % WIRE_HELLO_BYTES] = data[off + 1];
        bool altered = memcmp(sent, hd, sizeof hd) != 0;
        if (wire_on_hello(&l, hd, al) || wire_on_hello(&d, hl, ad))
            return 0;
        if (altered && wire_on_auth(&l, ad) == 0)
            abort();    /* the dialer's tags cover its HELLO as it sent it */
        if (altered && wire_on_auth(&d, al) == 0)
            abort();    /* and the listener's tags the HELLO it saw */
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
