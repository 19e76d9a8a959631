/* jinja.h - a Jinja2 template engine for chat templates.
 *
 * Renders templates the way Python jinja2 3.1 does with the settings that
 * Hugging Face's apply_chat_template uses: a sandboxed environment with
 * trim_blocks, lstrip_blocks and the loopcontrols extension (break and
 * continue), no autoescaping, a `tojson` filter that is plain json.dumps
 * (non-ASCII kept, key order kept, `indent` honoured) and a global
 * `raise_exception(msg)`.  Values follow Python semantics: undefined
 * variables render as empty text, `{{ none }}` renders "None", floats print
 * like Python's repr, lists print with quoted strings, and so on.
 *
 * A template is parsed once (jinja_parse) into an immutable tree that any
 * number of threads may render at the same time (jinja_render).  Rendering
 * is bounded: nesting depth, evaluation steps, output size and live memory
 * are limited (jinja_limits), so a hostile template fails with RC_ELIMIT
 * instead of hanging or exhausting memory.
 *
 * Beyond the everyday features this follows jinja2's less visible rules:
 * compile-time name resolution per frame, deferred errors of unknown
 * filters inside `if`, constant folding of literal slices, one-shot
 * generators from map/select/items, the for-else quirk with break and
 * continue, markupsafe escaping when a `|safe` string meets a plain one.
 * HF's `{% generation %}` blocks render their content.  Not supported:
 * include/import/extends (no loader), `{% autoescape %}`, the filters
 * random, urlize, urlencode, wordwrap, xmlattr and filesizeformat (they
 * parse but fail when run), integers beyond 64 bits (OverflowError),
 * `\N{name}` escapes; case mapping covers Latin, Greek, Cyrillic and
 * Armenian only; reprs of functions and generators show other addresses.
 *
 * Errors (rc_errmsg after a failed call) read like the Python exception,
 * "<Class>: <message>":
 *   - syntax errors: "TemplateSyntaxError: ... (line L, column C)", RC_EFORMAT
 *   - raise_exception("m"): exactly "TemplateError: m", RC_EINVAL
 *   - other run-time errors (TypeError, UndefinedError, ...): the Python
 *     message followed by " (template line L)", RC_EINVAL
 *   - limits: "LimitError: ...", RC_ELIMIT; out of memory: RC_ENOMEM.
 */
#ifndef RC_JINJA_H
#define RC_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct jinja_template jinja_template;

/* Bounds on one render.  Zero in any field means "use the default". */
typedef struct jinja_limits {
    size_t   max_output_bytes;  /* rendered text, and any one string value */
    size_t   max_memory_bytes;  /* bytes held by live strings and containers */
    uint64_t max_steps;         /* evaluation work units (nodes, bytes/64) */
    uint32_t max_depth;         /* run-time nesting: expressions, calls */
} jinja_limits;

/* The defaults: 32 MiB output, 256 MiB memory, 50M steps (a second or two
 * of work), depth 400.  A render at the full default depth uses about
 * 200 KiB of stack (several times more under AddressSanitizer); threads
 * with smaller stacks should lower max_depth. */
void jinja_limits_default(jinja_limits *lim);

/* Parses `len` bytes of template source (UTF-8; NUL bytes allowed) into
 * *out.  Returns 0, or RC_EFORMAT for a syntax error (message with line and
 * column), RC_ELIMIT for a source over 4 MiB or nested deeper than the
 * parser allows, RC_ENOMEM.  Free the template with jinja_free. */
int jinja_parse(const char *src, size_t len, jinja_template **out);

/* Frees a parsed template; accepts NULL. */
void jinja_free(jinja_template *tpl);

/* One template variable: `value` is converted to the Python value jinja2
 * would see (object -> dict in key order, array -> list, null -> None,
 * true/false -> bool, integer -> int, real -> float).  A NULL `value`
 * leaves the name undefined. */
typedef struct jinja_var {
    const char   *name;
    const json_t *value;
} jinja_var;

/* Renders `tpl` with `n_vars` variables (a later duplicate name wins) under
 * `lim` (NULL: defaults).  On success returns 0 and *out is a NUL-terminated
 * malloc'd string (free with rc_free) of *out_len bytes (out_len may be
 * NULL; the text itself may contain NUL bytes only if a value did).  On
 * failure returns a negative code, *out is NULL and rc_errmsg() says why.
 * The inputs are only read; thread safe for distinct outputs. */
int jinja_render(const jinja_template *tpl, const jinja_var *vars, size_t n_vars,
                 const jinja_limits *lim, char **out, size_t *out_len);

#endif
