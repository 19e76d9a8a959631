/* quant_ref.h - internal to src/tensor: the reference (scalar) traits of
 * each type racimo computes with, and helpers the reference files share.
 *
 * quant_ref.c defines the float and 32-element ("legacy") formats,
 * quant_kref.c the 256-element K-quants Q4_K, Q5_K, Q6_K, Q8_K,
 * quant_klow_ref.c the low-bit ones, Q2_K and Q3_K, and quant_iqref.c IQ4_NL,
 * IQ4_XS and MXFP4; types.c puts the entries into the table that types.h
 * exposes.  Nothing outside src/tensor includes this.
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
extern const tensor_traits tensor__ref_q2_K;
extern const tensor_traits tensor__ref_q3_K;
extern const tensor_traits tensor__ref_q4_K;
extern const tensor_traits tensor__ref_q5_K;
extern const tensor_traits tensor__ref_q6_K;
extern const tensor_traits tensor__ref_q8_K;
extern const tensor_traits tensor__ref_iq4_nl;
extern const tensor_traits tensor__ref_iq4_xs;
extern const tensor_traits tensor__ref_mxfp4;

/* quant_iqref.c: the value tables of IQ4_NL/IQ4_XS and of MXFP4 (E2M1
 * doubled), and the 6-bit scale (0..63, offset 32) of IQ4_XS sub-block j. */
extern const int8_t tensor__iq4nl_values[16];
extern const int8_t tensor__mxfp4_values[16];
int tensor__iq4_xs_scale(const block_iq4_xs *b, int j);

/* An E8M0 scale halved, 2^(e - 128), as ggml reads it (e = 255 too); the
 * half makes up for the doubled MXFP4 table.  e 0 and 1 give f32
 * subnormals. */
static inline float tensor__e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

extern const tensor_traits tensor__ref_q4_0_r8;   /* repack.c */
extern const tensor_traits tensor__ref_q4_k_r8;   /* q4k_r8.c */
extern const tensor_traits tensor__ref_q8_0_r8;   /* q8_0_r8.c */
extern const tensor_traits tensor__ref_q6_k_r8;   /* q6k_r8.c */

/* The exact-math dot of any block format: each block of weights decoded to
 * f32 by `to_float`, products summed in f32 in element order. */
float tensor__dot_f32_blocks(to_float_fn to_float, int64_t block_size,
                             size_t block_bytes, const void *w,
                             const float *x, int64_t n);

/* The K-quant weight quantisers' sub-block fits (quant_kref.c):
 * fit_scale_min: x[0..n) ~ scale * l - min with l in 0..nmax, scale and
 *   min >= 0; returns the scale, *the_min the min.
 * fit_scale_sym: x[0..n) ~ scale * l with l in -nmax..nmax-1; the element
 *   of largest magnitude maps to -nmax, so the scale takes its sign. */
float tensor__fit_scale_min(const float *x, int n, int nmax, float *the_min);
float tensor__fit_scale_sym(const float *x, int n, int nmax);

/* Q3_K's 16 sub-block scales, each 6 bits stored with a bias of 32: the
 * low 4 bits of scale s are the low nibble of scales[s] for s < 8 and the
 * high nibble of scales[s - 8] beyond; its top 2 bits are bits 2 (s / 4)
 * and 2 (s / 4) + 1 of scales[8 + s % 4].  out[s] is the signed scale
 * (-32..31).  Shared by the reference and the SIMD files. */
static inline void tensor__q3_K_scales(const uint8_t s[K_SCALE_SIZE], int8_t out[QK_K / 16])
{
    for (int j = 0; j < QK_K / 16; j++) {
        const int lo = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

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
