/* pool.h - a fixed set of worker threads that run one task at a time.
 *
 * pool_run(p, fn, ctx) calls fn(ctx, ith, nth) exactly once for each ith =
 * 0..nth-1 and returns when all are done: share 0 on the caller's thread,
 * share i on worker i, or on the caller when worker i has not started it by
 * the time the caller is free (a loaded machine).  So a share must not wait
 * for another share.  Kernels split their work by (ith, nth) and never see
 * the pool.  One pool_run at a time per pool (the forward pass owns its pool).
 */
#ifndef RC_POOL_H
#define RC_POOL_H

typedef struct thread_pool thread_pool;
typedef void (*pool_task_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1 means no extra threads).  NULL on failure with detail. */
thread_pool *pool_new(int n_threads);
void pool_free(thread_pool *p);                 /* accepts NULL */
int  pool_n_threads(const thread_pool *p);      /* 1 for a NULL pool */

/* Runs the task on every thread.  A NULL pool runs fn(ctx, 0, 1). */
void pool_run(thread_pool *p, pool_task_fn fn, void *ctx);

/* [*start, *end) of n items for thread ith of nth, in contiguous chunks. */
static inline void pool_split(long n, int ith, int nth, long *start, long *end)
{
    long per = (n + nth - 1) / nth;
    *start = per * ith < n ? per * ith : n;
    *end = *start + per < n ? *start + per : n;
}

#endif
