/* mdns_guard.c - the acceptance rules of discovery (mdns_guard.h).
 *
 * A stranger on the LAN can send any multicast DNS packet it likes; these
 * rules keep what it can make a node believe to what a host on the same
 * link could legitimately say about itself, and how often.  Off-link
 * senders (a packet routed in, TTL below 255) and answers naming addresses
 * nobody can be dialled at are refused before the cache sees them.
 */
#include "cluster/mdns_guard.h"

#include <stddef.h>

/* an address no host on a link can be reached at */
static bool special(uint32_t a)
{
    uint32_t top = a >> 24;
    return top == 0 || top == 127 || top >= 224 || a == 0xffffffffu;
}

enum { OFF_LINK, ON_LINK, LINK_SPECIAL };

/* Where a stands towards the subnets of the addresses of interface
 * `ifindex` (all of ours when 0): a host on one of them, the network or
 * broadcast address of one (a /31 or /32 has none), or off them all. */
static int link_of(const mdns_iface *ifs, int n, int ifindex, uint32_t a)
{
    int r = OFF_LINK;
    for (int i = 0; i < n; i++) {
        const mdns_iface *f = &ifs[i];
        if ((ifindex && f->index != ifindex) || ((a ^ f->addr) & f->mask))
            continue;
        if (f->mask < 0xfffffffeu && ((a & ~f->mask) == 0 || (a & ~f->mask) == ~f->mask))
            r = LINK_SPECIAL;
        else
            return ON_LINK;
    }
    return r;
}

int mdns_guard_source(const mdns_iface *ifs, int n_ifs, int ifindex, uint32_t src, int ttl,
                      bool response)
{
    if (response && ttl >= 0 && ttl != 255)
        return MDNS_BAD_TTL;
    if (special(src) || link_of(ifs, n_ifs, ifindex, src) != ON_LINK)
        return MDNS_OFF_LINK;
    return MDNS_OK;
}

int mdns_guard_addr(const mdns_iface *ifs, int n_ifs, int ifindex, uint32_t addr)
{
    int l = link_of(ifs, n_ifs, ifindex, addr);
    if (special(addr) || l == LINK_SPECIAL)
        return MDNS_ADDR_SPECIAL;
    if (l == OFF_LINK)
        return MDNS_ADDR_OFF_LINK;
    return MDNS_OK;
}

const char *mdns_guard_why(int v)
{
    switch (v) {
    case MDNS_OK:            return "accepted";
    case MDNS_BAD_TTL:       return "IP TTL is not 255 (the packet was not sent on this link)";
    case MDNS_OFF_LINK:      return "the sender is not on the subnet of the interface it came in on";
    case MDNS_ADDR_SPECIAL:  return "it names a loopback, multicast, unspecified or broadcast address";
    case MDNS_ADDR_OFF_LINK: return "it names an address off this link";
    default:                 return "refused";
    }
}

/* FNV-1a of the lowercased name; never 0 (0 marks a free slot) */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        h = (h ^ (c >= 'A' && c <= 'Z' ? c + 32u : c)) * 0x100000001b3ull;
    }
    return h ? h : 1;
}

bool mdns_rate_allow(mdns_rate *r, const char *name, uint64_t now, uint64_t gap_ns)
{
    uint64_t h = name_hash(name);
    int slot = 0;
    for (int i = 0; i < MDNS_RATE_SLOTS; i++) {
        if (r->key[i] == h) {
            if (now - r->at[i] < gap_ns)
                return false;
            r->at[i] = now;
            return true;
        }
        if (!r->key[i] ? r->key[slot] != 0 : r->key[slot] && r->at[i] < r->at[slot])
            slot = i;
    }
    r->key[slot] = h;
    r->at[slot] = now;
    return true;
}

bool mdns_bucket_take(mdns_bucket *b, uint64_t now, double per_s, double burst)
{
    if (!b->last_ns) {
        b->tokens = burst;
        b->last_ns = now;
    }
    if (now > b->last_ns) {
        b->tokens += (double)(now - b->last_ns) * 1e-9 * per_s;
        if (b->tokens > burst)
            b->tokens = burst;
        b->last_ns = now;
    }
    if (b->tokens < 1)
        return false;
    b->tokens -= 1;
    return true;
}
