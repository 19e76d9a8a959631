/* test_gguf_set.c - split GGUF sets read in place (gguf_set.c): the set
 * opened by its first part gives exactly the logits of the joined file,
 * maps only the tensors a layer range needs, and every broken set (a part
 * missing, renumbered, of another set, truncated, a tensor twice, a part
 * opened alone, a renamed first part) is refused with the file named. */
#include "test.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "tensor/types.h"
#include "model_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(gguf_split_names)
{
    size_t stem;
    uint32_t no, count;
    CHECK(gguf_split_name("/m/Qwen3-8B-Q4_K_M-00002-of-00003.gguf", &stem, &no, &count));
    CHECK_INT(stem, ==, strlen("/m/Qwen3-8B-Q4_K_M"));
    CHECK_INT(no, ==, 1);
    CHECK_INT(count, ==, 3);
    CHECK(gguf_split_name("a-00001-of-00001.gguf", &stem, &no, &count) && stem == 1);
    static const char *const bad[] = {
        "m.gguf", "-00001-of-00003.gguf", "/x/-00001-of-00003.gguf", "m-00004-of-00003.gguf",
        "m-00000-of-00003.gguf", "m-0001-of-00003.gguf", "m-00001-of-00003.gguf.part",
        "m-0000a-of-00003.gguf", "m_00001-of-00003.gguf", "m-00001-af-00003.gguf",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (gguf_split_name(bad[i], &stem, &no, &count))
            FAIL("'%s' taken for a part's name", bad[i]);
    char p[64];
    CHECK_OK(gguf_split_path("d/m-00001-of-00003.gguf", 2, 3, p, sizeof p));
    CHECK_STR(p, "d/m-00003-of-00003.gguf");
    CHECK_INT(gguf_split_path("d/m.gguf", 0, 3, p, sizeof p), ==, RC_EINVAL);
    CHECK_INT(gguf_split_path("d/m-00001-of-00003.gguf", 0, 3, p, 8), ==, RC_ELIMIT);
}

/* Writes `whole` as n parts <tmpdir>/NAME-0000i-of-0000n.gguf; the first
 * part's path into first. */
static void split_into(const char *whole, int n, const char *name, char *first, size_t cap)
{
    gguf_file *f;
    char prefix[700];
    snprintf(prefix, sizeof prefix, "%s/%s", test_tmpdir(), name);
    CHECK_OK(gguf_open(whole, &f));
    CHECK_OK(gguf_split_write(f, n, prefix));
    gguf_close(f);
    snprintf(first, cap, "%s-00001-of-%05d.gguf", prefix, n);
}

static void logits_of(const char *path, int first, int last, const int32_t *tok, int n,
                      float *out)
{
    model *m;
    stage *s;
    test_open_stage(path, first, last, 0, 64, 1, 16, 2, &m, &s);
    test_run_tokens(s, tok, n, 0, 0, 16, out);
    stage_free(s);
    model_free(m);
}

static void same_logits(const char *preset, int type, const char *mix, int n_parts)
{
    char whole[1024], first[1024];
    snprintf(whole, sizeof whole, "%s", test_make_model(preset, type, mix));
    split_into(whole, n_parts, preset, first, sizeof first);
    gguf_file *set, *one;
    CHECK_OK(gguf_open(first, &set));
    CHECK_OK(gguf_open(whole, &one));
    CHECK_INT(set->n_parts, ==, n_parts);
    CHECK_INT(set->n_tensors, ==, one->n_tensors);
    uint64_t bytes = 0;
    CHECK_OK(gguf_split_set_bytes(first, &bytes));
    CHECK_INT(set->size_bytes, ==, bytes);
    for (uint64_t i = 0; i < one->n_tensors; i++) {
        const gguf_tensor *a = &one->tensors[i], *b = gguf_find_tensor(set, a->name);
        CHECK(b && b->size_bytes == a->size_bytes && b->type == a->type);
        CHECK(memcmp(a->data, b->data, (size_t)a->size_bytes) == 0);
    }
    gguf_close(set);
    gguf_close(one);

    const int32_t tok[12] = { 1, 7, 42, 3, 99, 5, 17, 250, 8, 2, 64, 11 };
    model_hparams hp;
    CHECK_OK(gguf_open_meta(whole, &one));
    CHECK_OK(model_read_hparams(one, &hp));
    gguf_close(one);
    size_t n = (size_t)12 * (size_t)hp.n_vocab;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    CHECK(a && b);
    logits_of(whole, 0, -1, tok, 12, a);
    logits_of(first, 0, -1, tok, 12, b);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]))
            FAIL("%s %d parts: logit %zu: %.9g joined, %.9g split", preset, n_parts, i,
                 (double)a[i], (double)b[i]);
    free(a);
    free(b);
}

TEST(gguf_set_logits_equal_joined)
{
    same_logits("tiny", TT_Q8_0, NULL, 3);
    same_logits("tiny-qwen3", TT_Q4_K, "Q4_K_M", 2);
    same_logits("tiny-qwen3moe", TT_Q8_0, NULL, 5);
}

/* A stage of some layers maps only their tensors, from whichever parts
 * hold them. */
TEST(gguf_set_maps_what_a_stage_needs)
{
    char whole[1024], first[1024];
    snprintf(whole, sizeof whole, "%s", test_make_model("tiny", TT_Q8_0, NULL));
    split_into(whole, 3, "st", first, sizeof first);
    model *m;
    CHECK_OK(model_load(first, 1, 2, &m));
    const gguf_file *f = m->file;
    CHECK_INT(f->n_parts, ==, 3);
    bool parts_used[3] = { false };
    int mapped = 0, unmapped = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        bool mine = strncmp(t->name, "blk.1.", 6) == 0;
        if (mine) {
            CHECK(t->data != NULL);
            CHECK(t->data == gguf_find_tensor(f->parts[t->part], t->name)->data);
            parts_used[t->part] = true;
            mapped++;
        } else if (!strncmp(t->name, "blk.", 4)) {
            CHECK(t->data == NULL);
            unmapped++;
        }
    }
    CHECK_INT(mapped, >, 0);
    CHECK(parts_used[0] || parts_used[1] || parts_used[2]);
    CHECK_INT(unmapped, >, 0);
    model_free(m);
}

static void copy_file(const char *from, const char *to, long cut)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    char buf[65536];
    size_t n;
    long total = 0;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) {
        if (cut >= 0 && total + (long)n > cut)
            n = (size_t)(cut - total);
        CHECK(fwrite(buf, 1, n, b) == n);
        total += (long)n;
        if (cut >= 0 && total >= cut)
            break;
    }
    fclose(a);
    fclose(b);
}

/* Opens `path` and expects `code` with every `want` in the message. */
static void refused(const char *path, int code, const char *want1, const char *want2)
{
    gguf_file *f = NULL;
    int rc = gguf_open_meta(path, &f);
    if (rc != code)
        FAIL("%s: %d (%s), %d expected", path, rc, rc ? rc_errmsg() : "opened", code);
    CHECK(f == NULL);
    if (want1 && !strstr(rc_errmsg(), want1))
        FAIL("'%s' not in: %s", want1, rc_errmsg());
    if (want2 && !strstr(rc_errmsg(), want2))
        FAIL("'%s' not in: %s", want2, rc_errmsg());
    model *m = NULL;
    CHECK_INT(model_load(path, 0, -1, &m), ==, code);
    CHECK(m == NULL);
}

TEST(gguf_set_broken)
{
    char whole[1024], first[1024], p[1100], q[1100], keep[1100];
    snprintf(whole, sizeof whole, "%s", test_make_model("tiny", TT_Q8_0, NULL));
    split_into(whole, 3, "b", first, sizeof first);
    const char *d = test_tmpdir();

    /* a part opened alone names the first part */
    snprintf(p, sizeof p, "%s/b-00002-of-00003.gguf", d);
    refused(p, RC_EFORMAT, "part 2 of 3", "b-00001-of-00003.gguf");

    /* a part missing */
    snprintf(p, sizeof p, "%s/b-00003-of-00003.gguf", d);
    snprintf(keep, sizeof keep, "%s/keep.gguf", d);
    CHECK(rename(p, keep) == 0);
    refused(first, RC_ENOTFOUND, "b-00003-of-00003.gguf", "is missing");
    uint64_t bytes;
    CHECK_INT(gguf_split_set_bytes(first, &bytes), ==, RC_ENOTFOUND);

    /* part 2 in part 3's place: numbered wrong */
    snprintf(q, sizeof q, "%s/b-00002-of-00003.gguf", d);
    copy_file(q, p, -1);
    refused(first, RC_EFORMAT, "b-00003-of-00003.gguf", "part 2 of 3");

    /* a truncated part */
    copy_file(keep, p, 100);
    refused(first, RC_EFORMAT, "b-00003-of-00003.gguf", "truncated");

    /* a part of another set (2 parts) */
    char other[1024];
    split_into(whole, 2, "o", other, sizeof other);
    snprintf(q, sizeof q, "%s/o-00002-of-00002.gguf", d);
    copy_file(q, p, -1);
    refused(first, RC_EFORMAT, "b-00003-of-00003.gguf", "of 2");
    CHECK(rename(keep, p) == 0);

    /* the whole set again opens */
    gguf_file *f;
    CHECK_OK(gguf_open_meta(first, &f));
    gguf_close(f);

    /* the first part under another name: its other parts cannot be found */
    snprintf(q, sizeof q, "%s/renamed.gguf", d);
    copy_file(first, q, -1);
    refused(q, RC_EFORMAT, "renamed.gguf", "NAME-00001-of-00003.gguf");

    /* a tensor in two parts (the total still matches) */
    gguf_writer *w;
    const int64_t ne[1] = { 32 };
    for (int part = 0; part < 2; part++) {
        CHECK(w = gguf_writer_new());
        gguf_value v16 = { .type = GGUF_UINT16, .v.u = (uint64_t)part };
        CHECK_OK(gguf_writer_set_value(w, "split.no", &v16));
        v16.v.u = 2;
        CHECK_OK(gguf_writer_set_value(w, "split.count", &v16));
        CHECK_OK(gguf_writer_set_i32(w, "split.tensors.count", 3));
        CHECK_OK(gguf_writer_add_tensor(w, part ? "b" : "a", TT_F32, 1, ne));
        if (!part)
            CHECK_OK(gguf_writer_add_tensor(w, "b", TT_F32, 1, ne));
        snprintf(p, sizeof p, "%s/dup-%05d-of-00002.gguf", d, part + 1);
        CHECK_OK(gguf_writer_write(w, p, NULL, NULL));
        gguf_writer_free(w);
    }
    snprintf(p, sizeof p, "%s/dup-00001-of-00002.gguf", d);
    gguf_file *g = NULL;
    CHECK_INT(gguf_open(p, &g), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "tensor 'b' is in two parts"));
    CHECK(strstr(rc_errmsg(), "dup-00002-of-00002.gguf"));
    CHECK(g == NULL);
}
