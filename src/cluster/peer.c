/* peer.c - one TCP connection between two nodes, on the cluster thread.
 *
 * Life: HELLO -> AUTH -> OPEN -> DEAD.  Both ends send HELLO at once; AUTH
 * follows each HELLO received (wire.c does the cryptography).  A refused
 * handshake (other cluster, incompatible version, not racimo at all, an id
 * its key does not give, a key it does not hold) and any bad record
 * (oversized, forged, tampered, replayed, truncated) is logged with the
 * peer's address and closes the connection; nothing else happens.
 *
 * Sending: small control messages are sealed straight into the socket's
 * output buffer; bulk messages (probes, the data plane, large STATEs) wait
 * in a queue and are sealed a frame at a time while the output buffer is
 * short, so heartbeats never sit behind megabytes.
 *
 * A connection is never freed inside its own callbacks: cl__conn_close
 * marks it DEAD and the cluster reaps it later (cluster.c).
 */
#include "cluster/cluster_internal.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#define HANDSHAKE_NS   (3ull * 1000000000ull)  /* connect + HELLO + AUTH */
#define HELLO_NS       (1ull * 1000000000ull)  /* accepted until the peer's HELLO is in */
#define BULK_LOW       (256u << 10)          /* keep this much queued in the socket buffer */
#define OUT_MAX        (64u << 20)           /* a peer that reads nothing is dropped */
#define PROBE_MIN      (64u << 10)
#define PROBE_MAX      (16u << 20)
#define MS             1000000ull


/* Time to the next bandwidth probe of a link.  With SWIM a measure is kept
 * for SWIM_PROBE_MULT times longer: a probe lasts 50-500 ms of the link's
 * full speed (16 MiB sealed and opened on a fast one), which every 10 s on
 * each neighbour link was most of an idle node's CPU; placement reads the
 * cached measure (the first one is taken 1 s after linking). */
#define SWIM_PROBE_MULT 30
static uint64_t probe_gap(const struct cluster *c)
{
    return (uint64_t)c->cfg.probe_ms * MS * (c->swim ? SWIM_PROBE_MULT : 1);
}

static const char *short_id(const cl_conn *k)
{
    static _Thread_local char buf[16];
    if (k->node)
        snprintf(buf, sizeof buf, "%.8s", k->node->id_hex);
    else
        snprintf(buf, sizeof buf, "?");
    return buf;
}

/* ---- sending ---- */

static int seal_frame(cl_conn *k, int type, uint8_t flags, uint32_t stream, const uint8_t *p,
                      size_t n, bool final)
{
    struct evbuffer *out = bufferevent_get_output(k->bev);
    struct evbuffer_iovec v;
    size_t need = wire_record_bytes(n);
    if (evbuffer_reserve_space(out, (ev_ssize_t)need, &v, 1) < 1 || v.iov_len < need)
        return rc_fail(RC_ENOMEM, "send buffer");
    long r = wire_seal(&k->ws, (uint8_t)type, flags, stream, p, n, final, v.iov_base);
    if (r < 0)
        return (int)r;
    v.iov_len = (size_t)r;
    evbuffer_commit_space(out, &v, 1);
    k->last_tx_ns = os_now_ns();
    return 0;
}

/* Seals frames of queued bulk messages while the output buffer is short. */
static void pump(cl_conn *k)
{
    struct evbuffer *out = bufferevent_get_output(k->bev);
    while (k->txq && k->phase == PH_OPEN && evbuffer_get_length(out) < BULK_LOW) {
        cl_tx *t = k->txq;
        size_t n = t->len - t->off;
        if (n > WIRE_PAYLOAD_MAX)
            n = WIRE_PAYLOAD_MAX;
        bool last = t->off + n == t->len;
        if (seal_frame(k, t->type, last ? 0 : WIRE_F_MORE, t->stream, t->data + t->off, n, false)) {
            cl__conn_close(k, rc_errmsg());
            return;
        }
        t->off += n;
        k->txq_bytes -= n;
        if (last) {
            k->txq = t->next;
            if (!k->txq)
                k->txq_tail = NULL;
            rc_free(t);
        }
    }
}

int cl__conn_send(cl_conn *k, int type, const void *data, size_t len, bool final)
{
    if (k->phase != PH_OPEN)
        return rc_fail(RC_ESTATE, "link not open");
    if (len > WIRE_MSG_MAX)
        return rc_fail(RC_ELIMIT, "message of %zu bytes (limit %u)", len, WIRE_MSG_MAX);
    if (cl__conn_pending(k) + len > OUT_MAX) {
        cl__conn_close(k, "the peer does not read what is sent to it");
        return rc_fail(RC_ELIMIT, "peer not reading");
    }
    uint32_t stream = k->next_stream++;
    if (len <= 64 * 1024 || final) {
        if (len > WIRE_PAYLOAD_MAX)
            return rc_fail(RC_ELIMIT, "final message too large");
        return seal_frame(k, type, 0, stream, data, len, final);
    }
    cl_tx *t = rc_malloc(sizeof *t + len);
    if (!t)
        return rc_fail(RC_ENOMEM, "queueing %zu bytes", len);
    t->next = NULL;
    t->type = type;
    t->stream = stream;
    t->len = len;
    t->off = 0;
    memcpy(t->data, data, len);
    if (k->txq_tail)
        k->txq_tail->next = t;
    else
        k->txq = t;
    k->txq_tail = t;
    k->txq_bytes += len;
    pump(k);
    return 0;
}

/* The bufferevent writes on the loop's next pass, after a poll for
 * writability; messages queued by other threads (a stage's or shard's
 * data) would wait that pass.  Writing now saves it; the bufferevent sends
 * whatever the socket does not take. */
void cl__conn_flush(cl_conn *k)
{
    if (!k->bev || k->phase != PH_OPEN)
        return;
    struct evbuffer *out = bufferevent_get_output(k->bev);
    if (evbuffer_get_length(out) > 0)
        evbuffer_write(out, bufferevent_getfd(k->bev));
}

size_t cl__conn_pending(const cl_conn *k)
{
    return (k->bev ? evbuffer_get_length(bufferevent_get_output(k->bev)) : 0) + k->txq_bytes;
}

/* ---- closing ---- */

static void on_drained(struct bufferevent *bev, void *arg)
{
    cl_conn *k = arg;
    if (k->phase == PH_DEAD)
        cl__schedule_reap(k->c);
    else
        pump(k);
}

void cl__conn_close(cl_conn *k, const char *why)
{
    if (k->phase == PH_DEAD)
        return;
    if (k->phase == PH_OPEN && !k->ws.tx_final && !k->broken && why)
        seal_frame(k, WIRE_BYE, 0, k->next_stream++, (const uint8_t *)why, strlen(why), true);
    k->phase = PH_DEAD;
    k->dead_ns = os_now_ns();
    if (k->bev)
        bufferevent_disable(k->bev, EV_READ);
    cl__on_closed(k->c, k);
    cl__schedule_reap(k->c);
}

void cl__conn_free(cl_conn *k)
{
    if (!k)
        return;
    if (k->bev)
        bufferevent_free(k->bev);
    while (k->txq) {
        cl_tx *t = k->txq;
        k->txq = t->next;
        rc_free(t);
    }
    wire_asm_free(&k->as);
    wire_session_wipe(&k->ws);
    rc_free(k);
}

/* ---- receiving ---- */

static void fail(cl_conn *k, int level, const char *what)
{
    rc_log(level, "cluster: %s %s (node %s): %s; closing the connection",
           k->role == WIRE_DIALER ? "link to" : "link from", k->peer_addr, short_id(k), what);
    cl__conn_close(k, NULL);
}

/* A refused handshake: logged (within the cluster's budget for such lines,
 * so a flood of them is counted, not printed) and closed. */
static void refuse(cl_conn *k, bool with_id, int level)
{
    char idh[2 * WIRE_ID_BYTES + 1];
    wire_hex(k->ws.peer_id, WIRE_ID_BYTES, idh);
    if (level != LOG_WARN || cl__refusal_log_ok(k->c, k->peer_addr))
        rc_log(level, "cluster: refused %s %s%s%.*s%s: %s%s", k->role == WIRE_DIALER
               ? "the node at" : "a connection from", k->peer_addr, with_id ? " (node " : "",
               with_id ? 8 : 0, idh, with_id ? ")" : "", rc_errmsg(),
               k->auth_failed ? cl__rotation_hint(k->c, k) : "");
    k->refused = true;
    cl__conn_close(k, NULL);
}

static void on_message(cl_conn *k, const wire_msg *m, uint64_t now)
{
    struct cluster *c = k->c;
    switch (m->type) {
    case WIRE_PING:
        if (m->len == 16)
            seal_frame(k, WIRE_PONG, 0, k->next_stream++, m->data, 16, false);
        break;
    case WIRE_PONG:
        if (m->len == 16 && wire_get64(m->data) == k->ping_seq && !k->probe_inflight &&
            !k->txq && k->node) {
            uint64_t sent = wire_get64(m->data + 8);
            if (sent <= now) {
                double rtt = (double)(now - sent) / 1e6;
                cl_node *n = k->node;
                pthread_mutex_lock(&c->mu);
                if (n->rtt_ms <= 0)
                    c->self_dirty = true;    /* a new link in STATE: sent now */
                n->rtt_ms = n->rtt_ms > 0 ? n->rtt_ms * 0.75 + rtt * 0.25 : rtt;
                n->rtt_at_ns = now;
                pthread_mutex_unlock(&c->mu);
            }
        }
        break;
    case WIRE_STATE:
        cl__on_state(c, k, m->data, m->len);
        break;
    case WIRE_PROBE:
        if (m->len >= 8) {
            uint8_t ack[16];
            memcpy(ack, m->data, 8);
            wire_put64(ack + 8, m->len);
            seal_frame(k, WIRE_PROBE_ACK, 0, k->next_stream++, ack, 16, false);
        }
        break;
    case WIRE_PROBE_ACK:
        if (m->len == 16 && k->probe_inflight && wire_get64(m->data) == k->probe_id && k->node) {
            double dt = (double)(cl__since(now, k->probe_t0_ns)) * 1e-9;
            double rtt = k->node->rtt_ms * 1e-3, xfer = dt - rtt;
            if (xfer < dt / 4)
                xfer = dt / 4;
            double mbps = xfer > 0 ? (double)wire_get64(m->data + 8) * 8 / xfer * 1e-6 : 0;
            cl_node *n = k->node;
            pthread_mutex_lock(&c->mu);
            if (n->bw_mbps <= 0)
                c->self_dirty = true;        /* the link's first measure: sent now */
            n->bw_mbps = n->bw_mbps > 0 ? n->bw_mbps * 0.5 + mbps * 0.5 : mbps;
            n->bw_at_ns = now;
            pthread_mutex_unlock(&c->mu);
            k->probe_inflight = false;
            /* aim at transfers of 50-500 ms: precise enough, never long */
            if (dt < 0.05 && k->probe_size * 2 <= PROBE_MAX)
                k->probe_size *= 2;
            else if (dt > 0.5 && k->probe_size / 2 >= PROBE_MIN)
                k->probe_size /= 2;
            k->next_probe_ns = now + probe_gap(c);
        }
        break;
    case WIRE_REVOKE:
        cl__on_revoke(c, k, m->data, m->len);
        break;
    case WIRE_SWIM:
        if (k->node)
            cl__swim_on_stream(c, m->data, m->len);
        break;
    case WIRE_KEY:
    case WIRE_KEY_ACK:
    case WIRE_KEY_RETIRE:
        cl__on_rotate(c, k, m->type, m->data, m->len);
        break;
    case WIRE_BYE:
        rc_log(LOG_INFO, "cluster: node %s (%s) closed the link: %s", short_id(k), k->peer_addr,
               log_clean_n(m->data, m->len));
        cl__conn_close(k, NULL);
        break;
    default:
        if (m->type >= 0x40 && m->type < 0x80 && k->node) {
            cl__link_want(c, k->node, os_now_ns());     /* in use: not idle */
            cl__dispatch(c, k->node->id_hex, m->type, m->data, m->len);
        }
        else
            rc_log(LOG_DEBUG, "cluster: ignoring a message of unknown type 0x%02x from %s",
                   m->type, short_id(k));
        break;
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    cl_conn *k = arg;
    struct cluster *c = k->c;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (k->phase != PH_DEAD) {
        size_t avail = evbuffer_get_length(in);
        uint64_t now = os_now_ns();
        if (k->phase == PH_HELLO) {
            uint8_t hello[WIRE_HELLO_BYTES], auth[WIRE_AUTH_BYTES];
            if (avail < WIRE_HELLO_PREFIX)
                return;
            /* the version before the rest: another major's HELLO has
             * another length (1.x: 92 bytes), and its node then closes */
            evbuffer_copyout(in, hello, WIRE_HELLO_PREFIX);
            if (wire_hello_prefix(&k->ws, hello, WIRE_HELLO_PREFIX)) {
                refuse(k, false, LOG_WARN);
                return;
            }
            if (avail < sizeof hello)
                return;
            evbuffer_remove(in, hello, sizeof hello);
            if (wire_on_hello(&k->ws, hello, auth)) {
                refuse(k, true, LOG_WARN);
                return;
            }
            bufferevent_write(bev, auth, sizeof auth);
            k->phase = PH_AUTH;
        } else if (k->phase == PH_AUTH) {
            uint8_t auth[WIRE_AUTH_BYTES];
            if (avail < sizeof auth)
                return;
            evbuffer_remove(in, auth, sizeof auth);
            /* the one place a proven identity is let in, or not */
            int r = wire_on_auth(&k->ws, auth);
            k->auth_failed = r != 0;      /* perhaps a rotated key (rotate.c) */
            if (!r)
                r = cl__admit(c, k);
            if (r) {
                refuse(k, true, r == RC_ESTATE ? LOG_DEBUG : LOG_WARN);
                return;
            }
            if (cl__refuse_revoked(c, k))
                return;
            if (k->ws.peer_channel) {
                /* only a listener takes channels; its handshake timer
                 * still runs until the first message comes */
                if (k->role != WIRE_LISTENER) {
                    fail(k, LOG_WARN, "the node answered with a data channel's HELLO");
                    return;
                }
                k->phase = PH_CHAN;
                continue;
            }
            k->phase = PH_OPEN;
            k->last_rx_ns = k->last_ping_ns = now;
            k->next_probe_ns = now + 1000 * MS;
            cl__on_established(c, k);
        } else {
            uint8_t hdr[4];
            wire_frame f;
            if (avail < 4)
                return;
            evbuffer_copyout(in, hdr, 4);
            /* the length is checked against the limit before waiting for or
             * buffering the record: wire_open rejects it from 4 bytes */
            long r = wire_open(&k->ws, hdr, 4, c->plain, &f);
            if (r == 0 && avail >= 4 + (size_t)wire_get32(hdr)) {
                size_t n = 4 + (size_t)wire_get32(hdr);
                r = wire_open(&k->ws, evbuffer_pullup(in, (ev_ssize_t)n), n, c->plain, &f);
                evbuffer_drain(in, n);
            }
            if (r < 0) {
                fail(k, LOG_WARN, rc_errmsg());
                return;
            }
            if (r == 0)
                return;
            k->last_rx_ns = now;
            if (k->node)
                k->node->last_rx_ns = now;
            wire_msg m;
            int a = wire_asm_add(&k->as, &f, &m);
            if (a < 0) {
                fail(k, LOG_WARN, rc_errmsg());
                return;
            }
            if (a == 1 && k->phase == PH_CHAN) {
                cl__on_channel(c, k, &m);
                return;
            }
            if (a == 1)
                on_message(k, &m, now);
            if (f.final && k->phase != PH_DEAD)
                fail(k, LOG_INFO, "the peer ended its stream");
        }
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    cl_conn *k = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        k->broken = true;
        if (k->phase == PH_DEAD) {
            cl__schedule_reap(k->c);
            return;
        }
        const char *why = k->phase == PH_OPEN && !k->ws.rx_final
                          ? "connection lost (the stream ended without its final record)"
                          : (what & BEV_EVENT_EOF) ? "connection closed" : "connection failed";
        if (k->phase == PH_OPEN)
            fail(k, LOG_INFO, why);
        else {
            rc_log(LOG_DEBUG, "cluster: %s %s: %s", k->role == WIRE_DIALER ? "dial" : "accept",
                   k->peer_addr, why);
            cl__conn_close(k, NULL);
        }
    }
}

/* ---- opening ---- */

/* Heartbeats and pongs are small and must not wait for Nagle. */
static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static cl_conn *conn_new(struct cluster *c, int fd, int role, bool old_key)
{
    cl_conn *k = rc_calloc(1, sizeof *k);
    if (!k)
        return NULL;
    cl__tick_soon(c);                  /* its handshake is timed by the tick */
    k->c = c;
    k->role = role;
    k->static_idx = -1;
    k->probe_size = PROBE_MIN;
    k->t_start_ns = os_now_ns();
    wire_asm_init(&k->as, WIRE_MSG_MAX);
    k->bev = bufferevent_socket_new(c->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!k->bev) {
        rc_free(k);
        return NULL;
    }
    if (fd >= 0)
        nodelay(fd);
    bufferevent_setcb(k->bev, on_read, on_drained, on_event, k);
    bufferevent_setwatermark(k->bev, EV_WRITE, BULK_LOW / 2, 0);
    bufferevent_enable(k->bev, EV_READ | EV_WRITE);
    uint8_t hello[WIRE_HELLO_BYTES];
    /* which cluster key the handshake uses: the current one, or for a dial
     * to a member that may have missed a rotation the one before (rotate.c) */
    k->old_key = old_key;
    wire_session_init(&k->ws, old_key ? c->rot.old_key : c->key, &c->ident, role, c->major,
                      c->minor, hello);
    if (c->cfg.test_claim_id_set)
        wire_session_claim_id(&k->ws, c->cfg.test_claim_id, hello);
    bufferevent_write(k->bev, hello, sizeof hello);
    k->next = c->conns;
    c->conns = k;
    return k;
}

cl_conn *cl__conn_accept(struct cluster *c, int fd, const struct sockaddr *sa)
{
    cl_conn *k = conn_new(c, fd, WIRE_LISTENER, false);
    if (!k)
        return NULL;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        char a[INET_ADDRSTRLEN];
        k->peer_in = sin->sin_addr;
        inet_ntop(AF_INET, &sin->sin_addr, a, sizeof a);
        snprintf(k->peer_addr, sizeof k->peer_addr, "%s:%d", a, ntohs(sin->sin_port));
    }
    return k;
}

cl_conn *cl__conn_dial(struct cluster *c, const char *host, int port, bool old_key)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(host, ps, &hints, &res) != 0) {
        /* a host name: resolved here, on the cluster thread */
        hints.ai_flags = AI_NUMERICSERV;
        if (getaddrinfo(host, ps, &hints, &res) != 0 || !res) {
            rc_log(LOG_DEBUG, "cluster: cannot resolve %s", host);
            return NULL;
        }
    }
    cl_conn *k = conn_new(c, -1, WIRE_DIALER, old_key);
    if (k) {
        snprintf(k->peer_addr, sizeof k->peer_addr, "%s:%d", host, port);
        if (bufferevent_socket_connect(k->bev, res->ai_addr, (int)res->ai_addrlen) != 0) {
            k->broken = true;
            cl__conn_close(k, NULL);
            k = NULL;
        } else {
            nodelay(bufferevent_getfd(k->bev));
        }
    }
    freeaddrinfo(res);
    return k;
}

/* ---- the periodic part ---- */

/* Bytes from the peer waiting in the socket, not read yet: a node starved
 * of CPU (64 nodes starting on 2 cores) ran its tick before its reads and
 * took its own slowness for the peer's silence, closing links that were
 * fine.  Only the socket counts: part of a record already read is no sign
 * of life (a peer that sends half a record and stops is silent). */
static bool unread(cl_conn *k)
{
    int n = 0;
    return ioctl(bufferevent_getfd(k->bev), FIONREAD, &n) == 0 && n > 0;
}

/* Heartbeats: the dialler pings every heartbeat (cl__heartbeat_ns) and the listener
 * answers; the listener pings only when the dialler's pings stopped for
 * half of --down-after (a dialler of an older version pinged both ways,
 * and still does), and every RTT_EVERY_NS to keep its own round-trip
 * measure.  Any frame counts as a sign of life, so one ping and one pong
 * per period keep both ends' silence timers fed: half the frames (and
 * wake-ups) of both ends pinging.  A ping due within a quarter period is
 * sent with the others of the same tick, so that the links of a node wake
 * it together, not each on its own. */
#define RTT_EVERY_NS (10000ull * MS)

static uint64_t ping_due(const cl_conn *k)
{
    const struct cluster *c = k->c;
    uint64_t hb = cl__heartbeat_ns(c), at = k->last_ping_ns + hb;
    if (k->role == WIRE_DIALER || !k->ping_seq)
        return at;                      /* the listener's first: its round trip at once */
    uint64_t quiet = k->last_rx_ns + (uint64_t)c->cfg.down_after_ms * MS / 2,
             rtt = k->last_ping_ns + RTT_EVERY_NS, want = quiet < rtt ? quiet : rtt;
    return want > at ? want : at;
}

uint64_t cl__conn_next(const cl_conn *k, uint64_t now)
{
    if (k->phase == PH_DEAD)
        return UINT64_MAX;
    if (k->phase != PH_OPEN || k->probe_inflight || k->txq)
        return now;                     /* a handshake or a transfer: the usual pace */
    uint64_t t = k->last_rx_ns + (uint64_t)k->c->cfg.down_after_ms * MS + MS, p = ping_due(k);
    if (p < t)
        t = p;
    if (k->c->cfg.probe_ms > 0 && k->next_probe_ns < t)
        t = k->next_probe_ns;
    return t;
}

void cl__conn_tick(cl_conn *k, uint64_t now)
{
    struct cluster *c = k->c;
    if (k->phase == PH_DEAD)
        return;
    if (k->phase != PH_OPEN) {
        /* a connection that sends no HELLO holds a slot: it gets 1 s */
        uint64_t limit = k->phase == PH_HELLO && k->role == WIRE_LISTENER ? HELLO_NS : HANDSHAKE_NS;
        if (cl__since(now, k->t_start_ns) > limit) {
            rc_log(LOG_DEBUG, "cluster: handshake with %s timed out", k->peer_addr);
            if (k->role == WIRE_LISTENER)
                cl__count_refusal(c, k->peer_addr, true);
            cl__conn_close(k, NULL);
        }
        return;
    }
    /* the peer spoke and this node is slow to read it: looked at again at
     * the next tick, once read (last_rx_ns moves only with whole records) */
    if (cl__since(now, k->last_rx_ns) > (uint64_t)c->cfg.down_after_ms * MS && !unread(k)) {
        char why[96];
        snprintf(why, sizeof why, "silent for %llu ms (limit %d ms)",
                 (unsigned long long)((cl__since(now, k->last_rx_ns)) / MS), c->cfg.down_after_ms);
        uint8_t id[WIRE_ID_BYTES];
        bool had = k->node != NULL;
        if (had)
            memcpy(id, k->node->id, sizeof id);
        fail(k, LOG_WARN, why);
        if (had)
            cl__swim_suspect(c, id);   /* evidence for SWIM (with --swim) */
        return;
    }
    if (now + cl__heartbeat_ns(c) / 4 >= ping_due(k)) {
        uint8_t p[16];
        wire_put64(p, ++k->ping_seq);
        wire_put64(p + 8, now);
        seal_frame(k, WIRE_PING, 0, k->next_stream++, p, 16, false);
        k->last_ping_ns = now;
    }
    if (k->probe_inflight && cl__since(now, k->probe_t0_ns) > 30000 * MS)
        k->probe_inflight = false;
    if (!k->probe_inflight && now >= k->next_probe_ns && c->cfg.probe_ms > 0 && !k->txq &&
        cl__conn_pending(k) < BULK_LOW) {
        uint8_t *buf = rc_calloc(1, k->probe_size);
        if (buf) {
            k->probe_id++;
            wire_put64(buf, k->probe_id);
            k->probe_t0_ns = now;
            k->probe_inflight = true;
            if (cl__conn_send(k, WIRE_PROBE, buf, k->probe_size, false))
                k->probe_inflight = false;
            rc_free(buf);
        }
        k->next_probe_ns = now + probe_gap(c);
    }
}
