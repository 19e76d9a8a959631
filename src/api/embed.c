/* embed.c - embeddings requests: POST /v1/embeddings (OpenAI), /api/embed
 * and /api/embeddings (Ollama) over an embedding model's engine.
 *
 * A request is a job like a generation (job.c: model look-up and load,
 * client disconnects, the access log) whose inputs become one engine
 * request each, so the engine batches them with each other and with other
 * clients' rows.  The inputs go in a few at a time (a window): a request
 * of 2048 inputs must not fill the engine's queue for everyone else; each
 * input that ends lets the next one in, from its on_done on the engine
 * thread.  An input the engine's full queue refuses waits for the next of
 * this request's inputs to end (only when none is left in the engine does
 * the request fail, busy).  When the last has ended, job.c's on_done is called once for the
 * whole request and the answer is written by the ops' final.
 *
 * The vectors come pooled and L2-normalised from the engine; `dimensions`
 * keeps the first n and normalises again (what OpenAI's text-embedding-3
 * and Ollama do).
 */
#include "server_internal.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"

#include <math.h>
#include <string.h>

#define EMBED_WINDOW_PER_SLOT 2      /* inputs in the engine per sequence slot */

struct embed_job {
    api_job *j;
    int n, E;                    /* inputs, vector width */
    int32_t **ids;               /* [n] tokens of each input */
    int *n_ids;
    gen_request *gr;             /* [n] */
    float *vecs;                 /* [n][E] */
    int window;
    /* srv->mail_mu */
    int next;                    /* next input to submit */
    int *held;                   /* [n] inputs a full queue refused, to submit again */
    int n_held;
    int n_submitted, n_done;
    bool failed, stop, reported;
    int fail_finish;
    char error[256];
    int n_tokens;                /* prompt tokens of the inputs done */
};

bool embed_kind(int kind)
{
    return kind == API_OPENAI_EMBED || kind == API_OLLAMA_EMBED || kind == API_OLLAMA_EMBEDDINGS;
}

void embed_free(api_job *j)
{
    embed_job *ej = j->embed;
    if (!ej)
        return;
    for (int i = 0; i < ej->n; i++)
        rc_free(ej->ids[i]);
    rc_free(ej->ids);
    rc_free(ej->n_ids);
    rc_free(ej->gr);
    rc_free(ej->vecs);
    rc_free(ej->held);
    rc_free(ej);
    j->embed = NULL;
}

/* Whether every submitted input has ended and no more will go in; true
 * once, for the caller that then reports the whole request (mail_mu). */
static bool settled(embed_job *ej)
{
    if (ej->reported || ej->n_done < ej->n_submitted ||
        (!ej->failed && !ej->stop && (ej->next < ej->n || ej->n_held)))
        return false;
    ej->reported = true;
    return true;
}

static void report(embed_job *ej)
{
    gen_result res = { .finish = ej->failed ? ej->fail_finish : ej->stop ? GEN_CANCELLED : GEN_STOP,
                       .n_prompt = ej->n_tokens };
    snprintf(res.error, sizeof res.error, "%s", ej->error);
    job_on_done(&ej->j->gr, &res);
}

/* Submits inputs while the window has room; any thread.  The caller holds
 * no lock. */
static void feed(embed_job *ej)
{
    api_server *s = ej->j->srv;
    for (;;) {
        pthread_mutex_lock(&s->mail_mu);
        if (ej->failed || ej->stop || (ej->next >= ej->n && !ej->n_held) ||
            ej->n_submitted - ej->n_done >= ej->window) {
            bool last = settled(ej);
            pthread_mutex_unlock(&s->mail_mu);
            if (last)
                report(ej);
            return;
        }
        int i = ej->n_held ? ej->held[--ej->n_held] : ej->next++;
        ej->n_submitted++;
        pthread_mutex_unlock(&s->mail_mu);
        int rc = registry_submit(ej->j->model, &ej->gr[i]);
        if (rc) {
            pthread_mutex_lock(&s->mail_mu);
            ej->n_submitted--;
            if (rc == RC_ELIMIT && ej->n_submitted > ej->n_done) {
                /* the next of ours that ends submits it again */
                ej->held[ej->n_held++] = i;
                bool last = settled(ej);
                pthread_mutex_unlock(&s->mail_mu);
                if (last)
                    report(ej);
                return;
            }
            if (!ej->failed) {
                ej->failed = true;
                ej->fail_finish = GEN_ERROR;
                snprintf(ej->error, sizeof ej->error, "input %d: %.200s", i, rc_errmsg());
            }
            pthread_mutex_unlock(&s->mail_mu);
        }
    }
}

/* Engine thread: one input ended. */
static void input_done(gen_request *g, const gen_result *res)
{
    embed_job *ej = ((api_job *)g->user)->embed;
    api_server *s = ej->j->srv;
    pthread_mutex_lock(&s->mail_mu);
    ej->n_done++;
    ej->n_tokens += res->n_prompt;
    if (res->finish != GEN_STOP && !ej->failed) {
        ej->failed = true;
        ej->fail_finish = res->finish;
        snprintf(ej->error, sizeof ej->error, "input %d: %.200s", (int)(g - ej->gr),
                 res->finish == GEN_ERROR ? res->error : gen_finish_name(res->finish));
    }
    pthread_mutex_unlock(&s->mail_mu);
    feed(ej);
}

void embed_cancel(api_job *j)
{
    embed_job *ej = j->embed;
    pthread_mutex_lock(&j->srv->mail_mu);
    ej->stop = true;
    int n = ej->next;
    pthread_mutex_unlock(&j->srv->mail_mu);
    for (int i = 0; i < n; i++)
        atomic_store(&ej->gr[i].cancel, true);
    registry_wake(j->model);
}

/* The inputs to tokens, checked against the model (event loop). */
static int prepare(api_job *j, embed_job *ej, api_error *e)
{
    const api_model *m = j->model;
    const api_request *ar = &j->ar;
    const int n_ctx = m->ep.n_ctx, n_vocab = tok_n_vocab(m->lm.tok);
    for (int i = 0; i < ej->n; i++) {
        const api_embed_input *in = &ar->inputs[i];
        int n = in->n_ids;
        if (in->text) {
            /* as llama-embedding: BOS and EOS as the vocabulary asks, special
             * tokens parsed */
            size_t n_ids = 0;
            if (tok_encode(m->lm.tok, in->text, strlen(in->text), true, true, &ej->ids[i], &n_ids))
                return api_fail(e, 400, "invalid_value", "input", "input %d: %s", i, rc_errmsg());
            if (n_ids > (size_t)1 << 24)
                return api_fail(e, 400, "invalid_value", "input", "input %d is too long", i);
            n = (int)n_ids;
        } else {
            if (!(ej->ids[i] = rc_malloc((size_t)n * sizeof(int32_t))))
                return api_fail(e, 500, "out_of_memory", NULL, "out of memory");
            memcpy(ej->ids[i], in->ids, (size_t)n * sizeof(int32_t));
            for (int k = 0; k < n; k++)
                if (in->ids[k] >= n_vocab)
                    return api_fail(e, 400, "invalid_value", "input",
                                    "token %d of input %d is %d; the vocabulary has %d tokens",
                                    k, i, in->ids[k], n_vocab);
        }
        if (n == 0)
            return api_fail(e, 400, "invalid_value", "input", "input %d has no tokens", i);
        if (n > n_ctx && !ar->truncate)
            return api_fail(e, 400, "invalid_value", "input",
                            "input %d has %d tokens; the context holds %d%s", i, n, n_ctx,
                            j->ar.kind == API_OPENAI_EMBED ? ""
                                                           : " (truncate: true cuts it there)");
        ej->n_ids[i] = n > n_ctx ? n_ctx : n;
    }
    return 0;
}

void embed_start(api_job *j)
{
    api_error e = { 0 };
    api_model *m = j->model;
    const int E = engine_embd_dims(m->eng);
    if (!E) {
        api_fail(&e, 400, "not_an_embedding_model", "model",
                 "model '%s' generates text; it makes no embeddings (an embedding model's "
                 "file says how it pools: ARCH.pooling_type)", m->name);
        job_fail(j, &e);
        return;
    }
    if (j->ar.dimensions > E) {
        api_fail(&e, 400, "invalid_value", "dimensions",
                 "'dimensions' is %d; model '%s' makes vectors of %d", j->ar.dimensions, m->name,
                 E);
        job_fail(j, &e);
        return;
    }
    embed_job *ej = rc_calloc(1, sizeof *ej);
    const int n = j->ar.n_inputs;
    if (ej) {
        j->embed = ej;
        ej->j = j;
        ej->n = n;
        ej->E = E;
        ej->ids = rc_calloc((size_t)n + 1, sizeof *ej->ids);
        ej->n_ids = rc_calloc((size_t)n + 1, sizeof *ej->n_ids);
        ej->gr = rc_calloc((size_t)n + 1, sizeof *ej->gr);
        ej->vecs = rc_calloc((size_t)n * (size_t)E + 1, sizeof(float));
        ej->held = rc_calloc((size_t)n + 1, sizeof *ej->held);
    }
    if (!ej || !ej->ids || !ej->n_ids || !ej->gr || !ej->vecs || !ej->held) {
        api_fail(&e, 500, "out_of_memory", NULL, "out of memory");
        job_fail(j, &e);
        return;
    }
    if (prepare(j, ej, &e)) {
        job_fail(j, &e);
        return;
    }
    if (n == 0) {                        /* Ollama: loads the model, embeds nothing */
        j->res.finish = GEN_STOP;
        job_answer(j);
        return;
    }
    ej->window = m->ep.n_seq * EMBED_WINDOW_PER_SLOT;
    for (int i = 0; i < n; i++) {
        gen_request *g = &ej->gr[i];
        g->prompt = ej->ids[i];
        g->n_prompt = ej->n_ids[i];
        sampler_params_default(&g->sampling);
        g->embedding = ej->vecs + (size_t)i * E;
        g->user = j;
        g->on_done = input_done;
        atomic_init(&g->cancel, false);
    }
    j->gr.user = j;                      /* job_on_done's */
    j->t_submit_ns = os_now_ns();
    /* The first input is submitted here so that a full queue or a bad
     * input gets its own status; the rest as the window allows.  Counted
     * before: its on_done may come before registry_submit returns. */
    pthread_mutex_lock(&j->srv->mail_mu);
    ej->next = 1;
    ej->n_submitted = 1;
    pthread_mutex_unlock(&j->srv->mail_mu);
    int rc = registry_submit(m, &ej->gr[0]);
    if (rc) {
        api_fail(&e, rc == RC_ELIMIT ? 429 : 400, rc == RC_ELIMIT ? "server_busy" : "invalid_request",
                 NULL, "%s", rc_errmsg());
        job_fail(j, &e);
        return;
    }
    j->submitted = true;
    feed(ej);
}

/* ---- answers ---- */

/* Input i's vector cut to the dimensions asked, normalised again. */
static const float *vector(const api_job *j, int i, float *tmp, int *dims)
{
    const embed_job *ej = j->embed;
    const float *v = ej->vecs + (size_t)i * ej->E;
    const int d = j->ar.dimensions > 0 ? j->ar.dimensions : ej->E;
    *dims = d;
    if (d == ej->E)
        return v;
    double ss = 0.0;
    for (int k = 0; k < d; k++)
        ss += (double)v[k] * v[k];
    const double inv = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
    for (int k = 0; k < d; k++)
        tmp[k] = (float)(v[k] * inv);
    return tmp;
}

static json_t *floats_json(const float *v, int n)
{
    json_t *a = json_array();
    for (int k = 0; k < n && a; k++)
        json_array_append_new(a, json_real(v[k]));
    return a;
}

/* Little-endian float32 bytes in base64 (OpenAI's encoding_format). */
static json_t *floats_base64(const float *v, int n)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t nb = (size_t)n * 4;
    uint8_t *bytes = rc_malloc(nb + 1);
    char *out = rc_malloc((nb + 2) / 3 * 4 + 1);
    json_t *s = NULL;
    if (bytes && out) {
        for (int k = 0; k < n; k++) {
            uint32_t u;
            memcpy(&u, &v[k], 4);
            for (int b = 0; b < 4; b++)
                bytes[(size_t)k * 4 + b] = (uint8_t)(u >> (8 * b));
        }
        size_t o = 0;
        for (size_t i = 0; i < nb; i += 3) {
            uint32_t x = (uint32_t)bytes[i] << 16 | (i + 1 < nb ? (uint32_t)bytes[i + 1] << 8 : 0) |
                         (i + 2 < nb ? bytes[i + 2] : 0);
            out[o++] = b64[x >> 18 & 63];
            out[o++] = b64[x >> 12 & 63];
            out[o++] = i + 1 < nb ? b64[x >> 6 & 63] : '=';
            out[o++] = i + 2 < nb ? b64[x & 63] : '=';
        }
        out[o] = '\0';
        s = json_string(out);
    }
    rc_free(bytes);
    rc_free(out);
    return s;
}

static void embed_final(api_job *j)
{
    const embed_job *ej = j->embed;
    const int n = ej->n;
    float *tmp = rc_malloc((size_t)ej->E * sizeof(float) + 4);
    json_t *o = json_object();
    int dims = 0;
    if (j->ar.kind == API_OPENAI_EMBED) {
        json_t *data = json_array();
        for (int i = 0; i < n && tmp; i++) {
            const float *v = vector(j, i, tmp, &dims);
            json_t *d = json_object();
            json_object_set_new(d, "object", json_string("embedding"));
            json_object_set_new(d, "index", json_integer(i));
            json_object_set_new(d, "embedding", j->ar.base64 ? floats_base64(v, dims)
                                                             : floats_json(v, dims));
            json_array_append_new(data, d);
        }
        json_object_set_new(o, "object", json_string("list"));
        json_object_set_new(o, "data", data);
        json_object_set_new(o, "model", json_string(j->ar.model));
        json_t *u = json_object();
        json_object_set_new(u, "prompt_tokens", json_integer(j->res.n_prompt));
        json_object_set_new(u, "total_tokens", json_integer(j->res.n_prompt));
        json_object_set_new(o, "usage", u);
    } else if (j->ar.kind == API_OLLAMA_EMBEDDINGS) {
        const float *v = n && tmp ? vector(j, 0, tmp, &dims) : NULL;
        json_object_set_new(o, "embedding", v ? floats_json(v, dims) : json_array());
    } else {
        json_t *all = json_array();
        for (int i = 0; i < n && tmp; i++) {
            const float *v = vector(j, i, tmp, &dims);
            json_array_append_new(all, floats_json(v, dims));
        }
        const api_model *m = j->model;
        uint64_t now = os_now_ns();
        json_object_set_new(o, "model", json_string(j->ar.model));
        json_object_set_new(o, "embeddings", all);
        json_object_set_new(o, "total_duration", json_integer((json_int_t)(now - j->t0_ns)));
        /* the load this request waited for, as Ollama reports it */
        json_object_set_new(o, "load_duration",
                            json_integer(m->t_loaded_ns > j->t0_ns ? (json_int_t)(m->load_s * 1e9)
                                                                   : 0));
        json_object_set_new(o, "prompt_eval_count", json_integer(j->res.n_prompt));
    }
    rc_free(tmp);
    if (!tmp) {
        json_decref(o);
        o = NULL;            /* http_reply_json answers 500 out of memory */
    }
    if (j->req && !j->gone)
        http_reply_json(j->srv, j->req, 200, o, NULL, NULL);
    else
        json_decref(o);
}

static void embed_error(api_job *j, const api_error *e)
{
    (void)j; (void)e;    /* never streamed: job.c answers errors before a start */
}

const job_ops embed_ops = { .final = embed_final, .error = embed_error };
