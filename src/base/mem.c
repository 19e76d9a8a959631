/* mem.c - allocation wrapper with an injectable failure for tests. */
#include "mem.h"

#include <stdlib.h>
#include <string.h>

static long fail_countdown = -1;

static int should_fail(void)
{
    if (fail_countdown < 0)
        return 0;
    if (fail_countdown == 0)
        return 1;
    fail_countdown--;
    return 0;
}

void rc_mem_fail_after(long n) { fail_countdown = n; }

void *rc_malloc(size_t bytes)
{
    if (should_fail())
        return NULL;
    return malloc(bytes ? bytes : 1);
}

void *rc_calloc(size_t n, size_t size)
{
    size_t total;
    if (rc_mul_size(n, size, &total) || should_fail())
        return NULL;
    return calloc(total ? total : 1, 1);
}

void *rc_mallocarray(size_t n, size_t size)
{
    size_t total;
    if (rc_mul_size(n, size, &total))
        return NULL;
    return rc_malloc(total);
}

void *rc_realloc(void *p, size_t bytes)
{
    if (should_fail())
        return NULL;
    return realloc(p, bytes ? bytes : 1);
}

char *rc_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = rc_malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *rc_strdup(const char *s) { return rc_strndup(s, strlen(s)); }

void rc_free(void *p) { free(p); }

void *rc_malloc_aligned(size_t align, size_t bytes)
{
    void *p = NULL;
    if (should_fail())
        return NULL;
    /* Round up so the size is a multiple of the alignment, as C11
     * aligned_alloc wants; posix_memalign has no such rule but this keeps
     * SIMD tail loads inside the block. */
    size_t rounded;
    if (rc_add_size(bytes ? bytes : 1, align - 1, &rounded))
        return NULL;
    rounded &= ~(align - 1);
    if (posix_memalign(&p, align, rounded) != 0)
        return NULL;
    return p;
}

void rc_free_aligned(void *p) { free(p); }
