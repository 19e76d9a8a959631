/* fp16.h - conversions between f32 and the 16-bit float formats.
 * Bit-exact with GGUF/ggml: f32 -> f16 rounds to nearest even; f32 -> bf16
 * rounds to nearest even and keeps NaNs quiet. */
#ifndef RC_FP16_H
#define RC_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fp32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0)
            return fp32_from_bits(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return fp32_from_bits(sign | 0x7f800000u | (man << 13));
    return fp32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t fp32_to_fp16(float f)
{
    uint32_t x = fp32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                       /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u)                       /* rounds to >= 65520: Inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {                      /* below 2^-14: subnormal */
        if (ax < 0x33000000u)                    /* below 2^-25: zero */
            return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        int shift = (int)(126 - e);              /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

static inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits((uint32_t)h << 16); }

static inline uint16_t fp32_to_bf16(float f)
{
    uint32_t u = fp32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)         /* NaN: force quiet */
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif
