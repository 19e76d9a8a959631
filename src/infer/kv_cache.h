/* kv_cache.h - keys and values of past positions, per layer and sequence.
 *
 * Each sequence slot owns n_ctx positions in every layer of the stage:
 * K[layer][seq][kv head][pos][head_dim] and likewise V, in f32, f16 (the
 * default, as llama.cpp's: half the memory and, at long context, half the
 * bytes attention reads per token) or q8_0 (a little over half of f16;
 * rows as tensor/kv_types.h lays them out).  Head-major,
 * so that attention, which reads one KV head over all positions, streams
 * contiguous memory (position-major, with a head's 256 bytes every 2 KiB,
 * measured ~1.5x slower at 4k positions: the stride defeats the caches).  A slot's
 * length is the number of leading positions written; a row at position p
 * may be written only when p <= length (no holes), and writing p truncates
 * the slot to p + 1 (so re-evaluating from an earlier position is allowed).
 *
 * v_dim may be 0: a cache of keys only, for attention whose values are a
 * prefix of its keys (latent attention keeps the latent c and the rope key
 * per position, and attends over c as the values).
 */
#ifndef RC_KV_CACHE_H
#define RC_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_layer;           /* layers of this stage */
    int n_seq;             /* sequence slots */
    int n_ctx;             /* positions per slot */
    int n_head;            /* KV heads */
    int k_dim, v_dim;      /* elements per head and position: head_dim(_v) */
    int type;              /* TT_F32, TT_F16 or TT_Q8_0 (tensor/kv_types.h) */
    size_t k_row, v_row;   /* bytes of one head's row at one position */
    void *k, *v;           /* [n_layer][n_seq][n_head][n_ctx][dim] */
    int *len;              /* [n_seq] positions held */
} kv_cache;

/* Allocates the whole cache up front (the only large allocation besides
 * activations).  RC_ENOMEM with the size in the detail on failure. */
int  kv_cache_init(kv_cache *kv, int n_layer, int n_seq, int n_ctx, int n_head, int k_dim,
                   int v_dim, int type);
void kv_cache_free(kv_cache *kv);                /* accepts zeroed cache */

/* Position 0 of one KV head of a slot; position p is p * k_row (v_row)
 * bytes further on. */
static inline void *kv_k(const kv_cache *kv, int layer, int seq, int head)
{
    return (uint8_t *)kv->k +
           ((((size_t)layer * kv->n_seq + seq) * kv->n_head + head) * kv->n_ctx) * kv->k_row;
}
static inline void *kv_v(const kv_cache *kv, int layer, int seq, int head)
{
    return (uint8_t *)kv->v +
           ((((size_t)layer * kv->n_seq + seq) * kv->n_head + head) * kv->n_ctx) * kv->v_row;
}

/* Writes one position of every head: k (n_head * k_dim floats, head after
 * head) and v likewise (unread when v_dim is 0), converted to the cache's
 * type. */
void kv_cache_store(kv_cache *kv, int layer, int seq, int pos, const float *k, const float *v);

/* Forgets positions >= from of a sequence (from = 0 clears it). */
void kv_cache_truncate(kv_cache *kv, int seq, int from);

/* Copies the first n positions of slot src into slot dst (prefix reuse). */
void kv_cache_copy(kv_cache *kv, int dst, int src, int n);

size_t kv_cache_bytes(const kv_cache *kv);

#endif
