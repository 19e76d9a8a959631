/* ollama.c - the Ollama endpoints: /api/chat and /api/generate (streamed as
 * JSON lines, the default, or one object), /api/tags, /api/show,
 * /api/version and /api/ps, in the shapes of Ollama's API documentation
 * (durations in nanoseconds, times in RFC 3339), so that Ollama clients
 * work unchanged against `racimo serve --port 11434`.
 */
#include "server_internal.h"
#include "tool_calls.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/model_size.h"
#include "tensor/types.h"

#include <string.h>
#include <sys/time.h>
#include <time.h>

#define OLLAMA_COMPAT_VERSION "0.9.0"

void ollama_time(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%09ldZ", base, ts.tv_nsec);
}

static void iso_time(time_t t, char *out, size_t cap)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- model descriptions ---- */

static void size_label(uint64_t n, char *out, size_t cap)
{
    if (n >= 1000000000ULL)
        snprintf(out, cap, "%.1fB", (double)n / 1e9);
    else
        snprintf(out, cap, "%.0fM", (double)n / 1e6);
}

typedef struct {
    char arch[32];
    uint64_t n_params;
    char quant[16];
    int n_ctx_train, n_embd, n_layer;
    bool tools;
    bool embeds;            /* an embedding model (ARCH.pooling_type) */
    char *template_src;     /* rc_malloc'd, may be NULL */
} model_facts;

/* Reads what the listings show from the model's file: the loaded mapping
 * when the model is loaded (and then the template it renders with), else a
 * short-lived one. */
static int read_facts(api_server *s, const api_model *m, model_facts *f)
{
    memset(f, 0, sizeof *f);
    gguf_file *g = NULL;
    bool own = false;
    if (registry_state(s->reg, (api_model *)m, NULL, 0) == MODEL_READY) {
        g = m->lm.m ? m->lm.m->file : m->lm.file;
    } else {
        if (gguf_open(m->path, &g))
            return -1;
        own = true;
    }
    model_hparams hp;
    if (model_read_hparams(g, &hp) == 0) {
        snprintf(f->arch, sizeof f->arch, "%s", hp.arch_name);
        f->n_ctx_train = hp.n_ctx_train;
        f->n_embd = hp.n_embd;
        f->n_layer = hp.n_layer;
        f->embeds = hp.pooling != POOL_NONE;
    }
    /* parameters, and the weight type holding the most bytes */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->ne[d];
        f->n_params += n;
    }
    int best = model_main_type(g);
    snprintf(f->quant, sizeof f->quant, "%s", tensor_type_name(best) ? tensor_type_name(best) : "?");
    gguf_str tpl;
    if (!own && m->lm.template_src)      /* what it renders with (--chat-template-file) */
        f->template_src = rc_strdup(m->lm.template_src);
    else if (gguf_get_str(g, "tokenizer.chat_template", &tpl) == 0)
        f->template_src = rc_strndup(tpl.ptr, tpl.len);
    f->tools = f->template_src && tool_format_detect(f->template_src) != TOOLS_NONE;
    if (own)
        gguf_close(g);
    return 0;
}

static json_t *details_json(const model_facts *f)
{
    char ps[32];
    size_label(f->n_params, ps, sizeof ps);
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "gguf",
                     "family", f->arch, "families", f->arch, "parameter_size", ps,
                     "quantization_level", f->quant);
}

/* A stable digest-like id (not a hash of the weights: that would read
 * every byte of every file on each listing). */
static void digest(const api_model *m, char out[65])
{
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = m->path; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    uint64_t parts[4] = { h, h ^ m->size_bytes, h ^ (uint64_t)m->mtime, h * 31 + m->size_bytes };
    for (int i = 0; i < 4; i++) {
        uint64_t z = parts[i] + 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        snprintf(out + 16 * i, 17, "%016llx", (unsigned long long)(z ^ (z >> 31)));
    }
}

static void tagged(const api_model *m, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", m->name, strchr(m->name, ':') ? "" : ":latest");
}

static json_t *model_entry(api_server *s, const api_model *m, bool running)
{
    model_facts f;
    char name[300], when[40], dg[65];
    tagged(m, name, sizeof name);
    iso_time(m->mtime, when, sizeof when);
    digest(m, dg);
    json_t *details = read_facts(s, m, &f) == 0 ? details_json(&f) : json_object();
    rc_free(f.template_src);
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:o}", "name", name, "model", name,
                          "modified_at", when, "size", (json_int_t)m->size_bytes, "digest", dg,
                          "details", details);
    if (o && running) {
        json_object_set_new(o, "expires_at", json_string("2999-01-01T00:00:00Z"));
        json_object_set_new(o, "size_vram", json_integer(0));
        json_object_set_new(o, "context_length", json_integer(m->ep.n_ctx));
    }
    return o;
}

void ollama_tags(api_server *s, struct evhttp_request *req)
{
    registry_rescan(s->reg);
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    json_t *models = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(models, model_entry(s, list[i], false));
    rc_free(list);
    http_reply_json(s, req, 200, json_pack("{s:o}", "models", models), NULL, NULL);
}

void ollama_ps(api_server *s, struct evhttp_request *req)
{
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    json_t *models = json_array();
    for (int i = 0; i < n; i++)
        if (registry_state(s->reg, list[i], NULL, 0) == MODEL_READY)
            json_array_append_new(models, model_entry(s, list[i], true));
    rc_free(list);
    http_reply_json(s, req, 200, json_pack("{s:o}", "models", models), NULL, NULL);
}

void ollama_version(api_server *s, struct evhttp_request *req)
{
    http_reply_json(s, req, 200, json_pack("{s:s, s:s}", "version", OLLAMA_COMPAT_VERSION,
                                           "racimo", "0.1.0"), NULL, NULL);
}

int ollama_show(api_server *s, struct evhttp_request *req, const char *body, size_t len)
{
    api_error e;
    json_t *o = json_loadb(body, len, 0, NULL);
    json_t *name = json_object_get(o, "model");
    if (!json_is_string(name))
        name = json_object_get(o, "name");
    if (!json_is_string(name)) {
        json_decref(o);
        api_fail(&e, 400, "missing_field", "model", "model is required");
        http_reply_error(s, req, true, &e);
        return 400;
    }
    api_model *m = registry_find(s->reg, json_string_value(name));
    model_facts f;
    if (!m || read_facts(s, m, &f)) {
        api_fail(&e, 404, "model_not_found", "model", "model '%.200s' not found",
                 json_string_value(name));
        json_decref(o);
        http_reply_error(s, req, true, &e);
        return 404;
    }
    json_decref(o);
    char when[40], arch_key[64], modelfile[4200];
    iso_time(m->mtime, when, sizeof when);
    snprintf(modelfile, sizeof modelfile, "# served by racimo\nFROM %s\n", m->path);
    json_t *info = json_pack("{s:s, s:I}", "general.architecture", f.arch,
                             "general.parameter_count", (json_int_t)f.n_params);
    snprintf(arch_key, sizeof arch_key, "%s.context_length", f.arch);
    json_object_set_new(info, arch_key, json_integer(f.n_ctx_train));
    snprintf(arch_key, sizeof arch_key, "%s.embedding_length", f.arch);
    json_object_set_new(info, arch_key, json_integer(f.n_embd));
    snprintf(arch_key, sizeof arch_key, "%s.block_count", f.arch);
    json_object_set_new(info, arch_key, json_integer(f.n_layer));
    /* as Ollama shows it: an embedding model does no completion */
    json_t *caps = json_pack("[s]", f.embeds ? "embedding" : "completion");
    if (f.tools)
        json_array_append_new(caps, json_string("tools"));
    if (reasoning_template_thinks(f.template_src))
        json_array_append_new(caps, json_string("thinking"));
    json_t *out = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "license", "",
                            "modelfile", modelfile, "parameters", "", "template",
                            f.template_src ? f.template_src : "", "details", details_json(&f),
                            "model_info", info, "capabilities", caps, "modified_at", when);
    rc_free(f.template_src);
    http_reply_json(s, req, 200, out, NULL, NULL);
    return 200;
}

/* ---- chat and generate ---- */

static json_t *line(const api_job *j, bool done)
{
    char when[64];
    ollama_time(when, sizeof when);
    return json_pack("{s:s, s:s, s:b}", "model", j->ar.model, "created_at", when, "done", done);
}

static json_t *text_value(const char *text, size_t len)
{
    json_t *v = json_stringn(text, len);
    return v ? v : json_string("");
}

/* Ollama's tool calls: arguments stay an object. */
static json_t *ollama_tool_calls(const api_job *j)
{
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(j->tool_calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        json_array_append_new(out, json_pack("{s:{s:O, s:O}}", "function", "name",
                                             json_object_get(fn, "name"), "arguments",
                                             json_object_get(fn, "arguments")));
    }
    return out;
}

static void add_stats(const api_job *j, json_t *o)
{
    const gen_result *r = &j->res;
    json_object_set_new(o, "done_reason", json_string(j->res.finish == GEN_LENGTH ? "length" : "stop"));
    json_object_set_new(o, "total_duration", json_integer((json_int_t)(os_now_ns() - j->t0_ns)));
    json_object_set_new(o, "load_duration",
                        json_integer((json_int_t)(j->t_submit_ns > j->t0_ns ? j->t_submit_ns - j->t0_ns : 0)));
    json_object_set_new(o, "prompt_eval_count", json_integer(r->n_prompt));
    json_object_set_new(o, "prompt_eval_duration", json_integer((json_int_t)(r->t_prompt_s * 1e9)));
    json_object_set_new(o, "eval_count", json_integer(r->n_gen));
    json_object_set_new(o, "eval_duration", json_integer((json_int_t)(r->t_gen_s * 1e9)));
}

static void ndjson_start(api_job *j)
{
    http_stream_start(j, "application/x-ndjson");
}

static void chat_delta(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    json_t *o = line(j, false);
    json_object_set_new(o, "message", json_pack("{s:s, s:o}", "role", "assistant", "content",
                                                 text_value(text, len)));
    http_stream_line(j, o);
}

/* Ollama's field for the thinking part of an answer ("thinking", in the
 * message for chat, beside "response" for generate). */
static void chat_thinking(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    json_t *o = line(j, false);
    json_object_set_new(o, "message", json_pack("{s:s, s:s, s:o}", "role", "assistant", "content",
                                                 "", "thinking", text_value(text, len)));
    http_stream_line(j, o);
}

static void chat_final(api_job *j)
{
    json_t *o = line(j, true);
    const char *content = j->ar.stream || !j->content ? "" : j->content;
    json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", content);
    if (!j->ar.stream && j->reason.len)
        json_object_set_new(msg, "thinking", text_value(j->reason.p, j->reason.len));
    if (j->tool_calls)
        json_object_set_new(msg, "tool_calls", ollama_tool_calls(j));
    json_object_set_new(o, "message", msg);
    add_stats(j, o);
    if (j->ar.stream)
        http_stream_line(j, o);
    else
        http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
}

static void stream_error(api_job *j, const api_error *e)
{
    http_stream_line(j, json_pack("{s:s}", "error", e->message));
}

const job_ops ollama_chat_ops = { ndjson_start, chat_delta, chat_thinking, chat_final,
                                  stream_error };

static void generate_delta(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    json_t *o = line(j, false);
    json_object_set_new(o, "response", text_value(text, len));
    http_stream_line(j, o);
}

static void generate_thinking(api_job *j, const char *text, size_t len, int from, int to)
{
    (void)from; (void)to;
    json_t *o = line(j, false);
    json_object_set_new(o, "response", json_string(""));
    json_object_set_new(o, "thinking", text_value(text, len));
    http_stream_line(j, o);
}

static void generate_final(api_job *j)
{
    json_t *o = line(j, true);
    const char *content = j->ar.stream || !j->content ? "" : j->content;
    json_object_set_new(o, "response", json_string(content));
    if (!j->ar.stream && j->reason.len)
        json_object_set_new(o, "thinking", text_value(j->reason.p, j->reason.len));
    add_stats(j, o);
    if (j->ar.stream)
        http_stream_line(j, o);
    else
        http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
}

const job_ops ollama_generate_ops = { ndjson_start, generate_delta, generate_thinking,
                                      generate_final, stream_error };

void ollama_loaded(api_job *j)
{
    json_t *o = line(j, true);
    json_object_set_new(o, "response", json_string(""));
    json_object_set_new(o, "done_reason", json_string("load"));
    j->status = 200;
    if (j->req && !j->gone)
        http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
    else
        json_decref(o);
}
