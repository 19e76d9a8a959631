/* power.c - RAPL energy counters through Linux powercap (power.h).  On
 * other systems the folder does not exist and nothing is measured: the
 * code is plain POSIX directory reading. */
#include "base/power.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void power_meter_init(power_meter *m, const char *root)
{
    memset(m, 0, sizeof *m);
    snprintf(m->root, sizeof m->root, "%s", root ? root : "/sys/class/powercap");
    m->watts = -1;
}

static bool read_u64(const char *path, uint64_t *v)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fscanf(f, "%" SCNu64, v) == 1;
    fclose(f);
    return ok;
}

/* A top-level zone: "intel-rapl:N" with N digits only (subzones are
 * "intel-rapl:N:M"). */
static bool top_zone(const char *name)
{
    const char *p = name + strlen("intel-rapl:");
    if (strncmp(name, "intel-rapl:", strlen("intel-rapl:")) || !*p)
        return false;
    return strspn(p, "0123456789") == strlen(p);
}

/* The sum of the zones' counters and of their ranges; false when none
 * could be read. */
static bool read_counters(const char *root, uint64_t *uj, uint64_t *range)
{
    DIR *d = opendir(root);
    if (!d)
        return false;
    *uj = *range = 0;
    int n = 0;
    struct dirent *e;
    char path[600];
    while ((e = readdir(d))) {
        if (!top_zone(e->d_name))
            continue;
        uint64_t v, r;
        snprintf(path, sizeof path, "%s/%s/energy_uj", root, e->d_name);
        if (!read_u64(path, &v))
            continue;
        snprintf(path, sizeof path, "%s/%s/max_energy_range_uj", root, e->d_name);
        if (!read_u64(path, &r) || r < v)
            r = 0;
        *uj += v;
        *range += r;
        n++;
    }
    closedir(d);
    return n > 0;
}

double power_meter_sample(power_meter *m, uint64_t now_ns)
{
    uint64_t uj, range;
    if (now_ns < m->retry_ns)
        return m->watts = -1;
    if (!read_counters(m->root, &uj, &range)) {
        m->have = false;
        m->retry_ns = now_ns + POWER_RETRY_S * 1000000000ull;
        return m->watts = -1;
    }
    double w = -1;
    if (m->have && now_ns > m->last_ns) {
        /* one counter wrapping makes the sum smaller: add back its range
         * (with several packages this is an approximation until the next
         * reading, as good as the range allows) */
        uint64_t d = uj >= m->last_uj ? uj - m->last_uj
                     : range > m->last_uj ? range - m->last_uj + uj : 0;
        w = (double)d * 1e-6 / ((double)(now_ns - m->last_ns) * 1e-9);
    }
    m->have = true;
    m->last_uj = uj;
    m->range_uj = range;
    m->last_ns = now_ns;
    if (w >= 0)
        m->watts = w;
    return m->watts;
}
