/* quant_tile_avx2.c - dot products of the 32-element block formats (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0 weights against Q8_0/Q8_1 activations) for AVX2,
 * with AVX-VNNI variants of the inner kernels.
 *
 * Every path of a format computes an output with the same float operations
 * in the same order, so vec_dot and the tile kernels give the same bits,
 * whatever the tile, thread or batch (vec_dot_tile's contract, types.h).
 * Both differ from the reference only in rounding.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1: for each block b of an output (weight row i,
 * activation row j), the exact integer sum isum_b of level times activation
 * quant, then
 *     acc = fma((float)isum_b, d_w * d_x, acc)       [+ acc = fma(m_w, s_x, acc)]
 * in block order from 0.  Integer sums are exact however they are computed.
 * The levels are used unsigned (0..15, 0..31) against the signed activation
 * bytes, and Q4_0/Q5_0's offset (8, 16) is taken off as offset * (sum of
 * the activation block), which the prepared activations carry (tile_x_prep:
 * the bytes, d as a float, and that sum, or Q8_1's s as a float).
 *   - Prompts: 8 weight rows at a time are repacked so that for each group
 *     of 4 elements one ymm holds those 4 levels of all 8 rows; one
 *     multiply-add against 4 activation bytes broadcast to every lane then
 *     advances 8 outputs, and lane r of an accumulator is weight row r.
 *   - Generation (one activation row): 8 weight rows per block, each row's
 *     8 lanes of products summed by one transposing add into a vector over
 *     the rows, so the float chain runs for 8 rows at once.
 * 16-bit partial sums (maddubs, AVX2) are kept for as many groups as cannot
 * overflow (levels <= 15: 8 groups; <= 31: 4); VPDPBUSD (AVX-VNNI) sums
 * straight into 32 bits.
 *
 * Q8_0 keeps llama.cpp's order instead (8 lanes of 4 products, one FMA per
 * lane and block with d_w * d_x, the lanes summed at the end), so greedy
 * decoding of Q8_0 models follows llama.cpp's as closely as the golden
 * tests ask.  Its tile kernel takes one weight row against 8 activation
 * rows, each output an 8-lane accumulator (more weight rows per tile only
 * spill registers), with the sign trick (|w| times x with w's sign): its
 * levels need all 8 bits.  Its prepared activations are the bytes and d as
 * a float.
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

enum { W_Q4_0, W_Q4_1, W_Q5_0, W_Q5_1 };

/* The prompt path: activation rows per pass (their accumulators stay on the
 * stack across the chunks of blocks, KB at a time), weight rows per pass,
 * activation rows per inner-kernel call. */
enum { XB = 512, KB = 8, NWC = 16, RN = 4 };
_Static_assert(XB == TILE_ACC_COLS && NWC == 16, "store_outputs (simd_x86.h) reads acc[NWC / 8][XB]");

/* Prepared activation block: 32 bytes, d, then the sum of the bytes (Q8_0)
 * or s (Q8_1). */
enum { XP_BYTES = 40, XP_D = 32, XP_SUM = 36 };

/* ---- helpers ------------------------------------------------------------------ */

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

INLINE int has_min(int wt) { return wt == W_Q4_1 || wt == W_Q5_1; }

INLINE size_t wblock_bytes(int wt)
{
    static const size_t b[] = { sizeof(block_q4_0), sizeof(block_q4_1), sizeof(block_q5_0),
                                sizeof(block_q5_1) };
    return b[wt];
}

/* Bytes of an activation block in vec_dot_type. */
INLINE size_t xblock_bytes(int wt) { return has_min(wt) ? sizeof(block_q8_1) : sizeof(block_q8_0); }

/* Block b of the weight row at p: its 32 levels (unsigned: 0..15 or
 * 0..31), d and m. */
INLINE __m256i wlevels(int wt, const uint8_t *p, int64_t b, float *d, float *m)
{
    p += (size_t)b * wblock_bytes(wt);
    fp16_t h;
    memcpy(&h, p, sizeof h);
    *d = h2f(h);
    switch (wt) {
    case W_Q4_0:
        return nibbles32(((const block_q4_0 *)p)->qs);
    case W_Q4_1:
        memcpy(&h, p + 2, sizeof h);
        *m = h2f(h);
        return nibbles32(((const block_q4_1 *)p)->qs);
    case W_Q5_0: {
        const block_q5_0 *k = (const block_q5_0 *)p;
        return _mm256_or_si256(nibbles32(k->qs), fifth_bits32(k->qh));
    }
    default: {
        const block_q5_1 *k = (const block_q5_1 *)p;
        memcpy(&h, p + 2, sizeof h);
        *m = h2f(h);
        return _mm256_or_si256(nibbles32(k->qs), fifth_bits32(k->qh));
    }
    }
}

INLINE int level_offset(int wt) { return wt == W_Q4_0 ? 8 : wt == W_Q5_0 ? 16 : 0; }

/* tile_x_prep: the bytes, d as a float, and the bytes' sum or s. */
INLINE void prep_row(int wt, const void *xq, void *dst, int64_t n)
{
    const size_t xb = xblock_bytes(wt);
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *xk = (const uint8_t *)xq + (size_t)b * xb;
        uint8_t *o = (uint8_t *)dst + (size_t)b * XP_BYTES;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(xk + xb - 32));
        _mm256_storeu_si256((__m256i *)o, v);
        fp16_t h;
        memcpy(&h, xk, sizeof h);
        const float d = h2f(h);
        memcpy(o + XP_D, &d, sizeof d);
        if (has_min(wt)) {
            memcpy(&h, xk + 2, sizeof h);
            const float sx = h2f(h);
            memcpy(o + XP_SUM, &sx, sizeof sx);
        } else {
            const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
            const int32_t sum = hsum_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
            memcpy(o + XP_SUM, &sum, sizeof sum);
        }
    }
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1: vec_dot on vec_dot_type rows ----------------------- */

INLINE float row_dot(int wt, const uint8_t *w, const uint8_t *x, int64_t n)
{
    const size_t xb = xblock_bytes(wt);
    const int off = level_offset(wt);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *xk = x + (size_t)b * xb;
        float dw, mw = 0.0f;
        const __m256i q = wlevels(wt, w, b, &dw, &mw);
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xk + xb - 32));
        __m256i p = _mm256_maddubs_epi16(q, xv);
        if (off)
            p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8((char)off), xv));
        const int isum = hsum_epi32(_mm256_madd_epi16(p, ones));
        fp16_t h;
        memcpy(&h, xk, sizeof h);
        const __m128 s = _mm_set_ss(dw * h2f(h));
        acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), s, acc);
        if (has_min(wt)) {
            memcpy(&h, xk + 2, sizeof h);
            acc = _mm_fmadd_ss(_mm_set_ss(mw), _mm_set_ss(h2f(h)), acc);
        }
    }
    return _mm_cvtss_f32(acc);
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1: generation, 8 rows per block ------------------------ */

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

/* Rows [0, nr) (nr <= 8) of w against one prepared row; y[r] the results.
 * DOT(q, x): 8 lanes of sums of 4 products of unsigned q and signed x.
 * The rows' f16 scales are gathered into one vector before conversion
 * (eight float stores read back as a vector would stall the load). */
/* Row r of the 8 (r a literal: the 16-bit insert takes a constant lane). */
#define ROWS8_ROW(DOT, r)                                                                  \
    if ((r) < nr) {                                                                        \
        const uint8_t *p = w + (size_t)(r) * ws + (size_t)b * wb;                          \
        _mm_prefetch((const char *)(p + 8 * ws), _MM_HINT_T0);                             \
        float d_unused, m_unused;                                                          \
        v[r] = DOT(wlevels(wt, w + (size_t)(r) * ws, b, &d_unused, &m_unused), xv);        \
        fp16_t h;                                                                          \
        memcpy(&h, p, sizeof h);                                                           \
        dh = _mm_insert_epi16(dh, h, r);                                                   \
        if (has_min(wt)) {                                                                 \
            memcpy(&h, p + 2, sizeof h);                                                   \
            mh = _mm_insert_epi16(mh, h, r);                                               \
        }                                                                                  \
    } else {                                                                               \
        v[r] = _mm256_setzero_si256();                                                     \
    }

#define DEFINE_ROWS8(NAME, ATTR, DOT)                                                      \
    ATTR INLINE void NAME(int wt, int64_t n, const uint8_t *w, size_t ws, int nr,          \
                          const uint8_t *x, float *y)                                      \
    {                                                                                      \
        const int off = level_offset(wt);                                                  \
        const size_t wb = wblock_bytes(wt);                                                \
        __m256 acc = _mm256_setzero_ps();                                                  \
        for (int64_t b = 0; b < n / 32; b++) {                                             \
            const uint8_t *xk = x + (size_t)b * XP_BYTES;                                  \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)xk);                    \
            __m256i v[8];                                                                  \
            __m128i dh = _mm_setzero_si128(), mh = _mm_setzero_si128();                    \
            ROWS8_ROW(DOT, 0) ROWS8_ROW(DOT, 1) ROWS8_ROW(DOT, 2) ROWS8_ROW(DOT, 3)        \
            ROWS8_ROW(DOT, 4) ROWS8_ROW(DOT, 5) ROWS8_ROW(DOT, 6) ROWS8_ROW(DOT, 7)        \
            __m256i isum = sum8x8(v);                                                      \
            if (off)                                                                       \
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * load_i32(xk + XP_SUM))); \
            const __m256 s = _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_set1_ps(load_f32(xk + XP_D))); \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc);                       \
            if (has_min(wt))                                                               \
                acc = _mm256_fmadd_ps(_mm256_cvtph_ps(mh), _mm256_set1_ps(load_f32(xk + XP_SUM)), acc); \
        }                                                                                  \
        float lanes[8];                                                                    \
        _mm256_storeu_ps(lanes, acc);                                                      \
        for (int r = 0; r < nr; r++)                                                       \
            y[r] = lanes[r];                                                               \
    }

INLINE __m256i dot4_avx2(__m256i q, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}

VNNI INLINE __m256i dot4_vnni(__m256i q, __m256i x)
{
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, x);
}

DEFINE_ROWS8(rows8_avx2, , dot4_avx2)
DEFINE_ROWS8(rows8_vnni, VNNI, dot4_vnni)

/* ---- Q4_0, Q4_1, Q5_0, Q5_1: a few activation rows (batched generation) ---------- */

/* R weight rows times J activation rows (R = 8 / J, 2 <= J <= 8) per pass:
 * output (r, j) in lane l = r * J + j.  Each weight block is decoded once
 * for the J rows, each product summed by the transposing add as in rows8,
 * and the float chain runs for all the lanes at once, so a batch of J rows
 * reads and decodes the weights once where J single rows would each do it
 * (a batch of decode rows costs little more than one).  The activation
 * side's per-block numbers come transposed into lane order (fewprep). */
enum { FEW_NBMAX = 1024, FEW_ROWS = 8 };

/* The activation numbers of J rows for the R x J lanes: xd[8 b + l] is d
 * of block b of row l % J, and xs32[8 b + l] its sum times the level
 * offset (Q4_0, Q5_0) or s (Q4_1, Q5_1: float bits), for l < R * J; the
 * other lanes 0. */
INLINE void fewprep(int wt, int J, int64_t nb, const uint8_t *x, size_t xs, float *xd,
                    uint32_t *xs32)
{
    const int R = 8 / J;
    for (int64_t b = 0; b < nb; b++)
        for (int l = 0; l < 8; l++) {
            const uint8_t *xk = x + (size_t)(l % J) * xs + (size_t)b * XP_BYTES;
            const int live = l < R * J;
            xd[8 * b + l] = live ? load_f32(xk + XP_D) : 0.0f;
            xs32[8 * b + l] = !live ? 0
                : has_min(wt) ? (uint32_t)load_i32(xk + XP_SUM)
                : (uint32_t)(level_offset(wt) * load_i32(xk + XP_SUM));
        }
}

/* 8 f16 values in lane order (lane l: h[l / J], 0 beyond R * J lanes). */
INLINE __m128i f16_lanes(const fp16_t *h, int R, int J)
{
    uint64_t lo = 0, hi = 0;
    UNROLL for (int l = 0; l < R * J; l++) {
        const uint64_t v = (uint64_t)h[l / J] << (16 * (l & 3));
        if (l < 4)
            lo |= v;
        else
            hi |= v;
    }
    return _mm_set_epi64x((long long)hi, (long long)lo);
}

/* Weight rows [0, nr) (nr <= 8 / J) of w against activation rows [0, J) of
 * x (prepared, xs apart); y[j * ldy + r] the results. */
#define DEFINE_FEW(NAME, ATTR, DOT)                                                        \
    ATTR INLINE void NAME(int wt, int J, int64_t n, const uint8_t *w, size_t ws, int nr,   \
                          const uint8_t *x, size_t xs, const float *xd,                    \
                          const uint32_t *xs32, float *y, size_t ldy)                      \
    {                                                                                      \
        const int R = 8 / J;                                                               \
        const int off = level_offset(wt);                                                  \
        const size_t wb = wblock_bytes(wt);                                                \
        __m256 acc = _mm256_setzero_ps();                                                  \
        for (int64_t b = 0; b < n / 32; b++) {                                             \
            __m256i v[8];                                                                  \
            fp16_t dh[8] = { 0 }, mh[8] = { 0 };                                           \
            UNROLL for (int r = 0; r < R; r++) {                                           \
                if (r < nr) {                                                              \
                    const uint8_t *p = w + (size_t)r * ws + (size_t)b * wb;                \
                    _mm_prefetch((const char *)(p + (size_t)R * ws), _MM_HINT_T0);         \
                    float d_unused, m_unused;                                              \
                    const __m256i q = wlevels(wt, w + (size_t)r * ws, b, &d_unused, &m_unused); \
                    memcpy(&dh[r], p, sizeof dh[r]);                                       \
                    if (has_min(wt))                                                       \
                        memcpy(&mh[r], p + 2, sizeof mh[r]);                               \
                    UNROLL for (int j = 0; j < J; j++)                                     \
                        v[r * J + j] = DOT(q, _mm256_loadu_si256((const __m256i *)(        \
                                              x + (size_t)j * xs + (size_t)b * XP_BYTES))); \
                } else {                                                                   \
                    UNROLL for (int j = 0; j < J; j++)                                     \
                        v[r * J + j] = _mm256_setzero_si256();                             \
                }                                                                          \
            }                                                                              \
            UNROLL for (int l = R * J; l < 8; l++)                                         \
                v[l] = _mm256_setzero_si256();                                             \
            __m256i isum = sum8x8(v);                                                      \
            const __m256i xsum = _mm256_loadu_si256((const __m256i *)(xs32 + 8 * b));      \
            if (off)                                                                       \
                isum = _mm256_sub_epi32(isum, xsum);                                       \
            const __m256 s = _mm256_mul_ps(_mm256_cvtph_ps(f16_lanes(dh, R, J)),           \
                                           _mm256_loadu_ps(xd + 8 * b));                   \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc);                       \
            if (has_min(wt))                                                               \
                acc = _mm256_fmadd_ps(_mm256_cvtph_ps(f16_lanes(mh, R, J)),                \
                                      _mm256_castsi256_ps(xsum), acc);                     \
        }                                                                                  \
        float lanes[8];                                                                    \
        _mm256_storeu_ps(lanes, acc);                                                      \
        for (int r = 0; r < nr; r++)                                                       \
            for (int j = 0; j < J; j++)                                                    \
                y[(size_t)j * ldy + r] = lanes[r * J + j];                                 \
    }

DEFINE_FEW(few_avx2, , dot4_avx2)
DEFINE_FEW(few_vnni, VNNI, dot4_vnni)

/* ---- Q4_0, Q4_1, Q5_0, Q5_1: prompts, packed rows -------------------------------- */

/* 8 weight rows, one block: q[g] holds levels 4g..4g+3 of rows 0..7. */
typedef struct {
    uint8_t q[8][32];
    float d[8], m[8];
} wpack;

/* Rows [0, nr) of the weight rows at w (stride ws), blocks [b0, b0 + kb),
 * into packs; rows nr..7 are zero. */
INLINE void repack(int wt, const uint8_t *w, size_t ws, int nr, int64_t b0, int kb, wpack *out)
{
    for (int bb = 0; bb < kb; bb++) {
        __m256i v[8];
        float d[8], m[8];
        for (int r = 0; r < 8; r++) {
            d[r] = m[r] = 0.0f;
            v[r] = r < nr ? wlevels(wt, w + (size_t)r * ws, b0 + bb, &d[r], &m[r])
                          : _mm256_setzero_si256();
        }
        transpose8(v);
        for (int g = 0; g < 8; g++)
            _mm256_storeu_si256((__m256i *)out[bb].q[g], v[g]);
        memcpy(out[bb].d, d, sizeof d);
        memcpy(out[bb].m, m, sizeof m);
    }
}

/* The end of a block: the offset, then acc_j = fma(isum_j, d_w * d_x,
 * acc_j) [+ m * s]; x points at the block of activation row 0, rows xs
 * bytes apart. */
INLINE void finish_block(int wt, int rn, const wpack *P, const uint8_t *x, size_t xs,
                         __m256i *isum, __m256 *acc)
{
    const int off = level_offset(wt);
    const __m256 dv = _mm256_loadu_ps(P->d);
    UNROLL for (int j = 0; j < rn; j++) {
        const uint8_t *xj = x + (size_t)j * xs;
        if (off)
            isum[j] = _mm256_sub_epi32(isum[j], _mm256_set1_epi32(off * load_i32(xj + XP_SUM)));
        const __m256 s = _mm256_mul_ps(dv, _mm256_set1_ps(load_f32(xj + XP_D)));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), s, acc[j]);
        if (has_min(wt))
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(P->m), _mm256_set1_ps(load_f32(xj + XP_SUM)), acc[j]);
    }
}

/* Inner kernels: 8 packed rows times rn prepared activation rows (x: row 0
 * at block b0, rows xs apart) over kb blocks; acc[j] lane r is output
 * (weight row r, activation row j). */
INLINE void kernel_avx2(int wt, int rn, const wpack *wp, int kb, const uint8_t *x, size_t xs,
                        __m256 *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int flush = wt == W_Q4_0 || wt == W_Q4_1 ? 8 : 4;
    for (int bb = 0; bb < kb; bb++) {
        const wpack *P = &wp[bb];
        const uint8_t *xb = x + (size_t)bb * XP_BYTES;
        __m256i isum[RN];
        UNROLL for (int j = 0; j < rn; j++)
            isum[j] = _mm256_setzero_si256();
        NO_UNROLL for (int g0 = 0; g0 < 8; g0 += flush) {
            __m256i s16[RN];
            UNROLL for (int j = 0; j < rn; j++)
                s16[j] = _mm256_setzero_si256();
            NO_UNROLL for (int g = g0; g < g0 + flush; g++) {
                const __m256i W = _mm256_loadu_si256((const __m256i *)P->q[g]);
                UNROLL for (int j = 0; j < rn; j++)
                    s16[j] = _mm256_add_epi16(s16[j],
                        _mm256_maddubs_epi16(W, bcast4(xb + (size_t)j * xs + 4 * g)));
            }
            UNROLL for (int j = 0; j < rn; j++)
                isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16[j], ones));
        }
        finish_block(wt, rn, P, xb, xs, isum, acc);
    }
}

VNNI INLINE void kernel_vnni(int wt, int rn, const wpack *wp, int kb, const uint8_t *x, size_t xs,
                             __m256 *acc)
{
    for (int bb = 0; bb < kb; bb++) {
        const wpack *P = &wp[bb];
        const uint8_t *xb = x + (size_t)bb * XP_BYTES;
        __m256i isum[RN];
        UNROLL for (int j = 0; j < rn; j++)
            isum[j] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++) {
            const __m256i W = _mm256_loadu_si256((const __m256i *)P->q[g]);
            UNROLL for (int j = 0; j < rn; j++)
                isum[j] = _mm256_dpbusd_avx_epi32(isum[j], W, bcast4(xb + (size_t)j * xs + 4 * g));
        }
        finish_block(wt, rn, P, xb, xs, isum, acc);
    }
}

typedef void (*kernel_fn)(const wpack *wp, int kb, const uint8_t *x, size_t xs, int rn,
                          __m256 *acc);
typedef void (*rows8_fn)(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                         float *y);
typedef void (*few_fn)(int J, int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                       size_t xs, const float *xd, const uint32_t *xs32, float *y, size_t ldy);

/* n_w x n_x outputs for a few activation rows, 8 at a time (a last single
 * row through rows8). */
INLINE void tile_few(int wt, few_fn few, rows8_fn rows8, int64_t n, const uint8_t *w, size_t ws,
                     int n_w, const uint8_t *x, size_t xs, int n_x, float *y, size_t ldy)
{
    float xd[8 * FEW_NBMAX];
    uint32_t xs32[8 * FEW_NBMAX];
    for (int j0 = 0; j0 < n_x; j0 += 8) {
        const int J = n_x - j0 < 8 ? n_x - j0 : 8, R = 8 / J;
        const uint8_t *xj = x + (size_t)j0 * xs;
        float *yj = y + (size_t)j0 * ldy;
        if (J == 1) {
            for (int i = 0; i < n_w; i += 8)
                rows8(n, w + (size_t)i * ws, ws, n_w - i < 8 ? n_w - i : 8, xj, yj + i);
            continue;
        }
        fewprep(wt, J, n / 32, xj, xs, xd, xs32);
        for (int i = 0; i < n_w; i += R)
            few(J, n, w + (size_t)i * ws, ws, n_w - i < R ? n_w - i : R, xj, xs, xd, xs32,
                yj + i, ldy);
    }
}

/* n_w x n_x outputs: one activation row through rows8, up to FEW_ROWS
 * through the few-row kernels, more in passes of NWC weight rows and XB
 * activation rows, blocks in chunks of KB. */
INLINE void tile_packed(int wt, kernel_fn kernel, rows8_fn rows8, few_fn few, int64_t n,
                        const uint8_t *w, size_t ws, int n_w, const uint8_t *x, size_t xs,
                        int n_x, float *y, size_t ldy)
{
    if (n_x == 1) {
        for (int i = 0; i < n_w; i += 8)
            rows8(n, w + (size_t)i * ws, ws, n_w - i < 8 ? n_w - i : 8, x, y + i);
        return;
    }
    if (n_x <= FEW_ROWS && n / 32 <= FEW_NBMAX) {
        tile_few(wt, few, rows8, n, w, ws, n_w, x, xs, n_x, y, ldy);
        return;
    }
    wpack wp[NWC / 8][KB];
    __m256 acc[NWC / 8][XB];
    const int64_t nb = n / 32;
    for (int i1 = 0; i1 < n_w; i1 += NWC) {
        const int nwc = n_w - i1 < NWC ? n_w - i1 : NWC, ng = (nwc + 7) / 8;
        for (int j1 = 0; j1 < n_x; j1 += XB) {
            const int nxb = n_x - j1 < XB ? n_x - j1 : XB;
            for (int g = 0; g < ng; g++)
                for (int j = 0; j < nxb; j++)
                    acc[g][j] = _mm256_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += KB) {
                const int kb = nb - b0 < KB ? (int)(nb - b0) : KB;
                for (int g = 0; g < ng; g++) {
                    const int nr = nwc - 8 * g < 8 ? nwc - 8 * g : 8;
                    repack(wt, w + (size_t)(i1 + 8 * g) * ws, ws, nr, b0, kb, wp[g]);
                }
                for (int j0 = 0; j0 < nxb; j0 += RN) {
                    const uint8_t *xj = x + (size_t)(j1 + j0) * xs + (size_t)b0 * XP_BYTES;
                    const int rn = nxb - j0 < RN ? nxb - j0 : RN;
                    for (int g = 0; g < ng; g++)
                        kernel(wp[g], kb, xj, xs, rn, &acc[g][j0]);
                }
            }
            store_outputs(acc, ng, nwc, nxb, y + (size_t)j1 * ldy + i1, ldy);
        }
    }
}

#define KERNEL_SWITCH(K, wt, rn, ...)                          \
    switch (rn) {                                              \
    case 1: K(wt, 1, __VA_ARGS__); break;                      \
    case 2: K(wt, 2, __VA_ARGS__); break;                      \
    case 3: K(wt, 3, __VA_ARGS__); break;                      \
    default: K(wt, RN, __VA_ARGS__); break;                    \
    }

#define DEFINE_FORMAT(name, wt)                                                        \
    static float name##_vec_dot(const void *w, const void *x, int64_t n)               \
    {                                                                                  \
        return row_dot(wt, w, x, n);                                                   \
    }                                                                                  \
    static void name##_prep(const void *xq, void *dst, int64_t n)                      \
    {                                                                                  \
        prep_row(wt, xq, dst, n);                                                      \
    }                                                                                  \
    static void name##_kernel_avx2(const wpack *wp, int kb, const uint8_t *x,          \
                                   size_t xs, int rn, __m256 *acc)                     \
    {                                                                                  \
        KERNEL_SWITCH(kernel_avx2, wt, rn, wp, kb, x, xs, acc)                         \
    }                                                                                  \
    VNNI static void name##_kernel_vnni(const wpack *wp, int kb, const uint8_t *x,     \
                                        size_t xs, int rn, __m256 *acc)                \
    {                                                                                  \
        KERNEL_SWITCH(kernel_vnni, wt, rn, wp, kb, x, xs, acc)                         \
    }                                                                                  \
    static void name##_rows8_avx2(int64_t n, const uint8_t *w, size_t ws, int nr,      \
                                  const uint8_t *x, float *y)                          \
    {                                                                                  \
        if (nr == 8)                                                                   \
            rows8_avx2(wt, n, w, ws, 8, x, y);                                         \
        else                                                                           \
            rows8_avx2(wt, n, w, ws, nr, x, y);                                        \
    }                                                                                  \
    VNNI static void name##_rows8_vnni(int64_t n, const uint8_t *w, size_t ws, int nr, \
                                       const uint8_t *x, float *y)                     \
    {                                                                                  \
        if (nr == 8)                                                                   \
            rows8_vnni(wt, n, w, ws, 8, x, y);                                         \
        else                                                                           \
            rows8_vnni(wt, n, w, ws, nr, x, y);                                        \
    }                                                                                  \
    static void name##_few_avx2(int J, int64_t n, const uint8_t *w, size_t ws, int nr, \
                                const uint8_t *x, size_t xs, const float *xd,          \
                                const uint32_t *xs32, float *y, size_t ldy)            \
    {                                                                                  \
        SWITCH_ROWS8(few_avx2, wt, J, n, w, ws, nr, x, xs, xd, xs32, y, ldy)           \
    }                                                                                  \
    VNNI static void name##_few_vnni(int J, int64_t n, const uint8_t *w, size_t ws,    \
                                     int nr, const uint8_t *x, size_t xs,              \
                                     const float *xd, const uint32_t *xs32, float *y,  \
                                     size_t ldy)                                       \
    {                                                                                  \
        SWITCH_ROWS8(few_vnni, wt, J, n, w, ws, nr, x, xs, xd, xs32, y, ldy)           \
    }                                                                                  \
    static void name##_tile(int64_t n, const void *w, size_t ws, int n_w,              \
                            const void *x, size_t xs, int n_x, float *y, size_t ldy)   \
    {                                                                                  \
        tile_packed(wt, name##_kernel_avx2, name##_rows8_avx2, name##_few_avx2, n, w,  \
                    ws, n_w, x, xs, n_x, y, ldy);                                      \
    }                                                                                  \
    static void name##_tile_vnni(int64_t n, const void *w, size_t ws, int n_w,         \
                                 const void *x, size_t xs, int n_x, float *y,          \
                                 size_t ldy)                                           \
    {                                                                                  \
        tile_packed(wt, name##_kernel_vnni, name##_rows8_vnni, name##_few_vnni, n, w,  \
                    ws, n_w, x, xs, n_x, y, ldy);                                      \
    }

DEFINE_FORMAT(q4_0, W_Q4_0)
DEFINE_FORMAT(q4_1, W_Q4_1)
DEFINE_FORMAT(q5_0, W_Q5_0)
DEFINE_FORMAT(q5_1, W_Q5_1)

/* ---- Q8_0 ---------------------------------------------------------------------- */

/* One weight row against up to 8 prepared activation rows (Q8_NBMAX
 * blocks at most: dxt holds their scales transposed, 8 per block), so the
 * 8 scale products of a block are one multiply. */
enum { Q8_RN = 8, Q8_NBMAX = 1024, Q8_XP = 36 };

static float q8_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q8_0 *wk = (const block_q8_0 *)w + b, *xk = (const block_q8_0 *)x + b;
        const __m256i q = _mm256_loadu_si256((const __m256i *)wk->qs);
        const __m256i xv = _mm256_loadu_si256((const __m256i *)xk->qs);
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wk->d) * h2f(xk->d)),
                              _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    return hsum_ps(acc);
}

/* vec_dot's arithmetic on a prepared row (rows too long for the tile);
 * `flipped`: the bytes have 128 added (the AVX-VNNI layout). */
static float q8_0_prepared_dot(const uint8_t *w, const uint8_t *x, int64_t n, int flipped)
{
    const __m256i flip = _mm256_set1_epi8(flipped ? (char)0x80 : 0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q8_0 *wk = (const block_q8_0 *)w + b;
        const uint8_t *xk = x + (size_t)b * Q8_XP;
        const __m256i q = _mm256_loadu_si256((const __m256i *)wk->qs);
        const __m256i xv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xk), flip);
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wk->d) * load_f32(xk + 32)),
                              _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    return hsum_ps(acc);
}

/* tile_x_prep: the bytes, then d as a float. */
static void q8_0_prep(const void *xq, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q8_0 *xk = (const block_q8_0 *)xq + b;
        uint8_t *o = (uint8_t *)dst + (size_t)b * Q8_XP;
        memcpy(o, xk->qs, 32);
        const float d = h2f(xk->d);
        memcpy(o + 32, &d, sizeof d);
    }
}

/* One weight row w against NR prepared activation rows.  DOT(u, s): 8 sums
 * of 4 products of unsigned u and signed s bytes.  Per block the products
 * d_w * d_x of all rows are one vector multiply, read back by broadcasts
 * from memory (loads, not shuffles). */
#define DEFINE_Q8_KERNEL(NAME, ATTR, DOT)                                                  \
    ATTR INLINE void NAME(int NR, int64_t nb, const uint8_t *w, const uint8_t *x,          \
                          size_t xs, const float *dxt, float *y, size_t ldy)               \
    {                                                                                      \
        __m256 acc[Q8_RN];                                                                 \
        UNROLL for (int j = 0; j < NR; j++)                                                \
            acc[j] = _mm256_setzero_ps();                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                 \
            const block_q8_0 *wk = (const block_q8_0 *)w + b;                              \
            const __m256i wq = _mm256_loadu_si256((const __m256i *)wk->qs);                \
            const __m256i aw = _mm256_abs_epi8(wq);                                        \
            __m256 dw = _mm256_set1_ps(h2f(wk->d));                                        \
            __asm__("" : "+x"(dw));                                                        \
            UNROLL for (int j = 0; j < NR; j++) {                                          \
                const __m256i xv = _mm256_loadu_si256(                                     \
                    (const __m256i *)(x + (size_t)j * xs + (size_t)b * Q8_XP));            \
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&dxt[8 * b + j])), \
                                         _mm256_cvtepi32_ps(DOT(aw, _mm256_sign_epi8(xv, wq))), \
                                         acc[j]);                                          \
            }                                                                              \
        }                                                                                  \
        UNROLL for (int j = 0; j < NR; j++)                                                \
            y[(size_t)j * ldy] = hsum_ps(acc[j]);                                          \
    }

INLINE __m256i dot_avx2(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

DEFINE_Q8_KERNEL(q8_kernel_avx2, , dot_avx2)

/* With VPDPBUSD the activations come prepared with 128 added (unsigned),
 * and each lane's sum starts at -128 * (the lane's 4 weights), which leaves
 * exactly the sign trick's lane sums with one instruction per output. */
VNNI INLINE void q8_kernel_vnni(int NR, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                                const float *dxt, float *y, size_t ldy)
{
    __m256 acc[Q8_RN];
    UNROLL for (int j = 0; j < NR; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const block_q8_0 *wk = (const block_q8_0 *)w + b;
        const __m256i wq = _mm256_loadu_si256((const __m256i *)wk->qs);
        const __m256i lane_sum = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(),
                                                         _mm256_set1_epi8(1), wq);
        const __m256i start = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(lane_sum, 7));
        __m256 dw = _mm256_set1_ps(h2f(wk->d));
        __asm__("" : "+x"(dw));
        UNROLL for (int j = 0; j < NR; j++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)j * xs + (size_t)b * Q8_XP));
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&dxt[8 * b + j])),
                                     _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(start, xv, wq)), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < NR; j++)
        y[(size_t)j * ldy] = hsum_ps(acc[j]);
}

/* tile_x_prep of the AVX-VNNI kernel: the bytes + 128, then d. */
static void q8_0_prep_vnni(const void *xq, void *dst, int64_t n)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q8_0 *xk = (const block_q8_0 *)xq + b;
        uint8_t *o = (uint8_t *)dst + (size_t)b * Q8_XP;
        _mm256_storeu_si256((__m256i *)o, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xk->qs), flip));
        const float d = h2f(xk->d);
        memcpy(o + 32, &d, sizeof d);
    }
}

#define Q8_CASE(K, c)                                                               \
    case c:                                                                         \
        K(c, nb, wp, xp, xs, dxt, y + (size_t)j0 * ldy + i, ldy);                   \
        break;

#define DEFINE_Q8_TILE(NAME, ATTR, K, FLIPPED)                                      \
    ATTR static void NAME(int64_t n, const void *w, size_t ws, int n_w,            \
                          const void *x, size_t xs, int n_x, float *y, size_t ldy) \
    {                                                                               \
        const int64_t nb = n / 32;                                                  \
        if (nb > Q8_NBMAX) {                                                        \
            for (int j = 0; j < n_x; j++)                                           \
                for (int i = 0; i < n_w; i++)                                       \
                    y[(size_t)j * ldy + i] = q8_0_prepared_dot(                     \
                        (const uint8_t *)w + (size_t)i * ws,                        \
                        (const uint8_t *)x + (size_t)j * xs, n, FLIPPED);           \
            return;                                                                 \
        }                                                                           \
        float dxt[8 * Q8_NBMAX];                                                    \
        for (int j0 = 0; j0 < n_x; j0 += Q8_RN) {                                   \
            const int rn = n_x - j0 < Q8_RN ? n_x - j0 : Q8_RN;                     \
            const uint8_t *xp = (const uint8_t *)x + (size_t)j0 * xs;               \
            for (int64_t b = 0; b < nb; b++)                                        \
                for (int j = 0; j < 8; j++)                                         \
                    dxt[8 * b + j] = j < rn                                         \
                        ? load_f32(xp + (size_t)j * xs + (size_t)b * Q8_XP + 32) : 0.0f; \
            for (int i = 0; i < n_w; i++) {                                         \
                const uint8_t *wp = (const uint8_t *)w + (size_t)i * ws;            \
                switch (rn) {                                                       \
                Q8_CASE(K, 1) Q8_CASE(K, 2) Q8_CASE(K, 3) Q8_CASE(K, 4)             \
                Q8_CASE(K, 5) Q8_CASE(K, 6) Q8_CASE(K, 7) Q8_CASE(K, 8)             \
                default: break;                                                     \
                }                                                                   \
            }                                                                       \
        }                                                                           \
    }

DEFINE_Q8_TILE(q8_0_tile, , q8_kernel_avx2, 0)
DEFINE_Q8_TILE(q8_0_tile_vnni, VNNI, q8_kernel_vnni, 1)

/* ---- registration ------------------------------------------------------------- */

void tensor__kernels_tile_avx2(tensor_traits *table, int use_vnni)
{
#define SET(tt, name, prep_bytes)                                                    \
    do {                                                                             \
        table[tt].vec_dot = name##_vec_dot;                                          \
        table[tt].vec_dot_tile = use_vnni ? name##_tile_vnni : name##_tile;          \
        table[tt].tile_x_block_bytes = prep_bytes;                                   \
        table[tt].tile_x_prep = name##_prep;                                         \
    } while (0)
    SET(TT_Q4_0, q4_0, XP_BYTES);
    SET(TT_Q4_1, q4_1, XP_BYTES);
    SET(TT_Q5_0, q5_0, XP_BYTES);
    SET(TT_Q5_1, q5_1, XP_BYTES);
    SET(TT_Q8_0, q8_0, Q8_XP);
    if (use_vnni)
        table[TT_Q8_0].tile_x_prep = q8_0_prep_vnni;
#undef SET
}
