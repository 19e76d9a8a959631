/* json_regex.c - the pattern subset of json_regex.h, by recursive descent.
 *
 * The regex grammar (alternation of sequences of quantified atoms) maps one to
 * one onto GBNF, each construct written as it is read.  The only real work is
 * in character sets: a set is a sorted list of code point ranges, and a set is
 * written as the class of the characters JSON leaves unescaped plus one
 * alternative per character JSON must escape (so [^a] also produces \" and \n,
 * as their decoded values match).
 */
#include "json_regex.h"
#include "json_schema.h"
#include "base/err.h"
#include "text/utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANGES 128

typedef struct { uint32_t lo, hi; } crange;
typedef struct { crange r[MAX_RANGES]; int n; } cset;

typedef struct {
    const char *s;       /* the pattern */
    size_t i, n;         /* position, end (before a final $) */
    gtext *out;
    int depth;
} rx;

static int rx_fail(const rx *x, const char *what)
{
    return rc_fail(RC_EINVAL, "pattern \"%.80s\": %s (at offset %zu)", x->s, what, x->i);
}

/* The code point at x->i (advancing past it); RC_EINVAL for bad UTF-8. */
static int next_cp(rx *x, uint32_t *cp)
{
    size_t len;
    if (utf8_check((const uint8_t *)x->s + x->i, x->n - x->i, &len) != UTF8_VALID)
        return rx_fail(x, "not valid UTF-8");
    *cp = utf8_decode_valid((const uint8_t *)x->s + x->i, len);
    x->i += len;
    return 0;
}

static int set_add(rx *x, cset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == MAX_RANGES)
        return rx_fail(x, "a character class with too many ranges");
    s->r[s->n++] = (crange){ lo, hi };
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const crange *p = a, *q = b;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* Sorts and merges overlapping or touching ranges. */
static void set_norm(cset *s)
{
    qsort(s->r, (size_t)s->n, sizeof s->r[0], cmp_range);
    int w = 0;
    for (int i = 0; i < s->n; i++) {
        if (w && s->r[i].lo <= s->r[w - 1].hi + 1) {
            if (s->r[i].hi > s->r[w - 1].hi)
                s->r[w - 1].hi = s->r[i].hi;
        } else {
            s->r[w++] = s->r[i];
        }
    }
    s->n = w;
}

/* The complement over all code points. */
static int set_negate(rx *x, cset *s)
{
    set_norm(s);
    cset c = { .n = 0 };
    uint32_t from = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > from && set_add(x, &c, from, s->r[i].lo - 1))
            return -1;
        from = s->r[i].hi + 1;
    }
    if (from <= 0x10FFFF && set_add(x, &c, from, 0x10FFFF))
        return -1;
    *s = c;
    return 0;
}

static bool set_has(const cset *s, uint32_t cp)
{
    for (int i = 0; i < s->n; i++)
        if (cp >= s->r[i].lo && cp <= s->r[i].hi)
            return true;
    return false;
}

/* Characters a JSON string holds only escaped, and how. */
static const struct { uint32_t cp; const char *esc; } ESCAPED[] = {
    { '"', "\\\"" }, { '\\', "\\\\" }, { '\n', "\\n" }, { '\r', "\\r" }, { '\t', "\\t" },
    { '\b', "\\b" }, { '\f', "\\f" },
};

/* Writes a set as one unit: a class of what JSON writes plainly (no control
 * characters, quote, backslash or surrogates), or an alternation of that
 * class and the escaped forms of the members JSON escapes.  Other control
 * characters are left out: the output stays a subset of what matches. */
static int emit_set(rx *x, cset *s)
{
    static const crange plain[] = { { 0x20, 0x21 }, { 0x23, 0x5B }, { 0x5D, 0xD7FF },
                                    { 0xE000, 0x10FFFF } };
    set_norm(s);
    gtext cls = { 0 };
    for (int i = 0; i < s->n; i++)
        for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
            uint32_t lo = s->r[i].lo > plain[k].lo ? s->r[i].lo : plain[k].lo;
            uint32_t hi = s->r[i].hi < plain[k].hi ? s->r[i].hi : plain[k].hi;
            if (lo > hi)
                continue;
            gt_class_char(&cls, lo);
            if (hi > lo) {
                gt_put(&cls, "-", 1);
                gt_class_char(&cls, hi);
            }
        }
    int n_alt = cls.len ? 1 : 0;
    for (size_t k = 0; k < sizeof ESCAPED / sizeof ESCAPED[0]; k++)
        n_alt += set_has(s, ESCAPED[k].cp);
    if (n_alt == 0) {
        gt_free(&cls);
        return rx_fail(x, "a character set that no JSON string character matches");
    }
    if (n_alt > 1)
        gt_put(x->out, "(", 1);
    const char *sep = "";
    if (cls.len) {
        gt_printf(x->out, "[%s]", cls.p);
        sep = " | ";
    }
    gt_free(&cls);
    for (size_t k = 0; k < sizeof ESCAPED / sizeof ESCAPED[0]; k++)
        if (set_has(s, ESCAPED[k].cp)) {
            gt_puts(x->out, sep);
            gt_literal(x->out, ESCAPED[k].esc, strlen(ESCAPED[k].esc));
            sep = " | ";
        }
    if (n_alt > 1)
        gt_put(x->out, ")", 1);
    return 0;
}

static int emit_char(rx *x, uint32_t cp)
{
    cset s = { .r = { { cp, cp } }, .n = 1 };
    if (cp < 0x20 || cp == '"' || cp == '\\')
        return emit_set(x, &s);
    char u[4];
    gt_literal(x->out, u, utf8_encode(cp, u));
    return 0;
}

static int add_shorthand(rx *x, cset *s, char c)
{
    switch (c) {
    case 'd':
        return set_add(x, s, '0', '9');
    case 'w':
        return set_add(x, s, '0', '9') || set_add(x, s, 'A', 'Z') || set_add(x, s, '_', '_') ||
               set_add(x, s, 'a', 'z');
    case 's':
        return set_add(x, s, '\t', '\r') || set_add(x, s, ' ', ' ');
    default:
        return rx_fail(x, "unknown class shorthand");
    }
}

static int hex_digits(rx *x, int n, uint32_t *cp)
{
    *cp = 0;
    for (int k = 0; k < n; k++, x->i++) {
        char c = x->i < x->n ? x->s[x->i] : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return rx_fail(x, "a \\x or \\u escape without its hex digits");
        *cp = *cp * 16 + (uint32_t)d;
    }
    return 0;
}

/* After a backslash: one character (*cp), or a shorthand class (*cls set to
 * its letter, upper case for the negated ones). */
static int read_escape(rx *x, uint32_t *cp, char *cls)
{
    *cls = 0;
    if (x->i >= x->n)
        return rx_fail(x, "a pattern ending in a lone backslash");
    char c = x->s[x->i++];
    switch (c) {
    case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
        *cls = c;
        return 0;
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hex_digits(x, 2, cp);
    case 'u': return hex_digits(x, 4, cp);
    case 'b': case 'B':
        x->i--;
        return rx_fail(x, "word boundaries (\\b, \\B) are not supported");
    default:
        break;
    }
    if (c >= '1' && c <= '9') {
        x->i--;
        return rx_fail(x, "backreferences are not supported");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        x->i--;
        return rx_fail(x, "an unknown escape");
    }
    x->i--;
    return next_cp(x, cp);
}

/* [...] after the '['. */
static int read_class(rx *x, cset *s)
{
    bool neg = x->i < x->n && x->s[x->i] == '^';
    if (neg)
        x->i++;
    for (bool first = true;; first = false) {
        if (x->i >= x->n)
            return rx_fail(x, "an unterminated character class");
        if (x->s[x->i] == ']' && !first) {
            x->i++;
            break;
        }
        uint32_t lo, hi;
        char sh = 0;
        if (x->s[x->i] == '\\') {
            x->i++;
            if (read_escape(x, &lo, &sh))
                return -1;
        } else if (next_cp(x, &lo)) {
            return -1;
        }
        if (sh) {
            if (sh < 'a')
                return rx_fail(x, "\\D, \\W or \\S inside a class is not supported");
            if (add_shorthand(x, s, sh))
                return -1;
            continue;
        }
        hi = lo;
        if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
            x->i++;
            if (x->s[x->i] == '\\') {
                x->i++;
                if (read_escape(x, &hi, &sh))
                    return -1;
                if (sh)
                    return rx_fail(x, "a range ending in a class shorthand");
            } else if (next_cp(x, &hi)) {
                return -1;
            }
            if (hi < lo)
                return rx_fail(x, "a range whose end is before its start");
        }
        if (set_add(x, s, lo, hi))
            return -1;
    }
    return neg ? set_negate(x, s) : 0;
}

static int read_count(rx *x, long *v)
{
    if (x->i >= x->n || x->s[x->i] < '0' || x->s[x->i] > '9')
        return rx_fail(x, "a {m,n} bound without a number");
    *v = 0;
    while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') {
        *v = *v * 10 + (x->s[x->i++] - '0');
        if (*v > JSON_GBNF_MAX_REPEAT)
            return rx_fail(x, "a repetition bound above 1000");
    }
    return 0;
}

/* A quantifier after an atom, written after it. */
static int read_quant(rx *x)
{
    if (x->i >= x->n)
        return 0;
    char c = x->s[x->i];
    if (c == '?' || c == '*' || c == '+') {
        x->i++;
        gt_put(x->out, &c, 1);
    } else if (c == '{') {
        long m, n;
        x->i++;
        if (read_count(x, &m))
            return -1;
        n = m;
        if (x->i < x->n && x->s[x->i] == ',') {
            x->i++;
            n = -1;
            if (x->i < x->n && x->s[x->i] != '}' && read_count(x, &n))
                return -1;
        }
        if (x->i >= x->n || x->s[x->i] != '}')
            return rx_fail(x, "an unterminated {m,n} bound");
        x->i++;
        if (n >= 0 && n < m)
            return rx_fail(x, "a {m,n} bound with n < m");
        if (n == m)
            gt_printf(x->out, "{%ld}", m);
        else if (n < 0)
            gt_printf(x->out, "{%ld,}", m);
        else
            gt_printf(x->out, "{%ld,%ld}", m, n);
    } else {
        return 0;
    }
    if (x->i < x->n && x->s[x->i] == '?')
        x->i++;                 /* lazy: the same strings match */
    if (x->i < x->n && (x->s[x->i] == '+' || x->s[x->i] == '*' || x->s[x->i] == '?' ||
                        x->s[x->i] == '{'))
        return rx_fail(x, "a quantifier after a quantifier (possessive or nested)");
    return 0;
}

static int read_alt(rx *x);

static int read_atom(rx *x)
{
    char c = x->s[x->i];
    uint32_t cp;
    cset s = { .n = 0 };
    switch (c) {
    case '(':
        x->i++;
        if (x->i < x->n && x->s[x->i] == '?') {
            if (x->i + 1 < x->n && x->s[x->i + 1] == ':')
                x->i += 2;
            else
                return rx_fail(x, "lookaround and named groups are not supported");
        }
        if (++x->depth > JSON_GBNF_MAX_DEPTH)
            return rx_fail(x, "groups nested too deeply");
        if (read_alt(x))
            return -1;
        x->depth--;
        if (x->i >= x->n || x->s[x->i] != ')')
            return rx_fail(x, "an unclosed group");
        x->i++;
        return 0;
    case '[':
        x->i++;
        return read_class(x, &s) || emit_set(x, &s);
    case '.':
        x->i++;
        return set_add(x, &s, '\n', '\n') || set_negate(x, &s) || emit_set(x, &s);
    case '\\': {
        char sh;
        x->i++;
        if (read_escape(x, &cp, &sh))
            return -1;
        if (!sh)
            return emit_char(x, cp);
        if (add_shorthand(x, &s, (char)(sh | 0x20)) || (sh < 'a' && set_negate(x, &s)))
            return -1;
        return emit_set(x, &s);
    }
    case '^': case '$':
        return rx_fail(x, "anchors (^, $) are supported only at the start and the end");
    case '*': case '+': case '?': case '{':
        return rx_fail(x, "a quantifier with nothing before it");
    default:
        return next_cp(x, &cp) || emit_char(x, cp);
    }
}

/* Alternatives up to ')' or the end, as one parenthesised group. */
static int read_alt(rx *x)
{
    gt_put(x->out, "(", 1);
    for (;;) {
        bool empty = true;
        while (x->i < x->n && x->s[x->i] != '|' && x->s[x->i] != ')') {
            if (!empty)
                gt_put(x->out, " ", 1);
            if (read_atom(x) || read_quant(x))
                return -1;
            empty = false;
        }
        if (empty)
            gt_puts(x->out, "\"\"");
        if (x->i >= x->n || x->s[x->i] != '|')
            break;
        x->i++;
        gt_puts(x->out, " | ");
    }
    gt_put(x->out, ")", 1);
    return 0;
}

int json_regex_gbnf(const char *pattern, const char *any_char, gtext *out)
{
    rx x = { .s = pattern, .i = 0, .n = strlen(pattern), .out = out };
    bool start = x.n && pattern[0] == '^';
    if (start)
        x.i = 1;
    /* a final $ anchors unless it is escaped (an odd run of backslashes) */
    bool end = false;
    if (x.n > x.i && pattern[x.n - 1] == '$') {
        size_t k = x.n - 1, bs = 0;
        while (k > x.i && pattern[k - 1] == '\\') {
            k--;
            bs++;
        }
        end = bs % 2 == 0;
    }
    if (end)
        x.n--;
    gt_put(out, "(", 1);
    if (!start)
        gt_printf(out, "%s* ", any_char);
    if (read_alt(&x))
        return RC_EINVAL;         /* rx_fail said what */
    if (x.i < x.n)
        return rx_fail(&x, "an unmatched ')'");
    if (!end)
        gt_printf(out, " %s*", any_char);
    gt_put(out, ")", 1);
    return gt_status(out);
}
