/* gguf_split.c - split GGUF models (NAME-00001-of-00003.gguf ...): writing
 * one as parts, and joining the parts back into one file.
 *
 * The layout is the one the llama.cpp tools write: every part is a GGUF
 * file of its own holding a run of the tensors (in order) and the keys
 * split.no (u16, from 0), split.count (u16) and split.tensors.count (i32,
 * all parts together); the first part also holds the model's metadata.
 *
 * The loader reads a set in place (gguf_set.c) and `racimo pull` keeps the
 * parts as published; the joined layout matters for sharing: a node serves
 * a set to its peers as the file gguf_join would write (gguf_joined_view),
 * since the weight transfers and the content digests are over the bytes
 * of one file.
 */
#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KEY_NO      "split.no"
#define KEY_COUNT   "split.count"
#define KEY_TENSORS "split.tensors.count"

static int set_u16(gguf_writer *w, const char *key, uint16_t v)
{
    gguf_value val = { .type = GGUF_UINT16, .v.u = v };
    return gguf_writer_set_value(w, key, &val);
}

static bool is_split_key(const char *key)
{
    return !strncmp(key, "split.", 6);
}

/* Copies tensors [from, to) of the parts' concatenated list. */
typedef struct {
    const gguf_tensor *const *t;   /* the tensors, in write order */
} copy_ctx;

static int copy_fill(void *ctx, uint64_t index, void *dst, uint64_t size_bytes)
{
    const copy_ctx *c = ctx;
    const gguf_tensor *t = c->t[index];
    if (t->size_bytes != size_bytes || !t->data)
        return rc_fail(RC_EFORMAT, "tensor %s: %llu bytes expected, %llu in the part", t->name,
                       (unsigned long long)size_bytes, (unsigned long long)t->size_bytes);
    memcpy(dst, t->data, size_bytes);
    return 0;
}

int gguf_split_write(const gguf_file *f, int n_parts, const char *prefix)
{
    if (n_parts < 1 || n_parts > 99999 || (uint64_t)n_parts > f->n_tensors)
        return rc_fail(RC_EINVAL, "cannot split %llu tensors into %d parts",
                       (unsigned long long)f->n_tensors, n_parts);
    const gguf_tensor **order = rc_mallocarray(f->n_tensors ? f->n_tensors : 1, sizeof *order);
    if (!order)
        return rc_fail(RC_ENOMEM, "out of memory");
    int rc = 0;
    uint64_t first = 0;
    for (int part = 0; part < n_parts && !rc; part++) {
        uint64_t last = f->n_tensors * (uint64_t)(part + 1) / (uint64_t)n_parts;
        gguf_writer *w = gguf_writer_new();
        char path[4096];
        if (!w) {
            rc = rc_fail(RC_ENOMEM, "out of memory");
            break;
        }
        if ((size_t)snprintf(path, sizeof path, "%s-%05d-of-%05d.gguf", prefix, part + 1,
                             n_parts) >= sizeof path)
            rc = rc_fail(RC_EINVAL, "%s: the path is too long", prefix);
        for (uint64_t i = 0; !rc && part == 0 && i < f->n_kv; i++)
            if (!is_split_key(f->kv[i].key))
                rc = gguf_writer_set_value(w, f->kv[i].key, &f->kv[i].value);
        const gguf_value *align = gguf_get(f, "general.alignment");
        if (!rc && part > 0 && align)
            rc = gguf_writer_set_value(w, "general.alignment", align);
        if (!rc)
            rc = set_u16(w, KEY_NO, (uint16_t)part);
        if (!rc)
            rc = set_u16(w, KEY_COUNT, (uint16_t)n_parts);
        if (!rc)
            rc = gguf_writer_set_i32(w, KEY_TENSORS, (int32_t)f->n_tensors);
        for (uint64_t i = first; !rc && i < last; i++) {
            const gguf_tensor *t = &f->tensors[i];
            order[i - first] = t;
            rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        }
        copy_ctx c = { order };
        if (!rc)
            rc = gguf_writer_write(w, path, copy_fill, &c);
        gguf_writer_free(w);
        first = last;
    }
    rc_free(order);
    return rc;
}

int gguf__split_keys(const gguf_file *f, uint32_t *no, uint32_t *count, uint32_t *tensors)
{
    if (gguf_get_u32(f, KEY_NO, no) || gguf_get_u32(f, KEY_COUNT, count) ||
        gguf_get_u32(f, KEY_TENSORS, tensors))
        return rc_fail(RC_EFORMAT, "%s: not a part of a split model (no %s, %s and %s)",
                       f->path, KEY_NO, KEY_COUNT, KEY_TENSORS);
    return 0;
}

/* The joined file's writer: the first part's metadata without the split
 * keys, then tensors t[0..n) in order. */
static int joined_writer(gguf_writer *w, const gguf_file *first, const gguf_tensor *const *t,
                         uint64_t n)
{
    int rc = 0;
    for (uint64_t i = 0; !rc && i < first->n_kv; i++)
        if (!is_split_key(first->kv[i].key))
            rc = gguf_writer_set_value(w, first->kv[i].key, &first->kv[i].value);
    for (uint64_t i = 0; i < n && !rc; i++)
        /* a name used twice (in two parts) is refused here */
        if ((rc = gguf_writer_add_tensor(w, t[i]->name, t[i]->type, t[i]->n_dims, t[i]->ne)))
            rc = rc_wrap(rc, "tensor '%s': ", t[i]->name);
    return rc;
}

int gguf_joined_view(const gguf_file *set, gguf_joined *out)
{
    memset(out, 0, sizeof *out);
    if (!set->n_parts)
        return rc_fail(RC_EINVAL, "%s: not a split model", set->path);
    uint64_t n = set->n_tensors ? set->n_tensors : 1;
    const gguf_tensor **order = rc_mallocarray(n, sizeof *order);
    gguf_writer *w = gguf_writer_new();
    int rc = order && w && (out->offset = rc_mallocarray(n, sizeof *out->offset))
           ? 0 : rc_fail(RC_ENOMEM, "out of memory");
    for (uint64_t i = 0; !rc && i < set->n_tensors; i++)
        order[i] = &set->tensors[i];
    if (!rc)
        rc = joined_writer(w, set->parts[0], order, set->n_tensors);
    if (!rc)
        rc = gguf_writer_head_mem(w, &out->head, &out->head_bytes, out->offset,
                                  &out->size_bytes);
    gguf_writer_free(w);
    rc_free(order);
    if (rc)
        gguf_joined_free(out);
    return rc;
}

void gguf_joined_free(gguf_joined *j)
{
    rc_free(j->head);
    rc_free(j->offset);
    memset(j, 0, sizeof *j);
}

int gguf_join(const char *const *paths, int n, const char *out)
{
    if (n < 1 || n > 99999)
        return rc_fail(RC_EINVAL, "gguf_join: %d parts", n);
    gguf_file **parts = rc_calloc((size_t)n, sizeof *parts);
    const gguf_tensor **order = NULL;
    gguf_writer *w = gguf_writer_new();
    int rc = parts && w ? 0 : rc_fail(RC_ENOMEM, "out of memory");
    uint64_t total = 0;
    uint32_t want_tensors = 0;
    for (int i = 0; i < n && !rc; i++) {
        uint32_t no, count, tensors;
        if ((rc = gguf__open_one(paths[i], false, &parts[i])) ||
            (rc = gguf__split_keys(parts[i], &no, &count, &tensors)))
            break;
        if (no != (uint32_t)i || count != (uint32_t)n || (i && tensors != want_tensors)) {
            rc = rc_fail(RC_EFORMAT, "%s: part %u of %u (of %u tensors) where part %d of %d "
                         "was expected", paths[i], no + 1, count, tensors, i + 1, n);
            break;
        }
        want_tensors = tensors;
        total += parts[i]->n_tensors;
    }
    if (!rc && total != want_tensors)
        rc = rc_fail(RC_EFORMAT, "%s: the parts hold %llu tensors, %u announced", paths[0],
                     (unsigned long long)total, want_tensors);
    if (!rc && !(order = rc_mallocarray(total ? total : 1, sizeof *order)))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    uint64_t k = 0;
    for (int i = 0; i < n && !rc; i++)
        for (uint64_t j = 0; j < parts[i]->n_tensors; j++)
            order[k++] = &parts[i]->tensors[j];
    if (!rc)
        rc = joined_writer(w, parts[0], order, total);
    copy_ctx c = { order };
    if (!rc)
        rc = gguf_writer_write(w, out, copy_fill, &c);
    gguf_writer_free(w);
    rc_free(order);
    for (int i = 0; parts && i < n; i++)
        gguf_close(parts[i]);
    rc_free(parts);
    return rc;
}
