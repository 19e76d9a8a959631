/* writer.c - HTTP bodies: JSON replies, errors, server-sent events and JSON
 * lines.  Every function runs on the event-loop thread and accepts a job
 * whose client is gone (the bytes are dropped). */
#include "server_internal.h"
#include "base/os.h"
#include "base/mem.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <string.h>
#include <sys/socket.h>

static void send_body(api_server *s, struct evhttp_request *req, int status, const char *ctype,
                      const char *body, size_t len)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    srv_cors_headers(s, req);
    struct evbuffer *b = evbuffer_new();
    if (b)
        evbuffer_add(b, body, len);
    evhttp_send_reply(req, status, NULL, b);
    if (b)
        evbuffer_free(b);
}

void http_reply_text(api_server *s, struct evhttp_request *req, int status, const char *ctype,
                     const char *text, size_t len)
{
    send_body(s, req, status, ctype, text, len);
}

void http_reply_json(api_server *s, struct evhttp_request *req, int status, json_t *body,
                     const char *extra_header, const char *extra_value)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (extra_header)
        evhttp_add_header(evhttp_request_get_output_headers(req), extra_header, extra_value);
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":\"out_of_memory\"}}";
        send_body(s, req, 500, "application/json", oom, sizeof oom - 1);
        return;
    }
    send_body(s, req, status, "application/json", text, strlen(text));
    free(text);
}

json_t *openai_error_json(const api_error *e)
{
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type",
                     e->type, "param", e->param[0] ? e->param : NULL, "code",
                     e->code[0] ? e->code : NULL);
}

void http_reply_error(api_server *s, struct evhttp_request *req, bool ollama, const api_error *e)
{
    /* the request's own path says the dialect (callers name only Ollama) */
    const char *uri = evhttp_request_get_uri(req);
    bool anthropic = !ollama && uri && srv_is_anthropic_path(uri);
    json_t *body = ollama ? json_pack("{s:s}", "error", e->message)
                 : anthropic ? anthropic_error_json(e) : openai_error_json(e);
    char retry[16];
    snprintf(retry, sizeof retry, "%d", 1);
    http_reply_json(s, req, anthropic ? anthropic_status(e->status) : e->status, body,
                    e->status == 429 ? "Retry-After" : NULL, retry);
}

/* Looks for end-of-file without taking any bytes. */
bool http_client_closed(struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd < 0)
        return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void http_stream_start(api_job *j, const char *content_type)
{
    if (j->started)
        return;                 /* opened early, while the model loaded */
    j->started = true;
    j->status = 200;
    if (!j->req || j->gone)
        return;
    struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
    evhttp_add_header(h, "Content-Type", content_type);
    evhttp_add_header(h, "Cache-Control", "no-cache");
    srv_cors_headers(j->srv, j->req);
    evhttp_send_reply_start(j->req, 200, "OK");
    /* A stream may stay quiet for long (a long prompt, a queue): no read
     * timeout while it lasts, only the write timeout for clients that stop
     * reading.  job.c restores the server's timeouts at the end. */
    if (j->evcon) {
        struct timeval wt = { j->srv->cfg.timeout_s, 0 };
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(j->evcon), NULL, &wt);
    }
}

void http_stream_raw(api_job *j, const char *text)
{
    if (!j->req || j->gone || !j->evcon)
        return;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return;
    evbuffer_add(b, text, strlen(text));
    evhttp_send_reply_chunk(j->req, b);
    evbuffer_free(b);
    j->t_keepalive_ns = os_now_ns();
}

static void stream_json(api_job *j, json_t *o, const char *before, const char *after)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text || !j->req || j->gone || !j->evcon) {
        free(text);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (b) {
        evbuffer_add_printf(b, "%s%s%s", before, text, after);
        evhttp_send_reply_chunk(j->req, b);
        evbuffer_free(b);
        j->t_keepalive_ns = os_now_ns();
    }
    free(text);
}

void http_stream_sse(api_job *j, json_t *event) { stream_json(j, event, "data: ", "\n\n"); }

void http_stream_event(api_job *j, const char *name, json_t *data)
{
    char before[64];
    snprintf(before, sizeof before, "event: %s\ndata: ", name);
    stream_json(j, data, before, "\n\n");
}
void http_stream_line(api_job *j, json_t *obj) { stream_json(j, obj, "", "\n"); }

void http_stream_end(api_job *j)
{
    if (!j->req || j->gone)
        return;
    if (j->evcon)
        evhttp_connection_set_timeout(j->evcon, j->srv->cfg.timeout_s);
    evhttp_send_reply_end(j->req);
    j->req = NULL;             /* libevent frees it when the bytes are out */
}
