/* matmul.h - weight matrix times a batch of activation rows.
 *
 * Y[r][o] = W[o,:] . X[r,:] for r < n_rows, o < W->ne[1].  X rows have
 * W->ne[0] floats (stride ldx), Y rows W->ne[1] floats (stride ldy).
 *
 * Two precisions:
 *   MATMUL_EXACT  weights decoded to f32, f32 activations (the reference
 *                 math, compared with the golden .exact.f32 logits);
 *   MATMUL_FAST   activations first converted to the weight type's
 *                 vec_dot_type (Q8_0, Q8_K, F16...) as llama.cpp does, then
 *                 integer or reduced-precision dot products.
 * The output rows are split across the pool's threads in panels taken from a
 * shared counter.  Each output is computed from its own two rows by one
 * kernel call (vec_dot_tile, whose contract is in types.h, or vec_dot), so
 * results depend neither on the number of threads nor on the panels.
 */
#ifndef RC_MATMUL_H
#define RC_MATMUL_H

#include "pool.h"
#include "tensor.h"

enum { MATMUL_FAST = 0, MATMUL_EXACT = 1 };

/* Scratch bytes matmul needs for n_rows of activations against W. */
size_t matmul_scratch_bytes(const tensor *W, int n_rows, int mode);

/* `scratch` has at least matmul_scratch_bytes(W, n_rows, mode) bytes,
 * aligned to 64. */
void matmul(thread_pool *pool, const tensor *W, const float *X, int ldx, int n_rows,
            float *Y, int ldy, int mode, void *scratch);

/* The n_mats matrices of a 3-D W (W's slices 0..n_mats-1, ne[2] >= n_mats)
 * each against its own activations, in one pass of the pool (latent
 * attention's per-head products): Y + j * y_step gets slice j times the
 * n_rows rows at X + j * x_step (strides ldx, ldy as above).  Scratch:
 * matmul_scratch_bytes(W, n_rows * n_mats, mode).  Each output is the same
 * kernel call as matmul's, so the results are matmul's bit for bit. */
void matmul_batched(thread_pool *pool, const tensor *W, int n_mats, const float *X, int ldx,
                    size_t x_step, int n_rows, float *Y, int ldy, size_t y_step, int mode,
                    void *scratch);

#endif
