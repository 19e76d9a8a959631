/* rotate.c - replacing the cluster key while the members stay linked
 * (`racimo token --rotate`, docs/cluster-protocol.md §5).
 *
 * The node asked makes a new key and sends it (KEY) over every open link:
 * the links are encrypted with their own session keys, so the new key
 * travels only to authenticated members, and the links themselves go on.
 * A member adopts a KEY newer than its own key (a later epoch; two
 * rotations at once settle on the one with the larger epoch and key), stores
 * it as its token (cluster.key), announces the new fingerprint, answers
 * KEY_ACK and passes the KEY on to its other links, so a member whose link to
 * the rotating node is down still hears it.  From then on every new
 * handshake of the member uses the new key: the listener accepts no other.
 *
 * The overlap: for a bounded time after adopting, a member keeps the key
 * before; a dial to a known member that fails authentication with the new
 * key is tried once more with the old one (the member may have missed the
 * KEY while its link was down), and a link made that way is sent the KEY
 * at once.  Only dials to members already in the table use the old key, and
 * only towards them, so a stranger holding the old token gets nothing.  The
 * rotating node retires the old key everywhere (KEY_RETIRE) once every
 * member that was up at the rotation confirmed, or after cfg.key_confirm_ms; a
 * member drops it by itself after OVERLAP_MS.
 */
#include "cluster/cluster_internal.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define MS          1000000ull
#define OVERLAP_MS  60000           /* a member keeps the old key at most this long */
#define KEY_BYTES   (WIRE_KEY_BYTES + 8 + WIRE_ID_BYTES)
#define FP_BYTES    (WIRE_FP_HEX / 2)

static void drop_old(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    sodium_memzero(c->rot.old_key, sizeof c->rot.old_key);
    c->rot.has_old = false;
    pthread_mutex_unlock(&c->mu);
    for (int i = 1; i < c->n_nodes; i++)
        c->nodes[i]->dial_old_key = false;
}

static void send_key(struct cluster *c, cl_conn *k)
{
    uint8_t p[KEY_BYTES];
    memcpy(p, c->key, WIRE_KEY_BYTES);
    wire_put64(p + WIRE_KEY_BYTES, c->rot.epoch);
    memcpy(p + WIRE_KEY_BYTES + 8, c->nodes[0]->id, WIRE_ID_BYTES);
    cl__conn_send(k, WIRE_KEY, p, sizeof p, false);
    sodium_memzero(p, sizeof p);
}

/* Makes `key` the cluster key; the one before stays for the overlap.
 * `from`: the link the KEY came on (not sent back there), NULL here. */
static void adopt(struct cluster *c, const uint8_t key[WIRE_KEY_BYTES], uint64_t epoch,
                  const cl_conn *from)
{
    char tok[WIRE_TOKEN_MAX + 2];
    pthread_mutex_lock(&c->mu);
    memcpy(c->rot.old_key, c->key, WIRE_KEY_BYTES);
    c->rot.has_old = true;
    c->rot.old_until_ns = os_now_ns() + OVERLAP_MS * MS;
    memcpy(c->key, key, WIRE_KEY_BYTES);
    c->rot.epoch = epoch;
    wire_token_encode(c->key, c->token, sizeof c->token);
    wire_fingerprint(c->key, c->fp);
    snprintf(tok, sizeof tok, "%s\n", c->token);
    pthread_mutex_unlock(&c->mu);
    char path[600];
    snprintf(path, sizeof path, "%s/cluster.key", c->state_dir);
    if (cl__write_file(path, tok, strlen(tok), 0600, true))
        rc_log(LOG_ERROR, "cluster: the new cluster key is in use but could not be stored: %s "
               "(after a restart this node would need the new token)", rc_errmsg());
    sodium_memzero(tok, sizeof tok);
    discovery_rekey(c->disc);
    if (from && from->node)
        rc_log(LOG_INFO, "cluster: node %.8s rotated the cluster key: now fingerprint %s, stored "
               "in %s (new members need the new token: racimo token)", from->node->id_hex, c->fp,
               path);
    for (cl_conn *k = c->conns; k; k = k->next)
        if (k->phase == PH_OPEN && k != from)
            send_key(c, k);
}

static void retire(struct cluster *c)
{
    uint8_t p[8];
    wire_put64(p, c->rot.epoch);
    for (cl_conn *k = c->conns; k; k = k->next)
        if (k->phase == PH_OPEN)
            cl__conn_send(k, WIRE_KEY_RETIRE, p, sizeof p, false);
    pthread_mutex_lock(&c->mu);
    c->rot.leading = false;
    int missed = c->rot.n_waiting;
    pthread_mutex_unlock(&c->mu);
    drop_old(c);
    if (!missed) {
        rc_log(LOG_INFO, "cluster: key rotation done: every live member confirmed the new key "
               "(fingerprint %s); the old key no longer works", c->fp);
        return;
    }
    char list[200] = "";
    size_t used = 0;
    for (int i = 0; i < missed && used + 12 < sizeof list; i++) {
        char id[2 * WIRE_ID_BYTES + 1];
        wire_hex(c->rot.waiting[i], WIRE_ID_BYTES, id);
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%.8s", i ? ", " : "", id);
    }
    rc_log(LOG_WARN, "cluster: key rotation: %d member%s did not confirm the new key within %d s "
           "(%s); the old key no longer works, so %s the new token", missed,
           missed == 1 ? "" : "s", c->cfg.key_confirm_ms / 1000, list, missed == 1 ? "it needs" : "they need");
}

/* The rotation asked of this node starts (cluster thread). */
static void start(struct cluster *c, uint64_t now)
{
    uint8_t key[WIRE_KEY_BYTES];
    pthread_mutex_lock(&c->mu);
    memcpy(key, c->rot.asked_key, sizeof key);
    sodium_memzero(c->rot.asked_key, sizeof c->rot.asked_key);
    c->rot.asked = false;
    c->rot.leading = true;
    c->rot.n_waiting = 0;
    rc_free(c->rot.waiting);
    c->rot.waiting = rc_calloc((size_t)c->n_nodes + 1, WIRE_ID_BYTES);
    for (int i = 1; c->rot.waiting && i < c->n_nodes; i++)
        if (c->nodes[i]->member && c->nodes[i]->up)
            memcpy(c->rot.waiting[c->rot.n_waiting++], c->nodes[i]->id, WIRE_ID_BYTES);
    uint64_t epoch = (uint64_t)time(NULL) * 1000;
    pthread_mutex_unlock(&c->mu);
    if (epoch <= c->rot.epoch)
        epoch = c->rot.epoch + 1;
    c->rot.deadline_ns = now + (uint64_t)c->cfg.key_confirm_ms * MS;
    adopt(c, key, epoch, NULL);
    sodium_memzero(key, sizeof key);
    rc_log(LOG_INFO, "cluster: rotated the cluster key: now fingerprint %s; carrying %d live "
           "member%s over", c->fp, c->rot.n_waiting, c->rot.n_waiting == 1 ? "" : "s");
    if (!c->rot.n_waiting)
        retire(c);
}

void cl__rotate_work(struct cluster *c, uint64_t now)
{
    pthread_mutex_lock(&c->mu);
    bool asked = c->rot.asked, leading = c->rot.leading;
    pthread_mutex_unlock(&c->mu);
    if (asked && !leading)
        start(c, now);
    else if (leading && now >= c->rot.deadline_ns)
        retire(c);
    else if (!leading && c->rot.has_old && now >= c->rot.old_until_ns) {
        drop_old(c);
        rc_log(LOG_INFO, "cluster: the cluster key from before the rotation is no longer used");
    }
}

void cl__rotate_linked(struct cluster *c, cl_conn *k)
{
    if (k->node)
        k->node->dial_old_key = false;
    if (!k->old_key)
        return;
    rc_log(LOG_INFO, "cluster: node %.8s still had the cluster key from before the rotation; "
           "sending it the new one", k->node ? k->node->id_hex : "?");
    send_key(c, k);
}

const char *cl__rotation_hint(struct cluster *c, const cl_conn *k)
{
    static _Thread_local char buf[256];
    cl_node *n = cl__node_find(c, k->ws.peer_id);
    if (!n || !n->member)
        return "";
    snprintf(buf, sizeof buf, "; it names itself node %.8s, a member of this cluster: the cluster "
             "key may have been rotated while one of the two was away (the one with the old key "
             "needs the new token: 'racimo token' on a current member)", n->id_hex);
    return buf;
}

void cl__on_rotate(struct cluster *c, cl_conn *k, int type, const uint8_t *data, size_t len)
{
    const char *who = k->node ? k->node->id_hex : "?";
    if (type == WIRE_KEY) {
        if (len != KEY_BYTES) {
            rc_log(LOG_WARN, "cluster: node %.8s sent a malformed KEY (%zu bytes); ignored", who, len);
            return;
        }
        uint64_t epoch = wire_get64(data + WIRE_KEY_BYTES);
        int cmp = memcmp(data, c->key, WIRE_KEY_BYTES);
        if (c->self_removed)
            return;
        if (cmp != 0 && (epoch > c->rot.epoch || (epoch == c->rot.epoch && cmp > 0))) {
            if (c->rot.leading) {
                /* another node rotated at the same time and won: its rotation
                 * goes on, this one's confirmations no longer matter */
                pthread_mutex_lock(&c->mu);
                c->rot.leading = false;
                c->rot.n_waiting = 0;
                pthread_mutex_unlock(&c->mu);
            }
            adopt(c, data, epoch, k);
        } else if (cmp != 0) {
            rc_log(LOG_INFO, "cluster: node %.8s sent a cluster key older than this node's; "
                   "ignored", who);
            return;
        }
        uint8_t ack[8 + FP_BYTES];
        wire_put64(ack, c->rot.epoch);
        wire_unhex(c->fp, ack + 8, FP_BYTES);
        cl__conn_send(k, WIRE_KEY_ACK, ack, sizeof ack, false);
    } else if (type == WIRE_KEY_ACK) {
        uint8_t fp[FP_BYTES];
        wire_unhex(c->fp, fp, FP_BYTES);
        if (len != sizeof fp + 8) {
            rc_log(LOG_WARN, "cluster: node %.8s sent a malformed KEY_ACK (%zu bytes); ignored",
                   who, len);
            return;
        }
        if (!k->node || !c->rot.leading || wire_get64(data) != c->rot.epoch ||
            memcmp(data + 8, fp, sizeof fp))
            return;                          /* a confirmation of another rotation */
        cl__rotate_forget(c, k->node->id);
    } else if (type == WIRE_KEY_RETIRE) {
        if (len != 8) {
            rc_log(LOG_WARN, "cluster: node %.8s sent a malformed KEY_RETIRE (%zu bytes); ignored",
                   who, len);
            return;
        }
        if (wire_get64(data) == c->rot.epoch && c->rot.has_old && !c->rot.leading) {
            drop_old(c);
            rc_log(LOG_INFO, "cluster: node %.8s retired the cluster key from before the "
                   "rotation; it no longer works", who);
        }
    }
}

void cl__rotate_forget(struct cluster *c, const uint8_t id[WIRE_ID_BYTES])
{
    if (!c->rot.leading)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->rot.n_waiting; i++)
        if (!memcmp(c->rot.waiting[i], id, WIRE_ID_BYTES)) {
            memcpy(c->rot.waiting[i], c->rot.waiting[--c->rot.n_waiting], WIRE_ID_BYTES);
            break;
        }
    bool all = c->rot.n_waiting == 0;
    pthread_mutex_unlock(&c->mu);
    if (all)
        retire(c);
}

json_t *cl__rotation_json(struct cluster *c)
{
    json_t *ids = json_array();
    for (int i = 0; ids && i < c->rot.n_waiting; i++) {
        char id[2 * WIRE_ID_BYTES + 1];
        wire_hex(c->rot.waiting[i], WIRE_ID_BYTES, id);
        json_array_append_new(ids, json_string(id));
    }
    bool busy = c->rot.asked || c->rot.leading;
    return json_pack("{s:I, s:b, s:b, s:o}", "epoch", (json_int_t)c->rot.epoch, "in_progress",
                     busy, "old_key_in_use", c->rot.has_old,
                     busy ? "waiting_for" : "not_confirmed", ids);
}

void cl__rotate_free(struct cluster *c)
{
    rc_free(c->rot.waiting);
    sodium_memzero(&c->rot, sizeof c->rot);
}

/* ---- public ---- */

int cluster_rotate_key(struct cluster *c, char *token, size_t cap)
{
    if (!c->started)
        return rc_fail(RC_ESTATE, "cluster not started");
    uint8_t key[WIRE_KEY_BYTES];
    randombytes_buf(key, sizeof key);
    int r = wire_token_encode(key, token, cap);
    pthread_mutex_lock(&c->mu);
    if (!r && (c->rot.asked || c->rot.leading))
        r = rc_fail(RC_ESTATE, "a key rotation is in progress here (it ends when every live "
                    "member confirmed, at most %d s)", c->cfg.key_confirm_ms / 1000);
    else if (!r && c->self_removed)
        r = rc_fail(RC_ESTATE, "this node was removed from the cluster");
    if (!r) {
        memcpy(c->rot.asked_key, key, sizeof key);
        c->rot.asked = true;
    }
    pthread_mutex_unlock(&c->mu);
    sodium_memzero(key, sizeof key);
    if (r) {
        if (cap)
            sodium_memzero(token, cap);
        return r;
    }
    cl__wake(c);
    return 0;
}
