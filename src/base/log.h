/* log.h - leveled log lines on stderr.  RACIMO_LOG=debug|info|warn|error
 * picks the threshold (default info).  Thread safe: one write per line. */
#ifndef RC_LOG_H
#define RC_LOG_H

#include <stddef.h>

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

void rc_log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void rc_log_set_level(int level);

/* Text from the network (a peer's node name, a model name, an mDNS label)
 * made safe to print in a log line: control characters (C0, DEL and C1, so
 * newlines and ANSI escape sequences), bytes that are not UTF-8, and the
 * characters that reorder or break lines (bidi controls, U+2028/U+2029)
 * each become '?'; more than LOG_CLEAN_MAX bytes are cut (at a character)
 * and end in "...".  NULL reads as "".  Returns one of LOG_CLEAN_SLOTS
 * buffers of the calling thread, used in turn, so up to that many cleaned
 * strings may go into one rc_log call. */
#define LOG_CLEAN_MAX   80
#define LOG_CLEAN_SLOTS 8
const char *log_clean(const char *s);
const char *log_clean_n(const void *s, size_t n);    /* n bytes, NULs included */

#endif
