/* gguf_set.c - split GGUF models read in place: gguf_open and
 * gguf_open_meta open a set NAME-00001-of-0000N.gguf ... by its first
 * part as one gguf_file.
 *
 * Every part is opened as a file of its own (gguf__open_one); the set is a
 * gguf_file that owns them and borrows the first part's metadata (the
 * model's keys live there) and every part's tensor infos, copied in part
 * order into one array so that tensor indices, look-ups by name and
 * gguf_map_tensors work as for one file.  A tensor's `part` says which
 * file holds its bytes and `file_offset` is within that file.
 *
 * The checks are those of gguf_join (the same set joins and loads, or
 * fails with the same kind of message): each part's split.no is its
 * position, split.count and split.tensors.count agree, the parts together
 * hold exactly split.tensors.count tensors and no name twice.  Parts are
 * found by name only (the first part's name with the part number
 * replaced), so a folder holds any number of sets side by side.
 */
#include "model/gguf.h"
#include "model/gguf_internal.h"
#include "base/err.h"
#include "base/mem.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define KEY_COUNT   "split.count"
#define KEY_TENSORS "split.tensors.count"
#define SUFFIX_LEN  20                /* "-00001-of-00003.gguf" */

/* Five decimal digits at s, as a number; -1 if not. */
static long digits5(const char *s)
{
    long v = 0;
    for (int i = 0; i < 5; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

bool gguf_split_name(const char *path, size_t *stem_len, uint32_t *no, uint32_t *count)
{
    size_t n = strlen(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if ((size_t)(path + n - base) <= SUFFIX_LEN)    /* NAME must not be empty */
        return false;
    const char *s = path + n - SUFFIX_LEN;
    if (s[0] != '-' || strncmp(s + 6, "-of-", 4) || strcmp(s + 15, ".gguf"))
        return false;
    long a = digits5(s + 1), b = digits5(s + 10);
    if (a < 1 || b < 1 || a > b)
        return false;
    *stem_len = (size_t)(s - path);
    *no = (uint32_t)a - 1;
    *count = (uint32_t)b;
    return true;
}

int gguf_split_path(const char *path, uint32_t no, uint32_t count, char *out, size_t cap)
{
    size_t stem;
    uint32_t n0, c0;
    if (!gguf_split_name(path, &stem, &n0, &c0) || no >= count || count > GGUF_SPLIT_MAX)
        return rc_fail(RC_EINVAL, "%s: not a part of a split model "
                       "(NAME-00001-of-00003.gguf)", path);
    if ((size_t)snprintf(out, cap, "%.*s-%05u-of-%05u.gguf", (int)stem, path, no + 1, count) >=
        cap)
        return rc_fail(RC_ELIMIT, "%s: the path is too long", path);
    return 0;
}

bool gguf_split_find(const char *dir, const char *name, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t n = strlen(name), stem;
    uint32_t no, count;
    bool found = false;
    while (d && !found && (de = readdir(d)))
        found = !strncmp(de->d_name, name, n) &&
                gguf_split_name(de->d_name, &stem, &no, &count) && stem == n && no == 0 &&
                (size_t)snprintf(out, cap, "%s/%s", dir, de->d_name) < cap;
    if (d)
        closedir(d);
    return found;
}

int gguf_split_set_bytes(const char *path, uint64_t *bytes)
{
    size_t stem;
    uint32_t no, count;
    char p[4096];
    struct stat st;
    *bytes = 0;
    if (!gguf_split_name(path, &stem, &no, &count))
        return rc_fail(RC_EINVAL, "%s: not a part of a split model", path);
    for (uint32_t i = 0; i < count; i++) {
        int rc = gguf_split_path(path, i, count, p, sizeof p);
        if (rc)
            return rc;
        if (stat(p, &st) || !S_ISREG(st.st_mode))
            return rc_fail(RC_ENOTFOUND, "%s: part %u of %u of the split model is missing", p,
                           i + 1, count);
        *bytes += (uint64_t)st.st_size;
    }
    return 0;
}

/* Opens parts 1..count-1 beside `first` (part 0, already open, taken) and
 * builds the set. */
static int open_rest(gguf_file *first, uint32_t count, uint32_t n_tensors, bool meta,
                     gguf_file **out)
{
    gguf_file *set = rc_calloc(1, sizeof *set);
    int rc = 0;
    if (!set || !(set->parts = rc_calloc(count, sizeof *set->parts)) ||
        !(set->path = rc_strdup(first->path))) {
        gguf_close(first);
        gguf_close(set);
        return rc_fail(RC_ENOMEM, "%s: out of memory opening a split model", first->path);
    }
    set->parts[0] = first;
    set->n_parts = 1;
    uint64_t total = first->n_tensors;
    for (uint32_t i = 1; i < count && !rc; i++) {
        char p[4096];
        uint32_t no, cnt, tensors;
        struct stat st;
        if ((rc = gguf_split_path(first->path, i, count, p, sizeof p)))
            break;
        if (stat(p, &st) != 0) {
            rc = rc_fail(RC_ENOTFOUND, "%s: part %u of %u of the split model %s is missing", p,
                         i + 1, count, first->path);
            break;
        }
        if ((rc = gguf__open_one(p, meta, &set->parts[i])))
            break;
        set->n_parts++;
        if ((rc = gguf__split_keys(set->parts[i], &no, &cnt, &tensors)))
            break;
        if (no != i || cnt != count || tensors != n_tensors) {
            rc = rc_fail(RC_EFORMAT, "%s: part %u of %u (of %u tensors) where part %u of %u (of "
                         "%u tensors) was expected", p, no + 1, cnt, tensors, i + 1, count,
                         n_tensors);
            break;
        }
        total += set->parts[i]->n_tensors;
    }
    if (!rc && total != n_tensors)
        rc = rc_fail(RC_EFORMAT, "%s: the %u parts hold %llu tensors, %u announced by %s",
                     first->path, count, (unsigned long long)total, n_tensors, KEY_TENSORS);
    if (!rc && !(set->tensors = rc_calloc(total ? (size_t)total : 1, sizeof *set->tensors)))
        rc = rc_fail(RC_ENOMEM, "%s: out of memory opening a split model", first->path);
    if (rc) {
        gguf_close(set);
        return rc;
    }
    uint64_t k = 0;
    for (uint32_t i = 0; i < count; i++)
        for (uint64_t j = 0; j < set->parts[i]->n_tensors; j++) {
            set->tensors[k] = set->parts[i]->tensors[j];
            set->tensors[k++].part = i;
        }
    set->n_tensors = total;
    set->version = first->version;
    set->n_kv = first->n_kv;
    set->kv = first->kv;
    set->kv_index = first->kv_index;
    set->alignment = first->alignment;
    set->data_offset = first->data_offset;
    set->base = first->base;
    for (uint32_t i = 0; i < count; i++)
        set->size_bytes += set->parts[i]->size_bytes;
    uint64_t a, b;
    if ((rc = gguf__index_tensors(set, &a, &b)) == 0 && a < total)
        rc = rc_fail(RC_EFORMAT, "%s: tensor '%s' is in two parts (%s and %s)", first->path,
                     set->tensors[a].name, set->parts[set->tensors[a].part]->path,
                     set->parts[set->tensors[b].part]->path);
    if (rc) {
        gguf_close(set);
        return rc;
    }
    *out = set;
    return 0;
}

static int open_model(const char *path, bool meta, gguf_file **out)
{
    gguf_file *f;
    uint32_t no, count, tensors;
    *out = NULL;
    int rc = gguf__open_one(path, meta, &f);
    if (rc)
        return rc;
    if (!gguf_get(f, KEY_COUNT) || (!gguf_get_u32(f, KEY_COUNT, &count) && count == 1)) {
        *out = f;
        return 0;
    }
    char first[4096];
    size_t stem;
    uint32_t name_no, name_count;
    if ((rc = gguf__split_keys(f, &no, &count, &tensors)))
        goto fail;
    if (count == 0 || count > GGUF_SPLIT_MAX || no >= count) {
        rc = rc_fail(RC_EFORMAT, "%s: part %u of %u of a split model is not a valid part number",
                     path, no + 1, count);
        goto fail;
    }
    if (!gguf_split_name(path, &stem, &name_no, &name_count) || name_no != no ||
        name_count != count) {
        rc = rc_fail(RC_EFORMAT, "%s: part %u of %u of a split model, but its name is not "
                     "NAME-%05u-of-%05u.gguf (its other parts are found by that name)", path,
                     no + 1, count, no + 1, count);
        goto fail;
    }
    if (no != 0) {
        if (gguf_split_path(path, 0, count, first, sizeof first))
            snprintf(first, sizeof first, "its first part");
        rc = rc_fail(RC_EFORMAT, "%s is part %u of %u of a split model: open the model by its "
                     "first part, %s", path, no + 1, count, first);
        goto fail;
    }
    return open_rest(f, count, tensors, meta, out);
fail:
    gguf_close(f);
    return rc;
}

int gguf_open(const char *path, gguf_file **out)
{
    return open_model(path, false, out);
}

int gguf_open_meta(const char *path, gguf_file **out)
{
    return open_model(path, true, out);
}
