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
 * which dials it.  Missing records are asked for.
 */
#include "cluster/cluster_internal.h"
#include "cluster/mdns.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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

typedef struct {
    char name[MDNS_NAME_MAX];            /* full instance name; "" = free */
    char host[MDNS_NAME_MAX];
    int port;
    bool have_srv, have_txt;
    char id[2 * WIRE_ID_BYTES + 1], fp[WIRE_FP_HEX + 1], proto[16];
    uint64_t expires_ns, asked_ns;
} inst_entry;

typedef struct {
    char name[MDNS_NAME_MAX];
    uint8_t addr[4];
    uint64_t expires_ns;
} host_entry;

struct discovery {
    struct cluster *c;
    int fd;
    struct event *ev;
    addr_list ifaddrs;                   /* where we send and what we answer with */
    char instance[MDNS_NAME_MAX], host[MDNS_NAME_MAX];
    char txt[4][96];
    uint64_t next_announce_ns, last_sent_ns;
    int n_announced;
    uint64_t next_query_ns, query_gap_ns;
    mdns_packet *pkt;
    inst_entry inst[N_CACHE];
    host_entry hosts[N_CACHE];
    uint8_t buf[MDNS_PKT_MAX];           /* received packet */
    uint8_t sbuf[MDNS_PKT_MAX];          /* packet being sent */
};

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

/* Multicasts a response with `answers` on every interface, each with its
 * own address in the A record. */
static void multicast_response(discovery *d, int answers, bool goodbye)
{
    struct sockaddr_in g = group_addr();
    for (int i = 0; i < d->ifaddrs.n_addrs; i++) {
        struct in_addr ia;
        if (inet_pton(AF_INET, d->ifaddrs.addrs[i], &ia) != 1)
            continue;
        setsockopt(d->fd, IPPROTO_IP, IP_MULTICAST_IF, &ia, sizeof ia);
        mdns_writer w;
        mdns_w_init(&w, d->sbuf, sizeof d->sbuf, 0, 0x8400);
        put_records(d, &w, answers, (const uint8_t *)&ia.s_addr, goodbye, false);
        long n = mdns_w_finish(&w);
        if (n > 0)
            send_to(d, d->sbuf, (size_t)n, &g);
    }
    d->last_sent_ns = os_now_ns();
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

static inst_entry *inst_get(discovery *d, const char *name, uint64_t now, bool create)
{
    inst_entry *free_e = NULL;
    for (int i = 0; i < N_CACHE; i++) {
        inst_entry *e = &d->inst[i];
        if (e->name[0] && e->expires_ns < now)
            e->name[0] = 0;
        if (e->name[0] && mdns_name_eq(e->name, name))
            return e;
        if (!e->name[0] && !free_e)
            free_e = e;
    }
    if (!create || !free_e)
        return NULL;
    memset(free_e, 0, sizeof *free_e);
    snprintf(free_e->name, sizeof free_e->name, "%s", name);
    free_e->expires_ns = now + 120 * NS;
    return free_e;
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

static void learn(discovery *d, const mdns_packet *p, uint64_t now)
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
                e->port = r->port;
                e->have_srv = r->ttl > 0;
            }
        } else if (r->type == MDNS_TXT && ends_with_service(r->name)) {
            inst_entry *e = inst_get(d, r->name, now, r->ttl > 0);
            if (e) {
                e->have_txt = r->ttl > 0 &&
                    mdns_txt_get(r->rdata, r->n_rdata, "id", e->id, sizeof e->id) &&
                    mdns_txt_get(r->rdata, r->n_rdata, "fp", e->fp, sizeof e->fp);
                if (!mdns_txt_get(r->rdata, r->n_rdata, "proto", e->proto, sizeof e->proto))
                    e->proto[0] = 0;
            }
        } else if (r->type == MDNS_A) {
            host_entry *e = host_get(d, r->name, now, r->ttl > 0);
            if (e && r->ttl == 0) {
                e->name[0] = 0;
            } else if (e) {
                memcpy(e->addr, r->addr, 4);
                e->expires_ns = exp;
            }
        }
    }
    /* hand complete instances of this cluster to the cluster */
    for (int i = 0; i < N_CACHE; i++) {
        inst_entry *e = &d->inst[i];
        if (!e->name[0] || mdns_name_eq(e->name, d->instance))
            continue;
        host_entry *h = e->have_srv ? host_get(d, e->host, now, false) : NULL;
        if (!e->have_srv || !e->have_txt || !h) {
            if (now - e->asked_ns > NS) {     /* ask for what is missing, once a second */
                e->asked_ns = now;
                if (!e->have_srv || !e->have_txt)
                    multicast_query(d, e->name, MDNS_SRV, e->name, MDNS_TXT);
                else
                    multicast_query(d, e->host, MDNS_A, NULL, 0);
            }
            continue;
        }
        uint8_t id[WIRE_ID_BYTES];
        if (strcmp(e->fp, d->c->fp) || wire_unhex(e->id, id, WIRE_ID_BYTES) || e->port <= 0)
            continue;
        char addr[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, h->addr, addr, sizeof addr);
        cl__on_found(d->c, id, addr, e->port);
    }
}

/* Answers the questions of a query that concern us. */
static void answer(discovery *d, const mdns_packet *p, const struct sockaddr_in *from, uint64_t now)
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
    bool legacy = ntohs(from->sin_port) != MDNS_PORT;
    if (legacy) {                         /* RFC 6762 §6.7: a plain DNS resolver asking */
        struct in_addr ia;
        if (!d->ifaddrs.n_addrs || inet_pton(AF_INET, d->ifaddrs.addrs[0], &ia) != 1)
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
    if (now - d->last_sent_ns < NS / 4 && !(want & ~(R_PTR | R_ENUM)))
        return;                           /* just multicast these; the asker heard them */
    multicast_response(d, want, false);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    discovery *d = arg;
    for (int k = 0; k < 64; k++) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(fd, d->buf, sizeof d->buf, 0, (struct sockaddr *)&from, &fl);
        if (n < 0)
            return;
        if (fl < sizeof from || from.sin_family != AF_INET)
            continue;
        if (mdns_parse(d->buf, (size_t)n, d->pkt) != 0) {
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &from.sin_addr, a, sizeof a);
            rc_log(LOG_DEBUG, "cluster: ignoring an mDNS packet from %s: %s", a, rc_errmsg());
            continue;
        }
        uint64_t now = os_now_ns();
        if (d->pkt->response)
            learn(d, d->pkt, now);
        else
            answer(d, d->pkt, &from, now);
    }
}

/* ---- life cycle ---- */

void discovery_tick(discovery *d, uint64_t now)
{
    if (d->n_announced < 2 && now >= d->next_announce_ns) {
        multicast_response(d, R_PTR | R_SRV | R_TXT | R_A, false);
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
    multicast_response(d, R_PTR | R_SRV | R_TXT | R_A, true);
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
