/* os_posix.c - os.h for Linux and macOS. */
#include "os.h"
#include "err.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <mach/mach.h>
#include <sys/sysctl.h>
#endif

int os_map_file(const char *path, os_map *out)
{
    struct stat st;
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rc_fail(RC_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return rc_fail(RC_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rc_fail(RC_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return rc_fail(RC_EIO, "%s: cannot map: %s", path, strerror(e));
        }
        out->data = p;
        out->size_bytes = (size_t)st.st_size;
        out->map_addr = p;
        out->map_bytes = (size_t)st.st_size;
    }
    close(fd);   /* the mapping keeps the file open */
    return 0;
}

void os_unmap(os_map *m)
{
    if (m && m->map_addr)
        munmap(m->map_addr, m->map_bytes);
    if (m)
        memset(m, 0, sizeof *m);
}

int os_file_open(const char *path, os_file *out)
{
    struct stat st;
    out->fd = -1;
    out->size_bytes = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rc_fail(RC_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return rc_fail(RC_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rc_fail(RC_EIO, "%s: not a regular file", path);
    }
    out->fd = fd;
    out->size_bytes = (uint64_t)st.st_size;
    return 0;
}

void os_file_close(os_file *f)
{
    if (f && f->fd >= 0)
        close(f->fd);
    if (f)
        f->fd = -1;
}

int os_file_map(const os_file *f, uint64_t off, uint64_t len, const char *what, os_map *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return 0;
    if (off > f->size_bytes || len > f->size_bytes - off)
        return rc_fail(RC_EINVAL, "%s: bytes [%llu, %llu) lie outside the file of %llu bytes",
                       what, (unsigned long long)off, (unsigned long long)(off + len),
                       (unsigned long long)f->size_bytes);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = off & ~(page - 1), bytes = len + (off - start);
    if ((size_t)bytes != bytes)
        return rc_fail(RC_ENOMEM, "%s: %llu bytes do not fit the address space", what,
                       (unsigned long long)bytes);
    void *p = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, f->fd, (off_t)start);
    if (p == MAP_FAILED) {
        int e = errno;
        if (e == ENOMEM)
            return rc_fail(RC_ENOMEM, "%s: cannot map %.1f MB at byte %llu: out of memory "
                           "(address space exhausted: %s)", what, (double)bytes / 1e6,
                           (unsigned long long)start, strerror(e));
        return rc_fail(RC_EIO, "%s: cannot map %llu bytes at byte %llu: %s", what,
                       (unsigned long long)bytes, (unsigned long long)start, strerror(e));
    }
    out->data = (const uint8_t *)p + (off - start);
    out->size_bytes = (size_t)len;
    out->map_addr = p;
    out->map_bytes = (size_t)bytes;
    return 0;
}

void os_map_willneed(const os_map *m, size_t off, size_t len)
{
    if (!m->data || off >= m->size_bytes)
        return;
    long page = sysconf(_SC_PAGESIZE);
    size_t start = off & ~((size_t)page - 1);
    if (len > m->size_bytes - off)
        len = m->size_bytes - off;
    madvise((void *)(m->data + start), len + (off - start), MADV_WILLNEED);
}

void os_mem_drop(const void *p, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = a + len;
    a = (a + page - 1) & ~(page - 1);
    b &= ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

void os_mem_hugepages(void *p, size_t len)
{
#if defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)p + len) & ~(huge - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)len;
#endif
}

uint64_t os_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int os_n_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int os_n_physical_cores(void)
{
#if defined(__APPLE__)
    int n = 0;
    size_t len = sizeof n;
    if (sysctlbyname("hw.physicalcpu", &n, &len, NULL, 0) == 0 && n > 0)
        return n;
    return os_n_cpus();
#else
    /* Count distinct (package, core) pairs; SMT siblings share one. */
    int logical = os_n_cpus(), seen = 0;
    int ids[1024];
    for (int cpu = 0; cpu < logical && cpu < 1024; cpu++) {
        char path[128];
        int pkg = 0, core = 0;
        FILE *f;
        snprintf(path, sizeof path,
                 "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        if (!(f = fopen(path, "r")))
            return logical;
        if (fscanf(f, "%d", &core) != 1)
            core = cpu;
        fclose(f);
        snprintf(path, sizeof path,
                 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%d", &pkg) != 1)
                pkg = 0;
            fclose(f);
        }
        int id = pkg * 65536 + core, dup = 0;
        for (int i = 0; i < seen; i++)
            dup |= ids[i] == id;
        if (!dup)
            ids[seen++] = id;
    }
    return seen > 0 ? seen : logical;
#endif
}

uint64_t os_total_memory_bytes(void)
{
#if defined(__APPLE__)
    uint64_t mem = 0;
    size_t len = sizeof mem;
    sysctlbyname("hw.memsize", &mem, &len, NULL, 0);
    return mem;
#else
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
#endif
}

uint64_t os_available_memory_bytes(void)
{
#if defined(__APPLE__)
    vm_statistics64_data_t vs;
    mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
    if (host_statistics64(mach_host_self(), HOST_VM_INFO64,
                          (host_info64_t)&vs, &count) != KERN_SUCCESS)
        return 0;
    return ((uint64_t)vs.free_count + vs.inactive_count) * (uint64_t)vm_page_size;
#else
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lu kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
#endif
}

uint64_t os_peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
#if defined(__APPLE__)
    return (uint64_t)ru.ru_maxrss;          /* bytes on macOS */
#else
    return (uint64_t)ru.ru_maxrss * 1024;   /* kilobytes on Linux */
#endif
}

uint64_t os_current_rss_bytes(void)
{
#if defined(__APPLE__)
    struct mach_task_basic_info info;
    mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
    if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO,
                  (task_info_t)&info, &count) != KERN_SUCCESS)
        return 0;
    return info.resident_size;
#else
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
#endif
}

void os_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int os_udp_want_meta(int fd)
{
    int one = 1, r = 0;
#ifdef IP_RECVTTL
    r |= setsockopt(fd, IPPROTO_IP, IP_RECVTTL, &one, sizeof one);
#endif
#ifdef IP_PKTINFO
    r |= setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
#endif
    return r ? -1 : 0;
}

long os_udp_recv(int fd, void *buf, size_t cap, struct sockaddr_in *from, os_udp_meta *meta)
{
    union {
        struct cmsghdr align;
        char b[256];
    } ctl;
    struct iovec iov = { .iov_base = buf, .iov_len = cap };
    struct msghdr mh = { .msg_name = from, .msg_namelen = sizeof *from, .msg_iov = &iov,
                         .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b };
    meta->ttl = -1;
    meta->ifindex = 0;
    ssize_t n = recvmsg(fd, &mh, 0);
    if (n < 0)
        return -1;
    if (mh.msg_namelen < sizeof *from || from->sin_family != AF_INET)
        memset(from, 0, sizeof *from);     /* the caller refuses a sender it cannot place */
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != IPPROTO_IP)
            continue;
        size_t len = cm->cmsg_len - CMSG_LEN(0);
#if defined(IP_TTL) || defined(IP_RECVTTL)
        /* Linux says IP_TTL with an int; the BSDs and macOS IP_RECVTTL with a byte */
        bool is_ttl = false;
#ifdef IP_TTL
        is_ttl = is_ttl || cm->cmsg_type == IP_TTL;
#endif
#ifdef IP_RECVTTL
        is_ttl = is_ttl || cm->cmsg_type == IP_RECVTTL;
#endif
        if (is_ttl) {
            if (len >= sizeof(int)) {
                int t;
                memcpy(&t, CMSG_DATA(cm), sizeof t);
                meta->ttl = t;
            } else if (len >= 1) {
                meta->ttl = *(const unsigned char *)CMSG_DATA(cm);
            }
        }
#endif
#ifdef IP_PKTINFO
        if (cm->cmsg_type == IP_PKTINFO && len >= sizeof(struct in_pktinfo)) {
            struct in_pktinfo pi;
            memcpy(&pi, CMSG_DATA(cm), sizeof pi);
            meta->ifindex = (int)pi.ipi_ifindex;
        }
#endif
    }
    return (long)n;
}

int os_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0;
            return -1;
        }
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int os_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t r = pwrite(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Linux keeps unprivileged attributes in the "user." namespace; macOS has
 * no namespaces and two more arguments (position, options). */
static void tag_name(const char *name, char *out, size_t cap)
{
#if defined(__APPLE__)
    snprintf(out, cap, "racimo.%s", name);
#else
    snprintf(out, cap, "user.racimo.%s", name);
#endif
}

int os_file_tag_set(int fd, const char *name, const void *value, size_t len)
{
    char full[128];
    tag_name(name, full, sizeof full);
#if defined(__APPLE__)
    return fsetxattr(fd, full, value, len, 0, 0);
#else
    return fsetxattr(fd, full, value, len, 0);
#endif
}

long os_file_tag_get(int fd, const char *name, void *value, size_t cap)
{
    char full[128];
    tag_name(name, full, sizeof full);
#if defined(__APPLE__)
    return (long)fgetxattr(fd, full, value, cap, 0, 0);
#else
    return (long)fgetxattr(fd, full, value, cap);
#endif
}
