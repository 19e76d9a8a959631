/* ref_forward.h - a plain float64 forward pass, the test oracle for the
 * optimised stage: written straight from the model equations, one sequence,
 * no KV cache, no threads, weights decoded with the reference (scalar)
 * tensor table. */
#ifndef RC_REF_FORWARD_H
#define RC_REF_FORWARD_H

#include <stdint.h>
#include "model/model.h"

/* Logits [n][n_vocab] for tokens at positions 0..n-1 of a whole model
 * (first == 0, last == n_layer).  Returns 0 or RC_ENOMEM. */
int ref_forward(const model *m, const int32_t *tokens, int n, double *logits);

/* The same pass's states after the output norm, [n][n_embd] (what an
 * embedding model pools). */
int ref_hidden(const model *m, const int32_t *tokens, int n, double *hidden);

#endif
