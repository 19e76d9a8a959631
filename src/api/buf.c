/* buf.c - see buf.h. */
#include "buf.h"
#include "base/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool reserve(strbuf *b, size_t extra)
{
    if (b->failed)
        return false;
    size_t need;
    if (rc_add_size(b->len, extra, &need) || rc_add_size(need, 1, &need)) {
        b->failed = true;
        return false;
    }
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > ((size_t)-1) / 2 ? need : cap * 2;
    char *p = rc_realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void sb_append(strbuf *b, const void *data, size_t n)
{
    if (!reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_puts(strbuf *b, const char *s) { sb_append(b, s, strlen(s)); }

void sb_printf(strbuf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && reserve(b, (size_t)n)) {
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void sb_json_escape(strbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        sb_append(b, s + run, i - run);
        run = i + 1;
        char esc[7] = { '\\', 0 };
        switch (c) {
        case '"':  esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
        }
        sb_puts(b, esc);
    }
    sb_append(b, s + run, n - run);
}

const char *sb_cstr(strbuf *b) { return b->len && !b->failed ? b->p : ""; }
bool sb_failed(const strbuf *b) { return b->failed; }

void sb_reset(strbuf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->p)
        b->p[0] = '\0';
}

void sb_free(strbuf *b)
{
    rc_free(b->p);
    memset(b, 0, sizeof *b);
}
