/* tool_grammar.h - grammars that force tool calls in a model's own format.
 *
 * For the formats of tool_calls.h, a GBNF grammar whose sentences are one to
 * TOOL_GRAMMAR_MAX_CALLS calls written as the model's template taught it, each
 * naming one of the request's functions with arguments valid for that
 * function's `parameters` schema (json_schema.h; no parameters: any object):
 *   hermes    <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (repeated, "\n" between)
 *   llama3    {"name": ..., "parameters": {...}} (one call)
 *   mistral   [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or with a template
 *             that writes [ARGS]: [TOOL_CALLS]name[ARGS]{...} (repeated)
 *   deepseek  <｜tool▁calls▁begin｜> calls <｜tool▁calls▁end｜>, each call
 *             <｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1), or with a
 *             template that fences arguments (R1, V3):
 *             <｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```<｜tool▁call▁end｜>
 *   kimi      <|tool_calls_section_begin|> calls <|tool_calls_section_end|>, each call
 *             <|tool_call_begin|>functions.name:N<|tool_call_argument_begin|>{...}<|tool_call_end|>
 * Nothing may come before the first call or after the last (the model ends
 * there), but a thinking block when the model thinks (`reasoning`, enum
 * reasoning_mode: REASONING_AUTO, a <think>...</think> block may come first;
 * REASONING_OPEN, the prompt opened it, so the answer starts with the rest of
 * the block and its </think>), then up to 4 newlines or spaces.  The trigger is the text a format's calls start with, for a lazy
 * grammar (tool_choice auto): the model writes freely until it opens a call.
 * tool_calls_parse reads back every sentence of these grammars.
 */
#ifndef RC_API_TOOL_GRAMMAR_H
#define RC_API_TOOL_GRAMMAR_H

#include <jansson.h>

#define TOOL_GRAMMAR_MAX_CALLS 8

/* Builds the grammar for `format` (template_src picks the variant; reasoning
 * as above) over the
 * request's `tools` ([{"type": "function", "function": {"name", "parameters"}}]),
 * or only the one named `only` when it is not NULL.  0 with *gbnf
 * (rc_malloc'd) and *trigger (static text); RC_EINVAL with rc_errmsg() naming
 * the tool and the schema keyword it does not support, RC_ENOTFOUND when no
 * tool is named `only`, RC_EUNSUPPORTED for TOOLS_NONE, RC_ENOMEM. */
int tool_grammar_build(int format, const char *template_src, const json_t *tools, const char *only,
                       int reasoning, char **gbnf, const char **trigger);

#endif
