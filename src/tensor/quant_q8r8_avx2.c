/* quant_q8r8_avx2.c - the tile kernel of Q8_0 weights repacked by 8 rows
 * (TT_Q8_0_R8, tensor/q8_0_r8.h) for AVX2, with an AVX-VNNI variant.
 *
 * Chunk c of a group's block holds elements 4c..4c+3 of its 8 rows, lane r
 * = row r.  Against the activation's 4 bytes 4c..4c+3 broadcast to every
 * lane, with the sign trick (|w| times x carrying w's sign: the levels need
 * all 8 bits) and a widening add of the 16-bit pairs, lane r of the result
 * is exactly the lane-c sum Q8_0's kernels form for row r, from the same
 * byte pairs (so even maddubs' saturation, were it reached, would agree).
 * AVX-VNNI: VPDPBUSD of the levels + 128 and x, each lane started at -128
 * x (x's 4 bytes), gives the same sums without saturation.
 * Each lane c then has an accumulator of its own, a vector over the 8
 * rows: fma(d_w * d_x, (float)sum, acc_c) block after block, and at the
 * end the 8 accumulators are added in the order hsum_ps adds the 8 lanes
 * of Q8_0's one accumulator.  Same operations, same order, per output: the
 * bits of Q8_0's vec_dot (quant_tile_avx2.c; the AVX-512 one gives the
 * same), and the 8 rows' float steps share one instruction where Q8_0's
 * generation kernel spends one per row.
 *
 * AVX2 reads the activations as Q8_0 rows as converted: per block 4-byte
 * broadcasts straight from memory and d once.  AVX-VNNI reads them
 * prepared by tensor__q8r8_prep (layout in kernels_isa.h; the AVX-512
 * kernel reads the same): the starts come with the bytes, one instruction
 * per chunk and row fewer than the sign trick.  Activation rows are
 * taken one at a time against a group (8 accumulators fill the
 * registers), so for a batch the group's blocks come from cache after the
 * first row.
 *
 * Installed by the AVX2 set (quant_avx2.c), the VPDPBUSD variant where the
 * CPU has AVX-VNNI: measured on an Intel Xeon with RACIMO_KERNELS=avx2+vnni
 * (BENCHMARKS.md, 2026-12-04, 1B Q8_0, 1 thread) one sequence generated
 * 2.1x as fast as with Q8_0's own AVX-VNNI kernels (as in the file), and 8
 * sequences together 1.7x with the sign trick, 1.16x more with the prepared
 * starts.  With AVX-512 VNNI, quant_q8r8_avx512.c replaces it.
 */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_isa.h"
#include "tensor/q8_0_r8.h"
#include "tensor/simd_x86.h"

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* Lane c's 4-product sums for the 8 rows, w the chunk, xk the activation
 * block.  AVX2: |w| (unsigned) times x carrying w's sign, maddubs' 16-bit
 * pairs widened by madd, on Q8_0 blocks.  AVX-VNNI: VPDPBUSD of the
 * levels + 128 (unsigned) and x, started at -128 x (x's 4 bytes), on
 * blocks prepared by q8_0_r8_prep (no saturation; one instruction fewer
 * per chunk than the sign trick). */
#define DOT4_AVX2(w, xk, c)                                                              \
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w),                           \
                                           _mm256_sign_epi8(bcast4(((const block_q8_0 *)(xk))->qs + 4 * (c)), w)), \
                      _mm256_set1_epi16(1))
#define DOT4_VNNI(w, xk, c)                                                              \
    _mm256_dpbusd_avx_epi32(_mm256_set1_epi32(load_i32((xk) + Q8R8_XP_START + 4 * (c))),  \
                            _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)),           \
                            bcast4((xk) + 4 * (c)))
#define XD_AVX2(xk) h2f(((const block_q8_0 *)(xk))->d)
#define XD_VNNI(xk) load_f32((xk) + Q8R8_XP_D)

/* Lane c's step for the 8 rows: the chunk at q against x's bytes 4c..4c+3. */
#define LANE(DOT4, acc, c)                                                               \
    do {                                                                                 \
        const __m256i w = _mm256_loadu_si256((const __m256i *)(q + 32 * (c)));           \
        acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(DOT4(w, xk, c)), acc);               \
    } while (0)

/* The 8 outputs of the group at g (nb blocks) against the activation row
 * x (blocks of XBYTES). */
#define DEFINE_GROUP_ROW(NAME, ATTR, DOT4, XD, XBYTES)                                   \
    ATTR INLINE __m256 NAME(int64_t nb, const uint8_t *g, const uint8_t *x)              \
    {                                                                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,     \
               a6 = a0, a7 = a0;                                                         \
        for (int64_t b = 0; b < nb; b++, g += Q8_0_R8_BLOCK) {                           \
            prefetch_lines(g + PREFETCH_BYTES, Q8_0_R8_BLOCK);                            \
            const uint8_t *xk = x + (size_t)b * (XBYTES);                                \
            const uint8_t *q = g + 16;                                                   \
            const __m256 s = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)), \
                                           _mm256_set1_ps(XD(xk)));                      \
            LANE(DOT4, a0, 0);                                                           \
            LANE(DOT4, a1, 1);                                                           \
            LANE(DOT4, a2, 2);                                                           \
            LANE(DOT4, a3, 3);                                                           \
            LANE(DOT4, a4, 4);                                                           \
            LANE(DOT4, a5, 5);                                                           \
            LANE(DOT4, a6, 6);                                                           \
            LANE(DOT4, a7, 7);                                                           \
        }                                                                                \
        /* hsum_ps's order: halves, then pairs, then the last two */                    \
        const __m256 even = _mm256_add_ps(_mm256_add_ps(a0, a4), _mm256_add_ps(a2, a6));  \
        const __m256 odd = _mm256_add_ps(_mm256_add_ps(a1, a5), _mm256_add_ps(a3, a7));   \
        return _mm256_add_ps(even, odd);                                                 \
    }

DEFINE_GROUP_ROW(group_row, , DOT4_AVX2, XD_AVX2, sizeof(block_q8_0))
DEFINE_GROUP_ROW(group_row_vnni, VNNI, DOT4_VNNI, XD_VNNI, Q8R8_XP_BYTES)

/* vec_dot_tile: w at a group's first row, n_w rows (the last group may be
 * used in part), n_x activation rows (Q8_0, or prepared for AVX-VNNI). */
#define DEFINE_TILE(NAME, ATTR, GROUP_ROW)                                                \
    ATTR static void NAME(int64_t n, const void *w, size_t ws, int n_w, const void *x,     \
                          size_t xs, int n_x, float *y, size_t ldy)                        \
    {                                                                                      \
        const int64_t nb = n / QK8_0;                                                      \
        for (int i = 0; i < n_w; i += 8) {                                                 \
            const uint8_t *g = (const uint8_t *)w + (size_t)i * ws;                        \
            const int nr = n_w - i < 8 ? n_w - i : 8;                                      \
            for (int j = 0; j < n_x; j++) {                                                \
                const __m256 v = GROUP_ROW(nb, g, (const uint8_t *)x + (size_t)j * xs);      \
                float *out = y + (size_t)j * ldy + i;                                      \
                if (nr == 8) {                                                             \
                    _mm256_storeu_ps(out, v);                                              \
                } else {                                                                   \
                    float lanes[8];                                                        \
                    _mm256_storeu_ps(lanes, v);                                            \
                    memcpy(out, lanes, (size_t)nr * sizeof(float));                        \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_TILE(q8_0_r8_tile, , group_row)
DEFINE_TILE(q8_0_r8_tile_vnni, VNNI, group_row_vnni)

#undef LANE

/* tile_x_prep of the VPDPBUSD kernels (this file's and
 * quant_q8r8_avx512.c's): the bytes, each chunk's start -128 x (its 4
 * bytes), d as a float.  AVX2 alone, so every VNNI set can take it. */
void tensor__q8r8_prep(const void *xq, void *dst, int64_t n)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const block_q8_0 *xk = (const block_q8_0 *)xq + b;
        uint8_t *o = (uint8_t *)dst + (size_t)b * Q8R8_XP_BYTES;
        const __m256i v = _mm256_loadu_si256((const __m256i *)xk->qs);
        _mm256_storeu_si256((__m256i *)o, v);
        /* pairs of bytes (|sum| <= 256) times -128, then the pairs added */
        const __m256i start = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, v), _mm256_set1_epi16(-128));
        _mm256_storeu_si256((__m256i *)(o + Q8R8_XP_START), start);
        const float d = h2f(xk->d);
        memcpy(o + Q8R8_XP_D, &d, sizeof d);
    }
}

void tensor__kernels_q8r8_avx2(tensor_traits *table, int use_vnni)
{
    table[TT_Q8_0_R8].vec_dot_tile = use_vnni ? q8_0_r8_tile_vnni : q8_0_r8_tile;
    table[TT_Q8_0_R8].tile_x_block_bytes = use_vnni ? Q8R8_XP_BYTES : 0;
    table[TT_Q8_0_R8].tile_x_prep = use_vnni ? tensor__q8r8_prep : NULL;
}
