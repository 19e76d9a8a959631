/* quant_iq_neon.c - arm64 NEON dot products of the table-valued 4-bit
 * types: IQ4_NL and MXFP4 against Q8_0 activations, IQ4_XS against Q8_K
 * (layouts in quant_iqref.c).  Installed by tensor__kernels_neon
 * (quant_neon.c) through tensor__kernels_iq_neon.
 *
 * TBL (vqtbl1q_s8) turns 16 indices into 16 signed weights from the
 * 16-byte table; dot_i8 (neon_util.h: SMULL/SADALP, or SDOT where the CPU
 * has it) sums their products with the activation bytes exactly.  Each
 * block's integer sum (for IQ4_XS the super-block's, the sub-block scales
 * applied in integers) is scaled by the product of the two scales and added
 * to a float vector, so the results differ from the reference only in the
 * order of the float additions.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/neon_util.h"
#include "tensor/quant_ref.h"

/* The 32 products of the weights indexed by qs (16 bytes, low nibbles then
 * high) with the activation bytes y, into acc's four lanes. */
BODY int32x4_t table_dot32(int dp, int32x4_t acc, int8x16_t table, const uint8_t *qs,
                           const int8_t *y)
{
    const uint8x16_t q = vld1q_u8(qs);
    const int8x16_t lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0f)));
    const int8x16_t hi = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
    acc = dot_i8(dp, acc, lo, vld1q_s8(y));
    return dot_i8(dp, acc, hi, vld1q_s8(y + 16));
}

/* IQ4_NL (mx = 0) or MXFP4 (mx = 1): a scale at the block's start, 16 index
 * bytes at its end. */
BODY float table32_q8_0(const void *w, const void *x, int64_t n, int dp, int mx)
{
    const uint8_t *a = w;
    const block_q8_0 *b = x;
    const size_t wb = mx ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const int8x16_t table = vld1q_s8(mx ? tensor__mxfp4_values : tensor__iq4nl_values);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / 32; i++, a += wb) {
        const int32x4_t p = table_dot32(dp, vdupq_n_s32(0), table, a + wb - 16, b[i].qs);
        float dw;
        if (mx) {
            dw = tensor__e8m0_half(a[0]);
        } else {
            fp16_t h;
            memcpy(&h, a, sizeof h);
            dw = f16(h);
        }
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), dw * f16(b[i].d));
    }
    return vaddvq_f32(acc);
}

BODY float iq4_nl_q8_0(const void *w, const void *x, int64_t n, int dp)
{
    return table32_q8_0(w, x, n, dp, 0);
}
INSTANCES(iq4_nl_q8_0)

BODY float mxfp4_q8_0(const void *w, const void *x, int64_t n, int dp)
{
    return table32_q8_0(w, x, n, dp, 1);
}
INSTANCES(mxfp4_q8_0)

BODY float iq4_xs_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_iq4_xs *a = w;
    const block_q8_K *b = x;
    const int8x16_t table = vld1q_s8(tensor__iq4nl_values);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < QK_K / 32; j++) {
            const int32x4_t p = table_dot32(dp, vdupq_n_s32(0), table, a[i].qs + 16 * j,
                                            b[i].qs + 32 * j);
            sumi = vmlaq_n_s32(sumi, p, tensor__iq4_xs_scale(&a[i], j) - 32);
        }
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(sumi), f16(a[i].d) * b[i].d);
    }
    return vaddvq_f32(acc);
}
INSTANCES(iq4_xs_q8_K)

void tensor__kernels_iq_neon(tensor_traits *table, int has_dotprod)
{
#if HAVE_SDOT
    if (has_dotprod) {
        table[TT_IQ4_NL].vec_dot = iq4_nl_q8_0_sdot;
        table[TT_MXFP4].vec_dot = mxfp4_q8_0_sdot;
        table[TT_IQ4_XS].vec_dot = iq4_xs_q8_K_sdot;
        return;
    }
#endif
    (void)has_dotprod;
    table[TT_IQ4_NL].vec_dot = iq4_nl_q8_0_mull;
    table[TT_MXFP4].vec_dot = mxfp4_q8_0_mull;
    table[TT_IQ4_XS].vec_dot = iq4_xs_q8_K_mull;
}

#endif /* __aarch64__ */
