/* tool_calls.h - finding tool calls in generated text.
 *
 * Chat templates that support tools teach the model one way to write a
 * call; the format is recognised from the template's source:
 *   TOOLS_HERMES   Hermes, Qwen2.5, Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
 *                  (any number, text around them is content)
 *   TOOLS_LLAMA3   Llama 3.1/3.2/3.3: the whole answer is {"name": ..., "parameters": {...}}
 *                  (or a list of such objects)
 *   TOOLS_MISTRAL  Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or the
 *                  newer [TOOL_CALLS]name[ARGS]{...}.  [TOOL_CALLS] is usually a control
 *                  token, which produces no text: the caller says whether it was
 *                  generated (`marker`).
 *   TOOLS_DEEPSEEK DeepSeek V3/R1/V3.1: <｜tool▁calls▁begin｜> then calls
 *                  <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1) or
 *                  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
 *                  <｜tool▁call▁end｜> (R1, V3-0324), then <｜tool▁calls▁end｜>
 *   TOOLS_KIMI     Kimi K2: <|tool_calls_section_begin|> then calls
 *                  <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
 *                  <|tool_call_end|>, then <|tool_calls_section_end|>; the call's id is
 *                  functions.NAME:IDX
 *                  The markers of these two are control tokens in their vocabularies:
 *                  tool_format_markers lists them so that the engine writes their text.
 * Templates of other families get no parsing: the answer is content.
 *
 * Calls come back normalised as [{"type": "function", "function": {"name": string,
 * "arguments": object}}, ...] (plus "id" when the model wrote one); the
 * OpenAI writer turns arguments into a JSON string, Ollama's keeps the
 * object.  Pure functions over text; thread safe.
 */
#ifndef RC_API_TOOL_CALLS_H
#define RC_API_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

enum tool_format { TOOLS_NONE, TOOLS_HERMES, TOOLS_LLAMA3, TOOLS_MISTRAL, TOOLS_DEEPSEEK,
                   TOOLS_KIMI };

/* The format a chat template's source defines (TOOLS_NONE if none). */
int tool_format_detect(const char *template_src);
const char *tool_format_name(int format);

/* The marker texts a format's calls are made of (NULL-terminated list; an
 * empty one for formats without such markers), for the vocabulary look-up
 * of the ones that are control tokens. */
const char *const *tool_format_markers(int format);

/* Parses an answer.  Returns the number of calls found (> 0) with *calls
 * (a new array) and *content (rc_malloc'd text outside the calls, maybe
 * empty); 0 when the answer holds no well-formed call (nothing is set);
 * negative on allocation failure. */
int tool_calls_parse(int format, bool marker, const char *text, size_t len, json_t **calls,
                     char **content);

/* Streaming: how many leading bytes of the answer so far can be sent as
 * content now; the rest might be (the start of) a tool call and is held
 * until the answer ends.  `len` is the whole answer so far. */
size_t tool_calls_safe_prefix(int format, bool marker, const char *text, size_t len);

#endif
