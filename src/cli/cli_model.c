/* cli_model.c - loading a model for the text commands; generation options. */
#include "cli_model.h"
#include "cli.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "grammar/grammar.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { const char *path; uint64_t t0; } progress_ctx;

static void show_progress(void *arg, double done)
{
    progress_ctx *p = arg;
    if (done < 1.0)
        fprintf(stderr, "\rloading %s: %3.0f%%", p->path, 100.0 * done);
    else
        fprintf(stderr, "\rloading %s: done in %.1f s\n", p->path,
                (double)(os_now_ns() - p->t0) * 1e-9);
}

int cli_model_open(lm *l, const char *path, bool weights, const char *template_file)
{
    char *tpl = NULL;
    if (template_file && !(tpl = cli_read_file(template_file))) {
        fprintf(stderr, "racimo: cannot read chat template %s\n", template_file);
        return 1;
    }
    int rc = lm_open(l, path, weights, tpl);
    rc_free(tpl);
    if (rc)
        return cli_error(NULL);
    if (weights) {
        progress_ctx p = { path, os_now_ns() };
        bool show = l->file->size_bytes > ((uint64_t)256 << 20) && isatty(2);
        lm_prefault(l, show ? show_progress : NULL, &p);
    }
    return 0;
}

int cli_chat_prompt(const lm *l, const json_t *messages, const json_t *tools,
                    bool add_generation_prompt, int32_t **ids, size_t *n)
{
    char *text = NULL;
    if (lm_render(l, messages, tools, add_generation_prompt, NULL, &text)) {
        fprintf(stderr, "racimo: chat template: %s\n", rc_errmsg());
        return 1;
    }
    int rc = lm_tokenize(l, text, true, ids, n);
    rc_free(text);
    return rc ? cli_error("tokenizing") : 0;
}

void cli_gen_opts_default(cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    sampler_params_default(&o->sampling);
    o->n_predict = -1;
    o->n_ctx = 4096;
    o->n_threads = cli_default_threads();
    o->cache_type = -1;
}

const char cli_gen_opts_help[] =
    "  -n, --n-predict N      tokens to generate (default: until the end or a full context)\n"
    "  -c, --ctx-size N       context length in tokens (default 4096, at most the model's)\n"
    "  -t, --threads N        threads (default: physical cores)\n"
    "  --temp T               temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K              (default 40; 0 = off)\n"
    "  --top-p P              (default 0.95; 1 = off)\n"
    "  --min-p P              (default 0.05; 0 = off)\n"
    "  --repeat-penalty R     (default 1 = off)\n"
    "  --repeat-last-n N      (default 64)\n"
    "  --presence-penalty P   --frequency-penalty F   (default 0)\n"
    "  --seed N               (default: random; printed with the timings)\n"
    "  --stop TEXT            stop before TEXT (repeatable)\n"
    "  --exact                f32 activations on decoded weights and an f32 KV cache\n"
    "                         (slow reference path)\n"
    "  --grammar-file F       the output must match the GBNF grammar in F (llama.cpp's\n"
    "                         format; root rule `root`)\n"
    "  --cache-type T         KV cache elements: f16 (default, as llama.cpp), q8_0 (a\n"
    "                         little over half of f16) or f32\n"
    "  --chat-template-file F use the Jinja template in F instead of the model's\n";

static int want_float(const char *opt, const char *v, float lo, float hi, float *out)
{
    char *end;
    float f = strtof(v, &end);
    if (!*v || *end || !(f >= lo && f <= hi)) {
        fprintf(stderr, "racimo: %s wants a number from %g to %g, not '%s'\n", opt, lo, hi, v);
        return -1;
    }
    *out = f;
    return 1;
}

static int want_long(const char *opt, const char *v, long lo, long hi, long *out)
{
    if (cli_parse_int(v, lo, hi, out)) {
        fprintf(stderr, "racimo: %s wants a whole number from %ld to %ld, not '%s'\n", opt, lo, hi, v);
        return -1;
    }
    return 1;
}

/* Reads and compiles a GBNF file, so that a mistake is told before the
 * model loads. */
static int read_grammar(cli_gen_opts *o, const char *path)
{
    char *text = cli_read_file(path);
    if (!text) {
        fprintf(stderr, "racimo: cannot read the grammar file %s: %s\n", path, strerror(errno));
        return -1;
    }
    grammar *g = NULL;
    if (grammar_compile(text, strlen(text), &g)) {
        fprintf(stderr, "racimo: %s: %s\n", path, rc_errmsg());
        rc_free(text);
        return -1;
    }
    grammar_free(g);
    rc_free(o->grammar);
    o->grammar = text;
    return 1;
}

void cli_gen_opts_free(cli_gen_opts *o)
{
    rc_free(o->grammar);
    o->grammar = NULL;
}

int cli_gen_opt(cli_gen_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    sampler_params *s = &o->sampling;
    long l;
    int r;
#define TAKE(expr) do { if (!v) { fprintf(stderr, "racimo: %s needs a value\n", a); return -1; } \
                        (*i)++; r = (expr); return r; } while (0)
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) TAKE(want_long(a, v, -1, 1L << 30, &o->n_predict));
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) TAKE(want_long(a, v, 8, 1L << 22, &o->n_ctx));
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) TAKE(want_long(a, v, 1, 512, &o->n_threads));
    if (!strcmp(a, "--temp")) TAKE(want_float(a, v, 0.0f, 100.0f, &s->temperature));
    if (!strcmp(a, "--top-p")) TAKE(want_float(a, v, 0.0f, 1.0f, &s->top_p));
    if (!strcmp(a, "--min-p")) TAKE(want_float(a, v, 0.0f, 1.0f, &s->min_p));
    if (!strcmp(a, "--repeat-penalty")) TAKE(want_float(a, v, 0.0f, 100.0f, &s->repeat_penalty));
    if (!strcmp(a, "--presence-penalty")) TAKE(want_float(a, v, -2.0f, 2.0f, &s->presence_penalty));
    if (!strcmp(a, "--frequency-penalty")) TAKE(want_float(a, v, -2.0f, 2.0f, &s->frequency_penalty));
    if (!strcmp(a, "--top-k")) {
        TAKE((r = want_long(a, v, 0, 1L << 24, &l)) > 0 ? (s->top_k = (int)l, 1) : r);
    }
    if (!strcmp(a, "--repeat-last-n")) {
        TAKE((r = want_long(a, v, -1, 1L << 24, &l)) > 0 ? (s->repeat_last_n = (int)l, 1) : r);
    }
    if (!strcmp(a, "--seed")) {
        char *end;
        if (!v) { fprintf(stderr, "racimo: --seed needs a value\n"); return -1; }
        unsigned long long seed = strtoull(v, &end, 10);
        if (!*v || *end) { fprintf(stderr, "racimo: --seed wants a number\n"); return -1; }
        s->seed = seed;
        (*i)++;
        return 1;
    }
    if (!strcmp(a, "--stop")) {
        if (!v) { fprintf(stderr, "racimo: --stop needs a value\n"); return -1; }
        if (o->n_stops >= 16) { fprintf(stderr, "racimo: at most 16 --stop strings\n"); return -1; }
        o->stops[o->n_stops++] = v;
        (*i)++;
        return 1;
    }
    if (!strcmp(a, "--cache-type")) {
        if (!v) { fprintf(stderr, "racimo: --cache-type needs a value\n"); return -1; }
        (*i)++;
        return cli_parse_cache_type(argv[0], v, &o->cache_type) ? -1 : 1;
    }
    if (!strcmp(a, "--exact")) {
        o->exact = true;
        return 1;
    }
    if (!strcmp(a, "--grammar-file")) {
        if (!v) { fprintf(stderr, "racimo: --grammar-file needs a value\n"); return -1; }
        (*i)++;
        return read_grammar(o, v);
    }
#undef TAKE
    return 0;
}

int cli_engine(const lm *l, const cli_gen_opts *o, engine **out)
{
    long n_ctx = o->n_ctx;
    if (l->m->hp.n_ctx_train > 0 && n_ctx > l->m->hp.n_ctx_train)
        n_ctx = l->m->hp.n_ctx_train;
    engine_params ep = { .n_ctx = (int)n_ctx, .n_seq = 1, .n_batch = 512,
                         .n_threads = (int)o->n_threads, .max_queue = 1,
                         .precision = o->exact ? MATMUL_EXACT : MATMUL_FAST,
                         .kv_type = cli_cache_type(o->cache_type, o->exact) };
    if (ep.n_batch > ep.n_ctx)
        ep.n_batch = ep.n_ctx;
    if (engine_new(l->m, l->tok, &ep, out))
        return cli_error(NULL);
    return 0;
}
