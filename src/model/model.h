/* model.h - a transformer model's hyperparameters and weight views, read
 * from a GGUF file, for a range of layers.
 *
 * model_load binds only the tensors the layer range [first, last) needs:
 * its blocks, plus the token embedding when first == 0 and the output norm
 * and output matrix when last == n_layer (the token embedding doubles as the
 * output when the file has no output.weight: tied embeddings).  Weights are
 * views into the file mapping (but see below).  Every tensor's presence,
 * shape and type is checked at load, so the forward pass never meets a
 * surprise; errors name the file and the tensor.  Q4_0 matrices are then
 * repacked into owned memory where the kernels have a layout for them
 * (model/repack.h; RACIMO_REPACK=0 keeps the views).
 */
#ifndef RC_MODEL_H
#define RC_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "tensor/tensor.h"

enum model_arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN3MOE, ARCH_DEEPSEEK2, ARCH_COUNT };

/* How a mixture-of-experts router turns its logits into expert weights. */
enum { GATING_SOFTMAX = 1, GATING_SIGMOID = 2 };

typedef struct {
    int   arch;                  /* enum model_arch */
    char  arch_name[32];         /* general.architecture */
    int   n_vocab;
    int   n_embd;
    int   n_layer;
    int   n_head, n_head_kv;     /* MLA: n_head_kv = n_head (each head's keys
                                    and values come out of the shared latent) */
    int   head_dim;              /* key/query width per head (MLA: nope + rope) */
    int   head_dim_v;            /* value width per head */
    int   n_ff;                  /* dense FFN width (0 for MoE-only) */
    int   n_expert, n_expert_used, n_ff_exp;
    bool  expert_weights_norm;   /* renormalise the chosen experts' weights */
    int   expert_gating;         /* GATING_SOFTMAX or GATING_SIGMOID */
    float expert_weights_scale;  /* multiplies the chosen experts' weights; 1 = none */
    int   n_expert_group;        /* > 1: experts are chosen from the best groups only */
    int   n_expert_group_used;
    int   n_expert_shared;       /* shared experts: one FFN n_expert_shared * n_ff_exp wide */
    int   n_layer_dense_lead;    /* MoE models: the first layers have a dense FFN */
    /* Multi-head latent attention (deepseek2); kv_lora_rank == 0 otherwise. */
    int   q_lora_rank;           /* 0: a plain attn_q instead of the low-rank pair */
    int   kv_lora_rank;          /* R: the latent the KV cache holds (with rope_dim) */
    float kq_scale;              /* attention score scale (1/sqrt(head_dim) unless YaRN) */
    float rope_attn_factor;      /* multiplies rope's cos and sin (YaRN); 1 = none */
    float yarn_factor;           /* YaRN context extension factor; 0 = no YaRN */
    int   yarn_orig_ctx;         /* the context YaRN's ramps are computed for */
    int   n_ctx_train;
    float rms_eps;
    float rope_base;
    float rope_freq_scale;       /* 1 / linear scaling factor; 1 = none */
    int   rope_dim;              /* rotated dims per head (<= head_dim) */
    bool  rope_neox;             /* pairs (i, i+d/2) instead of (2i, 2i+1) */
    bool  has_qkv_bias, has_qk_norm, tied_output;
    /* An embedding model (ARCH.pooling_type): the last stage pools the
     * normed hidden states instead of making logits.  llama.cpp's values. */
    int   pooling;               /* POOL_NONE: a generation model */
} model_hparams;

enum { POOL_NONE = 0, POOL_MEAN = 1, POOL_CLS = 2, POOL_LAST = 3 };
const char *model_pooling_name(int pooling);    /* "mean", "cls", "last", "none" */

/* The weights of one block.  Shapes use model_hparams names:
 * E = n_embd, H = n_head, Hk = n_head_kv, D = head_dim, Dv = head_dim_v,
 * F = n_ff, X = n_expert, Fx = n_ff_exp; shapes in GGUF order {ne0, ne1}. */
typedef struct {
    tensor attn_norm;   /* {E} f32 */
    tensor wq;          /* {E, H*D} */
    tensor wk;          /* {E, Hk*D} */
    tensor wv;          /* {E, Hk*Dv} */
    tensor wo;          /* {H*Dv, E} */
    tensor bq, bk, bv;  /* {H*D}, {Hk*D}, {Hk*Dv} f32 (qwen2) */
    tensor q_norm;      /* {D} f32 (qwen3) */
    tensor k_norm;      /* {D} f32 (qwen3) */
    tensor ffn_norm;    /* {E} f32 */
    tensor w_gate;      /* {E, F} */
    tensor w_up;        /* {E, F} */
    tensor w_down;      /* {F, E} */
    tensor gate_inp;    /* {E, X} router (MoE) */
    tensor gate_exps;   /* {E, Fx, X} */
    tensor up_exps;     /* {E, Fx, X} */
    tensor down_exps;   /* {Fx, E, X} */
    tensor exp_probs_b; /* {X} f32: added to the scores that choose experts only */
    tensor gate_shexp;  /* {E, Fs} shared experts, Fs = n_expert_shared * Fx */
    tensor up_shexp;    /* {E, Fs} */
    tensor down_shexp;  /* {Fs, E} */
    /* MLA (deepseek2), R = kv_lora_rank, Rq = q_lora_rank, Dr = rope_dim,
     * Dn = D - Dr.  wq is {E, H*D} when Rq == 0. */
    tensor wq_a;        /* {E, Rq} */
    tensor q_a_norm;    /* {Rq} f32 */
    tensor wq_b;        /* {Rq, H*D} */
    tensor wkv_a;       /* {E, R + Dr}: the latent, then the rope key all heads share */
    tensor kv_a_norm;   /* {R} f32 */
    tensor wk_b;        /* {Dn, R, H}: per head, q_nope -> latent space (absorbed keys) */
    tensor wv_b;        /* {R, Dv, H}: per head, attended latent -> value */
    tensor wkv_b;       /* {R, H*(Dn+Dv)}: older files' unsplit form; split into
                           wk_b and wv_b at load, then unbound */
} layer_weights;

/* The part of every held layer that one tensor-parallel shard computes:
 * its query heads (with their key/value heads and the matching columns of
 * the attention output), a range of dense FFN units (rows of gate and up,
 * columns of down), a range of the routed experts, whole (expert
 * parallelism), a range of the shared experts' FFN units, and a range of
 * output rows (logits).  Shards of one model sum their attention and FFN
 * outputs after every block; the whole model is shard 0 of 1.
 *
 * When the attention output cannot be cut between heads on its weight
 * type's blocks, every shard computes all heads (attn_whole) and the
 * attention needs no sum; the same for a dense FFN whose units do not fill
 * a block per shard (ffn_whole); when the shared experts cannot be cut on
 * their blocks, shard 0 runs them whole (the others hold none).  A model
 * of which nothing but the output would be cut is refused. */
typedef struct {
    int rank, n_ranks;
    int head0, n_head;         /* query heads [head0, head0 + n_head) */
    int kv0, n_head_kv;        /* key/value heads */
    bool attn_whole;           /* every shard runs every head: no sum after attention */
    bool ffn_whole;            /* every shard runs the whole dense FFN: no sum after it */
    int ff0, n_ff;             /* dense FFN units */
    int exp0, n_exp;           /* routed experts [exp0, exp0 + n_exp) */
    int sh0, n_sh;             /* shared-expert FFN units (n_sh 0: none here) */
    int vocab0, n_vocab;       /* output rows */
} model_shard;

/* The block sizes the cuts of a layer range must fall on: the weight types
 * of the attention output, the dense FFN down (0 when the range holds no
 * dense layer) and the shared experts' down (0 when it holds none). */
typedef struct { int o, ff, sh; } model_shard_align;

typedef struct {
    model_hparams hp;
    model_shard shard;
    gguf_file *file;
    int first, last;         /* layer range held: [first, last) */
    tensor tok_embd;         /* {E, n_vocab}; present when first == 0 or tied output */
    tensor output_norm;      /* {E} f32; present when last == n_layer */
    tensor output;           /* {E, n_vocab}; == tok_embd view when tied */
    tensor rope_freqs;       /* {rope_dim/2} f32 frequency divisors, optional */
    layer_weights *layers;   /* [last - first] */
    uint64_t weight_bytes;   /* bytes of all bound tensors (once each; a
                                shard's share of the sliced ones) */
    void **owned;            /* copies of column slices (shards), repacked tensors */
    int n_owned;
    int n_repacked;          /* Q4_0 matrices repacked at load (model/repack.h) */
    uint64_t repacked_bytes;
} model;

/* Reads hyperparameters from an open file; RC_EUNSUPPORTED for an unknown
 * architecture, RC_EFORMAT for missing or inconsistent keys. */
int model_read_hparams(const gguf_file *f, model_hparams *hp);

/* Opens `path` and binds the tensors of layers [first, last); last = -1
 * means n_layer.  Maps only the file's head and the bound tensors.  When a
 * manifest of verified ranges exists (model_ranges_path of `path`), or the
 * path ends in ".part", a tensor outside the verified ranges fails with
 * RC_ENOTFOUND and a detail naming the missing layers.  RC_ENOMEM when the
 * mappings do not fit the address space.  *out is freed with model_free. */
int model_load(const char *path, int first, int last, model **out);

/* Same on an already open file (gguf_open or gguf_open_meta); the model
 * takes ownership of `f` (also on failure). */
int model_load_file(gguf_file *f, int first, int last, model **out);

/* Loads shard `rank` of `n_ranks` of layers [first, last) (last = -1:
 * n_layer) for tensor parallelism: row slices are views into the mapping;
 * column slices (attention output, FFN down) are copied, and the mapped
 * pages they came from leave the resident set; routed experts are whole
 * views.  RC_EINVAL with the reason when the model cannot be cut in
 * n_ranks (model_shard_plan).  n_ranks == 1 is model_load_file. */
int model_load_file_shard(gguf_file *f, int first, int last, int rank, int n_ranks,
                          model **out);
int model_load_shard(const char *path, int first, int last, int rank, int n_ranks,
                     model **out);

/* The numbers of tensor-parallel shards (2..31) the model in f can be cut
 * into, as bits (bit k: k shards): model_shard_plan accepts every rank. */
uint32_t model_shard_ways(const gguf_file *f);

/* Of those, as bits, the shard counts whose shards each run every
 * attention head (model_shard.attn_whole), and (ffn) the whole dense FFN. */
uint32_t model_shard_attn_whole(const gguf_file *f, uint32_t *ffn);

/* The byte ranges of the file that shard `rank` of `n_ranks` of layers
 * [first, last) reads (last = -1: n_layer), from the head alone: the
 * shard's rows of the row-cut tensors, the whole of the column-cut ones
 * (attn_output, ffn_down: every row holds a piece), its rows of the output,
 * the whole embedding table when first == 0, every other needed tensor
 * whole.  Calls range() for each (in file order per tensor); a nonzero
 * return stops and is returned.  Errors of model_shard_plan. */
int model_shard_ranges(const gguf_file *f, int first, int last, int rank, int n_ranks,
                       int (*range)(void *ud, uint64_t start, uint64_t end, const char *name),
                       void *ud);

/* The shard `rank` of `n_ranks` of a model with these hyperparameters,
 * with its cuts on the blocks of `align`.  RC_EINVAL with the reason when
 * the model cannot be cut in n_ranks (fewer experts than shards; a dense
 * model whose heads and FFN both cannot be cut on their blocks). */
int model_shard_plan(const model_hparams *hp, const model_shard_align *align, int rank,
                     int n_ranks, model_shard *out);

/* Flags in need[0..f->n_tensors) the tensors a model bound to layers
 * [first, last) reads (last = -1: n_layer): every "blk.<i>." tensor of its
 * layers, token_embd.weight when first == 0 or when the output is tied and
 * last == n_layer, output_norm and output when last == n_layer, and
 * rope_freqs.  RC_EINVAL for a range outside the model's layers; errors of
 * model_read_hparams. */
int model_tensor_needs(const gguf_file *f, int first, int last, bool *need);

void model_free(model *m);                       /* accepts NULL */

/* Bytes of weights read to generate one token with this layer range: every
 * matrix of the held layers (for MoE only the share of experts used per
 * token), the output matrix on the last stage, one embedding row on the
 * first.  Generation speed is bounded by memory bandwidth / this. */
uint64_t model_decode_bytes(const model *m);

const char *model_arch_name(int arch);

#endif
