/* q6k_r8.c - the reference repacking of Q6_K rows into TT_Q6_K_R8 and
 * back (layout in q6k_r8.h).  The products exist only as SIMD tile kernels
 * (q6k_r8_avx2.c, q6k_r8_avx512.c), and a matrix is repacked only where one is installed;
 * this file is plain C so that every build can make and check the layout. */
#include "tensor/q6k_r8.h"

#include <stddef.h>
#include <string.h>

#include "tensor/quant_ref.h"
#include "tensor/types.h"

/* Geometry only: no to_float, dot_f32 or vec_dot on a single row (its bytes
 * are spread over its group), so tensor_type_supported says no and no file
 * can name the type. */
const tensor_traits tensor__ref_q6_k_r8 = {
    .name = "Q6_K_R8", .block_size = QK_K, .block_bytes = sizeof(block_q6_K),
    .vec_dot_type = TT_Q8_K,
};

int tensor_q6_k_r8_available(void)
{
    tensor_kernels_init();
    return tensor_type_traits(TT_Q6_K_R8)->vec_dot_tile != NULL;
}

/* Where the bytes of row r's block go in its group's super-block: piece i
 * is n[i] bytes at offset blk[i] of the Q6_K block and grp[i] of the
 * group's.  Returns the number of pieces. */
enum { N_PIECES = 4 + 2 * 8 * 3 + 1 };

static int pieces(int r, size_t grp[N_PIECES], size_t blk[N_PIECES], size_t n[N_PIECES])
{
    int p = 0;
    for (int w = 0; w < 4; w++, p++) {
        grp[p] = Q6K_R8_SC + 32 * w + 4 * (size_t)r;
        blk[p] = offsetof(block_q6_K, scales) + 4 * (size_t)w;
        n[p] = 4;
    }
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 8; k++) {
            const size_t at = Q6K_R8_HALF + 768 * (size_t)h + 96 * (size_t)k + 4 * (size_t)r;
            const size_t lo = offsetof(block_q6_K, ql) + 64 * (size_t)h + 4 * (size_t)k;
            const size_t qh = offsetof(block_q6_K, qh) + 32 * (size_t)h + 4 * (size_t)k;
            const size_t g3[3] = { at, at + 32, at + 64 }, b3[3] = { lo, lo + 32, qh };
            for (int i = 0; i < 3; i++, p++) {
                grp[p] = g3[i];
                blk[p] = b3[i];
                n[p] = 4;
            }
        }
    grp[p] = Q6K_R8_D + 2 * (size_t)r;
    blk[p] = offsetof(block_q6_K, d);
    n[p++] = 2;
    return p;
}

void tensor_q6_k_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows)
{
    const size_t row_bytes = tensor_row_bytes(TT_Q6_K, ne0);
    size_t grp[8][N_PIECES], blk[8][N_PIECES], n[8][N_PIECES];
    int np = 0;
    for (int r = 0; r < 8; r++)
        np = pieces(r, grp[r], blk[r], n[r]);
    for (int64_t g = 0; g < n_rows; g += 8) {
        const uint8_t *rows = (const uint8_t *)src + (size_t)g * row_bytes;
        uint8_t *out = (uint8_t *)dst + (size_t)g * row_bytes;
        for (int64_t b = 0; b < ne0 / QK_K; b++, out += Q6K_R8_GROUP_BYTES)
            for (int r = 0; r < 8; r++) {
                const uint8_t *k = rows + (size_t)r * row_bytes + (size_t)b * sizeof(block_q6_K);
                for (int i = 0; i < np; i++)
                    memcpy(out + grp[r][i], k + blk[r][i], n[r][i]);
            }
    }
}

void tensor_q6_k_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0)
{
    size_t grp[N_PIECES], blk[N_PIECES], n[N_PIECES];
    const int np = pieces(r, grp, blk, n);
    const uint8_t *in = group;
    for (int64_t b = 0; b < ne0 / QK_K; b++, in += Q6K_R8_GROUP_BYTES) {
        uint8_t *k = (uint8_t *)dst + (size_t)b * sizeof(block_q6_K);
        for (int i = 0; i < np; i++)
            memcpy(k + blk[i], in + grp[i], n[i]);
    }
}
