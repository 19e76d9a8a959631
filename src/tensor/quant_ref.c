/* quant_ref.c - reference (scalar) code of the float types and the
 * 32-element block formats: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q8_1.  This is the specification the SIMD kernels are tested against.
 *
 * Bit-exact with GGUF/ggml: the dequantisers evaluate the same expressions
 * in the same order, and the quantisers are ggml's reference quantisers
 * (quantize_row_*_ref), so Q8_0/Q8_1 activations match llama.cpp's bit for
 * bit and weight files match what gguf tools write.  The vec_dot functions
 * follow ggml's scalar kernels: integer sums per block, then the block's
 * float scales.
 *
 * Layout of a block of 32 (Q4_x, Q5_x): byte j of qs holds element j in its
 * low nibble and element j + 16 in its high nibble; a Q5 block's fifth bits
 * are the 32 bits of qh (little-endian), bit i for element i.  Q8_1's s is
 * d * sum(qs), the dot product's correction for a weight block's minimum.
 *
 * Sections: helpers; F32, F16, BF16; Q4_0; Q4_1; Q5_0; Q5_1; Q8_0; Q8_1.
 */
#include "tensor/quant_ref.h"

#include <float.h>
#include <math.h>

#include "tensor/fp16.h"

/* ---- helpers ------------------------------------------------------------ */

static uint32_t load_le32(const uint8_t b[4])
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
           (uint32_t)b[3] << 24;
}

static void store_le32(uint8_t b[4], uint32_t v)
{
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
}

/* ggml's `MIN(hi, (int8_t)v)` for v >= 0: truncates toward zero.  Written
 * without the float-to-int conversion for out-of-range v, so NaN or huge
 * inputs give a valid (if meaningless) quant instead of undefined
 * behaviour. */
static uint8_t trunc_clamp(float v, int hi)
{
    if (!(v > 0.0f))
        return 0;
    if (v >= (float)hi)
        return (uint8_t)hi;
    return (uint8_t)v;
}

/* v rounded to nearest, ties to even, into an int8 (v is within [-127, 127]
 * for finite input; the clamp only guards NaN/Inf).
 * Q8_0/Q8_1 activations follow llama.cpp's x86 quantiser (the one that made
 * the golden logits): scale id = 127 / amax, round half to even.  ggml's
 * portable reference uses 1 / (amax / 127) and roundf, which differs in the
 * last bit for ~1% of values and so changes logits measurably. */
static int8_t round_i8(float v)
{
    if (!(v >= -128.0f))
        return v != v ? 0 : -128;
    if (v > 127.0f)
        return 127;
    return (int8_t)tensor__round_even(v);
}

float tensor__dot_f32_blocks(to_float_fn to_float, int64_t block_size,
                             size_t block_bytes, const void *w,
                             const float *x, int64_t n)
{
    float tmp[QK_K];                     /* the largest block size */
    const uint8_t *p = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += block_size, p += block_bytes) {
        to_float(p, tmp, block_size);
        for (int64_t j = 0; j < block_size; j++)
            sum += tmp[j] * x[i + j];
    }
    return sum;
}

/* ---- F32, F16, BF16 -----------------------------------------------------
 * vec_dot multiplies in f32 and accumulates in double, as ggml's scalar
 * ggml_vec_dot_f32/f16/bf16 do; dot_f32 accumulates in f32 (types.h). */

static void f32_to_float(const void *src, float *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *src, void *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

static float f32_dot_f32(const void *w, const float *x, int64_t n)
{
    const float *a = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += a[i] * x[i];
    return sum;
}

static float f32_vec_dot(const void *w, const void *x, int64_t n)
{
    const float *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(a[i] * b[i]);
    return (float)sum;
}

static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const fp16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = fp16_to_fp32(h[i]);
}

static void f16_from_float(const float *src, void *dst, int64_t n)
{
    fp16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = fp32_to_fp16(src[i]);
}

static float f16_dot_f32(const void *w, const float *x, int64_t n)
{
    const fp16_t *a = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += fp16_to_fp32(a[i]) * x[i];
    return sum;
}

static float f16_vec_dot(const void *w, const void *x, int64_t n)
{
    const fp16_t *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]));
    return (float)sum;
}

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const bf16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bf16_to_fp32(h[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    bf16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = fp32_to_bf16(src[i]);
}

static float bf16_dot_f32(const void *w, const float *x, int64_t n)
{
    const bf16_t *a = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += bf16_to_fp32(a[i]) * x[i];
    return sum;
}

static float bf16_vec_dot(const void *w, const void *x, int64_t n)
{
    const bf16_t *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
    return (float)sum;
}

/* ---- Q4_0: x = d * (q - 8) ----------------------------------------------- */

static void q4_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j]             = ((b[i].qs[j] & 0x0f) - 8) * d;
            dst[j + QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* The element of largest magnitude maps to q = 0 exactly (d takes its
 * sign), so the 16 levels cover [-8d, 7d] with no level wasted. */
static void q4_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++)
            if (amax < fabsf(src[j])) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            uint8_t lo = trunc_clamp(src[j] * id + 8.5f, 15);
            uint8_t hi = trunc_clamp(src[j + QK4_0 / 2] * id + 8.5f, 15);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static float q4_0_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q4_0_to_float, QK4_0, sizeof(block_q4_0), w, x, n);
}

static float q4_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((a[i].qs[j] & 0x0f) - 8) * b[i].qs[j];
            sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + QK4_0 / 2];
        }
        sum += sumi * fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d);
    }
    return sum;
}

/* ---- Q4_1: x = d * q + m ------------------------------------------------- */

static void q4_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j]             = (b[i].qs[j] & 0x0f) * d + m;
            dst[j + QK4_1 / 2] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void q4_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            uint8_t lo = trunc_clamp((src[j] - min) * id + 0.5f, 15);
            uint8_t hi = trunc_clamp((src[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static float q4_1_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q4_1_to_float, QK4_1, sizeof(block_q4_1), w, x, n);
}

/* The minimum's contribution m * sum(x) comes from the activation block's
 * precomputed s, so only the quants are multiplied. */
static float q4_1_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q4_1 *a = w;
    const block_q8_1 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            sumi += (a[i].qs[j] & 0x0f) * b[i].qs[j];
            sumi += (a[i].qs[j] >> 4) * b[i].qs[j + QK4_1 / 2];
        }
        sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * sumi +
               fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
    }
    return sum;
}

/* ---- Q5_0: x = d * (q - 16), q = nibble | qh bit << 4 -------------------- */

static void q5_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        const float d = fp16_to_fp32(b[i].d);
        const uint32_t qh = load_le32(b[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = (b[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j]             = (q0 - 16) * d;
            dst[j + QK5_0 / 2] = (q1 - 16) * d;
        }
    }
}

static void q5_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++)
            if (amax < fabsf(src[j])) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            uint8_t q0 = trunc_clamp(src[j] * id + 16.5f, 31);
            uint8_t q1 = trunc_clamp(src[j + QK5_0 / 2] * id + 16.5f, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_le32(b[i].qh, qh);
    }
}

static float q5_0_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q5_0_to_float, QK5_0, sizeof(block_q5_0), w, x, n);
}

static float q5_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const uint32_t qh = load_le32(a[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = ((a[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4) - 16;
            int q1 = ((a[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
            sumi += q0 * b[i].qs[j] + q1 * b[i].qs[j + QK5_0 / 2];
        }
        sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * sumi;
    }
    return sum;
}

/* ---- Q5_1: x = d * q + m ------------------------------------------------- */

static void q5_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        const uint32_t qh = load_le32(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int q0 = (b[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j]             = q0 * d + m;
            dst[j + QK5_1 / 2] = q1 * d + m;
        }
    }
}

static void q5_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            uint8_t q0 = trunc_clamp((src[j] - min) * id + 0.5f, 31);
            uint8_t q1 = trunc_clamp((src[j + QK5_1 / 2] - min) * id + 0.5f, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_le32(b[i].qh, qh);
    }
}

static float q5_1_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q5_1_to_float, QK5_1, sizeof(block_q5_1), w, x, n);
}

static float q5_1_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q5_1 *a = w;
    const block_q8_1 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const uint32_t qh = load_le32(a[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            int q0 = (a[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (a[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            sumi += q0 * b[i].qs[j] + q1 * b[i].qs[j + QK5_1 / 2];
        }
        sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * sumi +
               fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
    }
    return sum;
}

/* ---- Q8_0: x = d * q; the activation format of Q4_0, Q5_0, Q8_0 ---------
 * d = amax / 127 rounds to f16 for storage, but the quants are computed
 * with the f32 d's inverse, and rounded half away from zero (roundf), as
 * ggml does. */

static void q8_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            dst[j] = b[i].qs[j] * d;
    }
}

static void q8_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            b[i].qs[j] = round_i8(src[j] * id);
    }
}

static float q8_0_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q8_0_to_float, QK8_0, sizeof(block_q8_0), w, x, n);
}

static float q8_0_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q8_0 *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++)
            sumi += a[i].qs[j] * b[i].qs[j];
        sum += sumi * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
    }
    return sum;
}

/* ---- Q8_1: Q8_0 plus s = d * sum(q); the activation format of Q4_1, Q5_1 */

static void q8_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_1; j++)
            dst[j] = b[i].qs[j] * d;
    }
}

static void q8_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            b[i].qs[j] = round_i8(src[j] * id);
            sum += b[i].qs[j];
        }
        /* the f32 d, not the stored f16 one, as ggml computes it */
        b[i].s = fp32_to_fp16((float)sum * d);
    }
}

/* ---- the entries -------------------------------------------------------- */

const tensor_traits tensor__ref_f32 = {
    .name = "F32", .block_size = 1, .block_bytes = sizeof(float),
    .to_float = f32_to_float, .from_float = f32_from_float,
    .dot_f32 = f32_dot_f32, .vec_dot_type = TT_F32, .vec_dot = f32_vec_dot,
};
const tensor_traits tensor__ref_f16 = {
    .name = "F16", .block_size = 1, .block_bytes = sizeof(fp16_t),
    .to_float = f16_to_float, .from_float = f16_from_float,
    .dot_f32 = f16_dot_f32, .vec_dot_type = TT_F16, .vec_dot = f16_vec_dot,
};
const tensor_traits tensor__ref_bf16 = {
    .name = "BF16", .block_size = 1, .block_bytes = sizeof(bf16_t),
    .to_float = bf16_to_float, .from_float = bf16_from_float,
    .dot_f32 = bf16_dot_f32, .vec_dot_type = TT_BF16, .vec_dot = bf16_vec_dot,
};
const tensor_traits tensor__ref_q4_0 = {
    .name = "Q4_0", .block_size = QK4_0, .block_bytes = sizeof(block_q4_0),
    .to_float = q4_0_to_float, .from_float = q4_0_from_float,
    .dot_f32 = q4_0_dot_f32, .vec_dot_type = TT_Q8_0, .vec_dot = q4_0_vec_dot,
};
const tensor_traits tensor__ref_q4_1 = {
    .name = "Q4_1", .block_size = QK4_1, .block_bytes = sizeof(block_q4_1),
    .to_float = q4_1_to_float, .from_float = q4_1_from_float,
    .dot_f32 = q4_1_dot_f32, .vec_dot_type = TT_Q8_1, .vec_dot = q4_1_vec_dot,
};
const tensor_traits tensor__ref_q5_0 = {
    .name = "Q5_0", .block_size = QK5_0, .block_bytes = sizeof(block_q5_0),
    .to_float = q5_0_to_float, .from_float = q5_0_from_float,
    .dot_f32 = q5_0_dot_f32, .vec_dot_type = TT_Q8_0, .vec_dot = q5_0_vec_dot,
};
const tensor_traits tensor__ref_q5_1 = {
    .name = "Q5_1", .block_size = QK5_1, .block_bytes = sizeof(block_q5_1),
    .to_float = q5_1_to_float, .from_float = q5_1_from_float,
    .dot_f32 = q5_1_dot_f32, .vec_dot_type = TT_Q8_1, .vec_dot = q5_1_vec_dot,
};
const tensor_traits tensor__ref_q8_0 = {
    .name = "Q8_0", .block_size = QK8_0, .block_bytes = sizeof(block_q8_0),
    .to_float = q8_0_to_float, .from_float = q8_0_from_float,
    .dot_f32 = q8_0_dot_f32, .vec_dot_type = TT_Q8_0, .vec_dot = q8_0_vec_dot,
};
/* Activations only: no dot products with Q8_1 weights. */
const tensor_traits tensor__ref_q8_1 = {
    .name = "Q8_1", .block_size = QK8_1, .block_bytes = sizeof(block_q8_1),
    .to_float = q8_1_to_float, .from_float = q8_1_from_float,
    .dot_f32 = NULL, .vec_dot_type = TT_Q8_1, .vec_dot = NULL,
};
