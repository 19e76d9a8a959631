/* quant_q4r8_avx2.c - the tile kernel of Q4_0 weights repacked by 8 rows
 * (TT_Q4_0_R8, tensor/repack.h) for AVX2, with an AVX-VNNI variant.
 *
 * A group's block is 16 bytes of scales and four 32-byte vectors whose low
 * and high nibbles are the levels of the 8 rows, 4 per lane: each nibble
 * vector times 4 activation bytes broadcast to every lane advances the 8
 * rows' sums at once, lane r = row r, with no transposing add and no
 * rearranging per call.  One activation row or several: a pass takes up to
 * RJ activation rows against the group's blocks in order, so the group's
 * weights come from memory once and the later passes find them in cache.
 *
 * The arithmetic is Q4_0's (quant_tile_avx2.c): per block the exact
 * integer sum of levels (0..15) times activation bytes less 8 times the
 * activation bytes' sum, then acc = fma((float)isum, d_w * d_x, acc) in
 * block order, so each output equals Q4_0's vec_dot bit for bit.  The
 * activations come prepared by Q4_0's AVX2 tile_x_prep (registration takes
 * it from the table): per block 32 bytes, d as a float, the bytes' sum.
 * 16-bit partial sums (maddubs) hold the 8 groups of a block: |15 * 128 *
 * 2| * 8 < 32768.
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/repack.h"
#include "tensor/simd_x86.h"

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* The prepared activation block of Q4_0's AVX2 kernels. */
enum { XP_BYTES = 40, XP_D = 32, XP_SUM = 36 };
/* Activation rows per pass over a group (their sums and accumulators stay
 * in registers). */
enum { RJ = 4 };

/* The end of a block for activation row j (xb: its prepared block):
 * the offset, then the float step. */
INLINE __m256 finish(__m256i isum, __m256 dw, const uint8_t *xb, __m256 acc)
{
    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * load_i32(xb + XP_SUM)));
    const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(load_f32(xb + XP_D)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc);
}

/* The 16-bit partial sums of AVX2 (at most 8 groups of a block, see
 * above) and their widening; VPDPBUSD sums into 32 bits at once. */
INLINE __m256i step_avx2(__m256i s, __m256i q, __m256i x)
{
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(q, x));
}

INLINE __m256i end_avx2(__m256i s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }

VNNI INLINE __m256i step_vnni(__m256i s, __m256i q, __m256i x)
{
    return _mm256_dpbusd_avx_epi32(s, q, x);
}

VNNI INLINE __m256i end_vnni(__m256i s) { return s; }

/* One group (8 rows at g) against J activation rows (x, xs apart) over nb
 * blocks; acc[j] lane r: output (row r, activation row j). */
#define DEFINE_GROUP(NAME, ATTR, STEP, END)                                                \
    ATTR INLINE void NAME(int J, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, \
                          __m256 *acc)                                                     \
    {                                                                                      \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                         \
        for (int64_t b = 0; b < nb; b++, g += Q4_0_R8_BLOCK) {                             \
            const uint8_t *xb = x + (size_t)b * XP_BYTES;                                  \
            prefetch_lines(g + PREFETCH_BYTES, Q4_0_R8_BLOCK);                              \
            __m256i s[RJ];                                                                 \
            UNROLL for (int j = 0; j < J; j++)                                             \
                s[j] = _mm256_setzero_si256();                                             \
            UNROLL for (int c = 0; c < 4; c++) {                                           \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(g + 16 + 32 * c));  \
                const __m256i lo = _mm256_and_si256(v, m4);                                \
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);          \
                UNROLL for (int j = 0; j < J; j++) {                                       \
                    const uint8_t *xj = xb + (size_t)j * xs;                               \
                    s[j] = STEP(s[j], lo, bcast4(xj + 4 * c));                             \
                    s[j] = STEP(s[j], hi, bcast4(xj + 16 + 4 * c));                        \
                }                                                                          \
            }                                                                              \
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));       \
            UNROLL for (int j = 0; j < J; j++)                                             \
                acc[j] = finish(END(s[j]), dw, xb + (size_t)j * xs, acc[j]);               \
        }                                                                                  \
    }

DEFINE_GROUP(group_avx2, , step_avx2, end_avx2)
DEFINE_GROUP(group_vnni, VNNI, step_vnni, end_vnni)

/* Rows [0, nr) of the outputs of acc[0..J) into y (row j at y + j * ldy). */
INLINE void store(int J, int nr, const __m256 *acc, float *y, size_t ldy)
{
    for (int j = 0; j < J; j++) {
        if (nr == Q4_0_R8_ROWS) {
            _mm256_storeu_ps(y + (size_t)j * ldy, acc[j]);
            continue;
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[j]);
        memcpy(y + (size_t)j * ldy, lanes, (size_t)nr * sizeof(float));
    }
}

#define CASE(K, c)                                          \
    case c: {                                               \
        __m256 acc[RJ];                                     \
        UNROLL for (int j = 0; j < (c); j++)                \
            acc[j] = _mm256_setzero_ps();                   \
        K(c, nb, g, xj, xs, acc);                           \
        store(c, nr, acc, y + (size_t)j0 * ldy + i, ldy);   \
        break;                                              \
    }

/* vec_dot_tile: w at a group's first row, n_w rows (the last group may be
 * used in part), n_x prepared activation rows. */
#define DEFINE_TILE(NAME, ATTR, K)                                                         \
    ATTR static void NAME(int64_t n, const void *w, size_t ws, int n_w, const void *x,     \
                          size_t xs, int n_x, float *y, size_t ldy)                        \
    {                                                                                      \
        const int64_t nb = n / 32;                                                         \
        for (int i = 0; i < n_w; i += Q4_0_R8_ROWS) {                                      \
            const uint8_t *g = (const uint8_t *)w + (size_t)i * ws;                        \
            const int nr = n_w - i < Q4_0_R8_ROWS ? n_w - i : Q4_0_R8_ROWS;                \
            for (int j0 = 0; j0 < n_x; j0 += RJ) {                                         \
                const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * xs;                  \
                switch (n_x - j0 < RJ ? n_x - j0 : RJ) {                                   \
                CASE(K, 1) CASE(K, 2) CASE(K, 3) CASE(K, 4)                                \
                default: break;                                                            \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_TILE(q4_0_r8_tile, , group_avx2)
DEFINE_TILE(q4_0_r8_tile_vnni, VNNI, group_vnni)

void tensor__kernels_q4r8_avx2(tensor_traits *table, int use_vnni)
{
    /* after tensor__kernels_tile_avx2: Q4_0's AVX2 preparation, whose
     * layout the kernels above read */
    table[TT_Q4_0_R8].vec_dot_tile = use_vnni ? q4_0_r8_tile_vnni : q4_0_r8_tile;
    table[TT_Q4_0_R8].tile_x_block_bytes = XP_BYTES;
    table[TT_Q4_0_R8].tile_x_prep = table[TT_Q4_0].tile_x_prep;
}
