/* jinja_eval.c - executes the syntax tree: statements, expressions, scopes.
 *
 * Divisions: scopes (a chain from the innermost block to the template's
 * top level, then the render variables, then the builtin globals), the
 * operators (Python semantics, including markupsafe's escaping when a
 * Markup string is added to a plain one), expressions, calls and macros,
 * statements (for loops with `loop`, set, macro, call and filter blocks),
 * and jinja_render, which sets up a render and tears it down.
 *
 * Scoping follows jinja2: `for` bodies, macros, call/filter/set blocks and
 * `with` get a fresh scope per run (per iteration for loops); `if` does
 * not.  Lookup walks the chain, which is what jinja2's compiled closures
 * amount to, except that names jinja2 binds at compile time to a frame
 * variable not assigned yet are pre-declared when the frame starts (the
 * parser's "shadow" lists) and read as undefined.  A macro keeps the scope
 * it was defined in; such scopes are marked captured and freed only when
 * the render ends.  Two more compile-time effects are reproduced here:
 * constant subexpressions with slices are tried as jinja2's optimizer
 * folds them (eval_folded), and a non-string {% filter %} result fails
 * only when its output is joined (join_error).
 *
 * Every eval/exec call counts one step and one level of depth, so hostile
 * templates hit RC_ELIMIT instead of exhausting time or the C stack.
 */
#include "jinja/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* ---- scopes ---------------------------------------------------------------- */

static jscope *scope_new(jrt *rt, jscope *parent)
{
    jscope *s = jv_alloc(rt, sizeof *s);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_clear(jrt *rt, jscope *s)
{
    for (uint32_t i = 0; i < s->cap; i++) {
        if (s->tab[i].name) {
            jv v = s->tab[i].val;
            s->tab[i].name = NULL;
            jv_decref(rt, v);
        }
    }
    s->n = 0;
}

static void scope_destroy(jrt *rt, jscope *s)
{
    scope_clear(rt, s);
    jv_dealloc(rt, s->tab, s->cap * sizeof(jvar));
    jv_dealloc(rt, s, sizeof *s);
}

/* Ends a scope's run: freed now, or at the end when a macro holds it. */
static void scope_release(jrt *rt, jscope *s)
{
    if (!s)
        return;
    if (s->captured) {
        s->next_kept = rt->kept;
        rt->kept = s;
        return;
    }
    scope_destroy(rt, s);
}

static void scope_capture(jscope *s)
{
    for (; s && !s->captured; s = s->parent)
        s->captured = true;
}

static jvar *scope_find(const jscope *s, const char *name, uint32_t hash)
{
    if (!s->cap)
        return NULL;
    uint32_t mask = s->cap - 1;
    for (uint32_t k = hash & mask;; k = (k + 1) & mask) {
        jvar *v = &s->tab[k];
        if (!v->name)
            return NULL;
        if (v->hash == hash && strcmp(v->name, name) == 0)
            return v;
    }
}

static int scope_set(jrt *rt, jscope *s, const char *name, uint32_t hash, jv val)
{
    jvar *v = scope_find(s, name, hash);
    if (v) {
        jv old = v->val;
        jv_incref(val);
        v->val = val;
        jv_decref(rt, old);
        return 0;
    }
    if ((s->n + 1) * 2 > s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 8;
        jvar *nt = jv_alloc(rt, nc * sizeof *nt);
        if (!nt)
            return jv_nomem(rt);
        memset(nt, 0, nc * sizeof *nt);
        for (uint32_t i = 0; i < s->cap; i++) {
            if (!s->tab[i].name)
                continue;
            uint32_t k = s->tab[i].hash & (nc - 1);
            while (nt[k].name)
                k = (k + 1) & (nc - 1);
            nt[k] = s->tab[i];
        }
        jv_dealloc(rt, s->tab, s->cap * sizeof(jvar));
        s->tab = nt;
        s->cap = nc;
    }
    uint32_t k = hash & (s->cap - 1);
    while (s->tab[k].name)
        k = (k + 1) & (s->cap - 1);
    s->tab[k].name = name;
    s->tab[k].hash = hash;
    jv_incref(val);
    s->tab[k].val = val;
    s->n++;
    return 0;
}

static int scope_set_str(jrt *rt, jscope *s, const char *name, jv val)
{
    return scope_set(rt, s, name, jinja__hash_name(name, strlen(name)), val);
}

/* Declares a frame's not-yet-assigned names (see jnode.shadow). */
static int scope_shadow(jrt *rt, jscope *s, const jnode *body)
{
    jv marker = {JV_UNDEF, {0}};
    marker.u.o = &jinja__shadow_obj;
    for (uint32_t i = 0; i < body->n_shadow; i++) {
        int rc = scope_set(rt, s, body->shadow[i].s, body->shadow[i].hash, marker);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static bool is_shadow(jv v) { return v.t == JV_UNDEF && v.u.o == &jinja__shadow_obj; }

/* Finds a name along the scope chain, then in the render variables; a
 * declared-but-unassigned name (a shadow) is found as such. */
static bool scope_lookup(jrt *rt, const jscope *s, const char *name, uint32_t hash, jv *out)
{
    for (; s; s = s->parent) {
        jvar *v = scope_find(s, name, hash);
        if (v) {
            *out = v->val;
            return true;
        }
    }
    if (rt->globals) {
        jvar *v = scope_find(rt->globals, name, hash);
        if (v) {
            *out = v->val;
            return true;
        }
    }
    return false;
}

/* ---- operators ----------------------------------------------------------------- */

static int overflow(jrt *rt)
{
    return jv_fail(rt, RC_ELIMIT, "OverflowError: integer result does not fit in 64 bits");
}

static int unsupported(jrt *rt, const char *op, jv a, jv b)
{
    return jv_fail(rt, RC_EINVAL, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'",
                   op, jv_type_name(a), jv_type_name(b));
}

static int concat_strings(jrt *rt, jv a, jv b, jv *out)
{
    jv ea = a, eb = b;
    int rc = 0;
    bool markup = jv_is_markup(a) || jv_is_markup(b);
    if (markup) {
        /* markupsafe: Markup + str escapes the plain side */
        if (!jv_is_markup(a) && (rc = jinja__escape(rt, a, &ea)) < 0)
            return rc;
        if (!jv_is_markup(b) && (rc = jinja__escape(rt, b, &eb)) < 0) {
            if (ea.u.o != a.u.o)
                jv_decref(rt, ea);
            return rc;
        }
    }
    const jstr *parts[2] = {jv_s(ea), jv_s(eb)};
    rc = jv_str_cat(rt, parts, 2, markup ? JS_MARKUP : 0, out);
    if (ea.u.o != a.u.o)
        jv_decref(rt, ea);
    if (eb.u.o != b.u.o)
        jv_decref(rt, eb);
    return rc;
}

static int concat_seq(jrt *rt, jv a, jv b, jv *out)
{
    jlist *x = jv_l(a), *y = jv_l(b);
    int rc = jv_list_new(rt, x->n + y->n, out);
    if (rc < 0)
        return rc;
    jlist *l = jv_l(*out);
    for (size_t i = 0; i < x->n; i++)
        jv_list_push(rt, l, x->items[i]);
    for (size_t i = 0; i < y->n; i++)
        jv_list_push(rt, l, y->items[i]);
    if (a.t == JV_TUPLE) {
        out->t = JV_TUPLE;
        out->u.o->type = JV_TUPLE;
    }
    return jv_tick(rt, l->n / 8);
}

static int repeat(jrt *rt, jv seq, int64_t times, jv *out)
{
    if (times < 0)
        times = 0;
    int rc;
    if (seq.t == JV_STR) {
        jstr *s = jv_s(seq);
        if (s->len && (uint64_t)times > rt->lim.max_output_bytes / s->len)
            return jv_fail(rt, RC_ELIMIT, "LimitError: string repetition exceeds %zu bytes",
                           rt->lim.max_output_bytes);
        jbuf b = {0};
        for (int64_t i = 0; i < times && s->len; i++)
            if ((rc = jbuf_put(rt, &b, s->s, s->len)) < 0) {
                jbuf_free(rt, &b);
                return rc;
            }
        return jv_str_from_buf(rt, &b, s->h.flags & JS_MARKUP, out);
    }
    jlist *x = jv_l(seq);
    if (x->n && (uint64_t)times > (rt->lim.max_memory_bytes / sizeof(jv)) / x->n)
        return jv_fail(rt, RC_ELIMIT, "LimitError: list repetition too large");
    if ((rc = jv_list_new(rt, x->n * (size_t)times, out)) < 0)
        return rc;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < x->n; k++)
            jv_list_push(rt, jv_l(*out), x->items[k]);
    if (seq.t == JV_TUPLE) {
        out->t = JV_TUPLE;
        out->u.o->type = JV_TUPLE;
    }
    return jv_tick(rt, (uint64_t)times * x->n / 8);
}

static double py_fmod(double x, double y)
{
    double m = fmod(x, y);
    if (m != 0.0) {
        if ((y < 0) != (m < 0))
            m += y;
    } else {
        m = copysign(0.0, y);
    }
    return m;
}

static double py_floordiv(double x, double y)
{
    double mod = fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0.0 && ((y < 0) != (mod < 0)))
        div -= 1.0;
    if (div != 0.0) {
        double f = floor(div);
        if (div - f > 0.5)
            f += 1.0;
        return f;
    }
    return copysign(0.0, x / y);
}

int jinja__binop(jrt *rt, int op, jv a, jv b, jv *out)
{
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op == OP_MOD && a.t == JV_STR)
        return jinja__percent_format(rt, a, b, out);
    if (a.t == JV_UNDEF)
        return jv_undef_raise(rt, a);
    if (b.t == JV_UNDEF)
        return jv_undef_raise(rt, b);
    bool nums = jv_is_num(a) && jv_is_num(b);
    bool ints = jv_is_intlike(a) && jv_is_intlike(b);
    switch (op) {
    case OP_ADD:
        if (ints) {
            int64_t r;
            if (__builtin_add_overflow(jv_as_int(a), jv_as_int(b), &r))
                return overflow(rt);
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(jv_as_float(a) + jv_as_float(b));
            return 0;
        }
        if (a.t == JV_STR && b.t == JV_STR)
            return concat_strings(rt, a, b, out);
        if (jv_is_seq(a) && jv_is_seq(b) && a.t == b.t)
            return concat_seq(rt, a, b, out);
        if (a.t == JV_STR || jv_is_seq(a))
            return jv_fail(rt, RC_EINVAL, "TypeError: can only concatenate %s (not \"%s\") to %s",
                           a.t == JV_STR ? "str" : jv_type_name(a), jv_type_name(b),
                           a.t == JV_STR ? "str" : jv_type_name(a));
        return unsupported(rt, "+", a, b);
    case OP_SUB:
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(jv_as_int(a), jv_as_int(b), &r))
                return overflow(rt);
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(jv_as_float(a) - jv_as_float(b));
            return 0;
        }
        return unsupported(rt, "-", a, b);
    case OP_MUL:
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(jv_as_int(a), jv_as_int(b), &r))
                return overflow(rt);
            *out = jv_int(r);
            return 0;
        }
        if (nums) {
            *out = jv_float(jv_as_float(a) * jv_as_float(b));
            return 0;
        }
        if (jv_is_range(a) || jv_is_range(b) || jv_is_view(a) || jv_is_view(b))
            return unsupported(rt, "*", a, b);
        if ((a.t == JV_STR || a.t == JV_LIST || a.t == JV_TUPLE) && jv_is_intlike(b))
            return repeat(rt, a, jv_as_int(b), out);
        if ((b.t == JV_STR || b.t == JV_LIST || b.t == JV_TUPLE) && jv_is_intlike(a))
            return repeat(rt, b, jv_as_int(a), out);
        if (a.t == JV_STR || a.t == JV_LIST || a.t == JV_TUPLE)
            return jv_fail(rt, RC_EINVAL, "TypeError: can't multiply sequence by non-int of type '%s'",
                           jv_type_name(b));
        if (b.t == JV_STR || b.t == JV_LIST || b.t == JV_TUPLE)
            return jv_fail(rt, RC_EINVAL, "TypeError: can't multiply sequence by non-int of type '%s'",
                           jv_type_name(a));
        return unsupported(rt, "*", a, b);
    case OP_DIV:
        if (!nums)
            return unsupported(rt, "/", a, b);
        if (jv_as_float(b) == 0.0)
            return jv_fail(rt, RC_EINVAL, ints ? "ZeroDivisionError: division by zero"
                                               : "ZeroDivisionError: float division by zero");
        *out = jv_float(jv_as_float(a) / jv_as_float(b));
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (!nums)
            return unsupported(rt, names[op], a, b);
        if (ints) {
            int64_t x = jv_as_int(a), y = jv_as_int(b);
            if (y == 0)
                return jv_fail(rt, RC_EINVAL, op == OP_MOD ? "ZeroDivisionError: integer modulo by zero"
                                                           : "ZeroDivisionError: integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == OP_MOD) {
                    *out = jv_int(0);
                    return 0;
                }
                return overflow(rt);
            }
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                q -= 1;
                r += y;
            }
            *out = jv_int(op == OP_MOD ? r : q);
            return 0;
        }
        if (jv_as_float(b) == 0.0)
            return jv_fail(rt, RC_EINVAL, op == OP_MOD ? "ZeroDivisionError: float modulo"
                                                       : "ZeroDivisionError: float floor division by zero");
        *out = jv_float(op == OP_MOD ? py_fmod(jv_as_float(a), jv_as_float(b))
                                     : py_floordiv(jv_as_float(a), jv_as_float(b)));
        return 0;
    case OP_POW:
        if (!nums)
            return unsupported(rt, "** or pow()", a, b);
        if (ints && jv_as_int(b) >= 0) {
            int64_t base = jv_as_int(a), e = jv_as_int(b), r = 1;
            while (e > 0) {
                if (e & 1) {
                    if (__builtin_mul_overflow(r, base, &r))
                        return overflow(rt);
                }
                e >>= 1;
                if (e > 0 && __builtin_mul_overflow(base, base, &base))
                    return overflow(rt);
            }
            *out = jv_int(r);
            return 0;
        }
        {
            double x = jv_as_float(a), y = jv_as_float(b);
            if (x == 0.0 && y < 0)
                return jv_fail(rt, RC_EINVAL,
                               "ZeroDivisionError: 0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                return jv_fail(rt, RC_EUNSUPPORTED,
                               "ValueError: complex results of ** are not supported");
            *out = jv_float(pow(x, y));
            return 0;
        }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: bad operator");
    }
}

int jinja__contains(jrt *rt, jv c, jv item, bool *out)
{
    int rc;
    *out = false;
    switch (c.t) {
    case JV_STR:
        if (item.t != JV_STR)
            return jv_fail(rt, RC_EINVAL,
                           "TypeError: 'in <string>' requires string as left operand, not %s",
                           jv_type_name(item));
        *out = jv_s(item)->len == 0 ||
               memmem(jv_s(c)->s, jv_s(c)->len, jv_s(item)->s, jv_s(item)->len) != NULL;
        return jv_tick_bytes(rt, jv_s(c)->len);
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = jv_l(c);
        for (size_t i = 0; i < l->n; i++) {
            if ((rc = jv_eq(rt, l->items[i], item, out)) < 0 || *out)
                return rc;
        }
        return jv_tick(rt, l->n / 4);
    }
    case JV_DICT: {
        jentry *e;
        if ((rc = jv_dict_find(rt, jv_d(c), item, &e)) < 0)
            return rc;
        *out = e != NULL;
        return 0;
    }
    case JV_UNDEF:
        return 0;
    case JV_ITER: {
        jiter *it = (jiter *)c.u.o;
        while (it->items && it->pos < it->items->n) {
            jv x = it->items->items[it->pos++];
            if ((rc = jv_eq(rt, x, item, out)) < 0 || *out)
                return rc;
        }
        return it->err ? jv_fail(rt, it->err_rc, "%s", it->err) : 0;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: argument of type '%s' is not iterable",
                       jv_type_name(c));
    }
}

/* ---- expressions -------------------------------------------------------------------- */

static int eval(jrt *rt, const jnode *n, jscope *sc, jv *out);
static int exec(jrt *rt, const jnode *n, jscope *sc);

/* Evaluated call arguments (owned). */
typedef struct args_buf {
    jv    *pos;
    size_t n_pos;
    jname *kw_names;
    jv    *kw;
    size_t n_kw;
    jv     hold;        /* the ** mapping, whose keys the names point into */
} args_buf;

static void args_free(jrt *rt, args_buf *a)
{
    for (size_t i = 0; i < a->n_pos; i++)
        jv_decref(rt, a->pos[i]);
    for (size_t i = 0; i < a->n_kw; i++)
        jv_decref(rt, a->kw[i]);
    rc_free(a->pos);
    rc_free(a->kw);
    rc_free(a->kw_names);
    jv_decref(rt, a->hold);
    memset(a, 0, sizeof *a);
}

static int args_push_kw(jrt *rt, args_buf *a, jname name, jv v_take)
{
    jv *nk = rc_realloc(a->kw, (a->n_kw + 1) * sizeof *nk);
    if (!nk) {
        jv_decref(rt, v_take);
        return jv_nomem(rt);
    }
    a->kw = nk;
    jname *nn = rc_realloc(a->kw_names, (a->n_kw + 1) * sizeof *nn);
    if (!nn) {
        jv_decref(rt, v_take);
        return jv_nomem(rt);
    }
    a->kw_names = nn;
    a->kw_names[a->n_kw] = name;
    a->kw[a->n_kw++] = v_take;
    return 0;
}

/* Evaluates items/kw/(*d)/(**e) of a call-like node; `extra` adds one more
 * keyword argument (the caller of a call block). */
static int eval_args(jrt *rt, const jnode *n, jscope *sc, args_buf *a, const char *extra_name,
                     jv extra)
{
    int rc = 0;
    memset(a, 0, sizeof *a);
    size_t n_extra = 0;
    jv star = jv_none();
    if (n->d) {
        jv v;
        if ((rc = eval(rt, n->d, sc, &v)) < 0)
            return rc;
        rc = jv_items(rt, v, &star);
        jv_decref(rt, v);
        if (rc < 0)
            return rc;
        n_extra = jv_l(star)->n;
    }
    if (n->n_items + n_extra) {
        a->pos = rc_calloc(n->n_items + n_extra, sizeof *a->pos);
        if (!a->pos) {
            jv_decref(rt, star);
            return jv_nomem(rt);
        }
    }
    for (uint32_t i = 0; i < n->n_items; i++) {
        if ((rc = eval(rt, n->items[i], sc, &a->pos[i])) < 0)
            goto fail;
        a->n_pos++;
    }
    for (size_t i = 0; i < n_extra; i++) {
        jv x = jv_l(star)->items[i];
        jv_incref(x);
        a->pos[a->n_pos++] = x;
    }
    jv_decref(rt, star);
    star = jv_none();
    for (uint32_t i = 0; i < n->n_kw; i++) {
        jv v;
        if ((rc = eval(rt, n->kwvals[i], sc, &v)) < 0 ||
            (rc = args_push_kw(rt, a, n->kwnames[i], v)) < 0)
            goto fail;
    }
    if (n->e) {
        jv v;
        if ((rc = eval(rt, n->e, sc, &v)) < 0)
            goto fail;
        if (v.t != JV_DICT) {
            rc = jv_fail(rt, RC_EINVAL, "TypeError: argument after ** must be a mapping, not %s",
                         jv_type_name(v));
            jv_decref(rt, v);
            goto fail;
        }
        a->hold = v;
        jdict *d = jv_d(v);
        for (size_t i = 0; i < d->n; i++) {
            if (d->e[i].key.t != JV_STR) {
                rc = jv_fail(rt, RC_EINVAL, "TypeError: keywords must be strings");
                goto fail;
            }
            jname nm = {jv_s(d->e[i].key)->s,
                        jinja__hash_name(jv_s(d->e[i].key)->s, jv_s(d->e[i].key)->len)};
            jv_incref(d->e[i].val);
            if ((rc = args_push_kw(rt, a, nm, d->e[i].val)) < 0)
                goto fail;
        }
    }
    if (extra_name) {
        jname nm = {extra_name, jinja__hash_name(extra_name, strlen(extra_name))};
        jv_incref(extra);
        if ((rc = args_push_kw(rt, a, nm, extra)) < 0)
            goto fail;
    }
    return 0;
fail:
    jv_decref(rt, star);
    args_free(rt, a);
    return rc;
}

static jcall as_call(const args_buf *a)
{
    jcall c = {a->pos, a->n_pos, a->kw_names, a->kw, a->n_kw};
    return c;
}

static int undefined_name(jrt *rt, const jnode *n, jv *out)
{
    return jv_undef_name(rt, n->name.s, out);
}

static int eval_name(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    jv v;
    if (scope_lookup(rt, sc, n->name.s, n->name.hash, &v)) {
        if (is_shadow(v))
            return undefined_name(rt, n, out);
        jv_incref(v);
        *out = v;
        return 0;
    }
    int rc = 0;
    if (jinja__global(rt, n->name.s, out, &rc))
        return rc;
    return undefined_name(rt, n, out);
}

static int compare_op(jrt *rt, int op, jv a, jv b, bool *res)
{
    int rc, c;
    switch (op) {
    case OP_EQ:
    case OP_NE:
        if ((rc = jv_eq(rt, a, b, res)) < 0)
            return rc;
        if (op == OP_NE)
            *res = !*res;
        return 0;
    case OP_IN:
    case OP_NOTIN:
        if ((rc = jinja__contains(rt, b, a, res)) < 0)
            return rc;
        if (op == OP_NOTIN)
            *res = !*res;
        return 0;
    default: {
        const char *sym = op == OP_LT ? "<" : op == OP_LTEQ ? "<=" : op == OP_GT ? ">" : ">=";
        if ((rc = jv_cmp(rt, a, b, sym, &c)) < 0)
            return rc;
        if (c == 2)
            *res = false;
        else
            *res = op == OP_LT ? c < 0 : op == OP_LTEQ ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
        return 0;
    }
    }
}

static int eval_compare(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    jv left;
    int rc = eval(rt, n->a, sc, &left);
    if (rc < 0)
        return rc;
    bool res = true;
    for (uint32_t i = 0; i < n->n_items && res; i++) {
        jv right;
        if ((rc = eval(rt, n->items[i]->a, sc, &right)) < 0)
            break;
        rc = compare_op(rt, n->items[i]->op, left, right, &res);
        jv_decref(rt, left);
        left = right;
        if (rc < 0)
            break;
    }
    jv_decref(rt, left);
    if (rc < 0)
        return rc;
    *out = jv_bool(res);
    return 0;
}

static int eval_seq(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    int rc = jv_list_new(rt, n->n_items, out);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < n->n_items; i++) {
        jv v;
        if ((rc = eval(rt, n->items[i], sc, &v)) < 0 ||
            (rc = jv_list_push_take(rt, jv_l(*out), v)) < 0) {
            jv_clear(rt, out);
            return rc;
        }
    }
    if (n->kind == N_TUPLE) {
        out->t = JV_TUPLE;
        out->u.o->type = JV_TUPLE;
    }
    return 0;
}

static int eval_dict(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    int rc = jv_dict_new(rt, JV_DICT, out);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i + 1 < n->n_items; i += 2) {
        jv k, v;
        if ((rc = eval(rt, n->items[i], sc, &k)) < 0)
            goto fail;
        if ((rc = eval(rt, n->items[i + 1], sc, &v)) < 0) {
            jv_decref(rt, k);
            goto fail;
        }
        rc = jv_dict_set(rt, jv_d(*out), k, v);
        jv_decref(rt, k);
        jv_decref(rt, v);
        if (rc < 0)
            goto fail;
    }
    return 0;
fail:
    jv_clear(rt, out);
    return rc;
}

static int eval_call(jrt *rt, const jnode *n, jscope *sc, const char *extra_name, jv extra,
                     jv *out)
{
    jv callee;
    args_buf a;
    int rc = eval(rt, n->a, sc, &callee);
    if (rc < 0)
        return rc;
    if ((rc = eval_args(rt, n, sc, &a, extra_name, extra)) < 0) {
        jv_decref(rt, callee);
        return rc;
    }
    jcall c = as_call(&a);
    rc = jinja__call(rt, callee, &c, out);
    args_free(rt, &a);
    jv_decref(rt, callee);
    return rc;
}

static int eval_filter(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    jv v;
    int rc;
    if (n->a) {
        if ((rc = eval(rt, n->a, sc, &v)) < 0)
            return rc;
    } else {
        v = rt->block_input ? *rt->block_input : jv_undef();
        jv_incref(v);
    }
    args_buf a;
    if ((rc = eval_args(rt, n, sc, &a, NULL, jv_none())) < 0) {
        jv_decref(rt, v);
        return rc;
    }
    jcall c = as_call(&a);
    if (n->fid < 0) {
        /* jinja2 defers unknown names inside if/conditional expressions to
         * this point, after the operands were evaluated */
        rc = jv_fail(rt, RC_EINVAL, "TemplateRuntimeError: No %s named '%s' found.",
                     n->kind == N_FILTER ? "filter" : "test", n->name.s);
    } else if (n->kind == N_FILTER) {
        rc = jinja__filter(rt, n->fid, v, &c, out);
    } else {
        bool r = false;
        rc = jinja__test(rt, n->fid, v, &c, &r);
        if (rc == 0)
            *out = jv_bool(r);
    }
    args_free(rt, &a);
    jv_decref(rt, v);
    return rc;
}

static int eval_getitem(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    jv obj;
    int rc = eval(rt, n->a, sc, &obj);
    if (rc < 0)
        return rc;
    if (n->b->kind == N_SLICE) {
        jv bounds[3] = {jv_none(), jv_none(), jv_none()};
        const jnode *parts[3] = {n->b->a, n->b->b, n->b->c};
        for (int i = 0; i < 3 && rc == 0; i++)
            if (parts[i])
                rc = eval(rt, parts[i], sc, &bounds[i]);
        if (rc == 0 && rt->folding && obj.t != JV_STR && obj.t != JV_LIST && obj.t != JV_TUPLE &&
            obj.t != JV_UNDEF) {
            /* folded at compile time through environment.getitem, which
             * turns the TypeError into an undefined value */
            rc = jv_undef_hint(rt, "the object cannot be sliced", out);
        } else if (rc == 0) {
            rc = jinja__slice(rt, obj, bounds[0], bounds[1], bounds[2], out);
        }
        for (int i = 0; i < 3; i++)
            jv_decref(rt, bounds[i]);
        jv_decref(rt, obj);
        return rc;
    }
    jv key;
    if ((rc = eval(rt, n->b, sc, &key)) < 0) {
        jv_decref(rt, obj);
        return rc;
    }
    rc = jinja__getitem(rt, obj, key, out);
    jv_decref(rt, key);
    jv_decref(rt, obj);
    return rc;
}

static int eval_concat(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    /* `~` is str() of every operand joined: evaluate all, then copy once */
    jv *vals = rc_calloc(n->n_items, sizeof *vals);
    const jstr **parts = rc_calloc(n->n_items, sizeof *parts);
    uint32_t got = 0;
    int rc = 0;
    if (!vals || !parts)
        rc = jv_nomem(rt);
    for (; rc == 0 && got < n->n_items; got++) {
        jv v, s;
        if ((rc = eval(rt, n->items[got], sc, &v)) < 0)
            break;
        if (v.t == JV_UNDEF) {
            jv_decref(rt, v);
            rc = jv_str(rt, "", 0, &s);
        } else {
            rc = jv_to_str(rt, v, &s);
            jv_decref(rt, v);
        }
        if (rc < 0)
            break;
        vals[got] = s;
        parts[got] = jv_s(s);
    }
    if (rc == 0)
        rc = jv_str_cat(rt, parts, n->n_items, 0, out);
    for (uint32_t i = 0; vals && i < got; i++)
        jv_decref(rt, vals[i]);
    rc_free(vals);
    rc_free(parts);
    return rc;
}

static int eval_node(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    jv a, b;
    int rc;
    switch (n->kind) {
    case N_CONST:
        *out = n->cval;
        jv_incref(*out);
        return 0;
    case N_NAME:
        return eval_name(rt, n, sc, out);
    case N_GETATTR:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        rc = a.t == JV_UNDEF ? jv_undef_raise(rt, a) : jinja__getattr(rt, a, n->attr.s, out);
        jv_decref(rt, a);
        return rc;
    case N_GETITEM:
        return eval_getitem(rt, n, sc, out);
    case N_CALL:
        return eval_call(rt, n, sc, NULL, jv_none(), out);
    case N_FILTER:
    case N_TEST:
        return eval_filter(rt, n, sc, out);
    case N_LIST:
    case N_TUPLE:
        return eval_seq(rt, n, sc, out);
    case N_DICT:
        return eval_dict(rt, n, sc, out);
    case N_BINOP:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        if ((rc = eval(rt, n->b, sc, &b)) < 0) {
            jv_decref(rt, a);
            return rc;
        }
        rc = jinja__binop(rt, n->op, a, b, out);
        jv_decref(rt, a);
        jv_decref(rt, b);
        return rc;
    case N_CONCAT:
        return eval_concat(rt, n, sc, out);
    case N_NEG:
    case N_POS:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        if (a.t == JV_UNDEF) {
            rc = jv_undef_raise(rt, a);
        } else if (!jv_is_num(a)) {
            rc = jv_fail(rt, RC_EINVAL, "TypeError: bad operand type for unary %c: '%s'",
                         n->kind == N_NEG ? '-' : '+', jv_type_name(a));
        } else if (a.t == JV_FLOAT) {
            *out = jv_float(n->kind == N_NEG ? -a.u.f : a.u.f);
        } else if (n->kind == N_NEG && jv_as_int(a) == INT64_MIN) {
            rc = overflow(rt);
        } else {
            *out = jv_int(n->kind == N_NEG ? -jv_as_int(a) : jv_as_int(a));
        }
        jv_decref(rt, a);
        return rc;
    case N_NOT:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        *out = jv_bool(!jv_truthy(a));
        jv_decref(rt, a);
        return 0;
    case N_AND:
    case N_OR:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        if (jv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        jv_decref(rt, a);
        return eval(rt, n->b, sc, out);
    case N_COMPARE:
        return eval_compare(rt, n, sc, out);
    case N_CONDEXPR:
        if ((rc = eval(rt, n->a, sc, &a)) < 0)
            return rc;
        bool t = jv_truthy(a);
        jv_decref(rt, a);
        if (t)
            return eval(rt, n->b, sc, out);
        if (n->c)
            return eval(rt, n->c, sc, out);
        if (rt->folding)    /* as_const gives up here */
            return jv_fail(rt, RC_EINVAL, "Impossible");
        return jv_undef_hint(rt, "the inline if-expression evaluated to false and no else "
                                 "section was defined.", out);
    default:
        return jv_fail(rt, RC_EINVAL, "TemplateRuntimeError: cannot evaluate this expression");
    }
}

static int depth_error(jrt *rt)
{
    return jv_fail(rt, RC_ELIMIT, "LimitError: template recursion deeper than %u levels",
                   rt->lim.max_depth);
}

/* Evaluates a NF_FOLD subtree as jinja2's compile-time folding would; a
 * failure, or a result jinja2 would not embed as a constant (undefined,
 * generators: only output expressions take any value), falls back to the
 * normal run-time evaluation. */
static int eval_folded(jrt *rt, const jnode *n, jscope *sc, bool output, jv *out)
{
    uint32_t line = rt->err_line;
    rt->folding = true;
    int rc = eval_node(rt, n, sc, out);
    rt->folding = false;
    if (rc == 0 && (output || jv_safe_repr(*out, 0)))
        return 0;
    if (rc == 0)
        jv_clear(rt, out);
    else if (rc == RC_ELIMIT || rc == RC_ENOMEM)
        return rc;
    rt->err_line = line;
    return eval_node(rt, n, sc, out);
}

static int eval(jrt *rt, const jnode *n, jscope *sc, jv *out)
{
    if (rt->depth >= rt->lim.max_depth)
        return depth_error(rt);
    rt->depth++;
    int rc = jv_tick(rt, 1);
    if (rc == 0)
        rc = (n->flags & NF_FOLD) && !rt->folding ? eval_folded(rt, n, sc, false, out)
                                                   : eval_node(rt, n, sc, out);
    rt->depth--;
    if (rc < 0 && !rt->err_line)
        rt->err_line = n->line;
    return rc;
}

/* ---- calls and macros ---------------------------------------------------------------- */

static const char *macro_name(const jmacro *m)
{
    return m->def->kind == N_MACRO ? m->def->name.s : "caller";
}

/* Runs `body` in `sc` with its output captured into a new string. */
static int join_failed(jrt *rt)
{
    const char *type = rt->join_error;
    rt->join_error = NULL;
    return jv_fail(rt, RC_EINVAL, "TypeError: sequence item 0: expected str instance, %s found",
                   type);
}

static int capture(jrt *rt, const jnode *body, jscope *sc, jv *out)
{
    jbuf b = {0}, *saved = rt->out;
    const char *saved_join = rt->join_error;
    rt->out = &b;
    rt->join_error = NULL;
    int rc = exec(rt, body, sc);
    if (rc == 0 && rt->join_error)
        rc = join_failed(rt);
    rt->join_error = saved_join;
    rt->out = saved;
    if (rc != 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, 0, out);
}

static int call_macro(jrt *rt, jmacro *m, const jcall *a, jv *out)
{
    /* binding follows jinja2's Macro.__call__: positional arguments first,
     * keywords only for the parameters left over, then caller, **kwargs
     * and *varargs, checked in that order */
    const jnode *def = m->def;
    const char *name = macro_name(m);
    uint32_t np = def->n_items;
    int rc = 0;
    jscope *sc = scope_new(rt, m->closure);
    if (!sc)
        return jv_nomem(rt);
    bool *bound = rc_calloc(np + 1, sizeof *bound);
    bool *used = rc_calloc(a->n_kw + 1, sizeof *used);
    jv kwargs = jv_none(), varargs = jv_none(), caller = jv_undef();
    bool have_caller = false;
    if (!bound || !used) {
        rc = jv_nomem(rt);
        goto done;
    }
    for (size_t i = 0; i < a->n_pos && i < np; i++) {
        const jname *pn = &def->items[i]->name;
        if ((rc = scope_set(rt, sc, pn->s, pn->hash, a->pos[i])) < 0)
            goto done;
        bound[i] = true;
    }
    for (uint32_t i = (uint32_t)(a->n_pos < np ? a->n_pos : np); i < np; i++) {
        for (size_t k = 0; k < a->n_kw; k++) {
            if (used[k] || strcmp(def->items[i]->name.s, a->kw_names[k].s) != 0)
                continue;
            if ((rc = scope_set(rt, sc, a->kw_names[k].s, a->kw_names[k].hash, a->kw[k])) < 0)
                goto done;
            bound[i] = used[k] = true;
            break;
        }
    }
    if (def->flags & NF_CALLER) {
        for (size_t k = 0; k < a->n_kw; k++)
            if (!used[k] && strcmp(a->kw_names[k].s, "caller") == 0) {
                caller = a->kw[k];
                have_caller = used[k] = true;
                break;
            }
    }
    if (def->flags & NF_KWARGS && (rc = jv_dict_new(rt, JV_DICT, &kwargs)) < 0)
        goto done;
    for (size_t k = 0; k < a->n_kw; k++) {
        if (used[k])
            continue;
        if (def->flags & NF_KWARGS) {
            jv key;
            if ((rc = jv_cstr(rt, a->kw_names[k].s, &key)) < 0)
                goto done;
            rc = jv_dict_set(rt, jv_d(kwargs), key, a->kw[k]);
            jv_decref(rt, key);
            if (rc < 0)
                goto done;
            continue;
        }
        for (size_t c = 0; c < a->n_kw; c++)
            if (!used[c] && strcmp(a->kw_names[c].s, "caller") == 0) {
                rc = jv_fail(rt, RC_EINVAL, "TypeError: macro '%s' was invoked with two values for "
                             "the special caller argument. This is most likely a bug.", name);
                goto done;
            }
        rc = jv_fail(rt, RC_EINVAL, "TypeError: macro '%s' takes no keyword argument '%s'",
                     name, a->kw_names[k].s);
        goto done;
    }
    if (a->n_pos > np && !(def->flags & NF_VARARGS)) {
        rc = jv_fail(rt, RC_EINVAL, "TypeError: macro '%s' takes not more than %u argument(s)",
                     name, np);
        goto done;
    }
    for (uint32_t i = 0; i < np; i++) {
        if (bound[i])
            continue;
        const jname *pn = &def->items[i]->name;
        jv v;
        if (def->kwvals[i])
            rc = eval(rt, def->kwvals[i], sc, &v);
        else
            rc = jv_undef_name(rt, pn->s, &v);
        if (rc < 0)
            goto done;
        rc = scope_set(rt, sc, pn->s, pn->hash, v);
        jv_decref(rt, v);
        if (rc < 0)
            goto done;
    }
    if (def->flags & NF_VARARGS) {
        size_t extra = a->n_pos > np ? a->n_pos - np : 0;
        if ((rc = jv_tuple_new(rt, extra, &varargs)) < 0)
            goto done;
        for (size_t i = 0; i < extra; i++) {
            jv_incref(a->pos[np + i]);
            jv_l(varargs)->items[i] = a->pos[np + i];
        }
        if ((rc = scope_set_str(rt, sc, "varargs", varargs)) < 0)
            goto done;
    }
    if (def->flags & NF_KWARGS && (rc = scope_set_str(rt, sc, "kwargs", kwargs)) < 0)
        goto done;
    if (def->flags & NF_CALLER) {
        jv c = caller;
        if (!have_caller && (rc = jv_undef_hint(rt, "No caller defined", &c)) < 0)
            goto done;
        rc = scope_set_str(rt, sc, "caller", c);
        if (!have_caller)
            jv_decref(rt, c);
        if (rc < 0)
            goto done;
    }
    if ((rc = scope_shadow(rt, sc, def->b)) == 0)
        rc = capture(rt, def->b, sc, out);
done:
    rc_free(bound);
    rc_free(used);
    jv_decref(rt, kwargs);
    jv_decref(rt, varargs);
    scope_release(rt, sc);
    return rc;
}

static int exec_for(jrt *rt, const jnode *n, jscope *sc, jv iterable, uint32_t depth);

int jinja__call(jrt *rt, jv callee, const jcall *a, jv *out)
{
    switch (callee.t) {
    case JV_FUNC:
        return jinja__call_builtin(rt, (jfunc *)callee.u.o, a, out);
    case JV_MACRO:
        return call_macro(rt, (jmacro *)callee.u.o, a, out);
    case JV_LOOP: {
        jloop *lp = (jloop *)callee.u.o;
        if (!(lp->node->flags & NF_RECURSIVE))
            return jv_fail(rt, RC_EINVAL, "TypeError: Tried to call non recursive loop.  Maybe you "
                                          "forgot the 'recursive' modifier.");
        if (a->n_pos != 1 || a->n_kw)
            return jv_fail(rt, RC_EINVAL, "TypeError: loop() takes exactly one argument");
        jbuf b = {0}, *saved = rt->out;
        const char *saved_join = rt->join_error;
        rt->out = &b;
        rt->join_error = NULL;
        int rc = exec_for(rt, lp->node, lp->scope, a->pos[0], lp->depth + 1);
        if (rc == 0 && rt->join_error)
            rc = join_failed(rt);
        rt->join_error = saved_join;
        rt->out = saved;
        if (rc != 0) {
            jbuf_free(rt, &b);
            return rc < 0 ? rc : 0;
        }
        return jv_str_from_buf(rt, &b, 0, out);
    }
    case JV_UNDEF:
        return jv_undef_raise(rt, callee);
    default:
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object is not callable",
                       jv_type_name(callee));
    }
}

static int new_macro(jrt *rt, const jnode *def, jscope *closure, jv *out)
{
    jmacro *m = jv_new_tracked(rt, sizeof *m, JV_MACRO);
    if (!m)
        return jv_nomem(rt);
    m->def = def;
    m->closure = closure;
    scope_capture(closure);
    out->t = JV_MACRO;
    out->u.o = &m->g.h;
    return 0;
}

/* ---- statements ------------------------------------------------------------------------ */

static int assign(jrt *rt, const jnode *target, jv v, jscope *sc)
{
    int rc;
    if (target->kind == N_NAME)
        return scope_set(rt, sc, target->name.s, target->name.hash, v);
    if (target->kind == N_NSREF) {
        jv ns;
        if (!scope_lookup(rt, sc, target->name.s, target->name.hash, &ns) || ns.t != JV_NS)
            return jv_fail(rt, RC_EINVAL,
                           "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        jv key;
        if ((rc = jv_cstr(rt, target->attr.s, &key)) < 0)
            return rc;
        rc = jv_dict_set(rt, jv_d(ns), key, v);
        jv_decref(rt, key);
        return rc;
    }
    /* tuple unpacking */
    jv items;
    if (v.t != JV_STR && v.t != JV_LIST && v.t != JV_TUPLE && v.t != JV_DICT && v.t != JV_ITER &&
        v.t != JV_UNDEF && v.t != JV_LOOP)
        return jv_fail(rt, RC_EINVAL, "TypeError: cannot unpack non-iterable %s object",
                       jv_type_name(v));
    if ((rc = jv_items(rt, v, &items)) < 0)
        return rc;
    jlist *l = jv_l(items);
    if (l->n != target->n_items) {
        rc = l->n < target->n_items
                 ? jv_fail(rt, RC_EINVAL, "ValueError: not enough values to unpack (expected %u, got %zu)",
                           target->n_items, l->n)
                 : jv_fail(rt, RC_EINVAL, "ValueError: too many values to unpack (expected %u)",
                           target->n_items);
    } else {
        for (uint32_t i = 0; i < target->n_items && rc == 0; i++)
            rc = assign(rt, target->items[i], l->items[i], sc);
    }
    jv_decref(rt, items);
    return rc;
}

static int new_loop(jrt *rt, const jnode *n, jscope *sc, jv items, uint32_t depth, jv *out)
{
    jloop *lp = jv_new_tracked(rt, sizeof *lp, JV_LOOP);
    if (!lp)
        return jv_nomem(rt);
    jv_incref(items);
    lp->items = jv_l(items);
    lp->depth = depth;
    lp->node = n;
    lp->scope = sc;
    lp->changed_last = jv_undef();
    out->t = JV_LOOP;
    out->u.o = &lp->g.h;
    return 0;
}

static int exec_for(jrt *rt, const jnode *n, jscope *sc, jv iterable, uint32_t depth)
{
    jv items, loopv = jv_none();
    int rc = jv_items(rt, iterable, &items);
    if (rc < 0)
        return rc;
    jscope *it = scope_new(rt, sc);
    if (!it) {
        jv_decref(rt, items);
        return jv_nomem(rt);
    }
    if (n->e) {
        /* `for x in y if cond`: filter first, so loop.length counts kept items */
        jv kept;
        if ((rc = jv_list_new(rt, 0, &kept)) < 0)
            goto done;
        jlist *src = jv_l(items);
        for (size_t i = 0; i < src->n; i++) {
            jv c;
            if ((rc = jv_tick(rt, 1)) < 0 || (rc = assign(rt, n->a, src->items[i], it)) < 0 ||
                (rc = eval(rt, n->e, it, &c)) < 0)
                break;
            bool keep = jv_truthy(c);
            jv_decref(rt, c);
            if (keep && (rc = jv_list_push(rt, jv_l(kept), src->items[i])) < 0)
                break;
            if (it->captured) {
                scope_release(rt, it);
                if (!(it = scope_new(rt, sc))) {
                    rc = jv_nomem(rt);
                    break;
                }
            } else {
                scope_clear(rt, it);
            }
        }
        jv_decref(rt, items);
        items = kept;
        if (rc < 0)
            goto done;
    }
    jlist *l = jv_l(items);
    if (l->n == 0) {
        if (n->d && (rc = scope_shadow(rt, it, n->d)) == 0)
            rc = exec(rt, n->d, it);
        goto done;
    }
    if ((rc = new_loop(rt, n, sc, items, depth, &loopv)) < 0)
        goto done;
    bool completed = false;     /* some iteration ran its body to the end */
    if (n->flags & NF_RECURSIVE)
        scope_capture(sc);
    for (size_t i = 0; i < l->n; i++) {
        if ((rc = jv_tick(rt, 1)) < 0)
            break;
        ((jloop *)loopv.u.o)->i = i;
        if (i > 0) {
            if (it->captured) {
                scope_release(rt, it);
                if (!(it = scope_new(rt, sc))) {
                    rc = jv_nomem(rt);
                    break;
                }
            } else {
                scope_clear(rt, it);
            }
        }
        if ((rc = scope_shadow(rt, it, n->c)) < 0 ||
            (rc = scope_set_str(rt, it, "loop", loopv)) < 0 ||
            (rc = assign(rt, n->a, l->items[i], it)) < 0)
            break;
        rc = exec(rt, n->c, it);
        if (rc == JX_BREAK) {
            rc = 0;
            break;
        }
        if (rc == 0)
            completed = true;
        if (rc == JX_CONTINUE)
            rc = 0;
        if (rc < 0)
            break;
    }
    /* jinja2 runs the else block unless an iteration reached the end of
     * the body: a loop left by break or continue on every pass runs it */
    if (rc == 0 && !completed && n->d) {
        if (it->captured) {
            scope_release(rt, it);
            it = scope_new(rt, sc);
        } else {
            scope_clear(rt, it);
        }
        rc = !it ? jv_nomem(rt) : scope_shadow(rt, it, n->d);
        if (rc == 0)
            rc = exec(rt, n->d, it);
    }
done:
    scope_release(rt, it);
    jv_decref(rt, loopv);
    jv_decref(rt, items);
    return rc;
}

static int write_value(jrt *rt, jv v)
{
    if (v.t == JV_STR)
        return jbuf_put(rt, rt->out, jv_s(v)->s, jv_s(v)->len);
    return jv_write_str(rt, v, rt->out);
}

/* Runs `body` in a child scope and captures its output. */
static int capture_child(jrt *rt, const jnode *body, jscope *sc, jv *out)
{
    jscope *child = scope_new(rt, sc);
    if (!child)
        return jv_nomem(rt);
    int rc = scope_shadow(rt, child, body);
    if (rc == 0)
        rc = capture(rt, body, child, out);
    scope_release(rt, child);
    return rc;
}

/* Applies the filter chain `chain` (innermost target NULL) to `input`. */
static int apply_block_filter(jrt *rt, const jnode *chain, jscope *sc, jv input, jv *out)
{
    const jv *saved = rt->block_input;
    rt->block_input = &input;
    int rc = eval(rt, chain, sc, out);
    rt->block_input = saved;
    return rc;
}

static int exec_node(jrt *rt, const jnode *n, jscope *sc)
{
    jv v, w;
    int rc;
    switch (n->kind) {
    case N_BODY:
        for (uint32_t i = 0; i < n->n_items; i++)
            if ((rc = exec(rt, n->items[i], sc)) != 0)
                return rc;
        return 0;
    case N_DATA:
        return jbuf_put(rt, rt->out, jv_s(n->cval)->s, jv_s(n->cval)->len);
    case N_OUTPUT:
        if (n->a->flags & NF_FOLD)
            rc = eval_folded(rt, n->a, sc, true, &v);
        else
            rc = eval(rt, n->a, sc, &v);
        if (rc < 0)
            return rc;
        rc = write_value(rt, v);
        jv_decref(rt, v);
        return rc;
    case N_IF:
        for (;;) {
            if ((rc = eval(rt, n->a, sc, &v)) < 0)
                return rc;
            bool t = jv_truthy(v);
            jv_decref(rt, v);
            if (t)
                return exec(rt, n->b, sc);
            if (!n->c)
                return 0;
            if (n->c->kind != N_IF)
                return exec(rt, n->c, sc);
            n = n->c;
            if ((rc = jv_tick(rt, 1)) < 0)
                return rc;
        }
    case N_FOR:
        if ((rc = eval(rt, n->b, sc, &v)) < 0)
            return rc;
        rc = exec_for(rt, n, sc, v, 1);
        jv_decref(rt, v);
        return rc;
    case N_SET:
        if (n->a->kind == N_NSREF && (!scope_lookup(rt, sc, n->a->name.s, n->a->name.hash, &v) ||
                                      v.t != JV_NS))
            return jv_fail(rt, RC_EINVAL,
                           "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        if ((rc = eval(rt, n->b, sc, &v)) < 0)
            return rc;
        rc = assign(rt, n->a, v, sc);
        jv_decref(rt, v);
        return rc;
    case N_SETBLOCK:
        if ((rc = capture_child(rt, n->b, sc, &v)) != 0)
            return rc;
        if (n->c) {
            rc = apply_block_filter(rt, n->c, sc, v, &w);
            jv_decref(rt, v);
            if (rc < 0)
                return rc;
            v = w;
        }
        rc = assign(rt, n->a, v, sc);
        jv_decref(rt, v);
        return rc;
    case N_MACRO:
        if ((rc = new_macro(rt, n, sc, &v)) < 0)
            return rc;
        rc = scope_set(rt, sc, n->name.s, n->name.hash, v);
        jv_decref(rt, v);
        return rc;
    case N_CALLBLOCK:
        if ((rc = new_macro(rt, n, sc, &w)) < 0)
            return rc;
        rc = eval_call(rt, n->a, sc, "caller", w, &v);
        jv_decref(rt, w);
        if (rc < 0)
            return rc;
        rc = write_value(rt, v);
        jv_decref(rt, v);
        return rc;
    case N_FILTERBLOCK:
        if ((rc = capture_child(rt, n->b, sc, &v)) != 0)
            return rc;
        rc = apply_block_filter(rt, n->a, sc, v, &w);
        jv_decref(rt, v);
        if (rc < 0)
            return rc;
        if (w.t != JV_STR) {
            /* jinja2 emits the filter's result without str(), so joining
             * the output fails on anything but a string - once the rest of
             * the enclosing body has rendered */
            if (!rt->join_error)
                rt->join_error = jv_type_name(w);
            jv_decref(rt, w);
            return 0;
        }
        rc = write_value(rt, w);
        jv_decref(rt, w);
        return rc;
    case N_BREAK:
        return JX_BREAK;
    case N_CONTINUE:
        return JX_CONTINUE;
    case N_WITH: {
        jscope *child = scope_new(rt, sc);
        if (!child)
            return jv_nomem(rt);
        rc = 0;
        for (uint32_t i = 0; i < n->n_items && rc == 0; i++) {
            if ((rc = eval(rt, n->kwvals[i], sc, &v)) < 0)
                break;
            rc = assign(rt, n->items[i], v, child);
            jv_decref(rt, v);
        }
        if (rc == 0)
            rc = scope_shadow(rt, child, n->b);
        if (rc == 0)
            rc = exec(rt, n->b, child);
        scope_release(rt, child);
        return rc;
    }
    case N_SCOPE: {
        jscope *child = scope_new(rt, sc);
        if (!child)
            return jv_nomem(rt);
        rc = scope_shadow(rt, child, n->b);
        if (rc == 0)
            rc = exec(rt, n->b, child);
        scope_release(rt, child);
        return rc;
    }
    default:
        return jv_fail(rt, RC_EINVAL, "TemplateRuntimeError: cannot execute this statement");
    }
}

static int exec(jrt *rt, const jnode *n, jscope *sc)
{
    if (rt->depth >= rt->lim.max_depth)
        return depth_error(rt);
    rt->depth++;
    int rc = jv_tick(rt, 1);
    if (rc == 0)
        rc = exec_node(rt, n, sc);
    rt->depth--;
    if (rc < 0 && !rt->err_line)
        rt->err_line = n->line;
    return rc;
}

/* ---- rendering --------------------------------------------------------------------------- */

void jinja_limits_default(jinja_limits *lim)
{
    lim->max_output_bytes = (size_t)32 << 20;
    lim->max_memory_bytes = (size_t)256 << 20;
    lim->max_steps = 50000000u;
    lim->max_depth = 400;
}

int jinja_render(const jinja_template *tpl, const jinja_var *vars, size_t n_vars,
                 const jinja_limits *lim, char **out, size_t *out_len)
{
    jrt rt;
    jbuf b = {0};
    jscope *root = NULL;
    int rc = 0;
    memset(&rt, 0, sizeof rt);
    *out = NULL;
    if (out_len)
        *out_len = 0;
    jinja_limits_default(&rt.lim);
    if (lim) {
        if (lim->max_output_bytes)
            rt.lim.max_output_bytes = lim->max_output_bytes;
        if (lim->max_memory_bytes)
            rt.lim.max_memory_bytes = lim->max_memory_bytes;
        if (lim->max_steps)
            rt.lim.max_steps = lim->max_steps;
        if (lim->max_depth)
            rt.lim.max_depth = lim->max_depth;
    }
    rt.gc.next = rt.gc.prev = &rt.gc;
    rt.out = &b;
    rc_errclear();

    if (!(rt.globals = scope_new(&rt, NULL)) || !(root = scope_new(&rt, rt.globals))) {
        rc = jv_nomem(&rt);
        goto done;
    }
    for (size_t i = 0; i < n_vars; i++) {
        if (!vars[i].value || !vars[i].name)
            continue;
        jv v;
        if ((rc = jv_from_json(&rt, vars[i].value, &v)) < 0)
            goto done;
        rc = scope_set_str(&rt, rt.globals, vars[i].name, v);
        jv_decref(&rt, v);
        if (rc < 0)
            goto done;
    }
    if ((rc = scope_shadow(&rt, root, tpl->root)) == 0)
        rc = exec(&rt, tpl->root, root);
    if (rc > 0)
        rc = 0;
    if (rc == 0 && rt.join_error)
        rc = join_failed(&rt);
done:
    if (rc < 0 && rt.err_line && !rt.err_plain) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rc_errmsg());
        rc_fail(rc, "%s (template line %u)", msg, rt.err_line);
    }
    if (root)
        scope_release(&rt, root);
    if (rt.globals)
        scope_release(&rt, rt.globals);
    while (rt.kept) {
        jscope *s = rt.kept;
        rt.kept = s->next_kept;
        scope_destroy(&rt, s);
    }
    jv_gc_sweep(&rt);
    if (rc < 0) {
        jbuf_free(&rt, &b);
        return rc;
    }
    if (!b.p) {
        b.p = rc_malloc(1);
        if (!b.p)
            return rc_fail(RC_ENOMEM, "MemoryError: out of memory");
        b.p[0] = '\0';
    }
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return 0;
}
