/* test_kv_types.c - KV cache element types (tensor/kv_types.h) and
 * attention over them:
 *   - names and row sizes (q8_0 rows padded to whole blocks);
 *   - a q8_0 row written and decoded again is within half a step of each
 *     value, its padding 0; f32 rows are exact, f16 rows round as fp16;
 *   - the reference attention over a q8_0 cache equals attention over the
 *     same values decoded to f32 (it reads the blocks right), and the active
 *     attention (AVX2 where the CPU has it) agrees with the reference at
 *     widths on and off the 32-value block, strides wider than a head, and a
 *     latent-style cache whose values are a prefix of its 80-wide keys.
 * Only src/base and src/tensor: it also runs in the arm64 build. */
#include "test.h"

#include "base/err.h"
#include "base/rng.h"
#include "tensor/attend.h"
#include "tensor/fp16.h"
#include "tensor/kv_types.h"
#include "tensor/types.h"

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

TEST(kv_types_names_and_rows)
{
    int t = -1;
    CHECK_OK(kv_type_parse("f32", &t));
    CHECK_INT(t, ==, TT_F32);
    CHECK_OK(kv_type_parse("F16", &t));
    CHECK_INT(t, ==, TT_F16);
    CHECK_OK(kv_type_parse("q8_0", &t));
    CHECK_INT(t, ==, TT_Q8_0);
    CHECK_INT(kv_type_parse("q4_0", &t), ==, -1);
    CHECK_INT(kv_type_parse("", &t), ==, -1);
    CHECK_INT(kv_type_parse(NULL, &t), ==, -1);
    CHECK_STR(kv_type_name(TT_F32), "f32");
    CHECK_STR(kv_type_name(TT_F16), "f16");
    CHECK_STR(kv_type_name(TT_Q8_0), "q8_0");
    CHECK_STR(kv_type_name(TT_Q4_0), "?");
    CHECK(kv_type_ok(TT_Q8_0) && !kv_type_ok(TT_BF16));
    CHECK_INT(KV_TYPE_DEFAULT, ==, TT_F16);
    CHECK_INT(kv_row_bytes(TT_F32, 128), ==, 512);
    CHECK_INT(kv_row_bytes(TT_F16, 128), ==, 256);
    CHECK_INT(kv_row_bytes(TT_Q8_0, 128), ==, 4 * 34);
    CHECK_INT(kv_row_bytes(TT_Q8_0, 576), ==, 18 * 34);   /* DeepSeek-V3's latent + rope key */
    CHECK_INT(kv_row_bytes(TT_Q8_0, 80), ==, 3 * 34);     /* the golden deepseek2's: padded */
    CHECK_INT(kv_row_bytes(TT_Q8_0, 1), ==, 34);
    CHECK_INT(kv_row_bytes(TT_Q8_0, 0), ==, 0);
    CHECK_INT(kv_row_bytes(TT_BF16, 8), ==, 0);
}

TEST(kv_types_q8_0_round_trip)
{
    rng_state r;
    rng_seed(&r, 71);
    static const int widths[] = { 32, 64, 80, 128, 20, 1, 576 };
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int n = widths[wi], nb = (n + 31) / 32;
        float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * nb * 32);
        for (int i = 0; i < n; i++)
            x[i] = rng_normal(&r) * (i % 7 == 0 ? 10.0f : 1.0f);
        uint8_t *row = xmalloc(kv_row_bytes(TT_Q8_0, (size_t)n));
        memset(row, 0xa5, kv_row_bytes(TT_Q8_0, (size_t)n));   /* padding must be written */
        kv_row_from_float(TT_Q8_0, x, row, n);
        tensor_type_traits_ref(TT_Q8_0)->to_float(row, y, nb * 32);
        const block_q8_0 *b = (const block_q8_0 *)row;
        for (int i = 0; i < nb * 32; i++) {
            const float d = fp16_to_fp32(b[i / 32].d);
            if (i >= n) {
                if (b[i / 32].qs[i % 32] != 0)
                    FAIL("width %d: padding value %d is %d, not 0", n, i, b[i / 32].qs[i % 32]);
                continue;
            }
            /* half a step, plus the scale's own f16 rounding over 127 steps */
            const double tol = 0.5 * d + 127.0 * d * 0x1p-11 + 1e-7;
            if (!(fabs((double)y[i] - x[i]) <= tol))
                FAIL("width %d: value %d is %.7g, stored as %.7g (step %.3g)", n, i, x[i], y[i], d);
        }
        /* whole blocks are exactly what the GGUF Q8_0 quantiser writes */
        if (n >= 32) {
            uint8_t *want = xmalloc(kv_row_bytes(TT_Q8_0, (size_t)n));
            tensor_type_traits_ref(TT_Q8_0)->from_float(x, want, n / 32 * 32);
            CHECK(!memcmp(want, row, (size_t)(n / 32) * sizeof(block_q8_0)));
            free(want);
        }
        /* f32 is a copy, f16 rounds as fp16 */
        float *f = xmalloc(sizeof(float) * n);
        uint16_t *h = xmalloc(sizeof(uint16_t) * n);
        kv_row_from_float(TT_F32, x, f, n);
        kv_row_from_float(TT_F16, x, h, n);
        CHECK(!memcmp(f, x, sizeof(float) * n));
        for (int i = 0; i < n; i++)
            CHECK_INT(h[i], ==, fp32_to_fp16(x[i]));
        free(f); free(h); free(x); free(y); free(row);
    }
}

/* n rows of `stride` random values written as cache rows of `type`, and
 * the same rows decoded to f32 (stride floats apart) into *dec. */
static uint8_t *cache_rows(rng_state *r, int type, int n, size_t stride, float **dec)
{
    const size_t rb = kv_row_bytes(type, stride);
    uint8_t *c = xmalloc(rb * (size_t)n);
    float *x = xmalloc(sizeof(float) * stride), *pad = xmalloc(sizeof(float) * (stride + 32));
    *dec = xmalloc(sizeof(float) * stride * (size_t)n);
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < stride; i++)
            x[i] = rng_normal(r);
        kv_row_from_float(type, x, c + (size_t)p * rb, (int)stride);
        if (type == TT_Q8_0)
            tensor_type_traits_ref(TT_Q8_0)->to_float(c + (size_t)p * rb, pad,
                                                      (int64_t)(rb / sizeof(block_q8_0) * 32));
        else
            tensor_type_traits_ref(type)->to_float(c + (size_t)p * rb, pad, (int64_t)stride);
        memcpy(*dec + (size_t)p * stride, pad, sizeof(float) * stride);
    }
    free(x);
    free(pad);
    return c;
}

/* The largest |scale * q . k_p| (the tolerance grows with it). */
static double top_score(const float *q, int G, int D, const float *k, size_t ks, int n, float scale)
{
    double top = 0;
    for (int g = 0; g < G; g++)
        for (int p = 0; p < n; p++) {
            double dot = 0;
            for (int i = 0; i < D; i++)
                dot += (double)q[g * D + i] * k[(size_t)p * ks + i];
            top = fmax(top, fabs(dot * scale));
        }
    return top;
}

static void check_close(const float *got, const float *want, int n, double tol, const char *what,
                        int D, int Dv, int G, int len, float scale)
{
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            FAIL("%s, D %d Dv %d group %d positions %d scale %g: out[%d] %.8g, want %.8g", what, D,
                 Dv, G, len, scale, i, got[i], want[i]);
}

TEST(kv_types_attend_q8_0)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 73);
    /* {D, Dv, k stride, v stride}; stride 0: the values are the keys' rows
     * (latent attention: one 80-wide row, the values its first 64) */
    static const int shapes[][4] = {
        { 64, 64, 64, 64 }, { 128, 128, 200, 136 }, { 72, 40, 72, 40 }, { 80, 64, 80, 0 },
        { 32, 32, 96, 40 }, { 8, 16, 8, 16 }, { 20, 12, 20, 12 },
    };
    static const int groups[] = { 1, 4, 8 };
    static const int lens[] = { 1, 7, 9, 129, 300 };
    static const float scales[] = { 0.05f, 0.2f, 3.0f };
    int checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int D = shapes[si][0], Dv = shapes[si][1], G = groups[gi], n = lens[li];
                const size_t ks = (size_t)shapes[si][2];
                const bool shared = shapes[si][3] == 0;
                const size_t vs = shared ? ks : (size_t)shapes[si][3];
                const float scale = scales[(si + gi + li) % 3];
                float *kd, *vd, *q = xmalloc(sizeof(float) * G * D);
                uint8_t *k = cache_rows(&r, TT_Q8_0, n, ks, &kd);
                uint8_t *v = shared ? k : cache_rows(&r, TT_Q8_0, n, vs, &vd);
                if (shared)
                    vd = kd;
                for (int i = 0; i < G * D; i++)
                    q[i] = rng_normal(&r);
                float *s = xmalloc(sizeof(float) * G * n);
                float *o_ref = xmalloc(sizeof(float) * G * Dv), *o_dec = xmalloc(sizeof(float) * G * Dv);
                float *o = xmalloc(sizeof(float) * G * Dv);
                tensor_attend_ref(q, G, D, Dv, scale, TT_Q8_0, k, ks, v, vs, n, s, o_ref);
                tensor_attend_ref(q, G, D, Dv, scale, TT_F32, kd, ks, vd, vs, n, s, o_dec);
                tensor_attend(q, G, D, Dv, scale, TT_Q8_0, k, ks, v, vs, n, s, o);
                const double tol = 2e-5 + 8 * 0x1p-24 * top_score(q, G, D, kd, ks, n, scale);
                check_close(o_ref, o_dec, G * Dv, tol, "reference q8_0 vs decoded f32", D, Dv, G,
                            n, scale);
                check_close(o, o_ref, G * Dv, tol, "active q8_0 vs reference", D, Dv, G, n, scale);
                checked++;
                free(q); free(k); free(kd); free(s); free(o_ref); free(o_dec); free(o);
                if (!shared) {
                    free(v);
                    free(vd);
                }
            }
    CHECK_INT(checked, ==, 7 * 3 * 5);
}

/* What a q8_0 cache costs attention in accuracy, against the f32 values it
 * was made from, at the size of a real head: values of spread 1 are stored
 * in steps of amax / 127 (about 1/40 for normal values), so an output moves
 * by about half a step, under 0.02 (the whole-model effect is measured on
 * the golden models, test_kv_cache.c). */
TEST(kv_types_q8_0_error_is_small)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 79);
    const int D = 128, G = 4, n = 512;
    const float scale = 1.0f / sqrtf((float)D);
    float *kd, *vd, *kf, *vf, *q = xmalloc(sizeof(float) * G * D);
    for (int i = 0; i < G * D; i++)
        q[i] = rng_normal(&r) * 2.0f;   /* peaked scores, as trained heads have */
    rng_state r2 = r;
    uint8_t *k = cache_rows(&r, TT_Q8_0, n, D, &kd), *v = cache_rows(&r, TT_Q8_0, n, D, &vd);
    uint8_t *k32 = cache_rows(&r2, TT_F32, n, D, &kf), *v32 = cache_rows(&r2, TT_F32, n, D, &vf);
    float *s = xmalloc(sizeof(float) * G * n), *o = xmalloc(sizeof(float) * G * D),
          *o32 = xmalloc(sizeof(float) * G * D);
    tensor_attend(q, G, D, D, scale, TT_Q8_0, k, D, v, D, n, s, o);
    tensor_attend(q, G, D, D, scale, TT_F32, k32, D, v32, D, n, s, o32);
    double e = 0;
    for (int i = 0; i < G * D; i++) {
        const double d = fabs((double)o[i] - o32[i]);
        if (d > e)   /* not fmax: gcc 12's aarch64 vectoriser fails on that reduction */
            e = d;
    }
    fprintf(stderr, "  q8_0 cache: max |out - f32 cache's| %.2e\n", e);
    CHECK(e > 0 && e < 0.02);
    free(q); free(k); free(v); free(k32); free(v32); free(kd); free(vd); free(kf); free(vf);
    free(s); free(o); free(o32);
}
