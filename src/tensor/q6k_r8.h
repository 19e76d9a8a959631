/* q6k_r8.h - Q6_K weights interleaved by 8 rows (TT_Q6_K_R8), made once at
 * load for the matrix-product kernels.
 *
 * A group of 8 consecutive rows is stored super-block by super-block; a
 * group and one super-block take exactly the bytes of 8 Q6_K blocks (1680),
 * so a matrix keeps its size and row r of a group starting at a multiple of
 * 8 still starts at r * row_bytes:
 *
 *   sc[4][8][4]       word w (scales 4w..4w+3) of each row, side by side  128 bytes
 *   half h = 0, 1, each 768 bytes, for k = 0..7 in order (96 bytes each):
 *     ql[8][4]        ql[64h + 4k .. +3] of each row                        32
 *     ql[8][4]        ql[64h + 32 + 4k .. +3] of each row                   32
 *     qh[8][4]        qh[32h + 4k .. +3] of each row                        32
 *   d[8]              the 8 rows' fp16 d                                   16 bytes
 *
 * Q6_K's element 128h + 32g + l (l = 4k + i) is ql[64h + 32(g & 1) + l]'s
 * nibble g >> 1 with bits 2g, 2g + 1 of qh[32h + l] above it, so the 96
 * bytes of one k hold elements 4k..4k+3 of each of the half's 4 groups of
 * 32, for the 8 rows (lane r = row r): one multiply-add against 4
 * activation bytes broadcast to every lane advances 8 outputs, and the
 * kernel reads a group as one forward stream.  The bytes are Q6_K's,
 * moved, never changed.
 *
 * Only matrices whose row count (per 2-D slice) is a multiple of 8 are
 * repacked (model/repack.c), under the same rules as the other R8 layouts
 * (tensor/repack.h). */
#ifndef RC_Q6K_R8_H
#define RC_Q6K_R8_H

#include <stddef.h>
#include <stdint.h>

enum {
    Q6K_R8_GROUP_BYTES = 1680,   /* 8 rows x one super-block */
    Q6K_R8_SC = 0,               /* offsets inside it */
    Q6K_R8_HALF = 128,           /* + 768 h + 96 k: ql low, ql high, qh */
    Q6K_R8_D = 1664
};

/* 1 if the active kernels compute with TT_Q6_K_R8 (a tile kernel is
 * installed); repacking makes sense only then. */
int tensor_q6_k_r8_available(void);

/* n_rows (a multiple of 8) Q6_K rows of ne0 elements at src into the R8
 * layout at dst (the same bytes; the buffers do not overlap). */
void tensor_q6_k_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows);

/* Row r (0..7) of the group at `group` back as its Q6_K bytes. */
void tensor_q6_k_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0);

#endif
