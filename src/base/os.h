/* os.h - the small interface to the operating system.
 *
 * Everything that differs between Linux and macOS (file mapping, clocks,
 * memory and CPU counts, resident memory) is behind these calls; the
 * implementation is os_posix.c, with the few platform differences inside
 * that one file.
 */
#ifndef RC_OS_H
#define RC_OS_H

#include <stddef.h>
#include <stdint.h>

/* A read-only mapping of a whole file or of a byte range of one. */
typedef struct {
    const uint8_t *data;   /* NULL for an empty file */
    size_t size_bytes;
    void  *map_addr;       /* private: page-aligned start and length to unmap */
    size_t map_bytes;
} os_map;

/* A file open for mapping parts of it (the descriptor stays open). */
typedef struct {
    int      fd;           /* -1 when closed */
    uint64_t size_bytes;
} os_file;

/* Maps `path` read-only.  Errors (missing file, a directory, I/O) return a
 * negative code with a detail naming the path. */
int  os_map_file(const char *path, os_map *out);
void os_unmap(os_map *m);                       /* accepts a zeroed map */

/* Opens a regular file read-only for os_file_map; errors name the path. */
int  os_file_open(const char *path, os_file *out);
void os_file_close(os_file *f);                 /* accepts a closed file */

/* Maps bytes [off, off + len) of an open file read-only (off need not be
 * page aligned).  RC_ENOMEM when the address space is exhausted (e.g. by
 * RLIMIT_AS), RC_EIO otherwise; `what` names the file in messages. */
int  os_file_map(const os_file *f, uint64_t off, uint64_t len, const char *what, os_map *out);

/* Advises the kernel that [off, off+len) of a mapping will be needed soon. */
void os_map_willneed(const os_map *m, size_t off, size_t len);

/* This process no longer needs the pages lying wholly inside [p, p + len)
 * of a read-only file mapping: they leave its resident set (the file's page
 * cache keeps them; touching them again maps them back). */
void os_mem_drop(const void *p, size_t len);

/* Asks that the anonymous memory wholly inside [p, p + len) be backed by
 * huge pages where the system offers them (Linux transparent huge pages:
 * the 2 MiB-aligned stretches inside the range); call it before the pages
 * are first written.  Why: memory streamed once per token (weights) is read
 * markedly faster without a TLB miss every 4 KiB, most of all in virtual
 * machines, where each miss walks two page tables.  Only advice: nothing
 * happens where unsupported, and nothing is allocated or freed. */
void os_mem_hugepages(void *p, size_t len);

/* Reads / writes exactly len bytes at off (retrying short transfers and
 * EINTR); 0, or -1 with errno (0 at end of file). */
int os_pread_full(int fd, void *buf, size_t len, uint64_t off);
int os_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);

uint64_t os_now_ns(void);                       /* monotonic clock */
void     os_sleep_ms(int ms);
int      os_n_cpus(void);                       /* online logical CPUs, >= 1 */
int      os_n_physical_cores(void);             /* >= 1; falls back to logical */
uint64_t os_total_memory_bytes(void);
uint64_t os_available_memory_bytes(void);
uint64_t os_peak_rss_bytes(void);               /* of this process */
uint64_t os_current_rss_bytes(void);            /* 0 where unknown */

/* UDP with what the IP header said, for a receiver that must know whether
 * a datagram came from its own link (multicast DNS, RFC 6762 §11).
 * os_udp_want_meta asks the kernel of an IPv4 socket for the TTL and the
 * arrival interface of each datagram (0, or -1 with errno).  os_udp_recv
 * receives one datagram (non-blocking socket: -1 with errno EAGAIN when
 * none) into buf; its length is returned, and the sender, the IP TTL (-1
 * where the platform does not tell) and the arrival interface index (0 when
 * unknown) are stored. */
/* A short tag kept with a file by the file system (an extended attribute,
 * "user.racimo.NAME" on Linux, "racimo.NAME" on macOS): `racimo pull`
 * records the sha256 it verified.  Set: 0, or -1 with errno (ENOTSUP on
 * file systems without attributes; callers go on without).  Get: the
 * tag's length (at most cap bytes read), or -1 with errno. */
int  os_file_tag_set(int fd, const char *name, const void *value, size_t len);
long os_file_tag_get(int fd, const char *name, void *value, size_t cap);

struct sockaddr_in;
typedef struct {
    int ttl;
    int ifindex;
} os_udp_meta;
int  os_udp_want_meta(int fd);
long os_udp_recv(int fd, void *buf, size_t cap, struct sockaddr_in *from, os_udp_meta *meta);

#endif
