/* test_forward.c - API requests forwarded between nodes, in this process
 * (two nodes, api/node.h, on loopback): a request at the node that does not serve a model is answered
 * by the node that does, streams included, without a second instance;
 * the serving node applies its own API keys to forwarded requests (a key
 * it lacks is refused 401 through the asking node, and a forwarded
 * request's key proof is checked as docs/cluster-protocol.md §12 says:
 * missing, of another key, or made for another node); a client that leaves
 * cancels the generation there; hostile forwarding messages are refused or
 * ignored; the serving node stopping ends the stream with an error naming
 * it.  Copies of a model that fits one node balance: a busy copy's node
 * passes a request to a copy with a free slot. */
#include "test.h"
#include "cli_util.h"
#include "cluster_util.h"
#include "http_util.h"
#include "model_util.h"

#include "api/node.h"
#include "base/err.h"
#include "cluster/cluster.h"
#include "cluster/wire.h"
#include "tensor/types.h"

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    node *n;
    struct cluster *c;
    pthread_t th;
    const char *keys[2];
    char dir[600], models[700], log[800];
} test_node;

static int t_min_nodes = 2, t_parallel = 2;   /* what start() gives a node */

static void *serve(void *arg)
{
    node_run(arg);
    return NULL;
}

/* `file`: a model the node holds as fw.gguf (NULL: none). */
static void start(test_node *n, const char *name, const char *token, const test_node *peer,
                  const char *key, const char *file)
{
    char addr[64];
    const char *peers[1];
    cluster_config cc;
    node_config nc;
    memset(n, 0, sizeof *n);
    test_cluster_config(&cc, name, token, peer ? cluster_port(peer->c) : 0, n->dir,
                        sizeof n->dir, n->models, sizeof n->models, addr, peers);
    if (file) {
        char path[800];
        snprintf(path, sizeof path, "%s/fw.gguf", n->models);
        CHECK(link(file, path) == 0);      /* weights are served from inside the folder only */
    }
    snprintf(n->log, sizeof n->log, "%s/access.log", n->dir);
    n->keys[0] = key;
    n->keys[1] = "kc";                  /* a key every node of the test accepts */
    node_config_default(&nc);
    nc.cluster = &cc;
    nc.api.port = 0;
    nc.api.models_dir = n->models;
    nc.api.ro_dirs = "";
    nc.api.threads = 1;
    nc.api.ctx_size = 2048;             /* a stream long enough to leave in the middle */
    nc.api.parallel = t_parallel;
    nc.api.queue = 1;                   /* a third request waits, a fourth gets 429 */
    nc.api.api_keys = n->keys;
    nc.api.n_api_keys = 2;
    nc.api.access_log = n->log;
    nc.api.min_nodes = t_min_nodes;     /* 2: the model runs across both nodes */
    CHECK_OK(node_start(&nc, &n->n));
    n->c = node_cluster(n->n);
    CHECK(pthread_create(&n->th, NULL, serve, n->n) == 0);
}

static void stop(test_node *n)
{
    if (!n->n)
        return;
    node_stop(n->n);
    pthread_join(n->th, NULL);
    node_free(n->n);
    n->n = NULL;
}

static int port(const test_node *n) { return node_http_port(n->n); }

/* Whether `n` sees node `id` up and serving `name` (NULL: just up). */
static bool sees(test_node *n, const char *id, const char *name)
{
    json_t *s = cluster_snapshot(n->c), *x, *v;
    size_t i, k;
    bool ok = false;
    json_array_foreach(json_object_get(s, "nodes"), i, x) {
        if (strcmp(json_string_value(json_object_get(x, "id")), id) ||
            strcmp(json_string_value(json_object_get(x, "state")), "up"))
            continue;
        ok = !name;
        json_array_foreach(json_object_get(x, "serving"), k, v)
            ok = ok || !strcmp(json_string_value(v), name);
    }
    json_decref(s);
    return ok;
}

static void wait_sees(test_node *n, const char *id, const char *name)
{
    for (int t = 0; t < 15000; t += 20) {
        if (sees(n, id, name))
            return;
        usleep(20000);
    }
    FAIL("node %s never saw node %.8s %s", cluster_self_id(n->c), id, name ? "serving" : "up");
}

/* The body of a response, de-chunked in place when it came chunked. */
static char *body_of(char *resp)
{
    char *b = strstr(resp, "\r\n\r\n");
    CHECK(b);
    b += 4;
    if (!strstr(resp, "Transfer-Encoding: chunked"))
        return b;
    char *out = b, *in = b;
    for (;;) {
        unsigned long n = strtoul(in, &in, 16);
        CHECK(in[0] == '\r' && in[1] == '\n');
        in += 2;
        if (!n)
            break;
        memmove(out, in, n);
        out += n;
        in += n + 2;
    }
    *out = '\0';
    return b;
}

static void content_of(char *resp, char *out, size_t cap)
{
    json_t *j = json_loads(body_of(resp), 0, NULL);
    const char *c = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    CHECK(c);
    snprintf(out, cap, "%s", c);
    json_decref(j);
}

/* A node that speaks the forwarding messages by hand. */
typedef struct {
    pthread_mutex_t mu;
    int n;
    int type[64];
    uint32_t id[64];
    char text[64][256];
} seen;

static void on_fwd(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    (void)from;
    seen *s = ud;
    pthread_mutex_lock(&s->mu);
    if (s->n < 64 && len >= 4) {
        s->type[s->n] = type;
        s->id[s->n] = wire_get32(data);
        size_t skip = type == 0x5b ? 8 : type == 0x59 ? 4 : 4;
        size_t k = len > skip ? len - skip : 0;
        if (k > 255)
            k = 255;
        if (type == 0x59 && len >= 8)
            snprintf(s->text[s->n], 256, "%u", (unsigned)wire_get32(data + 4));
        else {
            memcpy(s->text[s->n], data + skip, k);
            s->text[s->n][k] = '\0';
        }
        s->n++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The key proof of docs/cluster-protocol.md §12 for API key `key`, request
 * id, forwarded by node `asker` to node `server`, computed from the spec. */
static void proof_of(const char *key, const char *asker, const char *server, uint32_t id,
                     uint8_t out[32])
{
    uint8_t kh[32], idb[4];
    crypto_generichash(kh, 32, (const uint8_t *)key, strlen(key),
                       (const uint8_t *)"racimo-api-key-v1", 17);
    wire_put32(idb, id);
    crypto_generichash_state st;
    crypto_generichash_init(&st, kh, 32, 32);
    crypto_generichash_update(&st, (const uint8_t *)"racimo-fwd-key-v1", 18);
    crypto_generichash_update(&st, (const uint8_t *)asker, strlen(asker) + 1);
    crypto_generichash_update(&st, (const uint8_t *)server, strlen(server) + 1);
    crypto_generichash_update(&st, idb, 4);
    crypto_generichash_final(&st, out, 32);
}

/* FWD_REQUEST from cluster c to node `to`; `key`: the API key it proves
 * (NULL: no proof), made for node `proof_for` (NULL: `to`). */
static void send_request_key(struct cluster *c, const char *to, uint32_t id, const char *path,
                             const char *body, const char *key, const char *proof_for)
{
    uint8_t m[1024];
    size_t pl = strlen(path), bl = strlen(body), kl = key ? 32 : 0;
    wire_put32(m, id);
    m[4] = (uint8_t)pl;
    m[5] = 0;
    memcpy(m + 6, path, pl);
    m[6 + pl] = 4;                                   /* the client: "test" */
    m[7 + pl] = 0;
    memcpy(m + 8 + pl, "test", 4);
    m[12 + pl] = (uint8_t)kl;
    m[13 + pl] = 0;
    if (key)
        proof_of(key, cluster_self_id(c), proof_for ? proof_for : to, id, m + 14 + pl);
    memcpy(m + 14 + pl + kl, body, bl);
    CHECK_OK(cluster_send(c, to, 0x58, m, 14 + pl + kl + bl));
}

static void send_request(struct cluster *c, const char *to, uint32_t id, const char *path,
                         const char *body)
{
    send_request_key(c, to, id, path, body, "kc", NULL);
}

/* Waits for the FWD_END of request id; returns its index. */
static int wait_end(seen *s, uint32_t id)
{
    for (int t = 0; t < 20000; t += 10) {
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n; i++)
            if (s->type[i] == 0x5b && s->id[i] == id) {
                pthread_mutex_unlock(&s->mu);
                return i;
            }
        pthread_mutex_unlock(&s->mu);
        usleep(10000);
    }
    FAIL("no FWD_END for request %u", (unsigned)id);
}

/* Lines of n's access log that hold both a and b. */
static int log_count(const test_node *n, const char *a, const char *b)
{
    FILE *f = fopen(n->log, "r");
    char line[8192];
    int k = 0;
    while (f && fgets(line, sizeof line, f))
        k += strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return k;
}

static bool log_has(const test_node *n, const char *a, const char *b) { return log_count(n, a, b) > 0; }

/* Waits (up to 10 s) until node n's model has `active` sequences running
 * and `queued` waiting. */
static void wait_load(test_node *n, const char *key, int active, int queued)
{
    static char buf[1 << 16];
    for (int t = 0; t < 10000; t += 20) {
        http_request(port(n), "GET", "/v1/cluster", key, NULL, buf, sizeof buf);
        /* the record of model fw (another object of the answer may say
         * "active":0 too, e.g. while this node's copy is busy) */
        json_t *o = json_loads(body_of(buf), 0, NULL), *m;
        size_t i;
        bool done = false;
        json_array_foreach(json_object_get(o, "models"), i, m)
            done = done || (!strcmp(json_string_value(json_object_get(m, "name")), "fw") &&
                            json_integer_value(json_object_get(m, "active")) == active &&
                            json_is_integer(json_object_get(m, "active")) &&
                            json_integer_value(json_object_get(m, "queued")) == queued);
        json_decref(o);
        if (done)
            return;
        usleep(20000);
    }
    FAIL("node %s never had %d running and %d queued: %.300s", cluster_self_id(n->c), active,
         queued, buf);
}

#define KA "Authorization: Bearer ka\r\n"
#define KB "Authorization: Bearer kb\r\n"
#define KC "Authorization: Bearer kc\r\n"
#define CHAT(extra) "{\"model\":\"fw\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," \
                    "\"temperature\":0" extra "}"

/* Nodes fa (key ka, holding `file` as fw) and fb (key kb), linked, each
 * seeing the other up; the model runs across both (min_nodes 2). */
static void start_two(test_node *a, test_node *b, const char *file)
{
    t_min_nodes = 2;
    t_parallel = 2;
    start(a, "fa", NULL, NULL, "ka", file);
    start(b, "fb", cluster_join_token(a->c), a, "kb", NULL);
    wait_sees(a, cluster_self_id(b->c), NULL);
    wait_sees(b, cluster_self_id(a->c), NULL);
}

TEST_T(forward_requests_between_nodes, 180)
{
    static char buf[1 << 17];
    static test_node a, b;
    start_two(&a, &b, test_make_model("tiny", TT_Q8_0, NULL));
    const char *ida = cluster_self_id(a.c), *idb = cluster_self_id(b.c);

    /* node b lists the model node a has, in both APIs */
    int t;
    for (t = 0; t < 10000; t += 50) {
        http_request(port(&b), "GET", "/v1/models", KB, NULL, buf, sizeof buf);
        if (strstr(buf, "\"id\":\"fw\""))
            break;
        usleep(50000);
    }
    CHECK(strstr(buf, "\"id\":\"fw\""));
    CHECK_INT(http_request(port(&b), "GET", "/api/tags", KB, NULL, buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"name\":\"fw:latest\""));
    /* its metadata comes from the node with the file */
    CHECK_INT(http_request(port(&b), "POST", "/api/show", KC, "{\"model\":\"fw\"}", buf,
                           sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), "\"general.architecture\":\"llama\""));

    /* node a places the model over both nodes and heads it */
    char want[4096], got[4096];
    CHECK_INT(http_request(port(&a), "POST", "/v1/chat/completions", KA, CHAT(",\"max_tokens\":6"),
                           buf, sizeof buf), ==, 200);
    content_of(buf, want, sizeof want);
    wait_sees(&b, ida, "fw");

    /* node b answers with node a's instance: same tokens, with a key both accept */
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":6"),
                           buf, sizeof buf), ==, 200);
    content_of(buf, got, sizeof got);
    CHECK_STR(got, want);
    /* b's own key is not one of a's: a refuses, and says so through b */
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KB, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 401);
    CHECK(strstr(buf, "invalid_api_key") && strstr(buf, "node fa") && strstr(buf, "node fb"));
    CHECK_INT(http_request(port(&b), "POST", "/api/generate", KB,
                           "{\"model\":\"fw\",\"prompt\":\"hi\"}", buf, sizeof buf), ==, 401);
    CHECK(strstr(body_of(buf), "{\"error\":\"node fa"));          /* in Ollama's style */
    CHECK_INT(http_request(port(&b), "GET", "/v1/cluster", KB, NULL, buf, sizeof buf), ==, 200);
    json_t *v = json_loads(body_of(buf), 0, NULL);
    CHECK_INT(json_array_size(json_object_get(json_object_get(v, "pipelines"), "instances")), ==, 0);
    json_decref(v);
    CHECK(log_has(&b, "\"finish\":\"forwarded\"", "\"status\":200"));
    char via[64];
    snprintf(via, sizeof via, " via %.8s\"", idb);       /* a's log names who asked */
    CHECK(log_has(&a, via, "\"finish\":\"length\""));
    CHECK(log_has(&a, via, "\"key\":\"key-2\""));           /* the serving node's key id */
    CHECK(log_has(&a, via, "\"status\":401"));
    CHECK(log_has(&b, "\"status\":401", "\"finish\":\"forwarded\""));
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KA, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 401);          /* b's keys, not a's */

    /* streams, in both styles */
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KC,
                           CHAT(",\"max_tokens\":4,\"stream\":true"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "text/event-stream"));
    CHECK(strstr(body_of(buf), "chat.completion.chunk"));
    CHECK(strstr(buf, "data: [DONE]"));
    CHECK_INT(http_request(port(&b), "POST", "/api/generate", KC,
                           "{\"model\":\"fw\",\"prompt\":\"hi\",\"options\":{\"num_predict\":3}}",
                           buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "application/x-ndjson"));
    CHECK(strstr(body_of(buf), "\"done\":true"));

    /* Anthropic's Messages the same way: the same tokens, x-api-key proved
     * like a Bearer key, the refusal and the stream in Anthropic's shapes */
#define AMSG(extra) "{\"model\":\"fw\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," \
                    "\"temperature\":0" extra "}"
    CHECK_INT(http_request(port(&b), "POST", "/v1/messages", "x-api-key: kc\r\n",
                           AMSG(",\"max_tokens\":6"), buf, sizeof buf), ==, 200);
    v = json_loads(body_of(buf), 0, NULL);
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(v, "content"), 0),
                                                "text")), want);
    json_decref(v);
    CHECK_INT(http_request(port(&b), "POST", "/v1/messages", "x-api-key: kb\r\n",
                           AMSG(",\"max_tokens\":2"), buf, sizeof buf), ==, 401);
    CHECK(strstr(body_of(buf), "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\"") &&
          strstr(buf, "node fa"));
    CHECK_INT(http_request(port(&b), "POST", "/v1/messages", KC,
                           AMSG(",\"max_tokens\":3,\"stream\":true"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "event: message_start") && strstr(buf, "event: message_stop"));
    CHECK_INT(http_request(port(&b), "POST", "/v1/messages/count_tokens", KC, AMSG(""), buf,
                           sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), "{\"input_tokens\":"));

    /* the forwarder's mark is a secret: a wrong one is just a missing key */
    CHECK_INT(http_request(port(&a), "POST", "/v1/chat/completions", "X-Racimo-Forward: 00\r\n",
                           CHAT(",\"max_tokens\":2"), buf, sizeof buf), ==, 401);

    /* a client that leaves cancels the generation on the serving node */
    int fd = http_open(port(&b), "POST", "/v1/chat/completions", KC,
                       CHAT(",\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true"));
    CHECK(read(fd, buf, 64) > 0);
    close(fd);
    for (t = 0; t < 20000 && !log_has(&a, "\"finish\":\"cancelled\"", "chat/completions"); t += 50)
        usleep(50000);
    CHECK(log_has(&a, "\"finish\":\"cancelled\"", "chat/completions"));

    /* a 429 of the serving node comes back as it is, with its Retry-After */
    int busy[3];
    for (int i = 0; i < 3; i++)
        busy[i] = http_open(port(&a), "POST", "/v1/chat/completions", KA,
                            CHAT(",\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true"));
    wait_load(&a, KA, 2, 1);
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 429);
    CHECK(strstr(buf, "Retry-After: 1"));
    for (int i = 0; i < 3; i++)
        close(busy[i]);
    wait_load(&a, KA, 0, 0);

    /* hostile or stray messages: refused with a reason, or ignored */
    static seen s;
    pthread_mutex_init(&s.mu, NULL);
    char dir[600], models[700], addr[64];
    const char *peers[1];
    cluster_config cc;
    test_cluster_config(&cc, "fc", cluster_join_token(a.c), cluster_port(a.c), dir, sizeof dir,
                        models, sizeof models, addr, peers);
    struct cluster *c;
    CHECK_OK(cluster_new(&cc, &c, NULL));
    CHECK_OK(cluster_add_handler(c, 0x58, 0x5f, on_fwd, &s));
    CHECK_OK(cluster_start(c));
    for (t = 0; t < 8000 && !(cluster_send(c, ida, 0x58, "abc", 3) == 0); t += 20)
        usleep(20000);
    send_request(c, ida, 7, "/v1/instances/stop", "{\"model\":\"fw\"}");
    CHECK(strstr(s.text[wait_end(&s, 7)], "generation endpoint"));
    send_request(c, ida, 8, "/v1/completions",
                 "{\"model\":\"fw\",\"prompt\":\"hi\",\"max_tokens\":3,\"temperature\":0}");
    send_request(c, ida, 8, "/v1/completions", "{}");             /* the same id again */
    int e = wait_end(&s, 8);
    CHECK(strstr(s.text[e], "running already"));
    e = -1;
    for (t = 0; t < 20000 && e < 0; t += 10) {
        pthread_mutex_lock(&s.mu);
        int ends = 0;
        for (int i = 0; i < s.n; i++)
            if (s.type[i] == 0x5b && s.id[i] == 8 && ++ends == 2)
                e = i;
        pthread_mutex_unlock(&s.mu);
        usleep(10000);
    }
    CHECK(e >= 0);
    bool head = false, body = false;
    for (int i = 0; i < e; i++) {
        head |= s.type[i] == 0x59 && s.id[i] == 8 && !strcmp(s.text[i], "200");
        body |= s.type[i] == 0x5a && s.id[i] == 8 && strstr(s.text[i], "text_completion");
    }
    CHECK(head && body);
    CHECK_STR(s.text[e], "");                                     /* ended well */
    /* a's keys apply to members too: no proof, a proof of a key a lacks, or a
     * proof made for another node (b) are all answered 401, and ended well */
    send_request_key(c, ida, 9, "/v1/completions", "{\"model\":\"fw\",\"prompt\":\"hi\"}",
                     NULL, NULL);
    send_request_key(c, ida, 10, "/v1/completions", "{\"model\":\"fw\",\"prompt\":\"hi\"}",
                     "kb", NULL);
    send_request_key(c, ida, 11, "/api/generate", "{\"model\":\"fw\",\"prompt\":\"hi\"}",
                     "kc", idb);
    for (uint32_t id = 9; id <= 11; id++) {
        e = wait_end(&s, id);
        CHECK_STR(s.text[e], "");
        head = body = false;
        for (int i = 0; i < e; i++) {
            head |= s.type[i] == 0x59 && s.id[i] == id && !strcmp(s.text[i], "401");
            body |= s.type[i] == 0x5a && s.id[i] == id && strstr(s.text[i], "requires one of its");
        }
        CHECK(head && body);
    }
    CHECK_INT(log_count(&a, "\"client\":\"test via", "\"status\":401"), ==, 3);
    uint8_t junk[16] = { 1, 2, 3, 4, 0xc8, 0, 0, 0, 5, 0, 'x' };
    for (t = 0; t < 8000 && cluster_send(c, idb, 0x5f, junk, sizeof junk) != 0; t += 20)
        usleep(20000);                                            /* c meets b by gossip */
    for (int type = 0x59; type <= 0x5f; type++)
        CHECK_OK(cluster_send(c, idb, type, junk, sizeof junk));   /* ids b never gave */
    cluster_free(c);
    pthread_mutex_destroy(&s.mu);
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":6"),
                           buf, sizeof buf), ==, 200);
    content_of(buf, got, sizeof got);
    CHECK_STR(got, want);

    /* the serving node stopping ends a forwarded stream with a reason */
    fd = http_open(port(&b), "POST", "/v1/chat/completions", KC,
                   CHAT(",\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true"));
    CHECK(read(fd, buf, 64) > 0);
    stop(&a);
    size_t len = 0;
    ssize_t n;
    while (len + 1 < sizeof buf && (n = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    CHECK(strstr(buf, "node fa") && strstr(buf, "forward_failed"));
    CHECK_INT(http_request(port(&b), "GET", "/health", NULL, NULL, buf, sizeof buf), ==, 200);
    stop(&b);
}

/* Waits (up to 30 s) until node n sees node `id` serving `name` with at
 * least one slot free: what n's placement of a busy request reads. */
static void wait_free(test_node *n, const char *id, const char *name)
{
    for (int t = 0; t < 30000; t += 20) {
        json_t *s = cluster_snapshot(n->c), *x;
        size_t i;
        json_int_t fr = 0;
        json_array_foreach(json_object_get(s, "nodes"), i, x)
            if (!strcmp(json_string_value(json_object_get(x, "id")), id))
                fr = json_integer_value(json_object_get(json_object_get(x, "serving_free"), name));
        json_decref(s);
        if (fr > 0)
            return;
        usleep(20000);
    }
    FAIL("node %s never saw a free slot of %s on node %.8s", cluster_self_id(n->c), name, id);
}

/* Waits (up to 30 s) until n's access log has `want` lines holding both a
 * and b: a line is written when its request ends, which may be just after
 * the client has read the answer. */
static void wait_log(const test_node *n, const char *a, const char *b, int want)
{
    for (int t = 0; t < 30000 && log_count(n, a, b) < want; t += 20)
        usleep(20000);
    CHECK_INT(log_count(n, a, b), ==, want);
}

/* Two copies of a model that fits each node: each node has its own instance,
 * and a request that finds every slot of its node's copy taken goes to the
 * other copy when that one has a slot free.
 * Equal hardware: each node's placement keeps the model on the node placing
 * it (docs/cluster.md), so each runs its copy alone, whichever is asked
 * first; the node with the larger id (hi) is asked first, as when ties went
 * to the smaller id.  Requests carry the key both nodes accept. */
TEST_T(forward_balances_busy_copies, 120)
{
    static char buf[1 << 17];
    static test_node a, b;
    t_min_nodes = 0;
    t_parallel = 1;
    const char *file = test_make_model("tiny", TT_Q8_0, NULL);
    start(&a, "ga", NULL, NULL, "ka", file);
    start(&b, "gb", cluster_join_token(a.c), &a, "kb", file);
    test_node *hi = &a, *lo = &b;
    if (strcmp(cluster_self_id(a.c), cluster_self_id(b.c)) < 0) {
        hi = &b;
        lo = &a;
    }
    const char *idhi = cluster_self_id(hi->c), *idlo = cluster_self_id(lo->c);
    wait_sees(hi, idlo, NULL);
    wait_sees(lo, idhi, NULL);
    CHECK_INT(http_request(port(hi), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 200);
    CHECK_INT(http_request(port(lo), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 200);
    wait_log(hi, "\"status\":200", "", 1);
    wait_log(lo, "\"status\":200", "", 1);
    CHECK_INT(log_count(hi, "forwarded", "") + log_count(lo, "forwarded", ""), ==, 0);
    wait_free(hi, idlo, "fw");

    /* node hi's one slot is taken: the next request runs on node lo */
    int fd = http_open(port(hi), "POST", "/v1/chat/completions", KC,
                       CHAT(",\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true"));
    CHECK(read(fd, buf, 64) > 0);
    wait_load(hi, KC, 1, 0);
    CHECK_INT(http_request(port(hi), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":4"),
                           buf, sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), "chat.completion"));
    wait_log(hi, "\"finish\":\"forwarded\"", "\"status\":200", 1);
    wait_log(lo, "\"status\":200", "\"finish\":\"length\"", 2);
    close(fd);

    /* free again: node hi answers itself */
    wait_load(hi, KC, 0, 0);
    CHECK_INT(http_request(port(hi), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 200);
    wait_log(hi, "\"status\":200", "\"finish\":\"length\"", 2);
    CHECK_INT(log_count(hi, "\"finish\":\"forwarded\"", ""), ==, 1);
    stop(&a);
    stop(&b);
}

/* An embedding model placed over both nodes (its last stage pools, protocol
 * 2.2): the head answers embeddings, and the other node forwards them there
 * and gets the same vectors, in both APIs. */
TEST_T(forward_embeddings, 120)
{
    static char buf[1 << 17], want[1 << 16];
    static test_node a, b;
    start_two(&a, &b, test_make_model("tiny-qwen3-embed", TT_F32, NULL));
    const char *ida = cluster_self_id(a.c);
    static const char body[] = "{\"model\":\"fw\",\"input\":[\"the cat\",\"sat on the mat\"],"
                               "\"encoding_format\":\"float\"}";
    CHECK_INT(http_request(port(&a), "POST", "/v1/embeddings", KA, body, buf, sizeof buf), ==, 200);
    json_t *o = json_loads(body_of(buf), 0, NULL);
    CHECK_INT(json_array_size(json_object_get(o, "data")), ==, 2);
    json_t *e0 = json_object_get(json_array_get(json_object_get(o, "data"), 0), "embedding");
    CHECK_INT(json_array_size(e0), ==, 256);
    char *s = json_dumps(json_object_get(o, "data"), JSON_COMPACT);
    snprintf(want, sizeof want, "%s", s);
    free(s);
    json_decref(o);
    CHECK_INT(http_request(port(&a), "GET", "/v1/cluster", KA, NULL, buf, sizeof buf), ==, 200);
    o = json_loads(body_of(buf), 0, NULL);          /* split by layers over both nodes */
    json_t *inst = json_array_get(json_object_get(json_object_get(o, "pipelines"), "instances"), 0);
    CHECK_INT(json_array_size(json_object_get(inst, "stages")), ==, 2);
    CHECK_STR(json_string_value(json_object_get(inst, "split")), "layers");
    json_decref(o);
    wait_sees(&b, ida, "fw");
    CHECK_INT(http_request(port(&b), "POST", "/v1/embeddings", KC, body, buf, sizeof buf), ==, 200);
    o = json_loads(body_of(buf), 0, NULL);
    s = json_dumps(json_object_get(o, "data"), JSON_COMPACT);
    CHECK_STR(s, want);
    free(s);
    json_decref(o);
    CHECK_INT(http_request(port(&b), "POST", "/api/embed", KC,
                           "{\"model\":\"fw\",\"input\":\"the cat\"}", buf, sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), "\"embeddings\":[["));
    CHECK(log_has(&b, "\"finish\":\"forwarded\"", "\"status\":200"));
    /* chat on an embedding model: a 400 from the serving node, through b */
    CHECK_INT(http_request(port(&b), "POST", "/v1/chat/completions", KC, CHAT(",\"max_tokens\":2"),
                           buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "embedding model"));
    stop(&b);
    stop(&a);
}

/* The node's record in n's view of node `id`: a new reference, or NULL. */
static json_t *record_of(test_node *n, const char *id)
{
    json_t *s = cluster_snapshot(n->c), *x, *out = NULL;
    size_t i;
    json_array_foreach(json_object_get(s, "nodes"), i, x)
        if (!strcmp(json_string_value(json_object_get(x, "id")), id))
            out = json_incref(x);
    json_decref(s);
    return out;
}

/* The dashboard's start form: the plan preview (POST /v1/instances with
 * dry_run, split and min_nodes) places as a start would and starts
 * nothing; a start with min_nodes runs over both nodes; the other node's
 * view shows the instance (its plan) and the power the head publishes;
 * racimo instances plan prints the preview. */
TEST_T(forward_plan_preview_and_instances_published, 120)
{
    static char buf[1 << 17];
    static test_node a, b;
    t_min_nodes = 0;
    t_parallel = 2;
    const char *file = test_make_model("tiny", TT_Q8_0, NULL);
    start(&a, "pa", NULL, NULL, "ka", file);
    start(&b, "pb", cluster_join_token(a.c), &a, "kb", NULL);
    const char *ida = cluster_self_id(a.c), *idb = cluster_self_id(b.c);
    wait_sees(&a, idb, NULL);
    wait_sees(&b, ida, NULL);
    /* alone it fits one node (the faster); over at least 2 nodes, by layers or by shards */
    static const struct { const char *body, *want[3]; } cases[] = {
        { "{\"model\":\"fw\",\"dry_run\":true}",
          { "\"fits\":true", "\"runs_here\":", "\"split\":\"layers\"" } },
        { "{\"model\":\"fw\",\"dry_run\":true,\"min_nodes\":2,\"split\":\"layers\"}",
          { "\"runs_here\":false", "\"first\":0", "\"split\":\"layers\"" } },
        { "{\"model\":\"fw\",\"dry_run\":true,\"min_nodes\":2,\"split\":\"tensor\"}",
          { "\"fits\":true", "\"runs_here\":false", "\"split\":\"tensor\"" } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = http_request(port(&a), "POST", "/v1/instances", KA, cases[i].body, buf,
                              sizeof buf);
        if (st != 200)
            FAIL("%s: %d %s", cases[i].body, st, buf);
        json_t *o = json_loads(body_of(buf), 0, NULL);
        char *text = json_dumps(json_object_get(o, "plan"), JSON_COMPACT);
        for (int k = 0; k < 3; k++)
            if (!text || !strstr(text, cases[i].want[k]))
                FAIL("%s: no %s in %s", cases[i].body, cases[i].want[k], text ? text : "?");
        CHECK_INT(json_array_size(json_object_get(json_object_get(o, "plan"), "stages")), ==,
                  i ? 2 : 1);
        free(text);
        json_decref(o);
    }
    /* only the nodes asked for: b by name, a by id; none up is a 400 */
    CHECK_INT(http_request(port(&a), "POST", "/v1/instances", KA,
                           "{\"model\":\"fw\",\"dry_run\":true,\"nodes\":[\"pb\"]}", buf,
                           sizeof buf), ==, 200);
    json_t *o = json_loads(body_of(buf), 0, NULL);
    json_t *stages = json_object_get(json_object_get(o, "plan"), "stages");
    CHECK_INT(json_array_size(stages), ==, 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(stages, 0), "node")), idb);
    json_decref(o);
    char body[200];
    snprintf(body, sizeof body, "{\"model\":\"fw\",\"dry_run\":true,\"nodes\":[\"%s\"]}", ida);
    CHECK_INT(http_request(port(&a), "POST", "/v1/instances", KA, body, buf, sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), ida) && !strstr(body_of(buf), idb));
    CHECK_INT(http_request(port(&a), "POST", "/v1/instances", KA,
                           "{\"model\":\"fw\",\"dry_run\":true,\"nodes\":[\"nowhere\"]}", buf,
                           sizeof buf), ==, 400);
    CHECK(strstr(buf, "none of the nodes asked for fw is up"));
    /* a preview starts nothing */
    CHECK_INT(http_request(port(&a), "GET", "/v1/cluster", KA, NULL, buf, sizeof buf), ==, 200);
    CHECK(strstr(body_of(buf), "\"state\":\"available\""));
    /* the CLI prints it */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s instances plan fw --min-nodes 2 --split layers "
             "--url http://127.0.0.1:%d --api-key ka", test_bin(), port(&a));
    CHECK_INT(test_run(cmd, buf, sizeof buf), ==, 0);
    if (!strstr(buf, "fw: fits on 2 nodes (layers)") || !strstr(buf, "stage 1: layers"))
        FAIL("racimo instances plan: %s", buf);
    /* started over both nodes (a's own wish, not --min-nodes), then shown from b */
    int st = http_request(port(&a), "POST", "/v1/instances", KA,
                          "{\"model\":\"fw\",\"min_nodes\":2}", buf, sizeof buf);
    CHECK(st == 200 || st == 202);
    bool shown = false;
    for (int t = 0; t < 20000 && !shown; t += 50) {
        json_t *r = record_of(&b, ida);
        json_t *inst = json_array_get(json_object_get(r, "instances"), 0);
        shown = inst && !strcmp(json_string_value(json_object_get(inst, "name")), "fw") &&
               json_array_size(json_object_get(json_object_get(inst, "plan"), "stages")) == 2 &&
               json_is_object(json_object_get(inst, "cost")) &&
               json_is_string(json_object_get(json_object_get(r, "power"), "source")) &&
               !json_object_get(inst, "path");             /* a's paths stay on a */
        json_decref(r);
        if (!shown)
            usleep(50000);
    }
    if (!shown)
        FAIL("node b never saw node a's instance of fw over 2 nodes");
    /* racimo nodes --cost: both nodes' power (unknown here: no --watts, no RAPL
     * assumed), and the instance over both */
    snprintf(cmd, sizeof cmd, "%s nodes --cost --port %d --api-key ka", test_bin(), port(&a));
    CHECK_INT(test_run(cmd, buf, sizeof buf), ==, 0);
    if (!strstr(buf, "WATTS") || !strstr(buf, " pa ") || !strstr(buf, " pb ") ||
        !strstr(buf, "fw ") || !(strstr(buf, "pa,pb") || strstr(buf, "pb,pa")))
        FAIL("racimo nodes --cost: %s", buf);
    /* stopped: gone from b's view too */
    for (int t = 0; t < 10000; t += 50) {
        if (http_request(port(&a), "POST", "/v1/instances/stop", KA, "{\"model\":\"fw\"}", buf,
                         sizeof buf) == 200)
            break;
        usleep(50000);
    }
    shown = true;
    for (int t = 0; t < 10000 && shown; t += 50) {
        json_t *r = record_of(&b, ida);
        shown = json_array_size(json_object_get(r, "instances")) > 0;
        json_decref(r);
        if (shown)
            usleep(50000);
    }
    CHECK(!shown);
    stop(&b);
    stop(&a);
}
