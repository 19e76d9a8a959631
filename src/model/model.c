/* model.c - hyperparameters from GGUF metadata and the binding of weight
 * views for a layer range.
 *
 * Metadata keys are "<arch>.<name>" (e.g. "qwen2.embedding_length"); the
 * architecture table below says which features each architecture has, so
 * the forward pass branches on features (biases, q/k norm, MoE, rope
 * layout), never on architecture names.
 */
#include "model.h"
#include "ranges.h"
#include "repack.h"
#include "shard.h"
#include "base/err.h"
#include "base/mem.h"
#include "tensor/types.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    bool qkv_bias, qk_norm, moe, neox;
} arch_table[ARCH_COUNT] = {
    [ARCH_LLAMA]     = { "llama",     false, false, false, false },
    [ARCH_QWEN2]     = { "qwen2",     true,  false, false, true  },
    [ARCH_QWEN3]     = { "qwen3",     false, true,  false, true  },
    [ARCH_QWEN3MOE]  = { "qwen3moe",  false, true,  true,  true  },
    [ARCH_DEEPSEEK2] = { "deepseek2", false, false, true,  false },
};

const char *model_pooling_name(int pooling)
{
    static const char *names[] = { "none", "mean", "cls", "last" };
    return pooling >= 0 && pooling <= POOL_LAST ? names[pooling] : "unknown";
}

const char *model_arch_name(int arch)
{
    return arch >= 0 && arch < ARCH_COUNT ? arch_table[arch].name : "unknown";
}

/* Reads "<arch>.<suffix>" as u32 into *out; `required` decides whether a
 * missing key is an error or leaves *out unchanged. */
static int arch_u32(const gguf_file *f, const char *arch, const char *suffix,
                    int *out, bool required)
{
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(f, key, &v);
    if (rc == RC_ENOTFOUND && !required)
        return 0;
    if (rc == RC_ENOTFOUND)
        return rc_fail(RC_EFORMAT, "%s: metadata key '%s' is missing", f->path, key);
    if (rc)
        return rc;
    if (v > (1u << 30))
        return rc_fail(RC_EFORMAT, "%s: metadata key '%s' = %u is out of range",
                       f->path, key, v);
    *out = (int)v;
    return 0;
}

static int arch_f32(const gguf_file *f, const char *arch, const char *suffix,
                    float *out, bool required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, out);
    if (rc == RC_ENOTFOUND && !required)
        return 0;
    if (rc == RC_ENOTFOUND)
        return rc_fail(RC_EFORMAT, "%s: metadata key '%s' is missing", f->path, key);
    return rc;
}

static int arch_bool(const gguf_file *f, const char *arch, const char *suffix, bool *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_bool(f, key, out);
    return rc == RC_ENOTFOUND ? 0 : rc;
}

/* The deepseek2 keys: latent attention, its MoE, and rope scaling (llama.cpp's
 * rules for this architecture; ../shared/golden/README.md spells them out).
 * The file's head_count_kv and key/value lengths describe llama.cpp's
 * compressed cache; the *_mla keys (absent in older files, whose plain keys
 * are the head sizes then) give the heads' real widths. */
static int read_deepseek2(const gguf_file *f, model_hparams *hp)
{
    const char *a = hp->arch_name;
    int rc, gating = 0;
    float scale = 0.0f;
    if ((rc = arch_u32(f, a, "attention.kv_lora_rank", &hp->kv_lora_rank, true)) ||
        (rc = arch_u32(f, a, "attention.q_lora_rank", &hp->q_lora_rank, false)) ||
        (rc = arch_u32(f, a, "attention.key_length_mla", &hp->head_dim, false)) ||
        (rc = arch_u32(f, a, "attention.value_length_mla", &hp->head_dim_v, false)) ||
        (rc = arch_u32(f, a, "leading_dense_block_count", &hp->n_layer_dense_lead, false)) ||
        (rc = arch_u32(f, a, "expert_shared_count", &hp->n_expert_shared, false)) ||
        (rc = arch_u32(f, a, "expert_gating_func", &gating, false)) ||
        (rc = arch_u32(f, a, "expert_group_count", &hp->n_expert_group, false)) ||
        (rc = arch_u32(f, a, "expert_group_used_count", &hp->n_expert_group_used, false)) ||
        (rc = arch_bool(f, a, "expert_weights_norm", &hp->expert_weights_norm)) ||
        (rc = arch_f32(f, a, "expert_weights_scale", &scale, false)))
        return rc;
    hp->n_head_kv = hp->n_head;
    hp->expert_gating = gating == GATING_SIGMOID ? GATING_SIGMOID : GATING_SOFTMAX;
    if (gating != 0 && gating != GATING_SOFTMAX && gating != GATING_SIGMOID)
        return rc_fail(RC_EUNSUPPORTED, "%s: expert_gating_func %d is not supported (1 softmax, 2 sigmoid)",
                       f->path, gating);
    hp->expert_weights_scale = scale != 0.0f ? scale : 1.0f;
    if (hp->n_expert_group <= 1)
        hp->n_expert_group = hp->n_expert_group_used = 0;
    if (hp->kv_lora_rank <= 0 || hp->rope_dim >= hp->head_dim || hp->q_lora_rank < 0)
        return rc_fail(RC_EFORMAT, "%s: latent attention widths are inconsistent (kv_lora_rank %d, "
                       "head %d of which rope %d)", f->path, hp->kv_lora_rank, hp->head_dim,
                       hp->rope_dim);
    if (hp->n_expert_group > 64)
        return rc_fail(RC_EUNSUPPORTED, "%s: %d expert groups (at most 64 are supported)", f->path,
                       hp->n_expert_group);
    if (hp->n_expert_group && (hp->n_expert % hp->n_expert_group ||
                               hp->n_expert_group_used < 1 ||
                               hp->n_expert_group_used > hp->n_expert_group ||
                               hp->n_expert / hp->n_expert_group < 2 ||
                               hp->n_expert_used > hp->n_expert_group_used * (hp->n_expert / hp->n_expert_group)))
        return rc_fail(RC_EFORMAT, "%s: %d expert groups (%d used) do not fit %d experts with %d used",
                       f->path, hp->n_expert_group, hp->n_expert_group_used, hp->n_expert,
                       hp->n_expert_used);
    if (hp->n_layer_dense_lead > hp->n_layer || (hp->n_layer_dense_lead > 0 && hp->n_ff <= 0))
        return rc_fail(RC_EFORMAT, "%s: %d leading dense layers need a positive feed_forward_length",
                       f->path, hp->n_layer_dense_lead);

    /* Rope scaling: YaRN (V3, R1, Kimi K2) or linear.  llama.cpp always
     * takes beta_fast 32 and beta_slow 1 here, whatever the file says. */
    char key[128];
    gguf_str s;
    float factor = 1.0f, attn = 1.0f, log_mul = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    bool yarn = false, linear = false;
    if (gguf_get_str(f, key, &s) == 0) {
        yarn = s.len == 4 && !memcmp(s.ptr, "yarn", 4);
        linear = s.len == 6 && !memcmp(s.ptr, "linear", 6);
        if (!yarn && !linear && !(s.len == 4 && !memcmp(s.ptr, "none", 4)))
            return rc_fail(RC_EUNSUPPORTED, "%s: rope scaling type '%.*s' is not supported",
                           f->path, (int)s.len, s.ptr);
    }
    const float base_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->kq_scale = base_scale;
    if (!yarn && !linear)
        return 0;
    bool has_log_mul = false;
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", a);
    has_log_mul = gguf_get_f32(f, key, &log_mul) == 0;
    if ((rc = arch_f32(f, a, "rope.scaling.factor", &factor, true)) ||
        (rc = arch_f32(f, a, "rope.scaling.attn_factor", &attn, false)) ||
        (rc = arch_u32(f, a, "rope.scaling.original_context_length", &hp->yarn_orig_ctx, yarn)))
        return rc;
    if (!(factor >= 1.0f) || !(attn > 0.0f) || (yarn && hp->yarn_orig_ctx <= 0))
        return rc_fail(RC_EFORMAT, "%s: rope scaling factor %g, attention factor %g or original "
                       "context %d out of range", f->path, factor, attn, hp->yarn_orig_ctx);
    const float A = 1.0f + 0.1f * logf(factor);
    if (linear) {
        hp->rope_freq_scale = 1.0f / factor;
        hp->kq_scale = A * A * base_scale;
        return 0;
    }
    hp->yarn_factor = factor;
    hp->rope_freq_scale = 1.0f / factor;
    if (has_log_mul) {
        const float mscale = attn * (1.0f + log_mul * logf(factor));
        hp->rope_attn_factor = attn;
        hp->kq_scale = mscale * mscale * base_scale;
    } else {
        hp->rope_attn_factor = attn * A;
        hp->kq_scale = hp->rope_attn_factor * hp->rope_attn_factor * base_scale;
    }
    return 0;
}

int model_read_hparams(const gguf_file *f, model_hparams *hp)
{
    gguf_str s;
    int rc;
    memset(hp, 0, sizeof *hp);
    uint32_t split_no = 0, split_count = 0;
    /* one part of a split model parsed alone (gguf_parse) holds only some
     * of the tensors; gguf_open opens the whole set from its first part */
    if (!f->n_parts && !gguf_get_u32(f, "split.count", &split_count) && split_count > 1) {
        gguf_get_u32(f, "split.no", &split_no);
        return rc_fail(RC_EUNSUPPORTED, "%s is part %u of %u of a split model: open the model "
                       "by its first part", f->path, split_no + 1, split_count);
    }
    if ((rc = gguf_get_str(f, "general.architecture", &s)) != 0)
        return rc == RC_ENOTFOUND
            ? rc_fail(RC_EFORMAT, "%s: metadata key 'general.architecture' is missing", f->path)
            : rc;
    if (s.len >= sizeof hp->arch_name)
        return rc_fail(RC_EUNSUPPORTED, "%s: architecture name too long", f->path);
    memcpy(hp->arch_name, s.ptr, s.len);
    hp->arch = -1;
    for (int a = 0; a < ARCH_COUNT; a++)
        if (!strcmp(hp->arch_name, arch_table[a].name))
            hp->arch = a;
    if (hp->arch < 0)
        return rc_fail(RC_EUNSUPPORTED,
                       "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, deepseek2)",
                       f->path, hp->arch_name);
    const char *a = hp->arch_name;
    hp->has_qkv_bias = arch_table[hp->arch].qkv_bias;
    hp->has_qk_norm = arch_table[hp->arch].qk_norm;
    hp->rope_neox = arch_table[hp->arch].neox;

    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rms_eps = 1e-5f;
    hp->n_ctx_train = 4096;
    if ((rc = arch_u32(f, a, "embedding_length", &hp->n_embd, true)) ||
        (rc = arch_u32(f, a, "block_count", &hp->n_layer, true)) ||
        (rc = arch_u32(f, a, "attention.head_count", &hp->n_head, true)) ||
        (rc = arch_u32(f, a, "context_length", &hp->n_ctx_train, false)) ||
        (rc = arch_u32(f, a, "feed_forward_length", &hp->n_ff, !arch_table[hp->arch].moe)) ||
        (rc = arch_f32(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps, true)) ||
        (rc = arch_f32(f, a, "rope.freq_base", &hp->rope_base, false)))
        return rc;
    hp->n_head_kv = hp->n_head;
    if ((rc = arch_u32(f, a, "attention.head_count_kv", &hp->n_head_kv, false)))
        return rc_wrap(rc, "(per-layer head counts are not supported) ");
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0)
        return rc_fail(RC_EFORMAT, "%s: embedding length, block count and head counts must be positive",
                       f->path);
    if (hp->n_head % hp->n_head_kv)
        return rc_fail(RC_EFORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                       f->path, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = arch_u32(f, a, "attention.key_length", &hp->head_dim, false)))
        return rc;
    hp->head_dim_v = hp->head_dim;
    hp->rope_dim = hp->head_dim;
    if ((rc = arch_u32(f, a, "attention.value_length", &hp->head_dim_v, false)) ||
        (rc = arch_u32(f, a, "rope.dimension_count", &hp->rope_dim, false)))
        return rc;
    if (hp->head_dim <= 0 || hp->head_dim_v <= 0 || hp->rope_dim <= 0 ||
        hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return rc_fail(RC_EFORMAT, "%s: inconsistent head width %d / value width %d / rope dims %d",
                       f->path, hp->head_dim, hp->head_dim_v, hp->rope_dim);
    hp->expert_gating = GATING_SOFTMAX;
    hp->expert_weights_scale = 1.0f;
    hp->rope_attn_factor = 1.0f;
    hp->kq_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (arch_table[hp->arch].moe) {
        hp->expert_weights_norm = hp->arch != ARCH_DEEPSEEK2;   /* qwen3moe always renormalises */
        if ((rc = arch_u32(f, a, "expert_count", &hp->n_expert, true)) ||
            (rc = arch_u32(f, a, "expert_used_count", &hp->n_expert_used, true)) ||
            (rc = arch_u32(f, a, "expert_feed_forward_length", &hp->n_ff_exp, true)))
            return rc;
        if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
            hp->n_ff_exp <= 0)
            return rc_fail(RC_EFORMAT, "%s: expert counts %d used of %d (width %d) are inconsistent",
                           f->path, hp->n_expert_used, hp->n_expert, hp->n_ff_exp);
    } else if (hp->n_ff <= 0) {
        return rc_fail(RC_EFORMAT, "%s: feed_forward_length must be positive", f->path);
    }

    /* Linear rope scaling (older Llama-2 fine-tunes); Llama 3.1's scaling
     * comes as the rope_freqs tensor instead and needs nothing here. */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (hp->arch == ARCH_DEEPSEEK2) {
        if ((rc = read_deepseek2(f, hp)))
            return rc;
    } else if (gguf_get_str(f, key, &s) == 0 && s.len == 6 && !memcmp(s.ptr, "linear", 6)) {
        float factor = 1.0f;
        if ((rc = arch_f32(f, a, "rope.scaling.factor", &factor, false)))
            return rc;
        if (!(factor > 0.0f))
            return rc_fail(RC_EFORMAT, "%s: rope.scaling.factor must be positive", f->path);
        hp->rope_freq_scale = 1.0f / factor;
    } else if (gguf_get_str(f, key, &s) == 0 && !(s.len == 4 && !memcmp(s.ptr, "none", 4)) &&
               !(s.len == 5 && !memcmp(s.ptr, "llama", 5))) {
        return rc_fail(RC_EUNSUPPORTED, "%s: rope scaling type '%.*s' is not supported",
                       f->path, (int)s.len, s.ptr);
    }
    if (hp->arch == ARCH_LLAMA) {
        float scale = 1.0f;
        if ((rc = arch_f32(f, a, "rope.scale_linear", &scale, false)))
            return rc;
        if (scale > 0.0f && scale != 1.0f)
            hp->rope_freq_scale = 1.0f / scale;
    }

    /* Embedding models; rank (4, rerankers) needs a classifier head we
     * do not run. */
    int32_t pool = 0;                          /* -1: unspecified, as none */
    snprintf(key, sizeof key, "%s.pooling_type", a);
    if (gguf_get_i32(f, key, &pool) == 0 && pool > POOL_LAST)
        return rc_fail(RC_EUNSUPPORTED, "%s: pooling type %d is not supported (none, mean, cls "
                       "and last are)", f->path, pool);
    hp->pooling = pool > 0 ? pool : POOL_NONE;
    bool causal = true;
    snprintf(key, sizeof key, "%s.attention.causal", a);
    if (gguf_get_bool(f, key, &causal) == 0 && !causal)
        return rc_fail(RC_EUNSUPPORTED, "%s: non-causal attention (BERT-style encoders) is not "
                       "supported", f->path);

    /* Vocabulary size: the explicit key, else the token list. */
    hp->n_vocab = 0;
    if ((rc = arch_u32(f, a, "vocab_size", &hp->n_vocab, false)))
        return rc;
    if (!hp->n_vocab) {
        uint32_t et;
        uint64_t n;
        if (gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) == 0 && n < (1u << 30))
            hp->n_vocab = (int)n;
    }
    return 0;
}

/* ---- binding tensors ---- */

enum { T_OPTIONAL = 0, T_REQUIRED = 1 };
enum { K_MATRIX, K_F32 };    /* what the forward pass does with the tensor */

static int bind(model *m, tensor *t, int required, int kind, const char *name,
                int n_dims, int64_t ne0, int64_t ne1, int64_t ne2)
{
    const gguf_file *f = m->file;
    const gguf_tensor *g = gguf_find_tensor(f, name);
    memset(t, 0, sizeof *t);
    if (!g)
        return required ? rc_fail(RC_EFORMAT, "%s: tensor '%s' is missing", f->path, name) : 0;
    int64_t want[3] = { ne0, ne1, ne2 };
    bool ok = (int)g->n_dims <= n_dims;
    for (int d = 0; d < 3; d++)
        ok = ok && g->ne[d] == (d < n_dims ? want[d] : 1);
    if (!ok || g->ne[3] != 1)
        return rc_fail(RC_EFORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                       f->path, name, (long long)g->ne[0], (long long)g->ne[1],
                       (long long)g->ne[2], (long long)ne0,
                       (long long)(n_dims > 1 ? ne1 : 1), (long long)(n_dims > 2 ? ne2 : 1));
    if (kind == K_F32 && g->type != TT_F32)
        return rc_fail(RC_EUNSUPPORTED, "%s: tensor '%s' has type %s; racimo expects F32 here",
                       f->path, name, tensor_type_name((int)g->type));
    if (kind == K_MATRIX && !tensor_type_supported((int)g->type))
        return rc_fail(RC_EUNSUPPORTED, "%s: tensor '%s' has type %s, which racimo cannot compute with yet",
                       f->path, name, tensor_type_name((int)g->type));
    t->data = g->data;
    t->type = (int)g->type;
    t->n_dims = (int)g->n_dims;
    for (int d = 0; d < 4; d++)
        t->ne[d] = g->ne[d];
    t->row_bytes = tensor_row_bytes(t->type, t->ne[0]);
    t->name = g->name;
    m->weight_bytes += g->size_bytes;
    return 0;
}

/* Latent attention: queries through the low-rank pair (or a plain attn_q),
 * the compressed kv with its rope key, and the per-head up-projections
 * (split, or the older unsplit attn_kv_b). */
static int bind_mla(model *m, int il, layer_weights *L)
{
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, D = hp->head_dim, Dv = hp->head_dim_v,
                  Dr = hp->rope_dim, Dn = D - Dr, R = hp->kv_lora_rank, Rq = hp->q_lora_rank;
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    if (Rq > 0) {
        if ((rc = bind(m, &L->wq_a, T_REQUIRED, K_MATRIX, NAME("attn_q_a.weight"), 2, E, Rq, 1)) ||
            (rc = bind(m, &L->q_a_norm, T_REQUIRED, K_F32, NAME("attn_q_a_norm.weight"), 1, Rq, 1, 1)) ||
            (rc = bind(m, &L->wq_b, T_REQUIRED, K_MATRIX, NAME("attn_q_b.weight"), 2, Rq, H * D, 1)))
            return rc;
    } else if ((rc = bind(m, &L->wq, T_REQUIRED, K_MATRIX, NAME("attn_q.weight"), 2, E, H * D, 1))) {
        return rc;
    }
    if ((rc = bind(m, &L->wkv_a, T_REQUIRED, K_MATRIX, NAME("attn_kv_a_mqa.weight"), 2, E, R + Dr, 1)) ||
        (rc = bind(m, &L->kv_a_norm, T_REQUIRED, K_F32, NAME("attn_kv_a_norm.weight"), 1, R, 1, 1)))
        return rc;
    if (gguf_find_tensor(m->file, NAME("attn_k_b.weight"))) {
        if ((rc = bind(m, &L->wk_b, T_REQUIRED, K_MATRIX, NAME("attn_k_b.weight"), 3, Dn, R, H)) ||
            (rc = bind(m, &L->wv_b, T_REQUIRED, K_MATRIX, NAME("attn_v_b.weight"), 3, R, Dv, H)))
            return rc;
    } else if (!gguf_find_tensor(m->file, NAME("attn_kv_b.weight"))) {
        return rc_fail(RC_EFORMAT, "%s: layer %d has neither attn_k_b/attn_v_b nor attn_kv_b",
                       m->file->path, il);
    } else if ((rc = bind(m, &L->wkv_b, T_REQUIRED, K_MATRIX, n, 2, R, H * (Dn + Dv), 1))) {
        return rc;
    }
#undef NAME
    return 0;
}

static int bind_layer(model *m, int il, layer_weights *L)
{
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hk = hp->n_head_kv, D = hp->head_dim,
                  Dv = hp->head_dim_v, F = hp->n_ff, X = hp->n_expert, Fx = hp->n_ff_exp,
                  Fs = (int64_t)hp->n_expert_shared * hp->n_ff_exp;
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    if ((rc = bind(m, &L->attn_norm, T_REQUIRED, K_F32, NAME("attn_norm.weight"), 1, E, 1, 1)) ||
        (rc = bind(m, &L->wo, T_REQUIRED, K_MATRIX, NAME("attn_output.weight"), 2, H * Dv, E, 1)) ||
        (rc = bind(m, &L->ffn_norm, T_REQUIRED, K_F32, NAME("ffn_norm.weight"), 1, E, 1, 1)))
        return rc;
    if (hp->kv_lora_rank > 0) {
        if ((rc = bind_mla(m, il, L)))
            return rc;
    } else if ((rc = bind(m, &L->wq, T_REQUIRED, K_MATRIX, NAME("attn_q.weight"), 2, E, H * D, 1)) ||
               (rc = bind(m, &L->wk, T_REQUIRED, K_MATRIX, NAME("attn_k.weight"), 2, E, Hk * D, 1)) ||
               (rc = bind(m, &L->wv, T_REQUIRED, K_MATRIX, NAME("attn_v.weight"), 2, E, Hk * Dv, 1))) {
        return rc;
    }
    /* Biases are optional in llama files too (some fine-tunes carry them). */
    int need_bias = hp->has_qkv_bias ? T_REQUIRED : T_OPTIONAL;
    if (hp->kv_lora_rank == 0 &&
        ((rc = bind(m, &L->bq, need_bias, K_F32, NAME("attn_q.bias"), 1, H * D, 1, 1)) ||
         (rc = bind(m, &L->bk, need_bias, K_F32, NAME("attn_k.bias"), 1, Hk * D, 1, 1)) ||
         (rc = bind(m, &L->bv, need_bias, K_F32, NAME("attn_v.bias"), 1, Hk * Dv, 1, 1))))
        return rc;
    if (hp->has_qk_norm &&
        ((rc = bind(m, &L->q_norm, T_REQUIRED, K_F32, NAME("attn_q_norm.weight"), 1, D, 1, 1)) ||
         (rc = bind(m, &L->k_norm, T_REQUIRED, K_F32, NAME("attn_k_norm.weight"), 1, D, 1, 1))))
        return rc;
    if (hp->n_expert > 0 && il >= hp->n_layer_dense_lead) {
        if ((rc = bind(m, &L->gate_inp, T_REQUIRED, K_MATRIX, NAME("ffn_gate_inp.weight"), 2, E, X, 1)) ||
            (rc = bind(m, &L->gate_exps, T_REQUIRED, K_MATRIX, NAME("ffn_gate_exps.weight"), 3, E, Fx, X)) ||
            (rc = bind(m, &L->up_exps, T_REQUIRED, K_MATRIX, NAME("ffn_up_exps.weight"), 3, E, Fx, X)) ||
            (rc = bind(m, &L->down_exps, T_REQUIRED, K_MATRIX, NAME("ffn_down_exps.weight"), 3, Fx, E, X)) ||
            (rc = bind(m, &L->exp_probs_b, T_OPTIONAL, K_F32, NAME("exp_probs_b.bias"), 1, X, 1, 1)))
            return rc;
        if (Fs > 0 &&
            ((rc = bind(m, &L->gate_shexp, T_REQUIRED, K_MATRIX, NAME("ffn_gate_shexp.weight"), 2, E, Fs, 1)) ||
             (rc = bind(m, &L->up_shexp, T_REQUIRED, K_MATRIX, NAME("ffn_up_shexp.weight"), 2, E, Fs, 1)) ||
             (rc = bind(m, &L->down_shexp, T_REQUIRED, K_MATRIX, NAME("ffn_down_shexp.weight"), 2, Fs, E, 1))))
            return rc;
    } else {
        if ((rc = bind(m, &L->w_gate, T_REQUIRED, K_MATRIX, NAME("ffn_gate.weight"), 2, E, F, 1)) ||
            (rc = bind(m, &L->w_up, T_REQUIRED, K_MATRIX, NAME("ffn_up.weight"), 2, E, F, 1)) ||
            (rc = bind(m, &L->w_down, T_REQUIRED, K_MATRIX, NAME("ffn_down.weight"), 2, F, E, 1)))
            return rc;
    }
#undef NAME
    return 0;
}

/* Layer of a "blk.<i>." tensor name, or -1. */
static int layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4) || name[4] < '0' || name[4] > '9')
        return -1;
    char *end;
    long il = strtol(name + 4, &end, 10);
    return *end == '.' && il < (1L << 30) ? (int)il : -1;
}

int model_tensor_needs(const gguf_file *f, int first, int last, bool *need)
{
    model_hparams hp;
    int rc = model_read_hparams(f, &hp);
    if (rc)
        return rc;
    if (last < 0)
        last = hp.n_layer;
    if (first < 0 || first >= last || last > hp.n_layer)
        return rc_fail(RC_EINVAL, "%s: layer range [%d, %d) is not within the model's %d layers",
                       f->path, first, last, hp.n_layer);
    bool tied = gguf_find_tensor(f, "output.weight") == NULL;
    bool at_end = last == hp.n_layer;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const char *n = f->tensors[i].name;
        int il = layer_of(n);
        need[i] = (il >= first && il < last) || !strcmp(n, "rope_freqs.weight") ||
                  (!strcmp(n, "token_embd.weight") && (first == 0 || (at_end && tied))) ||
                  (at_end && (!strcmp(n, "output_norm.weight") || !strcmp(n, "output.weight")));
    }
    return 0;
}

/* A shard's ranges against a partial copy's verified ones: the names of
 * the tensors whose needed bytes are missing, in `missing`. */
typedef struct {
    const model_ranges *r;
    char *missing;
    size_t cap, len;
    bool any;
} shard_check;

static int shard_range_covered(void *ud, uint64_t start, uint64_t end, const char *name)
{
    shard_check *c = ud;
    if (!model_ranges_covers(c->r, start, end)) {
        c->any = true;
        if (c->len < c->cap)
            c->len += (size_t)snprintf(c->missing + c->len, c->cap - c->len, "%s, ", name);
    }
    return 0;
}

/* Refuses tensors outside the verified ranges of a partial copy; names the
 * layers (and the other tensors) missing.  A shard (n_ranks > 1) needs only
 * its parts of them (model_shard_ranges). */
static int check_ranges(const gguf_file *f, const bool *need, int first, int last, int rank,
                        int n_ranks)
{
    char mpath[4200];
    model_ranges r;
    size_t n = strlen(f->path);
    bool part = n >= 5 && !strcmp(f->path + n - 5, ".part");
    int rc = model_ranges_path(f->path, mpath, sizeof mpath);
    if (rc)
        return rc;
    if ((rc = model_ranges_read(mpath, &r)) == RC_ENOTFOUND && !part)
        return 0;
    if (rc == RC_ENOTFOUND)
        return rc_fail(RC_ENOTFOUND, "%s: an incomplete download without its manifest %s",
                       f->path, mpath);
    if (rc)
        return rc;
    char missing[512] = "";
    size_t len = 0;
    int run_lo = -1, run_hi = -1;
    bool any = r.file_bytes != f->size_bytes || !model_ranges_covers(&r, 0, f->data_offset);
    if (any)
        len += (size_t)snprintf(missing + len, sizeof missing - len, "the file head, ");
    if (n_ranks > 1) {
        shard_check c = { &r, missing, sizeof missing, len, false };
        rc = any ? 0 : model_shard_ranges(f, first, last, rank, n_ranks, shard_range_covered, &c);
        model_ranges_free(&r);
        if (rc)
            return rc;
        if (!any && !c.any)
            return 0;
        n = strlen(missing);
        if (n >= 2)
            missing[n - 2] = '\0';
        return rc_fail(RC_ENOTFOUND, "%s: a partial copy without %s (shard %d of %d; verified "
                       "ranges in %s); pull them from a node that has the model", f->path,
                       missing, rank, n_ranks, mpath);
    }
    /* Tensors are checked in file order per layer: collect missing layers
     * as runs "a-b". */
#define FLUSH() do { \
        if (run_lo >= 0 && len < sizeof missing) \
            len += (size_t)snprintf(missing + len, sizeof missing - len, \
                                    run_lo == run_hi ? "layer %d, " : "layers %d-%d, ", \
                                    run_lo, run_hi); \
        run_lo = -1; \
    } while (0)
    int max_layer = -1;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (layer_of(f->tensors[i].name) > max_layer)
            max_layer = layer_of(f->tensors[i].name);
    for (int il = 0; il <= max_layer; il++) {
        bool miss = false;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            if (need[i] && layer_of(t->name) == il &&
                !model_ranges_covers(&r, t->file_offset, t->file_offset + t->size_bytes))
                miss = true;
        }
        if (miss && run_lo >= 0 && run_hi == il - 1) {
            run_hi = il;
        } else if (miss) {
            FLUSH();
            run_lo = run_hi = il;
        }
        any = any || miss;
    }
    FLUSH();
#undef FLUSH
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (need[i] && layer_of(t->name) < 0 && len < sizeof missing &&
            !model_ranges_covers(&r, t->file_offset, t->file_offset + t->size_bytes)) {
            len += (size_t)snprintf(missing + len, sizeof missing - len, "%s, ", t->name);
            any = true;
        }
    }
    model_ranges_free(&r);
    if (!any)
        return 0;
    n = strlen(missing);
    if (n >= 2)
        missing[n - 2] = '\0';
    return rc_fail(RC_ENOTFOUND, "%s: a partial copy without %s (verified ranges in %s); "
                   "pull them from a node that has the model", f->path, missing, mpath);
}

/* Points every bound view at its tensor's mapped bytes (binding happens
 * before mapping, so views start with NULL data). */
static void refresh_views(model *m)
{
    tensor *fixed[] = { &m->tok_embd, &m->output_norm, &m->output, &m->rope_freqs };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i]->name)
            fixed[i]->data = gguf_find_tensor(m->file, fixed[i]->name)->data;
    for (int l = 0; l < m->last - m->first; l++) {
        tensor *t = (tensor *)&m->layers[l];
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor); i++)
            if (t[i].name)
                t[i].data = gguf_find_tensor(m->file, t[i].name)->data;
    }
}

int model_load_file(gguf_file *f, int first, int last, model **out)
{
    return model_load_file_shard(f, first, last, 0, 1, out);
}

int model_load_file_shard(gguf_file *f, int first, int last, int rank, int n_ranks,
                          model **out)
{
    int rc;
    bool *need = NULL;
    *out = NULL;
    model *m = rc_calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return rc_fail(RC_ENOMEM, "out of memory loading a model");
    }
    m->file = f;
    if ((rc = model_read_hparams(f, &m->hp)))
        goto fail;
    model_hparams *hp = &m->hp;
    if (last < 0)
        last = hp->n_layer;
    if (first < 0 || first >= last || last > hp->n_layer) {
        rc = rc_fail(RC_EINVAL, "%s: layer range [%d, %d) is not within the model's %d layers",
                     f->path, first, last, hp->n_layer);
        goto fail;
    }
    m->first = first;
    m->last = last;
    bool no_weights = false;
    if (gguf_get_bool(f, "racimo.no_weights", &no_weights) == 0 && no_weights) {
        rc = rc_fail(RC_EINVAL, "%s holds no weights (made by make-model --no-weights for "
                     "planning): it can be planned, not run", f->path);
        goto fail;
    }

    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    const gguf_tensor *outw = gguf_find_tensor(f, "output.weight");
    if (!emb) {
        rc = rc_fail(RC_EFORMAT, "%s: tensor 'token_embd.weight' is missing", f->path);
        goto fail;
    }
    if (!hp->n_vocab)
        hp->n_vocab = (int)emb->ne[1];
    hp->tied_output = outw == NULL;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    bool need_embd = first == 0 || (last == hp->n_layer && hp->tied_output);
    if (need_embd &&
        (rc = bind(m, &m->tok_embd, T_REQUIRED, K_MATRIX, "token_embd.weight", 2, E, V, 1)))
        goto fail;
    if (last == hp->n_layer) {
        if ((rc = bind(m, &m->output_norm, T_REQUIRED, K_F32, "output_norm.weight", 1, E, 1, 1)))
            goto fail;
        if (hp->tied_output)
            m->output = m->tok_embd;
        else if ((rc = bind(m, &m->output, T_REQUIRED, K_MATRIX, "output.weight", 2, E, V, 1)))
            goto fail;
    }
    if ((rc = bind(m, &m->rope_freqs, T_OPTIONAL, K_F32, "rope_freqs.weight", 1,
                   hp->rope_dim / 2, 1, 1)))
        goto fail;

    m->layers = rc_calloc((size_t)(last - first), sizeof *m->layers);
    if (!m->layers) {
        rc = rc_fail(RC_ENOMEM, "out of memory loading a model");
        goto fail;
    }
    for (int il = first; il < last; il++)
        if ((rc = bind_layer(m, il, &m->layers[il - first])))
            goto fail;

    need = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *need);
    if (!need) {
        rc = rc_fail(RC_ENOMEM, "out of memory loading a model");
        goto fail;
    }
    if ((rc = model_tensor_needs(f, first, last, need)))
        goto fail;
    /* A whole-model load maps the whole file once: callers read the file
     * through f->base (prefaulting, benchmarks). */
    if (first == 0 && last == hp->n_layer)
        for (uint64_t i = 0; i < f->n_tensors; i++)
            need[i] = true;
    if ((rc = check_ranges(f, need, first, last, rank, n_ranks)) ||
        (rc = gguf_map_tensors(f, need)))
        goto fail;
    refresh_views(m);
    if ((rc = model_split_kv_b(m)) || (rc = model_shard_apply(m, rank, n_ranks)) ||
        (rc = model_repack(m)))
        goto fail;
    rc_free(need);
    *out = m;
    return 0;
fail:
    rc_free(need);
    model_free(m);
    return rc;
}

int model_load(const char *path, int first, int last, model **out)
{
    gguf_file *f;
    int rc = gguf_open_meta(path, &f);
    *out = NULL;
    if (rc)
        return rc;
    return model_load_file(f, first, last, out);
}

int model_load_shard(const char *path, int first, int last, int rank, int n_ranks,
                     model **out)
{
    gguf_file *f;
    int rc = gguf_open_meta(path, &f);
    *out = NULL;
    if (rc)
        return rc;
    return model_load_file_shard(f, first, last, rank, n_ranks, out);
}

void model_free(model *m)
{
    if (!m)
        return;
    gguf_close(m->file);
    for (int i = 0; i < m->n_owned; i++)
        rc_free_aligned(m->owned[i]);
    rc_free(m->owned);
    rc_free(m->layers);
    rc_free(m);
}

static uint64_t tensor_bytes(const tensor *t)
{
    return t->data ? (uint64_t)t->row_bytes * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) : 0;
}

uint64_t model_decode_bytes(const model *m)
{
    uint64_t total = 0;
    for (int l = 0; l < m->last - m->first; l++) {
        const layer_weights *L = &m->layers[l];
        const tensor *all = (const tensor *)L;
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor); i++)
            if (&all[i] != &L->gate_exps && &all[i] != &L->up_exps && &all[i] != &L->down_exps)
                total += tensor_bytes(&all[i]);
        uint64_t experts = tensor_bytes(&L->gate_exps) + tensor_bytes(&L->up_exps) +
                           tensor_bytes(&L->down_exps);
        /* a token runs n_expert_used of all n_expert experts; a shard holding
         * a range of them runs that share of those on average */
        if (L->gate_exps.data)
            total += experts / (uint64_t)m->hp.n_expert * (uint64_t)m->hp.n_expert_used;
    }
    if (m->last == m->hp.n_layer)
        total += tensor_bytes(&m->output) + tensor_bytes(&m->output_norm);
    if (m->first == 0)
        total += m->tok_embd.row_bytes;
    return total;
}
