/* ranges.h - the manifest of a partial model file: which byte ranges of a
 * sparse copy of a GGUF file hold verified bytes.
 *
 * A node that pulled only some layers of a model from a peer keeps a sparse
 * file with the original layout (NAME.gguf.part) and, next to it, the
 * manifest NAME.gguf.ranges (see model_ranges_path).  Model loading refuses
 * to bind a tensor whose bytes lie outside the verified ranges, so holes
 * (which read as zeros) are never computed with.
 *
 * File format (text, one item per line):
 *   racimo-ranges 1
 *   size <file size in bytes>
 *   <start> <end>          byte range [start, end), ascending, disjoint
 * Written to a temporary file and renamed into place.
 */
#ifndef RC_MODEL_RANGES_H
#define RC_MODEL_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MODEL_RANGES_MAX 65536   /* ranges in a manifest (a model has fewer tensors) */

typedef struct {
    uint64_t file_bytes;          /* size of the complete file */
    uint64_t (*r)[2];             /* [n] {start, end}, sorted, merged */
    size_t n, cap;
} model_ranges;

/* The manifest path of a model path: a trailing ".part" is dropped and
 * ".ranges" appended ("m.gguf.part" and "m.gguf" both give "m.gguf.ranges").
 * RC_ELIMIT when it does not fit. */
int model_ranges_path(const char *model_path, char *out, size_t cap);

/* Reads a manifest.  RC_ENOTFOUND when the file does not exist, RC_EFORMAT
 * (the detail names the file and line) when it is malformed, RC_EIO. */
int model_ranges_read(const char *path, model_ranges *out);

/* Writes atomically (path.tmp renamed).  RC_EIO with the path. */
int model_ranges_write(const char *path, const model_ranges *r);

/* Adds [start, end), merging with neighbours.  RC_ENOMEM, RC_ELIMIT. */
int model_ranges_add(model_ranges *r, uint64_t start, uint64_t end);

/* Whether [start, end) lies inside one verified range (empty: true). */
bool model_ranges_covers(const model_ranges *r, uint64_t start, uint64_t end);

void model_ranges_free(model_ranges *r);   /* accepts a zeroed struct */

#endif
