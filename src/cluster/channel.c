/* channel.c - a data channel read and written by its owner thread
 * (channel.h).
 *
 * A message is sealed whole into the send buffer (frames of at most
 * WIRE_PAYLOAD_MAX, all but the last marked WIRE_F_MORE, one stream id)
 * and written as the socket takes it; received bytes are opened a record
 * at a time and reassembled as on the cluster link (wire_asm).  Writes
 * and reads of all channels of an exchange interleave in one poll loop,
 * so two shards sending each other megabytes never wait on each other.
 */
#include "channel.h"

#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0       /* macOS: SO_NOSIGPIPE is set on the socket instead */
#endif

#define SLICE_MS 100

struct cluster_chan {
    int fd;
    wire_session ws;
    char peer[33];
    uint32_t next_stream;
    bool failed;
    char why[160];
    /* sending */
    uint8_t *tx;
    size_t tx_len, tx_off, tx_cap;
    /* receiving: raw records, then the message being assembled */
    uint8_t *rx;
    size_t rx_len, rx_off, rx_cap;
    uint8_t *plain;           /* WIRE_FRAME_MAX, from the first record read */
    wire_asm as;
    wire_msg got;             /* the message received, while msg_done */
    bool msg_done;
    uint64_t bytes_out;
};

cluster_chan *chan_new(int fd, const wire_session *ws, const uint8_t *pending, size_t n,
                       const char *peer)
{
    cluster_chan *ch = rc_calloc(1, sizeof *ch);
    if (ch && n)
        ch->rx = rc_malloc(ch->rx_cap = n > 65536 ? n : 65536);
    if (!ch || (n && !ch->rx)) {
        rc_free(ch);
        close(fd);
        return NULL;
    }
    ch->fd = fd;
    ch->ws = *ws;
    wire_asm_init(&ch->as, WIRE_MSG_MAX);
    snprintf(ch->peer, sizeof ch->peer, "%s", peer);
    if (n) {
        memcpy(ch->rx, pending, n);
        ch->rx_len = n;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    return ch;
}

void chan_free(cluster_chan *ch)
{
    if (!ch)
        return;
    close(ch->fd);
    wire_session_wipe(&ch->ws);
    rc_free(ch->tx);
    rc_free(ch->rx);
    rc_free(ch->plain);
    wire_asm_free(&ch->as);
    rc_free(ch);
}

const char *chan_peer(const cluster_chan *ch) { return ch->peer; }
uint64_t chan_bytes_out(const cluster_chan *ch) { return ch->bytes_out; }

/* The channel fails for good; the error names the peer. */
static int chan_fail(cluster_chan *ch, int code, const char *why)
{
    if (!ch->failed) {
        ch->failed = true;
        snprintf(ch->why, sizeof ch->why, "%s", why);
    }
    return rc_fail(code, "data channel to node %.8s: %s", ch->peer, ch->why);
}

static int seal_message(cluster_chan *ch, int type, const uint8_t *d, size_t n)
{
    if (n > WIRE_MSG_MAX)
        return rc_fail(RC_ELIMIT, "message of %zu bytes (limit %u)", n, WIRE_MSG_MAX);
    size_t frames = n ? (n + WIRE_PAYLOAD_MAX - 1) / WIRE_PAYLOAD_MAX : 1;
    size_t need = n + frames * wire_record_bytes(0);
    if (need > ch->tx_cap) {
        uint8_t *p = rc_realloc(ch->tx, need);
        if (!p)
            return rc_fail(RC_ENOMEM, "sealing %zu bytes for node %.8s", n, ch->peer);
        ch->tx = p;
        ch->tx_cap = need;
    }
    uint32_t stream = ch->next_stream++;
    size_t at = 0, off = 0;
    do {
        size_t k = n - off > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : n - off;
        bool last = off + k == n;
        long r = wire_seal(&ch->ws, (uint8_t)type, last ? 0 : WIRE_F_MORE, stream, d + off, k,
                           false, ch->tx + at);
        if (r < 0)
            return chan_fail(ch, RC_ESTATE, rc_errmsg());
        at += (size_t)r;
        off += k;
    } while (off < n);
    ch->tx_len = at;
    ch->tx_off = 0;
    return 0;
}

/* Opens the records already read, up to the end of one message.  1 when a
 * message is complete, 0 when more bytes are needed, negative on error. */
static int parse(cluster_chan *ch)
{
    while (!ch->msg_done) {
        size_t avail = ch->rx_len - ch->rx_off;
        if (avail < 4)
            return 0;
        wire_frame f;
        const uint8_t *rec = ch->rx + ch->rx_off;
        if (!ch->plain && !(ch->plain = rc_malloc(WIRE_FRAME_MAX)))
            return chan_fail(ch, RC_ENOMEM, "out of memory for a record");
        /* the length is checked before waiting for the record's bytes */
        long r = wire_open(&ch->ws, rec, 4, ch->plain, &f);
        if (r == 0 && avail >= 4 + (size_t)wire_get32(rec))
            r = wire_open(&ch->ws, rec, 4 + (size_t)wire_get32(rec), ch->plain, &f);
        if (r < 0)
            return chan_fail(ch, RC_EFORMAT, rc_errmsg());
        if (r == 0)
            return 0;
        ch->rx_off += (size_t)r;
        if (f.final)
            return chan_fail(ch, RC_EIO, "the peer closed the channel");
        /* a one-frame message stays in plain until the next record is opened */
        int a = wire_asm_add(&ch->as, &f, &ch->got);
        if (a < 0)
            return chan_fail(ch, a, rc_errmsg());
        ch->msg_done = a == 1;
    }
    return 1;
}

static int do_write(cluster_chan *ch)
{
    while (ch->tx_off < ch->tx_len) {
        ssize_t w = send(ch->fd, ch->tx + ch->tx_off, ch->tx_len - ch->tx_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return chan_fail(ch, RC_EIO, strerror(errno));
        }
        ch->tx_off += (size_t)w;
        ch->bytes_out += (uint64_t)w;
    }
    return 0;
}

static int do_read(cluster_chan *ch)
{
    if (ch->rx_off == ch->rx_len)
        ch->rx_off = ch->rx_len = 0;
    else if (ch->rx_off > 0 && ch->rx_cap - ch->rx_len < 65536) {
        memmove(ch->rx, ch->rx + ch->rx_off, ch->rx_len - ch->rx_off);
        ch->rx_len -= ch->rx_off;
        ch->rx_off = 0;
    }
    /* room for the whole record being read, so one read can finish it */
    size_t want = 65536;
    if (ch->rx_len - ch->rx_off >= 4) {
        size_t rec = 4 + (size_t)wire_get32(ch->rx + ch->rx_off);
        if (rec <= WIRE_REC_MAX && rec > ch->rx_len - ch->rx_off)
            want = rec - (ch->rx_len - ch->rx_off);
    }
    if (ch->rx_cap - ch->rx_len < want) {
        size_t cap = ch->rx_cap ? ch->rx_cap : 65536;
        while (cap - ch->rx_len < want)
            cap *= 2;
        uint8_t *p = rc_realloc(ch->rx, cap);
        if (!p)
            return chan_fail(ch, RC_ENOMEM, "out of memory for received bytes");
        ch->rx = p;
        ch->rx_cap = cap;
    }
    for (;;) {
        ssize_t r = recv(ch->fd, ch->rx + ch->rx_len, ch->rx_cap - ch->rx_len, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return chan_fail(ch, RC_EIO, strerror(errno));
        }
        if (r == 0)
            return chan_fail(ch, RC_EIO, "connection closed by the peer");
        ch->rx_len += (size_t)r;
        return 0;
    }
}

int chan_exchange(chan_io *io, int n, int timeout_ms, chan_abort_fn ab, void *ud)
{
    struct pollfd pf[16];
    if (n > 16)
        return rc_fail(RC_ELIMIT, "%d channels in one exchange (limit 16)", n);
    for (int i = 0; i < n; i++) {
        cluster_chan *ch = io[i].ch;
        if (ch->failed)
            return rc_fail(RC_EIO, "data channel to node %.8s: %s", ch->peer, ch->why);
        io[i].in = NULL;
        io[i].in_len = 0;
        if (io[i].want_in)
            ch->msg_done = false;       /* the last message was handed out */
        int rc = io[i].out ? seal_message(ch, io[i].out_type, io[i].out, io[i].out_len) : 0;
        if (!rc && io[i].out)
            rc = do_write(ch);
        if (!rc && io[i].want_in)
            rc = parse(ch) < 0 ? RC_EIO : 0;
        if (rc)
            return rc_fail(RC_EIO, "data channel to node %.8s: %s", ch->peer, ch->why[0] ? ch->why
                                                                                  : rc_errmsg());
    }
    uint64_t t0 = os_now_ns();
    for (;;) {
        int waiting = 0, late = -1;
        for (int i = 0; i < n; i++) {
            cluster_chan *ch = io[i].ch;
            short ev = (short)((ch->tx_off < ch->tx_len ? POLLOUT : 0) |
                               (io[i].want_in && !ch->msg_done ? POLLIN : 0));
            pf[i] = (struct pollfd){ .fd = ev ? ch->fd : -1, .events = ev };
            waiting += ev != 0;
            if (ev && late < 0)
                late = i;
        }
        if (!waiting)
            break;
        int slice = SLICE_MS;
        if (timeout_ms >= 0) {
            uint64_t spent = (os_now_ns() - t0) / 1000000u;
            if (spent >= (uint64_t)timeout_ms)
                return rc_fail(RC_EIO, "data channel to node %.8s: nothing %s within %d ms",
                               io[late].ch->peer, pf[late].events & POLLIN ? "received"
                                                                           : "taken", timeout_ms);
            if ((uint64_t)timeout_ms - spent < (uint64_t)slice)
                slice = (int)((uint64_t)timeout_ms - spent);
        }
        int r = poll(pf, (nfds_t)n, slice);
        if (r < 0 && errno != EINTR)
            return rc_fail(RC_EIO, "poll: %s", strerror(errno));
        if (r == 0) {
            char why[200] = "";
            if (ab && ab(ud, why, sizeof why))
                return rc_fail(RC_EIO, "%s", why);
            continue;
        }
        for (int i = 0; i < n && r > 0; i++) {
            cluster_chan *ch = io[i].ch;
            int rc = 0;
            if (pf[i].revents & POLLOUT)
                rc = do_write(ch);
            if (!rc && (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) && io[i].want_in &&
                !ch->msg_done && !(rc = do_read(ch)))
                rc = parse(ch) < 0 ? RC_EIO : 0;
            if (!rc && (pf[i].revents & (POLLHUP | POLLERR)) && ch->tx_off < ch->tx_len)
                rc = chan_fail(ch, RC_EIO, "connection lost");
            if (rc)
                return rc_fail(RC_EIO, "data channel to node %.8s: %s", ch->peer, ch->why);
        }
    }
    for (int i = 0; i < n; i++)
        if (io[i].want_in) {
            io[i].in_type = io[i].ch->got.type;
            io[i].in = io[i].ch->got.data;
            io[i].in_len = io[i].ch->got.len;
        }
    return 0;
}

int chan_send(cluster_chan *ch, int type, const void *d, size_t n, int timeout_ms)
{
    chan_io io = { .ch = ch, .out_type = type, .out = d ? d : "", .out_len = n };
    return chan_exchange(&io, 1, timeout_ms, NULL, NULL);
}

int chan_recv(cluster_chan *ch, int *type, const uint8_t **d, size_t *n, int timeout_ms)
{
    chan_io io = { .ch = ch, .want_in = true };
    int rc = chan_exchange(&io, 1, timeout_ms, NULL, NULL);
    if (!rc) {
        *type = io.in_type;
        *d = io.in;
        *n = io.in_len;
    }
    return rc;
}

/* ---- opening (the dialling side; the listening side is the cluster's
 * listener, peer.c) ---- */

/* Blocking helpers for the handshake, bounded by the deadline. */
static int io_full(int fd, bool wr, void *buf, size_t n, uint64_t deadline)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        uint64_t now = os_now_ns();
        if (now >= deadline)
            return rc_fail(RC_EIO, "timed out");
        struct pollfd pf = { .fd = fd, .events = wr ? POLLOUT : POLLIN };
        int r = poll(&pf, 1, (int)((deadline - now) / 1000000u) + 1);
        if (r < 0 && errno != EINTR)
            return rc_fail(RC_EIO, "poll: %s", strerror(errno));
        if (r <= 0)
            continue;
        ssize_t k = wr ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k < 0)
            return rc_fail(RC_EIO, "%s", strerror(errno));
        if (k == 0)
            return rc_fail(RC_EIO, "connection closed during the handshake");
        done += (size_t)k;
    }
    return 0;
}

static int connect_to(const char *host, int port, uint64_t deadline, int *out)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return rc_fail(RC_EINVAL, "%s is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return rc_fail(RC_EIO, "socket: %s", strerror(errno));
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return rc_fail(RC_EIO, "connect to %s:%d: %s", host, port, strerror(e));
    }
    struct pollfd pf = { .fd = fd, .events = POLLOUT };
    uint64_t now = os_now_ns();
    int r = now < deadline ? poll(&pf, 1, (int)((deadline - now) / 1000000u) + 1) : 0;
    int err = 0;
    socklen_t len = sizeof err;
    if (r <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
        close(fd);
        return rc_fail(RC_EIO, "connect to %s:%d: %s", host, port,
                       r <= 0 ? "timed out" : strerror(err));
    }
    *out = fd;
    return 0;
}

int chan_dial(const char *host, int port, const uint8_t key[WIRE_KEY_BYTES],
              const wire_identity *self, int major, int minor,
              const uint8_t peer_id[WIRE_ID_BYTES], int timeout_ms, cluster_chan **out)
{
    uint64_t deadline = os_now_ns() + (uint64_t)timeout_ms * 1000000u;
    int fd = -1, rc = connect_to(host, port, deadline, &fd);
    if (rc)
        return rc;
    wire_session ws;
    uint8_t hello[WIRE_HELLO_BYTES], auth[WIRE_AUTH_BYTES];
    wire_session_init(&ws, key, self, WIRE_DIALER, major, minor, hello);
    wire_session_mark_channel(&ws, hello);
    /* the version first: a node of another major sends a HELLO of another
     * length, and closes */
    if (!(rc = io_full(fd, true, hello, sizeof hello, deadline)) &&
        !(rc = io_full(fd, false, hello, WIRE_HELLO_PREFIX, deadline)) &&
        !(rc = wire_hello_prefix(&ws, hello, WIRE_HELLO_PREFIX)) &&
        !(rc = io_full(fd, false, hello + WIRE_HELLO_PREFIX, sizeof hello - WIRE_HELLO_PREFIX,
                       deadline)) &&
        !(rc = wire_on_hello(&ws, hello, auth))) {
        if (memcmp(ws.peer_id, peer_id, WIRE_ID_BYTES))
            rc = rc_fail(RC_EINVAL, "%s:%d is another node", host, port);
    }
    if (!rc && !(rc = io_full(fd, true, auth, sizeof auth, deadline)) &&
        !(rc = io_full(fd, false, auth, sizeof auth, deadline)))
        rc = wire_on_auth(&ws, auth);
    if (rc) {
        close(fd);
        wire_session_wipe(&ws);
        return rc;
    }
    char idh[2 * WIRE_ID_BYTES + 1];
    wire_hex(peer_id, WIRE_ID_BYTES, idh);
    *out = chan_new(fd, &ws, NULL, 0, idh);
    wire_session_wipe(&ws);
    return *out ? 0 : rc_fail(RC_ENOMEM, "out of memory for a data channel");
}
