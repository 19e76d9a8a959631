/* gbnf_text.h - a growing buffer for GBNF text, shared by the JSON Schema and
 * regex converters.
 *
 * Failure is sticky: after an allocation failure or once the text would pass
 * JSON_GBNF_MAX_BYTES, appends do nothing and `rc` holds RC_ENOMEM or
 * RC_ELIMIT, so a converter checks once at the end.
 */
#ifndef RC_GRAMMAR_GBNF_TEXT_H
#define RC_GRAMMAR_GBNF_TEXT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *p;          /* NUL-terminated once anything was appended */
    size_t len, cap;
    int rc;           /* 0, RC_ENOMEM or RC_ELIMIT */
} gtext;

void gt_put(gtext *t, const char *s, size_t n);
void gt_puts(gtext *t, const char *s);
void gt_printf(gtext *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A GBNF string literal ("...") matching the bytes s[0..n) exactly. */
void gt_literal(gtext *t, const char *s, size_t n);
/* Code point cp written for use inside a [...] class. */
void gt_class_char(gtext *t, uint32_t cp);
/* rc, with rc_errmsg() set when it is an error. */
int  gt_status(const gtext *t);
void gt_free(gtext *t);

#endif
