/* test_discovery.c - what multicast DNS may and may not make a node do
 * (docs/cluster-protocol.md §2): the on-link rules for a packet's sender
 * (IP TTL 255, the receiving interface's subnet) and for the addresses
 * answers name, the per-name and overall rate limits, and the cluster's
 * side: an answer never moves a node it has authenticated, adds at most a
 * bounded number of unproven nodes, and a failure at an address an answer
 * gave never delays the dials of a node's own addresses.  The cluster
 * tests here use a cluster that is made but not started: no thread runs,
 * so the test may call the cluster thread's functions itself. */
#include "test.h"

#include "base/err.h"
#include "base/log.h"
#include "base/os.h"
#include "cluster/cluster_internal.h"
#include "cluster/mdns_guard.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NS 1000000000ull

static uint32_t ip(const char *s)
{
    struct in_addr a;
    if (inet_pton(AF_INET, s, &a) != 1)
        FAIL("bad test address %s", s);
    return ntohl(a.s_addr);
}

static const mdns_iface IFS[2] = {
    { .index = 2, .addr = 0x0a4d0001, .mask = 0xffffff00 },    /* 10.77.0.1/24 on if 2 */
    { .index = 3, .addr = 0xc0a80105, .mask = 0xffff0000 },    /* 192.168.1.5/16 on if 3 */
};

TEST(discovery_source_rules)
{
    /* a response from a neighbour, as sent: TTL 255 */
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.77.0.9"), 255, true), ==, MDNS_OK);
    /* routed in (or sent with another TTL): not from this link */
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.77.0.9"), 64, true), ==, MDNS_BAD_TTL);
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.77.0.9"), 254, true), ==, MDNS_BAD_TTL);
    /* queries may come with any TTL (legacy resolvers) */
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.77.0.9"), 1, false), ==, MDNS_OK);
    /* a sender off the receiving interface's subnet, even on another of ours */
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.78.0.9"), 255, true), ==, MDNS_OFF_LINK);
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("192.168.7.7"), 255, true), ==, MDNS_OFF_LINK);
    CHECK_INT(mdns_guard_source(IFS, 2, 3, ip("192.168.7.7"), 255, true), ==, MDNS_OK);
    CHECK_INT(mdns_guard_source(IFS, 2, 9, ip("10.77.0.9"), 255, true), ==, MDNS_OFF_LINK);
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("10.77.0.9"), 64, false), ==, MDNS_OK);
    CHECK_INT(mdns_guard_source(IFS, 2, 2, ip("8.8.8.8"), 1, false), ==, MDNS_OFF_LINK);
    /* unknown interface: any of ours; unknown TTL: not checked */
    CHECK_INT(mdns_guard_source(IFS, 2, 0, ip("192.168.7.7"), -1, true), ==, MDNS_OK);
    /* no sender can be these */
    const char *never[] = { "0.0.0.0", "127.0.0.1", "10.77.0.0", "10.77.0.255", "224.0.0.251",
                            "255.255.255.255" };
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        CHECK_INT(mdns_guard_source(IFS, 2, 0, ip(never[i]), 255, true), ==, MDNS_OFF_LINK);
    /* no interfaces known: nothing is on the link */
    CHECK_INT(mdns_guard_source(IFS, 0, 0, ip("10.77.0.9"), 255, true), ==, MDNS_OFF_LINK);
    CHECK(strstr(mdns_guard_why(MDNS_BAD_TTL), "TTL"));
}

TEST(discovery_answer_addresses)
{
    const char *special[] = { "0.0.0.0", "0.1.2.3", "127.0.0.1", "127.9.9.9", "224.0.0.251",
                              "239.1.1.1", "240.0.0.1", "255.255.255.255" };
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip(special[i])), ==, MDNS_ADDR_SPECIAL);
    /* the link's own broadcast and network addresses, and other subnets */
    CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip("10.77.0.255")), ==, MDNS_ADDR_SPECIAL);
    CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip("10.77.0.0")), ==, MDNS_ADDR_SPECIAL);
    CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip("8.8.8.8")), ==, MDNS_ADDR_OFF_LINK);
    CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip("192.168.1.9")), ==, MDNS_ADDR_OFF_LINK);
    CHECK_INT(mdns_guard_addr(IFS, 2, 2, ip("10.77.0.7")), ==, MDNS_OK);
    CHECK_INT(mdns_guard_addr(IFS, 2, 3, ip("192.168.200.1")), ==, MDNS_OK);
    /* a /32 (point to point) has no broadcast address to refuse */
    mdns_iface p2p = { .index = 4, .addr = ip("10.9.9.9"), .mask = 0xffffffff };
    CHECK_INT(mdns_guard_addr(&p2p, 1, 4, ip("10.9.9.9")), ==, MDNS_OK);
}

TEST(discovery_rate_limits)
{
    static mdns_rate r;
    uint64_t t = 5 * NS;
    CHECK(mdns_rate_allow(&r, "node1 [ab]._racimo._tcp.local", t, NS));
    /* the same name (any case) within the second: no */
    CHECK(!mdns_rate_allow(&r, "NODE1 [AB]._racimo._tcp.local", t + NS / 2, NS));
    CHECK(mdns_rate_allow(&r, "node2 [cd]._racimo._tcp.local", t + NS / 2, NS));
    CHECK(mdns_rate_allow(&r, "node1 [ab]._racimo._tcp.local", t + NS, NS));
    /* a flood of names: each allowed once, the table stays bounded, and a
     * name repeated inside the flood is still held back */
    int allowed = 0;
    for (int i = 0; i < 1000; i++) {
        char name[64];
        snprintf(name, sizeof name, "fake%d._racimo._tcp.local", i % 40);
        allowed += mdns_rate_allow(&r, name, t + 2 * NS, NS);
    }
    CHECK_INT(allowed, ==, 40);
    /* a bucket: the burst, then its rate */
    mdns_bucket b = { 0 };
    int n = 0;
    for (int i = 0; i < 100; i++)
        n += mdns_bucket_take(&b, t, 4, 8);
    CHECK_INT(n, ==, 8);
    n = 0;
    for (int i = 0; i < 100; i++)
        n += mdns_bucket_take(&b, t + NS, 4, 8);
    CHECK_INT(n, ==, 4);
}

TEST(log_clean_filters_peer_text)
{
    CHECK_STR(log_clean("node-1"), "node-1");
    CHECK_STR(log_clean(NULL), "");
    CHECK_STR(log_clean("evil\n[info] forged line"), "evil?[info] forged line");
    CHECK_STR(log_clean("\x1b[31mred\x1b[0m"), "?[31mred?[0m");
    CHECK_STR(log_clean("tab\there\r"), "tab?here?");
    CHECK_STR(log_clean("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");   /* UTF-8 stays */
    CHECK_STR(log_clean("c1 \xc2\x9b" "31m"), "c1 ?31m");                           /* C1 CSI */
    CHECK_STR(log_clean("bidi \xe2\x80\xae" "txt"), "bidi ?txt");                  /* U+202E */
    CHECK_STR(log_clean("bad \xff\xc0\x80 utf8"), "bad ??? utf8");
    CHECK_STR(log_clean_n("a\0b", 3), "a?b");
    char longs[400];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = 0;
    const char *c = log_clean(longs);
    CHECK_INT(strlen(c), ==, LOG_CLEAN_MAX + 3);
    CHECK(!strcmp(c + LOG_CLEAN_MAX, "..."));
    /* several in one call are distinct buffers */
    const char *a = log_clean("one"), *b = log_clean("two");
    CHECK_STR(a, "one");
    CHECK_STR(b, "two");
}

TEST(log_lines_stay_one_line)
{
    /* whatever a message quotes (an error text may hold a peer's words),
     * a log line is one line without escape sequences */
    char path[600];
    snprintf(path, sizeof path, "%s/log.txt", test_tmpdir());
    FILE *f = fopen(path, "w+");
    CHECK(f != NULL);
    int saved = dup(2);
    CHECK(dup2(fileno(f), 2) == 2);
    rc_log(LOG_ERROR, "peer said: %s", "bye\nracimo info: forged\x1b[2J");
    dup2(saved, 2);
    close(saved);
    char line[256] = "";
    rewind(f);
    CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    CHECK_STR(line, "racimo error: peer said: bye?racimo info: forged?[2J\n");
}

/* ---- the cluster's side ---- */

static struct cluster *made_cluster(const char *name)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    cluster_config cfg;
    cluster_config_default(&cfg);
    cfg.state_dir = dir;
    cfg.name = name;
    cfg.bench = 0;
    cfg.no_discovery = true;
    struct cluster *c;
    CHECK_OK(cluster_new(&cfg, &c, NULL));
    return c;
}

static cl_node *add_node(struct cluster *c, uint8_t tag, const char *addr, int port)
{
    uint8_t id[WIRE_ID_BYTES];
    memset(id, tag, sizeof id);
    cl_node *n = cl__node_add(c, id);
    CHECK(n != NULL);
    n->member = true;
    n->cluster_port = port;
    if (addr)
        cl__node_add_addr(c, n, addr);
    return n;
}

TEST(discovery_never_moves_a_linked_node)
{
    struct cluster *c = made_cluster("linked");
    cl_node *n = add_node(c, 0x11, "10.77.0.2", 7719);
    static cl_conn link;                  /* stands for an authenticated, open link */
    link.phase = PH_OPEN;
    link.static_idx = -1;
    n->conn = &link;
    snprintf(n->linked, sizeof n->linked, "10.77.0.2");
    char why[160];
    /* pointing its id at another address, or another port: refused, nothing changes */
    CHECK_INT(cl__on_found(c, n->id, "10.77.0.66", 7719, why, sizeof why), ==, -1);
    CHECK(strstr(why, "linked"));
    CHECK_INT(cl__on_found(c, n->id, "10.77.0.2", 9999, why, sizeof why), ==, -1);
    CHECK_INT(n->addrs.n_addrs, ==, 1);
    CHECK_STR(n->addrs.addrs[0], "10.77.0.2");
    CHECK_INT(n->cluster_port, ==, 7719);
    CHECK_STR(n->hint, "");
    /* what it already is: nothing new */
    CHECK_INT(cl__on_found(c, n->id, "10.77.0.2", 7719, why, sizeof why), ==, 1);
    /* this node's own id */
    CHECK_INT(cl__on_found(c, c->nodes[0]->id, "10.77.0.5", 7719, why, sizeof why), ==, -1);
    CHECK(strstr(why, "own id"));
    n->conn = NULL;
    cluster_free(c);
}

TEST(discovery_hint_stays_apart)
{
    struct cluster *c = made_cluster("hint");
    /* a member that is down, known at its proven address */
    cl_node *n = add_node(c, 0x22, "10.77.0.3", 7719);
    snprintf(n->linked, sizeof n->linked, "10.77.0.3");
    n->next_dial_ns = 0;
    char why[160];
    CHECK_INT(cl__on_found(c, n->id, "10.77.0.99", 7719, why, sizeof why), ==, 0);
    /* the answer is only something to try: addresses and port are as they were */
    CHECK_INT(n->addrs.n_addrs, ==, 1);
    CHECK_STR(n->addrs.addrs[0], "10.77.0.3");
    CHECK_INT(n->cluster_port, ==, 7719);
    CHECK_STR(n->hint, "10.77.0.99");
    /* a stranger there refuses our handshake: the hint backs off, the node's
     * own dials do not */
    static cl_conn k;
    k.c = c;
    k.phase = PH_DEAD;
    k.static_idx = -1;
    k.target = n;
    k.refused = true;
    n->hint_dialing = &k;
    uint64_t before = os_now_ns();
    cl__on_closed(c, &k);
    CHECK(n->hint_dialing == NULL);
    CHECK(n->hint_next_ns >= before + 20 * NS);
    CHECK_INT(n->next_dial_ns, ==, 0);
    /* the same answer again does not reset that backoff */
    CHECK_INT(cl__on_found(c, n->id, "10.77.0.99", 7719, why, sizeof why), ==, 1);
    CHECK(n->hint_next_ns >= before + 20 * NS);
    /* a refusal at one of several addresses of its own does not hold the
     * node back either; nor at a proven member's only address (whatever
     * answered there need not be the member); at a candidate's only
     * address it does (another version...) */
    cl__node_add_addr(c, n, "10.77.1.3");
    k.refused = true;
    k.phase = PH_DEAD;
    n->dialing = &k;
    cl__on_closed(c, &k);
    CHECK_INT(n->next_dial_ns, ==, 0);
    cl_node *lone = add_node(c, 0x23, "10.77.0.4", 7719);
    k.target = lone;
    lone->dialing = &k;
    cl__on_closed(c, &k);
    CHECK_INT(lone->next_dial_ns, ==, 0);
    lone->member = false;
    lone->dialing = &k;
    cl__on_closed(c, &k);
    CHECK(lone->next_dial_ns >= before + 20 * NS);
    cluster_free(c);
}

TEST(discovery_bounds_unproven_nodes)
{
    struct cluster *c = made_cluster("flood");
    cl_node *m = add_node(c, 0x33, "10.77.0.4", 7719);
    char why[160];
    /* a stranger announces 300 made-up nodes */
    for (int i = 0; i < 300; i++) {
        uint8_t id[WIRE_ID_BYTES] = { 0xf0, (uint8_t)(i >> 8), (uint8_t)i, 1 };
        char a[32];
        snprintf(a, sizeof a, "10.77.%d.%d", 1 + i / 200, 1 + i % 200);
        CHECK_INT(cl__on_found(c, id, a, 7719, why, sizeof why), ==, 0);
    }
    int unproven = 0;
    for (int i = 1; i < c->n_nodes; i++)
        unproven += !c->nodes[i]->member;
    CHECK_INT(unproven, <=, 32);
    CHECK_INT(unproven, >=, 1);
    /* the newest are kept, the member untouched, and none is in the view */
    uint8_t last[WIRE_ID_BYTES] = { 0xf0, 299 >> 8, 299 & 0xff, 1 };
    CHECK(cl__node_find(c, last) != NULL);
    CHECK(cl__node_find(c, m->id) == m);
    CHECK_INT(m->addrs.n_addrs, ==, 1);
    for (int i = 1; i < c->n_nodes; i++)
        if (!c->nodes[i]->member)
            CHECK_INT(c->nodes[i]->cluster_port, ==, 0);    /* not dialled as a node: only its hint */
    json_t *snap = cluster_snapshot(c);
    CHECK_INT(json_array_size(json_object_get(snap, "nodes")), ==, 2);
    json_decref(snap);
    cluster_free(c);
}
