/* mem.h - the one allocation wrapper.
 *
 * All heap memory of racimo goes through these functions so that tests can
 * make the N-th allocation fail (rc_mem_fail_after) and check that every
 * error path cleans up.  Sizes given as counts are multiplied with overflow
 * checks; an overflow is reported as an allocation failure.
 */
#ifndef RC_MEM_H
#define RC_MEM_H

#include <stddef.h>
#include <stdint.h>

void *rc_malloc(size_t bytes);
void *rc_calloc(size_t n, size_t size);          /* zeroed, n*size checked */
void *rc_mallocarray(size_t n, size_t size);     /* n*size checked */
void *rc_realloc(void *p, size_t bytes);
char *rc_strdup(const char *s);
char *rc_strndup(const char *s, size_t n);
void  rc_free(void *p);                          /* accepts NULL */

/* Memory aligned to `align` (a power of two, >= sizeof(void*)), for SIMD
 * activations.  Free with rc_free_aligned. */
void *rc_malloc_aligned(size_t align, size_t bytes);
void  rc_free_aligned(void *p);

/* Test hook: after `n` more successful allocations every allocation fails;
 * n < 0 turns the failure off.  Not thread safe; for single-threaded tests. */
void rc_mem_fail_after(long n);

/* Overflow-checked arithmetic on sizes: 0 on success, -1 on overflow. */
static inline int rc_mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int rc_add_size(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline int rc_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int rc_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

#endif
