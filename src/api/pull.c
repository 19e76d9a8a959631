/* pull.c - POST /api/pull (Ollama) and POST /v1/models/pull: this node
 * fetches a model from Hugging Face into its models folder (src/hub).
 *
 * The transfer runs on a thread of its own (minutes, for a big model); it
 * turns hub progress into Ollama's progress objects ({status, digest,
 * total, completed} as JSON lines) in a queue under `mu` and wakes the
 * event loop with event_active, whose callback sends them (a stream) and,
 * at the end, the last line or the whole answer.  A client that goes away
 * cancels the transfer: the .part stays in the staging folder and the next
 * pull of the same name resumes it.  When a pull ends well the registry and
 * the cluster look at the folder again, so the model is served and listed to
 * the other nodes at once.
 *
 * Life cycle (event-loop thread): pull_start links the pull into
 * srv->pulls and starts the thread; the wake callback, after the thread
 * said it is done, joins it, answers and frees.  pull_shutdown cancels and
 * joins whatever is left.
 */
#include "server_internal.h"
#include "base/err.h"
#include "base/mem.h"
#include "cluster/cluster.h"
#include "hub/hub.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>

#include <string.h>

struct api_pull {
    api_server *srv;
    struct evhttp_request *req;     /* NULL once answered or freed by libevent */
    struct evhttp_connection *evcon;
    bool req_owned;                 /* detached by libevent: ours to free */
    bool stream, ollama, started;
    char path[32], key_id[16], client[64], name[512], file[HUB_PATH_MAX];
    struct event *wake;
    pthread_t thread;
    volatile int cancel;            /* the client left, or the server stops */
    /* shared with the thread (mu) */
    pthread_mutex_t mu;
    strbuf lines;                   /* progress lines not sent yet */
    bool done;
    int rc;
    char err[800];
    char model[HUB_PATH_MAX];
    const char *last_phase;         /* thread only */
    int last_index;                 /* thread only */
    api_pull *prev, *next;          /* srv->pulls */
};

static void push_line(api_pull *p, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return;
    pthread_mutex_lock(&p->mu);
    sb_puts(&p->lines, text);
    sb_puts(&p->lines, "\n");
    pthread_mutex_unlock(&p->mu);
    free(text);
    event_active(p->wake, 0, 0);
}

/* hub progress -> Ollama's objects: "pulling <digest>" with the digest and
 * byte counts of the file, "verifying sha256 digest" once it is all in. */
static void on_progress(void *arg, const hub_progress *hp)
{
    api_pull *p = arg;
    char digest[80] = "", status[120];
    if (hp->file->sha256[0])
        snprintf(digest, sizeof digest, "sha256:%s", hp->file->sha256);
    bool again = p->last_phase == hp->phase && p->last_index == hp->index;
    p->last_phase = hp->phase;
    p->last_index = hp->index;
    if (!strcmp(hp->phase, "verifying")) {
        push_line(p, json_pack("{s:s}", "status", "verifying sha256 digest"));
        return;
    }
    if (!strcmp(hp->phase, "joining")) {
        snprintf(status, sizeof status, "joining %d parts", hp->n_files);
        push_line(p, json_pack("{s:s}", "status", status));
        return;
    }
    if (!strcmp(hp->phase, "done") && again)
        return;
    snprintf(status, sizeof status, "pulling %.12s",
             hp->file->sha256[0] ? hp->file->sha256 : hp->file->name);
    push_line(p, json_pack("{s:s, s:s, s:I, s:I}", "status", status, "digest", digest,
                           "total", (json_int_t)hp->file_total, "completed",
                           (json_int_t)hp->file_done));
}

static void *pull_thread(void *arg)
{
    api_pull *p = arg;
    api_server *s = p->srv;
    hub_config cfg;
    hub_config_default(&cfg);
    cfg.models_dir = registry_models_dir(s->reg);
    cfg.progress = on_progress;
    cfg.arg = p;
    cfg.cancel = &p->cancel;
    hub_plan *plan = rc_malloc(sizeof *plan);
    int rc;
    push_line(p, json_pack("{s:s}", "status", "pulling manifest"));
    if (!plan)
        rc = rc_fail(RC_ENOMEM, "out of memory");
    else if (!cfg.models_dir)
        rc = rc_fail(RC_ESTATE, "this node has no models folder to pull into");
    else if (!(rc = hub_resolve(&cfg, p->name, p->file[0] ? p->file : NULL, plan)))
        rc = hub_download(&cfg, plan);
    pthread_mutex_lock(&p->mu);
    p->rc = rc;
    if (rc)
        snprintf(p->err, sizeof p->err, "%s", rc_errmsg());
    else
        hub_model_name(&cfg, plan, p->model, sizeof p->model);
    p->done = true;
    pthread_mutex_unlock(&p->mu);
    rc_free(plan);
    event_active(p->wake, 0, 0);
    return NULL;
}

static int status_of(int rc)
{
    switch (rc) {
    case RC_EINVAL: return 400;
    case RC_ENOTFOUND: return 404;
    case RC_ELIMIT: return 507;
    case RC_ESTATE: return 499;
    case RC_ENOMEM: return 500;
    default: return 502;        /* the Hub, its CDN or the disk failed us */
    }
}

static void free_pull(api_pull *p)
{
    api_server *s = p->srv;
    if (p->prev)
        p->prev->next = p->next;
    else
        s->pulls = p->next;
    if (p->next)
        p->next->prev = p->prev;
    if (p->evcon)
        evhttp_connection_set_closecb(p->evcon, NULL, NULL);
    if (p->req && p->req_owned)
        evhttp_request_free(p->req);
    if (p->wake)
        event_free(p->wake);
    pthread_mutex_destroy(&p->mu);
    sb_free(&p->lines);
    rc_free(p);
}

static void on_close(struct evhttp_connection *evcon, void *arg)
{
    api_pull *p = arg;
    p->evcon = NULL;
    /* as job.c: a request detached from the dying connection is ours to
     * free, one still attached is freed by libevent after this */
    if (p->req) {
        if (evhttp_request_get_connection(p->req) == NULL)
            p->req_owned = true;
        else
            p->req = NULL;
    }
    p->cancel = 1;
}

static void send_chunk(api_pull *p, const char *text, size_t len)
{
    if (!p->req || !p->evcon || !len)
        return;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return;
    evbuffer_add(b, text, len);
    evhttp_send_reply_chunk(p->req, b);
    evbuffer_free(b);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    api_pull *p = arg;
    api_server *s = p->srv;
    pthread_mutex_lock(&p->mu);
    bool done = p->done;
    strbuf lines = p->lines;
    memset(&p->lines, 0, sizeof p->lines);
    pthread_mutex_unlock(&p->mu);
    if (p->stream && p->req && p->evcon && !p->started) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(p->req);
        evhttp_add_header(h, "Content-Type", "application/x-ndjson");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        srv_cors_headers(s, p->req);
        evhttp_send_reply_start(p->req, 200, "OK");
        p->started = true;
    }
    if (p->stream)
        send_chunk(p, lines.p, lines.len);
    sb_free(&lines);
    if (!done)
        return;
    pthread_join(p->thread, NULL);
    int status = p->rc ? status_of(p->rc) : 200;
    if (!p->rc) {
        registry_rescan(s->reg);
        if (s->cfg.cluster)
            cluster_rescan_models(s->cfg.cluster);
    }
    if (p->evcon) {
        evhttp_connection_set_closecb(p->evcon, NULL, NULL);
        struct timeval t = { s->cfg.timeout_s, 0 };
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(p->evcon), &t, &t);
    }
    json_t *last = p->rc ? json_pack("{s:s}", "error", p->err)
                         : json_pack("{s:s, s:s}", "status", "success", "model", p->model);
    if (p->req && p->evcon && p->started) {
        char *text = last ? json_dumps(last, JSON_COMPACT) : NULL;
        if (text) {
            send_chunk(p, text, strlen(text));
            send_chunk(p, "\n", 1);
        }
        free(text);
        evhttp_send_reply_end(p->req);
    } else if (p->req && p->evcon && p->rc) {
        api_error e;
        api_fail(&e, status, p->rc == RC_ELIMIT ? "insufficient_storage" : "pull_failed",
                 "model", "%s", p->err);
        http_reply_error(s, p->req, p->ollama, &e);
    } else if (p->req && p->evcon) {
        http_reply_json(s, p->req, 200, json_incref(last), NULL, NULL);
    }
    json_decref(last);
    if (p->req && !p->req_owned)
        p->req = NULL;          /* answered: libevent frees it */
    srv_log_request(s, p->client, "POST", p->path, p->cancel && p->rc ? 499 : status, p->key_id);
    free_pull(p);
}

int pull_start(api_server *s, struct evhttp_request *req, const char *path, const char *key_id,
               const char *body, size_t len)
{
    bool ollama = !strcmp(path, "/api/pull");
    api_error e;
    json_error_t jerr;
    json_t *o = json_loadb(body, len, 0, &jerr);
    const char *name = json_string_value(json_object_get(o, "model"));
    if (!name)
        name = json_string_value(json_object_get(o, "name"));
    const char *file = json_string_value(json_object_get(o, "file"));
    json_t *stream = json_object_get(o, "stream");
    int status = 400;
    hub_ref ref;
    if (!json_is_object(o))
        api_fail(&e, 400, "invalid_json", NULL, "the body is not a JSON object: %s",
                 o ? "another JSON value" : jerr.text);
    else if (!name || !*name)
        api_fail(&e, 400, "missing_model", "model", "'model' names what to pull, "
                 "e.g. hf.co/ORG/REPO:Q4_K_M");
    else if (stream && !json_is_boolean(stream))
        api_fail(&e, 400, "invalid_type", "stream", "'stream' is true or false");
    else if (json_object_get(o, "file") && !file)
        api_fail(&e, 400, "invalid_type", "file", "'file' is a file name of the repository");
    else if (strlen(name) >= sizeof ((api_pull *)0)->name || (file && strlen(file) >= HUB_PATH_MAX))
        api_fail(&e, 400, "too_long", "model", "the name is too long");
    else if (hub_parse_ref(name, &ref))
        api_fail(&e, 400, "invalid_model", "model", "%s", rc_errmsg());
    else
        status = 0;
    api_pull *p = status ? NULL : rc_calloc(1, sizeof *p);
    if (!status && !p) {
        api_fail(&e, 500, "out_of_memory", NULL, "out of memory");
        status = 500;
    }
    if (status) {
        json_decref(o);
        http_reply_error(s, req, ollama, &e);
        return status;
    }
    p->srv = s;
    p->req = req;
    p->ollama = ollama;
    /* Ollama streams unless told not to; our endpoint answers once unless asked */
    p->stream = stream ? json_is_true(stream) : ollama;
    snprintf(p->path, sizeof p->path, "%s", path);
    snprintf(p->key_id, sizeof p->key_id, "%s", key_id ? key_id : "");
    srv_peer(req, p->client, sizeof p->client);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->file, sizeof p->file, "%s", file ? file : "");
    json_decref(o);
    pthread_mutex_init(&p->mu, NULL);
    p->last_index = -1;
    p->next = s->pulls;
    if (s->pulls)
        s->pulls->prev = p;
    s->pulls = p;
    p->wake = event_new(s->base, -1, 0, on_wake, p);
    if (!p->wake || pthread_create(&p->thread, NULL, pull_thread, p)) {
        p->req = NULL;
        free_pull(p);
        api_fail(&e, 500, "server_error", NULL, "cannot start the pull");
        http_reply_error(s, req, ollama, &e);
        return 500;
    }
    p->evcon = evhttp_request_get_connection(req);
    if (p->evcon) {
        evhttp_connection_set_closecb(p->evcon, on_close, p);
        /* a pull may stay quiet for long (a listing, a slow CDN, a whole file
         * before the answer): no read timeout, only the write timeout */
        struct timeval wt = { s->cfg.timeout_s, 0 };
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(p->evcon), NULL, &wt);
    }
    return 0;
}

void pull_shutdown(api_server *s)
{
    for (api_pull *p = s->pulls; p; p = p->next)
        p->cancel = 1;
    while (s->pulls) {
        api_pull *p = s->pulls;
        pthread_join(p->thread, NULL);
        if (p->evcon)
            evhttp_connection_set_closecb(p->evcon, NULL, NULL);
        p->evcon = NULL;
        if (p->req && !p->req_owned)
            p->req = NULL;      /* the server's connections free it */
        free_pull(p);
    }
}
