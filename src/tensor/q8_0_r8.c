/* q8_0_r8.c - the reference (plain C) repacking of Q8_0 rows into
 * TT_Q8_0_R8 and back (layout in q8_0_r8.h).  The products exist only as
 * SIMD tile kernels (quant_q8r8_avx2.c, quant_q8r8_avx512.c), and a matrix is repacked only
 * where one is installed, so arm64 and RACIMO_KERNELS=ref keep Q8_0 as in
 * the file; this file lets every build make and check the layout. */
#include "tensor/q8_0_r8.h"

#include <string.h>

#include "tensor/quant_ref.h"
#include "tensor/types.h"

/* Geometry only: no to_float, dot_f32 or vec_dot on a single row (its bytes
 * are spread over its group), so tensor_type_supported says no and no file
 * can name the type. */
const tensor_traits tensor__ref_q8_0_r8 = {
    .name = "Q8_0_R8", .block_size = QK8_0, .block_bytes = sizeof(block_q8_0),
    .vec_dot_type = TT_Q8_0,
};

int tensor_q8_0_r8_available(void)
{
    tensor_kernels_init();
    return tensor_type_traits(TT_Q8_0_R8)->vec_dot_tile != NULL;
}

void tensor_q8_0_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows)
{
    const int64_t nb = ne0 / QK8_0;
    const size_t row = (size_t)nb * sizeof(block_q8_0);
    for (int64_t g = 0; g < n_rows / 8; g++) {
        const uint8_t *in = (const uint8_t *)src + (size_t)g * 8 * row;
        uint8_t *out = (uint8_t *)dst + (size_t)g * 8 * row;
        for (int64_t b = 0; b < nb; b++, out += Q8_0_R8_BLOCK)
            for (int r = 0; r < 8; r++) {
                const block_q8_0 *k = (const block_q8_0 *)(in + (size_t)r * row) + b;
                memcpy(out + 2 * r, &k->d, sizeof k->d);
                for (int c = 0; c < 8; c++)
                    memcpy(out + 16 + 32 * c + 4 * r, k->qs + 4 * c, 4);
            }
    }
}

void tensor_q8_0_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0)
{
    const uint8_t *in = group;
    for (int64_t b = 0; b < ne0 / QK8_0; b++, in += Q8_0_R8_BLOCK) {
        block_q8_0 *k = (block_q8_0 *)dst + b;
        memcpy(&k->d, in + 2 * r, sizeof k->d);
        for (int c = 0; c < 8; c++)
            memcpy(k->qs + 4 * c, in + 16 + 32 * c + 4 * r, 4);
    }
}
