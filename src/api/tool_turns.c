/* tool_turns.c - see tool_turns.h.
 *
 * The probe conversation is a user turn, an assistant turn with one call
 * and the tool's answer; the call is written back when its argument value
 * appears in the prompt (the function's name would also appear in a tools
 * section).  Its id has nine alphanumeric characters because Mistral's
 * templates refuse others.
 */
#include "tool_turns.h"
#include "base/mem.h"
#include "text/chat_template.h"

#include <stdbool.h>
#include <string.h>

static const char PROBE_VALUE[] = "probe_value_7f3a";

static bool renders_call(const char *src, unsigned shape)
{
    json_t *args = shape & TOOL_TURN_ARGS_STRING ?
        json_pack("s", "{\"probe_arg\": \"probe_value_7f3a\"}") :
        json_pack("{s:s}", "probe_arg", PROBE_VALUE);
    json_t *content = shape & TOOL_TURN_CONTENT_NULL ? json_null() : json_string("");
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:o, s:[{s:s, s:s, s:{s:s, s:o}}]},"
                             " {s:s, s:s, s:s}]",
                             "role", "user", "content", "probe",
                             "role", "assistant", "content", content, "tool_calls",
                             "id", "probe0001", "type", "function", "function", "name", "probe_fn",
                             "arguments", args,
                             "role", "tool", "tool_call_id", "probe0001", "content", "probe");
    json_t *tools = json_pack("[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}}}}}]", "type", "function",
                              "function", "name", "probe_fn", "description", "probe", "parameters",
                              "type", "object", "properties", "probe_arg", "type", "string");
    char *out = NULL;
    bool ok = msgs && tools &&
              chat_template_render(src, msgs, tools, false, "<s>", "</s>", NULL, &out) == 0 &&
              strstr(out, PROBE_VALUE);
    rc_free(out);
    json_decref(msgs);
    json_decref(tools);
    return ok;
}

unsigned tool_turns_probe(const char *src)
{
    if (!src)
        return 0;
    for (unsigned shape = 0; shape < 4; shape++)
        if (renders_call(src, shape))
            return shape;
    return 0;
}

static bool is_call_turn(const json_t *m)
{
    json_t *role = json_object_get(m, "role");
    return json_is_string(role) && !strcmp(json_string_value(role), "assistant") &&
           json_array_size(json_object_get(m, "tool_calls")) > 0;
}

int tool_turns_adapt(const json_t *messages, unsigned shape, json_t **adapted)
{
    *adapted = NULL;
    if (!shape)
        return 0;
    size_t i;
    json_t *m;
    bool any = false;
    json_array_foreach(messages, i, m)
        any |= is_call_turn(m);
    if (!any)
        return 0;
    json_t *out = json_deep_copy(messages);
    if (!out)
        return -1;
    json_array_foreach(out, i, m) {
        if (!is_call_turn(m))
            continue;
        json_t *content = json_object_get(m, "content");
        if ((shape & TOOL_TURN_CONTENT_NULL) && json_is_string(content) &&
            !json_string_length(content))
            json_object_set_new(m, "content", json_null());
        if (!(shape & TOOL_TURN_ARGS_STRING))
            continue;
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
            json_t *fn = json_object_get(c, "function");
            json_t *args = json_object_get(fn, "arguments");
            if (json_is_string(args))
                continue;
            char *s = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!s || json_object_set_new(fn, "arguments", json_string(s))) {
                free(s);
                json_decref(out);
                return -1;
            }
            free(s);
        }
    }
    *adapted = out;
    return 0;
}
