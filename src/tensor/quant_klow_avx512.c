/* quant_klow_avx512.c - AVX-512 (F, BW, VL, VNNI) dot products of the
 * low-bit K-quants Q2_K and Q3_K against Q8_K activations (layouts in
 * quant_klow_ref.c): vec_dot and vec_dot_tile.
 *
 * Compiled with the Makefile's *_avx512.c flags; installed by
 * tensor__kernels_avx512 (quant_avx512.c) through tensor__kernels_klow_avx512,
 * over quant_klow_avx2.c's.
 *
 * Exactness: per output the float steps of quant_klow_avx2.c (see there),
 * the same operations in the same order, done in the lanes of a ymm (one
 * lane an output) instead of one scalar at a time; only the integer sums,
 * exact however computed, are formed otherwise.  So these kernels give the
 * AVX2 kernels' bits, vec_dot and the tile agree bit for bit, and no result
 * depends on tile, thread or batch (types.h).
 *
 * Layout: a zmm holds elements 64m..64m+63 of a super-block (m = 0..3), so
 * its four 128-bit lanes are the sub-blocks 4m..4m+3 and the activation
 * bytes are one plain 64-byte load.  The levels of chunks 2m and 2m + 1 sit
 * in the same 32 bytes of qs at shifts 4(m & 1) and 4(m & 1) + 2: one
 * broadcast and one per-half variable shift.
 *   - Q2_K: levels (0..3) times scales (0..15) are at most 45, so the scale
 *     goes into the weight bytes by a byte shuffle (dword m of lane l of the
 *     table holds k * sc, k = 0..3, for sub-block 4m + l: zmm m's index is
 *     its level + 4m) and VPDPBUSD meets them with the activation bytes:
 *     one instruction per 64 elements and activation row.  Minimums as in
 *     the AVX2 kernel: bsums times mins by VPMADDWD.
 *   - Q3_K: levels + 4 (0..7, the third bit added under a byte mask) meet
 *     the activations in VPMADDUBSW and the signed scales in VPDPWSSD (two
 *     instructions per 64 elements and row); the -4 comes from the bsums.
 * Each activation row's sums of a super-block (isum, and summ for Q2_K) are
 * reduced for 8 rows at once by a transposing add, one row a lane, and the
 * float steps run on those 8 lanes.  The tile kernel takes 8 activation
 * rows per weight row (prompts, batches) or, for one activation row
 * (generation), 8 weight rows per pass; vec_dot is the latter with one.
 * Each weight block asks for the one PREFETCH_BYTES on (simd_x86.h): a
 * matrix from memory was read at 5.2 GB/s without, 7.3 with (Q2_K, K = 1).
 *
 * Measured against the AVX2 kernels on an Intel Xeon with AVX-512 VNNI
 * (BENCHMARKS.md, thread CPU time of one product), faster at every batch
 * size, so tensor__kernels_klow_avx512 installs both entries of both types
 * unconditionally: 8192 x 2048 in cache, K = 1 / 8 / 32 / 512 rows, Q2_K
 * 1.6x / 1.9x / 2.1x / 1.9x, Q3_K 3.6x / 1.9x / 2.0x / 1.9x; 128256 x 2048
 * from memory, K = 1 / 8, Q2_K 2.1x / 2.0x, Q3_K 2.1x / 2.0x.
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

enum { KL_Q2, KL_Q3 };
enum { KL_ROWS = 8 };     /* rows (activation or weight) per pass: the lanes of a ymm */

/* One weight super-block unpacked for the products: Q2_K the level-times-
 * scale bytes q[m] and the minimums; Q3_K the levels + 4 q[m], the scales
 * as 16-bit words (lane l of sc[m]: sub-block 4m + l) and 4 * scale for the
 * bsums. */
typedef struct {
    __m512i q[4], sc[4];
    __m256i bs_mul;   /* 16-bit factors of the activations' bsums */
} kl_weights;

/* Levels (low 2 bits) of zmm m: chunks 2m, 2m + 1 from qs[32h..32h+31],
 * h = m / 2, shifted by 4(m & 1) and 4(m & 1) + 2 in the two 256-bit halves. */
INLINE __m512i kl_low2(const uint8_t *qs, int m)
{
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (m >> 1))));
    const short s = (short)(4 * (m & 1));
    const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(s), _mm256_set1_epi16((short)(s + 2)), 1);
    return _mm512_srlv_epi16(q, cnt);
}

/* Q3_K's 16 signed scales as bytes (tensor__q3_K_scales, vectorised): low
 * nibbles from scales[0..7] (sub-blocks 0-7 low, 8-15 high nibble), top two
 * bits from scales[8 + s % 4] at bit 2 (s / 4). */
INLINE __m128i q3_scales(const uint8_t *p)
{
    uint64_t lo8;
    uint32_t hi4;
    memcpy(&lo8, p, sizeof lo8);
    memcpy(&hi4, p + 8, sizeof hi4);
    const __m128i a = _mm_cvtsi64_si128((long long)lo8), m4 = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)hi4), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* The 16 sub-block scales (bytes) as 32-bit lanes in the order that puts
 * sub-block 4m + l in dword m of 128-bit lane l: then zmm m's scales are
 * dword m of every lane, for a byte shuffle with one index everywhere
 * (no cross-lane moves per zmm). */
INLINE __m128i by_lane(__m128i s)
{
    return _mm_shuffle_epi8(s, _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
}

INLINE void kl_unpack(int kt, const uint8_t *wb, kl_weights *W)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    if (kt == KL_Q2) {
        const block_q2_K *k = (const block_q2_K *)wb;
        const __m128i s = _mm_loadu_si128((const __m128i *)k->scales);
        W->bs_mul = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
        /* dword m of lane l: bytes k * sc for k = 0..3, sc sub-block 4m + l's
         * scale (at most 45, no carry) */
        const __m512i tab = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(by_lane(_mm_and_si128(s, m4))),
                                               _mm512_set1_epi32(0x03020100));
        UNROLL for (int m = 0; m < 4; m++) {
            const __m512i idx = _mm512_ternarylogic_epi32(kl_low2(k->qs, m), _mm512_set1_epi8(3),
                                                          _mm512_set1_epi8((char)(4 * m)),
                                                          0xea);   /* (level & 3) | 4m */
            W->q[m] = _mm512_shuffle_epi8(tab, idx);
        }
        return;
    }
    const block_q3_K *k = (const block_q3_K *)wb;
    const __m128i sc = q3_scales(k->scales);
    W->bs_mul = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2);
    /* dword m of lane l: sub-block 4m + l's scale, sign extended */
    const __m512i tab = _mm512_cvtepi8_epi32(by_lane(sc));
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)k->hmask));
    UNROLL for (int m = 0; m < 4; m++) {
        /* the third bit: bit 2m of hmask for chunk 2m, 2m + 1 for 2m + 1 */
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * m))),
                                               _mm256_set1_epi8((char)(1 << (2 * m + 1))), 1);
        const __m512i low = _mm512_and_si512(kl_low2(k->qs, m), _mm512_set1_epi8(3));
        W->q[m] = _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hm, bit), low, _mm512_set1_epi8(4));
        /* the low 16 bits of dword m in every 16-bit word */
        W->sc[m] = _mm512_shuffle_epi8(tab, _mm512_set1_epi16((short)((4 * m + 1) << 8 | 4 * m)));
    }
}

/* The integer sums of one weight super-block against one activation
 * block: 16 lanes whose sum is isum (Q3_K), or isum's partial sums in the
 * low 8 lanes and summ's in the high 8 (Q2_K), as kl_reduce takes them. */
INLINE __m512i kl_product(int kt, const kl_weights *W, const block_q8_K *xb)
{
    __m512i acc = _mm512_setzero_si512();
    const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
    if (kt == KL_Q2) {
        UNROLL for (int m = 0; m < 4; m++)
            acc = _mm512_dpbusd_epi32(acc, W->q[m], _mm512_loadu_si512(xb->qs + 64 * m));
        const __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
        return _mm512_inserti64x4(_mm512_castsi256_si512(isum), _mm256_madd_epi16(bs, W->bs_mul), 1);
    }
    UNROLL for (int m = 0; m < 4; m++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(W->q[m], _mm512_loadu_si512(xb->qs + 64 * m)),
                                  W->sc[m]);
    /* q = u - 4: less 4 sum_s sc_s bsums_s */
    return _mm512_sub_epi32(acc, _mm512_zextsi256_si512(_mm256_madd_epi16(bs, W->bs_mul)));
}

/* The 8 rows' products (zero past the last) to lanes: isum in *isum and,
 * for Q2_K, summ in *summ. */
INLINE void kl_reduce(int kt, const __m512i v[KL_ROWS], __m256i *isum, __m256i *summ)
{
    const __m512i s = sum16x8(v);
    const __m256i lo = _mm512_castsi512_si256(s), hi = _mm512_extracti64x4_epi64(s, 1);
    if (kt == KL_Q2) {
        *isum = lo;
        *summ = hi;
    } else {
        *isum = _mm256_add_epi32(lo, hi);
        *summ = _mm256_setzero_si256();
    }
}

/* quant_klow_avx2.c's kl_step on 8 outputs: d_w * d_x, then the FMAs. */
INLINE __m256 kl_step(int kt, __m256i isum, __m256i summ, __m256 dw, __m256 dmin, __m256 dx,
                      __m256 acc)
{
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc);
    if (kt == KL_Q2)
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin, dx), acc);
    return acc;
}

INLINE size_t kl_bytes(int kt) { return kt == KL_Q2 ? sizeof(block_q2_K) : sizeof(block_q3_K); }

/* Byte offsets, in 8 rows `stride` apart, of rows 0..J-1 (row 0 again past
 * them, so a gather stays inside the rows). */
INLINE __m512i row_offsets(int J, size_t stride)
{
    long long o[KL_ROWS];
    for (int j = 0; j < KL_ROWS; j++)
        o[j] = j < J ? (long long)((size_t)j * stride) : 0;
    return _mm512_loadu_si512(o);
}

/* One weight row w against J activation rows (xs apart): y[j * ldy]. */
INLINE void kl_rows_x(int kt, int J, int64_t n, const uint8_t *w, const uint8_t *x, size_t xs,
                      float *y, size_t ldy)
{
    const __m512i xoff = row_offsets(J, xs);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *wb = w + (size_t)b * kl_bytes(kt);
        prefetch_lines(wb + PREFETCH_BYTES, (int)kl_bytes(kt));
        kl_weights W;
        kl_unpack(kt, wb, &W);
        __m512i v[KL_ROWS];
        UNROLL for (int j = 0; j < KL_ROWS; j++)
            v[j] = j < J ? kl_product(kt, &W, (const block_q8_K *)(x + (size_t)j * xs) + b)
                         : _mm512_setzero_si512();
        __m256i isum, summ;
        kl_reduce(kt, v, &isum, &summ);
        fp16_t d[2] = { 0, 0 };   /* d, and Q2_K's dmin */
        memcpy(d, kt == KL_Q2 ? wb + offsetof(block_q2_K, d) : wb + offsetof(block_q3_K, d),
               kt == KL_Q2 ? 2 * sizeof d[0] : sizeof d[0]);
        const __m256 dx = _mm512_i64gather_ps(xoff, x + (size_t)b * sizeof(block_q8_K) + offsetof(block_q8_K, d), 1);
        acc = kl_step(kt, isum, summ, _mm256_set1_ps(h2f(d[0])), _mm256_set1_ps(h2f(d[1])), dx, acc);
    }
    float lanes[KL_ROWS];
    _mm256_storeu_ps(lanes, acc);
    UNROLL for (int j = 0; j < J; j++)
        y[(size_t)j * ldy] = lanes[j];
}

/* R weight rows (ws apart) against one activation row: y[0..R). */
INLINE void kl_rows_w(int kt, int R, int64_t n, const uint8_t *w, size_t ws, const uint8_t *x,
                      float *y)
{
    const __m512i woff = row_offsets(R, ws);
    /* d (and dmin) in the 32 bits at: Q2_K's d, dmin; Q3_K's last two
     * scale bytes, d (so the load ends with the block) */
    const size_t dpos = kt == KL_Q2 ? offsetof(block_q2_K, d) : offsetof(block_q3_K, d) - 2;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        const block_q8_K *xb = (const block_q8_K *)x + b;
        const uint8_t *wb = w + (size_t)b * kl_bytes(kt);
        __m512i v[KL_ROWS];
        UNROLL for (int r = 0; r < KL_ROWS; r++) {
            v[r] = _mm512_setzero_si512();
            if (r < R) {
                kl_weights W;
                prefetch_lines(wb + (size_t)r * ws + PREFETCH_BYTES, (int)kl_bytes(kt));
                kl_unpack(kt, wb + (size_t)r * ws, &W);
                v[r] = kl_product(kt, &W, xb);
            }
        }
        __m256i isum, summ;
        kl_reduce(kt, v, &isum, &summ);
        const __m256i dd = _mm512_i64gather_epi32(woff, wb + dpos, 1);
        const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(kt == KL_Q2 ? dd : _mm256_srli_epi32(dd, 16)));
        const __m256 dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dd, 16)));
        acc = kl_step(kt, isum, summ, dw, dmin, _mm256_set1_ps(xb->d), acc);
    }
    _mm256_mask_storeu_ps(y, (__mmask8)((1u << R) - 1), acc);
}

/* The tile: one activation row by passes of 8 weight rows; more by passes
 * of 8 activation rows per weight row. */
INLINE void kl_tile(int kt, int64_t n, const uint8_t *w, size_t ws, int n_w, const uint8_t *x,
                    size_t xs, int n_x, float *y, size_t ldy)
{
    if (n_x > 1) {
        TILE_PASSES8(kl_rows_x, kt, n, w, ws, n_w, x, xs, n_x, y, ldy)
        return;
    }
    for (int i = 0; i < n_w; i += KL_ROWS)
        SWITCH_ROWS8(kl_rows_w, kt, n_w - i, n, w + (size_t)i * ws, ws, x, y + i)
}

#define DEFINE_KLFORMAT(name, kt)                                                        \
    static float name##_vec_dot(const void *w, const void *x, int64_t n)                 \
    {                                                                                    \
        float y;                                                                         \
        kl_rows_w(kt, 1, n, w, 0, x, &y);                                                \
        return y;                                                                        \
    }                                                                                    \
    static void name##_tile(int64_t n, const void *w, size_t ws, int n_w, const void *x, \
                            size_t xs, int n_x, float *y, size_t ldy)                    \
    {                                                                                    \
        kl_tile(kt, n, w, ws, n_w, x, xs, n_x, y, ldy);                                  \
    }

DEFINE_KLFORMAT(q2_K, KL_Q2)
DEFINE_KLFORMAT(q3_K, KL_Q3)

void tensor__kernels_klow_avx512(tensor_traits *table)
{
    table[TT_Q2_K].vec_dot = q2_K_vec_dot;
    table[TT_Q2_K].vec_dot_tile = q2_K_tile;
    table[TT_Q3_K].vec_dot = q3_K_vec_dot;
    table[TT_Q3_K].vec_dot_tile = q3_K_tile;
}
