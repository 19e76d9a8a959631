/* test_embed_llama.c - racimo's embeddings against llama.cpp's on the same
 * synthetic model and texts: $RACIMO_LLAMA_EMBEDDING names a llama-embedding
 * binary (built outside this repository); without it the test skips.  The
 * model is written with the project's own GGUF writer (tiny-qwen3-embed:
 * last pooling; -mean: mean pooling), the texts are tokenized by each side
 * (so the tokenizers must agree too), both normalise with L2, and llama.cpp
 * keeps an f32 KV cache as racimo does here.  The largest difference is
 * printed. */
#include "test.h"
#include "cli_util.h"
#include "model_util.h"
#include "base/err.h"
#include "base/mem.h"
#include "infer/engine.h"
#include "tensor/types.h"

#include <jansson.h>

static const char *const texts[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "embeddings: a vector per text, 1 2 3",
};
enum { N_TEXTS = sizeof texts / sizeof texts[0] };

typedef struct { int done; gen_result res; } waiter;

static void on_done(gen_request *r, const gen_result *res)
{
    waiter *w = r->user;
    w->res = *res;
    w->done = 1;
}

static void compare(const char *preset, const char *pooling)
{
    const char *bin = getenv("RACIMO_LLAMA_EMBEDDING");
    if (!bin || !*bin)
        SKIP("set RACIMO_LLAMA_EMBEDDING to a llama-embedding binary to compare with llama.cpp");
    const char *path = test_make_model(preset, TT_F32, NULL);
    static char cmd[4096], out[1 << 22];
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' --pooling %s --embd-normalize 2 "
             "--embd-output-format json --embd-separator '<#sep#>' -c 256 -t 1 "
             "--cache-type-k f32 --cache-type-v f32 -p '%s<#sep#>%s<#sep#>%s' 2>/dev/null | cat",
             bin, path, pooling, texts[0], texts[1], texts[2]);
    /* test_run adds 2>&1, which would mix llama.cpp's log lines into its JSON: the
     * pipe through cat keeps them out (a failed run shows as output that is not JSON).
     * llama-embedding prints through its asynchronous logger and, on a busy machine,
     * sometimes exits 0 before the end of the JSON is written (seen at the golden
     * commit): such a run is repeated, a few times at most. */
    json_error_t je;
    const char *start = NULL;
    json_t *o = NULL;
    for (int attempt = 0; attempt < 6 && !o; attempt++) {
        int st = test_run(cmd, out, sizeof out);
        if (st)
            FAIL("llama-embedding exited %d: %.2000s", st, out);
        start = strchr(out, '{');
        o = start ? json_loads(start, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    }
    if (!o)
        FAIL("llama-embedding's output is not JSON in 6 runs (%s at %d): %.300s",
             start ? je.text : "no {", start ? je.position : 0, out);
    json_t *data = json_object_get(o, "data");
    CHECK_INT(json_array_size(data), ==, N_TEXTS);

    gguf_file *g;
    tokenizer *tok;
    model *m;
    engine *e;
    CHECK_OK(gguf_open(path, &g));
    CHECK_OK(tok_load(g, &tok));
    CHECK_OK(model_load_file(g, 0, -1, &m));
    engine_params p = { .n_ctx = 256, .n_seq = N_TEXTS, .n_batch = 64, .n_threads = 1,
                        .max_queue = 4, .precision = MATMUL_FAST, .kv_type = TT_F32 };
    CHECK_OK(engine_new(m, tok, &p, &e));
    const int E = m->hp.n_embd;
    float *got = calloc((size_t)N_TEXTS * E, sizeof *got);
    int32_t *ids[N_TEXTS];
    gen_request r[N_TEXTS];
    waiter w[N_TEXTS];
    memset(r, 0, sizeof r);
    memset(w, 0, sizeof w);
    for (int i = 0; i < N_TEXTS; i++) {
        size_t n = 0;
        CHECK_OK(tok_encode(tok, texts[i], strlen(texts[i]), true, true, &ids[i], &n));
        sampler_params_default(&r[i].sampling);
        r[i].prompt = ids[i];
        r[i].n_prompt = (int)n;
        r[i].embedding = got + (size_t)i * E;
        r[i].user = &w[i];
        r[i].on_done = on_done;
        CHECK_OK(engine_submit(e, &r[i]));
    }
    CHECK_OK(engine_run_until_idle(e));
    double worst = 0;
    for (int i = 0; i < N_TEXTS; i++) {
        CHECK_INT(w[i].res.finish, ==, GEN_STOP);
        json_t *v = json_object_get(json_array_get(data, (size_t)i), "embedding");
        CHECK_INT(json_array_size(v), ==, E);
        for (int k = 0; k < E; k++)
            worst = fmax(worst, fabs(json_number_value(json_array_get(v, (size_t)k)) -
                                     got[(size_t)i * E + k]));
        rc_free(ids[i]);
    }
    fprintf(stderr, "  %s (%s pooling): max |racimo - llama.cpp| = %.3g over %d texts of %d "
            "values\n", preset, pooling, worst, N_TEXTS, E);
    if (worst > 1e-4)
        FAIL("racimo's embeddings differ from llama.cpp's by %.3g", worst);
    free(got);
    json_decref(o);
    engine_free(e);
    tok_free(tok);
    model_free(m);
}

TEST(embed_llama_last) { compare("tiny-qwen3-embed", "last"); }
TEST(embed_llama_mean) { compare("tiny-qwen3-embed-mean", "mean"); }
