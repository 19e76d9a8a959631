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
    char prefix[512], old[sizeof detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, detail[0] ? detail : rc_strerror(code), sizeof old);
    old[sizeof old - 1] = '\0';
    snprintf(detail, sizeof detail, "%s%s", prefix, old);
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
