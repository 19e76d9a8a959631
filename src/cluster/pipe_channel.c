/* pipe_channel.c - the data channels between tensor-parallel shards.
 *
 * Before it says it is ready, shard r dials every shard q > r on another
 * node (pl__shard_link); the cluster thread hands the socket to the shard
 * it names (pl__on_channel), or a refusal comes on the cluster link
 * (pl__on_bind).  A binding that comes before its shard's set-up waits in
 * the pipeline's pending list until the shard adopts it.
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether node `id` speaks protocol 1.0, which has no data channels (from
 * the cluster view; false when unknown). */
static bool without_channels(pipeline *p, const char *id)
{
    json_t *snap = cluster_snapshot(p->c), *n;
    size_t i;
    int major = 0, minor = 0;
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "id"));
        const char *proto = json_string_value(json_object_get(n, "protocol"));
        if (nid && proto && !strcmp(nid, id)) {
            if (sscanf(proto, "%d.%d", &major, &minor) != 2)
                major = 0;
            break;
        }
    }
    json_decref(snap);
    return major == 1 && minor == 0;
}

/* The data channels of a shard, before it says it is ready: shard r dials
 * every shard q > r on another node (the dialler decides: when it cannot
 * open one, or RACIMO_DATA_CHANNELS=0, it says so through the cluster link
 * and both sides send that pair's parts there) and waits until every
 * shard q < r has opened one or said it would not. */
int pl__shard_link(stage_inst *si)
{
    pipeline *p = si->p;
    const char *env = getenv("RACIMO_DATA_CHANNELS");
    bool want = !(env && !strcmp(env, "0"));
    uint8_t bind[BIND_LEN];
    memcpy(bind, si->head_raw, WIRE_ID_BYTES);
    memcpy(bind + WIRE_ID_BYTES, &si->inst, 4);
    for (int q = si->rank + 1; q < si->n_ranks; q++) {
        if (!strcmp(si->peers[q], p->self))
            continue;
        uint32_t f[3] = { (uint32_t)si->rank, (uint32_t)q, BIND_CHANNEL };
        memcpy(bind + WIRE_ID_BYTES + 4, f, sizeof f);
        cluster_chan *ch = NULL;
        int rc = want ? cluster_channel_open(p->c, si->peers[q], PIPE_BIND, bind, sizeof bind,
                                             CHANNEL_DIAL_MS, &ch)
                      : rc_fail(RC_EUNSUPPORTED, "RACIMO_DATA_CHANNELS=0");
        if (rc) {
            rc_log(LOG_WARN, "pipeline: no data channel from shard %d to shard %d (node %.8s): "
                   "%s; their parts go through the cluster link", si->rank, q, si->peers[q],
                   rc_errmsg());
            f[2] = BIND_NONE;
            memcpy(bind + WIRE_ID_BYTES + 4, f, sizeof f);
            if (pl__send_to(p, si->peers[q], PIPE_BIND, bind, sizeof bind))
                return rc_fail(RC_EIO, "cannot reach shard %d's node %.8s", q, si->peers[q]);
            continue;
        }
        pthread_mutex_lock(&p->mu);
        si->chan[q] = ch;
        pthread_mutex_unlock(&p->mu);
    }
    /* a node of protocol 1.0 opens no channel and says nothing of it */
    bool old[PIPELINE_MAX_STAGES] = { false };
    for (int q = 0; q < si->rank; q++)
        old[q] = strcmp(si->peers[q], p->self) && without_channels(p, si->peers[q]);
    pthread_mutex_lock(&p->mu);
    for (int q = 0; q < si->rank; q++) {
        if (old[q] && !si->chan[q])
            si->chan_none[q] = true;
        while (strcmp(si->peers[q], p->self) && !si->chan[q] && !si->chan_none[q] &&
               !si->stop && !si->peer_down)
            pthread_cond_wait(&si->cv, &p->mu);
    }
    int rc = si->stop ? rc_fail(RC_ESTATE, "stopped while linking the shards")
           : si->peer_down ? rc_fail(RC_EIO, "%s", si->peer_why) : 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Gives shard si the channel (or the refusal, ch NULL) from shard
 * from_rank, or with !commit only says whether it would; false when si does
 * not expect one from that node (mu held). */
static bool bind_locked(stage_inst *si, const char *from, int from_rank, int to_rank,
                        cluster_chan *ch, bool commit)
{
    if (si->n_ranks < 2 || from_rank < 0 || from_rank >= si->rank || to_rank != si->rank ||
        strcmp(si->peers[from_rank], from) || si->chan[from_rank] || si->chan_none[from_rank])
        return false;
    if (!commit)
        return true;
    si->chan[from_rank] = ch;
    si->chan_none[from_rank] = !ch;
    pthread_cond_signal(&si->cv);
    return true;
}

/* Reads a PIPE_BIND; -1 when malformed. */
static int bind_parse(const uint8_t *data, size_t len, char head[33], uint32_t *inst,
                      int *from_rank, int *to_rank, uint32_t *flag)
{
    if (len != BIND_LEN)
        return -1;
    uint32_t f[3];
    wire_hex(data, WIRE_ID_BYTES, head);
    memcpy(inst, data + WIRE_ID_BYTES, 4);
    memcpy(f, data + WIRE_ID_BYTES + 4, sizeof f);
    if (f[0] >= PIPELINE_MAX_STAGES || f[1] >= PIPELINE_MAX_STAGES || f[2] > BIND_NONE)
        return -1;
    *from_rank = (int)f[0];
    *to_rank = (int)f[1];
    *flag = f[2];
    return 0;
}

/* Channels (or refusals) for shards whose set-up has not come yet wait
 * here a while; older ones are dropped, and past PEND_MAX new ones (or
 * PEND_PER_NODE from one node) are refused: a peer cannot pile up sockets,
 * nor crowd out the bindings of the others.  With ch NULL and !commit only
 * says whether there is room.  False when refused (mu held; the caller
 * keeps ch). */
#define PEND_MAX 64
#define PEND_PER_NODE PIPELINE_MAX_STAGES
static bool pend_add_locked(pipeline *p, const char *from, const char *head, uint32_t inst,
                            int from_rank, int to_rank, cluster_chan *ch, bool commit)
{
    uint64_t now = os_now_ns();
    int n = 0, n_from = 0;
    for (pend_chan **pp = &p->pend; *pp;) {
        pend_chan *e = *pp;
        if (now - e->t_ns > (uint64_t)PARTIAL_WAIT_MS * 1000000u) {
            *pp = e->next;
            chan_free(e->ch);
            rc_free(e);
        } else {
            pp = &e->next;
            n++;
            n_from += !strcmp(e->from, from);
        }
    }
    bool room = n < PEND_MAX && n_from < PEND_PER_NODE;
    if (!commit)
        return room;
    pend_chan *e = room ? rc_calloc(1, sizeof *e) : NULL;
    if (!e)
        return false;
    snprintf(e->from, sizeof e->from, "%s", from);
    snprintf(e->head, sizeof e->head, "%s", head);
    e->inst = inst;
    e->from_rank = from_rank;
    e->to_rank = to_rank;
    e->ch = ch;
    e->t_ns = now;
    e->next = p->pend;
    p->pend = e;
    return true;
}

/* A new shard takes what came for it before its set-up (mu held). */
void pl__pend_adopt_locked(pipeline *p, stage_inst *si)
{
    for (pend_chan **pp = &p->pend; *pp;) {
        pend_chan *e = *pp;
        if (e->inst == si->inst && !strcmp(e->head, si->head)) {
            *pp = e->next;
            if (!bind_locked(si, e->from, e->from_rank, e->to_rank, e->ch, true))
                chan_free(e->ch);
            rc_free(e);
        } else {
            pp = &e->next;
        }
    }
}

/* The cluster thread hands over a data channel whose first message is a
 * PIPE_BIND: the shard it names takes it (now or at its set-up). */
int pl__on_channel(void *ud, const char *from, int type, const uint8_t *data, size_t len,
                   cluster_chan *ch)
{
    pipeline *p = ud;
    char head[33];
    uint32_t inst, flag;
    int from_rank, to_rank;
    if (type != PIPE_BIND || bind_parse(data, len, head, &inst, &from_rank, &to_rank, &flag) ||
        flag != BIND_CHANNEL)
        return rc_fail(RC_EFORMAT, "a data channel opened with a malformed message");
    pthread_mutex_lock(&p->mu);
    stage_inst *si = p->closed ? NULL : pl__find_stage_locked(p, head, inst);
    bool ok = !p->closed && (si ? bind_locked(si, from, from_rank, to_rank, ch, false)
                                : pend_add_locked(p, from, head, inst, from_rank, to_rank, ch,
                                                  false));
    /* confirmed only when taken, and before a shard's thread can see it: a
     * few bytes on a fresh socket */
    if (ok && cluster_channel_confirm(ch))
        ok = false;
    if (ok && si)
        bind_locked(si, from, from_rank, to_rank, ch, true);
    else if (ok)
        ok = pend_add_locked(p, from, head, inst, from_rank, to_rank, ch, true);
    pthread_mutex_unlock(&p->mu);
    if (!ok)
        return rc_fail(RC_EINVAL, "a data channel for shard %d of instance %u of %.8s, which "
                       "does not expect one from node %.8s", to_rank, inst, head, from);
    return 0;
}

/* A shard that opens no channel to this one says so on the cluster link. */
void pl__on_bind(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    char head[33];
    uint32_t inst, flag;
    int from_rank, to_rank;
    if (bind_parse(data, len, head, &inst, &from_rank, &to_rank, &flag) || flag != BIND_NONE) {
        pl__refuse(p, from, PIPE_BIND, "malformed");
        return;
    }
    pthread_mutex_lock(&p->mu);
    stage_inst *si = pl__find_stage_locked(p, head, inst);
    bool ok = si ? bind_locked(si, from, from_rank, to_rank, NULL, true)
                 : pend_add_locked(p, from, head, inst, from_rank, to_rank, NULL, true);
    pthread_mutex_unlock(&p->mu);
    if (!ok && si)
        pl__refuse(p, from, PIPE_BIND, "for shard %d of instance %u of %.8s, which expects none "
                   "from that node", to_rank, inst, head);
    else if (!ok)
        pl__refuse(p, from, PIPE_BIND, "too many shard bindings wait for their set-up");
}
