/* q4k_r8.c - the reference repacking of Q4_K rows into TT_Q4_K_R8 and
 * back (layout in q4k_r8.h).  The kernels that read the layout are
 * per-instruction-set files; this one is plain C so that every build can
 * make and check the layout. */
#include "tensor/q4k_r8.h"

#include <string.h>

#include "tensor/quant_ref.h"
#include "tensor/types.h"

/* Geometry only: the products exist as SIMD tile kernels alone, and a
 * matrix is repacked only where one is installed. */
const tensor_traits tensor__ref_q4_k_r8 = {
    .name = "Q4_K_R8", .block_size = QK_K, .block_bytes = sizeof(block_q4_K),
    .vec_dot_type = TT_Q8_K,
};

int tensor_q4_k_r8_available(void)
{
    tensor_kernels_init();
    return tensor_type_traits(TT_Q4_K_R8)->vec_dot_tile != NULL;
}

void tensor_q4_k_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows)
{
    const size_t row_bytes = tensor_row_bytes(TT_Q4_K, ne0);
    for (int64_t g = 0; g < n_rows; g += 8) {
        const uint8_t *rows = (const uint8_t *)src + (size_t)g * row_bytes;
        uint8_t *out = (uint8_t *)dst + (size_t)g * row_bytes;
        for (int64_t b = 0; b < ne0 / QK_K; b++, out += Q4K_R8_GROUP_BYTES)
            for (int r = 0; r < 8; r++) {
                const block_q4_K *k = (const block_q4_K *)(rows + (size_t)r * row_bytes) + b;
                memcpy(out + 2 * r, &k->d, 2);
                memcpy(out + 16 + 2 * r, &k->dmin, 2);
                for (int w = 0; w < 3; w++)
                    memcpy(out + 32 + 32 * w + 4 * r, k->scales + 4 * w, 4);
                for (int c = 0; c < 32; c++)
                    memcpy(out + 128 + 32 * c + 4 * r, k->qs + 4 * c, 4);
            }
    }
}

void tensor_q4_k_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0)
{
    const uint8_t *in = group;
    for (int64_t b = 0; b < ne0 / QK_K; b++, in += Q4K_R8_GROUP_BYTES) {
        block_q4_K *k = (block_q4_K *)dst + b;
        memcpy(&k->d, in + 2 * r, 2);
        memcpy(&k->dmin, in + 16 + 2 * r, 2);
        for (int w = 0; w < 3; w++)
            memcpy(k->scales + 4 * w, in + 32 + 32 * w + 4 * r, 4);
        for (int c = 0; c < 32; c++)
            memcpy(k->qs + 4 * c, in + 128 + 32 * c + 4 * r, 4);
    }
}
