/* attend.h - the float work of a transformer layer outside the matrix
 * products: attention of one KV head's query heads over the cache, and the
 * SwiGLU gate.  SIMD versions are chosen by tensor_kernels_init like the
 * dot products; the reference versions (attend_ref.c) are what the tests
 * compare them with.
 */
#ifndef RC_ATTEND_H
#define RC_ATTEND_H

#include <stddef.h>
#include <stdint.h>

/* Attention of n_q query heads that share one KV head, over n_pos cached
 * positions (n_pos >= 1):
 *   out[g] = sum_p softmax_p(scale * q[g] . k_p) v_p      for g < n_q
 * q: n_q rows of D floats, consecutive; the cache's elements are
 * `kv_type`, TT_F32, TT_F16 or TT_Q8_0, in rows as tensor/kv_types.h lays
 * them out: k_p, the row of position p, starts p rows of k_stride values
 * (p * kv_row_bytes(kv_type, k_stride) bytes) after k and its first D
 * values are the key, likewise v_p and Dv; q8_0 is read block by block
 * where it lies, never expanded into a copy.  out: n_q rows of Dv
 * floats.  scores: scratch of n_q * n_pos floats.  Results agree with the
 * reference to float rounding (the SIMD exponential is within 2 ulp of
 * expf). */
void tensor_attend(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                   const void *k, size_t k_stride, const void *v, size_t v_stride,
                   int n_pos, float *scores, float *out);

/* a[i] = silu(a[i]) * b[i] = a[i] / (1 + exp(-a[i])) * b[i], i < n. */
void tensor_swiglu(float *a, const float *b, size_t n);

/* x[i] = exp(x[i] - max) / sum, i < n (n >= 1): libm's exponential, the
 * sum in double.  Plain C in every build (MoE routing weights). */
void tensor_softmax(float *x, int n);

/* The sum in double of exp(min(x[i], FLT_MAX) - shift) over the x[i] that
 * are above -inf (NaN and -inf count 0), for x[i] <= shift + 88: the
 * normaliser of log-probabilities over a vocabulary.  Terms under e^-64 may
 * count 0 (the SIMD version drops them). */
double tensor_sum_exp(const float *x, size_t n, float shift);

/* The reference versions, for tests and for CPUs without SIMD kernels. */
void tensor_attend_ref(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                       const void *k, size_t k_stride, const void *v, size_t v_stride,
                       int n_pos, float *scores, float *out);
void tensor_swiglu_ref(float *a, const float *b, size_t n);
double tensor_sum_exp_ref(const float *x, size_t n, float shift);

#endif
