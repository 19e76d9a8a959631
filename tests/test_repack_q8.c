/* test_repack_q8.c - Q8_0 repacked by 8 rows (TT_Q8_0_R8): the repacking
 * moves bytes only, and the tile kernel gives Q8_0's vec_dot bits for every
 * batch and row length (whole and partial groups, the extreme levels).
 * Tensor layer only (the arm64 kernel tests build it too); the model's
 * logits with and without it are in test_repack.c. */
#include "test.h"
#include "tile_check.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "tensor/fp16.h"
#include "tensor/q8_0_r8.h"
#include "tensor/repack.h"
#include "tensor/types.h"

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

/* n_rows Q8_0 rows of random levels (-128..127) and scales of varied size;
 * row `extreme` (if >= 0) has every level -128, the sign trick's edge. */
static uint8_t *q8_rows(rng_state *r, int n_rows, int64_t n, int extreme)
{
    const size_t rb = tensor_row_bytes(TT_Q8_0, n);
    uint8_t *w = xmalloc(rb * (size_t)n_rows);
    for (int i = 0; i < n_rows; i++)
        for (int64_t b = 0; b < n / QK8_0; b++) {
            block_q8_0 *k = (block_q8_0 *)(w + (size_t)i * rb) + b;
            k->d = fp32_to_fp16((float)(0.01 + rng_uniform(r)) / (b % 5 == 0 ? 16.0f : 512.0f));
            for (int e = 0; e < QK8_0; e++)
                k->qs[e] = i == extreme ? -128 : (int8_t)rng_next(r);
        }
    return w;
}

/* n_x Q8_0 activation rows: row 0 every value the same (the largest
 * quants, 127), the others normal with an offset on some. */
static uint8_t *act_rows(rng_state *r, int n_x, int64_t n)
{
    const size_t xb = tensor_row_bytes(TT_Q8_0, n);
    uint8_t *xq = xmalloc(xb * (size_t)n_x);
    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int j = 0; j < n_x; j++) {
        for (int64_t i = 0; i < n; i++)
            x[i] = j == 0 ? -2.5f : (float)rng_normal(r) + (j % 3 == 1 ? 0.4f : 0.0f);
        tensor_type_traits_ref(TT_Q8_0)->from_float(x, xq + (size_t)j * xb, n);
    }
    free(x);
    return xq;
}

static uint8_t *repack(const uint8_t *w, int n_rows, int64_t n)
{
    uint8_t *g = xmalloc(tensor_row_bytes(TT_Q8_0, n) * (size_t)n_rows);
    tensor_q8_0_r8_pack(w, g, n, n_rows);
    return g;
}

TEST(repack_q8_round_trip)
{
    rng_state r;
    rng_seed(&r, 1808);
    const int64_t n = 5 * QK8_0;
    uint8_t *w = q8_rows(&r, 16, n, 3), *g = repack(w, 16, n);
    tile_check_layout(TT_Q8_0, TT_Q8_0_R8, w, g, n, 16);
    free(w);
    free(g);
}

static void need_q8_r8(void)
{
    if (!tensor_q8_0_r8_available())
        SKIP("the active kernels (%s) have no Q8_0_R8 tile kernel", tensor_kernels_name());
}

TEST(repack_q8_tile_bits)
{
    need_q8_r8();
    const tensor_traits *a = tensor_type_traits(TT_Q8_0_R8), *q8 = tensor_type_traits(TT_Q8_0);
    rng_state r;
    rng_seed(&r, 1909);
    static const int64_t ns[] = { QK8_0, 3 * QK8_0, 5 * QK8_0, 64 * QK8_0, 1030 * QK8_0 };
    /* a lone group, a pair used in part, whole pairs and a pair plus a lone
     * group (the AVX-512 kernel takes groups in pairs) */
    static const int nws[] = { 8, 13, 16, 24, 40 };
    enum { NX = 35 };
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        for (size_t d = 0; d < sizeof nws / sizeof nws[0]; d++) {
            const int64_t n = ns[c];
            const int NW = nws[d];
            const int groups = (NW + 7) / 8;
            const size_t rb = tensor_row_bytes(TT_Q8_0, n), xb = tensor_row_bytes(TT_Q8_0, n);
            /* whole groups in memory; a partial last group is used in part */
            uint8_t *w = q8_rows(&r, groups * 8, n, NW - 2), *xq = act_rows(&r, NX, n);
            uint8_t *g = repack(w, groups * 8, n);
            tile_check_exact("Q8_0", a, q8->vec_dot, n, w, g, rb, NW, xq, xb, NX,
                             33, 2);
            free(w);
            free(xq);
            free(g);
        }
}

/* matmul on R8 weights gives the Q8_0 product's bits, fast (the tile
 * kernel, one row and batches) and exact (rows unpacked). */
TEST(repack_q8_matmul_equals_q8_0)
{
    need_q8_r8();
    rng_state r;
    rng_seed(&r, 2010);
    const int64_t n = 7 * QK8_0;
    enum { NW = 48 };
    uint8_t *w = q8_rows(&r, NW, n, 5), *g = repack(w, NW, n);
    tile_check_matmul("Q8_0", TT_Q8_0, TT_Q8_0_R8, w, g, n, NW, &r);
    free(w);
    free(g);
}
