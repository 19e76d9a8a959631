/* hub_download.c - one pull's file transfers: resumable, verified, atomic.
 *
 * Each file goes to STAGING/NAME.part (STAGING = MODELS_DIR/.partial, so
 * the final rename stays on one file system and is atomic).  A .part left
 * by an earlier attempt is hashed again (sha256 streams from the first
 * byte) and the transfer asks for the rest with Range: bytes=N-; a server
 * that answers 200 instead of 206 sends the whole file again and the part
 * is started over.  When the last byte is in, the size and the sha256 the
 * listing gave must match: a mismatch deletes the part and says so; a match
 * is fsync'd and renamed to MODELS_DIR/NAME.  A cut transfer is resumed a
 * few times on its own; when that does not finish it, the part stays for
 * the next pull.  A full disk (ENOSPC) deletes the part: keeping it would
 * hold the space the user needs to free.
 */
#include "hub/hub_internal.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"

#include <sodium.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SPACE_MARGIN_BYTES (64u << 20)   /* left free beyond the files */
#define PROGRESS_EVERY_NS  250000000ull

typedef struct {
    const hub_config *cfg;
    const hub_plan *plan;
    int index;
    int fd;
    uint64_t have;            /* bytes in the part (hashed) */
    uint64_t before;          /* bytes of the plan's earlier files */
    crypto_hash_sha256_state sha;
    int write_errno;          /* a failed write: ENOSPC and others */
    bool cancelled;
    uint64_t range_from;      /* the Range asked for this response (0: none) */
    long status;              /* of the last response's first header line */
    uint64_t last_report_ns;
    uint64_t rate_t0_ns, rate_b0;
    double rate;
} xfer;

static void report(xfer *x, const char *phase)
{
    const hub_config *cfg = x->cfg;
    if (!cfg->progress)
        return;
    const hub_file *f = &x->plan->files[x->index];
    uint64_t now = os_now_ns();
    if (now - x->rate_t0_ns >= 2000000000ull) {
        x->rate = (double)(x->have - x->rate_b0) * 1e9 / (double)(now - x->rate_t0_ns);
        x->rate_t0_ns = now;
        x->rate_b0 = x->have;
    }
    hub_progress p = {
        .phase = phase, .file = f, .index = x->index, .n_files = x->plan->n_files,
        .file_done = x->have, .file_total = f->size,
        .done = x->before + x->have, .total = x->plan->total_bytes, .bytes_per_s = x->rate,
    };
    cfg->progress(cfg->arg, &p);
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    size_t len = size * n;
    int code;
    /* every response of a redirect chain starts with its status line */
    if (len > 9 && !strncmp(p, "HTTP/", 5) && sscanf(p, "HTTP/%*s %d", &code) == 1)
        x->status = code;
    return len;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    size_t len = size * n;
    if (x->status != 200 && x->status != 206)
        return len;   /* an error page: not part of the file */
    if (x->status == 200 && x->range_from > 0) {
        /* the server ignored the range: the file comes again from byte 0 */
        if (ftruncate(x->fd, 0)) {
            x->write_errno = errno;
            return 0;
        }
        crypto_hash_sha256_init(&x->sha);
        x->have = x->range_from = 0;
    }
    if (x->have + len > x->plan->files[x->index].size) {
        x->write_errno = EFBIG;
        return 0;
    }
    if (os_pwrite_full(x->fd, p, len, x->have)) {
        x->write_errno = errno ? errno : EIO;
        return 0;
    }
    crypto_hash_sha256_update(&x->sha, (const unsigned char *)p, len);
    x->have += len;
    uint64_t now = os_now_ns();
    if (now - x->last_report_ns >= PROGRESS_EVERY_NS) {
        x->last_report_ns = now;
        report(x, "downloading");
    }
    return len;
}

static int on_xfer(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    xfer *x = arg;
    if (x->cfg->cancel && *x->cfg->cancel) {
        x->cancelled = true;
        return 1;
    }
    return 0;
}

/* Hashes the bytes already in the part into x->sha; x->have = its size. */
static int rehash_part(xfer *x, const char *part)
{
    struct stat st;
    crypto_hash_sha256_init(&x->sha);
    x->have = 0;
    if (fstat(x->fd, &st))
        return rc_fail(RC_EIO, "%s: %s", part, strerror(errno));
    uint64_t size = (uint64_t)st.st_size;
    if (size > x->plan->files[x->index].size) {
        if (ftruncate(x->fd, 0))
            return rc_fail(RC_EIO, "%s: %s", part, strerror(errno));
        return 0;
    }
    /* on the heap: a thread-local buffer would take its size from every
     * thread's stack (static TLS), in every thread of the process */
    const size_t cap = 1u << 20;
    unsigned char *buf = size ? rc_malloc(cap) : NULL;
    int rc = 0;
    if (size && !buf)
        return rc_fail(RC_ENOMEM, "out of memory");
    while (!rc && x->have < size) {
        size_t want = size - x->have < cap ? (size_t)(size - x->have) : cap;
        ssize_t r = pread(x->fd, buf, want, (off_t)x->have);
        if (r <= 0) {
            rc = rc_fail(RC_EIO, "%s: reading the partial download: %s", part,
                         r ? strerror(errno) : "it shrank");
            break;
        }
        crypto_hash_sha256_update(&x->sha, buf, (size_t)r);
        x->have += (uint64_t)r;
        if (x->cfg->cancel && *x->cfg->cancel)
            rc = rc_fail(RC_ESTATE, "cancelled");
    }
    rc_free(buf);
    return rc;
}

static void hex(const unsigned char *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* One attempt at the rest of the file: 0 when every byte is in, RC_EIO for a
 * cut that may be resumed (*retry set), other codes for the end. */
static int attempt(xfer *x, const char *url, const char *what, bool *retry)
{
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE] = "", range[64];
    *retry = false;
    CURL *h = hub__easy(x->cfg, url, &hdrs);
    if (!h)
        return RC_ENOMEM;
    if (x->have > 0) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)x->have);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    x->status = 0;
    x->range_from = x->have;
    CURLcode cc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    const hub_file *f = &x->plan->files[x->index];
    if (x->cancelled)
        return rc_fail(RC_ESTATE, "%s: cancelled; the partial download is kept and the next "
                       "pull resumes it", what);
    if (x->write_errno == ENOSPC || x->write_errno == EDQUOT)
        return rc_fail(RC_EIO, "%s: no space left on the disk of the models folder %s",
                       what, x->cfg->models_dir);
    if (x->write_errno == EFBIG)
        return rc_fail(RC_EFORMAT, "%s: the server sent more than the %llu bytes the listing "
                       "gives", what, (unsigned long long)f->size);
    if (x->write_errno)
        return rc_fail(RC_EIO, "%s: writing the download: %s", what, strerror(x->write_errno));
    if (x->status == 416 && x->have == f->size)
        return 0;   /* asked for the bytes after the last one: all are in */
    if (x->status && x->status != 200 && x->status != 206)
        return hub__http_error(x->cfg, what, x->status);
    if (cc != CURLE_OK) {
        *retry = true;
        return hub__curl_error(what, cc, errbuf);
    }
    if (x->have < f->size) {
        *retry = true;
        return rc_fail(RC_EIO, "%s: the connection ended after %llu of %llu bytes", what,
                       (unsigned long long)x->have, (unsigned long long)f->size);
    }
    return 0;
}

/* The renames into `dir` must survive a power cut. */
static void sync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* mkdir -p: ~/.racimo/models on a first pull needs ~/.racimo too. */
static int make_dir(const char *dir)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s", dir) >= sizeof path)
        return rc_fail(RC_ELIMIT, "%s: the path is too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p && *p != '/')
            continue;
        char c = *p;
        *p = 0;
        if (mkdir(path, 0755) && errno != EEXIST)
            return rc_fail(RC_EIO, "cannot create %s: %s", path, strerror(errno));
        if (!(*p = c))
            return 0;
    }
}

static int fetch_one(const hub_config *cfg, const hub_plan *plan, int index, uint64_t before,
                     const char *staging, const char *dest_dir)
{
    const hub_file *f = &plan->files[index];
    char ep[1024], url[4096], part[4096], final[4096], what[HUB_PATH_MAX + 16];
    snprintf(what, sizeof what, "%s", f->name);
    if ((size_t)snprintf(part, sizeof part, "%s/%s.part", staging, f->name) >= sizeof part ||
        (size_t)snprintf(final, sizeof final, "%s/%s", dest_dir, f->name) >= sizeof final)
        return rc_fail(RC_ELIMIT, "%s: the path is too long", f->name);
    /* the path in the URL: each character outside the unreserved set escaped */
    char *esc = curl_easy_escape(NULL, f->path, 0);
    if (!esc)
        return rc_fail(RC_ENOMEM, "out of memory");
    for (char *s = esc, *d = esc; ; s++) {
        /* keep the folders of the path: %2F back to '/' */
        if (s[0] == '%' && s[1] == '2' && (s[2] == 'F' || s[2] == 'f')) {
            *d++ = '/';
            s += 2;
        } else if (!(*d++ = *s))
            break;
    }
    xfer x = { .cfg = cfg, .plan = plan, .index = index, .before = before, .fd = -1 };
    x.rate_t0_ns = x.last_report_ns = os_now_ns();
    int rc = 0;
    snprintf(url, sizeof url, "%s/%s/resolve/main/%s", hub__endpoint(cfg, ep, sizeof ep),
             plan->repo, esc);
    curl_free(esc);
    x.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (x.fd < 0)
        return rc_fail(RC_EIO, "%s: %s", part, strerror(errno));
    /* two pulls of one file (two clients, a CLI and a node) would write the
     * same part: the second is refused while the first holds the lock */
    if (flock(x.fd, LOCK_EX | LOCK_NB)) {
        close(x.fd);
        return rc_fail(RC_ESTATE, "%s: another pull of this file is running", f->name);
    }
    if ((rc = rehash_part(&x, part)))
        goto out;
    x.rate_b0 = x.have;
    int retries = cfg->retries < 0 ? 4 : cfg->retries;
    for (int tries = 0;; tries++) {
        bool retry;
        report(&x, "downloading");
        rc = attempt(&x, url, what, &retry);
        if (!rc || !retry || tries >= retries)
            break;
        /* a short pause, longer each time, before asking for the rest */
        for (int ms = 0; ms < 500 * (tries + 1) && !(cfg->cancel && *cfg->cancel); ms += 50)
            os_sleep_ms(50);
    }
    if (rc)
        goto out;
    report(&x, "verifying");
    unsigned char digest[crypto_hash_sha256_BYTES];
    char got[65];
    crypto_hash_sha256_final(&x.sha, digest);
    hex(digest, sizeof digest, got);
    if (x.have != f->size)
        rc = rc_fail(RC_EFORMAT, "%s: %llu bytes arrived, the listing gives %llu; the partial "
                     "download was deleted", what, (unsigned long long)x.have,
                     (unsigned long long)f->size);
    else if (f->sha256[0] && strcmp(got, f->sha256))
        rc = rc_fail(RC_EFORMAT, "%s: sha256 mismatch: the listing gives %s, the download "
                     "hashes to %s; the partial download was deleted", what, f->sha256, got);
    if (rc) {
        unlink(part);
        goto out;
    }
    if (fsync(x.fd)) {
        rc = rc_fail(RC_EIO, "%s: %s", part, strerror(errno));
        goto out;
    }
    /* what listings show as the file's digest (racimo ls); file systems
     * without user attributes just do not keep it */
    if (f->sha256[0])
        (void)os_file_tag_set(x.fd, "sha256", f->sha256, 64);
    if (rename(part, final)) {
        rc = rc_fail(RC_EIO, "moving %s into the models folder: %s", part, strerror(errno));
        goto out;
    }
    sync_dir(dest_dir);
    report(&x, "done");
out:
    if (x.fd >= 0)
        close(x.fd);
    if (rc && (x.write_errno == ENOSPC || x.write_errno == EDQUOT || x.write_errno == EFBIG))
        unlink(part);
    return rc;
}

/* Bytes still to fetch for the files not in the models folder yet. */
static uint64_t bytes_missing(const hub_plan *plan, const char *staging, const char *dest_dir,
                              bool *done)
{
    uint64_t need = 0;
    for (int i = 0; i < plan->n_files; i++) {
        const hub_file *f = &plan->files[i];
        char path[4096 + HUB_PATH_MAX + 8];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dest_dir, f->name);
        done[i] = !stat(path, &st) && (uint64_t)st.st_size == f->size;
        if (done[i])
            continue;
        snprintf(path, sizeof path, "%s/%s.part", staging, f->name);
        uint64_t have = !stat(path, &st) && (uint64_t)st.st_size <= f->size
                        ? (uint64_t)st.st_size : 0;
        need += f->size - have;
    }
    return need;
}

/* The verified parts of a split model (in the staging folder) joined into
 * one file, renamed into the models folder; the parts are deleted. */
static int join_parts(const hub_config *cfg, const hub_plan *plan, const char *staging)
{
    char paths[HUB_MAX_FILES][4096 + HUB_PATH_MAX + 8], joined[4096 + HUB_PATH_MAX + 8];
    char final[4096 + HUB_PATH_MAX + 8];
    const char *list[HUB_MAX_FILES];
    for (int i = 0; i < plan->n_files; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", staging, plan->files[i].name);
        list[i] = paths[i];
    }
    snprintf(joined, sizeof joined, "%s/%s", staging, plan->set_name);
    snprintf(final, sizeof final, "%s/%s", cfg->models_dir, plan->set_name);
    if (cfg->progress) {
        const hub_file *last = &plan->files[plan->n_files - 1];
        hub_progress p = {
            .phase = "joining", .file = last, .index = plan->n_files - 1,
            .n_files = plan->n_files, .file_done = last->size, .file_total = last->size,
            .done = plan->total_bytes, .total = plan->total_bytes,
        };
        cfg->progress(cfg->arg, &p);
    }
    int rc = cfg->join(list, plan->n_files, joined);
    if (rc) {
        unlink(joined);
        /* a full disk is not the parts' fault: they stay for the next pull */
        return rc_wrap(rc, "joining the parts of %s: ", plan->set_name);
    }
    int fd = open(joined, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd)) {
        rc = rc_fail(RC_EIO, "%s: %s", joined, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(joined);
        return rc;
    }
    close(fd);
    if (rename(joined, final)) {
        rc = rc_fail(RC_EIO, "moving %s into the models folder: %s", joined, strerror(errno));
        unlink(joined);
        return rc;
    }
    sync_dir(cfg->models_dir);
    for (int i = 0; i < plan->n_files; i++)
        unlink(paths[i]);
    return 0;
}

/* The verified parts of a split model moved from the staging folder into
 * the models folder, the first part last: a set is found by its first part
 * (gguf_split_name), so it appears whole or not at all. */
static int place_parts(const hub_config *cfg, const hub_plan *plan, const char *staging)
{
    for (int i = plan->n_files - 1; i >= 0; i--) {
        char from[4096 + HUB_PATH_MAX + 8], to[4096 + HUB_PATH_MAX + 8];
        snprintf(from, sizeof from, "%s/%s", staging, plan->files[i].name);
        snprintf(to, sizeof to, "%s/%s", cfg->models_dir, plan->files[i].name);
        if (rename(from, to))
            return rc_fail(RC_EIO, "moving %s into the models folder: %s", from,
                           strerror(errno));
    }
    sync_dir(cfg->models_dir);
    return 0;
}

int hub_download(const hub_config *cfg, const hub_plan *plan)
{
    if (!cfg->models_dir || !*cfg->models_dir)
        return rc_fail(RC_EINVAL, "no models folder to pull into");
    if (sodium_init() < 0)
        return rc_fail(RC_EIO, "libsodium failed to start");
    char staging[4096];
    snprintf(staging, sizeof staging, "%s/.partial", cfg->models_dir);
    int rc = make_dir(cfg->models_dir);
    if (rc)
        return rc;
    /* a split model's verified parts wait in the staging folder for the
     * join, or to be placed together */
    bool set = plan->n_files > 1, join = set && cfg->join;
    const char *dest = set ? staging : cfg->models_dir;
    char final[4096 + HUB_PATH_MAX + 8];
    struct stat st;
    snprintf(final, sizeof final, "%s/%s", cfg->models_dir,
             join || !set ? plan->set_name : plan->files[0].name);
    if (set && !stat(final, &st) && (join || (uint64_t)st.st_size == plan->files[0].size))
        return 0;   /* joined or placed by an earlier pull */
    bool done[HUB_MAX_FILES];
    uint64_t need = bytes_missing(plan, staging, dest, done);
    struct statvfs vfs;
    if (need && join)
        need += plan->total_bytes;   /* the joined copy, before the parts go */
    if (need && !statvfs(cfg->models_dir, &vfs)) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (avail < need + SPACE_MARGIN_BYTES)
            return rc_fail(RC_ELIMIT, "not enough free space in %s: the download needs %.1f "
                           "MiB (and %u MiB to spare), %.1f MiB are free", cfg->models_dir,
                           (double)need / 1048576.0, SPACE_MARGIN_BYTES >> 20,
                           (double)avail / 1048576.0);
    }
    if ((rc = make_dir(staging)))
        return rc;
    uint64_t before = 0;
    for (int i = 0; i < plan->n_files && !rc; i++) {
        if (!done[i])
            rc = fetch_one(cfg, plan, i, before, staging, dest);
        else if (cfg->progress) {
            hub_progress p = {
                .phase = "done", .file = &plan->files[i], .index = i, .n_files = plan->n_files,
                .file_done = plan->files[i].size, .file_total = plan->files[i].size,
                .done = before + plan->files[i].size, .total = plan->total_bytes,
            };
            cfg->progress(cfg->arg, &p);
        }
        before += plan->files[i].size;
    }
    if (!rc && join)
        rc = join_parts(cfg, plan, staging);
    else if (!rc && set)
        rc = place_parts(cfg, plan, staging);
    /* an empty staging folder goes; one with parts to resume stays */
    rmdir(staging);
    return rc;
}
