/* gguf_write.c - building GGUF version 3 files.
 *
 * The writer keeps what it is given, owned and in order: key/value pairs
 * (a key set again keeps its first position), then tensor declarations.
 * Writing plans the layout first and then emits it in one pass:
 *
 *   header | key/value pairs | tensor infos | zeros to the alignment
 *   tensor 0 | zeros to the alignment | tensor 1 | ... | tensor n-1 (no tail)
 *
 * Owned values: a STRING owns its bytes (NUL-terminated for convenience),
 * an ARRAY owns `raw` (scalar elements, packed little-endian exactly as in
 * the file) or `items` (n owned values).  A half-copied value is always in a
 * state free_owned can release: items are calloc'd, so unfilled ones are
 * zero (a uint8 with nothing to free).
 *
 * Divisions: owned values; metadata setters; tensors; layout and
 * serialisation; the two outputs (memory, file).
 */
#include "gguf.h"
#include "gguf_internal.h"

#include "base/err.h"
#include "base/mem.h"
#include "tensor/types.h"

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

typedef unsigned long long ull;    /* for printf */

#define MAX_COPY_DEPTH 32

typedef struct {
    char      *key;
    gguf_value value;               /* owned */
} wkv;

typedef struct {
    char    *name;
    uint32_t type, n_dims;
    int64_t  ne[GGUF_MAX_DIMS];     /* unused dims are 1 */
    uint64_t size_bytes;
    uint64_t offset;                /* in the data section; set by plan() */
} wtensor;

struct gguf_writer {
    wkv     *kv;
    size_t   n_kv, cap_kv;
    wtensor *t;
    size_t   n_t, cap_t;
};

/* ---- owned values ---- */

static void free_owned(gguf_value *v)
{
    if (v->type == GGUF_STRING) {
        rc_free((void *)v->v.s.ptr);
    } else if (v->type == GGUF_ARRAY) {
        rc_free((void *)v->v.arr.raw);
        if (v->v.arr.items) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                free_owned(&v->v.arr.items[i]);
            rc_free(v->v.arr.items);
        }
    }
    memset(v, 0, sizeof *v);
}

static int own_string(gguf_value *dst, const char *s, uint64_t len)
{
    char *p;
    dst->type = GGUF_STRING;
    if (len >= SIZE_MAX || !(p = rc_malloc((size_t)len + 1)))
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory for a string of %llu bytes",
                       (ull)len);
    if (len)
        memcpy(p, s, (size_t)len);
    p[len] = '\0';
    dst->v.s.ptr = p;
    dst->v.s.len = len;
    return 0;
}

/* Deep copy of src into dst (which the caller frees with free_owned, also
 * on failure). */
static int copy_value(gguf_value *dst, const gguf_value *src, int depth)
{
    memset(dst, 0, sizeof *dst);
    if (src->type >= GGUF_VTYPE_COUNT)
        return rc_fail(RC_EINVAL, "gguf writer: value type %u is not a GGUF value type",
                       src->type);
    if (gguf__scalar_bytes(src->type)) {
        *dst = *src;
        return 0;
    }
    if (src->type == GGUF_STRING) {
        if (!src->v.s.ptr && src->v.s.len)
            return rc_fail(RC_EINVAL, "gguf writer: string of %llu bytes has no data",
                           (ull)src->v.s.len);
        return own_string(dst, src->v.s.ptr, src->v.s.len);
    }
    uint32_t et = src->v.arr.elem_type;
    uint64_t n = src->v.arr.n;
    if (depth >= MAX_COPY_DEPTH)
        return rc_fail(RC_EINVAL, "gguf writer: arrays nested deeper than %d", MAX_COPY_DEPTH);
    if (et >= GGUF_VTYPE_COUNT)
        return rc_fail(RC_EINVAL, "gguf writer: array element type %u is not a GGUF value type", et);
    dst->type = GGUF_ARRAY;
    dst->v.arr.elem_type = et;
    if (n == 0)
        return 0;
    unsigned size = gguf__scalar_bytes(et);
    if (size) {
        size_t bytes;
        void *raw;
        if (!src->v.arr.raw)
            return rc_fail(RC_EINVAL, "gguf writer: array of %llu elements has no data", (ull)n);
        if (n > SIZE_MAX || rc_mul_size((size_t)n, size, &bytes) || !(raw = rc_malloc(bytes)))
            return rc_fail(RC_ENOMEM, "gguf writer: out of memory for an array of %llu %s",
                           (ull)n, gguf_vtype_name(et));
        memcpy(raw, src->v.arr.raw, bytes);
        dst->v.arr.raw = raw;
        dst->v.arr.n = n;
        return 0;
    }
    if (!src->v.arr.items)
        return rc_fail(RC_EINVAL, "gguf writer: array of %llu elements has no items", (ull)n);
    if (n > SIZE_MAX || !(dst->v.arr.items = rc_calloc((size_t)n, sizeof(gguf_value))))
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory for an array of %llu %s",
                       (ull)n, gguf_vtype_name(et));
    dst->v.arr.n = n;
    for (uint64_t i = 0; i < n; i++) {
        int rc;
        if (src->v.arr.items[i].type != et)
            return rc_fail(RC_EINVAL, "gguf writer: array item %llu has type %s in an array of %s",
                           (ull)i, gguf_vtype_name(src->v.arr.items[i].type),
                           gguf_vtype_name(et));
        if ((rc = copy_value(&dst->v.arr.items[i], &src->v.arr.items[i], depth + 1)))
            return rc;
    }
    return 0;
}

/* ---- metadata setters ---- */

gguf_writer *gguf_writer_new(void)
{
    return rc_calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        rc_free(w->kv[i].key);
        free_owned(&w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_t; i++)
        rc_free(w->t[i].name);
    rc_free(w->kv);
    rc_free(w->t);
    rc_free(w);
}

/* Grows an array of `size`-byte elements to hold one more. */
static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    size_t new_cap, bytes;
    void *q;
    if (n < *cap)
        return 0;
    new_cap = *cap ? *cap * 2 : 16;
    if (rc_mul_size(new_cap, size, &bytes) || !(q = rc_realloc(*p, bytes)))
        return RC_ENOMEM;
    *p = q;
    *cap = new_cap;
    return 0;
}

/* Stores an owned value under `key`; the writer owns *v afterwards, also on
 * failure (it is freed). */
static int put_kv(gguf_writer *w, const char *key, gguf_value *v)
{
    char *k;
    if (!w || !key) {
        free_owned(v);
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer or key");
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            free_owned(&w->kv[i].value);
            w->kv[i].value = *v;
            return 0;
        }
    if (grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv) ||
        !(k = rc_strdup(key))) {
        free_owned(v);
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory adding key '%s'", key);
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].value = *v;
    w->n_kv++;
    return 0;
}

static int set_owned(gguf_writer *w, const char *key, gguf_value v) { return put_kv(w, key, &v); }

int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_UINT8, .v.u = v });
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_UINT32, .v.u = v });
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_INT32, .v.i = v });
}

int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_UINT64, .v.u = v });
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_FLOAT32, .v.f = v });
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    return set_owned(w, key, (gguf_value){ .type = GGUF_BOOL, .v.u = v ? 1 : 0 });
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    gguf_value o = { 0 };
    int rc;
    if (!v)
        return rc_fail(RC_EINVAL, "gguf writer: key '%s': NULL string", key ? key : "(null)");
    if ((rc = own_string(&o, v, strlen(v)))) {
        free_owned(&o);
        return rc;
    }
    return put_kv(w, key, &o);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    gguf_value o = { .type = GGUF_ARRAY };
    int rc = 0;
    o.v.arr.elem_type = GGUF_STRING;
    if (n && !v)
        return rc_fail(RC_EINVAL, "gguf writer: key '%s': NULL array", key ? key : "(null)");
    if (n) {
        if (n > SIZE_MAX || !(o.v.arr.items = rc_calloc((size_t)n, sizeof(gguf_value))))
            return rc_fail(RC_ENOMEM, "gguf writer: out of memory for %llu strings", (ull)n);
        o.v.arr.n = n;
    }
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = v[i] ? own_string(&o.v.arr.items[i], v[i], strlen(v[i]))
                  : rc_fail(RC_EINVAL, "gguf writer: key '%s': string %llu is NULL",
                            key ? key : "(null)", (ull)i);
    if (rc) {
        free_owned(&o);
        return rc;
    }
    return put_kv(w, key, &o);
}

/* An owned scalar array of n 4-byte elements from host words, stored
 * little-endian. */
static int set_arr_u32bits(gguf_writer *w, const char *key, uint32_t et,
                           const void *v, uint64_t n)
{
    gguf_value o = { .type = GGUF_ARRAY };
    uint8_t *raw = NULL;
    size_t bytes;
    o.v.arr.elem_type = et;
    if (n && !v)
        return rc_fail(RC_EINVAL, "gguf writer: key '%s': NULL array", key ? key : "(null)");
    if (n) {
        if (n > SIZE_MAX || rc_mul_size((size_t)n, 4, &bytes) || !(raw = rc_malloc(bytes)))
            return rc_fail(RC_ENOMEM, "gguf writer: out of memory for %llu %s",
                           (ull)n, gguf_vtype_name(et));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x;
            memcpy(&x, (const uint8_t *)v + 4 * i, 4);
            for (int b = 0; b < 4; b++)
                raw[4 * i + (uint64_t)b] = (uint8_t)(x >> (8 * b));
        }
    }
    o.v.arr.raw = raw;
    o.v.arr.n = n;
    return put_kv(w, key, &o);
}

int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return set_arr_u32bits(w, key, GGUF_INT32, v, n);
}

int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return set_arr_u32bits(w, key, GGUF_FLOAT32, v, n);
}

int gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *value)
{
    gguf_value o;
    int rc;
    if (!value)
        return rc_fail(RC_EINVAL, "gguf writer: key '%s': NULL value", key ? key : "(null)");
    if ((rc = copy_value(&o, value, 0))) {
        free_owned(&o);
        return rc_wrap(rc, "key '%s': ", key ? key : "(null)");
    }
    return put_kv(w, key, &o);
}

/* ---- tensors ---- */

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const int64_t *ne)
{
    wtensor t = { .type = type, .n_dims = n_dims };
    if (!w || !name || !ne)
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer, tensor name or dims");
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return rc_fail(RC_EINVAL, "gguf writer: tensor '%s': %u dimensions (must be 1 to %d)",
                       name, n_dims, GGUF_MAX_DIMS);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return rc_fail(RC_EINVAL, "gguf writer: tensor '%s' added twice", name);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 0)
            return rc_fail(RC_EINVAL, "gguf writer: tensor '%s': dimension %u is negative (%lld)",
                           name, d, (long long)ne[d]);
    switch (gguf__tensor_bytes(type, t.ne, &t.size_bytes)) {
    case GGUF__SIZE_OK:
        break;
    case GGUF__SIZE_UNKNOWN_TYPE:
        return rc_fail(RC_EINVAL, "gguf writer: tensor '%s': unknown tensor type %u", name, type);
    case GGUF__SIZE_MEMORY_TYPE:
        return rc_fail(RC_EINVAL, "gguf writer: tensor '%s': type %s is an in-memory layout, "
                       "not a GGUF type", name, tensor_type_name((int)type));
    case GGUF__SIZE_BLOCK:
        return rc_fail(RC_EINVAL,
                       "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the "
                       "block size %lld of type %s", name, (long long)ne[0],
                       (long long)tensor_type_traits((int)type)->block_size,
                       tensor_type_name((int)type));
    default:
        return rc_fail(RC_EINVAL, "gguf writer: tensor '%s': size overflows", name);
    }
    if (grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t) ||
        !(t.name = rc_strdup(name)))
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    w->t[w->n_t++] = t;
    return 0;
}

/* ---- layout and serialisation ---- */

typedef struct {
    uint64_t alignment;
    uint64_t meta_bytes;      /* header + pairs + infos */
    uint64_t data_offset;     /* meta_bytes rounded up to the alignment */
    uint64_t total_bytes;
    uint64_t max_tensor_bytes;
} layout;

static int align_up(uint64_t x, uint64_t a, uint64_t *out)
{
    if (rc_add_u64(x, a - 1, out))
        return -1;
    *out = *out / a * a;
    return 0;
}

/* Encoded bytes of a value after its type field. */
static int value_bytes(const gguf_value *v, uint64_t *out)
{
    unsigned size = gguf__scalar_bytes(v->type);
    if (size) {
        *out = size;
        return 0;
    }
    if (v->type == GGUF_STRING)
        return rc_add_u64(8, v->v.s.len, out);
    uint64_t total = 4 + 8, b;
    size = gguf__scalar_bytes(v->v.arr.elem_type);
    if (size)
        return rc_mul_u64(v->v.arr.n, size, &b) || rc_add_u64(total, b, out) ? -1 : 0;
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        if (value_bytes(&v->v.arr.items[i], &b) || rc_add_u64(total, b, &total))
            return -1;
    *out = total;
    return 0;
}

static int plan(gguf_writer *w, layout *L)
{
    uint64_t meta = 4 + 4 + 8 + 8, b;
    memset(L, 0, sizeof *L);
    L->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const gguf_value *v = &w->kv[i].value;
        if (!strcmp(w->kv[i].key, "general.alignment")) {
            if (v->type != GGUF_UINT32 || v->v.u == 0 || (v->v.u & (v->v.u - 1)))
                return rc_fail(RC_EINVAL, "gguf writer: general.alignment must be a uint32 "
                               "power of two");
            L->alignment = v->v.u;
        }
        if (value_bytes(v, &b) || rc_add_u64(meta, b, &meta) ||
            rc_add_u64(meta, 8 + 4 + strlen(w->kv[i].key), &meta))
            return rc_fail(RC_ENOMEM, "gguf writer: metadata size overflows");
    }
    for (size_t i = 0; i < w->n_t; i++)
        meta += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
    L->meta_bytes = meta;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        if (align_up(off, L->alignment, &off))
            return rc_fail(RC_ENOMEM, "gguf writer: file size overflows");
        w->t[i].offset = off;
        if (rc_add_u64(off, w->t[i].size_bytes, &off))
            return rc_fail(RC_ENOMEM, "gguf writer: file size overflows");
        if (w->t[i].size_bytes > L->max_tensor_bytes)
            L->max_tensor_bytes = w->t[i].size_bytes;
    }
    if (align_up(meta, L->alignment, &L->data_offset) ||
        rc_add_u64(L->data_offset, off, &L->total_bytes))
        return rc_fail(RC_ENOMEM, "gguf writer: file size overflows");
    return 0;
}

static uint8_t *put_u32(uint8_t *p, uint32_t x)
{
    for (int b = 0; b < 4; b++)
        *p++ = (uint8_t)(x >> (8 * b));
    return p;
}

static uint8_t *put_u64(uint8_t *p, uint64_t x)
{
    for (int b = 0; b < 8; b++)
        *p++ = (uint8_t)(x >> (8 * b));
    return p;
}

static uint8_t *put_str(uint8_t *p, const char *s, uint64_t len)
{
    p = put_u64(p, len);
    if (len)
        memcpy(p, s, (size_t)len);
    return p + len;
}

static uint8_t *put_value(uint8_t *p, const gguf_value *v)
{
    uint32_t b32;
    uint64_t b64;
    float f;
    switch (v->type) {
    case GGUF_UINT8: case GGUF_BOOL: *p++ = (uint8_t)v->v.u; return p;
    case GGUF_INT8:   *p++ = (uint8_t)v->v.i; return p;
    case GGUF_UINT16: b32 = (uint16_t)v->v.u; *p++ = (uint8_t)b32; *p++ = (uint8_t)(b32 >> 8); return p;
    case GGUF_INT16:  b32 = (uint16_t)v->v.i; *p++ = (uint8_t)b32; *p++ = (uint8_t)(b32 >> 8); return p;
    case GGUF_UINT32: return put_u32(p, (uint32_t)v->v.u);
    case GGUF_INT32:  return put_u32(p, (uint32_t)v->v.i);
    case GGUF_UINT64: return put_u64(p, v->v.u);
    case GGUF_INT64:  return put_u64(p, (uint64_t)v->v.i);
    case GGUF_FLOAT32:
        f = (float)v->v.f;
        memcpy(&b32, &f, 4);
        return put_u32(p, b32);
    case GGUF_FLOAT64:
        memcpy(&b64, &v->v.f, 8);
        return put_u64(p, b64);
    case GGUF_STRING:
        return put_str(p, v->v.s.ptr, v->v.s.len);
    default: break;
    }
    /* GGUF_ARRAY */
    unsigned size = gguf__scalar_bytes(v->v.arr.elem_type);
    p = put_u32(p, v->v.arr.elem_type);
    p = put_u64(p, v->v.arr.n);
    if (size) {
        if (v->v.arr.n)
            memcpy(p, v->v.arr.raw, (size_t)v->v.arr.n * size);
        return p + v->v.arr.n * size;
    }
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        p = put_value(p, &v->v.arr.items[i]);
    return p;
}

/* Header, pairs, infos and the padding to data_offset, into dst. */
static void put_meta(const gguf_writer *w, const layout *L, uint8_t *dst)
{
    uint8_t *p = dst;
    memcpy(p, "GGUF", 4);
    p = put_u32(p + 4, 3);
    p = put_u64(p, w->n_t);
    p = put_u64(p, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        p = put_str(p, w->kv[i].key, strlen(w->kv[i].key));
        p = put_u32(p, w->kv[i].value.type);
        p = put_value(p, &w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        p = put_str(p, t->name, strlen(t->name));
        p = put_u32(p, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            p = put_u64(p, (uint64_t)t->ne[d]);
        p = put_u32(p, t->type);
        p = put_u64(p, t->offset);
    }
    memset(p, 0, (size_t)(L->data_offset - L->meta_bytes));
}

static int fill_tensor(const gguf_writer *w, size_t i, gguf_fill_fn fill, void *ctx,
                       void *dst, const char *where)
{
    const wtensor *t = &w->t[i];
    if (!fill) {
        memset(dst, 0, (size_t)t->size_bytes);
        return 0;
    }
    int rc = fill(ctx, i, dst, t->size_bytes);
    if (rc)
        return rc_wrap(rc < 0 ? rc : RC_EINVAL, "%s: filling tensor '%s': ", where, t->name);
    return 0;
}

/* ---- outputs ---- */

int gguf_writer_write_mem(gguf_writer *w, gguf_fill_fn fill, void *ctx,
                          uint8_t **out, size_t *out_size)
{
    layout L;
    uint8_t *buf;
    int rc;
    *out = NULL;
    *out_size = 0;
    if (!w)
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer");
    if ((rc = plan(w, &L)))
        return rc;
    if (L.total_bytes > SIZE_MAX || !(buf = rc_malloc((size_t)L.total_bytes)))
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory for %llu bytes",
                       (ull)L.total_bytes);
    put_meta(w, &L, buf);
    uint64_t end = 0;   /* end of the previous tensor in the data section */
    for (size_t i = 0; i < w->n_t; i++) {
        uint8_t *dst = buf + L.data_offset + w->t[i].offset;
        memset(buf + L.data_offset + end, 0, (size_t)(w->t[i].offset - end));
        if ((rc = fill_tensor(w, i, fill, ctx, dst, "<memory>"))) {
            rc_free(buf);
            return rc;
        }
        end = w->t[i].offset + w->t[i].size_bytes;
    }
    *out = buf;
    *out_size = (size_t)L.total_bytes;
    return 0;
}

static int write_zeros(FILE *fp, uint64_t n)
{
    static const uint8_t zeros[4096];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, fp) != k)
            return -1;
        n -= k;
    }
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx)
{
    layout L;
    uint8_t *meta = NULL, *scratch = NULL;
    char *tmp = NULL;
    FILE *fp = NULL;
    bool created = false;
    int rc;
    if (!w || !path)
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer or path");
    if ((rc = plan(w, &L)))
        return rc;
    size_t plen = strlen(path);
    if (L.data_offset > SIZE_MAX || L.max_tensor_bytes > SIZE_MAX ||
        !(tmp = rc_malloc(plen + 5)) ||
        !(meta = rc_malloc((size_t)L.data_offset)) ||
        !(scratch = rc_malloc(L.max_tensor_bytes ? (size_t)L.max_tensor_bytes : 1))) {
        rc = rc_fail(RC_ENOMEM, "%s: out of memory writing", path);
        goto fail;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    put_meta(w, &L, meta);
    if (!(fp = fopen(tmp, "wb"))) {
        rc = rc_fail(RC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    created = true;
    if (fwrite(meta, 1, (size_t)L.data_offset, fp) != L.data_offset)
        goto io_error;
    uint64_t end = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        if (write_zeros(fp, w->t[i].offset - end))
            goto io_error;
        if ((rc = fill_tensor(w, i, fill, ctx, scratch, path)))
            goto fail;
        if (fwrite(scratch, 1, (size_t)w->t[i].size_bytes, fp) != w->t[i].size_bytes)
            goto io_error;
        end = w->t[i].offset + w->t[i].size_bytes;
    }
    if (fflush(fp) != 0 || ferror(fp))
        goto io_error;
    int closed = fclose(fp);
    fp = NULL;
    if (closed != 0)
        goto io_error;
    if (rename(tmp, path) != 0) {
        rc = rc_fail(RC_EIO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        goto fail;
    }
    created = false;
    rc_free(tmp);
    rc_free(meta);
    rc_free(scratch);
    return 0;

io_error:
    rc = rc_fail(RC_EIO, "%s: cannot write: %s", tmp, strerror(errno));
fail:
    if (fp)
        fclose(fp);
    if (created)
        remove(tmp);
    rc_free(tmp);
    rc_free(meta);
    rc_free(scratch);
    return rc;
}

int gguf_writer_write_head(gguf_writer *w, const char *path)
{
    layout L;
    uint8_t *meta;
    int rc;
    if (!w || !path)
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer or path");
    if ((rc = plan(w, &L)))
        return rc;
    if (L.data_offset > SIZE_MAX || L.total_bytes > (uint64_t)INT64_MAX ||
        !(meta = rc_malloc((size_t)L.data_offset)))
        return rc_fail(RC_ENOMEM, "%s: out of memory writing", path);
    put_meta(w, &L, meta);
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        rc_free(meta);
        return rc_fail(RC_EIO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(meta, 1, (size_t)L.data_offset, fp) == L.data_offset && fflush(fp) == 0 &&
              ftruncate(fileno(fp), (off_t)L.total_bytes) == 0;
    int err = errno;
    ok = fclose(fp) == 0 && ok;
    rc_free(meta);
    if (!ok) {
        remove(path);
        return rc_fail(RC_EIO, "%s: cannot write: %s", path, strerror(err));
    }
    return 0;
}

int gguf_writer_head_mem(gguf_writer *w, uint8_t **head, size_t *head_bytes, uint64_t *offsets,
                         uint64_t *total_bytes)
{
    layout L;
    int rc;
    *head = NULL;
    if (!w)
        return rc_fail(RC_EINVAL, "gguf writer: NULL writer");
    if ((rc = plan(w, &L)))
        return rc;
    if (L.data_offset > SIZE_MAX || !(*head = rc_malloc((size_t)L.data_offset)))
        return rc_fail(RC_ENOMEM, "gguf writer: out of memory for a head of %llu bytes",
                       (unsigned long long)L.data_offset);
    put_meta(w, &L, *head);
    *head_bytes = (size_t)L.data_offset;
    *total_bytes = L.total_bytes;
    for (size_t i = 0; offsets && i < w->n_t; i++)
        offsets[i] = L.data_offset + w->t[i].offset;
    return 0;
}
