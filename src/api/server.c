/* server.c - the evhttp server: listening socket, routing, API keys, CORS,
 * body limits, the small endpoints, start and shutdown.
 *
 * HTTP parsing, keep-alive, chunked encoding and timeouts are libevent's
 * (evhttp); this file decides what each request gets.  Limits:
 *   - headers: 64 KiB; body: --max-body (answered 413 in JSON; a body
 *     beyond twice the limit is cut by evhttp while reading, with its own
 *     413 page);
 *   - --timeout seconds of silence while a request is read or an answer
 *     written closes the connection (slow clients, slow-loris), without
 *     disturbing anyone else: the loop never waits on one socket.
 * Listeners: the API's (HTTPS through tls.c with --tls-cert/--tls-key), and
 * with a cluster a plain one on 127.0.0.1 where forward.c replays the
 * requests other nodes forward (the only place its mark counts).
 */
#include "server_internal.h"
#include "cluster_query.h"
#include "tls.h"
#include "base/err.h"
#include "base/evbase.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"
#include "cluster/pipeline.h"
#include "cluster/placement.h"
#include "placed.h"
#include "tensor/kv_types.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A model's plan, which its engine thread replaces when it rebuilds the
 * instance after a node was lost (a new reference, or NULL). */
static json_t *model_plan(api_model *m)
{
    pthread_mutex_lock(&m->mu);
    json_t *p = json_incref(m->plan);
    pthread_mutex_unlock(&m->mu);
    return p;
}

#define RACIMO_VERSION "0.1.0"

void api_config_default(api_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->parallel = 4;
    c->ctx_size = 4096;
    c->batch = 512;
    c->threads = os_n_physical_cores();
    c->queue = 64;
    c->max_body_bytes = (size_t)8 << 20;
    c->timeout_s = 30;
    c->cache_type = KV_TYPE_DEFAULT;
    c->price_kwh = -1;
    c->cloud_price = -1;
}

bool srv_is_ollama_path(const char *path)
{
    return !strncmp(path, "/api/", 5);
}

bool srv_is_anthropic_path(const char *path)
{
    return !strncmp(path, "/v1/messages", 12) &&
           (path[12] == '\0' || path[12] == '/' || path[12] == '?');
}

/* ---- access control ---- */

static bool origin_allowed(const api_server *s, const char *origin, bool *any)
{
    *any = false;
    for (int i = 0; i < s->cfg.n_cors_origins; i++) {
        if (!strcmp(s->cfg.cors_origins[i], "*")) {
            *any = true;
            return true;
        }
        if (origin && !strcmp(s->cfg.cors_origins[i], origin))
            return true;
    }
    return false;
}

void srv_cors_headers(api_server *s, struct evhttp_request *req)
{
    if (!s->cfg.n_cors_origins)
        return;
    const char *origin = evhttp_find_header(evhttp_request_get_input_headers(req), "Origin");
    bool any;
    if (!origin || !origin_allowed(s, origin, &any))
        return;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any)
        evhttp_add_header(h, "Vary", "Origin");
}

/* Compares in time that depends only on the lengths. */
static bool same_secret(const char *a, size_t al, const char *b, size_t bl)
{
    unsigned char diff = (unsigned char)(al != bl);
    for (size_t i = 0; i < al && i < bl; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

const char *srv_bearer(struct evhttp_request *req)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *auth = evhttp_find_header(in, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7))
        return evhttp_find_header(in, "x-api-key");
    const char *given = auth + 7;
    while (*given == ' ')
        given++;
    return given;
}

void srv_peer(struct evhttp_request *req, char *out, size_t cap)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    char *addr = NULL;
    ev_uint16_t port = 0;
    if (evcon)
        evhttp_connection_get_peer(evcon, &addr, &port);
    snprintf(out, cap, "%s:%u", addr ? addr : "?", (unsigned)port);
}

/* 0 when the request may proceed (key_id set to "key-N" or ""). */
static int check_key(api_server *s, struct evhttp_request *req, char *key_id, size_t cap)
{
    key_id[0] = '\0';
    if (!s->cfg.n_api_keys)
        return 0;
    const char *given = srv_bearer(req);
    if (!given)
        return -1;
    size_t gl = strlen(given);
    int found = -1;
    for (int i = 0; i < s->cfg.n_api_keys; i++)
        if (same_secret(given, gl, s->cfg.api_keys[i], strlen(s->cfg.api_keys[i])) && found < 0)
            found = i;
    if (found < 0)
        return -1;
    snprintf(key_id, cap, "key-%d", found + 1);
    return 0;
}

int api_read_key_file(const char *path, char ***keys, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return rc_fail(RC_EIO, "cannot read the API key file %s: %s", path, strerror(errno));
    char line[4096];
    int rc = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line, *end;
        while (*p == ' ' || *p == '\t')
            p++;
        end = p + strlen(p);
        while (end > p && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (!*p || *p == '#')
            continue;
        char **nk = rc_realloc(*keys, (size_t)(*n + 1) * sizeof *nk);
        if (!nk || !(nk[*n] = rc_strdup(p))) {
            if (nk)
                *keys = nk;
            rc = rc_fail(RC_ENOMEM, "out of memory");
            break;
        }
        *keys = nk;
        (*n)++;
    }
    fclose(f);
    return rc;
}

/* ---- small endpoints ---- */

void srv_log_request(api_server *s, const char *client, const char *method, const char *path,
                     int status, const char *key_id)
{
    metrics_request(s->metrics, path, status);
    if (!s->alog)
        return;
    access_entry e = { .client = client, .key_id = key_id && key_id[0] ? key_id : NULL,
                       .method = method, .path = path, .status = status, .ttft_ms = -1 };
    access_log_write(s->alog, &e);
}

static void log_request(api_server *s, struct evhttp_request *req, const char *method,
                        const char *path, int status, const char *key_id)
{
    char client[64];
    srv_peer(req, client, sizeof client);
    srv_log_request(s, client, method, path, status, key_id);
}

static const char *state_name(int st)
{
    static const char *const names[] = { "available", "loading", "loaded", "failed" };
    return st >= 0 && st <= MODEL_FAILED ? names[st] : "unknown";
}

static int health(api_server *s, struct evhttp_request *req)
{
    bool loading = registry_any_loading(s->reg);
    http_reply_json(s, req, loading ? 503 : 200,
                    json_pack("{s:s}", "status", loading ? "loading" : "ok"), NULL, NULL);
    return loading ? 503 : 200;
}

static int metrics(api_server *s, struct evhttp_request *req)
{
    strbuf b = { 0 };
    metrics_render(s->metrics, s->reg, &b);
    srv_cost_metrics(s, &b);
    if (sb_failed(&b)) {
        sb_free(&b);
        http_reply_json(s, req, 500, NULL, NULL, NULL);
        return 500;
    }
    http_reply_text(s, req, 200, "text/plain; version=0.0.4; charset=utf-8", sb_cstr(&b), b.len);
    sb_free(&b);
    return 200;
}

/* The models this node serves (loaded) and their free sequence slots,
 * published to its cluster; the cluster sends them on only when they
 * change (forward.c balances busy copies with them). */
static void publish_serving(api_server *s)
{
    if (!s->cfg.cluster)
        return;
    int n = 0, k = 0;
    api_model **list = registry_list(s->reg, &n);
    const char **names = list && n ? rc_calloc((size_t)n, sizeof *names) : NULL;
    int *free_slots = list && n ? rc_calloc((size_t)n * 2, sizeof *free_slots) : NULL;
    int *slots = free_slots ? free_slots + n : NULL;
    for (int i = 0; names && free_slots && i < n; i++)
        if (registry_state(s->reg, list[i], NULL, 0) == MODEL_READY) {
            engine_stats es;
            engine_get_stats(list[i]->eng, &es);
            free_slots[k] = list[i]->ep.n_seq - es.n_active - es.n_queued;
            slots[k] = list[i]->ep.n_seq;
            names[k++] = list[i]->name;
        }
    if ((names && free_slots) || !n)
        cluster_set_serving(s->cfg.cluster, names, free_slots, slots, k);
    rc_free(names);
    rc_free(free_slots);
    rc_free(list);
}

/* Model m (in state st) as /v1/cluster lists it: file, state, and when it
 * runs its load, counters, recoveries, plan and cost (view: the cluster's,
 * or NULL). */
static json_t *model_json(api_server *s, api_model *m, int st, const json_t *view)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "name", m->name, "path", m->path,
                          "size_bytes", (json_int_t)m->size_bytes, "state", state_name(st));
    if (!o || st != MODEL_READY)
        return o;
    engine_stats es;
    engine_get_stats(m->eng, &es);
    json_t *e = json_pack("{s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I}",
                          "parallel", m->ep.n_seq, "ctx_size", m->ep.n_ctx,
                          "cache_type", kv_type_name(m->ep.kv_type),
                          "threads", m->ep.n_threads, "active", es.n_active,
                          "queued", es.n_queued, "kv_used", es.kv_used,
                          "kv_total", es.kv_total, "tokens_prompt",
                          (json_int_t)es.tokens_prompt, "tokens_cached",
                          (json_int_t)es.tokens_cached, "tokens_generated",
                          (json_int_t)es.tokens_gen);
    json_object_update(o, e);
    json_decref(e);
    /* instances rebuilt after a node was lost (engine_set_rebuild) */
    json_t *rec = json_pack("{s:i, s:i, s:I}", "count", es.n_recoveries, "failed",
                            es.n_recoveries_failed, "tokens_replayed",
                            (json_int_t)es.tokens_replayed);
    if (rec && es.last_recovery_at > 0)
        json_object_set_new(rec, "last",
                            json_pack("{s:f, s:f, s:i, s:s}", "at", es.last_recovery_at,
                                      "seconds", es.last_recovery_s, "sequences",
                                      es.last_recovery_seqs, "why", es.last_recovery_why));
    json_object_set_new(o, "recoveries", rec);
    json_t *plan = model_plan(m);
    json_object_set_new(o, "cost", srv_model_cost(s, m, plan, view));
    if (plan)
        json_object_set_new(o, "plan", plan);
    return o;
}

void srv_publish_instances(api_server *s)
{
    if (!s->cfg.cluster)
        return;
    json_t *view = NULL;
    json_t *all = json_array(), *stable = json_array();
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    for (int i = 0; list && i < n; i++) {
        if (registry_state(s->reg, list[i], NULL, 0) != MODEL_READY)
            continue;
        /* taken once a second: only when a model needs it (the whole
         * cluster's view costs more as the cluster grows) */
        if (!view)
            view = cluster_snapshot(s->cfg.cluster);
        json_t *o = model_json(s, list[i], MODEL_READY, view);
        if (!o)
            continue;
        json_object_del(o, "path");           /* this machine's business */
        /* what others must see at once: which instances run where */
        json_array_append_new(stable, json_pack("{s:s, s:O?}", "name", list[i]->name, "stages",
                                                json_object_get(json_object_get(o, "plan"),
                                                                "stages")));
        json_array_append_new(all, o);
    }
    rc_free(list);
    if (all && stable)
        cluster_set_published(s->cfg.cluster, "instances", all, stable);
    json_decref(all);
    json_decref(stable);
    json_decref(view);
}

/* This node's state; with a cluster, also the cluster's view (self,
 * leader, quorum, nodes, links...: every node answers the same). */
static int cluster(api_server *s, struct evhttp_request *req)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    if (s->cfg.cluster)
        publish_serving(s);
    json_t *view = s->cfg.cluster ? cluster_snapshot(s->cfg.cluster) : NULL;
    json_t *models = json_array();
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    for (int i = 0; i < n; i++)
        json_array_append_new(models, model_json(s, list[i], registry_state(s->reg, list[i],
                                                                             NULL, 0), view));
    rc_free(list);
    char listen[300];
    snprintf(listen, sizeof listen, "%s:%d", s->cfg.host, s->port);
    json_t *body = json_pack(
        "{s:{s:s, s:s, s:i, s:s, s:f, s:i, s:i, s:I, s:I, s:I}, s:o, s:{s:s, s:[]}}",
        "node", "hostname", host, "version", RACIMO_VERSION, "pid", (int)getpid(),
        "listen", listen, "uptime_s", (double)(os_now_ns() - s->t_start_ns) * 1e-9,
        "cpus", os_n_cpus(), "physical_cores", os_n_physical_cores(),
        "memory_total_bytes", (json_int_t)os_total_memory_bytes(),
        "memory_available_bytes", (json_int_t)os_available_memory_bytes(),
        "rss_bytes", (json_int_t)os_current_rss_bytes(),
        "models", models,
        "cluster", "mode", "standalone", "peers");
    if (body)
        json_object_set_new(body, "cost", srv_cost_basis(s));
    if (body && s->cfg.cluster) {
        if (view) {
            json_object_update(body, view);
            json_object_set_new(body, "cluster", json_pack("{s:s}", "mode", "cluster"));
        }
        if (s->cfg.pipeline)
            json_object_set_new(body, "pipelines", pipeline_status(s->cfg.pipeline));
    }
    json_decref(view);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    if (body && cluster_query_apply(body, uri ? evhttp_uri_get_query(uri) : NULL) != 0) {
        json_decref(body);
        api_error e;
        api_fail(&e, 400, "invalid_value", NULL, "%s", rc_errmsg());
        http_reply_error(s, req, false, &e);
        return 400;
    }
    http_reply_json(s, req, 200, body, NULL, NULL);
    return 200;
}

/* DELETE /api/delete (Ollama): {"model": NAME} ("name" in older clients);
 * 200 with no body, as Ollama. */
static int delete_model(api_server *s, struct evhttp_request *req, const char *body, size_t len)
{
    api_error e;
    json_t *o = json_loadb(body ? body : "", len, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "model"));
    if (!name)
        name = json_string_value(json_object_get(o, "name"));
    api_model *m = name ? registry_find(s->reg, name) : NULL;
    int rc = m ? registry_delete(s->reg, m) : 0;
    if (!name)
        api_fail(&e, 400, "missing_field", "model", "model is required");
    else if (!m)
        api_fail(&e, 404, "model_not_found", "model", "model '%.200s' not found", name);
    else if (rc == RC_ENOTFOUND)
        api_fail(&e, 404, "model_not_found", "model", "%s", rc_errmsg());
    else if (rc)
        api_fail(&e, rc == RC_EIO ? 500 : 409, "cannot_delete", "model", "%s", rc_errmsg());
    json_decref(o);
    if (name && m && !rc) {
        if (s->cfg.cluster)
            cluster_rescan_models(s->cfg.cluster);
        http_reply_text(s, req, 200, "application/json", "", 0);
        return 200;
    }
    http_reply_error(s, req, true, &e);
    return e.status;
}

/* The placement wishes of a POST /v1/instances body: "split" ("layers",
 * "tensor", "auto"), "min_nodes" (1-PLACEMENT_MAX_STAGES) and "nodes" (ids
 * or names, at most PLACE_WISH_NODES); false with e set when one is
 * malformed. */
static bool parse_wish(const json_t *o, place_wish *w, api_error *e)
{
    static const char *const splits[] = { "layers", "tensor", "auto" };
    memset(w, 0, sizeof *w);
    const json_t *split = json_object_get(o, "split"), *k = json_object_get(o, "min_nodes");
    const json_t *nodes = json_object_get(o, "nodes"), *node;
    size_t at;
    if (nodes && !json_is_null(nodes)) {
        if (!json_is_array(nodes) || json_array_size(nodes) > PLACE_WISH_NODES) {
            api_fail(e, 400, "invalid_value", "nodes", "nodes must be a list of at most %d "
                     "node ids or names", PLACE_WISH_NODES);
            return false;
        }
        json_array_foreach(nodes, at, node) {
            const char *id = json_string_value(node);
            if (!id || !*id || strlen(id) >= sizeof w->nodes[0]) {
                api_fail(e, 400, "invalid_value", "nodes", "nodes[%zu] is not a node id or "
                         "name", at);
                return false;
            }
            snprintf(w->nodes[w->n_nodes++], sizeof w->nodes[0], "%s", id);
        }
    }
    if (split && !json_is_null(split)) {
        const char *v = json_string_value(split);
        for (int i = 0; v && i < 3; i++)
            if (!strcmp(v, splits[i]))
                w->split = PLACE_SPLIT_LAYERS + i;
        if (!w->split) {
            api_fail(e, 400, "invalid_value", "split", "split must be \"layers\", \"tensor\" "
                     "or \"auto\"");
            return false;
        }
    }
    if (k && !json_is_null(k)) {
        if (!json_is_integer(k) || json_integer_value(k) < 1 ||
            json_integer_value(k) > PLACEMENT_MAX_STAGES) {
            api_fail(e, 400, "invalid_value", "min_nodes", "min_nodes must be an integer from "
                     "1 to %d", PLACEMENT_MAX_STAGES);
            return false;
        }
        w->min_nodes = (int)json_integer_value(k);
    }
    return true;
}

/* POST /v1/instances {"model", "split", "min_nodes"}: starts a model
 * (placing it on the cluster) without waiting for a request; 202 while it
 * loads, 200 when ready (with its plan).  With "dry_run": true, only the
 * plan it would get now (200 {"model", "plan"}).  POST /v1/instances/stop
 * {"model"}: stops it (409 while it runs requests). */
static int instances(api_server *s, struct evhttp_request *req, bool stop, const char *body,
                     size_t len)
{
    api_error e;
    json_t *o = json_loadb(body ? body : "", len, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "model"));
    api_model *m = name ? registry_find(s->reg, name) : NULL;
    place_wish wish;
    int status;
    if (!o || !json_is_object(o)) {
        api_fail(&e, 400, "invalid_json", NULL, "the body must be a JSON object");
    } else if (!name) {
        api_fail(&e, 400, "missing_field", "model", "model is required");
    } else if (!m) {
        api_fail(&e, 404, "model_not_found", "model", "model '%.200s' not found", name);
    } else if (!stop && !parse_wish(o, &wish, &e)) {
        /* e set */
    } else if (!stop && json_is_true(json_object_get(o, "dry_run"))) {
        json_t *plan = NULL;
        int rc = placed_preview(registry_get_config(s->reg), m, &wish, &plan);
        if (rc) {
            api_fail(&e, rc == RC_ESTATE ? 409 : rc == RC_EINVAL ? 400 : 500, "preview_failed",
                     "model", "%s", rc_errmsg());
        } else {
            json_decref(o);
            http_reply_json(s, req, 200, json_pack("{s:s, s:o}", "model", m->name, "plan", plan),
                            NULL, NULL);
            return 200;
        }
    } else if (stop) {
        if (registry_unload(s->reg, m)) {
            api_fail(&e, 409, "model_busy", "model", "%s", rc_errmsg());
        } else {
            json_decref(o);
            http_reply_json(s, req, 200, json_pack("{s:s, s:s}", "model", m->name, "state",
                                                   state_name(MODEL_AVAILABLE)), NULL, NULL);
            return 200;
        }
    } else {
        char err[512] = "";
        int st0 = registry_state(s->reg, m, NULL, 0);
        if (st0 == MODEL_AVAILABLE || st0 == MODEL_FAILED)
            m->wish = wish;              /* read by the loader registry_load starts */
        registry_load(s->reg, m);
        int st = registry_state(s->reg, m, err, sizeof err);
        status = st == MODEL_READY ? 200 : st == MODEL_FAILED ? 500 : 202;
        if (st == MODEL_FAILED) {
            api_fail(&e, 500, "model_load_failed", "model", "model '%.200s' failed to load: %s",
                     m->name, err);
        } else {
            json_t *b = json_pack("{s:s, s:s}", "model", m->name, "state", state_name(st));
            json_t *plan = b && st == MODEL_READY ? model_plan(m) : NULL;
            if (plan)
                json_object_set_new(b, "plan", plan);
            json_decref(o);
            http_reply_json(s, req, status, b, NULL, NULL);
            return status;
        }
    }
    json_decref(o);
    http_reply_error(s, req, false, &e);
    return e.status;
}

/* ---- routing ---- */

typedef struct {
    const char *path;
    int method;                 /* EVHTTP_REQ_* */
    int kind;                   /* enum api_kind, or -1 for the others */
} route;

static const route routes[] = {
    { "/v1/chat/completions", EVHTTP_REQ_POST, API_OPENAI_CHAT },
    { "/v1/completions",      EVHTTP_REQ_POST, API_OPENAI_COMPLETION },
    { "/api/chat",            EVHTTP_REQ_POST, API_OLLAMA_CHAT },
    { "/api/generate",        EVHTTP_REQ_POST, API_OLLAMA_GENERATE },
    { "/v1/messages",         EVHTTP_REQ_POST, API_ANTHROPIC_MESSAGES },
    { "/v1/messages/count_tokens", EVHTTP_REQ_POST, API_ANTHROPIC_COUNT },
    { "/v1/embeddings",       EVHTTP_REQ_POST, API_OPENAI_EMBED },
    { "/api/embed",           EVHTTP_REQ_POST, API_OLLAMA_EMBED },
    { "/api/embeddings",      EVHTTP_REQ_POST, API_OLLAMA_EMBEDDINGS },
    { "/v1/models",           EVHTTP_REQ_GET,  -1 },
    { "/v1/models/pull",      EVHTTP_REQ_POST, -1 },
    { "/v1/models/copy",      EVHTTP_REQ_POST, -1 },
    { "/v1/models/copies",    EVHTTP_REQ_GET,  -1 },
    { "/api/pull",            EVHTTP_REQ_POST, -1 },
    { "/api/delete",          EVHTTP_REQ_DELETE, -1 },
    { "/v1/cluster",          EVHTTP_REQ_GET,  -1 },
    { "/v1/instances",        EVHTTP_REQ_POST, -1 },
    { "/v1/instances/stop",   EVHTTP_REQ_POST, -1 },
    { "/api/tags",            EVHTTP_REQ_GET,  -1 },
    { "/api/show",            EVHTTP_REQ_POST, -1 },
    { "/api/version",         EVHTTP_REQ_GET,  -1 },
    { "/api/ps",              EVHTTP_REQ_GET,  -1 },
    { "/health",              EVHTTP_REQ_GET,  -1 },
    { "/metrics",             EVHTTP_REQ_GET,  -1 },
};

static const char *method_name(int m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    default: return "OTHER";
    }
}

static int reply_err(api_server *s, struct evhttp_request *req, const char *path, int status,
                     const char *code, const char *fmt, const char *arg)
{
    api_error e;
    api_fail(&e, status, code, NULL, fmt, arg);
    http_reply_error(s, req, srv_is_ollama_path(path), &e);
    return status;
}

/* `local`: the request came to the loopback listener of forwarded requests. */
static void handle(struct evhttp_request *req, api_server *s, bool local)
{
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *p = uri ? evhttp_uri_get_path(uri) : NULL;
    char path[256];
    snprintf(path, sizeof path, "%s", p && *p ? p : "/");
    size_t pl = strlen(path);
    while (pl > 1 && path[pl - 1] == '/')
        path[--pl] = '\0';
    int method = evhttp_request_get_command(req);
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    char key_id[16] = "";
    int status;

    struct evbuffer *body = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(body);
    if (len > s->cfg.max_body_bytes) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        char limit[32];
        snprintf(limit, sizeof limit, "%zu", s->cfg.max_body_bytes);
        status = reply_err(s, req, path, 413, "request_too_large",
                           "the request body is larger than the limit of %s bytes (--max-body)",
                           limit);
        log_request(s, req, method_name(method), path, status, NULL);
        return;
    }
    if (method == EVHTTP_REQ_OPTIONS) {      /* CORS preflight: no key needed */
        struct evkeyvalq *out = evhttp_request_get_output_headers(req);
        srv_cors_headers(s, req);
        if (evhttp_find_header(out, "Access-Control-Allow-Origin")) {
            const char *want = evhttp_find_header(in, "Access-Control-Request-Headers");
            evhttp_add_header(out, "Access-Control-Allow-Methods",
                              "GET, POST, DELETE, OPTIONS");
            evhttp_add_header(out, "Access-Control-Allow-Headers",
                              want ? want : "Authorization, Content-Type");
            evhttp_add_header(out, "Access-Control-Max-Age", "600");
        }
        evhttp_send_reply(req, 204, "No Content", NULL);
        log_request(s, req, "OPTIONS", path, 204, NULL);
        return;
    }
    bool internal = fwd_internal(s, req, path, local);
    if (internal)           /* admitted by forward.c with one of this node's keys */
        snprintf(key_id, sizeof key_id, "%s", fwd_key_id(req) ? fwd_key_id(req) : "");
    else if (strcmp(path, "/health") && !dashboard_path(path) &&
             check_key(s, req, key_id, sizeof key_id)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
        status = reply_err(s, req, path, 401, "invalid_api_key", "%s",
                           "a valid API key is required: send 'Authorization: Bearer <key>' "
                           "(or 'x-api-key: <key>')");
        log_request(s, req, method_name(method), path, status, NULL);
        return;
    }
    if (dashboard_path(path)) {
        status = dashboard_serve(s, req, path, method);
        log_request(s, req, method_name(method), path, status, key_id);
        return;
    }
    if (!strncmp(path, "/v1/cluster/", 12)) {
        status = cluster_admin(s, req, path, method);
        log_request(s, req, method_name(method), path, status, key_id);
        return;
    }
    const route *r = NULL;
    bool path_known = false;
    bool models_one = !strncmp(path, "/v1/models/", 11) && path[11];
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(routes[i].path, path) && !(models_one && !strcmp(routes[i].path, "/v1/models")))
            continue;
        path_known = true;
        if (routes[i].method == method ||
            (method == EVHTTP_REQ_HEAD && routes[i].method == EVHTTP_REQ_GET))
            r = &routes[i];
    }
    if (!r) {
        status = path_known ? reply_err(s, req, path, 405, "method_not_allowed",
                                        "%s is not allowed here", method_name(method))
                            : reply_err(s, req, path, 404, "not_found",
                                        "no endpoint %.200s", path);
        log_request(s, req, method_name(method), path, status, key_id);
        return;
    }
    const char *data = len ? (const char *)evbuffer_pullup(body, -1) : "";
    if (r->kind >= 0) {
        api_request ar;
        api_error e;
        if (api_request_parse(r->kind, data, len, &ar, &e)) {
            http_reply_error(s, req, srv_is_ollama_path(path), &e);
            log_request(s, req, "POST", path, e.status, key_id);
            return;
        }
        if (!internal && fwd_route(s, req, r->path, ar.model, data, len, key_id)) {
            api_request_free(&ar);
            return;
        }
        static const job_ops *const ops[API_N_KINDS] = {
            &openai_chat_ops, &openai_completion_ops, &ollama_chat_ops, &ollama_generate_ops,
            &anthropic_ops, &anthropic_ops, &embed_ops, &embed_ops, &embed_ops };
        job_run(s, req, r->path, key_id, internal ? fwd_client(req) : NULL, &ar, ops[r->kind]);
        return;
    }
    if (!strcmp(r->path, "/api/pull") || !strcmp(r->path, "/v1/models/pull")) {
        /* answered (and logged) by pull.c when the pull ends */
        if ((status = pull_start(s, req, r->path, key_id, data, len)))
            log_request(s, req, "POST", r->path, status, key_id);
        return;
    }
    status = 200;
    if (!strcmp(r->path, "/health"))
        status = health(s, req);
    else if (!strcmp(r->path, "/metrics"))
        status = metrics(s, req);
    else if (!strcmp(r->path, "/v1/cluster"))
        status = cluster(s, req);
    else if (!strcmp(r->path, "/v1/instances") || !strcmp(r->path, "/v1/instances/stop"))
        status = instances(s, req, !strcmp(r->path, "/v1/instances/stop"), data, len);
    else if (!strcmp(r->path, "/v1/models"))
        status = openai_models(s, req, models_one ? path + 11 : NULL);
    else if (!strcmp(r->path, "/api/tags"))
        ollama_tags(s, req);
    else if (!strcmp(r->path, "/v1/models/copy"))
        status = copies_request(s, req, data, len);
    else if (!strcmp(r->path, "/v1/models/copies"))
        status = copies_status(s, req);
    else if (!strcmp(r->path, "/api/delete"))
        status = delete_model(s, req, data, len);
    else if (!strcmp(r->path, "/api/ps"))
        ollama_ps(s, req);
    else if (!strcmp(r->path, "/api/version"))
        ollama_version(s, req);
    else if (!strcmp(r->path, "/api/show")) {
        /* a model only other nodes have: the metadata is in their files */
        json_t *o = internal ? NULL : json_loadb(data, len, 0, NULL);
        const char *name = json_string_value(json_object_get(o, "model"));
        if (!name)
            name = json_string_value(json_object_get(o, "name"));
        bool sent = name && fwd_route(s, req, r->path, name, data, len, key_id);
        json_decref(o);
        if (sent)
            return;
        status = ollama_show(s, req, data, len);
    }
    log_request(s, req, method_name(method), r->path, status, key_id);
}

static void handle_public(struct evhttp_request *req, void *arg) { handle(req, arg, false); }
static void handle_local(struct evhttp_request *req, void *arg) { handle(req, arg, true); }

/* ---- start and end ---- */

static void mail_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    job_drain(arg);
}

/* The tick: every TICK_BUSY_MS while requests or forwards are open (a
 * client that left is noticed within that), else every TICK_IDLE_MS (the
 * power reading, idle unloads and retries are second-scale anyway): an
 * idle server wakes once a second, not ten times. */
#define TICK_BUSY_MS 100
#define TICK_IDLE_MS 1000

static void arm_tick(api_server *s, bool busy)
{
    int ms = busy ? TICK_BUSY_MS : TICK_IDLE_MS;
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    s->tick_busy = busy;
    event_add(s->tick_ev, &tv);
}

void srv_tick_soon(api_server *s)
{
    if (s->tick_ev && !s->tick_busy)
        arm_tick(s, true);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    api_server *s = arg;
    job_tick(s);
    fwd_tick(s);
    publish_serving(s);
    srv_power_tick(s);
    registry_unload_idle(s->reg, s->cfg.idle_unload_s);
    registry_retry_lost(s->reg);
    arm_tick(s, s->jobs || fwd_busy(s));
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    api_server *s = arg;
    rc_log(LOG_INFO, "signal %d: stopping", (int)sig);
    event_base_loopbreak(s->base);
}

/* An evhttp with the server's limits listening on host:port (*port_out: the
 * port bound). */
static int listen_on(api_server *s, struct evhttp **out, void (*cb)(struct evhttp_request *, void *),
                     const char *host, int port, int *port_out)
{
    struct evhttp *http = *out = evhttp_new(s->base);
    if (!http)
        return rc_fail(RC_ENOMEM, "cannot set up the event loop");
    evhttp_set_timeout(http, s->cfg.timeout_s);
    /* Bodies up to twice the limit are read and refused here with a JSON
     * 413; evhttp cuts larger ones itself (its 413 has an HTML body:
     * libevent 2.1 has no hook to answer before reading the body). */
    evhttp_set_max_body_size(http, (ev_ssize_t)(s->cfg.max_body_bytes * 2 + 65536));
    evhttp_set_max_headers_size(http, 64 << 10);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                               EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                               EVHTTP_REQ_PATCH);
    evhttp_set_gencb(http, cb, s);
    errno = 0;
    struct evhttp_bound_socket *sock = evhttp_bind_socket_with_handle(http, host,
                                                                      (ev_uint16_t)port);
    if (!sock)
        return rc_fail(RC_EIO, "cannot listen on %s:%d: %s", host, port,
                       errno ? strerror(errno) : "bind failed");
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    *port_out = port;
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) == 0)
        *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static void enable_threads(void) { evthread_use_pthreads(); }

int api_server_new(const api_config *cfg, api_server **out)
{
    *out = NULL;
    pthread_once(&threads_once, enable_threads);
    signal(SIGPIPE, SIG_IGN);          /* a closed socket is an error, not a death */
    api_server *s = rc_calloc(1, sizeof *s);
    if (!s)
        return rc_fail(RC_ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->t_start_ns = os_now_ns();
    srv_power_init(s);
    s->id_state = s->t_start_ns ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&s->mail_mu, NULL);
    int rc = 0;
    if (!(s->base = rc_event_base_new()) ||
        !(s->mail_ev = event_new(s->base, -1, 0, mail_cb, s)) ||
        !(s->tick_ev = event_new(s->base, -1, 0, tick_cb, s)) || metrics_new(&s->metrics)) {
        rc = rc_fail(RC_ENOMEM, "cannot set up the event loop");
        goto fail;
    }
    if (cfg->tls_cert || cfg->tls_key) {
        if (!cfg->tls_cert || !cfg->tls_key) {
            rc = rc_fail(RC_EINVAL, "HTTPS needs both --tls-cert and --tls-key");
            goto fail;
        }
        if ((rc = tls_server_ctx(cfg->tls_cert, cfg->tls_key, &s->tls)))
            goto fail;
    }
    if ((rc = listen_on(s, &s->http, handle_public, cfg->host, cfg->port, &s->port)))
        goto fail;
    if (s->tls)
        evhttp_set_bevcb(s->http, tls_server_bev, s->tls);
    /* Other nodes' requests are replayed to this listener, never to the
     * public one: plain HTTP however the public one speaks, reachable from
     * this machine only, so that the forwarder's mark means something only
     * here (fwd_internal). */
    if (cfg->forward && cfg->cluster &&
        (rc = listen_on(s, &s->http_local, handle_local, "127.0.0.1", 0, &s->local_port)))
        goto fail;
    if ((rc = access_log_open(cfg->access_log, cfg->log_content, &s->alog)))
        goto fail;
    registry_config rcfg = {
        .paths = cfg->model_paths, .n_paths = cfg->n_model_paths, .models_dir = cfg->models_dir,
        .ro_dirs = cfg->ro_dirs, .template_file = cfg->template_file,
        .engine = { .n_ctx = cfg->ctx_size, .n_seq = cfg->parallel, .n_batch = cfg->batch,
                    .n_threads = cfg->threads, .max_queue = cfg->queue,
                    .precision = MATMUL_FAST, .kv_type = cfg->cache_type },
        .cluster = cfg->cluster, .pipeline = cfg->pipeline, .min_nodes = cfg->min_nodes,
        .wire_f32 = cfg->wire_f32, .split_tensor = cfg->split_tensor,
        .split_auto = cfg->split_auto, .weights = cfg->weights,
    };
    if ((rc = registry_new(&rcfg, job_models_changed, s, &s->reg)) || (rc = fwd_attach(s)))
        goto fail;
    arm_tick(s, true);
    if (cfg->handle_signals) {
        s->sig_ev[0] = evsignal_new(s->base, SIGINT, signal_cb, s);
        s->sig_ev[1] = evsignal_new(s->base, SIGTERM, signal_cb, s);
        for (int i = 0; i < 2; i++)
            if (s->sig_ev[i])
                event_add(s->sig_ev[i], NULL);
    }
    registry_load_initial(s->reg);
    *out = s;
    return 0;
fail:
    api_server_free(s);
    return rc;
}

int api_server_port(const api_server *s) { return s->port; }

int api_server_run(api_server *s)
{
    return event_base_dispatch(s->base) < 0 ? rc_fail(RC_EIO, "the event loop failed") : 0;
}

void api_server_stop(api_server *s)
{
    event_base_loopbreak(s->base);
}

void api_server_free(api_server *s)
{
    if (!s)
        return;
    if (s->base)
        fwd_detach(s);              /* before the connections it answers on close */
    registry_free(s->reg);          /* engines end; their requests report on_done */
    if (s->base) {
        pull_shutdown(s);
        job_shutdown(s);
    }
    if (s->http)
        evhttp_free(s->http);
    if (s->http_local)
        evhttp_free(s->http_local);
    if (s->tls)
        SSL_CTX_free(s->tls);
    for (int i = 0; i < 2; i++)
        if (s->sig_ev[i])
            event_free(s->sig_ev[i]);
    if (s->mail_ev)
        event_free(s->mail_ev);
    if (s->tick_ev)
        event_free(s->tick_ev);
    if (s->base)
        event_base_free(s->base);
    metrics_free(s->metrics);
    access_log_close(s->alog);
    pthread_mutex_destroy(&s->mail_mu);
    rc_free(s);
}
