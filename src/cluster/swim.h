/* swim.h - cluster membership as SWIM with the Lifeguard refinements, as an
 * I/O-free state machine.
 *
 * The host (the live cluster thread, or the simulator of tests/swimsim.c)
 * owns the clock, the sockets and the randomness' seed.  It feeds the
 * machine the packets it received (swim_recv) and the time (swim_tick);
 * the machine calls back to send packets (to a member id; the host maps ids
 * to addresses) and to report membership events.  Nothing here blocks,
 * sleeps, reads a clock or touches a socket, so the same code runs one
 * node in `racimo serve` and a thousand nodes in one simulated process.
 *
 * The protocol (docs/cluster-protocol.md, "Membership at scale"):
 *   - each probe period a node pings the next member of a shuffled
 *     round-robin; without an ack within the probe timeout it asks
 *     `indirect_k` other members to ping it (PING_REQ), who answer with
 *     the ack or a NACK; without any ack by the end of the period the
 *     member is suspected;
 *   - a suspicion is refuted by the member itself with a higher
 *     incarnation number; otherwise it becomes `dead` after a timeout that
 *     starts long and shrinks (Lifeguard) as independent confirmations
 *     arrive;
 *   - a local health score (Lifeguard) stretches the node's own probe
 *     period and timeout when it misses acks and nacks or has to refute,
 *     so a slow node suspects others less;
 *   - membership changes (alive/suspect/dead, with the member's metadata)
 *     ride piggybacked on every packet and on a small periodic gossip,
 *     each retransmitted about retransmit_mult * log10(N+1) times;
 *   - a full state exchange (push-pull) with one random member at a slow
 *     rate, and with any member found alive that was thought dead, heals
 *     partitions.
 *
 * Every packet carries the sender's view of the receiver ("you are suspect
 * at incarnation 7"), so a suspected or declared-dead node learns it from
 * the first packet it gets and refutes at once.
 *
 * Threads: a swim object belongs to one thread.
 */
#ifndef RC_SWIM_H
#define RC_SWIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SWIM_ID_BYTES   16
#define SWIM_META_MAX   192      /* a member's metadata (node_digest.h) */
#define SWIM_PACKET_MAX 1400     /* one UDP datagram without fragmentation */

enum swim_state { SWIM_ALIVE = 0, SWIM_SUSPECT = 1, SWIM_DEAD = 2, SWIM_LEFT = 3 };

typedef struct {
    uint32_t period_ms;          /* probe period (500) */
    uint32_t probe_timeout_ms;   /* wait for a direct ack before going indirect (200) */
    int indirect_k;              /* members asked for an indirect probe (3) */
    int retransmit_mult;         /* broadcasts sent mult * ceil(log10(N+1)) times (4) */
    double suspicion_mult;       /* min suspicion = mult * max(1, log10 N) * period (1.5) */
    int suspicion_max_mult;      /* max suspicion = this * min (4) */
    int awareness_max;           /* Lifeguard health score bound (8) */
    uint32_t gossip_ms;          /* gossip interval (200) */
    int gossip_nodes;            /* members gossiped to per interval (3) */
    uint32_t pushpull_ms;        /* base push-pull interval, scaled with N (30000) */
    uint32_t reap_ms;            /* a dead member is forgotten after this (60000) */
    uint32_t dead_probe_ms;      /* a random dead member is pinged this often, to heal (125) */
    size_t packet_max;           /* bytes per packet (SWIM_PACKET_MAX) */
} swim_config;

void swim_config_default(swim_config *cfg);

typedef struct {
    int type;                    /* SWIM_EV_* */
    const uint8_t *id;           /* the member */
    uint32_t incarnation;
    const uint8_t *meta;         /* its metadata (JOIN, UPDATE) */
    size_t meta_len;
} swim_event;

enum {
    SWIM_EV_JOIN = 1,            /* a member became known, alive */
    SWIM_EV_UPDATE,              /* its metadata changed */
    SWIM_EV_SUSPECT,             /* suspected (still counted up by most uses) */
    SWIM_EV_ALIVE,               /* a suspect or dead member is alive again */
    SWIM_EV_DEAD,                /* declared dead (failed) */
    SWIM_EV_LEFT,                /* left on purpose */
    SWIM_EV_REAPED,              /* forgotten: dead/left for reap_ms */
};

typedef struct {
    /* send a packet to a member.  `reliable`: a push-pull exchange, larger
     * than a datagram, to be carried by a stream (TCP in the live node). */
    void (*send)(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable);
    void (*event)(void *ctx, const swim_event *ev);
    void *ctx;
} swim_io;

typedef struct swim swim;

/* A machine for the node `self_id`, with its metadata, starting at `now_ms`
 * (any monotonic origin).  `seed` seeds its private random generator.
 * Returns NULL on allocation failure.  Free with swim_free (NULL accepted). */
swim *swim_new(const swim_config *cfg, const swim_io *io, const uint8_t *self_id,
               const uint8_t *meta, size_t meta_len, uint64_t seed, uint64_t now_ms);
void swim_free(swim *s);

/* First contact: a member whose id is known (from mDNS, --peer and the
 * handshake) is added alive at incarnation 0 and sent a push-pull. */
int swim_join(swim *s, const uint8_t *id, uint64_t now_ms);

/* A packet from the network.  Malformed packets are counted and dropped
 * (swim_stats.bad); returns 0, or RC_EFORMAT with a detail for the log. */
int swim_recv(swim *s, const uint8_t *buf, size_t len, uint64_t now_ms);

/* Advances timers to now_ms; returns the time of the next timer, so a host
 * may sleep until then (or until a packet arrives).  Only timers with work
 * count (no gossip timer while nothing is queued to spread): after
 * swim_recv, swim_join, swim_suspect, swim_set_meta and swim_leave the host
 * calls swim_tick again, since they may have queued something. */
uint64_t swim_tick(swim *s, uint64_t now_ms);

/* Evidence from outside the protocol that a member is unreachable (the live
 * node: its TCP link went silent): the member is suspected as if this
 * node's probe of it had failed - the suspicion spreads and the member can
 * refute it as any other. */
void swim_suspect(swim *s, const uint8_t *id, uint64_t now_ms);

/* Changes this node's metadata: a new incarnation, spread like a refutation. */
int swim_set_meta(swim *s, const uint8_t *meta, size_t meta_len, uint64_t now_ms);

/* Leaving on purpose: spreads `left` about this node (it then stops probing). */
void swim_leave(swim *s, uint64_t now_ms);

/* The members known, this node included.  Ordering is arbitrary and changes
 * at each probe round. */
typedef struct {
    const uint8_t *id;
    int state;                   /* enum swim_state */
    uint32_t incarnation;
    const uint8_t *meta;
    size_t meta_len;
} swim_member_view;

size_t swim_n_members(const swim *s);
int swim_member_at(const swim *s, size_t i, swim_member_view *out);
/* -1 if the id is unknown */
int swim_state_of(const swim *s, const uint8_t *id);
/* counts of members per state, this node included */
void swim_counts(const swim *s, size_t counts[4]);

typedef struct {
    uint64_t sent, received, bytes_sent, bad;   /* packets */
    uint64_t pushpulls;
    uint64_t refutes, suspects_raised;
    int awareness;                               /* current Lifeguard score */
    uint32_t incarnation;                        /* this node's */
} swim_stats;

void swim_get_stats(const swim *s, swim_stats *out);

#endif
