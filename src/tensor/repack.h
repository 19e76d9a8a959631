/* repack.h - Q4_0 weights interleaved by 8 rows (TT_Q4_0_R8), made once at
 * load so the matrix-product kernels read 8 rows' blocks as one
 * sequential stream and need no per-call rearranging.
 *
 * Layout: rows in groups of 8; group k is at byte k * 8 * row_bytes (as the
 * Q4_0 rows it came from) and holds, for each 32-element block b in order,
 * 144 bytes (8 x 18, so a row's byte count is Q4_0's):
 *   d[8]      the 8 rows' fp16 scales (16 bytes)
 *   q[4][32]  q[c][4 r + i] = Q4_0 qs[4 c + i] of row r
 * so q[c] & 0x0f are levels 4c..4c+3 of rows 0..7 (4 bytes per row, lane
 * r = row r) and q[c] >> 4 levels 16+4c..16+4c+3: one multiply-add against
 * 4 broadcast activation bytes advances 8 outputs.  The nibbles are Q4_0's
 * bytes, moved, never changed.
 *
 * Only tensors whose row count (per 2-D slice) is a multiple of 8 are
 * repacked, so every group is whole and a panel of rows starting at a
 * multiple of 8 starts at row * row_bytes.  The tile kernel (installed by
 * kernels.c where the CPU has one) gives each output bit for bit the value
 * Q4_0's vec_dot gives on the same CPU (its contract, types.h). */
#ifndef RC_TENSOR_REPACK_H
#define RC_TENSOR_REPACK_H

#include <stddef.h>
#include <stdint.h>

enum {
    Q4_0_R8_ROWS = 8,
    Q4_0_R8_BLOCK = 144,            /* bytes of one block of a group */
    /* Rows longer than this are not repacked: the exact-math path unpacks
     * a row onto the stack (matmul.c). */
    Q4_0_R8_MAX_ROW_BYTES = 32 * 1024
};

/* 1 if the active kernels compute with TT_Q4_0_R8 (an R8 tile kernel is
 * installed); repacking makes sense only then. */
int tensor_q4_0_r8_available(void);

/* n_rows (a multiple of 8) Q4_0 rows of ne0 elements at src into the R8
 * layout at dst (the same number of bytes; the buffers do not overlap). */
void tensor_q4_0_r8_pack(const void *src, void *dst, int64_t ne0, int64_t n_rows);

/* Row r (0..7) of the group at `group` back as ne0 / 32 Q4_0 blocks, byte
 * for byte the row it was packed from. */
void tensor_q4_0_r8_unpack_row(const void *group, int r, void *dst, int64_t ne0);

/* Row r (0..7) of the group at `group` decoded to ne0 floats (Q4_0's
 * reference decoding of the same bytes). */
void tensor_q4_0_r8_to_float(const void *group, int r, float *dst, int64_t ne0);

/* The file type an in-memory layout interleaved by 8 rows was made from
 * (TT_Q4_0_R8: TT_Q4_0, TT_Q4_K_R8: TT_Q4_K, TT_Q8_0_R8: TT_Q8_0,
 * TT_Q6_K_R8: TT_Q6_K), or -1
 * for any other type. */
int tensor_r8_file_type(int type);

/* Row r (0..7) of the group at `group` of such a layout back as the bytes
 * of its file type's row (ne0 elements). */
void tensor_r8_unpack_row(int type, const void *group, int r, void *dst, int64_t ne0);

/* Row o of a weight matrix, in either layout, decoded to ne0 floats:
 * data is row 0's, rows row_bytes apart (R8: row 0 starts a group).  The
 * reference decoders; for tests and other slow readers of weights. */
void tensor_row_to_float(int type, const void *data, size_t row_bytes, int64_t o, float *dst,
                         int64_t ne0);

#endif
