/* weights.h - pulling exactly the byte ranges of a model's layers from a
 * peer, and serving them to peers.
 *
 * A node told to serve layers [first, last) of model NAME that has no
 * NAME.gguf in its models folders asks a node that lists NAME (cluster
 * view) for the file's head (header, metadata, tensor infos) and then for
 * exactly the bytes of the tensors those layers need (model_tensor_needs),
 * in chunks of at most WEIGHTS_CHUNK bytes, each answered with a BLAKE2b-256
 * hash the receiver checks; once a tensor is complete the receiver asks the
 * peer for the hash of the whole tensor, computed from the peer's file, and
 * compares it with the bytes it wrote.  The copy keeps the original layout
 * in a sparse file <models_dir>/NAME.gguf.part; the verified byte ranges go
 * to the manifest NAME.gguf.ranges (model/ranges.h), which model loading
 * honours.  When every byte of the file is verified, the copy is renamed
 * NAME.gguf and the manifest removed.  A later call fetches only what is
 * still missing.  Read-only folders are never written.
 *
 * Serving: a thread of its own (the cluster thread only queues, so reading
 * and hashing never delay heartbeats) answers requests for NAME.gguf files of the
 * models folder and the read-only folders (complete files only, never one
 * with a manifest; resolved paths must stay inside the folders), reading
 * with pread; nothing is loaded whole into memory.
 *
 * The messages (types 0x50-0x55) are specified in docs/cluster-protocol.md,
 * "Weight transfer".
 */
#ifndef RC_WEIGHTS_H
#define RC_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

struct cluster;

#define WEIGHTS_CHUNK   (1u << 20)   /* most data bytes per chunk */
#define WEIGHTS_WINDOW  8            /* chunks in flight per transfer */
#define WEIGHTS_NAME_MAX 200         /* bytes of a model name */

typedef struct weights weights;

/* Registers the message handlers of types 0x50-0x57 on `c`, so it must be
 * called before cluster_start.  models_dir: where pulled copies are written
 * (created if missing); ro_dirs: colon-separated read-only folders (NULL or
 * ""), served but never written.  Both strings are copied.  RC_ENOMEM, or
 * cluster_add_handler's errors. */
int weights_new(struct cluster *c, const char *models_dir, const char *ro_dirs, weights **out);

/* Stops the thread that serves peers (it sends through the cluster, so
 * call this before cluster_free); requests arriving later are dropped. */
void weights_stop(weights *w);                   /* accepts NULL */

/* Frees it; the cluster must be stopped first (cluster_free), since its
 * thread calls into this object.  Accepts NULL. */
void weights_free(weights *w);

/* Progress of a pull, called on the caller's thread after each chunk:
 * bytes received so far, bytes this call fetches in all, mean rate. */
typedef void (*weights_progress_fn)(void *ud, uint64_t done, uint64_t total, double bytes_per_s);

/* Makes layers [first, last) (last = -1: all; first == last: only the
 * file's head, for a node that needs the tokenizer and sizes) of model_name loadable
 * locally and writes the path to load them from into path_out: an existing
 * NAME.gguf in the models folder or a read-only folder, else the pulled
 * copy (NAME.gguf when complete, NAME.gguf.part with its manifest when not).
 * peer_id: the node to pull from, or NULL for any node up that lists the
 * model.  Blocking; call it from a thread other than the cluster's; calls
 * are serialised.  Returns 0, or
 *   RC_EINVAL    a model name with '/', '..', a leading '.' or control
 *                characters, or a bad layer range,
 *   RC_ENOTFOUND no node up lists the model (or peer_id does not),
 *   RC_EFORMAT   a chunk or a tensor failed its hash check, or the peer's
 *                head does not parse,
 *   RC_EIO       the peer went down or stopped answering, or a local write
 *                failed,
 * with a detail naming the model, the node and the byte range.  What was
 * verified before a failure is kept for the next call. */
int weights_ensure(weights *w, const char *model_name, int first, int last, const char *peer_id,
                   weights_progress_fn progress, void *ud, char *path_out, size_t cap);

/* The same for shard `rank` of `n_ranks` (tensor parallel): only the
 * byte ranges that shard reads (model_shard_ranges: its rows of the
 * row-cut tensors, the column-cut ones whole).  n_ranks 1 is
 * weights_ensure. */
int weights_ensure_shard(weights *w, const char *model_name, int first, int last, int rank,
                         int n_ranks, const char *peer_id, weights_progress_fn progress,
                         void *ud, char *path_out, size_t cap);

/* Tells the requester that the link to node_id is lost: requests waiting on
 * it fail at once with RC_EIO.  The owner wires it from the cluster's
 * down handler (cluster_set_down_handler has a single slot, which the owner
 * shares among its users).  Any thread. */
void weights_on_node_down(weights *w, const char *node_id);

/* For tests: corrupt the data of the nth chunk this node receives from now
 * on (1 = the next; 0 = never), as a damaged transfer would; and, when
 * `mute` is set, let this node ignore requests it should serve (a peer that
 * stops answering).  Reply timeout in ms (default 30000). */
void weights_test_hooks(weights *w, uint64_t tamper_nth, int mute, int reply_timeout_ms);

#endif
