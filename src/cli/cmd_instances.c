/* cmd_instances.c - `racimo instances`: start, stop and list the models a
 * running node serves (POST /v1/instances, /v1/instances/stop; GET
 * /v1/cluster), so a big model can be placed across the cluster before
 * the first request needs it. */
#include "cli.h"
#include "cli_http.h"
#include "base/mem.h"
#include "base/os.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo instances [start|stop MODEL] [--url URL] [--api-key KEY] [--no-wait]\n"
        "\n"
        "Without a verb, lists the models the node serves, with where each runs (the\n"
        "placement: node and layers of each stage).  'start' loads MODEL now (placing it\n"
        "across the cluster when it does not fit one node) and waits until it is ready\n"
        "(--no-wait: return at once); 'stop' stops it (refused while it runs requests).\n"
        "\n"
        "  --url URL       the node (default http://127.0.0.1:8080)\n"
        "  --api-key KEY   when the node requires one (default $RACIMO_API_KEY)\n");
}

static void print_plan(json_t *plan)
{
    size_t i;
    json_t *st;
    json_array_foreach(json_object_get(plan, "stages"), i, st)
        printf("    stage %zu: layers %lld-%lld on %s\n", i,
               (long long)json_integer_value(json_object_get(st, "first")),
               (long long)json_integer_value(json_object_get(st, "last")) - 1,
               json_string_value(json_object_get(st, "name")) ?
               json_string_value(json_object_get(st, "name")) : "?");
}

static int list(const char *url, const char *key)
{
    cli_http_reply r;
    char err[400];
    if (cli_http("GET", url, "/v1/cluster", key, NULL, 10, &r, err, sizeof err)) {
        fprintf(stderr, "racimo: instances: %s\n", err);
        return 1;
    }
    json_t *v = r.status == 200 ? json_loadb(r.body, r.len, 0, NULL) : NULL;
    if (!json_is_object(v)) {
        fprintf(stderr, "racimo: instances: GET /v1/cluster answered %d: %.200s\n", r.status,
                r.body ? r.body : "");
        json_decref(v);
        rc_free(r.body);
        return 1;
    }
    size_t i;
    json_t *m;
    int n = 0;
    json_array_foreach(json_object_get(v, "models"), i, m) {
        const char *state = json_string_value(json_object_get(m, "state"));
        if (!state || strcmp(state, "available") == 0)
            continue;
        printf("%s  %s\n", json_string_value(json_object_get(m, "name")), state);
        if (json_object_get(m, "plan"))
            print_plan(json_object_get(m, "plan"));
        n++;
    }
    if (!n)
        printf("no model is loaded\n");
    json_decref(v);
    rc_free(r.body);
    return 0;
}

static int act(const char *url, const char *key, bool stop, const char *model, bool wait)
{
    json_t *req = json_pack("{s:s}", "model", model);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body)
        return 1;
    int rc = 1;
    for (int tries = 0;; tries++) {
        cli_http_reply r;
        char err[400];
        if (cli_http("POST", url, stop ? "/v1/instances/stop" : "/v1/instances", key, body, 30,
                     &r, err, sizeof err)) {
            fprintf(stderr, "racimo: instances: %s\n", err);
            break;
        }
        json_t *v = json_loadb(r.body ? r.body : "", r.len, 0, NULL);
        const char *state = json_string_value(json_object_get(v, "state"));
        const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
        if (r.status >= 400 || !state) {
            fprintf(stderr, "racimo: instances: %s\n", msg ? msg : r.body ? r.body : "no answer");
        } else if (stop || !wait || !strcmp(state, "loaded")) {
            printf("%s: %s\n", model, stop ? "stopped" : state);
            if (json_object_get(v, "plan"))
                print_plan(json_object_get(v, "plan"));
            rc = 0;
        } else {
            if (tries == 0)
                fprintf(stderr, "racimo: instances: %s is loading...\n", model);
            json_decref(v);
            rc_free(r.body);
            struct timespec ts = { 0, 500000000L };
            nanosleep(&ts, NULL);
            continue;
        }
        json_decref(v);
        rc_free(r.body);
        break;
    }
    free(body);
    return rc;
}

int cmd_instances(int argc, char **argv)
{
    const char *url = "http://127.0.0.1:8080", *key = getenv("RACIMO_API_KEY");
    const char *verb = NULL, *model = NULL;
    bool wait = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--url") && v) {
            url = v;
            i++;
        } else if (!strcmp(a, "--api-key") && v) {
            key = v;
            i++;
        } else if (!strcmp(a, "--no-wait")) {
            wait = false;
        } else if (!verb && (!strcmp(a, "start") || !strcmp(a, "stop"))) {
            verb = a;
        } else if (verb && !model && a[0] != '-') {
            model = a;
        } else {
            fprintf(stderr, "racimo: instances: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (verb && !model) {
        fprintf(stderr, "racimo: instances: %s needs a model name\n", verb);
        return 2;
    }
    return verb ? act(url, key, !strcmp(verb, "stop"), model, wait) : list(url, key);
}
