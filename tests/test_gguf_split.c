/* test_gguf_split.c - split GGUF models: a model written as parts and
 * joined again is the same file, byte for byte; parts out of order, one
 * missing or of another model are refused with the file named. */
#include "test.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "tensor/types.h"
#include "model_util.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc(*len ? *len : 1);
    CHECK(p && fread(p, 1, *len, f) == *len);
    fclose(f);
    return p;
}

TEST(gguf_split_and_join)
{
    const char *whole = test_make_model("tiny", TT_Q8_0, NULL);
    gguf_file *f;
    char prefix[600], out[700], parts[3][700];
    snprintf(prefix, sizeof prefix, "%s/m", test_tmpdir());
    CHECK_OK(gguf_open(whole, &f));
    CHECK_OK(gguf_split_write(f, 3, prefix));
    uint64_t n_tensors = f->n_tensors;
    gguf_close(f);
    const char *paths[3];
    uint64_t seen = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(parts[i], sizeof parts[i], "%s-%05d-of-00003.gguf", prefix, i + 1);
        paths[i] = parts[i];
        gguf_file *p;
        uint32_t no, count, total;
        CHECK_OK(gguf__open_one(parts[i], false, &p));
        CHECK_OK(gguf_get_u32(p, "split.no", &no));
        CHECK_OK(gguf_get_u32(p, "split.count", &count));
        CHECK_OK(gguf_get_u32(p, "split.tensors.count", &total));
        CHECK_INT(no, ==, i);
        CHECK_INT(count, ==, 3);
        CHECK_INT(total, ==, n_tensors);
        CHECK_INT(p->n_tensors, >, 0);
        CHECK((gguf_get(p, "general.architecture") != NULL) == (i == 0));
        seen += p->n_tensors;
        gguf_close(p);
    }
    CHECK_INT(seen, ==, n_tensors);
    snprintf(out, sizeof out, "%s/joined.gguf", test_tmpdir());
    CHECK_OK(gguf_join(paths, 3, out));
    size_t a_len, b_len;
    char *a = read_all(whole, &a_len), *b = read_all(out, &b_len);
    CHECK_INT(a_len, ==, b_len);
    CHECK(memcmp(a, b, a_len) == 0);
    free(a);
    free(b);

    /* a part read alone (not as a set) is not a model, and says so */
    gguf_file *p1;
    model_hparams hp;
    CHECK_OK(gguf__open_one(parts[0], false, &p1));
    CHECK_INT(model_read_hparams(p1, &hp), ==, RC_EUNSUPPORTED);
    CHECK(strstr(rc_errmsg(), "part 1 of 3 of a split model"));
    CHECK(strstr(rc_errmsg(), "by its first part"));
    gguf_close(p1);

    /* out of order, one missing, one of another split */
    const char *swapped[3] = { parts[1], parts[0], parts[2] };
    CHECK_INT(gguf_join(swapped, 3, out), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "m-00002-of-00003.gguf"));
    CHECK_INT(gguf_join(paths, 2, out), ==, RC_EFORMAT);
    char other[600];
    snprintf(other, sizeof other, "%s/o", test_tmpdir());
    CHECK_OK(gguf_open(whole, &f));
    CHECK_OK(gguf_split_write(f, 2, other));
    gguf_close(f);
    snprintf(other, sizeof other, "%s/o-00002-of-00002.gguf", test_tmpdir());
    const char *mixed[3] = { parts[0], other, parts[2] };
    CHECK_INT(gguf_join(mixed, 3, out), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "o-00002-of-00002.gguf"));
    /* a whole model is not a part */
    const char *plain[1] = { whole };
    CHECK_INT(gguf_join(plain, 1, out), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "not a part of a split model"));
}
