/* shard.h - the model layer's own entry to tensor-parallel cutting
 * (model_load_file_shard in model.h is the public one). */
#ifndef RC_SHARD_H
#define RC_SHARD_H

#include "model.h"

/* Cuts the bound views of a mapped model into shard `rank` of `n_ranks`
 * and sets m->shard (n_ranks == 1: the whole model); recounts
 * m->weight_bytes. */
int model_shard_apply(model *m, int rank, int n_ranks);

/* Memory of `bytes` (aligned to 64) that lives as long as the model: for
 * tensors the model holds as copies rather than views of the mapping.
 * NULL with RC_ENOMEM's detail naming `what`. */
void *model_own(model *m, size_t bytes, const char *what);

/* Replaces every held layer's unsplit attn_kv_b (older deepseek2 files) by
 * owned wk_b and wv_b in the split layout, so that the forward pass knows
 * one form only; the mapped pages of attn_kv_b leave the resident set. */
int model_split_kv_b(model *m);

#endif
