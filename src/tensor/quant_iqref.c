/* quant_iqref.c - reference (scalar) code of the table-valued 4-bit types:
 * IQ4_NL and MXFP4 (blocks of 32, dot products against Q8_0 activations)
 * and IQ4_XS (super-blocks of 256, against Q8_K), as llama.cpp pairs them.
 *
 * Layouts (bit-exact with GGUF/ggml; structs in types.h): each element is a
 * 4-bit index into a table of 16 small integers, element j of a 32-element
 * group in the low nibble of qs[j] and element j + 16 in the high nibble.
 *   IQ4_NL: x = d * iq4nl[q], d an f16.
 *   IQ4_XS: sub-block j (32 elements) has x = (d * (ls_j - 32)) * iq4nl[q],
 *           ls_j the 6-bit scale packed in scales_l / scales_h.
 *   MXFP4:  x = mxfp4[q] * 2^(e - 128).  The table holds the E2M1 values
 *           (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; index 8 is -0)
 *           doubled, so they are integers; halving the E8M0 scale 2^(e-127)
 *           makes up for it.  e = 255 (NaN in the OCP spec) reads as 2^127,
 *           as ggml does.
 *
 * The dequantisers evaluate ggml's expressions in ggml's order, so weights
 * decode to the f32 values llama.cpp's exact reference logits were made
 * from.  The dot products sum the integer products of a block exactly (for
 * IQ4_XS the whole super-block, scales included: at most 8 * 32 * 127 *
 * 128 * 32, far inside int32), then apply the float scales once per block.
 *
 * The quantisers are racimo's own, made for tests and synthetic models: a
 * small search over scales around the one that maps the element of largest
 * magnitude to the table's end, each refitted by least squares; MXFP4 takes
 * the smallest exponent whose range holds the block.  Their blocks decode
 * with any GGUF reader; they are not byte-identical to llama-quantize's
 * (which weighs by an importance matrix).
 *
 * Sections: tables and shared helpers; IQ4_NL; IQ4_XS; MXFP4; the entries.
 */
#include "tensor/quant_ref.h"

#include <math.h>

#include "tensor/fp16.h"

/* ---- tables and shared helpers ------------------------------------------ */

const int8_t tensor__iq4nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};
const int8_t tensor__mxfp4_values[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

/* The index of the entry of an ascending table t[0..len) nearest v, ties
 * to the lower index: the number of midpoints below v (a NaN gives 0).
 * Counted without branches, which the quantisers' searches are bound by. */
static int nearest_sorted(const int8_t *t, int len, float v)
{
    int k = 0;
    for (int i = 0; i + 1 < len; i++)
        k += v > 0.5f * (float)(t[i] + t[i + 1]);
    return k;
}

/* The index of the table entry nearest v * id (id = 1 / the scale), for
 * the IQ4_NL table (ascending) or the MXFP4 one (0..12 ascending, then
 * their negatives). */
static uint8_t nearest_index(const int8_t table[16], float v, float id)
{
    const float t = v * id;
    if (table == tensor__iq4nl_values)
        return (uint8_t)nearest_sorted(table, 16, t);
    const int k = nearest_sorted(table, 8, fabsf(t));
    return (uint8_t)(t < 0.0f && k ? k + 8 : k);
}

/* Fits x[0..n) ~ s * iq4nl[L] over s.  The element of largest magnitude
 * maps to -127 (or to 113, the other end) at the starting scales; spacings
 * around each are tried and refitted by least squares.  Returns s (0 for an
 * all-zero or non-finite block). */
static float fit_iq4(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (!(amax > 1e-30f) || !isfinite(amax))
        return 0.0f;
    float best_scale = max / -127.0f, best = -1.0f;
    for (int end = 0; end < 2; end++)
        for (int step = -4; step <= 4; step++) {
            const float id = ((end ? 113.0f : -127.0f) + 3.0f * (float)step) / max;
            float sxl = 0.0f, sl2 = 0.0f;
            for (int i = 0; i < n; i++) {
                const float l = (float)tensor__iq4nl_values[nearest_index(tensor__iq4nl_values, x[i], id)];
                sxl += x[i] * l;
                sl2 += l * l;
            }
            /* squared error = sum x^2 - sxl^2 / sl2 at the best scale */
            if (sl2 > 0.0f && sxl * sxl / sl2 > best) {
                best = sxl * sxl / sl2;
                best_scale = sxl / sl2;
            }
        }
    return best_scale;
}

/* Indices of x[0..32) against the scale d as stored, packed two a byte. */
static void pack_iq4(const float *x, float d, uint8_t qs[16])
{
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++) {
        const uint8_t lo = d != 0.0f ? nearest_index(tensor__iq4nl_values, x[j], id) : 8;
        const uint8_t hi = d != 0.0f ? nearest_index(tensor__iq4nl_values, x[j + 16], id) : 8;
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

/* Sum over a 32-element group of table[q] * y. */
static int dot_group(const int8_t table[16], const uint8_t qs[16], const int8_t *y)
{
    int s = 0;
    for (int j = 0; j < 16; j++) {
        s += table[qs[j] & 0x0f] * y[j];
        s += table[qs[j] >> 4] * y[j + 16];
    }
    return s;
}

/* IQ4_NL and MXFP4 share the shape of a block: a scale, then 16 bytes of
 * indices at its end.  Their decoders and dot products are these, given
 * the table and the scale's decoder.  x = scale * table[q] (ggml writes
 * MXFP4's as table[q] * scale: the same product). */
static float iq4_nl_scale(const uint8_t *blk)
{
    fp16_t d;
    memcpy(&d, blk, sizeof d);
    return fp16_to_fp32(d);
}

static float mxfp4_scale(const uint8_t *blk) { return tensor__e8m0_half(blk[0]); }

static void table32_to_float(const int8_t table[16], float (*scale)(const uint8_t *),
                             size_t block_bytes, const void *src, float *dst, int64_t n)
{
    const uint8_t *blk = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32, blk += block_bytes) {
        const float d = scale(blk);
        const uint8_t *qs = blk + block_bytes - 16;
        for (int j = 0; j < 16; j++) {
            dst[j] = d * table[qs[j] & 0x0f];
            dst[j + 16] = d * table[qs[j] >> 4];
        }
    }
}

/* Against Q8_0: the weight scale times the activation scale times the
 * block's integer sum. */
static float table32_vec_dot(const int8_t table[16], float (*scale)(const uint8_t *),
                             size_t block_bytes, const void *w, const void *x, int64_t n)
{
    const uint8_t *blk = w;
    const block_q8_0 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, blk += block_bytes) {
        const int sumi = dot_group(table, blk + block_bytes - 16, b[i].qs);
        sum += scale(blk) * fp16_to_fp32(b[i].d) * (float)sumi;
    }
    return sum;
}

/* ---- IQ4_NL -------------------------------------------------------------- */

static void iq4_nl_to_float(const void *src, float *dst, int64_t n)
{
    table32_to_float(tensor__iq4nl_values, iq4_nl_scale, sizeof(block_iq4_nl), src, dst, n);
}

static float iq4_nl_vec_dot(const void *w, const void *x, int64_t n)
{
    return table32_vec_dot(tensor__iq4nl_values, iq4_nl_scale, sizeof(block_iq4_nl), w, x, n);
}

static void iq4_nl_from_float(const float *src, void *dst, int64_t n)
{
    block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / QK4_NL; i++, src += QK4_NL) {
        b[i].d = fp32_to_fp16(fit_iq4(src, QK4_NL));
        pack_iq4(src, fp16_to_fp32(b[i].d), b[i].qs);
    }
}

static float iq4_nl_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(iq4_nl_to_float, QK4_NL, sizeof(block_iq4_nl), w, x, n);
}

/* ---- IQ4_XS -------------------------------------------------------------- */

int tensor__iq4_xs_scale(const block_iq4_xs *b, int j)
{
    return ((b->scales_l[j / 2] >> 4 * (j % 2)) & 0x0f) | ((b->scales_h >> 2 * j) & 3) << 4;
}

static void iq4_xs_to_float(const void *src, float *dst, int64_t n)
{
    const block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK_K / 32; j++, dst += 32) {
            const float dl = d * (float)(tensor__iq4_xs_scale(&b[i], j) - 32);
            const uint8_t *qs = b[i].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                dst[l] = dl * tensor__iq4nl_values[qs[l] & 0x0f];
                dst[l + 16] = dl * tensor__iq4nl_values[qs[l] >> 4];
            }
        }
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void iq4_xs_from_float(const float *src, void *dst, int64_t n)
{
    block_iq4_xs *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float sub[QK_K / 32], amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K / 32; j++) {
            sub[j] = fit_iq4(src + 32 * j, 32);
            if (fabsf(sub[j]) > amax) {
                amax = fabsf(sub[j]);
                max = sub[j];
            }
        }
        memset(&b[i], 0, sizeof b[i]);
        /* the largest sub-block scale maps to -32, the end of the 6-bit
         * range with the most room; the others are taken relative to d as
         * stored (see k4_quantise in quant_kref.c) */
        b[i].d = fp32_to_fp16(max / -32.0f);
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK_K / 32; j++) {
            const int ls = d != 0.0f ? clampi(tensor__round_even(sub[j] / d), -32, 31) + 32 : 32;
            b[i].scales_l[j / 2] |= (uint8_t)((ls & 0x0f) << 4 * (j % 2));
            b[i].scales_h |= (uint16_t)((ls >> 4) << 2 * j);
            pack_iq4(src + 32 * j, d * (float)(ls - 32), b[i].qs + 16 * j);
        }
    }
}

static float iq4_xs_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(iq4_xs_to_float, QK_K, sizeof(block_iq4_xs), w, x, n);
}

static float iq4_xs_vec_dot(const void *w, const void *x, int64_t n)
{
    const block_iq4_xs *a = w;
    const block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_K / 32; j++)
            sumi += (tensor__iq4_xs_scale(&a[i], j) - 32) *
                    dot_group(tensor__iq4nl_values, a[i].qs + 16 * j, b[i].qs + 32 * j);
        sum += fp16_to_fp32(a[i].d) * b[i].d * (float)sumi;
    }
    return sum;
}

/* ---- MXFP4 --------------------------------------------------------------- */

static void mxfp4_to_float(const void *src, float *dst, int64_t n)
{
    table32_to_float(tensor__mxfp4_values, mxfp4_scale, sizeof(block_mxfp4), src, dst, n);
}

static float mxfp4_vec_dot(const void *w, const void *x, int64_t n)
{
    return table32_vec_dot(tensor__mxfp4_values, mxfp4_scale, sizeof(block_mxfp4), w, x, n);
}

static void mxfp4_from_float(const float *src, void *dst, int64_t n)
{
    block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, src += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (fabsf(src[j]) > amax)
                amax = fabsf(src[j]);
        /* the smallest e with amax <= 12 * 2^(e - 128), so the largest
         * element fits the table's end (12, i.e. E2M1 6.0) */
        int e = 0;
        if (isfinite(amax) && amax > 0.0f)
            while (e < 255 && 12.0f * tensor__e8m0_half((uint8_t)e) < amax)
                e++;
        else if (!isfinite(amax))
            e = 255;
        b[i].e = (uint8_t)e;
        /* 1 / 2^-128 overflows: for e = 0 the elements are doubled first */
        const float pre = e ? 1.0f : 2.0f, id = e ? 1.0f / tensor__e8m0_half(b[i].e) : 0x1p127f;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            b[i].qs[j] = (uint8_t)(nearest_index(tensor__mxfp4_values, pre * src[j], id) |
                                   nearest_index(tensor__mxfp4_values, pre * src[j + 16], id) << 4);
    }
}

static float mxfp4_dot_f32(const void *w, const float *x, int64_t n)
{
    return tensor__dot_f32_blocks(mxfp4_to_float, QK_MXFP4, sizeof(block_mxfp4), w, x, n);
}

/* ---- the entries -------------------------------------------------------- */

const tensor_traits tensor__ref_iq4_nl = {
    .name = "IQ4_NL", .block_size = QK4_NL, .block_bytes = sizeof(block_iq4_nl),
    .to_float = iq4_nl_to_float, .from_float = iq4_nl_from_float,
    .dot_f32 = iq4_nl_dot_f32, .vec_dot_type = TT_Q8_0, .vec_dot = iq4_nl_vec_dot,
};
const tensor_traits tensor__ref_iq4_xs = {
    .name = "IQ4_XS", .block_size = QK_K, .block_bytes = sizeof(block_iq4_xs),
    .to_float = iq4_xs_to_float, .from_float = iq4_xs_from_float,
    .dot_f32 = iq4_xs_dot_f32, .vec_dot_type = TT_Q8_K, .vec_dot = iq4_xs_vec_dot,
};
const tensor_traits tensor__ref_mxfp4 = {
    .name = "MXFP4", .block_size = QK_MXFP4, .block_bytes = sizeof(block_mxfp4),
    .to_float = mxfp4_to_float, .from_float = mxfp4_from_float,
    .dot_f32 = mxfp4_dot_f32, .vec_dot_type = TT_Q8_0, .vec_dot = mxfp4_vec_dot,
};
