/* buf.h - a growable byte buffer for building response bodies and log
 * lines.  Allocation failure is sticky: after one, appends do nothing and
 * sb_failed() says so, so a caller checks once at the end. */
#ifndef RC_API_BUF_H
#define RC_API_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;          /* NUL-terminated when len > 0 or after sb_cstr */
    size_t len, cap;
    bool failed;
} strbuf;

void sb_append(strbuf *b, const void *data, size_t n);
void sb_puts(strbuf *b, const char *s);
void sb_printf(strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s as the inside of a JSON string (quotes not included). */
void sb_json_escape(strbuf *b, const char *s, size_t n);
const char *sb_cstr(strbuf *b);      /* "" for an empty or failed buffer */
bool sb_failed(const strbuf *b);
void sb_reset(strbuf *b);            /* length 0, keeps the memory */
void sb_free(strbuf *b);             /* accepts a zeroed buffer */

#endif
