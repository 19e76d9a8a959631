/* test_model.c - hyperparameters and weight binding: every way a model file
 * can be wrong for the forward pass ends in an error naming the file and the
 * key or tensor; layer ranges bind only what they need. */
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "tensor/types.h"

/* A minimal llama file: E=64 (256 with ODD_TYPE, whose blocks are 256
 * long), 1 layer, 4 heads / 2 kv heads, FFN 128, vocab 300, with one
 * tensor changed as `tweak` says: ODD_TYPE gives attn_q the type odd_type. */
enum { OK, NO_Q, BAD_SHAPE, ODD_TYPE, BAD_ARCH, NO_EMBD_KEY, BAD_HEADS, F16_NORM, NO_VOCAB_TENSOR };

static int odd_type = TT_F32;

static const char *write_model(int tweak)
{
    static char path[1024];
    const int64_t E = tweak == ODD_TYPE ? 256 : 64;
    snprintf(path, sizeof path, "%s/m%d.gguf", test_tmpdir(), tweak);
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    CHECK_OK(gguf_writer_set_str(w, "general.architecture", tweak == BAD_ARCH ? "mamba" : "llama"));
    if (tweak != NO_EMBD_KEY)
        CHECK_OK(gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E));
    CHECK_OK(gguf_writer_set_u32(w, "llama.block_count", 1));
    CHECK_OK(gguf_writer_set_u32(w, "llama.attention.head_count", 4));
    CHECK_OK(gguf_writer_set_u32(w, "llama.attention.head_count_kv", tweak == BAD_HEADS ? 3 : 2));
    CHECK_OK(gguf_writer_set_u32(w, "llama.feed_forward_length", 128));
    CHECK_OK(gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    struct { const char *name; int type; int n_dims; int64_t ne[2]; } t[] = {
        { "token_embd.weight", TT_F32, 2, { E, 300 } },
        { "output_norm.weight", TT_F32, 1, { E, 1 } },
        { "blk.0.attn_norm.weight", tweak == F16_NORM ? TT_F16 : TT_F32, 1, { E, 1 } },
        { "blk.0.attn_q.weight", tweak == ODD_TYPE ? odd_type : TT_F32, 2, { E, E } },
        { "blk.0.attn_k.weight", TT_F32, 2, { E, tweak == BAD_SHAPE ? 48 : E / 2 } },
        { "blk.0.attn_v.weight", TT_F32, 2, { E, E / 2 } },
        { "blk.0.attn_output.weight", TT_F32, 2, { E, E } },
        { "blk.0.ffn_norm.weight", TT_F32, 1, { E, 1 } },
        { "blk.0.ffn_gate.weight", TT_F32, 2, { E, 128 } },
        { "blk.0.ffn_up.weight", TT_F32, 2, { E, 128 } },
        { "blk.0.ffn_down.weight", TT_F32, 2, { 128, E } },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if ((tweak == NO_Q && i == 3) || (tweak == NO_VOCAB_TENSOR && i == 0))
            continue;
        CHECK_OK(gguf_writer_add_tensor(w, t[i].name, (uint32_t)t[i].type, (uint32_t)t[i].n_dims, t[i].ne));
    }
    CHECK_OK(gguf_writer_write(w, path, NULL, NULL));
    gguf_writer_free(w);
    return path;
}

static void expect_error(int tweak, int code, const char *phrase)
{
    const char *path = write_model(tweak);
    model *m = NULL;
    int rc = model_load(path, 0, -1, &m);
    if (rc != code)
        FAIL("tweak %d: got %d (%s), want %d", tweak, rc, rc ? rc_errmsg() : "ok", code);
    CHECK(m == NULL);
    if (!strstr(rc_errmsg(), phrase) || !strstr(rc_errmsg(), path))
        FAIL("tweak %d: message '%s' lacks '%s' or the path", tweak, rc_errmsg(), phrase);
}

TEST(model_binding_errors)
{
    model *m;
    CHECK_OK(model_load(write_model(OK), 0, -1, &m));
    CHECK_INT(m->hp.n_vocab, ==, 300);
    CHECK_INT(m->hp.head_dim, ==, 16);
    CHECK(m->hp.tied_output);
    CHECK(m->output.data == m->tok_embd.data);
    model_free(m);
    expect_error(NO_Q, RC_EFORMAT, "'blk.0.attn_q.weight' is missing");
    expect_error(BAD_SHAPE, RC_EFORMAT, "'blk.0.attn_k.weight' has shape [64, 48, 1], expected [64, 32, 1]");
    /* the types racimo lacks: the message names the tensor and the type */
    static const int lacking[] = { TT_IQ1_S, TT_IQ1_M, TT_IQ2_XXS, TT_IQ2_XS, TT_IQ2_S,
                                   TT_IQ3_XXS, TT_IQ3_S, TT_TQ1_0, TT_TQ2_0 };
    for (size_t k = 0; k < sizeof lacking / sizeof lacking[0]; k++) {
        odd_type = lacking[k];
        CHECK(!tensor_type_supported(odd_type));
        char want[128];
        snprintf(want, sizeof want, "tensor 'blk.0.attn_q.weight' has type %s, which racimo "
                 "cannot compute with", tensor_type_name(odd_type));
        expect_error(ODD_TYPE, RC_EUNSUPPORTED, want);
    }
    /* and the 4-bit table types load */
    static const int table_types[] = { TT_IQ4_NL, TT_IQ4_XS, TT_MXFP4 };
    for (size_t k = 0; k < sizeof table_types / sizeof table_types[0]; k++) {
        odd_type = table_types[k];
        CHECK_OK(model_load(write_model(ODD_TYPE), 0, -1, &m));
        CHECK_INT(m->layers[0].wq.type, ==, odd_type);
        model_free(m);
    }
    expect_error(BAD_ARCH, RC_EUNSUPPORTED, "architecture 'mamba' is not supported");
    expect_error(NO_EMBD_KEY, RC_EFORMAT, "'llama.embedding_length' is missing");
    expect_error(BAD_HEADS, RC_EFORMAT, "not a multiple");
    expect_error(F16_NORM, RC_EUNSUPPORTED, "'blk.0.attn_norm.weight' has type F16");
    expect_error(NO_VOCAB_TENSOR, RC_EFORMAT, "token_embd.weight");
}

TEST(model_layer_ranges)
{
    synth_params p;
    CHECK_OK(synth_preset("tiny", &p));
    p.n_layer = 4;
    char path[1024];
    snprintf(path, sizeof path, "%s/four.gguf", test_tmpdir());
    CHECK_OK(synth_write(path, &p));
    model *all, *mid, *last;
    CHECK_OK(model_load(path, 0, -1, &all));
    CHECK_OK(model_load(path, 1, 3, &mid));
    CHECK_OK(model_load(path, 3, 4, &last));
    /* a middle stage holds no embedding and no output */
    CHECK(mid->tok_embd.data == NULL && mid->output.data == NULL && mid->output_norm.data == NULL);
    CHECK(last->output.data != NULL);
    CHECK(mid->weight_bytes < all->weight_bytes / 2 + 1);
    CHECK(model_decode_bytes(mid) + model_decode_bytes(last) < model_decode_bytes(all));
    model *bad = NULL;
    CHECK_INT(model_load(path, 2, 2, &bad), ==, RC_EINVAL);
    CHECK_INT(model_load(path, 3, 5, &bad), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "layer range [3, 5)") != NULL);
    model_free(all);
    model_free(mid);
    model_free(last);
}

/* A 4-stage chain over a 4-layer model equals the whole model, bit for bit. */
TEST(model_four_stage_chain)
{
    synth_params p;
    CHECK_OK(synth_preset("tiny-qwen2", &p));
    p.n_layer = 4;
    p.type = TT_Q4_K;
    char path[1024];
    snprintf(path, sizeof path, "%s/four.gguf", test_tmpdir());
    CHECK_OK(synth_write(path, &p));
    model *m[5];
    stage *s[5];
    test_open_stage(path, 0, -1, MATMUL_FAST, 32, 1, 16, 2, &m[4], &s[4]);
    for (int k = 0; k < 4; k++)
        test_open_stage(path, k, k + 1, MATMUL_FAST, 32, 1, 16, 1, &m[k], &s[k]);
    const int V = m[4]->hp.n_vocab, E = m[4]->hp.n_embd;
    int32_t tok[16], pos[16], seq[16] = { 0 };
    for (int i = 0; i < 16; i++) {
        tok[i] = (int32_t)((i * 37 + 5) % 256);
        pos[i] = i;
    }
    float *want = malloc(sizeof(float) * 16 * V), *got = malloc(sizeof(float) * 16 * V);
    float *h1 = malloc(sizeof(float) * 16 * E), *h2 = malloc(sizeof(float) * 16 * E);
    test_run_tokens(s[4], tok, 16, 0, 0, 16, want);
    stage_batch b = { .n_rows = 16, .token = tok, .pos = pos, .seq = seq };
    CHECK_OK(stage_forward(s[0], &b, NULL, h1, NULL));
    CHECK_OK(stage_forward(s[1], &b, h1, h2, NULL));
    CHECK_OK(stage_forward(s[2], &b, h2, h1, NULL));
    CHECK_OK(stage_forward(s[3], &b, h1, got, NULL));
    CHECK(memcmp(want, got, sizeof(float) * 16 * V) == 0);
    CHECK_INT(stage_forward(s[1], &b, NULL, h2, NULL), ==, RC_EINVAL);   /* needs hidden states */
    free(want); free(got); free(h1); free(h2);
    for (int k = 0; k < 5; k++) {
        stage_free(s[k]);
        model_free(m[k]);
    }
}

/* A generated token reads every tensor once, except the embedding table,
 * of which it reads one row (and the output matrix, which may be that
 * same table, all of it). */
static void check_decode_bytes(const char *preset)
{
    synth_params p;
    CHECK_OK(synth_preset(preset, &p));
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), preset);
    CHECK_OK(synth_write(path, &p));
    model *m;
    CHECK_OK(model_load(path, 0, -1, &m));
    const gguf_file *f = m->file;
    uint64_t all = 0, embd = 0;
    bool tied = true;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        all += f->tensors[i].size_bytes;
        if (!strcmp(f->tensors[i].name, "token_embd.weight"))
            embd = f->tensors[i].size_bytes;
        if (!strcmp(f->tensors[i].name, "output.weight"))
            tied = false;
    }
    CHECK(embd > 0);
    const uint64_t row = m->tok_embd.row_bytes;
    const uint64_t want = all - (tied ? 0 : embd) + row;
    if (model_decode_bytes(m) != want)
        FAIL("%s (%s output): %llu bytes per token, want %llu", preset, tied ? "tied" : "own",
             (unsigned long long)model_decode_bytes(m), (unsigned long long)want);
    model_free(m);
}

TEST(membw_decode_bytes_count_every_tensor_once)
{
    check_decode_bytes("tiny");
    check_decode_bytes("tiny-qwen3");
}
