/* cli_util.c - helpers shared by the subcommands. */
#include "cli.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/kv_types.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_error(const char *what)
{
    fprintf(stderr, "racimo: %s%s%s\n", what ? what : "", what ? ": " : "", rc_errmsg());
    return 1;
}

int cli_parse_cache_type(const char *cmd, const char *v, int *type)
{
    if (v && !kv_type_parse(v, type))
        return 0;
    fprintf(stderr, "racimo: %s: --cache-type takes " KV_TYPE_NAMES ", not '%s'\n", cmd,
            v ? v : "(nothing)");
    return -1;
}

int cli_cache_type(int given, bool exact)
{
    return given >= 0 ? given : exact ? TT_F32 : KV_TYPE_DEFAULT;
}

int cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    static const struct { const char *unit; double mul; } units[] = {
        { "", 1 }, { "b", 1 },
        { "k", 1024.0 }, { "kib", 1024.0 }, { "kb", 1e3 },
        { "m", 1048576.0 }, { "mib", 1048576.0 }, { "mb", 1e6 },
        { "g", 1073741824.0 }, { "gib", 1073741824.0 }, { "gb", 1e9 },
        { "t", 1099511627776.0 }, { "tib", 1099511627776.0 }, { "tb", 1e12 },
    };
    if (!s || !((*s >= '0' && *s <= '9') || *s == '.'))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return -1;
    char unit[8];
    size_t n = strlen(end);
    if (n >= sizeof unit)
        return -1;
    for (size_t i = 0; i <= n; i++)
        unit[i] = (char)(end[i] >= 'A' && end[i] <= 'Z' ? end[i] - 'A' + 'a' : end[i]);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(unit, units[i].unit))
            continue;
        double b = v * units[i].mul;
        if (!(b >= 1) || b >= 9.2e18)
            return -1;
        *out = (uint64_t)b;
        return 0;
    }
    return -1;
}

int cli_parse_ids(const char *s, int32_t **out)
{
    int n = 1, k = 0;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    int32_t *ids = rc_mallocarray((size_t)n, sizeof *ids);
    if (!ids)
        return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "racimo: bad token id list at '%s' (want numbers like 1,2,3)\n", p);
            rc_free(ids);
            return -1;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!k) {
        fprintf(stderr, "racimo: empty token id list\n");
        rc_free(ids);
        return -1;
    }
    *out = ids;
    return k;
}

int cli_default_threads(void) { return os_n_physical_cores(); }

char *cli_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = rc_malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = rc_realloc(buf, cap * 2);
            if (!nb) {
                rc_free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}
