/* test_pool.c - the thread pool runs every share exactly once per task, and
 * what a share wrote is visible to the caller when pool_run returns, also
 * when far more threads than cores compete (shares then move to the caller). */
#include "test.h"
#include "tensor/pool.h"

#include <pthread.h>
#include <stdatomic.h>

enum { MAX_NTH = 8, ROUNDS = 3000, CALLERS = 3 };

typedef struct {
    atomic_int runs[MAX_NTH];   /* how many times each share ran this round */
    long out[MAX_NTH];          /* plain stores: pool_run must publish them */
    long work[MAX_NTH];         /* keeps the uneven busy loop */
    long round;
} task;

static void share(void *ctx, int ith, int nth)
{
    task *t = ctx;
    atomic_fetch_add(&t->runs[ith], 1);
    long acc = 0;
    for (int k = 0; k < 64 * (ith + 1); k++)   /* uneven shares */
        acc += k ^ ith;
    t->work[ith] = acc;
    t->out[ith] = t->round * 1000 + ith * 10 + nth;
}

typedef struct { int nth; int bad; } caller_arg;

static void *caller(void *arg)
{
    caller_arg *a = arg;
    thread_pool *p = pool_new(a->nth);
    if (!p) { a->bad = -1; return NULL; }
    task t;
    memset(&t, 0, sizeof t);
    for (long r = 0; r < ROUNDS && !a->bad; r++) {
        t.round = r;
        for (int i = 0; i < a->nth; i++)
            atomic_store(&t.runs[i], 0);
        pool_run(p, share, &t);
        for (int i = 0; i < a->nth; i++) {
            if (atomic_load(&t.runs[i]) != 1 || t.out[i] != r * 1000 + i * 10 + a->nth) {
                fprintf(stderr, "  pool of %d, round %ld: share %d ran %d times, wrote %ld\n",
                        a->nth, r, i, atomic_load(&t.runs[i]), t.out[i]);
                a->bad = 1;
            }
        }
    }
    pool_free(p);
    return NULL;
}

/* Three callers with pools of 2, 5 and 8 threads at once: 15 threads on
 * whatever cores the machine has, so workers are often descheduled and the
 * callers take their shares. */
TEST_T(pool_shares_once_oversubscribed, 120)
{
    static const int sizes[CALLERS] = { 2, 5, 8 };
    pthread_t th[CALLERS];
    caller_arg args[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        args[i] = (caller_arg){ .nth = sizes[i] };
        CHECK(pthread_create(&th[i], NULL, caller, &args[i]) == 0);
    }
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(args[i].bad, ==, 0);
    }
}

/* A pool of one thread and a NULL pool run the task inline. */
TEST(pool_single_and_null)
{
    task t;
    memset(&t, 0, sizeof t);
    t.round = 7;
    pool_run(NULL, share, &t);
    CHECK_INT(atomic_load(&t.runs[0]), ==, 1);
    CHECK(t.out[0] == 7001);
    thread_pool *p = pool_new(1);
    CHECK(p != NULL);
    CHECK_INT(pool_n_threads(p), ==, 1);
    pool_run(p, share, &t);
    CHECK_INT(atomic_load(&t.runs[0]), ==, 2);
    pool_free(p);
    CHECK_INT(pool_n_threads(NULL), ==, 1);
}
