/* digests.h - the content digest of a model file: BLAKE2b-256 of each
 * DIGEST_BLOCK bytes (the last block may be shorter), and a root digest
 * over the file size and those block digests:
 *
 *   root = BLAKE2b-256("racimo-digests-1" | u64 size | u32 block | d[0] | ... | d[n-1])
 *
 * A node that holds a model computes its digests once and caches them in
 * <state_dir>/digests/ keyed by the path, size, mtime, device and inode of
 * the file, so a restart does not read a 400 GB file again.  A node pulling
 * the model checks a peer's block digests against a root it trusts (the
 * placing node's, the first holder's, or the user's), then every block it
 * receives against its digest (weights.c).
 */
#ifndef RC_DIGESTS_H
#define RC_DIGESTS_H

#include "exports.h"

#include <stdint.h>

#define DIGEST_BYTES 32
/* 256 KiB: a layer's or a shard's byte ranges round out to few extra
 * bytes, at 128 bytes of digests per MiB of file */
#define DIGEST_BLOCK (1u << 18)
#define DIGEST_FILE_MAX (1ull << 41)          /* 2 TiB: at most 2^23 blocks, 256 MiB
                                                 of digests */
#define DIGEST_HEX (2 * DIGEST_BYTES + 1)

typedef struct {
    uint64_t size;                 /* bytes of the file */
    uint32_t n;                    /* blocks */
    uint8_t root[DIGEST_BYTES];
    uint8_t (*d)[DIGEST_BYTES];    /* [n] */
} digests;

/* Blocks of a file of `size` bytes into *n.  RC_ELIMIT over DIGEST_FILE_MAX. */
int digests_blocks(uint64_t size, uint32_t *n);

/* Allocates d->d for `size` (d->n set), zeroed.  RC_ELIMIT, RC_ENOMEM. */
int digests_alloc(digests *d, uint64_t size);

/* The root over d->size and d->d. */
void digests_root(const digests *d, uint8_t out[DIGEST_BYTES]);

/* BLAKE2b-256 of one block's bytes. */
void digests_block(const uint8_t *data, size_t len, uint8_t out[DIGEST_BYTES]);

/* The digests of the bytes src serves (st: export_src_stat of it), from
 * the cache in cache_dir (NULL: none) when it describes this very file,
 * else computed (the whole file is read once) and cached.  `path` keys the
 * cache.  RC_EIO, RC_ENOMEM, RC_ELIMIT. */
int digests_of_file(const char *cache_dir, const char *path, const export_src *src,
                    const export_stat *st, digests *out);

/* Caches d as the digests of `path` as st describes it (a pulled copy
 * once complete); failures are logged, not returned. */
void digests_cache_store(const char *cache_dir, const char *path, const export_stat *st,
                         const digests *d);

/* A digests file: header (magic, size, mtime, device, inode of the file it
 * describes, block size, count, root) and the block digests.  Reading
 * checks the root and, when `want` is given, that it describes that file.
 * RC_ENOTFOUND, RC_EFORMAT, RC_EIO, RC_ENOMEM. */
int digests_read(const char *file, const export_stat *want, digests *out);
int digests_write(const char *file, const export_stat *st, const digests *d);

void digests_free(digests *d);          /* accepts a zeroed struct */

void digests_hex(const uint8_t root[DIGEST_BYTES], char out[DIGEST_HEX]);
/* 0, or RC_EINVAL when s is not 64 hex digits. */
int digests_parse(const char *s, uint8_t out[DIGEST_BYTES]);

#endif
