/* quant_iq_avx512.c - AVX-512 (F, BW, VL, VNNI) dot products of the
 * table-valued 4-bit types: IQ4_NL and MXFP4 against Q8_0 activations,
 * IQ4_XS against Q8_K (layouts in quant_iqref.c): vec_dot and vec_dot_tile.
 *
 * Compiled with the Makefile's *_avx512.c flags and only called after the
 * CPU probe found all four extensions; tensor__kernels_avx512
 * (quant_avx512.c) calls tensor__kernels_iq_avx512 after the AVX2 set is in
 * place, and it replaces quant_iq_avx2.c's entries (measured slower, below).
 *
 * Exactness: every output gets quant_iq_avx2.c's float chain, so the bits
 * of the AVX2 kernels (and vec_dot == tile, types.h):
 *   8 float lanes, acc_k = fma((float)isum_{B,k}, d_w * d_x, acc_k) over the
 *   blocks B (32 elements; IQ4_XS: super-blocks of 256) in order, the
 *   product d_w * d_x rounded to float first, then hsum_ps(acc);
 *   isum_{B,k} = the exact integer sum of w * x over elements 4k..4k+3 of
 *   the block (IQ4_XS: of each of its 8 sub-blocks, each times its scale
 *   ls - 32, added up).
 * Only the integer sums are computed differently here, and they are exact.
 *
 * Layout: a zmm holds two outputs, weight rows A and B of one pass in its
 * 256-bit halves against the same activation row broadcast to both, so one
 * instruction does the integer, convert, scale and FMA work of two outputs.
 * The 16-entry table is in every 128-bit lane, so one VPSHUFB turns the 64
 * indices of two rows' blocks into weights.  A pass is up to 4 pairs (8
 * weight rows) against up to 4 activation rows: each weight block is
 * decoded once for 4 rows, each activation block prepared once for 8
 * weight rows, and generation (one row) has 4 independent FMA chains where
 * the AVX2 kernel's one chain per output waits on FMA latency.
 *
 * VPDPBUSD multiplies unsigned by signed bytes, and AVX-512 has no byte
 * sign instruction.  IQ4_NL, MXFP4: the table is shifted to weights + 128
 * (1..241; MXFP4 116..140) and each lane starts at -128 * (its 4 activation
 * bytes), once per activation block, so a pair costs one VPDPBUSD.  IQ4_XS
 * keeps the AVX2 route, whose 16-bit pair sums take the sub-block scale:
 * the activations' magnitudes (-128 reads as 128) against the weights
 * negated (masked subtract) where the activation is negative, VPMADDUBSW
 * (pair sums at most 2 * 128 * 127), then VPDPWSSD times the scale.
 *
 * Measured (BENCHMARKS.md, "AVX-512 IQ4_NL, IQ4_XS, MXFP4"; Xeon with
 * AVX-512 VNNI, one thread, 8192 x 2048 matrix): against quant_iq_avx2.c
 * (with AVX-VNNI) the median time is 0.43-0.70x at K = 1 activation row
 * and 0.49-0.57x at K = 8 and 32, for each of the three types; from memory
 * (a 140 MiB matrix) 0.42-0.62x at K = 1 and 0.43-0.54x at K = 8.  So all
 * six entries are installed.  Each weight row is prefetched PREFETCH_BYTES
 * ahead: 9-15% less time at K = 1 from memory, nothing lost from cache.
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

/* Weight pairs and activation rows of one pass (maxima). */
enum { WP = 4, XR = 4 };

/* ---- helpers ------------------------------------------------------------ */

INLINE __m512i table_of(int f)
{
    const int8_t *t = f == F_MXFP4 ? tensor__mxfp4_values : tensor__iq4nl_values;
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
}

/* The weights of 16 index bytes of row A (low half, element order) and 16
 * of row B (high half). */
INLINE __m512i lookup_pair(__m512i table, const uint8_t *qa, const uint8_t *qb)
{
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                                              _mm_loadu_si128((const __m128i *)qb), 1);
    const __m512i z = _mm512_castsi256_si512(q);
    /* 128-bit lanes qa, qa, qb, qb; the second of each shifted to its high nibbles */
    const __m512i v = _mm512_srlv_epi64(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0)),
                                        _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_shuffle_epi8(table, _mm512_and_si512(v, _mm512_set1_epi8(0x0f)));
}

/* a in the low 8 lanes, b in the high 8. */
INLINE __m512 pair_ps(float a, float b)
{
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(a), 0xff00, _mm_set_ss(b));
}

/* The sub-block scales (ls - 32) of IQ4_XS super-blocks a (lanes 0..7) and
 * b (lanes 8..15), each in both 16-bit halves of its lane: tensor__iq4_xs_scale
 * for all 16 at once. */
INLINE __m512i xs_scales(const block_iq4_xs *a, const block_iq4_xs *b)
{
    int32_t la, lb;
    memcpy(&la, a->scales_l, sizeof la);
    memcpy(&lb, b->scales_l, sizeof lb);
    const __m512i l = _mm512_mask_set1_epi32(_mm512_set1_epi32(la), 0xff00, lb);
    const __m512i h = _mm512_mask_set1_epi32(_mm512_set1_epi32(a->scales_h), 0xff00, b->scales_h);
    const __m512i j = _mm512_set_epi32(7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(l, _mm512_slli_epi32(j, 2)), _mm512_set1_epi32(0x0f));
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(h, _mm512_add_epi32(j, j)), _mm512_set1_epi32(3));
    const __m512i s = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
    return _mm512_or_si512(_mm512_slli_epi32(s, 16), _mm512_and_si512(s, _mm512_set1_epi32(0xffff)));
}

/* ---- np weight pairs against nr activation rows --------------------------- */

/* w[2p], w[2p + 1]: pair p's rows (the same pointer twice for a lone row);
 * out[r][2p + h]: row w[2p + h] against x[r].  np, nr literals. */
INLINE void pairs_dot(int f, int np, int nr, int64_t n, const uint8_t *const w[2 * WP],
                      const uint8_t *const x[XR], float out[XR][2 * WP])
{
    const __m512i table = table_of(f), zero = _mm512_setzero_si512();
    const size_t wb = wblock_bytes(f), xb = xblock_bytes(f);
    __m512 acc[WP][XR];
    UNROLL for (int p = 0; p < np; p++)
        UNROLL for (int r = 0; r < nr; r++)
            acc[p][r] = _mm512_setzero_ps();
    if (f != F_IQ4_XS) {
        /* weights + 128 (unsigned) from a shifted table; each lane starts at
         * -128 * (its 4 activation bytes) */
        const __m512i table_u = _mm512_xor_si512(table, _mm512_set1_epi8((char)0x80));
        const __m512i u128 = _mm512_set1_epi8((char)0x80);
        for (int64_t b = 0; b < n / 32; b++) {
            __m512i wv[WP];
            __m512 dw[WP];
            UNROLL for (int p = 0; p < np; p++) {
                const uint8_t *ba = w[2 * p] + (size_t)b * wb, *bb = w[2 * p + 1] + (size_t)b * wb;
                _mm_prefetch((const char *)ba + PREFETCH_BYTES, _MM_HINT_T0);
                _mm_prefetch((const char *)bb + PREFETCH_BYTES, _MM_HINT_T0);
                wv[p] = lookup_pair(table_u, ba + wb - 16, bb + wb - 16);
                dw[p] = pair_ps(wscale32(f, ba), wscale32(f, bb));
            }
            UNROLL for (int r = 0; r < nr; r++) {
                const uint8_t *xk = x[r] + (size_t)b * xb;
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xk + 2)));
                const __m512i start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, xv));
                fp16_t h;
                memcpy(&h, xk, sizeof h);
                const __m512 dx = _mm512_set1_ps(h2f(h));
                UNROLL for (int p = 0; p < np; p++) {
                    const __m512i s = _mm512_dpbusd_epi32(start, wv[p], xv);
                    acc[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[p], dx), acc[p][r]);
                }
            }
        }
    } else {
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_iq4_xs *k[2 * WP];
            __m512i sc[WP], isum[WP][XR];
            __m512 dw[WP];
            UNROLL for (int p = 0; p < np; p++) {
                k[2 * p] = (const block_iq4_xs *)(w[2 * p] + (size_t)b * wb);
                k[2 * p + 1] = (const block_iq4_xs *)(w[2 * p + 1] + (size_t)b * wb);
                prefetch_lines((const uint8_t *)k[2 * p] + PREFETCH_BYTES, (int)wb);
                prefetch_lines((const uint8_t *)k[2 * p + 1] + PREFETCH_BYTES, (int)wb);
                sc[p] = xs_scales(k[2 * p], k[2 * p + 1]);
                fp16_t ha, hb;
                memcpy(&ha, &k[2 * p]->d, sizeof ha);
                memcpy(&hb, &k[2 * p + 1]->d, sizeof hb);
                dw[p] = pair_ps(h2f(ha), h2f(hb));
                UNROLL for (int r = 0; r < nr; r++)
                    isum[p][r] = zero;
            }
            for (int j = 0; j < 8; j++) {
                const __m512i pick = _mm512_add_epi32(_mm512_set1_epi32(j),
                                                      _mm512_set_epi32(8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0));
                __m512i wv[WP], scj[WP];
                UNROLL for (int p = 0; p < np; p++) {
                    wv[p] = lookup_pair(table, k[2 * p]->qs + 16 * j, k[2 * p + 1]->qs + 16 * j);
                    scj[p] = _mm512_permutexvar_epi32(pick, sc[p]);
                }
                UNROLL for (int r = 0; r < nr; r++) {
                    const block_q8_K *xk = (const block_q8_K *)(x[r] + (size_t)b * xb);
                    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xk->qs + 32 * j)));
                    const __m512i ax = _mm512_abs_epi8(xv);
                    const __mmask64 neg = _mm512_movepi8_mask(xv);
                    UNROLL for (int p = 0; p < np; p++) {
                        const __m512i pairs = _mm512_maddubs_epi16(ax, _mm512_mask_sub_epi8(wv[p], neg, zero, wv[p]));
                        isum[p][r] = _mm512_dpwssd_epi32(isum[p][r], pairs, scj[p]);
                    }
                }
            }
            UNROLL for (int r = 0; r < nr; r++) {
                const __m512 dx = _mm512_set1_ps(((const block_q8_K *)(x[r] + (size_t)b * xb))->d);
                UNROLL for (int p = 0; p < np; p++)
                    acc[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[p][r]), _mm512_mul_ps(dw[p], dx), acc[p][r]);
            }
        }
    }
    UNROLL for (int p = 0; p < np; p++)
        UNROLL for (int r = 0; r < nr; r++) {
            out[r][2 * p] = hsum_ps(_mm512_castps512_ps256(acc[p][r]));
            out[r][2 * p + 1] = hsum_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][r]), 1)));
        }
}

/* ---- entry points --------------------------------------------------------- */

INLINE float vec_dot(int f, const void *w, const void *x, int64_t n)
{
    const uint8_t *ws[2 * WP] = { w, w, w, w, w, w, w, w }, *xs[XR] = { x, x, x, x };
    float out[XR][2 * WP];
    pairs_dot(f, 1, 1, n, ws, xs, out);
    return out[0][0];
}

/* Literal pair and row counts, so each call is unrolled for its shape. */
#define PASS(np, nr) pairs_dot(f, np, nr, n, wr, xr, out)

INLINE void tile(int f, int64_t n, const void *w, size_t w_stride, int n_w, const void *x,
                 size_t x_stride, int n_x, float *y, size_t ldy)
{
    for (int i0 = 0; i0 < n_w; i0 += 2 * WP) {
        const int nw = n_w - i0 < 2 * WP ? n_w - i0 : 2 * WP, np = (nw + 1) / 2;
        const uint8_t *wr[2 * WP];
        for (int k = 0; k < 2 * WP; k++)
            wr[k] = (const uint8_t *)w + (size_t)(i0 + (k < nw ? k : nw - 1)) * w_stride;
        for (int j0 = 0; j0 < n_x; j0 += XR) {
            const int nr = n_x - j0 < XR ? n_x - j0 : XR;
            const uint8_t *xr[XR];
            float out[XR][2 * WP];
            for (int r = 0; r < XR; r++)
                xr[r] = (const uint8_t *)x + (size_t)(j0 + (r < nr ? r : 0)) * x_stride;
            switch (4 * (np - 1) + nr - 1) {
            case 0: PASS(1, 1); break;
            case 1: PASS(1, 2); break;
            case 2: PASS(1, 3); break;
            case 3: PASS(1, 4); break;
            case 4: PASS(2, 1); break;
            case 5: PASS(2, 2); break;
            case 6: PASS(2, 3); break;
            case 7: PASS(2, 4); break;
            case 8: PASS(3, 1); break;
            case 9: PASS(3, 2); break;
            case 10: PASS(3, 3); break;
            case 11: PASS(3, 4); break;
            case 12: PASS(4, 1); break;
            case 13: PASS(4, 2); break;
            case 14: PASS(4, 3); break;
            default: PASS(4, 4); break;
            }
            for (int r = 0; r < nr; r++)
                for (int k = 0; k < nw; k++)
                    y[(size_t)(j0 + r) * ldy + i0 + k] = out[r][k];
        }
    }
}

DEFINE_IQ_KERNELS(tensor__kernels_iq_avx512)
