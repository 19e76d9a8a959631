/* quant_klow_avx2.c - AVX2 dot products of the low-bit K-quants Q2_K and
 * Q3_K against Q8_K activations (layouts in quant_klow_ref.c): vec_dot and
 * vec_dot_tile.
 *
 * Compiled with -mavx2 -mfma -mf16c; installed by tensor__kernels_avx2
 * (quant_avx2.c) through tensor__kernels_klow_avx2.  Decoding (to_float,
 * dot_f32) stays the reference's.
 *
 * Integer sums: the 2- or 3-bit levels, unsigned (Q3_K's q + 4, 0..7), meet
 * the activation bytes in maddubs (16-bit pair sums, at most 2 * 7 * 128),
 * and madd multiplies them by the sub-block's scale while widening to 32
 * bits; 32 elements are two sub-blocks, one per 128-bit half.  Q2_K's
 * minimums and Q3_K's -4 come from the activations' bsums, which are sums
 * over exactly these 16-element sub-blocks.
 *
 * Float steps, per super-block B in block order from 0 (both entries, so
 * vec_dot_tile gives vec_dot's bits, as types.h asks):
 *   Q2_K: acc = fma(isum_B, d_w d_x, acc); acc = fma(-summ_B, dmin_w d_x, acc)
 *   Q3_K: acc = fma(isum_B, d_w d_x, acc)
 *
 * The tile kernel unpacks each weight super-block once for up to 8
 * activation rows (prompts and batched decode), which is where the time of
 * a 2- and 3-bit format goes: its unpacking costs more than its products.
 *
 * AVX-512: quant_klow_avx512.c replaces both entries where the CPU has
 * AVX-512 F, BW, VL and VNNI, with these kernels' bits.  Measured on an
 * Intel Xeon (BENCHMARKS.md) it pays at every batch size: a zmm holds one
 * sub-block per 128-bit lane, so the scales spread by in-lane byte
 * shuffles, and VNNI folds the products (Q2_K's scale goes into the weight
 * bytes); a product took about half this file's time for 1 to 512
 * activation rows (0.6x for Q2_K's one row in cache; 0.3x for Q3_K's,
 * where this file unpacks the scales in scalar code).
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { KL_Q2, KL_Q3 };
enum { KL_ROWS = 8 };     /* activation rows per pass of the tile kernel */

/* Unsigned levels of elements 32c..32c+31 (c = 4h + j): bits 2j of
 * qs[32h..32h+31], and for Q3_K bit 4h + j of hmask[0..31] as bit 2 (a
 * 16-bit shift by less than 8 leaves bit k of each byte in its bit 0). */
INLINE __m256i kl_levels(int kt, const uint8_t *qs, const uint8_t *hmask, int c)
{
    const int h = c >> 2, j = c & 3;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
    __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
    if (kt == KL_Q3) {
        const __m256i hm = _mm256_loadu_si256((const __m256i *)hmask);
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hm, c), _mm256_set1_epi8(1));
        u = _mm256_or_si256(u, _mm256_slli_epi16(bit, 2));
    }
    return u;
}

/* The 16 sub-block scales as 16-bit lanes; Q2_K also its 16 minimums. */
INLINE __m256i kl_scales(int kt, const uint8_t *wb, __m256i *mins)
{
    if (kt == KL_Q2) {
        const block_q2_K *k = (const block_q2_K *)wb;
        const __m128i s = _mm_loadu_si128((const __m128i *)k->scales);
        *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
        return _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(0x0f)));
    }
    int8_t sc[QK_K / 16];
    tensor__q3_K_scales(((const block_q3_K *)wb)->scales, sc);
    *mins = _mm256_setzero_si256();
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
}

/* Scales of sub-blocks 2c (16-bit lanes 0-7) and 2c + 1 (lanes 8-15) from
 * the 16 of kl_scales: one byte shuffle of the half that holds them. */
INLINE __m256i kl_pair(__m256i scales, int c)
{
    const __m256i half = c < 4 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                               : _mm256_permute2x128_si256(scales, scales, 0x11);
    const int a = 4 * (c & 3), b = a + 2;
    const __m256i idx = _mm256_set_m128i(_mm_set1_epi16((short)((b + 1) << 8 | b)),
                                         _mm_set1_epi16((short)((a + 1) << 8 | a)));
    return _mm256_shuffle_epi8(half, idx);
}

/* isum (and Q2_K's summ) of super-block b of one weight row against J
 * activation rows x_j = x + j * xs (bytes; row starts). */
INLINE void kl_block(int kt, int J, const uint8_t *wb, const uint8_t *x, size_t xs, int64_t b,
                     int *isum, int *summ)
{
    const uint8_t *qs = kt == KL_Q2 ? ((const block_q2_K *)wb)->qs : ((const block_q3_K *)wb)->qs;
    const uint8_t *hm = kt == KL_Q3 ? ((const block_q3_K *)wb)->hmask : NULL;
    __m256i mins;
    const __m256i scales = kl_scales(kt, wb, &mins);
    __m256i acc[KL_ROWS];
    UNROLL for (int j = 0; j < J; j++)
        acc[j] = _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 8; c++) {
        const __m256i u = kl_levels(kt, qs, hm, c), scv = kl_pair(scales, c);
        UNROLL for (int j = 0; j < J; j++) {
            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * c));
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scv));
        }
    }
    UNROLL for (int j = 0; j < J; j++) {
        const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
        const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
        if (kt == KL_Q3) {
            /* q = u - 4: subtract 4 sum_s sc_s bsums_s */
            isum[j] = hsum_epi32(_mm256_sub_epi32(acc[j], _mm256_slli_epi32(_mm256_madd_epi16(bs, scales), 2)));
            summ[j] = 0;
        } else {
            isum[j] = hsum_epi32(acc[j]);
            summ[j] = hsum_epi32(_mm256_madd_epi16(bs, mins));
        }
    }
}

/* The float steps of one super-block for one output (see the top). */
INLINE __m128 kl_step(int kt, const uint8_t *wb, const block_q8_K *xb, int isum, int summ, __m128 acc)
{
    fp16_t dh;
    memcpy(&dh, kt == KL_Q2 ? wb + offsetof(block_q2_K, d) : wb + offsetof(block_q3_K, d), sizeof dh);
    acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), _mm_set_ss(h2f(dh) * xb->d), acc);
    if (kt == KL_Q2) {
        memcpy(&dh, wb + offsetof(block_q2_K, dmin), sizeof dh);
        acc = _mm_fnmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), summ), _mm_set_ss(h2f(dh) * xb->d), acc);
    }
    return acc;
}

INLINE size_t kl_bytes(int kt) { return kt == KL_Q2 ? sizeof(block_q2_K) : sizeof(block_q3_K); }

/* One weight row w against J activation rows (xs apart): y[j * ldy]. */
INLINE void kl_rows(int kt, int J, int64_t n, const uint8_t *w, const uint8_t *x, size_t xs,
                    float *y, size_t ldy)
{
    __m128 acc[KL_ROWS];
    UNROLL for (int j = 0; j < J; j++)
        acc[j] = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *wb = w + (size_t)b * kl_bytes(kt);
        int isum[KL_ROWS], summ[KL_ROWS];
        kl_block(kt, J, wb, x, xs, b, isum, summ);
        UNROLL for (int j = 0; j < J; j++)
            acc[j] = kl_step(kt, wb, (const block_q8_K *)(x + (size_t)j * xs) + b, isum[j],
                             summ[j], acc[j]);
    }
    UNROLL for (int j = 0; j < J; j++)
        y[(size_t)j * ldy] = _mm_cvtss_f32(acc[j]);
}

#define DEFINE_KLFORMAT(name, kt)                                                        \
    static float name##_vec_dot(const void *w, const void *x, int64_t n)                 \
    {                                                                                    \
        float y;                                                                         \
        kl_rows(kt, 1, n, w, x, 0, &y, 0);                                               \
        return y;                                                                        \
    }                                                                                    \
    static void name##_tile(int64_t n, const void *w, size_t ws, int n_w, const void *x, \
                            size_t xs, int n_x, float *y, size_t ldy)                    \
    {                                                                                    \
        TILE_PASSES8(kl_rows, kt, n, w, ws, n_w, x, xs, n_x, y, ldy)                     \
    }

DEFINE_KLFORMAT(q2_K, KL_Q2)
DEFINE_KLFORMAT(q3_K, KL_Q3)

void tensor__kernels_klow_avx2(tensor_traits *table)
{
    table[TT_Q2_K].vec_dot = q2_K_vec_dot;
    table[TT_Q2_K].vec_dot_tile = q2_K_tile;
    table[TT_Q3_K].vec_dot = q3_K_vec_dot;
    table[TT_Q3_K].vec_dot_tile = q3_K_tile;
}
