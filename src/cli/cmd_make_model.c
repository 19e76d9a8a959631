/* cmd_make_model.c - `racimo make-model`: write a random-weight GGUF model
 * of a preset shape, in a chosen tensor type, with the project's own
 * writer. */
#include "cli.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "tensor/types.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo make-model --preset NAME [--type TYPE] [options] -o FILE\n"
        "\n"
        "  --preset NAME     %s\n"
        "  --type TYPE       F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,\n"
        "                    Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, or Q4_K_M\n"
        "                    (llama-quantize's mix); default F32\n"
        "  --layers N        override the number of layers\n"
        "  --vocab N         override the vocabulary size\n"
        "  --seed N          random seed (default 1)\n"
        "  --pooling P       make an embedding model: mean, cls or last (the\n"
        "                    tiny-qwen3-embed presets have it already)\n"
        "  --no-weights      write the head only, the data a hole (sparse): the real\n"
        "                    shapes of a model too large to write, for `racimo plan`\n"
        "  --split N         write N parts PREFIX-00001-of-0000N.gguf... (llama.cpp's\n"
        "                    split layout) instead of one file; -o names the\n"
        "                    whole (PREFIX.gguf), which is not kept\n"
        "  -o FILE           output path\n", synth_preset_names());
}

/* The model just written at `out` as n parts next to it, the whole removed. */
static int write_split(const char *out, int n)
{
    char prefix[4096];
    size_t len = strlen(out);
    if (len > 5 && !strcasecmp(out + len - 5, ".gguf"))
        len -= 5;
    snprintf(prefix, sizeof prefix, "%.*s", (int)len, out);
    gguf_file *f;
    int rc = gguf_open(out, &f);
    if (!rc)
        rc = gguf_split_write(f, n, prefix);
    gguf_close(f);
    unlink(out);
    if (rc)
        return cli_error("make-model");
    fprintf(stderr, "wrote %s-00001-of-%05d.gguf ... %s-%05d-of-%05d.gguf\n", prefix, n, prefix,
            n, n);
    return 0;
}

int cmd_make_model(int argc, char **argv)
{
    const char *preset = NULL, *type = "F32", *out = NULL, *pooling = NULL;
    long layers = 0, vocab = 0, seed = 1, split = 0;
    int head_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--preset") && has) preset = argv[++i];
        else if (!strcmp(a, "--type") && has) type = argv[++i];
        else if (!strcmp(a, "-o") && has) out = argv[++i];
        else if (!strcmp(a, "--pooling") && has) pooling = argv[++i];
        else if (!strcmp(a, "--no-weights")) head_only = 1;
        else if (!strcmp(a, "--layers") && has && !cli_parse_int(argv[i + 1], 1, 4096, &layers)) i++;
        else if (!strcmp(a, "--vocab") && has && !cli_parse_int(argv[i + 1], 300, 1 << 24, &vocab)) i++;
        else if (!strcmp(a, "--split") && has && !cli_parse_int(argv[i + 1], 1, 999, &split)) i++;
        else if (!strcmp(a, "--seed") && has && !cli_parse_int(argv[i + 1], 0, 1L << 62, &seed)) i++;
        else {
            fprintf(stderr, "racimo: make-model: unknown, incomplete or invalid option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!preset || !out) {
        usage(stderr);
        return 2;
    }
    synth_params p;
    if (synth_preset(preset, &p))
        return cli_error(NULL);
    if (!strcasecmp(type, "Q4_K_M")) {
        p.mix = "Q4_K_M";
    } else {
        p.type = tensor_type_from_name(type);
        if (p.type < 0 || !tensor_type_supported(p.type) || !tensor_type_traits(p.type)->from_float) {
            fprintf(stderr, "racimo: make-model: type '%s' cannot be written\n", type);
            return 2;
        }
    }
    if (layers) p.n_layer = (int)layers;
    if (vocab) p.n_vocab = (int)vocab;
    p.seed = (uint64_t)seed;
    if (pooling) {
        static const char *names[] = { "mean", "cls", "last" };
        p.pooling = 0;
        for (int k = 0; k < 3; k++)
            if (!strcmp(pooling, names[k]))
                p.pooling = k + 1;
        if (!p.pooling) {
            fprintf(stderr, "racimo: make-model: pooling '%s' is not mean, cls or last\n", pooling);
            return 2;
        }
    }
    if (head_only ? synth_write_head(out, &p) : synth_write(out, &p))
        return cli_error("make-model");
    if (split)
        return write_split(out, (int)split);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}
