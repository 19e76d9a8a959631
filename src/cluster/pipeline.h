/* pipeline.h - one model across several nodes: each node runs a stage (a
 * layer range) and passes hidden states to the next; the last stage samples
 * and sends token ids back to the head, the node whose engine schedules the
 * requests (infer/engine.h over the executor made here).
 *
 * Every node of a cluster has one pipeline object: it answers the head's
 * set-up of a stage (loads the layers from its own models folders), runs
 * stage batches on a worker thread per stage, and, on the head, is the
 * engine's executor.  Messages ride the cluster's authenticated links (types
 * 0x40-0x4f); their layout is in docs/cluster-protocol.md.
 */
#ifndef RC_PIPELINE_H
#define RC_PIPELINE_H

#include <stdbool.h>
#include <jansson.h>

#include "cluster.h"
#include "infer/exec.h"

#define PIPELINE_MAX_STAGES 16

typedef struct pipeline pipeline;

typedef struct {
    char node[33];            /* node id (32 hex digits) */
    int first, last;          /* layers [first, last) */
} pipeline_stage;

typedef struct {
    char model[256];          /* model name (file name without .gguf) */
    int n_layer, n_embd, n_vocab;
    int n_ctx, n_seq, n_batch, n_threads;
    bool wire_f32;            /* hidden states as f32 (default f16) */
    int kv_type;              /* the stages' KV cache elements: TT_F32 (0), TT_F16 or
                                 TT_Q8_0 (tensor/kv_types.h) */
    bool tensor;              /* the stages are tensor-parallel shards (each [0, n_layer)):
                                 every batch goes to all of them, they sum their parts
                                 with each other, and shard 0 samples */
    int pooling;              /* an embedding model's pooling (model.h POOL_*; 0: none):
                                the last stage sends each input's pooled vector (2.2);
                                layer ranges only, not tensor-parallel shards */
    int n_stages;
    pipeline_stage stage[PIPELINE_MAX_STAGES];
    int test_old_cut;         /* tests only: 1 = send SETUP without "cut", as a head
                                 of protocol 1.2 does */
} pipeline_spec;

/* Registers the pipeline's message handlers on a cluster (before
 * cluster_start).  Stages this node runs use n_threads (0: its physical
 * cores) unless the head asks for a number. */
int  pipeline_new(struct cluster *c, int n_threads, pipeline **out);
/* Stops every stage this node runs and drops messages from then on: call
 * it before cluster_free (stages send through the cluster), and
 * pipeline_free after (the cluster thread calls into the pipeline). */
void pipeline_stop(pipeline *p);         /* accepts NULL */
void pipeline_free(pipeline *p);         /* accepts NULL */

/* Sets up the stages on their nodes and waits (up to timeout_ms) until each
 * has loaded its layers; then returns an executor for engine_new_exec.  On
 * failure the error names the stage and node and why.  `progress` (may be
 * NULL) gets one line per stage that becomes ready. */
int pipeline_exec_new(pipeline *p, const pipeline_spec *spec, int timeout_ms,
                      void (*progress)(void *ud, const char *line), void *ud,
                      engine_exec **out);

/* Stages whose model this node lacks pull exactly their layers through
 * `w` (weights.h); without it they fail.  Also forwards node-down events
 * to it (the cluster has one down-handler slot).  Before cluster_start. */
struct weights;
void pipeline_set_weights(pipeline *p, struct weights *w);

/* Whether an executor's pipeline broke (a stage node down or a stage
 * failed); the engine keeps running but every batch fails. */
bool pipeline_exec_broken(engine_exec *x);

/* The sequence slots of the instance of `model_name` that node `head` set up
 * with a stage on this node (the most, if several), or 0 when this node
 * runs none: what that head's plan can hold, whatever it claims. */
int pipeline_plan_slots(pipeline *p, const char *head, const char *model_name);

/* Instances this node heads and stages it runs, for GET /v1/cluster. */
json_t *pipeline_status(pipeline *p);

/* Tests only (racimo-hooks): from now until pipeline_stop, this node sends
 * the other nodes batches for their instances as a hostile member would
 * (pipe_hostile.c).  0, or -1 when its thread cannot start. */
int pipeline_test_inject(pipeline *p);

/* Traffic counters (bytes of stage batches sent and received by this
 * node, messages), for benchmarks. */
void pipeline_traffic(pipeline *p, uint64_t *bytes_out, uint64_t *msgs_out);

#endif
