/* quant_avx2.c - AVX2/FMA/F16C kernels of the float types (F32, F16,
 * BF16: dot products, converters), the activation quantisers (Q8_0, Q8_1),
 * the decoders of the 32-element block formats (to_float, dot_f32), the
 * f32 vector helper, and tensor__kernels_avx2, which installs these and the
 * dot products of quant_tile_avx2.c, quant_k_avx2.c and quant_klow_avx2.c.
 *
 * Compiled with -mavx2 -mfma -mf16c (the Makefile's *_avx2.c rule) and
 * only called after the CPU probe found those instructions.
 *
 * Contracts (types.h): to_float and the activation from_float are
 * bit-identical to the reference; vec_dot and dot_f32 differ from it only
 * by the order of float summation.  The float types' dot products are one
 * tile kernel (vec_dot_tile): an RM x RN block of weight rows times
 * activation rows, 8 elements at a time into one 8-lane accumulator per
 * output.  Each output gets the same instructions in the same order
 * whatever the tile's shape, so it never depends on how the caller split
 * the work, and vec_dot is the 1 x 1 tile.
 *
 * Sections: helpers; float types; activation quantisers; block decoders
 * (to_float, dot_f32); the f32 vector helper; registration.
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

#if defined(__clang__)
/* to_float must round like the reference: a separate multiply and add */
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- helpers ------------------------------------------------------------ */

INLINE float hmax_ps(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 0x10 in byte j where bit j of the little-endian 32 bits at p is set. */
INLINE __m256i fifth_bits32(const uint8_t *p)
{
    uint32_t bits;
    memcpy(&bits, p, sizeof bits);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Four vectors of 8 int32 (each in -128..127) to 32 bytes in order. */
INLINE __m256i pack_i32x4_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i v = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* ---- float types: F32, F16, BF16 ----------------------------------------
 * One tile kernel for the three, on 8 elements at a time converted to f32,
 * with FMA into one accumulator per output; n need not be a multiple of 8
 * (the float types have blocks of one), so a scalar tail follows. */

enum { FT_F32, FT_F16, FT_BF16 };

INLINE __m256 load8(int ft, const uint8_t *p)
{
    if (ft == FT_F32)
        return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (ft == FT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float load1(int ft, const uint8_t *p)
{
    if (ft == FT_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return ft == FT_F16 ? h2f(h) : bf16_to_fp32(h);
}

INLINE void float_tile(int ft, int RM, int RN, int64_t n, const uint8_t *w, size_t ws,
                       const uint8_t *x, size_t xs, float *y, size_t ldy)
{
    const size_t es = ft == FT_F32 ? 4 : 2;
    __m256 acc[4][4];
    UNROLL for (int i = 0; i < RM; i++)
        UNROLL for (int j = 0; j < RN; j++)
            acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 wv[4];
        UNROLL for (int i = 0; i < RM; i++)
            wv[i] = load8(ft, w + (size_t)i * ws + (size_t)k * es);
        UNROLL for (int j = 0; j < RN; j++) {
            const __m256 xv = load8(ft, x + (size_t)j * xs + (size_t)k * es);
            UNROLL for (int i = 0; i < RM; i++)
                acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
    UNROLL for (int i = 0; i < RM; i++)
        UNROLL for (int j = 0; j < RN; j++) {
            float s = hsum_ps(acc[i][j]);
            for (int64_t t = k; t < n; t++)
                s += load1(ft, w + (size_t)i * ws + (size_t)t * es) *
                     load1(ft, x + (size_t)j * xs + (size_t)t * es);
            y[(size_t)j * ldy + i] = s;
        }
}

#define F32_TILE(RM, RN, ...) float_tile(FT_F32, RM, RN, __VA_ARGS__)
#define F16_TILE(RM, RN, ...) float_tile(FT_F16, RM, RN, __VA_ARGS__)
#define BF16_TILE(RM, RN, ...) float_tile(FT_BF16, RM, RN, __VA_ARGS__)

/* The tile driver: covers an n_w x n_x grid with RM x RN tiles, calling
 * KERNEL(rm, rn, ...) with constant shapes (so each shape is compiled with
 * its accumulators in registers) for the full tiles and the edges.  The
 * activation rows of a tile column stay in L1 while the weight rows pass. */
#define TILE_CASE(K, RM, RN, a, b)                                                 \
    case (a) * 8 + (b):                                                            \
        if ((a) <= (RM) && (b) <= (RN))                                            \
            K(a, b, n, wp, ws, xp, xs, yp, ldy);                                   \
        break;
#define DEFINE_TILE(NAME, K, RM, RN)                                               \
    static void NAME(int64_t n, const void *w, size_t ws, int n_w,                 \
                     const void *x, size_t xs, int n_x, float *y, size_t ldy)      \
    {                                                                              \
        for (int j0 = 0; j0 < n_x; j0 += (RN)) {                                   \
            const int rn = n_x - j0 < (RN) ? n_x - j0 : (RN);                      \
            const uint8_t *xp = (const uint8_t *)x + (size_t)j0 * xs;              \
            for (int i0 = 0; i0 < n_w; i0 += (RM)) {                               \
                const int rm = n_w - i0 < (RM) ? n_w - i0 : (RM);                  \
                const uint8_t *wp = (const uint8_t *)w + (size_t)i0 * ws;          \
                float *yp = y + (size_t)j0 * ldy + i0;                             \
                switch (rm * 8 + rn) {                                             \
                TILE_CASE(K, RM, RN, 1, 1) TILE_CASE(K, RM, RN, 1, 2)              \
                TILE_CASE(K, RM, RN, 1, 3) TILE_CASE(K, RM, RN, 1, 4)              \
                TILE_CASE(K, RM, RN, 2, 1) TILE_CASE(K, RM, RN, 2, 2)              \
                TILE_CASE(K, RM, RN, 2, 3) TILE_CASE(K, RM, RN, 2, 4)              \
                TILE_CASE(K, RM, RN, 3, 1) TILE_CASE(K, RM, RN, 3, 2)              \
                TILE_CASE(K, RM, RN, 3, 3) TILE_CASE(K, RM, RN, 3, 4)              \
                TILE_CASE(K, RM, RN, 4, 1) TILE_CASE(K, RM, RN, 4, 2)              \
                TILE_CASE(K, RM, RN, 4, 3) TILE_CASE(K, RM, RN, 4, 4)              \
                default: break;                                                    \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    }                                                                              \
    static float NAME##_dot(const void *w, const void *x, int64_t n)               \
    {                                                                              \
        float y;                                                                   \
        K(1, 1, n, (const uint8_t *)w, 0, (const uint8_t *)x, 0, &y, 0);           \
        return y;                                                                  \
    }

DEFINE_TILE(f32_tile, F32_TILE, 3, 4)
DEFINE_TILE(f16_tile, F16_TILE, 3, 4)
DEFINE_TILE(bf16_tile, BF16_TILE, 3, 4)

/* exact path: weights in f32 order of decoding, FMA per 8 elements */
static float f32_dot_f32(const void *w, const float *x, int64_t n)
{
    float y;
    F32_TILE(1, 1, n, (const uint8_t *)w, 0, (const uint8_t *)x, 0, &y, 0);
    return y;
}

static float f16_dot_f32(const void *w, const float *x, int64_t n)
{
    const fp16_t *h = w;
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + k))),
                              _mm256_loadu_ps(x + k), acc);
    float s = hsum_ps(acc);
    for (; k < n; k++)
        s += h2f(h[k]) * x[k];
    return s;
}

static float bf16_dot_f32(const void *w, const float *x, int64_t n)
{
    const bf16_t *h = w;
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        acc = _mm256_fmadd_ps(load8(FT_BF16, (const uint8_t *)(h + k)), _mm256_loadu_ps(x + k), acc);
    float s = hsum_ps(acc);
    for (; k < n; k++)
        s += bf16_to_fp32(h[k]) * x[k];
    return s;
}

/* The instruction quiets signalling NaNs; the reference keeps their bits,
 * so groups holding a NaN take the scalar path. */
static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const fp16_t *h = src;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(h + k));
        const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7fff)),
                                            _mm_set1_epi16(0x7c00));
        if (_mm_movemask_epi8(nan)) {
            for (int t = 0; t < 8; t++)
                dst[k + t] = fp16_to_fp32(h[k + t]);
            continue;
        }
        _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(v));
    }
    for (; k < n; k++)
        dst[k] = fp16_to_fp32(h[k]);
}

/* Rounds to nearest even like fp32_to_fp16; a NaN (which the instruction
 * would keep the payload of) goes through the reference's scalar code. */
static void f16_from_float(const float *src, void *dst, int64_t n)
{
    fp16_t *h = dst;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_loadu_ps(src + k);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (int t = 0; t < 8; t++)
                h[k + t] = fp32_to_fp16(src[k + t]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(h + k), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; k < n; k++)
        h[k] = fp32_to_fp16(src[k]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const bf16_t *h = src;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(dst + k, load8(FT_BF16, (const uint8_t *)(h + k)));
    for (; k < n; k++)
        dst[k] = bf16_to_fp32(h[k]);
}

/* fp32_to_bf16 on 8 lanes: round to nearest even, NaNs kept quiet. */
static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    bf16_t *h = dst;
    int64_t k = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; k + 8 <= n; k += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(src + k));
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
        const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
        r = _mm256_blendv_epi8(r, q, nan);
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(h + k), p);
    }
    for (; k < n; k++)
        h[k] = fp32_to_bf16(src[k]);
}

/* ---- activation quantisers: Q8_0, Q8_1 -----------------------------------
 * As quant_ref.c: d = amax / 127 (NaNs ignored), quants round(x * 127 /
 * amax) half to even, clamped to -128..127, NaN to 0.  The clamp comes
 * before the rounding here, which gives the same result, and keeps the
 * float-to-int conversion in range for Inf and for the huge products an
 * amax near the smallest floats makes. */

INLINE __m256i quant8(__m256 v, __m256 id)
{
    v = _mm256_mul_ps(v, id);
    const __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    v = _mm256_and_ps(v, ord);
    return _mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* The block of 32 at src: its quants into qs, the f32 d returned, and the
 * sum of the quants in *sum. */
INLINE float quant_block32(const float *src, int8_t *qs, int *sum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int t = 0; t < 4; t++) {
        v[t] = _mm256_loadu_ps(src + 8 * t);
        /* max(|v|, amax) returns amax when |v| is NaN, as fmaxf does */
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[t]), amax);
    }
    const float a = hmax_ps(amax);
    const float d = a / 127.0f;
    const float id = a != 0.0f ? 127.0f / a : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int t = 0; t < 4; t++)
        q[t] = quant8(v[t], idv);
    *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    _mm256_storeu_si256((__m256i *)qs, pack_i32x4_i8(q[0], q[1], q[2], q[3]));
    return d;
}

static void q8_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        int sum;
        b[i].d = fp32_to_fp16(quant_block32(src, b[i].qs, &sum));
    }
}

static void q8_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        int sum;
        const float d = quant_block32(src, b[i].qs, &sum);
        b[i].d = fp32_to_fp16(d);
        b[i].s = fp32_to_fp16((float)sum * d);
    }
}

/* ---- block decoders: to_float and dot_f32 --------------------------------
 * Same expressions as the reference, in the same order: (q - 8) * d, or
 * q * d + m with a separate multiply and add. */

INLINE void store_levels(float *dst, __m256i q, __m256 d, __m256 m, int has_min)
{
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
    for (int t = 0; t < 4; t++) {
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[t])), d);
        if (has_min)
            f = _mm256_add_ps(f, m);
        _mm256_storeu_ps(dst + 8 * t, f);
    }
}

static void q4_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const __m256i q = _mm256_sub_epi8(nibbles32(b[i].qs), _mm256_set1_epi8(8));
        store_levels(dst, q, _mm256_set1_ps(h2f(b[i].d)), _mm256_setzero_ps(), 0);
    }
}

static void q4_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1)
        store_levels(dst, nibbles32(b[i].qs), _mm256_set1_ps(h2f(b[i].d)),
                     _mm256_set1_ps(h2f(b[i].m)), 1);
}

static void q5_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        __m256i q = _mm256_or_si256(nibbles32(b[i].qs), fifth_bits32(b[i].qh));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        store_levels(dst, q, _mm256_set1_ps(h2f(b[i].d)), _mm256_setzero_ps(), 0);
    }
}

static void q5_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        const __m256i q = _mm256_or_si256(nibbles32(b[i].qs), fifth_bits32(b[i].qh));
        store_levels(dst, q, _mm256_set1_ps(h2f(b[i].d)), _mm256_set1_ps(h2f(b[i].m)), 1);
    }
}

static void q8_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0)
        store_levels(dst, _mm256_loadu_si256((const __m256i *)b[i].qs),
                     _mm256_set1_ps(h2f(b[i].d)), _mm256_setzero_ps(), 0);
}

/* The exact-math dot of a block format: blocks decoded (exactly) 256
 * elements at a time, then multiplied and summed with FMA. */
INLINE float dot_f32_blocks(to_float_fn to_float, int64_t bs, size_t bytes, const void *w,
                            const float *x, int64_t n)
{
    float tmp[QK_K];
    const int64_t per = QK_K / bs;
    const uint8_t *p = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += per * bs) {
        const int64_t len = n - i < per * bs ? n - i : per * bs;
        to_float(p, tmp, len);
        p += (size_t)(len / bs) * bytes;
        for (int64_t k = 0; k < len; k += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(tmp + k), _mm256_loadu_ps(x + i + k), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(tmp + k + 8), _mm256_loadu_ps(x + i + k + 8), acc1);
        }
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

#define DOT_F32(type, blk)                                                          \
    static float type##_dot_f32(const void *w, const float *x, int64_t n)           \
    {                                                                               \
        return dot_f32_blocks(type##_to_float, 32, sizeof(blk), w, x, n);           \
    }
DOT_F32(q4_0, block_q4_0)
DOT_F32(q4_1, block_q4_1)
DOT_F32(q5_0, block_q5_0)
DOT_F32(q5_1, block_q5_1)
DOT_F32(q8_0, block_q8_0)

/* ---- registration -------------------------------------------------------- */

void tensor__kernels_avx2(tensor_traits *table, int use_vnni)
{
    tensor_traits *t = &table[TT_F32];
    t->dot_f32 = f32_dot_f32;
    t->vec_dot = f32_tile_dot;
    t->vec_dot_tile = f32_tile;

    t = &table[TT_F16];
    t->to_float = f16_to_float;
    t->from_float = f16_from_float;
    t->dot_f32 = f16_dot_f32;
    t->vec_dot = f16_tile_dot;
    t->vec_dot_tile = f16_tile;

    t = &table[TT_BF16];
    t->to_float = bf16_to_float;
    t->from_float = bf16_from_float;
    t->dot_f32 = bf16_dot_f32;
    t->vec_dot = bf16_tile_dot;
    t->vec_dot_tile = bf16_tile;

    table[TT_Q4_0].to_float = q4_0_to_float;
    table[TT_Q4_0].dot_f32 = q4_0_dot_f32;
    table[TT_Q4_1].to_float = q4_1_to_float;
    table[TT_Q4_1].dot_f32 = q4_1_dot_f32;
    table[TT_Q5_0].to_float = q5_0_to_float;
    table[TT_Q5_0].dot_f32 = q5_0_dot_f32;
    table[TT_Q5_1].to_float = q5_1_to_float;
    table[TT_Q5_1].dot_f32 = q5_1_dot_f32;
    table[TT_Q8_0].to_float = q8_0_to_float;
    table[TT_Q8_0].from_float = q8_0_from_float;
    table[TT_Q8_0].dot_f32 = q8_0_dot_f32;
    table[TT_Q8_1].from_float = q8_1_from_float;

    tensor__kernels_tile_avx2(table, use_vnni);
    tensor__kernels_q4r8_avx2(table, use_vnni);   /* after the tile kernels: takes Q4_0's prep */
    tensor__kernels_k_avx2(table, use_vnni);
    tensor__kernels_q4k_r8_avx2(table, use_vnni);
    tensor__kernels_q8r8_avx2(table, use_vnni);
    if (!use_vnni)   /* with VPDPBUSD, Q6_K keeps its measured kernels */
        tensor__kernels_q6k_r8_avx2(table);
    tensor__kernels_klow_avx2(table);
    tensor__kernels_iq_avx2(table);
}
