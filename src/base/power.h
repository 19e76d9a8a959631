/* power.h - how much power this machine draws, from the energy counters the
 * operating system exposes (Linux powercap: Intel and AMD RAPL under
 * /sys/class/powercap).  A machine without readable counters (macOS, VMs,
 * an unprivileged user on kernels that restrict energy_uj) measures
 * nothing, and the cost figures fall back to racimo serve --watts.
 */
#ifndef RC_POWER_H
#define RC_POWER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char root[256];          /* the powercap folder */
    bool have;               /* a previous reading exists */
    uint64_t last_uj;        /* sum of the package counters at last_ns */
    uint64_t range_uj;       /* where the sum wraps to 0 (sum of max_energy_range_uj) */
    uint64_t last_ns;
    double watts;            /* the last measure, < 0 until there is one */
    uint64_t retry_ns;       /* no counters: not looked for again before then */
} power_meter;

/* root: the powercap folder (NULL: /sys/class/powercap; tests give another). */
void power_meter_init(power_meter *m, const char *root);

/* Reads the counters of every top-level RAPL zone (intel-rapl:N: a CPU
 * package; its subzones are parts of it and not added) at now_ns.  From the
 * second reading on, returns the mean power in W since the previous one (a
 * counter that wrapped is counted across its range); < 0 while there is
 * nothing to measure (no readable counter, first reading, no time passed).
 * Without readable counters the folder is looked at again only after
 * POWER_RETRY_S (a VM has none: no folder scan every second for nothing).
 * Not thread safe: one meter per thread. */
#define POWER_RETRY_S 60
double power_meter_sample(power_meter *m, uint64_t now_ns);

#endif
