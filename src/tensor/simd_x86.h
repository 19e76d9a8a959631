/* simd_x86.h - internal to src/tensor: small helpers shared by the x86-64
 * kernel files (quant_avx2.c, quant_k_avx2.c, quant_tile_avx2.c,
 * quant_avx512.c, attend_avx2.c).  Static inline, so each file compiles them
 * with its own instruction-set flags; include after <immintrin.h>. */
#ifndef RC_SIMD_X86_H
#define RC_SIMD_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tensor/types.h"

#define INLINE static inline __attribute__((always_inline))

INLINE float h2f(fp16_t h) { return _cvtsh_ss(h); }

/* The sum of 8 floats, always in this order (the golden tests lean on
 * llama.cpp's order, which this is). */
INLINE float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Unaligned scalars inside packed blocks. */
INLINE float load_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

INLINE int32_t load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
