/* openai.c - the OpenAI endpoints: objects of /v1/chat/completions and
 * /v1/completions, streamed (server-sent events, "data: [DONE]" last) and
 * not, and /v1/models.
 *
 * Shapes follow OpenAI's API reference: chat.completion(.chunk) and
 * text_completion objects with id, object, created, model, choices and
 * usage (with prompt_tokens_details.cached_tokens for prefix reuse); a
 * "timings" object as llama.cpp's server adds carries the speeds.
 */
#include "server_internal.h"
#include "base/mem.h"

#include <string.h>

static json_t *base_obj(const api_job *j, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object", object, "created",
                     (json_int_t)j->created, "model", j->ar.model);
}

static json_t *usage(const api_job *j)
{
    const gen_result *r = &j->res;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r->n_prompt,
                     "completion_tokens", r->n_gen, "total_tokens", r->n_prompt + r->n_gen,
                     "prompt_tokens_details", "cached_tokens", r->n_cached);
}

static json_t *timings(const api_job *j)
{
    const gen_result *r = &j->res;
    int evaluated = r->n_prompt - r->n_cached;
    return json_pack("{s:i, s:i, s:f, s:i, s:f, s:f, s:f, s:f}", "cache_n", r->n_cached,
                     "prompt_n", evaluated, "prompt_ms", r->t_prompt_s * 1e3,
                     "predicted_n", r->n_gen, "predicted_ms", r->t_gen_s * 1e3,
                     "prompt_per_second", r->t_prompt_s > 0 ? evaluated / r->t_prompt_s : 0.0,
                     "predicted_per_second",
                     r->t_gen_s > 0 && r->n_gen > 1 ? (r->n_gen - 1) / r->t_gen_s : 0.0,
                     "queue_ms", r->t_queue_s * 1e3);
}

static json_t *string_or_null(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    return v ? v : json_null();
}

static json_t *bytes_of(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}. */
static json_t *chat_logprobs(const api_job *j, int from, int to)
{
    if (!j->ar.logprobs)
        return json_null();
    json_t *content = json_array();
    strbuf t = { 0 };
    for (int i = from; i < to; i++) {
        const tok_rec *r = &j->toks[i];
        sb_reset(&t);
        job_token_text(j, r->id, &t);
        json_t *top = json_array();
        strbuf tt = { 0 };
        for (int k = 0; k < r->n_top; k++) {
            sb_reset(&tt);
            job_token_text(j, r->top_ids[k], &tt);
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                                 string_or_null(tt.p ? tt.p : "", tt.len),
                                                 "logprob", (double)r->top_lp[k], "bytes",
                                                 bytes_of(tt.p, tt.len)));
        }
        sb_free(&tt);
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token",
                                                 string_or_null(t.p ? t.p : "", t.len), "logprob",
                                                 (double)r->logprob, "bytes", bytes_of(t.p, t.len),
                                                 "top_logprobs", top));
    }
    sb_free(&t);
    return json_pack("{s:o}", "content", content);
}

/* Completion logprobs: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const api_job *j, int from, int to, size_t offset)
{
    if (!j->ar.logprobs)
        return json_null();
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    strbuf t = { 0 };
    for (int i = from; i < to; i++) {
        const tok_rec *r = &j->toks[i];
        sb_reset(&t);
        job_token_text(j, r->id, &t);
        json_array_append_new(tokens, string_or_null(t.p ? t.p : "", t.len));
        json_array_append_new(lps, json_real(r->logprob));
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += t.len;
        json_t *top = json_object();
        for (int k = 0; k < r->n_top; k++) {
            sb_reset(&t);
            job_token_text(j, r->top_ids[k], &t);
            json_object_set_new(top, sb_cstr(&t), json_real(r->top_lp[k]));
        }
        json_array_append_new(tops, top);
    }
    sb_free(&t);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

/* Tool calls in OpenAI's shape: arguments as a JSON string, an id each;
 * `indexed` adds the "index" that stream deltas carry. */
static json_t *openai_tool_calls(const api_job *j, bool indexed)
{
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(j->tool_calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        char *args = json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT);
        json_t *id = json_object_get(c, "id");
        char idbuf[96];
        snprintf(idbuf, sizeof idbuf, "call_%s_%zu", strchr(j->id, '-') ? strchr(j->id, '-') + 1 : j->id, i);
        json_t *o = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id",
                              json_is_string(id) ? json_string_value(id) : idbuf, "type", "function",
                              "function", "name", json_object_get(fn, "name"), "arguments",
                              args ? args : "{}");
        free(args);
        if (o && indexed)
            json_object_set_new(o, "index", json_integer((json_int_t)i));
        json_array_append_new(out, o);
    }
    return out;
}

/* ---- chat ---- */

static json_t *chat_chunk(const api_job *j, json_t *delta, json_t *logprobs, const char *finish)
{
    json_t *o = base_obj(j, "chat.completion.chunk");
    json_t *choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", 0, "delta", delta, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason", finish);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return o;
}

static void chat_start(api_job *j)
{
    http_stream_start(j, "text/event-stream");
    http_stream_sse(j, chat_chunk(j, json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                                  NULL, NULL));
}

static void chat_delta(api_job *j, const char *text, size_t len, int from, int to)
{
    http_stream_sse(j, chat_chunk(j, json_pack("{s:o}", "content", string_or_null(text, len)),
                                  j->ar.logprobs ? chat_logprobs(j, from, to) : NULL, NULL));
}

/* DeepSeek's and llama.cpp's field for the thinking part of an answer. */
static void chat_reasoning(api_job *j, const char *text, size_t len, int from, int to)
{
    json_t *delta = json_pack("{s:o}", "reasoning_content", string_or_null(text, len));
    http_stream_sse(j, chat_chunk(j, delta, j->ar.logprobs ? chat_logprobs(j, from, to) : NULL, NULL));
}

static void chat_final(api_job *j)
{
    const char *finish = job_finish_reason(j);
    if (j->ar.stream) {
        if (j->tool_calls)
            http_stream_sse(j, chat_chunk(j, json_pack("{s:o}", "tool_calls",
                                                       openai_tool_calls(j, true)), NULL, NULL));
        http_stream_sse(j, chat_chunk(j, json_object(), NULL, finish));
        if (j->ar.include_usage) {
            json_t *o = base_obj(j, "chat.completion.chunk");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage(j));
            json_object_set_new(o, "timings", timings(j));
            http_stream_sse(j, o);
        }
        http_stream_raw(j, "data: [DONE]\n\n");
        return;
    }
    const char *content = j->content ? j->content : "";
    json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                            j->tool_calls && !content[0] ? json_null() : json_string(content));
    if (j->reason.len)
        json_object_set_new(msg, "reasoning_content", string_or_null(j->reason.p, j->reason.len));
    if (j->tool_calls)
        json_object_set_new(msg, "tool_calls", openai_tool_calls(j, false));
    json_t *o = base_obj(j, "chat.completion");
    json_object_set_new(o, "choices", json_pack("[{s:i, s:o, s:o, s:s}]", "index", 0,
                                                "message", msg, "logprobs",
                                                chat_logprobs(j, 0, j->n_toks),
                                                "finish_reason", finish));
    json_object_set_new(o, "usage", usage(j));
    json_object_set_new(o, "timings", timings(j));
    http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
}

static void stream_error(api_job *j, const api_error *e)
{
    http_stream_sse(j, openai_error_json(e));
    http_stream_raw(j, "data: [DONE]\n\n");
}

const job_ops openai_chat_ops = { chat_start, chat_delta, chat_reasoning, chat_final,
                                  stream_error };

/* ---- completions ---- */

static json_t *text_chunk(const api_job *j, const char *text, size_t len, json_t *logprobs,
                          const char *finish)
{
    json_t *o = base_obj(j, "text_completion");
    json_object_set_new(o, "choices", json_pack("[{s:o, s:i, s:o, s:s?}]", "text",
                                                string_or_null(text, len), "index", 0, "logprobs",
                                                logprobs ? logprobs : json_null(),
                                                "finish_reason", finish));
    return o;
}

static void completion_start(api_job *j)
{
    http_stream_start(j, "text/event-stream");
}

static void completion_delta(api_job *j, const char *text, size_t len, int from, int to)
{
    http_stream_sse(j, text_chunk(j, text, len,
                                  j->ar.logprobs ? completion_logprobs(j, from, to, j->sent) : NULL,
                                  NULL));
}

static void completion_final(api_job *j)
{
    const char *finish = job_finish_reason(j);
    if (j->ar.stream) {
        http_stream_sse(j, text_chunk(j, "", 0, NULL, finish));
        if (j->ar.include_usage) {
            json_t *o = base_obj(j, "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage(j));
            http_stream_sse(j, o);
        }
        http_stream_raw(j, "data: [DONE]\n\n");
        return;
    }
    const char *content = j->content ? j->content : "";
    json_t *o = text_chunk(j, content, strlen(content), completion_logprobs(j, 0, j->n_toks, 0),
                           finish);
    json_object_set_new(o, "usage", usage(j));
    json_object_set_new(o, "timings", timings(j));
    http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
}

const job_ops openai_completion_ops = { completion_start, completion_delta, NULL, completion_final,
                                        stream_error };

/* ---- models ---- */

static json_t *model_obj(const api_model *m)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->name, "object", "model", "created",
                     (json_int_t)m->mtime, "owned_by", "racimo");
}

int openai_models(api_server *s, struct evhttp_request *req, const char *one)
{
    if (one) {
        api_model *m = registry_find(s->reg, one);
        if (!m) {
            api_error e;
            api_fail(&e, 404, "model_not_found", "model", "model '%.200s' not found", one);
            http_reply_error(s, req, false, &e);
            return 404;
        }
        http_reply_json(s, req, 200, model_obj(m), NULL, NULL);
        return 200;
    }
    registry_rescan(s->reg);
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, model_obj(list[i]));
    rc_free(list);
    http_reply_json(s, req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data), NULL,
                    NULL);
    return 200;
}
