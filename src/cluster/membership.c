/* membership.c - SWIM (swim.c) in the live node: its UDP socket on the
 * cluster port, datagrams sealed with the cluster key (swim_seal.c), its
 * timer on the cluster thread, push-pull exchanges over the TCP links
 * (message SWIM, 0x08), and this node's digest (node_digest.c) as its
 * metadata, rebuilt every REFRESH_MS and republished when it changed.
 *
 * With SWIM on, its view decides each member's up/down (alive or suspect:
 * up; dead or left: down), and with it the leader and the quorum
 * (cluster.c, cl__update_membership); the links only carry messages.
 * Parameters follow --down-after (cl__swim_start).  Members SWIM learns
 * (with their digests: addresses, ports) enter the node table (learn);
 * which links exist is links.c's business.
 *
 * Threads: everything runs on the cluster thread; the counts published for
 * cluster_snapshot are under c->mu.
 */
#include "cluster/cluster_internal.h"
#include "cluster/node_digest.h"
#include "cluster/swim.h"
#include "cluster/swim_seal.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <sodium.h>

_Static_assert(SWIM_ID_BYTES == WIRE_ID_BYTES, "SWIM ids are node ids");

struct cl_swim {
    swim *sw;
    int fd;
    struct event *rd, *timer;
    uint8_t cluster_key[WIRE_KEY_BYTES];     /* the key K_swim was derived from */
    uint8_t key[SWIM_SEAL_KEY_BYTES];
    uint8_t dgram[SWIM_PACKET_MAX + SWIM_SEAL_OVERHEAD], plain[SWIM_PACKET_MAX];
    uint64_t bad;                             /* datagrams refused */
    uint8_t meta[SWIM_META_MAX];              /* the digest last published */
    int meta_len;
    uint64_t next_meta_ms, next_publish_ms;
    bool changed;                             /* a member changed state: recompute up/down */
    bool view_dirty;                          /* a member changed (state or digest): publish */
    uint64_t suspicions, deaths;              /* members seen suspect, dead: since start */
    uint8_t old_cluster_key[WIRE_KEY_BYTES];  /* the key before a rotation, and its K_swim */
    uint8_t old_key[SWIM_SEAL_KEY_BYTES];
};

/* how often the digest is rebuilt: free slots change with every request,
 * and a period is as fresh as SWIM spreads.  The view is published when a
 * member changed, and every PUBLISH_MS for the counters (rebuilding it
 * decodes every member's digest: every 500 ms at 64 members, for nothing,
 * it was a visible part of an idle node's time) */
#define REFRESH_MS 500
#define PUBLISH_MS 5000

static uint64_t now_ms(void) { return os_now_ns() / 1000000; }

/* K_swim follows the cluster key through a rotation */
static const uint8_t *seal_key(struct cluster *c, struct cl_swim *m)
{
    if (sodium_memcmp(m->cluster_key, c->key, WIRE_KEY_BYTES) != 0) {
        memcpy(m->cluster_key, c->key, WIRE_KEY_BYTES);
        swim_seal_key(c->key, m->key);
    }
    return m->key;
}

/* While a key rotation settles (rotate.c keeps the key before), members
 * still sealing with it are heard, so a rotation takes nobody down. */
static const uint8_t *old_seal_key(struct cluster *c, struct cl_swim *m)
{
    if (sodium_memcmp(m->old_cluster_key, c->rot.old_key, WIRE_KEY_BYTES) != 0) {
        memcpy(m->old_cluster_key, c->rot.old_key, WIRE_KEY_BYTES);
        swim_seal_key(c->rot.old_key, m->old_key);
    }
    return m->old_key;
}

/* A random member with an open link, or NULL. */
static cl_node *linked_member(struct cluster *c)
{
    int n = 0;
    for (int i = 1; i < c->n_nodes; i++)
        n += c->nodes[i]->conn && c->nodes[i]->conn->phase == PH_OPEN;
    if (!n)
        return NULL;
    int pick = (int)randombytes_uniform((uint32_t)n);
    for (int i = 1; i < c->n_nodes; i++)
        if (c->nodes[i]->conn && c->nodes[i]->conn->phase == PH_OPEN && pick-- == 0)
            return c->nodes[i];
    return NULL;
}

static void on_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable)
{
    struct cluster *c = ctx;
    struct cl_swim *m = c->swim;
    cl_node *n = cl__node_find(c, to);
    if (!n || n->is_self)
        return;
    if (reliable) {
        /* a push-pull: over the member's link.  Without one it goes to a
         * member this node is linked to instead - a handshake for every
         * exchange would cost more than the exchange, and under load it
         * fed a storm of links; the tables merge all the same - with the
         * header's view of the receiver (offset 42: state, 43: incarnation)
         * made "unknown", as it was about the other member.  Only a node
         * linked to nobody opens a link for it (links.c). */
        cl_node *via = n->conn && n->conn->phase == PH_OPEN ? n : linked_member(c);
        if (via == n) {
            cl__conn_send(n->conn, WIRE_SWIM, buf, len, false);
            cl__conn_flush(n->conn);
        } else if (via && len > 47) {
            uint8_t *copy = rc_malloc(len);
            if (copy) {
                memcpy(copy, buf, len);
                copy[42] = 0xff;
                memset(copy + 43, 0, 4);
                cl__conn_send(via->conn, WIRE_SWIM, copy, len, false);
                cl__conn_flush(via->conn);
                rc_free(copy);
            }
        } else if (n->up) {
            cl__enqueue(c, to, WIRE_SWIM, buf, len);
        }
        return;
    }
    const char *addr = n->linked[0] ? n->linked : n->addrs.n_addrs ? n->addrs.addrs[0] : NULL;
    if (!addr || n->cluster_port <= 0)
        return;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)n->cluster_port) };
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return;
    int dl = swim_seal(seal_key(c, m), buf, len, m->dgram, sizeof m->dgram);
    if (dl > 0)
        sendto(m->fd, m->dgram, (size_t)dl, 0, (struct sockaddr *)&sa, sizeof sa);
}

/* A member's digest (authenticated by the cluster key that sealed it):
 * the node enters the table, as a member, with where to reach it. */
static void learn(struct cluster *c, const swim_event *ev)
{
    node_digest d;
    if (!ev->meta_len || node_digest_decode(ev->meta, ev->meta_len, &d) ||
        !memcmp(ev->id, c->nodes[0]->id, WIRE_ID_BYTES))
        return;
    cl_node *n = cl__node_find(c, ev->id);
    if (!n && !(n = cl__node_add(c, ev->id)))
        return;                      /* removed from the cluster, or the table is full */
    char ip[INET_ADDRSTRLEN] = "";
    if (d.ipv4[0])
        inet_ntop(AF_INET, d.ipv4, ip, sizeof ip);
    pthread_mutex_lock(&c->mu);
    n->digest = d;
    n->has_digest = true;
    if (!n->member) {
        n->member = true;
        c->peers_dirty = true;
    }
    /* a linked node's port is the one its link proved */
    if (!n->conn && d.cluster_port && d.cluster_port != n->cluster_port) {
        n->cluster_port = d.cluster_port;
        c->peers_dirty = true;
    }
    if (d.http_port)
        n->http_port = d.http_port;
    pthread_mutex_unlock(&c->mu);
    if (ip[0])
        cl__node_add_addr(c, n, ip);
}

static void on_event(void *ctx, const swim_event *ev)
{
    static const char *const names[] = { "", "joined", "updated", "suspected", "alive again",
                                         "dead", "left", "forgotten" };
    struct cluster *c = ctx;
    char hex[2 * WIRE_ID_BYTES + 1];
    wire_hex(ev->id, WIRE_ID_BYTES, hex);
    if (ev->type != SWIM_EV_UPDATE)
        c->swim->changed = true;
    c->swim->view_dirty = true;
    if (ev->type == SWIM_EV_JOIN || ev->type == SWIM_EV_UPDATE || ev->type == SWIM_EV_ALIVE)
        learn(c, ev);
    c->swim->suspicions += ev->type == SWIM_EV_SUSPECT;
    c->swim->deaths += ev->type == SWIM_EV_DEAD;
    if (ev->type != SWIM_EV_UPDATE)
        rc_log(LOG_DEBUG, "membership: node %.8s %s (incarnation %u)", hex,
               ev->type > 0 && ev->type <= SWIM_EV_REAPED ? names[ev->type] : "?",
               ev->incarnation);
}

/* Per model served by alive members (their digests): nodes and free slots,
 * what a router needs to reach a free copy in one hop. */
static json_t *serving_view(swim *sw)
{
    json_t *out = json_object();
    for (size_t i = 0; out && i < swim_n_members(sw); i++) {
        swim_member_view v;
        node_digest d;
        if (swim_member_at(sw, i, &v) || v.state != SWIM_ALIVE ||
            node_digest_decode(v.meta, v.meta_len, &d))
            continue;
        for (int j = 0; j < d.n_models; j++) {
            json_t *agg = json_object_get(out, d.models[j].name);
            if (!agg) {
                agg = json_pack("{s:i, s:i}", "nodes", 0, "free", 0);
                json_object_set_new(out, d.models[j].name, agg);
            }
            json_object_set_new(agg, "nodes", json_integer(json_integer_value(json_object_get(agg, "nodes")) + 1));
            json_object_set_new(agg, "free", json_integer(json_integer_value(json_object_get(agg, "free")) +
                                                          d.models[j].free));
        }
    }
    return out;
}

static void publish(struct cluster *c)
{
    struct cl_swim *m = c->swim;
    m->view_dirty = false;
    size_t counts[4];
    swim_counts(m->sw, counts);
    swim_stats st;
    swim_get_stats(m->sw, &st);
    json_t *serving = serving_view(m->sw);
    pthread_mutex_lock(&c->mu);
    json_decref(c->swim_serving);
    c->swim_serving = serving;
    for (int i = 0; i < 4; i++) c->swim_counts[i] = counts[i];
    c->swim_incarnation = st.incarnation;
    c->swim_bad = m->bad + st.bad;
    c->swim_suspicions = m->suspicions;
    c->swim_deaths = m->deaths;
    pthread_mutex_unlock(&c->mu);
}

static void publish(struct cluster *c);

/* up/down (and the counts in the view) follow a state change at once, not
 * at the next tick */
static void settle(struct cluster *c)
{
    if (c->swim->changed) {
        c->swim->changed = false;
        cl__update_membership(c, os_now_ns());
        publish(c);
    }
}

static void arm(struct cluster *c, uint64_t next)
{
    uint64_t now = now_ms(), wait = next > now ? next - now : 0;
    if (wait > 1000) wait = 1000;
    struct timeval tv = { (time_t)(wait / 1000), (suseconds_t)(wait % 1000) * 1000 };
    evtimer_add(c->swim->timer, &tv);
}

static int self_digest(struct cluster *c, uint8_t *out, size_t cap);

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct cluster *c = arg;
    struct cl_swim *m = c->swim;
    uint64_t now = now_ms();
    if (now >= m->next_meta_ms) {
        uint8_t meta[SWIM_META_MAX];
        int ml = self_digest(c, meta, sizeof meta);
        if (ml >= 0 && (ml != m->meta_len || memcmp(meta, m->meta, (size_t)ml))) {
            if (swim_set_meta(m->sw, meta, (size_t)ml, now) == 0) {
                memcpy(m->meta, meta, (size_t)ml);
                m->meta_len = ml;
            }
        }
        m->next_meta_ms = now + REFRESH_MS;
    }
    arm(c, swim_tick(m->sw, now));
    settle(c);
    if (m->view_dirty || now >= m->next_publish_ms) {
        publish(c);
        m->next_publish_ms = now + PUBLISH_MS;
    }
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct cluster *c = arg;
    struct cl_swim *m = c->swim;
    /* a bounded batch per wake-up, so a flood cannot starve the links */
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, m->dgram, sizeof m->dgram, 0);
        if (n < 0)
            break;
        int pl = swim_open(seal_key(c, m), m->dgram, (size_t)n, m->plain, sizeof m->plain);
        if (pl < 0 && c->rot.has_old)
            pl = swim_open(old_seal_key(c, m), m->dgram, (size_t)n, m->plain, sizeof m->plain);
        if (pl < 0 || swim_recv(m->sw, m->plain, (size_t)pl, now_ms()) != 0)
            m->bad++;
    }
    arm(c, swim_tick(m->sw, now_ms()));
    settle(c);
}

static int self_digest(struct cluster *c, uint8_t *out, size_t cap)
{
    node_digest d = { .cluster_port = (uint16_t)c->port, .http_port = (uint16_t)c->cfg.http_port };
    cl_node *self = c->nodes[0];
    if (self->addrs.n_addrs) inet_pton(AF_INET, self->addrs.addrs[0], d.ipv4);
    pthread_mutex_lock(&c->mu);
    d.cores = (uint16_t)(c->hw.cores > 0 ? c->hw.cores : 0);
    d.mem_total_mib = (uint32_t)(c->hw.mem_total >> 20);
    d.mem_free_mib = (uint32_t)(c->hw.mem_free >> 20);
    size_t i;
    json_t *v;
    json_array_foreach(c->serving, i, v) {
        const char *name = json_string_value(v);
        if (!name || !*name || strlen(name) > NODE_DIGEST_NAME_MAX || d.n_models == NODE_DIGEST_MODELS)
            continue;
        node_digest_model *dm = &d.models[d.n_models++];
        snprintf(dm->name, sizeof dm->name, "%s", name);
        json_int_t sl = json_integer_value(json_object_get(c->serving_slots, name));
        json_int_t fr = json_integer_value(json_object_get(c->serving_free, name));
        dm->slots = (uint16_t)(sl < 0 ? 0 : sl > CLUSTER_SLOTS_MAX ? CLUSTER_SLOTS_MAX : sl);
        dm->free = (uint16_t)(fr < 0 ? 0 : fr > dm->slots ? dm->slots : fr);
    }
    pthread_mutex_unlock(&c->mu);
    /* models that do not fit the metadata are left out, last first */
    int n;
    while ((n = node_digest_encode(&d, out, cap)) == RC_ELIMIT && d.n_models > 0)
        d.n_models--;
    return n;
}

int cl__swim_start(struct cluster *c)
{
    struct cl_swim *m = rc_calloc(1, sizeof *m);
    if (!m)
        return RC_ENOMEM;
    m->fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
    if (strcmp(c->listen_host, "localhost") == 0)
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    else
        inet_pton(AF_INET, c->listen_host, &sa.sin_addr);
    if (m->fd < 0 || bind(m->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        if (m->fd >= 0) close(m->fd);
        rc_free(m);
        return rc_fail(RC_EIO, "membership: cannot use UDP %s:%d: %s", c->listen_host, c->port,
                       strerror(e));
    }
    fcntl(m->fd, F_SETFL, fcntl(m->fd, F_GETFL) | O_NONBLOCK);
    uint8_t meta[SWIM_META_MAX];
    int ml = self_digest(c, meta, sizeof meta);
    swim_config cfg;
    swim_config_default(&cfg);
    /* --down-after bounds detection as it does for the links: a probe
     * period a sixth of it, and a suspicion of at most half of it at
     * small sizes (growing as log10 N, Lifeguard shortening it with each
     * confirmation) - a crash is suspected within about two periods and
     * declared dead within about five */
    uint32_t period = (uint32_t)c->cfg.down_after_ms / 6;
    cfg.period_ms = period < 100 ? 100 : period > 2000 ? 2000 : period;
    cfg.probe_timeout_ms = cfg.period_ms * 2 / 5;
    cfg.suspicion_max_mult = 2;
    swim_io io = { on_send, on_event, c };
    uint64_t seed;
    randombytes_buf(&seed, sizeof seed);
    c->swim = m;
    if (ml >= 0) {
        memcpy(m->meta, meta, (size_t)ml);
        m->meta_len = ml;
    }
    if (ml < 0 || !(m->sw = swim_new(&cfg, &io, c->nodes[0]->id, meta, (size_t)ml, seed, now_ms())) ||
        !(m->rd = event_new(c->base, m->fd, EV_READ | EV_PERSIST, on_readable, c)) ||
        !(m->timer = evtimer_new(c->base, on_timer, c)) || event_add(m->rd, NULL)) {
        cl__swim_free(c);
        return rc_fail(RC_ENOMEM, "membership: cannot start");
    }
    arm(c, now_ms());
    return 0;
}

void cl__swim_join(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    /* also one it holds dead: the push-pull tells a restarted node what
     * it is thought to be, and it refutes at once */
    if (c->swim) {
        swim_join(c->swim->sw, id, now_ms());
        arm(c, swim_tick(c->swim->sw, now_ms()));
        c->swim->changed = true;        /* a member SWIM did not have is up now, not at a tick */
        settle(c);
    }
}

void cl__swim_suspect(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    if (c->swim) {
        swim_suspect(c->swim->sw, id, now_ms());
        arm(c, swim_tick(c->swim->sw, now_ms()));   /* the suspicion spreads now */
        settle(c);
    }
}

bool cl__swim_alone(struct cluster *c)
{
    size_t counts[4];
    swim_counts(c->swim->sw, counts);
    return counts[SWIM_ALIVE] + counts[SWIM_SUSPECT] <= 1;
}

int cl__swim_state(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    return c->swim ? swim_state_of(c->swim->sw, id) : -1;
}

void cl__swim_on_stream(struct cluster *c, const uint8_t *data, size_t len)
{
    if (c->swim && swim_recv(c->swim->sw, data, len, now_ms()) != 0)
        rc_log(LOG_DEBUG, "cluster: %s", rc_errmsg());
    if (c->swim) {
        arm(c, swim_tick(c->swim->sw, now_ms()));
        settle(c);
    }
}

void cl__swim_stop(struct cluster *c)
{
    if (c->swim && c->swim->sw)
        swim_leave(c->swim->sw, now_ms());
}

void cl__swim_free(struct cluster *c)
{
    struct cl_swim *m = c->swim;
    if (!m)
        return;
    if (m->rd) event_free(m->rd);
    if (m->timer) event_free(m->timer);
    swim_free(m->sw);
    if (m->fd >= 0) close(m->fd);
    sodium_memzero(m, sizeof *m);
    rc_free(m);
    c->swim = NULL;
}
