/* channel.h - a data channel: a second authenticated connection between two
 * nodes, read and written by one thread on each side itself.
 *
 * The cluster link carries everything through the cluster thread: a
 * message a worker sends is queued, sealed and written there, and on the
 * other side read, opened and queued for the worker there, so every
 * message costs four thread wake-ups.  Tensor-parallel shards exchange a
 * part twice per layer and wait for it each time; on a channel the worker
 * seals and writes, and the kernel wakes the other worker straight from
 * its poll.  Same handshake, keys and records as the cluster link
 * (wire.h; docs/cluster-protocol.md §11).
 *
 * A channel is used by one thread at a time (the owner hands it over under
 * its own lock).  Calls block, in poll slices of at most 100 ms between
 * which a caller's abort function is asked whether to give up.
 */
#ifndef RC_CLUSTER_CHANNEL_H
#define RC_CLUSTER_CHANNEL_H

#include "wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cluster_chan cluster_chan;

/* Wraps a connected socket (taken over: made non-blocking, closed by
 * chan_free) whose session is established.  `pending`: bytes already read
 * from the socket past the handshake.  `peer`: the other node's id (hex),
 * for messages.  NULL when out of memory (the fd is then closed). */
cluster_chan *chan_new(int fd, const wire_session *ws, const uint8_t *pending, size_t n,
                       const char *peer);
void chan_free(cluster_chan *ch);            /* accepts NULL */
const char *chan_peer(const cluster_chan *ch);

/* Connects to a node's cluster port at host:port, runs the handshake as
 * `self` with its HELLO marked as a data channel and checks the node proves
 * to be peer_id.  Within timeout_ms.  RC_EUNSUPPORTED for a node of another
 * major version. */
int chan_dial(const char *host, int port, const uint8_t key[WIRE_KEY_BYTES],
              const wire_identity *self, int major, int minor,
              const uint8_t peer_id[WIRE_ID_BYTES], int timeout_ms, cluster_chan **out);

/* Asked between poll slices: true to give up, with a reason in why. */
typedef bool (*chan_abort_fn)(void *ud, char *why, size_t cap);

/* One channel's part of an exchange: a message to send (out_len bytes of
 * type out_type; out NULL for none) and/or one to receive (want_in), whose
 * type and bytes land in in_type/in/in_len (valid until the channel's next
 * exchange). */
typedef struct {
    cluster_chan *ch;
    int out_type;
    const void *out;
    size_t out_len;
    bool want_in;
    int in_type;
    const uint8_t *in;
    size_t in_len;
} chan_io;

/* Sends and receives on n channels at once (all sides may send large
 * messages to each other at the same moment without either blocking the
 * other).  0; RC_EIO when a channel closes or fails, a timeout passes or
 * `ab` says so; RC_EFORMAT for a record that fails authentication; a
 * channel that failed stays failed.  timeout_ms < 0: no limit. */
int chan_exchange(chan_io *io, int n, int timeout_ms, chan_abort_fn ab, void *ud);

/* chan_exchange of one message each way, for set-up. */
int chan_send(cluster_chan *ch, int type, const void *d, size_t n, int timeout_ms);
int chan_recv(cluster_chan *ch, int *type, const uint8_t **d, size_t *n, int timeout_ms);

/* Bytes written to the socket so far (records, headers included). */
uint64_t chan_bytes_out(const cluster_chan *ch);

#endif
