/* dashboard.c - the web dashboard's files (web/, built into the binary as
 * web_assets.h describes), served by every node:
 *
 *   GET /            the page (index.html)
 *   GET /ui/NAME     its other files (styles, script)
 *
 * They are the only paths open without an API key: the page holds no data,
 * and every call it makes for data (/v1/cluster, /v1/instances, chat) sends
 * the key the user typed into its login prompt, so a node with --api-key
 * shows a visitor the prompt and nothing else.  Each file carries an ETag
 * (its hash, from the build) and "Cache-Control: no-cache": a browser asks
 * again each time and gets 304 without the body until a new build changes
 * the file.
 */
#include "server_internal.h"
#include "web_assets.h"

#include <string.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

bool dashboard_path(const char *path)
{
    return !strcmp(path, "/") || !strcmp(path, "/ui") || !strncmp(path, "/ui/", 4);
}

static const web_asset *find(const char *path)
{
    const char *name = !strcmp(path, "/") ? "index.html"
                       : !strncmp(path, "/ui/", 4) ? path + 4 : NULL;
    for (int i = 0; name && i < web_n_assets; i++)
        if (!strcmp(web_assets[i].name, name))
            return &web_assets[i];
    return NULL;
}

/* Whether an If-None-Match header names this tag ("*", or one of a
 * comma-separated list; weak tags compare equal, as RFC 9110 13.1.2 says
 * for this header). */
static bool tag_matches(const char *header, const char *etag)
{
    size_t tl = strlen(etag);
    const char *p = header;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ')
            n--;
        if (n == tl && !strncmp(p, etag, tl))
            return true;
        p += strcspn(p, ",");
    }
    return false;
}

int dashboard_serve(api_server *s, struct evhttp_request *req, const char *path, int method)
{
    api_error e;
    const web_asset *a = find(path);
    if (!a) {
        api_fail(&e, 404, "not_found", NULL, "no dashboard file %.200s", path);
        http_reply_error(s, req, false, &e);
        return 404;
    }
    if (method != EVHTTP_REQ_GET && method != EVHTTP_REQ_HEAD) {
        api_fail(&e, 405, "method_not_allowed", NULL, "the dashboard's files take GET");
        http_reply_error(s, req, false, &e);
        return 405;
    }
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    evhttp_add_header(out, "ETag", a->etag);
    evhttp_add_header(out, "Cache-Control", "no-cache");
    evhttp_add_header(out, "X-Content-Type-Options", "nosniff");
    /* the page runs only its own script and talks only to this node */
    evhttp_add_header(out, "Content-Security-Policy",
                      "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    const char *inm = evhttp_find_header(evhttp_request_get_input_headers(req), "If-None-Match");
    if (inm && tag_matches(inm, a->etag)) {
        evhttp_send_reply(req, 304, "Not Modified", NULL);
        return 304;
    }
    http_reply_text(s, req, 200, a->content_type, (const char *)a->data, a->len);
    return 200;
}
