/* quant_iq_avx2.c - AVX2 dot products of the table-valued 4-bit types:
 * IQ4_NL and MXFP4 against Q8_0 activations, IQ4_XS against Q8_K (layouts
 * in quant_iqref.c).
 *
 * Compiled with -mavx2 -mfma -mf16c; installed by tensor__kernels_avx2
 * (quant_avx2.c) through tensor__kernels_iq_avx2.  Decoders stay the
 * reference's.
 *
 * The 16-entry table fits one xmm, so VPSHUFB turns 32 indices into 32
 * signed weights at once.  Weights and activations are both signed: the
 * activations' magnitudes (unsigned; -128 reads as 128) meet the weights
 * with the activations' signs in VPMADDUBSW, whose pair sums stay within
 * int16 (2 * 128 * 127), then VPMADDWD widens them to 8 int32 lanes
 * (times IQ4_XS's sub-block scale, at most 32, on the way).  Each lane holds
 * an exact integer sum; per block (super-block for IQ4_XS) the lanes go to
 * float and are added into 8 float lanes by one FMA with the two scales'
 * product, and the lanes are summed at the end (hsum_ps).
 *
 * vec_dot_tile decodes each weight block once for up to 4 activation rows,
 * each with its own accumulator; every output sees the same operations in
 * the same order as vec_dot (which is the one-row case of the same code), so
 * results are the same bits whatever the tile, thread split or batch.
 *
 * On CPUs with AVX-512 F/BW/VL/VNNI quant_iq_avx512.c replaces all six
 * entries (measured faster at 1, 8 and 32 activation rows); it keeps the
 * float chain here, so both give the same bits.
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"
#include "tensor/quant_iq_x86.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Activation rows one weight block meets in a pass. */
enum { XR = 4 };

/* ---- helpers ------------------------------------------------------------ */

INLINE __m256i table_of(int f)
{
    const int8_t *t = f == F_MXFP4 ? tensor__mxfp4_values : tensor__iq4nl_values;
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

/* The 32 weights of 16 index bytes, in element order. */
INLINE __m256i lookup32(__m256i table, const uint8_t *qs)
{
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

/* 16 int16 lanes, each the sum of two products w * x (signed bytes; w
 * within [-127, 127]). */
INLINE __m256i mul_pairs(__m256i w, __m256i x)
{
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
}

/* ---- one weight row against nr (<= XR) activation rows ------------------- */

INLINE void rows_dot(int f, int64_t n, const uint8_t *w, const uint8_t *const x[XR], int nr,
                     float out[XR])
{
    const __m256i table = table_of(f);
    const size_t wb = wblock_bytes(f), xb = xblock_bytes(f);
    __m256 acc[XR];
    UNROLL for (int r = 0; r < XR; r++)
        acc[r] = _mm256_setzero_ps();
    if (f != F_IQ4_XS) {
        const __m256i ones = _mm256_set1_epi16(1);
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = w + (size_t)b * wb;
            const __m256i wv = lookup32(table, blk + wb - 16);
            const float dw = wscale32(f, blk);
            UNROLL for (int r = 0; r < XR; r++) {
                if (r >= nr)
                    break;
                const uint8_t *xk = x[r] + (size_t)b * xb;
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xk + 2));
                const __m256i s = _mm256_madd_epi16(mul_pairs(wv, xv), ones);
                fp16_t h;
                memcpy(&h, xk, sizeof h);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * h2f(h)), acc[r]);
            }
        }
    } else {
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_iq4_xs *k = (const block_iq4_xs *)(w + (size_t)b * wb);
            __m256i wv[8], sc[8];
            UNROLL for (int j = 0; j < 8; j++) {
                wv[j] = lookup32(table, k->qs + 16 * j);
                sc[j] = _mm256_set1_epi16((int16_t)(tensor__iq4_xs_scale(k, j) - 32));
            }
            fp16_t h;
            memcpy(&h, &k->d, sizeof h);
            const float dw = h2f(h);
            UNROLL for (int r = 0; r < XR; r++) {
                if (r >= nr)
                    break;
                const block_q8_K *xk = (const block_q8_K *)(x[r] + (size_t)b * xb);
                __m256i s = _mm256_setzero_si256();
                UNROLL for (int j = 0; j < 8; j++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xk->qs + 32 * j));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(mul_pairs(wv[j], xv), sc[j]));
                }
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xk->d), acc[r]);
            }
        }
    }
    UNROLL for (int r = 0; r < XR; r++)
        if (r < nr)
            out[r] = hsum_ps(acc[r]);
}

/* ---- entry points --------------------------------------------------------- */

INLINE float vec_dot(int f, const void *w, const void *x, int64_t n)
{
    const uint8_t *xs[XR] = { x, x, x, x };
    float out[XR];
    rows_dot(f, n, w, xs, 1, out);
    return out[0];
}

INLINE void tile(int f, int64_t n, const void *w, size_t w_stride, int n_w, const void *x,
                 size_t x_stride, int n_x, float *y, size_t ldy)
{
    for (int i = 0; i < n_w; i++) {
        const uint8_t *wi = (const uint8_t *)w + (size_t)i * w_stride;
        for (int j0 = 0; j0 < n_x; j0 += XR) {
            const int nr = n_x - j0 < XR ? n_x - j0 : XR;
            const uint8_t *xs[XR];
            float out[XR];
            for (int r = 0; r < XR; r++)
                xs[r] = (const uint8_t *)x + (size_t)(j0 + (r < nr ? r : 0)) * x_stride;
            /* literal row counts, so each call is unrolled for its count */
            switch (nr) {
            case 1: rows_dot(f, n, wi, xs, 1, out); break;
            case 2: rows_dot(f, n, wi, xs, 2, out); break;
            case 3: rows_dot(f, n, wi, xs, 3, out); break;
            default: rows_dot(f, n, wi, xs, 4, out); break;
            }
            for (int r = 0; r < nr; r++)
                y[(size_t)(j0 + r) * ldy + i] = out[r];
        }
    }
}

DEFINE_IQ_KERNELS(tensor__kernels_iq_avx2)
