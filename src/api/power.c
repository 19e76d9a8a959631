/* power.c - this node's power and the cost of its models' tokens, for
 * /v1/cluster, /metrics and the dashboard (the arithmetic is cost.c's).
 *
 * Once a second (srv_power_tick, on the event loop): the node's power is
 * read (racimo serve --watts, else the RAPL counters) and published to the
 * cluster with its electricity price and amortisation; each running
 * model's token counters are sampled for its tokens/s.  A model's cost
 * takes the power of every node of its plan from the cluster view (what
 * each node published; a value that is not a sane number counts as
 * unknown, since a peer may send anything), or this node's own when it
 * runs here alone.  The tick also publishes the instances this node heads
 * (srv_publish_instances), so that every node's dashboard shows them all.
 */
#include "server_internal.h"
#include "cost.h"

#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_WATTS 1e6             /* more than this from a peer is not a machine's */
#define MAX_PER_HOUR 1e9

static double opt_num(const json_t *o, const char *key, double lo, double hi, double dflt)
{
    const json_t *v = json_object_get(o, key);
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    return isfinite(x) && x >= lo && x <= hi ? x : dflt;
}

static json_t *num_or_null(double x)
{
    return x >= 0 ? json_real(x) : json_null();
}

void srv_power_init(api_server *s)
{
    power_meter_init(&s->meter, s->cfg.powercap_root);
    s->watts = s->cfg.watts > 0 ? s->cfg.watts : -1;
}

/* This node's "power" object as published. */
static json_t *own_power(api_server *s)
{
    const char *src = s->cfg.watts > 0 ? "configured" : s->watts >= 0 ? "rapl" : "unknown";
    return json_pack("{s:o, s:s, s:o, s:f}", "watts", num_or_null(s->watts), "source", src,
                     "price_kwh", num_or_null(s->cfg.price_kwh), "hw_per_hour",
                     cost_hw_per_hour(s->cfg.hw_price, s->cfg.hw_years));
}

void srv_power_tick(api_server *s)
{
    uint64_t now = os_now_ns();
    /* the idle tick comes once a second, give or take: one a little early
     * still counts, else the reading would come every other second */
    if (now + 100000000ull < s->next_power_ns)
        return;
    s->next_power_ns = now + 1000000000ull;
    if (s->cfg.watts <= 0)
        s->watts = power_meter_sample(&s->meter, now);
    if (s->cfg.cluster) {
        json_t *p = own_power(s), *stable = json_deep_copy(p);
        json_object_del(stable, "watts");      /* measured: moves all the time */
        if (p && stable)
            cluster_set_published(s->cfg.cluster, "power", p, stable);
        json_decref(p);
        json_decref(stable);
    }
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    for (int i = 0; list && i < n; i++)
        if (registry_state(s->reg, list[i], NULL, 0) == MODEL_READY) {
            engine_stats es;
            engine_get_stats(list[i]->eng, &es);
            /* an engine counts from 0 when it is loaded: the tokens of a
             * request that ran before the first sample are still counted */
            if (!list[i]->rate.n && list[i]->t_loaded_ns && list[i]->t_loaded_ns < now)
                cost_rate_add(&list[i]->rate, list[i]->t_loaded_ns, 0, 0);
            cost_rate_add(&list[i]->rate, now, es.tokens_prompt, es.tokens_gen);
        } else {
            list[i]->rate.n = 0;
        }
    rc_free(list);
    srv_publish_instances(s);
}

/* The power figures of node `id` in the view. */
static cost_node view_node(const json_t *view, const char *id)
{
    cost_node c = { -1, -1, 0 };
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "id"));
        if (!nid || strcmp(nid, id))
            continue;
        const json_t *p = json_object_get(n, "power");
        c.watts = opt_num(p, "watts", 0, MAX_WATTS, -1);
        c.price_kwh = opt_num(p, "price_kwh", 0, MAX_PER_HOUR, -1);
        c.hw_per_hour = opt_num(p, "hw_per_hour", 0, MAX_PER_HOUR, 0);
    }
    return c;
}

json_t *srv_model_cost(api_server *s, api_model *m, const json_t *plan, const json_t *view)
{
    double in_s, out_s;
    cost_rate_get(&m->rate, COST_WINDOW_S, &in_s, &out_s);
    cost_node nodes[16];
    int k = 0;
    json_t *ids = json_array();
    size_t i;
    json_t *st;
    json_array_foreach(json_object_get(plan, "stages"), i, st) {
        const char *id = json_string_value(json_object_get(st, "node"));
        bool seen = false;
        for (size_t j = 0; id && j < json_array_size(ids); j++)
            seen |= !strcmp(json_string_value(json_array_get(ids, j)), id);
        if (!id || seen || k == 16)
            continue;
        json_array_append_new(ids, json_string(id));
        nodes[k++] = view_node(view, id);
    }
    if (!k) {                      /* here alone */
        const char *self = s->cfg.cluster ? cluster_self_id(s->cfg.cluster) : "self";
        json_array_append_new(ids, json_string(self));
        nodes[k++] = (cost_node){ s->watts, s->cfg.price_kwh,
                                  cost_hw_per_hour(s->cfg.hw_price, s->cfg.hw_years) };
    }
    cost_figures f = cost_compute(nodes, k, out_s, s->cfg.price_kwh);
    return json_pack("{s:o, s:o, s:f, s:f, s:o, s:o}", "nodes", ids, "watts",
                     num_or_null(f.watts), "tokens_per_s", out_s, "tokens_in_per_s", in_s,
                     "wh_per_1k_tokens", num_or_null(f.wh_per_1k), "cost_per_mtok",
                     num_or_null(f.cost_per_mtok));
}

json_t *srv_cost_basis(api_server *s)
{
    char basis[400];
    snprintf(basis, sizeof basis,
             "Power of every node of a model's plan (idle included) at %s per kWh%s, over the "
             "tokens it generated in the last %d s.",
             s->cfg.price_kwh >= 0 ? "the configured price" : "no price set (--price-kwh)",
             s->cfg.hw_price > 0 && s->cfg.hw_years > 0 ? ", plus hardware amortisation" : "",
             COST_WINDOW_S);
    return json_pack("{s:o, s:o, s:s, s:o}", "price_kwh", num_or_null(s->cfg.price_kwh),
                     "cloud_per_mtok", num_or_null(s->cfg.cloud_price), "basis", basis,
                     "power", own_power(s));
}

void srv_cost_metrics(api_server *s, strbuf *b)
{
    json_t *view = s->cfg.cluster ? cluster_snapshot(s->cfg.cluster) : NULL;
    metrics_help(b, "racimo_node_power_watts", "gauge",
                 "This node's power: --watts, else measured by RAPL (absent when unknown).");
    if (s->watts >= 0)
        sb_printf(b, "racimo_node_power_watts %.3f\n", s->watts);
    if (s->cfg.cloud_price >= 0) {
        metrics_help(b, "racimo_cloud_cost_per_million_tokens", "gauge",
                     "The cloud price given for comparison (--cloud-price).");
        sb_printf(b, "racimo_cloud_cost_per_million_tokens %.6f\n", s->cfg.cloud_price);
    }
    static const struct { const char *name, *key, *help; } g[] = {
        { "racimo_model_tokens_per_second", "tokens_per_s",
          "Tokens generated per second over the last minute." },
        { "racimo_model_power_watts", "watts", "Power of the nodes of the model's plan." },
        { "racimo_model_energy_wh_per_1k_tokens", "wh_per_1k_tokens",
          "Energy per 1,000 generated tokens (Wh)." },
        { "racimo_model_cost_per_million_tokens", "cost_per_mtok",
          "Electricity and amortisation per million generated tokens." },
    };
    int n = 0;
    api_model **list = registry_list(s->reg, &n);
    json_t **costs = list && n ? rc_calloc((size_t)n, sizeof *costs) : NULL;
    for (int i = 0; costs && i < n; i++) {
        if (registry_state(s->reg, list[i], NULL, 0) != MODEL_READY)
            continue;
        pthread_mutex_lock(&list[i]->mu);
        json_t *plan = json_incref(list[i]->plan);
        pthread_mutex_unlock(&list[i]->mu);
        costs[i] = srv_model_cost(s, list[i], plan, view);
        json_decref(plan);
    }
    for (size_t k = 0; costs && k < sizeof g / sizeof g[0]; k++) {
        metrics_help(b, g[k].name, "gauge", g[k].help);
        for (int i = 0; i < n; i++) {
            json_t *v = json_object_get(costs[i], g[k].key);
            if (!json_is_number(v))
                continue;
            sb_printf(b, "%s{", g[k].name);
            metrics_label(b, list[i]->name);
            sb_printf(b, "} %.6f\n", json_number_value(v));
        }
    }
    for (int i = 0; costs && i < n; i++)
        json_decref(costs[i]);
    rc_free(costs);
    rc_free(list);
    json_decref(view);
}
