/* pipe_shard.c - tensor-parallel shards exchanging parts.
 *
 * Tensor parallel (spec.tensor): the stages are shards of every layer.  The
 * head sends each batch to all of them; inside the forward pass every
 * shard sends its part of each sub-block's output to every other shard and
 * waits for theirs (PIPE_PARTIAL, in order per link, numbered), and all add
 * the parts in shard order, so all go on with the same numbers; at the end
 * shards 1.. send their columns of the logits to shard 0, which samples and
 * answers the head.  Parts travel on a pair's data channel when it has one
 * (pipe_channel.c), else on the cluster link, queued by the router.
 */
#include "pipeline_internal.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/model.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Between poll slices of a channel exchange: a stop or a peer's node going
 * down ends the wait (a dead process closes its channel at once; a dead
 * machine only shows in the cluster's heartbeats). */
static bool shard_abort(void *ud, char *why, size_t cap)
{
    stage_inst *si = ud;
    pthread_mutex_lock(&si->p->mu);
    bool give_up = si->stop || si->peer_down;
    if (give_up)
        snprintf(why, cap, "%s", si->stop ? "the shard was stopped" : si->peer_why);
    pthread_mutex_unlock(&si->p->mu);
    return give_up;
}

static int shard_exchange(stage_inst *si, chan_io *io, int n)
{
    uint64_t t0 = os_now_ns();
    for (int i = 0; i < n; i++)
        if (io[i].out) {
            atomic_fetch_add(&si->p->bytes_out, io[i].out_len);
            atomic_fetch_add(&si->p->msgs_out, 1);
        }
    int rc = chan_exchange(io, n, PARTIAL_WAIT_MS, shard_abort, si);
    si->wait_ns += os_now_ns() - t0;
    return rc;
}

/* Encodes part `seq` (n_rows x width floats at x, columns from col0 of the
 * whole) into si->pbuf / si->plen. */
static void part_header(wbuf *w, const stage_inst *si, int kind, uint64_t seq, int enc,
                        int n_rows, int width, int col0)
{
    wb_put(w, si->head_raw, WIRE_ID_BYTES);
    wb_u32(w, si->inst);
    wb_u32(w, (uint32_t)si->rank);
    wb_u32(w, (uint32_t)kind);
    wb_u32(w, (uint32_t)enc);
    wb_put(w, &seq, 8);
    wb_u32(w, (uint32_t)n_rows);
    wb_u32(w, (uint32_t)width);
    wb_u32(w, (uint32_t)col0);
}

static int shard_pack(stage_inst *si, int kind, uint64_t seq, int enc, const float *x, int n_rows,
                      int width, int col0)
{
    wbuf w = { .p = si->pbuf, .cap = si->pcap };
    part_header(&w, si, kind, seq, enc, n_rows, width, col0);
    const size_t n = (size_t)n_rows * (size_t)width;
    if (enc == ENC_F32) {
        wb_put(&w, x, n * sizeof(float));
    } else {
        uint8_t *d = wb_grow(&w, n * 2);
        if (d)
            pl__to_f16(x, d, n);
    }
    si->pbuf = w.p;
    si->pcap = w.cap;
    si->plen = w.len;
    return w.oom ? rc_fail(RC_ENOMEM, "out of memory for a shard's part") : 0;
}

/* Sends the packed part to shard `to`, or to every other shard (to < 0),
 * over the cluster link where there is no channel to it; with `channels`
 * also on the channels (to receive nothing back: the logits). */
static int shard_send(stage_inst *si, int to, bool channels)
{
    pipeline *p = si->p;
    chan_io io[PIPELINE_MAX_STAGES];
    int nio = 0;
    for (int q = 0; q < si->n_ranks; q++) {
        if (q == si->rank || (to >= 0 && q != to))
            continue;
        if (si->chan[q]) {
            if (channels)
                io[nio++] = (chan_io){ .ch = si->chan[q], .out_type = PIPE_PARTIAL,
                                       .out = si->pbuf, .out_len = si->plen };
        } else if (pl__send_to(p, si->peers[q], PIPE_PARTIAL, si->pbuf, si->plen)) {
            return rc_fail(RC_EIO, "cannot reach shard %d's node %.8s", q, si->peers[q]);
        }
    }
    return nio ? shard_exchange(si, io, nio) : 0;
}

/* The rows of a PART_CANDS from shard q, each whole or as (column, raw
 * logit) pairs, into rows of ld floats at dst (the sender's first column);
 * the columns a row does not list are -INFINITY, never drawn. */
static int cands_decode(stage_inst *si, int q, rbuf *r, uint32_t rows, uint32_t cols, float *dst,
                        int ld)
{
    for (uint32_t i = 0; i < rows && !r->bad; i++) {
        float *o = dst + (size_t)i * (size_t)ld;
        uint32_t m = rb_u32(r);
        if (m == CANDS_DENSE) {
            const void *d = rb_get(r, (size_t)cols * 4);
            if (d)
                memcpy(o, d, (size_t)cols * 4);
            continue;
        }
        if (m > cols) {
            r->bad = true;
            break;
        }
        for (uint32_t c = 0; c < cols; c++)
            o[c] = -INFINITY;
        for (uint32_t j = 0; j < m && !r->bad; j++) {
            uint32_t col = rb_u32(r);
            float v = rb_f32(r);
            if (col >= cols)
                r->bad = true;
            else
                o[col] = v;
        }
    }
    if (r->bad || r->off != r->len)
        return rc_fail(RC_EFORMAT, "shard %d (node %.8s) sent a malformed list of logits", q,
                       si->peers[q]);
    return 0;
}

/* Checks that a message from shard q is part `seq` of kind `kind` with
 * n_rows rows and decodes it into dst (width floats per row, or at its
 * col0 within rows of ld floats for logits). */
static int shard_decode(stage_inst *si, int q, int kind, uint64_t seq, int n_rows, int width,
                        float *dst, int ld, const uint8_t *data, size_t len)
{
    rbuf r = { .p = data, .len = len };
    const uint8_t *head = rb_get(&r, WIRE_ID_BYTES);
    uint32_t inst = rb_u32(&r), from = rb_u32(&r);
    /* a data channel's parts have not passed the router: name them here */
    if (!r.bad && (memcmp(head, si->head_raw, WIRE_ID_BYTES) || inst != si->inst ||
                   from != (uint32_t)q))
        return rc_fail(RC_EFORMAT, "shard %d (node %.8s) sent a part of another instance or "
                       "shard (instance %u, shard %u)", q, si->peers[q], inst, from);
    uint32_t k = rb_u32(&r), enc = rb_u32(&r);
    uint64_t s = rb_u64(&r);
    uint32_t rows = rb_u32(&r), cols = rb_u32(&r), col0 = rb_u32(&r);
    size_t esz = enc == ENC_F16 ? 2 : enc == ENC_F32 ? 4 : 0;
    if (kind == PART_CANDS && k == PART_LOGITS)
        kind = PART_LOGITS;                   /* whole columns: the cluster link's way */
    if (kind == PART_CANDS && !r.bad && k == (uint32_t)kind && s == seq &&
        rows == (uint32_t)n_rows && enc == ENC_F32 && (uint64_t)col0 + cols <= (uint64_t)ld)
        return cands_decode(si, q, &r, rows, cols, dst + col0, ld);
    if (r.bad || k != (uint32_t)kind || s != seq || rows != (uint32_t)n_rows || !esz ||
        (kind == PART_SUM ? cols != (uint32_t)width || col0 != 0
                          : (uint64_t)col0 + cols > (uint64_t)ld) ||
        len - r.off != (size_t)rows * cols * esz)
        return rc_fail(RC_EFORMAT, "shard %d (node %.8s) sent part %llu of kind %u with %u x %u "
                       "values where part %llu of kind %d with %d rows was due", q, si->peers[q],
                       (unsigned long long)s, k, rows, cols, (unsigned long long)seq, kind, n_rows);
    const uint8_t *d = data + r.off;
    int stride = kind == PART_SUM ? width : ld;
    for (uint32_t i = 0; i < rows; i++) {
        float *o = dst + (size_t)i * (size_t)stride + (kind == PART_SUM ? 0 : col0);
        const uint8_t *src = d + (size_t)i * cols * esz;
        if (esz == 4)
            memcpy(o, src, (size_t)cols * 4);
        else
            pl__from_f16(src, o, cols);
    }
    return 0;
}

/* Waits for the next part from shard q through the cluster link and
 * decodes it (shard_decode). */
static int shard_take(stage_inst *si, int q, int kind, uint64_t seq, int n_rows, int width,
                      float *dst, int ld)
{
    pipeline *p = si->p;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += PARTIAL_WAIT_MS / 1000;
    uint64_t t0 = os_now_ns();
    pthread_mutex_lock(&p->mu);
    int late = 0;
    while (!si->pq_head[q] && !si->stop && !si->peer_down && !late)
        late = pthread_cond_timedwait(&si->cv, &p->mu, &dl);
    si->wait_ns += os_now_ns() - t0;
    msg *m = si->pq_head[q];
    if (m) {
        si->pq_head[q] = m->next;
        if (!si->pq_head[q])
            si->pq_tail[q] = NULL;
        si->pq_n[q]--;
        si->pq_bytes[q] -= m->len;
    }
    char why[256] = "";
    if (!m)
        snprintf(why, sizeof why, "%s", si->stop ? "the shard was stopped"
                                   : si->peer_down ? si->peer_why
                                   : "no part from a peer shard within the time limit");
    pthread_mutex_unlock(&p->mu);
    if (!m)
        return rc_fail(RC_EIO, "shard %d (node %.8s): %s", q, si->peers[q], why);
    int rc = shard_decode(si, q, kind, seq, n_rows, width, dst, ld, m->data, m->len);
    rc_free(m);
    return rc;
}

/* The stage's reduce: this shard's part goes to every other shard, theirs
 * come back, and every shard adds them all in shard order.  On the f16
 * wire a shard adds its own part rounded as the others receive it, so all
 * shards add the same numbers. */
int pl__shard_reduce(void *ud, float *x, int n_rows, int width)
{
    stage_inst *si = ud;
    const size_t n = (size_t)n_rows * (size_t)width;
    const size_t slot = (size_t)si->n_batch * (size_t)width;
    const uint64_t seq = si->n_parts++;
    const int enc = si->wire_f32 ? ENC_F32 : ENC_F16;
    int rc = shard_pack(si, PART_SUM, seq, enc, x, n_rows, width, 0);
    if (!rc && enc == ENC_F16)               /* the values as sent: the part's end */
        pl__from_f16(si->pbuf + si->plen - n * 2, x, n);
    if (!rc)
        rc = shard_send(si, -1, false);
    /* the channels' parts go out and come in together; then the others' */
    chan_io io[PIPELINE_MAX_STAGES];
    int nio = 0, from[PIPELINE_MAX_STAGES];
    for (int q = 0; q < si->n_ranks; q++)
        if (q != si->rank && si->chan[q]) {
            io[nio] = (chan_io){ .ch = si->chan[q], .out_type = PIPE_PARTIAL, .out = si->pbuf,
                                 .out_len = si->plen, .want_in = true };
            from[nio++] = q;
        }
    if (!rc && nio && (rc = shard_exchange(si, io, nio)))
        rc = rc_fail(RC_EIO, "shard %d of %d: %s", si->rank, si->n_ranks, rc_errmsg());
    for (int i = 0; i < nio && !rc; i++)
        rc = shard_decode(si, from[i], PART_SUM, seq, n_rows, width,
                          si->parts + (size_t)from[i] * slot, 0, io[i].in, io[i].in_len);
    const float *src[PIPELINE_MAX_STAGES];
    for (int q = 0; q < si->n_ranks && !rc; q++) {
        src[q] = q == si->rank ? x : si->parts + (size_t)q * slot;
        if (q != si->rank && !si->chan[q])
            rc = shard_take(si, q, PART_SUM, seq, n_rows, width, si->parts + (size_t)q * slot, 0);
    }
    if (rc)
        return rc;
    float *sum = si->parts + (size_t)si->rank * slot;
    for (size_t i = 0; i < n; i++) {
        float acc = src[0][i];
        for (int q = 1; q < si->n_ranks; q++)
            acc += src[q][i];
        sum[i] = acc;
    }
    memcpy(x, sum, n * sizeof(float));
    return 0;
}

/* Shard 1..'s entry for one row of logits (`row`: n_vocab wide, its
 * columns at vocab0): the whole of its columns, or, where shard 0's sampler
 * can only draw from the top k (greedy: k = 1; top_k; no log-probabilities
 * asked, which need every logit), its k best columns by the values the
 * sampler ranks (biased and penalised: this shard keeps copies of the
 * samplers), best first, ties to the lower id as in the sampler, with their
 * raw logits: shard 0 biases and penalises them itself, and the tokens it
 * does not get could not have been drawn.  A slot with an active grammar
 * also sends the k best of the tokens the grammar allows: shard 0 draws
 * from the k best first and, when the grammar refuses that draw, from the
 * k best allowed (sample_set_sample), so it gets what one node would. */
static void cands_row(stage_inst *si, int slot, float *row, wbuf *w)
{
    const model_shard *sh = &si->m->shard;
    const int n = sh->n_vocab;
    float *mine = row + sh->vocab0;
    int n_lp = 0;
    const sampler *smp = si->ss ? sample_set_get(si->ss, slot, &n_lp) : NULL;
    const sampler_params *sp = smp ? sampler_get_params(smp) : NULL;
    int k = !sp || n_lp > 0 ? 0 : !(sp->temperature > 0.0f) ? 1
          : sp->top_k > 0 && sp->top_k <= CANDS_MAX ? sp->top_k : 0;
    if (k == 0 || k >= n) {
        wb_u32(w, CANDS_DENSE);
        wb_put(w, mine, (size_t)n * 4);
        return;
    }
    memcpy(si->raw, mine, (size_t)n * 4);
    sampler_prepare(smp, row);
    size_t count_at = w->len;
    wb_u32(w, 0);
    uint32_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        int m = sampler_best(row, sh->vocab0, n, k, si->heap, si->best);
        for (int j = 0; j < m; j++) {
            wb_u32(w, (uint32_t)(si->best[j] - sh->vocab0));
            wb_f32(w, si->raw[si->best[j] - sh->vocab0]);
            row[si->best[j]] = -INFINITY;   /* sent: the second pass adds others */
        }
        total += (uint32_t)m;
        /* the mask failing (a grammar too ambiguous here) fails shard 0's too */
        if (pass == 0 && sample_set_constrain(si->ss, slot, row) != 1)
            break;
    }
    if (!w->oom)
        memcpy(w->p + count_at, &total, 4);
}

/* After the forward pass: shards 1.. send their part of the n_rows rows
 * of logits (the rows that sample, in order; rs/rw: the batch's slots and
 * sample flags) to shard 0, which puts them in place. */
int pl__shard_gather(stage_inst *si, int n_rows, const int32_t *rs, const int8_t *rw,
                     int n_batch_rows)
{
    if (n_rows == 0)
        return 0;
    const uint64_t seq = si->n_parts++;
    const model_shard *sh = &si->m->shard;
    const int V = si->m->hp.n_vocab;
    if (si->rank > 0 && !si->chan[0]) {
        /* the cluster link may lead to a node of protocol 1.0: whole columns */
        float *packed = si->out;
        for (int i = 0; i < n_rows; i++)
            memmove(packed + (size_t)i * sh->n_vocab, si->out + (size_t)i * V + sh->vocab0,
                    (size_t)sh->n_vocab * sizeof(float));
        int rc = shard_pack(si, PART_LOGITS, seq, ENC_F32, packed, n_rows, sh->n_vocab,
                            sh->vocab0);
        return rc ? rc : shard_send(si, 0, false);
    }
    if (si->rank > 0) {
        wbuf w = { .p = si->pbuf, .cap = si->pcap };
        part_header(&w, si, PART_CANDS, seq, ENC_F32, n_rows, sh->n_vocab, sh->vocab0);
        int k = 0;
        for (int i = 0; i < n_batch_rows && k < n_rows; i++)
            if (rw[i]) {
                cands_row(si, rs[i], si->out + (size_t)k * V, &w);
                si->unseen[rs[i]] = true;
                k++;
            }
        si->pbuf = w.p;
        si->pcap = w.cap;
        si->plen = w.len;
        if (w.oom)
            return rc_fail(RC_ENOMEM, "out of memory for a shard's logits");
        return shard_send(si, 0, true);
    }
    chan_io io[PIPELINE_MAX_STAGES];
    int nio = 0, from[PIPELINE_MAX_STAGES], rc = 0;
    for (int q = 1; q < si->n_ranks; q++)
        if (si->chan[q]) {
            io[nio] = (chan_io){ .ch = si->chan[q], .want_in = true };
            from[nio++] = q;
        }
    if (nio && (rc = shard_exchange(si, io, nio)))
        return rc_fail(RC_EIO, "shard 0 of %d: %s", si->n_ranks, rc_errmsg());
    for (int i = 0; i < nio && !rc; i++)
        rc = shard_decode(si, from[i], PART_CANDS, seq, n_rows, 0, si->out, V, io[i].in,
                          io[i].in_len);
    for (int q = 1; q < si->n_ranks && !rc; q++)
        if (!si->chan[q])
            rc = shard_take(si, q, PART_CANDS, seq, n_rows, 0, si->out, V);
    return rc;
}
