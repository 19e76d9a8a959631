/* reasoning.h - thinking blocks in generated text.
 *
 * Models that think before they answer (DeepSeek-R1 and its distills,
 * DeepSeek-V3.1 in thinking mode, Qwen3, Kimi K2 Thinking) write
 * <think>...</think> first; their chat templates say so by handling
 * "</think>".  Some templates open the block themselves at the end of the
 * prompt (R1's generation prompt ends with "<think>\n"): the answer then
 * starts inside the block and only "</think>" is written.
 *
 * A splitter takes the answer piece by piece and appends each byte to the
 * reasoning or to the content, as llama.cpp's server does for
 * reasoning_content: a block counts only at the start of the answer
 * (after whitespace); the reasoning is trimmed of surrounding whitespace
 * and so is the start of the content after "</think>"; an answer that ends
 * inside the block is all reasoning.  Bytes that may still turn out to be
 * a marker (a trailing "<thi"), or whitespace that may be trimmed, are held
 * until the next piece or the end decides them, so a stream sends the same
 * text as a whole answer, in the same split.
 *
 * Template facts (whether it thinks, which switch variables it reads) are
 * found in its source, like tool-call formats (tool_calls.h).  All of this
 * is pure text processing; a splitter is used by one thread at a time.
 */
#ifndef RC_API_REASONING_H
#define RC_API_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "buf.h"

#define REASONING_OPEN_TAG  "<think>"
#define REASONING_CLOSE_TAG "</think>"

/* How a splitter starts. */
enum reasoning_mode {
    REASONING_NONE,   /* no parsing: everything is content */
    REASONING_AUTO,   /* a block may open at the start of the answer */
    REASONING_OPEN    /* the prompt opened the block: the answer starts in it */
};

typedef struct {
    int state;        /* internal (reasoning.c) */
    strbuf held;      /* bytes not yet known to be reasoning or content */
} reasoning_split;

void reasoning_init(reasoning_split *r, int mode);
/* Appends the decided part of text[0..len) to *reasoning and *content. */
void reasoning_push(reasoning_split *r, const char *text, size_t len, strbuf *reasoning,
                    strbuf *content);
/* At the end of the answer: decides what was held. */
void reasoning_finish(reasoning_split *r, strbuf *reasoning, strbuf *content);
void reasoning_free(reasoning_split *r);          /* accepts a zeroed splitter */

/* Whether the rendered prompt ends inside an open block (its tail, spaces
 * aside, is the opening tag). */
bool reasoning_prompt_open(const char *prompt, size_t len);

/* Whether a chat template's model thinks in <think> blocks. */
bool reasoning_template_thinks(const char *template_src);

/* The template variables that switch thinking on and off, as bits. */
enum {
    REASONING_VAR_ENABLE_THINKING = 1,   /* Qwen3: enable_thinking */
    REASONING_VAR_THINKING = 2           /* DeepSeek-V3.1: thinking */
};
unsigned reasoning_template_switches(const char *template_src);

/* Sets each switch variable of `switches` to `on` in *vars (an object,
 * created when NULL).  0, or -1 when out of memory. */
int reasoning_set_switches(unsigned switches, bool on, json_t **vars);

#endif
