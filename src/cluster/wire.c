/* wire.c - join tokens, identities, key derivation, handshake and records
 * (wire.h).
 *
 * Layout of HELLO (124 bytes, all integers big endian; 1.x had the first 92):
 *    0  "RCMO"          magic
 *    4  u16 major        protocol version
 *    6  u16 minor
 *    8  u8  role         0 dialer, 1 listener
 *    9  u8  purpose      0 the cluster link, 1 a data channel (from 1.1)
 *   10  2 bytes          reserved, sent as 0, ignored
 *   12  16 bytes         node id (= wire_id_of_key of the static key)
 *   28  32 bytes         random nonce
 *   60  32 bytes         ephemeral X25519 public key (crypto_kx)
 *   92  32 bytes         static X25519 public key (the node's identity, 2.0)
 * AUTH (88 bytes): the cluster tag HMAC-SHA-512-256(key_auth,
 * "racimo-auth-v2" || role of the sender || HELLO of the dialer || HELLO of
 * the listener || header), the identity tag HMAC-SHA-512-256(key_confirm,
 * "racimo-identity-v2" || role of the sender || header), then the sender's
 * secretstream header.  key_confirm comes from key_schedule below.
 */
#include "cluster/wire.h"

#include "base/err.h"
#include "base/mem.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const char kdf_ctx[crypto_kdf_CONTEXTBYTES] = { 'r', 'a', 'c', 'i', 'm', 'o', 'C', 'L' };
enum { KDF_AUTH = 1, KDF_MIX = 2, KDF_FP = 3 };
#define TOKEN_CHECK 4

/* ---- tokens ---- */

static void token_check(const uint8_t key[WIRE_KEY_BYTES], uint8_t out[TOKEN_CHECK])
{
    uint8_t h[crypto_generichash_BYTES];
    crypto_generichash(h, sizeof h, key, WIRE_KEY_BYTES, (const uint8_t *)"racimo token", 12);
    memcpy(out, h, TOKEN_CHECK);
}

int wire_token_encode(const uint8_t key[WIRE_KEY_BYTES], char *out, size_t cap)
{
    uint8_t raw[WIRE_KEY_BYTES + TOKEN_CHECK];
    size_t pre = strlen(WIRE_TOKEN_PREFIX);
    size_t need = pre + sodium_base64_ENCODED_LEN(sizeof raw, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    if (cap < need)
        return rc_fail(RC_ELIMIT, "token buffer of %zu bytes is too small", cap);
    memcpy(raw, key, WIRE_KEY_BYTES);
    token_check(key, raw + WIRE_KEY_BYTES);
    memcpy(out, WIRE_TOKEN_PREFIX, pre);
    sodium_bin2base64(out + pre, cap - pre, raw, sizeof raw, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof raw);
    return 0;
}

int wire_token_decode(const char *tok, uint8_t key[WIRE_KEY_BYTES], char *hint, size_t hint_cap)
{
    if (hint && hint_cap)
        hint[0] = 0;
    if (!tok)
        return rc_fail(RC_EFORMAT, "no join token");
    while (isspace((unsigned char)*tok))
        tok++;
    size_t pre = strlen(WIRE_TOKEN_PREFIX), n = strlen(tok);
    while (n && isspace((unsigned char)tok[n - 1]))
        n--;
    if (n < pre || memcmp(tok, WIRE_TOKEN_PREFIX, pre))
        return rc_fail(RC_EFORMAT, "a join token starts with '%s' (is this a racimo token?)",
                       WIRE_TOKEN_PREFIX);
    const char *b64 = tok + pre, *at = memchr(b64, '@', n - pre);
    size_t n_b64 = at ? (size_t)(at - b64) : n - pre;
    if (at) {
        size_t n_hint = n - pre - n_b64 - 1;
        if (!hint || n_hint + 1 > hint_cap || n_hint == 0)
            return rc_fail(RC_EFORMAT, "the address after '@' in the join token is malformed");
        memcpy(hint, at + 1, n_hint);
        hint[n_hint] = 0;
    }
    uint8_t raw[WIRE_KEY_BYTES + TOKEN_CHECK], check[TOKEN_CHECK];
    size_t n_raw = 0;
    if (n_b64 != sodium_base64_ENCODED_LEN(sizeof raw, sodium_base64_VARIANT_URLSAFE_NO_PADDING) - 1 ||
        sodium_base642bin(raw, sizeof raw, b64, n_b64, NULL, &n_raw, NULL,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
        n_raw != sizeof raw)
        return rc_fail(RC_EFORMAT, "the join token is malformed (cut short or mistyped?)");
    token_check(raw, check);
    if (sodium_memcmp(check, raw + WIRE_KEY_BYTES, TOKEN_CHECK) != 0) {
        sodium_memzero(raw, sizeof raw);
        return rc_fail(RC_EFORMAT, "the join token's check digits do not match (mistyped?)");
    }
    memcpy(key, raw, WIRE_KEY_BYTES);
    sodium_memzero(raw, sizeof raw);
    return 0;
}

void wire_hex(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int wire_unhex(const char *in, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(in[2 * i]), lo = hi < 0 ? -1 : hexval(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return in[2 * n] ? -1 : 0;
}

void wire_fingerprint(const uint8_t key[WIRE_KEY_BYTES], char out[WIRE_FP_HEX + 1])
{
    uint8_t fp[16];
    crypto_kdf_derive_from_key(fp, sizeof fp, KDF_FP, kdf_ctx, key);
    wire_hex(fp, WIRE_FP_HEX / 2, out);
}

/* ---- identities ---- */

void wire_id_of_key(const uint8_t pk[WIRE_PK_BYTES], uint8_t id[WIRE_ID_BYTES])
{
    uint8_t h[32];
    crypto_generichash(h, sizeof h, pk, WIRE_PK_BYTES, (const uint8_t *)"racimo node id", 14);
    memcpy(id, h, WIRE_ID_BYTES);
}

void wire_identity_from_secret(wire_identity *out, const uint8_t sk[WIRE_PK_BYTES])
{
    memcpy(out->sk, sk, WIRE_PK_BYTES);
    crypto_scalarmult_base(out->pk, out->sk);
    wire_id_of_key(out->pk, out->id);
}

void wire_identity_new(wire_identity *out)
{
    uint8_t sk[WIRE_PK_BYTES];
    randombytes_buf(sk, sizeof sk);
    wire_identity_from_secret(out, sk);
    sodium_memzero(sk, sizeof sk);
}

/* ---- handshake ---- */

static void put16(uint8_t *p, int v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static int get16(const uint8_t *p) { return p[0] << 8 | p[1]; }

void wire_session_init(wire_session *s, const uint8_t key[WIRE_KEY_BYTES],
                       const wire_identity *self, int role, int major, int minor,
                       uint8_t hello_out[WIRE_HELLO_BYTES])
{
    if (sodium_init() < 0) {
        /* cannot happen once libsodium is linked and the system has a random
         * source; the session then fails authentication cleanly */
    }
    memset(s, 0, sizeof *s);
    s->role = role;
    s->major = major;
    s->minor = minor;
    memcpy(s->self_id, self->id, WIRE_ID_BYTES);
    memcpy(s->st_pk, self->pk, WIRE_PK_BYTES);
    memcpy(s->st_sk, self->sk, WIRE_PK_BYTES);
    crypto_kdf_derive_from_key(s->key_auth, sizeof s->key_auth, KDF_AUTH, kdf_ctx, key);
    crypto_kdf_derive_from_key(s->key_mix, sizeof s->key_mix, KDF_MIX, kdf_ctx, key);
    crypto_kx_keypair(s->kx_pk, s->kx_sk);
    uint8_t *h = s->hello_self;
    memcpy(h, "RCMO", 4);
    put16(h + 4, major);
    put16(h + 6, minor);
    h[8] = (uint8_t)role;
    h[9] = h[10] = h[11] = 0;
    memcpy(h + 12, self->id, WIRE_ID_BYTES);
    randombytes_buf(h + 28, 32);
    memcpy(h + 60, s->kx_pk, 32);
    memcpy(h + 92, self->pk, WIRE_PK_BYTES);
    memcpy(hello_out, h, WIRE_HELLO_BYTES);
}

static const uint8_t *hello_dialer(const wire_session *s)
{
    return s->role == WIRE_DIALER ? s->hello_self : s->hello_peer;
}
static const uint8_t *hello_listener(const wire_session *s)
{
    return s->role == WIRE_DIALER ? s->hello_peer : s->hello_self;
}

/* A tag a side with role `role` sends: HMAC under `key` of `label`, the
 * role, a and b (either may be empty), then its header. */
static void tag_over(const uint8_t key[32], const char *label, int role, const uint8_t *a,
                     size_t na, const uint8_t *b, size_t nb, const uint8_t hdr[WIRE_SSHDR_BYTES],
                     uint8_t tag[WIRE_TAG_BYTES])
{
    uint8_t r = (uint8_t)role;
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, key, 32);
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)label, strlen(label));
    crypto_auth_hmacsha512256_update(&st, &r, 1);
    if (na)
        crypto_auth_hmacsha512256_update(&st, a, na);
    if (nb)
        crypto_auth_hmacsha512256_update(&st, b, nb);
    crypto_auth_hmacsha512256_update(&st, hdr, WIRE_SSHDR_BYTES);
    crypto_auth_hmacsha512256_final(&st, tag);
    sodium_memzero(&st, sizeof st);
}

/* The two tags of an AUTH sent by `role`: the cluster tag (K_auth over
 * both HELLOs: proves the cluster key) and the identity tag (key_confirm,
 * which only the holders of the static secret keys can derive). */
static void auth_tags(const wire_session *s, int role, const uint8_t hdr[WIRE_SSHDR_BYTES],
                      uint8_t out[2 * WIRE_TAG_BYTES])
{
    tag_over(s->key_auth, "racimo-auth-v2", role, hello_dialer(s), WIRE_HELLO_BYTES,
             hello_listener(s), WIRE_HELLO_BYTES, hdr, out);
    tag_over(s->key_confirm, "racimo-identity-v2", role, NULL, 0, NULL, 0, hdr,
             out + WIRE_TAG_BYTES);
}

static void hash_labelled(const uint8_t key[32], const char *label, uint8_t out[32])
{
    crypto_generichash(out, 32, (const uint8_t *)label, strlen(label), key, 32);
}

/* The key schedule (docs/cluster-protocol.md §3), Noise KK-psk style:
 *   th  = BLAKE2b-256("racimo-hs-v2" || H_dialer || H_listener)
 *   ck  = BLAKE2b-256(key = K_mix, th || DH(e_d, e_l) || DH(e_d, s_l) || DH(s_d, e_l))
 *   key_d2l, key_l2d, key_confirm = BLAKE2b-256(key = ck, "d2l" / "l2d" / "confirm")
 * The transcript hash binds both static and both ephemeral keys; the two
 * static-ephemeral results make the keys unknowable without the static
 * secret keys; K_mix (the cluster key as a pre-shared key) without the
 * cluster key.  Returns -1 when a DH result is degenerate (a low-order
 * point sent as a key). */
static int key_schedule(wire_session *s)
{
    const uint8_t *peer_eph = s->hello_peer + 60, *peer_st = s->hello_peer + 92;
    uint8_t ee[32], es[32], se[32], th[32], ck[32];
    int bad = crypto_scalarmult(ee, s->kx_sk, peer_eph);
    if (s->role == WIRE_DIALER) {
        bad |= crypto_scalarmult(es, s->kx_sk, peer_st);     /* e_d . s_l */
        bad |= crypto_scalarmult(se, s->st_sk, peer_eph);    /* s_d . e_l */
    } else {
        bad |= crypto_scalarmult(es, s->st_sk, peer_eph);    /* s_l . e_d */
        bad |= crypto_scalarmult(se, s->kx_sk, peer_st);     /* e_l . s_d */
    }
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof th);
    crypto_generichash_update(&st, (const uint8_t *)"racimo-hs-v2", 12);
    crypto_generichash_update(&st, hello_dialer(s), WIRE_HELLO_BYTES);
    crypto_generichash_update(&st, hello_listener(s), WIRE_HELLO_BYTES);
    crypto_generichash_final(&st, th, sizeof th);
    crypto_generichash_init(&st, s->key_mix, sizeof s->key_mix, sizeof ck);
    crypto_generichash_update(&st, th, sizeof th);
    crypto_generichash_update(&st, ee, sizeof ee);
    crypto_generichash_update(&st, es, sizeof es);
    crypto_generichash_update(&st, se, sizeof se);
    crypto_generichash_final(&st, ck, sizeof ck);
    hash_labelled(ck, s->role == WIRE_DIALER ? "d2l" : "l2d", s->key_tx);
    hash_labelled(ck, s->role == WIRE_DIALER ? "l2d" : "d2l", s->key_rx);
    hash_labelled(ck, "confirm", s->key_confirm);
    sodium_memzero(ee, sizeof ee);
    sodium_memzero(es, sizeof es);
    sodium_memzero(se, sizeof se);
    sodium_memzero(ck, sizeof ck);
    sodium_memzero(&st, sizeof st);
    return bad ? -1 : 0;
}

int wire_hello_prefix(wire_session *s, const uint8_t *hello, size_t n)
{
    if (n < WIRE_HELLO_PREFIX || memcmp(hello, "RCMO", 4))
        return rc_fail(RC_EFORMAT, "not a racimo cluster node (bad magic)");
    s->peer_major = get16(hello + 4);
    s->peer_minor = get16(hello + 6);
    if (s->peer_major != s->major)
        return rc_fail(RC_EUNSUPPORTED,
                       "incompatible protocol versions: the peer speaks racimo cluster protocol "
                       "%d.%d, this node %d.%d (major versions must match; upgrade the older node)",
                       s->peer_major, s->peer_minor, s->major, s->minor);
    return 0;
}

int wire_on_hello(wire_session *s, const uint8_t hello[WIRE_HELLO_BYTES],
                  uint8_t auth_out[WIRE_AUTH_BYTES])
{
    int r = wire_hello_prefix(s, hello, WIRE_HELLO_BYTES);
    memcpy(s->peer_id, hello + 12, WIRE_ID_BYTES);
    if (r)
        return r;
    if (hello[8] > 1 || hello[8] == s->role)
        return rc_fail(RC_EFORMAT, "the peer's HELLO claims the wrong role");
    uint8_t given[WIRE_ID_BYTES];
    wire_id_of_key(hello + 92, given);
    if (memcmp(given, hello + 12, WIRE_ID_BYTES)) {
        char claimed[2 * WIRE_ID_BYTES + 1], real[2 * WIRE_ID_BYTES + 1];
        wire_hex(hello + 12, WIRE_ID_BYTES, claimed);
        wire_hex(given, WIRE_ID_BYTES, real);
        return rc_fail(RC_EINVAL, "the peer claims node id %s, its key gives %s", claimed, real);
    }
    s->peer_channel = hello[9] == 1;
    memcpy(s->peer_pk, hello + 92, WIRE_PK_BYTES);
    memcpy(s->hello_peer, hello, WIRE_HELLO_BYTES);
    r = key_schedule(s);
    sodium_memzero(s->kx_sk, sizeof s->kx_sk);
    sodium_memzero(s->st_sk, sizeof s->st_sk);
    if (r)
        return rc_fail(RC_EFORMAT, "the peer's ephemeral or static key is invalid");
    uint8_t *hdr = auth_out + 2 * WIRE_TAG_BYTES;
    crypto_secretstream_xchacha20poly1305_init_push(&s->tx, hdr, s->key_tx);
    auth_tags(s, s->role, hdr, auth_out);
    return 0;
}

int wire_on_auth(wire_session *s, const uint8_t auth[WIRE_AUTH_BYTES])
{
    uint8_t want[2 * WIRE_TAG_BYTES];
    const uint8_t *hdr = auth + 2 * WIRE_TAG_BYTES;
    auth_tags(s, 1 - s->role, hdr, want);
    int cluster_ok = sodium_memcmp(want, auth, WIRE_TAG_BYTES) == 0;
    int id_ok = sodium_memcmp(want + WIRE_TAG_BYTES, auth + WIRE_TAG_BYTES, WIRE_TAG_BYTES) == 0;
    sodium_memzero(want, sizeof want);
    if (!cluster_ok)
        return rc_fail(RC_EINVAL, "authentication failed: the peer does not hold this "
                                  "cluster's key (a node of another cluster, or a wrong --join token)");
    if (!id_ok) {
        char idh[2 * WIRE_ID_BYTES + 1];
        wire_hex(s->peer_id, WIRE_ID_BYTES, idh);
        return rc_fail(RC_EINVAL, "identity not proven: the peer does not hold the secret key of "
                                  "node %s, whose public key its HELLO gives", idh);
    }
    if (crypto_secretstream_xchacha20poly1305_init_pull(&s->rx, hdr, s->key_rx) != 0)
        return rc_fail(RC_EINVAL, "the peer's stream header is invalid");
    s->established = true;
    return 0;
}

void wire_session_claim_id(wire_session *s, const uint8_t id[WIRE_ID_BYTES],
                           uint8_t hello_out[WIRE_HELLO_BYTES])
{
    memcpy(s->hello_self + 12, id, WIRE_ID_BYTES);
    memcpy(hello_out, s->hello_self, WIRE_HELLO_BYTES);
}

void wire_session_mark_channel(wire_session *s, uint8_t hello_out[WIRE_HELLO_BYTES])
{
    s->hello_self[9] = 1;
    memcpy(hello_out, s->hello_self, WIRE_HELLO_BYTES);
}

void wire_session_wipe(wire_session *s)
{
    sodium_memzero(s, sizeof *s);
}

/* ---- records ---- */

long wire_seal_raw(wire_session *s, const uint8_t *plain, size_t n, bool final, uint8_t *out)
{
    if (!s->established || s->tx_final)
        return rc_fail(RC_ESTATE, "sealing on a closed or unestablished session");
    if (n == 0 || n > WIRE_FRAME_MAX)
        return rc_fail(RC_ELIMIT, "frame of %zu bytes (limit %u)", n, WIRE_FRAME_MAX);
    size_t n_ct = n + WIRE_ABYTES;
    wire_put32(out, (uint32_t)n_ct);
    unsigned long long clen = 0;
    crypto_secretstream_xchacha20poly1305_push(
        &s->tx, out + 4, &clen, plain, n, out, 4,
        final ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
              : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
    if (final)
        s->tx_final = true;
    return (long)(4 + n_ct);
}

long wire_seal(wire_session *s, uint8_t type, uint8_t flags, uint32_t stream,
               const uint8_t *payload, size_t n_payload, bool final, uint8_t *out)
{
    if (n_payload > WIRE_PAYLOAD_MAX)
        return rc_fail(RC_ELIMIT, "frame payload of %zu bytes (limit %u)", n_payload,
                       (unsigned)WIRE_PAYLOAD_MAX);
    size_t n = WIRE_FRAME_HDR + n_payload;
    uint8_t *tmp = rc_malloc(n);
    if (!tmp)
        return rc_fail(RC_ENOMEM, "sealing a frame of %zu bytes", n);
    tmp[0] = type;
    tmp[1] = flags;
    tmp[2] = tmp[3] = 0;
    wire_put32(tmp + 4, stream);
    if (n_payload)
        memcpy(tmp + WIRE_FRAME_HDR, payload, n_payload);
    long r = wire_seal_raw(s, tmp, n, final, out);
    rc_free(tmp);
    return r;
}

long wire_open(wire_session *s, const uint8_t *in, size_t n_in, uint8_t *plain, wire_frame *f)
{
    if (!s->established)
        return rc_fail(RC_ESTATE, "record before the handshake completed");
    if (n_in < 4)
        return 0;
    uint32_t n = wire_get32(in);
    if (n > WIRE_FRAME_MAX + WIRE_ABYTES)
        return rc_fail(RC_ELIMIT, "oversized record: %u bytes (limit %u)", n,
                       (unsigned)(WIRE_FRAME_MAX + WIRE_ABYTES));
    if (n < WIRE_FRAME_HDR + WIRE_ABYTES)
        return rc_fail(RC_EFORMAT, "record of %u bytes is too short", n);
    if (s->rx_final)
        return rc_fail(RC_EFORMAT, "record after the peer's final record");
    if (n_in - 4 < n)
        return 0;
    unsigned long long mlen = 0;
    unsigned char tag = 0;
    if (crypto_secretstream_xchacha20poly1305_pull(&s->rx, plain, &mlen, &tag, in + 4, n, in, 4) != 0)
        return rc_fail(RC_EFORMAT, "record failed authentication (forged, tampered, replayed "
                                   "or out of order)");
    if (tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL)
        s->rx_final = true;
    if (plain[0] == 0)
        return rc_fail(RC_EFORMAT, "frame of type 0");
    f->type = plain[0];
    f->flags = plain[1];
    f->stream = wire_get32(plain + 4);
    f->payload = plain + WIRE_FRAME_HDR;
    f->n_payload = (size_t)mlen - WIRE_FRAME_HDR;
    f->final = s->rx_final;
    return (long)(4 + n);
}

/* ---- reassembly ---- */

void wire_asm_init(wire_asm *a, size_t max_bytes)
{
    memset(a, 0, sizeof *a);
    a->max_bytes = max_bytes ? max_bytes : WIRE_MSG_MAX;
}

void wire_asm_free(wire_asm *a)
{
    for (int i = 0; i < WIRE_MAX_STREAMS; i++)
        rc_free(a->st[i].buf);
    memset(a, 0, sizeof *a);
}

int wire_asm_add(wire_asm *a, const wire_frame *f, wire_msg *m)
{
    /* buffers of finished messages larger than a frame are released now
     * (the caller was done with them) so a burst does not pin memory */
    int slot = -1, free_slot = -1;
    for (int i = 0; i < WIRE_MAX_STREAMS; i++) {
        if (!a->st[i].used && a->st[i].cap > 2 * WIRE_FRAME_MAX) {
            rc_free(a->st[i].buf);
            a->st[i].buf = NULL;
            a->st[i].cap = 0;
        }
        if (a->st[i].used && a->st[i].stream == f->stream)
            slot = i;
        else if (!a->st[i].used && free_slot < 0)
            free_slot = i;
    }
    bool more = f->flags & WIRE_F_MORE;
    if (slot < 0 && !more) {
        m->type = f->type;
        m->stream = f->stream;
        m->data = f->payload;
        m->len = f->n_payload;
        return 1;
    }
    if (slot < 0) {
        if (free_slot < 0)
            return rc_fail(RC_ELIMIT, "more than %d messages in flight at once", WIRE_MAX_STREAMS);
        slot = free_slot;
        a->st[slot].used = true;
        a->st[slot].stream = f->stream;
        a->st[slot].type = f->type;
        a->st[slot].len = 0;
    }
    wire_asm_slot *st = &a->st[slot];
    if (st->type != f->type)
        return rc_fail(RC_EFORMAT, "stream %u changed type from %u to %u", (unsigned)f->stream,
                       (unsigned)st->type, (unsigned)f->type);
    if (f->n_payload > a->max_bytes - st->len)
        return rc_fail(RC_ELIMIT, "message of over %zu bytes (limit %zu)", st->len + f->n_payload,
                       a->max_bytes);
    if (st->len + f->n_payload > st->cap) {
        size_t cap = st->cap ? st->cap : WIRE_FRAME_MAX;
        while (cap < st->len + f->n_payload)
            cap *= 2;
        if (cap > a->max_bytes)
            cap = a->max_bytes;
        uint8_t *nb = rc_realloc(st->buf, cap);
        if (!nb)
            return rc_fail(RC_ENOMEM, "reassembling a message of %zu bytes", cap);
        st->buf = nb;
        st->cap = cap;
    }
    if (f->n_payload)
        memcpy(st->buf + st->len, f->payload, f->n_payload);
    st->len += f->n_payload;
    if (more)
        return 0;
    st->used = false;
    m->type = st->type;
    m->stream = st->stream;
    m->data = st->buf;
    m->len = st->len;
    return 1;
}
