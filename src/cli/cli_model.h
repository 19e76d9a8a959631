/* cli_model.h - loading a model for the text commands (on top of lm.h: the
 * progress line and one-line errors) and the generation options that run
 * and chat share. */
#ifndef RC_CLI_MODEL_H
#define RC_CLI_MODEL_H

#include <stdbool.h>
#include <jansson.h>

#include "infer/engine.h"
#include "infer/lm.h"

/* Opens `path` (see lm_open); with `weights` also touches every page once,
 * with a progress line on stderr for large files.  `template_file` (may be
 * NULL) is a Jinja file replacing the model's chat template.  Prints a
 * one-line error and returns nonzero on failure. */
int cli_model_open(lm *l, const char *path, bool weights, const char *template_file);

/* lm_render + lm_tokenize for a chat turn, printing errors; 0 on success. */
int cli_chat_prompt(const lm *l, const json_t *messages, const json_t *tools,
                    bool add_generation_prompt, int32_t **ids, size_t *n);

/* Sampling and limits shared by run and chat. */
typedef struct {
    sampler_params sampling;
    long n_predict;          /* -1 = until end or context full */
    long n_ctx;
    long n_threads;
    const char *stops[16];
    int n_stops;
    bool exact;
    int cache_type;          /* KV cache elements; -1 until --cache-type: f16, or f32
                                with --exact (cli_engine) */
    char *grammar;           /* --grammar-file's GBNF (checked), or NULL; owned */
} cli_gen_opts;

void cli_gen_opts_default(cli_gen_opts *o);
void cli_gen_opts_free(cli_gen_opts *o);

/* Consumes argv[*i] (and its value) if it is a generation option; returns
 * 1 if consumed, 0 if not one, -1 (after a message) if its value is bad. */
int cli_gen_opt(cli_gen_opts *o, int argc, char **argv, int *i);

/* Help lines for those options. */
extern const char cli_gen_opts_help[];

/* An engine of one sequence slot over a loaded model (for run and chat). */
int cli_engine(const lm *l, const cli_gen_opts *o, engine **out);

#endif
