/* quant_avx512.c - AVX-512 (F, BW, VL, VNNI) dot products of Q4_0 and Q8_0
 * weights against Q8_0 activations: vec_dot and the tile kernel.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (the
 * Makefile's *_avx512.c rule) and only called after the CPU probe found
 * all four; tensor__kernels_avx512 runs after tensor__kernels_avx2 and
 * replaces these two types' dot products (and their tile_x_prep, whose
 * layout the kernels here read), then has quant_klow_avx512.c replace
 * Q2_K's and Q3_K's, quant_iq_avx512.c those of IQ4_NL, IQ4_XS and MXFP4,
 * and q4k_r8_avx512.c, q6k_r8_avx512.c and quant_q8r8_avx512.c install
 * the tiles of repacked Q4_K, Q6_K and Q8_0 (so Q8_0 matrices are repacked
 * on these CPUs and the kernels here serve the rows left as in the file).
 *
 * The float arithmetic of every output is exactly that of quant_tile_avx2.c
 * (same operations, same order, per output), only the integer sums, which
 * are exact however computed, and the number of outputs per instruction
 * change.  So these kernels give the bits the AVX2 ones give, vec_dot and
 * the tile agree bit for bit, and no result depends on tile, thread or
 * batch (vec_dot_tile's contract, types.h):
 *   - Q4_0: per output, acc = fma((float)isum_b, d_w * d_x, acc) over
 *     blocks in order, isum_b = sum of level (0..15) times activation byte,
 *     less 8 * (sum of the activation bytes).  Generation: 16 weight rows
 *     per zmm (rows r and r + 8 in its halves, reduced by a transposing
 *     add); prompts: 16 weight rows repacked so that one zmm holds 4 levels
 *     of each, against 4 activation bytes broadcast, lane r = weight row r.
 *   - Q8_0: per output 8 lanes, lane k = fma(d_w * d_x, (float)(sum of 4
 *     products), lane k) over blocks, the lanes summed at the end in
 *     hsum_ps's order (llama.cpp's order, which the golden tests lean on).
 *     vec_dot: a zmm holds two consecutive blocks (their FMAs still run
 *     block by block).  The tile stays at 256 bits (EVEX VPDPBUSD) and is
 *     installed only where the CPU lacks AVX-VNNI (it is then the only
 *     VPDPBUSD; with AVX-VNNI it equals quant_tile_avx2.c's): its cost is the
 *     float work per output and block (convert, scale, FMA), which two
 *     outputs per zmm do not reduce on this machine's Zen 4 (512-bit
 *     operations run as two halves); measured, that version was ~20%
 *     slower.  VPDPBUSD takes unsigned times signed bytes, and AVX-512 has
 *     no byte sign instruction, so the activations are used with 128 added
 *     and each lane starts at -128 * (its 4 weights).
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/quant_ref.h"
#include "tensor/simd_x86.h"

#undef UNROLL    /* this file's register loops unroll deeper than simd_x86.h's */
#if defined(__clang__)
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 16")
#endif
/* Q4_0 prepared activation block: 32 bytes, d, the sum of the bytes (the
 * layout of quant_tile_avx2.c, written here too so the pair is
 * self-contained). */
enum { XP_BYTES = 40, XP_D = 32, XP_SUM = 36 };
/* Q8_0 prepared activation block: 32 bytes + 128, then d. */
enum { Q8_XP = 36 };
/* Q4_0 prompts: activation rows per pass (accumulators on the stack), blocks
 * per repacked chunk, activation rows per inner-kernel call. */
enum { XB = 512, KB = 8, RN = 8 };

/* ---- helpers ------------------------------------------------------------ */

INLINE __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }

INLINE __m256 hi256(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* ---- Q4_0 ------------------------------------------------------------------ */

static void q4_0_prep(const void *xq, void *dst, int64_t n)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q8_0 *xk = (const block_q8_0 *)xq + b;
        uint8_t *o = (uint8_t *)dst + (size_t)b * XP_BYTES;
        const __m256i v = _mm256_loadu_si256((const __m256i *)xk->qs);
        _mm256_storeu_si256((__m256i *)o, v);
        const float d = h2f(xk->d);
        memcpy(o + XP_D, &d, sizeof d);
        const int32_t sum = hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, v));
        memcpy(o + XP_SUM, &sum, sizeof sum);
    }
}

/* One row on unprepared activations: the AVX2 row_dot's float chain. */
static float q4_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const __m256i eight = _mm256_set1_epi8(8), zero = _mm256_setzero_si256();
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const block_q4_0 *wk = (const block_q4_0 *)w + b;
        const block_q8_0 *xk = (const block_q8_0 *)x + b;
        const __m256i xv = _mm256_loadu_si256((const __m256i *)xk->qs);
        const __m256i v = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, nibbles32(wk->qs), xv),
                                           _mm256_dpbusd_epi32(zero, eight, xv));
        const __m128 s = _mm_set_ss(h2f(wk->d) * h2f(xk->d));
        acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), hsum_epi32(v)), s, acc);
    }
    return _mm_cvtss_f32(acc);
}

/* Row r of 8 pairs (r, r + 8) for one block (r a literal: the 16-bit insert
 * takes a constant lane). */
#define ROWS16_PAIR(r)                                                                     \
    {                                                                                      \
        __m256i lo = zero, hi = zero;                                                      \
        if ((r) < nr) {                                                                    \
            const uint8_t *p = w + (size_t)(r) * ws + (size_t)b * sizeof(block_q4_0);      \
            _mm_prefetch((const char *)(p + 16 * ws), _MM_HINT_T0);                        \
            lo = nibbles32(((const block_q4_0 *)p)->qs);                                   \
            fp16_t h;                                                                      \
            memcpy(&h, p, sizeof h);                                                       \
            dl = _mm_insert_epi16(dl, h, r);                                               \
        }                                                                                  \
        if ((r) + 8 < nr) {                                                                \
            const uint8_t *p = w + (size_t)((r) + 8) * ws + (size_t)b * sizeof(block_q4_0); \
            _mm_prefetch((const char *)(p + 16 * ws), _MM_HINT_T0);                        \
            hi = nibbles32(((const block_q4_0 *)p)->qs);                                   \
            fp16_t h;                                                                      \
            memcpy(&h, p, sizeof h);                                                       \
            dh = _mm_insert_epi16(dh, h, r);                                               \
        }                                                                                  \
        v[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join256(lo, hi), xv);           \
    }

/* Weight rows [0, nr) (nr <= 16) against one prepared row; y[r] the
 * results. */
INLINE void q4_0_rows16(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                        float *y)
{
    const __m256i zero = _mm256_setzero_si256();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *xk = x + (size_t)b * XP_BYTES;
        const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xk));
        __m512i v[8];
        __m128i dl = _mm_setzero_si128(), dh = _mm_setzero_si128();
        ROWS16_PAIR(0) ROWS16_PAIR(1) ROWS16_PAIR(2) ROWS16_PAIR(3)
        ROWS16_PAIR(4) ROWS16_PAIR(5) ROWS16_PAIR(6) ROWS16_PAIR(7)
        const __m512i isum = _mm512_sub_epi32(sum16x8(v), _mm512_set1_epi32(8 * load_i32(xk + XP_SUM)));
        const __m512 s = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_set_m128i(dh, dl)),
                                       _mm512_set1_ps(load_f32(xk + XP_D)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    for (int r = 0; r < nr; r++)
        y[r] = lanes[r];
}

/* 16 weight rows, one block: q[g] holds levels 4g..4g+3 of rows 0..7 in
 * its low half, of rows 8..15 in its high half; d the rows' scales. */
typedef struct {
    uint8_t q[8][64];
    float d[16];
} wpack16;

/* Rows [0, nr) of the weight rows at w, blocks [b0, b0 + kb), into packs;
 * rows nr..15 are zero. */
static void repack16(const uint8_t *w, size_t ws, int nr, int64_t b0, int kb, wpack16 *out)
{
    for (int bb = 0; bb < kb; bb++) {
        for (int half = 0; half < 2; half++) {
            __m256i v[8];
            for (int r = 0; r < 8; r++) {
                const int row = 8 * half + r;
                const block_q4_0 *k = (const block_q4_0 *)(w + (size_t)row * ws) + b0 + bb;
                v[r] = row < nr ? nibbles32(k->qs) : _mm256_setzero_si256();
                out[bb].d[row] = row < nr ? h2f(k->d) : 0.0f;
            }
            transpose8(v);
            for (int g = 0; g < 8; g++)
                _mm256_storeu_si256((__m256i *)(out[bb].q[g] + 32 * half), v[g]);
        }
    }
}

/* 16 packed rows times rn prepared activation rows (x: row 0 at block b0,
 * rows xs apart) over kb blocks; acc[j] lane r is output (row r, row j). */
INLINE void q4_0_kernel(int rn, const wpack16 *wp, int kb, const uint8_t *x, size_t xs,
                        __m512 *acc)
{
    for (int bb = 0; bb < kb; bb++) {
        const wpack16 *P = &wp[bb];
        const uint8_t *xb = x + (size_t)bb * XP_BYTES;
        __m512i isum[RN];
        UNROLL for (int j = 0; j < rn; j++)
            isum[j] = _mm512_setzero_si512();
        UNROLL for (int g = 0; g < 8; g++) {
            const __m512i W = _mm512_loadu_si512(P->q[g]);
            UNROLL for (int j = 0; j < rn; j++)
                isum[j] = _mm512_dpbusd_epi32(isum[j], W,
                                              _mm512_set1_epi32(load_i32(xb + (size_t)j * xs + 4 * g)));
        }
        const __m512 dv = _mm512_loadu_ps(P->d);
        UNROLL for (int j = 0; j < rn; j++) {
            const uint8_t *xj = xb + (size_t)j * xs;
            const __m512i is = _mm512_sub_epi32(isum[j], _mm512_set1_epi32(8 * load_i32(xj + XP_SUM)));
            const __m512 s = _mm512_mul_ps(dv, _mm512_set1_ps(load_f32(xj + XP_D)));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[j]);
        }
    }
}

static void q4_0_kernel_rn(int rn, const wpack16 *wp, int kb, const uint8_t *x, size_t xs,
                           __m512 *acc)
{
    switch (rn) {
    case 1: q4_0_kernel(1, wp, kb, x, xs, acc); break;
    case 2: q4_0_kernel(2, wp, kb, x, xs, acc); break;
    case 3: q4_0_kernel(3, wp, kb, x, xs, acc); break;
    case 4: q4_0_kernel(4, wp, kb, x, xs, acc); break;
    case 5: q4_0_kernel(5, wp, kb, x, xs, acc); break;
    case 6: q4_0_kernel(6, wp, kb, x, xs, acc); break;
    case 7: q4_0_kernel(7, wp, kb, x, xs, acc); break;
    default: q4_0_kernel(RN, wp, kb, x, xs, acc); break;
    }
}

/* n_w x n_x outputs: one activation row through rows16; more in passes of
 * 16 weight rows and XB activation rows, blocks in chunks of KB.  Full
 * rows of 16 outputs at 64-byte aligned addresses go out by non-temporal
 * stores (the output is written once and larger than the caches); the
 * fence orders them before the pool's completion signal. */
static void q4_0_tile(int64_t n, const void *wv, size_t ws, int n_w, const void *xv, size_t xs,
                      int n_x, float *y, size_t ldy)
{
    const uint8_t *w = wv, *x = xv;
    if (n_x == 1) {
        for (int i = 0; i < n_w; i += 16) {
            if (n_w - i >= 16)
                q4_0_rows16(n, w + (size_t)i * ws, ws, 16, x, y + i);
            else
                q4_0_rows16(n, w + (size_t)i * ws, ws, n_w - i, x, y + i);
        }
        return;
    }
    wpack16 wp[KB];
    __m512 acc[XB];
    const int64_t nb = n / 32;
    for (int i1 = 0; i1 < n_w; i1 += 16) {
        const int nwc = n_w - i1 < 16 ? n_w - i1 : 16;
        for (int j1 = 0; j1 < n_x; j1 += XB) {
            const int nxb = n_x - j1 < XB ? n_x - j1 : XB;
            for (int j = 0; j < nxb; j++)
                acc[j] = _mm512_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += KB) {
                const int kb = nb - b0 < KB ? (int)(nb - b0) : KB;
                repack16(w + (size_t)i1 * ws, ws, nwc, b0, kb, wp);
                for (int j0 = 0; j0 < nxb; j0 += RN)
                    q4_0_kernel_rn(nxb - j0 < RN ? nxb - j0 : RN, wp, kb,
                                   x + (size_t)(j1 + j0) * xs + (size_t)b0 * XP_BYTES, xs, &acc[j0]);
            }
            for (int j = 0; j < nxb; j++) {
                float *yo = y + (size_t)(j1 + j) * ldy + i1;
                if (nwc == 16 && ((uintptr_t)yo & 63) == 0) {
                    _mm512_stream_ps(yo, acc[j]);
                    continue;
                }
                float lanes[16];
                _mm512_storeu_ps(lanes, acc[j]);
                for (int r = 0; r < nwc; r++)
                    yo[r] = lanes[r];
            }
        }
    }
    _mm_sfence();
}

/* ---- Q8_0 ------------------------------------------------------------------ */

/* The lane sums' start: -128 * (each lane's 4 weights), so that VPDPBUSD of
 * the activations + 128 leaves the signed products' sums. */
INLINE __m512i q8_start(__m512i wq)
{
    const __m512i lane_sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), wq);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(lane_sum, 7));
}

static float q8_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q8_0 *wb = w, *xb = x;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m512i wq = join256(_mm256_loadu_si256((const __m256i *)wb[b].qs),
                                   _mm256_loadu_si256((const __m256i *)wb[b + 1].qs));
        const __m512i xq = _mm512_xor_si512(join256(_mm256_loadu_si256((const __m256i *)xb[b].qs),
                                                    _mm256_loadu_si256((const __m256i *)xb[b + 1].qs)),
                                            flip);
        const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(q8_start(wq), xq, wq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * h2f(xb[b].d)), lo256(f), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b + 1].d) * h2f(xb[b + 1].d)), hi256(f), acc);
    }
    if (b < nb) {
        const __m512i wq = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)wb[b].qs));
        const __m512i xq = _mm512_xor_si512(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xb[b].qs)), flip);
        const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(q8_start(wq), xq, wq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * h2f(xb[b].d)), lo256(f), acc);
    }
    return hsum_ps(acc);
}

/* tile_x_prep: the bytes + 128, then d as a float. */
static void q8_0_prep(const void *xq, void *dst, int64_t n)
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

/* One weight row against NR (<= 8) prepared activation rows, each output
 * an 8-lane accumulator; dxt holds the activation rows' scales transposed
 * (8 per block, read by broadcast loads), or is NULL for rows too long for
 * it (the scales then come from the rows: the same float operations). */
INLINE void q8_0_kernel(int NR, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                        const float *dxt, float *y, size_t ldy)
{
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    __m256 acc[8];
    UNROLL for (int j = 0; j < NR; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const block_q8_0 *wk = (const block_q8_0 *)w + b;
        const __m256i wq = _mm256_loadu_si256((const __m256i *)wk->qs);
        const __m256i start = _mm256_sub_epi32(zero, _mm256_slli_epi32(_mm256_dpbusd_epi32(zero, ones, wq), 7));
        __m256 dw = _mm256_set1_ps(h2f(wk->d));
        __asm__("" : "+v"(dw));   /* one broadcast per block, not one per row */
        UNROLL for (int j = 0; j < NR; j++) {
            const uint8_t *xk = x + (size_t)j * xs + (size_t)b * Q8_XP;
            const __m256 s = _mm256_mul_ps(dw, dxt ? _mm256_broadcast_ss(&dxt[8 * b + j])
                                                   : _mm256_set1_ps(load_f32(xk + 32)));
            acc[j] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(
                                              start, _mm256_loadu_si256((const __m256i *)xk), wq)),
                                     acc[j]);
        }
    }
    UNROLL for (int j = 0; j < NR; j++)
        y[(size_t)j * ldy] = hsum_ps(acc[j]);
}

enum { Q8_NBMAX = 1024 };

#define Q8_CASE(c)                                                                  \
    case c:                                                                         \
        q8_0_kernel(c, nb, wp, xp, xs, dxt_or_null, y + (size_t)j0 * ldy + i, ldy); \
        break;

/* One weight row against up to 8 activation rows at a time, which stay in
 * L1 while the weight rows pass. */
static void q8_0_tile(int64_t n, const void *w, size_t ws, int n_w, const void *x, size_t xs,
                      int n_x, float *y, size_t ldy)
{
    const int64_t nb = n / 32;
    float dxt[8 * Q8_NBMAX] __attribute__((aligned(32)));
    const float *dxt_or_null = nb <= Q8_NBMAX ? dxt : NULL;
    for (int j0 = 0; j0 < n_x; j0 += 8) {
        const int rn = n_x - j0 < 8 ? n_x - j0 : 8;
        const uint8_t *xp = (const uint8_t *)x + (size_t)j0 * xs;
        if (dxt_or_null)
            for (int64_t b = 0; b < nb; b++)
                for (int j = 0; j < 8; j++)
                    dxt[8 * b + j] = j < rn ? load_f32(xp + (size_t)j * xs + (size_t)b * Q8_XP + 32) : 0.0f;
        for (int i = 0; i < n_w; i++) {
            const uint8_t *wp = (const uint8_t *)w + (size_t)i * ws;
            switch (rn) {
            Q8_CASE(1) Q8_CASE(2) Q8_CASE(3) Q8_CASE(4)
            Q8_CASE(5) Q8_CASE(6) Q8_CASE(7) Q8_CASE(8)
            default: break;
            }
        }
    }
}

/* ---- registration ------------------------------------------------------------ */

void tensor__kernels_avx512(tensor_traits *table, int q8_tile)
{
    table[TT_Q4_0].vec_dot = q4_0_vec_dot;
    table[TT_Q4_0].vec_dot_tile = q4_0_tile;
    table[TT_Q4_0].tile_x_block_bytes = XP_BYTES;
    table[TT_Q4_0].tile_x_prep = q4_0_prep;
    table[TT_Q8_0].vec_dot = q8_0_vec_dot;
    tensor__kernels_q4k_r8_avx512(table);
    tensor__kernels_q6k_r8_avx512(table);
    tensor__kernels_q8r8_avx512(table);
    tensor__kernels_klow_avx512(table);
    tensor__kernels_iq_avx512(table);
    if (!q8_tile)
        return;
    table[TT_Q8_0].vec_dot_tile = q8_0_tile;
    table[TT_Q8_0].tile_x_block_bytes = Q8_XP;
    table[TT_Q8_0].tile_x_prep = q8_0_prep;
}
