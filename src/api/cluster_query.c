/* cluster_query.c - filtering, paging and summarising GET /v1/cluster
 * (parameters in cluster_query.h).  Works on the JSON the view already
 * built, so the cluster layer keeps one way of describing itself. */
#include "api/cluster_query.h"

#include "base/err.h"
#include "base/mem.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_MAX 10000

static int parse_count(const char *v, const char *name, long max, long *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < 0 || n > max)
        return rc_fail(RC_EINVAL, "%s=%s: expected a whole number from 0 to %ld", name, v, max);
    *out = n;
    return 0;
}

/* `want` matches a node by its full id, a prefix of 8+ hex digits, or its name */
static bool matches(json_t *node, const char *want, size_t len)
{
    const char *id = json_string_value(json_object_get(node, "id"));
    const char *name = json_string_value(json_object_get(node, "name"));
    if (id && len >= 8 && len <= strlen(id) && !strncmp(id, want, len)) return true;
    return name && strlen(name) == len && !strncmp(name, want, len);
}

static bool listed(json_t *node, const char *list)
{
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len && matches(node, p, len)) return true;
        if (!comma) break;
        p = comma + 1;
    }
    return false;
}

static int by_id(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "id"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "id"));
    return strcmp(x ? x : "", y ? y : "");
}

static json_int_t int_of(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

/* counts per state, totals of the hardware, and per model served: nodes,
 * slots and free slots (what a router or an operator reads at a glance) */
static json_t *summary(json_t *nodes)
{
    json_int_t up = 0, down = 0, cores = 0, mem_total = 0, mem_free = 0;
    json_t *models = json_object();
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        const char *st = json_string_value(json_object_get(n, "state"));
        bool is_up = st && !strcmp(st, "up");
        if (is_up) up++; else down++;
        if (!is_up) continue;
        json_t *hw = json_object_get(n, "hardware");
        cores += int_of(hw, "cores");
        mem_total += int_of(hw, "mem_total");
        mem_free += int_of(hw, "mem_free");
        size_t j;
        json_t *m;
        json_array_foreach(json_object_get(n, "serving"), j, m) {
            const char *name = json_string_value(m);
            if (!name) continue;
            json_t *agg = json_object_get(models, name);
            if (!agg) {
                agg = json_pack("{s:I, s:I, s:I}", "nodes", (json_int_t)0, "slots", (json_int_t)0,
                                "free", (json_int_t)0);
                json_object_set_new(models, name, agg);
            }
            json_object_set_new(agg, "nodes", json_integer(int_of(agg, "nodes") + 1));
            json_object_set_new(agg, "slots", json_integer(int_of(agg, "slots") +
                                int_of(json_object_get(n, "serving_slots"), name)));
            json_object_set_new(agg, "free", json_integer(int_of(agg, "free") +
                                int_of(json_object_get(n, "serving_free"), name)));
        }
    }
    return json_pack("{s:{s:I, s:I}, s:I, s:I, s:I, s:o}", "states", "up", up, "down", down,
                     "cores_up", cores, "memory_total_bytes_up", mem_total,
                     "memory_free_bytes_up", mem_free, "serving", models);
}

int cluster_query_apply(json_t *body, const char *query)
{
    if (!query || !*query) return 0;
    struct evkeyvalq q = { NULL, &q.tqh_first };   /* an empty TAILQ */
    if (evhttp_parse_query_str(query, &q) != 0)
        return rc_fail(RC_EINVAL, "the query string is malformed");
    int rc = 0;
    long offset = 0, limit = LIMIT_MAX;
    const char *only = NULL, *state = NULL;
    bool summ = false;
    struct evkeyval *kv;
    for (kv = q.tqh_first; kv; kv = kv->next.tqe_next) {
        if (!strcmp(kv->key, "offset")) rc = parse_count(kv->value, "offset", 1L << 30, &offset);
        else if (!strcmp(kv->key, "limit")) {
            rc = parse_count(kv->value, "limit", LIMIT_MAX, &limit);
            if (!rc && limit == 0) rc = rc_fail(RC_EINVAL, "limit=0: expected 1 to %d", LIMIT_MAX);
        } else if (!strcmp(kv->key, "nodes")) only = kv->value;
        else if (!strcmp(kv->key, "state")) {
            state = kv->value;
            if (strcmp(state, "up") && strcmp(state, "down"))
                rc = rc_fail(RC_EINVAL, "state=%s: expected up or down", state);
        } else if (!strcmp(kv->key, "summary")) {
            if (strcmp(kv->value, "1") && strcmp(kv->value, "0") && strcmp(kv->value, "true") &&
                strcmp(kv->value, "false"))
                rc = rc_fail(RC_EINVAL, "summary=%s: expected 1 or 0", kv->value);
            summ = !strcmp(kv->value, "1") || !strcmp(kv->value, "true");
        } else {
            rc = rc_fail(RC_EINVAL, "unknown parameter '%s' (known: nodes, state, offset, "
                         "limit, summary)", kv->key);
        }
        if (rc) break;
    }
    if (rc) goto done;

    json_t *nodes = json_object_get(body, "nodes");
    size_t n_all = json_array_size(nodes), n = 0;
    json_t **sel = n_all ? rc_mallocarray(n_all, sizeof *sel) : NULL;
    if (n_all && !sel) { rc = RC_ENOMEM; goto done; }
    size_t i;
    json_t *node;
    json_array_foreach(nodes, i, node) {
        const char *st = json_string_value(json_object_get(node, "state"));
        if (only && !listed(node, only)) continue;
        if (state && (!st || strcmp(st, state))) continue;
        sel[n++] = node;
    }
    if (summ) {
        json_t *arr = json_array();
        for (i = 0; i < n; i++) json_array_append(arr, sel[i]);
        json_object_set_new(body, "summary", summary(arr));
        json_decref(arr);
        json_object_del(body, "nodes");
        json_object_del(body, "links");
        json_object_set_new(body, "nodes_total", json_integer((json_int_t)n));
        rc_free(sel);
        goto done;
    }
    qsort(sel, n, sizeof *sel, by_id);
    size_t from = (size_t)offset < n ? (size_t)offset : n;
    size_t to = from + (size_t)limit < n ? from + (size_t)limit : n;
    json_t *page = json_array();
    for (i = from; i < to; i++) json_array_append(page, sel[i]);
    rc_free(sel);
    /* links from the listed nodes only */
    json_t *links = json_array(), *l;
    json_array_foreach(json_object_get(body, "links"), i, l) {
        const char *f = json_string_value(json_object_get(l, "from"));
        size_t j;
        json_array_foreach(page, j, node) {
            const char *id = json_string_value(json_object_get(node, "id"));
            if (f && id && !strcmp(f, id)) {
                json_array_append(links, l);
                break;
            }
        }
    }
    json_object_set_new(body, "nodes", page);
    json_object_set_new(body, "links", links);
    json_object_set_new(body, "nodes_total", json_integer((json_int_t)n));
    json_object_set_new(body, "next_offset", to < n ? json_integer((json_int_t)to) : json_null());
done:
    evhttp_clear_headers(&q);
    return rc;
}
