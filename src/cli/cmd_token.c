/* cmd_token.c - `racimo token`: prints the join token of this node's
 * cluster (and nothing else, for scripts), read from the state directory.
 * `racimo token --rotate` asks a running node (its HTTP API) for a new
 * cluster key, prints the new token and follows the rotation in the node's
 * view until every live member confirmed. */
#include "cli.h"
#include "cli_http.h"
#include "cluster/cluster.h"
#include "cluster/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo token [--state-dir DIR]\n"
        "       racimo token --rotate [--host H] [--port P] [--api-key KEY]\n"
        "\n"
        "Prints the join token of the cluster this node belongs to.  On another machine,\n"
        "'RACIMO_JOIN_TOKEN=TOKEN racimo serve' (or --join-file FILE) joins the cluster.  The token\n"
        "is the cluster key: whoever has it can join, so pass it like a password.\n"
        "\n"
        "--rotate makes a new cluster key on the running node asked (on this machine) and\n"
        "carries every live member over to it without a restart; it prints the new token.\n"
        "Once every member up confirmed (at most 30 s), the old token no longer works:\n"
        "after a token leaked, or a node was removed (racimo nodes remove).  A member that\n"
        "was down meanwhile needs the new token to come back.\n"
        "\n"
        "  --state-dir DIR   the node's state directory (default $RACIMO_HOME or ~/.racimo)\n"
        "  --rotate          rotate the key of the node at --host/--port\n"
        "  --host H          its HTTP address (default 127.0.0.1)\n"
        "  --port P          its HTTP port (default 8080)\n"
        "  --api-key KEY     when the node requires one (default $RACIMO_API_KEY)\n");
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static int rotate(const char *url, const char *key)
{
    char why[500];
    json_t *v;
    if (cli_http_json("POST", url, "/v1/cluster/key/rotate", key, "", 10, &v, why, sizeof why)) {
        fprintf(stderr, "racimo: token: %s\n", why);
        return 1;
    }
    const char *tok = json_string_value(json_object_get(v, "token"));
    if (!tok) {
        fprintf(stderr, "racimo: token: the node's answer holds no token\n");
        json_decref(v);
        return 1;
    }
    printf("%s\n", tok);
    fflush(stdout);
    json_decref(v);
    /* the node retires the old key within 30 s; a little more to see it */
    for (int t = 0; t < 80; t++) {
        json_t *view;
        if (cli_http_json("GET", url, "/v1/cluster", key, NULL, 10, &view, why, sizeof why)) {
            fprintf(stderr, "racimo: token: the key was rotated; following it failed: %s\n", why);
            return 1;
        }
        json_t *kr = json_object_get(view, "key_rotation");
        if (json_is_false(json_object_get(kr, "in_progress"))) {
            json_t *missed = json_object_get(kr, "not_confirmed");
            size_t i, n = json_array_size(missed);
            json_t *id;
            if (!n)
                fprintf(stderr, "racimo: token: every live member carried over to the new key; "
                        "the old token no longer works\n");
            else {
                fprintf(stderr, "racimo: token: the old token no longer works; %zu member%s did "
                        "not confirm and need%s the new token:", n, n == 1 ? "" : "s",
                        n == 1 ? "s" : "");
                json_array_foreach(missed, i, id)
                    fprintf(stderr, " %.8s", json_string_value(id) ? json_string_value(id) : "?");
                fprintf(stderr, "\n");
            }
            json_decref(view);
            return 0;
        }
        json_decref(view);
        sleep_ms(500);
    }
    fprintf(stderr, "racimo: token: the key was rotated, but the node still waits for members\n");
    return 0;
}

int cmd_token(int argc, char **argv)
{
    const char *dir = NULL, *host = "127.0.0.1", *key = getenv("RACIMO_API_KEY");
    long port = 8080;
    bool rot = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--rotate")) {
            rot = true;
        } else if (!strcmp(a, "--state-dir") && v) {
            dir = argv[++i];
        } else if (!strcmp(a, "--host") && v) {
            host = argv[++i];
        } else if (!strcmp(a, "--api-key") && v) {
            key = argv[++i];
        } else if (!strcmp(a, "--port") && v) {
            if (cli_parse_int(v, 1, 65535, &port)) {
                fprintf(stderr, "racimo: token: --port wants a number from 1 to 65535\n");
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "racimo: token: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (rot) {
        char url[300];
        snprintf(url, sizeof url, "%s:%ld", host, port);
        return rotate(url, key);
    }
    char path[600], tok[WIRE_TOKEN_MAX];
    if (cluster_state_dir(dir, path, sizeof path) || cluster_read_token(path, tok, sizeof tok))
        return cli_error("token");
    printf("%s\n", tok);
    return 0;
}
