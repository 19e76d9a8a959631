/* exec_local.c - the one-node executor: the whole model in this process,
 * each batch evaluated and sampled before submit returns. */
#include "exec.h"
#include "base/err.h"
#include "base/mem.h"

typedef struct {
    engine_exec x;
    stage *st;
    sample_set *ss;
    embed_pool *ep;           /* an embedding model's, instead of ss */
    float *logits;            /* [n_seq][n_vocab], or an embedding model's
                                 [n_batch][n_embd] hidden states */
    float *pooled;            /* [n_seq][n_embd] (embedding model) */
    exec_sampled *out;        /* [n_seq] */
    int n_out, group;
    int ready;                /* 1 result, -1 failure, 0 none */
    model *own_m;             /* exec_local_new_owned: freed with the executor */
    stage *own_st;
} exec_local;

static int local_submit(engine_exec *x, const exec_batch *b)
{
    exec_local *l = (exec_local *)x;
    const size_t V = (size_t)stage_model(l->st)->hp.n_vocab;
    l->group = b->group;
    l->n_out = 0;
    l->ready = -1;
    for (int i = 0; i < b->n_starts; i++) {
        stage_seq_truncate(l->st, b->starts[i].seq, b->starts[i].keep);
        if (l->ep ? embed_pool_start(l->ep, &b->starts[i]) : sample_set_start(l->ss, &b->starts[i]))
            return 0;
    }
    int got = 0;
    if (b->rows.n_rows > 0 && stage_forward(l->st, &b->rows, NULL, l->logits, &got))
        return 0;
    if (l->ep) {
        const size_t E = (size_t)l->x.n_embd_out;
        if (b->rows.n_rows > 0 && embed_pool_batch(l->ep, &b->rows, l->logits, l->pooled, &got))
            return 0;
        for (int k = 0; k < got; k++)
            l->out[k] = (exec_sampled){ .embd = l->pooled + (size_t)k * E };
        l->n_out = got;
        l->ready = 1;
        return 0;
    }
    int k = 0;
    for (int r = 0; r < b->rows.n_rows; r++) {
        if (b->rows.logits && !b->rows.logits[r])
            continue;
        if (k >= got) {
            rc_fail(RC_ESTATE, "the stage returned %d rows of logits, expected more", got);
            return 0;
        }
        if (sample_set_sample(l->ss, b->rows.seq[r], l->logits + (size_t)k * V, &l->out[k]))
            return 0;
        k++;
    }
    l->n_out = k;
    l->ready = 1;
    return 0;
}

static int local_collect(engine_exec *x, int timeout_ms, int *group, const exec_sampled **rows,
                         int *n)
{
    (void)timeout_ms;
    exec_local *l = (exec_local *)x;
    int r = l->ready;
    l->ready = 0;
    *group = l->group;
    *rows = l->out;
    *n = l->n_out;
    return r;   /* on -1 the detail is still the one submit set */
}

static void local_wake(engine_exec *x) { (void)x; }

static void local_free(engine_exec *x)
{
    exec_local *l = (exec_local *)x;
    if (!l)
        return;
    sample_set_free(l->ss);
    embed_pool_free(l->ep);
    rc_free(l->pooled);
    rc_free(l->logits);
    rc_free(l->out);
    stage_free(l->own_st);
    model_free(l->own_m);
    rc_free(l);
}

int exec_local_new(stage *st, int n_seq, engine_exec **out)
{
    *out = NULL;
    const model *m = stage_model(st);
    exec_local *l = rc_calloc(1, sizeof *l);
    if (!l)
        return rc_fail(RC_ENOMEM, "out of memory for the executor");
    l->x = (engine_exec){ .n_groups = 1, .submit = local_submit, .collect = local_collect,
                          .wake = local_wake, .free = local_free };
    l->st = st;
    const size_t E = (size_t)m->hp.n_embd;
    int rc;
    if (m->hp.pooling != POOL_NONE) {
        l->x.n_embd_out = (int)E;
        rc = embed_pool_new(n_seq, (int)E, m->hp.pooling, &l->ep);
        l->logits = rc_calloc((size_t)stage_batch_rows(st) * E, sizeof(float));
        l->pooled = rc_calloc((size_t)n_seq * E, sizeof(float));
        if (!l->pooled && !rc)
            rc = rc_fail(RC_ENOMEM, "out of memory for the executor");
    } else {
        rc = sample_set_new(n_seq, m->hp.n_vocab, &l->ss);
        l->logits = rc_calloc((size_t)n_seq * (size_t)m->hp.n_vocab, sizeof(float));
    }
    l->out = rc_calloc((size_t)n_seq, sizeof *l->out);
    if (rc || !l->logits || !l->out) {
        local_free(&l->x);
        return rc ? rc : rc_fail(RC_ENOMEM, "out of memory for the executor");
    }
    if (l->ss)   /* an embedding model's executor samples nothing */
        sample_set_use_file(l->ss, m->file);
    *out = &l->x;
    return 0;
}

void exec_local_use_tokenizer(engine_exec *x, const tokenizer *tok)
{
    exec_local *l = (exec_local *)x;
    if (l->ss)
        sample_set_use_tokenizer(l->ss, tok);
}

int exec_local_new_owned(model *m, const stage_params *sp, engine_exec **out)
{
    stage *st = NULL;
    *out = NULL;
    int rc = stage_new(m, sp, &st);
    if (!rc)
        rc = exec_local_new(st, sp->n_seq, out);
    if (rc) {
        stage_free(st);
        model_free(m);
        return rc;
    }
    exec_local *l = (exec_local *)*out;
    l->own_m = m;
    l->own_st = st;
    return 0;
}
