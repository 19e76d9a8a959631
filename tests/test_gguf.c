/* test_gguf.c - the GGUF reader and writer.
 *
 * A "sample" file holds every value type (scalars, strings, arrays of every
 * scalar type, string arrays, nested arrays) and tensors of several types
 * and shapes (one empty).  It is written, read back and compared value by
 * value and byte by byte, as v3 and patched to v2, at several alignments.
 * Malformed files are built byte by byte from a table; each must fail with
 * its code and a message naming the file, the byte and the problem.  Every
 * truncation of the sample must fail cleanly, also flush against guard pages;
 * every allocation failure must give RC_ENOMEM (leaks show in the sanitizer
 * build).  gguf_write_fuzz_seeds writes the fuzzer's seed corpus when
 * RACIMO_WRITE_FUZZ_SEEDS names a directory.
 */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "model/gguf.h"
#include "tensor/types.h"

#include <fcntl.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The runner ends each test with _exit, which skips LeakSanitizer's check
 * at exit; so every test here asks for it explicitly (the weak reference is
 * NULL, and the check a no-op, without the sanitizer). */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void check_no_leaks(void)
{
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check())
        FAIL("memory leaked: see the LeakSanitizer report above");
}

/* ---- the sample file ---- */

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
} tensor_desc;

static const tensor_desc sample_tensors[] = {
    { "token_embd.weight", TT_F32, 2, { 8, 3, 1, 1 } },
    { "norm", TT_F32, 1, { 5, 1, 1, 1 } },
    { "empty", TT_F32, 2, { 0, 4, 1, 1 } },
    { "half", TT_F16, 3, { 4, 2, 2, 1 } },
    { "blk.0.q8", TT_Q8_0, 2, { 64, 2, 1, 1 } },
    { "four_d", TT_F32, 4, { 1, 2, 1, 3 } },
    { "blk.0.q4k", TT_Q4_K, 2, { 256, 1, 1, 1 } },
};
#define N_SAMPLE_TENSORS (sizeof sample_tensors / sizeof sample_tensors[0])

/* Scalars: one per value type, at awkward values (extremes, negatives). */
typedef struct {
    const char *key;
    uint32_t type;
    uint64_t u;      /* unsigned types and bool */
    int64_t  i;      /* signed types */
    double   f;      /* float types */
} scalar_desc;

static const scalar_desc sample_scalars[] = {
    { "t.u8", GGUF_UINT8, .u = 200 },
    { "t.i8", GGUF_INT8, .i = -100 },
    { "t.u16", GGUF_UINT16, .u = 65535 },
    { "t.i16", GGUF_INT16, .i = -32768 },
    { "t.u32", GGUF_UINT32, .u = 4000000000u },
    { "t.i32", GGUF_INT32, .i = -2000000000 },
    { "t.f32", GGUF_FLOAT32, .f = 0.15625 },
    { "t.bool", GGUF_BOOL, .u = 1 },
    { "t.bool_false", GGUF_BOOL, .u = 0 },
    { "t.u64", GGUF_UINT64, .u = 0xfedcba9876543210ull },
    { "t.i64", GGUF_INT64, .i = INT64_MIN + 5 },
    { "t.f64", GGUF_FLOAT64, .f = -1.0 / 3.0 },
    { "t.f64_big", GGUF_FLOAT64, .f = 1e300 },
    { "t.small_u64", GGUF_UINT64, .u = 7 },
    { "t.neg_i32", GGUF_INT32, .i = -1 },
};

static const struct { const char *key, *value; } sample_strings[] = {
    { "t.str", "hello, gguf" },
    { "t.empty", "" },
    { "t.utf8", "\xc3\xb1" "and" "\xc3\xba \xf0\x9f\x90\xa6" },
};

/* Arrays of every scalar type: three elements each, as doubles (all exact). */
static const struct { uint32_t type; double v[3]; } sample_arrays[] = {
    { GGUF_UINT8, { 0, 1, 255 } },
    { GGUF_INT8, { -128, 0, 127 } },
    { GGUF_UINT16, { 1, 65535, 300 } },
    { GGUF_INT16, { -32768, 32767, -2 } },
    { GGUF_UINT32, { 4294967295.0, 0, 12345 } },
    { GGUF_INT32, { -2147483648.0, 2147483647.0, -7 } },
    { GGUF_FLOAT32, { 0.5, -1.25, 0x1p100 } },
    { GGUF_BOOL, { 1, 0, 1 } },
    { GGUF_UINT64, { 18446744073709549568.0, 0, 1 } },
    { GGUF_INT64, { -9223372036854775808.0, 4611686018427387904.0, -3 } },
    { GGUF_FLOAT64, { 1e-300, -2.5, 1e300 } },
};
#define N_SAMPLE_ARRAYS (sizeof sample_arrays / sizeof sample_arrays[0])

static const char *const sample_str_arr[] = { "a", "", "ccc", "\xe2\x96\x81the" };
static const int32_t sample_i32_arr[] = { 1, -2, 3, INT32_MIN };
static const float sample_f32_arr[] = { 0.5f, -1.25f, 3e10f };

static uint8_t pattern(uint64_t tensor, uint64_t byte)
{
    return (uint8_t)(tensor * 37 + byte * 13 + 1);
}

static int fill_pattern(void *ctx, uint64_t index, void *dst, uint64_t size)
{
    (void)ctx;
    for (uint64_t j = 0; j < size; j++)
        ((uint8_t *)dst)[j] = pattern(index, j);
    return 0;
}

static unsigned scalar_size(uint32_t type)
{
    static const unsigned size[GGUF_VTYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    return size[type];
}

/* Encodes `v` as a little-endian scalar of `type` at p. */
static void encode(uint8_t *p, uint32_t type, double v)
{
    uint64_t bits = 0;
    if (type == GGUF_FLOAT32) {
        float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, 4);
        bits = b;
    } else if (type == GGUF_FLOAT64) {
        memcpy(&bits, &v, 8);
    } else if (v < 0) {
        bits = (uint64_t)(int64_t)v;
    } else {
        bits = (uint64_t)v;
    }
    for (unsigned b = 0; b < scalar_size(type); b++)
        p[b] = (uint8_t)(bits >> (8 * b));
}

static int set_scalar(gguf_writer *w, const scalar_desc *s)
{
    gguf_value v = { .type = s->type };
    switch (s->type) {
    case GGUF_UINT8:   return gguf_writer_set_u8(w, s->key, (uint8_t)s->u);
    case GGUF_UINT32:  return gguf_writer_set_u32(w, s->key, (uint32_t)s->u);
    case GGUF_INT32:   return gguf_writer_set_i32(w, s->key, (int32_t)s->i);
    case GGUF_UINT64:  return gguf_writer_set_u64(w, s->key, s->u);
    case GGUF_FLOAT32: return gguf_writer_set_f32(w, s->key, (float)s->f);
    case GGUF_BOOL:    return gguf_writer_set_bool(w, s->key, s->u != 0);
    case GGUF_INT8: case GGUF_INT16: case GGUF_INT64: v.v.i = s->i; break;
    case GGUF_FLOAT64: v.v.f = s->f; break;
    default: v.v.u = s->u; break;
    }
    return gguf_writer_set_value(w, s->key, &v);
}

/* Nested arrays: t.nested = [[1, 2, 3], [], [4]] of uint32 and
 * t.nested_str = [[["x", "y"]], [["z"]]]. */
static int set_nested(gguf_writer *w)
{
    uint8_t raw0[12], raw2[4];
    for (int i = 0; i < 3; i++)
        encode(raw0 + 4 * i, GGUF_UINT32, i + 1);
    encode(raw2, GGUF_UINT32, 4);
    gguf_value inner[3] = {
        { .type = GGUF_ARRAY, .v.arr = { GGUF_UINT32, 3, raw0, NULL } },
        { .type = GGUF_ARRAY, .v.arr = { GGUF_UINT32, 0, NULL, NULL } },
        { .type = GGUF_ARRAY, .v.arr = { GGUF_UINT32, 1, raw2, NULL } },
    };
    gguf_value nested = { .type = GGUF_ARRAY, .v.arr = { GGUF_ARRAY, 3, NULL, inner } };
    int rc = gguf_writer_set_value(w, "t.nested", &nested);
    if (rc)
        return rc;

    gguf_value s[3] = {
        { .type = GGUF_STRING, .v.s = { "x", 1 } },
        { .type = GGUF_STRING, .v.s = { "y", 1 } },
        { .type = GGUF_STRING, .v.s = { "z", 1 } },
    };
    gguf_value l2[2] = {
        { .type = GGUF_ARRAY, .v.arr = { GGUF_STRING, 2, NULL, &s[0] } },
        { .type = GGUF_ARRAY, .v.arr = { GGUF_STRING, 1, NULL, &s[2] } },
    };
    gguf_value l1[2] = {
        { .type = GGUF_ARRAY, .v.arr = { GGUF_ARRAY, 1, NULL, &l2[0] } },
        { .type = GGUF_ARRAY, .v.arr = { GGUF_ARRAY, 1, NULL, &l2[1] } },
    };
    gguf_value top = { .type = GGUF_ARRAY, .v.arr = { GGUF_ARRAY, 2, NULL, l1 } };
    return gguf_writer_set_value(w, "t.nested_str", &top);
}

/* Builds the sample writer; alignment 0 leaves general.alignment unset.
 * Returns the first failure (the writer is freed then). */
static int build_sample(uint32_t alignment, gguf_writer **out)
{
    gguf_writer *w = gguf_writer_new();
    int rc = 0;
    *out = NULL;
    if (!w)
        return RC_ENOMEM;
    for (size_t i = 0; i < sizeof sample_scalars / sizeof sample_scalars[0] && !rc; i++)
        rc = set_scalar(w, &sample_scalars[i]);
    for (size_t i = 0; i < sizeof sample_strings / sizeof sample_strings[0] && !rc; i++)
        rc = gguf_writer_set_str(w, sample_strings[i].key, sample_strings[i].value);
    if (!rc && alignment)
        rc = gguf_writer_set_u32(w, "general.alignment", alignment);
    for (size_t a = 0; a < N_SAMPLE_ARRAYS && !rc; a++) {
        uint8_t raw[3 * 8];
        char key[64];
        uint32_t t = sample_arrays[a].type;
        for (int k = 0; k < 3; k++)
            encode(raw + k * scalar_size(t), t, sample_arrays[a].v[k]);
        snprintf(key, sizeof key, "t.arr.%s", gguf_vtype_name(t));
        gguf_value v = { .type = GGUF_ARRAY, .v.arr = { t, 3, raw, NULL } };
        rc = gguf_writer_set_value(w, key, &v);
    }
    if (!rc)
        rc = gguf_writer_set_arr_str(w, "t.arr_str", sample_str_arr, 4);
    if (!rc)
        rc = gguf_writer_set_arr_str(w, "t.arr_str_empty", NULL, 0);
    if (!rc)
        rc = gguf_writer_set_arr_i32(w, "t.arr_i32", sample_i32_arr, 4);
    if (!rc)
        rc = gguf_writer_set_arr_f32(w, "t.arr_f32", sample_f32_arr, 3);
    if (!rc)
        rc = gguf_writer_set_arr_i32(w, "t.arr_empty", NULL, 0);
    if (!rc)
        rc = set_nested(w);
    for (size_t i = 0; i < N_SAMPLE_TENSORS && !rc; i++)
        rc = gguf_writer_add_tensor(w, sample_tensors[i].name, sample_tensors[i].type,
                                    sample_tensors[i].n_dims, sample_tensors[i].ne);
    if (rc) {
        gguf_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static void sample_bytes(uint32_t alignment, uint8_t **buf, size_t *size)
{
    gguf_writer *w;
    CHECK_OK(build_sample(alignment, &w));
    CHECK_OK(gguf_writer_write_mem(w, fill_pattern, NULL, buf, size));
    gguf_writer_free(w);
}

static uint64_t expected_bytes(const tensor_desc *t)
{
    uint64_t n = tensor_row_bytes((int)t->type, t->ne[0]);
    for (int d = 1; d < 4; d++)
        n *= (uint64_t)t->ne[d];
    return n;
}

/* Checks every value and tensor of the sample in f. */
static void check_sample(const gguf_file *f, uint64_t alignment)
{
    size_t n_kv = sizeof sample_scalars / sizeof sample_scalars[0] +
                  sizeof sample_strings / sizeof sample_strings[0] + N_SAMPLE_ARRAYS + 7 +
                  (alignment != GGUF_DEFAULT_ALIGNMENT);
    CHECK_INT(f->n_kv, ==, n_kv);
    CHECK_INT(f->alignment, ==, alignment);
    CHECK_STR(f->kv[0].key, "t.u8");    /* insertion order */

    for (size_t i = 0; i < sizeof sample_scalars / sizeof sample_scalars[0]; i++) {
        const scalar_desc *s = &sample_scalars[i];
        const gguf_value *v = gguf_get(f, s->key);
        if (!v)
            FAIL("key %s missing", s->key);
        CHECK_INT(v->type, ==, s->type);
        switch (s->type) {
        case GGUF_INT8: case GGUF_INT16: case GGUF_INT32: case GGUF_INT64:
            CHECK_INT(v->v.i, ==, s->i);
            break;
        case GGUF_FLOAT32: case GGUF_FLOAT64:
            CHECK(v->v.f == s->f);
            break;
        default:
            CHECK(v->v.u == s->u);
        }
    }
    for (size_t i = 0; i < sizeof sample_strings / sizeof sample_strings[0]; i++) {
        gguf_str s;
        CHECK_OK(gguf_get_str(f, sample_strings[i].key, &s));
        CHECK_INT(s.len, ==, strlen(sample_strings[i].value));
        CHECK(s.len == 0 || !memcmp(s.ptr, sample_strings[i].value, s.len));
    }
    for (size_t a = 0; a < N_SAMPLE_ARRAYS; a++) {
        char key[64];
        uint32_t et;
        uint64_t n;
        snprintf(key, sizeof key, "t.arr.%s", gguf_vtype_name(sample_arrays[a].type));
        CHECK_OK(gguf_get_arr(f, key, &et, &n));
        CHECK_INT(et, ==, sample_arrays[a].type);
        CHECK_INT(n, ==, 3);
        const gguf_value *v = gguf_get(f, key);
        if (et == GGUF_BOOL) {      /* bools are not numbers to the getters */
            const uint8_t *raw = v->v.arr.raw;
            CHECK(raw[0] == 1 && raw[1] == 0 && raw[2] == 1);
            continue;
        }
        for (uint64_t k = 0; k < 3; k++) {
            double d;
            CHECK_OK(gguf_arr_f64(v, k, &d));
            if (d != sample_arrays[a].v[k])
                FAIL("%s[%llu] = %.17g, expected %.17g", key, (unsigned long long)k, d,
                     sample_arrays[a].v[k]);
        }
    }

    const gguf_value *v = gguf_get(f, "t.arr_str");
    CHECK(v && v->type == GGUF_ARRAY && v->v.arr.elem_type == GGUF_STRING);
    CHECK_INT(v->v.arr.n, ==, 4);
    for (int k = 0; k < 4; k++) {
        const gguf_value *it = &v->v.arr.items[k];
        CHECK_INT(it->type, ==, GGUF_STRING);
        CHECK_INT(it->v.s.len, ==, strlen(sample_str_arr[k]));
        CHECK(!it->v.s.len || !memcmp(it->v.s.ptr, sample_str_arr[k], it->v.s.len));
    }
    v = gguf_get(f, "t.arr_str_empty");
    CHECK(v && v->type == GGUF_ARRAY && v->v.arr.elem_type == GGUF_STRING && v->v.arr.n == 0);
    v = gguf_get(f, "t.arr_i32");
    for (int k = 0; k < 4; k++) {
        int64_t x;
        CHECK_OK(gguf_arr_i64(v, (uint64_t)k, &x));
        CHECK_INT(x, ==, sample_i32_arr[k]);
    }
    v = gguf_get(f, "t.arr_f32");
    for (int k = 0; k < 3; k++) {
        double x;
        CHECK_OK(gguf_arr_f64(v, (uint64_t)k, &x));
        CHECK(x == sample_f32_arr[k]);
    }
    v = gguf_get(f, "t.arr_empty");
    CHECK(v && v->type == GGUF_ARRAY && v->v.arr.elem_type == GGUF_INT32 && v->v.arr.n == 0);

    v = gguf_get(f, "t.nested");
    CHECK(v && v->type == GGUF_ARRAY && v->v.arr.elem_type == GGUF_ARRAY);
    CHECK_INT(v->v.arr.n, ==, 3);
    static const int64_t nested_n[3] = { 3, 0, 1 }, nested_v[3][3] = { { 1, 2, 3 }, { 0 }, { 4 } };
    for (int k = 0; k < 3; k++) {
        const gguf_value *in = &v->v.arr.items[k];
        CHECK(in->type == GGUF_ARRAY && in->v.arr.elem_type == GGUF_UINT32);
        CHECK_INT(in->v.arr.n, ==, nested_n[k]);
        for (int j = 0; j < nested_n[k]; j++) {
            int64_t x;
            CHECK_OK(gguf_arr_i64(in, (uint64_t)j, &x));
            CHECK_INT(x, ==, nested_v[k][j]);
        }
    }
    v = gguf_get(f, "t.nested_str");
    CHECK(v && v->type == GGUF_ARRAY && v->v.arr.elem_type == GGUF_ARRAY && v->v.arr.n == 2);
    const gguf_value *l2a = &v->v.arr.items[0].v.arr.items[0];
    const gguf_value *l2b = &v->v.arr.items[1].v.arr.items[0];
    CHECK(v->v.arr.items[0].v.arr.elem_type == GGUF_ARRAY && v->v.arr.items[0].v.arr.n == 1);
    CHECK(l2a->type == GGUF_ARRAY && l2a->v.arr.elem_type == GGUF_STRING && l2a->v.arr.n == 2);
    CHECK(l2a->v.arr.items[1].v.s.len == 1 && l2a->v.arr.items[1].v.s.ptr[0] == 'y');
    CHECK(l2b->v.arr.n == 1 && l2b->v.arr.items[0].v.s.ptr[0] == 'z');

    /* Tensors: shapes, types, aligned offsets, sizes, every data byte. */
    CHECK_INT(f->n_tensors, ==, N_SAMPLE_TENSORS);
    CHECK_INT(f->data_offset % alignment, ==, 0);
    uint64_t end = 0;
    for (size_t i = 0; i < N_SAMPLE_TENSORS; i++) {
        const tensor_desc *d = &sample_tensors[i];
        const gguf_tensor *t = gguf_find_tensor(f, d->name);
        CHECK(t == &f->tensors[i]);
        CHECK_STR(t->name, d->name);
        CHECK_INT(t->n_dims, ==, d->n_dims);
        for (int k = 0; k < 4; k++)
            CHECK_INT(t->ne[k], ==, d->ne[k]);
        CHECK_INT(t->type, ==, d->type);
        CHECK_INT(t->size_bytes, ==, expected_bytes(d));
        CHECK_INT(t->offset % alignment, ==, 0);
        CHECK_INT(t->offset, >=, end);
        CHECK_INT(t->offset - end, <, alignment);    /* only padding between */
        end = t->offset + t->size_bytes;
        CHECK_INT(t->file_offset, ==, f->data_offset + t->offset);
        CHECK(t->data == f->base + t->file_offset);
        for (uint64_t j = 0; j < t->size_bytes; j++)
            if (((const uint8_t *)t->data)[j] != pattern(i, j))
                FAIL("tensor %s byte %llu", d->name, (unsigned long long)j);
    }
    CHECK_INT(f->data_offset + end, ==, f->size_bytes);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_get(f, "nope") == NULL);
}

/* Parses a heap copy of exactly n bytes (so ASan sees any over-read),
 * closes, and returns the code. */
static int parse_exact(const uint8_t *p, size_t n, const char *name)
{
    uint8_t *copy = malloc(n ? n : 1);
    gguf_file *f = NULL;
    CHECK(copy != NULL);
    if (n)
        memcpy(copy, p, n);
    int rc = gguf_parse(copy, n, name, &f);
    if (rc == 0)
        CHECK(f != NULL);
    else
        CHECK(f == NULL);
    gguf_close(f);
    free(copy);
    return rc;
}

static void check_msg(const char *name, const char *phrase)
{
    char want[256];
    const char *m = rc_errmsg();
    snprintf(want, sizeof want, "%s: at byte ", name);
    if (!strstr(m, want))
        FAIL("message \"%s\" lacks \"%s\"", m, want);
    if (phrase && !strstr(m, phrase))
        FAIL("message \"%s\" lacks \"%s\"", m, phrase);
}

/* ---- round trips ---- */

TEST(gguf_round_trip)
{
    static const uint32_t alignments[] = { 0, 1, 8, 64, 256, 4096 };
    for (size_t a = 0; a < sizeof alignments / sizeof alignments[0]; a++) {
        uint8_t *buf;
        size_t size;
        gguf_file *f;
        uint64_t align = alignments[a] ? alignments[a] : GGUF_DEFAULT_ALIGNMENT;
        sample_bytes(alignments[a], &buf, &size);
        CHECK_OK(gguf_parse(buf, size, "sample.gguf", &f));
        CHECK_INT(f->version, ==, 3);
        CHECK_STR(f->path, "sample.gguf");
        CHECK(f->map_handle == NULL);
        check_sample(f, align);

        /* Writing what was read gives the same bytes. */
        gguf_writer *w = gguf_writer_new();
        CHECK(w != NULL);
        for (uint64_t i = 0; i < f->n_kv; i++)
            CHECK_OK(gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].value));
        for (uint64_t i = 0; i < f->n_tensors; i++)
            CHECK_OK(gguf_writer_add_tensor(w, f->tensors[i].name, f->tensors[i].type,
                                            f->tensors[i].n_dims, f->tensors[i].ne));
        uint8_t *again;
        size_t again_size;
        CHECK_OK(gguf_writer_write_mem(w, fill_pattern, NULL, &again, &again_size));
        CHECK_INT(again_size, ==, size);
        CHECK(!memcmp(again, buf, size));
        rc_free(again);
        gguf_writer_free(w);
        gguf_close(f);

        /* Version 2 has the same little-endian layout: patch and reread. */
        buf[4] = 2;
        CHECK_OK(gguf_parse(buf, size, "sample-v2.gguf", &f));
        CHECK_INT(f->version, ==, 2);
        check_sample(f, align);
        gguf_close(f);
        rc_free(buf);
    }
    check_no_leaks();
}

static int copy_fill(void *ctx, uint64_t index, void *dst, uint64_t size)
{
    (void)index;
    memcpy(dst, ctx, (size_t)size);
    return 0;
}

/* The writer's bytes checked by hand against the specification, so a bug
 * shared by the reader and writer cannot hide. */
TEST(gguf_write_exact_bytes)
{
    static const uint8_t want[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0,
        1, 0, 0, 0, 0, 0, 0, 0,            /* tensor count */
        2, 0, 0, 0, 0, 0, 0, 0,            /* key/value count */
        1, 0, 0, 0, 0, 0, 0, 0, 'a',       /* key "a" */
        4, 0, 0, 0, 7, 0, 0, 0,            /* uint32 7 */
        2, 0, 0, 0, 0, 0, 0, 0, 'b', 'c',  /* key "bc" */
        9, 0, 0, 0, 8, 0, 0, 0,            /* array of string */
        2, 0, 0, 0, 0, 0, 0, 0,
        1, 0, 0, 0, 0, 0, 0, 0, 'x',
        0, 0, 0, 0, 0, 0, 0, 0,            /* "" */
        1, 0, 0, 0, 0, 0, 0, 0, 't',       /* tensor "t" */
        2, 0, 0, 0,                        /* n_dims */
        2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0,                        /* F32 */
        0, 0, 0, 0, 0, 0, 0, 0,            /* offset */
        0, 0, 0,                           /* padding from 125 to 128 */
        0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0,   /* 1.0f, -2.0f */
    };
    static const char *const strs[] = { "x", "" };
    static const int64_t ne[2] = { 2, 1 };
    gguf_writer *w = gguf_writer_new();
    uint8_t *buf;
    size_t size;
    CHECK_INT(sizeof want, ==, 136);
    CHECK_OK(gguf_writer_set_u32(w, "a", 7));
    CHECK_OK(gguf_writer_set_arr_str(w, "bc", strs, 2));
    CHECK_OK(gguf_writer_add_tensor(w, "t", TT_F32, 2, ne));
    CHECK_OK(gguf_writer_write_mem(w, copy_fill, (void *)(want + 128), &buf, &size));
    CHECK_INT(size, ==, sizeof want);
    for (size_t i = 0; i < size; i++)
        if (buf[i] != want[i])
            FAIL("byte %zu: %#x, expected %#x", i, buf[i], want[i]);
    rc_free(buf);
    gguf_writer_free(w);
    check_no_leaks();
}

/* ---- malformed files ---- */

typedef struct { uint8_t p[4096]; size_t n; } bytes;

static void put8(bytes *b, uint8_t x) { b->p[b->n++] = x; }
static void put32(bytes *b, uint32_t x) { for (int i = 0; i < 4; i++) put8(b, (uint8_t)(x >> 8 * i)); }
static void put64(bytes *b, uint64_t x) { for (int i = 0; i < 8; i++) put8(b, (uint8_t)(x >> 8 * i)); }
static void putraw(bytes *b, const void *s, size_t n) { memcpy(b->p + b->n, s, n); b->n += n; }
static void putstr(bytes *b, const char *s) { put64(b, strlen(s)); putraw(b, s, strlen(s)); }

static void header(bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    putraw(b, "GGUF", 4);
    put32(b, version);
    put64(b, n_tensors);
    put64(b, n_kv);
}

/* One key/value pair holding a uint32. */
static void kv_u32(bytes *b, const char *key, uint32_t v)
{
    putstr(b, key);
    put32(b, GGUF_UINT32);
    put32(b, v);
}

typedef struct {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} tinfo;

/* A file of n tensor infos and no pairs, padded to 32, then data_bytes of
 * data. */
static void tensor_file(bytes *b, const tinfo *t, int n, uint64_t data_bytes)
{
    header(b, 3, (uint64_t)n, 0);
    for (int i = 0; i < n; i++) {
        putstr(b, t[i].name);
        put32(b, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            put64(b, t[i].ne[d]);
        put32(b, t[i].type);
        put64(b, t[i].offset);
    }
    while (b->n % 32)
        put8(b, 0);
    for (uint64_t i = 0; i < data_bytes; i++)
        put8(b, 0x55);
}

static void one_tensor(bytes *b, tinfo t, uint64_t data_bytes) { tensor_file(b, &t, 1, data_bytes); }

static void m_empty(bytes *b) { (void)b; }
static void m_short_magic(bytes *b) { putraw(b, "GGU", 3); }
static void m_magic(bytes *b) { header(b, 3, 0, 0); b->p[3] = 'X'; }
static void m_ggml_magic(bytes *b) { header(b, 3, 0, 0); memcpy(b->p, "lmgg", 4); }
static void m_v0(bytes *b) { header(b, 0, 0, 0); }
static void m_v1(bytes *b) { header(b, 1, 0, 0); }
static void m_v4(bytes *b) { header(b, 4, 0, 0); }
static void m_big_endian(bytes *b)
{
    putraw(b, "GGUF", 4);
    put32(b, 0x03000000u);
    put64(b, 1ull << 56);
    put64(b, 0);
}
static void m_header_only(bytes *b) { header(b, 3, 0, 0); }
static void m_short_header(bytes *b) { header(b, 3, 0, 0); b->n = 20; }
static void m_kv_limit(bytes *b) { header(b, 3, 0, 1ull << 40); }
static void m_kv_over_file(bytes *b) { header(b, 3, 0, 1000); kv_u32(b, "a", 1); }
static void m_tensor_limit(bytes *b) { header(b, 3, 1ull << 33, 0); }
static void m_tensor_over_file(bytes *b) { header(b, 3, 3, 0); }
static void m_tensor_over_left(bytes *b)
{
    /* The header's sum check passes; the pairs then eat the room. */
    header(b, 3, 1, 1);
    putstr(b, "k");
    put32(b, GGUF_STRING);
    putstr(b, "a string long enough to leave too little");
}
static void m_key_huge(bytes *b) { header(b, 3, 0, 1); put64(b, 1ull << 62); put32(b, 0); put8(b, 0); }
static void m_key_past_end(bytes *b)
{
    header(b, 3, 0, 1);
    put64(b, 100);
    putraw(b, "abcdefgh", 8);
}
static void m_key_nul(bytes *b)
{
    header(b, 3, 0, 1);
    put64(b, 3);
    putraw(b, "a\0b", 3);
    put32(b, GGUF_UINT8);
    put8(b, 1);
}
static void m_str_huge(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_STRING);
    put64(b, 1ull << 40);
}
static void m_str_past_end(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_STRING);
    put64(b, 5);
    putraw(b, "abcd", 4);
}
static void m_arr_huge(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    put32(b, GGUF_UINT32);
    put64(b, 1ull << 60);
    put32(b, 1);
}
static void m_arr_str_huge(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    put32(b, GGUF_STRING);
    put64(b, (1ull << 61) + 1);    /* times 8 wraps to 8 in 64 bits */
    putstr(b, "x");
}
static void m_arr_arr_huge(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    put32(b, GGUF_ARRAY);
    put64(b, 1000);
    for (int i = 0; i < 10; i++) {
        put32(b, GGUF_UINT8);
        put64(b, 0);
    }
}
static void nested(bytes *b, int levels)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    for (int l = 1; l <= levels; l++) {
        put32(b, l < levels ? GGUF_ARRAY : GGUF_UINT32);
        put64(b, 1);
    }
    put32(b, 42);
}
static void m_nested_8(bytes *b) { nested(b, 8); }
static void m_nested_9(bytes *b) { nested(b, 9); }
static void m_bad_vtype(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, 13);
    put32(b, 0);
}
static void m_bad_elem_type(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    put32(b, 0xffffffffu);
    put64(b, 0);
}
static void m_bad_bool(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_BOOL);
    put8(b, 2);
}
static void m_bad_bool_arr(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "k");
    put32(b, GGUF_ARRAY);
    put32(b, GGUF_BOOL);
    put64(b, 3);
    put8(b, 1), put8(b, 0), put8(b, 7);
}
static void m_dup_key(bytes *b)
{
    header(b, 3, 0, 3);
    kv_u32(b, "a.b", 1);
    kv_u32(b, "c", 2);
    kv_u32(b, "a.b", 3);
}
static void m_align(bytes *b, uint32_t a)
{
    header(b, 3, 0, 1);
    kv_u32(b, "general.alignment", a);
}
static void m_align_0(bytes *b) { m_align(b, 0); }
static void m_align_3(bytes *b) { m_align(b, 3); }
static void m_align_48(bytes *b) { m_align(b, 48); }
static void m_align_1(bytes *b) { m_align(b, 1); }
static void m_align_u64(bytes *b)
{
    header(b, 3, 0, 1);
    putstr(b, "general.alignment");
    put32(b, GGUF_UINT64);
    put64(b, 32);
}
static void m_ndims_0(bytes *b) { one_tensor(b, (tinfo){ "w", 0, { 0 }, TT_F32, 0 }, 0); }
static void m_ndims_5(bytes *b) { one_tensor(b, (tinfo){ "w", 5, { 1, 1, 1, 1, 1 }, TT_F32, 0 }, 4); }
static void m_dim_neg(bytes *b) { one_tensor(b, (tinfo){ "w", 2, { 4, ~0ull }, TT_F32, 0 }, 16); }
static void m_dim_product(bytes *b)
{
    one_tensor(b, (tinfo){ "w", 3, { 1ull << 32, 1ull << 31, 2 }, TT_I8, 0 }, 0);
}
static void m_byte_overflow(bytes *b) { one_tensor(b, (tinfo){ "w", 1, { 1ull << 62 }, TT_F32, 0 }, 0); }
static void m_block(bytes *b) { one_tensor(b, (tinfo){ "w", 2, { 33, 2 }, TT_Q8_0, 0 }, 128); }
static void m_block_k(bytes *b) { one_tensor(b, (tinfo){ "w", 1, { 128 }, TT_Q4_K, 0 }, 256); }
static void m_type_removed(bytes *b) { one_tensor(b, (tinfo){ "weird", 1, { 32 }, 4, 0 }, 64); }
static void m_type_huge(bytes *b) { one_tensor(b, (tinfo){ "weird", 1, { 32 }, 200, 0 }, 64); }
static void m_outside(bytes *b) { one_tensor(b, (tinfo){ "w", 1, { 16 }, TT_F32, 0 }, 32); }
static void m_offset_wrap(bytes *b)
{
    one_tensor(b, (tinfo){ "w", 1, { 16 }, TT_F32, 0xffffffffffffffe0ull }, 64);
}
static void m_misaligned(bytes *b) { one_tensor(b, (tinfo){ "w", 1, { 4 }, TT_F32, 16 }, 64); }
static void m_overlap(bytes *b)
{
    const tinfo t[3] = {
        { "a", 1, { 16 }, TT_F32, 0 },       /* [0, 64) */
        { "c", 1, { 8 }, TT_F32, 128 },      /* [128, 160) */
        { "b", 1, { 16 }, TT_F32, 32 },      /* [32, 96): overlaps a */
    };
    tensor_file(b, t, 3, 160);
}
static void m_same_offset(bytes *b)
{
    const tinfo t[2] = { { "a", 1, { 8 }, TT_F32, 0 }, { "b", 1, { 8 }, TT_F32, 0 } };
    tensor_file(b, t, 2, 32);
}
static void m_empty_inside(bytes *b)
{
    /* An empty tensor inside another shares no byte: fine. */
    const tinfo t[2] = { { "a", 1, { 16 }, TT_F32, 0 }, { "e", 2, { 4, 0 }, TT_F32, 32 } };
    tensor_file(b, t, 2, 64);
}
static void m_dup_tensor(bytes *b)
{
    const tinfo t[3] = {
        { "x", 1, { 8 }, TT_F32, 0 }, { "y", 1, { 8 }, TT_F32, 32 }, { "x", 1, { 8 }, TT_F32, 64 },
    };
    tensor_file(b, t, 3, 96);
}
static void m_tensor_nul(bytes *b)
{
    header(b, 3, 1, 0);
    put64(b, 2);
    putraw(b, "a\0", 2);
    put32(b, 1);
    put64(b, 8);
    put32(b, TT_F32);
    put64(b, 0);
    while (b->n % 32)
        put8(b, 0);
    for (int i = 0; i < 32; i++)
        put8(b, 0);
}
static void m_data_before_padding(bytes *b)
{
    /* Tensor infos end at 57; data_offset is 64 but the file ends at 60. */
    one_tensor(b, (tinfo){ "w", 1, { 0 }, TT_F32, 0 }, 0);
    b->n = 60;
}
static void m_zero_tensor_at_end(bytes *b) { one_tensor(b, (tinfo){ "w", 1, { 0 }, TT_F32, 0 }, 0); }

static const struct {
    const char *what;
    void (*build)(bytes *);
    int code;
    const char *phrase;      /* in the message; NULL for success cases */
} malformed[] = {
    { "empty buffer", m_empty, RC_EFORMAT, "truncated" },
    { "short magic", m_short_magic, RC_EFORMAT, "truncated" },
    { "wrong magic", m_magic, RC_EFORMAT, "not a GGUF file" },
    { "ggml magic", m_ggml_magic, RC_EFORMAT, "not a GGUF file" },
    { "version 0", m_v0, RC_EUNSUPPORTED, "version 0 is not supported" },
    { "version 1", m_v1, RC_EUNSUPPORTED, "version 1 is not supported" },
    { "version 4", m_v4, RC_EUNSUPPORTED, "version 4 is not supported" },
    { "big-endian", m_big_endian, RC_EUNSUPPORTED, "big-endian" },
    { "header only", m_header_only, 0, NULL },
    { "short header", m_short_header, RC_EFORMAT, "truncated" },
    { "absurd kv count", m_kv_limit, RC_ELIMIT, "key/value count 1099511627776 exceeds the limit" },
    { "kv count over file", m_kv_over_file, RC_EFORMAT, "need at least" },
    { "absurd tensor count", m_tensor_limit, RC_ELIMIT, "tensor count 8589934592 exceeds the limit" },
    { "tensor count over file", m_tensor_over_file, RC_EFORMAT, "need at least" },
    { "tensor count over rest", m_tensor_over_left, RC_EFORMAT, "tensor infos need at least" },
    { "huge key length", m_key_huge, RC_ELIMIT, "string length 4611686018427387904 exceeds the limit" },
    { "key past end", m_key_past_end, RC_EFORMAT, "exceeds the 8 bytes remaining" },
    { "key with NUL", m_key_nul, RC_EFORMAT, "key contains a NUL byte" },
    { "huge string length", m_str_huge, RC_ELIMIT, "string length 1099511627776 exceeds the limit" },
    { "string past end", m_str_past_end, RC_EFORMAT, "string length 5 exceeds" },
    { "huge array count", m_arr_huge, RC_EFORMAT, "array count 1152921504606846976" },
    { "huge string array", m_arr_str_huge, RC_EFORMAT, "array count 2305843009213693953" },
    { "huge array of arrays", m_arr_arr_huge, RC_EFORMAT, "array count 1000" },
    { "nested 8 deep", m_nested_8, 0, NULL },
    { "nested 9 deep", m_nested_9, RC_ELIMIT, "nested deeper than 8" },
    { "bad value type", m_bad_vtype, RC_EFORMAT, "value type 13 is not a GGUF value type" },
    { "bad array element type", m_bad_elem_type, RC_EFORMAT, "element type 4294967295" },
    { "bool 2", m_bad_bool, RC_EFORMAT, "bool value 2" },
    { "bool array 7", m_bad_bool_arr, RC_EFORMAT, "bool value 7" },
    { "duplicate key", m_dup_key, RC_EFORMAT, "key 'a.b': duplicate key (first at byte 24)" },
    { "alignment 0", m_align_0, RC_EFORMAT, "alignment 0 is not a nonzero power of two" },
    { "alignment 3", m_align_3, RC_EFORMAT, "alignment 3 is not" },
    { "alignment 48", m_align_48, RC_EFORMAT, "alignment 48 is not" },
    { "alignment 1", m_align_1, 0, NULL },
    { "alignment u64", m_align_u64, RC_EFORMAT, "alignment has type uint64" },
    { "n_dims 0", m_ndims_0, RC_EFORMAT, "tensor 'w': 0 dimensions" },
    { "n_dims 5", m_ndims_5, RC_EFORMAT, "5 dimensions" },
    { "negative dim", m_dim_neg, RC_EFORMAT, "more than INT64_MAX" },
    { "element count overflow", m_dim_product, RC_EFORMAT, "overflows" },
    { "byte size overflow", m_byte_overflow, RC_EFORMAT, "overflows" },
    { "ne0 not block multiple", m_block, RC_EFORMAT, "ne[0] = 33 is not a multiple of the block size 32" },
    { "ne0 not K block multiple", m_block_k, RC_EFORMAT, "block size 256" },
    { "removed tensor type", m_type_removed, RC_EUNSUPPORTED, "tensor 'weird': unknown tensor type 4" },
    { "unknown tensor type", m_type_huge, RC_EUNSUPPORTED, "tensor 'weird': unknown tensor type 200" },
    { "data outside file", m_outside, RC_EFORMAT, "lies outside the file" },
    { "offset wraps", m_offset_wrap, RC_EFORMAT, "lies outside the file" },
    { "misaligned offset", m_misaligned, RC_EFORMAT, "data offset 16 is not aligned to 32" },
    { "overlapping tensors", m_overlap, RC_EFORMAT, "tensor 'b': data [32, 96) overlaps tensor 'a'" },
    { "same offset", m_same_offset, RC_EFORMAT, "overlaps" },
    { "empty tensor inside another", m_empty_inside, 0, NULL },
    { "duplicate tensor name", m_dup_tensor, RC_EFORMAT, "tensor 'x': duplicate tensor name" },
    { "tensor name with NUL", m_tensor_nul, RC_EFORMAT, "tensor name contains a NUL byte" },
    { "file ends before data section", m_data_before_padding, RC_EFORMAT, "outside the file" },
    { "empty tensor at end", m_zero_tensor_at_end, 0, NULL },
};

TEST(gguf_malformed)
{
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        static bytes b;
        memset(&b, 0, sizeof b);
        malformed[i].build(&b);
        rc_errclear();
        int rc = parse_exact(b.p, b.n, "bad.gguf");
        if (rc != malformed[i].code)
            FAIL("%s: got %d (%s), expected %d", malformed[i].what, rc, rc_errmsg(),
                 malformed[i].code);
        if (rc) {
            const char *m = rc_errmsg();
            if (!strstr(m, "bad.gguf: at byte ") || !strstr(m, malformed[i].phrase))
                FAIL("%s: message \"%s\" lacks the file, the byte or \"%s\"",
                     malformed[i].what, m, malformed[i].phrase);
        }
    }
    check_no_leaks();
}

/* ---- truncation, guard pages, allocation failure ---- */

TEST(gguf_truncated_every_byte)
{
    uint8_t *buf;
    size_t size;
    sample_bytes(0, &buf, &size);
    for (size_t n = 0; n < size; n++) {
        int rc = parse_exact(buf, n, "sample.gguf");
        if (rc != RC_EFORMAT)
            FAIL("truncated to %zu of %zu bytes: got %d (%s)", n, size, rc, rc_errmsg());
        check_msg("sample.gguf", NULL);
    }
    CHECK_OK(parse_exact(buf, size, "sample.gguf"));
    rc_free(buf);
    check_no_leaks();
}

/* Every prefix of the sample placed flush against a PROT_NONE page (after
 * it, then before it), so any read outside the buffer faults. */
TEST(gguf_guard_page)
{
    uint8_t *buf;
    size_t size;
    long page = sysconf(_SC_PAGESIZE);
    sample_bytes(0, &buf, &size);
    size_t body = (size + (size_t)page - 1) / (size_t)page * (size_t)page;
    uint8_t *map = mmap(NULL, body + 2 * (size_t)page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    CHECK(mprotect(map, (size_t)page, PROT_NONE) == 0);
    CHECK(mprotect(map + page + body, (size_t)page, PROT_NONE) == 0);
    uint8_t *lo = map + page, *hi = map + page + body;
    for (size_t n = 0; n <= size; n++) {
        gguf_file *f;
        memcpy(hi - n, buf, n);
        int rc = gguf_parse(hi - n, n, "guard.gguf", &f);
        CHECK_INT(rc, ==, n == size ? 0 : RC_EFORMAT);
        if (rc == 0)
            check_sample(f, GGUF_DEFAULT_ALIGNMENT);
        gguf_close(f);
        memcpy(lo, buf, n);
        rc = gguf_parse(lo, n, "guard.gguf", &f);
        CHECK_INT(rc, ==, n == size ? 0 : RC_EFORMAT);
        gguf_close(f);
    }
    munmap(map, body + 2 * (size_t)page);
    rc_free(buf);
    check_no_leaks();
}

TEST(gguf_alloc_failure_parse)
{
    uint8_t *buf;
    size_t size;
    sample_bytes(64, &buf, &size);
    long n;
    for (n = 0; n < 100000; n++) {
        gguf_file *f = NULL;
        rc_mem_fail_after(n);
        int rc = gguf_parse(buf, size, "sample.gguf", &f);
        rc_mem_fail_after(-1);
        if (rc == 0) {
            check_sample(f, 64);
            gguf_close(f);
            break;
        }
        if (rc != RC_ENOMEM)
            FAIL("fail after %ld: got %d (%s)", n, rc, rc_errmsg());
        CHECK(f == NULL);
        check_msg("sample.gguf", "out of memory");
    }
    CHECK_INT(n, >=, 20);      /* keys, names, items, indexes were all tried */
    CHECK_INT(n, <, 100000);
    rc_free(buf);
    check_no_leaks();
}

TEST(gguf_alloc_failure_write)
{
    long n;
    for (n = 0; n < 100000; n++) {
        gguf_writer *w = NULL;
        uint8_t *buf = NULL;
        size_t size;
        rc_mem_fail_after(n);
        int rc = build_sample(64, &w);
        if (rc == 0)
            rc = gguf_writer_write_mem(w, fill_pattern, NULL, &buf, &size);
        rc_mem_fail_after(-1);
        gguf_writer_free(w);
        if (rc == 0) {
            rc_free(buf);
            break;
        }
        if (rc != RC_ENOMEM)
            FAIL("fail after %ld: got %d (%s)", n, rc, rc_errmsg());
    }
    CHECK_INT(n, >=, 50);
    CHECK_INT(n, <, 100000);

    /* The file writer and gguf_open, also under failures. */
    char path[600];
    snprintf(path, sizeof path, "%s/alloc.gguf", test_tmpdir());
    for (n = 0; n < 100000; n++) {
        gguf_writer *w;
        gguf_file *f = NULL;
        CHECK_OK(build_sample(0, &w));
        rc_mem_fail_after(n);
        int rc = gguf_writer_write(w, path, fill_pattern, NULL);
        if (rc == 0)
            rc = gguf_open(path, &f);
        rc_mem_fail_after(-1);
        gguf_writer_free(w);
        if (rc == 0) {
            check_sample(f, GGUF_DEFAULT_ALIGNMENT);
            gguf_close(f);
            break;
        }
        if (rc != RC_ENOMEM)
            FAIL("fail after %ld: got %d (%s)", n, rc, rc_errmsg());
        CHECK(f == NULL);
        unlink(path);
    }
    CHECK_INT(n, <, 100000);
    check_no_leaks();
}

/* ---- files ---- */

static int fail_fill(void *ctx, uint64_t index, void *dst, uint64_t size)
{
    (void)dst, (void)size;
    if (index == *(uint64_t *)ctx)
        return rc_fail(RC_EIO, "source tensor unreadable");
    return 0;
}

TEST(gguf_open_files)
{
    char path[600], tmp[700];
    gguf_file *f = (gguf_file *)1;
    const char *dir = test_tmpdir();

    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    CHECK_INT(gguf_open(path, &f), ==, RC_EIO);
    CHECK(f == NULL);
    CHECK(strstr(rc_errmsg(), path) != NULL);

    CHECK_INT(gguf_open(dir, &f), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), dir) != NULL);

    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0);
    close(fd);
    CHECK_INT(gguf_open(path, &f), ==, RC_EFORMAT);
    check_msg(path, "truncated");

    /* A real file through the temporary name, read back via the mapping. */
    gguf_writer *w;
    CHECK_OK(build_sample(128, &w));
    snprintf(path, sizeof path, "%s/sample.gguf", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK_OK(gguf_writer_write(w, path, fill_pattern, NULL));
    CHECK(access(tmp, F_OK) != 0);
    CHECK_OK(gguf_open(path, &f));
    CHECK(f->map_handle != NULL);
    CHECK_STR(f->path, path);
    check_sample(f, 128);
    gguf_close(f);

    /* A failing fill aborts, removes the temporary file and leaves the old
     * file in place. */
    uint64_t bad = 3;
    CHECK_INT(gguf_writer_write(w, path, fail_fill, &bad), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "half") && strstr(rc_errmsg(), "source tensor unreadable"));
    CHECK(access(tmp, F_OK) != 0);
    CHECK_OK(gguf_open(path, &f));
    check_sample(f, 128);
    gguf_close(f);

    /* Writing into a missing directory. */
    snprintf(path, sizeof path, "%s/no/such/dir/x.gguf", dir);
    CHECK_INT(gguf_writer_write(w, path, fill_pattern, NULL), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "no/such/dir") != NULL);
    gguf_writer_free(w);
    gguf_close(NULL);
    gguf_writer_free(NULL);
    check_no_leaks();
}

/* ---- getters and writer rules ---- */

TEST(gguf_getters)
{
    uint8_t *buf;
    size_t size;
    gguf_file *f;
    sample_bytes(0, &buf, &size);
    CHECK_OK(gguf_parse(buf, size, "g.gguf", &f));

    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f32;
    bool b;
    gguf_str s;
    CHECK_OK(gguf_get_u32(f, "t.u8", &u32));
    CHECK_INT(u32, ==, 200);
    CHECK_OK(gguf_get_u32(f, "t.u32", &u32));
    CHECK_INT(u32, ==, 4000000000u);
    CHECK_OK(gguf_get_u32(f, "t.small_u64", &u32));
    CHECK_INT(u32, ==, 7);
    CHECK_OK(gguf_get_i32(f, "t.i8", &i32));
    CHECK_INT(i32, ==, -100);
    CHECK_OK(gguf_get_i32(f, "t.u16", &i32));
    CHECK_INT(i32, ==, 65535);
    CHECK_OK(gguf_get_u64(f, "t.u64", &u64));
    CHECK(u64 == 0xfedcba9876543210ull);
    CHECK_OK(gguf_get_u64(f, "t.u8", &u64));
    CHECK_INT(u64, ==, 200);
    CHECK_OK(gguf_get_f32(f, "t.f32", &f32));
    CHECK(f32 == 0.15625f);
    CHECK_OK(gguf_get_f32(f, "t.f64", &f32));
    CHECK(f32 == (float)(-1.0 / 3.0));
    CHECK_OK(gguf_get_f32(f, "t.i16", &f32));
    CHECK(f32 == -32768.0f);
    CHECK_OK(gguf_get_bool(f, "t.bool", &b));
    CHECK(b);
    CHECK_OK(gguf_get_bool(f, "t.bool_false", &b));
    CHECK(!b);
    CHECK_OK(gguf_get_str(f, "t.str", &s));
    CHECK(s.len == 11 && !memcmp(s.ptr, "hello, gguf", 11));

    /* Out of range: ERANGE naming the key; *out untouched. */
    static const struct { const char *key; int which; } ranges[] = {
        { "t.neg_i32", 0 }, { "t.u64", 0 }, { "t.i64", 1 }, { "t.u32", 2 },
        { "t.i64", 2 }, { "t.f64_big", 3 },
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        int rc;
        u32 = 99, u64 = 99, i32 = 99, f32 = 99;
        switch (ranges[i].which) {
        case 0: rc = gguf_get_u32(f, ranges[i].key, &u32); break;
        case 1: rc = gguf_get_u64(f, ranges[i].key, &u64); break;
        case 2: rc = gguf_get_i32(f, ranges[i].key, &i32); break;
        default: rc = gguf_get_f32(f, ranges[i].key, &f32); break;
        }
        if (rc != RC_ERANGE)
            FAIL("%s (getter %d): got %d, expected RC_ERANGE", ranges[i].key, ranges[i].which, rc);
        CHECK(strstr(rc_errmsg(), ranges[i].key) && strstr(rc_errmsg(), "g.gguf"));
        CHECK(u32 == 99 && u64 == 99 && i32 == 99 && f32 == 99);
    }

    /* Type mismatches: EFORMAT naming the key and both types. */
    CHECK_INT(gguf_get_u32(f, "t.str", &u32), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "'t.str' has type string"));
    CHECK_INT(gguf_get_u32(f, "t.bool", &u32), ==, RC_EFORMAT);
    CHECK_INT(gguf_get_u32(f, "t.f32", &u32), ==, RC_EFORMAT);
    CHECK_INT(gguf_get_i32(f, "t.arr_i32", &i32), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "'t.arr_i32' has type array"));
    CHECK_INT(gguf_get_f32(f, "t.str", &f32), ==, RC_EFORMAT);
    CHECK_INT(gguf_get_bool(f, "t.u8", &b), ==, RC_EFORMAT);
    CHECK_INT(gguf_get_str(f, "t.u8", &s), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "'t.u8' has type uint8, expected string"));
    uint32_t et;
    uint64_t n;
    CHECK_INT(gguf_get_arr(f, "t.str", &et, &n), ==, RC_EFORMAT);
    CHECK_OK(gguf_get_arr(f, "t.arr_str", &et, &n));
    CHECK(et == GGUF_STRING && n == 4);

    /* Missing keys. */
    CHECK_INT(gguf_get_u32(f, "nope", &u32), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "'nope'"));
    CHECK_INT(gguf_get_str(f, "nope", &s), ==, RC_ENOTFOUND);
    CHECK_INT(gguf_get_arr(f, "nope", &et, &n), ==, RC_ENOTFOUND);

    /* Array elements. */
    int64_t x;
    double d;
    const gguf_value *a = gguf_get(f, "t.arr.uint64");
    CHECK_INT(gguf_arr_i64(a, 0, &x), ==, RC_ERANGE);        /* > INT64_MAX */
    CHECK_OK(gguf_arr_i64(a, 2, &x));
    CHECK_INT(x, ==, 1);
    CHECK_INT(gguf_arr_i64(a, 3, &x), ==, RC_ERANGE);        /* index */
    CHECK_INT(gguf_arr_i64(gguf_get(f, "t.arr_f32"), 0, &x), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_i64(gguf_get(f, "t.arr_str"), 0, &x), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_f64(gguf_get(f, "t.arr_str"), 0, &d), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_f64(gguf_get(f, "t.nested"), 0, &d), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_f64(gguf_get(f, "t.u8"), 0, &d), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_f64(NULL, 0, &d), ==, RC_EFORMAT);
    CHECK_INT(gguf_arr_f64(gguf_get(f, "t.arr.bool"), 0, &d), ==, RC_EFORMAT);
    CHECK_OK(gguf_arr_i64(gguf_get(f, "t.arr.int64"), 0, &x));
    CHECK(x == INT64_MIN);

    CHECK_STR(gguf_vtype_name(GGUF_FLOAT64), "float64");
    CHECK_STR(gguf_vtype_name(99), "unknown type");
    CHECK(gguf_get(NULL, "t.u8") == NULL);
    CHECK(gguf_find_tensor(NULL, "x") == NULL);
    gguf_close(f);
    rc_free(buf);
    check_no_leaks();
}

TEST(gguf_writer_rules)
{
    gguf_writer *w = gguf_writer_new();
    uint8_t *buf;
    size_t size;
    gguf_file *f;
    CHECK(w != NULL);

    /* A key set again keeps its first position with the last value. */
    CHECK_OK(gguf_writer_set_u32(w, "a", 1));
    CHECK_OK(gguf_writer_set_str(w, "b", "x"));
    CHECK_OK(gguf_writer_set_str(w, "a", "replaced"));
    CHECK_OK(gguf_writer_set_u32(w, "c", 3));

    static const int64_t ok[2] = { 64, 2 }, odd[1] = { 33 }, neg[2] = { 32, -1 };
    CHECK_OK(gguf_writer_add_tensor(w, "q", TT_Q8_0, 2, ok));
    CHECK_INT(gguf_writer_add_tensor(w, "q", TT_F32, 1, odd), ==, RC_EINVAL);    /* twice */
    CHECK_INT(gguf_writer_add_tensor(w, "r", TT_Q8_0, 1, odd), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "block size 32"));
    CHECK_INT(gguf_writer_add_tensor(w, "r", TT_F32, 2, neg), ==, RC_EINVAL);
    CHECK_INT(gguf_writer_add_tensor(w, "r", TT_F32, 0, ok), ==, RC_EINVAL);
    CHECK_INT(gguf_writer_add_tensor(w, "r", TT_F32, 5, ok), ==, RC_EINVAL);
    CHECK_INT(gguf_writer_add_tensor(w, "r", 4, 1, ok), ==, RC_EINVAL);
    CHECK_INT(gguf_writer_add_tensor(w, "r", TT_COUNT + 5, 1, ok), ==, RC_EINVAL);

    gguf_value bad = { .type = GGUF_VTYPE_COUNT };
    CHECK_INT(gguf_writer_set_value(w, "bad", &bad), ==, RC_EINVAL);
    gguf_value items[1] = { { .type = GGUF_UINT8 } };
    gguf_value mixed = { .type = GGUF_ARRAY, .v.arr = { GGUF_STRING, 1, NULL, items } };
    CHECK_INT(gguf_writer_set_value(w, "bad", &mixed), ==, RC_EINVAL);
    gguf_value noraw = { .type = GGUF_ARRAY, .v.arr = { GGUF_UINT32, 2, NULL, NULL } };
    CHECK_INT(gguf_writer_set_value(w, "bad", &noraw), ==, RC_EINVAL);
    CHECK_INT(gguf_writer_set_str(w, "bad", NULL), ==, RC_EINVAL);

    CHECK_OK(gguf_writer_write_mem(w, fill_pattern, NULL, &buf, &size));
    CHECK_OK(gguf_parse(buf, size, "rules.gguf", &f));
    CHECK_INT(f->n_kv, ==, 3);
    CHECK_STR(f->kv[0].key, "a");
    CHECK_STR(f->kv[1].key, "b");
    CHECK_STR(f->kv[2].key, "c");
    CHECK(f->kv[0].value.type == GGUF_STRING && f->kv[0].value.v.s.len == 8);
    CHECK(gguf_get(f, "bad") == NULL);
    CHECK_INT(f->n_tensors, ==, 1);
    CHECK_INT(f->tensors[0].size_bytes, ==, 4 * 34);
    gguf_close(f);
    rc_free(buf);

    /* Invalid alignments are refused at write time. */
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 48));
    CHECK_INT(gguf_writer_write_mem(w, NULL, NULL, &buf, &size), ==, RC_EINVAL);
    CHECK_OK(gguf_writer_set_u64(w, "general.alignment", 64));
    CHECK_INT(gguf_writer_write_mem(w, NULL, NULL, &buf, &size), ==, RC_EINVAL);
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 1));
    CHECK_OK(gguf_writer_write_mem(w, NULL, NULL, &buf, &size));
    CHECK_OK(gguf_parse(buf, size, "rules.gguf", &f));
    CHECK_INT(f->alignment, ==, 1);
    CHECK_INT(f->data_offset + f->tensors[0].size_bytes, ==, size);
    gguf_close(f);
    rc_free(buf);
    gguf_writer_free(w);

    /* No keys, no tensors: a 24-byte header is a valid file. */
    w = gguf_writer_new();
    CHECK_OK(gguf_writer_write_mem(w, NULL, NULL, &buf, &size));
    CHECK_INT(size, ==, 32);      /* header padded to the data section */
    CHECK_OK(parse_exact(buf, 24, "tiny.gguf"));
    CHECK_OK(parse_exact(buf, size, "tiny.gguf"));
    rc_free(buf);
    gguf_writer_free(w);
    check_no_leaks();
}

/* ---- fuzz seeds ---- */

static void write_seed(const char *dir, const char *name, gguf_writer *w, uint32_t version)
{
    char path[1024];
    uint8_t *buf;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, fill_pattern, NULL, &buf, &size));
    buf[4] = (uint8_t)version;
    CHECK_OK(parse_exact(buf, size, name));
    if (size >= 4096)
        FAIL("seed %s is %zu bytes", name, size);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    CHECK(fwrite(buf, 1, size, fp) == size);
    CHECK(fclose(fp) == 0);
    rc_free(buf);
    gguf_writer_free(w);
}

TEST(gguf_write_fuzz_seeds)
{
    const char *dir = getenv("RACIMO_WRITE_FUZZ_SEEDS");
    if (!dir || !*dir)
        SKIP("set RACIMO_WRITE_FUZZ_SEEDS=dir to write the gguf fuzz corpus");
    gguf_writer *w;

    write_seed(dir, "empty.gguf", gguf_writer_new(), 3);

    w = gguf_writer_new();
    for (size_t i = 0; i < sizeof sample_scalars / sizeof sample_scalars[0]; i++)
        CHECK_OK(set_scalar(w, &sample_scalars[i]));
    write_seed(dir, "scalars.gguf", w, 3);

    w = gguf_writer_new();
    for (size_t i = 0; i < sizeof sample_strings / sizeof sample_strings[0]; i++)
        CHECK_OK(gguf_writer_set_str(w, sample_strings[i].key, sample_strings[i].value));
    CHECK_OK(gguf_writer_set_arr_str(w, "t.arr_str", sample_str_arr, 4));
    CHECK_OK(gguf_writer_set_arr_str(w, "t.arr_str_empty", NULL, 0));
    write_seed(dir, "strings.gguf", w, 3);

    w = gguf_writer_new();
    for (size_t a = 0; a < N_SAMPLE_ARRAYS; a++) {
        uint8_t raw[24];
        char key[64];
        uint32_t t = sample_arrays[a].type;
        for (int k = 0; k < 3; k++)
            encode(raw + k * scalar_size(t), t, sample_arrays[a].v[k]);
        snprintf(key, sizeof key, "t.arr.%s", gguf_vtype_name(t));
        gguf_value v = { .type = GGUF_ARRAY, .v.arr = { t, 3, raw, NULL } };
        CHECK_OK(gguf_writer_set_value(w, key, &v));
    }
    CHECK_OK(set_nested(w));
    write_seed(dir, "arrays.gguf", w, 3);

    w = gguf_writer_new();
    static const int64_t ne_f32[2] = { 4, 3 }, ne_f16[1] = { 8 }, ne_q8[2] = { 32, 2 };
    CHECK_OK(gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK_OK(gguf_writer_add_tensor(w, "a", TT_F32, 2, ne_f32));
    CHECK_OK(gguf_writer_add_tensor(w, "b", TT_F16, 1, ne_f16));
    CHECK_OK(gguf_writer_add_tensor(w, "c", TT_Q8_0, 2, ne_q8));
    write_seed(dir, "tensors.gguf", w, 3);

    w = gguf_writer_new();
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 8));
    CHECK_OK(gguf_writer_add_tensor(w, "a", TT_F32, 2, ne_f32));
    CHECK_OK(gguf_writer_add_tensor(w, "b", TT_F16, 1, ne_f16));
    write_seed(dir, "tensors-align8-v2.gguf", w, 2);

    w = gguf_writer_new();
    static const int64_t ne_k[1] = { 256 }, ne_4d[4] = { 1, 2, 1, 3 }, ne_0[2] = { 0, 4 };
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 16));
    CHECK_OK(gguf_writer_add_tensor(w, "k", TT_Q4_K, 1, ne_k));
    CHECK_OK(gguf_writer_add_tensor(w, "empty", TT_F32, 2, ne_0));
    CHECK_OK(gguf_writer_add_tensor(w, "four_d", TT_F32, 4, ne_4d));
    write_seed(dir, "tensors-kquant.gguf", w, 3);

    w = gguf_writer_new();
    {
        char tok[40][16];
        const char *toks[40];
        float scores[40];
        int32_t types[40];
        for (int i = 0; i < 40; i++) {
            snprintf(tok[i], sizeof tok[i], "t%d", i);
            toks[i] = tok[i];
            scores[i] = -(float)i;
            types[i] = i < 3 ? 3 : 1;
        }
        CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 40));
        CHECK_OK(gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 40));
        CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 40));
        CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    }
    write_seed(dir, "tokenizer.gguf", w, 3);

    w = gguf_writer_new();
    {
        static const int64_t e[1] = { 16 }, m[2] = { 16, 16 }, v[2] = { 16, 40 };
        CHECK_OK(gguf_writer_set_str(w, "general.architecture", "llama"));
        CHECK_OK(gguf_writer_set_u32(w, "llama.context_length", 128));
        CHECK_OK(gguf_writer_set_u32(w, "llama.embedding_length", 16));
        CHECK_OK(gguf_writer_set_u32(w, "llama.block_count", 1));
        CHECK_OK(gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
        CHECK_OK(gguf_writer_add_tensor(w, "token_embd.weight", TT_F16, 2, v));
        CHECK_OK(gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", TT_F32, 1, e));
        CHECK_OK(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", TT_F16, 2, m));
        CHECK_OK(gguf_writer_add_tensor(w, "output_norm.weight", TT_F32, 1, e));
    }
    write_seed(dir, "model.gguf", w, 3);

    /* Deep nesting (8 levels, the limit) */
    {
        static bytes b;
        memset(&b, 0, sizeof b);
        nested(&b, 8);
        char path[1024];
        snprintf(path, sizeof path, "%s/nested8.gguf", dir);
        FILE *fp = fopen(path, "wb");
        CHECK(fp && fwrite(b.p, 1, b.n, fp) == b.n && fclose(fp) == 0);
    }
    check_no_leaks();
}

/* ---- real files ---- */

static int copy_tensor(void *ctx, uint64_t index, void *dst, uint64_t size)
{
    const gguf_file *f = ctx;
    memcpy(dst, f->tensors[index].data, (size_t)size);
    return 0;
}

/* Every GGUF file of the golden data (written by llama.cpp's tools) parses,
 * and writing back what was read reproduces it byte for byte (llama.cpp
 * also pads after the last tensor: that tail must be zeros). */
TEST(gguf_golden_files)
{
    const char *golden = test_golden_dir();
    char cmd[1200], path[1200];
    int n_files = 0;
    if (!golden)
        SKIP("no golden data");
    snprintf(cmd, sizeof cmd, "ls %s/logits/*.gguf 2>/dev/null", golden);
    FILE *ls = popen(cmd, "r");
    CHECK(ls != NULL);
    while (fgets(path, sizeof path, ls)) {
        gguf_file *f;
        gguf_writer *w = gguf_writer_new();
        uint8_t *buf;
        size_t size;
        path[strcspn(path, "\n")] = '\0';
        CHECK_OK(gguf_open(path, &f));
        CHECK(f->n_tensors > 0 && f->n_kv > 0);
        for (uint64_t i = 0; i < f->n_kv; i++)
            CHECK_OK(gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].value));
        for (uint64_t i = 0; i < f->n_tensors; i++)
            CHECK_OK(gguf_writer_add_tensor(w, f->tensors[i].name, f->tensors[i].type,
                                            f->tensors[i].n_dims, f->tensors[i].ne));
        CHECK_OK(gguf_writer_write_mem(w, copy_tensor, f, &buf, &size));
        CHECK_INT(size, <=, f->size_bytes);
        CHECK_INT(f->size_bytes - size, <, f->alignment);
        for (size_t i = 0; i < size; i++)
            if (buf[i] != f->base[i])
                FAIL("%s: byte %zu differs after a round trip", path, i);
        for (uint64_t i = size; i < f->size_bytes; i++)
            CHECK_INT(f->base[i], ==, 0);
        rc_free(buf);
        gguf_writer_free(w);
        gguf_close(f);
        n_files++;
    }
    pclose(ls);
    if (n_files == 0)
        SKIP("no GGUF files in %s/logits", golden);
    check_no_leaks();
}
