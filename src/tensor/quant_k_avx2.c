/* quant_k_avx2.c - AVX2/FMA/F16C kernels of the K-quants: Q4_K, Q5_K,
 * Q6_K and their activation format Q8_K (layouts in quant_kref.c), with
 * AVX-VNNI variants of the prompt kernels.
 *
 * Compiled with -mavx2 -mfma -mf16c; installed by tensor__kernels_avx2
 * (quant_avx2.c) through tensor__kernels_k_avx2.  The Q8_K quantiser and
 * to_float are bit-identical to the reference; the dot products differ from
 * it only in rounding, and vec_dot and the tile kernels compute each output
 * with the same float operations in the same order (see "dot products"
 * below), so results depend neither on tiles, threads nor batches.
 *
 * Integer sums: for each sub-block the unsigned levels meet the activation
 * bytes in maddubs (16-bit pair sums) and madd multiplies the pair sums by
 * the sub-block's integer scale while widening to 32 bits.  The offsets
 * (Q4_K/Q5_K minimums, Q6_K's -32) come from the activations' bsums.
 *
 * Sections: helpers; Q8_K quantiser; decoders (to_float, dot_f32); dot
 * products (one row; packed prompt kernels); registration.
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

/* ---- helpers ------------------------------------------------------------ */

/* The 8 six-bit scales (sc) and minimums (m) of a Q4_K/Q5_K block, as
 * bytes 0..7 of each (the packing is described in quant_kref.c). */
INLINE void k4_scales(const uint8_t s[K_SCALE_SIZE], uint8_t sc[8], uint8_t m[8])
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* ---- Q8_K quantiser -------------------------------------------------------
 * Bit for bit the reference: max is the first element of largest magnitude
 * (NaNs ignored), iscale = -127 / max, and the rounding is the reference's
 * own (add 1.5 * 2^23, read the mantissa), applied to 8 lanes, so even NaN
 * and Inf inputs give the reference's bytes. */

static void q8_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_K *b = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8)
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + k)), amax);
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        const float a = _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
        if (a == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float max = 0.0f;
        const __m256 av = _mm256_set1_ps(a);
        for (int k = 0; k < QK_K; k += 8) {
            const __m256 v = _mm256_loadu_ps(src + k);
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), av, _CMP_EQ_OQ));
            if (hit) {
                max = src[k + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        const __m256i mant = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
        const __m256i lo = _mm256_set1_epi32(-128), hi = _mm256_set1_epi32(127);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int t = 0; t < 4; t++) {
                const __m256 v = _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(src + k + 8 * t)), magic);
                __m256i r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), bias);
                q[t] = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
            }
            b[i].bsums[k / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            b[i].bsums[k / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(q[2], q[3]));
            const __m256i ab = _mm256_packs_epi32(q[0], q[1]), cd = _mm256_packs_epi32(q[2], q[3]);
            const __m256i v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(b[i].qs + k), v);
        }
        b[i].d = 1.0f / iscale;
    }
}

/* ---- decoders: to_float and dot_f32 ---------------------------------------
 * The reference's expressions in its order: ds * q - ms with ds = d * sc
 * and ms = dmin * m for Q4_K/Q5_K; (d * sc) * q for Q6_K. */

/* 32 unsigned levels times ds, minus ms, into dst. */
INLINE void store32(float *dst, __m256i q, float ds, float ms)
{
    const __m256 dv = _mm256_set1_ps(ds), mv = _mm256_set1_ps(ms);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
    for (int t = 0; t < 4; t++) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[t]));
        _mm256_storeu_ps(dst + 8 * t, _mm256_sub_ps(_mm256_mul_ps(dv, f), mv));
    }
}

/* Levels of sub-block s (elements 32s..32s+31) of a Q4_K/Q5_K block: the
 * low nibbles of qs[32 (s/2) ..] for even s, the high ones for odd s, and
 * for Q5_K (qh not NULL) bit s of qh[0..31] as the fifth bit. */
INLINE __m256i k4_level(const uint8_t *qs, const uint8_t *qh, int s)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (s >> 1)));
    if (s & 1)
        b = _mm256_srli_epi16(b, 4);
    b = _mm256_and_si256(b, m4);
    if (qh) {
        /* a 16-bit shift by s < 8 leaves bit s of each byte in its bit 0 */
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(h, s), _mm256_set1_epi8(1));
        b = _mm256_or_si256(b, _mm256_slli_epi16(bit, 4));
    }
    return b;
}

INLINE void k4_to_float(const uint8_t *qs, const uint8_t *qh, fp16_t dh, fp16_t dminh,
                        const uint8_t *scales, float *dst)
{
    uint8_t sc[8], m[8];
    k4_scales(scales, sc, m);
    const float d = h2f(dh), dmin = h2f(dminh);
    for (int s = 0; s < 8; s++)
        store32(dst + 32 * s, k4_level(qs, qh, s), d * sc[s], dmin * m[s]);
}

static void q4_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K)
        k4_to_float(b[i].qs, NULL, b[i].d, b[i].dmin, b[i].scales, dst);
}

static void q5_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K)
        k4_to_float(b[i].qs, b[i].qh, b[i].d, b[i].dmin, b[i].scales, dst);
}

/* Levels (0..63, unsigned) of group g (elements 128h + 32g + 0..31) of
 * half h of a Q6_K block. */
INLINE __m256i q6_levels(const block_q6_K *b, int h, int g)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    const __m256i lo = g < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m2);
    return _mm256_or_si256(lo, _mm256_slli_epi16(top, 4));
}

static void q6_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) {
                const __m256i q = _mm256_sub_epi8(q6_levels(&b[i], h, g), _mm256_set1_epi8(32));
                const int s = 8 * h + 2 * g;
                const __m256 d0 = _mm256_set1_ps(d * b[i].scales[s]);
                const __m256 d1 = _mm256_set1_ps(d * b[i].scales[s + 1]);
                const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
                const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
                float *o = dst + 128 * h + 32 * g;
                for (int t = 0; t < 4; t++)
                    _mm256_storeu_ps(o + 8 * t, _mm256_mul_ps(t < 2 ? d0 : d1,
                                     _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[t]))));
            }
    }
}

INLINE float dot_f32_k(to_float_fn to_float, size_t bytes, const void *w, const float *x, int64_t n)
{
    float tmp[QK_K];
    const uint8_t *p = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += QK_K, p += bytes) {
        to_float(p, tmp, QK_K);
        for (int k = 0; k < QK_K; k += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(tmp + k), _mm256_loadu_ps(x + i + k), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(tmp + k + 8), _mm256_loadu_ps(x + i + k + 8), acc1);
        }
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float q4_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return dot_f32_k(q4_K_to_float, sizeof(block_q4_K), w, x, n);
}
static float q5_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return dot_f32_k(q5_K_to_float, sizeof(block_q5_K), w, x, n);
}
static float q6_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return dot_f32_k(q6_K_to_float, sizeof(block_q6_K), w, x, n);
}

/* ---- dot products -------------------------------------------------------------
 * Per super-block B of an output, exact integers (how they are computed does
 * not matter), then in block order from 0:
 *   Q4_K, Q5_K:  acc = fma(isum_B, d_w d_x, acc); acc = fma(-summ_B, dmin_w d_x, acc)
 *                isum = sum_s sc_s (levels . x)_s, summ = sum_s m_s (x sum)_s
 *   Q6_K:        acc = fma(isum_B, d_w d_x, acc)
 *                isum = sum_s sc_s ((levels . x)_s - 32 (x sum)_s)
 * so one activation row (each weight row dotted directly) and the packed
 * prompt path below give the same bits (vec_dot_tile's contract), and a
 * row's result does not depend on the batch it came in.
 *
 * The prompt path packs 8 weight rows per super-block: for each group of 4
 * elements an ymm with those levels of all 8 rows (unsigned: 0..15, 0..31,
 * 0..63), the sub-block scales as 16-bit pairs per row, d and dmin.  One
 * maddubs (or VPDPBUSD) against 4 activation bytes broadcast to every lane
 * then advances 8 outputs.  16-bit partial sums are kept for as many groups
 * as cannot overflow (levels <= 15: 8 groups, <= 31: 4, <= 63: 2) and
 * multiplied by the sub-block scales in the widening madd. */

enum { K_Q4, K_Q5, K_Q6 };
enum { KXB = 512, KNWC = 16, KRN = 4 };
_Static_assert(KXB == TILE_ACC_COLS && KNWC == 16, "store_outputs (simd_x86.h) reads acc[KNWC / 8][KXB]");

INLINE size_t kblock_bytes(int kt)
{
    return kt == K_Q4 ? sizeof(block_q4_K) : kt == K_Q5 ? sizeof(block_q5_K) : sizeof(block_q6_K);
}

/* isum and summ of one super-block of one weight row against one
 * activation block. */
INLINE void kblock_dot(int kt, const uint8_t *wb, const block_q8_K *xb, int *isum, int *summ)
{
    __m256i acc = _mm256_setzero_si256();
    const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
    if (kt == K_Q6) {
        const block_q6_K *k = (const block_q6_K *)wb;
        const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(k->qh + 32 * h));
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4)),
            };
            /* the half's 8 scales as 16-bit lanes in both halves; group g
             * takes scale 2g in lanes 0-7 and 2g + 1 in lanes 8-15 */
            const __m128i s8 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(k->scales + 8 * h)));
            const __m256i sc = _mm256_set_m128i(s8, s8);
            UNROLL for (int g = 0; g < 4; g++) {
                const char a = (char)(4 * g), c = (char)(4 * g + 2);
                const __m256i scv = _mm256_shuffle_epi8(sc, _mm256_setr_epi8(
                    a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1),
                    a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1),
                    c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1),
                    c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1)));
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * h + 32 * g));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], xv), scv));
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)k->scales));
        acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
        *isum = hsum_epi32(acc);
        *summ = 0;
        return;
    }
    const uint8_t *qs = kt == K_Q4 ? ((const block_q4_K *)wb)->qs : ((const block_q5_K *)wb)->qs;
    const uint8_t *qh = kt == K_Q5 ? ((const block_q5_K *)wb)->qh : NULL;
    uint8_t sc[8], m[8];
    k4_scales(((const block_q4_K *)wb)->scales, sc, m);   /* same offset in Q5_K */
    /* the scales as 16-bit lanes, in both halves; sub-block s's broadcast
     * is one byte shuffle (bytes 2s, 2s + 1 into every lane) */
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc));
    const __m256i scales = _mm256_set_m128i(sc16, sc16);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i hbits = _mm256_setzero_si256();
    if (qh)
        hbits = _mm256_loadu_si256((const __m256i *)qh);
    UNROLL for (int p = 0; p < 4; p++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (qh) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p + 1), one), 4));
        }
        const __m256i s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * p + 1) + 4 * p)));
        const __m256i s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * p + 3) + 4 * p + 2)));
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * p));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * p + 32));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0),
                                                     _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1)));
    }
    *isum = hsum_epi32(acc);
    const __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    *summ = hsum_epi32(_mm256_madd_epi16(bs, m16));
}

/* One weight row, one activation row. */
INLINE float krow_dot(int kt, const uint8_t *w, const uint8_t *x, int64_t n)
{
    const size_t wb = kblock_bytes(kt);
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *p = w + (size_t)b * wb;
        const block_q8_K *xb = (const block_q8_K *)x + b;
        int isum, summ;
        kblock_dot(kt, p, xb, &isum, &summ);
        fp16_t dh;
        memcpy(&dh, kt == K_Q6 ? p + offsetof(block_q6_K, d) : p, sizeof dh);
        const __m128 f = _mm_cvtsi32_ss(_mm_setzero_ps(), isum);
        acc = _mm_fmadd_ss(f, _mm_set_ss(h2f(dh) * xb->d), acc);
        if (kt != K_Q6) {
            memcpy(&dh, p + 2, sizeof dh);
            const __m128 fm = _mm_cvtsi32_ss(_mm_setzero_ps(), summ);
            acc = _mm_fnmadd_ss(fm, _mm_set_ss(h2f(dh) * xb->d), acc);
        }
    }
    return _mm_cvtss_f32(acc);
}

/* ---- a few activation rows (batched generation) -----------------------------
 * R weight rows times J activation rows per pass (R = 8 / J, 2 <= J <= 8),
 * output (r, j) in lane l = r * J + j: each weight super-block is decoded
 * once for the J rows (a batch of decode rows then costs little more than
 * one), the integer sums of the 8 outputs are reduced by one transposing
 * add, and krow_dot's float chain runs for the 8 lanes at once (same
 * operations, same order, same bits).  xd[8 b + l] holds d of block b of
 * activation row l % J (0 beyond R * J lanes), made once per pass. */

enum { KFEW_NBMAX = 256, KFEW_ROWS = 8 };

/* Lane r of the result: the sum of the 8 lanes of v[r]. */
INLINE __m256i sum8x8(const __m256i v[8])
{
    __m256i s[4], t[2];
    UNROLL for (int k = 0; k < 4; k++)
        s[k] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                                _mm256_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    UNROLL for (int k = 0; k < 2; k++)
        t[k] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2 * k], s[2 * k + 1]),
                                _mm256_unpackhi_epi64(s[2 * k], s[2 * k + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(t[0], t[1], 0x20),
                            _mm256_permute2x128_si256(t[0], t[1], 0x31));
}

/* 8 f16 values in lane order (lane l: h[l / J], 0 beyond R * J lanes). */
INLINE __m256 f16_lanes(const fp16_t *h, int R, int J)
{
    uint64_t lo = 0, hi = 0;
    UNROLL for (int l = 0; l < R * J; l++) {
        const uint64_t v = (uint64_t)h[l / J] << (16 * (l & 3));
        if (l < 4)
            lo |= v;
        else
            hi |= v;
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* Weight rows [0, nr) (nr <= 8 / J) at w against activation rows [0, J)
 * at x (xs apart); y[j * ldy + r] the results. */
INLINE void kfew(int kt, int J, int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                 size_t xs, const float *xd, float *y, size_t ldy)
{
    const int R = 8 / J;
    const size_t wb = kblock_bytes(kt);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 facc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc[8], mn[8];
        fp16_t dh[8] = { 0 }, mh[8] = { 0 };
        UNROLL for (int l = 0; l < 8; l++)
            acc[l] = mn[l] = _mm256_setzero_si256();
        UNROLL for (int r = 0; r < R; r++) {
            if (r >= nr)
                continue;
            const uint8_t *wbk = w + (size_t)r * ws + (size_t)b * wb;
            _mm_prefetch((const char *)(wbk + 4 * wb), _MM_HINT_T0);
            _mm_prefetch((const char *)(wbk + 4 * wb + 64), _MM_HINT_T0);
            _mm_prefetch((const char *)(wbk + 4 * wb + 128), _MM_HINT_T0);
            if (kt == K_Q6) {
                const block_q6_K *k = (const block_q6_K *)wbk;
                memcpy(&dh[r], wbk + offsetof(block_q6_K, d), sizeof dh[r]);
                const __m256i m2 = _mm256_set1_epi8(3);
                UNROLL for (int h = 0; h < 2; h++) {
                    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h));
                    const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h + 32));
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(k->qh + 32 * h));
                    const __m128i s8 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(k->scales + 8 * h)));
                    const __m256i sc = _mm256_set_m128i(s8, s8);
                    UNROLL for (int g = 0; g < 4; g++) {
                        const __m256i l = g & 1 ? ql1 : ql0;
                        const __m256i lo = g < 2 ? _mm256_and_si256(l, m4)
                                                 : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                        const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m2), 4));
                        const char a = (char)(4 * g), c = (char)(4 * g + 2);
                        const __m256i scv = _mm256_shuffle_epi8(sc, _mm256_setr_epi8(
                            a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1),
                            a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1),
                            c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1),
                            c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1)));
                        UNROLL for (int j = 0; j < J; j++) {
                            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * h + 32 * g));
                            acc[r * J + j] = _mm256_add_epi32(acc[r * J + j],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scv));
                        }
                    }
                }
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)k->scales));
                UNROLL for (int j = 0; j < J; j++) {
                    const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                    const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
                    acc[r * J + j] = _mm256_sub_epi32(acc[r * J + j],
                                                      _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                }
                continue;
            }
            const uint8_t *qs = kt == K_Q4 ? ((const block_q4_K *)wbk)->qs : ((const block_q5_K *)wbk)->qs;
            const uint8_t *qhp = kt == K_Q5 ? ((const block_q5_K *)wbk)->qh : NULL;
            memcpy(&dh[r], wbk, sizeof dh[r]);
            memcpy(&mh[r], wbk + 2, sizeof mh[r]);
            uint8_t sc[8], m[8];
            k4_scales(((const block_q4_K *)wbk)->scales, sc, m);
            const __m128i sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc));
            const __m256i scales = _mm256_set_m128i(sc16, sc16);
            __m256i hbits = _mm256_setzero_si256();
            if (qhp)
                hbits = _mm256_loadu_si256((const __m256i *)qhp);
            UNROLL for (int p = 0; p < 4; p++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
                __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                if (qhp) {
                    const __m256i one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p + 1), one), 4));
                }
                const __m256i s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * p + 1) + 4 * p)));
                const __m256i s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * p + 3) + 4 * p + 2)));
                UNROLL for (int j = 0; j < J; j++) {
                    const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * p));
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * p + 32));
                    acc[r * J + j] = _mm256_add_epi32(acc[r * J + j],
                        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0),
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1)));
                }
            }
            const __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
            const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
            UNROLL for (int j = 0; j < J; j++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs) + b;
                mn[r * J + j] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), m16);
            }
        }
        const __m256 dxv = _mm256_loadu_ps(xd + 8 * b);
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum8x8(acc)),
                               _mm256_mul_ps(f16_lanes(dh, R, J), dxv), facc);
        if (kt != K_Q6)
            facc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sum8x8(mn)),
                                    _mm256_mul_ps(f16_lanes(mh, R, J), dxv), facc);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, facc);
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < J; j++)
            y[(size_t)j * ldy + r] = lanes[r * J + j];
}

typedef void (*kfew_fn)(int J, int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                        size_t xs, const float *xd, float *y, size_t ldy);

/* n_w x n_x outputs, activation rows 8 at a time (a last single row by
 * krow_dot). */
INLINE void ktile_few(int kt, kfew_fn few, int64_t n, const uint8_t *w, size_t ws, int n_w,
                      const uint8_t *x, size_t xs, int n_x, float *y, size_t ldy)
{
    float xd[8 * KFEW_NBMAX];
    const int64_t nb = n / QK_K;
    for (int j0 = 0; j0 < n_x; j0 += 8) {
        const int J = n_x - j0 < 8 ? n_x - j0 : 8, R = 8 / J;
        const uint8_t *xj = x + (size_t)j0 * xs;
        float *yj = y + (size_t)j0 * ldy;
        if (J == 1) {
            for (int i = 0; i < n_w; i++)
                yj[i] = krow_dot(kt, w + (size_t)i * ws, xj, n);
            continue;
        }
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < 8; l++)
                xd[8 * b + l] = l < R * J ? ((const block_q8_K *)(xj + (size_t)(l % J) * xs))[b].d : 0.0f;
        for (int i = 0; i < n_w; i += R)
            few(J, n, w + (size_t)i * ws, ws, n_w - i < R ? n_w - i : R, xj, xs, xd, yj + i, ldy);
    }
}

/* 8 weight rows, one super-block, interleaved. */
typedef struct {
    uint8_t q[64][32];     /* group g: levels 4g..4g+3 of rows 0..7 */
    int16_t sc[16][16];    /* sub-block s: row r's scale at 2r and 2r + 1 */
    int16_t mp[8][16];     /* for the bsums pair k (2k, 2k + 1), row r's multipliers at
                              2r, 2r + 1: Q6_K the scales of sub-blocks 2k and 2k + 1,
                              Q4_K/Q5_K the minimum of sub-block k, twice */
    float d[8], dmin[8];
} kpack;

/* Super-block b of rows [0, nr) at w (stride ws) into a pack; rows nr..7
 * are zero. */
INLINE void krepack(int kt, const uint8_t *w, size_t ws, int nr, int64_t b, kpack *out)
{
    const size_t wb = kblock_bytes(kt);
    int16_t sc[8][16], mn[8][8];
    for (int r = 0; r < 8; r++) {
        const uint8_t *p = w + (size_t)r * ws + (size_t)b * wb;
        out->d[r] = out->dmin[r] = 0.0f;
        for (int s = 0; s < 16; s++)
            sc[r][s] = 0;
        for (int s = 0; s < 8; s++)
            mn[r][s] = 0;
        if (r >= nr)
            continue;
        fp16_t h;
        if (kt == K_Q6) {
            const block_q6_K *k = (const block_q6_K *)p;
            memcpy(&h, p + offsetof(block_q6_K, d), sizeof h);
            out->d[r] = h2f(h);
            for (int s = 0; s < 16; s++)
                sc[r][s] = k->scales[s];
        } else {
            uint8_t s8[8], m8[8];
            k4_scales(((const block_q4_K *)p)->scales, s8, m8);
            memcpy(&h, p, sizeof h);
            out->d[r] = h2f(h);
            memcpy(&h, p + 2, sizeof h);
            out->dmin[r] = h2f(h);
            for (int s = 0; s < 8; s++) {
                sc[r][s] = s8[s];
                mn[r][s] = m8[s];
            }
        }
    }
    for (int c = 0; c < 8; c++) {             /* 32 elements at a time */
        __m256i v[8];
        for (int r = 0; r < 8; r++) {
            const uint8_t *p = w + (size_t)r * ws + (size_t)b * wb;
            if (r >= nr)
                v[r] = _mm256_setzero_si256();
            else if (kt == K_Q6)
                v[r] = q6_levels((const block_q6_K *)p, c >> 2, c & 3);
            else if (kt == K_Q5)
                v[r] = k4_level(((const block_q5_K *)p)->qs, ((const block_q5_K *)p)->qh, c);
            else
                v[r] = k4_level(((const block_q4_K *)p)->qs, NULL, c);
        }
        transpose8(v);
        for (int g = 0; g < 8; g++)
            _mm256_storeu_si256((__m256i *)out->q[8 * c + g], v[g]);
    }
    const int n_sub = kt == K_Q6 ? 16 : 8;
    for (int s = 0; s < n_sub; s++)
        for (int r = 0; r < 8; r++)
            out->sc[s][2 * r] = out->sc[s][2 * r + 1] = sc[r][s];
    for (int k = 0; k < 8; k++)
        for (int r = 0; r < 8; r++) {
            out->mp[k][2 * r] = kt == K_Q6 ? sc[r][2 * k] : mn[r][k];
            out->mp[k][2 * r + 1] = kt == K_Q6 ? sc[r][2 * k + 1] : mn[r][k];
        }
}

/* The end of a super-block for rn activation rows (blocks xs bytes apart):
 * the offsets from the bsums, then the two FMAs. */
INLINE void kfinish(int kt, int rn, const kpack *P, const uint8_t *x, size_t xs, __m256i *isum,
                    __m256 *acc)
{
    const __m256 dv = _mm256_loadu_ps(P->d), dminv = _mm256_loadu_ps(P->dmin);
    for (int j = 0; j < rn; j++) {
        const block_q8_K *xb = (const block_q8_K *)(x + (size_t)j * xs);
        const __m256 dx = _mm256_set1_ps(xb->d);
        __m256i off = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++)
            off = _mm256_add_epi32(off, _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)P->mp[k]), bcast4(&xb->bsums[2 * k])));
        if (kt == K_Q6) {
            isum[j] = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(off, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dv, dx), acc[j]);
        } else {
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dv, dx), acc[j]);
            acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), _mm256_mul_ps(dminv, dx), acc[j]);
        }
    }
}

/* AVX2 inner kernel: 8 packed rows times rn prepared activation rows, one
 * super-block; acc[j] lane r is output (row r, activation j). */
INLINE void kkernel_avx2(int kt, int rn, const kpack *P, const uint8_t *x, size_t xs, __m256 *acc)
{
    const int flush = kt == K_Q4 ? 8 : kt == K_Q5 ? 4 : 2;   /* groups per 16-bit sum */
    const int gsub = kt == K_Q6 ? 4 : 8;                     /* groups per sub-block */
    __m256i isum[KRN];
    UNROLL for (int j = 0; j < rn; j++)
        isum[j] = _mm256_setzero_si256();
    for (int g0 = 0; g0 < 64; g0 += flush) {
        __m256i s16[KRN];
        UNROLL for (int j = 0; j < rn; j++)
            s16[j] = _mm256_setzero_si256();
        NO_UNROLL for (int g = g0; g < g0 + flush; g++) {
            const __m256i W = _mm256_loadu_si256((const __m256i *)P->q[g]);
            UNROLL for (int j = 0; j < rn; j++)
                s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(W, bcast4(((const block_q8_K *)(x + (size_t)j * xs))->qs + 4 * g)));
        }
        const __m256i scv = _mm256_loadu_si256((const __m256i *)P->sc[g0 / gsub]);
        UNROLL for (int j = 0; j < rn; j++)
            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16[j], scv));
    }
    kfinish(kt, rn, P, x, xs, isum, acc);
}

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* AVX-VNNI inner kernel: VPDPBUSD per sub-block (a fresh 32-bit sum), then
 * the scale: sub-block sums are at most 32 * 63 * 128, times a scale of at
 * most 128 still fits, so the product is taken in 32 bits. */
VNNI INLINE void kkernel_vnni(int kt, int rn, const kpack *P, const uint8_t *x, size_t xs, __m256 *acc)
{
    const int gsub = kt == K_Q6 ? 4 : 8;
    __m256i isum[KRN];
    UNROLL for (int j = 0; j < rn; j++)
        isum[j] = _mm256_setzero_si256();
    for (int s = 0; s < 64 / gsub; s++) {
        __m256i part[KRN];
        UNROLL for (int j = 0; j < rn; j++)
            part[j] = _mm256_setzero_si256();
        UNROLL for (int g = s * gsub; g < s * gsub + gsub; g++) {
            const __m256i W = _mm256_loadu_si256((const __m256i *)P->q[g]);
            UNROLL for (int j = 0; j < rn; j++)
                part[j] = _mm256_dpbusd_avx_epi32(part[j], W, bcast4(((const block_q8_K *)(x + (size_t)j * xs))->qs + 4 * g));
        }
        /* sc[s] holds each row's scale in both 16-bit halves of its lane;
         * the low half, sign-extended, is the scale */
        const __m256i scv = _mm256_srai_epi32(
            _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)P->sc[s]), 16), 16);
        UNROLL for (int j = 0; j < rn; j++)
            isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(part[j], scv));
    }
    kfinish(kt, rn, P, x, xs, isum, acc);
}

typedef void (*kkernel_fn)(const kpack *P, const uint8_t *x, size_t xs, int rn, __m256 *acc);

INLINE void ktile_packed(int kt, kkernel_fn kernel, int64_t n, const uint8_t *w, size_t ws,
                         int n_w, const uint8_t *x, size_t xs, int n_x, float *y, size_t ldy)
{
    kpack pk[KNWC / 8];
    __m256 acc[KNWC / 8][KXB];
    const int64_t nb = n / QK_K;
    for (int i1 = 0; i1 < n_w; i1 += KNWC) {
        const int nwc = n_w - i1 < KNWC ? n_w - i1 : KNWC, ng = (nwc + 7) / 8;
        for (int j1 = 0; j1 < n_x; j1 += KXB) {
            const int nxb = n_x - j1 < KXB ? n_x - j1 : KXB;
            for (int g = 0; g < ng; g++)
                for (int j = 0; j < nxb; j++)
                    acc[g][j] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                for (int g = 0; g < ng; g++) {
                    const int nr = nwc - 8 * g < 8 ? nwc - 8 * g : 8;
                    krepack(kt, w + (size_t)(i1 + 8 * g) * ws, ws, nr, b, &pk[g]);
                }
                for (int j0 = 0; j0 < nxb; j0 += KRN) {
                    const uint8_t *xj = x + (size_t)(j1 + j0) * xs + (size_t)b * sizeof(block_q8_K);
                    const int rn = nxb - j0 < KRN ? nxb - j0 : KRN;
                    for (int g = 0; g < ng; g++)
                        kernel(&pk[g], xj, xs, rn, &acc[g][j0]);
                }
            }
            store_outputs(acc, ng, nwc, nxb, y + (size_t)j1 * ldy + i1, ldy);
        }
    }
}

#define KSWITCH(K, kt, rn, ...)                                \
    switch (rn) {                                              \
    case 1: K(kt, 1, __VA_ARGS__); break;                      \
    case 2: K(kt, 2, __VA_ARGS__); break;                      \
    case 3: K(kt, 3, __VA_ARGS__); break;                      \
    default: K(kt, KRN, __VA_ARGS__); break;                   \
    }

#define DEFINE_KFORMAT(name, kt)                                                       \
    static float name##_vec_dot(const void *w, const void *x, int64_t n)               \
    {                                                                                  \
        return krow_dot(kt, w, x, n);                                                  \
    }                                                                                  \
    static void name##_kernel_avx2(const kpack *P, const uint8_t *x, size_t xs,        \
                                   int rn, __m256 *acc)                                \
    {                                                                                  \
        KSWITCH(kkernel_avx2, kt, rn, P, x, xs, acc)                                   \
    }                                                                                  \
    VNNI static void name##_kernel_vnni(const kpack *P, const uint8_t *x, size_t xs,   \
                                        int rn, __m256 *acc)                           \
    {                                                                                  \
        KSWITCH(kkernel_vnni, kt, rn, P, x, xs, acc)                                   \
    }                                                                                  \
    static void name##_few(int J, int64_t n, const uint8_t *w, size_t ws, int nr,      \
                           const uint8_t *x, size_t xs, const float *xd, float *y,     \
                           size_t ldy)                                                 \
    {                                                                                  \
        SWITCH_ROWS8(kfew, kt, J, n, w, ws, nr, x, xs, xd, y, ldy)                     \
    }                                                                                  \
    static void name##_tile_any(int vnni, int64_t n, const void *w, size_t ws,         \
                                int n_w, const void *x, size_t xs, int n_x, float *y,  \
                                size_t ldy)                                            \
    {                                                                                  \
        if (n_x == 1) {                                                                \
            for (int i = 0; i < n_w; i++)                                              \
                y[i] = krow_dot(kt, (const uint8_t *)w + (size_t)i * ws, x, n);        \
            return;                                                                    \
        }                                                                              \
        if (n_x <= KFEW_ROWS && n / QK_K <= KFEW_NBMAX) {                              \
            ktile_few(kt, name##_few, n, w, ws, n_w, x, xs, n_x, y, ldy);              \
            return;                                                                    \
        }                                                                              \
        ktile_packed(kt, vnni ? name##_kernel_vnni : name##_kernel_avx2, n, w, ws,     \
                     n_w, x, xs, n_x, y, ldy);                                         \
    }                                                                                  \
    static void name##_tile(int64_t n, const void *w, size_t ws, int n_w,              \
                            const void *x, size_t xs, int n_x, float *y, size_t ldy)   \
    {                                                                                  \
        name##_tile_any(0, n, w, ws, n_w, x, xs, n_x, y, ldy);                         \
    }                                                                                  \
    static void name##_tile_vnni(int64_t n, const void *w, size_t ws, int n_w,         \
                                 const void *x, size_t xs, int n_x, float *y,          \
                                 size_t ldy)                                           \
    {                                                                                  \
        name##_tile_any(1, n, w, ws, n_w, x, xs, n_x, y, ldy);                         \
    }

DEFINE_KFORMAT(q4_K, K_Q4)
DEFINE_KFORMAT(q5_K, K_Q5)
DEFINE_KFORMAT(q6_K, K_Q6)

/* ---- registration -------------------------------------------------------- */

void tensor__kernels_k_avx2(tensor_traits *table, int use_vnni)
{
    tensor_traits *t = &table[TT_Q4_K];
    t->to_float = q4_K_to_float;
    t->dot_f32 = q4_K_dot_f32;
    t->vec_dot = q4_K_vec_dot;
    t->vec_dot_tile = use_vnni ? q4_K_tile_vnni : q4_K_tile;

    t = &table[TT_Q5_K];
    t->to_float = q5_K_to_float;
    t->dot_f32 = q5_K_dot_f32;
    t->vec_dot = q5_K_vec_dot;
    t->vec_dot_tile = use_vnni ? q5_K_tile_vnni : q5_K_tile;

    t = &table[TT_Q6_K];
    t->to_float = q6_K_to_float;
    t->dot_f32 = q6_K_dot_f32;
    t->vec_dot = q6_K_vec_dot;
    t->vec_dot_tile = use_vnni ? q6_K_tile_vnni : q6_K_tile;

    table[TT_Q8_K].from_float = q8_K_from_float;
}
