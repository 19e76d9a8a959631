/* gguf_internal.h - what gguf_read.c and gguf_write.c share; not for other
 * modules (include gguf.h instead).
 */
#ifndef RC_GGUF_INTERNAL_H
#define RC_GGUF_INTERNAL_H

#include "gguf.h"

/* Encoded bytes of a scalar value type; 0 for STRING, ARRAY and numbers
 * outside the table. */
unsigned gguf__scalar_bytes(uint32_t vtype);

/* Results of gguf__tensor_bytes. */
enum {
    GGUF__SIZE_OK = 0,
    GGUF__SIZE_UNKNOWN_TYPE,   /* not a type number with known block layout */
    GGUF__SIZE_MEMORY_TYPE,    /* one of racimo's in-memory layouts (>= TT_GGUF_COUNT) */
    GGUF__SIZE_BLOCK,          /* ne[0] not a multiple of the block size */
    GGUF__SIZE_OVERFLOW        /* element count or byte size overflows */
};

/* Bytes of a tensor of `type` with dims ne[0..3] (each >= 0, unused ones 1):
 * the element count must fit int64 and the byte size uint64.  Row bytes come
 * from tensor_row_bytes, called only once they are known not to overflow. */
int gguf__tensor_bytes(uint32_t type, const int64_t ne[GGUF_MAX_DIMS], uint64_t *bytes);

/* Bytes gguf_open_meta maps first (it doubles them while the head needs
 * more); tests lower it to make the regrowth happen on small files. */
extern size_t gguf__meta_initial_bytes;

#endif
