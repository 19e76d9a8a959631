/* kv_types.h - the element types a KV cache may hold: f32, f16 (the
 * default, as llama.cpp's) and q8_0.
 *
 * A cache row is the n values of one head at one position.  f32 and f16
 * rows are n elements; a q8_0 row is ceil(n / 32) Q8_0 blocks (32 int8
 * values and an f16 scale, the layout of GGUF's Q8_0), the last block
 * zero-padded when n is not a multiple of 32 (the latent rows of small
 * DeepSeek-style models, 80 wide): the padding costs at most 31 values a
 * row, where refusing would leave those models without a compact cache.
 * Readers take the first n values of a row and never the padding.
 *
 * This lives in tensor/ because the cache (infer/), attention (tensor/)
 * and the byte counts of placement (model/, cluster/) all need it.
 */
#ifndef RC_KV_TYPES_H
#define RC_KV_TYPES_H

#include <stdbool.h>
#include <stddef.h>

#include "tensor/types.h"

#define KV_TYPE_DEFAULT TT_F16

/* The names a user gives (--cache-type), for messages: "f32, f16 or q8_0". */
#define KV_TYPE_NAMES "f32, f16 or q8_0"

/* TT_F32, TT_F16 or TT_Q8_0. */
bool kv_type_ok(int type);

/* "f32", "f16" or "q8_0" (also upper case) into *type; -1 for anything else. */
int kv_type_parse(const char *name, int *type);

/* "f32", "f16", "q8_0", or "?" for a type that is not a cache type. */
const char *kv_type_name(int type);

/* Bytes of a row of n values (see above); 0 for a type that is not a cache
 * type. */
size_t kv_row_bytes(int type, size_t n);

/* Writes n floats as one row of the type at dst (kv_row_bytes(type, n)
 * bytes), q8_0 rounded as GGUF's Q8_0 quantiser rounds. */
void kv_row_from_float(int type, const float *src, void *dst, int n);

#endif
