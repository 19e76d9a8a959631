/* test_shard.c - tensor-parallel shards of a model (model_load_shard and
 * the stage's reduce): N shards run in threads, summing through memory
 * (infer/shard_group.h),
 * and their logits put together must be the whole model's (up to the order
 * of a few float additions), with the same greedy tokens; the cuts that
 * cannot be made are refused with a reason. */
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "base/rng.h"
#include "infer/shard_group.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 12
#define N_STEPS 6


/* Two sequences: a prompt each (one batch), then N_STEPS greedy decode
 * steps of both in one batch, on the whole model and on n shards. */
static void check_shards_path(const char *path, const char *preset, int type, int precision,
                              int n_ranks, double tol, bool f16)
{
    model *m_all;
    stage *s_all;
    test_open_stage(path, 0, -1, precision, 64, 2, 2 * N_PROMPT, 1, &m_all, &s_all);
    const int V = m_all->hp.n_vocab;
    stage_params sp = { .n_ctx = 64, .n_seq = 2, .n_batch = 2 * N_PROMPT, .n_threads = 1,
                        .precision = precision };
    shard_group *g;
    CHECK_OK(shard_group_new(path, n_ranks, &sp, f16, &g));
    uint64_t held = 0, attn_bytes = 0;
    int heads = 0, kv = 0, ff = 0, exps = 0, vocab = 0;
    const bool whole = shard_group_model(g, 0)->shard.attn_whole;
    for (int r = 0; r < n_ranks; r++) {
        const model *m = shard_group_model(g, r);
        const model_shard *sh = &m->shard;
        CHECK_INT(sh->rank, ==, r);
        CHECK(sh->attn_whole == whole);
        CHECK_INT(sh->head0, ==, whole ? 0 : heads);
        CHECK_INT(sh->kv0, ==, whole ? 0 : kv);
        CHECK_INT(sh->ff0, ==, sh->ffn_whole ? 0 : ff);
        CHECK_INT(sh->exp0, ==, exps);
        CHECK_INT(sh->vocab0, ==, vocab);
        heads += sh->n_head; kv += sh->n_head_kv; ff += sh->n_ff; exps += sh->n_exp;
        vocab += sh->n_vocab;
        held += m->weight_bytes;
    }
    CHECK_INT(heads, ==, m_all->hp.n_head * (whole ? n_ranks : 1));
    CHECK_INT(kv, ==, m_all->hp.n_head_kv * (whole ? n_ranks : 1));
    CHECK_INT(ff, ==, m_all->hp.n_ff * (shard_group_model(g, 0)->shard.ffn_whole ? n_ranks : 1));
    CHECK_INT(exps, ==, m_all->hp.n_expert);
    CHECK_INT(vocab, ==, V);
    int n_sums = 0;     /* reduces per forward pass */
    for (int l = 0; l < m_all->hp.n_layer; l++) {
        const layer_weights *L = &m_all->layers[l];
        /* on every shard: the latent projections and the router; with
         * uncut heads, the whole attention */
        const tensor *rep[] = { &L->wq_a, &L->wkv_a, &L->gate_inp, &L->wq, &L->wk, &L->wv, &L->wo,
                                &L->wq_b, &L->wk_b, &L->wv_b };
        for (size_t i = 0; i < sizeof rep / sizeof rep[0] && (i < 3 || whole); i++)
            attn_bytes += rep[i]->data ? rep[i]->row_bytes * (uint64_t)(rep[i]->ne[1] * rep[i]->ne[2]) : 0;
        const tensor *ffn[] = { &L->w_gate, &L->w_up, &L->w_down };
        for (size_t i = 0; i < 3 && shard_group_model(g, 0)->shard.ffn_whole; i++)
            attn_bytes += ffn[i]->data ? ffn[i]->row_bytes * (uint64_t)ffn[i]->ne[1] : 0;
        n_sums += (whole ? 0 : 1) + (L->w_down.data && shard_group_model(g, 0)->shard.ffn_whole ? 0 : 1);
    }
    /* Every shard maps the embedding table for look-ups and keeps the
     * norms (and, when the heads are not cut, the whole attention); the
     * rest is cut. */
    double emb = (double)m_all->tok_embd.row_bytes * V, all = (double)m_all->weight_bytes;
    CHECK((double)held <= all + (n_ranks - 1) * (emb + 0.02 * all + (double)attn_bytes));
    CHECK(shard_group_model(g, 0)->weight_bytes < m_all->weight_bytes);

    int32_t tok[2 * N_PROMPT], pos[2 * N_PROMPT], seq[2 * N_PROMPT];
    rng_state rg;
    rng_seed(&rg, 7);
    for (int i = 0; i < 2 * N_PROMPT; i++) {
        tok[i] = (int32_t)(rng_next(&rg) % (uint64_t)V);
        pos[i] = i % N_PROMPT;
        seq[i] = i / N_PROMPT;
    }
    float *want = malloc(sizeof(float) * 2 * N_PROMPT * V), *got = malloc(sizeof(float) * 2 * N_PROMPT * V);
    double worst = 0, scale = 0;
    int flips = 0;
    stage_batch b = { .n_rows = 2 * N_PROMPT, .token = tok, .pos = pos, .seq = seq };
    for (int step = 0; step <= N_STEPS; step++) {
        int n_all;
        CHECK_OK(stage_forward(s_all, &b, NULL, want, &n_all));
        int n;
        CHECK_OK(shard_group_forward(g, &b, got, &n));
        CHECK_INT(n, ==, n_all);
        for (int i = 0; i < n; i++) {
            const float *w = want + (size_t)i * V, *x = got + (size_t)i * V;
            for (int t = 0; t < V; t++) {
                if (fabs(w[t] - x[t]) > worst)
                    worst = fabs(w[t] - x[t]);
                if (fabs(w[t]) > scale)
                    scale = fabs(w[t]);
            }
            if (!f16)
                CHECK_INT(test_argmax(x, V), ==, test_argmax(w, V));
            else if (test_argmax(x, V) != test_argmax(w, V))
                flips++;
        }
        /* Next step: each sequence's greedy token at its next position. */
        int32_t next[2] = { test_argmax(want + (size_t)(n - 1 - (n > 2 ? N_PROMPT : 1)) * V, V),
                            test_argmax(want + (size_t)(n - 1) * V, V) };
        int32_t at[2] = { pos[b.n_rows / 2 - 1] + 1, pos[b.n_rows - 1] + 1 };
        tok[0] = next[0]; tok[1] = next[1];
        pos[0] = at[0]; pos[1] = at[1];
        seq[0] = 0; seq[1] = 1;
        b.n_rows = 2;
    }
    fprintf(stderr, "  %s %s, %d shards%s: max |logit diff| %.3g, %d argmax flips, %ld reduces\n",
            preset, tensor_type_name(type), n_ranks, f16 ? " (f16 parts)" : "", worst, flips,
            shard_group_sums(g));
    CHECK(worst <= (f16 ? tol * scale : tol));
    CHECK_INT(shard_group_sums(g), ==, (long)(N_STEPS + 1) * n_sums);
    shard_group_free(g);
    free(want); free(got);
    stage_free(s_all);
    model_free(m_all);
}

static void check_shards_wire(const char *preset, int type, int precision, int n_ranks,
                              double tol, bool f16)
{
    check_shards_path(test_make_model(preset, type, NULL), preset, type, precision, n_ranks, tol,
                      f16);
}

static void check_shards(const char *preset, int type, int precision, int n_ranks, double tol)
{
    check_shards_wire(preset, type, precision, n_ranks, tol, false);
}

TEST(shard_llama_f32_exact_2)  { check_shards("tiny", TT_F32, MATMUL_EXACT, 2, 1e-4); }
TEST(shard_qwen2_q8_0_fast_2)  { check_shards("tiny-qwen2", TT_Q8_0, MATMUL_FAST, 2, 2e-3); }
TEST(shard_qwen3_q4_0_fast_2)  { check_shards("tiny-qwen3", TT_Q4_0, MATMUL_FAST, 2, 2e-3); }
TEST(shard_llama_q5_1_fast_2)  { check_shards("tiny", TT_Q5_1, MATMUL_FAST, 2, 2e-3); }
/* mixture of experts: each shard holds a range of the experts, whole */
TEST(shard_qwen3moe_f32_exact_2) { check_shards("tiny-qwen3moe", TT_F32, MATMUL_EXACT, 2, 1e-4); }
TEST(shard_qwen3moe_q8_0_fast_2) { check_shards("tiny-qwen3moe", TT_Q8_0, MATMUL_FAST, 2, 2e-3); }
TEST(shard_qwen3moe_q4_k_fast_3) { check_shards("tiny-qwen3moe", TT_Q4_K, MATMUL_FAST, 3, 2e-3); }
/* latent attention cut by heads; routed experts whole per shard; the
 * shared expert cut by units (F32/Q8_0) or run by shard 0 (Q4_K: 128 units
 * on 256-element blocks); the dense first layer cut by units */
TEST(shard_deepseek2_f32_exact_2_3_4)
{
    const char *path = test_make_model("tiny-deepseek2", TT_F32, NULL);
    for (int n = 2; n <= 4; n++)
        check_shards_path(path, "tiny-deepseek2", TT_F32, MATMUL_EXACT, n, 1e-4, false);
}
TEST(shard_deepseek2_q8_0_fast_3) { check_shards("tiny-deepseek2", TT_Q8_0, MATMUL_FAST, 3, 2e-3); }
/* llama-quantize's Q4_K_M mix: attn_output Q5_K (8 heads of 32 are one
 * 256-element block) and the dense layer's 512 units two Q4_K blocks: with
 * 4 shards every shard runs all heads and the whole dense FFN, and only the
 * experts and the output are cut */
TEST(shard_deepseek2_q4_k_m_exact_4)
{
    const char *path = test_make_model("tiny-deepseek2", TT_F32, "Q4_K_M");
    model *m;
    CHECK_OK(model_load_shard(path, 0, -1, 3, 4, &m));
    CHECK(m->shard.attn_whole && m->shard.ffn_whole && m->shard.n_exp == 2);
    model_free(m);
    check_shards_path(path, "tiny-deepseek2 Q4_K_M", TT_Q4_K, MATMUL_EXACT, 4, 1e-4, false);
}
TEST(shard_deepseek2_q4_k_fast_2) { check_shards("tiny-deepseek2", TT_Q4_K, MATMUL_FAST, 2, 2e-3); }

/* What cannot be cut on the blocks of its type is not cut: the attention
 * runs on every shard, the shared experts on shard 0. */
TEST(shard_falls_back_to_whole_parts)
{
    model *m = NULL;
    /* tiny has 2 key/value heads: with 3 shards each runs every head */
    CHECK_OK(model_load_shard(test_make_model("tiny", TT_Q8_0, NULL), 0, -1, 2, 3, &m));
    CHECK(m->shard.attn_whole && m->shard.n_head == m->hp.n_head);
    model_free(m);
    /* Q4_K's 256-element blocks: attention output columns 128 wide per shard */
    CHECK_OK(model_load_shard(test_make_model("tiny", TT_Q4_K, NULL), 0, -1, 1, 2, &m));
    CHECK(m->shard.attn_whole);
    model_free(m);
    /* deepseek2 Q4_K with 256-unit experts: the shared expert is one block */
    synth_params p;
    char ds[1024];
    CHECK_OK(synth_preset("tiny-deepseek2", &p));
    p.type = TT_Q4_K;
    p.n_ff_exp = 256;
    snprintf(ds, sizeof ds, "%s", test_write_model(&p, "ds2-shexp256"));
    CHECK_OK(model_load_shard(ds, 0, -1, 0, 2, &m));
    CHECK(m->shard.n_sh == 256 && m->layers[1].gate_shexp.data);
    model_free(m);
    CHECK_OK(model_load_shard(ds, 0, -1, 1, 2, &m));
    CHECK(m->shard.n_sh == 0 && !m->layers[1].gate_shexp.data && m->shard.n_exp == 4);
    model_free(m);
    check_shards_path(ds, "tiny-deepseek2 shexp256", TT_Q4_K, MATMUL_EXACT, 2, 1e-4, false);
}

TEST(shard_refuses_what_cannot_be_cut)
{
    model *m = NULL;
    /* 4 experts cannot be shared by 5 shards */
    CHECK_INT(model_load_shard(test_make_model("tiny-qwen3moe", TT_Q8_0, NULL), 0, -1, 0, 5, &m), ==,
              RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "experts"));
    CHECK(m == NULL);
    /* 512 FFN units on Q4_K's 256-element blocks: two blocks, three shards */
    CHECK_INT(model_load_shard(test_make_model("tiny", TT_Q4_K, NULL), 0, -1, 0, 3, &m), ==,
              RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "FFN units"));
    CHECK_INT(model_load_shard(test_make_model("tiny", TT_Q8_0, NULL), 0, -1, 2, 2, &m), ==, RC_EINVAL);
    /* A shard's stage needs a way to sum */
    CHECK_OK(model_load_shard(test_make_model("tiny", TT_Q8_0, NULL), 0, -1, 0, 2, &m));
    stage *s;
    stage_params sp = { .n_ctx = 8, .n_seq = 1, .n_batch = 1, .n_threads = 1 };
    CHECK_INT(stage_new(m, &sp, &s), ==, RC_EINVAL);
    model_free(m);
}

/* f16 parts (the default wire): each part rounded to 11 bits before the
 * sum, 2 x n_layer times a token.  The logits move by well under 1% of
 * their range: with f32 weights by the f16 rounding itself, with the fast
 * path by about as much as its quantised activations already move them
 * from the exact path (0.54 of logits up to 245 on tiny-qwen3 Q8_0). */
TEST(shard_f16_parts_stay_close)
{
    check_shards_wire("tiny", TT_F32, MATMUL_EXACT, 2, 0.005, true);
    check_shards_wire("tiny-qwen3", TT_Q8_0, MATMUL_FAST, 2, 0.005, true);
}

/* 3 and 4 shards of a model with 4 key/value heads: uneven cuts (1, 1 and
 * 2 key/value heads for 3 shards; FFN units and vocabulary in thirds). */
TEST(shard_three_and_four_ways)
{
    synth_params p;
    CHECK_OK(synth_preset("tiny", &p));
    p.n_head_kv = 4;
    p.n_ff = 768;
    char path[600];
    static const int types[] = { TT_F32, TT_Q8_0 };
    for (size_t t = 0; t < 2; t++) {
        p.type = types[t];
        snprintf(path, sizeof path, "%s/kv4-%d.gguf", test_tmpdir(), p.type);
        CHECK_OK(synth_write(path, &p));
        int precision = p.type == TT_F32 ? MATMUL_EXACT : MATMUL_FAST;
        double tol = p.type == TT_F32 ? 1e-4 : 2e-3;
        check_shards_path(path, "tiny kv4", p.type, precision, 3, tol, false);
        check_shards_path(path, "tiny kv4", p.type, precision, 4, tol, false);
    }
}
