/* cmd_join.c - `racimo join`: the parts of a split GGUF model
 * (NAME-00001-of-00003.gguf ...) into one file, for whoever wants one: racimo
 * loads and shares a set as it is (a peer receives the joined file anyway). */
#include "cli.h"
#include "model/gguf.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo join PART1.gguf PART2.gguf ... -o MODEL.gguf\n"
        "\n"
        "Joins the parts of a split GGUF model (llama.cpp's layout: split.no,\n"
        "split.count and split.tensors.count in each part), given in order, into one\n"
        "file, the one the cluster's nodes receive when they copy the set.  (racimo\n"
        "loads a set in place, by its first part: joining is not needed.)  Each part\n"
        "is checked to be the one expected; the output is written beside as\n"
        "MODEL.gguf.tmp and renamed when complete.\n");
}

int cmd_join(int argc, char **argv)
{
    const char *parts[256], *out = NULL;
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] != '-' && n < 256) {
            parts[n++] = argv[i];
        } else {
            fprintf(stderr, "racimo: join: unexpected '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!n || !out) {
        usage(stderr);
        return 2;
    }
    if (gguf_join(parts, n, out))
        return cli_error("join");
    fprintf(stderr, "joined %d parts into %s\n", n, out);
    return 0;
}
