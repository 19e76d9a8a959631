/* embed_request.c - the bodies of the embeddings endpoints to api_request.
 *
 *   POST /v1/embeddings   {model, input, dimensions, encoding_format, user}
 *       input: a string, a list of strings, a list of token ids, or a list
 *       of lists of token ids (OpenAI's four forms)
 *   POST /api/embed       {model, input, truncate, dimensions, keep_alive,
 *                          options}; input a string or a list of strings,
 *                          absent or "" only loads the model
 *   POST /api/embeddings  {model, prompt, keep_alive, options}: Ollama's
 *                          older endpoint, one input
 * JSON null counts as absent, as in request.c.
 */
#include "request.h"
#include "base/mem.h"

#include <string.h>

static json_t *opt(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int add_text(api_request *r, const json_t *s, const char *param, api_error *e)
{
    api_embed_input *in = &r->inputs[r->n_inputs];
    if (!(in->text = rc_strndup(json_string_value(s), json_string_length(s))))
        return api_fail(e, 500, "out_of_memory", param, "out of memory");
    r->n_inputs++;
    return 0;
}

static int add_ids(api_request *r, const json_t *a, size_t which, api_error *e)
{
    const size_t n = json_array_size(a);
    if (n == 0)
        return api_fail(e, 400, "invalid_value", "input", "input %zu is an empty list of tokens",
                        which);
    if (n > (1u << 24))
        return api_fail(e, 400, "invalid_value", "input", "input %zu is too long", which);
    api_embed_input *in = &r->inputs[r->n_inputs];
    if (!(in->ids = rc_calloc(n, sizeof *in->ids)))
        return api_fail(e, 500, "out_of_memory", "input", "out of memory");
    r->n_inputs++;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) > INT32_MAX)
            return api_fail(e, 400, "invalid_value", "input",
                            "token %zu of input %zu is not a token id", i, which);
        in->ids[i] = (int32_t)json_integer_value(t);
    }
    in->n_ids = (int)n;
    return 0;
}

/* OpenAI's forms, or (ollama) a string or a list of strings. */
static int parse_input(api_request *r, const json_t *v, bool ollama, api_error *e)
{
    const char *want = ollama ? "a string or a list of strings"
                              : "a string, a list of strings, a list of token ids or a list of "
                                "lists of token ids";
    if (json_is_string(v)) {
        if (!json_string_length(v)) {
            if (ollama)
                return 0;                      /* loads the model, embeds nothing */
            return api_fail(e, 400, "invalid_value", "input", "'input' is an empty string");
        }
        if (!(r->inputs = rc_calloc(1, sizeof *r->inputs)))
            return api_fail(e, 500, "out_of_memory", "input", "out of memory");
        return add_text(r, v, "input", e);
    }
    if (!json_is_array(v))
        return api_fail(e, 400, "invalid_type", "input", "'input' must be %s", want);
    const size_t n = json_array_size(v);
    if (n == 0)
        return api_fail(e, 400, "invalid_value", "input", "'input' is an empty list");
    json_t *first = json_array_get(v, 0);
    if (!ollama && json_is_integer(first)) {   /* one input as token ids */
        if (!(r->inputs = rc_calloc(1, sizeof *r->inputs)))
            return api_fail(e, 500, "out_of_memory", "input", "out of memory");
        return add_ids(r, v, 0, e);
    }
    if (n > API_MAX_EMBED_INPUTS)
        return api_fail(e, 400, "invalid_value", "input",
                        "'input' has %zu inputs; at most %d are taken at once", n,
                        API_MAX_EMBED_INPUTS);
    if (!(r->inputs = rc_calloc(n, sizeof *r->inputs)))
        return api_fail(e, 500, "out_of_memory", "input", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        int rc;
        if (json_is_string(x) && json_string_length(x))
            rc = add_text(r, x, "input", e);
        else if (json_is_string(x))
            rc = api_fail(e, 400, "invalid_value", "input", "input %zu is an empty string", i);
        else if (!ollama && json_is_array(x))
            rc = add_ids(r, x, i, e);
        else
            rc = api_fail(e, 400, "invalid_type", "input",
                          "input %zu is not %s; 'input' must be %s", i,
                          ollama ? "a string" : "a string or a list of token ids", want);
        if (rc)
            return rc;
    }
    return 0;
}

int api_embed_parse(api_request *r, const json_t *o, api_error *e)
{
    const bool ollama = r->kind != API_OPENAI_EMBED;
    json_t *m = opt(o, "model");
    if (!m)
        return api_fail(e, 400, "missing_field", "model", "'model' is required");
    if (!json_is_string(m) || !json_string_length(m))
        return api_fail(e, 400, "invalid_type", "model", "'model' must be a model's name");
    if (!(r->model = rc_strndup(json_string_value(m), json_string_length(m))))
        return api_fail(e, 500, "out_of_memory", "model", "out of memory");
    r->truncate = true;
    if (r->kind == API_OLLAMA_EMBEDDINGS) {
        json_t *p = opt(o, "prompt");
        if (p && !json_is_string(p))
            return api_fail(e, 400, "invalid_type", "prompt", "'prompt' must be a string");
        return p ? parse_input(r, p, true, e) : 0;
    }
    json_t *in = opt(o, "input");
    if (!in && !ollama)
        return api_fail(e, 400, "missing_field", "input", "'input' is required");
    if (in && parse_input(r, in, ollama, e))
        return -1;
    json_t *d = opt(o, "dimensions");
    if (d && (!json_is_integer(d) || json_integer_value(d) < 1 ||
              json_integer_value(d) > (1 << 20)))
        return api_fail(e, 400, "invalid_value", "dimensions",
                        "'dimensions' must be a positive integer");
    r->dimensions = d ? (int)json_integer_value(d) : 0;
    if (ollama) {
        json_t *t = opt(o, "truncate");
        if (t && !json_is_boolean(t))
            return api_fail(e, 400, "invalid_type", "truncate", "'truncate' must be true or false");
        r->truncate = !t || json_is_true(t);
        return 0;
    }
    r->truncate = false;
    json_t *f = opt(o, "encoding_format");
    if (f && (!json_is_string(f) || (strcmp(json_string_value(f), "float") &&
                                     strcmp(json_string_value(f), "base64"))))
        return api_fail(e, 400, "invalid_value", "encoding_format",
                        "'encoding_format' must be \"float\" or \"base64\"");
    r->base64 = f && !strcmp(json_string_value(f), "base64");
    return 0;
}
