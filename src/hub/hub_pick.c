/* hub_pick.c - from a model name to the files to fetch: parsing the names
 * Ollama accepts for Hugging Face models, and choosing the GGUF file (or
 * the parts of a split one) of a repository's tree listing by quantisation
 * tag.  Pure functions over strings, so they are tested without a network.
 */
#include "hub/hub.h"
#include "base/err.h"
#include "base/log.h"

#include <jansson.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool repo_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

int hub_parse_ref(const char *name, hub_ref *out)
{
    memset(out, 0, sizeof *out);
    if (!name || !*name)
        return rc_fail(RC_EINVAL, "no model name");
    const char *prefixes[] = { "https://", "http://" };
    for (size_t i = 0; i < 2; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            name += strlen(prefixes[i]);
    const char *hosts[] = { "hf.co/", "huggingface.co/", "www.huggingface.co/" };
    for (size_t i = 0; i < 3; i++)
        if (!strncasecmp(name, hosts[i], strlen(hosts[i]))) {
            name += strlen(hosts[i]);
            break;
        }
    /* ORG/REPO, then :QUANT */
    const char *slash = strchr(name, '/');
    const char *colon = strchr(name, ':');
    size_t repo_len = colon ? (size_t)(colon - name) : strlen(name);
    if (!slash || slash == name || (size_t)(slash - name) + 1 >= repo_len ||
        memchr(slash + 1, '/', repo_len - (size_t)(slash - name) - 1) ||
        repo_len >= sizeof out->repo)
        return rc_fail(RC_EINVAL, "'%s' is not a Hugging Face repository: expected "
                       "hf.co/ORG/REPO[:QUANT] or ORG/REPO", name);
    for (size_t i = 0; i < repo_len; i++)
        if (name[i] != '/' && !repo_char(name[i]))
            return rc_fail(RC_EINVAL, "'%.*s': a repository name holds letters, digits, "
                           "'-', '_' and '.' only", (int)repo_len, name);
    memcpy(out->repo, name, repo_len);
    if (colon) {
        const char *q = colon + 1;
        if (!*q || strlen(q) >= sizeof out->quant)
            return rc_fail(RC_EINVAL, "'%s': the tag after ':' is empty or too long", name);
        for (const char *p = q; *p; p++)
            if (!repo_char(*p))
                return rc_fail(RC_EINVAL, "'%s': a quantisation tag holds letters, digits, "
                               "'-', '_' and '.' only", name);
        /* ":latest" is what Ollama clients add to a bare name */
        if (strcasecmp(q, "latest"))
            snprintf(out->quant, sizeof out->quant, "%s", q);
    }
    return 0;
}

/* The position of " -NNNNN-of-MMMMM.gguf" at the end of a name, with the
 * part number and count; -1 when the name is not a split part. */
static long split_suffix(const char *name, int *no, int *count)
{
    size_t len = strlen(name);
    /* "-00001-of-00003.gguf" is 20 characters */
    if (len < 20 || strcmp(name + len - 5, ".gguf"))
        return -1;
    const char *s = name + len - 20;
    if (s[0] != '-' || strncmp(s + 6, "-of-", 4))
        return -1;
    for (int i = 1; i <= 5; i++)
        if (!isdigit((unsigned char)s[i]) || !isdigit((unsigned char)s[9 + i]))
            return -1;
    *no = atoi(s + 1);
    *count = atoi(s + 10);
    if (*no < 1 || *count < 1 || *no > *count)
        return -1;
    return (long)(len - 20);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Whether `tag` is a whole word of `name`, case-insensitively: not preceded
 * by a letter or digit, not followed by a letter, digit or '_' (so that
 * Q4_K is not found in Q4_K_M, while model_Q4_K_M matches Q4_K_M). */
static bool has_tag(const char *name, const char *tag)
{
    size_t n = strlen(name), t = strlen(tag);
    for (size_t i = 0; t && i + t <= n; i++) {
        if (strncasecmp(name + i, tag, t))
            continue;
        if (i > 0 && isalnum((unsigned char)name[i - 1]))
            continue;
        char after = name[i + t];
        if (isalnum((unsigned char)after) || after == '_')
            continue;
        return true;
    }
    return false;
}

static bool is_projector(const char *name)
{
    return strncasecmp(name, "mmproj", 6) == 0 || strstr(name, "mmproj") != NULL;
}

/* The set a file belongs to: its path without the split suffix. */
static void set_key(const char *path, char *out, size_t cap)
{
    int no, count;
    long cut = split_suffix(path, &no, &count);
    snprintf(out, cap, "%.*s", cut < 0 ? (int)strlen(path) : (int)cut, path);
}

static int add_entry(json_t *e, hub_plan *out)
{
    if (out->n_files >= HUB_MAX_FILES)
        return rc_fail(RC_ELIMIT, "more than %d parts", HUB_MAX_FILES);
    hub_file *f = &out->files[out->n_files];
    memset(f, 0, sizeof *f);
    const char *path = json_string_value(json_object_get(e, "path"));
    json_t *lfs = json_object_get(e, "lfs");
    json_t *size = json_object_get(lfs ? lfs : e, "size");
    const char *oid = json_string_value(json_object_get(lfs, "oid"));
    if (!json_is_integer(size) || json_integer_value(size) < 0)
        return rc_fail(RC_EFORMAT, "the listing gives no size for %s", path);
    const char *name = base_name(path);
    if (strlen(path) >= sizeof f->path || name[0] == '.')
        return rc_fail(RC_EFORMAT, "the listing names a file racimo will not write: %s",
                       log_clean(path));
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\')
            return rc_fail(RC_EFORMAT, "the listing names a file racimo will not write: %s",
                           log_clean(path));
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->size = (uint64_t)json_integer_value(size);
    if (oid) {
        if (strlen(oid) != 64 || strspn(oid, "0123456789abcdefABCDEF") != 64)
            return rc_fail(RC_EFORMAT, "the listing's sha256 of %s is not 64 hex digits", path);
        for (int i = 0; i < 64; i++)
            f->sha256[i] = (char)tolower((unsigned char)oid[i]);
    }
    out->total_bytes += f->size;
    out->n_files++;
    return 0;
}

/* Collects the set `key` (all its parts, in order) into out. */
static int take_set(json_t *tree, const char *key, hub_plan *out)
{
    int want = 0;
    for (int part = 1;; part++) {
        bool found = false;
        size_t i;
        json_t *e;
        json_array_foreach(tree, i, e) {
            const char *path = json_string_value(json_object_get(e, "path"));
            char k[HUB_PATH_MAX];
            int no = 0, count = 0;
            if (!path)
                continue;
            set_key(path, k, sizeof k);
            if (strcmp(k, key))
                continue;
            if (split_suffix(path, &no, &count) < 0) {
                if (part > 1)
                    continue;
                return add_entry(e, out);   /* a single file */
            }
            if (no != part)
                continue;
            if (want && count != want)
                return rc_fail(RC_EFORMAT, "the parts of %s disagree on their count", key);
            want = count;
            int rc = add_entry(e, out);
            if (rc)
                return rc;
            found = true;
            break;
        }
        if (!found)
            return rc_fail(RC_ENOTFOUND, "%s: part %d of %d is missing from the repository",
                           key, part, want);
        if (part == want)
            return 0;
    }
}

static bool is_gguf_file(json_t *e)
{
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *path = json_string_value(json_object_get(e, "path"));
    size_t len = path ? strlen(path) : 0;
    /* ".gguf" exactly: the model scans take nothing else */
    return path && (!type || !strcmp(type, "file")) && len > 5 && !strcmp(path + len - 5, ".gguf");
}

/* A list of the repository's GGUF sets for error messages. */
static void list_sets(json_t *tree, char *out, size_t cap)
{
    size_t i, used = 0;
    json_t *e;
    out[0] = 0;
    json_array_foreach(tree, i, e) {
        int no, count;
        const char *path = json_string_value(json_object_get(e, "path"));
        if (!is_gguf_file(e) || (split_suffix(path, &no, &count) >= 0 && no != 1))
            continue;
        int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", base_name(path));
        if (w < 0 || (size_t)w >= cap - used) {
            if (cap > 4)
                snprintf(out + cap - 4, 4, "...");
            return;
        }
        used += (size_t)w;
    }
    if (!used)
        snprintf(out, cap, "none");
}

/* The sets (split parts count once) of the GGUF files named `file`, or
 * tagged `tag`, or any model when both are NULL: the first into key, a
 * second one (an ambiguity) into other. */
static void find_sets(json_t *tree, const char *file, const char *tag, char key[HUB_PATH_MAX],
                      char other[HUB_PATH_MAX])
{
    size_t i;
    json_t *e;
    json_array_foreach(tree, i, e) {
        if (!is_gguf_file(e))
            continue;
        const char *path = json_string_value(json_object_get(e, "path"));
        const char *name = base_name(path);
        bool hit = file ? !strcmp(path, file) || !strcmp(name, file)
                        : !is_projector(name) && (!tag || has_tag(name, tag));
        if (!hit)
            continue;
        char k[HUB_PATH_MAX];
        set_key(path, k, sizeof k);
        if (!key[0])
            snprintf(key, HUB_PATH_MAX, "%s", k);
        else if (strcmp(key, k) && !other[0])
            snprintf(other, HUB_PATH_MAX, "%s", k);
    }
}

int hub_pick(const char *tree_json, const hub_ref *ref, const char *file, hub_plan *out)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *tree = json_loads(tree_json, 0, &jerr);
    int rc = 0;
    char avail[1024];
    if (!json_is_array(tree)) {
        rc = rc_fail(RC_EFORMAT, "%s: the tree listing is not a JSON array (%s)", ref->repo,
                     tree ? "another JSON value" : jerr.text);
        goto out;
    }
    list_sets(tree, avail, sizeof avail);
    char key[HUB_PATH_MAX] = "", other[HUB_PATH_MAX] = "";
    const char *tag = ref->quant[0] ? ref->quant : NULL;
    find_sets(tree, file, file || tag ? tag : "Q4_K_M", key, other);
    if (!file && !tag && !key[0]) {
        /* no Q4_K_M: the repository's only model, if it has one */
        find_sets(tree, NULL, NULL, key, other);
        if (other[0]) {
            rc = rc_fail(RC_EINVAL, "%s has several GGUF models and none tagged Q4_K_M: "
                         "name one with :QUANT or --file (%s)", ref->repo, avail);
            goto out;
        }
    }
    if (!key[0]) {
        rc = file ? rc_fail(RC_ENOTFOUND, "%s has no GGUF file %s (it has: %s)", ref->repo,
                            file, avail)
                  : rc_fail(RC_ENOTFOUND, "%s has no GGUF file tagged %s (it has: %s)",
                            ref->repo, tag ? tag : "Q4_K_M", avail);
        goto out;
    }
    if (other[0]) {
        rc = rc_fail(RC_EINVAL, "%s: the tag %s matches both %s and %s: name the file with "
                     "--file", ref->repo, tag ? tag : "Q4_K_M", base_name(key),
                     base_name(other));
        goto out;
    }
    snprintf(out->repo, sizeof out->repo, "%s", ref->repo);
    rc = take_set(tree, key, out);
    if (!rc && out->n_files > 1 && (!*base_name(key) || *base_name(key) == '.'))
        rc = rc_fail(RC_EFORMAT, "the split model %s has no name before its part numbers",
                     log_clean(key));
    if (!rc && out->n_files > 1)
        snprintf(out->set_name, sizeof out->set_name, "%.*s.gguf", HUB_PATH_MAX - 8,
                 base_name(key));
    else if (!rc)
        memcpy(out->set_name, out->files[0].name, sizeof out->set_name);
    for (int f = 0; !rc && f < out->n_files; f++)
        for (int g = 0; g < f; g++)
            if (!strcmp(out->files[f].name, out->files[g].name))
                rc = rc_fail(RC_EFORMAT, "two parts share the name %s", out->files[f].name);
out:
    json_decref(tree);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}

void hub_model_name(const hub_config *cfg, const hub_plan *plan, char *out, size_t cap)
{
    (void)cfg;                  /* joined or not, a set is served by its set name */
    const char *n = plan->n_files > 1 ? plan->set_name
                  : plan->n_files ? plan->files[0].name : "";
    size_t len = strlen(n);
    if (len > 5 && !strcasecmp(n + len - 5, ".gguf"))
        len -= 5;
    snprintf(out, cap, "%.*s", (int)len, n);
}
