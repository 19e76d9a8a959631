/* gguf_read.c - parsing GGUF versions 2 and 3 (little-endian) and the
 * metadata getters.
 *
 * File layout (integers little-endian, fields packed without padding; v2 and
 * v3 are identical for little-endian files, v3 only allowed big-endian ones):
 *
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv      x { str key | u32 vtype | value }
 *   n_tensors x { str name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   zero padding up to a multiple of the alignment      <- data_offset
 *   tensor data: tensor i at data_offset + offset_i, offset_i % alignment == 0
 *
 * where str = u64 length + that many bytes (no NUL), and an array value is
 * u32 elem_type | u64 n | n values of elem_type (arrays nest).  The alignment
 * is the u32 value of `general.alignment`, 32 when absent.
 *
 * Invariants: every read goes through the cursor, which checks the bytes it
 * needs against what remains, so nothing outside [0, size) is touched.  Every
 * count is checked against the hard limits and against the bytes remaining
 * (at its elements' smallest encoding) before anything proportional to it is
 * allocated, so allocations stay within a small multiple of the file size.
 * Every failure leaves the half-built file in a state gguf_close can free.
 *
 * Divisions: cursor and errors; values; key/value pairs; tensor infos and the
 * checks across tensors; parse/open/close; look-up and getters.
 */
#include "gguf.h"
#include "gguf_internal.h"

#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/types.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long ull;    /* for printf */

/* Smallest encodings, for checking counts against the bytes remaining. */
#define MIN_KV_BYTES     (8 + 4 + 1)            /* key length, type, a u8 */
#define MIN_TINFO_BYTES  (8 + 4 + 8 + 4 + 8)    /* name length, n_dims, one
                                                   dim, type, offset */
#define MIN_STRING_BYTES 8
#define MIN_ARRAY_BYTES  (4 + 8)

struct gguf__index {
    const char *name;
    uint64_t    i;
};

/* ---- cursor and errors ---- */

/* A parse sees the file as `size` bytes of which the first `avail` are in
 * memory at base.  Every check is made against `size`, so a parse of the
 * head alone (gguf_open_meta) fails exactly as a parse of the whole file
 * would; a read past `avail` stops the parse with NEED_MORE and `need` set
 * to the bytes it wanted, and the caller maps more and parses again. */
#define NEED_MORE 1

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
    uint64_t avail, need;
    const char *name;       /* file name, for messages */
    char subject[160];      /* what is being read: "header", "key 'x'" */
} cursor;

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int fail(const cursor *c, int code, uint64_t at, const char *fmt, ...)
{
    char problem[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    return rc_fail(code, "%s: at byte %llu: %s: %s", c->name, (ull)at,
                   c->subject, problem);
}

/* Sets the subject to `prefix` + a printable excerpt of a name from the
 * file (which may hold any bytes). */
static void set_subject(cursor *c, const char *prefix, const char *s, uint64_t len)
{
    size_t n = (size_t)snprintf(c->subject, sizeof c->subject, "%s '", prefix);
    size_t max = sizeof c->subject - 6;    /* room for "...'" and NUL */
    for (uint64_t i = 0; i < len && n < max; i++) {
        unsigned char ch = (unsigned char)s[i];
        c->subject[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (len > 0 && n >= max)
        c->subject[n++] = '.', c->subject[n++] = '.', c->subject[n++] = '.';
    c->subject[n++] = '\'';
    c->subject[n] = '\0';
}

/* Claims the next n bytes. */
static int take(cursor *c, uint64_t n, const char *what, const uint8_t **p)
{
    *p = NULL;
    if (n > remaining(c))
        return fail(c, RC_EFORMAT, c->pos,
                    "truncated: %s needs %llu bytes but only %llu remain",
                    what, (ull)n, (ull)remaining(c));
    if (n > c->avail - c->pos) {
        c->need = c->pos + n;
        return NEED_MORE;
    }
    *p = c->base ? c->base + c->pos : NULL;
    c->pos += n;
    return 0;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int rd_u32(cursor *c, const char *what, uint32_t *out)
{
    const uint8_t *p;
    int rc = take(c, 4, what, &p);
    if (rc == 0)
        *out = le32(p);
    return rc;
}

static int rd_u64(cursor *c, const char *what, uint64_t *out)
{
    const uint8_t *p;
    int rc = take(c, 8, what, &p);
    if (rc == 0)
        *out = le64(p);
    return rc;
}

static int rd_str(cursor *c, const char *what, gguf_str *out)
{
    uint64_t at = c->pos, len;
    const uint8_t *p;
    int rc = rd_u64(c, what, &len);
    if (rc)
        return rc;
    if (len > GGUF_MAX_STRING)
        return fail(c, RC_ELIMIT, at, "%s: string length %llu exceeds the limit %llu",
                    what, (ull)len, (ull)GGUF_MAX_STRING);
    if (len > remaining(c))
        return fail(c, RC_EFORMAT, at,
                    "%s: string length %llu exceeds the %llu bytes remaining (truncated)",
                    what, (ull)len, (ull)remaining(c));
    if ((rc = take(c, len, what, &p)))
        return rc;
    out->ptr = (const char *)p;
    out->len = len;
    return 0;
}

/* A NUL-terminated copy of a key or tensor name read at `at`. */
static int copy_name(cursor *c, uint64_t at, const char *what, gguf_str s, char **out)
{
    if (s.len && memchr(s.ptr, '\0', (size_t)s.len))
        return fail(c, RC_EFORMAT, at, "%s contains a NUL byte", what);
    char *d = rc_malloc((size_t)s.len + 1);
    if (!d)
        return fail(c, RC_ENOMEM, at, "out of memory copying the %s", what);
    if (s.len)
        memcpy(d, s.ptr, (size_t)s.len);
    d[s.len] = '\0';
    *out = d;
    return 0;
}

/* ---- values ---- */

static const uint8_t scalar_bytes[GGUF_VTYPE_COUNT] = {
    [GGUF_UINT8] = 1, [GGUF_INT8] = 1, [GGUF_UINT16] = 2, [GGUF_INT16] = 2,
    [GGUF_UINT32] = 4, [GGUF_INT32] = 4, [GGUF_FLOAT32] = 4, [GGUF_BOOL] = 1,
    [GGUF_UINT64] = 8, [GGUF_INT64] = 8, [GGUF_FLOAT64] = 8,
};

unsigned gguf__scalar_bytes(uint32_t vtype)
{
    return vtype < GGUF_VTYPE_COUNT ? scalar_bytes[vtype] : 0;
}

/* Decodes a scalar of `type` (one with scalar_bytes != 0) at p. */
static void decode_scalar(const uint8_t *p, uint32_t type, gguf_value *v)
{
    uint32_t b32;
    uint64_t b64;
    float f32;
    v->type = type;
    switch (type) {
    case GGUF_UINT8: case GGUF_BOOL: v->v.u = p[0]; break;
    case GGUF_INT8:   v->v.i = (int8_t)p[0]; break;
    case GGUF_UINT16: v->v.u = le16(p); break;
    case GGUF_INT16:  v->v.i = (int16_t)le16(p); break;
    case GGUF_UINT32: v->v.u = le32(p); break;
    case GGUF_INT32:  v->v.i = (int32_t)le32(p); break;
    case GGUF_UINT64: v->v.u = le64(p); break;
    case GGUF_INT64:
        b64 = le64(p);
        memcpy(&v->v.i, &b64, 8);   /* two's complement, no overflow */
        break;
    case GGUF_FLOAT32:
        b32 = le32(p);
        memcpy(&f32, &b32, 4);
        v->v.f = f32;
        break;
    case GGUF_FLOAT64:
        b64 = le64(p);
        memcpy(&v->v.f, &b64, 8);
        break;
    default: v->v.u = 0; break;
    }
}

static int check_bool(cursor *c, uint64_t at, uint8_t b)
{
    if (b > 1)
        return fail(c, RC_EFORMAT, at, "bool value %u is neither 0 nor 1", b);
    return 0;
}

/* Parses a value of `type` (already checked < GGUF_VTYPE_COUNT) into *out,
 * which starts zeroed.  `depth` counts the arrays around it. */
static int parse_value(cursor *c, uint32_t type, int depth, gguf_value *out)
{
    const uint8_t *p;
    uint64_t at = c->pos;
    int rc;
    out->type = type;
    if (scalar_bytes[type]) {
        if ((rc = take(c, scalar_bytes[type], "value", &p)))
            return rc;
        if (type == GGUF_BOOL && (rc = check_bool(c, at, p[0])))
            return rc;
        decode_scalar(p, type, out);
        return 0;
    }
    if (type == GGUF_STRING)
        return rd_str(c, "string value", &out->v.s);

    /* GGUF_ARRAY */
    if (depth + 1 > GGUF_MAX_ARRAY_DEPTH)
        return fail(c, RC_ELIMIT, at, "arrays nested deeper than %d levels",
                    GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    if ((rc = rd_u32(c, "array element type", &et)))
        return rc;
    if (et >= GGUF_VTYPE_COUNT)
        return fail(c, RC_EFORMAT, at, "array element type %u is not a GGUF value type (0 to 12)", et);
    if ((rc = rd_u64(c, "array count", &n)))
        return rc;
    unsigned min = scalar_bytes[et] ? scalar_bytes[et]
                 : et == GGUF_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (n > remaining(c) / min)
        return fail(c, RC_EFORMAT, at + 4,
                    "array count %llu of %s elements exceeds the %llu bytes remaining",
                    (ull)n, gguf_vtype_name(et), (ull)remaining(c));
    out->v.arr.elem_type = et;
    out->v.arr.n = n;
    if (scalar_bytes[et]) {
        uint64_t start = c->pos;
        if ((rc = take(c, n * min, "array elements", &p)))   /* n * min <= remaining */
            return rc;
        out->v.arr.raw = p;
        if (et == GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if ((rc = check_bool(c, start + i, p[i])))
                    return rc;
        return 0;
    }
    if (n == 0)
        return 0;
    /* n <= remaining / 8, so this is bounded by a multiple of the file size. */
    out->v.arr.items = rc_calloc((size_t)n, sizeof(gguf_value));
    if (!out->v.arr.items)
        return fail(c, RC_ENOMEM, at, "out of memory for %llu array items", (ull)n);
    for (uint64_t i = 0; i < n; i++)
        if ((rc = parse_value(c, et, depth + 1, &out->v.arr.items[i])))
            return rc;
    return 0;
}

static void free_value(gguf_value *v)
{
    if (v->type != GGUF_ARRAY || !v->v.arr.items)
        return;
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        free_value(&v->v.arr.items[i]);
    rc_free(v->v.arr.items);
    v->v.arr.items = NULL;
}

/* ---- name index (keys, tensor names) ---- */

static int cmp_index(const void *a, const void *b)
{
    const struct gguf__index *x = a, *y = b;
    int d = strcmp(x->name, y->name);
    if (d)
        return d;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Sorts names[0..n) into a new index; *dup is the position in the index of
 * the second of the first equal pair found, or n if the names are unique. */
static struct gguf__index *build_index(const char *(*name_of)(const gguf_file *, uint64_t),
                                       const gguf_file *f, uint64_t n, uint64_t *dup)
{
    struct gguf__index *ix = rc_calloc(n ? (size_t)n : 1, sizeof *ix);
    if (!ix)
        return NULL;
    for (uint64_t i = 0; i < n; i++) {
        ix[i].name = name_of(f, i);
        ix[i].i = i;
    }
    qsort(ix, (size_t)n, sizeof *ix, cmp_index);
    *dup = n;
    for (uint64_t k = 1; k < n; k++)
        if (!strcmp(ix[k - 1].name, ix[k].name)) {
            *dup = k;
            break;
        }
    return ix;
}

static const char *kv_name(const gguf_file *f, uint64_t i) { return f->kv[i].key; }
static const char *tensor_name(const gguf_file *f, uint64_t i) { return f->tensors[i].name; }

/* Index of `name` in a sorted index of n entries, or -1. */
static int64_t lookup(const struct gguf__index *ix, uint64_t n, const char *name)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int d = strcmp(ix[mid].name, name);
        if (d == 0)
            return (int64_t)ix[mid].i;
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ---- key/value pairs ---- */

/* pos[i] receives the offset of pair i, for later messages. */
static int parse_kvs(cursor *c, gguf_file *f, uint64_t *pos)
{
    int rc;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        gguf_str key;
        uint32_t type;
        pos[i] = c->pos;
        snprintf(c->subject, sizeof c->subject, "key/value pair %llu", (ull)i);
        if ((rc = rd_str(c, "key", &key)))
            return rc;
        char *copy;
        if ((rc = copy_name(c, pos[i], "key", key, &copy)))
            return rc;
        kv->key = copy;
        set_subject(c, "key", key.ptr, key.len);
        uint64_t at = c->pos;
        if ((rc = rd_u32(c, "value type", &type)))
            return rc;
        if (type >= GGUF_VTYPE_COUNT)
            return fail(c, RC_EFORMAT, at, "value type %u is not a GGUF value type (0 to 12)", type);
        if ((rc = parse_value(c, type, 0, &kv->value)))
            return rc;
    }
    return 0;
}

static int read_alignment(cursor *c, gguf_file *f, const uint64_t *pos)
{
    int64_t i = lookup(f->kv_index, f->n_kv, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (i < 0)
        return 0;
    const gguf_value *v = &f->kv[i].value;
    snprintf(c->subject, sizeof c->subject, "key 'general.alignment'");
    if (v->type != GGUF_UINT32)
        return fail(c, RC_EFORMAT, pos[i], "alignment has type %s, expected uint32",
                    gguf_vtype_name(v->type));
    if (v->v.u == 0 || (v->v.u & (v->v.u - 1)))
        return fail(c, RC_EFORMAT, pos[i], "alignment %llu is not a nonzero power of two",
                    (ull)v->v.u);
    f->alignment = v->v.u;
    return 0;
}

/* ---- tensor infos ---- */

int gguf__tensor_bytes(uint32_t type, const int64_t ne[GGUF_MAX_DIMS], uint64_t *bytes)
{
    if (type >= TT_COUNT)
        return GGUF__SIZE_UNKNOWN_TYPE;
    if (type >= TT_GGUF_COUNT)
        return GGUF__SIZE_MEMORY_TYPE;
    const tensor_traits *tt = tensor_type_traits((int)type);
    if (!tt || tt->block_size <= 0 || tt->block_bytes == 0)
        return GGUF__SIZE_UNKNOWN_TYPE;
    int64_t n_elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (ne[d] < 0 || __builtin_mul_overflow(n_elems, ne[d], &n_elems))
            return GGUF__SIZE_OVERFLOW;
    if (ne[0] % tt->block_size)
        return GGUF__SIZE_BLOCK;
    uint64_t row, total;
    if (rc_mul_u64((uint64_t)(ne[0] / tt->block_size), tt->block_bytes, &row) ||
        (size_t)row != row)
        return GGUF__SIZE_OVERFLOW;
    row = ne[0] ? tensor_row_bytes((int)type, ne[0]) : 0;
    total = row;
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (rc_mul_u64(total, (uint64_t)ne[d], &total))
            return GGUF__SIZE_OVERFLOW;
    *bytes = total;
    return GGUF__SIZE_OK;
}

static int parse_tensor_info(cursor *c, gguf_file *f, gguf_tensor *t, uint64_t i)
{
    gguf_str name;
    uint64_t at = c->pos;
    int rc;
    snprintf(c->subject, sizeof c->subject, "tensor info %llu", (ull)i);
    if ((rc = rd_str(c, "tensor name", &name)))
        return rc;
    char *copy;
    if ((rc = copy_name(c, at, "tensor name", name, &copy)))
        return rc;
    t->name = copy;
    set_subject(c, "tensor", name.ptr, name.len);

    at = c->pos;
    if ((rc = rd_u32(c, "dimension count", &t->n_dims)))
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c, RC_EFORMAT, at, "%u dimensions (must be 1 to %d)",
                    t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        at = c->pos;
        if ((rc = rd_u64(c, "dimension", &ne)))
            return rc;
        if (ne > INT64_MAX)
            return fail(c, RC_EFORMAT, at, "dimension %u is %llu, more than INT64_MAX",
                        d, (ull)ne);
        t->ne[d] = (int64_t)ne;
    }
    uint64_t type_at = c->pos;
    if ((rc = rd_u32(c, "tensor type", &t->type)))
        return rc;
    uint64_t off_at = c->pos;
    if ((rc = rd_u64(c, "tensor data offset", &t->offset)))
        return rc;

    switch (gguf__tensor_bytes(t->type, t->ne, &t->size_bytes)) {
    case GGUF__SIZE_OK:
        break;
    case GGUF__SIZE_UNKNOWN_TYPE:
        return fail(c, RC_EUNSUPPORTED, type_at, "unknown tensor type %u", t->type);
    case GGUF__SIZE_MEMORY_TYPE:
        return fail(c, RC_EFORMAT, type_at,
                    "tensor type %u (%s) is a layout racimo makes in memory at load; "
                    "no GGUF file holds it", t->type, tensor_type_name((int)t->type));
    case GGUF__SIZE_BLOCK:
        return fail(c, RC_EFORMAT, type_at,
                    "ne[0] = %lld is not a multiple of the block size %lld of type %s",
                    (long long)t->ne[0],
                    (long long)tensor_type_traits((int)t->type)->block_size,
                    tensor_type_name((int)t->type));
    default:
        return fail(c, RC_EFORMAT, at,
                    "element count or byte size overflows (%lld x %lld x %lld x %lld of %s)",
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                    (long long)t->ne[3], tensor_type_name((int)t->type));
    }
    if (t->offset % f->alignment)
        return fail(c, RC_EFORMAT, off_at, "data offset %llu is not aligned to %llu",
                    (ull)t->offset, (ull)f->alignment);
    return 0;
}

typedef struct { uint64_t offset, i; } span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Places every tensor's data inside the file and checks that no two share a
 * byte.  pos[i] is the offset of tensor i's info, for messages. */
static int place_tensors(cursor *c, gguf_file *f, const uint64_t *pos)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t start, end;
        set_subject(c, "tensor", t->name, strlen(t->name));
        if (rc_add_u64(f->data_offset, t->offset, &start) ||
            rc_add_u64(start, t->size_bytes, &end) || end > f->size_bytes)
            return fail(c, RC_EFORMAT, pos[i],
                        "data of %llu bytes at offset %llu (data section at byte %llu) "
                        "lies outside the file of %llu bytes",
                        (ull)t->size_bytes, (ull)t->offset, (ull)f->data_offset,
                        (ull)f->size_bytes);
        t->file_offset = start;
        t->data = f->base && end <= c->avail ? f->base + start : NULL;
    }
    if (f->n_tensors < 2)
        return 0;
    span *s = rc_calloc((size_t)f->n_tensors, sizeof *s);
    if (!s) {
        snprintf(c->subject, sizeof c->subject, "tensor data");
        return fail(c, RC_ENOMEM, f->data_offset, "out of memory checking overlaps");
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        s[i] = (span){ f->tensors[i].offset, i };
    qsort(s, (size_t)f->n_tensors, sizeof *s, cmp_span);
    /* Walk in offset order keeping the furthest end seen; empty tensors
     * share no byte with anything. */
    uint64_t end = 0, owner = 0;
    int rc = 0;
    for (uint64_t k = 0; k < f->n_tensors && !rc; k++) {
        const gguf_tensor *t = &f->tensors[s[k].i];
        if (t->size_bytes == 0)
            continue;
        if (t->offset < end) {
            const gguf_tensor *o = &f->tensors[owner];
            set_subject(c, "tensor", t->name, strlen(t->name));
            rc = fail(c, RC_EFORMAT, pos[s[k].i],
                      "data [%llu, %llu) overlaps tensor '%.80s' data [%llu, %llu)",
                      (ull)t->offset, (ull)(t->offset + t->size_bytes), o->name,
                      (ull)o->offset, (ull)(o->offset + o->size_bytes));
        }
        if (t->offset + t->size_bytes > end) {
            end = t->offset + t->size_bytes;
            owner = s[k].i;
        }
    }
    rc_free(s);
    return rc;
}

/* ---- parse, open, close ---- */

static int parse_header(cursor *c, gguf_file *f)
{
    const uint8_t *p;
    uint32_t v;
    int rc;
    snprintf(c->subject, sizeof c->subject, "header");
    if ((rc = take(c, 4, "magic", &p)))
        return rc;
    if (memcmp(p, "GGUF", 4))
        return fail(c, RC_EFORMAT, 0,
                    "not a GGUF file: magic is %02x %02x %02x %02x, expected 'GGUF'",
                    p[0], p[1], p[2], p[3]);
    if ((rc = rd_u32(c, "version", &v)))
        return rc;
    uint32_t swapped = __builtin_bswap32(v);
    if (v != 2 && v != 3) {
        if (swapped >= 1 && swapped <= 3)
            return fail(c, RC_EUNSUPPORTED, 4,
                        "big-endian GGUF file (version field reads 0x%08x); only "
                        "little-endian files are supported", v);
        if (v == 1)
            return fail(c, RC_EUNSUPPORTED, 4,
                        "GGUF version 1 is not supported (only versions 2 and 3); "
                        "convert the model again with a current tool");
        return fail(c, RC_EUNSUPPORTED, 4,
                    "GGUF version %u is not supported (only versions 2 and 3)", v);
    }
    f->version = v;
    if ((rc = rd_u64(c, "tensor count", &f->n_tensors)) ||
        (rc = rd_u64(c, "key/value count", &f->n_kv)))
        return rc;
    if (f->n_tensors > GGUF_MAX_TENSORS)
        return fail(c, RC_ELIMIT, 8, "tensor count %llu exceeds the limit %u",
                    (ull)f->n_tensors, GGUF_MAX_TENSORS);
    if (f->n_kv > GGUF_MAX_KV)
        return fail(c, RC_ELIMIT, 16, "key/value count %llu exceeds the limit %u",
                    (ull)f->n_kv, GGUF_MAX_KV);
    /* Both counts are <= 2^20, so the products cannot overflow. */
    uint64_t need = f->n_kv * MIN_KV_BYTES + f->n_tensors * MIN_TINFO_BYTES;
    if (need > remaining(c))
        return fail(c, RC_EFORMAT, 8,
                    "%llu tensors and %llu key/value pairs need at least %llu bytes, "
                    "only %llu remain (truncated)",
                    (ull)f->n_tensors, (ull)f->n_kv, (ull)need, (ull)remaining(c));
    return 0;
}

static int parse_body(cursor *c, gguf_file *f, uint64_t **kv_pos, uint64_t **t_pos)
{
    uint64_t dup;
    int rc;
    if ((rc = parse_header(c, f)))
        return rc;

    /* Metadata.  The header check bounds n_kv by the file size. */
    snprintf(c->subject, sizeof c->subject, "metadata");
    f->kv = rc_calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
    *kv_pos = rc_calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof **kv_pos);
    if (!f->kv || !*kv_pos)
        return fail(c, RC_ENOMEM, c->pos, "out of memory for %llu key/value pairs",
                    (ull)f->n_kv);
    if ((rc = parse_kvs(c, f, *kv_pos)))
        return rc;
    snprintf(c->subject, sizeof c->subject, "metadata");
    if (!(f->kv_index = build_index(kv_name, f, f->n_kv, &dup)))
        return fail(c, RC_ENOMEM, c->pos, "out of memory indexing keys");
    if (dup < f->n_kv) {
        const struct gguf__index *a = &f->kv_index[dup - 1], *b = &f->kv_index[dup];
        set_subject(c, "key", b->name, strlen(b->name));
        return fail(c, RC_EFORMAT, (*kv_pos)[b->i], "duplicate key (first at byte %llu)",
                    (ull)(*kv_pos)[a->i]);
    }
    if ((rc = read_alignment(c, f, *kv_pos)))
        return rc;

    /* Tensor infos: check the count again against what the pairs left. */
    snprintf(c->subject, sizeof c->subject, "tensor infos");
    if (f->n_tensors > remaining(c) / MIN_TINFO_BYTES)
        return fail(c, RC_EFORMAT, c->pos,
                    "%llu tensor infos need at least %llu bytes, only %llu remain (truncated)",
                    (ull)f->n_tensors, (ull)(f->n_tensors * MIN_TINFO_BYTES),
                    (ull)remaining(c));
    f->tensors = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    *t_pos = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof **t_pos);
    if (!f->tensors || !*t_pos)
        return fail(c, RC_ENOMEM, c->pos, "out of memory for %llu tensor infos",
                    (ull)f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        (*t_pos)[i] = c->pos;
        if ((rc = parse_tensor_info(c, f, &f->tensors[i], i)))
            return rc;
    }
    snprintf(c->subject, sizeof c->subject, "tensor infos");
    if (!(f->tensor_index = build_index(tensor_name, f, f->n_tensors, &dup)))
        return fail(c, RC_ENOMEM, c->pos, "out of memory indexing tensor names");
    if (dup < f->n_tensors) {
        const struct gguf__index *a = &f->tensor_index[dup - 1], *b = &f->tensor_index[dup];
        set_subject(c, "tensor", b->name, strlen(b->name));
        return fail(c, RC_EFORMAT, (*t_pos)[b->i],
                    "duplicate tensor name (first at byte %llu)", (ull)(*t_pos)[a->i]);
    }

    /* c->pos <= size < 2^63 and alignment < 2^32: no overflow. */
    f->data_offset = (c->pos + f->alignment - 1) / f->alignment * f->alignment;
    return place_tensors(c, f, *t_pos);
}

/* Parses a file of `size` bytes whose first `avail` are at `data`; NEED_MORE
 * with *need set when the head reaches past avail. */
static int parse_image(const uint8_t *data, uint64_t avail, uint64_t size, const char *name,
                       gguf_file **out, uint64_t *need)
{
    uint64_t *kv_pos = NULL, *t_pos = NULL;
    cursor c = { .base = data, .size = size, .avail = avail, .pos = 0 };
    int rc;
    *out = NULL;
    c.name = name ? name : "<memory>";
    if (!data && size)
        return rc_fail(RC_EINVAL, "%s: at byte 0: no data", c.name);
    gguf_file *f = rc_calloc(1, sizeof *f);
    if (!f || !(f->path = rc_strdup(c.name))) {
        rc_free(f);
        return rc_fail(RC_ENOMEM, "%s: at byte 0: out of memory", c.name);
    }
    f->base = data;
    f->size_bytes = size;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    rc = parse_body(&c, f, &kv_pos, &t_pos);
    rc_free(kv_pos);
    rc_free(t_pos);
    if (rc) {
        gguf_close(f);
        *need = c.need;
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_parse(const uint8_t *data, size_t size, const char *name, gguf_file **out)
{
    uint64_t need;
    return parse_image(data, size, size, name, out, &need);
}

/* What map_handle owns: the open file, the head (or whole-file) mapping,
 * and one mapping per run of tensor data. */
struct gguf__maps {
    os_file file;
    os_map  head;
    os_map  whole;        /* when every tensor was asked for */
    os_map *runs;
    size_t  n_runs;
};

static void maps_free(struct gguf__maps *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_runs; i++)
        os_unmap(&m->runs[i]);
    rc_free(m->runs);
    os_unmap(&m->whole);
    os_unmap(&m->head);
    os_file_close(&m->file);
    rc_free(m);
}

static int open_whole(const char *path, gguf_file **out)
{
    gguf_file *f;
    uint64_t need;
    int rc;
    *out = NULL;
    struct gguf__maps *h = rc_calloc(1, sizeof *h);
    if (!h)
        return rc_fail(RC_ENOMEM, "%s: at byte 0: out of memory", path);
    h->file.fd = -1;
    if ((rc = os_map_file(path, &h->head))) {
        maps_free(h);
        return rc;
    }
    if ((rc = parse_image(h->head.data, h->head.size_bytes, h->head.size_bytes, path, &f,
                          &need))) {
        maps_free(h);
        return rc;
    }
    f->map_handle = h;
    *out = f;
    return 0;
}

size_t gguf__meta_initial_bytes = 1u << 20;

static int open_head(const char *path, gguf_file **out)
{
    gguf_file *f = NULL;
    int rc;
    *out = NULL;
    struct gguf__maps *h = rc_calloc(1, sizeof *h);
    if (!h)
        return rc_fail(RC_ENOMEM, "%s: at byte 0: out of memory", path);
    if ((rc = os_file_open(path, &h->file))) {
        rc_free(h);
        return rc;
    }
    const uint64_t size = h->file.size_bytes;
    uint64_t len = gguf__meta_initial_bytes ? gguf__meta_initial_bytes : 1;
    for (;;) {
        uint64_t need = 0;
        if (len > size)
            len = size;
        if ((rc = os_file_map(&h->file, 0, len, path, &h->head)))
            break;
        rc = parse_image(h->head.data, len, size, path, &f, &need);
        if (rc != NEED_MORE)
            break;
        /* The parse checks every length against the file size first, so
         * need <= size and this ends. */
        os_unmap(&h->head);
        len = need > len * 2 ? need : len * 2;
    }
    if (rc) {
        maps_free(h);
        return rc;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        f->tensors[i].data = NULL;
    f->map_handle = h;
    *out = f;
    return 0;
}

int gguf__open_one(const char *path, bool meta, gguf_file **out)
{
    return meta ? open_head(path, out) : open_whole(path, out);
}

int gguf__index_tensors(gguf_file *f, uint64_t *a, uint64_t *b)
{
    uint64_t dup;
    rc_free(f->tensor_index);
    if (!(f->tensor_index = build_index(tensor_name, f, f->n_tensors, &dup)))
        return rc_fail(RC_ENOMEM, "%s: out of memory indexing tensors", f->path);
    *a = *b = f->n_tensors;
    if (dup < f->n_tensors) {
        *a = f->tensor_index[dup - 1].i;
        *b = f->tensor_index[dup].i;
    }
    return 0;
}

/* A split set: each part maps its own tensors (they are f's tensors in
 * part order), then f's copies of them learn where. */
static int map_set(gguf_file *f, const bool *need)
{
    uint64_t at = 0;
    for (uint32_t p = 0; p < f->n_parts; p++) {
        gguf_file *part = f->parts[p];
        int rc = gguf_map_tensors(part, need + at);
        if (rc)
            return rc;
        for (uint64_t i = 0; i < part->n_tensors; i++)
            f->tensors[at + i].data = part->tensors[i].data;
        at += part->n_tensors;
    }
    f->base = f->parts[0]->base;
    return 0;
}

typedef struct { uint64_t start, end, i; } extent;

static int cmp_extent(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int gguf_map_tensors(gguf_file *f, const bool *need)
{
    if (f->n_parts)
        return map_set(f, need);
    struct gguf__maps *h = f->map_handle;
    if (!h || h->file.fd < 0 || h->whole.data)
        return 0;                         /* everything is mapped already */
    uint64_t n = 0, n_want = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        n_want += need[i] != 0;
        n += need[i] && !f->tensors[i].data;
    }
    if (n == 0)
        return 0;
    int rc;
    if (n_want == f->n_tensors && h->n_runs == 0) {
        if ((rc = os_file_map(&h->file, 0, f->size_bytes, f->path, &h->whole)))
            return rc;
        f->base = h->whole.data;
        for (uint64_t i = 0; i < f->n_tensors; i++)
            f->tensors[i].data = f->base + f->tensors[i].file_offset;
        return 0;
    }
    extent *e = rc_calloc((size_t)n, sizeof *e);
    if (!e)
        return rc_fail(RC_ENOMEM, "%s: out of memory mapping tensors", f->path);
    uint64_t k = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (need[i] && !f->tensors[i].data)
            e[k++] = (extent){ f->tensors[i].file_offset,
                               f->tensors[i].file_offset + f->tensors[i].size_bytes, i };
    qsort(e, (size_t)n, sizeof *e, cmp_extent);
    uint64_t n_runs = 0;
    for (uint64_t a = 0; a < n; ) {
        uint64_t b = a + 1, end = e[a].end;
        while (b < n && e[b].start < end + GGUF_MAP_MERGE_GAP) {
            end = e[b].end > end ? e[b].end : end;
            b++;
        }
        n_runs++;
        a = b;
    }
    os_map *runs = rc_realloc(h->runs, (size_t)(h->n_runs + n_runs) * sizeof *runs);
    if (!runs) {
        rc_free(e);
        return rc_fail(RC_ENOMEM, "%s: out of memory mapping tensors", f->path);
    }
    h->runs = runs;
    rc = 0;
    for (uint64_t a = 0; a < n && !rc; ) {
        uint64_t b = a + 1, end = e[a].end;
        while (b < n && e[b].start < end + GGUF_MAP_MERGE_GAP) {
            end = e[b].end > end ? e[b].end : end;
            b++;
        }
        os_map *m = &h->runs[h->n_runs];
        if (end == e[a].start) {          /* only empty tensors: point at the head */
            for (uint64_t j = a; j < b; j++)
                f->tensors[e[j].i].data = f->base;
        } else if ((rc = os_file_map(&h->file, e[a].start, end - e[a].start, f->path, m)) == 0) {
            h->n_runs++;
            for (uint64_t j = a; j < b; j++)
                f->tensors[e[j].i].data = m->data + (e[j].start - e[a].start);
        } else {
            rc_wrap(rc, "mapping the data of tensor '%s': ", f->tensors[e[a].i].name);
        }
        a = b;
    }
    rc_free(e);
    return rc;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    if (f->parts) {
        /* a split set borrows kv and names from its parts */
        for (uint32_t i = 0; i < f->n_parts; i++)
            gguf_close(f->parts[i]);
        rc_free(f->parts);
        rc_free(f->tensors);
        rc_free(f->tensor_index);
        rc_free(f->path);
        rc_free(f);
        return;
    }
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) {
            rc_free((void *)f->kv[i].key);
            free_value(&f->kv[i].value);
        }
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++)
            rc_free((void *)f->tensors[i].name);
    rc_free(f->kv);
    rc_free(f->tensors);
    rc_free(f->kv_index);
    rc_free(f->tensor_index);
    rc_free(f->path);
    maps_free(f->map_handle);
    rc_free(f);
}

/* ---- look-up and getters ---- */

const gguf_value *gguf_get(const gguf_file *f, const char *key)
{
    if (!f || !key || !f->kv_index)
        return NULL;
    int64_t i = lookup(f->kv_index, f->n_kv, key);
    return i < 0 ? NULL : &f->kv[i].value;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    if (!f || !name || !f->tensor_index)
        return NULL;
    int64_t i = lookup(f->tensor_index, f->n_tensors, name);
    return i < 0 ? NULL : &f->tensors[i];
}

const char *gguf_vtype_name(uint32_t type)
{
    static const char *const names[GGUF_VTYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool", "string", "array", "uint64", "int64", "float64",
    };
    return type < GGUF_VTYPE_COUNT ? names[type] : "unknown type";
}

static bool is_unsigned(uint32_t t)
{
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool is_signed(uint32_t t)
{
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

static bool is_float(uint32_t t) { return t == GGUF_FLOAT32 || t == GGUF_FLOAT64; }

/* Integer value of v within [lo, hi]: 0, RC_EFORMAT (not an integer) or
 * RC_ERANGE.  The value comes back split by sign so no range is lost. */
static int int_in_range(const gguf_value *v, int64_t lo, uint64_t hi, int64_t *si, uint64_t *ui)
{
    if (is_unsigned(v->type)) {
        if (v->v.u > hi)
            return RC_ERANGE;
        *ui = v->v.u;
        *si = v->v.u > INT64_MAX ? INT64_MAX : (int64_t)v->v.u;
        return 0;
    }
    if (is_signed(v->type)) {
        if (v->v.i < lo || (v->v.i >= 0 && (uint64_t)v->v.i > hi))
            return RC_ERANGE;
        *si = v->v.i;
        *ui = v->v.i < 0 ? 0 : (uint64_t)v->v.i;
        return 0;
    }
    return RC_EFORMAT;
}

static void describe_value(const gguf_value *v, char *buf, size_t n)
{
    if (is_unsigned(v->type))
        snprintf(buf, n, "%llu", (ull)v->v.u);
    else if (is_signed(v->type))
        snprintf(buf, n, "%lld", (long long)v->v.i);
    else if (is_float(v->type))
        snprintf(buf, n, "%g", v->v.f);
    else
        snprintf(buf, n, "a %s", gguf_vtype_name(v->type));
}

/* Finds `key` and reports a missing key. */
static int find(const gguf_file *f, const char *key, const gguf_value **v)
{
    *v = gguf_get(f, key);
    if (!*v)
        return rc_fail(RC_ENOTFOUND, "%s: key '%s' not found",
                       f && f->path ? f->path : "<null>", key ? key : "(null)");
    return 0;
}

static int mismatch(const gguf_file *f, const char *key, const gguf_value *v, int rc,
                    const char *wanted)
{
    char val[64];
    describe_value(v, val, sizeof val);
    if (rc == RC_ERANGE)
        return rc_fail(RC_ERANGE, "%s: key '%s': value %s (%s) does not fit %s",
                       f->path, key, val, gguf_vtype_name(v->type), wanted);
    return rc_fail(RC_EFORMAT, "%s: key '%s' has type %s, expected %s",
                   f->path, key, gguf_vtype_name(v->type), wanted);
}

static int get_int(const gguf_file *f, const char *key, int64_t lo, uint64_t hi,
                   const char *wanted, int64_t *si, uint64_t *ui)
{
    const gguf_value *v;
    int rc = find(f, key, &v);
    if (rc)
        return rc;
    if ((rc = int_in_range(v, lo, hi, si, ui)))
        return mismatch(f, key, v, rc, wanted);
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(f, key, 0, UINT32_MAX, "uint32", &si, &ui);
    if (rc == 0)
        *out = (uint32_t)ui;
    return rc;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(f, key, 0, UINT64_MAX, "uint64", &si, &ui);
    if (rc == 0)
        *out = ui;
    return rc;
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(f, key, INT32_MIN, INT32_MAX, "int32", &si, &ui);
    if (rc == 0)
        *out = (int32_t)si;
    return rc;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_value *v;
    int rc = find(f, key, &v);
    if (rc)
        return rc;
    if (is_float(v->type)) {
        if (isfinite(v->v.f) && fabs(v->v.f) > FLT_MAX)
            return mismatch(f, key, v, RC_ERANGE, "float32");
        *out = (float)v->v.f;
    } else if (is_unsigned(v->type)) {
        *out = (float)v->v.u;
    } else if (is_signed(v->type)) {
        *out = (float)v->v.i;
    } else {
        return mismatch(f, key, v, RC_EFORMAT, "a number");
    }
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    const gguf_value *v;
    int rc = find(f, key, &v);
    if (rc)
        return rc;
    if (v->type != GGUF_BOOL)
        return mismatch(f, key, v, RC_EFORMAT, "bool");
    *out = v->v.u != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_value *v;
    int rc = find(f, key, &v);
    if (rc)
        return rc;
    if (v->type != GGUF_STRING)
        return mismatch(f, key, v, RC_EFORMAT, "string");
    *out = v->v.s;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, uint32_t *elem_type, uint64_t *n)
{
    const gguf_value *v;
    int rc = find(f, key, &v);
    if (rc)
        return rc;
    if (v->type != GGUF_ARRAY)
        return mismatch(f, key, v, RC_EFORMAT, "array");
    *elem_type = v->v.arr.elem_type;
    *n = v->v.arr.n;
    return 0;
}

/* Element i of a scalar array, decoded; RC_EFORMAT/RC_ERANGE with detail. */
static int arr_elem(const gguf_value *arr, uint64_t i, gguf_value *e)
{
    if (!arr || arr->type != GGUF_ARRAY)
        return rc_fail(RC_EFORMAT, "value is a %s, not an array",
                       arr ? gguf_vtype_name(arr->type) : "NULL");
    unsigned size = gguf__scalar_bytes(arr->v.arr.elem_type);
    if (!size || !arr->v.arr.raw)
        return rc_fail(RC_EFORMAT, "array of %s, expected numbers",
                       gguf_vtype_name(arr->v.arr.elem_type));
    if (i >= arr->v.arr.n)
        return rc_fail(RC_ERANGE, "array index %llu out of range (%llu elements)",
                       (ull)i, (ull)arr->v.arr.n);
    decode_scalar((const uint8_t *)arr->v.arr.raw + i * size, arr->v.arr.elem_type, e);
    return 0;
}

int gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out)
{
    gguf_value e;
    int64_t si;
    uint64_t ui;
    int rc = arr_elem(arr, i, &e);
    if (rc)
        return rc;
    if ((rc = int_in_range(&e, INT64_MIN, INT64_MAX, &si, &ui))) {
        if (rc == RC_ERANGE)
            return rc_fail(RC_ERANGE, "array element %llu: %llu does not fit int64",
                           (ull)i, (ull)e.v.u);
        return rc_fail(RC_EFORMAT, "array of %s, expected integers",
                       gguf_vtype_name(e.type));
    }
    *out = si;
    return 0;
}

int gguf_arr_f64(const gguf_value *arr, uint64_t i, double *out)
{
    gguf_value e;
    int rc = arr_elem(arr, i, &e);
    if (rc)
        return rc;
    if (is_float(e.type))
        *out = e.v.f;
    else if (is_unsigned(e.type))
        *out = (double)e.v.u;
    else if (is_signed(e.type))
        *out = (double)e.v.i;
    else
        return rc_fail(RC_EFORMAT, "array of %s, expected numbers", gguf_vtype_name(e.type));
    return 0;
}
