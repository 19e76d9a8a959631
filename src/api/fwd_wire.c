/* fwd_wire.c - FWD_REQUEST (fwd_wire.h): u32 id (big-endian, as every u32
 * of the forwarding messages), u16 path length, path, u16 length, the
 * client's address, u16 length (0 or 32), the key proof, body (the rest);
 * the u16 lengths are little-endian. */
#include "fwd_wire.h"
#include "cluster/wire.h"

#include <stdio.h>
#include <string.h>

static void put16(uint8_t *p, size_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static size_t get16(const uint8_t *p) { return (size_t)p[0] | (size_t)p[1] << 8; }

size_t fwd_request_size(const fwd_request *r)
{
    return 10 + strlen(r->path) + r->client_len + (r->proof ? FWD_PROOF_BYTES : 0) + r->body_len;
}

void fwd_request_encode(const fwd_request *r, uint8_t *out)
{
    size_t pl = strlen(r->path), kl = r->proof ? FWD_PROOF_BYTES : 0;
    wire_put32(out, r->id);
    put16(out + 4, pl);
    memcpy(out + 6, r->path, pl);
    uint8_t *p = out + 6 + pl;
    put16(p, r->client_len);
    if (r->client_len)
        memcpy(p + 2, r->client, r->client_len);
    p += 2 + r->client_len;
    put16(p, kl);
    if (kl)
        memcpy(p + 2, r->proof, kl);
    p += 2 + kl;
    if (r->body_len)
        memcpy(p, r->body, r->body_len);
}

int fwd_request_parse(const uint8_t *d, size_t len, fwd_request *r, char *why, size_t cap)
{
    memset(r, 0, sizeof *r);
    if (len < 6) {
        snprintf(why, cap, "a request of %zu bytes", len);
        return -1;
    }
    r->id = wire_get32(d);
    size_t pl = get16(d + 4), at = 6 + pl;
    if (pl >= sizeof r->path || memchr(d + 6, 0, pl < len - 6 ? pl : len - 6)) {
        snprintf(why, cap, "a path of %zu bytes, or holding a NUL", pl);
        return -1;
    }
    if (at + 2 > len || at + 2 + get16(d + at) + 2 > len) {
        snprintf(why, cap, "the path or the client's address overrun the message");
        return -1;
    }
    memcpy(r->path, d + 6, pl);
    r->path[pl] = '\0';
    r->client_len = get16(d + at);
    r->client = d + at + 2;
    at += 2 + r->client_len;
    size_t kl = get16(d + at);
    at += 2;
    if ((kl != 0 && kl != FWD_PROOF_BYTES) || at + kl > len) {
        snprintf(why, cap, "a key proof of %zu bytes", kl);
        return -1;
    }
    r->proof = kl ? d + at : NULL;
    r->body = d + at + kl;
    r->body_len = len - at - kl;
    return 0;
}
