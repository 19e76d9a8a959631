/* request_grammar.c - a request's grammar: the `grammar` field, and the
 * entry points that give a request one made elsewhere (from a JSON schema,
 * from the tools), each checked by compiling it at the head, so that a bad
 * grammar is the client's 400 and never reaches a stage. */
#include "request.h"
#include "base/err.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "infer/exec.h"

#include <string.h>

_Static_assert(API_MAX_TRIGGERS <= EXEC_MAX_TRIGGERS, "a request's triggers must fit a start");

int api_request_set_grammar(api_request *r, const char *gbnf, size_t len, const char *param,
                            api_error *e)
{
    if (memchr(gbnf, 0, len))
        return api_fail(e, 400, "invalid_value", param, "'%s' holds a NUL character", param);
    grammar *g = NULL;
    if (grammar_compile(gbnf, len, &g))
        return api_fail(e, 400, "invalid_value", param, "'%s' is not a valid GBNF grammar: %s",
                        param, rc_errmsg());
    grammar_free(g);
    char *copy = rc_strndup(gbnf, len);
    if (!copy)
        return api_fail(e, 500, "out_of_memory", param, "out of memory");
    rc_free(r->grammar);
    r->grammar = copy;
    return 0;
}

int api_request_add_trigger(api_request *r, const char *trigger, size_t len, const char *param,
                            api_error *e)
{
    if (r->n_grammar_triggers >= API_MAX_TRIGGERS)
        return api_fail(e, 400, "invalid_value", param, "a grammar takes at most %d triggers",
                        API_MAX_TRIGGERS);
    if (len == 0 || len > EXEC_MAX_TRIGGER_LEN || memchr(trigger, 0, len))
        return api_fail(e, 400, "invalid_value", param,
                        "a grammar trigger has 1 to %d bytes and no NUL", EXEC_MAX_TRIGGER_LEN);
    char *copy = rc_strndup(trigger, len);
    if (!copy)
        return api_fail(e, 500, "out_of_memory", param, "out of memory");
    r->grammar_triggers[r->n_grammar_triggers++] = copy;
    return 0;
}

int api_request_get_grammar(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = json_object_get(o, "grammar");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return api_fail(e, 400, "invalid_type", "grammar", "'grammar' must be a string");
    if (json_string_length(v) == 0)
        return 0;
    return api_request_set_grammar(r, json_string_value(v), json_string_length(v), "grammar", e);
}
