/* exports.h - the model files this node lists to its peers, and serves.
 *
 * What a node publishes in its STATE (`models`) and what its weight server
 * (weights.c) answers for are one table, so a peer can pull exactly the
 * files a node lists and nothing else.  A scan looks for NAME.gguf in the
 * models folder and then the read-only folders (the first folder holding a
 * name wins), skips incomplete copies (a NAME.gguf.ranges manifest beside
 * them) and names the allow-list leaves out, and opens each file once,
 * following a symlink the owner put there at that moment; the file is
 * checked with fstat (a regular file) and served through that descriptor
 * until a later scan sees another file (device, inode, size or mtime) under
 * the name.  Nothing a peer sends ever becomes a path.
 */
#ifndef RC_EXPORTS_H
#define RC_EXPORTS_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct exports exports;

/* The fields of a listed file, as fstat saw them when it was opened. */
typedef struct {
    uint64_t size;
    int64_t mtime_ns;
    uint64_t dev, ino;
} export_stat;

struct stat;
export_stat exports_stat(const struct stat *st);

/* allow: comma-separated model names (NULL or "": every model); the
 * strings are copied.  RC_ENOMEM, RC_EINVAL (a name in `allow` that is not
 * a plain file name). */
int exports_new(const char *models_dir, const char *ro_dirs, const char *allow, exports **out);
void exports_free(exports *e);                  /* accepts NULL */

/* Scans the folders again; returns the list to publish,
 * [{"name","size_bytes","type","sha256"}] (a new reference, NULL when out of
 * memory; type: the weight type holding the most bytes, sha256: the one
 * `racimo pull` verified, each left out when not known).
 * Logs once per name a model the allow-list keeps private.  Any thread. */
json_t *exports_scan(exports *e);

/* A descriptor of listed model `name` (a dup: the caller closes it) and
 * what fstat said of it when listed; *path (may be NULL, cap bytes) gets
 * the path it was listed under.  RC_ENOTFOUND (not listed), RC_ESTATE (on
 * this node but the allow-list keeps it private), RC_EIO.  Any thread. */
int exports_open(exports *e, const char *name, int *fd, export_stat *st, char *path, size_t cap);

/* 0 when `name` is a plain model name (1 to EXPORTS_NAME_MAX bytes, no
 * '/', '\\', '..', leading '.' or control characters), else RC_EINVAL with
 * a message. */
#define EXPORTS_NAME_MAX 200
int exports_check_name(const char *name);

#endif
