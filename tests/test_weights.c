/* test_weights.c - pulling a stage's weights from a peer: two clusters in
 * one process on loopback; B pulls layers [n/2, n) of a model only A has
 * into a sparse copy that loads and computes A's logits, then the rest,
 * which completes the file byte for byte.  Refusals: unknown models, names
 * that are paths, a damaged block (test hook), a peer that stops answering
 * or goes down.  Trust: a holder serving altered bytes is left out and the
 * pull completes from another; a root digest that the holders' digests do
 * not hash to is refused before the copy is sized; a peer's sizes and
 * counts out of bounds are refused; a symlinked model is served; models
 * outside the --export list are refused. */
#include "test.h"
#include "cluster_util.h"

#include "base/err.h"
#include "cluster/cluster.h"
#include "cluster/weights.h"
#include "infer/stage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/ranges.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    struct cluster *c;
    weights *w;
    char dir[600], models[700];
} node;

static void on_down(void *ud, const char *id) { weights_on_node_down(ud, id); }

static const char *start_exports;     /* the next start's --export list (NULL: all) */

static void start(node *n, const char *name, const char *token, const node *peer,
                  const char *ro_dirs)
{
    char addr[64];
    const char *peers[1];
    cluster_config cfg;
    test_cluster_config(&cfg, name, token, peer ? cluster_port(peer->c) : 0, n->dir,
                        sizeof n->dir, n->models, sizeof n->models, addr, peers);
    cfg.ro_dirs = ro_dirs;
    cfg.exports = start_exports;
    CHECK_OK(cluster_new(&cfg, &n->c, NULL));
    CHECK_OK(weights_new(n->c, n->models, ro_dirs, &n->w));
    CHECK_OK(cluster_add_down_handler(n->c, on_down, n->w));
    CHECK_OK(cluster_start(n->c));
}

static void stop(node *n)
{
    weights_stop(n->w);
    cluster_free(n->c);
    weights_free(n->w);
}

/* Waits until `n` sees node `id` up listing model `model`. */
static void wait_model(node *n, const char *id, const char *want)
{
    for (int t = 0; t < 8000; t += 20) {
        json_t *s = cluster_snapshot(n->c), *x, *m;
        size_t i, j;
        bool ok = false;
        json_array_foreach(json_object_get(s, "nodes"), i, x) {
            if (strcmp(json_string_value(json_object_get(x, "id")), id) ||
                strcmp(json_string_value(json_object_get(x, "state")), "up"))
                continue;
            json_array_foreach(json_object_get(x, "models"), j, m)
                ok = ok || !strcmp(json_string_value(json_object_get(m, "name")), want);
        }
        json_decref(s);
        if (ok)
            return;
        usleep(20000);
    }
    FAIL("node %.8s never listed model %s", id, want);
}

/* 8 layers 512 wide, F16: about 50 MB, tensors up to 1.5 MB (a block or
 * two each).  The shard tests write 2 layers 1024 wide, whose tensors span
 * several blocks, so that a shard's rows are not every block. */
static const char *model_preset = "tiny";     /* what write_model writes */
static int model_layers = 8, model_embd = 512, model_ff = 1536;

static void write_model(const char *path)
{
    synth_params p;
    CHECK_OK(synth_preset(model_preset, &p));
    p.n_layer = model_layers;
    p.n_embd = model_embd;
    if (p.n_expert > 0)
        p.n_ff_exp = model_ff / 2;
    else
        p.n_ff = model_ff;
    p.type = TT_F16;
    CHECK_OK(synth_write(path, &p));
}

typedef struct { int calls; uint64_t done, total; double rate; } progress_log;

static void progress(void *ud, uint64_t done, uint64_t total, double bytes_per_s)
{
    progress_log *p = ud;
    CHECK_INT(done, <=, total);
    p->calls++;
    p->done = done;
    p->total = total;
    p->rate = bytes_per_s;
}

/* Logits of layers [first, last) of `path` for fixed hidden states. */
static float *stage_logits(const char *path, int first, int last)
{
    model *m;
    stage *s;
    CHECK_OK(model_load(path, first, last, &m));
    stage_params sp = { .n_ctx = 16, .n_seq = 1, .n_batch = 4, .n_threads = 2 };
    CHECK_OK(stage_new(m, &sp, &s));
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    float *in = malloc(sizeof(float) * 4 * E), *out = malloc(sizeof(float) * 4 * V);
    for (int i = 0; i < 4 * E; i++)
        in[i] = (float)((i * 37) % 101 - 50) * 0.02f;
    int32_t pos[4] = { 0, 1, 2, 3 }, seq[4] = { 0 };
    stage_batch b = { .n_rows = 4, .pos = pos, .seq = seq };
    CHECK_OK(stage_forward(s, &b, in, out, NULL));
    free(in);
    stage_free(s);
    model_free(m);
    return out;
}

static uint64_t size_of(const char *path, uint64_t *disk)
{
    struct stat st;
    CHECK_OK(stat(path, &st));
    if (disk)
        *disk = (uint64_t)st.st_blocks * 512;
    return (uint64_t)st.st_size;
}

static bool same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    CHECK(fa && fb);
    int ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
    } while (ca == cb && ca != EOF);
    fclose(fa);
    fclose(fb);
    return ca == cb;
}

/* Node A with model m (at apath) and node B without, linked. */
static void a_has_model_b_not(node *a, node *b, char *apath, size_t cap)
{
    snprintf(apath, cap, "%s/a/models/m.gguf", test_tmpdir());
    mkdir(test_tmpdir(), 0700);
    start(a, "a", NULL, NULL, NULL);   /* makes the folders; the scan is redone below */
    write_model(apath);
    stop(a);
    start(a, "a", NULL, NULL, NULL);
    start(b, "b", cluster_join_token(a->c), a, NULL);
    wait_model(b, cluster_self_id(a->c), "m");
}

TEST_T(weights_pull_half_then_rest, 120)
{
    node a, b;
    char apath[800], path[1024], man[1100];
    a_has_model_b_not(&a, &b, apath, sizeof apath);

    progress_log pl = { 0 };
    CHECK_OK(weights_ensure(b.w, "m", 4, 8, NULL, NULL, progress, &pl, path, sizeof path));
    CHECK(strstr(path, "/b/models/m.gguf.part"));
    CHECK(pl.calls > 10 && pl.done == pl.total && pl.rate > 0);
    uint64_t disk, size = size_of(path, &disk);
    CHECK_INT(size, ==, size_of(apath, NULL));
    fprintf(stderr, "  pulled %.1f of %.1f MB (%.0f MB/s); the copy uses %.1f MB of disk\n",
            (double)pl.total / 1e6, (double)size / 1e6, pl.rate / 1e6, (double)disk / 1e6);
    CHECK_INT(pl.total, <, size * 6 / 10);
    CHECK_INT(disk, <, size * 6 / 10);           /* sparse */
    CHECK_OK(model_ranges_path(path, man, sizeof man));
    CHECK(access(man, F_OK) == 0);

    /* the copy computes A's logits for that stage, bit for bit */
    float *la = stage_logits(apath, 4, 8), *lb = stage_logits(path, 4, 8);
    CHECK(!memcmp(la, lb, sizeof(float) * 4 * 512));
    free(la);
    free(lb);
    model *m;
    CHECK_INT(model_load(path, 0, 8, &m), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "without layers 0-3"));

    /* asking again fetches nothing */
    progress_log again = { 0 };
    CHECK_OK(weights_ensure(b.w, "m", 5, 7, NULL, NULL, progress, &again, path, sizeof path));
    CHECK_INT(again.done, ==, 0);

    /* the rest completes the file: renamed, manifest gone, byte for byte */
    progress_log rest = { 0 };
    CHECK_OK(weights_ensure(b.w, "m", 0, -1, NULL, cluster_self_id(a.c), progress, &rest, path,
                            sizeof path));
    CHECK(strstr(path, "/b/models/m.gguf") && !strstr(path, ".part"));
    CHECK(access(man, F_OK) != 0);
    CHECK_INT(rest.total + pl.total, <=, size);
    CHECK(same_bytes(path, apath));
    CHECK_OK(model_load(path, 0, 8, &m));
    model_free(m);
    /* now local: no transfer */
    char again_path[1024];
    CHECK_OK(weights_ensure(b.w, "m", 0, 2, NULL, NULL, NULL, NULL, again_path, sizeof again_path));
    CHECK_STR(again_path, path);
    stop(&b);
    stop(&a);
}

/* A holds model m as a split set of 3 parts (read in place): B pulls
 * layers of it, then the rest, and gets the file `racimo join` writes,
 * byte for byte; A's root digest of the set is the joined file's. */
TEST_T(weights_pull_split_set, 120)
{
    node a, b;
    char whole[800], prefix[800], joined[800], path[1024], parts[3][900];
    snprintf(whole, sizeof whole, "%s/whole.gguf", test_tmpdir());
    snprintf(prefix, sizeof prefix, "%s/a/models/m", test_tmpdir());
    snprintf(joined, sizeof joined, "%s/joined.gguf", test_tmpdir());
    mkdir(test_tmpdir(), 0700);
    start(&a, "a", NULL, NULL, NULL);
    stop(&a);
    write_model(whole);
    gguf_file *f;
    CHECK_OK(gguf_open(whole, &f));
    CHECK_OK(gguf_split_write(f, 3, prefix));
    gguf_close(f);
    const char *pp[3];
    for (int i = 0; i < 3; i++) {
        snprintf(parts[i], sizeof parts[i], "%s-%05d-of-00003.gguf", prefix, i + 1);
        pp[i] = parts[i];
    }
    CHECK_OK(gguf_join(pp, 3, joined));
    start(&a, "a", NULL, NULL, NULL);
    start(&b, "b", cluster_join_token(a.c), &a, NULL);
    wait_model(&b, cluster_self_id(a.c), "m");

    /* the set's root is the joined file's (computed from each side) */
    uint8_t ra[DIGEST_BYTES];
    CHECK_OK(weights_model_root(a.w, "m", ra));
    CHECK_OK(weights_ensure(b.w, "m", 4, 8, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(strstr(path, "/b/models/m.gguf.part"));
    float *la = stage_logits(parts[0], 4, 8), *lb = stage_logits(path, 4, 8);
    CHECK(!memcmp(la, lb, sizeof(float) * 4 * 512));
    free(la);
    free(lb);
    /* a copy given up (no room) leaves nothing: the part, its ranges and
     * digests go */
    char man[1100], dig[1100];
    CHECK_OK(model_ranges_path(path, man, sizeof man));
    snprintf(dig, sizeof dig, "%s.digests", path);
    CHECK(access(man, F_OK) == 0 && access(dig, F_OK) == 0);
    CHECK_OK(weights_discard(b.w, "m"));
    CHECK(access(path, F_OK) != 0 && access(man, F_OK) != 0 && access(dig, F_OK) != 0);
    CHECK_INT(weights_discard(b.w, "../m"), ==, RC_EINVAL);
    CHECK_OK(weights_ensure(b.w, "m", 0, -1, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(strstr(path, "/b/models/m.gguf") && !strstr(path, ".part"));
    CHECK(same_bytes(path, joined));
    uint8_t rb[DIGEST_BYTES];
    CHECK_OK(weights_model_root(b.w, "m", rb));
    CHECK(!memcmp(ra, rb, DIGEST_BYTES));
    stop(&b);
    stop(&a);
}

static void *down_later(void *arg)
{
    void **v = arg;
    usleep(300000);
    weights_on_node_down(v[0], v[1]);
    return NULL;
}

TEST_T(weights_refusals, 120)
{
    node a, b;
    char apath[800], path[1024], outside[800], evil[800], ro[800], ropath[900];
    mkdir(test_tmpdir(), 0700);
    snprintf(ro, sizeof ro, "%s/ro", test_tmpdir());
    mkdir(ro, 0755);
    snprintf(ropath, sizeof ropath, "%s/r.gguf", ro);
    snprintf(outside, sizeof outside, "%s/outside.gguf", test_tmpdir());
    snprintf(apath, sizeof apath, "%s/a/models/m.gguf", test_tmpdir());
    snprintf(evil, sizeof evil, "%s/a/models/evil.gguf", test_tmpdir());
    start(&a, "a", NULL, NULL, NULL);
    stop(&a);
    write_model(apath);
    write_model(outside);
    CHECK_OK(symlink(outside, evil));
    write_model(ropath);
    chmod(ro, 0555);
    start(&a, "a", NULL, NULL, NULL);
    start(&b, "b", cluster_join_token(a.c), &a, ro);
    const char *ida = cluster_self_id(a.c);
    wait_model(&b, ida, "m");
    wait_model(&b, ida, "evil");

    /* names that are paths never reach the network */
    const char *bad[] = { "../m", "a/b", ".hidden", "x..y", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_INT(weights_ensure(b.w, bad[i], 0, 1, NULL, NULL, NULL, NULL, path, sizeof path), ==,
                  RC_EINVAL);
        CHECK(strstr(rc_errmsg(), "is not a plain file name"));
    }
    CHECK_INT(weights_ensure(b.w, "m", 3, 2, NULL, NULL, NULL, NULL, path, sizeof path), ==, RC_EINVAL);
    /* first == last: only the file's head (a head node's tokenizer and sizes) */
    CHECK_OK(weights_ensure(b.w, "m", 3, 3, NULL, NULL, NULL, NULL, path, sizeof path));
    struct stat hs;      /* the blocks of the head only */
    CHECK(stat(path, &hs) == 0 && (uint64_t)hs.st_blocks * 512 <= 2 * DIGEST_BLOCK);
    gguf_file *hf;
    CHECK_OK(gguf_open_meta(path, &hf));
    gguf_close(hf);
    CHECK_INT(weights_ensure(b.w, "nosuch", 0, 1, NULL, NULL, NULL, NULL, path, sizeof path), ==,
              RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "no node in the cluster lists model 'nosuch'"));
    CHECK_INT(weights_ensure(b.w, "m", 0, 1, NULL, "0123456789abcdef0123456789abcdef", NULL, NULL,
                             path, sizeof path), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "node 01234567 is not up"));
    CHECK_INT(weights_ensure(b.w, "m", 0, 99, NULL, NULL, NULL, NULL, path, sizeof path), ==,
              RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "not within the model's 8 layers"));

    /* a read-only folder's model is used in place, never copied */
    CHECK_OK(weights_ensure(b.w, "r", 0, 2, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK_STR(path, ropath);

    /* a model A's owner symlinked into its models folder is listed and
     * served through the descriptor opened when it was listed (it used to
     * be refused as "outside the models folder") */
    CHECK_OK(weights_ensure(b.w, "evil", 0, -1, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(same_bytes(path, outside));

    /* a damaged chunk is rejected; what was verified before stays */
    weights_test_hooks(b.w, 5, 0, 0);
    CHECK_INT(weights_ensure(b.w, "m", 0, 4, NULL, NULL, NULL, NULL, path, sizeof path), ==,
              RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "do not match the model's content digest"));
    CHECK(strstr(rc_errmsg(), "pulling layers 0-3 of 'm': ") && strstr(rc_errmsg(), "(a) sent"));
    char part[900];
    snprintf(part, sizeof part, "%s/m.gguf.part", b.models);
    model *m;
    CHECK_INT(model_load(part, 0, 4, &m), ==, RC_ENOTFOUND);
    weights_test_hooks(b.w, 0, 0, 0);
    progress_log pl = { 0 };
    CHECK_OK(weights_ensure(b.w, "m", 0, 4, NULL, NULL, progress, &pl, path, sizeof path));
    CHECK_STR(path, part);
    CHECK_OK(model_load(path, 0, 4, &m));
    model_free(m);

    /* a peer that stops answering: a timeout, or at once when it is
     * reported down */
    weights_test_hooks(a.w, 0, 1, 0);
    weights_test_hooks(b.w, 0, 0, 400);
    CHECK_INT(weights_ensure(b.w, "m", 4, 8, NULL, NULL, NULL, NULL, path, sizeof path), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "did not answer within"));
    weights_test_hooks(b.w, 0, 0, 20000);
    pthread_t th;
    void *args[2] = { b.w, (void *)ida };
    CHECK_OK(pthread_create(&th, NULL, down_later, args));
    uint64_t t0 = (uint64_t)time(NULL);
    CHECK_INT(weights_ensure(b.w, "m", 4, 8, NULL, NULL, NULL, NULL, path, sizeof path), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "went down"));
    CHECK_INT((uint64_t)time(NULL) - t0, <, 10);
    pthread_join(th, NULL);
    /* ... and when it answers again, the pull completes */
    weights_test_hooks(a.w, 0, 0, 0);
    CHECK_OK(weights_ensure(b.w, "m", 4, 8, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(!strstr(path, ".part"));
    CHECK(same_bytes(path, apath));
    chmod(ro, 0755);
    stop(&b);
    stop(&a);
}

static int no_sum(void *ud, float *x, int n_rows, int width)
{
    (void)ud; (void)x; (void)n_rows; (void)width;
    return 0;
}

/* Logits columns of tensor-parallel shard `rank` of 2 for fixed tokens,
 * its parts left unsummed (a shard's own arithmetic). */
static float *shard_logits(const char *path, int rank)
{
    model *m;
    stage *s;
    CHECK_OK(model_load_shard(path, 0, -1, rank, 2, &m));
    stage_params sp = { .n_ctx = 16, .n_seq = 1, .n_batch = 4, .n_threads = 2,
                        .reduce = no_sum };
    CHECK_OK(stage_new(m, &sp, &s));
    const int V = m->hp.n_vocab;
    float *out = calloc((size_t)4 * V, sizeof(float));
    int32_t tok[4] = { 5, 77, 300, 2 }, pos[4] = { 0, 1, 2, 3 }, seq[4] = { 0 };
    stage_batch b = { .n_rows = 4, .token = tok, .pos = pos, .seq = seq };
    CHECK_OK(stage_forward(s, &b, NULL, out, NULL));
    stage_free(s);
    model_free(m);
    return out;
}

/* Node b pulls shard 1 of 2 of node a's model: between half and three
 * quarters of the file, and its copy computes what the shard computes from
 * the whole file.  Returns the file's size; the copy's path in path. */
static uint64_t pull_shard_1(node *b, const char *apath, char *path, size_t cap)
{
    progress_log pl = { 0 };
    CHECK_OK(weights_ensure_shard(b->w, "m", 0, -1, 1, 2, NULL, NULL, progress, &pl, path, cap));
    CHECK(strstr(path, "/b/models/m.gguf.part"));
    uint64_t size = size_of(apath, NULL);
    fprintf(stderr, "  %s shard 1 of 2 pulled %.1f of %.1f MB\n", model_preset,
            (double)pl.total / 1e6, (double)size / 1e6);
    CHECK_INT(pl.total, <, size * 3 / 4);
    CHECK_INT(pl.total, >, size / 2);
    float *la = shard_logits(apath, 1), *lb = shard_logits(path, 1);
    CHECK(!memcmp(la, lb, sizeof(float) * 4 * 512));
    free(la);
    free(lb);
    return size;
}

/* A tensor-parallel shard pulls its rows of the row-cut tensors and the
 * column-cut ones whole, not the file; the other shard and the whole model
 * are refused on that copy, naming what is missing. */
TEST_T(weights_pull_shard, 120)
{
    node a, b;
    char apath[800], path[1024];
    model_layers = 2, model_embd = 1024, model_ff = 4096;
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    model_layers = 8, model_embd = 512, model_ff = 1536;
    uint64_t size = pull_shard_1(&b, apath, path, sizeof path);
    model *m;
    CHECK_INT(model_load_shard(path, 0, -1, 0, 2, &m), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "shard 0 of 2") && strstr(rc_errmsg(), "blk."));
    CHECK_INT(model_load(path, 0, -1, &m), ==, RC_ENOTFOUND);
    /* shard 0 next: only what is still missing */
    progress_log p0 = { 0 };
    CHECK_OK(weights_ensure_shard(b.w, "m", 0, -1, 0, 2, NULL, NULL, progress, &p0, path, sizeof path));
    CHECK_INT(p0.total, <, size / 2);
    CHECK_OK(model_load_shard(path, 0, -1, 0, 2, &m));
    model_free(m);
    stop(&b);
    stop(&a);
}

/* The same for a mixture-of-experts model: a shard pulls its rows of every
 * expert's gate and up (one range per expert) and the experts' down whole. */
TEST_T(weights_pull_moe_shard, 120)
{
    node a, b;
    char apath[800], path[1024];
    model_preset = "tiny-qwen3moe";
    model_layers = 2, model_embd = 1024, model_ff = 4096;
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    model_layers = 8, model_embd = 512, model_ff = 1536;
    pull_shard_1(&b, apath, path, sizeof path);
    model_preset = "tiny";
    stop(&b);
    stop(&a);
}

/* A node `name` holding a hard link to `apath` as model m, started linked
 * to a. */
static void second_holder(node *c, const char *name, const node *a, const char *apath)
{
    char dir[800], cpath[900];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0700);
    snprintf(cpath, sizeof cpath, "%s/models", dir);
    mkdir(cpath, 0755);
    snprintf(cpath, sizeof cpath, "%s/models/m.gguf", dir);
    CHECK_OK(link(apath, cpath));
    start(c, name, cluster_join_token(a->c), a, NULL);
}

/* Two holders: B's whole copy takes bytes from both, each block once. */
TEST_T(weights_pull_from_two_holders, 120)
{
    node a, b, c;
    char apath[800], path[1024];
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    second_holder(&c, "c", &a, apath);
    wait_model(&b, cluster_self_id(c.c), "m");
    uint64_t a0 = weights_served_bytes(a.w), c0 = weights_served_bytes(c.w);
    CHECK_OK(weights_ensure(b.w, "m", 0, -1, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(same_bytes(path, apath));
    uint64_t from_a = weights_served_bytes(a.w) - a0, from_c = weights_served_bytes(c.w) - c0;
    fprintf(stderr, "  %.1f MB from a, %.1f MB from c\n", (double)from_a / 1e6,
            (double)from_c / 1e6);
    CHECK_INT(from_a, >, 0);
    CHECK_INT(from_c, >, 0);
    CHECK_INT(from_a + from_c, ==, size_of(apath, NULL));
    stop(&b);
    stop(&c);
    stop(&a);
}

/* Two holders of m, one of which serves altered bytes: the puller refuses
 * them and completes from the other, whichever it asks first; the copy is
 * the file byte for byte. */
TEST_T(weights_altered_holder_left_out, 180)
{
    node a, b, c;
    char apath[800], path[1024];
    uint8_t root[DIGEST_BYTES];
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    second_holder(&c, "c", &a, apath);
    const char *ida = cluster_self_id(a.c), *idc = cluster_self_id(c.c);
    wait_model(&b, idc, "m");
    CHECK_OK(weights_model_root(a.w, "m", root));

    /* asked alone, the altered holder is refused and nothing is kept */
    weights_test_alter(c.w, true);
    CHECK_INT(weights_ensure(b.w, "m", 0, 2, root, idc, NULL, NULL, path, sizeof path), ==,
              RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "(c) sent bytes") &&
          strstr(rc_errmsg(), "do not match the model's content digest"));
    char part[900], man[1000];
    snprintf(part, sizeof part, "%s/m.gguf.part", b.models);
    CHECK_OK(model_ranges_path(part, man, sizeof man));
    model_ranges r;
    CHECK_OK(model_ranges_read(man, &r));
    CHECK_INT(r.n, ==, 0);
    model_ranges_free(&r);

    /* a altered, c honest, then the other way round: in one of the two
     * pulls the altered holder is asked first, refused and left out */
    weights_test_alter(c.w, false);
    weights_test_alter(a.w, true);
    CHECK_OK(weights_ensure(b.w, "m", 0, 4, root, NULL, NULL, NULL, path, sizeof path));
    weights_test_alter(a.w, false);
    weights_test_alter(c.w, true);
    CHECK_OK(weights_ensure(b.w, "m", 4, 8, NULL, NULL, NULL, NULL, path, sizeof path));
    CHECK(!strstr(path, ".part"));
    CHECK(same_bytes(path, apath));
    (void)ida;
    stop(&b);
    stop(&c);
    stop(&a);
}

/* A root the holder's block digests do not hash to: refused before the
 * copy is sized; the right root then pulls. */
TEST_T(weights_root_mismatch_refused, 120)
{
    node a, b;
    char apath[800], path[1024], part[900];
    uint8_t root[DIGEST_BYTES];
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    CHECK_OK(weights_model_root(a.w, "m", root));
    root[5] ^= 0x40;
    CHECK_INT(weights_ensure(b.w, "m", 0, 2, root, NULL, NULL, NULL, path, sizeof path), ==,
              RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "with content digest") && strstr(rc_errmsg(), "not the"));
    snprintf(part, sizeof part, "%s/m.gguf.part", b.models);
    CHECK_INT(size_of(part, NULL), ==, 0);
    root[5] ^= 0x40;
    CHECK_OK(weights_ensure(b.w, "m", 0, 2, root, NULL, NULL, NULL, path, sizeof path));
    /* a pinned digest (racimo serve --model-digest) is what a pull without
     * one is checked against */
    root[0] ^= 1;
    uint8_t other[DIGEST_BYTES];
    CHECK_OK(weights_pin(b.w, "m", root));
    CHECK_INT(weights_ensure(b.w, "m", 2, 4, NULL, NULL, NULL, NULL, path, sizeof path), ==,
              RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "of the user"));
    CHECK_OK(weights_model_root(a.w, "m", other));
    CHECK_OK(weights_pin(b.w, "m", other));
    CHECK_OK(weights_ensure(b.w, "m", 2, 4, NULL, NULL, NULL, NULL, path, sizeof path));
    stop(&b);
    stop(&a);
}

/* A hostile member speaking the weight messages by hand (no weights
 * object): its answers out of bounds are refused before the puller
 * allocates or sizes anything, and an honest server refuses its requests
 * out of bounds. */
typedef struct {
    int mode;                 /* what INFO says: 0 huge file, 1 head past the end,
                                 2 another block size, 3 sane but digests of a bad count */
    int32_t status[256];      /* the status of the last reply of each request id */
    pthread_mutex_t mu;
} rogue;

static void rogue_msg(void *ud, const char *from, int type, const uint8_t *d, size_t len)
{
    rogue *r = ud;
    if (len < 4)
        return;
    uint32_t id = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 |
                  (uint32_t)d[3] << 24;
    if (type == 0x51 || type == 0x53 || type == 0x55) {
        pthread_mutex_lock(&r->mu);
        if (len >= 8)
            r->status[id & 0xff] = (int32_t)((uint32_t)d[4] | (uint32_t)d[5] << 8 |
                                             (uint32_t)d[6] << 16 | (uint32_t)d[7] << 24);
        pthread_mutex_unlock(&r->mu);
    }
    (void)from;
}

typedef struct {
    rogue *r;
    struct cluster *c;
} rogue_srv;

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void rogue_serve(void *ud, const char *from, int type, const uint8_t *d, size_t len)
{
    rogue_srv *s = ud;
    if (type != 0x50 && type != 0x54) {
        rogue_msg(s->r, from, type, d, len);
        return;
    }
    uint8_t out[8 + 8 + 8 + 4 + 32 + 64] = { 0 };
    memcpy(out, d, 4);                          /* the request id */
    if (type == 0x50) {
        static const uint64_t size[] = { 1ull << 50, 4u << 20, 4u << 20, 4u << 20 };
        static const uint64_t head[] = { 4096, 5u << 20, 4096, 4096 };
        static const uint32_t block[] = { DIGEST_BLOCK, DIGEST_BLOCK, 4096, DIGEST_BLOCK };
        put_le(out + 8, size[s->r->mode], 8);
        put_le(out + 16, head[s->r->mode], 8);
        put_le(out + 24, block[s->r->mode], 4);
        cluster_send(s->c, from, 0x51, out, 8 + 8 + 8 + 4 + 32);
    } else {                                    /* one digest too many */
        put_le(out + 8, 0, 4);
        put_le(out + 12, 4, 4);
        cluster_send(s->c, from, 0x55, out, 16 + 64);
    }
}

TEST_T(weights_out_of_bounds_refused, 120)
{
    node a, b;
    char apath[800], path[1024], part[900], addr[64], dir[600], models[700];
    const char *peers[1];
    a_has_model_b_not(&a, &b, apath, sizeof apath);
    rogue r = { .mode = 0 };
    pthread_mutex_init(&r.mu, NULL);
    cluster_config cfg;
    test_cluster_config(&cfg, "h", cluster_join_token(a.c), cluster_port(a.c), dir, sizeof dir,
                        models, sizeof models, addr, peers);
    rogue_srv srv = { &r, NULL };
    CHECK_OK(cluster_new(&cfg, &srv.c, NULL));
    CHECK_OK(cluster_add_handler(srv.c, 0x50, 0x57, rogue_serve, &srv));
    CHECK_OK(cluster_start(srv.c));
    const char *idh = cluster_self_id(srv.c), *ida = cluster_self_id(a.c);
    for (int t = 0; t < 8000; t += 20) {       /* b sees h up */
        json_t *v = cluster_snapshot(b.c), *n;
        size_t i;
        bool up = false;
        json_array_foreach(json_object_get(v, "nodes"), i, n)
            up = up || (!strcmp(json_string_value(json_object_get(n, "id")), idh) &&
                        !strcmp(json_string_value(json_object_get(n, "state")), "up"));
        json_decref(v);
        if (up)
            break;
        usleep(20000);
    }
    snprintf(part, sizeof part, "%s/m.gguf.part", b.models);
    static const char *const why[] = { "out-of-bounds info", "out-of-bounds info",
                                       "in blocks of 4096 bytes", "malformed block digests" };
    for (r.mode = 0; r.mode < 4; r.mode++) {
        CHECK_INT(weights_ensure(b.w, "m", 0, 2, NULL, idh, NULL, NULL, path, sizeof path), <, 0);
        if (!strstr(rc_errmsg(), why[r.mode]))
            FAIL("mode %d: %s", r.mode, rc_errmsg());
        CHECK_INT(size_of(part, NULL), ==, 0);  /* never sized */
    }
    /* the honest server refuses requests out of bounds with a status */
    uint8_t req[64] = { 0 };
    put_le(req, 7, 4);
    req[4] = 1;
    req[5] = 'm';
    put_le(req + 6, 0, 8);
    put_le(req + 14, 64u << 20, 4);            /* a 64 MiB read */
    CHECK_OK(cluster_send(srv.c, ida, 0x52, req, 6 + 12));
    put_le(req, 8, 4);
    put_le(req + 6, 0, 4);
    put_le(req + 10, 0x7fffffff, 4);           /* two billion digests */
    CHECK_OK(cluster_send(srv.c, ida, 0x54, req, 6 + 8));
    for (int t = 0; t < 8000; t += 20) {
        pthread_mutex_lock(&r.mu);
        bool both = r.status[7] && r.status[8];
        pthread_mutex_unlock(&r.mu);
        if (both)
            break;
        usleep(20000);
    }
    CHECK_INT(r.status[7], ==, RC_EINVAL);
    CHECK_INT(r.status[8], ==, RC_ERANGE);
    cluster_free(srv.c);
    pthread_mutex_destroy(&r.mu);
    stop(&b);
    stop(&a);
}

/* --export: a model left out is neither listed nor served, with a message
 * on both sides; the listed one pulls. */
TEST_T(weights_export_list, 120)
{
    node a, b;
    char apath[800], ppath[800], path[1024];
    snprintf(apath, sizeof apath, "%s/a/models/m.gguf", test_tmpdir());
    snprintf(ppath, sizeof ppath, "%s/a/models/p.gguf", test_tmpdir());
    mkdir(test_tmpdir(), 0700);
    start(&a, "a", NULL, NULL, NULL);
    write_model(apath);
    CHECK_OK(link(apath, ppath));
    stop(&a);
    start_exports = "m";
    start(&a, "a", NULL, NULL, NULL);
    start_exports = NULL;
    start(&b, "b", cluster_join_token(a.c), &a, NULL);
    const char *ida = cluster_self_id(a.c);
    wait_model(&b, ida, "m");
    json_t *v = cluster_snapshot(b.c), *n, *m;
    size_t i, j;
    json_array_foreach(json_object_get(v, "nodes"), i, n)
        json_array_foreach(json_object_get(n, "models"), j, m)
            CHECK(strcmp(json_string_value(json_object_get(m, "name")), "p"));
    json_decref(v);
    CHECK_INT(weights_ensure(b.w, "p", 0, 1, NULL, NULL, NULL, NULL, path, sizeof path), ==,
              RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "--export"));
    CHECK_INT(weights_ensure(b.w, "p", 0, 1, NULL, ida, NULL, NULL, path, sizeof path), ==,
              RC_ESTATE);
    CHECK(strstr(rc_errmsg(), "is not exported by this node"));
    CHECK_OK(weights_ensure(b.w, "m", 0, 1, NULL, NULL, NULL, NULL, path, sizeof path));
    stop(&b);
    stop(&a);
}

