/* test_swim.c - the SWIM membership core (src/cluster/swim.c) driven by the
 * simulated network of swim_net.c: joins, crash detection and the
 * suspicion timeout, refutation, indirect probes, partitions, leaving,
 * metadata updates and hostile packets.  Time is simulated, so the limits
 * below are in simulated milliseconds and do not depend on the machine.
 */
#include "test.h"

#include "base/err.h"
#include "cluster/node_digest.h"
#include "cluster/swim_seal.h"
#include "swim_net.h"

static simnet *cluster(int n, const swim_config *cfg, double loss, uint64_t seed)
{
    swim_config def;
    swim_config_default(&def);
    simnet_cfg ncfg = { .loss = loss, .delay_min_ms = 1, .delay_max_ms = 5 };
    simnet *net = simnet_new(n, cfg ? cfg : &def, &ncfg, seed);
    CHECK(net);
    for (int i = 0; i < n; i++) CHECK_INT(simnet_start(net, i, i ? 0 : -1), ==, 0);
    return net;
}

static bool someone_suspects(simnet *net, void *arg)
{
    int victim = *(int *)arg;
    for (int j = 0; j < simnet_size(net); j++)
        if (j != victim && simnet_node(net, j) &&
            swim_state_of(simnet_node(net, j), simnet_id(net, victim)) == SWIM_SUSPECT)
            return true;
    return false;
}

TEST(swim_join_converges)
{
    /* 50 nodes joining through the first, then one more through another
     * member: all see it within 10 probe periods */
    simnet *net = cluster(51, NULL, 0, 2);
    simnet_crash(net, 50);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
    simnet_run(net, 10000);
    CHECK_INT(simnet_start(net, 50, 17), ==, 0);
    simnet_see a = { 50, SWIM_ALIVE };
    long t = simnet_run_until(net, simnet_cond_all_see, &a, 10, 30000);
    CHECK(t >= 0);
    CHECK_INT(t, <=, 10 * 500);
    simnet_free(net);
}

TEST(swim_crash_suspected_then_dead_after_timeout)
{
    simnet *net = cluster(20, NULL, 0, 3);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
    int victim = 7;
    simnet_crash(net, victim);
    long t_susp = simnet_run_until(net, someone_suspects, &victim, 5, 30000);
    CHECK(t_susp >= 0);
    /* nobody declares it dead before the shortest suspicion timeout:
     * suspicion_mult * log10(20) * period = 1.5 * 1.3 * 500 ms = 975 ms */
    simnet_see dead = { victim, SWIM_DEAD };
    simnet_run(net, 900);
    for (int j = 0; j < 20; j++)
        if (j != victim) CHECK(swim_state_of(simnet_node(net, j), simnet_id(net, victim)) != SWIM_DEAD);
    long t_dead = simnet_run_until(net, simnet_cond_all_see, &dead, 10, 30000);
    CHECK(t_dead >= 0);
    /* and all do within the longest one (4x) plus dissemination */
    CHECK_INT(900 + t_dead, <=, 4 * 976 + 2000);
    simnet_free(net);
}

TEST(swim_suspect_refutes)
{
    simnet *net = cluster(10, NULL, 0, 4);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
    /* node 3 alone is cut off just long enough to be suspected, well under
     * the suspicion timeout, then heard again: it must refute, not die */
    int victim = 3;
    for (int i = 0; i < 10; i++) simnet_set_group(net, i, i == victim);
    simnet_partition(net, true);
    CHECK(simnet_run_until(net, someone_suspects, &victim, 5, 30000) >= 0);
    simnet_partition(net, false);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 20, 5000) >= 0);
    swim_stats st;
    swim_get_stats(simnet_node(net, victim), &st);
    CHECK_INT(st.refutes, >=, 1);
    CHECK_INT(st.incarnation, >=, 1);
    simnet_stats ns;
    simnet_get_stats(net, &ns);
    CHECK_INT(ns.false_dead, ==, 0);
    simnet_free(net);
}

static uint64_t suspicions_of(simnet *net, int node)
{
    swim_stats st;
    swim_get_stats(simnet_node(net, node), &st);
    return st.suspects_raised;
}

TEST(swim_indirect_probe_avoids_false_suspicion)
{
    /* nodes 0 and 1 cannot reach each other, everyone else reaches both:
     * the indirect probes through others keep 0 and 1 from suspecting
     * each other.  The same run without indirect probes (k = 0) shows the
     * test can tell: there they do. */
    for (int k = 3; k >= 0; k -= 3) {
        swim_config cfg;
        swim_config_default(&cfg);
        cfg.indirect_k = k;
        simnet *net = cluster(8, &cfg, 0, 5);
        CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
        uint64_t s0 = suspicions_of(net, 0), s1 = suspicions_of(net, 1);
        simnet_block(net, 0, 1, true);
        simnet_run(net, 60000);
        uint64_t raised = suspicions_of(net, 0) - s0 + suspicions_of(net, 1) - s1;
        if (k) CHECK_INT(raised, ==, 0);
        else CHECK_INT(raised, >, 0);
        simnet_free(net);
    }
}

TEST(swim_no_false_dead_at_5pct_loss)
{
    simnet *net = cluster(100, NULL, 0, 6);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 60000) >= 0);
    simnet_set_loss(net, 0.05);
    simnet_run(net, 120000);
    simnet_stats st;
    simnet_get_stats(net, &st);
    CHECK_INT(st.false_dead, ==, 0);
    simnet_free(net);
}

TEST(swim_partition_heals)
{
    simnet *net = cluster(40, NULL, 0, 7);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
    for (int i = 0; i < 40; i++) simnet_set_group(net, i, i % 2);
    simnet_partition(net, true);
    simnet_run(net, 30000);
    /* each side has declared the other dead */
    CHECK_INT(swim_state_of(simnet_node(net, 0), simnet_id(net, 1)), ==, SWIM_DEAD);
    CHECK_INT(swim_state_of(simnet_node(net, 1), simnet_id(net, 0)), ==, SWIM_DEAD);
    simnet_partition(net, false);
    long t = simnet_run_until(net, simnet_cond_converged, NULL, 10, 30000);
    CHECK(t >= 0);
    CHECK_INT(t, <=, 6 * 500);                 /* target 3 periods; margin 2x */
    simnet_free(net);
}

TEST(swim_leave_and_metadata)
{
    simnet *net = cluster(12, NULL, 0, 8);
    CHECK(simnet_run_until(net, simnet_cond_converged, NULL, 50, 30000) >= 0);
    const uint8_t meta[] = "models=tiny:3/4";
    CHECK_OK(swim_set_meta(simnet_node(net, 5), meta, sizeof meta, simnet_now(net)));
    simnet_run(net, 3000);
    for (int j = 0; j < 12; j++) {
        swim *s = simnet_node(net, j);
        bool found = false;
        for (size_t i = 0; i < swim_n_members(s); i++) {
            swim_member_view v;
            CHECK_OK(swim_member_at(s, i, &v));
            if (!memcmp(v.id, simnet_id(net, 5), SWIM_ID_BYTES)) {
                if (v.meta_len != sizeof meta) FAIL("node %d sees meta_len %zu inc %u", j, v.meta_len, v.incarnation);
                CHECK(!memcmp(v.meta, meta, sizeof meta));
                found = true;
            }
        }
        CHECK(found);
    }
    uint8_t big[SWIM_META_MAX + 1] = { 0 };
    CHECK_INT(swim_set_meta(simnet_node(net, 5), big, sizeof big, simnet_now(net)), ==, RC_ELIMIT);

    simnet_leave(net, 9);
    simnet_see left = { 9, SWIM_LEFT };
    CHECK(simnet_run_until(net, simnet_cond_all_see, &left, 10, 5000) >= 0);
    simnet_stats st;
    simnet_get_stats(net, &st);
    CHECK_INT(st.false_dead, ==, 0);
    simnet_free(net);
}

static void drop_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable) {}

TEST(swim_hostile_packets)
{
    swim_config cfg;
    swim_config_default(&cfg);
    swim_io io = { drop_send, NULL, NULL };
    uint8_t me[SWIM_ID_BYTES] = { 1 }, other[SWIM_ID_BYTES] = { 2 };
    swim *s = swim_new(&cfg, &io, me, NULL, 0, 1, 0);
    CHECK(s);
    uint8_t pkt[200];
    /* too short, wrong version, unknown type */
    memset(pkt, 0, sizeof pkt);
    CHECK_INT(swim_recv(s, pkt, 10, 1), ==, RC_EFORMAT);
    pkt[0] = 9; pkt[1] = 1;
    CHECK_INT(swim_recv(s, pkt, 49, 1), ==, RC_EFORMAT);
    pkt[0] = 1; pkt[1] = 99;
    CHECK_INT(swim_recv(s, pkt, 49, 1), ==, RC_EFORMAT);
    /* claims to come from this node itself */
    pkt[1] = 5;
    memcpy(pkt + 2, me, SWIM_ID_BYTES);
    CHECK_INT(swim_recv(s, pkt, 49, 1), ==, RC_EFORMAT);
    /* announces 3 updates, holds half of one */
    memcpy(pkt + 2, other, SWIM_ID_BYTES);
    pkt[48] = 3;
    pkt[49] = 1;                                /* alive */
    CHECK_INT(swim_recv(s, pkt, 60, 1), ==, RC_EFORMAT);
    /* an alive update whose metadata runs past the end */
    memset(pkt + 49, 0, 40);
    pkt[48] = 1;
    pkt[49] = 1;
    pkt[50] = 3;                                /* id 3 */
    pkt[49 + 21] = 200;                         /* meta_len beyond the packet */
    CHECK_INT(swim_recv(s, pkt, 49 + 22 + 10, 1), ==, RC_EFORMAT);
    CHECK_INT(swim_n_members(s), ==, 1);
    /* a well-formed one still works afterwards */
    pkt[49 + 21] = 4;
    CHECK_INT(swim_recv(s, pkt, 49 + 22 + 4, 1), ==, 0);
    CHECK_INT(swim_n_members(s), ==, 2);
    swim_stats st;
    swim_get_stats(s, &st);
    CHECK_INT(st.bad, ==, 6);
    /* a push-pull claiming a million members is refused, not allocated */
    memset(pkt, 0, sizeof pkt);
    pkt[0] = 1; pkt[1] = 6;
    memcpy(pkt + 2, other, SWIM_ID_BYTES);
    pkt[50] = 0x0f; pkt[51] = 0x42; pkt[52] = 0x40;
    CHECK_INT(swim_recv(s, pkt, 53, 1), ==, 0);
    CHECK_INT(swim_n_members(s), ==, 2);
    swim_free(s);
}

TEST(swim_node_digest)
{
    node_digest d = { .ipv4 = { 10, 0, 0, 7 }, .cluster_port = 7719, .http_port = 8080,
                      .cores = 8, .mem_total_mib = 32768, .mem_free_mib = 30000, .n_models = 2 };
    strcpy(d.models[0].name, "qwen2.5-7b-q4_k_m");
    d.models[0].slots = 4; d.models[0].free = 3;
    strcpy(d.models[1].name, "tiny");
    d.models[1].slots = 2; d.models[1].free = 0;
    uint8_t buf[SWIM_META_MAX];
    int n = node_digest_encode(&d, buf, sizeof buf);
    CHECK_INT(n, ==, 20 + 1 + 17 + 4 + 1 + 4 + 4);
    node_digest e;
    CHECK_OK(node_digest_decode(buf, (size_t)n, &e));
    CHECK_INT(e.cluster_port, ==, 7719);
    CHECK_INT(e.mem_free_mib, ==, 30000);
    CHECK_INT(e.n_models, ==, 2);
    CHECK_INT(node_digest_free(&e, "qwen2.5-7b-q4_k_m"), ==, 3);
    CHECK_INT(node_digest_free(&e, "tiny"), ==, 0);
    CHECK_INT(node_digest_free(&e, "other"), ==, -1);
    /* every truncation is refused, none reads past the end */
    for (int cut = 0; cut < n; cut++)
        CHECK_INT(node_digest_decode(buf, (size_t)cut, &e), ==, RC_EFORMAT);
    /* free above slots is clamped; an unknown format refused */
    buf[20 + 1 + 17 + 2] = 9;
    CHECK_OK(node_digest_decode(buf, (size_t)n, &e));
    CHECK_INT(e.models[0].free, ==, 4);
    buf[0] = 2;
    CHECK_INT(node_digest_decode(buf, (size_t)n, &e), ==, RC_EFORMAT);
    /* too big for the room given */
    CHECK_INT(node_digest_encode(&d, buf, 30), ==, RC_ELIMIT);
    d.models[1].name[0] = 0;
    CHECK_INT(node_digest_encode(&d, buf, sizeof buf), ==, RC_EINVAL);
}

TEST(swim_seal_datagrams)
{
    uint8_t ck[32], ck2[32], k[SWIM_SEAL_KEY_BYTES], k2[SWIM_SEAL_KEY_BYTES];
    for (int i = 0; i < 32; i++) { ck[i] = (uint8_t)i; ck2[i] = (uint8_t)(i + 1); }
    swim_seal_key(ck, k);
    swim_seal_key(ck2, k2);
    CHECK(memcmp(k, ck, 32) != 0);                    /* a subkey, not the key itself */
    const uint8_t msg[] = "a SWIM packet of some length";
    uint8_t d[128], d2[128], p[128];
    int n = swim_seal(k, msg, sizeof msg, d, sizeof d);
    CHECK_INT(n, ==, (int)sizeof msg + SWIM_SEAL_OVERHEAD);
    CHECK_INT(swim_seal(k, msg, sizeof msg, d2, sizeof d2), ==, n);
    CHECK(memcmp(d, d2, (size_t)n) != 0);             /* a fresh nonce each time */
    CHECK_INT(swim_open(k, d, (size_t)n, p, sizeof p), ==, (int)sizeof msg);
    CHECK(!memcmp(p, msg, sizeof msg));
    CHECK_INT(swim_open(k2, d, (size_t)n, p, sizeof p), ==, RC_EFORMAT);     /* other cluster */
    for (int i = 0; i < n; i += 7) {                  /* any altered byte */
        d[i] ^= 0x20;
        CHECK_INT(swim_open(k, d, (size_t)n, p, sizeof p), ==, RC_EFORMAT);
        d[i] ^= 0x20;
    }
    CHECK_INT(swim_open(k, d, SWIM_SEAL_OVERHEAD - 1, p, sizeof p), ==, RC_EFORMAT);
    CHECK_INT(swim_open(k, d, (size_t)n, p, 3), ==, RC_ELIMIT);
    CHECK_INT(swim_seal(k, msg, sizeof msg, d, 20), ==, RC_ELIMIT);
}

/* keeps every packet a node sends, to replay them altered */
typedef struct { uint8_t buf[64][SWIM_PACKET_MAX]; size_t len[64]; int n; } capture;
static void capture_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable)
{
    capture *c = ctx;
    if (c->n < 64 && len <= SWIM_PACKET_MAX) {
        memcpy(c->buf[c->n], buf, len);
        c->len[c->n++] = len;
    }
}

TEST(swim_altered_packets)
{
    /* real packets (a push-pull with metadata, pings carrying updates),
     * each byte flipped and each length cut in turn, fed to another node:
     * refused or applied, never a crash or an over-read (test-san) */
    swim_config cfg;
    swim_config_default(&cfg);
    static capture cap;
    swim_io io = { capture_send, NULL, &cap };
    uint8_t a[SWIM_ID_BYTES] = { 1 }, b[SWIM_ID_BYTES] = { 2 }, c[SWIM_ID_BYTES] = { 3 };
    const uint8_t meta[] = "some metadata";
    swim *sa = swim_new(&cfg, &io, a, meta, sizeof meta, 1, 0);
    CHECK(sa);
    CHECK_OK(swim_join(sa, b, 0));
    CHECK_OK(swim_join(sa, c, 0));
    for (uint64_t t = 0; t < 3000; t += 50) swim_tick(sa, t);
    CHECK_INT(cap.n, >, 4);
    swim_io quiet = { drop_send, NULL, NULL };
    for (int i = 0; i < cap.n; i++) {
        for (size_t at = 0; at < cap.len[i]; at++) {
            swim *sb = swim_new(&cfg, &quiet, b, NULL, 0, 2, 0);
            CHECK(sb);
            uint8_t p[SWIM_PACKET_MAX];
            memcpy(p, cap.buf[i], cap.len[i]);
            p[at] ^= (uint8_t)(0x5a + at);
            swim_recv(sb, p, cap.len[i], 10);
            swim_recv(sb, cap.buf[i], at, 10);            /* cut short */
            swim_tick(sb, 20);
            swim_free(sb);
        }
    }
    swim_free(sa);
}

/* Two machines whose packets are delivered at once, as on loopback: the
 * time swim_tick returns is always later than the time it was given - a
 * host sleeping until then (membership.c) would otherwise wake up again at
 * once, spinning a core (it did, from an ack until the period's end). */
typedef struct { uint8_t to, buf[SWIM_PACKET_MAX]; size_t len; } held_pkt;
static held_pkt pair_q[256];
static int pair_n;
static void pair_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable)
{
    if (pair_n < 256 && len <= SWIM_PACKET_MAX) {
        pair_q[pair_n].to = to[0];
        memcpy(pair_q[pair_n].buf, buf, len);
        pair_q[pair_n++].len = len;
    }
}

TEST(swim_tick_never_returns_the_past)
{
    swim_config cfg;
    swim_config_default(&cfg);
    swim_io io = { pair_send, NULL, NULL };
    uint8_t ida[SWIM_ID_BYTES] = { 1 }, idb[SWIM_ID_BYTES] = { 2 };
    swim *s[2] = { swim_new(&cfg, &io, ida, NULL, 0, 1, 0), swim_new(&cfg, &io, idb, NULL, 0, 2, 0) };
    CHECK(s[0] && s[1]);
    CHECK_OK(swim_join(s[0], idb, 0));
    uint64_t next[2] = { 0, 0 };
    int wakeups = 0;
    for (uint64_t t = 0; t < 10000;) {
        for (int i = 0; i < 2; i++)
            if (next[i] <= t) {
                next[i] = swim_tick(s[i], t);
                wakeups++;
                CHECK_INT(next[i], >, t);
            }
        for (int k = 0; k < pair_n; k++)      /* delivered within the same millisecond */
            swim_recv(s[pair_q[k].to - 1], pair_q[k].buf, pair_q[k].len, t);
        pair_n = 0;
        t = next[0] < next[1] ? next[0] : next[1];
    }
    CHECK_INT(swim_state_of(s[0], idb), ==, SWIM_ALIVE);
    CHECK_INT(swim_state_of(s[1], ida), ==, SWIM_ALIVE);
    /* probes, gossip and dead probes: tens of wake-ups a second, not more */
    CHECK_INT(wakeups, <, 2 * 10 * 40);
    swim_free(s[0]);
    swim_free(s[1]);
}

/* Both machines ticked every 10 ms from t to end, packets delivered at once. */
static uint64_t pair_run(swim *s[2], uint64_t t, uint64_t end)
{
    for (; t < end; t += 10) {
        for (int i = 0; i < 2; i++) swim_tick(s[i], t);
        for (int k = 0; k < pair_n; k++) swim_recv(s[pair_q[k].to - 1], pair_q[k].buf, pair_q[k].len, t);
        pair_n = 0;
    }
    return t;
}

/* Evidence from outside (the live node: a silent link) suspects a member at
 * once; a member that is alive refutes it from the next packet it gets. */
TEST(swim_suspect_from_outside)
{
    swim_config cfg;
    swim_config_default(&cfg);
    swim_io io = { pair_send, NULL, NULL };
    uint8_t ida[SWIM_ID_BYTES] = { 1 }, idb[SWIM_ID_BYTES] = { 2 };
    swim *s[2] = { swim_new(&cfg, &io, ida, NULL, 0, 3, 0), swim_new(&cfg, &io, idb, NULL, 0, 4, 0) };
    CHECK(s[0] && s[1]);
    pair_n = 0;
    CHECK_OK(swim_join(s[0], idb, 0));
    uint64_t t = pair_run(s, 0, 2000);
    CHECK_INT(swim_state_of(s[0], idb), ==, SWIM_ALIVE);
    swim_suspect(s[0], idb, t);
    CHECK_INT(swim_state_of(s[0], idb), ==, SWIM_SUSPECT);
    swim_suspect(s[0], ida, t);                        /* never itself */
    CHECK_INT(swim_state_of(s[0], ida), ==, SWIM_ALIVE);
    t = pair_run(s, t, t + 2000);
    CHECK_INT(swim_state_of(s[0], idb), ==, SWIM_ALIVE);
    swim_free(s[0]);
    swim_free(s[1]);
}

/* Four machines as in the live node: a machine sends only to members it
 * knows (it has no address for others), packets are delivered at once. */
static swim *quad[4];
static int quad_idx[4] = { 0, 1, 2, 3 };
static void quad_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable)
{
    if (swim_state_of(quad[*(int *)ctx], to) >= 0)
        pair_send(NULL, to, buf, len, reliable);
}

static void quad_run(uint64_t t, uint64_t end)
{
    for (; t < end; t += 10) {
        for (int i = 0; i < 4; i++) swim_tick(quad[i], t);
        for (int k = 0; k < pair_n; k++) swim_recv(quad[pair_q[k].to - 1], pair_q[k].buf, pair_q[k].len, t);
        pair_n = 0;
    }
}

/* A link joins both of its ends to each other (cluster.c): the member the
 * joiner linked to still spreads the news, so a third member hears of the
 * joiner within a few periods, not at the next push-pull (30 s or more;
 * made 10 minutes here).  b already knows d, so it is not a node that
 * knows nobody (such a node announces itself): only a's news of b can
 * reach c. */
TEST(swim_join_both_ways_spreads)
{
    swim_config cfg;
    swim_config_default(&cfg);
    cfg.pushpull_ms = 600000;
    uint8_t id[4][SWIM_ID_BYTES] = { { 1 }, { 2 }, { 3 }, { 4 } }, meta[8] = "digest";
    pair_n = 0;
    for (int i = 0; i < 4; i++) {
        swim_io io = { quad_send, NULL, &quad_idx[i] };
        CHECK(quad[i] = swim_new(&cfg, &io, id[i], meta, sizeof meta, 10 + (uint64_t)i, 0));
    }
    /* a with c, b with d, settled */
    CHECK_OK(swim_join(quad[2], id[0], 0));
    CHECK_OK(swim_join(quad[0], id[2], 0));
    CHECK_OK(swim_join(quad[1], id[3], 0));
    CHECK_OK(swim_join(quad[3], id[1], 0));
    quad_run(0, 5000);
    CHECK_INT(swim_state_of(quad[2], id[0]), ==, SWIM_ALIVE);
    CHECK_INT(swim_state_of(quad[2], id[1]), <, 0);
    /* b links to a: both ends join */
    CHECK_OK(swim_join(quad[1], id[0], 5000));
    CHECK_OK(swim_join(quad[0], id[1], 5000));
    quad_run(5000, 8000);
    CHECK_INT(swim_state_of(quad[2], id[1]), ==, SWIM_ALIVE);
    CHECK_INT(swim_state_of(quad[1], id[2]), ==, SWIM_ALIVE);
    for (int i = 0; i < 4; i++) swim_free(quad[i]);
}

/* A member known only from swim_join (no metadata yet) travels in a
 * push-pull; the receiver then takes the metadata from the member's own
 * news of the same incarnation (else the live node never learnt where the
 * member is: nothing newer came while its metadata stayed the same). */
TEST(swim_placeholder_gets_metadata)
{
    swim_config cfg;
    swim_config_default(&cfg);
    uint8_t id[3][SWIM_ID_BYTES] = { { 1 }, { 2 }, { 3 } }, meta[8] = "digest";
    pair_n = 0;
    for (int i = 0; i < 3; i++) {
        swim_io io = { quad_send, NULL, &quad_idx[i] };
        CHECK(quad[i] = swim_new(&cfg, &io, id[i], meta, sizeof meta, 20 + (uint64_t)i, 0));
    }
    CHECK_OK(swim_join(quad[1], id[2], 0));      /* b: x, without metadata */
    pair_n = 0;                                  /* x never hears of it */
    CHECK_OK(swim_join(quad[1], id[0], 0));      /* b's table, x in it, to a */
    for (int k = 0; k < pair_n; k++) swim_recv(quad[pair_q[k].to - 1], pair_q[k].buf, pair_q[k].len, 0);
    pair_n = 0;
    CHECK_INT(swim_state_of(quad[0], id[2]), ==, SWIM_ALIVE);
    CHECK_OK(swim_join(quad[2], id[0], 10));     /* x's own table, itself in it, to a */
    for (int k = 0; k < pair_n; k++)
        if (pair_q[k].to == 1) swim_recv(quad[0], pair_q[k].buf, pair_q[k].len, 10);
    pair_n = 0;
    size_t meta_len = 0;
    for (size_t i = 0; i < swim_n_members(quad[0]); i++) {
        swim_member_view v;
        if (!swim_member_at(quad[0], i, &v) && !memcmp(v.id, id[2], SWIM_ID_BYTES))
            meta_len = v.meta_len;
    }
    CHECK_INT(meta_len, ==, sizeof meta);
    for (int i = 0; i < 3; i++) swim_free(quad[i]);
}
