/* q4k_r8.h - Q4_K weights repacked at load for the batched kernels.
 *
 * TT_Q4_K_R8 is an in-memory layout, never a file's: 8 consecutive rows of
 * a Q4_K matrix are stored together, super-block by super-block, so that
 * the kernel reads the 8 rows' levels with one 32-byte load per 4 elements
 * of each row and multiplies them against 4 activation bytes broadcast to
 * every lane (lane r = row r): one integer multiply then advances 8 outputs,
 * where the row-by-row kernels spend a multiply and a transposing add per
 * row.  A group of 8 rows and one super-block takes exactly the bytes of 8
 * Q4_K blocks (1152), so a matrix keeps its size and row r of a group of
 * rows starting at a multiple of 8 still starts at r * row_bytes:
 *
 *   d[8], dmin[8]   the 8 rows' fp16 d and dmin                      32 bytes
 *   sc[3][8][4]     word w (bytes 4w..4w+3) of each row's 12 packed
 *                   scale bytes, the 8 rows' words side by side      96 bytes
 *   qs[32][8][4]    chunk c = 8p + k: bytes qs[32p + 4k .. 32p + 4k + 3]
 *                   of each row, side by side                     1024 bytes
 *
 * Only matrices whose row count is a multiple of 8 are repacked, under the
 * same rules as Q4_0's (tensor/repack.h, model/repack.c). */
#ifndef RC_Q4K_R8_H
#define RC_Q4K_R8_H

#include <stddef.h>
#include <stdint.h>

enum { Q4K_R8_GROUP_BYTES = 1152 };   /* 8 rows x one super-block */

/* 1 if the active kernels compute with TT_Q4_K_R8. */
int tensor_q4_k_r8_available(void);

/* n_rows (a multiple of 8) Q4_K rows of ne0 elements at src into the R8
 * layout at dst (the same bytes; the buffers do not overlap). */
void tensor_q4_k_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows);

/* Row r (0..7) of the group at `group` back as its Q4_K bytes. */
void tensor_q4_k_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0);

#endif
