/* exports.c - the table of listed model files (exports.h).
 *
 * The table is replaced whole by each scan under `mu`; exports_open hands
 * out a dup of an entry's descriptor, so a scan may close the entry's own
 * descriptor while a request still reads through its copy.
 */
#include "exports.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/gguf.h"
#include "model/model_size.h"
#include "model/ranges.h"
#include "tensor/types.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_EXPORTS 1024

typedef struct {
    char name[EXPORTS_NAME_MAX + 1];
    char path[PATH_MAX];
    export_src *src;              /* NULL: held back by the allow-list (not opened) */
    export_stat st;               /* export_src_stat; before opening, export_ident */
    char family[32];              /* general.architecture ("" when unreadable) */
    char type[16];                /* the weight type holding the most bytes ("" unknown) */
    char sha256[65];              /* the sha256 `racimo pull` verified ("" unknown) */
} entry;

struct exports {
    pthread_mutex_t mu;
    char *models_dir, *ro_dirs, *allow;     /* allow: ",a,b," or NULL (all) */
    char *sets_noted;                       /* ",a,b,": names logged once (note_once) */
    entry *e;
    int n;
};

int exports_check_name(const char *name)
{
    size_t n = strlen(name);
    bool bad = n == 0 || n > EXPORTS_NAME_MAX || name[0] == '.' || strchr(name, '/') ||
               strchr(name, '\\') || strstr(name, "..");
    for (size_t i = 0; i < n && !bad; i++)
        bad = (unsigned char)name[i] < 0x20 || name[i] == 0x7f;
    if (!bad)
        return 0;
    bool printable = n <= EXPORTS_NAME_MAX;
    for (size_t i = 0; i < n && printable; i++)
        printable = (unsigned char)name[i] >= 0x20 && name[i] != 0x7f;
    return rc_fail(RC_EINVAL, "model name '%s' is not a plain file name (no '/', '..', leading "
                   "'.' or control characters, 1 to %d bytes)",
                   printable ? name : "(unprintable)", EXPORTS_NAME_MAX);
}

static bool allowed(const exports *e, const char *name)
{
    if (!e->allow)
        return true;
    size_t n = strlen(name);
    for (const char *p = strstr(e->allow, name); p; p = strstr(p + 1, name))
        if (p > e->allow && p[-1] == ',' && p[n] == ',')
            return true;
    return false;
}

int exports_new(const char *models_dir, const char *ro_dirs, const char *allow, exports **out)
{
    *out = NULL;
    exports *e = rc_calloc(1, sizeof *e);
    if (!e)
        return rc_fail(RC_ENOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    e->models_dir = rc_strdup(models_dir ? models_dir : "");
    e->ro_dirs = rc_strdup(ro_dirs ? ro_dirs : "");
    int rc = 0;
    if (allow && *allow) {
        /* ",a,b," so that a look-up is one strstr of ",name," */
        size_t n = strlen(allow);
        if ((e->allow = rc_malloc(n + 3))) {
            snprintf(e->allow, n + 3, ",%s,", allow);
            for (char *p = e->allow + 1, *q; *p && !rc; p = q + 1) {
                q = strchr(p, ',');
                *q = 0;
                rc = *p ? exports_check_name(p) : 0;
                *q = ',';
            }
            if (rc)
                rc_wrap(rc, "--export: ");
        }
    }
    if (!rc && (!e->models_dir || !e->ro_dirs || (allow && *allow && !e->allow)))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    if (rc) {
        exports_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

static void close_all(entry *v, int n)
{
    for (int i = 0; i < n; i++)
        export_src_unref(v[i].src);
}

void exports_free(exports *e)
{
    if (!e)
        return;
    close_all(e->e, e->n);
    rc_free(e->e);
    rc_free(e->models_dir);
    rc_free(e->ro_dirs);
    rc_free(e->allow);
    rc_free(e->sets_noted);
    pthread_mutex_destroy(&e->mu);
    rc_free(e);
}

export_stat exports_stat(const struct stat *st)
{
    return (export_stat){ .size = (uint64_t)st->st_size,
                          .mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 +
                                      st->st_mtim.tv_nsec,
                          .dev = (uint64_t)st->st_dev, .ino = (uint64_t)st->st_ino };
}

static bool same_stat(const export_stat *a, const export_stat *b)
{
    return a->size == b->size && a->mtime_ns == b->mtime_ns && a->dev == b->dev &&
           a->ino == b->ino;
}

/* The old entry's source of `name` when it still describes the same file
 * (x->st: its export_ident now; the old table stays whole until it is
 * replaced). */
static export_src *take_old(exports *e, entry *x)
{
    export_src *src = NULL;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n; i++)
        if (e->e[i].src && !strcmp(e->e[i].name, x->name)) {
            export_stat id = export_src_ident(e->e[i].src);
            if (!same_stat(&id, &x->st))
                break;
            src = export_src_ref(e->e[i].src);
            x->st = e->e[i].st;
            memcpy(x->family, e->e[i].family, sizeof x->family);
            memcpy(x->type, e->e[i].type, sizeof x->type);
            memcpy(x->sha256, e->e[i].sha256, sizeof x->sha256);
            break;
        }
    pthread_mutex_unlock(&e->mu);
    return src;
}

/* What a listing shows of a file first seen, for people choosing a model
 * (the dashboard, `racimo ls`): its architecture and weight type (from
 * the GGUF head, read once) and the sha256 `racimo pull` recorded beside
 * it (an attribute of the file, on file systems that keep them).  Left
 * empty for a file that does not parse: it is listed anyway, and loading
 * it says what is wrong. */
static void read_sha256(entry *x);

static void describe(entry *x)
{
    gguf_file *f = NULL;
    if (gguf_open_meta(x->path, &f) == 0) {
        gguf_str arch;
        if (!gguf_get_str(f, "general.architecture", &arch)) {
            size_t n = arch.len < sizeof x->family - 1 ? (size_t)arch.len : sizeof x->family - 1;
            for (size_t i = 0; i < n; i++)       /* text from a file: printable ASCII only */
                x->family[i] = arch.ptr[i] > 32 && arch.ptr[i] < 127 ? arch.ptr[i] : '?';
            x->family[n] = 0;
        }
        const char *t = tensor_type_name(model_main_type(f));
        snprintf(x->type, sizeof x->type, "%s", t ? t : "");
        gguf_close(f);
    }
    read_sha256(x);
}

/* The sha256 attribute of a listed file.  Read again at each scan while it
 * is missing: a copy from peers gets it once checked, after it is listed. */
static void read_sha256(entry *x)
{
    char v[65];
    size_t stem;
    uint32_t no, count;
    /* a set's parts each have their own sha256: none names the model */
    if (!gguf_split_name(x->path, &stem, &no, &count) &&
        os_file_tag_get(export_src_fd(x->src), "sha256", v, 64) == 64 &&
        strspn(v, "0123456789abcdef") == 64) {
        memcpy(x->sha256, v, 64);
        x->sha256[64] = 0;
    }
}

/* Was `name` held back by the last scan too (then it is not logged again)? */
static bool was_private(exports *e, const char *name)
{
    bool yes = false;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n && !yes; i++)
        yes = !e->e[i].src && !strcmp(e->e[i].name, name);
    pthread_mutex_unlock(&e->mu);
    return yes;
}

/* Logs `msg` about `name` once per process (a scan runs every few
 * seconds). */
static void note_once(exports *e, const char *name, const char *msg)
{
    char key[EXPORTS_NAME_MAX + 3];
    snprintf(key, sizeof key, ",%s,", name);
    pthread_mutex_lock(&e->mu);
    bool noted = e->sets_noted && strstr(e->sets_noted, key);
    if (!noted) {
        size_t old = e->sets_noted ? strlen(e->sets_noted) : 0;
        char *grown = rc_realloc(e->sets_noted, old + strlen(key) + 1);
        if (grown) {
            snprintf(grown + (old ? old - 1 : 0), strlen(key) + 1, "%s", key);
            e->sets_noted = grown;
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (!noted)
        rc_log(LOG_WARN, "weights: model '%s' is not listed: %s", name, msg);
}

/* The model name of file `file` (len bytes before ".gguf"): its name, or
 * for a split set's first part the set's; false for the other parts (the
 * set is listed once, by its first part). */
static bool model_name_of(const char *file, size_t len, char *out, size_t cap)
{
    size_t stem;
    uint32_t no, count;
    if (gguf_split_name(file, &stem, &no, &count)) {
        if (no != 0)
            return false;
        len = stem;
    }
    snprintf(out, cap, "%.*s", (int)(len < cap ? len : cap - 1), file);
    return len < cap;
}

static void scan_dir(exports *e, const char *dir, entry *v, int *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) && *n < MAX_EXPORTS) {
        size_t len = strlen(de->d_name);
        if (len <= 5 || strcmp(de->d_name + len - 5, ".gguf"))
            continue;
        entry x = { .src = NULL };
        char man[PATH_MAX + 16];
        bool dup = false;
        if (!model_name_of(de->d_name, len - 5, x.name, sizeof x.name))
            continue;
        for (int i = 0; i < *n && !dup; i++)
            dup = !strcmp(v[i].name, x.name);
        if (dup || exports_check_name(x.name) ||
            (size_t)snprintf(x.path, sizeof x.path, "%s/%s", dir, de->d_name) >= sizeof x.path ||
            model_ranges_path(x.path, man, sizeof man) || access(man, F_OK) == 0)
            continue;
        if (export_ident(x.path, &x.st)) {
            if (strcmp(x.name, de->d_name))        /* a set with a part missing */
                note_once(e, x.name, rc_errmsg());
            continue;
        }
        if (!allowed(e, x.name)) {
            if (!was_private(e, x.name))
                rc_log(LOG_INFO, "weights: model '%s' stays private to this node (not in the "
                       "--export list)", x.name);
            v[(*n)++] = x;
            continue;
        }
        if (!(x.src = take_old(e, &x))) {
            if (export_src_open(x.path, &x.src)) {
                if (strcmp(x.name, de->d_name))
                    note_once(e, x.name, rc_errmsg());
                continue;
            }
            x.st = export_src_stat(x.src);
            describe(&x);
        } else if (!x.sha256[0]) {
            read_sha256(&x);
        }
        v[(*n)++] = x;
    }
    closedir(d);
}

json_t *exports_scan(exports *e)
{
    entry *v = rc_calloc(MAX_EXPORTS, sizeof *v);
    json_t *arr = json_array();
    if (!v || !arr) {
        rc_free(v);
        json_decref(arr);
        return NULL;
    }
    int n = 0;
    if (*e->models_dir)
        scan_dir(e, e->models_dir, v, &n);
    for (const char *p = e->ro_dirs; *p;) {
        size_t k = strcspn(p, ":");
        char dir[PATH_MAX];
        if (k && k < sizeof dir) {
            memcpy(dir, p, k);
            dir[k] = 0;
            scan_dir(e, dir, v, &n);
        }
        p += k;
        if (*p == ':')
            p++;
    }
    for (int i = 0; i < n; i++)
        if (v[i].src)
            json_array_append_new(arr, json_pack("{s:s, s:I, s:s*, s:s*, s:s*}", "name", v[i].name,
                                                 "size_bytes", (json_int_t)v[i].st.size,
                                                 "family", v[i].family[0] ? v[i].family : NULL,
                                                 "type", v[i].type[0] ? v[i].type : NULL,
                                                 "sha256", v[i].sha256[0] ? v[i].sha256 : NULL));
    pthread_mutex_lock(&e->mu);
    entry *old = e->e;
    int n_old = e->n;
    e->e = v;
    e->n = n;
    pthread_mutex_unlock(&e->mu);
    close_all(old, n_old);
    rc_free(old);
    return arr;
}

int exports_open(exports *e, const char *name, export_src **src, export_stat *st, char *path,
                 size_t cap)
{
    int rc = rc_fail(RC_ENOTFOUND, "model '%s' is not among the models this node lists", name);
    *src = NULL;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n; i++) {
        const entry *x = &e->e[i];
        if (strcmp(x->name, name))
            continue;
        if (!x->src) {
            rc = rc_fail(RC_ESTATE, "model '%s' is not exported by this node (its racimo serve "
                         "--export list)", name);
        } else {
            *src = export_src_ref(x->src);
            *st = x->st;
            if (path)
                snprintf(path, cap, "%s", x->path);
            rc = 0;
        }
        break;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}
