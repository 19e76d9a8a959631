/* log.c - stderr logger; a line is formatted whole then written once so
 * lines from different threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int threshold = -1;

void rc_log_set_level(int level) { threshold = level; }

static int current_threshold(void)
{
    if (threshold < 0) {
        const char *e = getenv("RACIMO_LOG");
        threshold = LOG_INFO;
        if (e && !strcmp(e, "debug")) threshold = LOG_DEBUG;
        if (e && !strcmp(e, "warn"))  threshold = LOG_WARN;
        if (e && !strcmp(e, "error")) threshold = LOG_ERROR;
    }
    return threshold;
}

/* ---- text from peers ---- */

/* Length of the well-formed UTF-8 character at s[0..n), 0 if none
 * (overlong forms, surrogates and values past U+10FFFF are not). */
static size_t utf8_char(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || len > n)
        return 0;
    unsigned v = len == 1 ? c : c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    static const unsigned min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (v < min[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

/* Characters that must not reach a terminal or a log reader as they are. */
static int unsafe(unsigned cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp < 0xa0) ||       /* C0, DEL, C1 (ESC, CSI) */
           cp == 0x2028 || cp == 0x2029 ||                   /* line / paragraph separators */
           (cp >= 0x200e && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);                   /* bidi marks and overrides */
}

/* Copies s[0..n) to out as log_clean describes, at most max bytes of it
 * (out has room for max + 4); returns the length written. */
static size_t clean(char *out, size_t max, const unsigned char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp = 0;
        size_t len = utf8_char(s + i, n - i, &cp);
        bool keep = len && !unsafe(cp);
        size_t put = keep ? len : 1;
        if (o + put > max) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (keep)
            memcpy(out + o, s + i, put);
        else
            out[o] = '?';
        o += put;
        i += len ? len : 1;
    }
    out[o] = 0;
    return o;
}

const char *log_clean_n(const void *src, size_t n)
{
    static _Thread_local char bufs[LOG_CLEAN_SLOTS][LOG_CLEAN_MAX + 4];
    static _Thread_local unsigned next;
    char *out = bufs[next++ % LOG_CLEAN_SLOTS];
    clean(out, LOG_CLEAN_MAX, src, n);
    return out;
}

const char *log_clean(const char *s)
{
    return log_clean_n(s ? s : "", s ? strlen(s) : 0);
}

void rc_log(int level, const char *fmt, ...)
{
    static const char *names[] = { "debug", "info", "warn", "error" };
    char raw[2048], line[2048 + 8];
    if (level < current_threshold())
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* one line, whatever a message quoted (an error text may hold a peer's
     * words): the same filter as log_clean, with no tighter bound */
    int n = snprintf(line, sizeof line, "racimo %s: ", names[level & 3]);
    size_t len = (size_t)n + clean(line + n, sizeof line - (size_t)n - 5, (const unsigned char *)raw,
                                   strlen(raw));
    line[len++] = '\n';
    if (write(2, line, len) < 0) { /* nowhere left to report it */ }
}
