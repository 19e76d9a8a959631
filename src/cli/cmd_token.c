/* cmd_token.c - `racimo token`: prints the join token of this node's
 * cluster (and nothing else, for scripts), read from the state directory. */
#include "cli.h"
#include "cluster/cluster.h"
#include "cluster/wire.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo token [--state-dir DIR]\n"
        "\n"
        "Prints the join token of the cluster this node belongs to.  On another machine,\n"
        "'RACIMO_JOIN_TOKEN=TOKEN racimo serve' (or --join-file FILE) joins the cluster.  The token\n"
        "is the cluster key: whoever has it can join, so pass it like a password.\n"
        "\n"
        "  --state-dir DIR   the node's state directory (default $RACIMO_HOME or ~/.racimo)\n");
}

int cmd_token(int argc, char **argv)
{
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--state-dir") && i + 1 < argc) {
            dir = argv[++i];
        } else {
            fprintf(stderr, "racimo: token: unknown option or missing value: '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    char path[600], tok[WIRE_TOKEN_MAX];
    if (cluster_state_dir(dir, path, sizeof path) || cluster_read_token(path, tok, sizeof tok))
        return cli_error("token");
    printf("%s\n", tok);
    return 0;
}
