/* repack.h - the model layer's load-time repacking of Q4_0 matrices into
 * TT_Q4_0_R8 (tensor/repack.h); model_load_file_shard calls it. */
#ifndef RC_MODEL_REPACK_H
#define RC_MODEL_REPACK_H

#include <stdbool.h>

#include "model.h"

/* Whether loads repack: the active kernels compute with TT_Q4_0_R8 and
 * the environment does not say RACIMO_REPACK=0. */
bool model_repack_wanted(void);

/* Repacks every held Q4_0 matrix (the layers' and the output, never the
 * token embedding) whose rows per 2-D slice are a multiple of 8; counts
 * them in m->n_repacked and m->repacked_bytes.  Nothing when
 * !model_repack_wanted().  RC_ENOMEM. */
int model_repack(model *m);

/* Lets the mapped pages of the repacked tensors' file bytes leave the
 * resident set again, after something read the whole mapping (a prefault):
 * the model computes with its copies only. */
void model_repack_release(const model *m);

#endif
