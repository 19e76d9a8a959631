/* test_model_map.c - a stage maps only its own tensors: the head-only parse
 * fails exactly as the whole-file parse on damaged files, a half-model load
 * maps about half the file, fits an address-space limit the whole model
 * does not fit, and keeps its peak resident memory near its own share; a
 * partial copy with a manifest of verified ranges refuses missing layers. */
#include "test.h"
#include "model_util.h"

#include "base/err.h"
#include "base/os.h"
#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "model/ranges.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#endif

/* A llama model of n_layer layers with weights of `type` and a small
 * vocabulary, so the layers hold nearly all the bytes. */
static const char *write_model(const char *name, int n_layer, int n_embd, int n_ff, int type)
{
    static char path[1024];
    synth_params p;
    CHECK_OK(synth_preset("tiny", &p));
    p.n_layer = n_layer;
    p.n_embd = n_embd;
    p.n_ff = n_ff;
    p.n_head = 8;
    p.n_head_kv = 8;
    p.type = type;
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    CHECK_OK(synth_write(path, &p));
    return path;
}

static uint64_t file_bytes(const char *path)
{
    struct stat st;
    CHECK_OK(stat(path, &st));
    return (uint64_t)st.st_size;
}

/* Bytes of this process's address space mapping `path`, and how many
 * mappings. */
static uint64_t mapped_bytes(const char *path, int *n_maps)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[2048];
    uint64_t total = 0;
    *n_maps = 0;
    CHECK(f);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char *p = strchr(line, '/');
        if (!p || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
            continue;
        p[strcspn(p, "\n")] = 0;
        if (!strcmp(p, path)) {
            total += hi - lo;
            ++*n_maps;
        }
    }
    fclose(f);
    return total;
}

/* "VmSize:" or "VmHWM:" of /proc/self/status, in bytes. */
static uint64_t proc_status(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long kb = 0;
    size_t n = strlen(key);
    CHECK(f);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && sscanf(line + n, " %lu", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

TEST(model_map_head_parse_matches_whole)
{
    /* The head parse regrows its mapping from 64 bytes; on every truncated
     * or damaged copy it must give the code and message the whole-file
     * parse gives. */
    gguf__meta_initial_bytes = 64;
    const char *path = test_make_model("tiny", TT_F32, NULL);
    gguf_file *a, *b;
    CHECK_OK(gguf_open(path, &a));
    CHECK_OK(gguf_open_meta(path, &b));
    CHECK_INT(a->n_kv, ==, b->n_kv);
    CHECK_INT(a->n_tensors, ==, b->n_tensors);
    CHECK_INT(a->data_offset, ==, b->data_offset);
    CHECK_INT(a->size_bytes, ==, b->size_bytes);
    CHECK(a->data_offset > 4096);       /* so the head really regrew */
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        CHECK_STR(a->tensors[i].name, b->tensors[i].name);
        CHECK_INT(a->tensors[i].file_offset, ==, b->tensors[i].file_offset);
        CHECK(b->tensors[i].data == NULL);
    }
    gguf_str sa, sb;
    CHECK_OK(gguf_get_str(a, "tokenizer.chat_template", &sa));
    CHECK_OK(gguf_get_str(b, "tokenizer.chat_template", &sb));
    CHECK(sa.len == sb.len && !memcmp(sa.ptr, sb.ptr, sa.len));
    /* mapping one tensor gives the same bytes */
    bool *need = calloc(b->n_tensors, 1);
    need[3] = true;
    CHECK_OK(gguf_map_tensors(b, need));
    CHECK(b->tensors[3].data && !memcmp(b->tensors[3].data, a->tensors[3].data,
                                        a->tensors[3].size_bytes));
    CHECK(b->tensors[2].data == NULL);
    free(need);

    uint64_t head = a->data_offset, size = a->size_bytes;
    uint8_t *img = malloc(size);
    memcpy(img, a->base, size);
    gguf_close(a);
    gguf_close(b);
    char cut[1100];
    snprintf(cut, sizeof cut, "%s/cut.gguf", test_tmpdir());
    int n_fail = 0;
    for (uint64_t k = 0; k < head + 64; k += k < 256 ? 1 : 61) {
        for (int mode = 0; mode < 2; mode++) {
            /* mode 0: truncated at k; mode 1: byte k set to 0xff */
            FILE *f = fopen(cut, "wb");
            CHECK(f);
            if (mode == 0) {
                CHECK_INT(fwrite(img, 1, k, f), ==, k);
            } else {
                uint8_t save = img[k];
                img[k] = 0xff;
                CHECK_INT(fwrite(img, 1, size, f), ==, size);
                img[k] = save;
            }
            fclose(f);
            char msg_a[600];
            int ra = gguf_open(cut, &a);
            snprintf(msg_a, sizeof msg_a, "%s", ra ? rc_errmsg() : "");
            int rb = gguf_open_meta(cut, &b);
            if (ra != rb || (ra && strcmp(msg_a, rc_errmsg())))
                FAIL("mode %d at %llu: whole parse %d '%s', head parse %d '%s'", mode,
                     (unsigned long long)k, ra, msg_a, rb, rb ? rc_errmsg() : "");
            n_fail += ra != 0;
            gguf_close(ra ? NULL : a);
            gguf_close(rb ? NULL : b);
        }
    }
    CHECK(n_fail > 300);
    free(img);
}

TEST(model_map_half_maps_half)
{
    const char *path = write_model("m8", 8, 256, 768, TT_F32);
    const uint64_t size = file_bytes(path);
    int n_maps;
    model *m;
    CHECK_OK(model_load(path, 0, 4, &m));
    uint64_t half = mapped_bytes(path, &n_maps);
    /* the head, and one run for the embedding and layers 0-3 */
    CHECK_INT(n_maps, <=, 2);
    CHECK_INT(half, <, size * 6 / 10);
    CHECK_INT(half, >, size * 4 / 10);
    model *whole;
    CHECK_OK(model_load(path, 0, -1, &whole));
    int n_whole;
    CHECK_INT(mapped_bytes(path, &n_whole) - half, >=, size);
    CHECK(whole->file->base[whole->file->size_bytes - 1] == ((const uint8_t *)
          whole->file->tensors[whole->file->n_tensors - 1].data)[
          whole->file->tensors[whole->file->n_tensors - 1].size_bytes - 1]);
    /* the same logits from the half-mapped pair of stages as from the whole */
    model *second;
    CHECK_OK(model_load(path, 4, 8, &second));
    stage_params sp = { .n_ctx = 32, .n_seq = 1, .n_batch = 8, .n_threads = 2 };
    stage *s1, *s2, *sw;
    CHECK_OK(stage_new(m, &sp, &s1));
    CHECK_OK(stage_new(second, &sp, &s2));
    CHECK_OK(stage_new(whole, &sp, &sw));
    const int V = whole->hp.n_vocab, E = whole->hp.n_embd, n = 5;
    int32_t tok[5] = { 1, 7, 100, 3, 42 }, pos[5], seq[5] = { 0 };
    for (int i = 0; i < n; i++)
        pos[i] = i;
    float *h = malloc(sizeof(float) * n * E), *l1 = malloc(sizeof(float) * n * V),
          *l2 = malloc(sizeof(float) * n * V);
    stage_batch b = { .n_rows = n, .token = tok, .pos = pos, .seq = seq };
    CHECK_OK(stage_forward(s1, &b, NULL, h, NULL));
    CHECK_OK(stage_forward(s2, &b, h, l1, NULL));
    CHECK_OK(stage_forward(sw, &b, NULL, l2, NULL));
    CHECK(!memcmp(l1, l2, sizeof(float) * n * V));
    free(h);
    free(l1);
    free(l2);
    stage_free(s1);
    stage_free(s2);
    stage_free(sw);
    model_free(m);
    model_free(second);
    model_free(whole);
    CHECK_INT(mapped_bytes(path, &n_maps), ==, 0);
}

/* Child: load layers [first, last) and run 4 tokens through them. */
static int child_load_and_run(const char *path, int first, int last)
{
    model *m;
    stage *s;
    int rc = model_load(path, first, last, &m);
    if (rc) {
        fprintf(stderr, "  child: %s\n", rc_errmsg());
        return rc == RC_ENOMEM && strstr(rc_errmsg(), "out of memory") ? 10 : 11;
    }
    stage_params sp = { .n_ctx = 16, .n_seq = 1, .n_batch = 4, .n_threads = 1 };
    if ((rc = stage_new(m, &sp, &s))) {
        fprintf(stderr, "  child: stage_new: %s\n", rc_errmsg());
        return 12;
    }
    const int E = m->hp.n_embd;
    int32_t tok[4] = { 1, 2, 3, 4 }, pos[4] = { 0, 1, 2, 3 }, seq[4] = { 0 };
    static float in[4 * 4096], out[4 * 4096];
    if (E > 4096 || m->hp.n_vocab > 4096)
        return 13;
    for (int i = 0; i < 4 * E; i++)
        in[i] = (float)(i % 7) * 0.1f;
    stage_batch b = { .n_rows = 4, .token = tok, .pos = pos, .seq = seq };
    if ((rc = stage_forward(s, &b, in, out, NULL))) {
        fprintf(stderr, "  child: forward: %s\n", rc_errmsg());
        return 14;
    }
    stage_free(s);
    model_free(m);
    return 0;
}

static int run_child(const char *path, int first, int last, uint64_t as_extra, uint64_t *hwm)
{
    int fds[2];
    CHECK_OK(pipe(fds));
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        if (as_extra) {
            struct rlimit rl = { proc_status("VmSize:") + as_extra, RLIM_INFINITY };
            rl.rlim_max = rl.rlim_cur;
            if (setrlimit(RLIMIT_AS, &rl) != 0)
                _exit(20);
        }
        uint64_t before = proc_status("VmHWM:");
        int code = child_load_and_run(path, first, last);
        uint64_t r[2] = { before, proc_status("VmHWM:") };
        if (write(fds[1], r, sizeof r) != (ssize_t)sizeof r)
            _exit(21);
        _exit(code);
    }
    close(fds[1]);
    uint64_t r[2] = { 0, 0 };
    ssize_t got = read(fds[0], r, sizeof r);
    close(fds[0]);
    int status;
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFEXITED(status));
    if (hwm && got == (ssize_t)sizeof r) {
        hwm[0] = r[0];
        hwm[1] = r[1];
    }
    return WEXITSTATUS(status);
}

TEST_T(model_map_fits_address_limit, 120)
{
#ifdef UNDER_ASAN
    SKIP("ASan reserves its shadow memory lazily; an address-space limit breaks it");
#endif
    /* 6 layers of 1024 x (4 x 1024 + 3 x 2816) F16 weights: about 160 MB */
    const char *path = write_model("big", 6, 1024, 2816, TT_F16);
    const uint64_t size = file_bytes(path);
    CHECK_INT(size, >, 140u << 20);
    uint64_t limit = size * 6 / 10;
    /* the first half, the second half fit; the whole model does not, with a
     * clear out-of-memory error */
    CHECK_INT(run_child(path, 0, 3, limit, NULL), ==, 0);
    CHECK_INT(run_child(path, 3, 6, limit, NULL), ==, 0);
    CHECK_INT(run_child(path, 0, 6, limit, NULL), ==, 10);
    /* without the limit the whole model loads (so the limit made the difference) */
    CHECK_INT(run_child(path, 0, 6, 0, NULL), ==, 0);
}

TEST_T(model_map_peak_rss_half, 120)
{
    const char *path = write_model("big", 6, 1024, 2816, TT_F16);
    const uint64_t size = file_bytes(path);
    uint64_t hwm[2];
    CHECK_INT(run_child(path, 3, 6, 0, hwm), ==, 0);
    /* KV: 3 layers x 16 positions x 2 x 1024 floats: tiny; work buffers for
     * 4 rows: small.  Slack 16 MB for code, malloc and the file head. */
    uint64_t grew = hwm[1] > hwm[0] ? hwm[1] - hwm[0] : 0;
    fprintf(stderr, "  peak RSS grew %.1f MB for half of a %.1f MB model\n",
            (double)grew / 1e6, (double)size / 1e6);
    CHECK_INT(hwm[1], <, hwm[0] + size / 2 + (16u << 20));
    CHECK_INT(grew, >, size / 4);      /* it did read its layers */
}

TEST(model_map_partial_copy_ranges)
{
    const char *src = write_model("p4", 4, 128, 256, TT_F32);
    char part[1100], man[1200];
    snprintf(part, sizeof part, "%s/p4.gguf.part", test_tmpdir());
    CHECK_OK(model_ranges_path(part, man, sizeof man));
    CHECK(strstr(man, "/p4.gguf.ranges"));
    CHECK(rename(src, part) == 0);
    /* no manifest next to a .part file: refused */
    model *m;
    CHECK_INT(model_load(part, 2, 4, &m), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "incomplete download"));

    gguf_file *f;
    CHECK_OK(gguf_open_meta(part, &f));
    bool need[64];
    CHECK(f->n_tensors <= 64);
    CHECK_OK(model_tensor_needs(f, 2, 4, need));
    model_ranges r = { .file_bytes = f->size_bytes };
    CHECK_OK(model_ranges_add(&r, 0, f->data_offset));
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (need[i])
            CHECK_OK(model_ranges_add(&r, f->tensors[i].file_offset,
                                      f->tensors[i].file_offset + f->tensors[i].size_bytes));
    gguf_close(f);
    CHECK_OK(model_ranges_write(man, &r));
    model_ranges back;
    CHECK_OK(model_ranges_read(man, &back));
    CHECK_INT(back.n, ==, r.n);
    CHECK_INT(back.file_bytes, ==, r.file_bytes);
    model_ranges_free(&back);
    model_ranges_free(&r);

    CHECK_OK(model_load(part, 2, 4, &m));
    model_free(m);
    CHECK_INT(model_load(part, 0, 4, &m), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "without layers 0-1, token_embd.weight"));
    CHECK_INT(model_load(part, 1, 3, &m), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "without layer 1 "));

    /* a damaged manifest is an error naming the line */
    FILE *mf = fopen(man, "w");
    fprintf(mf, "racimo-ranges 1\nsize 100\n50 40\n");
    fclose(mf);
    CHECK_INT(model_load(part, 2, 4, &m), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "line 3"));
}
