/* tile_check.h - the check every repacked tile kernel's test makes: its
 * outputs are bit for bit the plain layout's vec_dot, for 1..n_x_max
 * activation rows, and it writes no output beyond the rows asked for. */
#ifndef RC_TILE_CHECK_H
#define RC_TILE_CHECK_H

#include "tensor/types.h"

/* w: n_w rows of the plain type (row_bytes apart); packed: the same rows
 * repacked; xq: n_x_max activation rows (x_bytes apart).  Activation counts
 * 1, 2, ... up to `dense` one by one, then every `stride`.  Fails the test
 * naming `type`, n, the rows and the output that differs. */
void tile_check_exact(const char *type, vec_dot_tile_fn tile, vec_dot_fn dot, int64_t n,
                      const void *w, const void *packed, size_t row_bytes, int n_w,
                      const void *xq, size_t x_bytes, int n_x_max, int dense, int stride);

#endif
