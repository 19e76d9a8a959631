/* fuzz_template.c - libFuzzer target for the chat-template engine.
 *
 * The input is template source; it is parsed and rendered with a fixed
 * small conversation (system, user, assistant with a tool call, tool
 * result) and one tool, under tight limits so every input finishes fast.
 * Any error return is fine; crashes, sanitizer reports, leaks and hangs are
 * not.  Seeds: fuzz/corpus/template. */
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/mem.h"
#include "jinja/jinja.h"

static const char *CONVERSATION =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are terse.\"},"
    "{\"role\": \"user\", \"content\": \"Weather in M\\u00e1laga? <b>now</b> \\ud83d\\ude00\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\","
    " \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"M\\u00e1laga\", \"days\": [1, 2.5, true, null]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"{\\\"temp\\\": 21}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>hm</think>21 degrees.\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"description\": \"Current weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"array\","
    " \"items\": {\"type\": \"integer\"}}}, \"required\": [\"city\"]}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars_obj;
    static jinja_var vars[16];
    static size_t n_vars;
    if (!vars_obj) {
        vars_obj = json_loads(CONVERSATION, 0, NULL);
        const char *key;
        json_t *val;
        json_object_foreach(vars_obj, key, val) {
            vars[n_vars].name = key;
            vars[n_vars++].value = val;
        }
    }
    jinja_limits lim = {0};
    lim.max_steps = 300000;
    lim.max_output_bytes = 1 << 20;
    lim.max_memory_bytes = 64 << 20;
    lim.max_depth = 200;

    jinja_template *t = NULL;
    if (jinja_parse((const char *)data, size, &t) == 0) {
        char *out = NULL;
        size_t out_len = 0;
        if (jinja_render(t, vars, n_vars, &lim, &out, &out_len) == 0 && out[out_len] != '\0')
            __builtin_trap();   /* the result must be NUL-terminated */
        rc_free(out);
    }
    jinja_free(t);
    return 0;
}
