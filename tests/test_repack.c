/* test_repack.c - Q4_0 weights repacked by 8 rows (TT_Q4_0_R8):
 *
 *   - the repack moves bytes only: every row unpacks to its Q4_0 bytes,
 *     and decodes to the same floats;
 *   - the R8 tile kernel gives each output Q4_0's vec_dot bits, for any
 *     number of activation rows (1..33) and any row length, on whole and
 *     partial groups;
 *   - matmul of R8 weights equals matmul of the Q4_0 ones, fast and exact;
 *   - a model loaded with and without repacking gives identical logits
 *     (Q4_0, Q4_K, and Q8_0 and Q4_K_M with their outputs tied to the
 *     embedding or not);
 *   - no GGUF file can carry the in-memory type number;
 *   - racimo bench says what it repacked.
 */
#include "test.h"

#include <jansson.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"
#include "infer/shard_group.h"
#include "model/gguf.h"
#include "cli_util.h"
#include "model_util.h"
#include "tensor/fp16.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/q6k_r8.h"
#include "tensor/q8_0_r8.h"
#include "tensor/repack.h"
#include "tensor/types.h"

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

/* Q4_0 rows of random levels, with scales of varied size (some rows
 * quantised from normal values, so real-looking blocks occur too). */
static void make_q4_0(rng_state *r, int64_t n, int64_t rows, uint8_t *out)
{
    const size_t rb = tensor_row_bytes(TT_Q4_0, n);
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        uint8_t *row = out + (size_t)i * rb;
        if (i % 3 == 0) {
            for (int64_t k = 0; k < n; k++)
                x[k] = rng_normal(r);
            tensor_type_traits_ref(TT_Q4_0)->from_float(x, row, n);
            continue;
        }
        for (size_t k = 0; k < rb; k++)
            row[k] = (uint8_t)rng_next(r);
        for (int64_t b = 0; b < n / 32; b++) {
            const fp16_t d = fp32_to_fp16((float)(0.5 + rng_uniform(r)) / (i % 3 == 1 ? 64.0f : 3.0f));
            memcpy(row + (size_t)b * sizeof(block_q4_0), &d, sizeof d);
        }
    }
    free(x);
}

static const int64_t lengths[] = { 32, 64, 96, 2048 + 32 };
static const int64_t row_counts[] = { 8, 16, 24, 64 };

TEST(repack_round_trip)
{
    rng_state r;
    rng_seed(&r, 808);
    for (size_t a = 0; a < sizeof lengths / sizeof lengths[0]; a++)
        for (size_t c = 0; c < sizeof row_counts / sizeof row_counts[0]; c++) {
            const int64_t n = lengths[a], rows = row_counts[c];
            const size_t rb = tensor_row_bytes(TT_Q4_0, n);
            CHECK_INT(tensor_row_bytes(TT_Q4_0_R8, n), ==, rb);
            uint8_t *q = xmalloc(rb * rows), *p = xmalloc(rb * rows), *back = xmalloc(rb);
            float *want = xmalloc((size_t)n * sizeof(float)), *got = xmalloc((size_t)n * sizeof(float));
            make_q4_0(&r, n, rows, q);
            tensor_q4_0_r8_pack(q, p, n, rows);
            for (int64_t i = 0; i < rows; i++) {
                const uint8_t *group = p + (size_t)(i / 8) * 8 * rb;
                tensor_q4_0_r8_unpack_row(group, (int)(i % 8), back, n);
                if (memcmp(back, q + (size_t)i * rb, rb))
                    FAIL("n %lld, %lld rows: row %lld does not unpack to its bytes",
                         (long long)n, (long long)rows, (long long)i);
                tensor_type_traits_ref(TT_Q4_0)->to_float(q + (size_t)i * rb, want, n);
                tensor_row_to_float(TT_Q4_0_R8, p, rb, i, got, n);
                for (int64_t k = 0; k < n; k++)
                    if (fp32_bits(got[k]) != fp32_bits(want[k]))
                        FAIL("n %lld: row %lld element %lld decodes to %.9g, Q4_0 %.9g",
                             (long long)n, (long long)i, (long long)k, got[k], want[k]);
            }
            free(q); free(p); free(back); free(want); free(got);
        }
}

static void need_r8(void)
{
    if (!tensor_q4_0_r8_available())
        SKIP("the active kernels (%s) have no Q4_0_R8 tile kernel", tensor_kernels_name());
}

TEST(repack_tile_equals_q4_0_vec_dot)
{
    need_r8();
    enum { NX = 33 };
    const tensor_traits *q4 = tensor_type_traits(TT_Q4_0), *r8 = tensor_type_traits(TT_Q4_0_R8);
    const tensor_traits *q8 = tensor_type_traits_ref(TT_Q8_0);
    CHECK_INT(r8->vec_dot_type, ==, TT_Q8_0);
    rng_state r;
    rng_seed(&r, 909);
    for (size_t a = 0; a < sizeof lengths / sizeof lengths[0]; a++) {
        const int64_t n = lengths[a];
        const size_t rb = tensor_row_bytes(TT_Q4_0, n), xrb = tensor_row_bytes(TT_Q8_0, n);
        const size_t prb = tensor_tile_x_bytes(r8, n);
        uint8_t *xq = xmalloc(xrb * NX), *xt = xmalloc(prb * NX);
        float *x = xmalloc((size_t)n * sizeof(float));
        for (int j = 0; j < NX; j++) {
            for (int64_t k = 0; k < n; k++)
                x[k] = rng_normal(&r) + (j % 4 == 1 ? 0.5f : 0.0f);
            q8->from_float(x, xq + j * xrb, n);
            r8->tile_x_prep(xq + j * xrb, xt + j * prb, n);
        }
        for (size_t c = 0; c < sizeof row_counts / sizeof row_counts[0]; c++) {
            const int rows = (int)row_counts[c];
            uint8_t *q = xmalloc(rb * rows), *p = xmalloc(rb * rows);
            float *y = xmalloc(sizeof(float) * (size_t)rows * NX);
            make_q4_0(&r, n, rows, q);
            tensor_q4_0_r8_pack(q, p, n, rows);
            /* every count of activation rows; the whole matrix, and a
             * partial last group (rows - 3) */
            for (int n_x = 1; n_x <= NX; n_x++)
                for (int part = 0; part < 2; part++) {
                    const int n_w = part ? rows - 3 : rows;
                    for (int i = 0; i < rows * NX; i++)
                        y[i] = -1.0f;
                    r8->vec_dot_tile(n, p, rb, n_w, xt, prb, n_x, y, (size_t)rows);
                    for (int j = 0; j < NX; j++)
                        for (int i = 0; i < rows; i++) {
                            const float got = y[j * rows + i];
                            if (j >= n_x || i >= n_w) {
                                if (got != -1.0f)
                                    FAIL("tile %d x %d wrote output (%d, %d)", n_w, n_x, i, j);
                                continue;
                            }
                            const float want = q4->vec_dot(q + (size_t)i * rb, xq + j * xrb, n);
                            if (fp32_bits(got) != fp32_bits(want))
                                FAIL("n %lld, tile %d x %d: output (%d, %d) is %.9g, Q4_0 "
                                     "vec_dot %.9g", (long long)n, n_w, n_x, i, j, got, want);
                        }
                }
            free(q); free(p); free(y);
        }
        free(xq); free(xt); free(x);
    }
}

/* The matrix product on R8 weights gives the Q4_0 product's bits, in
 * fast mode (the tile kernel) and in exact mode (rows unpacked). */
TEST(repack_matmul_equals_q4_0)
{
    need_r8();
    rng_state r;
    rng_seed(&r, 1010);
    thread_pool *pool = pool_new(2);
    CHECK(pool != NULL);
    const int64_t n = 256;
    const int n_out = 72;
    const int batches[] = { 1, 2, 5, 8, 17, 40 };
    const size_t rb = tensor_row_bytes(TT_Q4_0, n);
    uint8_t *q = xmalloc(rb * n_out), *p = xmalloc(rb * n_out);
    make_q4_0(&r, n, n_out, q);
    tensor_q4_0_r8_pack(q, p, n, n_out);
    tensor Wq = { .data = q, .type = TT_Q4_0, .n_dims = 2, .ne = { n, n_out, 1, 1 },
                  .row_bytes = rb, .name = "q" };
    tensor Wp = Wq;
    Wp.data = p;
    Wp.type = TT_Q4_0_R8;
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++)
        for (int mode = MATMUL_FAST; mode <= MATMUL_EXACT; mode++) {
            const int rows = batches[b];
            float *x = xmalloc(sizeof(float) * (size_t)n * rows);
            float *y0 = xmalloc(sizeof(float) * (size_t)n_out * rows);
            float *y1 = xmalloc(sizeof(float) * (size_t)n_out * rows);
            for (int64_t k = 0; k < n * rows; k++)
                x[k] = rng_normal(&r);
            size_t sb = matmul_scratch_bytes(&Wq, rows, mode);
            CHECK_INT(matmul_scratch_bytes(&Wp, rows, mode), ==, sb);
            void *scratch = xmalloc(sb);
            matmul(pool, &Wq, x, (int)n, rows, y0, n_out, mode, scratch);
            matmul(pool, &Wp, x, (int)n, rows, y1, n_out, mode, scratch);
            for (int i = 0; i < n_out * rows; i++)
                if (fp32_bits(y0[i]) != fp32_bits(y1[i]))
                    FAIL("%s, %d rows: output %d is %.9g repacked, %.9g not",
                         mode == MATMUL_EXACT ? "exact" : "fast", rows, i, y1[i], y0[i]);
            free(x); free(y0); free(y1); free(scratch);
        }
    free(q);
    free(p);
    pool_free(pool);
}

/* Logits of `n` tokens through a whole-model stage. */
static void run_model(const char *path, int precision, const int32_t *tok, int n, float *out,
                      int *n_repacked)
{
    model *m;
    stage *s;
    test_open_stage(path, 0, -1, precision, 64, 1, n, 2, &m, &s);
    *n_repacked = m->n_repacked;
    /* prompt in chunks of 5 (batched rows), then one row at a time */
    test_run_tokens(s, tok, n, 0, 0, 5, out);
    stage_free(s);
    model_free(m);
}

TEST_T(repack_model_logits_identical, 180)
{
    need_r8();
    enum { N = 12 };
    static const int types[] = { TT_Q4_0, TT_Q4_K };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const char *path = test_make_model("tiny", types[k], NULL);
        int32_t tok[N];
        for (int i = 0; i < N; i++)
            tok[i] = (int32_t)((i * 37 + 11) % 200);
        model *m;
        CHECK_OK(model_load(path, 0, -1, &m));
        const int V = m->hp.n_vocab;
        model_free(m);
        float *a = xmalloc(sizeof(float) * N * V), *b = xmalloc(sizeof(float) * N * V);
        for (int precision = MATMUL_FAST; precision <= MATMUL_EXACT; precision++) {
            int na, nb;
            setenv("RACIMO_REPACK", "0", 1);
            run_model(path, precision, tok, N, a, &na);
            unsetenv("RACIMO_REPACK");
            run_model(path, precision, tok, N, b, &nb);
            CHECK_INT(na, ==, 0);
            CHECK_INT(nb, >, 0);
            for (int i = 0; i < N * V; i++)
                if (fp32_bits(a[i]) != fp32_bits(b[i]))
                    FAIL("%s %s: logit %d of token %d is %.9g repacked, %.9g not",
                         tensor_type_name(types[k]), precision == MATMUL_EXACT ? "exact" : "fast",
                         i % V, i / V, b[i], a[i]);
        }
        free(a);
        free(b);
    }
}

static int fill_zero(void *ctx, uint64_t index, void *dst, uint64_t size)
{
    (void)ctx; (void)index;
    memset(dst, 0, size);
    return 0;
}

TEST(repack_type_not_in_files)
{
    CHECK(!tensor_type_supported(TT_Q4_0_R8));
    gguf_writer *w = gguf_writer_new();
    CHECK(w != NULL);
    static const int64_t ne[2] = { 64, 8 };
    CHECK_INT(gguf_writer_add_tensor(w, "w8probe", TT_Q4_0_R8, 2, ne), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "in-memory layout"));
    CHECK_OK(gguf_writer_add_tensor(w, "w8probe", TT_Q4_0, 2, ne));
    uint8_t *buf;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, fill_zero, NULL, &buf, &size));
    gguf_writer_free(w);
    /* the tensor info: name, n_dims (u32), 2 dims (u64), then the type */
    uint8_t *at = memmem(buf, size, "w8probe", 7);
    CHECK(at != NULL);
    uint8_t *type = at + 7 + 4 + 2 * 8;
    uint32_t t;
    memcpy(&t, type, 4);
    CHECK_INT(t, ==, TT_Q4_0);
    t = TT_Q4_0_R8;
    memcpy(type, &t, 4);
    gguf_file *f = NULL;
    CHECK_INT(gguf_parse(buf, size, "r8.gguf", &f), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "Q4_0_R8") && strstr(rc_errmsg(), "no GGUF file holds it"));
    rc_free(buf);
}

/* Logits of a prompt of n tokens on `n_ranks` tensor-parallel shards. */
static void run_shards(const char *path, int n_ranks, const int32_t *tok, int n, float *out,
                       int *n_repacked)
{
    stage_params sp = { .n_ctx = 64, .n_seq = 1, .n_batch = n, .n_threads = 1,
                        .precision = MATMUL_FAST };
    shard_group *g;
    CHECK_OK(shard_group_new(path, n_ranks, &sp, false, &g));
    *n_repacked = 0;
    for (int r = 0; r < n_ranks; r++) {
        const model *m = shard_group_model(g, r);
        *n_repacked += m->n_repacked;
        /* the column cuts (owned copies, repacked in place) too */
        if (m->n_repacked)
            CHECK(m->layers[0].w_down.type == TT_Q4_0_R8 && m->layers[0].wo.type == TT_Q4_0_R8 &&
                  m->layers[0].w_down.ne[0] < m->hp.n_ff);
    }
    int32_t pos[64], seq[64];
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        seq[i] = 0;
    }
    const stage_batch b = { .n_rows = n, .token = tok, .pos = pos, .seq = seq };
    int n_out = 0;
    CHECK_OK(shard_group_forward(g, &b, out, &n_out));
    CHECK_INT(n_out, ==, n);
    shard_group_free(g);
}

/* Shards repack their own cuts: row slices copied (their first row need
 * not be a multiple of 8 in the file), column cuts rearranged in place. */
TEST_T(repack_shards_logits_identical, 180)
{
    need_r8();
    enum { N = 7 };
    const char *path = test_make_model("tiny", TT_Q4_0, NULL);
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 53 + 5) % 200);
    model *m;
    CHECK_OK(model_load(path, 0, -1, &m));
    const int V = m->hp.n_vocab;
    model_free(m);
    float *a = xmalloc(sizeof(float) * N * V), *b = xmalloc(sizeof(float) * N * V);
    int na, nb;
    setenv("RACIMO_REPACK", "0", 1);
    run_shards(path, 2, tok, N, a, &na);
    unsetenv("RACIMO_REPACK");
    run_shards(path, 2, tok, N, b, &nb);
    CHECK_INT(na, ==, 0);
    CHECK_INT(nb, >, 0);
    for (int i = 0; i < N * V; i++)
        if (fp32_bits(a[i]) != fp32_bits(b[i]))
            FAIL("logit %d of token %d is %.9g repacked, %.9g not", i % V, i / V, b[i], a[i]);
    free(a);
    free(b);
}

/* racimo bench says whether the weights were repacked. */
TEST_T(repack_bench_reports, 120)
{
    need_r8();
    const char *mpath = test_make_model("tiny", TT_Q4_0, NULL);
    char cmd[16384], out[65536];
    for (int off = 0; off < 2; off++) {
        snprintf(cmd, sizeof cmd, "%s%s bench -m %s -p 4 -n 2 -t 1 --reps 1 --json 2>/dev/null",
                 off ? "RACIMO_REPACK=0 " : "", test_bin(), mpath);
        CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
        json_t *j = json_loads(out, 0, NULL);
        CHECK(j != NULL);
        const long long n = json_integer_value(json_object_get(j, "repacked_matrices"));
        CHECK(off ? n == 0 : n > 0);
        CHECK(json_string_value(json_object_get(j, "kernels")) != NULL);
        json_decref(j);
    }
    snprintf(cmd, sizeof cmd, "%s bench -m %s -p 4 -n 2 -t 1 --reps 1 2>/dev/null", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "matrices (Q4_0, Q4_K, Q6_K, Q8_0) repacked at load") != NULL);
}

/* Logits of `n` tokens through a whole-model stage; the model's output
 * and embedding types after loading into *out_type, *embd_type. */
static void run_model_types(const char *path, const int32_t *tok, int n, float *out,
                            int *n_repacked, int *out_type, int *embd_type)
{
    model *m;
    stage *s;
    test_open_stage(path, 0, -1, MATMUL_FAST, 64, 1, n, 2, &m, &s);
    *n_repacked = m->n_repacked;
    *out_type = m->output.type;
    *embd_type = m->tok_embd.type;
    test_run_tokens(s, tok, n, 0, 0, 5, out);
    stage_free(s);
    model_free(m);
}

/* The same logits repacked and not, for an output of its own ("tiny") and
 * one tied to the embedding ("tiny-qwen3"), whose output is of type
 * `out_type` in the file (`type` and `mix` as test_make_model's): the
 * output is repacked into `packed` (the tied one into a copy) while the
 * embedding keeps the file's rows. */
static void output_logits_identical(int type, const char *mix, int out_type, int packed)
{
    enum { N = 11 };
    static const char *presets[] = { "tiny", "tiny-qwen3" };
    for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++) {
        const char *path = test_make_model(presets[k], type, mix);
        int32_t tok[N];
        for (int i = 0; i < N; i++)
            tok[i] = (int32_t)((i * 41 + 7) % 200);
        model *m;
        CHECK_OK(model_load(path, 0, -1, &m));
        const int V = m->hp.n_vocab, embd_type = m->tok_embd.type;
        model_free(m);
        float *a = xmalloc(sizeof(float) * N * V), *b = xmalloc(sizeof(float) * N * V);
        int na, nb, ta, tb, ea, eb;
        setenv("RACIMO_REPACK", "0", 1);
        run_model_types(path, tok, N, a, &na, &ta, &ea);
        unsetenv("RACIMO_REPACK");
        run_model_types(path, tok, N, b, &nb, &tb, &eb);
        CHECK_INT(na, ==, 0);
        CHECK_INT(nb, >, 0);
        CHECK_INT(ta, ==, out_type);
        CHECK_INT(tb, ==, packed);
        CHECK_INT(ea, ==, embd_type);
        CHECK_INT(eb, ==, embd_type);
        for (int i = 0; i < N * V; i++)
            if (fp32_bits(a[i]) != fp32_bits(b[i]))
                FAIL("%s %s: logit %d of token %d is %.9g repacked, %.9g not", presets[k],
                     tensor_type_name(packed), i % V, i / V, b[i], a[i]);
        free(a);
        free(b);
    }
}

TEST_T(repack_q8_model_logits_identical, 180)
{
    if (!tensor_q8_0_r8_available())
        SKIP("the active kernels (%s) have no Q8_0_R8 tile kernel", tensor_kernels_name());
    output_logits_identical(TT_Q8_0, NULL, TT_Q8_0, TT_Q8_0_R8);
}

/* Q4_K_M: the output (tied or not) and a layer's attn_v and ffn_down are
 * Q6_K, the rest Q4_K; all of them repacked. */
TEST_T(repack_q6k_model_logits_identical, 180)
{
    if (!tensor_q6_k_r8_available())
        SKIP("the active kernels (%s) have no Q6_K_R8 tile kernel", tensor_kernels_name());
    output_logits_identical(TT_F32, "Q4_K_M", TT_Q6_K, TT_Q6_K_R8);
}
