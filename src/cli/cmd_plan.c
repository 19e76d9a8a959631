/* cmd_plan.c - `racimo plan`: where a model's layers would run.
 *
 * Reads the model's sizes from its tensor infos (nothing of the weights),
 * takes the nodes from --node specs (a hypothetical cluster), from a running
 * node's GET /v1/cluster, or from this machine alone, and prints the
 * placement (cluster/placement.h): a stage per node with its layers, bytes
 * and expected speed, or by how much it does not fit and what would.
 * Exit status: 0 fits, 1 does not fit (or an error), 2 usage. */
#include "cli.h"
#include "cli_http.h"
#include "base/err.h"
#include "base/mem.h"
#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_size.h"
#include "tensor/kv_types.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#define MAX_NODES 64
#define DEFAULT_URL "http://127.0.0.1:8080"
#define GIB (1024.0 * 1024.0 * 1024.0)

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo plan -m MODEL [--ctx N] [--parallel N] [--cache-type T] [--min-nodes K]\n"
        "                   [--split S] [--node NAME:MEM[:BW_GBs]]... [--cluster http://HOST:PORT]\n"
        "                   [--json]\n"
        "\n"
        "Shows where the model's layers would run: on one node when one holds it (the\n"
        "fastest that does), else split over the fewest nodes that hold the weights and\n"
        "the KV cache for --ctx x --parallel tokens.  Exit status 0 when it fits, 1 when\n"
        "not (with by how much and what would make it fit).\n"
        "\n"
        "  -m, --model FILE      the GGUF model (only its header is read)\n"
        "  --ctx N               context tokens per sequence (default 4096, at most the model's)\n"
        "  --parallel N          sequences at once (default 4, as 'racimo serve')\n"
        "  --cache-type T        KV cache elements counted: f16 (default, as 'racimo\n"
        "                        serve'), q8_0 or f32\n"
        "  --min-nodes K         split over at least K nodes\n"
        "  --split layers|tensor|auto  layer ranges per node (pipeline, the default), a\n"
        "                        part of every layer on each node (tensor parallel), or\n"
        "                        whichever is expected faster for one stream\n"
        "  --node NAME:MEM[:BW]  a hypothetical node giving MEM bytes (8G, 512M, 1.5GiB...)\n"
        "                        with BW GB/s of memory bandwidth (default %.0f); repeatable\n"
        "  --cluster URL         ask a running node's GET /v1/cluster (default %s;\n"
        "                        when nothing answers there, plan for this machine alone)\n"
        "  --reserve SIZE        memory kept free on each real node (default: 10%% of its\n"
        "                        memory, at least 512 MiB)\n"
        "  --api-key KEY         for --cluster, when the node requires one ($RACIMO_API_KEY)\n"
        "  --json                print the placement as JSON\n",
        PLACEMENT_DEFAULT_BW_GBS, DEFAULT_URL);
}

/* ---- GET /v1/cluster ---- */

static int get_view(const char *url, const char *key, int timeout_s, json_t **view, char *err,
                    size_t cap)
{
    *view = NULL;
    cli_http_reply r;
    if (cli_http("GET", url, "/v1/cluster", key, NULL, timeout_s, &r, err, cap))
        return -1;
    int rc = -1;
    if (r.status != 200) {
        snprintf(err, cap, "GET /v1/cluster answered %d%s%.200s", r.status, r.len ? ": " : "",
                 r.body ? r.body : "");
    } else {
        json_error_t je;
        *view = json_loadb(r.body ? r.body : "", r.len, 0, &je);
        if (!json_is_object(*view))
            snprintf(err, cap, "the answer is not a JSON object: %s", je.text);
        else if (!json_is_array(json_object_get(*view, "nodes")))
            snprintf(err, cap, "that node runs without a cluster (racimo serve --no-cluster)");
        else
            rc = 0;
        if (rc) {
            json_decref(*view);
            *view = NULL;
        }
    }
    rc_free(r.body);
    return rc;
}

/* ---- nodes ---- */

/* "NAME:MEM[:BW]" into n; a message naming what is wrong on failure. */
static int parse_node(const char *spec, placement_node *n, char *err, size_t cap)
{
    memset(n, 0, sizeof *n);
    const char *c1 = strchr(spec, ':');
    if (!c1 || c1 == spec) {
        snprintf(err, cap, "--node '%s': want NAME:MEM[:BW_GBs], e.g. box1:16G:40", spec);
        return -1;
    }
    size_t nl = (size_t)(c1 - spec);
    if (nl >= sizeof n->name || nl >= sizeof n->id) {
        snprintf(err, cap, "--node '%s': the name is longer than %zu characters", spec,
                 sizeof n->id - 1);
        return -1;
    }
    memcpy(n->name, spec, nl);
    memcpy(n->id, spec, nl);
    char mem[64];
    const char *c2 = strchr(c1 + 1, ':');
    size_t ml = c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);
    if (ml >= sizeof mem) {
        snprintf(err, cap, "--node '%s': '%s' is not a size (examples: 16G, 512M, 1.5GiB)", spec, c1 + 1);
        return -1;
    }
    memcpy(mem, c1 + 1, ml);
    mem[ml] = 0;
    if (cli_parse_size(mem, &n->mem_avail)) {
        snprintf(err, cap, "--node '%s': '%s' is not a size (examples: 16G, 512M, 1.5GiB)", spec, mem);
        return -1;
    }
    if (c2) {
        char *end;
        errno = 0;
        double bw = strtod(c2 + 1, &end);
        if (!c2[1] || *end || errno || !(bw > 0) || bw > 1e5) {
            snprintf(err, cap, "--node '%s': the bandwidth '%s' is not a number of GB/s above 0",
                     spec, c2 + 1);
            return -1;
        }
        n->bw_gbs = bw;
    }
    return 0;
}

static void fmt_bytes(uint64_t b, char *out, size_t cap)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(out, cap, "%.2f GiB", (double)b / GIB);
    else if (b >= (uint64_t)1 << 20)
        snprintf(out, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else
        snprintf(out, cap, "%.1f KiB", (double)b / 1024.0);
}

static void print_plan(const char *model_path, const model_sizes *ms, const placement_opts *o,
                       const placement *p, const placement_node *nodes, const char *source)
{
    char w[32], kv[32], per[32];
    fmt_bytes(model_sizes_stage_bytes(ms, 0, ms->n_layer), w, sizeof w);
    fmt_bytes(ms->kv_bytes_per_token * (uint64_t)ms->n_layer, per, sizeof per);
    fmt_bytes(model_sizes_kv_bytes(ms, 0, ms->n_layer, (uint64_t)o->n_ctx * (uint64_t)o->n_seq), kv,
              sizeof kv);
    printf("model %s: %d layers, %s of weights; KV cache (%s) %s per token, %s for %d x %d "
           "tokens\n", model_path, ms->n_layer, w, kv_type_name(ms->kv_type), per, kv, o->n_ctx,
           o->n_seq);
    printf("nodes: %s\n\n", source);
    if (!p->fits) {
        char need[32], have[32], shortby[32];
        fmt_bytes(p->need_bytes, need, sizeof need);
        fmt_bytes(p->have_bytes, have, sizeof have);
        if (p->need_bytes > p->have_bytes) {
            fmt_bytes(p->need_bytes - p->have_bytes, shortby, sizeof shortby);
            printf("does not fit: needs %s, the cluster offers %s (short by %s)\n", need, have,
                   shortby);
        } else {
            printf("does not fit: needs %s, the cluster offers %s, but no split into whole "
                   "layers fits the nodes\n", need, have);
        }
        printf("%s\n", p->advice);
        return;
    }
    printf("%-20s %-12s %12s %12s %8s %9s\n", "NODE", "LAYERS", "WEIGHTS", "KV CACHE", "GB/s",
           "ms/token");
    for (int s = 0; s < p->n_stages; s++) {
        const placement_stage *st = &p->stage[s];
        char layers[32], bw[16];
        if (p->tensor)
            snprintf(layers, sizeof layers, "all, 1/%d", p->n_stages);
        else
            snprintf(layers, sizeof layers, "%d-%d (%d)", st->first, st->last - 1,
                     st->last - st->first);
        fmt_bytes(st->weight_bytes, w, sizeof w);
        fmt_bytes(st->kv_bytes, kv, sizeof kv);
        double b = nodes[st->node].bw_gbs;
        snprintf(bw, sizeof bw, b > 0 ? "%.1f" : "%.0f?", b > 0 ? b : PLACEMENT_DEFAULT_BW_GBS);
        printf("%-20.20s %-12s %12s %12s %8s %9.2f\n", st->name, layers, w, kv, bw,
               st->ms_per_token);
    }
    char need[32], have[32];
    fmt_bytes(p->need_bytes, need, sizeof need);
    fmt_bytes(p->have_bytes, have, sizeof have);
    printf("\nfits on %d node%s%s: needs %s of the %s offered; expected %.1f tokens/s for one "
           "stream\n", p->n_stages, p->n_stages == 1 ? "" : "s",
           p->tensor ? " (tensor parallel)" : "", need, have, p->tokens_per_s);
}

int cmd_plan(int argc, char **argv)
{
    const char *model_path = NULL, *url = NULL, *key = getenv("RACIMO_API_KEY");
    placement_opts o = { .n_ctx = 0, .n_seq = 4, .min_nodes = 0, .reserve = 0 };
    placement_node *nodes = NULL;
    double *links = NULL;
    int n_nodes = 0, rc = 2;
    bool as_json = false;
    int cache = KV_TYPE_DEFAULT;
    long v;
    char err[512];
    gguf_file *f = NULL;
    model_sizes ms = { 0 };
    json_t *view = NULL;
    const char *spec[MAX_NODES];
    int n_spec = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
            continue;
        } else if (!val) {
            fprintf(stderr, "racimo: plan: unknown option or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model_path = val;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
            if (cli_parse_int(val, 1, 1L << 24, &v)) {
                fprintf(stderr, "racimo: plan: --ctx wants a number of tokens from 1 to %ld\n", 1L << 24);
                return 2;
            }
            o.n_ctx = (int)v;
        } else if (!strcmp(a, "--parallel")) {
            if (cli_parse_int(val, 1, 4096, &v)) {
                fprintf(stderr, "racimo: plan: --parallel wants a number from 1 to 4096\n");
                return 2;
            }
            o.n_seq = (int)v;
        } else if (!strcmp(a, "--cache-type")) {
            if (cli_parse_cache_type("plan", val, &cache))
                return 2;
        } else if (!strcmp(a, "--min-nodes")) {
            if (cli_parse_int(val, 1, PLACEMENT_MAX_STAGES, &v)) {
                fprintf(stderr, "racimo: plan: --min-nodes wants a number from 1 to %d\n",
                        PLACEMENT_MAX_STAGES);
                return 2;
            }
            o.min_nodes = (int)v;
        } else if (!strcmp(a, "--split")) {
            if (strcmp(val, "layers") && strcmp(val, "tensor") && strcmp(val, "auto")) {
                fprintf(stderr, "racimo: plan: --split takes layers, tensor or auto, not '%s'\n",
                        val);
                return 2;
            }
            o.tensor = !strcmp(val, "tensor");
            o.auto_split = !strcmp(val, "auto");
        } else if (!strcmp(a, "--node")) {
            if (n_spec >= MAX_NODES) {
                fprintf(stderr, "racimo: plan: at most %d --node\n", MAX_NODES);
                return 2;
            }
            spec[n_spec++] = val;
        } else if (!strcmp(a, "--cluster")) {
            url = val;
        } else if (!strcmp(a, "--reserve")) {
            if (cli_parse_size(val, &o.reserve)) {
                fprintf(stderr, "racimo: plan: --reserve: '%s' is not a size (examples: 1G, 512M)\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--api-key")) {
            key = val;
        } else {
            fprintf(stderr, "racimo: plan: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!model_path) {
        fprintf(stderr, "racimo: plan: which model? (-m MODEL)\n");
        usage(stderr);
        return 2;
    }
    if (n_spec && url) {
        fprintf(stderr, "racimo: plan: give either --node specs or --cluster, not both\n");
        return 2;
    }
    if (n_spec) {
        if (!(nodes = rc_calloc((size_t)n_spec, sizeof *nodes)))
            return cli_error("plan");
        for (int i = 0; i < n_spec; i++) {
            if (parse_node(spec[i], &nodes[i], err, sizeof err)) {
                fprintf(stderr, "racimo: plan: %s\n", err);
                goto out;
            }
            for (int j = 0; j < i; j++)
                if (!strcmp(nodes[j].id, nodes[i].id)) {
                    fprintf(stderr, "racimo: plan: --node '%s': the name '%s' is given twice\n",
                            spec[i], nodes[i].id);
                    goto out;
                }
        }
        n_nodes = n_spec;
    }
    rc = 1;
    if (gguf_open(model_path, &f) || model_sizes_read(f, &ms) ||
        model_sizes_set_kv_type(&ms, cache)) {
        cli_error("plan");
        goto out;
    }
    /* as racimo serve: 4096, and never past what the model was trained for */
    model_hparams hp;
    if (model_read_hparams(f, &hp) == 0 && hp.n_ctx_train > 0 && o.n_ctx > hp.n_ctx_train) {
        fprintf(stderr, "racimo: plan: --ctx %d is more than the model's context %d; using %d\n",
                o.n_ctx, hp.n_ctx_train, hp.n_ctx_train);
        o.n_ctx = hp.n_ctx_train;
    }
    if (!o.n_ctx)
        o.n_ctx = hp.n_ctx_train > 0 && hp.n_ctx_train < 4096 ? hp.n_ctx_train : 4096;

    char source[600];
    if (n_spec) {
        snprintf(source, sizeof source, "%d given with --node", n_spec);
    } else {
        const char *ask = url ? url : DEFAULT_URL;
        if (get_view(ask, key, url ? 10 : 3, &view, err, sizeof err)) {
            if (url) {
                fprintf(stderr, "racimo: plan: %s\n", err);
                goto out;
            }
            /* nobody to ask: this machine alone (measuring its bandwidth once) */
            fprintf(stderr, "racimo: plan: %s: %s; planning for this machine alone\n", ask, err);
            json_t *hw = cluster_local_hardware(NULL, 0, true);
            char host[64] = "this machine";
            gethostname(host, sizeof host - 1);
            view = hw ? json_pack("{s:[{s:s, s:s, s:s, s:o}]}", "nodes", "id", "local", "name",
                                  host, "state", "up", "hardware", hw)
                      : NULL;
            if (!view) {
                fprintf(stderr, "racimo: plan: out of memory\n");
                goto out;
            }
            snprintf(source, sizeof source, "this machine");
        } else {
            snprintf(source, sizeof source, "the cluster of %s", ask);
        }
        if (placement_nodes_from_view(view, &nodes, &n_nodes, &links)) {
            cli_error("plan");
            goto out;
        }
        if (links)
            placement_links_from_view(view, nodes, n_nodes, ms.n_embd, links);
    }

    placement p;
    if (placement_make(&ms, nodes, n_nodes, links, &o, &p)) {
        cli_error("plan");
        goto out;
    }
    if (as_json) {
        json_t *j = placement_to_json(&p, &ms);
        char *s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        print_plan(model_path, &ms, &o, &p, nodes, source);
    }
    rc = p.fits ? 0 : 1;
out:
    json_decref(view);
    model_sizes_free(&ms);
    gguf_close(f);
    rc_free(nodes);
    rc_free(links);
    return rc;
}
