/* links.c - with SWIM (membership.c), which TCP links a node keeps.
 *
 * SWIM finds members and failures over UDP, so links no longer form a full
 * mesh.  A node keeps long-lived links with its neighbours only: the
 * swim_neighbours members next to its id on the ring of ids (half after
 * it, half before; every member when there are no more than that), which
 * spreads STATE (hardware, model files, instances) along the ring and
 * gives each node a few measured links.  Any other link opens on demand -
 * a message for a member without one (cluster_send: forwarded requests,
 * weight pulls, pipeline messages) dials it and waits
 * here up to HOLD_MS - and the dialler closes it once no message went
 * either way for link_idle_ms.  Data channels are sockets of their own and
 * need no link.
 *
 * While SWIM knows no other member alive (a node just started, or cut off)
 * and no link is open, it dials the members it remembers (peers.json) and
 * its --peer seeds, as the mesh does: first contact.  One link is enough;
 * SWIM learns the others through it.
 *
 * Threads: the cluster thread.
 */
#include "cluster/cluster_internal.h"

#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <stdlib.h>
#include <string.h>

#define MS      1000000ull
#define HOLD_MS 10000            /* a message waits this long for its link to open */

static int by_id(const void *a, const void *b)
{
    return memcmp((*(cl_node *const *)a)->id, (*(cl_node *const *)b)->id, WIRE_ID_BYTES);
}

/* The ring is made of the members, up or down: a flapping member does not
 * move every neighbour relation around it (each move a link closed and
 * another opened), and two nodes agree on being neighbours once their
 * tables agree.  A neighbour that is down is redialled as the mesh does. */
static void pick_neighbours(struct cluster *c)
{
    int k = c->cfg.swim_neighbours > 0 ? c->cfg.swim_neighbours : 8;
    cl_node **ring = rc_malloc((size_t)c->n_nodes * sizeof *ring);
    if (!ring)
        return;
    int m = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        n->neighbour = false;
        if (n->is_self || n->member)
            ring[m++] = n;
    }
    qsort(ring, (size_t)m, sizeof *ring, by_id);
    int self = 0;
    while (self < m && !ring[self]->is_self)
        self++;
    if (m - 1 <= k) {
        for (int i = 0; i < m; i++)
            ring[i]->neighbour = !ring[i]->is_self;
    } else {
        for (int d = 1; d <= (k + 1) / 2; d++)
            ring[(self + d) % m]->neighbour = true;
        for (int d = 1; d <= k / 2; d++)
            ring[(self - d + m) % m]->neighbour = true;
    }
    rc_free(ring);
}

bool cl__link_wanted(struct cluster *c, const cl_node *n, uint64_t now)
{
    return !c->swim || n->neighbour || now < n->want_until_ns;
}

void cl__link_want(struct cluster *c, cl_node *n, uint64_t now)
{
    if (!c->swim || !n || n->is_self)
        return;
    n->want_until_ns = now + (uint64_t)(c->cfg.link_idle_ms > 0 ? c->cfg.link_idle_ms : 60000) * MS;
    if (!n->conn && !n->dialing)
        n->next_dial_ns = 0;         /* dial at the next tick */
}

void cl__hold(struct cluster *c, cl_out *o)
{
    o->next = NULL;
    cl_out **pp = &c->held;          /* in order: appended */
    while (*pp)
        pp = &(*pp)->next;
    *pp = o;
}

void cl__held_release(struct cluster *c, cl_node *n, uint64_t now)
{
    bool sent = false;
    for (cl_out **pp = &c->held; *pp;) {
        cl_out *o = *pp;
        bool mine = n && !memcmp(o->to, n->id, WIRE_ID_BYTES);
        if (mine && n->conn && n->conn->phase == PH_OPEN) {
            cl__conn_send(n->conn, o->type, o->data, o->len, false);
            sent = true;
        } else if (mine || cl__since(now, o->t_ns) > HOLD_MS * MS) {
            char hex[2 * WIRE_ID_BYTES + 1];
            wire_hex(o->to, WIRE_ID_BYTES, hex);
            rc_log(LOG_INFO, "cluster: dropping a message (type 0x%02x) for node %.8s: no link "
                   "to it opened within %d s", o->type, hex, HOLD_MS / 1000);
        } else {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        rc_free(o);
    }
    if (sent)
        cl__conn_flush(n->conn);
}

void cl__held_free(struct cluster *c)
{
    while (c->held) {
        cl_out *o = c->held;
        c->held = o->next;
        rc_free(o);
    }
}

void cl__links_tick(struct cluster *c, uint64_t now)
{
    if (!c->swim)
        return;
    if (now >= c->next_neighbours_ns) {
        pick_neighbours(c);
        c->next_neighbours_ns = now + 1000 * MS;
    }
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        cl_conn *k = n->conn;
        /* the dialler decides: the other end keeps what it was asked for */
        if (k && k->phase == PH_OPEN && k->role == WIRE_DIALER && !cl__link_wanted(c, n, now)) {
            rc_log(LOG_DEBUG, "cluster: closing the link to node %.8s: not a neighbour, unused "
                   "for %d s", n->id_hex, c->cfg.link_idle_ms / 1000);
            cl__conn_close(k, "idle link");
        }
    }
    cl__held_release(c, NULL, now);
}
