/* test_embed.c - embedding models in the engine: the pooled vectors equal
 * the float64 reference's normed hidden states pooled by hand (mean, cls,
 * last), with prompts longer than a batch; batching several inputs gives
 * what each gives alone; the engine refuses the other kind of request; the
 * loader reads and checks the pooling type. */
#include "test.h"
#include "model_util.h"
#include "ref_forward.h"
#include "base/err.h"
#include "base/rng.h"
#include "infer/engine.h"
#include "tensor/types.h"

typedef struct {
    int done;
    gen_result res;
} waiter;

static void on_done(gen_request *r, const gen_result *res)
{
    waiter *w = r->user;
    w->res = *res;
    w->done++;
}

typedef struct {
    model *m;
    tokenizer *tok;
    gguf_file *g;
    engine *e;
} fixture;

static void open_engine(fixture *f, const char *path, int n_seq, int n_batch)
{
    CHECK_OK(gguf_open(path, &f->g));
    CHECK_OK(tok_load(f->g, &f->tok));
    CHECK_OK(model_load_file(f->g, 0, -1, &f->m));
    engine_params p = { .n_ctx = 96, .n_seq = n_seq, .n_batch = n_batch, .n_threads = 2,
                        .max_queue = 16, .precision = MATMUL_EXACT };
    CHECK_OK(engine_new(f->m, f->tok, &p, &f->e));
}

static void close_engine(fixture *f)
{
    engine_free(f->e);
    tok_free(f->tok);
    model_free(f->m);
}

static void embed_request(gen_request *r, waiter *w, const int32_t *ids, int n, float *out)
{
    memset(r, 0, sizeof *r);
    memset(w, 0, sizeof *w);
    sampler_params_default(&r->sampling);
    r->prompt = ids;
    r->n_prompt = n;
    r->embedding = out;
    r->user = w;
    r->on_done = on_done;
}

static void random_ids(int32_t *p, int n, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)(rng_next(&r) % 256);
}

/* The reference: pool the float64 normed states, then L2-normalise. */
static void reference(const model *m, const int32_t *ids, int n, double *out)
{
    const int E = m->hp.n_embd;
    double *h = calloc((size_t)n * E, sizeof *h);
    CHECK(h);
    CHECK_OK(ref_hidden(m, ids, n, h));
    for (int i = 0; i < E; i++) {
        double v = 0;
        if (m->hp.pooling == POOL_MEAN) {
            for (int r = 0; r < n; r++)
                v += h[(size_t)r * E + i];
            v /= n;
        } else {
            v = h[(size_t)(m->hp.pooling == POOL_CLS ? 0 : n - 1) * E + i];
        }
        out[i] = v;
    }
    double ss = 0;
    for (int i = 0; i < E; i++)
        ss += out[i] * out[i];
    for (int i = 0; i < E; i++)
        out[i] /= sqrt(ss);
    free(h);
}

enum { N_IN = 5 };
static const int lens[N_IN] = { 40, 1, 17, 33, 8 };   /* 40 and 33: over a batch of 16 */

/* Every input at once through an engine of 3 slots and 16-row batches
 * (chunked prompts, several sequences a batch) against the reference. */
static void pooled_matches_reference(const char *path, int pooling)
{
    fixture f;
    open_engine(&f, path, 3, 16);
    CHECK_INT(f.m->hp.pooling, ==, pooling);
    const int E = f.m->hp.n_embd;
    CHECK_INT(engine_embd_dims(f.e), ==, E);
    int32_t ids[N_IN][40];
    float *got = calloc((size_t)N_IN * E, sizeof *got);
    double *want = calloc((size_t)E, sizeof *want);
    gen_request r[N_IN];
    waiter w[N_IN];
    for (int i = 0; i < N_IN; i++) {
        random_ids(ids[i], lens[i], 50 + i);
        embed_request(&r[i], &w[i], ids[i], lens[i], got + (size_t)i * E);
        CHECK_OK(engine_submit(f.e, &r[i]));
    }
    CHECK_OK(engine_run_until_idle(f.e));
    for (int i = 0; i < N_IN; i++) {
        CHECK_INT(w[i].done, ==, 1);
        CHECK_INT(w[i].res.finish, ==, GEN_STOP);
        CHECK_INT(w[i].res.n_prompt, ==, lens[i]);
        CHECK_INT(w[i].res.n_gen, ==, 0);
        reference(f.m, ids[i], lens[i], want);
        double norm = 0, worst = 0;
        for (int k = 0; k < E; k++) {
            double v = got[(size_t)i * E + k];
            norm += v * v;
            worst = fmax(worst, fabs(v - want[k]));
        }
        CHECK_NEAR(norm, 1.0, 1e-5);
        if (worst > 2e-5)
            FAIL("input %d (%d tokens): max |diff| %.3g against the reference", i, lens[i], worst);
    }
    free(got);
    free(want);
    close_engine(&f);
}

TEST(embed_last_matches_reference)
{
    pooled_matches_reference(test_make_model("tiny-qwen3-embed", TT_F32, NULL), POOL_LAST);
}

TEST(embed_mean_matches_reference)
{
    pooled_matches_reference(test_make_model("tiny-qwen3-embed-mean", TT_F32, NULL), POOL_MEAN);
}

TEST(embed_cls_matches_reference)
{
    synth_params p;
    CHECK_OK(synth_preset("tiny-qwen3-embed", &p));
    p.pooling = POOL_CLS;
    pooled_matches_reference(test_write_model(&p, "embed-cls"), POOL_CLS);
}

/* Inputs batched together equal each input alone in a one-slot engine,
 * and asking again (a slot whose cache holds the same tokens) changes
 * nothing: an embedding never reuses a cached prefix. */
TEST(embed_batched_equals_alone)
{
    const char *path = test_make_model("tiny-qwen3-embed-mean", TT_Q8_0, NULL);
    fixture f, one;
    open_engine(&f, path, 4, 24);
    open_engine(&one, path, 1, 24);
    const int E = f.m->hp.n_embd;
    int32_t ids[N_IN][40];
    float *all = calloc((size_t)N_IN * E, sizeof *all), *alone = calloc((size_t)E, sizeof *alone);
    gen_request r[N_IN];
    waiter w[N_IN];
    for (int i = 0; i < N_IN; i++) {
        random_ids(ids[i], lens[i], 90 + i);
        embed_request(&r[i], &w[i], ids[i], lens[i], all + (size_t)i * E);
        CHECK_OK(engine_submit(f.e, &r[i]));
    }
    CHECK_OK(engine_run_until_idle(f.e));
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < N_IN; i++) {
            gen_request r1;
            waiter w1;
            embed_request(&r1, &w1, ids[i], lens[i], alone);
            CHECK_OK(engine_submit(one.e, &r1));
            CHECK_OK(engine_run_until_idle(one.e));
            CHECK_INT(w1.res.finish, ==, GEN_STOP);
            CHECK_INT(w1.res.n_cached, ==, 0);
            for (int k = 0; k < E; k++)
                CHECK_NEAR(alone[k], all[(size_t)i * E + k], 1e-5);
        }
    free(all);
    free(alone);
    close_engine(&f);
    close_engine(&one);
}

TEST(embed_engine_refuses_other_kind)
{
    fixture f, gen;
    open_engine(&f, test_make_model("tiny-qwen3-embed", TT_Q8_0, NULL), 1, 16);
    open_engine(&gen, test_make_model("tiny-qwen3", TT_Q8_0, NULL), 1, 16);
    CHECK_INT(engine_embd_dims(gen.e), ==, 0);
    int32_t ids[4] = { 1, 2, 3, 4 };
    float v[256];
    gen_request r;
    waiter w;
    embed_request(&r, &w, ids, 4, NULL);      /* a generation request */
    CHECK_INT(engine_submit(f.e, &r), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "makes embeddings"));
    embed_request(&r, &w, ids, 4, v);
    CHECK_INT(engine_submit(gen.e, &r), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "no embeddings"));
    /* an input may fill the whole context (nothing is generated after it) */
    int32_t full[97] = { 0 };
    embed_request(&r, &w, full, 96, v);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(w.res.finish, ==, GEN_STOP);
    embed_request(&r, &w, full, 97, v);
    CHECK_INT(engine_submit(f.e, &r), ==, RC_EINVAL);
    close_engine(&f);
    close_engine(&gen);
}

TEST(embed_model_pooling_types)
{
    synth_params p;
    CHECK_OK(synth_preset("tiny-qwen3-embed", &p));
    model *m = NULL;
    CHECK_OK(model_load(test_write_model(&p, "pool-last"), 0, -1, &m));
    CHECK_INT(m->hp.pooling, ==, POOL_LAST);
    CHECK_STR(model_pooling_name(m->hp.pooling), "last");
    model_free(m);
    p.pooling = 4;                            /* rank: a reranker's classifier head */
    CHECK_INT(model_load(test_write_model(&p, "pool-rank"), 0, -1, &m), ==, RC_EUNSUPPORTED);
    CHECK(strstr(rc_errmsg(), "pooling type 4"));
    CHECK_OK(synth_preset("tiny-qwen3", &p));
    CHECK_OK(model_load(test_write_model(&p, "pool-none"), 0, -1, &m));
    CHECK_INT(m->hp.pooling, ==, POOL_NONE);
    model_free(m);
}
