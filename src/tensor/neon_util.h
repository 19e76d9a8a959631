/* neon_util.h - internal to src/tensor: compiler plumbing and helpers
 * shared by the arm64 kernel files (quant_neon.c, quant_iq_neon.c): the
 * per-function SDOT target, dot_i8 over SMULL/SADALP or SDOT, and the
 * INSTANCES macro that makes both instances of a kernel body.  Static
 * inline; include only from files built for aarch64, after <arm_neon.h>. */
#ifndef RC_NEON_UTIL_H
#define RC_NEON_UTIL_H

#include <arm_neon.h>
#include <stdint.h>

#include "tensor/types.h"

#if defined(__ARM_FEATURE_DOTPROD)
#  define HAVE_SDOT 1
#  define SDOT_TARGET
#elif (defined(__clang__) && __clang_major__ >= 16) || \
      (defined(__GNUC__) && !defined(__clang__))
#  define HAVE_SDOT 1
   /* armv8.2-a, not just +dotprod: GCC's arm_neon.h declares vdotq_s32 for
    * armv8.2-a+dotprod, and every CPU with the extension is at least that. */
#  define SDOT_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#else
#  define HAVE_SDOT 0
#endif

/* Kernel bodies take `dp` (use SDOT) as a constant and are inlined into the
 * two instances, so the test on dp disappears. */
#define BODY static inline __attribute__((always_inline))

static inline int32x4_t dot_i8_mull(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    /* |a b| <= 128 * 128 fits the int16 products */
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

#if HAVE_SDOT
SDOT_TARGET static inline int32x4_t dot_i8_sdot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}
#endif

/* acc plus the 16 products a[k] * b[k], spread over acc's four lanes.  Which
 * lane receives which product differs between the instructions: callers
 * only ever use the sum of the four lanes. */
BODY int32x4_t dot_i8(int dp, int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if HAVE_SDOT
    if (dp)
        return dot_i8_sdot(acc, a, b);
#endif
    (void)dp;
    return dot_i8_mull(acc, a, b);
}

/* [a0 + a1, a2 + a3, b0 + b1, b2 + b3]: applied twice, it turns the lane
 * vectors of four sums into one vector of the four sums. */
static inline int32x4_t pair_sums(int32x4_t a, int32x4_t b) { return vpaddq_s32(a, b); }

/* f16 -> f32 by FCVT: exact, as fp16_to_fp32 (they differ only in the
 * payload bits of a signalling NaN). */
static inline float f16(fp16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* Defines the two instances name_mull and name_sdot of the kernel body
 * `name` (a vec_dot_fn with a trailing dp argument). */
#if HAVE_SDOT
#  define INSTANCES(name)                                                    \
    static float name##_mull(const void *w, const void *x, int64_t n)       \
    { return name(w, x, n, 0); }                                            \
    SDOT_TARGET static float name##_sdot(const void *w, const void *x,      \
                                         int64_t n)                         \
    { return name(w, x, n, 1); }
#else
#  define INSTANCES(name)                                                    \
    static float name##_mull(const void *w, const void *x, int64_t n)       \
    { return name(w, x, n, 0); }
#endif

#endif
