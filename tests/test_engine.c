/* test_engine.c - the continuous-batching engine: its output equals a plain
 * greedy loop over the stage, concurrent requests do not disturb each other,
 * prefix reuse evaluates only new tokens and changes nothing, and limits,
 * stop strings, cancellation and a full queue behave. */
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "base/rng.h"
#include "infer/engine.h"
#include "infer/exec.h"
#include "tensor/types.h"

typedef struct {
    int32_t ids[256];
    int n_ids;
    char text[4096];
    size_t n_text;
    gen_result res;
    int done;
} collect;

static void on_text(gen_request *r, const char *t, size_t n)
{
    collect *c = r->user;
    CHECK(c->n_text + n < sizeof c->text);
    memcpy(c->text + c->n_text, t, n);
    c->n_text += n;
}

static void on_token(gen_request *r, const gen_token *t)
{
    collect *c = r->user;
    if (c->n_ids < 256)
        c->ids[c->n_ids++] = t->id;
}

static void on_done(gen_request *r, const gen_result *res)
{
    collect *c = r->user;
    c->res = *res;
    c->done++;
}

typedef struct {
    model *m;
    tokenizer *tok;
    engine *e;
} fixture;

static const char *fixture_preset = "tiny";

static void open_fixture(fixture *f, int n_seq, int n_ctx, int n_batch, int max_queue)
{
    const char *path = test_make_model(fixture_preset, TT_Q8_0, NULL);
    gguf_file *g;
    CHECK_OK(gguf_open(path, &g));
    CHECK_OK(tok_load(g, &f->tok));
    CHECK_OK(model_load_file(g, 0, -1, &f->m));
    engine_params p = { .n_ctx = n_ctx, .n_seq = n_seq, .n_batch = n_batch, .n_threads = 2,
                        .max_queue = max_queue, .precision = MATMUL_FAST };
    CHECK_OK(engine_new(f->m, f->tok, &p, &f->e));
}

static void close_fixture(fixture *f)
{
    engine_free(f->e);
    tok_free(f->tok);
    model_free(f->m);
}

static void greedy_request(gen_request *r, collect *c, const int32_t *prompt, int n, int max)
{
    memset(r, 0, sizeof *r);
    memset(c, 0, sizeof *c);
    sampler_params_default(&r->sampling);
    r->sampling.temperature = 0.0f;
    r->prompt = prompt;
    r->n_prompt = n;
    r->max_tokens = max;
    r->ignore_eos = true;
    r->user = c;
    r->on_text = on_text;
    r->on_token = on_token;
    r->on_done = on_done;
}

/* The plain loop: feed the prompt, then argmax and feed back. */
static void reference_greedy(const model *m, const int32_t *prompt, int n, int max, int32_t *out)
{
    stage *s;
    stage_params sp = { .n_ctx = 128, .n_seq = 1, .n_batch = 64, .n_threads = 1, .precision = MATMUL_FAST };
    CHECK_OK(stage_new(m, &sp, &s));
    const int V = m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * 64 * V);
    test_run_tokens(s, prompt, n, 0, 0, 64, logits);
    const float *row = logits + (size_t)(n - 1) * V;
    for (int k = 0; k < max; k++) {
        int best = 0;
        for (int t = 1; t < V; t++)
            if (row[t] > row[best])
                best = t;
        out[k] = best;
        test_run_tokens(s, &out[k], 1, 0, n + k, 1, logits);
        row = logits;
    }
    free(logits);
    stage_free(s);
}

static void random_prompt(int32_t *p, int n, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)(rng_next(&r) % 256);       /* byte tokens */
}

TEST(engine_matches_plain_greedy)
{
    fixture f;
    open_fixture(&f, 1, 128, 16, 4);
    int32_t prompt[40], want[20];
    random_prompt(prompt, 40, 1);
    reference_greedy(f.m, prompt, 40, 20, want);
    gen_request r;
    collect c;
    greedy_request(&r, &c, prompt, 40, 20);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c.done, ==, 1);
    CHECK_INT(c.res.finish, ==, GEN_LENGTH);
    CHECK_INT(c.res.n_gen, ==, 20);
    CHECK_INT(c.n_ids, ==, 20);
    CHECK(memcmp(c.ids, want, sizeof want) == 0);
    close_fixture(&f);
}

/* Four requests at once, with prompts longer than a batch so prefill and
 * decode rows mix, give each one's own greedy tokens. */
static void concurrent_requests(const char *preset)
{
    fixture_preset = preset;
    fixture f;
    open_fixture(&f, 4, 128, 24, 8);
    enum { N = 6 };
    int32_t prompts[N][50], want[N][16];
    int lens[N] = { 50, 7, 33, 1, 20, 45 };
    gen_request r[N];
    collect c[N];
    for (int i = 0; i < N; i++) {
        random_prompt(prompts[i], lens[i], 100 + i);
        reference_greedy(f.m, prompts[i], lens[i], 16, want[i]);
        greedy_request(&r[i], &c[i], prompts[i], lens[i], 16);
        CHECK_OK(engine_submit(f.e, &r[i]));
    }
    CHECK_OK(engine_run_until_idle(f.e));
    for (int i = 0; i < N; i++) {
        CHECK_INT(c[i].done, ==, 1);
        CHECK_INT(c[i].n_ids, ==, 16);
        if (memcmp(c[i].ids, want[i], sizeof want[i]))
            FAIL("request %d differs from its solo greedy run", i);
    }
    close_fixture(&f);
    fixture_preset = "tiny";
}

TEST(engine_concurrent_requests) { concurrent_requests("tiny"); }
/* latent attention: the latent cache slots of several sequences */
TEST(engine_concurrent_requests_deepseek2) { concurrent_requests("tiny-deepseek2"); }

/* A second request that extends the first conversation reuses its cache. */
static void prefix_reuse(const char *preset)
{
    fixture_preset = preset;
    fixture f;
    open_fixture(&f, 2, 128, 32, 4);
    int32_t p1[30], p2[60], want[10];
    random_prompt(p1, 30, 7);
    gen_request r;
    collect c;
    greedy_request(&r, &c, p1, 30, 10);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c.res.n_cached, ==, 0);
    /* conversation so far + its answer + a new turn */
    memcpy(p2, p1, sizeof p1);
    memcpy(p2 + 30, c.ids, 10 * sizeof(int32_t));
    random_prompt(p2 + 40, 20, 8);
    reference_greedy(f.m, p2, 60, 10, want);
    greedy_request(&r, &c, p2, 60, 10);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    /* the last answer token was sampled but never fed, so 39 are cached */
    CHECK_INT(c.res.n_cached, ==, 39);
    CHECK(memcmp(c.ids, want, sizeof want) == 0);
    /* the same prompt again: everything but the last token is reused */
    greedy_request(&r, &c, p2, 60, 10);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c.res.n_cached, ==, 59);
    CHECK(memcmp(c.ids, want, sizeof want) == 0);
    close_fixture(&f);
    fixture_preset = "tiny";
}

TEST(engine_prefix_reuse) { prefix_reuse("tiny"); }
/* a latent cache (keys only: the values are the latent) copied for reuse */
TEST(engine_prefix_reuse_deepseek2) { prefix_reuse("tiny-deepseek2"); }

TEST(engine_limits_cancel_and_queue)
{
    fixture f;
    open_fixture(&f, 1, 64, 16, 1);
    int32_t prompt[70];
    random_prompt(prompt, 70, 3);
    gen_request r[3];
    collect c[3];
    /* a prompt that does not fit the context */
    greedy_request(&r[0], &c[0], prompt, 64, 5);
    CHECK_INT(engine_submit(f.e, &r[0]), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "context") != NULL);
    /* generation stops when the context is full */
    greedy_request(&r[0], &c[0], prompt, 60, 0);
    CHECK_OK(engine_submit(f.e, &r[0]));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c[0].res.finish, ==, GEN_LENGTH);
    CHECK_INT(c[0].res.n_gen, ==, 5);          /* 64 - 60 fed, plus the last sampled */
    /* one slot + one queue place: the third is refused */
    greedy_request(&r[0], &c[0], prompt, 10, 50);
    greedy_request(&r[1], &c[1], prompt + 10, 10, 50);
    greedy_request(&r[2], &c[2], prompt + 20, 10, 50);
    CHECK_OK(engine_submit(f.e, &r[0]));
    CHECK_OK(engine_submit(f.e, &r[1]));
    CHECK_INT(engine_submit(f.e, &r[2]), ==, RC_ELIMIT);
    /* cancel the running one after a few steps; the queued one then runs */
    for (int i = 0; i < 5; i++)
        CHECK_INT(engine_step(f.e), ==, 1);
    atomic_store(&r[0].cancel, true);
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c[0].res.finish, ==, GEN_CANCELLED);
    CHECK(c[0].res.n_gen < 50);
    CHECK_INT(c[1].res.finish, ==, GEN_LENGTH);
    CHECK_INT(c[1].res.n_gen, ==, 50);
    close_fixture(&f);
}

/* A stop string ends generation and is not emitted, even split across
 * tokens; the text before it is. */
TEST(engine_stop_string)
{
    fixture f;
    open_fixture(&f, 1, 128, 16, 1);
    int32_t prompt[10];
    random_prompt(prompt, 10, 9);
    gen_request r;
    collect c;
    greedy_request(&r, &c, prompt, 10, 30);
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK(c.n_text >= 6);
    /* stop at the text that starts at byte 3 of that answer */
    char stop[4] = { c.text[3], c.text[4], c.text[5], 0 };
    if (strlen(stop) < 3 || memchr(c.text, stop[0], 3))
        SKIP("answer text not suitable for this stop string");
    size_t want_len = (size_t)(strstr(c.text, stop) - c.text);
    const char *stops[1] = { stop };
    greedy_request(&r, &c, prompt, 10, 30);
    r.stops = stops;
    r.n_stops = 1;
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c.res.finish, ==, GEN_STOP);
    CHECK_INT(c.n_text, ==, want_len);
    close_fixture(&f);
}

/* A control token gives no text unless the request lists it as one whose
 * text belongs to the answer (tool-call and thinking markers). */
TEST(engine_text_tokens)
{
    fixture f;
    open_fixture(&f, 1, 128, 16, 1);
    int32_t prompt[8];
    random_prompt(prompt, 8, 5);
    int32_t header = tok_find_token(f.tok, "<|start_header_id|>");
    CHECK(header >= 0 && tok_is_control(f.tok, header) && !tok_is_eog(f.tok, header));
    float big = 100.0f;
    gen_request r;
    collect c;
    greedy_request(&r, &c, prompt, 8, 3);
    r.sampling.bias_ids = &header;
    r.sampling.bias_values = &big;
    r.sampling.n_bias = 1;
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    CHECK_INT(c.n_ids, ==, 3);
    CHECK_INT(c.ids[0], ==, header);
    CHECK_INT(c.n_text, ==, 0);
    greedy_request(&r, &c, prompt, 8, 3);
    r.sampling.bias_ids = &header;
    r.sampling.bias_values = &big;
    r.sampling.n_bias = 1;
    int32_t shown[2] = { 7, header };
    r.text_tokens = shown;
    r.n_text_tokens = 2;
    CHECK_OK(engine_submit(f.e, &r));
    CHECK_OK(engine_run_until_idle(f.e));
    c.text[c.n_text] = '\0';
    CHECK_STR(c.text, "<|start_header_id|><|start_header_id|><|start_header_id|>");
    close_fixture(&f);
}

/* ---- surviving a fault: the executor breaks, the engine rebuilds ---- */

/* An executor over a local stage that loses the batch of its n-th result
 * and then says it is broken, as a pipeline that lost a node does. */
typedef struct {
    engine_exec base;
    engine_exec *inner;
    int results_left;          /* results until the fault; < 0: never */
    bool broken;
} flaky_exec;

static int flaky_submit(engine_exec *x, const exec_batch *b)
{
    flaky_exec *f = (flaky_exec *)x;
    if (f->broken)
        return rc_fail(RC_EIO, "node flaky is down");
    return f->inner->submit(f->inner, b);
}

static int flaky_collect(engine_exec *x, int timeout_ms, int *group, const exec_sampled **rows,
                         int *n)
{
    flaky_exec *f = (flaky_exec *)x;
    int rc = f->inner->collect(f->inner, timeout_ms, group, rows, n);
    if (rc == 1 && f->results_left >= 0 && f->results_left-- == 0) {
        f->broken = true;
        return rc_fail(RC_EIO, "node flaky, which ran stage 1, is down");
    }
    return rc;
}

static void flaky_wake(engine_exec *x) { ((flaky_exec *)x)->inner->wake(((flaky_exec *)x)->inner); }
static bool flaky_broken(engine_exec *x) { return ((flaky_exec *)x)->broken; }
static void flaky_free(engine_exec *x)
{
    flaky_exec *f = (flaky_exec *)x;
    f->inner->free(f->inner);
    free(f);
}

static engine_exec *flaky_new(stage *st, int n_seq, int fault_after)
{
    flaky_exec *f = calloc(1, sizeof *f);
    CHECK_OK(exec_local_new(st, n_seq, &f->inner));
    f->base = (engine_exec){ .n_groups = 1, .submit = flaky_submit, .collect = flaky_collect,
                             .wake = flaky_wake, .broken = flaky_broken, .free = flaky_free };
    f->results_left = fault_after;
    return &f->base;
}

typedef struct {
    const model *m;
    stage *stages[4];
    int n_stages, n_seq;
    int faults_left;           /* the rebuilt executors fault again this many times */
    int fault_after;
    bool refuse;               /* the survivors cannot hold the model */
    int calls;
} rebuilder;

static int rebuild(void *ud, const char *why, struct engine_exec **out)
{
    rebuilder *rb = ud;
    rb->calls++;
    CHECK(strstr(why, "flaky") != NULL);
    if (rb->refuse)
        return rc_fail(RC_ENOMEM, "the nodes left offer 1 GiB, the model needs 2 GiB");
    stage_params sp = { .n_ctx = 128, .n_seq = rb->n_seq, .n_batch = 24, .n_threads = 2,
                        .precision = MATMUL_FAST };
    stage *st;
    CHECK_OK(stage_new(rb->m, &sp, &st));   /* empty caches: a new plan */
    rb->stages[rb->n_stages++] = st;
    *out = flaky_new(st, rb->n_seq, rb->faults_left-- > 0 ? rb->fault_after : -1);
    return 0;
}

static const char *fault_grammar;   /* run_with_faults' requests' grammar, or NULL */

/* Requests (greedy, and sampled with a seed and penalties) run on an
 * engine whose executor faults after `fault_after` results; n_faults
 * times, each rebuilt.  Returns the tokens in c. */
static void run_with_faults(const model *m, const tokenizer *tok, int fault_after, int n_faults,
                            bool refuse, collect *c, int n_req, rebuilder *rb)
{
    enum { N_SEQ = 3 };
    memset(rb, 0, sizeof *rb);
    rb->m = m;
    rb->n_seq = N_SEQ;
    rb->fault_after = fault_after;
    rb->faults_left = n_faults - 1;
    rb->refuse = refuse;
    stage_params sp = { .n_ctx = 128, .n_seq = N_SEQ, .n_batch = 24, .n_threads = 2,
                        .precision = MATMUL_FAST };
    CHECK_OK(stage_new(m, &sp, &rb->stages[rb->n_stages++]));
    engine_params ep = { .n_ctx = 128, .n_seq = N_SEQ, .n_batch = 24, .n_threads = 2,
                         .max_queue = 8, .precision = MATMUL_FAST };
    engine *e;
    CHECK_OK(engine_new_exec(flaky_new(rb->stages[0], N_SEQ, n_faults > 0 ? fault_after : -1),
                             tok, m->hp.n_vocab, &ep, &e));
    engine_set_rebuild(e, rebuild, rb);
    static int32_t prompts[8][40];
    gen_request r[8];
    for (int i = 0; i < n_req; i++) {
        random_prompt(prompts[i], 10 + 7 * i, 500 + i);
        greedy_request(&r[i], &c[i], prompts[i], 10 + 7 * i, 30);
        r[i].grammar = fault_grammar;
        if (i % 2) {             /* sampled: seed, top-k, penalties */
            r[i].sampling.temperature = 0.9f;
            r[i].sampling.top_k = 40;
            r[i].sampling.seed = 1234 + (uint64_t)i;
            r[i].sampling.presence_penalty = 0.5f;
            r[i].sampling.repeat_penalty = 1.1f;
        }
        CHECK_OK(engine_submit(e, &r[i]));
    }
    CHECK_OK(engine_run_until_idle(e));
    engine_stats st;
    engine_get_stats(e, &st);
    if (!refuse && n_faults > 0) {
        CHECK_INT(st.n_recoveries, ==, n_faults);
        CHECK(st.tokens_replayed > 0 && st.last_recovery_seqs >= 1);
        CHECK(strstr(st.last_recovery_why, "flaky") != NULL);
        CHECK(!engine_broken(e));
    }
    if (refuse) {
        CHECK_INT(st.n_recoveries_failed, ==, 1);
        CHECK(engine_broken(e));
    }
    engine_free(e);
    for (int i = 0; i < rb->n_stages; i++)
        stage_free(rb->stages[i]);
}

/* A fault in the middle of generation (after 5 and again after 11
 * results: prompts, first tokens and decodes in flight) changes no token
 * of any request, greedy or sampled with a seed; a rebuild that cannot be
 * done ends the requests with the reason, nothing hangs. */
static void rebuild_same_tokens(const char *preset)
{
    fixture_preset = preset;
    fixture f;
    open_fixture(&f, 1, 128, 16, 4);
    enum { N = 5 };
    collect want[N], got[N];
    rebuilder rb;
    run_with_faults(f.m, f.tok, -1, 0, false, want, N, &rb);
    for (int i = 0; i < N; i++) {
        CHECK_INT(want[i].res.finish, ==, GEN_LENGTH);
        CHECK_INT(want[i].n_ids, ==, 30);
    }
    static const int after[] = { 0, 5, 11, 40 };
    for (size_t a = 0; a < sizeof after / sizeof after[0]; a++) {
        run_with_faults(f.m, f.tok, after[a], a == 2 ? 2 : 1, false, got, N, &rb);
        CHECK_INT(rb.calls, ==, a == 2 ? 2 : 1);
        for (int i = 0; i < N; i++) {
            CHECK_INT(got[i].res.finish, ==, GEN_LENGTH);
            CHECK_INT(got[i].n_ids, ==, 30);
            if (memcmp(got[i].ids, want[i].ids, sizeof(int32_t) * 30) ||
                got[i].n_text != want[i].n_text || memcmp(got[i].text, want[i].text, want[i].n_text))
                FAIL("fault after %d results: request %d (%s) differs from the run without it",
                     after[a], i, i % 2 ? "sampled" : "greedy");
            CHECK(i % 2 == 0 || got[i].res.seed == want[i].res.seed);
        }
    }
    run_with_faults(f.m, f.tok, 5, 1, true, got, N, &rb);
    for (int i = 0; i < N; i++) {
        CHECK_INT(got[i].done, ==, 1);
        CHECK_INT(got[i].res.finish, ==, GEN_ERROR);
        CHECK(strstr(got[i].res.error, "flaky") && strstr(got[i].res.error, "2 GiB"));
    }
    close_fixture(&f);
    fixture_preset = "tiny";
}

/* The same under a grammar: the rebuilt samplers replay it and its draws
 * (a sampled token costs two), so no token changes; and the tokens obey it
 * (20 bytes a request cannot end a grammar of 200). */
TEST_T(engine_rebuild_grammar, 120)
{
    fixture f;
    open_fixture(&f, 1, 128, 16, 4);
    enum { N = 5 };
    collect want[N], got[N];
    rebuilder rb;
    fault_grammar = "root ::= [a-z ]{200,400}";
    run_with_faults(f.m, f.tok, -1, 0, false, want, N, &rb);
    for (int i = 0; i < N; i++) {
        CHECK_INT(want[i].res.finish, ==, GEN_LENGTH);
        for (size_t k = 0; k < want[i].n_text; k++)
            CHECK(want[i].text[k] == ' ' || (want[i].text[k] >= 'a' && want[i].text[k] <= 'z'));
    }
    static const int after[] = { 5, 11 };
    for (size_t a = 0; a < sizeof after / sizeof after[0]; a++) {
        run_with_faults(f.m, f.tok, after[a], 1, false, got, N, &rb);
        for (int i = 0; i < N; i++)
            if (got[i].n_ids != want[i].n_ids ||
                memcmp(got[i].ids, want[i].ids, sizeof(int32_t) * (size_t)want[i].n_ids))
                FAIL("fault after %d results: request %d differs from the run without it",
                     after[a], i);
    }
    fault_grammar = NULL;
    close_fixture(&f);
}

TEST_T(engine_rebuild_same_tokens, 180) { rebuild_same_tokens("tiny"); }
/* 0.4 s alone; it passed 60 s on loaded machines before pool.c let the caller take idle shares */
TEST_T(engine_rebuild_same_tokens_deepseek2, 180) { rebuild_same_tokens("tiny-deepseek2"); }
