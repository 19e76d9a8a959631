/* repack.c - the reference (scalar) Q4_0 <-> Q4_0_R8 conversions and the
 * R8 entry of the reference table (repack.h).  The reference table has no
 * R8 tile kernel, so with RACIMO_KERNELS=ref nothing is repacked. */
#include "tensor/repack.h"
#include "tensor/q4k_r8.h"
#include "tensor/q6k_r8.h"
#include "tensor/q8_0_r8.h"

#include <string.h>

#include "tensor/quant_ref.h"
#include "tensor/types.h"

/* Computes only through vec_dot_tile, which an instruction-set file
 * installs: no to_float, dot_f32 or vec_dot on a single row (a row's bytes
 * are spread over its group), so tensor_type_supported says no and no file
 * or caller can ask for it by name. */
const tensor_traits tensor__ref_q4_0_r8 = {
    .name = "Q4_0_R8", .block_size = QK4_0, .block_bytes = sizeof(block_q4_0),
    .vec_dot_type = TT_Q8_0,
};

int tensor_q4_0_r8_available(void)
{
    tensor_kernels_init();
    const tensor_traits *t = tensor_type_traits(TT_Q4_0_R8);
    return t->vec_dot_tile != NULL && t->tile_x_prep != NULL;
}

void tensor_q4_0_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows)
{
    const int64_t nb = ne0 / QK4_0;
    const size_t row = (size_t)nb * sizeof(block_q4_0);
    for (int64_t g = 0; g < n_rows / Q4_0_R8_ROWS; g++) {
        const uint8_t *in = (const uint8_t *)src + (size_t)g * Q4_0_R8_ROWS * row;
        uint8_t *out = (uint8_t *)dst + (size_t)g * Q4_0_R8_ROWS * row;
        for (int64_t b = 0; b < nb; b++, out += Q4_0_R8_BLOCK)
            for (int r = 0; r < Q4_0_R8_ROWS; r++) {
                const block_q4_0 *k = (const block_q4_0 *)(in + (size_t)r * row) + b;
                memcpy(out + 2 * r, &k->d, sizeof k->d);
                for (int c = 0; c < 4; c++)
                    memcpy(out + 16 + 32 * c + 4 * r, k->qs + 4 * c, 4);
            }
    }
}

void tensor_q4_0_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0)
{
    const uint8_t *in = group;
    for (int64_t b = 0; b < ne0 / QK4_0; b++, in += Q4_0_R8_BLOCK) {
        block_q4_0 *k = (block_q4_0 *)dst + b;
        memcpy(&k->d, in + 2 * r, sizeof k->d);
        for (int c = 0; c < 4; c++)
            memcpy(k->qs + 4 * c, in + 16 + 32 * c + 4 * r, 4);
    }
}

void tensor_q4_0_r8_to_float(const void *group, int r, float *dst, int64_t ne0)
{
    block_q4_0 one[1];
    for (int64_t b = 0; b < ne0 / QK4_0; b++) {
        /* a block at a time: no buffer sized by the row */
        tensor_q4_0_r8_unpack_row((const uint8_t *)group + (size_t)b * Q4_0_R8_BLOCK, r, one, QK4_0);
        tensor__ref_q4_0.to_float(one, dst + b * QK4_0, QK4_0);
    }
}

int tensor_r8_file_type(int type)
{
    return type == TT_Q4_0_R8 ? TT_Q4_0 : type == TT_Q4_K_R8 ? TT_Q4_K
                                          : type == TT_Q8_0_R8 ? TT_Q8_0
                                          : type == TT_Q6_K_R8 ? TT_Q6_K : -1;
}

void tensor_r8_unpack_row(int type, const void *group, int r, void *dst, int64_t ne0)
{
    if (type == TT_Q4_0_R8)
        tensor_q4_0_r8_unpack_row(group, r, dst, ne0);
    else if (type == TT_Q4_K_R8)
        tensor_q4_k_r8_unpack_row(group, r, dst, ne0);
    else if (type == TT_Q8_0_R8)
        tensor_q8_0_r8_unpack_row(group, r, dst, ne0);
    else if (type == TT_Q6_K_R8)
        tensor_q6_k_r8_unpack_row(group, r, dst, ne0);
}

void tensor_row_to_float(int type, const void *data, size_t row_bytes, int64_t o, float *dst,
                         int64_t ne0)
{
    if (type == TT_Q4_0_R8) {
        tensor_q4_0_r8_to_float((const uint8_t *)data + (size_t)(o & ~7L) * row_bytes, (int)(o & 7),
                                dst, ne0);
    } else if (tensor_r8_file_type(type) >= 0) {
        _Alignas(64) uint8_t row[Q4_0_R8_MAX_ROW_BYTES];
        tensor_r8_unpack_row(type, (const uint8_t *)data + (size_t)(o & ~7L) * row_bytes,
                             (int)(o & 7), row, ne0);
        tensor_type_traits_ref(tensor_r8_file_type(type))->to_float(row, dst, ne0);
    } else
        tensor_type_traits_ref(type)->to_float((const uint8_t *)data + (size_t)o * row_bytes, dst, ne0);
}
