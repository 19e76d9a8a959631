/* cluster.c - the cluster's life cycle, thread and view.
 *
 * The thread runs one libevent loop: the listening socket, the mDNS socket,
 * each peer's connection, and a tick that sends heartbeats and probes,
 * notices silent peers, dials nodes that are down, and publishes this
 * node's STATE.  The tick runs every TICK_MS while something is under way
 * (a handshake, a dial, a transfer) and otherwise sleeps until the next
 * thing due - a heartbeat, a silence limit, a dial - at most IDLE_TICK_MS
 * (next_tick): an idle node wakes a few times a second, not ten.
 *
 * Membership.  A node is known once met by any means (mDNS, static peer,
 * another node's STATE, peers.json) and forgotten after forget_after_ms
 * down; it is a member only once a handshake proved its id (its static
 * key), here or in a run before.  It is "up" in this node's view while a
 * link to it is open and carried a frame within down_after_ms; every node
 * keeps a link to every other (a full mesh), so all views agree once links
 * settle.  The leader is the up member with the smallest id (so a proven
 * one: ids heard in gossip or mDNS alone never count); it alone places instances (later
 * issues), and only while its side has a quorum: a strict majority of the
 * known membership up.  docs/cluster-protocol.md explains the partition
 * rule.  Links in the view are each node's own measures, shared in STATE.
 * With SWIM (cluster_config.swim), SWIM's view decides up/down instead
 * (membership.c) and links are kept with neighbours and on demand only
 * (links.c); the leader and quorum rules stay.
 */
#include "cluster/cluster_internal.h"
#include "cluster/channel.h"
#include "cluster/exports.h"

#include "base/err.h"
#include "base/evbase.h"
#include "model/gguf.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#define TICK_MS        100
#define IDLE_TICK_MS   1000        /* the longest the tick sleeps */
#define STATE_EVERY_MS 10000       /* STATE unchanged is sent again after this */
#define MS             1000000ull
#define MAX_HANDSHAKES 64          /* accepted connections in handshake, in all */
#define STRANGER_HANDSHAKES 48     /* of which from addresses of no member */
#define PER_ADDR_HANDSHAKES 4      /* from one address */
#define MEMBER_ADDR_HANDSHAKES 16  /* from one address of a member */
#define STATE_MAX      (4u << 20)
#define MAX_UNPROVEN   32          /* nodes only multicast DNS speaks for, at a time */
#define HINT_DIALS_S   4           /* dials to addresses from multicast DNS, per second */
#define HINT_DIALS_MAX 8           /* ... and at once */
#define VERSION_TEXT   "0.1.0"

void cluster_config_default(cluster_config *c)
{
    memset(c, 0, sizeof *c);
    c->port = CLUSTER_DEFAULT_PORT;
    c->heartbeat_ms = 500;
    c->down_after_ms = 3000;
    c->probe_ms = 10000;
    c->forget_after_ms = 3600000;
    c->key_confirm_ms = 30000;
    c->swim_neighbours = 8;
    c->link_idle_ms = 60000;
    c->measure_max_age_ms = 300000;
    c->bench = 1;
}

/* ---- the node table ---- */

cl_node *cl__node_find(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    for (int i = 0; i < c->n_nodes; i++)
        if (!memcmp(c->nodes[i]->id, id, WIRE_ID_BYTES))
            return c->nodes[i];
    return NULL;
}

cl_node *cl__node_add(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    if (c->n_nodes >= 4096 || cl__is_revoked(c, id))
        return NULL;
    cl_node *n = rc_calloc(1, sizeof *n);
    if (!n)
        return NULL;
    memcpy(n->id, id, WIRE_ID_BYTES);
    wire_hex(id, WIRE_ID_BYTES, n->id_hex);
    n->down_since_ns = os_now_ns();
    pthread_mutex_lock(&c->mu);
    if (c->n_nodes == c->cap_nodes) {
        int cap = c->cap_nodes ? 2 * c->cap_nodes : 8;
        cl_node **nn = rc_realloc(c->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            pthread_mutex_unlock(&c->mu);
            rc_free(n);
            return NULL;
        }
        c->nodes = nn;
        c->cap_nodes = cap;
    }
    c->nodes[c->n_nodes++] = n;
    pthread_mutex_unlock(&c->mu);
    c->peers_dirty = true;
    return n;
}

static void cl_node_free(cl_node *n)
{
    if (n) {
        json_decref(n->info);
        rc_free(n);
    }
}

static bool valid_ipv4(const char *a)
{
    struct in_addr ia;
    return a && strlen(a) < CL_ADDR_LEN && inet_pton(AF_INET, a, &ia) == 1;
}

/* Caller holds no lock. */
void cl__node_add_addr(struct cluster *c, cl_node *n, const char *addr)
{
    if (!valid_ipv4(addr))
        return;
    pthread_mutex_lock(&c->mu);
    bool have = false;
    for (int i = 0; i < n->addrs.n_addrs; i++)
        have = have || !strcmp(n->addrs.addrs[i], addr);
    if (!have && n->addrs.n_addrs < CL_MAX_ADDRS) {
        snprintf(n->addrs.addrs[n->addrs.n_addrs++], CL_ADDR_LEN, "%s", addr);
        c->peers_dirty = true;
    }
    pthread_mutex_unlock(&c->mu);
}

static cl_node *self_node(struct cluster *c) { return c->nodes[0]; }

static bool has_addr(const cl_node *n, const char *addr)
{
    for (int i = 0; i < n->addrs.n_addrs; i++)
        if (!strcmp(n->addrs.addrs[i], addr))
            return true;
    return false;
}

/* The addresses to dial a node at: the one it last linked from first,
 * then the others it is known by. */
static int n_dial_addrs(const cl_node *n)
{
    return n->addrs.n_addrs + (n->linked[0] && !has_addr(n, n->linked));
}

static const char *dial_addr(const cl_node *n, int i)
{
    if (n->linked[0]) {
        if (i == 0)
            return n->linked;
        for (int j = 0; j < n->addrs.n_addrs; j++)
            if (strcmp(n->addrs.addrs[j], n->linked) && --i == 0)
                return n->addrs.addrs[j];
        return n->linked;
    }
    return n->addrs.addrs[i % n->addrs.n_addrs];
}

/* "a.b.c.d" of "a.b.c.d:port" */
static void host_of(const char *peer_addr, char *out, size_t cap)
{
    snprintf(out, cap, "%.*s", (int)strcspn(peer_addr, ":"), peer_addr);
}

/* ---- this node's STATE ---- */

static void self_addrs(struct cluster *c, addr_list *out)
{
    out->n_addrs = 0;
    if (c->advertise[0]) {
        out->n_addrs = 1;
        snprintf(out->addrs[0], CL_ADDR_LEN, "%s", c->advertise);
        return;
    }
    cl__local_addrs(out, false);
    if (!out->n_addrs) {
        out->n_addrs = 1;
        snprintf(out->addrs[0], CL_ADDR_LEN, "127.0.0.1");
    }
}

static json_t *addr_json(const addr_list *a)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < a->n_addrs; i++)
        json_array_append_new(arr, json_string(a->addrs[i]));
    return arr;
}

/* This node's record; the caller holds mu. */
json_t *cl__self_state(struct cluster *c)
{
    cl_node *self = self_node(c);
    json_t *peers = json_array(), *links = json_array();
    uint64_t now = os_now_ns();
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        if (!n->member)
            continue;
        json_array_append_new(peers, json_pack("{s:s, s:o, s:i, s:s}", "id", n->id_hex,
                                               "addresses", addr_json(&n->addrs), "cluster_port",
                                               n->cluster_port, "state", n->up ? "up" : "down"));
        json_t *l = cl__measure_json(c, n, now);   /* links that exist, measures cached */
        if (l)
            json_array_append_new(links, l);
    }
    char proto[16];
    snprintf(proto, sizeof proto, "%d.%d", c->major, c->minor);
    json_t *st = json_pack("{s:s, s:s, s:o, s:i, s:i, s:s, s:s, s:o, s:O, s:O, s:O, s:O, s:o, s:o}",
                     "id", self->id_hex, "name", c->name, "addresses", addr_json(&self->addrs),
                     "cluster_port", c->port, "http_port", c->cfg.http_port,
                     "version", VERSION_TEXT, "protocol", proto,
                     "hardware", cl__hw_json(&c->hw),
                     "models", c->models, "serving", c->serving,
                     "serving_free", c->serving_free, "serving_slots", c->serving_slots,
                     "peers", peers, "links", links);
    const char *k;
    json_t *v;
    json_object_foreach(c->published, k, v)
        if (st && !json_object_get(st, k))          /* never over the record's own keys */
            json_object_set(st, k, v);
    return st;
}

static void send_state(struct cluster *c, cl_conn *only)
{
    pthread_mutex_lock(&c->mu);
    json_t *st = cl__self_state(c);
    c->self_dirty = false;
    pthread_mutex_unlock(&c->mu);
    char *s = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    if (!s)
        return;
    size_t n = strlen(s);
    for (cl_conn *k = c->conns; k; k = k->next)
        if (k->phase == PH_OPEN && (!only || k == only))
            cl__conn_send(k, WIRE_STATE, s, n, false);
    free(s);
}

/* ---- membership ---- */

void cl__update_membership(struct cluster *c, uint64_t now)
{
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        /* with SWIM, its view decides (alive or suspect: up); the links
         * only carry messages */
        int sw = c->swim ? cl__swim_state(c, n->id) : -2;
        bool up = sw != -2 ? n->member && (sw == 0 || sw == 1)
                           : n->conn && n->conn->phase == PH_OPEN &&
                             cl__since(now, n->conn->last_rx_ns) <= (uint64_t)c->cfg.down_after_ms * MS;
        if (up == n->up)
            continue;
        pthread_mutex_lock(&c->mu);
        n->up = up;
        c->n_came_up += up;
        if (!up) {
            n->down_since_ns = now;
            n->rtt_ms = n->bw_mbps = 0;
            n->rtt_at_ns = n->bw_at_ns = 0;
        }
        c->self_dirty = true;
        pthread_mutex_unlock(&c->mu);
        rc_log(up ? LOG_INFO : LOG_WARN, "cluster: node %.8s (%s) is %s", n->id_hex,
               n->name[0] ? log_clean(n->name) : "?", up ? "up" : "down");
        if (!up) {
            n->next_dial_ns = now;   /* try again at once (it may have restarted) */
            n->dial_idx = 0;         /* where it linked from, first */
            for (int k = 0; k < c->n_on_down; k++)
                c->on_down[k].fn(c->on_down[k].ud, n->id_hex);
        }
    }
}

/* Called once a handshake (of a link or a data channel) has proven the
 * peer's identity, before anything else of it is taken: the one place that
 * lets a proven id in or not.  0, or a code with a detail for the log. */
int cl__admit(struct cluster *c, cl_conn *k)
{
    if (c->stopping)
        return rc_fail(RC_ESTATE, "this node is shutting down");
    return 0;
}

void cl__on_established(struct cluster *c, cl_conn *k)
{
    uint64_t now = os_now_ns();
    cl_node *self = self_node(c);
    if (!memcmp(k->ws.peer_id, self->id, WIRE_ID_BYTES)) {
        rc_log(LOG_DEBUG, "cluster: %s is this node itself", k->peer_addr);
        if (k->static_idx >= 0)
            c->statics[k->static_idx].is_self = true;
        cl__conn_close(k, NULL);
        return;
    }
    cl_node *n = cl__node_find(c, k->ws.peer_id);
    if (!n && !(n = cl__node_add(c, k->ws.peer_id))) {
        cl__conn_close(k, "out of memory");
        return;
    }
    if (k->static_idx >= 0) {
        cl_static *s = &c->statics[k->static_idx];
        s->known = true;
        memcpy(s->id, n->id, WIRE_ID_BYTES);
    }
    k->node = n;
    if (n->conn && n->conn != k) {
        cl_conn *old = n->conn;
        /* Both ends apply the same rule to two simultaneous links, so they
         * keep the same one: the link dialled by the smaller node id.  A
         * link already silent is stale (the peer restarted): the new wins. */
        bool old_fresh = cl__since(now, old->last_rx_ns) < 2 * cl__heartbeat_ns(c);
        const uint8_t *d_new = k->role == WIRE_DIALER ? self->id : n->id;
        const uint8_t *d_old = old->role == WIRE_DIALER ? self->id : n->id;
        bool keep_new = !old_fresh || memcmp(d_new, d_old, WIRE_ID_BYTES) < 0;
        if (!keep_new) {
            cl__conn_close(k, "duplicate link");
            return;
        }
        n->conn = k;
        cl__conn_close(old, "duplicate link");
    }
    n->conn = k;
    n->last_rx_ns = now;
    pthread_mutex_lock(&c->mu);
    n->has_link = true;
    pthread_mutex_unlock(&c->mu);
    /* the address this link came from is proven: dialled first from now
     * on, and what multicast DNS says does not move the node while linked */
    host_of(k->peer_addr, n->linked, sizeof n->linked);
    cl_node *t = k->target;
    if (t && t->hint_dialing == k) {
        t->hint_dialing = NULL;
        if (t == n && t->hint[0]) {
            cl__node_add_addr(c, n, t->hint);
            if (!n->cluster_port)
                n->cluster_port = t->hint_port;
        }
        t->hint[0] = 0;              /* used, or it led to another node: forgotten */
        t->hint_gap_ns = 0;
    }
    if (!n->member || memcmp(n->pk, k->ws.peer_pk, WIRE_PK_BYTES)) {
        /* proven by this handshake: a member from now on, also after a
         * restart (peers.json keeps the key) */
        pthread_mutex_lock(&c->mu);
        n->member = true;
        memcpy(n->pk, k->ws.peer_pk, WIRE_PK_BYTES);
        pthread_mutex_unlock(&c->mu);
        c->peers_dirty = true;
    }
    if (k->role == WIRE_LISTENER && !n->addrs.n_addrs) {
        char ip[sizeof k->peer_addr];
        memcpy(ip, k->peer_addr, sizeof ip);
        ip[strcspn(ip, ":")] = 0;
        cl__node_add_addr(c, n, ip);
    }
    rc_log(LOG_INFO, "cluster: %s node %.8s at %s (authenticated, protocol %d.%d)",
           k->role == WIRE_DIALER ? "linked to" : "accepted", n->id_hex, k->peer_addr,
           k->ws.peer_major, k->ws.peer_minor);
    send_state(c, k);
    cl__revoke_send(c, k);
    cl__rotate_linked(c, k);
    cl__update_membership(c, now);
    cl__swim_join(c, n->id);            /* a proven member: first contact for SWIM too */
    cl__link_want(c, n, now);           /* a new link lives at least link_idle_ms */
    cl__held_release(c, n, now);        /* what waited for it */
}

void cl__on_closed(struct cluster *c, cl_conn *k)
{
    uint64_t now = os_now_ns();
    if (k->node && k->node->conn == k) {
        k->node->conn = NULL;
        pthread_mutex_lock(&c->mu);
        k->node->has_link = false;
        pthread_mutex_unlock(&c->mu);
    }
    cl_node *t = k->target;
    if (t && t->dialing == k) {
        t->dialing = NULL;
        /* a refusal comes from whatever answered at that address: it puts
         * off a candidate with no other address to try, never a proven
         * member (a stranger on one of its addresses must not keep it from
         * being redialled) */
        if (k->refused && !t->member && n_dial_addrs(t) <= 1)
            t->next_dial_ns = now + 30000 * MS;
        /* a member that refuses the new key may have missed a rotation:
         * once more at once with the key before (rotate.c) */
        bool retry_old = k->auth_failed && !k->old_key && c->rot.has_old && t->member;
        t->dial_old_key = retry_old;
        if (retry_old)
            t->next_dial_ns = now;
    }
    if (t && t->hint_dialing == k) {
        /* an address from multicast DNS backs off on its own: a stranger's
         * record never delays the node's own addresses */
        t->hint_dialing = NULL;
        if (k->refused)
            t->hint_next_ns = now + 30000 * MS;
    }
    if (k->static_idx >= 0 && c->statics[k->static_idx].dialing == k) {
        c->statics[k->static_idx].dialing = NULL;
        if (k->refused)
            c->statics[k->static_idx].next_dial_ns = now + 30000 * MS;
    }
    cl__update_membership(c, now);
    cl__tick_soon(c);                  /* redials, and the reaping, at the usual pace */
}

/* Drops nodes[i] from the table; links and dials that named it forget it. */
static void node_drop(struct cluster *c, int i)
{
    cl_node *n = c->nodes[i];
    for (cl_conn *k = c->conns; k; k = k->next) {
        if (k->node == n)
            k->node = NULL;
        if (k->target == n)
            k->target = NULL;
    }
    bool member = n->member;          /* only members are in STATE and peers.json */
    pthread_mutex_lock(&c->mu);
    c->nodes[i] = c->nodes[--c->n_nodes];
    c->self_dirty |= member;
    pthread_mutex_unlock(&c->mu);
    cl_node_free(n);
    c->peers_dirty |= member;
}

/* A stranger can announce as many made-up nodes as it likes: at most
 * MAX_UNPROVEN of them are kept, the oldest making room.  Returns whether
 * one had to go (said in the log at most once a minute). */
static bool unproven_room(struct cluster *c)
{
    int n = 0, oldest = -1;
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *x = c->nodes[i];
        if (x->member || x->conn)
            continue;
        n++;
        if (oldest < 0 || x->down_since_ns < c->nodes[oldest]->down_since_ns)
            oldest = i;
    }
    if (n < MAX_UNPROVEN || oldest < 0)
        return false;
    uint64_t now = os_now_ns();
    if (!c->unproven_warn_ns || cl__since(now, c->unproven_warn_ns) > 60000 * MS) {
        c->unproven_warn_ns = now;
        rc_log(LOG_WARN, "cluster: multicast DNS announces more than %d nodes not met yet; "
               "keeping the %d newest (a flood of made-up nodes?)", MAX_UNPROVEN, MAX_UNPROVEN);
    }
    node_drop(c, oldest);
    return true;
}

/* The rules of docs/cluster-protocol.md §2 for what an answer may do. */
int cl__on_found(struct cluster *c, const uint8_t id[WIRE_ID_BYTES], const char *addr, int port,
                 char *why, size_t why_cap)
{
    if (!memcmp(id, self_node(c)->id, WIRE_ID_BYTES)) {
        snprintf(why, why_cap, "that is this node's own id");
        return -1;
    }
    if (port <= 0 || port > 65535 || !valid_ipv4(addr)) {
        snprintf(why, why_cap, "not an IPv4 address and port");
        return -1;
    }
    cl_node *n = cl__node_find(c, id);
    if (n && n->conn) {
        if (n->cluster_port == port && (!strcmp(n->linked, addr) || has_addr(n, addr)))
            return 1;
        snprintf(why, why_cap, "the node is linked (authenticated) at %s port %d, and an answer "
                 "never moves a linked node", n->linked[0] ? n->linked : "?", n->cluster_port);
        return -1;
    }
    if (n && n->member && n->cluster_port == port && has_addr(n, addr))
        return 1;
    if (!n) {
        bool crowded = unproven_room(c);
        if (!(n = cl__node_add(c, id))) {
            snprintf(why, why_cap, "the node table is full");
            return -1;
        }
        rc_log(crowded ? LOG_DEBUG : LOG_INFO, "cluster: discovered node %.8s at %s:%d (multicast "
               "DNS; unproven until it links)", n->id_hex, addr, port);
    }
    /* a member that is down, or a node not met yet: an address to try, on
     * the side; the node's known addresses and port stay as they are */
    if (!strcmp(n->hint, addr) && n->hint_port == port)
        return 1;
    if (n->hint_dialing)
        return 1;                    /* one at a time; the answer will come again */
    snprintf(n->hint, sizeof n->hint, "%s", addr);
    n->hint_port = port;
    n->hint_gap_ns = 0;
    n->hint_next_ns = 0;
    return 0;
}

static int json_port(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    json_int_t p = json_is_integer(v) ? json_integer_value(v) : 0;
    return p > 0 && p < 65536 ? (int)p : 0;
}

void cl__on_state(struct cluster *c, cl_conn *k, const uint8_t *data, size_t len)
{
    cl_node *n = k->node;
    if (!n || len > STATE_MAX)
        return;
    json_error_t err;
    json_t *st = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &err);
    const char *id = json_string_value(json_object_get(st, "id"));
    if (!json_is_object(st) || !id || strcmp(id, n->id_hex)) {
        rc_log(LOG_WARN, "cluster: node %.8s sent a malformed STATE; ignored", n->id_hex);
        json_decref(st);
        return;
    }
    const char *name = json_string_value(json_object_get(st, "name"));
    pthread_mutex_lock(&c->mu);
    json_decref(n->info);
    n->info = st;
    if (name)
        snprintf(n->name, sizeof n->name, "%s", name);
    int cp = json_port(st, "cluster_port"), hp = json_port(st, "http_port");
    if (cp && cp != n->cluster_port) {
        n->cluster_port = cp;
        c->peers_dirty = true;
    }
    n->http_port = hp;
    addr_list al = { .n_addrs = 0 };
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(st, "addresses"), i, a)
        if (al.n_addrs < CL_MAX_ADDRS && valid_ipv4(json_string_value(a)))
            snprintf(al.addrs[al.n_addrs++], CL_ADDR_LEN, "%s", json_string_value(a));
    if (al.n_addrs && memcmp(&al, &n->addrs, sizeof al)) {
        n->addrs = al;
        c->peers_dirty = true;
    }
    pthread_mutex_unlock(&c->mu);
    /* gossip: nodes the sender has a link to that we have not met (with
     * SWIM, SWIM spreads the membership) */
    json_t *p;
    if (c->swim)
        return;
    json_array_foreach(json_object_get(st, "peers"), i, p) {
        uint8_t pid[WIRE_ID_BYTES];
        const char *ps = json_string_value(json_object_get(p, "id"));
        const char *state = json_string_value(json_object_get(p, "state"));
        int port = json_port(p, "cluster_port");
        if (i >= 256 || !ps || wire_unhex(ps, pid, WIRE_ID_BYTES) || !state ||
            strcmp(state, "up") || !port)
            continue;
        cl_node *known = cl__node_find(c, pid);
        if (known && known->member)
            continue;               /* (one heard of by multicast DNS only is taken in) */
        size_t j;
        json_t *pa;
        json_array_foreach(json_object_get(p, "addresses"), j, pa) {
            /* a candidate to dial, as an address from multicast DNS is (paced,
             * bounded): it becomes a member only once a handshake with it
             * proves its id */
            char why[160];
            if (valid_ipv4(json_string_value(pa)))
                cl__on_found(c, pid, json_string_value(pa), port, why, sizeof why);
        }
    }
}

/* ---- the loop ---- */

void cl__schedule_reap(struct cluster *c)
{
    if (c->reap_ev)
        event_active(c->reap_ev, 0, 0);
}

static void reap(struct cluster *c, uint64_t now)
{
    for (cl_conn **pp = &c->conns; *pp;) {
        cl_conn *k = *pp;
        bool go = k->phase == PH_DEAD &&
                  (k->broken || !k->bev || cl__conn_pending(k) == 0 || cl__since(now, k->dead_ns) > 1000 * MS);
        if (go) {
            *pp = k->next;
            cl__conn_free(k);
        } else {
            pp = &k->next;
        }
    }
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    reap(arg, os_now_ns());
}

/* Dials the address multicast DNS gave for n, apart from its own dials:
 * a few such dials a second in all, and each hint less often while it fails. */
static void dial_hint(struct cluster *c, cl_node *n, uint64_t now)
{
    if (!n->hint[0] || n->conn || n->hint_dialing || now < n->hint_next_ns || (c->swim && n->up) ||
        !mdns_bucket_take(&c->hint_dials, now, HINT_DIALS_S, HINT_DIALS_MAX))
        return;
    cl_conn *k = cl__conn_dial(c, n->hint, n->hint_port, false);
    if (k) {
        k->target = n;
        n->hint_dialing = k;
    }
    n->hint_gap_ns = n->hint_gap_ns ? 2 * n->hint_gap_ns : 1000 * MS;
    if (n->hint_gap_ns > 60000 * MS)
        n->hint_gap_ns = 60000 * MS;
    n->hint_next_ns = now + n->hint_gap_ns;
}

static void dial_nodes(struct cluster *c, uint64_t now)
{
    if (c->self_removed)
        return;
    /* first contact needs one link: SWIM learns the others through it (a
     * joiner dialling every member it heard of would link to all of them) */
    bool lonely = c->swim && cl__swim_alone(c);
    for (int i = 1; i < c->n_nodes && lonely; i++)
        lonely = !(c->nodes[i]->conn && c->nodes[i]->conn->phase == PH_OPEN);
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        dial_hint(c, n, now);
        if (n->conn || n->dialing || !n_dial_addrs(n) || !n->cluster_port || now < n->next_dial_ns)
            continue;
        /* with SWIM: neighbours and links wanted now, or anyone remembered
         * while SWIM knows nobody alive (first contact) */
        if (c->swim && !cl__link_wanted(c, n, now) && !(lonely && n->member))
            continue;
        const char *a = dial_addr(n, n->dial_idx++ % n_dial_addrs(n));
        cl_conn *k = cl__conn_dial(c, a, n->cluster_port, n->dial_old_key && c->rot.has_old);
        if (k) {
            k->target = n;
            n->dialing = k;
        }
        /* every second while it may just be restarting, then every 5 s */
        n->next_dial_ns = now + (cl__since(now, n->down_since_ns) < 60000 * MS ? 1000 : 5000) * MS;
    }
    for (int i = 0; i < c->n_statics; i++) {
        cl_static *s = &c->statics[i];
        if (s->is_self || s->dialing || now < s->next_dial_ns)
            continue;
        s->next_dial_ns = now + 1000 * MS;
        cl_node *n = s->known ? cl__node_find(c, s->id) : NULL;
        if (n && (n->conn || n->dialing || (c->swim && n->up)))
            continue;
        cl_conn *k = cl__conn_dial(c, s->host, s->port, false);
        if (k) {
            k->static_idx = i;
            s->dialing = k;
        }
    }
}

/* The earliest time dial_nodes has a dial to make (UINT64_MAX: none). */
static uint64_t next_dial(struct cluster *c, uint64_t now)
{
    uint64_t t = UINT64_MAX;
    if (c->self_removed)
        return t;
    bool lonely = c->swim && cl__swim_alone(c);
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        if (n->hint[0] && !n->conn && !n->hint_dialing && !(c->swim && n->up) && n->hint_next_ns < t)
            t = n->hint_next_ns;
        if (n->conn || n->dialing || !n_dial_addrs(n) || !n->cluster_port ||
            (c->swim && !cl__link_wanted(c, n, now) && !(lonely && n->member)))
            continue;
        if (n->next_dial_ns < t)
            t = n->next_dial_ns;
    }
    for (int i = 0; i < c->n_statics; i++) {
        cl_static *s = &c->statics[i];
        cl_node *n = s->known ? cl__node_find(c, s->id) : NULL;
        if (s->is_self || s->dialing || (n && (n->conn || n->dialing || (c->swim && n->up))))
            continue;
        if (s->next_dial_ns < t)
            t = s->next_dial_ns;
    }
    return t;
}

static void forget_nodes(struct cluster *c, uint64_t now)
{
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        uint64_t limit = n->member ? (uint64_t)c->cfg.forget_after_ms * MS : 60000 * MS;
        if (n->up || n->conn || n->dialing || n->hint_dialing ||
            cl__since(now, n->down_since_ns) < limit)
            continue;
        rc_log(n->member ? LOG_INFO : LOG_DEBUG, "cluster: forgetting node %.8s (%s), down for %d s",
               n->id_hex, log_clean(n->name), (int)(limit / (1000 * MS)));
        node_drop(c, i);
        i--;
    }
}

static void refusal_window(struct cluster *c, uint64_t now);

/* When the tick next has work: TICK_MS from now while anything is under
 * way, else the earliest deadline of the links, dials and timers, at most
 * IDLE_TICK_MS away (what has no deadline of its own - forgetting nodes,
 * closing idle links, discovery's second-scale timers - keeps that pace). */
static uint64_t next_tick(struct cluster *c, uint64_t now)
{
    pthread_mutex_lock(&c->mu);
    bool busy = c->self_dirty || c->scan_soon || c->rot.asked || c->n_revoked_done != c->n_revoked;
    pthread_mutex_unlock(&c->mu);
    if (busy || c->peers_dirty || c->held)
        return now;
    uint64_t t = now + IDLE_TICK_MS * MS, d;
    for (cl_conn *k = c->conns; k; k = k->next)
        if ((d = cl__conn_next(k, now)) < t)
            t = d;
    if ((d = next_dial(c, now)) < t)
        t = d;
    if (c->next_mem_ns < t) t = c->next_mem_ns;
    if (c->next_scan_ns < t) t = c->next_scan_ns;
    if (c->next_state_ns < t) t = c->next_state_ns;
    if (c->rot.leading && c->rot.deadline_ns < t) t = c->rot.deadline_ns;
    if (c->rot.has_old && c->rot.old_until_ns < t) t = c->rot.old_until_ns;
    return t;
}

/* (Re)arms the tick for `at`, never sooner than TICK_MS from now (the pace
 * of old: a deadline already past does not spin the thread). */
static void arm_tick(struct cluster *c, uint64_t at, uint64_t now)
{
    uint64_t gap = at > now ? at - now : 0;
    if (gap < TICK_MS * MS)
        gap = TICK_MS * MS;
    if (gap > IDLE_TICK_MS * MS)
        gap = IDLE_TICK_MS * MS;
    c->tick_at_ns = now + gap;
    struct timeval tv = { (time_t)(gap / 1000000000ull), (suseconds_t)(gap % 1000000000ull / 1000) };
    event_add(c->tick_ev, &tv);
}

void cl__tick_soon(struct cluster *c)
{
    uint64_t now = os_now_ns();
    if (c->tick_ev && !c->stopping && c->tick_at_ns > now + TICK_MS * MS)
        arm_tick(c, now, now);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct cluster *c = arg;
    uint64_t now = os_now_ns();
    for (cl_conn *k = c->conns; k; k = k->next)
        cl__conn_tick(k, now);
    cl__update_membership(c, now);
    forget_nodes(c, now);
    cl__revoke_work(c);
    cl__rotate_work(c, now);
    cl__links_tick(c, now);
    cl__measure_tick(c, now);
    dial_nodes(c, now);
    if (c->disc)
        discovery_tick(c->disc, now);
    if (now >= c->next_mem_ns) {
        /* STATE goes out at once only when the reading moved enough to
         * matter (cl__hw_mem); else with the next one */
        pthread_mutex_lock(&c->mu);
        if (cl__hw_mem(&c->hw))
            c->self_dirty = true;
        pthread_mutex_unlock(&c->mu);
        c->next_mem_ns = now + 2000 * MS;
    }
    pthread_mutex_lock(&c->mu);
    bool scan_soon = c->scan_soon;
    c->scan_soon = false;
    pthread_mutex_unlock(&c->mu);
    if (now >= c->next_scan_ns || scan_soon) {
        json_t *m = exports_scan(c->exports);
        pthread_mutex_lock(&c->mu);
        if (m && !json_equal(m, c->models)) {
            json_decref(c->models);
            c->models = json_incref(m);
            c->self_dirty = true;
        }
        pthread_mutex_unlock(&c->mu);
        json_decref(m);
        c->next_scan_ns = now + 10000 * MS;
    }
    pthread_mutex_lock(&c->mu);
    bool dirty = c->self_dirty;
    pthread_mutex_unlock(&c->mu);
    if (dirty || now >= c->next_state_ns) {
        send_state(c, NULL);
        c->next_state_ns = now + STATE_EVERY_MS * MS;
    }
    if (c->peers_dirty) {
        c->peers_dirty = false;
        cl__peers_save(c);
    }
    refusal_window(c, now);
    reap(c, now);
    arm_tick(c, next_tick(c, now), now);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    cl_out *q = c->out_head;
    c->out_head = c->out_tail = NULL;
    bool dirty = c->self_dirty;
    pthread_mutex_unlock(&c->mu);
    uint64_t now = os_now_ns();
    while (q) {
        cl_out *next = q->next;
        cl_node *n = cl__node_find(c, q->to);
        if (n && c->swim && n->up && !c->stopping && !(n->conn && n->conn->phase == PH_OPEN)) {
            /* with SWIM: a link opened on demand; the message waits for it */
            cl__link_want(c, n, now);
            cl__hold(c, q);
            q = next;
            continue;
        }
        if (n && n->conn && n->conn->phase == PH_OPEN) {
            cl__link_want(c, n, now);
            cl__conn_send(n->conn, q->type, q->data, q->len, false);
            /* the last message for this node in the batch: send now */
            bool more = false;
            for (cl_out *r = next; r && !more; r = r->next)
                more = !memcmp(r->to, q->to, sizeof q->to);
            if (!more)
                cl__conn_flush(n->conn);
        } else {
            rc_log(LOG_DEBUG, "cluster: dropping a message for a node without a link");
        }
        rc_free(q);
        q = next;
    }
    if (dirty)
        send_state(c, NULL);
    cl__revoke_work(c);
    cl__rotate_work(c, os_now_ns());
    cl__tick_soon(c);
}

void cl__wake(struct cluster *c)
{
    if (c->wake_ev)
        event_active(c->wake_ev, 0, 0);
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    struct cluster *c = arg;
    c->stopping = true;
    evconnlistener_disable(c->listener);
    event_del(c->tick_ev);
    discovery_goodbye(c->disc);
    cl__swim_stop(c);
    for (cl_conn *k = c->conns; k; k = k->next)
        cl__conn_close(k, "node shutting down");
    if (c->peers_dirty)
        cl__peers_save(c);
    /* a moment for the goodbyes to leave */
    struct timeval tv = { 0, 200000 };
    event_base_loopexit(c->base, &tv);
}

/* Whether addr is an address of a proven member: such connections get a
 * larger share of the handshake slots than strangers. */
static bool member_addr(struct cluster *c, struct in_addr addr)
{
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, a, sizeof a);
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        for (int j = 0; n->member && j < n->addrs.n_addrs; j++)
            if (!strcmp(n->addrs.addrs[j], a))
                return true;
    }
    return false;
}

/* A handshake slot for a connection from sa?  At most MAX_HANDSHAKES
 * accepted connections in handshake, of which strangers (addresses of no
 * member) hold at most STRANGER_HANDSHAKES and one address at most
 * PER_ADDR_HANDSHAKES (a member's address MEMBER_ADDR_HANDSHAKES: its
 * shards open several data channels at once). */
static bool handshake_slot(struct cluster *c, const struct sockaddr *sa)
{
    struct in_addr from = { 0 };
    if (sa->sa_family == AF_INET)
        from = ((const struct sockaddr_in *)sa)->sin_addr;
    int pending = 0, strangers = 0, same = 0;
    for (cl_conn *k = c->conns; k; k = k->next) {
        if (k->role != WIRE_LISTENER || (k->phase != PH_HELLO && k->phase != PH_AUTH))
            continue;
        pending++;
        strangers += !member_addr(c, k->peer_in);
        same += k->peer_in.s_addr == from.s_addr;
    }
    bool member = member_addr(c, from);
    return pending < MAX_HANDSHAKES && (member || strangers < STRANGER_HANDSHAKES) &&
           same < (member ? MEMBER_ADDR_HANDSHAKES : PER_ADDR_HANDSHAKES);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    struct cluster *c = arg;
    if (c->stopping) {
        evutil_closesocket(fd);
        return;
    }
    if (!handshake_slot(c, sa) || !cl__conn_accept(c, fd, sa)) {
        char a[INET_ADDRSTRLEN] = "?";
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, a, sizeof a);
        cl__count_refusal(c, a, false);
        evutil_closesocket(fd);
    }
}

/* ---- refusals, counted and logged without flooding ---- */

#define REFUSAL_WINDOW_NS (10000 * MS)
#define REFUSAL_LINES     10             /* handshake refusal lines per window */

static void refusal_window(struct cluster *c, uint64_t now)
{
    if (c->refusals.since_ns && cl__since(now, c->refusals.since_ns) < REFUSAL_WINDOW_NS)
        return;
    if (c->refusals.over_limit || c->refusals.timed_out || c->refusals.unlogged) {
        char what[3][160];
        int n = 0;
        if (c->refusals.over_limit)
            snprintf(what[n++], sizeof what[0], "%d connections closed at once (over the "
                     "handshake limits: %d per address, %d for strangers, %d in all)",
                     c->refusals.over_limit, PER_ADDR_HANDSHAKES, STRANGER_HANDSHAKES,
                     MAX_HANDSHAKES);
        if (c->refusals.timed_out)
            snprintf(what[n++], sizeof what[0], "%d that sent no HELLO within 1 s",
                     c->refusals.timed_out);
        if (c->refusals.unlogged)
            snprintf(what[n++], sizeof what[0], "%d more refused handshakes not logged one "
                     "by one", c->refusals.unlogged);
        rc_log(LOG_WARN, "cluster: in the last %d s: %s%s%s%s%s; the last from %s",
               (int)(cl__since(now, c->refusals.since_ns) / (1000 * MS)), what[0],
               n > 1 ? ", " : "", n > 1 ? what[1] : "", n > 2 ? ", " : "", n > 2 ? what[2] : "",
               c->refusals.last_from);
    }
    c->refusals.over_limit = c->refusals.timed_out = c->refusals.unlogged = 0;
    c->refusals.logged = 0;
    c->refusals.since_ns = now;
}

void cl__count_refusal(struct cluster *c, const char *from, bool timed_out)
{
    uint64_t now = os_now_ns();
    refusal_window(c, now);
    /* the first of a window is told at once, the rest in the summary */
    if (!c->refusals.over_limit && !c->refusals.timed_out)
        rc_log(LOG_WARN, "cluster: %s %s; further ones are counted and summed up every %d s",
               timed_out ? "dropped a connection that sent no HELLO within 1 s from"
                         : "too many connections in handshake: closed one from", from,
               (int)(REFUSAL_WINDOW_NS / (1000 * MS)));
    if (timed_out)
        c->refusals.timed_out++;
    else
        c->refusals.over_limit++;
    snprintf(c->refusals.last_from, sizeof c->refusals.last_from, "%.*s",
             (int)strcspn(from, ":"), from);
}

bool cl__refusal_log_ok(struct cluster *c, const char *from)
{
    refusal_window(c, os_now_ns());
    if (c->refusals.logged < REFUSAL_LINES) {
        c->refusals.logged++;
        return true;
    }
    c->refusals.unlogged++;
    snprintf(c->refusals.last_from, sizeof c->refusals.last_from, "%.*s",
             (int)strcspn(from, ":"), from);
    return false;
}

static void *thread_main(void *arg)
{
    struct cluster *c = arg;
    event_active(c->tick_ev, 0, 0);
    event_base_dispatch(c->base);
    return NULL;
}

static void *bench_main(void *arg)
{
    struct cluster *c = arg;
    cl_hw h;
    pthread_mutex_lock(&c->mu);
    h = c->hw;
    pthread_mutex_unlock(&c->mu);
    cl__bench_run(c->state_dir, &h);
    pthread_mutex_lock(&c->mu);
    c->hw.mem_bw = h.mem_bw;
    c->hw.gflops = h.gflops;
    c->self_dirty = true;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- public ---- */

static bool is_loopback(const char *h)
{
    return !strncmp(h, "127.", 4) || !strcmp(h, "localhost") || !strcmp(h, "::1");
}

static int add_static(struct cluster *c, const char *spec)
{
    char host[CL_ADDR_LEN];
    int port = c->cfg.port > 0 ? c->cfg.port : CLUSTER_DEFAULT_PORT;
    const char *colon = strrchr(spec, ':');
    size_t hl = colon ? (size_t)(colon - spec) : strlen(spec);
    if (hl == 0 || hl >= sizeof host)
        return rc_fail(RC_EINVAL, "bad peer '%s' (want host:port)", spec);
    memcpy(host, spec, hl);
    host[hl] = 0;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (*end || p <= 0 || p > 65535)
            return rc_fail(RC_EINVAL, "bad port in peer '%s'", spec);
        port = (int)p;
    }
    cl_static *ns = rc_realloc(c->statics, (size_t)(c->n_statics + 1) * sizeof *ns);
    if (!ns)
        return rc_fail(RC_ENOMEM, "peers");
    c->statics = ns;
    memset(&ns[c->n_statics], 0, sizeof *ns);
    snprintf(ns[c->n_statics].host, CL_ADDR_LEN, "%s", host);
    ns[c->n_statics].port = port;
    c->n_statics++;
    return 0;
}

int cluster_new(const cluster_config *cfg, struct cluster **out, bool *created)
{
    *out = NULL;
    if (created)
        *created = false;
    if (sodium_init() < 0)
        return rc_fail(RC_EIO, "libsodium failed to initialise");
    struct cluster *c = rc_calloc(1, sizeof *c);
    if (!c)
        return rc_fail(RC_ENOMEM, "cluster");
    c->lock_fd = -1;
    int r = 0;
    c->cfg = *cfg;
    cluster_config def;
    cluster_config_default(&def);
    if (c->cfg.heartbeat_ms <= 0) c->cfg.heartbeat_ms = def.heartbeat_ms;
    if (c->cfg.down_after_ms <= 0) c->cfg.down_after_ms = def.down_after_ms;
    if (c->cfg.down_after_ms < 2 * c->cfg.heartbeat_ms) c->cfg.down_after_ms = 2 * c->cfg.heartbeat_ms;
    if (c->cfg.probe_ms < 0) c->cfg.probe_ms = 0;
    if (c->cfg.forget_after_ms <= 0) c->cfg.forget_after_ms = def.forget_after_ms;
    if (c->cfg.key_confirm_ms <= 0) c->cfg.key_confirm_ms = def.key_confirm_ms;
    if (c->cfg.swim_neighbours <= 0) c->cfg.swim_neighbours = def.swim_neighbours;
    if (c->cfg.link_idle_ms <= 0) c->cfg.link_idle_ms = def.link_idle_ms;
    if (c->cfg.measure_max_age_ms <= 0) c->cfg.measure_max_age_ms = def.measure_max_age_ms;
    c->major = cfg->proto_major > 0 ? cfg->proto_major : WIRE_PROTO_MAJOR;
    c->minor = cfg->proto_major > 0 ? cfg->proto_minor : WIRE_PROTO_MINOR;
    c->t_start_ns = os_now_ns();
    if (pthread_mutex_init(&c->mu, NULL)) {
        rc_free(c);
        return rc_fail(RC_EIO, "mutex");
    }
    c->mu_init = true;
    if (cfg->name && *cfg->name)
        snprintf(c->name, sizeof c->name, "%s", cfg->name);
    else if (gethostname(c->name, sizeof c->name - 1) != 0 || !c->name[0])
        snprintf(c->name, sizeof c->name, "racimo");
    snprintf(c->listen_host, sizeof c->listen_host, "%s",
             cfg->listen_host && *cfg->listen_host ? cfg->listen_host : "0.0.0.0");
    if (cfg->advertise_host && *cfg->advertise_host) {
        if (!valid_ipv4(cfg->advertise_host)) {
            r = rc_fail(RC_EINVAL, "--advertise wants an IPv4 address, not '%s'", cfg->advertise_host);
            goto fail;
        }
        snprintf(c->advertise, sizeof c->advertise, "%s", cfg->advertise_host);
    } else if (strcmp(c->listen_host, "0.0.0.0") && valid_ipv4(c->listen_host)) {
        snprintf(c->advertise, sizeof c->advertise, "%s", c->listen_host);
    }
    if ((r = cl__state_init(c, created)))
        goto fail;
    const char *md = cfg->models_dir ? cfg->models_dir : getenv("RACIMO_MODELS_DIR");
    if (md && *md)
        snprintf(c->models_dir, sizeof c->models_dir, "%s", md);
    else
        snprintf(c->models_dir, sizeof c->models_dir, "%s/models", c->state_dir);
    const char *ro = cfg->ro_dirs ? cfg->ro_dirs : getenv("RACIMO_MODELS_READ_ONLY_DIRS");
    if (ro && *ro && !(c->ro_dirs = rc_strdup(ro))) {
        r = rc_fail(RC_ENOMEM, "cluster");
        goto fail;
    }
    for (int i = 0; i < cfg->n_peers; i++)
        if ((r = add_static(c, cfg->peers[i])))
            goto fail;
    if (c->hint[0] && (r = add_static(c, c->hint)))
        goto fail;
    cl__revoked_load(c);
    cl__peers_load(c);
    cl__hw_probe(&c->hw);
    c->hw.mem_max = cfg->max_memory;
    if (cfg->bench)
        cl__bench_cached(c->state_dir, &c->hw);
    if ((r = exports_new(c->models_dir, c->ro_dirs, cfg->exports, &c->exports)))
        goto fail;
    c->models = exports_scan(c->exports);
    c->serving = json_array();
    c->serving_free = json_object();
    c->serving_slots = json_object();
    c->published = json_object();
    c->published_stable = json_object();
    if (!(c->plain = rc_malloc(WIRE_FRAME_MAX)) || !c->models || !c->serving || !c->serving_free ||
        !c->serving_slots || !c->published || !c->published_stable) {
        r = rc_fail(RC_ENOMEM, "cluster");
        goto fail;
    }
    /* the strings were copied; none is kept */
    c->cfg.state_dir = c->cfg.join_token = c->cfg.listen_host = c->cfg.name = NULL;
    c->cfg.advertise_host = c->cfg.models_dir = c->cfg.ro_dirs = c->cfg.exports = NULL;
    c->cfg.peers = NULL;
    c->cfg.n_peers = 0;
    *out = c;
    return 0;
fail:
    cluster_free(c);
    return r;
}

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static void enable_threads(void) { evthread_use_pthreads(); }

static struct evconnlistener *listen_on(struct cluster *c, int port)
{
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, strcmp(c->listen_host, "localhost") ? c->listen_host : "127.0.0.1",
                  &sin.sin_addr) != 1)
        return NULL;
    return evconnlistener_new_bind(c->base, on_accept, c,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                   64, (struct sockaddr *)&sin, sizeof sin);
}

int cluster_start(struct cluster *c)
{
    if (c->started)
        return rc_fail(RC_ESTATE, "cluster already started");
    pthread_once(&threads_once, enable_threads);
    signal(SIGPIPE, SIG_IGN);
    int r = 0;
    if (!(c->base = rc_event_base_new()))
        return rc_fail(RC_ENOMEM, "event base");
    struct in_addr probe;
    if (strcmp(c->listen_host, "localhost") && inet_pton(AF_INET, c->listen_host, &probe) != 1)
        return rc_fail(RC_EINVAL, "cluster listen address '%s' is not an IPv4 address",
                       c->listen_host);
    int port = c->cfg.port;
    c->listener = listen_on(c, port);
    if (!c->listener && !c->cfg.port_given && port == CLUSTER_DEFAULT_PORT) {
        c->listener = listen_on(c, 0);
        if (c->listener)
            rc_log(LOG_WARN, "cluster: port %d is in use (another node on this machine?); "
                             "using a free port instead", port);
    }
    if (!c->listener)
        return rc_fail(RC_EIO, "cluster: cannot listen on %s:%d: %s", c->listen_host, port,
                       strerror(errno));
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    if (getsockname(evconnlistener_get_fd(c->listener), (struct sockaddr *)&bound, &bl) == 0)
        c->port = ntohs(bound.sin_port);
    pthread_mutex_lock(&c->mu);
    self_addrs(c, &self_node(c)->addrs);
    self_node(c)->cluster_port = c->port;
    self_node(c)->http_port = c->cfg.http_port;
    pthread_mutex_unlock(&c->mu);
    if (!(c->tick_ev = event_new(c->base, -1, 0, on_tick, c)) ||
        !(c->stop_ev = event_new(c->base, -1, 0, on_stop, c)) ||
        !(c->wake_ev = event_new(c->base, -1, 0, on_wake, c)) ||
        !(c->reap_ev = event_new(c->base, -1, 0, on_reap, c)))
        return rc_fail(RC_ENOMEM, "cluster events");
    arm_tick(c, 0, os_now_ns());
    if (!c->cfg.no_discovery && !is_loopback(c->listen_host) &&
        !(c->advertise[0] && is_loopback(c->advertise))) {
        if (discovery_new(c, &c->disc))
            rc_log(LOG_WARN, "cluster: discovery is off: %s (use --peer)", rc_errmsg());
    }
    if (c->cfg.swim && cl__swim_start(c) != 0)
        rc_log(LOG_WARN, "cluster: %s; membership stays on the links alone", rc_errmsg());
    if (c->cfg.bench && c->hw.mem_bw <= 0) {
        if (pthread_create(&c->bench_thread, NULL, bench_main, c) == 0)
            c->bench_started = true;
    }
    if ((r = pthread_create(&c->thread, NULL, thread_main, c)) != 0)
        return rc_fail(RC_EIO, "cluster thread: %s", strerror(r));
    c->started = true;
    rc_log(LOG_INFO, "cluster: node %.8s '%s' on %s:%d (cluster %s, protocol %d.%d%s)",
           self_node(c)->id_hex, c->name, c->listen_host, c->port, c->fp, c->major, c->minor,
           c->disc ? ", discovery on" : ", discovery off");
    return 0;
}

/* A node's serving_free and serving_slots as the view shows them: whole
 * numbers, the slots at most CLUSTER_SLOTS_MAX (as many for a node of 1.3,
 * which does not say) and the free ones at most the slots, so that a member
 * claiming more draws no more forwarded requests (api/forward.c). */
static void slots_capped(const json_t *info, json_t *o)
{
    json_t *fr = json_object(), *sl = json_object(), *v;
    const char *name;
    json_object_foreach(json_object_get(info, "serving_free"), name, v) {
        json_t *s = json_object_get(json_object_get(info, "serving_slots"), name);
        json_int_t slots = json_is_integer(s) ? json_integer_value(s) : CLUSTER_SLOTS_MAX;
        json_int_t f = json_is_integer(v) ? json_integer_value(v) : 0;
        slots = slots < 0 ? 0 : slots > CLUSTER_SLOTS_MAX ? CLUSTER_SLOTS_MAX : slots;
        json_object_set_new(fr, name, json_integer(f < 0 ? 0 : f > slots ? slots : f));
        json_object_set_new(sl, name, json_integer(slots));
    }
    json_object_set_new(o, "serving_free", fr);
    json_object_set_new(o, "serving_slots", sl);
}

/* With SWIM, a node without a link now: what it serves and its free slots
 * come from its digest (fresher than a STATE kept from a closed link), and
 * its hardware too when no STATE ever came; "from_digest" says so. */
static void digest_fill(const cl_node *n, json_t *o)
{
    const node_digest *d = &n->digest;
    json_t *sv = json_array(), *fr = json_object(), *sl = json_object();
    for (int i = 0; sv && fr && sl && i < d->n_models; i++) {
        const node_digest_model *m = &d->models[i];
        json_array_append_new(sv, json_string(m->name));
        json_object_set_new(fr, m->name, json_integer(m->free > m->slots ? m->slots : m->free));
        json_object_set_new(sl, m->name, json_integer(m->slots > CLUSTER_SLOTS_MAX
                                                      ? CLUSTER_SLOTS_MAX : m->slots));
    }
    json_object_set_new(o, "serving", sv);
    json_object_set_new(o, "serving_free", fr);
    json_object_set_new(o, "serving_slots", sl);
    if (json_is_null(json_object_get(o, "hardware")))
        json_object_set_new(o, "hardware", json_pack("{s:i, s:I, s:I}", "cores", (int)d->cores,
                                                     "mem_total", (json_int_t)d->mem_total_mib << 20,
                                                     "mem_free", (json_int_t)d->mem_free_mib << 20));
    json_object_set_new(o, "from_digest", json_true());
}

json_t *cluster_snapshot(struct cluster *c)
{
    uint64_t now = os_now_ns();
    pthread_mutex_lock(&c->mu);
    json_t *nodes = json_array(), *links = json_array();
    const char *leader = NULL;
    int n_up = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        if (!n->member)
            continue;
        bool up = n->is_self || n->up;
        json_t *info = n->is_self ? cl__self_state(c) : json_incref(n->info);
        json_t *o = json_pack("{s:s, s:s, s:o, s:i, s:i, s:s, s:b}", "id", n->id_hex, "name",
                              n->name, "addresses", addr_json(&n->addrs), "cluster_port",
                              n->cluster_port, "http_port", n->http_port, "state",
                              up ? "up" : "down", "self", n->is_self);
        if (!o) {
            json_decref(info);
            continue;
        }
        const char *copy[] = { "version", "protocol", "hardware", "power", "models", "serving",
                               "instances" };
        for (size_t j = 0; j < sizeof copy / sizeof copy[0]; j++) {
            json_t *v = json_object_get(info, copy[j]);
            json_object_set_new(o, copy[j], v ? json_deep_copy(v)
                                              : j >= 4 ? json_array() : json_null());
        }
        slots_capped(info, o);
        if (c->swim && !n->is_self && n->has_digest && !n->has_link)
            digest_fill(n, o);
        json_object_set_new(o, "down_for_ms", up ? json_null()
                            : json_integer((json_int_t)((cl__since(now, n->down_since_ns)) / MS)));
        json_array_append_new(nodes, o);
        if (up) {
            n_up++;
            /* a member: its id proven, so nobody leads under another's id */
            if (!leader || strcmp(n->id_hex, leader) < 0)
                leader = n->id_hex;
            /* this node's measures of its links, and the others' as they sent
             * them (with SWIM: of the nodes linked now, whose STATE is fresh) */
            size_t j;
            json_t *l;
            json_t *nl = n->is_self || !c->swim || n->has_link ? json_object_get(info, "links") : NULL;
            json_array_foreach(nl, j, l) {
                const char *to = json_string_value(json_object_get(l, "to"));
                uint8_t tid[WIRE_ID_BYTES];
                cl_node *t = to && !wire_unhex(to, tid, WIRE_ID_BYTES) ? cl__node_find(c, tid) : NULL;
                if (!t || !t->member || !(t->is_self || t->up))
                    continue;
                json_t *rtt = json_object_get(l, "rtt_ms"), *bw = json_object_get(l, "bandwidth_mbps");
                json_t *age = json_object_get(l, "age_ms"), *lk = json_object_get(l, "linked");
                json_array_append_new(links, json_pack("{s:s, s:s, s:O, s:O, s:O, s:O}", "from",
                                                       n->id_hex, "to", to, "rtt_ms",
                                                       rtt ? rtt : json_null(), "bandwidth_mbps",
                                                       bw ? bw : json_null(), "age_ms",
                                                       json_is_integer(age) ? age : json_null(),
                                                       "linked", json_is_boolean(lk) ? lk : json_true()));
            }
        }
        json_decref(info);
    }
    char proto[16];
    snprintf(proto, sizeof proto, "%d.%d", c->major, c->minor);
    int n_members = (int)json_array_size(nodes);
    json_t *out = json_pack("{s:s, s:s, s:b, s:i, s:i, s:s, s:s, s:o, s:o}", "self",
                            self_node(c)->id_hex, "leader", leader ? leader : self_node(c)->id_hex,
                            "quorum", 2 * n_up > n_members, "members", n_members, "members_up",
                            n_up, "protocol", proto, "fingerprint", c->fp, "nodes", nodes,
                            "links", links);
    if (out) {
        json_object_set_new(out, "removed", json_boolean(c->self_removed));
        json_object_set_new(out, "revoked", cl__revoked_json(c));
        json_object_set_new(out, "key_rotation", cl__rotation_json(c));
        if (c->swim)
            json_object_set_new(out, "swim", json_pack(
                "{s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "alive", (json_int_t)c->swim_counts[0],
                "suspect", (json_int_t)c->swim_counts[1], "dead", (json_int_t)c->swim_counts[2],
                "left", (json_int_t)c->swim_counts[3], "incarnation",
                (json_int_t)c->swim_incarnation, "refused", (json_int_t)c->swim_bad,
                "serving", c->swim_serving ? json_deep_copy(c->swim_serving) : json_object()));
        json_t *sw = json_object_get(out, "swim");
        if (sw) {
            /* how often a member was seen suspect or dead since this node
             * started: flapping shows here even between two polls */
            json_object_set_new(sw, "suspicions", json_integer((json_int_t)c->swim_suspicions));
            json_object_set_new(sw, "deaths", json_integer((json_int_t)c->swim_deaths));
        }
    }
    pthread_mutex_unlock(&c->mu);
    return out;
}

bool cluster_has_quorum(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    int up = 0, members = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        members += c->nodes[i]->member;
        up += c->nodes[i]->member && (c->nodes[i]->is_self || c->nodes[i]->up);
    }
    bool q = 2 * up > members;
    pthread_mutex_unlock(&c->mu);
    return q;
}

void cluster_node_label(struct cluster *c, const char *id, char *out, size_t cap)
{
    char name[CL_NAME_LEN] = "";
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_nodes; i++)
        if (!strcmp(c->nodes[i]->id_hex, id)) {
            /* a peer chose it: only the characters a name needs reach a log */
            size_t k = 0;
            for (const char *p = c->nodes[i]->name; *p && k + 1 < sizeof name; p++)
                if (isalnum((unsigned char)*p) || strchr("._-", *p))
                    name[k++] = *p;
            name[k] = 0;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (name[0])
        snprintf(out, cap, "%.8s (%s)", id, name);
    else
        snprintf(out, cap, "%.8s", id);
}

uint64_t cluster_came_up(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->n_came_up;
    pthread_mutex_unlock(&c->mu);
    return n;
}

const char *cluster_join_token(const struct cluster *c) { return c->token; }
const char *cluster_self_id(const struct cluster *c) { return c->nodes[0]->id_hex; }
int cluster_port(const struct cluster *c) { return c->port; }
int cluster_down_after_ms(const struct cluster *c) { return c->cfg.down_after_ms; }

void cluster_set_http_port(struct cluster *c, int port)
{
    if (!c->started && port >= 0 && port < 65536)
        c->cfg.http_port = port;
}

void cluster_set_serving(struct cluster *c, const char *const *names, const int *free_slots,
                         const int *slots, int n)
{
    json_t *arr = json_array(), *fr = json_object(), *sl = json_object();
    const int fake = c->cfg.test_fake_slots;
    for (int i = 0; arr && fr && sl && i < n; i++) {
        json_array_append_new(arr, json_string(names[i]));
        if (free_slots)
            json_object_set_new(fr, names[i], json_integer(fake > 0 ? fake : free_slots[i] > 0
                                                                    ? free_slots[i] : 0));
        if (slots)
            json_object_set_new(sl, names[i], json_integer(fake > 0 ? fake : slots[i] > 0
                                                                    ? slots[i] : 0));
    }
    if (!arr || !fr || !sl) {
        json_decref(arr);
        json_decref(fr);
        json_decref(sl);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (json_equal(arr, c->serving) && json_equal(fr, c->serving_free) &&
        json_equal(sl, c->serving_slots)) {
        pthread_mutex_unlock(&c->mu);
        json_decref(arr);
        json_decref(fr);
        json_decref(sl);
        return;
    }
    json_decref(c->serving);
    json_decref(c->serving_free);
    json_decref(c->serving_slots);
    c->serving = arr;
    c->serving_free = fr;
    c->serving_slots = sl;
    c->self_dirty = true;
    pthread_mutex_unlock(&c->mu);
    if (c->wake_ev)
        event_active(c->wake_ev, 0, 0);
}

void cluster_set_published(struct cluster *c, const char *key, const json_t *value,
                           const json_t *stable)
{
    json_t *v = value ? json_deep_copy(value) : NULL;
    json_t *st = json_deep_copy(stable ? stable : value);
    pthread_mutex_lock(&c->mu);
    bool changed = !json_equal(json_object_get(c->published_stable, key), st) ||
                   (json_object_get(c->published, key) == NULL) != (v == NULL);
    if (v)
        json_object_set_new(c->published, key, v);
    else
        json_object_del(c->published, key);
    if (st)
        json_object_set_new(c->published_stable, key, st);
    else
        json_object_del(c->published_stable, key);
    if (changed)
        c->self_dirty = true;
    pthread_mutex_unlock(&c->mu);
    if (changed && c->wake_ev)
        event_active(c->wake_ev, 0, 0);
}

/* NAME.gguf in dir, or a split set NAME-00001-of-0000N.gguf ... there. */
static int model_in_dir(const char *dir, const char *name, char *out, size_t cap)
{
    struct stat st;
    int n = snprintf(out, cap, "%s/%s.gguf", dir, name);
    return (n > 0 && (size_t)n < cap && !stat(out, &st) && S_ISREG(st.st_mode)) ||
           gguf_split_find(dir, name, out, cap);
}

const char *cluster_state_path(const struct cluster *c)
{
    return c->state_dir;
}

struct exports *cluster_exports(const struct cluster *c)
{
    return c->exports;
}

void cluster_rescan_models(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->scan_soon = true;
    pthread_mutex_unlock(&c->mu);
    if (c->wake_ev)
        event_active(c->wake_ev, 0, 0);
}

const char *cluster_models_dir(const struct cluster *c)
{
    return c->models_dir;
}

int cluster_model_path(const struct cluster *c, const char *name, char *out, size_t cap)
{
    if (!name || !*name || strchr(name, '/') || strstr(name, "..") || strlen(name) > 200)
        return rc_fail(RC_EINVAL, "\"%s\" is not a model name", name ? name : "");
    if (c->models_dir[0] && model_in_dir(c->models_dir, name, out, cap))
        return 0;
    for (const char *p = c->ro_dirs; p && *p;) {
        size_t n = strcspn(p, ":");
        char dir[1024];
        if (n && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = 0;
            if (model_in_dir(dir, name, out, cap))
                return 0;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return rc_fail(RC_ENOTFOUND, "model %s is not on this node (looked in %s%s%s)", name,
                   c->models_dir, c->ro_dirs ? " and " : "", c->ro_dirs ? c->ro_dirs : "");
}

int cluster_add_handler(struct cluster *c, int type_lo, int type_hi, cluster_msg_fn fn, void *ud)
{
    if (type_lo < 0x40 || type_hi > 0x7f || type_lo > type_hi || !fn)
        return rc_fail(RC_EINVAL, "cluster: bad handler range 0x%02x-0x%02x", type_lo, type_hi);
    for (int i = 0; i < c->n_handlers; i++)
        if (type_lo <= c->handlers[i].hi && c->handlers[i].lo <= type_hi)
            return rc_fail(RC_EINVAL, "cluster: handler range 0x%02x-0x%02x is taken", type_lo,
                           type_hi);
    if (c->n_handlers == CLUSTER_MAX_HANDLERS)
        return rc_fail(RC_ELIMIT, "cluster: too many message handlers");
    c->handlers[c->n_handlers].lo = type_lo;
    c->handlers[c->n_handlers].hi = type_hi;
    c->handlers[c->n_handlers].fn = fn;
    c->handlers[c->n_handlers].ud = ud;
    c->n_handlers++;
    return 0;
}

int cluster_add_down_handler(struct cluster *c, cluster_down_fn fn, void *ud)
{
    if (c->n_on_down == CLUSTER_MAX_HANDLERS)
        return rc_fail(RC_ELIMIT, "cluster: too many node-down handlers");
    c->on_down[c->n_on_down].fn = fn;
    c->on_down[c->n_on_down].ud = ud;
    c->n_on_down++;
    return 0;
}

void cluster_set_channel_handler(struct cluster *c, cluster_chan_fn fn, void *ud)
{
    c->on_chan = fn;
    c->on_chan_ud = ud;
}

/* A data channel's first message came: the socket and its session leave
 * the loop for the handler, and the connection ends without a BYE. */
void cl__on_channel(struct cluster *c, cl_conn *k, const wire_msg *m)
{
    char from[2 * WIRE_ID_BYTES + 1];
    wire_hex(k->ws.peer_id, WIRE_ID_BYTES, from);
    struct evbuffer *in = bufferevent_get_input(k->bev);
    size_t left = evbuffer_get_length(in);
    int fd = m->type >= 0x40 && m->type < 0x80 && c->on_chan
             ? dup(bufferevent_getfd(k->bev)) : -1;
    cluster_chan *ch = fd >= 0 ? chan_new(fd, &k->ws, evbuffer_pullup(in, (ev_ssize_t)left),
                                          left, from) : NULL;
    /* copy the message: closing the connection frees its buffers */
    uint8_t *first = ch ? rc_malloc(m->len ? m->len : 1) : NULL;
    if (first)
        memcpy(first, m->data, m->len);
    int type = m->type;
    size_t len = m->len;
    cl__conn_close(k, NULL);
    if (!first || c->on_chan(c->on_chan_ud, from, type, first, len, ch) != 0) {
        if (ch)
            rc_log(LOG_DEBUG, "cluster: refused a data channel from node %.8s: %s", from,
                   first ? rc_errmsg() : "out of memory");
        else
            rc_log(LOG_INFO, "cluster: a data channel from node %.8s opened with a message of "
                   "type 0x%02x, which nothing here takes", from, type);
        chan_free(ch);
    }
    rc_free(first);
}

int cluster_channel_confirm(cluster_chan *ch)
{
    return chan_send(ch, WIRE_CHAN_OK, NULL, 0, 2000);
}

int cluster_channel_open(struct cluster *c, const char *node_id, int type, const void *first,
                         size_t len, int timeout_ms, cluster_chan **out)
{
    uint8_t id[WIRE_ID_BYTES];
    if (strlen(node_id) != 2 * WIRE_ID_BYTES || wire_unhex(node_id, id, WIRE_ID_BYTES))
        return rc_fail(RC_EINVAL, "bad node id '%s'", node_id);
    addr_list addrs = { 0 };
    int port = 0;
    uint8_t key[WIRE_KEY_BYTES];
    pthread_mutex_lock(&c->mu);
    cl_node *n = cl__node_find(c, id);
    if (n) {
        addrs = n->addrs;
        port = n->cluster_port;
    }
    memcpy(key, c->key, sizeof key);           /* a rotation may replace it meanwhile */
    pthread_mutex_unlock(&c->mu);
    if (!n || !addrs.n_addrs || !port)
        return rc_fail(RC_ENOTFOUND, "no address known for node %.8s", node_id);
    int rc = 0;
    for (int i = 0; i < addrs.n_addrs; i++) {
        cluster_chan *ch = NULL;
        rc = chan_dial(addrs.addrs[i], port, key, &c->ident, c->major, c->minor, id,
                       timeout_ms, &ch);
        if (rc == RC_EUNSUPPORTED)
            break;
        if (rc)
            continue;
        int t;
        const uint8_t *d;
        size_t n_ok;
        rc = chan_send(ch, type, first, len, timeout_ms);
        if (!rc && !(rc = chan_recv(ch, &t, &d, &n_ok, timeout_ms)) && t != WIRE_CHAN_OK)
            rc = rc_fail(RC_EFORMAT, "node %.8s answered a data channel with a message of type "
                         "0x%02x", node_id, t);
        if (!rc)
            *out = ch;
        else
            chan_free(ch);
        break;
    }
    sodium_memzero(key, sizeof key);
    return rc;
}

void cl__dispatch(struct cluster *c, const char *from_id, int type, const uint8_t *data,
                  size_t len)
{
    for (int i = 0; i < c->n_handlers; i++)
        if (type >= c->handlers[i].lo && type <= c->handlers[i].hi) {
            c->handlers[i].fn(c->handlers[i].ud, from_id, type, data, len);
            return;
        }
    rc_log(LOG_DEBUG, "cluster: no handler for data-plane message type 0x%02x", type);
}

int cluster_send(struct cluster *c, const char *to_id, int type, const void *data, size_t len)
{
    uint8_t id[WIRE_ID_BYTES];
    if (!to_id || wire_unhex(to_id, id, WIRE_ID_BYTES))
        return rc_fail(RC_EINVAL, "bad node id");
    if (type < 1 || type > 255)
        return rc_fail(RC_EINVAL, "bad message type %d", type);
    if (len > WIRE_MSG_MAX)
        return rc_fail(RC_ELIMIT, "message of %zu bytes (limit %u)", len, WIRE_MSG_MAX);
    if (!c->started)
        return rc_fail(RC_ESTATE, "cluster not started");
    pthread_mutex_lock(&c->mu);
    cl_node *n = cl__node_find(c, id);
    bool up = n && n->up;
    pthread_mutex_unlock(&c->mu);
    if (!up)
        return rc_fail(RC_ENOTFOUND, c->swim ? "node %.8s is not up" : "node %.8s has no open link",
                       to_id);
    return cl__enqueue(c, id, type, data, len);
}

int cl__enqueue(struct cluster *c, const uint8_t id[WIRE_ID_BYTES], int type, const void *data,
                size_t len)
{
    cl_out *o = rc_malloc(sizeof *o + len);
    if (!o)
        return rc_fail(RC_ENOMEM, "queueing %zu bytes", len);
    o->next = NULL;
    memcpy(o->to, id, WIRE_ID_BYTES);
    o->t_ns = os_now_ns();
    o->type = type;
    o->len = len;
    if (len)
        memcpy(o->data, data, len);
    pthread_mutex_lock(&c->mu);
    if (c->out_tail)
        c->out_tail->next = o;
    else
        c->out_head = o;
    c->out_tail = o;
    pthread_mutex_unlock(&c->mu);
    event_active(c->wake_ev, 0, 0);
    return 0;
}

void cluster_free(struct cluster *c)
{
    if (!c)
        return;
    if (c->started) {
        event_active(c->stop_ev, 0, 0);
        pthread_join(c->thread, NULL);
    }
    if (c->bench_started)
        pthread_join(c->bench_thread, NULL);
    while (c->conns) {
        cl_conn *k = c->conns;
        c->conns = k->next;
        cl__conn_free(k);
    }
    discovery_free(c->disc);
    cl__swim_free(c);
    if (c->listener)
        evconnlistener_free(c->listener);
    struct event *evs[] = { c->tick_ev, c->stop_ev, c->wake_ev, c->reap_ev };
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    if (c->base)
        event_base_free(c->base);
    for (int i = 0; i < c->n_nodes; i++)
        cl_node_free(c->nodes[i]);
    rc_free(c->nodes);
    rc_free(c->statics);
    while (c->out_head) {
        cl_out *o = c->out_head;
        c->out_head = o->next;
        rc_free(o);
    }
    cl__held_free(c);
    json_decref(c->models);
    exports_free(c->exports);
    json_decref(c->serving);
    json_decref(c->serving_free);
    json_decref(c->serving_slots);
    json_decref(c->published);
    json_decref(c->published_stable);
    json_decref(c->swim_serving);
    rc_free(c->ro_dirs);
    rc_free(c->plain);
    if (c->mu_init)
        pthread_mutex_destroy(&c->mu);
    if (c->lock_fd >= 0)
        close(c->lock_fd);          /* and with it the lock */
    sodium_memzero(c->key, sizeof c->key);
    sodium_memzero(c->token, sizeof c->token);
    rc_free(c->revoked);
    cl__rotate_free(c);
    rc_free(c);
}
