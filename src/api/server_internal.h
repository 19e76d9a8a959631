/* server_internal.h - what the files of the HTTP server share (not for
 * other layers: they use api.h).
 *
 *   server.c    the evhttp server: sockets, routing, authentication, CORS,
 *               body limits, the small endpoints (/health, /metrics,
 *               /v1/cluster), start and shutdown
 *   job.c       one generation request: prompt, submission to the engine,
 *               the engine callbacks and the mailbox they fill, the drain on
 *               the event loop, client disconnects, the end (log, metrics)
 *   writer.c    HTTP bodies: JSON replies, errors in both styles, server-sent
 *               events and JSON lines
 *   openai.c    /v1/... handlers and OpenAI response objects
 *   ollama.c    /api/... handlers and Ollama response objects
 *   anthropic.c /v1/messages: Anthropic's message objects, events and errors
 *   cluster_admin.c  removing a node, rotating the cluster key
 *   dashboard.c the web dashboard's built-in files (/ and /ui/...)
 *   power.c     this node's power, the cost of its models' tokens
 *   pull.c      POST /api/pull and /v1/models/pull: a thread per pull (src/hub)
 *   copy.c      POST /v1/models/copy, GET /v1/models/copies: whole copies on every
 *               node (messages 0x60, 0x61)
 *   forward.c   requests forwarded between nodes (and their API-key proofs)
 *   tls.c       HTTPS: OpenSSL contexts and bufferevents
 *
 * Threads: everything here runs on the event-loop thread except the three
 * engine callbacks in job.c (engine thread) and on_models_changed (loader
 * thread), which touch only the mailbox fields under srv->mail_mu and then
 * wake the loop with event_active (libevent is built thread-safe with
 * evthread_use_pthreads).
 */
#ifndef RC_API_SERVER_INTERNAL_H
#define RC_API_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "access_log.h"
#include "api.h"
#include "buf.h"
#include "metrics.h"
#include "reasoning.h"
#include "registry.h"
#include "request.h"
#include "base/power.h"
#include "infer/stop.h"

typedef struct api_job api_job;
typedef struct api_pull api_pull;

struct api_server {
    api_config cfg;
    struct event_base *base;
    struct evhttp *http;            /* the API's listener (HTTPS with tls) */
    struct evhttp *http_local;      /* with forwarding: plain HTTP on 127.0.0.1 only, where
                                       the forwarder replays other nodes' requests */
    int local_port;
    struct ssl_ctx_st *tls;         /* --tls-cert/--tls-key, or NULL */
    struct event *mail_ev;          /* woken by engine and loader threads */
    struct event *tick_ev;          /* checks idle clients for disconnects */
    bool tick_busy;                 /* tick_ev armed at the busy pace (srv_tick_soon) */
    struct event *sig_ev[2];
    api_registry *reg;
    api_metrics *metrics;
    access_log *alog;
    int port;
    uint64_t t_start_ns;
    uint64_t id_state;              /* response ids (event-loop thread) */
    /* mailbox (mail_mu) */
    pthread_mutex_t mail_mu;
    api_job *ready;                 /* jobs with news, linked by ready_next */
    bool models_changed;
    /* every live job (event-loop thread) */
    api_job *jobs;
    struct fwd_side *fwd;           /* requests forwarded to or from other nodes */
    /* power.c (event-loop thread) */
    power_meter meter;
    double watts;                   /* this node's power now, < 0: unknown */
    uint64_t next_power_ns;
    api_pull *pulls;                /* models being fetched (pull.c; event-loop thread) */
};

/* A logprobs record of one generated token. */
typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[API_MAX_TOP_LOGPROBS];
    float top_lp[API_MAX_TOP_LOGPROBS];
} tok_rec;

/* What an endpoint family writes; all called on the event-loop thread. */
typedef struct {
    void (*start)(api_job *j);                      /* stream: headers, first event */
    void (*delta)(api_job *j, const char *text, size_t len, int tok_from, int tok_to);
    /* stream: a piece of the reasoning (NULL for endpoints without it) */
    void (*reasoning)(api_job *j, const char *text, size_t len, int tok_from, int tok_to);
    void (*final)(api_job *j);                      /* the end: finish reason, usage */
    void (*error)(api_job *j, const api_error *e);  /* before or after start */
} job_ops;

struct api_job {
    api_server *srv;
    struct evhttp_request *req;     /* NULL once libevent freed it */
    struct evhttp_connection *evcon;/* NULL once the connection closed */
    bool req_owned;                 /* detached by libevent: ours to free */
    bool gone;                      /* the connection closed (libevent told us) */
    bool left;                      /* the client closed its socket (peek) */
    const job_ops *ops;
    api_request ar;
    api_model *model;
    char path[32];                  /* endpoint, for metrics and the log */
    char client[64];
    char key_id[16];
    char id[48];                    /* chatcmpl-..., cmpl-... */
    long created;                   /* unix seconds */
    uint64_t t0_ns, t_submit_ns;
    int32_t *prompt;
    int n_prompt;
    gen_request gr;
    /* thinking: when think_parse, the engine thread splits the answer in
     * on_text (before the mailbox), so that stop strings see only the
     * content and end the generation at the token that completes them */
    bool think_parse;
    reasoning_split split;          /* engine thread until on_done */
    stop_matcher *stop;             /* the request's stops over the content, or NULL */
    /* mailbox (srv->mail_mu) */
    strbuf mb_text;                 /* content */
    strbuf mb_reason;               /* reasoning */
    tok_rec *mb_toks;
    int mb_n_toks, mb_cap_toks;
    bool mb_marker, mb_done, in_ready;
    bool mb_stopped;                /* a stop string ended the content (then cancel) */
    gen_result mb_res;
    api_job *ready_next;
    /* event-loop state */
    bool waiting_load, submitted, engine_done, started, finished;
    uint64_t t_keepalive_ns;        /* last bytes sent on the stream (keep-alives after 3 s) */
    strbuf text;                    /* the content so far (the whole answer without thinking) */
    size_t sent;                    /* bytes of text sent as content */
    strbuf reason;                  /* the reasoning so far */
    size_t reason_sent;             /* bytes of it sent */
    bool stopped;                   /* mb_stopped, taken */
    tok_rec *toks;
    int n_toks, cap_toks, toks_sent;
    bool marker;                    /* Mistral [TOOL_CALLS] generated */
    gen_result res;
    int status;                     /* HTTP status sent */
    const char *finish;             /* "stop", "length", "tool_calls" */
    json_t *tool_calls;             /* parsed at the end, or NULL */
    char *content;                  /* final content (non-streamed) */
    /* Anthropic stream: content blocks started so far, the open one's kind */
    int blk_n, blk_open;
    bool blk_text;                  /* a text block was sent */
    api_job *prev, *next;           /* srv->jobs */
    struct embed_job *embed;        /* an embeddings request's inputs (embed.c), or NULL */
};

/* ---- copy.c ---- */
/* POST /v1/models/copy {"model"}: every node up without the model is asked
 * to copy it from those that list it; 202 {model, asked, holders}. */
int copies_request(api_server *s, struct evhttp_request *req, const char *body, size_t len);

/* GET /v1/models/copies: how the copies this node asked for ended, per
 * model and node: {"copies":[{"model","node_id","node","state":"done" |
 * "skipped" (no room) | "failed","error"}]}.  Returns 200. */
int copies_status(api_server *s, struct evhttp_request *req);

/* ---- pull.c ---- */
/* POST /api/pull, /v1/models/pull: 0 when the pull started (answered when it
 * ends), else the status of the error already sent. */
int  pull_start(api_server *s, struct evhttp_request *req, const char *path, const char *key_id,
                const char *body, size_t len);
void pull_shutdown(api_server *s);      /* cancels and joins every pull */

/* ---- server.c ---- */
void srv_cors_headers(api_server *s, struct evhttp_request *req);
bool srv_is_ollama_path(const char *path);
bool srv_is_anthropic_path(const char *path);     /* /v1/messages... (a query may follow) */
/* The key of req's 'Authorization: Bearer KEY', or else of its
 * 'x-api-key: KEY' (Anthropic's header); NULL without one. */
const char *srv_bearer(struct evhttp_request *req);
/* The connection's peer as "ADDRESS:PORT" ("?" when unknown). */
void srv_peer(struct evhttp_request *req, char *out, size_t cap);
/* A line of the access log and the request metrics, for requests answered
 * later than their handler (pulls). */
void srv_log_request(api_server *s, const char *client, const char *method, const char *path,
                     int status, const char *key_id);

/* The instances this node heads (model, plan, load, tokens/s, cost), published
 * to the cluster as "instances" of its STATE (once a second, from power.c). */
void srv_publish_instances(api_server *s);

/* ---- dashboard.c ---- */
/* Whether path is one of the dashboard's ("/" or "/ui/..."): served without
 * an API key, since the page carries no data. */
bool dashboard_path(const char *path);
/* Answers req with the file (200, or 304 when If-None-Match names its
 * ETag), 404 for an unknown file, 405 for a method other than GET/HEAD;
 * returns the status. */
int dashboard_serve(api_server *s, struct evhttp_request *req, const char *path, int method);

/* ---- power.c ---- */
void srv_power_init(api_server *s);
/* Once a second: this node's power, published; models' token counters. */
void srv_power_tick(api_server *s);
/* A running model's "cost" object (cost.h) for its plan (NULL: here alone)
 * in the cluster view (NULL: standalone); a new reference. */
json_t *srv_model_cost(api_server *s, api_model *m, const json_t *plan, const json_t *view);
/* /v1/cluster's "cost": the prices, this node's power, how it is counted. */
json_t *srv_cost_basis(api_server *s);
/* The power and cost gauges of /metrics. */
void srv_cost_metrics(api_server *s, strbuf *b);

/* ---- cluster_admin.c ---- */
/* POST /v1/cluster/nodes/{id}/remove and /v1/cluster/key/rotate (any path
 * under /v1/cluster/): answers req, returns the status. */
int cluster_admin(api_server *s, struct evhttp_request *req, const char *path, int method);

/* ---- job.c ---- */
/* Takes a parsed request (its fields move into the job) and runs it:
 * resolves the model, loads it if needed, builds the prompt, submits.
 * `client` names who asked for the log (NULL: the connection's peer).
 * Errors are answered on `req` in the endpoint's style. */
void job_run(api_server *s, struct evhttp_request *req, const char *path, const char *key_id,
             const char *client, api_request *ar, const job_ops *ops);
void job_drain(api_server *s);          /* mailbox -> clients (mail_ev callback) */
void job_tick(api_server *s);           /* disconnect checks (tick_ev callback) */
/* The tick runs every 100 ms while requests or forwards are open, else once
 * a second: who opens one calls this (API thread). */
void srv_tick_soon(api_server *s);
void job_shutdown(api_server *s);       /* frees every job; engines already stopped */
void job_models_changed(void *srv);     /* registry callback (loader thread) */
/* The token's text for logprobs (special tokens as text). */
void job_token_text(const api_job *j, int32_t id, strbuf *out);
/* finish_reason of the job's end. */
const char *job_finish_reason(const api_job *j);

/* For embed.c: job.c's on_done for the whole request (g->user is the job),
 * ending a job with an error, and answering it (ops->final). */
void job_on_done(gen_request *g, const gen_result *res);
void job_fail(api_job *j, const api_error *e);
void job_answer(api_job *j);

/* ---- embed.c ---- */
typedef struct embed_job embed_job;
extern const job_ops embed_ops;
bool embed_kind(int kind);              /* an embeddings endpoint's api_kind */
/* Tokenizes, checks and submits the inputs of a job whose model is READY
 * (or answers it with an error). */
void embed_start(api_job *j);
void embed_cancel(api_job *j);          /* the client went away */
void embed_free(api_job *j);            /* accepts a job without inputs */

/* ---- forward.c ---- */
int  fwd_attach(api_server *s);         /* with cfg.forward: takes its messages */
void fwd_detach(api_server *s);         /* ends every forward; before freeing the loop */
/* Whether req is another node's request that this node's forwarder admitted
 * and replays (then its key was checked there, and it is not forwarded
 * again): it came to the loopback listener (`local`), from a loopback
 * address, for a forwarding path, with the forwarder's secret.  A request
 * that carries the mark but fails any of these is logged and counts as any
 * client's. */
bool fwd_internal(api_server *s, struct evhttp_request *req, const char *path, bool local);
/* For such a request, who asked ("ADDRESS via NODE"), or NULL. */
const char *fwd_client(struct evhttp_request *req);
/* For such a request, the id of this node's key it was admitted with
 * ("key-N"), or NULL when this node has no keys. */
const char *fwd_key_id(struct evhttp_request *req);
/* Sends a generation request to the node that serves model `name`, when that is
 * where it should run; false: run it here. */
bool fwd_route(api_server *s, struct evhttp_request *req, const char *path, const char *name,
               const char *body, size_t len, const char *key_id);
void fwd_tick(api_server *s);           /* clients gone, forwards ended */
bool fwd_busy(const api_server *s);     /* forwards open: the tick at its busy pace */

/* ---- writer.c ---- */
/* Whether the client closed its socket while its request computes (libevent
 * does not read the socket then); false without a connection. */
bool http_client_closed(struct evhttp_connection *evcon);
/* A whole JSON reply (steals `body`; NULL means 500 out of memory). */
void http_reply_json(api_server *s, struct evhttp_request *req, int status, json_t *body,
                     const char *extra_header, const char *extra_value);
void http_reply_text(api_server *s, struct evhttp_request *req, int status, const char *ctype,
                     const char *text, size_t len);
/* An error in OpenAI's style, Ollama's for /api/ paths, Anthropic's for
 * /v1/messages (its status then as Anthropic's API would send it). */
void http_reply_error(api_server *s, struct evhttp_request *req, bool ollama, const api_error *e);
json_t *openai_error_json(const api_error *e);
/* Streams: the status line and headers, then chunks. */
void http_stream_start(api_job *j, const char *content_type);
void http_stream_sse(api_job *j, json_t *event);      /* "data: {json}\n\n"; steals */
/* "event: NAME\ndata: {json}\n\n" (Anthropic's named events); steals */
void http_stream_event(api_job *j, const char *name, json_t *data);
void http_stream_raw(api_job *j, const char *text);   /* bytes as they are */
void http_stream_line(api_job *j, json_t *obj);       /* "{json}\n"; steals */
void http_stream_end(api_job *j);

/* ---- openai.c ---- */
extern const job_ops openai_chat_ops, openai_completion_ops;
int  openai_models(api_server *s, struct evhttp_request *req, const char *one);   /* status */

/* ---- anthropic.c ---- */
extern const job_ops anthropic_ops;
/* POST /v1/messages/count_tokens's answer, {"input_tokens": N}. */
void anthropic_count(api_job *j);
/* {"type": "error", "error": {"type", "message"}}, and the HTTP status
 * Anthropic's API gives that error (529 for a full queue). */
json_t *anthropic_error_json(const api_error *e);
int anthropic_status(int status);

/* ---- ollama.c ---- */
extern const job_ops ollama_chat_ops, ollama_generate_ops;
void ollama_tags(api_server *s, struct evhttp_request *req);
void ollama_ps(api_server *s, struct evhttp_request *req);
int  ollama_show(api_server *s, struct evhttp_request *req, const char *body, size_t len);
void ollama_version(api_server *s, struct evhttp_request *req);
/* The load-only answer of /api/generate and /api/chat without a prompt. */
void ollama_loaded(api_job *j);
/* ISO 8601 time with nanoseconds as Ollama writes it. */
void ollama_time(char *out, size_t cap);

#endif
