/* repack.h - the model layer's load-time repacking of Q4_0, Q4_K, Q6_K and
 * Q8_0 matrices into rows interleaved by 8 (tensor/repack.h,
 * tensor/q4k_r8.h, tensor/q6k_r8.h, tensor/q8_0_r8.h); model_load_file_shard
 * calls it. */
#ifndef RC_MODEL_REPACK_H
#define RC_MODEL_REPACK_H

#include <stdbool.h>

#include "model.h"

/* Whether loads repack: the active kernels compute with one of the layouts and
 * the environment does not say RACIMO_REPACK=0. */
bool model_repack_wanted(void);

/* Repacks every held matrix of those types whose layout the kernels have
 * (the layers' and the output, never the token embedding itself) whose rows per 2-D slice are a multiple of 8; counts
 * them in m->n_repacked and m->repacked_bytes.  Nothing when
 * !model_repack_wanted().  RC_ENOMEM. */
int model_repack(model *m);

/* Reads one byte of every page of the file's tensors that the model reads
 * from the mapping, so later reads do not fault; the file bytes of the
 * repacked tensors are skipped (their copies are what runs: touching them
 * would hold the model twice in memory until released).  `progress` (may
 * be NULL) is called with 0..1. */
void model_prefault(const model *m, void (*progress)(void *ctx, double done), void *ctx);

#endif
