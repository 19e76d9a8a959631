/* pool.c - worker threads woken by a generation counter.
 *
 * The caller publishes (fn, ctx) and bumps `generation`; workers wait for a
 * new generation, run their share, and count down `pending`.  Workers spin
 * briefly before sleeping on the condition variable: a forward pass issues
 * hundreds of short tasks per token, and a sleep/wake per task would cost
 * more than the task.
 *
 * A share is claimed before it runs (claimed[ith] moves from the previous
 * generation to this one), and the caller, done with share 0, claims and
 * runs every share no worker has started.  On a machine with more runnable
 * threads than cores a worker may wait milliseconds for a time slice; the
 * caller waiting for it after every task made a loaded machine decode up to
 * 90 times slower.  Now it waits only for shares already under way.
 */
#include "pool.h"
#include "base/err.h"
#include "base/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* A spin-wait hint: lets the other hardware thread of the core run, and
 * costs the waiter nothing it needs. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ volatile("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

struct thread_pool {
    int n_threads;
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint generation;
    atomic_int pending;
    atomic_int stop;
    atomic_uint *claimed;       /* per share: the last generation it ran in */
    pool_task_fn fn;
    void *ctx;
};

typedef struct { thread_pool *p; int ith; } worker_arg;
static worker_arg *args_of(thread_pool *p) { return (worker_arg *)(p->threads + p->n_threads); }

#define SPIN_ROUNDS 20000

/* Every share of generation g - 1 was claimed before generation g began,
 * so the one compare-exchange from g - 1 to g succeeds once per share; a
 * worker that read g late, after the caller moved on, finds g or later and
 * leaves it. */
static bool claim(thread_pool *p, int ith, unsigned g)
{
    unsigned prev = g - 1;
    return atomic_compare_exchange_strong_explicit(&p->claimed[ith], &prev, g,
                                                   memory_order_acq_rel, memory_order_relaxed);
}

static void finish_share(thread_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker(void *arg)
{
    thread_pool *p = ((worker_arg *)arg)->p;
    int ith = ((worker_arg *)arg)->ith;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen
               && !atomic_load(&p->stop) && spins < SPIN_ROUNDS) {
            CPU_RELAX();
            spins++;
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        if (claim(p, ith, g)) {
            p->fn(p->ctx, ith, p->n_threads);
            finish_share(p);
        }
    }
}

thread_pool *pool_new(int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    thread_pool *p = rc_calloc(1, sizeof *p);
    if (!p)
        goto nomem;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = rc_calloc((size_t)n_threads, sizeof(pthread_t) + sizeof(worker_arg));
    p->claimed = rc_calloc((size_t)n_threads, sizeof *p->claimed);
    if (!p->threads || !p->claimed)
        goto nomem;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = &args_of(p)[i];
        a->p = p;
        a->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, a) != 0) {
            rc_fail(RC_ENOMEM, "cannot start worker thread %d", i);
            pool_free(p);
            return NULL;
        }
        p->n_started = i;
    }
    return p;
nomem:
    rc_fail(RC_ENOMEM, "out of memory creating a thread pool of %d", n_threads);
    pool_free(p);
    return NULL;
}

void pool_free(thread_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    rc_free(p->threads);
    rc_free(p->claimed);
    rc_free(p);
}

int pool_n_threads(const thread_pool *p) { return p ? p->n_threads : 1; }

void pool_run(thread_pool *p, pool_task_fn fn, void *ctx)
{
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    unsigned g = atomic_fetch_add_explicit(&p->generation, 1, memory_order_release) + 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n_threads);
    for (int i = 1; i < p->n_threads; i++)
        if (claim(p, i, g)) {
            fn(ctx, i, p->n_threads);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
        }
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && spins < SPIN_ROUNDS) {
        CPU_RELAX();
        spins++;
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
