/* anthropic_request.c - an Anthropic Messages body as the OpenAI chat body
 * it means.
 *
 * The two dialects say the same things in different shapes: Anthropic's
 * content blocks (text, tool_use, tool_result, thinking) are OpenAI's
 * message content, tool_calls, tool messages and reasoning_content; its
 * tools' input_schema is OpenAI's parameters; its tool_choice any / tool
 * is OpenAI's required / a named function.  Rewriting the body once here
 * lets request.c parse one shape into one set of fields, so whatever the
 * engine does with tools, tool_choice or thinking applies to both.
 *
 * What is checked here is what only Anthropic's shape can say wrong (a
 * block type, a tool_use outside an assistant turn, a missing max_tokens),
 * with Anthropic's field names in the messages; the values themselves
 * (numbers in range, stop strings) are checked by the OpenAI parser.
 * cache_control, citations and metadata are accepted and ignored: racimo
 * reuses prompt prefixes by itself, and none of them changes the answer.
 */
#include "request.h"

#include <stdio.h>
#include <string.h>

/* The member, or NULL when absent or null (clients send explicit nulls). */
static json_t *member(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int oom(api_error *e)
{
    return api_fail(e, 500, "out_of_memory", NULL, "out of memory");
}

static const char *type_of(const json_t *block)
{
    return json_string_value(json_object_get(block, "type"));
}

/* A text block {type: text, text} (`where` names it: "system.0",
 * "messages.1.content.2"...) as an OpenAI text part appended to parts;
 * other block types are refused, naming them. */
static int text_part(const json_t *b, const char *where, json_t *parts, api_error *e)
{
    const char *param = strncmp(where, "system", 6) ? "messages" : "system";
    const char *t = type_of(b);
    if (!t)
        return api_fail(e, 400, "invalid_value", param, "%s is not a content block (an object "
                        "with a string 'type')", where);
    if (strcmp(t, "text"))
        return api_fail(e, 400, "unsupported_value", param, "%s: blocks of type '%.40s' are not "
                        "supported here (text only)", where, t);
    json_t *text = json_object_get(b, "text");
    if (!json_is_string(text))
        return api_fail(e, 400, "invalid_type", param, "%s: a text block needs a string 'text'",
                        where);
    return json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text))
           ? oom(e) : 0;
}

/* A list of text blocks (named `list`) as text parts. */
static int text_parts(const json_t *blocks, const char *list, json_t *parts, api_error *e)
{
    char where[96];
    size_t i;
    json_t *b;
    json_array_foreach(blocks, i, b) {
        snprintf(where, sizeof where, "%s.%zu", list, i);
        if (text_part(b, where, parts, e))
            return -1;
    }
    return 0;
}

/* system: a string, or a list of text blocks. */
static int system_message(const json_t *in, json_t *msgs, api_error *e)
{
    json_t *sys = member(in, "system"), *content;
    if (!sys)
        return 0;
    if (json_is_string(sys)) {
        if (!json_string_length(sys))
            return 0;
        content = json_incref(sys);
    } else if (json_is_array(sys)) {
        if (!(content = json_array()))
            return oom(e);
        if (text_parts(sys, "system", content, e)) {
            json_decref(content);
            return -1;
        }
    } else {
        return api_fail(e, 400, "invalid_type", "system",
                        "'system' must be a string or a list of text blocks");
    }
    return json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
                                                 content)) ? oom(e) : 0;
}

/* A tool_result's content: a string, or text blocks joined by newlines. */
static int tool_result_text(const json_t *block, const char *where, json_t **out, api_error *e)
{
    json_t *c = member(block, "content");
    if (!c) {
        *out = json_string("");
        return *out ? 0 : oom(e);
    }
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c))
        return api_fail(e, 400, "invalid_type", "messages", "%s: a tool_result's 'content' must be a "
                        "string or a list of text blocks", where);
    json_t *parts = json_array();
    if (!parts)
        return oom(e);
    char sub[96];
    snprintf(sub, sizeof sub, "%s.content", where);
    if (text_parts(c, sub, parts, e)) {
        json_decref(parts);
        return -1;
    }
    *out = parts;               /* the OpenAI parser joins text parts by newlines */
    return 0;
}

/* The OpenAI messages of one Anthropic message: an assistant turn with its
 * content, reasoning_content and tool_calls, or a user turn as one tool
 * message per tool_result and then the user's text. */
static int one_message(const json_t *m, size_t idx, json_t *msgs, api_error *e)
{
    if (!json_is_object(m))
        return api_fail(e, 400, "invalid_type", "messages", "messages.%zu is not an object", idx);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return api_fail(e, 400, "invalid_value", "messages",
                        "messages.%zu.role must be \"user\" or \"assistant\"", idx);
    bool assistant = !strcmp(role, "assistant");
    json_t *c = member(m, "content");
    if (!c)
        return api_fail(e, 400, "missing_field", "messages", "messages.%zu.content is required",
                        idx);
    if (json_is_string(c))
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c))
               ? oom(e) : 0;
    if (!json_is_array(c))
        return api_fail(e, 400, "invalid_type", "messages", "messages.%zu.content must be a "
                        "string or a list of content blocks", idx);
    json_t *parts = json_array(), *calls = json_array(), *thought = NULL, *tools = json_array();
    int rc = parts && calls && tools ? 0 : oom(e);
    char where[64];
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        if (rc)
            break;
        snprintf(where, sizeof where, "messages.%zu.content.%zu", idx, i);
        const char *t = type_of(b);
        if (!t) {
            rc = api_fail(e, 400, "invalid_value", "messages", "%s is not a content block "
                          "(an object with a string 'type')", where);
        } else if (!strcmp(t, "text")) {
            rc = text_part(b, where, parts, e);
        } else if (!strcmp(t, "tool_use") && assistant) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            json_t *input = member(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input)))
                rc = api_fail(e, 400, "invalid_value", "messages", "%s: a tool_use block needs "
                              "a string 'id' and 'name' and an object 'input'", where);
            else if (json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", id,
                                                            "type", "function", "function",
                                                            "name", name, "arguments",
                                                            input ? json_incref(input)
                                                                  : json_object())))
                rc = oom(e);
        } else if (!strcmp(t, "tool_result") && !assistant) {
            json_t *id = json_object_get(b, "tool_use_id"), *text = NULL;
            if (!json_is_string(id))
                rc = api_fail(e, 400, "invalid_value", "messages", "%s: a tool_result block "
                              "needs a string 'tool_use_id'", where);
            else if (!(rc = tool_result_text(b, where, &text, e)) &&
                     json_array_append_new(tools, json_pack("{s:s, s:o, s:O}", "role", "tool",
                                                            "content", text, "tool_call_id", id)))
                rc = oom(e);
        } else if (!strcmp(t, "thinking") && assistant) {
            /* an earlier turn's thinking, for templates that render it back */
            json_t *th = json_object_get(b, "thinking");
            if (!json_is_string(th)) {
                rc = api_fail(e, 400, "invalid_value", "messages", "%s: a thinking block needs a "
                              "string 'thinking'", where);
            } else if (!thought) {
                thought = json_incref(th);
            } else {
                json_t *joined = json_sprintf("%s\n\n%s", json_string_value(thought),
                                              json_string_value(th));
                json_decref(thought);
                thought = joined;
                rc = joined ? 0 : oom(e);
            }
        } else if (!strcmp(t, "redacted_thinking") && assistant) {
            /* encrypted by Anthropic for its own models: nothing to render */
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            rc = api_fail(e, 400, "unsupported_value", "messages", "%s: %s blocks are not "
                          "supported (racimo serves text models)", where, t);
        } else if (!strcmp(t, "tool_use") || !strcmp(t, "tool_result") || !strcmp(t, "thinking") ||
                   !strcmp(t, "redacted_thinking")) {
            rc = api_fail(e, 400, "invalid_value", "messages", "%s: %s blocks belong in %s "
                          "messages", where, t, !strcmp(t, "tool_result") ? "user" : "assistant");
        } else {
            rc = api_fail(e, 400, "unsupported_value", "messages", "%s: blocks of type '%.40s' "
                          "are not supported (text, tool_use, tool_result and thinking are)",
                          where, t);
        }
    }
    if (!rc) {
        /* tool results answer the previous turn: they come before the text */
        size_t k;
        json_t *tm;
        json_array_foreach(tools, k, tm)
            if (json_array_append(msgs, tm))
                rc = oom(e);
    }
    if (!rc && (assistant || json_array_size(parts) || !json_array_size(tools))) {
        json_t *nm = json_pack("{s:s, s:O}", "role", role, "content", parts);
        if (nm && json_array_size(calls))
            json_object_set(nm, "tool_calls", calls);
        if (nm && thought)
            json_object_set(nm, "reasoning_content", thought);
        if (!nm || json_array_append_new(msgs, nm))
            rc = oom(e);
    }
    json_decref(parts);
    json_decref(calls);
    json_decref(thought);
    json_decref(tools);
    return rc;
}

static int messages(const json_t *in, json_t *out, api_error *e)
{
    json_t *msgs = json_array();
    if (!msgs)
        return oom(e);
    json_object_set_new(out, "messages", msgs);
    if (system_message(in, msgs, e))
        return -1;
    json_t *list = member(in, "messages");
    if (!list)
        return api_fail(e, 400, "missing_field", "messages", "'messages' is required");
    if (!json_is_array(list))
        return api_fail(e, 400, "invalid_type", "messages", "'messages' must be a list");
    /* (too many: each message makes one or more, which request.c counts) */
    if (!json_array_size(list))
        return api_fail(e, 400, "invalid_value", "messages", "'messages' is empty");
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m)
        if (one_message(m, i, msgs, e))
            return -1;
    return 0;
}

/* tools: [{name, description, input_schema}] (client tools; Anthropic's
 * server tools such as web_search have a versioned type and run at
 * Anthropic, so they are refused by name). */
static int tools(const json_t *in, json_t *out, api_error *e)
{
    json_t *list = member(in, "tools");
    if (!list)
        return 0;
    if (!json_is_array(list))
        return api_fail(e, 400, "invalid_type", "tools", "'tools' must be a list");
    json_t *conv = json_array();
    if (!conv)
        return oom(e);
    json_object_set_new(out, "tools", conv);
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *name = json_object_get(t, "name"), *schema = member(t, "input_schema");
        json_t *desc = member(t, "description");
        if (type && strcmp(type, "custom"))
            return api_fail(e, 400, "unsupported_value", "tools", "tools.%zu has type '%.60s': "
                            "racimo runs client tools only ({name, description, input_schema})",
                            i, type);
        if (!json_is_string(name) || !json_is_object(schema) || (desc && !json_is_string(desc)))
            return api_fail(e, 400, "invalid_value", "tools", "tools.%zu needs a string 'name', "
                            "an object 'input_schema' and, if any, a string 'description'", i);
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (fn && desc)
            json_object_set(fn, "description", desc);
        if (!fn || json_array_append_new(conv, json_pack("{s:s, s:o}", "type", "function",
                                                         "function", fn)))
            return oom(e);
    }
    return 0;
}

/* tool_choice {type: auto | any | tool (with name) | none}: OpenAI's auto,
 * required, a named function, none.  disable_parallel_tool_use is accepted
 * and has no effect. */
static int tool_choice(const json_t *in, json_t *out, api_error *e)
{
    json_t *tc = member(in, "tool_choice");
    if (!tc)
        return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!type)
        return api_fail(e, 400, "invalid_type", "tool_choice",
                        "'tool_choice' must be an object with a string 'type'");
    json_t *tools = json_object_get(out, "tools");
    json_t *v;
    if ((!strcmp(type, "any") || !strcmp(type, "tool")) && !json_array_size(tools))
        return api_fail(e, 400, "invalid_value", "tool_choice",
                        "tool_choice '%s' needs 'tools'", type);
    if (!strcmp(type, "auto") || !strcmp(type, "none")) {
        v = json_string(type);
    } else if (!strcmp(type, "any")) {
        v = json_string("required");
    } else if (!strcmp(type, "tool")) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (!name)
            return api_fail(e, 400, "invalid_value", "tool_choice",
                            "tool_choice of type 'tool' needs a string 'name'");
        bool known = false;
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"),
                                                              "name"));
            known |= n && !strcmp(n, name);
        }
        if (!known)
            return api_fail(e, 400, "invalid_value", "tool_choice",
                            "tool_choice names the tool '%.100s', which is not in 'tools'", name);
        v = json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name);
    } else {
        return api_fail(e, 400, "invalid_value", "tool_choice",
                        "tool_choice type '%.40s': want auto, any, tool or none", type);
    }
    return !v || json_object_set_new(out, "tool_choice", v) ? oom(e) : 0;
}

/* thinking {type: enabled, budget_tokens}, {type: disabled}, or {type:
 * adaptive} (the model decides: the template's default).  The budget is
 * checked but not enforced: the template's switch has no budget. */
static int thinking(const json_t *in, int *think, api_error *e)
{
    json_t *th = member(in, "thinking");
    if (!th)
        return 0;
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!type)
        return api_fail(e, 400, "invalid_type", "thinking",
                        "'thinking' must be an object with a string 'type'");
    if (!strcmp(type, "disabled") || !strcmp(type, "adaptive")) {
        *think = !strcmp(type, "disabled") ? THINK_OFF : THINK_UNSET;
        return 0;
    }
    if (strcmp(type, "enabled"))
        return api_fail(e, 400, "invalid_value", "thinking",
                        "thinking type '%.40s': want enabled, disabled or adaptive", type);
    json_t *budget = json_object_get(th, "budget_tokens");
    if (!json_is_integer(budget) || json_integer_value(budget) < 1)
        return api_fail(e, 400, "invalid_value", "thinking",
                        "thinking of type 'enabled' needs a positive integer 'budget_tokens'");
    *think = THINK_ON;
    return 0;
}

/* stop_sequences: a list of strings (OpenAI's stop takes the same). */
static int stop_sequences(const json_t *in, json_t *out, api_error *e)
{
    json_t *ss = member(in, "stop_sequences");
    if (!ss)
        return 0;
    size_t i;
    json_t *s;
    if (!json_is_array(ss))
        return api_fail(e, 400, "invalid_type", "stop_sequences",
                        "'stop_sequences' must be a list of strings");
    json_array_foreach(ss, i, s)
        if (!json_is_string(s))
            return api_fail(e, 400, "invalid_type", "stop_sequences",
                            "'stop_sequences' must be a list of strings");
    return json_object_set(out, "stop", ss) ? oom(e) : 0;
}

/* Structured output: output_config.format (or the beta's output_format),
 * {type: json_schema, schema}, is OpenAI's strict json_schema
 * response_format, which the OpenAI parser then takes or refuses. */
static int output_format(const json_t *in, json_t *out, api_error *e)
{
    json_t *cfg = member(in, "output_config");
    if (cfg && !json_is_object(cfg))
        return api_fail(e, 400, "invalid_type", "output_config", "'output_config' must be an object");
    json_t *f = cfg ? member(cfg, "format") : NULL;
    if (!f)
        f = member(in, "output_format");
    if (!f)
        return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    json_t *schema = json_object_get(f, "schema");
    if (!type || strcmp(type, "json_schema") || !json_is_object(schema))
        return api_fail(e, 400, "invalid_value", "output_config",
                        "an output format must be {\"type\": \"json_schema\", \"schema\": {...}}");
    json_t *rf = json_pack("{s:s, s:{s:s, s:O, s:b}}", "type", "json_schema", "json_schema",
                           "name", "output", "schema", schema, "strict", 1);
    return !rf || json_object_set_new(out, "response_format", rf) ? oom(e) : 0;
}

int anthropic_to_chat(const json_t *in, bool count, json_t **chat, int *think, api_error *e)
{
    json_t *out = *chat = json_object();
    if (!out)
        return oom(e);
    json_t *v = member(in, "model");
    if (v && json_object_set(out, "model", v))
        return oom(e);
    if (!count) {
        if (!member(in, "max_tokens"))
            return api_fail(e, 400, "missing_field", "max_tokens", "'max_tokens' is required");
        /* temperature is 0..1 in Anthropic's API (OpenAI's parser allows 2) */
        v = member(in, "temperature");
        if (v && json_is_number(v) && json_number_value(v) > 1)
            return api_fail(e, 400, "invalid_value", "temperature",
                            "'temperature' is %g; it must be between 0 and 1",
                            json_number_value(v));
        static const char *const copy[] = { "max_tokens", "stream", "temperature", "top_p",
                                            "top_k" };
        for (size_t i = 0; i < sizeof copy / sizeof copy[0]; i++)
            if ((v = member(in, copy[i])) && json_object_set(out, copy[i], v))
                return oom(e);
        if (stop_sequences(in, out, e) || output_format(in, out, e))
            return -1;
    }
    return messages(in, out, e) || tools(in, out, e) || tool_choice(in, out, e) ||
           thinking(in, think, e) ? -1 : 0;
}
