/* weights.c - weight transfer between nodes (weights.h).
 *
 * Every message starts with a u32 request id chosen by the requester; a
 * reply carries the id of its request and an i32 status (0, or a negative
 * RC_E* code followed by a message).  The requester keeps at most
 * WEIGHTS_WINDOW requests in flight in `slots`; the cluster thread fills a
 * slot when its reply arrives and wakes the requester, which checks hashes
 * and writes the file.  The serving side is stateless: each request opens
 * the file, preads what it needs and answers.
 *
 * Divisions: wire helpers; names and paths; serving (cluster thread);
 * requests and replies; the pull.
 */
#include "weights.h"
#include "cluster.h"

#include "base/err.h"
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
    W_INFO_REQ = 0x50, W_INFO = 0x51,     /* file size and head size */
    W_READ_REQ = 0x52, W_DATA = 0x53,     /* a chunk and its hash */
    W_HASH_REQ = 0x54, W_HASH = 0x55,     /* the hash of a byte range */
};
#define HASH_BYTES 32
#define NODE_HEX   33

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
 * (reading and hashing up to a whole tensor must not stall heartbeats). */
typedef struct job {
    struct job *next;
    char from[NODE_HEX];
    int type;
    size_t len;
    uint8_t data[];
} job;
#define MAX_JOBS 256

struct weights {
    struct cluster *c;
    char *models_dir, *ro_dirs;
    pthread_mutex_t jobs_mu;
    pthread_cond_t jobs_cv;
    job *jobs_head, *jobs_tail;
    int n_jobs;
    bool stopping, server_started;
    pthread_t server;
    pthread_mutex_t mu;      /* slots, next_id, hooks */
    pthread_cond_t cv;
    slot slots[WEIGHTS_WINDOW];
    uint32_t next_id;
    pthread_mutex_t ensure_mu;   /* one pull at a time */
    uint64_t tamper_nth, n_received;
    int mute;
    int timeout_ms;
};

/* ---- wire helpers ---- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* ---- names and paths ---- */

static int check_name(const char *name)
{
    size_t n = strlen(name);
    bool bad = n == 0 || n > WEIGHTS_NAME_MAX || name[0] == '.' || strchr(name, '/') ||
               strchr(name, '\\') || strstr(name, "..");
    for (size_t i = 0; i < n && !bad; i++)
        bad = (unsigned char)name[i] < 0x20 || name[i] == 0x7f;
    if (!bad)
        return 0;
    bool printable = n <= WEIGHTS_NAME_MAX;
    for (size_t i = 0; i < n && printable; i++)
        printable = (unsigned char)name[i] >= 0x20 && name[i] != 0x7f;
    return rc_fail(RC_EINVAL, "model name '%s' is not a plain file name (no '/', '..', leading "
                   "'.' or control characters, 1 to %d bytes)",
                   printable ? name : "(unprintable)", WEIGHTS_NAME_MAX);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Calls fn(dir) for the models folder and each read-only folder until it
 * returns nonzero; returns that. */
static int each_dir(const weights *w, int (*fn)(void *ctx, const char *dir, bool ro), void *ctx)
{
    int rc = fn(ctx, w->models_dir, false);
    const char *p = w->ro_dirs ? w->ro_dirs : "";
    while (!rc && *p) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        if (n && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = 0;
            rc = fn(ctx, dir, true);
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

/* A complete NAME.gguf (no manifest) whose real path lies inside `dir`. */
static int find_in_dir(void *ctx, const char *dir, bool ro)
{
    find_ctx *f = ctx;
    char cand[PATH_MAX], man[PATH_MAX + 16], rd[PATH_MAX], rf[PATH_MAX];
    (void)ro;
    if ((size_t)snprintf(cand, sizeof cand, "%s/%s.gguf", dir, f->name) >= sizeof cand ||
        !is_file(cand) || model_ranges_path(cand, man, sizeof man) || access(man, F_OK) == 0)
        return 0;
    if (!realpath(dir, rd) || !realpath(cand, rf))
        return 0;
    size_t n = strlen(rd);
    if (strncmp(rf, rd, n) || rf[n] != '/') {
        f->rc = rc_fail(RC_EINVAL, "model '%s' resolves to %s, outside the models folder %s",
                        f->name, rf, rd);
        return 1;
    }
    if ((size_t)snprintf(f->out, f->cap, "%s", cand) >= f->cap) {
        f->rc = rc_fail(RC_ELIMIT, "%s: path too long", cand);
        return 1;
    }
    f->rc = 0;
    return 1;
}

/* The path of a complete local copy of `name`, in the models folder or a
 * read-only one.  RC_ENOTFOUND, RC_EINVAL (outside the folders). */
static int local_model(const weights *w, const char *name, char *out, size_t cap)
{
    int rc = check_name(name);
    if (rc)
        return rc;
    find_ctx f = { name, out, cap, 0 };
    if (!each_dir(w, find_in_dir, &f))
        return rc_fail(RC_ENOTFOUND, "model '%s' is not in this node's models folders", name);
    return f.rc;
}

/* ---- serving (cluster thread) ---- */

static void reply_error(weights *w, const char *to, int type, uint32_t id, int code)
{
    const char *msg = rc_errmsg();
    size_t n = strlen(msg);
    if (n > 1000)
        n = 1000;
    uint8_t buf[10 + 1000];
    put32(buf, id);
    put32(buf + 4, (uint32_t)code);
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
    *id = get32(d);
    size_t n = d[4];
    if (n == 0 || n > WEIGHTS_NAME_MAX || len != 5 + n + fields)
        return rc_fail(RC_EFORMAT, "weight request: bad name length %zu or size %zu", n, len);
    if (memchr(d + 5, 0, n))
        return rc_fail(RC_EINVAL, "weight request: model name contains a NUL byte");
    memcpy(name, d + 5, n);
    name[n] = 0;
    *rest = d + 5 + n;
    return 0;
}

static int pread_full(int fd, uint8_t *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t r = pread(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        buf += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pwrite_full(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t r = pwrite(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        buf += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Hash of [off, off + len) of fd, read 1 MiB at a time. */
static int hash_range(int fd, uint64_t off, uint64_t len, uint8_t out[HASH_BYTES])
{
    crypto_generichash_state st;
    uint8_t *buf = rc_malloc(WEIGHTS_CHUNK);
    if (!buf)
        return rc_fail(RC_ENOMEM, "out of memory hashing");
    crypto_generichash_init(&st, NULL, 0, HASH_BYTES);
    while (len) {
        size_t n = len < WEIGHTS_CHUNK ? (size_t)len : WEIGHTS_CHUNK;
        if (pread_full(fd, buf, n, off)) {
            rc_free(buf);
            return rc_fail(RC_EIO, "read error at byte %llu: %s", (ull)off, strerror(errno));
        }
        crypto_generichash_update(&st, buf, n);
        off += n;
        len -= n;
    }
    crypto_generichash_final(&st, out, HASH_BYTES);
    rc_free(buf);
    return 0;
}

/* Opens the served file of `name`; *size its size. */
static int open_served(weights *w, const char *name, int *fd, uint64_t *size)
{
    char path[PATH_MAX];
    int rc = local_model(w, name, path, sizeof path);
    if (rc)
        return rc;
    struct stat st;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return rc_fail(RC_EIO, "model '%s': cannot open: %s", name, strerror(errno));
    if (fstat(*fd, &st) != 0) {
        close(*fd);
        return rc_fail(RC_EIO, "model '%s': cannot stat: %s", name, strerror(errno));
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

static int serve_info(weights *w, const char *from, uint32_t id, const char *name)
{
    char path[PATH_MAX];
    gguf_file *f;
    int rc = local_model(w, name, path, sizeof path);
    if (rc || (rc = gguf_open_meta(path, &f)))
        return rc;
    uint8_t buf[24];
    put32(buf, id);
    put32(buf + 4, 0);
    put64(buf + 8, f->size_bytes);
    put64(buf + 16, f->data_offset);
    gguf_close(f);
    return cluster_send(w->c, from, W_INFO, buf, sizeof buf);
}

static int serve_read(weights *w, const char *from, uint32_t id, const char *name,
                      const uint8_t *rest)
{
    uint64_t off = get64(rest), size;
    uint32_t len = get32(rest + 8);
    int fd, rc;
    if (len == 0 || len > WEIGHTS_CHUNK)
        return rc_fail(RC_EINVAL, "chunk of %u bytes (1 to %u)", len, WEIGHTS_CHUNK);
    if ((rc = open_served(w, name, &fd, &size)))
        return rc;
    if (off > size || len > size - off) {
        close(fd);
        return rc_fail(RC_ERANGE, "bytes [%llu, %llu) lie outside model '%s' (%llu bytes)",
                       (ull)off, (ull)off + len, name, (ull)size);
    }
    const size_t hdr = 4 + 4 + 8 + 4 + HASH_BYTES;
    uint8_t *buf = rc_malloc(hdr + len);
    if (!buf) {
        close(fd);
        return rc_fail(RC_ENOMEM, "out of memory for a chunk");
    }
    if (pread_full(fd, buf + hdr, len, off)) {
        rc = rc_fail(RC_EIO, "model '%s': read error at byte %llu", name, (ull)off);
    } else {
        put32(buf, id);
        put32(buf + 4, 0);
        put64(buf + 8, off);
        put32(buf + 16, len);
        crypto_generichash(buf + 20, HASH_BYTES, buf + hdr, len, NULL, 0);
        rc = cluster_send(w->c, from, W_DATA, buf, hdr + len);
    }
    rc_free(buf);
    close(fd);
    return rc;
}

static int serve_hash(weights *w, const char *from, uint32_t id, const char *name,
                      const uint8_t *rest)
{
    uint64_t off = get64(rest), len = get64(rest + 8), size;
    int fd, rc;
    if ((rc = open_served(w, name, &fd, &size)))
        return rc;
    uint8_t buf[4 + 4 + 8 + 8 + HASH_BYTES];
    if (off > size || len > size - off)
        rc = rc_fail(RC_ERANGE, "bytes [%llu, %llu) lie outside model '%s' (%llu bytes)",
                     (ull)off, (ull)(off + len), name, (ull)size);
    else
        rc = hash_range(fd, off, len, buf + 24);
    close(fd);
    if (rc)
        return rc;
    put32(buf, id);
    put32(buf + 4, 0);
    put64(buf + 8, off);
    put64(buf + 16, len);
    return cluster_send(w->c, from, W_HASH, buf, sizeof buf);
}

static void serve(weights *w, const char *from, int type, const uint8_t *data, size_t len)
{
    static const size_t fields[] = { [0] = 0, [1] = 8 + 4, [2] = 8 + 8 };
    const int k = (type - W_INFO_REQ) / 2;
    char name[WEIGHTS_NAME_MAX + 1];
    const uint8_t *rest = NULL;
    uint32_t id = len >= 4 ? get32(data) : 0;
    int rc = parse_request(data, len, fields[k], &id, name, &rest);
    if (!rc)
        rc = type == W_INFO_REQ ? serve_info(w, from, id, name)
           : type == W_READ_REQ ? serve_read(w, from, id, name, rest)
           : serve_hash(w, from, id, name, rest);
    if (rc && rc != RC_ENOTFOUND)
        rc_log(LOG_WARN, "weights: request from node %.8s: %s", from, rc_errmsg());
    if (rc)
        reply_error(w, from, type + 1, id, rc);
}

/* ---- requests and replies ---- */

static void on_reply(weights *w, const char *from, int type, const uint8_t *data, size_t len)
{
    if (len < 8)
        return;
    uint32_t id = get32(data);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < WEIGHTS_WINDOW; i++) {
        slot *s = &w->slots[i];
        if (!s->used || s->done || s->id != id || s->reply_type != type || strcmp(s->node, from))
            continue;
        s->reply = rc_malloc(len);
        if (s->reply) {
            memcpy(s->reply, data, len);
            s->len = len;
            if (type == W_DATA && get32(data + 4) == 0 && len > 52 &&
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
    if (type == W_INFO_REQ || type == W_READ_REQ || type == W_HASH_REQ) {
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
    } else if (type == W_INFO || type == W_DATA || type == W_HASH) {
        on_reply(w, from, type, data, len);
    }
}

void weights_on_node_down(weights *w, const char *node_id)
{
    if (!w || !node_id)
        return;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < WEIGHTS_WINDOW; i++) {
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
    for (int i = 0; i < WEIGHTS_WINDOW && k < 0; i++)
        if (!w->slots[i].used)
            k = i;
    if (k < 0) {
        pthread_mutex_unlock(&w->mu);
        return rc_fail(RC_ELIMIT, "more than %d weight requests in flight", WEIGHTS_WINDOW);
    }
    slot *s = &w->slots[k];
    memset(s, 0, sizeof *s);
    s->used = true;
    s->id = ++w->next_id;
    s->reply_type = type + 1;
    snprintf(s->node, sizeof s->node, "%s", node);
    put32(msg, s->id);
    pthread_mutex_unlock(&w->mu);
    int rc = cluster_send(w->c, node, type, msg, len);
    if (rc) {
        release(w, k);
        return rc_wrap(RC_EIO, "asking node %.8s for weights: ", node);
    }
    *si = k;
    return 0;
}

/* Waits for slot si's reply; on success *body points past id and status
 * (valid until release). */
static int await(weights *w, int si, const uint8_t **body, size_t *body_len)
{
    slot *s = &w->slots[si];
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += w->timeout_ms / 1000;
    dl.tv_nsec += (long)(w->timeout_ms % 1000) * 1000000L;
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
        return rc_fail(RC_EIO, "node %.8s did not answer within %d ms", s->node, w->timeout_ms);
    if (!s->reply)
        return rc_fail(RC_EIO, "%s", s->err);
    int32_t status = (int32_t)get32(s->reply + 4);
    if (status != 0) {
        size_t n = s->len >= 10 ? (size_t)(s->reply[8] | s->reply[9] << 8) : 0;
        if (n > s->len - 10 || s->len < 10)
            n = 0;
        int code = status >= RC_ESTATE && status < 0 ? status : RC_EIO;
        return rc_fail(code, "node %.8s: %.*s", s->node, (int)n, (const char *)s->reply + 10);
    }
    *body = s->reply + 8;
    *body_len = s->len - 8;
    return 0;
}

/* ---- the pull ---- */

typedef struct {
    uint64_t start, end;
    const char *what;        /* tensor name, "the file head", "padding" */
    uint64_t left;           /* chunks not yet written */
} unit;

typedef struct {
    weights *w;
    const char *name, *node;
    int fd;
    model_ranges *ranges;
    weights_progress_fn progress;
    void *ud;
    uint64_t done, total, t0;
} pull;

typedef struct {
    int slot;
    bool is_hash;
    size_t unit;
    uint64_t off, len;
} inflight;

static size_t req_header(uint8_t *msg, const char *name)
{
    size_t n = strlen(name);
    msg[4] = (uint8_t)n;
    memcpy(msg + 5, name, n);
    return 5 + n;
}

static int send_read(pull *p, uint64_t off, uint64_t len, int *si)
{
    uint8_t msg[5 + WEIGHTS_NAME_MAX + 12];
    size_t k = req_header(msg, p->name);
    put64(msg + k, off);
    put32(msg + k + 8, (uint32_t)len);
    return request(p->w, p->node, W_READ_REQ, msg, k + 12, si);
}

static int send_hash(pull *p, uint64_t off, uint64_t len, int *si)
{
    uint8_t msg[5 + WEIGHTS_NAME_MAX + 16];
    size_t k = req_header(msg, p->name);
    put64(msg + k, off);
    put64(msg + k + 8, len);
    return request(p->w, p->node, W_HASH_REQ, msg, k + 16, si);
}

/* The peer's hash of [off, off + len). */
static int remote_hash(pull *p, uint64_t off, uint64_t len, uint8_t out[HASH_BYTES])
{
    int si, rc = send_hash(p, off, len, &si);
    const uint8_t *b;
    size_t n;
    if (rc)
        return rc;
    if (!(rc = await(p->w, si, &b, &n))) {
        if (n != 16 + HASH_BYTES || get64(b) != off || get64(b + 8) != len)
            rc = rc_fail(RC_EFORMAT, "node %.8s: malformed hash reply", p->node);
        else
            memcpy(out, b + 16, HASH_BYTES);
    }
    release(p->w, si);
    return rc;
}

/* A chunk's reply: check it answers the request and its hash, write it. */
static int take_chunk(pull *p, const inflight *q, const unit *u, const uint8_t *b, size_t n)
{
    uint8_t h[HASH_BYTES];
    if (n != 12 + HASH_BYTES + q->len || get64(b) != q->off || get32(b + 8) != q->len)
        return rc_fail(RC_EFORMAT, "node %.8s: malformed chunk reply for bytes [%llu, %llu) of "
                       "model '%s'", p->node, (ull)q->off, (ull)(q->off + q->len), p->name);
    const uint8_t *data = b + 12 + HASH_BYTES;
    crypto_generichash(h, HASH_BYTES, data, (size_t)q->len, NULL, 0);
    if (sodium_memcmp(h, b + 12, HASH_BYTES))
        return rc_fail(RC_EFORMAT, "model '%s' from node %.8s: the chunk of bytes [%llu, %llu) "
                       "(%s) failed its hash check; nothing of it was kept", p->name, p->node,
                       (ull)q->off, (ull)(q->off + q->len), u->what);
    if (pwrite_full(p->fd, data, (size_t)q->len, q->off))
        return rc_fail(RC_EIO, "model '%s': cannot write bytes [%llu, %llu) of the copy: %s",
                       p->name, (ull)q->off, (ull)(q->off + q->len), strerror(errno));
    p->done += q->len;
    if (p->progress) {
        double s = (double)(os_now_ns() - p->t0) * 1e-9;
        p->progress(p->ud, p->done, p->total, s > 0 ? (double)p->done / s : 0.0);
    }
    return 0;
}

/* A unit is complete: the peer's hash of the whole unit must match the
 * bytes written, then the range counts as verified. */
static int take_hash(pull *p, const unit *u, const uint8_t *b, size_t n)
{
    uint8_t mine[HASH_BYTES];
    int rc;
    if (n != 16 + HASH_BYTES || get64(b) != u->start || get64(b + 8) != u->end - u->start)
        return rc_fail(RC_EFORMAT, "node %.8s: malformed hash reply", p->node);
    if ((rc = hash_range(p->fd, u->start, u->end - u->start, mine)))
        return rc_wrap(rc, "model '%s': checking %s: ", p->name, u->what);
    if (sodium_memcmp(mine, b + 16, HASH_BYTES))
        return rc_fail(RC_EFORMAT, "model '%s' from node %.8s: %s (bytes [%llu, %llu)) does not "
                       "match the peer's hash of it", p->name, p->node, u->what,
                       (ull)u->start, (ull)u->end);
    return model_ranges_add(p->ranges, u->start, u->end);
}

/* Fetches every unit in chunks, WEIGHTS_WINDOW requests in flight. */
static int fetch_units(pull *p, unit *units, size_t n_units)
{
    inflight q[WEIGHTS_WINDOW];
    size_t head = 0, count = 0, cu = 0;
    uint64_t coff = n_units ? units[0].start : 0;
    int rc = 0;
    for (size_t i = 0; i < n_units; i++)
        units[i].left = (units[i].end - units[i].start + WEIGHTS_CHUNK - 1) / WEIGHTS_CHUNK;
    while (!rc && (cu < n_units || count)) {
        while (!rc && cu < n_units && count < WEIGHTS_WINDOW) {
            inflight *x = &q[(head + count) % WEIGHTS_WINDOW];
            uint64_t len = units[cu].end - coff;
            x->is_hash = false;
            x->unit = cu;
            x->off = coff;
            x->len = len < WEIGHTS_CHUNK ? len : WEIGHTS_CHUNK;
            if ((rc = send_read(p, x->off, x->len, &x->slot)))
                break;
            count++;
            coff += x->len;
            if (coff == units[cu].end && ++cu < n_units)
                coff = units[cu].start;
        }
        if (rc || !count)
            break;
        inflight x = q[head];
        head = (head + 1) % WEIGHTS_WINDOW;
        count--;
        const uint8_t *b;
        size_t n;
        unit *u = &units[x.unit];
        if (!(rc = await(p->w, x.slot, &b, &n)))
            rc = x.is_hash ? take_hash(p, u, b, n) : take_chunk(p, &x, u, b, n);
        release(p->w, x.slot);
        if (!rc && !x.is_hash && --u->left == 0) {
            inflight *h = &q[(head + count) % WEIGHTS_WINDOW];
            h->is_hash = true;
            h->unit = x.unit;
            if (!(rc = send_hash(p, u->start, u->end - u->start, &h->slot)))
                count++;
        }
    }
    while (count) {                       /* after a failure: drop what is in flight */
        release(p->w, q[head].slot);
        head = (head + 1) % WEIGHTS_WINDOW;
        count--;
    }
    return rc;
}

/* Adds the units of [start, end) not yet verified (tensor ranges are
 * disjoint from each other and from the head). */
static int add_unit(unit **u, size_t *n, size_t *cap, const model_ranges *r, uint64_t start,
                    uint64_t end, const char *what)
{
    if (start >= end || model_ranges_covers(r, start, end))
        return 0;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        unit *p = rc_realloc(*u, c * sizeof *p);
        if (!p)
            return rc_fail(RC_ENOMEM, "out of memory planning a pull");
        *u = p;
        *cap = c;
    }
    (*u)[(*n)++] = (unit){ start, end, what, 0 };
    return 0;
}

static uint64_t units_bytes(const unit *u, size_t n)
{
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += u[i].end - u[i].start;
    return t;
}

static int pick_peer(weights *w, const char *name, const char *peer_id, char node[NODE_HEX])
{
    json_t *snap = cluster_snapshot(w->c), *n;
    size_t i;
    bool found = false;
    if (!snap)
        return rc_fail(RC_ENOMEM, "out of memory reading the cluster view");
    json_array_foreach(json_object_get(snap, "nodes"), i, n) {
        const char *id = json_string_value(json_object_get(n, "id"));
        const char *state = json_string_value(json_object_get(n, "state"));
        if (found || !id || json_is_true(json_object_get(n, "self")) || !state ||
            strcmp(state, "up") || (peer_id && strcmp(peer_id, id)))
            continue;
        size_t j;
        json_t *m;
        json_array_foreach(json_object_get(n, "models"), j, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            if (mn && !strcmp(mn, name) && !found) {
                snprintf(node, NODE_HEX, "%s", id);
                found = true;
            }
        }
    }
    json_decref(snap);
    if (found)
        return 0;
    if (peer_id)
        return rc_fail(RC_ENOTFOUND, "node %.8s is not up or does not list model '%s'",
                       peer_id, name);
    return rc_fail(RC_ENOTFOUND, "no node in the cluster lists model '%s' (and it is not in "
                   "this node's models folders)", name);
}

/* The peer's file size and head size. */
static int remote_info(pull *p, uint64_t *size, uint64_t *head)
{
    uint8_t msg[5 + WEIGHTS_NAME_MAX];
    size_t k = req_header(msg, p->name);
    const uint8_t *b;
    size_t n;
    int si, rc = request(p->w, p->node, W_INFO_REQ, msg, k, &si);
    if (rc)
        return rc;
    if (!(rc = await(p->w, si, &b, &n))) {
        *size = n == 16 ? get64(b) : 0;
        *head = n == 16 ? get64(b + 8) : 0;
        if (n != 16 || *head == 0 || *head > *size)
            rc = rc_fail(RC_EFORMAT, "node %.8s: malformed info reply for model '%s'",
                         p->node, p->name);
    }
    release(p->w, si);
    return rc;
}

/* A shard's range as a unit to fetch. */
typedef struct {
    unit **u;
    size_t *n, *cap;
    const model_ranges *r;
} unit_list;

static int shard_unit(void *ud, uint64_t start, uint64_t end, const char *name)
{
    unit_list *l = ud;
    return add_unit(l->u, l->n, l->cap, l->r, start, end, name);
}

static int do_pull(weights *w, pull *p, int first, int last, int rank, int n_ranks,
                   const char *part, const char *man, const char *final, char *path_out,
                   size_t cap)
{
    model_ranges *r = p->ranges;
    gguf_file *f = NULL;
    unit *u = NULL;
    size_t n = 0, ucap = 0;
    uint64_t size, head;
    bool *need = NULL;
    int rc;
    if ((rc = remote_info(p, &size, &head)))
        return rc;
    /* A copy of another version of the file (other size, other head)
     * starts over. */
    bool fresh = r->file_bytes != size;
    if (!fresh && model_ranges_covers(r, 0, head)) {
        uint8_t theirs[HASH_BYTES], mine[HASH_BYTES];
        if ((rc = remote_hash(p, 0, head, theirs)) || (rc = hash_range(p->fd, 0, head, mine)))
            return rc;
        fresh = sodium_memcmp(theirs, mine, HASH_BYTES) != 0;
    }
    if (fresh) {
        model_ranges_free(r);
        r->file_bytes = size;
        if (ftruncate(p->fd, 0) != 0)
            return rc_fail(RC_EIO, "%s: cannot truncate: %s", part, strerror(errno));
    }
    if (ftruncate(p->fd, (off_t)size) != 0)   /* sparse: holes cost no disk */
        return rc_fail(RC_EIO, "%s: cannot size to %llu bytes: %s", part, (ull)size,
                       strerror(errno));
    if ((rc = add_unit(&u, &n, &ucap, r, 0, head, "the file head")))
        goto done;
    p->total = units_bytes(u, n);
    if ((rc = fetch_units(p, u, n)))
        goto done;
    if ((rc = gguf_open_meta(part, &f))) {
        rc_wrap(RC_EFORMAT, "model '%s' from node %.8s: ", p->name, p->node);
        goto done;
    }
    if (f->data_offset != head) {
        rc = rc_fail(RC_EFORMAT, "model '%s' from node %.8s: the head ends at byte %llu, the "
                     "peer said %llu", p->name, p->node, (ull)f->data_offset, (ull)head);
        goto done;
    }
    if (!(need = rc_calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *need))) {
        rc = rc_fail(RC_ENOMEM, "out of memory planning a pull");
        goto done;
    }
    if (first != last && (rc = model_tensor_needs(f, first, last, need)))
        goto done;                         /* first == last: the head alone */
    n = 0;
    if (n_ranks > 1 && first != last) {    /* a shard: its parts of the tensors */
        unit_list l = { &u, &n, &ucap, r };
        rc = model_shard_ranges(f, first, last, rank, n_ranks, shard_unit, &l);
    }
    for (uint64_t i = 0; i < f->n_tensors && !rc && n_ranks == 1; i++)
        if (need[i])
            rc = add_unit(&u, &n, &ucap, r, f->tensors[i].file_offset,
                          f->tensors[i].file_offset + f->tensors[i].size_bytes,
                          f->tensors[i].name);
    if (rc)
        goto done;
    p->total = p->done + units_bytes(u, n);
    if ((rc = fetch_units(p, u, n)))
        goto done;
    /* Every tensor here: fetch the padding between them too, so the copy
     * is the peer's file byte for byte. */
    bool all = true;
    for (uint64_t i = 0; i < f->n_tensors && all; i++)
        all = model_ranges_covers(r, f->tensors[i].file_offset,
                                  f->tensors[i].file_offset + f->tensors[i].size_bytes);
    if (all) {
        n = 0;
        uint64_t at = 0;
        for (size_t i = 0; i <= r->n && !rc; i++) {
            uint64_t end = i < r->n ? r->r[i][0] : size;
            rc = add_unit(&u, &n, &ucap, r, at, end, "padding");
            if (i < r->n)
                at = r->r[i][1];
        }
        p->total = p->done + units_bytes(u, n);
        if (rc || (rc = fetch_units(p, u, n)))
            goto done;
    }
done:
    /* What was verified is kept, also after a failure. */
    if (fdatasync(p->fd) != 0 && !rc)
        rc = rc_fail(RC_EIO, "%s: cannot sync: %s", part, strerror(errno));
    int wrc = model_ranges_write(man, r);
    if (!rc)
        rc = wrc;
    if (!rc && model_ranges_covers(r, 0, size)) {
        if (rename(part, final) != 0)
            rc = rc_fail(RC_EIO, "%s: cannot rename to %s: %s", part, final, strerror(errno));
        else
            unlink(man);
    }
    if (!rc && (size_t)snprintf(path_out, cap, "%s", model_ranges_covers(r, 0, size) ? final
                                : part) >= cap)
        rc = rc_fail(RC_ELIMIT, "path_out of %zu bytes is too small", cap);
    gguf_close(f);
    rc_free(need);
    rc_free(u);
    return rc;
}

int weights_ensure(weights *w, const char *model_name, int first, int last, const char *peer_id,
                   weights_progress_fn progress, void *ud, char *path_out, size_t cap)
{
    return weights_ensure_shard(w, model_name, first, last, 0, 1, peer_id, progress, ud,
                                path_out, cap);
}

int weights_ensure_shard(weights *w, const char *model_name, int first, int last, int rank,
                         int n_ranks, const char *peer_id, weights_progress_fn progress,
                         void *ud, char *path_out, size_t cap)
{
    char final[PATH_MAX], part[PATH_MAX + 8], man[PATH_MAX + 16];
    int rc;
    if (!model_name || (rc = check_name(model_name)))
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
    model_ranges_path(final, man, sizeof man);
    /* A complete local copy; a manifest left beside it by an interrupted
     * rename is stale (the rename happens only once all is verified). */
    if ((rc = local_model(w, model_name, path_out, cap)) != RC_ENOTFOUND) {
        goto out;
    }
    if (is_file(final) && !is_file(part) && access(man, F_OK) == 0) {
        unlink(man);
        rc = local_model(w, model_name, path_out, cap);
        goto out;
    }
    char node[NODE_HEX];
    if ((rc = pick_peer(w, model_name, peer_id, node)))
        goto out;
    if (mkdir(w->models_dir, 0755) != 0 && errno != EEXIST) {
        rc = rc_fail(RC_EIO, "%s: cannot create the models folder: %s", w->models_dir,
                     strerror(errno));
        goto out;
    }
    model_ranges r;
    if ((rc = model_ranges_read(man, &r)) == RC_ENOTFOUND || !is_file(part)) {
        if (!rc)
            model_ranges_free(&r);
        memset(&r, 0, sizeof r);
    } else if (rc) {
        rc_log(LOG_WARN, "weights: %s; starting the copy over", rc_errmsg());
        memset(&r, 0, sizeof r);
    }
    int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = rc_fail(RC_EIO, "%s: cannot open: %s", part, strerror(errno));
        model_ranges_free(&r);
        goto out;
    }
    pull p = { .w = w, .name = model_name, .node = node, .fd = fd, .ranges = &r,
               .progress = progress, .ud = ud, .t0 = os_now_ns() };
    rc = do_pull(w, &p, first, last, rank, n_ranks, part, man, final, path_out, cap);
    close(fd);
    if (rc && n_ranks > 1)
        rc_wrap(rc, "pulling shard %d of %d of layers %d-%d of '%s' from node %.8s: ", rank,
                n_ranks, first, last < 0 ? -1 : last - 1, model_name, node);
    else if (rc)
        rc_wrap(rc, "pulling layers %d-%d of '%s' from node %.8s: ", first,
                last < 0 ? -1 : last - 1, model_name, node);
    else
        rc_log(LOG_INFO, "weights: pulled %.1f MB of '%s' from node %.8s in %.1f s",
               (double)p.done / 1e6, model_name, node, (double)(os_now_ns() - p.t0) * 1e-9);
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
    for (int i = 0; i < WEIGHTS_WINDOW; i++)
        rc_free(w->slots[i].reply);
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
