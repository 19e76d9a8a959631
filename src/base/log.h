/* log.h - leveled log lines on stderr.  RACIMO_LOG=debug|info|warn|error
 * picks the threshold (default info).  Thread safe: one write per line. */
#ifndef RC_LOG_H
#define RC_LOG_H

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

void rc_log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void rc_log_set_level(int level);

#endif
