/* quant_iq_x86.h - internal to src/tensor: what the x86-64 dot products of
 * the table-valued 4-bit types (quant_iq_avx2.c, quant_iq_avx512.c) share:
 * their format codes, block sizes and weight scales, and the entry points
 * each file defines from its own vec_dot(f, ...) and tile(f, ...) with
 * DEFINE_IQ_KERNELS.  Static
 * inline, compiled with each file's flags; include after simd_x86.h. */
#ifndef RC_QUANT_IQ_X86_H
#define RC_QUANT_IQ_X86_H

#include <stddef.h>
#include <string.h>

#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

enum { F_IQ4_NL, F_MXFP4, F_IQ4_XS };

/* Weight block: 32 elements (IQ4_NL, MXFP4) or 256 (IQ4_XS), its 4-bit
 * indices in its last 16 bytes (the 32-element ones). */
INLINE size_t wblock_bytes(int f)
{
    return f == F_IQ4_NL ? sizeof(block_iq4_nl) : f == F_MXFP4 ? sizeof(block_mxfp4)
                                                               : sizeof(block_iq4_xs);
}

/* Activation block: Q8_0 (fp16 d, then 32 bytes) or Q8_K for IQ4_XS. */
INLINE size_t xblock_bytes(int f) { return f == F_IQ4_XS ? sizeof(block_q8_K) : sizeof(block_q8_0); }

/* The weight scale of a 32-element block. */
INLINE float wscale32(int f, const uint8_t *blk)
{
    if (f == F_MXFP4)
        return tensor__e8m0_half(blk[0]);
    fp16_t h;
    memcpy(&h, blk, sizeof h);
    return h2f(h);
}

/* name_vec_dot and name_tile (vec_dot_fn, vec_dot_tile_fn) of format f,
 * from the including file's vec_dot and tile. */
#define DEFINE_FORMAT(name, f)                                                           \
    static float name##_vec_dot(const void *w, const void *x, int64_t n)                 \
    {                                                                                    \
        return vec_dot(f, w, x, n);                                                      \
    }                                                                                    \
    static void name##_tile(int64_t n, const void *w, size_t w_stride, int n_w,          \
                            const void *x, size_t x_stride, int n_x, float *y, size_t ldy) \
    {                                                                                    \
        tile(f, n, w, w_stride, n_w, x, x_stride, n_x, y, ldy);                          \
    }

/* The three formats' entries and `entry` (kernels_isa.h), which installs
 * them in a table. */
#define DEFINE_IQ_KERNELS(entry)                                                         \
    DEFINE_FORMAT(iq4_nl, F_IQ4_NL)                                                      \
    DEFINE_FORMAT(mxfp4, F_MXFP4)                                                        \
    DEFINE_FORMAT(iq4_xs, F_IQ4_XS)                                                      \
    void entry(tensor_traits *table)                                                     \
    {                                                                                    \
        table[TT_IQ4_NL].vec_dot = iq4_nl_vec_dot;                                       \
        table[TT_IQ4_NL].vec_dot_tile = iq4_nl_tile;                                     \
        table[TT_MXFP4].vec_dot = mxfp4_vec_dot;                                         \
        table[TT_MXFP4].vec_dot_tile = mxfp4_tile;                                       \
        table[TT_IQ4_XS].vec_dot = iq4_xs_vec_dot;                                       \
        table[TT_IQ4_XS].vec_dot_tile = iq4_xs_tile;                                     \
    }

#endif
