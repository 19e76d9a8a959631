/* model_size.c - per-part byte counts of a GGUF model from its tensor
 * infos (see model_size.h).  Every tensor lands in exactly one part, so the
 * parts add up to the file's tensor bytes. */
#include "model/model_size.h"

#include "base/err.h"
#include "base/mem.h"
#include "model/model.h"
#include "tensor/kv_types.h"
#include "tensor/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The block index of "blk.N.<rest>", or -1 when the name has another form. */
static long block_of(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    char *end;
    const char *p = name + 4;
    if (*p < '0' || *p > '9')
        return -1;
    long n = strtol(p, &end, 10);
    return *end == '.' ? n : -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The per-head tensors a tensor-parallel cut divides by heads. */
static bool is_head_cut(const char *name)
{
    static const char *const suffix[] = { ".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                                          ".attn_output.weight", ".attn_q_b.weight",
                                          ".attn_k_b.weight", ".attn_v_b.weight",
                                          ".attn_kv_b.weight", ".attn_q.bias", ".attn_k.bias",
                                          ".attn_v.bias" };
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++)
        if (ends_with(name, suffix[i]))
            return true;
    return false;
}

/* The per-layer tensors every shard holds whole. */
static bool is_replicated(const char *name)
{
    static const char *const suffix[] = { "norm.weight", ".attn_q_a.weight",
                                          ".attn_kv_a_mqa.weight", ".ffn_gate_inp.weight",
                                          ".exp_probs_b.bias" };
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++)
        if (ends_with(name, suffix[i]))
            return true;
    return false;
}

/* An older deepseek2 file's attn_kv_b is held as the split pair made at
 * load (model/mla_split.c): the value rows as they are, the key rows
 * transposed, F16 unless they are F32/F16/BF16. */
static uint64_t kv_b_held_bytes(const model_hparams *hp, const gguf_tensor *t)
{
    const int64_t H = hp->n_head, Dn = hp->head_dim - hp->rope_dim;
    const uint64_t row = t->ne[1] ? t->size_bytes / (uint64_t)t->ne[1] : 0;
    const int kt = t->type == TT_F32 || t->type == TT_F16 || t->type == TT_BF16 ? (int)t->type
                                                                               : TT_F16;
    return (uint64_t)(H * hp->head_dim_v) * row +
           (uint64_t)(H * hp->kv_lora_rank) * tensor_row_bytes(kt, Dn);
}

int model_sizes_read(const gguf_file *f, model_sizes *out)
{
    memset(out, 0, sizeof *out);
    model_hparams hp;
    int rc = model_read_hparams(f, &hp);
    if (rc)
        return rc;
    out->n_layer = hp.n_layer;
    out->n_embd = hp.n_embd;
    /* Per position, n_head_kv K rows of head_dim and V rows of head_dim_v
     * (infer/kv_cache.h); model/ cannot call up into infer/ to ask.  Latent
     * attention keeps one row of latent + rope key for all heads. */
    out->kv_heads = hp.kv_lora_rank > 0 ? 1 : hp.n_head_kv;
    out->kv_k_dim = hp.kv_lora_rank > 0 ? hp.kv_lora_rank + hp.rope_dim : hp.head_dim;
    out->kv_v_dim = hp.kv_lora_rank > 0 ? 0 : hp.head_dim_v;
    model_sizes_set_kv_type(out, KV_TYPE_DEFAULT);
    out->layer_bytes = rc_calloc((size_t)hp.n_layer, sizeof *out->layer_bytes);
    out->layer_decode_bytes = rc_calloc((size_t)hp.n_layer, sizeof *out->layer_decode_bytes);
    if (!out->layer_bytes || !out->layer_decode_bytes) {
        model_sizes_free(out);
        return rc_fail(RC_ENOMEM, "%s: out of memory sizing %d layers", f->path, hp.n_layer);
    }
    bool have_embd = false, have_output = false;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->ne[d];
        out->n_params += n;
        out->total_bytes += t->size_bytes;
        long b = block_of(t->name);
        if (b >= 0) {
            if (b >= hp.n_layer) {
                model_sizes_free(out);
                return rc_fail(RC_EFORMAT, "%s: tensor '%s' names block %ld but the model has %d blocks",
                               f->path, t->name, b, hp.n_layer);
            }
            uint64_t held = t->size_bytes;
            if (hp.kv_lora_rank > 0 && strstr(t->name, ".attn_kv_b."))
                held = kv_b_held_bytes(&hp, t);
            out->layer_bytes[b] += held;
            /* a token runs n_expert_used of the n_expert experts */
            uint64_t dec = held;
            if (hp.n_expert > 0 && strstr(t->name, "_exps."))
                dec = dec / (uint64_t)hp.n_expert * (uint64_t)hp.n_expert_used;
            out->layer_decode_bytes[b] += dec;
            if (is_head_cut(t->name))
                out->attn_bytes += held;
            else if (ends_with(t->name, ".ffn_gate.weight") || ends_with(t->name, ".ffn_up.weight") ||
                     ends_with(t->name, ".ffn_down.weight"))
                out->ffn_bytes += held;
            else if (is_replicated(t->name))
                out->replicated_bytes += held;
        } else if (!strcmp(t->name, "token_embd.weight")) {
            out->embd_bytes = t->size_bytes;
            have_embd = true;
        } else if (!strcmp(t->name, "output.weight")) {
            out->output_bytes += t->size_bytes;
            have_output = true;
        } else if (!strcmp(t->name, "output_norm.weight")) {
            out->output_bytes += t->size_bytes;
        } else {
            out->shared_bytes += t->size_bytes;
        }
    }
    if (!have_embd) {
        model_sizes_free(out);
        return rc_fail(RC_EFORMAT, "%s: tensor 'token_embd.weight' is missing", f->path);
    }
    out->tied = !have_output;
    out->tp_ways = model_shard_ways(f);
    out->tp_attn_whole = model_shard_attn_whole(f, &out->tp_ffn_whole);
    out->kv_whole = hp.kv_lora_rank > 0;
    return 0;
}

void model_sizes_free(model_sizes *ms)
{
    if (!ms)
        return;
    rc_free(ms->layer_bytes);
    rc_free(ms->layer_decode_bytes);
    ms->layer_bytes = ms->layer_decode_bytes = NULL;
}

uint64_t model_sizes_stage_bytes(const model_sizes *ms, int first, int last)
{
    uint64_t b = ms->shared_bytes;
    for (int l = first; l < last; l++)
        b += ms->layer_bytes[l];
    if (first == 0)
        b += ms->embd_bytes;
    if (last == ms->n_layer) {
        b += ms->output_bytes;
        if (ms->tied && first != 0)
            b += ms->embd_bytes;
    }
    return b;
}

uint64_t model_sizes_stage_decode_bytes(const model_sizes *ms, int first, int last)
{
    uint64_t b = 0;
    for (int l = first; l < last; l++)
        b += ms->layer_decode_bytes[l];
    if (last == ms->n_layer)
        b += ms->output_bytes + (ms->tied ? ms->embd_bytes : 0);
    return b;
}

int model_sizes_set_kv_type(model_sizes *ms, int type)
{
    if (!kv_type_ok(type))
        return rc_fail(RC_EINVAL, "KV cache type %d is not " KV_TYPE_NAMES, type);
    ms->kv_type = type;
    ms->kv_bytes_per_token = (uint64_t)ms->kv_heads * (kv_row_bytes(type, (size_t)ms->kv_k_dim) +
                                                       kv_row_bytes(type, (size_t)ms->kv_v_dim));
    return 0;
}

uint64_t model_sizes_kv_bytes(const model_sizes *ms, int first, int last, uint64_t tokens)
{
    return (uint64_t)(last - first) * ms->kv_bytes_per_token * tokens;
}

int model_main_type(const gguf_file *f)
{
    uint64_t bytes_by_type[TT_COUNT] = { 0 };
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->type < TT_COUNT && t->n_dims >= 2)
            bytes_by_type[t->type] += t->size_bytes;
    }
    int best = 0;
    for (int t = 1; t < TT_COUNT; t++)
        if (bytes_by_type[t] > bytes_by_type[best])
            best = t;
    return best;
}
