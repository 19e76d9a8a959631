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

/* One file as gguf_open (meta false) or gguf_open_meta (meta true) would
 * open it, split.* keys left unread (gguf_set.c builds sets of these). */
int gguf__open_one(const char *path, bool meta, gguf_file **out);

/* A split part's split.no, split.count and split.tensors.count;
 * RC_EFORMAT naming the part when one is absent or not an integer. */
int gguf__split_keys(const gguf_file *f, uint32_t *no, uint32_t *count, uint32_t *tensors);

/* Builds f's tensor index; *a and *b are two tensors with the same name,
 * or both f->n_tensors.  RC_ENOMEM. */
int gguf__index_tensors(gguf_file *f, uint64_t *a, uint64_t *b);

/* Bytes gguf_open_meta maps first (it doubles them while the head needs
 * more); tests lower it to make the regrowth happen on small files. */
extern size_t gguf__meta_initial_bytes;

#endif
