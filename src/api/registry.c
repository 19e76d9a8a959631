/* registry.c - model files, their loading, and one engine thread per model.
 *
 * Layout: scanning folders; loading (on a loader thread per load);
 * the engine thread; prompts (template + tokenizer); look-ups.
 */
#include "registry.h"
#include "placed.h"
#include "cluster/cluster.h"
#include "cluster/weights.h"
#include "reasoning.h"
#include "tool_calls.h"
#include "tool_turns.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/gguf.h"
#include "text/chat_template.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MODELS 4096

struct api_registry {
    registry_config cfg;
    char *models_dir;
    char *ro_dirs;             /* colon-separated copy */
    char *template_override;
    pthread_mutex_t mu;
    api_model **models;        /* entries are never freed before registry_free */
    int n_models, cap_models;
    void (*on_change)(void *);
    void *arg;
};

static char *read_text_file(const char *path)
{
    os_map map;
    if (os_map_file(path, &map))
        return NULL;
    char *s = rc_strndup(map.data ? (const char *)map.data : "", map.size_bytes);
    os_unmap(&map);
    return s;
}

/* ---- scanning ---- */

static api_model *find_locked(api_registry *r, const char *name, size_t len)
{
    for (int i = 0; i < r->n_models; i++)
        if (strlen(r->models[i]->name) == len && !memcmp(r->models[i]->name, name, len))
            return r->models[i];
    return NULL;
}

static int grow_locked(api_registry *r)
{
    int cap = r->cap_models ? r->cap_models * 2 : 16;
    api_model **nm = rc_realloc(r->models, (size_t)cap * sizeof *nm);
    if (!nm)
        return RC_ENOMEM;
    r->models = nm;
    r->cap_models = cap;
    return 0;
}

/* Adds a file as a model unless its name is taken; 0 or RC_ENOMEM. */
static int add_file(api_registry *r, const char *path, bool read_only, bool preload)
{
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode))
        return rc_fail(RC_EIO, "%s: not a readable file", path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base), stem;
    uint32_t no, count;
    uint64_t size = (uint64_t)st.st_size;
    if (len > 5 && !strcmp(base + len - 5, ".gguf"))
        len -= 5;
    /* a split set is one model, named without the part suffix, listed by
     * its first part with the bytes of all (a set with a part missing is
     * listed too: loading it names the missing file) */
    if (gguf_split_name(path, &stem, &no, &count)) {
        if (no != 0 && preload)
            return rc_fail(RC_EINVAL, "%s is part %u of %u of a split model: give its first "
                           "part", path, no + 1, count);
        if (no != 0)
            return 0;
        len = (size_t)(path + stem - base);
        if (gguf_split_set_bytes(path, &size))
            size = (uint64_t)st.st_size;
    }
    api_model *m = find_locked(r, base, len);
    if (m) {
        if (m->deleted && !strcmp(m->path, path))
            m->deleted = false;         /* the file is back (pulled again) */
        if (m->state == MODEL_AVAILABLE && !strcmp(m->path, path)) {
            m->size_bytes = size;
            m->mtime = st.st_mtime;
        }
        return 0;
    }
    if (r->n_models >= MAX_MODELS)
        return 0;
    if (r->n_models == r->cap_models && grow_locked(r))
        return RC_ENOMEM;
    if (!(m = rc_calloc(1, sizeof *m)))
        return RC_ENOMEM;
    m->name = rc_strndup(base, len);
    m->path = rc_strdup(path);
    if (!m->name || !m->path) {
        rc_free(m->name);
        rc_free(m->path);
        rc_free(m);
        return RC_ENOMEM;
    }
    m->size_bytes = size;
    m->mtime = st.st_mtime;
    m->read_only = read_only;
    m->preload = preload;
    m->reg = r;
    m->tool_marker = -1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    r->models[r->n_models++] = m;
    return 0;
}

/* A model no folder here has but node `where` lists: an entry whose load
 * pulls the file's head (and then what this node runs). */
static void add_remote(api_registry *r, const char *name, const char *where, uint64_t size)
{
    char path[512];
    if (strlen(name) > 200)
        return;
    snprintf(path, sizeof path, "node %s:%s.gguf", where, name);
    pthread_mutex_lock(&r->mu);
    api_model *am = NULL;
    if (!find_locked(r, name, strlen(name)) && r->n_models < MAX_MODELS &&
        (r->n_models < r->cap_models || grow_locked(r) == 0) &&
        (am = rc_calloc(1, sizeof *am))) {
        am->name = rc_strdup(name);
        am->path = rc_strdup(path);
        am->size_bytes = size;
        am->remote = true;
        am->reg = r;
        am->tool_marker = -1;
        pthread_mutex_init(&am->mu, NULL);
        pthread_cond_init(&am->cv, NULL);
        if (!am->name || !am->path) {
            rc_free(am->name);
            rc_free(am->path);
            rc_free(am);
        } else {
            r->models[r->n_models++] = am;
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void scan_dir(api_registry *r, const char *dir, bool read_only)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len <= 5 || strcmp(de->d_name + len - 5, ".gguf"))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        add_file(r, path, read_only, false);
    }
    closedir(d);
}

/* Entries for the models other nodes of the cluster list (the first node
 * up that lists a name gives its size), so that every node's model list
 * (GET /v1/models, /api/tags) is the cluster's. */
static void add_cluster_models(api_registry *r)
{
    if (!r->cfg.cluster || !r->cfg.weights)
        return;
    json_t *view = cluster_snapshot(r->cfg.cluster), *n, *m;
    size_t i, j;
    json_array_foreach(json_object_get(view, "nodes"), i, n) {
        const char *st = json_string_value(json_object_get(n, "state"));
        const char *where = json_string_value(json_object_get(n, "name"));
        if (!st || strcmp(st, "up") || json_is_true(json_object_get(n, "self")) || !where)
            continue;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *name = json_string_value(json_object_get(m, "name"));
            if (name && *name)
                add_remote(r, name, where,
                           (uint64_t)json_integer_value(json_object_get(m, "size_bytes")));
        }
    }
    json_decref(view);
}

const char *registry_models_dir(const api_registry *r)
{
    return r->models_dir;
}

void registry_rescan(api_registry *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->models_dir)
        scan_dir(r, r->models_dir, false);
    if (r->ro_dirs) {
        char *copy = rc_strdup(r->ro_dirs), *save = NULL;
        for (char *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir;
             dir = strtok_r(NULL, ":", &save))
            scan_dir(r, dir, true);
        rc_free(copy);
    }
    pthread_mutex_unlock(&r->mu);
    add_cluster_models(r);
}

int registry_new(const registry_config *cfg, void (*on_change)(void *), void *arg,
                 api_registry **out)
{
    *out = NULL;
    api_registry *r = rc_calloc(1, sizeof *r);
    if (!r)
        return rc_fail(RC_ENOMEM, "out of memory");
    r->cfg = *cfg;
    r->on_change = on_change;
    r->arg = arg;
    pthread_mutex_init(&r->mu, NULL);
    int rc = 0;
    const char *dir = cfg->models_dir ? cfg->models_dir : getenv("RACIMO_MODELS_DIR");
    char home_dir[4096];
    if (!dir && getenv("HOME")) {
        snprintf(home_dir, sizeof home_dir, "%s/.racimo/models", getenv("HOME"));
        dir = home_dir;
    }
    const char *ro = cfg->ro_dirs ? cfg->ro_dirs : getenv("RACIMO_MODELS_READ_ONLY_DIRS");
    if ((dir && !(r->models_dir = rc_strdup(dir))) || (ro && !(r->ro_dirs = rc_strdup(ro)))) {
        rc = rc_fail(RC_ENOMEM, "out of memory");
        goto fail;
    }
    if (cfg->template_file && !(r->template_override = read_text_file(cfg->template_file))) {
        rc = rc_fail(RC_EIO, "cannot read chat template %s", cfg->template_file);
        goto fail;
    }
    for (int i = 0; i < cfg->n_paths; i++)
        if ((rc = add_file(r, cfg->paths[i], false, true)))
            goto fail;
    registry_rescan(r);
    *out = r;
    return 0;
fail:
    registry_free(r);
    return rc;
}

/* ---- loading ---- */

static void unload(api_model *m)
{
    engine_free(m->eng);
    m->eng = NULL;
    lm_close(&m->lm);
    json_decref(m->plan);
    m->plan = NULL;
}

static void *engine_thread(void *arg)
{
    api_model *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->mu);
        bool stop = m->stop;
        m->work = false;
        pthread_mutex_unlock(&m->mu);
        if (stop)
            break;
        int rc;
        while ((rc = engine_step(m->eng)) > 0) {
            pthread_mutex_lock(&m->mu);
            stop = m->stop;
            pthread_mutex_unlock(&m->mu);
            if (stop)
                return NULL;
        }
        if (rc < 0)
            rc_log(LOG_ERROR, "model %s: %s", m->name, rc_errmsg());
        /* idle: sleep until a submit, a cancel or the end */
        pthread_mutex_lock(&m->mu);
        while (!m->work && !m->stop)
            pthread_cond_wait(&m->cv, &m->mu);
        pthread_mutex_unlock(&m->mu);
    }
    return NULL;
}

/* What the template says: the tool-call format and the shape of past
 * tool-call turns it wants, whether the model thinks, and the control
 * tokens among the markers of both. */
static void template_facts(api_model *m)
{
    const char *src = m->lm.template_src;
    m->tool_format = tool_format_detect(src);
    m->tool_marker = m->tool_format == TOOLS_MISTRAL ? tok_find_token(m->lm.tok, "[TOOL_CALLS]")
                                                     : -1;
    m->tool_turns = m->tool_format != TOOLS_NONE ? tool_turns_probe(src) : 0;
    m->thinks = reasoning_template_thinks(src);
    m->think_switches = m->thinks ? reasoning_template_switches(src) : 0;
    m->n_think_tokens = m->n_text_tokens = 0;
    static const char *const think_tags[] = { REASONING_OPEN_TAG, REASONING_CLOSE_TAG, NULL };
    const char *const *lists[2] = { m->thinks ? think_tags : NULL,
                                    tool_format_markers(m->tool_format) };
    for (int k = 0; k < 2; k++) {
        for (const char *const *t = lists[k]; t && *t && m->n_text_tokens < 8; t++) {
            int32_t id = tok_find_token(m->lm.tok, *t);
            if (id >= 0 && tok_is_control(m->lm.tok, id))
                m->text_tokens[m->n_text_tokens++] = id;
        }
        if (k == 0)
            m->n_think_tokens = m->n_text_tokens;
    }
}

static int load_model(api_registry *r, api_model *m)
{
    int rc;
    const char *path = m->path;
    if (m->remote) {
        /* the head of the file only: tokenizer, template, sizes */
        if ((rc = weights_ensure(r->cfg.weights, m->name, 0, 0, NULL, NULL, NULL, NULL, m->local_path,
                                 sizeof m->local_path)))
            return rc;
        path = m->local_path;
    }
    /* First without weights: the tokenizer and the sizes decide where it
     * runs; only a model that runs here maps its weights. */
    if ((rc = lm_open(&m->lm, path, false, r->template_override)))
        return rc;
    model_hparams hp;
    if ((rc = model_read_hparams(m->lm.file, &hp)))
        return rc_wrap(rc, "%s: ", path);
    template_facts(m);
    m->ep = r->cfg.engine;
    if (hp.n_ctx_train > 0 && m->ep.n_ctx > hp.n_ctx_train)
        m->ep.n_ctx = hp.n_ctx_train;
    if (m->ep.n_batch > m->ep.n_ctx)
        m->ep.n_batch = m->ep.n_ctx;
    if ((rc = placed_engine(&r->cfg, m, &m->eng, &m->plan)))
        return rc;
    if (!m->eng) {
        lm_close(&m->lm);
        /* it runs here alone: a model from another node is copied whole */
        if (m->remote &&
            (rc = weights_ensure(r->cfg.weights, m->name, 0, -1, NULL, NULL, NULL, NULL, m->local_path,
                                 sizeof m->local_path)))
            return rc;
        if ((rc = lm_open(&m->lm, path, true, r->template_override)))
            return rc;
        template_facts(m);
        lm_prefault(&m->lm, NULL, NULL);
        if ((rc = engine_new(m->lm.m, m->lm.tok, &m->ep, &m->eng)))
            return rc;
    }
    m->stop = m->work = false;
    if (pthread_create(&m->thread, NULL, engine_thread, m))
        return rc_fail(RC_ENOMEM, "cannot start the engine thread of %s", m->name);
    m->thread_started = true;
    return 0;
}

static void *loader_thread(void *arg)
{
    api_model *m = arg;
    api_registry *r = m->reg;
    uint64_t t0 = os_now_ns();
    rc_log(LOG_INFO, "loading model %s from %s", m->name, m->path);
    int rc = load_model(r, m);
    char msg[512] = "";
    if (rc) {
        /* until it is placed again, the errors name the node it lost */
        if (m->lost && m->lost_why[0])
            snprintf(msg, sizeof msg, "%s; and it cannot be placed again: %s", m->lost_why,
                     rc_errmsg());
        else
            snprintf(msg, sizeof msg, "%s", rc_errmsg());
        rc_log(LOG_ERROR, "model %s failed to load: %s", m->name, msg);
        unload(m);
    } else {
        rc_log(LOG_INFO, "model %s ready in %.1f s (%d sequences of %d tokens)", m->name,
               (double)(os_now_ns() - t0) * 1e-9, m->ep.n_seq, m->ep.n_ctx);
    }
    pthread_mutex_lock(&r->mu);
    m->state = rc ? MODEL_FAILED : MODEL_READY;
    m->replacing = false;
    if (!rc)
        m->lost = false;
    snprintf(m->error, sizeof m->error, "%s", msg);
    m->load_s = (double)(os_now_ns() - t0) * 1e-9;
    m->t_loaded_ns = m->t_used_ns = os_now_ns();
    pthread_mutex_unlock(&r->mu);
    if (r->on_change)
        r->on_change(r->arg);
    return NULL;
}

/* A pipeline that lost a node is placed again on the nodes left: the
 * engine thread stops, the engine (and what still waits in it) ends, and
 * the loader starts over. */
static void *replace_thread(void *arg)
{
    api_model *m = arg;
    rc_log(LOG_WARN, "model %s: its pipeline lost a node; placing it again", m->name);
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    m->thread_started = false;
    unload(m);
    return loader_thread(m);
}

/* A model placed across nodes whose engine broke for good (registry mutex
 * held): from now on a node that comes up is news (registry_retry_lost),
 * and the errors until it is placed again name the fault. */
static void mark_lost(api_model *m, uint64_t came_up)
{
    if (m->lost || !m->plan)
        return;
    m->lost = true;
    m->lost_came_up = came_up;
    engine_fault(m->eng, m->lost_why, sizeof m->lost_why);
}

int registry_load(api_registry *r, api_model *m)
{
    pthread_mutex_lock(&r->mu);
    if (m->state == MODEL_READY && m->eng && engine_broken(m->eng) && !m->replacing) {
        if (r->cfg.cluster)
            mark_lost(m, cluster_came_up(r->cfg.cluster));
        if (m->loader_started) {
            pthread_join(m->loader, NULL);
            m->loader_started = false;
        }
        m->state = MODEL_LOADING;
        m->replacing = true;
        if (pthread_create(&m->loader, NULL, replace_thread, m) == 0) {
            m->loader_started = true;
        } else {
            m->state = MODEL_FAILED;
            snprintf(m->error, sizeof m->error, "cannot start a loader thread");
        }
    }
    if (m->state == MODEL_AVAILABLE || m->state == MODEL_FAILED) {
        if (m->loader_started) {           /* a finished earlier attempt */
            pthread_join(m->loader, NULL);
            m->loader_started = false;
        }
        m->state = MODEL_LOADING;
        if (pthread_create(&m->loader, NULL, loader_thread, m) == 0) {
            m->loader_started = true;
        } else {
            m->state = MODEL_FAILED;
            snprintf(m->error, sizeof m->error, "cannot start a loader thread");
        }
    }
    int state = m->state;
    pthread_mutex_unlock(&r->mu);
    return state;
}

/* A node that comes up is first a link; its memory and models follow in
 * its state a moment later, so a placement is tried for a while. */
#define RETRY_WINDOW_NS (15ull * 1000000000ull)
#define RETRY_EVERY_NS (1000ull * 1000000ull)

void registry_retry_lost(api_registry *r)
{
    if (!r->cfg.cluster)
        return;
    uint64_t ups = cluster_came_up(r->cfg.cluster), now = os_now_ns();
    /* a bounded batch per tick: an instance taken now waits RETRY_EVERY_NS
     * before its next attempt, so the next tick (0.1 s) skips it and its
     * batch reaches the instances after it */
    api_model *todo[64];
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_models && n < (int)(sizeof todo / sizeof *todo); i++) {
        api_model *m = r->models[i];
        bool broken = m->state == MODEL_READY && m->eng && engine_broken(m->eng);
        if (broken)
            mark_lost(m, ups);
        if (!m->lost || !(broken || m->state == MODEL_FAILED))
            continue;
        if (m->lost_came_up != ups) {
            m->lost_came_up = ups;
            m->retry_until_ns = now + RETRY_WINDOW_NS;
            m->retry_next_ns = now;
        }
        if (now < m->retry_until_ns && now >= m->retry_next_ns) {
            m->retry_next_ns = now + RETRY_EVERY_NS;
            todo[n++] = m;
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) {
        rc_log(LOG_INFO, "model %s: a node came up; placing the lost instance again", todo[i]->name);
        registry_load(r, todo[i]);
    }
}

void registry_load_initial(api_registry *r)
{
    int n = 0;
    api_model **list = registry_list(r, &n);
    for (int i = 0; i < n; i++)
        if (list[i]->preload)
            registry_load(r, list[i]);
    rc_free(list);
}

int registry_state(api_registry *r, api_model *m, char *error, size_t cap)
{
    pthread_mutex_lock(&r->mu);
    int s = m->state;
    if (error && cap)
        snprintf(error, cap, "%s", s == MODEL_FAILED ? m->error : "");
    pthread_mutex_unlock(&r->mu);
    return s;
}

bool registry_any_loading(api_registry *r)
{
    bool any = false;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_models; i++)
        any |= r->models[i]->state == MODEL_LOADING;
    pthread_mutex_unlock(&r->mu);
    return any;
}

void registry_free(api_registry *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_models; i++) {
        api_model *m = r->models[i];
        if (m->loader_started)
            pthread_join(m->loader, NULL);
        if (m->thread_started) {
            pthread_mutex_lock(&m->mu);
            m->stop = true;
            pthread_cond_signal(&m->cv);
            pthread_mutex_unlock(&m->mu);
            pthread_join(m->thread, NULL);
        }
        unload(m);
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->cv);
        rc_free(m->name);
        rc_free(m->path);
        rc_free(m);
    }
    rc_free(r->models);
    rc_free(r->models_dir);
    rc_free(r->ro_dirs);
    rc_free(r->template_override);
    pthread_mutex_destroy(&r->mu);
    rc_free(r);
}

/* ---- look-ups ---- */

api_model *registry_find(api_registry *r, const char *name)
{
    size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ":latest"))
        len -= 7;
    for (int pass = 0; pass < 2; pass++) {
        pthread_mutex_lock(&r->mu);
        api_model *m = find_locked(r, name, len);
        if (m && m->deleted)
            m = NULL;
        pthread_mutex_unlock(&r->mu);
        if (m || pass)
            return m;
        registry_rescan(r);                /* the folders, and the cluster's models */
    }
    return NULL;
}

const registry_config *registry_get_config(const api_registry *r) { return &r->cfg; }

api_model **registry_list(api_registry *r, int *n)
{
    pthread_mutex_lock(&r->mu);
    api_model **list = rc_calloc((size_t)(r->n_models ? r->n_models : 1), sizeof *list);
    *n = 0;
    for (int i = 0; list && i < r->n_models; i++)
        if (!r->models[i]->deleted)
            list[(*n)++] = r->models[i];
    pthread_mutex_unlock(&r->mu);
    return list;
}

/* ---- engine and prompts ---- */

void registry_wake(api_model *m)
{
    if (m->eng)
        engine_wake(m->eng);
    pthread_mutex_lock(&m->mu);
    m->work = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

int registry_unload(api_registry *r, api_model *m)
{
    pthread_mutex_lock(&r->mu);
    if (m->state != MODEL_READY || !m->eng) {
        pthread_mutex_unlock(&r->mu);
        return rc_fail(RC_ESTATE, "model %s is not loaded", m->name);
    }
    engine_stats st;
    engine_get_stats(m->eng, &st);
    if (st.n_active || st.n_queued) {
        pthread_mutex_unlock(&r->mu);
        return rc_fail(RC_ESTATE, "model %s is busy: %d requests running, %d waiting", m->name,
                       st.n_active, st.n_queued);
    }
    m->state = MODEL_AVAILABLE;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (m->thread_started)
        pthread_join(m->thread, NULL);
    m->thread_started = false;
    unload(m);
    rc_log(LOG_INFO, "model %s stopped", m->name);
    if (r->on_change)
        r->on_change(r->arg);
    return 0;
}

/* Deletes a model's file, or every part of a split set (the first part
 * last, so a set cut short by a failure is still found by its name). */
static int unlink_model(const char *path)
{
    size_t stem;
    uint32_t no, count;
    char p[4096];
    if (!gguf_split_name(path, &stem, &no, &count) || no != 0)
        return unlink(path) == 0 ? 0 : rc_fail(RC_EIO, "%s: %s", path, strerror(errno));
    for (uint32_t i = count; i-- > 0;) {
        if (gguf_split_path(path, i, count, p, sizeof p))
            return rc_fail(RC_EIO, "%s: cannot name part %u", path, i + 1);
        if (unlink(p) != 0 && (errno != ENOENT || i == 0))
            return rc_fail(RC_EIO, "%s: %s", p, strerror(errno));
    }
    return 0;
}

int registry_delete(api_registry *r, api_model *m)
{
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    const char *base = strrchr(m->path, '/');
    size_t dir_len = base ? (size_t)(base - m->path) : 0;
    if (m->deleted)
        rc = rc_fail(RC_ENOTFOUND, "model '%s' not found", m->name);
    else if (m->remote)
        rc = rc_fail(RC_ENOTFOUND, "model '%s' is not on this node (%s): delete it on the "
                     "node that has it", m->name, m->path);
    else if (m->read_only)
        rc = rc_fail(RC_ESTATE, "model '%s' is in a read-only folder (%s): racimo never "
                     "writes there", m->name, m->path);
    else if (!r->models_dir || strlen(r->models_dir) != dir_len ||
             strncmp(m->path, r->models_dir, dir_len))
        rc = rc_fail(RC_ESTATE, "model '%s' is not in the models folder (%s): racimo deletes "
                     "only what is there", m->name, m->path);
    else if (m->state == MODEL_LOADING || m->state == MODEL_READY)
        rc = rc_fail(RC_ESTATE, "model '%s' is %s: stop it first (POST /v1/instances/stop, "
                     "racimo instances stop)", m->name,
                     m->state == MODEL_READY ? "loaded" : "loading");
    else if ((rc = unlink_model(m->path)) == 0)
        m->deleted = true;
    pthread_mutex_unlock(&r->mu);
    if (!rc) {
        rc_log(LOG_INFO, "model %s deleted (%s)", m->name, m->path);
        if (r->on_change)
            r->on_change(r->arg);
    }
    return rc;
}

void registry_unload_idle(api_registry *r, int idle_s)
{
    if (idle_s <= 0)
        return;
    uint64_t now = os_now_ns(), idle = (uint64_t)idle_s * 1000000000ull;
    int n = 0;
    api_model **list = registry_list(r, &n);
    for (int i = 0; list && i < n; i++) {
        api_model *m = list[i];
        pthread_mutex_lock(&r->mu);
        bool cand = m->state == MODEL_READY && now - m->t_used_ns >= idle;
        pthread_mutex_unlock(&r->mu);
        if (cand && registry_unload(r, m) == 0)
            rc_log(LOG_INFO, "model %s was idle for %d s", m->name, idle_s);
    }
    rc_free(list);
}

int registry_submit(api_model *m, gen_request *g)
{
    m->t_used_ns = os_now_ns();
    int rc = engine_submit(m->eng, g);
    if (rc == 0)
        registry_wake(m);
    return rc;
}

/* The engine counts positions in int; a prompt past that is refused. */
static int checked_count(int rc, int32_t **ids, size_t n_ids, int *n)
{
    if (rc)
        return rc;
    if (n_ids > (size_t)INT32_MAX / 2) {
        rc_free(*ids);
        *ids = NULL;
        return rc_fail(RC_ELIMIT, "the prompt is too long");
    }
    *n = (int)n_ids;
    return 0;
}

int registry_chat_prompt(const api_model *m, const json_t *messages, const json_t *tools,
                         const json_t *vars, int32_t **ids, int *n, char **text)
{
    char *t = NULL;
    size_t n_ids = 0;
    json_t *adapted;
    if (tool_turns_adapt(messages, m->tool_turns, &adapted))
        return rc_fail(RC_ENOMEM, "out of memory adapting tool-call turns");
    int rc = lm_render(&m->lm, adapted ? adapted : messages, tools, true, vars, &t);
    json_decref(adapted);
    if (rc)
        return rc_wrap(rc, "chat template: ");
    rc = lm_tokenize(&m->lm, t, true, ids, &n_ids);
    rc = checked_count(rc, ids, n_ids, n);
    if (rc == 0 && text)
        *text = t;
    else
        rc_free(t);
    return rc;
}

int registry_text_prompt(const api_model *m, const char *text, bool special, int32_t **ids,
                         int *n)
{
    size_t n_ids = 0;
    int rc = lm_tokenize(&m->lm, text, special, ids, &n_ids);
    return checked_count(rc, ids, n_ids, n);
}
