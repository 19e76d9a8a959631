/* tile_check.h - the check every repacked tile kernel's test makes: its
 * outputs are bit for bit the plain layout's vec_dot, for 1..n_x_max
 * activation rows, and it writes no output beyond the rows asked for. */
#ifndef RC_TILE_CHECK_H
#define RC_TILE_CHECK_H

#include "base/rng.h"
#include "tensor/types.h"

/* n_x Q8_K activation rows of n elements (malloc'd): row 0 every quant
 * -127 (the largest products of one sign), the others normal values with
 * an offset on some. */
uint8_t *tile_q8k_rows(rng_state *r, int n_x, int64_t n);

/* tile: the repacked type's traits (its vec_dot_tile, and its tile_x_prep
 * if it reads a layout of its own); w: n_w rows of the plain type
 * (row_bytes apart); packed: the same rows repacked; xq: n_x_max
 * activation rows (x_bytes apart) in the vec_dot type.  Activation counts
 * 1, 2, ... up to `dense` one by one, then every `stride`.  Fails the test
 * naming `type`, n, the rows and the output that differs. */
void tile_check_exact(const char *type, const tensor_traits *tile, vec_dot_fn dot, int64_t n,
                      const void *w, const void *packed, size_t row_bytes, int n_w,
                      const void *xq, size_t x_bytes, int n_x_max, int dense, int stride);

/* The layout checks of an R8 type: n_rows (a multiple of 8) rows of
 * `type` at w, the same rows repacked into `packed_type` at packed (n
 * elements each): the repacking moved bytes (packed differs), every row
 * unpacks to its bytes and decodes to the same floats, the type is not a
 * file's and keeps the row size. */
void tile_check_layout(int type, int packed_type, const void *w, const void *packed, int64_t n,
                       int n_rows);

/* matmul of n_w rows of `type` at w and of the same rows repacked into
 * `packed_type` at packed (n elements each), on 2 threads, fast and exact,
 * against 1, 3, 8 and 19 random activation rows: the same bits. */
void tile_check_matmul(const char *type_name, int type, int packed_type, const void *w,
                       const void *packed, int64_t n, int n_w, rng_state *r);

#endif
