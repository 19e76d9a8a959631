/* request.c - JSON bodies of the OpenAI and Ollama endpoints to api_request.
 *
 * Layout: small typed getters that fail with a message naming the field;
 * the pieces the endpoints share (sampling fields, stop strings, messages,
 * tools); one function per endpoint; the model-dependent checks last.
 * JSON null counts as absent everywhere (clients send explicit nulls).
 */
#include "request.h"
#include "base/mem.h"
#include "infer/stop.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_fail(api_error *e, int status, const char *code, const char *param,
             const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s",
             status == 401 ? "authentication_error" :
             status == 404 ? "not_found_error" :
             status == 429 ? "rate_limit_error" :
             status >= 500 ? "server_error" : "invalid_request_error");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad_type(api_error *e, const char *key, const char *want)
{
    return api_fail(e, 400, "invalid_type", key, "'%s' must be %s", key, want);
}

/* The field, or NULL when absent or null. */
static json_t *field(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(const json_t *o, const char *key, bool *out, api_error *e)
{
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad_type(e, key, "true or false");
    *out = json_is_true(v);
    return 0;
}

static int get_number(const json_t *o, const char *key, double lo, double hi, float *out,
                      api_error *e)
{
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad_type(e, key, "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return api_fail(e, 400, "invalid_value", key, "'%s' is %g; it must be between %g and %g",
                        key, d, lo, hi);
    *out = (float)d;
    return 0;
}

static int get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                   bool *present, api_error *e)
{
    json_t *v = field(o, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    /* 5.0 is accepted as 5 (some clients serialise every number as a float) */
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || !(d >= -9.2e18 && d <= 9.2e18))
            return bad_type(e, key, "a whole number");
        *out = (long long)d;
    } else if (json_is_integer(v)) {
        *out = json_integer_value(v);
    } else {
        return bad_type(e, key, "a whole number");
    }
    if (*out < lo || *out > hi)
        return api_fail(e, 400, "invalid_value", key, "'%s' is %lld; it must be between %lld and %lld",
                        key, *out, lo, hi);
    return 0;
}

static int get_string(const json_t *o, const char *key, bool required, char **out, api_error *e)
{
    json_t *v = field(o, key);
    if (!v) {
        if (required)
            return api_fail(e, 400, "missing_field", key, "'%s' is required", key);
        return 0;
    }
    if (!json_is_string(v))
        return bad_type(e, key, "a string");
    if (!(*out = rc_strndup(json_string_value(v), json_string_length(v))))
        return api_fail(e, 500, "out_of_memory", key, "out of memory");
    return 0;
}

/* ---- shared pieces ---- */

static int add_stop(api_request *r, const json_t *s, const char *key, api_error *e)
{
    if (!json_is_string(s))
        return bad_type(e, key, "a string or a list of strings");
    size_t len = json_string_length(s);
    if (len == 0)
        return 0;
    if (len > STOP_MAX_BYTES)
        return api_fail(e, 400, "invalid_value", key, "a stop string is %zu bytes; at most %d",
                        len, STOP_MAX_BYTES);
    if (strlen(json_string_value(s)) != len)
        return api_fail(e, 400, "invalid_value", key, "a stop string holds a NUL character");
    if (r->n_stops >= API_MAX_STOPS)
        return api_fail(e, 400, "invalid_value", key, "at most %d stop strings", API_MAX_STOPS);
    if (!(r->stops[r->n_stops] = rc_strdup(json_string_value(s))))
        return api_fail(e, 500, "out_of_memory", key, "out of memory");
    r->n_stops++;
    return 0;
}

static int get_stops(api_request *r, const json_t *o, const char *key, api_error *e)
{
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s)
            if (add_stop(r, s, key, e))
                return -1;
        return 0;
    }
    return add_stop(r, v, key, e);
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}. */
static int get_logit_bias(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = field(o, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return bad_type(e, "logit_bias", "an object mapping token ids to numbers");
    size_t n = json_object_size(v);
    if (n == 0)
        return 0;
    if (n > API_MAX_BIAS)
        return api_fail(e, 400, "invalid_value", "logit_bias", "at most %d logit_bias entries",
                        API_MAX_BIAS);
    r->bias_ids = rc_calloc(n, sizeof *r->bias_ids);
    r->bias_values = rc_calloc(n, sizeof *r->bias_values);
    if (!r->bias_ids || !r->bias_values)
        return api_fail(e, 500, "out_of_memory", "logit_bias", "out of memory");
    const char *k;
    json_t *b;
    json_object_foreach(v, k, b) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id > INT32_MAX)
            return api_fail(e, 400, "invalid_value", "logit_bias",
                            "logit_bias key '%.64s' is not a token id", k);
        if (!json_is_number(b))
            return bad_type(e, "logit_bias", "an object mapping token ids to numbers");
        double d = json_number_value(b);
        if (!(d >= -100.0 && d <= 100.0))
            return api_fail(e, 400, "invalid_value", "logit_bias",
                            "logit_bias values must be between -100 and 100, not %g", d);
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias] = (float)d;
        r->n_bias++;
    }
    r->sampling.bias_ids = r->bias_ids;
    r->sampling.bias_values = r->bias_values;
    r->sampling.n_bias = r->n_bias;
    return 0;
}

/* A seed of 0 asks the sampler for a clock seed; a client that sends 0
 * wants reproducible output, so 0 maps to a fixed nonzero value. */
static uint64_t client_seed(long long s)
{
    return s == 0 ? 0x5eed5eed5eed5eedULL : (uint64_t)s;
}

/* Sampling fields with OpenAI names (also top_k, min_p and
 * repetition_penalty, which llama.cpp's and vLLM's servers accept). */
static int get_openai_sampling(api_request *r, const json_t *o, api_error *e)
{
    sampler_params *s = &r->sampling;
    long long v;
    bool has;
    if (get_number(o, "temperature", 0, 2, &s->temperature, e) ||
        get_number(o, "top_p", 0, 1, &s->top_p, e) ||
        get_number(o, "min_p", 0, 1, &s->min_p, e) ||
        get_number(o, "presence_penalty", -2, 2, &s->presence_penalty, e) ||
        get_number(o, "frequency_penalty", -2, 2, &s->frequency_penalty, e) ||
        get_number(o, "repetition_penalty", 0.01, 10, &s->repeat_penalty, e))
        return -1;
    if (get_int(o, "top_k", 0, 1 << 24, &v, &has, e))
        return -1;
    if (has)
        s->top_k = (int)v;
    if (get_int(o, "seed", INT64_MIN, INT64_MAX, &v, &has, e))
        return -1;
    if (has)
        s->seed = client_seed(v);
    return get_logit_bias(r, o, e);
}

static int get_openai_common(api_request *r, const json_t *o, api_error *e)
{
    long long v;
    bool has;
    if (get_string(o, "model", true, &r->model, e))
        return -1;
    if (!r->model[0])
        return api_fail(e, 400, "invalid_value", "model", "'model' is empty");
    if (get_bool(o, "stream", &r->stream, e) || get_bool(o, "ignore_eos", &r->ignore_eos, e) ||
        get_openai_sampling(r, o, e) ||
        get_stops(r, o, "stop", e) || api_request_get_grammar(r, o, e))
        return -1;
    if (get_int(o, "n", 1, 1 << 20, &v, &has, e))
        return -1;
    if (has && v != 1)
        return api_fail(e, 400, "unsupported_value", "n",
                        "'n' is %lld; racimo returns one choice per request (n = 1)", v);
    /* max_completion_tokens replaces max_tokens in newer clients */
    const char *mt = field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(o, mt, INT64_MIN, INT64_MAX, &v, &has, e))
        return -1;
    if (has) {
        if (v < 1 || v > API_MAX_TOKENS_LIMIT)
            return api_fail(e, 400, "invalid_value", mt,
                            "'%s' is %lld; it must be at least 1 and at most the context size",
                            mt, v);
        r->max_tokens = (int)v;
    }
    json_t *so = field(o, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad_type(e, "stream_options", "an object");
        if (get_bool(so, "include_usage", &r->include_usage, e))
            return -1;
    }
    return api_request_get_format(r, o, e);
}

/* Message content: a string, or an array of {"type": "text", "text": ...}
 * parts (joined by newlines); other part types are refused. */
static int content_text(const json_t *c, const char *param, json_t **out, api_error *e)
{
    if (!c) {
        *out = json_string("");
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c))
        return bad_type(e, param, "a string or an array of text parts");
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *type = json_is_object(p) ? json_object_get(p, "type") : NULL;
        json_t *text = json_is_object(p) ? json_object_get(p, "text") : NULL;
        if (!json_is_string(type))
            return bad_type(e, param, "an array of {\"type\": \"text\", \"text\": ...} parts");
        if (strcmp(json_string_value(type), "text"))
            return api_fail(e, 400, "unsupported_value", param,
                            "content parts of type '%.40s' are not supported (text only)",
                            json_string_value(type));
        if (!json_is_string(text))
            return bad_type(e, param, "text parts with a string 'text'");
        total += json_string_length(text) + 1;
    }
    char *buf = rc_malloc(total + 1), *w = buf;
    if (!buf)
        return api_fail(e, 500, "out_of_memory", param, "out of memory");
    json_array_foreach(c, i, p) {
        json_t *text = json_object_get(p, "text");
        if (i)
            *w++ = '\n';
        memcpy(w, json_string_value(text), json_string_length(text));
        w += json_string_length(text);
    }
    *out = json_stringn(buf, (size_t)(w - buf));
    rc_free(buf);
    return 0;
}

/* Tool calls of an assistant message, normalised to
 * [{"id", "type": "function", "function": {"name", "arguments": {...}}}].
 * OpenAI sends arguments as a JSON string; templates expect an object, so
 * a string that parses as an object becomes one (others stay strings). */
static int norm_tool_calls(const json_t *tc, json_t **out, api_error *e)
{
    if (!json_is_array(tc))
        return bad_type(e, "tool_calls", "an array");
    json_t *arr = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name)) {
            json_decref(arr);
            return bad_type(e, "tool_calls", "a list of {\"function\": {\"name\": ...}} objects");
        }
        json_t *args = json_object_get(fn, "arguments"), *a;
        if (json_is_string(args)) {
            a = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
            if (!json_is_object(a)) {
                json_decref(a);
                a = json_incref(args);
            }
        } else if (json_is_object(args)) {
            a = json_incref(args);
        } else {
            a = json_object();
        }
        json_t *id = json_object_get(c, "id");
        json_t *n = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function",
                              "name", name, "arguments", a);
        if (n && json_is_string(id))
            json_object_set(n, "id", id);
        if (!n || json_array_append_new(arr, n)) {
            json_decref(arr);
            return api_fail(e, 500, "out_of_memory", "tool_calls", "out of memory");
        }
    }
    *out = arr;
    return 0;
}

static int get_messages(api_request *r, const json_t *o, api_error *e)
{
    json_t *msgs = field(o, "messages");
    if (!msgs)
        return api_fail(e, 400, "missing_field", "messages", "'messages' is required");
    if (!json_is_array(msgs))
        return bad_type(e, "messages", "an array of messages");
    size_t n = json_array_size(msgs);
    if (n == 0)
        return api_fail(e, 400, "invalid_value", "messages", "'messages' is empty");
    if (n > API_MAX_MESSAGES)
        return api_fail(e, 400, "invalid_value", "messages", "at most %d messages", API_MAX_MESSAGES);
    if (!(r->messages = json_array()))
        return api_fail(e, 500, "out_of_memory", "messages", "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m))
            return bad_type(e, "messages", "an array of objects");
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return api_fail(e, 400, "invalid_value", "messages",
                            "message %zu has no string 'role'", i);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer"))       /* OpenAI's newer name for system */
            rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool"))
            return api_fail(e, 400, "invalid_value", "messages",
                            "message %zu has role '%.40s'; want system, user, assistant or tool",
                            i, rs);
        if (json_object_get(m, "images") && json_array_size(json_object_get(m, "images")))
            return api_fail(e, 400, "unsupported_value", "messages",
                            "images are not supported (text models only)");
        json_t *content = NULL, *nm = NULL;
        if (content_text(field(m, "content"), "messages", &content, e))
            return -1;
        nm = json_pack("{s:s, s:o}", "role", rs, "content", content);
        if (!nm || json_array_append_new(r->messages, nm))
            return api_fail(e, 500, "out_of_memory", "messages", "out of memory");
        json_t *tc = field(m, "tool_calls"), *ntc = NULL;
        if (tc) {
            if (norm_tool_calls(tc, &ntc, e))
                return -1;
            json_object_set_new(nm, "tool_calls", ntc);
        }
        static const char *const copy[] = { "tool_call_id", "name" };
        for (int k = 0; k < 2; k++) {
            json_t *v = field(m, copy[k]);
            if (v && !json_is_string(v))
                return bad_type(e, copy[k], "a string");
            if (v)
                json_object_set(nm, copy[k], v);
        }
        /* an earlier answer's thinking, for templates that render it back
         * (Qwen3, Kimi K2 Thinking read reasoning_content, llama.cpp's name;
         * Ollama calls it thinking) */
        const char *rkey = r->kind == API_OLLAMA_CHAT ? "thinking" : "reasoning_content";
        json_t *thought = field(m, rkey);
        if (thought && !json_is_string(thought))
            return bad_type(e, rkey, "a string");
        if (thought && !strcmp(rs, "assistant"))
            json_object_set(nm, "reasoning_content", thought);
    }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description",
 * "parameters"}}], kept as given after checking the shape. */
static int get_tools(api_request *r, const json_t *o, api_error *e)
{
    json_t *tools = field(o, "tools");
    json_t *tc = field(o, "tool_choice");
    if (tc) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none"))
                r->tool_choice = TOOL_CHOICE_NONE;
            else if (!strcmp(s, "required"))
                r->tool_choice = TOOL_CHOICE_REQUIRED;
            else if (strcmp(s, "auto"))
                return api_fail(e, 400, "invalid_value", "tool_choice",
                                "tool_choice '%.40s': want none, auto, required or an object", s);
        } else if (!json_is_object(tc)) {
            return bad_type(e, "tool_choice", "a string or an object");
        } else {
            /* {"type": "function", "function": {"name": ...}}: that function */
            json_t *type = json_object_get(tc, "type");
            json_t *name = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_string(name) || (type && !(json_is_string(type) &&
                                                    !strcmp(json_string_value(type), "function"))))
                return api_fail(e, 400, "invalid_value", "tool_choice",
                                "tool_choice must be none, auto, required or {\"type\": "
                                "\"function\", \"function\": {\"name\": ...}}");
            r->tool_choice = TOOL_CHOICE_REQUIRED;
            if (!(r->tool_choice_name = rc_strdup(json_string_value(name))))
                return api_fail(e, 500, "out_of_memory", "tool_choice", "out of memory");
        }
    }
    if (!tools || !json_array_size(tools)) {
        if (r->tool_choice == TOOL_CHOICE_REQUIRED)
            return api_fail(e, 400, "invalid_value", "tool_choice",
                            "tool_choice asks for a tool call, but the request has no 'tools'");
        if (!tools)
            return 0;
    }
    if (!json_is_array(tools))
        return bad_type(e, "tools", "an array");
    if (json_array_size(tools) > API_MAX_TOOLS)
        return api_fail(e, 400, "invalid_value", "tools", "at most %d tools", API_MAX_TOOLS);
    size_t i;
    json_t *t;
    bool named = false;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
            (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))))
            return api_fail(e, 400, "invalid_value", "tools",
                            "tool %zu is not {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_object(params) && !json_is_null(params))
            return bad_type(e, "tools", "tools whose 'parameters' is a JSON schema object");
        if (r->tool_choice_name &&
            !strcmp(json_string_value(json_object_get(fn, "name")), r->tool_choice_name))
            named = true;
    }
    if (r->tool_choice_name && !named)
        return api_fail(e, 400, "invalid_value", "tool_choice",
                        "tool_choice names '%.64s', which is not among the tools",
                        r->tool_choice_name);
    if (json_array_size(tools) && r->tool_choice != TOOL_CHOICE_NONE)
        r->tools = json_incref(tools);
    return 0;
}

/* chat_template_kwargs (llama.cpp's and vLLM's name): an object whose
 * members become template variables, e.g. {"enable_thinking": false}.  The
 * variables every render sets are not the client's to replace. */
static int get_template_vars(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = field(o, "chat_template_kwargs");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return bad_type(e, "chat_template_kwargs", "an object of template variables");
    static const char *const reserved[] = { "messages", "tools", "add_generation_prompt",
                                            "bos_token", "eos_token" };
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (json_object_get(v, reserved[i]))
            return api_fail(e, 400, "invalid_value", "chat_template_kwargs",
                            "chat_template_kwargs may not set '%s' (the request gives it)",
                            reserved[i]);
    if (json_object_size(v))
        r->template_vars = json_incref(v);
    return 0;
}

/* llama.cpp's reasoning_format: "none" leaves thinking in the content;
 * "auto" and "deepseek" (the default) move it to reasoning_content. */
static int get_reasoning_format(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = field(o, "reasoning_format");
    if (!v)
        return 0;
    if (!json_is_string(v))
        return bad_type(e, "reasoning_format", "a string");
    const char *s = json_string_value(v);
    if (!strcmp(s, "none"))
        r->reasoning_format = REASONING_FORMAT_NONE;
    else if (strcmp(s, "auto") && strcmp(s, "deepseek"))
        return api_fail(e, 400, "invalid_value", "reasoning_format",
                        "reasoning_format '%.40s': want none, auto or deepseek", s);
    return 0;
}

/* Ollama's think: true or false; the effort levels of gpt-oss ("high",
 * "medium", "low") mean thinking on, as no other model has levels. */
static int get_think(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = field(o, "think");
    if (!v)
        return 0;
    if (json_is_boolean(v)) {
        r->think = json_is_true(v) ? THINK_ON : THINK_OFF;
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "high") || !strcmp(s, "medium") || !strcmp(s, "low")) {
            r->think = THINK_ON;
            return 0;
        }
        return api_fail(e, 400, "invalid_value", "think",
                        "think '%.40s': want true, false, \"high\", \"medium\" or \"low\"", s);
    }
    return bad_type(e, "think", "true or false");
}

/* OpenAI's reasoning_effort: "none" and "minimal" switch thinking off,
 * "low", "medium" and "high" on (no model here has levels). */
static int get_reasoning_effort(api_request *r, const json_t *o, api_error *e)
{
    json_t *v = field(o, "reasoning_effort");
    if (!v)
        return 0;
    if (!json_is_string(v))
        return bad_type(e, "reasoning_effort", "a string");
    const char *s = json_string_value(v);
    if (!strcmp(s, "none") || !strcmp(s, "minimal"))
        r->think = THINK_OFF;
    else if (!strcmp(s, "low") || !strcmp(s, "medium") || !strcmp(s, "high"))
        r->think = THINK_ON;
    else
        return api_fail(e, 400, "invalid_value", "reasoning_effort",
                        "reasoning_effort '%.40s': want none, minimal, low, medium or high", s);
    return 0;
}

/* ---- endpoints ---- */

static int parse_openai_chat(api_request *r, const json_t *o, api_error *e)
{
    if (get_openai_common(r, o, e) || get_messages(r, o, e) || get_tools(r, o, e) ||
        get_bool(o, "logprobs", &r->logprobs, e) || get_template_vars(r, o, e) ||
        get_reasoning_format(r, o, e) || get_reasoning_effort(r, o, e))
        return -1;
    long long v;
    bool has;
    if (get_int(o, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &v, &has, e))
        return -1;
    if (has) {
        if (!r->logprobs && v > 0)
            return api_fail(e, 400, "invalid_value", "top_logprobs",
                            "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = (int)v;
    }
    return 0;
}

static int parse_openai_completion(api_request *r, const json_t *o, api_error *e)
{
    if (get_openai_common(r, o, e))
        return -1;
    json_t *p = field(o, "prompt");
    if (!p)
        return api_fail(e, 400, "missing_field", "prompt", "'prompt' is required");
    /* a one-element list is the same prompt; more would be n > 1 choices */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (!(r->prompt = rc_strndup(json_string_value(p), json_string_length(p))))
            return api_fail(e, 500, "out_of_memory", "prompt", "out of memory");
        if (!r->prompt[0])
            return api_fail(e, 400, "invalid_value", "prompt", "'prompt' is empty");
    } else if (json_is_array(p) && json_array_size(p) > 0 &&
               json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p), i;
        json_t *t;
        if (n > (size_t)API_MAX_TOKENS_LIMIT)
            return api_fail(e, 400, "invalid_value", "prompt", "the prompt is too long");
        if (!(r->prompt_ids = rc_calloc(n, sizeof *r->prompt_ids)))
            return api_fail(e, 500, "out_of_memory", "prompt", "out of memory");
        json_array_foreach(p, i, t) {
            if (!json_is_integer(t) || json_integer_value(t) < 0 ||
                json_integer_value(t) > INT32_MAX)
                return api_fail(e, 400, "invalid_value", "prompt",
                                "prompt token %zu is not a token id", i);
            r->prompt_ids[i] = (int32_t)json_integer_value(t);
        }
        r->n_prompt_ids = (int)n;
    } else if (json_is_array(p) && json_array_size(p) > 1) {
        return api_fail(e, 400, "unsupported_value", "prompt",
                        "one prompt per request (a list of %zu prompts would be %zu choices)",
                        json_array_size(p), json_array_size(p));
    } else {
        return bad_type(e, "prompt", "a string or a list of token ids");
    }
    /* logprobs here is an integer: how many alternatives per token */
    long long v;
    bool has;
    if (get_int(o, "logprobs", 0, API_MAX_TOP_LOGPROBS, &v, &has, e))
        return -1;
    if (has) {
        r->logprobs = true;
        r->top_logprobs = (int)v;
    }
    bool echo = false;
    if (get_bool(o, "echo", &echo, e))
        return -1;
    if (echo)
        return api_fail(e, 400, "unsupported_value", "echo", "'echo' is not supported");
    json_t *suffix = field(o, "suffix");
    if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return api_fail(e, 400, "unsupported_value", "suffix", "'suffix' is not supported");
    return 0;
}

/* Ollama's options object (names of its Modelfile parameters). */
static int get_ollama_options(api_request *r, const json_t *o, api_error *e)
{
    json_t *opt = field(o, "options");
    if (!opt)
        return 0;
    if (!json_is_object(opt))
        return bad_type(e, "options", "an object");
    sampler_params *s = &r->sampling;
    long long v;
    bool has;
    if (get_number(opt, "temperature", 0, 100, &s->temperature, e) ||
        get_number(opt, "top_p", 0, 1, &s->top_p, e) ||
        get_number(opt, "min_p", 0, 1, &s->min_p, e) ||
        get_number(opt, "repeat_penalty", 0.01, 100, &s->repeat_penalty, e) ||
        get_number(opt, "presence_penalty", -100, 100, &s->presence_penalty, e) ||
        get_number(opt, "frequency_penalty", -100, 100, &s->frequency_penalty, e) ||
        get_stops(r, opt, "stop", e))
        return -1;
    if (get_int(opt, "top_k", 0, 1 << 24, &v, &has, e))
        return -1;
    if (has)
        s->top_k = (int)v;
    if (get_int(opt, "repeat_last_n", -1, 1 << 24, &v, &has, e))
        return -1;
    if (has)
        s->repeat_last_n = (int)v;
    if (get_int(opt, "seed", INT64_MIN, INT64_MAX, &v, &has, e))
        return -1;
    if (has)
        s->seed = client_seed(v);
    /* num_predict: -1 unlimited, -2 fill the context (both: until full) */
    if (get_int(opt, "num_predict", -2, API_MAX_TOKENS_LIMIT, &v, &has, e))
        return -1;
    if (has)
        r->max_tokens = v > 0 ? (int)v : 0;
    if (has && v == 0)
        return api_fail(e, 400, "invalid_value", "num_predict", "'num_predict' is 0");
    return 0;
}

static int get_ollama_common(api_request *r, const json_t *o, api_error *e)
{
    r->stream = true;      /* Ollama streams unless told not to */
    if (get_string(o, "model", false, &r->model, e))
        return -1;
    if (!r->model) {
        json_t *name = field(o, "name");      /* older clients */
        if (name && get_string(o, "name", true, &r->model, e))
            return -1;
    }
    if (!r->model || !r->model[0])
        return api_fail(e, 400, "missing_field", "model", "model is required");
    if (get_bool(o, "stream", &r->stream, e) || get_ollama_options(r, o, e) ||
        get_think(r, o, e) || api_request_get_grammar(r, o, e))
        return -1;
    return api_request_get_format(r, o, e);
}

static int parse_ollama_chat(api_request *r, const json_t *o, api_error *e)
{
    return get_ollama_common(r, o, e) || get_messages(r, o, e) || get_tools(r, o, e) ? -1 : 0;
}

static int parse_ollama_generate(api_request *r, const json_t *o, api_error *e)
{
    if (get_ollama_common(r, o, e) || get_string(o, "prompt", false, &r->prompt, e) ||
        get_string(o, "system", false, &r->system, e) || get_bool(o, "raw", &r->raw, e))
        return -1;
    json_t *images = field(o, "images");
    if (images && (!json_is_array(images) || json_array_size(images)))
        return api_fail(e, 400, "unsupported_value", "images",
                        "images are not supported (text models only)");
    json_t *suffix = field(o, "suffix");
    if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return api_fail(e, 400, "unsupported_value", "suffix", "'suffix' is not supported");
    if (!r->prompt || !r->prompt[0])
        r->load_only = true;
    return 0;
}

/* Anthropic's Messages body, as the OpenAI chat body it means. */
static int parse_anthropic(api_request *r, const json_t *o, api_error *e)
{
    json_t *chat = NULL;
    int rc = anthropic_to_chat(o, r->kind == API_ANTHROPIC_COUNT, &chat, &r->think, e);
    if (rc == 0)
        rc = parse_openai_chat(r, chat, e);
    json_decref(chat);
    return rc;
}

int api_request_parse(int kind, const char *body, size_t len, api_request *r, api_error *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->think = THINK_UNSET;
    sampler_params_default(&r->sampling);
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return api_fail(e, 400, "invalid_json", NULL,
                        "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                        je.column);
    int rc;
    if (!json_is_object(o)) {
        rc = api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    } else {
        switch (kind) {
        case API_OPENAI_CHAT:       rc = parse_openai_chat(r, o, e); break;
        case API_OPENAI_COMPLETION: rc = parse_openai_completion(r, o, e); break;
        case API_OLLAMA_CHAT:       rc = parse_ollama_chat(r, o, e); break;
        case API_OLLAMA_GENERATE:   rc = parse_ollama_generate(r, o, e); break;
        case API_ANTHROPIC_MESSAGES:
        case API_ANTHROPIC_COUNT:   rc = parse_anthropic(r, o, e); break;
        case API_OPENAI_EMBED:
        case API_OLLAMA_EMBED:
        case API_OLLAMA_EMBEDDINGS: rc = api_embed_parse(r, o, e); break;
        default: rc = api_fail(e, 500, "internal", NULL, "unknown endpoint kind %d", kind);
        }
    }
    json_decref(o);
    if (rc)
        api_request_free(r);
    return rc;
}

void api_request_free(api_request *r)
{
    rc_free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    rc_free(r->tool_choice_name);
    json_decref(r->template_vars);
    rc_free(r->prompt);
    rc_free(r->prompt_ids);
    rc_free(r->system);
    rc_free(r->bias_ids);
    rc_free(r->bias_values);
    for (int i = 0; i < r->n_stops; i++)
        rc_free(r->stops[i]);
    rc_free(r->grammar);
    for (int i = 0; i < r->n_grammar_triggers; i++)
        rc_free(r->grammar_triggers[i]);
    for (int i = 0; i < r->n_inputs; i++) {
        rc_free(r->inputs[i].text);
        rc_free(r->inputs[i].ids);
    }
    rc_free(r->inputs);
    memset(r, 0, sizeof *r);
}

int api_request_check(const api_request *r, int n_vocab, int n_ctx, api_error *e)
{
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_ids[i] >= n_vocab)
            return api_fail(e, 400, "invalid_value", "logit_bias",
                            "logit_bias names token %d; the vocabulary has %d tokens",
                            r->bias_ids[i], n_vocab);
    for (int i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] >= n_vocab)
            return api_fail(e, 400, "invalid_value", "prompt",
                            "prompt token %d is %d; the vocabulary has %d tokens", i,
                            r->prompt_ids[i], n_vocab);
    /* Anthropic's max_tokens is required, so agents send their own ceiling
     * (32000 and more) whatever the model: beyond the context it means
     * until the context is full, as the answer's stop_reason then says */
    if (r->max_tokens > n_ctx && r->kind != API_ANTHROPIC_MESSAGES)
        return api_fail(e, 400, "invalid_value",
                        r->kind == API_OLLAMA_CHAT || r->kind == API_OLLAMA_GENERATE ?
                        "num_predict" : "max_tokens",
                        "%d tokens requested; the context of a sequence holds %d",
                        r->max_tokens, n_ctx);
    return 0;
}
