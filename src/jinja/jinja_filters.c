/* jinja_filters.c - jinja2's builtin filters and tests, plus HF's tojson.
 *
 * Each filter mirrors its jinja2 3.1 implementation (filters.py/tests.py),
 * including the corners templates rely on: `default` only replaces
 * undefined values unless its boolean argument is set, `map`, `select`,
 * `selectattr`, `unique`, `items`, `batch` and `slice` return one-shot
 * generators (so `x|map(...)|tojson` fails as in Python), attribute paths
 * ("a.b.0") look items up before attributes, and `sort`/`unique`/`min`
 * ignore case by default.  Filters that make no sense in chat templates
 * (random, urlize, ...) are known names that fail when used, so templates
 * that merely mention them still parse.  Tables of both are at the end.
 */
#include "jinja/jinja_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

typedef int (*filter_fn)(jrt *rt, jv v, const jcall *a, jv *out);
typedef int (*test_fn)(jrt *rt, jv v, const jcall *a, bool *out);

#define BIND(fname, names, n)                                               \
    jv p[(n) > 0 ? (n) : 1];                                                \
    int rc = jinja__bind(rt, fname, names, a, p, n);                        \
    if (rc < 0)                                                             \
        return rc

static jv arg_or(jv v, jv def) { return jv_missing(v) ? def : v; }

static bool arg_true(jv v) { return !jv_missing(v) && jv_truthy(v); }

static int to_str(jrt *rt, jv v, jv *out)
{
    if (v.t == JV_UNDEF && v.u.o == &jinja__missing_obj)
        return jv_str(rt, "", 0, out);
    return jv_to_str(rt, v, out);
}

/* Calls the str method `name` on s. */
static int str_method(jrt *rt, jv s, const char *name, const jv *pos, size_t n, jv *out)
{
    jcall c = {pos, n, NULL, NULL, 0};
    return jinja__str_call(rt, jinja__str_method_id(name), s, &c, out);
}

/* ---- attribute paths (make_attrgetter) --------------------------------------------- */

/* item -> item[part1][part2]...; attribute "a.b.0" (digits become ints),
 * an int, or None/missing for the item itself. */
static int attr_path(jrt *rt, jv item, jv attribute, jv *out)
{
    int rc = 0;
    jv_incref(item);
    *out = item;
    if (jv_missing(attribute) || attribute.t == JV_NONE)
        return 0;
    if (attribute.t != JV_STR) {
        rc = jinja__getitem(rt, item, attribute, out);
        jv_decref(rt, item);
        return rc;
    }
    const jstr *s = jv_s(attribute);
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(s->s + i, '.', s->len - i);
        size_t e = dot ? (size_t)(dot - s->s) : s->len;
        jv key, next;
        if (e > i && strspn(s->s + i, "0123456789") >= e - i) {
            int64_t k = 0;
            for (size_t q = i; q < e && k < INT64_MAX / 10 - 10; q++)
                k = k * 10 + (s->s[q] - '0');
            key = jv_int(k);
        } else if ((rc = jv_str(rt, s->s + i, e - i, &key)) < 0) {
            break;
        }
        rc = jinja__getitem(rt, *out, key, &next);
        jv_decref(rt, key);
        jv_clear(rt, out);
        if (rc < 0) {
            *out = jv_none();
            return rc;
        }
        *out = next;
        if (!dot)
            return 0;
        i = e + 1;
    }
    jv_clear(rt, out);
    *out = jv_none();
    return rc;
}

static int lower_if_str(jrt *rt, jv *v)
{
    if (v->t != JV_STR)
        return 0;
    jv low;
    int rc = jinja__str_case(rt, *v, JC_LOWER, &low);
    if (rc < 0)
        return rc;
    jv_decref(rt, *v);
    *v = low;
    return 0;
}

/* The key of one item for sort/unique/min/max/groupby: the attribute
 * (comma separated for several keys when `multi`), lowercased unless
 * case-sensitive. */
static int item_key(jrt *rt, jv item, jv attribute, bool multi, bool case_sensitive, jv *out)
{
    int rc;
    if (multi && attribute.t != JV_STR) {
        /* make_multi_attrgetter: a one-element list, compared element-wise */
        jv k;
        if ((rc = jv_list_new(rt, 1, out)) < 0)
            return rc;
        if ((rc = item_key(rt, item, attribute, false, case_sensitive, &k)) < 0 ||
            (rc = jv_list_push_take(rt, jv_l(*out), k)) < 0) {
            jv_clear(rt, out);
            return rc;
        }
        return 0;
    }
    if (multi) {
        const jstr *s = jv_s(attribute);
        if ((rc = jv_list_new(rt, 0, out)) < 0)
            return rc;
        size_t i = 0;
        for (;;) {
            const char *comma = memchr(s->s + i, ',', s->len - i);
            size_t e = comma ? (size_t)(comma - s->s) : s->len;
            jv part, k;
            if ((rc = jv_str(rt, s->s + i, e - i, &part)) < 0)
                break;
            rc = attr_path(rt, item, part, &k);
            jv_decref(rt, part);
            if (rc < 0 || (!case_sensitive && (rc = lower_if_str(rt, &k)) < 0) ||
                (rc = jv_list_push_take(rt, jv_l(*out), k)) < 0)
                break;
            if (!comma)
                return 0;
            i = e + 1;
        }
        jv_clear(rt, out);
        return rc;
    }
    if ((rc = attr_path(rt, item, attribute, out)) < 0)
        return rc;
    if (!case_sensitive && (rc = lower_if_str(rt, out)) < 0) {
        jv_clear(rt, out);
        return rc;
    }
    return 0;
}

/* Wraps a list as a one-shot generator. */
static int generator(jrt *rt, jv list_take, jv *out)
{
    return jv_iter_new(rt, list_take, "generator", out);
}

/* Ends a generator filter.  jinja2 runs these bodies lazily, so an error
 * met while producing items surfaces only when the generator is consumed:
 * the items made so far are kept with the error (resource limits are not
 * deferred). */
static int finish_gen(jrt *rt, jv res_take, int rc, jv *out)
{
    if (rc < 0 && rc != RC_EINVAL && rc != RC_EUNSUPPORTED) {
        jv_decref(rt, res_take);
        return rc;
    }
    char *msg = NULL;
    if (rc < 0 && !(msg = rc_strdup(rc_errmsg()))) {
        jv_decref(rt, res_take);
        return jv_nomem(rt);
    }
    int rc2 = generator(rt, res_take, out);
    if (rc2 < 0) {
        rc_free(msg);
        return rc2;
    }
    ((jiter *)out->u.o)->err = msg;
    ((jiter *)out->u.o)->err_rc = rc;
    return 0;
}

/* ---- filters ------------------------------------------------------------------------ */

static int f_abs(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("abs", "", 0);
    if (v.t == JV_FLOAT) {
        *out = jv_float(fabs(v.u.f));
        return 0;
    }
    if (jv_is_intlike(v)) {
        int64_t i = jv_as_int(v);
        if (i == INT64_MIN)
            return jv_fail(rt, RC_ELIMIT, "OverflowError: integer result does not fit in 64 bits");
        *out = jv_int(i < 0 ? -i : i);
        return 0;
    }
    return jv_fail(rt, RC_EINVAL, "TypeError: bad operand type for abs(): '%s'", jv_type_name(v));
}

static int f_attr(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_attr", "!name", 1);
    jv name;
    bool found;
    if (p[0].t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: attribute name must be string, not '%s'",
                       jv_type_name(p[0]));
    if (v.t == JV_UNDEF)
        return jv_undef_raise(rt, v);
    if ((rc = jv_to_str(rt, p[0], &name)) < 0)
        return rc;
    rc = jinja__pyattr(rt, v, jv_s(name)->s, out, &found);
    if (rc == 0 && !found)
        rc = jv_undef_missing(rt, v, name, out);
    jv_decref(rt, name);
    return rc;
}

static int f_batch(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_batch", "!linecount,fill_with", 2);
    int64_t count = 0;
    jv items = jv_none(), res, tmp = jv_none();
    if ((rc = jv_list_new(rt, 0, &res)) < 0)
        return rc;
    if ((rc = jinja__int_arg(rt, p[0], &count)) < 0 || (rc = jv_items(rt, v, &items)) < 0)
        return finish_gen(rt, res, rc, out);
    jlist *l = jv_l(items);
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (tmp.t == JV_LIST && (int64_t)jv_l(tmp)->n == count) {
            rc = jv_list_push_take(rt, jv_l(res), tmp);
            tmp = jv_none();
        }
        if (rc == 0 && tmp.t != JV_LIST)
            rc = jv_list_new(rt, 0, &tmp);
        if (rc == 0)
            rc = jv_list_push(rt, jv_l(tmp), l->items[i]);
    }
    if (rc == 0 && tmp.t == JV_LIST) {
        jv fill = arg_or(p[1], jv_none());
        if (fill.t != JV_NONE)
            while (rc == 0 && (int64_t)jv_l(tmp)->n < count)
                rc = jv_list_push(rt, jv_l(tmp), fill);
        if (rc == 0) {
            rc = jv_list_push_take(rt, jv_l(res), tmp);
            tmp = jv_none();
        }
    }
    jv_decref(rt, tmp);
    jv_decref(rt, items);
    return finish_gen(rt, res, rc, out);
}

static int case_filter(jrt *rt, jv v, const jcall *a, jv *out, const char *name, int mode)
{
    BIND(name, "", 0);
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    rc = jinja__str_case(rt, s, mode, out);
    jv_decref(rt, s);
    return rc;
}
static int f_capitalize(jrt *rt, jv v, const jcall *a, jv *out)
{
    return case_filter(rt, v, a, out, "do_capitalize", JC_CAPITALIZE);
}
static int f_lower(jrt *rt, jv v, const jcall *a, jv *out)
{
    return case_filter(rt, v, a, out, "do_lower", JC_LOWER);
}
static int f_upper(jrt *rt, jv v, const jcall *a, jv *out)
{
    return case_filter(rt, v, a, out, "do_upper", JC_UPPER);
}

static int f_title(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_title", "", 0);
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    /* words start after runs of [-\s({\[<]: first char upper, rest lower */
    const jstr *x = jv_s(s);
    jbuf b = {0};
    bool start = true;
    for (size_t i = 0; i < x->len && rc == 0;) {
        uint32_t c = ju_next(x->s, &i);
        bool delim = ju_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        uint32_t r = delim ? c : start ? ju_toupper(c) : ju_tolower(c);
        start = delim;
        char enc[4];
        rc = jbuf_put(rt, &b, enc, ju_encode(r, enc));
    }
    jv_decref(rt, s);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

static int f_center(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_center", "width", 1);
    jv s, w = arg_or(p[0], jv_int(80));
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    rc = str_method(rt, s, "center", &w, 1, out);
    jv_decref(rt, s);
    return rc;
}

static int f_length(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("length", "", 0);
    int64_t n;
    if ((rc = jv_len(rt, v, &n)) < 0)
        return rc;
    *out = jv_int(n);
    return 0;
}

static int f_default(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_default", "default_value,boolean", 2);
    if (v.t == JV_UNDEF || (arg_true(p[1]) && !jv_truthy(v))) {
        if (jv_missing(p[0]))
            return jv_str(rt, "", 0, out);
        *out = p[0];
    } else {
        *out = v;
    }
    jv_incref(*out);
    return 0;
}

static int sort_items(jrt *rt, jv list, jv attribute, bool multi, bool case_sensitive,
                      bool reverse)
{
    jlist *l = jv_l(list);
    jv *keys = rc_calloc(l->n ? l->n : 1, sizeof *keys);
    int rc = 0;
    size_t nk = 0;
    if (!keys)
        return jv_nomem(rt);
    for (; nk < l->n && rc == 0; nk++)
        if ((rc = item_key(rt, l->items[nk], attribute, multi, case_sensitive, &keys[nk])) < 0)
            break;
    if (rc == 0)
        rc = jinja__sort(rt, l->items, keys, l->n, reverse);
    for (size_t i = 0; i < nk; i++)
        jv_decref(rt, keys[i]);
    rc_free(keys);
    return rc;
}

static int f_dictsort(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_dictsort", "case_sensitive,by,reverse", 3);
    int pos = 0;
    if (!jv_missing(p[1])) {
        if (p[1].t == JV_STR && strcmp(jv_s(p[1])->s, "key") == 0)
            pos = 0;
        else if (p[1].t == JV_STR && strcmp(jv_s(p[1])->s, "value") == 0)
            pos = 1;
        else
            return jv_fail(rt, RC_EINVAL,
                           "FilterArgumentError: You can only sort by either \"key\" or \"value\"");
    }
    if (v.t == JV_UNDEF)
        return jv_undef_raise(rt, v);
    if (v.t != JV_DICT)
        return jv_fail(rt, RC_EINVAL, "AttributeError: '%s' object has no attribute 'items'",
                       jv_type_name(v));
    jv items;
    jdict *d = jv_d(v);
    if ((rc = jv_list_new(rt, d->n, &items)) < 0)
        return rc;
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        jv t;
        if ((rc = jv_tuple_new(rt, 2, &t)) < 0)
            break;
        jv_incref(d->e[i].key);
        jv_incref(d->e[i].val);
        jv_l(t)->items[0] = d->e[i].key;
        jv_l(t)->items[1] = d->e[i].val;
        rc = jv_list_push_take(rt, jv_l(items), t);
    }
    if (rc == 0)
        rc = sort_items(rt, items, jv_int(pos), false, arg_true(p[0]), arg_true(p[2]));
    if (rc < 0) {
        jv_decref(rt, items);
        return rc;
    }
    *out = items;
    return 0;
}

static int f_escape(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("escape", "", 0);
    return jinja__escape(rt, v, out);
}

static int f_forceescape(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_forceescape", "", 0);
    jv s, plain;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    rc = jv_str(rt, jv_s(s)->s, jv_s(s)->len, &plain);
    jv_decref(rt, s);
    if (rc < 0)
        return rc;
    rc = jinja__escape(rt, plain, out);
    jv_decref(rt, plain);
    return rc;
}

static int f_first(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_first", "", 0);
    if (v.t == JV_ITER) {
        jiter *it = (jiter *)v.u.o;
        if (it->items && it->pos < it->items->n) {
            *out = it->items->items[it->pos++];
            jv_incref(*out);
            return 0;
        }
        if (it->err)
            return jv_fail(rt, it->err_rc, "%s", it->err);
        return jv_undef_hint(rt, "No first item, sequence was empty.", out);
    }
    if (v.t == JV_LIST || v.t == JV_TUPLE) {
        if (!jv_l(v)->n)
            return jv_undef_hint(rt, "No first item, sequence was empty.", out);
        *out = jv_l(v)->items[0];
        jv_incref(*out);
        return 0;
    }
    jv items;
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    if (jv_l(items)->n) {
        *out = jv_l(items)->items[0];
        jv_incref(*out);
    } else {
        rc = jv_undef_hint(rt, "No first item, sequence was empty.", out);
    }
    jv_decref(rt, items);
    return rc;
}

static int f_last(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_last", "", 0);
    if (v.t == JV_ITER || v.t == JV_NS || v.t == JV_LOOP)
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object is not reversible", jv_type_name(v));
    if (v.t != JV_UNDEF && v.t != JV_STR && v.t != JV_LIST && v.t != JV_TUPLE && v.t != JV_DICT)
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object is not reversible", jv_type_name(v));
    jv items;
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    size_t n = jv_l(items)->n;
    if (n) {
        *out = jv_l(items)->items[n - 1];
        jv_incref(*out);
    } else {
        rc = jv_undef_hint(rt, "No last item, sequence was empty.", out);
    }
    jv_decref(rt, items);
    return rc;
}

static int f_float(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_float", "default", 1);
    if (v.t == JV_UNDEF)
        return jv_undef_raise(rt, v);
    double d;
    if (jv_is_num(v)) {
        *out = jv_float(jv_as_float(v));
        return 0;
    }
    if (v.t == JV_STR && jinja__parse_float(jv_s(v)->s, jv_s(v)->len, &d)) {
        *out = jv_float(d);
        return 0;
    }
    *out = arg_or(p[0], jv_float(0.0));
    jv_incref(*out);
    return 0;
}

static int f_int(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_int", "default,base", 2);
    int64_t base = 10, i;
    double d;
    if (!jv_missing(p[1]) && (rc = jinja__int_arg(rt, p[1], &base)) < 0)
        return rc;
    if (v.t == JV_UNDEF)
        return jv_undef_raise(rt, v);
    if (jv_is_intlike(v)) {
        *out = jv_int(jv_as_int(v));
        return 0;
    }
    if (v.t == JV_FLOAT) {
        if (isinf(v.u.f))
            return jv_fail(rt, RC_EINVAL, "OverflowError: cannot convert float infinity to integer");
        if (!isnan(v.u.f)) {
            if (fabs(v.u.f) >= 9.2e18)
                return jv_fail(rt, RC_ELIMIT, "OverflowError: integer result does not fit in 64 bits");
            *out = jv_int((int64_t)v.u.f);
            return 0;
        }
    } else if (v.t == JV_STR) {
        const jstr *s = jv_s(v);
        if (jinja__parse_int(s->s, s->len, (int)base, &i)) {
            *out = jv_int(i);
            return 0;
        }
        if (jinja__parse_float(s->s, s->len, &d) && isfinite(d) && fabs(d) < 9.2e18) {
            *out = jv_int((int64_t)d);
            return 0;
        }
    }
    *out = arg_or(p[0], jv_int(0));
    jv_incref(*out);
    return 0;
}

static int f_format(jrt *rt, jv v, const jcall *a, jv *out)
{
    jv s, args;
    int rc;
    if (a->n_pos && a->n_kw)
        return jv_fail(rt, RC_EINVAL, "FilterArgumentError: can't handle positional and keyword "
                                      "arguments at the same time");
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    if (a->n_kw) {
        rc = jv_dict_new(rt, JV_DICT, &args);
        for (size_t i = 0; i < a->n_kw && rc == 0; i++) {
            jv k;
            if ((rc = jv_cstr(rt, a->kw_names[i].s, &k)) < 0)
                break;
            rc = jv_dict_set(rt, jv_d(args), k, a->kw[i]);
            jv_decref(rt, k);
        }
    } else {
        rc = jv_tuple_new(rt, a->n_pos, &args);
        for (size_t i = 0; i < a->n_pos && rc == 0; i++) {
            jv_incref(a->pos[i]);
            jv_l(args)->items[i] = a->pos[i];
        }
    }
    if (rc == 0)
        rc = jinja__percent_format(rt, s, args, out);
    jv_decref(rt, args);
    jv_decref(rt, s);
    return rc;
}

static int f_groupby(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_groupby", "!attribute,default,case_sensitive", 3);
    bool cs = arg_true(p[2]);
    jv items, res = jv_none();
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    jlist *l = jv_l(items);
    jv *keys = rc_calloc(l->n ? l->n : 1, sizeof *keys);
    size_t nk = 0;
    if (!keys) {
        jv_decref(rt, items);
        return jv_nomem(rt);
    }
    /* key with default, lowercased unless case_sensitive */
    for (; nk < l->n && rc == 0; nk++) {
        if ((rc = attr_path(rt, l->items[nk], p[0], &keys[nk])) < 0)
            break;
        if (!jv_missing(p[1]) && p[1].t != JV_NONE && keys[nk].t == JV_UNDEF) {
            jv_decref(rt, keys[nk]);
            keys[nk] = p[1];
            jv_incref(p[1]);
        }
        if (!cs && (rc = lower_if_str(rt, &keys[nk])) < 0) {
            nk++;
            break;
        }
    }
    if (rc == 0)
        rc = jinja__sort(rt, l->items, keys, l->n, false);
    if (rc == 0)
        rc = jv_list_new(rt, 0, &res);
    for (size_t i = 0; i < l->n && rc == 0;) {
        size_t j = i + 1;
        bool eq = true;
        while (j < l->n && rc == 0) {
            if ((rc = jv_eq(rt, keys[i], keys[j], &eq)) < 0 || !eq)
                break;
            j++;
        }
        if (rc < 0)
            break;
        jv grp, members, grouper;
        if ((rc = jv_list_new(rt, j - i, &members)) < 0)
            break;
        for (size_t k = i; k < j; k++)
            jv_list_push(rt, jv_l(members), l->items[k]);
        if (cs) {
            grouper = keys[i];
            jv_incref(grouper);
        } else if ((rc = attr_path(rt, l->items[i], p[0], &grouper)) < 0) {
            jv_decref(rt, members);
            break;
        } else if (!jv_missing(p[1]) && p[1].t != JV_NONE && grouper.t == JV_UNDEF) {
            jv_decref(rt, grouper);
            grouper = p[1];
            jv_incref(grouper);
        }
        if ((rc = jv_tuple_new(rt, 2, &grp)) < 0) {
            jv_decref(rt, members);
            jv_decref(rt, grouper);
            break;
        }
        grp.u.o->flags |= JL_GROUP;
        jv_l(grp)->items[0] = grouper;
        jv_l(grp)->items[1] = members;
        rc = jv_list_push_take(rt, jv_l(res), grp);
        i = j;
    }
    for (size_t i = 0; i < nk; i++)
        jv_decref(rt, keys[i]);
    rc_free(keys);
    jv_decref(rt, items);
    if (rc < 0) {
        jv_decref(rt, res);
        return rc;
    }
    *out = res;
    return 0;
}

static int f_indent(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_indent", "width,first,blank", 3);
    jv width = arg_or(p[0], jv_int(4));
    jbuf ind = {0}, b = {0};
    if (v.t == JV_UNDEF)
        return jv_undef_raise(rt, v);
    if (v.t == JV_LIST)     /* list += "\n" works; the splitlines after it does not */
        return jv_fail(rt, RC_EINVAL, "AttributeError: 'list' object has no attribute 'splitlines'");
    if (v.t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: unsupported operand type(s) for +=: '%s' and 'str'",
                       jv_type_name(v));
    if (width.t == JV_STR) {
        rc = jbuf_put(rt, &ind, jv_s(width)->s, jv_s(width)->len);
    } else {
        int64_t w;
        if ((rc = jinja__int_arg(rt, width, &w)) < 0)
            return rc;
        if (w > 100000)
            return jv_fail(rt, RC_ELIMIT, "LimitError: indent width too large");
        for (int64_t i = 0; i < w && rc == 0; i++)
            rc = jbuf_putc(rt, &ind, ' ');
    }
    /* s += "\n"; lines = s.splitlines(); ... */
    jv s2 = jv_none(), lines = jv_none();
    if (rc == 0 && (rc = jbuf_put(rt, &b, jv_s(v)->s, jv_s(v)->len)) == 0 &&
        (rc = jbuf_putc(rt, &b, '\n')) == 0 &&
        (rc = jv_str_from_buf(rt, &b, 0, &s2)) == 0)
        rc = jinja__str_splitlines(rt, s2, false, &lines);
    jbuf_free(rt, &b);
    if (rc == 0) {
        jlist *l = jv_l(lines);
        bool blank = arg_true(p[2]);
        for (size_t i = 0; i < l->n && rc == 0; i++) {
            const jstr *line = jv_s(l->items[i]);
            if (i > 0)
                rc = jbuf_putc(rt, &b, '\n');
            bool indent_it = blank ? i > 0 : (i > 0 && line->len > 0);
            if (i == 0 && arg_true(p[1]))
                indent_it = true;
            if (rc == 0 && indent_it && ind.len)
                rc = jbuf_put(rt, &b, ind.p, ind.len);
            if (rc == 0)
                rc = jbuf_put(rt, &b, line->s, line->len);
        }
    }
    jv_decref(rt, lines);
    jv_decref(rt, s2);
    jbuf_free(rt, &ind);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, jv_is_markup(v) ? JS_MARKUP : 0, out);
}

static int f_join(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_join", "d,attribute", 2);
    jv items;
    jbuf b = {0}, sep = {0};
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    if (!jv_missing(p[0]))
        rc = jv_write_str(rt, p[0], &sep);
    jlist *l = jv_l(items);
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (i && sep.len)
            rc = jbuf_put(rt, &b, sep.p, sep.len);
        if (rc < 0)
            break;
        if (!jv_missing(p[1]) && p[1].t != JV_NONE) {
            jv x;
            if ((rc = attr_path(rt, l->items[i], p[1], &x)) < 0)
                break;
            rc = jv_write_str(rt, x, &b);
            jv_decref(rt, x);
        } else {
            rc = jv_write_str(rt, l->items[i], &b);
        }
    }
    jv_decref(rt, items);
    jbuf_free(rt, &sep);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

static int f_list(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_list", "", 0);
    if ((rc = jv_items(rt, v, out)) < 0)
        return rc;
    if (out->t == JV_TUPLE) {   /* list(tuple) is a new list */
        jv t = *out;
        rc = jv_list_new(rt, jv_l(t)->n, out);
        for (size_t i = 0; rc == 0 && i < jv_l(t)->n; i++)
            jv_list_push(rt, jv_l(*out), jv_l(t)->items[i]);
        jv_decref(rt, t);
    }
    return rc;
}

static int f_items(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_items", "", 0);
    jv l;
    if ((rc = jv_list_new(rt, 0, &l)) < 0)
        return rc;
    if (v.t == JV_UNDEF)
        return generator(rt, l, out);
    if (v.t != JV_DICT)
        return finish_gen(rt, l, jv_fail(rt, RC_EINVAL, "TypeError: Can only get item pairs "
                                                        "from a mapping."), out);
    jdict *d = jv_d(v);
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        jv t;
        if ((rc = jv_tuple_new(rt, 2, &t)) < 0)
            break;
        jv_incref(d->e[i].key);
        jv_incref(d->e[i].val);
        jv_l(t)->items[0] = d->e[i].key;
        jv_l(t)->items[1] = d->e[i].val;
        rc = jv_list_push_take(rt, jv_l(l), t);
    }
    return finish_gen(rt, l, rc, out);
}

static int f_map(jrt *rt, jv v, const jcall *a, jv *out)
{
    jv res, items = jv_none();
    int rc = jv_list_new(rt, 0, &res);
    if (rc < 0)
        return rc;
    if (!jv_truthy(v))
        return generator(rt, res, out);
    jv attribute = jv_missing_val(), def = jv_none();
    int fid = -1;
    if (a->n_pos == 0) {
        for (size_t k = 0; k < a->n_kw; k++) {
            if (strcmp(a->kw_names[k].s, "attribute") == 0) {
                attribute = a->kw[k];
            } else if (strcmp(a->kw_names[k].s, "default") == 0) {
                def = a->kw[k];
            } else {
                rc = jv_fail(rt, RC_EINVAL, "FilterArgumentError: Unexpected keyword argument '%s'",
                             a->kw_names[k].s);
                goto done;
            }
        }
        if (jv_missing(attribute)) {
            rc = jv_fail(rt, RC_EINVAL, "FilterArgumentError: map requires a filter argument");
            goto done;
        }
    }
    if ((rc = jv_items(rt, v, &items)) < 0)
        goto done;
    if (a->n_pos && jv_l(items)->n) {
        /* jinja2 looks the filter up when it first applies it */
        jv name = a->pos[0];
        if (name.t != JV_STR || (fid = jinja__filter_id(jv_s(name)->s)) < 0) {
            jbuf b = {0};
            jv_write_repr(rt, name, &b);
            rc = jv_fail(rt, RC_EINVAL, "TemplateRuntimeError: No filter named %s.", b.p ? b.p : "");
            jbuf_free(rt, &b);
            goto done;
        }
    }
    jcall rest = {a->n_pos ? a->pos + 1 : NULL, a->n_pos ? a->n_pos - 1 : 0,
                  a->kw_names, a->kw, fid >= 0 ? a->n_kw : 0};
    for (size_t i = 0; i < jv_l(items)->n && rc == 0; i++) {
        jv x, item = jv_l(items)->items[i];
        if (fid >= 0) {
            rc = jinja__filter(rt, fid, item, &rest, &x);
        } else {
            rc = attr_path(rt, item, attribute, &x);
            if (rc == 0 && def.t != JV_NONE && x.t == JV_UNDEF) {
                jv_decref(rt, x);
                x = def;
                jv_incref(x);
            }
        }
        if (rc == 0)
            rc = jv_list_push_take(rt, jv_l(res), x);
    }
done:
    jv_decref(rt, items);
    return finish_gen(rt, res, rc, out);
}

static int min_max(jrt *rt, jv v, const jcall *a, jv *out, bool is_max)
{
    BIND(is_max ? "do_max" : "do_min", "case_sensitive,attribute", 2);
    jv items, best = jv_none(), bk = jv_none();
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    jlist *l = jv_l(items);
    if (l->n == 0) {
        jv_decref(rt, items);
        return jv_undef_hint(rt, "No aggregated item, sequence was empty.", out);
    }
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        jv k;
        if ((rc = item_key(rt, l->items[i], arg_or(p[1], jv_none()), false, arg_true(p[0]), &k)) < 0)
            break;
        int c = 0;
        if (i > 0 && (rc = jv_cmp(rt, k, bk, "<", &c)) < 0) {
            jv_decref(rt, k);
            break;
        }
        if (i == 0 || (is_max ? c == 1 : c == -1)) {
            jv_decref(rt, bk);
            bk = k;
            best = l->items[i];
        } else {
            jv_decref(rt, k);
        }
    }
    jv_decref(rt, bk);
    if (rc == 0) {
        *out = best;
        jv_incref(best);
    }
    jv_decref(rt, items);
    return rc;
}
static int f_min(jrt *rt, jv v, const jcall *a, jv *out) { return min_max(rt, v, a, out, false); }
static int f_max(jrt *rt, jv v, const jcall *a, jv *out) { return min_max(rt, v, a, out, true); }

static int f_pprint(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_pprint", "", 0);
    jbuf b = {0};
    if ((rc = jv_write_repr(rt, v, &b)) < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

/* select/reject/selectattr/rejectattr */
static int select_impl(jrt *rt, jv v, const jcall *a, jv *out, bool keep_when, bool by_attr)
{
    jv res, items = jv_none();
    int rc = jv_list_new(rt, 0, &res);
    if (rc < 0)
        return rc;
    if (!jv_truthy(v))
        return generator(rt, res, out);
    size_t off = 0;
    jv attribute = jv_none();
    if (by_attr) {
        if (a->n_pos < 1) {
            rc = jv_fail(rt, RC_EINVAL, "FilterArgumentError: Missing parameter for attribute name");
            goto done;
        }
        attribute = a->pos[0];
        off = 1;
    }
    int tid = -1;
    if ((rc = jv_items(rt, v, &items)) < 0)
        goto done;
    if (a->n_pos > off && jv_l(items)->n) {
        /* jinja2 looks the test up when it first applies it */
        jv name = a->pos[off];
        if (name.t != JV_STR || (tid = jinja__test_id(jv_s(name)->s)) < 0) {
            jbuf b = {0};
            jv_write_repr(rt, name, &b);
            rc = jv_fail(rt, RC_EINVAL, "TemplateRuntimeError: No test named %s.", b.p ? b.p : "");
            jbuf_free(rt, &b);
            goto done;
        }
    }
    jcall rest = {a->n_pos > off ? a->pos + off + 1 : NULL, a->n_pos > off ? a->n_pos - off - 1 : 0,
                  a->kw_names, a->kw, a->n_kw};
    for (size_t i = 0; i < jv_l(items)->n && rc == 0; i++) {
        jv item = jv_l(items)->items[i], x;
        bool r;
        if ((rc = attr_path(rt, item, attribute, &x)) < 0)
            break;
        if (tid >= 0)
            rc = jinja__test(rt, tid, x, &rest, &r);
        else
            r = jv_truthy(x);
        jv_decref(rt, x);
        if (rc == 0 && r == keep_when)
            rc = jv_list_push(rt, jv_l(res), item);
    }
done:
    jv_decref(rt, items);
    return finish_gen(rt, res, rc, out);
}
static int f_select(jrt *rt, jv v, const jcall *a, jv *o) { return select_impl(rt, v, a, o, true, false); }
static int f_reject(jrt *rt, jv v, const jcall *a, jv *o) { return select_impl(rt, v, a, o, false, false); }
static int f_selectattr(jrt *rt, jv v, const jcall *a, jv *o) { return select_impl(rt, v, a, o, true, true); }
static int f_rejectattr(jrt *rt, jv v, const jcall *a, jv *o) { return select_impl(rt, v, a, o, false, true); }

static int f_replace(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_replace", "!old,!new,count", 3);
    int64_t count = -1;
    if (!jv_missing(p[2]) && p[2].t != JV_NONE && (rc = jinja__int_arg(rt, p[2], &count)) < 0)
        return rc;
    /* no autoescape: str(s).replace(str(old), str(new), count) */
    jv s = jv_none(), o = jv_none(), n = jv_none(), plain = jv_none();
    if ((rc = to_str(rt, v, &s)) == 0 && (rc = to_str(rt, p[0], &o)) == 0 &&
        (rc = to_str(rt, p[1], &n)) == 0 &&
        (rc = jv_str(rt, jv_s(s)->s, jv_s(s)->len, &plain)) == 0)
        rc = jinja__str_replace(rt, plain, o, n, count, out);
    jv_decref(rt, s);
    jv_decref(rt, o);
    jv_decref(rt, n);
    jv_decref(rt, plain);
    return rc;
}

static int f_reverse(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_reverse", "", 0);
    if (v.t == JV_STR) {
        jv none = jv_none();
        return jinja__slice(rt, v, none, none, jv_int(-1), out);
    }
    jv items, rev;
    if ((rc = jv_items(rt, v, &items)) < 0)
        return jv_fail(rt, RC_EINVAL, "FilterArgumentError: argument must be iterable");
    jlist *l = jv_l(items);
    if ((rc = jv_list_new(rt, l->n, &rev)) < 0) {
        jv_decref(rt, items);
        return rc;
    }
    for (size_t i = l->n; i-- > 0;)
        jv_list_push(rt, jv_l(rev), l->items[i]);
    jv_decref(rt, items);
    if (v.t == JV_LIST)
        return jv_iter_new(rt, rev, "list_reverseiterator", out);
    if (jv_is_range(v))
        return jv_iter_new(rt, rev, "range_iterator", out);
    if (v.t == JV_TUPLE || v.t == JV_UNDEF)
        return jv_iter_new(rt, rev, "reversed", out);
    if (v.t == JV_DICT)
        return jv_iter_new(rt, rev, "dict_reversekeyiterator", out);
    *out = rev;
    return 0;
}

static double round_half_even_digits(double x, int64_t nd)
{
    char buf[400];
    if (nd > 300 || !isfinite(x))
        return x;
    if (nd >= 0) {
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    if (nd < -308)
        return 0.0 * x;
    double p10 = pow(10.0, (double)-nd);
    double y = x / p10;
    double r = nearbyint(y);
    return r * p10;
}

static int f_round(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_round", "precision,method", 2);
    int64_t prec = 0;
    const char *method = "common";
    if (!jv_missing(p[0]) && (rc = jinja__int_arg(rt, p[0], &prec)) < 0)
        return rc;
    if (!jv_missing(p[1])) {
        method = p[1].t == JV_STR ? jv_s(p[1])->s : "";
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            return jv_fail(rt, RC_EINVAL, "FilterArgumentError: method must be common, ceil or floor");
    }
    if (!jv_is_num(v)) {
        if (strcmp(method, "common") == 0)
            return jv_fail(rt, RC_EINVAL, "TypeError: type %s doesn't define __round__ method",
                           jv_type_name(v));
        /* math.floor(value * 10 ** precision) */
        jv prod;
        if ((rc = jinja__binop(rt, OP_MUL, v, jv_int(1), &prod)) < 0)
            return rc;
        rc = jv_fail(rt, RC_EINVAL, "TypeError: must be real number, not %s", jv_type_name(prod));
        jv_decref(rt, prod);
        return rc;
    }
    if (strcmp(method, "common") == 0) {
        if (v.t != JV_FLOAT) {
            int64_t i = jv_as_int(v);
            if (prec < 0) {
                if (prec < -18) {
                    *out = jv_int(0);
                    return 0;
                }
                int64_t m = 1;
                for (int64_t k = 0; k < -prec; k++)
                    m *= 10;
                int64_t q = i / m, r = i % m;
                if (r < 0) {
                    q -= 1;
                    r += m;
                }
                if (r * 2 > m || (r * 2 == m && (q & 1)))
                    q++;
                i = q * m;
            }
            *out = jv_int(i);
            return 0;
        }
        *out = jv_float(round_half_even_digits(v.u.f, prec));
        return 0;
    }
    if (prec > 300 || prec < -300)
        return jv_fail(rt, RC_ELIMIT, "OverflowError: precision too large");
    double p10 = pow(10.0, (double)prec);
    double x = jv_as_float(v) * p10;
    double r = strcmp(method, "ceil") == 0 ? ceil(x) : floor(x);
    if (r == 0.0)
        r = 0.0;    /* math.floor/ceil return an int: no negative zero */
    *out = jv_float(r / p10);
    return 0;
}

static int f_safe(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_mark_safe", "", 0);
    if (jv_is_markup(v)) {
        jv_incref(v);
        *out = v;
        return 0;
    }
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    rc = jv_str_flags(rt, jv_s(s)->s, jv_s(s)->len, JS_MARKUP, out);
    jv_decref(rt, s);
    return rc;
}

static int f_slice(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_slice", "!slices,fill_with", 2);
    int64_t slices = 0;
    jv items = jv_none(), res;
    if ((rc = jv_list_new(rt, 0, &res)) < 0)
        return rc;
    if ((rc = jinja__int_arg(rt, p[0], &slices)) < 0 || (rc = jv_items(rt, v, &items)) < 0)
        return finish_gen(rt, res, rc, out);
    if (slices <= 0 || slices > 100000) {
        rc = slices == 0 ? jv_fail(rt, RC_EINVAL, "ZeroDivisionError: integer division or modulo by zero")
           : slices < 0 ? jv_fail(rt, RC_EINVAL, "ValueError: slices must be positive")
                        : jv_fail(rt, RC_ELIMIT, "LimitError: too many slices");
        jv_decref(rt, items);
        return finish_gen(rt, res, rc, out);
    }
    jlist *l = jv_l(items);
    int64_t length = (int64_t)l->n, per = length / slices, extra = length % slices, offset = 0;
    for (int64_t s = 0; s < slices && rc == 0; s++) {
        int64_t start = offset + s * per;
        if (s < extra)
            offset++;
        int64_t end = offset + (s + 1) * per;
        jv tmp;
        if ((rc = jv_list_new(rt, (size_t)(end - start + 1), &tmp)) < 0)
            break;
        for (int64_t i = start; i < end; i++)
            jv_list_push(rt, jv_l(tmp), l->items[i]);
        if (!jv_missing(p[1]) && p[1].t != JV_NONE && s >= extra)
            rc = jv_list_push(rt, jv_l(tmp), p[1]);
        if (rc == 0)
            rc = jv_list_push_take(rt, jv_l(res), tmp);
        else
            jv_decref(rt, tmp);
    }
    jv_decref(rt, items);
    return finish_gen(rt, res, rc, out);
}

static int f_sort(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_sort", "reverse,case_sensitive,attribute", 3);
    jv items;
    if ((rc = f_list(rt, v, &(jcall){0}, &items)) < 0)
        return rc;
    if ((rc = sort_items(rt, items, arg_or(p[2], jv_none()), true, arg_true(p[1]),
                         arg_true(p[0]))) < 0) {
        jv_decref(rt, items);
        return rc;
    }
    *out = items;
    return 0;
}

static int f_string(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("soft_str", "", 0);
    return to_str(rt, v, out);
}

static int f_striptags(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_striptags", "", 0);
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    const jstr *x = jv_s(s);
    jbuf t = {0}, b = {0};
    /* drop <!-- comments --> and <tags> */
    for (size_t i = 0; i < x->len && rc == 0;) {
        if (x->s[i] == '<') {
            const char *end = NULL;
            if (x->len - i >= 4 && memcmp(x->s + i, "<!--", 4) == 0)
                end = memmem(x->s + i + 4, x->len - i - 4, "-->", 3);
            if (end) {
                i = (size_t)(end - x->s) + 3;
                continue;
            }
            end = memchr(x->s + i, '>', x->len - i);
            if (end) {
                i = (size_t)(end - x->s) + 1;
                continue;
            }
        }
        rc = jbuf_putc(rt, &t, x->s[i++]);
    }
    /* collapse whitespace, then unescape the common entities */
    bool space = false, any = false;
    for (size_t i = 0; i < t.len && rc == 0;) {
        size_t st = i;
        uint32_t c = ju_next(t.p, &i);
        if (ju_isspace(c)) {
            space = true;
            continue;
        }
        if (space && any)
            rc = jbuf_putc(rt, &b, ' ');
        space = false;
        any = true;
        if (rc == 0 && c == '&') {
            static const struct { const char *e; const char *r; } ents[] = {
                {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                {"&#34;", "\""}, {"&#39;", "'"}, {"&apos;", "'"}, {"&nbsp;", "\xc2\xa0"},
            };
            bool done = false;
            for (size_t k = 0; k < sizeof ents / sizeof ents[0] && !done; k++) {
                size_t el = strlen(ents[k].e);
                if (t.len - st >= el && memcmp(t.p + st, ents[k].e, el) == 0) {
                    rc = jbuf_puts(rt, &b, ents[k].r);
                    i = st + el;
                    done = true;
                }
            }
            if (done)
                continue;
        }
        if (rc == 0)
            rc = jbuf_put(rt, &b, t.p + st, i - st);
    }
    jbuf_free(rt, &t);
    jv_decref(rt, s);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

static int f_sum(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_sum", "attribute,start", 2);
    jv items, total = arg_or(p[1], jv_int(0));
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    jv_incref(total);
    for (size_t i = 0; i < jv_l(items)->n && rc == 0; i++) {
        jv x, next;
        if ((rc = attr_path(rt, jv_l(items)->items[i], arg_or(p[0], jv_none()), &x)) < 0)
            break;
        rc = jinja__binop(rt, OP_ADD, total, x, &next);
        jv_decref(rt, x);
        if (rc < 0)
            break;
        jv_decref(rt, total);
        total = next;
    }
    jv_decref(rt, items);
    if (rc < 0) {
        jv_decref(rt, total);
        return rc;
    }
    *out = total;
    return 0;
}

static int f_trim(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_trim", "chars", 1);
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    rc = jinja__str_strip(rt, s, p[0], 3, out);
    jv_decref(rt, s);
    return rc;
}

static int f_truncate(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_truncate", "length,killwords,end,leeway", 4);
    int64_t length = 255, leeway = 5;
    jv s, end = jv_none();
    if (!jv_missing(p[0]) && (rc = jinja__int_arg(rt, p[0], &length)) < 0)
        return rc;
    if (!jv_missing(p[3]) && p[3].t != JV_NONE && (rc = jinja__int_arg(rt, p[3], &leeway)) < 0)
        return rc;
    if (v.t != JV_STR) {
        /* jinja2 uses len(s) and slicing without str(): only short
         * sequences pass through */
        int64_t n;
        if ((rc = jv_len(rt, v, &n)) < 0)
            return rc;
        if (n > length + leeway)
            return jv_fail(rt, RC_EINVAL, "AttributeError: '%s' object has no attribute 'rsplit'",
                           jv_type_name(v));
        jv_incref(v);
        *out = v;
        return 0;
    }
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    if (jv_missing(p[2]))
        rc = jv_cstr(rt, "...", &end);
    else
        rc = to_str(rt, p[2], &end);
    if (rc < 0)
        goto done;
    int64_t n = (int64_t)jv_s(s)->nchars, el = (int64_t)jv_s(end)->nchars;
    if (length < el) {
        rc = jv_fail(rt, RC_EINVAL, "AssertionError: expected length >= %" PRId64 ", got %" PRId64,
                     el, length);
        goto done;
    }
    if (leeway < 0) {
        rc = jv_fail(rt, RC_EINVAL, "AssertionError: expected leeway >= 0, got %" PRId64, leeway);
        goto done;
    }
    if (n <= length + leeway) {
        *out = s;
        jv_incref(s);
        goto done;
    }
    const jstr *x = jv_s(s);
    size_t cut = ju_offset(x->s, x->len, (size_t)(length - el));
    if (!arg_true(p[1])) {
        /* s[:length - len(end)].rsplit(" ", 1)[0] */
        for (size_t i = cut; i-- > 0;)
            if (x->s[i] == ' ') {
                cut = i;
                break;
            }
    }
    jbuf b = {0};
    rc = jbuf_put(rt, &b, x->s, cut);
    if (rc == 0)
        rc = jbuf_put(rt, &b, jv_s(end)->s, jv_s(end)->len);
    if (rc < 0)
        jbuf_free(rt, &b);
    else
        rc = jv_str_from_buf(rt, &b, 0, out);
done:
    jv_decref(rt, s);
    jv_decref(rt, end);
    return rc;
}

static int f_unique(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_unique", "case_sensitive,attribute", 2);
    jv items = jv_none(), seen = jv_none(), res;
    if ((rc = jv_list_new(rt, 0, &res)) < 0)
        return rc;
    if ((rc = jv_items(rt, v, &items)) < 0 || (rc = jv_dict_new(rt, JV_DICT, &seen)) < 0)
        goto done;
    for (size_t i = 0; i < jv_l(items)->n && rc == 0; i++) {
        jv item = jv_l(items)->items[i], k;
        jentry *e;
        if ((rc = item_key(rt, item, arg_or(p[1], jv_none()), false, arg_true(p[0]), &k)) < 0)
            break;
        if ((rc = jv_dict_find(rt, jv_d(seen), k, &e)) == 0 && !e) {
            rc = jv_dict_set(rt, jv_d(seen), k, jv_none());
            if (rc == 0)
                rc = jv_list_push(rt, jv_l(res), item);
        }
        jv_decref(rt, k);
    }
done:
    jv_decref(rt, seen);
    jv_decref(rt, items);
    return finish_gen(rt, res, rc, out);
}

static int f_wordcount(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("do_wordcount", "", 0);
    jv s;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    int64_t n = 0;
    bool in_word = false;
    if ((rc = jv_tick_chars(rt, jv_s(s)->len)) < 0) {
        jv_decref(rt, s);
        return rc;
    }
    for (size_t i = 0; i < jv_s(s)->len;) {
        uint32_t c = ju_next(jv_s(s)->s, &i);
        bool w = ju_isalpha(c) || ju_isdigit(c) || c == '_';
        if (w && !in_word)
            n++;
        in_word = w;
    }
    jv_decref(rt, s);
    *out = jv_int(n);
    return 0;
}

static int f_tojson(jrt *rt, jv v, const jcall *a, jv *out)
{
    BIND("tojson", "ensure_ascii,indent,separators,sort_keys", 4);
    jjson_opts o;
    jbuf ind = {0}, b = {0};
    memset(&o, 0, sizeof o);
    o.ensure_ascii = arg_true(p[0]);
    o.sort_keys = arg_true(p[3]);
    jv indent = arg_or(p[1], jv_none());
    if (indent.t == JV_STR) {
        rc = jbuf_put(rt, &ind, jv_s(indent)->s, jv_s(indent)->len);
        o.indent = ind.p ? ind.p : "";
    } else if (indent.t != JV_NONE) {
        int64_t w;
        if ((rc = jinja__int_arg(rt, indent, &w)) < 0)
            return rc;
        if (w > 10000)
            return jv_fail(rt, RC_ELIMIT, "LimitError: tojson indent too large");
        for (int64_t i = 0; i < w && rc == 0; i++)
            rc = jbuf_putc(rt, &ind, ' ');
        o.indent = ind.p ? ind.p : "";
    }
    o.indent_len = ind.len;
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    jv seps = arg_or(p[2], jv_none());
    if (rc == 0 && seps.t != JV_NONE) {
        if ((seps.t != JV_LIST && seps.t != JV_TUPLE) || jv_l(seps)->n != 2 ||
            jv_l(seps)->items[0].t != JV_STR || jv_l(seps)->items[1].t != JV_STR) {
            rc = jv_fail(rt, RC_EINVAL, "TypeError: separators must be a pair of strings");
        } else {
            o.item_sep = jv_s(jv_l(seps)->items[0])->s;
            o.key_sep = jv_s(jv_l(seps)->items[1])->s;
        }
    }
    o.item_sep_len = strlen(o.item_sep);
    o.key_sep_len = strlen(o.key_sep);
    if (seps.t != JV_NONE && rc == 0) {
        o.item_sep_len = jv_s(jv_l(seps)->items[0])->len;
        o.key_sep_len = jv_s(jv_l(seps)->items[1])->len;
    }
    if (rc == 0)
        rc = jv_write_json(rt, v, &o, &b);
    jbuf_free(rt, &ind);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

/* ---- tests ----------------------------------------------------------------------------- */

#define TEST_NOARG(fn, name, expr)                                         \
    static int fn(jrt *rt, jv v, const jcall *a, bool *out)                 \
    {                                                                       \
        BIND(name, "", 0);                                                  \
        *out = (expr);                                                      \
        return 0;                                                           \
    }

TEST_NOARG(t_defined, "test_defined", v.t != JV_UNDEF)
TEST_NOARG(t_undefined, "test_undefined", v.t == JV_UNDEF)
TEST_NOARG(t_none, "test_none", v.t == JV_NONE)
TEST_NOARG(t_boolean, "test_boolean", v.t == JV_BOOL)
TEST_NOARG(t_false, "test_false", v.t == JV_BOOL && !v.u.b)
TEST_NOARG(t_true, "test_true", v.t == JV_BOOL && v.u.b)
TEST_NOARG(t_integer, "test_integer", v.t == JV_INT)
TEST_NOARG(t_float, "test_float", v.t == JV_FLOAT)
TEST_NOARG(t_number, "test_number", jv_is_num(v))
TEST_NOARG(t_string, "test_string", v.t == JV_STR)
TEST_NOARG(t_mapping, "test_mapping", v.t == JV_DICT)
TEST_NOARG(t_sequence, "test_sequence",
           v.t == JV_UNDEF || v.t == JV_STR || v.t == JV_LIST || v.t == JV_TUPLE || v.t == JV_DICT)
TEST_NOARG(t_iterable, "test_iterable",
           v.t == JV_UNDEF || v.t == JV_STR || v.t == JV_LIST || v.t == JV_TUPLE ||
           v.t == JV_DICT || v.t == JV_ITER || v.t == JV_LOOP)
TEST_NOARG(t_callable, "callable",
           v.t == JV_FUNC || v.t == JV_MACRO || v.t == JV_LOOP || v.t == JV_UNDEF)
TEST_NOARG(t_escaped, "test_escaped", jv_is_markup(v))

static int case_test(jrt *rt, jv v, const jcall *a, bool *out, bool upper)
{
    BIND(upper ? "test_upper" : "test_lower", "", 0);
    jv s, r;
    if ((rc = to_str(rt, v, &s)) < 0)
        return rc;
    jcall none = {0};
    rc = jinja__str_call(rt, jinja__str_method_id(upper ? "isupper" : "islower"), s, &none, &r);
    jv_decref(rt, s);
    if (rc == 0)
        *out = r.u.b != 0;
    return rc;
}
static int t_lower(jrt *rt, jv v, const jcall *a, bool *o) { return case_test(rt, v, a, o, false); }
static int t_upper(jrt *rt, jv v, const jcall *a, bool *o) { return case_test(rt, v, a, o, true); }

/* value % 2 == want (so 2.5 is neither odd nor even, as in jinja2) */
static int mod_test(jrt *rt, jv v, int64_t want, bool *out)
{
    jv r;
    int rc = jinja__binop(rt, OP_MOD, v, jv_int(2), &r);
    if (rc < 0)
        return rc;
    rc = jv_eq(rt, r, jv_int(want), out);
    jv_decref(rt, r);
    return rc;
}

static int t_odd(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_odd", "", 0);
    return mod_test(rt, v, 1, out);
}

static int t_even(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_even", "", 0);
    return mod_test(rt, v, 0, out);
}

static int t_divisibleby(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_divisibleby", "!num", 1);
    jv r;
    if ((rc = jinja__binop(rt, OP_MOD, v, p[0], &r)) < 0)
        return rc;
    rc = jv_eq(rt, r, jv_int(0), out);
    jv_decref(rt, r);
    return rc;
}

static int t_sameas(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_sameas", "!other", 1);
    jv o = p[0];
    if (v.t != o.t)
        *out = false;
    else if (v.t == JV_NONE || v.t == JV_UNDEF)
        *out = v.t == JV_NONE || v.u.o == o.u.o;
    else if (v.t == JV_BOOL)
        *out = v.u.b == o.u.b;
    else if (v.t == JV_INT)   /* CPython caches small ints */
        *out = v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256;
    else if (v.t == JV_FLOAT)
        *out = false;
    else
        *out = v.u.o == o.u.o;
    return 0;
}

static int t_in(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_in", "!seq", 1);
    return jinja__contains(rt, p[0], v, out);
}

static int t_filter(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_filter", "", 0);
    *out = v.t == JV_STR && jinja__filter_id(jv_s(v)->s) >= 0;
    return 0;
}

static int t_test(jrt *rt, jv v, const jcall *a, bool *out)
{
    BIND("test_test", "", 0);
    *out = v.t == JV_STR && jinja__test_id(jv_s(v)->s) >= 0;
    return 0;
}

static int compare_test(jrt *rt, jv v, const jcall *a, bool *out, int op)
{
    BIND("compare", "!b", 1);
    if (op == OP_EQ || op == OP_NE) {
        if ((rc = jv_eq(rt, v, p[0], out)) == 0 && op == OP_NE)
            *out = !*out;
        return rc;
    }
    int c;
    const char *sym = op == OP_LT ? "<" : op == OP_LTEQ ? "<=" : op == OP_GT ? ">" : ">=";
    if ((rc = jv_cmp(rt, v, p[0], sym, &c)) < 0)
        return rc;
    *out = c == 2 ? false : op == OP_LT ? c < 0 : op == OP_LTEQ ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
    return 0;
}
static int t_eq(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_EQ); }
static int t_ne(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_NE); }
static int t_lt(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_LT); }
static int t_le(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_LTEQ); }
static int t_gt(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_GT); }
static int t_ge(jrt *rt, jv v, const jcall *a, bool *o) { return compare_test(rt, v, a, o, OP_GTEQ); }

/* ---- tables ------------------------------------------------------------------------------ */

static const struct { const char *name; filter_fn fn; } FILTERS[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
    {"filesizeformat", NULL}, {"first", f_first}, {"float", f_float},
    {"forceescape", f_forceescape}, {"format", f_format}, {"groupby", f_groupby},
    {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join},
    {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower},
    {"map", f_map}, {"max", f_max}, {"min", f_min}, {"pprint", f_pprint},
    {"random", NULL}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
    {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
    {"select", f_select}, {"selectattr", f_selectattr}, {"slice", f_slice},
    {"sort", f_sort}, {"string", f_string}, {"striptags", f_striptags}, {"sum", f_sum},
    {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate},
    {"unique", f_unique}, {"upper", f_upper}, {"urlencode", NULL}, {"urlize", NULL},
    {"wordcount", f_wordcount}, {"wordwrap", NULL}, {"xmlattr", NULL},
};

static const struct { const char *name; test_fn fn; } TESTS[] = {
    {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
    {"defined", t_defined}, {"undefined", t_undefined}, {"filter", t_filter},
    {"test", t_test}, {"none", t_none}, {"boolean", t_boolean}, {"false", t_false},
    {"true", t_true}, {"integer", t_integer}, {"float", t_float}, {"lower", t_lower},
    {"upper", t_upper}, {"string", t_string}, {"mapping", t_mapping},
    {"number", t_number}, {"sequence", t_sequence}, {"iterable", t_iterable},
    {"callable", t_callable}, {"sameas", t_sameas}, {"escaped", t_escaped},
    {"in", t_in}, {"==", t_eq}, {"eq", t_eq}, {"equalto", t_eq}, {"!=", t_ne},
    {"ne", t_ne}, {">", t_gt}, {"gt", t_gt}, {"greaterthan", t_gt}, {"ge", t_ge},
    {">=", t_ge}, {"<", t_lt}, {"lt", t_lt}, {"lessthan", t_lt}, {"<=", t_le},
    {"le", t_le},
};

int jinja__filter_id(const char *name)
{
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (strcmp(FILTERS[i].name, name) == 0)
            return (int)i;
    return -1;
}

bool jinja__filter_foldable(int fid)
{
    /* pass_context filters never fold; unsupported ones cannot run */
    static const char *const ctx[] = {"map", "select", "reject", "selectattr", "rejectattr",
                                      "random"};
    if (fid < 0 || !FILTERS[fid].fn)
        return false;
    for (size_t i = 0; i < sizeof ctx / sizeof ctx[0]; i++)
        if (strcmp(FILTERS[fid].name, ctx[i]) == 0)
            return false;
    return true;
}

int jinja__test_id(const char *name)
{
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (strcmp(TESTS[i].name, name) == 0)
            return (int)i;
    return -1;
}

int jinja__filter(jrt *rt, int fid, jv v, const jcall *args, jv *out)
{
    if (!FILTERS[fid].fn)
        return jv_fail(rt, RC_EUNSUPPORTED,
                       "TemplateRuntimeError: the '%s' filter is not supported by this engine",
                       FILTERS[fid].name);
    return FILTERS[fid].fn(rt, v, args, out);
}

int jinja__test(jrt *rt, int tid, jv v, const jcall *args, bool *out)
{
    return TESTS[tid].fn(rt, v, args, out);
}
