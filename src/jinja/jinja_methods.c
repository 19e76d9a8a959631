/* jinja_methods.c - attribute and item access, list/dict/loop methods and
 * the builtin globals.
 *
 * Access follows jinja2's sandboxed environment exactly, because templates
 * depend on its quirks: `x.name` tries the Python attribute first and then
 * the item (so `tool.items` is dict.items even when the dict has an "items"
 * key), `x['name']` tries the item first and then the attribute, a miss
 * gives an undefined value that remembers what was missing, and dunder
 * attributes are never exposed.  Methods are bound when looked up (a
 * JV_FUNC holding the receiver) and run by jinja__call_builtin.
 */
#include "jinja/jinja_internal.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"

enum {
    JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE,
    JF_L_APPEND, JF_L_EXTEND, JF_L_INSERT, JF_L_POP, JF_L_REMOVE, JF_L_INDEX,
    JF_L_COUNT, JF_L_REVERSE, JF_L_SORT, JF_L_COPY, JF_L_CLEAR,
    JF_D_ITEMS, JF_D_KEYS, JF_D_VALUES, JF_D_GET, JF_D_POP, JF_D_SETDEFAULT,
    JF_D_UPDATE, JF_D_COPY, JF_D_CLEAR, JF_D_POPITEM,
    JF_LOOP_CYCLE, JF_LOOP_CHANGED,
    JF_STR_BASE = 64
};

static const struct { const char *name; int fn; int type; } FUNCS[] = {
    {"range", JF_RANGE, JV_NONE}, {"namespace", JF_NAMESPACE, JV_NONE},
    {"dict", JF_DICT, JV_NONE}, {"raise_exception", JF_RAISE, JV_NONE},
    {"append", JF_L_APPEND, JV_LIST}, {"extend", JF_L_EXTEND, JV_LIST},
    {"insert", JF_L_INSERT, JV_LIST}, {"pop", JF_L_POP, JV_LIST},
    {"remove", JF_L_REMOVE, JV_LIST}, {"index", JF_L_INDEX, JV_LIST},
    {"count", JF_L_COUNT, JV_LIST}, {"reverse", JF_L_REVERSE, JV_LIST},
    {"sort", JF_L_SORT, JV_LIST}, {"copy", JF_L_COPY, JV_LIST},
    {"clear", JF_L_CLEAR, JV_LIST},
    {"index", JF_L_INDEX, JV_TUPLE}, {"count", JF_L_COUNT, JV_TUPLE},
    {"items", JF_D_ITEMS, JV_DICT}, {"keys", JF_D_KEYS, JV_DICT},
    {"values", JF_D_VALUES, JV_DICT}, {"get", JF_D_GET, JV_DICT},
    {"pop", JF_D_POP, JV_DICT}, {"setdefault", JF_D_SETDEFAULT, JV_DICT},
    {"update", JF_D_UPDATE, JV_DICT}, {"copy", JF_D_COPY, JV_DICT},
    {"clear", JF_D_CLEAR, JV_DICT}, {"popitem", JF_D_POPITEM, JV_DICT},
    {"cycle", JF_LOOP_CYCLE, JV_LOOP}, {"changed", JF_LOOP_CHANGED, JV_LOOP},
};

const char *jinja__func_name(int fn)
{
    if (fn >= JF_STR_BASE)
        return jinja__str_method_name(fn - JF_STR_BASE);
    for (size_t i = 0; i < sizeof FUNCS / sizeof FUNCS[0]; i++)
        if (FUNCS[i].fn == fn)
            return FUNCS[i].name;
    return "?";
}

static int method_of(int type, const char *name)
{
    for (size_t i = 0; i < sizeof FUNCS / sizeof FUNCS[0]; i++)
        if (FUNCS[i].type == type && strcmp(FUNCS[i].name, name) == 0)
            return FUNCS[i].fn;
    return -1;
}

/* ---- argument binding --------------------------------------------------------- */

int jinja__bind(jrt *rt, const char *fname, const char *names, const jcall *a, jv *slots,
                size_t n)
{
    const char *pn[12];
    size_t pl[12];
    bool req[12];
    size_t np = 0;
    for (const char *p = names; *p && np < 12 && np < n;) {
        req[np] = *p == '!';
        if (req[np])
            p++;
        const char *e = strchr(p, ',');
        pn[np] = p;
        pl[np] = e ? (size_t)(e - p) : strlen(p);
        np++;
        p = e ? e + 1 : p + strlen(p);
    }
    for (size_t i = 0; i < n; i++)
        slots[i] = jv_missing_val();
    if (a->n_pos > np) {
        /* counted as Python does, with the filtered value as argument 1 */
        size_t n_req = 1;
        for (size_t i = 0; i < np; i++)
            n_req += req[i];
        if (n_req == np + 1)
            return jv_fail(rt, RC_EINVAL, "TypeError: %s() takes %zu positional argument%s but %zu "
                           "were given", fname, np + 1, np ? "s" : "", a->n_pos + 1);
        return jv_fail(rt, RC_EINVAL, "TypeError: %s() takes from %zu to %zu positional arguments "
                       "but %zu were given", fname, n_req, np + 1, a->n_pos + 1);
    }
    for (size_t i = 0; i < a->n_pos; i++)
        slots[i] = a->pos[i];
    for (size_t k = 0; k < a->n_kw; k++) {
        const char *kn = a->kw_names[k].s;
        size_t i;
        for (i = 0; i < np; i++)
            if (strlen(kn) == pl[i] && memcmp(kn, pn[i], pl[i]) == 0)
                break;
        if (i == np)
            return jv_fail(rt, RC_EINVAL, "TypeError: %s() got an unexpected keyword argument '%s'",
                           fname, kn);
        if (!jv_missing(slots[i]))
            return jv_fail(rt, RC_EINVAL, "TypeError: %s() got multiple values for argument '%s'",
                           fname, kn);
        slots[i] = a->kw[k];
    }
    for (size_t i = 0; i < np; i++)
        if (req[i] && jv_missing(slots[i]))
            return jv_fail(rt, RC_EINVAL, "TypeError: %s() missing 1 required positional "
                           "argument: '%.*s'", fname, (int)pl[i], pn[i]);
    return 0;
}

/* ---- attribute and item access ---------------------------------------------------- */

static int loop_attr(jrt *rt, jloop *lp, jv self, const char *name, jv *out, bool *found)
{
    size_t n = lp->items ? lp->items->n : 0, i = lp->i;
    *found = true;
    if (strcmp(name, "index0") == 0) *out = jv_int((int64_t)i);
    else if (strcmp(name, "index") == 0) *out = jv_int((int64_t)i + 1);
    else if (strcmp(name, "revindex") == 0) *out = jv_int((int64_t)(n - i));
    else if (strcmp(name, "revindex0") == 0) *out = jv_int((int64_t)(n - i) - 1);
    else if (strcmp(name, "first") == 0) *out = jv_bool(i == 0);
    else if (strcmp(name, "last") == 0) *out = jv_bool(i + 1 == n);
    else if (strcmp(name, "length") == 0) *out = jv_int((int64_t)n);
    else if (strcmp(name, "depth") == 0) *out = jv_int(lp->depth);
    else if (strcmp(name, "depth0") == 0) *out = jv_int((int64_t)lp->depth - 1);
    else if (strcmp(name, "previtem") == 0) {
        if (i == 0)
            return jv_undef_hint(rt, "there is no previous item", out);
        *out = lp->items->items[i - 1];
        jv_incref(*out);
    } else if (strcmp(name, "nextitem") == 0) {
        if (i + 1 >= n)
            return jv_undef_hint(rt, "there is no next item", out);
        *out = lp->items->items[i + 1];
        jv_incref(*out);
    } else {
        int fn = method_of(JV_LOOP, name);
        if (fn < 0) {
            *found = false;
            return 0;
        }
        return jv_func_new(rt, fn, self, out);
    }
    return 0;
}

int jinja__pyattr(jrt *rt, jv obj, const char *name, jv *out, bool *found)
{
    *found = false;
    if (name[0] == '_' && name[1] == '_') {
        /* dunder attributes exist on everything; the sandbox hides them */
        *found = true;
        return jv_undef_hint(rt, "access to a private attribute is unsafe", out);
    }
    int fn = -1;
    switch (obj.t) {
    case JV_STR:
        fn = jinja__str_method_id(name);
        if (fn >= 0)
            fn += JF_STR_BASE;
        break;
    case JV_LIST:
        if (jv_is_view(obj))
            return 0;
        fn = method_of(obj.t, name);
        break;
    case JV_DICT:
        fn = method_of(obj.t, name);
        break;
    case JV_TUPLE:
        if (obj.u.o->flags & JL_GROUP) {
            int k = strcmp(name, "grouper") == 0 ? 0 : strcmp(name, "list") == 0 ? 1 : -1;
            if (k >= 0 && jv_l(obj)->n == 2) {
                *found = true;
                *out = jv_l(obj)->items[k];
                jv_incref(*out);
                return 0;
            }
        }
        if (jv_is_range(obj)) {
            int k = strcmp(name, "start") == 0 ? 0 : strcmp(name, "stop") == 0 ? 1
                  : strcmp(name, "step") == 0 ? 2 : -1;
            if (k >= 0) {
                *found = true;
                *out = jv_int(jv_l(obj)->rng[k]);
                return 0;
            }
        }
        fn = method_of(JV_TUPLE, name);
        break;
    case JV_NS: {
        jentry *e = jv_dict_find_str(jv_d(obj), name, strlen(name));
        if (e) {
            *found = true;
            *out = e->val;
            jv_incref(*out);
        }
        return 0;
    }
    case JV_LOOP:
        return loop_attr(rt, (jloop *)obj.u.o, obj, name, out, found);
    default:
        return 0;
    }
    if (fn < 0)
        return 0;
    *found = true;
    return jv_func_new(rt, fn, obj, out);
}

static int missing_attr(jrt *rt, jv obj, const char *name, jv *out)
{
    jv nm;
    int rc = jv_cstr(rt, name, &nm);
    if (rc < 0)
        return rc;
    rc = jv_undef_missing(rt, obj, nm, out);
    jv_decref(rt, nm);
    return rc;
}

int jinja__getattr(jrt *rt, jv obj, const char *name, jv *out)
{
    bool found;
    if (obj.t == JV_UNDEF)
        return jv_undef_raise(rt, obj);
    int rc = jinja__pyattr(rt, obj, name, out, &found);
    if (rc < 0 || found)
        return rc;
    if (obj.t == JV_DICT) {
        jentry *e = jv_dict_find_str(jv_d(obj), name, strlen(name));
        if (e) {
            *out = e->val;
            jv_incref(*out);
            return 0;
        }
    }
    return missing_attr(rt, obj, name, out);
}

int jinja__getitem(jrt *rt, jv obj, jv key, jv *out)
{
    int rc;
    if (obj.t == JV_UNDEF)
        return jv_undef_raise(rt, obj);
    switch (obj.t) {
    case JV_DICT: {
        jentry *e = NULL;
        uint64_t h;
        if (jv_hash(rt, key, &h) == 0 && (rc = jv_dict_find(rt, jv_d(obj), key, &e)) < 0)
            return rc;
        if (e) {
            *out = e->val;
            jv_incref(*out);
            return 0;
        }
        break;
    }
    case JV_LIST:
    case JV_TUPLE:
    case JV_STR:
        if (jv_is_intlike(key) && !jv_is_view(obj)) {
            int64_t i = jv_as_int(key);
            int64_t n = obj.t == JV_STR ? (int64_t)jv_s(obj)->nchars : (int64_t)jv_l(obj)->n;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n) {
                if (obj.t != JV_STR) {
                    *out = jv_l(obj)->items[i];
                    jv_incref(*out);
                    return 0;
                }
                const jstr *s = jv_s(obj);
                size_t b = s->nchars == s->len ? (size_t)i : ju_offset(s->s, s->len, (size_t)i);
                size_t e = b;
                if ((rc = jv_tick_chars(rt, s->nchars == s->len ? 0 : b)) < 0)
                    return rc;
                ju_next(s->s, &e);
                return jv_str_flags(rt, s->s + b, e - b, s->h.flags & JS_MARKUP, out);
            }
        }
        break;
    default:
        break;
    }
    if (key.t == JV_STR) {
        bool found;
        if ((rc = jinja__pyattr(rt, obj, jv_s(key)->s, out, &found)) < 0 || found)
            return rc;
    }
    return jv_undef_missing(rt, obj, key, out);
}

int jinja__slice(jrt *rt, jv obj, jv start, jv stop, jv step, jv *out)
{
    if (obj.t == JV_UNDEF)
        return jv_undef_raise(rt, obj);
    if (obj.t == JV_DICT)
        return jv_fail(rt, RC_EINVAL, "TypeError: unhashable type: 'slice'");
    if ((obj.t != JV_STR && obj.t != JV_LIST && obj.t != JV_TUPLE) || jv_is_view(obj))
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object is not subscriptable",
                       jv_type_name(obj));
    const jv b3[3] = {start, stop, step};
    int64_t v[3] = {0, 0, 1};
    bool given[3];
    for (int i = 0; i < 3; i++) {
        given[i] = b3[i].t != JV_NONE;
        if (given[i] && !jv_is_intlike(b3[i]))
            return jv_fail(rt, RC_EINVAL, "TypeError: slice indices must be integers or None "
                                          "or have an __index__ method");
        if (given[i])
            v[i] = jv_as_int(b3[i]);
    }
    if (given[2] && v[2] == 0)
        return jv_fail(rt, RC_EINVAL, "ValueError: slice step cannot be zero");
    int64_t len = obj.t == JV_STR ? (int64_t)jv_s(obj)->nchars : (int64_t)jv_l(obj)->n;
    int64_t st = v[2], lo, hi;
    if (st > 0) {
        lo = given[0] ? v[0] : 0;
        hi = given[1] ? v[1] : len;
        if (lo < 0 && (lo += len) < 0)
            lo = 0;
        else if (lo > len)
            lo = len;
        if (hi < 0 && (hi += len) < 0)
            hi = 0;
        else if (hi > len)
            hi = len;
    } else {
        lo = given[0] ? v[0] : len - 1;
        hi = given[1] ? v[1] : -1;
        if (given[0]) {
            if (lo < 0 && (lo += len) < 0)
                lo = -1;
            else if (lo >= len)
                lo = len - 1;
        }
        if (given[1]) {
            if (hi < 0 && (hi += len) < 0)
                hi = -1;
            else if (hi >= len)
                hi = len - 1;
        }
    }
    int64_t count = 0;
    if (st > 0 && hi > lo)
        count = (hi - lo - 1) / st + 1;
    else if (st < 0 && lo > hi)
        count = (lo - hi - 1) / (-st) + 1;
    int rc = jv_tick(rt, (uint64_t)count / 16);
    if (rc < 0)
        return rc;
    if (obj.t == JV_STR) {
        const jstr *s = jv_s(obj);
        unsigned fl = s->h.flags & JS_MARKUP;
        if (s->nchars == s->len && st == 1)
            return jv_str_flags(rt, s->s + lo, (size_t)count, fl, out);
        size_t *off = rc_malloc((s->nchars + 1) * sizeof *off);
        if (!off)
            return jv_nomem(rt);
        for (size_t i = 0, k = 0; i <= s->len && k <= s->nchars; k++) {
            off[k] = i;
            if (i == s->len)
                break;
            ju_next(s->s, &i);
        }
        jbuf b = {0};
        for (int64_t k = 0, i = lo; k < count && rc == 0; k++, i += st)
            rc = jbuf_put(rt, &b, s->s + off[i], off[i + 1] - off[i]);
        rc_free(off);
        if (rc < 0) {
            jbuf_free(rt, &b);
            return rc;
        }
        return jv_str_from_buf(rt, &b, fl, out);
    }
    if (jv_is_range(obj)) {
        const int64_t *r = jv_l(obj)->rng;
        return jinja__range(rt, r[0] + lo * r[2], r[0] + hi * r[2], r[2] * st, count, out);
    }
    if ((rc = jv_list_new(rt, (size_t)count, out)) < 0)
        return rc;
    for (int64_t k = 0, i = lo; k < count; k++, i += st)
        jv_list_push(rt, jv_l(*out), jv_l(obj)->items[i]);
    if (obj.t == JV_TUPLE) {
        out->t = JV_TUPLE;
        out->u.o->type = JV_TUPLE;
    }
    return 0;
}

/* ---- globals --------------------------------------------------------------------------- */

bool jinja__global(jrt *rt, const char *name, jv *out, int *rc)
{
    int fn = method_of(JV_NONE, name);
    if (fn < 0)
        return false;
    *rc = jv_func_new(rt, fn, jv_none(), out);
    return true;
}

static int g_range(jrt *rt, const jcall *a, jv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (a->n_kw)
        return jv_fail(rt, RC_EINVAL, "TypeError: range() takes no keyword arguments");
    if (a->n_pos < 1 || a->n_pos > 3)
        return jv_fail(rt, RC_EINVAL, "TypeError: range expected at most 3 arguments, got %zu", a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) {
        int rc = jinja__int_arg(rt, a->pos[i], &v[a->n_pos == 1 ? 1 : i]);
        if (rc < 0)
            return rc;
    }
    if (v[2] == 0)
        return jv_fail(rt, RC_EINVAL, "ValueError: range() arg 3 must not be zero");
    int64_t n = 0;
    if (v[2] > 0 && v[1] > v[0])
        n = (int64_t)(((uint64_t)v[1] - (uint64_t)v[0] - 1) / (uint64_t)v[2] + 1);
    else if (v[2] < 0 && v[0] > v[1])
        n = (int64_t)(((uint64_t)v[0] - (uint64_t)v[1] - 1) / (uint64_t)(-(v[2] + 1) + 1) + 1);
    if (n > JX_MAX_RANGE || n < 0)
        return jv_fail(rt, RC_EINVAL, "OverflowError: Range too big. The sandbox blocks ranges "
                                      "larger than MAX_RANGE (%d).", JX_MAX_RANGE);
    return jinja__range(rt, v[0], v[1], v[2], n, out);
}

int jinja__range(jrt *rt, int64_t start, int64_t stop, int64_t step, int64_t n, jv *out)
{
    int rc = jv_tuple_new(rt, (size_t)n, out);
    if (rc < 0)
        return rc;
    jlist *l = jv_l(*out);
    out->u.o->flags |= JL_RANGE;
    l->rng[0] = start;
    l->rng[1] = stop;
    l->rng[2] = step;
    for (int64_t i = 0; i < n; i++)
        l->items[i] = jv_int(start + i * step);
    return jv_tick(rt, (uint64_t)n / 16);
}

/* dict(*args, **kwargs) into d: a mapping or an iterable of pairs. */
static int dict_fill(jrt *rt, const char *fname, jdict *d, const jcall *a)
{
    int rc = 0;
    if (a->n_pos > 1)
        return jv_fail(rt, RC_EINVAL, "TypeError: %s expected at most 1 argument, got %zu",
                       fname, a->n_pos);
    if (a->n_pos == 1) {
        jv src = a->pos[0];
        if (src.t == JV_DICT || src.t == JV_NS) {
            jdict *s = jv_d(src);
            for (size_t i = 0; i < s->n && rc == 0; i++)
                rc = jv_dict_set(rt, d, s->e[i].key, s->e[i].val);
        } else {
            jv items;
            if ((rc = jv_items(rt, src, &items)) < 0)
                return rc;
            jlist *l = jv_l(items);
            for (size_t i = 0; i < l->n && rc == 0; i++) {
                jv pair;
                if ((rc = jv_items(rt, l->items[i], &pair)) < 0)
                    break;
                if (jv_l(pair)->n != 2)
                    rc = jv_fail(rt, RC_EINVAL, "ValueError: dictionary update sequence element #%zu "
                                                "has length %zu; 2 is required", i, jv_l(pair)->n);
                else
                    rc = jv_dict_set(rt, d, jv_l(pair)->items[0], jv_l(pair)->items[1]);
                jv_decref(rt, pair);
            }
            jv_decref(rt, items);
        }
    }
    for (size_t k = 0; k < a->n_kw && rc == 0; k++) {
        jv key;
        if ((rc = jv_cstr(rt, a->kw_names[k].s, &key)) < 0)
            break;
        rc = jv_dict_set(rt, d, key, a->kw[k]);
        jv_decref(rt, key);
    }
    return rc;
}

static int g_mapping(jrt *rt, int type, const jcall *a, jv *out)
{
    int rc = jv_dict_new(rt, type, out);
    if (rc < 0)
        return rc;
    if ((rc = dict_fill(rt, type == JV_NS ? "Namespace" : "dict", jv_d(*out), a)) < 0)
        jv_clear(rt, out);
    return rc;
}

static int g_raise(jrt *rt, const jcall *a)
{
    jbuf b = {0};
    int rc = 0;
    if (a->n_pos >= 1)
        rc = jv_write_str(rt, a->pos[0], &b);
    if (rc == 0) {
        rt->err_plain = true;
        rc = jv_fail(rt, RC_EINVAL, "TemplateError: %s", b.p ? b.p : "");
    }
    jbuf_free(rt, &b);
    return rc;
}

/* ---- list methods ------------------------------------------------------------------------ */

/* Stable merge sort of items by keys (keys may alias items). */
static int merge_sort(jrt *rt, jv *items, jv *keys, size_t n, bool reverse)
{
    if (n < 2)
        return 0;
    jv *ti = rc_malloc(n * sizeof *ti), *tk = rc_malloc(n * sizeof *tk);
    int rc = 0;
    if (!ti || !tk) {
        rc_free(ti);
        rc_free(tk);
        return jv_nomem(rt);
    }
    for (size_t w = 1; w < n && rc == 0; w *= 2) {
        for (size_t lo = 0; lo < n && rc == 0; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                /* take from the right only when it sorts strictly before */
                if ((rc = jv_cmp(rt, keys[j], keys[i], "<", &c)) < 0)
                    break;
                bool right_first = reverse ? (c == 1) : (c == -1);
                if (right_first) {
                    ti[k] = items[j];
                    tk[k++] = keys[j++];
                } else {
                    ti[k] = items[i];
                    tk[k++] = keys[i++];
                }
            }
            if (rc < 0)
                break;
            while (i < mid) {
                ti[k] = items[i];
                tk[k++] = keys[i++];
            }
            while (j < hi) {
                ti[k] = items[j];
                tk[k++] = keys[j++];
            }
            memcpy(items + lo, ti + lo, (hi - lo) * sizeof *ti);
            if (keys != items)
                memcpy(keys + lo, tk + lo, (hi - lo) * sizeof *tk);
        }
        if (rc == 0)
            rc = jv_tick(rt, n / 8);
    }
    rc_free(ti);
    rc_free(tk);
    return rc;
}

int jinja__sort(jrt *rt, jv *items, jv *keys, size_t n, bool reverse)
{
    return merge_sort(rt, items, keys ? keys : items, n, reverse);
}

static int list_method(jrt *rt, int fn, jv self, const jcall *a, jv *out)
{
    jlist *l = jv_l(self);
    jv p[3];
    int rc;
    bool eq;
    *out = jv_none();
    switch (fn) {
    case JF_L_APPEND:
        if ((rc = jinja__bind(rt, "append", "!object", a, p, 1)) < 0)
            return rc;
        return jv_list_push(rt, l, p[0]);
    case JF_L_EXTEND: {
        if ((rc = jinja__bind(rt, "extend", "!iterable", a, p, 1)) < 0)
            return rc;
        jv items;
        if ((rc = jv_items(rt, p[0], &items)) < 0)
            return rc;
        for (size_t i = 0; i < jv_l(items)->n && rc == 0; i++)
            rc = jv_list_push(rt, l, jv_l(items)->items[i]);
        jv_decref(rt, items);
        return rc;
    }
    case JF_L_INSERT: {
        int64_t i;
        if ((rc = jinja__bind(rt, "insert", "!index,!object", a, p, 2)) < 0 ||
            (rc = jinja__int_arg(rt, p[0], &i)) < 0)
            return rc;
        int64_t n = (int64_t)l->n;
        if (i < 0 && (i += n) < 0)
            i = 0;
        if (i > n)
            i = n;
        if ((rc = jv_list_push(rt, l, p[1])) < 0)
            return rc;
        jv x = l->items[l->n - 1];
        memmove(&l->items[i + 1], &l->items[i], (size_t)(n - i) * sizeof(jv));
        l->items[i] = x;
        return 0;
    }
    case JF_L_POP: {
        int64_t i = -1;
        if ((rc = jinja__bind(rt, "pop", "index", a, p, 1)) < 0)
            return rc;
        if (!jv_missing(p[0]) && (rc = jinja__int_arg(rt, p[0], &i)) < 0)
            return rc;
        if (l->n == 0)
            return jv_fail(rt, RC_EINVAL, "IndexError: pop from empty list");
        if (i < 0)
            i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n)
            return jv_fail(rt, RC_EINVAL, "IndexError: pop index out of range");
        *out = l->items[i];
        memmove(&l->items[i], &l->items[i + 1], (l->n - (size_t)i - 1) * sizeof(jv));
        l->n--;
        return 0;
    }
    case JF_L_REMOVE:
    case JF_L_INDEX:
    case JF_L_COUNT: {
        const char *nm = fn == JF_L_REMOVE ? "remove" : fn == JF_L_INDEX ? "index" : "count";
        if ((rc = jinja__bind(rt, nm, "!value", a, p, 1)) < 0 || (rc = jv_tick(rt, l->n / 4)) < 0)
            return rc;
        int64_t cnt = 0;
        for (size_t i = 0; i < l->n; i++) {
            if ((rc = jv_eq(rt, l->items[i], p[0], &eq)) < 0)
                return rc;
            if (!eq)
                continue;
            if (fn == JF_L_COUNT) {
                cnt++;
                continue;
            }
            if (fn == JF_L_INDEX) {
                *out = jv_int((int64_t)i);
                return 0;
            }
            jv x = l->items[i];
            memmove(&l->items[i], &l->items[i + 1], (l->n - i - 1) * sizeof(jv));
            l->n--;
            jv_decref(rt, x);
            return 0;
        }
        if (fn == JF_L_COUNT) {
            *out = jv_int(cnt);
            return 0;
        }
        if (fn == JF_L_REMOVE)
            return jv_fail(rt, RC_EINVAL, "ValueError: list.remove(x): x not in list");
        jbuf b = {0};
        rc = jv_write_repr(rt, p[0], &b);
        if (rc == 0)
            rc = jv_fail(rt, RC_EINVAL, "ValueError: %s is not in %s", b.p ? b.p : "",
                         self.t == JV_TUPLE ? "tuple" : "list");
        jbuf_free(rt, &b);
        return rc;
    }
    case JF_L_REVERSE:
        if ((rc = jinja__bind(rt, "reverse", "", a, p, 0)) < 0)
            return rc;
        for (size_t i = 0, j = l->n; i + 1 < j; i++, j--) {
            jv t = l->items[i];
            l->items[i] = l->items[j - 1];
            l->items[j - 1] = t;
        }
        return 0;
    case JF_L_SORT:
        if ((rc = jinja__bind(rt, "sort", "key,reverse", a, p, 2)) < 0)
            return rc;
        if (!jv_missing(p[0]) && p[0].t != JV_NONE)
            return jv_fail(rt, RC_EUNSUPPORTED, "TypeError: sort(key=...) is not supported");
        return merge_sort(rt, l->items, l->items, l->n, !jv_missing(p[1]) && jv_truthy(p[1]));
    case JF_L_COPY:
        if ((rc = jinja__bind(rt, "copy", "", a, p, 0)) < 0)
            return rc;
        return jv_items(rt, self, out);
    case JF_L_CLEAR: {
        if ((rc = jinja__bind(rt, "clear", "", a, p, 0)) < 0)
            return rc;
        size_t n = l->n;
        l->n = 0;
        for (size_t i = 0; i < n; i++)
            jv_decref(rt, l->items[i]);
        return 0;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: unknown list method");
    }
}

/* ---- dict methods ------------------------------------------------------------------------ */

static int dict_view(jrt *rt, jdict *d, int which, jv *out)
{
    int rc = jv_tick(rt, d->n / 16);
    if (rc < 0)
        return rc;
    rc = jv_list_new(rt, d->n, out);
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        if (which == 0) {
            jv t;
            if ((rc = jv_tuple_new(rt, 2, &t)) < 0)
                break;
            jv_incref(d->e[i].key);
            jv_incref(d->e[i].val);
            jv_l(t)->items[0] = d->e[i].key;
            jv_l(t)->items[1] = d->e[i].val;
            rc = jv_list_push_take(rt, jv_l(*out), t);
        } else {
            rc = jv_list_push(rt, jv_l(*out), which == 1 ? d->e[i].key : d->e[i].val);
        }
    }
    if (rc < 0 && out->t == JV_LIST)
        jv_clear(rt, out);
    else
        out->u.o->flags |= which == 0 ? JL_ITEMS : which == 1 ? JL_KEYS : JL_VALUES;
    return rc;
}

static int key_error(jrt *rt, jv key)
{
    jbuf b = {0};
    int rc = jv_write_repr(rt, key, &b);
    if (rc == 0)
        rc = jv_fail(rt, RC_EINVAL, "KeyError: %s", b.p ? b.p : "");
    jbuf_free(rt, &b);
    return rc;
}

static int dict_method(jrt *rt, int fn, jv self, const jcall *a, jv *out)
{
    jdict *d = jv_d(self);
    jv p[2];
    jentry *e;
    int rc;
    *out = jv_none();
    switch (fn) {
    case JF_D_ITEMS:
    case JF_D_KEYS:
    case JF_D_VALUES:
        if ((rc = jinja__bind(rt, fn == JF_D_ITEMS ? "items" : fn == JF_D_KEYS ? "keys" : "values",
                              "", a, p, 0)) < 0)
            return rc;
        return dict_view(rt, d, fn == JF_D_ITEMS ? 0 : fn == JF_D_KEYS ? 1 : 2, out);
    case JF_D_GET:
    case JF_D_SETDEFAULT:
        if ((rc = jinja__bind(rt, fn == JF_D_GET ? "get" : "setdefault", "!key,default", a, p, 2)) < 0)
            return rc;
        if ((rc = jv_dict_find(rt, d, p[0], &e)) < 0)
            return rc;
        if (e) {
            *out = e->val;
        } else {
            *out = jv_missing(p[1]) ? jv_none() : p[1];
            if (fn == JF_D_SETDEFAULT && (rc = jv_dict_set(rt, d, p[0], *out)) < 0)
                return rc;
        }
        jv_incref(*out);
        return 0;
    case JF_D_POP: {
        bool found;
        if ((rc = jinja__bind(rt, "pop", "!key,default", a, p, 2)) < 0)
            return rc;
        if ((rc = jv_dict_del(rt, d, p[0], &found, out)) < 0)
            return rc;
        if (found)
            return 0;
        if (jv_missing(p[1]))
            return key_error(rt, p[0]);
        *out = p[1];
        jv_incref(*out);
        return 0;
    }
    case JF_D_POPITEM: {
        if ((rc = jinja__bind(rt, "popitem", "", a, p, 0)) < 0)
            return rc;
        if (d->n == 0)
            return jv_fail(rt, RC_EINVAL, "KeyError: 'popitem(): dictionary is empty'");
        jv t;
        bool found;
        if ((rc = jv_tuple_new(rt, 2, &t)) < 0)
            return rc;
        jv key = d->e[d->n - 1].key;
        jv_incref(key);
        jv_l(t)->items[0] = key;
        rc = jv_dict_del(rt, d, key, &found, &jv_l(t)->items[1]);
        *out = t;
        return rc;
    }
    case JF_D_UPDATE:
        return dict_fill(rt, "update", d, a);
    case JF_D_COPY:
        if ((rc = jinja__bind(rt, "copy", "", a, p, 0)) < 0)
            return rc;
        if ((rc = jv_dict_new(rt, JV_DICT, out)) < 0)
            return rc;
        for (size_t i = 0; i < d->n && rc == 0; i++)
            rc = jv_dict_set(rt, jv_d(*out), d->e[i].key, d->e[i].val);
        if (rc < 0)
            jv_clear(rt, out);
        return rc;
    case JF_D_CLEAR: {
        if ((rc = jinja__bind(rt, "clear", "", a, p, 0)) < 0)
            return rc;
        bool found;
        while (d->n > 0 && rc == 0) {
            jv old;
            jv key = d->e[d->n - 1].key;
            jv_incref(key);
            rc = jv_dict_del(rt, d, key, &found, &old);
            jv_decref(rt, key);
            if (rc == 0)
                jv_decref(rt, old);
        }
        return rc;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: unknown dict method");
    }
}

/* ---- loop methods ------------------------------------------------------------------------- */

static int loop_method(jrt *rt, int fn, jloop *lp, const jcall *a, jv *out)
{
    if (a->n_kw)
        return jv_fail(rt, RC_EINVAL, "TypeError: loop methods take no keyword arguments");
    if (fn == JF_LOOP_CYCLE) {
        if (a->n_pos == 0)
            return jv_fail(rt, RC_EINVAL, "TypeError: no items for cycling given");
        *out = a->pos[lp->i % a->n_pos];
        jv_incref(*out);
        return 0;
    }
    /* changed(*values): true when the arguments differ from the last call */
    jv now;
    int rc = jv_tuple_new(rt, a->n_pos, &now);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < a->n_pos; i++) {
        jv_incref(a->pos[i]);
        jv_l(now)->items[i] = a->pos[i];
    }
    bool same = false;
    if (lp->has_changed && (rc = jv_eq(rt, lp->changed_last, now, &same)) < 0) {
        jv_decref(rt, now);
        return rc;
    }
    if (!same) {
        jv old = lp->changed_last;
        lp->changed_last = now;
        lp->has_changed = true;
        jv_decref(rt, old);
    } else {
        jv_decref(rt, now);
    }
    *out = jv_bool(!same);
    return 0;
}

int jinja__call_builtin(jrt *rt, jfunc *f, const jcall *a, jv *out)
{
    if (f->fn >= JF_STR_BASE)
        return jinja__str_call(rt, f->fn - JF_STR_BASE, f->self, a, out);
    switch (f->fn) {
    case JF_RANGE: return g_range(rt, a, out);
    case JF_NAMESPACE: return g_mapping(rt, JV_NS, a, out);
    case JF_DICT: return g_mapping(rt, JV_DICT, a, out);
    case JF_RAISE: return g_raise(rt, a);
    case JF_LOOP_CYCLE:
    case JF_LOOP_CHANGED:
        return loop_method(rt, f->fn, (jloop *)f->self.u.o, a, out);
    default:
        if (f->self.t == JV_LIST || f->self.t == JV_TUPLE)
            return list_method(rt, f->fn, f->self, a, out);
        if (f->self.t == JV_DICT)
            return dict_method(rt, f->fn, f->self, a, out);
        return jv_fail(rt, RC_EINVAL, "TypeError: object is not callable");
    }
}
