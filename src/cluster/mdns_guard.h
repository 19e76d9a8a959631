/* mdns_guard.h - what discovery accepts from the network: pure rules over
 * a datagram's sender, its IP TTL, the interface it came in on and the
 * addresses its answers name, and a per-name rate limit.  discovery.c
 * applies them to every packet; the tests call them directly.
 *
 * Addresses are IPv4 in host byte order.
 */
#ifndef RC_CLUSTER_MDNS_GUARD_H
#define RC_CLUSTER_MDNS_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#define MDNS_GUARD_IFACES 16
#define MDNS_RATE_SLOTS   64

typedef struct {
    int index;                        /* interface index (if_nametoindex) */
    uint32_t addr, mask;              /* one IPv4 address of it and its netmask */
} mdns_iface;

enum {
    MDNS_OK = 0,
    MDNS_BAD_TTL,             /* a response whose IP TTL is not 255: not sent on this link */
    MDNS_OFF_LINK,            /* the sender is not on the receiving interface's subnet */
    MDNS_ADDR_SPECIAL,        /* an answer names a loopback, multicast, unspecified,
                                 broadcast or reserved address */
    MDNS_ADDR_OFF_LINK,       /* an answer names an address off the receiving link */
    MDNS_N_VERDICTS
};

/* The rule for the sender of a packet that came in on interface `ifindex`
 * (0: unknown, any of ours counts) from `src`, with IP TTL `ttl` (-1:
 * unknown, not checked): the sender must be a host address on the subnet
 * of an address of that interface, and a response must carry TTL 255
 * (RFC 6762 §11: a packet with TTL 255 was not forwarded by a router).
 * Queries may carry any TTL (legacy resolvers send 1 or 64). */
int mdns_guard_source(const mdns_iface *ifs, int n_ifs, int ifindex, uint32_t src, int ttl,
                      bool response);

/* The rule for an address an answer names (an A record): a host address
 * (not 0/8, 127/8, 224/4, 240/4, 255.255.255.255, nor the network or
 * broadcast address of the link's subnet) on the subnet of the receiving
 * interface. */
int mdns_guard_addr(const mdns_iface *ifs, int n_ifs, int ifindex, uint32_t addr);

/* Words for a verdict, for the log ("... ignored: <why>"). */
const char *mdns_guard_why(int verdict);

/* At most one event per name per `gap_ns`: a small table of recent names
 * (hashes); when full, the oldest is forgotten.  Zero-initialise. */
typedef struct {
    uint64_t key[MDNS_RATE_SLOTS];
    uint64_t at[MDNS_RATE_SLOTS];
} mdns_rate;

/* True (and the name's time is set to now) when `name` (case-insensitive)
 * had no allowed event in the last gap_ns. */
bool mdns_rate_allow(mdns_rate *r, const char *name, uint64_t now, uint64_t gap_ns);

/* A token bucket: at most `burst` events at once, `per_s` a second after. */
typedef struct {
    double tokens;
    uint64_t last_ns;
} mdns_bucket;

bool mdns_bucket_take(mdns_bucket *b, uint64_t now, double per_s, double burst);

#endif
