/* cmd_nodes.c - `racimo nodes`: the cluster as a running node sees it.
 * Asks a node's GET /v1/cluster (libevent's HTTP client) and prints the
 * nodes, links and leader as tables, or the JSON itself with --json, or the
 * cost of a token with --cost. */
#include "cli.h"
#include "cli_http.h"
#include "base/log.h"
#include "base/mem.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo nodes [--host H] [--port P] [--json | --cost] [--api-key KEY]\n"
        "                    [--limit N] [--offset K] [--state up|down] [--node ID,...] [--summary]\n"
        "       racimo nodes remove ID [--host H] [--port P] [--api-key KEY]\n"
        "\n"
        "Lists the nodes of the cluster a running 'racimo serve' belongs to: id, name,\n"
        "addresses, state (up/down), hardware, models; then the links between nodes\n"
        "(latency, bandwidth) and the leader.  Every node shows the same view.\n"
        "\n"
        "'remove ID' removes a node from the cluster for good (a lost laptop, a departed\n"
        "colleague's machine): every member refuses its links from then on, and it cannot\n"
        "rejoin with its identity.  ID is the node's id or its first 8+ hex digits.  Ask a\n"
        "node on this machine (the cluster is changed only from a node's own host).  Then\n"
        "rotate the cluster key (racimo token --rotate) if the removed node held the token.\n"
        "\n"
        "  --host H        the node's HTTP address (default 127.0.0.1)\n"
        "  --port P        its HTTP port (default 8080)\n"
        "  --json          print the JSON of GET /v1/cluster instead of tables\n"
        "  --cost          each node's power and prices, and what a token of each model\n"
        "                  the node runs costs: energy per 1,000 tokens, cost per million\n"
        "                  (racimo serve --watts, --price-kwh, --hw-price, --cloud-price)\n"
        "  --limit N       list at most N nodes (in id order; large clusters) ...\n"
        "  --offset K      ... starting after the first K (the next page's K is printed)\n"
        "  --state S       only nodes up, or only nodes down\n"
        "  --node ID,...   only these nodes (ids, 8+ hex digit prefixes, or names)\n"
        "  --summary       counts per state, totals and served models instead of the list\n"
        "  --api-key KEY   when the node requires one (default $RACIMO_API_KEY)\n");
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static void human_bytes(double b, char *out, size_t cap)
{
    if (b <= 0)
        snprintf(out, cap, "-");
    else if (b >= 1e12)
        snprintf(out, cap, "%.1fT", b / 1e12);
    else if (b >= 1e9)
        snprintf(out, cap, "%.1fG", b / 1e9);
    else
        snprintf(out, cap, "%.0fM", b / 1e6);
}

static const char *name_of(json_t *snap, const char *id)
{
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(snap, "nodes"), i, n)
        if (!strcmp(str(n, "id"), id))
            return log_clean(str(n, "name"));   /* each node names itself: text from the network */
    return "?";
}

static void print_tables(json_t *s)
{
    const char *leader = str(s, "leader");
    printf("%-10s %-16s %-5s %-22s %5s %-12s %-11s %7s %7s  %s\n", "ID", "NAME", "STATE",
           "ADDRESS", "CORES", "SIMD", "MEM FREE", "GB/s", "GFLOP/s", "MODELS (serving*)");
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(s, "nodes"), i, n) {
        json_t *hw = json_object_get(n, "hardware");
        char idcol[16], addr[64], free_s[16], total_s[16], mem[40], bw[16], gf[16];
        snprintf(idcol, sizeof idcol, "%.8s%s%s", str(n, "id"),
                 !strcmp(str(n, "id"), leader) ? "L" : "",
                 json_is_true(json_object_get(n, "self")) ? "*" : "");
        json_t *addrs = json_object_get(n, "addresses");
        snprintf(addr, sizeof addr, "%s:%d",
                 json_array_size(addrs) ? json_string_value(json_array_get(addrs, 0)) : "?",
                 (int)json_integer_value(json_object_get(n, "cluster_port")));
        human_bytes(json_number_value(json_object_get(hw, "mem_free")), free_s, sizeof free_s);
        human_bytes(json_number_value(json_object_get(hw, "mem_total")), total_s, sizeof total_s);
        snprintf(mem, sizeof mem, "%s/%s", free_s, total_s);
        json_t *b = json_object_get(hw, "mem_bandwidth"), *g = json_object_get(hw, "matmul_gflops");
        snprintf(bw, sizeof bw, json_is_number(b) ? "%.1f" : "-", json_number_value(b) / 1e9);
        snprintf(gf, sizeof gf, json_is_number(g) ? "%.1f" : "-", json_number_value(g));
        char models[512] = "";
        size_t j, used = 0;
        json_t *m;
        json_t *serving = json_object_get(n, "serving"), *fr = json_object_get(n, "serving_free");
        /* files on disk, then what it serves without the file; a served
         * model shows its free sequence slots */
        for (int pass = 0; pass < 2; pass++) {
            json_array_foreach(json_object_get(n, pass ? "serving" : "models"), j, m) {
                const char *mn = pass ? json_string_value(m) : str(m, "name");
                bool serves = pass == 1, listed = false;
                size_t k;
                json_t *x;
                if (!mn)
                    continue;
                json_array_foreach(serving, k, x)
                    serves = serves || !strcmp(json_string_value(x) ? json_string_value(x) : "", mn);
                json_array_foreach(json_object_get(n, "models"), k, x)
                    listed = listed || !strcmp(str(x, "name"), mn);
                if (pass && listed)
                    continue;
                char slots[24] = "";
                if (serves && json_is_integer(json_object_get(fr, mn)))
                    snprintf(slots, sizeof slots, " (%d free)",
                             (int)json_integer_value(json_object_get(fr, mn)));
                int w = snprintf(models + used, sizeof models - used, "%s%s%s%s", used ? ", " : "",
                                 log_clean(mn), serves ? "*" : "", slots);
                if (w < 0 || (size_t)w >= sizeof models - used)
                    break;
                used += (size_t)w;
            }
        }
        printf("%-10s %-16.16s %-5s %-22s %5d %-12.12s %-11s %7s %7s  %s\n", idcol,
               log_clean(str(n, "name")), str(n, "state"), addr,
               (int)json_integer_value(json_object_get(hw, "cores")), log_clean(str(hw, "simd")), mem, bw, gf, used ? models : "-");
    }
    json_t *links = json_object_get(s, "links");
    if (json_array_size(links)) {
        printf("\n%-27s %-27s %8s %10s %8s\n", "FROM", "TO", "RTT ms", "Mbit/s", "AGE s");
        json_t *l;
        json_array_foreach(links, i, l) {
            char from[40], to[40], bw[24], age[24];
            snprintf(from, sizeof from, "%.8s %.16s", str(l, "from"), name_of(s, str(l, "from")));
            snprintf(to, sizeof to, "%.8s %.16s", str(l, "to"), name_of(s, str(l, "to")));
            json_t *b = json_object_get(l, "bandwidth_mbps");
            snprintf(bw, sizeof bw, json_is_number(b) ? "%.0f" : "-", json_number_value(b));
            /* a measure kept from a link closed since says so */
            json_t *a = json_object_get(l, "age_ms");
            snprintf(age, sizeof age, json_is_integer(a) ? "%.0f" : "-",
                     (double)json_integer_value(a) / 1000);
            printf("%-27s %-27s %8.2f %10s %8s%s\n", from, to,
                   json_number_value(json_object_get(l, "rtt_ms")), bw, age,
                   json_is_false(json_object_get(l, "linked")) ? "  (link closed)" : "");
        }
    }
    /* the instances the asked node heads that were rebuilt after a node was lost */
    size_t k;
    json_t *m;
    bool title = false;
    json_array_foreach(json_object_get(s, "models"), k, m) {
        json_t *rec = json_object_get(m, "recoveries"), *last = json_object_get(rec, "last");
        if (json_integer_value(json_object_get(rec, "count")) + json_integer_value(json_object_get(rec, "failed")) == 0)
            continue;
        if (!title)
            printf("\n%-24s %10s %6s %14s %9s  %s\n", "MODEL (rebuilt here)", "RECOVERIES", "FAILED",
                   "TOKENS AGAIN", "LAST s", "LAST WHY");
        title = true;
        printf("%-24.24s %10lld %6lld %14lld %9.2f  %s\n", str(m, "name"),
               (long long)json_integer_value(json_object_get(rec, "count")),
               (long long)json_integer_value(json_object_get(rec, "failed")),
               (long long)json_integer_value(json_object_get(rec, "tokens_replayed")),
               json_number_value(json_object_get(last, "seconds")),
               last ? str(last, "why") : "-");
    }
    printf("\nleader %.8s (%s); %d of %d nodes up%s; L = leader, * = the node asked\n", leader,
           name_of(s, leader), (int)json_integer_value(json_object_get(s, "members_up")),
           (int)json_integer_value(json_object_get(s, "members")),
           json_is_true(json_object_get(s, "quorum")) ? ", quorum" : ", NO quorum (minority side)");
    json_t *rev = json_object_get(s, "revoked");
    if (json_array_size(rev)) {
        printf("removed from the cluster (refused everywhere):");
        json_array_foreach(rev, i, n)
            printf(" %.8s", str(n, "id"));
        printf("\n");
    }
    if (json_is_true(json_object_get(s, "removed")))
        printf("THIS NODE WAS REMOVED from the cluster: the other nodes refuse it\n");
}

/* "%.*f" of a number, or "-" for null / absent. */
static void fnum(json_t *v, int prec, char *out, size_t cap)
{
    if (json_is_number(v))
        snprintf(out, cap, "%.*f", prec, json_number_value(v));
    else
        snprintf(out, cap, "-");
}

/* --cost: each node's power and prices, then the cost of each model the
 * asked node runs (README, "What a token costs"). */
static void print_cost(json_t *s)
{
    json_t *basis = json_object_get(s, "cost");
    printf("%-10s %-16s %-5s %9s %-11s %10s %10s\n", "ID", "NAME", "STATE", "WATTS", "SOURCE",
           "PRICE/kWh", "HW/HOUR");
    size_t i;
    json_t *n;
    json_t *nodes = json_object_get(s, "nodes");
    if (!json_is_array(nodes)) {         /* standalone: this node alone */
        nodes = json_pack("[{s:s, s:s, s:s, s:O}]", "id", "-", "name",
                          str(json_object_get(s, "node"), "hostname"), "state", "up", "power",
                          json_object_get(basis, "power") ? json_object_get(basis, "power")
                                                          : json_null());
    } else {
        json_incref(nodes);
    }
    json_array_foreach(nodes, i, n) {
        json_t *p = json_object_get(n, "power");
        char w[24], price[24], hw[24];
        fnum(json_object_get(p, "watts"), 1, w, sizeof w);
        fnum(json_object_get(p, "price_kwh"), 4, price, sizeof price);
        fnum(json_object_get(p, "hw_per_hour"), 4, hw, sizeof hw);
        printf("%-10.8s %-16.16s %-5s %9s %-11.11s %10s %10s\n", str(n, "id"),
               log_clean(str(n, "name")), str(n, "state"), w, log_clean(str(p, "source")), price,
               hw);
    }
    printf("\n%-24s %-24s %8s %8s %14s %12s %12s\n", "MODEL", "NODES", "WATTS", "TOK/s",
           "Wh/1k TOKENS", "COST/1M TOK", "CLOUD/1M TOK");
    json_t *m;
    char cloud[24];
    fnum(json_object_get(basis, "cloud_per_mtok"), 4, cloud, sizeof cloud);
    int shown = 0;
    json_array_foreach(json_object_get(s, "models"), i, m) {
        json_t *c = json_object_get(m, "cost");
        if (!c)
            continue;
        char on[200] = "", w[24], tps[24], wh[24], cost[24];
        size_t j, used = 0;
        json_t *id;
        json_array_foreach(json_object_get(c, "nodes"), j, id) {
            const char *nm = json_is_array(json_object_get(s, "nodes"))
                             ? name_of(s, json_string_value(id) ? json_string_value(id) : "")
                             : "this node";
            int k = snprintf(on + used, sizeof on - used, "%s%s", used ? "," : "", nm);
            if (k < 0 || (size_t)k >= sizeof on - used)
                break;
            used += (size_t)k;
        }
        fnum(json_object_get(c, "watts"), 1, w, sizeof w);
        fnum(json_object_get(c, "tokens_per_s"), 1, tps, sizeof tps);
        fnum(json_object_get(c, "wh_per_1k_tokens"), 3, wh, sizeof wh);
        fnum(json_object_get(c, "cost_per_mtok"), 4, cost, sizeof cost);
        printf("%-24.24s %-24.24s %8s %8s %14s %12s %12s\n", log_clean(str(m, "name")), on, w,
               tps, wh, cost, cloud);
        shown++;
    }
    if (!shown)
        printf("(no model runs on the node asked)\n");
    printf("\n%s\n", str(basis, "basis"));
    json_decref(nodes);
}

static void print_summary(json_t *s)
{
    json_t *sum = json_object_get(s, "summary"), *st = json_object_get(sum, "states");
    char mem[16], fr[16];
    human_bytes(json_number_value(json_object_get(sum, "memory_total_bytes_up")), mem, sizeof mem);
    human_bytes(json_number_value(json_object_get(sum, "memory_free_bytes_up")), fr, sizeof fr);
    printf("%lld nodes up, %lld down; up: %lld cores, %s memory (%s free)\n",
           (long long)json_integer_value(json_object_get(st, "up")),
           (long long)json_integer_value(json_object_get(st, "down")),
           (long long)json_integer_value(json_object_get(sum, "cores_up")), mem, fr);
    const char *name;
    json_t *m;
    bool title = false;
    json_object_foreach(json_object_get(sum, "serving"), name, m) {
        if (!title)
            printf("\n%-32s %6s %6s %6s\n", "MODEL SERVED", "NODES", "SLOTS", "FREE");
        title = true;
        printf("%-32.32s %6lld %6lld %6lld\n", log_clean(name),
               (long long)json_integer_value(json_object_get(m, "nodes")),
               (long long)json_integer_value(json_object_get(m, "slots")),
               (long long)json_integer_value(json_object_get(m, "free")));
    }
    printf("\nleader %.8s; %s\n", str(s, "leader"),
           json_is_true(json_object_get(s, "quorum")) ? "quorum" : "NO quorum (minority side)");
}

/* appends "&key=value" with the value percent-encoded */
static void add_param(char *q, size_t cap, const char *key, const char *v)
{
    size_t o = strlen(q);
    int w = snprintf(q + o, cap - o, "%s%s=", o ? "&" : "?", key);
    if (w < 0 || (size_t)w >= cap - o)
        return;
    o += (size_t)w;
    for (const unsigned char *p = (const unsigned char *)v; *p && o + 4 < cap; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-_.,", *p))
            q[o++] = (char)*p;
        else
            o += (size_t)snprintf(q + o, cap - o, "%%%02X", *p);
    }
    q[o] = 0;
}

static int remove_node(const char *url, const char *key, const char *id)
{
    char path[200], why[500];
    json_t *v;
    snprintf(path, sizeof path, "/v1/cluster/nodes/%.64s/remove", id);
    if (cli_http_json("POST", url, path, key, "", 10, &v, why, sizeof why)) {
        fprintf(stderr, "racimo: nodes remove: %s\n", why);
        return 1;
    }
    printf("removed node %s from the cluster: every member refuses it from now on\n",
           str(v, "removed"));
    fprintf(stderr, "if it held the join token, rotate the key as well: racimo token --rotate\n");
    json_decref(v);
    return 0;
}

int cmd_nodes(int argc, char **argv)
{
    const char *host = "127.0.0.1", *key = getenv("RACIMO_API_KEY");
    long port = 8080;
    bool as_json = false, cost = false, summary = false;
    const char *remove = NULL;
    char query[1200] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (i == 1 && !strcmp(a, "remove") && v && v[0] != '-') {
            remove = v;
            i++;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (!strcmp(a, "--cost")) {
            cost = true;
        } else if (!strcmp(a, "--summary")) {
            summary = true;
            add_param(query, sizeof query, "summary", "1");
        } else if ((!strcmp(a, "--limit") || !strcmp(a, "--offset")) && v) {
            long n;
            if (cli_parse_int(v, !strcmp(a, "--limit"), !strcmp(a, "--limit") ? 10000 : 1L << 30, &n)) {
                fprintf(stderr, "racimo: nodes: %s wants a number (--limit 1-10000)\n", a);
                return 2;
            }
            add_param(query, sizeof query, a + 2, v);
            i++;
        } else if (!strcmp(a, "--state") && v) {
            if (strcmp(v, "up") && strcmp(v, "down")) {
                fprintf(stderr, "racimo: nodes: --state wants up or down\n");
                return 2;
            }
            add_param(query, sizeof query, "state", v);
            i++;
        } else if (!strcmp(a, "--node") && v) {
            add_param(query, sizeof query, "nodes", v);
            i++;
        } else if (!strcmp(a, "--host") && v) {
            host = v;
            i++;
        } else if (!strcmp(a, "--port") && v) {
            if (cli_parse_int(v, 1, 65535, &port)) {
                fprintf(stderr, "racimo: nodes: --port wants a number from 1 to 65535\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--api-key") && v) {
            key = v;
            i++;
        } else {
            fprintf(stderr, "racimo: nodes: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    cli_http_reply r = { 0 };
    int rc = 1;
    char url[300], why[400];
    snprintf(url, sizeof url, "%s:%ld", host, port);
    if (remove)
        return remove_node(url, key, remove);
    char path[1300];
    snprintf(path, sizeof path, "/v1/cluster%s", query);
    if (cli_http("GET", url, path, key, NULL, 10, &r, why, sizeof why)) {
        fprintf(stderr, "racimo: nodes: %s\n", why);
        goto out;
    }
    if (r.status != 200) {
        fprintf(stderr, "racimo: nodes: http://%s:%ld/v1/cluster answered %d%s%s\n", host, port,
                r.status, r.len ? ": " : "", r.len ? r.body : "");
        goto out;
    }
    json_error_t err;
    json_t *s = json_loadb(r.body, r.len, 0, &err);
    if (!json_is_object(s)) {
        fprintf(stderr, "racimo: nodes: the answer is not JSON: %s\n", err.text);
        json_decref(s);
        goto out;
    }
    if (as_json) {
        char *out = json_dumps(s, JSON_INDENT(2));
        if (out)
            printf("%s\n", out);
        free(out);
        rc = 0;
    } else if (cost) {
        print_cost(s);
        rc = 0;
    } else if (summary && json_is_object(json_object_get(s, "summary"))) {
        print_summary(s);
        rc = 0;
    } else if (!json_is_array(json_object_get(s, "nodes"))) {
        fprintf(stderr, "racimo: nodes: the node at %s:%ld runs without a cluster\n", host, port);
    } else {
        print_tables(s);
        json_t *next = json_object_get(s, "next_offset");
        if (json_is_integer(next))
            printf("%zu of %lld nodes listed; the next page: --offset %lld\n",
                   json_array_size(json_object_get(s, "nodes")),
                   (long long)json_integer_value(json_object_get(s, "nodes_total")),
                   (long long)json_integer_value(next));
        rc = 0;
    }
    json_decref(s);
out:
    rc_free(r.body);
    return rc;
}
