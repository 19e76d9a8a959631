/* cmd_pull.c - `racimo pull`: fetches a GGUF model from Hugging Face (or
 * $HF_ENDPOINT) into this machine's models folder (src/hub), where a
 * running node finds it and lists it to the cluster.  A progress bar on a
 * terminal, a line every few seconds otherwise; Ctrl-C keeps what arrived
 * for the next pull to resume. */
#include "cli.h"
#include "cli_http.h"
#include "base/err.h"
#include "base/os.h"
#include "hub/hub.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo pull hf.co/ORG/REPO[:QUANT] [options]\n"
        "       racimo pull ORG/REPO --file NAME.gguf [options]\n"
        "\n"
        "Downloads a GGUF model from Hugging Face into the models folder: the file\n"
        "tagged QUANT (Q4_K_M, Q8_0..., any case; default Q4_K_M, or the repository's\n"
        "only model), or every part of a split model (kept as published and loaded\n"
        "in place, NAME-00001-of-0000N.gguf ... served as NAME).  Each file is\n"
        "checked against the sha256 the Hub lists before it appears in the folder\n"
        "(the parts of a set all at once); an interrupted pull resumes where it\n"
        "stopped when run again.  A running node serves the model under its file\n"
        "name (without .gguf) and lists it to its cluster, whose nodes fetch it\n"
        "from this one over the LAN.\n"
        "\n"
        "  --file NAME       this file of the repository (a part of a split model\n"
        "                    brings all its parts)\n"
        "  --token TOKEN     a Hugging Face token for gated or private repositories\n"
        "                    (default $HF_TOKEN)\n"
        "  --models-dir DIR  where to put it (default $RACIMO_MODELS_DIR, else\n"
        "                    $RACIMO_HOME/models, else ~/.racimo/models)\n"
        "  --everywhere      then have every node of the cluster copy the whole file\n"
        "                    from the nodes that have it, peer to peer, each node\n"
        "                    reading pieces from up to 4 that have it (POST\n"
        "                    /v1/models/copy to the node at --url); waits until\n"
        "                    each has it or says why not (a node without room is\n"
        "                    skipped, nothing of the copy left on it)\n"
        "  --url URL         the node for --everywhere (default http://127.0.0.1:8080;\n"
        "                    it must use the same models folder)\n"
        "  --api-key KEY     when that node requires one (default $RACIMO_API_KEY)\n"
        "  --quiet           no progress, only errors and the result\n"
        "\n"
        "$HF_ENDPOINT names a mirror of the Hub (default https://huggingface.co);\n"
        "proxies come from $https_proxy and the like.  Nothing is contacted unless you\n"
        "pull.\n");
}

static volatile int interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct {
    bool tty, quiet;
    uint64_t last_ns;
    int last_index;
    const char *last_phase;
} progress_out;

static void human(uint64_t b, char *out, size_t cap)
{
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void on_progress(void *arg, const hub_progress *p)
{
    progress_out *o = arg;
    if (o->quiet)
        return;
    char done[32], total[32], rate[32] = "", eta[32] = "";
    human(p->file_done, done, sizeof done);
    human(p->file_total, total, sizeof total);
    if (p->bytes_per_s > 0) {
        human((uint64_t)p->bytes_per_s, rate, sizeof rate);
        strcat(rate, "/s");
        uint64_t s = (uint64_t)((double)(p->total - p->done) / p->bytes_per_s);
        snprintf(eta, sizeof eta, "ETA %llu:%02llu:%02llu", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
    }
    int pct = p->file_total ? (int)(p->file_done * 100 / p->file_total) : 100;
    bool phase_change = p->index != o->last_index || o->last_phase != p->phase;
    uint64_t now = os_now_ns();
    if (o->tty) {
        char bar[31];
        int fill = pct * 30 / 100;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        char part[32] = "";
        if (p->n_files > 1)
            snprintf(part, sizeof part, "[%d/%d] ", p->index + 1, p->n_files);
        fprintf(stderr, "\r\033[K%s%s [%s] %3d%% %s/%s %s %s", part, p->file->name, bar, pct,
                done, total, rate, eta);
        if (!strcmp(p->phase, "done"))
            fprintf(stderr, "\r\033[K%s: %s, sha256 verified\n", p->file->name, total);
        else if (!strcmp(p->phase, "joining"))
            fprintf(stderr, "\r\033[Kjoining %d parts into one file\n", p->n_files);
        else if (!strcmp(p->phase, "verifying"))
            fprintf(stderr, " verifying");
        fflush(stderr);
    } else if (phase_change || now - o->last_ns >= 5000000000ull) {
        if (!strcmp(p->phase, "done"))
            fprintf(stderr, "%s: %s, sha256 verified\n", p->file->name, total);
        else if (!strcmp(p->phase, "joining"))
            fprintf(stderr, "joining %d parts into one file\n", p->n_files);
        else
            fprintf(stderr, "%s: %s %d%% (%s of %s) %s %s\n", p->file->name, p->phase, pct,
                    done, total, rate, eta);
        o->last_ns = now;
    }
    o->last_index = p->index;
    o->last_phase = p->phase;
}

/* Whether node `id` lists `model` in the view v. */
static bool lists(json_t *v, const char *id, const char *model)
{
    size_t i, j;
    json_t *n, *m;
    json_array_foreach(json_object_get(v, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "name"));
        if (!nid || strcmp(nid, id))
            continue;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            if (mn && !strcmp(mn, model))
                return true;
        }
    }
    return false;
}

/* The outcome node `who` reported for its copy of `model` (GET
 * /v1/models/copies): "skipped", "failed" or NULL (none yet, or done);
 * *error its message. */
static const char *copy_outcome(json_t *copies, const char *who, const char *model,
                                const char **error)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(copies, "copies"), i, c) {
        const char *node = json_string_value(json_object_get(c, "node"));
        const char *m = json_string_value(json_object_get(c, "model"));
        const char *state = json_string_value(json_object_get(c, "state"));
        if (node && m && state && !strcmp(node, who) && !strcmp(m, model) &&
            strcmp(state, "done")) {
            *error = json_string_value(json_object_get(c, "error"));
            return state;
        }
    }
    return NULL;
}

/* --everywhere: asks the node at url to have every node copy the model,
 * then waits until each node asked lists it or reports why it does not.
 * 0 when every node has it or was skipped for want of room, or 1 after a
 * message. */
static int copy_everywhere(const char *url, const char *key, const char *model, uint64_t bytes,
                           bool quiet)
{
    char body[600], err[600];
    json_t *r, *asked;
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", model);  /* a plain file name */
    if (cli_http_json("POST", url, "/v1/models/copy", key, body, 30, &r, err, sizeof err)) {
        fprintf(stderr, "racimo: pull: --everywhere: %s\n", err);
        return 1;
    }
    asked = json_object_get(r, "asked");
    size_t n_asked = json_array_size(asked), n_done = 0;
    if (!quiet)
        fprintf(stderr, "copying %s to %zu node%s, peer to peer\n", model, n_asked,
                n_asked == 1 ? "" : "s");
    /* a generous deadline: 2 minutes, and 1 MB/s for the bytes */
    uint64_t deadline = os_now_ns() + (120 + bytes / 1000000) * 1000000000ull;
    bool *seen = calloc(n_asked ? n_asked : 1, sizeof *seen);
    size_t n_failed = 0;
    while (seen && n_done < n_asked && os_now_ns() < deadline && !interrupted) {
        json_t *v, *copies = NULL;
        if (!cli_http_json("GET", url, "/v1/cluster", key, NULL, 10, &v, err, sizeof err)) {
            if (cli_http_json("GET", url, "/v1/models/copies", key, NULL, 10, &copies, err,
                              sizeof err))
                copies = NULL;             /* an older node: the listing alone tells */
            for (size_t i = 0; i < n_asked; i++) {
                const char *who = json_string_value(json_array_get(asked, i)), *error = NULL;
                const char *state = who && !seen[i] ? copy_outcome(copies, who, model, &error)
                                                    : NULL;
                if (!seen[i] && who && lists(v, who, model)) {
                    seen[i] = true;
                    n_done++;
                    if (!quiet)
                        fprintf(stderr, "%s: has a verified copy (%zu/%zu)\n", who, n_done,
                                n_asked);
                } else if (state) {
                    seen[i] = true;
                    n_done++;
                    n_failed += strcmp(state, "skipped") != 0;
                    fprintf(stderr, "racimo: pull: --everywhere: %s %s: %s\n", who,
                            strcmp(state, "skipped") ? "failed" : "was skipped",
                            error ? error : "(no reason given)");
                }
            }
            json_decref(copies);
            json_decref(v);
        }
        if (n_done < n_asked)
            os_sleep_ms(500);
    }
    for (size_t i = 0; seen && i < n_asked; i++)
        if (!seen[i])
            fprintf(stderr, "racimo: pull: --everywhere: %s has no copy of %s yet (its log says "
                    "why: no room?)\n", json_string_value(json_array_get(asked, i)), model);
    int rc = seen && n_done == n_asked && !n_failed ? 0 : 1;
    free(seen);
    json_decref(r);
    return rc;
}

int cmd_pull(int argc, char **argv)
{
    const char *name = NULL, *file = NULL, *dir = NULL;
    const char *url = "http://127.0.0.1:8080", *key = getenv("RACIMO_API_KEY");
    bool everywhere = false;
    hub_config cfg;
    hub_config_default(&cfg);
    progress_out po = { .tty = isatty(2), .last_index = -1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--file") || !strcmp(a, "--token") || !strcmp(a, "--models-dir") ||
                     !strcmp(a, "--url") || !strcmp(a, "--api-key");
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (takes && !val) {
            fprintf(stderr, "racimo: pull: %s wants a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--file"))
            file = val;
        else if (!strcmp(a, "--token"))
            cfg.token = val;
        else if (!strcmp(a, "--models-dir"))
            dir = val;
        else if (!strcmp(a, "--url"))
            url = val;
        else if (!strcmp(a, "--api-key"))
            key = val;
        else if (!strcmp(a, "--everywhere"))
            everywhere = true;
        else if (!strcmp(a, "--quiet"))
            po.quiet = true;
        else if (a[0] == '-' || name) {
            fprintf(stderr, "racimo: pull: unexpected '%s'\n", a);
            usage(stderr);
            return 2;
        } else
            name = a;
        if (takes)
            i++;
    }
    if (!name) {
        usage(stderr);
        return 2;
    }
    char dir_buf[4096];
    if (!dir && !(dir = getenv("RACIMO_MODELS_DIR"))) {
        const char *home = getenv("RACIMO_HOME");
        if (home)
            snprintf(dir_buf, sizeof dir_buf, "%s/models", home);
        else if ((home = getenv("HOME")))
            snprintf(dir_buf, sizeof dir_buf, "%s/.racimo/models", home);
        else {
            fprintf(stderr, "racimo: pull: no models folder: set --models-dir\n");
            return 2;
        }
        dir = dir_buf;
    }
    cfg.models_dir = dir;
    cfg.progress = on_progress;
    cfg.arg = &po;
    cfg.cancel = &interrupted;

    struct sigaction sa = { 0 };
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    hub_plan plan;
    if (hub_resolve(&cfg, name, file, &plan))
        return cli_error("pull");
    char total[32];
    human(plan.total_bytes, total, sizeof total);
    if (!po.quiet)
        fprintf(stderr, "pulling %s: %d file%s, %s, into %s\n", plan.repo, plan.n_files,
                plan.n_files == 1 ? "" : "s", total, dir);
    int rc = hub_download(&cfg, &plan);
    if (po.tty && !po.quiet && rc)
        fprintf(stderr, "\n");
    if (rc)
        return cli_error("pull");
    char model[HUB_PATH_MAX];
    hub_model_name(&cfg, &plan, model, sizeof model);
    if (!po.quiet)
        fprintf(stderr, "pulled: serve it as model '%s'\n", model);
    if (everywhere && copy_everywhere(url, key, model, plan.total_bytes, po.quiet))
        return 1;
    printf("%s\n", model);
    return 0;
}
