/* wire.h - the bytes two cluster nodes exchange: join tokens, keys derived
 * from the cluster key, the handshake, and the encrypted framed channel.
 *
 * Pure functions over buffers (no sockets, no clock), so they are unit
 * tested and fuzzed alone; peer.c moves the bytes.  All cryptography is
 * libsodium's.  docs/cluster-protocol.md is the specification; the numbers
 * here are the ones it gives.
 *
 * Every node has a long-term X25519 key pair (its identity); its node id is
 * a hash of the public key, so an id cannot be claimed without the key.
 *
 * A connection, after TCP connect:
 *   1. both sides send HELLO (WIRE_HELLO_BYTES, clear text): magic, protocol
 *      version, role, node id, a nonce, an ephemeral X25519 public key and
 *      the node's static public key;
 *   2. each checks the other's magic and major version from the first
 *      WIRE_HELLO_PREFIX bytes (a mismatch is refused with a message naming
 *      both versions, before waiting for a HELLO whose length depends on the
 *      version), then that the node id is the one the static key gives;
 *      derives session keys from the cluster key (as a pre-shared key), the
 *      hash of both HELLOs and three Diffie-Hellman results (ephemeral-
 *      ephemeral, dialer ephemeral-listener static, dialer static-listener
 *      ephemeral), and sends AUTH: two HMAC-SHA-512-256 tags over both HELLOs
 *      and its secretstream header - one keyed by the cluster key alone, one
 *      by a key derived from all of it - then the header;
 *   3. each verifies the other's tags (constant time): a node without the
 *      cluster key cannot produce the first, a node without the static
 *      secret key behind the id it claims cannot produce the second.  From
 *      here on every byte is a RECORD:
 *        u32 BE n | crypto_secretstream_xchacha20poly1305 ciphertext (n bytes)
 *      with the 4 length bytes as additional data, one stream per direction,
 *      so a replayed, reordered, truncated, tampered or forged record fails
 *      to decrypt.  A record decrypts to a FRAME:
 *        u8 type | u8 flags | u16 reserved (0) | u32 BE stream | payload
 *      of at most WIRE_FRAME_MAX bytes; a larger message is sent as several
 *      frames of one stream id, all but the last with WIRE_F_MORE.
 */
#ifndef RC_CLUSTER_WIRE_H
#define RC_CLUSTER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#define WIRE_PROTO_MAJOR 2
#define WIRE_PROTO_MINOR 4

#define WIRE_KEY_BYTES   32
#define WIRE_ID_BYTES    16
#define WIRE_PK_BYTES    32                    /* X25519 public or secret key */
#define WIRE_HELLO_BYTES 124
#define WIRE_HELLO_PREFIX 8                    /* magic and version: the same in every major */
#define WIRE_TAG_BYTES   crypto_auth_hmacsha512256_BYTES                     /* 32 */
#define WIRE_SSHDR_BYTES crypto_secretstream_xchacha20poly1305_HEADERBYTES   /* 24 */
#define WIRE_AUTH_BYTES  (2 * WIRE_TAG_BYTES + WIRE_SSHDR_BYTES)             /* 88 */
#define WIRE_ABYTES      crypto_secretstream_xchacha20poly1305_ABYTES        /* 17 */

#define WIRE_FRAME_HDR   8
#define WIRE_FRAME_MAX   (1u << 20)            /* plaintext of one frame, header included */
#define WIRE_PAYLOAD_MAX (WIRE_FRAME_MAX - WIRE_FRAME_HDR)
#define WIRE_REC_MAX     (4 + WIRE_FRAME_MAX + WIRE_ABYTES)
#define WIRE_MSG_MAX     (64u << 20)           /* a reassembled message */
#define WIRE_MAX_STREAMS 16                    /* messages being reassembled at once */

#define WIRE_TOKEN_PREFIX "racimo1-"
#define WIRE_TOKEN_MAX    320                  /* with an "@host:port" hint */
#define WIRE_FP_HEX       16                   /* fingerprint: 8 bytes as hex */

/* Message types.  0x01-0x3f control, 0x40-0x7f data plane (pipeline
 * inference), 0x80-0xff extensions; a receiver ignores types it does not
 * know, so a minor version may add some. */
enum wire_type {
    WIRE_PING      = 0x01,    /* u64 seq, u64 sender clock (ns) */
    WIRE_PONG      = 0x02,    /* the PING's 16 bytes echoed */
    WIRE_STATE     = 0x03,    /* JSON: the sender's node record, view and links */
    WIRE_PROBE     = 0x04,    /* u64 probe id, then filler (bandwidth probe) */
    WIRE_PROBE_ACK = 0x05,    /* u64 probe id, u64 bytes received */
    WIRE_BYE       = 0x06,    /* UTF-8 reason; the last record (secretstream FINAL) */
    WIRE_CHAN_OK   = 0x07,    /* empty: a data channel's first message was taken */
    WIRE_SWIM      = 0x08,    /* a SWIM push-pull (membership.c; §14) */
    /* the allow-list (revoke.c, rotate.c; docs/cluster-protocol.md §5) */
    WIRE_REVOKE     = 0x10,   /* u16 n, n x (id[16] removed, id[16] by, u64 unix s) */
    WIRE_KEY        = 0x11,   /* new cluster key[32], u64 epoch, id[16] of the sender */
    WIRE_KEY_ACK    = 0x12,   /* u64 epoch, the new key's fingerprint (8 bytes) */
    WIRE_KEY_RETIRE = 0x13,   /* u64 epoch: the key before it stops being used */
};
enum { WIRE_F_MORE = 0x01 };

enum { WIRE_DIALER = 0, WIRE_LISTENER = 1 };

/* ---- join tokens and keys ---- */

/* Writes "racimo1-" + base64url(key || 4-byte check) into out (cap >= 64).
 * Returns 0 or RC_ELIMIT. */
int wire_token_encode(const uint8_t key[WIRE_KEY_BYTES], char *out, size_t cap);

/* Parses a token (surrounding white space allowed, an optional
 * "@host:port" hint after it).  Fills key, and hint (cap hint_cap, "" when
 * none; may be NULL).  RC_EFORMAT with a sentence on a bad token. */
int wire_token_decode(const char *tok, uint8_t key[WIRE_KEY_BYTES], char *hint, size_t hint_cap);

/* The public fingerprint of a cluster key, as 16 lowercase hex digits: a
 * one-way derivation (BLAKE2b KDF), so nodes can tell their own cluster on
 * the network without revealing the key. */
void wire_fingerprint(const uint8_t key[WIRE_KEY_BYTES], char out[WIRE_FP_HEX + 1]);

/* Hex helpers: out gets 2n digits and a NUL.  wire_unhex: 0 or -1. */
void wire_hex(const uint8_t *in, size_t n, char *out);
int  wire_unhex(const char *in, uint8_t *out, size_t n);

/* ---- node identities ---- */

/* A node's long-term key pair and the id it gives. */
typedef struct {
    uint8_t pk[WIRE_PK_BYTES], sk[WIRE_PK_BYTES];
    uint8_t id[WIRE_ID_BYTES];
} wire_identity;

/* The node id of a static public key: the first 16 bytes of
 * BLAKE2b-256(key = "racimo node id", message = pk). */
void wire_id_of_key(const uint8_t pk[WIRE_PK_BYTES], uint8_t id[WIRE_ID_BYTES]);

/* A new random identity. */
void wire_identity_new(wire_identity *out);

/* The identity of a stored secret key (public key and id computed). */
void wire_identity_from_secret(wire_identity *out, const uint8_t sk[WIRE_PK_BYTES]);

/* ---- one connection's cryptographic state ---- */

typedef struct {
    int role;                                  /* WIRE_DIALER or WIRE_LISTENER */
    int major, minor;                          /* what this side speaks */
    uint8_t self_id[WIRE_ID_BYTES];
    uint8_t st_pk[WIRE_PK_BYTES], st_sk[WIRE_PK_BYTES];   /* this node's identity */
    uint8_t key_auth[32], key_mix[32];         /* derived from the cluster key */
    uint8_t kx_pk[32], kx_sk[32];              /* ephemeral */
    uint8_t hello_self[WIRE_HELLO_BYTES], hello_peer[WIRE_HELLO_BYTES];
    uint8_t key_rx[32], key_tx[32], key_confirm[32];
    /* from the peer's HELLO: */
    int peer_major, peer_minor;
    uint8_t peer_id[WIRE_ID_BYTES];            /* proven once established */
    uint8_t peer_pk[WIRE_PK_BYTES];            /* its static public key */
    bool peer_channel;                         /* the peer's HELLO opens a data channel */
    /* after AUTH: */
    crypto_secretstream_xchacha20poly1305_state tx, rx;
    bool established, rx_final, tx_final;
} wire_session;

/* Sets up a session for this node's identity and writes this side's HELLO
 * into hello_out.  major/minor: normally WIRE_PROTO_MAJOR/MINOR (tests pass
 * others). */
void wire_session_init(wire_session *s, const uint8_t key[WIRE_KEY_BYTES],
                       const wire_identity *self, int role, int major, int minor,
                       uint8_t hello_out[WIRE_HELLO_BYTES]);

/* Checks the first WIRE_HELLO_PREFIX bytes of the peer's HELLO (n >= that):
 * the magic and the major version, which sit at the same place in every
 * version.  0; RC_EFORMAT (not a racimo node); RC_EUNSUPPORTED when the major
 * versions differ, with a detail naming both versions.  A caller checks this
 * before waiting for the rest, whose length depends on the version. */
int wire_hello_prefix(wire_session *s, const uint8_t *hello, size_t n);

/* Checks the peer's HELLO.  0; RC_EFORMAT (not a racimo node, the same role
 * on both ends, an invalid key); RC_EUNSUPPORTED when the major versions
 * differ; RC_EINVAL when the node id is not the one its static key gives
 * (the detail names both).  On success writes this side's AUTH message
 * into auth_out. */
int wire_on_hello(wire_session *s, const uint8_t hello[WIRE_HELLO_BYTES],
                  uint8_t auth_out[WIRE_AUTH_BYTES]);

/* Verifies the peer's AUTH.  0 (the session is established: peer_id and
 * peer_pk are proven) or RC_EINVAL: the peer does not hold the cluster key,
 * or does not hold the secret key of the identity its HELLO gives (or the
 * bytes were altered); the detail says which. */
int wire_on_auth(wire_session *s, const uint8_t auth[WIRE_AUTH_BYTES]);

/* Tests only (racimo-hooks' RACIMO_TEST_CLAIM_ID): puts another node id in
 * this side's HELLO (not yet sent), as a member lying about who it is would.
 * Rewrites hello_out. */
void wire_session_claim_id(wire_session *s, const uint8_t id[WIRE_ID_BYTES],
                           uint8_t hello_out[WIRE_HELLO_BYTES]);

/* Marks this side's HELLO (not yet sent) as opening a data channel rather
 * than the cluster link: a second authenticated connection that carries
 * one kind of traffic between two threads (docs/cluster-protocol.md §11).
 * The mark is inside both HELLOs, so the keys and tags cover it.  Rewrites
 * hello_out. */
void wire_session_mark_channel(wire_session *s, uint8_t hello_out[WIRE_HELLO_BYTES]);

/* Wipes the keys. */
void wire_session_wipe(wire_session *s);

/* ---- records and frames ---- */

typedef struct {
    uint8_t type, flags;
    uint32_t stream;
    const uint8_t *payload;                    /* inside the caller's buffer */
    size_t n_payload;
    bool final;                                /* the peer's last record */
} wire_frame;

/* Bytes of the record that carries a frame of n_payload bytes. */
static inline size_t wire_record_bytes(size_t n_payload)
{
    return 4 + WIRE_FRAME_HDR + n_payload + WIRE_ABYTES;
}

/* Seals one frame (n_payload <= WIRE_PAYLOAD_MAX) into out, which has
 * wire_record_bytes(n_payload) bytes; `final` marks the last record this
 * side will send.  Returns the record's size, or RC_ELIMIT / RC_ESTATE. */
long wire_seal(wire_session *s, uint8_t type, uint8_t flags, uint32_t stream,
               const uint8_t *payload, size_t n_payload, bool final, uint8_t *out);

/* Seals an arbitrary plaintext (1..WIRE_FRAME_MAX bytes) as one record; for
 * tests and the fuzzer, which need frames no honest sender writes. */
long wire_seal_raw(wire_session *s, const uint8_t *plain, size_t n, bool final, uint8_t *out);

/* Opens the record at the start of `in` (n_in bytes available).  Returns
 * the record's size when a frame was decrypted into `plain` (which has
 * WIRE_FRAME_MAX bytes; f's payload points into it), 0 when more bytes are
 * needed, or a negative code with a detail: RC_ELIMIT for a length over the
 * limit, RC_EFORMAT for a record that fails authentication (forged,
 * tampered, replayed, reordered), a malformed frame header, or a record
 * after the peer's final one.  After an error the session is unusable. */
long wire_open(wire_session *s, const uint8_t *in, size_t n_in, uint8_t *plain, wire_frame *f);

/* ---- reassembly of messages from frames ---- */

typedef struct {
    uint32_t stream;
    uint8_t type;
    bool used;
    uint8_t *buf;
    size_t len, cap;
} wire_asm_slot;

typedef struct {
    wire_asm_slot st[WIRE_MAX_STREAMS];
    size_t max_bytes;                          /* per message (WIRE_MSG_MAX) */
} wire_asm;

typedef struct {
    uint8_t type;
    uint32_t stream;
    const uint8_t *data;                       /* valid until the next wire_asm_add */
    size_t len;
} wire_msg;

void wire_asm_init(wire_asm *a, size_t max_bytes);
void wire_asm_free(wire_asm *a);

/* Adds a frame.  1 when it completes a message (in *m), 0 when the message
 * continues, negative on a violation (RC_ELIMIT: too large or too many
 * streams at once; RC_EFORMAT: a frame whose type differs from the one its
 * stream started with; RC_ENOMEM). */
int wire_asm_add(wire_asm *a, const wire_frame *f, wire_msg *m);

/* ---- little helpers for fixed fields ---- */

static inline void wire_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline uint32_t wire_get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void wire_put64(uint8_t *p, uint64_t v)
{
    wire_put32(p, (uint32_t)(v >> 32));
    wire_put32(p + 4, (uint32_t)v);
}
static inline uint64_t wire_get64(const uint8_t *p)
{
    return (uint64_t)wire_get32(p) << 32 | wire_get32(p + 4);
}

#endif
