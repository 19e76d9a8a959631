/* test_api_tools.c - tool calls in generated text: the three formats, text
 * around them, malformed calls (left as content), the streaming hold-back
 * and the detection of a template's format. */
#include "test.h"
#include "api/tool_calls.h"
#include "base/mem.h"

static int parse(int fmt, bool marker, const char *text, json_t **calls, char **content)
{
    *calls = NULL;
    *content = NULL;
    return tool_calls_parse(fmt, marker, text, strlen(text), calls, content);
}

static const char *call_name(json_t *calls, size_t i)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(calls, i), "function"), "name"));
}

static json_t *call_args(json_t *calls, size_t i)
{
    return json_object_get(json_object_get(json_array_get(calls, i), "function"), "arguments");
}

TEST(api_tools_hermes)
{
    json_t *calls;
    char *content;
    CHECK_INT(parse(TOOLS_HERMES, false, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"t\","
                    "\"arguments\":\"{\\\"a\\\":1}\"}</tool_call>", &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 0), "get_weather");
    CHECK_STR(json_string_value(json_object_get(call_args(calls, 0), "city")), "Paris");
    CHECK_INT(json_integer_value(json_object_get(call_args(calls, 1), "a")), ==, 1);
    CHECK_STR(content, "Let me look.");
    json_decref(calls);
    rc_free(content);
    /* an unclosed last call at the end of the answer still counts */
    CHECK_INT(parse(TOOLS_HERMES, false, "<tool_call>{\"name\":\"f\",\"arguments\":{}}", &calls, &content), ==, 1);
    json_decref(calls);
    rc_free(content);
    static const char *const not_calls[] = {
        "plain text", "<tool_call>{\"name\": \"f\"", "<tool_call>not json</tool_call>",
        "<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>{\"name\":\"f\",\"arguments\":5}</tool_call>",
        "<tool_call>{\"name\":\"f\"} trailing</tool_call>", "<tool_call>[1,2]</tool_call>",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++)
        if (parse(TOOLS_HERMES, false, not_calls[i], &calls, &content) != 0)
            FAIL("parsed a call in '%s'", not_calls[i]);
}

TEST(api_tools_llama3)
{
    json_t *calls;
    char *content;
    CHECK_INT(parse(TOOLS_LLAMA3, false, " {\"name\": \"f\", \"parameters\": {\"x\": [1]}} ", &calls, &content), ==, 1);
    CHECK_STR(call_name(calls, 0), "f");
    CHECK(json_is_array(json_object_get(call_args(calls, 0), "x")));
    CHECK_STR(content, "");
    json_decref(calls);
    rc_free(content);
    CHECK_INT(parse(TOOLS_LLAMA3, false, "<|python_tag|>[{\"name\":\"a\",\"parameters\":{}},{\"name\":\"b\"}];",
                    &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 1), "b");
    CHECK(json_is_object(call_args(calls, 1)));
    json_decref(calls);
    rc_free(content);
    static const char *const not_calls[] = { "Hello {\"name\":\"f\"}", "{\"name\":\"f\"} and more",
                                             "{\"x\":1}", "[]", "{", "" };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++)
        if (parse(TOOLS_LLAMA3, false, not_calls[i], &calls, &content) != 0)
            FAIL("parsed a call in '%s'", not_calls[i]);
}

TEST(api_tools_mistral)
{
    json_t *calls;
    char *content;
    /* the marker as a control token (no text) */
    CHECK_INT(parse(TOOLS_MISTRAL, true, "[{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}, \"id\": \"abc123def\"}]",
                    &calls, &content), ==, 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "abc123def");
    json_decref(calls);
    rc_free(content);
    /* as literal text, and the newer name[ARGS]{...} form */
    CHECK_INT(parse(TOOLS_MISTRAL, false, "[TOOL_CALLS]get[ARGS]{\"a\":1}[TOOL_CALLS]put{\"b\":2}",
                    &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 0), "get");
    CHECK_STR(call_name(calls, 1), "put");
    CHECK_INT(json_integer_value(json_object_get(call_args(calls, 1), "b")), ==, 2);
    json_decref(calls);
    rc_free(content);
    CHECK_INT(parse(TOOLS_MISTRAL, false, "[{\"name\":\"f\"}]", &calls, &content), ==, 0);  /* no marker */
    CHECK_INT(parse(TOOLS_MISTRAL, true, "[{\"name\":\"f\"}] junk", &calls, &content), ==, 0);
    CHECK_INT(parse(TOOLS_MISTRAL, true, "", &calls, &content), ==, 0);
    CHECK_INT(parse(TOOLS_NONE, true, "[{\"name\":\"f\"}]", &calls, &content), ==, 0);
}

TEST(api_tools_stream_holdback)
{
    const char *t = "Sure. <tool_c";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_HERMES, false, t, strlen(t)), ==, 6);
    t = "Sure. <tool_call>{\"name\"";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_HERMES, false, t, strlen(t)), ==, 6);
    t = "No calls < here";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_HERMES, false, t, strlen(t)), ==, strlen(t));
    t = "  {\"na";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_LLAMA3, false, t, strlen(t)), ==, 0);
    t = "Hello";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_LLAMA3, false, t, strlen(t)), ==, 5);
    t = "[TOOL";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_MISTRAL, false, t, strlen(t)), ==, 0);
    t = "Hi";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_MISTRAL, false, t, strlen(t)), ==, 2);
    CHECK_INT(tool_calls_safe_prefix(TOOLS_MISTRAL, true, t, strlen(t)), ==, 0);
    CHECK_INT(tool_calls_safe_prefix(TOOLS_NONE, false, "<tool_call>", 11), ==, 11);
}

TEST(api_tools_detect)
{
    CHECK_INT(tool_format_detect("{% if tools %}<tool_call>{{ x }}</tool_call>{% endif %}"), ==, TOOLS_HERMES);
    CHECK_INT(tool_format_detect("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]"), ==, TOOLS_MISTRAL);
    CHECK_INT(tool_format_detect("<|start_header_id|>{% if tools %}{\"name\": ..., \"parameters\": ...}{% endif %}"),
              ==, TOOLS_LLAMA3);
    CHECK_INT(tool_format_detect("<|start_header_id|>user<|end_header_id|>"), ==, TOOLS_NONE);
    CHECK_INT(tool_format_detect(NULL), ==, TOOLS_NONE);
    CHECK_STR(tool_format_name(TOOLS_HERMES), "hermes");
}
