/* test_kv_cache.c - the KV cache in each element type (infer/kv_cache.h),
 * a model run over each, and the bytes `racimo plan` and placement count
 * for each (the golden models with a q8_0 cache: test_golden.c). */
#include "test.h"
#include "cli_util.h"
#include "model_util.h"

#include "base/err.h"
#include "base/rng.h"
#include "infer/kv_cache.h"
#include "model/gguf.h"
#include "model/model_size.h"
#include "tensor/kv_types.h"

#include <jansson.h>

TEST(kv_cache_types_store_copy_bytes)
{
    static const int types[] = { TT_F32, TT_F16, TT_Q8_0 };
    /* {heads, k_dim, v_dim}: heads of 64, 80-wide latent rows without values */
    static const int shapes[][3] = { { 2, 64, 64 }, { 1, 80, 0 }, { 3, 40, 24 } };
    rng_state r;
    rng_seed(&r, 5);
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < 3; si++) {
            const int t = types[ti], H = shapes[si][0], K = shapes[si][1], Vd = shapes[si][2];
            const int L = 2, S = 3, C = 10;
            kv_cache kv;
            CHECK_OK(kv_cache_init(&kv, L, S, C, H, K, Vd, t));
            CHECK_INT(kv.k_row, ==, kv_row_bytes(t, (size_t)K));
            CHECK_INT(kv.v_row, ==, kv_row_bytes(t, (size_t)Vd));
            CHECK_INT(kv_cache_bytes(&kv), ==,
                      (size_t)L * S * C * H * (kv_row_bytes(t, (size_t)K) + kv_row_bytes(t, (size_t)Vd)));
            float k[3 * 80], v[3 * 64];
            uint8_t want[80 * sizeof(float)];
            for (int p = 0; p < 6; p++) {
                for (int i = 0; i < H * K; i++)
                    k[i] = rng_normal(&r);
                for (int i = 0; i < H * Vd; i++)
                    v[i] = rng_normal(&r);
                kv_cache_store(&kv, 1, 2, p, k, Vd ? v : NULL);
                kv.len[2] = p + 1;
                for (int h = 0; h < H; h++) {
                    kv_row_from_float(t, k + h * K, want, K);
                    CHECK(!memcmp((uint8_t *)kv_k(&kv, 1, 2, h) + (size_t)p * kv.k_row, want, kv.k_row));
                    if (Vd) {
                        kv_row_from_float(t, v + h * Vd, want, Vd);
                        CHECK(!memcmp((uint8_t *)kv_v(&kv, 1, 2, h) + (size_t)p * kv.v_row, want,
                                      kv.v_row));
                    }
                }
            }
            /* a prefix into another slot, byte for byte */
            kv_cache_copy(&kv, 0, 2, 4);
            CHECK_INT(kv.len[0], ==, 4);
            for (int h = 0; h < H; h++) {
                CHECK(!memcmp(kv_k(&kv, 1, 0, h), kv_k(&kv, 1, 2, h), 4 * kv.k_row));
                if (Vd)
                    CHECK(!memcmp(kv_v(&kv, 1, 0, h), kv_v(&kv, 1, 2, h), 4 * kv.v_row));
            }
            kv_cache_truncate(&kv, 2, 3);
            CHECK_INT(kv.len[2], ==, 3);
            kv_cache_free(&kv);
        }
    kv_cache kv;
    CHECK_INT(kv_cache_init(&kv, 1, 1, 4, 1, 32, 32, TT_BF16), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "f32, f16 or q8_0") != NULL);
}

/* A model over an f16 and a q8_0 cache against the same over an f32 one,
 * teacher-forced: every row of logits keeps its direction (cosine) and
 * nearly always its argmax.  Runs without the golden data, on synthetic
 * models: heads of 32 (a block) and deepseek2's 80-wide latent rows (a
 * padded block). */
static void check_model_over_types(const char *preset)
{
    const char *path = test_make_model(preset, TT_F32, NULL);
    model *m;
    CHECK_OK(model_load(path, 0, -1, &m));
    const int V = m->hp.n_vocab, N = 40;
    int32_t tok[40];
    rng_state r;
    rng_seed(&r, 9);
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(rng_uniform(&r) * V);
    float *rows[3];
    static const int types[] = { TT_F32, TT_F16, TT_Q8_0 };
    for (int ti = 0; ti < 3; ti++) {
        stage_params sp = { .n_ctx = 64, .n_seq = 1, .n_batch = 16, .n_threads = 2,
                            .precision = MATMUL_EXACT, .kv_type = types[ti] };
        stage *s;
        CHECK_OK(stage_new(m, &sp, &s));
        CHECK_INT(stage_kv(s)->type, ==, types[ti]);
        rows[ti] = malloc(sizeof(float) * (size_t)N * V);
        test_run_tokens(s, tok, 24, 0, 0, 8, rows[ti]);                 /* a prompt */
        test_run_tokens(s, tok + 24, N - 24, 0, 24, 1, rows[ti] + (size_t)24 * V);  /* decode */
        stage_free(s);
    }
    for (int ti = 1; ti < 3; ti++) {
        double min_cos = 1;
        int argmax_same = 0;
        for (int p = 0; p < N; p++) {
            const float *a = rows[ti] + (size_t)p * V, *b = rows[0] + (size_t)p * V;
            double ab = 0, aa = 0, bb = 0;
            for (int t = 0; t < V; t++) {
                ab += (double)a[t] * b[t];
                aa += (double)a[t] * a[t];
                bb += (double)b[t] * b[t];
            }
            min_cos = fmin(min_cos, ab / sqrt(aa * bb));
            argmax_same += test_argmax(a, V) == test_argmax(b, V);
        }
        fprintf(stderr, "  %s, %s cache: min row cosine %.6f, argmax %d of %d rows\n", preset,
                kv_type_name(types[ti]), min_cos, argmax_same, N);
        CHECK(min_cos >= (types[ti] == TT_F16 ? 0.99999 : 0.999));
        CHECK_INT(argmax_same, >=, N - 2);
    }
    for (int ti = 0; ti < 3; ti++)
        free(rows[ti]);
    model_free(m);
}

TEST(kv_cache_types_llama) { check_model_over_types("tiny"); }
TEST(kv_cache_types_deepseek2) { check_model_over_types("tiny-deepseek2"); }

static json_t *plan_json(const char *model_path, const char *args, int want_rc)
{
    char cmd[4096], out[16384];
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 256 --parallel 2 --json %s", test_bin(),
             model_path, args);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, want_rc);
    json_t *j = json_loads(out, 0, NULL);
    if (!j)
        FAIL("%s: not JSON: %s", cmd, out);
    return j;
}

/* racimo plan counts the cache in the type asked for (default f16): bytes
 * per token from the heads' row sizes, per stage for 256 x 2 tokens, and a
 * node that holds the model with a q8_0 cache but not with f16 or f32. */
TEST(kv_cache_types_plan_bytes)
{
    static const struct { const char *preset; int heads, k, v; } models[] = {
        { "tiny", 0, 0, 0 }, { "tiny-deepseek2", 1, 80, 0 },
    };
    for (size_t mi = 0; mi < 2; mi++) {
        const char *path = test_make_model(models[mi].preset, TT_Q8_0, NULL);
        gguf_file *f;
        CHECK_OK(gguf_open(path, &f));
        model_sizes ms;
        model_hparams hp;
        CHECK_OK(model_sizes_read(f, &ms));
        CHECK_OK(model_read_hparams(f, &hp));
        gguf_close(f);
        const int H = models[mi].heads ? models[mi].heads : hp.n_head_kv;
        const int K = models[mi].heads ? models[mi].k : hp.head_dim;
        const int Vd = models[mi].heads ? models[mi].v : hp.head_dim_v;
        const uint64_t weights = model_sizes_stage_bytes(&ms, 0, ms.n_layer);
        uint64_t need[3];
        static const char *names[] = { "f32", "f16", "q8_0" };
        static const int types[] = { TT_F32, TT_F16, TT_Q8_0 };
        for (int ti = 0; ti < 3; ti++) {
            const uint64_t per_layer = (uint64_t)H * (kv_row_bytes(types[ti], (size_t)K) +
                                                      kv_row_bytes(types[ti], (size_t)Vd));
            CHECK_OK(model_sizes_set_kv_type(&ms, types[ti]));
            CHECK_INT(ms.kv_bytes_per_token, ==, per_layer);
            char args[200];
            snprintf(args, sizeof args, "--cache-type %s --node a:4G", names[ti]);
            json_t *j = plan_json(path, ti == 1 ? "--node a:4G" : args, 0);   /* f16: default */
            CHECK_STR(json_string_value(json_object_get(j, "kv_cache_type")), names[ti]);
            CHECK_INT(json_integer_value(json_object_get(j, "kv_bytes_per_token")), ==,
                      per_layer * (uint64_t)ms.n_layer);
            json_t *st = json_array_get(json_object_get(j, "stages"), 0);
            CHECK_INT(json_integer_value(json_object_get(st, "kv_bytes")), ==,
                      per_layer * (uint64_t)ms.n_layer * 256 * 2);
            need[ti] = weights + per_layer * (uint64_t)ms.n_layer * 256 * 2;
            CHECK_INT(json_integer_value(json_object_get(j, "need_bytes")), ==, need[ti]);
            json_decref(j);
        }
        CHECK(need[2] < need[1] && need[1] < need[0]);
        fprintf(stderr, "  %s: KV bytes per token and layer f32 %llu, f16 %llu, q8_0 %llu\n",
                models[mi].preset, (unsigned long long)(need[0] - weights) / 512 / ms.n_layer,
                (unsigned long long)(need[1] - weights) / 512 / ms.n_layer,
                (unsigned long long)(need[2] - weights) / 512 / ms.n_layer);
        /* a node between the q8_0 and the f16 need */
        char args[200];
        unsigned long long kib = (unsigned long long)((need[2] + need[1]) / 2 / 1024);
        snprintf(args, sizeof args, "--cache-type q8_0 --node a:%lluK", kib);
        json_decref(plan_json(path, args, 0));
        snprintf(args, sizeof args, "--node a:%lluK", kib);
        json_t *j = plan_json(path, args, 1);
        CHECK(json_is_false(json_object_get(j, "fits")));
        const char *advice = json_string_value(json_object_get(j, "advice"));
        if (!advice || !strstr(advice, "A q8_0 KV cache (--cache-type q8_0: "))
            FAIL("advice without the q8_0 cache: %s", advice ? advice : "(none)");
        json_decref(j);
        model_sizes_free(&ms);
    }
    char cmd[4096], out[4096];
    snprintf(cmd, sizeof cmd, "%s plan -m x.gguf --cache-type q4_0", test_bin());
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 2);
    CHECK(strstr(out, "--cache-type takes f32, f16 or q8_0, not 'q4_0'") != NULL);
}
