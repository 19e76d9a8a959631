/* cmd_tokenize.c - `racimo tokenize` and `racimo detokenize`: the tools for
 * seeing exactly which tokens a text becomes, and back.  Only the
 * vocabulary is read, so vocabulary-only GGUF files work too. */
#include "cli.h"
#include "cli_model.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"

#include <stdio.h>
#include <string.h>

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text = NULL;
    char *owned = NULL;
    bool bos = true, special = false, json = false, pieces = false, count = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: racimo tokenize -m MODEL [--no-bos] [--special] [--json] [--pieces] TEXT|-f FILE\n"
                   "  -f FILE    tokenize the contents of FILE\n"
                   "  --count    print only the number of tokens and the time taken (stderr)\n"
                   "  --no-bos   do not add BOS (or EOS) as the vocabulary would\n"
                   "  --special  match special-token text such as <|eot_id|> in TEXT\n"
                   "  --json     print a JSON array of ids\n"
                   "  --pieces   print each id with the text it stands for\n");
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--no-bos")) bos = false;
        else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--pieces")) pieces = true;
        else if (!strcmp(a, "--count")) count = true;
        else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && i + 1 < argc && !text) {
            if (!(owned = cli_read_file(argv[++i]))) {
                fprintf(stderr, "racimo: cannot read %s\n", argv[i]);
                return 1;
            }
            text = owned;
        }
        else if (!text && a[0] != '-') text = a;
        else {
            fprintf(stderr, "racimo: tokenize: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!path || !text) {
        fprintf(stderr, "usage: racimo tokenize -m MODEL [--no-bos] [--special] [--json] TEXT|-f FILE\n");
        rc_free(owned);
        return 2;
    }
    lm cm;
    if (cli_model_open(&cm, path, false, NULL)) {
        rc_free(owned);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    uint64_t t0 = os_now_ns();
    if (tok_encode(cm.tok, text, strlen(text), bos, special, &ids, &n)) {
        rc = cli_error("tokenize");
    } else if (count) {
        double s = (double)(os_now_ns() - t0) * 1e-9;
        printf("%zu\n", n);
        fprintf(stderr, "%zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", strlen(text), n, s,
                s > 0 ? (double)strlen(text) / s / 1e6 : 0.0);
    } else if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        char *s = json_dumps(arr, JSON_COMPACT);
        printf("%s\n", s ? s : "[]");
        free(s);
        json_decref(arr);
    } else {
        char piece[1024];
        for (size_t i = 0; i < n; i++) {
            if (pieces) {
                int len = tok_piece(cm.tok, ids[i], true, piece, sizeof piece);
                printf("%6d '%.*s'\n", ids[i], len < 0 ? 0 : len > (int)sizeof piece ? (int)sizeof piece : len,
                       piece);
            } else {
                printf("%s%d", i ? " " : "", ids[i]);
            }
        }
        if (!pieces)
            printf("\n");
    }
    rc_free(ids);
    rc_free(owned);
    lm_close(&cm);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *path = NULL, *list = NULL;
    bool special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: racimo detokenize -m MODEL [--special] IDS\n"
                   "  IDS        comma- or space-separated token ids (a JSON array works too)\n"
                   "  --special  render control tokens as their text\n");
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--special")) special = true;
        else if (!list) list = a;
        else {
            fprintf(stderr, "racimo: detokenize: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!path || !list) {
        fprintf(stderr, "usage: racimo detokenize -m MODEL [--special] IDS\n");
        return 2;
    }
    /* Accept "1,2,3", "1 2 3" and "[1, 2, 3]". */
    char *norm = rc_strdup(list);
    if (!norm)
        return 1;
    size_t w = 0;
    for (size_t r = 0; norm[r]; r++) {
        char c = norm[r];
        if (c == '[' || c == ']')
            continue;
        if (c == ' ' || c == '\t' || c == '\n')
            c = ',';
        if (c == ',' && (w == 0 || norm[w - 1] == ','))
            continue;
        norm[w++] = c;
    }
    while (w && norm[w - 1] == ',')
        w--;
    norm[w] = '\0';
    int32_t *ids = NULL;
    int n = cli_parse_ids(norm, &ids);
    rc_free(norm);
    if (n < 0)
        return 2;
    lm cm;
    if (cli_model_open(&cm, path, false, NULL)) {
        rc_free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = 0;
    if (tok_decode(cm.tok, ids, (size_t)n, special, &text, &len))
        rc = cli_error("detokenize");
    else {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
    }
    rc_free(text);
    rc_free(ids);
    lm_close(&cm);
    return rc;
}
