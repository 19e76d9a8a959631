/* cmd_instances.c - `racimo instances`: start, stop and list the models a
 * running node serves (POST /v1/instances, /v1/instances/stop; GET
 * /v1/cluster), so a big model can be placed across the cluster before
 * the first request needs it; `plan` shows the plan a start would get, as
 * the node computes it (POST /v1/instances with "dry_run"). */
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
        "usage: racimo instances [start|plan|stop MODEL] [--split S] [--min-nodes N]\n"
        "                        [--url URL] [--api-key KEY] [--no-wait]\n"
        "\n"
        "Without a verb, lists the models the node serves, with where each runs (the\n"
        "placement: node and layers of each stage).  'start' loads MODEL now (placing it\n"
        "across the cluster when it does not fit one node) and waits until it is ready\n"
        "(--no-wait: return at once); 'plan' only shows the plan 'start' would get now\n"
        "(exit status 1 when it does not fit); 'stop' stops it (refused while it runs\n"
        "requests).\n"
        "\n"
        "  --split S       for start and plan: layers, tensor or auto (default: the node's)\n"
        "  --min-nodes N   for start and plan: over at least N nodes\n"
        "  --url URL       the node (default http://127.0.0.1:8080)\n"
        "  --api-key KEY   when the node requires one (default $RACIMO_API_KEY)\n");
}

static void print_plan(json_t *plan)
{
    size_t i, n = json_array_size(json_object_get(plan, "stages"));
    json_t *st;
    bool tensor = !strcmp(json_string_value(json_object_get(plan, "split")) ?
                          json_string_value(json_object_get(plan, "split")) : "", "tensor");
    json_array_foreach(json_object_get(plan, "stages"), i, st) {
        const char *name = json_string_value(json_object_get(st, "name"));
        if (tensor)
            printf("    shard %zu of %zu: every layer on %s\n", i, n, name ? name : "?");
        else
            printf("    stage %zu: layers %lld-%lld on %s\n", i,
                   (long long)json_integer_value(json_object_get(st, "first")),
                   (long long)json_integer_value(json_object_get(st, "last")) - 1,
                   name ? name : "?");
    }
}

/* 'plan': the answer of POST /v1/instances with "dry_run": 0 fits, 1 not. */
static int print_preview(const char *model, json_t *v)
{
    json_t *plan = json_object_get(v, "plan");
    if (!json_is_true(json_object_get(plan, "fits"))) {
        const char *why = json_string_value(json_object_get(plan, "advice"));
        printf("%s: does not fit: %s\n", model, why ? why : "?");
        return 1;
    }
    printf("%s: fits on %zu node%s (%s), about %.1f tokens/s for one stream%s\n", model,
           json_array_size(json_object_get(plan, "stages")),
           json_array_size(json_object_get(plan, "stages")) == 1 ? "" : "s",
           json_string_value(json_object_get(plan, "split")) ?
           json_string_value(json_object_get(plan, "split")) : "?",
           json_number_value(json_object_get(plan, "tokens_per_s")),
           json_is_true(json_object_get(plan, "runs_here")) ? ", on the node asked" : "");
    print_plan(plan);
    return 0;
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

static int act(const char *url, const char *key, const char *verb, const char *model,
               const char *split, int min_nodes, bool wait)
{
    bool stop = !strcmp(verb, "stop"), dry = !strcmp(verb, "plan");
    json_t *req = json_pack("{s:s}", "model", model);
    if (req && !stop && split)
        json_object_set_new(req, "split", json_string(split));
    if (req && !stop && min_nodes > 0)
        json_object_set_new(req, "min_nodes", json_integer(min_nodes));
    if (req && dry)
        json_object_set_new(req, "dry_run", json_true());
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
        if (dry && r.status == 200 && json_is_object(json_object_get(v, "plan"))) {
            rc = print_preview(model, v);
        } else if (r.status >= 400 || !state) {
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
    const char *verb = NULL, *model = NULL, *split = NULL;
    long min_nodes = 0;
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
        } else if (!strcmp(a, "--split") && v) {
            if (strcmp(v, "layers") && strcmp(v, "tensor") && strcmp(v, "auto")) {
                fprintf(stderr, "racimo: instances: --split takes layers, tensor or auto, "
                        "not '%s'\n", v);
                return 2;
            }
            split = v;
            i++;
        } else if (!strcmp(a, "--min-nodes") && v) {
            if (cli_parse_int(v, 1, 16, &min_nodes)) {
                fprintf(stderr, "racimo: instances: --min-nodes wants a number from 1 to 16\n");
                return 2;
            }
            i++;
        } else if (!verb && (!strcmp(a, "start") || !strcmp(a, "stop") || !strcmp(a, "plan"))) {
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
    return verb ? act(url, key, verb, model, split, (int)min_nodes, wait) : list(url, key);
}
