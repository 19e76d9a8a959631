/* kernels_isa.h - internal to src/tensor: the entry points by which each
 * instruction-set file patches the active kernel table.  Each file
 * (quant_avx2.c, quant_neon.c, ...) is compiled with its own ISA flags and
 * only called after the CPU probe says the instructions exist. */
#ifndef RC_KERNELS_ISA_H
#define RC_KERNELS_ISA_H

#include "types.h"

/* x86-64 with AVX2, FMA and F16C (quant_avx2.c: float types, activation
 * quantisers, decoders); it installs the dot products of the 32-element
 * formats (quant_tile_avx2.c), of repacked Q4_0 (quant_q4r8_avx2.c) and of the K-quants (quant_k_avx2.c).
 * `use_vnni`: the CPU also has AVX-VNNI, whose VPDPBUSD the prompt kernels
 * then use. */
void tensor__kernels_avx2(tensor_traits *table, int use_vnni);
void tensor__kernels_tile_avx2(tensor_traits *table, int use_vnni);
void tensor__kernels_q4r8_avx2(tensor_traits *table, int use_vnni);   /* repacked Q4_0 */
void tensor__kernels_k_avx2(tensor_traits *table, int use_vnni);
void tensor__kernels_q4k_r8_avx2(tensor_traits *table, int use_vnni);   /* Q4_K_R8 tile */
void tensor__kernels_q8r8_avx2(tensor_traits *table, int use_vnni);   /* Q8_0_R8 tile */
/* The activation layout of the VPDPBUSD Q8_0_R8 kernels, per 32-element
 * block: the 32 bytes, 8 int32 starts (-128 x the sum of each 4 bytes), d
 * as a float; made by tensor__q8r8_prep (quant_q8r8_avx2.c, AVX2). */
enum { Q8R8_XP_START = 32, Q8R8_XP_D = 64, Q8R8_XP_BYTES = 68 };
void tensor__q8r8_prep(const void *xq, void *dst, int64_t n);
void tensor__kernels_q6k_r8_avx2(tensor_traits *table);   /* Q6_K_R8 tile */
void tensor__kernels_klow_avx2(tensor_traits *table);   /* Q2_K, Q3_K */
/* IQ4_NL, IQ4_XS and MXFP4 (quant_iq_avx2.c): vec_dot and vec_dot_tile. */
void tensor__kernels_iq_avx2(tensor_traits *table);
void tensor__attend_avx2(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                         const void *k, size_t k_stride, const void *v, size_t v_stride,
                         int n_pos, float *scores, float *out);
void tensor__swiglu_avx2(float *a, const float *b, size_t n);
double tensor__sum_exp_avx2(const float *x, size_t n, float shift);

/* x86-64 with AVX-512 F, BW, VL and VNNI (quant_avx512.c): the Q4_0 and
 * Q8_0 dot products (vec_dot, vec_dot_tile, tile_x_prep), installed over
 * the AVX2 set's; Q8_0's tile only with `q8_tile` (no faster than the
 * AVX-VNNI one, so chosen where that is missing).  It installs the tiles
 * of repacked Q4_K, Q6_K and Q8_0 (q4k_r8_avx512.c, q6k_r8_avx512.c,
 * quant_q8r8_avx512.c, the last with its activation layout) too. */
void tensor__kernels_avx512(tensor_traits *table, int q8_tile);
/* Q2_K and Q3_K (quant_klow_avx512.c): vec_dot and vec_dot_tile, faster
 * than the AVX2 ones at every batch size measured; called by the above. */
void tensor__kernels_klow_avx512(tensor_traits *table);
/* IQ4_NL, IQ4_XS and MXFP4 (quant_iq_avx512.c): vec_dot and vec_dot_tile,
 * called by the above (all measured faster than the AVX2 ones). */
void tensor__kernels_iq_avx512(tensor_traits *table);
void tensor__kernels_q4k_r8_avx512(tensor_traits *table);   /* Q4_K_R8 tile */
void tensor__kernels_q6k_r8_avx512(tensor_traits *table);   /* Q6_K_R8 tile */
void tensor__kernels_q8r8_avx512(tensor_traits *table);     /* Q8_0_R8 tile */

/* arm64 NEON; `has_dotprod` when the CPU has the SDOT/UDOT instructions. */
void tensor__kernels_neon(tensor_traits *table, int has_dotprod);
/* IQ4_NL, IQ4_XS and MXFP4 (quant_iq_neon.c), called by the above. */
void tensor__kernels_iq_neon(tensor_traits *table, int has_dotprod);

#endif
