/* chat_template.h - rendering a Hugging Face chat template.
 *
 * The one call a server needs to turn an OpenAI-style conversation into the
 * prompt text a model expects, with the variables and conventions of
 * transformers' apply_chat_template (see jinja/jinja.h for the engine).
 */
#ifndef RC_CHAT_TEMPLATE_H
#define RC_CHAT_TEMPLATE_H

#include <stdbool.h>

#include <jansson.h>

/* Renders `template_src` (NUL-terminated UTF-8) with the variables
 *   messages               the OpenAI-format array (required),
 *   tools                  a JSON array, or NULL which the template sees
 *                          as None (as transformers passes it),
 *   add_generation_prompt  a bool,
 *   bos_token, eos_token   strings, or NULL to leave them undefined,
 * plus every member of `extra_vars` (a JSON object or NULL), e.g.
 * {"enable_thinking": false}; the named arguments win over extra_vars
 * members of the same name.  The inputs are only read.
 *
 * On success returns 0 and *out is a NUL-terminated string owned by the
 * caller (rc_free).  On failure returns a negative code, *out is NULL and
 * rc_errmsg() describes the problem like the Python exception would:
 *   RC_EINVAL   the template raised: "TemplateError: <message>" for
 *               raise_exception(message) (nothing appended), or a run-time
 *               error such as "TypeError: 'NoneType' object is not
 *               iterable (template line 57)"
 *   RC_EFORMAT  syntax error: "TemplateSyntaxError: ... (line L, column C)"
 *   RC_ELIMIT   the template exceeded a size, time or depth limit
 *   RC_ENOMEM   out of memory
 * Thread safe. */
int chat_template_render(const char *template_src, const json_t *messages,
                         const json_t *tools, bool add_generation_prompt,
                         const char *bos_token, const char *eos_token,
                         const json_t *extra_vars, char **out);

#endif
