/* cmd_template.c - `racimo template`: print exactly the text a model sees
 * for OpenAI-format messages, rendered with its chat template. */
#include "cli.h"
#include "cli_model.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: racimo template -m MODEL --messages FILE [--tools FILE]\n"
               "                       [--no-generation-prompt] [--chat-template-file FILE]\n"
               "\n"
               "  --messages FILE   a JSON array of OpenAI chat messages ('-' reads stdin)\n"
               "  --tools FILE      a JSON array of OpenAI tools\n"
               "  --no-generation-prompt  do not open the assistant's turn\n"
               "  --chat-template-file F  render with the Jinja template in F\n");
}

static json_t *load_json(const char *path, const char *what)
{
    json_error_t err;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, 0, &err) : json_load_file(path, 0, &err);
    if (!j) {
        fprintf(stderr, "racimo: %s %s: %s (line %d, column %d)\n", what, path, err.text, err.line,
                err.column);
        return NULL;
    }
    if (!json_is_array(j)) {
        fprintf(stderr, "racimo: %s %s: expected a JSON array\n", what, path);
        json_decref(j);
        return NULL;
    }
    return j;
}

int cmd_template(int argc, char **argv)
{
    const char *path = NULL, *messages_path = NULL, *tools_path = NULL, *template_file = NULL;
    bool gen_prompt = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) path = argv[++i];
        else if (!strcmp(a, "--messages") && has) messages_path = argv[++i];
        else if (!strcmp(a, "--tools") && has) tools_path = argv[++i];
        else if (!strcmp(a, "--chat-template-file") && has) template_file = argv[++i];
        else if (!strcmp(a, "--no-generation-prompt")) gen_prompt = false;
        else {
            fprintf(stderr, "racimo: template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || !messages_path) {
        usage(stderr);
        return 2;
    }
    json_t *messages = load_json(messages_path, "messages");
    json_t *tools = NULL;
    if (!messages || (tools_path && !(tools = load_json(tools_path, "tools")))) {
        json_decref(messages);
        return 1;
    }
    lm cm;
    int rc = 1;
    if (!cli_model_open(&cm, path, false, template_file)) {
        char *text = NULL;
        if (lm_render(&cm, messages, tools, gen_prompt, NULL, &text) == 0) {
            fputs(text, stdout);
            rc = 0;
        } else {
            fprintf(stderr, "racimo: chat template: %s\n", rc_errmsg());
        }
        rc_free(text);
        lm_close(&cm);
    }
    json_decref(messages);
    json_decref(tools);
    return rc;
}
