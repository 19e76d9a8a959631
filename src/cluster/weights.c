/* weights.c - weight transfer between nodes (weights.h).
 *
 * Every message starts with a u32 request id chosen by the requester; a
 * reply carries the id of its request and an i32 status (0, or a negative
 * RC_E* code followed by a message).  The requester keeps at most
 * WEIGHTS_WINDOW requests in flight per holder in `slots`; the cluster
 * thread fills a slot when its reply arrives and wakes the requester,
 * which checks digests and writes the file.
 *
 * A pull reads from up to MAX_SOURCES holders at once: the first holder
 * gives the info and the block digests (checked against the root), every
 * other node up that lists the model and whose INFO carries the same root
 * becomes a source too, also one that finished its own copy during the
 * pull (the holders are looked for again every second).  The blocks to
 * fetch are cut into pieces of PIECE_BLOCKS; each source works through one
 * piece at a time, WEIGHTS_WINDOW reads in flight, and takes the next
 * piece when done.  A source whose reply fails or does not match its
 * digest is left out of the pull and what it owed goes to the others.
 *
 * The serving side keeps no state per request: each one reads through the
 * source the listing opened (exports.h; a split set is served as its
 * joined file).
 *
 * Divisions: names and paths; pins and local digests; serving; requests
 * and replies; several holders at once; the pull.
 */
#include "weights.h"
#include "cluster.h"
#include "exports.h"

#include "base/err.h"
#include "base/le.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/ranges.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    W_INFO_REQ = 0x50, W_INFO = 0x51,     /* sizes and root digest */
    W_READ_REQ = 0x52, W_DATA = 0x53,     /* the bytes of a block */
    W_DIGESTS_REQ = 0x54, W_DIGESTS = 0x55,       /* block digests */
};
#define NODE_HEX   33
#define MAX_PINS   256
#define MAX_TRIED  32                     /* holders one pull tries */
#define MAX_SOURCES 4                     /* holders one pull reads from at once */
#define W_SLOTS (WEIGHTS_WINDOW * MAX_SOURCES + 1)  /* + 1: a new source's INFO */
#define PIECE_BLOCKS 64                   /* 16 MiB: what one source is given at a time */
#define REFRESH_NS 1000000000ull          /* how often a pull looks for new holders */

typedef unsigned long long ull;

typedef struct {
    bool used, done;
    uint32_t id;
    int reply_type;
    char node[NODE_HEX];
    uint8_t *reply;          /* copy of the reply message */
    size_t len;
    char err[160];           /* set when the node went down */
} slot;

/* A request to serve, queued by the cluster thread for the serving thread
 * (reading and hashing must not stall heartbeats). */
typedef struct job {
    struct job *next;
    char from[NODE_HEX];
    int type;
    size_t len;
    uint8_t data[];
} job;
#define MAX_JOBS 256

typedef struct {
    char name[WEIGHTS_NAME_MAX + 1];
    uint8_t root[DIGEST_BYTES];
    char from[160];          /* "the user", "node 1234abcd (name), ..." */
} pin;

/* The serving side's digests of the last file it was asked about (a pull
 * asks for one file many times in a row). */
typedef struct {
    bool valid;
    export_stat st;
    uint64_t head;           /* bytes before the data section */
    digests d;
} served_digests;

struct weights {
    struct cluster *c;
    char *models_dir, *ro_dirs;
    char cache_dir[PATH_MAX];
    pthread_mutex_t jobs_mu;
    pthread_cond_t jobs_cv;
    job *jobs_head, *jobs_tail;
    int n_jobs;
    bool stopping, server_started;
    pthread_t server;
    served_digests served;   /* the serving thread's */
    pthread_mutex_t mu;      /* slots, next_id, hooks, pins */
    pthread_cond_t cv;
    slot slots[W_SLOTS];
    uint32_t next_id;
    pin pins[MAX_PINS];
    int n_pins;
    pthread_mutex_t ensure_mu;   /* one pull at a time */
    uint64_t tamper_nth, n_received;
    uint64_t served_bytes;       /* block bytes sent to peers (mu) */
    int mute;
    bool alter;
    int timeout_ms;
};

/* ---- names and paths ---- */

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Calls fn(dir) for the models folder and each read-only folder until it
 * returns nonzero; returns that. */
static int each_dir(const weights *w, int (*fn)(void *ctx, const char *dir), void *ctx)
{
    int rc = fn(ctx, w->models_dir);
    const char *p = w->ro_dirs ? w->ro_dirs : "";
    while (!rc && *p) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        if (n && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = 0;
            rc = fn(ctx, dir);
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return rc;
}

typedef struct {
    const char *name;
    char *out;
    size_t cap;
    int rc;
} find_ctx;

/* A complete NAME.gguf (no manifest), or a split set NAME-00001-of-...,
 * in `dir`; a symlink the owner put there counts (this is the node's own
 * use, not a peer's request). */
static int find_in_dir(void *ctx, const char *dir)
{
    find_ctx *f = ctx;
    char cand[PATH_MAX], man[PATH_MAX + 16];
    if ((size_t)snprintf(cand, sizeof cand, "%s/%s.gguf", dir, f->name) >= sizeof cand ||
        ((!is_file(cand) || model_ranges_path(cand, man, sizeof man) || access(man, F_OK) == 0) &&
         !gguf_split_find(dir, f->name, cand, sizeof cand)))
        return 0;
    if ((size_t)snprintf(f->out, f->cap, "%s", cand) >= f->cap) {
        f->rc = rc_fail(RC_ELIMIT, "%s: path too long", cand);
        return 1;
    }
    f->rc = 0;
    return 1;
}

/* The path of a complete local copy of `name`, in the models folder or a
 * read-only one.  RC_ENOTFOUND, RC_EINVAL (a name that is not plain). */
static int local_model(const weights *w, const char *name, char *out, size_t cap)
{
    int rc = exports_check_name(name);
    if (rc)
        return rc;
    find_ctx f = { name, out, cap, 0 };
    if (!each_dir(w, find_in_dir, &f))
        return rc_fail(RC_ENOTFOUND, "model '%s' is not in this node's models folders", name);
    return f.rc;
}

/* A peer's name for a log line: printable ASCII only. */
static void clean_name(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    for (; in && k + 1 < cap && *in; in++)     /* the bound first: `in` may not end in 0 */
        out[k++] = (*in >= 0x20 && *in < 0x7f) ? *in : '?';
    out[k] = 0;
}

/* "1234abcd (name)" for node `id` from the cluster view. */
static void node_label(weights *w, const char *id, char *out, size_t cap)
{
    json_t *snap = cluster_snapshot(w->c), *n;
    size_t i;
    char name[64] = "?";
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *nid = json_string_value(json_object_get(n, "id"));
        if (nid && !strcmp(nid, id))
            clean_name(json_string_value(json_object_get(n, "name")), name, sizeof name);
    }
    json_decref(snap);
    snprintf(out, cap, "%.8s (%s)", id, name);
}

/* ---- pins and local digests ---- */

static pin *find_pin(weights *w, const char *name)
{
    for (int i = 0; i < w->n_pins; i++)
        if (!strcmp(w->pins[i].name, name))
            return &w->pins[i];
    return NULL;
}

static int set_pin(weights *w, const char *name, const uint8_t root[DIGEST_BYTES],
                   const char *from, bool replace)
{
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    pin *p = find_pin(w, name);
    if (!p && w->n_pins < MAX_PINS)
        p = &w->pins[w->n_pins++];
    if (!p) {
        rc = rc_fail(RC_ELIMIT, "more than %d pinned model digests", MAX_PINS);
    } else if (replace || !p->name[0]) {
        snprintf(p->name, sizeof p->name, "%s", name);
        memcpy(p->root, root, DIGEST_BYTES);
        snprintf(p->from, sizeof p->from, "%s", from);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static bool get_pin(weights *w, const char *name, uint8_t root[DIGEST_BYTES], char *from,
                    size_t cap)
{
    pthread_mutex_lock(&w->mu);
    pin *p = find_pin(w, name);
    if (p) {
        memcpy(root, p->root, DIGEST_BYTES);
        snprintf(from, cap, "%s", p->from);
    }
    pthread_mutex_unlock(&w->mu);
    return p != NULL;
}

int weights_pin(weights *w, const char *name, const uint8_t root[DIGEST_BYTES])
{
    int rc = exports_check_name(name);
    return rc ? rc : set_pin(w, name, root, "the user", true);
}

/* The digests of local file `path` (a split set by its first part: of
 * the file it is served as), from the cache or computed. */
static int local_digests(weights *w, const char *path, digests *d)
{
    export_src *src;
    int rc = export_src_open(path, &src);
    if (rc)
        return rc;
    export_stat es = export_src_stat(src);
    rc = digests_of_file(w->cache_dir, path, src, &es, d);
    export_src_unref(src);
    return rc;
}

int weights_model_root(weights *w, const char *name, uint8_t root[DIGEST_BYTES])
{
    char path[PATH_MAX], from[160];
    int rc = local_model(w, name, path, sizeof path);
    if (rc == RC_ENOTFOUND && get_pin(w, name, root, from, sizeof from))
        return 0;
    if (rc == RC_ENOTFOUND)
        return rc_fail(RC_ENOTFOUND, "this node neither holds model '%s' whole nor knows its "
                       "content digest", name);
    digests d;
    if (rc || (rc = local_digests(w, path, &d)))
        return rc;
    memcpy(root, d.root, DIGEST_BYTES);
    digests_free(&d);
    return 0;
}

/* ---- serving (the serving thread) ---- */

static void reply_error(weights *w, const char *to, int type, uint32_t id, int code)
{
    const char *msg = rc_errmsg();
    size_t n = strlen(msg);
    if (n > 1000)
        n = 1000;
    uint8_t buf[10 + 1000];
    le_put32(buf, id);
    le_put32(buf + 4, (uint32_t)code);
    buf[8] = (uint8_t)n;
    buf[9] = (uint8_t)(n >> 8);
    memcpy(buf + 10, msg, n);
    if (cluster_send(w->c, to, type, buf, 10 + n))
        rc_log(LOG_WARN, "weights: cannot answer node %.8s: %s", to, rc_errmsg());
}

/* Request layout: u32 id | u8 name length | name | type-specific fields. */
static int parse_request(const uint8_t *d, size_t len, size_t fields, uint32_t *id,
                         char name[WEIGHTS_NAME_MAX + 1], const uint8_t **rest)
{
    if (len < 5)
        return rc_fail(RC_EFORMAT, "weight request of %zu bytes is too short", len);
    *id = le_get32(d);
    size_t n = d[4];
    if (n == 0 || n > WEIGHTS_NAME_MAX || len != 5 + n + fields)
        return rc_fail(RC_EFORMAT, "weight request: bad name length %zu or size %zu", n, len);
    if (memchr(d + 5, 0, n))
        return rc_fail(RC_EINVAL, "weight request: model name contains a NUL byte");
    memcpy(name, d + 5, n);
    name[n] = 0;
    *rest = d + 5 + n;
    return exports_check_name(name);
}

/* The listed source of `name` (a reference the caller drops). */
static int open_served(weights *w, const char *name, export_src **src, export_stat *st,
                       char *path, size_t cap)
{
    exports *e = cluster_exports(w->c);
    if (!e)
        return rc_fail(RC_ENOTFOUND, "this node lists no models");
    return exports_open(e, name, src, st, path, cap);
}

/* The digests of the served file of `name`, kept for the next request. */
static int served_digests_of(weights *w, const char *name, const digests **d)
{
    char path[PATH_MAX];
    export_stat st;
    export_src *src;
    int rc = open_served(w, name, &src, &st, path, sizeof path);
    if (rc)
        return rc;
    served_digests *s = &w->served;
    if (!s->valid || memcmp(&s->st, &st, sizeof st)) {
        digests_free(&s->d);
        s->valid = false;
        if ((rc = export_src_head(src, path, &s->head)) ||
            (rc = digests_of_file(w->cache_dir, path, src, &st, &s->d))) {
            export_src_unref(src);
            return rc_wrap(rc, "model '%s': ", name);
        }
        s->st = st;
        s->valid = true;
    }
    export_src_unref(src);
    *d = &s->d;
    return 0;
}

static int serve_info(weights *w, const char *from, uint32_t id, const char *name)
{
    const digests *d;
    int rc = served_digests_of(w, name, &d);
    if (rc)
        return rc;
    uint8_t buf[8 + 8 + 8 + 4 + DIGEST_BYTES];
    le_put32(buf, id);
    le_put32(buf + 4, 0);
    le_put64(buf + 8, d->size);
    le_put64(buf + 16, w->served.head);
    le_put32(buf + 24, DIGEST_BLOCK);
    memcpy(buf + 28, d->root, DIGEST_BYTES);
    return cluster_send(w->c, from, W_INFO, buf, sizeof buf);
}

static int serve_read(weights *w, const char *from, uint32_t id, const char *name,
                      const uint8_t *rest)
{
    uint64_t off = le_get64(rest);
    uint32_t len = le_get32(rest + 8);
    export_stat st;
    export_src *src;
    int rc;
    if (len == 0 || len > WEIGHTS_CHUNK)
        return rc_fail(RC_EINVAL, "read of %u bytes (1 to %u)", len, WEIGHTS_CHUNK);
    if ((rc = open_served(w, name, &src, &st, NULL, 0)))
        return rc;
    if (off > st.size || len > st.size - off) {
        export_src_unref(src);
        return rc_fail(RC_ERANGE, "bytes [%llu, %llu) lie outside model '%s' (%llu bytes)",
                       (ull)off, (ull)off + len, name, (ull)st.size);
    }
    const size_t hdr = 4 + 4 + 8 + 4;
    uint8_t *buf = rc_malloc(hdr + len);
    if (!buf) {
        export_src_unref(src);
        return rc_fail(RC_ENOMEM, "out of memory for a block");
    }
    if (export_src_pread(src, buf + hdr, len, off)) {
        rc = rc_fail(RC_EIO, "model '%s': read error at byte %llu", name, (ull)off);
    } else {
        le_put32(buf, id);
        le_put32(buf + 4, 0);
        le_put64(buf + 8, off);
        le_put32(buf + 16, len);
        pthread_mutex_lock(&w->mu);
        bool alter = w->alter;
        pthread_mutex_unlock(&w->mu);
        if (alter)                       /* tests only: a member serving poisoned bytes */
            buf[hdr + len / 2] ^= 0x01;
        rc = cluster_send(w->c, from, W_DATA, buf, hdr + len);
        pthread_mutex_lock(&w->mu);
        w->served_bytes += rc ? 0 : len;
        pthread_mutex_unlock(&w->mu);
    }
    rc_free(buf);
    export_src_unref(src);
    return rc;
}

static int serve_digests(weights *w, const char *from, uint32_t id, const char *name,
                         const uint8_t *rest)
{
    uint32_t first = le_get32(rest), count = le_get32(rest + 4);
    const digests *d;
    int rc = served_digests_of(w, name, &d);
    if (rc)
        return rc;
    if (count == 0 || count > WEIGHTS_PAGE || first > d->n || count > d->n - first)
        return rc_fail(RC_ERANGE, "block digests [%u, %llu) of model '%s' (%u blocks; at most "
                       "%d a message)", first, (ull)first + count, name, d->n, WEIGHTS_PAGE);
    size_t n = 16 + (size_t)count * DIGEST_BYTES;
    uint8_t *buf = rc_malloc(n);
    if (!buf)
        return rc_fail(RC_ENOMEM, "out of memory for block digests");
    le_put32(buf, id);
    le_put32(buf + 4, 0);
    le_put32(buf + 8, first);
    le_put32(buf + 12, count);
    memcpy(buf + 16, d->d[first], (size_t)count * DIGEST_BYTES);
    rc = cluster_send(w->c, from, W_DIGESTS, buf, n);
    rc_free(buf);
    return rc;
}

static void serve(weights *w, const char *from, int type, const uint8_t *data, size_t len)
{
    static const size_t fields[] = { [0] = 0, [1] = 8 + 4, [2] = 4 + 4 };
    const int k = (type - W_INFO_REQ) / 2;
    char name[WEIGHTS_NAME_MAX + 1];
    const uint8_t *rest = NULL;
    uint32_t id = len >= 4 ? le_get32(data) : 0;
    int rc = parse_request(data, len, fields[k], &id, name, &rest);
    if (!rc)
        rc = type == W_INFO_REQ ? serve_info(w, from, id, name)
           : type == W_READ_REQ ? serve_read(w, from, id, name, rest)
           : serve_digests(w, from, id, name, rest);
    if (rc == RC_ESTATE) {
        char who[96];
        node_label(w, from, who, sizeof who);
        rc_log(LOG_WARN, "weights: refused node %s model '%s': it is not exported by this "
               "node (racimo serve --export)", who, name);
    } else if (rc && rc != RC_ENOTFOUND) {
        rc_log(LOG_WARN, "weights: request from node %.8s: %s", from, rc_errmsg());
    }
    if (rc)
        reply_error(w, from, type + 1, id, rc);
}
/* ---- requests and replies ---- */

static void on_reply(weights *w, const char *from, int type, const uint8_t *data, size_t len)
{
    if (len < 8)
        return;
    uint32_t id = le_get32(data);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < W_SLOTS; i++) {
        slot *s = &w->slots[i];
        if (!s->used || s->done || s->id != id || s->reply_type != type || strcmp(s->node, from))
            continue;
        s->reply = rc_malloc(len);
        if (s->reply) {
            memcpy(s->reply, data, len);
            s->len = len;
            if (type == W_DATA && le_get32(data + 4) == 0 && len > 20 &&
                ++w->n_received == w->tamper_nth)
                s->reply[len - 1] ^= 0x5a;       /* the test hook: a damaged chunk */
        } else {
            snprintf(s->err, sizeof s->err, "out of memory for a reply from node %.8s", from);
        }
        s->done = true;
        pthread_cond_broadcast(&w->cv);
        break;
    }
    pthread_mutex_unlock(&w->mu);
}

static void *server_thread(void *arg)
{
    weights *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->jobs_mu);
        while (!w->jobs_head && !w->stopping)
            pthread_cond_wait(&w->jobs_cv, &w->jobs_mu);
        job *j = w->stopping ? NULL : w->jobs_head;
        if (j) {
            w->jobs_head = j->next;
            if (!w->jobs_head)
                w->jobs_tail = NULL;
            w->n_jobs--;
        }
        pthread_mutex_unlock(&w->jobs_mu);
        if (!j)
            return NULL;
        serve(w, j->from, j->type, j->data, j->len);
        rc_free(j);
    }
}

static void on_msg(void *ud, const char *from, int type, const uint8_t *data, size_t len)
{
    weights *w = ud;
    if (type == W_INFO_REQ || type == W_READ_REQ || type == W_DIGESTS_REQ) {
        pthread_mutex_lock(&w->mu);
        int mute = w->mute;
        pthread_mutex_unlock(&w->mu);
        if (mute || strlen(from) >= NODE_HEX)
            return;
        job *j = rc_malloc(sizeof *j + len);
        pthread_mutex_lock(&w->jobs_mu);
        bool take = j && !w->stopping && w->n_jobs < MAX_JOBS;
        if (take) {
            snprintf(j->from, sizeof j->from, "%s", from);
            j->type = type;
            j->len = len;
            memcpy(j->data, data, len);
            j->next = NULL;
            if (w->jobs_tail)
                w->jobs_tail->next = j;
            else
                w->jobs_head = j;
            w->jobs_tail = j;
            w->n_jobs++;
            pthread_cond_signal(&w->jobs_cv);
        }
        pthread_mutex_unlock(&w->jobs_mu);
        if (!take) {
            rc_free(j);
            /* the requester sees its request time out and can retry */
            rc_log(LOG_WARN, "weights: dropped a request from node %.8s (%s)", from,
                   j ? "too many waiting" : "out of memory");
        }
    } else if (type == W_INFO || type == W_DATA || type == W_DIGESTS) {
        on_reply(w, from, type, data, len);
    }
}

void weights_on_node_down(weights *w, const char *node_id)
{
    if (!w || !node_id)
        return;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < W_SLOTS; i++) {
        slot *s = &w->slots[i];
        if (s->used && !s->done && !strcmp(s->node, node_id)) {
            snprintf(s->err, sizeof s->err, "node %.8s went down", node_id);
            s->done = true;
        }
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void release(weights *w, int si)
{
    pthread_mutex_lock(&w->mu);
    rc_free(w->slots[si].reply);
    memset(&w->slots[si], 0, sizeof w->slots[si]);
    pthread_mutex_unlock(&w->mu);
}

/* Sends a request (msg[0..4) receives its id) and returns its slot. */
static int request(weights *w, const char *node, int type, uint8_t *msg, size_t len, int *si)
{
    pthread_mutex_lock(&w->mu);
    int k = -1;
    for (int i = 0; i < W_SLOTS && k < 0; i++)
        if (!w->slots[i].used)
            k = i;
    if (k < 0) {
        pthread_mutex_unlock(&w->mu);
        return rc_fail(RC_ELIMIT, "more than %d weight requests in flight", W_SLOTS);
    }
    slot *s = &w->slots[k];
    memset(s, 0, sizeof *s);
    s->used = true;
    s->id = ++w->next_id;
    s->reply_type = type + 1;
    snprintf(s->node, sizeof s->node, "%s", node);
    le_put32(msg, s->id);
    pthread_mutex_unlock(&w->mu);
    int rc = cluster_send(w->c, node, type, msg, len);
    if (rc) {
        release(w, k);
        return rc_wrap(RC_EIO, "asking node %.8s for weights: ", node);
    }
    *si = k;
    return 0;
}

/* Waits for slot si's reply, up to timeout_ms (0: the default); on
 * success *body points past id and status (valid until release). */
static int await_for(weights *w, int si, int timeout_ms, const uint8_t **body,
                     size_t *body_len)
{
    slot *s = &w->slots[si];
    struct timespec dl;
    if (timeout_ms <= 0)
        timeout_ms = w->timeout_ms;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    int e = 0;
    while (!s->done && e != ETIMEDOUT)
        e = pthread_cond_timedwait(&w->cv, &w->mu, &dl);
    bool done = s->done;
    pthread_mutex_unlock(&w->mu);
    if (!done)
        return rc_fail(RC_EIO, "node %.8s did not answer within %d ms", s->node, timeout_ms);
    if (!s->reply)
        return rc_fail(RC_EIO, "%s", s->err);
    int32_t status = (int32_t)le_get32(s->reply + 4);
    if (status != 0) {
        size_t n = s->len >= 10 ? (size_t)(s->reply[8] | s->reply[9] << 8) : 0;
        if (n > s->len - 10 || s->len < 10)
            n = 0;
        int code = status >= RC_ESTATE && status < 0 ? status : RC_EIO;
        char msg[1001];
        clean_name(n ? (const char *)s->reply + 10 : "", msg, n + 1 < sizeof msg ? n + 1 : sizeof msg);
        return rc_fail(code, "node %.8s: %s", s->node, msg);
    }
    *body = s->reply + 8;
    *body_len = s->len - 8;
    return 0;
}

static int await(weights *w, int si, const uint8_t **body, size_t *body_len)
{
    return await_for(w, si, 0, body, body_len);
}

/* ---- the pull ---- */

typedef struct {
    weights *w;
    const char *name;
    char node[NODE_HEX];         /* the holder in use */
    char who[96];                /* its id and name, for messages */
    int fd;
    const char *part, *dfile;    /* the copy and its block digests */
    model_ranges *ranges;
    digests dig;                 /* checked against root; dig.d NULL until then */
    uint8_t root[DIGEST_BYTES];
    bool have_root, root_tofu;   /* root_tofu: taken from the holder in use */
    char root_from[160];         /* who vouched for root */
    uint64_t listed_bytes;       /* the holder's listed size (for the first reply's wait) */
    weights_progress_fn progress;
    void *ud;
    uint64_t done, total, t0;
    bool holder_fault;           /* the last failure was the holder's: try another */
    const char *peer_id;         /* the caller's one holder, or NULL: any */
    struct source {
        char node[NODE_HEX];
        char who[96];
        uint64_t bytes;          /* verified bytes it sent */
        int inflight;
        bool bad;                /* left out (its root, its replies or its bytes) */
    } src[MAX_TRIED];
    int n_src;
    uint64_t refreshed_ns;
} pull;

static size_t req_header(uint8_t *msg, const char *name)
{
    size_t n = strlen(name);
    msg[4] = (uint8_t)n;
    memcpy(msg + 5, name, n);
    return 5 + n;
}

static int send_read(pull *p, const char *node, uint64_t off, uint32_t len, int *si)
{
    uint8_t msg[5 + WEIGHTS_NAME_MAX + 12];
    size_t k = req_header(msg, p->name);
    le_put64(msg + k, off);
    le_put32(msg + k + 8, len);
    return request(p->w, node, W_READ_REQ, msg, k + 12, si);
}

static uint32_t block_len(const digests *d, uint32_t b)
{
    uint64_t off = (uint64_t)b * DIGEST_BLOCK;
    return d->size - off < DIGEST_BLOCK ? (uint32_t)(d->size - off) : DIGEST_BLOCK;
}

/* A block's reply: it must answer the request and match its digest; then
 * it is written and counts as verified. */
static int take_block(pull *p, struct source *src, uint32_t b, const uint8_t *body, size_t n)
{
    uint64_t off = (uint64_t)b * DIGEST_BLOCK;
    uint32_t len = block_len(&p->dig, b);
    uint8_t h[DIGEST_BYTES];
    p->holder_fault = true;
    if (n != 12 + (size_t)len || le_get64(body) != off || le_get32(body + 8) != len)
        return rc_fail(RC_EFORMAT, "node %s: malformed reply for bytes [%llu, %llu) of model "
                       "'%s'", src->who, (ull)off, (ull)(off + len), p->name);
    digests_block(body + 12, len, h);
    if (sodium_memcmp(h, p->dig.d[b], DIGEST_BYTES))
        return rc_fail(RC_EFORMAT, "node %s sent bytes [%llu, %llu) of model '%s' that do not "
                       "match the model's content digest; nothing of them was kept", src->who,
                       (ull)off, (ull)(off + len), p->name);
    p->holder_fault = false;
    if (os_pwrite_full(p->fd, body + 12, len, off))
        return rc_fail(errno == ENOSPC || errno == EDQUOT ? RC_ELIMIT : RC_EIO,
                       "model '%s': cannot write bytes [%llu, %llu) of the copy: %s", p->name,
                       (ull)off, (ull)(off + len), strerror(errno));
    int rc = model_ranges_add(p->ranges, off, off + len);
    if (rc)
        return rc;
    p->done += len;
    src->bytes += len;
    if (p->progress) {
        double s = (double)(os_now_ns() - p->t0) * 1e-9;
        p->progress(p->ud, p->done, p->total, s > 0 ? (double)p->done / s : 0.0);
    }
    return 0;
}

/* ---- several holders at once ---- */

static int ask_info(pull *p, const char *node, const char *who, uint64_t *size, uint64_t *head,
                    uint8_t root[DIGEST_BYTES]);

/* The source for `node`, added (good) when the pull has none for it. */
static struct source *source_of(pull *p, const char *node)
{
    for (int i = 0; i < p->n_src; i++)
        if (!strcmp(p->src[i].node, node))
            return &p->src[i];
    if (p->n_src == MAX_TRIED)
        return NULL;
    struct source *src = &p->src[p->n_src++];
    memset(src, 0, sizeof *src);
    snprintf(src->node, sizeof src->node, "%s", node);
    node_label(p->w, node, src->who, sizeof src->who);
    return src;
}

/* Leaves source s out of this pull: the rest of its piece is to redo. */
static void leave_out(pull *p, int s, int code, const uint32_t *b, size_t *piece_at,
                      const size_t *piece_end, uint32_t *redo, size_t *n_redo, int *last_code,
                      char *last_err, size_t cap)
{
    struct source *src = &p->src[s];
    if (src->bad)
        return;
    src->bad = true;
    *last_code = code;
    while (piece_at[s] < piece_end[s])
        redo[(*n_redo)++] = b[piece_at[s]++];
    snprintf(last_err, cap, "%s", rc_errmsg());
    rc_log(LOG_WARN, "weights: %s; leaving node %s out of this pull", last_err, src->who);
}

/* Adds the nodes up that list the model (and are not sources yet) whose
 * INFO carries this pull's root and size, up to MAX_SOURCES good ones.  A
 * node with another root is logged and left out; one that does not answer
 * is tried again at the next look. */
static void add_sources(pull *p)
{
    int good = 0;
    for (int i = 0; i < p->n_src; i++)
        good += !p->src[i].bad;
    p->refreshed_ns = os_now_ns();
    if (p->peer_id || good >= MAX_SOURCES || p->n_src >= MAX_TRIED)
        return;
    json_t *snap = cluster_snapshot(p->w->c), *n, *m;
    size_t i, j;
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *id = json_string_value(json_object_get(n, "id"));
        const char *state = json_string_value(json_object_get(n, "state"));
        bool lists = false, known = false;
        if (!id || json_is_true(json_object_get(n, "self")) || !state || strcmp(state, "up"))
            continue;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            lists = lists || (mn && !strcmp(mn, p->name));
        }
        for (int k = 0; k < p->n_src && !known; k++)
            known = !strcmp(p->src[k].node, id);
        if (!lists || known || good >= MAX_SOURCES || p->n_src >= MAX_TRIED)
            continue;
        struct source *src = &p->src[p->n_src];
        uint64_t size, head;
        uint8_t root[DIGEST_BYTES];
        memset(src, 0, sizeof *src);
        snprintf(src->node, sizeof src->node, "%s", id);
        node_label(p->w, id, src->who, sizeof src->who);
        int rc = ask_info(p, id, src->who, &size, &head, root);
        if (rc == RC_EIO || rc == RC_ELIMIT || rc == RC_ESTATE)
            continue;                     /* busy, going, or private: maybe later */
        if (!rc && (size != p->dig.size || sodium_memcmp(root, p->root, DIGEST_BYTES)))
            rc = rc_fail(RC_EFORMAT, "node %s holds another version of model '%s' (not the "
                         "content digest of %s)", src->who, p->name, p->root_from);
        p->n_src++;
        if (rc) {
            src->bad = true;
            rc_log(LOG_WARN, "weights: %s; not reading from it", rc_errmsg());
        } else {
            good++;
        }
    }
    json_decref(snap);
}

/* Fetches blocks b[0..n): pieces of PIECE_BLOCKS handed to the sources,
 * WEIGHTS_WINDOW reads in flight each; a source that fails is left out
 * and its blocks go to the others.  Fails (holder_fault set) only when no
 * source is left. */
static int fetch_blocks(pull *p, const uint32_t *b, size_t n)
{
    typedef struct { int slot, src; uint32_t blk; } req;
    req q[W_SLOTS];
    size_t head = 0, count = 0, next = 0;          /* next: first block not yet handed out */
    size_t *piece_end = rc_calloc(MAX_TRIED, sizeof *piece_end);
    size_t *piece_at = rc_calloc(MAX_TRIED, sizeof *piece_at);
    uint32_t *redo = rc_mallocarray(n ? n : 1, sizeof *redo);
    size_t n_redo = 0;
    int rc = 0, last_code = RC_EIO;
    char last_err[512] = "";
    struct source *first = source_of(p, p->node);
    if (!piece_end || !piece_at || !redo || !first) {
        rc_free(piece_end);
        rc_free(piece_at);
        rc_free(redo);
        return rc_fail(RC_ENOMEM, "out of memory planning a pull");
    }
    for (;;) {
        if (os_now_ns() - p->refreshed_ns >= REFRESH_NS && (next < n || n_redo))
            add_sources(p);
        /* hand out reads: blocks to redo first, then each source's piece */
        bool sent = true;
        while (sent && count < W_SLOTS - 1) {
            sent = false;
            for (int s = 0; s < p->n_src && count < W_SLOTS - 1; s++) {
                struct source *src = &p->src[s];
                if (src->bad || src->inflight >= WEIGHTS_WINDOW)
                    continue;
                uint32_t blk;
                if (n_redo) {
                    blk = redo[--n_redo];
                } else {
                    if (piece_at[s] >= piece_end[s] && next < n) {
                        piece_at[s] = next;
                        next = n - next < PIECE_BLOCKS ? n : next + PIECE_BLOCKS;
                        piece_end[s] = next;
                    }
                    if (piece_at[s] >= piece_end[s])
                        continue;
                    blk = b[piece_at[s]++];
                }
                req *r = &q[(head + count) % W_SLOTS];
                *r = (req){ -1, s, blk };
                if (send_read(p, src->node, (uint64_t)blk * DIGEST_BLOCK,
                              block_len(&p->dig, blk), &r->slot)) {
                    redo[n_redo++] = blk;
                    leave_out(p, s, RC_EIO, b, piece_at, piece_end, redo, &n_redo, &last_code,
                              last_err, sizeof last_err);
                    continue;
                }
                src->inflight++;
                count++;
                sent = true;
            }
        }
        if (!count) {
            bool left = next < n || n_redo;
            for (int s = 0; s < p->n_src && !left; s++)
                left = piece_at[s] < piece_end[s];
            if (left) {                   /* every source left out: the last one's error */
                p->holder_fault = true;
                rc = last_err[0] ? rc_fail(last_code, "%s", last_err)
                                 : rc_fail(RC_EIO, "model '%s': no holder answered", p->name);
            }
            break;
        }
        req *r = &q[head];
        struct source *src = &p->src[r->src];
        head = (head + 1) % W_SLOTS;
        count--;
        src->inflight--;
        const uint8_t *body;
        size_t len;
        int e = src->bad ? RC_EIO : await(p->w, r->slot, &body, &len);
        if (!e && (e = take_block(p, src, r->blk, body, len)) && !p->holder_fault) {
            release(p->w, r->slot);       /* a local write failed: no holder can help */
            rc = e;
            break;
        }
        release(p->w, r->slot);
        if (e) {
            redo[n_redo++] = r->blk;
            leave_out(p, r->src, e, b, piece_at, piece_end, redo, &n_redo, &last_code,
                      last_err, sizeof last_err);
        }
    }
    while (count) {                       /* after a failure: drop what is in flight */
        release(p->w, q[head].slot);
        p->src[q[head].src].inflight--;
        head = (head + 1) % W_SLOTS;
        count--;
    }
    rc_free(piece_end);
    rc_free(piece_at);
    rc_free(redo);
    return rc;
}

/* The blocks wanted (bitmap) and not yet verified, in order. */
typedef struct {
    uint8_t *want;                /* a bit per block */
    const pull *p;
} block_set;

static void want_range(block_set *s, uint64_t start, uint64_t end)
{
    if (start >= end || end > s->p->dig.size)
        return;
    for (uint64_t b = start / DIGEST_BLOCK; b <= (end - 1) / DIGEST_BLOCK; b++)
        s->want[b / 8] |= (uint8_t)(1u << (b % 8));
}

static int want_shard_range(void *ud, uint64_t start, uint64_t end, const char *name)
{
    (void)name;
    want_range(ud, start, end);
    return 0;
}

/* Fetches the wanted blocks not yet verified, then clears the set. */
static int fetch_wanted(pull *p, block_set *s)
{
    uint32_t *list = NULL;
    size_t n = 0, cap = 0;
    uint64_t bytes = 0;
    int rc = 0;
    for (uint32_t b = 0; b < p->dig.n && !rc; b++) {
        uint64_t off = (uint64_t)b * DIGEST_BLOCK;
        if (!(s->want[b / 8] >> (b % 8) & 1) ||
            model_ranges_covers(p->ranges, off, off + block_len(&p->dig, b)))
            continue;
        if (n == cap) {
            size_t c = cap ? cap * 2 : 256;
            uint32_t *l = rc_realloc(list, c * sizeof *l);
            if (!l) {
                rc = rc_fail(RC_ENOMEM, "out of memory planning a pull");
                break;
            }
            list = l;
            cap = c;
        }
        list[n++] = b;
        bytes += block_len(&p->dig, b);
    }
    memset(s->want, 0, ((size_t)p->dig.n + 7) / 8);
    p->total = p->done + bytes;
    if (!rc && n)
        rc = fetch_blocks(p, list, n);
    rc_free(list);
    return rc;
}

static int pick_peer(weights *w, const char *name, const char *peer_id,
                     char tried[][NODE_HEX], int n_tried, char node[NODE_HEX], uint64_t *listed)
{
    json_t *snap = cluster_snapshot(w->c), *n;
    size_t i;
    bool found = false;
    if (!snap)
        return rc_fail(RC_ENOMEM, "out of memory reading the cluster view");
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *id = json_string_value(json_object_get(n, "id"));
        const char *state = json_string_value(json_object_get(n, "state"));
        bool skip = found || !id || json_is_true(json_object_get(n, "self")) || !state ||
                    strcmp(state, "up") || (peer_id && strcmp(peer_id, id));
        for (int t = 0; t < n_tried && !skip; t++)
            skip = !strcmp(tried[t], id);
        if (skip)
            continue;
        size_t j;
        json_t *m;
        *listed = 0;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            if (mn && !strcmp(mn, name))
                *listed = (uint64_t)json_integer_value(json_object_get(m, "size_bytes"));
        }
        /* a node named by the caller is asked even when it does not list
         * the model (it says why not) */
        if (*listed || peer_id) {
            snprintf(node, NODE_HEX, "%s", id);
            found = true;
        }
    }
    json_decref(snap);
    if (found)
        return 0;
    if (peer_id)
        return rc_fail(RC_ENOTFOUND, "node %.8s is not up", peer_id);
    if (n_tried)
        return rc_fail(RC_ENOTFOUND, "no other node up lists model '%s'", name);
    return rc_fail(RC_ENOTFOUND, "no node in the cluster lists model '%s' (and it is not in "
                   "this node's models folders; a node that holds it may keep it private with "
                   "--export)", name);
}

/* INFO from `node`: sizes and its root, bounded. */
static int ask_info(pull *p, const char *node, const char *who, uint64_t *size, uint64_t *head,
                    uint8_t root[DIGEST_BYTES])
{
    uint8_t msg[5 + WEIGHTS_NAME_MAX];
    size_t k = req_header(msg, p->name);
    const uint8_t *b;
    size_t n;
    int si, rc = request(p->w, node, W_INFO_REQ, msg, k, &si);
    if (rc)
        return rc;
    /* a holder asked for the first time hashes the file once (~1 GB/s) */
    uint64_t wait = (uint64_t)p->w->timeout_ms + p->listed_bytes / 1000000;
    if ((rc = await_for(p->w, si, wait > 4000000 ? 4000000 : (int)wait, &b, &n))) {
        release(p->w, si);
        return rc;
    }
    uint32_t block = n == 52 ? le_get32(b + 16) : 0;
    *size = n == 52 ? le_get64(b) : 0;
    *head = n == 52 ? le_get64(b + 8) : 0;
    if (n == 52)
        memcpy(root, b + 20, DIGEST_BYTES);
    release(p->w, si);
    if (n != 52 || *size == 0 || *size > DIGEST_FILE_MAX || *head == 0 || *head > *size ||
        *head > WEIGHTS_HEAD_MAX)
        return rc_fail(RC_EFORMAT, "node %s: malformed or out-of-bounds info for model '%s' "
                       "(%zu bytes; file %llu, head %llu)", who, p->name, n, (ull)*size,
                       (ull)*head);
    if (block != DIGEST_BLOCK)
        return rc_fail(RC_EFORMAT, "node %s digests model '%s' in blocks of %u bytes, this node "
                       "in blocks of %u", who, p->name, block, DIGEST_BLOCK);
    return 0;
}

/* INFO from the holder, checked against the root this pull trusts (or
 * pinned as it, the first time). */
static int remote_info(pull *p, uint64_t *size, uint64_t *head)
{
    uint8_t root[DIGEST_BYTES];
    p->holder_fault = true;
    int rc = ask_info(p, p->node, p->who, size, head, root);
    if (rc)
        return rc;
    char theirs[DIGEST_HEX], ours[DIGEST_HEX];
    digests_hex(root, theirs);
    if (!p->have_root) {
        memcpy(p->root, root, DIGEST_BYTES);
        p->have_root = p->root_tofu = true;
        snprintf(p->root_from, sizeof p->root_from, "node %s, the first node it was pulled "
                 "from", p->who);
        rc_log(LOG_INFO, "weights: model '%s': trusting content digest %.16s... from %s",
               p->name, theirs, p->root_from);
    } else if (sodium_memcmp(root, p->root, DIGEST_BYTES)) {
        digests_hex(p->root, ours);
        return rc_fail(RC_EFORMAT, "node %s holds model '%s' with content digest %.16s..., not "
                       "the %.16s... of %s", p->who, p->name, theirs, ours, p->root_from);
    }
    p->holder_fault = false;
    return 0;
}

/* The holder's block digests, which must hash to the trusted root.  They
 * are stored as they arrive, so memory follows what the holder actually
 * sends, not the size it claims. */
static int remote_digests(pull *p, uint64_t size)
{
    digests d = { .size = size };
    int rc = digests_blocks(size, &d.n);
    for (uint32_t first = 0; !rc && first < d.n;) {
        uint32_t count = d.n - first < WEIGHTS_PAGE ? d.n - first : WEIGHTS_PAGE;
        uint8_t msg[5 + WEIGHTS_NAME_MAX + 8];
        size_t k = req_header(msg, p->name);
        const uint8_t *b;
        size_t n;
        int si;
        le_put32(msg + k, first);
        le_put32(msg + k + 4, count);
        p->holder_fault = true;
        if ((rc = request(p->w, p->node, W_DIGESTS_REQ, msg, k + 8, &si)))
            break;
        if (!(rc = await(p->w, si, &b, &n))) {
            uint8_t (*grown)[DIGEST_BYTES] = NULL;
            if (n != 8 + (size_t)count * DIGEST_BYTES || le_get32(b) != first ||
                le_get32(b + 4) != count)
                rc = rc_fail(RC_EFORMAT, "node %s: malformed block digests of model '%s'",
                             p->who, p->name);
            else if (!(grown = rc_realloc(d.d, ((size_t)first + count) * DIGEST_BYTES)))
                rc = rc_fail(RC_ENOMEM, "out of memory for block digests");
            else
                memcpy((d.d = grown)[first], b + 8, (size_t)count * DIGEST_BYTES);
        }
        release(p->w, si);
        first += count;
    }
    if (!rc) {
        digests_root(&d, d.root);
        if (sodium_memcmp(d.root, p->root, DIGEST_BYTES))
            rc = rc_fail(RC_EFORMAT, "node %s sent block digests of model '%s' that do not "
                         "hash to its content digest (from %s)", p->who, p->name, p->root_from);
    }
    if (rc) {
        digests_free(&d);
        return rc;
    }
    p->holder_fault = false;
    digests_free(&p->dig);
    p->dig = d;
    return 0;
}

/* One holder: its info and digests (unless known), then the head, the
 * layers' blocks, and, once every tensor is here, the rest of the file. */
static int pull_from(pull *p, int first, int last, int rank, int n_ranks)
{
    uint64_t size, head;
    gguf_file *f = NULL;
    bool *need = NULL;
    block_set s = { NULL, p };
    int rc;
    if ((rc = remote_info(p, &size, &head)))
        return rc;
    if (p->dig.d && (p->dig.size != size || sodium_memcmp(p->dig.root, p->root, DIGEST_BYTES)))
        digests_free(&p->dig);        /* another version's: start over */
    if (!p->dig.d) {
        if ((rc = remote_digests(p, size)))
            return rc;
        /* only now, with a size the root vouches for, is the copy sized */
        model_ranges_free(p->ranges);
        p->ranges->file_bytes = size;
        if (ftruncate(p->fd, 0) != 0 || ftruncate(p->fd, (off_t)size) != 0)
            return rc_fail(RC_EIO, "%s: cannot size to %llu bytes: %s", p->part, (ull)size,
                           strerror(errno));
        if ((rc = digests_write(p->dfile, NULL, &p->dig)))
            return rc;
    }
    if (!(s.want = rc_calloc(((size_t)p->dig.n + 7) / 8, 1)))
        return rc_fail(RC_ENOMEM, "out of memory planning a pull");
    want_range(&s, 0, head);
    if ((rc = fetch_wanted(p, &s)))
        goto done;
    if ((rc = gguf_open_meta(p->part, &f)) || f->data_offset > head) {
        p->holder_fault = true;
        if (!rc)
            rc = rc_fail(RC_EFORMAT, "node %s: the head of model '%s' ends at byte %llu, the "
                         "node said %llu", p->who, p->name, (ull)f->data_offset, (ull)head);
        else
            rc_wrap(RC_EFORMAT, "model '%s' from node %s: ", p->name, p->who);
        goto done;
    }
    if (!(need = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *need))) {
        rc = rc_fail(RC_ENOMEM, "out of memory planning a pull");
        goto done;
    }
    if (first != last && (rc = model_tensor_needs(f, first, last, need)))
        goto done;                         /* first == last: the head alone */
    if (n_ranks > 1 && first != last)      /* a shard: its parts of the tensors */
        rc = model_shard_ranges(f, first, last, rank, n_ranks, want_shard_range, &s);
    for (uint64_t i = 0; i < f->n_tensors && !rc && n_ranks == 1; i++)
        if (need[i])
            want_range(&s, f->tensors[i].file_offset,
                       f->tensors[i].file_offset + f->tensors[i].size_bytes);
    if (rc || (rc = fetch_wanted(p, &s)))
        goto done;
    /* Every tensor here: the rest too (padding), so the copy is the file
     * byte for byte and can be renamed. */
    bool all = true;
    for (uint64_t i = 0; i < f->n_tensors && all; i++)
        all = model_ranges_covers(p->ranges, f->tensors[i].file_offset,
                                  f->tensors[i].file_offset + f->tensors[i].size_bytes);
    if (all) {
        want_range(&s, 0, size);
        rc = fetch_wanted(p, &s);
    }
done:
    gguf_close(f);
    rc_free(need);
    rc_free(s.want);
    return rc;
}

int weights_ensure(weights *w, const char *model_name, int first, int last, const uint8_t *root,
                   const char *peer_id, weights_progress_fn progress, void *ud, char *path_out,
                   size_t cap)
{
    return weights_ensure_shard(w, model_name, first, last, 0, 1, root, peer_id, progress, ud,
                                path_out, cap);
}

/* The end of a pull: what was verified is kept; a complete copy is renamed
 * and its digests cached. */
static int finish(pull *p, int rc, const char *man, const char *final, char *path_out,
                  size_t cap)
{
    if (fdatasync(p->fd) != 0 && !rc)
        rc = rc_fail(RC_EIO, "%s: cannot sync: %s", p->part, strerror(errno));
    int wrc = p->ranges->file_bytes ? model_ranges_write(man, p->ranges) : 0;
    if (!rc)
        rc = wrc;
    bool whole = p->dig.d && model_ranges_covers(p->ranges, 0, p->dig.size);
    if (!rc && whole) {
        struct stat st;
        if (rename(p->part, final) != 0)
            return rc_fail(RC_EIO, "%s: cannot rename to %s: %s", p->part, final,
                           strerror(errno));
        unlink(man);
        unlink(p->dfile);
        if (fstat(p->fd, &st) == 0) {
            export_stat es = exports_stat(&st);
            digests_cache_store(p->w->cache_dir, final, &es, &p->dig);
        }
    }
    if (!rc && (size_t)snprintf(path_out, cap, "%s", whole ? final : p->part) >= cap)
        rc = rc_fail(RC_ELIMIT, "path_out of %zu bytes is too small", cap);
    return rc;
}

int weights_ensure_shard(weights *w, const char *model_name, int first, int last, int rank,
                         int n_ranks, const uint8_t *root, const char *peer_id,
                         weights_progress_fn progress, void *ud, char *path_out, size_t cap)
{
    char final[PATH_MAX], part[PATH_MAX + 8], man[PATH_MAX + 16], dfile[PATH_MAX + 16];
    int rc;
    if (!model_name || (rc = exports_check_name(model_name)))
        return model_name ? rc : rc_fail(RC_EINVAL, "no model name");
    if (first < 0 || (last >= 0 && last < first))
        return rc_fail(RC_EINVAL, "layer range [%d, %d) of model '%s' is negative",
                       first, last, model_name);
    pthread_mutex_lock(&w->ensure_mu);
    if ((size_t)snprintf(final, sizeof final, "%s/%s.gguf", w->models_dir, model_name) >=
        sizeof final) {
        rc = rc_fail(RC_ELIMIT, "models folder path too long");
        goto out;
    }
    snprintf(part, sizeof part, "%s.part", final);
    snprintf(dfile, sizeof dfile, "%s.digests", part);
    model_ranges_path(final, man, sizeof man);
    /* A complete local copy; a manifest left beside it by an interrupted
     * rename is stale (the rename happens only once all is verified). */
    if ((rc = local_model(w, model_name, path_out, cap)) != RC_ENOTFOUND)
        goto out;
    if (is_file(final) && !is_file(part) && access(man, F_OK) == 0) {
        unlink(man);
        rc = local_model(w, model_name, path_out, cap);
        goto out;
    }
    if (mkdir(w->models_dir, 0755) != 0 && errno != EEXIST) {
        rc = rc_fail(RC_EIO, "%s: cannot create the models folder: %s", w->models_dir,
                     strerror(errno));
        goto out;
    }
    model_ranges r;
    pull p = { .w = w, .name = model_name, .part = part, .dfile = dfile, .ranges = &r,
               .progress = progress, .ud = ud, .t0 = os_now_ns(), .peer_id = peer_id };
    /* a copy without its block digests (an older version's) starts over */
    if ((rc = model_ranges_read(man, &r)) || !is_file(part) ||
        digests_read(dfile, NULL, &p.dig) || p.dig.size != r.file_bytes) {
        if (rc && rc != RC_ENOTFOUND)
            rc_log(LOG_WARN, "weights: %s; starting the copy over", rc_errmsg());
        if (!rc)
            model_ranges_free(&r);
        digests_free(&p.dig);
        memset(&r, 0, sizeof r);
    }
    if (root) {
        memcpy(p.root, root, DIGEST_BYTES);
        p.have_root = true;
        snprintf(p.root_from, sizeof p.root_from, "the node that placed the instance");
    } else {
        p.have_root = get_pin(w, model_name, p.root, p.root_from, sizeof p.root_from);
    }
    if ((p.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = rc_fail(RC_EIO, "%s: cannot open: %s", part, strerror(errno));
        goto free;
    }
    char tried[MAX_TRIED][NODE_HEX];
    int n_tried = 0;
    char last_err[1024] = "";
    int last_rc = 0;
    for (;;) {
        rc = pick_peer(w, model_name, peer_id, tried, n_tried, p.node, &p.listed_bytes);
        if (rc) {
            if (last_rc)                  /* the last holder's failure says most */
                rc = rc_fail(last_rc, "%s (%s)", last_err, rc_errmsg());
            break;
        }
        node_label(w, p.node, p.who, sizeof p.who);
        p.holder_fault = false;
        if (!(rc = pull_from(&p, first, last, rank, n_ranks)) || !p.holder_fault)
            break;
        rc_log(LOG_WARN, "weights: %s; leaving node %s out of this pull", rc_errmsg(), p.who);
        snprintf(last_err, sizeof last_err, "%s", rc_errmsg());
        last_rc = rc;
        if (peer_id || n_tried == MAX_TRIED)
            break;
        snprintf(tried[n_tried++], NODE_HEX, "%s", p.node);
        for (int i = 0; i < p.n_src && n_tried < MAX_TRIED; i++) {
            bool known = false;               /* sources left out: not the next holder */
            for (int t = 0; t < n_tried && !known; t++)
                known = !strcmp(tried[t], p.src[i].node);
            if (p.src[i].bad && !known)
                snprintf(tried[n_tried++], NODE_HEX, "%s", p.src[i].node);
        }
        if (p.root_tofu) {
            /* a root is taken on first use only from a holder whose bytes
             * match it: the next holder's replaces it (and what was
             * checked against it is fetched again, from sources checked
             * against the new one) */
            p.have_root = p.root_tofu = false;
            digests_free(&p.dig);
            p.n_src = 0;
            p.refreshed_ns = 0;
        }
    }
    rc = finish(&p, rc, man, final, path_out, cap);
    close(p.fd);
    if (!rc && p.have_root)
        set_pin(w, model_name, p.root, p.root_from, false);
    if (rc && n_ranks > 1)
        rc_wrap(rc, "pulling shard %d of %d of layers %d-%d of '%s': ", rank, n_ranks, first,
                last < 0 ? -1 : last - 1, model_name);
    else if (rc)
        rc_wrap(rc, "pulling layers %d-%d of '%s': ", first, last < 0 ? -1 : last - 1,
                model_name);
    else if (p.done) {
        char from[600];
        size_t k = 0;
        from[0] = 0;
        for (int i = 0; i < p.n_src && k < sizeof from; i++)
            if (p.src[i].bytes)
                k += (size_t)snprintf(from + k, sizeof from - k, "%snode %s (%.1f MB)",
                                      k ? ", " : "", p.src[i].who, (double)p.src[i].bytes / 1e6);
        rc_log(LOG_INFO, "weights: pulled %.1f MB of '%s' from %s in %.1f s, every block "
               "checked against its content digest", (double)p.done / 1e6, model_name, from,
               (double)(os_now_ns() - p.t0) * 1e-9);
    }
free:
    digests_free(&p.dig);
    model_ranges_free(&r);
out:
    pthread_mutex_unlock(&w->ensure_mu);
    return rc;
}

/* ---- life cycle ---- */

int weights_new(struct cluster *c, const char *models_dir, const char *ro_dirs, weights **out)
{
    *out = NULL;
    if (sodium_init() < 0)
        return rc_fail(RC_EIO, "libsodium failed to initialise");
    weights *w = rc_calloc(1, sizeof *w);
    if (!w)
        return rc_fail(RC_ENOMEM, "out of memory");
    w->c = c;
    w->timeout_ms = 30000;
    w->models_dir = rc_strdup(models_dir ? models_dir : ".");
    w->ro_dirs = ro_dirs && *ro_dirs ? rc_strdup(ro_dirs) : NULL;
    const char *sd = cluster_state_path(c);
    if (sd && *sd)
        snprintf(w->cache_dir, sizeof w->cache_dir, "%s/digests", sd);
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->ensure_mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->jobs_mu, NULL);
    pthread_cond_init(&w->jobs_cv, NULL);
    int rc;
    if (!w->models_dir || (ro_dirs && *ro_dirs && !w->ro_dirs))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    else if (pthread_create(&w->server, NULL, server_thread, w))
        rc = rc_fail(RC_ENOMEM, "cannot start the weight-serving thread");
    else {
        w->server_started = true;
        rc = cluster_add_handler(c, W_INFO_REQ, 0x57, on_msg, w);
    }
    if (rc) {
        weights_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

void weights_stop(weights *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->jobs_mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->jobs_cv);
    pthread_mutex_unlock(&w->jobs_mu);
    if (w->server_started)
        pthread_join(w->server, NULL);
    w->server_started = false;
    pthread_mutex_lock(&w->jobs_mu);
    for (job *j = w->jobs_head, *n; j; j = n) {
        n = j->next;
        rc_free(j);
    }
    w->jobs_head = w->jobs_tail = NULL;
    w->n_jobs = 0;
    pthread_mutex_unlock(&w->jobs_mu);
}

void weights_free(weights *w)
{
    if (!w)
        return;
    weights_stop(w);
    pthread_mutex_destroy(&w->jobs_mu);
    pthread_cond_destroy(&w->jobs_cv);
    for (int i = 0; i < W_SLOTS; i++)
        rc_free(w->slots[i].reply);
    digests_free(&w->served.d);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->ensure_mu);
    pthread_cond_destroy(&w->cv);
    rc_free(w->models_dir);
    rc_free(w->ro_dirs);
    rc_free(w);
}

void weights_test_hooks(weights *w, uint64_t tamper_nth, int mute, int reply_timeout_ms)
{
    pthread_mutex_lock(&w->mu);
    w->tamper_nth = tamper_nth ? w->n_received + tamper_nth : 0;
    w->mute = mute;
    if (reply_timeout_ms > 0)
        w->timeout_ms = reply_timeout_ms;
    pthread_mutex_unlock(&w->mu);
}

void weights_test_alter(weights *w, bool on)
{
    pthread_mutex_lock(&w->mu);
    w->alter = on;
    pthread_mutex_unlock(&w->mu);
}

uint64_t weights_served_bytes(weights *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t n = w->served_bytes;
    pthread_mutex_unlock(&w->mu);
    return n;
}

int weights_discard(weights *w, const char *name)
{
    char final[PATH_MAX], part[PATH_MAX + 8], man[PATH_MAX + 16], dfile[PATH_MAX + 16];
    int rc = exports_check_name(name);
    if (rc)
        return rc;
    if ((size_t)snprintf(final, sizeof final, "%s/%s.gguf", w->models_dir, name) >= sizeof final)
        return rc_fail(RC_ELIMIT, "models folder path too long");
    snprintf(part, sizeof part, "%s.part", final);
    snprintf(dfile, sizeof dfile, "%s.digests", part);
    if ((rc = model_ranges_path(final, man, sizeof man)))
        return rc;
    pthread_mutex_lock(&w->ensure_mu);         /* not while a pull writes them */
    const char *files[3] = { part, man, dfile };
    for (int i = 0; i < 3 && !rc; i++)
        if (unlink(files[i]) != 0 && errno != ENOENT)
            rc = rc_fail(RC_EIO, "%s: cannot delete: %s", files[i], strerror(errno));
    pthread_mutex_unlock(&w->ensure_mu);
    return rc;
}
