/* weights.h - pulling exactly the byte ranges of a model's layers from
 * peers, verified against a content digest the puller trusts, and serving
 * them to peers.
 *
 * A node told to serve layers [first, last) of model NAME that has no
 * NAME.gguf in its models folders pulls the blocks of the file those layers
 * need from a node that lists NAME (cluster view).  What it checks them
 * against never comes from the node that sends them: the model's root
 * digest (digests.h) is given by the caller (the head of a pipeline sends
 * its own with the set-up), or pinned by the user (weights_pin), or else
 * taken from the first node this node pulled NAME from and kept for the
 * life of the process.  The puller fetches the block digests from a holder,
 * checks them against that root, then checks every block it receives
 * against its digest before writing it.  A holder whose digests or bytes do
 * not match is logged (id and name), left out, and the pull continues from
 * another holder; sizes and counts a peer sends are bounded before anything
 * is allocated and the copy is sized only to a size the root vouches for.
 * The blocks come from up to 4 holders at once, in pieces of 16 MiB (a
 * node that completed its copy during the pull becomes one), so copying a
 * model to many nodes spreads over the nodes that have it.
 *
 * The copy keeps the original layout in a sparse file
 * <models_dir>/NAME.gguf.part; the verified byte ranges go to the manifest
 * NAME.gguf.ranges (model/ranges.h), which model loading honours, and the
 * block digests to NAME.gguf.part.digests.  When every byte of the file is
 * verified, the copy is renamed NAME.gguf.  A later call fetches only what
 * is still missing.  Read-only folders are never written.
 *
 * Serving: a thread of its own (the cluster thread only queues, so reading
 * and hashing never delay heartbeats) answers for exactly the files the
 * node lists (exports.h: opened once when listed, --export honoured),
 * reading with pread through that descriptor; nothing is loaded whole into
 * memory.  Block digests are computed once per file and cached in
 * <state_dir>/digests/.
 *
 * The messages (types 0x50-0x55) are specified in docs/cluster-protocol.md,
 * "Weight transfer".
 */
#ifndef RC_WEIGHTS_H
#define RC_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digests.h"

struct cluster;

#define WEIGHTS_CHUNK    DIGEST_BLOCK  /* bytes per read: one block */
#define WEIGHTS_WINDOW   8             /* requests in flight per transfer */
#define WEIGHTS_NAME_MAX EXPORTS_NAME_MAX
#define WEIGHTS_HEAD_MAX (1ull << 30)  /* most bytes of a file's head a peer may announce */
#define WEIGHTS_PAGE     16384         /* most block digests per message (512 KiB) */

typedef struct weights weights;

/* Registers the message handlers of types 0x50-0x57 on `c`, so it must be
 * called before cluster_start.  models_dir: where pulled copies are written
 * (created if missing); ro_dirs: colon-separated read-only folders (NULL or
 * ""), used but never written.  Both strings are copied.  RC_ENOMEM, or
 * cluster_add_handler's errors. */
int weights_new(struct cluster *c, const char *models_dir, const char *ro_dirs, weights **out);

/* Stops the thread that serves peers (it sends through the cluster, so
 * call this before cluster_free); requests arriving later are dropped. */
void weights_stop(weights *w);                   /* accepts NULL */

/* Frees it; the cluster must be stopped first (cluster_free), since its
 * thread calls into this object.  Accepts NULL. */
void weights_free(weights *w);

/* Progress of a pull, called on the caller's thread after each block:
 * bytes received so far, bytes this call fetches in all, mean rate. */
typedef void (*weights_progress_fn)(void *ud, uint64_t done, uint64_t total, double bytes_per_s);

/* Makes layers [first, last) (last = -1: all; first == last: only the
 * file's head, for a node that needs the tokenizer and sizes) of model_name
 * loadable locally and writes the path to load them from into path_out: an
 * existing NAME.gguf in the models folder or a read-only folder, else the
 * pulled copy (NAME.gguf when complete, NAME.gguf.part with its manifest
 * when not).  root: the model's root digest to verify against (NULL: the
 * pinned one, else the first holder's, which is pinned).  peer_id: the
 * node to pull from, or NULL for any node up that lists the model (others
 * are tried when one fails).  Blocking; call it from a thread other than
 * the cluster's; calls are serialised.  Returns 0, or
 *   RC_EINVAL    a model name with '/', '..', a leading '.' or control
 *                characters, or a bad layer range,
 *   RC_ENOTFOUND no node up lists the model (or peer_id does not),
 *   RC_EFORMAT   every holder sent digests or bytes that do not match the
 *                root, or a head that does not parse,
 *   RC_EIO       the holders went down or stopped answering, or a local
 *                write failed,
 *   RC_ELIMIT    the models folder is full (ENOSPC, EDQUOT),
 * with a detail naming the model, the node and the byte range.  What was
 * verified before a failure is kept for the next call. */
int weights_ensure(weights *w, const char *model_name, int first, int last,
                   const uint8_t *root, const char *peer_id, weights_progress_fn progress,
                   void *ud, char *path_out, size_t cap);

/* The same for shard `rank` of `n_ranks` (tensor parallel): only the
 * blocks that hold the byte ranges that shard reads (model_shard_ranges:
 * its rows of the row-cut tensors, the column-cut ones whole).  n_ranks 1
 * is weights_ensure. */
int weights_ensure_shard(weights *w, const char *model_name, int first, int last, int rank,
                         int n_ranks, const uint8_t *root, const char *peer_id,
                         weights_progress_fn progress, void *ud, char *path_out, size_t cap);

/* The root digest of model `name` as this node knows it: of its complete
 * local file (computed once, cached), else the one pinned (by the user or
 * by a pull).  RC_ENOTFOUND, RC_EIO.  Blocking (the first call for a large
 * file reads it whole); any thread but the cluster's. */
int weights_model_root(weights *w, const char *name, uint8_t root[DIGEST_BYTES]);

/* Pins the root digest pulls of `name` are checked against (the user's:
 * racimo serve --model-digest NAME=HEX).  RC_EINVAL, RC_ELIMIT. */
int weights_pin(weights *w, const char *name, const uint8_t root[DIGEST_BYTES]);

/* Tells the requester that the link to node_id is lost: requests waiting on
 * it fail at once with RC_EIO.  The owner wires it from the cluster's
 * down handler (cluster_set_down_handler has a single slot, which the owner
 * shares among its users).  Any thread. */
void weights_on_node_down(weights *w, const char *node_id);

/* Deletes what an unfinished pull of `name` left in the models folder
 * (NAME.gguf.part, its manifest and block digests), for a copy given up
 * for want of room.  A complete NAME.gguf is kept.  RC_EINVAL (not a plain
 * name), RC_EIO.  Waits for a pull running in this node. */
int weights_discard(weights *w, const char *name);

/* Block bytes this node has sent to peers since it started.  Any thread. */
uint64_t weights_served_bytes(weights *w);

/* For tests: corrupt the data of the nth block this node receives from now
 * on (1 = the next; 0 = never), as a damaged transfer would; and, when
 * `mute` is set, let this node ignore requests it should serve (a peer that
 * stops answering).  Reply timeout in ms (default 30000). */
void weights_test_hooks(weights *w, uint64_t tamper_nth, int mute, int reply_timeout_ms);

/* Tests only (racimo-hooks: RACIMO_TEST_ALTER_WEIGHTS): flip a byte of
 * every block this node serves, as a member serving poisoned weights
 * would.  The release racimo never calls it. */
void weights_test_alter(weights *w, bool on);

#endif
