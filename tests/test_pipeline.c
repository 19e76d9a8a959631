/* test_pipeline.c - one model across two nodes in one process (two
 * clusters on loopback): the engine over a 2-stage pipeline gives the same
 * tokens as the engine over the whole model (f32 wire: bit for bit; with
 * sampling, penalties and several requests at once), hostile stage
 * messages are refused without harm, and a stage node that goes away ends
 * the requests in flight with an error naming it.  The same for two
 * tensor-parallel shards.  A third node cannot feed, answer for or stop an
 * instance it is not part of, and a set-up beyond the limits or the
 * memory a node offers is refused with the reason. */
#include "test.h"
#include "cluster_util.h"

#include "base/err.h"
#include "cluster/channel.h"
#include "cluster/cluster.h"
#include "cluster/pipeline.h"
#include "cluster/pipeline_internal.h"
#include "cluster/wire.h"
#include "infer/engine.h"
#include "infer/lm.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    struct cluster *c;
    pipeline *p;
    char dir[600], models[700];
} node;

static uint64_t start_max_memory;  /* > 0: the node offers at most this (--max-memory) */

static void start(node *n, const char *name, const char *token, const node *peer)
{
    char addr[64];
    const char *peers[1];
    cluster_config cfg;
    test_cluster_config(&cfg, name, token, peer ? cluster_port(peer->c) : 0, n->dir,
                        sizeof n->dir, n->models, sizeof n->models, addr, peers);
    cfg.max_memory = start_max_memory;
    CHECK_OK(cluster_new(&cfg, &n->c, NULL));
    CHECK_OK(pipeline_new(n->c, 1, &n->p));
    CHECK_OK(cluster_start(n->c));
}

static void stop(node *n)
{
    if (!n->c)
        return;
    pipeline_stop(n->p);
    cluster_free(n->c);
    pipeline_free(n->p);
    n->c = NULL;
}

static bool sees_up(node *n, const char *id)
{
    json_t *s = cluster_snapshot(n->c), *x;
    size_t i;
    bool ok = false;
    json_array_foreach(json_object_get(s, "nodes"), i, x)
        ok = ok || (!strcmp(json_string_value(json_object_get(x, "id")), id) &&
                    !strcmp(json_string_value(json_object_get(x, "state")), "up"));
    json_decref(s);
    return ok;
}

static void wait_up(node *a, node *b)
{
    for (int t = 0; t < 8000; t += 20) {
        if (sees_up(a, cluster_self_id(b->c)) && sees_up(b, cluster_self_id(a->c)))
            return;
        usleep(20000);
    }
    FAIL("the two nodes never linked");
}

typedef struct {
    int32_t ids[64];
    int n;
    gen_result res;
    int done;
} collect;

static void on_token(gen_request *r, const gen_token *t)
{
    collect *c = r->user;
    if (c->n < 64)
        c->ids[c->n++] = t->id;
}
static void on_done(gen_request *r, const gen_result *res)
{
    collect *c = r->user;
    c->res = *res;
    c->done++;
}

#define N_REQ 3
static const char *run_grammar;    /* run_all's requests' grammar, or NULL */
static const int32_t prompts[N_REQ][6] = { { 1, 5, 9, 13 }, { 2, 7, 7, 30, 31, 4 }, { 3, 100 } };
static const int n_prompt[N_REQ] = { 4, 6, 2 };

/* Runs N_REQ requests at once: request 0 greedy, request 1 samples from
 * the top 3 with penalties, a ban and a bias (the ban in the lower half of
 * the vocabulary, and a bias that makes 6 ids of the upper half the likely
 * ones, so that the penalties of what they generate decide between them:
 * shard 1 ranks them with its copy of the sampler), request 2 greedy with
 * log-probs. */
static void run_all(engine *e, collect *out, int max_tokens)
{
    gen_request rq[N_REQ];
    int32_t bias_id[7] = { 17, 300, 301, 302, 303, 304, 305 };
    float bias[7] = { -1000, 8, 8, 8, 8, 8, 8 };
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < N_REQ; i++) {
        memset(&out[i], 0, sizeof out[i]);
        sampler_params_default(&rq[i].sampling);
        if (i == 1) {
            rq[i].sampling.temperature = 0.9f;
            rq[i].sampling.seed = 42;
            rq[i].sampling.top_k = 3;
            rq[i].sampling.frequency_penalty = 1.5f;
            rq[i].sampling.repeat_penalty = 1.2f;
            rq[i].sampling.bias_ids = bias_id;
            rq[i].sampling.bias_values = bias;
            rq[i].sampling.n_bias = 7;
        } else {
            rq[i].sampling.temperature = 0;
        }
        rq[i].prompt = prompts[i];
        rq[i].n_prompt = n_prompt[i];
        rq[i].max_tokens = max_tokens;
        rq[i].ignore_eos = true;
        rq[i].n_logprobs = i == 2 ? 3 : 0;
        rq[i].grammar = run_grammar;
        rq[i].user = &out[i];
        rq[i].on_token = on_token;
        rq[i].on_done = on_done;
        CHECK_OK(engine_submit(e, &rq[i]));
    }
    for (int step = 0; step < 100000; step++) {
        int all = 1;
        for (int i = 0; i < N_REQ; i++)
            all &= out[i].done;
        if (all)
            break;
        CHECK_INT(engine_step(e), >=, 0);
    }
    for (int i = 0; i < N_REQ; i++)
        CHECK_INT(out[i].done, ==, 1);
}

/* The KV cache type of pipeline_engine's stages and of two_nodes'
 * reference engine. */
static int cache_type = TT_F32;

/* split > 0: stages [0, split) and [split, n_layer); split 0: two
 * tensor-parallel shards of every layer. */
static engine *pipeline_engine(node *head, const lm *l, const char *model_name,
                               const char *s0, const char *s1, int split, bool f32)
{
    pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.model, sizeof spec.model, "%s", model_name);
    spec.n_layer = l->m ? l->m->hp.n_layer : 4;
    model_hparams hp;
    CHECK_OK(model_read_hparams(l->file, &hp));
    spec.n_layer = hp.n_layer;
    spec.n_embd = hp.n_embd;
    spec.n_vocab = hp.n_vocab;
    spec.n_ctx = 128;
    spec.n_seq = 4;
    spec.n_batch = 32;
    spec.n_threads = 1;
    spec.wire_f32 = f32;
    spec.kv_type = cache_type;
    spec.pooling = hp.pooling;
    spec.n_stages = 2;
    snprintf(spec.stage[0].node, 33, "%s", s0);
    snprintf(spec.stage[1].node, 33, "%s", s1);
    spec.tensor = split == 0;
    spec.stage[0].first = 0;
    spec.stage[0].last = split ? split : hp.n_layer;
    spec.stage[1].first = split;
    spec.stage[1].last = hp.n_layer;
    engine_exec *x = NULL;
    CHECK_OK(pipeline_exec_new(head->p, &spec, 20000, NULL, NULL, &x));
    engine_params ep = { .n_ctx = 128, .n_seq = 4, .n_batch = 32, .n_threads = 1,
                         .max_queue = 8, .precision = MATMUL_FAST };
    engine *e = NULL;
    CHECK_OK(engine_new_exec(x, l->tok, hp.n_vocab, &ep, &e));
    return e;
}

static const char *model_preset = "tiny";   /* of write_model */

static void write_model(const char *path)
{
    synth_params p;
    CHECK_OK(synth_preset(model_preset, &p));
    p.n_layer = 4;
    p.type = TT_Q8_0;
    CHECK_OK(synth_write(path, &p));
}

/* The requests of run_all gave the reference's tokens, to the length
 * asked, with the reference's seed for the sampled one. */
static void check_same(const collect *got, const collect *ref)
{
    for (int i = 0; i < N_REQ; i++) {
        CHECK_INT(got[i].n, ==, ref[i].n);
        CHECK(!memcmp(got[i].ids, ref[i].ids, (size_t)ref[i].n * sizeof(int32_t)));
        CHECK_INT(got[i].res.finish, ==, GEN_LENGTH);
        CHECK(got[i].res.seed == ref[i].res.seed || i != 1);
    }
}

/* Two linked nodes, each with the model m4 in its folder (A's path in pa),
 * and the reference: the whole model's tokens for run_all in one engine. */
static void two_nodes(node *a, node *b, const char *name_a, const char *name_b, char *pa,
                      size_t cap, lm *whole, collect *ref)
{
    start(a, name_a, NULL, NULL);
    start(b, name_b, cluster_join_token(a->c), a);
    wait_up(a, b);
    char pb[800];
    snprintf(pa, cap, "%s/m4.gguf", a->models);
    snprintf(pb, sizeof pb, "%s/m4.gguf", b->models);
    write_model(pa);
    write_model(pb);
    CHECK_OK(lm_open(whole, pa, true, NULL));
    engine_params ep = { .n_ctx = 128, .n_seq = 4, .n_batch = 32, .n_threads = 1,
                         .max_queue = 8, .precision = MATMUL_FAST, .kv_type = cache_type };
    engine *ref_e;
    CHECK_OK(engine_new(whole->m, whole->tok, &ep, &ref_e));
    run_all(ref_e, ref, 20);
    engine_free(ref_e);
}

/* A 2-stage pipeline (sampling on A) and two tensor-parallel shards
 * (shard 0 on A) give two_nodes' reference tokens; then closes the models
 * and stops both nodes. */
static void pipeline_and_shards_same(node *a, node *b, const char *pa, lm *whole,
                                     const collect *ref)
{
    collect got[N_REQ];
    lm head;
    CHECK_OK(lm_open(&head, pa, false, NULL));
    engine *e = pipeline_engine(a, &head, "m4", cluster_self_id(b->c), cluster_self_id(a->c), 2,
                                true);
    run_all(e, got, 20);
    check_same(got, ref);
    engine_free(e);
    e = pipeline_engine(a, &head, "m4", cluster_self_id(a->c), cluster_self_id(b->c), 0, true);
    run_all(e, got, 20);
    check_same(got, ref);
    engine_free(e);
    lm_close(&head);
    lm_close(whole);
    stop(b);
    stop(a);
}

/* Node `victim` of e's instance dies while a request runs: the request
 * ends with an error naming it, the engine is broken; frees e. */
static void check_death(engine *e, node *victim)
{
    gen_request rq;
    collect c;
    memset(&rq, 0, sizeof rq);
    memset(&c, 0, sizeof c);
    sampler_params_default(&rq.sampling);
    rq.sampling.temperature = 0;
    rq.prompt = prompts[0];
    rq.n_prompt = n_prompt[0];
    rq.max_tokens = 120;
    rq.ignore_eos = true;
    rq.user = &c;
    rq.on_token = on_token;
    rq.on_done = on_done;
    CHECK_OK(engine_submit(e, &rq));
    for (int i = 0; i < 3; i++)
        engine_step(e);
    stop(victim);
    for (int step = 0; step < 2000 && !c.done; step++)
        engine_step(e);
    CHECK_INT(c.done, ==, 1);
    CHECK_INT(c.res.finish, ==, GEN_ERROR);
    CHECK(strstr(c.res.error, "is down") != NULL);
    CHECK(engine_broken(e));
    engine_free(e);
}

TEST_T(pipeline_two_nodes_same_tokens, 120)
{
    node a = { 0 }, b = { 0 };
    char pa[800];
    lm whole;
    collect ref[N_REQ], got[N_REQ];
    two_nodes(&a, &b, "pa", "pb", pa, sizeof pa, &whole, ref);

    /* head A; stage 0 on B, stage 1 (sampling) on A; f32 hidden states */
    lm head;
    CHECK_OK(lm_open(&head, pa, false, NULL));
    engine *e = pipeline_engine(&a, &head, "m4", cluster_self_id(b.c), cluster_self_id(a.c), 1,
                                true);
    run_all(e, got, 20);
    check_same(got, ref);
    /* prefix reuse through the pipeline: the same requests again */
    run_all(e, got, 20);
    for (int i = 0; i < N_REQ; i++)
        CHECK(!memcmp(got[i].ids, ref[i].ids, (size_t)ref[i].n * sizeof(int32_t)));
    CHECK(!engine_broken(e));
    json_t *st = pipeline_status(a.p);
    CHECK_INT(json_array_size(json_object_get(st, "instances")), ==, 1);
    json_decref(st);
    engine_free(e);

    /* f16 on the wire: runs, same lengths (the tokens may differ) */
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 3, false);
    run_all(e, got, 8);
    for (int i = 0; i < N_REQ; i++)
        CHECK_INT(got[i].n, ==, 8);
    engine_free(e);

    /* a stage that cannot load: the error names the node and why */
    pipeline_spec bad;
    memset(&bad, 0, sizeof bad);
    snprintf(bad.model, sizeof bad.model, "no-such-model");
    bad.n_layer = 4; bad.n_embd = 64; bad.n_vocab = 512; bad.n_ctx = 64; bad.n_seq = 1;
    bad.n_batch = 8; bad.n_stages = 2;
    snprintf(bad.stage[0].node, 33, "%s", cluster_self_id(a.c));
    snprintf(bad.stage[1].node, 33, "%s", cluster_self_id(b.c));
    bad.stage[0].last = 2; bad.stage[1].first = 2; bad.stage[1].last = 4;
    engine_exec *x = NULL;
    CHECK(pipeline_exec_new(a.p, &bad, 10000, NULL, NULL, &x) < 0);
    CHECK(strstr(rc_errmsg(), "no-such-model") != NULL);

    /* hostile messages from B to A's stage handler: refused, A keeps going */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    for (int type = 0x40; type <= 0x45; type++)
        for (size_t len = 0; len <= sizeof junk; len += 23)
            cluster_send(b.c, cluster_self_id(a.c), type, junk, len);

    /* stage node B dies while requests run: they end with an error naming it */
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 2, true);
    check_death(e, &b);
    lm_close(&head);
    lm_close(&whole);
    stop(&a);
}

/* The head's cache type reaches the stages and shards (SETUP "cache"): with
 * q8_0 on both sides a pipeline and tensor-parallel shards give one node's
 * tokens, which differ from an f32 cache's. */
TEST_T(pipeline_cache_type_reaches_stages, 120)
{
    node a = { 0 }, b = { 0 };
    char pa[800];
    lm whole;
    collect ref[N_REQ], f32[N_REQ];
    cache_type = TT_Q8_0;
    two_nodes(&a, &b, "ka", "kb", pa, sizeof pa, &whole, ref);
    engine_params ep = { .n_ctx = 128, .n_seq = 4, .n_batch = 32, .n_threads = 1,
                         .max_queue = 8, .precision = MATMUL_FAST, .kv_type = TT_F32 };
    engine *e;
    CHECK_OK(engine_new(whole.m, whole.tok, &ep, &e));
    run_all(e, f32, 20);
    engine_free(e);
    int differ = 0;
    for (int i = 0; i < N_REQ; i++)
        differ += memcmp(f32[i].ids, ref[i].ids, (size_t)ref[i].n * sizeof(int32_t)) != 0;
    CHECK(differ > 0);   /* else this model could not tell the types apart */
    pipeline_and_shards_same(&a, &b, pa, &whole, ref);
}

/* A grammar reaches the sampling stage and both shards (BATCH starts under
 * ENC_STARTS_GRAMMAR; each stage loads the tokenizer from its model file):
 * a pipeline and tensor-parallel shards (request 1 ranks its top 3 on
 * each shard, the grammar's mask applied first) give one node's tokens,
 * which obey it (no end: 20 tokens cannot make 200 characters). */
TEST_T(pipeline_grammar_reaches_stages, 120)
{
    node a = { 0 }, b = { 0 };
    char pa[800];
    lm whole;
    collect ref[N_REQ];
    run_grammar = "root ::= [a-z ]{200,400}";
    two_nodes(&a, &b, "ga", "gb", pa, sizeof pa, &whole, ref);
    for (int i = 0; i < N_REQ; i++)
        for (int k = 0; k < ref[i].n; k++) {
            char piece[64];
            int n = tok_piece(whole.tok, ref[i].ids[k], true, piece, sizeof piece);
            CHECK(n > 0 && n < (int)sizeof piece);
            for (int j = 0; j < n; j++)
                if (!(piece[j] == ' ' || (piece[j] >= 'a' && piece[j] <= 'z')))
                    FAIL("request %d token %d: '%.*s'", i, k, n, piece);
        }
    pipeline_and_shards_same(&a, &b, pa, &whole, ref);
    run_grammar = NULL;
}

TEST_T(pipeline_tensor_parallel_same_tokens, 120)
{
    node a = { 0 }, b = { 0 };
    char pa[800];
    lm whole;
    collect ref[N_REQ], got[N_REQ];
    two_nodes(&a, &b, "ta", "tb", pa, sizeof pa, &whole, ref);

    /* head A; shard 0 (sampling) on B, shard 1 on A; f32 parts */
    lm head;
    CHECK_OK(lm_open(&head, pa, false, NULL));
    engine *e = pipeline_engine(&a, &head, "m4", cluster_self_id(b.c), cluster_self_id(a.c), 0,
                                true);
    run_all(e, got, 20);
    check_same(got, ref);
    run_all(e, got, 20);                       /* prefix reuse on both shards */
    for (int i = 0; i < N_REQ; i++)
        CHECK(!memcmp(got[i].ids, ref[i].ids, (size_t)ref[i].n * sizeof(int32_t)));
    json_t *st = pipeline_status(a.p);
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(st, "instances"), 0),
                                                "split")), "tensor");
    json_decref(st);
    /* the parts went on a data channel between the two shards */
    st = pipeline_status(a.p);
    CHECK_INT(json_integer_value(json_object_get(json_array_get(json_object_get(st, "stages"), 0),
                                                 "channels")), ==, 1);
    uint32_t inst0 = (uint32_t)json_integer_value(
        json_object_get(json_array_get(json_object_get(st, "instances"), 0), "instance"));
    json_decref(st);

    /* hostile channels from B: a malformed BIND, a "no channel" BIND on a
     * channel, a second channel for the pair in use: refused; BINDs for an
     * instance not set up (yet) wait, at most 16 from one node (so that it
     * cannot crowd out the others'); A goes on */
    uint8_t bind[32] = { 0 };
    wire_unhex(cluster_self_id(a.c), bind, 16);
    uint32_t bf[4] = { inst0, 0, 1, 0 };
    cluster_chan *hc = NULL;
    CHECK(cluster_channel_open(b.c, cluster_self_id(a.c), 0x46, bind, 31, 3000, &hc) < 0);
    bf[3] = 1;
    memcpy(bind + 16, bf, 16);
    CHECK(cluster_channel_open(b.c, cluster_self_id(a.c), 0x46, bind, 32, 3000, &hc) < 0);
    bf[3] = 0;
    memcpy(bind + 16, bf, 16);
    CHECK(cluster_channel_open(b.c, cluster_self_id(a.c), 0x46, bind, 32, 3000, &hc) < 0);
    cluster_chan *held[64];
    int n_held = 0, n_ok = 0;
    for (int i = 0; i < 70; i++) {
        bf[0] = 1000000 + (uint32_t)i;
        memcpy(bind + 16, bf, 16);
        if (cluster_channel_open(b.c, cluster_self_id(a.c), 0x46, bind, 32, 3000, &hc) == 0) {
            n_ok++;
            if (n_held < 64)
                held[n_held++] = hc;
            else
                chan_free(hc);
        }
    }
    CHECK_INT(n_ok, ==, 16);
    for (int i = 0; i < n_held; i++)
        chan_free(held[i]);
    run_all(e, got, 20);
    check_same(got, ref);
    engine_free(e);

    /* f16 parts: runs, same lengths */
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 0, false);
    run_all(e, got, 8);
    for (int i = 0; i < N_REQ; i++)
        CHECK_INT(got[i].n, ==, 8);

    /* hostile parts from B to A while an instance runs: junk for no
     * instance is dropped; a part for the running one that is not the part
     * due fails the batch and breaks the instance (its shards' sums can no
     * longer agree), naming the shard */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 53 + 5);
    for (size_t len = 0; len <= sizeof junk; len += 13)
        cluster_send(b.c, cluster_self_id(a.c), 0x45, junk, len);
    run_all(e, got, 4);
    for (int i = 0; i < N_REQ; i++)
        CHECK_INT(got[i].res.finish, ==, GEN_LENGTH);
    /* a part on the cluster link for a pair that uses a channel: dropped */
    st = pipeline_status(a.p);
    uint32_t inst = (uint32_t)json_integer_value(
        json_object_get(json_array_get(json_object_get(st, "instances"), 0), "instance"));
    json_decref(st);
    uint8_t part[52 + 4] = { 0 };
    uint32_t hdr[9] = { inst, 1, 0, 2, 0, 0, 1, 1, 0 };   /* inst, shard 1, sum, f32, seq 0 (long past) */
    wire_unhex(cluster_self_id(a.c), part, 16);
    memcpy(part + 16, hdr, sizeof hdr);
    CHECK_OK(cluster_send(b.c, cluster_self_id(a.c), 0x45, part, sizeof part));
    usleep(100000);
    run_all(e, got, 4);
    for (int i = 0; i < N_REQ; i++)
        CHECK_INT(got[i].res.finish, ==, GEN_LENGTH);
    engine_free(e);

    /* without data channels (RACIMO_DATA_CHANNELS=0 on the dialling shard)
     * the parts go through the cluster link: the same tokens */
    setenv("RACIMO_DATA_CHANNELS", "0", 1);
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 0, true);
    run_all(e, got, 20);
    check_same(got, ref);
    st = pipeline_status(a.p);
    CHECK_INT(json_integer_value(json_object_get(json_array_get(json_object_get(st, "stages"), 0),
                                                 "channels")), ==, 0);
    inst = (uint32_t)json_integer_value(
        json_object_get(json_array_get(json_object_get(st, "instances"), 0), "instance"));
    json_decref(st);
    hdr[0] = inst;
    memcpy(part + 16, hdr, sizeof hdr);
    CHECK_OK(cluster_send(b.c, cluster_self_id(a.c), 0x45, part, sizeof part));
    usleep(100000);
    run_all(e, got, 4);
    unsetenv("RACIMO_DATA_CHANNELS");
    CHECK_INT(got[0].res.finish, ==, GEN_ERROR);
    CHECK(strstr(got[0].res.error, "shard 1") != NULL);
    CHECK(strstr(got[0].res.error, "part 0 ") != NULL);
    CHECK(engine_broken(e));
    engine_free(e);

    /* shard node B dies while a request runs: it ends with an error naming it */
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 0, true);
    check_death(e, &b);
    lm_close(&head);
    lm_close(&whole);
    stop(&a);
}

/* deepseek2 (latent attention, routed and shared experts, a dense first
 * layer) on two nodes: layer ranges, and tensor parallel with the heads cut
 * and the experts whole per shard (expert parallelism), give one engine's
 * tokens; a set-up without the cut revision (a head of protocol 1.2) is
 * refused with the reason. */
TEST_T(pipeline_deepseek2_expert_parallel, 120)
{
    node a = { 0 }, b = { 0 };
    char pa[800];
    lm whole, head;
    collect ref[N_REQ], got[N_REQ];
    model_preset = "tiny-deepseek2";
    two_nodes(&a, &b, "da", "db", pa, sizeof pa, &whole, ref);
    model_preset = "tiny";
    CHECK_OK(lm_open(&head, pa, false, NULL));
    engine *e = pipeline_engine(&a, &head, "m4", cluster_self_id(b.c), cluster_self_id(a.c), 2,
                                true);
    run_all(e, got, 20);
    check_same(got, ref);
    engine_free(e);
    e = pipeline_engine(&a, &head, "m4", cluster_self_id(a.c), cluster_self_id(b.c), 0, true);
    run_all(e, got, 20);
    check_same(got, ref);
    json_t *st = pipeline_status(a.p);
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(st, "instances"), 0),
                                                "split")), "tensor");
    json_decref(st);
    engine_free(e);
    /* a head that cuts shards the 1.2 way */
    pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.model, sizeof spec.model, "m4");
    spec.n_layer = 4; spec.n_embd = 256; spec.n_vocab = 512; spec.n_ctx = 64; spec.n_seq = 1;
    spec.n_batch = 8; spec.n_stages = 2; spec.tensor = true; spec.wire_f32 = true;
    spec.test_old_cut = 1;
    snprintf(spec.stage[0].node, 33, "%s", cluster_self_id(a.c));
    snprintf(spec.stage[1].node, 33, "%s", cluster_self_id(b.c));
    spec.stage[0].last = spec.stage[1].last = 4;
    engine_exec *x = NULL;
    CHECK(pipeline_exec_new(a.p, &spec, 10000, NULL, NULL, &x) < 0);
    CHECK(strstr(rc_errmsg(), "cuts tensor-parallel shards another way") != NULL);
    lm_close(&head);
    lm_close(&whole);
    stop(&b);
    stop(&a);
}

/* A set-up the cluster thread took in just before pipeline_stop marked the
 * stages, and handles just after: it starts no stage (pipeline_stop would
 * wait for that one forever, as a fresh clone's suite once did under load). */
TEST_T(pipeline_setup_after_stop_starts_nothing, 60)
{
    node a = { 0 };
    start(&a, "sa", NULL, NULL);
    pipeline_stop(a.p);
    const char *setup = "{\"inst\":7,\"index\":0,\"model\":\"m4\",\"first\":0,\"last\":4,"
                        "\"n_ctx\":64,\"n_seq\":1,\"n_batch\":8,\"threads\":1,\"n_embd\":256,"
                        "\"wire\":\"f32\",\"next\":\"\",\"n_stages\":1}";
    pl__on_setup(a.p, "0123456789abcdef0123456789abcdef", (const uint8_t *)setup, strlen(setup));
    pthread_mutex_lock(&a.p->mu);
    const bool none = a.p->stages == NULL;
    pthread_mutex_unlock(&a.p->mu);
    CHECK(none);
    stop(&a);
}

/* Sends stderr to a file of the test's directory until log_end, which
 * returns what was written (the caller frees it). */
static int log_fd = -1;
static char log_path[700];
static void log_begin(void)
{
    fflush(stderr);
    snprintf(log_path, sizeof log_path, "%s/stderr.log", test_tmpdir());
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    log_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}
static char *log_end(void)
{
    fflush(stderr);
    dup2(log_fd, 2);
    close(log_fd);
    FILE *f = fopen(log_path, "r");
    char *text = calloc(1, 1 << 20);
    if (f && text)
        fread(text, 1, (1 << 20) - 1, f);
    if (f)
        fclose(f);
    fputs(text ? text : "", stderr);      /* still in the test's output */
    return text;
}

/* A BATCH of one row from the head: head id, instance, group 0, no starts. */
static size_t one_row_batch(uint8_t *b, const char *head, uint32_t inst, uint32_t enc, int width)
{
    wire_unhex(head, b, 16);
    uint32_t h[5] = { inst, 0, enc, 0, 1 };
    memcpy(b + 16, h, sizeof h);
    int32_t row[3] = { 5, 0, 0 };
    memcpy(b + 36, row, sizeof row);
    b[48] = 1;
    memset(b + 49, 0, (size_t)width * 4);
    return 49 + (size_t)width * 4;
}

TEST_T(pipeline_plan_nodes_only, 120)
{
    node a = { 0 }, b = { 0 }, c = { 0 };
    char pa[800];
    lm whole, head;
    collect ref[N_REQ], got[N_REQ];
    two_nodes(&a, &b, "qa", "qb", pa, sizeof pa, &whole, ref);
    start(&c, "qc", cluster_join_token(a.c), &a);
    wait_up(&a, &c);
    wait_up(&b, &c);
    char ida[33], idb[33], idc[33];           /* B restarts below */
    snprintf(ida, sizeof ida, "%s", cluster_self_id(a.c));
    snprintf(idb, sizeof idb, "%s", cluster_self_id(b.c));
    snprintf(idc, sizeof idc, "%s", cluster_self_id(c.c));

    /* head A; stage 0 on B, stage 1 (sampling) on A */
    CHECK_OK(lm_open(&head, pa, false, NULL));
    engine *e = pipeline_engine(&a, &head, "m4", idb, ida, 2, true);
    json_t *st = pipeline_status(a.p);
    uint32_t inst = (uint32_t)json_integer_value(
        json_object_get(json_array_get(json_object_get(st, "instances"), 0), "instance"));
    json_decref(st);
    /* B knows what A's plan holds (forward.c caps A's claimed slots by it) */
    CHECK_INT(pipeline_plan_slots(b.p, ida, "m4"), ==, 4);
    CHECK_INT(pipeline_plan_slots(b.p, idc, "m4"), ==, 0);

    const int E = whole.m->hp.n_embd;
    log_begin();
    /* C, in no part of A's plan: a set-up with A's instance number is C's
     * own instance on B (the sender of a set-up is its head), and a stage
     * > 0 that does not say who feeds it is refused, the reason sent back */
    char setup[512];
    snprintf(setup, sizeof setup, "{\"inst\":%u,\"index\":0,\"model\":\"m4\",\"first\":0,"
             "\"last\":2,\"n_ctx\":64,\"n_seq\":1,\"n_batch\":8,\"threads\":1,\"n_embd\":%d,"
             "\"wire\":\"f32\",\"next\":\"\",\"n_stages\":2}", inst, E);
    CHECK_OK(cluster_send(c.c, idb, 0x40, setup, strlen(setup)));
    snprintf(setup, sizeof setup, "{\"inst\":%u,\"index\":1,\"model\":\"m4\",\"first\":2,"
             "\"last\":4,\"n_ctx\":64,\"n_seq\":1,\"n_batch\":8,\"threads\":1,\"n_embd\":%d,"
             "\"wire\":\"f32\",\"next\":\"\",\"n_stages\":2}", inst, E);
    CHECK_OK(cluster_send(c.c, ida, 0x40, setup, strlen(setup)));
    /* C's batches for A's instance, to stage 0 (fed by A) and stage 1 (fed
     * by B), a result and a stop: refused or C's own, A's goes on */
    uint8_t batch[49 + 1024 * 4];
    CHECK(E <= 1024);
    size_t n = one_row_batch(batch, ida, inst, 0, 0);
    for (int i = 0; i < 50; i++)
        CHECK_OK(cluster_send(c.c, idb, 0x42, batch, n));
    n = one_row_batch(batch, ida, inst, 2, E);
    CHECK_OK(cluster_send(c.c, ida, 0x42, batch, n));
    uint32_t result[4] = { inst, 0, 0, 0 };
    CHECK_OK(cluster_send(c.c, ida, 0x43, result, sizeof result));
    CHECK_OK(cluster_send(c.c, idb, 0x44, &inst, 4));
    usleep(300000);
    run_all(e, got, 20);
    char *log = log_end();
    check_same(got, ref);
    CHECK(!engine_broken(e));
    char want[200];
    snprintf(want, sizeof want, "refused a BATCH from node %.8s (qc): for instance %u of %.8s, "
             "whose batches come from node %.8s only", idc, inst, ida, ida);
    CHECK(log && strstr(log, want));
    snprintf(want, sizeof want, "whose batches come from node %.8s only", idb);
    CHECK(log && strstr(log, want));
    CHECK(log && strstr(log, "refused a RESULT from node") &&
          strstr(log, "whose plan does not include that node"));
    CHECK(log && strstr(log, "refused a SETUP from node") && strstr(log, "\"prev\""));
    /* rate-limited: 50 batches, one line */
    int lines = 0;
    snprintf(want, sizeof want, "refused a BATCH from node %.8s (qc): for instance %u of %.8s, "
             "whose batches come from node %.8s only", idc, inst, ida, ida);
    for (const char *q = log; q && (q = strstr(q, want)); q++)
        lines++;
    CHECK_INT(lines, ==, 1);
    free(log);
    engine_free(e);

    /* limits: more sequences than a node runs, and more memory than B
     * offers (B restarted offering 32 MiB): refused, the head hears why */
    pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.model, sizeof spec.model, "m4");
    spec.n_layer = 4; spec.n_embd = E; spec.n_vocab = whole.m->hp.n_vocab; spec.n_ctx = 64;
    spec.n_seq = 100000; spec.n_batch = 8; spec.n_stages = 2; spec.wire_f32 = true;
    snprintf(spec.stage[0].node, 33, "%s", idb);
    snprintf(spec.stage[1].node, 33, "%s", ida);
    spec.stage[0].last = 2; spec.stage[1].first = 2; spec.stage[1].last = 4;
    engine_exec *x = NULL;
    CHECK(pipeline_exec_new(a.p, &spec, 10000, NULL, NULL, &x) < 0);
    CHECK(strstr(rc_errmsg(), "refuses the set-up") && strstr(rc_errmsg(), "sequences"));
    stop(&b);
    start_max_memory = 32u << 20;
    start(&b, "qb", cluster_join_token(a.c), &a);
    start_max_memory = 0;
    wait_up(&a, &b);
    spec.n_seq = 256;
    spec.n_ctx = 2048;
    CHECK(pipeline_exec_new(a.p, &spec, 10000, NULL, NULL, &x) < 0);
    CHECK(strstr(rc_errmsg(), "this node offers 32 MiB") != NULL);
    /* what fits still runs */
    e = pipeline_engine(&a, &head, "m4", idb, ida, 2, true);
    run_all(e, got, 20);
    check_same(got, ref);
    engine_free(e);
    lm_close(&head);
    lm_close(&whole);
    stop(&c);
    stop(&b);
    stop(&a);
}

/* An embedding model over two stages: the last stage pools and sends one
 * vector per input (protocol 2.2), the same as one node's engine makes
 * (f32 wire), with an input longer than a batch; tensor-parallel shards
 * of an embedding model are refused. */
static void embed_all(engine *e, float *out, int E)
{
    static int32_t ids[3][40];
    static const int lens[3] = { 40, 3, 17 };
    gen_request rq[3];
    collect c[3];
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < lens[i]; k++)
            ids[i][k] = (int32_t)((k * 31 + i * 7) % 256);
        memset(&c[i], 0, sizeof c[i]);
        sampler_params_default(&rq[i].sampling);
        rq[i].prompt = ids[i];
        rq[i].n_prompt = lens[i];
        rq[i].embedding = out + (size_t)i * E;
        rq[i].user = &c[i];
        rq[i].on_done = on_done;
        CHECK_OK(engine_submit(e, &rq[i]));
    }
    for (int step = 0; step < 4000 && (!c[0].done || !c[1].done || !c[2].done); step++)
        CHECK(engine_step(e) >= 0);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(c[i].done, ==, 1);
        CHECK_INT(c[i].res.finish, ==, GEN_STOP);
    }
}

TEST_T(pipeline_embeddings_same_vectors, 120)
{
    model_preset = "tiny-qwen3-embed-mean";
    node a = { 0 }, b = { 0 };
    start(&a, "ea", NULL, NULL);
    start(&b, "eb", cluster_join_token(a.c), &a);
    wait_up(&a, &b);
    char pa[800], pb[800];
    snprintf(pa, sizeof pa, "%s/m4.gguf", a.models);
    snprintf(pb, sizeof pb, "%s/m4.gguf", b.models);
    write_model(pa);
    write_model(pb);
    lm whole, head;
    CHECK_OK(lm_open(&whole, pa, true, NULL));
    CHECK_OK(lm_open(&head, pa, false, NULL));
    const int E = whole.m->hp.n_embd;
    float *ref = calloc((size_t)3 * E, sizeof *ref), *got = calloc((size_t)3 * E, sizeof *got);
    engine_params ep = { .n_ctx = 128, .n_seq = 4, .n_batch = 32, .n_threads = 1,
                         .max_queue = 8, .precision = MATMUL_FAST };
    engine *e;
    CHECK_OK(engine_new(whole.m, whole.tok, &ep, &e));
    embed_all(e, ref, E);
    engine_free(e);

    e = pipeline_engine(&a, &head, "m4", cluster_self_id(b.c), cluster_self_id(a.c), 2, true);
    CHECK_INT(engine_embd_dims(e), ==, E);
    embed_all(e, got, E);
    for (int k = 0; k < 3 * E; k++)
        CHECK_NEAR(got[k], ref[k], 1e-6);
    /* a generation request is refused by an embedding model's pipeline */
    gen_request g;
    memset(&g, 0, sizeof g);
    g.prompt = prompts[0];
    g.n_prompt = n_prompt[0];
    CHECK_INT(engine_submit(e, &g), ==, RC_EINVAL);
    engine_free(e);

    pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.model, sizeof spec.model, "m4");
    spec.n_layer = 4; spec.n_embd = E; spec.n_vocab = 512; spec.n_ctx = 64; spec.n_seq = 1;
    spec.n_batch = 8; spec.n_stages = 2; spec.tensor = true; spec.pooling = POOL_MEAN;
    snprintf(spec.stage[0].node, 33, "%s", cluster_self_id(a.c));
    snprintf(spec.stage[1].node, 33, "%s", cluster_self_id(b.c));
    spec.stage[0].last = 4; spec.stage[1].last = 4;
    engine_exec *x = NULL;
    CHECK_INT(pipeline_exec_new(a.p, &spec, 10000, NULL, NULL, &x), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "embedding model"));
    free(ref);
    free(got);
    lm_close(&head);
    lm_close(&whole);
    stop(&b);
    stop(&a);
    model_preset = "tiny";
}
