/* jinja_str.c - Python str semantics: methods, escaping and formatting.
 *
 * Strings are UTF-8 but Python indexes them by code point, so methods that
 * take or return positions (find, slicing bounds of startswith, ljust
 * widths) work through a code-point view.  Markup strings (from |safe)
 * keep their flag through the methods markupsafe overrides, and markupsafe
 * escapes the arguments it mixes in (replace's `new`, join's items,
 * format's values).  Divisions: helpers, methods (table at the end),
 * markupsafe.escape, printf-style `%` and str.format.
 */
#include "jinja/jinja_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/mem.h"

/* ---- helpers ----------------------------------------------------------------- */

/* Code-point view of a string: off[i] is the byte offset of character i
 * (NULL for ASCII text, where the two coincide). */
typedef struct sview {
    const char *s;
    size_t len, n;
    size_t *off;
} sview;

static int view_init(jrt *rt, jv v, sview *w)
{
    jstr *s = jv_s(v);
    w->s = s->s;
    w->len = s->len;
    w->n = s->nchars;
    w->off = NULL;
    if (s->nchars == s->len)
        return jv_tick_bytes(rt, s->len);
    w->off = rc_malloc((s->nchars + 1) * sizeof *w->off);
    if (!w->off)
        return jv_nomem(rt);
    size_t i = 0, k = 0;
    while (i < s->len) {
        w->off[k++] = i;
        ju_next(s->s, &i);
    }
    w->off[k] = s->len;
    return jv_tick(rt, s->nchars / 4);     /* an 8-byte offset per character */
}

static size_t vb(const sview *w, size_t ci) { return w->off ? w->off[ci] : ci; }

static size_t vc(const sview *w, size_t byte)
{
    if (!w->off)
        return byte;
    size_t lo = 0, hi = w->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w->off[mid] < byte)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void view_free(sview *w) { rc_free(w->off); }

static unsigned flags_of(jv like) { return jv_is_markup(like) ? JS_MARKUP : 0; }

static int mk(jrt *rt, const char *s, size_t n, jv like, jv *out)
{
    return jv_str_flags(rt, s, n, flags_of(like), out);
}

int jinja__int_arg(jrt *rt, jv v, int64_t *out)
{
    if (!jv_is_intlike(v))
        return jv_fail(rt, RC_EINVAL, "TypeError: '%s' object cannot be interpreted as an integer",
                       jv_type_name(v));
    *out = jv_as_int(v);
    return 0;
}

static int need_str(jrt *rt, jv v, const char *what)
{
    if (v.t == JV_STR)
        return 0;
    return jv_fail(rt, RC_EINVAL, "TypeError: %s must be str, not %s", what, jv_type_name(v));
}

/* Python's slice-style adjustment of optional start/end (in characters). */
static int adjust(jrt *rt, jv start, jv end, size_t n, size_t *a, size_t *b)
{
    int64_t s = 0, e = (int64_t)n, len = (int64_t)n;
    int rc;
    if (!jv_missing(start) && start.t != JV_NONE && (rc = jinja__int_arg(rt, start, &s)) < 0)
        return rc;
    if (!jv_missing(end) && end.t != JV_NONE && (rc = jinja__int_arg(rt, end, &e)) < 0)
        return rc;
    if (e > len)
        e = len;
    else if (e < 0 && (e += len) < 0)
        e = 0;
    if (s < 0 && (s += len) < 0)
        s = 0;
    *a = (size_t)s;
    *b = (size_t)(e < s ? s : e);
    if (*a > n)
        *a = n, *b = n < *b ? n : *b;
    return 0;
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0)
        return h;
    return memmem(h, hn, n, nn);
}

static const char *rfind_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn > hn)
        return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, n, nn) == 0)
            return h + i;
    return NULL;
}

static bool in_chars(uint32_t c, const jstr *chars)
{
    for (size_t i = 0; i < chars->len;)
        if (ju_next(chars->s, &i) == c)
            return true;
    return false;
}

/* ---- strip, case, replace, split -------------------------------------------------- */

int jinja__str_strip(jrt *rt, jv s, jv chars, int which, jv *out)
{
    const jstr *x = jv_s(s);
    const jstr *cs = NULL;
    if (!jv_missing(chars) && chars.t != JV_NONE) {
        if (chars.t != JV_STR)
            return jv_fail(rt, RC_EINVAL, "TypeError: strip arg must be None or str");
        cs = jv_s(chars);
    }
    size_t a = 0, b = x->len;
    if (which & 1) {
        while (a < b) {
            size_t q = a;
            uint32_t c = ju_next(x->s, &q);
            if (cs ? !in_chars(c, cs) : !ju_isspace(c))
                break;
            a = q;
        }
    }
    if (which & 2) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)x->s[st] & 0xC0) == 0x80)
                st--;
            size_t q = st;
            uint32_t c = ju_next(x->s, &q);
            if (cs ? !in_chars(c, cs) : !ju_isspace(c))
                break;
            b = st;
        }
    }
    if (a == 0 && b == x->len) {
        jv_incref(s);
        *out = s;
        return 0;
    }
    return mk(rt, x->s + a, b - a, s, out);
}

static bool is_cased(uint32_t c) { return ju_isupper(c) || ju_islower(c); }

int jinja__str_case(jrt *rt, jv s, int mode, jv *out)
{
    const jstr *x = jv_s(s);
    jbuf b = {0};
    bool prev_cased = false, first = true;
    int rc = 0;
    for (size_t i = 0; i < x->len && rc == 0;) {
        uint32_t c = ju_next(x->s, &i), r = c;
        switch (mode) {
        case JC_LOWER: r = ju_tolower(c); break;
        case JC_UPPER: r = ju_toupper(c); break;
        case JC_CAPITALIZE: r = first ? ju_toupper(c) : ju_tolower(c); break;
        case JC_TITLE:
            r = prev_cased ? ju_tolower(c) : ju_toupper(c);
            prev_cased = is_cased(c);
            break;
        case JC_SWAPCASE:
            r = ju_isupper(c) ? ju_tolower(c) : ju_islower(c) ? ju_toupper(c) : c;
            break;
        }
        first = false;
        char enc[4];
        rc = jbuf_put(rt, &b, enc, ju_encode(r, enc));
    }
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, flags_of(s), out);
}

int jinja__str_replace(jrt *rt, jv s, jv old, jv new_, int64_t count, jv *out)
{
    const jstr *x = jv_s(s), *o = jv_s(old), *n = jv_s(new_);
    jbuf b = {0};
    int rc = 0;
    if (count < 0)
        count = INT64_MAX;
    if (o->len == 0) {
        /* insert `new` before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (rc == 0 && i <= x->len) {
            if (done < count) {
                rc = jbuf_put(rt, &b, n->s, n->len);
                done++;
            }
            if (i == x->len || rc < 0)
                break;
            size_t st = i;
            ju_next(x->s, &i);
            rc = jbuf_put(rt, &b, x->s + st, i - st);
            if (done >= count && rc == 0) {
                rc = jbuf_put(rt, &b, x->s + i, x->len - i);
                break;
            }
        }
    } else {
        size_t i = 0;
        int64_t done = 0;
        while (rc == 0) {
            const char *hit = done < count ? find_bytes(x->s + i, x->len - i, o->s, o->len) : NULL;
            if (!hit) {
                rc = jbuf_put(rt, &b, x->s + i, x->len - i);
                break;
            }
            size_t at = (size_t)(hit - x->s);
            rc = jbuf_put(rt, &b, x->s + i, at - i);
            if (rc == 0)
                rc = jbuf_put(rt, &b, n->s, n->len);
            i = at + o->len;
            done++;
        }
    }
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, flags_of(s), out);
}

/* Start of the code point that ends before byte `pos` (> 0). */
static size_t prev_start(const char *s, size_t pos)
{
    size_t st = pos - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80)
        st--;
    return st;
}

static int push_piece(jrt *rt, jlist *l, const char *p, size_t n, jv like)
{
    jv v;
    int rc = mk(rt, p, n, like, &v);
    return rc < 0 ? rc : jv_list_push_take(rt, l, v);
}

static int split_impl(jrt *rt, jv s, jv sep, int64_t maxsplit, bool right, jv *out)
{
    const jstr *x = jv_s(s);
    int rc = jv_list_new(rt, 0, out);
    if (rc < 0)
        return rc;
    jlist *l = jv_l(*out);
    if (maxsplit < 0)
        maxsplit = INT64_MAX;
    if (sep.t == JV_NONE || jv_missing(sep)) {
        /* runs of whitespace; leading and trailing whitespace ignored */
        if (!right) {
            size_t i = 0;
            while (rc == 0 && maxsplit-- > 0) {
                while (i < x->len) {
                    size_t q = i;
                    if (!ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = q;
                }
                if (i == x->len)
                    break;
                size_t j = i;
                while (i < x->len) {
                    size_t q = i;
                    if (ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = q;
                }
                rc = push_piece(rt, l, x->s + j, i - j, s);
            }
            if (rc == 0 && i < x->len) {
                while (i < x->len) {
                    size_t q = i;
                    if (!ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = q;
                }
                if (i < x->len)
                    rc = push_piece(rt, l, x->s + i, x->len - i, s);
            }
        } else {
            size_t i = x->len;
            while (rc == 0 && maxsplit-- > 0) {
                while (i > 0) {
                    size_t st = prev_start(x->s, i), q = st;
                    if (!ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = st;
                }
                if (i == 0)
                    break;
                size_t j = i;
                while (i > 0) {
                    size_t st = prev_start(x->s, i), q = st;
                    if (ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = st;
                }
                rc = push_piece(rt, l, x->s + i, j - i, s);
            }
            if (rc == 0 && i > 0) {
                while (i > 0) {
                    size_t st = prev_start(x->s, i), q = st;
                    if (!ju_isspace(ju_next(x->s, &q)))
                        break;
                    i = st;
                }
                if (i > 0)
                    rc = push_piece(rt, l, x->s, i, s);
            }
            for (size_t a = 0, b = l->n; rc == 0 && a + 1 < b; a++, b--) {
                jv t = l->items[a];
                l->items[a] = l->items[b - 1];
                l->items[b - 1] = t;
            }
        }
    } else {
        const jstr *p = jv_s(sep);
        if (p->len == 0) {
            jv_clear(rt, out);
            return jv_fail(rt, RC_EINVAL, "ValueError: empty separator");
        }
        if (!right) {
            size_t i = 0;
            while (rc == 0 && maxsplit-- > 0) {
                const char *hit = find_bytes(x->s + i, x->len - i, p->s, p->len);
                if (!hit)
                    break;
                size_t at = (size_t)(hit - x->s);
                rc = push_piece(rt, l, x->s + i, at - i, s);
                i = at + p->len;
            }
            if (rc == 0)
                rc = push_piece(rt, l, x->s + i, x->len - i, s);
        } else {
            size_t end = x->len;
            while (rc == 0 && maxsplit-- > 0) {
                const char *hit = rfind_bytes(x->s, end, p->s, p->len);
                if (!hit)
                    break;
                size_t at = (size_t)(hit - x->s);
                rc = push_piece(rt, l, x->s + at + p->len, end - at - p->len, s);
                end = at;
            }
            if (rc == 0)
                rc = push_piece(rt, l, x->s, end, s);
            for (size_t a = 0, b = l->n; rc == 0 && a + 1 < b; a++, b--) {
                jv t = l->items[a];
                l->items[a] = l->items[b - 1];
                l->items[b - 1] = t;
            }
        }
    }
    if (rc < 0)
        jv_clear(rt, out);
    return rc;
}

static bool line_break(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
           c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

int jinja__str_splitlines(jrt *rt, jv s, bool keepends, jv *out)
{
    const jstr *x = jv_s(s);
    int rc = jv_list_new(rt, 0, out);
    size_t i = 0, start = 0;
    while (rc == 0 && i < x->len) {
        size_t q = i;
        uint32_t c = ju_next(x->s, &q);
        if (!line_break(c)) {
            i = q;
            continue;
        }
        size_t eol = i;
        if (c == '\r' && q < x->len && x->s[q] == '\n')
            q++;
        rc = push_piece(rt, jv_l(*out), x->s + start, (keepends ? q : eol) - start, s);
        i = start = q;
    }
    if (rc == 0 && start < x->len)
        rc = push_piece(rt, jv_l(*out), x->s + start, x->len - start, s);
    if (rc < 0 && out->t == JV_LIST)
        jv_clear(rt, out);
    return rc;
}

/* ---- markupsafe.escape --------------------------------------------------------------- */

int jinja__escape(jrt *rt, jv v, jv *out)
{
    if (jv_is_markup(v)) {
        jv_incref(v);
        *out = v;
        return 0;
    }
    jv s;
    int rc = jv_to_str(rt, v, &s);
    if (rc < 0)
        return rc;
    const jstr *x = jv_s(s);
    jbuf b = {0};
    size_t run = 0;
    for (size_t i = 0; i < x->len && rc == 0; i++) {
        const char *e = NULL;
        switch (x->s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '\'': e = "&#39;"; break;
        case '"': e = "&#34;"; break;
        default: run++; continue;
        }
        rc = jbuf_put(rt, &b, x->s + i - run, run);
        run = 0;
        if (rc == 0)
            rc = jbuf_puts(rt, &b, e);
    }
    if (rc == 0)
        rc = jbuf_put(rt, &b, x->s + x->len - run, run);
    jv_decref(rt, s);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, JS_MARKUP, out);
}

/* ---- number parsing (Python's int() and float() of strings) -------------------------- */

/* Strips Python whitespace and checks/removes '_' separators between digits. */
static bool clean_number(const char *s, size_t len, char *buf, size_t cap, size_t *n)
{
    size_t a = 0, b = len;
    while (a < b) {
        size_t q = a;
        if (!ju_isspace(ju_next(s, &q)))
            break;
        a = q;
    }
    while (b > a && ju_isspace((unsigned char)s[b - 1]))
        b--;
    if (b - a >= cap)
        return false;
    size_t o = 0;
    for (size_t i = a; i < b; i++) {
        char c = s[i];
        if ((unsigned char)c >= 0x80)
            return false;
        if (c == '_') {
            bool ok = i > a && i + 1 < b && isxdigit((unsigned char)s[i - 1]) &&
                      isxdigit((unsigned char)s[i + 1]);
            if (!ok)
                return false;
            continue;
        }
        buf[o++] = c;
    }
    buf[o] = '\0';
    *n = o;
    return o > 0;
}

bool jinja__parse_int(const char *s, size_t len, int base, int64_t *out)
{
    char buf[128];
    size_t n;
    if (!clean_number(s, len, buf, sizeof buf, &n))
        return false;
    const char *p = buf;
    bool neg = false;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    if ((base == 0 || base == 16) && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    } else if ((base == 0 || base == 8) && p[0] == '0' && (p[1] == 'o' || p[1] == 'O')) {
        base = 8;
        p += 2;
    } else if ((base == 0 || base == 2) && p[0] == '0' && (p[1] == 'b' || p[1] == 'B')) {
        base = 2;
        p += 2;
    } else if (base == 0) {
        base = 10;
        if (p[0] == '0' && p[1] && strspn(p, "0") != strlen(p))
            return false;
    }
    if (base < 2 || base > 36 || !*p)
        return false;
    uint64_t v = 0;
    for (; *p; p++) {
        int d = (*p >= '0' && *p <= '9') ? *p - '0'
              : (*p >= 'a' && *p <= 'z') ? *p - 'a' + 10
              : (*p >= 'A' && *p <= 'Z') ? *p - 'A' + 10 : 99;
        if (d >= base)
            return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
        return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

bool jinja__parse_float(const char *s, size_t len, double *out)
{
    char buf[512];
    size_t n;
    if (!clean_number(s, len, buf, sizeof buf, &n))
        return false;
    const char *p = buf;
    if (*p == '+' || *p == '-')
        p++;
    if (strcasecmp(p, "inf") == 0 || strcasecmp(p, "infinity") == 0 || strcasecmp(p, "nan") == 0) {
        *out = strtod(buf, NULL);
        return true;
    }
    /* digits [. digits] [e [+-] digits], at least one digit in the mantissa */
    size_t dig = 0;
    while (*p >= '0' && *p <= '9')
        p++, dig++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9')
            p++, dig++;
    }
    if (!dig)
        return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p)
        return false;
    *out = strtod(buf, NULL);
    return true;
}

/* ---- printf-style formatting (str % args) --------------------------------------------- */

static int fmt_pad(jrt *rt, jbuf *b, const char *s, size_t n, size_t nchars, int64_t width,
                   bool left)
{
    int rc = 0;
    int64_t pad = width > (int64_t)nchars ? width - (int64_t)nchars : 0;
    if (pad > (int64_t)rt->lim.max_output_bytes)
        return jv_fail(rt, RC_ELIMIT, "LimitError: format width too large");
    for (int64_t i = 0; !left && i < pad && rc == 0; i++)
        rc = jbuf_putc(rt, b, ' ');
    if (rc == 0)
        rc = jbuf_put(rt, b, s, n);
    for (int64_t i = 0; left && i < pad && rc == 0; i++)
        rc = jbuf_putc(rt, b, ' ');
    return rc;
}

int jinja__percent_format(jrt *rt, jv fmtv, jv args, jv *out)
{
    const jstr *f = jv_s(fmtv);
    bool markup = jv_is_markup(fmtv);
    const jv *pos = &args;
    size_t npos = 1, argi = 0;
    const jdict *map = NULL;
    if (args.t == JV_TUPLE) {
        pos = jv_l(args)->items;
        npos = jv_l(args)->n;
    } else if (args.t == JV_DICT || args.t == JV_LIST) {
        map = args.t == JV_DICT ? jv_d(args) : NULL;
        npos = (size_t)-1;  /* a single argument; "not all converted" not checked */
    }
    jbuf b = {0};
    int rc = 0;
    size_t i = 0;
    while (rc == 0 && i < f->len) {
        const char *pct = memchr(f->s + i, '%', f->len - i);
        size_t stop = pct ? (size_t)(pct - f->s) : f->len;
        if ((rc = jbuf_put(rt, &b, f->s + i, stop - i)) < 0 || !pct)
            break;
        size_t start = stop;
        i = stop + 1;
        jv arg = jv_none();
        bool have = false;
        if (i < f->len && f->s[i] == '(') {
            size_t e = i + 1;
            int depth = 1;
            while (e < f->len && depth) {
                if (f->s[e] == '(')
                    depth++;
                else if (f->s[e] == ')')
                    depth--;
                e++;
            }
            if (depth) {
                rc = jv_fail(rt, RC_EINVAL, "ValueError: incomplete format key");
                break;
            }
            if (!map) {
                rc = jv_fail(rt, RC_EINVAL, "TypeError: format requires a mapping");
                break;
            }
            jentry *en = jv_dict_find_str(map, f->s + i + 1, e - i - 2);
            if (!en) {
                rc = jv_fail(rt, RC_EINVAL, "KeyError: '%.*s'", (int)(e - i - 2), f->s + i + 1);
                break;
            }
            arg = en->val;
            have = true;
            i = e;
        }
        bool left = false, plus = false, space = false, alt = false, zero = false;
        for (; i < f->len && strchr("-+ #0", f->s[i]); i++) {
            char c = f->s[i];
            left |= c == '-';
            plus |= c == '+';
            space |= c == ' ';
            alt |= c == '#';
            zero |= c == '0';
        }
        int64_t width = -1, prec = -1;
        if (i < f->len && f->s[i] == '*') {
            i++;
            if (argi >= npos || npos == (size_t)-1) {
                rc = jv_fail(rt, RC_EINVAL, "TypeError: not enough arguments for format string");
                break;
            }
            if ((rc = jinja__int_arg(rt, pos[argi++], &width)) < 0)
                break;
            if (width < 0) {
                left = true;
                width = -width;
            }
        } else {
            for (; i < f->len && f->s[i] >= '0' && f->s[i] <= '9'; i++)
                width = width > 100000000000 ? width : (width < 0 ? 0 : width) * 10 + (f->s[i] - '0');
        }
        if (i < f->len && f->s[i] == '.') {
            i++;
            prec = 0;
            if (i < f->len && f->s[i] == '*') {
                i++;
                if (argi >= npos || npos == (size_t)-1) {
                    rc = jv_fail(rt, RC_EINVAL, "TypeError: not enough arguments for format string");
                    break;
                }
                if ((rc = jinja__int_arg(rt, pos[argi++], &prec)) < 0)
                    break;
            } else {
                for (; i < f->len && f->s[i] >= '0' && f->s[i] <= '9'; i++)
                    prec = prec > 100000000000 ? prec : prec * 10 + (f->s[i] - '0');
            }
        }
        while (i < f->len && strchr("hlL", f->s[i]))
            i++;
        if (i >= f->len) {
            rc = jv_fail(rt, RC_EINVAL, "ValueError: incomplete format");
            break;
        }
        char conv = f->s[i++];
        if (conv == '%') {
            rc = jbuf_putc(rt, &b, '%');
            continue;
        }
        if (!have) {
            if (npos == (size_t)-1) {
                if (argi++ > 0) {
                    rc = jv_fail(rt, RC_EINVAL, "TypeError: not enough arguments for format string");
                    break;
                }
                arg = args;
            } else {
                if (argi >= npos) {
                    rc = jv_fail(rt, RC_EINVAL, "TypeError: not enough arguments for format string");
                    break;
                }
                arg = pos[argi++];
            }
        }
        char spec[64], tmp[512];
        int n;
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            jbuf t = {0};
            jv e = arg;
            if (markup && conv == 's' && (rc = jinja__escape(rt, arg, &e)) < 0)
                break;
            rc = conv == 's' ? jv_write_str(rt, e, &t) : jv_write_repr(rt, e, &t);
            if (e.u.o != arg.u.o || e.t != arg.t)
                jv_decref(rt, e);
            if (rc == 0) {
                size_t nb = t.len, nc = ju_count(t.p ? t.p : "", t.len);
                if (prec >= 0 && (size_t)prec < nc) {
                    nb = ju_offset(t.p, t.len, (size_t)prec);
                    nc = (size_t)prec;
                }
                rc = fmt_pad(rt, &b, t.p ? t.p : "", nb, nc, width, left);
            }
            jbuf_free(rt, &t);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c': {
            int64_t v;
            if (conv == 'c') {
                if (arg.t == JV_STR && jv_s(arg)->nchars == 1) {
                    rc = fmt_pad(rt, &b, jv_s(arg)->s, jv_s(arg)->len, 1, width, left);
                    break;
                }
                if (!jv_is_intlike(arg)) {
                    rc = jv_fail(rt, RC_EINVAL, "TypeError: %%c requires int or char");
                    break;
                }
                v = jv_as_int(arg);
                if (v < 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                    rc = jv_fail(rt, RC_EINVAL, "OverflowError: %%c arg not in range(0x110000)");
                    break;
                }
                char enc[4];
                size_t k = ju_encode((uint32_t)v, enc);
                rc = fmt_pad(rt, &b, enc, k, 1, width, left);
                break;
            }
            if (jv_is_intlike(arg)) {
                v = jv_as_int(arg);
            } else if (arg.t == JV_FLOAT && (conv == 'd' || conv == 'i' || conv == 'u')) {
                if (!isfinite(arg.u.f) || fabs(arg.u.f) >= 9.2e18) {
                    rc = jv_fail(rt, RC_EINVAL, "OverflowError: cannot convert float to integer");
                    break;
                }
                v = (int64_t)arg.u.f;
            } else {
                rc = jv_fail(rt, RC_EINVAL, conv == 'd' || conv == 'i' || conv == 'u'
                             ? "TypeError: %%%c format: a real number is required, not %s"
                             : "TypeError: %%%c format: an integer is required, not %s",
                             conv, jv_type_name(arg));
                break;
            }
            char c2 = conv == 'i' || conv == 'u' ? 'd' : conv;
            uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
            char digits[80];
            if (c2 == 'd')
                snprintf(digits, sizeof digits, "%" PRIu64, mag);
            else if (c2 == 'o')
                snprintf(digits, sizeof digits, "%" PRIo64, mag);
            else
                snprintf(digits, sizeof digits, c2 == 'x' ? "%" PRIx64 : "%" PRIX64, mag);
            if (prec > 64)
                prec = 64;
            char body[200];
            size_t bl = 0;
            const char *sign = v < 0 ? "-" : plus ? "+" : space ? " " : "";
            const char *pre = !alt ? "" : c2 == 'o' ? "0o" : c2 == 'x' ? "0x" : c2 == 'X' ? "0X" : "";
            size_t dl = strlen(digits);
            int64_t zeros = prec > (int64_t)dl ? prec - (int64_t)dl : 0;
            bl += (size_t)snprintf(body + bl, sizeof body - bl, "%s%s", sign, pre);
            int64_t total = (int64_t)(bl + (size_t)zeros + dl);
            if (zero && !left && width > total)
                zeros += width - total;
            if (zeros > 100000000) {
                rc = jv_fail(rt, RC_ELIMIT, "LimitError: format width too large");
                break;
            }
            jbuf t = {0};
            rc = jbuf_put(rt, &t, body, bl);
            for (int64_t z = 0; z < zeros && rc == 0; z++)
                rc = jbuf_putc(rt, &t, '0');
            if (rc == 0)
                rc = jbuf_put(rt, &t, digits, dl);
            if (rc == 0)
                rc = fmt_pad(rt, &b, t.p, t.len, t.len, width, left);
            jbuf_free(rt, &t);
            break;
        }
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            if (!jv_is_num(arg)) {
                rc = jv_fail(rt, RC_EINVAL, "TypeError: must be real number, not %s", jv_type_name(arg));
                break;
            }
            if (prec > 300)
                prec = 300;
            if (width > (int64_t)rt->lim.max_output_bytes) {
                rc = jv_fail(rt, RC_ELIMIT, "LimitError: format width too large");
                break;
            }
            snprintf(spec, sizeof spec, "%%%s%s%s%s%s.%d%c", left ? "-" : "", plus ? "+" : "",
                     space ? " " : "", alt ? "#" : "", zero ? "0" : "",
                     (int)(prec < 0 ? 6 : prec), conv);
            n = snprintf(tmp, sizeof tmp, spec, jv_as_float(arg));
            if (n < 0 || (size_t)n >= sizeof tmp) {
                rc = jv_fail(rt, RC_ELIMIT, "LimitError: formatted number too long");
                break;
            }
            if (zero && !left && width > n) {
                /* zero padding goes after the sign */
                size_t sl = (tmp[0] == '-' || tmp[0] == '+' || tmp[0] == ' ') ? 1 : 0;
                jbuf t = {0};
                rc = jbuf_put(rt, &t, tmp, sl);
                for (int64_t z = n; z < width && rc == 0; z++)
                    rc = jbuf_putc(rt, &t, '0');
                if (rc == 0)
                    rc = jbuf_put(rt, &t, tmp + sl, (size_t)n - sl);
                if (rc == 0)
                    rc = jbuf_put(rt, &b, t.p, t.len);
                jbuf_free(rt, &t);
            } else {
                rc = fmt_pad(rt, &b, tmp, (size_t)n, (size_t)n, width, left);
            }
            break;
        }
        default:
            rc = jv_fail(rt, RC_EINVAL, "ValueError: unsupported format character '%c' (0x%x) at index %zu",
                         conv, (unsigned char)conv, start + 1);
            break;
        }
    }
    if (rc == 0 && npos != (size_t)-1 && argi < npos && !map)
        rc = jv_fail(rt, RC_EINVAL, "TypeError: not all arguments converted during string formatting");
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, markup ? JS_MARKUP : 0, out);
}

/* ---- str.format ------------------------------------------------------------------------ */

typedef struct fspec {
    uint32_t fill;
    char align, sign, type, grouping;
    bool alt, zero;
    int64_t width, prec;
} fspec;

static int parse_spec(jrt *rt, const char *s, size_t n, fspec *f)
{
    size_t i = 0;
    memset(f, 0, sizeof *f);
    f->fill = ' ';
    f->width = f->prec = -1;
    if (n >= 2) {
        size_t q = 0;
        uint32_t c = ju_next(s, &q);
        if (q < n && strchr("<>=^", s[q])) {
            f->fill = c;
            f->align = s[q];
            i = q + 1;
        }
    }
    if (!f->align && i < n && strchr("<>=^", s[i]))
        f->align = s[i++];
    if (i < n && strchr("+- ", s[i]))
        f->sign = s[i++];
    if (i < n && s[i] == 'z')
        i++;
    if (i < n && s[i] == '#') {
        f->alt = true;
        i++;
    }
    if (i < n && s[i] == '0') {
        f->zero = true;
        i++;
    }
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        f->width = f->width > 100000000000 ? f->width : (f->width < 0 ? 0 : f->width) * 10 + (s[i] - '0');
    if (i < n && (s[i] == ',' || s[i] == '_'))
        f->grouping = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        f->prec = 0;
        if (i >= n || s[i] < '0' || s[i] > '9')
            return jv_fail(rt, RC_EINVAL, "ValueError: Format specifier missing precision");
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            f->prec = f->prec > 100000000000 ? f->prec : f->prec * 10 + (s[i] - '0');
    }
    if (i < n)
        f->type = s[i++];
    if (i < n)
        return jv_fail(rt, RC_EINVAL, "ValueError: Invalid format specifier");
    if (f->zero && !f->align) {
        f->fill = '0';
        f->align = '=';
    }
    return 0;
}

static int group_digits(jrt *rt, jbuf *b, const char *d, size_t n, char sep)
{
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = jbuf_putc(rt, b, d[i]);
        size_t left = n - i - 1;
        if (rc == 0 && sep && left && left % 3 == 0)
            rc = jbuf_putc(rt, b, sep);
    }
    return rc;
}

/* Lays out sign/prefix + body to the spec's width, fill and alignment. */
static int fmt_align(jrt *rt, jbuf *out, const fspec *f, const char *prefix, const char *body,
                     size_t blen, char def_align)
{
    size_t plen = strlen(prefix);
    size_t nchars = plen + ju_count(body, blen);
    int64_t pad = f->width > (int64_t)nchars ? f->width - (int64_t)nchars : 0;
    if (pad > (int64_t)rt->lim.max_output_bytes)
        return jv_fail(rt, RC_ELIMIT, "LimitError: format width too large");
    char align = f->align ? f->align : def_align;
    int64_t lp = align == '>' ? pad : align == '^' ? pad / 2 : 0;
    int64_t rp = align == '<' ? pad : align == '^' ? pad - pad / 2 : 0;
    int64_t mid = align == '=' ? pad : 0;
    char fill[4];
    size_t fl = ju_encode(f->fill, fill);
    int rc = 0;
    for (int64_t i = 0; i < lp && rc == 0; i++)
        rc = jbuf_put(rt, out, fill, fl);
    if (rc == 0)
        rc = jbuf_put(rt, out, prefix, plen);
    for (int64_t i = 0; i < mid && rc == 0; i++)
        rc = jbuf_put(rt, out, fill, fl);
    if (rc == 0)
        rc = jbuf_put(rt, out, body, blen);
    for (int64_t i = 0; i < rp && rc == 0; i++)
        rc = jbuf_put(rt, out, fill, fl);
    return rc;
}

static int format_value(jrt *rt, jv v, const char *spec, size_t slen, jbuf *out)
{
    fspec f;
    int rc;
    if (slen == 0)
        return jv_write_str(rt, v, out);
    if ((rc = parse_spec(rt, spec, slen, &f)) < 0)
        return rc;
    char num[400];
    if (f.grouping && f.type && !strchr("deEfFgG%", f.type))
        return jv_fail(rt, RC_EINVAL, "ValueError: Cannot specify '%c' with '%c'.", f.grouping, f.type);
    if (v.t == JV_STR && (f.type == 0 || f.type == 's')) {
        if (f.sign)
            return jv_fail(rt, RC_EINVAL, "ValueError: Sign not allowed in string format specifier");
        if (f.grouping)
            return jv_fail(rt, RC_EINVAL, "ValueError: Cannot specify '%c' with 's'.", f.grouping);
        size_t bl = jv_s(v)->len;
        if (f.prec >= 0 && (size_t)f.prec < jv_s(v)->nchars)
            bl = ju_offset(jv_s(v)->s, jv_s(v)->len, (size_t)f.prec);
        return fmt_align(rt, out, &f, "", jv_s(v)->s, bl, '<');
    }
    bool int_type = f.type == 0 || strchr("bcdoxXn", f.type);
    if (jv_is_intlike(v) && int_type && !(v.t == JV_BOOL && f.type == 0)) {
        if (f.prec >= 0)
            return jv_fail(rt, RC_EINVAL, "ValueError: Precision not allowed in integer format specifier");
        int64_t x = jv_as_int(v);
        uint64_t mag = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
        char digits[80];
        const char *pre = "";
        switch (f.type) {
        case 'b': {
            int k = 0;
            char tmp[70];
            do {
                tmp[k++] = (char)('0' + (mag & 1));
                mag >>= 1;
            } while (mag);
            for (int j = 0; j < k; j++)
                digits[j] = tmp[k - 1 - j];
            digits[k] = '\0';
            pre = f.alt ? "0b" : "";
            break;
        }
        case 'o': snprintf(digits, sizeof digits, "%" PRIo64, mag); pre = f.alt ? "0o" : ""; break;
        case 'x': snprintf(digits, sizeof digits, "%" PRIx64, mag); pre = f.alt ? "0x" : ""; break;
        case 'X': snprintf(digits, sizeof digits, "%" PRIX64, mag); pre = f.alt ? "0X" : ""; break;
        case 'c': {
            if (x < 0 || x > 0x10FFFF)
                return jv_fail(rt, RC_EINVAL, "OverflowError: %%c arg not in range(0x110000)");
            char enc[4];
            size_t k = ju_encode((uint32_t)x, enc);
            return fmt_align(rt, out, &f, "", enc, k, '<');
        }
        default: snprintf(digits, sizeof digits, "%" PRIu64, mag); break;
        }
        char prefix[8];
        snprintf(prefix, sizeof prefix, "%s%s",
                 x < 0 ? "-" : f.sign == '+' ? "+" : f.sign == ' ' ? " " : "", pre);
        jbuf body = {0};
        rc = group_digits(rt, &body, digits, strlen(digits), f.grouping);
        if (rc == 0)
            rc = fmt_align(rt, out, &f, prefix, body.p ? body.p : "", body.len, '>');
        jbuf_free(rt, &body);
        return rc;
    }
    if (jv_is_num(v) && (f.type == 0 || strchr("eEfFgG%n", f.type))) {
        double x = jv_as_float(v);
        char type = f.type == 'n' ? 'g' : f.type;
        int64_t prec = f.prec < 0 ? 6 : (f.prec > 300 ? 300 : f.prec);
        if (type == '%')
            x *= 100.0;
        double mag = fabs(x);
        if (type == 0) {
            if (f.prec < 0) {
                jv_fmt_float(mag, num);
            } else {
                /* like 'g', but the exponent form starts one digit
                 * earlier and fixed notation keeps a ".0" (CPython's
                 * add_dot_0_if_integer) */
                int p = (int)(prec ? prec : 1);
                char e[64];
                snprintf(e, sizeof e, "%.*e", p - 1, mag);
                int exp10 = isfinite(mag) ? atoi(strchr(e, 'e') + 1) : 0;
                if (!isfinite(mag)) {
                    snprintf(num, sizeof num, "%g", mag);
                } else if (exp10 < -4 || exp10 >= p - 1) {
                    char *ep = strchr(e, 'e'), mant[64];
                    snprintf(mant, sizeof mant, "%.*s", (int)(ep - e), e);
                    if (strchr(mant, '.')) {
                        size_t l = strlen(mant);
                        while (l > 0 && mant[l - 1] == '0')
                            mant[--l] = '\0';
                        if (l > 0 && mant[l - 1] == '.')
                            mant[--l] = '\0';
                    }
                    snprintf(num, sizeof num, "%s%s", mant, ep);
                } else {
                    snprintf(num, sizeof num, "%.*f", p - 1 - exp10, mag);
                    if (strchr(num, '.')) {
                        size_t l = strlen(num);
                        while (num[l - 1] == '0')
                            num[--l] = '\0';
                        if (num[l - 1] == '.')
                            num[--l] = '\0';
                    }
                    if (!strchr(num, '.'))
                        strcat(num, ".0");
                }
            }
        } else {
            char cf[16];
            snprintf(cf, sizeof cf, "%%%s.%d%c", f.alt ? "#" : "", (int)prec,
                     type == '%' ? 'f' : type);
            snprintf(num, sizeof num, cf, mag);
            if (type == '%')
                strcat(num, "%");
        }
        char prefix[4];
        snprintf(prefix, sizeof prefix, "%s",
                 signbit(x) && !isnan(x) ? "-" : f.sign == '+' ? "+" : f.sign == ' ' ? " " : "");
        jbuf body = {0};
        size_t intlen = strspn(num, "0123456789");
        rc = group_digits(rt, &body, num, intlen, f.grouping);
        if (rc == 0)
            rc = jbuf_puts(rt, &body, num + intlen);
        if (rc == 0)
            rc = fmt_align(rt, out, &f, prefix, body.p ? body.p : "", body.len, '>');
        jbuf_free(rt, &body);
        return rc;
    }
    if (v.t == JV_STR || jv_is_num(v))
        return jv_fail(rt, RC_EINVAL, "ValueError: Unknown format code '%c' for object of type '%s'",
                       f.type, jv_type_name(v));
    return jv_fail(rt, RC_EINVAL, "TypeError: unsupported format string passed to %s.__format__",
                   jv_type_name(v));
}

static int str_format(jrt *rt, jv self, const jcall *a, jv *out)
{
    const jstr *f = jv_s(self);
    bool markup = jv_is_markup(self);
    jbuf b = {0};
    int rc = 0;
    size_t i = 0, auto_idx = 0;
    int numbering = 0;  /* 1 automatic, 2 manual */
    while (rc == 0 && i < f->len) {
        char c = f->s[i];
        if (c == '}') {
            if (i + 1 < f->len && f->s[i + 1] == '}') {
                rc = jbuf_putc(rt, &b, '}');
                i += 2;
                continue;
            }
            rc = jv_fail(rt, RC_EINVAL, "ValueError: Single '}' encountered in format string");
            break;
        }
        if (c != '{') {
            size_t st = i;
            while (i < f->len && f->s[i] != '{' && f->s[i] != '}')
                i++;
            rc = jbuf_put(rt, &b, f->s + st, i - st);
            continue;
        }
        if (i + 1 < f->len && f->s[i + 1] == '{') {
            rc = jbuf_putc(rt, &b, '{');
            i += 2;
            continue;
        }
        /* a replacement field */
        size_t st = ++i;
        int depth = 1;
        while (i < f->len && depth) {
            if (f->s[i] == '{')
                depth++;
            else if (f->s[i] == '}')
                depth--;
            if (depth)
                i++;
        }
        if (i >= f->len) {
            rc = jv_fail(rt, RC_EINVAL, "ValueError: expected '}' before end of string");
            break;
        }
        const char *fld = f->s + st;
        size_t flen = i - st;
        i++;
        if (memchr(fld, '{', flen)) {
            rc = jv_fail(rt, RC_EUNSUPPORTED, "ValueError: nested format fields are not supported");
            break;
        }
        const char *colon = memchr(fld, ':', flen);
        size_t name_end = colon ? (size_t)(colon - fld) : flen;
        char conv = 0;
        const char *bang = memchr(fld, '!', name_end);
        if (bang) {
            if ((size_t)(bang - fld) + 2 != name_end) {
                rc = jv_fail(rt, RC_EINVAL, "ValueError: expected ':' after conversion specifier");
                break;
            }
            conv = bang[1];
            name_end = (size_t)(bang - fld);
        }
        /* first part: index or keyword */
        size_t k = 0;
        while (k < name_end && fld[k] != '.' && fld[k] != '[')
            k++;
        jv val;
        if (k == 0 || strspn(fld, "0123456789") == k) {
            size_t idx;
            if (k == 0) {
                if (numbering == 2) {
                    rc = jv_fail(rt, RC_EINVAL, "ValueError: cannot switch from manual field specification to automatic field numbering");
                    break;
                }
                numbering = 1;
                idx = auto_idx++;
            } else {
                if (numbering == 1) {
                    rc = jv_fail(rt, RC_EINVAL, "ValueError: cannot switch from automatic field numbering to manual field specification");
                    break;
                }
                numbering = 2;
                idx = (size_t)strtoull(fld, NULL, 10);
            }
            if (idx >= a->n_pos) {
                rc = jv_fail(rt, RC_EINVAL, "IndexError: tuple index out of range");
                break;
            }
            val = a->pos[idx];
        } else {
            size_t j;
            for (j = 0; j < a->n_kw; j++)
                if (strlen(a->kw_names[j].s) == k && memcmp(a->kw_names[j].s, fld, k) == 0)
                    break;
            if (j == a->n_kw) {
                rc = jv_fail(rt, RC_EINVAL, "KeyError: '%.*s'", (int)k, fld);
                break;
            }
            val = a->kw[j];
        }
        jv_incref(val);
        /* .attr and [key] accessors */
        while (rc == 0 && k < name_end) {
            jv next, key;
            if (fld[k] == '.') {
                size_t e = ++k;
                while (e < name_end && fld[e] != '.' && fld[e] != '[')
                    e++;
                char nm[128];
                snprintf(nm, sizeof nm, "%.*s", (int)(e - k), fld + k);
                k = e;
                if (val.t == JV_UNDEF)
                    rc = jv_undef_raise(rt, val);
                else
                    rc = jinja__getattr(rt, val, nm, &next);
            } else {
                const char *close = memchr(fld + k, ']', name_end - k);
                if (!close) {
                    rc = jv_fail(rt, RC_EINVAL, "ValueError: Missing ']' in format string");
                    break;
                }
                size_t ks = k + 1, ke = (size_t)(close - fld);
                k = ke + 1;
                if (ke > ks && strspn(fld + ks, "0123456789") >= ke - ks)
                    key = jv_int(strtoll(fld + ks, NULL, 10));
                else if ((rc = jv_str(rt, fld + ks, ke - ks, &key)) < 0)
                    break;
                rc = jinja__getitem(rt, val, key, &next);
                jv_decref(rt, key);
            }
            jv_decref(rt, val);
            if (rc < 0) {
                val = jv_none();
                break;
            }
            val = next;
        }
        if (rc < 0) {
            jv_decref(rt, val);
            break;
        }
        if (conv == 'r' || conv == 'a' || conv == 's') {
            jbuf t = {0};
            rc = conv == 's' ? jv_write_str(rt, val, &t) : jv_write_repr(rt, val, &t);
            jv s2;
            if (rc == 0)
                rc = jv_str_from_buf(rt, &t, 0, &s2);
            else
                jbuf_free(rt, &t);
            jv_decref(rt, val);
            if (rc < 0)
                break;
            val = s2;
        } else if (conv) {
            jv_decref(rt, val);
            rc = jv_fail(rt, RC_EINVAL, "ValueError: Unknown conversion specifier %c", conv);
            break;
        }
        if (markup) {
            jv e;
            rc = jinja__escape(rt, val, &e);
            jv_decref(rt, val);
            if (rc < 0)
                break;
            val = e;
        }
        rc = format_value(rt, val, colon ? colon + 1 : "", colon ? flen - name_end - 1 - (bang ? 2 : 0) : 0, &b);
        jv_decref(rt, val);
    }
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, markup ? JS_MARKUP : 0, out);
}

/* ---- methods ---------------------------------------------------------------------------- */

typedef int (*str_fn)(jrt *rt, jv self, const jcall *a, jv *out);

#define BIND(fname, names, n)                                               \
    jv p[n];                                                                \
    int rc = jinja__bind(rt, fname, names, a, p, n);                        \
    if (rc < 0)                                                             \
        return rc

static int m_strip(jrt *rt, jv self, const jcall *a, jv *out, int which)
{
    BIND("strip", "chars", 1);
    return jinja__str_strip(rt, self, p[0], which, out);
}
static int m_strip3(jrt *rt, jv s, const jcall *a, jv *o) { return m_strip(rt, s, a, o, 3); }
static int m_lstrip(jrt *rt, jv s, const jcall *a, jv *o) { return m_strip(rt, s, a, o, 1); }
static int m_rstrip(jrt *rt, jv s, const jcall *a, jv *o) { return m_strip(rt, s, a, o, 2); }

static int m_split_common(jrt *rt, jv self, const jcall *a, jv *out, bool right)
{
    BIND(right ? "rsplit" : "split", "sep,maxsplit", 2);
    int64_t maxsplit = -1;
    if (!jv_missing(p[1]) && (rc = jinja__int_arg(rt, p[1], &maxsplit)) < 0)
        return rc;
    if (!jv_missing(p[0]) && p[0].t != JV_NONE && p[0].t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: must be str or None, not %s", jv_type_name(p[0]));
    return split_impl(rt, self, p[0], maxsplit, right, out);
}
static int m_split(jrt *rt, jv s, const jcall *a, jv *o) { return m_split_common(rt, s, a, o, false); }
static int m_rsplit(jrt *rt, jv s, const jcall *a, jv *o) { return m_split_common(rt, s, a, o, true); }

static int m_splitlines(jrt *rt, jv self, const jcall *a, jv *out)
{
    BIND("splitlines", "keepends", 1);
    return jinja__str_splitlines(rt, self, !jv_missing(p[0]) && jv_truthy(p[0]), out);
}

static int affix(jrt *rt, jv self, const jcall *a, jv *out, bool end)
{
    BIND(end ? "endswith" : "startswith", "!prefix,start,end", 3);
    sview w;
    size_t s0, s1;
    if ((rc = view_init(rt, self, &w)) < 0)
        return rc;
    if ((rc = adjust(rt, p[1], p[2], w.n, &s0, &s1)) < 0)
        goto done;
    const jv *cands = &p[0];
    size_t nc = 1;
    if (p[0].t == JV_TUPLE) {
        cands = jv_l(p[0])->items;
        nc = jv_l(p[0])->n;
    }
    bool hit = false;
    size_t b0 = vb(&w, s0), b1 = vb(&w, s1);
    for (size_t i = 0; i < nc && !hit; i++) {
        if (cands[i].t != JV_STR) {
            rc = jv_fail(rt, RC_EINVAL, "TypeError: %s first arg must be str or a tuple of str, not %s",
                         end ? "endswith" : "startswith", jv_type_name(cands[i]));
            goto done;
        }
        const jstr *x = jv_s(cands[i]);
        if (s0 > w.n)
            continue;
        if (x->len <= b1 - b0)
            hit = end ? memcmp(w.s + b1 - x->len, x->s, x->len) == 0
                      : memcmp(w.s + b0, x->s, x->len) == 0;
    }
    *out = jv_bool(hit);
done:
    view_free(&w);
    return rc;
}
static int m_startswith(jrt *rt, jv s, const jcall *a, jv *o) { return affix(rt, s, a, o, false); }
static int m_endswith(jrt *rt, jv s, const jcall *a, jv *o) { return affix(rt, s, a, o, true); }

static int m_replace(jrt *rt, jv self, const jcall *a, jv *out)
{
    BIND("replace", "!old,!new,count", 3);
    int64_t count = -1;
    if ((rc = need_str(rt, p[0], "replace() argument 1")) < 0 ||
        (rc = need_str(rt, p[1], "replace() argument 2")) < 0)
        return rc;
    if (!jv_missing(p[2]) && (rc = jinja__int_arg(rt, p[2], &count)) < 0)
        return rc;
    jv nw = p[1];
    if (jv_is_markup(self) && (rc = jinja__escape(rt, p[1], &nw)) < 0)
        return rc;
    rc = jinja__str_replace(rt, self, p[0], nw, count, out);
    if (nw.u.o != p[1].u.o)
        jv_decref(rt, nw);
    return rc;
}

static int no_args(jrt *rt, const char *name, const jcall *a)
{
    if (a->n_pos || a->n_kw)
        return jv_fail(rt, RC_EINVAL, "TypeError: str.%s() takes no arguments", name);
    return 0;
}

#define CASE_METHOD(fn, name, mode)                                          \
    static int fn(jrt *rt, jv s, const jcall *a, jv *o)                       \
    {                                                                         \
        int rc = no_args(rt, name, a);                                        \
        return rc < 0 ? rc : jinja__str_case(rt, s, mode, o);                 \
    }
CASE_METHOD(m_upper, "upper", JC_UPPER)
CASE_METHOD(m_lower, "lower", JC_LOWER)
CASE_METHOD(m_casefold, "casefold", JC_LOWER)
CASE_METHOD(m_title, "title", JC_TITLE)
CASE_METHOD(m_capitalize, "capitalize", JC_CAPITALIZE)
CASE_METHOD(m_swapcase, "swapcase", JC_SWAPCASE)

/* find/rfind/index/rindex/count */
static int search(jrt *rt, jv self, const jcall *a, jv *out, int kind)
{
    static const char *names[] = {"find", "rfind", "index", "rindex", "count"};
    BIND(names[kind], "!sub,start,end", 3);
    if (p[0].t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: must be str, not %s", jv_type_name(p[0]));
    sview w;
    size_t s0, s1;
    if ((rc = view_init(rt, self, &w)) < 0)
        return rc;
    if ((rc = adjust(rt, p[1], p[2], w.n, &s0, &s1)) < 0) {
        view_free(&w);
        return rc;
    }
    const jstr *sub = jv_s(p[0]);
    size_t b0 = vb(&w, s0 <= w.n ? s0 : w.n), b1 = vb(&w, s1 <= w.n ? s1 : w.n);
    int64_t res = -1;
    if (kind == 4) {
        if (s0 > w.n) {
            res = 0;
        } else if (sub->len == 0) {
            res = (int64_t)(s1 - s0) + 1;
        } else {
            res = 0;
            for (size_t i = b0; i + sub->len <= b1;) {
                const char *h = memmem(w.s + i, b1 - i, sub->s, sub->len);
                if (!h)
                    break;
                res++;
                i = (size_t)(h - w.s) + sub->len;
            }
        }
        *out = jv_int(res);
        view_free(&w);
        return 0;
    }
    if (s0 <= w.n && b1 >= b0) {
        const char *h = (kind == 0 || kind == 2) ? find_bytes(w.s + b0, b1 - b0, sub->s, sub->len)
                                                 : rfind_bytes(w.s + b0, b1 - b0, sub->s, sub->len);
        if (h && (size_t)(h - w.s) + sub->len <= b1)
            res = (int64_t)vc(&w, (size_t)(h - w.s));
    }
    view_free(&w);
    if (res < 0 && kind >= 2)
        return jv_fail(rt, RC_EINVAL, "ValueError: substring not found");
    *out = jv_int(res);
    return 0;
}
static int m_find(jrt *rt, jv s, const jcall *a, jv *o) { return search(rt, s, a, o, 0); }
static int m_rfind(jrt *rt, jv s, const jcall *a, jv *o) { return search(rt, s, a, o, 1); }
static int m_index(jrt *rt, jv s, const jcall *a, jv *o) { return search(rt, s, a, o, 2); }
static int m_rindex(jrt *rt, jv s, const jcall *a, jv *o) { return search(rt, s, a, o, 3); }
static int m_count(jrt *rt, jv s, const jcall *a, jv *o) { return search(rt, s, a, o, 4); }

static int m_join(jrt *rt, jv self, const jcall *a, jv *out)
{
    BIND("join", "!iterable", 1);
    jv items;
    if ((rc = jv_items(rt, p[0], &items)) < 0)
        return rc;
    jlist *l = jv_l(items);
    jbuf b = {0};
    bool markup = jv_is_markup(self);
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        jv x = l->items[i];
        if (x.t != JV_STR) {
            rc = jv_fail(rt, RC_EINVAL, "TypeError: sequence item %zu: expected str instance, %s found",
                         i, jv_type_name(x));
            break;
        }
        if (i)
            rc = jbuf_put(rt, &b, jv_s(self)->s, jv_s(self)->len);
        if (rc == 0 && markup && !jv_is_markup(x)) {
            jv e;
            if ((rc = jinja__escape(rt, x, &e)) == 0) {
                rc = jbuf_put(rt, &b, jv_s(e)->s, jv_s(e)->len);
                jv_decref(rt, e);
            }
        } else if (rc == 0) {
            rc = jbuf_put(rt, &b, jv_s(x)->s, jv_s(x)->len);
        }
    }
    jv_decref(rt, items);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, markup ? JS_MARKUP : 0, out);
}

static int m_format(jrt *rt, jv self, const jcall *a, jv *out) { return str_format(rt, self, a, out); }

static int predicate(jrt *rt, jv self, const jcall *a, jv *out, int kind)
{
    static const char *names[] = {"isdigit", "isalpha", "isalnum", "isspace", "isupper",
                                  "islower", "istitle"};
    int rc = no_args(rt, names[kind], a);
    if (rc < 0)
        return rc;
    const jstr *x = jv_s(self);
    bool ok = x->len > 0, cased = false, prev_cased = false;
    if ((rc = jv_tick_chars(rt, x->len)) < 0)
        return rc;
    for (size_t i = 0; i < x->len && ok;) {
        uint32_t c = ju_next(x->s, &i);
        switch (kind) {
        case 0: ok = ju_isdigit(c); break;
        case 1: ok = ju_isalpha(c); break;
        case 2: ok = ju_isalpha(c) || ju_isdigit(c); break;
        case 3: ok = ju_isspace(c); break;
        case 4: if (ju_islower(c)) ok = false; else if (ju_isupper(c)) cased = true; break;
        case 5: if (ju_isupper(c)) ok = false; else if (ju_islower(c)) cased = true; break;
        case 6:
            if (ju_isupper(c)) {
                if (prev_cased)
                    ok = false;
                prev_cased = cased = true;
            } else if (ju_islower(c)) {
                if (!prev_cased)
                    ok = false;
                prev_cased = cased = true;
            } else {
                prev_cased = false;
            }
            break;
        }
    }
    if (kind >= 4)
        ok = ok && cased;
    *out = jv_bool(ok);
    return 0;
}
static int m_isdigit(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 0); }
static int m_isalpha(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 1); }
static int m_isalnum(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 2); }
static int m_isspace(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 3); }
static int m_isupper(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 4); }
static int m_islower(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 5); }
static int m_istitle(jrt *rt, jv s, const jcall *a, jv *o) { return predicate(rt, s, a, o, 6); }

/* ljust/rjust/center/zfill */
static int justify(jrt *rt, jv self, const jcall *a, jv *out, int kind)
{
    static const char *names[] = {"ljust", "rjust", "center", "zfill"};
    BIND(names[kind], kind == 3 ? "!width" : "!width,fillchar", 2);
    int64_t width = 0;
    if ((rc = jinja__int_arg(rt, p[0], &width)) < 0)
        return rc;
    uint32_t fill = kind == 3 ? '0' : ' ';
    if (kind != 3 && !jv_missing(p[1])) {
        if (p[1].t != JV_STR || jv_s(p[1])->nchars != 1)
            return jv_fail(rt, RC_EINVAL, "TypeError: The fill character must be exactly one character long");
        size_t q = 0;
        fill = ju_next(jv_s(p[1])->s, &q);
    }
    const jstr *x = jv_s(self);
    int64_t n = (int64_t)x->nchars;
    if (width <= n) {
        jv_incref(self);
        *out = self;
        return 0;
    }
    if (width - n > (int64_t)rt->lim.max_output_bytes)
        return jv_fail(rt, RC_ELIMIT, "LimitError: padding too large");
    int64_t marg = width - n, left = 0;
    switch (kind) {
    case 0: left = 0; break;
    case 1: case 3: left = marg; break;
    case 2: left = marg / 2 + (marg & width & 1); break;
    }
    char enc[4];
    size_t el = ju_encode(fill, enc);
    jbuf b = {0};
    size_t body = 0;
    if (kind == 3 && x->len && (x->s[0] == '-' || x->s[0] == '+')) {
        rc = jbuf_putc(rt, &b, x->s[0]);
        body = 1;
    }
    for (int64_t i = 0; i < left && rc == 0; i++)
        rc = jbuf_put(rt, &b, enc, el);
    if (rc == 0)
        rc = jbuf_put(rt, &b, x->s + body, x->len - body);
    for (int64_t i = 0; i < marg - left && rc == 0; i++)
        rc = jbuf_put(rt, &b, enc, el);
    if (rc < 0) {
        jbuf_free(rt, &b);
        return rc;
    }
    return jv_str_from_buf(rt, &b, flags_of(self), out);
}
static int m_ljust(jrt *rt, jv s, const jcall *a, jv *o) { return justify(rt, s, a, o, 0); }
static int m_rjust(jrt *rt, jv s, const jcall *a, jv *o) { return justify(rt, s, a, o, 1); }
static int m_center(jrt *rt, jv s, const jcall *a, jv *o) { return justify(rt, s, a, o, 2); }
static int m_zfill(jrt *rt, jv s, const jcall *a, jv *o) { return justify(rt, s, a, o, 3); }

static int partition(jrt *rt, jv self, const jcall *a, jv *out, bool right)
{
    BIND(right ? "rpartition" : "partition", "!sep", 1);
    if (p[0].t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: must be str, not %s", jv_type_name(p[0]));
    const jstr *x = jv_s(self), *sep = jv_s(p[0]);
    if (sep->len == 0)
        return jv_fail(rt, RC_EINVAL, "ValueError: empty separator");
    const char *h = right ? rfind_bytes(x->s, x->len, sep->s, sep->len)
                          : find_bytes(x->s, x->len, sep->s, sep->len);
    if ((rc = jv_tuple_new(rt, 3, out)) < 0)
        return rc;
    jlist *l = jv_l(*out);
    size_t at = h ? (size_t)(h - x->s) : 0;
    const char *parts[3];
    size_t lens[3];
    if (!h && !right) {
        parts[0] = x->s; lens[0] = x->len;
        parts[1] = ""; lens[1] = 0;
        parts[2] = ""; lens[2] = 0;
    } else if (!h) {
        parts[0] = ""; lens[0] = 0;
        parts[1] = ""; lens[1] = 0;
        parts[2] = x->s; lens[2] = x->len;
    } else {
        parts[0] = x->s; lens[0] = at;
        parts[1] = sep->s; lens[1] = sep->len;
        parts[2] = x->s + at + sep->len; lens[2] = x->len - at - sep->len;
    }
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = mk(rt, parts[i], lens[i], self, &l->items[i]);
    if (rc < 0)
        jv_clear(rt, out);
    return rc;
}
static int m_partition(jrt *rt, jv s, const jcall *a, jv *o) { return partition(rt, s, a, o, false); }
static int m_rpartition(jrt *rt, jv s, const jcall *a, jv *o) { return partition(rt, s, a, o, true); }

static int remove_affix(jrt *rt, jv self, const jcall *a, jv *out, bool suffix)
{
    BIND(suffix ? "removesuffix" : "removeprefix", "!affix", 1);
    if (p[0].t != JV_STR)
        return jv_fail(rt, RC_EINVAL, "TypeError: %s() argument must be str, not %s",
                       suffix ? "removesuffix" : "removeprefix", jv_type_name(p[0]));
    const jstr *x = jv_s(self), *f = jv_s(p[0]);
    if (f->len && f->len <= x->len) {
        if (!suffix && memcmp(x->s, f->s, f->len) == 0)
            return mk(rt, x->s + f->len, x->len - f->len, self, out);
        if (suffix && memcmp(x->s + x->len - f->len, f->s, f->len) == 0)
            return mk(rt, x->s, x->len - f->len, self, out);
    }
    jv_incref(self);
    *out = self;
    return 0;
}
static int m_removeprefix(jrt *rt, jv s, const jcall *a, jv *o) { return remove_affix(rt, s, a, o, false); }
static int m_removesuffix(jrt *rt, jv s, const jcall *a, jv *o) { return remove_affix(rt, s, a, o, true); }

static const struct { const char *name; str_fn fn; } STR_METHODS[] = {
    {"strip", m_strip3}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip},
    {"split", m_split}, {"rsplit", m_rsplit}, {"splitlines", m_splitlines},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"replace", m_replace},
    {"upper", m_upper}, {"lower", m_lower}, {"casefold", m_casefold}, {"title", m_title},
    {"capitalize", m_capitalize}, {"swapcase", m_swapcase},
    {"find", m_find}, {"rfind", m_rfind}, {"index", m_index}, {"rindex", m_rindex},
    {"count", m_count}, {"join", m_join}, {"format", m_format},
    {"isdigit", m_isdigit}, {"isdecimal", m_isdigit}, {"isnumeric", m_isdigit},
    {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace},
    {"isupper", m_isupper}, {"islower", m_islower}, {"istitle", m_istitle},
    {"ljust", m_ljust}, {"rjust", m_rjust}, {"center", m_center}, {"zfill", m_zfill},
    {"partition", m_partition}, {"rpartition", m_rpartition},
    {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
};

int jinja__str_method_id(const char *name)
{
    for (size_t i = 0; i < sizeof STR_METHODS / sizeof STR_METHODS[0]; i++)
        if (strcmp(STR_METHODS[i].name, name) == 0)
            return (int)i;
    return -1;
}

const char *jinja__str_method_name(int id) { return STR_METHODS[id].name; }

int jinja__str_call(jrt *rt, int id, jv self, const jcall *a, jv *out)
{
    return STR_METHODS[id].fn(rt, self, a, out);
}
