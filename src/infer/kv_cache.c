/* kv_cache.c - per-sequence slots of keys and values, f32 or f16. */
#include "kv_cache.h"
#include "base/err.h"
#include "base/mem.h"

#include <string.h>

#include "tensor/types.h"

int kv_cache_init(kv_cache *kv, int n_layer, int n_seq, int n_ctx, int n_head, int k_dim,
                  int v_dim, int type)
{
    memset(kv, 0, sizeof *kv);
    if (type != TT_F32 && type != TT_F16)
        return rc_fail(RC_EINVAL, "KV cache: type %d is neither f32 nor f16", type);
    if (n_layer <= 0 || n_seq <= 0 || n_ctx <= 0 || n_head <= 0 || k_dim <= 0 || v_dim < 0)
        return rc_fail(RC_EINVAL, "KV cache: layers %d, sequences %d, context %d, heads %d, "
                       "widths %d/%d must be positive", n_layer, n_seq, n_ctx, n_head, k_dim, v_dim);
    const size_t k_width = (size_t)n_head * k_dim, v_width = (size_t)n_head * v_dim;
    size_t per_pos = k_width + v_width, n;
    const size_t esize = type == TT_F16 ? sizeof(uint16_t) : sizeof(float);
    if (rc_mul_size((size_t)n_layer * (size_t)n_seq, (size_t)n_ctx, &n) ||
        rc_mul_size(n, per_pos * esize, &per_pos))
        return rc_fail(RC_ENOMEM, "KV cache size overflows");
    kv->n_layer = n_layer;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_head = n_head;
    kv->k_dim = k_dim;
    kv->v_dim = v_dim;
    kv->type = type;
    kv->esize = esize;
    kv->k = rc_malloc_aligned(64, n * k_width * esize);
    kv->v = v_width ? rc_malloc_aligned(64, n * v_width * esize) : NULL;
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
            memcpy(kv_k(kv, l, dst, h), kv_k(kv, l, src, h), (size_t)n * kv->k_dim * kv->esize);
            if (kv->v_dim)
                memcpy(kv_v(kv, l, dst, h), kv_v(kv, l, src, h), (size_t)n * kv->v_dim * kv->esize);
        }
    kv->len[dst] = n;
}

static void put(const kv_cache *kv, void *dst, const float *src, int n)
{
    if (kv->type == TT_F16)
        tensor_type_traits(TT_F16)->from_float(src, dst, n);
    else
        memcpy(dst, src, (size_t)n * sizeof(float));
}

void kv_cache_store(kv_cache *kv, int layer, int seq, int pos, const float *k, const float *v)
{
    for (int h = 0; h < kv->n_head; h++) {
        put(kv, (uint8_t *)kv_k(kv, layer, seq, h) + (size_t)pos * kv->k_dim * kv->esize,
            k + (size_t)h * kv->k_dim, kv->k_dim);
        if (kv->v_dim)
            put(kv, (uint8_t *)kv_v(kv, layer, seq, h) + (size_t)pos * kv->v_dim * kv->esize,
                v + (size_t)h * kv->v_dim, kv->v_dim);
    }
}

size_t kv_cache_bytes(const kv_cache *kv)
{
    return (size_t)kv->n_layer * kv->n_seq * kv->n_ctx * kv->n_head *
           ((size_t)kv->k_dim + kv->v_dim) * kv->esize;
}
