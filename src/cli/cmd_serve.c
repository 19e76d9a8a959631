/* cmd_serve.c - `racimo serve`: the OpenAI- and Ollama-compatible HTTP API
 * (src/api) over the models of a folder and any given with -m. */
#include "cli.h"
#include "api/node.h"
#include "base/err.h"
#include "base/mem.h"
#include "cluster/cluster.h"
#include "cluster/pipeline.h"

#include <arpa/inet.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 64

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo serve [-m MODEL]... [options]\n"
        "\n"
        "Serves OpenAI (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models)\n"
        "and Ollama (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps,\n"
        "/api/version) clients, plus /health, /metrics (Prometheus) and /v1/cluster.\n"
        "Models are the .gguf files of $RACIMO_MODELS_DIR (default ~/.racimo/models) and\n"
        "of the read-only folders in $RACIMO_MODELS_READ_ONLY_DIRS (colon-separated),\n"
        "named by their file names; they load on first use.  Models given with -m load\n"
        "at start.\n"
        "\n"
        "  -m, --model FILE        a GGUF model to serve (repeatable)\n"
        "  --models-dir DIR        the models folder (instead of $RACIMO_MODELS_DIR)\n"
        "  --host ADDR             address to listen on (default 127.0.0.1; 0.0.0.0 exposes it)\n"
        "  --port N                port (default 8080; 11434 stands in for Ollama; 0 = any)\n"
        "  --parallel N            sequences generated at once per model (default 4)\n"
        "  -c, --ctx-size N        context tokens per sequence (default 4096, at most the model's)\n"
        "  -b, --batch N           rows per forward pass (default 512)\n"
        "  -t, --threads N         threads per model (default: physical cores)\n"
        "  --queue N               requests waiting beyond the sequences before 429 (default 64)\n"
        "  --api-key KEY           require 'Authorization: Bearer KEY' or 'x-api-key: KEY'\n"
        "                          (repeatable)\n"
        "  --api-key-file FILE     keys, one per line ('#' comments); requests other nodes\n"
        "                          forward here need one of this node's keys too\n"
        "  --tls-cert FILE         serve HTTPS with this PEM certificate (chain) ...\n"
        "  --tls-key FILE          ... and this PEM private key (both, or neither)\n"
        "  --cors-origin ORIGIN    allow browsers from ORIGIN ('*' for any; repeatable)\n"
        "  --max-body BYTES        largest request body (default 8388608)\n"
        "  --timeout S             drop a connection silent for S seconds while a request is\n"
        "                          read or an answer written (default 30)\n"
        "  --chat-template-file F  use the Jinja template in F for every model\n"
        "  --access-log FILE|-     JSON lines per request (default '-': standard output)\n"
        "  --no-access-log         no access log\n"
        "  --log-content           also log prompts and answers (off by default)\n"
        "  --idle-unload S         stop a model (and its pipeline) after S s without requests\n"
        "                          (default 0: never; POST /v1/instances/stop stops one now)\n"
        "\n"
        "The cost of a token (README, 'What a token costs'; the dashboard at /, /metrics,\n"
        "racimo nodes --cost):\n"
        "  --watts W               this machine's power draw in watts (default: measured\n"
        "                          from RAPL, /sys/class/powercap, where readable)\n"
        "  --price-kwh P           electricity price per kWh (any currency)\n"
        "  --hw-price P            what this machine cost, amortised over --hw-years\n"
        "  --hw-years Y            years the hardware is written off over (default 3)\n"
        "  --cloud-price P         a cloud API's price per million tokens, for comparison\n"
        "\n"
        "Cluster (docs/cluster.md): every 'racimo serve' is a node.  The first node makes a\n"
        "cluster key and prints a join token ('racimo token' prints it again); nodes started\n"
        "with its token find each other on the local network (DNS-SD over multicast DNS)\n"
        "or through --peer, and link with mutual authentication and encryption.  A node\n"
        "listening on loopback only (the default --host) is reachable from this machine only.\n"
        "  --state-dir DIR         key, node id, caches and default models folder\n"
        "                          (default $RACIMO_HOME or ~/.racimo)\n"
        "  --join-file FILE        join the cluster of the token in FILE (its first line);\n"
        "                          or set $RACIMO_JOIN_TOKEN; the key is kept in --state-dir\n"
        "  --join TOKEN            the same with the token on the command line, where other\n"
        "                          users of this machine can read it (ps): prefer the above\n"
        "  --peer HOST[:PORT]      a node to dial, where multicast does not pass (repeatable)\n"
        "  --cluster-port N        cluster TCP port (default 7719; busy: any free port)\n"
        "  --advertise ADDR        the IPv4 address other nodes reach this one at\n"
        "  --name NAME             this node's name (default: the host name)\n"
        "  --no-discovery          no multicast DNS (only --peer and nodes learnt from them)\n"
        "  --mesh                  the full mesh of earlier versions instead of SWIM: every\n"
        "                          node linked to every other, heartbeats on each link (a\n"
        "                          cluster runs one or the other: give it to every node\n"
        "                          or none).  By default SWIM membership over UDP decides\n"
        "                          up/down and links exist only with 8 neighbours and on\n"
        "                          demand.  --swim (the default) is still accepted\n"
        "  --down-after MS         a node silent this long is marked down (default 3000)\n"
        "  --heartbeat MS          heartbeat interval (default 500; twice it with --swim)\n"
        "  --max-memory SIZE       most memory this node offers to placement (e.g. 8G, 512M,\n"
        "                          1.5GiB; default: all its free memory)\n"
        "  --min-nodes N           split every model across at least N nodes (pipeline;\n"
        "                          benchmarks and tests; default: only what does not fit)\n"
        "  --split layers|tensor|auto  how a model runs across nodes: layer ranges, one\n"
        "                          after the other (pipeline, the default), or a part of\n"
        "                          every layer on each node, summed twice a layer (tensor\n"
        "                          parallel: all nodes work on every token), or whichever\n"
        "                          placement expects faster on the links measured\n"
        "  --pipeline-wire f16|f32 hidden states between pipeline stages and the\n"
        "                          tensor-parallel sums (default f16)\n"
        "  --cache-type f32|f16|q8_0  KV cache elements of this node's instances, and of\n"
        "                          the stages it asks other nodes for (default f16, as\n"
        "                          llama.cpp; q8_0 a little over half of that; f32 the\n"
        "                          reference's numbers, twice f16)\n"
        "  --export NAME[,NAME]    the only models of this node's folders that peers may\n"
        "                          pull (default: all); the others stay private: they are\n"
        "                          not listed to peers and a request for one is refused\n"
        "  --model-digest NAME=HEX the content digest (64 hex digits; the owner logs it as\n"
        "                          'content digest of FILE') a copy pulled from peers must match\n"
        "                          (repeatable; default: the digest of the node that places\n"
        "                          the instance, else of the first node NAME is pulled from)\n"
        "  --no-cluster            serve alone, with no cluster\n");
}

/* The join token in the first line of `path` that is not empty or a
 * '#' comment, into out; prints why not and returns -1. */
static int read_token_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "racimo: serve: --join-file: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    while (fgets(out, (int)cap, f)) {
        char *p = out + strspn(out, " \t"), *end = p + strlen(p);
        while (end > p && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
            *--end = 0;
        if (!*p || *p == '#')
            continue;
        memmove(out, p, (size_t)(end - p) + 1);
        rc = 0;
        break;
    }
    fclose(f);
    if (rc)
        fprintf(stderr, "racimo: serve: --join-file: %s holds no token\n", path);
    return rc;
}

static int want_num(const char *opt, const char *v, double hi, double *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !(x >= 0 && x <= hi)) {
        fprintf(stderr, "racimo: serve: %s wants a number from 0 to %g\n", opt, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int want_int(const char *opt, const char *v, long lo, long hi, long *out)
{
    if (!v || cli_parse_int(v, lo, hi, out)) {
        fprintf(stderr, "racimo: serve: %s wants a whole number from %ld to %ld\n", opt, lo, hi);
        return -1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    api_config cfg;
    api_config_default(&cfg);
    cfg.access_log = "-";
    cfg.handle_signals = true;
    const char *models[MAX_LIST], *cors[MAX_LIST];
    char **keys = NULL;
    int n_models = 0, n_cors = 0, n_keys = 0, rc = 2;
    long v;
    cluster_config cc;
    cluster_config_default(&cc);
    cc.swim = true;                 /* SWIM membership unless --mesh */
    const char *peers[MAX_LIST], *digests[MAX_LIST];
    int n_peers = 0, n_digests = 0;
    bool no_cluster = false;
    char state_dir[600], models_dir[700], listen[64], token[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--log-content")) {
            cfg.log_content = true;
            takes = false;
        } else if (!strcmp(a, "--no-access-log")) {
            cfg.access_log = NULL;
            takes = false;
        } else if (!strcmp(a, "--no-cluster")) {
            no_cluster = true;
            takes = false;
        } else if (!strcmp(a, "--no-discovery")) {
            cc.no_discovery = true;
        } else if (!strcmp(a, "--swim")) {
            cc.swim = true;             /* the default now; still accepted */
            takes = false;
        } else if (!strcmp(a, "--mesh")) {
            cc.swim = false;
            takes = false;
        } else if (!val) {
            fprintf(stderr, "racimo: serve: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            goto out;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (n_models >= MAX_LIST) { fprintf(stderr, "racimo: serve: too many -m\n"); goto out; }
            models[n_models++] = val;
        } else if (!strcmp(a, "--models-dir")) {
            cfg.models_dir = val;
        } else if (!strcmp(a, "--host")) {
            cfg.host = val;
        } else if (!strcmp(a, "--port")) {
            if (want_int(a, val, 0, 65535, &v)) goto out;
            cfg.port = (int)v;
        } else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            if (want_int(a, val, 1, 256, &v)) goto out;
            cfg.parallel = (int)v;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (want_int(a, val, 16, 1L << 22, &v)) goto out;
            cfg.ctx_size = (int)v;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) {
            if (want_int(a, val, 1, 1L << 16, &v)) goto out;
            cfg.batch = (int)v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (want_int(a, val, 1, 512, &v)) goto out;
            cfg.threads = (int)v;
        } else if (!strcmp(a, "--queue")) {
            if (want_int(a, val, 0, 1L << 20, &v)) goto out;
            cfg.queue = (int)v;
        } else if (!strcmp(a, "--api-key")) {
            char **nk = rc_realloc(keys, (size_t)(n_keys + 1) * sizeof *nk);
            if (!nk || !(nk[n_keys] = rc_strdup(val))) {
                if (nk)
                    keys = nk;
                fprintf(stderr, "racimo: out of memory\n");
                rc = 1;
                goto out;
            }
            keys = nk;
            n_keys++;
        } else if (!strcmp(a, "--api-key-file")) {
            if (api_read_key_file(val, &keys, &n_keys)) {
                rc = cli_error(NULL);
                goto out;
            }
        } else if (!strcmp(a, "--tls-cert")) {
            cfg.tls_cert = val;
        } else if (!strcmp(a, "--tls-key")) {
            cfg.tls_key = val;
        } else if (!strcmp(a, "--cors-origin")) {
            if (n_cors >= MAX_LIST) { fprintf(stderr, "racimo: serve: too many --cors-origin\n"); goto out; }
            cors[n_cors++] = val;
        } else if (!strcmp(a, "--max-body")) {
            if (want_int(a, val, 1024, 1L << 30, &v)) goto out;
            cfg.max_body_bytes = (size_t)v;
        } else if (!strcmp(a, "--timeout")) {
            if (want_int(a, val, 1, 3600, &v)) goto out;
            cfg.timeout_s = (int)v;
        } else if (!strcmp(a, "--chat-template-file")) {
            cfg.template_file = val;
        } else if (!strcmp(a, "--access-log")) {
            cfg.access_log = val;
        } else if (!strcmp(a, "--state-dir")) {
            cc.state_dir = val;
        } else if (!strcmp(a, "--join")) {
            cc.join_token = val;
        } else if (!strcmp(a, "--join-file")) {
            if (read_token_file(val, token, sizeof token)) goto out;
            cc.join_token = token;
        } else if (!strcmp(a, "--export")) {
            cc.exports = val;
        } else if (!strcmp(a, "--model-digest")) {
            if (n_digests >= MAX_LIST) { fprintf(stderr, "racimo: serve: too many --model-digest\n"); goto out; }
            digests[n_digests++] = val;
        } else if (!strcmp(a, "--peer")) {
            if (n_peers >= MAX_LIST) { fprintf(stderr, "racimo: serve: too many --peer\n"); goto out; }
            peers[n_peers++] = val;
        } else if (!strcmp(a, "--cluster-port")) {
            if (want_int(a, val, 0, 65535, &v)) goto out;
            cc.port = (int)v;
            cc.port_given = true;
        } else if (!strcmp(a, "--advertise")) {
            cc.advertise_host = val;
        } else if (!strcmp(a, "--name")) {
            cc.name = val;
        } else if (!strcmp(a, "--max-memory")) {
            if (cli_parse_size(val, &cc.max_memory)) {
                fprintf(stderr, "racimo: serve: --max-memory: '%s' is not a size (examples: 8G, "
                                "512M, 1.5GiB, 2000000000)\n", val);
                goto out;
            }
        } else if (!strcmp(a, "--idle-unload")) {
            if (want_int(a, val, 0, 100000000, &v)) goto out;
            cfg.idle_unload_s = (int)v;
        } else if (!strcmp(a, "--min-nodes")) {
            if (want_int(a, val, 0, PIPELINE_MAX_STAGES, &v)) goto out;
            cfg.min_nodes = (int)v;
        } else if (!strcmp(a, "--cache-type")) {
            if (cli_parse_cache_type("serve", val, &cfg.cache_type))
                goto out;
        } else if (!strcmp(a, "--split")) {
            if (strcmp(val, "layers") && strcmp(val, "tensor") && strcmp(val, "auto")) {
                fprintf(stderr, "racimo: serve: --split takes layers, tensor or auto, not '%s'\n",
                        val);
                goto out;
            }
            cfg.split_tensor = !strcmp(val, "tensor");
            cfg.split_auto = !strcmp(val, "auto");
        } else if (!strcmp(a, "--pipeline-wire")) {
            if (strcmp(val, "f16") && strcmp(val, "f32")) {
                fprintf(stderr, "racimo: serve: --pipeline-wire takes f16 or f32, not '%s'\n", val);
                goto out;
            }
            cfg.wire_f32 = !strcmp(val, "f32");
        } else if (!strcmp(a, "--watts")) {
            if (want_num(a, val, 1e6, &cfg.watts)) goto out;
        } else if (!strcmp(a, "--price-kwh")) {
            if (want_num(a, val, 1e6, &cfg.price_kwh)) goto out;
        } else if (!strcmp(a, "--hw-price")) {
            if (want_num(a, val, 1e12, &cfg.hw_price)) goto out;
        } else if (!strcmp(a, "--hw-years")) {
            if (want_num(a, val, 100, &cfg.hw_years)) goto out;
        } else if (!strcmp(a, "--cloud-price")) {
            if (want_num(a, val, 1e9, &cfg.cloud_price)) goto out;
        } else if (!strcmp(a, "--down-after")) {
            if (want_int(a, val, 100, 600000, &v)) goto out;
            cc.down_after_ms = (int)v;
        } else if (!strcmp(a, "--heartbeat")) {
            if (want_int(a, val, 10, 60000, &v)) goto out;
            cc.heartbeat_ms = (int)v;
        } else {
            fprintf(stderr, "racimo: serve: unknown option '%s'\n", a);
            usage(stderr);
            goto out;
        }
        if (takes)
            i++;
    }
    if (cfg.hw_price > 0 && !(cfg.hw_years > 0))
        cfg.hw_years = 3;
    cfg.model_paths = models;
    cfg.n_model_paths = n_models;
    cfg.api_keys = (const char *const *)keys;
    cfg.n_api_keys = n_keys;
    cfg.cors_origins = cors;
    cfg.n_cors_origins = n_cors;
    /* the state directory also holds the default models folder */
    if (cluster_state_dir(cc.state_dir, state_dir, sizeof state_dir)) {
        rc = cli_error("serve");
        goto out;
    }
    if (!cfg.models_dir && !getenv("RACIMO_MODELS_DIR") && (cc.state_dir || getenv("RACIMO_HOME"))) {
        snprintf(models_dir, sizeof models_dir, "%s/models", state_dir);
        cfg.models_dir = models_dir;
    }
    if (!no_cluster) {
        struct in_addr ia;
        const char *h = cfg.host;
        /* the cluster speaks IPv4: loopback and wildcard names map to theirs */
        if (!strcmp(h, "localhost") || !strcmp(h, "::1"))
            h = "127.0.0.1";
        else if (!strcmp(h, "::") || !strcmp(h, "*"))
            h = "0.0.0.0";
        if (inet_pton(AF_INET, h, &ia) != 1) {
            fprintf(stderr, "racimo: serve: the cluster needs an IPv4 --host, not '%s' "
                            "(or --no-cluster)\n", cfg.host);
            goto out;
        }
        snprintf(listen, sizeof listen, "%s", h);
        cc.listen_host = listen;
        cc.peers = peers;
        cc.n_peers = n_peers;
        cc.http_port = cfg.port;
        /* what the cluster lists (and serves) is what the API loads */
        cc.models_dir = cfg.models_dir;
        cc.ro_dirs = cfg.ro_dirs;
#ifdef RACIMO_TEST_HOOKS
        /* racimo-hooks only (the e2e tests' misbehaving nodes): a node that
         * speaks another protocol version */
        const char *tp = getenv("RACIMO_TEST_PROTOCOL");
        int tmaj, tmin;
        if (tp && sscanf(tp, "%d.%d", &tmaj, &tmin) == 2 && tmaj > 0 && tmaj < 65536 &&
            tmin >= 0 && tmin < 65536) {
            cc.proto_major = tmaj;
            cc.proto_minor = tmin;
        }
        /* ... and one that claims this many sequence slots, all free */
        const char *fs = getenv("RACIMO_TEST_FAKE_SLOTS");
        if (fs && atoi(fs) > 0)
            cc.test_fake_slots = atoi(fs);
        /* a member that claims another node's id (32 hex digits) */
        const char *claim = getenv("RACIMO_TEST_CLAIM_ID");
        if (claim && strlen(claim) == 32) {
            bool ok = true;
            for (int i = 0; i < 16 && ok; i++) {
                unsigned byte;
                ok = sscanf(claim + 2 * i, "%2x", &byte) == 1;
                cc.test_claim_id[i] = (uint8_t)byte;
            }
            cc.test_claim_id_set = ok;
        }
        /* a member that forwards its clients' requests without their keys */
        cfg.test_forward_no_key = getenv("RACIMO_TEST_FORWARD_NO_KEY") != NULL;
#endif
    }
    node_config nc;
    node_config_default(&nc);
    nc.api = cfg;
    nc.cluster = no_cluster ? NULL : &cc;
    nc.model_digests = digests;
    nc.n_model_digests = n_digests;
#ifdef RACIMO_TEST_HOOKS
    /* racimo-hooks only: a member that flips a byte of every block it serves */
    nc.test_alter_weights = getenv("RACIMO_TEST_ALTER_WEIGHTS") &&
                            !strcmp(getenv("RACIMO_TEST_ALTER_WEIGHTS"), "1");
#endif
    /* nobody asked for a cluster (say, an unwritable home): serve alone */
    nc.cluster_optional = !(cc.state_dir || getenv("RACIMO_HOME") || cc.join_token ||
                            getenv("RACIMO_JOIN_TOKEN") || n_peers);
#ifdef RACIMO_TEST_HOOKS
    /* racimo-hooks only: a member that injects batches into others' instances */
    nc.test_inject_batches = getenv("RACIMO_TEST_INJECT_BATCHES") != NULL;
#endif
    node *nd;
    if (node_start(&nc, &nd)) {
        rc = cli_error("serve");
        goto out;
    }
    if (node_solo_why(nd))
        fprintf(stderr, "racimo: warning: serving without a cluster: %s\n", node_solo_why(nd));
    if (node_created_cluster(nd))
        fprintf(stderr, "racimo: created a new cluster (its key is in %s/cluster.key).\n"
                        "racimo: to add a machine, run there:  RACIMO_JOIN_TOKEN=%s racimo serve "
                        "--host 0.0.0.0\n", state_dir, cluster_join_token(node_cluster(nd)));
    /* the line scripts wait for; with --port 0 it names the port chosen */
    fprintf(stderr, "racimo: listening on %s://%s:%d (%d model%s given, %s)\n",
            cfg.tls_cert ? "https" : "http", cfg.host,
            node_http_port(nd), n_models, n_models == 1 ? "" : "s",
            n_keys ? "API keys required" : "no API key required");
    fprintf(stderr, "racimo: dashboard at %s://%s:%d/\n", cfg.tls_cert ? "https" : "http",
            strcmp(cfg.host, "0.0.0.0") && strcmp(cfg.host, "::") ? cfg.host : "127.0.0.1",
            node_http_port(nd));
    bool beyond = strcmp(cfg.host, "127.0.0.1") && strcmp(cfg.host, "localhost") &&
                  strcmp(cfg.host, "::1");
    if (beyond && !n_keys)
        fprintf(stderr, "racimo: warning: listening beyond this machine without --api-key\n");
    else if (beyond && !cfg.tls_cert)
        fprintf(stderr, "racimo: warning: API keys cross the network in clear without "
                        "--tls-cert/--tls-key\n");
    fflush(stderr);
    rc = node_run(nd) ? cli_error("serve") : 0;
    node_free(nd);
out:
    memset(token, 0, sizeof token);
    for (int i = 0; i < n_keys; i++)
        rc_free(keys[i]);
    rc_free(keys);
    return rc;
}
