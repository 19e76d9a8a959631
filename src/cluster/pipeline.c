/* pipeline.c - stages of one model on several nodes: the pipeline
 * object.  It registers the handler of the cluster's pipeline messages
 * (types 0x40-0x4f) and routes each to the stage side or the head side;
 * a node going down breaks the instances it ran stages of and stops the
 * stages it headed.  pipeline_internal.h lists the other files.
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

stage_inst *pl__find_stage_locked(pipeline *p, const char *head, uint32_t inst)
{
    for (stage_inst *si = p->stages; si; si = si->next)
        if (si->inst == inst && !strcmp(si->head, head) && !si->stop)
            return si;
    return NULL;
}

static void on_msg(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    pipeline *p = ud;
    pthread_mutex_lock(&p->mu);
    bool closed = p->closed;
    pthread_mutex_unlock(&p->mu);
    if (closed)
        return;
    switch (type) {
    case PIPE_SETUP:  pl__on_setup(p, from, data, len); break;
    case PIPE_READY:  pl__on_ready(p, from, data, len); break;
    case PIPE_BATCH:  pl__on_batch(p, from, data, len); break;
    case PIPE_RESULT: pl__on_result(p, from, data, len); break;
    case PIPE_STOP:   pl__on_stop(p, from, data, len); break;
    case PIPE_PARTIAL: pl__on_partial(p, from, data, len); break;
    case PIPE_BIND:   pl__on_bind(p, from, data, len); break;
    default:
        rc_log(LOG_DEBUG, "pipeline: unknown message type 0x%02x from %.8s", type, from);
    }
}

int pl__send_to(pipeline *p, const char *to, int type, const void *d, size_t n)
{
    atomic_fetch_add(&p->bytes_out, n);
    atomic_fetch_add(&p->msgs_out, 1);
    if (!strcmp(to, p->self)) {
        on_msg(p, p->self, type, d, n);
        return 0;
    }
    return cluster_send(p->c, to, type, d, n);
}

static void on_down(void *ud, const char *node)
{
    pipeline *p = ud;
    if (p->w)
        weights_on_node_down(p->w, node);
    pthread_mutex_lock(&p->mu);
    for (head_exec *h = p->execs; h; h = h->next) {
        int k = pl__stage_of(h, node);
        if (k < 0 || h->broken)
            continue;
        h->broken = true;
        if (h->spec.tensor)
            snprintf(h->broken_why, sizeof h->broken_why,
                     "node %.8s, which ran shard %d of %d of %.64s, is down", node, k,
                     h->spec.n_stages, h->spec.model);
        else
            snprintf(h->broken_why, sizeof h->broken_why,
                     "node %.8s, which ran stage %d (layers %d-%d) of %.64s, is down", node, k,
                     h->spec.stage[k].first, h->spec.stage[k].last - 1, h->spec.model);
        rc_log(LOG_WARN, "pipeline: %s", h->broken_why);
        pthread_cond_broadcast(&h->cv);
    }
    for (stage_inst *si = p->stages; si; si = si->next)
        for (int q = 0; q < si->n_ranks; q++)
            if (q != si->rank && !strcmp(si->peers[q], node) && !si->peer_down) {
                si->peer_down = true;
                snprintf(si->peer_why, sizeof si->peer_why, "node %.8s, which ran shard %d of "
                         "%.64s, is down", node, q, si->model_name);
                pthread_cond_signal(&si->cv);
            }
    for (stage_inst *si = p->stages; si; si = si->next)
        if (!strcmp(si->head, node) && !si->stop) {
            rc_log(LOG_WARN, "pipeline: the head %.8s of stage %d of %s is down; stopping it",
                   node, si->index, log_clean(si->model_name));
            si->stop = true;
            pthread_cond_signal(&si->cv);
        }
    pthread_mutex_unlock(&p->mu);
}

int pipeline_new(struct cluster *c, int n_threads, pipeline **out)
{
    *out = NULL;
    pipeline *p = rc_calloc(1, sizeof *p);
    if (!p)
        return rc_fail(RC_ENOMEM, "out of memory");
    p->c = c;
    p->n_threads = n_threads;
    snprintf(p->self, sizeof p->self, "%s", cluster_self_id(c));
    pthread_mutex_init(&p->mu, NULL);
    int rc = cluster_add_handler(c, 0x40, 0x4f, on_msg, p);
    if (!rc)
        rc = cluster_add_down_handler(c, on_down, p);
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        rc_free(p);
        return rc;
    }
    cluster_set_channel_handler(c, pl__on_channel, p);
    *out = p;
    return 0;
}

void pipeline_stop(pipeline *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    for (stage_inst *si = p->stages; si; si = si->next) {
        si->stop = true;
        pthread_cond_signal(&si->cv);
    }
    pthread_mutex_unlock(&p->mu);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        bool all = true;
        for (stage_inst *si = p->stages; si; si = si->next)
            all = all && si->done;
        if (all)
            pl__reap_locked(p);
        pthread_mutex_unlock(&p->mu);
        if (all)
            break;
        struct timespec ts = { 0, 5000000L };
        nanosleep(&ts, NULL);
    }
}

void pipeline_free(pipeline *p)
{
    if (!p)
        return;
    pipeline_stop(p);
    while (p->pend) {
        pend_chan *e = p->pend;
        p->pend = e->next;
        chan_free(e->ch);
        rc_free(e);
    }
    pthread_mutex_destroy(&p->mu);
    rc_free(p);
}

void pipeline_set_weights(pipeline *p, weights *w)
{
    p->w = w;
}

json_t *pipeline_status(pipeline *p)
{
    json_t *heads = json_array(), *stages = json_array();
    pthread_mutex_lock(&p->mu);
    for (head_exec *h = p->execs; h; h = h->next) {
        json_t *st = json_array();
        for (int k = 0; k < h->spec.n_stages; k++)
            json_array_append_new(st, json_pack("{s:s, s:i, s:i, s:b}", "node",
                                                h->spec.stage[k].node, "first",
                                                h->spec.stage[k].first, "last",
                                                h->spec.stage[k].last, "ready",
                                                h->stage_ok[k]));
        json_array_append_new(heads, json_pack("{s:I, s:s, s:o, s:b, s:s, s:I, s:s, s:s}",
                                               "instance", (json_int_t)h->inst, "model",
                                               h->spec.model, "stages", st, "broken", h->broken,
                                               "error", h->broken_why, "batches",
                                               (json_int_t)h->batches, "wire",
                                               h->spec.wire_f32 ? "f32" : "f16", "split",
                                               h->spec.tensor ? "tensor" : "layers"));
    }
    for (stage_inst *si = p->stages; si; si = si->next)
        if (!si->done) {
            int n_chan = 0;
            for (int q = 0; q < si->n_ranks; q++)
                n_chan += si->chan[q] != NULL;
            json_array_append_new(stages, json_pack("{s:s, s:I, s:s, s:i, s:i, s:i, s:b, s:I, "
                                                    "s:i}", "head", si->head, "instance",
                                                    (json_int_t)si->inst, "model",
                                                    si->model_name, "index", si->index, "first",
                                                    si->first, "last", si->last, "loaded",
                                                    si->st != NULL, "batches",
                                                    (json_int_t)si->batches, "channels", n_chan));
        }
    pthread_mutex_unlock(&p->mu);
    return json_pack("{s:o, s:o}", "instances", heads, "stages", stages);
}

void pipeline_traffic(pipeline *p, uint64_t *bytes_out, uint64_t *msgs_out)
{
    *bytes_out = atomic_load(&p->bytes_out);
    *msgs_out = atomic_load(&p->msgs_out);
}
