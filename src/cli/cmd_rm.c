/* cmd_rm.c - `racimo rm`: deletes a model file from a running node's models
 * folder (Ollama's DELETE /api/delete).  Read-only folders, files given
 * with -m and models loaded are refused by the node, with the reason. */
#include "cli.h"
#include "cli_http.h"
#include "base/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo rm MODEL... [--url URL] [--api-key KEY]\n"
        "\n"
        "Deletes each MODEL's file from the models folder of the node at URL (a model\n"
        "running there must be stopped first: racimo instances stop MODEL).  Files in\n"
        "read-only folders are never deleted; a model another node holds is deleted\n"
        "by asking that node.\n"
        "\n"
        "  --url URL       the node (default http://127.0.0.1:8080)\n"
        "  --api-key KEY   when the node requires one (default $RACIMO_API_KEY)\n");
}

int cmd_rm(int argc, char **argv)
{
    const char *url, *key, *names[64];
    int code, n = cli_node_args(argc, argv, "rm", usage, &url, &key, names, 64, &code);
    if (n < 0)
        return code;
    if (!n) {
        usage(stderr);
        return 2;
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        json_t *body = json_pack("{s:s}", "model", names[i]);
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        cli_http_reply r;
        char err[600];
        if (!text || cli_http("DELETE", url, "/api/delete", key, text, 30, &r, err, sizeof err)) {
            fprintf(stderr, "racimo: rm: %s\n", text ? err : "out of memory");
            free(text);
            return 1;
        }
        free(text);
        if (r.status == 200) {
            printf("deleted %s\n", names[i]);
        } else {
            json_t *v = json_loadb(r.body ? r.body : "", r.len, 0, NULL);
            const char *msg = json_string_value(json_object_get(v, "error"));
            fprintf(stderr, "racimo: rm: %s: %s\n", names[i],
                    msg ? msg : r.body && *r.body ? r.body : "refused");
            json_decref(v);
            failed = 1;
        }
        rc_free(r.body);
    }
    return failed;
}
