/* types.h - tensor element types and their per-type function table.
 *
 * The enum values below TT_GGUF_COUNT are GGUF's (ggml's) type numbers: they
 * are read from files, so they are never renumbered, only appended; removed
 * ggml types stay as comments.  The numbers after them are in-memory layouts
 * (repacked weights) that never come from a file.  Every type racimo
 * computes with has an entry in the traits table, indexed by the enum.  The
 * entries start as the scalar reference code (quant_ref.c, quant_kref.c,
 * quant_klow_ref.c, quant_iqref.c; the
 * table itself in types.c), which is the specification and the test oracle;
 * faster kernels for an instruction set replace the function pointers at
 * start-up (tensor_kernels_init, kernels.c),
 * never the reference functions themselves.
 *
 * Vocabulary: a row of n elements is n / block_size blocks of block_bytes
 * each.  Every `n` below is a multiple of the type's block_size.
 */
#ifndef RC_TENSOR_TYPES_H
#define RC_TENSOR_TYPES_H

#include <stddef.h>
#include <stdint.h>

enum tensor_type {
    TT_F32  = 0,
    TT_F16  = 1,
    TT_Q4_0 = 2,
    TT_Q4_1 = 3,
    /* 4 (Q4_2) and 5 (Q4_3) were removed from ggml */
    TT_Q5_0 = 6,
    TT_Q5_1 = 7,
    TT_Q8_0 = 8,
    TT_Q8_1 = 9,
    TT_Q2_K = 10,
    TT_Q3_K = 11,
    TT_Q4_K = 12,
    TT_Q5_K = 13,
    TT_Q6_K = 14,
    TT_Q8_K = 15,
    TT_IQ2_XXS = 16,
    TT_IQ2_XS  = 17,
    TT_IQ3_XXS = 18,
    TT_IQ1_S   = 19,
    TT_IQ4_NL  = 20,
    TT_IQ3_S   = 21,
    TT_IQ2_S   = 22,
    TT_IQ4_XS  = 23,
    TT_I8  = 24,
    TT_I16 = 25,
    TT_I32 = 26,
    TT_I64 = 27,
    TT_F64 = 28,
    TT_IQ1_M = 29,
    TT_BF16  = 30,
    /* 31..33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) were removed from ggml */
    TT_TQ1_0 = 34,
    TT_TQ2_0 = 35,
    /* 36..38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were removed from ggml */
    TT_MXFP4 = 39,
    TT_GGUF_COUNT = 40,
    /* From TT_GGUF_COUNT on: racimo's in-memory layouts, made at load from a
     * file's tensors and never read from a file (the GGUF reader and writer
     * refuse these numbers).  They may be renumbered freely, e.g. when ggml
     * appends a type of its own. */
    TT_Q4_0_R8 = 40,   /* Q4_0 rows interleaved by 8 (tensor/repack.h) */
    TT_Q4_K_R8 = 41,   /* Q4_K rows interleaved by 8 (tensor/q4k_r8.h) */
    TT_Q8_0_R8 = 42,   /* Q8_0 rows interleaved by 8 (tensor/q8_0_r8.h) */
    TT_Q6_K_R8 = 43,   /* Q6_K rows interleaved by 8 (tensor/q6k_r8.h) */
    TT_COUNT = 44
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK4_NL 32
#define QK_MXFP4 32

typedef uint16_t fp16_t;   /* IEEE half, stored bits */
typedef uint16_t bf16_t;   /* bfloat16, stored bits */

/* Block layouts, byte for byte those of GGUF files. */
typedef struct { fp16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { fp16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { fp16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { fp16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { fp16_t d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { fp16_t d, s; int8_t qs[QK8_1]; } block_q8_1;   /* s = d * sum(qs) */
typedef struct {
    uint8_t scales[QK_K / 16];      /* per 16 elements: scale (low nibble), min (high) */
    uint8_t qs[QK_K / 4];           /* 2-bit levels */
    fp16_t  d, dmin;
} block_q2_K;
typedef struct {
    uint8_t hmask[QK_K / 8];        /* third bit of each level (set: level >= 0) */
    uint8_t qs[QK_K / 4];           /* low 2 bits of each level */
    uint8_t scales[K_SCALE_SIZE];   /* 16 six-bit scales, biased by 32 */
    fp16_t  d;
} block_q3_K;
typedef struct {
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];   /* 8 six-bit scales and 8 six-bit mins */
    uint8_t qs[QK_K / 2];
} block_q4_K;
typedef struct {
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t  scales[QK_K / 16];
    fp16_t  d;
} block_q6_K;
typedef struct {
    float   d;
    int8_t  qs[QK_K];
    int16_t bsums[QK_K / 16];       /* sums of each 16 qs, for the K-quant mins */
} block_q8_K;

/* IQ4_NL: x = d * v[q] with v the 16-entry non-linear table (quant_iqref.c);
 * qs as Q4_0 (element j low nibble of qs[j], element j + 16 high nibble).
 * IQ4_XS: 8 sub-blocks of 32, each an IQ4_NL block whose scale is
 * d * (ls - 32) with a 6-bit ls: low 4 bits in scales_l (sub-block j in the
 * low nibble of byte j / 2 for even j, high for odd), top 2 bits at bit 2j
 * of scales_h.  MXFP4: FP4 E2M1 values times 2^(e - 127), an E8M0 scale. */
typedef struct { fp16_t d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
typedef struct {
    fp16_t   d;
    uint16_t scales_h;
    uint8_t  scales_l[QK_K / 64];
    uint8_t  qs[QK_K / 2];
} block_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K block");
_Static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs block");
_Static_assert(sizeof(block_mxfp4) == 17, "mxfp4 block");

/* Row of n elements of weights `w` (this type) against activations.
 * dot_f32: activations in f32; the weights are decoded exactly to f32 and the
 *          products summed in f32 (the "exact math" path).
 * vec_dot: activations already converted to `vec_dot_type` (by that type's
 *          from_float), as llama.cpp does: integer products for quantised
 *          types (the fast path). */
typedef float (*dot_f32_fn)(const void *w, const float *x, int64_t n);
typedef float (*vec_dot_fn)(const void *w, const void *x, int64_t n);
typedef void  (*to_float_fn)(const void *src, float *dst, int64_t n);
typedef void  (*from_float_fn)(const float *src, void *dst, int64_t n);

/* vec_dot_tile: the n_w x n_x dot products of weight rows w_i = w + i *
 * w_stride (bytes) with activation rows x_j = x + j * x_stride (already in
 * vec_dot_type, or prepared by tile_x_prep), into y[j * ldy + i].  A SIMD kernel computes them in
 * register tiles, loading each weight block once for several activation
 * rows (the compute-bound prompt path).  Contract: each output depends only
 * on its two rows, never on n_w, n_x or where the pair sits in the grid, and
 * equals vec_dot's result bit for bit; so neither the split of the work
 * among threads nor the other rows of a batch change any result.  Thread
 * safe. */
typedef void (*vec_dot_tile_fn)(int64_t n, const void *w, size_t w_stride, int n_w,
                                const void *x, size_t x_stride, int n_x,
                                float *y, size_t ldy);

typedef struct {
    const char   *name;          /* "Q4_K", as GGUF tools print it */
    int64_t       block_size;    /* elements per block; 0 if unknown type */
    size_t        block_bytes;
    to_float_fn   to_float;      /* NULL if racimo cannot decode the type */
    from_float_fn from_float;    /* reference quantiser; NULL if none */
    dot_f32_fn    dot_f32;
    int           vec_dot_type;  /* activation type for vec_dot */
    vec_dot_fn    vec_dot;
    /* appended fields */
    vec_dot_tile_fn vec_dot_tile;  /* NULL: callers loop over vec_dot
                                      (the reference table has none) */
    /* The activation layout vec_dot_tile reads.  0: rows in vec_dot_type.
     * Otherwise each block of vec_dot_type takes tile_x_block_bytes in a
     * layout of the kernel's own, made from a vec_dot_type row by
     * tile_x_prep (once per matrix product rather than once per tile). */
    size_t        tile_x_block_bytes;
    void        (*tile_x_prep)(const void *xq, void *dst, int64_t n);
} tensor_traits;

/* The table, indexed by enum tensor_type; entries of types racimo does not
 * know have block_size 0.  Never NULL for 0 <= type < TT_COUNT; NULL for
 * numbers outside.  Works before tensor_kernels_init (it then returns the
 * reference entries). */
const tensor_traits *tensor_type_traits(int type);

/* Installs the fastest kernels this CPU runs into the table returned by
 * tensor_type_traits: the reference code patched by the AVX2 kernels
 * (x86-64 with AVX2, FMA and F16C; AVX-VNNI too when present; with AVX-512
 * F, BW, VL and VNNI the Q4_0, Q8_0, Q2_K and Q3_K dot products are AVX-512
 * ones) or
 * the NEON ones (arm64), as the CPU probe (base/cpu.h) finds.  The
 * environment variable RACIMO_KERNELS=ref keeps the reference code (for
 * comparisons and bisecting); RACIMO_KERNELS=avx2 leaves out the AVX-VNNI
 * and AVX-512 kernels; RACIMO_KERNELS=avx512 installs every AVX-512 kernel
 * (the default leaves out those no faster than the AVX-VNNI ones).  Idempotent
 * and thread safe (the first call does the work, later ones wait for it);
 * the pointers returned before the call stay valid (they point to the
 * reference entries). */
void tensor_kernels_init(void);

/* Reference (scalar) table, unaffected by tensor_kernels_init: tests use it
 * as the oracle for the SIMD entries. */
const tensor_traits *tensor_type_traits_ref(int type);

/* 1 if racimo can compute with weights of this type (decode and dot). */
int tensor_type_supported(int type);

/* Name for messages; "type 77" style for numbers outside the table (that
 * string lives in a per-thread buffer, valid until the thread's next call). */
const char *tensor_type_name(int type);

/* Type from its name ("q4_k" or "Q4_K"); -1 if unknown. */
int tensor_type_from_name(const char *name);

/* Bytes of a row of n elements; 0 when n is not a multiple of the block
 * size or the type is unknown. */
size_t tensor_row_bytes(int type, int64_t n);

/* Bytes of a row of n activations in the layout `t`'s vec_dot_tile reads
 * (tile_x_block_bytes per activation block, or the vec_dot_type row). */
size_t tensor_tile_x_bytes(const tensor_traits *t, int64_t n);

/* The kernel set tensor_kernels_init installed: "ref", "avx2",
 * "avx2+vnni", "avx2+avx512", "avx2+vnni+avx512", "neon" or "neon+dotprod"
 * ("ref" before the call). */
const char *tensor_kernels_name(void);

#endif
