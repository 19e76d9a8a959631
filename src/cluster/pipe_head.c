/* pipe_head.c - the head side: pipeline_exec_new sets up the stages and
 * waits until they are ready; the executor it returns sends each
 * micro-batch group to the first stage (to every shard), and the results
 * the router brings back wait in the group's slot until the engine
 * collects them.
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/kv_types.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static head_exec *find_exec_locked(pipeline *p, uint32_t inst)
{
    for (head_exec *h = p->execs; h; h = h->next)
        if (h->inst == inst)
            return h;
    return NULL;
}

int pl__stage_of(const head_exec *h, const char *node)
{
    for (int k = 0; k < h->spec.n_stages; k++)
        if (!strcmp(h->spec.stage[k].node, node))
            return k;
    return -1;
}

void pl__on_ready(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    json_t *j = json_loadb((const char *)data, len, 0, NULL);
    json_int_t inst = -1, index = -1;
    int ok = 0;
    const char *error = "";
    if (!j || json_unpack(j, "{s:I, s:I, s:b, s?s}", "inst", &inst, "index", &index, "ok", &ok,
                          "error", &error)) {
        json_decref(j);
        return;
    }
    pthread_mutex_lock(&p->mu);
    head_exec *h = find_exec_locked(p, (uint32_t)inst);
    if (h && index >= 0 && index < h->spec.n_stages && !strcmp(h->spec.stage[index].node, from)) {
        if (ok) {
            if (!h->stage_ok[index]) {
                h->stage_ok[index] = true;
                h->n_ready++;
            }
        } else if (!h->stage_err[0] && h->spec.tensor) {
            snprintf(h->stage_err, sizeof h->stage_err, "shard %d of %d on node %.8s: %s",
                     (int)index, h->spec.n_stages, from, error);
        } else if (!h->stage_err[0]) {
            snprintf(h->stage_err, sizeof h->stage_err, "stage %d (layers %d-%d) on node %.8s: %s",
                     (int)index, h->spec.stage[index].first, h->spec.stage[index].last - 1, from,
                     error);
        }
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&p->mu);
    json_decref(j);
}

void pl__on_result(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    rbuf r = { .p = data, .len = len };
    uint32_t inst = rb_u32(&r), group = rb_u32(&r), status = rb_u32(&r), n = rb_u32(&r);
    if (r.bad)
        return;
    pthread_mutex_lock(&p->mu);
    head_exec *h = find_exec_locked(p, inst);
    /* any node of the plan may report a failure; tokens come only from the
     * one that samples (the last stage, shard 0) */
    int k = h ? pl__stage_of(h, from) : -1;
    bool samples = h && k == (h->spec.tensor ? 0 : h->spec.n_stages - 1);
    if (!h || k < 0 || (status == 0 && !samples)) {
        pthread_mutex_unlock(&p->mu);
        if (h)                    /* (a stopped instance's late results are no one's fault) */
            pl__refuse(p, from, PIPE_RESULT, "%s for instance %u, %s",
                       status ? "an error" : "tokens", inst,
                       k < 0 ? "whose plan does not include that node"
                             : "whose tokens come from another node of its plan");
        return;
    }
    if (group >= (uint32_t)h->x.n_groups || !h->groups[group].sent || h->groups[group].ready) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    head_group *g = &h->groups[group];
    g->status = 0;
    g->n = 0;
    if (status != 0) {
        size_t tl = len - r.off < sizeof g->error - 1 ? len - r.off : sizeof g->error - 1;
        memcpy(g->error, data + r.off, tl);
        g->error[tl] = 0;
        g->status = RC_EIO;
        /* a shard that failed mid-batch has left its peers' sums and caches
         * behind: the instance cannot go on (the next request re-places it) */
        if (h->spec.tensor && !h->broken) {
            h->broken = true;
            snprintf(h->broken_why, sizeof h->broken_why, "%s", g->error);
            rc_log(LOG_WARN, "pipeline: instance %u of %s: %s", h->inst, h->spec.model, g->error);
        }
    } else if (n > (uint32_t)h->spec.n_seq) {
        snprintf(g->error, sizeof g->error, "the last stage sent %u rows", n);
        g->status = RC_EFORMAT;
    } else if (h->spec.pooling) {
        /* (2.2) an embedding model's rows: each a pooled vector, f32 */
        const size_t E = (size_t)h->spec.n_embd;
        for (uint32_t i = 0; i < n && !r.bad; i++) {
            const uint8_t *v = rb_get(&r, E * 4);
            if (v)
                memcpy(g->vecs + i * E, v, E * 4);
            g->rows[i] = (exec_sampled){ .embd = g->vecs + i * E };
        }
        if (r.bad || r.off != len) {
            snprintf(g->error, sizeof g->error, "malformed result from the last stage (an "
                     "embedding model's needs protocol 2.2 there)");
            g->status = RC_EFORMAT;
        }
        g->n = (int)n;
    } else {
        for (uint32_t i = 0; i < n && !r.bad; i++) {
            exec_sampled *x = &g->rows[i];
            x->token = rb_i32(&r);
            x->logprob = rb_f32(&r);
            x->n_top = rb_i32(&r);
            if (x->n_top < 0 || x->n_top > EXEC_MAX_TOP) {
                r.bad = true;
                break;
            }
            for (int t = 0; t < x->n_top; t++) {
                x->top_ids[t] = rb_i32(&r);
                x->top_lp[t] = rb_f32(&r);
            }
        }
        if (r.bad || r.off != len) {
            snprintf(g->error, sizeof g->error, "malformed result from the last stage");
            g->status = RC_EFORMAT;
        }
        g->n = (int)n;
    }
    g->ready = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&p->mu);
}

static int head_submit(engine_exec *x, const exec_batch *b)
{
    head_exec *h = (head_exec *)x;
    pipeline *p = h->p;
    wbuf w = { .p = h->buf, .cap = h->cap };
    uint8_t self_raw[WIRE_ID_BYTES];
    wire_unhex(p->self, self_raw, WIRE_ID_BYTES);
    wb_put(&w, self_raw, WIRE_ID_BYTES);
    wb_u32(&w, h->inst);
    wb_u32(&w, (uint32_t)b->group);
    uint32_t flags = 0;
    for (int i = 0; i < b->n_starts; i++)
        flags |= (b->starts[i].n_generated > 0 ? ENC_STARTS_GENERATED : 0) |
                 (b->starts[i].grammar ? ENC_STARTS_GRAMMAR : 0);
    wb_u32(&w, ENC_NONE | flags);
    wb_u32(&w, (uint32_t)b->n_starts);
    wb_u32(&w, (uint32_t)b->rows.n_rows);
    for (int i = 0; i < b->n_starts; i++)
        pl__put_start(&w, &b->starts[i], flags);
    const int n = b->rows.n_rows;
    wb_put(&w, b->rows.token, (size_t)n * 4);
    wb_put(&w, b->rows.pos, (size_t)n * 4);
    wb_put(&w, b->rows.seq, (size_t)n * 4);
    wb_put(&w, b->rows.logits, (size_t)n);
    h->buf = w.p;
    h->cap = w.cap;
    if (w.oom)
        return rc_fail(RC_ENOMEM, "out of memory for a pipeline batch");
    pthread_mutex_lock(&p->mu);
    bool broken = h->broken;
    head_group *g = &h->groups[b->group];
    g->sent = true;
    g->ready = false;
    pthread_mutex_unlock(&p->mu);
    if (broken)
        return 0;              /* collect reports it */
    /* a pipeline's batch enters at its first stage; shards all take it */
    for (int k = 0; k < (h->spec.tensor ? h->spec.n_stages : 1); k++)
        if (pl__send_to(p, h->spec.stage[k].node, PIPE_BATCH, w.p, w.len)) {
            pthread_mutex_lock(&p->mu);
            g->sent = false;
            pthread_mutex_unlock(&p->mu);
            return rc_fail(RC_EIO, "cannot reach the node %.8s of %s %d", h->spec.stage[k].node,
                           h->spec.tensor ? "shard" : "stage", k);
        }
    h->batches++;
    return 0;
}

static int head_collect(engine_exec *x, int timeout_ms, int *group, const exec_sampled **rows,
                        int *n)
{
    head_exec *h = (head_exec *)x;
    pipeline *p = h->p;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    for (;;) {
        for (int g = 0; g < x->n_groups; g++) {
            head_group *hg = &h->groups[g];
            if (hg->sent && (hg->ready || h->broken)) {
                int rc = 1;
                if (!hg->ready) {
                    rc = rc_fail(RC_EIO, "%s", h->broken_why);
                } else if (hg->status) {
                    rc = rc_fail(hg->status, "%s", hg->error);
                }
                hg->sent = hg->ready = false;
                *group = g;
                *rows = hg->rows;
                *n = hg->n;
                pthread_mutex_unlock(&p->mu);
                return rc;
            }
        }
        if (h->woken || timeout_ms <= 0)
            break;
        if (pthread_cond_timedwait(&h->cv, &p->mu, &dl))
            break;
    }
    h->woken = false;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static void head_wake(engine_exec *x)
{
    head_exec *h = (head_exec *)x;
    pthread_mutex_lock(&h->p->mu);
    h->woken = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->p->mu);
}

static void head_free(engine_exec *x)
{
    head_exec *h = (head_exec *)x;
    if (!h)
        return;
    pipeline *p = h->p;
    for (int k = 0; k < h->spec.n_stages; k++)
        pl__send_to(p, h->spec.stage[k].node, PIPE_STOP, &h->inst, 4);
    pthread_mutex_lock(&p->mu);
    for (head_exec **pp = &p->execs; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    pthread_mutex_unlock(&p->mu);
    if (h->groups)
        for (int g = 0; g < x->n_groups; g++) {
            rc_free(h->groups[g].rows);
            rc_free(h->groups[g].vecs);
        }
    rc_free(h->groups);
    rc_free(h->buf);
    pthread_cond_destroy(&h->cv);
    rc_log(LOG_INFO, "pipeline: instance %u of %s stopped after %llu batches", h->inst,
           h->spec.model, (unsigned long long)h->batches);
    rc_free(h);
}

bool pipeline_exec_broken(engine_exec *x)
{
    head_exec *h = (head_exec *)x;
    pthread_mutex_lock(&h->p->mu);
    bool b = h->broken;
    pthread_mutex_unlock(&h->p->mu);
    return b;
}

static int send_setup(pipeline *p, head_exec *h, int k)
{
    const pipeline_spec *s = &h->spec;
    json_t *shards = NULL;
    if (s->tensor) {
        shards = json_array();
        for (int q = 0; q < s->n_stages; q++)
            json_array_append_new(shards, json_string(s->stage[q].node));
    }
    json_t *j = json_pack("{s:I, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:o*}",
                          "inst", (json_int_t)h->inst, "index", k, "model", s->model, "first",
                          s->stage[k].first, "last", s->stage[k].last, "n_ctx", s->n_ctx,
                          "n_seq", s->n_seq, "n_batch", s->n_batch, "threads", s->n_threads,
                          "n_embd", s->n_embd, "wire", s->wire_f32 ? "f32" : "f16", "next",
                          k + 1 < s->n_stages && !s->tensor ? s->stage[k + 1].node : "",
                          "n_stages", s->n_stages, "shards", shards);
    if (j && shards && !s->test_old_cut)
        json_object_set_new(j, "cut", json_integer(SHARD_CUT));
    /* who feeds stage k its batches: it takes them from no one else */
    if (j && k > 0 && !s->tensor)
        json_object_set_new(j, "prev", json_string(s->stage[k - 1].node));
    if (j && h->digest[0])
        json_object_set_new(j, "digest", json_string(h->digest));
    /* (2.1) the cache type; a 2.0 stage ignores it and keeps f32 */
    if (j)
        json_object_set_new(j, "cache", json_string(kv_type_name(s->kv_type)));
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!txt)
        return rc_fail(RC_ENOMEM, "out of memory");
    int rc = pl__send_to(p, s->stage[k].node, PIPE_SETUP, txt, strlen(txt));
    free(txt);
    if (rc)
        return rc_fail(RC_EIO, "stage %d (layers %d-%d): node %.8s is not reachable", k,
                       s->stage[k].first, s->stage[k].last - 1, s->stage[k].node);
    return 0;
}

int pipeline_exec_new(pipeline *p, const pipeline_spec *spec, int timeout_ms,
                      void (*progress)(void *ud, const char *line), void *ud,
                      engine_exec **out)
{
    *out = NULL;
    if (spec->n_stages < 1 || spec->n_stages > PIPELINE_MAX_STAGES)
        return rc_fail(RC_EINVAL, "a pipeline needs 1 to %d stages", PIPELINE_MAX_STAGES);
    for (int k = 0; k < spec->n_stages; k++)
        if (spec->tensor ? spec->stage[k].first != 0 || spec->stage[k].last != spec->n_layer
                         : spec->stage[k].first != (k ? spec->stage[k - 1].last : 0) ||
                               spec->stage[k].last <= spec->stage[k].first)
            return rc_fail(RC_EINVAL, spec->tensor ? "every tensor-parallel shard runs all layers"
                                                   : "pipeline stages must cover the layers in order");
    if (spec->tensor && spec->n_stages < 2)
        return rc_fail(RC_EINVAL, "tensor parallelism needs 2 or more shards");
    if (spec->tensor && spec->pooling)
        return rc_fail(RC_EINVAL, "an embedding model is split by layers, not by tensor "
                       "parallelism");
    if (spec->stage[spec->n_stages - 1].last != spec->n_layer)
        return rc_fail(RC_EINVAL, "pipeline stages end at layer %d of %d",
                       spec->stage[spec->n_stages - 1].last, spec->n_layer);
    head_exec *h = rc_calloc(1, sizeof *h);
    if (!h)
        return rc_fail(RC_ENOMEM, "out of memory");
    /* a pipeline keeps one micro-batch per stage in flight; shards all
     * work on the same batch */
    int G = spec->tensor ? 1 : spec->n_stages < spec->n_seq ? spec->n_stages : spec->n_seq;
    h->x = (engine_exec){ .n_groups = G, .submit = head_submit, .collect = head_collect,
                          .wake = head_wake, .broken = pipeline_exec_broken, .free = head_free,
                          .n_embd_out = spec->pooling ? spec->n_embd : 0 };
    h->p = p;
    h->spec = *spec;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    h->groups = rc_calloc((size_t)G, sizeof *h->groups);
    for (int g = 0; h->groups && g < G; g++)
        if (!(h->groups[g].rows = rc_calloc((size_t)spec->n_seq, sizeof(exec_sampled))) ||
            (spec->pooling && !(h->groups[g].vecs = rc_calloc((size_t)spec->n_seq *
                                                                  (size_t)spec->n_embd,
                                                              sizeof(float)))))
            break;
    bool oom = !h->groups;
    for (int g = 0; !oom && g < G; g++)
        oom = !h->groups[g].rows || (spec->pooling && !h->groups[g].vecs);
    pthread_mutex_lock(&p->mu);
    h->inst = ++p->next_inst;
    h->next = p->execs;
    p->execs = h;
    pthread_mutex_unlock(&p->mu);
    if (oom) {
        head_free(&h->x);
        return rc_fail(RC_ENOMEM, "out of memory");
    }
    /* the digest every stage that pulls checks the blocks against: this
     * node's, never the serving peer's (weights.h) */
    uint8_t root[DIGEST_BYTES];
    if (p->w && !weights_model_root(p->w, spec->model, root))
        digests_hex(root, h->digest);
    else if (p->w)
        rc_log(LOG_WARN, "pipeline: %s; stages that lack the model will not pull it",
               rc_errmsg());
    int rc = 0;
    for (int k = 0; k < spec->n_stages && !rc; k++)
        rc = send_setup(p, h, k);
    uint64_t deadline = os_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int reported = 0;
    pthread_mutex_lock(&p->mu);
    while (!rc && h->n_ready < spec->n_stages) {
        if (h->stage_err[0]) {
            rc = rc_fail(RC_EIO, "%s", h->stage_err);
            break;
        }
        if (h->broken) {
            rc = rc_fail(RC_EIO, "%s", h->broken_why);
            break;
        }
        if (os_now_ns() >= deadline) {
            rc = rc_fail(RC_ELIMIT, "%d of %d stages were ready after %d s", h->n_ready,
                         spec->n_stages, timeout_ms / 1000);
            break;
        }
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += 200000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->cv, &p->mu, &dl);
        while (progress && reported < h->n_ready) {
            reported++;
            char line[160];
            snprintf(line, sizeof line, "%d of %d pipeline stages ready", reported, spec->n_stages);
            pthread_mutex_unlock(&p->mu);
            progress(ud, line);
            pthread_mutex_lock(&p->mu);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        head_free(&h->x);
        return rc;
    }
    *out = &h->x;
    return 0;
}
