/* test_api_request.c - request bodies to api_request: every field users
 * rely on is read, and every kind of bad input gets a 4xx naming the field
 * (table-driven, one row per error path), plus the model-dependent checks. */
#include "test.h"
#include "api/request.h"

static void parse_ok(int kind, const char *body, api_request *r)
{
    api_error e;
    if (api_request_parse(kind, body, strlen(body), r, &e))
        FAIL("%s: %d %s (%s)", body, e.status, e.message, e.code);
}

TEST(api_request_chat_fields)
{
    api_request r;
    parse_ok(API_OPENAI_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
             "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
             "\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"min_p\":0.1,"
             "\"presence_penalty\":1,\"frequency_penalty\":-1,\"repetition_penalty\":1.2,\"seed\":0,"
             "\"stop\":[\"x\",\"\",\"yy\"],\"logit_bias\":{\"5\":-100,\"7\":2.5},\"logprobs\":true,"
             "\"top_logprobs\":3,\"n\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
             "\"response_format\":{\"type\":\"text\"},\"user\":\"u\",\"ignore_eos\":true,"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}", &r);
    CHECK_STR(r.model, "m");
    CHECK_INT(json_array_size(r.messages), ==, 4);
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 0), "role")), "system");
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 1), "content")), "a\nb");
    json_t *asst = json_array_get(r.messages, 2);
    CHECK_STR(json_string_value(json_object_get(asst, "content")), "");
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(asst, "tool_calls"), 0),
                                                   "function"), "arguments");
    CHECK(json_is_object(args));       /* the JSON string became an object for templates */
    CHECK_INT(json_integer_value(json_object_get(args, "x")), ==, 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 3), "tool_call_id")), "c1");
    CHECK_INT(r.max_tokens, ==, 7);
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-6);
    CHECK_INT(r.sampling.top_k, ==, 20);
    CHECK_NEAR(r.sampling.min_p, 0.1, 1e-6);
    CHECK_NEAR(r.sampling.repeat_penalty, 1.2, 1e-6);
    CHECK(r.sampling.seed != 0);       /* seed 0 is reproducible too */
    CHECK_INT(r.n_stops, ==, 2);
    CHECK_STR(r.stops[1], "yy");
    CHECK_INT(r.n_bias, ==, 2);
    CHECK_INT(r.sampling.n_bias, ==, 2);
    CHECK(r.logprobs && r.top_logprobs == 3 && r.stream && r.include_usage && r.ignore_eos);
    CHECK(json_array_size(r.tools) == 1);
    api_request_free(&r);
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &r);
    CHECK(r.tools == NULL);            /* tool_choice none: not rendered */
    CHECK(!r.stream && r.max_tokens == 0);
    api_request_free(&r);
}

/* The thinking switches: chat_template_kwargs and reasoning_format
 * (OpenAI chat, llama.cpp's names), think (Ollama). */
TEST(api_request_thinking_fields)
{
    api_request r;
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"chat_template_kwargs\":{\"enable_thinking\":false,\"thinking\":true},\"reasoning_format\":\"none\"}", &r);
    CHECK(json_is_false(json_object_get(r.template_vars, "enable_thinking")));
    CHECK(json_is_true(json_object_get(r.template_vars, "thinking")));
    CHECK_INT(r.reasoning_format, ==, REASONING_FORMAT_NONE);
    api_request_free(&r);
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"chat_template_kwargs\":{},\"reasoning_format\":\"deepseek\"}", &r);
    CHECK(r.template_vars == NULL);
    CHECK_INT(r.reasoning_format, ==, REASONING_FORMAT_PARSE);
    api_request_free(&r);
    parse_ok(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    CHECK_INT(r.think, ==, THINK_UNSET);
    api_request_free(&r);
    /* an earlier answer's thinking goes back to the template as reasoning_content */
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
             "{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"because\"}]}", &r);
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 1), "reasoning_content")), "because");
    api_request_free(&r);
    parse_ok(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"thinking\":\"no\"},"
             "{\"role\":\"assistant\",\"content\":\"a\",\"thinking\":\"because\"}]}", &r);
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 1), "reasoning_content")), "because");
    CHECK(!json_object_get(json_array_get(r.messages, 0), "reasoning_content"));
    api_request_free(&r);
    parse_ok(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":false}", &r);
    CHECK_INT(r.think, ==, THINK_OFF);
    api_request_free(&r);
    parse_ok(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"think\":true}", &r);
    CHECK_INT(r.think, ==, THINK_ON);
    api_request_free(&r);
    parse_ok(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"think\":\"high\"}", &r);
    CHECK_INT(r.think, ==, THINK_ON);
    api_request_free(&r);
}

TEST(api_request_completion_and_ollama_fields)
{
    api_request r;
    parse_ok(API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"hello\"],\"logprobs\":2,\"max_tokens\":3}", &r);
    CHECK_STR(r.prompt, "hello");
    CHECK(r.logprobs && r.top_logprobs == 2);
    api_request_free(&r);
    parse_ok(API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,2,3]}", &r);
    CHECK_INT(r.n_prompt_ids, ==, 3);
    CHECK_INT(r.prompt_ids[2], ==, 3);
    api_request_free(&r);
    parse_ok(API_OLLAMA_CHAT, "{\"model\":\"m:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"options\":{\"num_predict\":9,\"temperature\":0,\"top_k\":5,\"seed\":3,\"stop\":[\"s\"],"
             "\"repeat_last_n\":-1,\"repeat_penalty\":1.1,\"num_ctx\":4096},\"keep_alive\":\"5m\"}", &r);
    CHECK(r.stream);                   /* Ollama streams by default */
    CHECK_INT(r.max_tokens, ==, 9);
    CHECK_INT(r.sampling.top_k, ==, 5);
    CHECK_INT(r.sampling.repeat_last_n, ==, -1);
    CHECK_INT((int)r.sampling.seed, ==, 3);
    CHECK_STR(r.stops[0], "s");
    api_request_free(&r);
    parse_ok(API_OLLAMA_GENERATE, "{\"name\":\"m\",\"prompt\":\"p\",\"system\":\"s\",\"raw\":true,"
             "\"stream\":false,\"options\":{\"num_predict\":-1}}", &r);
    CHECK_STR(r.model, "m");
    CHECK(r.raw && !r.stream && !r.load_only && r.max_tokens == 0);
    CHECK_STR(r.system, "s");
    api_request_free(&r);
    parse_ok(API_OLLAMA_GENERATE, "{\"model\":\"m\"}", &r);
    CHECK(r.load_only);
    api_request_free(&r);
}

typedef struct {
    int kind;
    const char *body;
    int status;
    const char *code;
    const char *param;     /* NULL: not checked */
} bad_case;

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
static const bad_case bad[] = {
    { API_OPENAI_CHAT, "{", 400, "invalid_json", NULL },
    { API_OPENAI_CHAT, "", 400, "invalid_json", NULL },
    { API_OPENAI_CHAT, "[1]", 400, "invalid_json", NULL },
    { API_OPENAI_CHAT, "{\"a\":1,\"a\":2}", 400, "invalid_json", NULL },
    { API_OPENAI_CHAT, "{" MSG "}", 400, "missing_field", "model" },
    { API_OPENAI_CHAT, "{\"model\":5," MSG "}", 400, "invalid_type", "model" },
    { API_OPENAI_CHAT, "{\"model\":\"\"," MSG "}", 400, "invalid_value", "model" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"}", 400, "missing_field", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "invalid_value", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", 400, "invalid_type", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[5]}", 400, "invalid_type", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", 400, "invalid_value", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", 400, "invalid_value", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "invalid_type", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "unsupported_value", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400, "invalid_type", "messages" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{}]}]}", 400, "invalid_type", "tool_calls" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":1}]}", 400, "invalid_type", "tool_call_id" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"n\":2}", 400, "unsupported_value", "n" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"n\":0}", 400, "invalid_value", "n" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"max_tokens\":0}", 400, "invalid_value", "max_tokens" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"max_tokens\":-5}", 400, "invalid_value", "max_tokens" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"max_tokens\":1e30}", 400, "invalid_type", "max_tokens" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"max_completion_tokens\":99999999999}", 400, "invalid_value", "max_completion_tokens" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"max_tokens\":2.5}", 400, "invalid_type", "max_tokens" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"temperature\":3}", 400, "invalid_value", "temperature" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"temperature\":\"hot\"}", 400, "invalid_type", "temperature" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"top_p\":1.5}", 400, "invalid_value", "top_p" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"top_k\":-1}", 400, "invalid_value", "top_k" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"min_p\":-0.1}", 400, "invalid_value", "min_p" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"presence_penalty\":3}", 400, "invalid_value", "presence_penalty" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"frequency_penalty\":-3}", 400, "invalid_value", "frequency_penalty" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"repetition_penalty\":0}", 400, "invalid_value", "repetition_penalty" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"seed\":\"x\"}", 400, "invalid_type", "seed" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stop\":5}", 400, "invalid_type", "stop" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stop\":[\"a\",1]}", 400, "invalid_type", "stop" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "invalid_value", "stop" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stop\":\"a\\u0000b\"}", 400, "invalid_json", NULL },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":[1]}", 400, "invalid_type", "logit_bias" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":{\"abc\":1}}", 400, "invalid_value", "logit_bias" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":{\"-1\":1}}", 400, "invalid_value", "logit_bias" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":{\"1\":101}}", 400, "invalid_value", "logit_bias" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":{\"1\":\"x\"}}", 400, "invalid_type", "logit_bias" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logprobs\":1}", 400, "invalid_type", "logprobs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"top_logprobs\":3}", 400, "invalid_value", "top_logprobs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logprobs\":true,\"top_logprobs\":21}", 400, "invalid_value", "top_logprobs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stream\":\"yes\"}", 400, "invalid_type", "stream" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"stream_options\":true}", 400, "invalid_type", "stream_options" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"response_format\":{\"type\":\"xml\"}}", 400, "unsupported_value", "response_format" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"x\\\"\"}", 400, "invalid_value", "response_format" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"response_format\":\"json\"}", 400, "invalid_type", "response_format" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tools\":{}}", 400, "invalid_type", "tools" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tools\":[{\"type\":\"function\"}]}", 400, "invalid_value", "tools" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}", 400, "invalid_value", "tools" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tools\":[{\"function\":{\"name\":\"f\",\"parameters\":1}}]}", 400, "invalid_type", "tools" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tool_choice\":\"sometimes\"}", 400, "invalid_value", "tool_choice" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"tool_choice\":1}", 400, "invalid_type", "tool_choice" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"chat_template_kwargs\":[1]}", 400, "invalid_type", "chat_template_kwargs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"chat_template_kwargs\":{\"messages\":[]}}", 400, "invalid_value", "chat_template_kwargs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"chat_template_kwargs\":{\"add_generation_prompt\":false}}", 400, "invalid_value", "chat_template_kwargs" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_format\":\"deepseek-legacy\"}", 400, "invalid_value", "reasoning_format" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_format\":false}", 400, "invalid_type", "reasoning_format" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\"}", 400, "missing_field", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"\"}", 400, "invalid_value", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":5}", 400, "invalid_type", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400, "unsupported_value", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,-2]}", 400, "invalid_value", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,\"a\"]}", 400, "invalid_value", "prompt" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true}", 400, "invalid_type", "logprobs" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"echo\":true}", 400, "unsupported_value", "echo" },
    { API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "unsupported_value", "suffix" },
    { API_OLLAMA_CHAT, "{" MSG "}", 400, "missing_field", "model" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "invalid_value", "messages" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"format\":\"yaml\"}", 400, "unsupported_value", "format" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"format\":{\"type\":\"object\",\"not\":{}}}", 400, "unsupported_schema", "format" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"options\":[]}", 400, "invalid_type", "options" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"options\":{\"num_predict\":0}}", 400, "invalid_value", "num_predict" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"options\":{\"num_predict\":-3}}", 400, "invalid_value", "num_predict" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"options\":{\"top_k\":\"a\"}}", 400, "invalid_type", "top_k" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"options\":{\"repeat_last_n\":-2}}", 400, "invalid_value", "repeat_last_n" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}", 400, "unsupported_value", "messages" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"think\":1}", 400, "invalid_type", "think" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"thinking\":1}]}", 400, "invalid_type", "thinking" },
    { API_OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":[]}]}", 400, "invalid_type", "reasoning_content" },
    { API_OLLAMA_CHAT, "{\"model\":\"m\"," MSG ",\"think\":\"max\"}", 400, "invalid_value", "think" },
    { API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"think\":[]}", 400, "invalid_type", "think" },
    { API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":5}", 400, "invalid_type", "prompt" },
    { API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"images\":[\"aGk=\"]}", 400, "unsupported_value", "images" },
    { API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"raw\":1}", 400, "invalid_type", "raw" },
    { API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"s\"}", 400, "unsupported_value", "suffix" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_effort\":\"max\"}", 400, "invalid_value", "reasoning_effort" },
    { API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_effort\":1}", 400, "invalid_type", "reasoning_effort" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\"," MSG "}", 400, "missing_field", "max_tokens" },
    { API_ANTHROPIC_MESSAGES, "{\"max_tokens\":1," MSG "}", 400, "missing_field", "model" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":0," MSG "}", 400, "invalid_value", "max_tokens" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"system\":\"s\",\"messages\":[]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\"}]}", 400, "missing_field", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}", 400, "unsupported_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":[{\"type\":\"image\"}]}]}]}", 400, "unsupported_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":[]}]}]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\"}]}]}", 400, "invalid_value", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"system\":5," MSG "}", 400, "invalid_type", "system" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"stop_sequences\":\"x\"," MSG "}", 400, "invalid_type", "stop_sequences" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1.5," MSG "}", 400, "invalid_value", "temperature" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"f\"}]," MSG "}", 400, "invalid_value", "tools" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]," MSG "}", 400, "unsupported_value", "tools" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":\"auto\"," MSG "}", 400, "invalid_type", "tool_choice" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"sometimes\"}," MSG "}", 400, "invalid_value", "tool_choice" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"any\"}," MSG "}", 400, "invalid_value", "tool_choice" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"thinking\":{\"type\":\"enabled\"}," MSG "}", 400, "invalid_value", "thinking" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"thinking\":true," MSG "}", 400, "invalid_type", "thinking" },
    { API_ANTHROPIC_COUNT, "{\"model\":\"m\"}", 400, "missing_field", "messages" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"output_config\":{\"format\":{\"type\":\"xml\"}}," MSG "}", 400, "invalid_value", "output_config" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"output_config\":[]," MSG "}", 400, "invalid_type", "output_config" },
    { API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"thinking\":{\"type\":\"between_tools\"}," MSG "}", 400, "invalid_value", "thinking" },
};

/* An Anthropic body becomes the OpenAI chat it means: tool results before
 * the turn's text, tool_use as tool_calls with object arguments, thinking
 * as reasoning_content, tools as functions, any as required. */
TEST(api_request_anthropic_fields)
{
    api_request r;
    parse_ok(API_ANTHROPIC_MESSAGES,
             "{\"model\":\"m\",\"max_tokens\":9,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":5,"
             "\"stop_sequences\":[\"x\"],\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
             "\"system\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}],"
             "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
             "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
             "\"tool_choice\":{\"type\":\"any\"},\"messages\":["
             "{\"role\":\"user\",\"content\":\"q\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t1\",\"signature\":\"s\"},"
             "{\"type\":\"redacted_thinking\",\"data\":\"z\"},{\"type\":\"thinking\",\"thinking\":\"t2\"},"
             "{\"type\":\"text\",\"text\":\"ok\",\"citations\":[]},"
             "{\"type\":\"tool_use\",\"id\":\"u1\",\"name\":\"f\",\"input\":{\"a\":1}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"u1\",\"content\":\"r1\"},"
             "{\"type\":\"tool_result\",\"tool_use_id\":\"u2\",\"content\":[{\"type\":\"text\",\"text\":\"r2\"}],\"is_error\":true},"
             "{\"type\":\"text\",\"text\":\"more\",\"cache_control\":{\"type\":\"ephemeral\"}}]}]}", &r);
    CHECK_INT(json_array_size(r.messages), ==, 6);
    static const char *const roles[] = { "system", "user", "assistant", "tool", "tool", "user" };
    static const char *const texts[] = { "a\nb", "q", "ok", "r1", "r2", "more" };
    for (size_t i = 0; i < 6; i++) {
        json_t *m = json_array_get(r.messages, i);
        CHECK_STR(json_string_value(json_object_get(m, "role")), roles[i]);
        CHECK_STR(json_string_value(json_object_get(m, "content")), texts[i]);
    }
    json_t *asst = json_array_get(r.messages, 2);
    CHECK_STR(json_string_value(json_object_get(asst, "reasoning_content")), "t1\n\nt2");
    json_t *call = json_array_get(json_object_get(asst, "tool_calls"), 0);
    CHECK_STR(json_string_value(json_object_get(call, "id")), "u1");
    CHECK_STR(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "f");
    CHECK_INT(json_integer_value(json_object_get(json_object_get(json_object_get(call, "function"), "arguments"), "a")), ==, 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(r.messages, 4), "tool_call_id")), "u2");
    CHECK_INT(json_array_size(r.tools), ==, 1);
    json_t *fn = json_object_get(json_array_get(r.tools, 0), "function");
    CHECK_STR(json_string_value(json_object_get(fn, "description")), "d");
    CHECK_STR(json_string_value(json_object_get(json_object_get(fn, "parameters"), "type")), "object");
    CHECK_INT(r.tool_choice, ==, TOOL_CHOICE_REQUIRED);
    CHECK_INT(r.think, ==, THINK_ON);
    CHECK_INT(r.max_tokens, ==, 9);
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-6);
    CHECK_INT(r.sampling.top_k, ==, 5);
    CHECK(r.stream && r.n_stops == 1 && !strcmp(r.stops[0], "x"));
    api_request_free(&r);
    /* tool_choice none: the tools are not rendered; thinking disabled */
    parse_ok(API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1," MSG ",\"tool_choice\":{\"type\":\"none\"},"
             "\"thinking\":{\"type\":\"disabled\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]}", &r);
    CHECK(r.tools == NULL && r.think == THINK_OFF);
    api_request_free(&r);
    parse_ok(API_ANTHROPIC_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1," MSG ",\"thinking\":{\"type\":\"adaptive\"},"
             "\"output_config\":{\"effort\":\"high\"}}", &r);
    CHECK_INT(r.think, ==, THINK_UNSET);      /* the template's default */
    api_request_free(&r);
    /* count_tokens: no max_tokens, and sampling fields do not matter */
    parse_ok(API_ANTHROPIC_COUNT, "{\"model\":\"m\"," MSG ",\"temperature\":7,\"stream\":true}", &r);
    CHECK(r.max_tokens == 0 && !r.stream && r.think == THINK_UNSET);
    api_request_free(&r);
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_effort\":\"minimal\"}", &r);
    CHECK_INT(r.think, ==, THINK_OFF);
    api_request_free(&r);
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"reasoning_effort\":\"low\"}", &r);
    CHECK_INT(r.think, ==, THINK_ON);
    api_request_free(&r);
}

TEST(api_request_bad_input_table)
{
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        api_request r;
        api_error e;
        const bad_case *c = &bad[i];
        if (!api_request_parse(c->kind, c->body, strlen(c->body), &r, &e))
            FAIL("case %zu accepted: %s", i, c->body);
        if (e.status != c->status || strcmp(e.code, c->code) || (c->param && strcmp(e.param, c->param)))
            FAIL("case %zu (%s): got %d %s param '%s': %s", i, c->body, e.status, e.code, e.param,
                 e.message);
        CHECK(e.message[0]);
        CHECK_STR(e.type, "invalid_request_error");
        CHECK(r.model == NULL && r.messages == NULL);     /* freed on failure */
    }
}

TEST(api_request_model_checks)
{
    api_request r;
    api_error e;
    parse_ok(API_OPENAI_CHAT, "{\"model\":\"m\"," MSG ",\"logit_bias\":{\"511\":1},\"max_tokens\":100}", &r);
    CHECK_INT(api_request_check(&r, 512, 128, &e), ==, 0);
    CHECK_INT(api_request_check(&r, 511, 128, &e), ==, -1);
    CHECK_STR(e.param, "logit_bias");
    CHECK_INT(api_request_check(&r, 512, 64, &e), ==, -1);
    CHECK_STR(e.param, "max_tokens");
    CHECK(strstr(e.message, "holds 64"));
    api_request_free(&r);
    parse_ok(API_OPENAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,600]}", &r);
    CHECK_INT(api_request_check(&r, 512, 128, &e), ==, -1);
    CHECK_STR(e.param, "prompt");
    api_request_free(&r);
    parse_ok(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"num_predict\":300}}", &r);
    CHECK_INT(api_request_check(&r, 512, 128, &e), ==, -1);
    CHECK_STR(e.param, "num_predict");
    api_request_free(&r);
}
