/* tensor.h - a view of a weight matrix (or vector) stored in some tensor
 * type, usually pointing into a read-only model mapping.
 *
 * Dimensions follow GGUF: ne[0] is the contiguous (input) dimension, ne[1]
 * the number of rows (outputs), ne[2] the expert index for stacked experts.
 * A matrix W with ne = {n_in, n_out} computes y[o] = W[o,:] . x.
 */
#ifndef RC_TENSOR_H
#define RC_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const void *data;      /* NULL when the tensor is absent */
    int         type;      /* enum tensor_type */
    int         n_dims;
    int64_t     ne[4];
    size_t      row_bytes; /* bytes of one row of ne[0] elements */
    const char *name;      /* for messages; owned by the model */
} tensor;

/* The 2-D slice `i2` of a 3-D tensor (one expert's matrix). */
static inline tensor tensor_slice2(const tensor *t, int64_t i2)
{
    tensor s = *t;
    s.data = (const uint8_t *)t->data + (size_t)i2 * (size_t)t->ne[1] * t->row_bytes;
    s.n_dims = 2;
    s.ne[2] = 1;
    return s;
}

#endif
