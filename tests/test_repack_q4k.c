/* test_repack_q4k.c - Q4_K repacked at load (TT_Q4_K_R8): the repacking
 * is lossless, and the kernels that read it give the bits of the file
 * type's own kernels for every batch size, so a repacked model computes
 * exactly what it computed before. */
#include "test.h"
#include "tile_check.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "tensor/fp16.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/q4k_r8.h"
#include "tensor/types.h"

/* n_rows Q4_K rows of n elements: random levels and packed scales, d and
 * dmin of normal size; row `extreme` (if >= 0) has every level 15 and the
 * largest scales, for the 16-bit partial sums' worst case. */
static uint8_t *q4k_rows(rng_state *r, int n_rows, int64_t n, int extreme)
{
    const size_t rb = tensor_row_bytes(TT_Q4_K, n);
    uint8_t *w = malloc(rb * (size_t)n_rows);
    if (!w)
        abort();
    for (size_t i = 0; i < rb * (size_t)n_rows; i++)
        w[i] = (uint8_t)rng_next(r);
    for (int i = 0; i < n_rows; i++)
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q4_K *k = (block_q4_K *)(w + (size_t)i * rb) + b;
            k->d = fp32_to_fp16((float)(0.5 + rng_uniform(r)) / 256.0f);
            k->dmin = fp32_to_fp16((float)rng_uniform(r) / 256.0f);
            if (i == extreme) {
                memset(k->qs, 0xff, sizeof k->qs);
                memset(k->scales, 0xff, sizeof k->scales);
            }
        }
    return w;
}

static uint8_t *repack(const uint8_t *w, int n_rows, int64_t n)
{
    const size_t rb = tensor_row_bytes(TT_Q4_K, n);
    uint8_t *g = malloc(rb * (size_t)n_rows);
    if (!g)
        abort();
    (void)rb;
    tensor_q4_k_r8_pack(w, g, n, n_rows);
    return g;
}

TEST(repack_q4k_round_trip)
{
    rng_state r;
    rng_seed(&r, 808);
    const int64_t n = 3 * QK_K;
    uint8_t *w = q4k_rows(&r, 16, n, 5), *g = repack(w, 16, n);
    tile_check_layout(TT_Q4_K, TT_Q4_K_R8, w, g, n, 16);
    free(w);
    free(g);
}

TEST(repack_q4k_tile_bits)
{
    tensor_kernels_init();
    const tensor_traits *a = tensor_type_traits(TT_Q4_K_R8), *q4k = tensor_type_traits(TT_Q4_K);
    if (!a->vec_dot_tile)
        SKIP("the %s kernels have no Q4_K_R8 tile (nothing is repacked)", tensor_kernels_name());
    rng_state r;
    rng_seed(&r, 909);
    static const int64_t ns[] = { QK_K, 3 * QK_K, 9 * QK_K };
    /* one group, a pair of groups (AVX-512: one zmm), a pair and a lone group */
    static const int nws[] = { 8, 16, 24 };
    enum { NX = 35 };
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        for (size_t d = 0; d < sizeof nws / sizeof nws[0]; d++) {
            const int64_t n = ns[c];
            const int NW = nws[d];
            const size_t rb = tensor_row_bytes(TT_Q4_K, n), xb = tensor_row_bytes(TT_Q8_K, n);
            uint8_t *w = q4k_rows(&r, NW, n, NW - 3), *xq = tile_q8k_rows(&r, NX, n);
            uint8_t *g = repack(w, NW, n);
            tile_check_exact("Q4_K", a, q4k->vec_dot, n, w, g, rb, NW, xq, xb, NX,
                             13, 11);
            free(w);
            free(xq);
            free(g);
        }
}

/* The exact path reads a repacked matrix through its file type's rows. */
TEST(repack_q4k_matmul_exact)
{
    rng_state r;
    rng_seed(&r, 1010);
    const int64_t n = 2 * QK_K;
    enum { NW = 16, NX = 3 };
    const size_t rb = tensor_row_bytes(TT_Q4_K, n);
    uint8_t *w = q4k_rows(&r, NW, n, -1), *g = repack(w, NW, n);
    float x[NX * 2 * QK_K], y0[NX * NW], y1[NX * NW];
    for (int i = 0; i < NX * n; i++)
        x[i] = (float)rng_normal(&r);
    tensor W = { .data = w, .type = TT_Q4_K, .n_dims = 2, .ne = { n, NW, 1, 1 }, .row_bytes = rb,
                 .name = "w" };
    tensor G = W;
    G.data = g;
    G.type = TT_Q4_K_R8;
    thread_pool *pool = pool_new(2);
    matmul(pool, &W, x, (int)n, NX, y0, NW, MATMUL_EXACT, NULL);
    matmul(pool, &G, x, (int)n, NX, y1, NW, MATMUL_EXACT, NULL);
    for (int i = 0; i < NX * NW; i++)
        if (fp32_bits(y0[i]) != fp32_bits(y1[i]))
            FAIL("output %d: %.9g repacked, %.9g as Q4_K", i, y1[i], y0[i]);
    pool_free(pool);
    free(w);
    free(g);
}
