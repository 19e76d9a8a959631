/* tool_turns.h - assistant turns that made tool calls, in the shape a chat
 * template wants them.
 *
 * The request parser hands templates an assistant turn with calls as
 * content "" and each call's arguments as an object, which most templates
 * want (they write `arguments | tojson`).  DeepSeek's templates, written
 * for transformers, which passes OpenAI's messages as they come, test
 * `content is none` and concatenate the arguments as a string: given the
 * other shape, R1's drops the calls from the prompt and V3.1's fails.  A
 * probe render of each shape at load time finds the one a template writes
 * a call back from (as llama.cpp's template capabilities do), and the
 * messages of each request are adapted to it.  Pure functions; thread safe.
 */
#ifndef RC_API_TOOL_TURNS_H
#define RC_API_TOOL_TURNS_H

#include <jansson.h>

enum {
    TOOL_TURN_ARGS_STRING = 1,    /* arguments as a JSON string */
    TOOL_TURN_CONTENT_NULL = 2    /* an empty content as null */
};

/* The TOOL_TURN_* bits of the first shape the template renders a call's
 * arguments from, trying the parser's own shape (0) first; 0 when none
 * works (nothing to change). */
unsigned tool_turns_probe(const char *template_src);

/* messages with the assistant turns that have tool_calls in `shape`: 0 with
 * *out a new array (the caller decrefs), or NULL when nothing changes
 * (shape 0, no such turn); -1 when out of memory. */
int tool_turns_adapt(const json_t *messages, unsigned shape, json_t **out);

#endif
