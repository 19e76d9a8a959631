/* request.h - HTTP request bodies (JSON) to generation requests.
 *
 * One parser per endpoint family turns an untrusted body into an
 * api_request: the model name, the prompt (chat messages normalised for the
 * chat template, or raw text / token ids), sampling settings, limits, stop
 * strings, logprobs and tools.  Everything that can be checked without the
 * model is checked here (types, ranges, unsupported features); what needs
 * the model (context size, vocabulary range of logit_bias ids) is checked
 * by api_request_check once the model is known.
 *
 * Nothing here touches the network or the engine, so the fuzzer drives it
 * directly (fuzz/fuzz_http_request.c).  Errors are reported in an api_error
 * that the handlers turn into OpenAI's {"error": {...}}, Ollama's
 * {"error": "..."} or Anthropic's {"type": "error", "error": {...}} body.
 * Anthropic's Messages body is first rewritten into the OpenAI chat body it
 * means (anthropic_request.c), so both dialects share one parser and one
 * set of fields (tools, tool_choice, thinking).
 */
#ifndef RC_API_REQUEST_H
#define RC_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "infer/sampler.h"

enum api_kind {
    API_OPENAI_CHAT,        /* POST /v1/chat/completions */
    API_OPENAI_COMPLETION,  /* POST /v1/completions */
    API_OLLAMA_CHAT,        /* POST /api/chat */
    API_OLLAMA_GENERATE,    /* POST /api/generate */
    API_ANTHROPIC_MESSAGES, /* POST /v1/messages */
    API_ANTHROPIC_COUNT,    /* POST /v1/messages/count_tokens: the prompt's tokens only */
    API_OPENAI_EMBED,       /* POST /v1/embeddings */
    API_OLLAMA_EMBED,       /* POST /api/embed */
    API_OLLAMA_EMBEDDINGS   /* POST /api/embeddings (Ollama's older endpoint) */
};
#define API_N_KINDS 9

#define API_MAX_EMBED_INPUTS 2048   /* inputs of one embeddings request (OpenAI's limit) */

/* One input of an embeddings request: text, or token ids (OpenAI). */
typedef struct {
    char *text;               /* NULL for token ids */
    int32_t *ids;
    int n_ids;
} api_embed_input;

#define API_MAX_STOPS        16
#define API_MAX_TOP_LOGPROBS 20
#define API_MAX_TOKENS_LIMIT (1 << 24)   /* beyond any context: "absurd" */
#define API_MAX_BIAS         1024        /* logit_bias entries */
#define API_MAX_MESSAGES     4096
#define API_MAX_TOOLS        256
#define API_MAX_TRIGGERS     32          /* EXEC_MAX_TRIGGERS */

enum api_tool_choice { TOOL_CHOICE_AUTO, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED };

/* llama.cpp's reasoning_format: whether thinking is parsed out of content. */
enum api_reasoning_format { REASONING_FORMAT_PARSE, REASONING_FORMAT_NONE };

/* Ollama's think: not given, false, true. */
enum api_think { THINK_UNSET = -1, THINK_OFF = 0, THINK_ON = 1 };

/* An error for the client: HTTP status, OpenAI error type and code, and a
 * message that says what to fix. */
typedef struct {
    int  status;            /* 400, 401, 404, 413, 429, 500, 503 */
    char type[40];          /* "invalid_request_error", ... */
    char code[48];          /* "invalid_value", "model_not_found", ... */
    char param[48];         /* the offending field, or "" */
    char message[512];
} api_error;

/* Fills *e and returns -1, so a check reads `return api_fail(e, ...)`. */
int api_fail(api_error *e, int status, const char *code, const char *param,
             const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

typedef struct {
    int kind;                 /* enum api_kind */
    char *model;              /* as the client named it */
    /* chat: messages normalised to {role, content: string, [tool_calls],
     * [tool_call_id], [name], [reasoning_content]}, tools (NULL when none
     * or tool_choice none) */
    json_t *messages;
    json_t *tools;
    int tool_choice;          /* enum api_tool_choice */
    char *tool_choice_name;   /* tool_choice naming one function (REQUIRED), or NULL */
    json_t *template_vars;    /* chat_template_kwargs: more variables for the template, or NULL */
    int reasoning_format;     /* enum api_reasoning_format (OpenAI chat) */
    int think;                /* enum api_think (Ollama chat and generate; OpenAI's
                                 reasoning_effort; Anthropic's thinking) */
    /* completion / generate: text, or token ids (OpenAI only) */
    char *prompt;
    int32_t *prompt_ids;
    int n_prompt_ids;
    char *system;             /* Ollama generate: system message */
    bool raw;                 /* Ollama generate: no template */
    bool load_only;           /* Ollama generate without prompt: load the model */
    bool stream;
    bool include_usage;       /* stream_options.include_usage */
    int max_tokens;           /* 0 = until the end or a full context */
    sampler_params sampling;  /* bias arrays point into bias_ids/values */
    int32_t *bias_ids;
    float *bias_values;
    int n_bias;
    char *stops[API_MAX_STOPS];
    int n_stops;
    bool ignore_eos;          /* llama.cpp's extension: generate past end-of-text */
    bool logprobs;            /* per-token log-probabilities wanted */
    int top_logprobs;         /* alternatives per token (0..20) */
    /* Constrained output: a GBNF grammar the generated text must match, or
     * NULL, and its lazy triggers (none: active from the first token).  Set
     * through api_request_set_grammar / api_request_add_trigger (from the
     * `grammar` field, or made from a schema or the tools). */
    char *grammar;
    char *grammar_triggers[API_MAX_TRIGGERS];
    int n_grammar_triggers;
    /* embeddings (embed_request.c) */
    api_embed_input *inputs;
    int n_inputs;             /* 0: Ollama's load-only request (no input) */
    int dimensions;           /* > 0: cut the vectors to this many, renormalised */
    bool base64;              /* OpenAI encoding_format "base64" */
    bool truncate;            /* Ollama: cut long inputs to the context, not fail */
} api_request;

/* The embeddings endpoints' bodies (embed_request.c): *o is a JSON object;
 * fills r's model and embedding fields.  -1 with *e. */
int api_embed_parse(api_request *r, const json_t *o, api_error *e);

/* Parses `len` bytes of JSON for endpoint `kind` into *r (zeroed first).
 * Returns 0, or -1 with *e filled (status 400); *r is then freed already.
 * Ownership: on success *r owns all its strings and arrays; free it with
 * api_request_free. */
int  api_request_parse(int kind, const char *body, size_t len, api_request *r, api_error *e);
void api_request_free(api_request *r);       /* accepts a zeroed request */

/* Gives the request a grammar (len bytes of GBNF; replaces one set
 * before), checked by compiling it: -1 with *e (400, naming `param`, the
 * line and column) when it does not compile. */
int api_request_set_grammar(api_request *r, const char *gbnf, size_t len, const char *param,
                            api_error *e);
/* The parsers' part: the body's `grammar` (a GBNF string, as llama.cpp's
 * server takes it; "" is none).  -1 with *e. */
int api_request_get_grammar(api_request *r, const json_t *o, api_error *e);
/* Makes the grammar lazy: it applies once `trigger` (1..256 bytes, no NUL)
 * appears in the output, from the trigger's first byte on.  -1 with *e. */
int api_request_add_trigger(api_request *r, const char *trigger, size_t len, const char *param,
                            api_error *e);

/* The grammar a body's structured-output field asks for (OpenAI
 * response_format, Ollama format; request_format.c): 0 with *gbnf
 * (rc_malloc'd) or NULL when none is asked for; -1 with *e (400 naming the
 * field and, for a schema, the keyword it does not support). */
int api_format_grammar(int kind, const json_t *o, char **gbnf, api_error *e);
/* The parsers' part: that grammar given to the request (a 400 when the body
 * also has `grammar`).  -1 with *e. */
int api_request_get_format(api_request *r, const json_t *o, api_error *e);
/* Once the model is known: a chat request with tools gets the grammar its
 * tool_choice asks for in the template's tool-call `format` (tool_grammar.h):
 * required or a named function, forced from the first token (after a
 * thinking block, as `reasoning`, enum reasoning_mode, says the answer
 * starts); auto, lazy from the format's opener (none when a tool's schema is
 * beyond the supported subset: auto worked without a grammar before).
 * Nothing for tool_choice none, no tools, or a grammar from response_format /
 * grammar (with required, a 400).  -1 with *e. */
int api_request_tool_grammar(api_request *r, int format, const char *template_src, int reasoning,
                             api_error *e);

/* The checks that need the model: logit_bias ids in [0, n_vocab), and
 * max_tokens within the context of one sequence (n_ctx).  -1 with *e. */
/* anthropic_request.c: the OpenAI chat body (new, in *chat) that an Anthropic
 * Messages body `in` means: system and content blocks as messages with
 * tool_calls / tool messages / reasoning_content, tools and tool_choice in
 * OpenAI's shape, stop_sequences as stop.  Anthropic's thinking goes to
 * *think (enum api_think).  `count`: a count_tokens body (no max_tokens,
 * no sampling).  -1 with *e (400) for what Anthropic refuses or racimo does
 * not support (images, documents, server tools...). */
int anthropic_to_chat(const json_t *in, bool count, json_t **chat, int *think, api_error *e);

int api_request_check(const api_request *r, int n_vocab, int n_ctx, api_error *e);

#endif
