/* membw.h - a measure of this machine's memory bandwidth (STREAM triad),
 * used to tell how close generation gets to its roof: generation reads every
 * weight byte once per token, so tokens/s can never exceed bandwidth divided
 * by the bytes of weights per token. */
#ifndef RC_MEMBW_H
#define RC_MEMBW_H

#include <stddef.h>
#include "pool.h"

/* Runs a[i] = b[i] + s * c[i] over three float arrays of `bytes_per_array`
 * each (make it several times the last-level cache; 128 MiB is plenty),
 * `reps` times on the pool's threads; returns the best rate in bytes/s,
 * counting 3 arrays per pass as STREAM does.  Returns 0 on allocation
 * failure. */
double membw_triad(thread_pool *pool, size_t bytes_per_array, int reps);

#endif
