/* mdns.h - the DNS messages of multicast DNS (RFC 6762) and DNS-based
 * service discovery (RFC 6763): a writer and a defensive parser.  Pure
 * functions over byte buffers; discovery.c owns the socket.
 *
 * Names are kept in presentation form: labels joined by '.', with '.' and
 * '\' inside a label written "\." and "\\", and bytes below 0x21 or 0x7f
 * as "\DDD" (decimal).  Comparisons ignore ASCII case (RFC 6762 §16).
 */
#ifndef RC_CLUSTER_MDNS_H
#define RC_CLUSTER_MDNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MDNS_PORT        5353
#define MDNS_GROUP       "224.0.0.251"
#define MDNS_NAME_MAX    256     /* presentation form, NUL included; wire form <= 255 */
#define MDNS_MAX_QS      32      /* questions kept from one packet */
#define MDNS_MAX_RRS     64      /* records kept from one packet */
#define MDNS_PKT_MAX     9000    /* RFC 6762 §17: at most the interface MTU */

enum { MDNS_A = 1, MDNS_PTR = 12, MDNS_TXT = 16, MDNS_AAAA = 28, MDNS_SRV = 33, MDNS_ANY = 255 };
enum { MDNS_CLASS_IN = 1, MDNS_CACHE_FLUSH = 0x8000, MDNS_QU = 0x8000 };
enum { MDNS_SEC_ANSWER = 0, MDNS_SEC_AUTHORITY = 1, MDNS_SEC_ADDITIONAL = 2 };

typedef struct {
    char name[MDNS_NAME_MAX];
    uint16_t type, klass;                     /* klass with the QU bit */
} mdns_question;

typedef struct {
    char name[MDNS_NAME_MAX];
    uint16_t type, klass;                     /* klass with the cache-flush bit */
    uint32_t ttl;
    int section;                              /* MDNS_SEC_* */
    /* decoded rdata of the types we use: */
    char target[MDNS_NAME_MAX];               /* PTR, SRV */
    uint16_t priority, weight, port;          /* SRV */
    uint8_t addr[4];                          /* A */
    const uint8_t *rdata;                     /* raw, inside the packet (TXT) */
    uint16_t n_rdata;
} mdns_rr;

typedef struct {
    uint16_t id, flags;
    bool response;                            /* QR bit */
    int n_qs, n_rrs;
    mdns_question qs[MDNS_MAX_QS];
    mdns_rr rrs[MDNS_MAX_RRS];
} mdns_packet;

/* Parses a packet; records beyond the limits are skipped, as are questions.
 * Returns 0 or RC_EFORMAT (truncated, a bad name or pointer loop, rdata
 * overrunning its record...).  Never reads outside [pkt, pkt + n). */
int mdns_parse(const uint8_t *pkt, size_t n, mdns_packet *out);

/* Finds "key=value" in a TXT rdata; copies the value (NUL-terminated) and
 * returns 1, or returns 0 when absent or when it does not fit in cap. */
int mdns_txt_get(const uint8_t *rdata, size_t n, const char *key, char *out, size_t cap);

/* Case-insensitive comparison of two names in presentation form. */
bool mdns_name_eq(const char *a, const char *b);

/* Writes a label as presentation form (escaping), for instance names. */
void mdns_label_escape(const char *label, char *out, size_t cap);

/* ---- writing ---- */

typedef struct {
    uint8_t *buf;
    size_t cap, len;
    int counts[4];                            /* questions, answers, authority, additional */
    int section;                              /* last section written (-1 questions) */
    bool failed;                              /* out of room or a bad name */
} mdns_writer;

void mdns_w_init(mdns_writer *w, uint8_t *buf, size_t cap, uint16_t id, uint16_t flags);
void mdns_w_question(mdns_writer *w, const char *name, uint16_t type, uint16_t klass);
/* Records go in section order: all answers, then authority, then additional. */
void mdns_w_ptr(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                const char *target);
void mdns_w_srv(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                uint16_t port, const char *target);
/* TXT from n strings "key=value" (each < 256 bytes). */
void mdns_w_txt(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                const char *const *strs, int n);
void mdns_w_a(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
              const uint8_t addr[4]);
/* Patches the counts; returns the packet's length, or RC_ELIMIT/RC_EFORMAT. */
long mdns_w_finish(mdns_writer *w);

#endif
