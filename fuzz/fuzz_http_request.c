/* fuzz_http_request.c - libFuzzer target for request bodies: the JSON ->
 * api_request conversion of every endpoint (src/api/request.c), and the
 * parsers that read generated text (tool calls, thinking blocks).  The
 * first byte picks the endpoint (and the tool format, the thinking mode and
 * the piece size; 0x60 set: an embeddings endpoint); the rest is the body.  Each accepted request must be
 * internally consistent and pass api_request_check or fail it cleanly; each
 * rejected one must carry a 4xx status and a message.  The thinking split
 * of the text fed in pieces must equal the split of the whole text.
 * libevent's HTTP parsing is libevent's: not fuzzed here.  Seeds:
 * fuzz/corpus/http_request. */
#include "api/reasoning.h"
#include "api/request.h"
#include "api/tool_calls.h"
#include "base/mem.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int kind = data[0] % API_N_KINDS;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    api_request r;
    api_error e;
    if (api_request_parse(kind, body, len, &r, &e) == 0) {
        if (!r.model || !r.model[0])
            abort();
        bool embed = kind == API_OPENAI_EMBED || kind == API_OLLAMA_EMBED ||
                     kind == API_OLLAMA_EMBEDDINGS;
        if (kind != API_OPENAI_COMPLETION && kind != API_OLLAMA_GENERATE && !embed &&
            !json_array_size(r.messages))
            abort();
        if (r.n_stops < 0 || r.n_stops > API_MAX_STOPS || r.top_logprobs < 0 ||
            r.top_logprobs > API_MAX_TOP_LOGPROBS || r.max_tokens < 0 || r.n_bias != r.sampling.n_bias)
            abort();
        for (int i = 0; i < r.n_inputs; i++)
            if (!r.inputs[i].text == !r.inputs[i].ids || (r.inputs[i].ids && r.inputs[i].n_ids < 1))
                abort();
        if (r.n_inputs < 0 || r.n_inputs > API_MAX_EMBED_INPUTS || r.dimensions < 0 ||
            (kind == API_OPENAI_EMBED && r.n_inputs < 1))
            abort();
        api_error ce;
        if (api_request_check(&r, 512, 256, &ce) && (ce.status != 400 || !ce.message[0]))
            abort();
        api_request_free(&r);
    } else if (e.status < 400 || e.status >= 600 || !e.message[0]) {
        abort();
    }
    /* the same bytes as generated text, for each tool-call format */
    int fmt = 1 + data[0] / 4 % 5;
    bool marker = data[0] & 0x80;
    json_t *calls = NULL;
    char *content = NULL;
    int n = tool_calls_parse(fmt, marker, body, len, &calls, &content);
    if (n > 0) {
        if ((size_t)n != json_array_size(calls) || !content)
            abort();
        json_decref(calls);
        rc_free(content);
    }
    size_t safe = tool_calls_safe_prefix(fmt, marker, body, len);
    if (safe > len)
        abort();
    /* thinking: whole, and in pieces of 1..7 bytes */
    int mode = data[0] % 3;
    size_t piece = 1 + data[0] % 7;
    strbuf r1 = { 0 }, c1 = { 0 }, r2 = { 0 }, c2 = { 0 };
    reasoning_split a, b;
    reasoning_init(&a, mode);
    reasoning_push(&a, body, len, &r1, &c1);
    reasoning_finish(&a, &r1, &c1);
    reasoning_init(&b, mode);
    for (size_t i = 0; i < len; i += piece)
        reasoning_push(&b, body + i, len - i < piece ? len - i : piece, &r2, &c2);
    reasoning_finish(&b, &r2, &c2);
    if (r1.len != r2.len || c1.len != c2.len || r1.len + c1.len > len ||
        memcmp(sb_cstr(&r1), sb_cstr(&r2), r1.len) || memcmp(sb_cstr(&c1), sb_cstr(&c2), c1.len))
        abort();
    reasoning_free(&a);
    reasoning_free(&b);
    sb_free(&r1);
    sb_free(&c1);
    sb_free(&r2);
    sb_free(&c2);
    return 0;
}
