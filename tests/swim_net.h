/* swim_net.h - many SWIM nodes (src/cluster/swim.c, the real code) in one
 * process over a simulated network that drops, delays and partitions.
 *
 * Time is simulated: simnet_run advances it in 5 ms steps, delivering the
 * packets due and ticking the nodes whose timers are due, so ten minutes
 * of a thousand nodes take seconds and every run with the same seed gives
 * the same result.  Used by the unit tests (tests/test_swim.c) and by the
 * benchmark tool racimo_swimsim (tests/swimsim/main.c).
 */
#ifndef RC_TEST_SWIM_NET_H
#define RC_TEST_SWIM_NET_H

#include "cluster/swim.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    double loss;                 /* datagrams dropped, 0..1 (streams are not) */
    uint32_t delay_min_ms, delay_max_ms;
} simnet_cfg;

typedef struct simnet simnet;

/* n nodes, none started.  NULL on allocation failure. */
simnet *simnet_new(int n, const swim_config *cfg, const simnet_cfg *ncfg, uint64_t seed);
void simnet_free(simnet *net);

uint64_t simnet_now(const simnet *net);
int simnet_size(const simnet *net);
swim *simnet_node(simnet *net, int i);      /* NULL while down */
const uint8_t *simnet_id(const simnet *net, int i);

/* starts node i (a fresh machine, incarnation 0) and joins it through node
 * `via` (-1: alone) */
int simnet_start(simnet *net, int i, int via);
/* crashes node i: no more packets out or in, no ticks */
void simnet_crash(simnet *net, int i);
/* node i leaves on purpose then stops */
void simnet_leave(simnet *net, int i);
/* puts node i in partition group g; packets cross groups only when the
 * partition is off */
void simnet_set_group(simnet *net, int i, int g);
void simnet_partition(simnet *net, bool on);
void simnet_set_loss(simnet *net, double loss);
/* cuts (or restores) the direct path between nodes i and j, both ways */
void simnet_block(simnet *net, int i, int j, bool blocked);

void simnet_run(simnet *net, uint64_t ms);

/* Runs until cond(net, arg) holds, checking every `every_ms`, for at most
 * `limit_ms`; returns the simulated ms it took, or -1 at the limit. */
long simnet_run_until(simnet *net, bool (*cond)(simnet *, void *), void *arg,
                      uint64_t every_ms, uint64_t limit_ms);

/* every running node sees node i in state st (the node itself excluded) */
bool simnet_all_see(simnet *net, int i, int st);
/* every running node sees every running node alive, and no others alive */
bool simnet_converged(simnet *net);

/* conditions for simnet_run_until */
bool simnet_cond_converged(simnet *net, void *unused);
typedef struct { int node, state; } simnet_see;
bool simnet_cond_all_see(simnet *net, void *see);     /* a simnet_see */

typedef struct {
    uint64_t packets, bytes;     /* datagrams and streams sent by running nodes */
    uint64_t false_dead;         /* DEAD events about a node that was running */
    uint64_t suspects;           /* SUSPECT events */
} simnet_stats;

void simnet_get_stats(const simnet *net, simnet_stats *out);

#endif
