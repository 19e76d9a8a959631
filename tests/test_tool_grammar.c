/* test_tool_grammar.c - forced tool calls: for every tool-call format, the
 * grammar accepts the format's calls with valid arguments and nothing else,
 * and tool_calls_parse reads back what the grammar produces (fixed examples
 * and random sentences, as a random-weight model writes them). */
#include "test.h"
#include "schema_util.h"
#include "api/reasoning.h"
#include "api/tool_calls.h"
#include "api/tool_grammar.h"
#include "base/err.h"
#include "base/mem.h"

#include <stdbool.h>

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, "
    "\"unit\": {\"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\", \"unit\"], "
    "\"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

#define ARGS "{\"city\": \"Paris\", \"unit\": \"c\"}"
#define BAD_ARGS "{\"city\": \"Paris\", \"unit\": \"k\"}"

static const struct {
    int format;
    const char *template_src;   /* picks a variant */
    const char *good, *bad;     /* a call of get_weather with ARGS / BAD_ARGS */
} FORMATS[] = {
    { TOOLS_HERMES, NULL, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " ARGS "}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " BAD_ARGS "}\n</tool_call>" },
    { TOOLS_LLAMA3, NULL, "{\"name\": \"get_weather\", \"parameters\": " ARGS "}",
      "{\"name\": \"get_weather\", \"parameters\": " BAD_ARGS "}" },
    { TOOLS_MISTRAL, NULL, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " ARGS "}]",
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " BAD_ARGS "}]" },
    { TOOLS_MISTRAL, "{{ '[TOOL_CALLS]' + name + '[ARGS]' }}", "[TOOL_CALLS]get_weather[ARGS]" ARGS,
      "[TOOL_CALLS]get_weather[ARGS]" BAD_ARGS },
    { TOOLS_DEEPSEEK, NULL,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" ARGS
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" BAD_ARGS
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>" },
    { TOOLS_DEEPSEEK, "'```json' + '\\n'",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" ARGS
      "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      BAD_ARGS "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" },
    { TOOLS_KIMI, NULL,
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>" ARGS "<|tool_call_end|><|tool_calls_section_end|>",
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>" BAD_ARGS "<|tool_call_end|><|tool_calls_section_end|>" },
};

#define N(a) (sizeof a / sizeof a[0])

static grammar *build(int i, const char *only, const char **trigger)
{
    json_t *tools = json_loads(TOOLS, 0, NULL);
    char *gbnf;
    CHECK(tools != NULL);
    if (tool_grammar_build(FORMATS[i].format, FORMATS[i].template_src, tools, only, REASONING_NONE, &gbnf,
                           trigger))
        FAIL("%s: %s", tool_format_name(FORMATS[i].format), rc_errmsg());
    grammar *g = test_schema_compile(gbnf);
    rc_free(gbnf);
    json_decref(tools);
    return g;
}

/* Checks that calls are get_weather with valid arguments or ping. */
static void check_calls(const json_t *calls, const char *text, const char *only)
{
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_object_get(fn, "arguments");
        if (!name || !json_is_object(args))
            FAIL("call %zu of %s is not a named call with an argument object", i, text);
        if (only && strcmp(name, only))
            FAIL("%s calls %s, only %s was allowed", text, name, only);
        if (!strcmp(name, "ping"))
            continue;
        if (strcmp(name, "get_weather"))
            FAIL("%s calls an unknown tool %s", text, name);
        json_t *city = json_object_get(args, "city"), *unit = json_object_get(args, "unit");
        const char *u = json_string_value(unit);
        if (!json_is_string(city) || !u || (strcmp(u, "c") && strcmp(u, "f")) ||
            json_object_size(args) != 2)
            FAIL("%s: arguments do not follow the schema", text);
    }
}

TEST(tool_grammar_examples_round_trip)
{
    for (size_t i = 0; i < N(FORMATS); i++) {
        const char *trigger;
        grammar *g = build((int)i, NULL, &trigger);
        const char *good = FORMATS[i].good;
        if (!test_schema_matches(g, good))
            FAIL("%s rejects %s", tool_format_name(FORMATS[i].format), good);
        CHECK(!strncmp(good, trigger, strlen(trigger)));     /* a lazy start finds it */
        CHECK(!test_schema_matches(g, FORMATS[i].bad));
        char prefixed[1024];
        snprintf(prefixed, sizeof prefixed, "Sure! %s", good);
        CHECK(!test_schema_matches(g, prefixed));            /* forced: nothing before */
        snprintf(prefixed, sizeof prefixed, "%s and more", good);
        CHECK(!test_schema_matches(g, prefixed));            /* nor after */
        json_t *calls;
        char *content;
        int n = tool_calls_parse(FORMATS[i].format, false, good, strlen(good), &calls, &content);
        CHECK_INT(n, ==, 1);
        check_calls(calls, good, NULL);
        CHECK_STR(content, "");
        json_decref(calls);
        rc_free(content);
        grammar_free(g);
    }
}

/* Random sentences of each format's grammar parse back into valid calls. */
TEST_T(tool_grammar_random_round_trip, 600)
{
    for (size_t i = 0; i < N(FORMATS); i++) {
        for (int only = 0; only < 2; only++) {
            const char *trigger, *name = only ? "get_weather" : NULL;
            grammar *g = build((int)i, name, &trigger);
            for (uint64_t seed = 1; seed <= 12; seed++) {
                char *text = test_schema_walk(g, seed + 100 * i, 3000);
                if (!text)
                    FAIL("%s seed %llu: no end within 3000 tokens",
                         tool_format_name(FORMATS[i].format), (unsigned long long)seed);
                json_t *calls;
                char *content;
                int n = tool_calls_parse(FORMATS[i].format, false, text, strlen(text), &calls,
                                         &content);
                if (n < 1 || n > TOOL_GRAMMAR_MAX_CALLS)
                    FAIL("%s: %d calls parsed from %s", tool_format_name(FORMATS[i].format), n,
                         text);
                check_calls(calls, text, name);
                if (content[0])
                    FAIL("%s: content \"%s\" around the calls of %s",
                         tool_format_name(FORMATS[i].format), content, text);
                json_decref(calls);
                rc_free(content);
                rc_free(text);
            }
            grammar_free(g);
        }
    }
}

TEST(tool_grammar_errors)
{
    json_t *tools = json_loads(TOOLS, 0, NULL);
    char *gbnf = NULL;
    const char *trigger;
    CHECK_INT(tool_grammar_build(TOOLS_HERMES, NULL, tools, "nope", REASONING_NONE, &gbnf, &trigger), ==,
              RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "nope"));
    CHECK_INT(tool_grammar_build(TOOLS_NONE, NULL, tools, NULL, REASONING_NONE, &gbnf, &trigger), ==,
              RC_EUNSUPPORTED);
    json_decref(tools);
    tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                       "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", "
                       "\"uniqueItems\": true}}}}}]", 0, NULL);
    CHECK_INT(tool_grammar_build(TOOLS_HERMES, NULL, tools, NULL, REASONING_NONE, &gbnf, &trigger), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "tool 'f'") && strstr(rc_errmsg(), "'uniqueItems'") &&
          strstr(rc_errmsg(), "/properties/a"));
    CHECK(gbnf == NULL);
    json_decref(tools);
}

/* A thinking model may think before a forced call: a whole block when it may
 * open one, the rest of the block when the prompt opened it. */
TEST(tool_grammar_after_thinking)
{
    json_t *tools = json_loads(TOOLS, 0, NULL);
    static const char call[] = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
    char doc[512];
    for (int mode = REASONING_AUTO; mode <= REASONING_OPEN; mode++) {
        char *gbnf;
        const char *trigger;
        CHECK_OK(tool_grammar_build(TOOLS_HERMES, NULL, tools, NULL, mode, &gbnf, &trigger));
        grammar *g = test_schema_compile(gbnf);
        snprintf(doc, sizeof doc, "%sa < b, so </thin or <x/>.</think>\n\n%s",
                 mode == REASONING_AUTO ? "<think>" : "", call);
        CHECK(test_schema_matches(g, doc));
        CHECK(test_schema_matches(g, call) == (mode == REASONING_AUTO));
        snprintf(doc, sizeof doc, "%sno close %s", mode == REASONING_AUTO ? "<think>" : "", call);
        CHECK(!test_schema_matches(g, doc));
        snprintf(doc, sizeof doc, "%sx</think>y</think>%s", mode == REASONING_AUTO ? "<think>" : "",
                 call);
        CHECK(!test_schema_matches(g, doc));      /* nothing between the block and the calls */
        grammar_free(g);
        rc_free(gbnf);
    }
    json_decref(tools);
}
