/* embed_pool.c - pooling an embedding model's hidden states per sequence
 * slot, at the stage that makes them (the last one), so that one vector per
 * input leaves it, not one per token.
 *
 * A prompt may come in several batches (chunks of n_batch rows): mean
 * pooling sums every row as it comes and divides at the row that asks for
 * the result (the prompt's last); cls keeps the row at position 0; last
 * keeps the row that asks.  The result is L2-normalised (llama.cpp's
 * --embd-normalize 2, what its server returns for /v1/embeddings).
 */
#include "exec.h"
#include "base/err.h"
#include "base/mem.h"

#include <math.h>
#include <string.h>

struct embed_pool {
    int n_seq, n_embd, pooling;
    double *acc;       /* [n_seq][n_embd] sum (mean) or the kept row */
    int *n_rows;       /* [n_seq] rows summed */
};

int embed_pool_new(int n_seq, int n_embd, int pooling, embed_pool **out)
{
    *out = NULL;
    if (pooling < POOL_MEAN || pooling > POOL_LAST)
        return rc_fail(RC_EINVAL, "pooling type %d is not one this engine pools", pooling);
    embed_pool *p = rc_calloc(1, sizeof *p);
    if (!p || !(p->acc = rc_calloc((size_t)n_seq * (size_t)n_embd, sizeof(double))) ||
        !(p->n_rows = rc_calloc((size_t)n_seq, sizeof(int)))) {
        embed_pool_free(p);
        return rc_fail(RC_ENOMEM, "out of memory for the embedding pools");
    }
    p->n_seq = n_seq;
    p->n_embd = n_embd;
    p->pooling = pooling;
    *out = p;
    return 0;
}

void embed_pool_free(embed_pool *p)
{
    if (!p)
        return;
    rc_free(p->acc);
    rc_free(p->n_rows);
    rc_free(p);
}

int embed_pool_start(embed_pool *p, const exec_start *st)
{
    if (st->seq < 0 || st->seq >= p->n_seq)
        return rc_fail(RC_EINVAL, "sequence slot %d outside 0..%d", st->seq, p->n_seq - 1);
    /* Pooling needs every row of the input: a kept prefix was pooled by
     * an earlier request (the engine never keeps one for embeddings). */
    if (st->keep != 0)
        return rc_fail(RC_EINVAL, "an embedding must evaluate its whole input (slot %d keeps %d)",
                       st->seq, st->keep);
    memset(p->acc + (size_t)st->seq * p->n_embd, 0, (size_t)p->n_embd * sizeof(double));
    p->n_rows[st->seq] = 0;
    return 0;
}

int embed_pool_batch(embed_pool *p, const stage_batch *b, const float *hidden, float *out,
                     int *n_out)
{
    const int E = p->n_embd;
    int k = 0;
    for (int r = 0; r < b->n_rows; r++) {
        const int seq = b->seq[r];
        if (seq < 0 || seq >= p->n_seq)
            return rc_fail(RC_EINVAL, "row %d: sequence slot %d outside 0..%d", r, seq, p->n_seq - 1);
        const float *h = hidden + (size_t)r * E;
        double *acc = p->acc + (size_t)seq * E;
        bool want = !b->logits || b->logits[r];
        if (p->pooling == POOL_MEAN)
            for (int i = 0; i < E; i++)
                acc[i] += h[i];
        else if ((p->pooling == POOL_CLS && b->pos[r] == 0) || (p->pooling == POOL_LAST && want))
            for (int i = 0; i < E; i++)
                acc[i] = h[i];
        p->n_rows[seq]++;
        if (!want)
            continue;
        const double div = p->pooling == POOL_MEAN ? p->n_rows[seq] : 1.0;
        double ss = 0.0;
        for (int i = 0; i < E; i++)
            ss += (acc[i] / div) * (acc[i] / div);
        /* a zero vector stays zero (llama.cpp's normalisation does the same) */
        const double inv = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
        float *o = out + (size_t)k * E;
        for (int i = 0; i < E; i++)
            o[i] = (float)(acc[i] / div * inv);
        k++;
    }
    *n_out = k;
    return 0;
}
