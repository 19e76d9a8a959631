/* shard_group.h - the tensor-parallel shards of a model in one process,
 * summing through memory: each shard is a stage (stage.h) over its part of
 * every layer (model_load_shard), run on a thread of its own, and the
 * shards meet at every sum.  What a cluster of n nodes computes with a
 * link of no latency; used to measure how the cut itself scales and to
 * test it.
 */
#ifndef RC_SHARD_GROUP_H
#define RC_SHARD_GROUP_H

#include "stage.h"

#define SHARD_GROUP_MAX 16

typedef struct shard_group shard_group;

/* Loads n shards (2 <= n <= SHARD_GROUP_MAX) of layers [0, n_layer) of the
 * model at `path`, each a stage with params p (p->n_threads threads each;
 * p->reduce is ignored).  f16: each part is rounded to f16 before the sum,
 * as on the cluster's default wire.  Errors of model_load_shard and
 * stage_new. */
int  shard_group_new(const char *path, int n, const stage_params *p, bool f16, shard_group **out);
void shard_group_free(shard_group *g);           /* accepts NULL */

/* One batch on every shard at once; the logits of the rows that ask, all
 * columns, into out [n_out][n_vocab] (as stage_forward on the whole model).
 * The first error of a shard, if any. */
int  shard_group_forward(shard_group *g, const stage_batch *b, float *out, int *n_out);

void shard_group_truncate(shard_group *g, int seq, int from);
const model *shard_group_model(const shard_group *g, int rank);
/* Sums made so far (2 per layer per batch). */
long shard_group_sums(const shard_group *g);

#endif
