/* cluster_internal.h - the structures shared by the files of src/cluster.
 *
 *   cluster.c    life cycle, the thread, the periodic tick, membership,
 *                the view and its snapshot
 *   peer.c       one TCP connection: handshake, records, messages
 *   discovery.c  the mDNS responder and browser
 *   state.c      the state directory: keys, node id, peers cache
 *   revoke.c     the nodes removed from the cluster: kept, spread, refused
 *   rotate.c     replacing the cluster key while members stay linked
 *   hw.c         hardware, the cached self-benchmark
 *   exports.c    the model files listed to peers and served to them
 *   membership.c SWIM membership (swim.c) on UDP: with --swim it decides up/down
 *   links.c      with --swim: links with neighbours and on demand, not a mesh
 *   wire.c       handshake and record format (pure)
 *   mdns.c       DNS message format (pure)
 *
 * Threads: everything here belongs to the cluster thread, except what
 * `mu` guards (the node table's published fields, the serving list, the
 * send queue), which other threads read through cluster_snapshot or write
 * through cluster_set_serving / cluster_send.
 */
#ifndef RC_CLUSTER_INTERNAL_H
#define RC_CLUSTER_INTERNAL_H

#include "cluster/cluster.h"
#include "cluster/mdns_guard.h"
#include "cluster/node_digest.h"
#include "cluster/wire.h"

#include <netinet/in.h>
#include <pthread.h>

#define CL_MAX_ADDRS 8
#define CL_ADDR_LEN  64          /* "a.b.c.d" or a host name */
#define CL_NAME_LEN  64

struct event_base;
struct event;
struct bufferevent;
struct evconnlistener;
typedef struct discovery discovery;

typedef struct {
    char addrs[CL_MAX_ADDRS][CL_ADDR_LEN];   /* IPv4 literals */
    int n_addrs;
} addr_list;

typedef struct cl_node {
    uint8_t id[WIRE_ID_BYTES];
    char id_hex[2 * WIRE_ID_BYTES + 1];
    char name[CL_NAME_LEN];
    addr_list addrs;                          /* where it can be dialled */
    int cluster_port, http_port;
    json_t *info;                             /* its last STATE (mu) */
    bool up;                                  /* mu */
    bool is_self;
    bool member;                              /* mu: its id proven by a handshake with this
                                                 node (now, or in a run before: peers.json
                                                 keeps its key); others - heard of in
                                                 gossip or mDNS - are only candidates to
                                                 dial, not in the view, never leader */
    uint8_t pk[WIRE_PK_BYTES];                /* its static public key, once a member */
    uint64_t last_rx_ns;                      /* last frame from it */
    uint64_t down_since_ns;                   /* when it went down (or was learnt) */
    struct cl_conn *conn;                     /* the established link in use */
    struct cl_conn *dialing;                  /* a dial in progress */
    uint64_t next_dial_ns;
    int dial_idx;                             /* next address to try */
    char linked[CL_ADDR_LEN];                 /* the address of its last authenticated
                                                 link, dialled first ("" none) */
    /* An address only multicast DNS gave (anyone on the LAN may have sent
     * it): tried on its own, paced and backed off on its own, so that it
     * never replaces, delays or blocks the addresses above; kept once a
     * link to it proves this node's id. */
    char hint[CL_ADDR_LEN];
    int hint_port;
    struct cl_conn *hint_dialing;
    uint64_t hint_next_ns, hint_gap_ns;
    double rtt_ms, bw_mbps;                   /* our measure of the link to it (0: none),
                                                 kept after the link closes (measure.c) */
    uint64_t rtt_at_ns, bw_at_ns;             /* mu: when each was last taken */
    uint64_t measure_until_ns;                /* mu: placement waits for a fresh measure
                                                 until then (0: nobody asked) */
    bool dial_old_key;                        /* the next dial uses the key before a rotation */
    /* with SWIM (membership.c) */
    node_digest digest;                       /* mu: its last digest, when has_digest */
    bool has_digest;                          /* mu */
    bool has_link;                            /* mu: conn is set */
    bool neighbour;                           /* a long-lived link is kept with it */
    uint64_t want_until_ns;                   /* a link to it is wanted until then (messages
                                                 sent or received; idle ones close after) */
} cl_node;

/* PH_CHAN: an authenticated data channel waiting for its first message,
 * which hands the socket to the channel handler (cl__on_channel) */
enum { PH_HELLO, PH_AUTH, PH_OPEN, PH_CHAN, PH_DEAD };

typedef struct cl_tx {                        /* a bulk message being sent in frames */
    struct cl_tx *next;
    int type;
    uint32_t stream;
    size_t len, off;
    uint8_t data[];
} cl_tx;

typedef struct cl_conn {
    struct cluster *c;
    struct bufferevent *bev;
    int role;                                 /* WIRE_DIALER / WIRE_LISTENER */
    int phase;
    char peer_addr[80];                       /* "ip:port" for messages */
    struct in_addr peer_in;                   /* accepted: the source address */
    cl_node *node;                            /* after AUTH */
    cl_node *target;                          /* dialled for this node (may be NULL) */
    int static_idx;                           /* dialled for this static peer, or -1 */
    wire_session ws;
    wire_asm as;
    uint64_t t_start_ns, last_rx_ns, last_ping_ns, ping_seq;
    uint64_t last_tx_ns;                      /* a frame last sealed for the peer */
    uint64_t probe_id, probe_t0_ns, probe_bytes, next_probe_ns;
    bool probe_inflight;
    size_t probe_size;
    uint32_t next_stream;
    cl_tx *txq, *txq_tail;                    /* bulk messages, sent a frame at a time */
    size_t txq_bytes;
    uint64_t dead_ns;                         /* PH_DEAD since */
    bool old_key;                             /* handshake with the key before a rotation */
    bool auth_failed;                         /* refused: the peer's AUTH did not verify */
    bool broken;                              /* the socket failed: free at once */
    bool refused;                             /* handshake refused (version, key) */
    struct cl_conn *next;
} cl_conn;

typedef struct {
    char host[CL_ADDR_LEN];
    int port;
    uint64_t next_dial_ns;
    bool is_self;
    cl_conn *dialing;
    uint8_t id[WIRE_ID_BYTES];                /* once met */
    bool known;
} cl_static;

typedef struct cl_out {                       /* cluster_send queue */
    struct cl_out *next;
    uint8_t to[WIRE_ID_BYTES];
    uint64_t t_ns;                            /* queued at */
    int type;
    size_t len;
    uint8_t data[];
} cl_out;

typedef struct {                              /* a node removed from the cluster */
    uint8_t id[WIRE_ID_BYTES], by[WIRE_ID_BYTES];
    uint64_t at;                              /* unix seconds */
} cl_revoked;

typedef struct {                              /* rotate.c */
    uint64_t epoch;                           /* the current key's rotation (unix ms; 0: the
                                                 key as loaded) */
    uint8_t old_key[WIRE_KEY_BYTES];          /* the key before, while has_old: dials to members
                                                 that missed the rotation try it */
    bool has_old;
    uint64_t old_until_ns;
    bool leading;                             /* mu: this node rotated; waiting for members */
    uint8_t (*waiting)[WIRE_ID_BYTES];        /* mu: members up at the rotation not yet confirmed */
    int n_waiting;
    uint64_t deadline_ns;
    bool asked;                               /* mu: cluster_rotate_key queued asked_key */
    uint8_t asked_key[WIRE_KEY_BYTES];
} cl_rotation;

typedef struct {
    int cores, threads;
    char simd[32], cpu[128];
    uint64_t mem_total, mem_free;
    double mem_bw, gflops;                    /* bytes/s, GFLOP/s; 0 until measured */
    uint64_t mem_max;                         /* cluster_config.max_memory (0: none) */
} cl_hw;

struct cluster {
    cluster_config cfg;
    char state_dir[512];
    int lock_fd;                              /* flock on <state_dir>/lock, or -1 */
    char models_dir[600];
    char *ro_dirs;
    char listen_host[CL_ADDR_LEN];
    char advertise[CL_ADDR_LEN];
    char name[CL_NAME_LEN];
    uint8_t key[WIRE_KEY_BYTES];
    wire_identity ident;                      /* this node's key pair (node.key) and id */
    char token[WIRE_TOKEN_MAX];
    char hint[CL_ADDR_LEN + 8];               /* from a token's @host:port */
    char fp[WIRE_FP_HEX + 1];
    int major, minor;
    uint64_t t_start_ns;
    mdns_bucket hint_dials;                   /* dials to mDNS hints, all nodes together */
    uint64_t unproven_warn_ns;                /* last said that unproven nodes overflow */

    pthread_mutex_t mu;
    bool mu_init;
    pthread_t thread;
    bool started;
    bool stopping;                            /* on_stop ran: no new links */
    struct event_base *base;
    struct evconnlistener *listener;
    int port;
    struct event *tick_ev, *stop_ev, *wake_ev, *reap_ev;
    uint64_t tick_at_ns;                      /* when tick_ev is armed for */
    discovery *disc;

    cl_node **nodes;                          /* nodes[0] is this node (mu for the array) */
    int n_nodes, cap_nodes;
    cl_conn *conns;
    /* connections closed before finishing a handshake, summed up in a log
     * line at most every 10 s so that a flood cannot flood the log */
    struct {
        int over_limit, timed_out, unlogged;   /* unlogged: refusals past the budget */
        int logged;                            /* refusal lines in this window */
        char last_from[CL_ADDR_LEN];
        uint64_t since_ns;
    } refusals;
    cl_static *statics;
    int n_statics;
    uint8_t *plain;                           /* WIRE_FRAME_MAX: decrypted frames */

    /* published by this node */
    cl_hw hw;                                 /* mu */
    json_t *models;                           /* mu: what `exports` lists */
    struct exports *exports;
    json_t *serving;                          /* mu */
    json_t *serving_free;                     /* mu: {name: free sequence slots} */
    bool measure_asked;                       /* mu: a node's measure_until_ns is set */
    json_t *serving_slots;                    /* mu: {name: sequence slots} */
    json_t *published;                        /* mu: {key: value} added to this node's
                                                 STATE (cluster_set_published) */
    json_t *published_stable;                 /* mu: {key: the part whose change is sent
                                                 at once} */
    bool self_dirty;                          /* mu: send STATE now */
    bool scan_soon;                           /* mu: look at the model folders now */
    uint64_t next_state_ns, next_scan_ns, next_mem_ns;
    uint64_t n_came_up;                       /* nodes that came up, ever (mu) */
    bool peers_dirty;
    pthread_t bench_thread;
    bool bench_started;

    cl_out *out_head, *out_tail;              /* mu */
    cl_out *held;                             /* with SWIM: messages waiting for a link
                                                 being opened on demand (cluster thread) */
    uint64_t next_neighbours_ns;
    struct { int lo, hi; cluster_msg_fn fn; void *ud; } handlers[CLUSTER_MAX_HANDLERS];
    int n_handlers;
    struct { cluster_down_fn fn; void *ud; } on_down[CLUSTER_MAX_HANDLERS];
    int n_on_down;
    cluster_chan_fn on_chan;
    void *on_chan_ud;

    struct cl_swim *swim;                     /* membership.c (NULL: not running) */
    size_t swim_counts[4];                    /* mu: its members per state */
    uint32_t swim_incarnation;                /* mu */
    uint64_t swim_bad;                        /* mu: datagrams and packets refused */
    uint64_t swim_suspicions, swim_deaths;    /* mu: members seen suspect / dead, ever */
    json_t *swim_serving;                     /* mu: {model: {nodes, free}} from the digests */

    cl_revoked *revoked;                      /* mu: the cluster's revocation list */
    int n_revoked, n_revoked_done;            /* [0, done) applied on the cluster thread */
    bool self_removed;                        /* this node's id is on the list */
    cl_rotation rot;
};

/* The links' heartbeat.  With SWIM twice --heartbeat (1 s by default):
 * SWIM detects failures, a silent link is only evidence, and the pings of
 * 8 neighbour links were half of what an idle node still did (64 nodes:
 * 0.35% of a core per node at 500 ms, 0.24% at 1 s). */
static inline uint64_t cl__heartbeat_ns(const struct cluster *c)
{
    return (uint64_t)c->cfg.heartbeat_ms * 1000000ull * (c->swim ? 2 : 1);
}

/* now - t, or 0 when t is later (stamps taken after `now` was read) */
static inline uint64_t cl__since(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

/* cluster.c: called by peer.c and discovery.c on the cluster thread */
cl_node *cl__node_find(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
void cl__dispatch(struct cluster *c, const char *from_id, int type, const uint8_t *data,
                  size_t len);
cl_node *cl__node_add(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
void cl__node_add_addr(struct cluster *c, cl_node *n, const char *addr);
int  cl__admit(struct cluster *c, cl_conn *k);
void cl__on_established(struct cluster *c, cl_conn *k);
void cl__count_refusal(struct cluster *c, const char *from, bool timed_out);
bool cl__refusal_log_ok(struct cluster *c, const char *from);
void cl__on_state(struct cluster *c, cl_conn *k, const uint8_t *data, size_t len);
void cl__on_closed(struct cluster *c, cl_conn *k);
void cl__on_channel(struct cluster *c, cl_conn *k, const wire_msg *m);
/* Recomputes each node's up/down (from SWIM when it runs, else the links). */
void cl__update_membership(struct cluster *c, uint64_t now);
/* Multicast DNS says node `id` is at addr:port.  Returns 0 when taken (a
 * new unproven node, or an address to try for a node not linked now), 1
 * when there was nothing new, -1 when refused, with the reason in why
 * (which holds no text from the answer). */
int  cl__on_found(struct cluster *c, const uint8_t id[WIRE_ID_BYTES], const char *addr, int port,
                  char *why, size_t why_cap);
json_t *cl__self_state(struct cluster *c);
void cl__schedule_reap(struct cluster *c);
void cl__wake(struct cluster *c);        /* any thread: run revoke/rotate work now */
void cl__tick_soon(struct cluster *c);   /* cluster thread: the tick within TICK_MS */

/* peer.c */
cl_conn *cl__conn_accept(struct cluster *c, int fd, const struct sockaddr *sa);
cl_conn *cl__conn_dial(struct cluster *c, const char *host, int port, bool old_key);
int  cl__conn_send(cl_conn *k, int type, const void *data, size_t len, bool final);
void cl__conn_close(cl_conn *k, const char *why);   /* sends BYE when open; reaped later */
void cl__conn_tick(cl_conn *k, uint64_t now);
uint64_t cl__conn_next(const cl_conn *k, uint64_t now); /* when conn_tick next has work */
void cl__conn_free(cl_conn *k);
size_t cl__conn_pending(const cl_conn *k);          /* output bytes not yet sent */
void cl__conn_flush(cl_conn *k);                    /* write what the socket takes now */

/* discovery.c */
int  discovery_new(struct cluster *c, discovery **out);
void discovery_tick(discovery *d, uint64_t now);
void discovery_goodbye(discovery *d);
void discovery_free(discovery *d);
void discovery_rekey(discovery *d);     /* the fingerprint changed: announce it again */

/* state.c */
int  cl__state_init(struct cluster *c, bool *created);
void cl__peers_load(struct cluster *c);
void cl__peers_save(struct cluster *c);
int  cl__local_addrs(addr_list *out, bool with_loopback);
/* Writes a file through mkstemp + fsync + rename (replace) or link (not). */
int  cl__write_file(const char *path, const char *data, size_t n, int mode, bool replace);

/* revoke.c */
void cl__revoked_load(struct cluster *c);
bool cl__is_revoked(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);   /* takes mu */
bool cl__refuse_revoked(struct cluster *c, cl_conn *k);   /* at authentication: closes k */
void cl__revoke_send(struct cluster *c, cl_conn *k);      /* the list to a new link */
void cl__on_revoke(struct cluster *c, cl_conn *k, const uint8_t *data, size_t len);
void cl__revoke_work(struct cluster *c);                  /* applies what was added */
json_t *cl__revoked_json(struct cluster *c);              /* caller holds mu */

/* rotate.c */
void cl__on_rotate(struct cluster *c, cl_conn *k, int type, const uint8_t *data, size_t len);
void cl__rotate_work(struct cluster *c, uint64_t now);
void cl__rotate_linked(struct cluster *c, cl_conn *k);   /* a link made with the old key */
/* For the log of a handshake that failed authentication: "" or a sentence
 * saying the key may have been rotated, when the peer is a known member. */
const char *cl__rotation_hint(struct cluster *c, const cl_conn *k);
/* The rotating node waits no longer for node id (it confirmed, or was removed). */
void cl__rotate_forget(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
json_t *cl__rotation_json(struct cluster *c);            /* caller holds mu */
void cl__rotate_free(struct cluster *c);

/* membership.c: SWIM beside the mesh (issue 22) */
int  cl__swim_start(struct cluster *c);
void cl__swim_join(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);   /* a proven member */
/* enum swim_state of id in this node's SWIM view, -1 when SWIM does not
 * know it */
int  cl__swim_state(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
bool cl__swim_alone(struct cluster *c);    /* SWIM knows no other member alive */
/* a link to id went silent: SWIM suspects it (a node cut off finds itself
 * alone within about down_after + a suspicion, whatever its probe pace) */
void cl__swim_suspect(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
void cl__swim_on_stream(struct cluster *c, const uint8_t *data, size_t len);
void cl__swim_stop(struct cluster *c);     /* tells the others this node leaves */
void cl__swim_free(struct cluster *c);
/* links.c: with SWIM, which links are kept (neighbours, on demand) */
void cl__links_tick(struct cluster *c, uint64_t now);
/* measure.c: link measures on demand and their age */
void cl__measure_tick(struct cluster *c, uint64_t now);
bool cl__measure_fresh(const struct cluster *c, const cl_node *n, uint64_t now);   /* mu */
json_t *cl__measure_json(const struct cluster *c, const cl_node *n, uint64_t now);  /* mu */
bool cl__link_wanted(struct cluster *c, const cl_node *n, uint64_t now);
void cl__link_want(struct cluster *c, cl_node *n, uint64_t now);   /* used now: keep/open it */
void cl__hold(struct cluster *c, cl_out *o);       /* a message waiting for its link */
void cl__held_release(struct cluster *c, cl_node *n, uint64_t now);  /* link open, or expired */
void cl__held_free(struct cluster *c);
/* cluster.c: queues a message for the cluster thread (any thread) */
int  cl__enqueue(struct cluster *c, const uint8_t id[WIRE_ID_BYTES], int type, const void *data,
                 size_t len);

/* hw.c */
void cl__hw_probe(cl_hw *h);
bool cl__hw_mem(cl_hw *h);          /* reads free memory: true when it moved enough to send */
int  cl__bench_cached(const char *state_dir, cl_hw *h);      /* 1 when found */
void cl__bench_run(const char *state_dir, cl_hw *h);
json_t *cl__hw_json(const cl_hw *h);

#endif
