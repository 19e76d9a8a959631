/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Parses the input; on success walks everything the parse produced: every
 * key through each typed getter and, for arrays, every element (nested ones
 * included), every tensor through gguf_find_tensor and every byte of its
 * data, so a wrong bound shows as an AddressSanitizer report.  A second
 * round makes every allocation fail in turn for small inputs, to check the
 * cleanup paths.  The seed corpus is fuzz/corpus/gguf (written by the test
 * gguf_write_fuzz_seeds).
 */
#include "base/err.h"
#include "base/mem.h"
#include "model/gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void walk_value(const gguf_value *v, int depth)
{
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        abort();
    if (v->type == GGUF_STRING) {
        for (uint64_t i = 0; i < v->v.s.len; i++)
            sink += (uint8_t)v->v.s.ptr[i];
        return;
    }
    if (v->type != GGUF_ARRAY)
        return;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        int64_t x;
        double d;
        if (v->v.arr.items) {
            walk_value(&v->v.arr.items[i], depth + 1);
            if (v->v.arr.items[i].type != v->v.arr.elem_type)
                abort();
        } else if (gguf_arr_i64(v, i, &x) == 0) {
            sink += (uint64_t)x;
        } else if (gguf_arr_f64(v, i, &d) == 0) {
            sink += (uint64_t)(d == d);
        } else if (v->v.arr.elem_type != GGUF_BOOL) {
            abort();     /* a scalar array element every getter refuses */
        }
    }
    int64_t x;
    (void)gguf_arr_i64(v, v->v.arr.n, &x);     /* one past the end: refused */
}

static void walk(const gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const char *key = f->kv[i].key;
        uint32_t u32, et;
        uint64_t u64, n;
        int32_t i32;
        float f32;
        bool b;
        gguf_str s;
        if (gguf_get(f, key) != &f->kv[i].value)
            abort();     /* keys are unique, so look-up finds this one */
        sink += (uint64_t)gguf_get_u32(f, key, &u32) + (uint64_t)gguf_get_u64(f, key, &u64) +
                (uint64_t)gguf_get_i32(f, key, &i32) + (uint64_t)gguf_get_f32(f, key, &f32) +
                (uint64_t)gguf_get_bool(f, key, &b) + (uint64_t)gguf_get_str(f, key, &s) +
                (uint64_t)gguf_get_arr(f, key, &et, &n);
        walk_value(&f->kv[i].value, 0);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t)
            abort();
        if (t->file_offset + t->size_bytes > f->size_bytes || t->offset % f->alignment)
            abort();
        for (uint64_t j = 0; j < t->size_bytes; j++)
            sink += ((const uint8_t *)t->data)[j];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    int rc = gguf_parse(data, size, "fuzz.gguf", &f);
    if (rc == 0) {
        walk(f);
        gguf_close(f);
    } else if (f != NULL || !strstr(rc_errmsg(), "fuzz.gguf: at byte ")) {
        abort();     /* failures leave no file and always say where */
    }

    /* Allocation failures, for inputs small enough to afford the rounds. */
    if (size <= 2048) {
        for (long n = 0; n < 64; n++) {
            rc_mem_fail_after(n);
            int rc2 = gguf_parse(data, size, "fuzz.gguf", &f);
            rc_mem_fail_after(-1);
            gguf_close(f);
            f = NULL;
            if (rc2 == rc)
                break;
            if (rc2 != RC_ENOMEM)
                abort();
        }
    }
    return 0;
}
