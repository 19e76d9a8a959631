/* revoke.c - the nodes removed from the cluster (`racimo nodes remove`).
 *
 * The revocation list only grows: an entry names the node removed, the node
 * that removed it and when.  Every member keeps the whole list in
 * <state_dir>/revoked.json and sends it to each link as it opens and to all
 * links when it learns an entry (REVOKE, docs/cluster-protocol.md §5), so a
 * member that was away gets it at its next link.  A node on the list is
 * refused the moment its handshake authenticates (cl__refuse_revoked, the
 * one call in peer.c), its links are closed, it is dropped from the node
 * table and never added again (cl__node_add asks cl__is_revoked).  Before
 * the refusal closes the link the refused node is sent the list, so it can
 * say in its own log that it was removed.
 *
 * Entries are added by any thread under mu (cluster_remove_node) or by the
 * cluster thread (a REVOKE); cl__revoke_work, on the cluster thread, applies
 * the ones not yet applied.
 */
#include "cluster/cluster_internal.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_REVOKED 4096
#define ENTRY_BYTES (2 * WIRE_ID_BYTES + 8)

static int find_locked(const struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    for (int i = 0; i < c->n_revoked; i++)
        if (!memcmp(c->revoked[i].id, id, WIRE_ID_BYTES))
            return i;
    return -1;
}

bool cl__is_revoked(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    pthread_mutex_lock(&c->mu);
    bool r = find_locked(c, id) >= 0;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* Appends an entry unless its node is listed already; the caller holds mu.
 * 1 added, 0 already there, RC_ELIMIT / RC_ENOMEM. */
static int add_locked(struct cluster *c, const uint8_t id[WIRE_ID_BYTES],
                      const uint8_t by[WIRE_ID_BYTES], uint64_t at)
{
    if (find_locked(c, id) >= 0)
        return 0;
    if (c->n_revoked >= MAX_REVOKED)
        return rc_fail(RC_ELIMIT, "the revocation list holds %d nodes already", MAX_REVOKED);
    cl_revoked *nr = rc_realloc(c->revoked, (size_t)(c->n_revoked + 1) * sizeof *nr);
    if (!nr)
        return rc_fail(RC_ENOMEM, "revocation list");
    c->revoked = nr;
    memcpy(nr[c->n_revoked].id, id, WIRE_ID_BYTES);
    memcpy(nr[c->n_revoked].by, by, WIRE_ID_BYTES);
    nr[c->n_revoked].at = at;
    c->n_revoked++;
    return 1;
}

static void path_of(const struct cluster *c, char *out, size_t cap)
{
    snprintf(out, cap, "%s/revoked.json", c->state_dir);
}

json_t *cl__revoked_json(struct cluster *c)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < c->n_revoked; i++) {
        char id[2 * WIRE_ID_BYTES + 1], by[2 * WIRE_ID_BYTES + 1];
        wire_hex(c->revoked[i].id, WIRE_ID_BYTES, id);
        wire_hex(c->revoked[i].by, WIRE_ID_BYTES, by);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I}", "id", id, "by", by, "at",
                                             (json_int_t)c->revoked[i].at));
    }
    return arr;
}

static void save(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    json_t *arr = cl__revoked_json(c);
    pthread_mutex_unlock(&c->mu);
    char *s = arr ? json_dumps(arr, JSON_INDENT(1)) : NULL;
    json_decref(arr);
    char path[600];
    path_of(c, path, sizeof path);
    if (!s || cl__write_file(path, s, strlen(s), 0600, true))
        rc_log(LOG_ERROR, "cluster: cannot save the revocation list to %s: %s", path,
               s ? rc_errmsg() : "out of memory");
    free(s);
}

static void log_self_removed(struct cluster *c, const cl_revoked *e)
{
    char by[2 * WIRE_ID_BYTES + 1], when[32] = "?";
    wire_hex(e->by, WIRE_ID_BYTES, by);
    time_t t = (time_t)e->at;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    rc_log(LOG_ERROR, "cluster: this node (%.8s) was removed from the cluster by node %.8s "
           "at %s: the other nodes refuse its links; it serves only its own API now (a new "
           "member needs a new --state-dir and the current token)", c->nodes[0]->id_hex, by, when);
}

void cl__revoked_load(struct cluster *c)
{
    char path[600];
    path_of(c, path, sizeof path);
    json_error_t err;
    json_t *arr = json_load_file(path, 0, &err);
    if (!arr)
        return;                              /* none yet */
    size_t i;
    json_t *e;
    int bad = 0;
    pthread_mutex_lock(&c->mu);
    json_array_foreach(arr, i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        const char *by = json_string_value(json_object_get(e, "by"));
        json_t *at = json_object_get(e, "at");
        uint8_t bid[WIRE_ID_BYTES], bby[WIRE_ID_BYTES];
        if (!id || !by || wire_unhex(id, bid, WIRE_ID_BYTES) || wire_unhex(by, bby, WIRE_ID_BYTES) ||
            !json_is_integer(at) || add_locked(c, bid, bby, (uint64_t)json_integer_value(at)) < 0)
            bad++;
    }
    if (!json_is_array(arr))
        bad++;
    int self = find_locked(c, c->nodes[0]->id);
    c->self_removed = self >= 0;
    c->n_revoked_done = c->n_revoked;
    cl_revoked me = self >= 0 ? c->revoked[self] : (cl_revoked){ { 0 }, { 0 }, 0 };
    pthread_mutex_unlock(&c->mu);
    json_decref(arr);
    if (bad)
        rc_log(LOG_WARN, "cluster: %s: %d malformed entr%s skipped", path, bad, bad == 1 ? "y" : "ies");
    if (self >= 0)
        log_self_removed(c, &me);
}

/* The whole list as a REVOKE payload (rc_malloc'd) into *out; 0 when empty. */
static size_t encode(struct cluster *c, uint8_t **out)
{
    pthread_mutex_lock(&c->mu);
    int n = c->n_revoked;
    size_t len = 2 + (size_t)n * ENTRY_BYTES;
    uint8_t *p = n ? rc_malloc(len) : NULL;
    if (p) {
        p[0] = (uint8_t)(n >> 8);
        p[1] = (uint8_t)n;
        for (int i = 0; i < n; i++) {
            uint8_t *q = p + 2 + (size_t)i * ENTRY_BYTES;
            memcpy(q, c->revoked[i].id, WIRE_ID_BYTES);
            memcpy(q + WIRE_ID_BYTES, c->revoked[i].by, WIRE_ID_BYTES);
            wire_put64(q + 2 * WIRE_ID_BYTES, c->revoked[i].at);
        }
    }
    pthread_mutex_unlock(&c->mu);
    *out = p;
    return p ? len : 0;
}

void cl__revoke_send(struct cluster *c, cl_conn *k)
{
    uint8_t *p;
    size_t n = encode(c, &p);
    if (n)
        cl__conn_send(k, WIRE_REVOKE, p, n, false);
    rc_free(p);
}

bool cl__refuse_revoked(struct cluster *c, cl_conn *k)
{
    if (!cl__is_revoked(c, k->ws.peer_id))
        return false;
    char id[2 * WIRE_ID_BYTES + 1];
    wire_hex(k->ws.peer_id, WIRE_ID_BYTES, id);
    rc_log(LOG_WARN, "cluster: refused %s %s (node %.8s): that node was removed from the cluster "
           "(racimo nodes remove)", k->role == WIRE_DIALER ? "the node at" : "a connection from",
           k->peer_addr, id);
    k->refused = true;
    /* the session is authenticated: the list tells the node why, then BYE */
    k->phase = PH_OPEN;
    cl__revoke_send(c, k);
    cl__conn_close(k, "this node was removed from the cluster");
    return true;
}

/* Closes the node's links and drops it from the table. */
static void drop_node(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    cl__rotate_forget(c, id);                /* a key rotation does not wait for it */
    cl_node *n = cl__node_find(c, id);
    if (!n || n->is_self)
        return;
    if (n->conn && n->conn->phase == PH_OPEN)
        cl__revoke_send(c, n->conn);
    for (cl_conn *k = c->conns; k; k = k->next)
        if ((k->node == n || k->target == n ||
             (k->phase != PH_DEAD && !memcmp(k->ws.peer_id, id, WIRE_ID_BYTES) && k->ws.established)))
            cl__conn_close(k, "this node was removed from the cluster");
    for (cl_conn *k = c->conns; k; k = k->next) {
        if (k->node == n)
            k->node = NULL;
        if (k->target == n)
            k->target = NULL;
    }
    pthread_mutex_lock(&c->mu);
    for (int i = 1; i < c->n_nodes; i++)
        if (c->nodes[i] == n) {
            c->nodes[i] = c->nodes[--c->n_nodes];
            break;
        }
    c->self_dirty = true;
    pthread_mutex_unlock(&c->mu);
    json_decref(n->info);
    rc_free(n);
    c->peers_dirty = true;
}

void cl__revoke_work(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    int from = c->n_revoked_done, to = c->n_revoked;
    pthread_mutex_unlock(&c->mu);
    if (from == to)
        return;
    for (int i = from; i < to; i++) {
        pthread_mutex_lock(&c->mu);
        cl_revoked e = c->revoked[i];
        pthread_mutex_unlock(&c->mu);
        char id[2 * WIRE_ID_BYTES + 1], by[2 * WIRE_ID_BYTES + 1];
        wire_hex(e.id, WIRE_ID_BYTES, id);
        wire_hex(e.by, WIRE_ID_BYTES, by);
        if (!memcmp(e.id, c->nodes[0]->id, WIRE_ID_BYTES)) {
            pthread_mutex_lock(&c->mu);
            c->self_removed = true;
            pthread_mutex_unlock(&c->mu);
            log_self_removed(c, &e);
            for (cl_conn *k = c->conns; k; k = k->next)
                cl__conn_close(k, "this node was removed from the cluster");
            continue;
        }
        cl_node *n = cl__node_find(c, e.id);
        rc_log(LOG_WARN, "cluster: node %.8s (%s) was removed from the cluster by node %.8s%s; "
               "its links are refused", id, n && n->name[0] ? n->name : "?", by,
               !memcmp(e.by, c->nodes[0]->id, WIRE_ID_BYTES) ? " (this node)" : "");
        drop_node(c, e.id);
    }
    pthread_mutex_lock(&c->mu);
    c->n_revoked_done = to;
    pthread_mutex_unlock(&c->mu);
    save(c);
    /* spread: every link hears the whole list (a receiver ignores what it has) */
    if (!c->self_removed)
        for (cl_conn *k = c->conns; k; k = k->next)
            if (k->phase == PH_OPEN)
                cl__revoke_send(c, k);
}

void cl__on_revoke(struct cluster *c, cl_conn *k, const uint8_t *data, size_t len)
{
    const char *who = k->node ? k->node->id_hex : "?";
    size_t n = len >= 2 ? (size_t)(data[0] << 8 | data[1]) : 0;
    if (len < 2 || len != 2 + n * ENTRY_BYTES || n > MAX_REVOKED) {
        rc_log(LOG_WARN, "cluster: node %.8s sent a malformed REVOKE (%zu bytes); ignored", who, len);
        return;
    }
    int added = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *q = data + 2 + i * ENTRY_BYTES;
        int r = add_locked(c, q, q + WIRE_ID_BYTES, wire_get64(q + 2 * WIRE_ID_BYTES));
        if (r < 0)
            break;
        added += r;
    }
    pthread_mutex_unlock(&c->mu);
    if (added)
        cl__revoke_work(c);
}

/* ---- public ---- */

int cluster_remove_node(struct cluster *c, const char *spec, char out_id[2 * WIRE_ID_BYTES + 1])
{
    size_t n = spec ? strlen(spec) : 0;
    uint8_t id[WIRE_ID_BYTES];
    out_id[0] = 0;
    bool hex = n >= 8 && n <= 2 * WIRE_ID_BYTES && strspn(spec, "0123456789abcdefABCDEF") == n;
    if (!hex)
        return rc_fail(RC_EINVAL, "'%.40s' is not a node id (its 32 hex digits, or at least the "
                       "first 8 that 'racimo nodes' shows)", spec ? spec : "");
    if (!c->started)
        return rc_fail(RC_ESTATE, "cluster not started");
    pthread_mutex_lock(&c->mu);
    int found = 0;
    if (n == 2 * WIRE_ID_BYTES) {
        wire_unhex(spec, id, WIRE_ID_BYTES);
        found = 1;
    } else {
        for (int i = 0; i < c->n_nodes; i++)
            if (c->nodes[i]->member && !strncasecmp(c->nodes[i]->id_hex, spec, n)) {
                memcpy(id, c->nodes[i]->id, WIRE_ID_BYTES);
                found++;
            }
    }
    int r = 0;
    if (found == 0)
        r = rc_fail(RC_ENOTFOUND, "no node of the cluster has an id starting with %s", spec);
    else if (found > 1)
        r = rc_fail(RC_EINVAL, "%s names %d nodes; give more digits of the id", spec, found);
    else if (!memcmp(id, c->nodes[0]->id, WIRE_ID_BYTES))
        r = rc_fail(RC_EINVAL, "%.8s is the node asked; ask another node to remove it", spec);
    else if ((r = add_locked(c, id, c->nodes[0]->id, (uint64_t)time(NULL))) > 0)
        r = 0;
    pthread_mutex_unlock(&c->mu);
    if (r)
        return r;
    wire_hex(id, WIRE_ID_BYTES, out_id);
    cl__wake(c);
    return 0;
}
