/* test_infer.c - the forward pass against the float64 reference on the
 * project's own random models, and its invariants: layer splits, batch
 * splits, several sequences, thread counts, and rejected batches. */
#include "test.h"
#include "model_util.h"
#include "ref_forward.h"
#include "base/err.h"
#include "base/rng.h"
#include "tensor/types.h"
#include "model/gguf.h"
#include "model/synth.h"

#define N_TOK 24

static void random_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(rng_next(&r) % (uint64_t)vocab);
}

typedef struct { double max_abs, rms, min_cos, ref_std; int argmax_agree, rows, rows_off; } cmp_stats;

static cmp_stats compare(const float *a, const double *ref, int rows, int V)
{
    cmp_stats st = { 0, 0, 1, 0, 0, rows, 0 };
    double sq = 0, var = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * V;
        const double *y = ref + (size_t)r * V;
        double dot = 0, nx = 0, ny = 0, mean = 0;
        int ax = 0, ay = 0;
        for (int t = 0; t < V; t++) {
            double d = fabs(x[t] - y[t]);
            if (d > st.max_abs) st.max_abs = d;
            sq += d * d;
            dot += x[t] * y[t]; nx += (double)x[t] * x[t]; ny += y[t] * y[t];
            mean += y[t];
            if (x[t] > x[ax]) ax = t;
            if (y[t] > y[ay]) ay = t;
        }
        mean /= V;
        for (int t = 0; t < V; t++) var += (y[t] - mean) * (y[t] - mean) / V;
        double c = dot / sqrt(nx * ny);
        if (c < st.min_cos) st.min_cos = c;
        st.rows_off += c < 0.995;
        st.argmax_agree += ax == ay;
    }
    st.rms = sqrt(sq / ((double)rows * V));
    st.ref_std = sqrt(var / rows);
    return st;
}

/* Exact mode must match the f64 oracle to f32 rounding; fast mode within
 * the error that quantised activations bring. */
static void check_path_against_ref(const char *path, const char *preset, int type, const char *mix);

static void check_against_ref(const char *preset, int type, const char *mix)
{
    check_path_against_ref(test_make_model(preset, type, mix), preset, type, mix);
}

/* Llama 3.1-style rope scaling (rope_freqs tensor) and linear scaling. */
TEST(infer_ref_llama_rope_scaling)
{
    synth_params p;
    char path[1024];
    CHECK_OK(synth_preset("tiny", &p));
    p.rope_freqs = true;
    p.rope_base = 500000.0f;
    snprintf(path, sizeof path, "%s/rope.gguf", test_tmpdir());
    CHECK_OK(synth_write(path, &p));
    model *m;
    CHECK_OK(model_load(path, 0, -1, &m));
    CHECK(m->rope_freqs.data != NULL);
    model_free(m);
    check_path_against_ref(path, "tiny+rope_freqs", TT_F32, NULL);
}

static void check_path_against_ref(const char *path, const char *preset, int type, const char *mix)
{
    model *m;
    stage *s;
    int32_t tok[N_TOK];
    CHECK_OK(model_load(path, 0, -1, &m));
    const int V = m->hp.n_vocab;
    random_tokens(tok, N_TOK, V, 7);
    double *ref = malloc(sizeof(double) * N_TOK * V);
    float *got = malloc(sizeof(float) * N_TOK * V);
    CHECK_OK(ref_forward(m, tok, N_TOK, ref));
    model_free(m);
    for (int precision = MATMUL_FAST; precision <= MATMUL_EXACT; precision++) {
        test_open_stage(path, 0, -1, precision, 64, 1, N_TOK, 2, &m, &s);
        test_run_tokens(s, tok, N_TOK, 0, 0, N_TOK, got);
        cmp_stats st = compare(got, ref, N_TOK, V);
        fprintf(stderr, "  %s %s %s: max %.3g rms %.3g (std %.3g) cos %.6f argmax %d/%d\n",
                preset, mix ? mix : tensor_type_name(type),
                precision == MATMUL_EXACT ? "exact" : "fast",
                st.max_abs, st.rms, st.ref_std, st.min_cos, st.argmax_agree, N_TOK);
        CHECK(st.ref_std > 0.5);              /* the model says something */
        if (precision == MATMUL_EXACT || (type == TT_F32 && !mix)) {
            CHECK(st.max_abs <= 2e-4 * st.ref_std * 10);
            CHECK_INT(st.argmax_agree, >=, N_TOK - 1);
        } else if (m->hp.n_expert > 0) {
            /* Rounded activations may flip an expert choice whose margin
             * is small (sigmoid routing with a bias has many): that moves
             * one row, nothing else. */
            CHECK(st.min_cos >= 0.9);
            CHECK_INT(st.rows_off, <=, 2);
            CHECK(st.rms <= 0.08 * st.ref_std);
        } else {
            CHECK(st.min_cos >= 0.995);
            CHECK(st.rms <= 0.08 * st.ref_std);
        }
        stage_free(s);
        model_free(m);
    }
    free(ref);
    free(got);
}

TEST(infer_ref_llama_f32)    { check_against_ref("tiny", TT_F32, NULL); }
TEST(infer_ref_qwen2_f32)    { check_against_ref("tiny-qwen2", TT_F32, NULL); }
TEST(infer_ref_qwen3_f32)    { check_against_ref("tiny-qwen3", TT_F32, NULL); }
TEST(infer_ref_qwen3moe_f32) { check_against_ref("tiny-qwen3moe", TT_F32, NULL); }
TEST(infer_ref_llama_f16)    { check_against_ref("tiny", TT_F16, NULL); }
TEST(infer_ref_llama_bf16)   { check_against_ref("tiny", TT_BF16, NULL); }
TEST(infer_ref_llama_q8_0)   { check_against_ref("tiny", TT_Q8_0, NULL); }
TEST(infer_ref_llama_q4_0)   { check_against_ref("tiny", TT_Q4_0, NULL); }
TEST(infer_ref_llama_q4_1)   { check_against_ref("tiny", TT_Q4_1, NULL); }
TEST(infer_ref_llama_q5_0)   { check_against_ref("tiny", TT_Q5_0, NULL); }
TEST(infer_ref_llama_q5_1)   { check_against_ref("tiny", TT_Q5_1, NULL); }
TEST(infer_ref_llama_q2_k)   { check_against_ref("tiny", TT_Q2_K, NULL); }
TEST(infer_ref_llama_q3_k)   { check_against_ref("tiny", TT_Q3_K, NULL); }
TEST(infer_ref_llama_q4_k)   { check_against_ref("tiny", TT_Q4_K, NULL); }
TEST(infer_ref_llama_q5_k)   { check_against_ref("tiny", TT_Q5_K, NULL); }
TEST(infer_ref_llama_q6_k)   { check_against_ref("tiny", TT_Q6_K, NULL); }
TEST(infer_ref_llama_iq4_nl) { check_against_ref("tiny", TT_IQ4_NL, NULL); }
TEST(infer_ref_llama_iq4_xs) { check_against_ref("tiny", TT_IQ4_XS, NULL); }
TEST(infer_ref_qwen3moe_mxfp4) { check_against_ref("tiny-qwen3moe", TT_MXFP4, NULL); }
TEST(infer_ref_qwen3_q4_k_m) { check_against_ref("tiny-qwen3", TT_F32, "Q4_K_M"); }
TEST(infer_ref_qwen3moe_q8_0){ check_against_ref("tiny-qwen3moe", TT_Q8_0, NULL); }

TEST(infer_ref_deepseek2_f32)      { check_against_ref("tiny-deepseek2", TT_F32, NULL); }
TEST(infer_ref_deepseek2_bf16)     { check_against_ref("tiny-deepseek2", TT_BF16, NULL); }
TEST(infer_ref_deepseek2_q8_0)     { check_against_ref("tiny-deepseek2", TT_Q8_0, NULL); }
TEST(infer_ref_deepseek2_q4_k_m)   { check_against_ref("tiny-deepseek2", TT_F32, "Q4_K_M"); }

/* The other deepseek2 forms files carry: a plain attn_q (no q compression,
 * V2-Lite), softmax routing without groups, bias or renormalisation, no
 * rope scaling or linear scaling, several shared experts, and the older
 * unsplit attn_kv_b. */
static const char *write_deepseek2_variant(const char *name, void (*edit)(synth_params *))
{
    synth_params p;
    CHECK_OK(synth_preset("tiny-deepseek2", &p));
    edit(&p);
    return test_write_model(&p, name);
}

static void v2_lite(synth_params *p)
{
    p->q_lora_rank = 0; p->gating = 1; p->n_expert_group = 0; p->expert_bias = false;
    p->expert_weights_norm = false; p->expert_weights_scale = 1.0f; p->yarn_factor = 0;
    p->n_expert_shared = 2; p->unsplit_kv_b = true;
}

static void unsplit_q8(synth_params *p) { p->unsplit_kv_b = true; p->type = TT_Q8_0; }

TEST(infer_ref_deepseek2_variants)
{
    check_path_against_ref(write_deepseek2_variant("v2lite", v2_lite), "deepseek2-v2lite", TT_F32, NULL);
    check_path_against_ref(write_deepseek2_variant("unsplit-q8", unsplit_q8), "deepseek2-unsplit",
                           TT_Q8_0, NULL);
}

/* The older layout of an F32 split file: every layer's attn_k_b {Dn, R, H}
 * and attn_v_b {R, Dv, H} joined into attn_kv_b {R, H*(Dn+Dv)}, head after
 * head (k rows transposed back, then v rows), everything else copied. */
typedef struct { const gguf_file *f; const char **src; } copy_ctx;

static int copy_fill(void *ud, uint64_t i, void *dst, uint64_t size)
{
    copy_ctx *c = ud;
    if (strstr(c->src[i], "attn_kv_b")) {
        char kn[96], vn[96];
        snprintf(kn, sizeof kn, "%.*sattn_k_b.weight", (int)(strstr(c->src[i], "attn_kv_b") - c->src[i]), c->src[i]);
        snprintf(vn, sizeof vn, "%.*sattn_v_b.weight", (int)(strstr(c->src[i], "attn_kv_b") - c->src[i]), c->src[i]);
        const gguf_tensor *k = gguf_find_tensor(c->f, kn), *v = gguf_find_tensor(c->f, vn);
        const int64_t Dn = k->ne[0], R = k->ne[1], H = k->ne[2], Dv = v->ne[1];
        const float *kb = k->data, *vb = v->data;
        float *out = dst;
        for (int64_t j = 0; j < H; j++) {
            for (int64_t d = 0; d < Dn; d++)
                for (int64_t r = 0; r < R; r++)
                    out[(j * (Dn + Dv) + d) * R + r] = kb[(j * R + r) * Dn + d];
            memcpy(out + (j * (Dn + Dv) + Dn) * R, vb + j * Dv * R, sizeof(float) * Dv * R);
        }
        return 0;
    }
    memcpy(dst, gguf_find_tensor(c->f, c->src[i])->data, size);
    return 0;
}

static void write_unsplit(const char *split, const char *out)
{
    gguf_file *f;
    CHECK_OK(gguf_open(split, &f));
    gguf_writer *w = gguf_writer_new();
    const char *src[256];
    int n = 0;
    for (uint64_t i = 0; i < f->n_kv; i++)
        CHECK_OK(gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].value));
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const char *kb = strstr(t->name, "attn_k_b.weight");
        CHECK(t->type == TT_F32);
        if (strstr(t->name, "attn_v_b.weight"))
            continue;
        if (kb) {
            char name[96];
            const gguf_tensor *v = gguf_find_tensor(f, "blk.0.attn_v_b.weight");
            int64_t ne[4] = { t->ne[1], t->ne[2] * (t->ne[0] + v->ne[1]), 1, 1 };
            snprintf(name, sizeof name, "%.*sattn_kv_b.weight", (int)(kb - t->name), t->name);
            CHECK_OK(gguf_writer_add_tensor(w, name, TT_F32, 2, ne));
            src[n++] = strdup(name);
            continue;
        }
        CHECK_OK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne));
        src[n++] = strdup(t->name);
    }
    copy_ctx c = { f, src };
    CHECK_OK(gguf_writer_write(w, out, copy_fill, &c));
    for (int i = 0; i < n; i++)
        free((char *)src[i]);
    gguf_writer_free(w);
    gguf_close(f);
}

/* An unsplit attn_kv_b computes what the split pair computes: the split at
 * load only moves exact values (F32 here), so the logits are the same bits. */
TEST(infer_deepseek2_unsplit_kv_b_same_bits)
{
    const char *split = test_make_model("tiny-deepseek2", TT_F32, NULL);
    char split_path[1024], joined[1024];
    snprintf(split_path, sizeof split_path, "%s", split);
    snprintf(joined, sizeof joined, "%s/ds2-joined.gguf", test_tmpdir());
    write_unsplit(split_path, joined);
    int32_t tok[N_TOK];
    float *out[2];
    const char *paths[2] = { split_path, joined };
    for (int i = 0; i < 2; i++) {
        model *m;
        stage *s;
        test_open_stage(paths[i], 0, -1, MATMUL_FAST, 64, 1, N_TOK, 2, &m, &s);
        CHECK(m->layers[0].wkv_b.data == NULL && m->layers[0].wk_b.data != NULL);
        random_tokens(tok, N_TOK, m->hp.n_vocab, 9);
        out[i] = malloc(sizeof(float) * N_TOK * m->hp.n_vocab);
        test_run_tokens(s, tok, N_TOK, 0, 0, 5, out[i]);
        stage_free(s);
        model_free(m);
    }
    CHECK(memcmp(out[0], out[1], sizeof(float) * N_TOK * 512) == 0);
    free(out[0]);
    free(out[1]);
}

/* Stage [0,k) feeding [k,n) gives the same logits as [0,n), bit for bit. */
static void check_layer_split(const char *preset, int type, int precision)
{
    const char *path = test_make_model(preset, type, NULL);
    model *m_all, *m_a, *m_b, *m_c;
    stage *s_all, *s_a, *s_b, *s_c;
    int32_t tok[N_TOK], pos[N_TOK], seq[N_TOK] = { 0 };
    test_open_stage(path, 0, -1, precision, 64, 1, N_TOK, 2, &m_all, &s_all);
    const int V = m_all->hp.n_vocab, E = m_all->hp.n_embd, L = m_all->hp.n_layer;
    CHECK_INT(L, >=, 2);
    test_open_stage(path, 0, 1, precision, 64, 1, N_TOK, 2, &m_a, &s_a);
    test_open_stage(path, 1, L, precision, 64, 1, N_TOK, 1, &m_b, &s_b);
    CHECK(stage_is_first(s_a) && !stage_is_last(s_a));
    CHECK(!stage_is_first(s_b) && stage_is_last(s_b));
    CHECK(m_a->output.data == NULL && m_b->tok_embd.data == (m_b->hp.tied_output ? m_b->tok_embd.data : NULL));
    random_tokens(tok, N_TOK, V, 11);
    for (int i = 0; i < N_TOK; i++) pos[i] = i;
    float *want = malloc(sizeof(float) * N_TOK * V), *got = malloc(sizeof(float) * N_TOK * V);
    float *hid = malloc(sizeof(float) * N_TOK * E);
    test_run_tokens(s_all, tok, N_TOK, 0, 0, N_TOK, want);
    stage_batch b = { .n_rows = N_TOK, .token = tok, .pos = pos, .seq = seq };
    int n_out;
    CHECK_OK(stage_forward(s_a, &b, NULL, hid, &n_out));
    CHECK_INT(n_out, ==, N_TOK);
    CHECK_OK(stage_forward(s_b, &b, hid, got, &n_out));
    CHECK_INT(n_out, ==, N_TOK);
    CHECK(memcmp(want, got, sizeof(float) * N_TOK * V) == 0);
    /* A middle stage with no embedding and no output also works: [0,1)+[1,1)... */
    if (L >= 3) {
        test_open_stage(path, 1, 2, precision, 64, 1, N_TOK, 1, &m_c, &s_c);
        stage_free(s_c);
        model_free(m_c);
    }
    free(want); free(got); free(hid);
    stage_free(s_all); stage_free(s_a); stage_free(s_b);
    model_free(m_all); model_free(m_a); model_free(m_b);
}

TEST(infer_layer_split_exact) { check_layer_split("tiny", TT_Q8_0, MATMUL_EXACT); }
TEST(infer_layer_split_fast)  { check_layer_split("tiny-qwen3", TT_Q4_K, MATMUL_FAST); }
TEST(infer_layer_split_moe)   { check_layer_split("tiny-qwen3moe", TT_Q6_K, MATMUL_FAST); }
TEST(infer_layer_split_deepseek2) { check_layer_split("tiny-deepseek2", TT_Q8_0, MATMUL_FAST); }

/* One batch of 24 = 12 + 12 = one token at a time, and threads do not
 * change a bit. */
TEST(infer_batch_split_and_threads)
{
    const char *path = test_make_model("tiny-qwen2", TT_Q4_K, NULL);
    model *m;
    stage *s1, *s2, *s3;
    int32_t tok[N_TOK];
    test_open_stage(path, 0, -1, MATMUL_FAST, 64, 1, N_TOK, 1, &m, &s1);
    stage_params sp = { .n_ctx = 64, .n_seq = 1, .n_batch = N_TOK, .n_threads = 3, .precision = MATMUL_FAST };
    CHECK_OK(stage_new(m, &sp, &s2));
    CHECK_OK(stage_new(m, &sp, &s3));
    const int V = m->hp.n_vocab;
    random_tokens(tok, N_TOK, V, 5);
    float *a = malloc(sizeof(float) * N_TOK * V), *b = malloc(sizeof(float) * N_TOK * V),
          *c = malloc(sizeof(float) * N_TOK * V);
    test_run_tokens(s1, tok, N_TOK, 0, 0, N_TOK, a);
    test_run_tokens(s2, tok, N_TOK, 0, 0, N_TOK / 2, b);
    test_run_tokens(s3, tok, N_TOK, 0, 0, 1, c);
    CHECK(memcmp(a, b, sizeof(float) * N_TOK * V) == 0);
    CHECK(memcmp(a, c, sizeof(float) * N_TOK * V) == 0);
    CHECK_INT(stage_seq_len(s3, 0), ==, N_TOK);
    free(a); free(b); free(c);
    stage_free(s1); stage_free(s2); stage_free(s3);
    model_free(m);
}

/* Two sequences interleaved in one batch give each one's own logits, and
 * logits can be asked for a subset of rows. */
TEST(infer_multi_sequence)
{
    const char *path = test_make_model("tiny", TT_Q8_0, NULL);
    model *m;
    stage *s;
    test_open_stage(path, 0, -1, MATMUL_FAST, 32, 3, 2 * N_TOK, 2, &m, &s);
    const int V = m->hp.n_vocab;
    int32_t ta[N_TOK], tb[N_TOK], tok[2 * N_TOK], pos[2 * N_TOK], seq[2 * N_TOK];
    int8_t want[2 * N_TOK];
    random_tokens(ta, N_TOK, V, 1);
    random_tokens(tb, N_TOK, V, 2);
    float *alone_a = malloc(sizeof(float) * N_TOK * V), *alone_b = malloc(sizeof(float) * N_TOK * V);
    float *mixed = malloc(sizeof(float) * 2 * N_TOK * V);
    test_run_tokens(s, ta, N_TOK, 0, 0, N_TOK, alone_a);
    test_run_tokens(s, tb, N_TOK, 1, 0, 7, alone_b);
    stage_seq_truncate(s, 0, 0);
    stage_seq_truncate(s, 1, 0);
    for (int i = 0; i < N_TOK; i++) {
        tok[2 * i] = ta[i]; pos[2 * i] = i; seq[2 * i] = 2;       /* slot 2 this time */
        tok[2 * i + 1] = tb[i]; pos[2 * i + 1] = i; seq[2 * i + 1] = 0;
        want[2 * i] = 1;
        want[2 * i + 1] = i == N_TOK - 1;                        /* only b's last row */
    }
    stage_batch b = { .n_rows = 2 * N_TOK, .token = tok, .pos = pos, .seq = seq, .logits = want };
    int n_out;
    CHECK_OK(stage_forward(s, &b, NULL, mixed, &n_out));
    CHECK_INT(n_out, ==, N_TOK + 1);
    for (int i = 0; i < N_TOK; i++)
        CHECK(memcmp(mixed + (size_t)i * V, alone_a + (size_t)i * V, sizeof(float) * V) == 0);
    CHECK(memcmp(mixed + (size_t)N_TOK * V, alone_b + (size_t)(N_TOK - 1) * V, sizeof(float) * V) == 0);
    free(alone_a); free(alone_b); free(mixed);
    stage_free(s);
    model_free(m);
}

/* Continuing a sequence after a truncation recomputes the same logits. */
TEST(infer_truncate_and_continue)
{
    const char *path = test_make_model("tiny-qwen3", TT_F16, NULL);
    model *m;
    stage *s;
    test_open_stage(path, 0, -1, MATMUL_EXACT, 64, 1, N_TOK, 2, &m, &s);
    const int V = m->hp.n_vocab;
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, V, 3);
    float *a = malloc(sizeof(float) * N_TOK * V), *b = malloc(sizeof(float) * N_TOK * V);
    test_run_tokens(s, tok, N_TOK, 0, 0, N_TOK, a);
    stage_seq_truncate(s, 0, 10);
    CHECK_INT(stage_seq_len(s, 0), ==, 10);
    test_run_tokens(s, tok + 10, N_TOK - 10, 0, 10, 5, b);
    CHECK(memcmp(a + (size_t)10 * V, b, sizeof(float) * (N_TOK - 10) * V) == 0);
    free(a); free(b);
    stage_free(s);
    model_free(m);
}

TEST(infer_rejects_bad_batches)
{
    const char *path = test_make_model("tiny", TT_F32, NULL);
    model *m;
    stage *s;
    test_open_stage(path, 0, -1, MATMUL_FAST, 8, 2, 4, 1, &m, &s);
    float *out = malloc(sizeof(float) * 4 * m->hp.n_vocab);
    int32_t tok[4] = { 1, 2, 3, 4 }, pos[4] = { 0, 1, 2, 3 }, seq[4] = { 0, 0, 0, 0 };
    stage_batch b = { .n_rows = 4, .token = tok, .pos = pos, .seq = seq };
    tok[2] = m->hp.n_vocab;
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "token id") != NULL);
    tok[2] = -1;
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    tok[2] = 3;
    pos[2] = 3;                       /* hole at 2 */
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "hole") != NULL);
    pos[2] = 2;
    seq[1] = 2;
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    seq[1] = 0;
    b.n_rows = 5;
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    b.n_rows = 4;
    CHECK_INT(stage_seq_len(s, 0), ==, 0);   /* nothing was written */
    CHECK_OK(stage_forward(s, &b, NULL, out, NULL));
    CHECK_OK(stage_forward(s, &b, NULL, out, NULL));   /* re-evaluating 0..3 */
    pos[0] = 4; pos[1] = 5; pos[2] = 6; pos[3] = 7;
    CHECK_OK(stage_forward(s, &b, NULL, out, NULL));
    pos[0] = 8;                        /* context full */
    b.n_rows = 1;
    CHECK_INT(stage_forward(s, &b, NULL, out, NULL), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "context") != NULL);
    free(out);
    stage_free(s);
    model_free(m);
}
