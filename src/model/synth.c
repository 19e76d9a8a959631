/* synth.c - random-weight models in GGUF.
 *
 * Each tensor's values come from its own random stream (seed mixed with the
 * tensor's index), so a tensor's bytes do not depend on the order in which
 * they are generated.  Standard deviations keep activations of order 1 through
 * many layers (1/sqrt(fan-in)), so greedy decoding has clear winners.
 *
 * The vocabulary is byte-level BPE ("gpt2") with the 256 byte symbols first,
 * then ~100 merged tokens of a small English-like BPE, filler tokens after,
 * and control tokens last (with a chat template that uses them), so any text
 * round-trips and chat commands work as with a real model.
 */
#include "synth.h"
#include "gguf.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "base/rng.h"
#include "tensor/pool.h"
#include "tensor/types.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const synth_params presets_base = {
    .arch = "llama", .n_vocab = 512, .n_embd = 256, .n_layer = 2, .n_head = 8,
    .n_head_kv = 2, .n_ff = 512, .n_ctx = 2048, .rope_base = 10000.0f,
    .rms_eps = 1e-5f, .type = TT_F32, .seed = 1,
};

const char *synth_preset_names(void)
{
    return "tiny, tiny-qwen2, tiny-qwen3, tiny-qwen3-embed, tiny-qwen3-embed-mean, "
           "tiny-qwen3moe, tiny-deepseek2, llama3-1b, "
           "qwen2.5-0.5b, llama3-8b, deepseek-v3-mini, deepseek-v3, kimi-k2";
}

/* DeepSeek-V3's attention, routing and rope (also R1 and V3.1's). */
static void deepseek_v3(synth_params *p)
{
    p->arch = "deepseek2"; p->n_vocab = 129280; p->n_embd = 7168; p->n_layer = 61;
    p->n_head = 128; p->n_head_kv = 128; p->head_dim = 192; p->rope_dim = 64;
    p->head_dim_v = 128; p->q_lora_rank = 1536; p->kv_lora_rank = 512;
    p->n_ff = 18432; p->n_dense_lead = 3; p->n_expert = 256; p->n_expert_used = 8;
    p->n_ff_exp = 2048; p->n_expert_shared = 1; p->n_expert_group = 8;
    p->n_expert_group_used = 4; p->gating = 2; p->expert_weights_norm = true;
    p->expert_weights_scale = 2.5f; p->expert_bias = true; p->n_ctx = 163840;
    p->rms_eps = 1e-6f; p->yarn_factor = 40.0f; p->yarn_orig_ctx = 4096; p->yarn_log_mul = 0.1f;
}

int synth_preset(const char *name, synth_params *p)
{
    *p = presets_base;
    if (!strcmp(name, "tiny"))
        return 0;
    if (!strcmp(name, "tiny-qwen2")) {
        p->arch = "qwen2"; p->rope_base = 1e6f; p->rms_eps = 1e-6f;
        return 0;
    }
    if (!strcmp(name, "tiny-qwen3")) {
        p->arch = "qwen3"; p->rope_base = 1e6f; p->rms_eps = 1e-6f; p->tied = true;
        return 0;
    }
    if (!strcmp(name, "tiny-qwen3-embed") || !strcmp(name, "tiny-qwen3-embed-mean")) {
        /* Qwen3-Embedding's shape of file: no output.weight, a pooling type */
        p->arch = "qwen3"; p->rope_base = 1e6f; p->rms_eps = 1e-6f; p->tied = true;
        p->pooling = name[16] ? 1 : 3;
        return 0;
    }
    if (!strcmp(name, "tiny-qwen3moe")) {
        p->arch = "qwen3moe"; p->rope_base = 1e6f; p->rms_eps = 1e-6f;
        p->n_ff = 0; p->n_expert = 4; p->n_expert_used = 2; p->n_ff_exp = 256;
        return 0;
    }
    if (!strcmp(name, "tiny-deepseek2")) {
        /* the golden deepseek2 shapes: 3 layers, the first dense */
        deepseek_v3(p);
        p->n_vocab = 512; p->n_embd = 256; p->n_layer = 3; p->n_head = 8; p->n_head_kv = 8;
        p->head_dim = 48; p->rope_dim = 16; p->head_dim_v = 32; p->q_lora_rank = 96;
        p->kv_lora_rank = 64; p->n_ff = 512; p->n_dense_lead = 1; p->n_expert = 8;
        p->n_expert_used = 2; p->n_ff_exp = 128; p->n_expert_group = 4;
        p->n_expert_group_used = 2; p->n_ctx = 2048;
        return 0;
    }
    if (!strcmp(name, "deepseek-v3")) {
        deepseek_v3(p);
        return 0;
    }
    if (!strcmp(name, "deepseek-v3-mini")) {
        /* DeepSeek-V3's layers at their real shapes, but 4 of them (1 dense)
         * with 16 routed experts, and a 32k vocabulary: ~4.4 GB at Q4_K_M */
        deepseek_v3(p);
        p->n_layer = 4; p->n_dense_lead = 1; p->n_expert = 16; p->n_expert_group = 8;
        p->n_expert_group_used = 4; p->n_vocab = 32000;
        return 0;
    }
    if (!strcmp(name, "kimi-k2")) {
        /* Kimi K2: DeepSeek-V3's architecture with 384 experts, 64 heads,
         * one dense layer, no expert groups and a 163840-token vocabulary */
        deepseek_v3(p);
        p->n_vocab = 163840; p->n_head = 64; p->n_head_kv = 64; p->n_dense_lead = 1;
        p->n_expert = 384; p->n_expert_group = 1; p->n_expert_group_used = 1;
        p->expert_weights_scale = 2.827f; p->yarn_factor = 32.0f; p->n_ctx = 131072;
        return 0;
    }
    if (!strcmp(name, "llama3-1b")) {
        p->n_vocab = 128256; p->n_embd = 2048; p->n_layer = 16; p->n_head = 32;
        p->n_head_kv = 8; p->n_ff = 8192; p->n_ctx = 131072; p->rope_base = 500000.0f;
        p->tied = true; p->rope_freqs = true;
        return 0;
    }
    if (!strcmp(name, "qwen2.5-0.5b")) {
        p->arch = "qwen2"; p->n_vocab = 151936; p->n_embd = 896; p->n_layer = 24;
        p->n_head = 14; p->n_head_kv = 2; p->n_ff = 4864; p->n_ctx = 32768;
        p->rope_base = 1e6f; p->rms_eps = 1e-6f; p->tied = true;
        return 0;
    }
    if (!strcmp(name, "llama3-8b")) {
        p->n_vocab = 128256; p->n_embd = 4096; p->n_layer = 32; p->n_head = 32;
        p->n_head_kv = 8; p->n_ff = 14336; p->n_ctx = 131072; p->rope_base = 500000.0f;
        p->rope_freqs = true;
        return 0;
    }
    return rc_fail(RC_ENOTFOUND, "unknown model preset '%s' (known: %s)", name, synth_preset_names());
}

/* ---- tensor plan ---- */

enum { INIT_NORMAL, INIT_NORM_WEIGHT, INIT_ROPE_FREQS };

typedef struct {
    char name[64];
    int type;
    int n_dims;
    int64_t ne[3];
    int init;
    float std;
} synth_tensor;

enum { CHUNK_ROWS = 128 };   /* rows drawn, then converted by the pool's threads */

typedef struct {
    const synth_params *p;
    synth_tensor *t;
    int n;
    float *row;      /* CHUNK_ROWS rows of f32 values before conversion */
    thread_pool *pool;
} synth_ctx;

/* llama-quantize's rule for the layers that get more bits in Q4_K_M. */
static bool more_bits(int il, int n_layer)
{
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

/* The type a matrix gets: the uniform type, or the mix's choice; K-quants
 * and IQ4_XS fall back to 32-wide types when rows are not a multiple of
 * 256 (IQ4_XS to IQ4_NL, as llama-quantize does). */
static int pick_type(const synth_params *p, const char *role, int il, int64_t ne0)
{
    int t = p->type;
    if (p->mix && !strcmp(p->mix, "Q4_K_M")) {
        t = TT_Q4_K;
        if (!strcmp(role, "output") || (!strcmp(role, "token_embd") && p->tied))
            t = TT_Q6_K;
        else if ((!strcmp(role, "attn_v") || !strcmp(role, "ffn_down")) && more_bits(il, p->n_layer))
            t = TT_Q6_K;
        else if (!strcmp(role, "attn_output") && p->n_expert == 8)
            t = TT_Q5_K;
    }
    const tensor_traits *tt = tensor_type_traits(t);
    if (ne0 % tt->block_size) {
        if (t == TT_Q4_K || t == TT_Q5_K) t = TT_Q5_0;
        else if (t == TT_Q6_K) t = TT_Q8_0;
        else if (t == TT_IQ4_XS) t = TT_IQ4_NL;
        else t = TT_F16;
        if (ne0 % tensor_type_traits(t)->block_size)
            t = TT_F32;
    }
    return t;
}

static int plan_add(synth_ctx *c, int cap, const char *name, int type, int n_dims,
                    int64_t ne0, int64_t ne1, int64_t ne2, int init, float std)
{
    if (c->n >= cap)
        return rc_fail(RC_ELIMIT, "synthetic model: too many tensors");
    synth_tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = n_dims;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = ne2;
    t->init = init;
    t->std = std;
    return 0;
}

/* One deepseek2 layer, as llama.cpp's converter writes DeepSeek-V3: latent
 * attention with split up-projections (or the older unsplit attn_kv_b),
 * then a dense FFN for the leading layers, else routed experts with their
 * selection bias and the shared experts. */
static int plan_mla_layer(synth_ctx *c, int cap, int il)
{
    const synth_params *p = c->p;
    const int64_t E = p->n_embd, H = p->n_head, D = p->head_dim, Dr = p->rope_dim, Dn = D - Dr;
    const int64_t Dv = p->head_dim_v, R = p->kv_lora_rank, Rq = p->q_lora_rank;
    const int64_t X = p->n_expert, Fx = p->n_ff_exp, Fs = (int64_t)p->n_expert_shared * Fx;
    const float s_in = 1.0f / sqrtf((float)E);
    char n[64];
    int rc;
#define L(s) snprintf(n, sizeof n, "blk.%d." s, il)
#define ADD(role, nd, a, b, cc, init, std) \
    (rc = plan_add(c, cap, n, (init) == INIT_NORMAL ? pick_type(p, role, il, a) : TT_F32, \
                   nd, a, b, cc, init, std))
#define F32(nd, a, b, init, std) (rc = plan_add(c, cap, n, TT_F32, nd, a, b, 1, init, std))
    L("attn_norm.weight"); if (F32(1, E, 1, INIT_NORM_WEIGHT, 0)) return rc;
    if (Rq > 0) {
        L("attn_q_a.weight");      if (ADD("attn_q_a", 2, E, Rq, 1, INIT_NORMAL, s_in)) return rc;
        L("attn_q_a_norm.weight"); if (F32(1, Rq, 1, INIT_NORM_WEIGHT, 0)) return rc;
        L("attn_q_b.weight");      if (ADD("attn_q_b", 2, Rq, H * D, 1, INIT_NORMAL, 1.0f / sqrtf((float)Rq))) return rc;
    } else {
        L("attn_q.weight");        if (ADD("attn_q", 2, E, H * D, 1, INIT_NORMAL, s_in)) return rc;
    }
    L("attn_kv_a_mqa.weight");  if (ADD("attn_kv_a_mqa", 2, E, R + Dr, 1, INIT_NORMAL, s_in)) return rc;
    L("attn_kv_a_norm.weight"); if (F32(1, R, 1, INIT_NORM_WEIGHT, 0)) return rc;
    if (p->unsplit_kv_b) {
        L("attn_kv_b.weight"); if (ADD("attn_kv_b", 2, R, H * (Dn + Dv), 1, INIT_NORMAL, 1.0f / sqrtf((float)R))) return rc;
    } else {
        L("attn_k_b.weight"); if (ADD("attn_k_b", 3, Dn, R, H, INIT_NORMAL, 1.0f / sqrtf((float)R))) return rc;
        L("attn_v_b.weight"); if (ADD("attn_v_b", 3, R, Dv, H, INIT_NORMAL, 1.0f / sqrtf((float)R))) return rc;
    }
    L("attn_output.weight"); if (ADD("attn_output", 2, H * Dv, E, 1, INIT_NORMAL, 0.5f / sqrtf((float)(H * Dv)))) return rc;
    L("ffn_norm.weight");    if (F32(1, E, 1, INIT_NORM_WEIGHT, 0)) return rc;
    if (il < p->n_dense_lead) {
        const int64_t F = p->n_ff;
        L("ffn_gate.weight"); if (ADD("ffn_gate", 2, E, F, 1, INIT_NORMAL, s_in)) return rc;
        L("ffn_up.weight");   if (ADD("ffn_up", 2, E, F, 1, INIT_NORMAL, s_in)) return rc;
        L("ffn_down.weight"); if (ADD("ffn_down", 2, F, E, 1, INIT_NORMAL, 0.5f / sqrtf((float)F))) return rc;
        return 0;
    }
    const float scale = p->expert_weights_scale > 0 ? p->expert_weights_scale : 1.0f;
    L("ffn_gate_inp.weight"); if (F32(2, E, X, INIT_NORMAL, 0.1f)) return rc;
    if (p->expert_bias) {
        L("exp_probs_b.bias"); if (F32(1, X, 1, INIT_NORMAL, 0.1f)) return rc;
    }
    L("ffn_gate_exps.weight"); if (ADD("ffn_gate", 3, E, Fx, X, INIT_NORMAL, s_in)) return rc;
    L("ffn_up_exps.weight");   if (ADD("ffn_up", 3, E, Fx, X, INIT_NORMAL, s_in)) return rc;
    L("ffn_down_exps.weight"); if (ADD("ffn_down", 3, Fx, E, X, INIT_NORMAL, 0.5f / sqrtf((float)Fx) / scale)) return rc;
    if (Fs > 0) {
        L("ffn_gate_shexp.weight"); if (ADD("ffn_gate", 2, E, Fs, 1, INIT_NORMAL, s_in)) return rc;
        L("ffn_up_shexp.weight");   if (ADD("ffn_up", 2, E, Fs, 1, INIT_NORMAL, s_in)) return rc;
        L("ffn_down_shexp.weight"); if (ADD("ffn_down", 2, Fs, E, 1, INIT_NORMAL, 0.5f / sqrtf((float)Fs))) return rc;
    }
#undef L
#undef ADD
#undef F32
    return 0;
}

static int plan(synth_ctx *c, int cap)
{
    const synth_params *p = c->p;
    const int64_t E = p->n_embd, H = p->n_head, Hk = p->n_head_kv, V = p->n_vocab;
    const int64_t D = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    const bool qwen = strncmp(p->arch, "qwen", 4) == 0;
    const bool qk_norm = !strcmp(p->arch, "qwen3") || !strcmp(p->arch, "qwen3moe");
    const bool moe = !strcmp(p->arch, "qwen3moe");
    const bool mla = !strcmp(p->arch, "deepseek2");
    int rc;
    char n[64];
    float s_in = 1.0f / sqrtf((float)E);
#define ADD_F32(nd, a, b, cc, init, std) (rc = plan_add(c, cap, n, TT_F32, nd, a, b, cc, init, std))
#define ADD(role, il, nd, a, b, cc, init, std) \
    (rc = plan_add(c, cap, n, (init) == INIT_NORMAL ? pick_type(p, role, il, a) : TT_F32, \
                   nd, a, b, cc, init, std))
    snprintf(n, sizeof n, "token_embd.weight");
    if (ADD("token_embd", 0, 2, E, V, 1, INIT_NORMAL, p->tied ? 1.0f : 1.0f)) return rc;
    if (p->rope_freqs) {
        snprintf(n, sizeof n, "rope_freqs.weight");
        if (ADD("", 0, 1, D / 2, 1, 1, INIT_ROPE_FREQS, 0)) return rc;
    }
    for (int il = 0; il < p->n_layer; il++) {
#define L(s) snprintf(n, sizeof n, "blk.%d." s, il)
        if (mla) {
            if ((rc = plan_mla_layer(c, cap, il)))
                return rc;
            continue;
        }
        L("attn_norm.weight");   if (ADD("", il, 1, E, 1, 1, INIT_NORM_WEIGHT, 0)) return rc;
        L("attn_q.weight");      if (ADD("attn_q", il, 2, E, H * D, 1, INIT_NORMAL, s_in)) return rc;
        L("attn_k.weight");      if (ADD("attn_k", il, 2, E, Hk * D, 1, INIT_NORMAL, s_in)) return rc;
        L("attn_v.weight");      if (ADD("attn_v", il, 2, E, Hk * D, 1, INIT_NORMAL, s_in)) return rc;
        L("attn_output.weight"); if (ADD("attn_output", il, 2, H * D, E, 1, INIT_NORMAL, 0.5f / sqrtf((float)(H * D)))) return rc;
        if (qwen && !qk_norm) {
            L("attn_q.bias"); if (ADD_F32(1, H * D, 1, 1, INIT_NORMAL, 0.1f)) return rc;
            L("attn_k.bias"); if (ADD_F32(1, Hk * D, 1, 1, INIT_NORMAL, 0.1f)) return rc;
            L("attn_v.bias"); if (ADD_F32(1, Hk * D, 1, 1, INIT_NORMAL, 0.1f)) return rc;
        }
        if (qk_norm) {
            L("attn_q_norm.weight"); if (ADD("", il, 1, D, 1, 1, INIT_NORM_WEIGHT, 0)) return rc;
            L("attn_k_norm.weight"); if (ADD("", il, 1, D, 1, 1, INIT_NORM_WEIGHT, 0)) return rc;
        }
        L("ffn_norm.weight"); if (ADD("", il, 1, E, 1, 1, INIT_NORM_WEIGHT, 0)) return rc;
        if (moe) {
            const int64_t X = p->n_expert, Fx = p->n_ff_exp;
            L("ffn_gate_inp.weight"); if ((rc = plan_add(c, cap, n, TT_F32, 2, E, X, 1, INIT_NORMAL, 0.5f))) return rc;
            L("ffn_gate_exps.weight"); if (ADD("ffn_gate", il, 3, E, Fx, X, INIT_NORMAL, s_in)) return rc;
            L("ffn_up_exps.weight");   if (ADD("ffn_up", il, 3, E, Fx, X, INIT_NORMAL, s_in)) return rc;
            L("ffn_down_exps.weight"); if (ADD("ffn_down", il, 3, Fx, E, X, INIT_NORMAL, 0.5f / sqrtf((float)Fx))) return rc;
        } else {
            const int64_t F = p->n_ff;
            L("ffn_gate.weight"); if (ADD("ffn_gate", il, 2, E, F, 1, INIT_NORMAL, s_in)) return rc;
            L("ffn_up.weight");   if (ADD("ffn_up", il, 2, E, F, 1, INIT_NORMAL, s_in)) return rc;
            L("ffn_down.weight"); if (ADD("ffn_down", il, 2, F, E, 1, INIT_NORMAL, 0.5f / sqrtf((float)F))) return rc;
        }
#undef L
    }
    snprintf(n, sizeof n, "output_norm.weight");
    if (ADD("", 0, 1, E, 1, 1, INIT_NORM_WEIGHT, 0)) return rc;
    if (!p->tied) {
        snprintf(n, sizeof n, "output.weight");
        if (ADD("output", 0, 2, E, V, 1, INIT_NORMAL, 2.0f * s_in)) return rc;
    }
#undef ADD
#undef ADD_F32
    return 0;
}

typedef struct {
    const synth_tensor *t;
    const float *src;
    uint8_t *dst;
    long rows;
} convert_job;

/* Quantising (Q4_K's fit above all) costs far more than drawing the
 * numbers: rows are converted on every thread. */
static void convert_rows(void *arg, int ith, int nth)
{
    const convert_job *j = arg;
    const tensor_traits *tt = tensor_type_traits(j->t->type);
    const int64_t n0 = j->t->ne[0];
    const size_t rb = tensor_row_bytes(j->t->type, n0);
    long a, b;
    pool_split(j->rows, ith, nth, &a, &b);
    for (long r = a; r < b; r++) {
        if (j->t->type == TT_F32)
            memcpy(j->dst + (size_t)r * rb, j->src + (size_t)r * n0, rb);
        else
            tt->from_float(j->src + (size_t)r * n0, j->dst + (size_t)r * rb, n0);
    }
}

static int fill(void *ctx, uint64_t index, void *dst, uint64_t size_bytes)
{
    synth_ctx *c = ctx;
    const synth_tensor *t = &c->t[index];
    rng_state r;
    rng_seed(&r, c->p->seed * 0x9e3779b97f4a7c15ull + index + 1);
    const int64_t n0 = t->ne[0], rows = t->ne[1] * t->ne[2];
    const size_t rb = tensor_row_bytes(t->type, n0);
    for (int64_t row0 = 0; row0 < rows; row0 += CHUNK_ROWS) {
        const long n_rows = rows - row0 < CHUNK_ROWS ? (long)(rows - row0) : CHUNK_ROWS;
        for (long k = 0; k < n_rows; k++) {
            float *v = c->row + (size_t)k * n0;
            for (int64_t i = 0; i < n0; i++) {
                switch (t->init) {
                case INIT_NORM_WEIGHT: v[i] = 1.0f + 0.1f * rng_normal(&r); break;
                case INIT_ROPE_FREQS:  v[i] = 1.0f + (float)i / (float)n0 * 7.0f; break;
                default:               v[i] = t->std * rng_normal(&r); break;
                }
            }
        }
        convert_job j = { t, c->row, (uint8_t *)dst + (size_t)row0 * rb, n_rows };
        pool_run(n_rows > 1 ? c->pool : NULL, convert_rows, &j);
    }
    (void)size_bytes;
    return 0;
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
 * rest are shifted to U+0100 and up, so every token is printable text. */
static void byte_symbol(int b, char out[4])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp; out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); out[2] = 0;
    }
}

/* Chat templates written into synthetic models, so chat commands render the
 * model's own template as they would for a real one. */
static const char llama_template[] =
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}";
/* DeepSeek-V3's turn markers, without its tool and thinking branches. */
static const char deepseek_template[] =
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{- m['content'] -}}"
    "{%- elif m['role'] == 'user' -%}{{- '<\xef\xbd\x9cUser\xef\xbd\x9c>' + m['content'] -}}"
    "{%- else -%}{{- '<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>' + m['content'] + eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>' -}}{%- endif -%}";
static const char chatml_template[] =
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}";

/* Merges of a small English-like BPE: space+letter, common letter pairs,
 * then space+pair.  Each merge's parts are tokens already in the list. */
static int build_merges(char **tok, int first, int limit, char **merges, int *n_merges)
{
    static const char letters[] = "etaoinshrdlucmfwypvbgkjqxz";
    static const char *pairs[] = { "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd",
                                   "ti", "es", "or", "te", "of", "ed", "is", "it", "al", "ar",
                                   "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
                                   "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea" };
    const char *sp = "\xc4\xa0";          /* U+0120, GPT-2's symbol for a space */
    int n = 0, id = first;
    char left[16], right[16], merged[40];
    for (int stage = 0; stage < 3; stage++) {
        int count = stage == 0 ? 26 : 40;
        for (int k = 0; k < count && id < limit; k++) {
            if (stage == 0) {
                snprintf(left, sizeof left, "%s", sp);
                snprintf(right, sizeof right, "%c", letters[k]);
            } else if (stage == 1) {
                snprintf(left, sizeof left, "%c", pairs[k][0]);
                snprintf(right, sizeof right, "%c", pairs[k][1]);
            } else {
                snprintf(left, sizeof left, "%s%c", sp, pairs[k][0]);
                snprintf(right, sizeof right, "%c", pairs[k][1]);
            }
            snprintf(merged, sizeof merged, "%s%s", left, right);
            char buf[40];
            snprintf(buf, sizeof buf, "%s %s", left, right);
            rc_free(tok[id]);
            if (!(tok[id] = rc_strdup(merged)) || !(merges[n] = rc_strdup(buf)))
                return RC_ENOMEM;
            n++;
            id++;
        }
    }
    *n_merges = n;
    return 0;
}

static int write_vocab(gguf_writer *w, const synth_params *p)
{
    const int V = p->n_vocab;
    int rc = RC_ENOMEM, n_merges = 0;
    bool qwen = strncmp(p->arch, "qwen", 4) == 0, ds = !strcmp(p->arch, "deepseek2");
    static const char *ll[] = { "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                "<|end_header_id|>", "<|eot_id|>" };
    static const char *qw[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
    static const char *dsk[] = { "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                 "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                 "<\xef\xbd\x9cUser\xef\xbd\x9c>", "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>" };
    const char **special = ds ? dsk : qwen ? qw : ll;
    const int n_special = ds ? 4 : qwen ? 3 : 5;
    char **tok = rc_calloc((size_t)V, sizeof *tok);
    char **merges = rc_calloc(256, sizeof *merges);
    int32_t *types = rc_calloc((size_t)V, sizeof *types);
    if (!tok || !types || !merges)
        goto done;
    for (int i = 0; i < V; i++) {
        char buf[32];
        if (i < 256) {
            byte_symbol(i, buf);
            types[i] = 1;
        } else if (i >= V - n_special) {
            snprintf(buf, sizeof buf, "%s", special[i - (V - n_special)]);
            types[i] = 3;
        } else {
            snprintf(buf, sizeof buf, "<|filler_%d|>", i);
            types[i] = 5;   /* unused */
        }
        if (!(tok[i] = rc_strdup(buf)))
            goto done;
    }
    if ((rc = build_merges(tok, 256, V - n_special, merges, &n_merges)))
        goto done;
    for (int i = 256; i < 256 + n_merges; i++)
        types[i] = 1;
    int32_t bos = ds ? V - 4 : qwen ? V - 3 : V - 5, eos = ds ? V - 3 : qwen ? V - 1 : V - 4;
    if (p->pooling)
        eos = bos;                  /* <|endoftext|>, as in Qwen3-Embedding */
    if ((rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (rc = gguf_writer_set_str(w, "tokenizer.ggml.pre",
                                  ds ? "deepseek-v3" : qwen ? "qwen2" : "llama-bpe")) ||
        (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)V)) ||
        (rc = gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)V)) ||
        (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                                      (uint64_t)n_merges)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos)) ||
        (rc = gguf_writer_set_str(w, "tokenizer.chat_template",
                                  ds ? deepseek_template : qwen ? chatml_template : llama_template)))
        goto done;
    if (!qwen && !ds && (rc = gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)(V - 1))))
        goto done;
    /* Qwen3-Embedding's tokenizer ends every input with <|endoftext|>,
     * whose hidden state last pooling takes. */
    if (p->pooling &&
        ((rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false)) ||
         (rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true))))
        goto done;
    rc = 0;
done:
    if (tok)
        for (int i = 0; i < V; i++)
            rc_free(tok[i]);
    if (merges)
        for (int i = 0; i < 256; i++)
            rc_free(merges[i]);
    rc_free(tok);
    rc_free(merges);
    rc_free(types);
    return rc ? (rc == RC_ENOMEM ? rc_fail(rc, "out of memory writing a vocabulary") : rc) : 0;
}

/* The metadata of a deepseek2 file, as llama.cpp's converter writes it:
 * the plain key/value lengths and head_count_kv describe llama.cpp's
 * compressed cache, the *_mla keys the heads. */
static int write_deepseek2_keys(gguf_writer *w, const synth_params *p)
{
    char key[128];
    const int Dr = p->rope_dim, Dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    int rc;
#define SETU(suffix, v) (snprintf(key, sizeof key, "deepseek2." suffix), gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define SETF(suffix, v) (snprintf(key, sizeof key, "deepseek2." suffix), gguf_writer_set_f32(w, key, (v)))
    /* Files with the older unsplit attn_kv_b predate the *_mla keys: their
     * plain keys are the heads' sizes. */
    if (p->unsplit_kv_b) {
        if ((rc = SETU("attention.head_count_kv", p->n_head)) ||
            (rc = SETU("attention.key_length", p->head_dim)) ||
            (rc = SETU("attention.value_length", Dv)))
            return rc;
    } else if ((rc = SETU("attention.head_count_kv", 1)) ||
               (rc = SETU("attention.key_length", p->kv_lora_rank + Dr)) ||
               (rc = SETU("attention.value_length", p->kv_lora_rank)) ||
               (rc = SETU("attention.key_length_mla", p->head_dim)) ||
               (rc = SETU("attention.value_length_mla", Dv))) {
        return rc;
    }
    if ((rc = SETU("attention.kv_lora_rank", p->kv_lora_rank)) ||
        (rc = SETU("attention.q_lora_rank", p->q_lora_rank)) ||
        (rc = SETU("rope.dimension_count", Dr)) ||
        (rc = SETU("leading_dense_block_count", p->n_dense_lead)) ||
        (rc = SETU("expert_shared_count", p->n_expert_shared)) ||
        (rc = SETU("expert_gating_func", p->gating ? p->gating : 1)) ||
        (rc = SETF("expert_weights_scale", p->expert_weights_scale)) ||
        (rc = (snprintf(key, sizeof key, "deepseek2.expert_weights_norm"),
               gguf_writer_set_bool(w, key, p->expert_weights_norm))))
        return rc;
    if (p->n_expert_group > 1 &&
        ((rc = SETU("expert_group_count", p->n_expert_group)) ||
         (rc = SETU("expert_group_used_count", p->n_expert_group_used))))
        return rc;
    if (p->n_dense_lead && (rc = SETU("feed_forward_length", p->n_ff)))
        return rc;
    if (p->yarn_factor > 0 &&
        ((rc = (snprintf(key, sizeof key, "deepseek2.rope.scaling.type"),
                gguf_writer_set_str(w, key, "yarn"))) ||
         (rc = SETF("rope.scaling.factor", p->yarn_factor)) ||
         (rc = SETU("rope.scaling.original_context_length", p->yarn_orig_ctx)) ||
         (rc = SETF("rope.scaling.yarn_log_multiplier", p->yarn_log_mul))))
        return rc;
#undef SETU
#undef SETF
    return 0;
}

/* Plans the tensors and sets the metadata of `p` into a new writer. */
static int prepare(synth_ctx *c, gguf_writer **out)
{
    const synth_params *p = c->p;
    gguf_writer *w = NULL;
    int rc, cap = 16 + p->n_layer * 24;
    char key[128];
    *out = NULL;
    if (p->n_vocab < 300 || p->n_embd <= 0 || p->n_layer <= 0 || p->n_head <= 0 ||
        p->n_head_kv <= 0 || p->n_head % p->n_head_kv)
        return rc_fail(RC_EINVAL, "synthetic model: inconsistent shape (vocab >= 300, heads divisible)");
    if (!strcmp(p->arch, "deepseek2") &&
        (p->kv_lora_rank <= 0 || p->rope_dim <= 0 || p->rope_dim >= p->head_dim ||
         p->n_expert <= 0 || p->n_dense_lead > p->n_layer))
        return rc_fail(RC_EINVAL, "synthetic model: deepseek2 needs kv_lora_rank, rope dims "
                       "below the head width, and experts");
    if (!(c->t = rc_calloc((size_t)cap, sizeof *c->t)) || !(w = gguf_writer_new()))
        return rc_fail(RC_ENOMEM, "out of memory writing a synthetic model");
    if ((rc = plan(c, cap)))
        goto fail;
    const char *a = p->arch;
    const bool mla = !strcmp(a, "deepseek2");
    int D = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
#define SETU(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define SETF(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_f32(w, key, (v)))
    if ((rc = gguf_writer_set_str(w, "general.architecture", a)) ||
        (rc = gguf_writer_set_str(w, "general.name", "racimo synthetic")) ||
        (rc = SETU("context_length", p->n_ctx)) ||
        (rc = SETU("embedding_length", p->n_embd)) ||
        (rc = SETU("block_count", p->n_layer)) ||
        (rc = SETU("attention.head_count", p->n_head)) ||
        (rc = SETU("vocab_size", p->n_vocab)) ||
        (rc = SETF("rope.freq_base", p->rope_base)) ||
        (rc = SETF("attention.layer_norm_rms_epsilon", p->rms_eps)))
        goto fail;
    if (mla) {
        if ((rc = write_deepseek2_keys(w, p)))
            goto fail;
    } else if ((rc = SETU("attention.head_count_kv", p->n_head_kv)) ||
               (rc = SETU("attention.key_length", D)) ||
               (rc = SETU("attention.value_length", D)) ||
               (rc = SETU("rope.dimension_count", D))) {
        goto fail;
    }
    if (p->n_expert > 0) {
        if ((rc = SETU("expert_count", p->n_expert)) ||
            (rc = SETU("expert_used_count", p->n_expert_used)) ||
            (rc = SETU("expert_feed_forward_length", p->n_ff_exp)))
            goto fail;
    } else if ((rc = SETU("feed_forward_length", p->n_ff))) {
        goto fail;
    }
    if (p->pooling && (rc = SETU("pooling_type", p->pooling)))
        goto fail;
#undef SETU
#undef SETF
    if ((rc = write_vocab(w, p)))
        goto fail;
    for (int i = 0; i < c->n; i++)
        if ((rc = gguf_writer_add_tensor(w, c->t[i].name, (uint32_t)c->t[i].type,
                                         (uint32_t)c->t[i].n_dims, c->t[i].ne)))
            goto fail;
    *out = w;
    return 0;
fail:
    gguf_writer_free(w);
    return rc;
}

int synth_write(const char *path, const synth_params *p)
{
    synth_ctx c = { .p = p };
    gguf_writer *w = NULL;
    int rc = prepare(&c, &w);
    int64_t widest = 1;
    for (int i = 0; i < c.n; i++)
        widest = c.t[i].ne[0] > widest ? c.t[i].ne[0] : widest;
    if (!rc && (!(c.row = rc_mallocarray((size_t)widest * CHUNK_ROWS, sizeof(float))) ||
                !(c.pool = pool_new(os_n_cpus()))))
        rc = rc_fail(RC_ENOMEM, "out of memory writing a synthetic model");
    if (!rc)
        rc = gguf_writer_write(w, path, fill, &c);
    pool_free(c.pool);
    gguf_writer_free(w);
    rc_free(c.t);
    rc_free(c.row);
    return rc;
}

int synth_write_head(const char *path, const synth_params *p)
{
    synth_ctx c = { .p = p };
    gguf_writer *w = NULL;
    int rc = prepare(&c, &w);
    if (!rc && !(rc = gguf_writer_set_bool(w, "racimo.no_weights", true)))
        rc = gguf_writer_write_head(w, path);
    gguf_writer_free(w);
    rc_free(c.t);
    return rc;
}
