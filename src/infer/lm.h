/* lm.h - a language model as the text commands and the server use it: the
 * GGUF file, its weights (optional), its tokenizer and its chat template,
 * with the BOS/EOS texts templates ask for.  One loader for every caller.
 */
#ifndef RC_LM_H
#define RC_LM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "model/model.h"
#include "text/tokenizer.h"

typedef struct {
    gguf_file *file;        /* the file; owned by `m` once weights are bound */
    model *m;               /* NULL when opened without weights */
    tokenizer *tok;         /* points into the file's mapping */
    char *template_src;     /* the chat template in use */
    bool template_fallback; /* the model had none: ChatML is used */
    char *bos_text, *eos_text;
} lm;

/* Opens `path`: tokenizer and chat template always, the weights of every
 * layer when `weights`.  `template_override` (may be NULL) replaces the
 * model's template.  Errors name the file; *l is left closed. */
int  lm_open(lm *l, const char *path, bool weights, const char *template_override);
void lm_close(lm *l);                           /* accepts a zeroed lm */

/* Touches every page of the weights once, so the first request does not pay
 * for page faults; `progress` (may be NULL) is called with 0..1. */
void lm_prefault(const lm *l, void (*progress)(void *ctx, double done), void *ctx);

/* Renders OpenAI-format messages (and tools, may be NULL) with the template,
 * with the members of `vars` (an object or NULL, e.g. {"enable_thinking":
 * false}) as more variables; *out is rc_malloc'd.  Template errors return
 * negative with rc_errmsg(). */
int lm_render(const lm *l, const json_t *messages, const json_t *tools,
              bool add_generation_prompt, const json_t *vars, char **out);

/* Tokenizes a prompt: special-token text parsed when `special`, BOS added as
 * the vocabulary asks unless the text already starts with the BOS text (a
 * rendered template usually writes it).  *ids rc_malloc'd. */
int lm_tokenize(const lm *l, const char *text, bool special, int32_t **ids, size_t *n);

#endif
