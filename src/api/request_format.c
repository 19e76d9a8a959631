/* request_format.c - structured output requests to grammars: OpenAI's
 * response_format, Ollama's format, and forced tool calls.
 *
 *   response_format {"type": "text"}               nothing
 *   response_format {"type": "json_object"}        any JSON object
 *   response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
 *                                                  the schema (strict or not: the
 *                                                  output follows it either way)
 *   format "json"                                  any JSON object
 *   format {...}                                   the object is the schema
 * A schema the converter refuses is the client's 400, naming the keyword.
 * Tool calls (api_request_tool_grammar) wait for the model: the grammar
 * depends on its template's tool-call format.
 */
#include "request.h"
#include "reasoning.h"
#include "tool_calls.h"
#include "tool_grammar.h"
#include "base/err.h"
#include "base/mem.h"
#include "grammar/json_schema.h"

#include <string.h>

/* The converter's failure as the client's error. */
static int schema_fail(int rc, const char *param, api_error *e)
{
    if (rc == RC_ENOMEM)
        return api_fail(e, 500, "out_of_memory", param, "out of memory");
    return api_fail(e, 400, "unsupported_schema", param, "%s: %s", param, rc_errmsg());
}

static int schema_grammar(const json_t *schema, const char *param, char **gbnf, api_error *e)
{
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return api_fail(e, 400, "invalid_type", param, "'%s' must be a JSON schema object",
                        param);
    int rc = json_schema_to_gbnf(schema, gbnf);
    return rc ? schema_fail(rc, param, e) : 0;
}

static int any_object(const char *param, char **gbnf, api_error *e)
{
    return json_object_gbnf(gbnf) ? schema_fail(RC_ENOMEM, param, e) : 0;
}

static int openai_format(const json_t *rf, char **gbnf, api_error *e)
{
    json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(t))
        return api_fail(e, 400, "invalid_type", "response_format",
                        "'response_format' must be an object with a string 'type'");
    const char *type = json_string_value(t);
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object"))
        return any_object("response_format", gbnf, e);
    if (strcmp(type, "json_schema"))
        return api_fail(e, 400, "unsupported_value", "response_format",
                        "response_format type '%.40s': want text, json_object or json_schema",
                        type);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return api_fail(e, 400, "invalid_type", "response_format",
                        "response_format 'json_schema' must be an object with a 'schema'");
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_null(name) && !json_is_string(name))
        return api_fail(e, 400, "invalid_type", "response_format",
                        "response_format.json_schema.name must be a string");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return api_fail(e, 400, "invalid_type", "response_format",
                        "response_format.json_schema.strict must be true or false");
    json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema))     /* OpenAI: no schema is any JSON object */
        return any_object("response_format", gbnf, e);
    return schema_grammar(schema, "response_format.json_schema.schema", gbnf, e);
}

static int ollama_format(const json_t *fmt, char **gbnf, api_error *e)
{
    if (json_is_string(fmt)) {
        const char *s = json_string_value(fmt);
        if (!s[0])
            return 0;
        if (!strcmp(s, "json"))
            return any_object("format", gbnf, e);
        return api_fail(e, 400, "unsupported_value", "format",
                        "format '%.40s': want \"json\" or a JSON schema object", s);
    }
    return schema_grammar(fmt, "format", gbnf, e);
}

int api_format_grammar(int kind, const json_t *o, char **gbnf, api_error *e)
{
    bool ollama = kind == API_OLLAMA_CHAT || kind == API_OLLAMA_GENERATE;
    json_t *v = json_object_get(o, ollama ? "format" : "response_format");
    *gbnf = NULL;
    if (!v || json_is_null(v))
        return 0;
    return ollama ? ollama_format(v, gbnf, e) : openai_format(v, gbnf, e);
}

int api_request_get_format(api_request *r, const json_t *o, api_error *e)
{
    char *gbnf;
    if (api_format_grammar(r->kind, o, &gbnf, e))
        return -1;
    if (!gbnf)
        return 0;
    const char *param = r->kind == API_OLLAMA_CHAT || r->kind == API_OLLAMA_GENERATE ?
                        "format" : "response_format";
    int rc = r->grammar ? api_fail(e, 400, "invalid_value", param,
                                   "'grammar' and '%s' are both given; give one", param)
                        : api_request_set_grammar(r, gbnf, strlen(gbnf), param, e);
    rc_free(gbnf);
    return rc;
}

int api_request_tool_grammar(api_request *r, int format, const char *template_src, int reasoning,
                             api_error *e)
{
    if (!r->tools || r->tool_choice == TOOL_CHOICE_NONE)
        return 0;
    bool forced = r->tool_choice == TOOL_CHOICE_REQUIRED;
    if (r->grammar)
        return forced ? api_fail(e, 400, "invalid_value", "tool_choice",
                                 "a forced tool call cannot also follow response_format or "
                                 "grammar; give one") : 0;
    if (format == TOOLS_NONE)
        return forced ? api_fail(e, 400, "unsupported_value", "tool_choice",
                                 "the model's chat template has no tool-call format, so a tool "
                                 "call cannot be forced") : 0;
    char *gbnf;
    const char *trigger;
    /* auto is lazy: the opener starts the grammar, wherever the thinking is */
    int rc = tool_grammar_build(format, template_src, r->tools, r->tool_choice_name,
                                forced ? reasoning : REASONING_NONE, &gbnf, &trigger);
    if (rc == RC_ENOMEM)
        return api_fail(e, 500, "out_of_memory", "tools", "out of memory");
    if (rc)    /* auto: unconstrained, as before grammars */
        return forced ? api_fail(e, 400, "unsupported_schema", "tools", "%s", rc_errmsg()) : 0;
    rc = api_request_set_grammar(r, gbnf, strlen(gbnf), "tools", e);
    if (!rc && !forced)
        rc = api_request_add_trigger(r, trigger, strlen(trigger), "tools", e);
    rc_free(gbnf);
    return rc;
}
