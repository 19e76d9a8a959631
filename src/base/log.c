/* log.c - stderr logger; a line is formatted whole then written once so
 * lines from different threads never interleave. */
#include "log.h"

#include <stdarg.h>
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

void rc_log(int level, const char *fmt, ...)
{
    static const char *names[] = { "debug", "info", "warn", "error" };
    char line[2048];
    if (level < current_threshold())
        return;
    int n = snprintf(line, sizeof line, "racimo %s: ", names[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    if (write(2, line, len) < 0) { /* nowhere left to report it */ }
}
