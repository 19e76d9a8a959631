/* jinja_internal.h - what the jinja_*.c files share: tokens, the syntax
 * tree, run-time values, scopes and the render state.
 *
 * Layout of the engine (one concern per file):
 *   jinja_unicode.c  UTF-8 and the few Unicode tables Python semantics need
 *   jinja_lex.c      source -> tokens (whitespace control, raw, comments)
 *   jinja_parse.c    tokens -> tree (jinja2's grammar), the template object
 *   jinja_value.c    values: allocation, reference counts, str()/repr(),
 *                    equality, ordering, hashing, dicts, JSON in and out
 *   jinja_eval.c     statements and expressions, scopes, macros, loops
 *   jinja_filters.c  filters and tests
 *   jinja_str.c      Python str methods, escaping, % and str.format
 *   jinja_methods.c  attribute/item access, list/dict methods, globals
 *
 * Value ownership: a `jv` holding a heap object owns one reference.
 * Functions that produce a value (`jv *out`) hand the caller a new
 * reference; functions that take a `jv` argument borrow it unless their
 * name ends in _take.  Objects are freed when their count drops to zero;
 * containers are also linked into the render's list so that reference
 * cycles (a list appended to itself) are reclaimed when the render ends.
 * Strings that belong to the parsed tree are immortal (never counted), so
 * a template can be rendered by many threads at once.
 *
 * Every fallible function returns 0 or a negative RC_E* code and records
 * the message with rc_fail; statements may also return the positive
 * JX_BREAK / JX_CONTINUE to unwind to their loop.
 */
#ifndef RC_JINJA_INTERNAL_H
#define RC_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "jinja/jinja.h"

/* ---- limits that are not per-render ---------------------------------- */

#define JX_MAX_SOURCE_BYTES  (4u << 20)  /* template source */
#define JX_MAX_PARSE_DEPTH   100         /* nested expressions and blocks */
#define JX_MAX_TREE_DEPTH    1000        /* syntax tree depth (long a+b+... chains) */
#define JX_MAX_VALUE_DEPTH   200         /* repr/==/tojson of nested values */
#define JX_MAX_RANGE         100000      /* jinja2 sandbox's MAX_RANGE */

enum { JX_BREAK = 1, JX_CONTINUE = 2 };

/* ---- Unicode (jinja_unicode.c) ---------------------------------------- */

/* Decodes the code point at s[*i] (valid UTF-8 assumed) and advances *i. */
uint32_t ju_next(const char *s, size_t *i);
/* Encodes `cp` into out (4 bytes room); returns the byte count. */
size_t ju_encode(uint32_t cp, char *out);
/* Number of code points in valid UTF-8 text. */
size_t ju_count(const char *s, size_t len);
/* Byte offset of code point `idx` (idx <= count). */
size_t ju_offset(const char *s, size_t len, size_t idx);
/* Whether `len` bytes are well-formed UTF-8 (no surrogates, <= U+10FFFF). */
bool ju_valid(const char *s, size_t len);
/* Python's str.isspace / isprintable / case mapping for one code point. */
bool ju_isspace(uint32_t cp);
bool ju_isprintable(uint32_t cp);
bool ju_isalpha(uint32_t cp);
bool ju_isdigit(uint32_t cp);
bool ju_islower(uint32_t cp);
bool ju_isupper(uint32_t cp);
uint32_t ju_tolower(uint32_t cp);
uint32_t ju_toupper(uint32_t cp);

/* ---- tokens (jinja_lex.c) ---------------------------------------------- */

typedef enum {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT,
    JT_ADD, JT_SUB, JT_DIV, JT_FLOORDIV, JT_MUL, JT_POW, JT_MOD, JT_TILDE,
    JT_LBRACKET, JT_RBRACKET, JT_LPAREN, JT_RPAREN, JT_LBRACE, JT_RBRACE,
    JT_EQ, JT_NE, JT_GT, JT_GTEQ, JT_LT, JT_LTEQ, JT_ASSIGN, JT_DOT,
    JT_COLON, JT_PIPE, JT_COMMA, JT_SEMICOLON
} jtok_type;

typedef struct jtok {
    uint8_t     type;
    uint32_t    line, col;      /* 1-based position of the token's start */
    const char *s;              /* DATA, NAME: text; STRING: decoded value */
    size_t      len;
    int64_t     i;              /* INT */
    double      f;              /* FLOAT */
} jtok;

/* A bump allocator owned by the template: tokens' decoded strings and the
 * tree live here and are freed together. */
typedef struct jarena {
    struct jarena_chunk *head;
    char  *cur;
    size_t left;
} jarena;

void *jarena_alloc(jarena *a, size_t bytes);   /* 16-byte aligned, zeroed */
void  jarena_free(jarena *a);

/* Tokenizes normalized source (newlines already "\n"); *toks is an
 * rc_malloc'd array ending with JT_EOF.  Syntax errors -> RC_EFORMAT. */
int jinja__lex(const char *src, size_t len, jarena *arena, jtok **toks,
               size_t *n_toks);

/* Python repr of a token type for error messages ("'}'", "end of print
 * statement", ...). */
const char *jinja__tok_describe(const jtok *t, char *buf, size_t cap);

/* ---- values (jinja_value.c) -------------------------------------------- */

typedef enum {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT,           /* immediate */
    JV_STR, JV_LIST, JV_TUPLE, JV_DICT, JV_NS, JV_ITER, JV_FUNC,  /* heap */
    JV_MACRO, JV_LOOP
} jv_type;

typedef struct jobj {
    int32_t refs;               /* JV_IMMORTAL: not counted */
    uint8_t type;               /* jv_type (JV_UNDEF for an undefined's hint) */
    uint8_t flags;              /* strings: JS_MARKUP */
} jobj;

#define JV_IMMORTAL (-1)
#define JS_MARKUP   1u
#define JL_GROUP    2u          /* tuples from groupby: .grouper, .list */
#define JL_RANGE    4u          /* tuples that are Python range objects */
#define JL_KEYS     8u          /* lists that are dict views: dict.keys(), */
#define JL_VALUES   16u         /* .values() and .items() (iterable, sized, */
#define JL_ITEMS    32u         /* not subscriptable) */
#define JL_VIEW     (JL_KEYS | JL_VALUES | JL_ITEMS)

typedef struct jv {
    uint8_t t;
    union { int b; int64_t i; double f; jobj *o; } u;
} jv;

typedef struct jstr {
    jobj   h;
    size_t len;                 /* bytes, excluding the NUL kept after s */
    size_t nchars;              /* code points */
    char   s[];
} jstr;

/* Containers and other objects that can refer to values are "tracked". */
typedef struct jgc {
    jobj h;
    struct jgc *prev, *next;
} jgc;

typedef struct jlist {          /* JV_LIST and JV_TUPLE */
    jgc    g;
    size_t n, cap;
    jv    *items;
    int64_t rng[3];             /* JL_RANGE: start, stop, step */
} jlist;

static inline bool jv_is_range(jv v) { return v.t == JV_TUPLE && (v.u.o->flags & JL_RANGE); }
static inline bool jv_is_view(jv v) { return v.t == JV_LIST && (v.u.o->flags & JL_VIEW); }
/* A plain list or tuple: indexable, sliceable, concatenable. */
static inline bool jv_is_seq(jv v)
{
    return (v.t == JV_LIST || v.t == JV_TUPLE) && !(v.u.o->flags & (JL_VIEW | JL_RANGE));
}

typedef struct jentry { jv key, val; uint64_t hash; } jentry;

typedef struct jdict {          /* JV_DICT and JV_NS (namespace attributes) */
    jgc     g;
    size_t  n, cap;
    jentry *e;                  /* insertion order */
    uint32_t *idx;              /* open addressing: entry index + 1, 0 free */
    size_t  idx_cap;            /* power of two, or 0 while n is small */
} jdict;

typedef struct jiter {          /* a one-shot generator (map, select...) */
    jgc    g;
    jlist *items;
    size_t pos;
    const char *pyname;         /* "generator", "list_reverseiterator" */
    char  *err;                 /* raised once the items run out (rc_malloc'd) */
    int    err_rc;
} jiter;

typedef struct jfunc {          /* a builtin function or bound method */
    jgc  g;
    int  fn;                    /* JF_* id (jinja_methods.c) */
    jv   self;
} jfunc;

struct jnode;
struct jscope;

typedef struct jmacro {
    jgc g;
    const struct jnode *def;    /* N_MACRO or N_CALLBLOCK */
    struct jscope *closure;     /* scope it was defined in (kept alive) */
} jmacro;

typedef struct jloop {          /* the `loop` variable of a for statement */
    jgc    g;
    jlist *items;
    size_t i;
    uint32_t depth;             /* 1 for the outermost loop */
    jv     changed_last;
    bool   has_changed;
    const struct jnode *node;   /* for recursive loops */
    struct jscope *scope;       /* scope the for statement runs in */
} jloop;

typedef struct jundef {         /* the hint carried by an undefined value */
    jgc         g;
    const char *hint;           /* fixed message, or NULL */
    const char *obj_repr;       /* "dict object", "None"...; NULL: a name */
    jv          name;           /* missing attribute, key or variable name */
} jundef;

/* An output buffer; all growth is checked against the render's limits. */
typedef struct jbuf {
    char  *p;
    size_t len, cap;
} jbuf;

typedef struct jvar {
    const char *name;           /* NULL: free slot */
    uint32_t    hash;
    jv          val;
} jvar;

typedef struct jscope {
    struct jscope *parent;
    jvar    *tab;
    uint32_t cap, n;
    bool     captured;          /* referenced by a macro: freed at the end */
    struct jscope *next_kept;
} jscope;

/* Render state. */
typedef struct jrt {
    jinja_limits lim;
    uint64_t steps;
    uint32_t depth;
    size_t   mem;
    int      alloc_rc;          /* code of the last failed jv_alloc */
    jgc      gc;                /* sentinel of the tracked-object list */
    jobj   **pending;           /* objects waiting to be freed (iterative) */
    size_t   n_pending, cap_pending;
    bool     freeing;
    jscope  *globals;           /* render variables */
    jscope  *kept;              /* captured scopes */
    jbuf    *out;               /* where output goes now */
    uint32_t err_line;          /* line of the innermost failing node */
    bool     err_plain;         /* raise_exception: no line suffix */
    const jv *block_input;      /* value fed to a {% filter %} chain */
    const char *join_error;     /* type of a non-string filter-block result */
    bool     folding;           /* evaluating as jinja2's compile-time folding */
} jrt;

/* Call arguments as evaluated. */
typedef struct jname { const char *s; uint32_t hash; } jname;

typedef struct jcall {
    const jv    *pos;
    size_t       n_pos;
    const jname *kw_names;
    const jv    *kw;
    size_t       n_kw;
} jcall;

static inline jv jv_undef(void) { jv v = {JV_UNDEF, {0}}; return v; }
static inline jv jv_none(void) { jv v = {JV_NONE, {0}}; return v; }
static inline jv jv_bool(bool b) { jv v = {JV_BOOL, {0}}; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {JV_INT, {0}}; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {JV_FLOAT, {0}}; v.u.f = f; return v; }
static inline bool jv_is_heap(jv v) { return v.t >= JV_STR || (v.t == JV_UNDEF && v.u.o); }
static inline jstr *jv_s(jv v) { return (jstr *)v.u.o; }
static inline jlist *jv_l(jv v) { return (jlist *)v.u.o; }
static inline jdict *jv_d(jv v) { return (jdict *)v.u.o; }
static inline bool jv_is_markup(jv v) { return v.t == JV_STR && (v.u.o->flags & JS_MARKUP); }
static inline bool jv_is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static inline bool jv_is_intlike(jv v) { return v.t == JV_BOOL || v.t == JV_INT; }
static inline int64_t jv_as_int(jv v) { return v.t == JV_BOOL ? v.u.b : v.u.i; }
static inline double jv_as_float(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : (double)jv_as_int(v);
}

/* Errors.  jv_fail records "<fmt>" as the message and returns code. */
int jv_fail(jrt *rt, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int jv_nomem(jrt *rt);
/* Counts `units` of work against the step budget. */
int jv_tick(jrt *rt, uint64_t units);
/* Counts a scan over n bytes with no output: a step per 64 bytes for
 * memcmp-like scans, per 16 for loops that decode code points. */
static inline int jv_tick_bytes(jrt *rt, size_t n) { return n >= 64 ? jv_tick(rt, n / 64) : 0; }
static inline int jv_tick_chars(jrt *rt, size_t n) { return n >= 16 ? jv_tick(rt, n / 16) : 0; }

void jv_incref(jv v);
void jv_decref(jrt *rt, jv v);
/* Drops *v and leaves None there: failing functions use it on their
 * output so that callers never see a freed value. */
static inline void jv_clear(jrt *rt, jv *v)
{
    jv_decref(rt, *v);
    v->t = JV_NONE;
    v->u.o = NULL;
}

/* Strings. */
int  jv_str(jrt *rt, const char *s, size_t len, jv *out);
int  jv_str_flags(jrt *rt, const char *s, size_t len, unsigned flags, jv *out);
int  jv_cstr(jrt *rt, const char *s, jv *out);
/* An immortal string for the parsed tree (rt-less, arena-allocated). */
jv   jv_str_immortal(jarena *a, const char *s, size_t len);
/* Concatenates n strings into one new string (one allocation). */
int  jv_str_cat(jrt *rt, const jstr *const *parts, size_t n, unsigned flags, jv *out);
/* Takes a jbuf's contents as a string value (the jbuf is emptied). */
int  jv_str_from_buf(jrt *rt, jbuf *b, unsigned flags, jv *out);

/* Lists, tuples, dicts. */
int  jv_list_new(jrt *rt, size_t cap, jv *out);
int  jv_tuple_new(jrt *rt, size_t n, jv *out);   /* n slots, all None */
int  jv_list_push(jrt *rt, jlist *l, jv v);       /* increfs v */
int  jv_list_push_take(jrt *rt, jlist *l, jv v);  /* steals v, also on error */
int  jv_dict_new(jrt *rt, int type, jv *out);     /* JV_DICT or JV_NS */
int  jv_dict_set(jrt *rt, jdict *d, jv key, jv val);   /* increfs both */
/* Finds key; *slot = NULL when absent.  Fails only for unhashable keys. */
int  jv_dict_find(jrt *rt, const jdict *d, jv key, jentry **slot);
jentry *jv_dict_find_str(const jdict *d, const char *key, size_t len);
int  jv_dict_del(jrt *rt, jdict *d, jv key, bool *found, jv *old);
int  jv_iter_new(jrt *rt, jv list_take, const char *pyname, jv *out);
/* A zeroed tracked object of `size` bytes (a jgc-headed struct) with one
 * reference, or NULL (jv_nomem gives the code). */
void *jv_new_tracked(jrt *rt, size_t size, int type);
int  jv_func_new(jrt *rt, int fn, jv self, jv *out);

/* Undefined values.  `name` is a variable name; attr/elem variants record
 * the object whose attribute or element was missing. */
int  jv_undef_name(jrt *rt, const char *name, jv *out);
int  jv_undef_missing(jrt *rt, jv obj, jv name, jv *out);
int  jv_undef_hint(jrt *rt, const char *hint, jv *out);
/* Raises UndefinedError for an undefined value; returns the code. */
int  jv_undef_raise(jrt *rt, jv undef);

/* Python semantics. */
bool jv_truthy(jv v);
const char *jv_type_name(jv v);          /* type(x).__name__ */
const char *jv_obj_repr(jv v);           /* jinja2's object_type_repr */
int  jv_eq(jrt *rt, jv a, jv b, bool *out);
int  jv_cmp(jrt *rt, jv a, jv b, const char *op, int *out);  /* <0, 0, >0 */
int  jv_hash(jrt *rt, jv v, uint64_t *out);
int  jv_len(jrt *rt, jv v, int64_t *out);   /* len(); TypeError if none */
/* jinja2's has_safe_repr: only such constants are folded at compile time. */
bool jv_safe_repr(jv v, int depth);
/* str(x) / repr(x) appended to b (undefined: "" / "Undefined"). */
int  jv_write_str(jrt *rt, jv v, jbuf *b);
int  jv_write_repr(jrt *rt, jv v, jbuf *b);
/* soft_str: strings (and markup) unchanged, anything else str(x). */
int  jv_to_str(jrt *rt, jv v, jv *out);
/* Python float repr into buf (>= 32 bytes). */
void jv_fmt_float(double f, char *buf);
/* The items of an iterable as a new list reference (a snapshot: a list is
 * copied, a generator is consumed).  TypeError for non-iterables. */
int  jv_items(jrt *rt, jv v, jv *out_list);

/* JSON. */
int  jv_from_json(jrt *rt, const json_t *j, jv *out);
typedef struct jjson_opts {
    const char *indent;          /* NULL: single line */
    size_t      indent_len;
    const char *item_sep, *key_sep;
    size_t      item_sep_len, key_sep_len;
    bool        sort_keys, ensure_ascii;
} jjson_opts;
int  jv_write_json(jrt *rt, jv v, const jjson_opts *o, jbuf *b);

/* Buffers. */
int  jbuf_put(jrt *rt, jbuf *b, const char *s, size_t n);
int  jbuf_putc(jrt *rt, jbuf *b, char c);
int  jbuf_puts(jrt *rt, jbuf *b, const char *s);
void jbuf_free(jrt *rt, jbuf *b);

/* Frees every object still alive (cycles) at the end of a render. */
void jv_gc_sweep(jrt *rt);

/* Memory accounting used by the allocation helpers. */
void *jv_alloc(jrt *rt, size_t bytes);
void *jv_realloc(jrt *rt, void *p, size_t old_bytes, size_t new_bytes);
void  jv_dealloc(jrt *rt, void *p, size_t bytes);

/* ---- syntax tree (jinja_parse.c) ---------------------------------------- */

typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_LIST, N_TUPLE, N_DICT, N_BINOP, N_CONCAT, N_NEG, N_POS, N_NOT, N_AND,
    N_OR, N_COMPARE, N_OPERAND, N_CONDEXPR, N_NSREF,
    /* statements */
    N_BODY, N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO,
    N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_WITH, N_SCOPE
} jnode_kind;

/* Binary and comparison operators (jnode.op). */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LTEQ, OP_GT, OP_GTEQ, OP_IN, OP_NOTIN };

/* jnode.flags */
enum { NF_RECURSIVE = 1, NF_VARARGS = 2, NF_KWARGS = 4, NF_CALLER = 8,
       NF_FOLD = 16 };  /* a constant expression jinja2 would fold (see eval) */

/* Child roles by kind:
 *   GETATTR a.attr      GETITEM a[b]        SLICE a:b:c (NULL = omitted)
 *   CALL a(items, kw)   FILTER a|name(items, kw), a NULL in filter blocks
 *   TEST a is name(..)  LIST/TUPLE items    DICT items k0,v0,k1,v1...
 *   BINOP a op b        CONCAT items        NEG/POS/NOT a     AND/OR a b
 *   COMPARE a (OPERAND op a)*               CONDEXPR b if a else c
 *   NSREF name.attr     DATA cval           OUTPUT a
 *   IF a: b else c      FOR a in b if e: c else d
 *   SET a = b           SETBLOCK a = b | c  MACRO name(items=kw defaults): b
 *   CALLBLOCK call a (items, kw defaults): b   FILTERBLOCK a: b
 *   WITH items=kwvals: b                    SCOPE b  (block, generation)
 * Macro and call-block parameters are N_NAME nodes in items; kwvals holds
 * their defaults (NULL where none) and n_kw == n_items. */
typedef struct jnode {
    uint8_t  kind, op, flags;
    uint32_t line, col;
    struct jnode *a, *b, *c, *d, *e;
    struct jnode **items;
    uint32_t n_items;
    uint32_t n_kw;
    struct jnode **kwvals;
    jname   *kwnames;
    jname    name, attr;
    jv       cval;
    int      fid;               /* filter or test id */
    jname   *shadow;            /* N_BODY of a frame: names that start undefined */
    uint32_t n_shadow;
} jnode;

struct jinja_template {
    jarena  arena;
    jnode  *root;               /* N_BODY */
};

uint32_t jinja__hash_name(const char *s, size_t len);

/* ---- evaluation (jinja_eval.c) ------------------------------------------ */

/* Calls any callable value: builtin functions and methods, macros, the
 * loop of a recursive for. */
int jinja__call(jrt *rt, jv callee, const jcall *args, jv *out);
/* Python's binary operators (OP_ADD ... OP_POW) and `in`. */
int jinja__binop(jrt *rt, int op, jv a, jv b, jv *out);
int jinja__contains(jrt *rt, jv container, jv item, bool *out);

/* ---- filters and tests (jinja_filters.c) -------------------------------- */

int jinja__filter_id(const char *name);     /* -1 when unknown */
bool jinja__filter_foldable(int fid);       /* jinja2 may run it at compile time */
int jinja__test_id(const char *name);
int jinja__filter(jrt *rt, int fid, jv v, const jcall *args, jv *out);
int jinja__test(jrt *rt, int tid, jv v, const jcall *args, bool *out);

/* ---- attributes, methods, globals (jinja_methods.c) --------------------- */

/* environment.getattr / getitem of the sandboxed environment. */
int jinja__getattr(jrt *rt, jv obj, const char *name, jv *out);
int jinja__getitem(jrt *rt, jv obj, jv key, jv *out);
/* Python getattr(obj, name) only (methods, namespace and loop attributes):
 * *found is false when the object has no such attribute. */
int jinja__pyattr(jrt *rt, jv obj, const char *name, jv *out, bool *found);
/* obj[start:stop:step] for str, list and tuple (absent bounds: undefined). */
int jinja__slice(jrt *rt, jv obj, jv start, jv stop, jv step, jv *out);
/* The builtin globals (range, namespace, dict, raise_exception, ...). */
bool jinja__global(jrt *rt, const char *name, jv *out, int *rc);
/* A Python range object of n items (a flagged tuple). */
int jinja__range(jrt *rt, int64_t start, int64_t stop, int64_t step, int64_t n, jv *out);
int jinja__call_builtin(jrt *rt, jfunc *f, const jcall *args, jv *out);
/* Stable sort of items[n] by keys[n] (NULL: the items themselves) with
 * Python's `<`; keys move with their items. */
int jinja__sort(jrt *rt, jv *items, jv *keys, size_t n, bool reverse);
const char *jinja__func_name(int fn);

/* Argument binding for builtins: `names` is a comma separated parameter
 * list ("width,first,blank"; a leading '!' marks a required one).  Slots
 * receive borrowed values, or the missing marker (jv_missing) when not
 * given.  Errors read like Python's TypeError messages. */
extern jobj jinja__missing_obj;
/* Marks a frame variable jinja2 has declared but not yet assigned. */
extern jobj jinja__shadow_obj;
static inline bool jv_missing(jv v) { return v.t == JV_UNDEF && v.u.o == &jinja__missing_obj; }
static inline jv jv_missing_val(void) { jv v = {JV_UNDEF, {0}}; v.u.o = &jinja__missing_obj; return v; }
int jinja__bind(jrt *rt, const char *fname, const char *names, const jcall *args,
                jv *slots, size_t n_slots);

/* ---- strings (jinja_str.c) ----------------------------------------------- */

/* Python str methods: id by name (-1 if none), call, name. */
int jinja__str_method_id(const char *name);
int jinja__str_call(jrt *rt, int id, jv self, const jcall *args, jv *out);
const char *jinja__str_method_name(int id);

/* Helpers shared with the filters.  `chars` JV_NONE/missing = whitespace;
 * which: 1 left, 2 right, 3 both. Results keep the Markup flag of s. */
int jinja__str_strip(jrt *rt, jv s, jv chars, int which, jv *out);
int jinja__str_case(jrt *rt, jv s, int mode, jv *out);  /* JC_* */
enum { JC_LOWER, JC_UPPER, JC_CAPITALIZE, JC_TITLE, JC_SWAPCASE };
int jinja__str_replace(jrt *rt, jv s, jv old, jv new_, int64_t count, jv *out);
int jinja__str_splitlines(jrt *rt, jv s, bool keepends, jv *out);
int jinja__escape(jrt *rt, jv v, jv *out);             /* markupsafe.escape */
int jinja__percent_format(jrt *rt, jv fmt, jv args, jv *out);
int jinja__int_arg(jrt *rt, jv v, int64_t *out);      /* an index/count */
/* Python's float(str): false when the text is not a float literal. */
bool jinja__parse_float(const char *s, size_t len, double *out);
/* Python's int(str, base): false when not an integer literal (or too big). */
bool jinja__parse_int(const char *s, size_t len, int base, int64_t *out);

#endif
