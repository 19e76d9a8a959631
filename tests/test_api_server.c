/* test_api_server.c - the HTTP server in this process (so the sanitizer
 * build checks its memory): a server thread on a free loopback port, raw
 * HTTP over sockets, then a clean shutdown with requests still running.
 * The end-to-end tests (tests/e2e) drive the real binary with real clients;
 * these cover the same paths under ASan/UBSan and LeakSanitizer. */
#include "test.h"
#include "cli_util.h"
#include "http_util.h"
#include "model_util.h"
#include "api/api.h"
#include "api/buf.h"
#include "base/err.h"
#include "tensor/types.h"

#include <jansson.h>
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

static const char *t_tls_cert, *t_tls_key;     /* what start() gives the server */

static void start_template(fixture *f, const char *const *keys, int n_keys, int parallel, int queue,
                           const char *template_file)
{
    const char *path = test_make_model("tiny", TT_Q8_0, NULL);
    snprintf(f->dir, sizeof f->dir, "%s", test_tmpdir());
    static const char *paths[1];
    paths[0] = path;
    static api_config cfg;
    api_config_default(&cfg);
    cfg.template_file = template_file;
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
    cfg.tls_cert = t_tls_cert;
    cfg.tls_key = t_tls_key;
    CHECK_OK(api_server_new(&cfg, &f->s));
    CHECK(pthread_create(&f->thread, NULL, serve, f->s) == 0);
}

static void start(fixture *f, const char *const *keys, int n_keys, int parallel, int queue)
{
    start_template(f, keys, n_keys, parallel, queue, NULL);
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
    if (!strstr(buf, "\"top_logprobs\":[{"))
        FAIL("no top_logprobs in %s", buf);
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
    CHECK_INT(busy, ==, 429);
    CHECK(strstr(buf, "Retry-After: 1"));
    /* Anthropic's API calls that overloaded, with its own status */
    busy = request(&f, "POST", "/v1/messages", NULL, "{\"model\":\"tiny-Q8_0\",\"max_tokens\":2,"
                   "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", buf, sizeof buf);
    close(fd);                       /* and leave: the sequence is cancelled */
    CHECK_INT(busy, ==, 529);
    CHECK(strstr(buf, "Retry-After: 1") && strstr(buf, "\"type\":\"overloaded_error\""));
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

/* ---- thinking ---- */

/* A ChatML template that thinks like Qwen3 with a switch, except that the
 * generation prompt opens the block itself (as DeepSeek-R1's does), so the
 * random model's answer starts inside it. */
static const char thinking_template[] =
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}";

static const char *write_template(const char *text)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/thinking.jinja", test_tmpdir());
    FILE *fp = fopen(path, "w");
    CHECK(fp && fputs(text, fp) >= 0 && fclose(fp) == 0);
    return path;
}

static json_t *body_json(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    CHECK(b);
    json_error_t je;
    json_t *o = json_loads(b + 4, 0, &je);
    if (!o)
        FAIL("not JSON (%s): %s", je.text, b + 4);
    return o;
}

/* The JSON objects of a stream (SSE "data: {...}" events or Ollama's JSON
 * lines), whatever chunk framing is around them. */
static json_t *stream_objects(const char *resp, const char *start)
{
    json_t *all = json_array();
    const char *p = strstr(resp, "\r\n\r\n");
    CHECK(p);
    while ((p = strstr(p, start))) {
        p = strchr(p, '{');
        json_error_t je;
        json_t *o = json_loads(p, JSON_DISABLE_EOF_CHECK, &je);
        if (!o)
            FAIL("bad event (%s) at: %.200s", je.text, p);
        json_array_append_new(all, o);
        p++;
    }
    return all;
}

static const char *str_at(const json_t *o, const char *path1, const char *path2)
{
    const json_t *v = json_object_get(o, path1);
    if (path2)
        v = json_object_get(v, path2);
    return json_string_value(v);
}

/* The answer is forced to "xxxx" with logit_bias (token 120 is the byte 'x'
 * in the synthetic vocabulary). */
#define FORCED "\"max_tokens\":4,\"temperature\":0,\"logit_bias\":{\"120\":100}"
#define TCHAT(extra) "{\"model\":\"tiny-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," FORCED extra "}"

TEST(api_server_thinking_openai)
{
    fixture f;
    start_template(&f, NULL, 0, 2, 4, write_template(thinking_template));
    static char buf[1 << 16];
    wait_ready(&f);
    /* the prompt opened the block: the whole answer is reasoning */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, TCHAT(""), buf, sizeof buf), ==, 200);
    json_t *o = body_json(buf);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK_STR(str_at(msg, "reasoning_content", NULL), "xxxx");
    CHECK_STR(str_at(msg, "content", NULL), "");
    CHECK_STR(str_at(json_array_get(json_object_get(o, "choices"), 0), "finish_reason", NULL), "length");
    json_int_t thinking_prompt = json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens"));
    json_decref(o);
    /* streamed: reasoning_content deltas, no content */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, TCHAT(",\"stream\":true"), buf, sizeof buf), ==, 200);
    json_t *ev = stream_objects(buf, "data: {");
    strbuf reason = { 0 }, content = { 0 };
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        json_t *d = json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta");
        if (str_at(d, "reasoning_content", NULL))
            sb_puts(&reason, str_at(d, "reasoning_content", NULL));
        if (str_at(d, "content", NULL))
            sb_puts(&content, str_at(d, "content", NULL));
    }
    CHECK_STR(sb_cstr(&reason), "xxxx");
    CHECK_STR(sb_cstr(&content), "");
    json_decref(ev);
    /* reasoning_format none: the text stays in the content */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, TCHAT(",\"reasoning_format\":\"none\""),
                      buf, sizeof buf), ==, 200);
    o = body_json(buf);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK_STR(str_at(msg, "content", NULL), "xxxx");
    CHECK(!json_object_get(msg, "reasoning_content"));
    json_decref(o);
    /* a stop string does not look into the reasoning */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, TCHAT(",\"stop\":\"xx\""), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK_STR(str_at(msg, "reasoning_content", NULL), "xxxx");
    CHECK_STR(str_at(json_array_get(json_object_get(o, "choices"), 0), "finish_reason", NULL), "length");
    json_decref(o);
    /* chat_template_kwargs switch thinking off: the template closes the
     * block, the answer is content, and there a stop string ends it at the
     * token that completes it */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      TCHAT(",\"chat_template_kwargs\":{\"enable_thinking\":false}"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK_STR(str_at(msg, "content", NULL), "xxxx");
    CHECK(!json_object_get(msg, "reasoning_content"));
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")), >, thinking_prompt);
    json_decref(o);
    for (int stream = 0; stream < 2; stream++) {
        CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                          stream ? TCHAT(",\"chat_template_kwargs\":{\"enable_thinking\":false},\"stop\":[\"xx\"],"
                                         "\"stream\":true,\"stream_options\":{\"include_usage\":true}")
                                 : TCHAT(",\"chat_template_kwargs\":{\"enable_thinking\":false},\"stop\":[\"xx\"]"),
                          buf, sizeof buf), ==, 200);
        json_t *last_usage = NULL;
        const char *finish = NULL;
        sb_reset(&content);
        if (stream) {
            ev = stream_objects(buf, "data: {");
            json_array_foreach(ev, i, e) {
                json_t *c = json_array_get(json_object_get(e, "choices"), 0);
                if (str_at(c, "delta", "content"))
                    sb_puts(&content, str_at(c, "delta", "content"));
                if (str_at(c, "finish_reason", NULL))
                    finish = str_at(c, "finish_reason", NULL);
                if (json_object_get(e, "usage"))
                    last_usage = json_object_get(e, "usage");
            }
        } else {
            ev = body_json(buf);
            json_t *c = json_array_get(json_object_get(ev, "choices"), 0);
            sb_puts(&content, str_at(c, "message", "content"));
            finish = str_at(c, "finish_reason", NULL);
            last_usage = json_object_get(ev, "usage");
        }
        CHECK_STR(sb_cstr(&content), "");
        CHECK_STR(finish, "stop");
        CHECK_INT(json_integer_value(json_object_get(last_usage, "completion_tokens")), ==, 2);
        json_decref(ev);
    }
    /* the stop completes on the last token max_tokens allows: still a stop */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"120\":100},\"stop\":\"xx\","
                      "\"chat_template_kwargs\":{\"enable_thinking\":false}}", buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_STR(str_at(json_array_get(json_object_get(o, "choices"), 0), "finish_reason", NULL), "stop");
    json_decref(o);
    sb_free(&reason);
    sb_free(&content);
    stop(&f);
}

#define OCHAT(extra) "{\"model\":\"tiny-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," \
    "\"options\":{\"num_predict\":6,\"temperature\":0}" extra "}"

TEST(api_server_thinking_ollama)
{
    fixture f;
    start_template(&f, NULL, 0, 2, 4, write_template(thinking_template));
    static char buf[1 << 16];
    wait_ready(&f);
    /* think not given: on, as Ollama has it for models that think */
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, OCHAT(",\"stream\":false"), buf, sizeof buf), ==, 200);
    json_t *o = body_json(buf);
    const char *thinking = str_at(o, "message", "thinking");
    CHECK(thinking && thinking[0]);
    CHECK_STR(str_at(o, "message", "content"), "");
    char *whole = strdup(thinking);
    json_int_t prompt_on = json_integer_value(json_object_get(o, "prompt_eval_count"));
    json_decref(o);
    /* streamed, think true: the same thinking in pieces */
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, OCHAT(",\"think\":true"), buf, sizeof buf), ==, 200);
    json_t *ev = stream_objects(buf, "\r\n{\"model\"");
    strbuf th = { 0 }, content = { 0 };
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (str_at(e, "message", "thinking"))
            sb_puts(&th, str_at(e, "message", "thinking"));
        sb_puts(&content, str_at(e, "message", "content"));
    }
    CHECK_STR(sb_cstr(&th), whole);
    CHECK_STR(sb_cstr(&content), "");
    json_decref(ev);
    /* think false: the template's switch is off, nothing is parsed */
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, OCHAT(",\"stream\":false,\"think\":false"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK(!json_object_get(json_object_get(o, "message"), "thinking"));
    CHECK_INT(json_integer_value(json_object_get(o, "prompt_eval_count")), >, prompt_on);
    json_decref(o);
    /* generate: "thinking" beside "response" */
    CHECK_INT(request(&f, "POST", "/api/generate", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"hi\",\"stream\":false,\"think\":true,"
                      "\"options\":{\"num_predict\":6,\"temperature\":0}}", buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_STR(str_at(o, "thinking", NULL), whole);      /* the same prompt as the chat */
    CHECK_STR(str_at(o, "response", NULL), "");
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/api/show", NULL, "{\"model\":\"tiny-Q8_0\"}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"thinking\"]"));
    free(whole);
    sb_free(&th);
    sb_free(&content);
    stop(&f);
}

/* A model whose template does not think: Ollama's think:true is refused as
 * Ollama refuses it; OpenAI's switches change nothing. */
TEST(api_server_thinking_unsupported)
{
    fixture f;
    start(&f, NULL, 0, 1, 2);
    static char buf[1 << 16];
    wait_ready(&f);
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, CHAT(",\"think\":true"), buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "does not support thinking"));
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, CHAT(",\"think\":false,\"options\":{\"num_predict\":2}"),
                      buf, sizeof buf), ==, 200);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      CHAT(",\"max_tokens\":2,\"reasoning_format\":\"auto\",\"chat_template_kwargs\":{\"x\":1}"),
                      buf, sizeof buf), ==, 200);
    CHECK(!strstr(buf, "reasoning_content"));
    stop(&f);
}

/* ---- Anthropic Messages ---- */

#define AMSG(extra) "{\"model\":\"tiny-Q8_0\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," extra "}"

/* The error's Anthropic type, checked for the shape {type: error, error: {type, message}}. */
static const char *anthropic_error_type(const char *resp)
{
    static char type[64];
    json_t *o = body_json(resp);
    CHECK_STR(str_at(o, "type", NULL), "error");
    CHECK(str_at(o, "error", "message") && str_at(o, "error", "message")[0]);
    snprintf(type, sizeof type, "%s", str_at(o, "error", "type"));
    json_decref(o);
    return type;
}

/* The events of an Anthropic stream as [{"event": NAME, "data": {...}}]:
 * each data line must follow its own event line and name the same type. */
static json_t *anthropic_events(const char *resp)
{
    json_t *all = json_array();
    const char *p = strstr(resp, "\r\n\r\n");
    CHECK(p);
    while ((p = strstr(p, "event: "))) {
        p += 7;
        const char *nl = strchr(p, '\n');
        CHECK(nl && !strncmp(nl + 1, "data: {", 7));
        json_error_t je;
        json_t *d = json_loads(nl + 7, JSON_DISABLE_EOF_CHECK, &je);
        if (!d)
            FAIL("bad event (%s) at: %.200s", je.text, nl + 7);
        CHECK(str_at(d, "type", NULL) && !strncmp(str_at(d, "type", NULL), p, (size_t)(nl - p)));
        json_array_append_new(all, json_pack("{s:s%, s:o}", "event", p, (size_t)(nl - p), "data", d));
    }
    return all;
}

/* /v1/messages answers what /v1/chat/completions answers for the same
 * conversation (greedy: the same text and token counts), in Anthropic's
 * shapes; keys by x-api-key or Bearer; errors in Anthropic's form. */
TEST(api_server_anthropic)
{
    static const char *const keys[] = { "k1" };
    fixture f;
    start(&f, keys, 1, 2, 4);
    static char buf[1 << 16];
    const char *key = "x-api-key: k1\r\n";
    wait_ready(&f);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", "Authorization: Bearer k1\r\n",
                      CHAT(",\"max_tokens\":6,\"temperature\":0"), buf, sizeof buf), ==, 200);
    json_t *o = body_json(buf);
    char *greedy = strdup(str_at(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message"), "content", NULL));
    json_int_t n_prompt = json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens"));
    json_decref(o);
    CHECK(greedy[0]);
    /* whole */
    CHECK_INT(request(&f, "POST", "/v1/messages", "x-api-key: k1\r\nanthropic-version: 2023-06-01\r\n",
                      AMSG("\"max_tokens\":6,\"temperature\":0,\"metadata\":{\"user_id\":\"u\"}"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK(!strncmp(str_at(o, "id", NULL), "msg_", 4));
    CHECK_STR(str_at(o, "type", NULL), "message");
    CHECK_STR(str_at(o, "role", NULL), "assistant");
    CHECK_STR(str_at(o, "model", NULL), "tiny-Q8_0");
    CHECK_STR(str_at(o, "stop_reason", NULL), "max_tokens");
    CHECK(json_is_null(json_object_get(o, "stop_sequence")));
    json_t *content = json_object_get(o, "content");
    CHECK_INT(json_array_size(content), ==, 1);
    CHECK_STR(str_at(json_array_get(content, 0), "type", NULL), "text");
    CHECK_STR(str_at(json_array_get(content, 0), "text", NULL), greedy);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens")), ==, n_prompt);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "output_tokens")), ==, 6);
    json_decref(o);
    /* streamed: the event sequence, the same text */
    CHECK_INT(request(&f, "POST", "/v1/messages", "Authorization: Bearer k1\r\n",
                      AMSG("\"max_tokens\":6,\"temperature\":0,\"stream\":true"), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "text/event-stream"));
    json_t *ev = anthropic_events(buf);
    size_t n = json_array_size(ev), i;
    json_t *e;
    CHECK_INT(n, >=, 7);
    static const char *const head[] = { "message_start", "ping", "content_block_start" };
    for (int k = 0; k < 3; k++)
        CHECK_STR(str_at(json_array_get(ev, (size_t)k), "event", NULL), head[k]);
    CHECK_STR(str_at(json_array_get(ev, n - 3), "event", NULL), "content_block_stop");
    CHECK_STR(str_at(json_array_get(ev, n - 2), "event", NULL), "message_delta");
    CHECK_STR(str_at(json_array_get(ev, n - 1), "event", NULL), "message_stop");
    json_t *start_msg = json_object_get(json_object_get(json_array_get(ev, 0), "data"), "message");
    CHECK_INT(json_integer_value(json_object_get(json_object_get(start_msg, "usage"), "input_tokens")), ==, n_prompt);
    CHECK_INT(json_array_size(json_object_get(start_msg, "content")), ==, 0);
    json_t *md = json_object_get(json_array_get(ev, n - 2), "data");
    CHECK_STR(str_at(md, "delta", "stop_reason"), "max_tokens");
    CHECK_INT(json_integer_value(json_object_get(json_object_get(md, "usage"), "output_tokens")), ==, 6);
    strbuf text = { 0 };
    json_array_foreach(ev, i, e) {
        json_t *d = json_object_get(e, "data");
        if (!strcmp(str_at(e, "event", NULL), "content_block_delta")) {
            CHECK_INT(json_integer_value(json_object_get(d, "index")), ==, 0);
            CHECK_STR(str_at(d, "delta", "type"), "text_delta");
            sb_puts(&text, str_at(d, "delta", "text"));
        }
    }
    CHECK_STR(sb_cstr(&text), greedy);
    json_decref(ev);
    /* a stop sequence: the text before it, and which one */
    char body[512];
    snprintf(body, sizeof body, AMSG("\"max_tokens\":6,\"temperature\":0,\"stop_sequences\":[\"\\u00ff\",\"%c\"]"),
             greedy[1]);
    char *before = strndup(greedy, (size_t)(strchr(greedy, greedy[1]) - greedy));
    CHECK(greedy[1] > ' ' && greedy[1] < 127 && greedy[1] != '"' && greedy[1] != '\\');
    CHECK_INT(request(&f, "POST", "/v1/messages", key, body, buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_STR(str_at(o, "stop_reason", NULL), "stop_sequence");
    CHECK_INT(str_at(o, "stop_sequence", NULL)[0], ==, greedy[1]);
    CHECK_STR(str_at(json_array_get(json_object_get(o, "content"), 0), "text", NULL), before);
    json_decref(o);
    /* count_tokens: the prompt of the same conversation; system text counts */
    CHECK_INT(request(&f, "POST", "/v1/messages/count_tokens", key, AMSG("\"max_tokens\":1"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_INT(json_integer_value(json_object_get(o, "input_tokens")), ==, n_prompt);
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/messages/count_tokens", key,
                      AMSG("\"system\":[{\"type\":\"text\",\"text\":\"be brief\",\"cache_control\":{\"type\":\"ephemeral\"}}]"),
                      buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_INT(json_integer_value(json_object_get(o, "input_tokens")), >, n_prompt);
    json_decref(o);
    /* errors */
    CHECK_INT(request(&f, "POST", "/v1/messages", "x-api-key: nope\r\n", AMSG("\"max_tokens\":2"), buf, sizeof buf), ==, 401);
    CHECK_STR(anthropic_error_type(buf), "authentication_error");
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, AMSG("\"max_tokens\":2"), buf, sizeof buf), ==, 401);
    CHECK_STR(anthropic_error_type(buf), "authentication_error");
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"temperature\":0"), buf, sizeof buf), ==, 400);
    CHECK_STR(anthropic_error_type(buf), "invalid_request_error");
    CHECK(strstr(buf, "max_tokens"));
    CHECK_INT(request(&f, "POST", "/v1/messages", key,
                      "{\"model\":\"tiny-Q8_0\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"\"}}]}]}",
                      buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "image blocks are not supported"));
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"max_tokens\":2,\"temperature\":1.5"), buf, sizeof buf), ==, 400);
    /* an agent's ceiling beyond the context: until the context is full */
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"max_tokens\":32000"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    json_int_t used = json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens")) +
                      json_integer_value(json_object_get(json_object_get(o, "usage"), "output_tokens"));
    if (!strcmp(str_at(o, "stop_reason", NULL), "max_tokens"))
        CHECK(used == 256 || used == 257);      /* the last token sampled takes no room */
    else                                        /* the model ended its answer first */
        CHECK(!strcmp(str_at(o, "stop_reason", NULL), "end_turn") && used < 256);
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"max_tokens\":2,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}"),
                      buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "does not support thinking"));
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"max_tokens\":2,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]"),
                      buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "web_search_20250305"));
    CHECK_INT(request(&f, "POST", "/v1/messages", key, AMSG("\"max_tokens\":2,\"tool_choice\":{\"type\":\"any\"}"),
                      buf, sizeof buf), ==, 400);
    CHECK_INT(request(&f, "POST", "/v1/messages", key,
                      "{\"model\":\"nope\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", buf, sizeof buf), ==, 404);
    CHECK_STR(anthropic_error_type(buf), "not_found_error");
    CHECK_INT(request(&f, "GET", "/v1/messages", key, NULL, buf, sizeof buf), ==, 405);
    CHECK_STR(anthropic_error_type(buf), "invalid_request_error");
    CHECK_INT(request(&f, "POST", "/v1/messages", key, "{\"model\":", buf, sizeof buf), ==, 400);
    CHECK_STR(anthropic_error_type(buf), "invalid_request_error");
    CHECK_INT(request(&f, "GET", "/metrics", key, NULL, buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "racimo_http_requests_total{endpoint=\"/v1/messages\",status=\"200\"} 4"));
    CHECK(strstr(buf, "racimo_http_requests_total{endpoint=\"/v1/messages/count_tokens\",status=\"200\"} 2"));
    free(before);
    free(greedy);
    sb_free(&text);
    stop(&f);
}

/* A template with tools (Hermes style) renders Anthropic's tools, tool_use
 * and tool_result blocks as the OpenAI conversation that means the same:
 * the same prompt tokens. */
static const char tools_template[] =
    "{%- if tools %}<tools>{%- for t in tools %}{{ t.function.name }}{{ t.function.parameters | tojson }}{% endfor %}</tools>{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}"
    "{%- if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(api_server_anthropic_tools)
{
    fixture f;
    start_template(&f, NULL, 0, 1, 4, write_template(tools_template));
    static char buf[1 << 16];
    wait_ready(&f);
#define WEATHER "{\"name\":\"wx\",\"description\":\"W\",\"%s\":{\"type\":\"object\"}}"
    char tool[256], otool[300], abody[2048], obody[2048];
    snprintf(tool, sizeof tool, WEATHER, "input_schema");
    snprintf(otool, sizeof otool, "{\"type\":\"function\",\"function\":" WEATHER "}", "parameters");
    snprintf(abody, sizeof abody,
             "{\"model\":\"tiny-Q8_0\",\"max_tokens\":3,\"temperature\":0,\"system\":\"sys\",\"tools\":[%s],"
             "\"tool_choice\":{\"type\":\"auto\"},\"messages\":["
             "{\"role\":\"user\",\"content\":\"w?\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"ask\",\"signature\":\"s\"},"
             "{\"type\":\"text\",\"text\":\"ok\"},"
             "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"wx\",\"input\":{\"city\":\"P\"}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
             "\"content\":[{\"type\":\"text\",\"text\":\"21\"}]},{\"type\":\"text\",\"text\":\"t\"}]}]}", tool);
    snprintf(obody, sizeof obody,
             "{\"model\":\"tiny-Q8_0\",\"max_tokens\":3,\"temperature\":0,\"tools\":[%s],\"messages\":["
             "{\"role\":\"system\",\"content\":\"sys\"},"
             "{\"role\":\"user\",\"content\":\"w?\"},"
             "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning_content\":\"ask\",\"tool_calls\":[{\"id\":\"toolu_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"wx\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"21\"},"
             "{\"role\":\"user\",\"content\":\"t\"}]}", otool);
    if (request(&f, "POST", "/v1/chat/completions", NULL, obody, buf, sizeof buf) != 200)
        FAIL("%s", buf);
    json_t *o = body_json(buf);
    json_int_t n_openai = json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens"));
    char *answer = strdup(str_at(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message"), "content", NULL));
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, abody, buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens")), ==, n_openai);
    CHECK_STR(str_at(json_array_get(json_object_get(o, "content"), 0), "text", NULL), answer);
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/messages/count_tokens", NULL, abody, buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_INT(json_integer_value(json_object_get(o, "input_tokens")), ==, n_openai);
    json_decref(o);
    /* tool_choice none: the tools are not rendered */
    char *none = strstr(abody, "\"auto\"");
    memcpy(none, "\"none\"", 6);
    CHECK_INT(request(&f, "POST", "/v1/messages/count_tokens", NULL, abody, buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_INT(json_integer_value(json_object_get(o, "input_tokens")), <, n_openai);
    json_decref(o);
    /* blocks in the wrong turn, a tool_choice naming no tool */
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\",\"input\":{}}]}]}", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "tool_use blocks belong in assistant messages"));
    snprintf(abody, sizeof abody, "{\"model\":\"tiny-Q8_0\",\"max_tokens\":2,\"tools\":[%s],\"tool_choice\":"
             "{\"type\":\"tool\",\"name\":\"other\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", tool);
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, abody, buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "not in 'tools'"));
    /* tool_choice any: the call is forced (the template writes Hermes'
     * <tool_call>); whole and streamed, the same tool_use blocks */
#define FORCED_TOOL "{\"model\":\"tiny-Q8_0\",\"max_tokens\":180,\"temperature\":0,\"tools\":[{\"name\":\"f\"," \
    "\"input_schema\":{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"P\",\"L\"]}},\"required\":[\"c\"]," \
    "\"additionalProperties\":false}}],\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"w\"}]"
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, FORCED_TOOL "}", buf, sizeof buf), ==, 200);
    o = body_json(buf);
    CHECK_STR(str_at(o, "stop_reason", NULL), "tool_use");
    json_t *content = json_object_get(o, "content"), *b;
    size_t i, n_uses = 0;
    json_array_foreach(content, i, b) {
        if (strcmp(str_at(b, "type", NULL), "tool_use"))
            continue;
        n_uses++;
        CHECK(!strncmp(str_at(b, "id", NULL), "toolu_", 6));
        CHECK_STR(str_at(b, "name", NULL), "f");
        const char *c = str_at(json_object_get(b, "input"), "c", NULL);
        CHECK(c && (!strcmp(c, "P") || !strcmp(c, "L")));
        json_object_del(b, "id");                   /* each message has its own */
    }
    CHECK_INT(n_uses, >=, 1);
    char *whole = json_dumps(content, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, FORCED_TOOL ",\"stream\":true}", buf, sizeof buf), ==, 200);
    json_t *ev = anthropic_events(buf), *e;
    /* the blocks rebuilt from the events: starts, text and input_json deltas */
    json_t *blocks = json_array();
    strbuf args = { 0 };
    json_array_foreach(ev, i, e) {
        json_t *d = json_object_get(e, "data");
        const char *name = str_at(e, "event", NULL);
        if (!strcmp(name, "content_block_start")) {
            CHECK_INT(json_integer_value(json_object_get(d, "index")), ==, json_array_size(blocks));
            json_array_append(blocks, json_object_get(d, "content_block"));
            sb_reset(&args);
        } else if (!strcmp(name, "content_block_delta")) {
            json_t *blk = json_array_get(blocks, json_array_size(blocks) - 1);
            if (!strcmp(str_at(d, "delta", "type"), "input_json_delta")) {
                sb_puts(&args, str_at(d, "delta", "partial_json"));
            } else {
                CHECK_STR(str_at(d, "delta", "type"), "text_delta");
                json_t *t = json_sprintf("%s%s", str_at(blk, "text", NULL), str_at(d, "delta", "text"));
                json_object_set_new(blk, "text", t);
            }
        } else if (!strcmp(name, "content_block_stop")) {
            json_t *blk = json_array_get(blocks, json_array_size(blocks) - 1);
            if (!strcmp(str_at(blk, "type", NULL), "tool_use")) {
                CHECK(!strncmp(str_at(blk, "id", NULL), "toolu_", 6));
                json_object_del(blk, "id");
                json_object_set_new(blk, "input", json_loads(sb_cstr(&args), 0, NULL));
            }
        } else if (!strcmp(name, "message_delta")) {
            CHECK_STR(str_at(d, "delta", "stop_reason"), "tool_use");
        }
    }
    char *streamed = json_dumps(blocks, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK_STR(streamed, whole);
    free(streamed);
    free(whole);
    sb_free(&args);
    json_decref(blocks);
    json_decref(ev);
    free(answer);
    stop(&f);
}

/* Anthropic's thinking and OpenAI's reasoning_effort switch the template's
 * thinking; the answer's thinking is a thinking block, never text. */
TEST(api_server_anthropic_thinking)
{
    fixture f;
    start_template(&f, NULL, 0, 2, 4, write_template(thinking_template));
    static char buf[1 << 16];
    wait_ready(&f);
    /* not given: the template's default (the block is open), all thinking */
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL, AMSG("\"max_tokens\":4,\"temperature\":0"), buf, sizeof buf), ==, 200);
    json_t *o = body_json(buf);
    json_t *content = json_object_get(o, "content");
    CHECK_INT(json_array_size(content), ==, 2);
    CHECK_STR(str_at(json_array_get(content, 0), "type", NULL), "thinking");
    const char *thought = str_at(json_array_get(content, 0), "thinking", NULL);
    CHECK(thought && thought[0]);
    char *whole = strdup(thought);
    CHECK_STR(str_at(json_array_get(content, 0), "signature", NULL), "");
    CHECK_STR(str_at(json_array_get(content, 1), "type", NULL), "text");
    CHECK_STR(str_at(json_array_get(content, 1), "text", NULL), "");
    json_int_t prompt_on = json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens"));
    json_decref(o);
    /* streamed with thinking enabled: thinking_delta events, then an empty text block */
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL,
                      AMSG("\"max_tokens\":4,\"temperature\":0,\"stream\":true,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}"),
                      buf, sizeof buf), ==, 200);
    json_t *ev = anthropic_events(buf);
    strbuf th = { 0 };
    size_t i;
    json_t *e;
    int starts = 0;
    json_array_foreach(ev, i, e) {
        json_t *d = json_object_get(e, "data");
        if (!strcmp(str_at(e, "event", NULL), "content_block_start")) {
            CHECK_INT(json_integer_value(json_object_get(d, "index")), ==, starts);
            CHECK_STR(str_at(d, "content_block", "type"), starts ? "text" : "thinking");
            starts++;
        }
        if (!strcmp(str_at(e, "event", NULL), "content_block_delta")) {
            CHECK_STR(str_at(d, "delta", "type"), "thinking_delta");
            sb_puts(&th, str_at(d, "delta", "thinking"));
        }
    }
    CHECK_INT(starts, ==, 2);
    CHECK_STR(sb_cstr(&th), whole);
    json_decref(ev);
    /* disabled: the template's switch closes the block; an earlier turn's
     * thinking block goes back to the template */
    CHECK_INT(request(&f, "POST", "/v1/messages", NULL,
                      AMSG("\"max_tokens\":4,\"temperature\":0,\"thinking\":{\"type\":\"disabled\"}"), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    content = json_object_get(o, "content");
    CHECK_INT(json_array_size(content), ==, 1);
    CHECK_STR(str_at(json_array_get(content, 0), "type", NULL), "text");
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens")), >, prompt_on);
    json_decref(o);
    /* OpenAI's reasoning_effort: none switches it off, high on */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      CHAT(",\"max_tokens\":4,\"temperature\":0,\"reasoning_effort\":\"none\""), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(!json_object_get(msg, "reasoning_content"));
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")), >, prompt_on);
    json_decref(o);
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      CHAT(",\"max_tokens\":4,\"temperature\":0,\"reasoning_effort\":\"high\""), buf, sizeof buf), ==, 200);
    o = body_json(buf);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK_STR(str_at(msg, "reasoning_content", NULL), whole);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")), ==, prompt_on);
    json_decref(o);
    /* chat_template_kwargs win over reasoning_effort */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      CHAT(",\"max_tokens\":4,\"temperature\":0,\"reasoning_effort\":\"high\","
                           "\"chat_template_kwargs\":{\"enable_thinking\":false}"), buf, sizeof buf), ==, 200);
    CHECK(!strstr(buf, "reasoning_content"));
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"reasoning_effort\":\"max\""), buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "reasoning_effort"));
    free(whole);
    sb_free(&th);
    stop(&f);
}

/* `grammar` (llama.cpp's field) on every generating endpoint: the text
 * matches it and ends where it must; a grammar that does not compile is a
 * 400 that says where. */
#define YESNO "\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") \\\"!\\\"\""
TEST(api_server_grammar)
{
    fixture f;
    start(&f, NULL, 0, 2, 4);
    static char buf[1 << 16];
    wait_ready(&f);
    for (int temp = 0; temp < 2; temp++) {
        char body[512];
        snprintf(body, sizeof body, CHAT(",\"max_tokens\":20,\"temperature\":%d,\"seed\":3," YESNO), temp);
        CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, body, buf, sizeof buf), ==, 200);
        json_t *o = body_json(buf);
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        const char *content = str_at(json_object_get(ch, "message"), "content", NULL);
        CHECK(content);
        if (strcmp(content, "yes!") && strcmp(content, "no!"))
            FAIL("content '%s'", content);
        CHECK_STR(str_at(ch, "finish_reason", NULL), "stop");
        json_decref(o);
    }
    CHECK_INT(request(&f, "POST", "/v1/completions", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"max_tokens\":20," YESNO "}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"text\":\"yes!\"") || strstr(buf, "\"text\":\"no!\""));
    CHECK_INT(request(&f, "POST", "/api/generate", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"stream\":false," YESNO "}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"response\":\"yes!\"") || strstr(buf, "\"response\":\"no!\""));
    CHECK_INT(request(&f, "POST", "/api/chat", NULL, CHAT(",\"stream\":false," YESNO), buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"content\":\"yes!\"") || strstr(buf, "\"content\":\"no!\""));
    /* errors */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL,
                      CHAT(",\"grammar\":\"root ::= \\\"a\\\"\\nitem ::= [a-\""), buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "\"param\":\"grammar\""));
    CHECK(strstr(buf, "line 2"));
    CHECK_INT(request(&f, "POST", "/api/generate", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"grammar\":\"root ::= other\"}", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "other"));
    CHECK_INT(request(&f, "POST", "/v1/completions", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"grammar\":7}", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "'grammar' must be a string"));
    /* the server goes on serving */
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, CHAT(",\"max_tokens\":2"), buf, sizeof buf), ==, 200);
    stop(&f);
}

/* ---- HTTPS ---- */

/* curl against the fixture over HTTPS (trusting `ca`, NULL: the system's
 * authorities only): the status, or 0 when curl failed (a TLS error);
 * the body in out. */
static int curl_tls(fixture *f, const char *ca, const char *host, const char *args,
                    const char *path, char *out, size_t cap)
{
    char cmd[4096], file[600];
    snprintf(file, sizeof file, "%s/curl.out", test_tmpdir());
    snprintf(cmd, sizeof cmd, "curl -s -N -m 60 %s%s -o %s -w '%%{http_code}' %s "
             "https://%s:%d%s", ca ? "--cacert " : "", ca ? ca : "", file, args, host,
             api_server_port(f->s), path);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    int status = 0;
    if (fscanf(p, "%d", &status) != 1)
        status = 0;
    pclose(p);
    FILE *b = fopen(file, "r");
    size_t n = b ? fread(out, 1, cap - 1, b) : 0;
    out[n] = '\0';
    if (b)
        fclose(b);
    return status;
}

TEST_T(api_server_tls, 120)
{
    if (system("command -v openssl >/dev/null && command -v curl >/dev/null") != 0)
        SKIP("needs the openssl and curl commands");
    char cert[600], key[600], other[600], cmd[4096];
    snprintf(cert, sizeof cert, "%s/cert.pem", test_tmpdir());
    snprintf(key, sizeof key, "%s/key.pem", test_tmpdir());
    snprintf(other, sizeof other, "%s/other.pem", test_tmpdir());
    snprintf(cmd, sizeof cmd, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
             "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null && "
             "openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:P-256 -out %s "
             "2>/dev/null", key, cert, other);
    CHECK(system(cmd) == 0);

    /* files that cannot serve fail at start, naming the file */
    api_config cfg;
    api_server *s = NULL;
    api_config_default(&cfg);
    cfg.port = 0;
    cfg.models_dir = test_tmpdir();
    cfg.ro_dirs = "";
    cfg.tls_cert = cert;
    cfg.tls_key = other;
    CHECK(api_server_new(&cfg, &s) != 0 && !s);
    CHECK(strstr(rc_errmsg(), other) && strstr(rc_errmsg(), "not the private key"));
    cfg.tls_key = "/nonexistent/key.pem";
    CHECK(api_server_new(&cfg, &s) != 0);
    CHECK(strstr(rc_errmsg(), "--tls-key /nonexistent/key.pem"));
    cfg.tls_cert = key;
    cfg.tls_key = key;
    CHECK(api_server_new(&cfg, &s) != 0);
    CHECK(strstr(rc_errmsg(), "--tls-cert") && strstr(rc_errmsg(), key));
    cfg.tls_cert = cert;
    cfg.tls_key = NULL;
    CHECK(api_server_new(&cfg, &s) != 0);
    CHECK(strstr(rc_errmsg(), "both"));

    static const char *keys[] = { "k1" };
    static char buf[1 << 16];
    fixture f;
    t_tls_cert = cert;
    t_tls_key = key;
    start(&f, keys, 1, 1, 2);
    t_tls_cert = t_tls_key = NULL;
    int st = 0;
    for (int i = 0; i < 500 && (st = curl_tls(&f, cert, "127.0.0.1", "", "/health", buf,
                                              sizeof buf)) != 200; i++)
        usleep(10000);
    CHECK_INT(st, ==, 200);
    CHECK_INT(curl_tls(&f, cert, "localhost", "", "/v1/models", buf, sizeof buf), ==, 401);
    CHECK_INT(curl_tls(&f, cert, "localhost", "-H 'Authorization: Bearer k1'", "/v1/models", buf,
                       sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"id\":\"tiny-Q8_0\""));
    /* a stream, through the TLS layer */
    CHECK_INT(curl_tls(&f, cert, "127.0.0.1", "-H 'Authorization: Bearer k1' -d '"
                       CHAT(",\"max_tokens\":4,\"stream\":true") "'", "/v1/chat/completions",
                       buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "chat.completion.chunk") && strstr(buf, "data: [DONE]"));
    /* a client that does not trust the certificate gets no answer */
    CHECK_INT(curl_tls(&f, NULL, "127.0.0.1", "", "/health", buf, sizeof buf), ==, 0);
    /* nor does one speaking plain HTTP to the HTTPS port */
    int fd = connect_to(&f, "GET", "/health", NULL, NULL);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    CHECK(!strstr(buf, "HTTP/1.1 200"));
    /* the CLI's clients speak HTTPS, trusting what SSL_CERT_FILE names */
    const char *bin = getenv("RACIMO_BIN");
    if (bin) {
        snprintf(cmd, sizeof cmd, "SSL_CERT_FILE=%s RACIMO_API_KEY=k1 %s nodes --host "
                 "https://127.0.0.1 --port %d", cert, bin, api_server_port(f.s));
        test_run(cmd, buf, sizeof buf);
        CHECK(strstr(buf, "runs without a cluster"));
        snprintf(cmd, sizeof cmd, "RACIMO_API_KEY=k1 %s nodes --host https://127.0.0.1 --port %d",
                 bin, api_server_port(f.s));
        CHECK(test_run(cmd, buf, sizeof buf) != 0);
        CHECK(strstr(buf, "certificate verify failed"));
    }
    stop(&f);
}

/* ---- embeddings ---- */

#define EMB "tiny-qwen3-embed-F32"

/* The vectors of an answer: OpenAI's data[].embedding (floats, or base64
 * decoded), Ollama's embeddings[] or its older embedding. */
static int b64_value(char c)
{
    const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(t, c);
    return c && p ? (int)(p - t) : -1;
}

static int vectors(const char *resp, float out[][256], int max, int *dims)
{
    json_t *o = body_json(resp), *list = json_object_get(o, "data"), *x;
    if (!list)
        list = json_object_get(o, "embeddings");
    if (!list) {
        list = json_array();
        json_array_append(list, json_object_get(o, "embedding"));
        json_object_set_new(o, "wrapped", list);
    }
    size_t i;
    int n = 0;
    json_array_foreach(list, i, x) {
        CHECK(n < max);
        json_t *v = json_is_object(x) ? json_object_get(x, "embedding") : x;
        if (json_is_object(x))
            CHECK_INT(json_integer_value(json_object_get(x, "index")), ==, (long long)i);
        if (json_is_string(v)) {               /* base64 of little-endian float32 */
            const char *s = json_string_value(v);
            uint8_t bytes[1024];
            size_t nb = 0, len = strlen(s);
            for (size_t k = 0; k + 3 < len + 3 && k < len; k += 4) {
                int a = b64_value(s[k]), b = b64_value(s[k + 1]), c = b64_value(s[k + 2]),
                    d = b64_value(s[k + 3]);
                CHECK(a >= 0 && b >= 0);
                bytes[nb++] = (uint8_t)(a << 2 | b >> 4);
                if (c >= 0)
                    bytes[nb++] = (uint8_t)(b << 4 | c >> 2);
                if (d >= 0)
                    bytes[nb++] = (uint8_t)(c << 6 | d);
            }
            *dims = (int)(nb / 4);
            for (int k = 0; k < *dims; k++) {
                uint32_t u = bytes[4 * k] | bytes[4 * k + 1] << 8 | bytes[4 * k + 2] << 16 |
                             (uint32_t)bytes[4 * k + 3] << 24;
                memcpy(&out[n][k], &u, 4);
            }
        } else {
            *dims = (int)json_array_size(v);
            CHECK(*dims <= 256);
            for (int k = 0; k < *dims; k++)
                out[n][k] = (float)json_number_value(json_array_get(v, (size_t)k));
        }
        n++;
    }
    json_decref(o);
    return n;
}

static double norm(const float *v, int n)
{
    double ss = 0;
    for (int k = 0; k < n; k++)
        ss += (double)v[k] * v[k];
    return sqrt(ss);
}

/* POSTs body to path, expects 200, and reads the answer's vectors. */
static int post_vectors(fixture *f, const char *path, const char *body, char *buf, size_t cap,
                        float out[][256], int max, int *dims)
{
    int st = request(f, "POST", path, NULL, body, buf, cap);
    if (st != 200)
        FAIL("%s %s: %d %s", path, body, st, buf);
    return vectors(buf, out, max, dims);
}

static void same_vector(const float *x, const float *y, int n)
{
    for (int k = 0; k < n; k++)
        CHECK_NEAR(x[k], y[k], 1e-6);
}

TEST_T(api_server_embeddings, 120)
{
    test_make_model("tiny-qwen3-embed", TT_F32, NULL);   /* found in the models folder */
    fixture f;
    start(&f, NULL, 0, 2, 4);
    static char buf[1 << 17];
    static float a[4][256], b[4][256];
    int d = 0, d2 = 0;
    wait_ready(&f);
    /* two inputs at once, as each alone */
    CHECK_INT(request(&f, "POST", "/v1/embeddings", NULL, "{\"model\":\"" EMB "\",\"input\":"
                      "[\"the cat sat\",\"hello there, world\"]}", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"object\":\"list\"") && strstr(buf, "\"object\":\"embedding\""));
    CHECK(strstr(buf, "\"model\":\"" EMB "\""));
    CHECK(strstr(buf, "\"prompt_tokens\":") && strstr(buf, "\"total_tokens\":"));
    CHECK_INT(vectors(buf, a, 4, &d), ==, 2);
    CHECK_INT(d, ==, 256);
    CHECK_NEAR(norm(a[0], d), 1.0, 1e-5);
    CHECK(fabs(a[0][0] - a[1][0]) > 1e-6);
    CHECK_INT(post_vectors(&f, "/v1/embeddings", "{\"model\":\"" EMB "\",\"input\":"
                           "\"hello there, world\"}", buf, sizeof buf, b, 4, &d2),
              ==, 1);
    same_vector(b[0], a[1], d);
    /* dimensions: the first n, normalised again; base64 the same floats */
    CHECK_INT(request(&f, "POST", "/v1/embeddings", NULL, "{\"model\":\"" EMB "\",\"input\":"
                      "\"hello there, world\",\"dimensions\":8,\"encoding_format\":\"base64\"}",
                      buf, sizeof buf), ==, 200);
    CHECK_INT(vectors(buf, b, 4, &d2), ==, 1);
    CHECK_INT(d2, ==, 8);
    CHECK_NEAR(norm(b[0], 8), 1.0, 1e-5);
    double n8 = norm(a[1], 8);
    for (int k = 0; k < 8; k++)
        CHECK_NEAR(b[0][k], a[1][k] / n8, 1e-6);
    /* token ids: one list, and a list of lists */
    CHECK_INT(post_vectors(&f, "/v1/embeddings", "{\"model\":\"" EMB "\",\"input\":"
                           "[[5,6,7],[8]]}", buf, sizeof buf, a, 4, &d),
              ==, 2);
    CHECK(strstr(buf, "\"prompt_tokens\":4"));
    CHECK_INT(post_vectors(&f, "/v1/embeddings", "{\"model\":\"" EMB "\",\"input\":"
                           "[8]}", buf, sizeof buf, b, 4, &d),
              ==, 1);
    same_vector(b[0], a[1], d);
    /* Ollama: the same vectors; the older endpoint too */
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, "{\"model\":\"" EMB "\",\"input\":"
                      "[\"the cat sat\"],\"keep_alive\":\"5m\",\"options\":{}}", buf, sizeof buf),
              ==, 200);
    CHECK(strstr(buf, "\"total_duration\":") && strstr(buf, "\"load_duration\":") &&
          strstr(buf, "\"prompt_eval_count\":"));
    CHECK_INT(vectors(buf, a, 4, &d), ==, 1);
    CHECK_INT(post_vectors(&f, "/api/embeddings", "{\"model\":\"" EMB "\",\"prompt\":"
                           "\"the cat sat\"}", buf, sizeof buf, b, 4, &d2),
              ==, 1);
    CHECK_INT(d2, ==, 256);
    same_vector(b[0], a[0], d);
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, "{\"model\":\"" EMB "\"}", buf, sizeof buf),
              ==, 200);
    CHECK(strstr(buf, "\"embeddings\":[]"));
    /* longer than the context (256): Ollama cuts it unless truncate is false;
     * OpenAI refuses it */
    static char longb[4096];
    snprintf(longb, sizeof longb, "{\"model\":\"" EMB "\",\"input\":\"");
    for (int i = 0; i < 300; i++)
        strcat(longb, "q ");
    char *tail = longb + strlen(longb);
    strcpy(tail, "\"}");
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, longb, buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"prompt_eval_count\":256"));
    CHECK_INT(request(&f, "POST", "/v1/embeddings", NULL, longb, buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "the context holds 256"));
    strcpy(tail, "\",\"truncate\":false}");
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, longb, buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "truncate"));
    /* the wrong kind of model, either way */
    CHECK_INT(request(&f, "POST", "/v1/embeddings", NULL,
                      "{\"model\":\"tiny-Q8_0\",\"input\":\"x\"}", buf, sizeof buf), ==, 400);
    CHECK(strstr(buf, "makes no embeddings"));
    CHECK_INT(request(&f, "POST", "/v1/chat/completions", NULL, "{\"model\":\"" EMB "\","
                      "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", buf, sizeof buf),
              ==, 400);
    CHECK(strstr(buf, "is an embedding model"));
    /* malformed requests name the field */
    static const char *const bad[][2] = {
        { "{\"model\":\"" EMB "\"}", "'input' is required" },
        { "{\"model\":\"" EMB "\",\"input\":[]}", "empty list" },
        { "{\"model\":\"" EMB "\",\"input\":\"\"}", "empty string" },
        { "{\"model\":\"" EMB "\",\"input\":[1,\"a\"]}", "not a token id" },
        { "{\"model\":\"" EMB "\",\"input\":[[1],{}]}", "input 1 is not" },
        { "{\"model\":\"" EMB "\",\"input\":[99999]}", "the vocabulary has" },
        { "{\"model\":\"" EMB "\",\"input\":\"x\",\"dimensions\":0}", "'dimensions'" },
        { "{\"model\":\"" EMB "\",\"input\":\"x\",\"dimensions\":257}", "vectors of 256" },
        { "{\"model\":\"" EMB "\",\"input\":\"x\",\"encoding_format\":\"hex\"}", "encoding_format" },
        { "{\"input\":\"x\"}", "'model' is required" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = request(&f, "POST", "/v1/embeddings", NULL, bad[i][0], buf, sizeof buf);
        if (st != 400 || !strstr(buf, bad[i][1]))
            FAIL("%s: %d %s", bad[i][0], st, buf);
    }
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, "{\"model\":\"" EMB "\",\"input\":[[1]]}",
                      buf, sizeof buf), ==, 400);
    CHECK_INT(request(&f, "POST", "/api/embed", NULL, "{\"model\":\"" EMB "\",\"input\":\"x\","
                      "\"truncate\":1}", buf, sizeof buf), ==, 400);
    CHECK_INT(request(&f, "POST", "/api/show", NULL, "{\"model\":\"" EMB "\"}", buf, sizeof buf),
              ==, 200);
    CHECK(strstr(buf, "\"capabilities\":[\"embedding\"]"));
    wait_idle(&f);
    stop(&f);
}

/* More inputs than the engine takes at once (2 slots, a window of 4 in
 * the engine, a queue of 1): they go in as earlier ones end, in order. */
TEST_T(api_server_embeddings_many_inputs, 120)
{
    test_make_model("tiny-qwen3-embed", TT_F32, NULL);
    fixture f;
    start(&f, NULL, 0, 2, 1);
    static char buf[1 << 20], body[4096];
    static float all[24][256], one[4][256];
    int d = 0;
    wait_ready(&f);
    strcpy(body, "{\"model\":\"" EMB "\",\"input\":[");
    for (int i = 0; i < 24; i++)
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s\"input number %d\"",
                 i ? "," : "", i * 7);
    strcat(body, "]}");
    CHECK_INT(post_vectors(&f, "/v1/embeddings", body, buf, sizeof buf, all, 24,
                           &d), ==, 24);
    for (int i = 0; i < 24; i += 7) {
        snprintf(body, sizeof body, "{\"model\":\"" EMB "\",\"input\":\"input number %d\"}", i * 7);
        CHECK_INT(request(&f, "POST", "/v1/embeddings", NULL, body, buf, sizeof buf), ==, 200);
        CHECK_INT(vectors(buf, one, 4, &d), ==, 1);
        same_vector(one[0], all[i], d);
    }
    wait_idle(&f);
    stop(&f);
}
