/* kv_cache.c - per-sequence slots of f32 keys and values. */
#include "kv_cache.h"
#include "base/err.h"
#include "base/mem.h"

#include <string.h>

int kv_cache_init(kv_cache *kv, int n_layer, int n_seq, int n_ctx, int k_width, int v_width)
{
    size_t per_pos = (size_t)k_width + (size_t)v_width, n;
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_seq <= 0 || n_ctx <= 0 || k_width <= 0 || v_width <= 0)
        return rc_fail(RC_EINVAL, "KV cache: layers %d, sequences %d, context %d must be positive",
                       n_layer, n_seq, n_ctx);
    if (rc_mul_size((size_t)n_layer * (size_t)n_seq, (size_t)n_ctx, &n) ||
        rc_mul_size(n, per_pos * sizeof(float), &per_pos))
        return rc_fail(RC_ENOMEM, "KV cache size overflows");
    kv->n_layer = n_layer;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->k_width = k_width;
    kv->v_width = v_width;
    kv->k = rc_malloc_aligned(64, n * (size_t)k_width * sizeof(float));
    kv->v = rc_malloc_aligned(64, n * (size_t)v_width * sizeof(float));
    kv->len = rc_calloc((size_t)n_seq, sizeof(int));
    if (!kv->k || !kv->v || !kv->len) {
        kv_cache_free(kv);
        return rc_fail(RC_ENOMEM, "out of memory for a KV cache of %zu MiB (%d sequences x %d positions)",
                       per_pos >> 20, n_seq, n_ctx);
    }
    return 0;
}

void kv_cache_free(kv_cache *kv)
{
    if (!kv)
        return;
    rc_free_aligned(kv->k);
    rc_free_aligned(kv->v);
    rc_free(kv->len);
    memset(kv, 0, sizeof *kv);
}

void kv_cache_truncate(kv_cache *kv, int seq, int from)
{
    if (seq >= 0 && seq < kv->n_seq && from >= 0 && from < kv->len[seq])
        kv->len[seq] = from;
}

void kv_cache_copy(kv_cache *kv, int dst, int src, int n)
{
    if (dst == src || n <= 0)
        return;
    if (n > kv->len[src])
        n = kv->len[src];
    for (int l = 0; l < kv->n_layer; l++) {
        memcpy(kv_k(kv, l, dst, 0), kv_k(kv, l, src, 0), (size_t)n * kv->k_width * sizeof(float));
        memcpy(kv_v(kv, l, dst, 0), kv_v(kv, l, src, 0), (size_t)n * kv->v_width * sizeof(float));
    }
    kv->len[dst] = n;
}

size_t kv_cache_bytes(const kv_cache *kv)
{
    return (size_t)kv->n_layer * kv->n_seq * kv->n_ctx *
           ((size_t)kv->k_width + kv->v_width) * sizeof(float);
}
