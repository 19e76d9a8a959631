/* kv_cache.c - per-sequence slots of keys and values, f32, f16 or q8_0. */
#include "kv_cache.h"
#include "base/err.h"
#include "base/mem.h"

#include <string.h>

#include "tensor/kv_types.h"

int kv_cache_init(kv_cache *kv, int n_layer, int n_seq, int n_ctx, int n_head, int k_dim,
                  int v_dim, int type)
{
    memset(kv, 0, sizeof *kv);
    if (!kv_type_ok(type))
        return rc_fail(RC_EINVAL, "KV cache: type %d is not " KV_TYPE_NAMES, type);
    if (n_layer <= 0 || n_seq <= 0 || n_ctx <= 0 || n_head <= 0 || k_dim <= 0 || v_dim < 0)
        return rc_fail(RC_EINVAL, "KV cache: layers %d, sequences %d, context %d, heads %d, "
                       "widths %d/%d must be positive", n_layer, n_seq, n_ctx, n_head, k_dim, v_dim);
    const size_t k_width = (size_t)n_head * kv_row_bytes(type, (size_t)k_dim),
                 v_width = (size_t)n_head * kv_row_bytes(type, (size_t)v_dim);
    size_t per_pos = k_width + v_width, n;
    if (rc_mul_size((size_t)n_layer * (size_t)n_seq, (size_t)n_ctx, &n) ||
        rc_mul_size(n, per_pos, &per_pos))
        return rc_fail(RC_ENOMEM, "KV cache size overflows");
    kv->n_layer = n_layer;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_head = n_head;
    kv->k_dim = k_dim;
    kv->v_dim = v_dim;
    kv->type = type;
    kv->k_row = kv_row_bytes(type, (size_t)k_dim);
    kv->v_row = kv_row_bytes(type, (size_t)v_dim);
    kv->k = rc_malloc_aligned(64, n * k_width);
    kv->v = v_width ? rc_malloc_aligned(64, n * v_width) : NULL;
    kv->len = rc_calloc((size_t)n_seq, sizeof(int));
    if (!kv->k || (v_width && !kv->v) || !kv->len) {
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
    for (int l = 0; l < kv->n_layer; l++)
        for (int h = 0; h < kv->n_head; h++) {
            memcpy(kv_k(kv, l, dst, h), kv_k(kv, l, src, h), (size_t)n * kv->k_row);
            if (kv->v_dim)
                memcpy(kv_v(kv, l, dst, h), kv_v(kv, l, src, h), (size_t)n * kv->v_row);
        }
    kv->len[dst] = n;
}

void kv_cache_store(kv_cache *kv, int layer, int seq, int pos, const float *k, const float *v)
{
    for (int h = 0; h < kv->n_head; h++) {
        kv_row_from_float(kv->type, k + (size_t)h * kv->k_dim,
                          (uint8_t *)kv_k(kv, layer, seq, h) + (size_t)pos * kv->k_row, kv->k_dim);
        if (kv->v_dim)
            kv_row_from_float(kv->type, v + (size_t)h * kv->v_dim,
                              (uint8_t *)kv_v(kv, layer, seq, h) + (size_t)pos * kv->v_row,
                              kv->v_dim);
    }
}

size_t kv_cache_bytes(const kv_cache *kv)
{
    return (size_t)kv->n_layer * kv->n_seq * kv->n_ctx * kv->n_head * (kv->k_row + kv->v_row);
}
