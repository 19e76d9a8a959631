/* main.c - the racimo command: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: racimo <command> [options]\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "racimo: unknown command '%s'\n", argv[1]);
    return 2;
}
