/* jinja_value.c - run-time values with Python semantics.
 *
 * Divisions: allocation and reference counting (with an explicit pending
 * list so that freeing a deeply nested list never recurses), strings,
 * lists and dicts (insertion-ordered, hashed once they grow), undefined
 * values and their error messages, truthiness/equality/ordering/hashing as
 * Python defines them, str() and repr() (Python's float repr included),
 * iteration, and JSON conversion in both directions (json.dumps rules for
 * the tojson filter).  All recursion over values is bounded by
 * JX_MAX_VALUE_DEPTH.
 */
#include "jinja/jinja_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

jobj jinja__missing_obj = {JV_IMMORTAL, JV_UNDEF, 0};
jobj jinja__shadow_obj = {JV_IMMORTAL, JV_UNDEF, 0};

/* ---- errors and budgets -------------------------------------------------- */

int jv_fail(jrt *rt, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    (void)rt;
    return rc_fail(code, "%s", msg);
}

int jv_nomem(jrt *rt)
{
    if (rt && rt->alloc_rc == RC_ELIMIT)
        return RC_ELIMIT;   /* message already recorded */
    return rc_fail(RC_ENOMEM, "MemoryError: out of memory");
}

int jv_tick(jrt *rt, uint64_t units)
{
    rt->steps += units;
    if (rt->steps > rt->lim.max_steps)
        return jv_fail(rt, RC_ELIMIT,
                       "LimitError: template exceeded %" PRIu64 " evaluation steps",
                       rt->lim.max_steps);
    return 0;
}

void *jv_alloc(jrt *rt, size_t bytes)
{
    if (!rt)
        return rc_malloc(bytes);
    if (bytes > rt->lim.max_memory_bytes || rt->mem > rt->lim.max_memory_bytes - bytes) {
        rt->alloc_rc = jv_fail(rt, RC_ELIMIT,
                               "LimitError: template values exceed %zu bytes of memory",
                               rt->lim.max_memory_bytes);
        return NULL;
    }
    void *p = rc_malloc(bytes);
    if (!p) {
        rt->alloc_rc = RC_ENOMEM;
        return NULL;
    }
    rt->mem += bytes;
    return p;
}

void *jv_realloc(jrt *rt, void *p, size_t old_bytes, size_t new_bytes)
{
    if (new_bytes > old_bytes &&
        (new_bytes - old_bytes > rt->lim.max_memory_bytes ||
         rt->mem > rt->lim.max_memory_bytes - (new_bytes - old_bytes))) {
        rt->alloc_rc = jv_fail(rt, RC_ELIMIT,
                               "LimitError: template values exceed %zu bytes of memory",
                               rt->lim.max_memory_bytes);
        return NULL;
    }
    void *q = rc_realloc(p, new_bytes);
    if (!q) {
        rt->alloc_rc = RC_ENOMEM;
        return NULL;
    }
    rt->mem = rt->mem - old_bytes + new_bytes;
    return q;
}

void jv_dealloc(jrt *rt, void *p, size_t bytes)
{
    if (!p)
        return;
    if (rt)
        rt->mem -= bytes;
    rc_free(p);
}

/* ---- reference counting ---------------------------------------------------- */

static void gc_link(jrt *rt, jgc *g)
{
    g->next = rt->gc.next;
    g->prev = &rt->gc;
    rt->gc.next->prev = g;
    rt->gc.next = g;
}

static void gc_unlink(jgc *g)
{
    g->prev->next = g->next;
    g->next->prev = g->prev;
    g->prev = g->next = g;
}

void jv_incref(jv v)
{
    if (jv_is_heap(v) && v.u.o->refs >= 0)
        v.u.o->refs++;
}

static void free_obj(jrt *rt, jobj *o);

void jv_decref(jrt *rt, jv v)
{
    if (!jv_is_heap(v) || v.u.o->refs < 0)
        return;
    jobj *o = v.u.o;
    if (--o->refs > 0)
        return;
    if (rt->n_pending == rt->cap_pending) {
        size_t nc = rt->cap_pending ? rt->cap_pending * 2 : 64;
        jobj **np = rc_realloc(rt->pending, nc * sizeof *np);
        if (!np) {
            free_obj(rt, o);    /* no room to defer: free in place */
            return;
        }
        rt->pending = np;
        rt->cap_pending = nc;
    }
    rt->pending[rt->n_pending++] = o;
    if (rt->freeing)
        return;
    rt->freeing = true;
    while (rt->n_pending > 0)
        free_obj(rt, rt->pending[--rt->n_pending]);
    rt->freeing = false;
}

static void free_obj(jrt *rt, jobj *o)
{
    switch (o->type) {
    case JV_STR: {
        jstr *s = (jstr *)o;
        jv_dealloc(rt, s, sizeof *s + s->len + 1);
        return;
    }
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = (jlist *)o;
        for (size_t i = 0; i < l->n; i++)
            jv_decref(rt, l->items[i]);
        jv_dealloc(rt, l->items, l->cap * sizeof(jv));
        gc_unlink(&l->g);
        jv_dealloc(rt, l, sizeof *l);
        return;
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = (jdict *)o;
        for (size_t i = 0; i < d->n; i++) {
            jv_decref(rt, d->e[i].key);
            jv_decref(rt, d->e[i].val);
        }
        jv_dealloc(rt, d->e, d->cap * sizeof(jentry));
        jv_dealloc(rt, d->idx, d->idx_cap * sizeof(uint32_t));
        gc_unlink(&d->g);
        jv_dealloc(rt, d, sizeof *d);
        return;
    }
    case JV_ITER: {
        jiter *it = (jiter *)o;
        if (it->items) {
            jv l = {JV_LIST, {0}};
            l.u.o = &it->items->g.h;
            jv_decref(rt, l);
        }
        rc_free(it->err);
        gc_unlink(&it->g);
        jv_dealloc(rt, it, sizeof *it);
        return;
    }
    case JV_FUNC: {
        jfunc *f = (jfunc *)o;
        jv_decref(rt, f->self);
        gc_unlink(&f->g);
        jv_dealloc(rt, f, sizeof *f);
        return;
    }
    case JV_MACRO: {
        jmacro *m = (jmacro *)o;
        gc_unlink(&m->g);
        jv_dealloc(rt, m, sizeof *m);
        return;
    }
    case JV_LOOP: {
        jloop *lp = (jloop *)o;
        if (lp->items) {
            jv l = {JV_LIST, {0}};
            l.u.o = &lp->items->g.h;
            jv_decref(rt, l);
        }
        jv_decref(rt, lp->changed_last);
        gc_unlink(&lp->g);
        jv_dealloc(rt, lp, sizeof *lp);
        return;
    }
    case JV_UNDEF: {
        jundef *u = (jundef *)o;
        jv_decref(rt, u->name);
        gc_unlink(&u->g);
        jv_dealloc(rt, u, sizeof *u);
        return;
    }
    default:
        return;
    }
}

/* Drops every reference a tracked object holds (phase 2 of the sweep). */
static void clear_obj(jrt *rt, jgc *g)
{
    jobj *o = &g->h;
    switch (o->type) {
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = (jlist *)o;
        size_t n = l->n;
        l->n = 0;
        for (size_t i = 0; i < n; i++)
            jv_decref(rt, l->items[i]);
        return;
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = (jdict *)o;
        size_t n = d->n;
        d->n = 0;
        for (size_t i = 0; i < n; i++) {
            jv_decref(rt, d->e[i].key);
            jv_decref(rt, d->e[i].val);
        }
        return;
    }
    case JV_ITER: {
        jiter *it = (jiter *)o;
        if (it->items) {
            jv l = {JV_LIST, {0}};
            l.u.o = &it->items->g.h;
            it->items = NULL;
            jv_decref(rt, l);
        }
        return;
    }
    case JV_FUNC: {
        jfunc *f = (jfunc *)o;
        jv s = f->self;
        f->self = jv_none();
        jv_decref(rt, s);
        return;
    }
    case JV_LOOP: {
        jloop *lp = (jloop *)o;
        jv c = lp->changed_last;
        lp->changed_last = jv_none();
        jv_decref(rt, c);
        if (lp->items) {
            jv l = {JV_LIST, {0}};
            l.u.o = &lp->items->g.h;
            lp->items = NULL;
            jv_decref(rt, l);
        }
        return;
    }
    case JV_UNDEF: {
        jundef *u = (jundef *)o;
        jv s = u->name;
        u->name = jv_none();
        jv_decref(rt, s);
        return;
    }
    default:
        return;
    }
}

void jv_gc_sweep(jrt *rt)
{
    for (jgc *g = rt->gc.next; g != &rt->gc; g = g->next)
        g->h.refs++;
    for (jgc *g = rt->gc.next; g != &rt->gc; g = g->next)
        clear_obj(rt, g);
    while (rt->gc.next != &rt->gc) {
        jgc *g = rt->gc.next;
        g->h.refs = 1;
        jv v = {g->h.type, {0}};
        v.u.o = &g->h;
        jv_decref(rt, v);
    }
    rc_free(rt->pending);
    rt->pending = NULL;
    rt->n_pending = rt->cap_pending = 0;
}

/* ---- buffers --------------------------------------------------------------- */

int jbuf_put(jrt *rt, jbuf *b, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (n > rt->lim.max_output_bytes || b->len > rt->lim.max_output_bytes - n)
        return jv_fail(rt, RC_ELIMIT, "LimitError: rendered text exceeds %zu bytes",
                       rt->lim.max_output_bytes);
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *p = jv_realloc(rt, b->p, b->cap, nc);
        if (!p)
            return jv_nomem(rt);
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n >= 256 ? jv_tick(rt, n / 256) : 0;
}

int jbuf_putc(jrt *rt, jbuf *b, char c) { return jbuf_put(rt, b, &c, 1); }
int jbuf_puts(jrt *rt, jbuf *b, const char *s) { return jbuf_put(rt, b, s, strlen(s)); }

void jbuf_free(jrt *rt, jbuf *b)
{
    jv_dealloc(rt, b->p, b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- strings ----------------------------------------------------------------- */

static jstr *str_alloc(jrt *rt, size_t len, unsigned flags)
{
    if (rt && len > rt->lim.max_output_bytes) {
        rt->alloc_rc = jv_fail(rt, RC_ELIMIT, "LimitError: a string of %zu bytes exceeds the %zu byte limit",
                               len, rt->lim.max_output_bytes);
        return NULL;
    }
    jstr *s = jv_alloc(rt, sizeof *s + len + 1);
    if (!s)
        return NULL;
    s->h.refs = 1;
    s->h.type = JV_STR;
    s->h.flags = (uint8_t)flags;
    s->len = len;
    s->s[len] = '\0';
    return s;
}

int jv_str_flags(jrt *rt, const char *s, size_t len, unsigned flags, jv *out)
{
    jstr *x = str_alloc(rt, len, flags);
    if (!x)
        return jv_nomem(rt);
    if (len)
        memcpy(x->s, s, len);
    x->nchars = ju_count(x->s, len);
    out->t = JV_STR;
    out->u.o = &x->h;
    return len >= 256 ? jv_tick(rt, len / 256) : 0;
}

int jv_str_cat(jrt *rt, const jstr *const *parts, size_t n, unsigned flags, jv *out)
{
    size_t len = 0, nchars = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc_add_size(len, parts[i]->len, &len))
            return jv_fail(rt, RC_ELIMIT, "LimitError: string too long");
        nchars += parts[i]->nchars;
    }
    jstr *x = str_alloc(rt, len, flags);
    if (!x)
        return jv_nomem(rt);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(x->s + at, parts[i]->s, parts[i]->len);
        at += parts[i]->len;
    }
    x->nchars = nchars;
    out->t = JV_STR;
    out->u.o = &x->h;
    return len >= 256 ? jv_tick(rt, len / 256) : 0;
}

int jv_str(jrt *rt, const char *s, size_t len, jv *out)
{
    return jv_str_flags(rt, s, len, 0, out);
}

int jv_cstr(jrt *rt, const char *s, jv *out) { return jv_str(rt, s, strlen(s), out); }

jv jv_str_immortal(jarena *a, const char *s, size_t len)
{
    jstr *x = jarena_alloc(a, sizeof *x + len + 1);
    if (!x)
        return jv_none();
    x->h.refs = JV_IMMORTAL;
    x->h.type = JV_STR;
    x->len = len;
    if (len)
        memcpy(x->s, s, len);
    x->s[len] = '\0';
    x->nchars = ju_count(s, len);
    jv v = {JV_STR, {0}};
    v.u.o = &x->h;
    return v;
}

int jv_str_from_buf(jrt *rt, jbuf *b, unsigned flags, jv *out)
{
    int rc = jv_str_flags(rt, b->p ? b->p : "", b->len, flags, out);
    jbuf_free(rt, b);
    return rc;
}

/* ---- lists, tuples, dicts, other objects ---------------------------------------- */

void *jv_new_tracked(jrt *rt, size_t size, int type)
{
    jgc *g = jv_alloc(rt, size);
    if (!g)
        return NULL;
    memset(g, 0, size);
    g->h.refs = 1;
    g->h.type = (uint8_t)type;
    gc_link(rt, g);
    return g;
}

static jv wrap(int type, void *o)
{
    jv v = {(uint8_t)type, {0}};
    v.u.o = o;
    return v;
}

static int list_reserve(jrt *rt, jlist *l, size_t need)
{
    if (need <= l->cap)
        return 0;
    size_t nc = l->cap ? l->cap * 2 : 4;
    while (nc < need)
        nc *= 2;
    if (nc > SIZE_MAX / sizeof(jv))
        return jv_nomem(rt);
    jv *p = jv_realloc(rt, l->items, l->cap * sizeof(jv), nc * sizeof(jv));
    if (!p)
        return jv_nomem(rt);
    l->items = p;
    l->cap = nc;
    return 0;
}

int jv_list_new(jrt *rt, size_t cap, jv *out)
{
    jlist *l = jv_new_tracked(rt, sizeof *l, JV_LIST);
    if (!l)
        return jv_nomem(rt);
    *out = wrap(JV_LIST, l);
    if (cap && list_reserve(rt, l, cap) < 0) {
        jv_clear(rt, out);
        *out = jv_none();
        return jv_nomem(rt);
    }
    return 0;
}

int jv_tuple_new(jrt *rt, size_t n, jv *out)
{
    int rc = jv_list_new(rt, n, out);
    if (rc < 0)
        return rc;
    out->t = JV_TUPLE;
    out->u.o->type = JV_TUPLE;
    jlist *l = jv_l(*out);
    for (size_t i = 0; i < n; i++)
        l->items[i] = jv_none();
    l->n = n;
    return 0;
}

int jv_list_push(jrt *rt, jlist *l, jv v)
{
    int rc = list_reserve(rt, l, l->n + 1);
    if (rc < 0)
        return rc;
    jv_incref(v);
    l->items[l->n++] = v;
    return 0;
}

int jv_list_push_take(jrt *rt, jlist *l, jv v)
{
    int rc = list_reserve(rt, l, l->n + 1);
    if (rc < 0) {
        jv_decref(rt, v);
        return rc;
    }
    l->items[l->n++] = v;
    return 0;
}

int jv_dict_new(jrt *rt, int type, jv *out)
{
    jdict *d = jv_new_tracked(rt, sizeof *d, type);
    if (!d)
        return jv_nomem(rt);
    *out = wrap(type, d);
    return 0;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_int(int64_t i)
{
    uint64_t z = (uint64_t)i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int hash_rec(jrt *rt, jv v, int depth, uint64_t *out)
{
    if (depth > JX_MAX_VALUE_DEPTH)
        return jv_fail(rt, RC_ELIMIT, "RecursionError: maximum recursion depth exceeded");
    switch (v.t) {
    case JV_NONE: *out = 0x6e6f6e65ull; return 0;
    case JV_BOOL: *out = hash_int(v.u.b); return 0;
    case JV_INT: *out = hash_int(v.u.i); return 0;
    case JV_FLOAT: {
        double f = v.u.f;
        if (f == floor(f) && f >= -9.2e18 && f <= 9.2e18) {
            *out = hash_int((int64_t)f);
        } else {
            uint64_t bits;
            memcpy(&bits, &f, sizeof bits);
            *out = hash_int((int64_t)bits);
        }
        return 0;
    }
    case JV_STR:
        *out = hash_bytes(jv_s(v)->s, jv_s(v)->len);
        return jv_tick_chars(rt, jv_s(v)->len);
    case JV_TUPLE: {
        uint64_t h = 0x345678ull;
        jlist *l = jv_l(v);
        for (size_t i = 0; i < l->n; i++) {
            uint64_t x;
            int rc = hash_rec(rt, l->items[i], depth + 1, &x);
            if (rc < 0)
                return rc;
            h = (h ^ x) * 1000003ull;
        }
        *out = h;
        return 0;
    }
    case JV_UNDEF:      /* Undefined hashes by type: all compare equal */
        *out = 0x756e646566ull;
        return 0;
    case JV_NS:
    case JV_ITER:
    case JV_FUNC:
    case JV_MACRO:
    case JV_LOOP:
        *out = hash_int((int64_t)(uintptr_t)v.u.o);
        return 0;
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: unhashable type: '%s'", jv_type_name(v));
    }
}

int jv_hash(jrt *rt, jv v, uint64_t *out) { return hash_rec(rt, v, 0, out); }

static void dict_reindex(jdict *d)
{
    if (!d->idx)
        return;
    memset(d->idx, 0, d->idx_cap * sizeof(uint32_t));
    size_t mask = d->idx_cap - 1;
    for (size_t i = 0; i < d->n; i++) {
        size_t k = d->e[i].hash & mask;
        while (d->idx[k])
            k = (k + 1) & mask;
        d->idx[k] = (uint32_t)(i + 1);
    }
}

int jv_dict_find(jrt *rt, const jdict *d, jv key, jentry **slot)
{
    uint64_t h;
    int rc = jv_hash(rt, key, &h);
    *slot = NULL;
    if (rc < 0)
        return rc;
    if (d->idx) {
        size_t mask = d->idx_cap - 1;
        for (size_t k = h & mask; d->idx[k]; k = (k + 1) & mask) {
            jentry *e = &d->e[d->idx[k] - 1];
            bool eq;
            if (e->hash != h)
                continue;
            if ((rc = jv_eq(rt, e->key, key, &eq)) < 0)
                return rc;
            if (eq) {
                *slot = e;
                return 0;
            }
        }
        return 0;
    }
    for (size_t i = 0; i < d->n; i++) {
        bool eq;
        if (d->e[i].hash != h)
            continue;
        if ((rc = jv_eq(rt, d->e[i].key, key, &eq)) < 0)
            return rc;
        if (eq) {
            *slot = &d->e[i];
            return 0;
        }
    }
    return 0;
}

jentry *jv_dict_find_str(const jdict *d, const char *key, size_t len)
{
    uint64_t h = hash_bytes(key, len);
    if (d->idx) {
        size_t mask = d->idx_cap - 1;
        for (size_t k = h & mask; d->idx[k]; k = (k + 1) & mask) {
            jentry *e = &d->e[d->idx[k] - 1];
            if (e->hash == h && e->key.t == JV_STR && jv_s(e->key)->len == len &&
                memcmp(jv_s(e->key)->s, key, len) == 0)
                return e;
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++) {
        jentry *e = &d->e[i];
        if (e->hash == h && e->key.t == JV_STR && jv_s(e->key)->len == len &&
            memcmp(jv_s(e->key)->s, key, len) == 0)
            return e;
    }
    return NULL;
}

int jv_dict_set(jrt *rt, jdict *d, jv key, jv val)
{
    jentry *e;
    int rc = jv_dict_find(rt, d, key, &e);
    if (rc < 0)
        return rc;
    if (e) {
        jv old = e->val;
        jv_incref(val);
        e->val = val;
        jv_decref(rt, old);
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jentry *ne = jv_realloc(rt, d->e, d->cap * sizeof(jentry), nc * sizeof(jentry));
        if (!ne)
            return jv_nomem(rt);
        d->e = ne;
        d->cap = nc;
    }
    uint64_t h;
    jv_hash(rt, key, &h);   /* cannot fail: find hashed it */
    jv_incref(key);
    jv_incref(val);
    d->e[d->n].key = key;
    d->e[d->n].val = val;
    d->e[d->n].hash = h;
    d->n++;
    if (d->n > 8 && d->n * 2 > d->idx_cap) {
        size_t nc = d->idx_cap ? d->idx_cap * 2 : 32;
        while (nc < d->n * 2)
            nc *= 2;
        uint32_t *ni = jv_realloc(rt, d->idx, d->idx_cap * sizeof(uint32_t), nc * sizeof(uint32_t));
        if (!ni) {
            /* fall back to linear search */
            jv_dealloc(rt, d->idx, d->idx_cap * sizeof(uint32_t));
            d->idx = NULL;
            d->idx_cap = 0;
            return 0;
        }
        d->idx = ni;
        d->idx_cap = nc;
        dict_reindex(d);
    } else if (d->idx) {
        size_t mask = d->idx_cap - 1, k = h & mask;
        while (d->idx[k])
            k = (k + 1) & mask;
        d->idx[k] = (uint32_t)d->n;
    }
    return 0;
}

int jv_dict_del(jrt *rt, jdict *d, jv key, bool *found, jv *old)
{
    jentry *e;
    int rc = jv_dict_find(rt, d, key, &e);
    *found = false;
    if (rc < 0 || !e)
        return rc;
    *found = true;
    size_t i = (size_t)(e - d->e);
    jv k = d->e[i].key;
    *old = d->e[i].val;        /* reference passes to the caller */
    memmove(&d->e[i], &d->e[i + 1], (d->n - i - 1) * sizeof(jentry));
    d->n--;
    dict_reindex(d);
    jv_decref(rt, k);
    return 0;
}

int jv_iter_new(jrt *rt, jv list_take, const char *pyname, jv *out)
{
    jiter *it = jv_new_tracked(rt, sizeof *it, JV_ITER);
    if (!it) {
        jv_decref(rt, list_take);
        return jv_nomem(rt);
    }
    it->items = jv_l(list_take);
    it->pyname = pyname;
    *out = wrap(JV_ITER, it);
    return 0;
}

int jv_func_new(jrt *rt, int fn, jv self, jv *out)
{
    jfunc *f = jv_new_tracked(rt, sizeof *f, JV_FUNC);
    if (!f)
        return jv_nomem(rt);
    f->fn = fn;
    jv_incref(self);
    f->self = self;
    *out = wrap(JV_FUNC, f);
    return 0;
}

/* ---- undefined --------------------------------------------------------------- */

static int undef_new(jrt *rt, const char *hint, const char *obj_repr, jv name, jv *out)
{
    jundef *u = jv_new_tracked(rt, sizeof *u, JV_UNDEF);
    if (!u)
        return jv_nomem(rt);
    u->hint = hint;
    u->obj_repr = obj_repr;
    jv_incref(name);
    u->name = name;
    *out = wrap(JV_UNDEF, u);
    return 0;
}

int jv_undef_name(jrt *rt, const char *name, jv *out)
{
    jv s;
    int rc = jv_cstr(rt, name, &s);
    if (rc < 0)
        return rc;
    rc = undef_new(rt, NULL, NULL, s, out);
    jv_decref(rt, s);
    return rc;
}

int jv_undef_missing(jrt *rt, jv obj, jv name, jv *out)
{
    return undef_new(rt, NULL, jv_obj_repr(obj), name, out);
}

int jv_undef_hint(jrt *rt, const char *hint, jv *out)
{
    return undef_new(rt, hint, NULL, jv_none(), out);
}

int jv_undef_raise(jrt *rt, jv v)
{
    if (v.t != JV_UNDEF || !v.u.o || v.u.o == &jinja__missing_obj)
        return jv_fail(rt, RC_EINVAL, "UndefinedError: None is undefined");
    jundef *u = (jundef *)v.u.o;
    if (u->hint)
        return jv_fail(rt, RC_EINVAL, "UndefinedError: %s", u->hint);
    jbuf b = {0};
    int rc = jv_write_repr(rt, u->name, &b);
    const char *nm = rc < 0 ? "?" : b.p ? b.p : "";
    if (!u->obj_repr)
        rc = jv_fail(rt, RC_EINVAL, "UndefinedError: %s is undefined", nm);
    else if (u->name.t != JV_STR)
        rc = jv_fail(rt, RC_EINVAL, "UndefinedError: %s has no element %s", u->obj_repr, nm);
    else
        rc = jv_fail(rt, RC_EINVAL, "UndefinedError: '%s' has no attribute %s", u->obj_repr, nm);
    jbuf_free(rt, &b);
    return rc;
}

/* ---- Python semantics ---------------------------------------------------------- */

bool jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b != 0;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return jv_s(v)->len != 0;
    case JV_LIST:
    case JV_TUPLE: return jv_l(v)->n != 0;
    case JV_DICT: return jv_d(v)->n != 0;
    case JV_LOOP: {
        jloop *lp = (jloop *)v.u.o;
        return lp->items && lp->items->n != 0;
    }
    default: return true;
    }
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return jv_is_markup(v) ? "Markup" : "str";
    case JV_LIST:
        return !jv_is_view(v) ? "list" : (v.u.o->flags & JL_KEYS) ? "dict_keys"
             : (v.u.o->flags & JL_VALUES) ? "dict_values" : "dict_items";
    case JV_TUPLE: return jv_is_range(v) ? "range" : "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_ITER: return ((jiter *)v.u.o)->pyname;
    case JV_FUNC: return "builtin_function_or_method";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    default: return "object";
    }
}

const char *jv_obj_repr(jv v)
{
    switch (v.t) {
    case JV_NONE: return "None";
    case JV_UNDEF: return "jinja2.runtime.Undefined object";
    case JV_STR: return jv_is_markup(v) ? "markupsafe.Markup object" : "str object";
    case JV_NS: return "jinja2.utils.Namespace object";
    case JV_MACRO: return "jinja2.runtime.Macro object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_LIST:
        return !jv_is_view(v) ? "list object" : (v.u.o->flags & JL_KEYS) ? "dict_keys object"
             : (v.u.o->flags & JL_VALUES) ? "dict_values object" : "dict_items object";
    case JV_TUPLE: return jv_is_range(v) ? "range object" : "tuple object";
    case JV_DICT: return "dict object";
    case JV_ITER:
        return strcmp(((jiter *)v.u.o)->pyname, "generator") == 0
                   ? "generator object" : "list_reverseiterator object";
    case JV_FUNC: return "builtin_function_or_method object";
    default: return "object";
    }
}

/* int == float exactly, as Python compares them. */
static bool int_eq_float(int64_t i, double f)
{
    if (f != floor(f) || f < -9.3e18 || f > 9.3e18)
        return false;
    if (f >= 9223372036854775807.0 || f < -9223372036854775808.0)
        return false;
    return (int64_t)f == i;
}

static int eq_rec(jrt *rt, jv a, jv b, int depth, bool *out)
{
    if (depth > JX_MAX_VALUE_DEPTH)
        return jv_fail(rt, RC_ELIMIT, "RecursionError: maximum recursion depth exceeded in comparison");
    *out = false;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT && b.t == JV_FLOAT)
            *out = a.u.f == b.u.f;
        else if (a.t == JV_FLOAT)
            *out = int_eq_float(jv_as_int(b), a.u.f);
        else if (b.t == JV_FLOAT)
            *out = int_eq_float(jv_as_int(a), b.u.f);
        else
            *out = jv_as_int(a) == jv_as_int(b);
        return 0;
    }
    if (a.t != b.t || jv_is_range(a) != jv_is_range(b) ||
        (a.t == JV_LIST && (a.u.o->flags & JL_VIEW) != (b.u.o->flags & JL_VIEW)))
        return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
        *out = true;
        return 0;
    case JV_STR:
        *out = jv_s(a)->len == jv_s(b)->len &&
               memcmp(jv_s(a)->s, jv_s(b)->s, jv_s(a)->len) == 0;
        return *out ? jv_tick_bytes(rt, jv_s(a)->len) : 0;
    case JV_LIST:
    case JV_TUPLE: {
        jlist *x = jv_l(a), *y = jv_l(b);
        if (x->n != y->n)
            return 0;
        int rc0 = jv_tick(rt, x->n / 2);
        if (rc0 < 0)
            return rc0;
        for (size_t i = 0; i < x->n; i++) {
            bool e;
            int rc = eq_rec(rt, x->items[i], y->items[i], depth + 1, &e);
            if (rc < 0 || !e)
                return rc;
        }
        *out = true;
        return 0;
    }
    case JV_DICT: {
        jdict *x = jv_d(a), *y = jv_d(b);
        if (x->n != y->n)
            return 0;
        int rc0 = jv_tick(rt, x->n / 2);
        if (rc0 < 0)
            return rc0;
        for (size_t i = 0; i < x->n; i++) {
            jentry *e;
            bool same;
            int rc = jv_dict_find(rt, y, x->e[i].key, &e);
            if (rc < 0)
                return rc;
            if (!e)
                return 0;
            if ((rc = eq_rec(rt, x->e[i].val, e->val, depth + 1, &same)) < 0 || !same)
                return rc;
        }
        *out = true;
        return 0;
    }
    case JV_FUNC: {
        jfunc *f = (jfunc *)a.u.o, *g = (jfunc *)b.u.o;
        *out = f == g || (f->fn == g->fn && jv_is_heap(f->self) && f->self.u.o == g->self.u.o);
        return 0;
    }
    default:
        *out = a.u.o == b.u.o;
        return 0;
    }
}

int jv_eq(jrt *rt, jv a, jv b, bool *out) { return eq_rec(rt, a, b, 0, out); }

static int cmp_rec(jrt *rt, jv a, jv b, const char *op, int depth, int *out)
{
    if (depth > JX_MAX_VALUE_DEPTH)
        return jv_fail(rt, RC_ELIMIT, "RecursionError: maximum recursion depth exceeded in comparison");
    if (a.t == JV_UNDEF)
        return jv_undef_raise(rt, a);
    if (b.t == JV_UNDEF)
        return jv_undef_raise(rt, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = jv_as_int(a), y = jv_as_int(b);
            *out = x < y ? -1 : x > y;
            return 0;
        }
        double x = jv_as_float(a), y = jv_as_float(b);
        *out = x < y ? -1 : x > y ? 1 : x == y ? 0 : 2;
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        jstr *x = jv_s(a), *y = jv_s(b);
        size_t n = x->len < y->len ? x->len : y->len;
        int c = memcmp(x->s, y->s, n);
        *out = c < 0 ? -1 : c > 0 ? 1 : x->len < y->len ? -1 : x->len > y->len;
        return jv_tick_bytes(rt, n);
    }
    if (jv_is_seq(a) && jv_is_seq(b) && a.t == b.t) {
        jlist *x = jv_l(a), *y = jv_l(b);
        size_t n = x->n < y->n ? x->n : y->n;
        for (size_t i = 0; i < n; i++) {
            bool eq;
            int rc = eq_rec(rt, x->items[i], y->items[i], depth + 1, &eq);
            if (rc < 0)
                return rc;
            if (!eq)
                return cmp_rec(rt, x->items[i], y->items[i], op, depth + 1, out);
        }
        *out = x->n < y->n ? -1 : x->n > y->n;
        return 0;
    }
    return jv_fail(rt, RC_EINVAL, "TypeError: '%s' not supported between instances of '%s' and '%s'",
                   op, jv_type_name(a), jv_type_name(b));
}

int jv_cmp(jrt *rt, jv a, jv b, const char *op, int *out) { return cmp_rec(rt, a, b, op, 0, out); }

bool jv_safe_repr(jv v, int depth)
{
    if (depth > JX_MAX_VALUE_DEPTH)
        return false;
    switch (v.t) {
    case JV_NONE: case JV_BOOL: case JV_INT: case JV_FLOAT: case JV_STR:
        return true;
    case JV_LIST:
    case JV_TUPLE:
        for (size_t i = 0; i < jv_l(v)->n; i++)
            if (!jv_safe_repr(jv_l(v)->items[i], depth + 1))
                return false;
        return true;
    case JV_DICT:
        for (size_t i = 0; i < jv_d(v)->n; i++)
            if (!jv_safe_repr(jv_d(v)->e[i].key, depth + 1) ||
                !jv_safe_repr(jv_d(v)->e[i].val, depth + 1))
                return false;
        return true;
    default:
        return false;
    }
}

int jv_len(jrt *rt, jv v, int64_t *out)
{
    switch (v.t) {
    case JV_UNDEF: *out = 0; return 0;
    case JV_STR: *out = (int64_t)jv_s(v)->nchars; return 0;
    case JV_LIST:
    case JV_TUPLE: *out = (int64_t)jv_l(v)->n; return 0;
    case JV_DICT: *out = (int64_t)jv_d(v)->n; return 0;
    case JV_LOOP: {
        jloop *lp = (jloop *)v.u.o;
        *out = lp->items ? (int64_t)lp->items->n : 0;
        return 0;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: object of type '%s' has no len()", jv_type_name(v));
    }
}

/* ---- str() and repr() ----------------------------------------------------------------- */

void jv_fmt_float(double f, char *buf)
{
    if (isnan(f)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(buf, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1;
    char *o = buf;
    if (neg)
        *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++)
                *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = '\0';
        return;
    }
    *o++ = digits[0];
    if (nd > 1) {
        *o++ = '.';
        memcpy(o, digits + 1, (size_t)(nd - 1));
        o += nd - 1;
    }
    snprintf(o, 16, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
}

static int write_rec(jrt *rt, jv v, jbuf *b, bool repr, int depth);

static int write_str_repr(jrt *rt, const jstr *s, jbuf *b)
{
    bool has_sq = memchr(s->s, '\'', s->len) != NULL;
    bool has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = jbuf_putc(rt, b, q);
    size_t i = 0, run = 0;
    while (rc == 0 && i < s->len) {
        size_t start = i;
        uint32_t c = ju_next(s->s, &i);
        char esc[16];
        int n = 0;
        if (c == (uint32_t)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            n = 2;
        } else if (c == '\t') {
            n = snprintf(esc, sizeof esc, "\\t");
        } else if (c == '\n') {
            n = snprintf(esc, sizeof esc, "\\n");
        } else if (c == '\r') {
            n = snprintf(esc, sizeof esc, "\\r");
        } else if (c < 0x20 || c == 0x7f) {
            n = snprintf(esc, sizeof esc, "\\x%02x", c);
        } else if (c >= 0x80 && !ju_isprintable(c)) {
            n = c <= 0xff ? snprintf(esc, sizeof esc, "\\x%02x", c)
              : c <= 0xffff ? snprintf(esc, sizeof esc, "\\u%04x", c)
                            : snprintf(esc, sizeof esc, "\\U%08x", c);
        }
        if (n == 0) {
            run += i - start;
            continue;
        }
        if (run)
            rc = jbuf_put(rt, b, s->s + start - run, run);
        run = 0;
        if (rc == 0)
            rc = jbuf_put(rt, b, esc, (size_t)n);
    }
    if (rc == 0 && run)
        rc = jbuf_put(rt, b, s->s + s->len - run, run);
    return rc ? rc : jbuf_putc(rt, b, q);
}

static int write_seq(jrt *rt, const jlist *l, jbuf *b, char open, char close, int depth)
{
    int rc = jbuf_putc(rt, b, open);
    for (size_t i = 0; rc == 0 && i < l->n; i++) {
        if (i)
            rc = jbuf_put(rt, b, ", ", 2);
        if (rc == 0)
            rc = write_rec(rt, l->items[i], b, true, depth + 1);
    }
    if (rc == 0 && open == '(' && l->n == 1)
        rc = jbuf_putc(rt, b, ',');
    return rc ? rc : jbuf_putc(rt, b, close);
}

static int write_dict(jrt *rt, const jdict *d, jbuf *b, int depth)
{
    int rc = jbuf_putc(rt, b, '{');
    for (size_t i = 0; rc == 0 && i < d->n; i++) {
        if (i)
            rc = jbuf_put(rt, b, ", ", 2);
        if (rc == 0)
            rc = write_rec(rt, d->e[i].key, b, true, depth + 1);
        if (rc == 0)
            rc = jbuf_put(rt, b, ": ", 2);
        if (rc == 0)
            rc = write_rec(rt, d->e[i].val, b, true, depth + 1);
    }
    return rc ? rc : jbuf_putc(rt, b, '}');
}

static int write_rec(jrt *rt, jv v, jbuf *b, bool repr, int depth)
{
    char tmp[96];
    if (depth > JX_MAX_VALUE_DEPTH)
        return jv_fail(rt, RC_ELIMIT, "RecursionError: maximum recursion depth exceeded while getting the repr of an object");
    switch (v.t) {
    case JV_UNDEF: return repr ? jbuf_puts(rt, b, "Undefined") : 0;
    case JV_NONE: return jbuf_puts(rt, b, "None");
    case JV_BOOL: return jbuf_puts(rt, b, v.u.b ? "True" : "False");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return jbuf_puts(rt, b, tmp);
    case JV_FLOAT:
        jv_fmt_float(v.u.f, tmp);
        return jbuf_puts(rt, b, tmp);
    case JV_STR:
        if (!repr)
            return jbuf_put(rt, b, jv_s(v)->s, jv_s(v)->len);
        if (jv_is_markup(v)) {
            int rc = jbuf_puts(rt, b, "Markup(");
            if (rc == 0)
                rc = write_str_repr(rt, jv_s(v), b);
            return rc ? rc : jbuf_putc(rt, b, ')');
        }
        return write_str_repr(rt, jv_s(v), b);
    case JV_LIST:
        if (jv_is_view(v)) {
            int rc = jbuf_puts(rt, b, jv_type_name(v));
            if (rc == 0)
                rc = jbuf_putc(rt, b, '(');
            if (rc == 0)
                rc = write_seq(rt, jv_l(v), b, '[', ']', depth);
            return rc ? rc : jbuf_putc(rt, b, ')');
        }
        return write_seq(rt, jv_l(v), b, '[', ']', depth);
    case JV_TUPLE:
        if (jv_is_range(v)) {
            const int64_t *r = jv_l(v)->rng;
            if (r[2] == 1)
                snprintf(tmp, sizeof tmp, "range(%" PRId64 ", %" PRId64 ")", r[0], r[1]);
            else
                snprintf(tmp, sizeof tmp, "range(%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                         r[0], r[1], r[2]);
            return jbuf_puts(rt, b, tmp);
        }
        return write_seq(rt, jv_l(v), b, '(', ')', depth);
    case JV_DICT: return write_dict(rt, jv_d(v), b, depth);
    case JV_NS: {
        int rc = jbuf_puts(rt, b, "<Namespace ");
        if (rc == 0)
            rc = write_dict(rt, jv_d(v), b, depth);
        return rc ? rc : jbuf_putc(rt, b, '>');
    }
    case JV_ITER:
        snprintf(tmp, sizeof tmp, "<%s object at %p>", ((jiter *)v.u.o)->pyname, (void *)v.u.o);
        return jbuf_puts(rt, b, tmp);
    case JV_FUNC:
        if (((jfunc *)v.u.o)->self.t == JV_NONE)
            snprintf(tmp, sizeof tmp, "<function %s at %p>",
                     jinja__func_name(((jfunc *)v.u.o)->fn), (void *)v.u.o);
        else
            snprintf(tmp, sizeof tmp, "<built-in method %s of %s at %p>",
                     jinja__func_name(((jfunc *)v.u.o)->fn),
                     jv_obj_repr(((jfunc *)v.u.o)->self), (void *)v.u.o);
        return jbuf_puts(rt, b, tmp);
    case JV_MACRO: {
        const jmacro *m = (const jmacro *)v.u.o;
        const char *nm = m->def->kind == N_MACRO ? m->def->name.s : "caller";
        snprintf(tmp, sizeof tmp, "<Macro '%.60s'>", nm);
        return jbuf_puts(rt, b, tmp);
    }
    case JV_LOOP: {
        const jloop *lp = (const jloop *)v.u.o;
        snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", lp->i + 1,
                 lp->items ? lp->items->n : 0);
        return jbuf_puts(rt, b, tmp);
    }
    default:
        return 0;
    }
}

int jv_write_str(jrt *rt, jv v, jbuf *b) { return write_rec(rt, v, b, false, 0); }
int jv_write_repr(jrt *rt, jv v, jbuf *b) { return write_rec(rt, v, b, true, 0); }

int jv_to_str(jrt *rt, jv v, jv *out)
{
    if (v.t == JV_STR) {
        jv_incref(v);
        *out = v;
        return 0;
    }
    jbuf b = {0};
    int rc = jv_write_str(rt, v, &b);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

/* ---- iteration ------------------------------------------------------------------- */

/* items[from, n) of a list as a new list. */
static int copy_items(jrt *rt, const jlist *src, size_t from, jv *out)
{
    size_t n = src->n > from ? src->n - from : 0;
    int rc = jv_list_new(rt, n, out);
    if (rc < 0)
        return rc;
    jlist *l = jv_l(*out);
    for (size_t i = 0; i < n; i++) {
        jv_incref(src->items[from + i]);
        l->items[i] = src->items[from + i];
    }
    l->n = n;
    return jv_tick(rt, n / 16);
}

int jv_items(jrt *rt, jv v, jv *out)
{
    int rc;
    switch (v.t) {
    case JV_UNDEF:
        return jv_list_new(rt, 0, out);
    case JV_LIST:
        return copy_items(rt, jv_l(v), 0, out);
    case JV_TUPLE:
        jv_incref(v);
        *out = v;
        return 0;
    case JV_DICT: {
        jdict *d = jv_d(v);
        if ((rc = jv_list_new(rt, d->n, out)) < 0)
            return rc;
        jlist *l = jv_l(*out);
        for (size_t i = 0; i < d->n; i++) {
            jv_incref(d->e[i].key);
            l->items[i] = d->e[i].key;
        }
        l->n = d->n;
        return jv_tick(rt, d->n / 16);
    }
    case JV_STR: {
        jstr *s = jv_s(v);
        if ((rc = jv_list_new(rt, s->nchars, out)) < 0)
            return rc;
        jlist *l = jv_l(*out);
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            ju_next(s->s, &i);
            jv c;
            if ((rc = jv_str_flags(rt, s->s + st, i - st, 0, &c)) < 0 ||
                (rc = jv_list_push_take(rt, l, c)) < 0) {
                jv_clear(rt, out);
                return rc;
            }
        }
        return jv_tick(rt, s->nchars / 4);
    }
    case JV_ITER: {
        jiter *it = (jiter *)v.u.o;
        if (!it->items)
            rc = jv_list_new(rt, 0, out);
        else
            rc = copy_items(rt, it->items, it->pos, out);
        if (it->items)
            it->pos = it->items->n;
        if (rc == 0 && it->err) {
            jv_clear(rt, out);
            return jv_fail(rt, it->err_rc, "%s", it->err);
        }
        return rc;
    }
    case JV_LOOP: {
        jloop *lp = (jloop *)v.u.o;
        if (!lp->items)
            return jv_list_new(rt, 0, out);
        return copy_items(rt, lp->items, lp->i + 1, out);
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- JSON ---------------------------------------------------------------------------- */

static int from_json_rec(jrt *rt, const json_t *j, int depth, jv *out)
{
    int rc;
    if (depth > 512)
        return jv_fail(rt, RC_ELIMIT, "LimitError: input JSON nested more than 512 levels");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return 0;
    case JSON_TRUE: *out = jv_bool(true); return 0;
    case JSON_FALSE: *out = jv_bool(false); return 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (!ju_valid(s, n))
            return jv_fail(rt, RC_EINVAL, "ValueError: input string is not valid UTF-8");
        return jv_str(rt, s, n, out);
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if ((rc = jv_list_new(rt, n, out)) < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            jv x;
            if ((rc = from_json_rec(rt, json_array_get(j, i), depth + 1, &x)) < 0 ||
                (rc = jv_list_push_take(rt, jv_l(*out), x)) < 0) {
                jv_clear(rt, out);
                return rc;
            }
        }
        return 0;
    }
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        if ((rc = jv_dict_new(rt, JV_DICT, out)) < 0)
            return rc;
        json_object_foreach((json_t *)j, key, val) {
            jv k, x;
            if ((rc = jv_cstr(rt, key, &k)) < 0)
                goto obj_fail;
            if ((rc = from_json_rec(rt, val, depth + 1, &x)) < 0) {
                jv_decref(rt, k);
                goto obj_fail;
            }
            rc = jv_dict_set(rt, jv_d(*out), k, x);
            jv_decref(rt, k);
            jv_decref(rt, x);
            if (rc < 0)
                goto obj_fail;
        }
        return 0;
obj_fail:
        jv_clear(rt, out);
        return rc;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: unsupported JSON value");
    }
}

int jv_from_json(jrt *rt, const json_t *j, jv *out) { return from_json_rec(rt, j, 0, out); }

static int json_str_out(jrt *rt, const char *s, size_t len, bool ensure_ascii, jbuf *b)
{
    int rc = jbuf_putc(rt, b, '"');
    size_t i = 0, run = 0;
    while (rc == 0 && i < len) {
        size_t st = i;
        uint32_t c = ju_next(s, &i);
        char esc[16];
        int n = 0;
        switch (c) {
        case '"': n = snprintf(esc, sizeof esc, "\\\""); break;
        case '\\': n = snprintf(esc, sizeof esc, "\\\\"); break;
        case '\n': n = snprintf(esc, sizeof esc, "\\n"); break;
        case '\r': n = snprintf(esc, sizeof esc, "\\r"); break;
        case '\t': n = snprintf(esc, sizeof esc, "\\t"); break;
        case '\b': n = snprintf(esc, sizeof esc, "\\b"); break;
        case '\f': n = snprintf(esc, sizeof esc, "\\f"); break;
        default:
            if (c < 0x20) {
                n = snprintf(esc, sizeof esc, "\\u%04x", c);
            } else if (ensure_ascii && c >= 0x7f) {
                if (c < 0x10000) {
                    n = snprintf(esc, sizeof esc, "\\u%04x", c);
                } else {
                    uint32_t v = c - 0x10000;
                    n = snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                                 0xDC00 + (v & 0x3FF));
                }
            }
        }
        if (n == 0) {
            run += i - st;
            continue;
        }
        if (run)
            rc = jbuf_put(rt, b, s + st - run, run);
        run = 0;
        if (rc == 0)
            rc = jbuf_put(rt, b, esc, (size_t)n);
    }
    if (rc == 0 && run)
        rc = jbuf_put(rt, b, s + len - run, run);
    return rc ? rc : jbuf_putc(rt, b, '"');
}

static int json_newline(jrt *rt, const jjson_opts *o, int level, jbuf *b)
{
    int rc = jbuf_putc(rt, b, '\n');
    for (int i = 0; rc == 0 && i < level; i++)
        rc = jbuf_put(rt, b, o->indent, o->indent_len);
    return rc;
}

static int json_rec(jrt *rt, jv v, const jjson_opts *o, int level, jbuf *b);

static int json_key(jrt *rt, jv k, const jjson_opts *o, jbuf *b)
{
    char tmp[64];
    switch (k.t) {
    case JV_STR: return json_str_out(rt, jv_s(k)->s, jv_s(k)->len, o->ensure_ascii, b);
    case JV_BOOL: return jbuf_puts(rt, b, k.u.b ? "\"true\"" : "\"false\"");
    case JV_NONE: return jbuf_puts(rt, b, "\"null\"");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "\"%" PRId64 "\"", k.u.i);
        return jbuf_puts(rt, b, tmp);
    case JV_FLOAT:
        if (isnan(k.u.f))
            return jbuf_puts(rt, b, "\"NaN\"");
        if (isinf(k.u.f))
            return jbuf_puts(rt, b, k.u.f > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        tmp[0] = '"';
        jv_fmt_float(k.u.f, tmp + 1);
        strcat(tmp, "\"");
        return jbuf_puts(rt, b, tmp);
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: keys must be str, int, float, bool or None, not %s",
                       jv_type_name(k));
    }
}

static int json_rec(jrt *rt, jv v, const jjson_opts *o, int level, jbuf *b)
{
    char tmp[64];
    int rc = 0;
    if (level > JX_MAX_VALUE_DEPTH)
        return jv_fail(rt, RC_ELIMIT, "ValueError: Circular reference detected");
    switch (v.t) {
    case JV_NONE: return jbuf_puts(rt, b, "null");
    case JV_BOOL: return jbuf_puts(rt, b, v.u.b ? "true" : "false");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return jbuf_puts(rt, b, tmp);
    case JV_FLOAT:
        if (isnan(v.u.f))
            return jbuf_puts(rt, b, "NaN");
        if (isinf(v.u.f))
            return jbuf_puts(rt, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        jv_fmt_float(v.u.f, tmp);
        return jbuf_puts(rt, b, tmp);
    case JV_STR: return json_str_out(rt, jv_s(v)->s, jv_s(v)->len, o->ensure_ascii, b);
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = jv_l(v);
        if (jv_is_range(v) || jv_is_view(v))
            return jv_fail(rt, RC_EINVAL, "TypeError: Object of type %s is not JSON serializable",
                           jv_type_name(v));
        if (l->n == 0)
            return jbuf_puts(rt, b, "[]");
        rc = jbuf_putc(rt, b, '[');
        for (size_t i = 0; rc == 0 && i < l->n; i++) {
            if (i)
                rc = jbuf_put(rt, b, o->item_sep, o->item_sep_len);
            if (rc == 0 && o->indent)
                rc = json_newline(rt, o, level + 1, b);
            if (rc == 0)
                rc = json_rec(rt, l->items[i], o, level + 1, b);
        }
        if (rc == 0 && o->indent)
            rc = json_newline(rt, o, level, b);
        return rc ? rc : jbuf_putc(rt, b, ']');
    }
    case JV_DICT: {
        jdict *d = jv_d(v);
        if (d->n == 0)
            return jbuf_puts(rt, b, "{}");
        size_t *order = NULL;
        if (o->sort_keys) {
            order = rc_malloc(d->n * sizeof *order);
            if (!order)
                return jv_nomem(rt);
            for (size_t i = 0; i < d->n; i++)
                order[i] = i;
            /* insertion sort keeps it simple and stable; dicts are small */
            for (size_t i = 1; rc == 0 && i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c;
                    if ((rc = jv_cmp(rt, d->e[order[j - 1]].key, d->e[x].key, "<", &c)) < 0)
                        break;
                    if (c <= 0)
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        if (rc == 0)
            rc = jbuf_putc(rt, b, '{');
        for (size_t i = 0; rc == 0 && i < d->n; i++) {
            jentry *e = &d->e[order ? order[i] : i];
            if (i)
                rc = jbuf_put(rt, b, o->item_sep, o->item_sep_len);
            if (rc == 0 && o->indent)
                rc = json_newline(rt, o, level + 1, b);
            if (rc == 0)
                rc = json_key(rt, e->key, o, b);
            if (rc == 0)
                rc = jbuf_put(rt, b, o->key_sep, o->key_sep_len);
            if (rc == 0)
                rc = json_rec(rt, e->val, o, level + 1, b);
        }
        rc_free(order);
        if (rc == 0 && o->indent)
            rc = json_newline(rt, o, level, b);
        return rc ? rc : jbuf_putc(rt, b, '}');
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: Object of type %s is not JSON serializable",
                       jv_type_name(v));
    }
}

int jv_write_json(jrt *rt, jv v, const jjson_opts *o, jbuf *b)
{
    return json_rec(rt, v, o, 0, b);
}
