/* gbnf_text.c - the buffer of gbnf_text.h. */
#include "gbnf_text.h"
#include "json_schema.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

void gt_put(gtext *t, const char *s, size_t n)
{
    if (t->rc)
        return;
    if (n > JSON_GBNF_MAX_BYTES || t->len + n > JSON_GBNF_MAX_BYTES) {
        t->rc = RC_ELIMIT;
        return;
    }
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = rc_realloc(t->p, cap);
        if (!p) {
            t->rc = RC_ENOMEM;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

void gt_puts(gtext *t, const char *s)
{
    gt_put(t, s, strlen(s));
}

void gt_printf(gtext *t, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->rc = t->rc ? t->rc : RC_ENOMEM;
        return;
    }
    if ((size_t)n < sizeof small) {
        gt_put(t, small, (size_t)n);
        return;
    }
    char *big = rc_malloc((size_t)n + 1);
    if (!big) {
        t->rc = t->rc ? t->rc : RC_ENOMEM;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gt_put(t, big, (size_t)n);
    rc_free(big);
}

void gt_literal(gtext *t, const char *s, size_t n)
{
    gt_put(t, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = { '\\', (char)c };
            gt_put(t, e, 2);
        } else if (c == '\n') {
            gt_put(t, "\\n", 2);
        } else if (c == '\r') {
            gt_put(t, "\\r", 2);
        } else if (c == '\t') {
            gt_put(t, "\\t", 2);
        } else if (c < 0x20 || c == 0x7F) {
            gt_printf(t, "\\x%02X", c);
        } else {
            gt_put(t, (const char *)&c, 1);
        }
    }
    gt_put(t, "\"", 1);
}

void gt_class_char(gtext *t, uint32_t cp)
{
    bool plain = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    if (plain) {
        char c = (char)cp;
        gt_put(t, &c, 1);
    } else if (cp < 0x100) {
        gt_printf(t, "\\x%02X", (unsigned)cp);
    } else if (cp < 0x10000) {
        gt_printf(t, "\\u%04X", (unsigned)cp);
    } else {
        gt_printf(t, "\\U%08X", (unsigned)cp);
    }
}

int gt_status(const gtext *t)
{
    if (t->rc == RC_ELIMIT)
        return rc_fail(RC_ELIMIT, "the grammar would be larger than %u bytes",
                       JSON_GBNF_MAX_BYTES);
    if (t->rc)
        return rc_fail(t->rc, "out of memory building a grammar");
    return 0;
}

void gt_free(gtext *t)
{
    rc_free(t->p);
    memset(t, 0, sizeof *t);
}
