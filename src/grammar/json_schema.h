/* json_schema.h - JSON Schema to GBNF grammar text (the input of grammar_compile).
 *
 * A json_gbnf collects rules; each schema added gives the name of the rule
 * that matches one of its values, so several schemas (one per tool) and
 * hand-written wrapper rules (a model's tool-call markers) share one grammar.
 * The shared JSON rules (ws, json-string, json-value, ...) are written once.
 *
 * Supported: boolean schemas; type (string, number, integer, boolean, null,
 * object, array, or a list of them); enum; const; properties / required
 * (members in declared order, optional ones may be absent); additionalProperties
 * (absent or false: no other members; true or a schema: more members after the
 * declared ones, whose names are not checked against the declared names); items, prefixItems, minItems, maxItems; anyOf and oneOf (as
 * alternation: oneOf's exclusivity is not enforced); allOf of object schemas
 * (merged); $ref into the same document (#, #/$defs/..., #/definitions/..., any
 * #/ pointer; recursion allowed); minLength / maxLength (such a string holds
 * only characters of the BMP, so that its length is the same in code points,
 * as JSON Schema counts, and in UTF-16 units, as JavaScript and zod count);
 * format date, time, date-time, uuid, email; pattern (see json_schema.c for the regex subset);
 * integer minimum / maximum / exclusiveMinimum / exclusiveMaximum; number
 * minimum 0; nullable (OpenAPI).  Annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are
 * ignored.  Every other keyword is refused: the error names it and where it is.
 *
 * Strings never hold \u escapes of surrogates (a lone one is invalid JSON to
 * strict readers; other characters can be written as themselves).
 *
 * Whitespace: wherever JSON allows it, at most one space, or one newline and up
 * to 20 spaces or tabs (rule `ws`), so a model that favours spaces cannot loop on
 * them; none before the first or after the last character of the top value.
 * Unbounded numbers have at most 16 integer and 16 fraction digits and a
 * two-digit exponent (so that every number fits a double).
 */
#ifndef RC_GRAMMAR_JSON_SCHEMA_H
#define RC_GRAMMAR_JSON_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

#define JSON_GBNF_MAX_BYTES  (1u << 20)  /* grammar text; a larger schema is refused */
#define JSON_GBNF_MAX_DEPTH  64          /* nesting of schemas and of pattern groups */
#define JSON_GBNF_MAX_REPEAT 1000        /* a bound in {m,n}, minItems, maxLength... */

typedef struct json_gbnf json_gbnf;

/* An empty collection of rules.  RC_ENOMEM. */
int  json_gbnf_new(json_gbnf **out);
void json_gbnf_free(json_gbnf *g);            /* accepts NULL */

/* Adds the rules for `schema` (its $refs resolve inside it).  `prefix` (letters,
 * digits and '-') starts the names of its rules, so that two schemas in one
 * grammar do not collide.  On success rule[0..rule_size) holds the name of the
 * rule matching one value.  RC_EINVAL (unsupported or malformed schema) or
 * RC_ELIMIT (too large), rc_errmsg() naming the keyword and its JSON pointer. */
int json_gbnf_add_schema(json_gbnf *g, const json_t *schema, const char *prefix, char *rule,
                         size_t rule_size);

/* One of the shared rules ("ws", "json-string", "json-value", "json-object",
 * ...), defined on first use; returns its name (NULL for an unknown one). */
const char *json_gbnf_shared(json_gbnf *g, const char *name);

/* Adds `name ::= body` verbatim (a wrapper such as a tool-call format; root). */
int json_gbnf_add_rule(json_gbnf *g, const char *name, const char *body);

/* The grammar text so far (borrowed; valid until the next call on g). */
const char *json_gbnf_text(const json_gbnf *g, size_t *len);

/* One-call forms: a whole grammar whose root is the schema / any JSON object.
 * *gbnf is rc_malloc'd. */
int json_schema_to_gbnf(const json_t *schema, char **gbnf);
int json_object_gbnf(char **gbnf);

#endif
