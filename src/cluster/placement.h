/* placement.h - which node runs which layers of a model.
 *
 * Pure functions, no I/O: the caller gives the model's sizes (model_size.h)
 * and the nodes (from a cluster view, or hypothetical), and gets stages:
 * contiguous layer ranges, in order, each on one node.
 *
 * The rule (issue "placement"): a model that fits on one node runs on one
 * node, the fastest that holds it.  Otherwise its layers are split across
 * the fewest nodes that hold the weights and the KV cache for n_ctx * n_seq
 * tokens, split so that each stage takes the same time per token (the
 * bytes its layers read per token over its node's bandwidth: equal nodes
 * take equal work, a faster node takes more, and the first stage takes
 * more layers when the last one also holds the output matrix), never
 * above what a node can give (a node too small for its share takes what it
 * holds and the others the rest).  min_nodes forces at least that many stages.  Every stage gets
 * at least one layer.  Results are deterministic: ties go to the smaller
 * node id.
 *
 * Memory a node can give (mem_avail): for nodes of a cluster view,
 * min(mem_free - reserve, mem_offer) where mem_offer is what the node offers
 * (`racimo serve --max-memory`, else its free memory) and the reserve, kept
 * free for the OS, activations and logits, defaults to max(512 MiB, 10% of
 * the node's memory).  Hypothetical nodes (mem_free 0) give mem_avail as
 * set.  Unknown memory bandwidth counts as PLACEMENT_DEFAULT_BW_GBS in the
 * estimates, but a node whose bandwidth is known goes first (a node not
 * benchmarked yet, or known only by its SWIM digest, never looks faster
 * than a measured one); an unknown link counts as PLACEMENT_DEFAULT_HOP_MS
 * per hop.
 */
#ifndef RC_PLACEMENT_H
#define RC_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "model/model_size.h"

#define PLACEMENT_MAX_STAGES 16
#define PLACEMENT_DEFAULT_BW_GBS 10.0          /* a node that has not benchmarked yet */
#define PLACEMENT_DEFAULT_HOP_MS 0.5           /* a link not probed yet (LAN) */
#define PLACEMENT_MIN_RESERVE ((uint64_t)512 << 20)
#define PLACEMENT_HOP_BYTES 16384              /* activations per hop when n_embd is unknown
                                                  (8192 wide, f16) */

typedef struct {
    char id[33];
    char name[64];
    uint64_t mem_avail;      /* bytes it can give: min(mem_free - reserve, mem_offer) */
    double bw_gbs;           /* memory bandwidth, GB/s (0: unknown) */
    double gflops;           /* matmul speed (0: unknown) */
    uint64_t mem_total, mem_free, mem_offer;   /* as published; 0 for hypothetical nodes,
                                                  whose mem_avail is taken as given */
    bool old_cut;            /* speaks protocol < 1.3, which cuts tensor-parallel shards
                                another way: never a shard of a 1.3 instance */
    bool self;               /* the node placing (the view's "self"): first among
                                equally fast nodes, so a model that fits it stays */
} placement_node;

typedef struct {
    int n_ctx;               /* tokens per sequence */
    int n_seq;               /* parallel sequences */
    int min_nodes;           /* force a split over at least this many nodes; 0/1 = no */
    bool tensor;             /* split every layer across the nodes (tensor parallel)
                                instead of giving each node a layer range */
    bool auto_split;         /* whichever of the two is expected faster for one stream
                                (tensor only into as many shards as the model can be cut
                                into, model_sizes.tp_ways); `tensor` is then ignored */
    uint64_t reserve;        /* per node bytes kept free (nodes with mem_free only);
                                0 = max(PLACEMENT_MIN_RESERVE, mem_total / 10) */
} placement_opts;

typedef struct {
    int node;                /* index into the nodes array */
    char id[33];
    char name[64];
    int first, last;         /* layers [first, last) */
    uint64_t weight_bytes, kv_bytes;
    double ms_per_token;     /* weights read per token / bandwidth */
} placement_stage;

typedef struct {
    bool fits;
    bool tensor;             /* the stages are tensor-parallel shards: each runs
                                every layer ([0, n_layer)) with an equal part of
                                every matrix, summing with the others twice a layer */
    int n_stages;
    placement_stage stage[PLACEMENT_MAX_STAGES];
    double tokens_per_s;     /* one stream: 1000 / (stage ms + a hop between consecutive
                                stages and one back from the last to the first) */
    uint64_t need_bytes;     /* weights + KV cache of the whole model */
    uint64_t have_bytes;     /* what all the nodes can give */
    char advice[512];        /* when it does not fit: the shortfall and what would fit */
} placement;

/* Tensor-parallel placement (opts.tensor): the same search for the fewest
 * nodes, but each node holds an equal part of every layer (1/k of the
 * matrices and of the KV cache, plus the whole embedding table for
 * look-ups), and a token takes the slowest node's time plus two exchanges
 * per layer over the slowest link of the set. */

/* The reserve of a node with `mem_total` bytes when opts.reserve is 0. */
uint64_t placement_default_reserve(uint64_t mem_total);

/* What node n can give under `reserve` (0 = the default). */
uint64_t placement_node_avail(const placement_node *n, uint64_t reserve);

/* Places the model.  link_ms [n_nodes * n_nodes] is the cost in ms of a hop
 * from node i to node j (row i), negative for unknown; NULL: all unknown.
 * Returns 0 with *out filled (out->fits false and out->advice set when it
 * does not fit, which is not an error), or RC_EINVAL (n_ctx or n_seq < 1, a
 * model without layers, n_nodes < 0) / RC_ENOMEM with rc_errmsg(). */
int placement_make(const model_sizes *ms, const placement_node *nodes, int n_nodes,
                   const double *link_ms, const placement_opts *o, placement *out);

/* The nodes "up" of a cluster view (GET /v1/cluster, cluster_snapshot):
 * *nodes (rc_malloc'd, n of them) with mem_avail under the default reserve,
 * and *link_ms (rc_malloc'd [n*n], may be NULL to skip) for hops of
 * PLACEMENT_HOP_BYTES.  A node publishes its offer as hardware.mem_offer
 * (nodes of older versions: mem_free is used).  RC_EFORMAT naming what is
 * wrong when the view is not a cluster view; RC_ENOMEM.  Free with rc_free. */
int placement_nodes_from_view(const json_t *view, placement_node **nodes, int *n, double **link_ms);

/* Fills link_ms [n*n] from the view's links for hops of n_embd * 2 bytes:
 * rtt/2 + bytes / bandwidth (1 Gbit/s when not measured); -1 where no link
 * is known, 0 on the diagonal. */
void placement_links_from_view(const json_t *view, const placement_node *nodes, int n, int n_embd,
                               double *link_ms);

/* {"fits", "split" ("layers" or "tensor"), "stages":[{"node" (id), "index", "name", "first", "last",
 * "weight_bytes", "kv_bytes", "ms_per_token"}], "tokens_per_s",
 * "need_bytes", "have_bytes", "advice", "n_layer", "kv_cache_type" (f32, f16, q8_0),
 * "kv_bytes_per_token" (all layers)}; NULL when out of memory. */
json_t *placement_to_json(const placement *p, const model_sizes *ms);

#endif
