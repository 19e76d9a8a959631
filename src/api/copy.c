/* copy.c - whole copies of a model on every node (`racimo pull
 * --everywhere`, POST /v1/models/copy).
 *
 * The node asked sends COPY (type 0x60, the model name as bytes) to every
 * node up that does not list the model, and starts a copy itself when it
 * lacks it.  A node told to copy checks its models folder has room for the
 * file (its size as the cluster view lists it, plus a margin) and then pulls
 * the whole file from the nodes that list it with weights_ensure (all
 * layers): the same verified block transfer as a pipeline stage's, peer to
 * peer over the LAN, never from the Hub.  A finished copy is listed at once
 * (cluster_rescan_models).  A node without room logs why and does nothing.
 *
 * Threads: the message handler runs on the cluster thread and only starts a
 * thread per copy (at most COPY_MAX at once, one per name); api_copies_free
 * joins them, after cluster_free (a transfer waiting on a peer then fails).
 */
#include "server_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "cluster/cluster.h"
#include "cluster/weights.h"

#include <ctype.h>
#include <string.h>
#include <sys/statvfs.h>

#define COPY_MSG 0x60
#define COPY_MAX 8
#define COPY_MARGIN_BYTES (64ull << 20)
#define COPY_WAIT_NS (30ull * 1000000000ull)   /* for the holder's list to show the model */

typedef struct {
    struct api_copies *owner;
    char name[WEIGHTS_NAME_MAX + 1];
    pthread_t thread;
    bool used, done;
} copy_job;

struct api_copies {
    struct cluster *c;
    weights *w;
    char models_dir[1024];
    pthread_mutex_t mu;
    copy_job jobs[COPY_MAX];
};

/* The size a node up lists for `name` (not this one), 0 when none does;
 * *here tells whether this node lists it. */
static uint64_t listed_size(struct cluster *c, const char *name, bool *here, json_t *holders)
{
    json_t *view = cluster_snapshot(c), *n, *m;
    size_t i, j;
    uint64_t size = 0;
    *here = false;
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
            if (holders)
                json_array_append(holders, json_object_get(n, "id"));
        }
    }
    json_decref(view);
    return size;
}

static void *copy_thread(void *arg)
{
    copy_job *j = arg;
    api_copies *a = j->owner;
    char path[1200];
    uint64_t t0 = os_now_ns();
    int rc;
    for (;;) {
        bool here;
        uint64_t size = listed_size(a->c, j->name, &here, NULL);
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
            rc = rc_fail(RC_ELIMIT, "no room in %s for %s (%.1f MiB, %.1f MiB free)",
                         a->models_dir, j->name, (double)size / 1048576.0,
                         (double)vfs.f_bavail * (double)vfs.f_frsize / 1048576.0);
            break;
        }
        rc = weights_ensure(a->w, j->name, 0, -1, NULL, NULL, NULL, NULL, path, sizeof path);
        break;
    }
    if (rc)
        rc_log(LOG_WARN, "copy of model %s: %s", j->name, rc_errmsg());
    else
        rc_log(LOG_INFO, "copy of model %s: complete (%s)", j->name, path);
    cluster_rescan_models(a->c);
    pthread_mutex_lock(&a->mu);
    j->done = true;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* A copy of `name` here, unless one runs already; RC_ELIMIT when COPY_MAX
 * copies run. */
static int start_copy(api_copies *a, const char *name)
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
    if (type != COPY_MSG || !plain_name((const char *)data, len)) {
        rc_log(LOG_WARN, "copy: node %s sent a malformed request (type 0x%x, %zu bytes)", who,
               type, len);
        return;
    }
    memcpy(name, data, len);
    name[len] = 0;
    rc_log(LOG_INFO, "copy: node %s asks for a copy of model %s", who, name);
    if (start_copy(a, name))
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
    int rc = cluster_add_handler(c, COPY_MSG, COPY_MSG, on_msg, a);
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
    } else if (!listed_size(a->c, name, &here, holders) && !here &&
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
        int rc = json_is_true(json_object_get(n, "self")) ? start_copy(a, name)
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
