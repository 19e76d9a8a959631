/* job.c - one generation request from the HTTP request to the last byte.
 *
 * Life of a job (all on the event-loop thread unless said otherwise):
 *   job_run        model look-up; a model not loaded yet starts loading and
 *                  the job waits (waiting_load) until on_models_changed
 *   start_gen      prompt (template + tokenizer), checks, engine_submit;
 *                  a stream sends its headers now
 *   engine thread  on_text / on_token / on_done append to the mailbox under
 *                  srv->mail_mu and wake the loop (never block on a client);
 *                  a thinking model's answer is split there into reasoning
 *                  and content, and the request's stop strings are matched
 *                  on the content (a match cancels the sequence at once)
 *   job_drain      moves mailbox contents into the job, sends what is safe
 *                  to send (whole UTF-8 characters, nothing that may be the
 *                  start of a tool call), and at the end the final answer
 *   finish_job     access log, metrics, then the job is freed once the
 *                  engine is done with it (after on_done)
 * A client that goes away (libevent's close callback for streams, a
 * zero-byte peek on the socket for requests still computing) sets the
 * request's cancel flag: the engine frees its sequence at the next step.
 */
#include "server_internal.h"
#include "tool_calls.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "text/utf8.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static void finish_job(api_job *j);

/* ---- engine thread: the mailbox ---- */

static void post(api_job *j)     /* mail_mu held */
{
    if (!j->in_ready) {
        j->in_ready = true;
        j->ready_next = j->srv->ready;
        j->srv->ready = j;
    }
}

/* Content from mb_text[from..] on goes through the request's stop strings
 * (engine thread, mail_mu held).  A match ends the content before it and
 * cancels the sequence: the engine stops before the next token, as it does
 * for the stops it matches itself. */
static void content_stops(api_job *j, size_t from)
{
    if (!j->stop || j->mb_text.len == from)
        return;
    const char *out;
    size_t n;
    /* stop_push copies the text before it returns `out` (its own buffer) */
    int hit = stop_push(j->stop, j->mb_text.p + from, j->mb_text.len - from, &out, &n);
    j->mb_text.len = from;
    sb_append(&j->mb_text, out, n);
    if (hit == 1) {
        j->mb_stopped = true;
        atomic_store(&j->gr.cancel, true);
    }
}

static void on_text(gen_request *g, const char *text, size_t len)
{
    api_job *j = g->user;
    api_server *s = j->srv;
    pthread_mutex_lock(&s->mail_mu);
    bool wake = !j->in_ready;
    if (!j->think_parse && !j->stop) {
        sb_append(&j->mb_text, text, len);
    } else if (!j->mb_stopped) {
        size_t from = j->mb_text.len;
        if (j->think_parse)
            reasoning_push(&j->split, text, len, &j->mb_reason, &j->mb_text);
        else
            sb_append(&j->mb_text, text, len);
        content_stops(j, from);
    }
    post(j);
    pthread_mutex_unlock(&s->mail_mu);
    if (wake)
        event_active(s->mail_ev, EV_READ, 0);
}

static void on_token(gen_request *g, const gen_token *t)
{
    api_job *j = g->user;
    api_server *s = j->srv;
    const api_model *m = j->model;
    if (tok_is_eog(m->lm.tok, t->id))
        return;
    pthread_mutex_lock(&s->mail_mu);
    if (t->id == m->tool_marker)
        j->mb_marker = true;
    if (j->ar.logprobs) {
        if (j->mb_n_toks == j->mb_cap_toks) {
            int cap = j->mb_cap_toks ? j->mb_cap_toks * 2 : 16;
            tok_rec *nt = rc_realloc(j->mb_toks, (size_t)cap * sizeof *nt);
            if (nt) {
                j->mb_toks = nt;
                j->mb_cap_toks = cap;
            }
        }
        if (j->mb_n_toks < j->mb_cap_toks) {
            tok_rec *r = &j->mb_toks[j->mb_n_toks++];
            r->id = t->id;
            r->logprob = t->logprob;
            r->n_top = t->n_top < API_MAX_TOP_LOGPROBS ? t->n_top : API_MAX_TOP_LOGPROBS;
            for (int k = 0; k < r->n_top; k++) {
                r->top_ids[k] = t->top_ids[k];
                r->top_lp[k] = t->top_logprobs[k];
            }
        }
    }
    pthread_mutex_unlock(&s->mail_mu);
}

static void on_done(gen_request *g, const gen_result *res)
{
    api_job *j = g->user;
    api_server *s = j->srv;
    pthread_mutex_lock(&s->mail_mu);
    bool wake = !j->in_ready;
    if (!j->mb_stopped) {
        size_t from = j->mb_text.len;
        if (j->think_parse)
            reasoning_finish(&j->split, &j->mb_reason, &j->mb_text);
        content_stops(j, from);
        if (j->stop && !j->mb_stopped) {
            const char *out;
            size_t n;
            stop_flush(j->stop, &out, &n);
            sb_append(&j->mb_text, out, n);
        }
    }
    j->mb_res = *res;
    j->mb_done = true;
    post(j);
    pthread_mutex_unlock(&s->mail_mu);
    /* the job may be freed from here on; only s is touched */
    if (wake)
        event_active(s->mail_ev, EV_READ, 0);
}

void job_on_done(gen_request *g, const gen_result *res) { on_done(g, res); }

void job_models_changed(void *arg)
{
    api_server *s = arg;
    pthread_mutex_lock(&s->mail_mu);
    s->models_changed = true;
    pthread_mutex_unlock(&s->mail_mu);
    event_active(s->mail_ev, EV_READ, 0);
}

/* ---- life cycle ---- */

static void free_job(api_job *j)
{
    api_server *s = j->srv;
    if (j->prev)
        j->prev->next = j->next;
    else
        s->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    if (j->evcon)
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
    if (j->req && j->req_owned)
        evhttp_request_free(j->req);
    embed_free(j);
    api_request_free(&j->ar);
    rc_free(j->prompt);
    sb_free(&j->mb_text);
    sb_free(&j->text);
    sb_free(&j->mb_reason);
    sb_free(&j->reason);
    reasoning_free(&j->split);
    stop_free(j->stop);
    rc_free(j->mb_toks);
    rc_free(j->toks);
    json_decref(j->tool_calls);
    rc_free(j->content);
    rc_free(j);
}

/* Frees a finished job once nothing else refers to it. */
static bool reap(api_job *j)
{
    if (j->finished && (!j->submitted || j->engine_done)) {
        free_job(j);
        return true;
    }
    return false;
}

static void cancel(api_job *j)
{
    if (j->submitted && !j->engine_done && j->embed) {
        embed_cancel(j);
    } else if (j->submitted && !j->engine_done) {
        atomic_store(&j->gr.cancel, true);
        registry_wake(j->model);
    }
}

/* libevent: the connection is going away (a stream's client left, or the
 * server shuts down). */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
    api_job *j = arg;
    j->gone = true;
    j->evcon = NULL;
    /* A request libevent detached from the dying connection is ours to
     * free; one still attached is freed by libevent right after this. */
    if (j->req && !j->finished) {
        if (evhttp_request_get_connection(j->req) == NULL)
            j->req_owned = true;
        else
            j->req = NULL;
    }
    cancel(j);
    if (!j->submitted && !j->finished) {
        j->status = 499;
        finish_job(j);       /* freed by the next tick */
    }
}

/* Before the last bytes go out: a connection that closes while they are
 * written (or right after, "Connection: close") must not call back into a
 * job that is ending. */
static void detach_close(api_job *j)
{
    if (j->evcon)
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
}

static void reply_error(api_job *j, const api_error *e)
{
    j->status = srv_is_anthropic_path(j->path) ? anthropic_status(e->status) : e->status;
    detach_close(j);
    if (j->started) {
        j->ops->error(j, e);
        http_stream_end(j);
    } else if (j->req && !j->gone) {
        http_reply_error(j->srv, j->req, srv_is_ollama_path(j->path), e);
        j->req = NULL;
    }
}

/* Ends a job that failed before or instead of generating. */
static void fail_job(api_job *j, const api_error *e)
{
    reply_error(j, e);
    finish_job(j);
}

void job_fail(api_job *j, const api_error *e) { fail_job(j, e); }

const char *job_finish_reason(const api_job *j)
{
    if (j->tool_calls)
        return "tool_calls";
    return j->res.finish == GEN_LENGTH ? "length" : "stop";
}

static void finish_job(api_job *j)
{
    if (j->finished)
        return;
    j->finished = true;
    api_server *s = j->srv;
    if (j->evcon) {
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
        j->evcon = NULL;
    }
    double total_ms = (double)(os_now_ns() - j->t0_ns) * 1e-6;
    double ttft_ms = -1;
    const gen_result *r = &j->res;
    if (j->engine_done && r->n_gen > 0)
        ttft_ms = (double)(j->t_submit_ns - j->t0_ns) * 1e-6 + (r->t_queue_s + r->t_prompt_s) * 1e3;
    if (j->left)
        j->status = 499;
    metrics_request(s->metrics, j->path, j->status);
    if (j->engine_done && j->model)
        metrics_generation(s->metrics, j->model->name, r->n_prompt, r->n_cached, r->n_gen,
                           ttft_ms * 1e-3, total_ms * 1e-3, r->t_gen_s);
    char *prompt = NULL;
    if (s->cfg.log_content)
        prompt = j->ar.messages ? json_dumps(j->ar.messages, JSON_COMPACT) : NULL;
    access_entry e = {
        .client = j->client, .key_id = j->key_id[0] ? j->key_id : NULL, .method = "POST",
        .path = j->path, .model = j->ar.model, .status = j->status,
        .tokens_in = r->n_prompt, .tokens_cached = r->n_cached, .tokens_out = r->n_gen,
        .ttft_ms = ttft_ms, .total_ms = total_ms,
        .finish = j->engine_done ? (j->gone || j->left ? "cancelled" : r->finish == GEN_ERROR ? "error" :
                                    job_finish_reason(j)) : NULL,
        .prompt = prompt ? prompt : j->ar.prompt, .answer = sb_cstr(&j->text),
    };
    access_log_write(s->alog, &e);
    free(prompt);
}

/* ---- starting ---- */

/* The template's thinking switches for a client's on/off (`think`, named
 * `param` in the request), into *vars.  Thinking asked of a model that does
 * not think is refused, as Ollama refuses it. */
static int think_switches(const api_job *j, int think, const char *param, json_t **vars,
                          api_error *e)
{
    const api_model *m = j->model;
    if (think == THINK_ON && !m->thinks)
        return api_fail(e, 400, "invalid_value", param, "\"%s\" does not support thinking "
                        "(its chat template writes no <think> blocks)", j->ar.model);
    if (m->thinks && think != THINK_UNSET && reasoning_set_switches(m->think_switches,
                                                                   think == THINK_ON, vars))
        return api_fail(e, 500, "out_of_memory", NULL, "out of memory");
    return 0;
}

/* Thinking for this request: whether the answer is split into reasoning
 * and content (OpenAI unless reasoning_format is "none"; Ollama unless
 * think is false, which as in Ollama leaves the text as it comes;
 * Anthropic always, so thinking is never text), and the template variables
 * to render with (*vars, new; NULL for none): the switches for OpenAI's
 * reasoning_effort, Ollama's think (not given counts as true, as Ollama
 * does for models that think) or Anthropic's thinking (not given: the
 * template's default), and over them the client's chat_template_kwargs. */
static int thinking_setup(api_job *j, json_t **vars, api_error *e)
{
    const api_model *m = j->model;
    api_request *ar = &j->ar;
    *vars = NULL;
    switch (ar->kind) {
    case API_OPENAI_CHAT:
        j->think_parse = m->thinks && ar->reasoning_format != REASONING_FORMAT_NONE;
        if (think_switches(j, ar->think, "reasoning_effort", vars, e))
            return -1;
        if (ar->template_vars && !*vars && !(*vars = json_object()))
            return api_fail(e, 500, "out_of_memory", NULL, "out of memory");
        if (ar->template_vars && json_object_update(*vars, ar->template_vars))
            return api_fail(e, 500, "out_of_memory", NULL, "out of memory");
        return 0;
    case API_OLLAMA_CHAT:
    case API_OLLAMA_GENERATE:
        j->think_parse = m->thinks && ar->think != THINK_OFF;
        return think_switches(j, ar->think == THINK_UNSET && m->thinks ? THINK_ON : ar->think,
                              "think", vars, e);
    case API_ANTHROPIC_MESSAGES:
    case API_ANTHROPIC_COUNT:
        j->think_parse = m->thinks;
        return think_switches(j, ar->think, "thinking", vars, e);
    default:
        return 0;
    }
}

static int build_prompt(api_job *j, api_error *e)
{
    const api_model *m = j->model;
    api_request *ar = &j->ar;
    json_t *vars = NULL;
    char *text = NULL;
    int rc = 0;
    if (thinking_setup(j, &vars, e))
        return -1;
    if (ar->messages) {
        rc = registry_chat_prompt(m, ar->messages, ar->tools, vars, &j->prompt, &j->n_prompt,
                                  j->think_parse ? &text : NULL);
    } else if (ar->prompt_ids) {
        j->prompt = ar->prompt_ids;
        j->n_prompt = ar->n_prompt_ids;
        ar->prompt_ids = NULL;
        ar->n_prompt_ids = 0;
    } else if (ar->kind == API_OLLAMA_GENERATE && !ar->raw) {
        json_t *msgs = json_array();
        if (ar->system)
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                                  ar->system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", ar->prompt));
        rc = registry_chat_prompt(m, msgs, NULL, vars, &j->prompt, &j->n_prompt,
                                  j->think_parse ? &text : NULL);
        json_decref(msgs);
    } else {
        rc = registry_text_prompt(m, ar->prompt, true, &j->prompt, &j->n_prompt);
    }
    json_decref(vars);
    int think = REASONING_NONE;
    if (rc == 0 && j->think_parse) {
        /* the template may have opened the block already (R1's prompt ends
         * with "<think>\n"); a raw prompt is its own tail */
        const char *tail = text ? text : ar->prompt ? ar->prompt : "";
        think = reasoning_prompt_open(tail, strlen(tail)) ? REASONING_OPEN : REASONING_AUTO;
        reasoning_init(&j->split, think);
    }
    rc_free(text);
    if (rc == RC_ENOMEM)
        return api_fail(e, 500, "out_of_memory", NULL, "out of memory building the prompt");
    if (rc)
        return api_fail(e, 400, "invalid_prompt", ar->messages ? "messages" : "prompt",
                        "%s", rc_errmsg());
    if (api_request_check(ar, tok_n_vocab(m->lm.tok), m->ep.n_ctx, e) ||
        (ar->kind != API_ANTHROPIC_COUNT &&       /* nothing is generated there */
         api_request_tool_grammar(ar, m->tool_format, m->lm.template_src, think, e)))
        return -1;
    if (j->n_prompt == 0)
        return api_fail(e, 400, "invalid_value", "prompt", "the prompt has no tokens");
    if (j->n_prompt >= m->ep.n_ctx && ar->kind != API_ANTHROPIC_COUNT)
        return api_fail(e, 400, "context_length_exceeded", ar->messages ? "messages" : "prompt",
                        "the prompt has %d tokens; a sequence of this server holds %d "
                        "(start racimo serve with a larger --ctx-size, or shorten the prompt)",
                        j->n_prompt, m->ep.n_ctx);
    return 0;
}

static void start_gen(api_job *j)
{
    api_error e = { 0 };
    const api_model *m = j->model;
    api_request *ar = &j->ar;
    if (ar->load_only) {
        detach_close(j);
        ollama_loaded(j);
        j->req = NULL;
        finish_job(j);
        return;
    }
    if (embed_kind(ar->kind)) {
        embed_start(j);
        return;
    }
    if (engine_embd_dims(m->eng)) {
        api_fail(&e, 400, "embedding_model", "model", "model '%s' is an embedding model: it "
                 "generates no text (POST /v1/embeddings or /api/embed)", m->name);
        fail_job(j, &e);
        return;
    }
    if (build_prompt(j, &e)) {
        fail_job(j, &e);
        return;
    }
    if (ar->kind == API_ANTHROPIC_COUNT) {
        j->status = 200;
        detach_close(j);
        anthropic_count(j);
        j->req = NULL;
        finish_job(j);
        return;
    }
    gen_request *g = &j->gr;
    memset(g, 0, sizeof *g);
    g->prompt = j->prompt;
    g->n_prompt = j->n_prompt;
    g->sampling = ar->sampling;
    g->max_tokens = ar->max_tokens;
    g->ignore_eos = ar->ignore_eos;
    g->grammar = ar->grammar;
    g->grammar_triggers = (const char *const *)ar->grammar_triggers;
    g->n_grammar_triggers = ar->n_grammar_triggers;
    if ((j->think_parse || ar->kind == API_ANTHROPIC_MESSAGES) && ar->n_stops) {
        /* matched on the content only (in on_text), not in the reasoning;
         * Anthropic's answer names the stop that matched (stop_matched) */
        if (stop_new((const char *const *)ar->stops, ar->n_stops, &j->stop)) {
            api_fail(&e, 500, "out_of_memory", NULL, "%s", rc_errmsg());
            fail_job(j, &e);
            return;
        }
    } else {
        g->stops = (const char *const *)ar->stops;
        g->n_stops = ar->n_stops;
    }
    g->n_logprobs = ar->logprobs ? ar->top_logprobs : 0;
    /* the markers the parsers need: the thinking tags always (with
     * reasoning_format none they stay in the content, as in llama.cpp),
     * the tool-call markers when tools are parsed */
    g->text_tokens = m->text_tokens;
    g->n_text_tokens = ar->tools && m->tool_format != TOOLS_NONE ? m->n_text_tokens
                                                                 : m->n_think_tokens;
    g->user = j;
    g->on_text = on_text;
    g->on_done = on_done;
    if (ar->logprobs || (ar->tools && m->tool_marker >= 0))
        g->on_token = on_token;
    atomic_init(&g->cancel, false);
    j->t_submit_ns = os_now_ns();
    int rc = registry_submit(j->model, g);
    if (rc == RC_ELIMIT) {
        api_fail(&e, 429, "server_busy", NULL, "%s; try again shortly", rc_errmsg());
        fail_job(j, &e);
        return;
    }
    if (rc) {
        api_fail(&e, 400, "invalid_request", NULL, "%s", rc_errmsg());
        fail_job(j, &e);
        return;
    }
    j->submitted = true;
    if (ar->stream)
        j->ops->start(j);
}

/* The model is loaded, failed, or still loading. */
static void model_ready(api_job *j)
{
    char err[512];
    int st = registry_state(j->srv->reg, j->model, err, sizeof err);
    if (st == MODEL_READY) {
        j->waiting_load = false;
        start_gen(j);
    } else if (st == MODEL_FAILED) {
        api_error e;
        j->waiting_load = false;
        api_fail(&e, 500, "model_load_failed", "model", "model '%s' failed to load: %s",
                 j->model->name, err);
        fail_job(j, &e);
    }
}

static void new_id(api_server *s, const char *prefix, char *out, size_t cap)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    char tail[25];
    uint64_t x = s->id_state += 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) {      /* splitmix64 */
            uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
            x = z ^ (z >> 31);
        }
        tail[i] = alnum[(x >> (i % 8 * 8)) % (sizeof alnum - 1)];
    }
    tail[24] = '\0';
    s->id_state = x;
    snprintf(out, cap, "%s%s", prefix, tail);
}

void job_run(api_server *s, struct evhttp_request *req, const char *path, const char *key_id,
             const char *client, api_request *ar, const job_ops *ops)
{
    api_job *j = rc_calloc(1, sizeof *j);
    if (!j) {
        api_error e;
        api_fail(&e, 500, "out_of_memory", NULL, "out of memory");
        http_reply_error(s, req, srv_is_ollama_path(path), &e);
        api_request_free(ar);
        return;
    }
    j->srv = s;
    j->req = req;
    j->ops = ops;
    j->ar = *ar;
    memset(ar, 0, sizeof *ar);
    j->t0_ns = os_now_ns();
    j->created = (long)time(NULL);
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->key_id, sizeof j->key_id, "%s", key_id ? key_id : "");
    new_id(s, j->ar.kind == API_OPENAI_COMPLETION ? "cmpl-" :
              j->ar.kind == API_ANTHROPIC_MESSAGES ? "msg_" : "chatcmpl-", j->id, sizeof j->id);
    j->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = j;
    s->jobs = j;
    srv_tick_soon(s);
    j->evcon = evhttp_request_get_connection(req);
    if (j->evcon) {
        const char *addr = NULL;
        ev_uint16_t port = 0;
        evhttp_connection_get_peer(j->evcon, (char **)&addr, &port);
        if (client)
            snprintf(j->client, sizeof j->client, "%s", client);
        else
            snprintf(j->client, sizeof j->client, "%s:%u", addr ? addr : "?", (unsigned)port);
        evhttp_connection_set_closecb(j->evcon, on_close, j);
    }
    j->model = registry_find(s->reg, j->ar.model);
    if (!j->model) {
        api_error e;
        api_fail(&e, 404, "model_not_found", "model",
                 "model '%.200s' not found; GET /v1/models lists the models", j->ar.model);
        fail_job(j, &e);
        reap(j);
        return;
    }
    if (registry_load(s->reg, j->model) == MODEL_READY) {
        start_gen(j);
        reap(j);
    } else {
        j->waiting_load = true;
        /* A streaming OpenAI client waits for a load (a pipeline across nodes
         * may pull weights for minutes) with the stream open and SSE comments
         * every few seconds, so proxies and clients do not time out. */
        if (j->ar.stream && !srv_is_ollama_path(j->path)) {
            http_stream_start(j, "text/event-stream");
            http_stream_raw(j, ": loading the model\n\n");
            j->t_keepalive_ns = os_now_ns();
        }
    }
}

/* ---- output ---- */

/* Length of the longest prefix of t[0..n) that does not end inside a
 * UTF-8 character. */
static size_t whole_chars(const char *t, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)t[n - back];
        if ((c & 0xC0) == 0x80)
            continue;                        /* a continuation byte */
        if (c >= 0xC0 && utf8_lead_len(c) > back)
            return n - back;                 /* a lead byte whose character is cut */
        break;
    }
    return n;
}

void job_token_text(const api_job *j, int32_t id, strbuf *out)
{
    char buf[256];
    int n = tok_piece(j->model->lm.tok, id, true, buf, sizeof buf);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf)
        n = sizeof buf;
    char clean[3 * sizeof buf];
    size_t len = utf8_sanitize(buf, (size_t)n, clean);
    sb_append(out, clean, len);
}

static bool wants_tools(const api_job *j)
{
    return j->ar.tools && j->model->tool_format != TOOLS_NONE;
}

/* Sends the part of the answer that is safe to send. */
static void stream_progress(api_job *j)
{
    /* the reasoning comes before the content: send what there is first */
    size_t rsafe = whole_chars(j->reason.p, j->reason.len);
    if (rsafe > j->reason_sent && j->ops->reasoning) {
        j->ops->reasoning(j, j->reason.p + j->reason_sent, rsafe - j->reason_sent, j->toks_sent,
                          j->n_toks);
        j->reason_sent = rsafe;
        j->toks_sent = j->n_toks;
    }
    size_t safe = j->text.len;
    if (wants_tools(j) && j->text.len)      /* no text yet: no buffer either */
        safe = tool_calls_safe_prefix(j->model->tool_format, j->marker, j->text.p, j->text.len);
    safe = whole_chars(j->text.p, safe);
    if (safe > j->sent) {
        j->ops->delta(j, j->text.p + j->sent, safe - j->sent, j->toks_sent, j->n_toks);
        j->sent = safe;
        j->toks_sent = j->n_toks;
    }
}

static void complete(api_job *j)
{
    const gen_result *r = &j->res;
    if (r->finish == GEN_ERROR) {
        api_error e;
        api_fail(&e, 500, "generation_failed", NULL, "generation failed: %s", r->error);
        fail_job(j, &e);
        return;
    }
    /* whatever is still held: invalid UTF-8 becomes U+FFFD */
    char *clean = rc_malloc(3 * j->text.len + 1);
    size_t clean_len = clean ? utf8_sanitize(j->text.p ? j->text.p : "", j->text.len, clean) : 0;
    if (!clean) {
        api_error e;
        api_fail(&e, 500, "out_of_memory", NULL, "out of memory");
        fail_job(j, &e);
        return;
    }
    clean[clean_len] = '\0';
    if (j->ar.stream && j->reason.len > j->reason_sent && j->ops->reasoning) {
        j->ops->reasoning(j, j->reason.p + j->reason_sent, j->reason.len - j->reason_sent,
                          j->toks_sent, j->n_toks);
        j->reason_sent = j->reason.len;
        j->toks_sent = j->n_toks;
    }
    json_t *calls = NULL;
    char *content = NULL;
    if (wants_tools(j) &&
        tool_calls_parse(j->model->tool_format, j->marker, clean, clean_len, &calls, &content) > 0) {
        j->tool_calls = calls;
        j->content = content;
        rc_free(clean);
    } else {
        j->content = clean;
        /* tokens whose text is empty (or was dropped) still owe their
         * log-probabilities: an empty delta carries them */
        if (j->ar.stream && (clean_len > j->sent || (j->ar.logprobs && j->toks_sent < j->n_toks)))
            j->ops->delta(j, clean + j->sent, clean_len > j->sent ? clean_len - j->sent : 0,
                          j->toks_sent, j->n_toks);
    }
    j->status = 200;
    detach_close(j);
    j->ops->final(j);
    if (j->ar.stream)
        http_stream_end(j);
    else
        j->req = NULL;       /* answered by final */
    finish_job(j);
}

void job_answer(api_job *j) { complete(j); }

/* Moves one job's mail into it; mail_mu held. */
static void take_mail(api_job *j)
{
    j->in_ready = false;
    if (j->mb_text.len) {
        sb_append(&j->text, j->mb_text.p, j->mb_text.len);
        sb_reset(&j->mb_text);
    }
    if (j->mb_reason.len) {
        sb_append(&j->reason, j->mb_reason.p, j->mb_reason.len);
        sb_reset(&j->mb_reason);
    }
    j->stopped |= j->mb_stopped;
    if (j->mb_n_toks) {
        if (j->n_toks + j->mb_n_toks > j->cap_toks) {
            int cap = (j->n_toks + j->mb_n_toks) * 2;
            tok_rec *nt = rc_realloc(j->toks, (size_t)cap * sizeof *nt);
            if (nt) {
                j->toks = nt;
                j->cap_toks = cap;
            }
        }
        if (j->n_toks + j->mb_n_toks <= j->cap_toks) {
            memcpy(j->toks + j->n_toks, j->mb_toks, (size_t)j->mb_n_toks * sizeof *j->toks);
            j->n_toks += j->mb_n_toks;
        }
        j->mb_n_toks = 0;
    }
    j->marker |= j->mb_marker;
    if (j->mb_done) {
        j->engine_done = true;
        j->res = j->mb_res;
        /* the cancel that a content stop string asked for is that stop,
         * also when its token was the last one max_tokens allowed (the
         * engine's own stops win over the length there too) */
        if (j->stopped && (j->res.finish == GEN_CANCELLED || j->res.finish == GEN_LENGTH))
            j->res.finish = GEN_STOP;
    }
}

static void progress(api_job *j)
{
    if (!j->finished && !j->gone) {
        if (j->ar.stream && j->started)
            stream_progress(j);
        if (j->engine_done)
            complete(j);
    } else if (!j->finished && j->engine_done) {
        j->status = 499;
        finish_job(j);
    }
    reap(j);
}

void job_drain(api_server *s)
{
    pthread_mutex_lock(&s->mail_mu);
    api_job *list = s->ready;
    s->ready = NULL;
    bool changed = s->models_changed;
    s->models_changed = false;
    /* a job can be posted again as soon as the lock is released, which
     * rewrites ready_next: walk a copy of the list */
    int n = 0;
    for (api_job *j = list; j; j = j->ready_next)
        n++;
    api_job **todo = rc_calloc((size_t)(n ? n : 1), sizeof *todo);
    n = 0;
    for (api_job *j = list; j; j = j->ready_next) {
        take_mail(j);
        if (todo)
            todo[n++] = j;
    }
    pthread_mutex_unlock(&s->mail_mu);
    for (int i = 0; i < n; i++)
        progress(todo[i]);
    rc_free(todo);
    if (changed) {
        for (api_job *j = s->jobs, *next; j; j = next) {
            next = j->next;
            if (j->waiting_load && !j->finished) {
                model_ready(j);
                if (reap(j))
                    continue;
            }
        }
    }
}

#define KEEPALIVE_NS (3ull * 1000000000ull)

void job_tick(api_server *s)
{
    for (api_job *j = s->jobs, *next; j; j = next) {
        next = j->next;
        if (!j->finished && !j->gone && !j->left && !j->started && http_client_closed(j->evcon)) {
            rc_log(LOG_DEBUG, "client %s went away; cancelling", j->client);
            /* the answer is still sent when the engine ends the request, so
             * that libevent meets the closed socket and frees it */
            j->left = true;
            cancel(j);
            if (!j->submitted) {
                /* answer anyway so that libevent notices and frees the
                 * connection */
                api_error e;
                api_fail(&e, 503, "client_gone", NULL, "the client went away");
                reply_error(j, &e);
                j->status = 499;
                finish_job(j);
            }
        }
        /* SSE comments keep a quiet OpenAI stream open: while the model
         * loads, and while its instance is rebuilt after a node was lost
         * (the engine pauses the stream, it never ends it) */
        if (j->started && !j->finished && j->ar.stream && !srv_is_ollama_path(j->path) &&
            os_now_ns() - j->t_keepalive_ns > KEEPALIVE_NS)
            http_stream_raw(j, j->waiting_load ? ": loading the model\n\n" : ": keep-alive\n\n");
        reap(j);
    }
}

void job_shutdown(api_server *s)
{
    /* the engines are gone: every submitted job has had on_done */
    pthread_mutex_lock(&s->mail_mu);
    for (api_job *j = s->ready; j; j = j->ready_next)
        take_mail(j);
    s->ready = NULL;
    pthread_mutex_unlock(&s->mail_mu);
    while (s->jobs) {
        api_job *j = s->jobs;
        j->engine_done = true;
        j->model = NULL;         /* freed with the registry */
        if (!j->finished) {
            j->status = 503;
            finish_job(j);
        }
        free_job(j);
    }
}
