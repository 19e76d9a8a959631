/* test_dashboard.c - the web dashboard's files as every node serves them:
 * the page at /, its files under /ui/, content types, 404 and 405, ETag and
 * 304, no key needed for them while every data endpoint still wants one;
 * and POST /v1/instances' placement options and plan preview refusals. */
#include "test.h"
#include "http_util.h"
#include "model_util.h"
#include "api/api.h"
#include "api/web_assets.h"
#include "base/err.h"
#include "tensor/types.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    api_server *s;
    pthread_t thread;
} fixture;

static void *serve(void *arg)
{
    api_server_run(arg);
    return NULL;
}

static void start(fixture *f, bool with_model)
{
    static const char *keys[] = { "dash-key" };
    static const char *paths[1];
    paths[0] = with_model ? test_make_model("tiny", TT_Q8_0, NULL) : NULL;
    static api_config cfg;
    api_config_default(&cfg);
    cfg.port = 0;
    cfg.model_paths = paths;
    cfg.n_model_paths = with_model ? 1 : 0;
    cfg.models_dir = test_tmpdir();
    cfg.ro_dirs = "";
    cfg.threads = 1;
    cfg.ctx_size = 256;
    cfg.api_keys = keys;
    cfg.n_api_keys = 1;
    CHECK_OK(api_server_new(&cfg, &f->s));
    CHECK(pthread_create(&f->thread, NULL, serve, f->s) == 0);
}

static void stop(fixture *f)
{
    api_server_stop(f->s);
    pthread_join(f->thread, NULL);
    api_server_free(f->s);
}

static int get(fixture *f, const char *path, const char *headers, char *out, size_t cap)
{
    return http_request(api_server_port(f->s), "GET", path, headers, NULL, out, cap);
}

/* The value of header `name` in a raw response, into out ("" when absent). */
static void header(const char *resp, const char *name, char *out, size_t cap)
{
    out[0] = 0;
    size_t nl = strlen(name);
    for (const char *p = strstr(resp, "\r\n"); p && p[2] != '\r'; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, name, nl) && p[2 + nl] == ':') {
            const char *v = p + 3 + nl;
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)strcspn(v, "\r"), v);
            return;
        }
}

TEST(dashboard_assets)
{
    CHECK(web_n_assets >= 3);
    fixture f;
    start(&f, false);
    static char buf[1 << 18];
    char v[256];
    /* the page without a key: text/html, the built-in bytes */
    CHECK_INT(get(&f, "/", NULL, buf, sizeof buf), ==, 200);
    header(buf, "Content-Type", v, sizeof v);
    CHECK_STR(v, "text/html; charset=utf-8");
    CHECK(strstr(buf, "<!doctype html>") && strstr(buf, "/ui/app.js"));
    header(buf, "Content-Security-Policy", v, sizeof v);
    CHECK(strstr(v, "default-src 'self'"));
    static const struct { const char *path, *type; } files[] = {
        { "/ui/index.html", "text/html; charset=utf-8" },
        { "/ui/app.css", "text/css; charset=utf-8" },
        { "/ui/app.js", "text/javascript; charset=utf-8" },
        { "/ui/app.js/", "text/javascript; charset=utf-8" },     /* a trailing slash is dropped */
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (get(&f, files[i].path, NULL, buf, sizeof buf) != 200)
            FAIL("GET %s: %.300s", files[i].path, buf);
        header(buf, "Content-Type", v, sizeof v);
        CHECK_STR(v, files[i].type);
        header(buf, "Cache-Control", v, sizeof v);
        CHECK_STR(v, "no-cache");
    }
    /* each body is the file's bytes, as long as the build saw it */
    for (int i = 0; i < web_n_assets; i++) {
        char path[300];
        snprintf(path, sizeof path, "/ui/%s", web_assets[i].name);
        CHECK_INT(get(&f, path, NULL, buf, sizeof buf), ==, 200);
        header(buf, "Content-Length", v, sizeof v);
        CHECK_INT(atol(v), ==, (long)web_assets[i].len);
        const char *body = strstr(buf, "\r\n\r\n");
        CHECK(body && !memcmp(body + 4, web_assets[i].data, web_assets[i].len));
    }
    /* unknown files: 404 in the API's error shape; other methods: 405 */
    CHECK_INT(get(&f, "/ui/nothing.js", NULL, buf, sizeof buf), ==, 404);
    CHECK(strstr(buf, "\"code\":\"not_found\""));
    CHECK_INT(get(&f, "/ui/", NULL, buf, sizeof buf), ==, 404);
    CHECK_INT(get(&f, "/ui/../server.c", NULL, buf, sizeof buf), ==, 404);
    CHECK_INT(http_request(api_server_port(f.s), "POST", "/ui/app.js", NULL, "x", buf, sizeof buf),
              ==, 405);
    CHECK(strstr(buf, "method_not_allowed"));
    stop(&f);
}

TEST(dashboard_etag)
{
    fixture f;
    start(&f, false);
    static char buf[1 << 18];
    char tag[64], v[64], hdr[256];
    CHECK_INT(get(&f, "/ui/app.css", NULL, buf, sizeof buf), ==, 200);
    header(buf, "ETag", tag, sizeof tag);
    CHECK_INT(strlen(tag), ==, 18);                  /* "16 hex digits" */
    CHECK(tag[0] == '"' && tag[17] == '"');
    /* the same tag: 304 without a body; in a list, weak, or "*" too */
    const char *matching[] = { "%s", "\"x\", %s", "W/%s", "*" };
    for (size_t i = 0; i < sizeof matching / sizeof matching[0]; i++) {
        char val[128];
        snprintf(val, sizeof val, matching[i], tag);
        snprintf(hdr, sizeof hdr, "If-None-Match: %s\r\n", val);
        if (get(&f, "/ui/app.css", hdr, buf, sizeof buf) != 304)
            FAIL("If-None-Match: %s: %.200s", val, buf);
        CHECK(!strstr(buf, ":root"));
        header(buf, "ETag", v, sizeof v);
        CHECK_STR(v, tag);
    }
    /* another tag (an older build): the whole file */
    CHECK_INT(get(&f, "/ui/app.css", "If-None-Match: \"0000000000000000\"\r\n", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, ":root"));
    /* files differ, and so do their tags */
    CHECK_INT(get(&f, "/ui/app.js", NULL, buf, sizeof buf), ==, 200);
    header(buf, "ETag", v, sizeof v);
    CHECK(strcmp(v, tag));
    stop(&f);
}

TEST(dashboard_key)
{
    fixture f;
    start(&f, true);
    static char buf[1 << 18];
    /* the page loads without the key; data does not */
    CHECK_INT(get(&f, "/", NULL, buf, sizeof buf), ==, 200);
    CHECK_INT(get(&f, "/ui/app.js", "Authorization: Bearer wrong\r\n", buf, sizeof buf), ==, 200);
    CHECK_INT(get(&f, "/v1/cluster", NULL, buf, sizeof buf), ==, 401);
    CHECK(strstr(buf, "invalid_api_key") && strstr(buf, "WWW-Authenticate: Bearer"));
    CHECK_INT(get(&f, "/v1/cluster", "Authorization: Bearer wrong\r\n", buf, sizeof buf), ==, 401);
    int port = api_server_port(f.s);
    CHECK_INT(http_request(port, "POST", "/v1/instances", NULL, "{\"model\":\"tiny-Q8_0\"}", buf,
                           sizeof buf), ==, 401);
    CHECK_INT(get(&f, "/v1/cluster", "Authorization: Bearer dash-key\r\n", buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "\"cost\":{"));
    /* the start form's options, checked; a preview needs a cluster */
    const char *auth = "Authorization: Bearer dash-key\r\n";
    static const struct { const char *body, *want; int status; } cases[] = {
        { "{\"model\":\"tiny-Q8_0\",\"split\":\"diagonal\"}", "\"param\":\"split\"", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"min_nodes\":0}", "\"param\":\"min_nodes\"", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"min_nodes\":17}", "\"param\":\"min_nodes\"", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"min_nodes\":\"2\"}", "\"param\":\"min_nodes\"", 400 },
        { "[1]", "must be a JSON object", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"nodes\":\"a\"}", "\"param\":\"nodes\"", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"nodes\":[\"a\",7]}", "nodes[1] is not", 400 },
        { "{\"model\":\"tiny-Q8_0\",\"nodes\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
          "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}", "at most 16", 400 },
        { "{\"model\":\"none\",\"dry_run\":true}", "model_not_found", 404 },
        { "{\"model\":\"tiny-Q8_0\",\"dry_run\":true,\"split\":\"layers\"}", "without a cluster", 409 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = http_request(port, "POST", "/v1/instances", auth, cases[i].body, buf, sizeof buf);
        if (st != cases[i].status || !strstr(buf, cases[i].want))
            FAIL("%s: %d, want %d with %s: %.300s", cases[i].body, st, cases[i].status,
                 cases[i].want, buf);
    }
    /* a valid start still works with the options */
    int st = http_request(port, "POST", "/v1/instances", auth,
                          "{\"model\":\"tiny-Q8_0\",\"split\":\"auto\",\"min_nodes\":1}", buf, sizeof buf);
    CHECK(st == 200 || st == 202);
    stop(&f);
}
