/* test_api_tools.c - tool calls in generated text: the three formats, text
 * around them, malformed calls (left as content), the streaming hold-back
 * and the detection of a template's format. */
#include "test.h"
#include "api/tool_calls.h"
#include "api/tool_turns.h"
#include "base/err.h"
#include "base/mem.h"
#include "text/chat_template.h"

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

/* DeepSeek V3.1 (NAME<｜tool▁sep｜>JSON) and R1 / V3-0324 (function<｜tool▁sep｜>NAME
 * and a ```json fence), with content around the section. */
TEST(api_tools_deepseek)
{
    json_t *calls;
    char *content;
    CHECK_INT(parse(TOOLS_DEEPSEEK, false, "Let me check.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                    "<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 0), "get_weather");
    CHECK_STR(json_string_value(json_object_get(call_args(calls, 0), "city")), "Paris");
    CHECK_STR(call_name(calls, 1), "get_time");
    CHECK(json_is_object(call_args(calls, 1)) && json_object_size(call_args(calls, 1)) == 0);
    CHECK(!json_object_get(json_array_get(calls, 0), "id"));
    CHECK_STR(content, "Let me check.");
    json_decref(calls);
    rc_free(content);
    CHECK_INT(parse(TOOLS_DEEPSEEK, false, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    "```json\n{\"city\": \"Tokyo\", \"units\": [\"c\"]}\n```<｜tool▁call▁end｜>\n"
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"q\": \"x\"}\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>\nDone.", &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 0), "get_weather");
    CHECK_STR(json_string_value(json_object_get(call_args(calls, 0), "city")), "Tokyo");
    CHECK_STR(call_name(calls, 1), "search");
    CHECK_STR(json_string_value(json_object_get(call_args(calls, 1), "q")), "x");
    CHECK_STR(content, "Done.");
    json_decref(calls);
    rc_free(content);
    /* the answer ended (max tokens, or end of text) before the closing markers */
    CHECK_INT(parse(TOOLS_DEEPSEEK, false, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":1}",
                    &calls, &content), ==, 1);
    CHECK_STR(content, "");
    json_decref(calls);
    rc_free(content);
    static const char *const not_calls[] = {
        "plain text",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":",                /* cut JSON */
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f{\"a\":1}<｜tool▁call▁end｜>",         /* no separator */
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜>",  /* no name */
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{} x<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜>junk<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n``` x",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++)
        if (parse(TOOLS_DEEPSEEK, false, not_calls[i], &calls, &content) != 0)
            FAIL("parsed a call in '%s'", not_calls[i]);
}

/* Kimi K2: functions.NAME:IDX becomes the name and the call's id. */
TEST(api_tools_kimi)
{
    json_t *calls;
    char *content;
    CHECK_INT(parse(TOOLS_KIMI, false, "I'll look that up.<|tool_calls_section_begin|><|tool_call_begin|>"
                    "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|>"
                    "<|tool_call_begin|>functions.web-search:1<|tool_call_argument_begin|>{\"q\": \"x\"}"
                    "<|tool_call_end|><|tool_calls_section_end|>", &calls, &content), ==, 2);
    CHECK_STR(call_name(calls, 0), "get_weather");
    CHECK_STR(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "functions.get_weather:0");
    CHECK_STR(json_string_value(json_object_get(call_args(calls, 0), "city")), "Beijing");
    CHECK_STR(call_name(calls, 1), "web-search");
    CHECK_STR(json_string_value(json_object_get(json_array_get(calls, 1), "id")), "functions.web-search:1");
    CHECK_STR(content, "I'll look that up.");
    json_decref(calls);
    rc_free(content);
    /* a head without the functions. prefix and index is just a name */
    CHECK_INT(parse(TOOLS_KIMI, false, "<|tool_call_begin|>lookup<|tool_call_argument_begin|>{}<|tool_call_end|>",
                    &calls, &content), ==, 1);
    CHECK_STR(call_name(calls, 0), "lookup");
    CHECK(!json_object_get(json_array_get(calls, 0), "id"));
    json_decref(calls);
    rc_free(content);
    static const char *const not_calls[] = {
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0{}<|tool_call_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>\"x\"<|tool_call_end|>",
        "<|tool_calls_section_begin|>text<|tool_calls_section_end|>",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++)
        if (parse(TOOLS_KIMI, false, not_calls[i], &calls, &content) != 0)
            FAIL("parsed a call in '%s'", not_calls[i]);
}

/* Streaming: text before a section goes out; a partial marker at the end
 * and everything from the first marker on are held. */
TEST(api_tools_sections_holdback)
{
    const char *t = "Sure. <｜tool▁call";           /* the start of both DeepSeek begin markers */
    CHECK_INT(tool_calls_safe_prefix(TOOLS_DEEPSEEK, false, t, strlen(t)), ==, 6);
    t = "Sure. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_DEEPSEEK, false, t, strlen(t)), ==, 6);
    t = "Sure. <｜tool▁call▁begin｜>f";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_DEEPSEEK, false, t, strlen(t)), ==, 6);
    t = "a < b";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_DEEPSEEK, false, t, strlen(t)), ==, strlen(t));
    t = "ok <|tool_calls_sec";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_KIMI, false, t, strlen(t)), ==, 3);
    t = "ok <|tool_call_begin|>functions.f:0";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_KIMI, false, t, strlen(t)), ==, 3);
    t = "ok <|im_end";
    CHECK_INT(tool_calls_safe_prefix(TOOLS_KIMI, false, t, strlen(t)), ==, strlen(t));
    /* every prefix of a whole answer is safe only up to the section */
    const char *whole = "Hi <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
    for (size_t n = 0; n <= strlen(whole); n++)
        CHECK_INT(tool_calls_safe_prefix(TOOLS_DEEPSEEK, false, whole, n), <=, 3);
}

TEST(api_tools_detect_sections)
{
    CHECK_INT(tool_format_detect("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name}}"), ==, TOOLS_DEEPSEEK);
    CHECK_INT(tool_format_detect("<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>"), ==, TOOLS_KIMI);
    CHECK_INT(tool_format_detect("{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}"), ==, TOOLS_KIMI);
    CHECK_STR(tool_format_name(TOOLS_KIMI), "kimi-k2");
    const char *const *m = tool_format_markers(TOOLS_DEEPSEEK);
    int n = 0;
    while (m[n])
        n++;
    CHECK_INT(n, ==, 5);
    CHECK(tool_format_markers(TOOLS_HERMES)[0] == NULL);
    /* the DeepSeek-R1 templates as published (golden data) */
    const char *dir = test_golden_dir();
    if (!dir)
        SKIP("../shared/golden is absent: the published DeepSeek-R1 templates were not checked");
    static const char *const files[] = { "llama-cpp-deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                                         "deepseek-ai-DeepSeek-R1-Distill-Llama-8B" };
    for (size_t i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s.jinja", dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            FAIL("cannot read %s", path);
        static char src[65536];
        size_t len = fread(src, 1, sizeof src - 1, f);
        fclose(f);
        src[len] = '\0';
        if (tool_format_detect(src) != TOOLS_DEEPSEEK)
            FAIL("%s: format %s", files[i], tool_format_name(tool_format_detect(src)));
    }
}

/* Past tool-call turns in the shape each template wants: snippets written
 * like the templates that need it (DeepSeek V3.1 concatenates the arguments;
 * R1 also tests `content is none`), then the published templates. */
TEST(api_tools_turns)
{
    static const char object_args[] =
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.arguments | tojson }}"
        "</tool_call>{% endfor %}{% endif %}{% endfor %}";
    static const char string_args[] =
        "{% for m in messages %}{% if m.tool_calls is defined and m.tool_calls is not none %}{% for t in m.tool_calls %}"
        "{% if m.content is none %}{{ '<call>' + t.function.arguments }}{% else %}{{ m.content + '<call>' + t.function.arguments }}"
        "{% endif %}{% endfor %}{% endif %}{% endfor %}";
    static const char null_content[] =
        "{% for m in messages %}{% if m.role == 'assistant' and m.content is none %}{% for t in m.tool_calls %}"
        "{{ t.function.name + '\\n' + t.function.arguments }}{% endfor %}{% elif m.role == 'assistant' %}{{ m.content }}"
        "{% endif %}{% endfor %}";
    CHECK_INT(tool_turns_probe(object_args), ==, 0);
    CHECK_INT(tool_turns_probe(string_args), ==, TOOL_TURN_ARGS_STRING);
    CHECK_INT(tool_turns_probe(null_content), ==, TOOL_TURN_ARGS_STRING | TOOL_TURN_CONTENT_NULL);
    CHECK_INT(tool_turns_probe("{% for m in messages %}{{ m.content }}{% endfor %}"), ==, 0);
    CHECK_INT(tool_turns_probe(NULL), ==, 0);

    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"\","
                              "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                              "{\"role\":\"assistant\",\"content\":\"done\"}]", 0, NULL);
    json_t *out;
    CHECK_INT(tool_turns_adapt(msgs, 0, &out), ==, 0);
    CHECK(out == NULL);
    CHECK_INT(tool_turns_adapt(msgs, TOOL_TURN_ARGS_STRING | TOOL_TURN_CONTENT_NULL, &out), ==, 0);
    json_t *turn = json_array_get(out, 1);
    CHECK(json_is_null(json_object_get(turn, "content")));
    CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(turn, "tool_calls"), 0),
                                                                "function"), "arguments")), "{\"city\":\"Paris\"}");
    CHECK_STR(json_string_value(json_object_get(json_array_get(out, 2), "content")), "done");
    CHECK(json_is_object(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 1),
                                                                                      "tool_calls"), 0), "function"), "arguments")));
    json_decref(out);
    json_t *plain = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    CHECK_INT(tool_turns_adapt(plain, TOOL_TURN_ARGS_STRING, &out), ==, 0);
    CHECK(out == NULL);
    json_decref(plain);

    const char *dir = test_golden_dir();
    if (!dir) {
        json_decref(msgs);
        SKIP("../shared/golden is absent: the published templates were not probed");
    }
    static const struct { const char *name; unsigned shape; } golden[] = {
        { "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", TOOL_TURN_ARGS_STRING | TOOL_TURN_CONTENT_NULL },
        { "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", TOOL_TURN_ARGS_STRING | TOOL_TURN_CONTENT_NULL },
        { "Qwen-Qwen3", 0 }, { "Qwen-Qwen2.5-7B-Instruct", 0 }, { "meta-llama-Llama-3.1-8B-Instruct", 0 },
        { "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", 0 }, { "mistralai-Mistral-Nemo-Instruct-2407", 0 },
    };
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s.jinja", dir, golden[i].name);
        FILE *f = fopen(path, "rb");
        if (!f)
            FAIL("cannot read %s", path);
        static char src[65536];
        size_t len = fread(src, 1, sizeof src - 1, f);
        fclose(f);
        src[len] = '\0';
        unsigned shape = tool_turns_probe(src);
        if (shape != golden[i].shape)
            FAIL("%s: shape %u, want %u", golden[i].name, shape, golden[i].shape);
        if (!shape)
            continue;
        /* the call is back in the prompt, in R1's own format */
        CHECK_INT(tool_turns_adapt(msgs, shape, &out), ==, 0);
        char *text = NULL;
        CHECK_OK(chat_template_render(src, out, NULL, true, "<s>", "</s>", NULL, &text));
        if (!strstr(text, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"city\":\"Paris\"}\n```"))
            FAIL("%s: the call is not in the prompt: %s", golden[i].name, text);
        rc_free(text);
        json_decref(out);
    }
    json_decref(msgs);
}
