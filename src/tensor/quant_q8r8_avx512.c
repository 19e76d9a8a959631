/* quant_q8r8_avx512.c - the tile kernel of Q8_0 weights repacked by 8 rows
 * (TT_Q8_0_R8, tensor/q8_0_r8.h) for AVX-512 VNNI, and the activation
 * layout it reads.
 *
 * Compiled with the Makefile's *_avx512.c flags (F, BW, VL, VNNI) and
 * installed by tensor__kernels_avx512 after the CPU probe found all four.
 *
 * Two groups (16 weight rows) per zmm: chunk c of group g in the low half,
 * of group g + 1 in the high half (a lone last group fills both halves and
 * the high half is not stored), so both halves meet the same 4 activation
 * bytes, which VPDPBUSD takes as an embedded broadcast from memory.
 * VPDPBUSD multiplies unsigned by signed bytes: the levels go in with 128
 * added (one XOR per chunk, shared by every activation row of a pass) and
 * each lane starts at -128 * (the sum of the 4 activation bytes), which
 * tile_x_prep (tensor__q8r8_prep, quant_q8r8_avx2.c) computed once per
 * activation block.  The 4-product sums are
 * then exactly those Q8_0's kernels form in their lane c, without
 * saturation anywhere.
 *
 * Floats, per output exactly quant_q8r8_avx2.c's and so Q8_0's vec_dot's
 * (quant_avx512.c, bit for bit): chunk c has an accumulator of its own,
 * fma(d_w * d_x, (float)sum_c, acc_c) block after block, and at the end
 * the 8 accumulators are added in hsum_ps's order.  16 outputs share each
 * convert and FMA, the work that bounds Q8_0's row-by-row kernels.
 *
 * Activation layout (kernels_isa.h), per 32-element block Q8R8_XP_BYTES
 * bytes: the 32 bytes as quantised, the 8 starts (int32), d as a float.
 * Activation rows are taken XR at a time against a pair of groups, their
 * accumulators and the pair's 8 chunks in registers; for more rows the
 * pair is read again, from cache.
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q8_0_r8.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

enum { XR = 2 };   /* activation rows per pass: 8 accumulators each, 8 chunks */

/* The outputs of the groups at g0 (low halves) and g1 (high halves), nb
 * blocks, against R prepared activation rows at x (xs apart): y[j]. */
INLINE void pair_rows(int R, int64_t nb, const uint8_t *g0, const uint8_t *g1, const uint8_t *x,
                      size_t xs, __m512 *y)
{
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[XR][8];
    UNROLL for (int j = 0; j < R; j++)
        UNROLL for (int c = 0; c < 8; c++)
            acc[j][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g0 += Q8_0_R8_BLOCK, g1 += Q8_0_R8_BLOCK) {
        prefetch_lines(g0 + PREFETCH_BYTES, Q8_0_R8_BLOCK);
        prefetch_lines(g1 + PREFETCH_BYTES, Q8_0_R8_BLOCK);
        __m512i wq[8];
        UNROLL for (int c = 0; c < 8; c++)
            wq[c] = _mm512_xor_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0 + 16 + 32 * c))),
                                   _mm256_loadu_si256((const __m256i *)(g1 + 16 + 32 * c)), 1),
                k128);
        const __m512 dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)g1),
                                                           _mm_loadu_si128((const __m128i *)g0)));
        UNROLL for (int j = 0; j < R; j++) {
            const uint8_t *xk = x + (size_t)j * xs + (size_t)b * Q8R8_XP_BYTES;
            const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(load_f32(xk + Q8R8_XP_D)));
            UNROLL for (int c = 0; c < 8; c++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_set1_epi32(load_i32(xk + Q8R8_XP_START + 4 * c)),
                                                      wq[c], _mm512_set1_epi32(load_i32(xk + 4 * c)));
                acc[j][c] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[j][c]);
            }
        }
    }
    /* hsum_ps's order: halves, then pairs, then the last two */
    UNROLL for (int j = 0; j < R; j++) {
        const __m512 even = _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][4]), _mm512_add_ps(acc[j][2], acc[j][6]));
        const __m512 odd = _mm512_add_ps(_mm512_add_ps(acc[j][1], acc[j][5]), _mm512_add_ps(acc[j][3], acc[j][7]));
        y[j] = _mm512_add_ps(even, odd);
    }
}

/* vec_dot_tile: w at a group's first row, n_w rows (the last group may be
 * used in part), n_x activation rows prepared by tensor__q8r8_prep. */
static void q8_0_r8_tile(int64_t n, const void *w, size_t ws, int n_w, const void *x, size_t xs,
                         int n_x, float *y, size_t ldy)
{
    const int64_t nb = n / QK8_0;
    for (int i = 0; i < n_w; i += 16) {
        const uint8_t *g0 = (const uint8_t *)w + (size_t)i * ws;
        const int nr = n_w - i < 16 ? n_w - i : 16;
        const uint8_t *g1 = nr > 8 ? g0 + 8 * ws : g0;
        const __mmask16 keep = (__mmask16)((1u << nr) - 1);
        for (int j = 0; j < n_x; j += XR) {
            const uint8_t *xj = (const uint8_t *)x + (size_t)j * xs;
            __m512 v[XR];
            const int R = n_x - j < XR ? n_x - j : XR;
            if (R == XR)
                pair_rows(XR, nb, g0, g1, xj, xs, v);
            else
                pair_rows(1, nb, g0, g1, xj, xs, v);
            for (int r = 0; r < R; r++)
                _mm512_mask_storeu_ps(y + (size_t)(j + r) * ldy + i, keep, v[r]);
        }
    }
}

void tensor__kernels_q8r8_avx512(tensor_traits *table)
{
    table[TT_Q8_0_R8].vec_dot_tile = q8_0_r8_tile;
    table[TT_Q8_0_R8].tile_x_block_bytes = Q8R8_XP_BYTES;
    table[TT_Q8_0_R8].tile_x_prep = tensor__q8r8_prep;
}
