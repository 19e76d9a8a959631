/* test_placement.c - model sizes from tensor infos (against the loader's
 * own byte count), the placement rule on hand-made models and nodes,
 * placement from a cluster view and the published mem_offer, and `racimo
 * plan` / `racimo serve --max-memory` as processes ($RACIMO_BIN). */
#include "test.h"
#include "cli_util.h"
#include "model_util.h"

#include "base/err.h"
#include "base/mem.h"
#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_size.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* ---- model sizes ---- */

static void check_sizes_of(const char *path)
{
    gguf_file *f;
    CHECK_OK(gguf_open(path, &f));
    model_sizes ms;
    CHECK_OK(model_sizes_read(f, &ms));
    model_hparams hp;
    CHECK_OK(model_read_hparams(f, &hp));
    uint64_t sum = 0, layers = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        sum += f->tensors[i].size_bytes;
    for (int l = 0; l < ms.n_layer; l++)
        layers += ms.layer_bytes[l];
    CHECK_INT(ms.n_layer, ==, hp.n_layer);
    CHECK_INT(ms.total_bytes, ==, sum);
    CHECK_INT(layers + ms.embd_bytes + ms.output_bytes + ms.shared_bytes, ==, sum);
    CHECK_INT(model_sizes_stage_bytes(&ms, 0, ms.n_layer), ==, sum);
    CHECK_INT(ms.tied, ==, gguf_find_tensor(f, "output.weight") == NULL);
    CHECK_INT(ms.embd_bytes, ==, gguf_find_tensor(f, "token_embd.weight")->size_bytes);
    /* the default cache type (f16), then each type: K and V rows per KV head */
    CHECK_INT(ms.kv_type, ==, TT_F16);
    CHECK_INT(ms.kv_bytes_per_token, ==,
              (uint64_t)hp.n_head_kv * (uint64_t)(hp.head_dim + hp.head_dim_v) * 2);
    CHECK_OK(model_sizes_set_kv_type(&ms, TT_F32));
    CHECK_INT(ms.kv_bytes_per_token, ==,
              (uint64_t)hp.n_head_kv * (uint64_t)(hp.head_dim + hp.head_dim_v) * sizeof(float));
    CHECK_OK(model_sizes_set_kv_type(&ms, TT_Q8_0));
    CHECK_INT(ms.kv_bytes_per_token, ==,
              (uint64_t)hp.n_head_kv * (uint64_t)((hp.head_dim + 31) / 32 + (hp.head_dim_v + 31) / 32) * 34);
    CHECK_INT(model_sizes_set_kv_type(&ms, TT_BF16), ==, RC_EINVAL);
    CHECK_OK(model_sizes_set_kv_type(&ms, TT_F16));
    /* every layer range maps what the loader binds for it */
    for (int a = 0; a < ms.n_layer; a++)
        for (int b = a + 1; b <= ms.n_layer; b++) {
            model *m;
            CHECK_OK(model_load(path, a, b, &m));
            if (model_sizes_stage_bytes(&ms, a, b) != m->weight_bytes)
                FAIL("%s layers [%d,%d): sizes say %llu bytes, the loader binds %llu", path, a, b,
                     (unsigned long long)model_sizes_stage_bytes(&ms, a, b),
                     (unsigned long long)m->weight_bytes);
            model_free(m);
        }
    model_sizes_free(&ms);
    gguf_close(f);
}

TEST(placement_model_sizes_match_writer)
{
    check_sizes_of(test_make_model("tiny", TT_Q8_0, NULL));
    check_sizes_of(test_make_model("tiny-qwen2", TT_F16, NULL));
    check_sizes_of(test_make_model("tiny-qwen3", TT_Q4_K, NULL));
    check_sizes_of(test_make_model("tiny-qwen3moe", TT_Q8_0, NULL));
    /* tied embeddings and a rope_freqs tensor (shared by every stage) */
    synth_params p;
    CHECK_OK(synth_preset("tiny", &p));
    p.n_layer = 3;
    p.tied = true;
    p.rope_freqs = true;
    p.type = TT_Q4_0;
    char path[600];
    snprintf(path, sizeof path, "%s/tied.gguf", test_tmpdir());
    CHECK_OK(synth_write(path, &p));
    check_sizes_of(path);
    gguf_file *f;
    CHECK_OK(gguf_open(path, &f));
    model_sizes ms;
    CHECK_OK(model_sizes_read(f, &ms));
    CHECK(ms.tied);
    CHECK(ms.shared_bytes > 0);
    /* the last stage of a split maps the embedding too */
    CHECK_INT(model_sizes_stage_bytes(&ms, 1, 3), ==,
              ms.layer_bytes[1] + ms.layer_bytes[2] + ms.output_bytes + ms.embd_bytes + ms.shared_bytes);
    model_sizes_free(&ms);
    gguf_close(f);
}

TEST(placement_moe_decode_bytes)
{
    gguf_file *f;
    CHECK_OK(gguf_open(test_make_model("tiny-qwen3moe", TT_Q8_0, NULL), &f));
    model_sizes ms;
    CHECK_OK(model_sizes_read(f, &ms));
    /* a token reads only the experts it uses */
    CHECK(ms.layer_decode_bytes[0] < ms.layer_bytes[0]);
    model_sizes_free(&ms);
    gguf_close(f);
}

/* ---- the rule, on hand-made sizes ---- */

typedef struct {
    model_sizes ms;
    uint64_t layers[64], decode[64];
} fake_model;

/* L equal layers of layer_mib MiB, an embedding and an output. */
static void fake(fake_model *fm, int L, uint64_t layer_mib, uint64_t embd_mib, uint64_t out_mib,
                 uint64_t kv_per_token)
{
    memset(fm, 0, sizeof *fm);
    for (int l = 0; l < L; l++)
        fm->layers[l] = fm->decode[l] = layer_mib * MiB;
    fm->ms.n_layer = L;
    fm->ms.n_embd = 4096;
    fm->ms.layer_bytes = fm->layers;
    fm->ms.layer_decode_bytes = fm->decode;
    fm->ms.embd_bytes = embd_mib * MiB;
    fm->ms.output_bytes = out_mib * MiB;
    fm->ms.kv_bytes_per_token = kv_per_token;
    fm->ms.n_params = (L * layer_mib + embd_mib + out_mib) * MiB * 2;   /* 4 bits per weight */
    fm->ms.total_bytes = (L * layer_mib + embd_mib + out_mib) * MiB;
}

static placement_node node(const char *id, uint64_t mem, double bw)
{
    placement_node n;
    memset(&n, 0, sizeof n);
    snprintf(n.id, sizeof n.id, "%s", id);
    snprintf(n.name, sizeof n.name, "%s", id);
    n.mem_avail = mem;
    n.bw_gbs = bw;
    return n;
}

/* Stages in order, contiguous, >= 1 layer each, covering the model, each
 * within its node and with the bytes the sizes give. */
static void check_valid(const placement *p, const model_sizes *ms, const placement_node *nodes,
                        const placement_opts *o)
{
    CHECK(p->fits);
    CHECK_INT(p->n_stages, >=, 1);
    int at = 0;
    uint64_t tokens = (uint64_t)o->n_ctx * (uint64_t)o->n_seq;
    for (int s = 0; s < p->n_stages; s++) {
        const placement_stage *st = &p->stage[s];
        CHECK_INT(st->first, ==, at);
        CHECK_INT(st->last, >, st->first);
        CHECK_INT(st->weight_bytes, ==, model_sizes_stage_bytes(ms, st->first, st->last));
        CHECK_INT(st->kv_bytes, ==, model_sizes_kv_bytes(ms, st->first, st->last, tokens));
        CHECK_INT(st->weight_bytes + st->kv_bytes, <=, placement_node_avail(&nodes[st->node], o->reserve));
        CHECK_STR(st->id, nodes[st->node].id);
        for (int q = 0; q < s; q++)
            CHECK_INT(p->stage[q].node, !=, st->node);
        at = st->last;
    }
    CHECK_INT(at, ==, ms->n_layer);
    CHECK(p->tokens_per_s > 0);
}

TEST(placement_one_node_fits_fastest)
{
    fake_model fm;
    fake(&fm, 32, 100, 200, 200, 0);    /* 3.6 GiB */
    placement_node nodes[] = { node("a", 8 * GiB, 20), node("b", 8 * GiB, 50),
                               node("c", 2 * GiB, 100), node("d", 8 * GiB, 50) };
    placement_opts o = { .n_ctx = 1, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 4, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 1);
    /* c is fastest but too small; b and d tie: the smaller id */
    CHECK_STR(p.stage[0].id, "b");
    /* ...unless the other is the node placing: a model that fits it stays */
    nodes[3].self = true;
    placement q;
    CHECK_OK(placement_make(&fm.ms, nodes, 4, NULL, &o, &q));
    CHECK_STR(q.stage[0].id, "d");
    nodes[3].self = false;
    /* a node of unknown bandwidth (counted as PLACEMENT_DEFAULT_BW_GBS, more
     * than b's) does not go before one whose bandwidth is known */
    placement_node two[] = { node("a", 8 * GiB, 0), node("b", 8 * GiB, PLACEMENT_DEFAULT_BW_GBS / 2) };
    CHECK_OK(placement_make(&fm.ms, two, 2, NULL, &o, &q));
    CHECK_STR(q.stage[0].id, "b");
    /* 3.4 GB read per token (all layers and the output) at 50 GB/s, no hop */
    double bytes = (32 * 100 + 200) * (double)MiB;
    CHECK_NEAR(p.stage[0].ms_per_token, bytes / 50e9 * 1e3, 1e-9);
    CHECK_NEAR(p.tokens_per_s, 1000.0 / p.stage[0].ms_per_token, 1e-9);
    CHECK_INT(p.need_bytes, ==, (32 * 100 + 400) * MiB);
    CHECK_INT(p.have_bytes, ==, 26 * GiB);
    CHECK_STR(p.advice, "");
}

TEST(placement_two_equal_nodes_split_evenly)
{
    fake_model fm;
    fake(&fm, 32, 100, 100, 100, 0);    /* 3400 MiB */
    uint64_t each = 3400 * MiB * 6 / 10;
    placement_node nodes[] = { node("n2", each, 30), node("n1", each, 30) };
    placement_opts o = { .n_ctx = 16, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK_STR(p.stage[0].id, "n1");         /* stage order by id */
    CHECK_INT(p.stage[0].last, ==, 16);
    /* two stages and two hops (there and the token back), by default */
    CHECK_NEAR(p.tokens_per_s,
               1000.0 / (p.stage[0].ms_per_token + p.stage[1].ms_per_token + 2 * PLACEMENT_DEFAULT_HOP_MS),
               1e-6);
    /* measured links count instead */
    double links[4] = { 0, 3.0, 5.0, 0 };   /* n2->n1 3 ms, n1->n2 5 ms */
    CHECK_OK(placement_make(&fm.ms, nodes, 2, links, &o, &p));
    CHECK_NEAR(p.tokens_per_s, 1000.0 / (p.stage[0].ms_per_token + p.stage[1].ms_per_token + 8.0), 1e-6);
}

/* Tensor parallel: the fewest nodes that each hold 1/k of the layers,
 * the output and the KV cache plus the whole embedding table; every shard
 * runs all layers; a token costs the slowest node's share plus 2 exchanges
 * per layer and the gather over the slowest link. */
TEST(placement_tensor_parallel)
{
    fake_model fm;
    fake(&fm, 32, 100, 100, 100, 1024);       /* 3400 MiB, untied output */
    const uint64_t kv = 32 * 1024 * 16;       /* 16 tokens, 32 layers */
    const uint64_t share = 100 * MiB + (32 * 100 + 100) * MiB / 2;
    placement_node nodes[] = { node("n2", share + kv / 2 + MiB, 30), node("n1", 8 * GiB, 20),
                               node("n3", share + kv / 2 + MiB, 40) };
    placement_opts o = { .n_ctx = 16, .n_seq = 1, .tensor = true };
    placement p;
    /* fits on n1 alone: one node, no shards */
    CHECK_OK(placement_make(&fm.ms, nodes, 3, NULL, &o, &p));
    CHECK_INT(p.n_stages, ==, 1);
    CHECK(!p.tensor);
    /* forced over two: the two with the most memory (n1, n3) first, then
     * n2, faster than n1 and holding a share, takes n1's place */
    o.min_nodes = 2;
    CHECK_OK(placement_make(&fm.ms, nodes, 3, NULL, &o, &p));
    CHECK(p.fits && p.tensor);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK_STR(p.stage[0].id, "n2");
    CHECK_STR(p.stage[1].id, "n3");
    for (int s = 0; s < 2; s++) {
        CHECK_INT(p.stage[s].first, ==, 0);
        CHECK_INT(p.stage[s].last, ==, 32);
        CHECK_INT(p.stage[s].weight_bytes, ==, share);
        CHECK_INT(p.stage[s].kv_bytes, ==, kv / 2);
    }
    double half = (32 * 100 + 100) * (double)MiB / 2;
    CHECK_NEAR(p.stage[0].ms_per_token, half / 30e9 * 1e3, 1e-9);
    CHECK_NEAR(p.stage[1].ms_per_token, half / 40e9 * 1e3, 1e-9);
    /* the slowest shard, 2 exchanges per layer and the gather */
    CHECK_NEAR(p.tokens_per_s, 1000.0 / (half / 30e9 * 1e3 + 65 * PLACEMENT_DEFAULT_HOP_MS), 1e-6);
    CHECK_INT(p.need_bytes, ==, 2 * (share + kv / 2));   /* the embedding table twice */
    json_t *j = placement_to_json(&p, &fm.ms);
    CHECK_STR(json_string_value(json_object_get(j, "split")), "tensor");
    json_decref(j);
    /* without the big node: n2 and n3 hold exactly a share each */
    CHECK_OK(placement_make(&fm.ms, nodes + 0, 1, NULL, &o, &p));
    CHECK(!p.fits);
    placement_node two[] = { nodes[0], nodes[2] };
    CHECK_OK(placement_make(&fm.ms, two, 2, NULL, &o, &p));
    CHECK(p.fits && p.tensor && p.n_stages == 2);
    /* a node of protocol 1.2 is never a shard (it cuts models another way) */
    two[0].old_cut = true;
    CHECK_OK(placement_make(&fm.ms, two, 2, NULL, &o, &p));
    CHECK(!p.fits);
    two[0].old_cut = false;
    two[1].mem_avail -= 2 * MiB;              /* a share no longer fits on n3 */
    CHECK_OK(placement_make(&fm.ms, two, 2, NULL, &o, &p));
    CHECK(!p.fits);
    /* shards are not bounded by the layers: 3 layers on 4 shards; where the
     * attention is not cut it is on every shard, with 1 exchange a layer */
    fake(&fm, 3, 100, 100, 100, 0);
    fm.ms.attn_bytes = 3 * 40 * MiB;
    fm.ms.tp_attn_whole = 1u << 4;
    placement_node four[] = { node("a", GiB, 30), node("b", GiB, 30), node("c", GiB, 30),
                              node("d", GiB, 30) };
    o.min_nodes = 4;
    CHECK_OK(placement_make(&fm.ms, four, 4, NULL, &o, &p));
    CHECK(p.fits && p.tensor && p.n_stages == 4);
    CHECK_INT(p.stage[0].weight_bytes, ==, 100 * MiB + 120 * MiB + (300 - 120 + 100) * MiB / 4);
    CHECK_NEAR(p.tokens_per_s, 1000.0 / (p.stage[0].ms_per_token + 4 * PLACEMENT_DEFAULT_HOP_MS),
               1e-6);
}

/* The shard counts a model file can be cut into, from its tensor infos. */
static uint32_t ways_of_whole(const char *preset, int type, uint32_t *whole)
{
    gguf_file *f;
    CHECK_OK(gguf_open_meta(test_make_model(preset, type, NULL), &f));
    model_sizes ms;
    CHECK_OK(model_sizes_read(f, &ms));
    uint32_t w = ms.tp_ways;
    *whole = ms.tp_attn_whole;
    model_sizes_free(&ms);
    gguf_close(f);
    return w;
}

static uint32_t ways_of(const char *preset, int type)
{
    uint32_t whole;
    return ways_of_whole(preset, type, &whole);
}

/* Bits lo..hi. */
static uint32_t bits(int lo, int hi) { return (uint32_t)((2ull << hi) - (1ull << lo)); }

/* --split auto: tensor parallel where placement expects it faster for one
 * stream (fast links) and the model can be cut that many ways; layer
 * ranges otherwise. */
TEST(placement_auto_split)
{
    /* tiny: 2 key/value heads, 32-wide heads, 512 FFN units: Q8_0 cuts the
     * heads in 2 and the FFN in up to 16 (beyond 2, every shard runs every
     * head); Q4_K's 256-element blocks take no cut of the attention output
     * and two of the FFN */
    uint32_t whole;
    CHECK_INT(ways_of_whole("tiny", TT_Q8_0, &whole), ==, bits(2, 16));
    CHECK_INT(whole, ==, bits(3, 16));
    CHECK_INT(ways_of_whole("tiny", TT_Q4_K, &whole), ==, 1u << 2);
    CHECK_INT(whole, ==, 1u << 2);
    /* 4 experts, whole per shard */
    CHECK_INT(ways_of("tiny-qwen3moe", TT_Q8_0), ==, bits(2, 4));
    /* deepseek2: 8 heads one by one, 8 experts, the dense layer's 512
     * units on Q8_0's blocks */
    CHECK_INT(ways_of_whole("tiny-deepseek2", TT_Q8_0, &whole), ==, bits(2, 8));
    CHECK_INT(whole, ==, 0);

    fake_model fm;
    fake(&fm, 32, 100, 100, 100, 0);
    fm.ms.tp_ways = 1u << 2;
    uint64_t each = 3400 * MiB * 6 / 10;     /* two nodes needed either way */
    placement_node nodes[] = { node("n1", each, 30), node("n2", each, 30) };
    placement_opts o = { .n_ctx = 16, .n_seq = 1, .auto_split = true, .tensor = true };
    double fast[4] = { 0, 0.02, 0.02, 0 }, slow[4] = { 0, 5.0, 5.0, 0 };
    placement p, layers;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, fast, &o, &p));
    CHECK(p.fits && p.tensor && p.n_stages == 2);
    placement_opts ol = { .n_ctx = 16, .n_seq = 1 };
    CHECK_OK(placement_make(&fm.ms, nodes, 2, fast, &ol, &layers));
    CHECK(p.tokens_per_s > layers.tokens_per_s);
    /* 65 slow hops a token cost more than half the reading saves */
    CHECK_OK(placement_make(&fm.ms, nodes, 2, slow, &o, &p));
    CHECK(p.fits && !p.tensor && p.n_stages == 2);
    CHECK_OK(placement_make(&fm.ms, nodes, 2, slow, &ol, &layers));
    CHECK_NEAR(p.tokens_per_s, layers.tokens_per_s, 1e-9);
    /* a model that cannot be cut in two stays in layer ranges */
    fm.ms.tp_ways = 1u << 3;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, fast, &o, &p));
    CHECK(p.fits && !p.tensor);
    /* one node that holds it: no split at all */
    placement_node big[] = { node("n1", 8 * GiB, 30), node("n2", each, 30) };
    fm.ms.tp_ways = 1u << 2;
    CHECK_OK(placement_make(&fm.ms, big, 2, fast, &o, &p));
    CHECK(p.fits && !p.tensor && p.n_stages == 1);
}

TEST(placement_unequal_nodes_proportional)
{
    fake_model fm;
    fake(&fm, 30, 100, 50, 50, 0);      /* 3100 MiB */
    /* memory 2:1 at one speed: equal work would be 15 layers each, which
     * the small node cannot hold: it takes what it holds (12), big the rest */
    placement_node nodes[] = { node("big", 2600 * MiB, 20), node("small", 1300 * MiB, 20) };
    placement_opts o = { .n_ctx = 1, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK_STR(p.stage[0].id, "big");
    int big = p.stage[0].last - p.stage[0].first;
    CHECK_INT(big, ==, 18);
    CHECK(p.stage[1].weight_bytes <= 1300 * MiB);
    /* both can hold their share: equal work, 15 and 15 layers (the last
     * stage's output, 50 MiB, is half a layer: moving one would be worse) */
    placement_node roomy[] = { node("r1", 2900 * MiB, 20), node("r2", 2900 * MiB, 20) };
    CHECK_OK(placement_make(&fm.ms, roomy, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, roomy, &o);
    CHECK_INT(p.stage[0].last, ==, 15);
    /* equal memory, bandwidth 3:1: the faster node takes more */
    placement_node fast[] = { node("fast", 2600 * MiB, 60), node("slow", 2600 * MiB, 20) };
    CHECK_OK(placement_make(&fm.ms, fast, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, fast, &o);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK_STR(p.stage[0].id, "fast");
    int nf = p.stage[0].last - p.stage[0].first;
    /* 3/4 of the bytes would be 23 layers, but it holds at most 25 */
    CHECK_INT(nf, >=, 22);
    CHECK_INT(nf, <=, 25);
    CHECK(p.stage[0].weight_bytes <= 2600 * MiB);
}

TEST(placement_fewest_nodes_and_min_nodes)
{
    fake_model fm;
    fake(&fm, 12, 100, 50, 50, 0);      /* 1300 MiB */
    placement_node nodes[] = { node("a", 800 * MiB, 20), node("b", 800 * MiB, 20),
                               node("c", 800 * MiB, 20), node("d", 800 * MiB, 20) };
    placement_opts o = { .n_ctx = 1, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 4, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 2);
    o.min_nodes = 3;
    CHECK_OK(placement_make(&fm.ms, nodes, 4, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 3);
    CHECK_INT(p.stage[0].last - p.stage[0].first, ==, 4);
    CHECK_INT(p.stage[1].last - p.stage[1].first, ==, 4);
    /* forced even when one node would hold it */
    placement_node huge[] = { node("x", 64 * GiB, 20), node("y", 64 * GiB, 20), node("z", 64 * GiB, 20) };
    CHECK_OK(placement_make(&fm.ms, huge, 3, NULL, &o, &p));
    check_valid(&p, &fm.ms, huge, &o);
    CHECK_INT(p.n_stages, ==, 3);
    /* more stages than nodes: does not fit, and says why */
    o.min_nodes = 5;
    CHECK_OK(placement_make(&fm.ms, nodes, 4, NULL, &o, &p));
    CHECK(!p.fits);
    CHECK(strstr(p.advice, "--min-nodes 5") != NULL);
    /* a faster node with less memory replaces a slow one when it still fits */
    placement_node mix[] = { node("a", 900 * MiB, 10), node("b", 900 * MiB, 10), node("f", 700 * MiB, 80) };
    o.min_nodes = 0;
    CHECK_OK(placement_make(&fm.ms, mix, 3, NULL, &o, &p));
    check_valid(&p, &fm.ms, mix, &o);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK(!strcmp(p.stage[0].id, "f") || !strcmp(p.stage[1].id, "f"));
}

TEST(placement_kv_cache_changes_split)
{
    fake_model fm;
    fake(&fm, 16, 100, 100, 100, 256 * 1024);   /* 1800 MiB + 4 MiB per token of context */
    placement_node nodes[] = { node("a", 2 * GiB, 20), node("b", 2 * GiB, 20) };
    placement_opts o = { .n_ctx = 32, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 1);
    CHECK_INT(p.stage[0].kv_bytes, ==, 16ull * 256 * 1024 * 32);
    o.n_ctx = 256;                   /* 1 GiB of KV cache: two nodes */
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &p));
    check_valid(&p, &fm.ms, nodes, &o);
    CHECK_INT(p.n_stages, ==, 2);
    CHECK_INT(p.need_bytes, ==, 1800 * MiB + GiB);
    /* the same tokens as sequences count the same */
    o.n_ctx = 64;
    o.n_seq = 4;
    placement q;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &q));
    CHECK_INT(q.n_stages, ==, 2);
    CHECK_INT(q.stage[0].last, ==, p.stage[0].last);
}

TEST(placement_does_not_fit_advice)
{
    fake_model fm;
    fake(&fm, 16, 100, 100, 100, 256 * 1024);   /* 1800 MiB + 4 MiB per token */
    placement_node nodes[] = { node("a", 1 * GiB, 20), node("b", 1 * GiB, 20) };
    placement_opts o = { .n_ctx = 4096, .n_seq = 1 };
    placement p;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &p));
    CHECK(!p.fits);
    CHECK_INT(p.n_stages, ==, 0);
    CHECK_INT(p.need_bytes, ==, 1800 * MiB + 16 * GiB);
    CHECK_INT(p.have_bytes, ==, 2 * GiB);
    CHECK(strstr(p.advice, "short by 15.8 GiB") != NULL);
    /* the context it names is the most that fits */
    const char *c = strstr(p.advice, "--ctx ");
    CHECK(c != NULL);
    int ctx = atoi(c + 6);
    CHECK_INT(ctx, >, 0);
    placement q;
    o.n_ctx = ctx;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &q));
    CHECK(q.fits);
    o.n_ctx = ctx + 1;
    CHECK_OK(placement_make(&fm.ms, nodes, 2, NULL, &o, &q));
    CHECK(!q.fits);
    /* and the node to add is enough, a tenth of a GiB less is not */
    const char *g = strstr(p.advice, "Another node with ");
    CHECK(g != NULL);
    double add;
    char unit[8];
    CHECK_INT(sscanf(g + 18, "%lf %7s", &add, unit), ==, 2);
    CHECK_STR(unit, "GiB");
    placement_node three[] = { nodes[0], nodes[1], node("c", (uint64_t)(add * GiB), 20) };
    o.n_ctx = 4096;
    CHECK_OK(placement_make(&fm.ms, three, 3, NULL, &o, &q));
    CHECK(q.fits);
    three[2].mem_avail = (uint64_t)((add - (add >= 10 ? 0.1 : 0.01)) * GiB);  /* the last digit */
    CHECK_OK(placement_make(&fm.ms, three, 3, NULL, &o, &q));
    CHECK(!q.fits);
    /* weights alone too large: no context helps, a smaller quantisation may */
    placement_node tiny[] = { node("a", 1200 * MiB, 20) };
    fake(&fm, 16, 100, 100, 100, 0);
    fm.ms.n_params = fm.ms.total_bytes;       /* 8 bits per weight now */
    CHECK_OK(placement_make(&fm.ms, tiny, 1, NULL, &o, &p));
    CHECK(!p.fits);
    CHECK(strstr(p.advice, "do not fit, at any context") != NULL);
    /* 1800 MiB x 5.7/8 = 1283 MiB is too much, x 4.9/8 = 1102 MiB fits */
    if (!strstr(p.advice, "Q4_K_M (about 1.08 GiB"))
        FAIL("advice: %s", p.advice);
}

TEST(placement_bad_input)
{
    fake_model fm;
    fake(&fm, 4, 1, 1, 1, 0);
    placement_node n1 = node("a", GiB, 1);
    placement_opts o = { .n_ctx = 0, .n_seq = 1 };
    placement p;
    CHECK_INT(placement_make(&fm.ms, &n1, 1, NULL, &o, &p), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "context") != NULL);
    o.n_ctx = 1;
    CHECK_OK(placement_make(&fm.ms, NULL, 0, NULL, &o, &p));
    CHECK(!p.fits);
    CHECK(strstr(p.advice, "no node") != NULL);
}

/* ---- cluster views ---- */

TEST(placement_nodes_from_cluster_view)
{
    const char *js =
        "{\"nodes\":["
        " {\"id\":\"bbbb\",\"name\":\"beta\",\"state\":\"up\",\"protocol\":\"1.2\",\"hardware\":{\"mem_total\":17179869184,"
        "  \"mem_free\":10737418240,\"mem_offer\":4294967296,\"mem_bandwidth\":40000000000,\"matmul_gflops\":100.5}},"
        " {\"id\":\"aaaa\",\"name\":\"alpha\",\"state\":\"up\",\"self\":true,\"hardware\":{\"mem_total\":8589934592,"
        "  \"mem_free\":4294967296,\"mem_bandwidth\":null,\"matmul_gflops\":null}},"
        " {\"id\":\"cccc\",\"name\":\"gone\",\"state\":\"down\",\"hardware\":{\"mem_free\":1}}],"
        "\"links\":[{\"from\":\"aaaa\",\"to\":\"bbbb\",\"rtt_ms\":2.0,\"bandwidth_mbps\":800}]}";
    json_t *v = json_loads(js, 0, NULL);
    CHECK(v != NULL);
    placement_node *nodes;
    double *links;
    int n;
    CHECK_OK(placement_nodes_from_view(v, &nodes, &n, &links));
    CHECK_INT(n, ==, 2);
    CHECK_STR(nodes[0].id, "bbbb");
    CHECK_STR(nodes[0].name, "beta");
    /* the offer caps it (10 GiB free minus the 1.6 GiB reserve is more) */
    CHECK_INT(nodes[0].mem_avail, ==, 4 * GiB);
    CHECK_NEAR(nodes[0].bw_gbs, 40.0, 1e-9);
    CHECK_NEAR(nodes[0].gflops, 100.5, 1e-9);
    /* protocol 1.2 cuts tensor-parallel shards another way; no protocol
     * given (hypothetical nodes, tests): taken as current */
    CHECK(nodes[0].old_cut && !nodes[1].old_cut);
    CHECK(!nodes[0].self && nodes[1].self);
    /* no offer published: free memory minus the reserve (a tenth of 8 GiB) */
    CHECK_INT(nodes[1].mem_avail, ==, 4 * GiB - 8 * GiB / 10);
    CHECK_NEAR(nodes[1].bw_gbs, 0, 0);
    /* hop: rtt/2 + 16 KiB at 800 Mbit/s; the reverse stands in for both */
    double hop = 1.0 + 16384.0 * 8 / 800e6 * 1e3;
    CHECK_NEAR(links[1 * 2 + 0], hop, 1e-9);
    CHECK_NEAR(links[0 * 2 + 1], hop, 1e-9);
    CHECK_NEAR(links[0], 0, 0);
    placement_links_from_view(v, nodes, n, 2048, links);
    CHECK_NEAR(links[1 * 2 + 0], 1.0 + 4096.0 * 8 / 800e6 * 1e3, 1e-9);
    /* an explicit reserve applies to real nodes */
    placement_opts o = { .n_ctx = 1, .n_seq = 1, .reserve = 3 * GiB };
    CHECK_INT(placement_node_avail(&nodes[1], o.reserve), ==, 1 * GiB);
    CHECK_INT(placement_node_avail(&nodes[0], o.reserve), ==, 4 * GiB);
    rc_free(nodes);
    rc_free(links);
    json_decref(v);
    /* not a cluster view */
    v = json_loads("{\"status\":\"ok\"}", 0, NULL);
    CHECK_INT(placement_nodes_from_view(v, &nodes, &n, NULL), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "nodes") != NULL);
    json_decref(v);
}

TEST(placement_cluster_publishes_mem_offer)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/node", test_tmpdir());
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.listen_host = "127.0.0.1";
    cfg.port = 0;
    cfg.port_given = true;
    cfg.no_discovery = true;
    cfg.bench = 0;
    cfg.max_memory = 64 * MiB;
    struct cluster *c;
    CHECK_OK(cluster_new(&cfg, &c, NULL));
    json_t *s = cluster_snapshot(c);
    json_t *hw = json_object_get(json_array_get(json_object_get(s, "nodes"), 0), "hardware");
    uint64_t free_b = (uint64_t)json_integer_value(json_object_get(hw, "mem_free"));
    uint64_t offer = (uint64_t)json_integer_value(json_object_get(hw, "mem_offer"));
    CHECK(free_b > 64 * MiB);
    CHECK_INT(offer, ==, 64 * MiB);
    placement_node *nodes;
    int n;
    CHECK_OK(placement_nodes_from_view(s, &nodes, &n, NULL));
    CHECK_INT(n, ==, 1);
    CHECK_INT(nodes[0].mem_avail, ==, 64 * MiB);
    rc_free(nodes);
    json_decref(s);
    cluster_free(c);
    /* without a cap: the free memory */
    cfg.max_memory = 0;
    CHECK_OK(cluster_new(&cfg, &c, NULL));
    s = cluster_snapshot(c);
    hw = json_object_get(json_array_get(json_object_get(s, "nodes"), 0), "hardware");
    CHECK_INT(json_integer_value(json_object_get(hw, "mem_offer")), ==,
              json_integer_value(json_object_get(hw, "mem_free")));
    json_decref(s);
    cluster_free(c);
}

/* ---- the commands ---- */



TEST(placement_cli_plan)
{
    const char *m = test_make_model("tiny", TT_F32, NULL);
    gguf_file *f;
    CHECK_OK(gguf_open(m, &f));
    model_sizes ms;
    CHECK_OK(model_sizes_read(f, &ms));
    gguf_close(f);
    char cmd[4096], out[16384];
    /* one node holds it */
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --node box:1G:25", test_bin(), m);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "box") != NULL);
    CHECK(strstr(out, "0-1 (2)") != NULL);
    CHECK(strstr(out, "fits on 1 node") != NULL);
    /* forced over two: a layer each, in JSON */
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --min-nodes 2 --json "
                              "--node b:1G --node a:1G:30", test_bin(), m);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    json_t *j = json_loads(out, 0, NULL);
    CHECK(j != NULL);
    CHECK(json_is_true(json_object_get(j, "fits")));
    json_t *st = json_object_get(j, "stages");
    CHECK_INT(json_array_size(st), ==, 2);
    CHECK_STR(json_string_value(json_object_get(json_array_get(st, 0), "node")), "a");
    CHECK_INT(json_integer_value(json_object_get(json_array_get(st, 0), "last")), ==, 1);
    CHECK_INT(json_integer_value(json_object_get(json_array_get(st, 1), "weight_bytes")), ==,
              model_sizes_stage_bytes(&ms, 1, 2));
    CHECK_STR(json_string_value(json_object_get(j, "split")), "layers");
    json_decref(j);
    /* tensor parallel: every node all layers, a share of each */
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --min-nodes 2 --split tensor "
                              "--node b:1G --node a:1G:30", test_bin(), m);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "all, 1/2") != NULL);
    CHECK(strstr(out, "fits on 2 nodes (tensor parallel)") != NULL);
    /* too small: exit 1, the shortfall and advice */
    uint64_t need = model_sizes_stage_bytes(&ms, 0, 2) + model_sizes_kv_bytes(&ms, 0, 2, 64);
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --node a:%lluK", test_bin(), m,
             (unsigned long long)(need / 1024 - 8));
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 1);
    CHECK(strstr(out, "does not fit: needs ") != NULL);
    CHECK(strstr(out, "short by") != NULL);
    CHECK(strstr(out, "--ctx ") != NULL);
    model_sizes_free(&ms);
    /* bad input names what is wrong */
    struct { const char *args; const char *want; int rc; } bad[] = {
        { "plan --node a:1G", "-m MODEL", 2 },
        { "plan -m MODEL --node a:12X", "'12X' is not a size", 2 },
        { "plan -m MODEL --node a", "want NAME:MEM", 2 },
        { "plan -m MODEL --node a:1G:fast", "bandwidth 'fast'", 2 },
        { "plan -m MODEL --node a:1G --node a:2G", "given twice", 2 },
        { "plan -m MODEL --node a:1G --min-nodes 0", "--min-nodes wants", 2 },
        { "plan -m MODEL --node a:1G --split rows", "--split takes layers, tensor or auto", 2 },
        { "serve --split rows --no-cluster", "--split takes layers, tensor or auto", 2 },
        { "plan -m /nonexistent.gguf --node a:1G", "/nonexistent.gguf", 1 },
        { "plan -m MODEL --cluster http://127.0.0.1:1", "http://127.0.0.1:1", 1 },
        { "plan -m MODEL --cluster ftp://x", "not an http://HOST:PORT", 1 },
        { "plan -m MODEL --cluster 127.0.0.1:1", "127.0.0.1:1: nothing answers", 1 },
        { "plan -m MODEL --cluster http://127.0.0.1:1 --node a:1G", "not both", 2 },
        { "serve --max-memory 8Q --no-cluster", "--max-memory: '8Q' is not a size", 2 },
        { "serve --max-memory 0 --no-cluster", "--max-memory: '0' is not a size", 2 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[1024];
        const char *p = strstr(bad[i].args, "MODEL");
        if (p)
            snprintf(args, sizeof args, "%.*s%s%s", (int)(p - bad[i].args), bad[i].args, m, p + 5);
        else
            snprintf(args, sizeof args, "%s", bad[i].args);
        snprintf(cmd, sizeof cmd, "%s %s", test_bin(), args);
        int rc = test_run(cmd, out, sizeof out);
        if (rc != bad[i].rc || !strstr(out, bad[i].want))
            FAIL("'%s': exit %d (want %d), output lacks '%s':\n%s", args, rc, bad[i].rc,
                 bad[i].want, out);
    }
}

/* A real node started with --max-memory, asked by `racimo plan --cluster`:
 * the offer travels through the hardware JSON into the plan. */
TEST_T(placement_cli_plan_asks_a_node, 90)
{
    const char *b = test_bin();
    const char *m = test_make_model("tiny", TT_F32, NULL);
    char dir[600], models[700];
    snprintf(dir, sizeof dir, "%s/state", test_tmpdir());
    snprintf(models, sizeof models, "%s/models", test_tmpdir());
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execl(b, b, "serve", "--host", "127.0.0.1", "--port", "0", "--cluster-port", "0",
              "--no-discovery", "--no-access-log", "--state-dir", dir, "--models-dir", models,
              "--max-memory", "0.25GiB", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *err = fdopen(fds[0], "r");
    char line[1024];
    int port = 0;
    while (!port && fgets(line, sizeof line, err)) {
        const char *at = strstr(line, "listening on http://127.0.0.1:");
        if (at)
            port = atoi(at + strlen("listening on http://127.0.0.1:"));
    }
    if (!port) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        FAIL("racimo serve did not say where it listens");
    }
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --cluster http://127.0.0.1:%d",
             b, m, port);
    int rc = test_run(cmd, out, sizeof out);
    snprintf(cmd, sizeof cmd, "%s plan -m %s --ctx 64 --parallel 1 --json --cluster http://127.0.0.1:%d",
             b, m, port);
    char js[16384];
    int rcj = test_run(cmd, js, sizeof js);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    fclose(err);
    if (rc != 0 || !strstr(out, "fits on 1 node") || !strstr(out, "the cluster of http://127.0.0.1:"))
        FAIL("plan --cluster: exit %d:\n%s", rc, out);
    CHECK_INT(rcj, ==, 0);
    json_t *j = json_loads(js, 0, NULL);
    CHECK(j != NULL);
    /* the node offers a quarter GiB (its free memory minus the reserve is more) */
    CHECK_INT(json_integer_value(json_object_get(j, "have_bytes")), ==, GiB / 4);
    json_decref(j);
}
