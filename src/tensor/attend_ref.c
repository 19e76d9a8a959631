/* attend_ref.c - the reference attention and SwiGLU (attend.h): plain C,
 * the softmax summed in double, the exponential from libm. */
#include "attend.h"
#include "types.h"

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

void tensor_attend_ref(const float *q, int n_q, int D, int Dv, float scale,
                       const float *k, size_t k_stride, const float *v, size_t v_stride,
                       int n_pos, float *scores, float *out)
{
    for (int g = 0; g < n_q; g++) {
        const float *qg = q + (size_t)g * D;
        float *s = scores + (size_t)g * n_pos, *o = out + (size_t)g * Dv;
        for (int p = 0; p < n_pos; p++) {
            const float *kp = k + (size_t)p * k_stride;
            float dot = 0.0f;
            for (int i = 0; i < D; i++)
                dot += kp[i] * qg[i];
            s[p] = dot * scale;
        }
        tensor_softmax(s, n_pos);
        memset(o, 0, (size_t)Dv * sizeof(float));
        for (int p = 0; p < n_pos; p++) {
            const float *vp = v + (size_t)p * v_stride;
            for (int i = 0; i < Dv; i++)
                o[i] += s[p] * vp[i];
        }
    }
}

void tensor_swiglu_ref(float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}
