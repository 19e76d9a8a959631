/* cli_http.c - one HTTP request to a running node, over HTTPS for an
 * https:// address (the server's certificate checked against the system's
 * authorities, or $SSL_CERT_FILE for a private one). */
#include "cli_http.h"
#include "api/tls.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

typedef struct {
    cli_http_reply *r;
    const char *error;
    struct event_base *base;
} pending;

static void on_done(struct evhttp_request *req, void *arg)
{
    pending *p = arg;
    if (!req || evhttp_request_get_response_code(req) == 0) {
        p->error = "nothing answers there (is 'racimo serve' running?)";
    } else {
        p->r->status = evhttp_request_get_response_code(req);
        struct evbuffer *b = evhttp_request_get_input_buffer(req);
        size_t n = b ? evbuffer_get_length(b) : 0;
        if ((p->r->body = rc_malloc(n + 1))) {
            if (n)
                evbuffer_remove(b, p->r->body, n);
            p->r->body[n] = 0;
            p->r->len = n;
        } else {
            p->error = "out of memory";
        }
    }
    event_base_loopexit(p->base, NULL);
}

int cli_http(const char *method, const char *url, const char *path, const char *key,
             const char *body, int timeout_s, cli_http_reply *r, char *err, size_t cap)
{
    memset(r, 0, sizeof *r);
    char full[300];
    if (!strstr(url, "://")) {     /* HOST:PORT alone */
        snprintf(full, sizeof full, "http://%.280s", url);
        url = full;
    }
    struct evhttp_uri *u = evhttp_uri_parse(url);
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
    const char *host = u ? evhttp_uri_get_host(u) : NULL;
    bool https = scheme && !strcmp(scheme, "https");
    if (!u || !scheme || (strcmp(scheme, "http") && !https) || !host || !*host) {
        snprintf(err, cap, "'%.200s' is not an http://HOST:PORT (or https://) address", url);
        if (u)
            evhttp_uri_free(u);
        return -1;
    }
    int port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : https ? 443 : 80;
    pending p = { .r = r };
    struct event_base *base = event_base_new();
    SSL_CTX *tls = NULL;
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req = NULL;
    int rc = -1;
    if (https && base && tls_client_ctx(&tls)) {
        snprintf(err, cap, "%s", rc_errmsg());
        goto out;
    }
    struct bufferevent *bev = tls && base ? tls_client_bev(base, tls, host) : NULL;
    if (base && (!tls || bev))
        conn = evhttp_connection_base_bufferevent_new(base, NULL, bev, host, (ev_uint16_t)port);
    if (!(req = conn ? evhttp_request_new(on_done, &p) : NULL)) {
        snprintf(err, cap, "out of memory");
        goto out;
    }
    p.base = base;
    evhttp_connection_set_timeout(conn, timeout_s);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char hostport[300], auth[512];
    snprintf(hostport, sizeof hostport, "%s:%d", host, port);
    evhttp_add_header(h, "Host", hostport);
    evhttp_add_header(h, "Accept", "application/json");
    if (key && *key) {
        snprintf(auth, sizeof auth, "Bearer %s", key);
        evhttp_add_header(h, "Authorization", auth);
    }
    if (body) {
        /* libevent adds Content-Length itself only for POST and PUT */
        char n[24];
        snprintf(n, sizeof n, "%zu", strlen(body));
        evhttp_add_header(h, "Content-Type", "application/json");
        evhttp_add_header(h, "Content-Length", n);
        evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    }
    enum evhttp_cmd_type cmd = !strcmp(method, "POST") ? EVHTTP_REQ_POST
                             : !strcmp(method, "DELETE") ? EVHTTP_REQ_DELETE : EVHTTP_REQ_GET;
    if (evhttp_make_request(conn, req, cmd, path)) {
        snprintf(err, cap, "cannot send the request");
        goto out;
    }
    event_base_dispatch(base);
    if (p.error && tls) {
        /* the usual reason: a certificate that this machine does not trust */
        char why[200];
        const char *e = tls_error(evhttp_connection_get_bufferevent(conn), why, sizeof why);
        snprintf(err, cap, "%s: %s%s%s", url, *e ? "TLS: " : p.error, e,
                 *e ? " (a private certificate authority: SSL_CERT_FILE=ca.pem)" : "");
    } else if (p.error) {
        snprintf(err, cap, "%s: %s", url, p.error);
    }
    else
        rc = 0;
out:
    if (conn)
        evhttp_connection_free(conn);
    if (base)
        event_base_free(base);
    if (tls)
        SSL_CTX_free(tls);
    evhttp_uri_free(u);
    if (rc) {
        rc_free(r->body);
        r->body = NULL;
    }
    return rc;
}

int cli_http_json(const char *method, const char *url, const char *path, const char *key,
                  const char *body, int timeout_s, json_t **out, char *err, size_t cap)
{
    cli_http_reply r = { 0 };
    *out = NULL;
    if (cli_http(method, url, path, key, body, timeout_s, &r, err, cap))
        return -1;
    json_t *v = json_loadb(r.body ? r.body : "", r.len, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    int rc = -1;
    if (r.status >= 300 || !json_is_object(v))
        snprintf(err, cap, "%s %s answered %d: %.300s", method, path, r.status,
                 msg ? msg : r.body ? r.body : "");
    else
        rc = 0;
    if (rc)
        json_decref(v);
    else
        *out = v;
    rc_free(r.body);
    return rc;
}

int cli_node_args(int argc, char **argv, const char *cmd, void (*usage)(FILE *),
                  const char **url, const char **key, const char **rest, int max_rest,
                  int *exit_code)
{
    int n = 0;
    *url = "http://127.0.0.1:8080";
    *key = getenv("RACIMO_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            *exit_code = 0;
            return -1;
        } else if (!strcmp(a, "--url") && i + 1 < argc) {
            *url = argv[++i];
        } else if (!strcmp(a, "--api-key") && i + 1 < argc) {
            *key = argv[++i];
        } else if (a[0] != '-' && n < max_rest) {
            rest[n++] = a;
        } else {
            fprintf(stderr, "racimo: %s: unexpected '%s'\n", cmd, a);
            usage(stderr);
            *exit_code = 2;
            return -1;
        }
    }
    return n;
}
