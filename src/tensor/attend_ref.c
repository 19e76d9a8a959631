/* attend_ref.c - the reference attention and SwiGLU (attend.h): plain C,
 * the softmax summed in double, the exponential from libm, f16 and q8_0
 * cache elements converted one by one. */
#include "attend.h"
#include "fp16.h"
#include "kv_types.h"

#include <float.h>
#include <math.h>
#include <string.h>

void tensor_softmax(float *x, int n)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* Element i of a cache row. */
static inline float kv_at(const void *row, int type, int i)
{
    if (type == TT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + i / QK8_0;
        return fp16_to_fp32(b->d) * (float)b->qs[i % QK8_0];
    }
    return type == TT_F16 ? fp16_to_fp32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

void tensor_attend_ref(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                       const void *k, size_t k_stride, const void *v, size_t v_stride,
                       int n_pos, float *scores, float *out)
{
    const size_t k_row = kv_row_bytes(kv_type, k_stride), v_row = kv_row_bytes(kv_type, v_stride);
    for (int g = 0; g < n_q; g++) {
        const float *qg = q + (size_t)g * D;
        float *s = scores + (size_t)g * n_pos, *o = out + (size_t)g * Dv;
        for (int p = 0; p < n_pos; p++) {
            const void *kp = (const uint8_t *)k + (size_t)p * k_row;
            float dot = 0.0f;
            for (int i = 0; i < D; i++)
                dot += kv_at(kp, kv_type, i) * qg[i];
            s[p] = dot * scale;
        }
        tensor_softmax(s, n_pos);
        memset(o, 0, (size_t)Dv * sizeof(float));
        for (int p = 0; p < n_pos; p++) {
            const void *vp = (const uint8_t *)v + (size_t)p * v_row;
            for (int i = 0; i < Dv; i++)
                o[i] += s[p] * kv_at(vp, kv_type, i);
        }
    }
}

double tensor_sum_exp_ref(const float *x, size_t n, float shift)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        if (x[i] > -INFINITY)
            sum += exp((double)(x[i] > FLT_MAX ? FLT_MAX : x[i]) - (double)shift);
    return sum;
}

void tensor_swiglu_ref(float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}
