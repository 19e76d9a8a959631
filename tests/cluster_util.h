/* cluster_util.h - a cluster node for in-process tests: loopback only, no
 * discovery, fast heartbeats, no self-benchmark. */
#ifndef RC_TEST_CLUSTER_UTIL_H
#define RC_TEST_CLUSTER_UTIL_H

#include "cluster/cluster.h"

/* Fills cfg for node `name` with its state in <tmp>/<name> and models in
 * <tmp>/<name>/models (both made; their paths go to dir and models, which
 * must outlive cfg), dialling peer_port when > 0 (addr, >= 32 bytes, and
 * peers must outlive cfg too). */
void test_cluster_config(cluster_config *cfg, const char *name, const char *token, int peer_port,
                         char *dir, size_t dir_cap, char *models, size_t models_cap,
                         char *addr, const char **peers);

#endif
