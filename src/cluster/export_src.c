/* export_src.c - the bytes a node serves for one listed model (exports.h).
 *
 * One file is read through the descriptor opened when it was listed.  A
 * split set (NAME-00001-of-0000N.gguf ...) is served as the one file
 * `racimo join` would write from it (gguf_joined_view): the joined head
 * from memory, each tensor's bytes from its part's descriptor, zeros
 * between tensors.  So a set and its joined file are the same bytes, have
 * one content digest, and a peer pulls either into one NAME.gguf; the
 * weight messages do not know the difference.
 *
 * A source is shared by the exports table and the requests reading it
 * (reference counted, the count atomic), so a scan may drop it while a
 * read still runs.  Nothing in it changes after export_src_open, so any
 * thread may read through it.
 */
#include "exports.h"

#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef unsigned long long ull;

/* A tensor of a set, where the joined file has it and where its part does. */
typedef struct {
    uint64_t joined_off, bytes, part_off;
    uint32_t part;
} segment;

struct export_src {
    atomic_int refs;
    int n_fds;
    int *fds;                      /* one, or the parts' in order */
    export_stat ident, st;
    uint64_t head;                 /* bytes before the data section */
    gguf_joined view;              /* sets only */
    segment *seg;                  /* sets: by joined_off */
    uint64_t n_seg;
};

int export_ident(const char *path, export_stat *out)
{
    struct stat st;
    size_t stem;
    uint32_t no, count;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return rc_fail(RC_EIO, "%s: not a readable file", path);
    *out = exports_stat(&st);
    if (!gguf_split_name(path, &stem, &no, &count) || count == 1)
        return 0;
    /* a set: any part replaced changes the sum of mtimes or the inodes */
    for (uint32_t i = 1; i < count; i++) {
        char p[PATH_MAX];
        int rc = gguf_split_path(path, i, count, p, sizeof p);
        if (rc)
            return rc;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            return rc_fail(RC_ENOTFOUND, "%s: part %u of %u is missing", p, i + 1, count);
        out->size += (uint64_t)st.st_size;
        out->mtime_ns += (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        out->ino ^= (uint64_t)st.st_ino * (2 * (uint64_t)i + 1);
    }
    return 0;
}

/* The head of one file: parsed from its descriptor, not from the path. */
static int file_head(const export_src *s, const char *path, uint64_t *head)
{
    char fdpath[PATH_MAX];
#ifdef __linux__
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", s->fds[0]);
#else
    snprintf(fdpath, sizeof fdpath, "%s", path);
#endif
    gguf_file *f = NULL;
    int rc = gguf_open_meta(fdpath, &f);
    if (!rc)
        *head = f->data_offset;
    gguf_close(f);
    return rc ? rc_wrap(rc, "%s: ", path) : 0;
}

static int cmp_seg(const void *a, const void *b)
{
    const segment *x = a, *y = b;
    return x->joined_off < y->joined_off ? -1 : x->joined_off > y->joined_off;
}

/* A set: every part opened, the joined view built from their heads. */
static int set_open(export_src *s, gguf_file *set)
{
    int rc = 0;
    if (!(s->fds = rc_calloc(set->n_parts, sizeof *s->fds)) ||
        !(s->seg = rc_calloc(set->n_tensors ? (size_t)set->n_tensors : 1, sizeof *s->seg)))
        return rc_fail(RC_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < set->n_parts; i++)
        s->fds[i] = -1;
    s->n_fds = (int)set->n_parts;
    for (uint32_t i = 0; i < set->n_parts && !rc; i++) {
        struct stat st;
        if ((s->fds[i] = open(set->parts[i]->path, O_RDONLY | O_CLOEXEC)) < 0 ||
            fstat(s->fds[i], &st) != 0 || (uint64_t)st.st_size != set->parts[i]->size_bytes)
            rc = rc_fail(RC_EIO, "%s: cannot open (or it changed)", set->parts[i]->path);
    }
    if (rc || (rc = gguf_joined_view(set, &s->view)))
        return rc;
    for (uint64_t i = 0; i < set->n_tensors; i++)
        s->seg[i] = (segment){ s->view.offset[i], set->tensors[i].size_bytes,
                               set->tensors[i].file_offset, set->tensors[i].part };
    s->n_seg = set->n_tensors;
    qsort(s->seg, (size_t)s->n_seg, sizeof *s->seg, cmp_seg);
    s->head = s->view.head_bytes;
    s->st.size = s->view.size_bytes;
    return 0;
}

int export_src_open(const char *path, export_src **out)
{
    *out = NULL;
    export_src *s = rc_calloc(1, sizeof *s);
    if (!s)
        return rc_fail(RC_ENOMEM, "out of memory");
    atomic_init(&s->refs, 1);
    size_t stem;
    uint32_t no, count;
    int rc = export_ident(path, &s->ident);
    s->st = s->ident;
    if (!rc && gguf_split_name(path, &stem, &no, &count) && count > 1) {
        gguf_file *set = NULL;
        if (!(rc = gguf_open_meta(path, &set)))
            rc = set_open(s, set);
        gguf_close(set);
    } else if (!rc) {
        struct stat st;
        if (!(s->fds = rc_calloc(1, sizeof *s->fds))) {
            rc = rc_fail(RC_ENOMEM, "out of memory");
        } else {
            /* resolved here, once: later reads go through this descriptor,
             * whatever the name points to by then */
            s->n_fds = 1;
            if ((s->fds[0] = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(s->fds[0], &st) != 0 ||
                !S_ISREG(st.st_mode))
                rc = rc_fail(RC_EIO, "%s: cannot open: %s", path, strerror(errno));
            else
                s->ident = s->st = exports_stat(&st);
            if (!rc && file_head(s, path, &s->head))
                s->head = 0;          /* listed anyway: a request says what is wrong */
        }
    }
    if (rc) {
        export_src_unref(s);
        return rc;
    }
    *out = s;
    return 0;
}

export_src *export_src_ref(export_src *s)
{
    atomic_fetch_add(&s->refs, 1);
    return s;
}

void export_src_unref(export_src *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    for (int i = 0; i < s->n_fds; i++)
        if (s->fds[i] >= 0)
            close(s->fds[i]);
    rc_free(s->fds);
    rc_free(s->seg);
    gguf_joined_free(&s->view);
    rc_free(s);
}

export_stat export_src_stat(const export_src *s) { return s->st; }
export_stat export_src_ident(const export_src *s) { return s->ident; }
int export_src_fd(const export_src *s) { return s->fds[0]; }

int export_src_head(const export_src *s, const char *path, uint64_t *head)
{
    /* a file whose head did not parse when listed says why now */
    *head = s->head;
    return s->head ? 0 : file_head(s, path, head);
}

/* A set's bytes [off, off + len): head, tensors, zeros between. */
static int set_read(const export_src *s, uint8_t *buf, size_t len, uint64_t off)
{
    while (len) {
        size_t n;
        if (off < s->view.head_bytes) {
            n = s->view.head_bytes - off < len ? (size_t)(s->view.head_bytes - off) : len;
            memcpy(buf, s->view.head + off, n);
        } else {
            /* the last segment starting at or before off */
            uint64_t lo = 0, hi = s->n_seg;
            while (lo < hi) {
                uint64_t mid = lo + (hi - lo) / 2;
                if (s->seg[mid].joined_off <= off)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            const segment *g = lo ? &s->seg[lo - 1] : NULL;
            if (g && off < g->joined_off + g->bytes) {
                uint64_t in = off - g->joined_off;
                n = g->bytes - in < len ? (size_t)(g->bytes - in) : len;
                if (os_pread_full(s->fds[g->part], buf, n, g->part_off + in))
                    return -1;
            } else {
                uint64_t next = lo < s->n_seg ? s->seg[lo].joined_off : s->st.size;
                n = next - off < len ? (size_t)(next - off) : len;
                memset(buf, 0, n);
            }
        }
        buf += n;
        off += n;
        len -= n;
    }
    return 0;
}

int export_src_pread(const export_src *s, void *buf, size_t len, uint64_t off)
{
    if (off > s->st.size || len > s->st.size - off) {
        errno = 0;
        return -1;
    }
    if (!s->n_seg && !s->view.head)
        return os_pread_full(s->fds[0], buf, len, off);
    return set_read(s, buf, len, off);
}
