/* cmd_run.c - `racimo run`: complete a prompt and stream the text. */
#include "cli.h"
#include "cli_model.h"
#include "base/err.h"
#include "base/mem.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static void usage(FILE *f)
{
    fprintf(f, "usage: racimo run -m MODEL -p PROMPT [options]\n"
               "\n"
               "Completes PROMPT (raw text, no chat template) and streams the text to\n"
               "stdout; speeds go to stderr.  Ctrl-C stops the generation.\n"
               "\n"
               "  -m, --model FILE       GGUF model\n"
               "  -p, --prompt TEXT      the prompt\n"
               "  -f, --file FILE        read the prompt from FILE\n"
               "  --no-bos               do not add the BOS token\n"
               "  --special              parse special-token text (<|eot_id|>...) in the prompt\n"
               "%s", cli_gen_opts_help);
}

static void print_text(gen_request *r, const char *text, size_t len)
{
    (void)r;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void done(gen_request *r, const gen_result *res)
{
    *(gen_result *)r->user = *res;
}

void cli_print_timings(const gen_result *res)
{
    int evaluated = res->n_prompt - res->n_cached;
    fprintf(stderr, "\nprompt: %d tokens (%d reused) in %.2f s, %.1f tokens/s\n", res->n_prompt,
            res->n_cached, res->t_prompt_s,
            res->t_prompt_s > 0 ? evaluated / res->t_prompt_s : 0.0);
    fprintf(stderr, "generation: %d tokens in %.2f s, %.1f tokens/s (%s, seed %llu)\n", res->n_gen,
            res->t_gen_s, res->t_gen_s > 0 && res->n_gen > 1 ? (res->n_gen - 1) / res->t_gen_s : 0.0,
            gen_finish_name(res->finish), (unsigned long long)res->seed);
}

int cmd_run(int argc, char **argv)
{
    const char *path = NULL, *prompt = NULL, *prompt_file = NULL;
    bool no_bos = false, special = false;
    cli_gen_opts o;
    cli_gen_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc, r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) path = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has) prompt = argv[++i];
        else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has) prompt_file = argv[++i];
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--special")) special = true;
        else if ((r = cli_gen_opt(&o, argc, argv, &i)) < 0) return 2;
        else if (r == 0) {
            fprintf(stderr, "racimo: run: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || (!prompt && !prompt_file)) {
        usage(stderr);
        return 2;
    }
    char *owned = NULL;
    if (prompt_file && !(prompt = owned = cli_read_file(prompt_file))) {
        fprintf(stderr, "racimo: cannot read prompt file %s\n", prompt_file);
        return 1;
    }
    lm cm;
    engine *e = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 1;
    if (cli_model_open(&cm, path, true, NULL)) {
        rc_free(owned);
        return 1;
    }
    if (tok_encode(cm.tok, prompt, strlen(prompt), !no_bos, special, &ids, &n_ids)) {
        cli_error("tokenizing the prompt");
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, "racimo: the prompt is empty\n");
        goto out;
    }
    if (cli_engine(&cm, &o, &e))
        goto out;
    gen_result res = { 0 };
    gen_request req = { .prompt = ids, .n_prompt = (int)n_ids, .sampling = o.sampling, .grammar = o.grammar,
                        .max_tokens = (int)o.n_predict, .stops = o.stops, .n_stops = o.n_stops,
                        .user = &res, .on_text = print_text, .on_done = done };
    if (engine_submit(e, &req)) {
        cli_error(NULL);
        goto out;
    }
    struct sigaction sa = { 0 };
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;      /* output writes restart; pselect still wakes */
    sigaction(SIGINT, &sa, NULL);
    int step;
    while ((step = engine_step(e)) > 0)
        if (interrupted)
            atomic_store(&req.cancel, true);
    if (step < 0 || res.finish == GEN_ERROR) {
        fprintf(stderr, "\nracimo: generation failed: %s\n", res.error[0] ? res.error : rc_errmsg());
        goto out;
    }
    fputc('\n', stdout);
    cli_print_timings(&res);
    rc = 0;
out:
    engine_free(e);
    rc_free(ids);
    lm_close(&cm);
    cli_gen_opts_free(&o);
    rc_free(owned);
    return rc;
}
