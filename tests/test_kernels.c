/* test_kernels.c - the active kernel table (SIMD kernels chosen by the CPU
 * probe) against the scalar reference, and the matrix product on top.
 *
 *   - activation quantisers (and the F16/BF16 converters): bit-identical
 *     to the reference, special values included;
 *   - decoders: bit-identical, also on blocks of random bytes;
 *   - dot products: within a per-type tolerance of the reference, at
 *     awkward lengths (1, 3, 7, 17, 33... blocks), on quantiser output and
 *     on random levels and scales;
 *   - tile kernels: any sub-grid gives the same bits as the whole grid,
 *     and the whole grid matches vec_dot within tolerance;
 *   - matmul: 1, 2 and 3 threads give identical bits, and the result
 *     matches per-row reference dot products, at awkward shapes.
 * The comparisons that need SIMD kernels skip when the CPU has none (the
 * active table is then the reference itself).
 */
#include "test.h"

#include <float.h>

#include "base/cpu.h"
#include "base/rng.h"
#include "tensor/attend.h"
#include "tensor/fp16.h"
#if defined(__x86_64__)
#include "tensor/kernels_isa.h"   /* one ISA's kernels beside another's */
#endif
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/types.h"
#if defined(__x86_64__)
#include "tensor/kernels_isa.h"   /* the AVX2 and AVX-512 sets side by side */
#endif

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

/* Initialises the kernels; skips the test when no SIMD set is active. */
static void need_simd(void)
{
    tensor_kernels_init();
    if (!strcmp(tensor_kernels_name(), "ref"))
        SKIP("no SIMD kernels on this CPU (or RACIMO_KERNELS=ref): "
             "the active table is the reference");
}

static int is_float_type(int type) { return type == TT_F32 || type == TT_F16 || type == TT_BF16; }

static int has_min(int type)
{
    return type == TT_Q4_1 || type == TT_Q5_1 || type == TT_Q2_K || type == TT_Q4_K ||
           type == TT_Q5_K;
}

/* A row of weights: quantised normal values, or (`random_levels`) random
 * bytes with the scale fields set to sane values, so every level and every
 * packed sub-block scale occurs. */
static void make_weights(rng_state *r, int type, int64_t n, int random_levels, float scale,
                         float offset, void *out)
{
    const tensor_traits *ref = tensor_type_traits_ref(type);
    const size_t bytes = tensor_row_bytes(type, n);
    if (!random_levels || is_float_type(type)) {
        float *w = xmalloc((size_t)n * sizeof(float));
        fill_normal(r, w, n, scale, offset);
        ref->from_float(w, out, n);
        free(w);
        return;
    }
    uint8_t *p = out;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)rng_next(r);
    const size_t bb = ref->block_bytes;
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *blk = p + b * bb;
        fp16_t d = fp32_to_fp16(scale * (float)(0.5 + rng_uniform(r)) / 64.0f);
        fp16_t m = fp32_to_fp16(scale * (float)rng_uniform(r) / 64.0f);
        if (type == TT_MXFP4) {          /* an E8M0 byte: scales 2^-4 .. 2^-1 */
            blk[0] = (uint8_t)(124 + rng_next(r) % 4);
            continue;
        }
        /* d (and the minimum's scale) lead the block, or end it */
        size_t d_off = type == TT_Q6_K || type == TT_Q3_K ? bb - 2 : type == TT_Q2_K ? bb - 4 : 0;
        memcpy(blk + d_off, &d, 2);
        if (has_min(type))
            memcpy(blk + d_off + 2, &m, 2);
    }
}

/* Bound on the magnitudes a dot product of these rows adds up: the sum of
 * |w_k x_k| over decoded values, plus for formats with a minimum the
 * minimum's share counted on its own (the two parts may cancel). */
static double dot_magnitude(int type, const void *w, int act_type, const void *x, int64_t n)
{
    float *wd = xmalloc((size_t)n * sizeof(float)), *xd = xmalloc((size_t)n * sizeof(float));
    tensor_type_traits_ref(type)->to_float(w, wd, n);
    tensor_type_traits_ref(act_type)->to_float(x, xd, n);
    double abs = 0, wmax = 0, xabs = 0;
    for (int64_t i = 0; i < n; i++) {
        abs += fabs((double)wd[i] * xd[i]);
        xabs += fabs((double)xd[i]);
        if (fabs(wd[i]) > wmax)
            wmax = fabs(wd[i]);
    }
    free(wd);
    free(xd);
    return abs + (has_min(type) ? 2 * wmax * xabs : 0);
}

/* Relative tolerance of a dot product against the reference: float sums in
 * another order, about one rounding per block (or per 8 elements for the
 * float types) and per lane. */
static double dot_tol(int type, int64_t n, double magnitude)
{
    const int64_t bs = tensor_type_traits_ref(type)->block_size;
    const double steps = is_float_type(type) ? (double)n / 8 + 16 : (double)(n / bs) + 16;
    return 2 * steps * 0x1p-24 * magnitude + 1e-30;
}

/* ---- probe and table ------------------------------------------------------ */

TEST(kernels_probe)
{
    tensor_kernels_init();
    tensor_kernels_init();              /* idempotent */
    printf("  kernels: %s; cpu:", tensor_kernels_name());
    for (int f = 0; f < CPU_FEATURE_COUNT; f++)
        if (cpu_has(f))
            printf(" %s", cpu_feature_name(f));
    printf("\n");
    CHECK(!cpu_has(-1) && !cpu_has(CPU_FEATURE_COUNT));
    CHECK_STR(cpu_feature_name(CPU_FEATURE_COUNT), "?");
    const char *env = getenv("RACIMO_KERNELS");
    int forced_ref = env && !strcmp(env, "ref");
#if defined(__x86_64__)
    if (!forced_ref && cpu_has(CPU_AVX2) && cpu_has(CPU_FMA) && cpu_has(CPU_F16C))
        CHECK(!strncmp(tensor_kernels_name(), "avx2", 4));
    if (!strncmp(tensor_kernels_name(), "avx2+vnni", 9))
        CHECK(cpu_has(CPU_AVX_VNNI));
    /* the AVX-512 kernels only where all four extensions are, and never
     * when RACIMO_KERNELS=avx2 asks for the AVX2 set alone */
    const int avx512 = strstr(tensor_kernels_name(), "avx512") != NULL;
    if (avx512)
        CHECK(cpu_has(CPU_AVX512F) && cpu_has(CPU_AVX512BW) && cpu_has(CPU_AVX512VL) &&
              cpu_has(CPU_AVX512VNNI));
    if (env && !strcmp(env, "avx2"))
        CHECK_STR(tensor_kernels_name(), "avx2");
    else if (env && !strcmp(env, "avx2+vnni"))
        CHECK(!avx512);
    else if (!forced_ref && cpu_has(CPU_AVX2) && cpu_has(CPU_FMA) && cpu_has(CPU_F16C) &&
             cpu_has(CPU_AVX512F) && cpu_has(CPU_AVX512BW) && cpu_has(CPU_AVX512VL) &&
             cpu_has(CPU_AVX512VNNI))
        CHECK(avx512);
    CHECK(!cpu_has(CPU_NEON) && !cpu_has(CPU_DOTPROD));
#elif defined(__aarch64__)
    CHECK(cpu_has(CPU_NEON));
    CHECK(!cpu_has(CPU_AVX2));
#endif
    if (forced_ref)
        CHECK_STR(tensor_kernels_name(), "ref");
    /* the AVX2 set has a tile kernel for every weight type */
    if (!strncmp(tensor_kernels_name(), "avx2", 4))
        for (int k = 0; k < N_WEIGHT_TYPES; k++)
            CHECK(tensor_type_traits(weight_types[k])->vec_dot_tile != NULL);
    for (int t = 0; t < TT_COUNT; t++)
        CHECK(tensor_type_traits_ref(t)->vec_dot_tile == NULL);
}

/* ---- quantisers and converters: bit-identical ---------------------------- */

/* Blocks of special values: zeros, NaN, Inf, subnormals, huge values, exact
 * rounding ties, a tiny maximum whose inverse overflows.  `snan` adds
 * signalling NaNs: the Q8_0/Q8_1 reference finds the maximum with fmaxf,
 * which libm may answer with NaN for those (glibc does), so they are left
 * out there; the forward pass never quantises one (arithmetic quiets NaNs). */
static void fill_special(rng_state *r, float *x, int64_t n, int block, int snan)
{
    for (int64_t b = 0; b < n / block; b++) {
        float *v = x + b * block;
        const int kind = (int)(b % 10);
        for (int j = 0; j < block; j++) {
            float f = rng_normal(r);
            switch (kind) {
            case 0: f = 0.0f; break;
            case 1: if (j == 3) f = NAN; break;
            case 2: if (j == 5 || j == 6) f = j == 5 ? INFINITY : -INFINITY; break;
            case 3: f = FLT_TRUE_MIN * (float)(j - block / 2); break;
            case 4: f = FLT_MAX * (j % 2 ? 1.0f : -0.5f); break;
            /* amax 127 (or max -127): quants are the values, ties at .5 */
            case 5: f = j == 0 ? 127.0f : (float)(j % 64) - 31.5f; break;
            case 6: f = j == 0 ? -127.0f : (float)(j % 64) - 31.5f; break;
            case 7: f = (j % 7 - 3) * 1e-39f; break;
            case 8: if (j % 5 == 0) f = -f * 100.0f; break;
            default: break;
            }
            v[j] = f;
        }
        if (kind == 9)                    /* equal magnitudes, opposite signs */
            v[1] = -v[0];
        if (kind == 1 && block > 8 && snan)
            memcpy(&v[7], &(uint32_t){ 0x7f800001u }, 4);   /* signalling NaN */
        if (kind == 1 && block > 9)
            memcpy(&v[9], &(uint32_t){ 0xffc12345u }, 4);   /* negative NaN, payload */
    }
}

TEST(kernels_from_float_bit_identical)
{
    need_simd();
    static const int types[] = { TT_Q8_0, TT_Q8_1, TT_Q8_K, TT_F16, TT_BF16, TT_F32 };
    static const int n_blocks[] = { 1, 3, 7, 17, 33, 64 };
    rng_state r;
    rng_seed(&r, 99);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int type = types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        const int64_t bs = ref->block_size > 1 ? ref->block_size : 32;
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++)
            for (int variant = 0; variant < 3; variant++) {
                /* float types take any length: add an odd tail */
                const int64_t n = n_blocks[s] * bs + (ref->block_size == 1 ? 5 : 0);
                float *x = xmalloc((size_t)n * sizeof(float));
                if (variant == 2)
                    fill_special(&r, x, n, (int)bs, type != TT_Q8_0 && type != TT_Q8_1);
                else
                    fill_normal(&r, x, n, variant ? 1e-3f : 3.0f, variant ? 0.5f : 0.0f);
                const size_t bytes = tensor_row_bytes(type, n);
                uint8_t *q1 = xmalloc(bytes), *q2 = xmalloc(bytes);
                memset(q1, 0xa5, bytes);
                memset(q2, 0x5a, bytes);
                ref->from_float(x, q1, n);
                a->from_float(x, q2, n);
                for (size_t i = 0; i < bytes; i++)
                    if (q1[i] != q2[i])
                        FAIL("%s from_float n=%lld variant %d: byte %zu (block %zu) is 0x%02x, "
                             "reference 0x%02x", a->name, (long long)n, variant, i,
                             i / ref->block_bytes, q2[i], q1[i]);
                free(x);
                free(q1);
                free(q2);
            }
    }
}

TEST(kernels_to_float_bit_identical)
{
    need_simd();
    rng_state r;
    rng_seed(&r, 5);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        const int64_t bs = ref->block_size > 1 ? ref->block_size : 32;
        static const int n_blocks[] = { 1, 3, 7, 17, 33 };
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++) {
            const int64_t n = n_blocks[s] * bs + (ref->block_size == 1 ? 3 : 0);
            const size_t bytes = tensor_row_bytes(type, n);
            uint8_t *w = xmalloc(bytes);
            /* random bytes: any level, scale, NaN or Inf scale a file may hold */
            for (size_t i = 0; i < bytes; i++)
                w[i] = (uint8_t)rng_next(&r);
            float *y1 = xmalloc((size_t)n * sizeof(float)), *y2 = xmalloc((size_t)n * sizeof(float));
            ref->to_float(w, y1, n);
            a->to_float(w, y2, n);
            /* NaNs match any NaN: which sign and payload a NaN scale passes on
             * depends on how a compiler arranged the reference's arithmetic */
            for (int64_t i = 0; i < n; i++)
                if (fp32_bits(y1[i]) != fp32_bits(y2[i]) && !(isnan(y1[i]) && isnan(y2[i])))
                    FAIL("%s to_float n=%lld: element %lld is 0x%08x, reference 0x%08x", a->name,
                         (long long)n, (long long)i, fp32_bits(y2[i]), fp32_bits(y1[i]));
            free(w);
            free(y1);
            free(y2);
        }
    }
}

/* ---- dot products against the reference ---------------------------------- */

TEST(kernels_vec_dot_vs_ref)
{
    need_simd();
    static const int n_blocks[] = { 1, 3, 7, 17, 33, 64 };
    rng_state r;
    rng_seed(&r, 2024);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        const int at = ref->vec_dot_type;
        const int64_t bs = ref->block_size > 1 ? ref->block_size : 32;
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++)
            for (int variant = 0; variant < 4; variant++) {
                const int64_t n = n_blocks[s] * bs + (ref->block_size == 1 ? variant : 0);
                void *w = xmalloc(tensor_row_bytes(type, n)), *xq = xmalloc(tensor_row_bytes(at, n));
                float *x = xmalloc((size_t)n * sizeof(float));
                make_weights(&r, type, n, variant == 3, variant == 1 ? 0.02f : 1.0f,
                             variant == 2 ? 0.3f : 0.0f, w);
                fill_normal(&r, x, n, variant == 1 ? 5.0f : 1.0f, 0.0f);
                tensor_type_traits_ref(at)->from_float(x, xq, n);
                const double mag = dot_magnitude(type, w, at, xq, n);
                const double want = ref->vec_dot(w, xq, n), got = a->vec_dot(w, xq, n);
                const double tol = dot_tol(type, n, mag);
                if (!(fabs(got - want) <= tol))
                    FAIL("%s vec_dot n=%lld variant %d: %.9g, reference %.9g (|diff| %.3g > %.3g)",
                         a->name, (long long)n, variant, got, want, fabs(got - want), tol);
                /* exact path: f32 activations */
                double mag32 = 0;
                float *wd = xmalloc((size_t)n * sizeof(float));
                ref->to_float(w, wd, n);
                for (int64_t i = 0; i < n; i++)
                    mag32 += fabs((double)wd[i] * x[i]);
                const double w32 = ref->dot_f32(w, x, n), g32 = a->dot_f32(w, x, n);
                const double tol32 = 2 * ((double)n / 8 + 16) * 0x1p-24 * mag32 + 1e-30;
                if (!(fabs(g32 - w32) <= tol32))
                    FAIL("%s dot_f32 n=%lld variant %d: %.9g, reference %.9g (|diff| %.3g > %.3g)",
                         a->name, (long long)n, variant, g32, w32, fabs(g32 - w32), tol32);
                free(wd);
                free(w);
                free(xq);
                free(x);
            }
    }
}

/* ---- tile kernels ---------------------------------------------------------- */

TEST(kernels_tile_any_split)
{
    need_simd();
    rng_state r;
    rng_seed(&r, 31337);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        if (!a->vec_dot_tile)
            continue;
        const int at = ref->vec_dot_type;
        const int64_t n = ref->block_size > 1 ? 3 * ref->block_size : 77;
        const int n_w = 11, n_x = 7;
        const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
        uint8_t *w = xmalloc(wrb * n_w), *xq = xmalloc(xrb * n_x);
        float *x = xmalloc((size_t)n * sizeof(float));
        for (int i = 0; i < n_w; i++)
            make_weights(&r, type, n, i % 3 == 2, 1.0f, i % 2 ? 0.2f : 0.0f, w + i * wrb);
        for (int j = 0; j < n_x; j++) {
            fill_normal(&r, x, n, 1.0f, 0.0f);
            tensor_type_traits_ref(at)->from_float(x, xq + j * xrb, n);
        }
        /* the rows the tile kernel reads: prepared, or the activation rows */
        const size_t prb = tensor_tile_x_bytes(a, n);
        uint8_t *xt = xq;
        if (a->tile_x_block_bytes) {
            CHECK(a->tile_x_prep != NULL);
            xt = xmalloc(prb * n_x);
            for (int j = 0; j < n_x; j++)
                a->tile_x_prep(xq + j * xrb, xt + j * prb, n);
        }
        float full[7][11], part[7][11];
        a->vec_dot_tile(n, w, wrb, n_w, xt, prb, n_x, &full[0][0], 11);
        for (int i = 0; i < n_w; i++)
            for (int j = 0; j < n_x; j++) {
                const double want = ref->vec_dot(w + i * wrb, xq + j * xrb, n);
                const double tol = dot_tol(type, n, dot_magnitude(type, w + i * wrb, at, xq + j * xrb, n));
                if (!(fabs(full[j][i] - want) <= tol))
                    FAIL("%s tile (%d, %d): %.9g, reference vec_dot %.9g (tol %.3g)", a->name, i,
                         j, full[j][i], want, tol);
            }
        /* sub-grids at every offset and of every shape up to 5 x 5 */
        for (int rows = 1; rows <= 5; rows++)
            for (int cols = 1; cols <= 5; cols++) {
                memset(part, 0, sizeof part);
                for (int j0 = 0; j0 < n_x; j0 += cols)
                    for (int i0 = 0; i0 < n_w; i0 += rows) {
                        int nw = n_w - i0 < rows ? n_w - i0 : rows;
                        int nx = n_x - j0 < cols ? n_x - j0 : cols;
                        a->vec_dot_tile(n, w + i0 * wrb, wrb, nw, xt + j0 * prb, prb, nx,
                                        &part[j0][i0], 11);
                    }
                for (int i = 0; i < n_w; i++)
                    for (int j = 0; j < n_x; j++)
                        if (fp32_bits(part[j][i]) != fp32_bits(full[j][i]))
                            FAIL("%s tile split %dx%d: output (%d, %d) is %.9g, whole grid %.9g",
                                 a->name, rows, cols, i, j, part[j][i], full[j][i]);
            }
        /* and vec_dot is the 1 x 1 tile */
        for (int i = 0; i < n_w; i++)
            for (int j = 0; j < n_x; j++) {
                const float v = a->vec_dot(w + i * wrb, xq + j * xrb, n);
                if (fp32_bits(v) != fp32_bits(full[j][i]))
                    FAIL("%s: vec_dot (%d, %d) is %.9g, tile %.9g", a->name, i, j, v, full[j][i]);
            }
        if (xt != xq)
            free(xt);
        free(w);
        free(xq);
        free(x);
    }
}

/* n_w weight rows of `type` (random levels in every third, an offset in
 * every other) and n_x activation rows in its vec_dot_type (an offset in
 * every fourth), n elements each, packed at w and xq. */
static void make_rows(rng_state *r, int type, int64_t n, int n_w, uint8_t *w, int n_x, uint8_t *xq)
{
    const int at = tensor_type_traits_ref(type)->vec_dot_type;
    const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int i = 0; i < n_w; i++)
        make_weights(r, type, n, i % 3 == 2, 1.0f, i % 2 ? 0.2f : 0.0f, w + i * wrb);
    for (int j = 0; j < n_x; j++) {
        fill_normal(r, x, n, 1.0f, j % 4 == 1 ? 0.5f : 0.0f);
        tensor_type_traits_ref(at)->from_float(x, xq + j * xrb, n);
    }
    free(x);
}

/* tile on n_w weight rows (wrb apart) against n_x of the nx_max rows xt
 * (prb apart) gives every output dot's bits on the unprepared rows xq (xrb
 * apart), and writes nothing for rows n_x.. (y: nx_max x n_w outputs). */
static void check_tile_rows(const char *name, vec_dot_tile_fn tile, vec_dot_fn dot, int64_t n,
                            const uint8_t *w, size_t wrb, int n_w, const uint8_t *xt, size_t prb,
                            const uint8_t *xq, size_t xrb, int n_x, int nx_max, float *y)
{
    for (int i = 0; i < n_w * nx_max; i++)
        y[i] = -1.0f;
    tile(n, w, wrb, n_w, xt, prb, n_x, y, (size_t)n_w);
    for (int j = 0; j < nx_max; j++)
        for (int i = 0; i < n_w; i++) {
            const float got = y[j * n_w + i];
            if (j >= n_x) {
                if (got != -1.0f)
                    FAIL("%s tile of %d rows wrote output (%d, %d) of row %d", name, n_x, i, j, j);
                continue;
            }
            const float want = dot(w + i * wrb, xq + j * xrb, n);
            if (fp32_bits(got) != fp32_bits(want))
                FAIL("%s n=%lld tile of %d activation rows: output (%d, %d) is %.9g, vec_dot %.9g",
                     name, (long long)n, n_x, i, j, got, want);
        }
}

/* Batched generation: a tile of any number of activation rows (the
 * kernels for a few rows up to some count, the packed prompt kernels
 * beyond, a lone row's own path) gives every output vec_dot's bits, on rows
 * of several blocks and with a ragged last group of weight rows. */
TEST(kernels_tile_batch_sizes)
{
    need_simd();
    rng_state r;
    rng_seed(&r, 4242);
    enum { NW = 13, NX = 24 };
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        if (!a->vec_dot_tile)
            continue;
        const int at = ref->vec_dot_type;
        const int64_t bs = ref->block_size;
        const int64_t n = bs == 32 ? 19 * bs : bs > 1 ? 3 * bs : 67;
        const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
        const size_t prb = tensor_tile_x_bytes(a, n);
        uint8_t *w = xmalloc(wrb * NW), *xq = xmalloc(xrb * NX), *xt = xmalloc(prb * NX);
        float *y = xmalloc(sizeof(float) * NW * NX);
        make_rows(&r, type, n, NW, w, NX, xq);
        for (int j = 0; j < NX; j++) {
            if (a->tile_x_block_bytes)
                a->tile_x_prep(xq + j * xrb, xt + j * prb, n);
            else
                memcpy(xt + j * prb, xq + j * xrb, xrb);
        }
        for (int n_x = 1; n_x <= NX; n_x++)
            check_tile_rows(a->name, a->vec_dot_tile, a->vec_dot, n, w, wrb, NW, xt, prb, xq, xrb,
                            n_x, NX, y);
        free(w);
        free(xq);
        free(xt);
        free(y);
    }
}

/* The AVX-512 kernels of IQ4_NL, MXFP4 and IQ4_XS give the AVX2 kernels'
 * bits (quant_iq_avx512.c keeps their float chain): vec_dot, and the tile
 * on 19 weight rows (odd, ragged against passes of 8 and 4) against 1..33
 * activation rows, at several block counts, on quantiser output and random
 * levels, with activation bytes of -128 in some rows (which the quantiser
 * never writes but the kernels must read as -128). */
TEST(kernels_iq_avx512_matches_avx2)
{
#if defined(__x86_64__)
    if (!(cpu_has(CPU_AVX2) && cpu_has(CPU_FMA) && cpu_has(CPU_F16C) && cpu_has(CPU_AVX512F) &&
          cpu_has(CPU_AVX512BW) && cpu_has(CPU_AVX512VL) && cpu_has(CPU_AVX512VNNI)))
        SKIP("this CPU lacks AVX2 or AVX-512 F/BW/VL/VNNI");
    static tensor_traits t2[TT_COUNT], t5[TT_COUNT];
    for (int t = 0; t < TT_COUNT; t++)
        t2[t] = t5[t] = *tensor_type_traits_ref(t);
    tensor__kernels_iq_avx2(t2);
    tensor__kernels_iq_avx512(t5);
    static const int types[] = { TT_IQ4_NL, TT_MXFP4, TT_IQ4_XS };
    static const int n_blocks[] = { 1, 2, 3, 7, 17 };
    enum { NW = 19, NX = 33 };
    rng_state r;
    rng_seed(&r, 512);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int type = types[k], at = tensor_type_traits_ref(type)->vec_dot_type;
        const tensor_traits *a2 = &t2[type], *a5 = &t5[type];
        printf("  %s\n", a5->name);
        CHECK(a5->vec_dot != a2->vec_dot && a5->vec_dot_tile != a2->vec_dot_tile);
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++) {
            const int64_t n = n_blocks[s] * tensor_type_traits_ref(type)->block_size;
            const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
            uint8_t *w = xmalloc(wrb * NW), *xq = xmalloc(xrb * NX);
            float *y = xmalloc(sizeof(float) * NW * NX);
            make_rows(&r, type, n, NW, w, NX, xq);
            const int64_t qk = at == TT_Q8_K ? QK_K : 32;
            const size_t xbb = tensor_type_traits_ref(at)->block_bytes;
            const size_t qs = at == TT_Q8_K ? offsetof(block_q8_K, qs) : offsetof(block_q8_0, qs);
            for (int j = 2; j < NX; j += 3)   /* every 5th quant -128 */
                for (int64_t e = 0; e < n; e += 5)
                    xq[j * xrb + (size_t)(e / qk) * xbb + qs + (size_t)(e % qk)] = 0x80;
            /* the tile against AVX2's vec_dot, then vec_dot against it */
            for (int n_x = 1; n_x <= NX; n_x++)
                check_tile_rows("AVX-512 vs AVX2", a5->vec_dot_tile, a2->vec_dot, n, w, wrb, NW,
                                xq, xrb, xq, xrb, n_x, NX, y);
            check_tile_rows("AVX-512 vs AVX2", a2->vec_dot_tile, a5->vec_dot, n, w, wrb, NW, xq,
                            xrb, xq, xrb, NX, NX, y);
            /* and both near the reference, -128 bytes included */
            for (int j = 0; j < NX; j += 5)
                for (int i = 0; i < NW; i += 3) {
                    const double want = tensor_type_traits_ref(type)->vec_dot(w + i * wrb, xq + j * xrb, n);
                    const double got = a5->vec_dot(w + i * wrb, xq + j * xrb, n);
                    const double tol = dot_tol(type, n, dot_magnitude(type, w + i * wrb, at, xq + j * xrb, n));
                    if (!(fabs(got - want) <= tol))
                        FAIL("%s n=%lld (%d, %d): %.9g, reference %.9g (tol %.3g)", a5->name,
                             (long long)n, i, j, got, want, tol);
                }
            free(w);
            free(xq);
            free(y);
        }
    }
#else
    SKIP("x86-64 kernels");
#endif
}

/* ---- matmul -------------------------------------------------------------- */

/* Wide tiles: more weight rows than one pass of any kernel takes (16 for
 * AVX-512 Q4_0, 8 and pairs for Q8_0), ragged at the end, and activation
 * rows past the prompt path's pass of 512, all give vec_dot's bits. */
TEST(kernels_tile_wide)
{
    need_simd();
    rng_state r;
    rng_seed(&r, 5151);
    enum { NW = 37 };
    static const int n_xs[] = { 1, 2, 8, 9, 23, 513 };
    static const int types[] = { TT_Q4_0, TT_Q8_0, TT_Q4_1, TT_Q5_0 };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int type = types[k];
        const tensor_traits *a = tensor_type_traits(type), *ref = tensor_type_traits_ref(type);
        if (!a->vec_dot_tile)
            continue;
        const int at = ref->vec_dot_type, NX = 513;
        const int64_t n = 9 * ref->block_size;
        const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
        const size_t prb = tensor_tile_x_bytes(a, n);
        uint8_t *w = xmalloc(wrb * NW), *xq = xmalloc(xrb * NX), *xt = xmalloc(prb * NX);
        float *x = xmalloc((size_t)n * sizeof(float)), *y = xmalloc(sizeof(float) * NW * NX);
        float *want = xmalloc(sizeof(float) * NW * NX);
        for (int i = 0; i < NW; i++)
            make_weights(&r, type, n, i % 3 == 1, 1.0f, i % 2 ? 0.2f : 0.0f, w + i * wrb);
        for (int j = 0; j < NX; j++) {
            fill_normal(&r, x, n, 1.0f, j % 5 == 1 ? 0.5f : 0.0f);
            tensor_type_traits_ref(at)->from_float(x, xq + j * xrb, n);
            if (a->tile_x_block_bytes)
                a->tile_x_prep(xq + j * xrb, xt + j * prb, n);
            else
                memcpy(xt + j * prb, xq + j * xrb, xrb);
            for (int i = 0; i < NW; i++)
                want[j * NW + i] = a->vec_dot(w + i * wrb, xq + j * xrb, n);
        }
        for (int j = 0; j < NX; j += 97)
            for (int i = 0; i < NW; i += 5) {
                const double v = ref->vec_dot(w + i * wrb, xq + j * xrb, n);
                const double tol = dot_tol(type, n, dot_magnitude(type, w + i * wrb, at, xq + j * xrb, n));
                if (!(fabs(want[j * NW + i] - v) <= tol))
                    FAIL("%s vec_dot (%d, %d): %.9g, reference %.9g (tol %.3g)", a->name, i, j,
                         want[j * NW + i], v, tol);
            }
        for (size_t c = 0; c < sizeof n_xs / sizeof n_xs[0]; c++) {
            const int n_x = n_xs[c];
            for (int i = 0; i < NW * NX; i++)
                y[i] = -1.0f;
            a->vec_dot_tile(n, w, wrb, NW, xt, prb, n_x, y, NW);
            for (int j = 0; j < NX; j++)
                for (int i = 0; i < NW; i++) {
                    const float got = y[j * NW + i];
                    if (j >= n_x ? got != -1.0f : fp32_bits(got) != fp32_bits(want[j * NW + i]))
                        FAIL("%s tile %d x %d: output (%d, %d) is %.9g, vec_dot %.9g", a->name,
                             NW, n_x, i, j, got, j >= n_x ? -1.0f : want[j * NW + i]);
                }
        }
        free(want);
        free(w);
        free(xq);
        free(xt);
        free(x);
        free(y);
    }
}

#if defined(__x86_64__)
/* Activation rows for the comparison below: quantised normal rows, and
 * row 1 at the extreme: Q8_K every byte -128 (the most negative an int8
 * holds, with the bsums to match: the edge of the 16-bit pair sums), Q8_0
 * -127 (its quantiser's least; the AVX2 sign trick takes no -128). */
static void activation_rows(rng_state *r, int at, int64_t n, int n_x, uint8_t *xq)
{
    const size_t xrb = tensor_row_bytes(at, n);
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int j = 0; j < n_x; j++) {
        fill_normal(r, x, n, j % 3 == 2 ? 0.05f : 1.0f, j % 4 == 3 ? 0.5f : 0.0f);
        tensor_type_traits_ref(at)->from_float(x, xq + (size_t)j * xrb, n);
    }
    free(x);
    if (n_x < 2)
        return;
    uint8_t *row = xq + xrb;
    if (at == TT_Q8_K) {
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q8_K *k = (block_q8_K *)row + b;
            memset(k->qs, 0x80, sizeof k->qs);
            for (int s = 0; s < QK_K / 16; s++)
                k->bsums[s] = -128 * 16;
        }
    } else if (at == TT_Q8_0) {
        for (int64_t b = 0; b < n / QK8_0; b++)
            memset(((block_q8_0 *)row + b)->qs, 0x81, QK8_0);
    }
}

/* The AVX-512 dot products that promise the AVX2 kernels' bits (their
 * files say so: the same float steps per output, only the exact integer
 * sums formed otherwise) give them: vec_dot for every pair of rows, and the
 * tile for 1..33 activation rows and, with one activation row, any number of
 * weight rows (the passes of 8 and 16 and their ragged ends), at lengths of
 * 1 to 9 super-blocks, on quantiser output and on random levels and scales.
 * Both sets are built here side by side, whatever RACIMO_KERNELS chose. */
TEST(kernels_avx512_bits_are_avx2)
{
    if (!(cpu_has(CPU_AVX2) && cpu_has(CPU_FMA) && cpu_has(CPU_F16C) && cpu_has(CPU_AVX512F) &&
          cpu_has(CPU_AVX512BW) && cpu_has(CPU_AVX512VL) && cpu_has(CPU_AVX512VNNI)))
        SKIP("this CPU lacks AVX2 or AVX-512 F, BW, VL or VNNI");
    static tensor_traits t2[TT_COUNT], t5[TT_COUNT];
    for (int t = 0; t < TT_COUNT; t++)
        t2[t] = *tensor_type_traits_ref(t);
    tensor__kernels_avx2(t2, cpu_has(CPU_AVX_VNNI));
    memcpy(t5, t2, sizeof t2);
    tensor__kernels_avx512(t5, 1);
    static const int types[] = { TT_Q4_0, TT_Q8_0, TT_Q2_K, TT_Q3_K };
    static const int n_blocks[] = { 1, 2, 3, 5, 9 };
    enum { NW = 19, NX = 33 };
    rng_state r;
    rng_seed(&r, 512);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int type = types[k];
        const tensor_traits *a2 = &t2[type], *a5 = &t5[type], *ref = tensor_type_traits_ref(type);
        CHECK(a5->vec_dot != a2->vec_dot && a5->vec_dot_tile != a2->vec_dot_tile);
        const int at = ref->vec_dot_type;
        for (size_t s = 0; s < sizeof n_blocks / sizeof n_blocks[0]; s++) {
            const int64_t n = n_blocks[s] * QK_K + (ref->block_size == QK_K ? 0 : 3 * ref->block_size);
            const size_t wrb = tensor_row_bytes(type, n), xrb = tensor_row_bytes(at, n);
            const size_t prb = tensor_tile_x_bytes(a5, n);
            uint8_t *w = xmalloc(wrb * NW), *xq = xmalloc(xrb * NX), *xt = xmalloc(prb * NX);
            float *want = xmalloc(sizeof(float) * NW * NX), *y = xmalloc(sizeof(float) * NW * NX);
            for (int i = 0; i < NW; i++)
                make_weights(&r, type, n, i % 2 == 1, 1.0f, i % 3 == 1 ? 0.3f : 0.0f, w + i * wrb);
            activation_rows(&r, at, n, NX, xq);
            for (int j = 0; j < NX; j++) {
                if (a5->tile_x_block_bytes)
                    a5->tile_x_prep(xq + j * xrb, xt + j * prb, n);
                else
                    memcpy(xt + j * prb, xq + j * xrb, xrb);
                for (int i = 0; i < NW; i++) {
                    const uint8_t *wi = w + i * wrb, *xj = xq + j * xrb;
                    want[j * NW + i] = a2->vec_dot(wi, xj, n);
                    const float got = a5->vec_dot(wi, xj, n);
                    if (fp32_bits(got) != fp32_bits(want[j * NW + i]))
                        FAIL("%s n %lld: AVX-512 vec_dot (%d, %d) is %.9g, AVX2 %.9g", ref->name,
                             (long long)n, i, j, got, want[j * NW + i]);
                    const double tol = dot_tol(type, n, dot_magnitude(type, wi, at, xj, n));
                    const double rv = ref->vec_dot(wi, xj, n);
                    if (!(fabs(got - rv) <= tol))
                        FAIL("%s n %lld: vec_dot (%d, %d) is %.9g, reference %.9g (tol %.3g)",
                             ref->name, (long long)n, i, j, got, rv, tol);
                }
            }
            /* n_x activation rows against all weight rows; and one
             * activation row against the first n_w weight rows */
            for (int pass = 0; pass < 2; pass++)
                for (int c = 1; c <= (pass ? NW : NX); c++) {
                    const int n_w = pass ? c : NW, n_x = pass ? 1 : c;
                    for (int i = 0; i < NW * NX; i++)
                        y[i] = -1.0f;
                    a5->vec_dot_tile(n, w, wrb, n_w, xt, prb, n_x, y, NW);
                    for (int j = 0; j < NX; j++)
                        for (int i = 0; i < NW; i++) {
                            const int in = i < n_w && j < n_x;
                            const float got = y[j * NW + i], exp = in ? want[j * NW + i] : -1.0f;
                            if (fp32_bits(got) != fp32_bits(exp))
                                FAIL("%s n %lld, tile %d x %d: output (%d, %d) is %.9g, %s %.9g",
                                     ref->name, (long long)n, n_w, n_x, i, j, got,
                                     in ? "AVX2 vec_dot" : "untouched", exp);
                        }
                }
            free(w);
            free(xq);
            free(xt);
            free(want);
            free(y);
        }
    }
}
#endif

/* Runs W (n_out x n) times n_rows random rows in `mode` on 1, 2 and 3
 * threads; checks identical bits and, against per-pair reference dots,
 * the tolerance. */
static void check_matmul(rng_state *r, int type, int64_t n, int n_out, int n_rows, int mode)
{
    const tensor_traits *ref = tensor_type_traits_ref(type);
    const size_t wrb = tensor_row_bytes(type, n);
    uint8_t *wdata = xmalloc(wrb * (size_t)n_out);
    for (int o = 0; o < n_out; o++)
        make_weights(r, type, n, o % 4 == 3, 1.0f, o % 3 == 1 ? 0.25f : 0.0f, wdata + (size_t)o * wrb);
    tensor W = { .data = wdata, .type = type, .n_dims = 2, .ne = { n, n_out, 1, 1 },
                 .row_bytes = wrb, .name = "W" };
    const int ldx = (int)n + 3, ldy = n_out + 2;
    float *X = xmalloc(sizeof(float) * (size_t)ldx * n_rows);
    fill_normal(r, X, (int64_t)ldx * n_rows, 1.0f, 0.0f);
    float *Y[3];
    const size_t scratch_bytes = matmul_scratch_bytes(&W, n_rows, mode);
    void *scratch = NULL;
    if (posix_memalign(&scratch, 64, scratch_bytes ? scratch_bytes : 64))
        FAIL("out of memory");
    for (int t = 0; t < 3; t++) {
        thread_pool *pool = pool_new(t + 1);
        CHECK(pool != NULL);
        Y[t] = xmalloc(sizeof(float) * (size_t)ldy * n_rows);
        for (size_t i = 0; i < (size_t)ldy * n_rows; i++)
            Y[t][i] = -1.0f;                  /* the gaps between rows stay */
        matmul(pool, &W, X, ldx, n_rows, Y[t], ldy, mode, scratch);
        pool_free(pool);
    }
    const int at = mode == MATMUL_EXACT ? TT_F32 : ref->vec_dot_type;
    const size_t xrb = tensor_row_bytes(at, n);
    uint8_t *xq = xmalloc(xrb);
    const char *what = mode == MATMUL_EXACT ? "exact" : "fast";
    for (int j = 0; j < n_rows; j++) {
        const float *xj = X + (size_t)j * ldx;
        if (mode == MATMUL_FAST)
            tensor_type_traits_ref(at)->from_float(xj, xq, n);
        else
            memcpy(xq, xj, xrb);
        for (int o = 0; o < ldy; o++) {
            const size_t idx = (size_t)j * ldy + o;
            for (int t = 1; t < 3; t++)
                if (fp32_bits(Y[t][idx]) != fp32_bits(Y[0][idx]))
                    FAIL("%s %s matmul %dx%lld rows %d: output (%d, %d) on %d threads is %.9g, "
                         "on 1 thread %.9g", ref->name, what, n_out, (long long)n, n_rows, o, j,
                         t + 1, Y[t][idx], Y[0][idx]);
            if (o >= n_out) {
                CHECK(Y[0][idx] == -1.0f);
                continue;
            }
            const uint8_t *wo = wdata + (size_t)o * wrb;
            const double want = mode == MATMUL_EXACT ? ref->dot_f32(wo, xj, n)
                                                     : ref->vec_dot(wo, xq, n);
            const double tol = dot_tol(type, n, dot_magnitude(type, wo, at, xq, n));
            if (!(fabs(Y[0][idx] - want) <= tol))
                FAIL("%s %s matmul %dx%lld rows %d: output (%d, %d) is %.9g, reference %.9g "
                     "(tol %.3g)", ref->name, what, n_out, (long long)n, n_rows, o, j,
                     Y[0][idx], want, tol);
        }
    }
    for (int t = 0; t < 3; t++)
        free(Y[t]);
    free(xq);
    free(X);
    free(wdata);
    free(scratch);
}

TEST_T(kernels_matmul_shapes_threads, 240)
{
    tensor_kernels_init();   /* runs with whichever kernels the CPU has */
    /* outs: ragged groups of 8 and 16 weight rows (the AVX-512 kernels
     * take 16 or, for Q8_0, pairs and eights); rows: the few-row kernels,
     * their edge, and packed passes with ragged ends */
    static const int rows[] = { 1, 2, 3, 5, 9, 17, 33 };
    static const int outs[] = { 1, 7, 37, 64, 129 };
    rng_state r;
    rng_seed(&r, 8);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const int64_t bs = tensor_type_traits_ref(type)->block_size;
        const int64_t n = bs > 1 ? (bs == 32 ? 7 * bs : 2 * bs) : 45;
        for (size_t a = 0; a < sizeof rows / sizeof rows[0]; a++)
            for (size_t b = 0; b < sizeof outs / sizeof outs[0]; b++)
                check_matmul(&r, type, n, outs[b], rows[a], MATMUL_FAST);
        check_matmul(&r, type, n, 7, 3, MATMUL_EXACT);
        check_matmul(&r, type, n, 129, 1, MATMUL_EXACT);
    }
}

/* Rows longer than the one-row stack buffer take the shared scratch. */
TEST(kernels_matmul_long_rows)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 12);
    check_matmul(&r, TT_Q8_0, 32 * 1100, 7, 1, MATMUL_FAST);
    check_matmul(&r, TT_Q4_K, 256 * 130, 5, 1, MATMUL_FAST);
    check_matmul(&r, TT_Q4_0, 32 * 1100, 9, 2, MATMUL_FAST);
}

/* A row's result does not depend on the batch it comes in: one row alone
 * gives the same bits as that row among others (what lets a server batch
 * requests without changing any of them). */
TEST(kernels_matmul_batch_invariant)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 77);
    thread_pool *pool = pool_new(2);
    CHECK(pool != NULL);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const tensor_traits *tt = tensor_type_traits(type);
        const int64_t n = tt->block_size > 1 ? 2 * QK_K : 67;
        const int n_out = 37, n_rows = 9;
        const size_t wrb = tensor_row_bytes(type, n);
        uint8_t *wdata = xmalloc(wrb * n_out);
        for (int o = 0; o < n_out; o++)
            make_weights(&r, type, n, o % 3 == 2, 1.0f, 0.0f, wdata + (size_t)o * wrb);
        tensor W = { .data = wdata, .type = type, .n_dims = 2, .ne = { n, n_out, 1, 1 },
                     .row_bytes = wrb, .name = "W" };
        float *X = xmalloc(sizeof(float) * (size_t)n * n_rows);
        fill_normal(&r, X, n * n_rows, 1.0f, 0.0f);
        float *Yb = xmalloc(sizeof(float) * (size_t)n_out * n_rows), *Y1 = xmalloc(sizeof(float) * n_out);
        void *scratch = xmalloc(matmul_scratch_bytes(&W, n_rows, MATMUL_FAST) + 64);
        matmul(pool, &W, X, (int)n, n_rows, Yb, n_out, MATMUL_FAST, scratch);
        for (int j = 0; j < n_rows; j++) {
            matmul(pool, &W, X + (size_t)j * n, (int)n, 1, Y1, n_out, MATMUL_FAST, scratch);
            for (int o = 0; o < n_out; o++)
                if (fp32_bits(Y1[o]) != fp32_bits(Yb[(size_t)j * n_out + o]))
                    FAIL("%s: row %d output %d alone %.9g, in a batch of %d %.9g", tt->name, j, o,
                         Y1[o], n_rows, Yb[(size_t)j * n_out + o]);
        }
        free(scratch);
        free(Y1);
        free(Yb);
        free(X);
        free(wdata);
    }
    pool_free(pool);
}

/* matmul_batched: every slice of a 3-D tensor against its own rows, with
 * strides (the heads of latent attention), gives each slice's matmul bits,
 * for 1 and several rows, both precisions, on 1 and 3 threads. */
TEST(kernels_matmul_batched_is_matmul)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 31);
    static const int types[] = { TT_F32, TT_BF16, TT_Q8_0, TT_Q5_0, TT_Q4_K };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int type = types[k];
        const int64_t n = type == TT_Q4_K ? QK_K : 64;
        const int n_out = 13, n_mats = 5;
        const size_t wrb = tensor_row_bytes(type, n);
        uint8_t *wdata = xmalloc(wrb * (size_t)(n_out * n_mats));
        for (int o = 0; o < n_out * n_mats; o++)
            make_weights(&r, type, n, 0, 1.0f, 0.0f, wdata + (size_t)o * wrb);
        tensor W = { .data = wdata, .type = type, .n_dims = 3, .ne = { n, n_out, n_mats, 1 },
                     .row_bytes = wrb, .name = "W" };
        for (int n_rows = 1; n_rows <= 6; n_rows += 5)
            for (int mode = MATMUL_FAST; mode <= MATMUL_EXACT; mode++)
                for (int nth = 1; nth <= 3; nth += 2) {
                    /* rows of n_mats heads: [row][head][n], out [row][head][n_out + 1] */
                    const int ldx = (int)n * n_mats, ldy = (n_out + 1) * n_mats;
                    float *X = xmalloc(sizeof(float) * (size_t)ldx * n_rows);
                    float *Yb = xmalloc(sizeof(float) * (size_t)ldy * n_rows);
                    float *Y1 = xmalloc(sizeof(float) * (size_t)ldy * n_rows);
                    fill_normal(&r, X, (int64_t)ldx * n_rows, 1.0f, 0.0f);
                    void *scratch = xmalloc(matmul_scratch_bytes(&W, n_rows * n_mats, mode) + 64);
                    thread_pool *pool = pool_new(nth);
                    matmul_batched(pool, &W, n_mats, X, ldx, (size_t)n, n_rows, Yb, ldy,
                                   (size_t)n_out + 1, mode, scratch);
                    for (int j = 0; j < n_mats; j++) {
                        tensor w = tensor_slice2(&W, j);
                        matmul(pool, &w, X + (size_t)j * n, ldx, n_rows, Y1 + (size_t)j * (n_out + 1),
                               ldy, mode, scratch);
                    }
                    for (int row = 0; row < n_rows; row++)
                        for (int j = 0; j < n_mats; j++)
                            for (int o = 0; o < n_out; o++) {
                                size_t at = (size_t)row * ldy + (size_t)j * (n_out + 1) + o;
                                if (fp32_bits(Yb[at]) != fp32_bits(Y1[at]))
                                    FAIL("%s rows %d mode %d threads %d: slice %d out %d: batched "
                                         "%.9g, alone %.9g", tensor_type_name(type), n_rows, mode,
                                         nth, j, o, Yb[at], Y1[at]);
                            }
                    pool_free(pool);
                    free(scratch); free(X); free(Yb); free(Y1);
                }
        free(wdata);
    }
}

/* ---- attention and SwiGLU -------------------------------------------------- */

/* The active attention (SIMD when the CPU has it) against the reference, on
 * f32 and f16 caches, at widths on and off the 8-float grid, group sizes
 * 1-8, cache strides wider than a head, position counts around the 8-position step and the tiles,
 * and scores from flat to peaked (scale 0.01 to 30). */
TEST(kernels_attend_vs_ref)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 41);
    static const int dims[][2] = { { 64, 64 }, { 128, 128 }, { 8, 16 }, { 72, 40 }, { 20, 12 } };
    static const int groups[] = { 1, 3, 4, 8 };
    static const int lens[] = { 1, 7, 8, 9, 127, 129, 300 };
    static const float scales[] = { 0.01f, 0.125f, 30.0f };
    int checked = 0;
    for (int ti = 0; ti < 2; ti++)
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
                    const int D = dims[di][0], Dv = dims[di][1], G = groups[gi], n = lens[li];
                    const size_t ks = (size_t)D * 3 + 8, vs = (size_t)Dv * 2 + 8;
                    float *q = xmalloc(sizeof(float) * G * D), *k = xmalloc(sizeof(float) * ks * n);
                    float *v = xmalloc(sizeof(float) * vs * n);
                    float *s1 = xmalloc(sizeof(float) * G * n), *s2 = xmalloc(sizeof(float) * G * n);
                    float *o1 = xmalloc(sizeof(float) * G * Dv), *o2 = xmalloc(sizeof(float) * G * Dv);
                    for (int i = 0; i < G * D; i++)
                        q[i] = rng_normal(&r);
                    for (size_t i = 0; i < ks * (size_t)n; i++)
                        k[i] = rng_normal(&r);
                    for (size_t i = 0; i < vs * (size_t)n; i++)
                        v[i] = rng_normal(&r);
                    double top = 0;     /* the largest |score| */
                    for (int g = 0; g < G; g++)
                        for (int p = 0; p < n; p++) {
                            double dot = 0;
                            for (int i = 0; i < D; i++)
                                dot += (double)q[g * D + i] * k[(size_t)p * ks + i];
                            top = fmax(top, fabs(dot * scales[si]));
                        }
                    /* the cache as f32, or rounded to f16 (both sides read the same) */
                    const int type = ti ? TT_F16 : TT_F32;
                    uint16_t *k16 = xmalloc(sizeof(uint16_t) * ks * n), *v16 = xmalloc(sizeof(uint16_t) * vs * n);
                    for (size_t i = 0; i < ks * (size_t)n; i++)
                        k16[i] = fp32_to_fp16(k[i]);
                    for (size_t i = 0; i < vs * (size_t)n; i++)
                        v16[i] = fp32_to_fp16(v[i]);
                    const void *kc = ti ? (const void *)k16 : k, *vc = ti ? (const void *)v16 : v;
                    tensor_attend_ref(q, G, D, Dv, scales[si], type, kc, ks, vc, vs, n, s1, o1);
                    tensor_attend(q, G, D, Dv, scales[si], type, kc, ks, vc, vs, n, s2, o2);
                    free(k16);
                    free(v16);
                    /* Outputs are convex combinations of N(0,1) values; a score
                     * summed in another order moves by a few ulp of its size,
                     * and its weight by as much relatively. */
                    const double tol = 2e-5 + 8 * 0x1p-24 * top;
                    for (int i = 0; i < G * Dv; i++) {
                        if (!(fabs(o1[i] - o2[i]) <= tol * (1 + fabs(o1[i]))))
                            FAIL("%s cache, D %d Dv %d group %d positions %d scale %g: out[%d] %.8g, "
                                 "reference %.8g", ti ? "f16" : "f32", D, Dv, G, n, scales[si], i,
                                 o2[i], o1[i]);
                    }
                    checked++;
                    free(q); free(k); free(v); free(s1); free(s2); free(o1); free(o2);
                }
    CHECK_INT(checked, ==, 2 * 5 * 4 * 7 * 3);
}

TEST(kernels_swiglu_vs_ref)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 43);
    static const size_t lens[] = { 1, 7, 8, 9, 1000 };
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const size_t n = lens[li];
        float *a1 = xmalloc(sizeof(float) * n), *a2 = xmalloc(sizeof(float) * n);
        float *b = xmalloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) {
            /* the middle, and past the exponential's clamps both ways */
            a1[i] = i % 5 == 4 ? (i % 2 ? 95.0f : -95.0f) * (float)rng_uniform(&r) : 6 * rng_normal(&r);
            a2[i] = a1[i];
            b[i] = rng_normal(&r);
        }
        tensor_swiglu_ref(a1, b, n);
        tensor_swiglu(a2, b, n);
        for (size_t i = 0; i < n; i++)
            if (!(fabs(a1[i] - a2[i]) <= 1e-6 * fabs(a1[i]) + 1e-30))
                FAIL("n %zu: [%zu] %.9g, reference %.9g", n, i, a2[i], a1[i]);
        free(a1); free(a2); free(b);
    }
}

/* The log-probability normaliser: a vocabulary's logits with -inf (masked
 * by a logit bias), NaN and +inf among them, spread wide and narrow. */
TEST(kernels_sum_exp_vs_ref)
{
    tensor_kernels_init();
    rng_state r;
    rng_seed(&r, 47);
    static const size_t lens[] = { 1, 7, 8, 9, 1000, 151936 };
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (int spread = 1; spread <= 40; spread *= 8) {
            const size_t n = lens[li];
            float *x = xmalloc(sizeof(float) * n), max = -INFINITY;
            for (size_t i = 0; i < n; i++) {
                x[i] = (float)spread * rng_normal(&r);
                if (i % 97 == 3)
                    x[i] = -INFINITY;
                if (x[i] > max)
                    max = x[i];
            }
            double want = tensor_sum_exp_ref(x, n, max), got = tensor_sum_exp(x, n, max);
            if (!(fabs(got - want) <= 1e-6 * want))
                FAIL("n %zu spread %d: %.12g, reference %.12g", n, spread, got, want);
            if (n >= 9) {                       /* NaN counts 0, +inf as FLT_MAX */
                x[2] = NAN;
                x[5] = INFINITY;
                want = tensor_sum_exp_ref(x, n, FLT_MAX);
                got = tensor_sum_exp(x, n, FLT_MAX);
                if (!(fabs(got - want) <= 1e-6 * want) || !(want >= 1.0))
                    FAIL("n %zu with NaN and +inf: %.12g, reference %.12g", n, got, want);
            }
            free(x);
        }
    }
}
