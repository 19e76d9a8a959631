/* node.h - one racimo node: its cluster membership, pipeline stages, weight
 * server, request forwarder and HTTP server, made and started in the order
 * they need each other and stopped in the order their threads allow.
 * `racimo serve` runs one; tests run several in one process.
 *
 * Start: cluster (made, not yet running) -> pipeline and weights -> forwarder
 * (each takes its message types, which must happen before the cluster
 * thread runs) -> HTTP server (binds; its port is published) -> cluster
 * thread.
 * Stop: HTTP server (the engines end; a pipeline's head tells its stages to
 * stop, through the cluster) -> the stages this node runs and the weight
 * server (they send through the cluster) -> cluster (its thread calls into
 * the pipeline, weights and forwarder until it ends) -> pipeline, weights,
 * forwarder.
 */
#ifndef RC_NODE_H
#define RC_NODE_H

#include <stdbool.h>

#include "api.h"
#include "cluster/cluster.h"

typedef struct {
    api_config api;                  /* the HTTP server; node_start fills its cluster,
                                        pipeline, weights and forward */
    const cluster_config *cluster;   /* NULL: no cluster, the node serves alone */
    bool cluster_optional;           /* a cluster that cannot be made (say, an unwritable
                                        home) leaves the node serving alone instead of
                                        failing; node_solo_why says why */
    bool test_inject_batches;        /* tests only (racimo-hooks:
                                        $RACIMO_TEST_INJECT_BATCHES): a hostile member
                                        (pipeline_test_inject) */
    const char *const *model_digests; /* "NAME=HEX" content digests pulls of NAME must
                                        match (racimo serve --model-digest) */
    int n_model_digests;
    bool test_alter_weights;         /* tests only (racimo-hooks): serve altered weight
                                        bytes (weights_test_alter) */
} node_config;

void node_config_default(node_config *c);

typedef struct node node;

/* Makes and starts every part of a node (api_server_new: the socket is
 * bound, the -m models start loading; the cluster thread runs).  Returns 0,
 * or a negative code with rc_errmsg(), prefixed "cluster: ", "pipeline: "
 * or "forwarding: " when that part failed.  The config's strings and arrays
 * must outlive the node. */
int  node_start(const node_config *cfg, node **out);

/* Runs the HTTP event loop on the calling thread until node_stop (or a
 * signal, with api.handle_signals).  Returns 0 or a negative code. */
int  node_run(node *n);

/* Makes node_run return soon; thread safe. */
void node_stop(node *n);

/* Stops and frees every part, in the order above.  Call after node_run
 * returned (or without running it).  Accepts NULL. */
void node_free(node *n);

/* The node's cluster (NULL when it serves alone), and whether node_start
 * made a new one (a new key: the first node of a cluster). */
struct cluster *node_cluster(const node *n);
bool node_created_cluster(const node *n);

/* Why a node whose cluster was optional serves alone; NULL when it has its
 * cluster or was given none. */
const char *node_solo_why(const node *n);

/* The HTTP port actually bound (useful with api.port 0). */
int  node_http_port(const node *n);

#endif
