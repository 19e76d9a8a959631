/* discovery.c - a small multicast DNS responder and browser for
 * _racimo._tcp.local (RFC 6762, RFC 6763), so that nodes find each other
 * with no daemon, and standard tools (avahi-browse, dns-sd) see them.
 *
 * This node answers, on 224.0.0.251:5353 (socket shared with other
 * responders through SO_REUSEADDR/SO_REUSEPORT):
 *   _services._dns-sd._udp.local PTR  _racimo._tcp.local
 *   _racimo._tcp.local           PTR  <instance>._racimo._tcp.local
 *   <instance>._racimo._tcp.local SRV 0 0 <cluster port> racimo-<id16>.local
 *   <instance>._racimo._tcp.local TXT txtvers=1 proto=M.m id=<node id> fp=<fingerprint>
 *   racimo-<id16>.local          A    <address of the interface sent on>
 * Only what a stranger may see: no key, no model names, no API port.  The
 * instance is "<name> [<id8>]"; names carry the node id, so they do not
 * collide and this responder skips probing (RFC 6762 §8).
 *
 * Browsing: a PTR query at start and then at growing intervals (1, 2, 4 ...
 * capped at 60 s), and every response heard (queries of others included)
 * feeds a small cache; an instance whose SRV, TXT and A are known and whose
 * fingerprint is this cluster's is handed to the cluster (cl__on_found),
 * which may dial it.  Missing records are asked for.
 *
 * Anyone on the LAN can send mDNS, so nothing heard here is proof of
 * anything (docs/cluster-protocol.md §2): packets from off the link (IP
 * TTL below 255 on a response, a sender outside the receiving interface's
 * subnet) are dropped before parsing; answers naming addresses nobody can
 * be dialled at are dropped; an instance reaches the cluster at most once a
 * second and only when it changed, and the cluster decides what an answer
 * may do (never move a node it has authenticated).  This responder
 * multicasts a record on an interface at most once a second (RFC 6762 §6),
 * answers a query on the interface it came in on, and sends unicast only
 * to senders on the link.  What is refused is logged, at most a line every
 * few seconds.
 */
#include "cluster/cluster_internal.h"
#include "cluster/mdns.h"
#include "cluster/mdns_guard.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

#define SERVICE      "_racimo._tcp.local"
#define SERVICES_ALL "_services._dns-sd._udp.local"
#define TTL_HOST     120                 /* RFC 6762 §10: host name records */
#define TTL_OTHER    4500                /* other records */
#define N_CACHE      32
#define NS           1000000000ull
#define N_REC        5                   /* the record kinds of put_records */
#define REFUSE_LOG_NS (5 * NS)           /* at most a line of refusals this often */

typedef struct {
    char name[MDNS_NAME_MAX];            /* full instance name; "" = free */
    char host[MDNS_NAME_MAX];
    int port;
    bool have_srv, have_txt;
    char id[2 * WIRE_ID_BYTES + 1], fp[WIRE_FP_HEX + 1], proto[16];
    uint64_t expires_ns, asked_ns;
    uint64_t created_ns;                 /* the oldest entry makes room */
    char from[INET_ADDRSTRLEN];          /* who sent its SRV/TXT last */
    uint64_t handed_ns;                  /* last given to the cluster */
    bool dirty;                          /* changed since */
} inst_entry;

typedef struct {
    char name[MDNS_NAME_MAX];
    uint8_t addr[4];
    uint64_t expires_ns;
    char from[INET_ADDRSTRLEN];          /* who said so */
} host_entry;

struct discovery {
    struct cluster *c;
    int fd;
    struct event *ev;
    addr_list ifaddrs;                   /* where we send and what we answer with */
    mdns_iface ifs[MDNS_GUARD_IFACES];   /* the links we accept packets from */
    int n_ifs;
    uint64_t ifs_ns;                     /* when ifs was read */
    uint64_t sent_ns[CL_MAX_ADDRS][N_REC];   /* last multicast of each record, per interface */
    mdns_rate legacy;                    /* unicast answers, per sender */
    mdns_bucket asks, hands;             /* follow-up queries; instances handed over */
    struct {                             /* refusals not yet logged, per kind (RF_*) */
        int n;
        char last[320];
        uint64_t next_ns;
    } refused[3];
    char instance[MDNS_NAME_MAX], host[MDNS_NAME_MAX];
    char txt[4][96];
    uint64_t next_announce_ns;
    int n_announced;
    uint64_t next_query_ns, query_gap_ns;
    mdns_packet *pkt;
    inst_entry inst[N_CACHE];
    host_entry hosts[N_CACHE];
    uint8_t buf[MDNS_PKT_MAX];           /* received packet */
    uint8_t sbuf[MDNS_PKT_MAX];          /* packet being sent */
};

/* ---- the links, and what was refused ---- */

/* The IPv4 addresses and netmasks of the interfaces that are up, for the
 * on-link rules; read again every few seconds (DHCP, a cable). */
static void read_ifaces(discovery *d, uint64_t now)
{
    struct ifaddrs *ifa = NULL;
    d->ifs_ns = now;
    if (getifaddrs(&ifa) != 0)
        return;
    int n = 0;
    for (struct ifaddrs *i = ifa; i && n < MDNS_GUARD_IFACES; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask ||
            !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        d->ifs[n].index = (int)if_nametoindex(i->ifa_name);
        d->ifs[n].addr = ntohl(((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
        d->ifs[n].mask = ntohl(((const struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr);
        n++;
    }
    d->n_ifs = n;
    freeifaddrs(ifa);
}

/* kinds of refusal, each logged on its own */
enum { RF_SOURCE, RF_ADDR, RF_CLUSTER };

static void refusal_flush(discovery *d, uint64_t now)
{
    for (int k = 0; k < 3; k++) {
        if (!d->refused[k].n || now < d->refused[k].next_ns)
            continue;
        rc_log(LOG_WARN, "cluster: mDNS: refused %d more answer%s in the last %d s; the last: %s",
               d->refused[k].n, d->refused[k].n == 1 ? "" : "s", (int)(REFUSE_LOG_NS / NS),
               d->refused[k].last);
        d->refused[k].n = 0;
        d->refused[k].next_ns = now + REFUSE_LOG_NS;
    }
}

/* Something heard was refused: logged now unless a line of its kind went
 * out in the last few seconds, else counted for the next (a flood makes
 * few lines).  Peer text in the message must have gone through log_clean. */
static void refuse(discovery *d, int kind, uint64_t now, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static void refuse(discovery *d, int kind, uint64_t now, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->refused[kind].last, sizeof d->refused[kind].last, fmt, ap);
    va_end(ap);
    d->refused[kind].n++;
    if (d->refused[kind].n == 1 && now >= d->refused[kind].next_ns) {
        rc_log(LOG_WARN, "cluster: mDNS: %s", d->refused[kind].last);
        d->refused[kind].n = 0;
        d->refused[kind].next_ns = now + REFUSE_LOG_NS;
    }
}

/* The index in ifaddrs of the address a packet from src on ifindex came to
 * (its subnet holds src), or -1 when none of ours matches. */
static int ifaddr_of(discovery *d, int ifindex, uint32_t src)
{
    for (int i = 0; i < d->n_ifs; i++) {
        const mdns_iface *f = &d->ifs[i];
        if ((ifindex && f->index != ifindex) || ((src ^ f->addr) & f->mask))
            continue;
        char a[INET_ADDRSTRLEN];
        struct in_addr ia = { .s_addr = htonl(f->addr) };
        inet_ntop(AF_INET, &ia, a, sizeof a);
        for (int j = 0; j < d->ifaddrs.n_addrs; j++)
            if (!strcmp(d->ifaddrs.addrs[j], a))
                return j;
    }
    return -1;
}

/* ---- sending ---- */

static void send_to(discovery *d, const uint8_t *p, size_t n, const struct sockaddr_in *to)
{
    if (sendto(d->fd, p, n, 0, (const struct sockaddr *)to, sizeof *to) < 0)
        rc_log(LOG_DEBUG, "cluster: mdns send: %s", strerror(errno));
}

static struct sockaddr_in group_addr(void)
{
    struct sockaddr_in g = { .sin_family = AF_INET, .sin_port = htons(MDNS_PORT) };
    inet_pton(AF_INET, MDNS_GROUP, &g.sin_addr);
    return g;
}

/* Our records into w: the answers (what = bitmask) and the rest as
 * additional records.  ttl_scale 0 = goodbye; legacy = a unicast answer
 * (no cache-flush bits, short TTLs). */
enum { R_PTR = 1, R_SRV = 2, R_TXT = 4, R_A = 8, R_ENUM = 16 };

static void put_records(discovery *d, mdns_writer *w, int answers, const uint8_t addr[4],
                        bool goodbye, bool legacy)
{
    uint16_t in = MDNS_CLASS_IN, uniq = legacy ? MDNS_CLASS_IN : MDNS_CLASS_IN | MDNS_CACHE_FLUSH;
    uint32_t th = goodbye ? 0 : legacy ? 10 : TTL_HOST, to = goodbye ? 0 : legacy ? 10 : TTL_OTHER;
    const char *txt[4] = { d->txt[0], d->txt[1], d->txt[2], d->txt[3] };
    /* the additional records RFC 6763 §12 recommends come after the answers */
    int adds = 0;
    if (answers & R_PTR)
        adds |= R_SRV | R_TXT | R_A;
    if (answers & R_SRV)
        adds |= R_A;
    adds &= ~answers;
    for (int pass = 0; pass < 2; pass++) {
        int set = pass == 0 ? answers : adds, sec = pass == 0 ? MDNS_SEC_ANSWER : MDNS_SEC_ADDITIONAL;
        if (set & R_ENUM)
            mdns_w_ptr(w, sec, SERVICES_ALL, in, to, SERVICE);
        if (set & R_PTR)
            mdns_w_ptr(w, sec, SERVICE, in, to, d->instance);
        if (set & R_SRV)
            mdns_w_srv(w, sec, d->instance, uniq, th, (uint16_t)d->c->port, d->host);
        if (set & R_TXT)
            mdns_w_txt(w, sec, d->instance, uniq, to, txt, 4);
        if ((set & R_A) && addr)
            mdns_w_a(w, sec, d->host, uniq, th, addr);
    }
}

/* Multicasts a response with `answers` on interface `only` (an index in
 * ifaddrs) or, when -1, on every interface, each with its own address in
 * the A record.  A record multicast on an interface in the last second is
 * left out there (RFC 6762 §6), except in a goodbye. */
static void multicast_response(discovery *d, int answers, bool goodbye, int only)
{
    struct sockaddr_in g = group_addr();
    uint64_t now = os_now_ns();
    for (int i = 0; i < d->ifaddrs.n_addrs; i++) {
        struct in_addr ia;
        if ((only >= 0 && i != only) || inet_pton(AF_INET, d->ifaddrs.addrs[i], &ia) != 1)
            continue;
        int send = answers;
        for (int r = 0; r < N_REC && !goodbye; r++)
            if ((send & 1 << r) && d->sent_ns[i][r] && now - d->sent_ns[i][r] < NS)
                send &= ~(1 << r);
        if (!send)
            continue;
        setsockopt(d->fd, IPPROTO_IP, IP_MULTICAST_IF, &ia, sizeof ia);
        mdns_writer w;
        mdns_w_init(&w, d->sbuf, sizeof d->sbuf, 0, 0x8400);
        put_records(d, &w, send, (const uint8_t *)&ia.s_addr, goodbye, false);
        long n = mdns_w_finish(&w);
        if (n > 0) {
            send_to(d, d->sbuf, (size_t)n, &g);
            for (int r = 0; r < N_REC; r++)
                if (send & 1 << r)
                    d->sent_ns[i][r] = now;
        }
    }
}

static void multicast_query(discovery *d, const char *name, uint16_t type, const char *name2,
                            uint16_t type2)
{
    struct sockaddr_in g = group_addr();
    for (int i = 0; i < d->ifaddrs.n_addrs; i++) {
        struct in_addr ia;
        if (inet_pton(AF_INET, d->ifaddrs.addrs[i], &ia) != 1)
            continue;
        setsockopt(d->fd, IPPROTO_IP, IP_MULTICAST_IF, &ia, sizeof ia);
        mdns_writer w;
        mdns_w_init(&w, d->sbuf, sizeof d->sbuf, 0, 0);
        mdns_w_question(&w, name, type, MDNS_CLASS_IN);
        if (name2)
            mdns_w_question(&w, name2, type2, MDNS_CLASS_IN);
        long n = mdns_w_finish(&w);
        if (n > 0)
            send_to(d, d->sbuf, (size_t)n, &g);
    }
}

/* ---- receiving ---- */

static bool ends_with_service(const char *name)
{
    size_t n = strlen(name), s = strlen(SERVICE);
    return n > s + 1 && name[n - s - 1] == '.' && mdns_name_eq(name + n - s, SERVICE);
}

/* The cache entry of an instance; when the cache is full a new one takes
 * the place of the oldest, so a flood of made-up instances cannot keep a
 * real one out (the records of an announcement arrive in one packet and
 * are handed over before the next packet is read). */
static inst_entry *inst_get(discovery *d, const char *name, uint64_t now, bool create)
{
    inst_entry *free_e = NULL, *oldest = &d->inst[0];
    for (int i = 0; i < N_CACHE; i++) {
        inst_entry *e = &d->inst[i];
        if (e->name[0] && e->expires_ns < now)
            e->name[0] = 0;
        if (e->name[0] && mdns_name_eq(e->name, name))
            return e;
        if (!e->name[0] && !free_e)
            free_e = e;
        if (e->created_ns < oldest->created_ns)
            oldest = e;
    }
    if (!create)
        return NULL;
    inst_entry *e = free_e ? free_e : oldest;
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->expires_ns = now + 120 * NS;
    e->created_ns = now;
    return e;
}

static host_entry *host_get(discovery *d, const char *name, uint64_t now, bool create)
{
    host_entry *free_e = NULL, *oldest = &d->hosts[0];
    for (int i = 0; i < N_CACHE; i++) {
        host_entry *e = &d->hosts[i];
        if (e->name[0] && e->expires_ns < now)
            e->name[0] = 0;
        if (e->name[0] && mdns_name_eq(e->name, name))
            return e;
        if (!e->name[0] && !free_e)
            free_e = e;
        if (e->expires_ns < oldest->expires_ns)
            oldest = e;
    }
    if (!create)
        return NULL;
    host_entry *e = free_e ? free_e : oldest;
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    return e;
}

/* Gives the cluster the complete instances of this cluster heard since
 * they were last given, each at most once a second and a few a second in
 * all, and asks for the records still missing (a few queries a second in
 * all: made-up instances must not make this node a multicast amplifier). */
static void hand_over(discovery *d, uint64_t now)
{
    for (int i = 0; i < N_CACHE; i++) {
        inst_entry *e = &d->inst[i];
        if (!e->name[0] || mdns_name_eq(e->name, d->instance))
            continue;
        host_entry *h = e->have_srv ? host_get(d, e->host, now, false) : NULL;
        if (!e->have_srv || !e->have_txt || !h) {
            if (now - e->asked_ns > NS && mdns_bucket_take(&d->asks, now, 4, 8)) {
                e->asked_ns = now;
                if (!e->have_srv || !e->have_txt)
                    multicast_query(d, e->name, MDNS_SRV, e->name, MDNS_TXT);
                else
                    multicast_query(d, e->host, MDNS_A, NULL, 0);
            }
            continue;
        }
        if (!e->dirty || now - e->handed_ns < NS)
            continue;
        uint8_t id[WIRE_ID_BYTES];
        if (strcmp(e->fp, d->c->fp) || wire_unhex(e->id, id, WIRE_ID_BYTES) || e->port <= 0 ||
            e->port > 65535) {
            e->dirty = false;          /* another cluster's node, or not a node at all */
            continue;
        }
        if (!mdns_bucket_take(&d->hands, now, 8, 16))
            return;                    /* the rest on a later tick */
        e->dirty = false;
        e->handed_ns = now;
        char addr[INET_ADDRSTRLEN], why[160];
        inet_ntop(AF_INET, h->addr, addr, sizeof addr);
        if (cl__on_found(d->c, id, addr, e->port, why, sizeof why) < 0)
            refuse(d, RF_CLUSTER, now, "ignored the answers from %s (SRV, TXT) and %s (A) that put "
                   "node %.8s ('%s') at %s:%d: %s", e->from, h->from, e->id, log_clean(e->name),
                   addr, e->port, why);
    }
}

/* Takes in the records of a response from src (already found on the link
 * of interface ifindex). */
static void learn(discovery *d, const mdns_packet *p, int ifindex, const char *src, uint64_t now)
{
    for (int i = 0; i < p->n_rrs; i++) {
        const mdns_rr *r = &p->rrs[i];
        uint64_t exp = now + (uint64_t)(r->ttl > 4500 ? 4500 : r->ttl) * NS;
        if (r->type == MDNS_PTR && mdns_name_eq(r->name, SERVICE) && ends_with_service(r->target)) {
            inst_entry *e = inst_get(d, r->target, now, r->ttl > 0);
            if (e && r->ttl == 0)
                e->name[0] = 0;
            else if (e && e->expires_ns < exp)
                e->expires_ns = exp;
        } else if (r->type == MDNS_SRV && ends_with_service(r->name)) {
            inst_entry *e = inst_get(d, r->name, now, r->ttl > 0);
            if (e) {
                snprintf(e->host, sizeof e->host, "%s", r->target);
                snprintf(e->from, sizeof e->from, "%s", src);
                e->port = r->port;
                e->have_srv = r->ttl > 0;
                e->dirty = true;
            }
        } else if (r->type == MDNS_TXT && ends_with_service(r->name)) {
            inst_entry *e = inst_get(d, r->name, now, r->ttl > 0);
            if (e) {
                e->have_txt = r->ttl > 0 &&
                    mdns_txt_get(r->rdata, r->n_rdata, "id", e->id, sizeof e->id) &&
                    mdns_txt_get(r->rdata, r->n_rdata, "fp", e->fp, sizeof e->fp);
                if (!mdns_txt_get(r->rdata, r->n_rdata, "proto", e->proto, sizeof e->proto))
                    e->proto[0] = 0;
                snprintf(e->from, sizeof e->from, "%s", src);
                e->dirty = true;
            }
        } else if (r->type == MDNS_A) {
            uint32_t a = (uint32_t)r->addr[0] << 24 | (uint32_t)r->addr[1] << 16 |
                         (uint32_t)r->addr[2] << 8 | r->addr[3];
            int v = r->ttl > 0 ? mdns_guard_addr(d->ifs, d->n_ifs, ifindex, a) : MDNS_OK;
            if (v) {
                char at[INET_ADDRSTRLEN];
                inet_ntop(AF_INET, r->addr, at, sizeof at);
                refuse(d, RF_ADDR, now, "ignored the A record from %s that puts %s at %s: %s", src,
                       log_clean(r->name), at, mdns_guard_why(v));
                continue;
            }
            host_entry *e = host_get(d, r->name, now, r->ttl > 0);
            if (e && r->ttl == 0) {
                e->name[0] = 0;
            } else if (e) {
                memcpy(e->addr, r->addr, 4);
                e->expires_ns = exp;
                snprintf(e->from, sizeof e->from, "%s", src);
                for (int j = 0; j < N_CACHE; j++)
                    if (d->inst[j].name[0] && mdns_name_eq(d->inst[j].host, r->name))
                        d->inst[j].dirty = true;
            }
        }
    }
    hand_over(d, now);
}

/* Answers the questions of a query from `from` (on the link of ifindex)
 * that concern us. */
static void answer(discovery *d, const mdns_packet *p, const struct sockaddr_in *from, int ifindex,
                   uint64_t now)
{
    int want = 0;
    bool unicast_asked = false;
    for (int i = 0; i < p->n_qs; i++) {
        const mdns_question *q = &p->qs[i];
        bool any = q->type == MDNS_ANY;
        if (mdns_name_eq(q->name, SERVICES_ALL) && (any || q->type == MDNS_PTR))
            want |= R_ENUM;
        else if (mdns_name_eq(q->name, SERVICE) && (any || q->type == MDNS_PTR))
            want |= R_PTR;
        else if (mdns_name_eq(q->name, d->instance)) {
            if (any || q->type == MDNS_SRV)
                want |= R_SRV;
            if (any || q->type == MDNS_TXT)
                want |= R_TXT;
        } else if (mdns_name_eq(q->name, d->host) && (any || q->type == MDNS_A))
            want |= R_A;
        else
            continue;
        unicast_asked |= (q->klass & MDNS_QU) != 0;
    }
    if (!want)
        return;
    /* known-answer suppression (RFC 6762 §7.1) for our PTR */
    for (int i = 0; i < p->n_rrs; i++) {
        const mdns_rr *r = &p->rrs[i];
        if (r->section == MDNS_SEC_ANSWER && r->type == MDNS_PTR && mdns_name_eq(r->name, SERVICE) &&
            mdns_name_eq(r->target, d->instance) && r->ttl > TTL_OTHER / 2)
            want &= ~R_PTR;
    }
    if (!want)
        return;
    int at = ifaddr_of(d, ifindex, ntohl(from->sin_addr.s_addr));
    bool legacy = ntohs(from->sin_port) != MDNS_PORT;
    if (legacy) {                         /* RFC 6762 §6.7: a plain DNS resolver asking */
        /* the sender passed the on-link rule; once a second per sender and name */
        char key[INET_ADDRSTRLEN + MDNS_NAME_MAX + 2];
        struct in_addr ia;
        inet_ntop(AF_INET, &from->sin_addr, key, INET_ADDRSTRLEN);
        snprintf(key + strlen(key), sizeof key - strlen(key), " %s", p->n_qs ? p->qs[0].name : "");
        if (!mdns_rate_allow(&d->legacy, key, now, NS) ||
            inet_pton(AF_INET, d->ifaddrs.addrs[at >= 0 ? at : 0], &ia) != 1)
            return;
        mdns_writer w;
        mdns_w_init(&w, d->sbuf, sizeof d->sbuf, p->id, 0x8400);
        for (int i = 0; i < p->n_qs; i++)
            mdns_w_question(&w, p->qs[i].name, p->qs[i].type, MDNS_CLASS_IN);
        put_records(d, &w, want, (const uint8_t *)&ia.s_addr, false, true);
        long n = mdns_w_finish(&w);
        if (n > 0)
            send_to(d, d->sbuf, (size_t)n, from);
        return;
    }
    (void)unicast_asked;                  /* we always answer by multicast: every node hears */
    multicast_response(d, want, false, at);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    discovery *d = arg;
    for (int k = 0; k < 64; k++) {
        struct sockaddr_in from;
        os_udp_meta meta;
        long n = os_udp_recv(fd, d->buf, sizeof d->buf, &from, &meta);
        if (n < 0)
            return;
        uint64_t now = os_now_ns();
        uint32_t src = ntohl(from.sin_addr.s_addr);
        bool response = n > 2 && (d->buf[2] & 0x80);
        int v = mdns_guard_source(d->ifs, d->n_ifs, meta.ifindex, src, meta.ttl, response);
        if (v == MDNS_OFF_LINK && now - d->ifs_ns > NS) {
            read_ifaces(d, now);          /* an address that came since the last look? */
            v = mdns_guard_source(d->ifs, d->n_ifs, meta.ifindex, src, meta.ttl, response);
        }
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &from.sin_addr, a, sizeof a);
        if (v) {
            if (response)
                refuse(d, RF_SOURCE, now, "ignored a response from %s (IP TTL %d): %s", a, meta.ttl,
                       mdns_guard_why(v));
            else
                rc_log(LOG_DEBUG, "cluster: mDNS: ignored a query from %s: %s", a,
                       mdns_guard_why(v));
            continue;
        }
        if (mdns_parse(d->buf, (size_t)n, d->pkt) != 0) {
            rc_log(LOG_DEBUG, "cluster: ignoring an mDNS packet from %s: %s", a, rc_errmsg());
            continue;
        }
        if (d->pkt->response) {
            learn(d, d->pkt, meta.ifindex, a, now);
            cl__tick_soon(d->c);          /* hand_over: at the tick's busy pace */
        } else
            answer(d, d->pkt, &from, meta.ifindex, now);
    }
}

/* ---- life cycle ---- */

void discovery_tick(discovery *d, uint64_t now)
{
    if (now - d->ifs_ns > 10 * NS)
        read_ifaces(d, now);
    refusal_flush(d, now);
    hand_over(d, now);
    if (d->n_announced < 2 && now >= d->next_announce_ns) {
        multicast_response(d, R_PTR | R_SRV | R_TXT | R_A, false, -1);
        d->n_announced++;
        d->next_announce_ns = now + NS;
    }
    if (now >= d->next_query_ns) {
        multicast_query(d, SERVICE, MDNS_PTR, NULL, 0);
        d->next_query_ns = now + d->query_gap_ns;
        d->query_gap_ns = d->query_gap_ns * 2 > 60 * NS ? 60 * NS : d->query_gap_ns * 2;
    }
}

void discovery_goodbye(discovery *d)
{
    if (!d)
        return;
    event_del(d->ev);               /* hear no more: the node is leaving */
    multicast_response(d, R_PTR | R_SRV | R_TXT | R_A, true, -1);
}

int discovery_new(struct cluster *c, discovery **out)
{
    discovery *d = rc_calloc(1, sizeof *d);
    if (!d || !(d->pkt = rc_malloc(sizeof *d->pkt))) {
        rc_free(d);
        return rc_fail(RC_ENOMEM, "mdns");
    }
    d->c = c;
    d->fd = -1;
    if (c->advertise[0]) {
        d->ifaddrs.n_addrs = 1;
        snprintf(d->ifaddrs.addrs[0], CL_ADDR_LEN, "%s", c->advertise);
    } else {
        cl__local_addrs(&d->ifaddrs, false);
    }
    int r = 0;
    if (!d->ifaddrs.n_addrs) {
        r = rc_fail(RC_EIO, "no network interface with an IPv4 address for multicast DNS");
        goto fail;
    }
    d->fd = socket(AF_INET, SOCK_DGRAM, 0);
    int one = 1;
    unsigned char ttl = 255, loop = 1;
    if (d->fd < 0 || evutil_make_socket_nonblocking(d->fd) || evutil_make_socket_closeonexec(d->fd)) {
        r = rc_fail(RC_EIO, "mDNS socket: %s", strerror(errno));
        goto fail;
    }
    setsockopt(d->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
#ifdef SO_REUSEPORT
    setsockopt(d->fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
#endif
    struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = htons(MDNS_PORT),
                               .sin_addr.s_addr = htonl(INADDR_ANY) };
    if (bind(d->fd, (struct sockaddr *)&any, sizeof any) != 0) {
        r = rc_fail(RC_EIO, "mDNS: cannot bind UDP port %d: %s", MDNS_PORT, strerror(errno));
        goto fail;
    }
    setsockopt(d->fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
    int uttl = 255;                       /* RFC 6762 §11: unicast answers too */
    setsockopt(d->fd, IPPROTO_IP, IP_TTL, &uttl, sizeof uttl);
    /* the TTL and arrival interface of what comes in, for the on-link rules */
    if (os_udp_want_meta(d->fd))
        rc_log(LOG_WARN, "cluster: mDNS: the system does not say the TTL or interface of "
               "packets (%s); only the sender's subnet is checked", strerror(errno));
    read_ifaces(d, os_now_ns());
    setsockopt(d->fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
    int joined = 0;
    for (int i = 0; i < d->ifaddrs.n_addrs; i++) {
        struct ip_mreq m;
        inet_pton(AF_INET, MDNS_GROUP, &m.imr_multiaddr);
        if (inet_pton(AF_INET, d->ifaddrs.addrs[i], &m.imr_interface) != 1)
            continue;
        if (setsockopt(d->fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) == 0 || errno == EADDRINUSE)
            joined++;
        else
            rc_log(LOG_DEBUG, "cluster: mDNS: cannot join the group on %s: %s",
                   d->ifaddrs.addrs[i], strerror(errno));
    }
    if (!joined) {
        r = rc_fail(RC_EIO, "mDNS: cannot join %s on any interface", MDNS_GROUP);
        goto fail;
    }
    /* names */
    cl_node *self = c->nodes[0];
    char label[64], esc[MDNS_NAME_MAX];
    int nn = (int)strlen(c->name);
    if (nn > 48)
        nn = 48;
    while (nn > 0 && ((unsigned char)c->name[nn] & 0xc0) == 0x80)   /* a whole UTF-8 character */
        nn--;
    snprintf(label, sizeof label, "%.*s [%.8s]", nn, c->name, self->id_hex);
    mdns_label_escape(label, esc, sizeof esc);
    if (snprintf(d->instance, sizeof d->instance, "%s.%s", esc, SERVICE) >= (int)sizeof d->instance)
        snprintf(d->instance, sizeof d->instance, "racimo [%.8s].%s", self->id_hex, SERVICE);
    snprintf(d->host, sizeof d->host, "racimo-%.16s.local", self->id_hex);
    snprintf(d->txt[0], sizeof d->txt[0], "txtvers=1");
    snprintf(d->txt[1], sizeof d->txt[1], "proto=%d.%d", c->major, c->minor);
    snprintf(d->txt[2], sizeof d->txt[2], "id=%s", self->id_hex);
    snprintf(d->txt[3], sizeof d->txt[3], "fp=%s", c->fp);
    d->query_gap_ns = NS;
    d->ev = event_new(c->base, d->fd, EV_READ | EV_PERSIST, on_read, d);
    if (!d->ev || event_add(d->ev, NULL)) {
        r = rc_fail(RC_ENOMEM, "mDNS event");
        goto fail;
    }
    rc_log(LOG_INFO, "cluster: discovery: announcing '%s' on %d interface%s", label,
           d->ifaddrs.n_addrs, d->ifaddrs.n_addrs == 1 ? "" : "s");
    *out = d;
    return 0;
fail:
    discovery_free(d);
    return r;
}

void discovery_free(discovery *d)
{
    if (!d)
        return;
    if (d->ev)
        event_free(d->ev);
    if (d->fd >= 0)
        close(d->fd);
    rc_free(d->pkt);
    rc_free(d);
}

void discovery_rekey(discovery *d)
{
    if (!d)
        return;
    snprintf(d->txt[3], sizeof d->txt[3], "fp=%s", d->c->fp);
    d->n_announced = 0;
    d->next_announce_ns = 0;
}
