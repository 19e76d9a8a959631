/* anthropic.c - Anthropic's Messages API answers: the message object of
 * POST /v1/messages, its stream of named server-sent events, the
 * count_tokens answer and Anthropic's error shape.
 *
 * A message's content is a list of blocks: thinking (the answer's
 * reasoning), text, then one tool_use block per tool call, as Anthropic's
 * models order them.  A stream sends
 *   message_start (the message without content, input_tokens), ping,
 *   per block: content_block_start, content_block_delta (text_delta,
 *   thinking_delta, input_json_delta), content_block_stop,
 *   message_delta (stop_reason, stop_sequence, output_tokens), message_stop
 * and an error event if generation fails after the stream began.  Text and
 * thinking go out as the engine makes them; tool calls are parsed at the
 * end of the answer (job.c holds back text that may start one), so each
 * tool_use block's input arrives as one input_json_delta.  Thinking blocks
 * carry an empty signature: there is nothing to sign, and clients send them
 * back only to be rendered into the template again (anthropic_request.c).
 */
#include "server_internal.h"
#include "base/mem.h"

#include <string.h>

enum { BLK_NONE, BLK_TEXT, BLK_THINKING };

static json_t *text_or_empty(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("");
}

/* end_turn, max_tokens, stop_sequence (with the string) or tool_use. */
static const char *stop_reason(const api_job *j, const char **sequence)
{
    *sequence = NULL;
    if (j->tool_calls)
        return "tool_use";
    int k = j->stop ? stop_matched(j->stop) : -1;
    if (k >= 0 && k < j->ar.n_stops) {
        *sequence = j->ar.stops[k];
        return "stop_sequence";
    }
    return j->res.finish == GEN_LENGTH ? "max_tokens" : "end_turn";
}

/* A tool call as a tool_use block: the model's id if it wrote one, else
 * one made of the message's id. */
static json_t *tool_use(const api_job *j, size_t i, bool empty_input)
{
    json_t *c = json_array_get(j->tool_calls, i);
    json_t *fn = json_object_get(c, "function"), *id = json_object_get(c, "id");
    json_t *args = json_object_get(fn, "arguments");
    char idbuf[96];
    snprintf(idbuf, sizeof idbuf, "toolu_%s%zu", j->id + 4, i);   /* after "msg_" */
    return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id",
                     json_is_string(id) ? json_string_value(id) : idbuf, "name",
                     json_object_get(fn, "name"), "input",
                     empty_input || !json_is_object(args) ? json_object() : json_incref(args));
}

static json_t *message(const api_job *j, json_t *content, const char *stop,
                       const char *sequence, int output_tokens)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:{s:i, s:i}}", "id", j->id, "type",
                     "message", "role", "assistant", "model", j->ar.model, "content", content,
                     "stop_reason", stop, "stop_sequence", sequence, "usage", "input_tokens",
                     j->n_prompt, "output_tokens", output_tokens);
}

/* ---- stream ---- */

static void start(api_job *j)
{
    http_stream_start(j, "text/event-stream");
    http_stream_event(j, "message_start", json_pack("{s:s, s:o}", "type", "message_start",
                                                    "message", message(j, json_array(), NULL,
                                                                       NULL, 0)));
    http_stream_event(j, "ping", json_pack("{s:s}", "type", "ping"));
}

static void close_block(api_job *j)
{
    if (j->blk_open == BLK_NONE)
        return;
    http_stream_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type",
                                                         "content_block_stop", "index", j->blk_n));
    j->blk_n++;
    j->blk_open = BLK_NONE;
}

static void block_start(api_job *j, json_t *block)
{
    http_stream_event(j, "content_block_start", json_pack("{s:s, s:i, s:o}", "type",
                                                          "content_block_start", "index",
                                                          j->blk_n, "content_block", block));
}

/* Makes a block of `kind` the open one. */
static void open_block(api_job *j, int kind)
{
    if (j->blk_open == kind)
        return;
    close_block(j);
    j->blk_open = kind;
    if (kind == BLK_TEXT) {
        j->blk_text = true;
        block_start(j, json_pack("{s:s, s:s}", "type", "text", "text", ""));
    } else {
        block_start(j, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
                                 "signature", ""));
    }
}

static void block_delta(api_job *j, json_t *delta)
{
    http_stream_event(j, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type",
                                                          "content_block_delta", "index",
                                                          j->blk_n, "delta", delta));
}

static void delta(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    open_block(j, BLK_TEXT);
    block_delta(j, json_pack("{s:s, s:o}", "type", "text_delta", "text", text_or_empty(text, len)));
}

static void reasoning(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    open_block(j, BLK_THINKING);
    block_delta(j, json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking",
                             text_or_empty(text, len)));
}

static void stream_final(api_job *j, const char *stop, const char *sequence)
{
    /* an answer with neither text nor tool calls still has its (empty)
     * text block, as in the message object */
    if (!j->blk_text && !j->tool_calls)
        open_block(j, BLK_TEXT);
    close_block(j);
    for (size_t i = 0; i < json_array_size(j->tool_calls); i++) {
        block_start(j, tool_use(j, i, true));
        json_t *args = json_object_get(json_object_get(json_array_get(j->tool_calls, i),
                                                       "function"), "arguments");
        char *text = json_is_object(args) ? json_dumps(args, JSON_COMPACT) : NULL;
        block_delta(j, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json",
                                 text ? text : "{}"));
        free(text);
        http_stream_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type",
                                                             "content_block_stop", "index",
                                                             j->blk_n++));
    }
    http_stream_event(j, "message_delta",
                      json_pack("{s:s, s:{s:s, s:s?}, s:{s:i}}", "type", "message_delta",
                                "delta", "stop_reason", stop, "stop_sequence", sequence, "usage",
                                "output_tokens", j->res.n_gen));
    http_stream_event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void final(api_job *j)
{
    const char *sequence;
    const char *stop = stop_reason(j, &sequence);
    if (j->ar.stream) {
        stream_final(j, stop, sequence);
        return;
    }
    json_t *content = json_array();
    if (j->reason.len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking",
                                                 "thinking", text_or_empty(j->reason.p,
                                                                           j->reason.len),
                                                 "signature", ""));
    const char *text = j->content ? j->content : "";
    if (text[0] || !j->tool_calls)
        json_array_append_new(content, json_pack("{s:s, s:s}", "type", "text", "text", text));
    for (size_t i = 0; i < json_array_size(j->tool_calls); i++)
        json_array_append_new(content, tool_use(j, i, false));
    http_reply_json(j->srv, j->req, 200, message(j, content, stop, sequence, j->res.n_gen), NULL,
                    NULL);
}

static void stream_error(api_job *j, const api_error *e)
{
    http_stream_event(j, "error", anthropic_error_json(e));
}

const job_ops anthropic_ops = { start, delta, reasoning, final, stream_error };

void anthropic_count(api_job *j)
{
    http_reply_json(j->srv, j->req, 200, json_pack("{s:i}", "input_tokens", j->n_prompt), NULL,
                    NULL);
}

/* ---- errors ---- */

int anthropic_status(int status)
{
    return status == 429 ? 529 : status;      /* a full queue: overloaded, retry */
}

json_t *anthropic_error_json(const api_error *e)
{
    const char *type;
    switch (e->status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: case 503: type = "overloaded_error"; break;
    default: type = e->status >= 500 ? "api_error" : "invalid_request_error";
    }
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                     e->message);
}
