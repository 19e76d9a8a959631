/* node.c - the parts of a node, started and stopped in one order (node.h
 * says which and why).  A part that fails to start leaves the ones made
 * before it to node_free, which accepts a node made halfway.
 */
#include "node.h"
#include "base/err.h"
#include "base/mem.h"
#include "cluster/pipeline.h"
#include "cluster/weights.h"

#include <stdio.h>
#include <string.h>

struct node {
    api_config api;           /* a copy, with the parts below filled in */
    struct cluster *c;        /* NULL: serving alone */
    pipeline *p;
    weights *w;
    api_forward *f;
    api_copies *copies;
    api_server *s;
    bool created;
    char solo_why[256];
};

void node_config_default(node_config *c)
{
    *c = (node_config){ .cluster = NULL };
    api_config_default(&c->api);
}

/* Frees a node made halfway, keeping the cause of failure `rc` for
 * rc_errmsg: the parts' shutdown may record failures of its own. */
static int undo(node *n, int rc)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", rc_errmsg());
    node_free(n);
    return rc_fail(rc, "%s", why);
}

/* "NAME=HEX" (racimo serve --model-digest). */
static int pin_digest(weights *w, const char *arg)
{
    const char *eq = strchr(arg, '=');
    char name[WEIGHTS_NAME_MAX + 1];
    uint8_t root[DIGEST_BYTES];
    if (!eq || eq == arg || (size_t)(eq - arg) > WEIGHTS_NAME_MAX || digests_parse(eq + 1, root))
        return rc_fail(RC_EINVAL, "--model-digest wants NAME=HEX (64 hex digits), not '%s'", arg);
    snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
    return weights_pin(w, name, root);
}

int node_start(const node_config *cfg, node **out)
{
    *out = NULL;
    node *n = rc_calloc(1, sizeof *n);
    if (!n)
        return rc_fail(RC_ENOMEM, "out of memory");
    n->api = cfg->api;
    int rc = 0;
    if (cfg->cluster && (rc = cluster_new(cfg->cluster, &n->c, &n->created))) {
        if (!cfg->cluster_optional) {
            rc_wrap(rc, "cluster: ");
            goto fail;
        }
        snprintf(n->solo_why, sizeof n->solo_why, "%s", rc_errmsg());
        n->c = NULL;
        rc = 0;
    }
    if (n->c) {
        const char *models_dir = n->api.models_dir ? n->api.models_dir
                                                   : cluster_models_dir(n->c);
        if ((rc = pipeline_new(n->c, n->api.threads, &n->p)) ||
            (rc = weights_new(n->c, models_dir, n->api.ro_dirs, &n->w))) {
            rc_wrap(rc, "pipeline: ");
            goto fail;
        }
        pipeline_set_weights(n->p, n->w);
        if (cfg->test_inject_batches && pipeline_test_inject(n->p)) {
            rc = rc_fail(RC_ENOMEM, "pipeline: cannot start the test's injecting thread");
            goto fail;
        }
        weights_test_alter(n->w, cfg->test_alter_weights);
        for (int i = 0; i < cfg->n_model_digests; i++)
            if ((rc = pin_digest(n->w, cfg->model_digests[i])))
                goto fail;
        if ((rc = api_forward_new(n->c, &n->f))) {
            rc_wrap(rc, "forwarding: ");
            goto fail;
        }
        if ((rc = api_copies_new(n->c, n->w, models_dir, &n->copies))) {
            rc_wrap(rc, "copies: ");
            goto fail;
        }
        n->api.copies = n->copies;
        n->api.cluster = n->c;
        n->api.pipeline = n->p;
        n->api.weights = n->w;
        n->api.forward = n->f;
    }
    if ((rc = api_server_new(&n->api, &n->s)))
        goto fail;
    if (n->c) {
        cluster_set_http_port(n->c, api_server_port(n->s));
        if ((rc = cluster_start(n->c))) {
            rc_wrap(rc, "cluster: ");
            goto fail;
        }
    }
    *out = n;
    return 0;
fail:
    return undo(n, rc);
}

int node_run(node *n)
{
    return api_server_run(n->s);
}

void node_stop(node *n)
{
    api_server_stop(n->s);
}

void node_free(node *n)
{
    if (!n)
        return;
    api_server_free(n->s);
    pipeline_stop(n->p);
    weights_stop(n->w);
    cluster_free(n->c);
    pipeline_free(n->p);
    weights_free(n->w);
    api_forward_free(n->f);
    api_copies_free(n->copies);
    rc_free(n);
}

struct cluster *node_cluster(const node *n) { return n->c; }
bool node_created_cluster(const node *n) { return n->created; }
const char *node_solo_why(const node *n) { return n->solo_why[0] ? n->solo_why : NULL; }
int node_http_port(const node *n) { return api_server_port(n->s); }
