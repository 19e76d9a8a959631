/* kv_cache.h - keys and values of past positions, per layer and sequence.
 *
 * Each sequence slot owns n_ctx positions in every layer of the stage:
 * K[layer][seq][pos][n_head_kv * head_dim] and likewise V, in f32.  A slot's
 * length is the number of leading positions written; a row at position p
 * may be written only when p <= length (no holes), and writing p truncates
 * the slot to p + 1 (so re-evaluating from an earlier position is allowed).
 */
#ifndef RC_KV_CACHE_H
#define RC_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_layer;           /* layers of this stage */
    int n_seq;             /* sequence slots */
    int n_ctx;             /* positions per slot */
    int k_width, v_width;  /* floats per position: n_head_kv * head_dim(_v) */
    float *k, *v;          /* [n_layer][n_seq][n_ctx][width] */
    int *len;              /* [n_seq] positions held */
} kv_cache;

/* Allocates the whole cache up front (the only large allocation besides
 * activations).  RC_ENOMEM with the size in the detail on failure. */
int  kv_cache_init(kv_cache *kv, int n_layer, int n_seq, int n_ctx, int k_width, int v_width);
void kv_cache_free(kv_cache *kv);                /* accepts zeroed cache */

static inline float *kv_k(const kv_cache *kv, int layer, int seq, int pos)
{
    return kv->k + (((size_t)layer * kv->n_seq + seq) * kv->n_ctx + pos) * kv->k_width;
}
static inline float *kv_v(const kv_cache *kv, int layer, int seq, int pos)
{
    return kv->v + (((size_t)layer * kv->n_seq + seq) * kv->n_ctx + pos) * kv->v_width;
}

/* Forgets positions >= from of a sequence (from = 0 clears it). */
void kv_cache_truncate(kv_cache *kv, int seq, int from);

/* Copies the first n positions of slot src into slot dst (prefix reuse). */
void kv_cache_copy(kv_cache *kv, int dst, int src, int n);

size_t kv_cache_bytes(const kv_cache *kv);

#endif
