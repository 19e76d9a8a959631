/* forward.c - API requests forwarded between nodes.
 *
 * A node asked for a model that another node of its cluster serves, and
 * that it would not run alone (it would have to split it over nodes, or
 * it does not hold the file), sends the request over the cluster link to
 * that node and relays the answer to its client as it comes: the one
 * instance of a model split across machines answers the clients of every
 * node, instead of each node placing an instance of its own.  A node whose
 * own copy of a model has every sequence slot taken passes a new request
 * to the copy with the most free slots (each node publishes them,
 * `serving_free`), so copies share the load.
 *
 * One API-key policy: the serving node applies its own keys to every
 * request, forwarded or not.  The asking node sends, instead of the key its
 * client presented, a proof of it bound to this one request: BLAKE2b-256
 * keyed with BLAKE2b-256(key) over both node ids and the request id
 * (key_proof).  The serving node computes the same for each of its keys; a
 * request that proves none of them (when it has keys) is answered 401,
 * which the asking node relays to its client.  The key never leaves the node
 * it was given to, not even over the encrypted link: a member that receives
 * forwarded requests (by advertising a model) learns no key to use at
 * other nodes' HTTP APIs, and a proof it receives names it as the serving
 * node, so it cannot be replayed to another node either.
 *
 * The admitted request is replayed to the node's own HTTP server on a
 * loopback-only listener, marked with a secret that only this process knows
 * (and the id of the key it proved, for the log; it is never forwarded
 * again), so every endpoint behaves exactly as for a local client: its
 * status, headers, SSE or NDJSON stream, errors.  The mark counts only on
 * that listener, from loopback, for the forwarding paths (fwd_internal).
 *
 * Messages (docs/cluster-protocol.md §12), little-endian, each naming the
 * request by the id the asking node gave it:
 *   FWD_REQUEST 0x58  u32 id, path, the client's address (for the serving
 *                     node's log), the key proof, body (fwd_wire.c)
 *   FWD_HEAD    0x59  u32 id, u32 status, u16 length, Content-Type, u16 length,
 *                     Retry-After (of a 429)
 *   FWD_BODY    0x5a  u32 id, bytes of the body
 *   FWD_END     0x5b  u32 id, u32 failed (0 or 1), message (when failed)
 *   FWD_CANCEL  0x5c  u32 id (the client left)
 *
 * Threads: the cluster thread only queues messages and node-down events in
 * the api_forward (under its mutex) and wakes the server's loop, which does
 * everything else.
 */
#include "server_internal.h"
#include "fwd_wire.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"
#include "cluster/pipeline.h"
#include "cluster/wire.h"
#include "placed.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

enum { FWD_REQUEST = 0x58, FWD_HEAD = 0x59, FWD_BODY = 0x5a, FWD_END = 0x5b, FWD_CANCEL = 0x5c,
       FWD_DOWN = -1 };

#define FWD_MAX_IN 256                 /* requests run here for other nodes at once */
#define FWD_CHUNK (256u << 10)         /* body bytes per FWD_BODY */
#define FWD_QUEUE_MAX (64u << 20)      /* message bytes waiting for the loop */
#define FWD_HEADER "X-Racimo-Forward"
#define FWD_CLIENT "X-Racimo-Client"          /* who asked, for the access log */
#define FWD_KEY_ID "X-Racimo-Key"             /* the serving node's key proved ("key-N") */

/* ---- the cluster side: a queue for the server's loop ---- */

typedef struct fwd_msg {
    struct fwd_msg *next;
    int type;
    char from[33];
    size_t len;
    uint8_t data[];
} fwd_msg;

struct api_forward {
    struct cluster *c;
    pthread_mutex_t mu;
    struct event *wake;        /* the attached server's event; NULL: none */
    fwd_msg *head, *tail;
    size_t queued;
};

static void enqueue(api_forward *f, int type, const char *from, const uint8_t *data, size_t len)
{
    pthread_mutex_lock(&f->mu);
    fwd_msg *m = NULL;
    if (f->wake && f->queued + len <= FWD_QUEUE_MAX && (m = rc_malloc(sizeof *m + len))) {
        m->next = NULL;
        m->type = type;
        snprintf(m->from, sizeof m->from, "%s", from);
        m->len = len;
        if (len)
            memcpy(m->data, data, len);
        if (f->tail)
            f->tail->next = m;
        else
            f->head = m;
        f->tail = m;
        f->queued += len;
        event_active(f->wake, EV_READ, 0);
    }
    pthread_mutex_unlock(&f->mu);
    if (!m && type != FWD_DOWN)
        rc_log(LOG_WARN, "forward: dropped a message of type 0x%02x from node %.8s (%s)", type,
               from, f->wake ? "queue full" : "no API server");
}

static void on_msg(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    enqueue(ud, type, from, data, len);
}

static void on_down(void *ud, const char *node)
{
    enqueue(ud, FWD_DOWN, node, NULL, 0);
}

int api_forward_new(struct cluster *c, api_forward **out)
{
    *out = NULL;
    api_forward *f = rc_calloc(1, sizeof *f);
    if (!f)
        return rc_fail(RC_ENOMEM, "out of memory");
    f->c = c;
    pthread_mutex_init(&f->mu, NULL);
    int rc = cluster_add_handler(c, 0x58, 0x5f, on_msg, f);
    if (!rc)
        rc = cluster_add_down_handler(c, on_down, f);
    if (rc) {
        pthread_mutex_destroy(&f->mu);
        rc_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

static void free_queue(fwd_msg *m)
{
    while (m) {
        fwd_msg *next = m->next;
        rc_free(m);
        m = next;
    }
}

void api_forward_free(api_forward *f)
{
    if (!f)
        return;
    free_queue(f->head);
    pthread_mutex_destroy(&f->mu);
    rc_free(f);
}

/* ---- the server side (event-loop thread) ---- */

/* A request this node sent to another (the client is here). */
typedef struct fwd_out {
    struct fwd_out *next;
    api_server *s;
    uint32_t id;
    char node[33], node_name[64];
    struct evhttp_request *req;     /* NULL once answered or freed by libevent */
    struct evhttp_connection *evcon;
    bool req_owned;                 /* detached by libevent: ours to free */
    bool started, done;
    int status;
    char ctype[64];
    char path[32], model[128], client[64], key_id[16];
    uint64_t t0_ns;
} fwd_out;

/* A request another node sent here, running against this node's server. */
typedef struct fwd_in {
    struct fwd_in *next;
    struct fwd_side *fs;
    char from[33];
    uint32_t id;
    struct evhttp_connection *conn; /* to this node's own server */
    bool ended;
    char error[128];
} fwd_in;

struct fwd_side {
    api_forward *f;
    api_server *s;
    struct event *ev;
    char secret[33];
    uint8_t (*key_hash)[32];        /* BLAKE2b-256 of each of this node's API keys */
    int n_keys;
    fwd_out *outs;
    fwd_in *ins;
    int n_ins;
    uint32_t next_id;
    unsigned rr;                    /* turns among nodes serving the same model */
    /* whether a model on disk here would run here alone (placed_runs_here
     * reads the file's metadata: kept a few seconds, not redone per request) */
    struct { const api_model *m; bool here; uint64_t t_ns; } alone[16];
};

#define ALONE_TTL_NS (5ull * 1000000000ull)

static bool runs_here_alone(api_server *s, const api_model *m)
{
    struct fwd_side *fs = s->fwd;
    uint64_t now = os_now_ns();
    int slot = 0;
    for (int i = 0; i < 16; i++) {
        if (fs->alone[i].m == m && now - fs->alone[i].t_ns < ALONE_TTL_NS)
            return fs->alone[i].here;
        if (fs->alone[i].m == m || fs->alone[i].t_ns < fs->alone[slot].t_ns)
            slot = i;
    }
    bool here = placed_runs_here(registry_get_config(s->reg), m->name, m->path);
    fs->alone[slot].m = m;
    fs->alone[slot].here = here;
    fs->alone[slot].t_ns = now;
    return here;
}

static void send_msg(api_server *s, const char *to, int type, uint32_t id, const void *a,
                     size_t na, const void *b, size_t nb)
{
    uint8_t *m = rc_malloc(4 + na + nb);
    if (!m)
        return;
    wire_put32(m, id);
    if (na)
        memcpy(m + 4, a, na);
    if (nb)
        memcpy(m + 4 + na, b, nb);
    cluster_send(s->cfg.cluster, to, type, m, 4 + na + nb);
    rc_free(m);
}

static void send_end(api_server *s, const char *to, uint32_t id, const char *error)
{
    uint8_t flag[4];
    wire_put32(flag, error ? 1 : 0);
    send_msg(s, to, FWD_END, id, flag, 4, error, error ? strlen(error) : 0);
}

/* -- API keys across nodes -- */

/* BLAKE2b-256 of an API key, keyed with a fixed label so that the hash is
 * of no use for anything else. */
static void key_hash(const char *key, size_t len, uint8_t out[32])
{
    static const char label[] = "racimo-api-key-v1";      /* a BLAKE2b key is 16-64 bytes */
    crypto_generichash(out, 32, (const uint8_t *)key, len, (const uint8_t *)label,
                       sizeof label - 1);
}

/* The proof that request `id`, forwarded by node `asker` to node `server`,
 * was admitted with the key whose key_hash is kh.  Both ids are in it, so a
 * serving node cannot pass a proof it received on to a third node. */
static void key_proof(const uint8_t kh[32], const char *asker, const char *server, uint32_t id,
                      uint8_t out[FWD_PROOF_BYTES])
{
    static const char label[] = "racimo-fwd-key-v1";
    uint8_t idb[4];
    wire_put32(idb, id);
    crypto_generichash_state st;
    crypto_generichash_init(&st, kh, 32, FWD_PROOF_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof label);  /* with the NULs */
    crypto_generichash_update(&st, (const uint8_t *)asker, strlen(asker) + 1);
    crypto_generichash_update(&st, (const uint8_t *)server, strlen(server) + 1);
    crypto_generichash_update(&st, idb, sizeof idb);
    crypto_generichash_final(&st, out, FWD_PROOF_BYTES);
    sodium_memzero(&st, sizeof st);
}

/* Which of this node's keys `proof` (NULL: none sent) proves for request
 * id from node `from`, or -1.  Every key is tried, so the time taken does
 * not tell which one matched. */
static int proven_key(struct fwd_side *fs, const char *from, uint32_t id, const uint8_t *proof)
{
    const char *self = cluster_self_id(fs->s->cfg.cluster);
    int found = -1;
    for (int i = 0; i < fs->n_keys; i++) {
        uint8_t p[FWD_PROOF_BYTES];
        key_proof(fs->key_hash[i], from, self, id, p);
        if (proof && sodium_memcmp(p, proof, FWD_PROOF_BYTES) == 0 && found < 0)
            found = i;
    }
    return found;
}

/* "NAME (ID8)" of a node, its name made printable, for messages. */
static void node_label(api_server *s, const char *id, char *out, size_t cap)
{
    json_t *view = cluster_snapshot(s->cfg.cluster), *n;
    size_t i;
    char name[40] = "?";
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "id"));
        const char *nn = json_string_value(json_object_get(n, "name"));
        if (nid && nn && !strcmp(nid, id))
            snprintf(name, sizeof name, "%s", nn);
    }
    json_decref(view);
    for (char *c = name; *c; c++)
        if (*c < 0x21 || *c > 0x7e)
            *c = '?';
    snprintf(out, cap, "%s (%.8s)", name, id);
}

/* A forwarded request that proves none of this node's keys: answered 401
 * in the endpoint's style, as this node's API answers a client without a
 * key, and logged here; the asking node relays the answer to its client. */
static void refuse_key(api_server *s, const char *from, uint32_t id, const char *path,
                       const char *client, bool had_proof)
{
    char who[64], self[64];
    node_label(s, from, who, sizeof who);
    node_label(s, cluster_self_id(s->cfg.cluster), self, sizeof self);
    rc_log(LOG_WARN, "forward: refused %s (request %u) from node %s: %s", path, (unsigned)id,
           who, had_proof ? "the key it carries is none of this node's API keys"
                          : "it carries no API key, and this node requires one");
    api_error e;
    api_fail(&e, 401, "invalid_api_key", NULL, "node %s, which serves this model, requires one "
             "of its own API keys: the request node %s forwarded to it carried %s", self, who,
             had_proof ? "a key that is not one of them" : "none");
    json_t *j = srv_is_ollama_path(path) ? json_pack("{s:s}", "error", e.message)
                : srv_is_anthropic_path(path) ? anthropic_error_json(&e) : openai_error_json(&e);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    static const char ct[] = "application/json";
    uint8_t head[4 + 2 + sizeof ct - 1 + 2] = { 0 };
    wire_put32(head, 401);
    head[4] = sizeof ct - 1;
    memcpy(head + 6, ct, sizeof ct - 1);        /* then an empty Retry-After */
    send_msg(s, from, FWD_HEAD, id, head, sizeof head, NULL, 0);
    if (text)
        send_msg(s, from, FWD_BODY, id, text, strlen(text), NULL, 0);
    free(text);
    send_end(s, from, id, NULL);
    metrics_request(s->metrics, path, 401);
    access_entry a = { .client = client, .method = "POST", .path = path, .status = 401,
                       .ttft_ms = -1 };
    access_log_write(s->alog, &a);
}

/* -- the serving side -- */

static void in_unlink_free(fwd_in *fi)
{
    struct fwd_side *fs = fi->fs;
    for (fwd_in **pp = &fs->ins; *pp; pp = &(*pp)->next)
        if (*pp == fi) {
            *pp = fi->next;
            break;
        }
    fs->n_ins--;
    if (fi->conn)
        evhttp_connection_free(fi->conn);    /* with its request, if still pending */
    rc_free(fi);
}

static int in_header(struct evhttp_request *req, void *arg)
{
    fwd_in *fi = arg;
    api_server *s = fi->fs->s;
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *ct = evhttp_find_header(in, "Content-Type");
    const char *ra = evhttp_find_header(in, "Retry-After");    /* a 429's */
    size_t n = ct ? strnlen(ct, 200) : 0, nr = ra ? strnlen(ra, 32) : 0;
    uint8_t hdr[6 + 200 + 2 + 32];
    wire_put32(hdr, (uint32_t)evhttp_request_get_response_code(req));
    hdr[4] = (uint8_t)n;
    hdr[5] = 0;
    if (n)
        memcpy(hdr + 6, ct, n);
    hdr[6 + n] = (uint8_t)nr;
    hdr[7 + n] = 0;
    if (nr)
        memcpy(hdr + 8 + n, ra, nr);
    send_msg(s, fi->from, FWD_HEAD, fi->id, hdr, 8 + n + nr, NULL, 0);
    return 0;
}

static void in_body(struct evhttp_request *req, void *arg)
{
    fwd_in *fi = arg;
    api_server *s = fi->fs->s;
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t n;
    while ((n = evbuffer_get_length(b)) > 0) {
        if (n > FWD_CHUNK)
            n = FWD_CHUNK;
        send_msg(s, fi->from, FWD_BODY, fi->id, evbuffer_pullup(b, (ev_ssize_t)n), n, NULL, 0);
        evbuffer_drain(b, n);
    }
}

static void in_error(enum evhttp_request_error e, void *arg)
{
    fwd_in *fi = arg;
    snprintf(fi->error, sizeof fi->error, "%s",
             e == EVREQ_HTTP_TIMEOUT ? "timed out" : e == EVREQ_HTTP_EOF ? "closed early"
             : e == EVREQ_HTTP_INVALID_HEADER ? "sent a malformed header"
             : e == EVREQ_HTTP_BUFFER_ERROR ? "failed to read" : "failed");
}

/* The whole answer is in (or the request failed: req NULL).  The
 * connection is freed by the next sweep, outside its own callback. */
static void in_done(struct evhttp_request *req, void *arg)
{
    fwd_in *fi = arg;
    api_server *s = fi->fs->s;
    if (req && evhttp_request_get_response_code(req) > 0) {
        in_body(req, fi);
        send_end(s, fi->from, fi->id, NULL);
    } else {
        char why[200];
        snprintf(why, sizeof why, "the serving node's own API %s",
                 fi->error[0] ? fi->error : "did not answer");
        send_end(s, fi->from, fi->id, why);
    }
    fi->ended = true;
}

static const char *const forwardable[] = { "/v1/chat/completions", "/v1/completions",
                                           "/api/chat", "/api/generate", "/api/show",
                                           "/v1/messages", "/v1/messages/count_tokens",
                                           "/v1/embeddings", "/api/embed", "/api/embeddings" };

static bool forwarding_path(const char *path)
{
    for (size_t i = 0; i < sizeof forwardable / sizeof forwardable[0]; i++)
        if (!strcmp(path, forwardable[i]))
            return true;
    return false;
}

static void in_start(api_server *s, const char *from, const uint8_t *d, size_t len)
{
    struct fwd_side *fs = s->fwd;
    if (len < 6)
        return;                                   /* no id to answer to */
    uint32_t id = wire_get32(d);
    fwd_request r;
    char client[96] = "", bad[100], why[200] = "";
    bool formed = fwd_request_parse(d, len, &r, bad, sizeof bad) == 0;
    /* "ADDRESS via NODE": printable, and short enough for the log */
    size_t n = 0;
    for (; n < r.client_len && n < 48; n++)
        client[n] = r.client[n] < 0x21 || r.client[n] > 0x7e ? '?' : (char)r.client[n];
    snprintf(client + n, sizeof client - n, " via %.8s", from);
    const char *path = r.path;
    const uint8_t *body = r.body;
    size_t blen = r.body_len;
    if (!formed)
        snprintf(why, sizeof why, "a malformed request: %s", bad);
    else if (!forwarding_path(path))
        snprintf(why, sizeof why, "a forwarded request must be a generation endpoint, an "
                 "embeddings endpoint or /api/show");
    else if (blen > s->cfg.max_body_bytes)
        snprintf(why, sizeof why, "the request body is larger than the limit of %zu bytes",
                 s->cfg.max_body_bytes);
    else if (fs->n_ins >= FWD_MAX_IN)
        snprintf(why, sizeof why, "this node runs %d forwarded requests already", FWD_MAX_IN);
    for (fwd_in *o = fs->ins; o && !why[0]; o = o->next)
        if (o->id == id && !strcmp(o->from, from))
            snprintf(why, sizeof why, "request %u is running already", (unsigned)id);
    if (why[0]) {
        rc_log(LOG_WARN, "forward: refused request %u from node %.8s: %s", (unsigned)id, from, why);
        send_end(s, from, id, why);
        return;
    }
    /* this node's API keys, as for its own clients */
    int key = -1;
    if (fs->n_keys && (key = proven_key(fs, from, id, r.proof)) < 0) {
        refuse_key(s, from, id, path, client, r.proof != NULL);
        return;
    }
    fwd_in *fi = rc_calloc(1, sizeof *fi);
    struct evhttp_request *req = NULL;
    if (fi) {
        fi->fs = fs;
        fi->id = id;
        snprintf(fi->from, sizeof fi->from, "%s", from);
        fi->next = fs->ins;
        fs->ins = fi;
        fs->n_ins++;
        fi->conn = evhttp_connection_base_new(s->base, NULL, "127.0.0.1",
                                              (ev_uint16_t)s->local_port);
    }
    if (fi && fi->conn && (req = evhttp_request_new(in_done, fi))) {
        /* a model may load for minutes before the first byte */
        struct timeval day = { 86400, 0 };
        evhttp_connection_set_timeout_tv(fi->conn, &day);
        evhttp_request_set_header_cb(req, in_header);
        evhttp_request_set_chunked_cb(req, in_body);
        evhttp_request_set_error_cb(req, in_error);
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Host", "racimo");
        evhttp_add_header(h, "Content-Type", "application/json");
        evhttp_add_header(h, "Connection", "close");
        evhttp_add_header(h, FWD_HEADER, fs->secret);
        evhttp_add_header(h, FWD_CLIENT, client);
        if (key >= 0) {
            char kid[16];
            snprintf(kid, sizeof kid, "key-%d", key + 1);
            evhttp_add_header(h, FWD_KEY_ID, kid);
        }
        evbuffer_add(evhttp_request_get_output_buffer(req), body, blen);
        if (evhttp_make_request(fi->conn, req, EVHTTP_REQ_POST, path) == 0) {
            rc_log(LOG_INFO, "forward: running %s for node %.8s", path, from);
            return;
        }
        req = NULL;             /* evhttp_make_request owns it (or freed it) once called */
    }
    if (req)
        evhttp_request_free(req);
    send_end(s, from, id, "out of memory, or cannot reach this node's own API");
    if (fi)
        in_unlink_free(fi);
}

static fwd_in *find_in(struct fwd_side *fs, const char *from, uint32_t id)
{
    for (fwd_in *fi = fs->ins; fi; fi = fi->next)
        if (fi->id == id && !strcmp(fi->from, from))
            return fi;
    return NULL;
}

/* The asking node's client left, or the node went down: the connection to
 * this node's server closes, which cancels the generation there. */
static void in_cancel(fwd_in *fi)
{
    if (!fi->ended)
        rc_log(LOG_INFO, "forward: node %.8s cancelled its request %u", fi->from,
               (unsigned)fi->id);
    in_unlink_free(fi);
}

/* -- the asking side -- */

static void out_free(api_server *s, fwd_out *o)
{
    for (fwd_out **pp = &s->fwd->outs; *pp; pp = &(*pp)->next)
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    if (o->evcon)
        evhttp_connection_set_closecb(o->evcon, NULL, NULL);
    if (o->req && o->req_owned)
        evhttp_request_free(o->req);
    rc_free(o);
}

static void out_log(api_server *s, fwd_out *o)
{
    metrics_request(s->metrics, o->path, o->status);
    access_entry e = {
        .client = o->client, .key_id = o->key_id[0] ? o->key_id : NULL, .method = "POST",
        .path = o->path, .model = o->model, .status = o->status, .ttft_ms = -1,
        .total_ms = (double)(os_now_ns() - o->t0_ns) * 1e-6, .finish = "forwarded",
    };
    access_log_write(s->alog, &e);
}

/* Ends a forwarded request: its answer is complete, or it failed (why). */
static void out_end(api_server *s, fwd_out *o, const char *why)
{
    if (o->done)
        return;
    o->done = true;
    if (o->evcon) {
        evhttp_connection_set_closecb(o->evcon, NULL, NULL);
        o->evcon = NULL;
    }
    bool ollama = srv_is_ollama_path(o->path);
    if (why && !o->req_owned)
        rc_log(LOG_WARN, "forward: %s for %s to node %.8s (%s) failed: %s", o->path,
               log_clean(o->model), o->node, log_clean(o->node_name), why);
    if (o->req && !o->req_owned && !o->started) {
        api_error e;
        api_fail(&e, 502, "forward_failed", NULL, "node %s (%.8s), which serves %s, %s",
                 o->node_name, o->node, o->model, why ? why : "sent an empty answer");
        o->status = 502;
        http_reply_error(s, o->req, ollama, &e);
    } else if (o->req && !o->req_owned) {
        if (why) {
            /* the stream says why it stops, in its own format */
            api_error e;
            api_fail(&e, 502, "forward_failed", NULL, "node %s (%.8s), which serves %s, %s",
                     o->node_name, o->node, o->model, why);
            bool anthropic = srv_is_anthropic_path(o->path);
            json_t *j = !strncmp(o->ctype, "text/event-stream", 17)
                        ? (anthropic ? anthropic_error_json(&e) : openai_error_json(&e))
                        : !strncmp(o->ctype, "application/x-ndjson", 20)
                        ? json_pack("{s:s}", "error", e.message) : NULL;
            char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            struct evbuffer *b = t ? evbuffer_new() : NULL;
            if (b) {
                evbuffer_add_printf(b, ollama ? "%s\n" : anthropic ? "event: error\ndata: %s\n\n"
                                                              : "data: %s\n\n", t);
                evhttp_send_reply_chunk(o->req, b);
                evbuffer_free(b);
            }
            free(t);
        }
        struct evhttp_connection *evcon = evhttp_request_get_connection(o->req);
        if (evcon)
            evhttp_connection_set_timeout(evcon, s->cfg.timeout_s);
        evhttp_send_reply_end(o->req);
    }
    if (!o->req_owned)
        o->req = NULL;
    out_log(s, o);
    out_free(s, o);
}

/* libevent: the client's connection is going away. */
static void out_close(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    fwd_out *o = arg;
    o->evcon = NULL;
    /* as in job.c: a request detached from the dying connection is ours to
     * free; one still attached is freed by libevent right after this */
    if (o->req) {
        if (evhttp_request_get_connection(o->req) == NULL)
            o->req_owned = true;
        else
            o->req = NULL;
    }
    o->done = true;                    /* freed by the next sweep */
    o->status = 499;
    send_msg(o->s, o->node, FWD_CANCEL, o->id, NULL, 0, NULL, 0);
}

static fwd_out *find_out(struct fwd_side *fs, const char *from, uint32_t id)
{
    for (fwd_out *o = fs->outs; o; o = o->next)
        if (o->id == id && !strcmp(o->node, from))
            return o;
    return NULL;
}

static void out_head(api_server *s, fwd_out *o, const uint8_t *d, size_t len)
{
    if (o->started || len < 10)
        return;
    int status = (int)wire_get32(d + 4);
    size_t n = (size_t)d[8] | (size_t)d[9] << 8;
    if (n > len - 10)
        n = len - 10;
    if (n >= sizeof o->ctype)
        n = sizeof o->ctype - 1;
    for (size_t i = 0; i < n; i++)
        o->ctype[i] = d[10 + i] >= 0x20 && d[10 + i] < 0x7f ? (char)d[10 + i] : '?';
    o->ctype[n] = '\0';
    char retry[16] = "";
    size_t at = 10 + ((size_t)d[8] | (size_t)d[9] << 8);
    if (at + 2 <= len) {
        size_t nr = (size_t)d[at] | (size_t)d[at + 1] << 8, k = 0;
        for (size_t i = 0; i < nr && at + 2 + i < len && k + 1 < sizeof retry; i++)
            if (d[at + 2 + i] >= '0' && d[at + 2 + i] <= '9')
                retry[k++] = (char)d[at + 2 + i];
        retry[k] = '\0';
    }
    if (status < 100 || status > 599)
        status = 502;
    o->started = true;
    o->status = status;
    if (!o->req)
        return;
    struct evkeyvalq *h = evhttp_request_get_output_headers(o->req);
    evhttp_add_header(h, "Content-Type", o->ctype[0] ? o->ctype : "application/json");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    if (retry[0])
        evhttp_add_header(h, "Retry-After", retry);
    srv_cors_headers(s, o->req);
    evhttp_send_reply_start(o->req, status, NULL);
    /* like a local stream: quiet for long is fine, a client not reading is not */
    struct evhttp_connection *evcon = evhttp_request_get_connection(o->req);
    if (evcon) {
        struct timeval wt = { s->cfg.timeout_s, 0 };
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(evcon), NULL, &wt);
    }
}

static void out_body(api_server *s, fwd_out *o, const uint8_t *d, size_t len)
{
    if (!o->started)
        out_head(s, o, (const uint8_t[10]){ 0, 0, 0, 0, 200, 0, 0, 0, 0, 0 }, 10);
    if (!o->req || len <= 4)
        return;
    struct evbuffer *b = evbuffer_new();
    if (b) {
        evbuffer_add(b, d + 4, len - 4);
        evhttp_send_reply_chunk(o->req, b);
        evbuffer_free(b);
    }
}

static void handle_msg(api_server *s, fwd_msg *m)
{
    struct fwd_side *fs = s->fwd;
    if (m->type == FWD_DOWN) {
        for (fwd_out *o = fs->outs, *next; o; o = next) {
            next = o->next;
            if (!strcmp(o->node, m->from))
                out_end(s, o, "went down while answering");
        }
        for (fwd_in *fi = fs->ins, *next; fi; fi = next) {
            next = fi->next;
            if (!strcmp(fi->from, m->from))
                in_cancel(fi);
        }
        return;
    }
    if (m->len < 4)
        return;
    uint32_t id = wire_get32(m->data);
    if (m->type == FWD_REQUEST) {
        in_start(s, m->from, m->data, m->len);
    } else if (m->type == FWD_CANCEL) {
        fwd_in *fi = find_in(fs, m->from, id);
        if (fi)
            in_cancel(fi);
    } else {
        fwd_out *o = find_out(fs, m->from, id);
        if (!o || o->done)
            return;                   /* not ours, or the client left */
        if (m->type == FWD_HEAD) {
            out_head(s, o, m->data, m->len);
        } else if (m->type == FWD_BODY) {
            out_body(s, o, m->data, m->len);
        } else if (m->type == FWD_END) {
            char why[256] = "";
            bool failed = m->len >= 8 && wire_get32(m->data + 4) != 0;
            if (failed) {
                size_t n = m->len - 8 < sizeof why - 1 ? m->len - 8 : sizeof why - 1;
                for (size_t i = 0; i < n; i++)
                    why[i] = m->data[8 + i] >= 0x20 && m->data[8 + i] != 0x7f
                             ? (char)m->data[8 + i] : '?';
                why[n] = '\0';
            }
            out_end(s, o, failed ? (why[0] ? why : "failed") : NULL);
        }
    }
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    api_server *s = arg;
    api_forward *f = s->fwd->f;
    pthread_mutex_lock(&f->mu);
    fwd_msg *m = f->head;
    f->head = f->tail = NULL;
    f->queued = 0;
    pthread_mutex_unlock(&f->mu);
    while (m) {
        fwd_msg *next = m->next;
        handle_msg(s, m);
        rc_free(m);
        m = next;
    }
}

int fwd_attach(api_server *s)
{
    api_forward *f = s->cfg.forward;
    if (!f || !s->cfg.cluster)
        return 0;
    struct fwd_side *fs = rc_calloc(1, sizeof *fs);
    if (!fs || !(fs->ev = event_new(s->base, -1, 0, drain_cb, s))) {
        rc_free(fs);
        return rc_fail(RC_ENOMEM, "out of memory");
    }
    int nk = s->cfg.n_api_keys;
    if (sodium_init() < 0 || (nk && !(fs->key_hash = rc_calloc((size_t)nk, sizeof *fs->key_hash)))) {
        event_free(fs->ev);
        rc_free(fs);
        return rc_fail(RC_ENOMEM, "out of memory, or libsodium cannot start");
    }
    fs->n_keys = nk;
    for (int i = 0; i < nk; i++)
        key_hash(s->cfg.api_keys[i], strlen(s->cfg.api_keys[i]), fs->key_hash[i]);
    uint8_t raw[16];
    evutil_secure_rng_get_bytes(raw, sizeof raw);
    for (int i = 0; i < 16; i++)
        snprintf(fs->secret + 2 * i, 3, "%02x", raw[i]);
    evutil_secure_rng_get_bytes(&fs->next_id, sizeof fs->next_id);
    fs->f = f;
    fs->s = s;
    s->fwd = fs;
    pthread_mutex_lock(&f->mu);
    f->wake = fs->ev;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

void fwd_detach(api_server *s)
{
    struct fwd_side *fs = s->fwd;
    if (!fs)
        return;
    pthread_mutex_lock(&fs->f->mu);
    fs->f->wake = NULL;
    free_queue(fs->f->head);
    fs->f->head = fs->f->tail = NULL;
    fs->f->queued = 0;
    pthread_mutex_unlock(&fs->f->mu);
    while (fs->outs) {
        fwd_out *o = fs->outs;
        if (!o->done) {
            send_msg(s, o->node, FWD_CANCEL, o->id, NULL, 0, NULL, 0);
            out_end(s, o, "was left: this node is stopping");
        } else {
            out_free(s, o);
        }
    }
    while (fs->ins) {
        if (!fs->ins->ended)
            send_end(s, fs->ins->from, fs->ins->id, "stopped: the serving node is shutting down");
        in_unlink_free(fs->ins);
    }
    event_free(fs->ev);
    if (fs->key_hash)
        sodium_memzero(fs->key_hash, (size_t)fs->n_keys * sizeof *fs->key_hash);
    rc_free(fs->key_hash);
    rc_free(fs);
    s->fwd = NULL;
}

const char *fwd_client(struct evhttp_request *req)
{
    return evhttp_find_header(evhttp_request_get_input_headers(req), FWD_CLIENT);
}

const char *fwd_key_id(struct evhttp_request *req)
{
    return evhttp_find_header(evhttp_request_get_input_headers(req), FWD_KEY_ID);
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa && sa->sa_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24 == 127;
    if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

bool fwd_internal(api_server *s, struct evhttp_request *req, const char *path, bool local)
{
    const char *v = evhttp_find_header(evhttp_request_get_input_headers(req), FWD_HEADER);
    if (!v)
        return false;
    struct fwd_side *fs = s->fwd;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    const size_t n = sizeof fs->secret - 1;
    const char *why = NULL;
    if (!fs || !local)
        why = "on the public listener (this node replays forwarded requests on loopback)";
    else if (!evcon || !is_loopback(evhttp_connection_get_addr(evcon)))
        why = "from an address that is not loopback";
    else if (!forwarding_path(path))
        why = "for an endpoint that is never forwarded";
    else if (strlen(v) != n || sodium_memcmp(v, fs->secret, n) != 0)
        why = "with a wrong secret";
    if (why) {
        char peer[64];
        srv_peer(req, peer, sizeof peer);
        rc_log(LOG_WARN, "api: a request from %s for %.64s carried the forwarding mark %s: it "
               "is treated as any client's", peer, path, why);
    }
    return !why;
}

/* Requests for model `want` this node has running on node `id`. */
static int in_flight(const struct fwd_side *fs, const char *id, const char *want)
{
    int n = 0;
    for (const fwd_out *o = fs->outs; o; o = o->next)
        n += !o->done && !strcmp(o->node, id) && !strcmp(o->model, want);
    return n;
}

/* The node to ask for model `name`, or false to run it here.  Here when
 * this node loads it, or serves it with a sequence slot free.  When it
 * serves it with every slot taken: a node serving it with a slot free, if
 * any has one (balancing copies; otherwise it queues here).  When it does
 * not serve it: a node that does, unless this node would run it alone (it
 * holds the file and placement keeps it here); a node with a slot free
 * first.  Among several, in turn: a node's free slots count at most its
 * slots (as the view caps them; when this node runs a stage of its
 * instance, as many as that instance's set-up asked) less the requests
 * this node runs there, so a member that claims more slots than it has
 * gets no bigger share.
 * `show` (/api/show, which reads the file's metadata): a node that has the
 * file, when this node has neither the file nor the model loaded. */
static bool pick_node(api_server *s, const char *name, bool show, char node[33],
                      char node_name[64], char want[128])
{
    api_model *m = registry_find(s->reg, name);
    bool busy = false;
    if (show && m && (!m->remote || registry_state(s->reg, m, NULL, 0) == MODEL_READY))
        return false;
    if (m && !show) {
        int st = registry_state(s->reg, m, NULL, 0);
        if (st == MODEL_LOADING)
            return false;
        if (st == MODEL_READY) {
            engine_stats es;
            engine_get_stats(m->eng, &es);
            if (es.n_active + es.n_queued < m->ep.n_seq)
                return false;
            busy = true;
        }
    }
    size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ":latest"))
        len -= 7;
    snprintf(want, 128, "%.*s", (int)(len < 127 ? len : 127), m ? m->name : name);
    json_t *view = cluster_snapshot(s->cfg.cluster), *n, *v;
    size_t i, k;
    const char *ids[64], *names[64];
    bool room[64];
    int n_cand = 0;
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *st = json_string_value(json_object_get(n, "state"));
        const char *proto = json_string_value(json_object_get(n, "protocol"));
        const char *id = json_string_value(json_object_get(n, "id"));
        int major = 0, minor = 0;
        /* a node known by its SWIM digest alone speaks SWIM: this major,
         * forwarding included */
        bool digest_only = !proto && json_is_true(json_object_get(n, "from_digest"));
        if (!st || strcmp(st, "up") || json_is_true(json_object_get(n, "self")) ||
            (!digest_only && (!proto || sscanf(proto, "%d.%d", &major, &minor) != 2 ||
                              major != WIRE_PROTO_MAJOR || (major == 1 && minor < 2))))
            continue;                     /* forwarding came with 1.2 */
        if (!id)
            continue;
        json_array_foreach(json_object_get(n, show ? "models" : "serving"), k, v) {
            const char *vn = show ? json_string_value(json_object_get(v, "name"))
                                  : json_string_value(v);
            if (!vn || strcmp(vn, want) || n_cand == 64)
                continue;
            json_int_t fr = json_integer_value(
                json_object_get(json_object_get(n, "serving_free"), want));
            json_int_t slots = json_integer_value(
                json_object_get(json_object_get(n, "serving_slots"), want));
            int plan = s->cfg.pipeline ? pipeline_plan_slots(s->cfg.pipeline, id, want) : 0;
            if (plan > 0 && slots > plan)
                slots = plan;
            json_int_t left = slots - in_flight(s->fwd, id, want);
            if (fr > left)
                fr = left;
            if (busy && fr <= 0)
                continue;
            room[n_cand] = fr > 0;
            ids[n_cand] = id;
            names[n_cand++] = json_string_value(json_object_get(n, "name"));
        }
    }
    /* the nodes with a slot free; when none has one (and this node does not
     * serve the model), all */
    int pick = -1, n_ok = 0, ok[64];
    for (int c = 0; c < n_cand; c++)
        if (room[c])
            ok[n_ok++] = c;
    if (n_ok == 0)
        for (int c = 0; c < n_cand; c++)
            ok[n_ok++] = c;
    if (n_ok > 0 && (busy || show || !(m && !m->remote && runs_here_alone(s, m))))
        pick = ok[s->fwd->rr++ % (unsigned)n_ok];
    if (pick >= 0) {
        snprintf(node, 33, "%s", ids[pick]);
        snprintf(node_name, 64, "%s", names[pick] ? names[pick] : "?");
    }
    json_decref(view);
    return pick >= 0 && node[0] != '\0';
}

bool fwd_route(api_server *s, struct evhttp_request *req, const char *path, const char *name,
               const char *body, size_t len, const char *key_id)
{
    struct fwd_side *fs = s->fwd;
    if (!fs || !name)
        return false;
    fwd_out *o = rc_calloc(1, sizeof *o);
    if (!o || !pick_node(s, name, !strcmp(path, "/api/show"), o->node, o->node_name, o->model)) {
        rc_free(o);
        return false;
    }
    o->id = fs->next_id++;
    o->evcon = evhttp_request_get_connection(req);
    if (o->evcon)
        srv_peer(req, o->client, sizeof o->client);
    /* the key the client presented (checked here when this node has keys),
     * as a proof for this request only: the serving node applies its own keys */
    const char *given = srv_bearer(req);
    uint8_t proof[FWD_PROOF_BYTES];
    fwd_request fr = { .id = o->id, .client = (const uint8_t *)o->client,
                       .client_len = strlen(o->client), .body = (const uint8_t *)body,
                       .body_len = len };
    snprintf(fr.path, sizeof fr.path, "%s", path);
    if (given && *given && !s->cfg.test_forward_no_key) {
        uint8_t kh[32];
        key_hash(given, strlen(given), kh);
        key_proof(kh, cluster_self_id(s->cfg.cluster), o->node, o->id, proof);
        sodium_memzero(kh, sizeof kh);
        fr.proof = proof;
    }
    size_t n = fwd_request_size(&fr);
    uint8_t *msg = rc_malloc(n);
    int rc = RC_ENOMEM;
    if (msg) {
        fwd_request_encode(&fr, msg);
        rc = cluster_send(s->cfg.cluster, o->node, FWD_REQUEST, msg, n);
        rc_free(msg);
    }
    if (rc) {
        rc_log(LOG_WARN, "forward: cannot reach node %.8s (%s) for %s; running it here",
               o->node, log_clean(o->node_name), log_clean(o->model));
        rc_free(o);
        return false;
    }
    rc_log(LOG_INFO, "forward: %s for %s to node %.8s (%s), which serves it", path,
           log_clean(o->model), o->node, log_clean(o->node_name));
    o->s = s;
    o->req = req;
    o->t0_ns = os_now_ns();
    o->status = 200;
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->key_id, sizeof o->key_id, "%s", key_id ? key_id : "");
    if (o->evcon)
        evhttp_connection_set_closecb(o->evcon, out_close, o);
    o->next = fs->outs;
    fs->outs = o;
    srv_tick_soon(s);
    return true;
}

bool fwd_busy(const api_server *s)
{
    return s->fwd && (s->fwd->outs || s->fwd->ins);
}

void fwd_tick(api_server *s)
{
    struct fwd_side *fs = s->fwd;
    if (!fs)
        return;
    for (fwd_out *o = fs->outs, *next; o; o = next) {
        next = o->next;
        if (!o->done && !o->started && http_client_closed(o->evcon)) {
            /* libevent does not read a socket while its request is out:
             * answer anyway, so that it meets the closed socket */
            api_error e;
            api_fail(&e, 503, "client_gone", NULL, "the client went away");
            evhttp_connection_set_closecb(o->evcon, NULL, NULL);
            o->evcon = NULL;
            http_reply_error(s, o->req, srv_is_ollama_path(o->path), &e);
            o->req = NULL;
            o->done = true;
            o->status = 499;
            send_msg(s, o->node, FWD_CANCEL, o->id, NULL, 0, NULL, 0);
        }
        if (o->done) {
            out_log(s, o);
            out_free(s, o);
        }
    }
    for (fwd_in *fi = fs->ins, *next; fi; fi = next) {
        next = fi->next;
        if (fi->ended)
            in_unlink_free(fi);
    }
}
