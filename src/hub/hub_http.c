/* hub_http.c - the HTTP side of a pull that is not the file transfer: the
 * libcurl handle every request starts from, HTTP statuses as sentences, and
 * the tree listing that resolves a name into files (hub_resolve).
 *
 * The listing is paged by the Hub (a Link: <...>; rel="next" header); the
 * pages are joined into one array before hub_pick reads it.
 */
#include "hub/hub_internal.h"
#include "base/err.h"
#include "base/mem.h"

#include <jansson.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LISTING_MAX_BYTES (32u << 20)   /* one page of the tree listing */
#define LISTING_MAX_PAGES 64

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_start(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void hub_config_default(hub_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->retries = -1;
}

const char *hub__endpoint(const hub_config *cfg, char *buf, size_t cap)
{
    const char *e = cfg->endpoint ? cfg->endpoint : getenv("HF_ENDPOINT");
    if (!e || !*e)
        e = "https://huggingface.co";
    size_t len = strlen(e);
    while (len && e[len - 1] == '/')
        len--;
    snprintf(buf, cap, "%.*s", (int)len, e);
    return buf;
}

const char *hub__token(const hub_config *cfg)
{
    const char *t = cfg->token ? cfg->token : getenv("HF_TOKEN");
    return t ? t : "";
}

CURL *hub__easy(const hub_config *cfg, const char *url, struct curl_slist **hdrs)
{
    pthread_once(&curl_once, curl_start);
    *hdrs = NULL;
    CURL *h = curl_easy_init();
    if (!h) {
        rc_fail(RC_ENOMEM, "out of memory (libcurl)");
        return NULL;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_USERAGENT, "racimo");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(cfg->stall_s > 0 ? cfg->stall_s : 60));
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    const char *tok = hub__token(cfg);
    if (*tok) {
        size_t len = strlen(tok) + 32;
        char *line = rc_malloc(len);
        if (!line) {
            curl_easy_cleanup(h);
            rc_fail(RC_ENOMEM, "out of memory");
            return NULL;
        }
        snprintf(line, len, "Authorization: Bearer %s", tok);
        *hdrs = curl_slist_append(NULL, line);
        rc_free(line);
        if (!*hdrs) {
            curl_easy_cleanup(h);
            rc_fail(RC_ENOMEM, "out of memory");
            return NULL;
        }
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
    }
    return h;
}

int hub__http_error(const hub_config *cfg, const char *what, long status)
{
    bool tok = *hub__token(cfg) != 0;
    if (status == 401 || status == 403) {
        if (!tok)
            return rc_fail(RC_EINVAL, "%s is gated or private (HTTP %ld): it needs a Hugging "
                           "Face token: set HF_TOKEN or pass --token (and accept the model's "
                           "terms on its page first)", what, status);
        return rc_fail(RC_EINVAL, "%s: the token was refused (HTTP %ld): check that it is "
                       "valid and that its account accepted the model's terms", what, status);
    }
    if (status == 404)
        return rc_fail(RC_ENOTFOUND, "%s not found (HTTP 404)%s", what,
                       tok ? "" : "; a private repository also needs HF_TOKEN or --token");
    if (status == 429)
        return rc_fail(RC_EIO, "%s: the server asks to slow down (HTTP 429): try again later",
                       what);
    return rc_fail(RC_EIO, "%s: the server answered HTTP %ld", what, status);
}

int hub__curl_error(const char *what, CURLcode code, const char *errbuf)
{
    return rc_fail(RC_EIO, "%s: %s", what, errbuf && *errbuf ? errbuf : curl_easy_strerror(code));
}

typedef struct {
    char *data;
    size_t len;
    bool too_big;
    char next[2048];          /* the Link rel="next" URL of this page */
} page;

static size_t page_write(char *p, size_t size, size_t n, void *arg)
{
    page *pg = arg;
    size_t add = size * n;
    if (pg->len + add > LISTING_MAX_BYTES) {
        pg->too_big = true;
        return 0;
    }
    char *d = rc_realloc(pg->data, pg->len + add + 1);
    if (!d)
        return 0;
    memcpy(d + pg->len, p, add);
    pg->data = d;
    pg->len += add;
    d[pg->len] = 0;
    return add;
}

/* Link: <https://host/api/...&cursor=X>; rel="next" */
static size_t page_header(char *p, size_t size, size_t n, void *arg)
{
    page *pg = arg;
    size_t len = size * n;
    if (len > 5 && !strncasecmp(p, "link:", 5)) {
        char line[4096];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        char *lt = strchr(line, '<'), *gt = lt ? strchr(lt, '>') : NULL;
        if (lt && gt && strstr(gt, "rel=\"next\"") && (size_t)(gt - lt - 1) < sizeof pg->next)
            snprintf(pg->next, sizeof pg->next, "%.*s", (int)(gt - lt - 1), lt + 1);
    }
    return len;
}

/* The whole tree of ref's repository as one JSON text (rc_malloc'd). */
static int fetch_tree(const hub_config *cfg, const hub_ref *ref, char **out)
{
    char ep[1024], url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/main?recursive=true",
             hub__endpoint(cfg, ep, sizeof ep), ref->repo);
    json_t *all = json_array();
    int rc = 0;
    if (!all)
        return rc_fail(RC_ENOMEM, "out of memory");
    for (int pages = 0;; pages++) {
        if (pages == LISTING_MAX_PAGES) {
            rc = rc_fail(RC_ELIMIT, "%s: the file listing has more than %d pages", ref->repo,
                         LISTING_MAX_PAGES);
            break;
        }
        page pg = { 0 };
        struct curl_slist *hdrs;
        char errbuf[CURL_ERROR_SIZE] = "";
        CURL *h = hub__easy(cfg, url, &hdrs);
        if (!h) {
            rc = RC_ENOMEM;
            break;
        }
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, page_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &pg);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, page_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &pg);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        CURLcode cc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdrs);
        char what[300];
        snprintf(what, sizeof what, "%s (listing its files)", ref->repo);
        if (pg.too_big)
            rc = rc_fail(RC_ELIMIT, "%s: the file listing is larger than %u MiB", ref->repo,
                         LISTING_MAX_BYTES >> 20);
        else if (cc != CURLE_OK)
            rc = hub__curl_error(what, cc, errbuf);
        else if (status < 200 || status > 299)
            rc = hub__http_error(cfg, ref->repo, status);
        json_t *arr = NULL;
        if (!rc) {
            json_error_t jerr;
            arr = json_loadb(pg.data ? pg.data : "", pg.len, 0, &jerr);
            if (!json_is_array(arr))
                rc = rc_fail(RC_EFORMAT, "%s: the file listing is not a JSON array (%s)",
                             ref->repo, arr ? "another JSON value" : jerr.text);
            else
                json_array_extend(all, arr);
        }
        json_decref(arr);
        rc_free(pg.data);
        if (rc || !pg.next[0])
            break;
        snprintf(url, sizeof url, "%s", pg.next);
    }
    if (!rc && !(*out = json_dumps(all, JSON_COMPACT)))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    json_decref(all);
    return rc;
}

int hub_resolve(const hub_config *cfg, const char *name, const char *file, hub_plan *out)
{
    hub_ref ref;
    int rc = hub_parse_ref(name, &ref);
    char *tree = NULL;
    if (!rc)
        rc = fetch_tree(cfg, &ref, &tree);
    if (!rc)
        rc = hub_pick(tree, &ref, file, out);
    free(tree);   /* json_dumps allocates with jansson's allocator (malloc) */
    return rc;
}
