/* test_request_format.c - OpenAI response_format and Ollama format to
 * grammars (request_format.c), and tool_choice naming a function. */
#include "test.h"
#include "schema_util.h"
#include "api/request.h"
#include "api/reasoning.h"
#include "api/tool_calls.h"
#include "base/err.h"
#include "base/mem.h"

static char *format_grammar(int kind, const char *body, api_error *e, int *rc)
{
    json_t *o = json_loads(body, 0, NULL);
    if (!o)
        FAIL("bad test body %s", body);
    char *gbnf = NULL;
    memset(e, 0, sizeof *e);
    *rc = api_format_grammar(kind, o, &gbnf, e);
    json_decref(o);
    return gbnf;
}

TEST(request_format_grammars)
{
    static const struct {
        int kind;
        const char *body, *yes, *no;
    } cases[] = {
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_object\"}}",
          "{\"a\": [1, true]}", "[1]" },
        { API_OPENAI_COMPLETION, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
          "{\"name\": \"r\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": "
          "{\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"], \"additionalProperties\": false}}}}",
          "{\"n\": 3}", "{\"n\": \"3\"}" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
          "{\"name\": \"r\"}}}", "{}", "1" },
        { API_OLLAMA_CHAT, "{\"format\": \"json\"}", "{\"x\": null}", "\"x\"" },
        { API_OLLAMA_GENERATE, "{\"format\": {\"type\": \"object\", \"properties\": {\"ok\": "
          "{\"type\": \"boolean\"}}, \"required\": [\"ok\"]}}", "{\"ok\": false}", "{}" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_error e;
        int rc;
        char *gbnf = format_grammar(cases[i].kind, cases[i].body, &e, &rc);
        if (rc || !gbnf)
            FAIL("%s: %d %s", cases[i].body, rc, e.message);
        grammar *g = test_schema_compile(gbnf);
        CHECK(test_schema_matches(g, cases[i].yes));
        CHECK(!test_schema_matches(g, cases[i].no));
        grammar_free(g);
        rc_free(gbnf);
    }
    /* nothing asked: no grammar */
    static const struct { int kind; const char *body; } none[] = {
        { API_OPENAI_CHAT, "{}" }, { API_OPENAI_CHAT, "{\"response_format\": null}" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"text\"}}" },
        { API_OLLAMA_CHAT, "{\"format\": \"\"}" }, { API_OLLAMA_GENERATE, "{}" },
        /* the other dialect's field is not this one's */
        { API_OLLAMA_CHAT, "{\"response_format\": {\"type\": \"json_object\"}}" },
    };
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        api_error e;
        int rc;
        char *gbnf = format_grammar(none[i].kind, none[i].body, &e, &rc);
        CHECK_INT(rc, ==, 0);
        CHECK(gbnf == NULL);
    }
}

TEST(request_format_errors)
{
    static const struct {
        int kind;
        const char *body, *code, *param, *says;
    } cases[] = {
        { API_OPENAI_CHAT, "{\"response_format\": \"json\"}", "invalid_type", "response_format",
          "'type'" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"xml\"}}", "unsupported_value",
          "response_format", "xml" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\"}}", "invalid_type",
          "response_format", "json_schema" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
          "{\"name\": \"r\", \"strict\": \"yes\"}}}", "invalid_type", "response_format", "strict" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
          "{\"name\": \"r\", \"schema\": {\"type\": \"object\", \"properties\": {\"t\": "
          "{\"type\": \"array\", \"uniqueItems\": true}}}}}}", "unsupported_schema",
          "response_format.json_schema.schema", "/properties/t': 'uniqueItems' is not supported" },
        { API_OPENAI_CHAT, "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
          "{\"schema\": [1]}}}", "invalid_type", "response_format.json_schema.schema", "schema" },
        { API_OLLAMA_CHAT, "{\"format\": \"yaml\"}", "unsupported_value", "format", "yaml" },
        { API_OLLAMA_GENERATE, "{\"format\": {\"type\": \"string\", \"format\": \"ipv6\"}}",
          "unsupported_schema", "format", "'format' \"ipv6\"" },
        { API_OLLAMA_CHAT, "{\"format\": 3}", "invalid_type", "format", "schema" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_error e;
        int rc;
        char *gbnf = format_grammar(cases[i].kind, cases[i].body, &e, &rc);
        CHECK_INT(rc, ==, -1);
        CHECK(gbnf == NULL);
        CHECK_INT(e.status, ==, 400);
        CHECK_STR(e.code, cases[i].code);
        CHECK_STR(e.param, cases[i].param);
        if (!strstr(e.message, cases[i].says))
            FAIL("%s: message \"%s\" does not say %s", cases[i].body, e.message, cases[i].says);
    }
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"

TEST(request_tool_choice_named)
{
    api_request r;
    api_error e;
    const char *body = "{\"model\":\"m\"," MSG "," TOOL ",\"tool_choice\":{\"type\":\"function\","
                       "\"function\":{\"name\":\"f\"}}}";
    CHECK_OK(api_request_parse(API_OPENAI_CHAT, body, strlen(body), &r, &e));
    CHECK_INT(r.tool_choice, ==, TOOL_CHOICE_REQUIRED);
    CHECK_STR(r.tool_choice_name, "f");
    api_request_free(&r);
    static const char *const bad[] = {
        "{\"model\":\"m\"," MSG "," TOOL ",\"tool_choice\":{\"type\":\"function\","
        "\"function\":{\"name\":\"g\"}}}",
        "{\"model\":\"m\"," MSG "," TOOL ",\"tool_choice\":{\"type\":\"function\"}}",
        "{\"model\":\"m\"," MSG "," TOOL ",\"tool_choice\":{\"type\":\"web\",\"function\":{\"name\":\"f\"}}}",
        "{\"model\":\"m\"," MSG ",\"tool_choice\":\"required\"}",
        "{\"model\":\"m\"," MSG ",\"tools\":[],\"tool_choice\":\"required\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_INT(api_request_parse(API_OPENAI_CHAT, bad[i], strlen(bad[i]), &r, &e), ==, -1);
        CHECK_INT(e.status, ==, 400);
        CHECK_STR(e.param, "tool_choice");
    }
}

/* The parsers set the grammar: response_format and format become the
 * request's grammar; tools wait for the model's format. */
TEST(request_format_sets_grammar)
{
    api_request r;
    api_error e;
    const char *body = "{\"model\":\"m\"," MSG ",\"response_format\":{\"type\":\"json_object\"}}";
    CHECK_OK(api_request_parse(API_OPENAI_CHAT, body, strlen(body), &r, &e));
    CHECK(r.grammar != NULL && r.n_grammar_triggers == 0);
    api_request_free(&r);
    body = "{\"model\":\"m\",\"prompt\":\"p\",\"format\":{\"type\":\"integer\"},\"stream\":false}";
    CHECK_OK(api_request_parse(API_OLLAMA_GENERATE, body, strlen(body), &r, &e));
    grammar *g = test_schema_compile(r.grammar);
    CHECK(test_schema_matches(g, "-12"));
    CHECK(!test_schema_matches(g, "1.5"));
    grammar_free(g);
    api_request_free(&r);
}

static const char WEATHER_TOOLS[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"c\":{\"enum\":[\"x\"]}},\"required\":[\"c\"]}}}]";

static void parse_chat(const char *extra, api_request *r)
{
    char body[1024];
    api_error e;
    snprintf(body, sizeof body, "{\"model\":\"m\"," MSG ",%s%s}", WEATHER_TOOLS, extra);
    if (api_request_parse(API_OPENAI_CHAT, body, strlen(body), r, &e))
        FAIL("%s: %s", body, e.message);
}

TEST(request_tool_grammar)
{
    api_request r;
    api_error e;
    /* required: forced from the first token */
    parse_chat(",\"tool_choice\":\"required\"", &r);
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e));
    CHECK(r.grammar && r.n_grammar_triggers == 0);
    grammar *g = test_schema_compile(r.grammar);
    CHECK(test_schema_matches(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"x\"}}\n</tool_call>"));
    grammar_free(g);
    api_request_free(&r);
    /* auto: lazy, from the opener */
    parse_chat("", &r);
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e));
    CHECK(r.grammar && r.n_grammar_triggers == 1);
    CHECK_STR(r.grammar_triggers[0], "<tool_call>");
    api_request_free(&r);
    /* none, or a template without a format: nothing; required there: 400 */
    parse_chat(",\"tool_choice\":\"none\"", &r);
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e));
    CHECK(r.grammar == NULL);
    api_request_free(&r);
    parse_chat("", &r);
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_NONE, NULL, REASONING_NONE, &e));
    CHECK(r.grammar == NULL);
    api_request_free(&r);
    parse_chat(",\"tool_choice\":\"required\"", &r);
    CHECK_INT(api_request_tool_grammar(&r, TOOLS_NONE, NULL, REASONING_NONE, &e), ==, -1);
    CHECK_INT(e.status, ==, 400);
    api_request_free(&r);
    /* a response_format grammar stays with auto; with required it is a 400 */
    parse_chat(",\"response_format\":{\"type\":\"json_object\"}", &r);
    char *before = rc_strdup(r.grammar);
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e));
    CHECK_STR(r.grammar, before);
    rc_free(before);
    api_request_free(&r);
    parse_chat(",\"response_format\":{\"type\":\"json_object\"},\"tool_choice\":\"required\"", &r);
    CHECK_INT(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e), ==, -1);
    CHECK_STR(e.param, "tool_choice");
    api_request_free(&r);
    /* a schema beyond the subset: auto goes without a grammar, required is a 400 */
    static const char hard[] = "{\"model\":\"m\"," MSG ",\"tools\":[{\"type\":\"function\",\"function\":"
                               "{\"name\":\"h\",\"parameters\":{\"type\":\"object\",\"minProperties\":1}}}]%s}";
    char body[1024];
    snprintf(body, sizeof body, hard, "");
    CHECK_OK(api_request_parse(API_OPENAI_CHAT, body, strlen(body), &r, &e));
    CHECK_OK(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e));
    CHECK(r.grammar == NULL);
    api_request_free(&r);
    snprintf(body, sizeof body, hard, ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"h\"}}");
    CHECK_OK(api_request_parse(API_OPENAI_CHAT, body, strlen(body), &r, &e));
    CHECK_INT(api_request_tool_grammar(&r, TOOLS_HERMES, NULL, REASONING_NONE, &e), ==, -1);
    CHECK_STR(e.code, "unsupported_schema");
    CHECK(strstr(e.message, "minProperties") && strstr(e.message, "tool 'h'"));
    api_request_free(&r);
}
