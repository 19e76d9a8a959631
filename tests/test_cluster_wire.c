/* test_cluster_wire.c - the cluster's pure formats: join tokens, the
 * handshake and node identities, records and frames (replay, tampering, truncation, limits),
 * reassembly, and mDNS messages (well formed and hostile). */
#include "test.h"

#include "base/err.h"
#include "base/mem.h"
#include "cluster/mdns.h"
#include "cluster/wire.h"

static const uint8_t KEY_A[32] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32 };
static const uint8_t KEY_B[32] = { 9 };

TEST(cluster_token_roundtrip)
{
    char tok[WIRE_TOKEN_MAX], hint[80];
    uint8_t key[32];
    CHECK_OK(wire_token_encode(KEY_A, tok, sizeof tok));
    CHECK(!strncmp(tok, "racimo1-", 8));
    CHECK_INT(strlen(tok), ==, 8 + 48);
    CHECK_OK(wire_token_decode(tok, key, hint, sizeof hint));
    CHECK(!memcmp(key, KEY_A, 32));
    CHECK_STR(hint, "");
    /* white space around it, and a hint */
    char spaced[WIRE_TOKEN_MAX + 40];
    snprintf(spaced, sizeof spaced, "  %s@10.0.0.1:7719\n", tok);
    CHECK_OK(wire_token_decode(spaced, key, hint, sizeof hint));
    CHECK_STR(hint, "10.0.0.1:7719");
    /* a typo is caught by the check digits, a cut by the length */
    char bad[WIRE_TOKEN_MAX];
    snprintf(bad, sizeof bad, "%s", tok);
    bad[20] = bad[20] == 'A' ? 'B' : 'A';
    CHECK_INT(wire_token_decode(bad, key, NULL, 0), ==, RC_EFORMAT);
    bad[20] = tok[20];
    bad[40] = 0;
    CHECK_INT(wire_token_decode(bad, key, NULL, 0), ==, RC_EFORMAT);
    CHECK_INT(wire_token_decode("racimo2-abc", key, NULL, 0), ==, RC_EFORMAT);
    CHECK_INT(wire_token_decode("", key, NULL, 0), ==, RC_EFORMAT);
    CHECK_INT(wire_token_encode(KEY_A, tok, 20), ==, RC_ELIMIT);
    /* fingerprints: stable, differ per key, reveal nothing of the key */
    char fa[17], fb[17], fa2[17];
    wire_fingerprint(KEY_A, fa);
    wire_fingerprint(KEY_A, fa2);
    wire_fingerprint(KEY_B, fb);
    CHECK_STR(fa, fa2);
    CHECK(strcmp(fa, fb));
    CHECK_INT(strlen(fa), ==, 16);
}

typedef struct {
    wire_session d, l;
} pair;

static wire_identity ident_d, ident_l;

/* The two test identities, made once. */
static void idents(void)
{
    static bool made;
    if (!made) {
        wire_identity_new(&ident_d);
        wire_identity_new(&ident_l);
        made = true;
    }
}

/* A full handshake between a dialer with key kd and a listener with kl.
 * Returns 0 when both ends are established, else the first failure. */
static int handshake(pair *p, const uint8_t *kd, const uint8_t *kl, int major_d, int major_l)
{
    idents();
    uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
    wire_session_init(&p->d, kd, &ident_d, WIRE_DIALER, major_d, 3, hd);
    wire_session_init(&p->l, kl, &ident_l, WIRE_LISTENER, major_l, 0, hl);
    int r;
    if ((r = wire_on_hello(&p->d, hl, ad)) || (r = wire_on_hello(&p->l, hd, al)))
        return r;
    if ((r = wire_on_auth(&p->l, ad)))
        return r;
    return wire_on_auth(&p->d, al);
}

TEST(cluster_handshake_ok_and_refused)
{
    pair p;
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    CHECK(p.d.established && p.l.established);
    CHECK(!memcmp(p.d.peer_id, ident_l.id, 16));
    CHECK(!memcmp(p.l.peer_id, ident_d.id, 16));
    CHECK(!memcmp(p.l.peer_pk, ident_d.pk, 32));
    CHECK_INT(p.l.peer_minor, ==, 3);
    /* the wrong key: both sides refuse, naming the cause */
    CHECK_INT(handshake(&p, KEY_A, KEY_B, 2, 2), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "cluster's key"));
    CHECK(!p.l.established);
    /* other major versions: refused with both versions in the message, from
     * the first 8 bytes alone */
    CHECK_INT(handshake(&p, KEY_A, KEY_A, 2, 1), ==, RC_EUNSUPPORTED);
    CHECK(strstr(rc_errmsg(), "1.0"));
    CHECK(strstr(rc_errmsg(), "2.3"));
    uint8_t h[WIRE_HELLO_BYTES], a[WIRE_AUTH_BYTES], junk[WIRE_HELLO_BYTES];
    wire_session_init(&p.l, KEY_A, &ident_l, WIRE_LISTENER, 1, 3, h);
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, junk);
    CHECK_INT(wire_hello_prefix(&p.d, h, WIRE_HELLO_PREFIX), ==, RC_EUNSUPPORTED);
    CHECK(strstr(rc_errmsg(), "protocol 1.3, this node 2.0"));
    /* not racimo at all */
    memset(junk, 'G', sizeof junk);
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, h);
    CHECK_INT(wire_hello_prefix(&p.d, junk, WIRE_HELLO_PREFIX), ==, RC_EFORMAT);
    CHECK_INT(wire_on_hello(&p.d, junk, a), ==, RC_EFORMAT);
    /* a reflected HELLO (same role) is refused */
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, h);
    CHECK_INT(wire_on_hello(&p.d, h, a), ==, RC_EFORMAT);
    /* a reflected AUTH fails: the tag binds the sender's role */
    uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, hd);
    wire_session_init(&p.l, KEY_A, &ident_l, WIRE_LISTENER, 2, 0, hl);
    CHECK_OK(wire_on_hello(&p.d, hl, ad));
    CHECK_OK(wire_on_hello(&p.l, hd, al));
    CHECK_INT(wire_on_auth(&p.d, ad), ==, RC_EINVAL);
}

TEST(cluster_identity)
{
    idents();
    /* an id is the hash of the public key; a secret key gives them back */
    uint8_t id[16];
    wire_id_of_key(ident_d.pk, id);
    CHECK(!memcmp(id, ident_d.id, 16));
    wire_identity again;
    wire_identity_from_secret(&again, ident_d.sk);
    CHECK(!memcmp(again.pk, ident_d.pk, 32));
    CHECK(!memcmp(again.id, ident_d.id, 16));
    CHECK(memcmp(ident_d.id, ident_l.id, 16));

    /* a HELLO that claims another node's id is refused, naming both ids */
    pair p;
    uint8_t hd[WIRE_HELLO_BYTES], hl[WIRE_HELLO_BYTES], ad[WIRE_AUTH_BYTES], al[WIRE_AUTH_BYTES];
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, hd);
    wire_session_claim_id(&p.d, ident_l.id, hd);
    wire_session_init(&p.l, KEY_A, &ident_l, WIRE_LISTENER, 2, 0, hl);
    CHECK_INT(wire_on_hello(&p.l, hd, al), ==, RC_EINVAL);
    char claimed[33], real[33], want[120];
    wire_hex(ident_l.id, 16, claimed);
    wire_hex(ident_d.id, 16, real);
    snprintf(want, sizeof want, "claims node id %s, its key gives %s", claimed, real);
    CHECK(strstr(rc_errmsg(), want));

    /* a peer that shows a node's public key and id without holding its
     * secret key: the HELLO passes, its AUTH does not */
    wire_identity thief;
    wire_identity_new(&thief);
    memcpy(thief.pk, ident_l.pk, 32);
    memcpy(thief.id, ident_l.id, 16);
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, hd);
    wire_session_init(&p.l, KEY_A, &thief, WIRE_LISTENER, 2, 0, hl);
    CHECK_OK(wire_on_hello(&p.d, hl, ad));
    CHECK_OK(wire_on_hello(&p.l, hd, al));
    CHECK_INT(wire_on_auth(&p.d, al), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "identity not proven"));
    CHECK(strstr(rc_errmsg(), claimed));
    CHECK(!p.d.established);
    /* nor can the thief's side take the honest dialer's AUTH as proof of
     * anything: its keys differ, so the dialer's tag fails there too */
    CHECK_INT(wire_on_auth(&p.l, ad), ==, RC_EINVAL);

    /* tampering with any part of a HELLO in flight fails the handshake */
    static const int at[] = { 6, 10, 28, 60, 92, 123 };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, hd);
        wire_session_init(&p.l, KEY_A, &ident_l, WIRE_LISTENER, 2, 0, hl);
        hd[at[i]] ^= 0x01;
        int r = wire_on_hello(&p.l, hd, al);
        hd[at[i]] ^= 0x01;
        if (r == 0) {
            CHECK_OK(wire_on_hello(&p.d, hl, ad));
            r = wire_on_auth(&p.l, ad);
            if (r == 0)
                r = wire_on_auth(&p.d, al);
        }
        CHECK_INT(r, ==, RC_EINVAL);
    }
    /* an all-zero (low order) ephemeral key is refused */
    wire_session_init(&p.d, KEY_A, &ident_d, WIRE_DIALER, 2, 0, hd);
    wire_session_init(&p.l, KEY_A, &ident_l, WIRE_LISTENER, 2, 0, hl);
    memset(hd + 60, 0, 32);
    CHECK_INT(wire_on_hello(&p.l, hd, al), ==, RC_EFORMAT);
}

static long seal(wire_session *s, int type, const char *text, bool final, uint8_t *out)
{
    return wire_seal(s, (uint8_t)type, 0, 7, (const uint8_t *)text, strlen(text), final, out);
}

TEST(cluster_records)
{
    pair p;
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    static uint8_t rec[WIRE_REC_MAX], rec2[WIRE_REC_MAX], plain[WIRE_FRAME_MAX];
    wire_frame f;
    long n = seal(&p.d, WIRE_STATE, "hello", false, rec);
    CHECK_INT(n, ==, (long)wire_record_bytes(5));
    /* partial input asks for more */
    CHECK_INT(wire_open(&p.l, rec, 3, plain, &f), ==, 0);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n - 1, plain, &f), ==, 0);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, n);
    CHECK_INT(f.type, ==, WIRE_STATE);
    CHECK_INT(f.stream, ==, 7);
    CHECK_INT(f.n_payload, ==, 5);
    CHECK(!memcmp(f.payload, "hello", 5));
    /* replayed: the same record again fails */
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "authentication"));

    /* tampered payload, tampered length, reordered records */
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    n = seal(&p.d, WIRE_PING, "0123456789abcdef", false, rec);
    memcpy(rec2, rec, (size_t)n);
    rec2[n - 3] ^= 1;
    CHECK_INT(wire_open(&p.l, rec2, (size_t)n, plain, &f), ==, RC_EFORMAT);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, n);   /* the true one still opens */
    long n1 = seal(&p.d, WIRE_PING, "first", false, rec);
    long n2 = seal(&p.d, WIRE_PING, "second", false, rec2);
    CHECK_INT(wire_open(&p.l, rec2, (size_t)n2, plain, &f), ==, RC_EFORMAT);
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    n1 = seal(&p.d, WIRE_PING, "abcdefgh", false, rec);
    wire_put32(rec, wire_get32(rec) - 1);      /* a shorter length: the cut record fails */
    CHECK_INT(wire_open(&p.l, rec, (size_t)n1, plain, &f), ==, RC_EFORMAT);

    /* oversized and undersized lengths are refused from the header alone */
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    uint8_t hdr[4];
    wire_put32(hdr, WIRE_FRAME_MAX + WIRE_ABYTES + 1);
    CHECK_INT(wire_open(&p.l, hdr, 4, plain, &f), ==, RC_ELIMIT);
    wire_put32(hdr, 0xffffffffu);
    CHECK_INT(wire_open(&p.l, hdr, 4, plain, &f), ==, RC_ELIMIT);
    wire_put32(hdr, 3);
    CHECK_INT(wire_open(&p.l, hdr, 4, plain, &f), ==, RC_EFORMAT);
    /* a record from another session (forged with another key) */
    pair q;
    CHECK_OK(handshake(&q, KEY_B, KEY_B, 1, 1));
    n = seal(&q.d, WIRE_PING, "forged", false, rec);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, RC_EFORMAT);

    /* the final record ends the stream; anything after it is refused */
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    n = seal(&p.d, WIRE_BYE, "bye", true, rec);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, n);
    CHECK(f.final);
    CHECK_INT(seal(&p.d, WIRE_PING, "late", false, rec), ==, RC_ESTATE);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, RC_EFORMAT);
    /* limits on what is sealed */
    CHECK_OK(handshake(&p, KEY_A, KEY_A, 2, 2));
    CHECK_INT(wire_seal(&p.d, 1, 0, 0, plain, WIRE_PAYLOAD_MAX + 1, false, rec), ==, RC_ELIMIT);
    n = wire_seal(&p.d, 1, 0, 0, plain, WIRE_PAYLOAD_MAX, false, rec);
    CHECK_INT(n, ==, (long)WIRE_REC_MAX);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, n);
    /* type 0 is not a frame */
    uint8_t zero[WIRE_FRAME_HDR] = { 0 };
    n = wire_seal_raw(&p.d, zero, sizeof zero, false, rec);
    CHECK_INT(wire_open(&p.l, rec, (size_t)n, plain, &f), ==, RC_EFORMAT);
    wire_session_wipe(&p.d);
    wire_session_wipe(&p.l);
}

TEST(cluster_reassembly)
{
    wire_asm a;
    wire_asm_init(&a, 3 * WIRE_PAYLOAD_MAX);
    static uint8_t big[3 * 1024 * 1024];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 31 + 7);
    wire_msg m;
    /* a single frame passes through */
    wire_frame f = { .type = 0x40, .stream = 1, .payload = big, .n_payload = 10 };
    CHECK_INT(wire_asm_add(&a, &f, &m), ==, 1);
    CHECK(m.data == big && m.len == 10);
    /* a message of three frames, interleaved with a ping on another stream */
    size_t off = 0, sizes[3] = { WIRE_PAYLOAD_MAX, WIRE_PAYLOAD_MAX, 1000 };
    for (int i = 0; i < 3; i++) {
        wire_frame g = { .type = 0x41, .flags = i < 2 ? WIRE_F_MORE : 0, .stream = 9,
                         .payload = big + off, .n_payload = sizes[i] };
        off += sizes[i];
        int r = wire_asm_add(&a, &g, &m);
        CHECK_INT(r, ==, i == 2);
        wire_frame ping = { .type = WIRE_PING, .stream = 100 + (uint32_t)i, .payload = big, .n_payload = 16 };
        if (i < 2)
            CHECK_INT(wire_asm_add(&a, &ping, &m), ==, 1);
    }
    CHECK_INT(m.len, ==, off);
    CHECK_INT(m.type, ==, 0x41);
    CHECK(!memcmp(m.data, big, off));
    /* too large */
    for (int i = 0; i < 3; i++) {
        wire_frame g = { .type = 0x41, .flags = WIRE_F_MORE, .stream = 5, .payload = big,
                         .n_payload = WIRE_PAYLOAD_MAX };
        CHECK_INT(wire_asm_add(&a, &g, &m), ==, 0);
    }
    wire_frame g = { .type = 0x41, .flags = 0, .stream = 5, .payload = big, .n_payload = 1 };
    CHECK_INT(wire_asm_add(&a, &g, &m), ==, RC_ELIMIT);
    wire_asm_free(&a);
    /* a stream that changes type, and too many streams */
    wire_asm_init(&a, 0);
    wire_frame h = { .type = 0x41, .flags = WIRE_F_MORE, .stream = 1, .payload = big, .n_payload = 4 };
    CHECK_INT(wire_asm_add(&a, &h, &m), ==, 0);
    h.type = 0x42;
    CHECK_INT(wire_asm_add(&a, &h, &m), ==, RC_EFORMAT);
    for (uint32_t s = 2; s < 2 + WIRE_MAX_STREAMS - 1; s++) {
        h.stream = s;
        CHECK_INT(wire_asm_add(&a, &h, &m), ==, 0);
    }
    h.stream = 999;
    CHECK_INT(wire_asm_add(&a, &h, &m), ==, RC_ELIMIT);
    wire_asm_free(&a);
}

/* ---- mDNS ---- */

TEST(cluster_mdns_roundtrip)
{
    uint8_t buf[MDNS_PKT_MAX];
    mdns_writer w;
    const uint8_t addr[4] = { 10, 0, 0, 7 };
    const char *txt[] = { "txtvers=1", "id=00112233445566778899aabbccddeeff", "fp=0123456789abcdef" };
    char inst[MDNS_NAME_MAX + 32], esc[MDNS_NAME_MAX];
    mdns_label_escape("node.one [ab]", esc, sizeof esc);
    CHECK_STR(esc, "node\\.one [ab]");
    snprintf(inst, sizeof inst, "%s._racimo._tcp.local", esc);
    mdns_w_init(&w, buf, sizeof buf, 0, 0x8400);
    mdns_w_ptr(&w, MDNS_SEC_ANSWER, "_racimo._tcp.local", MDNS_CLASS_IN, 4500, inst);
    mdns_w_srv(&w, MDNS_SEC_ADDITIONAL, inst, MDNS_CLASS_IN | MDNS_CACHE_FLUSH, 120, 7719,
               "racimo-0011.local");
    mdns_w_txt(&w, MDNS_SEC_ADDITIONAL, inst, MDNS_CLASS_IN | MDNS_CACHE_FLUSH, 4500, txt, 3);
    mdns_w_a(&w, MDNS_SEC_ADDITIONAL, "racimo-0011.local", MDNS_CLASS_IN, 120, addr);
    long n = mdns_w_finish(&w);
    CHECK(n > 12);
    static mdns_packet p;
    CHECK_OK(mdns_parse(buf, (size_t)n, &p));
    CHECK(p.response);
    CHECK_INT(p.n_rrs, ==, 4);
    CHECK_INT(p.rrs[0].type, ==, MDNS_PTR);
    CHECK(mdns_name_eq(p.rrs[0].target, inst));
    CHECK(mdns_name_eq(p.rrs[0].name, "_RACIMO._tcp.LOCAL."));
    CHECK_INT(p.rrs[1].port, ==, 7719);
    CHECK_INT(p.rrs[1].klass, ==, MDNS_CLASS_IN | MDNS_CACHE_FLUSH);
    CHECK_STR(p.rrs[1].target, "racimo-0011.local");
    char v[64];
    CHECK_INT(mdns_txt_get(p.rrs[2].rdata, p.rrs[2].n_rdata, "fp", v, sizeof v), ==, 1);
    CHECK_STR(v, "0123456789abcdef");
    CHECK_INT(mdns_txt_get(p.rrs[2].rdata, p.rrs[2].n_rdata, "nope", v, sizeof v), ==, 0);
    CHECK_INT(mdns_txt_get(p.rrs[2].rdata, p.rrs[2].n_rdata, "id", v, 8), ==, 0);
    CHECK(!memcmp(p.rrs[3].addr, addr, 4));
    /* a query */
    mdns_w_init(&w, buf, sizeof buf, 0, 0);
    mdns_w_question(&w, "_racimo._tcp.local", MDNS_PTR, MDNS_CLASS_IN | MDNS_QU);
    n = mdns_w_finish(&w);
    CHECK_OK(mdns_parse(buf, (size_t)n, &p));
    CHECK(!p.response);
    CHECK_INT(p.n_qs, ==, 1);
    CHECK_INT(p.qs[0].type, ==, MDNS_PTR);
    CHECK(p.qs[0].klass & MDNS_QU);
    /* writer limits: records out of section order, a label over 63 bytes */
    mdns_w_init(&w, buf, sizeof buf, 0, 0x8400);
    mdns_w_a(&w, MDNS_SEC_ADDITIONAL, "a.local", 1, 1, addr);
    mdns_w_a(&w, MDNS_SEC_ANSWER, "a.local", 1, 1, addr);
    CHECK(mdns_w_finish(&w) < 0);
    char longl[100];
    memset(longl, 'x', 64);
    strcpy(longl + 64, ".local");
    mdns_w_init(&w, buf, sizeof buf, 0, 0);
    mdns_w_question(&w, longl, 1, 1);
    CHECK(mdns_w_finish(&w) < 0);
    mdns_w_init(&w, buf, 20, 0, 0);
    mdns_w_question(&w, "_racimo._tcp.local", 1, 1);
    CHECK(mdns_w_finish(&w) < 0);
}

TEST(cluster_mdns_hostile)
{
    static mdns_packet p;
    /* compressed names: a valid pointer, a loop, a forward pointer */
    uint8_t ok[] = { 0, 0, 0x84, 0, 0, 0, 0, 2, 0, 0, 0, 0,
                     5, 'l', 'o', 'c', 'a', 'l', 0, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 1, 2, 3, 4,
                     1, 'h', 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 5, 6, 7, 8 };
    CHECK_OK(mdns_parse(ok, sizeof ok, &p));
    CHECK_INT(p.n_rrs, ==, 2);
    CHECK_STR(p.rrs[1].name, "h.local");
    uint8_t loop[] = { 0, 0, 0x84, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1 };
    CHECK_INT(mdns_parse(loop, sizeof loop, &p), ==, RC_EFORMAT);
    uint8_t fwd[] = { 0, 0, 0x84, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 14, 1, 'a', 0, 0, 1, 0, 1 };
    CHECK_INT(mdns_parse(fwd, sizeof fwd, &p), ==, RC_EFORMAT);
    /* rdata longer than the packet; SRV too short; a counted record missing */
    uint8_t over[] = { 0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 9, 0, 40, 1 };
    CHECK_INT(mdns_parse(over, sizeof over, &p), ==, RC_EFORMAT);
    uint8_t srv[] = { 0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 33, 0, 1, 0, 0, 0, 9, 0, 3, 1, 2, 3 };
    CHECK_INT(mdns_parse(srv, sizeof srv, &p), ==, RC_EFORMAT);
    uint8_t missing[] = { 0, 0, 0x84, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 1, 2, 3, 4 };
    CHECK_INT(mdns_parse(missing, sizeof missing, &p), ==, RC_EFORMAT);
    /* a TXT whose strings overrun their record */
    uint8_t txt[] = { 0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 16, 0, 1, 0, 0, 0, 9, 0, 3, 5, 'a', '=' };
    CHECK_INT(mdns_parse(txt, sizeof txt, &p), ==, RC_EFORMAT);
    /* short header, and every prefix of a valid packet fails cleanly */
    CHECK_INT(mdns_parse(ok, 5, &p), ==, RC_EFORMAT);
    for (size_t n = 0; n < sizeof ok; n++)
        CHECK_INT(mdns_parse(ok, n, &p), ==, RC_EFORMAT);
    /* a name of 255+ bytes is refused */
    uint8_t longname[12 + 5 * 64 + 1 + 4] = { 0, 0, 0, 0, 0, 1 };
    size_t at = 12;
    for (int i = 0; i < 5; i++) {
        longname[at++] = 63;
        memset(longname + at, 'a', 63);
        at += 63;
    }
    longname[at++] = 0;
    CHECK_INT(mdns_parse(longname, at + 4, &p), ==, RC_EFORMAT);
    /* escapes survive a trip through presentation form */
    uint8_t odd[] = { 0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0, 3, 'a', '.', 0, 0, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 1, 2, 3, 4 };
    CHECK_OK(mdns_parse(odd, sizeof odd, &p));
    CHECK_STR(p.rrs[0].name, "a\\.\\000");
    uint8_t buf[128];
    mdns_writer w;
    mdns_w_init(&w, buf, sizeof buf, 0, 0x8400);
    mdns_w_a(&w, MDNS_SEC_ANSWER, p.rrs[0].name, 1, 9, (const uint8_t[4]){ 1, 2, 3, 4 });
    long n = mdns_w_finish(&w);
    CHECK_INT(n, ==, (long)sizeof odd);
    CHECK(!memcmp(buf, odd, sizeof odd));
}
