/* gbnf.c - GBNF text -> compiled grammar (grammar_internal.h).
 *
 * A recursive-descent parser of llama.cpp's GBNF syntax.  While parsing, each
 * rule's body is a list of elements with GE_ALT separators; groups become
 * synthesized rules ("parent_N"), and repetitions are expanded as llama.cpp
 * does: x{m,n} is m copies of x followed by a chain of n-m nested optional
 * rules (o_k ::= x o_{k-1} |), x{m,} by m copies and h ::= x h | (right
 * recursion, so a matcher's stack stays flat).  Afterwards the bodies are
 * flattened into one element array, and left recursion (a rule that can
 * reach itself before any character, through rules that may match nothing)
 * is refused, because a top-down matcher would loop on it.
 *
 * Every size is bounded by the GRAMMAR_MAX_* limits of grammar.h, checked
 * before memory is taken, so hostile text fails with a message naming the
 * limit, line and column.
 */
#include "grammar/grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "text/utf8.h"

enum { GE_ALT = 4 };   /* separates alternatives in a body under construction */

typedef struct {
    grammar__el *v;
    size_t n, cap;
} elbuf;

typedef struct {
    char  *name;
    size_t src_off;     /* definition, first use, or the group / repetition that made it */
    bool   defined, synth, used;
    uint32_t n_alts;
    uint32_t n_synth;   /* synthesized children, for their names */
    elbuf  body;
} prule;

typedef struct {
    const char *s;
    size_t len, pos;
    prule *rules;
    size_t n_rules, cap_rules;
    uint32_t *hash;     /* open addressing over user rule names: rule id + 1, 0 empty */
    size_t hash_cap;
    grammar__range *ranges;
    size_t n_ranges, cap_ranges;
    grammar__class *classes;
    size_t n_classes, cap_classes;
    size_t total_els;   /* elements in all bodies, the compiled size */
    int depth;
    uint32_t any_class; /* the class of `.`, made once; UINT32_MAX until then */
} parser;

/* ---- errors ------------------------------------------------------------ */

static int p_fail(const parser *p, size_t off, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int p_fail(const parser *p, size_t off, const char *fmt, ...)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off && i < p->len; i++) {
        if (p->s[i] == '\n') { line++; col = 1; } else col++;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rc_fail(RC_EINVAL, "grammar line %zu column %zu: %s", line, col, msg);
}

/* A character for messages: printable ASCII as is, else "end of text" or hex. */
static const char *p_show(const parser *p, size_t off, char buf[16])
{
    if (off >= p->len)
        return "end of text";
    unsigned char c = (unsigned char)p->s[off];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, 16, "'%c'", c);
    else snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

/* ---- rules and bodies ---------------------------------------------------- */

static int p_push(parser *p, uint32_t rid, uint32_t type, uint32_t arg)
{
    if (p->total_els >= GRAMMAR_MAX_ELEMENTS)
        return p_fail(p, p->pos, "grammar too large: more than GRAMMAR_MAX_ELEMENTS (%u) "
                      "elements after expanding repetitions", GRAMMAR_MAX_ELEMENTS);
    elbuf *b = &p->rules[rid].body;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        grammar__el *v = rc_realloc(b->v, cap * sizeof *v);
        if (!v) return rc_fail(RC_ENOMEM, "grammar: out of memory");
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = (grammar__el){ type, arg };
    p->total_els++;
    return 0;
}

static int p_new_rule(parser *p, const char *name, size_t name_len, size_t off, bool synth,
                      uint32_t *out)
{
    if (p->n_rules >= GRAMMAR_MAX_RULES)
        return p_fail(p, off, "too many rules: more than GRAMMAR_MAX_RULES (%u), counting "
                      "those made for groups and repetitions", GRAMMAR_MAX_RULES);
    if (p->n_rules == p->cap_rules) {
        size_t cap = p->cap_rules ? p->cap_rules * 2 : 32;
        prule *r = rc_realloc(p->rules, cap * sizeof *r);
        if (!r) return rc_fail(RC_ENOMEM, "grammar: out of memory");
        p->rules = r;
        p->cap_rules = cap;
    }
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = rc_strndup(name, name_len);
    if (!r->name) return rc_fail(RC_ENOMEM, "grammar: out of memory");
    r->src_off = off;
    r->synth = synth;
    r->n_alts = 1;
    *out = (uint32_t)p->n_rules++;
    return 0;
}

/* A rule for a group or repetition inside rule `parent`, named parent_N. */
static int p_synth_rule(parser *p, uint32_t parent, size_t off, uint32_t *out)
{
    char name[160];
    snprintf(name, sizeof name, "%.120s_%u", p->rules[parent].name, ++p->rules[parent].n_synth);
    return p_new_rule(p, name, strlen(name), off, true, out);
}

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The id of user rule `name`, created (undefined) on first sight. */
static int p_lookup(parser *p, const char *name, size_t n, size_t off, uint32_t *out)
{
    if (p->hash_cap == 0 || (p->n_rules + 1) * 2 > p->hash_cap) {
        size_t cap = p->hash_cap ? p->hash_cap * 2 : 64;
        uint32_t *h = rc_calloc(cap, sizeof *h);
        if (!h) return rc_fail(RC_ENOMEM, "grammar: out of memory");
        for (size_t i = 0; i < p->hash_cap; i++) {
            if (!p->hash[i]) continue;
            const char *nm = p->rules[p->hash[i] - 1].name;
            size_t j = name_hash(nm, strlen(nm)) & (cap - 1);
            while (h[j]) j = (j + 1) & (cap - 1);
            h[j] = p->hash[i];
        }
        rc_free(p->hash);
        p->hash = h;
        p->hash_cap = cap;
    }
    size_t j = name_hash(name, n) & (p->hash_cap - 1);
    while (p->hash[j]) {
        const char *nm = p->rules[p->hash[j] - 1].name;
        if (strlen(nm) == n && !memcmp(nm, name, n)) {
            *out = p->hash[j] - 1;
            return 0;
        }
        j = (j + 1) & (p->hash_cap - 1);
    }
    int rc = p_new_rule(p, name, n, off, false, out);
    if (rc) return rc;
    p->hash[j] = *out + 1;
    return 0;
}

/* ---- lexing -------------------------------------------------------------- */

static bool is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static int peek(const parser *p)
{
    return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

/* Spaces, tabs and comments; newlines too when newline_ok (inside groups,
 * after '|', between rules). */
static void skip_space(parser *p, bool newline_ok)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r') p->pos++;
        } else if ((c == '\n' || c == '\r') && newline_ok) {
            p->pos++;
        } else {
            break;
        }
    }
}

static int hex_val(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a string or class: an escape or a UTF-8 sequence. */
static int parse_char(parser *p, uint32_t *cp)
{
    size_t at = p->pos;
    if (at >= p->len) return p_fail(p, at, "unexpected end of text");
    unsigned char c = (unsigned char)p->s[at];
    if (c == '\\') {
        if (at + 1 >= p->len) return p_fail(p, at, "unterminated escape");
        char e = p->s[at + 1];
        int digits = 0;
        switch (e) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/':
            *cp = (uint32_t)e;
            break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: {
            char buf[16];
            return p_fail(p, at, "unknown escape: backslash then %s", p_show(p, at + 1, buf));
        }
        }
        p->pos = at + 2;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = p->pos < p->len ? hex_val((unsigned char)p->s[p->pos]) : -1;
                if (h < 0)
                    return p_fail(p, p->pos, "escape \\%c needs %d hex digits", e, digits);
                v = v * 16 + (uint32_t)h;
                p->pos++;
            }
            if (v > 0x10FFFF)
                return p_fail(p, at, "escape beyond U+10FFFF");
            *cp = v;
        }
        return 0;
    }
    size_t n;
    if (utf8_check((const uint8_t *)p->s + at, p->len - at, &n) != UTF8_VALID)
        return p_fail(p, at, "invalid UTF-8 in the grammar text");
    *cp = utf8_decode_valid((const uint8_t *)p->s + at, n);
    p->pos = at + n;
    return 0;
}

/* ---- classes --------------------------------------------------------------- */

static int range_cmp(const void *a, const void *b)
{
    const grammar__range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges tmp[0..n), complements it when neg, and appends it as a class. */
static int add_class(parser *p, grammar__range *tmp, size_t n, bool neg, uint32_t *out)
{
    if (n > 1) qsort(tmp, n, sizeof *tmp, range_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && tmp[i].lo <= tmp[m - 1].hi + 1) {
            if (tmp[i].hi > tmp[m - 1].hi) tmp[m - 1].hi = tmp[i].hi;
        } else {
            tmp[m++] = tmp[i];
        }
    }
    size_t need = neg ? m + 1 : m;
    if (p->n_ranges + need > p->cap_ranges) {
        size_t cap = p->cap_ranges ? p->cap_ranges : 64;
        while (cap < p->n_ranges + need) cap *= 2;
        grammar__range *r = rc_realloc(p->ranges, cap * sizeof *r);
        if (!r) return rc_fail(RC_ENOMEM, "grammar: out of memory");
        p->ranges = r;
        p->cap_ranges = cap;
    }
    if (p->n_classes == p->cap_classes) {
        size_t cap = p->cap_classes ? p->cap_classes * 2 : 16;
        grammar__class *k = rc_realloc(p->classes, cap * sizeof *k);
        if (!k) return rc_fail(RC_ENOMEM, "grammar: out of memory");
        p->classes = k;
        p->cap_classes = cap;
    }
    grammar__class *k = &p->classes[p->n_classes];
    k->off = (uint32_t)p->n_ranges;
    if (!neg) {
        if (m) memcpy(p->ranges + p->n_ranges, tmp, m * sizeof *tmp);
        p->n_ranges += m;
    } else {
        uint32_t next = 0;
        for (size_t i = 0; i < m; i++) {
            if (tmp[i].lo > next)
                p->ranges[p->n_ranges++] = (grammar__range){ next, tmp[i].lo - 1 };
            next = tmp[i].hi + 1;
        }
        if (next <= 0x10FFFF)
            p->ranges[p->n_ranges++] = (grammar__range){ next, 0x10FFFF };
    }
    k->n = (uint32_t)(p->n_ranges - k->off);
    k->ascii[0] = k->ascii[1] = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        const grammar__range *r = &p->ranges[k->off + i];
        for (uint32_t c = r->lo; c <= r->hi && c < 128; c++) k->ascii[c >> 6] |= 1ull << (c & 63);
    }
    *out = (uint32_t)p->n_classes++;
    return 0;
}

static int parse_class(parser *p, uint32_t *out)
{
    size_t start = p->pos++;            /* '[' */
    bool neg = peek(p) == '^';
    if (neg) p->pos++;
    grammar__range *tmp = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    while (peek(p) != ']') {
        if (p->pos >= p->len) { rc = p_fail(p, start, "unterminated character class"); goto done; }
        uint32_t lo, hi;
        if ((rc = parse_char(p, &lo))) goto done;
        hi = lo;
        if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
            size_t at = p->pos++;
            if ((rc = parse_char(p, &hi))) goto done;
            if (hi < lo) { rc = p_fail(p, at, "range end before its start"); goto done; }
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            grammar__range *t = rc_realloc(tmp, cap * sizeof *t);
            if (!t) { rc = rc_fail(RC_ENOMEM, "grammar: out of memory"); goto done; }
            tmp = t;
        }
        tmp[n++] = (grammar__range){ lo, hi };
    }
    p->pos++;                            /* ']' */
    rc = add_class(p, tmp, n, neg, out);
done:
    rc_free(tmp);
    return rc;
}

/* ---- sequences, repetitions, alternates ---------------------------------- */

static int parse_alternates(parser *p, uint32_t rid, bool nested);

static int parse_uint(parser *p, uint32_t *v)
{
    size_t at = p->pos;
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(peek(p) - '0');
        if (x > GRAMMAR_MAX_REPEAT)
            return p_fail(p, at, "repetition count above GRAMMAR_MAX_REPEAT (%u)",
                          GRAMMAR_MAX_REPEAT);
        p->pos++;
    }
    if (p->pos == at) {
        char buf[16];
        return p_fail(p, at, "expected a number in { }, found %s", p_show(p, at, buf));
    }
    *v = (uint32_t)x;
    return 0;
}

/* Replaces the item at body[start..) of rule rid by its repetition {m,n}
 * (n = UINT32_MAX: no maximum). */
static int repeat_item(parser *p, uint32_t rid, size_t start, uint32_t m, uint32_t n, size_t off)
{
    elbuf *b = &p->rules[rid].body;
    size_t len = b->n - start;
    uint64_t cost = (uint64_t)len * (m + (n == UINT32_MAX ? 1 : n - m) + 1);
    if (p->total_els + cost > GRAMMAR_MAX_ELEMENTS)
        return p_fail(p, off, "grammar too large: repetition expands beyond "
                      "GRAMMAR_MAX_ELEMENTS (%u) elements", GRAMMAR_MAX_ELEMENTS);
    grammar__el *x = rc_mallocarray(len ? len : 1, sizeof *x);
    if (!x) return rc_fail(RC_ENOMEM, "grammar: out of memory");
    if (len) memcpy(x, b->v + start, len * sizeof *x);
    b->n = start;
    p->total_els -= len;
    int rc = 0;
    for (uint32_t i = 0; i < m && !rc; i++)
        for (size_t j = 0; j < len && !rc; j++) rc = p_push(p, rid, x[j].type, x[j].arg);
    if (!rc && n == UINT32_MAX) {
        uint32_t h;
        if (!(rc = p_synth_rule(p, rid, off, &h))) {
            for (size_t j = 0; j < len && !rc; j++) rc = p_push(p, h, x[j].type, x[j].arg);
            if (!rc) rc = p_push(p, h, GE_REF, h);
            if (!rc) rc = p_push(p, h, GE_ALT, 0);
            p->rules[h].n_alts = 2;
            p->rules[h].defined = true;
            if (!rc) rc = p_push(p, rid, GE_REF, h);
        }
    } else if (!rc && n > m) {
        uint32_t prev = UINT32_MAX;
        for (uint32_t k = 0; k < n - m && !rc; k++) {
            uint32_t o;
            if ((rc = p_synth_rule(p, rid, off, &o))) break;
            for (size_t j = 0; j < len && !rc; j++) rc = p_push(p, o, x[j].type, x[j].arg);
            if (!rc && prev != UINT32_MAX) rc = p_push(p, o, GE_REF, prev);
            if (!rc) rc = p_push(p, o, GE_ALT, 0);
            p->rules[o].n_alts = 2;
            p->rules[o].defined = true;
            prev = o;
        }
        if (!rc) rc = p_push(p, rid, GE_REF, prev);
    }
    rc_free(x);
    return rc;
}

static int parse_repetition(parser *p, uint32_t rid, size_t item_start, bool have_item)
{
    size_t at = p->pos;
    char op = p->s[p->pos++];
    if (!have_item)
        return p_fail(p, at, "'%c' has nothing before it to repeat", op);
    uint32_t m = 0, n = UINT32_MAX;
    if (op == '+') m = 1;
    else if (op == '?') n = 1;
    else if (op == '{') {
        int rc;
        skip_space(p, false);
        if ((rc = parse_uint(p, &m))) return rc;
        skip_space(p, false);
        if (peek(p) == ',') {
            p->pos++;
            skip_space(p, false);
            if (peek(p) != '}') {
                if ((rc = parse_uint(p, &n))) return rc;
                skip_space(p, false);
            }
        } else {
            n = m;
        }
        if (peek(p) != '}') {
            char buf[16];
            return p_fail(p, p->pos, "expected '}' to close the repetition, found %s",
                          p_show(p, p->pos, buf));
        }
        p->pos++;
        if (n < m)
            return p_fail(p, at, "repetition {%u,%u}: maximum below minimum", m, n);
    }
    return repeat_item(p, rid, item_start, m, n, at);
}

static int parse_sequence(parser *p, uint32_t rid, bool nested)
{
    size_t item_start = 0;
    bool have_item = false;
    int rc = 0;
    for (;;) {
        int c = peek(p);
        size_t at = p->pos;
        if (c == '"') {
            p->pos++;
            item_start = p->rules[rid].body.n;
            while (peek(p) != '"') {
                if (p->pos >= p->len) return p_fail(p, at, "unterminated string");
                uint32_t cp;
                if ((rc = parse_char(p, &cp))) return rc;
                if ((rc = p_push(p, rid, GE_CHAR, cp))) return rc;
            }
            p->pos++;
            have_item = true;
        } else if (c == '[') {
            uint32_t k;
            item_start = p->rules[rid].body.n;
            if ((rc = parse_class(p, &k))) return rc;
            if ((rc = p_push(p, rid, GE_CLASS, k))) return rc;
            have_item = true;
        } else if (c == '.') {
            p->pos++;
            if (p->any_class == UINT32_MAX) {
                grammar__range all = { 0, 0x10FFFF };
                if ((rc = add_class(p, &all, 1, false, &p->any_class))) return rc;
            }
            item_start = p->rules[rid].body.n;
            if ((rc = p_push(p, rid, GE_CLASS, p->any_class))) return rc;
            have_item = true;
        } else if (c >= 0 && is_name_char(c)) {
            while (is_name_char(peek(p))) p->pos++;
            uint32_t ref;
            if ((rc = p_lookup(p, p->s + at, p->pos - at, at, &ref))) return rc;
            p->rules[ref].used = true;
            item_start = p->rules[rid].body.n;
            if ((rc = p_push(p, rid, GE_REF, ref))) return rc;
            have_item = true;
        } else if (c == '(') {
            if (p->depth >= GRAMMAR_MAX_NESTING)
                return p_fail(p, at, "groups nested deeper than GRAMMAR_MAX_NESTING (%d)",
                              GRAMMAR_MAX_NESTING);
            p->pos++;
            uint32_t g;
            if ((rc = p_synth_rule(p, rid, at, &g))) return rc;
            p->rules[g].defined = true;
            skip_space(p, true);
            p->depth++;
            rc = parse_alternates(p, g, true);
            p->depth--;
            if (rc) return rc;
            if (peek(p) != ')') {
                char buf[16];
                return p_fail(p, p->pos, "expected ')' to close the group, found %s",
                              p_show(p, p->pos, buf));
            }
            p->pos++;
            item_start = p->rules[rid].body.n;
            if ((rc = p_push(p, rid, GE_REF, g))) return rc;
            have_item = true;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if ((rc = parse_repetition(p, rid, item_start, have_item))) return rc;
        } else {
            return 0;
        }
        skip_space(p, nested);
    }
}

static int parse_alternates(parser *p, uint32_t rid, bool nested)
{
    int rc = parse_sequence(p, rid, nested);
    while (!rc && peek(p) == '|') {
        if (p->rules[rid].n_alts >= GRAMMAR_MAX_ALTS)
            return p_fail(p, p->pos, "rule '%s' has more than GRAMMAR_MAX_ALTS (%u) "
                          "alternatives", p->rules[rid].name, GRAMMAR_MAX_ALTS);
        p->pos++;
        if ((rc = p_push(p, rid, GE_ALT, 0))) return rc;
        p->rules[rid].n_alts++;
        skip_space(p, true);
        rc = parse_sequence(p, rid, nested);
    }
    return rc;
}

static int parse_rule(parser *p)
{
    size_t at = p->pos;
    char buf[16];
    while (is_name_char(peek(p))) p->pos++;
    if (p->pos == at)
        return p_fail(p, at, "expected a rule name, found %s", p_show(p, at, buf));
    uint32_t rid;
    int rc = p_lookup(p, p->s + at, p->pos - at, at, &rid);
    if (rc) return rc;
    if (p->rules[rid].defined)
        return p_fail(p, at, "rule '%s' defined twice", p->rules[rid].name);
    p->rules[rid].defined = true;
    p->rules[rid].src_off = at;
    skip_space(p, false);
    if (p->len - p->pos < 3 || memcmp(p->s + p->pos, "::=", 3))
        return p_fail(p, p->pos, "expected '::=' after rule name '%s', found %s",
                      p->rules[rid].name, p_show(p, p->pos, buf));
    p->pos += 3;
    skip_space(p, true);
    if ((rc = parse_alternates(p, rid, false))) return rc;
    if (peek(p) == '\r') p->pos++;
    if (peek(p) == '\n') p->pos++;
    else if (p->pos < p->len)
        return p_fail(p, p->pos, "expected the end of the line after rule '%s', found %s",
                      p->rules[rid].name, p_show(p, p->pos, buf));
    skip_space(p, true);
    return 0;
}

/* ---- flattening and checks ------------------------------------------------- */

/* Left recursion: an edge a -> b when rule a has an alternative that
 * references b after elements that can all match nothing. */
static int check_left_recursion(const parser *p, grammar *g)
{
    size_t nr = g->n_rules;
    bool *nullable = rc_calloc(nr ? nr : 1, sizeof *nullable);
    uint8_t *color = rc_calloc(nr ? nr : 1, 1);
    uint32_t *stack = rc_mallocarray(nr ? nr : 1, sizeof *stack);
    uint32_t *iter = rc_mallocarray(nr ? nr : 1, 2 * sizeof *iter);
    int rc = 0;
    if (!nullable || !color || !stack || !iter) {
        rc = rc_fail(RC_ENOMEM, "grammar: out of memory");
        goto done;
    }
    /* nullable, in linear time: an alternative made only of references waits
     * for a count of them to become nullable; occurrences (CSR by rule) say
     * which alternatives a newly nullable rule advances. */
    size_t na = g->n_alts;
    uint32_t *wait = rc_calloc(na ? na : 1, sizeof *wait);
    uint32_t *alt_rule = rc_mallocarray(na ? na : 1, sizeof *alt_rule);
    uint32_t *occ_off = rc_calloc(nr + 1, sizeof *occ_off);
    uint32_t *occ = rc_mallocarray(g->n_els ? g->n_els : 1, sizeof *occ);
    uint32_t *queue = rc_mallocarray(nr ? nr : 1, sizeof *queue);
    size_t qh = 0, qt = 0;
    if (!wait || !alt_rule || !occ_off || !occ || !queue) {
        rc = rc_fail(RC_ENOMEM, "grammar: out of memory");
        goto null_done;
    }
    for (size_t r = 0; r < nr; r++)
        for (uint32_t a = 0; a < g->rules[r].n_alts; a++) {
            uint32_t ai = g->rules[r].alt_off + a;
            const grammar__el *e = g->els + g->alts[ai];
            alt_rule[ai] = (uint32_t)r;
            uint32_t n = 0;
            while (e->type == GE_REF) { n++; e++; }
            wait[ai] = e->type == GE_END ? n : UINT32_MAX;
            if (wait[ai] == UINT32_MAX) continue;
            for (e = g->els + g->alts[ai]; e->type == GE_REF; e++) occ_off[e->arg + 1]++;
            if (n == 0 && !nullable[r]) { nullable[r] = true; queue[qt++] = (uint32_t)r; }
        }
    for (size_t r = 0; r < nr; r++) occ_off[r + 1] += occ_off[r];
    for (size_t ai = 0; ai < na; ai++) {
        if (wait[ai] == UINT32_MAX) continue;
        for (const grammar__el *e = g->els + g->alts[ai]; e->type == GE_REF; e++)
            occ[occ_off[e->arg]++] = (uint32_t)ai;
    }
    for (size_t r = nr; r > 0; r--) occ_off[r] = occ_off[r - 1];
    occ_off[0] = 0;
    while (qh < qt) {
        uint32_t r = queue[qh++];
        for (uint32_t i = occ_off[r]; i < occ_off[r + 1]; i++) {
            uint32_t ai = occ[i];
            if (--wait[ai] == 0 && !nullable[alt_rule[ai]]) {
                nullable[alt_rule[ai]] = true;
                queue[qt++] = alt_rule[ai];
            }
        }
    }
null_done:
    rc_free(wait);
    rc_free(alt_rule);
    rc_free(occ_off);
    rc_free(occ);
    rc_free(queue);
    if (rc) goto done;
    /* Depth-first search over left edges with an explicit stack; iter holds
     * (alternative, element offset) of where each rule on the stack resumes. */
    for (size_t s = 0; s < nr && !rc; s++) {
        if (color[s]) continue;
        size_t sp = 0;
        stack[sp] = (uint32_t)s; iter[0] = iter[1] = 0; sp++;
        color[s] = 1;
        while (sp && !rc) {
            uint32_t r = stack[sp - 1];
            uint32_t *it = &iter[2 * (sp - 1)];
            uint32_t next = UINT32_MAX;
            /* it[1]: the next element to look at; those before it are nullable references */
            while (it[0] < g->rules[r].n_alts) {
                const grammar__el *e = g->els + g->alts[g->rules[r].alt_off + it[0]] + it[1];
                if (e->type == GE_REF) {
                    next = e->arg;
                    if (nullable[e->arg]) { it[1]++; } else { it[0]++; it[1] = 0; }
                    break;
                }
                it[0]++;
                it[1] = 0;
            }
            if (next == UINT32_MAX) { color[r] = 2; sp--; continue; }
            if (color[next] == 1) {
                char path[400];
                size_t n = 0, from = 0;
                while (stack[from] != next) from++;
                for (size_t i = from; i < sp && n < sizeof path - 80; i++)
                    n += (size_t)snprintf(path + n, sizeof path - n, "%.60s -> ",
                                          p->rules[stack[i]].name);
                snprintf(path + n, sizeof path - n, "%.60s", p->rules[next].name);
                rc = p_fail(p, p->rules[next].src_off, "left recursion: rule '%s' can reach "
                            "itself before matching any character (%s)%s",
                            p->rules[next].name, path,
                            p->rules[next].synth ? "; a repetition of something that can "
                            "match nothing does this" : "");
            } else if (color[next] == 0) {
                color[next] = 1;
                stack[sp] = next;
                iter[2 * sp] = iter[2 * sp + 1] = 0;
                sp++;
            }
        }
    }
done:
    rc_free(nullable);
    rc_free(color);
    rc_free(stack);
    rc_free(iter);
    return rc;
}

static int flatten(parser *p, grammar *g)
{
    size_t n_els = 0, n_alts = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        n_els += p->rules[r].body.n + 1;
        n_alts += p->rules[r].n_alts;
    }
    if (n_els > GRAMMAR_MAX_ELEMENTS + GRAMMAR_MAX_RULES * (size_t)2)
        return p_fail(p, 0, "grammar too large: more than GRAMMAR_MAX_ELEMENTS (%u) elements",
                      GRAMMAR_MAX_ELEMENTS);
    g->els = rc_mallocarray(n_els, sizeof *g->els);
    g->alts = rc_mallocarray(n_alts, sizeof *g->alts);
    g->rules = rc_mallocarray(p->n_rules, sizeof *g->rules);
    if (!g->els || !g->alts || !g->rules) return rc_fail(RC_ENOMEM, "grammar: out of memory");
    size_t e = 0, a = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        const elbuf *b = &p->rules[r].body;
        g->rules[r].alt_off = (uint32_t)a;
        g->alts[a++] = (uint32_t)e;
        for (size_t i = 0; i < b->n; i++) {
            if (b->v[i].type == GE_ALT) {
                g->els[e++] = (grammar__el){ GE_END, 0 };
                g->alts[a++] = (uint32_t)e;
            } else {
                g->els[e++] = b->v[i];
            }
        }
        g->els[e++] = (grammar__el){ GE_END, 0 };
        g->rules[r].n_alts = (uint32_t)(a - g->rules[r].alt_off);
    }
    g->n_els = e;
    g->n_alts = a;
    g->n_rules = p->n_rules;
    return 0;
}

void grammar_free(grammar *g)
{
    if (!g) return;
    rc_free(g->els);
    rc_free(g->ranges);
    rc_free(g->classes);
    rc_free(g->rules);
    rc_free(g->alts);
    rc_free(g);
}

int grammar_compile(const char *gbnf, size_t len, grammar **out)
{
    *out = NULL;
    if (!gbnf && len) return rc_fail(RC_EINVAL, "grammar: no text");
    if (len > GRAMMAR_MAX_TEXT)
        return rc_fail(RC_EINVAL, "grammar text of %zu bytes is above GRAMMAR_MAX_TEXT (%u)",
                       len, GRAMMAR_MAX_TEXT);
    parser p = { .s = gbnf, .len = len, .any_class = UINT32_MAX };
    grammar *g = rc_calloc(1, sizeof *g);
    int rc = g ? 0 : rc_fail(RC_ENOMEM, "grammar: out of memory");
    if (!rc) {
        skip_space(&p, true);
        while (!rc && p.pos < p.len) rc = parse_rule(&p);
    }
    for (size_t r = 0; !rc && r < p.n_rules; r++)
        if (!p.rules[r].defined)
            rc = p_fail(&p, p.rules[r].src_off, "undefined rule '%s'", p.rules[r].name);
    if (!rc) {
        uint32_t root = UINT32_MAX;
        size_t j = p.hash_cap ? name_hash("root", 4) & (p.hash_cap - 1) : 0;
        while (p.hash_cap && p.hash[j]) {
            if (!strcmp(p.rules[p.hash[j] - 1].name, "root")) { root = p.hash[j] - 1; break; }
            j = (j + 1) & (p.hash_cap - 1);
        }
        if (root == UINT32_MAX)
            rc = rc_fail(RC_EINVAL, "grammar has no 'root' rule (the start rule)");
        else
            g->root = root;
    }
    if (!rc) rc = flatten(&p, g);
    if (!rc) rc = check_left_recursion(&p, g);
    if (!rc) {
        g->ranges = p.ranges; g->n_ranges = p.n_ranges; p.ranges = NULL;
        g->classes = p.classes; g->n_classes = p.n_classes; p.classes = NULL;
    }
    for (size_t r = 0; r < p.n_rules; r++) {
        rc_free(p.rules[r].name);
        rc_free(p.rules[r].body.v);
    }
    rc_free(p.rules);
    rc_free(p.hash);
    rc_free(p.ranges);
    rc_free(p.classes);
    if (rc) {
        grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
