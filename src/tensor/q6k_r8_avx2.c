/* q6k_r8_avx2.c - AVX2 dot products of Q6_K weights repacked in 8-row
 * groups (TT_Q6_K_R8, layout in q6k_r8.h) against Q8_K activation rows.
 *
 * Per group, super-block and activation row: the 96 bytes of one k give,
 * with two masks and shifts, the 6-bit levels (0..63, unsigned) of
 * elements 4k..4k+3 of any of the half's 4 groups of 32, for the 8 rows
 * (lane r = row r).  VPMADDUBSW against 4 activation bytes broadcast to
 * every lane sums 2 products per 16-bit half; two such (8 elements of a
 * 16-element sub-block) are added in 16 bits (at most 2 * 2 * 63 * 128 =
 * 32256) and VPMADDWD by the rows' sub-block scales (int8, sign-extended
 * into both halves of the lane) widens them into the lane's 32-bit sum.
 * Q6_K's -32 comes off once per super-block from the activations' sums of
 * 16 (bsums) times the scales, 8 VPMADDWD.  So 32 products of 8 rows cost
 * 1 + 1/2 multiplies plus 1/8 for the offsets, where the row-by-row
 * kernels (quant_k_avx2.c) spend 2 per row and a transposing add at a few
 * activation rows and re-pack the 8 rows on every call for more.  The
 * weights of a group are read once, as one forward stream, for up to R8_J
 * activation rows.  Installed on AVX2 CPUs without AVX-VNNI (with it,
 * Q6_K keeps quant_k_avx2.c's VPDPBUSD kernels: quant_avx2.c); on CPUs
 * with AVX-512 VNNI q6k_r8_avx512.c's kernel is installed.
 *
 * Results: the integer sums are exact, and the float chain is krow_dot's
 * for Q6_K (acc = fma(isum, d * d_x, acc), super-block after super-block),
 * so every output has the bits of Q6_K's vec_dot on the same CPU, whatever
 * the batch, tile or thread. */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q6k_r8.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { PF_AHEAD = PREFETCH_BYTES / Q6K_R8_GROUP_BYTES };   /* super-blocks (simd_x86.h) */
enum { R8_J = 4 };   /* activation rows per pass over a group's weights */

/* Bytes a and b of each 32-bit lane of v, sign-extended, as the lane's low
 * and high 16-bit halves: the multipliers of that lane's row for VPMADDWD
 * (a == b: one scale for both halves). */
INLINE __m256i lane_sbytes16(__m256i v, int a, int b)
{
    const char z = (char)0x80;
#define L(o) z, (char)(a + (o)), z, (char)(b + (o))
    const __m256i idx = _mm256_setr_epi8(L(0), L(4), L(8), L(12), L(0), L(4), L(8), L(12));
#undef L
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, idx), 8);
}

/* Levels (0..63) of group gq (0..3) of a half from a ql chunk L (the
 * first of k's two for even gq, the second for odd) and k's qh chunk H:
 * L's nibble gq >> 1 below bits 2 gq, 2 gq + 1 of H.  16-bit shifts
 * move bits between the bytes of a pair only into bits the masks drop. */
INLINE __m256i level(int gq, __m256i L, __m256i H)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i lo = gq < 2 ? _mm256_and_si256(L, m4) : _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
    const __m256i hi = gq == 0 ? _mm256_slli_epi16(H, 4)
                     : gq == 1 ? _mm256_slli_epi16(H, 2)
                     : gq == 2 ? H : _mm256_srli_epi16(H, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}

/* The 8 rows of the group at g against J activation rows (x, xs apart),
 * over nb super-blocks; y[j * ldy + r] the results. */
INLINE void group_dot(int J, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
                      float *y, size_t ldy)
{
    __m256 acc[R8_J];
    UNROLL for (int j = 0; j < J; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += Q6K_R8_GROUP_BYTES) {
        prefetch_lines(g + PF_AHEAD * Q6K_R8_GROUP_BYTES, Q6K_R8_GROUP_BYTES);
        __m256i isum[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            isum[j] = _mm256_setzero_si256();
        NO_UNROLL for (int h = 0; h < 2; h++) {
            const uint8_t *gh = g + Q6K_R8_HALF + 768 * h;
            UNROLL for (int gq = 0; gq < 4; gq++) {
                const int loff = 32 * (gq & 1);
                UNROLL for (int t = 0; t < 2; t++) {
                    /* sub-block 8h + 2gq + t: word 2h + gq / 2, byte 2 (gq & 1) + t */
                    const __m256i words = _mm256_loadu_si256(
                        (const __m256i *)(g + Q6K_R8_SC + 32 * (2 * h + (gq >> 1))));
                    const int sb = 2 * (gq & 1) + t;
                    const __m256i scv = lane_sbytes16(words, sb, sb);
                    UNROLL for (int kp = 2 * t; kp < 2 * t + 2; kp++) {
                        const uint8_t *p = gh + 192 * kp;   /* k = 2 kp, then 2 kp + 1 */
                        const __m256i qa = level(gq, _mm256_loadu_si256((const __m256i *)(p + loff)),
                                                 _mm256_loadu_si256((const __m256i *)(p + 64)));
                        const __m256i qb = level(gq, _mm256_loadu_si256((const __m256i *)(p + 96 + loff)),
                                                 _mm256_loadu_si256((const __m256i *)(p + 160)));
                        UNROLL for (int j = 0; j < J; j++) {
                            const int8_t *xq = ((const block_q8_K *)(x + (size_t)j * xs) + b)->qs +
                                               128 * h + 32 * gq + 8 * kp;
                            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(qa, bcast4(xq)),
                                                                 _mm256_maddubs_epi16(qb, bcast4(xq + 4)));
                            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16, scv));
                        }
                    }
                }
            }
        }
        /* Q6_K's -32: 32 times the scales against the activations' sums
         * of 16, sub-blocks 2k and 2k + 1 in one VPMADDWD */
        __m256i off[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            off[j] = _mm256_setzero_si256();
        UNROLL for (int k = 0; k < 8; k++) {
            const __m256i words = _mm256_loadu_si256((const __m256i *)(g + Q6K_R8_SC + 32 * (k >> 1)));
            const __m256i mp = lane_sbytes16(words, 2 * (k & 1), 2 * (k & 1) + 1);
            UNROLL for (int j = 0; j < J; j++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                off[j] = _mm256_add_epi32(off[j], _mm256_madd_epi16(mp, bcast4(&xb->bsums[2 * k])));
            }
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + Q6K_R8_D)));
        UNROLL for (int j = 0; j < J; j++) {
            const __m256 dx = _mm256_set1_ps(((const block_q8_K *)(x + (size_t)j * xs) + b)->d);
            const __m256i is = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(off[j], 5));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv, dx), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < J; j++)
        _mm256_storeu_ps(y + (size_t)j * ldy, acc[j]);
}

/* J activation rows against the group at g; a partial group (nr < 8 of
 * its rows asked for) through a buffer, so no output beyond them is
 * written. */
INLINE void group_rows(int J, int64_t nb, const uint8_t *g, int nr, const uint8_t *x, size_t xs,
                       float *y, size_t ldy)
{
    if (nr == 8) {
        group_dot(J, nb, g, x, xs, y, ldy);
        return;
    }
    float part[R8_J * 8];
    group_dot(J, nb, g, x, xs, part, 8);
    for (int j = 0; j < J; j++)
        memcpy(y + (size_t)j * ldy, part + 8 * j, (size_t)nr * sizeof(float));
}

/* vec_dot_tile (types.h) of TT_Q6_K_R8: w the start of a group, ws Q6_K's
 * row size, n_w rows (the last group may be used in part).  Activation
 * rows go R8_J at a time through all the groups, so a panel's weights are
 * reused from the cache by the next rows while those rows' blocks stay in
 * L1. */
static void q6_K_r8_tile(int64_t n, const void *w, size_t ws, int n_w, const void *x,
                         size_t xs, int n_x, float *y, size_t ldy)
{
    const int64_t nb = n / QK_K;
    for (int j0 = 0; j0 < n_x; j0 += R8_J) {
        const int J = n_x - j0 < R8_J ? n_x - j0 : R8_J;
        const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * xs;
        for (int i = 0; i < n_w; i += 8) {
            const uint8_t *g = (const uint8_t *)w + (size_t)i * ws;
            const int nr = n_w - i < 8 ? n_w - i : 8;
            float *yo = y + (size_t)j0 * ldy + i;
            switch (J) {
            case 1: group_rows(1, nb, g, nr, xj, xs, yo, ldy); break;
            case 2: group_rows(2, nb, g, nr, xj, xs, yo, ldy); break;
            case 3: group_rows(3, nb, g, nr, xj, xs, yo, ldy); break;
            default: group_rows(R8_J, nb, g, nr, xj, xs, yo, ldy); break;
            }
        }
    }
}

void tensor__kernels_q6k_r8_avx2(tensor_traits *table)
{
    table[TT_Q6_K_R8].vec_dot_tile = q6_K_r8_tile;
}
