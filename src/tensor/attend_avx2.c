/* attend_avx2.c - attention and SwiGLU (attend.h) with AVX2 and FMA.
 *
 * Attention streams the cache once: the positions go in tiles (TILE of
 * them, a few tens of KiB of keys or values), and every query head of the
 * group works on a tile while it is in the L1/L2 cache, so at long context
 * each key and value byte comes from memory once per token, not once per
 * query head.  Two passes over the positions: scores (8 positions per step,
 * their 8 dot products reduced by one transposing sum), then the softmax
 * of each head (its weights normalised in place, as the reference does),
 * then the weighted values.  Widths that are not a
 * multiple of 8 go to the reference code.  Cache elements are f32 or f16
 * (converted by F16C as they are loaded) or q8_0: 8 int8 values at a time
 * widened to floats, a key block's 32 products summed before its scale
 * multiplies them (one multiply per block, not per value), a value block's
 * scale folded into the position's weight.  The query stays f32 (llama.cpp
 * rounds it to q8_0 for its integer dot products; here the cache is the only
 * rounding).
 *
 * The exponential: 2^n * p(r), x = n ln 2 + r, |r| <= ln 2 / 2, p the
 * degree-6 polynomial of Cephes' expf (within 2 ulp of libm's over the
 * range softmax and SiLU use), inputs clamped to [-87.3, 88.3].
 */
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "tensor/attend.h"
#include "tensor/kernels_isa.h"
#include "tensor/simd_x86.h"
#include "tensor/kv_types.h"

/* the accumulator arrays must become registers: unroll their loops fully */
#undef UNROLL    /* this file's register loops unroll deeper than simd_x86.h's */
#if defined(__clang__)
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 16")
#endif

enum { TILE = 128, VCHUNK = 8 };   /* positions per tile; ymm per value pass */

INLINE __m256 exp256(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lane j: the sum of the 8 lanes of a[j]. */
INLINE __m256 sum8x8(const __m256 a[8])
{
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* 8 cache elements as floats. */
INLINE __m256 kv_f32(const float *p) { return _mm256_loadu_ps(p); }
INLINE __m256 kv_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* s[p - p0] = scale * q . k_p for p in [p0, p1). */
#define DEFINE_SCORES(NAME, T, LOAD)                                                          \
    static void NAME(const float *q, int D, float scale, const T *k, size_t ks, int p0,     \
                     int p1, float *s)                                                       \
    {                                                                                         \
        const __m256 sc = _mm256_set1_ps(scale);                                              \
        int p = p0;                                                                           \
        for (; p + 8 <= p1; p += 8) {                                                         \
            const T *kp = k + (size_t)p * ks;                                                 \
            __m256 acc[8];                                                                    \
            UNROLL for (int j = 0; j < 8; j++)                                                \
                acc[j] = _mm256_setzero_ps();                                                 \
            for (int c = 0; c < D; c += 8) {                                                  \
                const __m256 qc = _mm256_loadu_ps(q + c);                                     \
                UNROLL for (int j = 0; j < 8; j++)                                            \
                    acc[j] = _mm256_fmadd_ps(qc, LOAD(kp + (size_t)j * ks + c), acc[j]);     \
            }                                                                                 \
            _mm256_storeu_ps(s + (p - p0), _mm256_mul_ps(sum8x8(acc), sc));                   \
        }                                                                                     \
        for (; p < p1; p++) {                                                                 \
            const T *kp = k + (size_t)p * ks;                                                 \
            __m256 acc = _mm256_setzero_ps();                                                 \
            for (int c = 0; c < D; c += 8)                                                    \
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), LOAD(kp + c), acc);            \
            s[p - p0] = hsum_ps(acc) * scale;                                                    \
        }                                                                                     \
    }
DEFINE_SCORES(scores_f32, float, kv_f32)
DEFINE_SCORES(scores_f16, uint16_t, kv_f16)

/* 8 int8 values as floats; a block's scale broadcast. */
INLINE __m256 q8_8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
INLINE __m256 q8_scale(const block_q8_0 *b)
{
    return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(b->d)));
}

/* The sum over the first n (a multiple of 8, at most 32) values of a block
 * of q[i] * qs[i], unscaled. */
INLINE __m256 q8_block_dot(const float *q, const block_q8_0 *b, int n)
{
    if (n == QK8_0) {
        const __m256 a = _mm256_fmadd_ps(_mm256_loadu_ps(q), q8_8(b->qs),
                                         _mm256_mul_ps(_mm256_loadu_ps(q + 8), q8_8(b->qs + 8)));
        const __m256 c = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), q8_8(b->qs + 16),
                                         _mm256_mul_ps(_mm256_loadu_ps(q + 24), q8_8(b->qs + 24)));
        return _mm256_add_ps(a, c);
    }
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), q8_8(b->qs + i), a);
    return a;
}

/* s[p - p0] = scale * q . k_p for p in [p0, p1), a q8_0 cache of rows of
 * `kb` blocks. */
static void scores_q8(const float *q, int D, float scale, const block_q8_0 *k, size_t kb, int p0,
                      int p1, float *s)
{
    const __m256 sc = _mm256_set1_ps(scale);
    int p = p0;
    for (; p + 8 <= p1; p += 8) {
        const block_q8_0 *kp = k + (size_t)p * kb;
        __m256 acc[8];
        UNROLL for (int j = 0; j < 8; j++)
            acc[j] = _mm256_setzero_ps();
        for (int c = 0; c < D; c += QK8_0) {
            const int n = D - c < QK8_0 ? D - c : QK8_0;
            UNROLL for (int j = 0; j < 8; j++) {
                const block_q8_0 *b = kp + (size_t)j * kb + c / QK8_0;
                acc[j] = _mm256_fmadd_ps(q8_block_dot(q + c, b, n), q8_scale(b), acc[j]);
            }
        }
        _mm256_storeu_ps(s + (p - p0), _mm256_mul_ps(sum8x8(acc), sc));
    }
    for (; p < p1; p++) {
        const block_q8_0 *kp = k + (size_t)p * kb;
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < D; c += QK8_0) {
            const block_q8_0 *b = kp + c / QK8_0;
            acc = _mm256_fmadd_ps(q8_block_dot(q + c, b, D - c < QK8_0 ? D - c : QK8_0),
                                  q8_scale(b), acc);
        }
        s[p - p0] = hsum_ps(acc) * scale;
    }
}

/* s[i] = exp(s[i] - max) for i < n; returns the sum (in double).  Weights
 * under e^-64 (1.6e-28 of the largest) are set to 0: they cannot change a
 * float sum, and kept, they would become subnormal once divided by the sum
 * (up to n), and subnormal operands take a slow path on some CPUs. */
enum { EXP_CUT = -64 };

static double exp_shift(float *s, int n)
{
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + i));
    float m = -INFINITY, lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int j = 0; j < 8; j++)
        m = lanes[j] > m ? lanes[j] : m;
    for (; i < n; i++)
        m = s[i] > m ? s[i] : m;
    const __m256 mb = _mm256_set1_ps(m), cut = _mm256_set1_ps(EXP_CUT);
    __m256d sum = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + i), mb);
        const __m256 e = _mm256_and_ps(exp256(x), _mm256_cmp_ps(x, cut, _CMP_GE_OQ));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_pd(sum, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                               _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    double d[4];
    _mm256_storeu_pd(d, sum);
    double total = (d[0] + d[1]) + (d[2] + d[3]);
    if (i < n) {
        float tail[8] = { 0 };
        memcpy(tail, s + i, (size_t)(n - i) * sizeof(float));
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(tail), mb);
        _mm256_storeu_ps(tail, _mm256_and_ps(exp256(x), _mm256_cmp_ps(x, cut, _CMP_GE_OQ)));
        for (int j = 0; j < n - i; j++) {
            s[i + j] = tail[j];
            total += tail[j];
        }
    }
    return total;
}

/* o[0, 8 * NC) += sum over p in [p0, p1) of w[p - p0] * v_p[c0, c0 + 8 * NC),
 * v_p = v + p * vs (in T: floats, halves or q8_0 blocks); MADD(w, row, e,
 * acc) adds w times the row's values [e, e + 8) to acc. */
#define DEFINE_VALUES(NAME, NC, T, MADD)                                                      \
    static void NAME(const float *w, const T *v, size_t vs, int c0, int p0, int p1, float *o) \
    {                                                                                         \
        __m256 acc[NC];                                                                       \
        UNROLL for (int c = 0; c < NC; c++)                                                   \
            acc[c] = _mm256_loadu_ps(o + 8 * c);                                              \
        for (int p = p0; p < p1; p++) {                                                       \
            const __m256 wp = _mm256_broadcast_ss(w + (p - p0));                              \
            const T *vp = v + (size_t)p * vs;                                                 \
            UNROLL for (int c = 0; c < NC; c++)                                               \
                acc[c] = MADD(wp, vp, c0 + 8 * c, acc[c]);                                    \
        }                                                                                     \
        UNROLL for (int c = 0; c < NC; c++)                                                   \
            _mm256_storeu_ps(o + 8 * c, acc[c]);                                              \
    }
#define MADD_F32(w, row, e, a) _mm256_fmadd_ps(w, kv_f32((row) + (e)), a)
#define MADD_F16(w, row, e, a) _mm256_fmadd_ps(w, kv_f16((row) + (e)), a)
/* values [e, e + 8) lie in one block (8 divides 32), whose scale joins the
 * position's weight */
#define MADD_Q8(w, row, e, a)                                                                 \
    _mm256_fmadd_ps(_mm256_mul_ps(w, q8_scale((row) + (e) / QK8_0)),                          \
                    q8_8((row)[(e) / QK8_0].qs + (e) % QK8_0), a)
DEFINE_VALUES(values8_f32, VCHUNK, float, MADD_F32)
DEFINE_VALUES(values1_f32, 1, float, MADD_F32)
DEFINE_VALUES(values8_f16, VCHUNK, uint16_t, MADD_F16)
DEFINE_VALUES(values1_f16, 1, uint16_t, MADD_F16)
DEFINE_VALUES(values8_q8, VCHUNK, block_q8_0, MADD_Q8)
DEFINE_VALUES(values1_q8, 1, block_q8_0, MADD_Q8)

void tensor__attend_avx2(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                         const void *k, size_t k_stride, const void *v, size_t v_stride,
                         int n_pos, float *scores, float *out)
{
    const int f16 = kv_type == TT_F16, q8 = kv_type == TT_Q8_0;
    if (D % 8 || Dv % 8 || !kv_type_ok(kv_type)) {
        tensor_attend_ref(q, n_q, D, Dv, scale, kv_type, k, k_stride, v, v_stride, n_pos, scores,
                          out);
        return;
    }
    for (int p0 = 0; p0 < n_pos; p0 += TILE) {
        const int p1 = n_pos - p0 < TILE ? n_pos : p0 + TILE;
        for (int g = 0; g < n_q; g++) {
            float *sg = scores + (size_t)g * n_pos + p0;
            if (q8)
                scores_q8(q + (size_t)g * D, D, scale, k, kv_row_bytes(TT_Q8_0, k_stride) /
                          sizeof(block_q8_0), p0, p1, sg);
            else if (f16)
                scores_f16(q + (size_t)g * D, D, scale, k, k_stride, p0, p1, sg);
            else
                scores_f32(q + (size_t)g * D, D, scale, k, k_stride, p0, p1, sg);
        }
    }
    for (int g = 0; g < n_q; g++) {
        float *s = scores + (size_t)g * n_pos;
        const __m256 inv = _mm256_set1_ps((float)(1.0 / exp_shift(s, n_pos)));
        int i = 0;
        for (; i + 8 <= n_pos; i += 8)
            _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
        for (; i < n_pos; i++)
            s[i] *= _mm256_cvtss_f32(inv);
    }
    memset(out, 0, (size_t)n_q * Dv * sizeof(float));
    for (int p0 = 0; p0 < n_pos; p0 += TILE) {
        const int p1 = n_pos - p0 < TILE ? n_pos : p0 + TILE;
        for (int g = 0; g < n_q; g++) {
            const float *w = scores + (size_t)g * n_pos + p0;
            float *o = out + (size_t)g * Dv;
            int c = 0;
            if (q8) {
                const size_t vb = kv_row_bytes(TT_Q8_0, v_stride) / sizeof(block_q8_0);
                for (; c + 8 * VCHUNK <= Dv; c += 8 * VCHUNK)
                    values8_q8(w, v, vb, c, p0, p1, o + c);
                for (; c < Dv; c += 8)
                    values1_q8(w, v, vb, c, p0, p1, o + c);
                continue;
            }
            for (; c + 8 * VCHUNK <= Dv; c += 8 * VCHUNK)
                f16 ? values8_f16(w, v, v_stride, c, p0, p1, o + c)
                    : values8_f32(w, v, v_stride, c, p0, p1, o + c);
            for (; c < Dv; c += 8)
                f16 ? values1_f16(w, v, v_stride, c, p0, p1, o + c)
                    : values1_f32(w, v, v_stride, c, p0, p1, o + c);
        }
    }
}

double tensor__sum_exp_avx2(const float *x, size_t n, float shift)
{
    const __m256 sh = _mm256_set1_ps(shift), big = _mm256_set1_ps(FLT_MAX),
                 ninf = _mm256_set1_ps(-INFINITY), cut = _mm256_set1_ps(EXP_CUT);
    __m256d sum = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 d = _mm256_sub_ps(_mm256_min_ps(v, big), sh);
        const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_GT_OQ),
                                          _mm256_cmp_ps(d, cut, _CMP_GE_OQ));
        const __m256 e = _mm256_and_ps(exp256(d), keep);
        sum = _mm256_add_pd(sum, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                               _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    double d4[4];
    _mm256_storeu_pd(d4, sum);
    return (d4[0] + d4[1]) + (d4[2] + d4[3]) + tensor_sum_exp_ref(x + i, n - i, shift);
}

void tensor__swiglu_avx2(float *a, const float *b, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 e = exp256(_mm256_sub_ps(zero, x));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                              _mm256_loadu_ps(b + i)));
    }
    if (i < n)
        tensor_swiglu_ref(a + i, b + i, n - i);
}
