/* quant_kref.c - reference (scalar) code of the K-quants: Q4_K, Q5_K, Q6_K
 * and their activation format Q8_K.  A super-block holds 256 elements.
 *
 * Layouts (bit-exact with GGUF/ggml):
 *   Q4_K: 8 sub-blocks of 32; x = d * sc[j] * q - dmin * m[j], q in 0..15.
 *         The 6-bit sc and m of sub-block j < 4 are the low 6 bits of
 *         scales[j] and scales[j + 4]; for j >= 4 their low nibbles are
 *         scales[j + 4] (sc low, m high) and their top two bits are bits 6-7
 *         of scales[j - 4] (sc) and scales[j] (m).  qs[32 * p + l] holds
 *         element 64p + l in its low nibble and 64p + 32 + l in its high one.
 *   Q5_K: Q4_K plus a fifth bit: bit j of qh[l] for element 32j + l.
 *   Q6_K: 16 sub-blocks of 16; x = d * scales[j] * (q - 32), q in 0..63.
 *         Element 128h + 32g + l (g = 0..3, l = 0..31) has its low 4 bits in
 *         ql[64h + l + 32 * (g & 1)] (low nibble for g < 2, high for g >= 2)
 *         and its top 2 bits at bit 2g of qh[32h + l].
 *   Q8_K: x = d * q with f32 d; bsums[k] = the sum of q[16k..16k+15].
 *
 * The dequantisers evaluate ggml's expressions in ggml's order.  Q8_K's
 * quantiser is ggml's quantize_row_q8_K_ref (activations must match
 * llama.cpp's).  The weight quantisers are racimo's own: for each
 * sub-block a small search over grid spacings with a least-squares fit of
 * scale and offset, then 6-bit (8-bit for Q6_K) sub-block scales relative
 * to the block maximum.  Their blocks decode with any GGUF reader; they are
 * not byte-identical to llama-quantize's.
 *
 * Sections: shared helpers; Q4_K; Q5_K; Q6_K; Q8_K; the entries.
 */
#include "tensor/quant_ref.h"

#include <math.h>

#include "tensor/fp16.h"

/* ---- shared helpers ------------------------------------------------------ */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The 6-bit scale and min of sub-block j from the 12 packed bytes. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

static void k4_pack_scales(uint8_t s[K_SCALE_SIZE], const uint8_t sc[8], const uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        s[j]     = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
}

/* Fits x[0..n) ~ scale * l - min with l in 0..nmax, scale >= 0 and min >= 0
 * (the format can only subtract an offset).  The grid starts at
 * lo = min(x, 0); spacings around (max - lo) / nmax are tried, each grid's
 * levels refitted by least squares, and the fit of least squared error
 * kept.  Returns the scale; *the_min receives min. */
float tensor__fit_scale_min(const float *x, int n, int nmax, float *the_min)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    if (lo > 0.0f)
        lo = 0.0f;
    if (!(hi > lo)) {                    /* constant block (or NaNs) */
        *the_min = -lo;
        return 0.0f;
    }
    float best_scale = (hi - lo) / (float)nmax, best_off = lo;
    float best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        const float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        float sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(tensor__round_even(iscale * (x[i] - lo)), 0, nmax);
            sl += (float)l;
            sl2 += (float)(l * l);
            sx += x[i];
            sxl += x[i] * (float)l;
        }
        /* least squares for x ~ a * l + b, with b <= 0 */
        const float det = (float)n * sl2 - sl * sl;
        if (!(det > 0.0f))
            continue;
        float a = ((float)n * sxl - sx * sl) / det;
        float b = (sl2 * sx - sl * sxl) / det;
        if (b > 0.0f) {
            b = 0.0f;
            a = sxl / sl2;
        }
        if (!(a > 0.0f))
            continue;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(tensor__round_even((x[i] - b) / a), 0, nmax);
            float e = a * (float)l + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = a;
            best_off = b;
        }
    }
    *the_min = -best_off;
    return best_scale;
}

/* Quantises one super-block to Q4_K/Q5_K levels: fills d, dmin, the packed
 * scales and L[256] (levels 0..nmax). */
static void k4_quantise(const float *x, int nmax, fp16_t *d_out, fp16_t *dmin_out,
                        uint8_t scales[K_SCALE_SIZE], uint8_t L[QK_K])
{
    float sub_scale[QK_K / 32], sub_min[QK_K / 32];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        sub_scale[j] = tensor__fit_scale_min(x + 32 * j, 32, nmax, &sub_min[j]);
        if (sub_scale[j] > max_scale) max_scale = sub_scale[j];
        if (sub_min[j] > max_min) max_min = sub_min[j];
    }
    *d_out = fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = fp32_to_fp16(max_min / 63.0f);
    /* Sub-block scales are taken relative to d as stored: for small weights
     * d is an f16 subnormal with few significant bits, and this makes up
     * for its rounding. */
    const float d = fp16_to_fp32(*d_out), dmin = fp16_to_fp32(*dmin_out);
    uint8_t sc[QK_K / 32], m[QK_K / 32];
    for (int j = 0; j < QK_K / 32; j++) {
        sc[j] = (uint8_t)(d > 0.0f ? clampi(tensor__round_even(sub_scale[j] / d), 0, 63) : 0);
        m[j] = (uint8_t)(dmin > 0.0f ? clampi(tensor__round_even(sub_min[j] / dmin), 0, 63) : 0);
    }
    k4_pack_scales(scales, sc, m);

    /* The levels are chosen again against the scales as stored (6-bit,
     * times an f16 d), which is what a reader will multiply by. */
    for (int j = 0; j < QK_K / 32; j++) {
        const float ds = d * sc[j], ms = dmin * m[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = ds != 0.0f
                ? (uint8_t)clampi(tensor__round_even((x[32 * j + l] + ms) / ds), 0, nmax)
                : 0;
    }
}

/* ---- Q4_K ---------------------------------------------------------------- */

/* The 256 4-bit levels of a Q4_K block, in element order. */
static void q4_K_levels(const block_q4_K *b, uint8_t q[QK_K])
{
    for (int p = 0; p < QK_K / 64; p++)
        for (int l = 0; l < 32; l++) {
            q[64 * p + l]      = b->qs[32 * p + l] & 0x0f;
            q[64 * p + 32 + l] = b->qs[32 * p + l] >> 4;
        }
}

static void q4_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_K *b = src;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        q4_K_levels(&b[i], q);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            k4_scale_min(b[i].scales, j, &sc, &m);
            const float ds = d * sc, ms = dmin * m;
            for (int l = 0; l < 32; l++)
                dst[32 * j + l] = ds * q[32 * j + l] - ms;
        }
    }
}

static void q4_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_K *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        k4_quantise(src, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int p = 0; p < QK_K / 64; p++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + 32 + l] << 4);
    }
}

static float q4_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q4_K_to_float, QK_K, sizeof(block_q4_K), w, x, n);
}

/* sum_j d sc_j (q . y)_j - dmin sum_j m_j sum(y)_j: the quants meet in
 * integers, and each sub-block's sum(y) comes from two Q8_K bsums. */
static float q4_K_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q4_K *a = w;
    const block_q8_K *b = x;
    uint8_t q[QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q4_K_levels(&a[i], q);
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, s = 0;
            k4_scale_min(a[i].scales, j, &sc, &m);
            for (int l = 0; l < 32; l++)
                s += q[32 * j + l] * b[i].qs[32 * j + l];
            sumi += sc * s;
            summ += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        const float d = fp16_to_fp32(a[i].d) * b[i].d;
        const float dmin = fp16_to_fp32(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}

/* ---- Q5_K ---------------------------------------------------------------- */

static void q5_K_levels(const block_q5_K *b, uint8_t q[QK_K])
{
    for (int p = 0; p < QK_K / 64; p++)
        for (int l = 0; l < 32; l++) {
            q[64 * p + l]      = (uint8_t)((b->qs[32 * p + l] & 0x0f) |
                                           ((b->qh[l] >> (2 * p)) & 1) << 4);
            q[64 * p + 32 + l] = (uint8_t)((b->qs[32 * p + l] >> 4) |
                                           ((b->qh[l] >> (2 * p + 1)) & 1) << 4);
        }
}

static void q5_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_K *b = src;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        q5_K_levels(&b[i], q);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            k4_scale_min(b[i].scales, j, &sc, &m);
            const float ds = d * sc, ms = dmin * m;
            for (int l = 0; l < 32; l++)
                dst[32 * j + l] = ds * q[32 * j + l] - ms;
        }
    }
}

static void q5_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_K *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        k4_quantise(src, 31, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int p = 0; p < QK_K / 64; p++)
            for (int l = 0; l < 32; l++) {
                const int lo = L[64 * p + l], hi = L[64 * p + 32 + l];
                b[i].qs[32 * p + l] = (uint8_t)((lo & 0x0f) | (hi & 0x0f) << 4);
                b[i].qh[l] |= (uint8_t)((lo >> 4) << (2 * p) | (hi >> 4) << (2 * p + 1));
            }
    }
}

static float q5_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q5_K_to_float, QK_K, sizeof(block_q5_K), w, x, n);
}

static float q5_K_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q5_K *a = w;
    const block_q8_K *b = x;
    uint8_t q[QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q5_K_levels(&a[i], q);
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, s = 0;
            k4_scale_min(a[i].scales, j, &sc, &m);
            for (int l = 0; l < 32; l++)
                s += q[32 * j + l] * b[i].qs[32 * j + l];
            sumi += sc * s;
            summ += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        const float d = fp16_to_fp32(a[i].d) * b[i].d;
        const float dmin = fp16_to_fp32(a[i].dmin) * b[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    return sum;
}

/* ---- Q6_K ---------------------------------------------------------------- */

/* The 256 signed levels (q - 32, in -32..31) of a Q6_K block. */
static void q6_K_levels(const block_q6_K *b, int8_t q[QK_K])
{
    for (int h = 0; h < QK_K / 128; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++)
            for (int g = 0; g < 4; g++) {
                int lo = (ql[l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0f;
                int hi = (qh[l] >> (2 * g)) & 3;
                q[128 * h + 32 * g + l] = (int8_t)((lo | hi << 4) - 32);
            }
    }
}

static void q6_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q6_K *b = src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = fp16_to_fp32(b[i].d);
        q6_K_levels(&b[i], q);
        for (int k = 0; k < QK_K; k++)
            dst[k] = d * b[i].scales[k / 16] * q[k];
    }
}

/* Fits x[0..n) ~ scale * l with l in -nmax..nmax-1.  The element of largest
 * magnitude sets the grid (it maps to -nmax, so d takes its sign); spacings
 * around it are tried and the least-squares scale of the best kept. */
float tensor__fit_scale_sym(const float *x, int n, int nmax)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (!(amax > 1e-15f))
        return 0.0f;
    float best_scale = max / -(float)nmax, best = -1.0f;
    for (int step = -9; step <= 9; step++) {
        const float iscale = -((float)nmax + 0.1f * (float)step) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(tensor__round_even(iscale * x[i]), -nmax, nmax - 1);
            sxl += x[i] * (float)l;
            sl2 += (float)(l * l);
        }
        /* squared error = sum x^2 - sxl^2 / sl2 at the best scale sxl / sl2 */
        if (sl2 > 0.0f && sxl * sxl / sl2 > best) {
            best = sxl * sxl / sl2;
            best_scale = sxl / sl2;
        }
    }
    return best_scale;
}

static void q6_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q6_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float sub[QK_K / 16], max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            sub[j] = tensor__fit_scale_sym(src + 16 * j, 16, 32);
            if (fabsf(sub[j]) > amax) {
                amax = fabsf(sub[j]);
                max_scale = sub[j];
            }
        }
        memset(&b[i], 0, sizeof b[i]);
        if (!(amax > 1e-15f))
            continue;                    /* all zero (levels 0 decode to 0) */
        /* The largest sub-block scale maps to -128, like the levels; the
         * others are taken relative to d as stored (see k4_quantise). */
        b[i].d = fp32_to_fp16(max_scale / -128.0f);
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK_K / 16; j++)
            b[i].scales[j] = (int8_t)(d != 0.0f
                ? clampi(tensor__round_even(sub[j] / d), -128, 127) : 0);

        uint8_t L[QK_K];
        for (int k = 0; k < QK_K; k++) {
            const float ds = d * b[i].scales[k / 16];
            L[k] = (uint8_t)(ds != 0.0f
                ? clampi(tensor__round_even(src[k] / ds), -32, 31) + 32 : 32);
        }
        for (int h = 0; h < QK_K / 128; h++) {
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l]      = (uint8_t)((Lh[l] & 0x0f) | (Lh[l + 64] & 0x0f) << 4);
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0x0f) | (Lh[l + 96] & 0x0f) << 4);
                qh[l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 |
                                  (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
            }
        }
    }
}

static float q6_K_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(q6_K_to_float, QK_K, sizeof(block_q6_K), w, x, n);
}

static float q6_K_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    int8_t q[QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q6_K_levels(&a[i], q);
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += q[16 * j + l] * b[i].qs[16 * j + l];
            sumi += a[i].scales[j] * s;
        }
        sum += fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return sum;
}

/* ---- Q8_K: x = d * q ------------------------------------------------------
 * As ggml: d = max / -127 where max is the element of largest magnitude
 * with its sign (so d is negative when that element is positive), levels
 * rounded half to even, and d stored in f32. */

static void q8_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K)
        for (int j = 0; j < QK_K; j++)
            dst[j] = b[i].d * b[i].qs[j];
}

static void q8_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        if (amax == 0.0f) {
            /* ggml leaves bsums unset here; zero is their true value */
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++)
            b[i].qs[j] = (int8_t)clampi(tensor__round_even(iscale * src[j]), -128, 127);
        for (int k = 0; k < QK_K / 16; k++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += b[i].qs[16 * k + l];
            b[i].bsums[k] = (int16_t)s;
        }
        b[i].d = 1.0f / iscale;
    }
}

/* ---- the entries -------------------------------------------------------- */

const tensor_traits tensor__ref_q4_K = {
    .name = "Q4_K", .block_size = QK_K, .block_bytes = sizeof(block_q4_K),
    .to_float = q4_K_to_float, .from_float = q4_K_from_float,
    .dot_f32 = q4_K_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = q4_K_vec_dot,
};
const tensor_traits tensor__ref_q5_K = {
    .name = "Q5_K", .block_size = QK_K, .block_bytes = sizeof(block_q5_K),
    .to_float = q5_K_to_float, .from_float = q5_K_from_float,
    .dot_f32 = q5_K_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = q5_K_vec_dot,
};
const tensor_traits tensor__ref_q6_K = {
    .name = "Q6_K", .block_size = QK_K, .block_bytes = sizeof(block_q6_K),
    .to_float = q6_K_to_float, .from_float = q6_K_from_float,
    .dot_f32 = q6_K_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = q6_K_vec_dot,
};
/* Activations only: no dot products with Q8_K weights. */
const tensor_traits tensor__ref_q8_K = {
    .name = "Q8_K", .block_size = QK_K, .block_bytes = sizeof(block_q8_K),
    .to_float = q8_K_to_float, .from_float = q8_K_from_float,
    .dot_f32 = NULL, .vec_dot_type = TT_Q8_K, .vec_dot = NULL,
};
