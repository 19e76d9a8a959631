/* simd_x86.h - internal to src/tensor: small helpers shared by the x86-64
 * kernel files (quant_avx2.c, quant_k_avx2.c, quant_tile_avx2.c,
 * quant_klow_avx2.c, quant_avx512.c, quant_klow_avx512.c, attend_avx2.c): block decoding and lane shuffles too.  Static inline, so each file compiles them
 * with its own instruction-set flags; include after <immintrin.h>.  The
 * last section only exists for the *_avx512.c files. */
#ifndef RC_SIMD_X86_H
#define RC_SIMD_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tensor/types.h"

#define INLINE static inline __attribute__((always_inline))

/* Loops over registers (constant trip counts after inlining) unrolled in
 * full; loops kept rolled where unrolling only spills.  A file that wants
 * another depth undefines UNROLL and says so. */
#if defined(__clang__)
#define UNROLL _Pragma("clang loop unroll(full)")
#define NO_UNROLL _Pragma("clang loop unroll(disable)")
#else
#define UNROLL _Pragma("GCC unroll 8")
#define NO_UNROLL _Pragma("GCC unroll 1")
#endif

INLINE float h2f(fp16_t h) { return _cvtsh_ss(h); }

/* The sum of 8 floats, always in this order (the golden tests lean on
 * llama.cpp's order, which this is). */
INLINE float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* The 4 bytes at p (any alignment) in every 32-bit lane: the activation
 * bytes that one multiply-add meets with 4 levels of each of 8 rows. */
INLINE __m256i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Asks for every cache line of [p, p + bytes) (and the one after, for a
 * p that is not line-aligned).  The repacked kernels read their weights
 * as one forward stream; on the Zen 2 VMs measured (BENCHMARKS.md) the
 * CPU's own stream prefetching left them at 5-6 GB/s where asking for the
 * lines a few KiB ahead reads 7.5-9: each calls this once per block for
 * the block PREFETCH_BYTES further on, or the whole blocks (at least one)
 * that fit in that distance. */
enum { PREFETCH_BYTES = 3072 };

INLINE void prefetch_lines(const void *p, int bytes)
{
    for (int c = 0; c < bytes + 64; c += 64)
        _mm_prefetch((const char *)p + c, _MM_HINT_T0);
}

/* fn(a, R, ...) with R the literal 1..7 of r, or 8 for any other r: a
 * kernel's row count as a constant, so each count compiles to its own
 * unrolled copy (passes of up to 8 rows, the last one ragged). */
#define SWITCH_ROWS8(fn, a, r, ...)              \
    switch (r) {                                 \
    case 1: fn(a, 1, __VA_ARGS__); break;        \
    case 2: fn(a, 2, __VA_ARGS__); break;        \
    case 3: fn(a, 3, __VA_ARGS__); break;        \
    case 4: fn(a, 4, __VA_ARGS__); break;        \
    case 5: fn(a, 5, __VA_ARGS__); break;        \
    case 6: fn(a, 6, __VA_ARGS__); break;        \
    case 7: fn(a, 7, __VA_ARGS__); break;        \
    default: fn(a, 8, __VA_ARGS__); break;       \
    }

/* A tile as passes of up to 8 activation rows per weight row (each weight
 * row's unpacking shared by the pass), through SWITCH_ROWS8: fn(a, J, n,
 * w_i, x_j0, xs, y + j0 * ldy + i, ldy) writes y[j * ldy] for j < J. */
#define TILE_PASSES8(fn, a, n, w, ws, n_w, x, xs, n_x, y, ldy)                              \
    for (int j0_ = 0; j0_ < (n_x); j0_ += 8) {                                              \
        const int J_ = (n_x) - j0_ < 8 ? (n_x) - j0_ : 8;                                   \
        const uint8_t *xj_ = (const uint8_t *)(x) + (size_t)j0_ * (xs);                     \
        for (int i_ = 0; i_ < (n_w); i_++)                                                  \
            SWITCH_ROWS8(fn, a, J_, n, (const uint8_t *)(w) + (size_t)i_ * (ws), xj_, xs,   \
                         (y) + (size_t)j0_ * (ldy) + i_, ldy)                               \
    }

/* Unaligned scalars inside packed blocks. */
INLINE float load_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

INLINE int32_t load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 32 levels of a 4-bit block in element order. */
INLINE __m256i nibbles32(const uint8_t *qs)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* Transposes 8 x 8 32-bit lanes in place (v[r] lane c <-> v[c] lane r). */
INLINE void transpose8(__m256i v[8])
{
    const __m256 a0 = _mm256_castsi256_ps(v[0]), a1 = _mm256_castsi256_ps(v[1]);
    const __m256 a2 = _mm256_castsi256_ps(v[2]), a3 = _mm256_castsi256_ps(v[3]);
    const __m256 a4 = _mm256_castsi256_ps(v[4]), a5 = _mm256_castsi256_ps(v[5]);
    const __m256 a6 = _mm256_castsi256_ps(v[6]), a7 = _mm256_castsi256_ps(v[7]);
    const __m256 t[8] = {
        _mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1),
        _mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3),
        _mm256_unpacklo_ps(a4, a5), _mm256_unpackhi_ps(a4, a5),
        _mm256_unpacklo_ps(a6, a7), _mm256_unpackhi_ps(a6, a7),
    };
    const __m256 u[8] = {
        _mm256_shuffle_ps(t[0], t[2], 0x44), _mm256_shuffle_ps(t[0], t[2], 0xee),
        _mm256_shuffle_ps(t[1], t[3], 0x44), _mm256_shuffle_ps(t[1], t[3], 0xee),
        _mm256_shuffle_ps(t[4], t[6], 0x44), _mm256_shuffle_ps(t[4], t[6], 0xee),
        _mm256_shuffle_ps(t[5], t[7], 0x44), _mm256_shuffle_ps(t[5], t[7], 0xee),
    };
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_castps_si256(_mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
        v[k + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
    }
}

/* Activation rows per pass of the AVX2 tile kernels: the second dimension
 * of the accumulators store_outputs reads. */
#define TILE_ACC_COLS 512

/* The accumulators of a pass of the tile kernels (quant_tile_avx2.c,
 * quant_k_avx2.c: up to 16 weight rows in 8-lane groups g, up to
 * TILE_ACC_COLS activation rows j) into y: row j's 8 * ng outputs are
 * consecutive, a whole cache line when ng is 2 and y is aligned, so
 * non-temporal stores write them without first reading the line (the
 * output matrix is larger than the caches and written once).  The fence
 * orders them before the thread pool's completion signal. */
INLINE void store_outputs(__m256 acc[][TILE_ACC_COLS], int ng, int nwc, int nxb, float *y, size_t ldy)
{
    for (int j = 0; j < nxb; j++) {
        float *yo = y + (size_t)j * ldy;
        if (nwc == 16 && ((uintptr_t)yo & 63) == 0) {
            _mm256_stream_ps(yo, acc[0][j]);
            _mm256_stream_ps(yo + 8, acc[1][j]);
            continue;
        }
        for (int g = 0; g < ng; g++) {
            const int nr = nwc - 8 * g < 8 ? nwc - 8 * g : 8;
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[g][j]);
            for (int r = 0; r < nr; r++)
                yo[8 * g + r] = lanes[r];
        }
    }
    _mm_sfence();
}

/* ---- AVX-512 (files compiled with its flags) ------------------------------ */
#if defined(__AVX512F__) && defined(__AVX512BW__)

INLINE __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
/* Lane r of the low half: the sum of the 8 lanes of the low half of v[r];
 * lane 8 + r: of the high half (8 rows' sums reduced at once). */
INLINE __m512i sum16x8(const __m512i v[8])
{
    __m512i s[4], t[2];
    UNROLL for (int k = 0; k < 4; k++)
        s[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                                _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    UNROLL for (int k = 0; k < 2; k++)
        t[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * k], s[2 * k + 1]),
                                _mm512_unpackhi_epi64(s[2 * k], s[2 * k + 1]));
    const __m512i i0 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i i1 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    return _mm512_add_epi32(_mm512_permutex2var_epi64(t[0], i0, t[1]),
                            _mm512_permutex2var_epi64(t[0], i1, t[1]));
}

#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* ---- the *_avx512.c files' repacked K-quant tiles (q4k_r8_avx512.c,
 * q6k_r8_avx512.c): a zmm holds two 8-row groups side by side, lane r =
 * row r of the pair. */

/* 32 bytes at a + o (lanes 0..7) and at b + o (lanes 8..15). */
INLINE __m512i load_pair(const uint8_t *a, const uint8_t *b, int o)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + o))),
                              _mm256_loadu_si256((const __m256i *)(b + o)), 1);
}

/* 8 fp16 at a + o and 8 at b + o as 16 floats. */
INLINE __m512 load_pair_ph(const uint8_t *a, const uint8_t *b, int o)
{
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + o))),
        _mm_loadu_si128((const __m128i *)(b + o)), 1));
}

INLINE __m512i bcast4_512(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* vec_dot_tile (types.h) NAME of a repacked K-quant whose groups are
 * GROUP_BYTES per super-block, from PAIR_DOT(J, nb, g0, g1, rows, x, xs,
 * y, ldy): the rows of the groups at g0 and g1 (g1 == g0 for a lone group)
 * against J <= RJ (at most 8) activation rows, storing the outputs of the rows whose
 * bit is set in `rows`.  w starts a group, ws is the file type's row size,
 * n_w rows (a last group may be used in part; its bytes exist whole).
 * Activation rows go RJ at a time through all the groups, two by two, so a
 * panel's weights are reused from the cache by the next rows while those
 * rows' blocks stay in L1. */
#define PAIR_J(c, RJ) ((c) < (RJ) ? (c) : (RJ))
#define DEFINE_PAIR_TILE(NAME, PAIR_DOT, RJ)                                                  \
    static void NAME(int64_t n, const void *w, size_t ws, int n_w, const void *x, size_t xs, \
                     int n_x, float *y, size_t ldy)                                           \
    {                                                                                         \
        const int64_t nb = n / QK_K;                                                          \
        for (int j0 = 0; j0 < n_x; j0 += (RJ)) {                                              \
            const int J = n_x - j0 < (RJ) ? n_x - j0 : (RJ);                                  \
            const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * xs;                         \
            for (int i = 0; i < n_w; i += 16) {                                               \
                const int nr = n_w - i < 16 ? n_w - i : 16;                                   \
                const __mmask16 rows = (__mmask16)((1u << nr) - 1);                           \
                const uint8_t *g0 = (const uint8_t *)w + (size_t)i * ws;                      \
                const uint8_t *g1 = nr > 8 ? g0 + 8 * ws : g0;                                \
                float *yo = y + (size_t)j0 * ldy + i;                                         \
                switch (J) {   /* J <= RJ <= 8; cases above RJ are never taken */         \
                case 1: PAIR_DOT(1, nb, g0, g1, rows, xj, xs, yo, ldy); break;                \
                case 2: PAIR_DOT(PAIR_J(2, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                case 3: PAIR_DOT(PAIR_J(3, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                case 4: PAIR_DOT(PAIR_J(4, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                case 5: PAIR_DOT(PAIR_J(5, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                case 6: PAIR_DOT(PAIR_J(6, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                case 7: PAIR_DOT(PAIR_J(7, RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;    \
                default: PAIR_DOT((RJ), nb, g0, g1, rows, xj, xs, yo, ldy); break;            \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
#endif

#endif
