/* model_util.c - see model_util.h. */
#include "model_util.h"
#include "test.h"
#include "base/err.h"
#include "model/synth.h"
#include "tensor/types.h"

const char *test_make_model(const char *preset, int type, const char *mix)
{
    static char path[1024];
    synth_params p;
    CHECK_OK(synth_preset(preset, &p));
    p.type = type;
    p.mix = mix;
    snprintf(path, sizeof path, "%s/%s-%s.gguf", test_tmpdir(), preset,
             mix ? mix : tensor_type_name(type));
    CHECK_OK(synth_write(path, &p));
    return path;
}

const char *test_write_model(const synth_params *p, const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    CHECK_OK(synth_write(path, p));
    return path;
}

void test_open_stage(const char *path, int first, int last, int precision, int n_ctx,
                     int n_seq, int n_batch, int n_threads, model **m, stage **s)
{
    CHECK_OK(model_load(path, first, last, m));
    stage_params sp = { .n_ctx = n_ctx, .n_seq = n_seq, .n_batch = n_batch,
                        .n_threads = n_threads, .precision = precision,
                        .kv_type = TT_F32 };   /* the golden references' cache */
    CHECK_OK(stage_new(*m, &sp, s));
}

void test_run_tokens(stage *s, const int32_t *tokens, int n, int seq, int start_pos,
                     int chunk, float *logits)
{
    const int V = stage_model(s)->hp.n_vocab;
    int32_t pos[512], seqs[512];
    CHECK(chunk <= 512);
    for (int start = 0; start < n; start += chunk) {
        int len = n - start < chunk ? n - start : chunk;
        for (int i = 0; i < len; i++) {
            pos[i] = start_pos + start + i;
            seqs[i] = seq;
        }
        stage_batch b = { .n_rows = len, .token = tokens + start, .pos = pos, .seq = seqs };
        int n_out = 0;
        CHECK_OK(stage_forward(s, &b, NULL, logits + (size_t)start * V, &n_out));
        CHECK_INT(n_out, ==, len);
    }
}

int test_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}
