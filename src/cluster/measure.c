/* measure.c - link measures (RTT, bandwidth) on demand, cached with their age.
 *
 * Placement weighs each hop by the link's round trip and bandwidth.  In a
 * full mesh every pair of nodes has a link measured all the time; with
 * SWIM (links.c) a node has links only to its ring neighbours and to the
 * nodes it talks to, so most candidates of a placement would have no
 * measure.  cluster_measure_links() (called by the API before it places an
 * instance) asks for the candidates lacking a fresh one: the cluster thread
 * opens a link to each (the on-demand link of links.c, closed after
 * link_idle_ms unused) or, on a link already open, takes a bandwidth probe
 * at once; the ping and probe of peer.c then measure it.  A measure outlives
 * its link: kept with the time it was taken, shown with its age in the
 * view's links, and taken again only once older than measure_max_age_ms.
 *
 * Threads: cluster_measure_links on any thread but the cluster thread (it
 * waits); the rest on the cluster thread, under mu where marked.
 */
#include "cluster/cluster_internal.h"

#include "base/mem.h"
#include "base/os.h"

#include <string.h>
#include <time.h>

#define MS 1000000ull

static uint64_t age_limit_ns(const struct cluster *c)
{
    return (uint64_t)c->cfg.measure_max_age_ms * MS;
}

/* The older of the measure's parts (bandwidth counts only when probes run). */
static uint64_t taken_ns(const struct cluster *c, const cl_node *n)
{
    bool bw = c->cfg.probe_ms > 0;
    return bw && n->bw_at_ns < n->rtt_at_ns ? n->bw_at_ns : n->rtt_at_ns;
}

bool cl__measure_fresh(const struct cluster *c, const cl_node *n, uint64_t now)
{
    if (n->rtt_ms <= 0 || !n->rtt_at_ns || (c->cfg.probe_ms > 0 && (n->bw_mbps <= 0 || !n->bw_at_ns)))
        return false;
    return cl__since(now, taken_ns(c, n)) <= age_limit_ns(c);
}

json_t *cl__measure_json(const struct cluster *c, const cl_node *n, uint64_t now)
{
    bool linked = n->conn && n->conn->phase == PH_OPEN;
    if (!n->up || n->rtt_ms <= 0)
        return NULL;
    /* without SWIM a node up has its link; with it, a closed link's measure
     * is shown while it is young enough to be used */
    uint64_t at = taken_ns(c, n);
    if (c->swim && !linked && (!at || cl__since(now, at) > age_limit_ns(c)))
        return NULL;
    return json_pack("{s:s, s:f, s:o, s:o, s:b}", "to", n->id_hex, "rtt_ms", n->rtt_ms,
                     "bandwidth_mbps", n->bw_mbps > 0 ? json_real(n->bw_mbps) : json_null(),
                     "age_ms", at ? json_integer((json_int_t)(cl__since(now, at) / MS)) : json_null(),
                     "linked", linked);
}

void cl__measure_tick(struct cluster *c, uint64_t now)
{
    pthread_mutex_lock(&c->mu);
    bool asked = c->measure_asked;     /* nothing to look at on most ticks */
    pthread_mutex_unlock(&c->mu);
    if (!asked)
        return;
    bool pending = false;
    for (int i = 1; i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        pthread_mutex_lock(&c->mu);
        bool want = now < n->measure_until_ns;   /* no more dials once nobody waits */
        bool fresh = cl__measure_fresh(c, n, now);
        if (fresh || !n->up || !want)
            n->measure_until_ns = 0;
        pthread_mutex_unlock(&c->mu);
        if (!want || fresh || !n->up)
            continue;
        pending = true;
        cl_conn *k = n->conn;
        if (k && k->phase == PH_OPEN) {
            /* a link open for a while: its next probe may be minutes away */
            if (c->cfg.probe_ms > 0 && !k->probe_inflight && cl__since(now, n->bw_at_ns) >
                age_limit_ns(c) && k->next_probe_ns > now)
                k->next_probe_ns = now;
            cl__link_want(c, n, now);          /* kept while the measure is taken */
        } else {
            cl__link_want(c, n, now);          /* dialled at the next tick */
        }
    }
    if (!pending) {
        pthread_mutex_lock(&c->mu);
        /* asked again since the loop read the flags: look at the next tick */
        for (int i = 1; i < c->n_nodes && !pending; i++)
            pending = c->nodes[i]->measure_until_ns != 0;
        c->measure_asked = pending;
        pthread_mutex_unlock(&c->mu);
    }
}

int cluster_measure_links(struct cluster *c, const char *const *ids, int n, int wait_ms)
{
    if (!c || !c->started || n <= 0)
        return 0;
    /* kept by id, looked up again each time: the cluster thread may drop
     * a node from its table meanwhile */
    uint8_t (*wid)[WIRE_ID_BYTES] = rc_malloc((size_t)n * sizeof *wid);
    if (!wid)
        return 0;
    int n_want = 0;
    uint64_t now = os_now_ns();
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        if (!ids[i] || wire_unhex(ids[i], wid[n_want], WIRE_ID_BYTES))
            continue;
        cl_node *x = cl__node_find(c, wid[n_want]);
        if (!x || x->is_self || !x->member || !x->up || cl__measure_fresh(c, x, now))
            continue;
        x->measure_until_ns = now + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * MS;
        c->measure_asked = true;
        n_want++;
    }
    pthread_mutex_unlock(&c->mu);
    uint64_t end = now + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * MS;
    for (;;) {
        int left = 0;
        now = os_now_ns();
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < n_want; i++) {
            cl_node *x = cl__node_find(c, wid[i]);
            left += x && x->up && !cl__measure_fresh(c, x, now);
        }
        pthread_mutex_unlock(&c->mu);
        if (!left || now >= end)
            break;
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    rc_free(wid);
    return n_want;
}
