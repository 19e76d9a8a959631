/* shard.c - cutting every layer of a model into tensor-parallel shards.
 *
 * The cut follows the usual pairing of matrices so that each shard's part
 * of a block needs only the block's input and ends in a partial sum of its
 * output: rows of Wq/Wk/Wv (a shard's heads) then the same heads' columns of
 * Wo; rows of Wgate/Wup (a range of FFN units) then those columns of Wdown.
 * Query heads are dealt by key/value head, so a GQA group never straddles
 * two shards; latent attention (deepseek2) deals heads one by one (rows of
 * Wq_b, slices of Wk_b and Wv_b), and every shard computes the latent all
 * heads share.  When the attention output's blocks do not allow a cut
 * between heads, every shard runs all heads instead and the attention
 * needs no sum.
 *
 * Mixture-of-experts layers are cut by expert (expert parallelism): each
 * shard holds a range of the routed experts whole (views, any weight
 * type), the router is whole on every shard, which all route every row the
 * same way, and each adds the outputs of the chosen experts it holds before
 * the sum over shards.  Shared experts are cut by FFN units like a dense
 * FFN, or run whole on shard 0 when their blocks do not allow the cut.
 *
 * Rows are contiguous in the file and stay views into the mapping; columns
 * are not (every row holds a piece), so a shard copies those once at load
 * and lets the mapped pages go.
 */
#include "shard.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/types.h"

#include <stdio.h>
#include <string.h>

/* A range [k * n / parts, (k + 1) * n / parts) of n units. */
static int part_of(int n, int k, int parts) { return (int)((long)k * n / parts); }

int model_shard_plan(const model_hparams *hp, const model_shard_align *align, int rank,
                     int n_ranks, model_shard *out)
{
    memset(out, 0, sizeof *out);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return rc_fail(RC_EINVAL, "shard %d of %d does not exist", rank, n_ranks);
    const int H = hp->n_head, Hk = hp->n_head_kv, group = Hk > 0 ? H / Hk : 0;
    const int Fs = hp->n_expert_shared * hp->n_ff_exp;
    out->rank = rank;
    out->n_ranks = n_ranks;
    /* Heads: every shard's cut must fall on the attention output's blocks,
     * or none is cut (all shards must agree: they sum together). */
    bool cut = Hk >= n_ranks && align->o > 0;
    for (int q = 0; q < n_ranks && cut; q++) {
        long k0 = part_of(Hk, q, n_ranks), k1 = part_of(Hk, q + 1, n_ranks);
        cut = (k0 * group * hp->head_dim_v) % align->o == 0 &&
              ((k1 - k0) * group * hp->head_dim_v) % align->o == 0;
    }
    if (cut) {
        out->kv0 = part_of(Hk, rank, n_ranks);
        out->n_head_kv = part_of(Hk, rank + 1, n_ranks) - out->kv0;
        out->head0 = out->kv0 * group;
        out->n_head = out->n_head_kv * group;
    } else {
        out->attn_whole = true;
        out->n_head = H;
        out->n_head_kv = Hk;
    }
    if (align->ff > 0 && (hp->n_ff % align->ff || hp->n_ff / align->ff < n_ranks)) {
        if (out->attn_whole && hp->n_expert == 0)
            return rc_fail(RC_EINVAL, "the model cannot be cut in %d: neither its attention "
                           "heads nor its %d FFN units fall on the blocks of its types (%d and "
                           "%d elements)", n_ranks, hp->n_ff, align->o, align->ff);
        out->ffn_whole = true;
        out->n_ff = hp->n_ff;
    } else if (align->ff > 0) {
        int units = hp->n_ff / align->ff;
        out->ff0 = part_of(units, rank, n_ranks) * align->ff;
        out->n_ff = part_of(units, rank + 1, n_ranks) * align->ff - out->ff0;
    }
    if (hp->n_expert > 0) {
        if (hp->n_expert < n_ranks)
            return rc_fail(RC_EINVAL, "the model's %d experts cannot be shared by %d nodes",
                           hp->n_expert, n_ranks);
        out->exp0 = part_of(hp->n_expert, rank, n_ranks);
        out->n_exp = part_of(hp->n_expert, rank + 1, n_ranks) - out->exp0;
    }
    if (align->sh > 0 && Fs > 0) {
        if (Fs % align->sh == 0 && Fs / align->sh >= n_ranks) {
            int units = Fs / align->sh;
            out->sh0 = part_of(units, rank, n_ranks) * align->sh;
            out->n_sh = part_of(units, rank + 1, n_ranks) * align->sh - out->sh0;
        } else {
            out->n_sh = rank == 0 ? Fs : 0;
        }
    }
    out->vocab0 = part_of(hp->n_vocab, rank, n_ranks);
    out->n_vocab = part_of(hp->n_vocab, rank + 1, n_ranks) - out->vocab0;
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

void *model_own(model *m, size_t bytes, const char *what)
{
    void **owned = rc_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *owned);
    uint8_t *p = owned ? rc_malloc_aligned(64, bytes + 1) : NULL;
    if (owned)
        m->owned = owned;
    if (!p) {
        rc_fail(RC_ENOMEM, "out of memory for %zu bytes of %s", bytes, what);
        return NULL;
    }
    m->owned[m->n_owned++] = p;
    /* weights are streamed once per token: huge pages spare a TLB miss
     * every 4 KiB (os.h) */
    os_mem_hugepages(p, bytes);
    return p;
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
    const int64_t n2 = t->ne[2] > 1 ? t->ne[2] : 1;
    size_t off = tensor_row_bytes(t->type, c0), row = tensor_row_bytes(t->type, nc);
    uint8_t *copy = model_own(m, row * (size_t)(nr * n2), t->name);
    if (!copy)
        return RC_ENOMEM;
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

static uint64_t bytes_of(const tensor *t)
{
    return t->data ? (uint64_t)t->row_bytes * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) : 0;
}

/* Slices [i0, i0 + n) of a 3-D tensor (experts, or heads of wk_b/wv_b). */
static void slices(tensor *t, int64_t i0, int64_t n)
{
    if (!t->data)
        return;
    t->data = (const uint8_t *)t->data + (size_t)(i0 * t->ne[1]) * t->row_bytes;
    t->ne[2] = n;
}

static int block_of_type(const tensor *t)
{
    return t->data ? (int)tensor_type_traits(t->type)->block_size : 0;
}

static int max_int(int a, int b) { return a > b ? a : b; }

int model_shard_apply(model *m, int rank, int n_ranks)
{
    const model_hparams *hp = &m->hp;
    const int Fs = hp->n_expert_shared * hp->n_ff_exp;
    if (n_ranks == 1) {
        m->shard = (model_shard){ .n_ranks = 1, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                                  .n_ff = hp->n_ff, .n_exp = hp->n_expert, .n_sh = Fs,
                                  .n_vocab = hp->n_vocab };
        return 0;
    }
    const int n_local = m->last - m->first;
    /* Every layer must cut the same way: the coarsest blocks decide. */
    model_shard_align al = { 0, 0, 0 };
    for (int l = 0; l < n_local; l++) {
        const layer_weights *L = &m->layers[l];
        al.o = max_int(al.o, block_of_type(&L->wo));
        al.ff = max_int(al.ff, block_of_type(&L->w_down));
        al.sh = max_int(al.sh, block_of_type(&L->down_shexp));
    }
    int rc = model_shard_plan(hp, &al, rank, n_ranks, &m->shard);
    if (rc)
        return rc;
    const model_shard *s = &m->shard;
    const int64_t D = hp->head_dim, Dv = hp->head_dim_v;
    uint64_t bytes = bytes_of(&m->output_norm) + bytes_of(&m->rope_freqs);
    for (int l = 0; l < n_local; l++) {
        layer_weights *L = &m->layers[l];
        if (!s->attn_whole) {
            rows(&L->wq, s->head0 * D, s->n_head * D);
            rows(&L->wq_b, s->head0 * D, s->n_head * D);
            rows(&L->wk, s->kv0 * D, s->n_head_kv * D);
            rows(&L->wv, s->kv0 * Dv, s->n_head_kv * Dv);
            elems(&L->bq, s->head0 * D, s->n_head * D);
            elems(&L->bk, s->kv0 * D, s->n_head_kv * D);
            elems(&L->bv, s->kv0 * Dv, s->n_head_kv * Dv);
            slices(&L->wk_b, s->head0, s->n_head);
            slices(&L->wv_b, s->head0, s->n_head);
            if ((rc = cut(m, &L->wo, 0, L->wo.ne[1], s->head0 * Dv, s->n_head * Dv)))
                return rc;
        }
        if (!s->ffn_whole) {
            rows(&L->w_gate, s->ff0, s->n_ff);
            rows(&L->w_up, s->ff0, s->n_ff);
            if ((rc = cut(m, &L->w_down, 0, L->w_down.ne[1], s->ff0, s->n_ff)))
                return rc;
        }
        slices(&L->gate_exps, s->exp0, s->n_exp);
        slices(&L->up_exps, s->exp0, s->n_exp);
        slices(&L->down_exps, s->exp0, s->n_exp);
        if (s->n_sh == 0) {
            memset(&L->gate_shexp, 0, sizeof L->gate_shexp);
            memset(&L->up_shexp, 0, sizeof L->up_shexp);
            memset(&L->down_shexp, 0, sizeof L->down_shexp);
        } else if (s->n_sh < Fs) {
            rows(&L->gate_shexp, s->sh0, s->n_sh);
            rows(&L->up_shexp, s->sh0, s->n_sh);
            if ((rc = cut(m, &L->down_shexp, 0, L->down_shexp.ne[1], s->sh0, s->n_sh)))
                return rc;
        }
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

/* The larger block size of a per-layer tensor over layers [first, last),
 * 0 when no layer has it. */
static int layer_align(const gguf_file *f, int first, int last, const char *suffix)
{
    int align = 0;
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

static model_shard_align file_align(const gguf_file *f, int first, int last)
{
    return (model_shard_align){ .o = layer_align(f, first, last, "attn_output.weight"),
                                .ff = layer_align(f, first, last, "ffn_down.weight"),
                                .sh = layer_align(f, first, last, "ffn_down_shexp.weight") };
}

/* Bits k (2..31) for which every rank of k can be planned, and (whole,
 * ffn) those whose shards run every head, the whole dense FFN. */
static uint32_t shard_ways(const gguf_file *f, uint32_t *whole, uint32_t *ffn)
{
    model_hparams hp;
    *whole = *ffn = 0;
    if (model_read_hparams(f, &hp))
        return 0;
    const model_shard_align al = file_align(f, 0, hp.n_layer);
    uint32_t ways = 0;
    for (int k = 2; k < 32; k++) {
        model_shard s;
        bool ok = true;
        for (int r = 0; r < k && ok; r++)
            ok = model_shard_plan(&hp, &al, r, k, &s) == 0;
        if (ok)
            ways |= 1u << k;
        if (ok && s.attn_whole)
            *whole |= 1u << k;
        if (ok && s.ffn_whole)
            *ffn |= 1u << k;
    }
    return ways;
}

uint32_t model_shard_ways(const gguf_file *f)
{
    uint32_t whole, ffn;
    return shard_ways(f, &whole, &ffn);
}

uint32_t model_shard_attn_whole(const gguf_file *f, uint32_t *ffn)
{
    uint32_t whole;
    shard_ways(f, &whole, ffn);
    return whole;
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
    const model_shard_align al = file_align(f, first, last < 0 ? hp.n_layer : last);
    if ((rc = model_tensor_needs(f, first, last, need)) ||
        (rc = model_shard_plan(&hp, &al, rank, n_ranks, &s))) {
        rc_free(need);
        return rc;
    }
    const int64_t D = hp.head_dim, Dv = hp.head_dim_v, Dn = hp.head_dim - hp.rope_dim;
    const int Fs = hp.n_expert_shared * hp.n_ff_exp;
    const bool heads = !s.attn_whole;
    /* rows [r0, r1) of each cut tensor, in rows of ne[0] (a vector's
     * elements, a 3-D tensor's rows across its slices) */
    const struct { const char *suffix; bool on; int64_t r0, r1; } cuts[] = {
        { "attn_q.weight", heads, s.head0 * D, (s.head0 + s.n_head) * D },
        { "attn_q_b.weight", heads, s.head0 * D, (s.head0 + s.n_head) * D },
        { "attn_k.weight", heads, s.kv0 * D, (s.kv0 + s.n_head_kv) * D },
        { "attn_v.weight", heads, s.kv0 * Dv, (s.kv0 + s.n_head_kv) * Dv },
        { "attn_q.bias", heads, s.head0 * D, (s.head0 + s.n_head) * D },
        { "attn_k.bias", heads, s.kv0 * D, (s.kv0 + s.n_head_kv) * D },
        { "attn_v.bias", heads, s.kv0 * Dv, (s.kv0 + s.n_head_kv) * Dv },
        { "attn_k_b.weight", heads, s.head0 * (int64_t)hp.kv_lora_rank,
          (s.head0 + s.n_head) * (int64_t)hp.kv_lora_rank },
        { "attn_v_b.weight", heads, s.head0 * Dv, (s.head0 + s.n_head) * Dv },
        { "attn_kv_b.weight", heads, s.head0 * (Dn + Dv), (s.head0 + s.n_head) * (Dn + Dv) },
        { "ffn_gate.weight", !s.ffn_whole, s.ff0, s.ff0 + s.n_ff },
        { "ffn_up.weight", !s.ffn_whole, s.ff0, s.ff0 + s.n_ff },
        { "ffn_gate_exps.weight", true, s.exp0 * (int64_t)hp.n_ff_exp, (s.exp0 + s.n_exp) * (int64_t)hp.n_ff_exp },
        { "ffn_up_exps.weight", true, s.exp0 * (int64_t)hp.n_ff_exp, (s.exp0 + s.n_exp) * (int64_t)hp.n_ff_exp },
        { "ffn_down_exps.weight", true, s.exp0 * (int64_t)hp.n_embd, (s.exp0 + s.n_exp) * (int64_t)hp.n_embd },
        { "ffn_gate_shexp.weight", s.n_sh > 0, s.sh0, s.sh0 + s.n_sh },
        { "ffn_up_shexp.weight", s.n_sh > 0, s.sh0, s.sh0 + s.n_sh },
    };
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        if (!need[i])
            continue;
        const gguf_tensor *t = &f->tensors[i];
        uint64_t off = t->file_offset, end = off + t->size_bytes;
        int64_t r0 = -1, r1 = -1;
        if (n_ranks > 1 && !strncmp(t->name, "blk.", 4)) {
            if (s.n_sh == 0 && Fs > 0 && strstr(t->name, "_shexp.weight"))
                continue;       /* shard 0 runs the shared experts */
            for (size_t c = 0; c < sizeof cuts / sizeof cuts[0] && r0 < 0; c++)
                if (cuts[c].on && ends_with(t->name, cuts[c].suffix)) {
                    r0 = cuts[c].r0;
                    r1 = cuts[c].r1;
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
