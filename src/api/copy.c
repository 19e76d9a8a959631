/* copy.c - whole copies of a model on every node (`racimo pull
 * --everywhere`, POST /v1/models/copy, GET /v1/models/copies).
 *
 * The node asked sends COPY (type 0x60, the model name as bytes) to every
 * node up that does not list the model, and starts a copy itself when it
 * lacks it.  A node told to copy checks its models folder has room for the
 * file (its size as the cluster view lists it, plus a margin) and then pulls
 * the whole file with weights_ensure (all layers): the same verified block
 * transfer as a pipeline stage's, peer to peer over the LAN, never from the
 * Hub, in pieces from up to four nodes that have it (a node whose copy is
 * done is one of them for the others).  A finished copy is listed at once
 * (cluster_rescan_models).  A node without room (before the copy, or the
 * disk filling during it) leaves nothing of it behind (weights_discard).
 * Either way the node tells the one that asked with COPY_RESULT (0x61:
 * u8 name length | name | i32 status | u16 length | message), which keeps
 * the last outcome per model and node for GET /v1/models/copies (racimo
 * pull --everywhere shows them).
 *
 * Threads: the message handler runs on the cluster thread and only starts a
 * thread per copy (at most COPY_MAX at once, one per name); api_copies_free
 * joins them, after cluster_free (a transfer waiting on a peer then fails).
 */
#include "server_internal.h"
#include "base/err.h"
#include "base/le.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"
#include "cluster/weights.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define COPY_MSG 0x60
#define COPY_RESULT_MSG 0x61
#define COPY_MAX 8
#define RESULTS_MAX 64
#define COPY_MARGIN_BYTES (64ull << 20)
#define COPY_WAIT_NS (30ull * 1000000000ull)   /* for the holder's list to show the model */

typedef struct {
    struct api_copies *owner;
    char name[WEIGHTS_NAME_MAX + 1];
    char asker[65];              /* the node that asked (its id) */
    pthread_t thread;
    bool used, done;
} copy_job;

/* How a node's copy of a model ended, as it reported it. */
typedef struct {
    char model[WEIGHTS_NAME_MAX + 1];
    char node[65];               /* id */
    int status;                  /* 0, or the RC_E* code (RC_ELIMIT: no room) */
    char error[400];
} copy_result;

struct api_copies {
    struct cluster *c;
    weights *w;
    char models_dir[1024];
    pthread_mutex_t mu;
    copy_job jobs[COPY_MAX];
    copy_result results[RESULTS_MAX];
    int n_results, next_result;
};

/* Keeps the outcome of node `node`'s copy of `model` (replacing an older
 * one of that pair). */
static void keep_result(api_copies *a, const char *mname, const char *node, int status,
                        const char *error)
{
    pthread_mutex_lock(&a->mu);
    copy_result *r = NULL;
    for (int i = 0; i < a->n_results && !r; i++)
        if (!strcmp(a->results[i].model, mname) && !strcmp(a->results[i].node, node))
            r = &a->results[i];
    if (!r) {
        r = &a->results[a->next_result];
        a->next_result = (a->next_result + 1) % RESULTS_MAX;
        if (a->n_results < RESULTS_MAX)
            a->n_results++;
    }
    snprintf(r->model, sizeof r->model, "%s", mname);
    snprintf(r->node, sizeof r->node, "%s", node);
    r->status = status;
    snprintf(r->error, sizeof r->error, "%s", status ? error : "");
    pthread_mutex_unlock(&a->mu);
}

/* Forgets the outcomes of `model` (a new round of copies starts). */
static void forget_results(api_copies *a, const char *mname)
{
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->n_results; i++)
        if (!strcmp(a->results[i].model, mname))
            a->results[i].model[0] = 0;
    pthread_mutex_unlock(&a->mu);
}

/* Tells the node that asked how the copy ended (itself: kept here). */
static void report(api_copies *a, const copy_job *j, int status, const char *error)
{
    const char *self = cluster_self_id(a->c);
    if (!j->asker[0] || !strcmp(j->asker, self)) {
        keep_result(a, j->name, self, status, error);
        return;
    }
    uint8_t msg[1 + WEIGHTS_NAME_MAX + 4 + 2 + 400];
    size_t n = strlen(j->name), e = status ? strlen(error) : 0;
    if (e > 400)
        e = 400;
    msg[0] = (uint8_t)n;
    memcpy(msg + 1, j->name, n);
    le_put32(msg + 1 + n, (uint32_t)status);
    msg[5 + n] = (uint8_t)e;
    msg[6 + n] = (uint8_t)(e >> 8);
    memcpy(msg + 7 + n, error, e);
    if (cluster_send(a->c, j->asker, COPY_RESULT_MSG, msg, 7 + n + e))
        rc_log(LOG_WARN, "copy of model %s: cannot tell node %.8s how it ended: %s", j->name,
               j->asker, rc_errmsg());
}

/* The size a node up lists for `name` (not this one), 0 when none does;
 * *here tells whether this node lists it; sha256 (65 bytes, or NULL) gets
 * the sha256 a holder lists for it ("" when none does). */
static uint64_t listed_size(struct cluster *c, const char *name, bool *here, json_t *holders,
                            char *sha256)
{
    json_t *view = cluster_snapshot(c), *n, *m;
    size_t i, j;
    uint64_t size = 0;
    *here = false;
    if (sha256)
        sha256[0] = 0;
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *st = json_string_value(json_object_get(n, "state"));
        if (!st || strcmp(st, "up"))
            continue;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            if (!mn || strcmp(mn, name))
                continue;
            if (json_is_true(json_object_get(n, "self")))
                *here = true;
            size = (uint64_t)json_integer_value(json_object_get(m, "size_bytes"));
            const char *sha = json_string_value(json_object_get(m, "sha256"));
            if (sha256 && sha && strlen(sha) == 64 && strspn(sha, "0123456789abcdef") == 64)
                memcpy(sha256, sha, 65);
            if (holders)
                json_array_append(holders, json_object_get(n, "id"));
        }
    }
    json_decref(view);
    return size;
}

/* A finished copy against the sha256 its holders list (the one `racimo
 * pull` verified against the Hub's): kept as the file's sha256 attribute
 * when it matches, deleted when it does not. */
static int check_sha256(const char *path, const char *want)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rc_fail(RC_EIO, "%s: %s", path, strerror(errno));
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    uint8_t *buf = rc_malloc(1 << 20), h[crypto_hash_sha256_BYTES];
    ssize_t r = buf ? 1 : -1;
    while (r > 0)
        if ((r = read(fd, buf, 1 << 20)) > 0)
            crypto_hash_sha256_update(&st, buf, (unsigned long long)r);
    rc_free(buf);
    crypto_hash_sha256_final(&st, h);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    int rc = 0;
    if (r < 0)
        rc = rc_fail(RC_EIO, "%s: cannot read it to check its sha256", path);
    else if (strcmp(hex, want)) {
        unlink(path);
        rc = rc_fail(RC_EFORMAT, "%s: sha256 %.16s... is not the %.16s... the holders list; "
                     "the copy was deleted", path, hex, want);
    } else if (os_file_tag_set(fd, "sha256", hex, 64)) {
        rc_log(LOG_INFO, "copy: %s: sha256 verified, not recorded (%s)", path, rc_errmsg());
    }
    close(fd);
    return rc;
}

static void *copy_thread(void *arg)
{
    copy_job *j = arg;
    api_copies *a = j->owner;
    char path[1200], sha256[65] = "";
    uint64_t t0 = os_now_ns();
    int rc;
    for (;;) {
        bool here;
        uint64_t size = listed_size(a->c, j->name, &here, NULL, sha256);
        struct statvfs vfs;
        if (here) {
            rc = 0;
            break;
        }
        if (!size) {
            /* the holder's list may not show a file it just pulled yet */
            if (os_now_ns() - t0 > COPY_WAIT_NS) {
                rc = rc_fail(RC_ENOTFOUND, "no node up lists %s", j->name);
                break;
            }
            os_sleep_ms(200);
            continue;
        }
        if (!statvfs(a->models_dir, &vfs) &&
            (uint64_t)vfs.f_bavail * vfs.f_frsize < size + COPY_MARGIN_BYTES) {
            rc = rc_fail(RC_ELIMIT, "no room in %s for %s (%.1f MiB and a margin of %llu MiB, "
                         "%.1f MiB free): skipped", a->models_dir, j->name,
                         (double)size / 1048576.0, COPY_MARGIN_BYTES >> 20,
                         (double)vfs.f_bavail * (double)vfs.f_frsize / 1048576.0);
            break;
        }
        rc = weights_ensure(a->w, j->name, 0, -1, NULL, NULL, NULL, NULL, path, sizeof path);
        /* blocks were checked against the content digest; the whole file
         * too against the sha256 from the Hub, when the holders list one */
        if (!rc && sha256[0])
            rc = check_sha256(path, sha256);
        break;
    }
    char error[400];
    snprintf(error, sizeof error, "%s", rc ? rc_errmsg() : "");
    if (rc == RC_ELIMIT && weights_discard(a->w, j->name))   /* the disk filled up */
        rc_log(LOG_WARN, "copy of model %s: %s", j->name, rc_errmsg());
    if (rc)
        rc_log(LOG_WARN, "copy of model %s: %s", j->name, error);
    else
        rc_log(LOG_INFO, "copy of model %s: complete (%s)", j->name, path);
    report(a, j, rc, error);
    cluster_rescan_models(a->c);
    pthread_mutex_lock(&a->mu);
    j->done = true;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* A copy of `name` here for node `asker`, unless one runs already;
 * RC_ELIMIT when COPY_MAX copies run. */
static int start_copy(api_copies *a, const char *name, const char *asker)
{
    pthread_mutex_lock(&a->mu);
    copy_job *free_slot = NULL;
    int rc = 0;
    for (int i = 0; i < COPY_MAX; i++) {
        copy_job *j = &a->jobs[i];
        if (j->used && j->done) {
            pthread_join(j->thread, NULL);
            j->used = false;
        }
        if (j->used && !strcmp(j->name, name)) {
            pthread_mutex_unlock(&a->mu);
            return 0;
        }
        if (!j->used && !free_slot)
            free_slot = j;
    }
    if (!free_slot) {
        rc = rc_fail(RC_ELIMIT, "%d copies run already", COPY_MAX);
    } else {
        *free_slot = (copy_job){ .owner = a, .used = true };
        snprintf(free_slot->name, sizeof free_slot->name, "%s", name);
        snprintf(free_slot->asker, sizeof free_slot->asker, "%s", asker);
        if (pthread_create(&free_slot->thread, NULL, copy_thread, free_slot)) {
            free_slot->used = false;
            rc = rc_fail(RC_ENOMEM, "cannot start a thread");
        }
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

static bool plain_name(const char *s, size_t len)
{
    if (!len || len > WEIGHTS_NAME_MAX || s[0] == '.')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.+", s[i]))
            return false;
    return true;
}

static void on_msg(void *ud, const char *from_id, int type, const uint8_t *data, size_t len)
{
    api_copies *a = ud;
    char name[WEIGHTS_NAME_MAX + 1], who[96];
    cluster_node_label(a->c, from_id, who, sizeof who);
    if (type == COPY_RESULT_MSG) {
        size_t n = len ? data[0] : 0;
        size_t e = len >= 7 + n ? (size_t)(data[5 + n] | data[6 + n] << 8) : 0;
        if (len < 7 || len != 7 + n + e || !plain_name((const char *)data + 1, n)) {
            rc_log(LOG_WARN, "copy: node %s sent a malformed result (%zu bytes)", who, len);
            return;
        }
        char error[401];
        memcpy(name, data + 1, n);
        name[n] = 0;
        for (size_t i = 0; i < e && i < 400; i++)     /* a peer's text: printable only */
            error[i] = data[7 + n + i] >= 0x20 && data[7 + n + i] < 0x7f ? (char)data[7 + n + i]
                                                                          : '?';
        error[e < 400 ? e : 400] = 0;
        int32_t status = (int32_t)le_get32(data + 1 + n);
        keep_result(a, name, from_id, status, status ? error : "");
        rc_log(status ? LOG_WARN : LOG_INFO, "copy: node %s %s model %s%s%s", who,
               status ? "did not copy" : "copied", name, status ? ": " : "", error);
        return;
    }
    if (type != COPY_MSG || !plain_name((const char *)data, len)) {
        rc_log(LOG_WARN, "copy: node %s sent a malformed request (type 0x%x, %zu bytes)", who,
               type, len);
        return;
    }
    memcpy(name, data, len);
    name[len] = 0;
    rc_log(LOG_INFO, "copy: node %s asks for a copy of model %s", who, name);
    if (start_copy(a, name, from_id))
        rc_log(LOG_WARN, "copy of model %s: %s", name, rc_errmsg());
}

int api_copies_new(struct cluster *c, struct weights *w, const char *models_dir,
                   api_copies **out)
{
    *out = NULL;
    api_copies *a = rc_calloc(1, sizeof *a);
    if (!a)
        return rc_fail(RC_ENOMEM, "out of memory");
    a->c = c;
    a->w = w;
    snprintf(a->models_dir, sizeof a->models_dir, "%s", models_dir ? models_dir : "");
    pthread_mutex_init(&a->mu, NULL);
    int rc = cluster_add_handler(c, COPY_MSG, COPY_RESULT_MSG, on_msg, a);
    if (rc) {
        api_copies_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void api_copies_free(api_copies *a)
{
    if (!a)
        return;
    for (int i = 0; i < COPY_MAX; i++)
        if (a->jobs[i].used)
            pthread_join(a->jobs[i].thread, NULL);
    pthread_mutex_destroy(&a->mu);
    rc_free(a);
}

int copies_request(api_server *s, struct evhttp_request *req, const char *body, size_t len)
{
    api_copies *a = s->cfg.copies;
    api_error e;
    json_t *o = json_loadb(body ? body : "", len, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "model"));
    int status = 202;
    json_t *asked = json_array(), *holders = json_array();
    bool here = false;
    char path[1200];
    if (!a) {
        status = 400;
        api_fail(&e, status, "no_cluster", NULL, "this node is not in a cluster");
    } else if (!name || !plain_name(name, strlen(name))) {
        status = 400;
        api_fail(&e, status, "invalid_model", "model", "'model' names a model file of the "
                 "cluster (letters, digits, '-', '_', '.', '+')");
    } else if (!listed_size(a->c, name, &here, holders, NULL) && !here &&
               cluster_model_path(a->c, name, path, sizeof path)) {
        status = 404;
        api_fail(&e, status, "model_not_found", "model", "no node up lists model '%.200s'",
                 name);
    }
    if (status != 202) {
        json_decref(o);
        json_decref(asked);
        json_decref(holders);
        http_reply_error(s, req, false, &e);
        return status;
    }
    /* a file pulled here a moment ago: listed at the next tick (the others
     * wait for that) */
    if (!here && !cluster_model_path(a->c, name, path, sizeof path)) {
        here = true;
        cluster_rescan_models(a->c);
        json_array_append_new(holders, json_string(cluster_self_id(a->c)));
    }
    /* every node up without it; this one copies too when it lacks it */
    forget_results(a, name);
    json_t *view = cluster_snapshot(a->c), *n;
    size_t i;
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *st = json_string_value(json_object_get(n, "state"));
        const char *id = json_string_value(json_object_get(n, "id"));
        bool has = false;
        size_t k;
        json_t *h;
        json_array_foreach(holders, k, h)
            has = has || (id && !strcmp(json_string_value(h), id));
        if (!st || strcmp(st, "up") || !id || has)
            continue;
        int rc = json_is_true(json_object_get(n, "self"))
               ? start_copy(a, name, cluster_self_id(a->c))
               : cluster_send(a->c, id, COPY_MSG, name, strlen(name));
        if (!rc)
            json_array_append(asked, json_object_get(n, "name"));
    }
    json_decref(view);
    http_reply_json(s, req, 202, json_pack("{s:s, s:o, s:o}", "model", name, "asked", asked,
                                           "holders", holders), NULL, NULL);
    json_decref(o);
    return 202;
}

int copies_status(api_server *s, struct evhttp_request *req)
{
    api_copies *a = s->cfg.copies;
    json_t *list = json_array();
    json_t *view = a ? cluster_snapshot(a->c) : NULL;
    if (a) {
        pthread_mutex_lock(&a->mu);
        for (int i = 0; i < a->n_results; i++) {
            const copy_result *r = &a->results[i];
            const char *node = NULL;
            size_t k;
            json_t *n;
            if (!r->model[0])
                continue;
            json_array_foreach(json_object_get(view, "nodes"), k, n) {
                const char *id = json_string_value(json_object_get(n, "id"));
                if (id && !strcmp(id, r->node))
                    node = json_string_value(json_object_get(n, "name"));
            }
            json_array_append_new(list, json_pack("{s:s, s:s, s:s*, s:s, s:s*}", "model",
                                                  r->model, "node_id", r->node, "node", node,
                                                  "state", !r->status ? "done"
                                                  : r->status == RC_ELIMIT ? "skipped" : "failed",
                                                  "error", r->status ? r->error : NULL));
        }
        pthread_mutex_unlock(&a->mu);
    }
    json_decref(view);
    http_reply_json(s, req, 200, json_pack("{s:o}", "copies", list), NULL, NULL);
    return 200;
}
