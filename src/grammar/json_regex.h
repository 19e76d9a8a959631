/* json_regex.h - a JSON Schema `pattern` to a GBNF expression (used by json_schema.c).
 *
 * The expression matches the inside of a JSON string (quotes excluded) whose
 * decoded value matches the pattern, written as a model writes it: characters
 * that JSON must escape (", \, newline, tab, carriage return) in their escaped
 * form, other control characters never.
 *
 * Subset: literals (UTF-8), escapes \d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH
 * and escaped punctuation, . (any character but newline), classes [...] and
 * [^...] with ranges and \d \w \s inside, groups ( ) and (?: ), alternation |,
 * quantifiers ? * + {m} {m,} {m,n} (a lazy ? after them is ignored: it does not
 * change what matches), ^ at the start and $ at the end.  A pattern without ^
 * (or $) may have anything before (after) the match, as JSON Schema's search
 * semantics say.  Refused, with the construct named: backreferences,
 * lookaround, named groups, \b \B, anchors elsewhere, possessive quantifiers,
 * bounds above JSON_GBNF_MAX_REPEAT, nesting deeper than JSON_GBNF_MAX_DEPTH.
 */
#ifndef RC_GRAMMAR_JSON_REGEX_H
#define RC_GRAMMAR_JSON_REGEX_H

#include "gbnf_text.h"

/* Appends the expression (one parenthesised group) to `out`.  `any_char`
 * names the rule for one JSON string character, used for unanchored ends.
 * RC_EINVAL with rc_errmsg() saying what in the pattern is not supported, or
 * out's error. */
int json_regex_gbnf(const char *pattern, const char *any_char, gtext *out);

#endif
