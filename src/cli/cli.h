/* cli.h - the subcommands of the racimo binary and their shared helpers.
 * Each command is one file cmd_<name>.c with `int cmd_<name>(argc, argv)`
 * returning the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef RC_CLI_H
#define RC_CLI_H

#include <stdbool.h>
#include <stdint.h>

struct gen_result;

int cmd_logits(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_token(int argc, char **argv);
int cmd_nodes(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_instances(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_join(int argc, char **argv);

/* Prints "racimo: <msg>" for the current error detail and returns 1. */
int cli_error(const char *what);

/* Strict integer parsing: the whole string must be a number in [lo, hi]. */
int cli_parse_int(const char *s, long lo, long hi, long *out);

/* A byte size: a number (decimals allowed) and an optional unit: K, M, G,
 * T, KiB..TiB (powers of 1024) or KB..TB (powers of 1000), any case, e.g.
 * 8G, 512M, 1.5GiB, 2000000000.  Must be at least 1 byte and below 2^63.
 * Returns 0, or -1 (the caller names the option in its message). */
int cli_parse_size(const char *s, uint64_t *out);

/* --cache-type's value (f32, f16 or q8_0, tensor/kv_types.h) into *type;
 * -1 after "racimo: CMD: --cache-type takes ..." on stderr otherwise. */
int cli_parse_cache_type(const char *cmd, const char *v, int *type);

/* The cache type to use: the one --cache-type gave (given >= 0), else f32
 * for --exact (the reference path), else the default, f16. */
int cli_cache_type(int given, bool exact);

/* Parses "1,2,3" into a malloc'd array; returns count, or -1 with a message. */
int cli_parse_ids(const char *s, int32_t **out);

/* Prints prompt and generation speed of a finished request to stderr. */
void cli_print_timings(const struct gen_result *res);

/* A whole file as a NUL-terminated rc_malloc'd string; NULL if unreadable. */
char *cli_read_file(const char *path);

/* Default thread count: the physical cores. */
int cli_default_threads(void);

#endif
