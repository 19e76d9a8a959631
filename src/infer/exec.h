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

#include "model/gguf.h"
#include "sampler.h"
#include "stage.h"
#include "text/tokenizer.h"

#define EXEC_MAX_TOP 20
/* Lazy grammar triggers per sequence, and bytes of each (without its NUL). */
#define EXEC_MAX_TRIGGERS 32
#define EXEC_MAX_TRIGGER_LEN 256

/* A sequence slot starts a new request: positions >= keep are forgotten
 * at every stage, and the last stage makes a sampler that has seen the
 * prompt (for the penalties).  A request rebuilt after a fault (engine.h)
 * also brings the tokens it had generated: the sampler counts them as
 * generated and moves its random stream past the draws that chose them.
 *
 * A grammar (GBNF text, src/grammar/grammar.h) constrains what the sequence
 * generates: a token the grammar refuses is never sampled, and when the
 * grammar can go no further only end-of-generation tokens are allowed, so
 * the sequence ends as on any end-of-generation token.  With triggers the
 * grammar is lazy: it waits until one of the strings appears in the
 * generated text (control tokens count by their text) and from then on the
 * text from the trigger's first byte must match it (how a tool call is
 * forced once the model has opened one). */
typedef struct {
    int seq;
    int keep;
    sampler_params sp;          /* seed already resolved (never 0) */
    const int32_t *prompt;
    int n_prompt;
    const int32_t *generated;   /* n_generated tokens (rebuild), or NULL */
    int n_generated;
    int n_logprobs;             /* 0..EXEC_MAX_TOP */
    const char *grammar;        /* GBNF, grammar_len bytes, or NULL: none */
    int grammar_len;
    const char *const *triggers;  /* n_triggers NUL-terminated strings (lazy grammar) */
    int n_triggers;             /* 0..EXEC_MAX_TRIGGERS; 0: active from the start */
} exec_start;

typedef struct {
    int group;
    int n_starts;
    const exec_start *starts;   /* applied before the rows */
    stage_batch rows;           /* rows.logits marks the rows to sample */
} exec_batch;

/* exec_sampled.token below 0: the sequence cannot go on. */
enum {
    EXEC_BANNED = -1,           /* logit_bias bans every token */
    EXEC_GRAMMAR_BANNED = -2,   /* the grammar allows none of the tokens left (logit_bias
                                   bans those it allows, or the text after a lazy trigger
                                   does not match it) */
    EXEC_GRAMMAR_LIMIT = -3     /* the grammar is too ambiguous here (grammar.h's bounds) */
};

typedef struct {
    /* An embedding model's executor (n_embd_out > 0): the input's pooled,
     * L2-normalised vector of n_embd_out floats, valid as long as rows are;
     * token and the rest are unused.  NULL otherwise. */
    const float *embd;
    int32_t token;              /* < 0: EXEC_BANNED, EXEC_GRAMMAR_* */
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

/* The samplers of every sequence slot, kept where logits are made, with
 * their grammars. */
typedef struct sample_set sample_set;
int  sample_set_new(int n_seq, int n_vocab, sample_set **out);
void sample_set_free(sample_set *s);              /* accepts NULL */
/* Where grammars find the model's vocabulary (one grammar_vocab per set,
 * built the first time a sequence brings a grammar): a tokenizer that
 * outlives the set, or a model file (a stage that has no tokenizer; the
 * file must outlive the set too), whose tokenizer is then loaded from its
 * metadata at that time.  Without either a grammar is refused. */
void sample_set_use_tokenizer(sample_set *s, const tokenizer *tok);
void sample_set_use_file(sample_set *s, const gguf_file *f);
/* Replaces the slot's sampler (and grammar).  RC_EINVAL for a bad slot, a
 * grammar that does not compile (the detail names line and column) or
 * generated tokens it refuses; RC_ENOMEM. */
int  sample_set_start(sample_set *s, const exec_start *st);
/* Samples the slot's next token from its logits (modified), records it in
 * the sampler's history and fills *out.  With a grammar the token is drawn
 * as usual first and kept when the grammar allows it; otherwise the
 * refused tokens are masked and it is drawn again (the same token when
 * greedy as with the mask applied first, the same distribution without
 * truncation when not; a token costs two draws either way, so a replay
 * knows where the random stream stands). */
int  sample_set_sample(sample_set *s, int seq, float *logits, exec_sampled *out);
/* For a tensor-parallel shard that keeps copies of shard 0's samplers: the
 * slot's sampler (NULL when none) and its top-logprob count; recording a
 * token sampled for the slot elsewhere; and masking the tokens the slot's
 * grammar refuses now (logits: n_vocab wide; 0 when it has no grammar or a
 * lazy one not yet triggered, 1 masked, <0 an error), so that a shard ranks
 * only tokens shard 0 may draw. */
const sampler *sample_set_get(const sample_set *s, int seq, int *n_logprobs);
void sample_set_accept(sample_set *s, int seq, int32_t token);
int  sample_set_constrain(sample_set *s, int seq, float *logits);

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
/* The executor's grammars take their vocabulary from tok (see
 * sample_set_use_tokenizer); without it, from the model's file. */
void exec_local_use_tokenizer(engine_exec *x, const tokenizer *tok);

/* The same over a whole model of its own: builds the stage, and frees both
 * with the executor (also on failure).  For an instance rebuilt on this node
 * alone after the nodes it ran on were lost. */
int exec_local_new_owned(model *m, const stage_params *sp, engine_exec **out);

#endif
