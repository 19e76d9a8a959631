/* chat_template.c - apply_chat_template's variables on top of the Jinja engine (src/jinja).
 *
 * Builds the variable list (extra variables first, so the named arguments
 * override them) and renders once.  Nothing is cached: a server that
 * renders the same template often can keep a jinja_template itself.
 */
#include "text/chat_template.h"

#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "jinja/jinja.h"

int chat_template_render(const char *template_src, const json_t *messages,
                         const json_t *tools, bool add_generation_prompt,
                         const char *bos_token, const char *eos_token,
                         const json_t *extra_vars, char **out)
{
    jinja_template *tpl = NULL;
    jinja_var *vars = NULL;
    json_t *bos = NULL, *eos = NULL;
    size_t n = 0;
    int rc;

    *out = NULL;
    if (!template_src || !messages)
        return rc_fail(RC_EINVAL, "chat_template_render: template and messages are required");
    if (extra_vars && !json_is_object(extra_vars))
        return rc_fail(RC_EINVAL, "chat_template_render: extra_vars must be a JSON object");
    if (bos_token && !(bos = json_string(bos_token)))
        return rc_fail(RC_EINVAL, "chat_template_render: bos_token is not valid UTF-8");
    if (eos_token && !(eos = json_string(eos_token))) {
        rc = rc_fail(RC_EINVAL, "chat_template_render: eos_token is not valid UTF-8");
        goto done;
    }
    size_t n_extra = extra_vars ? json_object_size(extra_vars) : 0;
    vars = rc_calloc(n_extra + 5, sizeof *vars);
    if (!vars) {
        rc = rc_fail(RC_ENOMEM, "MemoryError: out of memory");
        goto done;
    }
    if (extra_vars) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)extra_vars, key, val) {
            vars[n].name = key;
            vars[n++].value = val;
        }
    }
    vars[n].name = "messages";
    vars[n++].value = messages;
    vars[n].name = "tools";
    vars[n++].value = tools ? tools : json_null();
    vars[n].name = "add_generation_prompt";
    vars[n++].value = add_generation_prompt ? json_true() : json_false();
    vars[n].name = "bos_token";
    vars[n++].value = bos;
    vars[n].name = "eos_token";
    vars[n++].value = eos;

    if ((rc = jinja_parse(template_src, strlen(template_src), &tpl)) < 0)
        goto done;
    rc = jinja_render(tpl, vars, n, NULL, out, NULL);
done:
    jinja_free(tpl);
    rc_free(vars);
    json_decref(bos);
    json_decref(eos);
    return rc;
}
