/* placed.c - placing a model on the cluster and starting its pipeline. */
#include "placed.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"
#include "cluster/pipeline.h"
#include "cluster/placement.h"
#include "cluster/weights.h"
#include "infer/exec.h"
#include "model/gguf.h"
#include "model/model_size.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define STAGE_START_MS (15 * 60 * 1000)   /* a stage may have to pull its weights */
#define REBUILD_MARGIN_MS 5000
#define REBUILD_RETRY_MS 500
#define MEASURE_MAX 16          /* candidates whose links are measured before placing */
#define MEASURE_WAIT_MS 5000    /* a link opened on demand: dial, handshake, ping, probe */

static void log_progress(void *ud, const char *line)
{
    rc_log(LOG_INFO, "model %s: %s", ((api_model *)ud)->name, line);
}

static bool wished(const place_wish *wish, const char *id, const char *name)
{
    if (!wish || wish->n_nodes <= 0)
        return true;
    for (int j = 0; j < wish->n_nodes; j++)
        if (!strcmp(id, wish->nodes[j]) || (name && !strcmp(name, wish->nodes[j])))
            return true;
    return false;
}

/* With SWIM this node has links (and so measures) only to a few nodes:
 * the candidates of a placement (nodes up, those asked for, the ones with
 * the most memory on offer first, at most MEASURE_MAX) get their links
 * measured on demand, or their cached measure when young enough.  True
 * when something was measured (the view is to be taken again). */
static bool measure_candidates(const registry_config *cfg, const json_t *view,
                               const place_wish *wish)
{
    placement_node *nodes = NULL;
    int n = 0;
    if (placement_nodes_from_view(view, &nodes, &n, NULL) || n == 0) {
        rc_free(nodes);
        return false;
    }
    const char *self = cluster_self_id(cfg->cluster);
    const char *ids[MEASURE_MAX];
    int k = 0;
    bool *taken = rc_calloc((size_t)n, sizeof *taken);
    while (taken && k < MEASURE_MAX) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && strcmp(nodes[i].id, self) && wished(wish, nodes[i].id, nodes[i].name) &&
                (best < 0 || nodes[i].mem_avail > nodes[best].mem_avail))
                best = i;
        if (best < 0)
            break;
        taken[best] = true;
        ids[k++] = nodes[best].id;
    }
    int asked = k ? cluster_measure_links(cfg->cluster, ids, k, MEASURE_WAIT_MS) : 0;
    if (asked)
        rc_log(LOG_INFO, "placement: measured the links to %d of %d candidate node%s on demand",
               asked, k, k == 1 ? "" : "s");
    rc_free(taken);
    rc_free(nodes);
    return asked > 0;
}

/* The placement of a model with hparams hp and sizes ms for n_ctx x n_seq
 * tokens on the cluster's nodes up in `view`.  `warn`: log a --min-nodes
 * the cluster cannot meet. */
static int place_on(const registry_config *cfg, const char *name, const model_hparams *hp,
                    const model_sizes *ms, int n_ctx, int n_seq, const place_wish *wish, bool warn,
                    const json_t *view, placement *pl)
{
    placement_node *nodes = NULL;
    double *links = NULL;
    int n = 0, rc;
    if ((rc = placement_nodes_from_view(view, &nodes, &n, &links)))
        return rc;
    /* only the nodes asked for (by id or name), those of them that are up */
    if (wish && wish->n_nodes > 0) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (wished(wish, nodes[i].id, nodes[i].name))
                nodes[k++] = nodes[i];
        n = k;
        if (!n) {
            rc_free(nodes);
            rc_free(links);
            return rc_fail(RC_EINVAL, "none of the nodes asked for %s is up", name);
        }
    }
    if (links)          /* for the nodes kept: [n * n] fits in what was made for all */
        placement_links_from_view(view, nodes, n, hp->n_embd, links);
    /* min_nodes is a wish (benchmarks, tests): with fewer nodes up, as
     * many as there are, so a model still runs after a node is lost. */
    int min_nodes = wish && wish->min_nodes > 0 ? wish->min_nodes : cfg->min_nodes;
    if (min_nodes > n) {
        if (warn)
            rc_log(LOG_WARN, "model %s: --min-nodes %d but %d node%s up", name, min_nodes, n,
                   n == 1 ? " is" : "s are");
        min_nodes = n;
    }
    /* an embedding model is split by layers: the shards' last stage does
     * not pool */
    int split = wish && wish->split ? wish->split
              : cfg->split_auto ? PLACE_SPLIT_AUTO : cfg->split_tensor ? PLACE_SPLIT_TENSOR
              : PLACE_SPLIT_LAYERS;
    placement_opts o = { .n_ctx = n_ctx, .n_seq = n_seq, .min_nodes = min_nodes,
                         .tensor = split == PLACE_SPLIT_TENSOR && !hp->pooling,
                         .auto_split = split == PLACE_SPLIT_AUTO && !hp->pooling };
    rc = placement_make(ms, nodes, n, links, &o, pl);
    rc_free(nodes);
    rc_free(links);
    return rc;
}

/* place_on the view as it is now (*view: the snapshot, the caller's to
 * free).  `measure`: when the placement uses other nodes, measure first the
 * links to candidates that have no fresh measure, and place again (may
 * wait a few seconds: loads only, not previews or routing). */
static int place(const registry_config *cfg, const char *name, const model_hparams *hp,
                 const model_sizes *ms, int n_ctx, int n_seq, const place_wish *wish, bool warn,
                 bool measure, json_t **view, placement *pl)
{
    if (!(*view = cluster_snapshot(cfg->cluster)))
        return rc_fail(RC_ENOMEM, "out of memory");
    int rc = place_on(cfg, name, hp, ms, n_ctx, n_seq, wish, warn, *view, pl);
    if (rc || !measure || !pl->fits ||
        (pl->n_stages == 1 && !strcmp(pl->stage[0].id, cluster_self_id(cfg->cluster))) ||
        !measure_candidates(cfg, *view, wish))
        return rc;
    json_decref(*view);
    if (!(*view = cluster_snapshot(cfg->cluster)))
        return rc_fail(RC_ENOMEM, "out of memory");
    return place_on(cfg, name, hp, ms, n_ctx, n_seq, wish, false, *view, pl);
}

/* Places the model of the file at `path` as it would be placed now for
 * the configured context (capped at the model's) under `wish`.  *f, *ms and
 * *view are the caller's to free, also after an error. */
static int place_file(const registry_config *cfg, const char *name, const char *path,
                      const place_wish *wish, gguf_file **f, model_sizes *ms, json_t **view,
                      placement *pl)
{
    model_hparams hp;
    memset(ms, 0, sizeof *ms);
    *f = NULL;
    *view = NULL;
    int rc = gguf_open_meta(path, f);
    if (!rc)
        rc = model_read_hparams(*f, &hp);
    if (!rc)
        rc = model_sizes_read(*f, ms);
    if (!rc)
        rc = model_sizes_set_kv_type(ms, cfg->engine.kv_type);
    if (rc)
        return rc;
    int n_ctx = cfg->engine.n_ctx;
    if (hp.n_ctx_train > 0 && n_ctx > hp.n_ctx_train)
        n_ctx = hp.n_ctx_train;
    return place(cfg, name, &hp, ms, n_ctx, cfg->engine.n_seq, wish, false, false, view, pl);
}

bool placed_runs_here(const registry_config *cfg, const char *name, const char *path)
{
    if (!cfg->cluster)
        return true;
    gguf_file *f;
    model_sizes ms;
    json_t *view;
    placement pl;
    bool here = true;            /* a file it cannot read: the load says why */
    if (!place_file(cfg, name, path, NULL, &f, &ms, &view, &pl))
        here = pl.fits && pl.n_stages == 1 &&
               !strcmp(pl.stage[0].id, cluster_self_id(cfg->cluster));
    json_decref(view);
    model_sizes_free(&ms);
    gguf_close(f);
    return here;
}

int placed_preview(const registry_config *cfg, const api_model *m, const place_wish *wish,
                   json_t **plan)
{
    *plan = NULL;
    if (!cfg->cluster)
        return rc_fail(RC_ESTATE, "this node runs without a cluster: %s would run here", m->name);
    if (m->remote)
        return rc_fail(RC_ESTATE, "%s is a file of another node: its plan is known once this "
                       "node has pulled its header (start it, or preview it on that node)",
                       m->name);
    gguf_file *f;
    model_sizes ms;
    json_t *view;
    placement pl;
    int rc = place_file(cfg, m->name, m->path, wish, &f, &ms, &view, &pl);
    if (!rc && !(*plan = placement_to_json(&pl, &ms)))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    if (!rc)
        json_object_set_new(*plan, "runs_here", json_boolean(
            pl.fits && pl.n_stages == 1 && !strcmp(pl.stage[0].id, cluster_self_id(cfg->cluster))));
    json_decref(view);
    model_sizes_free(&ms);
    gguf_close(f);
    return rc;
}

/* A pipeline (or tensor-parallel instance) for model m on the placement pl,
 * in *x. */
static int start_exec(const registry_config *cfg, api_model *m, const model_hparams *hp,
                      const placement *pl, engine_exec **x)
{
    pipeline_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.model, sizeof spec.model, "%s", m->name);
    spec.n_layer = hp->n_layer;
    spec.n_embd = hp->n_embd;
    spec.n_vocab = hp->n_vocab;
    spec.n_ctx = m->ep.n_ctx;
    spec.n_seq = m->ep.n_seq;
    spec.n_batch = m->ep.n_batch;
    spec.n_threads = 0;                            /* each node its own */
    spec.wire_f32 = cfg->wire_f32;
    spec.kv_type = m->ep.kv_type;
    spec.pooling = hp->pooling;
    spec.n_stages = pl->n_stages;
    spec.tensor = pl->tensor;
    for (int k = 0; k < pl->n_stages; k++) {
        snprintf(spec.stage[k].node, sizeof spec.stage[k].node, "%s", pl->stage[k].id);
        spec.stage[k].first = pl->stage[k].first;
        spec.stage[k].last = pl->stage[k].last;
        if (pl->tensor)
            rc_log(LOG_INFO, "model %s: shard %d of %d (every layer) on node %.8s (%s)", m->name,
                   k, pl->n_stages, pl->stage[k].id, log_clean(pl->stage[k].name));
        else
            rc_log(LOG_INFO, "model %s: stage %d, layers %d-%d on node %.8s (%s)", m->name, k,
                   pl->stage[k].first, pl->stage[k].last - 1, pl->stage[k].id,
                   log_clean(pl->stage[k].name));
    }
    return pipeline_exec_new(cfg->pipeline, &spec, STAGE_START_MS, log_progress, m, x);
}

/* The placement of model m now; refusals (it does not fit, no quorum) as
 * errors.  *here: it runs on this node alone. */
static int place_now(const registry_config *cfg, api_model *m, const model_hparams *hp,
                     bool warn, placement *pl, json_t **plan, bool *here)
{
    model_sizes ms;
    memset(&ms, 0, sizeof ms);
    json_t *view = NULL;
    *plan = NULL;
    *here = false;
    int rc = model_sizes_read(m->lm.file, &ms);
    if (!rc)
        rc = model_sizes_set_kv_type(&ms, m->ep.kv_type);
    if (rc || (rc = place(cfg, m->name, hp, &ms, m->ep.n_ctx, m->ep.n_seq, &m->wish, warn, true,
                          &view, pl)))
        goto out;
    *plan = placement_to_json(pl, &ms);
    if (!pl->fits) {
        rc = rc_fail(RC_ENOMEM, "%s does not fit the cluster: %s", m->name, pl->advice);
        goto out;
    }
    *here = pl->n_stages == 1 && !strcmp(pl->stage[0].id, cluster_self_id(cfg->cluster));
    /* The partition rule (docs/cluster.md): only a side that sees a strict
     * majority of the members may place instances on other nodes. */
    if (!*here && !cluster_has_quorum(cfg->cluster))
        rc = rc_fail(RC_ESTATE, "%s needs other nodes, but this node sees only %d of the %d "
                     "members of its cluster (no quorum: a partition?); it does not place "
                     "instances until it sees a majority",
                     m->name, (int)json_integer_value(json_object_get(view, "members_up")),
                     (int)json_integer_value(json_object_get(view, "members")));
out:
    json_decref(view);
    model_sizes_free(&ms);
    return rc;
}

/* One attempt of rebuild(). */
static int rebuild_once(api_model *m, engine_exec **x)
{
    const registry_config *cfg = registry_get_config(m->reg);
    model_hparams hp;
    placement pl;
    json_t *plan = NULL;
    bool here = false;
    *x = NULL;
    int rc = model_read_hparams(m->lm.file, &hp);
    if (!rc)
        rc = place_now(cfg, m, &hp, false, &pl, &plan, &here);
    if (!rc)
        rc_log(LOG_INFO, "model %s: placed again: %s over %d node%s", m->name,
               here ? "alone" : pl.tensor ? "tensor parallel" : "layer ranges", pl.n_stages,
               pl.n_stages == 1 ? "" : "s");
    if (!rc && here) {
        /* alone now: this node maps the whole model (a file pulled from a
         * peer is completed first) */
        char path[1200];
        model *mod = NULL;
        snprintf(path, sizeof path, "%s", m->remote ? m->local_path : m->path);
        if (m->remote)
            rc = weights_ensure(cfg->weights, m->name, 0, -1, NULL, NULL, NULL, NULL, path, sizeof path);
        if (!rc)
            rc = model_load(path, 0, -1, &mod);
        stage_params sp = { .n_ctx = m->ep.n_ctx, .n_seq = m->ep.n_seq, .n_batch = m->ep.n_batch,
                            .n_threads = m->ep.n_threads, .precision = m->ep.precision,
                            .kv_type = m->ep.kv_type };
        if (!rc)
            rc = exec_local_new_owned(mod, &sp, x);
        if (!rc)
            rc_log(LOG_INFO, "model %s: runs on this node alone now", m->name);
    } else if (!rc) {
        rc = start_exec(cfg, m, &hp, &pl, x);
    }
    if (rc) {
        json_decref(plan);
        return rc;
    }
    pthread_mutex_lock(&m->mu);
    json_decref(m->plan);
    m->plan = plan;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* engine_rebuild_fn: the model placed again on the nodes up, as a new
 * pipeline, or on this node alone.  The lost node may still count as up
 * for a moment (a cut link is seen only when its heartbeats stop, and a
 * shard may report a peer's loss before this node's link to it does), so
 * a plan that cannot be started is tried again until the view has caught
 * up: for the node-down time and a margin. */
static int rebuild(void *ud, const char *why, engine_exec **x)
{
    api_model *m = ud;
    const registry_config *cfg = registry_get_config(m->reg);
    rc_log(LOG_WARN, "model %s: %s; placing it again on the nodes up", m->name, why);
    const uint64_t t0 = os_now_ns(),
                   limit = (uint64_t)(cluster_down_after_ms(cfg->cluster) + REBUILD_MARGIN_MS) * 1000000ull;
    for (int attempt = 1;; attempt++) {
        int rc = rebuild_once(m, x);
        if (!rc || os_now_ns() - t0 > limit)
            return rc;
        rc_log(LOG_INFO, "model %s: rebuild attempt %d: %s; trying again", m->name, attempt,
               rc_errmsg());
        os_sleep_ms(REBUILD_RETRY_MS);
    }
}

int placed_engine(const registry_config *cfg, api_model *m, engine **eng, json_t **plan)
{
    *eng = NULL;
    *plan = NULL;
    if (!cfg->cluster || !cfg->pipeline)
        return 0;
    model_hparams hp;
    placement pl;
    bool here;
    int rc = model_read_hparams(m->lm.file, &hp);
    if (rc || (rc = place_now(cfg, m, &hp, true, &pl, plan, &here)) || here)
        return rc;
    engine_exec *x = NULL;
    if ((rc = start_exec(cfg, m, &hp, &pl, &x)))
        return rc;
    if ((rc = engine_new_exec(x, m->lm.tok, hp.n_vocab, &m->ep, eng)))   /* takes x */
        return rc;
    engine_set_rebuild(*eng, rebuild, m);
    return 0;
}
