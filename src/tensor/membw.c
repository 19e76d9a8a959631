/* membw.c - STREAM-style triad across the thread pool.  Each thread owns a
 * contiguous slice (first-touched by that thread, which matters on NUMA). */
#include "membw.h"
#include "base/mem.h"
#include "base/os.h"

typedef struct {
    float *a, *b, *c;
    long n;
    int init;
} triad_task;

static void triad(void *arg, int ith, int nth)
{
    triad_task *t = arg;
    long i0, i1;
    pool_split(t->n, ith, nth, &i0, &i1);
    if (t->init) {
        for (long i = i0; i < i1; i++) {
            t->a[i] = 0.0f;
            t->b[i] = 1.0f;
            t->c[i] = 2.0f;
        }
        return;
    }
    const float s = 3.0f;
    for (long i = i0; i < i1; i++)
        t->a[i] = t->b[i] + s * t->c[i];
}

double membw_triad(thread_pool *pool, size_t bytes_per_array, int reps)
{
    triad_task t = { 0 };
    t.n = (long)(bytes_per_array / sizeof(float));
    t.a = rc_malloc_aligned(64, bytes_per_array);
    t.b = rc_malloc_aligned(64, bytes_per_array);
    t.c = rc_malloc_aligned(64, bytes_per_array);
    double best = 0.0;
    if (t.a && t.b && t.c) {
        t.init = 1;
        pool_run(pool, triad, &t);
        t.init = 0;
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = os_now_ns();
            pool_run(pool, triad, &t);
            double sec = (double)(os_now_ns() - t0) * 1e-9;
            double rate = 3.0 * (double)t.n * sizeof(float) / sec;
            if (rate > best)
                best = rate;
        }
    }
    rc_free_aligned(t.a);
    rc_free_aligned(t.b);
    rc_free_aligned(t.c);
    return best;
}
