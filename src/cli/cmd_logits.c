/* cmd_logits.c - `racimo logits`: evaluate token ids and print or write
 * the logits, the tool for checking racimo against a reference engine. */
#include "cli.h"
#include "base/err.h"
#include "base/mem.h"
#include "infer/stage.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo logits -m MODEL --tokens ID,ID,... [options]\n"
        "\n"
        "Feeds the token ids at positions 0..n-1 (one batch) and outputs one\n"
        "row of n_vocab logits per position.\n"
        "\n"
        "  -m, --model FILE    GGUF model\n"
        "  --tokens LIST       comma-separated token ids\n"
        "  -o, --output FILE   write float32 little-endian rows to FILE\n"
        "                      (n_tokens x n_vocab, row-major)\n"
        "  --all               print every logit (default: the top 5 per row)\n"
        "  --exact             f32 activations on weights decoded to f32, and an f32\n"
        "                      KV cache (default: llama.cpp-style quantised activations)\n"
        "  --cache-type T      KV cache elements: f16 (default, as llama.cpp; f32 with\n"
        "                      --exact), q8_0 or f32\n"
        "  --batch N           evaluate in chunks of N tokens (default: all)\n"
        "  -t, --threads N     threads (default: physical cores)\n");
}

int cmd_logits(int argc, char **argv)
{
    const char *path = NULL, *ids_arg = NULL, *out_path = NULL;
    int print_all = 0, exact = 0, rc = 1, cache = -1;
    long threads = cli_default_threads(), batch = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) path = argv[++i];
        else if (!strcmp(a, "--tokens") && has) ids_arg = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) out_path = argv[++i];
        else if (!strcmp(a, "--all")) print_all = 1;
        else if (!strcmp(a, "--exact")) exact = 1;
        else if (!strcmp(a, "--cache-type") && has) {
            if (cli_parse_cache_type("logits", argv[++i], &cache))
                return 2;
        }
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has) {
            if (cli_parse_int(argv[++i], 1, 512, &threads)) {
                fprintf(stderr, "racimo: --threads wants a number from 1 to 512\n");
                return 2;
            }
        } else if (!strcmp(a, "--batch") && has) {
            if (cli_parse_int(argv[++i], 1, 1 << 20, &batch)) {
                fprintf(stderr, "racimo: --batch wants a positive number\n");
                return 2;
            }
        } else {
            fprintf(stderr, "racimo: logits: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || !ids_arg) {
        usage(stderr);
        return 2;
    }
    int32_t *ids = NULL, *pos = NULL, *seq = NULL;
    float *logits = NULL;
    model *m = NULL;
    stage *s = NULL;
    FILE *out = NULL;
    int n = cli_parse_ids(ids_arg, &ids);
    if (n < 0)
        return 2;
    if (model_load(path, 0, -1, &m)) {
        rc = cli_error(NULL);
        goto done;
    }
    if (m->hp.pooling != POOL_NONE) {
        fprintf(stderr, "racimo: logits: %s is an embedding model (%s pooling): it makes no "
                "logits (serve it and POST /v1/embeddings)\n", path,
                model_pooling_name(m->hp.pooling));
        rc = 1;
        goto done;
    }
    const int V = m->hp.n_vocab;
    if (batch <= 0 || batch > n)
        batch = n;
    stage_params sp = { .n_ctx = n, .n_seq = 1, .n_batch = (int)batch,
                        .n_threads = (int)threads,
                        .precision = exact ? MATMUL_EXACT : MATMUL_FAST,
                        .kv_type = cli_cache_type(cache, exact) };
    if (stage_new(m, &sp, &s)) {
        rc = cli_error(NULL);
        goto done;
    }
    pos = rc_calloc((size_t)n, sizeof *pos);
    seq = rc_calloc((size_t)n, sizeof *seq);
    logits = rc_mallocarray((size_t)n * (size_t)V, sizeof *logits);
    if (!pos || !seq || !logits) {
        fprintf(stderr, "racimo: out of memory for %d rows of logits\n", n);
        goto done;
    }
    for (int i = 0; i < n; i++)
        pos[i] = i;
    for (int start = 0; start < n; start += (int)batch) {
        int len = n - start < batch ? n - start : (int)batch;
        stage_batch b = { .n_rows = len, .token = ids + start, .pos = pos + start, .seq = seq + start };
        if (stage_forward(s, &b, NULL, logits + (size_t)start * V, NULL)) {
            rc = cli_error("evaluating tokens");
            goto done;
        }
    }
    if (out_path) {
        if (!(out = fopen(out_path, "wb"))) {
            perror(out_path);
            goto done;
        }
        if (fwrite(logits, sizeof(float), (size_t)n * V, out) != (size_t)n * V || fclose(out)) {
            out = NULL;
            fprintf(stderr, "racimo: writing %s failed\n", out_path);
            goto done;
        }
        out = NULL;
        fprintf(stderr, "wrote %d x %d logits to %s\n", n, V, out_path);
    } else {
        for (int r = 0; r < n; r++) {
            const float *row = logits + (size_t)r * V;
            printf("pos %d token %d:", r, ids[r]);
            if (print_all) {
                for (int t = 0; t < V; t++)
                    printf(" %.6g", row[t]);
            } else {
                int top[5] = { -1, -1, -1, -1, -1 };
                for (int t = 0; t < V; t++)
                    for (int k = 0; k < 5; k++)
                        if (top[k] < 0 || row[t] > row[top[k]]) {
                            memmove(top + k + 1, top + k, (size_t)(4 - k) * sizeof(int));
                            top[k] = t;
                            break;
                        }
                for (int k = 0; k < 5 && top[k] >= 0; k++)
                    printf(" %d:%.4f", top[k], row[top[k]]);
            }
            printf("\n");
        }
    }
    rc = 0;
done:
    if (out)
        fclose(out);
    stage_free(s);
    model_free(m);
    rc_free(ids);
    rc_free(pos);
    rc_free(seq);
    rc_free(logits);
    return rc;
}
