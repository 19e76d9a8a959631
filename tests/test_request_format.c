/* test_request_format.c - OpenAI response_format and Ollama format to
 * grammars (request_format.c), and tool_choice naming a function. */
#include "test.h"
#include "schema_util.h"
#include "api/request.h"
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
