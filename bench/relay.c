/* relay.c - a TCP relay that adds a one-way delay, for emulating network
 * links in benchmarks (bench/pipeline.sh).  The kernel here has no netem
 * qdisc, so latency is added in user space: every chunk read from one side
 * is written to the other no earlier than DELAY microseconds after it was
 * read, in order.  With -r each direction is also a wire of that rate: a
 * chunk is serialised after the one before it (len * 8 / rate seconds) and
 * then delayed.  (tc tbf would not do here: its burst, at least rate/HZ,
 * lets a message of a few KiB through at veth speed, so a 4 KiB message
 * would never see the 33 us it takes on 1 Gbit/s.)
 *
 *   racimo-relay [-d DELAY_US] [-r BITS_PER_S] [-s SPIN_US] [-c] LISTEN=TARGET ...
 *
 * Each pair is a listener; each accepted connection dials its target and
 * bytes flow both ways.  SIGUSR1 prints the byte counters of every pair
 * (both directions, closed connections included) on stdout; SIGTERM and
 * SIGINT print them and exit.  With -c the relay also follows racimo's
 * cluster records (docs/cluster-protocol.md: a 92-byte HELLO and 56-byte
 * AUTH in clear, then records of "u32 BE length | ciphertext") and counts
 * records under 64 KiB apart from larger ones: the link's bandwidth probes
 * (64 KiB to 16 MiB, every 10 s) and prompt batches are large, a decode
 * step's message is a few KiB, so the small count gives bytes per token.  One thread, epoll, non-blocking sockets, a
 * timerfd armed at the earliest pending delivery (timer slack set to 1 ns,
 * as the default 50 us would swamp a 50 us delay).  On the VMs this was
 * written on a timer fires ~55 us late (median; 75 us p90), so the timer is
 * armed SPIN_US (default 60) early and the rest is waited by spinning on
 * the clock: a chunk still never leaves before its time.
 *
 * A standalone program, not part of the racimo library: it uses plain
 * malloc and knows nothing of the cluster protocol (it forwards ciphertext).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAIRS 8
#define MAX_CONNS 64
#define CHUNK_MAX 65536
/* stop reading a side while this much waits to be delivered from it */
#define QUEUE_CAP (8u << 20)

enum { TAG_LISTEN = 1, TAG_CONN = 2, TAG_TIMER = 3, TAG_SIGNAL = 4 };

struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len, off;
    unsigned char data[];
};

struct dir {             /* bytes read from fd[from], written to fd[1 - from] */
    struct chunk *head, *tail;
    size_t queued;
    bool eof;            /* the reading side closed its write half */
    bool shut;           /* and we passed that on (shutdown SHUT_WR) */
    bool blocked;        /* the writing side said EAGAIN: wait for EPOLLOUT */
    uint64_t wire_free_ns;   /* the emulated wire is busy until then (-r) */
    /* -c: where the record stream is */
    uint64_t skip;       /* clear handshake bytes still to pass */
    uint64_t rec_left;   /* bytes of the current record's ciphertext to pass */
    unsigned hdr_have;
    unsigned char hdr[4];
};

struct pair {
    char listen[64], target[64];
    struct sockaddr_in la, ta;
    int fd;
    uint64_t conns, bytes[2], reads[2];   /* [0]: to the target, [1]: back */
    uint64_t small_recs[2], small_bytes[2], large_recs[2], large_bytes[2];
};

struct conn {
    bool used, connecting;
    int pair;
    int fd[2];           /* 0: the accepted client, 1: the dialled target */
    struct dir d[2];     /* d[0]: client -> target, d[1]: target -> client */
    uint32_t ev[2];      /* epoll interest now registered per fd */
};

static struct pair pairs[MAX_PAIRS];
static int n_pairs;
static struct conn conns[MAX_CONNS];
static int ep, tfd;
static uint64_t delay_ns, spin_ns = 60000, rate_bps;
static bool parse_records;

#define HANDSHAKE_BYTES (92 + 56)
#define SMALL_RECORD (64u << 10)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t tag(int kind, int idx, int side)
{
    return (uint64_t)kind << 32 | (uint64_t)(idx * 2 + side);
}

static int parse_addr(const char *s, struct sockaddr_in *a)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (*end || port <= 0 || port > 65535 || inet_pton(AF_INET, host, &a->sin_addr) != 1)
        return -1;
    return 0;
}

/* One line per pair, key=value; "to" is towards the target, "back" the
 * other way; *_small and *_large only with -c. */
static void print_counters(void)
{
    for (int i = 0; i < n_pairs; i++) {
        struct pair *p = &pairs[i];
        printf("relay %s=%s conns=%llu", p->listen, p->target, (unsigned long long)p->conns);
        for (int s = 0; s < 2; s++) {
            const char *d = s ? "back" : "to";
            printf(" %s_bytes=%llu %s_reads=%llu", d, (unsigned long long)p->bytes[s], d,
                   (unsigned long long)p->reads[s]);
            if (parse_records)
                printf(" %s_small_recs=%llu %s_small_bytes=%llu %s_large_recs=%llu %s_large_bytes=%llu",
                       d, (unsigned long long)p->small_recs[s], d,
                       (unsigned long long)p->small_bytes[s], d,
                       (unsigned long long)p->large_recs[s], d,
                       (unsigned long long)p->large_bytes[s]);
        }
        printf("\n");
    }
    fflush(stdout);
}

/* Follows the record framing over n more bytes of direction s (-c). */
static void count_records(struct pair *p, struct dir *d, int s, const unsigned char *b, size_t n)
{
    while (n) {
        if (d->skip) {
            size_t k = d->skip < n ? (size_t)d->skip : n;
            d->skip -= k, b += k, n -= k;
        } else if (d->rec_left) {
            size_t k = d->rec_left < n ? (size_t)d->rec_left : n;
            d->rec_left -= k, b += k, n -= k;
        } else {
            d->hdr[d->hdr_have++] = *b++;
            n--;
            if (d->hdr_have < 4)
                continue;
            d->hdr_have = 0;
            d->rec_left = (uint64_t)d->hdr[0] << 24 | (uint64_t)d->hdr[1] << 16 |
                          (uint64_t)d->hdr[2] << 8 | d->hdr[3];
            uint64_t total = 4 + d->rec_left;
            if (total < SMALL_RECORD)
                p->small_recs[s]++, p->small_bytes[s] += total;
            else
                p->large_recs[s]++, p->large_bytes[s] += total;
        }
    }
}

static void conn_close(struct conn *k, const char *why)
{
    for (int s = 0; s < 2; s++) {
        if (k->fd[s] >= 0)
            close(k->fd[s]);   /* also leaves the epoll set */
        k->fd[s] = -1;
        for (struct chunk *c = k->d[s].head, *n; c; c = n) {
            n = c->next;
            free(c);
        }
    }
    if (why)
        fprintf(stderr, "relay: connection via %s closed: %s\n", pairs[k->pair].listen, why);
    memset(k, 0, sizeof *k);
}

/* Registers the interest each fd has now: reading while its direction is
 * open and not over its cap (the target only once connected), writing
 * while a due chunk waits on EAGAIN (or the connect is pending). */
static void update(struct conn *k)
{
    int idx = (int)(k - conns);
    for (int s = 0; s < 2; s++) {
        uint32_t want = 0;
        struct dir *in = &k->d[s], *out = &k->d[1 - s];
        if (!in->eof && in->queued < QUEUE_CAP && !(s == 1 && k->connecting))
            want |= EPOLLIN;
        if ((s == 1 && k->connecting) || out->blocked)
            want |= EPOLLOUT;
        if (want == k->ev[s])
            continue;
        struct epoll_event e = { .events = want, .data.u64 = tag(TAG_CONN, idx, s) };
        epoll_ctl(ep, EPOLL_CTL_MOD, k->fd[s], &e);
        k->ev[s] = want;
    }
}

/* Writes the due chunks of direction s; returns -1 when the connection died. */
static int flush_dir(struct conn *k, int s, uint64_t now)
{
    struct dir *d = &k->d[s];
    int to = k->fd[1 - s];
    if (s == 0 && k->connecting)
        return 0;
    while (d->head && d->head->due_ns <= now) {
        struct chunk *c = d->head;
        ssize_t w = send(to, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                d->blocked = true;
                return 0;
            }
            if (errno == EINTR)
                continue;
            return -1;
        }
        d->blocked = false;
        c->off += (size_t)w;
        if (c->off < c->len)
            continue;
        d->queued -= c->len;
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        free(c);
    }
    d->blocked = false;
    if (!d->head && d->eof && !d->shut) {
        shutdown(to, SHUT_WR);
        d->shut = true;
    }
    return 0;
}

/* Reads what side s has, stamping each chunk with its delivery time. */
static int read_side(struct conn *k, int s)
{
    struct dir *d = &k->d[s];
    struct pair *p = &pairs[k->pair];
    while (!d->eof && d->queued < QUEUE_CAP) {
        struct chunk *c = malloc(sizeof *c + CHUNK_MAX);
        if (!c)
            return -1;
        ssize_t r = recv(k->fd[s], c->data, CHUNK_MAX, 0);
        if (r <= 0) {
            free(c);
            if (r == 0) {
                d->eof = true;
                break;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->next = NULL;
        c->len = (size_t)r;
        c->off = 0;
        uint64_t t = now_ns();
        if (rate_bps) {
            if (d->wire_free_ns > t)
                t = d->wire_free_ns;
            t += (uint64_t)((double)r * 8e9 / (double)rate_bps);
            d->wire_free_ns = t;
        }
        c->due_ns = t + delay_ns;
        if (d->tail)
            d->tail->next = c;
        else
            d->head = c;
        d->tail = c;
        d->queued += (size_t)r;
        p->bytes[s] += (uint64_t)r;
        p->reads[s]++;
        if (parse_records)
            count_records(p, d, s, c->data, c->len);
    }
    return 0;
}

static void on_accept(int pi)
{
    struct pair *p = &pairs[pi];
    for (;;) {
        int cfd = accept4(p->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
            return;
        int i = 0;
        while (i < MAX_CONNS && conns[i].used)
            i++;
        int tfd2 = i < MAX_CONNS ? socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) : -1;
        if (tfd2 < 0) {
            fprintf(stderr, "relay: refusing a connection on %s: %s\n", p->listen,
                    i < MAX_CONNS ? strerror(errno) : "too many connections");
            close(cfd);
            continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(tfd2, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *k = &conns[i];
        memset(k, 0, sizeof *k);
        k->used = true;
        k->pair = pi;
        k->fd[0] = cfd;
        k->fd[1] = tfd2;
        k->connecting = true;
        k->d[0].skip = k->d[1].skip = HANDSHAKE_BYTES;
        p->conns++;
        if (connect(tfd2, (struct sockaddr *)&p->ta, sizeof p->ta) < 0 && errno != EINPROGRESS) {
            fprintf(stderr, "relay: cannot dial %s: %s\n", p->target, strerror(errno));
            conn_close(k, NULL);
            continue;
        }
        for (int s = 0; s < 2; s++) {
            struct epoll_event e = { .events = 0, .data.u64 = tag(TAG_CONN, i, s) };
            epoll_ctl(ep, EPOLL_CTL_ADD, k->fd[s], &e);
        }
        update(k);
    }
}

static void on_conn_event(int idx, int s, uint32_t events, uint64_t now)
{
    struct conn *k = &conns[idx];
    if (!k->used)
        return;
    if (s == 1 && k->connecting) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(k->fd[1], SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            fprintf(stderr, "relay: cannot dial %s: %s\n", pairs[k->pair].target, strerror(err));
            conn_close(k, NULL);
            return;
        }
        k->connecting = false;
    }
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && read_side(k, s)) {
        conn_close(k, strerror(errno));
        return;
    }
    if (flush_dir(k, 0, now) || flush_dir(k, 1, now)) {
        conn_close(k, strerror(errno));
        return;
    }
    if (k->d[0].shut && k->d[1].shut) {
        conn_close(k, NULL);
        return;
    }
    update(k);
}

/* The earliest delivery still waiting (not on EAGAIN), or UINT64_MAX. */
static uint64_t next_due(void)
{
    uint64_t next = UINT64_MAX;
    for (int i = 0; i < MAX_CONNS; i++)
        for (int s = 0; conns[i].used && s < 2; s++) {
            struct dir *d = &conns[i].d[s];
            if (d->head && !d->blocked && !(s == 0 && conns[i].connecting) && d->head->due_ns < next)
                next = d->head->due_ns;
        }
    return next;
}

static void arm_timer(void)
{
    uint64_t next = next_due();
    struct itimerspec its = { 0 };
    if (next != UINT64_MAX) {
        next = next > spin_ns ? next - spin_ns : 1;
        its.it_value.tv_sec = (time_t)(next / 1000000000ull);
        its.it_value.tv_nsec = (long)(next % 1000000000ull);
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void usage(void)
{
    fprintf(stderr, "usage: racimo-relay [-d DELAY_US] [-r BITS_PER_S] [-s SPIN_US] [-c] LISTEN_IP:PORT=TARGET_IP:PORT ...\n"
                    "  forwards TCP both ways, each chunk no earlier than DELAY_US microseconds\n"
                    "  after it was read (default 0), after the chunks before it went through a\n"
                    "  wire of BITS_PER_S (10gbit, 1gbit, 100mbit or a number; default none);\n"
                    "  the timer is armed SPIN_US early (default 60) and the rest spun;\n"
                    "  SIGUSR1 prints byte counters; -c counts racimo cluster records too\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int i = 1;
    for (;;) {
        if (i < argc && !strcmp(argv[i], "-c")) {
            parse_records = true;
            i++;
            continue;
        }
        if (!(i + 1 < argc && (!strcmp(argv[i], "-d") || !strcmp(argv[i], "-s") || !strcmp(argv[i], "-r"))))
            break;
        if (argv[i][1] == 'r') {
            char *end;
            double bps = strtod(argv[i + 1], &end);
            double mul = !strcmp(end, "gbit") ? 1e9 : !strcmp(end, "mbit") ? 1e6 : !*end ? 1 : 0;
            if (!mul || !(bps * mul >= 1e3) || bps * mul > 1e12) {
                fprintf(stderr, "racimo-relay: -r wants bits/s from 1000 to 1e12 (or Ngbit, Nmbit), not '%s'\n",
                        argv[i + 1]);
                return 2;
            }
            rate_bps = (uint64_t)(bps * mul);
            i += 2;
            continue;
        }
        char *end;
        long long us = strtoll(argv[i + 1], &end, 10);
        if (*end || us < 0 || us > 10000000) {
            fprintf(stderr, "racimo-relay: %s wants microseconds from 0 to 10000000, not '%s'\n",
                    argv[i], argv[i + 1]);
            return 2;
        }
        *(argv[i][1] == 'd' ? &delay_ns : &spin_ns) = (uint64_t)us * 1000u;
        i += 2;
    }
    if (i >= argc)
        usage();
    for (; i < argc; i++) {
        if (n_pairs == MAX_PAIRS) {
            fprintf(stderr, "racimo-relay: at most %d pairs\n", MAX_PAIRS);
            return 2;
        }
        struct pair *p = &pairs[n_pairs];
        const char *eq = strchr(argv[i], '=');
        if (!eq || (size_t)(eq - argv[i]) >= sizeof p->listen || strlen(eq + 1) >= sizeof p->target) {
            fprintf(stderr, "racimo-relay: '%s' is not LISTEN_IP:PORT=TARGET_IP:PORT\n", argv[i]);
            return 2;
        }
        memcpy(p->listen, argv[i], (size_t)(eq - argv[i]));
        snprintf(p->target, sizeof p->target, "%s", eq + 1);
        if (parse_addr(p->listen, &p->la) || parse_addr(p->target, &p->ta)) {
            fprintf(stderr, "racimo-relay: bad address in '%s' (want IPv4:port=IPv4:port)\n", argv[i]);
            return 2;
        }
        n_pairs++;
    }

    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGUSR1);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    ep = epoll_create1(EPOLL_CLOEXEC);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (sfd < 0 || ep < 0 || tfd < 0) {
        perror("racimo-relay: setup");
        return 1;
    }
    struct epoll_event e = { .events = EPOLLIN, .data.u64 = tag(TAG_TIMER, 0, 0) };
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &e);
    e.data.u64 = tag(TAG_SIGNAL, 0, 0);
    epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &e);
    for (int pi = 0; pi < n_pairs; pi++) {
        struct pair *p = &pairs[pi];
        int one = 1;
        p->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (p->fd < 0 || setsockopt(p->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
            bind(p->fd, (struct sockaddr *)&p->la, sizeof p->la) || listen(p->fd, 16)) {
            fprintf(stderr, "racimo-relay: cannot listen on %s: %s\n", p->listen, strerror(errno));
            return 1;
        }
        e.data.u64 = tag(TAG_LISTEN, pi, 0);
        epoll_ctl(ep, EPOLL_CTL_ADD, p->fd, &e);
        fprintf(stderr, "relay: %s -> %s, one-way delay %llu us, rate %.3g bit/s\n", p->listen,
                p->target, (unsigned long long)(delay_ns / 1000), (double)rate_bps);
    }

    for (;;) {
        struct epoll_event evs[32];
        int n = epoll_wait(ep, evs, 32, -1);
        if (n < 0 && errno != EINTR) {
            perror("racimo-relay: epoll_wait");
            return 1;
        }
        uint64_t now = now_ns();
        bool timer = false;
        for (int j = 0; j < n; j++) {
            uint64_t t = evs[j].data.u64;
            int kind = (int)(t >> 32), idx = (int)(t & 0xffffffffu) / 2, side = (int)(t & 1);
            if (kind == TAG_LISTEN) {
                on_accept(idx);
            } else if (kind == TAG_CONN) {
                on_conn_event(idx, side, evs[j].events, now);
            } else if (kind == TAG_TIMER) {
                uint64_t ticks;
                while (read(tfd, &ticks, sizeof ticks) > 0)
                    ;
                timer = true;
            } else if (kind == TAG_SIGNAL) {
                struct signalfd_siginfo si;
                while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                    print_counters();
                    if (si.ssi_signo != SIGUSR1)
                        return 0;
                }
            }
        }
        if (timer) {
            uint64_t due = next_due();
            while ((now = now_ns()) < due && due - now <= spin_ns)
                ;
            for (int c = 0; c < MAX_CONNS; c++)
                if (conns[c].used)
                    on_conn_event(c, 0, 0, now);
        }
        arm_timer();
    }
}
