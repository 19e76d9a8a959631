/* q4k_r8_avx512.c - AVX-512 (F, BW, VL, VNNI) dot products of Q4_K weights
 * repacked in 8-row groups (TT_Q4_K_R8, layout in q4k_r8.h) against Q8_K
 * activation rows: the tile kernel, installed over q4k_r8_avx2.c's.
 *
 * A zmm holds two groups side by side, lane r = weight row r of the pair
 * (rows 0..7 from the first group's 32-byte chunk, 8..15 from the second's),
 * so the 4 activation bytes a chunk meets are one 32-bit broadcast.  Per
 * chunk the low and the high nibbles (sub-blocks 2p and 2p + 1) go straight
 * into 32-bit lanes by VPDPBUSD, 4 products each: the AVX2 kernel's 16-bit
 * adds disappear.  The 6-bit sub-block scale then needs a multiply of a
 * 32-bit sum; a sum of 16 elements (4 chunks) is at most 16 * 15 * 128 =
 * 30720 in magnitude, so it is its own sign-extended 16-bit low half, and
 * VPDPWSSD against (scale, 0) multiplies and adds it in one instruction.
 * The minimums meet the activations' sums of 16 the same way.  A lone
 * group (n_w / 8 odd) runs in the low half with the high half repeating it.
 *
 * Results: the integer sums are exact, and the float chain per lane is
 * q4k_r8_avx2.c's, i.e. krow_dot's (acc = fma(isum, d * d_x, acc), then
 * acc = fnma(summ, dmin * d_x, acc), super-block after super-block), so
 * every output has the bits of Q4_K's vec_dot on the same CPU, whatever
 * the batch, tile or thread. */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q4k_r8.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { R8_J = 8 };   /* activation rows per pass over a pair's weights */
enum { PF_AHEAD = PREFETCH_BYTES / Q4K_R8_GROUP_BYTES };   /* super-blocks (simd_x86.h) */

/* Byte `i` of each 32-bit lane of v, zero-extended: (scale, 0) as the
 * lane's two 16-bit halves, VPDPWSSD's multiplier of a sum held in the low
 * half.  `both`: the byte in both halves, for a pair of 16-bit sums. */
INLINE __m512i lane_byte(__m512i v, int i, int both)
{
    const char a = (char)i, z = (char)0x80, h = both ? a : z;
#define L(o) (char)(a + (o)), z, (char)(h + (both ? (o) : 0)), z
    const __m128i idx = _mm_setr_epi8(L(0), L(4), L(8), L(12));
#undef L
    return _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(idx));
}

/* The rows of the groups at g0, g1 (g1 == g0 for a lone group) against J
 * activation rows (x, xs apart), over nb super-blocks; y[j * ldy + r] the
 * results for the rows r in `rows` (a bit each). */
INLINE void pair_dot(int J, int64_t nb, const uint8_t *g0, const uint8_t *g1, __mmask16 rows,
                     const uint8_t *x, size_t xs, float *y, size_t ldy)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi8(0x3f);
    const __m512i m2 = _mm512_set1_epi8(0x03);
    __m512 acc[R8_J];
    UNROLL for (int j = 0; j < J; j++)
        acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g0 += Q4K_R8_GROUP_BYTES, g1 += Q4K_R8_GROUP_BYTES) {
        prefetch_lines(g0 + PF_AHEAD * Q4K_R8_GROUP_BYTES, Q4K_R8_GROUP_BYTES);
        if (g1 != g0)
            prefetch_lines(g1 + PF_AHEAD * Q4K_R8_GROUP_BYTES, Q4K_R8_GROUP_BYTES);
        /* scales and minimums, lane r = row r, byte s of sc_lo/sc_hi =
         * sub-block s / s + 4 (k4_scales) */
        const __m512i w0 = load_pair(g0, g1, 32);
        const __m512i w1 = load_pair(g0, g1, 64);
        const __m512i w2 = load_pair(g0, g1, 96);
        const __m512i sc_lo = _mm512_and_si512(w0, m6), mn_lo = _mm512_and_si512(w1, m6);
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(w2, m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m2), 4));
        const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m2), 4));
        __m512i isum[R8_J], off[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            isum[j] = off[j] = _mm512_setzero_si512();
        UNROLL for (int p = 0; p < 4; p++) {
            const __m512i s_a = lane_byte(p < 2 ? sc_lo : sc_hi, (2 * p) & 3, 0);
            const __m512i s_b = lane_byte(p < 2 ? sc_lo : sc_hi, (2 * p + 1) & 3, 0);
            UNROLL for (int k0 = 0; k0 < 8; k0 += 4) {
                __m512i sa[R8_J], sb[R8_J];
                UNROLL for (int j = 0; j < J; j++)
                    sa[j] = sb[j] = _mm512_setzero_si512();
                UNROLL for (int k = k0; k < k0 + 4; k++) {
                    const int c = 128 + 32 * (8 * p + k);
                    const __m512i L = load_pair(g0, g1, c);
                    const __m512i wa = _mm512_and_si512(L, m4);
                    const __m512i wb = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
                    UNROLL for (int j = 0; j < J; j++) {
                        const int8_t *xq = ((const block_q8_K *)(x + (size_t)j * xs) + b)->qs;
                        sa[j] = _mm512_dpbusd_epi32(sa[j], wa, bcast4_512(xq + 64 * p + 4 * k));
                        sb[j] = _mm512_dpbusd_epi32(sb[j], wb, bcast4_512(xq + 64 * p + 32 + 4 * k));
                    }
                }
                UNROLL for (int j = 0; j < J; j++)
                    isum[j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum[j], sa[j], s_a), sb[j], s_b);
            }
        }
        /* the minimums against the activations' two sums of 16 per sub-block */
        UNROLL for (int s = 0; s < 8; s++) {
            const __m512i mv = lane_byte(s < 4 ? mn_lo : mn_hi, s & 3, 1);
            UNROLL for (int j = 0; j < J; j++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                off[j] = _mm512_dpwssd_epi32(off[j], mv, bcast4_512(&xb->bsums[2 * s]));
            }
        }
        const __m512 dv = load_pair_ph(g0, g1, 0), dminv = load_pair_ph(g0, g1, 16);
        UNROLL for (int j = 0; j < J; j++) {
            const __m512 dx = _mm512_set1_ps(((const block_q8_K *)(x + (size_t)j * xs) + b)->d);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dv, dx), acc[j]);
            acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(off[j]), _mm512_mul_ps(dminv, dx), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < J; j++)
        _mm512_mask_storeu_ps(y + (size_t)j * ldy, rows, acc[j]);
}

DEFINE_PAIR_TILE(q4_K_r8_tile, pair_dot, R8_J)   /* vec_dot_tile of TT_Q4_K_R8 */

void tensor__kernels_q4k_r8_avx512(tensor_traits *table)
{
    table[TT_Q4_K_R8].vec_dot_tile = q4_K_r8_tile;
}
