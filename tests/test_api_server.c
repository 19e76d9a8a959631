/* test_api_server.c - the HTTP server in this process (so the sanitizer
 * build checks its memory): a server thread on a free loopback port, raw
 * HTTP over sockets, then a clean shutdown with requests still running.
 * The end-to-end tests (tests/e2e) drive the real binary with real clients;
 * these cover the same paths under ASan/UBSan and LeakSanitizer. */
#include "test.h"
#include "http_util.h"
#include "model_util.h"
#include "api/api.h"
#include "base/err.h"
#include "tensor/types.h"

#include <pthread.h>
#include <unistd.h>

typedef struct {
    api_server *s;
    pthread_t thread;
    char dir[512];
} fixture;

static void *serve(void *arg)
{
    api_server_run(arg);
    return NULL;
}

static void start(fixture *f, const char *const *keys, int n_keys, int parallel, int queue)
{
    const char *path = test_make_model("tiny", TT_Q8_0, NULL);
    snprintf(f->dir, sizeof f->dir, "%s", test_tmpdir());
    static const char *paths[1];
    paths[0] = path;
    static api_config cfg;
    api_config_default(&cfg);
    cfg.port = 0;
    cfg.model_paths = paths;
    cfg.n_model_paths = 1;
    cfg.models_dir = f->dir;
    cfg.ro_dirs = "";
    cfg.threads = 1;
    cfg.ctx_size = 256;
    cfg.parallel = parallel;
    cfg.queue = queue;
    cfg.api_keys = keys;
    cfg.n_api_keys = n_keys;
    cfg.max_body_bytes = 4096;
    CHECK_OK(api_server_new(&cfg, &f->s));
    CHECK(pthread_create(&f->thread, NULL, serve, f->s) == 0);
}

static int request(fixture *f, const char *method, const char *path, const char *headers,
                   const char *body, char *out, size_t cap);
/* The -m model loads in the background; /health says 503 meanwhile. */
static void wait_ready(fixture *f)
{
    char buf[4096];
    for (int i = 0; i < 500; i++) {
        if (request(f, "GET", "/health", NULL, NULL, buf, sizeof buf) == 200)
            return;
        CHECK(strstr(buf, "\"status\":\"loading\""));
        usleep(10000);
    }
    FAIL("the model did not load");
}

static void stop(fixture *f)
{
    api_server_stop(f->s);
    pthread_join(f->thread, NULL);
    api_server_free(f->s);
}

static int connect_to(fixture *f, const char *method, const char *path, const char *headers,
                      const char *body)
{
    return http_open(api_server_port(f->s), method, path, headers, body);
}

static int request(fixture *f, const char *method, const char *path, const char *headers,
                   const char *body, char *out, size_t cap)
{
    return http_request(api_server_port(f->s), method, path, headers, body, out, cap);
}

static void wait_idle(fixture *f)
{
    char buf[8192];
    for (int i = 0; i < 200; i++) {
        request(f, "GET", "/v1/cluster", NULL, NULL, buf, sizeof buf);
        if (strstr(buf, "\"active\":0") && strstr(buf, "\"queued\":0"))
            return;
        usleep(20000);
    }
    FAIL("the engine did not go idle: %s", buf);
}

#define CHAT(extra) "{\"model\":\"tiny-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" extra "}"

TEST(api_server_endpoints)
{
    fixture f;
    start(&f, NULL, 0, 2, 4);
    static char buf[1 << 16];
    wait_ready(&f);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"max_tokens\":4"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"object\":\"chat.completion\""));
    CHECK(strstr(buf, "\"completion_tokens\":"));
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      /* ignore_eos: a sampled end of text at the first token
                       * would leave no token to carry log-probabilities */
                      CHAT(",\"max_tokens\":4,\"stream\":true,\"logprobs\":true,\"top_logprobs\":2,"
                           "\"ignore_eos\":true"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "text/event-stream"));
    CHECK(strstr(buf, "data: [DONE]"));
    CHECK(strstr(buf, "\"top_logprobs\":[{"));
    CHECK_INT(request(&f, "POST", "/v1/completions", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"max_tokens\":3,\"logprobs\":1}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"token_logprobs\""));
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, CHAT(",\"options\":{\"num_predict\":3}"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "application/x-ndjson"));
    CHECK(strstr(buf, "\"done\":true"));
    CHECK_INT(request(&f, "POST", "/api/generate", NULL,
                      "{\"model\":\"tiny-Q8_0:latest\",\"prompt\":\"x\",\"stream\":false,\"options\":{\"num_predict\":3}}",
                      buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"eval_count\":"));
    CHECK_INT(request(&f, "POST", "/api/generate", NULL, "{\"model\":\"tiny-Q8_0\"}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"done_reason\":\"load\""));
    const char *gets[] = { "/v1/models", "/v1/models/tiny-Q8_0", "/api/tags", "/api/ps", "/api/version",
                           "/metrics", "/v1/cluster", "/" };
    for (size_t i = 0; i < sizeof gets / sizeof gets[0]; i++)
        if (request(&f, "GET", gets[i], NULL, NULL, buf, sizeof buf) != 200)
            FAIL("GET %s: %s", gets[i], buf);
    CHECK_INT(request(&f, "POST", "/api/show", NULL, "{\"model\":\"tiny-Q8_0\"}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"general.architecture\":\"llama\""));
    stop(&f);
}

TEST(api_server_errors)
{
    fixture f;
    start(&f, NULL, 0, 1, 0);
    static char buf[1 << 16];
    wait_ready(&f);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, "{", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "\"type\":\"invalid_request_error\""));
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, "{", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "{\"error\":\"the body is not valid JSON"));
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      "{\"model\":\"none\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", buf, sizeof buf), ==, 404);
    CHECK(strstr(buf, "model_not_found"));
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"max_tokens\":1000"), buf, sizeof buf), ==, 400);
    CHECK_INT(request(&f, "POST", "/v1/completions", NULL, "{\"model\":\"tiny-Q8_0\",\"prompt\":[1,9999]}", buf, sizeof buf), ==, 400);
    char big[4200];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, big, buf, sizeof buf), ==, 413);
    CHECK(strstr(buf, "request_too_large"));
    char longp[3000] = "{\"model\":\"tiny-Q8_0\",\"prompt\":\"";
    for (int i = 0; i < 300; i++)
        strcat(longp, "word ");
    strcat(longp, "\"}");
    CHECK_INT(request(&f, "POST", "/v1/completions", NULL, longp, buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "context_length_exceeded"));
    CHECK_INT(request(&f, "GET", "/v1/chat/completions", NULL, NULL, buf, sizeof buf), ==, 405);
    CHECK_INT(request(&f, "GET", "/nothing", NULL, NULL, buf, sizeof buf), ==, 404);
    CHECK_INT(request(&f, "POST", "/api/show", NULL, "{\"model\":\"none\"}", buf, sizeof buf), ==, 404);
    CHECK_INT(request(&f, "GET", "/v1/models/none", NULL, NULL, buf, sizeof buf), ==, 404);
    /* one sequence, no queue: a second request while one runs gets 429 */
    int fd = connect_to(&f, "POST", "/v1/chat/completions", NULL,
                        CHAT(",\"max_tokens\":200,\"ignore_eos\":true,\"stream\":true"));
    char first[256];
    CHECK(read(fd, first, sizeof first) > 0);
    int busy = request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"max_tokens\":2"), buf, sizeof buf);
    close(fd);                       /* and leave: the sequence is cancelled */
    CHECK_INT(busy, ==, 429);
    CHECK(strstr(buf, "Retry-After: 1"));
    wait_idle(&f);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"max_tokens\":2"), buf, sizeof buf), ==, 200);
    stop(&f);
}

TEST(api_server_keys_and_shutdown)
{
    static const char *keys[] = { "k1", "k2" };
    fixture f;
    start(&f, keys, 2, 2, 4);
    static char buf[1 << 16];
    wait_ready(&f);
    CHECK_INT(request(&f, "GET", "/v1/models", NULL, NULL, buf, sizeof buf), ==, 401);
    CHECK(strstr(buf, "invalid_api_key"));
    CHECK_INT(request(&f, "GET", "/v1/models", "Authorization: Bearer k3\r\n", NULL, buf, sizeof buf), ==, 401);
    CHECK_INT(request(&f, "GET", "/v1/models", "Authorization: Bearer k\r\n", NULL, buf, sizeof buf), ==, 401);
    CHECK_INT(request(&f, "GET", "/v1/models", "Authorization: Bearer k2\r\n", NULL, buf, sizeof buf), ==, 200);
    CHECK_INT(request(&f, "GET", "/health", NULL, NULL, buf, sizeof buf), ==, 200);
    /* shut down with a stream running and a non-streamed request waiting */
    int a = connect_to(&f, "POST", "/v1/chat/completions", "Authorization: Bearer k1\r\n",
                       CHAT(",\"max_tokens\":200,\"ignore_eos\":true,\"stream\":true"));
    int b = connect_to(&f, "POST", "/v1/chat/completions", "Authorization: Bearer k1\r\n",
                       CHAT(",\"max_tokens\":200,\"ignore_eos\":true"));
    char first[256];
    CHECK(read(a, first, sizeof first) > 0);
    stop(&f);
    close(a);
    close(b);
}
