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
 *        + Wdown_s (silu(Wgate_s h) * Wup_s h)       (shared experts, if any)
 * Then, on the last stage: logits = Wout (rmsnorm(x) * output_norm); for an
 * embedding model (hp.pooling) just rmsnorm(x) * output_norm, every row.
 *
 * Latent attention (deepseek2, R = kv_lora_rank, Dr = rope dims, Dn = D - Dr)
 * replaces the q/k/v part, in the absorbed form:
 *   q = Wq_b rmsnorm(Wq_a h) (or Wq h); head j = [q_nope_j (Dn), q_pe_j (Dr)]
 *   a = Wkv_a h; c = rmsnorm(a[0:R]) * kv_a_norm; k_pe = rope(a[R:R+Dr])
 *   [c, k_pe] -> the cache (R + Dr values per position, shared by all heads)
 *   qa_j = [Wk_b_j q_nope_j (R), rope(q_pe_j)]: the query in the latent space
 *   o_j = Wv_b_j softmax(kq_scale qa_j . [c, k_pe]_t) c_t   over positions t
 * so that qa_j . [c_t, k_pe_t] = q_nope_j . k_nope_j(t) + q_pe_j . k_pe(t)
 * without ever expanding per-head keys and values.
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
    float *cq;      /* [B][Rq] compressed query (MLA) */
    float *kva;     /* [B][R+Dr] latent and rope key (MLA) */
    float *qa;      /* [B][H][R+Dr] queries in the latent space (MLA) */
    float *olat;    /* [B][H][R] attended latent per head (MLA) */
    double *rope_freq; /* [rope_dim/2] angle per position of each pair */
    float *k;       /* [B][Hk*D] */
    float *v;       /* [B][Hk*Dv] */
    float *att;     /* [B][H*Dv] attention output */
    float *ff_a;    /* [B][max(F, Fx)] gate */
    float *ff_b;    /* [B][max(F, Fx)] up */
    float *ff_o;    /* [B][E] FFN output before accumulation */
    float *moe_acc; /* [B][E] a MoE shard's part of the experts' sum (shards only) */
    float *scores;  /* [n_threads][group][n_ctx] attention weights per thread */
    int   group;    /* query heads attending over one cached head */
    float *rope_cs; /* [B][rope_dim] cos, sin pairs per row */
    float *router;  /* [B][X] */
    float *choose;  /* [X] one row's expert selection scores */
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

/* The angle per position of each rotated pair: base^(-2i/d), scaled
 * linearly or by Llama 3.1's rope_freqs; with YaRN, pairs of high frequency
 * keep their angle, those of low frequency are interpolated by the factor,
 * and a ramp blends the ones between (llama.cpp's beta_fast 32, beta_slow 1). */
static void rope_init(stage *s)
{
    const model_hparams *hp = &s->m->hp;
    const float *ff = s->m->rope_freqs.data;
    const int half = hp->rope_dim / 2, d = hp->rope_dim;
    double low = 0, high = 0;
    if (hp->yarn_factor > 0) {
        const double b = hp->rope_base, n0 = hp->yarn_orig_ctx;
        low = floor(d * log(n0 / (2 * M_PI * 32)) / (2 * log(b)));
        high = ceil(d * log(n0 / (2 * M_PI * 1)) / (2 * log(b)));
        low = low < 0 ? 0 : low;
        high = high > d - 1 ? d - 1 : high;
    }
    for (int i = 0; i < half; i++) {
        double f = hp->rope_freq_scale * pow((double)hp->rope_base, -2.0 * i / d);
        if (ff)
            f /= ff[i];
        if (hp->yarn_factor > 0) {
            double fe = pow((double)hp->rope_base, -2.0 * i / d);
            double y = (i - low) / fmax(0.001, high - low);
            double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            f = fe / hp->yarn_factor * (1.0 - ramp) + fe * ramp;
        }
        s->rope_freq[i] = f;
    }
}

static void rope_table(const stage *s, int pos, float *cs)
{
    const model_hparams *hp = &s->m->hp;
    const int half = hp->rope_dim / 2;
    const double mul = hp->rope_attn_factor;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * s->rope_freq[i];
        cs[2 * i] = (float)(cos(theta) * mul);
        cs[2 * i + 1] = (float)(sin(theta) * mul);
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
    const float scale = hp->kq_scale;
    float *scores = s->scores + (size_t)ith * s->group * s->p.n_ctx;
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

/* Latent attention: every query head of a row reads the same cached
 * latent, so a row's heads go together (one pass over the cache) unless
 * there are fewer rows than threads; then each row's heads are cut into
 * chunks, one per thread, each reading the cache once. */
static void attention_task_mla(void *arg, int ith, int nth)
{
    att_task *t = arg;
    stage *s = t->s;
    const model_hparams *hp = &s->m->hp;
    const int H = s->m->shard.n_head, R = hp->kv_lora_rank, W = R + hp->rope_dim;
    const int B = t->b->n_rows;
    const int chunks = B >= nth ? 1 : (nth + B - 1) / B < H ? (nth + B - 1) / B : H;
    float *scores = s->scores + (size_t)ith * s->group * s->p.n_ctx;
    const long n_items = (long)B * chunks;
    for (long item = ith; item < n_items; item += nth) {
        int r = (int)(item / chunks), c = (int)(item % chunks);
        int h0 = c * H / chunks, h1 = (c + 1) * H / chunks;
        const void *latent = kv_k(&s->kv, t->layer, t->b->seq[r], 0);
        /* The values are the latent c: the first R of each cached row. */
        tensor_attend(s->qa + ((size_t)r * H + h0) * W, h1 - h0, W, R, hp->kq_scale, s->kv.type,
                      latent, (size_t)W, latent, (size_t)W, t->b->pos[r] + 1, scores,
                      s->olat + ((size_t)r * H + h0) * R);
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

/* x += Wo att: the heads' outputs into the residual stream (a shard's
 * part, summed over the shards, unless every shard runs every head). */
static int attention_out(stage *s, const layer_weights *L, int B)
{
    const size_t n = (size_t)B * s->m->hp.n_embd;
    mm(s, &L->wo, s->att, B, s->h);
    int rc = s->m->shard.attn_whole ? 0 : reduce(s, s->h, B);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        s->x[i] += s->h[i];
    return 0;
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

    return attention_out(s, L, B);
}

/* One matrix per head (a 3-D tensor's slices): Y_j = W_j X_j for every
 * head j of the row-major [B][H][..] layouts at X and Y. */
static void mm_heads(stage *s, const tensor *W, int H, const float *X, int x_width, int B,
                     float *Y, int y_width)
{
    matmul_batched(s->pool, W, H, X, H * x_width, (size_t)x_width, B, Y, H * y_width,
                   (size_t)y_width, s->p.precision, s->mm_scratch);
}

static int attention_block_mla(stage *s, const stage_batch *b, int il)
{
    const model_hparams *hp = &s->m->hp;
    const layer_weights *L = &s->m->layers[il];
    const int B = b->n_rows, E = hp->n_embd, H = s->m->shard.n_head;
    const int D = hp->head_dim, Dv = hp->head_dim_v, Dr = hp->rope_dim, Dn = D - Dr;
    const int R = hp->kv_lora_rank, Rq = hp->q_lora_rank, W = R + Dr;

    for (int r = 0; r < B; r++)
        rmsnorm(s->h + (size_t)r * E, s->x + (size_t)r * E, L->attn_norm.data, E, hp->rms_eps);
    if (L->wq_a.data) {
        mm(s, &L->wq_a, s->h, B, s->cq);
        for (int r = 0; r < B; r++)
            rmsnorm(s->cq + (size_t)r * Rq, s->cq + (size_t)r * Rq, L->q_a_norm.data, Rq,
                    hp->rms_eps);
        mm(s, &L->wq_b, s->cq, B, s->q);
    } else {
        mm(s, &L->wq, s->h, B, s->q);
    }
    mm(s, &L->wkv_a, s->h, B, s->kva);
    for (int r = 0; r < B; r++) {
        float *a = s->kva + (size_t)r * W, *q = s->q + (size_t)r * H * D;
        const float *cs = s->rope_cs + (size_t)r * Dr;
        rmsnorm(a, a, L->kv_a_norm.data, R, hp->rms_eps);
        rope_head(a + R, cs, Dr, false);
        for (int j = 0; j < H; j++) {
            rope_head(q + (size_t)j * D + Dn, cs, Dr, false);
            memcpy(s->qa + ((size_t)r * H + j) * W + R, q + (size_t)j * D + Dn,
                   (size_t)Dr * sizeof(float));
        }
        /* Written before any row attends (causal prompt, as above). */
        kv_cache_store(&s->kv, il, b->seq[r], b->pos[r], a, NULL);
    }
    /* q_nope into the latent space; the rope part was copied above. */
    mm_heads(s, &L->wk_b, H, s->q, D, B, s->qa, W);

    att_task t = { s, b, il };
    pool_run(s->pool, attention_task_mla, &t);

    mm_heads(s, &L->wv_b, H, s->olat, R, B, s->att, Dv);
    return attention_out(s, L, B);
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
    const int E = s->m->hp.n_embd, F = (int)L->w_gate.ne[1];
    mm(s, &L->w_gate, s->h, B, s->ff_a);
    mm(s, &L->w_up, s->h, B, s->ff_b);
    swiglu(s, s->ff_a, s->ff_b, (size_t)B * F);
    mm(s, &L->w_down, s->ff_a, B, s->ff_o);
    int rc = s->m->shard.ffn_whole ? 0 : reduce(s, s->ff_o, B);
    if (rc)
        return rc;
    for (size_t i = 0; i < (size_t)B * E; i++)
        s->x[i] += s->ff_o[i];
    return 0;
}

/* The routing of one row (llama.cpp's rules): gate = softmax or sigmoid
 * of the router's logits; the scores that choose add the selection bias
 * (deepseek2's exp_probs_b), which never enters the weights; with expert
 * groups, only the groups whose two best scores sum highest may be chosen;
 * the K best scores win (lowest index on ties); their gate values are
 * renormalised (optionally, floored at 2^-14) and scaled. */
static float route_row(stage *s, const layer_weights *L, float *g, int *sel, float *w)
{
    const model_hparams *hp = &s->m->hp;
    const int X = hp->n_expert, K = hp->n_expert_used, G = hp->n_expert_group;
    if (hp->expert_gating == GATING_SIGMOID)
        for (int e = 0; e < X; e++)
            g[e] = 1.0f / (1.0f + expf(-g[e]));
    else
        tensor_softmax(g, X);
    float *c = s->choose, margin = INFINITY;
    const float *bias = L->exp_probs_b.data;
    for (int e = 0; e < X; e++)
        c[e] = bias ? g[e] + bias[e] : g[e];
    if (G > 1) {
        const int per = X / G;
        float gs[64];
        for (int k = 0; k < G; k++) {
            float a = -INFINITY, b2 = -INFINITY;
            for (int e = k * per; e < (k + 1) * per; e++) {
                if (c[e] > a) { b2 = a; a = c[e]; }
                else if (c[e] > b2) b2 = c[e];
            }
            gs[k] = a + b2;
        }
        /* keep the best groups: mark the others by clearing their bit */
        uint64_t kept = 0;
        float last_kept = INFINITY, best_dropped = -INFINITY;
        for (int n = 0; n < hp->n_expert_group_used; n++) {
            int best = -1;
            for (int k = 0; k < G; k++)
                if (!(kept >> k & 1) && (best < 0 || gs[k] > gs[best]))
                    best = k;
            kept |= 1ull << best;
            last_kept = gs[best];
        }
        for (int k = 0; k < G; k++)
            if (!(kept >> k & 1) && gs[k] > best_dropped)
                best_dropped = gs[k];
        margin = last_kept - best_dropped;
        for (int k = 0; k < G; k++)
            if (!(kept >> k & 1))
                for (int e = k * per; e < (k + 1) * per; e++)
                    c[e] = -INFINITY;
    }
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken |= sel[j] == e;
            if (!taken && (best < 0 || c[e] > c[best]))
                best = e;
        }
        sel[k] = best;
        w[k] = g[best];
        sum += g[best];
    }
    if (hp->expert_weights_norm)
        for (int k = 0; k < K; k++)
            w[k] /= sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    if (hp->expert_weights_scale != 1.0f)
        for (int k = 0; k < K; k++)
            w[k] *= hp->expert_weights_scale;
    if (s->p.on_route) {
        float left = -INFINITY;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int j = 0; j < K; j++)
                taken |= sel[j] == e;
            if (!taken && c[e] > left)
                left = c[e];
        }
        if (c[sel[K - 1]] - left < margin)
            margin = c[sel[K - 1]] - left;
    }
    return margin;
}

/* Each expert runs once over the rows that chose it; shared experts run
 * over every row.  A tensor-parallel shard holds a range of the experts
 * (and of the shared experts' units): it adds its parts into moe_acc, and
 * the sum over shards goes to the residual (the whole model adds straight
 * into it). */
static int moe_ffn(stage *s, int B, const layer_weights *L)
{
    const model_hparams *hp = &s->m->hp;
    const int E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, Fx = (int)L->gate_exps.ne[1];
    const int e0 = s->m->shard.exp0, n_exp = s->m->shard.n_exp;
    const bool cut = s->m->shard.n_ranks > 1;
    float *acc = cut ? s->moe_acc : s->x;
    if (cut)
        memset(acc, 0, (size_t)B * E * sizeof(float));
    mm(s, &L->gate_inp, s->h, B, s->router);
    for (int r = 0; r < B; r++) {
        float margin = route_row(s, L, s->router + (size_t)r * X, s->sel + (size_t)r * K,
                                 s->sel_w + (size_t)r * K);
        if (s->p.on_route)
            s->p.on_route(s->p.route_ud, s->m->first + (int)(L - s->m->layers), r,
                          s->sel + (size_t)r * K, K, margin);
    }
    for (int e = e0; e < e0 + n_exp; e++) {
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
        tensor gate = tensor_slice2(&L->gate_exps, e - e0), up = tensor_slice2(&L->up_exps, e - e0),
               down = tensor_slice2(&L->down_exps, e - e0);
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
    if (L->gate_shexp.data) {
        const int Fs = (int)L->gate_shexp.ne[1];
        mm(s, &L->gate_shexp, s->h, B, s->ff_a);
        mm(s, &L->up_shexp, s->h, B, s->ff_b);
        swiglu(s, s->ff_a, s->ff_b, (size_t)B * Fs);
        mm(s, &L->down_shexp, s->ff_a, B, s->ff_o);
        for (size_t i = 0; i < (size_t)B * E; i++)
            acc[i] += s->ff_o[i];
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
    if (L->gate_inp.data)
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
        rc = hp->kv_lora_rank > 0 ? attention_block_mla(s, b, il) : attention_block(s, b, il);
        if (rc || (rc = ffn_block(s, B, il))) {
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
    if (hp->pooling != POOL_NONE) {
        /* An embedding model pools over every row of a sequence (executor's
         * embed_pool): all rows come out, normed, and no logits. */
        for (int r = 0; r < B; r++)
            rmsnorm(out + (size_t)r * E, s->x + (size_t)r * E, m->output_norm.data, E, hp->rms_eps);
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
#define CONSIDER(t) do { size_t b_ = (t)->data && (t)->n_dims > 1 ? \
                             matmul_scratch_bytes((t), B, mode) : 0; \
                         if (b_ > best) best = b_; } while (0)
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CONSIDER(all[i]);
    for (int l = 0; l < m->last - m->first; l++) {
        const layer_weights *L = &m->layers[l];
        const tensor *t = (const tensor *)L;
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor); i++)
            CONSIDER(&t[i]);
        /* the per-head products convert every head's rows at once */
        const tensor *heads[] = { &L->wk_b, &L->wv_b };
        for (int h = 0; h < 2; h++) {
            size_t b_ = heads[h]->data ? matmul_scratch_bytes(heads[h], B * (int)heads[h]->ne[2], mode) : 0;
            if (b_ > best) best = b_;
        }
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
    /* Latent attention caches one row of R + Dr per position for all heads. */
    const bool mla = hp->kv_lora_rank > 0;
    const int W = hp->kv_lora_rank + hp->rope_dim;
    rc = mla ? kv_cache_init(&s->kv, s->n_layer_local, p->n_seq, p->n_ctx, 1, W, 0, p->kv_type)
             : kv_cache_init(&s->kv, s->n_layer_local, p->n_seq, p->n_ctx, m->shard.n_head_kv,
                             hp->head_dim, hp->head_dim_v, p->kv_type);
    s->group = mla ? m->shard.n_head : m->shard.n_head / m->shard.n_head_kv;
    if (rc)
        goto fail;
    if (!(s->pool = pool_new(p->n_threads))) {
        rc = RC_ENOMEM;
        goto fail;
    }
    const size_t B = (size_t)p->n_batch, E = (size_t)hp->n_embd;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    if ((size_t)hp->n_expert_shared * hp->n_ff_exp > ff)
        ff = (size_t)hp->n_expert_shared * hp->n_ff_exp;
    const size_t H = (size_t)hp->n_head;
    size_t X = (size_t)(hp->n_expert > 0 ? hp->n_expert : 1);
    size_t K = (size_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 1);
    size_t hsz = B * (E > (size_t)hp->n_head * hp->head_dim_v ? E : (size_t)hp->n_head * hp->head_dim_v);
    struct { void **ptr; size_t n, size; } bufs[] = {
        { (void **)&s->x, B * E, sizeof(float) },
        { (void **)&s->h, hsz, sizeof(float) },
        { (void **)&s->q, B * hp->n_head * hp->head_dim, sizeof(float) },
        { (void **)&s->cq, mla && hp->q_lora_rank ? B * hp->q_lora_rank : 1, sizeof(float) },
        { (void **)&s->kva, mla ? B * W : 1, sizeof(float) },
        { (void **)&s->qa, mla ? B * H * W : 1, sizeof(float) },
        { (void **)&s->olat, mla ? B * H * hp->kv_lora_rank : 1, sizeof(float) },
        { (void **)&s->rope_freq, (size_t)hp->rope_dim / 2, sizeof(double) },
        { (void **)&s->choose, X, sizeof(float) },
        { (void **)&s->k, B * hp->n_head_kv * hp->head_dim, sizeof(float) },
        { (void **)&s->v, B * hp->n_head_kv * hp->head_dim_v, sizeof(float) },
        { (void **)&s->att, B * hp->n_head * hp->head_dim_v, sizeof(float) },
        { (void **)&s->ff_a, B * ff, sizeof(float) },
        { (void **)&s->ff_b, B * ff, sizeof(float) },
        { (void **)&s->ff_o, B * E, sizeof(float) },
        { (void **)&s->moe_acc, hp->n_expert > 0 && m->shard.n_ranks > 1 ? B * E : 1,
          sizeof(float) },
        { (void **)&s->scores, (size_t)p->n_threads * s->group * p->n_ctx, sizeof(float) },
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
    rope_init(s);
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
    void *bufs[] = { s->x, s->h, s->q, s->cq, s->kva, s->qa, s->olat, s->rope_freq, s->choose,
                     s->k, s->v, s->att, s->ff_a, s->ff_b, s->ff_o, s->moe_acc,
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
int stage_batch_rows(const stage *s) { return s->p.n_batch; }
int stage_is_first(const stage *s) { return s->m->first == 0; }
int stage_is_last(const stage *s) { return s->m->last == s->m->hp.n_layer; }
