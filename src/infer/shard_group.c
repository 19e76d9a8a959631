/* shard_group.c - in-process tensor-parallel shards (see shard_group.h).
 *
 * A sum: every shard publishes a pointer to its part and waits at a
 * barrier; each then adds all parts in shard order into a buffer of its own
 * (so all get the same numbers, as on the cluster), waits again so that no
 * part is overwritten while another shard still reads it, and copies its
 * sum back.  A forward pass runs a thread per shard; the first shard's
 * thread is the caller's.
 */
#include "shard_group.h"
#include "base/err.h"
#include "base/mem.h"
#include "tensor/fp16.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct member member;

struct shard_group {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    unsigned long round;
    float *part[SHARD_GROUP_MAX];
    bool f16;
    long sums;
    member *m;
    /* the start of a forward pass: no shard runs until all threads exist */
    bool go, abort;
};

struct member {
    shard_group *g;
    int rank;
    model *mdl;
    stage *st;
    float *sum;              /* [n_batch][n_embd] */
    float *out;              /* [n_batch][n_vocab] this shard's columns */
    const stage_batch *b;
    int rc, n_out;
    char err[256];
};

static void barrier(shard_group *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned long round = g->round;
    if (++g->waiting == g->n) {
        g->waiting = 0;
        g->round++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (round == g->round)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static int mem_reduce(void *ud, float *x, int n_rows, int width)
{
    member *me = ud;
    shard_group *g = me->g;
    const size_t n = (size_t)n_rows * (size_t)width;
    if (g->f16)
        for (size_t i = 0; i < n; i++)
            x[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
    g->part[me->rank] = x;
    barrier(g);
    for (size_t i = 0; i < n; i++) {
        float acc = g->part[0][i];
        for (int r = 1; r < g->n; r++)
            acc += g->part[r][i];
        me->sum[i] = acc;
    }
    barrier(g);
    memcpy(x, me->sum, n * sizeof(float));
    if (me->rank == 0)
        g->sums++;
    return 0;
}

int shard_group_new(const char *path, int n, const stage_params *p, bool f16, shard_group **out)
{
    *out = NULL;
    if (n < 2 || n > SHARD_GROUP_MAX)
        return rc_fail(RC_EINVAL, "a shard group has 2 to %d shards, not %d", SHARD_GROUP_MAX, n);
    shard_group *g = rc_calloc(1, sizeof *g);
    member *m = rc_calloc((size_t)n, sizeof *m);
    if (!g || !m) {
        rc_free(g);
        rc_free(m);
        return rc_fail(RC_ENOMEM, "out of memory for a shard group");
    }
    g->n = n;
    g->f16 = f16;
    g->m = m;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    int rc = 0;
    for (int r = 0; r < n && !rc; r++) {
        m[r] = (member){ .g = g, .rank = r };
        stage_params sp = *p;
        sp.reduce = mem_reduce;
        sp.reduce_ud = &m[r];
        if ((rc = model_load_shard(path, 0, -1, r, n, &m[r].mdl)) ||
            (rc = stage_new(m[r].mdl, &sp, &m[r].st)))
            break;
        const model_hparams *hp = &m[r].mdl->hp;
        m[r].sum = rc_malloc((size_t)p->n_batch * (size_t)hp->n_embd * sizeof(float));
        /* every row of a batch may ask for logits */
        m[r].out = rc_malloc((size_t)p->n_batch * (size_t)hp->n_vocab * sizeof(float));
        if (!m[r].sum || !m[r].out)
            rc = rc_fail(RC_ENOMEM, "out of memory for shard %d's buffers", r);
    }
    if (rc) {
        shard_group_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void shard_group_free(shard_group *g)
{
    if (!g)
        return;
    for (int r = 0; r < g->n; r++) {
        stage_free(g->m[r].st);
        model_free(g->m[r].mdl);
        rc_free(g->m[r].sum);
        rc_free(g->m[r].out);
    }
    rc_free(g->m);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    rc_free(g);
}

static void *run_member(void *arg)
{
    member *me = arg;
    shard_group *g = me->g;
    pthread_mutex_lock(&g->mu);
    while (!g->go && !g->abort)
        pthread_cond_wait(&g->cv, &g->mu);
    bool abort = g->abort;
    pthread_mutex_unlock(&g->mu);
    if (abort)
        return NULL;
    me->rc = stage_forward(me->st, me->b, NULL, me->out, &me->n_out);
    if (me->rc)
        snprintf(me->err, sizeof me->err, "%s", rc_errmsg());
    return NULL;
}

int shard_group_forward(shard_group *g, const stage_batch *b, float *out, int *n_out)
{
    pthread_t th[SHARD_GROUP_MAX];
    int n_started = 1;
    for (int r = 0; r < g->n; r++) {
        g->m[r].b = b;
        g->m[r].rc = 0;
    }
    pthread_mutex_lock(&g->mu);
    g->go = g->abort = false;
    pthread_mutex_unlock(&g->mu);
    while (n_started < g->n &&
           pthread_create(&th[n_started], NULL, run_member, &g->m[n_started]) == 0)
        n_started++;
    /* a shard without its thread would leave the others at the first sum */
    pthread_mutex_lock(&g->mu);
    g->go = n_started == g->n;
    g->abort = !g->go;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->go)
        run_member(&g->m[0]);
    for (int r = 1; r < n_started; r++)
        pthread_join(th[r], NULL);
    if (n_started < g->n)
        return rc_fail(RC_ENOMEM, "cannot start a thread for shard %d", n_started);
    for (int r = 0; r < g->n; r++)
        if (g->m[r].rc)
            return rc_fail(g->m[r].rc, "shard %d: %s", r, g->m[r].err);
    const int V = g->m[0].mdl->hp.n_vocab;
    for (int r = 0; r < g->n; r++) {
        const model_shard *sh = &g->m[r].mdl->shard;
        for (int i = 0; i < g->m[0].n_out; i++)
            memcpy(out + (size_t)i * V + sh->vocab0, g->m[r].out + (size_t)i * V + sh->vocab0,
                   (size_t)sh->n_vocab * sizeof(float));
    }
    if (n_out)
        *n_out = g->m[0].n_out;
    return 0;
}

void shard_group_truncate(shard_group *g, int seq, int from)
{
    for (int r = 0; r < g->n; r++)
        stage_seq_truncate(g->m[r].st, seq, from);
}

const model *shard_group_model(const shard_group *g, int rank)
{
    return rank >= 0 && rank < g->n ? g->m[rank].mdl : NULL;
}

long shard_group_sums(const shard_group *g) { return g->sums; }
