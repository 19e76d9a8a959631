/* exec.h - what runs the engine's batches: its stages and the sampling.
 *
 * The scheduler (engine.c) decides which rows go into a batch; an executor
 * evaluates them and samples a token for every row that asks.  On one node
 * the executor is exec_local (the whole model in this process, done before
 * submit returns).  Across nodes it is a pipeline (cluster/pipe_head.c): the
 * rows travel through stages on other machines, and the last stage samples,
 * so only token ids come back.
 *
 * Groups: an executor that can overlap work (a pipeline of k stages keeps
 * k micro-batches in flight) says so with n_groups > 1.  The engine puts each
 * sequence slot in one group (slot % n_groups) and has at most one batch per
 * group in flight; everything a batch carries (sequence starts, then rows)
 * is applied in order at every stage, which keeps the caches consistent
 * without any other message.
 */
#ifndef RC_EXEC_H
#define RC_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "sampler.h"
#include "stage.h"

#define EXEC_MAX_TOP 20

/* A sequence slot starts a new request: positions >= keep are forgotten
 * at every stage, and the last stage makes a sampler that has seen the
 * prompt (for the penalties).  A request rebuilt after a fault (engine.h)
 * also brings the tokens it had generated: the sampler counts them as
 * generated and moves its random stream past the draws that chose them. */
typedef struct {
    int seq;
    int keep;
    sampler_params sp;          /* seed already resolved (never 0) */
    const int32_t *prompt;
    int n_prompt;
    const int32_t *generated;   /* n_generated tokens (rebuild), or NULL */
    int n_generated;
    int n_logprobs;             /* 0..EXEC_MAX_TOP */
} exec_start;

typedef struct {
    int group;
    int n_starts;
    const exec_start *starts;   /* applied before the rows */
    stage_batch rows;           /* rows.logits marks the rows to sample */
} exec_batch;

typedef struct {
    /* An embedding model's executor (n_embd_out > 0): the input's pooled,
     * L2-normalised vector of n_embd_out floats, valid as long as rows are;
     * token and the rest are unused.  NULL otherwise. */
    const float *embd;
    int32_t token;              /* < 0: every token is banned (logit_bias) */
    float logprob;
    int n_top;
    int32_t top_ids[EXEC_MAX_TOP];
    float top_lp[EXEC_MAX_TOP];
} exec_sampled;

typedef struct engine_exec engine_exec;
struct engine_exec {
    int n_groups;               /* >= 1 */
    int n_embd_out;             /* > 0: an embedding model's; each sampled row
                                   is its sequence's pooled vector (embd) */
    /* Queues a batch for a group with none in flight (it may do all the
     * work before returning).  0, or negative with rc_errmsg(). */
    int  (*submit)(engine_exec *x, const exec_batch *b);
    /* Waits up to timeout_ms for a group's result.  1: *group, and *rows
     * (one per sampled row, in batch order; valid until the next submit of
     * that group) and *n.  0: nothing yet.  Negative: the group's batch
     * failed, *group set, rc_errmsg() says why. */
    int  (*collect)(engine_exec *x, int timeout_ms, int *group, const exec_sampled **rows,
                    int *n);
    /* Makes a waiting collect return early (any thread). */
    void (*wake)(engine_exec *x);
    /* Whether it can no longer run anything (a pipeline lost a node); NULL
     * for executors that cannot break.  Any thread. */
    bool (*broken)(engine_exec *x);
    void (*free)(engine_exec *x);
};

/* The samplers of every sequence slot, kept where logits are made. */
typedef struct sample_set sample_set;
int  sample_set_new(int n_seq, int n_vocab, sample_set **out);
void sample_set_free(sample_set *s);              /* accepts NULL */
/* Replaces the slot's sampler.  RC_EINVAL for a bad slot, RC_ENOMEM. */
int  sample_set_start(sample_set *s, const exec_start *st);
/* Samples the slot's next token from its logits (modified), records it in
 * the sampler's history and fills *out. */
int  sample_set_sample(sample_set *s, int seq, float *logits, exec_sampled *out);
/* For a tensor-parallel shard that keeps copies of shard 0's samplers: the
 * slot's sampler (NULL when none) and its top-logprob count; and recording
 * a token sampled for the slot elsewhere. */
const sampler *sample_set_get(const sample_set *s, int seq, int *n_logprobs);
void sample_set_accept(sample_set *s, int seq, int32_t token);

/* The pooling of every sequence slot of an embedding model, kept where
 * the hidden states are made (the last stage). */
typedef struct embed_pool embed_pool;
int  embed_pool_new(int n_seq, int n_embd, int pooling, embed_pool **out);
void embed_pool_free(embed_pool *p);              /* accepts NULL */
/* A new input in the slot: forgets what it pooled.  RC_EINVAL for a bad
 * slot or a start that keeps cached positions (pooling needs them all). */
int  embed_pool_start(embed_pool *p, const exec_start *st);
/* Pools a batch's rows (hidden: the stage's normed states of every row);
 * for each row that asks (b->logits), in batch order, writes its
 * sequence's pooled, L2-normalised vector to out[k][n_embd]; *n_out = k. */
int  embed_pool_batch(embed_pool *p, const stage_batch *b, const float *hidden, float *out,
                      int *n_out);

/* One-node executor over a stage that holds the whole model (which must
 * outlive it). */
int exec_local_new(stage *st, int n_seq, engine_exec **out);

/* The same over a whole model of its own: builds the stage, and frees both
 * with the executor (also on failure).  For an instance rebuilt on this node
 * alone after the nodes it ran on were lost. */
int exec_local_new_owned(model *m, const stage_params *sp, engine_exec **out);

#endif
