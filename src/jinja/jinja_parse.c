/* jinja_parse.c - tokens -> syntax tree, and the template object.
 *
 * A recursive-descent parser that mirrors jinja2 3.1's parser.py function
 * for function, so operator precedence, filter binding ("a + b|trim" filters
 * b only), tuple handling and statement syntax come out the same:
 *
 *   expression  := condexpr ("a if b else c", else optional)
 *   or/and/not  -> compare (==, !=, <, <=, >, >=, in, not in; chained)
 *   math1 (+ -) -> concat (~) -> math2 (* / // %) -> pow (**, left assoc.)
 *   unary (- +) -> primary, postfix (.attr [item] (call)), then filters
 *                  (|f), tests (is t) and calls, in any order
 *
 * Unknown filters and tests are rejected once the whole template parsed,
 * as jinja2's compiler does (inside `if` they fail only when run).  Two
 * passes over the finished tree stand in for the rest of jinja2's
 * compiler: mark_fold flags constant subexpressions its optimizer would
 * fold, and frame_of records per frame the names that start undefined.
 * The tree and every string it holds live in the template's arena;
 * nesting is bounded by JX_MAX_PARSE_DEPTH so hostile input cannot
 * overflow the stack.  Syntax errors carry the line and column of the
 * offending token.
 */
#include "jinja/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* ---- arena ---------------------------------------------------------------- */

struct jarena_chunk {
    struct jarena_chunk *next;
    size_t size;
    _Alignas(16) char data[];
};

void *jarena_alloc(jarena *a, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    if (bytes > a->left) {
        size_t size = bytes > 60000 ? bytes : 60000;
        struct jarena_chunk *c = rc_malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->next = a->head;
        c->size = size;
        a->head = c;
        a->cur = c->data;
        a->left = size;
    }
    void *p = a->cur;
    a->cur += bytes;
    a->left -= bytes;
    memset(p, 0, bytes);
    return p;
}

void jarena_free(jarena *a)
{
    struct jarena_chunk *c = a->head;
    while (c) {
        struct jarena_chunk *n = c->next;
        rc_free(c);
        c = n;
    }
    a->head = NULL;
    a->cur = NULL;
    a->left = 0;
}

uint32_t jinja__hash_name(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

/* ---- parser state ----------------------------------------------------------- */

#define MAX_END_SETS (JX_MAX_PARSE_DEPTH + 8)

typedef struct parser {
    jtok   *t;
    size_t  n, i;
    jarena *arena;
    int     depth;
    int     loop_depth;             /* for break/continue */
    bool    soft;                   /* inside an if or a conditional expression */
    const jnode *unknown;           /* first unknown filter/test outside those */
    int     rc;
    const char *tags[MAX_END_SETS];  /* statements being parsed */
    int     n_tags;
    const char *const *ends[MAX_END_SETS];   /* end tag sets of open bodies */
    int     n_ends;
} parser;

static jtok *cur(parser *p) { return &p->t[p->i]; }
static jtok *look(parser *p) { return &p->t[p->i + 1 < p->n ? p->i + 1 : p->n - 1]; }
static void advance(parser *p)
{
    if (p->i + 1 < p->n)
        p->i++;
}

static bool is_name(const jtok *t, const char *s)
{
    return t->type == JT_NAME && strlen(s) == t->len && memcmp(t->s, s, t->len) == 0;
}

static void *fail_tok(parser *p, const jtok *t, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void *fail_tok(parser *p, const jtok *t, int code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->rc == 0)
        p->rc = rc_fail(code, "%s (line %u, column %u)", msg, t->line, t->col);
    return NULL;
}

#define FAIL(p, ...) fail_tok((p), cur(p), RC_EFORMAT, "TemplateSyntaxError: " __VA_ARGS__)

static void *nomem(parser *p)
{
    if (p->rc == 0)
        p->rc = rc_fail(RC_ENOMEM, "MemoryError: out of memory while parsing");
    return NULL;
}

static jnode *new_node(parser *p, int kind, const jtok *at)
{
    jnode *n = jarena_alloc(p->arena, sizeof *n);
    if (!n)
        return nomem(p);
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* A growable node array inside the arena (old blocks are abandoned). */
typedef struct nvec { jnode **v; uint32_t n, cap; } nvec;

static bool nvec_push(parser *p, nvec *v, jnode *x)
{
    if (v->n == v->cap) {
        uint32_t ncap = v->cap ? v->cap * 2 : 4;
        jnode **nv = jarena_alloc(p->arena, ncap * sizeof *nv);
        if (!nv) {
            nomem(p);
            return false;
        }
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = ncap;
    }
    v->v[v->n++] = x;
    return true;
}

static bool enter(parser *p)
{
    if (++p->depth > JX_MAX_PARSE_DEPTH) {
        fail_tok(p, cur(p), RC_ELIMIT,
                 "LimitError: template nested more than %d levels deep",
                 JX_MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}
static void leave(parser *p) { p->depth--; }

static jname make_name(const jtok *t)
{
    jname n = {t->s, jinja__hash_name(t->s, t->len)};
    return n;
}

static bool expect(parser *p, int type)
{
    jtok *t = cur(p);
    if (t->type == type) {
        advance(p);
        return true;
    }
    jtok want = {0};
    want.type = (uint8_t)type;
    char b1[80], b2[80];
    const char *w = jinja__tok_describe(&want, b1, sizeof b1);
    if (t->type == JT_EOF)
        FAIL(p, "unexpected end of template, expected '%s'.", w);
    else
        FAIL(p, "expected token '%s', got '%s'", w, jinja__tok_describe(t, b2, sizeof b2));
    return false;
}

static bool expect_name(parser *p, const char *name)
{
    jtok *t = cur(p);
    if (is_name(t, name)) {
        advance(p);
        return true;
    }
    char b[80];
    if (t->type == JT_EOF)
        FAIL(p, "unexpected end of template, expected '%s'.", name);
    else
        FAIL(p, "expected token '%s', got '%s'", name, jinja__tok_describe(t, b, sizeof b));
    return false;
}

static bool skip_name(parser *p, const char *name)
{
    if (is_name(cur(p), name)) {
        advance(p);
        return true;
    }
    return false;
}

static bool skip_type(parser *p, int type)
{
    if (cur(p)->type == type) {
        advance(p);
        return true;
    }
    return false;
}

/* ---- expressions ---------------------------------------------------------- */

static jnode *parse_expression(parser *p, bool with_condexpr);
static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr,
                          const char *extra_end, bool explicit_parens, bool with_ns);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p, bool with_ns);
static jnode *parse_postfix(parser *p, jnode *node);
static jnode *parse_filter(parser *p, jnode *node, bool start_inline);

static jnode *parse_condexpr(parser *p)
{
    /* the whole conditional expression is soft, but that is only known
     * after its first operand: an unknown filter found there is forgiven */
    const jnode *unknown_before = p->unknown;
    jnode *r = parse_expression(p, false);
    if (!r || !is_name(cur(p), "if"))
        return r;
    p->unknown = unknown_before;
    bool saved = p->soft;
    p->soft = true;
    while (r && skip_name(p, "if")) {
        jnode *e2 = parse_expression(p, false), *e3 = NULL, *c;
        if (!e2) {
            r = NULL;
            break;
        }
        if (skip_name(p, "else")) {
            if (!enter(p)) {
                r = NULL;
                break;
            }
            e3 = parse_condexpr(p);
            leave(p);
            if (!e3) {
                r = NULL;
                break;
            }
        }
        if (!(c = new_node(p, N_CONDEXPR, cur(p)))) {
            r = NULL;
            break;
        }
        c->line = r->line;
        c->a = e2;
        c->b = r;
        c->c = e3;
        r = c;
    }
    p->soft = saved;
    return r;
}

static jnode *parse_not(parser *p);

static jnode *parse_and(parser *p)
{
    jnode *left = parse_not(p);
    while (left && is_name(cur(p), "and")) {
        jtok *t = cur(p);
        advance(p);
        jnode *right = parse_not(p), *n;
        if (!right || !(n = new_node(p, N_AND, t)))
            return NULL;
        n->a = left;
        n->b = right;
        left = n;
    }
    return left;
}

static jnode *parse_or(parser *p)
{
    jnode *left = parse_and(p);
    while (left && is_name(cur(p), "or")) {
        jtok *t = cur(p);
        advance(p);
        jnode *right = parse_and(p), *n;
        if (!right || !(n = new_node(p, N_OR, t)))
            return NULL;
        n->a = left;
        n->b = right;
        left = n;
    }
    return left;
}

static jnode *parse_expression(parser *p, bool with_condexpr)
{
    if (!enter(p))
        return NULL;
    jnode *r = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return r;
}

static jnode *parse_math1(parser *p);

static jnode *parse_compare(parser *p)
{
    jtok *start = cur(p);
    jnode *expr = parse_math1(p);
    nvec ops = {0};
    if (!expr)
        return NULL;
    for (;;) {
        jtok *t = cur(p);
        int op = -1;
        switch (t->type) {
        case JT_EQ: op = OP_EQ; break;
        case JT_NE: op = OP_NE; break;
        case JT_LT: op = OP_LT; break;
        case JT_LTEQ: op = OP_LTEQ; break;
        case JT_GT: op = OP_GT; break;
        case JT_GTEQ: op = OP_GTEQ; break;
        default: break;
        }
        if (op >= 0) {
            advance(p);
        } else if (is_name(t, "in")) {
            advance(p);
            op = OP_IN;
        } else if (is_name(t, "not") && is_name(look(p), "in")) {
            advance(p);
            advance(p);
            op = OP_NOTIN;
        } else {
            break;
        }
        jnode *rhs = parse_math1(p), *o;
        if (!rhs || !(o = new_node(p, N_OPERAND, t)))
            return NULL;
        o->op = (uint8_t)op;
        o->a = rhs;
        if (!nvec_push(p, &ops, o))
            return NULL;
    }
    if (!ops.n)
        return expr;
    jnode *c = new_node(p, N_COMPARE, start);
    if (!c)
        return NULL;
    c->a = expr;
    c->items = ops.v;
    c->n_items = ops.n;
    return c;
}

static jnode *parse_not(parser *p)
{
    if (is_name(cur(p), "not")) {
        jtok *t = cur(p);
        advance(p);
        if (!enter(p))
            return NULL;
        jnode *inner = parse_not(p), *n;
        leave(p);
        if (!inner || !(n = new_node(p, N_NOT, t)))
            return NULL;
        n->a = inner;
        return n;
    }
    return parse_compare(p);
}

static jnode *binop(parser *p, const jtok *t, int op, jnode *a, jnode *b)
{
    jnode *n = new_node(p, N_BINOP, t);
    if (!n)
        return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *p)
{
    jnode *left = parse_unary(p, true);
    while (left && cur(p)->type == JT_POW) {
        jtok *t = cur(p);
        advance(p);
        jnode *right = parse_unary(p, true);
        if (!right)
            return NULL;
        left = binop(p, t, OP_POW, left, right);
    }
    return left;
}

static jnode *parse_math2(parser *p)
{
    jnode *left = parse_pow(p);
    for (;;) {
        if (!left)
            return NULL;
        jtok *t = cur(p);
        int op = t->type == JT_MUL ? OP_MUL : t->type == JT_DIV ? OP_DIV
               : t->type == JT_FLOORDIV ? OP_FLOORDIV : t->type == JT_MOD ? OP_MOD : -1;
        if (op < 0)
            return left;
        advance(p);
        jnode *right = parse_pow(p);
        if (!right)
            return NULL;
        left = binop(p, t, op, left, right);
    }
}

static jnode *parse_concat(parser *p)
{
    jtok *start = cur(p);
    jnode *first = parse_math2(p);
    if (!first || cur(p)->type != JT_TILDE)
        return first;
    nvec args = {0};
    if (!nvec_push(p, &args, first))
        return NULL;
    while (cur(p)->type == JT_TILDE) {
        advance(p);
        jnode *x = parse_math2(p);
        if (!x || !nvec_push(p, &args, x))
            return NULL;
    }
    jnode *n = new_node(p, N_CONCAT, start);
    if (!n)
        return NULL;
    n->items = args.v;
    n->n_items = args.n;
    return n;
}

static jnode *parse_math1(parser *p)
{
    jnode *left = parse_concat(p);
    for (;;) {
        if (!left)
            return NULL;
        jtok *t = cur(p);
        int op = t->type == JT_ADD ? OP_ADD : t->type == JT_SUB ? OP_SUB : -1;
        if (op < 0)
            return left;
        advance(p);
        jnode *right = parse_concat(p);
        if (!right)
            return NULL;
        left = binop(p, t, op, left, right);
    }
}

/* Call arguments into n (items, kw names/values, d = *args, e = **kwargs). */
static bool parse_call_args(parser *p, jnode *n)
{
    jtok *open = cur(p);
    nvec args = {0}, kwv = {0};
    jname *kwn = NULL;
    uint32_t kwcap = 0;
    bool need_comma = false;
    if (!expect(p, JT_LPAREN))
        return false;
    while (cur(p)->type != JT_RPAREN) {
        if (need_comma) {
            if (!expect(p, JT_COMMA))
                return false;
            if (cur(p)->type == JT_RPAREN)
                break;
        }
        if (cur(p)->type == JT_MUL) {
            if (n->d || n->e)
                return fail_tok(p, open, RC_EFORMAT, "TemplateSyntaxError: invalid syntax for function call expression");
            advance(p);
            if (!(n->d = parse_expression(p, true)))
                return false;
        } else if (cur(p)->type == JT_POW) {
            if (n->e)
                return fail_tok(p, open, RC_EFORMAT, "TemplateSyntaxError: invalid syntax for function call expression");
            advance(p);
            if (!(n->e = parse_expression(p, true)))
                return false;
        } else if (cur(p)->type == JT_NAME && look(p)->type == JT_ASSIGN) {
            if (n->e)
                return fail_tok(p, open, RC_EFORMAT, "TemplateSyntaxError: invalid syntax for function call expression");
            jname key = make_name(cur(p));
            advance(p);
            advance(p);
            jnode *v = parse_expression(p, true);
            if (!v)
                return false;
            if (kwv.n == kwcap) {
                uint32_t nc = kwcap ? kwcap * 2 : 4;
                jname *nn = jarena_alloc(p->arena, nc * sizeof *nn);
                if (!nn)
                    return nomem(p);
                if (kwv.n)
                    memcpy(nn, kwn, kwv.n * sizeof *nn);
                kwn = nn;
                kwcap = nc;
            }
            kwn[kwv.n] = key;
            if (!nvec_push(p, &kwv, v))
                return false;
        } else {
            if (n->d || n->e || kwv.n)
                return fail_tok(p, open, RC_EFORMAT, "TemplateSyntaxError: invalid syntax for function call expression");
            jnode *v = parse_expression(p, true);
            if (!v || !nvec_push(p, &args, v))
                return false;
        }
        need_comma = true;
    }
    if (!expect(p, JT_RPAREN))
        return false;
    n->items = args.v;
    n->n_items = args.n;
    n->kwvals = kwv.v;
    n->kwnames = kwn;
    n->n_kw = kwv.n;
    return true;
}

static jnode *parse_call(parser *p, jnode *callee)
{
    jnode *n = new_node(p, N_CALL, cur(p));
    if (!n)
        return NULL;
    n->a = callee;
    return parse_call_args(p, n) ? n : NULL;
}

static bool dotted_name(parser *p, jtok **first, char *buf, size_t cap)
{
    jtok *t = cur(p);
    *first = t;
    if (!expect(p, JT_NAME))
        return false;
    snprintf(buf, cap, "%.*s", (int)t->len, t->s);
    while (cur(p)->type == JT_DOT) {
        advance(p);
        jtok *x = cur(p);
        if (!expect(p, JT_NAME))
            return false;
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, ".%.*s", (int)x->len, x->s);
    }
    return true;
}

/* Names a filter or test node.  Unknown names are an error once the whole
 * template has parsed (jinja2's compiler), except inside `if` statements
 * and conditional expressions, where jinja2 defers the error until the
 * filter actually runs. */
static bool set_callee_name(parser *p, jnode *n, const char *name, int id)
{
    size_t len = strlen(name);
    char *copy = jarena_alloc(p->arena, len + 1);
    if (!copy) {
        nomem(p);
        return false;
    }
    memcpy(copy, name, len + 1);
    n->name.s = copy;
    n->name.hash = jinja__hash_name(copy, len);
    n->fid = id;
    if (id < 0 && !p->soft && !p->unknown)
        p->unknown = n;
    return true;
}

static jnode *parse_filter(parser *p, jnode *node, bool start_inline)
{
    while (cur(p)->type == JT_PIPE || start_inline) {
        if (!start_inline)
            advance(p);
        start_inline = false;
        jtok *t;
        char name[128];
        if (!dotted_name(p, &t, name, sizeof name))
            return NULL;
        jnode *f = new_node(p, N_FILTER, t);
        if (!f || !set_callee_name(p, f, name, jinja__filter_id(name)))
            return NULL;
        f->a = node;
        if (cur(p)->type == JT_LPAREN && !parse_call_args(p, f))
            return NULL;
        node = f;
    }
    return node;
}

static jnode *parse_test(parser *p, jnode *node)
{
    jtok *is = cur(p);
    advance(p);
    bool negated = skip_name(p, "not");
    jtok *t;
    char name[128];
    if (!dotted_name(p, &t, name, sizeof name))
        return NULL;
    jnode *n = new_node(p, N_TEST, t);
    if (!n || !set_callee_name(p, n, name, jinja__test_id(name)))
        return NULL;
    n->a = node;
    jtok *c = cur(p);
    if (c->type == JT_LPAREN) {
        if (!parse_call_args(p, n))
            return NULL;
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                c->type == JT_FLOAT || c->type == JT_LBRACKET || c->type == JT_LBRACE) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            return FAIL(p, "You cannot chain multiple tests with is");
        jnode *arg = parse_primary(p, false);
        if (!arg || !(arg = parse_postfix(p, arg)))
            return NULL;
        jnode **items = jarena_alloc(p->arena, sizeof *items);
        if (!items)
            return nomem(p);
        items[0] = arg;
        n->items = items;
        n->n_items = 1;
    }
    if (negated) {
        jnode *x = new_node(p, N_NOT, is);
        if (!x)
            return NULL;
        x->a = n;
        n = x;
    }
    return n;
}

static jnode *parse_subscribed(parser *p)
{
    jtok *t = cur(p);
    jnode *args[3] = {NULL, NULL, NULL};
    if (t->type == JT_COLON) {
        advance(p);
    } else {
        jnode *node = parse_expression(p, true);
        if (!node || cur(p)->type != JT_COLON)
            return node;
        advance(p);
        args[0] = node;
    }
    if (cur(p)->type != JT_COLON && cur(p)->type != JT_RBRACKET && cur(p)->type != JT_COMMA) {
        if (!(args[1] = parse_expression(p, true)))
            return NULL;
    }
    if (cur(p)->type == JT_COLON) {
        advance(p);
        if (cur(p)->type != JT_RBRACKET && cur(p)->type != JT_COMMA) {
            if (!(args[2] = parse_expression(p, true)))
                return NULL;
        }
    }
    jnode *s = new_node(p, N_SLICE, t);
    if (!s)
        return NULL;
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static jnode *parse_subscript(parser *p, jnode *node)
{
    jtok *t = cur(p);
    advance(p);
    if (t->type == JT_DOT) {
        jtok *a = cur(p);
        advance(p);
        if (a->type == JT_NAME) {
            jnode *g = new_node(p, N_GETATTR, t);
            if (!g)
                return NULL;
            g->a = node;
            g->attr = make_name(a);
            return g;
        }
        if (a->type != JT_INT)
            return fail_tok(p, a, RC_EFORMAT, "TemplateSyntaxError: expected name or number");
        jnode *k = new_node(p, N_CONST, a), *g;
        if (!k || !(g = new_node(p, N_GETITEM, t)))
            return NULL;
        k->cval = jv_int(a->i);
        g->a = node;
        g->b = k;
        return g;
    }
    /* '[' */
    nvec args = {0};
    while (cur(p)->type != JT_RBRACKET) {
        if (args.n && !expect(p, JT_COMMA))
            return NULL;
        jnode *x = parse_subscribed(p);
        if (!x || !nvec_push(p, &args, x))
            return NULL;
    }
    if (!expect(p, JT_RBRACKET))
        return NULL;
    jnode *g = new_node(p, N_GETITEM, t);
    if (!g)
        return NULL;
    g->a = node;
    if (args.n == 1) {
        g->b = args.v[0];
    } else {
        jnode *tu = new_node(p, N_TUPLE, t);
        if (!tu)
            return NULL;
        tu->items = args.v;
        tu->n_items = args.n;
        g->b = tu;
    }
    return g;
}

static jnode *parse_postfix(parser *p, jnode *node)
{
    for (;;) {
        if (!node)
            return NULL;
        int ty = cur(p)->type;
        if (ty == JT_DOT || ty == JT_LBRACKET)
            node = parse_subscript(p, node);
        else if (ty == JT_LPAREN)
            node = parse_call(p, node);
        else
            return node;
    }
}

static jnode *parse_filter_expr(parser *p, jnode *node)
{
    for (;;) {
        if (!node)
            return NULL;
        jtok *t = cur(p);
        if (t->type == JT_PIPE)
            node = parse_filter(p, node, false);
        else if (is_name(t, "is"))
            node = parse_test(p, node);
        else if (t->type == JT_LPAREN)
            node = parse_call(p, node);
        else
            return node;
    }
}

static jnode *parse_unary(parser *p, bool with_filter)
{
    jtok *t = cur(p);
    jnode *node;
    if (t->type == JT_SUB || t->type == JT_ADD) {
        advance(p);
        if (!enter(p))
            return NULL;
        jnode *inner = parse_unary(p, false);
        leave(p);
        if (!inner || !(node = new_node(p, t->type == JT_SUB ? N_NEG : N_POS, t)))
            return NULL;
        node->a = inner;
    } else {
        node = parse_primary(p, false);
    }
    node = parse_postfix(p, node);
    if (with_filter)
        node = parse_filter_expr(p, node);
    return node;
}

static jnode *parse_list(parser *p)
{
    jtok *t = cur(p);
    nvec items = {0};
    advance(p);
    while (cur(p)->type != JT_RBRACKET) {
        if (items.n && !expect(p, JT_COMMA))
            return NULL;
        if (cur(p)->type == JT_RBRACKET)
            break;
        jnode *x = parse_expression(p, true);
        if (!x || !nvec_push(p, &items, x))
            return NULL;
    }
    if (!expect(p, JT_RBRACKET))
        return NULL;
    jnode *n = new_node(p, N_LIST, t);
    if (!n)
        return NULL;
    n->items = items.v;
    n->n_items = items.n;
    return n;
}

static jnode *parse_dict(parser *p)
{
    jtok *t = cur(p);
    nvec items = {0};
    advance(p);
    while (cur(p)->type != JT_RBRACE) {
        if (items.n && !expect(p, JT_COMMA))
            return NULL;
        if (cur(p)->type == JT_RBRACE)
            break;
        jnode *k = parse_expression(p, true);
        if (!k || !expect(p, JT_COLON))
            return NULL;
        jnode *v = parse_expression(p, true);
        if (!v || !nvec_push(p, &items, k) || !nvec_push(p, &items, v))
            return NULL;
    }
    if (!expect(p, JT_RBRACE))
        return NULL;
    jnode *n = new_node(p, N_DICT, t);
    if (!n)
        return NULL;
    n->items = items.v;
    n->n_items = items.n;
    return n;
}

static jnode *parse_primary(parser *p, bool with_ns)
{
    jtok *t = cur(p);
    jnode *n;
    char b[80];
    switch (t->type) {
    case JT_NAME:
        advance(p);
        if (!(n = new_node(p, N_CONST, t)))
            return NULL;
        if (is_name(t, "true") || is_name(t, "True")) {
            n->cval = jv_bool(true);
        } else if (is_name(t, "false") || is_name(t, "False")) {
            n->cval = jv_bool(false);
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n->cval = jv_none();
        } else if (with_ns && cur(p)->type == JT_DOT) {
            advance(p);
            jtok *a = cur(p);
            if (!expect(p, JT_NAME))
                return NULL;
            n->kind = N_NSREF;
            n->name = make_name(t);
            n->attr = make_name(a);
        } else {
            n->kind = N_NAME;
            n->name = make_name(t);
        }
        return n;
    case JT_STRING: {
        size_t total = 0, k = p->i;
        while (p->t[k].type == JT_STRING)
            total += p->t[k++].len;
        char *buf = jarena_alloc(p->arena, total + 1), *w = buf;
        if (!buf || !(n = new_node(p, N_CONST, t)))
            return nomem(p);
        while (cur(p)->type == JT_STRING) {
            memcpy(w, cur(p)->s, cur(p)->len);
            w += cur(p)->len;
            advance(p);
        }
        n->cval = jv_str_immortal(p->arena, buf, total);
        if (n->cval.t != JV_STR)
            return nomem(p);
        return n;
    }
    case JT_INT:
    case JT_FLOAT:
        advance(p);
        if (!(n = new_node(p, N_CONST, t)))
            return NULL;
        n->cval = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case JT_LPAREN:
        advance(p);
        n = parse_tuple(p, false, true, NULL, true, false);
        if (!n || !expect(p, JT_RPAREN))
            return NULL;
        return n;
    case JT_LBRACKET:
        return parse_list(p);
    case JT_LBRACE:
        return parse_dict(p);
    default:
        if (t->type == JT_EOF)
            return FAIL(p, "unexpected end of template");
        return FAIL(p, "unexpected '%s'", jinja__tok_describe(t, b, sizeof b));
    }
}

static bool is_tuple_end(parser *p, const char *extra_end)
{
    jtok *t = cur(p);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || t->type == JT_RPAREN)
        return true;
    return extra_end && is_name(t, extra_end);
}

static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr,
                          const char *extra_end, bool explicit_parens, bool with_ns)
{
    jtok *start = cur(p);
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect(p, JT_COMMA))
            return NULL;
        if (is_tuple_end(p, extra_end))
            break;
        jnode *x = simplified ? parse_primary(p, with_ns) : parse_expression(p, with_condexpr);
        if (!x || !nvec_push(p, &args, x))
            return NULL;
        if (cur(p)->type == JT_COMMA)
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens) {
            char b[80];
            return FAIL(p, "Expected an expression, got '%s'",
                        jinja__tok_describe(cur(p), b, sizeof b));
        }
    }
    jnode *n = new_node(p, N_TUPLE, start);
    if (!n)
        return NULL;
    n->items = args.v;
    n->n_items = args.n;
    return n;
}

static bool can_assign(const jnode *n)
{
    if (n->kind == N_NAME || n->kind == N_NSREF)
        return true;
    if (n->kind != N_TUPLE)
        return false;
    for (uint32_t i = 0; i < n->n_items; i++)
        if (!can_assign(n->items[i]) || n->items[i]->kind == N_NSREF)
            return false;
    return true;
}

static jnode *parse_assign_target(parser *p, const char *extra_end, bool with_ns)
{
    jtok *t = cur(p);
    jnode *n = parse_tuple(p, true, true, extra_end, false, with_ns);
    if (!n)
        return NULL;
    if (!can_assign(n)) {
        const char *what = n->kind == N_CONST ? "const" : n->kind == N_LIST ? "list"
                         : n->kind == N_DICT ? "dict" : "tuple";
        return fail_tok(p, t, RC_EFORMAT, "TemplateSyntaxError: can't assign to '%s'", what);
    }
    return n;
}

/* ---- statements ------------------------------------------------------------- */

static jnode *subparse(parser *p, const char *const *end_tokens);

static jnode *fail_unknown(parser *p, const jtok *at, const char *name)
{
    char msg[512];
    size_t l = 0;
    if (name)
        l += (size_t)snprintf(msg + l, sizeof msg - l, "Encountered unknown tag '%s'.", name);
    else
        l += (size_t)snprintf(msg + l, sizeof msg - l, "Unexpected end of template.");
    if (p->n_ends > 0) {
        const char *const *e = p->ends[p->n_ends - 1];
        bool expected = false;
        for (int s = 0; s < p->n_ends && name; s++)
            for (const char *const *x = p->ends[s]; *x; x++)
                if (strcmp(*x, name) == 0)
                    expected = true;
        l += (size_t)snprintf(msg + l, sizeof msg - l, expected
                              ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for "
                              : " Jinja was looking for the following tags: ");
        for (int k = 0; e[k] && l < sizeof msg; k++)
            l += (size_t)snprintf(msg + l, sizeof msg - l, "%s'%s'", k ? " or " : "", e[k]);
        if (l < sizeof msg)
            l += (size_t)snprintf(msg + l, sizeof msg - l, ".");
    }
    if (p->n_tags > 0 && l < sizeof msg)
        snprintf(msg + l, sizeof msg - l, " The innermost block that needs to be closed is '%s'.",
                 p->tags[p->n_tags - 1]);
    return fail_tok(p, at, RC_EFORMAT, "TemplateSyntaxError: %s", msg);
}

/* Parses a block body after the statement's own tokens; stops at one of
 * `ends` (left current, or consumed when drop_needle). */
static jnode *parse_statements(parser *p, const char *const *ends, bool drop_needle)
{
    skip_type(p, JT_COLON);
    if (!expect(p, JT_BLOCK_END))
        return NULL;
    jnode *body = subparse(p, ends);
    if (!body)
        return NULL;
    if (cur(p)->type == JT_EOF) {
        if (p->n_ends < MAX_END_SETS)
            p->ends[p->n_ends++] = ends;
        return fail_unknown(p, cur(p), NULL);
    }
    if (drop_needle)
        advance(p);
    return body;
}

static bool parse_signature(parser *p, jnode *n)
{
    nvec args = {0}, defs = {0};
    bool any_default = false;
    if (!expect(p, JT_LPAREN))
        return false;
    while (cur(p)->type != JT_RPAREN) {
        if (args.n && !expect(p, JT_COMMA))
            return false;
        jtok *t = cur(p);
        if (!expect(p, JT_NAME))
            return false;
        jnode *a = new_node(p, N_NAME, t), *d = NULL;
        if (!a)
            return false;
        a->name = make_name(t);
        if (skip_type(p, JT_ASSIGN)) {
            if (!(d = parse_expression(p, true)))
                return false;
            any_default = true;
        } else if (any_default) {
            FAIL(p, "non-default argument follows default argument");
            return false;
        }
        if (!nvec_push(p, &args, a) || !nvec_push(p, &defs, d))
            return false;
    }
    if (!expect(p, JT_RPAREN))
        return false;
    n->items = args.v;
    n->n_items = args.n;
    n->kwvals = defs.v;
    n->n_kw = defs.n;
    return true;
}

/* Sets NF_VARARGS/KWARGS/CALLER when the body refers to those names. */
static void scan_special(const jnode *n, uint8_t *flags, int depth)
{
    if (!n || depth > JX_MAX_TREE_DEPTH)
        return;     /* too deep: the parse fails later anyway */
    if (n->kind == N_NAME) {
        if (strcmp(n->name.s, "varargs") == 0)
            *flags |= NF_VARARGS;
        else if (strcmp(n->name.s, "kwargs") == 0)
            *flags |= NF_KWARGS;
        else if (strcmp(n->name.s, "caller") == 0)
            *flags |= NF_CALLER;
    }
    scan_special(n->a, flags, depth + 1);
    scan_special(n->b, flags, depth + 1);
    scan_special(n->c, flags, depth + 1);
    scan_special(n->d, flags, depth + 1);
    scan_special(n->e, flags, depth + 1);
    for (uint32_t i = 0; i < n->n_items; i++)
        scan_special(n->items[i], flags, depth + 1);
    for (uint32_t i = 0; i < n->n_kw; i++)
        scan_special(n->kwvals[i], flags, depth + 1);
}

static jnode *parse_for(parser *p, jtok *t)
{
    static const char *const body_end[] = {"endfor", "else", NULL};
    static const char *const else_end[] = {"endfor", NULL};
    jnode *n = new_node(p, N_FOR, t);
    if (!n || !(n->a = parse_assign_target(p, "in", false)) || !expect_name(p, "in"))
        return NULL;
    if (!(n->b = parse_tuple(p, false, false, "recursive", false, false)))
        return NULL;
    bool saved = p->soft;
    p->soft = false;            /* the loop's own frame */
    jnode *r = NULL;
    if (skip_name(p, "if") && !(n->e = parse_expression(p, true)))
        goto out;
    if (skip_name(p, "recursive"))
        n->flags |= NF_RECURSIVE;
    p->loop_depth++;
    n->c = parse_statements(p, body_end, false);
    p->loop_depth--;
    if (!n->c)
        goto out;
    bool is_end = is_name(cur(p), "endfor");
    advance(p);
    if (!is_end && !(n->d = parse_statements(p, else_end, true)))
        goto out;
    r = n;
out:
    p->soft = saved;
    return r;
}

static jnode *parse_if_soft(parser *p, jtok *t);

static jnode *parse_if(parser *p, jtok *t)
{
    bool saved = p->soft;
    p->soft = true;
    jnode *n = parse_if_soft(p, t);
    p->soft = saved;
    return n;
}

static jnode *parse_if_soft(parser *p, jtok *t)
{
    static const char *const body_end[] = {"elif", "else", "endif", NULL};
    static const char *const else_end[] = {"endif", NULL};
    jnode *result = new_node(p, N_IF, t), *node = result;
    if (!result)
        return NULL;
    for (;;) {
        if (!(node->a = parse_tuple(p, false, false, NULL, false, false)))
            return NULL;
        if (!(node->b = parse_statements(p, body_end, false)))
            return NULL;
        jtok *k = cur(p);
        advance(p);
        if (is_name(k, "elif")) {
            jnode *next = new_node(p, N_IF, cur(p));
            if (!next)
                return NULL;
            node->c = next;
            node = next;
            continue;
        }
        if (is_name(k, "else") && !(node->c = parse_statements(p, else_end, true)))
            return NULL;
        return result;
    }
}

static jnode *parse_set(parser *p, jtok *t)
{
    static const char *const ends[] = {"endset", NULL};
    jnode *target = parse_assign_target(p, NULL, true);
    if (!target)
        return NULL;
    if (skip_type(p, JT_ASSIGN)) {
        jnode *n = new_node(p, N_SET, t);
        if (!n || !(n->b = parse_tuple(p, false, true, NULL, false, false)))
            return NULL;
        n->a = target;
        return n;
    }
    jnode *n = new_node(p, N_SETBLOCK, t);
    if (!n)
        return NULL;
    n->a = target;
    bool saved = p->soft;
    p->soft = false;
    if ((cur(p)->type != JT_PIPE || (n->c = parse_filter(p, NULL, false))))
        n->b = parse_statements(p, ends, true);
    p->soft = saved;
    return n->b ? n : NULL;
}

static jnode *parse_macro_like(parser *p, jtok *t, bool is_call)
{
    static const char *const macro_end[] = {"endmacro", NULL};
    static const char *const call_end[] = {"endcall", NULL};
    jnode *n = new_node(p, is_call ? N_CALLBLOCK : N_MACRO, t);
    bool saved = p->soft, ok;
    if (!n)
        return NULL;
    if (is_call) {
        p->soft = false;
        ok = cur(p)->type != JT_LPAREN || parse_signature(p, n);
        p->soft = saved;
        if (!ok)
            return NULL;
        jtok *c = cur(p);
        if (!(n->a = parse_expression(p, true)))
            return NULL;
        if (n->a->kind != N_CALL)
            return fail_tok(p, c, RC_EFORMAT, "TemplateSyntaxError: expected call");
    } else {
        jtok *nm = cur(p);
        if (!expect(p, JT_NAME))
            return NULL;
        n->name = make_name(nm);
        p->soft = false;
        ok = parse_signature(p, n);
        p->soft = saved;
        if (!ok)
            return NULL;
    }
    int saved_loop = p->loop_depth;
    p->loop_depth = 0;
    p->soft = false;
    n->b = parse_statements(p, is_call ? call_end : macro_end, true);
    p->soft = saved;
    p->loop_depth = saved_loop;
    if (!n->b)
        return NULL;
    scan_special(n->b, &n->flags, 0);
    return n;
}

static jnode *parse_with(parser *p, jtok *t)
{
    static const char *const ends[] = {"endwith", NULL};
    nvec targets = {0}, values = {0};
    jnode *n = new_node(p, N_WITH, t);
    if (!n)
        return NULL;
    while (cur(p)->type != JT_BLOCK_END) {
        if (targets.n && !expect(p, JT_COMMA))
            return NULL;
        jnode *tg = parse_assign_target(p, NULL, false);
        if (!tg || !expect(p, JT_ASSIGN))
            return NULL;
        jnode *v = parse_expression(p, true);
        if (!v || !nvec_push(p, &targets, tg) || !nvec_push(p, &values, v))
            return NULL;
    }
    n->items = targets.v;
    n->n_items = targets.n;
    n->kwvals = values.v;
    n->n_kw = values.n;
    bool saved = p->soft;
    p->soft = false;
    n->b = parse_statements(p, ends, true);
    p->soft = saved;
    return n->b ? n : NULL;
}

static jnode *parse_statement(parser *p)
{
    static const char *const filter_end[] = {"endfilter", NULL};
    static const char *const block_end[] = {"endblock", NULL};
    static const char *const gen_end[] = {"endgeneration", NULL};
    jtok *t = cur(p);
    char name[64];
    if (t->type != JT_NAME)
        return FAIL(p, "tag name expected");
    snprintf(name, sizeof name, "%.*s", (int)(t->len < 63 ? t->len : 63), t->s);
    if (p->n_tags >= MAX_END_SETS)
        return fail_tok(p, t, RC_ELIMIT, "LimitError: template nested too deeply");
    p->tags[p->n_tags++] = t->s;
    jnode *n = NULL;
    if (!enter(p)) {
        p->n_tags--;
        return NULL;
    }
    bool saved_soft = p->soft;
    if (strcmp(name, "filter") == 0 || strcmp(name, "block") == 0 ||
        strcmp(name, "generation") == 0)
        p->soft = false;    /* bodies that jinja2 compiles in a frame of their own */
    if (strcmp(name, "for") == 0) {
        advance(p);
        n = parse_for(p, t);
    } else if (strcmp(name, "if") == 0) {
        advance(p);
        n = parse_if(p, t);
    } else if (strcmp(name, "set") == 0) {
        advance(p);
        n = parse_set(p, t);
    } else if (strcmp(name, "macro") == 0 || strcmp(name, "call") == 0) {
        advance(p);
        n = parse_macro_like(p, t, name[0] == 'c');
    } else if (strcmp(name, "filter") == 0) {
        advance(p);
        if ((n = new_node(p, N_FILTERBLOCK, t)) &&
            (n->a = parse_filter(p, NULL, true)))
            n->b = parse_statements(p, filter_end, true);
        if (n && !n->b)
            n = NULL;
    } else if (strcmp(name, "with") == 0) {
        advance(p);
        n = parse_with(p, t);
    } else if (strcmp(name, "block") == 0) {
        advance(p);
        jtok *bn = cur(p);
        if (expect(p, JT_NAME)) {
            skip_name(p, "scoped");
            skip_name(p, "required");
            if ((n = new_node(p, N_SCOPE, t)) &&
                (n->b = parse_statements(p, block_end, true))) {
                char bname[64];
                snprintf(bname, sizeof bname, "%.*s", (int)(bn->len < 63 ? bn->len : 63), bn->s);
                skip_name(p, bname);
            } else {
                n = NULL;
            }
        }
    } else if (strcmp(name, "generation") == 0) {
        advance(p);
        int saved = p->loop_depth;
        p->loop_depth = 0;
        if ((n = new_node(p, N_SCOPE, t)) && !(n->b = parse_statements(p, gen_end, true)))
            n = NULL;
        p->loop_depth = saved;
    } else if (strcmp(name, "print") == 0) {
        advance(p);
        nvec outs = {0};
        while (cur(p)->type != JT_BLOCK_END) {
            if (outs.n && !expect(p, JT_COMMA))
                goto out;
            jnode *e = parse_expression(p, true), *o;
            if (!e || !(o = new_node(p, N_OUTPUT, t)))
                goto out;
            o->a = e;
            if (!nvec_push(p, &outs, o))
                goto out;
        }
        if ((n = new_node(p, N_BODY, t))) {
            n->items = outs.v;
            n->n_items = outs.n;
        }
    } else if (strcmp(name, "break") == 0 || strcmp(name, "continue") == 0) {
        if (p->loop_depth == 0) {
            FAIL(p, "'%s' outside loop", name);
        } else {
            advance(p);
            n = new_node(p, name[0] == 'b' ? N_BREAK : N_CONTINUE, t);
        }
    } else if (strcmp(name, "extends") == 0 || strcmp(name, "include") == 0 ||
               strcmp(name, "import") == 0 || strcmp(name, "from") == 0 ||
               strcmp(name, "autoescape") == 0) {
        fail_tok(p, t, RC_EFORMAT,
                 "TemplateSyntaxError: the '%s' tag is not supported in chat templates", name);
    } else {
        p->soft = saved_soft;
        p->n_tags--;
        leave(p);
        return fail_unknown(p, t, name);
    }
out:
    p->soft = saved_soft;
    leave(p);
    p->n_tags--;
    return n;
}

static jnode *subparse(parser *p, const char *const *end_tokens)
{
    nvec body = {0};
    jtok *first = cur(p);
    if (end_tokens) {
        if (p->n_ends >= MAX_END_SETS)
            return fail_tok(p, first, RC_ELIMIT, "LimitError: template nested too deeply");
        p->ends[p->n_ends++] = end_tokens;
    }
    jnode *result = NULL;
    for (;;) {
        jtok *t = cur(p);
        if (t->type == JT_EOF)
            break;
        if (t->type == JT_DATA) {
            jnode *d = new_node(p, N_DATA, t);
            if (!d)
                goto done;
            d->cval = jv_str_immortal(p->arena, t->s, t->len);
            if (d->cval.t != JV_STR) {
                nomem(p);
                goto done;
            }
            if (!nvec_push(p, &body, d))
                goto done;
            advance(p);
        } else if (t->type == JT_VAR_BEGIN) {
            advance(p);
            jnode *e = parse_tuple(p, false, true, NULL, false, false), *o;
            if (!e || !(o = new_node(p, N_OUTPUT, t)))
                goto done;
            o->a = e;
            if (!expect(p, JT_VAR_END) || !nvec_push(p, &body, o))
                goto done;
        } else if (t->type == JT_BLOCK_BEGIN) {
            advance(p);
            if (end_tokens) {
                bool hit = false;
                for (const char *const *e = end_tokens; *e; e++)
                    if (is_name(cur(p), *e))
                        hit = true;
                if (hit)
                    break;
            }
            jnode *s = parse_statement(p);
            if (!s || !expect(p, JT_BLOCK_END) || !nvec_push(p, &body, s))
                goto done;
        } else {
            char b[80];
            FAIL(p, "unexpected '%s'", jinja__tok_describe(t, b, sizeof b));
            goto done;
        }
    }
    if ((result = new_node(p, N_BODY, first))) {
        result->items = body.v;
        result->n_items = body.n;
    }
done:
    if (end_tokens)
        p->n_ends--;
    return result;
}

/* ---- constant folding --------------------------------------------------------- */

/* jinja2's optimizer evaluates constant subexpressions at compile time with
 * slightly different rules (a slice goes through environment.getitem, so
 * `3[1:]` folds to undefined instead of raising).  Marks with NF_FOLD the
 * constant subtrees that contain a slice, the only place this shows; the
 * evaluator tries those in folding mode first.  Returns via *is_const and
 * *has_slice whether n qualifies.  False when the tree is deeper than
 * JX_MAX_TREE_DEPTH: then the parse fails, which keeps every recursive walk
 * of the tree (here, symbol resolution, evaluation) within a bounded stack. */
static bool mark_fold(jnode *n, int depth, bool *is_const, bool *has_slice)
{
    bool c = true, s = false;
    *is_const = false;
    *has_slice = false;
    if (!n)
        return true;
    if (depth > JX_MAX_TREE_DEPTH)
        return false;   /* every later pass relies on this bound */
    jnode *kids[5] = {n->a, n->b, n->c, n->d, n->e};
    for (int i = 0; i < 5; i++) {
        bool kc = true, ks = false;
        if (kids[i] && !mark_fold(kids[i], depth + 1, &kc, &ks))
            return false;
        c = c && kc;
        s = s || ks;
    }
    for (uint32_t i = 0; i < n->n_items; i++) {
        bool kc, ks;
        if (!mark_fold(n->items[i], depth + 1, &kc, &ks))
            return false;
        c = c && kc;
        s = s || ks;
    }
    for (uint32_t i = 0; i < n->n_kw; i++) {
        bool kc = true, ks = false;
        if (n->kwvals[i] && !mark_fold(n->kwvals[i], depth + 1, &kc, &ks))
            return false;
        c = c && kc;
        s = s || ks;
    }
    switch (n->kind) {
    case N_CONST: case N_LIST: case N_TUPLE: case N_DICT: case N_GETATTR: case N_SLICE:
    case N_BINOP: case N_CONCAT: case N_NEG: case N_POS: case N_NOT: case N_AND: case N_OR:
    case N_COMPARE: case N_OPERAND: case N_CONDEXPR:
        break;
    case N_GETITEM:
        s = s || n->b->kind == N_SLICE;
        break;
    case N_FILTER:
        c = c && n->a && !n->d && !n->e && jinja__filter_foldable(n->fid);
        break;
    case N_TEST:
        c = c && n->fid >= 0 && !n->d && !n->e;
        break;
    default:
        c = false;
    }
    if (c && s && n->kind != N_OPERAND && n->kind != N_SLICE)
        n->flags |= NF_FOLD;
    *is_const = c;
    *has_slice = s;
    return true;
}

/* ---- symbol resolution ---------------------------------------------------------- */

/* jinja2 resolves names at compile time, per frame (the template, a loop
 * body, a macro, a block...), and that is visible in one case: a name a
 * frame assigns before it reads it (and that no enclosing frame knows)
 * starts out undefined in that frame, even if the render variables hold
 * it - `{% for x in y %}{{ s }}{% endfor %}{% set s = 1 %}` prints nothing
 * for s.  This pass mirrors jinja2's idtracking.py (stores, loads, and
 * the merge of if-branches) and records those names on each frame's body
 * (jnode.shadow); the evaluator declares them when the frame starts. */

enum { M_PARAM, M_RESOLVE, M_ALIAS, M_UNDEF };

typedef struct sref { const char *name; uint8_t mode; } sref;

typedef struct symtab {
    sref        *refs;
    uint32_t     n, cap;
    const char **st;            /* names stored in this frame */
    uint32_t     n_st, cap_st;
    const struct symtab *parent;
    bool         oom;
} symtab;

static sref *tab_own(const symtab *t, const char *name)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (strcmp(t->refs[i].name, name) == 0)
            return &t->refs[i];
    return NULL;
}

static bool tab_known(const symtab *t, const char *name)
{
    for (; t; t = t->parent)
        if (tab_own(t, name))
            return true;
    return false;
}

static void tab_set(symtab *t, const char *name, uint8_t mode)
{
    sref *r = tab_own(t, name);
    if (r) {
        r->mode = mode;
        return;
    }
    if (t->n == t->cap) {
        uint32_t nc = t->cap ? t->cap * 2 : 16;
        sref *nr = rc_realloc(t->refs, nc * sizeof *nr);
        if (!nr) {
            t->oom = true;
            return;
        }
        t->refs = nr;
        t->cap = nc;
    }
    t->refs[t->n].name = name;
    t->refs[t->n++].mode = mode;
}

static bool tab_stored(const symtab *t, const char *name)
{
    for (uint32_t i = 0; i < t->n_st; i++)
        if (strcmp(t->st[i], name) == 0)
            return true;
    return false;
}

static void tab_add_store(symtab *t, const char *name)
{
    if (tab_stored(t, name))
        return;
    if (t->n_st == t->cap_st) {
        uint32_t nc = t->cap_st ? t->cap_st * 2 : 16;
        const char **ns = rc_realloc(t->st, nc * sizeof *ns);
        if (!ns) {
            t->oom = true;
            return;
        }
        t->st = ns;
        t->cap_st = nc;
    }
    t->st[t->n_st++] = name;
}

static void tab_load(symtab *t, const char *name)
{
    if (!tab_known(t, name))
        tab_set(t, name, M_RESOLVE);
}

static void tab_store(symtab *t, const char *name)
{
    tab_add_store(t, name);
    if (!tab_own(t, name))
        tab_set(t, name, t->parent && tab_known(t->parent, name) ? M_ALIAS : M_UNDEF);
}

static void tab_param(symtab *t, const char *name)
{
    tab_add_store(t, name);
    tab_set(t, name, M_PARAM);
}

static void tab_free(symtab *t)
{
    rc_free(t->refs);
    rc_free(t->st);
}

static bool tab_clone(const symtab *src, symtab *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->parent = src->parent;
    for (uint32_t i = 0; i < src->n; i++)
        tab_set(dst, src->refs[i].name, src->refs[i].mode);
    for (uint32_t i = 0; i < src->n_st; i++)
        tab_add_store(dst, src->st[i]);
    return !dst->oom;
}

static void sym_expr(symtab *t, const jnode *n)
{
    if (!n)
        return;
    if (n->kind == N_NAME || n->kind == N_NSREF)
        tab_load(t, n->name.s);
    sym_expr(t, n->a);
    sym_expr(t, n->b);
    sym_expr(t, n->c);
    sym_expr(t, n->d);
    sym_expr(t, n->e);
    for (uint32_t i = 0; i < n->n_items; i++)
        sym_expr(t, n->items[i]);
    for (uint32_t i = 0; i < n->n_kw; i++)
        sym_expr(t, n->kwvals[i]);
}

static void sym_target(symtab *t, const jnode *n)
{
    if (n->kind == N_NAME)
        tab_store(t, n->name.s);
    else if (n->kind == N_NSREF)
        tab_load(t, n->name.s);
    else
        for (uint32_t i = 0; i < n->n_items; i++)
            sym_target(t, n->items[i]);
}

static void sym_stmt(symtab *t, const jnode *n);

static void sym_body(symtab *t, const jnode *body)
{
    if (body)
        for (uint32_t i = 0; i < body->n_items; i++)
            sym_stmt(t, body->items[i]);
}

/* jinja2's branch_update: a name first assigned inside an if statement is
 * looked up (in the render variables, or an enclosing frame) until then,
 * instead of starting undefined. */
static void sym_merge(symtab *t, symtab br[3])
{
    symtab before;
    if (!tab_clone(t, &before)) {
        t->oom = true;
        tab_free(&before);
        return;
    }
    for (int b = 0; b < 3; b++) {
        for (uint32_t i = 0; i < br[b].n; i++)
            tab_set(t, br[b].refs[i].name, br[b].refs[i].mode);
        for (uint32_t i = 0; i < br[b].n_st; i++)
            tab_add_store(t, br[b].st[i]);
        t->oom |= br[b].oom;
    }
    for (int b = 0; b < 3; b++)
        for (uint32_t i = 0; i < br[b].n_st; i++)
            if (!tab_stored(&before, br[b].st[i]))
                tab_set(t, br[b].st[i],
                        t->parent && tab_known(t->parent, br[b].st[i]) ? M_ALIAS : M_RESOLVE);
    tab_free(&before);
}

static void sym_if(symtab *t, const jnode *n, bool simple)
{
    symtab br[3];
    sym_expr(t, n->a);
    for (int b = 0; b < 3; b++)
        tab_clone(t, &br[b]);
    sym_body(&br[0], n->b);
    if (!simple) {
        const jnode *e = n->c;
        for (; e && e->kind == N_IF; e = e->c)
            sym_if(&br[1], e, true);   /* each elif on its own */
        if (e)
            sym_body(&br[2], e);
    }
    sym_merge(t, br);
    for (int b = 0; b < 3; b++)
        tab_free(&br[b]);
}

static void sym_stmt(symtab *t, const jnode *n)
{
    switch (n->kind) {
    case N_BODY:
        sym_body(t, n);
        break;
    case N_OUTPUT:
        sym_expr(t, n->a);
        break;
    case N_IF:
        sym_if(t, n, false);
        break;
    case N_FOR:
        sym_expr(t, n->b);
        break;
    case N_SET:
        sym_expr(t, n->b);
        sym_target(t, n->a);
        break;
    case N_SETBLOCK:
        sym_target(t, n->a);
        break;
    case N_MACRO:
        tab_store(t, n->name.s);
        break;
    case N_CALLBLOCK:
    case N_FILTERBLOCK:
        sym_expr(t, n->a);
        break;
    case N_WITH:
        for (uint32_t i = 0; i < n->n_kw; i++)
            sym_expr(t, n->kwvals[i]);
        break;
    default:
        break;
    }
}

static bool frame_of(parser *p, jnode *body, const symtab *parent, const jnode *owner);

/* Analyses the frames nested in a frame's statements (inside ifs too). */
static bool nested_frames(parser *p, const jnode *n, const symtab *t)
{
    if (!n)
        return true;
    switch (n->kind) {
    case N_BODY:
        for (uint32_t i = 0; i < n->n_items; i++)
            if (!nested_frames(p, n->items[i], t))
                return false;
        return true;
    case N_IF:
        return nested_frames(p, n->b, t) && nested_frames(p, n->c, t);
    case N_FOR:
        return frame_of(p, n->c, t, n) && (!n->d || frame_of(p, n->d, t, NULL));
    case N_MACRO:
    case N_CALLBLOCK:
    case N_WITH:
        return frame_of(p, n->b, t, n);
    case N_SETBLOCK:
    case N_FILTERBLOCK:
    case N_SCOPE:
        return frame_of(p, n->b, t, NULL);
    default:
        return true;
    }
}

/* Analyses one frame: `owner` supplies its parameters (loop targets,
 * macro arguments, with targets). */
static bool frame_of(parser *p, jnode *body, const symtab *parent, const jnode *owner)
{
    symtab t;
    memset(&t, 0, sizeof t);
    t.parent = parent;
    if (owner && owner->kind == N_FOR) {
        sym_target(&t, owner->a);
        for (uint32_t i = 0; i < t.n; i++)
            t.refs[i].mode = M_PARAM;
        tab_param(&t, "loop");
    } else if (owner && (owner->kind == N_MACRO || owner->kind == N_CALLBLOCK)) {
        for (uint32_t i = 0; i < owner->n_items; i++)
            tab_param(&t, owner->items[i]->name.s);
        for (uint32_t i = 0; i < owner->n_kw; i++)
            sym_expr(&t, owner->kwvals[i]);
        if (owner->flags & NF_CALLER)
            tab_param(&t, "caller");
        if (owner->flags & NF_KWARGS)
            tab_param(&t, "kwargs");
        if (owner->flags & NF_VARARGS)
            tab_param(&t, "varargs");
    } else if (owner && owner->kind == N_WITH) {
        for (uint32_t i = 0; i < owner->n_items; i++)
            sym_target(&t, owner->items[i]);
        for (uint32_t i = 0; i < t.n; i++)
            t.refs[i].mode = M_PARAM;
    }
    sym_body(&t, body);
    uint32_t n_undef = 0;
    for (uint32_t i = 0; i < t.n; i++)
        n_undef += t.refs[i].mode == M_UNDEF;
    bool ok = !t.oom;
    if (ok && n_undef) {
        body->shadow = jarena_alloc(p->arena, n_undef * sizeof *body->shadow);
        if (!body->shadow) {
            ok = false;
        } else {
            for (uint32_t i = 0; i < t.n; i++) {
                if (t.refs[i].mode != M_UNDEF)
                    continue;
                const char *nm = t.refs[i].name;
                body->shadow[body->n_shadow].s = nm;
                body->shadow[body->n_shadow++].hash = jinja__hash_name(nm, strlen(nm));
            }
        }
    }
    if (ok)
        ok = nested_frames(p, body, &t);
    tab_free(&t);
    return ok;
}

/* ---- the template object -------------------------------------------------- */

int jinja_parse(const char *src, size_t len, jinja_template **out)
{
    *out = NULL;
    if (len > JX_MAX_SOURCE_BYTES)
        return rc_fail(RC_ELIMIT, "LimitError: template source is %zu bytes, more than %u",
                       len, JX_MAX_SOURCE_BYTES);
    if (!ju_valid(src, len))
        return rc_fail(RC_EFORMAT, "TemplateSyntaxError: template source is not valid UTF-8");
    jinja_template *t = rc_calloc(1, sizeof *t);
    if (!t)
        return rc_fail(RC_ENOMEM, "MemoryError: out of memory while parsing");
    jtok *toks = NULL;
    size_t n_toks = 0;
    int rc;

    /* newlines -> "\n", one trailing newline dropped */
    char *norm = jarena_alloc(&t->arena, len + 1);
    size_t n = 0;
    if (!norm) {
        rc = rc_fail(RC_ENOMEM, "MemoryError: out of memory while parsing");
        goto fail;
    }
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n > 0 && norm[n - 1] == '\n')
        n--;

    if ((rc = jinja__lex(norm, n, &t->arena, &toks, &n_toks)) < 0)
        goto fail;
    parser p;
    memset(&p, 0, sizeof p);
    p.t = toks;
    p.n = n_toks;
    p.arena = &t->arena;
    t->root = subparse(&p, NULL);
    if (!t->root) {
        rc = p.rc ? p.rc : rc_fail(RC_EFORMAT, "TemplateSyntaxError: invalid template");
        goto fail;
    }
    bool is_const, has_slice;
    if (!mark_fold(t->root, 0, &is_const, &has_slice)) {
        rc = rc_fail(RC_ELIMIT, "LimitError: template syntax tree deeper than %d levels "
                     "(a very long chain of operators or filters?)", JX_MAX_TREE_DEPTH);
        goto fail;
    }
    if (!frame_of(&p, t->root, NULL, NULL)) {
        rc = rc_fail(RC_ENOMEM, "MemoryError: out of memory while parsing");
        goto fail;
    }
    if (p.unknown) {
        rc = rc_fail(RC_EFORMAT, "TemplateAssertionError: No %s named '%s'. (line %u, column %u)",
                     p.unknown->kind == N_FILTER ? "filter" : "test", p.unknown->name.s,
                     p.unknown->line, p.unknown->col);
        goto fail;
    }
    rc_free(toks);
    *out = t;
    return 0;
fail:
    rc_free(toks);
    jinja_free(t);
    return rc;
}

void jinja_free(jinja_template *tpl)
{
    if (!tpl)
        return;
    jarena_free(&tpl->arena);
    rc_free(tpl);
}
