/* quant_ref.h - internal to src/tensor: the reference (scalar) traits of
 * each type racimo computes with, and helpers the reference files share.
 *
 * quant_ref.c defines the float and 32-element ("legacy") formats,
 * quant_kref.c the 256-element K-quants; types.c puts the entries into the
 * table that types.h exposes.  Nothing outside src/tensor includes this.
 */
#ifndef RC_TENSOR_QUANT_REF_H
#define RC_TENSOR_QUANT_REF_H

#include <stdint.h>
#include <string.h>

#include "tensor/types.h"

extern const tensor_traits tensor__ref_f32;
extern const tensor_traits tensor__ref_f16;
extern const tensor_traits tensor__ref_bf16;
extern const tensor_traits tensor__ref_q4_0;
extern const tensor_traits tensor__ref_q4_1;
extern const tensor_traits tensor__ref_q5_0;
extern const tensor_traits tensor__ref_q5_1;
extern const tensor_traits tensor__ref_q8_0;
extern const tensor_traits tensor__ref_q8_1;
extern const tensor_traits tensor__ref_q4_K;
extern const tensor_traits tensor__ref_q5_K;
extern const tensor_traits tensor__ref_q6_K;
extern const tensor_traits tensor__ref_q8_K;
extern const tensor_traits tensor__ref_q4_0_r8;   /* repack.c */

/* The exact-math dot of any block format: each block of weights decoded to
 * f32 by `to_float`, products summed in f32 in element order. */
float tensor__dot_f32_blocks(to_float_fn to_float, int64_t block_size,
                             size_t block_bytes, const void *w,
                             const float *x, int64_t n);

/* Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int).
 * Adding 1.5 * 2^23 leaves a float whose last mantissa bit is worth 1, so
 * the addition itself does the rounding; reading the mantissa back never
 * converts a float to an int, so a NaN or Inf gives garbage, not UB. */
static inline int tensor__round_even(float v)
{
    float t = v + 12582912.0f;
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    return (int)(u & 0x007fffffu) - 0x00400000;
}

#endif
