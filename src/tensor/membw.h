/* membw.h - the memory bandwidth generation can reach on this machine, the
 * yardstick `racimo bench` holds generation to and what a node publishes
 * for placement.
 *
 * Generation streams every weight byte once per token and writes next to
 * nothing: each thread reads its share of a matrix as one sequential run
 * of memory.  So the measure is the same: the pool's threads each read a
 * contiguous slice of a buffer far larger than the caches, read only,
 * once per pass, counting each byte read once.  (A STREAM triad, what this
 * measured before, is a different load: it writes a third of its traffic,
 * counts 3 arrays where write-allocate moves 4, and as plain C it ran
 * below the memory's speed; generation then came out at up to 190% of its
 * "roof".) */
#ifndef RC_MEMBW_H
#define RC_MEMBW_H

#include <stddef.h>
#include <stdint.h>
#include "pool.h"

/* Reads a buffer of `bytes` (make it several times the last-level cache;
 * 512 MiB is plenty), on huge pages where the system has them (as the
 * weights a node repacks), first touched by the threads that read it,
 * `reps` times on the pool's threads; returns the best rate in bytes/s
 * (bytes of the buffer over the time of one pass), or 0 when the buffer
 * cannot be had. */
double membw_read(thread_pool *pool, size_t bytes, int reps);

/* One read pass over [buf, buf + bytes) split among the pool's threads as
 * membw_read does; returns the XOR of all 8-byte words of the buffer (in
 * host byte order; a last partial word padded with zero bytes), so a test
 * can tell that every byte was read exactly once. */
uint64_t membw_read_pass(thread_pool *pool, const void *buf, size_t bytes);

#endif
