/* access_log.h - one JSON line per request (an audit trail).
 *
 * Fields: time (UTC, ISO 8601 with milliseconds), client (address:port),
 * key (the id of the API key used, never the key), method, path, model,
 * status, tokens_in, tokens_cached, tokens_out, ttft_ms, total_ms, and
 * finish.  Prompt and answer text only when the server runs with
 * --log-content (fields prompt and answer).  Lines are written whole with
 * one write(2) under a mutex, so concurrent writers never interleave.
 */
#ifndef RC_API_ACCESS_LOG_H
#define RC_API_ACCESS_LOG_H

#include <stdbool.h>

typedef struct {
    const char *client;
    const char *key_id;       /* NULL when no key was needed */
    const char *method, *path;
    const char *model;        /* NULL when the endpoint has none */
    int status;
    int tokens_in, tokens_cached, tokens_out;
    double ttft_ms;           /* < 0: none */
    double total_ms;
    const char *finish;       /* NULL when no generation */
    const char *prompt;       /* only written with log_content */
    const char *answer;
} access_entry;

typedef struct access_log access_log;

/* path "-" is standard output; NULL disables the log (all calls no-ops).
 * RC_EIO with the path when the file cannot be opened for appending. */
int  access_log_open(const char *path, bool log_content, access_log **out);
void access_log_close(access_log *l);                 /* accepts NULL */
void access_log_write(access_log *l, const access_entry *e);

#endif
