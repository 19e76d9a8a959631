/* q6k_r8_avx512.c - AVX-512 (F, BW, VL, VNNI) dot products of Q6_K weights
 * repacked in 8-row groups (TT_Q6_K_R8, layout in q6k_r8.h) against Q8_K
 * activation rows: the tile kernel, installed by the AVX-512 set.
 *
 * A zmm holds two groups side by side, lane r = weight row r of the pair
 * (rows 0..7 from the first group's 32-byte chunk, 8..15 from the second's),
 * so the 4 activation bytes a chunk meets are one 32-bit broadcast.  Per k
 * the three chunks (ql low, ql high, qh) are loaded once and give the 6-bit
 * levels (0..63, unsigned) of elements 4k..4k+3 of all four groups of 32 of
 * the half; VPDPBUSD adds their products with the activations into 32-bit
 * lanes, 4 a time, and the 4 k of a 16-element sub-block make one exact sum
 * (at most 16 * 63 * 128 = 129024, too wide for a 16-bit multiply), which
 * VPMULLD multiplies by the rows' signed scales.  Q6_K's -32 comes off once
 * per super-block from the activations' sums of 16 (bsums) times the
 * scales, 8 VPDPWSSD.  A last pair of groups may hold fewer than 16 rows
 * asked for (a lone group runs in both halves; a partial group is computed
 * whole): only the rows asked for are stored.
 *
 * Results: the integer sums are exact, and the float chain per lane is
 * q6k_r8_avx2.c's, i.e. krow_dot's for Q6_K (acc = fma(isum, d * d_x,
 * acc), super-block after super-block), so every output has the bits of
 * Q6_K's vec_dot on the same CPU, whatever the batch, tile or thread. */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q6k_r8.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { PF_AHEAD = PREFETCH_BYTES / Q6K_R8_GROUP_BYTES };   /* super-blocks (simd_x86.h) */
enum { R8_J = 8 };   /* activation rows per pass over a pair's weights */

/* Byte a of each 32-bit lane of v, sign-extended to the lane: the rows'
 * multipliers for VPMULLD. */
INLINE __m512i lane_sbyte32(__m512i v, int a)
{
    const char z = (char)0x80;
#define L(o) z, z, z, (char)(a + (o))
    const __m128i idx = _mm_setr_epi8(L(0), L(4), L(8), L(12));
#undef L
    return _mm512_srai_epi32(_mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(idx)), 24);
}

/* Bytes a and b of each 32-bit lane of v, sign-extended, as the lane's low
 * and high 16-bit halves: VPDPWSSD's multipliers of a pair of bsums. */
INLINE __m512i lane_sbytes16(__m512i v, int a, int b)
{
    const char z = (char)0x80;
#define L(o) z, (char)(a + (o)), z, (char)(b + (o))
    const __m128i idx = _mm_setr_epi8(L(0), L(4), L(8), L(12));
#undef L
    return _mm512_srai_epi16(_mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(idx)), 8);
}

/* Levels (0..63) of group gq (0..3) of a half from k's chunks: ql low L0,
 * ql high L1, qh H (as q6k_r8_avx2.c's level()). */
INLINE __m512i level(int gq, __m512i L0, __m512i L1, __m512i H)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i L = gq & 1 ? L1 : L0;
    const __m512i lo = gq < 2 ? _mm512_and_si512(L, m4) : _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
    const __m512i hi = gq == 0 ? _mm512_slli_epi16(H, 4)
                     : gq == 1 ? _mm512_slli_epi16(H, 2)
                     : gq == 2 ? H : _mm512_srli_epi16(H, 2);
    return _mm512_or_si512(lo, _mm512_and_si512(hi, m30));
}

/* The rows of the groups at g0, g1 (g1 == g0 for a lone group) against J
 * activation rows (x, xs apart), over nb super-blocks; y[j * ldy + r] the
 * results for the rows r in `rows` (a bit each). */
INLINE void pair_dot(int J, int64_t nb, const uint8_t *g0, const uint8_t *g1, __mmask16 rows,
                     const uint8_t *x, size_t xs, float *y, size_t ldy)
{
    __m512 acc[R8_J];
    UNROLL for (int j = 0; j < J; j++)
        acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g0 += Q6K_R8_GROUP_BYTES, g1 += Q6K_R8_GROUP_BYTES) {
        prefetch_lines(g0 + PF_AHEAD * Q6K_R8_GROUP_BYTES, Q6K_R8_GROUP_BYTES);
        if (g1 != g0)
            prefetch_lines(g1 + PF_AHEAD * Q6K_R8_GROUP_BYTES, Q6K_R8_GROUP_BYTES);
        __m512i isum[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            isum[j] = _mm512_setzero_si512();
        NO_UNROLL for (int h = 0; h < 2; h++) {
            const uint8_t *h0 = g0 + Q6K_R8_HALF + 768 * h, *h1 = g1 + Q6K_R8_HALF + 768 * h;
            /* groups gq = par and par + 2 share k's ql chunk: half the
             * sums live at a time (registers) */
            UNROLL for (int t = 0; t < 2; t++)
            UNROLL for (int par = 0; par < 2; par++) {
                __m512i c[2][R8_J];
                UNROLL for (int u = 0; u < 2; u++)
                    UNROLL for (int j = 0; j < J; j++)
                        c[u][j] = _mm512_setzero_si512();
                UNROLL for (int k = 4 * t; k < 4 * t + 4; k++) {
                    const __m512i L = load_pair(h0, h1, 96 * k + 32 * par);
                    const __m512i H = load_pair(h0, h1, 96 * k + 64);
                    UNROLL for (int u = 0; u < 2; u++) {
                        const int gq = par + 2 * u;
                        const __m512i q = level(gq, L, L, H);
                        UNROLL for (int j = 0; j < J; j++) {
                            const int8_t *xq = ((const block_q8_K *)(x + (size_t)j * xs) + b)->qs;
                            c[u][j] = _mm512_dpbusd_epi32(c[u][j], q, bcast4_512(xq + 128 * h + 32 * gq + 4 * k));
                        }
                    }
                }
                /* sub-block 8h + 2gq + t: word 2h + gq / 2, byte 2 (gq & 1) + t */
                UNROLL for (int u = 0; u < 2; u++) {
                    const int gq = par + 2 * u;
                    const __m512i words = load_pair(g0, g1, Q6K_R8_SC + 32 * (2 * h + (gq >> 1)));
                    const __m512i scv = lane_sbyte32(words, 2 * (gq & 1) + t);
                    UNROLL for (int j = 0; j < J; j++)
                        isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(c[u][j], scv));
                }
            }
        }
        /* Q6_K's -32: 32 times the scales against the activations' sums
         * of 16, sub-blocks 2k and 2k + 1 in one VPDPWSSD */
        __m512i off[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            off[j] = _mm512_setzero_si512();
        UNROLL for (int k = 0; k < 8; k++) {
            const __m512i words = load_pair(g0, g1, Q6K_R8_SC + 32 * (k >> 1));
            const __m512i mp = lane_sbytes16(words, 2 * (k & 1), 2 * (k & 1) + 1);
            UNROLL for (int j = 0; j < J; j++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                off[j] = _mm512_dpwssd_epi32(off[j], mp, bcast4_512(&xb->bsums[2 * k]));
            }
        }
        const __m512 dv = load_pair_ph(g0, g1, Q6K_R8_D);
        UNROLL for (int j = 0; j < J; j++) {
            const __m512 dx = _mm512_set1_ps(((const block_q8_K *)(x + (size_t)j * xs) + b)->d);
            const __m512i is = _mm512_sub_epi32(isum[j], _mm512_slli_epi32(off[j], 5));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, dx), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < J; j++)
        _mm512_mask_storeu_ps(y + (size_t)j * ldy, rows, acc[j]);
}

DEFINE_PAIR_TILE(q6_K_r8_tile, pair_dot, R8_J)   /* vec_dot_tile of TT_Q6_K_R8 */

void tensor__kernels_q6k_r8_avx512(tensor_traits *table)
{
    table[TT_Q6_K_R8].vec_dot_tile = q6_K_r8_tile;
}
