/* quant_neon.c - arm64 NEON kernels for the active tensor table (types.h):
 * vec_dot of F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (against Q8_0/Q8_1
 * activations) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (against Q8_K), and the
 * activation quantisers of Q8_0, Q8_1, Q8_K.
 *
 * Invariants:
 *   - The activation quantisers give the reference's bytes (quant_ref.c,
 *     quant_kref.c) for every input: the same f32 operations in a different
 *     order only where the result cannot depend on it (max of |x|, integer
 *     sums), FCVTNS for the reference's round-half-to-even, saturating
 *     narrows for its clamps.  A block holding a NaN or an infinity is
 *     handed to the reference code itself.
 *   - The dot products sum the integer products of a block (or sub-block)
 *     exactly, then apply the float scales as the reference does, so they
 *     differ from it only in the order of the float additions.
 *
 * The file is built for plain armv8-a (NEON is part of the base
 * architecture).  Each integer kernel is written once over dot_i8 (16 int8
 * products into four int32 lanes) and instantiated twice: with SMULL/SADALP,
 * and with SDOT in functions compiled for armv8.2-a+dotprod, which
 * tensor__kernels_neon installs only when the CPU probe found the extension.
 * Compilers whose arm_neon.h cannot enable SDOT per function (clang before
 * 16) get the first instance only, unless the whole file is built with it.
 *
 * Sections (the compiler plumbing and shared helpers are in neon_util.h):
 * F32, F16; the 32-element formats; the K-quants; activation quantisers;
 * the installer, which also installs quant_iq_neon.c's kernels.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/neon_util.h"

/* ---- F32, F16 -------------------------------------------------------------
 * The reference rounds each product to f32 and sums in double.  Here the
 * products go into 16 f32 lanes by FMA over chunks of at most 256 elements,
 * and only the chunk sums into a double, so the error does not grow with the
 * length of the row beyond that of one chunk. */

#define F_CHUNK 256

static float f32_vec_dot(const void *w, const void *x, int64_t n)
{
    const float *a = w, *b = x;
    double sum = 0.0;
    int64_t i = 0;
    while (i + 16 <= n) {
        const int64_t end = n - i > F_CHUNK ? i + F_CHUNK : n;
        float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
        for (; i + 16 <= end; i += 16) {
            s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
            s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
            s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
            s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
        }
        sum += vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    }
    for (; i < n; i++)
        sum += (double)(a[i] * b[i]);
    return (float)sum;
}

/* f16 times f16 is exact in f32, so the FMA's single rounding is the sum's. */
static float f16_vec_dot(const void *w, const void *x, int64_t n)
{
    const fp16_t *a = w, *b = x;
    double sum = 0.0;
    int64_t i = 0;
    while (i + 16 <= n) {
        const int64_t end = n - i > F_CHUNK ? i + F_CHUNK : n;
        float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
        for (; i + 16 <= end; i += 16) {
            const float16x8_t a0 = vreinterpretq_f16_u16(vld1q_u16(a + i));
            const float16x8_t a1 = vreinterpretq_f16_u16(vld1q_u16(a + i + 8));
            const float16x8_t b0 = vreinterpretq_f16_u16(vld1q_u16(b + i));
            const float16x8_t b1 = vreinterpretq_f16_u16(vld1q_u16(b + i + 8));
            s0 = vfmaq_f32(s0, vcvt_f32_f16(vget_low_f16(a0)), vcvt_f32_f16(vget_low_f16(b0)));
            s1 = vfmaq_f32(s1, vcvt_high_f32_f16(a0), vcvt_high_f32_f16(b0));
            s2 = vfmaq_f32(s2, vcvt_f32_f16(vget_low_f16(a1)), vcvt_f32_f16(vget_low_f16(b1)));
            s3 = vfmaq_f32(s3, vcvt_high_f32_f16(a1), vcvt_high_f32_f16(b1));
        }
        sum += vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    }
    for (; i < n; i++)
        sum += (double)(f16(a[i]) * f16(b[i]));
    return (float)sum;
}

/* ---- the 32-element formats ------------------------------------------------
 * A block's qs byte j holds element j (low nibble) and j + 16 (high), so
 * the low nibbles meet activations 0..15 and the high ones 16..31.  Each
 * block's integer sum, kept in four lanes, is scaled by d_w * d_x and added
 * to a float vector; Q4_1/Q5_1 add m * s (Q8_1's s = d * sum(q)). */

BODY float q4_0_q8_0(const void *w, const void *x, int64_t n, int dp)
{
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const uint8x16_t q = vld1q_u8(a[i].qs);
        const int8x16_t lo = vsubq_s8(s8(vandq_u8(q, m4)), eight);
        const int8x16_t hi = vsubq_s8(s8(vshrq_n_u8(q, 4)), eight);
        int32x4_t p = dot_i8(dp, vdupq_n_s32(0), lo, vld1q_s8(b[i].qs));
        p = dot_i8(dp, p, hi, vld1q_s8(b[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16(a[i].d) * f16(b[i].d));
    }
    return vaddvq_f32(acc);
}
INSTANCES(q4_0_q8_0)

BODY float q4_1_q8_1(const void *w, const void *x, int64_t n, int dp)
{
    const block_q4_1 *a = w;
    const block_q8_1 *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const uint8x16_t q = vld1q_u8(a[i].qs);
        int32x4_t p = dot_i8(dp, vdupq_n_s32(0), s8(vandq_u8(q, m4)), vld1q_s8(b[i].qs));
        p = dot_i8(dp, p, s8(vshrq_n_u8(q, 4)), vld1q_s8(b[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16(a[i].d) * f16(b[i].d));
        summ += f16(a[i].m) * f16(b[i].s);
    }
    return vaddvq_f32(acc) + summ;
}
INSTANCES(q4_1_q8_1)

/* The fifth bits of 16 elements, 0x10 in each byte whose bit is set: bytes
 * 0-7 test the bits of qh[0], bytes 8-15 those of qh[1]; `bit` holds
 * 1, 2, 4 .. 128 twice. */
static inline uint8x16_t q5_fifth_bits(const uint8_t qh[2], uint8x16_t bit)
{
    const uint8x16_t v = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    return vandq_u8(vtstq_u8(v, bit), vdupq_n_u8(0x10));
}

static const uint8_t bit_of_byte[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                        1, 2, 4, 8, 16, 32, 64, 128};

BODY float q5_0_q8_0(const void *w, const void *x, int64_t n, int dp)
{
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), bit = vld1q_u8(bit_of_byte);
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const uint8x16_t q = vld1q_u8(a[i].qs);
        const uint8x16_t lo = vorrq_u8(vandq_u8(q, m4), q5_fifth_bits(a[i].qh, bit));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), q5_fifth_bits(a[i].qh + 2, bit));
        int32x4_t p = dot_i8(dp, vdupq_n_s32(0), vsubq_s8(s8(lo), sixteen), vld1q_s8(b[i].qs));
        p = dot_i8(dp, p, vsubq_s8(s8(hi), sixteen), vld1q_s8(b[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16(a[i].d) * f16(b[i].d));
    }
    return vaddvq_f32(acc);
}
INSTANCES(q5_0_q8_0)

BODY float q5_1_q8_1(const void *w, const void *x, int64_t n, int dp)
{
    const block_q5_1 *a = w;
    const block_q8_1 *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), bit = vld1q_u8(bit_of_byte);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const uint8x16_t q = vld1q_u8(a[i].qs);
        const uint8x16_t lo = vorrq_u8(vandq_u8(q, m4), q5_fifth_bits(a[i].qh, bit));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), q5_fifth_bits(a[i].qh + 2, bit));
        int32x4_t p = dot_i8(dp, vdupq_n_s32(0), s8(lo), vld1q_s8(b[i].qs));
        p = dot_i8(dp, p, s8(hi), vld1q_s8(b[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16(a[i].d) * f16(b[i].d));
        summ += f16(a[i].m) * f16(b[i].s);
    }
    return vaddvq_f32(acc) + summ;
}
INSTANCES(q5_1_q8_1)

BODY float q8_0_q8_0(const void *w, const void *x, int64_t n, int dp)
{
    const block_q8_0 *a = w, *b = x;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32x4_t p = dot_i8(dp, vdupq_n_s32(0), vld1q_s8(a[i].qs), vld1q_s8(b[i].qs));
        p = dot_i8(dp, p, vld1q_s8(a[i].qs + 16), vld1q_s8(b[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16(a[i].d) * f16(b[i].d));
    }
    return vaddvq_f32(acc);
}
INSTANCES(q8_0_q8_0)

/* ---- the K-quants -----------------------------------------------------------
 * Per super-block the integer sums of the sub-blocks are exact, and the
 * float part is the reference's expression, so these agree with the
 * reference up to the order of the super-blocks' float additions (and, for
 * one super-block, exactly). */

/* Q4_K/Q5_K's eight 6-bit scales and mins from the 12 packed bytes, taken
 * four at a time as 32-bit words (the layout is in quant_kref.c): words
 * 0 and 1 hold sc[0..3] and m[0..3] in their low six bits of each byte and
 * the top two bits of sc[4..7] and m[4..7] above; word 2 the low nibbles
 * of sc[4..7] and, in the high nibbles, those of m[4..7]. */
static inline void k4_unpack(const uint8_t s[K_SCALE_SIZE], uint8x8_t *sc, uint8x8_t *m)
{
    uint32_t w[3];
    memcpy(w, s, sizeof w);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    const uint32_t sc_lo = w[0] & lo6, m_lo = w[1] & lo6;
    const uint32_t sc_hi = (w[2] & lo4) | ((w[0] >> 6) & lo2) << 4;
    const uint32_t m_hi = ((w[2] >> 4) & lo4) | ((w[1] >> 6) & lo2) << 4;
    *sc = vcreate_u8((uint64_t)sc_hi << 32 | sc_lo);
    *m = vcreate_u8((uint64_t)m_hi << 32 | m_lo);
}

/* sum_j m[j] * (the sum of sub-block j's 32 activations, two bsums). */
static inline int32_t k4_min_sum(const block_q8_K *b, uint8x8_t m)
{
    const int16x8_t ysum = vpaddq_s16(vld1q_s16(b->bsums), vld1q_s16(b->bsums + 8));
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(m));
    const int32x4_t t = vmlal_high_s16(vmull_s16(vget_low_s16(ysum), vget_low_s16(m16)),
                                       ysum, m16);
    return vaddvq_s32(t);
}

/* sum_j sc[j] * s[j] for the sub-block sums s[0..3] in s03, s[4..7] in s47. */
static inline int32_t k4_scaled_sum(int32x4_t s03, int32x4_t s47, uint8x8_t sc)
{
    const int16x8_t sc16 = vreinterpretq_s16_u16(vmovl_u8(sc));
    const int32x4_t t = vmulq_s32(s03, vmovl_s16(vget_low_s16(sc16)));
    return vaddvq_s32(vmlaq_s32(t, s47, vmovl_high_s16(sc16)));
}

/* Two sub-blocks of 32 levels (lo0 lo1: elements 0..31 of y; hi0 hi1: 32..63)
 * against y: their two sums, each spread over two lanes (pair_sums). */
BODY int32x4_t k4_two_subblocks(int dp, uint8x16_t lo0, uint8x16_t lo1, uint8x16_t hi0,
                                uint8x16_t hi1, const int8_t *y)
{
    const int32x4_t zero = vdupq_n_s32(0);
    int32x4_t lo = dot_i8(dp, zero, s8(lo0), vld1q_s8(y));
    lo = dot_i8(dp, lo, s8(lo1), vld1q_s8(y + 16));
    int32x4_t hi = dot_i8(dp, zero, s8(hi0), vld1q_s8(y + 32));
    hi = dot_i8(dp, hi, s8(hi1), vld1q_s8(y + 48));
    return pair_sums(lo, hi);
}

/* qs[32p + l]: element 64p + l in the low nibble (sub-block 2p),
 * 64p + 32 + l in the high one (sub-block 2p + 1). */
BODY int32x4_t q4_K_part(int dp, const uint8_t *qs, const int8_t *y)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
    return k4_two_subblocks(dp, vandq_u8(q0, m4), vandq_u8(q1, m4),
                            vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4), y);
}

BODY float q4_K_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_q4_K *a = w;
    const block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8x8_t sc, m;
        k4_unpack(a[i].scales, &sc, &m);
        const uint8_t *q = a[i].qs;
        const int8_t *y = b[i].qs;
        const int32x4_t s03 = pair_sums(q4_K_part(dp, q, y), q4_K_part(dp, q + 32, y + 64));
        const int32x4_t s47 = pair_sums(q4_K_part(dp, q + 64, y + 128),
                                        q4_K_part(dp, q + 96, y + 192));
        const int32_t sumi = k4_scaled_sum(s03, s47, sc), summ = k4_min_sum(&b[i], m);
        const float d = f16(a[i].d) * b[i].d, dmin = f16(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}
INSTANCES(q4_K_q8_K)

/* As Q4_K, plus the fifth bit of element 64p + l (+ 32) at bit 2p (2p + 1)
 * of qh[l]; h0 h1 are qh[0..31] already shifted right by 2p. */
BODY int32x4_t q5_K_part(int dp, const uint8_t *qs, uint8x16_t h0, uint8x16_t h1,
                         const int8_t *y)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(0x10);
    const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
    return k4_two_subblocks(dp,
                            vorrq_u8(vandq_u8(q0, m4), vandq_u8(vshlq_n_u8(h0, 4), b4)),
                            vorrq_u8(vandq_u8(q1, m4), vandq_u8(vshlq_n_u8(h1, 4), b4)),
                            vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vshlq_n_u8(h0, 3), b4)),
                            vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vshlq_n_u8(h1, 3), b4)), y);
}

BODY float q5_K_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_q5_K *a = w;
    const block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8x8_t sc, m;
        k4_unpack(a[i].scales, &sc, &m);
        const uint8_t *q = a[i].qs;
        const int8_t *y = b[i].qs;
        const uint8x16_t h0 = vld1q_u8(a[i].qh), h1 = vld1q_u8(a[i].qh + 16);
        const int32x4_t s03 = pair_sums(
            q5_K_part(dp, q, h0, h1, y),
            q5_K_part(dp, q + 32, vshrq_n_u8(h0, 2), vshrq_n_u8(h1, 2), y + 64));
        const int32x4_t s47 = pair_sums(
            q5_K_part(dp, q + 64, vshrq_n_u8(h0, 4), vshrq_n_u8(h1, 4), y + 128),
            q5_K_part(dp, q + 96, vshrq_n_u8(h0, 6), vshrq_n_u8(h1, 6), y + 192));
        const int32_t sumi = k4_scaled_sum(s03, s47, sc), summ = k4_min_sum(&b[i], m);
        const float d = f16(a[i].d) * b[i].d, dmin = f16(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}
INSTANCES(q5_K_q8_K)

/* Two groups of 16 Q6_K levels (0..63 for the values -32..31) against
 * y[0..15] and y[16..31]: their two sums, each spread over two lanes. */
BODY int32x4_t q6_K_two(int dp, uint8x16_t q0, uint8x16_t q1, const int8_t *y)
{
    const int8x16_t k32 = vdupq_n_s8(32);
    const int32x4_t zero = vdupq_n_s32(0);
    return pair_sums(dot_i8(dp, zero, vsubq_s8(s8(q0), k32), vld1q_s8(y)),
                     dot_i8(dp, zero, vsubq_s8(s8(q1), k32), vld1q_s8(y + 16)));
}

/* Q6_K, per half h of the block: element 128h + 32g + l has its low
 * nibble in ql[64h + l + 32 (g & 1)] (low nibble for g < 2, high for g >= 2)
 * and its top two bits at bit 2g of qh[32h + l]; each 16 elements share one
 * int8 scale, index 8h + 2g (+ 1 for l >= 16). */
BODY float q6_K_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30), m3 = vdupq_n_u8(0x03);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t t = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = a[i].ql + 64 * h, *qh = a[i].qh + 32 * h;
            const int8_t *y = b[i].qs + 128 * h;
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
            const uint8x16_t l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
            const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            const int32x4_t g0 = q6_K_two(dp,
                vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(h0, m3), 4)),
                vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(h1, m3), 4)), y);
            const int32x4_t g1 = q6_K_two(dp,
                vorrq_u8(vandq_u8(l2, m4), vandq_u8(vshlq_n_u8(h0, 2), m30)),
                vorrq_u8(vandq_u8(l3, m4), vandq_u8(vshlq_n_u8(h1, 2), m30)), y + 32);
            const int32x4_t g2 = q6_K_two(dp,
                vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(h0, m30)),
                vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(h1, m30)), y + 64);
            const int32x4_t g3 = q6_K_two(dp,
                vorrq_u8(vshrq_n_u8(l2, 4), vandq_u8(vshrq_n_u8(h0, 2), m30)),
                vorrq_u8(vshrq_n_u8(l3, 4), vandq_u8(vshrq_n_u8(h1, 2), m30)), y + 96);
            const int16x8_t sc = vmovl_s8(vld1_s8(a[i].scales + 8 * h));
            t = vmlaq_s32(t, pair_sums(g0, g1), vmovl_s16(vget_low_s16(sc)));
            t = vmlaq_s32(t, pair_sums(g2, g3), vmovl_high_s16(sc));
        }
        sum += f16(a[i].d) * b[i].d * (float)vaddvq_s32(t);
    }
    return sum;
}
INSTANCES(q6_K_q8_K)

/* Q2_K and Q3_K (layouts in quant_klow_ref.c): element 128h + 32j + l has
 * its 2 low level bits at bits 2j of qs[32h + l] and, in Q3_K, its third
 * at bit 4h + j of hmask[l]; 16 elements share a scale.  s[k] receives the
 * sums of sub-blocks 4k..4k+3, with Q3_K's levels taken signed (-4..3). */
BODY void klow_sums(int dp, const uint8_t *qs, const uint8_t *hmask, const int8_t *y,
                    int32x4_t s[4])
{
    const uint8x16_t m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);
    const int8x16_t four = vdupq_n_s8(4);
    const int32x4_t zero = vdupq_n_s32(0);
    const uint8x16_t h0 = hmask ? vld1q_u8(hmask) : vdupq_n_u8(0);
    const uint8x16_t h1 = hmask ? vld1q_u8(hmask + 16) : vdupq_n_u8(0);
    for (int h = 0; h < 2; h++) {
        const uint8x16_t q0 = vld1q_u8(qs + 32 * h), q1 = vld1q_u8(qs + 32 * h + 16);
        int32x4_t part[8];
        for (int j = 0; j < 4; j++) {
            /* variable shifts (VSHL by a negative count): the loop need
             * not be unrolled for the counts to be immediates */
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * j));
            int8x16_t a = s8(vandq_u8(vshlq_u8(q0, sh), m3)), b = s8(vandq_u8(vshlq_u8(q1, sh), m3));
            if (hmask) {
                const int8x16_t hs = vdupq_n_s8((int8_t)-(4 * h + j));
                a = vsubq_s8(vorrq_s8(a, s8(vshlq_n_u8(vandq_u8(vshlq_u8(h0, hs), one), 2))), four);
                b = vsubq_s8(vorrq_s8(b, s8(vshlq_n_u8(vandq_u8(vshlq_u8(h1, hs), one), 2))), four);
            }
            const int8_t *yj = y + 128 * h + 32 * j;
            part[2 * j] = dot_i8(dp, zero, a, vld1q_s8(yj));
            part[2 * j + 1] = dot_i8(dp, zero, b, vld1q_s8(yj + 16));
        }
        s[2 * h] = pair_sums(pair_sums(part[0], part[1]), pair_sums(part[2], part[3]));
        s[2 * h + 1] = pair_sums(pair_sums(part[4], part[5]), pair_sums(part[6], part[7]));
    }
}

/* sum_s sc[s] * s[s / 4] lane s % 4, for 16 signed 16-bit scales. */
static inline int32_t klow_scaled_sum(const int32x4_t s[4], int16x8_t lo, int16x8_t hi)
{
    int32x4_t t = vmulq_s32(s[0], vmovl_s16(vget_low_s16(lo)));
    t = vmlaq_s32(t, s[1], vmovl_high_s16(lo));
    t = vmlaq_s32(t, s[2], vmovl_s16(vget_low_s16(hi)));
    return vaddvq_s32(vmlaq_s32(t, s[3], vmovl_high_s16(hi)));
}

BODY float q2_K_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_q2_K *a = w;
    const block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t s[4];
        klow_sums(dp, a[i].qs, NULL, b[i].qs, s);
        const uint8x16_t sc = vld1q_u8(a[i].scales);
        const int16x8_t sc_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vandq_u8(sc, vdupq_n_u8(0x0f)))));
        const int16x8_t sc_hi = vreinterpretq_s16_u16(vmovl_high_u8(vandq_u8(sc, vdupq_n_u8(0x0f))));
        const int16x8_t m_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(sc, 4))));
        const int16x8_t m_hi = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8(sc, 4)));
        const int16x8_t y_lo = vld1q_s16(b[i].bsums), y_hi = vld1q_s16(b[i].bsums + 8);
        int32x4_t tm = vmull_s16(vget_low_s16(y_lo), vget_low_s16(m_lo));
        tm = vmlal_high_s16(tm, y_lo, m_lo);
        tm = vmlal_s16(tm, vget_low_s16(y_hi), vget_low_s16(m_hi));
        tm = vmlal_high_s16(tm, y_hi, m_hi);
        const int32_t sumi = klow_scaled_sum(s, sc_lo, sc_hi), summ = vaddvq_s32(tm);
        const float d = f16(a[i].d) * b[i].d, dmin = f16(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}
INSTANCES(q2_K_q8_K)

BODY float q3_K_q8_K(const void *w, const void *x, int64_t n, int dp)
{
    const block_q3_K *a = w;
    const block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t s[4];
        klow_sums(dp, a[i].qs, a[i].hmask, b[i].qs, s);
        int8_t sc[QK_K / 16];
        tensor__q3_K_scales(a[i].scales, sc);
        const int8x16_t sc8 = vld1q_s8(sc);
        const int32_t sumi = klow_scaled_sum(s, vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8));
        sum += f16(a[i].d) * b[i].d * (float)sumi;
    }
    return sum;
}
INSTANCES(q3_K_q8_K)

/* ---- activation quantisers --------------------------------------------------
 * The reference computes q = round_half_even(x * id) clamped to the int8
 * range; here FMUL gives the same product, FCVTNS the same rounding (and 0
 * for NaN, saturation for huge values), SQXTN twice the same clamp. */

static inline int8x16_t round_i8x16(float32x4x4_t v, float id)
{
    const int16x8_t lo = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v.val[0], id))),
                                      vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v.val[1], id))));
    const int16x8_t hi = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v.val[2], id))),
                                      vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v.val[3], id))));
    return vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
}

/* Lane-wise max |x| of 16 elements; NaN in a lane when one of its elements
 * is NaN (FMAX propagates NaNs where the reference's fmaxf skips them: the
 * callers hand such blocks to the reference). */
static inline float32x4_t abs_max16(float32x4x4_t v)
{
    return vmaxq_f32(vmaxq_f32(vabsq_f32(v.val[0]), vabsq_f32(v.val[1])),
                     vmaxq_f32(vabsq_f32(v.val[2]), vabsq_f32(v.val[3])));
}

static void q8_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        const float32x4x4_t v0 = vld1q_f32_x4(src), v1 = vld1q_f32_x4(src + 16);
        const float amax = vmaxvq_f32(vmaxq_f32(abs_max16(v0), abs_max16(v1)));
        if (!(amax <= FLT_MAX)) {                /* NaN or Inf */
            tensor__ref_q8_0.from_float(src, &b[i], QK8_0);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = fp32_to_fp16(d);
        vst1q_s8(b[i].qs, round_i8x16(v0, id));
        vst1q_s8(b[i].qs + 16, round_i8x16(v1, id));
    }
}

static void q8_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        const float32x4x4_t v0 = vld1q_f32_x4(src), v1 = vld1q_f32_x4(src + 16);
        const float amax = vmaxvq_f32(vmaxq_f32(abs_max16(v0), abs_max16(v1)));
        if (!(amax <= FLT_MAX)) {
            tensor__ref_q8_1.from_float(src, &b[i], QK8_1);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = fp32_to_fp16(d);
        const int8x16_t q0 = round_i8x16(v0, id), q1 = round_i8x16(v1, id);
        vst1q_s8(b[i].qs, q0);
        vst1q_s8(b[i].qs + 16, q1);
        const int sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        /* the f32 d, as the reference */
        b[i].s = fp32_to_fp16((float)sum * d);
    }
}

/* Q8_K's scale comes from the element of largest magnitude with its sign,
 * the first such element in the reference's scan.  max and min of the
 * block tell it apart unless both +amax and -amax occur; that case scans. */
static void q8_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float32x4_t vmax = vld1q_f32(src), vmin = vmax, vamax = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) {
            const float32x4_t v = vld1q_f32(src + j);
            vamax = vmaxq_f32(vamax, vabsq_f32(v));     /* NaN as in abs_max16 */
            vmax = vmaxq_f32(vmax, v);
            vmin = vminq_f32(vmin, v);
        }
        const float amax = vmaxvq_f32(vamax);
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float max = 0.0f, iscale = INFINITY;
        if (amax <= FLT_MAX) {
            const float hi = vmaxvq_f32(vmax), lo = vminvq_f32(vmin);
            max = hi == amax ? hi : lo;
            if (hi == amax && -lo == amax)
                for (int j = 0; j < QK_K; j++)
                    if (src[j] == amax || src[j] == -amax) {
                        max = src[j];
                        break;
                    }
            iscale = -127.0f / max;
        }
        /* A NaN or Inf in the block, or an amax so small (below 127 /
         * FLT_MAX) that iscale overflows: the reference's rounding then
         * works on infinities, which FCVTNS saturates differently. */
        if (!(fabsf(iscale) <= FLT_MAX)) {
            tensor__ref_q8_K.from_float(src, &b[i], QK_K);
            continue;
        }
        for (int k = 0; k < QK_K / 16; k++) {
            const int8x16_t q = round_i8x16(vld1q_f32_x4(src + 16 * k), iscale);
            vst1q_s8(b[i].qs + 16 * k, q);
            b[i].bsums[k] = vaddlvq_s8(q);
        }
        b[i].d = 1.0f / iscale;
    }
}

/* ---- the installer ---------------------------------------------------------- */

void tensor__kernels_neon(tensor_traits *table, int has_dotprod)
{
    tensor__kernels_iq_neon(table, has_dotprod);
    table[TT_F32].vec_dot = f32_vec_dot;
    table[TT_F16].vec_dot = f16_vec_dot;
    table[TT_Q8_0].from_float = q8_0_from_float;
    table[TT_Q8_1].from_float = q8_1_from_float;
    table[TT_Q8_K].from_float = q8_K_from_float;
#if HAVE_SDOT
    if (has_dotprod) {
        table[TT_Q4_0].vec_dot = q4_0_q8_0_sdot;
        table[TT_Q4_1].vec_dot = q4_1_q8_1_sdot;
        table[TT_Q5_0].vec_dot = q5_0_q8_0_sdot;
        table[TT_Q5_1].vec_dot = q5_1_q8_1_sdot;
        table[TT_Q8_0].vec_dot = q8_0_q8_0_sdot;
        table[TT_Q2_K].vec_dot = q2_K_q8_K_sdot;
        table[TT_Q3_K].vec_dot = q3_K_q8_K_sdot;
        table[TT_Q4_K].vec_dot = q4_K_q8_K_sdot;
        table[TT_Q5_K].vec_dot = q5_K_q8_K_sdot;
        table[TT_Q6_K].vec_dot = q6_K_q8_K_sdot;
        return;
    }
#endif
    (void)has_dotprod;
    table[TT_Q4_0].vec_dot = q4_0_q8_0_mull;
    table[TT_Q4_1].vec_dot = q4_1_q8_1_mull;
    table[TT_Q5_0].vec_dot = q5_0_q8_0_mull;
    table[TT_Q5_1].vec_dot = q5_1_q8_1_mull;
    table[TT_Q8_0].vec_dot = q8_0_q8_0_mull;
    table[TT_Q2_K].vec_dot = q2_K_q8_K_mull;
    table[TT_Q3_K].vec_dot = q3_K_q8_K_mull;
    table[TT_Q4_K].vec_dot = q4_K_q8_K_mull;
    table[TT_Q5_K].vec_dot = q5_K_q8_K_mull;
    table[TT_Q6_K].vec_dot = q6_K_q8_K_mull;
}

#endif /* __aarch64__ */
