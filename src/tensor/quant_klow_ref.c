/* quant_klow_ref.c - reference (scalar) code of the low-bit K-quants Q2_K
 * and Q3_K (activations in Q8_K, quant_kref.c).  A super-block holds 256
 * elements in 16 sub-blocks of 16, each with its own scale.
 *
 * Layouts (bit-exact with GGUF/ggml; structs in types.h):
 *   Both: element e = 128h + 32j + l (h = 0..1, j = 0..3, l = 0..31) has
 *         its 2 low level bits at bits 2j, 2j + 1 of qs[32h + l]; it is in
 *         sub-block e / 16.
 *   Q2_K: x = d * sc * q - dmin * m, q in 0..3, with sc the low nibble and
 *         m the high nibble of scales[e / 16].
 *   Q3_K: x = d * sc * q, q in -4..3: the 2 low bits minus 4 unless bit
 *         4h + j of hmask[l] is set; sc the 6-bit scale of sub-block e / 16
 *         minus 32 (packing: tensor__q3_K_scales in quant_ref.h).
 *
 * The dequantisers evaluate ggml's expressions (dl = d * sc, ml = dmin * m;
 * dl * q - ml) in its order, so decoded weights are llama.cpp's bit for bit.
 * vec_dot sums the integer products of each sub-block exactly and applies
 * the float scales per super-block, as quant_kref.c's Q4_K does.  The
 * weight quantisers are racimo's own (tests and synthetic models need
 * data, not llama-quantize's bytes): per sub-block the least-squares fits
 * of quant_kref.c, then 4-bit (Q2_K) or 6-bit (Q3_K) sub-block scales
 * relative to the largest, and the levels chosen again against the scales
 * as stored.
 *
 * Sections: Q2_K; Q3_K; the entries.
 */
#include "tensor/quant_ref.h"

#include <math.h>

#include "tensor/fp16.h"

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The 2 low bits of the 256 levels of a block, in element order. */
static void low2_levels(const uint8_t qs[QK_K / 4], uint8_t q[QK_K])
{
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
}

/* Inverse of low2_levels (L[e] in 0..3). */
static void pack_low2(const uint8_t L[QK_K], uint8_t qs[QK_K / 4])
{
    memset(qs, 0, QK_K / 4);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                qs[32 * h + l] |= (uint8_t)((L[128 * h + 32 * j + l] & 3) << (2 * j));
}

/* ---- Q2_K ---------------------------------------------------------------- */

static void q2_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q2_K *b = src;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        low2_levels(b[i].qs, q);
        for (int s = 0; s < QK_K / 16; s++) {
            const float dl = d * (b[i].scales[s] & 0x0f), ml = dmin * (b[i].scales[s] >> 4);
            for (int l = 0; l < 16; l++)
                dst[16 * s + l] = dl * q[16 * s + l] - ml;
        }
    }
}

static void q2_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q2_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float sub_scale[QK_K / 16], sub_min[QK_K / 16], max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < QK_K / 16; s++) {
            sub_scale[s] = tensor__fit_scale_min(src + 16 * s, 16, 3, &sub_min[s]);
            if (sub_scale[s] > max_scale) max_scale = sub_scale[s];
            if (sub_min[s] > max_min) max_min = sub_min[s];
        }
        b[i].d = fp32_to_fp16(max_scale / 15.0f);
        b[i].dmin = fp32_to_fp16(max_min / 15.0f);
        /* relative to d and dmin as stored (see k4_quantise in quant_kref.c) */
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        uint8_t L[QK_K];
        for (int s = 0; s < QK_K / 16; s++) {
            const int sc = d > 0.0f ? clampi(tensor__round_even(sub_scale[s] / d), 0, 15) : 0;
            const int m = dmin > 0.0f ? clampi(tensor__round_even(sub_min[s] / dmin), 0, 15) : 0;
            b[i].scales[s] = (uint8_t)(sc | m << 4);
            const float dl = d * sc, ml = dmin * m;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)(dl != 0.0f
                    ? clampi(tensor__round_even((src[16 * s + l] + ml) / dl), 0, 3) : 0);
        }
        pack_low2(L, b[i].qs);
    }
}

static float q2_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q2_K_to_float, QK_K, sizeof(block_q2_K), w, x, n);
}

/* sum_s d sc_s (q . y)_s - dmin sum_s m_s sum(y)_s, with sum(y)_s Q8_K's
 * bsums[s] (its 16-element sums are exactly Q2_K's sub-blocks). */
static float q2_K_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q2_K *a = w;
    const block_q8_K *b = x;
    uint8_t q[QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        low2_levels(a[i].qs, q);
        int sumi = 0, summ = 0;
        for (int s = 0; s < QK_K / 16; s++) {
            int t = 0;
            for (int l = 0; l < 16; l++)
                t += q[16 * s + l] * b[i].qs[16 * s + l];
            sumi += (a[i].scales[s] & 0x0f) * t;
            summ += (a[i].scales[s] >> 4) * b[i].bsums[s];
        }
        const float d = fp16_to_fp32(a[i].d) * b[i].d;
        const float dmin = fp16_to_fp32(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}

/* ---- Q3_K ---------------------------------------------------------------- */

/* The 256 signed levels (-4..3) of a Q3_K block. */
static void q3_K_levels(const block_q3_K *b, int8_t q[QK_K])
{
    uint8_t lo[QK_K];
    low2_levels(b->qs, lo);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int e = 128 * h + 32 * j + l;
                q[e] = (int8_t)(lo[e] - ((b->hmask[l] >> (4 * h + j)) & 1 ? 0 : 4));
            }
}

static void q3_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q3_K *b = src;
    int8_t q[QK_K], sc[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = fp16_to_fp32(b[i].d);
        q3_K_levels(&b[i], q);
        tensor__q3_K_scales(b[i].scales, sc);
        for (int s = 0; s < QK_K / 16; s++) {
            const float dl = d * sc[s];
            for (int l = 0; l < 16; l++)
                dst[16 * s + l] = dl * q[16 * s + l];
        }
    }
}

static void q3_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q3_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float sub[QK_K / 16], max_scale = 0.0f, amax = 0.0f;
        for (int s = 0; s < QK_K / 16; s++) {
            sub[s] = tensor__fit_scale_sym(src + 16 * s, 16, 4);
            if (fabsf(sub[s]) > amax) {
                amax = fabsf(sub[s]);
                max_scale = sub[s];
            }
        }
        memset(&b[i], 0, sizeof b[i]);
        /* The largest sub-block scale maps to -32 (as the largest level to
         * -4); the others relative to d as stored.  An all-zero block keeps
         * d = 0 and decodes to zeros. */
        b[i].d = fp32_to_fp16(amax > 1e-15f ? max_scale / -32.0f : 0.0f);
        const float d = fp16_to_fp32(b[i].d);
        uint8_t L[QK_K];
        for (int s = 0; s < QK_K / 16; s++) {
            const int sc = d != 0.0f ? clampi(tensor__round_even(sub[s] / d), -32, 31) : 0;
            const int u = sc + 32;
            if (s < 8)
                b[i].scales[s] |= (uint8_t)(u & 0x0f);
            else
                b[i].scales[s - 8] |= (uint8_t)((u & 0x0f) << 4);
            b[i].scales[8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
            const float dl = d * sc;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)(dl != 0.0f
                    ? clampi(tensor__round_even(src[16 * s + l] / dl), -4, 3) + 4 : 4);
        }
        pack_low2(L, b[i].qs);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    b[i].hmask[l] |= (uint8_t)((L[128 * h + 32 * j + l] >> 2) << (4 * h + j));
    }
}

static float q3_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q3_K_to_float, QK_K, sizeof(block_q3_K), w, x, n);
}

static float q3_K_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q3_K *a = w;
    const block_q8_K *b = x;
    int8_t q[QK_K], sc[QK_K / 16];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q3_K_levels(&a[i], q);
        tensor__q3_K_scales(a[i].scales, sc);
        int sumi = 0;
        for (int s = 0; s < QK_K / 16; s++) {
            int t = 0;
            for (int l = 0; l < 16; l++)
                t += q[16 * s + l] * b[i].qs[16 * s + l];
            sumi += sc[s] * t;
        }
        sum += fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return sum;
}

/* ---- the entries -------------------------------------------------------- */

const tensor_traits tensor__ref_q2_K = {
    .name = "Q2_K", .block_size = QK_K, .block_bytes = sizeof(block_q2_K),
    .to_float = q2_K_to_float, .from_float = q2_K_from_float,
    .dot_f32 = q2_K_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = q2_K_vec_dot,
};
const tensor_traits tensor__ref_q3_K = {
    .name = "Q3_K", .block_size = QK_K, .block_bytes = sizeof(block_q3_K),
    .to_float = q3_K_to_float, .from_float = q3_K_from_float,
    .dot_f32 = q3_K_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = q3_K_vec_dot,
};
