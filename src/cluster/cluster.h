/* cluster.h - a cluster of racimo nodes that forms itself: discovery
 * (DNS-SD over multicast DNS, static peers, gossip), mutually authenticated
 * and encrypted links keyed by the cluster key, membership with heartbeats,
 * link probes, and one shared view (nodes, links, leader).
 *
 * A cluster runs on its own thread with its own libevent loop, apart from
 * the HTTP server.  The calls below are thread safe unless noted.  The
 * protocol is specified in docs/cluster-protocol.md.
 *
 * State directory (--state-dir, $RACIMO_HOME, default ~/.racimo), mode 0700,
 * owned by the user running the node and writable by nobody else (checked):
 *   cluster.key   the join token (mode 0600) - whoever reads it can join
 *   node.key      this node's secret X25519 key (mode 0600): its identity
 *   node.id       this node's id (32 hex digits), derived from node.key's
 *                 public key; kept for scripts and people, never trusted
 *   bench.json    the cached self-benchmark, keyed by CPU, cores and memory
 *   peers.json    nodes met before, redialled after a restart
 *   revoked.json  the nodes removed from the cluster (mode 0600)
 *   models/       the default models folder
 */
#ifndef RC_CLUSTER_H
#define RC_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define CLUSTER_DEFAULT_PORT 7719

struct cluster;

typedef struct {
    const char *state_dir;        /* NULL: $RACIMO_HOME or ~/.racimo */
    const char *join_token;       /* NULL: $RACIMO_JOIN_TOKEN, else the stored key, else a
                                     new key is made */
    const char *listen_host;      /* address the cluster port binds (default 0.0.0.0) */
    int port;                     /* cluster TCP port (default CLUSTER_DEFAULT_PORT; 0 any);
                                     when it is the default and busy, any free port */
    bool port_given;              /* the port was asked for: busy is an error */
    const char *const *peers;     /* static peers "host:port" (or "host") */
    int n_peers;
    const char *name;             /* NULL: the host name */
    const char *advertise_host;   /* IPv4 address published to peers; NULL: the listen
                                     address if specific, else every interface's */
    bool no_discovery;            /* no multicast DNS (also when listening on loopback) */
    bool swim;                    /* SWIM membership over UDP (membership.c) decides up/down,
                                     leader and quorum, and links are kept only with
                                     neighbours and on demand (docs/cluster-protocol.md
                                     section 14) instead of a full mesh; false here,
                                     racimo serve's default unless --mesh */
    int swim_neighbours;          /* with swim: long-lived links to this many members next
                                     to this node's id (half each side); default 8 */
    int link_idle_ms;             /* with swim: a link opened on demand closes after this
                                     long unused; default 60000 */
    int measure_max_age_ms;       /* a link measure (RTT, bandwidth) older than this is
                                     taken again when placement asks for it
                                     (cluster_measure_links); default 300000 */
    int heartbeat_ms;             /* default 500 */
    int down_after_ms;            /* default 3000: silent this long = down */
    int probe_ms;                 /* default 10000: bandwidth probe interval per link */
    int forget_after_ms;          /* default 3600000: a node down this long is dropped */
    int key_confirm_ms;           /* default 30000: a key rotation waits this long for the
                                     members' confirmations before retiring the old key */
    int http_port;                /* this node's API port, published (0: none) */
    const char *models_dir;       /* NULL: $RACIMO_MODELS_DIR, else <state_dir>/models */
    const char *ro_dirs;          /* NULL: $RACIMO_MODELS_READ_ONLY_DIRS */
    const char *exports;          /* comma-separated models peers may pull (racimo serve
                                     --export); NULL: every model of the folders */
    int bench;                    /* 1 (default): measure bandwidth and matmul once and cache;
                                     0: skip (tests) */
    uint64_t max_memory;          /* most bytes this node offers to placement, published
                                     as hardware.mem_offer = min(mem_free, this); 0: all
                                     free memory (racimo serve --max-memory) */
    int proto_major, proto_minor; /* 0: WIRE_PROTO_*; tests set others (racimo-hooks:
                                     $RACIMO_TEST_PROTOCOL "M.m") */
    int test_fake_slots;          /* tests only (racimo-hooks: $RACIMO_TEST_FAKE_SLOTS): > 0
                                     publishes this many slots, all free, for every model
                                     served, as a lying member would */
    bool test_claim_id_set;       /* tests only (racimo-hooks: $RACIMO_TEST_CLAIM_ID): */
    uint8_t test_claim_id[16];    /* this node's HELLOs claim this node id, as a lying
                                     member's would */
} cluster_config;

void cluster_config_default(cluster_config *c);

/* Loads or creates the state directory, the keys and the node id; the
 * config's strings are copied (none needs to outlive the call).  *created
 * (may be NULL) tells whether a new cluster key was made.  Returns 0 or a
 * negative code with rc_errmsg() (bad token, unwritable directory...). */
int cluster_new(const cluster_config *cfg, struct cluster **out, bool *created);

/* Binds the cluster port and the mDNS socket and starts the thread.
 * RC_EIO when the port is taken (and was given), etc. */
int cluster_start(struct cluster *c);

/* The cluster view as JSON (a new reference):
 *   {"self": id, "leader": id, "quorum": bool, "members": n, "members_up": n,
 *    "protocol": "2.2", "fingerprint": hex,
 *    "nodes": [{"id","name","addresses":[...],"cluster_port","http_port",
 *               "state":"up"|"down","self":bool,"down_for_ms":n|null,
 *               "version","protocol","hardware":{"cores","threads","simd","cpu",
 *               "mem_total","mem_free","mem_bandwidth","matmul_gflops"},
 *               "power":{...} or null, "instances":[...] (cluster_set_published),
 *               "models":[{"name","size_bytes"}] (what it serves to peers,
 *               exports.h),"serving":[names],
 *               "serving_free":{name: free slots},
 *               "serving_slots":{name: slots}}...],
 *    "links": [{"from","to","rtt_ms","bandwidth_mbps","age_ms" (how old the measure was
 *               when its node reported it; with SWIM also measures of links since closed,
 *               kept up to measure_max_age_ms),"linked" (a link is open now)}...],
 *    "removed": bool (this node was removed from the cluster),
 *    "revoked": [{"id","by","at" (unix s)}...],
 *    "key_rotation": {"epoch", "in_progress", "old_key_in_use",
 *                     "waiting_for" (in progress) | "not_confirmed": [ids]}}
 * Only members (nodes met, or vouched for by one) are listed; links only
 * between nodes up.  NULL only when out of memory. */
json_t *cluster_snapshot(struct cluster *c);

/* Measures this node's links to the nodes `ids` (hex, n of them) whose
 * measure (RTT, and bandwidth unless probes are off) is missing or older
 * than measure_max_age_ms: with SWIM it opens a link on demand to each
 * that has none (closed again once idle; the measure stays cached), on an
 * open link it takes a bandwidth probe now.  Waits up to wait_ms for them
 * (never on the cluster thread).  Self, unknown or down ids are skipped.
 * Returns how many of the ids had no fresh measure when called (0: the
 * view already had them all). */
int cluster_measure_links(struct cluster *c, const char *const *ids, int n, int wait_ms);

/* The join token (racimo1-...); valid until cluster_free; a key rotation
 * rewrites it (read it again once cluster_snapshot's key_rotation is done). */
const char *cluster_join_token(const struct cluster *c);

/* This node's id (32 hex digits) and the cluster port bound (after start). */
const char *cluster_self_id(const struct cluster *c);
int cluster_port(const struct cluster *c);
/* How long a silent node takes to count as down (cluster_config). */
int cluster_down_after_ms(const struct cluster *c);

/* The API port published, when known only after cluster_new (port 0).
 * Before cluster_start. */
void cluster_set_http_port(struct cluster *c, int port);

/* What this node serves (model names) and, when free_slots is not NULL, how
 * many more requests each could start at once (free sequence slots, not
 * counting those queued) out of how many (slots: its sequence slots, may be
 * NULL), published to the others.  In the view (cluster_snapshot) another
 * node's free slots are at most its slots, and those at most
 * CLUSTER_SLOTS_MAX: a member that claims more gets no more requests. */
#define CLUSTER_SLOTS_MAX 256     /* racimo serve --parallel's bound */
void cluster_set_serving(struct cluster *c, const char *const *names, const int *free_slots,
                         const int *slots, int n);

/* Publishes `value` (copied; NULL: removes it) under `key` of this node's
 * STATE, shown in the view's record of this node: "power" (this node's
 * power and prices: {"watts" (W, null: unknown), "source" ("configured",
 * "rapl", "unknown"), "price_kwh" (null: not set), "hw_per_hour"}) and
 * "instances" (the instances this node heads: model, plan, load, tokens/s,
 * cost).  A change of `stable` (the part others must learn at once; NULL:
 * all of value) sends the STATE now; any other change rides on the STATE
 * every node sends every 2 s, so figures that move all the time do not
 * flood the links.  A key the record has already is never replaced. */
void cluster_set_published(struct cluster *c, const char *key, const json_t *value,
                           const json_t *stable);

/* Whether this node's side sees a strict majority of the known membership
 * (the partition rule: only such a side may place or restart instances). */
bool cluster_has_quorum(struct cluster *c);

/* "ID8 (name)" of a node of the view, for messages (the name filtered to
 * [A-Za-z0-9._-]); "ID8" when it has none. */
void cluster_node_label(struct cluster *c, const char *id, char *out, size_t cap);

/* How many times a node of the view has come up (a join, a return): what
 * failed to place may fit now when it moves. */
uint64_t cluster_came_up(struct cluster *c);

/* ---- for the data plane (pipeline inference) ---- */

/* Called on the cluster thread with each complete message of a data-plane
 * type (0x40-0x7f) from an authenticated peer.  `data` is valid during the
 * call only. */
typedef void (*cluster_msg_fn)(void *ud, const char *from_id, int type,
                               const uint8_t *data, size_t len);
/* Registers the handler of the types [type_lo, type_hi] (before
 * cluster_start).  Ranges in use: 0x40-0x4f pipeline stages, 0x50-0x57
 * weight transfer, 0x58-0x5f API requests forwarded between nodes, 0x60 model
 * copies (api/copy.c).  RC_ELIMIT
 * past CLUSTER_MAX_HANDLERS, RC_EINVAL for a range outside 0x40-0x7f or one
 * that overlaps another. */
#define CLUSTER_MAX_HANDLERS 8
int cluster_add_handler(struct cluster *c, int type_lo, int type_hi, cluster_msg_fn fn, void *ud);

/* Called on the cluster thread when the link to a node is lost (the node may
 * still come back), so that data-plane users can fail what waits on it.
 * Each handler added (before cluster_start) is called, in order;
 * RC_ELIMIT past CLUSTER_MAX_HANDLERS. */
typedef void (*cluster_down_fn)(void *ud, const char *node_id);
int cluster_add_down_handler(struct cluster *c, cluster_down_fn fn, void *ud);

/* Data channels (channel.h): a second connection to a node, for one thread
 * on each side to exchange messages without the cluster thread.
 *
 * cluster_channel_open dials the node's cluster port from the calling
 * thread (blocking, within timeout_ms), sends `first` as the channel's first
 * message (a data-plane type) and waits until the other side takes it.
 * There the cluster thread calls the channel handler with that message and
 * the channel: the handler returns 0 having taken the channel (and
 * confirmed it with cluster_channel_confirm before any other thread uses
 * it), or an error to refuse it (the channel is then closed). */
typedef struct cluster_chan cluster_chan;
typedef int (*cluster_chan_fn)(void *ud, const char *from_id, int type, const uint8_t *data,
                               size_t len, cluster_chan *ch);
void cluster_set_channel_handler(struct cluster *c, cluster_chan_fn fn, void *ud);
int cluster_channel_open(struct cluster *c, const char *node_id, int type, const void *first,
                         size_t len, int timeout_ms, cluster_chan **out);
int cluster_channel_confirm(cluster_chan *ch);

/* Queues a message of any size up to WIRE_MSG_MAX for a peer (sent in
 * frames of at most 1 MiB); returns 0, RC_ENOTFOUND when the node has no
 * open link, RC_ELIMIT, RC_ENOMEM.  Any thread. */
int cluster_send(struct cluster *c, const char *to_id, int type, const void *data, size_t len);

/* Stops the thread (telling peers and the network goodbye) and frees
 * everything.  Accepts NULL and a cluster never started. */
void cluster_free(struct cluster *c);

/* The "hardware" object this machine would publish as a node (without a
 * cluster): cores, memory, mem_offer under max_memory (0: none), and the
 * self-benchmark cached in the state directory (dir as cluster_state_dir),
 * measured and cached first when `bench` and absent.  NULL when out of
 * memory.  For `racimo plan` with no cluster to ask. */
json_t *cluster_local_hardware(const char *state_dir, uint64_t max_memory, bool bench);

/* The local file of model `name` (NAME.gguf, or the first part of a split
 * set NAME-00001-of-0000N.gguf, in the models folder, then in the
 * read-only folders) into out.  RC_ENOTFOUND when this node has none,
 * RC_EINVAL for a name that is not a plain file name. */
int cluster_model_path(const struct cluster *c, const char *name, char *out, size_t cap);

/* The state directory in use (valid until cluster_free). */
const char *cluster_state_path(const struct cluster *c);

/* The model files this node lists and serves to peers (exports.h; valid
 * until cluster_free). */
struct exports;
struct exports *cluster_exports(const struct cluster *c);

/* Asks the cluster thread to look at the model folders at its next tick
 * (instead of within 10 s): a model was just added (a pull), and the other
 * nodes should hear of it.  Any thread. */
void cluster_rescan_models(struct cluster *c);

/* The models folder this node uses (valid until cluster_free). */
const char *cluster_models_dir(const struct cluster *c);

/* ---- the allow-list (docs/cluster.md, "Removing a node and rotating the key") ---- */

/* Removes a node from the cluster for good: its id goes on the revocation
 * list every member keeps (<state_dir>/revoked.json) and spreads; every
 * member refuses it at the handshake and closes its links.  `id`: 32 hex
 * digits, or the first 8 or more of a member's id.  The full id goes to
 * out_id.  0 (also when it was removed already), RC_ENOTFOUND (no member
 * with that prefix), RC_EINVAL (not an id, ambiguous, this node itself),
 * RC_ESTATE (not started).  Any thread. */
int cluster_remove_node(struct cluster *c, const char *id, char out_id[33]);

/* Makes a new cluster key, writes its join token into `token` (cap >= 64),
 * and carries every live member over to it: they receive it over their
 * links, store it and use it for new connections; the old key stops working
 * once every member up at the rotation confirmed, at most 30 s later.  The
 * view's "key_rotation" reports the progress.  0, RC_ESTATE (a rotation is
 * in progress, or not started), RC_ELIMIT.  Any thread. */
int cluster_rotate_key(struct cluster *c, char *token, size_t cap);

/* ---- the state directory, for `racimo token` and `racimo serve` ---- */

/* dir (or $RACIMO_HOME, or $HOME/.racimo) into out.  0 or RC_ELIMIT. */
int cluster_state_dir(const char *dir, char *out, size_t cap);

/* Reads the stored join token of a state directory.  RC_ENOTFOUND when the
 * directory holds no key yet. */
int cluster_read_token(const char *state_dir, char *out, size_t cap);

#endif
