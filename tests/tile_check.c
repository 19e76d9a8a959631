/* tile_check.c - see tile_check.h. */
#include "tile_check.h"
#include "test.h"

#include "tensor/fp16.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/repack.h"

uint8_t *tile_q8k_rows(rng_state *r, int n_x, int64_t n)
{
    const size_t xb = tensor_row_bytes(TT_Q8_K, n);
    uint8_t *xq = malloc(xb * (size_t)n_x);
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!xq || !x)
        abort();
    for (int j = 0; j < n_x; j++) {
        for (int64_t i = 0; i < n; i++)
            x[i] = j == 0 ? 3.0f : (float)rng_normal(r) + (j % 3 == 1 ? 0.4f : 0.0f);
        tensor_type_traits_ref(TT_Q8_K)->from_float(x, xq + (size_t)j * xb, n);
    }
    free(x);
    return xq;
}

void tile_check_exact(const char *type, const tensor_traits *tile, vec_dot_fn dot, int64_t n,
                      const void *w, const void *packed, size_t row_bytes, int n_w,
                      const void *xq, size_t x_bytes, int n_x_max, int dense, int stride)
{
    const uint8_t *wb = w, *xb = xq;
    float *y = malloc(sizeof(float) * (size_t)n_w * (size_t)n_x_max);
    /* the rows in the kernel's own layout, where it has one */
    const size_t xt_bytes = tile->tile_x_prep ? tensor_tile_x_bytes(tile, n) : x_bytes;
    uint8_t *xt = tile->tile_x_prep ? malloc(xt_bytes * (size_t)n_x_max) : NULL;
    CHECK(y && (xt || !tile->tile_x_prep));
    for (int j = 0; xt && j < n_x_max; j++)
        tile->tile_x_prep(xb + (size_t)j * x_bytes, xt + (size_t)j * xt_bytes, n);
    for (int n_x = 1; n_x <= n_x_max; n_x += n_x < dense ? 1 : stride) {
        for (int i = 0; i < n_w * n_x_max; i++)
            y[i] = -1.0f;
        tile->vec_dot_tile(n, packed, row_bytes, n_w, xt ? (const void *)xt : xq, xt_bytes, n_x, y, n_w);
        for (int j = 0; j < n_x_max; j++)
            for (int i = 0; i < n_w; i++) {
                const float got = y[j * n_w + i];
                if (j >= n_x) {
                    if (got != -1.0f)
                        FAIL("%d rows: output (%d, %d) written", n_x, i, j);
                    continue;
                }
                const float want = dot(wb + i * row_bytes, xb + j * x_bytes, n);
                if (fp32_bits(got) != fp32_bits(want))
                    FAIL("n %lld, %d weight rows, %d activation rows: output (%d, %d) "
                         "is %.9g, %s vec_dot %.9g", (long long)n, n_w, n_x, i, j, got, type,
                         want);
            }
    }
    free(y);
    free(xt);
}

void tile_check_layout(int type, int packed_type, const void *w, const void *packed, int64_t n,
                       int n_rows)
{
    const size_t rb = tensor_row_bytes(type, n);
    const uint8_t *wb = w, *pb = packed;
    uint8_t *back = malloc(rb);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    CHECK(back && a && b);
    CHECK(memcmp(packed, w, rb * (size_t)n_rows) != 0);
    CHECK_INT(tensor_r8_file_type(packed_type), ==, type);
    for (int i = 0; i < n_rows; i++) {
        tensor_r8_unpack_row(packed_type, pb + (size_t)(i & ~7) * rb, i & 7, back, n);
        if (memcmp(back, wb + (size_t)i * rb, rb))
            FAIL("%s row %d does not unpack to its bytes", tensor_type_name(packed_type), i);
        tensor_row_to_float(packed_type, packed, rb, i, a, n);
        tensor_type_traits_ref(type)->to_float(wb + (size_t)i * rb, b, n);
        if (memcmp(a, b, sizeof(float) * (size_t)n))
            FAIL("%s row %d decodes to other floats", tensor_type_name(packed_type), i);
    }
    /* an in-memory layout is not a file type */
    CHECK(!tensor_type_supported(packed_type));
    CHECK_INT(tensor_row_bytes(packed_type, n), ==, rb);
    free(back);
    free(a);
    free(b);
}

void tile_check_matmul(const char *type_name, int type, int packed_type, const void *w,
                       const void *packed, int64_t n, int n_w, rng_state *r)
{
    thread_pool *pool = pool_new(2);
    const size_t rb = tensor_row_bytes(type, n);
    tensor W = { .data = w, .type = type, .n_dims = 2, .ne = { n, n_w, 1, 1 }, .row_bytes = rb,
                 .name = "w" };
    tensor G = W;
    G.data = packed;
    G.type = packed_type;
    static const int batches[] = { 1, 3, 8, 19 };
    for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++)
        for (int mode = MATMUL_FAST; mode <= MATMUL_EXACT; mode++) {
            const int rows = batches[k];
            float *x = malloc(sizeof(float) * (size_t)(n * rows));
            float *y0 = malloc(sizeof(float) * (size_t)(n_w * rows));
            float *y1 = malloc(sizeof(float) * (size_t)(n_w * rows));
            CHECK(x && y0 && y1);
            for (int64_t i = 0; i < n * rows; i++)
                x[i] = (float)rng_normal(r);
            const size_t sw = matmul_scratch_bytes(&W, rows, mode), sg = matmul_scratch_bytes(&G, rows, mode);
            void *scratch = malloc(sw > sg ? sw : sg ? sg : 1);
            CHECK(scratch);
            matmul(pool, &W, x, (int)n, rows, y0, n_w, mode, scratch);
            matmul(pool, &G, x, (int)n, rows, y1, n_w, mode, scratch);
            for (int i = 0; i < n_w * rows; i++)
                if (fp32_bits(y0[i]) != fp32_bits(y1[i]))
                    FAIL("%s, %d rows: output %d is %.9g repacked, %.9g as %s",
                         mode == MATMUL_EXACT ? "exact" : "fast", rows, i, y1[i], y0[i], type_name);
            free(x);
            free(y0);
            free(y1);
            free(scratch);
        }
    pool_free(pool);
}
