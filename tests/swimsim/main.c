/* racimo_swimsim - the membership benchmark: N nodes running the real
 * SWIM code (src/cluster/swim.c) over the simulated network of
 * tests/swim_net.c, in simulated time.
 *
 * Usage: racimo_swimsim [-n N[,N...]] [-s seed] [-m minutes]
 *
 * For each N it measures, in simulated time:
 *   boot       N nodes joining through node 0 at once, until all see all
 *   join       one more node joining through a random member, until all see it
 *   crash      a member killed, until the first suspicion and until all see it dead
 *   loss       `minutes` at 5% datagram loss: false "dead", suspicions
 *   partition  two halves cut apart for 30 s then joined, until all see all
 *   msgs/s     datagrams+streams sent per node per second, idle, and bytes/s
 * and prints one table row per N (markdown, for BENCHMARKS.md);
 * SWIMSIM_DEBUG=1 adds each crash's times and idle counters on stderr.  Exit
 * status 1 if a phase did not finish within its limit.
 */
#include "../swim_net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool any_suspect(simnet *net, void *arg)
{
    uint64_t *before = arg;
    simnet_stats st;
    simnet_get_stats(net, &st);
    return st.suspects > *before;
}

static int row(int n, uint64_t seed, int minutes)
{
    swim_config cfg;
    swim_config_default(&cfg);
    simnet_cfg ncfg = { .loss = 0, .delay_min_ms = 1, .delay_max_ms = 5 };
    simnet *net = simnet_new(n + 1, &cfg, &ncfg, seed);
    if (!net) return 1;
    int bad = 0;
    double per = cfg.period_ms;

    for (int i = 0; i < n; i++) simnet_start(net, i, i ? 0 : -1);
    long boot = simnet_run_until(net, simnet_cond_converged, NULL, 100, 120000);
    bad |= boot < 0;
    simnet_run(net, 30000);     /* the joins' broadcasts die out */

    /* idle cost, measured over a minute of a settled cluster */
    simnet_stats a, b;
    simnet_get_stats(net, &a);
    simnet_run(net, 60000);
    simnet_get_stats(net, &b);
    double msgs = (double)(b.packets - a.packets) / n / 60.0;
    if (getenv("SWIMSIM_DEBUG")) {
        int aw = 0; uint64_t sr = 0, rf = 0;
        for (int i = 0; i < n; i++) {
            swim_stats ss; swim_get_stats(simnet_node(net, i), &ss);
            aw += ss.awareness; sr += ss.suspects_raised; rf += ss.refutes;
        }
        fprintf(stderr, "after idle: awareness sum %d, suspects raised %llu, refutes %llu, susp events %llu\n",
                aw, (unsigned long long)sr, (unsigned long long)rf, (unsigned long long)(b.suspects - a.suspects));
    }
    double bytes = (double)(b.bytes - a.bytes) / n / 60.0;

    simnet_start(net, n, 1 + (int)(seed % (uint64_t)(n - 1)));
    simnet_see ja = { n, SWIM_ALIVE };
    long join = simnet_run_until(net, simnet_cond_all_see, &ja, 10, 60000);
    bad |= join < 0;

    /* three crashes one after the other (each restarted afterwards), so the
     * figure is not one lucky or unlucky draw of the probe order */
    long first = 0, dead = 0;
    for (int k = 0; k < 3; k++) {
        int victim = (int)((seed * 7919 + (uint64_t)k * 104729) % (uint64_t)n);
        simnet_get_stats(net, &a);
        simnet_crash(net, victim);
        long f = simnet_run_until(net, any_suspect, &a.suspects, 10, 60000);
        simnet_see ca = { victim, SWIM_DEAD };
        long d = simnet_run_until(net, simnet_cond_all_see, &ca, 10, 60000);
        bad |= f < 0 || d < 0;
        if (getenv("SWIMSIM_DEBUG")) fprintf(stderr, "crash %d: first suspect %ld ms, all dead +%ld ms\n", victim, f, d);
        if (f > first) first = f;
        if (d + f > dead) dead = d + f;
        /* the victim comes back (a restart), so the next phases start whole */
        simnet_start(net, victim, 0);
        bad |= simnet_run_until(net, simnet_cond_converged, NULL, 100, 60000) < 0;
    }

    uint64_t raised0 = 0, raised1 = 0;
    for (int i = 0; i <= n; i++) {
        swim_stats ss;
        swim_get_stats(simnet_node(net, i), &ss);
        raised0 += ss.suspects_raised;
    }
    simnet_get_stats(net, &a);
    simnet_set_loss(net, 0.05);
    simnet_run(net, (uint64_t)minutes * 60000);
    simnet_set_loss(net, 0);
    simnet_get_stats(net, &b);
    for (int i = 0; i <= n; i++) {
        swim_stats ss;
        swim_get_stats(simnet_node(net, i), &ss);
        raised1 += ss.suspects_raised;
    }
    /* suspicions raised by a failed probe, each refuted in time or not */
    uint64_t false_dead = b.false_dead - a.false_dead, suspects = raised1 - raised0;
    double loss_msgs = (double)(b.packets - a.packets) / (n + 1) / (minutes * 60.0);
    bad |= simnet_run_until(net, simnet_cond_converged, NULL, 100, 60000) < 0;

    for (int i = 0; i <= n; i++) simnet_set_group(net, i, i % 2);
    simnet_partition(net, true);
    simnet_run(net, 30000);
    simnet_partition(net, false);
    long heal = simnet_run_until(net, simnet_cond_converged, NULL, 10, 120000);
    bad |= heal < 0;

    printf("| %5d | %6.1f | %5.0f ms (%.1f) | %5ld ms / %5ld ms (%.1f) | %3llu / %5llu | %6.0f ms (%.1f) | %5.1f | %6.0f | %5.1f |\n",
           n, boot / 1000.0, (double)join, join / per, first, dead, dead / per,
           (unsigned long long)false_dead, (unsigned long long)suspects,
           (double)heal, heal / per, msgs, bytes, loss_msgs);
    fflush(stdout);
    simnet_free(net);
    return bad;
}

int main(int argc, char **argv)
{
    const char *sizes = "100,300,1000";
    uint64_t seed = 1;
    int minutes = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) minutes = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: racimo_swimsim [-n N[,N...]] [-s seed] [-m minutes]\n");
            return 2;
        }
    }
    if (minutes < 1) minutes = 1;
    printf("| N | boot s | join (periods) | crash, worst of 3: first suspect / all see dead (periods) | "
           "5%% loss %d min: false dead / suspicions | partition heal (periods) | "
           "msgs/s/node idle | bytes/s/node idle | msgs/s/node at 5%% loss |\n", minutes);
    printf("|---|---|---|---|---|---|---|---|---|\n");
    int bad = 0;
    for (const char *p = sizes; *p;) {
        int n = atoi(p);
        if (n < 3) { fprintf(stderr, "racimo_swimsim: N must be at least 3\n"); return 2; }
        bad |= row(n, seed, minutes);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    return bad;
}
