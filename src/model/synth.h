/* synth.h - synthetic models: GGUF files with random weights at any shape,
 * for tests and benchmarks (random weights cost the same time as trained
 * ones).  Written with the project's own GGUF writer and quantisers.
 */
#ifndef RC_SYNTH_H
#define RC_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *arch;        /* "llama", "qwen2", "qwen3", "qwen3moe" */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv;
    int head_dim;            /* 0 = n_embd / n_head */
    int n_ff;                /* dense FFN width */
    int n_expert, n_expert_used, n_ff_exp;   /* qwen3moe, deepseek2 */
    /* deepseek2: latent attention (head_dim is nope + rope there) and its MoE */
    int rope_dim;            /* rotated dims per head; 0 = head_dim */
    int head_dim_v;          /* 0 = head_dim */
    int q_lora_rank;         /* 0: a plain attn_q */
    int kv_lora_rank;
    bool unsplit_kv_b;       /* write the older attn_kv_b instead of attn_k_b/attn_v_b */
    int n_dense_lead;        /* leading layers with a dense FFN (n_ff wide) */
    int n_expert_shared;
    int n_expert_group, n_expert_group_used;
    int gating;              /* 1 softmax, 2 sigmoid */
    bool expert_weights_norm;
    float expert_weights_scale;
    bool expert_bias;        /* exp_probs_b.bias per MoE layer */
    float yarn_factor;       /* 0: no rope scaling */
    int yarn_orig_ctx;
    float yarn_log_mul;
    int n_ctx;               /* context_length metadata */
    float rope_base, rms_eps;
    bool tied;               /* no output.weight: the embedding is reused */
    bool rope_freqs;         /* write a Llama-3.1-style rope_freqs tensor */
    int pooling;             /* > 0: an embedding model (ARCH.pooling_type:
                                1 mean, 2 cls, 3 last); its tokenizer appends
                                <|endoftext|> as Qwen3-Embedding's does */
    int type;                /* weight type of every matrix (enum tensor_type) */
    const char *mix;         /* NULL, or "Q4_K_M": llama-quantize's mix */
    uint64_t seed;
} synth_params;

/* Fills *p with a named preset: "tiny" (llama, 2 layers, 256 wide),
 * "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-embed" (tiny-qwen3 as an embedding
 * model, last pooling), "tiny-qwen3-embed-mean", "tiny-qwen3moe", "llama3-1b" (Llama-3.2-1B
 * shape), "qwen2.5-0.5b", "llama3-8b".  Weights default to F32.
 * RC_ENOTFOUND for an unknown name. */
int synth_preset(const char *name, synth_params *p);

/* Lists the preset names, comma-separated, for help texts. */
const char *synth_preset_names(void);

/* Writes the model to `path`.  The same parameters give the same bytes. */
int synth_write(const char *path, const synth_params *p);

/* Writes the file's head (metadata and tensor infos) and leaves the data
 * section a hole of the right size (a sparse file): for planning with the
 * real shapes of a model too large to write.  The file says so
 * (racimo.no_weights), and model_load refuses it. */
int synth_write_head(const char *path, const synth_params *p);

#endif
