/* exports.h - the model files this node lists to its peers, and serves.
 *
 * What a node publishes in its STATE (`models`) and what its weight server
 * (weights.c) answers for are one table, so a peer can pull exactly the
 * files a node lists and nothing else.  A scan looks for NAME.gguf (and
 * split sets NAME-00001-of-0000N.gguf ..., listed as NAME) in the
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

/* What a node serves for one listed model: one file read through the
 * descriptor opened when it was listed, or a split set (NAME-00001-of-
 * 0000N.gguf ..., listed as NAME) read as the one file `racimo join` would
 * write from it, byte for byte (export_src.c).  Reference counted; any
 * thread. */
typedef struct export_src export_src;

/* Opens `path` (a file, or a set by its first part).  RC_EIO,
 * RC_ENOTFOUND (a part missing), gguf_open's codes for a set whose heads
 * do not parse, RC_ENOMEM. */
int export_src_open(const char *path, export_src **out);
export_src *export_src_ref(export_src *s);
void export_src_unref(export_src *s);              /* accepts NULL */

/* The served bytes [off, off + len): 0, or -1 with errno (0: outside the
 * file, or it became shorter). */
int export_src_pread(const export_src *s, void *buf, size_t len, uint64_t off);

/* The served file as fstat would describe it (size: the served bytes;
 * for a set mtime, device and inode combine its parts', see
 * export_ident). */
export_stat export_src_stat(const export_src *s);

/* Bytes before the served file's data section; a head that does not parse
 * is its gguf error, naming `path`. */
int export_src_head(const export_src *s, const char *path, uint64_t *head);

/* The first file's descriptor (owned by s): its attributes. */
int export_src_fd(const export_src *s);

/* Identity of what `path` names now, to see whether a listed source still
 * describes it: its stat, or for a set the parts' together (sizes and
 * mtimes added, inodes mixed).  RC_EIO, RC_ENOTFOUND. */
int export_ident(const char *path, export_stat *out);
export_stat export_src_ident(const export_src *s);

/* A source of listed model `name` (a reference: the caller unrefs it) and
 * its export_src_stat; *path (may be NULL, cap bytes) gets the path it was
 * listed under.  RC_ENOTFOUND (not listed), RC_ESTATE (on this node but
 * the allow-list keeps it private).  Any thread. */
int exports_open(exports *e, const char *name, export_src **src, export_stat *st, char *path,
                 size_t cap);

/* 0 when `name` is a plain model name (1 to EXPORTS_NAME_MAX bytes, no
 * '/', '\\', '..', leading '.' or control characters), else RC_EINVAL with
 * a message. */
#define EXPORTS_NAME_MAX 200
int exports_check_name(const char *name);

#endif
