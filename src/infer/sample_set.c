/* sample_set.c - one sampler per sequence slot, at the stage that makes
 * the logits (the last one), so that only token ids leave it. */
#include "exec.h"
#include "base/err.h"
#include "base/mem.h"

struct sample_set {
    int n_seq, n_vocab;
    sampler **smp;
    int *n_logprobs;
};

int sample_set_new(int n_seq, int n_vocab, sample_set **out)
{
    *out = NULL;
    sample_set *s = rc_calloc(1, sizeof *s);
    if (!s || !(s->smp = rc_calloc((size_t)n_seq, sizeof *s->smp)) ||
        !(s->n_logprobs = rc_calloc((size_t)n_seq, sizeof(int)))) {
        sample_set_free(s);
        return rc_fail(RC_ENOMEM, "out of memory for the samplers");
    }
    s->n_seq = n_seq;
    s->n_vocab = n_vocab;
    *out = s;
    return 0;
}

void sample_set_free(sample_set *s)
{
    if (!s)
        return;
    if (s->smp)
        for (int i = 0; i < s->n_seq; i++)
            sampler_free(s->smp[i]);
    rc_free(s->smp);
    rc_free(s->n_logprobs);
    rc_free(s);
}

int sample_set_start(sample_set *s, const exec_start *st)
{
    if (st->seq < 0 || st->seq >= s->n_seq)
        return rc_fail(RC_EINVAL, "sequence slot %d outside 0..%d", st->seq, s->n_seq - 1);
    if (st->n_logprobs < 0 || st->n_logprobs > EXEC_MAX_TOP)
        return rc_fail(RC_EINVAL, "top logprobs must be between 0 and %d", EXEC_MAX_TOP);
    sampler *smp = NULL;
    int rc = sampler_new(&st->sp, s->n_vocab, &smp);
    if (rc)
        return rc;
    sampler_accept_prompt(smp, st->prompt, st->n_prompt);
    if (st->n_generated > 0)
        sampler_replay(smp, st->generated, st->n_generated);
    sampler_free(s->smp[st->seq]);
    s->smp[st->seq] = smp;
    s->n_logprobs[st->seq] = st->n_logprobs;
    return 0;
}

int sample_set_sample(sample_set *s, int seq, float *logits, exec_sampled *out)
{
    if (seq < 0 || seq >= s->n_seq || !s->smp[seq])
        return rc_fail(RC_ESTATE, "sequence slot %d has no sampler", seq);
    sampler *smp = s->smp[seq];
    int32_t t = sampler_sample(smp, logits);
    out->token = t;
    out->n_top = 0;
    out->logprob = 0;
    if (t < 0)
        return 0;
    sampler_accept(smp, t);
    int n = sampler_logprobs(smp, logits, t, s->n_logprobs[seq], out->top_ids, out->top_lp,
                             &out->logprob);
    out->n_top = n > 0 ? n : 0;
    return 0;
}

const sampler *sample_set_get(const sample_set *s, int seq, int *n_logprobs)
{
    if (seq < 0 || seq >= s->n_seq)
        return NULL;
    *n_logprobs = s->n_logprobs[seq];
    return s->smp[seq];
}

void sample_set_accept(sample_set *s, int seq, int32_t token)
{
    if (seq >= 0 && seq < s->n_seq && s->smp[seq])
        sampler_accept(s->smp[seq], token);
}
