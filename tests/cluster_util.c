/* cluster_util.c - in-process test nodes. */
#include "cluster_util.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void test_cluster_config(cluster_config *cfg, const char *name, const char *token, int peer_port,
                         char *dir, size_t dir_cap, char *models, size_t models_cap,
                         char *addr, const char **peers)
{
    snprintf(dir, dir_cap, "%s/%s", test_tmpdir(), name);
    snprintf(models, models_cap, "%s/models", dir);
    mkdir(dir, 0700);
    mkdir(models, 0755);
    cluster_config_default(cfg);
    if (peer_port > 0) {
        snprintf(addr, 32, "127.0.0.1:%d", peer_port);
        peers[0] = addr;
        cfg->peers = peers;
        cfg->n_peers = 1;
    }
    cfg->state_dir = dir;
    cfg->join_token = token;
    cfg->listen_host = "127.0.0.1";
    cfg->port = 0;
    cfg->port_given = true;
    cfg->name = name;
    cfg->no_discovery = true;
    cfg->heartbeat_ms = 100;
    /* a node hashing a tensor on its cluster thread is slow under ASan */
    cfg->down_after_ms = 3000;
    cfg->probe_ms = 300;
    cfg->bench = 0;
    cfg->models_dir = models;
    /* RACIMO_TEST_SWIM=1: SWIM membership, as test_cluster.c's nodes */
    const char *swim = getenv("RACIMO_TEST_SWIM");
    cfg->swim = swim && !strcmp(swim, "1");
}
