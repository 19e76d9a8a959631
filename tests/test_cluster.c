/* test_cluster.c - live clusters in one process over loopback: the state
 * directory and the node's key, linking, gossip, the view, large messages,
 * refusals (wrong key, other protocol version, a claimed id, a key not
 * held), handshake limits, hostile frames from a hand-driven peer, data
 * channels,
 * heartbeat timeouts and rejoining after a restart, removing a node and
 * rotating the cluster key.  Timings are shortened
 * (100 ms heartbeats, down after 600 ms); waits poll with generous limits. */
#include "test.h"

#include "base/err.h"
#include "base/os.h"
#include "cluster/channel.h"
#include "cluster/cluster.h"
#include "cluster/wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define DOWN_MS 600

/* links lost, in every node of the test (a rotation must lose none) */
static atomic_int n_downs;
static void count_down(void *ud, const char *id)
{
    (void)ud;
    (void)id;
    atomic_fetch_add(&n_downs, 1);
}

/* racimo serve --swim: 1 on, -1 off, 0 as RACIMO_TEST_SWIM says (=1 runs
 * every cluster test so: SWIM then decides up/down, the leader and quorum) */
static int start_with_swim;

static bool env_swim(void)
{
    const char *e = getenv("RACIMO_TEST_SWIM");
    return e && !strcmp(e, "1");
}

/* A test whose hand-made peer speaks the links' protocol but not SWIM:
 * with SWIM deciding, such a peer is (rightly) down at its first missed
 * probe, so the test's point - the links' handshake - is made without. */
#define MESH_ONLY() do {                                                        \
        if (env_swim())                                                         \
            SKIP("a hand-made peer without SWIM (RACIMO_TEST_SWIM=1)");         \
    } while (0)

static int cfg_neighbours, cfg_idle_ms;   /* > 0: cluster_config.swim_neighbours, link_idle_ms */
static int cfg_measure_age_ms;             /* > 0: cluster_config.measure_max_age_ms */
static cluster_msg_fn cfg_handler;         /* installed for 0x40-0x7f when set */

static struct cluster *start_node(const char *dir_name, const char *token, const char *peer,
                                  int major)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), dir_name);
    const char *peers[1] = { peer };
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.join_token = token;
    cfg.listen_host = "127.0.0.1";
    cfg.port = 0;
    cfg.port_given = true;
    cfg.peers = peers;
    cfg.n_peers = peer ? 1 : 0;
    cfg.name = dir_name;
    cfg.no_discovery = true;
    cfg.swim = start_with_swim > 0 || (start_with_swim == 0 && env_swim());
    cfg.heartbeat_ms = 100;
    cfg.down_after_ms = DOWN_MS;
    cfg.probe_ms = 300;
    /* a rotation must not expire while a loaded, sanitized run redials */
    cfg.key_confirm_ms = 600000;
    cfg.bench = 0;
    cfg.proto_major = major;
    cfg.http_port = 8080;
    cfg.swim_neighbours = cfg_neighbours;
    cfg.link_idle_ms = cfg_idle_ms;
    cfg.measure_max_age_ms = cfg_measure_age_ms;
    struct cluster *c;
    CHECK_OK(cluster_new(&cfg, &c, NULL));
    CHECK_OK(cluster_add_down_handler(c, count_down, NULL));
    if (cfg_handler)
        CHECK_OK(cluster_add_handler(c, 0x40, 0x7f, cfg_handler, NULL));
    CHECK_OK(cluster_start(c));
    return c;
}

static void addr_of(struct cluster *c, char *out, size_t cap)
{
    snprintf(out, cap, "127.0.0.1:%d", cluster_port(c));
}

static json_t *find_node(json_t *snap, const char *id)
{
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(snap, "nodes"), i, n)
        if (!strcmp(json_string_value(json_object_get(n, "id")), id))
            return n;
    return NULL;
}

/* "up", "down" or "absent" */
static const char *state_of(struct cluster *c, const char *id)
{
    static char buf[16];
    json_t *s = cluster_snapshot(c);
    json_t *n = find_node(s, id);
    snprintf(buf, sizeof buf, "%s", n ? json_string_value(json_object_get(n, "state")) : "absent");
    json_decref(s);
    return buf;
}

static int wait_state(struct cluster *c, const char *id, const char *want, int ms)
{
    for (int t = 0; t < ms; t += 20) {
        if (!strcmp(state_of(c, id), want))
            return t;
        usleep(20000);
    }
    FAIL("node %.8s stayed '%s', expected '%s' within %d ms", id, state_of(c, id), want, ms);
}

static size_t n_nodes(struct cluster *c)
{
    json_t *s = cluster_snapshot(c);
    size_t n = json_array_size(json_object_get(s, "nodes"));
    json_decref(s);
    return n;
}

TEST(cluster_state_dir)
{
    char dir[600], tok[WIRE_TOKEN_MAX], path[700];
    snprintf(dir, sizeof dir, "%s/state/a", test_tmpdir());
    CHECK_INT(cluster_read_token(dir, tok, sizeof tok), ==, RC_ENOTFOUND);
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.bench = 0;
    struct cluster *c;
    bool created = false;
    CHECK_OK(cluster_new(&cfg, &c, &created));
    CHECK(created);
    char id[40], token[WIRE_TOKEN_MAX];
    snprintf(id, sizeof id, "%s", cluster_self_id(c));
    snprintf(token, sizeof token, "%s", cluster_join_token(c));
    cluster_free(c);
    struct stat st;
    snprintf(path, sizeof path, "%s/cluster.key", dir);
    CHECK_OK(stat(path, &st));
    CHECK_INT(st.st_mode & 0777, ==, 0600);
    CHECK_OK(stat(dir, &st));
    CHECK_INT(st.st_mode & 077, ==, 0);
    CHECK_OK(cluster_read_token(dir, tok, sizeof tok));
    CHECK_STR(tok, token);
    /* a restart keeps the key and the id; a second node on the directory
     * is refused while the first runs */
    CHECK_OK(cluster_new(&cfg, &c, &created));
    CHECK(!created);
    struct cluster *twin;
    CHECK_INT(cluster_new(&cfg, &twin, NULL), ==, RC_ESTATE);
    CHECK(strstr(rc_errmsg(), "in use by another racimo node"));
    CHECK_STR(cluster_self_id(c), id);
    CHECK_STR(cluster_join_token(c), token);
    cluster_free(c);
    /* joining another cluster replaces the key, keeps the id */
    uint8_t key[32] = { 42 };
    char other[WIRE_TOKEN_MAX];
    CHECK_OK(wire_token_encode(key, other, sizeof other));
    cfg.join_token = other;
    CHECK_OK(cluster_new(&cfg, &c, &created));
    CHECK(!created);
    CHECK_STR(cluster_join_token(c), other);
    CHECK_STR(cluster_self_id(c), id);
    cluster_free(c);
    CHECK_OK(cluster_read_token(dir, tok, sizeof tok));
    CHECK_STR(tok, other);
    /* the node's key: owner-only, and it gives the id node.id shows */
    char buf[200];
    snprintf(path, sizeof path, "%s/node.key", dir);
    CHECK_OK(stat(path, &st));
    CHECK_INT(st.st_mode & 0777, ==, 0600);
    FILE *fk = fopen(path, "r");
    CHECK(fk && fgets(buf, sizeof buf, fk));
    fclose(fk);
    buf[64] = 0;
    uint8_t sk[32];
    CHECK_OK(wire_unhex(buf, sk, 32));
    wire_identity me;
    wire_identity_from_secret(&me, sk);
    char mine[33];
    wire_hex(me.id, 16, mine);
    CHECK_STR(mine, id);
    snprintf(path, sizeof path, "%s/node.id", dir);
    fk = fopen(path, "r");
    CHECK(fk && fgets(buf, sizeof buf, fk));
    fclose(fk);
    CHECK(!strncmp(buf, id, 32));
    /* a state directory others may write to is refused, saying why */
    CHECK_OK(chmod(dir, 0777));
    CHECK_INT(cluster_new(&cfg, &c, NULL), ==, RC_ESTATE);
    CHECK(strstr(rc_errmsg(), "writable by anyone"));
    CHECK_OK(chmod(dir, 0770));
    CHECK_INT(cluster_new(&cfg, &c, NULL), ==, RC_ESTATE);
    CHECK(strstr(rc_errmsg(), "its group"));
    CHECK_OK(chmod(dir, 0700));
    /* a key file that is a symbolic link is not followed */
    char old_dir[600], target[700];
    snprintf(old_dir, sizeof old_dir, "%s/state/linked", test_tmpdir());
    CHECK_OK(mkdir(old_dir, 0700));
    snprintf(path, sizeof path, "%s/node.key", old_dir);
    snprintf(target, sizeof target, "%s/node.key", dir);
    CHECK_OK(symlink(target, path));
    cluster_config lc = cfg;
    lc.state_dir = old_dir;
    CHECK_INT(cluster_new(&lc, &c, NULL), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "symbolic link"));
    /* a state directory of protocol 1 (a random node.id, no key): it gets a
     * key pair and the id that key gives */
    snprintf(old_dir, sizeof old_dir, "%s/state/old", test_tmpdir());
    CHECK_OK(mkdir(old_dir, 0700));
    snprintf(path, sizeof path, "%s/node.id", old_dir);
    fk = fopen(path, "w");
    fputs("0123456789abcdef0123456789abcdef\n", fk);
    fclose(fk);
    lc.state_dir = old_dir;
    CHECK_OK(cluster_new(&lc, &c, NULL));
    CHECK(strcmp(cluster_self_id(c), "0123456789abcdef0123456789abcdef"));
    snprintf(mine, sizeof mine, "%s", cluster_self_id(c));
    cluster_free(c);
    fk = fopen(path, "r");
    CHECK(fk && fgets(buf, sizeof buf, fk));
    fclose(fk);
    CHECK(!strncmp(buf, mine, 32));
    CHECK_OK(cluster_new(&lc, &c, NULL));
    CHECK_STR(cluster_self_id(c), mine);       /* and keeps it from then on */
    cluster_free(c);
    /* a bad token is an error that says so */
    cfg.join_token = "racimo1-nonsense";
    CHECK_INT(cluster_new(&cfg, &c, NULL), ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "--join"));
    /* RACIMO_HOME stands in for --state-dir */
    char home[600], out[600];
    snprintf(home, sizeof home, "%s/home", test_tmpdir());
    setenv("RACIMO_HOME", home, 1);
    CHECK_OK(cluster_state_dir(NULL, out, sizeof out));
    CHECK_STR(out, home);
    CHECK_OK(cluster_state_dir("/x/y", out, sizeof out));
    CHECK_STR(out, "/x/y");
    unsetenv("RACIMO_HOME");
}

TEST_T(cluster_link_gossip_view, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64], ba[64], ida[40], idb[40], idc[40];
    addr_of(a, aa, sizeof aa);
    snprintf(ida, sizeof ida, "%s", cluster_self_id(a));
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    snprintf(idb, sizeof idb, "%s", cluster_self_id(b));
    addr_of(b, ba, sizeof ba);
    wait_state(a, idb, "up", 5000);
    wait_state(b, ida, "up", 5000);
    /* c knows only b; a learns of c from b's STATE and links to it */
    struct cluster *c = start_node("c", cluster_join_token(a), ba, 0);
    snprintf(idc, sizeof idc, "%s", cluster_self_id(c));
    wait_state(a, idc, "up", 8000);
    wait_state(c, ida, "up", 8000);
    wait_state(b, idc, "up", 8000);
    /* the full mesh of links, with latency and (after a probe) bandwidth */
    struct cluster *all[3] = { a, b, c };
    bool done = false;
    for (int t = 0; t < 200 && !done; t++) {
        done = true;
        for (int i = 0; i < 3; i++) {
            json_t *s = cluster_snapshot(all[i]);
            size_t j, n_bw = 0;
            json_t *l;
            json_array_foreach(json_object_get(s, "links"), j, l)
                n_bw += json_is_number(json_object_get(l, "bandwidth_mbps")) &&
                        json_is_number(json_object_get(l, "rtt_ms"));
            done = done && n_bw == 6;
            json_decref(s);
        }
        usleep(50000);
    }
    CHECK(done);
    /* every view: the same three nodes up, the same leader (smallest id) */
    const char *lead = strcmp(ida, idb) < 0 ? ida : idb;
    lead = strcmp(lead, idc) < 0 ? lead : idc;
    for (int i = 0; i < 3; i++) {
        json_t *s = cluster_snapshot(all[i]);
        CHECK_INT(json_array_size(json_object_get(s, "nodes")), ==, 3);
        CHECK_STR(json_string_value(json_object_get(s, "leader")), lead);
        CHECK(json_is_true(json_object_get(s, "quorum")));
        CHECK(cluster_has_quorum(all[i]));
        json_t *nb = find_node(s, idb);
        CHECK_STR(json_string_value(json_object_get(nb, "name")), "b");
        CHECK_STR(json_string_value(json_object_get(nb, "state")), "up");
        CHECK_INT(json_integer_value(json_object_get(nb, "http_port")), ==, 8080);
        CHECK(json_is_object(json_object_get(nb, "hardware")));
        CHECK(json_integer_value(json_object_get(json_object_get(nb, "hardware"), "cores")) >= 1);
        CHECK(json_is_array(json_object_get(nb, "addresses")));
        json_decref(s);
    }
    /* what a node serves, and its free slots, reach the others */
    const char *serving[] = { "tiny" };
    const int free_slots[] = { 3 };
    const int slots[] = { 4 };
    cluster_set_serving(b, serving, free_slots, slots, 1);
    int ok = 0;
    for (int t = 0; t < 100 && !ok; t++) {
        json_t *s = cluster_snapshot(a);
        json_t *sv = json_object_get(find_node(s, idb), "serving");
        json_t *fr = json_object_get(json_object_get(find_node(s, idb), "serving_free"), "tiny");
        ok = json_array_size(sv) == 1 && !strcmp(json_string_value(json_array_get(sv, 0)), "tiny") &&
             json_integer_value(fr) == 3;
        json_decref(s);
        usleep(20000);
    }
    CHECK(ok);
    /* free slots beyond a node's slots, and slots beyond any node's, count
     * as no more in the view (a member claiming them gets no more requests) */
    const char *serving2[] = { "tiny", "big" };
    const int free2[] = { 9, 10000 }, slots2[] = { 4, 10000 };
    cluster_set_serving(b, serving2, free2, slots2, 2);
    ok = 0;
    for (int t = 0; t < 100 && !ok; t++) {
        json_t *s = cluster_snapshot(a);
        json_t *fr = json_object_get(find_node(s, idb), "serving_free");
        json_t *sl = json_object_get(find_node(s, idb), "serving_slots");
        ok = json_integer_value(json_object_get(fr, "tiny")) == 4 &&
             json_integer_value(json_object_get(sl, "tiny")) == 4 &&
             json_integer_value(json_object_get(fr, "big")) == CLUSTER_SLOTS_MAX &&
             json_integer_value(json_object_get(sl, "big")) == CLUSTER_SLOTS_MAX;
        json_decref(s);
        usleep(20000);
    }
    CHECK(ok);
    cluster_free(c);
    cluster_free(b);
    cluster_free(a);
}

/* ---- large messages ---- */

static pthread_mutex_t got_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t got_len;
static uint8_t got_hash[32];
static int got_type;

static void on_msg(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    pthread_mutex_lock(&got_mu);
    crypto_generichash(got_hash, 32, data, len, NULL, 0);
    got_len = len;
    got_type = type;
    pthread_mutex_unlock(&got_mu);
}

TEST_T(cluster_send_large_message, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64];
    addr_of(a, aa, sizeof aa);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/b", test_tmpdir());
    const char *peers[1] = { aa };
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.join_token = cluster_join_token(a);
    cfg.listen_host = "127.0.0.1";
    cfg.port = 0;
    cfg.port_given = true;
    cfg.peers = peers;
    cfg.n_peers = 1;
    cfg.no_discovery = true;
    cfg.heartbeat_ms = 100;
    cfg.down_after_ms = DOWN_MS * 3;
    cfg.bench = 0;
    cfg.swim = env_swim();
    struct cluster *b;
    CHECK_OK(cluster_new(&cfg, &b, NULL));
    CHECK_OK(cluster_add_handler(b, 0x40, 0x7f, on_msg, NULL));
    CHECK_OK(cluster_start(b));
    wait_state(a, cluster_self_id(b), "up", 5000);
    /* 5 MiB + 3 bytes: six frames, one stream */
    size_t n = (5u << 20) + 3;
    uint8_t *big = malloc(n), want[32];
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 2654435761u >> 13);
    crypto_generichash(want, 32, big, n, NULL, 0);
    CHECK_OK(cluster_send(a, cluster_self_id(b), 0x40, big, n));
    CHECK_INT(cluster_send(a, "00000000000000000000000000000000", 0x40, big, 1), ==, RC_ENOTFOUND);
    CHECK_INT(cluster_send(a, cluster_self_id(b), 0x40, big, (size_t)WIRE_MSG_MAX + 1), ==, RC_ELIMIT);
    free(big);
    size_t len = 0;
    for (int t = 0; t < 500 && len != n; t++) {
        usleep(20000);
        pthread_mutex_lock(&got_mu);
        len = got_len;
        pthread_mutex_unlock(&got_mu);
    }
    CHECK_INT(len, ==, n);
    CHECK_INT(got_type, ==, 0x40);
    CHECK(!memcmp(got_hash, want, 32));
    CHECK_STR(state_of(a, cluster_self_id(b)), "up");   /* heartbeats went on meanwhile */
    cluster_free(b);
    cluster_free(a);
}

TEST_T(cluster_refuses_wrong_key_and_version, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64];
    addr_of(a, aa, sizeof aa);
    /* another cluster's node pointed at a, and a node of a's cluster that
     * speaks protocol 1 */
    struct cluster *e = start_node("e", NULL, aa, 0);
    struct cluster *v = start_node("v", cluster_join_token(a), aa, 1);
    /* a control node proves the window was long enough to link */
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    wait_state(a, cluster_self_id(b), "up", 5000);
    usleep(1500 * 1000);
    CHECK_STR(state_of(a, cluster_self_id(e)), "absent");
    CHECK_STR(state_of(a, cluster_self_id(v)), "absent");
    CHECK_INT(n_nodes(e), ==, 1);
    CHECK_INT(n_nodes(v), ==, 1);
    CHECK_INT(n_nodes(a), ==, 2);
    cluster_free(v);
    cluster_free(e);
    cluster_free(b);
    cluster_free(a);
}

/* ---- a peer driven by hand over a blocking socket ---- */

typedef struct {
    int fd;
    wire_session ws;
} fake;

static int recv_all(int fd, uint8_t *p, size_t n, int ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (poll(&pf, 1, ms) <= 0)
            return -1;
        ssize_t r = recv(fd, p + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Dials c's cluster port as `id` holding `key` and runs the handshake;
 * claim: the id its HELLO shows instead of its own (NULL: its own).  The
 * result of the handshake (0: both sides authenticated). */
static int fake_open_key_as(fake *f, struct cluster *c, const uint8_t key[32],
                            const wire_identity *id, int major, const uint8_t *claim)
{
    uint8_t hello[WIRE_HELLO_BYTES], peer[WIRE_HELLO_BYTES], auth[WIRE_AUTH_BYTES];
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)cluster_port(c)) };
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    CHECK_OK(connect(f->fd, (struct sockaddr *)&sin, sizeof sin));
    wire_session_init(&f->ws, key, id, WIRE_DIALER, major, 0, hello);
    if (claim)
        wire_session_claim_id(&f->ws, claim, hello);
    CHECK_INT(send(f->fd, hello, sizeof hello, 0), ==, (long)sizeof hello);
    CHECK_OK(recv_all(f->fd, peer, sizeof peer, 3000));
    int r = wire_on_hello(&f->ws, peer, auth);
    if (r)
        return r;
    if (send(f->fd, auth, sizeof auth, MSG_NOSIGNAL) != (long)sizeof auth)
        return RC_EIO;       /* the node closed: it refused our HELLO */
    if (recv_all(f->fd, auth, sizeof auth, 3000))
        return RC_EIO;       /* the node closed: it refused our HELLO or AUTH */
    return wire_on_auth(&f->ws, auth);
}

static int fake_open_as(fake *f, struct cluster *c, const wire_identity *id, int major,
                        const uint8_t *claim)
{
    uint8_t key[32];
    CHECK_OK(wire_token_decode(cluster_join_token(c), key, NULL, 0));
    return fake_open_key_as(f, c, key, id, major, claim);
}

static int fake_open_key(fake *f, struct cluster *c, const uint8_t key[32],
                         const wire_identity *id, int major)
{
    return fake_open_key_as(f, c, key, id, major, NULL);
}

static int fake_open(fake *f, struct cluster *c, const wire_identity *id, int major)
{
    return fake_open_as(f, c, id, major, NULL);
}

/* Reads until the node closes the connection: 1 if it did within ms. */
static int closed_within(int fd, int ms)
{
    uint8_t buf[65536];
    uint64_t end = os_now_ns() + (uint64_t)ms * 1000000;
    while (os_now_ns() < end) {
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (poll(&pf, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0)
            return 1;
    }
    return 0;
}

static void fake_send(fake *f, const uint8_t *p, size_t n)
{
    CHECK_INT(send(f->fd, p, n, MSG_NOSIGNAL), ==, (long)n);
}

TEST_T(cluster_rejects_hostile_frames, 90)
{
    MESH_ONLY();
    struct cluster *a = start_node("a", NULL, NULL, 0);
    static uint8_t rec[WIRE_REC_MAX], rec2[WIRE_REC_MAX];
    wire_identity fid;
    wire_identity_new(&fid);
    char fid_hex[33];
    wire_hex(fid.id, 16, fid_hex);
    fake f;
    uint8_t ping[16] = { 0 };

    /* a good handshake: the node sees the fake peer up */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    wait_state(a, fid_hex, "up", 3000);
    /* tampered */
    long n = wire_seal(&f.ws, WIRE_PING, 0, 1, ping, 16, false, rec);
    rec[n - 1] ^= 0x80;
    fake_send(&f, rec, (size_t)n);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);
    wait_state(a, fid_hex, "down", 3000);

    /* replayed */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    n = wire_seal(&f.ws, WIRE_PING, 0, 1, ping, 16, false, rec);
    fake_send(&f, rec, (size_t)n);
    fake_send(&f, rec, (size_t)n);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);

    /* oversized: refused from the length alone, before it arrives */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    wire_put32(rec, 64u << 20);
    fake_send(&f, rec, 4);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);

    /* forged: random bytes of a plausible length */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    wire_put32(rec, 100);
    randombytes_buf(rec + 4, 100);
    fake_send(&f, rec, 104);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);

    /* reordered */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    n = wire_seal(&f.ws, WIRE_PING, 0, 1, ping, 16, false, rec);
    long n2 = wire_seal(&f.ws, WIRE_PING, 0, 2, ping, 16, false, rec2);
    fake_send(&f, rec2, (size_t)n2);
    fake_send(&f, rec, (size_t)n);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);

    /* a STATE claiming another node's id is ignored; unknown types too */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    wait_state(a, fid_hex, "up", 3000);
    const char *lie = "{\"id\":\"00000000000000000000000000000001\",\"name\":\"liar\"}";
    n = wire_seal(&f.ws, WIRE_STATE, 0, 1, (const uint8_t *)lie, strlen(lie), false, rec);
    fake_send(&f, rec, (size_t)n);
    n = wire_seal(&f.ws, 0xee, 0, 2, ping, 16, false, rec);
    fake_send(&f, rec, (size_t)n);
    /* truncated: half a record, then silence: down within the bound */
    n = wire_seal(&f.ws, WIRE_PING, 0, 3, ping, 16, false, rec);
    fake_send(&f, rec, (size_t)n / 2);
    uint64_t t0 = os_now_ns();
    wait_state(a, fid_hex, "down", DOWN_MS + 2000);
    double waited = (double)(os_now_ns() - t0) / 1e6;
    CHECK(waited >= DOWN_MS / 2);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);
    CHECK_STR(state_of(a, "00000000000000000000000000000001"), "absent");

    /* a wrong key and another version are refused at the handshake */
    f.fd = -1;
    uint8_t key[32] = { 7 }, hello[WIRE_HELLO_BYTES], peer[WIRE_HELLO_BYTES], auth[WIRE_AUTH_BYTES];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)cluster_port(a)) };
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    CHECK_OK(connect(fd, (struct sockaddr *)&sin, sizeof sin));
    wire_session ws;
    wire_session_init(&ws, key, &fid, WIRE_DIALER, 2, 0, hello);
    fake_send(&(fake){ .fd = fd }, hello, sizeof hello);
    CHECK_OK(recv_all(fd, peer, sizeof peer, 3000));
    CHECK_OK(wire_on_hello(&ws, peer, auth));
    fake_send(&(fake){ .fd = fd }, auth, sizeof auth);
    CHECK(closed_within(fd, 3000));
    close(fd);
    CHECK_INT(fake_open(&f, a, &fid, 9), ==, RC_EUNSUPPORTED);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);

    /* through all of it the node kept running and still accepts good peers */
    CHECK_OK(fake_open(&f, a, &fid, 2));
    wait_state(a, fid_hex, "up", 3000);
    close(f.fd);
    wait_state(a, fid_hex, "down", 3000);
    cluster_free(a);
}

/* ---- identities: proven or refused ---- */

TEST_T(cluster_identity_proven, 60)
{
    MESH_ONLY();
    struct cluster *a = start_node("a", NULL, NULL, 0);
    wire_identity honest, liar, thief;
    wire_identity_new(&honest);
    wire_identity_new(&liar);
    wire_identity_new(&thief);
    char honest_hex[33], liar_hex[33];
    wire_hex(honest.id, 16, honest_hex);
    wire_hex(liar.id, 16, liar_hex);
    fake f;
    /* the honest peer links and becomes a member */
    CHECK_OK(fake_open(&f, a, &honest, 2));
    wait_state(a, honest_hex, "up", 3000);
    close(f.fd);
    wait_state(a, honest_hex, "down", 3000);
    /* a peer that claims the honest peer's id with its own key is refused at
     * its HELLO; the honest peer is not brought up by it */
    CHECK(fake_open_as(&f, a, &liar, 2, honest.id) != 0);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);
    CHECK_STR(state_of(a, honest_hex), "down");
    CHECK_STR(state_of(a, liar_hex), "absent");
    /* a peer that shows the honest peer's public key and id without its
     * secret key is refused at its AUTH */
    memcpy(thief.pk, honest.pk, 32);
    memcpy(thief.id, honest.id, 16);
    CHECK(fake_open(&f, a, &thief, 2) != 0);
    CHECK(closed_within(f.fd, 3000));
    close(f.fd);
    usleep(300 * 1000);
    CHECK_STR(state_of(a, honest_hex), "down");
    /* the honest peer still links */
    CHECK_OK(fake_open(&f, a, &honest, 2));
    wait_state(a, honest_hex, "up", 3000);
    json_t *s = cluster_snapshot(a);
    CHECK_INT(json_integer_value(json_object_get(s, "members")), ==, 2);
    json_decref(s);
    close(f.fd);
    cluster_free(a);
}

/* peers.json: a member met before comes back as a member only with the
 * key that gives its id; an entry without one (protocol 1) or with another
 * node's key is a candidate to dial, not in the view. */
TEST(cluster_peers_file_members)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/pf", test_tmpdir());
    CHECK_OK(mkdir(dir, 0700));
    wire_identity known, other;
    wire_identity_new(&known);
    wire_identity_new(&other);
    char kid[33], kpk[65], oid[33], opk[65], lone[33];
    wire_hex(known.id, 16, kid);
    wire_hex(known.pk, 32, kpk);
    wire_hex(other.id, 16, oid);
    wire_hex(other.pk, 32, opk);
    snprintf(lone, sizeof lone, "%s", "00112233445566778899aabbccddeeff");
    snprintf(path, sizeof path, "%s/peers.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "[{\"id\":\"%s\",\"key\":\"%s\",\"addresses\":[\"127.0.0.1\"],\"cluster_port\":9},"
               " {\"id\":\"%s\",\"key\":\"%s\",\"addresses\":[\"127.0.0.1\"],\"cluster_port\":9},"
               " {\"id\":\"%s\",\"addresses\":[\"127.0.0.1\"],\"cluster_port\":9}]\n",
            kid, kpk, oid, kpk, lone);
    fclose(f);
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.bench = 0;
    struct cluster *c;
    CHECK_OK(cluster_new(&cfg, &c, NULL));
    CHECK_STR(state_of(c, kid), "down");
    CHECK_STR(state_of(c, oid), "absent");
    CHECK_STR(state_of(c, lone), "absent");
    CHECK_INT(n_nodes(c), ==, 2);
    CHECK(!cluster_has_quorum(c));       /* 1 of the 2 members up */
    cluster_free(c);
}

/* Connections that send nothing: at most 4 from one (stranger's) address
 * wait in handshake, each at most 1 s; the rest are closed at once; the
 * node goes on linking honest peers. */
TEST_T(cluster_handshake_limits, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    enum { N = 10 };
    int fds[N];
    uint64_t t0[N], closed_ms[N];
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sin = { .sin_family = AF_INET,
                                   .sin_port = htons((uint16_t)cluster_port(a)) };
        inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
        t0[i] = os_now_ns();
        CHECK_OK(connect(fds[i], (struct sockaddr *)&sin, sizeof sin));
        closed_ms[i] = 0;
    }
    uint64_t end = os_now_ns() + 6000000000ull;
    int open_left = N;
    while (open_left && os_now_ns() < end) {
        for (int i = 0; i < N; i++) {
            if (closed_ms[i])
                continue;
            struct pollfd pf = { .fd = fds[i], .events = POLLIN };
            uint8_t buf[256];
            /* the node's HELLO comes first on the slots it gave */
            if (poll(&pf, 1, 0) > 0 && recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) <= 0) {
                closed_ms[i] = (os_now_ns() - t0[i]) / 1000000 + 1;
                open_left--;
            }
        }
        usleep(5000);
    }
    int fast = 0, slow = 0;
    for (int i = 0; i < N; i++) {
        fast += closed_ms[i] && closed_ms[i] < 900;
        slow += closed_ms[i] >= 1000;
        close(fds[i]);
    }
    CHECK_INT(open_left, ==, 0);
    CHECK_INT(fast, ==, N - 4);
    CHECK_INT(slow, ==, 4);
    /* and an honest peer links as ever */
    wire_identity honest;
    wire_identity_new(&honest);
    char hex[33];
    wire_hex(honest.id, 16, hex);
    fake f;
    CHECK_OK(fake_open(&f, a, &honest, 2));
    wait_state(a, hex, "up", 3000);
    close(f.fd);
    cluster_free(a);
}

/* ---- data channels ---- */

static pthread_mutex_t chan_mu = PTHREAD_MUTEX_INITIALIZER;
static cluster_chan *chan_got;
static char chan_first[64], chan_from[33];
static bool chan_refuse;

static int on_chan(void *ud, const char *from, int type, const uint8_t *data, size_t len,
                   cluster_chan *ch)
{
    (void)ud;
    if (chan_refuse || type != 0x46 || len >= sizeof chan_first)
        return rc_fail(RC_EINVAL, "not this one");
    int rc = cluster_channel_confirm(ch);
    if (rc)
        return rc;
    pthread_mutex_lock(&chan_mu);
    memcpy(chan_first, data, len);
    chan_first[len] = 0;
    snprintf(chan_from, sizeof chan_from, "%s", from);
    chan_got = ch;
    pthread_mutex_unlock(&chan_mu);
    return 0;
}

static cluster_chan *chan_wait(int ms)
{
    for (int t = 0; t < ms / 10; t++) {
        pthread_mutex_lock(&chan_mu);
        cluster_chan *ch = chan_got;
        chan_got = NULL;
        pthread_mutex_unlock(&chan_mu);
        if (ch)
            return ch;
        usleep(10000);
    }
    return NULL;
}

#define BIG ((3u << 20) + 5)

typedef struct {
    cluster_chan *ch;
    uint8_t *out;
    uint8_t hash[32];
    size_t in_len;
    int rc;
} side;

/* Both sides send BIG bytes at once and read the other's: neither may
 * wait for the other to read first. */
static void *exchange_side(void *arg)
{
    side *s = arg;
    chan_io io = { .ch = s->ch, .out_type = 0x45, .out = s->out, .out_len = BIG, .want_in = true };
    s->rc = chan_exchange(&io, 1, 10000, NULL, NULL);
    if (!s->rc) {
        crypto_generichash(s->hash, 32, io.in, io.in_len, NULL, 0);
        s->in_len = io.in_len;
    }
    return NULL;
}

static bool abort_now(void *ud, char *why, size_t cap)
{
    (void)ud;
    snprintf(why, cap, "told to stop");
    return true;
}

TEST_T(cluster_data_channel, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    cluster_set_channel_handler(a, on_chan, NULL);
    char aa[64];
    addr_of(a, aa, sizeof aa);
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    wait_state(b, cluster_self_id(a), "up", 5000);

    /* b dials a; a's handler gets the first message and the channel */
    cluster_chan *cb = NULL;
    CHECK_OK(cluster_channel_open(b, cluster_self_id(a), 0x46, "bind me", 7, 3000, &cb));
    cluster_chan *ca = chan_wait(3000);
    CHECK(ca != NULL);
    CHECK_STR(chan_first, "bind me");
    CHECK_STR(chan_from, cluster_self_id(b));
    CHECK_STR(state_of(a, cluster_self_id(b)), "up");   /* the cluster link stays */

    /* both send 3 MiB at the same moment */
    side sa = { .ch = ca, .out = malloc(BIG) }, sb = { .ch = cb, .out = malloc(BIG) };
    uint8_t want_a[32], want_b[32];
    for (size_t i = 0; i < BIG; i++) {
        sa.out[i] = (uint8_t)(i * 2654435761u >> 11);
        sb.out[i] = (uint8_t)(i * 40503u >> 5);
    }
    crypto_generichash(want_a, 32, sa.out, BIG, NULL, 0);
    crypto_generichash(want_b, 32, sb.out, BIG, NULL, 0);
    pthread_t th;
    pthread_create(&th, NULL, exchange_side, &sa);
    exchange_side(&sb);
    pthread_join(th, NULL);
    CHECK_OK(sa.rc);
    CHECK_OK(sb.rc);
    CHECK_INT(sa.in_len, ==, BIG);
    CHECK_INT(sb.in_len, ==, BIG);
    CHECK(!memcmp(sa.hash, want_b, 32));
    CHECK(!memcmp(sb.hash, want_a, 32));
    CHECK(chan_bytes_out(cb) > BIG);
    free(sa.out);
    free(sb.out);

    /* messages keep their order, an empty one included */
    for (int i = 0; i < 5; i++) {
        char m[16];
        int len = snprintf(m, sizeof m, "m%d", i);
        CHECK_OK(chan_send(cb, 0x45, m, i == 2 ? 0 : (size_t)len, 1000));
    }
    for (int i = 0; i < 5; i++) {
        int type;
        const uint8_t *d;
        size_t n;
        char m[16];
        int len = snprintf(m, sizeof m, "m%d", i);
        CHECK_OK(chan_recv(ca, &type, &d, &n, 1000));
        CHECK_INT(type, ==, 0x45);
        CHECK_INT(n, ==, i == 2 ? 0 : (size_t)len);
        CHECK(!memcmp(d, m, n));
    }

    /* a wait the caller gives up: the reason comes back within a slice */
    chan_io io = { .ch = ca, .want_in = true };
    uint64_t t0 = os_now_ns();
    CHECK_INT(chan_exchange(&io, 1, 5000, abort_now, NULL), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "told to stop") != NULL);
    CHECK(os_now_ns() - t0 < 2000000000ull);
    /* a timeout */
    CHECK_INT(chan_recv(ca, &io.in_type, &io.in, &io.in_len, 150), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), "within 150 ms") != NULL);

    /* b closes its end: a's next read fails at once, naming b */
    chan_free(cb);
    t0 = os_now_ns();
    CHECK_INT(chan_recv(ca, &io.in_type, &io.in, &io.in_len, 5000), ==, RC_EIO);
    CHECK(strstr(rc_errmsg(), cluster_self_id(b)) == NULL);   /* short id */
    char sid[9];
    snprintf(sid, sizeof sid, "%.8s", cluster_self_id(b));
    CHECK(strstr(rc_errmsg(), sid) != NULL);
    CHECK(os_now_ns() - t0 < 2000000000ull);
    chan_free(ca);

    /* refused by the handler; an unknown node; a node without a handler */
    chan_refuse = true;
    CHECK(cluster_channel_open(b, cluster_self_id(a), 0x46, "x", 1, 3000, &cb) < 0);
    chan_refuse = false;
    CHECK_INT(cluster_channel_open(b, "00000000000000000000000000000000", 0x46, "x", 1, 1000, &cb),
              ==, RC_ENOTFOUND);
    CHECK(cluster_channel_open(a, cluster_self_id(b), 0x46, "x", 1, 3000, &cb) < 0);

    /* by hand: a channel whose first message is a control type is closed;
     * one that names the wrong node is not opened */
    uint8_t key[32], ida[16];
    wire_identity fid;
    wire_identity_new(&fid);
    CHECK_OK(wire_token_decode(cluster_join_token(a), key, NULL, 0));
    wire_unhex(cluster_self_id(a), ida, 16);
    CHECK_OK(chan_dial("127.0.0.1", cluster_port(a), key, &fid, 2, 0, ida, 3000, &cb));
    CHECK_OK(chan_send(cb, WIRE_PING, "0123456789abcdef", 16, 1000));
    CHECK_INT(chan_recv(cb, &io.in_type, &io.in, &io.in_len, 3000), ==, RC_EIO);
    chan_free(cb);
    CHECK_INT(chan_dial("127.0.0.1", cluster_port(a), key, &fid, 2, 0, fid.id, 3000, &cb), ==,
              RC_EINVAL);
    /* a node of another major version is told so, from its HELLO's first bytes */
    CHECK_INT(chan_dial("127.0.0.1", cluster_port(a), key, &fid, 1, 3, ida, 3000, &cb), ==,
              RC_EUNSUPPORTED);
    CHECK(strstr(rc_errmsg(), "2.4") != NULL);
    cluster_free(b);
    cluster_free(a);
}

TEST_T(cluster_down_and_rejoin, 60)
{
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64], idb[40];
    addr_of(a, aa, sizeof aa);
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    snprintf(idb, sizeof idb, "%s", cluster_self_id(b));
    wait_state(a, idb, "up", 5000);
    cluster_free(b);
    wait_state(a, idb, "down", DOWN_MS + 1000);
    CHECK(!cluster_has_quorum(a));     /* 1 of 2 is not a majority */
    json_t *s = cluster_snapshot(a);
    CHECK_STR(json_string_value(json_object_get(s, "leader")), cluster_self_id(a));
    json_decref(s);
    /* the same state directory: the same node comes back, with no manual step */
    b = start_node("b", NULL, aa, 0);
    CHECK_STR(cluster_self_id(b), idb);
    wait_state(a, idb, "up", 5000);
    CHECK_INT(n_nodes(a), ==, 2);
    CHECK(cluster_has_quorum(a));
    /* and a restarted a redials b from peers.json, without a peer list */
    char ida[40];
    snprintf(ida, sizeof ida, "%s", cluster_self_id(a));
    int port_b = cluster_port(b);
    (void)port_b;
    cluster_free(a);
    wait_state(b, ida, "down", DOWN_MS + 1000);
    a = start_node("a", NULL, NULL, 0);
    wait_state(b, ida, "up", 5000);
    wait_state(a, idb, "up", 5000);
    cluster_free(b);
    cluster_free(a);
}

/* ---- the allow-list: removing a node, rotating the key ---- */

static json_t *view_get(struct cluster *c, const char *key)
{
    json_t *s = cluster_snapshot(c);
    json_t *v = json_deep_copy(json_object_get(s, key));
    json_decref(s);
    return v;
}

static bool has_revoked(struct cluster *c, const char *id)
{
    json_t *r = view_get(c, "revoked");
    size_t i;
    json_t *e;
    bool found = false;
    json_array_foreach(r, i, e)
        found = found || !strcmp(json_string_value(json_object_get(e, "id")), id);
    json_decref(r);
    return found;
}

static void wait_absent_for(struct cluster *c, const char *id, int ms)
{
    for (int t = 0; t < ms; t += 50) {
        CHECK_STR(state_of(c, id), "absent");
        usleep(50000);
    }
}

/* Nodes a, b, c (b and c joining through a), linked in a full mesh. */
static void start_three(struct cluster *n[3], char ids[3][40], char aa[64])
{
    n[0] = start_node("a", NULL, NULL, 0);
    addr_of(n[0], aa, 64);
    n[1] = start_node("b", cluster_join_token(n[0]), aa, 0);
    n[2] = start_node("c", cluster_join_token(n[0]), aa, 0);
    for (int i = 0; i < 3; i++)
        snprintf(ids[i], 40, "%s", cluster_self_id(n[i]));
    wait_state(n[1], ids[2], "up", 8000);
    wait_state(n[0], ids[2], "up", 8000);
    wait_state(n[2], ids[1], "up", 8000);
}

TEST_T(cluster_remove_node, 60)
{
    struct cluster *all[3];
    char ids[3][40], aa[64], prefix[9];
    start_three(all, ids, aa);
    struct cluster *a = all[0], *b = all[1], *c = all[2];
    const char *ida = ids[0], *idb = ids[1], *idc = ids[2];

    /* bad requests */
    char out[33];
    CHECK_INT(cluster_remove_node(b, "xyz", out), ==, RC_EINVAL);
    CHECK_INT(cluster_remove_node(b, idb, out), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "ask another node") != NULL);
    CHECK_INT(cluster_remove_node(b, "0123456789abcdef", out), ==, RC_ENOTFOUND);

    /* b removes c by the first 8 digits of its id: a hears it from b */
    snprintf(prefix, sizeof prefix, "%.8s", idc);
    CHECK_OK(cluster_remove_node(b, prefix, out));
    CHECK_STR(out, idc);
    wait_state(b, idc, "absent", 3000);
    wait_state(a, idc, "absent", 3000);
    CHECK(has_revoked(a, idc));
    /* c learns it was removed, and is left alone */
    for (int t = 0; t < 100; t++) {
        json_t *r = view_get(c, "removed");
        bool removed = json_is_true(r);
        json_decref(r);
        if (removed)
            break;
        usleep(30000);
    }
    json_t *r = view_get(c, "removed");
    CHECK(json_is_true(r));
    json_decref(r);
    wait_state(c, ida, "down", 3000);
    CHECK_INT(n_nodes(a), ==, 2);
    CHECK(cluster_has_quorum(a));

    /* the list is kept in the state directory, owner-only */
    char path[700];
    struct stat st;
    snprintf(path, sizeof path, "%s/a/revoked.json", test_tmpdir());
    for (int t = 0; t < 100 && stat(path, &st); t++)      /* written after the drop */
        usleep(30000);
    CHECK_OK(stat(path, &st));
    CHECK_INT(st.st_mode & 0777, ==, 0600);

    /* c cannot come back: restarted with its id, pointed at a */
    cluster_free(c);
    c = start_node("c", NULL, aa, 0);
    CHECK_STR(cluster_self_id(c), idc);
    wait_absent_for(a, idc, 1500);
    CHECK_STR(state_of(b, idc), "absent");
    /* a peer claiming c's id is refused at the handshake (the link closes) */
    fake f;
    uint8_t cid[16];
    wire_unhex(idc, cid, 16);
    wire_identity other;
    wire_identity_new(&other);
    int hr = fake_open_as(&f, a, &other, WIRE_PROTO_MAJOR, cid);
    CHECK(hr != 0 || closed_within(f.fd, 3000));
    close(f.fd);
    CHECK_STR(state_of(a, idc), "absent");
    /* a restarted a still refuses it; b comes back */
    cluster_free(a);
    a = start_node("a", NULL, NULL, 0);
    CHECK(has_revoked(a, idc));
    wait_state(a, idb, "up", 5000);
    hr = fake_open_as(&f, a, &other, WIRE_PROTO_MAJOR, cid);
    CHECK(hr != 0 || closed_within(f.fd, 3000));
    close(f.fd);
    wait_absent_for(a, idc, 500);
    /* removing it again is harmless */
    CHECK_OK(cluster_remove_node(a, idc, out));
    cluster_free(c);
    cluster_free(b);
    cluster_free(a);
}

static bool rotation_done(struct cluster *c)
{
    json_t *kr = view_get(c, "key_rotation");
    bool done = json_is_false(json_object_get(kr, "in_progress")) &&
                json_is_false(json_object_get(kr, "old_key_in_use")) &&
                json_integer_value(json_object_get(kr, "epoch")) > 0;
    json_decref(kr);
    return done;
}

TEST_T(cluster_rotate_key, 90)
{
    struct cluster *all[3];
    char ids[3][40], aa[64], old_tok[WIRE_TOKEN_MAX], new_tok[128], tok[WIRE_TOKEN_MAX];
    start_three(all, ids, aa);
    struct cluster *a = all[0], *b = all[1], *c = all[2];
    const char *ida = ids[0], *idb = ids[1], *idc = ids[2];
    snprintf(old_tok, sizeof old_tok, "%s", cluster_join_token(a));
    int downs = atomic_load(&n_downs);

    CHECK_OK(cluster_rotate_key(a, new_tok, sizeof new_tok));
    CHECK(strncmp(new_tok, "racimo1-", 8) == 0);
    CHECK(strcmp(new_tok, old_tok) != 0);
    /* every member confirms; the old key retires everywhere */
    for (int i = 0; i < 3; i++) {
        int t = 0;
        while (!rotation_done(all[i]) && t++ < 200)
            usleep(25000);
        CHECK(rotation_done(all[i]));
    }
    json_t *kr = view_get(a, "key_rotation");
    CHECK_INT(json_array_size(json_object_get(kr, "not_confirmed")), ==, 0);
    json_decref(kr);
    /* the members stored it; no link was lost; everyone stays up */
    const char *dirs[3] = { "a", "b", "c" };
    for (int i = 0; i < 3; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), dirs[i]);
        CHECK_OK(cluster_read_token(dir, tok, sizeof tok));
        CHECK_STR(tok, new_tok);
        CHECK_STR(cluster_join_token(all[i]), new_tok);
    }
    usleep(DOWN_MS * 1000);
    CHECK_INT(atomic_load(&n_downs), ==, downs);
    CHECK_STR(state_of(a, idb), "up");
    CHECK_STR(state_of(a, idc), "up");
    CHECK_STR(state_of(b, idc), "up");
    CHECK_STR(state_of(c, ida), "up");

    /* the old token is refused; the new one joins */
    struct cluster *d = start_node("d", old_tok, aa, 0);
    wait_absent_for(a, cluster_self_id(d), 1500);
    CHECK_INT(n_nodes(d), ==, 1);
    cluster_free(d);
    struct cluster *e = start_node("e", new_tok, aa, 0);
    wait_state(a, cluster_self_id(e), "up", 5000);
    wait_state(b, cluster_self_id(e), "up", 5000);
    wait_state(e, idc, "up", 5000);
    /* a data channel between members uses the new key */
    cluster_set_channel_handler(a, on_chan, NULL);
    cluster_chan *ch = NULL;
    CHECK_OK(cluster_channel_open(b, ida, 0x46, "after", 5, 3000, &ch));
    cluster_chan *ca = chan_wait(3000);
    CHECK(ca != NULL);
    chan_free(ch);
    chan_free(ca);
    /* a member restarted later comes back with the key it stored */
    cluster_free(c);
    wait_state(a, idc, "down", DOWN_MS + 2000);
    c = all[2] = start_node("c", NULL, aa, 0);
    wait_state(a, idc, "up", 5000);
    cluster_free(e);
    cluster_free(c);
    cluster_free(b);
    cluster_free(a);
}

/* ---- the overlap of a rotation: a member that missed the KEY ---- */

static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET };
    socklen_t sl = sizeof sin;
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) || listen(fd, 4) ||
        getsockname(fd, (struct sockaddr *)&sin, &sl))
        return -1;
    *port = ntohs(sin.sin_port);
    return fd;
}

/* Accepts a dial and answers its handshake as the listener with `key`:
 * 0 when the dialer's AUTH verified (it holds `key`), else non-zero. */
static int fake_accept(fake *f, int lfd, const uint8_t key[32], const wire_identity *id)
{
    uint8_t hello[WIRE_HELLO_BYTES], peer[WIRE_HELLO_BYTES], auth[WIRE_AUTH_BYTES];
    struct pollfd pf = { .fd = lfd, .events = POLLIN };
    /* bounds on waiting for the node's dial, not timings: generous for a
     * loaded machine and a sanitizer build */
    if (poll(&pf, 1, 20000) <= 0 || (f->fd = accept(lfd, NULL, NULL)) < 0)
        return -1;
    wire_session_init(&f->ws, key, id, WIRE_LISTENER, WIRE_PROTO_MAJOR, WIRE_PROTO_MINOR, hello);
    if (send(f->fd, hello, sizeof hello, MSG_NOSIGNAL) != (long)sizeof hello ||
        recv_all(f->fd, peer, sizeof peer, 10000) || wire_on_hello(&f->ws, peer, auth) ||
        send(f->fd, auth, sizeof auth, MSG_NOSIGNAL) != (long)sizeof auth ||
        recv_all(f->fd, auth, sizeof auth, 10000))
        return -1;
    return wire_on_auth(&f->ws, auth);
}

/* Reads records until a message of `type` (one frame); its payload into
 * out (cap bytes).  Its length, or -1. */
static long fake_recv_type(fake *f, int type, uint8_t *out, size_t cap, int ms)
{
    static uint8_t buf[WIRE_REC_MAX], plain[WIRE_FRAME_MAX];
    uint64_t end = os_now_ns() + (uint64_t)ms * 1000000;
    while (os_now_ns() < end) {
        uint8_t hdr[4];
        if (recv_all(f->fd, hdr, 4, 200))
            continue;
        size_t n = wire_get32(hdr);
        if (n > WIRE_REC_MAX - 4)
            return -1;
        memcpy(buf, hdr, 4);
        if (recv_all(f->fd, buf + 4, n, 3000))
            return -1;
        wire_frame fr;
        if (wire_open(&f->ws, buf, n + 4, plain, &fr) <= 0)
            return -1;
        if (fr.type == type && !(fr.flags & WIRE_F_MORE) && fr.n_payload <= cap) {
            memcpy(out, fr.payload, fr.n_payload);
            return (long)fr.n_payload;
        }
    }
    return -1;
}

TEST_T(cluster_rotate_overlap, 120)
{
    MESH_ONLY();
    struct cluster *a = start_node("a", NULL, NULL, 0);
    uint8_t old_key[32], new_key[32];
    wire_identity fid;
    wire_identity_new(&fid);
    char fid_hex[33], new_tok[128];
    wire_hex(fid.id, 16, fid_hex);
    CHECK_OK(wire_token_decode(cluster_join_token(a), old_key, NULL, 0));
    /* a member (by hand) that dials a with the old key, and listens too */
    int port, lfd = listen_any(&port);
    CHECK(lfd >= 0);
    fake f;
    CHECK_OK(fake_open(&f, a, &fid, WIRE_PROTO_MAJOR));
    char st[256];
    int n_st = snprintf(st, sizeof st, "{\"id\":\"%s\",\"name\":\"late\",\"addresses\":"
                        "[\"127.0.0.1\"],\"cluster_port\":%d}", fid_hex, port);
    static uint8_t rec[WIRE_REC_MAX];
    long n = wire_seal(&f.ws, WIRE_STATE, 0, 1, (const uint8_t *)st, (size_t)n_st, false, rec);
    fake_send(&f, rec, (size_t)n);
    wait_state(a, fid_hex, "up", 15000);
    /* the rotation starts while it is up; its link drops before it confirms */
    CHECK_OK(cluster_rotate_key(a, new_tok, sizeof new_tok));
    CHECK_OK(wire_token_decode(new_tok, new_key, NULL, 0));
    close(f.fd);
    wait_state(a, fid_hex, "down", 15000);
    /* a dials it back: with the new key first, which it cannot verify,
     * then at once with the old key (it dials with the old key only after
     * such a refusal).  On a loaded machine a may give up on a dial we
     * were slow to answer and dial again with the new key: each of those
     * fails too, so take dials until one succeeds, a few at most. */
    fake g = { .fd = -1 };
    int refused = 0;
    while (fake_accept(&g, lfd, old_key, &fid) != 0) {
        if (g.fd >= 0)
            close(g.fd);
        g.fd = -1;
        if (++refused > 8)
            FAIL("a never dialled back with the old key (%d dials refused)", refused);
    }
    CHECK(refused >= 1);
    /* and hands it the new key */
    uint8_t got[64];
    CHECK_INT(fake_recv_type(&g, WIRE_KEY, got, sizeof got, 5000), ==, 32 + 8 + 16);
    CHECK(!memcmp(got, new_key, 32));
    wait_state(a, fid_hex, "up", 15000);
    /* it confirms: the rotation ends and the old key retires */
    uint8_t ack[16];
    memcpy(ack, got + 32, 8);
    char fp[WIRE_FP_HEX + 1];
    wire_fingerprint(new_key, fp);
    wire_unhex(fp, ack + 8, 8);
    n = wire_seal(&g.ws, WIRE_KEY_ACK, 0, 1, ack, sizeof ack, false, rec);
    fake_send(&g, rec, (size_t)n);
    for (int t = 0; t < 500 && !rotation_done(a); t++)
        usleep(30000);
    CHECK(rotation_done(a));
    /* malformed allow-list messages are ignored; the link stays */
    uint8_t junk[7] = { 0, 9 };
    n = wire_seal(&g.ws, WIRE_REVOKE, 0, 2, junk, sizeof junk, false, rec);
    fake_send(&g, rec, (size_t)n);
    n = wire_seal(&g.ws, WIRE_KEY, 0, 3, junk, sizeof junk, false, rec);
    fake_send(&g, rec, (size_t)n);
    n = wire_seal(&g.ws, WIRE_KEY_RETIRE, 0, 4, junk, 3, false, rec);
    fake_send(&g, rec, (size_t)n);
    usleep(300000);
    CHECK_STR(state_of(a, fid_hex), "up");
    /* from now on the old key gets nowhere, not even from a known member */
    close(g.fd);
    wait_state(a, fid_hex, "down", 15000);
    CHECK(fake_accept(&g, lfd, old_key, &fid) != 0);
    close(g.fd);
    fake_open_key(&f, a, old_key, &fid, WIRE_PROTO_MAJOR);
    CHECK(closed_within(f.fd, 15000));
    close(f.fd);
    CHECK_STR(state_of(a, fid_hex), "down");
    close(lfd);
    cluster_free(a);
}

/* ---- SWIM beside the mesh (membership.c, issue 22) ---- */

static long swim_count(struct cluster *c, const char *key)
{
    json_t *s = cluster_snapshot(c);
    json_t *v = json_object_get(json_object_get(s, "swim"), key);
    long n = json_is_integer(v) ? (long)json_integer_value(v) : -1;
    json_decref(s);
    return n;
}

static int wait_swim(struct cluster *c, const char *key, long want, int ms)
{
    for (int t = 0; t < ms; t += 20) {
        if (swim_count(c, key) == want)
            return t;
        usleep(20000);
    }
    FAIL("swim %s stayed %ld, expected %ld within %d ms", key, swim_count(c, key), want, ms);
}

TEST_T(cluster_swim_beside_mesh, 60)
{
    start_with_swim = 1;
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64];
    addr_of(a, aa, sizeof aa);
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    struct cluster *c = start_node("c", cluster_join_token(a), aa, 0);
    /* the members proven by the links join SWIM, whose datagrams (sealed
     * with the cluster key) then keep all three alive */
    wait_swim(a, "alive", 3, 30000);
    wait_swim(b, "alive", 3, 30000);
    wait_swim(c, "alive", 3, 30000);
    usleep(1500 * 1000);                     /* several probe periods: nobody dead */
    /* (a suspicion raised and refuted is SWIM working on a loaded machine) */
    CHECK_INT(swim_count(a, "dead"), ==, 0);
    CHECK_INT(swim_count(a, "alive") + swim_count(a, "suspect"), ==, 3);
    CHECK_INT(swim_count(a, "refused"), ==, 0);
    /* what b serves reaches a through b's SWIM digest: the free slots a
     * router would use to reach a copy in one hop */
    const char *names[] = { "tiny" };
    int fr[] = { 3 }, sl[] = { 4 };
    cluster_set_serving(b, names, fr, sl, 1);
    long got = -1;
    for (int t = 0; t < 30000 && got != 3; t += 20) {
        json_t *s = cluster_snapshot(a);
        json_t *m = json_object_get(json_object_get(json_object_get(s, "swim"), "serving"), "tiny");
        got = m ? (long)json_integer_value(json_object_get(m, "free")) : -1;
        if (m) CHECK_INT(json_integer_value(json_object_get(m, "nodes")), ==, 1);
        json_decref(s);
        usleep(20000);
    }
    CHECK_INT(got, ==, 3);
    /* a node stopping says so: the others see it left */
    cluster_free(c);
    wait_swim(a, "left", 1, 30000);
    wait_swim(b, "left", 1, 30000);
    CHECK_INT(swim_count(a, "alive"), ==, 2);
    cluster_free(b);
    cluster_free(a);
}

/* With SWIM on, SWIM's view decides up/down, the leader and the quorum:
 * a member whose link is open and fresh but that never answers a probe
 * (c runs without SWIM) is declared down, and counts as down for the
 * quorum and the leader, while the links stay. */
TEST_T(cluster_swim_decides_up, 60)
{
    start_with_swim = 1;
    struct cluster *a = start_node("a", NULL, NULL, 0);
    char aa[64], ida[40], idb[40], idc[40];
    addr_of(a, aa, sizeof aa);
    struct cluster *b = start_node("b", cluster_join_token(a), aa, 0);
    start_with_swim = -1;
    struct cluster *c = start_node("c", cluster_join_token(a), aa, 0);
    start_with_swim = 1;
    snprintf(ida, sizeof ida, "%s", cluster_self_id(a));
    snprintf(idb, sizeof idb, "%s", cluster_self_id(b));
    snprintf(idc, sizeof idc, "%s", cluster_self_id(c));
    wait_state(a, idb, "up", 10000);
    wait_state(b, ida, "up", 10000);
    /* c links (and so joins SWIM on a and b), then fails every probe */
    wait_state(c, ida, "up", 10000);
    wait_state(a, idc, "down", 15000);
    wait_state(b, idc, "down", 15000);
    /* ...while c, without SWIM, sees its open links and calls a and b up */
    CHECK_STR(state_of(c, ida), "up");
    CHECK_STR(state_of(c, idb), "up");
    json_t *s = cluster_snapshot(a);
    CHECK_INT(json_integer_value(json_object_get(s, "members")), ==, 3);
    CHECK_INT(json_integer_value(json_object_get(s, "members_up")), ==, 2);
    CHECK(json_is_true(json_object_get(s, "quorum")));
    /* the leader is the smallest id among those SWIM keeps alive */
    const char *lead = json_string_value(json_object_get(s, "leader"));
    CHECK_STR(lead, strcmp(ida, idb) < 0 ? ida : idb);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(s, "swim"), "dead")), ==, 1);
    json_decref(s);
    /* b leaving says so over SWIM: a is alone of three, without quorum */
    cluster_free(b);
    wait_state(a, idb, "down", DOWN_MS + 3000);
    CHECK(!cluster_has_quorum(a));
    cluster_free(c);
    cluster_free(a);
}

/* links open from this node (from == self) in its own view (the view also
 * lists the cached measures of links since closed, "linked": false) */
static int own_links(struct cluster *c)
{
    json_t *s = cluster_snapshot(c), *l;
    const char *self = cluster_self_id(c);
    size_t i;
    int n = 0;
    json_array_foreach(json_object_get(s, "links"), i, l)
        n += !strcmp(json_string_value(json_object_get(l, "from")), self) &&
             json_is_true(json_object_get(l, "linked"));
    json_decref(s);
    return n;
}

static int all_up_in(struct cluster *c)
{
    json_t *s = cluster_snapshot(c);
    int n = (int)json_integer_value(json_object_get(s, "members_up"));
    json_decref(s);
    return n;
}

/* n nodes "a", "b"... joining a with its token; returns once every node
 * sees all n up, though each first linked only to a */
static void start_ring(struct cluster **n, int count)
{
    char aa[64], name[8];
    n[0] = start_node("a", NULL, NULL, 0);
    addr_of(n[0], aa, sizeof aa);
    for (int i = 1; i < count; i++) {
        snprintf(name, sizeof name, "%c", 'a' + i);
        n[i] = start_node(name, cluster_join_token(n[0]), aa, 0);
    }
    for (int i = 0; i < count; i++)
        for (int t = 0; all_up_in(n[i]) != count; t += 20) {
            if (t > 30000) FAIL("node %d sees %d of %d up", i, all_up_in(n[i]), count);
            usleep(20000);
        }
}

/* With SWIM, no full mesh: 6 nodes, each keeping links with its 2 ring
 * neighbours only, all see all 6 up; a message to a node that is not a
 * neighbour opens a link on demand, which closes again once idle; what a
 * node without a link serves comes from its SWIM digest. */
TEST_T(cluster_swim_links_on_demand, 90)
{
    enum { N = 6 };
    start_with_swim = 1;
    cfg_neighbours = 2;
    cfg_idle_ms = 1500;
    cfg_handler = on_msg;
    struct cluster *n[N];
    start_ring(n, N);
    /* the links to a that are not a's neighbours close once idle: each
     * node keeps its 2 neighbours (and a link or two still idling out) */
    for (int i = 0; i < N; i++)
        for (int t = 0; own_links(n[i]) > 2; t += 50) {
            if (t > 30000) FAIL("node %d still draws %d links", i, own_links(n[i]));
            usleep(50000);
        }
    /* a node that is not one of a's neighbours */
    int far = -1;
    for (int i = 1; i < N && far < 0; i++) {
        json_t *s = cluster_snapshot(n[0]);
        json_t *rec = find_node(s, cluster_self_id(n[i]));
        json_t *l;
        size_t j;
        bool linked = false;
        json_array_foreach(json_object_get(s, "links"), j, l)
            linked = linked || (!strcmp(json_string_value(json_object_get(l, "to")),
                                        cluster_self_id(n[i])) &&
                                !strcmp(json_string_value(json_object_get(l, "from")),
                                        cluster_self_id(n[0])) &&
                                json_is_true(json_object_get(l, "linked")));
        if (rec && !linked)
            far = i;
        json_decref(s);
    }
    CHECK(far > 0);
    /* what it serves reaches a through its digest */
    const char *names[] = { "tiny" };
    int fr[] = { 2 }, sl[] = { 3 };
    cluster_set_serving(n[far], names, fr, sl, 1);
    bool seen = false;
    for (int t = 0; t < 30000 && !seen; t += 20) {
        json_t *s = cluster_snapshot(n[0]);
        json_t *rec = find_node(s, cluster_self_id(n[far]));
        seen = rec && json_integer_value(json_object_get(json_object_get(rec, "serving_free"),
                                                         "tiny")) == 2;
        json_decref(s);
        if (!seen) usleep(20000);
    }
    CHECK(seen);
    /* a message to it: a link opens on demand and carries it */
    pthread_mutex_lock(&got_mu);
    got_len = 0;
    pthread_mutex_unlock(&got_mu);
    static uint8_t msg[1000];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 7);
    uint8_t want[32];
    crypto_generichash(want, 32, msg, sizeof msg, NULL, 0);
    CHECK_OK(cluster_send(n[0], cluster_self_id(n[far]), 0x41, msg, sizeof msg));
    size_t len = 0;
    for (int t = 0; t < 10000 && len != sizeof msg; t += 20) {
        usleep(20000);
        pthread_mutex_lock(&got_mu);
        len = got_len;
        pthread_mutex_unlock(&got_mu);
    }
    CHECK_INT(len, ==, sizeof msg);
    CHECK(!memcmp(got_hash, want, 32));
    /* ...and closes once idle: a is back to its neighbours */
    for (int t = 0; own_links(n[0]) > 2; t += 50) {
        if (t > 30000) FAIL("a still draws %d links", own_links(n[0]));
        usleep(50000);
    }
    CHECK_INT(all_up_in(n[0]), ==, N);
    for (int i = N - 1; i >= 0; i--)
        cluster_free(n[i]);
    cfg_neighbours = cfg_idle_ms = 0;
    cfg_handler = NULL;
}

/* The entry of the link from `from` to `to` in from's own view (a copy, or
 * NULL when the view lists none). */
static json_t *link_entry(struct cluster *from, const char *to)
{
    json_t *s = cluster_snapshot(from), *l, *got = NULL;
    size_t i;
    json_array_foreach(json_object_get(s, "links"), i, l)
        if (!got && !strcmp(json_string_value(json_object_get(l, "from")), cluster_self_id(from)) &&
            !strcmp(json_string_value(json_object_get(l, "to")), to))
            got = json_deep_copy(l);
    json_decref(s);
    return got;
}

/* Polls `from`'s entry of the link to `to` for up to 30 s until it is gone
 * (want_gone) or shown closed; returns the entry then (NULL when gone or
 * when the wait ran out) and leaves the last entry seen in last. */
static json_t *wait_link_entry(struct cluster *from, const char *to, bool want_gone,
                               bool *reached, char *last, size_t n_last)
{
    *reached = false;
    for (int t = 0; t < 30000; t += 20) {
        json_t *e = link_entry(from, to);
        *reached = want_gone ? !e : e && json_is_false(json_object_get(e, "linked"));
        char *d = e ? json_dumps(e, JSON_COMPACT) : NULL;
        snprintf(last, n_last, "%s", d ? d : "none");
        free(d);
        if (*reached)
            return e;
        json_decref(e);
        usleep(20000);
    }
    return NULL;
}

/* Placement asks for the links of its candidates: with SWIM a node that
 * has no link to a candidate opens one on demand, measures RTT and
 * bandwidth, and keeps the measure with its age after the link closed
 * (shown "linked": false); asked again while it is young, nothing is
 * measured; once older than measure_max_age_ms it leaves the view and a
 * new request measures it again.  On a link kept open, an old bandwidth
 * measure is probed again at once. */
TEST_T(cluster_swim_measure_on_demand, 90)
{
    enum { N = 6 };
    start_with_swim = 1;
    cfg_neighbours = 2;
    cfg_idle_ms = 1500;
    cfg_measure_age_ms = 4000;
    struct cluster *n[N];
    start_ring(n, N);
    /* a pair that are not ring neighbours (ids 2 apart or more on the ring
     * of ids; a neighbour's link may still be forming) and never linked: no
     * entry, not even a cached measure (the joiners all linked to a, so
     * the asker is another node) */
    int rank[N];
    for (int i = 0; i < N; i++) {
        rank[i] = 0;
        for (int j = 0; j < N; j++)
            rank[i] += strcmp(cluster_self_id(n[j]), cluster_self_id(n[i])) < 0;
    }
    int ask = -1, far = -1;
    for (int i = 1; i < N && ask < 0; i++)
        for (int j = 1; j < N && far < 0; j++) {
            int d = abs(rank[i] - rank[j]);
            if (i == j || d < 2 || N - d < 2)
                continue;
            json_t *e = link_entry(n[i], cluster_self_id(n[j]));
            if (!e) {
                ask = i;
                far = j;
            }
            json_decref(e);
        }
    if (ask < 0)
        FAIL("no two nodes 2 apart on the ring without a link or a measure (of %d)", N);
    const char *ids[] = { cluster_self_id(n[far]), "not-an-id", cluster_self_id(n[ask]) };
    CHECK_INT(cluster_measure_links(n[ask], ids, 3, 20000), ==, 1);
    json_t *e = link_entry(n[ask], ids[0]);
    CHECK(e != NULL);
    CHECK(json_number_value(json_object_get(e, "rtt_ms")) > 0);
    CHECK(json_number_value(json_object_get(e, "bandwidth_mbps")) > 0);
    CHECK(json_is_integer(json_object_get(e, "age_ms")));
    CHECK_INT(json_integer_value(json_object_get(e, "age_ms")), <, 4000);
    json_decref(e);
    /* young: taken from the cache, nothing opened */
    CHECK_INT(cluster_measure_links(n[ask], ids, 1, 20000), ==, 0);
    /* the link idles out; the measure stays, with its age */
    bool closed;
    char last[512] = "none";
    e = wait_link_entry(n[ask], ids[0], false, &closed, last, sizeof last);
    if (closed) {
        CHECK(json_number_value(json_object_get(e, "rtt_ms")) > 0);
        CHECK(json_integer_value(json_object_get(e, "age_ms")) >= 0);
    }
    json_decref(e);
    if (!closed)
        FAIL("the link opened for the measure did not close after 1.5 s idle while its measure "
             "was young (last entry: %s)", last);
    /* too old: out of the view, and measured again when asked */
    bool gone;
    json_decref(wait_link_entry(n[ask], ids[0], true, &gone, last, sizeof last));
    if (!gone)
        FAIL("a measure older than 4 s is still shown: %s", last);
    CHECK_INT(cluster_measure_links(n[ask], ids, 1, 20000), ==, 1);
    e = link_entry(n[ask], ids[0]);
    CHECK(e != NULL);
    CHECK_INT(json_integer_value(json_object_get(e, "age_ms")), <, 4000);
    json_decref(e);
    /* a link kept open (a neighbour's) whose bandwidth is older than that:
     * probed at once, not at its next probe (30 x probe_ms = 9 s apart).
     * Any open link will do: a loaded machine may close a neighbour's link
     * as silent and open it again (a fresh measure), so watch them all */
    const char *nb = NULL;
    json_int_t age = 0;
    for (int t = 0; t < 60000 && !nb; t += 50) {
        for (int j = 0; j < N && !nb; j++) {
            e = j != ask ? link_entry(n[ask], cluster_self_id(n[j])) : NULL;
            if (e && json_is_true(json_object_get(e, "linked")) &&
                (age = json_integer_value(json_object_get(e, "age_ms"))) > 4000)
                nb = cluster_self_id(n[j]);
            json_decref(e);
        }
        if (!nb) usleep(50000);
    }
    if (!nb)
        FAIL("no open link's measure grew older than 4 s in 60 s");
    CHECK_INT(age, >, 4000);
    CHECK_INT(cluster_measure_links(n[ask], &nb, 1, 20000), ==, 1);
    e = link_entry(n[ask], nb);
    CHECK(e != NULL && json_is_true(json_object_get(e, "linked")));
    CHECK_INT(json_integer_value(json_object_get(e, "age_ms")), <, 4000);
    json_decref(e);
    for (int i = N - 1; i >= 0; i--)
        cluster_free(n[i]);
    cfg_neighbours = cfg_idle_ms = cfg_measure_age_ms = 0;
}
