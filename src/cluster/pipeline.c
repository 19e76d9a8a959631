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

#include "base/os.h"

#include <pthread.h>
#include <stdarg.h>
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

static const char *type_name(int type)
{
    static const char *const names[] = { "SETUP", "READY", "BATCH", "RESULT", "STOP",
                                         "PARTIAL", "BIND" };
    return type >= PIPE_SETUP && type <= PIPE_BIND ? names[type - PIPE_SETUP] : "message";
}

/* The name node `id` gives itself in the view, printable characters only
 * (it is the peer's to choose). */
static void node_name(pipeline *p, const char *id, char *out, size_t cap)
{
    json_t *snap = cluster_snapshot(p->c), *n;
    size_t i, k = 0;
    const char *name = "?";
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "id"));
        const char *nn = json_string_value(json_object_get(n, "name"));
        if (nid && nn && !strcmp(nid, id))
            name = nn;
    }
    for (; name[k] && k + 1 < cap; k++)
        out[k] = name[k] > 0x20 && name[k] < 0x7f ? name[k] : '?';
    out[k] = 0;
    json_decref(snap);
}

void pl__refuse(pipeline *p, const char *from, int type, const char *fmt, ...)
{
    uint64_t now = os_now_ns();
    unsigned quiet = 0;
    pthread_mutex_lock(&p->log_mu);
    struct refusal *r = NULL, *oldest = &p->refused[0];
    for (size_t i = 0; i < sizeof p->refused / sizeof p->refused[0]; i++) {
        struct refusal *e = &p->refused[i];
        if (e->type == type && !strcmp(e->from, from))
            r = e;
        if (e->t_ns < oldest->t_ns)
            oldest = e;
    }
    if (r && now - r->t_ns < 1000000000ull) {
        r->quiet++;
        pthread_mutex_unlock(&p->log_mu);
        return;
    }
    if (!r) {
        r = oldest;
        snprintf(r->from, sizeof r->from, "%s", from);
        r->type = type;
        r->quiet = 0;
    }
    quiet = r->quiet;
    r->quiet = 0;
    r->t_ns = now;
    pthread_mutex_unlock(&p->log_mu);
    char why[300], name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    node_name(p, from, name, sizeof name);
    if (quiet)
        rc_log(LOG_WARN, "pipeline: refused a %s from node %.8s (%s): %s (and %u more from it "
               "since the last such line)", type_name(type), from, name, why, quiet);
    else
        rc_log(LOG_WARN, "pipeline: refused a %s from node %.8s (%s): %s", type_name(type), from,
               name, why);
}

bool pl__enqueue_locked(stage_inst *si, msg **head, msg **tail, int *n, size_t *bytes, msg *m,
                        const uint8_t *data, size_t len)
{
    if (*n > 0 && (*n >= QUEUE_MAX_MSGS || *bytes + len > QUEUE_MAX_BYTES))
        return false;
    m->next = NULL;
    m->len = len;
    memcpy(m->data, data, len);
    if (*tail)
        (*tail)->next = m;
    else
        *head = m;
    *tail = m;
    (*n)++;
    *bytes += len;
    pthread_cond_signal(&si->cv);
    return true;
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
    char who[96];
    cluster_node_label(p->c, node, who, sizeof who);
    pthread_mutex_lock(&p->mu);
    for (head_exec *h = p->execs; h; h = h->next) {
        int k = pl__stage_of(h, node);
        if (k < 0 || h->broken)
            continue;
        h->broken = true;
        if (h->spec.tensor)
            snprintf(h->broken_why, sizeof h->broken_why,
                     "node %s, which ran shard %d of %d of %.64s, is down", who, k,
                     h->spec.n_stages, h->spec.model);
        else
            snprintf(h->broken_why, sizeof h->broken_why,
                     "node %s, which ran stage %d (layers %d-%d) of %.64s, is down", who, k,
                     h->spec.stage[k].first, h->spec.stage[k].last - 1, h->spec.model);
        rc_log(LOG_WARN, "pipeline: %s", h->broken_why);
        pthread_cond_broadcast(&h->cv);
    }
    for (stage_inst *si = p->stages; si; si = si->next)
        for (int q = 0; q < si->n_ranks; q++)
            if (q != si->rank && !strcmp(si->peers[q], node) && !si->peer_down) {
                si->peer_down = true;
                snprintf(si->peer_why, sizeof si->peer_why, "node %s, which ran shard %d of "
                         "%.64s, is down", who, q, si->model_name);
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
    pthread_mutex_init(&p->log_mu, NULL);
    int rc = cluster_add_handler(c, 0x40, 0x4f, on_msg, p);
    if (!rc)
        rc = cluster_add_down_handler(c, on_down, p);
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        pthread_mutex_destroy(&p->log_mu);
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
    /* (it sends through the cluster, which is freed next) */
    if (p->inject_started) {
        pthread_join(p->inject, NULL);
        p->inject_started = false;
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
    pthread_mutex_destroy(&p->log_mu);
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

int pipeline_plan_slots(pipeline *p, const char *head, const char *model_name)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (stage_inst *si = p->stages; si; si = si->next)
        if (!si->stop && !si->done && !strcmp(si->head, head) &&
            !strcmp(si->model_name, model_name) && si->n_seq > n)
            n = si->n_seq;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void pipeline_traffic(pipeline *p, uint64_t *bytes_out, uint64_t *msgs_out)
{
    *bytes_out = atomic_load(&p->bytes_out);
    *msgs_out = atomic_load(&p->msgs_out);
}
