/* err.h - status codes and the thread-local error detail.
 *
 * Every fallible function returns an int: 0 on success or a negative RC_E*
 * code.  The code says what kind of failure it was; the detail (a sentence
 * naming the file, offset, tensor or field at fault) is kept per thread and
 * read with rc_errmsg() right after the failing call.  One table below makes
 * both the codes and their default messages, so they cannot drift apart.
 */
#ifndef RC_ERR_H
#define RC_ERR_H

#define RC_ERR_MAP(X)                                   \
    X(NOMEM,       -1, "out of memory")                  \
    X(IO,          -2, "input/output error")             \
    X(FORMAT,      -3, "malformed data")                 \
    X(UNSUPPORTED, -4, "unsupported feature")            \
    X(INVAL,       -5, "invalid argument")               \
    X(RANGE,       -6, "value out of range")             \
    X(NOTFOUND,    -7, "not found")                      \
    X(LIMIT,       -8, "limit exceeded")                 \
    X(STATE,       -9, "operation not valid in this state")

enum {
    RC_OK = 0,
#define RC__ENUM(name, val, msg) RC_E##name = (val),
    RC_ERR_MAP(RC__ENUM)
#undef RC__ENUM
};

/* Default message of a code ("unknown error" for codes not in the table). */
const char *rc_strerror(int code);

/* Records a printf-style detail for the calling thread and returns `code`,
 * so a failure site reads `return rc_fail(RC_EFORMAT, "%s: ...", path);`. */
int rc_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prepends a prefix ("loading model: ") to the current detail, keeping the
 * code.  Returns `code` for the same one-line use as rc_fail. */
int rc_wrap(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The detail of the calling thread's last failure, or the code's default
 * message when none was recorded.  Valid until the thread's next rc_fail. */
const char *rc_errmsg(void);

/* Forgets the detail (so a later rc_errmsg does not show a stale one). */
void rc_errclear(void);

#endif
