/* pipe_stage.c - the stage side: a head's set-up makes a stage instance
 * whose worker thread loads its layers (pulling what this node lacks),
 * links the shards, says it is ready and then runs the batches the router
 * queues, one at a time: the next stage gets its batch, or the head its
 * result.
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "infer/stage.h"
#include "model/model.h"
#include "tensor/kv_types.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* READY for stage `index` of instance `inst` headed by `head`: loaded, or
 * refused or failed and why. */
static void send_ready(pipeline *p, const char *head, uint32_t inst, int index, bool ok,
                       const char *error, uint64_t weight_bytes)
{
    json_t *j = json_pack("{s:I, s:i, s:b, s:s, s:I}", "inst", (json_int_t)inst, "index",
                          index, "ok", ok, "error", error ? error : "", "weight_bytes",
                          (json_int_t)weight_bytes);
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt)
        pl__send_to(p, head, PIPE_READY, txt, strlen(txt));
    free(txt);
    json_decref(j);
}

static void stage_send_ready(stage_inst *si, bool ok, const char *error)
{
    send_ready(si->p, si->head, si->inst, si->index, ok, error, si->m ? si->m->weight_bytes : 0);
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
           log_clean(si->model_name), si->first, si->last - 1, total ? 100.0 * (double)done / (double)total : 100.0,
           (double)total / 1e6, bytes_per_s / 1e6, left);
}

/* The bytes the stage will allocate for its KV cache, and for its batch
 * and logit buffers (roughly as stage_new and stage_load do), in double: a
 * hostile set-up's product may not fit 64 bits. */
static void stage_bytes(const stage_inst *si, double *kv, double *buffers)
{
    const model_hparams *hp = &si->m->hp;
    const model_shard *sh = &si->m->shard;
    const double B = si->n_batch, E = hp->n_embd, F = 4.0;
    double per_pos = hp->kv_lora_rank > 0
        ? (double)kv_row_bytes(si->kv_type, (size_t)(hp->kv_lora_rank + hp->rope_dim))
        : (double)sh->n_head_kv * (double)(kv_row_bytes(si->kv_type, (size_t)hp->head_dim) +
                                           kv_row_bytes(si->kv_type, (size_t)hp->head_dim_v));
    *kv = (double)(si->last - si->first) * si->n_seq * si->n_ctx * per_pos;
    double ff = hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp;
    double work = B * (6 * E + 2 * ff + 3.0 * hp->n_head * hp->head_dim) * F +
                  (double)si->n_threads * hp->n_head * si->n_ctx * F;
    double io = B * E * F * (1 + si->n_ranks) +
                (si->last == hp->n_layer && !hp->pooling ? (double)si->n_seq * hp->n_vocab * F * 2
                                                         : B * E * F);
    *buffers = work + io;
}

/* Refuses a stage whose KV cache is more than the memory this node offers
 * (its free memory under --max-memory: what placement fits the weights and
 * KV caches of its stages into), or whose KV cache and buffers are more
 * than is left of its memory beside the stages it runs already; else
 * books the bytes (si->mem_need). */
static int stage_reserve(stage_inst *si)
{
    pipeline *p = si->p;
    json_t *snap = cluster_snapshot(p->c), *n;
    size_t i;
    double offer = 0, total = 0, kv, buffers;
    json_array_foreach(json_object_get(snap, "nodes"), i, n)
        if (json_is_true(json_object_get(n, "self"))) {
            json_t *hw = json_object_get(n, "hardware");
            offer = json_number_value(json_object_get(hw, "mem_offer"));
            total = json_number_value(json_object_get(hw, "mem_total"));
        }
    json_decref(snap);
    stage_bytes(si, &kv, &buffers);
    const double MiB = 1048576.0;
    if (offer <= 0 || total <= 0)
        return 0;                 /* a platform that does not say: the allocations will */
    pthread_mutex_lock(&p->mu);
    double booked = 0;
    for (stage_inst *o = p->stages; o; o = o->next)
        if (o != si && !o->done)
            booked += (double)o->mem_need;
    bool fits = kv <= offer && kv + buffers + booked <= total;
    if (fits)
        si->mem_need = (uint64_t)(kv + buffers);
    pthread_mutex_unlock(&p->mu);
    if (kv > offer)
        return rc_fail(RC_ELIMIT, "the set-up asks for a KV cache of %.0f MiB (%d sequences x %d "
                       "positions) and this node offers %.0f MiB", kv / MiB, si->n_seq,
                       si->n_ctx, offer / MiB);
    if (!fits)
        return rc_fail(RC_ELIMIT, "the set-up asks for %.0f MiB (%d sequences x %d positions, "
                       "batches of %d) and this node has %.0f MiB, %.0f MiB of it booked by the "
                       "stages it runs", (kv + buffers) / MiB, si->n_seq, si->n_ctx, si->n_batch,
                       total / MiB, booked / MiB);
    return 0;
}

static int stage_load(stage_inst *si)
{
    char path[1200];
    if (si->n_ranks > 1 && si->cut != SHARD_CUT)
        return rc_fail(RC_EUNSUPPORTED, "the head cuts tensor-parallel shards another way (cut "
                       "%d, protocol 1.2 or older; this node cuts %d): update the head's racimo",
                       si->cut, SHARD_CUT);
    int rc = cluster_model_path(si->p->c, si->model_name, path, sizeof path);
    if (rc == RC_ENOTFOUND && si->p->w && !si->have_root)
        return rc_fail(RC_ESTATE, "this node lacks model '%s' and the head (node %.8s) sent no "
                       "content digest to check a pulled copy against", si->model_name,
                       si->head);
    if (rc == RC_ENOTFOUND && si->p->w)
        rc = weights_ensure_shard(si->p->w, si->model_name, si->first, si->last, si->rank,
                                  si->n_ranks, si->root, NULL, pull_progress, si, path,
                                  sizeof path);
    if (rc)
        return rc;
    if ((rc = model_load_shard(path, si->first, si->last, si->rank, si->n_ranks, &si->m)))
        return rc;
    const model_hparams *hp = &si->m->hp;
    if (hp->n_layer < si->last || hp->n_embd != si->n_embd_want)
        return rc_fail(RC_EINVAL, "%s here has %d layers of width %d, the head's has width %d",
                       path, hp->n_layer, hp->n_embd, si->n_embd_want);
    if (si->n_ranks > 1 && (si->first != 0 || si->last != hp->n_layer))
        return rc_fail(RC_EINVAL, "a tensor-parallel shard runs every layer, not %d-%d",
                       si->first, si->last - 1);
    if (hp->n_ctx_train > 0 && si->n_ctx > hp->n_ctx_train)
        return rc_fail(RC_ELIMIT, "a context of %d positions asked, %s is trained for %d",
                       si->n_ctx, si->model_name, hp->n_ctx_train);
    if ((rc = stage_reserve(si)))
        return rc;
    stage_params sp = { .n_ctx = si->n_ctx, .n_seq = si->n_seq, .n_batch = si->n_batch,
                        .n_threads = si->n_threads, .precision = MATMUL_FAST,
                        .kv_type = si->kv_type, .reduce = pl__shard_reduce, .reduce_ud = si };
    if ((rc = stage_new(si->m, &sp, &si->st)))
        return rc;
    const size_t E = (size_t)hp->n_embd, B = (size_t)si->n_batch;
    bool last = si->last == hp->n_layer, logits = last && !hp->pooling;
    si->in = rc_malloc(B * E * sizeof(float));
    si->out = rc_malloc((logits ? (size_t)si->n_seq * (size_t)hp->n_vocab : B * E) * sizeof(float));
    if (!si->in || !si->out)
        return rc_fail(RC_ENOMEM, "out of memory for the stage's buffers");
    if (last && hp->pooling) {
        /* an embedding model: the last stage pools (2.2) */
        if (si->n_ranks > 1)
            return rc_fail(RC_EINVAL, "an embedding model is not split by tensor parallelism");
        if (!(si->pooled = rc_malloc((size_t)si->n_seq * E * sizeof(float))))
            return rc_fail(RC_ENOMEM, "out of memory for the stage's buffers");
        return embed_pool_new(si->n_seq, (int)E, hp->pooling, &si->ep);
    }
    if (si->n_ranks > 1 && !(si->parts = rc_malloc((size_t)si->n_ranks * B * E * sizeof(float))))
        return rc_fail(RC_ENOMEM, "out of memory for the shard's sums");
    if (last && (rc = sample_set_new(si->n_seq, hp->n_vocab, &si->ss)))
        return rc;
    if (si->ss)   /* grammars: the tokenizer is loaded from the file when one comes */
        sample_set_use_file(si->ss, si->m->file);
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
    const uint32_t flags = enc & ENC_STARTS_FLAGS;
    enc &= ~ENC_STARTS_FLAGS;
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
        pl__get_start(&r, &ws, flags);
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
        if (si->ep && embed_pool_start(si->ep, s)) {
            snprintf(why, sizeof why, "sequence start: %s", rc_errmsg());
            stage_send_error(si, group, why);
            return;
        }
        if (!si->ss)
            continue;
        int32_t *prompt = rc_malloc((size_t)(s->n_prompt + s->n_generated) * 4 + 4);
        int32_t *ids = rc_malloc((size_t)s->sp.n_bias * 4 + 4);
        float *vals = rc_malloc((size_t)s->sp.n_bias * 4 + 4);
        int rc = RC_ENOMEM;
        if (prompt && ids && vals) {
            memcpy(prompt, s->prompt, (size_t)s->n_prompt * 4);
            if (s->n_generated > 0)
                memcpy(prompt + s->n_prompt, s->generated, (size_t)s->n_generated * 4);
            s->generated = prompt + s->n_prompt;
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
        int k = 0;
        if (si->ep) {
            /* (2.2) one pooled vector per row that asked, f32 */
            if (embed_pool_batch(si->ep, &b, si->out, si->pooled, &k))
                snprintf(why, sizeof why, "%s", rc_errmsg());
            wb_u32(&w, (uint32_t)k);
            wb_put(&w, si->pooled, (size_t)k * (size_t)E * 4);
            got = 0;                  /* no token rows below */
        } else {
            wb_u32(&w, (uint32_t)got);
        }
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
        uint32_t e = (si->wire_f32 ? ENC_F32 : ENC_F16) | flags;
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
    embed_pool_free(si->ep);
    rc_free(si->pooled);
    si->ep = NULL;
    si->pooled = NULL;
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
               si->index, log_clean(si->model_name), si->first, si->last - 1, why);
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
        si->q_n--;
        si->q_bytes -= m->len;
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
    si->q_n = 0;
    si->q_bytes = 0;
    for (int q = 0; q < si->n_ranks; q++) {
        free_queue(&si->pq_head[q], &si->pq_tail[q]);
        si->pq_n[q] = 0;
        si->pq_bytes[q] = 0;
    }
    si->done = true;
    pthread_mutex_unlock(&p->mu);
    if (si->n_ranks > 1)
        rc_log(LOG_INFO, "pipeline: shard %d of %d of %s stopped after %llu batches and %llu "
               "parts; %.1f s on batches, %.1f s of it in forward passes, of which %.1f s "
               "waiting for the other shards' parts", si->rank, si->n_ranks, log_clean(si->model_name),
               (unsigned long long)si->batches, (unsigned long long)si->n_parts,
               (double)si->run_ns * 1e-9, (double)si->forward_ns * 1e-9,
               (double)si->wait_ns * 1e-9);
    else
        rc_log(LOG_INFO, "pipeline: stage %d of %s stopped after %llu batches; %.1f s on "
               "batches, %.1f s of it in forward passes", si->index, log_clean(si->model_name),
               (unsigned long long)si->batches, (double)si->run_ns * 1e-9,
               (double)si->forward_ns * 1e-9);
    return NULL;
}

/* Joins and frees stages whose threads ended (mu held by the caller is not
 * needed: called from the handler with mu held, threads already done). */
void pl__reap_locked(pipeline *p)
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

/* Whether s is a node id (32 lowercase hex digits, as the cluster writes
 * them). */
static bool is_node_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return false;
    return n == 32;
}

/* Refuses a set-up: logged, and when it named its instance, the head (the
 * sender) hears why in a READY. */
static void setup_refuse(pipeline *p, const char *from, json_int_t inst, json_int_t index,
                         const char *why)
{
    pl__refuse(p, from, PIPE_SETUP, "%s", why);
    if (inst >= 0 && inst <= UINT32_MAX && index >= 0 && index < PIPELINE_MAX_STAGES) {
        char text[300];
        snprintf(text, sizeof text, "node %.8s refuses the set-up: %s", p->self, why);
        send_ready(p, from, (uint32_t)inst, (int)index, false, text, 0);
    }
}

/* What is wrong with a set-up's numbers, or NULL (the limits of
 * docs/cluster-protocol.md section 9). */
static const char *setup_check(json_int_t index, json_int_t n_stages, json_int_t first,
                               json_int_t last, json_int_t n_ctx, json_int_t n_seq,
                               json_int_t n_batch, json_int_t threads, json_int_t n_embd,
                               const char *model_name, const char *next, const char *prev,
                               const json_t *shards, char *buf, size_t cap)
{
    if (n_stages < 1 || n_stages > PIPELINE_MAX_STAGES || index < 0 || index >= n_stages)
        return "stage index or count out of range";
    if (first < 0 || last <= first || last > 100000)
        return "bad layer range";
    if (n_ctx <= 0 || n_ctx > SETUP_MAX_CTX || n_seq <= 0 || n_seq > SETUP_MAX_SEQ ||
        n_batch <= 0 || n_batch > SETUP_MAX_BATCH) {
        snprintf(buf, cap, "%lld positions x %lld sequences, batches of %lld: the limits are "
                 "1-%d, 1-%d and 1-%d", (long long)n_ctx, (long long)n_seq, (long long)n_batch,
                 SETUP_MAX_CTX, SETUP_MAX_SEQ, SETUP_MAX_BATCH);
        return buf;
    }
    if (threads < 0 || threads > 1024 || n_embd <= 0 || n_embd > (1 << 20))
        return "bad thread count or width";
    if (!model_name[0] || strlen(model_name) >= 256 || (next[0] && !is_node_id(next)))
        return "bad model name or next node";
    if (shards) {
        if (!json_is_array(shards) || json_array_size(shards) < 2 ||
            json_array_size(shards) > PIPELINE_MAX_STAGES ||
            json_array_size(shards) != (size_t)n_stages)
            return "bad shard list";
        for (size_t q = 0; q < json_array_size(shards); q++) {
            const char *id = json_string_value(json_array_get(shards, q));
            if (!id || !is_node_id(id))
                return "bad shard list";
        }
    } else if (index > 0 && !(prev && is_node_id(prev))) {
        /* without it any node could feed this stage batches */
        return "a stage after the first without the previous stage's node (\"prev\")";
    }
    return NULL;
}

void pl__on_setup(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data, len, 0, &jerr);
    json_int_t inst = -1, index = -1, first = -1, last = -1, n_ctx = 0, n_seq = 0, n_batch = 0,
               threads = 0, n_embd = 0, n_stages = 0;
    const char *model_name = NULL, *next = NULL, *wire_enc = NULL, *prev = NULL, *digest = NULL,
               *cache = NULL;
    json_t *shards = NULL;
    json_int_t cut = 0;
    char buf[200];
    const char *bad = NULL;
    uint8_t root[32];
    int kv_type = TT_F32;             /* what a 2.0 head's stages ran */
    if (!j || json_unpack(j, "{s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s?o, s?I, s?s, s?s, s?s}",
                          "inst", &inst, "index", &index, "model", &model_name, "first", &first,
                          "last", &last, "n_ctx", &n_ctx, "n_seq", &n_seq, "n_batch", &n_batch,
                          "threads", &threads, "n_embd", &n_embd, "wire", &wire_enc, "next",
                          &next, "n_stages", &n_stages, "shards", &shards, "cut", &cut,
                          "prev", &prev, "digest", &digest, "cache", &cache))
        bad = "malformed set-up";
    else if (cache && kv_type_parse(cache, &kv_type))
        bad = "a KV cache type other than " KV_TYPE_NAMES;
    else if (digest && digests_parse(digest, root))
        bad = "malformed content digest";
    else
        bad = setup_check(index, n_stages, first, last, n_ctx, n_seq, n_batch, threads, n_embd,
                          model_name, next, prev, shards, buf, sizeof buf);
    if (!bad && (inst < 0 || inst > UINT32_MAX))
        bad = "bad instance number";
    if (bad) {
        if (!j) {
            inst = -1;                /* nothing to answer */
        } else if (inst < 0) {
            json_t *ji = json_object_get(j, "inst"), *jx = json_object_get(j, "index");
            inst = json_is_integer(ji) ? json_integer_value(ji) : -1;
            index = json_is_integer(jx) ? json_integer_value(jx) : -1;
        }
        setup_refuse(p, from, inst, index, bad);
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
    /* batches come from the head to stage 0 and to every shard, else from
     * the stage before */
    snprintf(si->prev_node, sizeof si->prev_node, "%s", index > 0 && !shards ? prev : from);
    si->first = (int)first;
    si->last = (int)last;
    si->n_ctx = (int)n_ctx;
    si->n_seq = (int)n_seq;
    si->n_batch = (int)n_batch;
    /* more threads than this machine's CPUs only adds switching */
    si->n_threads = threads > 0 ? (int)threads : p->n_threads > 0 ? p->n_threads
                                                                  : os_n_physical_cores();
    if (si->n_threads > os_n_cpus())
        si->n_threads = os_n_cpus();
    si->n_embd_want = (int)n_embd;
    si->wire_f32 = !strcmp(wire_enc, "f32");
    si->kv_type = kv_type;
    si->cut = (int)cut;
    if ((si->have_root = digest != NULL))
        memcpy(si->root, root, sizeof root);
    si->n_ranks = 1;
    if (shards) {
        si->n_ranks = (int)json_array_size(shards);
        si->rank = si->index;
        for (int q = 0; q < si->n_ranks; q++)
            snprintf(si->peers[q], sizeof si->peers[q], "%s",
                     json_string_value(json_array_get(shards, (size_t)q)));
    }
    json_decref(j);
    pthread_cond_init(&si->cv, NULL);
    pthread_mutex_lock(&p->mu);
    /* on_msg looked at `closed` before the set-up was parsed; pipeline_stop
     * may have marked every stage since, and would wait forever for one
     * started now */
    if (p->closed) {
        pthread_mutex_unlock(&p->mu);
        setup_refuse(p, from, inst, index, "this node is shutting down");
        pthread_cond_destroy(&si->cv);
        rc_free(si);
        return;
    }
    pl__reap_locked(p);
    stage_inst *old = pl__find_stage_locked(p, si->head, si->inst);
    int n_all = 0, n_head = 0;
    for (stage_inst *o = p->stages; o; o = o->next)
        if (!o->stop && o != old) {
            n_all++;
            n_head += !strcmp(o->head, si->head);
        }
    if (n_head >= STAGES_PER_HEAD || n_all >= STAGES_MAX) {
        pthread_mutex_unlock(&p->mu);
        snprintf(buf, sizeof buf, "this node runs %d stages already (%d for that head; at most "
                 "%d and %d)", n_all, n_head, STAGES_MAX, STAGES_PER_HEAD);
        setup_refuse(p, from, inst, index, buf);
        pthread_cond_destroy(&si->cv);
        rc_free(si);
        return;
    }
    if (old) {
        old->stop = true;
        pthread_cond_signal(&old->cv);
    }
    if (si->n_ranks > 1)
        rc_log(LOG_INFO, "pipeline: node %.8s asks for shard %d of %d of %s (every layer)", from,
               si->rank, si->n_ranks, log_clean(si->model_name));
    else
        rc_log(LOG_INFO, "pipeline: node %.8s asks for stage %d of %s (layers %d-%d)", from,
               si->index, log_clean(si->model_name), si->first, si->last - 1);
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

/* The stage a batch or part is for: its first bytes name the head and the
 * instance (mu held; NULL when this node runs no such stage). */
static stage_inst *addressee_locked(pipeline *p, const uint8_t *data, char head[33],
                                    uint32_t *inst)
{
    wire_hex(data, WIRE_ID_BYTES, head);
    memcpy(inst, data + WIRE_ID_BYTES, 4);
    return pl__find_stage_locked(p, head, *inst);
}

void pl__on_batch(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    if (len < BATCH_HDR) {
        pl__refuse(p, from, PIPE_BATCH, "%zu bytes, shorter than a batch's header", len);
        return;
    }
    char head[33];
    uint32_t inst;
    msg *m = rc_malloc(sizeof *m + len);
    pthread_mutex_lock(&p->mu);
    stage_inst *si = addressee_locked(p, data, head, &inst);
    /* only the plan's node before this one may feed it */
    bool sender = si && !strcmp(si->prev_node, from);
    bool queued = sender && m &&
                  pl__enqueue_locked(si, &si->q_head, &si->q_tail, &si->q_n, &si->q_bytes, m,
                                     data, len);
    int q_n = si ? si->q_n : 0;
    pthread_mutex_unlock(&p->mu);
    if (queued)
        return;
    rc_free(m);
    if (!si)
        pl__refuse(p, from, PIPE_BATCH, "for instance %u of %.8s, which this node does not run",
                   inst, head);
    else if (!sender)
        pl__refuse(p, from, PIPE_BATCH, "for instance %u of %.8s, whose batches come from node "
                   "%.8s only", inst, head, si->prev_node);
    else if (m)
        pl__refuse(p, from, PIPE_BATCH, "for instance %u of %.8s: %d batches wait already",
                   inst, head, q_n);
}

void pl__on_stop(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    uint32_t inst;
    if (len != 4)
        return;
    memcpy(&inst, data, 4);
    /* the instance is looked up as the sender's own: no node stops another's */
    pthread_mutex_lock(&p->mu);
    stage_inst *si = pl__find_stage_locked(p, from, inst);
    if (si) {
        si->stop = true;
        pthread_cond_signal(&si->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

void pl__on_partial(pipeline *p, const char *from, const uint8_t *data, size_t len)
{
    if (len < PARTIAL_HDR) {
        pl__refuse(p, from, PIPE_PARTIAL, "%zu bytes, shorter than a part's header", len);
        return;
    }
    char head[33];
    uint32_t inst;
    msg *m = rc_malloc(sizeof *m + len);
    pthread_mutex_lock(&p->mu);
    stage_inst *si = addressee_locked(p, data, head, &inst);
    int q = -1;
    for (int k = 0; si && k < si->n_ranks; k++)
        if (k != si->rank && !strcmp(si->peers[k], from) && !si->chan[k])
            q = k;
    bool queued = q >= 0 && m &&
                  pl__enqueue_locked(si, &si->pq_head[q], &si->pq_tail[q], &si->pq_n[q],
                                     &si->pq_bytes[q], m, data, len);
    pthread_mutex_unlock(&p->mu);
    if (queued)
        return;
    rc_free(m);
    if (q < 0)
        pl__refuse(p, from, PIPE_PARTIAL, "for instance %u of %.8s, which this node does not "
                   "share with it (or takes on a data channel)", inst, head);
    else if (m)
        pl__refuse(p, from, PIPE_PARTIAL, "for instance %u of %.8s: too many of its parts wait "
                   "already", inst, head);
}
