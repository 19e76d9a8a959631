/* stage.h - the forward pass of a transformer over a layer range.
 *
 * A stage holds the weights of layers [first, last) of a model (model.h), a
 * KV cache for those layers, and the work buffers for batches of up to
 * n_batch rows.  One call evaluates a batch of rows; each row is one token of
 * one sequence at one position.  The first stage (first == 0) takes token
 * ids; later stages take the previous stage's hidden states.  The last stage
 * (last == n_layer) returns logits for the rows that ask for them; the
 * others return hidden states for every row.  The whole model is the
 * one-stage case.  Nothing here knows about sockets.
 *
 * Rows of a batch may mix sequences (continuous batching) and mix prompt
 * chunks with single decode steps.  Within a sequence rows must come in
 * position order with no holes (a row at position p needs 0..p-1 already in
 * the cache or earlier in the batch).  Nothing is allocated per call.
 */
#ifndef RC_STAGE_H
#define RC_STAGE_H

#include <stdint.h>

#include "kv_cache.h"
#include "model/model.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"

typedef struct {
    int n_ctx;       /* positions per sequence */
    int n_seq;       /* sequence slots in the KV cache */
    int n_batch;     /* most rows per stage_forward call */
    int n_threads;   /* >= 1 */
    int precision;   /* MATMUL_FAST (default) or MATMUL_EXACT */
    int kv_type;     /* KV cache elements: TT_F32 (0, the default) or TT_F16
                        (half the memory; llama.cpp's and Ollama's default) */
    /* Tensor-parallel shards (model->shard.n_ranks > 1) only: sums the
     * n_rows x width floats at x over all shards of the model, in place,
     * adding in the same order on every shard so that all of them go on
     * with the same numbers.  Called after the attention and after the FFN
     * of every layer; nonzero fails the batch. */
    int (*reduce)(void *ud, float *x, int n_rows, int width);
    void *reduce_ud;
    /* Optional observer of mixture-of-experts routing (statistics, tests):
     * called for every row of every MoE layer with the chosen experts (k of
     * them, best first) and the margin that decided the choice: the
     * smallest gap between a chosen score and the best one left out, or
     * between a kept group's score and the best dropped group's. */
    void (*on_route)(void *ud, int layer, int row, const int *chosen, int k, float margin);
    void *route_ud;
} stage_params;

typedef struct {
    int n_rows;
    const int32_t *token;   /* [n_rows] ids (first stage only) */
    const int32_t *pos;     /* [n_rows] positions */
    const int32_t *seq;     /* [n_rows] sequence slots */
    const int8_t  *logits;  /* [n_rows] nonzero = output this row (last
                               stage); NULL = every row */
} stage_batch;

typedef struct stage stage;

/* Builds a stage over a loaded model (which must outlive it).  Allocates the
 * KV cache and work buffers; RC_ENOMEM/RC_EINVAL with a detail on failure. */
int  stage_new(const model *m, const stage_params *p, stage **out);
void stage_free(stage *s);                      /* accepts NULL */

/* Evaluates one batch.
 *   in:  hidden states [n_rows][n_embd] for a stage with first > 0; ignored
 *        (may be NULL) for the first stage.
 *   out: last stage: logits [n_out][n_vocab] for the rows that asked, in
 *        batch order (a tensor-parallel shard fills only its columns
 *        [vocab0, vocab0 + n_vocab) of each row); an embedding model's
 *        (hp.pooling) last stage: the normed hidden states [n_rows][n_embd]
 *        of every row, whatever b->logits says; other stages: hidden
 *        states [n_rows][n_embd].
 *   *n_out (may be NULL): the number of rows written to out.
 * Returns 0, or RC_EINVAL (bad token id, position, sequence, batch size)
 * with the cache unchanged, or the error of a failed reduce (the batch's
 * positions are then forgotten). */
int stage_forward(stage *s, const stage_batch *b, const float *in, float *out, int *n_out);

/* Forgets positions >= from of sequence `seq` (0 clears it). */
void stage_seq_truncate(stage *s, int seq, int from);

/* Number of positions sequence `seq` holds. */
int stage_seq_len(const stage *s, int seq);

const kv_cache *stage_kv(const stage *s);
const model *stage_model(const stage *s);
int stage_batch_rows(const stage *s);   /* n_batch: most rows per call */
int stage_is_first(const stage *s);
int stage_is_last(const stage *s);

#endif
