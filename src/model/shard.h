/* shard.h - the model layer's own entry to tensor-parallel cutting
 * (model_load_file_shard in model.h is the public one). */
#ifndef RC_SHARD_H
#define RC_SHARD_H

#include "model.h"

/* Cuts the bound views of a mapped model into shard `rank` of `n_ranks`
 * and sets m->shard (n_ranks == 1: the whole model); recounts
 * m->weight_bytes. */
int model_shard_apply(model *m, int rank, int n_ranks);

#endif
