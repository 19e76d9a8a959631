/* ranges.c - the verified-ranges manifest of a partial model file (ranges.h). */
#include "ranges.h"
#include "base/err.h"
#include "base/mem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int model_ranges_path(const char *model_path, char *out, size_t cap)
{
    size_t n = strlen(model_path);
    if (n >= 5 && !strcmp(model_path + n - 5, ".part"))
        n -= 5;
    int w = snprintf(out, cap, "%.*s.ranges", (int)n, model_path);
    if (w < 0 || (size_t)w >= cap)
        return rc_fail(RC_ELIMIT, "%s: path too long", model_path);
    return 0;
}

int model_ranges_add(model_ranges *r, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    /* first range that ends at or after start: it may merge */
    size_t i = 0;
    while (i < r->n && r->r[i][1] < start)
        i++;
    size_t j = i;
    while (j < r->n && r->r[j][0] <= end) {
        if (r->r[j][0] < start)
            start = r->r[j][0];
        if (r->r[j][1] > end)
            end = r->r[j][1];
        j++;
    }
    if (j > i) {                    /* ranges i..j-1 become one */
        r->r[i][0] = start;
        r->r[i][1] = end;
        memmove(&r->r[i + 1], &r->r[j], (r->n - j) * sizeof r->r[0]);
        r->n -= j - i - 1;
        return 0;
    }
    if (r->n >= MODEL_RANGES_MAX)
        return rc_fail(RC_ELIMIT, "more than %d verified ranges", MODEL_RANGES_MAX);
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        void *p = rc_realloc(r->r, cap * sizeof r->r[0]);
        if (!p)
            return rc_fail(RC_ENOMEM, "out of memory for verified ranges");
        r->r = p;
        r->cap = cap;
    }
    memmove(&r->r[i + 1], &r->r[i], (r->n - i) * sizeof r->r[0]);
    r->r[i][0] = start;
    r->r[i][1] = end;
    r->n++;
    return 0;
}

bool model_ranges_covers(const model_ranges *r, uint64_t start, uint64_t end)
{
    if (start >= end)
        return true;
    for (size_t i = 0; i < r->n; i++)
        if (r->r[i][0] <= start && end <= r->r[i][1])
            return true;
    return false;
}

int model_ranges_read(const char *path, model_ranges *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? rc_fail(RC_ENOTFOUND, "%s: no such manifest", path)
                               : rc_fail(RC_EIO, "%s: cannot open: %s", path, strerror(errno));
    char line[128];
    int rc = 0, version = 0;
    unsigned long line_no = 0;
    bool have_size = false;
    uint64_t prev_end = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        uint64_t a, b;
        char extra;
        line_no++;
        if (line_no == 1) {
            if (sscanf(line, "racimo-ranges %d %c", &version, &extra) != 1 || version != 1)
                rc = rc_fail(RC_EFORMAT, "%s: line 1: expected 'racimo-ranges 1'", path);
        } else if (!have_size) {
            if (sscanf(line, "size %" SCNu64 " %c", &a, &extra) != 1)
                rc = rc_fail(RC_EFORMAT, "%s: line 2: expected 'size <bytes>'", path);
            out->file_bytes = a;
            have_size = true;
        } else if (sscanf(line, "%" SCNu64 " %" SCNu64 " %c", &a, &b, &extra) != 2 || a >= b ||
                   b > out->file_bytes || (out->n && a < prev_end)) {
            rc = rc_fail(RC_EFORMAT, "%s: line %lu: expected an ascending byte range "
                         "'<start> <end>' within the file's %" PRIu64 " bytes",
                         path, line_no, out->file_bytes);
        } else {
            rc = model_ranges_add(out, a, b);
            prev_end = b;
        }
    }
    if (!rc && ferror(f))
        rc = rc_fail(RC_EIO, "%s: read error", path);
    if (!rc && !have_size)
        rc = rc_fail(RC_EFORMAT, "%s: truncated manifest (no size line)", path);
    fclose(f);
    if (rc)
        model_ranges_free(out);
    return rc;
}

int model_ranges_write(const char *path, const model_ranges *r)
{
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return rc_fail(RC_ELIMIT, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return rc_fail(RC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f, "racimo-ranges 1\nsize %" PRIu64 "\n", r->file_bytes);
    for (size_t i = 0; i < r->n; i++)
        fprintf(f, "%" PRIu64 " %" PRIu64 "\n", r->r[i][0], r->r[i][1]);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return rc_fail(RC_EIO, "%s: cannot write", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return rc_fail(RC_EIO, "%s: cannot rename into place: %s", path, strerror(e));
    }
    return 0;
}

void model_ranges_free(model_ranges *r)
{
    if (!r)
        return;
    rc_free(r->r);
    memset(r, 0, sizeof *r);
}
