/* pipeline.c - stages of one model on several nodes.
 *
 * Tensor parallel (spec.tensor): the stages are shards of every layer.  The
 * head sends each batch to all of them; inside the forward pass every
 * shard sends its part of each sub-block's output to every other shard and
 * waits for theirs (PIPE_PARTIAL, in order per link, numbered), and all add
 * the parts in shard order, so all go on with the same numbers; at the end
 * shards 1.. send their columns of the logits to shard 0, which samples and
 * answers the head.  (pipeline_internal.h: ordering, threads, the files.)
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "infer/stage.h"
#include "model/model.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- encoding ---- */

/* ---- the stage side ---- */

static void stage_send_ready(stage_inst *si, bool ok, const char *error)
{
    json_t *j = json_pack("{s:I, s:i, s:b, s:s, s:I}", "inst", (json_int_t)si->inst, "index",
                          si->index, "ok", ok, "error", error ? error : "", "weight_bytes",
                          (json_int_t)(si->m ? si->m->weight_bytes : 0));
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt)
        pl__send_to(si->p, si->head, PIPE_READY, txt, strlen(txt));
    free(txt);
    json_decref(j);
}

static void stage_send_error(stage_inst *si, uint32_t group, const char *why)
{
    wbuf w = { 0 };
    char text[300];
    if (si->n_ranks > 1)
        snprintf(text, sizeof text, "shard %d of %d on node %.8s: %s", si->rank, si->n_ranks,
                 si->p->self, why);
    else
        snprintf(text, sizeof text, "stage %d (layers %d-%d) on node %.8s: %s", si->index,
                 si->first, si->last - 1, si->p->self, why);
    wb_u32(&w, si->inst);
    wb_u32(&w, group);
    wb_u32(&w, 1);
    wb_u32(&w, 0);
    wb_put(&w, text, strlen(text));
    if (!w.oom)
        pl__send_to(si->p, si->head, PIPE_RESULT, w.p, w.len);
    rc_free(w.p);
}

static void pull_progress(void *ud, uint64_t done, uint64_t total, double bytes_per_s)
{
    stage_inst *si = ud;
    uint64_t now = os_now_ns();
    if (done < total && now - si->last_progress_ns < 1000000000ull)
        return;
    si->last_progress_ns = now;
    double left = bytes_per_s > 0 ? (double)(total - done) / bytes_per_s : 0;
    rc_log(LOG_INFO, "pipeline: pulling %s layers %d-%d: %.0f%% of %.1f MB, %.1f MB/s, %.0f s left",
           si->model_name, si->first, si->last - 1, total ? 100.0 * (double)done / (double)total : 100.0,
           (double)total / 1e6, bytes_per_s / 1e6, left);
}

static int stage_load(stage_inst *si)
{
    char path[1200];
    if (si->n_ranks > 1 && si->cut != SHARD_CUT)
        return rc_fail(RC_EUNSUPPORTED, "the head cuts tensor-parallel shards another way (cut "
                       "%d, protocol 1.2 or older; this node cuts %d): update the head's racimo",
                       si->cut, SHARD_CUT);
    int rc = cluster_model_path(si->p->c, si->model_name, path, sizeof path);
    if (rc == RC_ENOTFOUND && si->p->w)
        rc = weights_ensure_shard(si->p->w, si->model_name, si->first, si->last, si->rank,
                                  si->n_ranks, NULL, pull_progress, si, path, sizeof path);
    if (rc)
        return rc;
    if ((rc = model_load_shard(path, si->first, si->last, si->rank, si->n_ranks, &si->m)))
        return rc;
    const model_hparams *hp = &si->m->hp;
    if (hp->n_layer < si->last || hp->n_embd != si->n_embd_want)
        return rc_fail(RC_EINVAL, "%s here has %d layers of width %d, the head's has width %d",
                       path, hp->n_layer, hp->n_embd, si->n_embd_want);
    stage_params sp = { .n_ctx = si->n_ctx, .n_seq = si->n_seq, .n_batch = si->n_batch,
                        .n_threads = si->n_threads, .precision = MATMUL_FAST,
                        .reduce = pl__shard_reduce, .reduce_ud = si };
    if ((rc = stage_new(si->m, &sp, &si->st)))
        return rc;
    const size_t E = (size_t)hp->n_embd, B = (size_t)si->n_batch;
    bool last = si->last == hp->n_layer;
    si->in = rc_malloc(B * E * sizeof(float));
    si->out = rc_malloc((last ? (size_t)si->n_seq * (size_t)hp->n_vocab : B * E) * sizeof(float));
    if (!si->in || !si->out)
        return rc_fail(RC_ENOMEM, "out of memory for the stage's buffers");
    if (si->n_ranks > 1 && !(si->parts = rc_malloc((size_t)si->n_ranks * B * E * sizeof(float))))
        return rc_fail(RC_ENOMEM, "out of memory for the shard's sums");
    if (last && (rc = sample_set_new(si->n_seq, hp->n_vocab, &si->ss)))
        return rc;
    if (si->n_ranks > 1 && si->rank > 0) {
        si->unseen = rc_calloc((size_t)si->n_seq, sizeof *si->unseen);
        si->raw = rc_malloc(((size_t)si->m->shard.n_vocab + 1) * sizeof(float));
        si->heap = rc_malloc(CANDS_MAX * sizeof *si->heap);
        si->best = rc_malloc(CANDS_MAX * sizeof *si->best);
        if (!si->unseen || !si->raw || !si->heap || !si->best)
            return rc_fail(RC_ENOMEM, "out of memory for the shard's samplers");
        /* the samplers' bias and penalties touch other shards' columns of
         * a row too: let them read numbers */
        memset(si->out, 0, (size_t)si->n_seq * (size_t)hp->n_vocab * sizeof(float));
    }
    return 0;
}

/* Runs one batch message: starts, forward pass, then either the next
 * stage's batch or the head's result. */
static void stage_batch_run(stage_inst *si, const uint8_t *data, size_t len)
{
    rbuf r = { .p = data, .len = len };
    rb_get(&r, WIRE_ID_BYTES);
    rb_u32(&r);                                 /* instance: checked by the router */
    uint32_t group = rb_u32(&r), enc = rb_u32(&r), n_starts = rb_u32(&r),
             n_rows = rb_u32(&r);
    const model_hparams *hp = &si->m->hp;
    const int E = hp->n_embd;
    bool first = si->first == 0, last = si->last == hp->n_layer;
    char why[200] = "";
    if (r.bad || n_rows > (uint32_t)si->n_batch || n_starts > (uint32_t)si->n_seq) {
        stage_send_error(si, group, "malformed batch header");
        return;
    }
    for (uint32_t i = 0; i < n_starts; i++) {
        wire_start ws;
        pl__get_start(&r, &ws);
        if (r.bad) {
            stage_send_error(si, group, "malformed sequence start");
            return;
        }
        exec_start *s = &ws.s;
        if (s->seq < 0 || s->seq >= si->n_seq || s->keep < 0 || s->keep > si->n_ctx ||
            s->keep > stage_seq_len(si->st, s->seq)) {
            snprintf(why, sizeof why, "sequence start for slot %d keeping %d is out of range",
                     s->seq, s->keep);
            stage_send_error(si, group, why);
            return;
        }
        stage_seq_truncate(si->st, s->seq, s->keep);
        if (si->unseen)
            si->unseen[s->seq] = false;
        if (!si->ss)
            continue;
        int32_t *prompt = rc_malloc((size_t)s->n_prompt * 4 + 4);
        int32_t *ids = rc_malloc((size_t)s->sp.n_bias * 4 + 4);
        float *vals = rc_malloc((size_t)s->sp.n_bias * 4 + 4);
        int rc = RC_ENOMEM;
        if (prompt && ids && vals) {
            memcpy(prompt, s->prompt, (size_t)s->n_prompt * 4);
            for (int b = 0; b < s->sp.n_bias; b++) {
                memcpy(&ids[b], ws.bias + (size_t)b * 8, 4);
                memcpy(&vals[b], ws.bias + (size_t)b * 8 + 4, 4);
            }
            s->prompt = prompt;
            s->sp.bias_ids = ids;
            s->sp.bias_values = vals;
            rc = sample_set_start(si->ss, s);
        }
        rc_free(prompt);
        rc_free(ids);
        rc_free(vals);
        if (rc) {
            snprintf(why, sizeof why, "sequence start: %s", rc_errmsg());
            stage_send_error(si, group, why);
            return;
        }
    }
    size_t rows_off = r.off;
    const uint8_t *tok = rb_get(&r, (size_t)n_rows * 4), *pos = rb_get(&r, (size_t)n_rows * 4),
                  *seq = rb_get(&r, (size_t)n_rows * 4), *want = rb_get(&r, n_rows);
    size_t hidden_off = r.off;
    size_t esz = enc == ENC_F16 ? 2 : enc == ENC_F32 ? 4 : 0;
    if (r.bad || (first ? enc != ENC_NONE : esz == 0) ||
        len - hidden_off != (size_t)n_rows * (size_t)E * esz) {
        stage_send_error(si, group, "batch rows or hidden states have the wrong size");
        return;
    }
    if (n_rows == 0) {
        stage_send_error(si, group, "empty batch");
        return;
    }
    /* The message is not aligned for int32; copy the rows out. */
    int32_t *rt = rc_malloc((size_t)n_rows * 12 + (size_t)n_rows);
    if (!rt) {
        stage_send_error(si, group, "out of memory");
        return;
    }
    int32_t *rp = rt + n_rows, *rs = rp + n_rows;
    int8_t *rw = (int8_t *)(rs + n_rows);
    memcpy(rt, tok, (size_t)n_rows * 4);
    memcpy(rp, pos, (size_t)n_rows * 4);
    memcpy(rs, seq, (size_t)n_rows * 4);
    memcpy(rw, want, n_rows);
    int n_want = 0;
    for (uint32_t i = 0; i < n_rows; i++)
        n_want += rw[i] != 0;
    if (last && n_want > si->n_seq) {
        rc_free(rt);
        stage_send_error(si, group, "more rows ask for a token than there are sequences");
        return;
    }
    const uint8_t *h = data + hidden_off;
    if (esz == 2)
        pl__from_f16(h, si->in, (size_t)n_rows * (size_t)E);
    else if (esz == 4)
        memcpy(si->in, h, (size_t)n_rows * (size_t)E * 4);
    if (si->unseen)
        for (uint32_t i = 0; i < n_rows; i++)
            if (rs[i] >= 0 && rs[i] < si->n_seq && si->unseen[rs[i]]) {
                sample_set_accept(si->ss, rs[i], rt[i]);
                si->unseen[rs[i]] = false;
            }
    stage_batch b = { .n_rows = (int)n_rows, .token = rt, .pos = rp, .seq = rs, .logits = rw };
    int got = 0;
    uint64_t t0 = os_now_ns();
    int frc = stage_forward(si->st, &b, first ? NULL : si->in, si->out, &got);
    si->forward_ns += os_now_ns() - t0;
    if (frc) {
        snprintf(why, sizeof why, "%s", rc_errmsg());
        rc_free(rt);
        stage_send_error(si, group, why);
        return;
    }
    si->batches++;
    if (si->n_ranks > 1) {
        if (pl__shard_gather(si, got, rs, rw, (int)n_rows)) {
            snprintf(why, sizeof why, "%s", rc_errmsg());
            rc_free(rt);
            stage_send_error(si, group, why);
            return;
        }
        if (si->rank > 0) {       /* shard 0 answers the head */
            rc_free(rt);
            return;
        }
    }
    wbuf w = { .p = si->wbuf, .cap = si->wcap };
    if (last) {
        wb_u32(&w, si->inst);
        wb_u32(&w, group);
        wb_u32(&w, 0);
        wb_u32(&w, (uint32_t)got);
        int k = 0;
        for (uint32_t i = 0; i < n_rows && k < got; i++) {
            if (!rw[i])
                continue;
            exec_sampled x;
            if (sample_set_sample(si->ss, rs[i], si->out + (size_t)k * (size_t)hp->n_vocab, &x)) {
                snprintf(why, sizeof why, "%s", rc_errmsg());
                break;
            }
            wb_i32(&w, x.token);
            wb_f32(&w, x.logprob);
            wb_i32(&w, x.n_top);
            for (int t = 0; t < x.n_top; t++) {
                wb_i32(&w, x.top_ids[t]);
                wb_f32(&w, x.top_lp[t]);
            }
            k++;
        }
        rc_free(rt);
        si->wbuf = w.p;
        si->wcap = w.cap;
        if (why[0] || w.oom) {
            stage_send_error(si, group, why[0] ? why : "out of memory");
            return;
        }
        pl__send_to(si->p, si->head, PIPE_RESULT, w.p, w.len);
        return;
    }
    rc_free(rt);
    /* Next stage: the same header, starts and rows, then our output. */
    wb_put(&w, data, hidden_off);
    if (!w.oom) {
        uint32_t e = si->wire_f32 ? ENC_F32 : ENC_F16;
        memcpy(w.p + WIRE_ID_BYTES + 8, &e, 4);
    }
    (void)rows_off;
    if (si->wire_f32) {
        wb_put(&w, si->out, (size_t)n_rows * (size_t)E * 4);
    } else {
        uint8_t *d = wb_grow(&w, (size_t)n_rows * (size_t)E * 2);
        if (d)
            pl__to_f16(si->out, d, (size_t)n_rows * (size_t)E);
    }
    si->wbuf = w.p;
    si->wcap = w.cap;
    if (w.oom) {
        stage_send_error(si, group, "out of memory");
        return;
    }
    if (pl__send_to(si->p, si->next_node, PIPE_BATCH, w.p, w.len)) {
        snprintf(why, sizeof why, "cannot reach the next stage's node %.8s: %s", si->next_node,
                 rc_errmsg());
        stage_send_error(si, group, why);
    }
}

static void stage_inst_release(stage_inst *si)
{
    sample_set_free(si->ss);
    stage_free(si->st);
    model_free(si->m);
    rc_free(si->in);
    rc_free(si->out);
    rc_free(si->wbuf);
    rc_free(si->parts);
    rc_free(si->pbuf);
    rc_free(si->unseen);
    rc_free(si->raw);
    rc_free(si->heap);
    rc_free(si->best);
    si->unseen = NULL;
    si->raw = NULL;
    si->heap = NULL;
    si->best = NULL;
    /* the cluster thread may be handing a channel over right now */
    cluster_chan *ch[PIPELINE_MAX_STAGES];
    pthread_mutex_lock(&si->p->mu);
    memcpy(ch, si->chan, sizeof ch);
    memset(si->chan, 0, sizeof si->chan);
    pthread_mutex_unlock(&si->p->mu);
    for (int q = 0; q < PIPELINE_MAX_STAGES; q++)
        chan_free(ch[q]);
    si->parts = NULL;
    si->pbuf = NULL;
    si->ss = NULL;
    si->st = NULL;
    si->m = NULL;
    si->in = si->out = NULL;
    si->wbuf = NULL;
}

static void free_queue(msg **head, msg **tail)
{
    for (msg *m = *head, *n; m; m = n) {
        n = m->next;
        rc_free(m);
    }
    *head = *tail = NULL;
}

static void *stage_thread(void *arg)
{
    stage_inst *si = arg;
    pipeline *p = si->p;
    uint64_t t0 = os_now_ns();
    int rc = stage_load(si);
    if (!rc && si->n_ranks > 1)
        rc = pl__shard_link(si);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", rc_errmsg());
        rc_log(LOG_ERROR, "pipeline: stage %d of %s (layers %d-%d) failed to load: %s",
               si->index, si->model_name, si->first, si->last - 1, why);
        stage_send_ready(si, false, why);
        stage_inst_release(si);
    } else {
        rc_log(LOG_INFO, "pipeline: stage %d of %s (layers %d-%d, %.1f MiB) ready in %.1f s",
               si->index, si->model_name, si->first, si->last - 1,
               (double)si->m->weight_bytes / 1048576.0, (double)(os_now_ns() - t0) * 1e-9);
        stage_send_ready(si, true, NULL);
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!si->q_head && !si->stop)
            pthread_cond_wait(&si->cv, &p->mu);
        msg *m = si->q_head;
        if (si->stop || !m) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        si->q_head = m->next;
        if (!si->q_head)
            si->q_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        if (si->st) {
            uint64_t t_run = os_now_ns();
            stage_batch_run(si, m->data, m->len);
            si->run_ns += os_now_ns() - t_run;
        } else {
            rbuf r = { .p = m->data, .len = m->len };
            rb_get(&r, WIRE_ID_BYTES + 4);
            stage_send_error(si, rb_u32(&r), "the stage failed to load");
        }
        rc_free(m);
    }
    stage_inst_release(si);
    pthread_mutex_lock(&p->mu);
    free_queue(&si->q_head, &si->q_tail);
    for (int q = 0; q < si->n_ranks; q++)
        free_queue(&si->pq_head[q], &si->pq_tail[q]);
    si->done = true;
    pthread_mutex_unlock(&p->mu);
    if (si->n_ranks > 1)
        rc_log(LOG_INFO, "pipeline: shard %d of %d of %s stopped after %llu batches and %llu "
               "parts; %.1f s on batches, %.1f s of it in forward passes, of which %.1f s "
               "waiting for the other shards' parts", si->rank, si->n_ranks, si->model_name,
               (unsigned long long)si->batches, (unsigned long long)si->n_parts,
               (double)si->run_ns * 1e-9, (double)si->forward_ns * 1e-9,
               (double)si->wait_ns * 1e-9);
    else
        rc_log(LOG_INFO, "pipeline: stage %d of %s stopped after %llu batches; %.1f s on "
               "batches, %.1f s of it in forward passes", si->index, si->model_name,
               (unsigned long long)si->batches, (double)si->run_ns * 1e-9,
               (double)si->forward_ns * 1e-9);
    return NULL;
}

/* Joins and frees stages whose threads ended (mu held by the caller is not
 * needed: called from the handler with mu held, threads already done). */
static void reap_locked(pipeline *p)
{
    for (stage_inst **pp = &p->stages; *pp;) {
        stage_inst *si = *pp;
        if (si->done) {
            *pp = si->next;
            pthread_join(si->thread, NULL);
            pthread_cond_destroy(&si->cv);
            rc_free(si);
        } else {
            pp = &si->next;
        }
    }
}

stage_inst *pl__find_stage_locked(pipeline *p, const char *head, uint32_t inst)
{
    for (stage_inst *si = p->stages; si; si = si->next)
        if (si->inst == inst && !strcmp(si->head, head) && !si->stop)
            return si;
    return NULL;
}

static void on_setup(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data, len, 0, &jerr);
    json_int_t inst = -1, index = -1, first = -1, last = -1, n_ctx = 0, n_seq = 0, n_batch = 0,
               threads = 0, n_embd = 0, n_stages = 0;
    const char *model_name = NULL, *next = NULL, *wire_enc = NULL;
    json_t *shards = NULL;
    json_int_t cut = 0;
    if (!j || json_unpack(j, "{s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s?o, s?I}",
                          "inst", &inst, "index", &index, "model", &model_name, "first", &first,
                          "last", &last, "n_ctx", &n_ctx, "n_seq", &n_seq, "n_batch", &n_batch,
                          "threads", &threads, "n_embd", &n_embd, "wire", &wire_enc, "next",
                          &next, "n_stages", &n_stages, "shards", &shards, "cut", &cut) ||
        (shards && (!json_is_array(shards) || json_array_size(shards) < 2 ||
                    json_array_size(shards) > PIPELINE_MAX_STAGES ||
                    (size_t)index >= json_array_size(shards))) ||
        inst < 0 || inst > UINT32_MAX || index < 0 || index >= PIPELINE_MAX_STAGES ||
        first < 0 || last <= first || last > 100000 || n_ctx <= 0 || n_ctx > (1 << 24) ||
        n_seq <= 0 || n_seq > 4096 || n_batch <= 0 || n_batch > 65536 || threads < 0 ||
        threads > 1024 || n_embd <= 0 || strlen(model_name) >= 256 || strlen(next) > 32) {
        rc_log(LOG_WARN, "pipeline: malformed stage set-up from %.8s", from);
        json_decref(j);
        return;
    }
    stage_inst *si = rc_calloc(1, sizeof *si);
    if (!si) {
        json_decref(j);
        return;
    }
    si->p = p;
    snprintf(si->head, sizeof si->head, "%s", from);
    wire_unhex(from, si->head_raw, WIRE_ID_BYTES);
    si->inst = (uint32_t)inst;
    si->index = (int)index;
    si->n_stages = (int)n_stages;
    snprintf(si->model_name, sizeof si->model_name, "%s", model_name);
    snprintf(si->next_node, sizeof si->next_node, "%s", next);
    si->first = (int)first;
    si->last = (int)last;
    si->n_ctx = (int)n_ctx;
    si->n_seq = (int)n_seq;
    si->n_batch = (int)n_batch;
    si->n_threads = threads > 0 ? (int)threads : p->n_threads > 0 ? p->n_threads
                                                                  : os_n_physical_cores();
    si->n_embd_want = (int)n_embd;
    si->wire_f32 = !strcmp(wire_enc, "f32");
    si->cut = (int)cut;
    si->n_ranks = 1;
    if (shards) {
        si->n_ranks = (int)json_array_size(shards);
        si->rank = si->index;
        for (int q = 0; q < si->n_ranks; q++) {
            const char *id = json_string_value(json_array_get(shards, (size_t)q));
            if (!id || strlen(id) != 32) {
                rc_log(LOG_WARN, "pipeline: malformed shard list in a set-up from %.8s", from);
                json_decref(j);
                rc_free(si);
                return;
            }
            snprintf(si->peers[q], sizeof si->peers[q], "%s", id);
        }
    }
    json_decref(j);
    pthread_cond_init(&si->cv, NULL);
    pthread_mutex_lock(&p->mu);
    reap_locked(p);
    stage_inst *old = pl__find_stage_locked(p, si->head, si->inst);
    if (old) {
        old->stop = true;
        pthread_cond_signal(&old->cv);
    }
    if (si->n_ranks > 1)
        rc_log(LOG_INFO, "pipeline: node %.8s asks for shard %d of %d of %s (every layer)", from,
               si->rank, si->n_ranks, si->model_name);
    else
        rc_log(LOG_INFO, "pipeline: node %.8s asks for stage %d of %s (layers %d-%d)", from,
               si->index, si->model_name, si->first, si->last - 1);
    if (pthread_create(&si->thread, NULL, stage_thread, si)) {
        pthread_mutex_unlock(&p->mu);
        pthread_cond_destroy(&si->cv);
        rc_free(si);
        return;
    }
    si->next = p->stages;
    p->stages = si;
    pl__pend_adopt_locked(p, si);
    pthread_mutex_unlock(&p->mu);
}

/* A copy of a message for a queue of a stage (mu held). */
static void enqueue_locked(stage_inst *si, msg **head, msg **tail, msg *m, const uint8_t *data,
                           size_t len)
{
    m->next = NULL;
    m->len = len;
    memcpy(m->data, data, len);
    if (*tail)
        (*tail)->next = m;
    else
        *head = m;
    *tail = m;
    pthread_cond_signal(&si->cv);
}

/* The stage a batch or part is for: its first bytes name the head and the
 * instance (mu held; NULL when this node runs no such stage). */
static stage_inst *addressee_locked(pipeline *p, const uint8_t *data, char head[33],
                                    uint32_t *inst)
{
    wire_hex(data, WIRE_ID_BYTES, head);
    memcpy(inst, data + WIRE_ID_BYTES, 4);
    return pl__find_stage_locked(p, head, *inst);
}

static void on_batch(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    if (len < BATCH_HDR)
        return;
    char head[33];
    uint32_t inst;
    msg *m = rc_malloc(sizeof *m + len);
    pthread_mutex_lock(&p->mu);
    stage_inst *si = addressee_locked(p, data, head, &inst);
    if (si && m)
        enqueue_locked(si, &si->q_head, &si->q_tail, m, data, len);
    pthread_mutex_unlock(&p->mu);
    if (!si || !m) {
        rc_free(m);
        rc_log(LOG_WARN, "pipeline: a batch from %.8s for instance %u of %.8s, which this node "
               "does not run", from, inst, head);
    }
}

static void on_stop(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    uint32_t inst;
    if (len != 4)
        return;
    memcpy(&inst, data, 4);
    pthread_mutex_lock(&p->mu);
    stage_inst *si = pl__find_stage_locked(p, from, inst);
    if (si) {
        si->stop = true;
        pthread_cond_signal(&si->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_partial(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    if (len < PARTIAL_HDR)
        return;
    char head[33];
    uint32_t inst;
    msg *m = rc_malloc(sizeof *m + len);
    pthread_mutex_lock(&p->mu);
    stage_inst *si = addressee_locked(p, data, head, &inst);
    int q = -1;
    for (int k = 0; si && k < si->n_ranks; k++)
        if (k != si->rank && !strcmp(si->peers[k], from) && !si->chan[k])
            q = k;
    if (q >= 0 && m)
        enqueue_locked(si, &si->pq_head[q], &si->pq_tail[q], m, data, len);
    pthread_mutex_unlock(&p->mu);
    if (q < 0 || !m) {
        rc_free(m);
        rc_log(LOG_WARN, "pipeline: a shard's part from %.8s for instance %u of %.8s, which "
               "this node does not share with it (or takes on a data channel)", from, inst, head);
    }
}

/* ---- the head side ---- */

static head_exec *find_exec_locked(pipeline *p, uint32_t inst)
{
    for (head_exec *h = p->execs; h; h = h->next)
        if (h->inst == inst)
            return h;
    return NULL;
}

static int stage_of(const head_exec *h, const char *node)
{
    for (int k = 0; k < h->spec.n_stages; k++)
        if (!strcmp(h->spec.stage[k].node, node))
            return k;
    return -1;
}

static void on_ready(pipeline *p, const char *from, const uint8_t *data, size_t len)
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

static void on_result(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    rbuf r = { .p = data, .len = len };
    uint32_t inst = rb_u32(&r), group = rb_u32(&r), status = rb_u32(&r), n = rb_u32(&r);
    if (r.bad)
        return;
    pthread_mutex_lock(&p->mu);
    head_exec *h = find_exec_locked(p, inst);
    if (!h || stage_of(h, from) < 0 || group >= (uint32_t)h->x.n_groups ||
        !h->groups[group].sent || h->groups[group].ready) {
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
    wb_u32(&w, ENC_NONE);
    wb_u32(&w, (uint32_t)b->n_starts);
    wb_u32(&w, (uint32_t)b->rows.n_rows);
    for (int i = 0; i < b->n_starts; i++)
        pl__put_start(&w, &b->starts[i]);
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
        for (int g = 0; g < x->n_groups; g++)
            rc_free(h->groups[g].rows);
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
    /* RACIMO_TEST_SHARD_CUT: what a head of another revision sends (tests;
     * 0 = none, as protocol 1.2) */
    const char *tc = getenv("RACIMO_TEST_SHARD_CUT");
    int cut = tc ? atoi(tc) : SHARD_CUT;
    if (j && shards && cut > 0)
        json_object_set_new(j, "cut", json_integer(cut));
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
                          .wake = head_wake, .broken = pipeline_exec_broken, .free = head_free };
    h->p = p;
    h->spec = *spec;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    h->groups = rc_calloc((size_t)G, sizeof *h->groups);
    for (int g = 0; h->groups && g < G; g++)
        if (!(h->groups[g].rows = rc_calloc((size_t)spec->n_seq, sizeof(exec_sampled)))) {
            rc_free(h->groups[g].rows);
            break;
        }
    bool oom = !h->groups;
    for (int g = 0; !oom && g < G; g++)
        oom = !h->groups[g].rows;
    pthread_mutex_lock(&p->mu);
    h->inst = ++p->next_inst;
    h->next = p->execs;
    p->execs = h;
    pthread_mutex_unlock(&p->mu);
    if (oom) {
        head_free(&h->x);
        return rc_fail(RC_ENOMEM, "out of memory");
    }
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

/* ---- routing ---- */

static void on_msg(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    pipeline *p = ud;
    pthread_mutex_lock(&p->mu);
    bool closed = p->closed;
    pthread_mutex_unlock(&p->mu);
    if (closed)
        return;
    switch (type) {
    case PIPE_SETUP:  on_setup(p, from, data, len); break;
    case PIPE_READY:  on_ready(p, from, data, len); break;
    case PIPE_BATCH:  on_batch(p, from, data, len); break;
    case PIPE_RESULT: on_result(p, from, data, len); break;
    case PIPE_STOP:   on_stop(p, from, data, len); break;
    case PIPE_PARTIAL: on_partial(p, from, data, len); break;
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
        int k = stage_of(h, node);
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
                   node, si->index, si->model_name);
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
            reap_locked(p);
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
