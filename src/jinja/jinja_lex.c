/* jinja_lex.c - the tokenizer, following jinja2 3.1's lexer rules.
 *
 * Input is the normalized source (every newline is "\n" and one trailing
 * newline has been dropped, as jinja2 does with keep_trailing_newline off).
 * Outside tags the text becomes DATA tokens; `{{ }}` and `{% %}` become
 * BEGIN/END pairs with expression tokens between; comments vanish; the
 * body of `{% raw %}` is data.  Whitespace control matches trim_blocks and
 * lstrip_blocks:
 *   - `-` on a tag strips all whitespace on that side (`{%-`, `-%}`, ...);
 *   - `%}` and `#}` eat one following newline unless written `+%}`;
 *   - spaces and tabs between a line start and `{%` / `{#` are dropped
 *     unless the tag is written `{%+`.
 * Closing delimiters are only recognised while brackets are balanced, so
 * `{{ {'a': 1}}}` works.  A tag left open at the end of the source simply
 * ends the token stream; the parser then reports what it expected.
 */
#include "jinja/jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

#define MAX_BRACKETS 1024

typedef struct lexer {
    const char *src;
    size_t      len, pos;
    uint32_t    line;
    size_t      line_start;         /* byte offset where `line` begins */
    size_t      col_pos;            /* cached column: position ... */
    uint32_t    col;                /* ... and its 1-based column */
    jarena     *arena;
    jtok       *toks;
    size_t      n, cap;
    char        brackets[MAX_BRACKETS];
    size_t      n_brackets;
} lexer;

static void move_to(lexer *lx, size_t pos)
{
    for (size_t i = lx->pos; i < pos; i++) {
        if (lx->src[i] == '\n') {
            lx->line++;
            lx->line_start = i + 1;
        }
    }
    lx->pos = pos;
}

static uint32_t column_of(lexer *lx, size_t pos)
{
    if (lx->col_pos < lx->line_start || lx->col_pos > pos) {
        lx->col_pos = lx->line_start;
        lx->col = 1;
    }
    lx->col += (uint32_t)ju_count(lx->src + lx->col_pos, pos - lx->col_pos);
    lx->col_pos = pos;
    return lx->col;
}

static int fail_at(lexer *lx, size_t pos, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    move_to(lx, pos);
    return rc_fail(RC_EFORMAT, "TemplateSyntaxError: %s (line %u, column %u)", msg,
                   lx->line, column_of(lx, pos));
}

static jtok *emit(lexer *lx, int type, size_t start)
{
    if (lx->n == lx->cap) {
        size_t ncap = lx->cap ? lx->cap * 2 : 256;
        jtok *t = rc_realloc(lx->toks, ncap * sizeof *t);
        if (!t)
            return NULL;
        lx->toks = t;
        lx->cap = ncap;
    }
    jtok *t = &lx->toks[lx->n++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = lx->line;
    t->col = column_of(lx, start);
    return t;
}

static int nomem(void) { return rc_fail(RC_ENOMEM, "MemoryError: out of memory while lexing"); }

static bool starts(const lexer *lx, size_t p, const char *s)
{
    size_t n = strlen(s);
    return p + n <= lx->len && memcmp(lx->src + p, s, n) == 0;
}

/* Skips Unicode whitespace (Python's \s) from p. */
static size_t skip_space(const lexer *lx, size_t p)
{
    while (p < lx->len) {
        size_t q = p;
        uint32_t c = ju_next(lx->src, &q);
        if (!ju_isspace(c))
            break;
        p = q;
    }
    return p;
}

/* End of text [a, b) after Python's str.rstrip(). */
static size_t rstrip_end(const lexer *lx, size_t a, size_t b)
{
    while (b > a) {
        size_t s = b - 1;
        while (s > a && ((unsigned char)lx->src[s] & 0xC0) == 0x80)
            s--;
        size_t q = s;
        if (!ju_isspace(ju_next(lx->src, &q)))
            break;
        b = s;
    }
    return b;
}

/* jinja2's OptionalLStrip: where the text [a, b) before a tag ends. */
static size_t text_end(const lexer *lx, size_t a, size_t b, char sign, bool is_var,
                       bool line_starting)
{
    if (sign == '-')
        return rstrip_end(lx, a, b);
    if (sign == '+' || is_var)
        return b;
    size_t l = b;
    while (l > a && lx->src[l - 1] != '\n')
        l--;
    if ((l == a && !line_starting) || l == b)
        return b;
    for (size_t p = l; p < b;) {
        uint32_t c = ju_next(lx->src, &p);
        if (!ju_isspace(c))
            return b;
    }
    return l;
}

static int emit_data(lexer *lx, size_t a, size_t b)
{
    if (b <= a)
        return 0;
    move_to(lx, a);
    jtok *t = emit(lx, JT_DATA, a);
    if (!t)
        return nomem();
    t->s = lx->src + a;
    t->len = b - a;
    return 0;
}

/* `{%` [sign] \s* raw \s* (`-%}` \s* | `%}`) at p; *end = match end. */
static bool match_raw(const lexer *lx, size_t p, const char *word, size_t *end,
                      char *sign)
{
    size_t q = p + 2;
    *sign = 0;
    if (q < lx->len && (lx->src[q] == '-' || lx->src[q] == '+'))
        *sign = lx->src[q++];
    q = skip_space(lx, q);
    size_t wl = strlen(word);
    if (!starts(lx, q, word))
        return false;
    q = skip_space(lx, q + wl);
    if (starts(lx, q, "-%}")) {
        *end = skip_space(lx, q + 3);
        return true;
    }
    if (starts(lx, q, "%}")) {
        *end = q + 2;
        return true;
    }
    return false;
}

/* `{%` [sign] \s* endraw \s* (`+%}` | `-%}` \s* | `%}` \n?) at p. */
static bool match_endraw(const lexer *lx, size_t p, size_t *end, char *sign)
{
    size_t q = p + 2;
    *sign = 0;
    if (q < lx->len && (lx->src[q] == '-' || lx->src[q] == '+'))
        *sign = lx->src[q++];
    q = skip_space(lx, q);
    if (!starts(lx, q, "endraw"))
        return false;
    q = skip_space(lx, q + 6);
    if (starts(lx, q, "+%}")) {
        *end = q + 3;
    } else if (starts(lx, q, "-%}")) {
        *end = skip_space(lx, q + 3);
    } else if (starts(lx, q, "%}")) {
        *end = q + 2 + (q + 2 < lx->len && lx->src[q + 2] == '\n');
    } else {
        return false;
    }
    return true;
}

/* Decodes a string literal body (Python unicode-escape after jinja2's
 * backslashreplace round trip) into the arena. */
static int decode_string(lexer *lx, size_t a, size_t b, jtok *t)
{
    char *out = jarena_alloc(lx->arena, (b - a) + 1);
    size_t o = 0;
    if (!out)
        return nomem();
    for (size_t p = a; p < b;) {
        unsigned char c = (unsigned char)lx->src[p];
        if (c != '\\' || p + 1 >= b) {
            out[o++] = (char)c;
            p++;
            continue;
        }
        unsigned char e = (unsigned char)lx->src[p + 1];
        p += 2;
        uint32_t cp;
        int nhex = 0;
        switch (e) {
        case '\n': continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N':
            return fail_at(lx, p - 2, "%s", "named unicode escapes (\\N{...}) are not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = e - '0';
                for (int k = 0; k < 2 && p < b && lx->src[p] >= '0' && lx->src[p] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(lx->src[p++] - '0');
                o += ju_encode(cp, out + o);
                continue;
            }
            if (e >= 0x80) {
                /* backslashreplace turned the character into \xNN, \uNNNN
                 * or \UNNNNNNNN text; the backslash before it escaped the
                 * escape's own backslash, so that text stays literal. */
                size_t q = p - 1;
                uint32_t ch = ju_next(lx->src, &q);
                char tmp[16];
                int k = ch < 0x100 ? snprintf(tmp, sizeof tmp, "\\x%02x", ch)
                      : ch < 0x10000 ? snprintf(tmp, sizeof tmp, "\\u%04x", ch)
                                     : snprintf(tmp, sizeof tmp, "\\U%08x", ch);
                char *grown = jarena_alloc(lx->arena, (b - a) * 10 + 16);
                if (!grown)
                    return nomem();
                memcpy(grown, out, o);
                out = grown;
                memcpy(out + o, tmp, (size_t)k);
                o += (size_t)k;
                p = q;
                continue;
            }
            out[o++] = '\\';
            out[o++] = (char)e;
            continue;
        }
        cp = 0;
        for (int k = 0; k < nhex; k++) {
            char h = p < b ? lx->src[p] : 0;
            int v = (h >= '0' && h <= '9') ? h - '0'
                  : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0)
                return fail_at(lx, p, "%s", e == 'x' ? "truncated \\xXX escape"
                                     : e == 'u' ? "truncated \\uXXXX escape"
                                                : "truncated \\UXXXXXXXX escape");
            cp = cp * 16 + (uint32_t)v;
            p++;
        }
        if (cp > 0x10FFFF)
            return fail_at(lx, p, "%s", "illegal Unicode character");
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return fail_at(lx, p, "%s", "surrogate code points are not allowed in strings");
        o += ju_encode(cp, out + o);
    }
    out[o] = '\0';
    t->s = out;
    t->len = o;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at p; returns the end or p when no digit. */
static size_t digits_us(const lexer *lx, size_t p)
{
    if (p >= lx->len || !is_digit(lx->src[p]))
        return p;
    while (p < lx->len && is_digit(lx->src[p]))
        p++;
    while (p + 1 < lx->len && lx->src[p] == '_' && is_digit(lx->src[p + 1])) {
        p++;
        while (p < lx->len && is_digit(lx->src[p]))
            p++;
    }
    return p;
}

static size_t match_float(const lexer *lx, size_t p)
{
    if (p > 0 && lx->src[p - 1] == '.')
        return p;
    size_t m = digits_us(lx, p);
    if (m == p)
        return p;
    /* (\.digits)? e[+-]?digits */
    size_t q = m;
    if (q < lx->len && lx->src[q] == '.') {
        size_t f = digits_us(lx, q + 1);
        if (f > q + 1)
            q = f;
    }
    if (q < lx->len && (lx->src[q] == 'e' || lx->src[q] == 'E')) {
        size_t r = q + 1;
        if (r < lx->len && (lx->src[r] == '+' || lx->src[r] == '-'))
            r++;
        size_t x = digits_us(lx, r);
        if (x > r)
            return x;
    }
    /* \.digits */
    if (m < lx->len && lx->src[m] == '.') {
        size_t f = digits_us(lx, m + 1);
        if (f > m + 1)
            return f;
    }
    return p;
}

static bool in_base(char c, int base)
{
    if (c >= '0' && c <= '9')
        return c - '0' < base;
    if (base == 16)
        return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return false;
}

/* jinja2's integer_re; returns the end and the base (0 on no match). */
static size_t match_int(const lexer *lx, size_t p, int *base)
{
    const char *s = lx->src;
    *base = 10;
    if (p + 1 < lx->len && s[p] == '0') {
        char k = (char)(s[p + 1] | 0x20);
        int b = k == 'b' ? 2 : k == 'o' ? 8 : k == 'x' ? 16 : 0;
        if (b) {
            size_t q = p + 2, e = q;
            for (;;) {
                size_t r = q;
                if (r < lx->len && s[r] == '_')
                    r++;
                if (r < lx->len && in_base(s[r], b)) {
                    q = e = r + 1;
                } else {
                    break;
                }
            }
            if (e > p + 2) {
                *base = b;
                return e;
            }
        }
    }
    if (p < lx->len && s[p] >= '1' && s[p] <= '9') {
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < lx->len && s[r] == '_')
                r++;
            if (r < lx->len && is_digit(s[r]))
                q = r + 1;
            else
                break;
        }
        return q;
    }
    if (p < lx->len && s[p] == '0') {
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < lx->len && s[r] == '_')
                r++;
            if (r < lx->len && s[r] == '0')
                q = r + 1;
            else
                break;
        }
        return q;
    }
    *base = 0;
    return p;
}

static bool name_char(const lexer *lx, size_t p, size_t *next, bool first)
{
    unsigned char c = (unsigned char)lx->src[p];
    if (c < 0x80) {
        *next = p + 1;
        return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (!first && is_digit((char)c));
    }
    size_t q = p;
    uint32_t cp = ju_next(lx->src, &q);
    *next = q;
    return ju_isalpha(cp);
}

static const struct { const char *s; int type; } OPS[] = {
    {"//", JT_FLOORDIV}, {"**", JT_POW}, {"==", JT_EQ}, {"!=", JT_NE},
    {">=", JT_GTEQ}, {"<=", JT_LTEQ},
    {"+", JT_ADD}, {"-", JT_SUB}, {"/", JT_DIV}, {"*", JT_MUL}, {"%", JT_MOD},
    {"~", JT_TILDE}, {"[", JT_LBRACKET}, {"]", JT_RBRACKET}, {"(", JT_LPAREN},
    {")", JT_RPAREN}, {"{", JT_LBRACE}, {"}", JT_RBRACE}, {">", JT_GT},
    {"<", JT_LT}, {"=", JT_ASSIGN}, {".", JT_DOT}, {":", JT_COLON},
    {"|", JT_PIPE}, {",", JT_COMMA}, {";", JT_SEMICOLON},
};

static int lex_number(lexer *lx, size_t p, size_t end, bool is_float)
{
    char buf[128];
    size_t n = 0;
    for (size_t i = p; i < end; i++)
        if (lx->src[i] != '_' && n + 1 < sizeof buf)
            buf[n++] = lx->src[i];
    buf[n] = '\0';
    if (end - p >= sizeof buf)
        return fail_at(lx, p, "%s", "number literal too long");
    jtok *t = emit(lx, is_float ? JT_FLOAT : JT_INT, p);
    if (!t)
        return nomem();
    t->s = lx->src + p;
    t->len = end - p;
    if (is_float) {
        t->f = strtod(buf, NULL);
        return 0;
    }
    int base = 10;
    const char *digits = buf;
    if (n > 2 && buf[0] == '0' && ((buf[1] | 0x20) == 'x' || (buf[1] | 0x20) == 'o' ||
                                   (buf[1] | 0x20) == 'b')) {
        base = (buf[1] | 0x20) == 'x' ? 16 : (buf[1] | 0x20) == 'o' ? 8 : 2;
        digits = buf + 2;
    }
    uint64_t v = 0;
    for (const char *d = digits; *d; d++) {
        int k = (*d >= '0' && *d <= '9') ? *d - '0' : ((*d | 0x20) - 'a' + 10);
        if (v > (UINT64_MAX - (uint64_t)k) / (uint64_t)base || v * (uint64_t)base + (uint64_t)k > INT64_MAX)
            return fail_at(lx, p, "%s", "integer literal does not fit in 64 bits");
        v = v * (uint64_t)base + (uint64_t)k;
    }
    t->i = (int64_t)v;
    return 0;
}

/* Tokens inside `{{ }}` or `{% %}`; returns with lx->pos after the end
 * delimiter (or at the end of the source). */
static int lex_tag(lexer *lx, bool is_block, bool *line_starting)
{
    const char *s = lx->src;
    int rc;
    lx->n_brackets = 0;
    for (;;) {
        size_t p = lx->pos;
        if (lx->n_brackets == 0) {
            size_t end = 0;
            if (is_block) {
                if (starts(lx, p, "+%}"))
                    end = p + 3;
                else if (starts(lx, p, "-%}"))
                    end = skip_space(lx, p + 3);
                else if (starts(lx, p, "%}"))
                    end = p + 2 + (p + 2 < lx->len && s[p + 2] == '\n');
            } else {
                if (starts(lx, p, "-}}"))
                    end = skip_space(lx, p + 3);
                else if (starts(lx, p, "}}"))
                    end = p + 2;
            }
            if (end) {
                if (!emit(lx, is_block ? JT_BLOCK_END : JT_VAR_END, p))
                    return nomem();
                *line_starting = s[end - 1] == '\n';
                move_to(lx, end);
                return 0;
            }
        }
        if (p >= lx->len)
            return 0;
        size_t q = skip_space(lx, p);
        if (q > p) {
            *line_starting = s[q - 1] == '\n';
            move_to(lx, q);
            continue;
        }
        *line_starting = false;
        unsigned char c = (unsigned char)s[p];
        if (is_digit((char)c)) {
            size_t e = match_float(lx, p);
            if (e > p) {
                if ((rc = lex_number(lx, p, e, true)) < 0)
                    return rc;
                move_to(lx, e);
                continue;
            }
            int base;
            e = match_int(lx, p, &base);
            if ((rc = lex_number(lx, p, e, false)) < 0)
                return rc;
            move_to(lx, e);
            continue;
        }
        size_t nx;
        if (name_char(lx, p, &nx, true)) {
            size_t e = nx;
            while (e < lx->len && name_char(lx, e, &nx, false))
                e = nx;
            jtok *t = emit(lx, JT_NAME, p);
            if (!t)
                return nomem();
            char *name = jarena_alloc(lx->arena, e - p + 1);
            if (!name)
                return nomem();
            memcpy(name, s + p, e - p);
            t->s = name;
            t->len = e - p;
            move_to(lx, e);
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t e = p + 1;
            while (e < lx->len && s[e] != (char)c) {
                if (s[e] == '\\' && e + 1 < lx->len)
                    e++;
                e++;
            }
            if (e >= lx->len) {
                char q2[8] = {(char)c, 0};
                return fail_at(lx, p, "unexpected char '%s'", c == '\'' ? "\\'" : q2);
            }
            jtok *t = emit(lx, JT_STRING, p);
            if (!t)
                return nomem();
            if ((rc = decode_string(lx, p + 1, e, t)) < 0)
                return rc;
            move_to(lx, e + 1);
            continue;
        }
        int type = -1;
        size_t olen = 0;
        for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
            if (starts(lx, p, OPS[i].s)) {
                type = OPS[i].type;
                olen = strlen(OPS[i].s);
                break;
            }
        }
        if (type < 0) {
            char ch[8] = {0};
            size_t q2 = p;
            ju_next(s, &q2);
            memcpy(ch, s + p, q2 - p);
            return fail_at(lx, p, "unexpected char '%s'", ch);
        }
        if (type == JT_LBRACE || type == JT_LPAREN || type == JT_LBRACKET) {
            if (lx->n_brackets == MAX_BRACKETS) {
                move_to(lx, p);
                return rc_fail(RC_ELIMIT, "LimitError: brackets nested more than %d deep "
                               "(line %u, column %u)", MAX_BRACKETS, lx->line, column_of(lx, p));
            }
            lx->brackets[lx->n_brackets++] =
                type == JT_LBRACE ? '}' : type == JT_LPAREN ? ')' : ']';
        } else if (type == JT_RBRACE || type == JT_RPAREN || type == JT_RBRACKET) {
            char want[2] = {s[p], 0};
            if (lx->n_brackets == 0)
                return fail_at(lx, p, "unexpected '%s'", want);
            char exp = lx->brackets[--lx->n_brackets];
            if (exp != s[p]) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", s[p], exp);
                return fail_at(lx, p, "%s", msg);
            }
        }
        if (!emit(lx, type, p))
            return nomem();
        move_to(lx, p + olen);
    }
}

int jinja__lex(const char *src, size_t len, jarena *arena, jtok **toks, size_t *n_toks)
{
    lexer lx;
    int rc = 0;
    memset(&lx, 0, sizeof lx);
    lx.src = src;
    lx.len = len;
    lx.line = 1;
    lx.col = 1;
    lx.arena = arena;
    bool line_starting = true;

    while (lx.pos < len) {
        size_t a = lx.pos, p = a;
        char kind = 0;
        while (p + 1 < len) {
            const char *hit = memchr(src + p, '{', len - 1 - p);
            if (!hit)
                break;
            p = (size_t)(hit - src);
            char k = src[p + 1];
            if (k == '{' || k == '%' || k == '#') {
                kind = k;
                break;
            }
            p++;
        }
        if (!kind) {
            if ((rc = emit_data(&lx, a, len)) < 0)
                goto fail;
            move_to(&lx, len);
            break;
        }
        char sign = 0;
        size_t q = p + 2;
        if (q < len && (src[q] == '-' || src[q] == '+'))
            sign = src[q++];
        size_t raw_end = 0;
        char raw_sign = 0;
        bool raw = kind == '%' && match_raw(&lx, p, "raw", &raw_end, &raw_sign);
        size_t te = text_end(&lx, a, p, sign, kind == '{', line_starting);
        if ((rc = emit_data(&lx, a, te)) < 0)
            goto fail;
        move_to(&lx, p);

        if (raw) {
            /* the body runs to the first {% endraw %} */
            size_t b = raw_end, body_end = 0, end = 0;
            char esign = 0;
            line_starting = src[raw_end - 1] == '\n';
            for (size_t r = b; r + 1 < len && !end; r++)
                if (src[r] == '{' && src[r + 1] == '%' && match_endraw(&lx, r, &end, &esign))
                    body_end = r;
            if (!end) {
                rc = fail_at(&lx, p, "%s", "Missing end of raw directive");
                goto fail;
            }
            size_t be = text_end(&lx, b, body_end, esign, false, line_starting);
            move_to(&lx, b);
            if ((rc = emit_data(&lx, b, be)) < 0)
                goto fail;
            line_starting = src[end - 1] == '\n';
            move_to(&lx, end);
            continue;
        }
        if (kind == '#') {
            size_t r = q, end = 0;
            for (; r + 1 < len; r++) {
                if (src[r] == '+' && starts(&lx, r + 1, "#}")) {
                    end = r + 3;
                    break;
                }
                if (src[r] == '-' && starts(&lx, r + 1, "#}")) {
                    end = skip_space(&lx, r + 3);
                    break;
                }
                if (src[r] == '#' && src[r + 1] == '}') {
                    end = r + 2 + (r + 2 < len && src[r + 2] == '\n');
                    break;
                }
            }
            if (!end) {
                rc = fail_at(&lx, p, "%s", "Missing end of comment tag");
                goto fail;
            }
            line_starting = src[end - 1] == '\n';
            move_to(&lx, end);
            continue;
        }
        if (!emit(&lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, p)) {
            rc = nomem();
            goto fail;
        }
        move_to(&lx, q);
        if ((rc = lex_tag(&lx, kind == '%', &line_starting)) < 0)
            goto fail;
    }
    if (!emit(&lx, JT_EOF, lx.pos)) {
        rc = nomem();
        goto fail;
    }
    *toks = lx.toks;
    *n_toks = lx.n;
    return 0;
fail:
    rc_free(lx.toks);
    return rc;
}

const char *jinja__tok_describe(const jtok *t, char *buf, size_t cap)
{
    static const char *names[] = {
        [JT_EOF] = "end of template", [JT_DATA] = "template data / text",
        [JT_VAR_BEGIN] = "begin of print statement",
        [JT_VAR_END] = "end of print statement",
        [JT_BLOCK_BEGIN] = "begin of statement block",
        [JT_BLOCK_END] = "end of statement block", [JT_NAME] = "name",
        [JT_STRING] = "string", [JT_INT] = "integer", [JT_FLOAT] = "float",
        [JT_ADD] = "+", [JT_SUB] = "-", [JT_DIV] = "/", [JT_FLOORDIV] = "//",
        [JT_MUL] = "*", [JT_POW] = "**", [JT_MOD] = "%", [JT_TILDE] = "~",
        [JT_LBRACKET] = "[", [JT_RBRACKET] = "]", [JT_LPAREN] = "(",
        [JT_RPAREN] = ")", [JT_LBRACE] = "{", [JT_RBRACE] = "}", [JT_EQ] = "==",
        [JT_NE] = "!=", [JT_GT] = ">", [JT_GTEQ] = ">=", [JT_LT] = "<",
        [JT_LTEQ] = "<=", [JT_ASSIGN] = "=", [JT_DOT] = ".", [JT_COLON] = ":",
        [JT_PIPE] = "|", [JT_COMMA] = ",", [JT_SEMICOLON] = ";",
    };
    if (t->type == JT_NAME) {
        snprintf(buf, cap, "%.*s", (int)(t->len > 64 ? 64 : t->len), t->s);
        return buf;
    }
    return names[t->type];
}
