/* shard.c - cutting every layer of a model into tensor-parallel shards.
 *
 * The cut follows the usual pairing of matrices so that each shard's part
 * of a block needs only the block's input and ends in a partial sum of its
 * output: rows of Wq/Wk/Wv (a shard's heads) then the same heads' columns of
 * Wo; rows of Wgate/Wup (a range of FFN units) then those columns of Wdown.
 * Query heads are dealt by key/value head, so a GQA group never straddles
 * two shards.  A mixture-of-experts layer is cut the same way inside every
 * expert (the same range of each expert's FFN units: rows of its gate and
 * up, columns of its down); the router is whole on every shard, which all
 * route the same rows the same way, and each adds its part of every chosen
 * expert's output before the sum over shards.  Rows are contiguous in the
 * file and stay views into the mapping; columns are not (every row holds a
 * piece), nor are the experts' rows, so a shard copies those once at load
 * and lets the mapped pages go.
 */
#include "shard.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/types.h"

#include <stdio.h>
#include <string.h>

int model_shard_plan(const model_hparams *hp, int ff_align, int o_align, int rank,
                     int n_ranks, model_shard *out)
{
    memset(out, 0, sizeof *out);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return rc_fail(RC_EINVAL, "shard %d of %d does not exist", rank, n_ranks);
    const int H = hp->n_head, Hk = hp->n_head_kv, group = Hk > 0 ? H / Hk : 0;
    const int n_ff = hp->n_expert > 0 ? hp->n_ff_exp : hp->n_ff;   /* per expert for MoE */
    if (Hk < n_ranks)
        return rc_fail(RC_EINVAL, "the model's %d key/value heads cannot be shared by %d nodes",
                       Hk, n_ranks);
    if (ff_align <= 0 || o_align <= 0 || n_ff % ff_align || n_ff / ff_align < n_ranks)
        return rc_fail(RC_EINVAL, "the model's %d FFN units%s cannot be cut in %d on %d-unit "
                       "blocks", n_ff, hp->n_expert > 0 ? " per expert" : "", n_ranks, ff_align);
    int kv0 = (int)((long)rank * Hk / n_ranks), kv1 = (int)((long)(rank + 1) * Hk / n_ranks);
    int units = n_ff / ff_align;
    int u0 = (int)((long)rank * units / n_ranks), u1 = (int)((long)(rank + 1) * units / n_ranks);
    *out = (model_shard){
        .rank = rank, .n_ranks = n_ranks,
        .head0 = kv0 * group, .n_head = (kv1 - kv0) * group,
        .kv0 = kv0, .n_head_kv = kv1 - kv0,
        .ff0 = u0 * ff_align, .n_ff = (u1 - u0) * ff_align,
        .vocab0 = (int)((long)rank * hp->n_vocab / n_ranks),
    };
    out->n_vocab = (int)((long)(rank + 1) * hp->n_vocab / n_ranks) - out->vocab0;
    if (((long)out->head0 * hp->head_dim_v) % o_align || ((long)out->n_head * hp->head_dim_v) % o_align)
        return rc_fail(RC_EINVAL, "the attention output cannot be cut between heads %d and %d: "
                       "%d-wide heads do not end on its %d-element blocks", out->head0,
                       out->head0 + out->n_head, hp->head_dim_v, o_align);
    return 0;
}

static void rows(tensor *t, int64_t r0, int64_t n)
{
    if (!t->data)
        return;
    t->data = (const uint8_t *)t->data + (size_t)r0 * t->row_bytes;
    t->ne[1] = n;
}

static void elems(tensor *t, int64_t i0, int64_t n)
{
    if (!t->data)
        return;
    t->data = (const float *)t->data + i0;
    t->ne[0] = n;
    t->row_bytes = (size_t)n * sizeof(float);
}

/* Copies rows [r0, r0 + nr) x columns [c0, c0 + nc) of every 2-D slice
 * (expert) of t into memory the model owns, and lets the mapped pages go. */
static int cut(model *m, tensor *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc)
{
    if (!t->data)
        return 0;
    const tensor_traits *tt = tensor_type_traits(t->type);
    if (c0 % tt->block_size || nc % tt->block_size)
        return rc_fail(RC_EINVAL, "%s: columns %lld-%lld do not fall on its %lld-element blocks",
                       t->name, (long long)c0, (long long)(c0 + nc - 1), (long long)tt->block_size);
    void **owned = rc_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *owned);
    if (!owned)
        return rc_fail(RC_ENOMEM, "out of memory cutting %s", t->name);
    m->owned = owned;
    const int64_t n2 = t->ne[2] > 1 ? t->ne[2] : 1;
    size_t off = tensor_row_bytes(t->type, c0), row = tensor_row_bytes(t->type, nc);
    uint8_t *copy = rc_malloc_aligned(64, row * (size_t)(nr * n2) + 1);
    if (!copy)
        return rc_fail(RC_ENOMEM, "out of memory for %zu bytes of %s", row * (size_t)(nr * n2),
                       t->name);
    m->owned[m->n_owned++] = copy;
    const uint8_t *src = t->data;
    for (int64_t e = 0; e < n2; e++)
        for (int64_t r = 0; r < nr; r++)
            memcpy(copy + (size_t)(e * nr + r) * row,
                   src + ((size_t)(e * t->ne[1] + r0 + r)) * t->row_bytes + off, row);
    os_mem_drop(src, t->row_bytes * (size_t)(t->ne[1] * n2));
    t->data = copy;
    t->ne[0] = nc;
    t->ne[1] = nr;
    t->row_bytes = row;
    return 0;
}

/* The block size of a layer's FFN down matrix (dense or the experts'). */
static int ff_block(const layer_weights *L)
{
    const tensor *d = L->w_down.data ? &L->w_down : &L->down_exps;
    return d->data ? (int)tensor_type_traits(d->type)->block_size : 1;
}

static uint64_t bytes_of(const tensor *t)
{
    return t->data ? (uint64_t)t->row_bytes * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) : 0;
}

int model_shard_apply(model *m, int rank, int n_ranks)
{
    const model_hparams *hp = &m->hp;
    if (n_ranks == 1) {
        m->shard = (model_shard){ .n_ranks = 1, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                                  .n_ff = hp->n_expert > 0 ? hp->n_ff_exp : hp->n_ff,
                                  .n_vocab = hp->n_vocab };
        return 0;
    }
    const int n_local = m->last - m->first;
    /* Every layer must cut the same way; the first layer's types decide. */
    const layer_weights *L0 = &m->layers[0];
    int ff_align = ff_block(L0);
    int o_align = (int)tensor_type_traits(L0->wo.type)->block_size;
    for (int l = 1; l < n_local; l++) {
        const layer_weights *L = &m->layers[l];
        int fa = ff_block(L);
        int oa = (int)tensor_type_traits(L->wo.type)->block_size;
        ff_align = fa > ff_align ? fa : ff_align;
        o_align = oa > o_align ? oa : o_align;
    }
    int rc = model_shard_plan(hp, ff_align, o_align, rank, n_ranks, &m->shard);
    if (rc)
        return rc;
    const model_shard *s = &m->shard;
    const int64_t D = hp->head_dim, Dv = hp->head_dim_v;
    uint64_t bytes = bytes_of(&m->output_norm) + bytes_of(&m->rope_freqs);
    for (int l = 0; l < n_local; l++) {
        layer_weights *L = &m->layers[l];
        rows(&L->wq, s->head0 * D, s->n_head * D);
        rows(&L->wk, s->kv0 * D, s->n_head_kv * D);
        rows(&L->wv, s->kv0 * Dv, s->n_head_kv * Dv);
        elems(&L->bq, s->head0 * D, s->n_head * D);
        elems(&L->bk, s->kv0 * D, s->n_head_kv * D);
        elems(&L->bv, s->kv0 * Dv, s->n_head_kv * Dv);
        rows(&L->w_gate, s->ff0, s->n_ff);
        rows(&L->w_up, s->ff0, s->n_ff);
        if ((rc = cut(m, &L->wo, 0, L->wo.ne[1], s->head0 * Dv, s->n_head * Dv)) ||
            (rc = cut(m, &L->w_down, 0, L->w_down.ne[1], s->ff0, s->n_ff)) ||
            (rc = cut(m, &L->gate_exps, s->ff0, s->n_ff, 0, L->gate_exps.ne[0])) ||
            (rc = cut(m, &L->up_exps, s->ff0, s->n_ff, 0, L->up_exps.ne[0])) ||
            (rc = cut(m, &L->down_exps, 0, L->down_exps.ne[1], s->ff0, s->n_ff)))
            return rc;
        const tensor *all = (const tensor *)L;
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor); i++)
            bytes += bytes_of(&all[i]);
    }
    if (m->output.data) {
        rows(&m->output, s->vocab0, s->n_vocab);
        if (!(hp->tied_output && m->first == 0))
            bytes += bytes_of(&m->output);
    }
    if (m->first == 0)
        bytes += bytes_of(&m->tok_embd);
    m->weight_bytes = bytes;
    return 0;
}

/* The larger block size of a per-layer tensor over layers [first, last). */
static int layer_align(const gguf_file *f, int first, int last, const char *suffix)
{
    int align = 1;
    char name[96];
    for (int l = first; l < last; l++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
        const gguf_tensor *t = gguf_find_tensor(f, name);
        const tensor_traits *tt = t ? tensor_type_traits((int)t->type) : NULL;
        if (tt && tt->block_size > align)
            align = (int)tt->block_size;
    }
    return align;
}

static int ff_layer_align(const gguf_file *f, const model_hparams *hp, int first, int last)
{
    return layer_align(f, first, last, hp->n_expert > 0 ? "ffn_down_exps.weight"
                                                        : "ffn_down.weight");
}

uint32_t model_shard_ways(const gguf_file *f)
{
    model_hparams hp;
    if (model_read_hparams(f, &hp))
        return 0;
    const int ff = ff_layer_align(f, &hp, 0, hp.n_layer);
    const int o = layer_align(f, 0, hp.n_layer, "attn_output.weight");
    uint32_t ways = 0;
    for (int k = 2; k < 32; k++) {
        model_shard s;
        bool ok = true;
        for (int r = 0; r < k && ok; r++)
            ok = model_shard_plan(&hp, ff, o, r, k, &s) == 0;
        if (ok)
            ways |= 1u << k;
    }
    return ways;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int model_shard_ranges(const gguf_file *f, int first, int last, int rank, int n_ranks,
                       int (*range)(void *ud, uint64_t start, uint64_t end, const char *name),
                       void *ud)
{
    model_hparams hp;
    int rc = model_read_hparams(f, &hp);
    if (rc)
        return rc;
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!hp.n_vocab && emb)
        hp.n_vocab = (int)emb->ne[1];
    if (last < 0)
        last = hp.n_layer;
    bool *need = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *need);
    if (!need)
        return rc_fail(RC_ENOMEM, "out of memory planning a shard");
    model_shard s;
    if ((rc = model_tensor_needs(f, first, last, need)) ||
        (rc = model_shard_plan(&hp, ff_layer_align(f, &hp, first, last),
                               layer_align(f, first, last, "attn_output.weight"), rank, n_ranks,
                               &s))) {
        rc_free(need);
        return rc;
    }
    const int64_t D = hp.head_dim, Dv = hp.head_dim_v;
    static const struct { const char *suffix; int what; } cuts[] = {
        { "attn_q.weight", 0 }, { "attn_k.weight", 1 }, { "attn_v.weight", 2 },
        { "attn_q.bias", 0 }, { "attn_k.bias", 1 }, { "attn_v.bias", 2 },
        { "ffn_gate.weight", 3 }, { "ffn_up.weight", 3 },
    };
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        if (!need[i])
            continue;
        const gguf_tensor *t = &f->tensors[i];
        uint64_t off = t->file_offset, end = off + t->size_bytes;
        /* rows [r0, r1) of a matrix, or elements of a vector */
        int64_t r0 = -1, r1 = -1;
        if (n_ranks > 1 && (ends_with(t->name, "ffn_gate_exps.weight") ||
                            ends_with(t->name, "ffn_up_exps.weight"))) {
            /* the same rows of every expert's matrix */
            uint64_t row = tensor_row_bytes((int)t->type, t->ne[0]);
            for (int64_t e = 0; e < t->ne[2] && !rc; e++) {
                uint64_t at = off + (uint64_t)(e * t->ne[1]) * row;
                rc = range(ud, at + (uint64_t)s.ff0 * row, at + (uint64_t)(s.ff0 + s.n_ff) * row,
                           t->name);
            }
            continue;
        }
        if (n_ranks > 1 && !strncmp(t->name, "blk.", 4)) {
            for (size_t c = 0; c < sizeof cuts / sizeof cuts[0] && r0 < 0; c++) {
                if (!ends_with(t->name, cuts[c].suffix))
                    continue;
                switch (cuts[c].what) {
                case 0: r0 = s.head0 * D; r1 = r0 + s.n_head * D; break;
                case 1: r0 = s.kv0 * D; r1 = r0 + s.n_head_kv * D; break;
                case 2: r0 = s.kv0 * Dv; r1 = r0 + s.n_head_kv * Dv; break;
                default: r0 = s.ff0; r1 = r0 + s.n_ff; break;
                }
            }
        } else if (n_ranks > 1 && (!strcmp(t->name, "output.weight") ||
                                   (!strcmp(t->name, "token_embd.weight") && first > 0))) {
            r0 = s.vocab0;
            r1 = r0 + s.n_vocab;
        }
        if (r0 >= 0) {
            /* a vector's "rows" are its elements; a matrix's are ne[0] wide */
            uint64_t row = t->n_dims == 1 ? sizeof(float)
                                          : tensor_row_bytes((int)t->type, t->ne[0]);
            end = off + (uint64_t)r1 * row;
            off += (uint64_t)r0 * row;
        }
        rc = range(ud, off, end, t->name);
    }
    rc_free(need);
    return rc;
}
