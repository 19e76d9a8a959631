/* model_size.h - how many bytes each part of a GGUF model takes, from the
 * tensor infos alone (nothing mapped or read), for placement: which layer
 * range fits on which node.
 *
 * Parts: each block's tensors (blk.N.*), the token embedding, the output
 * (output.weight + output_norm.weight; with tied embeddings only the norm,
 * and the last stage also maps the embedding), and the tensors every stage
 * maps (rope_freqs.weight and anything not named above).  The parts add up
 * to the sum of all tensor sizes.
 */
#ifndef RC_MODEL_SIZE_H
#define RC_MODEL_SIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"

typedef struct {
    int n_layer, n_embd;
    uint64_t *layer_bytes;        /* [n_layer] bytes of blk.N.* */
    uint64_t *layer_decode_bytes; /* [n_layer] bytes read per generated token: as
                                     layer_bytes, but only the share of experts used
                                     (MoE) */
    uint64_t embd_bytes;          /* token_embd.weight */
    uint64_t output_bytes;        /* output.weight + output_norm.weight; just the norm
                                     when tied (the last stage then also maps embd_bytes) */
    uint64_t shared_bytes;        /* tensors every stage maps (rope_freqs.weight...) */
    bool tied;                    /* no output.weight: the embedding is the output */
    uint64_t kv_bytes_per_token;  /* per layer: K and V rows of kv_type, as kv_cache stores */
    int kv_type;                  /* the cache's element type (tensor/kv_types.h):
                                     KV_TYPE_DEFAULT unless model_sizes_set_kv_type */
    int kv_heads, kv_k_dim, kv_v_dim;   /* per layer and position: rows of K and V */
    uint64_t n_params;            /* elements of all tensors */
    uint64_t total_bytes;         /* all tensors */
    uint32_t tp_ways;             /* bit k set: the model can be cut into k tensor-parallel
                                     shards (model_shard_ways); 0: not known */
    /* What tensor-parallel shards do not cut (model.h, model_shard): */
    uint32_t tp_attn_whole;       /* bit k: with k shards every shard runs every head */
    uint32_t tp_ffn_whole;        /* bit k: ... and the whole dense FFN */
    uint64_t ffn_bytes;           /* all layers' dense FFN tensors */
    uint64_t attn_bytes;          /* all layers' per-head attention tensors (cut by heads,
                                     or on every shard when they run every head) */
    uint64_t replicated_bytes;    /* all layers' tensors every shard holds whole: norms,
                                     latent projections, routers */
    bool kv_whole;                /* latent attention: every shard caches the whole latent */
} model_sizes;

/* Fills *out from an open file (hyperparameters and tensor infos only).
 * RC_EFORMAT/RC_EUNSUPPORTED as model_read_hparams, or when a blk.N tensor
 * names a block beyond the block count, or token_embd.weight is missing;
 * RC_ENOMEM.  Free with model_sizes_free (also after a failure). */
int model_sizes_read(const gguf_file *f, model_sizes *out);

void model_sizes_free(model_sizes *ms);            /* accepts zeroed sizes */

/* Counts the KV cache in elements of `type` (TT_F32, TT_F16 or TT_Q8_0):
 * sets kv_type and kv_bytes_per_token.  RC_EINVAL for another type. */
int model_sizes_set_kv_type(model_sizes *ms, int type);

/* Bytes a stage holding layers [first, last) maps: its blocks, the shared
 * tensors, the embedding when first == 0, the output when last == n_layer
 * (plus the embedding when tied, unless first == 0 already counted it). */
uint64_t model_sizes_stage_bytes(const model_sizes *ms, int first, int last);

/* Bytes such a stage reads per generated token: its blocks' decode bytes
 * and the output matrix on the last stage (one embedding row on the first,
 * negligible, is left out). */
uint64_t model_sizes_stage_decode_bytes(const model_sizes *ms, int first, int last);

/* The tensor type (enum tensor_type) holding the most bytes among the
 * matrices (2 dimensions or more): what a listing calls the model's
 * quantisation (Q4_K, Q8_0...).  TT_F32 for a file without matrices. */
int model_main_type(const gguf_file *f);

/* KV cache bytes of layers [first, last) for `tokens` positions in all. */
uint64_t model_sizes_kv_bytes(const model_sizes *ms, int first, int last, uint64_t tokens);

#endif
