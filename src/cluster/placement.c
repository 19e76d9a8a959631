/* placement.c - layer ranges to nodes (see placement.h for the rule).
 *
 * Layout: the candidate sets of nodes (one node by speed, then k = 2, 3...
 * nodes by memory, improved by swapping in faster nodes), the split of one
 * ordered set by dynamic programming, and the advice when nothing fits
 * (searches that re-run the same placement with less context, smaller
 * weights, or one more node).  Vocabulary: L = n_layer, k = stages.
 */
#include "cluster/placement.h"

#include "base/err.h"
#include "base/mem.h"
#include "tensor/kv_types.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* One placement problem: what try_set and the searches share. */
typedef struct {
    const model_sizes *ms;
    const placement_node *nodes;
    int n;
    const double *link_ms;
    int min_nodes;
    bool tensor;              /* shards of every layer instead of layer ranges */
    bool cut_known;           /* tensor: only into shard counts in ms->tp_ways */
    uint64_t tokens;          /* KV positions in all: n_ctx * n_seq */
    double wscale;            /* weights scaled (advice: a smaller quantisation) */
    bool fit_only;            /* the advice's searches: whether it fits, not how fast */
    uint64_t *avail;          /* [n] */
    uint64_t *pre;            /* [L + 1] prefix sums of layer_bytes */
    int *order;               /* [n + 1] scratch (advice adds a node) */
    double *cost;             /* [(k+1) * (L+1)] */
    int *from;                /* [(k+1) * (L+1)] */
} problem;

uint64_t placement_default_reserve(uint64_t mem_total)
{
    uint64_t tenth = mem_total / 10;
    return tenth > PLACEMENT_MIN_RESERVE ? tenth : PLACEMENT_MIN_RESERVE;
}

uint64_t placement_node_avail(const placement_node *n, uint64_t reserve)
{
    if (!n->mem_free)
        return n->mem_avail;
    if (!reserve)
        reserve = placement_default_reserve(n->mem_total);
    uint64_t a = n->mem_free > reserve ? n->mem_free - reserve : 0;
    uint64_t offer = n->mem_offer ? n->mem_offer : n->mem_free;
    return a < offer ? a : offer;
}

static double bw_of(const placement_node *n)
{
    return n->bw_gbs > 0 ? n->bw_gbs : PLACEMENT_DEFAULT_BW_GBS;
}

static double hop_ms(const problem *P, int i, int j)
{
    double v = P->link_ms ? P->link_ms[(size_t)i * (size_t)P->n + (size_t)j] : -1;
    return v >= 0 ? v : PLACEMENT_DEFAULT_HOP_MS;
}

static uint64_t scaled(const problem *P, uint64_t b)
{
    return P->wscale == 1.0 ? b : (uint64_t)((double)b * P->wscale);
}

/* Weights a stage [a, b) maps, with the problem's scale. */
static uint64_t stage_weights(const problem *P, int a, int b)
{
    const model_sizes *ms = P->ms;
    uint64_t w = ms->shared_bytes + P->pre[b] - P->pre[a];
    if (a == 0)
        w += ms->embd_bytes;
    if (b == ms->n_layer)
        w += ms->output_bytes + (ms->tied && a != 0 ? ms->embd_bytes : 0);
    return scaled(P, w);
}

static uint64_t stage_need(const problem *P, int a, int b)
{
    return stage_weights(P, a, b) + model_sizes_kv_bytes(P->ms, a, b, P->tokens);
}

static uint64_t total_need(const problem *P)
{
    return stage_need(P, 0, P->ms->n_layer);
}

/* Stage s of a placement on node `node`, its bytes still to fill. */
static placement_stage *stage_on(const problem *P, placement *p, int s, int node)
{
    placement_stage *st = &p->stage[s];
    memset(st, 0, sizeof *st);
    st->node = node;
    snprintf(st->id, sizeof st->id, "%s", P->nodes[node].id);
    snprintf(st->name, sizeof st->name, "%s", P->nodes[node].name);
    return st;
}

/* Tensor parallel over the k nodes of `set`: equal parts of every layer,
 * but for what every shard holds whole (norms, routers, latent
 * projections; all attention heads where the heads cannot be cut; the
 * latent KV cache).  A token waits for the slowest node, and for 2
 * exchanges per layer (1 when the attention is not cut) plus the logits'
 * gather over the slowest link of the set. */
static bool try_tensor(const problem *P, const int *set, int k, placement *p)
{
    const model_sizes *ms = P->ms;
    if (P->cut_known && !(k < 32 && (ms->tp_ways >> k & 1u)))
        return false;                     /* the model cannot be cut k ways */
    const int L = ms->n_layer;
    const bool whole = k < 32 && (ms->tp_attn_whole >> k & 1u);
    const bool ffn_whole = k < 32 && (ms->tp_ffn_whole >> k & 1u);
    const uint64_t rep = ms->replicated_bytes + (whole ? ms->attn_bytes : 0) +
                         (ffn_whole ? ms->ffn_bytes : 0);
    uint64_t cut = P->pre[L] + (ms->tied ? 0 : ms->output_bytes);
    cut = cut > rep ? cut - rep : 0;
    uint64_t weights = scaled(P, ms->shared_bytes + ms->embd_bytes + rep + cut / (uint64_t)k);
    uint64_t kv = model_sizes_kv_bytes(ms, 0, L, P->tokens) / (ms->kv_whole || whole ? 1 : (uint64_t)k);
    uint64_t all = model_sizes_stage_decode_bytes(ms, 0, L);
    all = all > rep ? all - rep : 0;
    double decode = (double)scaled(P, rep) + (double)scaled(P, all) / k;
    double slowest = 0, hop = 0;
    for (int s = 0; s < k; s++) {
        if (weights + kv > P->avail[set[s]] || P->nodes[set[s]].old_cut)
            return false;
        double t = decode / (bw_of(&P->nodes[set[s]]) * 1e9) * 1e3;
        slowest = t > slowest ? t : slowest;
        for (int q = 0; q < k; q++)
            if (q != s && hop_ms(P, set[s], set[q]) > hop)
                hop = hop_ms(P, set[s], set[q]);
    }
    p->fits = true;
    p->tensor = true;
    p->n_stages = k;
    for (int s = 0; s < k; s++) {
        placement_stage *st = stage_on(P, p, s, set[s]);
        const placement_node *nd = &P->nodes[set[s]];
        st->first = 0;
        st->last = L;
        st->weight_bytes = weights;
        st->kv_bytes = kv;
        st->ms_per_token = decode / (bw_of(nd) * 1e9) * 1e3;
    }
    double ms_tok = slowest + ((whole ? 1.0 : 2.0) * L + 1) * hop;
    p->tokens_per_s = ms_tok > 0 ? 1000.0 / ms_tok : 0;
    return true;
}

/* Splits the layers over the nodes of `set` in that order.  A pipeline
 * runs at the pace of its slowest stage, so the split balances the time of
 * a token on each stage - the bytes its layers read per token (the last
 * stage's include the output matrix; the first stage reads one row of the
 * embeddings) over its node's bandwidth - and what a node can hold is a
 * hard limit: of all splits where every stage has >= 1 layer and fits its
 * node, the one whose stage times are closest to equal (least squares).
 * Fills *p and returns true when one exists. */
static bool try_set(const problem *P, const int *set, int k, placement *p)
{
    const int L = P->ms->n_layer;
    if (k < 1 || k > PLACEMENT_MAX_STAGES || (k > L && !P->tensor))
        return false;
    if (P->tensor && k > 1)
        return try_tensor(P, set, k, p);
    double sum_bw = 0;
    for (int s = 0; s < k; s++)
        sum_bw += bw_of(&P->nodes[set[s]]);
    /* equal time on every stage: the whole token's bytes over all bandwidth */
    double t_eq = (double)model_sizes_stage_decode_bytes(P->ms, 0, L) / sum_bw;
    t_eq = t_eq > 0 ? t_eq : 1;
    const size_t W = (size_t)L + 1;
    for (size_t i = 0; i < (size_t)(k + 1) * W; i++)
        P->cost[i] = INFINITY;
    P->cost[0] = 0;
    for (int s = 0; s < k; s++) {
        uint64_t cap = P->avail[set[s]];
        /* stage s ends at b, leaving at least one layer per later stage */
        for (int b = s + 1; b <= L - (k - 1 - s); b++) {
            for (int a = s; a < b; a++) {
                double c0 = P->cost[(size_t)s * W + (size_t)a];
                if (c0 == INFINITY)
                    continue;
                uint64_t need = stage_need(P, a, b);
                if (need > cap)
                    continue;
                double t = (double)model_sizes_stage_decode_bytes(P->ms, a, b) /
                           bw_of(&P->nodes[set[s]]);
                double d = (t - t_eq) / t_eq;
                double c = c0 + d * d;
                if (c < P->cost[(size_t)(s + 1) * W + (size_t)b]) {
                    P->cost[(size_t)(s + 1) * W + (size_t)b] = c;
                    P->from[(size_t)(s + 1) * W + (size_t)b] = a;
                }
            }
        }
    }
    if (P->cost[(size_t)k * W + (size_t)L] == INFINITY)
        return false;
    p->fits = true;
    p->n_stages = k;
    int b = L;
    for (int s = k - 1; s >= 0; s--) {
        int a = P->from[(size_t)(s + 1) * W + (size_t)b];
        placement_stage *st = stage_on(P, p, s, set[s]);
        const placement_node *nd = &P->nodes[set[s]];
        st->first = a;
        st->last = b;
        st->weight_bytes = stage_weights(P, a, b);
        st->kv_bytes = model_sizes_kv_bytes(P->ms, a, b, P->tokens);
        st->ms_per_token = (double)scaled(P, model_sizes_stage_decode_bytes(P->ms, a, b)) /
                           (bw_of(nd) * 1e9) * 1e3;
        b = a;
    }
    double ms = 0;
    for (int s = 0; s < k; s++)
        ms += p->stage[s].ms_per_token;
    /* activations to the next stage, and the sampled token back to the first */
    if (k > 1) {
        for (int s = 0; s + 1 < k; s++)
            ms += hop_ms(P, set[s], set[s + 1]);
        ms += hop_ms(P, set[k - 1], set[0]);
    }
    p->tokens_per_s = ms > 0 ? 1000.0 / ms : 0;
    return true;
}

/* Orders of the candidates: known speed first, fastest first (the node
 * placing first among equals), most memory first, by id.
 * Each returns < 0 when node i goes before node j. */
static int by_speed(const problem *P, int i, int j)
{
    const placement_node *a = &P->nodes[i], *b = &P->nodes[j];
    if ((a->bw_gbs > 0) != (b->bw_gbs > 0))
        return a->bw_gbs > 0 ? -1 : 1;
    if (bw_of(a) != bw_of(b))
        return bw_of(a) > bw_of(b) ? -1 : 1;
    if (a->gflops != b->gflops)
        return a->gflops > b->gflops ? -1 : 1;
    if (a->self != b->self)
        return a->self ? -1 : 1;
    int c = strcmp(a->id, b->id);
    return c ? c : i - j;
}
static int by_mem(const problem *P, int i, int j)
{
    if (P->avail[i] != P->avail[j])
        return P->avail[i] > P->avail[j] ? -1 : 1;
    return by_speed(P, i, j);
}
static int by_id(const problem *P, int i, int j)
{
    int c = strcmp(P->nodes[i].id, P->nodes[j].id);
    return c ? c : i - j;
}

/* Insertion sort with the problem as context (qsort has none in C11);
 * node counts are small. */
static void sort_idx(const problem *P, int *idx, int n, int (*cmp)(const problem *, int, int))
{
    for (int i = 1; i < n; i++) {
        int v = idx[i], j = i;
        for (; j > 0 && cmp(P, idx[j - 1], v) > 0; j--)
            idx[j] = idx[j - 1];
        idx[j] = v;
    }
}

/* The placement by the rule; false when nothing fits. */
static bool place(const problem *P, placement *p)
{
    const int L = P->ms->n_layer;
    int *order = P->order;
    for (int i = 0; i < P->n; i++)
        order[i] = i;
    int kmin = P->min_nodes > 1 ? P->min_nodes : 1;
    if (kmin == 1) {
        sort_idx(P, order, P->n, by_speed);
        for (int i = 0; i < P->n; i++)
            if (try_set(P, &order[i], 1, p))
                return true;
        kmin = 2;
    }
    sort_idx(P, order, P->n, by_mem);
    /* a pipeline stage holds at least one layer; shards hold parts of all */
    int kmax = P->n < L || P->tensor ? P->n : L;
    if (kmax > PLACEMENT_MAX_STAGES)
        kmax = PLACEMENT_MAX_STAGES;
    for (int k = kmin; k <= kmax; k++) {
        int set[PLACEMENT_MAX_STAGES];
        memcpy(set, order, (size_t)k * sizeof *set);
        sort_idx(P, set, k, by_id);
        if (!try_set(P, set, k, p))
            continue;
        if (P->fit_only)
            return true;
        /* the k nodes with the most memory hold it; a faster node with
         * less memory may do instead of a slow one */
        bool improved = true;
        for (int round = 0; improved && round < P->n; round++) {
            improved = false;
            for (int j = 0; j < k && !improved; j++) {
                for (int o = k; o < P->n && !improved; o++) {
                    int cand = order[o];
                    bool used = false;
                    for (int q = 0; q < k; q++)
                        used = used || set[q] == cand;
                    if (used || bw_of(&P->nodes[cand]) <= bw_of(&P->nodes[set[j]]) ||
                        (P->nodes[cand].bw_gbs <= 0 && P->nodes[set[j]].bw_gbs > 0))
                        continue;
                    int trial[PLACEMENT_MAX_STAGES];
                    memcpy(trial, set, (size_t)k * sizeof *trial);
                    trial[j] = cand;
                    sort_idx(P, trial, k, by_id);
                    placement q;
                    memset(&q, 0, sizeof q);
                    if (try_set(P, trial, k, &q) && q.tokens_per_s > p->tokens_per_s * 1.0001) {
                        memcpy(set, trial, (size_t)k * sizeof *set);
                        *p = q;
                        improved = true;
                    }
                }
            }
        }
        return true;
    }
    return false;
}

/* Bytes for people: MiB below 1 GiB, else GiB with 2 decimals below 10 GiB
 * and 1 above; amounts to add are rounded up (so "X more" is enough).
 * Returns one of a few rotating buffers, for several in one message. */
static const char *gib_r(uint64_t b, bool up)
{
    static _Thread_local char buf[6][32];
    static _Thread_local int next;
    char *o = buf[next++ % 6];
    double g = (double)b / GIB;
    double (*r)(double) = up ? ceil : round;
    if (b < ((uint64_t)1 << 30))
        snprintf(o, 32, "%.0f MiB", r((double)b / (1024.0 * 1024.0)));
    else if (g < 10)
        snprintf(o, 32, "%.2f GiB", r(g * 100) / 100);
    else
        snprintf(o, 32, "%.1f GiB", r(g * 10) / 10);
    return o;
}
static const char *gib(uint64_t b) { return gib_r(b, false); }
static const char *gib_up(uint64_t b) { return gib_r(b, true); }

static void say(placement *p, const char *fmt, ...)
{
    size_t used = strlen(p->advice);
    if (used + 1 >= sizeof p->advice)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->advice + used, sizeof p->advice - used, fmt, ap);
    va_end(ap);
}

/* Quantisations racimo loads, by approximate bits per weight, largest first. */
static const struct { const char *name; double bpw; } quants[] = {
    { "Q8_0", 8.5 }, { "Q6_K", 6.56 }, { "Q5_K_M", 5.7 }, { "Q4_K_M", 4.9 }, { "Q4_0", 4.5 },
};

static void advise(problem *P, const placement_opts *o, placement *p)
{
    placement scratch;
    const int L = P->ms->n_layer;
    P->fit_only = true;
    int kmin = o->min_nodes > 1 ? o->min_nodes : 1;
    if (P->n == 0) {
        say(p, "no node is up to place the model on.");
        return;
    }
    if (kmin > P->n) {
        say(p, "--min-nodes %d asks for more nodes than the %d up.", kmin, P->n);
        return;
    }
    if ((kmin > L && !P->tensor) || kmin > PLACEMENT_MAX_STAGES) {
        say(p, "--min-nodes %d is more stages than possible (the model has %d layers; at most %d "
               "stages).", kmin, L, PLACEMENT_MAX_STAGES);
        return;
    }
    if (p->need_bytes > p->have_bytes)
        say(p, "needs %s (weights %s + KV cache %s for %llu tokens), the nodes offer %s: short "
               "by %s.", gib(p->need_bytes), gib(stage_weights(P, 0, L)),
            gib(model_sizes_kv_bytes(P->ms, 0, L, P->tokens)), (unsigned long long)P->tokens,
            gib(p->have_bytes), gib_up(p->need_bytes - p->have_bytes));
    else
        say(p, "needs %s and the nodes offer %s in all, but no split into whole layers fits "
               "them.", gib(p->need_bytes), gib(p->have_bytes));

    /* the most context that fits (monotone: fewer tokens never need more) */
    uint64_t tok = P->tokens;
    P->tokens = (uint64_t)o->n_seq;
    bool one = place(P, &scratch);
    if (one) {
        long lo = 1, hi = o->n_ctx - 1;
        while (lo < hi) {
            long mid = lo + (hi - lo + 1) / 2;
            P->tokens = (uint64_t)mid * (uint64_t)o->n_seq;
            if (place(P, &scratch))
                lo = mid;
            else
                hi = mid - 1;
        }
        say(p, " Fewer context tokens: --ctx %ld fits%s.", lo,
            o->n_seq > 1 ? " with this --parallel" : "");
    } else {
        say(p, " The weights alone do not fit, at any context.");
    }
    P->tokens = tok;

    /* the same context in a q8_0 cache (a little over half of f16's bytes) */
    if (one && P->ms->kv_type != TT_Q8_0 && P->ms->kv_heads > 0) {
        const model_sizes *ms = P->ms;
        model_sizes q8 = *ms;
        model_sizes_set_kv_type(&q8, TT_Q8_0);
        P->ms = &q8;
        if (place(P, &scratch))
            say(p, " A q8_0 KV cache (--cache-type q8_0: %s) would fit.",
                gib(model_sizes_kv_bytes(&q8, 0, L, P->tokens)));
        P->ms = ms;
    }

    /* a smaller quantisation, estimated by scaling all the weights */
    if (P->ms->n_params > 0) {
        double bpw = (double)P->ms->total_bytes * 8.0 / (double)P->ms->n_params;
        const char *fit = NULL;
        uint64_t fit_b = 0, last_b = 0;
        for (size_t i = 0; i < sizeof quants / sizeof quants[0]; i++) {
            if (quants[i].bpw >= bpw * 0.97)
                continue;
            P->wscale = quants[i].bpw / bpw;
            last_b = stage_weights(P, 0, L);
            if (place(P, &scratch)) {
                fit = quants[i].name;
                fit_b = last_b;
                break;
            }
        }
        P->wscale = 1.0;
        if (fit)
            say(p, " A smaller quantisation: %s (about %s of weights, from %.1f bits per "
                   "weight now) would fit.", fit, gib(fit_b), bpw);
        else if (last_b > 0)
            say(p, " Even Q4_0 (about %s of weights) would not fit.", gib(last_b));
    }

    /* one more node, as fast as the fastest: the least memory that makes it fit */
    {
        problem Q = *P;
        placement_node *more = rc_mallocarray((size_t)P->n + 1, sizeof *more);
        uint64_t *avail = rc_mallocarray((size_t)P->n + 1, sizeof *avail);
        if (more && avail) {
            memcpy(more, P->nodes, (size_t)P->n * sizeof *more);
            memcpy(avail, P->avail, (size_t)P->n * sizeof *avail);
            placement_node *x = &more[P->n];
            memset(x, 0, sizeof *x);
            double bw = 0;
            for (int i = 0; i < P->n; i++)
                bw = bw_of(&P->nodes[i]) > bw ? bw_of(&P->nodes[i]) : bw;
            x->bw_gbs = bw;
            snprintf(x->id, sizeof x->id, "~new");
            snprintf(x->name, sizeof x->name, "new");
            Q.nodes = more;
            Q.avail = avail;
            Q.n = P->n + 1;
            Q.link_ms = NULL;  /* its links are unknown: default hops everywhere */
            const uint64_t step = (uint64_t)1 << 20;
            uint64_t lo = 0, hi = p->need_bytes / step + 1;
            avail[P->n] = hi * step;
            if (place(&Q, &scratch)) {
                while (lo < hi) {
                    uint64_t mid = lo + (hi - lo) / 2;
                    avail[P->n] = mid * step;
                    if (place(&Q, &scratch))
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                say(p, " Another node with %s to give (after its reserve) would make it fit.",
                    gib_up(hi * step));
            }
        }
        rc_free(more);
        rc_free(avail);
    }
}

int placement_make(const model_sizes *ms, const placement_node *nodes, int n_nodes,
                   const double *link_ms, const placement_opts *o, placement *out)
{
    memset(out, 0, sizeof *out);
    if (!ms || !o || n_nodes < 0 || (n_nodes > 0 && !nodes))
        return rc_fail(RC_EINVAL, "placement: no model sizes, options or nodes");
    if (ms->n_layer < 1 || !ms->layer_bytes || !ms->layer_decode_bytes)
        return rc_fail(RC_EINVAL, "placement: the model has no layers");
    if (o->n_ctx < 1 || o->n_seq < 1)
        return rc_fail(RC_EINVAL, "placement: context %d and parallel sequences %d must be at least 1",
                       o->n_ctx, o->n_seq);
    const int L = ms->n_layer;
    problem P = { .ms = ms, .nodes = nodes, .n = n_nodes, .link_ms = link_ms,
                  .min_nodes = o->min_nodes, .tensor = o->tensor, .tokens = (uint64_t)o->n_ctx * (uint64_t)o->n_seq,
                  .wscale = 1.0 };
    int k = PLACEMENT_MAX_STAGES;
    P.avail = rc_calloc((size_t)(n_nodes > 0 ? n_nodes : 1), sizeof *P.avail);
    P.order = rc_calloc((size_t)n_nodes + 1, sizeof *P.order);
    P.pre = rc_calloc((size_t)L + 1, sizeof *P.pre);
    P.cost = rc_calloc((size_t)(k + 1) * ((size_t)L + 1), sizeof *P.cost);
    P.from = rc_calloc((size_t)(k + 1) * ((size_t)L + 1), sizeof *P.from);
    int rc = 0;
    if (!P.avail || !P.order || !P.pre || !P.cost || !P.from) {
        rc = rc_fail(RC_ENOMEM, "placement: out of memory for %d layers", L);
        goto out;
    }
    for (int l = 0; l < L; l++)
        P.pre[l + 1] = P.pre[l] + ms->layer_bytes[l];
    for (int i = 0; i < n_nodes; i++) {
        P.avail[i] = placement_node_avail(&nodes[i], o->reserve);
        out->have_bytes += P.avail[i];
    }
    out->need_bytes = total_need(&P);
    const placement before = *out;
    if (o->auto_split)
        P.tensor = false;
    bool placed = place(&P, out);
    if (o->auto_split && (!placed || out->n_stages > 1)) {
        /* tensor parallel where it is expected faster (or alone fits) */
        placement t = before;
        P.tensor = P.cut_known = true;
        if (place(&P, &t) && t.tensor && (!placed || t.tokens_per_s > out->tokens_per_s)) {
            *out = t;
            placed = true;
        } else {
            P.tensor = false;
        }
    }
    if (placed && out->tensor) {   /* every shard also holds the embedding table */
        out->need_bytes = 0;
        for (int s = 0; s < out->n_stages; s++)
            out->need_bytes += out->stage[s].weight_bytes + out->stage[s].kv_bytes;
    }
    if (!placed) {
        out->fits = false;
        out->n_stages = 0;
        out->tokens_per_s = 0;
        advise(&P, o, out);
    }
out:
    rc_free(P.avail);
    rc_free(P.order);
    rc_free(P.pre);
    rc_free(P.cost);
    rc_free(P.from);
    return rc;
}

/* ---- cluster views ---- */

static uint64_t u64_of(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
    if (json_is_real(v))
        return json_real_value(v) > 0 ? (uint64_t)json_real_value(v) : 0;
    return 0;
}

void placement_links_from_view(const json_t *view, const placement_node *nodes, int n, int n_embd,
                               double *link_ms)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            link_ms[(size_t)i * (size_t)n + (size_t)j] = i == j ? 0 : -1;
    double bytes = n_embd > 0 ? (double)n_embd * 2 : PLACEMENT_HOP_BYTES;
    size_t li;
    const json_t *l;
    json_array_foreach(json_object_get(view, "links"), li, l) {
        const char *from = json_string_value(json_object_get(l, "from"));
        const char *to = json_string_value(json_object_get(l, "to"));
        const json_t *rtt = json_object_get(l, "rtt_ms"), *bw = json_object_get(l, "bandwidth_mbps");
        if (!from || !to || !json_is_number(rtt))
            continue;
        int a = -1, b = -1;
        for (int i = 0; i < n; i++) {
            if (!strcmp(nodes[i].id, from))
                a = i;
            if (!strcmp(nodes[i].id, to))
                b = i;
        }
        if (a < 0 || b < 0 || a == b)
            continue;
        double mbps = json_is_number(bw) && json_number_value(bw) > 0 ? json_number_value(bw) : 1000;
        double ms = json_number_value(rtt) / 2 + bytes * 8 / (mbps * 1e6) * 1e3;
        link_ms[(size_t)a * (size_t)n + (size_t)b] = ms;
        /* a link measured one way only stands for both */
        if (link_ms[(size_t)b * (size_t)n + (size_t)a] < 0)
            link_ms[(size_t)b * (size_t)n + (size_t)a] = ms;
    }
}

int placement_nodes_from_view(const json_t *view, placement_node **nodes, int *n, double **link_ms)
{
    *nodes = NULL;
    *n = 0;
    if (link_ms)
        *link_ms = NULL;
    const json_t *arr = json_object_get(view, "nodes");
    if (!json_is_object(view) || !json_is_array(arr))
        return rc_fail(RC_EFORMAT, "cluster view: no \"nodes\" array (is this GET /v1/cluster of a "
                                   "node running with a cluster?)");
    size_t cap = json_array_size(arr);
    placement_node *v = rc_calloc(cap ? cap : 1, sizeof *v);
    if (!v)
        return rc_fail(RC_ENOMEM, "cluster view: out of memory for %zu nodes", cap);
    int m = 0;
    size_t i;
    const json_t *o;
    json_array_foreach(arr, i, o) {
        const char *state = json_string_value(json_object_get(o, "state"));
        if (!state || strcmp(state, "up"))
            continue;
        const char *id = json_string_value(json_object_get(o, "id"));
        const json_t *hw = json_object_get(o, "hardware");
        if (!id || !*id) {
            rc_free(v);
            return rc_fail(RC_EFORMAT, "cluster view: node %zu has no \"id\"", i);
        }
        if (!json_is_object(hw)) {
            rc_free(v);
            return rc_fail(RC_EFORMAT, "cluster view: node %s has no \"hardware\" object", id);
        }
        placement_node *p = &v[m++];
        const char *name = json_string_value(json_object_get(o, "name"));
        snprintf(p->id, sizeof p->id, "%s", id);
        snprintf(p->name, sizeof p->name, "%s", name ? name : id);
        p->mem_total = u64_of(json_object_get(hw, "mem_total"));
        p->mem_free = u64_of(json_object_get(hw, "mem_free"));
        const json_t *offer = json_object_get(hw, "mem_offer");
        p->mem_offer = json_is_number(offer) ? u64_of(offer) : p->mem_free;
        double bw = json_number_value(json_object_get(hw, "mem_bandwidth"));
        p->bw_gbs = bw > 0 ? bw / 1e9 : 0;
        double gf = json_number_value(json_object_get(hw, "matmul_gflops"));
        p->gflops = gf > 0 ? gf : 0;
        p->mem_avail = placement_node_avail(p, 0);
        p->self = json_is_true(json_object_get(o, "self"));
        const char *proto = json_string_value(json_object_get(o, "protocol"));
        int major = 0, minor = 0;
        p->old_cut = proto && sscanf(proto, "%d.%d", &major, &minor) == 2 && major == 1 &&
                     minor < 3;
    }
    if (link_ms && m > 0) {
        *link_ms = rc_calloc((size_t)m * (size_t)m, sizeof **link_ms);
        if (!*link_ms) {
            rc_free(v);
            return rc_fail(RC_ENOMEM, "cluster view: out of memory for links");
        }
        placement_links_from_view(view, v, m, 0, *link_ms);
    }
    *nodes = v;
    *n = m;
    return 0;
}

json_t *placement_to_json(const placement *p, const model_sizes *ms)
{
    json_t *stages = json_array();
    for (int s = 0; stages && s < p->n_stages; s++) {
        const placement_stage *st = &p->stage[s];
        json_array_append_new(stages,
            json_pack("{s:s, s:i, s:s, s:i, s:i, s:I, s:I, s:f}", "node", st->id, "index", st->node,
                      "name", st->name, "first", st->first, "last", st->last, "weight_bytes",
                      (json_int_t)st->weight_bytes, "kv_bytes", (json_int_t)st->kv_bytes,
                      "ms_per_token", st->ms_per_token));
    }
    return json_pack("{s:b, s:s, s:o, s:f, s:I, s:I, s:s, s:i, s:s, s:I}", "fits", p->fits,
                     "split", p->tensor ? "tensor" : "layers", "stages", stages,
                     "tokens_per_s", p->tokens_per_s, "need_bytes", (json_int_t)p->need_bytes,
                     "have_bytes", (json_int_t)p->have_bytes, "advice", p->advice, "n_layer",
                     ms ? ms->n_layer : 0, "kv_cache_type", ms ? kv_type_name(ms->kv_type) : "?",
                     "kv_bytes_per_token",
                     ms ? (json_int_t)(ms->kv_bytes_per_token * (uint64_t)ms->n_layer) : 0);
}
