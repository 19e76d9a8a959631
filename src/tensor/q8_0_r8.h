/* q8_0_r8.h - Q8_0 weights interleaved by 8 rows (TT_Q8_0_R8), made once
 * at load for the matrix-product kernels.
 *
 * Layout: rows in groups of 8; group k is at byte k * 8 * row_bytes (as the
 * Q8_0 rows it came from) and holds, for each 32-element block b in order,
 * 272 bytes (8 x 34, so a row's byte count is Q8_0's):
 *   d[8]        the 8 rows' fp16 scales                         16 bytes
 *   q[8][8][4]  q[c][r][i] = Q8_0 qs[4 c + i] of row r          256 bytes
 * so chunk c (32 bytes) holds elements 4c..4c+3 of the 8 rows, lane r =
 * row r: one multiply-add against 4 activation bytes broadcast to every
 * lane gives, for each of 8 rows, the sum Q8_0's kernels keep in their
 * lane c.  A thread's share of a matrix is one sequential stream of whole
 * 272-byte units, no block straddling a row boundary.
 *
 * Why: Q8_0's own blocks (34 bytes) start at every alignment and its
 * generation kernel does a float step per row and block; here one float
 * step serves 8 rows.  The kernels keep Q8_0's float order per output (8
 * lanes, fma(d_w * d_x, lane sum, lane) block after block, the lanes added
 * in hsum order), so each output equals Q8_0's vec_dot bit for bit: the
 * logits do not depend on whether a node repacked.
 *
 * Only matrices whose row count (per 2-D slice) is a multiple of 8 are
 * repacked (model/repack.c). */
#ifndef RC_Q8_0_R8_H
#define RC_Q8_0_R8_H

#include <stddef.h>
#include <stdint.h>

enum { Q8_0_R8_BLOCK = 272 };   /* bytes of one block of a group of 8 rows */

/* 1 if the active kernels compute with TT_Q8_0_R8 (a tile kernel is
 * installed); repacking makes sense only then. */
int tensor_q8_0_r8_available(void);

/* n_rows (a multiple of 8) Q8_0 rows of ne0 elements at src into the R8
 * layout at dst (the same number of bytes; the buffers do not overlap). */
void tensor_q8_0_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows);

/* Row r (0..7) of the group at `group` back as ne0 / 32 Q8_0 blocks, byte
 * for byte the row it was packed from. */
void tensor_q8_0_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0);

#endif
