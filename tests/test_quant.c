/* test_quant.c - the tensor types (src/tensor/types.h): f16/bf16
 * conversion, exact decoding of hand-made blocks of every format, the
 * activation quantisers' rounding (which must match ggml's), quantiser round
 * trips within each format's error bound, dot products against float64, and
 * the type table.
 *
 * Expected values of hand-made blocks are written from the format
 * descriptions (and a few as literal numbers worked out by hand), not by
 * calling an encoder of the library.
 */
#include "test.h"

#include <ctype.h>
#include <float.h>

#include "base/rng.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

static const int weight_types[] = {
    TT_F32, TT_F16, TT_BF16, TT_Q4_0, TT_Q4_1, TT_Q5_0, TT_Q5_1, TT_Q8_0,
    TT_Q2_K, TT_Q3_K, TT_Q4_K, TT_Q5_K, TT_Q6_K,
    TT_IQ4_NL, TT_IQ4_XS, TT_MXFP4,
};
#define N_WEIGHT_TYPES (int)(sizeof weight_types / sizeof weight_types[0])

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

static void fill_normal(rng_state *r, float *x, int64_t n, float scale, float offset)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal(r) * scale + offset;
}

/* Bit-for-bit equality of decoded floats (so -0 and NaN payloads count). */
static void check_floats_exact(const float *got, const float *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (fp32_bits(got[i]) != fp32_bits(want[i]))
            FAIL("%s: element %d is %.9g (0x%08x), expected %.9g (0x%08x)", what, i,
                 got[i], fp32_bits(got[i]), want[i], fp32_bits(want[i]));
}

static void decode(int type, const void *src, float *dst, int64_t n)
{
    tensor_type_traits_ref(type)->to_float(src, dst, n);
}

/* ---- f16 / bf16 ---------------------------------------------------------- */

/* An f16 bit pattern's value computed in double, independently of fp16.h. */
static double f16_value(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return (h & 0x8000) ? -v : v;
}

TEST(quant_fp16_exhaustive_roundtrip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_fp32((uint16_t)h);
        int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 31) {
            if (man) {
                CHECK(isnan(f));
                uint16_t back = fp32_to_fp16(f);
                CHECK((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
            } else {
                CHECK(isinf(f));
                CHECK_INT(fp32_to_fp16(f), ==, h);
            }
            continue;
        }
        if ((double)f != f16_value((uint16_t)h))
            FAIL("f16 0x%04x decodes to %.9g, expected %.9g", h, f, f16_value((uint16_t)h));
        if (fp32_to_fp16(f) != h)
            FAIL("f16 0x%04x -> %.9g -> 0x%04x", h, f, fp32_to_fp16(f));
    }
}

TEST(quant_fp16_rounding)
{
    /* every pair of neighbouring finite f16 values: the midpoint goes to
     * the even one, anything off the midpoint to the nearer one */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float lo = fp16_to_fp32((uint16_t)h), hi = fp16_to_fp32((uint16_t)(h + 1));
        float mid = (lo + hi) / 2;               /* exact in f32 */
        uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        if (fp32_to_fp16(mid) != even || fp32_to_fp16(-mid) != (even | 0x8000))
            FAIL("tie between 0x%04x and 0x%04x rounds to 0x%04x", h, h + 1, fp32_to_fp16(mid));
        CHECK_INT(fp32_to_fp16(nextafterf(mid, INFINITY)), ==, h + 1);
        CHECK_INT(fp32_to_fp16(nextafterf(mid, 0.0f)), ==, h);
    }
    /* overflow: 65520 is the midpoint between 65504 and the next step */
    CHECK_INT(fp32_to_fp16(65504.0f), ==, 0x7bff);
    CHECK_INT(fp32_to_fp16(nextafterf(65520.0f, 0.0f)), ==, 0x7bff);
    CHECK_INT(fp32_to_fp16(65520.0f), ==, 0x7c00);
    CHECK_INT(fp32_to_fp16(-65520.0f), ==, 0xfc00);
    CHECK_INT(fp32_to_fp16(1e10f), ==, 0x7c00);
    CHECK_INT(fp32_to_fp16(FLT_MAX), ==, 0x7c00);
    CHECK_INT(fp32_to_fp16(INFINITY), ==, 0x7c00);
    CHECK_INT(fp32_to_fp16(-INFINITY), ==, 0xfc00);
    /* underflow: half the smallest subnormal ties to zero */
    CHECK_INT(fp32_to_fp16(ldexpf(1.0f, -25)), ==, 0);
    CHECK_INT(fp32_to_fp16(nextafterf(ldexpf(1.0f, -25), 1.0f)), ==, 1);
    CHECK_INT(fp32_to_fp16(1e-30f), ==, 0);
    CHECK_INT(fp32_to_fp16(-1e-30f), ==, 0x8000);
    CHECK_INT(fp32_to_fp16(-0.0f), ==, 0x8000);
    CHECK_INT(fp32_to_fp16(FLT_TRUE_MIN), ==, 0);
    uint16_t nan = fp32_to_fp16(NAN);
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
}

TEST(quant_bf16_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_fp32((uint16_t)h);
        CHECK_INT(fp32_bits(f), ==, h << 16);
        uint16_t back = fp32_to_bf16(f);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {     /* NaN stays a quiet NaN */
            CHECK((back & 0x7f80) == 0x7f80 && (back & 0x40) != 0);
            continue;
        }
        if (back != h)
            FAIL("bf16 0x%04x -> %.9g -> 0x%04x", h, f, back);
        /* ties to even; just off the tie goes to the nearer value */
        if ((h & 0x7fff) < 0x7f7f) {
            uint32_t mid = h << 16 | 0x8000;
            uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
            CHECK_INT(fp32_to_bf16(fp32_from_bits(mid)), ==, even);
            CHECK_INT(fp32_to_bf16(fp32_from_bits(mid + 1)), ==, h + 1);
            CHECK_INT(fp32_to_bf16(fp32_from_bits(mid - 1)), ==, h);
        }
    }
    CHECK_INT(fp32_to_bf16(FLT_MAX), ==, 0x7f80);      /* overflows to Inf */
    CHECK_INT(fp32_to_bf16(-FLT_MAX), ==, 0xff80);
    CHECK_INT(fp32_to_bf16(fp32_from_bits(0x7f7f7fffu)), ==, 0x7f7f);
    CHECK_INT(fp32_to_bf16(INFINITY), ==, 0x7f80);
    uint16_t snan = fp32_to_bf16(fp32_from_bits(0x7f800001u));   /* not Inf */
    CHECK((snan & 0x7f80) == 0x7f80 && (snan & 0x7f) != 0);
}

/* ---- the type table ------------------------------------------------------ */

TEST(quant_table)
{
    static const struct { int type; const char *name; int64_t bs; size_t bytes; } known[] = {
        {TT_F32, "F32", 1, 4},          {TT_F16, "F16", 1, 2},
        {TT_Q4_0, "Q4_0", 32, 18},      {TT_Q4_1, "Q4_1", 32, 20},
        {TT_Q5_0, "Q5_0", 32, 22},      {TT_Q5_1, "Q5_1", 32, 24},
        {TT_Q8_0, "Q8_0", 32, 34},      {TT_Q8_1, "Q8_1", 32, 36},
        {TT_Q2_K, "Q2_K", 256, 84},     {TT_Q3_K, "Q3_K", 256, 110},
        {TT_Q4_K, "Q4_K", 256, 144},    {TT_Q5_K, "Q5_K", 256, 176},
        {TT_Q6_K, "Q6_K", 256, 210},    {TT_Q8_K, "Q8_K", 256, 292},
        {TT_IQ2_XXS, "IQ2_XXS", 256, 66}, {TT_IQ2_XS, "IQ2_XS", 256, 74},
        {TT_IQ3_XXS, "IQ3_XXS", 256, 98}, {TT_IQ1_S, "IQ1_S", 256, 50},
        {TT_IQ4_NL, "IQ4_NL", 32, 18},  {TT_IQ3_S, "IQ3_S", 256, 110},
        {TT_IQ2_S, "IQ2_S", 256, 82},   {TT_IQ4_XS, "IQ4_XS", 256, 136},
        {TT_I8, "I8", 1, 1},            {TT_I16, "I16", 1, 2},
        {TT_I32, "I32", 1, 4},          {TT_I64, "I64", 1, 8},
        {TT_F64, "F64", 1, 8},          {TT_IQ1_M, "IQ1_M", 256, 56},
        {TT_BF16, "BF16", 1, 2},        {TT_TQ1_0, "TQ1_0", 256, 54},
        {TT_TQ2_0, "TQ2_0", 256, 66},   {TT_MXFP4, "MXFP4", 32, 17},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        const tensor_traits *t = tensor_type_traits(known[k].type);
        CHECK(t != NULL);
        CHECK_STR(t->name, known[k].name);
        CHECK_STR(tensor_type_name(known[k].type), known[k].name);
        CHECK_INT(t->block_size, ==, known[k].bs);
        CHECK_INT(t->block_bytes, ==, known[k].bytes);
        CHECK_INT(tensor_type_from_name(known[k].name), ==, known[k].type);
        char lower[16];
        size_t i = 0;
        for (; known[k].name[i] && i + 1 < sizeof lower; i++)
            lower[i] = (char)tolower((unsigned char)known[k].name[i]);
        lower[i] = 0;
        CHECK_INT(tensor_type_from_name(lower), ==, known[k].type);
        CHECK_INT(tensor_row_bytes(known[k].type, 4 * known[k].bs), ==, 4 * known[k].bytes);
    }
    /* the block structs are the table's sizes */
    CHECK_INT(tensor_type_traits(TT_Q4_0)->block_bytes, ==, sizeof(block_q4_0));
    CHECK_INT(tensor_type_traits(TT_Q4_1)->block_bytes, ==, sizeof(block_q4_1));
    CHECK_INT(tensor_type_traits(TT_Q5_0)->block_bytes, ==, sizeof(block_q5_0));
    CHECK_INT(tensor_type_traits(TT_Q5_1)->block_bytes, ==, sizeof(block_q5_1));
    CHECK_INT(tensor_type_traits(TT_Q8_0)->block_bytes, ==, sizeof(block_q8_0));
    CHECK_INT(tensor_type_traits(TT_Q8_1)->block_bytes, ==, sizeof(block_q8_1));
    CHECK_INT(tensor_type_traits(TT_Q2_K)->block_bytes, ==, sizeof(block_q2_K));
    CHECK_INT(tensor_type_traits(TT_Q3_K)->block_bytes, ==, sizeof(block_q3_K));
    CHECK_INT(tensor_type_traits(TT_Q4_K)->block_bytes, ==, sizeof(block_q4_K));
    CHECK_INT(tensor_type_traits(TT_Q5_K)->block_bytes, ==, sizeof(block_q5_K));
    CHECK_INT(tensor_type_traits(TT_Q6_K)->block_bytes, ==, sizeof(block_q6_K));
    CHECK_INT(tensor_type_traits(TT_Q8_K)->block_bytes, ==, sizeof(block_q8_K));
    CHECK_INT(tensor_type_traits(TT_IQ4_NL)->block_bytes, ==, sizeof(block_iq4_nl));
    CHECK_INT(tensor_type_traits(TT_IQ4_XS)->block_bytes, ==, sizeof(block_iq4_xs));
    CHECK_INT(tensor_type_traits(TT_MXFP4)->block_bytes, ==, sizeof(block_mxfp4));

    /* which types have code, and their activation types (llama.cpp's) */
    static const int vec_dot_type[][2] = {
        {TT_F32, TT_F32}, {TT_F16, TT_F16}, {TT_BF16, TT_BF16},
        {TT_Q4_0, TT_Q8_0}, {TT_Q4_1, TT_Q8_1}, {TT_Q5_0, TT_Q8_0},
        {TT_Q5_1, TT_Q8_1}, {TT_Q8_0, TT_Q8_0}, {TT_Q2_K, TT_Q8_K},
        {TT_Q3_K, TT_Q8_K}, {TT_Q4_K, TT_Q8_K}, {TT_Q5_K, TT_Q8_K},
        {TT_Q6_K, TT_Q8_K},
        {TT_IQ4_NL, TT_Q8_0}, {TT_IQ4_XS, TT_Q8_K}, {TT_MXFP4, TT_Q8_0},
    };
    int n_supported = 0;
    for (int t = 0; t < TT_COUNT; t++) {
        const tensor_traits *tt = tensor_type_traits(t);
        CHECK(tt != NULL && tt->name != NULL);
        CHECK(tensor_type_traits_ref(t) != NULL);
        CHECK_INT(tensor_type_from_name(tt->name), ==, t);
        n_supported += tensor_type_supported(t);
        if (tensor_type_supported(t)) {
            CHECK(tt->to_float && tt->from_float && tt->dot_f32 && tt->vec_dot);
            CHECK(tensor_type_traits(tt->vec_dot_type)->from_float != NULL);
        }
    }
    CHECK_INT(n_supported, ==, (int)(sizeof vec_dot_type / sizeof vec_dot_type[0]));
    for (size_t k = 0; k < sizeof vec_dot_type / sizeof vec_dot_type[0]; k++) {
        CHECK(tensor_type_supported(vec_dot_type[k][0]));
        CHECK_INT(tensor_type_traits(vec_dot_type[k][0])->vec_dot_type, ==, vec_dot_type[k][1]);
    }
    /* activation-only formats decode and encode but are no weights */
    CHECK(!tensor_type_supported(TT_Q8_1) && !tensor_type_supported(TT_Q8_K));
    CHECK(tensor_type_traits(TT_Q8_1)->to_float && tensor_type_traits(TT_Q8_1)->from_float);
    CHECK(tensor_type_traits(TT_Q8_K)->to_float && tensor_type_traits(TT_Q8_K)->from_float);
    CHECK(!tensor_type_supported(TT_IQ2_XXS) && tensor_type_traits(TT_IQ2_XXS)->to_float == NULL);

    /* numbers ggml removed, and numbers outside the table */
    CHECK_INT(tensor_type_traits(4)->block_size, ==, 0);
    CHECK_INT(tensor_type_traits(33)->block_size, ==, 0);
    CHECK_INT(tensor_row_bytes(4, 32), ==, 0);
    CHECK(!tensor_type_supported(4));
    CHECK(tensor_type_traits(-1) == NULL && tensor_type_traits(TT_COUNT) == NULL);
    CHECK(tensor_type_traits_ref(-1) == NULL && tensor_type_traits_ref(TT_COUNT) == NULL);
    CHECK(!tensor_type_supported(-1) && !tensor_type_supported(TT_COUNT));
    CHECK_STR(tensor_type_name(77), "type 77");
    CHECK_STR(tensor_type_name(-1), "type -1");

    CHECK_INT(tensor_type_from_name("q4_k"), ==, TT_Q4_K);
    CHECK_INT(tensor_type_from_name("bF16"), ==, TT_BF16);
    CHECK_INT(tensor_type_from_name("Q4"), ==, -1);
    CHECK_INT(tensor_type_from_name("Q4_K_M"), ==, -1);
    CHECK_INT(tensor_type_from_name(""), ==, -1);
    CHECK_INT(tensor_type_from_name(NULL), ==, -1);

    CHECK_INT(tensor_row_bytes(TT_Q4_K, 4096), ==, 16 * 144);
    CHECK_INT(tensor_row_bytes(TT_Q4_K, 4000), ==, 0);
    CHECK_INT(tensor_row_bytes(TT_Q4_0, 33), ==, 0);
    CHECK_INT(tensor_row_bytes(TT_F32, 3), ==, 12);
    CHECK_INT(tensor_row_bytes(TT_F32, -4), ==, 0);
    CHECK_INT(tensor_row_bytes(TT_F32, INT64_MAX), ==, 0);      /* overflow */
    CHECK_INT(tensor_row_bytes(-1, 32), ==, 0);
    CHECK_INT(tensor_row_bytes(TT_COUNT, 32), ==, 0);
}

TEST(quant_kernels_table)
{
    /* before tensor_kernels_init the active table is the reference one */
    for (int t = 0; t < TT_COUNT; t++)
        CHECK(tensor_type_traits(t) == tensor_type_traits_ref(t));
    tensor_kernels_init();
    for (int t = 0; t < TT_COUNT; t++) {
        const tensor_traits *a = tensor_type_traits(t), *r = tensor_type_traits_ref(t);
        CHECK(a != r);
        CHECK_STR(a->name, r->name);
        CHECK_INT(a->block_size, ==, r->block_size);
        CHECK_INT(a->block_bytes, ==, r->block_bytes);
        CHECK_INT(a->vec_dot_type, ==, r->vec_dot_type);
        CHECK(!a->to_float == !r->to_float && !a->from_float == !r->from_float);
        CHECK(!a->dot_f32 == !r->dot_f32 && !a->vec_dot == !r->vec_dot);
    }
}

/* ---- exact decoding of hand-made blocks ---------------------------------- */

TEST(quant_dequant_float_types)
{
    const float f32[4] = {1.5f, -0.0f, FLT_TRUE_MIN, -INFINITY};
    float out[8];
    decode(TT_F32, f32, out, 4);
    check_floats_exact(out, f32, 4, "F32");

    const uint16_t h[8] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x7c00, 0x03ff, 0x3555};
    const float hv[8] = {1.0f, -2.0f, 5.9604644775390625e-8f, 65504.0f, -0.0f,
                         INFINITY, 6.0975551605224609375e-5f, 0.333251953125f};
    decode(TT_F16, h, out, 8);
    check_floats_exact(out, hv, 8, "F16");

    const uint16_t b[6] = {0x3f80, 0xc040, 0x0001, 0x7f7f, 0xff80, 0x3eab};
    const float bv[6] = {1.0f, -3.0f, fp32_from_bits(0x00010000u), 3.38953139e38f,
                         -INFINITY, 0.333984375f};
    decode(TT_BF16, b, out, 6);
    check_floats_exact(out, bv, 6, "BF16");
}

/* qs pattern of the 32-element blocks: byte j = j | (15 - j) << 4 */
static uint8_t nib_byte(int j) { return (uint8_t)(j | (15 - j) << 4); }
static int nib_of(int e) { return e < 16 ? e : 15 - (e - 16); }

TEST(quant_dequant_q4_0_q4_1)
{
    block_q4_0 b0 = {.d = 0x3800};                        /* d = 0.5 */
    block_q4_1 b1 = {.d = 0x3400, .m = 0xbe00};           /* d = 0.25, m = -1.5 */
    for (int j = 0; j < 16; j++)
        b0.qs[j] = b1.qs[j] = nib_byte(j);
    float out[32], want[32];
    for (int e = 0; e < 32; e++)
        want[e] = (float)(nib_of(e) - 8) * 0.5f;
    decode(TT_Q4_0, &b0, out, 32);
    check_floats_exact(out, want, 32, "Q4_0");
    CHECK(out[0] == -4.0f && out[15] == 3.5f && out[16] == 3.5f && out[31] == -4.0f);

    for (int e = 0; e < 32; e++)
        want[e] = (float)nib_of(e) * 0.25f - 1.5f;
    decode(TT_Q4_1, &b1, out, 32);
    check_floats_exact(out, want, 32, "Q4_1");
    CHECK(out[0] == -1.5f && out[16] == 2.25f);

    /* a d that is no power of two: x = (q - 8) * d in f32 */
    b0.d = 0x3555;
    const float d = 0.333251953125f;
    for (int e = 0; e < 32; e++)
        want[e] = (float)(nib_of(e) - 8) * d;
    decode(TT_Q4_0, &b0, out, 32);
    check_floats_exact(out, want, 32, "Q4_0 odd d");
}

TEST(quant_dequant_q5_0_q5_1)
{
    /* fifth bits: qh = 0x80F0F001 (little-endian bytes) */
    const uint8_t qh[4] = {0x01, 0xf0, 0xf0, 0x80};
    const uint32_t qhv = 0x80f0f001u;
    block_q5_0 b0 = {.d = 0x3800};                        /* d = 0.5 */
    block_q5_1 b1 = {.d = 0x3400, .m = 0xbe00};           /* d = 0.25, m = -1.5 */
    memcpy(b0.qh, qh, 4);
    memcpy(b1.qh, qh, 4);
    for (int j = 0; j < 16; j++)
        b0.qs[j] = b1.qs[j] = nib_byte(j);
    float out[32], want[32];
    for (int e = 0; e < 32; e++)
        want[e] = (float)((nib_of(e) | (int)((qhv >> e) & 1) << 4) - 16) * 0.5f;
    decode(TT_Q5_0, &b0, out, 32);
    check_floats_exact(out, want, 32, "Q5_0");
    /* by hand: e0 = (0|16)-16 = 0; e1 = 1-16; e12 = (12|16)-16; e20 = (11|16)-16 */
    CHECK(out[0] == 0.0f && out[1] == -7.5f && out[12] == 6.0f && out[20] == 5.5f);
    CHECK(out[31] == 0.0f && out[30] == -7.5f);

    for (int e = 0; e < 32; e++)
        want[e] = (float)(nib_of(e) | (int)((qhv >> e) & 1) << 4) * 0.25f - 1.5f;
    decode(TT_Q5_1, &b1, out, 32);
    check_floats_exact(out, want, 32, "Q5_1");
    CHECK(out[12] == 5.5f && out[1] == -1.25f);
}

TEST(quant_dequant_q8_0_q8_1)
{
    block_q8_0 b0 = {.d = 0x3000};                        /* d = 0.125 */
    block_q8_1 b1 = {.d = 0x3000, .s = 0x7bff};           /* s plays no part */
    float out[32], want[32];
    for (int j = 0; j < 32; j++) {
        b0.qs[j] = b1.qs[j] = (int8_t)(j * 8 - 128);
        want[j] = (float)(j * 8 - 128) * 0.125f;
    }
    decode(TT_Q8_0, &b0, out, 32);
    check_floats_exact(out, want, 32, "Q8_0");
    CHECK(out[0] == -16.0f && out[31] == 15.0f);
    decode(TT_Q8_1, &b1, out, 32);
    check_floats_exact(out, want, 32, "Q8_1");
}

/* Sub-block scales and mins of the hand-made Q4_K/Q5_K blocks, and their 12
 * packed bytes worked out by hand:
 *   sc = 1 7 33 63 | 5 17 48 62     m = 0 63 2 40 | 21 9 63 16
 *   bytes 0-3: sc[0..3] | (sc[4..7] >> 4) << 6 = 01 47 e1 ff
 *   bytes 4-7: m[0..3]  | (m[4..7] >> 4) << 6  = 40 3f c2 68
 *   bytes 8-11: (sc[4..7] & 15) | (m[4..7] & 15) << 4 = 55 91 f0 0e */
static const int k_sc[8] = {1, 7, 33, 63, 5, 17, 48, 62};
static const int k_m[8] = {0, 63, 2, 40, 21, 9, 63, 16};
static const uint8_t k_packed[12] = {0x01, 0x47, 0xe1, 0xff, 0x40, 0x3f,
                                     0xc2, 0x68, 0x55, 0x91, 0xf0, 0x0e};

static uint8_t k_qs(int k) { return (uint8_t)(k * 37 + 11); }
static uint8_t k_qh(int k) { return (uint8_t)(k * 73 + 5); }

/* the 4-bit level of element e of a Q4_K/Q5_K block */
static int k4_nibble(const uint8_t *qs, int e)
{
    int p = e / 64, r = e % 64;
    return r < 32 ? qs[32 * p + r] & 0x0f : qs[32 * p + r - 32] >> 4;
}

TEST(quant_dequant_q4_K)
{
    block_q4_K b = {.d = 0x3800, .dmin = 0x3400};         /* 0.5, 0.25 */
    memcpy(b.scales, k_packed, 12);
    for (int k = 0; k < QK_K / 2; k++)
        b.qs[k] = k_qs(k);
    float out[QK_K], want[QK_K];
    for (int e = 0; e < QK_K; e++)
        want[e] = (0.5f * (float)k_sc[e / 32]) * (float)k4_nibble(b.qs, e)
                - 0.25f * (float)k_m[e / 32];
    decode(TT_Q4_K, &b, out, QK_K);
    check_floats_exact(out, want, QK_K, "Q4_K");
    /* by hand: e200 is sub-block 6 (sc 48, m 63), low nibble of qs[104] =
     * 0x13 -> 3: 24 * 3 - 15.75; e40 is sub-block 1 (sc 7, m 63), high
     * nibble of qs[8] = 0x33 -> 3: 3.5 * 3 - 15.75 */
    CHECK(out[200] == 56.25f);
    CHECK(out[40] == -5.25f);

    /* an odd d, and a second super-block after the first */
    block_q4_K two[2] = {b, b};
    two[1].d = 0x3555;
    two[1].dmin = 0x2e66;
    const float d = fp16_to_fp32(0x3555), dmin = fp16_to_fp32(0x2e66);
    float out2[2 * QK_K];
    decode(TT_Q4_K, two, out2, 2 * QK_K);
    check_floats_exact(out2, want, QK_K, "Q4_K block 0 of 2");
    for (int e = 0; e < QK_K; e++)
        want[e] = (d * (float)k_sc[e / 32]) * (float)k4_nibble(b.qs, e) - dmin * (float)k_m[e / 32];
    check_floats_exact(out2 + QK_K, want, QK_K, "Q4_K block 1 of 2");
}

TEST(quant_dequant_q5_K)
{
    block_q5_K b = {.d = 0x3800, .dmin = 0x3400};         /* 0.5, 0.25 */
    memcpy(b.scales, k_packed, 12);
    for (int k = 0; k < QK_K / 2; k++)
        b.qs[k] = k_qs(k);
    for (int k = 0; k < QK_K / 8; k++)
        b.qh[k] = k_qh(k);
    float out[QK_K], want[QK_K];
    for (int e = 0; e < QK_K; e++) {
        int q = k4_nibble(b.qs, e) | ((b.qh[e % 32] >> (e / 32)) & 1) << 4;
        want[e] = (0.5f * (float)k_sc[e / 32]) * (float)q - 0.25f * (float)k_m[e / 32];
    }
    decode(TT_Q5_K, &b, out, QK_K);
    check_floats_exact(out, want, QK_K, "Q5_K");
    /* by hand: e200 as in Q4_K plus bit 6 of qh[8] = 0x4d (set): 24 * 19 -
     * 15.75; e40 has bit 1 of qh[8] clear: as in Q4_K */
    CHECK(out[200] == 440.25f);
    CHECK(out[40] == -5.25f);
}

/* Q2_K and Q3_K share the 2-bit packing: element 128h + 32j + l at bits
 * 2j of qs[32h + l]; Q3_K's third bit is bit 4h + j of hmask[l] and its
 * 16 six-bit scales are packed as in tensor__q3_K_scales. */
TEST(quant_dequant_q2_K_q3_K)
{
    block_q2_K b2 = {.d = 0x3800, .dmin = 0x3400};       /* 0.5, 0.25 */
    block_q3_K b3 = {.d = 0x3800};
    for (int k = 0; k < QK_K / 4; k++)
        b2.qs[k] = b3.qs[k] = k_qs(k);
    for (int k = 0; k < QK_K / 16; k++)
        b2.scales[k] = (uint8_t)(k * 29 + 5);
    for (int k = 0; k < QK_K / 8; k++)
        b3.hmask[k] = k_qh(k);
    memcpy(b3.scales, k_packed, 12);
    float out[QK_K], want[QK_K];
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
        int q = (k_qs(32 * h + l) >> (2 * j)) & 3;
        want[e] = 0.5f * (float)(b2.scales[s] & 15) * (float)q - 0.25f * (float)(b2.scales[s] >> 4);
    }
    decode(TT_Q2_K, &b2, out, QK_K);
    check_floats_exact(out, want, QK_K, "Q2_K");
    /* by hand: e77 is h 0, j 2, l 13: bits 4-5 of qs[13] = 0xec -> 2,
     * scales[4] = 0x79: 0.5 * 9 * 2 - 0.25 * 7.  e255: bits 6-7 of
     * qs[63] = 0x26 -> 0, scales[15] = 0xb8: -0.25 * 11 */
    CHECK(out[77] == 7.25f);
    CHECK(out[255] == -2.75f);

    decode(TT_Q3_K, &b3, out, QK_K);
    /* e77: low bits 2 as above, bit 2 of hmask[13] = 0xba clear: q = -2;
     * scale 4: low nibble of byte 4 (0x40) 0, bits 2-3 of byte 8 (0x55) 1:
     * 16 - 32 = -16.  e250 (h 1, j 3, l 26): bits 6-7 of qs[58] = 0x6d ->
     * 1, bit 7 of hmask[26] = 0x6f clear: q = -3; scale 15: high nibble of
     * byte 7 (0x68) 6, bits 6-7 of byte 11 (0x0e) 0: 6 - 32 = -26 */
    CHECK(out[77] == 16.0f);
    CHECK(out[250] == 39.0f);
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
        int q = ((k_qs(32 * h + l) >> (2 * j)) & 3) - ((k_qh(l) >> (4 * h + j)) & 1 ? 0 : 4);
        int lo = s < 8 ? k_packed[s] & 15 : k_packed[s - 8] >> 4;
        int sc = (lo | ((k_packed[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
        want[e] = (0.5f * (float)sc) * (float)q;
    }
    check_floats_exact(out, want, QK_K, "Q3_K");
}

TEST(quant_dequant_q6_K)
{
    block_q6_K b = {.d = 0x3c00};                         /* d = 1 */
    for (int k = 0; k < QK_K / 2; k++)
        b.ql[k] = (uint8_t)(k * 29 + 3);
    for (int k = 0; k < QK_K / 4; k++)
        b.qh[k] = (uint8_t)(k * 53 + 7);
    for (int k = 0; k < QK_K / 16; k++)
        b.scales[k] = (int8_t)(k * 17 - 128);
    float out[QK_K], want[QK_K];
    for (int pass = 0; pass < 2; pass++) {
        const float d = fp16_to_fp32(b.d);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            int lo = (b.ql[64 * h + l + 32 * (g & 1)] >> (g < 2 ? 0 : 4)) & 0x0f;
            int hi = (b.qh[32 * h + l] >> (2 * g)) & 3;
            want[e] = (d * (float)b.scales[e / 16]) * (float)((lo | hi << 4) - 32);
        }
        decode(TT_Q6_K, &b, out, QK_K);
        check_floats_exact(out, want, QK_K, pass ? "Q6_K odd d" : "Q6_K");
        if (pass == 0) {
            /* by hand: e77 is g 2, l 13: high nibble of ql[13] = 0x7c -> 7,
             * bits 4-5 of qh[13] = 0xb8 -> 3: q = 55 - 32 = 23, scale
             * 4 * 17 - 128 = -60.  e255: h 1, g 3, l 31: high nibble of
             * ql[127] = 0x66 -> 6, bits 6-7 of qh[63] = 0x12 -> 0: q = 6 - 32
             * = -26, scale 127 */
            CHECK(out[77] == -1380.0f);
            CHECK(out[255] == -3302.0f);
        }
        b.d = 0x3555;
    }
}

/* IQ4_NL, IQ4_XS and MXFP4 with every index in both nibble positions; the
 * tables written out from the format descriptions. */
TEST(quant_dequant_iq4_mxfp4)
{
    static const float iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1, 13, 25, 38, 53, 69, 89, 113};
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6,
                                   0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    float out[QK_K], want[QK_K];

    block_iq4_nl nl = {.d = 0x3800};                      /* d = 0.5 */
    for (int j = 0; j < 16; j++)
        nl.qs[j] = nib_byte(j);
    for (int e = 0; e < 32; e++)
        want[e] = 0.5f * iq4nl[nib_of(e)];
    decode(TT_IQ4_NL, &nl, out, 32);
    check_floats_exact(out, want, 32, "IQ4_NL");
    CHECK(out[0] == -63.5f && out[15] == 56.5f && out[16] == 56.5f && out[31] == -63.5f);

    /* sub-block scales ls = 0, 31, 32, 33, 63, 16, 47, 1 (x = d (ls - 32) v),
     * packed by hand: low nibbles two a byte, top bits two per sub-block */
    block_iq4_xs xs = {.d = 0x3400, .scales_h = 0x27a4,  /* d = 0.25 */
                       .scales_l = {0xf0, 0x10, 0x0f, 0x1f}};
    static const int ls[8] = {0, 31, 32, 33, 63, 16, 47, 1};
    for (int k = 0; k < QK_K / 2; k++)
        xs.qs[k] = nib_byte(k % 16);
    for (int e = 0; e < QK_K; e++)
        want[e] = (0.25f * (float)(ls[e / 32] - 32)) * iq4nl[nib_of(e % 32)];
    decode(TT_IQ4_XS, &xs, out, QK_K);
    check_floats_exact(out, want, QK_K, "IQ4_XS");
    CHECK(out[0] == 8.0f * 127 && out[32 * 4 + 15] == 0.25f * 31 * 113);

    /* e = 127 is a scale of 1: the E2M1 values themselves */
    block_mxfp4 mx = {.e = 127};
    for (int j = 0; j < 16; j++)
        mx.qs[j] = nib_byte(j);
    for (int e = 0; e < 32; e++)
        want[e] = e2m1[nib_of(e)];
    decode(TT_MXFP4, &mx, out, 32);
    check_floats_exact(out, want, 32, "MXFP4");
    mx.e = 130;                                           /* 2^3 */
    decode(TT_MXFP4, &mx, out, 32);
    CHECK(out[7] == 48.0f && out[24] == 48.0f && out[16] == -48.0f && out[1] == 0.5f * 8);
    mx.e = 0;                                             /* 2^-127: subnormal */
    decode(TT_MXFP4, &mx, out, 32);
    CHECK(out[1] == ldexpf(1.0f, -128) && out[7] == 6.0f * ldexpf(1.0f, -127));
    mx.e = 1;
    decode(TT_MXFP4, &mx, out, 32);
    CHECK(out[2] == ldexpf(1.0f, -126));
}

TEST(quant_dequant_q8_K)
{
    block_q8_K b = {.d = -0.75f};
    float out[QK_K], want[QK_K];
    for (int j = 0; j < QK_K; j++) {
        b.qs[j] = (int8_t)(j - 128);
        want[j] = -0.75f * (float)(j - 128);
    }
    decode(TT_Q8_K, &b, out, QK_K);
    check_floats_exact(out, want, QK_K, "Q8_K");
}

/* ---- quantisers that must match ggml's reference exactly ----------------- */

TEST(quant_q8_activations_match_ggml)
{
    const tensor_traits *q80 = tensor_type_traits_ref(TT_Q8_0);
    const tensor_traits *q81 = tensor_type_traits_ref(TT_Q8_1);
    const tensor_traits *q8k = tensor_type_traits_ref(TT_Q8_K);
    float x[QK_K] = {0};

    /* Q8_0: d = amax / 127 (here exactly 1), q = x * (127 / amax) rounded
     * half to even (llama.cpp's x86 quantiser) */
    x[0] = 127.0f; x[1] = 2.5f; x[2] = -2.5f; x[3] = 0.5f; x[4] = -0.49f;
    x[5] = -127.0f; x[6] = 10.4f;
    block_q8_0 b0;
    q80->from_float(x, &b0, 32);
    CHECK_INT(b0.d, ==, 0x3c00);
    const int want0[7] = {127, 2, -2, 0, 0, -127, 10};
    for (int j = 0; j < 7; j++)
        CHECK_INT(b0.qs[j], ==, want0[j]);
    for (int j = 7; j < 32; j++)
        CHECK_INT(b0.qs[j], ==, 0);

    /* Q8_1: the same quants, and s = f16(sum(q) * d) */
    block_q8_1 b1;
    q81->from_float(x, &b1, 32);
    CHECK_INT(b1.d, ==, 0x3c00);
    CHECK(memcmp(b1.qs, b0.qs, 32) == 0);
    CHECK_INT(b1.s, ==, 0x4900);                       /* 10.0 */

    /* a d that rounds in f16: the quants use the f32 d */
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j - 13) * 0.1f;
        amax = fmaxf(amax, fabsf(x[j]));
    }
    q81->from_float(x, &b1, 32);
    const float d = amax / 127.0f, id = 127.0f / amax;
    CHECK_INT(b1.d, ==, fp32_to_fp16(d));
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        CHECK_INT(b1.qs[j], ==, (int)nearbyintf(x[j] * id));
        sum += b1.qs[j];
    }
    CHECK_INT(b1.s, ==, fp32_to_fp16((float)sum * d));

    /* Many random blocks, so that using the f16 d instead of the f32 one
     * (for the quants or for s) would show: count that it would. */
    rng_state r;
    rng_seed(&r, 5);
    int n_differ_q = 0, n_differ_s = 0;
    for (int blk = 0; blk < 500; blk++) {
        float amax_b = 0.0f;
        for (int j = 0; j < 32; j++) {
            x[j] = rng_normal(&r) + 0.3f;
            amax_b = fmaxf(amax_b, fabsf(x[j]));
        }
        q80->from_float(x, &b0, 32);
        q81->from_float(x, &b1, 32);
        const float db = amax_b / 127.0f, idb = 127.0f / amax_b;
        const float id16 = 1.0f / fp16_to_fp32(fp32_to_fp16(db));
        CHECK_INT(b0.d, ==, fp32_to_fp16(db));
        CHECK_INT(b1.d, ==, fp32_to_fp16(db));
        int sum_b = 0;
        for (int j = 0; j < 32; j++) {
            CHECK_INT(b0.qs[j], ==, (int)nearbyintf(x[j] * idb));
            CHECK_INT(b1.qs[j], ==, b0.qs[j]);
            n_differ_q += (int)nearbyintf(x[j] * id16) != b0.qs[j];
            sum_b += b1.qs[j];
        }
        CHECK_INT(b1.s, ==, fp32_to_fp16((float)sum_b * db));
        n_differ_s += fp32_to_fp16((float)sum_b * fp16_to_fp32(b1.d)) != b1.s;
    }
    CHECK(n_differ_q > 0 && n_differ_s > 0);

    /* Q8_K: the element of largest magnitude with its sign sets d =
     * max / -127 (negative here), quants round half to even */
    memset(x, 0, sizeof x);
    x[0] = 127.0f; x[1] = 2.5f; x[2] = 3.5f; x[3] = -0.5f; x[4] = 1.5f;
    x[20] = -126.5f; x[255] = 0.5f;
    block_q8_K bk[2];
    memset(bk, 0xab, sizeof bk);                       /* nothing left unset */
    float x2[2 * QK_K];
    memcpy(x2, x, sizeof x);
    for (int j = 0; j < QK_K; j++)
        x2[QK_K + j] = 0.0f;                           /* second block all zero */
    q8k->from_float(x2, bk, 2 * QK_K);
    CHECK(bk[0].d == -1.0f);
    const int wantk[5] = {-127, -2, -4, 0, -2};
    for (int j = 0; j < 5; j++)
        CHECK_INT(bk[0].qs[j], ==, wantk[j]);
    CHECK_INT(bk[0].qs[20], ==, 126);
    CHECK_INT(bk[0].qs[255], ==, 0);
    CHECK_INT(bk[0].bsums[0], ==, -127 - 2 - 4 - 2);
    CHECK_INT(bk[0].bsums[1], ==, 126);
    CHECK_INT(bk[0].bsums[15], ==, 0);
    CHECK(bk[1].d == 0.0f);
    for (int j = 0; j < QK_K; j++)
        CHECK_INT(bk[1].qs[j], ==, 0);
    for (int j = 0; j < QK_K / 16; j++)
        CHECK_INT(bk[1].bsums[j], ==, 0);

    /* a negative extreme gives a positive d */
    x[0] = -127.0f;
    q8k->from_float(x, bk, QK_K);
    CHECK(bk[0].d == 1.0f);
    CHECK_INT(bk[0].qs[0], ==, -127);
    CHECK_INT(bk[0].qs[1], ==, 2);
    CHECK_INT(bk[0].qs[20], ==, -126);
}

TEST(quant_legacy_quantisers_match_ggml)
{
    float x[32] = {0};
    /* Q4_0: d = max / -8 with the extreme's sign; q = (int)(x/d + 8.5) */
    x[0] = 4.0f; x[1] = -3.0f; x[2] = 1.0f; x[3] = 0.24f; x[17] = -4.0f;
    block_q4_0 b40;
    tensor_type_traits_ref(TT_Q4_0)->from_float(x, &b40, 32);
    CHECK_INT(b40.d, ==, 0xb800);                      /* -0.5 */
    CHECK_INT(b40.qs[0], ==, 0x80);                    /* 0 | 8 << 4 */
    CHECK_INT(b40.qs[1], ==, 0xfe);                    /* 14 | clamp(16.5) << 4 */
    CHECK_INT(b40.qs[2], ==, 0x86);
    CHECK_INT(b40.qs[3], ==, 0x88);

    /* Q4_1: d = (max - min) / 15, m = min, q = (int)((x - min)/d + 0.5) */
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f;
    x[0] = -1.0f; x[1] = 14.0f; x[2] = 0.5f; x[3] = 2.49f;
    block_q4_1 b41;
    tensor_type_traits_ref(TT_Q4_1)->from_float(x, &b41, 32);
    CHECK_INT(b41.d, ==, 0x3c00);
    CHECK_INT(b41.m, ==, 0xbc00);
    CHECK_INT(b41.qs[0], ==, 0x10);                    /* 0 | 1 << 4 */
    CHECK_INT(b41.qs[1], ==, 0x1f);
    CHECK_INT(b41.qs[2], ==, 0x12);                    /* 1.5 + 0.5 -> 2 */
    CHECK_INT(b41.qs[3], ==, 0x13);

    /* Q5_0: d = max / -16; the fifth bit goes to qh */
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f;
    x[0] = -16.0f; x[1] = 15.5f; x[2] = 3.0f; x[16] = -1.0f;
    block_q5_0 b50;
    tensor_type_traits_ref(TT_Q5_0)->from_float(x, &b50, 32);
    CHECK_INT(b50.d, ==, 0x3c00);
    CHECK_INT(b50.qs[0], ==, 0xf0);                    /* 0 | (15 & 15) << 4 */
    CHECK_INT(b50.qs[1], ==, 0x0f);                    /* 31 & 15 | 16 & 15 */
    CHECK_INT(b50.qs[2], ==, 0x03);                    /* 19 & 15 */
    /* qh: e0 0, e1 1, e2 1, e3..15 (16) 1, e16 (15) 0, e17.. (16) 1 */
    uint32_t qh = (uint32_t)b50.qh[0] | (uint32_t)b50.qh[1] << 8 |
                  (uint32_t)b50.qh[2] << 16 | (uint32_t)b50.qh[3] << 24;
    CHECK_INT(qh, ==, 0xfffefffeu);

    /* Q5_1 */
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f;
    x[1] = 31.0f; x[2] = 0.5f; x[3] = 17.0f;
    block_q5_1 b51;
    tensor_type_traits_ref(TT_Q5_1)->from_float(x, &b51, 32);
    CHECK_INT(b51.d, ==, 0x3c00);
    CHECK_INT(b51.m, ==, 0x0000);
    CHECK_INT(b51.qs[1], ==, 0x0f);
    CHECK_INT(b51.qs[2], ==, 0x01);
    CHECK_INT(b51.qs[3], ==, 0x01);
    CHECK_INT(b51.qh[0], ==, 0x0a);                    /* bits 1 and 3 */
}

/* ---- round trips ----------------------------------------------------------
 * Error bounds per element, from each format's construction:
 *   F16 / BF16: half an ulp, 2^-11 / 2^-8 relative (2^-25 absolute near 0);
 *   Q8_0, Q8_1: d/2 plus the f16 rounding of d over 127 levels; Q8_K: d/2;
 *   Q4_0, Q5_0: one step d (the side opposite the extreme is clipped);
 *   Q4_1, Q5_1: d/2 plus the f16 roundings of d and m;
 *   K-quants: no closed bound (searched scales); measured limits of the
 *   worst element and of the RMS error per super-block, with margin. */

static int64_t type_block(int type) { return tensor_type_traits_ref(type)->block_size; }

static void check_roundtrip_with(const tensor_traits *t, int type, const float *x,
                                 int64_t n, const char *what)
{
    const int64_t bs = type_block(type) > 1 ? type_block(type) : 1;
    void *q = xmalloc(tensor_row_bytes(type, n));
    float *y = xmalloc((size_t)n * sizeof(float));
    t->from_float(x, q, n);
    t->to_float(q, y, n);
    for (int64_t b0 = 0; b0 < n; b0 += bs) {
        double amax = 0, lo = x[b0], hi = x[b0], se = 0, sx = 0, emax = 0;
        for (int64_t i = b0; i < b0 + bs; i++) {
            if (!isfinite(y[i]))
                FAIL("%s %s: element %lld decodes to %g", t->name, what, (long long)i, y[i]);
            double e = fabs((double)y[i] - x[i]);
            amax = fmax(amax, fabs(x[i]));
            lo = fmin(lo, x[i]);
            hi = fmax(hi, x[i]);
            se += e * e;
            sx += (double)x[i] * x[i];
            emax = fmax(emax, e);
        }
        double bound = 0, rms_bound = -1;
        switch (type) {
        case TT_F32: bound = 0; break;
        case TT_F16: bound = fabs(x[b0]) * 0x1p-11 + 0x1p-25; break;
        case TT_BF16: bound = fabs(x[b0]) * 0x1p-8 + 1e-38; break;
        case TT_Q8_0: case TT_Q8_1: bound = 0.57 * amax / 127; break;
        case TT_Q8_K: bound = 0.501 * amax / 127; break;
        case TT_Q4_0: bound = 1.01 * amax / 8; break;
        case TT_Q5_0: bound = 1.01 * amax / 16; break;
        case TT_Q4_1: bound = 0.51 * (hi - lo) / 15 + fabs(lo) * 0x1p-11 + 0x1p-24; break;
        case TT_Q5_1: bound = 0.52 * (hi - lo) / 31 + fabs(lo) * 0x1p-11 + 0x1p-24; break;
        case TT_Q2_K: bound = 0.5 * amax; rms_bound = 0.36; break;
        case TT_Q3_K: bound = 0.3 * amax; rms_bound = 0.2; break;
        case TT_Q4_K: bound = 0.16 * amax; rms_bound = 0.10; break;
        case TT_Q5_K: bound = 0.085 * amax; rms_bound = 0.055; break;
        case TT_Q6_K: bound = 0.04 * amax; rms_bound = 0.028; break;
        /* the scale search minimises squared error, which may stretch the
         * widest gap of the table (24 of 127) past half a step */
        case TT_IQ4_NL: bound = 0.14 * amax; break;
        case TT_IQ4_XS: bound = 0.16 * amax; rms_bound = 0.10; break;
        case TT_MXFP4: bound = 0.34 * amax; break;
        default: FAIL("no bound for type %d", type);
        }
        if (emax > bound)
            FAIL("%s %s: block at %lld: error %.3g > bound %.3g (amax %.3g)", t->name,
                 what, (long long)b0, emax, bound, amax);
        if (rms_bound > 0 && sx > 0 && sqrt(se / sx) > rms_bound)
            FAIL("%s %s: block at %lld: rms error %.4f > %.4f", t->name, what,
                 (long long)b0, sqrt(se / sx), rms_bound);
    }
    free(q);
    free(y);
}

static void check_roundtrip(int type, const float *x, int64_t n, const char *what)
{
    check_roundtrip_with(tensor_type_traits_ref(type), type, x, n, what);
}

static const int all_quant_types[] = {
    TT_F32, TT_F16, TT_BF16, TT_Q4_0, TT_Q4_1, TT_Q5_0, TT_Q5_1, TT_Q8_0,
    TT_Q8_1, TT_Q2_K, TT_Q3_K, TT_Q4_K, TT_Q5_K, TT_Q6_K, TT_Q8_K,
    TT_IQ4_NL, TT_IQ4_XS, TT_MXFP4,
};
#define N_ALL_QUANT_TYPES (int)(sizeof all_quant_types / sizeof all_quant_types[0])

TEST(quant_roundtrip_random)
{
    static const int n_blocks[] = {1, 3, 7, 17};
    static const struct { float scale, offset; } dist[] = {
        {1.0f, 0.0f}, {0.02f, 0.0f}, {30.0f, 0.0f}, {1.0f, 0.7f}, {0.5f, -2.0f},
    };
    rng_state r;
    rng_seed(&r, 1234);
    for (int k = 0; k < N_ALL_QUANT_TYPES; k++) {
        const int type = all_quant_types[k];
        const int64_t bs = type_block(type) > 1 ? type_block(type) : 32;
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++)
            for (size_t d = 0; d < sizeof dist / sizeof dist[0]; d++) {
                const int64_t n = n_blocks[s] * bs;
                float *x = xmalloc((size_t)n * sizeof(float));
                fill_normal(&r, x, n, dist[d].scale, dist[d].offset);
                char what[64];
                snprintf(what, sizeof what, "n=%lld dist %zu", (long long)n, d);
                check_roundtrip(type, x, n, what);
                free(x);
            }
    }
}

/* The RMS error over many blocks of N(0, 1) data, against what each format
 * achieves (ggml's quantisers reach about the same). */
TEST(quant_roundtrip_rms)
{
    static const struct { int type; double rms; } limit[] = {
        {TT_F16, 3e-4}, {TT_BF16, 2.2e-3}, {TT_Q4_0, 0.095}, {TT_Q4_1, 0.085},
        {TT_Q5_0, 0.047}, {TT_Q5_1, 0.042}, {TT_Q8_0, 0.006}, {TT_Q8_1, 0.006},
        {TT_Q2_K, 0.29}, {TT_Q3_K, 0.16}, {TT_Q4_K, 0.078}, {TT_Q5_K, 0.040}, {TT_Q6_K, 0.020}, {TT_Q8_K, 0.0075},
        {TT_IQ4_NL, 0.09}, {TT_IQ4_XS, 0.09}, {TT_MXFP4, 0.15},
    };
    const int64_t n = 64 * QK_K;
    float *x = xmalloc((size_t)n * sizeof(float)), *y = xmalloc((size_t)n * sizeof(float));
    rng_state r;
    rng_seed(&r, 99);
    fill_normal(&r, x, n, 1.0f, 0.0f);
    for (size_t k = 0; k < sizeof limit / sizeof limit[0]; k++) {
        const tensor_traits *t = tensor_type_traits_ref(limit[k].type);
        void *q = xmalloc(tensor_row_bytes(limit[k].type, n));
        t->from_float(x, q, n);
        t->to_float(q, y, n);
        double se = 0, sx = 0;
        for (int64_t i = 0; i < n; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        if (sqrt(se / sx) > limit[k].rms)
            FAIL("%s: rms error %.5f > %.5f", t->name, sqrt(se / sx), limit[k].rms);
        free(q);
    }
    free(x);
    free(y);
}

TEST(quant_roundtrip_special)
{
    float x[2 * QK_K];
    for (int k = 0; k < N_ALL_QUANT_TYPES; k++) {
        const int type = all_quant_types[k];
        const int64_t n = 2 * QK_K;
        /* zeros decode to zeros exactly */
        float y[2 * QK_K];
        memset(x, 0, sizeof x);
        void *q = xmalloc(tensor_row_bytes(type, n));
        memset(q, 0x5a, tensor_row_bytes(type, n));
        tensor_type_traits_ref(type)->from_float(x, q, n);
        tensor_type_traits_ref(type)->to_float(q, y, n);
        for (int i = 0; i < n; i++)
            if (y[i] != 0.0f)
                FAIL("%s: zero input decodes to %g at %d", tensor_type_name(type), y[i], i);
        free(q);
        /* constants, a lone spike, alternating signs, a ramp */
        for (int i = 0; i < n; i++) x[i] = 0.37f;
        check_roundtrip(type, x, n, "constant +");
        for (int i = 0; i < n; i++) x[i] = -2.5f;
        check_roundtrip(type, x, n, "constant -");
        memset(x, 0, sizeof x);
        x[37] = 5.0f;
        x[300] = -7.0f;
        check_roundtrip(type, x, n, "spikes");
        for (int i = 0; i < n; i++) x[i] = (i & 1) ? 1.0f : -1.0f;
        check_roundtrip(type, x, n, "alternating");
        for (int i = 0; i < n; i++) x[i] = (float)(i - 200) * 0.01f;
        check_roundtrip(type, x, n, "ramp");
    }
}

/* ---- dot products ---------------------------------------------------------
 * dot_f32: against the float64 dot of the decoded weights and the f32
 *   activations; the f32 sum's rounding is at most (n + 2) u sum |w x|.
 * vec_dot: against the float64 dot of decoded weights and decoded
 *   activations (tight: only the float scales differ), and against the
 *   original activations within the activation format's error bound. */

/* Bound of sum |w_i| |x_i - q(x_i)| for activations quantised to `type`. */
static double act_error_bound(int type, const float *wd, const float *x, int64_t n)
{
    double bound = 0;
    const int64_t bs = type == TT_Q8_K ? QK_K : 32;
    for (int64_t b0 = 0; b0 < n; b0 += bs) {
        double amax = 0, sw = 0;
        for (int64_t i = b0; i < b0 + bs && i < n; i++) {
            amax = fmax(amax, fabs(x[i]));
            sw += fabs(wd[i]);
            if (type == TT_F16)
                bound += fabs(wd[i]) * (fabs(x[i]) * 0x1p-11 + 0x1p-25);
            else if (type == TT_BF16)
                bound += fabs(wd[i]) * fabs(x[i]) * 0x1p-8;
        }
        if (type == TT_Q8_0 || type == TT_Q8_1)
            bound += sw * 0.57 * amax / 127;
        else if (type == TT_Q8_K)
            bound += sw * 0.501 * amax / 127;
    }
    return bound;
}

static void check_dots(const tensor_traits *t, int type, const float *w, const float *x,
                       int64_t n)
{
    const tensor_traits *at = tensor_type_traits_ref(t->vec_dot_type);
    void *wq = xmalloc(tensor_row_bytes(type, n));
    void *xq = xmalloc(tensor_row_bytes(t->vec_dot_type, n));
    float *wd = xmalloc((size_t)n * sizeof(float)), *xd = xmalloc((size_t)n * sizeof(float));
    tensor_type_traits_ref(type)->from_float(w, wq, n);
    tensor_type_traits_ref(type)->to_float(wq, wd, n);
    at->from_float(x, xq, n);
    at->to_float(xq, xd, n);

    double ref_x = 0, abs_x = 0, ref_q = 0, abs_q = 0, sum_absxd = 0, wmax = 0;
    for (int64_t i = 0; i < n; i++) {
        ref_x += (double)wd[i] * x[i];
        abs_x += fabs((double)wd[i] * x[i]);
        ref_q += (double)wd[i] * xd[i];
        abs_q += fabs((double)wd[i] * xd[i]);
        sum_absxd += fabs(xd[i]);
        wmax = fmax(wmax, fabs(wd[i]));
    }
    /* Q4_1/Q5_1 take the minimum's term m * sum(x) from Q8_1's s, stored in
     * f16: the exact reference uses s as stored. */
    double s_err = 0;
    if (type == TT_Q4_1 || type == TT_Q5_1) {
        const block_q8_1 *xb = xq;
        for (int64_t b = 0; b < n / 32; b++) {
            double m = type == TT_Q4_1 ? fp16_to_fp32(((const block_q4_1 *)wq)[b].m)
                                       : fp16_to_fp32(((const block_q5_1 *)wq)[b].m);
            double sx = 0;
            for (int j = 0; j < 32; j++)
                sx += xd[32 * b + j];
            ref_q += m * (fp16_to_fp32(xb[b].s) - sx);
            s_err += fabs(m) * fabs(fp16_to_fp32(xb[b].s)) * 0x1p-10;
        }
    }

    float got = t->dot_f32(wq, x, n);
    double tol = (double)(n + 2) * 0x1p-24 * abs_x * 1.01 + 1e-30;
    if (!(fabs(got - ref_x) <= tol))
        FAIL("%s dot_f32 n=%lld: %.9g vs f64 %.9g (tol %.3g)", t->name, (long long)n,
             got, ref_x, tol);

    got = t->vec_dot(wq, xq, n);
    /* float scales per block; for formats with a minimum the decoded
     * weights are differences, so count the minimum's magnitude as well */
    tol = 1e-5 * (abs_q + wmax * sum_absxd) + 1e-30;
    if (!(fabs(got - ref_q) <= tol))
        FAIL("%s vec_dot n=%lld: %.9g vs f64 of decoded operands %.9g (tol %.3g)",
             t->name, (long long)n, got, ref_q, tol);
    double loose = tol + act_error_bound(t->vec_dot_type, wd, x, n) + s_err;
    if (!(fabs(got - ref_x) <= loose))
        FAIL("%s vec_dot n=%lld: %.9g vs f64 of original activations %.9g (tol %.3g)",
             t->name, (long long)n, got, ref_x, loose);
    free(wq);
    free(xq);
    free(wd);
    free(xd);
}

TEST(quant_dot_vs_f64)
{
    static const int n_blocks[] = {1, 3, 7, 17};
    rng_state r;
    rng_seed(&r, 777);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const int64_t bs = type_block(type);
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++)
            for (int rep = 0; rep < 3; rep++) {
                /* float types: odd lengths too, activations in any length */
                const int64_t n = bs == 1 ? n_blocks[s] * 33 + rep : n_blocks[s] * bs;
                float *w = xmalloc((size_t)n * sizeof(float)), *x = xmalloc((size_t)n * sizeof(float));
                fill_normal(&r, w, n, rep == 2 ? 0.02f : 1.0f, rep == 1 ? 0.3f : 0.0f);
                fill_normal(&r, x, n, rep == 1 ? 5.0f : 1.0f, 0.0f);
                check_dots(tensor_type_traits_ref(type), type, w, x, n);
                free(w);
                free(x);
            }
    }
}

/* Every entry of the active table (SIMD kernels once there are some) against
 * the reference at awkward sizes. */
TEST(quant_kernels_match_ref)
{
    static const int n_blocks[] = {1, 3, 7, 17, 33};
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 4242);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        const int64_t bs = type_block(type) > 1 ? type_block(type) : 32;
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++) {
            const int64_t n = n_blocks[s] * bs;
            float *w = xmalloc((size_t)n * sizeof(float)), *x = xmalloc((size_t)n * sizeof(float));
            float *y1 = xmalloc((size_t)n * sizeof(float)), *y2 = xmalloc((size_t)n * sizeof(float));
            fill_normal(&r, w, n, 1.0f, 0.0f);
            fill_normal(&r, x, n, 1.0f, 0.0f);
            void *wq = xmalloc(tensor_row_bytes(type, n));
            void *xq = xmalloc(tensor_row_bytes(a->vec_dot_type, n));
            ref->from_float(w, wq, n);
            tensor_type_traits_ref(a->vec_dot_type)->from_float(x, xq, n);
            /* decoding is exact in every implementation */
            ref->to_float(wq, y1, n);
            a->to_float(wq, y2, n);
            check_floats_exact(y2, y1, (int)n, a->name);
            /* quantisers may round ties differently but keep the bound */
            check_roundtrip_with(a, type, w, n, "active from_float");
            check_roundtrip_with(tensor_type_traits(a->vec_dot_type), a->vec_dot_type, x, n,
                                 "active activation from_float");
            double abs = 0;
            for (int64_t i = 0; i < n; i++)
                abs += fabs((double)y1[i] * x[i]);
            CHECK_NEAR(a->dot_f32(wq, x, n), ref->dot_f32(wq, x, n), 2 * (n + 2) * 0x1p-24 * abs);
            CHECK_NEAR(a->vec_dot(wq, xq, n), ref->vec_dot(wq, xq, n), 1e-5 * abs + 1e-6);
            free(w); free(x); free(y1); free(y2); free(wq); free(xq);
        }
    }
}
