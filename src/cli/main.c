/* main.c - the racimo command: dispatches to one subcommand per file. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    { "run",        cmd_run,        "complete a prompt, streaming the text" },
    { "chat",       cmd_chat,       "talk with a model in the terminal" },
    { "tokenize",   cmd_tokenize,   "print the token ids of a text" },
    { "detokenize", cmd_detokenize, "print the text of token ids" },
    { "serve",      cmd_serve,      "serve OpenAI- and Ollama-compatible HTTP APIs to many users" },
    { "nodes",      cmd_nodes,      "list the nodes and links of the cluster a running server is in" },
    { "plan",       cmd_plan,       "show which nodes would run which layers of a model" },
    { "instances",  cmd_instances,  "start, stop and list the models a running node serves" },
    { "ls",         cmd_ls,         "list every model of the cluster: node, size, type, sha256" },
    { "rm",         cmd_rm,         "delete a model from a running node's models folder" },
    { "pull",       cmd_pull,       "download a GGUF model from Hugging Face into the models folder" },
    { "token",      cmd_token,      "print this node's cluster join token" },
    { "template",   cmd_template,   "print the prompt a model sees for chat messages" },
    { "logits",     cmd_logits,     "compute the logits of token ids with a GGUF model" },
    { "bench",      cmd_bench,      "measure prompt and generation speed against the bandwidth roof" },
    { "join",       cmd_join,       "join the parts of a split GGUF model into one file" },
    { "make-model", cmd_make_model, "write a random-weight GGUF model (tests, benchmarks)" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: racimo <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'racimo <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "racimo: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
