/* tile_check.c - see tile_check.h. */
#include "tile_check.h"
#include "test.h"

#include "tensor/fp16.h"

void tile_check_exact(const char *type, vec_dot_tile_fn tile, vec_dot_fn dot, int64_t n,
                      const void *w, const void *packed, size_t row_bytes, int n_w,
                      const void *xq, size_t x_bytes, int n_x_max, int dense, int stride)
{
    const uint8_t *wb = w, *xb = xq;
    float *y = malloc(sizeof(float) * (size_t)n_w * (size_t)n_x_max);
    CHECK(y);
    for (int n_x = 1; n_x <= n_x_max; n_x += n_x < dense ? 1 : stride) {
        for (int i = 0; i < n_w * n_x_max; i++)
            y[i] = -1.0f;
        tile(n, packed, row_bytes, n_w, xq, x_bytes, n_x, y, n_w);
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
}
