/* metrics.c - see metrics.h.  Endpoints are a fixed list (so a client
 * cannot grow the label set with made-up paths); models are the registry's,
 * added on first use. */
#include "metrics.h"
#include "base/mem.h"

#include <pthread.h>
#include <stddef.h>
#include <string.h>

static const char *const endpoints[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/cluster",
    "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/version", "/api/ps",
    "/v1/messages", "/v1/messages/count_tokens", "/v1/embeddings", "/api/embed", "/api/embeddings",
    "/health", "/metrics", "/", "other"
};
#define N_ENDPOINTS (int)(sizeof endpoints / sizeof endpoints[0])
#define N_STATUS 600
#define N_BUCKETS 10

typedef struct {
    const double *le;          /* N_BUCKETS - 1 bounds; the last bucket is +Inf */
    uint64_t count[N_BUCKETS];
    double sum;
    uint64_t n;
} histogram;

static const double ttft_le[N_BUCKETS - 1] = { 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };
static const double total_le[N_BUCKETS - 1] = { 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120 };
static const double tps_le[N_BUCKETS - 1] = { 1, 2, 5, 10, 20, 50, 100, 200, 500 };

typedef struct {
    char name[256];
    uint64_t prompt, cached, gen, requests;
    histogram ttft, total, tps;
} model_counters;

struct api_metrics {
    pthread_mutex_t mu;
    uint32_t requests[N_ENDPOINTS][N_STATUS];
    model_counters *models;
    int n_models, cap_models;
};

int metrics_new(api_metrics **out)
{
    api_metrics *m = rc_calloc(1, sizeof *m);
    if (!m)
        return -1;
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return 0;
}

void metrics_free(api_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    rc_free(m->models);
    rc_free(m);
}

void metrics_request(api_metrics *m, const char *endpoint, int status)
{
    int e = N_ENDPOINTS - 1;
    for (int i = 0; i < N_ENDPOINTS - 1; i++)
        if (!strcmp(endpoints[i], endpoint))
            e = i;
    if (status < 0 || status >= N_STATUS)
        status = 0;
    pthread_mutex_lock(&m->mu);
    m->requests[e][status]++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(histogram *h, const double *le, double v)
{
    int b = 0;
    while (b < N_BUCKETS - 1 && v > le[b])
        b++;
    h->le = le;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void metrics_generation(api_metrics *m, const char *model_name, int n_prompt, int n_cached, int n_gen,
                        double ttft_s, double total_s, double gen_s)
{
    pthread_mutex_lock(&m->mu);
    model_counters *c = NULL;
    for (int i = 0; i < m->n_models && !c; i++)
        if (!strcmp(m->models[i].name, model_name))
            c = &m->models[i];
    if (!c) {
        if (m->n_models == m->cap_models) {
            int cap = m->cap_models ? m->cap_models * 2 : 4;
            model_counters *nm = rc_realloc(m->models, (size_t)cap * sizeof *nm);
            if (!nm) {
                pthread_mutex_unlock(&m->mu);
                return;
            }
            m->models = nm;
            m->cap_models = cap;
        }
        c = &m->models[m->n_models++];
        memset(c, 0, sizeof *c);
        c->ttft.le = ttft_le;
        c->total.le = total_le;
        c->tps.le = tps_le;
        size_t len = strlen(model_name);
        if (len >= sizeof c->name)
            len = sizeof c->name - 1;
        memcpy(c->name, model_name, len);
    }
    c->requests++;
    c->prompt += (uint64_t)n_prompt;
    c->cached += (uint64_t)n_cached;
    c->gen += (uint64_t)n_gen;
    if (n_gen > 0 && ttft_s >= 0)
        observe(&c->ttft, ttft_le, ttft_s);
    observe(&c->total, total_le, total_s);
    if (n_gen > 1 && gen_s > 0)
        observe(&c->tps, tps_le, (n_gen - 1) / gen_s);
    pthread_mutex_unlock(&m->mu);
}

void metrics_label(strbuf *b, const char *name)
{
    sb_puts(b, "model=\"");
    for (const char *p = name; *p; p++) {         /* Prometheus label escapes */
        if (*p == '"' || *p == '\\')
            sb_append(b, "\\", 1);
        if (*p == '\n')
            sb_puts(b, "\\n");
        else
            sb_append(b, p, 1);
    }
    sb_puts(b, "\"");
}

static void render_hist(strbuf *b, const char *metric, const char *model_name, const histogram *h)
{
    uint64_t cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{", metric);
        metrics_label(b, model_name);
        if (i < N_BUCKETS - 1)
            sb_printf(b, ",le=\"%g\"} %llu\n", h->le[i], (unsigned long long)cum);
        else
            sb_printf(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    sb_printf(b, "%s_sum{", metric);
    metrics_label(b, model_name);
    sb_printf(b, "} %.6f\n%s_count{", h->sum, metric);
    metrics_label(b, model_name);
    sb_printf(b, "} %llu\n", (unsigned long long)h->n);
}

void metrics_help(strbuf *b, const char *name, const char *type, const char *text)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

void metrics_render(api_metrics *m, api_registry *reg, strbuf *b)
{
    pthread_mutex_lock(&m->mu);
    metrics_help(b, "racimo_http_requests_total", "counter", "HTTP requests by endpoint and status.");
    for (int e = 0; e < N_ENDPOINTS; e++)
        for (int s = 0; s < N_STATUS; s++)
            if (m->requests[e][s])
                sb_printf(b, "racimo_http_requests_total{endpoint=\"%s\",status=\"%d\"} %u\n",
                          endpoints[e], s, m->requests[e][s]);
    static const struct { const char *name, *help; size_t off; } counters[] = {
        { "racimo_generation_requests_total", "Finished generations.",
          offsetof(model_counters, requests) },
        { "racimo_prompt_tokens_total", "Prompt tokens (reused ones included).",
          offsetof(model_counters, prompt) },
        { "racimo_prompt_tokens_cached_total", "Prompt tokens reused from the KV cache.",
          offsetof(model_counters, cached) },
        { "racimo_generated_tokens_total", "Generated tokens.",
          offsetof(model_counters, gen) },
    };
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
        metrics_help(b, counters[k].name, "counter", counters[k].help);
        for (int i = 0; i < m->n_models; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&m->models[i] + counters[k].off, sizeof v);
            sb_printf(b, "%s{", counters[k].name);
            metrics_label(b, m->models[i].name);
            sb_printf(b, "} %llu\n", (unsigned long long)v);
        }
    }
    metrics_help(b, "racimo_time_to_first_token_seconds", "histogram",
         "From the request to its first generated token.");
    for (int i = 0; i < m->n_models; i++)
        render_hist(b, "racimo_time_to_first_token_seconds", m->models[i].name, &m->models[i].ttft);
    metrics_help(b, "racimo_request_duration_seconds", "histogram", "From the request to its last token.");
    for (int i = 0; i < m->n_models; i++)
        render_hist(b, "racimo_request_duration_seconds", m->models[i].name, &m->models[i].total);
    metrics_help(b, "racimo_generation_tokens_per_second", "histogram",
         "Generation speed of each request after its first token.");
    for (int i = 0; i < m->n_models; i++)
        render_hist(b, "racimo_generation_tokens_per_second", m->models[i].name, &m->models[i].tps);
    pthread_mutex_unlock(&m->mu);

    int n = 0;
    api_model **list = registry_list(reg, &n);
    static const char *const gauges[][3] = {
        { "racimo_model_loaded", "1 when the model is loaded, 0 otherwise.", "gauge" },
        { "racimo_queue_depth", "Requests waiting for a sequence slot.", "gauge" },
        { "racimo_active_sequences", "Sequences generating now.", "gauge" },
        { "racimo_sequence_slots", "Parallel sequences of the model's engine.", "gauge" },
        { "racimo_kv_cache_used_tokens", "KV cache positions in use (finished conversations kept for reuse included).", "gauge" },
        { "racimo_kv_cache_capacity_tokens", "KV cache positions in all slots.", "gauge" },
        { "racimo_instance_recoveries_total", "Times the model's instance was rebuilt on a new plan after a node was lost, its running requests going on.", "counter" },
        { "racimo_instance_recoveries_failed_total", "Times a lost node's instance could not be rebuilt (its requests ended with the reason).", "counter" },
        { "racimo_recovery_replayed_tokens_total", "Tokens evaluated again to rebuild running requests after a node was lost.", "counter" },
    };
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        metrics_help(b, gauges[g][0], gauges[g][2], gauges[g][1]);
        for (int i = 0; i < n; i++) {
            bool ready = registry_state(reg, list[i], NULL, 0) == MODEL_READY;
            if (g > 0 && !ready)
                continue;
            engine_stats st = { 0 };
            if (ready)
                engine_get_stats(list[i]->eng, &st);
            const long long v[] = { ready, st.n_queued, st.n_active, st.n_slots, st.kv_used,
                                    st.kv_total, st.n_recoveries, st.n_recoveries_failed,
                                    (long long)st.tokens_replayed };
            sb_printf(b, "%s{", gauges[g][0]);
            metrics_label(b, list[i]->name);
            sb_printf(b, "} %lld\n", v[g]);
        }
    }
    rc_free(list);
}
