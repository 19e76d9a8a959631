/* stage.c - the transformer forward pass for a layer range.
 *
 * Dimension names, as in model.h: B = rows in the batch, E = n_embd,
 * H / Hk = query / key-value heads, D / Dv = key / value width per head,
 * F = FFN width, X = experts, K = experts used per token, V = vocabulary.
 *
 * Per layer, for every row of the batch:
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)
 *   q, k = per-head rmsnorm (qwen3), then rope at the row's position
 *   k, v -> KV cache of the row's sequence at the row's position
 *   o = softmax(q k^T / sqrt(D)) v over positions 0..pos, per head, with
 *       query head j reading kv head j / (H / Hk)
 *   x += Wo o
 *   h = rmsnorm(x) * ffn_norm
 *   x += Wdown (silu(Wgate h) * Wup h)            (dense)
 *   x += sum_k w_k Wdown_k (silu(Wgate_k h) * Wup_k h) (MoE, top-K experts)
 * Then, on the last stage: logits = Wout (rmsnorm(x) * output_norm).
 */
#include "stage.h"
#include "base/err.h"
#include "base/mem.h"
#include "tensor/attend.h"
#include "tensor/types.h"

#include <math.h>
#include <string.h>

struct stage {
    const model *m;
    stage_params p;
    thread_pool *pool;
    kv_cache kv;
    int n_layer_local;

    /* work buffers, sized for p.n_batch rows at creation */
    float *x;       /* [B][E] residual stream */
    float *h;       /* [B][E] normed input of a sub-block */
    float *q;       /* [B][H*D] */
    float *k;       /* [B][Hk*D] */
    float *v;       /* [B][Hk*Dv] */
    float *att;     /* [B][H*Dv] attention output */
    float *ff_a;    /* [B][max(F, Fx)] gate */
    float *ff_b;    /* [B][max(F, Fx)] up */
    float *ff_o;    /* [B][E] FFN output before accumulation */
    float *moe_acc; /* [B][E] a MoE shard's part of the experts' sum (shards only) */
    float *scores;  /* [n_threads][H / Hk][n_ctx] attention weights per thread */
    float *rope_cs; /* [B][rope_dim] cos, sin pairs per row */
    float *router;  /* [B][X] */
    int   *sel;     /* [B][K] chosen experts */
    float *sel_w;   /* [B][K] their weights */
    int   *rows;    /* [B] rows routed to one expert */
    float *rows_w;  /* [B] */
    int   *seq_len; /* [n_seq] scratch for batch validation */
    int   *len_was; /* [n_seq] cache lengths before the batch */
    void  *mm_scratch;
};

/* ---- small vector operations ---- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* Rotates one head in place.  cs holds (cos, sin) for each of the
 * rope_dim / 2 pairs.  NORM layout pairs (2i, 2i+1); NEOX pairs (i, i+d/2). */
static void rope_head(float *v, const float *cs, int rope_dim, bool neox)
{
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1];
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static void rope_table(const stage *s, int pos, float *cs)
{
    const model_hparams *hp = &s->m->hp;
    const float *ff = s->m->rope_freqs.data;
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * hp->rope_freq_scale *
                       pow((double)hp->rope_base, -2.0 * i / hp->rope_dim);
        if (ff)
            theta /= ff[i];
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

/* ---- attention ---- */

typedef struct {
    stage *s;
    const stage_batch *b;
    int layer;       /* local layer index */
} att_task;

/* One (row, KV head) pair per work item: the query heads that read the KV
 * head are done together, so its cache is read once for all of them
 * (tensor_attend).  Items are dealt to threads in turn, since under the
 * causal mask later rows cost more. */
static void attention_task(void *arg, int ith, int nth)
{
    att_task *t = arg;
    stage *s = t->s;
    const model_hparams *hp = &s->m->hp;
    const int H = s->m->shard.n_head, Hk = s->m->shard.n_head_kv;
    const int D = hp->head_dim, Dv = hp->head_dim_v, group = H / Hk;
    const float scale = 1.0f / sqrtf((float)D);
    float *scores = s->scores + (size_t)ith * group * s->p.n_ctx;
    const long n_items = (long)t->b->n_rows * Hk;
    for (long item = ith; item < n_items; item += nth) {
        int r = (int)(item / Hk), kvh = (int)(item % Hk);
        int seq = t->b->seq[r], pos = t->b->pos[r];
        const float *q = s->q + (size_t)r * H * D + (size_t)kvh * group * D;
        float *o = s->att + (size_t)r * H * Dv + (size_t)kvh * group * Dv;
        tensor_attend(q, group, D, Dv, scale, s->kv.type, kv_k(&s->kv, t->layer, seq, kvh),
                      (size_t)D, kv_v(&s->kv, t->layer, seq, kvh), (size_t)Dv, pos + 1, scores, o);
    }
}

static void add_bias(float *y, const tensor *bias, int n_rows, int width)
{
    if (!bias->data)
        return;
    const float *b = bias->data;
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < width; i++)
            y[(size_t)r * width + i] += b[i];
}

static void mm(stage *s, const tensor *W, const float *X, int n_rows, float *Y)
{
    matmul(s->pool, W, X, (int)W->ne[0], n_rows, Y, (int)W->ne[1], s->p.precision,
           s->mm_scratch);
}

/* A shard's sub-block output is its part of a sum over all shards. */
static int reduce(stage *s, float *y, int n_rows)
{
    if (s->m->shard.n_ranks == 1)
        return 0;
    return s->p.reduce(s->p.reduce_ud, y, n_rows, s->m->hp.n_embd);
}

static int attention_block(stage *s, const stage_batch *b, int il)
{
    const model_hparams *hp = &s->m->hp;
    const layer_weights *L = &s->m->layers[il];
    const int B = b->n_rows, E = hp->n_embd, H = s->m->shard.n_head, Hk = s->m->shard.n_head_kv;
    const int D = hp->head_dim, Dv = hp->head_dim_v;

    for (int r = 0; r < B; r++)
        rmsnorm(s->h + (size_t)r * E, s->x + (size_t)r * E, L->attn_norm.data, E, hp->rms_eps);
    mm(s, &L->wq, s->h, B, s->q);
    mm(s, &L->wk, s->h, B, s->k);
    mm(s, &L->wv, s->h, B, s->v);
    add_bias(s->q, &L->bq, B, H * D);
    add_bias(s->k, &L->bk, B, Hk * D);
    add_bias(s->v, &L->bv, B, Hk * Dv);

    for (int r = 0; r < B; r++) {
        float *q = s->q + (size_t)r * H * D, *k = s->k + (size_t)r * Hk * D;
        const float *cs = s->rope_cs + (size_t)r * hp->rope_dim;
        for (int h = 0; h < H; h++) {
            if (L->q_norm.data)
                rmsnorm(q + h * D, q + h * D, L->q_norm.data, D, hp->rms_eps);
            rope_head(q + h * D, cs, hp->rope_dim, hp->rope_neox);
        }
        for (int h = 0; h < Hk; h++) {
            if (L->k_norm.data)
                rmsnorm(k + h * D, k + h * D, L->k_norm.data, D, hp->rms_eps);
            rope_head(k + h * D, cs, hp->rope_dim, hp->rope_neox);
        }
        /* Written before any row attends, so later rows of the same
         * sequence in this batch see earlier ones (causal prompt). */
        kv_cache_store(&s->kv, il, b->seq[r], b->pos[r], k, s->v + (size_t)r * Hk * Dv);
    }

    att_task t = { s, b, il };
    pool_run(s->pool, attention_task, &t);

    mm(s, &L->wo, s->att, B, s->h);
    int rc = reduce(s, s->h, B);
    if (rc)
        return rc;
    for (size_t i = 0; i < (size_t)B * E; i++)
        s->x[i] += s->h[i];
    return 0;
}

/* ---- feed-forward ---- */

/* The gate over all rows, cut into slices for the threads (a prompt's
 * B x F values are worth it; one row's are not). */
typedef struct { float *a; const float *b; size_t n; } swiglu_task_t;

enum { SWIGLU_SLICE = 16384 };

static void swiglu_task(void *arg, int ith, int nth)
{
    swiglu_task_t *t = arg;
    const size_t n_slices = (t->n + SWIGLU_SLICE - 1) / SWIGLU_SLICE;
    for (size_t i = (size_t)ith; i < n_slices; i += (size_t)nth) {
        size_t i0 = i * SWIGLU_SLICE, n = t->n - i0 < SWIGLU_SLICE ? t->n - i0 : SWIGLU_SLICE;
        tensor_swiglu(t->a + i0, t->b + i0, n);
    }
}

static void swiglu(stage *s, float *a, const float *b, size_t n)
{
    if (n <= SWIGLU_SLICE) {
        tensor_swiglu(a, b, n);
        return;
    }
    swiglu_task_t t = { a, b, n };
    pool_run(s->pool, swiglu_task, &t);
}

static int dense_ffn(stage *s, int B, const layer_weights *L)
{
    const int E = s->m->hp.n_embd, F = s->m->shard.n_ff;
    mm(s, &L->w_gate, s->h, B, s->ff_a);
    mm(s, &L->w_up, s->h, B, s->ff_b);
    swiglu(s, s->ff_a, s->ff_b, (size_t)B * F);
    mm(s, &L->w_down, s->ff_a, B, s->ff_o);
    int rc = reduce(s, s->ff_o, B);
    if (rc)
        return rc;
    for (size_t i = 0; i < (size_t)B * E; i++)
        s->x[i] += s->ff_o[i];
    return 0;
}

/* Top-K routing: softmax over experts, the K largest (lowest index on ties),
 * optionally renormalised to sum to 1.  Then each expert runs once over the
 * rows that chose it.  A tensor-parallel shard holds a range of every
 * expert's FFN units: it adds its parts into moe_acc, and the sum over
 * shards goes to the residual (the whole model adds straight into it). */
static int moe_ffn(stage *s, int B, const layer_weights *L)
{
    const model_hparams *hp = &s->m->hp;
    const int E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, Fx = s->m->shard.n_ff;
    const bool cut = s->m->shard.n_ranks > 1;
    float *acc = cut ? s->moe_acc : s->x;
    if (cut)
        memset(acc, 0, (size_t)B * E * sizeof(float));
    mm(s, &L->gate_inp, s->h, B, s->router);
    for (int r = 0; r < B; r++) {
        float *p = s->router + (size_t)r * X;
        tensor_softmax(p, X);
        int *sel = s->sel + (size_t)r * K;
        float *w = s->sel_w + (size_t)r * K, sum = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken |= sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            sel[k] = best;
            w[k] = p[best];
            sum += p[best];
        }
        if (hp->expert_weights_norm)
            for (int k = 0; k < K; k++)
                w[k] /= sum;
    }
    for (int e = 0; e < X; e++) {
        int n = 0;
        for (int r = 0; r < B; r++)
            for (int k = 0; k < K; k++)
                if (s->sel[(size_t)r * K + k] == e) {
                    s->rows[n] = r;
                    s->rows_w[n] = s->sel_w[(size_t)r * K + k];
                    n++;
                }
        if (!n)
            continue;
        /* Gather the rows into ff_o (free here) so the expert's matrices
         * are read once for all of them. */
        for (int i = 0; i < n; i++)
            memcpy(s->ff_o + (size_t)i * E, s->h + (size_t)s->rows[i] * E, (size_t)E * sizeof(float));
        tensor gate = tensor_slice2(&L->gate_exps, e), up = tensor_slice2(&L->up_exps, e),
               down = tensor_slice2(&L->down_exps, e);
        mm(s, &gate, s->ff_o, n, s->ff_a);
        mm(s, &up, s->ff_o, n, s->ff_b);
        swiglu(s, s->ff_a, s->ff_b, (size_t)n * Fx);
        mm(s, &down, s->ff_a, n, s->ff_o);
        for (int i = 0; i < n; i++) {
            float *x = acc + (size_t)s->rows[i] * E;
            const float *y = s->ff_o + (size_t)i * E;
            for (int j = 0; j < E; j++)
                x[j] += s->rows_w[i] * y[j];
        }
    }
    if (!cut)
        return 0;
    int rc = reduce(s, acc, B);
    if (rc)
        return rc;
    for (size_t i = 0; i < (size_t)B * E; i++)
        s->x[i] += acc[i];
    return 0;
}

static int ffn_block(stage *s, int B, int il)
{
    const model_hparams *hp = &s->m->hp;
    const layer_weights *L = &s->m->layers[il];
    const int E = hp->n_embd;
    for (int r = 0; r < B; r++)
        rmsnorm(s->h + (size_t)r * E, s->x + (size_t)r * E, L->ffn_norm.data, E, hp->rms_eps);
    if (hp->n_expert > 0)
        return moe_ffn(s, B, L);
    return dense_ffn(s, B, L);
}

/* ---- the stage ---- */

static int check_batch(stage *s, const stage_batch *b)
{
    const model_hparams *hp = &s->m->hp;
    if (b->n_rows <= 0 || b->n_rows > s->p.n_batch)
        return rc_fail(RC_EINVAL, "batch of %d rows; this stage takes 1 to %d",
                       b->n_rows, s->p.n_batch);
    memcpy(s->seq_len, s->kv.len, (size_t)s->p.n_seq * sizeof(int));
    for (int r = 0; r < b->n_rows; r++) {
        int seq = b->seq[r], pos = b->pos[r];
        if (seq < 0 || seq >= s->p.n_seq)
            return rc_fail(RC_EINVAL, "row %d: sequence %d is outside 0..%d", r, seq, s->p.n_seq - 1);
        if (pos < 0 || pos >= s->p.n_ctx)
            return rc_fail(RC_EINVAL, "row %d: position %d is outside the context of %d",
                           r, pos, s->p.n_ctx);
        if (pos > s->seq_len[seq])
            return rc_fail(RC_EINVAL, "row %d: position %d of sequence %d leaves a hole (it holds %d)",
                           r, pos, seq, s->seq_len[seq]);
        s->seq_len[seq] = pos + 1;
        if (s->m->first == 0 && (!b->token || b->token[r] < 0 || b->token[r] >= hp->n_vocab))
            return rc_fail(RC_EINVAL, "row %d: token id %d is outside the vocabulary of %d",
                           r, b->token ? b->token[r] : -1, hp->n_vocab);
    }
    return 0;
}

int stage_forward(stage *s, const stage_batch *b, const float *in, float *out, int *n_out)
{
    const model *m = s->m;
    const model_hparams *hp = &m->hp;
    const int B = b->n_rows, E = hp->n_embd;
    int rc = check_batch(s, b);
    if (rc)
        return rc;
    if (m->first > 0 && !in)
        return rc_fail(RC_EINVAL, "a stage starting at layer %d needs hidden states", m->first);
    memcpy(s->len_was, s->kv.len, (size_t)s->p.n_seq * sizeof(int));
    memcpy(s->kv.len, s->seq_len, (size_t)s->p.n_seq * sizeof(int));

    if (m->first == 0) {
        const tensor_traits *tt = tensor_type_traits(m->tok_embd.type);
        for (int r = 0; r < B; r++)
            tt->to_float((const uint8_t *)m->tok_embd.data + (size_t)b->token[r] * m->tok_embd.row_bytes,
                         s->x + (size_t)r * E, E);
    } else {
        memcpy(s->x, in, (size_t)B * E * sizeof(float));
    }
    for (int r = 0; r < B; r++)
        rope_table(s, b->pos[r], s->rope_cs + (size_t)r * hp->rope_dim);

    for (int il = 0; il < s->n_layer_local; il++) {
        if ((rc = attention_block(s, b, il)) || (rc = ffn_block(s, B, il))) {
            memcpy(s->kv.len, s->len_was, (size_t)s->p.n_seq * sizeof(int));
            return rc;
        }
    }

    if (m->last < hp->n_layer) {
        memcpy(out, s->x, (size_t)B * E * sizeof(float));
        if (n_out)
            *n_out = B;
        return 0;
    }
    int n = 0;
    for (int r = 0; r < B; r++)
        if (!b->logits || b->logits[r])
            rmsnorm(s->h + (size_t)n++ * E, s->x + (size_t)r * E, m->output_norm.data, E, hp->rms_eps);
    if (n)
        matmul(s->pool, &m->output, s->h, E, n, out + m->shard.vocab0, hp->n_vocab,
               s->p.precision, s->mm_scratch);
    if (n_out)
        *n_out = n;
    return 0;
}

static size_t max_scratch(const model *m, int B, int mode)
{
    size_t best = 0;
    const tensor *all[] = { &m->output, &m->tok_embd };
#define CONSIDER(t) do { size_t b_ = (t)->data ? matmul_scratch_bytes((t), B, mode) : 0; \
                         if (b_ > best) best = b_; } while (0)
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CONSIDER(all[i]);
    for (int l = 0; l < m->last - m->first; l++) {
        const layer_weights *L = &m->layers[l];
        CONSIDER(&L->wq); CONSIDER(&L->wk); CONSIDER(&L->wv); CONSIDER(&L->wo);
        CONSIDER(&L->w_gate); CONSIDER(&L->w_up); CONSIDER(&L->w_down);
        CONSIDER(&L->gate_inp); CONSIDER(&L->gate_exps); CONSIDER(&L->up_exps);
        CONSIDER(&L->down_exps);
    }
#undef CONSIDER
    return best;
}

int stage_new(const model *m, const stage_params *p, stage **out)
{
    const model_hparams *hp = &m->hp;
    tensor_kernels_init();
    *out = NULL;
    if (p->n_ctx <= 0 || p->n_seq <= 0 || p->n_batch <= 0 || p->n_threads <= 0)
        return rc_fail(RC_EINVAL, "stage: context %d, sequences %d, batch %d and threads %d must be positive",
                       p->n_ctx, p->n_seq, p->n_batch, p->n_threads);
    stage *s = rc_calloc(1, sizeof *s);
    if (!s)
        return rc_fail(RC_ENOMEM, "out of memory creating a stage");
    s->m = m;
    s->p = *p;
    s->n_layer_local = m->last - m->first;
    int rc;
    if (m->shard.n_ranks > 1 && !p->reduce) {
        rc = rc_fail(RC_EINVAL, "stage: shard %d of %d needs a reduce function", m->shard.rank,
                     m->shard.n_ranks);
        goto fail;
    }
    rc = kv_cache_init(&s->kv, s->n_layer_local, p->n_seq, p->n_ctx, m->shard.n_head_kv,
                           hp->head_dim, hp->head_dim_v, p->kv_type);
    if (rc)
        goto fail;
    if (!(s->pool = pool_new(p->n_threads))) {
        rc = RC_ENOMEM;
        goto fail;
    }
    const size_t B = (size_t)p->n_batch, E = (size_t)hp->n_embd;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    size_t X = (size_t)(hp->n_expert > 0 ? hp->n_expert : 1);
    size_t K = (size_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 1);
    size_t hsz = B * (E > (size_t)hp->n_head * hp->head_dim_v ? E : (size_t)hp->n_head * hp->head_dim_v);
    struct { void **ptr; size_t n, size; } bufs[] = {
        { (void **)&s->x, B * E, sizeof(float) },
        { (void **)&s->h, hsz, sizeof(float) },
        { (void **)&s->q, B * hp->n_head * hp->head_dim, sizeof(float) },
        { (void **)&s->k, B * hp->n_head_kv * hp->head_dim, sizeof(float) },
        { (void **)&s->v, B * hp->n_head_kv * hp->head_dim_v, sizeof(float) },
        { (void **)&s->att, B * hp->n_head * hp->head_dim_v, sizeof(float) },
        { (void **)&s->ff_a, B * ff, sizeof(float) },
        { (void **)&s->ff_b, B * ff, sizeof(float) },
        { (void **)&s->ff_o, B * E, sizeof(float) },
        { (void **)&s->moe_acc, hp->n_expert > 0 && m->shard.n_ranks > 1 ? B * E : 1,
          sizeof(float) },
        { (void **)&s->scores, (size_t)p->n_threads * (hp->n_head / hp->n_head_kv) * p->n_ctx,
          sizeof(float) },
        { (void **)&s->rope_cs, B * hp->rope_dim, sizeof(float) },
        { (void **)&s->router, B * X, sizeof(float) },
        { (void **)&s->sel, B * K, sizeof(int) },
        { (void **)&s->sel_w, B * K, sizeof(float) },
        { (void **)&s->rows, B * K, sizeof(int) },
        { (void **)&s->rows_w, B * K, sizeof(float) },
        { (void **)&s->seq_len, (size_t)p->n_seq, sizeof(int) },
        { (void **)&s->len_was, (size_t)p->n_seq, sizeof(int) },
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        size_t bytes;
        if (rc_mul_size(bufs[i].n, bufs[i].size, &bytes) ||
            !(*bufs[i].ptr = rc_malloc_aligned(64, bytes))) {
            rc = rc_fail(RC_ENOMEM, "out of memory for the work buffers of a %zu-row batch", B);
            goto fail;
        }
    }
    size_t scratch = max_scratch(m, p->n_batch, p->precision);
    if (!(s->mm_scratch = rc_malloc_aligned(64, scratch ? scratch : 64))) {
        rc = rc_fail(RC_ENOMEM, "out of memory for matmul scratch (%zu bytes)", scratch);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    stage_free(s);
    return rc;
}

void stage_free(stage *s)
{
    if (!s)
        return;
    pool_free(s->pool);
    kv_cache_free(&s->kv);
    void *bufs[] = { s->x, s->h, s->q, s->k, s->v, s->att, s->ff_a, s->ff_b, s->ff_o, s->moe_acc,
                     s->scores, s->rope_cs, s->router, s->sel, s->sel_w, s->rows,
                     s->rows_w, s->seq_len, s->len_was, s->mm_scratch };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        rc_free_aligned(bufs[i]);
    rc_free(s);
}

void stage_seq_truncate(stage *s, int seq, int from) { kv_cache_truncate(&s->kv, seq, from); }
int stage_seq_len(const stage *s, int seq)
{
    return seq >= 0 && seq < s->kv.n_seq ? s->kv.len[seq] : 0;
}
const kv_cache *stage_kv(const stage *s) { return &s->kv; }
const model *stage_model(const stage *s) { return s->m; }
int stage_is_first(const stage *s) { return s->m->first == 0; }
int stage_is_last(const stage *s) { return s->m->last == s->m->hp.n_layer; }
