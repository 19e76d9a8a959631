/* mla_split.c - older deepseek2 files' unsplit attn_kv_b, split at load.
 *
 * attn_kv_b {R, H*(Dn+Dv)} maps the latent c to every head's k_nope (Dn
 * rows) then value (Dv rows).  The forward pass works in the absorbed form
 * (the cache holds c; a query is taken into the latent space once), which
 * needs each head's k rows transposed: wk_b {Dn, R, H}, as current
 * conversions store it.  Transposing exact types (F32, F16, BF16) permutes
 * the values; a block-quantised source is decoded and stored as F16 (its
 * k part, 2 bytes per value: 16 MiB per layer for DeepSeek-V3's shapes).
 * The value rows are copied as they are into wv_b {R, Dv, H}.
 */
#include "shard.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/types.h"

#include <string.h>

static int split_layer(model *m, layer_weights *L)
{
    const model_hparams *hp = &m->hp;
    const int64_t H = hp->n_head, Dv = hp->head_dim_v, Dn = hp->head_dim - hp->rope_dim,
                  R = hp->kv_lora_rank;
    const tensor *kv = &L->wkv_b;
    const tensor_traits *src = tensor_type_traits(kv->type);
    const int kt = kv->type == TT_F32 || kv->type == TT_F16 || kv->type == TT_BF16 ? kv->type
                                                                                   : TT_F16;
    const tensor_traits *dst = tensor_type_traits(kt);
    const size_t k_row = tensor_row_bytes(kt, Dn);
    uint8_t *k = model_own(m, k_row * (size_t)(R * H), kv->name);
    uint8_t *v = k ? model_own(m, kv->row_bytes * (size_t)(Dv * H), kv->name) : NULL;
    float *rows = rc_mallocarray((size_t)(Dn * R), sizeof(float));
    float *col = rc_mallocarray((size_t)Dn, sizeof(float));
    if (!k || !v || !rows || !col) {
        rc_free(rows);
        rc_free(col);
        return rc_fail(RC_ENOMEM, "out of memory splitting %s", kv->name);
    }
    for (int64_t j = 0; j < H; j++) {
        const uint8_t *head = (const uint8_t *)kv->data + (size_t)(j * (Dn + Dv)) * kv->row_bytes;
        for (int64_t d = 0; d < Dn; d++)
            src->to_float(head + (size_t)d * kv->row_bytes, rows + d * R, R);
        for (int64_t r = 0; r < R; r++) {
            for (int64_t d = 0; d < Dn; d++)
                col[d] = rows[d * R + r];
            dst->from_float(col, k + (size_t)(j * R + r) * k_row, Dn);
        }
        memcpy(v + (size_t)(j * Dv) * kv->row_bytes, head + (size_t)Dn * kv->row_bytes,
               (size_t)Dv * kv->row_bytes);
    }
    rc_free(rows);
    rc_free(col);
    L->wk_b = (tensor){ .data = k, .type = kt, .n_dims = 3, .ne = { Dn, R, H, 1 },
                        .row_bytes = k_row, .name = kv->name };
    L->wv_b = (tensor){ .data = v, .type = kv->type, .n_dims = 3, .ne = { R, Dv, H, 1 },
                        .row_bytes = kv->row_bytes, .name = kv->name };
    size_t mapped = kv->row_bytes * (size_t)kv->ne[1];
    m->weight_bytes += k_row * (size_t)(R * H) + kv->row_bytes * (size_t)(Dv * H) - mapped;
    os_mem_drop(kv->data, mapped);
    memset(&L->wkv_b, 0, sizeof L->wkv_b);
    return 0;
}

int model_split_kv_b(model *m)
{
    for (int l = 0; l < m->last - m->first; l++) {
        layer_weights *L = &m->layers[l];
        int rc = L->wkv_b.data ? split_layer(m, L) : 0;
        if (rc)
            return rc;
    }
    return 0;
}
