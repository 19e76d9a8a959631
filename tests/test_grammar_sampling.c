/* test_grammar_sampling.c - grammars where tokens are sampled: sample_set
 * (obeying, replaying after a restart, lazy triggers, a grammar that must
 * end, every allowed token banned, a shard's mask), the engine that runs a
 * random-weight model under a grammar, and a start's grammar on the
 * pipeline's wire.  The synthetic vocabulary's first 256 tokens are the
 * bytes, so an ASCII character's token is its code. */
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"
#include "cluster/pipeline_internal.h"
#include "infer/engine.h"
#include "infer/exec.h"
#include "tensor/types.h"

#include <ctype.h>

/* The tiny model's tokenizer, a sample_set of n_seq slots over it and a
 * row of logits. */
typedef struct {
    gguf_file *g;
    tokenizer *tok;
    int V;
    sample_set *s;
    float *row;
} vocab_fixture;

static void open_vocab(vocab_fixture *f, int n_seq)
{
    CHECK_OK(gguf_open(test_make_model("tiny", TT_Q8_0, NULL), &f->g));
    CHECK_OK(tok_load(f->g, &f->tok));
    f->V = tok_n_vocab(f->tok);
    CHECK_OK(sample_set_new(n_seq, f->V, &f->s));
    sample_set_use_tokenizer(f->s, f->tok);
    CHECK((f->row = malloc(sizeof(float) * (size_t)f->V)));
}

static void close_vocab(vocab_fixture *f)
{
    free(f->row);
    sample_set_free(f->s);
    tok_free(f->tok);
    gguf_close(f->g);
}

static exec_start greedy_start(int seq, const char *gbnf)
{
    exec_start st = { .seq = seq, .grammar = gbnf, .grammar_len = gbnf ? (int)strlen(gbnf) : 0 };
    sampler_params_default(&st.sp);
    st.sp.temperature = 0.0f;
    st.sp.seed = 1;
    return st;
}

/* A row whose best token is `want` (the others level). */
static void one_hot(float *row, int V, int32_t want)
{
    for (int i = 0; i < V; i++)
        row[i] = 0.0f;
    row[want] = 10.0f;
}

static void random_row(float *row, int V, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < V; i++)
        row[i] = (float)(rng_uniform(&r) * 6.0 - 3.0);
}

static int32_t sample(sample_set *s, int seq, float *row)
{
    exec_sampled x;
    CHECK_OK(sample_set_sample(s, seq, row, &x));
    return x.token;
}

/* "[" 1-3 digits ("," 1-3 digits){0,3} "]", checked by hand. */
static const char list_gbnf[] =
    "root ::= \"[\" num (\",\" num){0,3} \"]\"\n"
    "num  ::= [0-9]{1,3}   # a number\n";

static bool is_list(const char *s, size_t n)
{
    size_t i = 0;
    if (n < 3 || s[i++] != '[')
        return false;
    for (int items = 0; items < 4; items++) {
        int d = 0;
        while (i < n && isdigit((unsigned char)s[i]) && d < 4)
            i++, d++;
        if (d < 1 || d > 3 || i >= n)
            return false;
        if (s[i] == ']')
            return i + 1 == n;
        if (s[i++] != ',')
            return false;
    }
    return false;
}

TEST(grammar_sample_set_obeys)
{
    vocab_fixture f;
    open_vocab(&f, 2);
    sample_set *s = f.s;
    float *row = f.row;
    /* greedy and random, on random rows: the text is a list and ends with
     * an end-of-generation token */
    for (int mode = 0; mode < 2; mode++) {
        exec_start st = greedy_start(mode, list_gbnf);
        if (mode) {
            st.sp.temperature = 1.0f;
            st.sp.top_k = 0;
        }
        CHECK_OK(sample_set_start(s, &st));
        char text[256];
        size_t n = 0;
        bool ended = false;
        for (int k = 0; k < 60 && !ended; k++) {
            random_row(row, f.V, 1000 * (uint64_t)mode + (uint64_t)k);
            int32_t t = sample(s, mode, row);
            CHECK_INT(t, >=, 0);
            if (tok_is_eog(f.tok, t)) {
                ended = true;
                break;
            }
            int m = tok_piece(f.tok, t, true, text + n, sizeof text - n);
            CHECK(m >= 0 && n + (size_t)m < sizeof text);
            n += (size_t)m;
        }
        CHECK(ended);
        if (!is_list(text, n))
            FAIL("mode %d: not a list: '%.*s'", mode, (int)n, text);
    }
    close_vocab(&f);
}

TEST(grammar_sample_set_replay)
{
    vocab_fixture f;
    open_vocab(&f, 2);
    sample_set *s = f.s;
    float *row = f.row;
    /* random sampling over random rows: many first draws are refused and
     * drawn again, so the replay must count two draws a token */
    const char *gbnf = "root ::= [a-z ]+ \".\"";
    exec_start st = greedy_start(0, gbnf);
    st.sp.temperature = 1.5f;
    st.sp.top_k = 0;
    st.sp.top_p = 1.0f;
    st.sp.min_p = 0.0f;
    st.sp.seed = 42;
    CHECK_OK(sample_set_start(s, &st));
    int32_t first[40];
    int n = 0;
    while (n < 40) {          /* (the seeds are fixed: this does not vary) */
        random_row(row, f.V, (uint64_t)n);
        first[n] = sample(s, 0, row);
        CHECK_INT(first[n], >=, 0);
        if (tok_is_eog(f.tok, first[n++]))
            break;
    }
    CHECK_INT(n, >, 25);
    /* slot 1 restarts after 15 tokens and goes on as slot 0 did */
    exec_start again = st;
    again.seq = 1;
    again.generated = first;
    again.n_generated = 15;
    CHECK_OK(sample_set_start(s, &again));
    for (int k = 15; k < n; k++) {
        random_row(row, f.V, (uint64_t)k);
        CHECK_INT(sample(s, 1, row), ==, first[k]);
    }
    /* generated tokens the grammar refuses are refused at the start */
    int32_t bad[2] = { 'a', '7' };
    again.generated = bad;
    again.n_generated = 2;
    CHECK_INT(sample_set_start(s, &again), ==, RC_EINVAL);
    close_vocab(&f);
}

TEST(grammar_sample_set_lazy_trigger)
{
    vocab_fixture f;
    open_vocab(&f, 1);
    sample_set *s = f.s;
    float *row = f.row;
    const char *trig[] = { "<call>", "<x>" };
    exec_start st = greedy_start(0, "root ::= \"<x>\" [0-9]+ \";\"");
    st.triggers = trig;
    st.n_triggers = 2;
    CHECK_OK(sample_set_start(s, &st));
    /* free text before the trigger (the grammar would refuse it), the
     * trigger split over tokens, then a letter the grammar refuses */
    const char *want = "ab<x>";
    for (const char *p = want; *p; p++) {
        one_hot(row, f.V, (unsigned char)*p);
        CHECK_INT(sample(s, 0, row), ==, (unsigned char)*p);
        CHECK_INT(sample_set_constrain(s, 0, row), ==, p[1] ? 0 : 1);
    }
    one_hot(row, f.V, 'q');
    int32_t t = sample(s, 0, row);
    char piece[64];
    int n = tok_piece(f.tok, t, true, piece, sizeof piece);
    if (n < 1 || !isdigit((unsigned char)piece[0]))
        FAIL("after the trigger: token %d '%.*s'", t, n, piece);
    close_vocab(&f);
}

TEST(grammar_sample_set_end_and_banned)
{
    vocab_fixture f;
    open_vocab(&f, 2);
    sample_set *s = f.s;
    float *row = f.row;
    /* a grammar that must end gets an end-of-generation token */
    exec_start st = greedy_start(0, "root ::= \"ok\"");
    CHECK_OK(sample_set_start(s, &st));
    one_hot(row, f.V, 'o');
    CHECK_INT(sample(s, 0, row), ==, 'o');
    one_hot(row, f.V, 'z');
    CHECK_INT(sample(s, 0, row), ==, 'k');
    one_hot(row, f.V, 'z');
    CHECK(tok_is_eog(f.tok, sample(s, 0, row)));
    /* logit_bias bans the one token the grammar allows */
    int32_t ban_id = 'a';
    float ban_v = -INFINITY;
    st = greedy_start(1, "root ::= \"a\"");
    st.sp.bias_ids = &ban_id;
    st.sp.bias_values = &ban_v;
    st.sp.n_bias = 1;
    CHECK_OK(sample_set_start(s, &st));
    one_hot(row, f.V, 'b');
    CHECK_INT(sample(s, 1, row), ==, EXEC_GRAMMAR_BANNED);
    /* a shard's mask keeps only what the grammar allows */
    st = greedy_start(1, "root ::= \"a\"");
    CHECK_OK(sample_set_start(s, &st));
    for (int i = 0; i < f.V; i++)
        row[i] = 0.0f;
    CHECK_INT(sample_set_constrain(s, 1, row), ==, 1);
    CHECK(row['a'] == 0.0f && row['b'] == -INFINITY && row[f.V - 1] == -INFINITY);
    /* a grammar that does not compile is refused with where */
    st = greedy_start(1, "root ::= \"a\" undefined_rule");
    CHECK_INT(sample_set_start(s, &st), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "grammar"));
    /* without a vocabulary there are no grammars */
    sample_set *bare;
    CHECK_OK(sample_set_new(1, f.V, &bare));
    st = greedy_start(0, "root ::= \"a\"");
    CHECK(sample_set_start(bare, &st) != 0);
    sample_set_free(bare);
    close_vocab(&f);
}

/* ---- the engine over a random-weight model ---- */

typedef struct {
    char text[512];
    size_t n;
    gen_result res;
    int done;
} collect;

static void on_text(gen_request *r, const char *t, size_t n)
{
    collect *c = r->user;
    if (c->n + n < sizeof c->text) {
        memcpy(c->text + c->n, t, n);
        c->n += n;
    }
}

static void on_done(gen_request *r, const gen_result *res)
{
    collect *c = r->user;
    c->res = *res;
    c->done++;
}

TEST(grammar_engine_output)
{
    gguf_file *g;
    tokenizer *tok;
    model *m;
    engine *e;
    CHECK_OK(gguf_open(test_make_model("tiny", TT_Q8_0, NULL), &g));
    CHECK_OK(tok_load(g, &tok));
    CHECK_OK(model_load_file(g, 0, -1, &m));
    engine_params p = { .n_ctx = 256, .n_seq = 2, .n_batch = 64, .n_threads = 1, .max_queue = 4,
                        .precision = MATMUL_FAST };
    CHECK_OK(engine_new(m, tok, &p, &e));
    int32_t prompt[8] = { 'h', 'e', 'l', 'l', 'o', ' ', 'x', 'y' };
    gen_request r[3];
    collect c[3];
    int32_t ban_id = '[';
    float ban_v = -INFINITY;
    for (int i = 0; i < 3; i++) {
        memset(&r[i], 0, sizeof r[i]);
        memset(&c[i], 0, sizeof c[i]);
        sampler_params_default(&r[i].sampling);
        r[i].sampling.temperature = i == 1 ? 1.0f : 0.0f;
        r[i].sampling.seed = 5;
        r[i].prompt = prompt;
        r[i].n_prompt = 8;
        r[i].max_tokens = 64;
        r[i].ignore_eos = true;     /* the grammar's end still ends it */
        r[i].grammar = list_gbnf;
        r[i].user = &c[i];
        r[i].on_text = on_text;
        r[i].on_done = on_done;
    }
    r[2].sampling.bias_ids = &ban_id;
    r[2].sampling.bias_values = &ban_v;
    r[2].sampling.n_bias = 1;
    for (int i = 0; i < 3; i++)
        CHECK_OK(engine_submit(e, &r[i]));
    CHECK_OK(engine_run_until_idle(e));
    for (int i = 0; i < 2; i++) {
        CHECK_INT(c[i].done, ==, 1);
        CHECK_INT(c[i].res.finish, ==, GEN_STOP);
        if (!is_list(c[i].text, c[i].n))
            FAIL("request %d: not a list: '%.*s'", i, (int)c[i].n, c[i].text);
    }
    CHECK_INT(c[2].res.finish, ==, GEN_ERROR);
    if (!strstr(c[2].res.error, "grammar allows no token"))
        FAIL("error: %s", c[2].res.error);
    engine_free(e);
    model_free(m);
    tok_free(tok);
}

/* ---- a start's grammar on the pipeline's wire ---- */

TEST(grammar_wire_start)
{
    const char *trig[] = { "<tool_call>", "[" };
    int32_t prompt[3] = { 1, 2, 3 };
    exec_start st = greedy_start(3, list_gbnf);
    st.prompt = prompt;
    st.n_prompt = 3;
    st.triggers = trig;
    st.n_triggers = 2;
    wbuf w = { 0 };
    pl__put_start(&w, &st, ENC_STARTS_GRAMMAR);
    CHECK(!w.oom);
    rbuf r = { .p = w.p, .len = w.len };
    wire_start ws;
    pl__get_start(&r, &ws, ENC_STARTS_GRAMMAR);
    CHECK(!r.bad && r.off == w.len);
    CHECK_INT(ws.s.seq, ==, 3);
    CHECK_INT(ws.s.grammar_len, ==, (int)strlen(list_gbnf));
    CHECK(!memcmp(ws.s.grammar, list_gbnf, strlen(list_gbnf)));
    CHECK_INT(ws.s.n_triggers, ==, 2);
    CHECK_STR(ws.s.triggers[0], "<tool_call>");
    CHECK_STR(ws.s.triggers[1], "[");
    /* without the flag the same start reads as a 2.1 node sends it: no grammar */
    wbuf w0 = { 0 };
    pl__put_start(&w0, &st, 0);
    rbuf r0 = { .p = w0.p, .len = w0.len };
    pl__get_start(&r0, &ws, 0);
    CHECK(!r0.bad && r0.off == w0.len && !ws.s.grammar && ws.s.n_triggers == 0);
    /* hostile: a trigger that lacks its NUL, one too long, too many, a
     * grammar longer than the bound or than the message */
    uint8_t *bytes = w.p;
    size_t tail = w.len - (strlen("<tool_call>") + 1 + 4 + 2 + 4) - 4;   /* at n_triggers */
    int32_t v;
    memcpy(&v, bytes + tail, 4);
    CHECK_INT(v, ==, 2);
    bytes[tail + 4 + 4 + strlen("<tool_call>")] = 'X';        /* its NUL */
    r = (rbuf){ .p = w.p, .len = w.len };
    pl__get_start(&r, &ws, ENC_STARTS_GRAMMAR);
    CHECK(r.bad);
    bytes[tail + 4 + 4 + strlen("<tool_call>")] = 0;
    v = 300;
    memcpy(bytes + tail + 4, &v, 4);                           /* its length */
    r = (rbuf){ .p = w.p, .len = w.len };
    pl__get_start(&r, &ws, ENC_STARTS_GRAMMAR);
    CHECK(r.bad);
    v = EXEC_MAX_TRIGGERS + 1;
    memcpy(bytes + tail, &v, 4);
    r = (rbuf){ .p = w.p, .len = w.len };
    pl__get_start(&r, &ws, ENC_STARTS_GRAMMAR);
    CHECK(r.bad);
    size_t glen_at = tail - strlen(list_gbnf) - 4;
    for (int k = 0; k < 2; k++) {
        v = k ? MAX_GRAMMAR_WIRE + 1 : MAX_GRAMMAR_WIRE;
        memcpy(bytes + glen_at, &v, 4);
        r = (rbuf){ .p = w.p, .len = w.len };
        pl__get_start(&r, &ws, ENC_STARTS_GRAMMAR);
        CHECK(r.bad);
    }
    rc_free(w.p);
    rc_free(w0.p);
}
