/* test_repack_q6k.c - Q6_K repacked at load (TT_Q6_K_R8): the repacking
 * moves bytes only, and the tile kernel gives the bits of Q6_K's own
 * vec_dot for every batch and row length (whole and partial groups, the
 * extreme levels and scales), so a repacked model computes exactly what it
 * computed before.  Tensor layer only (the arm64 kernel tests build it
 * too); the model's logits with and without it are in test_repack.c. */
#include "test.h"
#include "tile_check.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "tensor/fp16.h"
#include "tensor/q6k_r8.h"
#include "tensor/repack.h"
#include "tensor/types.h"

/* n_rows Q6_K rows of n elements: random levels and scales (int8, any
 * sign), d of varied size; row `extreme` (if >= 0) has every level 63 and
 * every scale -128, the 16-bit partial sums' and the products' worst case;
 * every third row is quantised from normal values. */
static uint8_t *q6k_rows(rng_state *r, int n_rows, int64_t n, int extreme)
{
    const size_t rb = tensor_row_bytes(TT_Q6_K, n);
    uint8_t *w = malloc(rb * (size_t)n_rows);
    float *f = malloc(sizeof(float) * (size_t)n);
    if (!w || !f)
        abort();
    for (int i = 0; i < n_rows; i++) {
        uint8_t *row = w + (size_t)i * rb;
        if (i % 3 == 2 && i != extreme) {
            for (int64_t k = 0; k < n; k++)
                f[k] = (float)rng_normal(r);
            tensor_type_traits_ref(TT_Q6_K)->from_float(f, row, n);
            continue;
        }
        for (size_t k = 0; k < rb; k++)
            row[k] = (uint8_t)rng_next(r);
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q6_K *k = (block_q6_K *)row + b;
            k->d = fp32_to_fp16((float)(0.5 + rng_uniform(r)) / (b % 3 == 0 ? 8.0f : 1024.0f));
            if (i == extreme) {
                memset(k->ql, 0xff, sizeof k->ql);
                memset(k->qh, 0xff, sizeof k->qh);
                memset(k->scales, 0x80, sizeof k->scales);
            }
        }
    }
    free(f);
    return w;
}

static uint8_t *repack(const uint8_t *w, int n_rows, int64_t n)
{
    uint8_t *g = malloc(tensor_row_bytes(TT_Q6_K, n) * (size_t)n_rows);
    if (!g)
        abort();
    tensor_q6_k_r8_pack(w, g, n, n_rows);
    return g;
}

TEST(repack_q6k_round_trip)
{
    rng_state r;
    rng_seed(&r, 1606);
    const int64_t n = 3 * QK_K;
    uint8_t *w = q6k_rows(&r, 16, n, 4), *g = repack(w, 16, n);
    tile_check_layout(TT_Q6_K, TT_Q6_K_R8, w, g, n, 16);
    free(w);
    free(g);
}

static void need_q6k_r8(void)
{
    if (!tensor_q6_k_r8_available())
        SKIP("the active kernels (%s) have no Q6_K_R8 tile kernel", tensor_kernels_name());
}

TEST(repack_q6k_tile_bits)
{
    need_q6k_r8();
    const tensor_traits *a = tensor_type_traits(TT_Q6_K_R8), *q6k = tensor_type_traits(TT_Q6_K);
    rng_state r;
    rng_seed(&r, 1707);
    static const int64_t ns[] = { QK_K, 3 * QK_K, 11 * QK_K, 129 * QK_K };
    /* AVX-512 takes groups two by two: a lone group, a pair used in part,
     * a pair and a lone group, a whole pair then one used in part */
    static const int nws[] = { 8, 13, 24, 29 };
    enum { NX = 35 };
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        for (size_t d = 0; d < sizeof nws / sizeof nws[0]; d++) {
            const int64_t n = ns[c];
            const int NW = nws[d], groups = (NW + 7) / 8;
            const size_t rb = tensor_row_bytes(TT_Q6_K, n), xb = tensor_row_bytes(TT_Q8_K, n);
            /* whole groups in memory; a partial last group is used in part */
            uint8_t *w = q6k_rows(&r, groups * 8, n, NW - 2), *xq = tile_q8k_rows(&r, NX, n);
            uint8_t *g = repack(w, groups * 8, n);
            tile_check_exact("Q6_K", a, q6k->vec_dot, n, w, g, rb, NW, xq, xb, NX,
                             9, 13);
            free(w);
            free(xq);
            free(g);
        }
}

/* matmul on R8 weights gives the Q6_K product's bits, fast (the tile
 * kernel, one row and batches) and exact (rows unpacked). */
TEST(repack_q6k_matmul_equals_q6_k)
{
    need_q6k_r8();
    rng_state r;
    rng_seed(&r, 1808);
    const int64_t n = 5 * QK_K;
    enum { NW = 48 };
    uint8_t *w = q6k_rows(&r, NW, n, 5), *g = repack(w, NW, n);
    tile_check_matmul("Q6_K", TT_Q6_K, TT_Q6_K_R8, w, g, n, NW, &r);
    free(w);
    free(g);
}
