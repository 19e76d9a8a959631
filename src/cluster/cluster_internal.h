/* cluster_internal.h - the structures shared by the files of src/cluster.
 *
 *   cluster.c    life cycle, the thread, the periodic tick, membership,
 *                the view and its snapshot
 *   peer.c       one TCP connection: handshake, records, messages
 *   discovery.c  the mDNS responder and browser
 *   state.c      the state directory: key, node id, peers cache
 *   hw.c         hardware, the cached self-benchmark
 *   exports.c    the model files listed to peers and served to them
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
    bool member;                              /* mu: met (authenticated) here or vouched
                                                 for by a member; others are only
                                                 candidates to dial, not in the view */
    uint64_t last_rx_ns;                      /* last frame from it */
    uint64_t down_since_ns;                   /* when it went down (or was learnt) */
    struct cl_conn *conn;                     /* the established link in use */
    struct cl_conn *dialing;                  /* a dial in progress */
    uint64_t next_dial_ns;
    int dial_idx;                             /* next address to try */
    double rtt_ms, bw_mbps;                   /* our measure of the link to it (0: none) */
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
    cl_node *node;                            /* after AUTH */
    cl_node *target;                          /* dialled for this node (may be NULL) */
    int static_idx;                           /* dialled for this static peer, or -1 */
    wire_session ws;
    wire_asm as;
    uint64_t t_start_ns, last_rx_ns, last_ping_ns, ping_seq;
    uint64_t probe_id, probe_t0_ns, probe_bytes, next_probe_ns;
    bool probe_inflight;
    size_t probe_size;
    uint32_t next_stream;
    cl_tx *txq, *txq_tail;                    /* bulk messages, sent a frame at a time */
    size_t txq_bytes;
    uint64_t dead_ns;                         /* PH_DEAD since */
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
    int type;
    size_t len;
    uint8_t data[];
} cl_out;

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
    char token[WIRE_TOKEN_MAX];
    char hint[CL_ADDR_LEN + 8];               /* from a token's @host:port */
    char fp[WIRE_FP_HEX + 1];
    int major, minor;
    uint64_t t_start_ns;

    pthread_mutex_t mu;
    bool mu_init;
    pthread_t thread;
    bool started;
    bool stopping;                            /* on_stop ran: no new links */
    struct event_base *base;
    struct evconnlistener *listener;
    int port;
    struct event *tick_ev, *stop_ev, *wake_ev, *reap_ev;
    discovery *disc;

    cl_node **nodes;                          /* nodes[0] is this node (mu for the array) */
    int n_nodes, cap_nodes;
    cl_conn *conns;
    cl_static *statics;
    int n_statics;
    uint8_t *plain;                           /* WIRE_FRAME_MAX: decrypted frames */

    /* published by this node */
    cl_hw hw;                                 /* mu */
    json_t *models;                           /* mu: what `exports` lists */
    struct exports *exports;
    json_t *serving;                          /* mu */
    json_t *serving_free;                     /* mu: {name: free sequence slots} */
    bool self_dirty;                          /* mu: send STATE now */
    uint64_t next_state_ns, next_scan_ns, next_mem_ns;
    bool peers_dirty;
    pthread_t bench_thread;
    bool bench_started;

    cl_out *out_head, *out_tail;              /* mu */
    struct { int lo, hi; cluster_msg_fn fn; void *ud; } handlers[CLUSTER_MAX_HANDLERS];
    int n_handlers;
    struct { cluster_down_fn fn; void *ud; } on_down[CLUSTER_MAX_HANDLERS];
    int n_on_down;
    cluster_chan_fn on_chan;
    void *on_chan_ud;
};

/* now - t, or 0 when t is later (stamps taken after `now` was read) */
static inline uint64_t cl__since(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

/* cluster.c: called by peer.c and discovery.c on the cluster thread */
cl_node *cl__node_find(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
void cl__dispatch(struct cluster *c, const char *from_id, int type, const uint8_t *data,
                  size_t len);
cl_node *cl__node_add(struct cluster *c, const uint8_t id[WIRE_ID_BYTES]);
void cl__node_add_addr(struct cluster *c, cl_node *n, const char *addr);
void cl__on_established(struct cluster *c, cl_conn *k);
void cl__on_state(struct cluster *c, cl_conn *k, const uint8_t *data, size_t len);
void cl__on_closed(struct cluster *c, cl_conn *k);
void cl__on_channel(struct cluster *c, cl_conn *k, const wire_msg *m);
void cl__on_found(struct cluster *c, const uint8_t id[WIRE_ID_BYTES], const char *addr, int port);
json_t *cl__self_state(struct cluster *c);
void cl__schedule_reap(struct cluster *c);

/* peer.c */
cl_conn *cl__conn_accept(struct cluster *c, int fd, const struct sockaddr *sa);
cl_conn *cl__conn_dial(struct cluster *c, const char *host, int port);
int  cl__conn_send(cl_conn *k, int type, const void *data, size_t len, bool final);
void cl__conn_close(cl_conn *k, const char *why);   /* sends BYE when open; reaped later */
void cl__conn_tick(cl_conn *k, uint64_t now);
void cl__conn_free(cl_conn *k);
size_t cl__conn_pending(const cl_conn *k);          /* output bytes not yet sent */
void cl__conn_flush(cl_conn *k);                    /* write what the socket takes now */

/* discovery.c */
int  discovery_new(struct cluster *c, discovery **out);
void discovery_tick(discovery *d, uint64_t now);
void discovery_goodbye(discovery *d);
void discovery_free(discovery *d);

/* state.c */
int  cl__state_init(struct cluster *c, bool *created);
void cl__peers_load(struct cluster *c);
void cl__peers_save(struct cluster *c);
int  cl__local_addrs(addr_list *out, bool with_loopback);

/* hw.c */
void cl__hw_probe(cl_hw *h);
void cl__hw_mem(cl_hw *h);
int  cl__bench_cached(const char *state_dir, cl_hw *h);      /* 1 when found */
void cl__bench_run(const char *state_dir, cl_hw *h);
json_t *cl__hw_json(const cl_hw *h);

#endif
