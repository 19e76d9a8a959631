/* err.c - the status table and the per-thread error detail. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char detail[1024];

const char *rc_strerror(int code)
{
    switch (code) {
    case RC_OK: return "success";
#define RC__CASE(name, val, msg) case RC_E##name: return msg;
    RC_ERR_MAP(RC__CASE)
#undef RC__CASE
    }
    return "unknown error";
}

int rc_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return code;
}

int rc_wrap(int code, const char *fmt, ...)
{
    char old[sizeof detail];
    va_list ap;
    snprintf(old, sizeof old, "%s", detail[0] ? detail : rc_strerror(code));
    va_start(ap, fmt);
    int n = vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    /* The prefix first, then as much of the old detail as fits. */
    if (n >= 0 && (size_t)n < sizeof detail) {
        size_t room = sizeof detail - (size_t)n - 1, len = strnlen(old, room);
        memcpy(detail + n, old, len);
        detail[(size_t)n + len] = '\0';
    }
    return code;
}

const char *rc_errmsg(void)
{
    return detail[0] ? detail : "no error detail";
}

void rc_errclear(void)
{
    detail[0] = '\0';
}
