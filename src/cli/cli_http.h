/* cli_http.h - one HTTP request from a command to a running node
 * (libevent's HTTP client), for `racimo nodes`, `plan` and `instances`. */
#ifndef RC_CLI_HTTP_H
#define RC_CLI_HTTP_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

typedef struct {
    int status;       /* HTTP status */
    char *body;       /* NUL-terminated; rc_free it */
    size_t len;
} cli_http_reply;

/* Sends `method` ("GET", "POST" or "DELETE") for `path` to `url` ("http://HOST:PORT"
 * or "HOST:PORT"), with a bearer key when given and a JSON body (may be
 * NULL).  0 with *r filled whatever the status; -1 with err naming what went
 * wrong (a bad address, nothing answering, a timeout). */
int cli_http(const char *method, const char *url, const char *path, const char *key,
             const char *body, int timeout_s, cli_http_reply *r, char *err, size_t cap);

/* cli_http for a JSON answer: 0 with *out (a new reference) when the node
 * answered 2xx with a JSON object; -1 with err holding the node's error
 * message (or what went wrong) otherwise. */
int cli_http_json(const char *method, const char *url, const char *path, const char *key,
                  const char *body, int timeout_s, json_t **out, char *err, size_t cap);

/* The arguments of a command that asks a running node: --url URL (default
 * http://127.0.0.1:8080), --api-key KEY (default $RACIMO_API_KEY), -h, and
 * up to max_rest plain arguments into rest.  Returns how many plain
 * arguments there were, or -1 after printing the usage (*exit_code then
 * holds 0 for --help, 2 for a bad argument). */
int cli_node_args(int argc, char **argv, const char *cmd, void (*usage)(FILE *),
                  const char **url, const char **key, const char **rest, int max_rest,
                  int *exit_code);

#endif
