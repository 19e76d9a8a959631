/* q4k_r8_avx2.c - AVX2 dot products of Q4_K weights repacked in 8-row
 * groups (TT_Q4_K_R8, layout in q4k_r8.h) against Q8_K activation rows.
 *
 * For each group, super-block and activation row: one 32-byte load gives
 * 4 levels of each of the 8 rows for two sub-blocks (low and high nibbles,
 * 32 elements apart); VPMADDUBSW against 4 activation bytes broadcast to
 * every lane sums 2 products per 16-bit half, the 8 groups of 4 elements
 * of a sub-block are added in 16 bits (at most 8 * 2 * 15 * 128 = 30720),
 * and VPMADDWD by the rows' 6-bit scales widens them into 32-bit lanes, one
 * per weight row.  So 32 products of 8 rows cost 1 + 1/8 multiplies, where
 * the row-by-row kernels (quant_k_avx2.c) spend 2 per row and a transposing
 * add - which is what limits batched decode on CPUs with one vector integer
 * multiplier (Zen 2).  The weights of a group are read once for up to
 * R8_J activation rows.  On CPUs with AVX-512 VNNI q4k_r8_avx512.c's
 * kernel is installed over this one (two groups per zmm, VPDPBUSD).
 *
 * Results: the integer sums are exact, and the float chain is krow_dot's
 * (acc = fma(isum, d * d_x, acc), then acc = fnma(summ, dmin * d_x, acc),
 * super-block after super-block), so every output has the bits of Q4_K's
 * vec_dot on the same CPU, whatever the batch, tile or thread. */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q4k_r8.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { R8_J = 4 };   /* activation rows per pass over a group's weights */
enum { PF_AHEAD = PREFETCH_BYTES / Q4K_R8_GROUP_BYTES };   /* super-blocks (simd_x86.h) */

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* Byte `i` of each 32-bit lane of v as a 16-bit value in the lane's low
 * half and, with `both`, its high half too (else 0): the multiplier of that
 * lane's row for VPMADDWD (both halves hold sums) or VPDPWSSD (the lane
 * holds one sum that fits 16 bits). */
INLINE __m256i lane_byte16(__m256i v, int i, int both)
{
    const char z = (char)0x80;
#define L(o) (char)(i + (o)), z, both ? (char)(i + (o)) : z, z
    return _mm256_shuffle_epi8(v, _mm256_setr_epi8(L(0), L(4), L(8), L(12), L(0), L(4), L(8), L(12)));
#undef L
}

/* Sub-blocks 2p and 2p + 1 (low and high nibbles of chunks 8p..8p + 7) of
 * the group at g against J activation rows' super-block b, times the
 * rows' scales (byte ia / ib of sc's lanes), added to isum[j].  AVX2: 16-bit
 * sums of 2 products, 8 added (at most 8 * 2 * 15 * 128 = 30720), then
 * widened by VPMADDWD. */
INLINE void subs_avx2(int J, int p, const uint8_t *g, const uint8_t *x, size_t xs, int64_t b,
                      __m256i sc, int ia, int ib, __m256i *isum)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i sa[R8_J], sb[R8_J];
    UNROLL for (int j = 0; j < J; j++)
        sa[j] = sb[j] = _mm256_setzero_si256();
    UNROLL for (int k = 0; k < 8; k++) {
        const __m256i L = _mm256_loadu_si256((const __m256i *)(g + 128 + 32 * (8 * p + k)));
        const __m256i wa = _mm256_and_si256(L, m4);
        const __m256i wb = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
        UNROLL for (int j = 0; j < J; j++) {
            const int8_t *xq = ((const block_q8_K *)(x + (size_t)j * xs) + b)->qs;
            sa[j] = _mm256_add_epi16(sa[j], _mm256_maddubs_epi16(wa, bcast4(xq + 64 * p + 4 * k)));
            sb[j] = _mm256_add_epi16(sb[j], _mm256_maddubs_epi16(wb, bcast4(xq + 64 * p + 32 + 4 * k)));
        }
    }
    const __m256i s_a = lane_byte16(sc, ia, 1), s_b = lane_byte16(sc, ib, 1);
    UNROLL for (int j = 0; j < J; j++)
        isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(_mm256_madd_epi16(sa[j], s_a),
                                                             _mm256_madd_epi16(sb[j], s_b)));
}

/* The same with AVX-VNNI: VPDPBUSD sums 4 products into 32 bits, 4 chunks
 * make a sum of 16 elements (at most 16 * 15 * 128 = 30720, so its own
 * sign-extended low half), and VPDPWSSD against (scale, 0) multiplies and
 * adds it: no 16-bit adds. */
VNNI INLINE void subs_vnni(int J, int p, const uint8_t *g, const uint8_t *x, size_t xs, int64_t b,
                           __m256i sc, int ia, int ib, __m256i *isum)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i s_a = lane_byte16(sc, ia, 0), s_b = lane_byte16(sc, ib, 0);
    UNROLL for (int k0 = 0; k0 < 8; k0 += 4) {
        __m256i sa[R8_J], sb[R8_J];
        UNROLL for (int j = 0; j < J; j++)
            sa[j] = sb[j] = _mm256_setzero_si256();
        UNROLL for (int k = k0; k < k0 + 4; k++) {
            const __m256i L = _mm256_loadu_si256((const __m256i *)(g + 128 + 32 * (8 * p + k)));
            const __m256i wa = _mm256_and_si256(L, m4);
            const __m256i wb = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
            UNROLL for (int j = 0; j < J; j++) {
                const int8_t *xq = ((const block_q8_K *)(x + (size_t)j * xs) + b)->qs;
                sa[j] = _mm256_dpbusd_avx_epi32(sa[j], wa, bcast4(xq + 64 * p + 4 * k));
                sb[j] = _mm256_dpbusd_avx_epi32(sb[j], wb, bcast4(xq + 64 * p + 32 + 4 * k));
            }
        }
        UNROLL for (int j = 0; j < J; j++)
            isum[j] = _mm256_dpwssd_avx_epi32(_mm256_dpwssd_avx_epi32(isum[j], sa[j], s_a), sb[j], s_b);
    }
}

/* The 8 rows of the group at g against J activation rows (x, xs apart),
 * over nb super-blocks; y[j * ldy + r] the results.  SUBS: subs_avx2 or
 * subs_vnni. */
#define DEFINE_GROUP(NAME, ATTR, SUBS)                                                        \
    ATTR INLINE void NAME(int J, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,   \
                          float *y, size_t ldy)                                               \
    {                                                                                         \
        const __m256i m4 = _mm256_set1_epi8(0x0f), m6 = _mm256_set1_epi8(0x3f);               \
        const __m256i m2 = _mm256_set1_epi8(0x03);                                            \
        __m256 acc[R8_J];                                                                     \
        UNROLL for (int j = 0; j < J; j++)                                                    \
            acc[j] = _mm256_setzero_ps();                                                     \
        for (int64_t b = 0; b < nb; b++, g += Q4K_R8_GROUP_BYTES) {                           \
            prefetch_lines(g + PF_AHEAD * Q4K_R8_GROUP_BYTES, Q4K_R8_GROUP_BYTES);            \
            /* the 6-bit scales and minimums of the 8 rows, lane r = row r,                   \
             * byte s of sc_lo/sc_hi = sub-block s / s + 4 (k4_scales) */                     \
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(g + 32));                 \
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(g + 64));                 \
            const __m256i w2 = _mm256_loadu_si256((const __m256i *)(g + 96));                 \
            const __m256i sc_lo = _mm256_and_si256(w0, m6), mn_lo = _mm256_and_si256(w1, m6); \
            const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(w2, m4),                   \
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m2), 4));        \
            const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4), \
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m2), 4));        \
            __m256i isum[R8_J], off[R8_J];                                                    \
            UNROLL for (int j = 0; j < J; j++)                                                \
                isum[j] = off[j] = _mm256_setzero_si256();                                    \
            UNROLL for (int p = 0; p < 4; p++)                                                \
                SUBS(J, p, g, x, xs, b, p < 2 ? sc_lo : sc_hi, (2 * p) & 3, (2 * p + 1) & 3, isum); \
            /* the minimums against the activations' sums of 16 */                            \
            UNROLL for (int s = 0; s < 8; s++) {                                              \
                const __m256i mv = lane_byte16(s < 4 ? mn_lo : mn_hi, s & 3, 1);              \
                UNROLL for (int j = 0; j < J; j++) {                                          \
                    const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;      \
                    off[j] = _mm256_add_epi32(off[j], _mm256_madd_epi16(mv, bcast4(&xb->bsums[2 * s]))); \
                }                                                                             \
            }                                                                                 \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));          \
            const __m256 dminv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16))); \
            UNROLL for (int j = 0; j < J; j++) {                                              \
                const __m256 dx = _mm256_set1_ps(((const block_q8_K *)(x + (size_t)j * xs) + b)->d); \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dv, dx), acc[j]); \
                acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off[j]), _mm256_mul_ps(dminv, dx), acc[j]); \
            }                                                                                 \
        }                                                                                     \
        UNROLL for (int j = 0; j < J; j++)                                                    \
            _mm256_storeu_ps(y + (size_t)j * ldy, acc[j]);                                    \
    }

DEFINE_GROUP(group_avx2, , subs_avx2)
DEFINE_GROUP(group_vnni, VNNI, subs_vnni)

/* vec_dot_tile (types.h) of TT_Q4_K_R8: n_w is a multiple of 8 and w the
 * start of a group; ws is Q4_K's row size.  Activation rows go R8_J at a
 * time through all the groups, so a panel's weights are reused from the
 * cache by the next rows while those rows' blocks stay in L1. */
#define DEFINE_TILE(NAME, ATTR, GROUP)                                                        \
    ATTR static void NAME(int64_t n, const void *w, size_t ws, int n_w, const void *x,        \
                          size_t xs, int n_x, float *y, size_t ldy)                           \
    {                                                                                         \
        const int64_t nb = n / QK_K;                                                          \
        for (int j0 = 0; j0 < n_x; j0 += R8_J) {                                              \
            const int J = n_x - j0 < R8_J ? n_x - j0 : R8_J;                                  \
            const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * xs;                         \
            for (int i = 0; i < n_w; i += 8) {                                                \
                const uint8_t *g = (const uint8_t *)w + (size_t)i * ws;                       \
                float *yo = y + (size_t)j0 * ldy + i;                                         \
                switch (J) {                                                                  \
                case 1: GROUP(1, nb, g, xj, xs, yo, ldy); break;                              \
                case 2: GROUP(2, nb, g, xj, xs, yo, ldy); break;                              \
                case 3: GROUP(3, nb, g, xj, xs, yo, ldy); break;                              \
                default: GROUP(R8_J, nb, g, xj, xs, yo, ldy); break;                          \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

DEFINE_TILE(q4_K_r8_tile, , group_avx2)
DEFINE_TILE(q4_K_r8_tile_vnni, VNNI, group_vnni)

void tensor__kernels_q4k_r8_avx2(tensor_traits *table, int use_vnni)
{
    table[TT_Q4_K_R8].vec_dot_tile = use_vnni ? q4_K_r8_tile_vnni : q4_K_r8_tile;
}
