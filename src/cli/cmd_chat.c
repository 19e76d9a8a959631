/* cmd_chat.c - `racimo chat`: an interactive conversation in the terminal.
 *
 * Each turn renders the whole conversation with the model's chat template
 * and submits it; the engine reuses the KV cache of the previous turns (the
 * prompt shares their tokens as a prefix), so only the new turn is
 * evaluated.  Ctrl-C stops the answer being written; Ctrl-D or /bye quits. */
#include "cli.h"
#include "cli_model.h"
#include "base/err.h"
#include "base/mem.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static void usage(FILE *f)
{
    fprintf(f, "usage: racimo chat -m MODEL [--system TEXT] [options]\n"
               "\n"
               "Talk to the model.  Enter sends a line; Ctrl-C stops the current answer;\n"
               "Ctrl-D or /bye quits; /clear starts a new conversation.\n"
               "\n"
               "  -m, --model FILE       GGUF model\n"
               "  --system TEXT          system message\n"

               "%s", cli_gen_opts_help);
}

typedef struct {
    char *buf;
    size_t len, cap;
    gen_result res;
} answer;

static void on_text(gen_request *r, const char *text, size_t len)
{
    answer *a = r->user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (a->len + len + 1 > a->cap) {
        size_t cap = (a->cap + len + 1) * 2;
        char *nb = rc_realloc(a->buf, cap);
        if (!nb)
            return;
        a->buf = nb;
        a->cap = cap;
    }
    memcpy(a->buf + a->len, text, len);
    a->len += len;
    a->buf[a->len] = '\0';
}

static void on_done(gen_request *r, const gen_result *res)
{
    ((answer *)r->user)->res = *res;
}

static json_t *message(const char *role, const char *content)
{
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Reads one line; NULL at end of input.  A Ctrl-C at the prompt clears the
 * line instead of quitting.  SIGINT stays blocked except inside pselect, so
 * a Ctrl-C that lands between printing the prompt and waiting for input is
 * not lost. */
static char *read_line(char *buf, size_t cap)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    for (;;) {
        sigprocmask(SIG_BLOCK, &block, &old);
        if (interrupted) {           /* Ctrl-C just before the prompt */
            interrupted = 0;
            sigprocmask(SIG_SETMASK, &old, NULL);
            fputs("\n(Ctrl-D or /bye quits)\n", stdout);
            continue;
        }
        fputs("> ", stdout);
        fflush(stdout);
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(0, &rd);
        int r = pselect(1, &rd, NULL, NULL, NULL, &old);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (r < 0 && errno == EINTR && interrupted) {
            interrupted = 0;
            fputs("\n(Ctrl-D or /bye quits)\n", stdout);
            continue;
        }
        if (r < 0)
            return NULL;
        if (fgets(buf, (int)cap, stdin))
            return buf;
        if (ferror(stdin) && errno == EINTR && interrupted) {
            clearerr(stdin);
            fputs("\n(Ctrl-D or /bye quits)\n", stdout);
            continue;
        }
        return NULL;
    }
}

int cmd_chat(int argc, char **argv)
{
    const char *path = NULL, *system_msg = NULL, *template_file = NULL;
    cli_gen_opts o;
    cli_gen_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc, r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) path = argv[++i];
        else if (!strcmp(a, "--system") && has) system_msg = argv[++i];
        else if (!strcmp(a, "--chat-template-file") && has) template_file = argv[++i];
        else if ((r = cli_gen_opt(&o, argc, argv, &i)) < 0) return 2;
        else if (r == 0) {
            fprintf(stderr, "racimo: chat: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    lm cm;
    engine *e = NULL;
    json_t *messages = json_array();
    int rc = 1;
    if (cli_model_open(&cm, path, true, template_file)) {
        json_decref(messages);
        return 1;
    }
    if (cm.template_fallback)
        fprintf(stderr, "racimo: the model has no chat template; using ChatML\n");
    if (cli_engine(&cm, &o, &e))
        goto out;
    /* Ctrl-C at the prompt wakes pselect (never restarted); during an
     * answer it only sets the flag the engine loop polls. */
    struct sigaction sa = { 0 };
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;      /* output writes restart; pselect still wakes */
    sigaction(SIGINT, &sa, NULL);
    if (system_msg)
        json_array_append_new(messages, message("system", system_msg));
    size_t base_len = json_array_size(messages);
    char line[65536];
    while (read_line(line, sizeof line)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strcmp(line, "/bye") || !strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/clear")) {
            while (json_array_size(messages) > base_len)
                json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        if (!line[0])
            continue;
        json_array_append_new(messages, message("user", line));
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (cli_chat_prompt(&cm, messages, NULL, true, &ids, &n_ids)) {
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        answer ans = { 0 };
        gen_request req = { .prompt = ids, .n_prompt = (int)n_ids, .sampling = o.sampling, .grammar = o.grammar,
                            .max_tokens = (int)o.n_predict, .stops = o.stops,
                            .n_stops = o.n_stops, .user = &ans, .on_text = on_text,
                            .on_done = on_done };
        if (engine_submit(e, &req)) {
            fprintf(stderr, "racimo: %s\n", rc_errmsg());
            rc_free(ids);
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        int step;
        while ((step = engine_step(e)) > 0)
            if (interrupted)
                atomic_store(&req.cancel, true);
        rc_free(ids);
        fputc('\n', stdout);
        if (step < 0 || ans.res.finish == GEN_ERROR) {
            fprintf(stderr, "racimo: generation failed: %s\n", ans.res.error);
            json_array_remove(messages, json_array_size(messages) - 1);
            rc_free(ans.buf);
            continue;
        }
        if (ans.res.finish == GEN_CANCELLED)
            fputs("(stopped)\n", stdout);
        cli_print_timings(&ans.res);          /* on stderr, after every answer */
        json_array_append_new(messages, message("assistant", ans.buf ? ans.buf : ""));
        rc_free(ans.buf);
    }
    fputc('\n', stdout);
    rc = 0;
out:
    engine_free(e);
    lm_close(&cm);
    cli_gen_opts_free(&o);
    json_decref(messages);
    return rc;
}
