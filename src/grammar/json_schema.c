/* json_schema.c - JSON Schema to GBNF (json_schema.h).
 *
 * One walk over the schema writes, for each schema node, a GBNF expression
 * that is one unit (a rule name, a literal, or a parenthesised group), so a
 * caller can put a quantifier after it.  Objects, arrays and $ref targets get
 * rules of their own (PREFIX-N); $ref targets are remembered by their pointer
 * before their body is written, which is what makes recursive schemas finite.
 * Errors carry the JSON pointer of the node at fault and the keyword.
 *
 * Layout: shared JSON rules; error and path helpers; scalars (strings with
 * formats and patterns, integer ranges, numbers); objects; arrays;
 * combinators ($ref, allOf, anyOf); the dispatcher; the public functions.
 */
#include "json_schema.h"
#include "gbnf_text.h"
#include "json_regex.h"
#include "base/err.h"
#include "base/mem.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct json_gbnf {
    gtext text;          /* the rules written so far */
    json_t *names;       /* rule name -> true, for the shared rules and duplicates */
};

/* ---- shared JSON rules ---- */

/* name, body, and the shared rules the body uses. */
static const struct { const char *name, *body, *uses[4]; } SHARED[] = {
    { "ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?", { NULL } },
    /* \u escapes of surrogates are left out: a lone one is invalid JSON to
     * strict readers (jansson), and characters beyond the BMP can be written
     * as themselves */
    { "json-esc", "\"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] "
                  "[0-9a-fA-F]{2} ) )", { NULL } },
    { "json-char", "[^\"\\\\\\x00-\\x1F] | json-esc", { "json-esc" } },
    /* for strings with a length bound: BMP characters only, so that the
     * length is the same counted in code points (JSON Schema) or in UTF-16
     * units (JavaScript, zod) */
    { "json-char-bmp", "[^\"\\\\\\x00-\\x1F\\U00010000-\\U0010FFFF] | json-esc", { "json-esc" } },
    { "json-string", "\"\\\"\" json-char* \"\\\"\"", { "json-char" } },
    { "json-uint", "\"0\" | [1-9] [0-9]{0,15}", { NULL } },
    { "json-int", "\"-\"? json-uint", { "json-uint" } },
    { "json-unumber", "json-uint ( \".\" [0-9]{1,16} )? ( [eE] [+-]? [0-9]{1,2} )?",
      { "json-uint" } },
    { "json-number", "\"-\"? json-unumber", { "json-unumber" } },
    { "json-value", "json-object | json-array | json-string | json-number | \"true\" | \"false\" "
                    "| \"null\"", { "json-object", "json-array", "json-string", "json-number" } },
    { "json-member", "json-string ws \":\" ws json-value ws", { "json-string", "ws", "json-value" } },
    { "json-object", "\"{\" ws ( json-member ( \",\" ws json-member )* )? \"}\"",
      { "ws", "json-member" } },
    { "json-array", "\"[\" ws ( json-value ws ( \",\" ws json-value ws )* )? \"]\"",
      { "ws", "json-value" } },
    { "json-date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" "
                   "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )", { NULL } },
    { "json-time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                   "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                   "[0-5] [0-9] )", { NULL } },
    { "json-date-time", "json-date \"T\" json-time", { "json-date", "json-time" } },
    { "json-uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                   "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}", { NULL } },
    { "json-email", "[a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} "
                    "( \".\" [a-zA-Z0-9-]{1,63} ){1,8}", { NULL } },
};

static bool defined(const json_gbnf *g, const char *name)
{
    return json_object_get(g->names, name) != NULL;
}

static int define(json_gbnf *g, const char *name, const char *body)
{
    if (defined(g, name))
        return rc_fail(RC_EINVAL, "grammar rule '%s' is defined twice", name);
    if (json_object_set_new(g->names, name, json_true()))
        return rc_fail(RC_ENOMEM, "out of memory");
    gt_printf(&g->text, "%s ::= %s\n", name, body);
    return gt_status(&g->text);
}

/* Defines shared rule `name` (and what it uses) unless it is there; returns it. */
static const char *need(json_gbnf *g, const char *name)
{
    for (size_t i = 0; i < sizeof SHARED / sizeof SHARED[0]; i++) {
        if (strcmp(SHARED[i].name, name))
            continue;
        if (!defined(g, name)) {
            define(g, name, SHARED[i].body);     /* first: json-value is recursive */
            for (int k = 0; k < 4 && SHARED[i].uses[k]; k++)
                need(g, SHARED[i].uses[k]);
        }
        return SHARED[i].name;
    }
    return name;
}

/* ---- the walk's state, errors, paths ---- */

typedef struct {
    json_gbnf *g;
    const json_t *root;
    const char *prefix;
    json_t *refs;            /* "$ref" text -> rule name */
    int n_rules;
    int depth;
    char path[256];          /* JSON pointer of the node being converted */
} conv;

static int fail(const conv *c, const char *fmt, const char *a, const char *b)
{
    char msg[300];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return rc_fail(RC_EINVAL, "schema at '%s': %s", c->path[0] ? c->path : "/", msg);
}

static size_t path_push(conv *c, const char *seg)
{
    size_t old = strlen(c->path);
    snprintf(c->path + old, sizeof c->path - old, "/%s", seg);
    return old;
}

static void path_pop(conv *c, size_t old)
{
    c->path[old] = '\0';
}

/* A new rule name for this schema. */
static void new_name(conv *c, char *name, size_t size)
{
    snprintf(name, size, "%s-%d", c->prefix, c->n_rules++);
}

static int gen(conv *c, const json_t *s, gtext *e);

/* Converts s[key] (a sub-schema) with the path extended by key/seg. */
static int gen_sub(conv *c, const json_t *s, const char *key, const char *seg, gtext *e)
{
    size_t old = path_push(c, key);
    if (seg)
        path_push(c, seg);
    int rc = gen(c, s, e);
    if (!rc)                  /* on failure the path stays, for the message */
        path_pop(c, old);
    return rc;
}

/* A rule named for this schema with the given body text. */
static int add_rule(conv *c, const char *name, gtext *body)
{
    int rc = gt_status(body);
    if (!rc)
        rc = define(c->g, name, body->p ? body->p : "\"\"");
    gt_free(body);
    return rc;
}

/* ---- scalars ---- */

/* s[key] as a whole number in [0, JSON_GBNF_MAX_REPEAT], or -1 when absent. */
static int get_count(conv *c, const json_t *s, const char *key, long *out)
{
    json_t *v = json_object_get(s, key);
    *out = -1;
    if (!v)
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || d != floor(d) || d < 0)
        return fail(c, "'%s' must be a whole number >= 0", key, NULL);
    if (d > JSON_GBNF_MAX_REPEAT)
        return fail(c, "'%s' above %s is not supported", key, "1000");
    *out = (long)d;
    return 0;
}

static void put_repeat(gtext *e, long lo, long hi)
{
    if (hi < 0)
        gt_printf(e, lo == 0 ? "*" : lo == 1 ? "+" : "{%ld,}", lo);
    else if (lo == hi)
        gt_printf(e, "{%ld}", lo);
    else
        gt_printf(e, "{%ld,%ld}", lo, hi);
}

static int gen_string(conv *c, const json_t *s, gtext *e)
{
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    long lo, hi;
    if (get_count(c, s, "minLength", &lo) || get_count(c, s, "maxLength", &hi))
        return RC_EINVAL;
    if (hi >= 0 && lo > hi)
        return fail(c, "'minLength' is above 'maxLength'", NULL, NULL);
    if ((fmt || pat) && (lo >= 0 || hi >= 0))
        return fail(c, "'minLength' / 'maxLength' together with '%s' is not supported",
                    fmt ? "format" : "pattern", NULL);
    if (fmt && pat)
        return fail(c, "'format' together with 'pattern' is not supported", NULL, NULL);
    if (fmt) {
        static const char *const formats[] = { "date", "time", "date-time", "uuid", "email" };
        const char *f = json_string_value(fmt);
        for (size_t i = 0; f && i < sizeof formats / sizeof formats[0]; i++)
            if (!strcmp(f, formats[i])) {
                char rule[32];
                snprintf(rule, sizeof rule, "json-%s", f);
                gt_printf(e, "( \"\\\"\" %s \"\\\"\" )", need(c->g, rule));
                return 0;
            }
        return fail(c, "'format' \"%.40s\" is not supported (date, time, date-time, uuid, "
                    "email are)", f ? f : "(not a string)", NULL);
    }
    if (pat) {
        if (!json_is_string(pat))
            return fail(c, "'pattern' must be a string", NULL, NULL);
        gt_puts(e, "( \"\\\"\" ");
        if (json_regex_gbnf(json_string_value(pat), need(c->g, "json-char"), e))
            return rc_wrap(RC_EINVAL, "schema at '%s': 'pattern': ", c->path[0] ? c->path : "/");
        gt_puts(e, " \"\\\"\" )");
        return 0;
    }
    if (lo < 0 && hi < 0) {
        gt_puts(e, need(c->g, "json-string"));
        return 0;
    }
    gt_printf(e, "( \"\\\"\" %s", need(c->g, "json-char-bmp"));
    put_repeat(e, lo < 0 ? 0 : lo, hi);
    gt_puts(e, " \"\\\"\" )");
    return 0;
}

/* Integer ranges: alternatives of digit strings, as a range-to-regex
 * conversion does.  Numbers have at most INT_DIGITS digits when unbounded. */
#define INT_DIGITS 16
#define INT_LIMIT  9999999999999999LL      /* 16 nines: bounds beyond are refused */

typedef struct { gtext *e; bool first; } alts;

static void alt_begin(alts *a)
{
    if (!a->first)
        gt_puts(a->e, " | ");
    a->first = false;
}

/* Same-length digit strings lo..hi (n digits each), after `prefix`. */
static void alts_same(alts *a, const char *prefix, const char *lo, const char *hi, int n)
{
    if (n == 0 || !strncmp(lo, hi, (size_t)n)) {
        alt_begin(a);
        char all[40];
        snprintf(all, sizeof all, "%s%.*s", prefix, n, lo);
        gt_literal(a->e, all, strlen(all));
        return;
    }
    char p[40];
    if (lo[0] == hi[0]) {
        snprintf(p, sizeof p, "%s%c", prefix, lo[0]);
        alts_same(a, p, lo + 1, hi + 1, n - 1);
        return;
    }
    bool low_full = strspn(lo + 1, "0") >= (size_t)(n - 1);
    bool high_full = strspn(hi + 1, "9") >= (size_t)(n - 1);
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n - 1);
    memset(zeros, '0', (size_t)n - 1);
    char first = lo[0], last = hi[0];
    if (!low_full) {
        snprintf(p, sizeof p, "%s%c", prefix, lo[0]);
        alts_same(a, p, lo + 1, nines, n - 1);
        first++;
    }
    if (!high_full)
        last--;
    if (first <= last) {
        alt_begin(a);
        if (prefix[0])
            gt_literal(a->e, prefix, strlen(prefix)), gt_puts(a->e, " ");
        gt_printf(a->e, "[%c-%c]", first, last);
        if (n == 2)
            gt_puts(a->e, " [0-9]");
        else if (n > 2)
            gt_printf(a->e, " [0-9]{%d}", n - 1);
    }
    if (!high_full) {
        snprintf(p, sizeof p, "%s%c", prefix, hi[0]);
        alts_same(a, p, zeros, hi + 1, n - 1);
    }
}

static long long pow10ll(int n)
{
    long long p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* lo..hi, 0 <= lo <= hi; hi < 0 means no upper bound. */
static void alts_range(alts *a, long long lo, long long hi)
{
    char ls[24], hs[24];
    int nl = snprintf(ls, sizeof ls, "%lld", lo);
    if (hi < 0) {
        alts_range(a, lo, pow10ll(nl) - 1);
        if (nl < INT_DIGITS) {
            alt_begin(a);
            gt_printf(a->e, "[1-9] [0-9]{%d,%d}", nl, INT_DIGITS - 1);
        }
        return;
    }
    int nh = snprintf(hs, sizeof hs, "%lld", hi);
    if (nl < nh) {
        alts_range(a, lo, pow10ll(nl) - 1);
        for (int n = nl + 1; n < nh; n++) {
            alt_begin(a);
            gt_printf(a->e, "[1-9] [0-9]{%d}", n - 1);
        }
        alts_range(a, pow10ll(nh - 1), hi);
        return;
    }
    alts_same(a, "", ls, hs, nl);
}

/* Reads minimum / maximum (and the exclusive forms, numeric or draft-4
 * boolean) as integer bounds. */
static int int_bound(conv *c, const json_t *s, bool upper, bool *has, long long *v)
{
    const char *key = upper ? "maximum" : "minimum";
    const char *ekey = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    json_t *b = json_object_get(s, key), *x = json_object_get(s, ekey);
    bool excl = false;
    *has = false;
    if (json_is_boolean(x)) {
        excl = json_is_true(x);
        x = NULL;
    } else if (x) {
        b = x;
        excl = true;
        key = ekey;
    }
    if (!b)
        return 0;
    if (!json_is_number(b))
        return fail(c, "'%s' must be a number", key, NULL);
    double d = json_number_value(b);
    d = upper ? floor(d) : ceil(d);
    if (excl && d == json_number_value(b))
        d += upper ? -1 : 1;
    if (!(fabs(d) <= (double)INT_LIMIT))
        return fail(c, "'%s' beyond 16 digits is not supported", key, NULL);
    *has = true;
    *v = (long long)d;
    return 0;
}

static int gen_integer(conv *c, const json_t *s, gtext *e)
{
    bool has_lo, has_hi;
    long long lo = 0, hi = 0;
    if (json_object_get(s, "multipleOf"))
        return fail(c, "'multipleOf' is not supported", NULL, NULL);
    if (int_bound(c, s, false, &has_lo, &lo) || int_bound(c, s, true, &has_hi, &hi))
        return RC_EINVAL;
    if (!has_lo && !has_hi) {
        gt_puts(e, need(c->g, "json-int"));
        return 0;
    }
    if (has_lo && has_hi && lo > hi)
        return fail(c, "'minimum' is above 'maximum': no integer fits", NULL, NULL);
    alts a = { e, true };
    gt_puts(e, "(");
    if (!has_lo || lo < 0) {
        /* negative part: -(max(1, -hi) .. -lo) */
        long long from = has_hi && hi < 0 ? -hi : 1;
        alt_begin(&a);
        gt_puts(e, "\"-\" (");
        alts neg = { e, true };
        alts_range(&neg, from, has_lo ? -lo : -1);
        gt_puts(e, ")");
    }
    if (!has_hi || hi >= 0)
        alts_range(&a, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    gt_puts(e, ")");
    return 0;
}

static int gen_number(conv *c, const json_t *s, gtext *e)
{
    static const char *const bounds[] = { "maximum", "exclusiveMaximum", "exclusiveMinimum",
                                          "multipleOf" };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (json_object_get(s, bounds[i]) && !json_is_false(json_object_get(s, bounds[i])))
            return fail(c, "'%s' on a number is not supported (on an integer it is)", bounds[i],
                        NULL);
    json_t *min = json_object_get(s, "minimum");
    if (min && !(json_is_number(min) && json_number_value(min) == 0))
        return fail(c, "'minimum' on a number is supported only as 0 (on an integer, any)",
                    NULL, NULL);
    gt_puts(e, need(c->g, min ? "json-unumber" : "json-number"));
    return 0;
}

/* ---- objects ---- */

/* One member: "key" ws ":" ws VALUE ws. */
static int gen_member(conv *c, const char *key, const json_t *schema, gtext *e)
{
    json_t *k = json_string(key);
    char *q = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    if (!q)
        return rc_fail(RC_ENOMEM, "out of memory");
    gt_literal(e, q, strlen(q));
    free(q);
    gt_printf(e, " %s \":\" %s ", need(c->g, "ws"), need(c->g, "ws"));
    if (schema) {
        int rc = gen_sub(c, schema, "properties", key, e);
        if (rc)
            return rc;
    } else {
        gt_puts(e, need(c->g, "json-value"));
    }
    gt_printf(e, " %s", need(c->g, "ws"));
    return 0;
}

static bool in_required(const json_t *req, const char *key)
{
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), key))
            return true;
    return false;
}

/*
 * Members in a fixed order, required ones present, optional ones maybe, then
 * (when additionalProperties allows) any number of other members.  With
 * T(k) = what may follow once something was written, from member k on, and
 * F(k) = the same when nothing was written yet:
 *   T(k) = ("," ws m_k) T(k+1)           (m_k required; optional: ( ... )?)
 *   F(k) = m_k T(k+1)                    (required)
 *        | m_k T(k+1) | F(k+1)           (optional)
 *   T(n) = ( "," ws extra )*,  F(n) = ( extra T(n) )?
 * Each T(k) and F(k) is a rule, so the text stays linear in the members.
 */
static int gen_object(conv *c, const json_t *s, gtext *e)
{
    static const char *const refused[] = { "patternProperties", "propertyNames",
                                           "minProperties", "maxProperties", "dependentRequired",
                                           "dependentSchemas", "dependencies",
                                           "unevaluatedProperties" };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (json_object_get(s, refused[i]))
            return fail(c, "'%s' is not supported", refused[i], NULL);
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, "'properties' must be an object", NULL, NULL);
    if (req && !json_is_array(req))
        return fail(c, "'required' must be a list of names", NULL, NULL);
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return fail(c, "'additionalProperties' must be a boolean or a schema", NULL, NULL);
    if (!props && !req && !ap) {            /* {"type": "object"}: any object */
        gt_puts(e, need(c->g, "json-object"));
        return 0;
    }
    const char *ws = need(c->g, "ws");
    /* the members' expressions and whether each is required */
    size_t n = (props ? json_object_size(props) : 0) + (req ? json_array_size(req) : 0);
    gtext *m = rc_calloc(n + 1, sizeof *m);
    bool *must = rc_calloc(n + 1, sizeof *must);
    int rc = 0;
    size_t k = 0;
    if (!m || !must) {
        rc = rc_fail(RC_ENOMEM, "out of memory");
        goto done;
    }
    const char *key;
    json_t *sub;
    json_object_foreach(props, key, sub) {
        must[k] = req && in_required(req, key);
        if ((rc = gen_member(c, key, sub, &m[k++])))
            goto done;
    }
    size_t i;
    json_array_foreach(req, i, sub) {
        if (!json_is_string(sub)) {
            rc = fail(c, "'required' must be a list of names", NULL, NULL);
            goto done;
        }
        if (props && json_object_get(props, json_string_value(sub)))
            continue;
        must[k] = true;            /* required but not described: any value */
        if ((rc = gen_member(c, json_string_value(sub), NULL, &m[k++])))
            goto done;
    }
    n = k;
    gtext extra = { 0 };
    bool has_extra = ap && !json_is_false(ap);
    if (has_extra) {
        gt_printf(&extra, "%s %s \":\" %s ", need(c->g, "json-string"), ws, ws);
        if (json_is_object(ap)) {
            size_t old = path_push(c, "additionalProperties");
            rc = gen(c, ap, &extra);
            if (rc) {
                gt_free(&extra);
                goto done;
            }
            path_pop(c, old);
        } else {
            gt_puts(&extra, need(c->g, "json-value"));
        }
        gt_printf(&extra, " %s", ws);
    }
    bool all_required = !has_extra;
    for (k = 0; k < n; k++)
        all_required &= must[k];
    char name[64];
    new_name(c, name, sizeof name);
    gtext body = { 0 };
    if (all_required) {
        gt_printf(&body, "\"{\" %s", ws);
        for (k = 0; k < n; k++) {
            if (k)
                gt_printf(&body, " \",\" %s", ws);
            gt_printf(&body, " %s", m[k].p);
        }
        gt_puts(&body, " \"}\"");
        rc = add_rule(c, name, &body);
        if (!rc)
            gt_puts(e, name);
        gt_free(&extra);
        goto done;
    }
    /* T(k) and F(k) for k = n .. 0 */
    char t_next[96], f_next[96], t_k[96], f_k[96];
    snprintf(t_next, sizeof t_next, "%s-t%zu", name, n);
    snprintf(f_next, sizeof f_next, "%s-f%zu", name, n);
    gtext tb = { 0 }, fb = { 0 };
    if (has_extra) {
        gt_printf(&tb, "( \",\" %s %s )*", ws, extra.p);
        gt_printf(&fb, "( %s %s )?", extra.p, t_next);
        if ((rc = add_rule(c, t_next, &tb)) || (rc = add_rule(c, f_next, &fb))) {
            gt_free(&extra);
            goto done;
        }
    } else {
        t_next[0] = f_next[0] = '\0';      /* T(n) and F(n) are empty */
    }
    gt_free(&extra);
    for (k = n; k-- > 0;) {
        snprintf(t_k, sizeof t_k, "%s-t%zu", name, k);
        snprintf(f_k, sizeof f_k, "%s-f%zu", name, k);
        gt_printf(&tb, must[k] ? "\",\" %s %s %s" : "( \",\" %s %s )? %s", ws, m[k].p, t_next);
        if (must[k])
            gt_printf(&fb, "%s %s", m[k].p, t_next);
        else if (f_next[0])
            gt_printf(&fb, "%s %s | %s", m[k].p, t_next, f_next);
        else
            gt_printf(&fb, "( %s %s )?", m[k].p, t_next);
        if ((rc = add_rule(c, t_k, &tb)) || (rc = add_rule(c, f_k, &fb)))
            goto done;
        memcpy(t_next, t_k, sizeof t_k);
        memcpy(f_next, f_k, sizeof f_k);
    }
    gt_printf(&body, "\"{\" %s %s \"}\"", ws, f_next);
    rc = add_rule(c, name, &body);
    if (!rc)
        gt_puts(e, name);
done:
    for (k = 0; m && k < n; k++)
        gt_free(&m[k]);
    rc_free(m);
    rc_free(must);
    return rc;
}

/* ---- arrays ---- */

static int gen_array(conv *c, const json_t *s, gtext *e)
{
    static const char *const refused[] = { "uniqueItems", "contains", "minContains",
                                           "maxContains", "additionalItems", "unevaluatedItems" };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (json_object_get(s, refused[i]) && !json_is_false(json_object_get(s, refused[i])))
            return fail(c, "'%s' is not supported", refused[i], NULL);
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    const char *pkey = "prefixItems";
    if (json_is_array(items)) {               /* draft 4's tuple form */
        if (prefix)
            return fail(c, "'items' as a list together with 'prefixItems'", NULL, NULL);
        prefix = items;
        pkey = "items";
        items = NULL;
    }
    if (prefix && !json_is_array(prefix))
        return fail(c, "'prefixItems' must be a list of schemas", NULL, NULL);
    if (items && !json_is_boolean(items) && !json_is_object(items))
        return fail(c, "'items' must be a schema", NULL, NULL);
    long lo, hi;
    if (get_count(c, s, "minItems", &lo) || get_count(c, s, "maxItems", &hi))
        return RC_EINVAL;
    if (lo < 0)
        lo = 0;
    if (hi >= 0 && lo > hi)
        return fail(c, "'minItems' is above 'maxItems'", NULL, NULL);
    const char *ws = need(c->g, "ws");
    size_t n_pre = prefix ? json_array_size(prefix) : 0;
    if (n_pre && (lo < (long)n_pre && json_object_get(s, "minItems")))
        return fail(c, "'minItems' below the length of 'prefixItems' is not supported", NULL,
                    NULL);
    if (n_pre && hi >= 0 && hi < (long)n_pre)
        return fail(c, "'maxItems' below the length of 'prefixItems' is not supported", NULL,
                    NULL);
    gtext item = { 0 };
    bool more = !json_is_false(items) && (n_pre == 0 || items);
    if (more) {
        if (json_is_object(items)) {
            size_t old = path_push(c, "items");
            int rc = gen(c, items, &item);
            if (rc) {
                gt_free(&item);
                return rc;
            }
            path_pop(c, old);
        } else {
            gt_puts(&item, need(c->g, "json-value"));
        }
        gt_printf(&item, " %s", ws);
    }
    char name[64];
    new_name(c, name, sizeof name);
    gtext body = { 0 };
    gt_printf(&body, "\"[\" %s", ws);
    for (size_t i = 0; i < n_pre; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        gt_puts(&body, i ? " \",\" " : " ");
        if (i)
            gt_printf(&body, "%s ", ws);
        int rc = gen_sub(c, json_array_get(prefix, i), pkey, idx, &body);
        if (rc) {
            gt_free(&item);
            gt_free(&body);
            return rc;
        }
        gt_printf(&body, " %s", ws);
    }
    if (more && n_pre) {
        /* further items after the tuple, up to maxItems in all */
        gt_printf(&body, " ( \",\" %s %s )", ws, item.p);
        put_repeat(&body, 0, hi < 0 ? -1 : hi - (long)n_pre);
    } else if (more && hi != 0) {
        bool opt = lo == 0;
        gt_printf(&body, opt ? " ( %s ( \",\" %s %s )" : " %s ( \",\" %s %s )", item.p, ws,
                  item.p);
        put_repeat(&body, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        if (opt)
            gt_puts(&body, " )?");
    }
    gt_free(&item);
    gt_puts(&body, " \"]\"");
    int rc = add_rule(c, name, &body);
    if (!rc)
        gt_puts(e, name);
    return rc;
}

/* ---- combinators ---- */

/* The node a "#..." reference points at in the root, or NULL. */
static const json_t *resolve(const conv *c, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *v = c->root;
    const char *p = ref + 1;
    while (*p == '/' && v) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[n++] = *p;
            }
        }
        seg[n] = '\0';
        if (json_is_object(v)) {
            v = json_object_get(v, seg);
        } else if (json_is_array(v)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            v = *seg && !*end ? json_array_get(v, i) : NULL;
        } else {
            v = NULL;
        }
    }
    return *p ? NULL : v;
}

static int gen_ref(conv *c, const json_t *s, gtext *e)
{
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    if (!ref)
        return fail(c, "'$ref' must be a string", NULL, NULL);
    json_t *known = json_object_get(c->refs, ref);
    if (known) {
        gt_puts(e, json_string_value(known));
        return 0;
    }
    if (ref[0] != '#')
        return fail(c, "'$ref' \"%.80s\" names another document; only references inside the "
                    "schema (\"#/$defs/...\") are supported", ref, NULL);
    const json_t *target = resolve(c, ref);
    if (!target)
        return fail(c, "'$ref' \"%.80s\" does not point at anything in the schema", ref, NULL);
    char name[64];
    new_name(c, name, sizeof name);
    if (json_object_set_new(c->refs, ref, json_string(name)))
        return rc_fail(RC_ENOMEM, "out of memory");
    char saved[sizeof c->path];
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    gtext body = { 0 };
    int rc = gen(c, target, &body);
    if (rc) {
        gt_free(&body);
        return rc;
    }
    memcpy(c->path, saved, sizeof saved);
    if ((rc = add_rule(c, name, &body)))
        return rc;
    gt_puts(e, name);
    return 0;
}

/* allOf of object schemas (and the keywords next to it): one object schema
 * with the union of properties and of required names. */
static int merge_all_of(conv *c, const json_t *s, json_t **out)
{
    static const char *const mergeable[] = { "type", "properties", "required",
                                             "additionalProperties", "title", "description",
                                             "$ref", "allOf", "$defs", "definitions",
                                             "$schema", "$id", "$comment" };
    json_t *all = json_object_get(s, "allOf");
    if (!json_is_array(all) || !json_array_size(all))
        return fail(c, "'allOf' must be a non-empty list of schemas", NULL, NULL);
    json_t *m = json_pack("{s:s, s:{}, s:[]}", "type", "object", "properties", "required");
    if (!m)
        return rc_fail(RC_ENOMEM, "out of memory");
    json_t *parts = json_array();
    json_array_append(parts, (json_t *)s);
    json_array_extend(parts, all);
    bool closed = false;
    size_t i;
    json_t *p;
    int rc = 0, hops = 0;
    json_array_foreach(parts, i, p) {
        while (json_is_object(p) && json_is_string(json_object_get(p, "$ref")) && hops++ < 64)
            p = (json_t *)resolve(c, json_string_value(json_object_get(p, "$ref")));
        if (!json_is_object(p)) {
            rc = fail(c, "'allOf' is supported for object schemas only", NULL, NULL);
            break;
        }
        const char *key;
        json_t *v;
        json_object_foreach(p, key, v) {
            bool ok = false;
            for (size_t k = 0; k < sizeof mergeable / sizeof mergeable[0]; k++)
                ok |= !strcmp(key, mergeable[k]);
            if (!ok || (!strcmp(key, "type") && !(json_is_string(v) &&
                                                  !strcmp(json_string_value(v), "object")))) {
                rc = fail(c, "'allOf' is supported for object schemas only ('%s' in a part)",
                          key, NULL);
                break;
            }
        }
        if (rc)
            break;
        if (i && json_object_get(p, "allOf")) {
            rc = fail(c, "'allOf' inside 'allOf' is not supported", NULL, NULL);
            break;
        }
        json_t *props = json_object_get(p, "properties");
        json_object_foreach(props, key, v) {
            if (json_object_get(json_object_get(m, "properties"), key)) {
                rc = fail(c, "'allOf' parts both describe property '%.60s'", key, NULL);
                break;
            }
            json_object_set(json_object_get(m, "properties"), key, v);
        }
        if (rc)
            break;
        json_array_extend(json_object_get(m, "required"), json_object_get(p, "required"));
        json_t *ap = json_object_get(p, "additionalProperties");
        closed |= json_is_false(ap);
        if (json_is_object(ap) || json_is_true(ap))
            json_object_set(m, "additionalProperties", ap);
    }
    json_decref(parts);
    if (closed)
        json_object_del(m, "additionalProperties");
    if (rc) {
        json_decref(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Alternatives joined by |, as one group. */
static int gen_alternatives(conv *c, const json_t *list, const char *key, gtext *e)
{
    if (!json_is_array(list) || !json_array_size(list))
        return fail(c, "'%s' must be a non-empty list of schemas", key, NULL);
    gt_puts(e, "(");
    size_t i;
    json_t *sub;
    json_array_foreach(list, i, sub) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        gt_puts(e, i ? " | " : " ");
        int rc = gen_sub(c, sub, key, idx, e);
        if (rc)
            return rc;
    }
    gt_puts(e, " )");
    return 0;
}

/* A JSON value written literally (compact). */
static int gen_literal(const json_t *v, gtext *e)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t)
        return rc_fail(RC_ENOMEM, "out of memory");
    gt_literal(e, t, strlen(t));
    free(t);
    return 0;
}

/* ---- the dispatcher ---- */

static const char *const ANNOTATIONS[] = { "title", "description", "default", "examples",
                                           "$schema", "$id", "$comment", "deprecated",
                                           "readOnly", "writeOnly" };
static const char *const KEYWORDS[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "nullable" };

static bool listed(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i]))
            return true;
    return false;
}
#define LISTED(key, list) listed(key, list, sizeof list / sizeof list[0])

/* The keywords of s that constrain something, other than `except`. */
static const char *other_keyword(const json_t *s, const char *const *except, size_t n)
{
    static const char *const free_[] = { "$defs", "definitions", "nullable" };
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v)
        if (!LISTED(key, ANNOTATIONS) && !LISTED(key, free_) && !listed(key, except, n))
            return key;
    return NULL;
}

static const char *const TYPES[] = { "string", "number", "integer", "boolean", "null", "object",
                                     "array" };

static int gen_type(conv *c, const json_t *s, const char *type, gtext *e)
{
    if (!strcmp(type, "string"))
        return gen_string(c, s, e);
    if (!strcmp(type, "integer"))
        return gen_integer(c, s, e);
    if (!strcmp(type, "number"))
        return gen_number(c, s, e);
    if (!strcmp(type, "object"))
        return gen_object(c, s, e);
    if (!strcmp(type, "array"))
        return gen_array(c, s, e);
    gt_puts(e, !strcmp(type, "boolean") ? "( \"true\" | \"false\" )" : "\"null\"");
    return 0;
}

/* The type a schema without "type" has by its keywords, or NULL (any). */
static const char *implied_type(const json_t *s)
{
    static const struct { const char *key, *type; } by_key[] = {
        { "properties", "object" }, { "additionalProperties", "object" },
        { "required", "object" }, { "items", "array" }, { "prefixItems", "array" },
        { "minItems", "array" }, { "maxItems", "array" }, { "minLength", "string" },
        { "maxLength", "string" }, { "pattern", "string" }, { "format", "string" },
        { "minimum", "number" }, { "maximum", "number" }, { "exclusiveMinimum", "number" },
        { "exclusiveMaximum", "number" } };
    for (size_t i = 0; i < sizeof by_key / sizeof by_key[0]; i++)
        if (json_object_get(s, by_key[i].key))
            return by_key[i].type;
    return NULL;
}

static int gen_node(conv *c, const json_t *s, gtext *e)
{
    if (json_is_true(s)) {
        gt_puts(e, need(c->g, "json-value"));
        return 0;
    }
    if (json_is_false(s))
        return fail(c, "the schema false matches nothing", NULL, NULL);
    if (!json_is_object(s))
        return fail(c, "a schema must be an object or a boolean", NULL, NULL);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v)
        if (!LISTED(key, ANNOTATIONS) && !LISTED(key, KEYWORDS))
            return fail(c, "'%.60s' is not supported", key, NULL);
    static const char *const ref_kw[] = { "$ref" }, *const const_kw[] = { "const", "type" },
                             *const enum_kw[] = { "enum", "type" };
    if (json_object_get(s, "$ref")) {
        if ((key = other_keyword(s, ref_kw, 1)))
            return fail(c, "'$ref' next to '%s' is not supported", key, NULL);
        return gen_ref(c, s, e);
    }
    if ((v = json_object_get(s, "const"))) {
        if ((key = other_keyword(s, const_kw, 2)))
            return fail(c, "'const' next to '%s' is not supported", key, NULL);
        return gen_literal(v, e);
    }
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v))
            return fail(c, "'enum' must be a non-empty list", NULL, NULL);
        if ((key = other_keyword(s, enum_kw, 2)))
            return fail(c, "'enum' next to '%s' is not supported", key, NULL);
        gt_puts(e, "(");
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            gt_puts(e, i ? " | " : " ");
            int rc = gen_literal(x, e);
            if (rc)
                return rc;
        }
        gt_puts(e, " )");
        return 0;
    }
    const char *alt = json_object_get(s, "anyOf") ? "anyOf" :
                      json_object_get(s, "oneOf") ? "oneOf" : NULL;
    if (alt) {
        const char *const alt_kw[] = { alt };
        if ((key = other_keyword(s, alt_kw, 1)))
            return fail(c, "'%s' next to '%s' is not supported", alt, key);
        return gen_alternatives(c, json_object_get(s, alt), alt, e);
    }
    if (json_object_get(s, "allOf")) {
        json_t *merged;
        int rc = merge_all_of(c, s, &merged);
        if (rc)
            return rc;
        rc = gen_object(c, merged, e);
        json_decref(merged);
        return rc;
    }
    json_t *type = json_object_get(s, "type");
    const char *one = json_string_value(type);
    if (!type && !(one = implied_type(s))) {
        gt_puts(e, need(c->g, "json-value"));
        return 0;
    }
    json_t *list = json_is_array(type) ? type : NULL;
    if (!one && (!list || !json_array_size(list)))
        return fail(c, "'type' must be a type name or a non-empty list of them", NULL, NULL);
    bool nullable = json_is_true(json_object_get(s, "nullable"));
    size_t n = list ? json_array_size(list) : 1;
    bool group = n > 1 || nullable;
    if (group)
        gt_puts(e, "(");
    bool has_null = false;
    for (size_t i = 0; i < n; i++) {
        const char *t = list ? json_string_value(json_array_get(list, i)) : one;
        if (!t || !LISTED(t, TYPES))
            return fail(c, "'type' \"%.40s\" is not a JSON Schema type", t ? t : "(not a string)",
                        NULL);
        has_null |= !strcmp(t, "null");
        gt_puts(e, group ? (i ? " | " : " ") : "");
        int rc = gen_type(c, s, t, e);
        if (rc)
            return rc;
    }
    if (nullable && !has_null)
        gt_puts(e, " | \"null\"");
    if (group)
        gt_puts(e, " )");
    return 0;
}

static int gen(conv *c, const json_t *s, gtext *e)
{
    if (++c->depth > JSON_GBNF_MAX_DEPTH)
        return fail(c, "schemas nested more than 64 deep are not supported", NULL, NULL);
    int rc = gen_node(c, s, e);
    c->depth--;
    return rc ? rc : gt_status(e);
}

/* ---- public ---- */

int json_gbnf_new(json_gbnf **out)
{
    json_gbnf *g = rc_calloc(1, sizeof *g);
    if (!g || !(g->names = json_object())) {
        rc_free(g);
        return rc_fail(RC_ENOMEM, "out of memory");
    }
    *out = g;
    return 0;
}

void json_gbnf_free(json_gbnf *g)
{
    if (!g)
        return;
    gt_free(&g->text);
    json_decref(g->names);
    rc_free(g);
}

int json_gbnf_add_schema(json_gbnf *g, const json_t *schema, const char *prefix, char *rule,
                         size_t rule_size)
{
    conv c = { .g = g, .root = schema, .prefix = prefix, .refs = json_object() };
    if (!c.refs)
        return rc_fail(RC_ENOMEM, "out of memory");
    char name[64];
    snprintf(name, sizeof name, "%s", prefix);
    gtext body = { 0 };
    int rc = gen(&c, schema, &body);
    if (!rc)
        rc = add_rule(&c, name, &body);
    gt_free(&body);
    json_decref(c.refs);
    if (!rc)
        snprintf(rule, rule_size, "%s", name);
    return rc;
}

const char *json_gbnf_shared(json_gbnf *g, const char *name)
{
    for (size_t i = 0; i < sizeof SHARED / sizeof SHARED[0]; i++)
        if (!strcmp(SHARED[i].name, name))
            return need(g, name);
    return NULL;
}

int json_gbnf_add_rule(json_gbnf *g, const char *name, const char *body)
{
    return define(g, name, body);
}

const char *json_gbnf_text(const json_gbnf *g, size_t *len)
{
    if (len)
        *len = g->text.len;
    return g->text.p ? g->text.p : "";
}

static int finish(json_gbnf *g, const char *root, char **gbnf)
{
    int rc = json_gbnf_add_rule(g, "root", root);
    if (!rc && !(*gbnf = rc_strdup(json_gbnf_text(g, NULL))))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    json_gbnf_free(g);
    return rc;
}

int json_schema_to_gbnf(const json_t *schema, char **gbnf)
{
    json_gbnf *g;
    char rule[64];
    if (json_gbnf_new(&g))
        return RC_ENOMEM;
    int rc = json_gbnf_add_schema(g, schema, "schema", rule, sizeof rule);
    if (rc) {
        json_gbnf_free(g);
        return rc;
    }
    return finish(g, rule, gbnf);
}

int json_object_gbnf(char **gbnf)
{
    json_gbnf *g;
    if (json_gbnf_new(&g))
        return RC_ENOMEM;
    return finish(g, need(g, "json-object"), gbnf);
}
