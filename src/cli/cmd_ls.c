/* cmd_ls.c - `racimo ls`: every model of the cluster a running node is in,
 * with the node that has it, its size, weight type and digest (GET
 * /v1/cluster: each node lists its model files to the others). */
#include "cli.h"
#include "cli_http.h"
#include "base/log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo ls [--url URL] [--api-key KEY]\n"
        "\n"
        "Lists every model file of the cluster: its name, the node that holds it, its\n"
        "size, its weight type (the one holding the most bytes) and its sha256 when\n"
        "racimo pull verified it ('-' otherwise).  A model held by several nodes has a\n"
        "line per node.\n"
        "\n"
        "  --url URL       the node to ask (default http://127.0.0.1:8080)\n"
        "  --api-key KEY   when the node requires one (default $RACIMO_API_KEY)\n");
}

static int by_name(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    int c = strcmp(json_string_value(json_object_get(x, "name")),
                   json_string_value(json_object_get(y, "name")));
    return c ? c : strcmp(json_string_value(json_object_get(x, "node")),
                          json_string_value(json_object_get(y, "node")));
}

static const char *text(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s && *s ? log_clean(s) : "-";
}

int cmd_ls(int argc, char **argv)
{
    const char *url, *key;
    int code;
    if (cli_node_args(argc, argv, "ls", usage, &url, &key, NULL, 0, &code) < 0)
        return code;
    json_t *v;
    char err[600];
    if (cli_http_json("GET", url, "/v1/cluster", key, NULL, 10, &v, err, sizeof err)) {
        fprintf(stderr, "racimo: ls: %s\n", err);
        return 1;
    }
    /* one row per (model, node up) */
    json_t *rows = json_array(), *n, *m;
    size_t i, j;
    json_array_foreach(json_object_get(v, "nodes"), i, n) {
        const char *state = json_string_value(json_object_get(n, "state"));
        const char *node = json_string_value(json_object_get(n, "name"));
        if (!state || strcmp(state, "up") || !node)
            continue;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            if (!json_is_string(json_object_get(m, "name")))
                continue;
            json_t *r = json_deep_copy(m);
            json_object_set_new(r, "node", json_string(node));
            json_array_append_new(rows, r);
        }
    }
    size_t n_rows = json_array_size(rows);
    json_t **sorted = n_rows ? malloc(n_rows * sizeof *sorted) : NULL;
    for (i = 0; i < n_rows && sorted; i++)
        sorted[i] = json_array_get(rows, i);
    if (sorted)
        qsort(sorted, n_rows, sizeof *sorted, by_name);
    if (!n_rows)
        printf("no models in the cluster (racimo pull fetches one)\n");
    else
        printf("%-40s %-16s %10s %-8s %s\n", "NAME", "NODE", "SIZE", "TYPE", "SHA256");
    for (i = 0; i < n_rows && sorted; i++) {
        json_t *r = sorted[i];
        double mib = (double)json_integer_value(json_object_get(r, "size_bytes")) / 1048576.0;
        char size[32];
        snprintf(size, sizeof size, mib >= 1024 ? "%.1f GiB" : "%.1f MiB",
                 mib >= 1024 ? mib / 1024 : mib);
        /* the node name first: log_clean's result lives until its next calls */
        char name[96], node[64];
        snprintf(name, sizeof name, "%s", text(r, "name"));
        snprintf(node, sizeof node, "%s", text(r, "node"));
        printf("%-40s %-16s %10s %-8s ", name, node, size, text(r, "type"));
        printf("%s\n", text(r, "sha256"));
    }
    free(sorted);
    json_decref(rows);
    json_decref(v);
    return 0;
}
