/* model.h - a transformer model's hyperparameters and weight views, read
 * from a GGUF file, for a range of layers.
 *
 * model_load binds only the tensors the layer range [first, last) needs:
 * its blocks, plus the token embedding when first == 0 and the output norm
 * and output matrix when last == n_layer (the token embedding doubles as the
 * output when the file has no output.weight: tied embeddings).  Weights are
 * views into the file mapping; nothing is copied.  Every tensor's presence,
 * shape and type is checked at load, so the forward pass never meets a
 * surprise; errors name the file and the tensor.
 */
#ifndef RC_MODEL_H
#define RC_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "tensor/tensor.h"

enum model_arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN3MOE, ARCH_COUNT };

typedef struct {
    int   arch;                  /* enum model_arch */
    char  arch_name[32];         /* general.architecture */
    int   n_vocab;
    int   n_embd;
    int   n_layer;
    int   n_head, n_head_kv;
    int   head_dim;              /* key/query width per head */
    int   head_dim_v;            /* value width per head */
    int   n_ff;                  /* dense FFN width (0 for MoE-only) */
    int   n_expert, n_expert_used, n_ff_exp;
    bool  expert_weights_norm;   /* renormalise the chosen experts' weights */
    int   n_ctx_train;
    float rms_eps;
    float rope_base;
    float rope_freq_scale;       /* 1 / linear scaling factor; 1 = none */
    int   rope_dim;              /* rotated dims per head (<= head_dim) */
    bool  rope_neox;             /* pairs (i, i+d/2) instead of (2i, 2i+1) */
    bool  has_qkv_bias, has_qk_norm, tied_output;
} model_hparams;

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
} layer_weights;

/* The part of every held layer that one tensor-parallel shard computes:
 * its query heads (with their key/value heads and the matching columns of
 * the attention output), a range of FFN units (rows of gate and up, columns
 * of down) and a range of output rows (logits).  Shards of one model sum
 * their attention and FFN outputs after every block; the whole model is
 * shard 0 of 1. */
typedef struct {
    int rank, n_ranks;
    int head0, n_head;         /* query heads [head0, head0 + n_head) */
    int kv0, n_head_kv;        /* key/value heads */
    int ff0, n_ff;             /* FFN units */
    int vocab0, n_vocab;       /* output rows */
} model_shard;

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
    void **owned;            /* copies of column slices (shards) */
    int n_owned;
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
 * pages they came from leave the resident set.  Dense models only (MoE:
 * RC_EUNSUPPORTED); RC_EINVAL with the reason when the model cannot be cut
 * in n_ranks (fewer key/value heads than ranks, a cut inside a quantised
 * block).  n_ranks == 1 is model_load_file. */
int model_load_file_shard(gguf_file *f, int first, int last, int rank, int n_ranks,
                          model **out);
int model_load_shard(const char *path, int first, int last, int rank, int n_ranks,
                     model **out);

/* The numbers of tensor-parallel shards (2..31) the model in f can be cut
 * into, as bits (bit k: k shards): every rank's cut falls on the weight
 * types' blocks and takes whole key/value heads (model_shard_plan). */
uint32_t model_shard_ways(const gguf_file *f);

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
 * with FFN cuts on multiples of `ff_align` (the block size of ffn_down's
 * type) and head cuts checked against `o_align` (attn_output's block
 * size).  RC_EINVAL with the reason when it cannot be cut. */
int model_shard_plan(const model_hparams *hp, int ff_align, int o_align, int rank,
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
