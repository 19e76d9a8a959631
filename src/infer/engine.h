/* engine.h - generation for many sequences at once over one model
 * (continuous batching).
 *
 * An engine owns a whole-model stage, its tokenizer, and n_seq sequence
 * slots.  Requests (token ids plus sampling settings) are queued with
 * engine_submit from any thread; engine_step, called in a loop by one thread
 * (the engine's), builds one batch from every active slot — one decode row
 * per generating sequence, then prompt chunks of new ones up to n_batch rows
 * — runs one forward pass, samples, and reports text through the request's
 * callbacks (on the engine's thread).
 *
 * Prefix reuse: a finished slot keeps its tokens and KV cache.  A new
 * request goes to the free slot whose cached tokens share the longest prefix
 * with its prompt, and only the rest of the prompt is evaluated — so a chat
 * client that resends the whole conversation each turn pays only for the new
 * turn.
 */
#ifndef RC_ENGINE_H
#define RC_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "sampler.h"
#include "stage.h"
#include "text/tokenizer.h"

enum gen_finish {
    GEN_RUNNING = 0,
    GEN_STOP,          /* end-of-generation token or a stop string */
    GEN_LENGTH,        /* max_tokens reached, or the context is full */
    GEN_CANCELLED,     /* request->cancel was set */
    GEN_ERROR          /* see gen_result.error */
};

const char *gen_finish_name(int finish);   /* "stop", "length", ... */

/* Per generated token, for clients that want ids or logprobs. */
typedef struct {
    int32_t id;
    float logprob;             /* when the request asked for logprobs */
    int n_top;
    const int32_t *top_ids;
    const float *top_logprobs;
} gen_token;

typedef struct gen_result {
    int finish;                /* enum gen_finish */
    int n_prompt;              /* prompt tokens */
    int n_cached;              /* of which reused from a previous request */
    int n_gen;                 /* generated tokens */
    double t_queue_s, t_prompt_s, t_gen_s;   /* waiting, prompt, generation */
    uint64_t seed;             /* the sampler's seed (reproduces the run) */
    char error[256];
} gen_result;

typedef struct gen_request gen_request;
struct gen_request {
    /* in: owned by the caller, valid until on_done returns */
    const int32_t *prompt;
    int n_prompt;
    sampler_params sampling;
    int max_tokens;            /* <= 0: until the context is full */
    const char *const *stops;  /* stop strings, not emitted */
    int n_stops;
    int n_logprobs;            /* 0: none; else top alternatives wanted (<= 20) */
    bool ignore_eos;
    /* Control tokens whose text belongs to the answer (llama.cpp's
     * "preserved tokens"): tool-call and thinking markers that a vocabulary
     * makes control tokens would otherwise vanish before the server can
     * parse them.  Other control tokens give no text. */
    const int32_t *text_tokens;
    int n_text_tokens;
    /* A GBNF grammar the output must match (NUL-terminated), or NULL; with
     * triggers a lazy one (exec.h's exec_start).  With a grammar an
     * end-of-generation token ends the request even with ignore_eos. */
    const char *grammar;
    const char *const *grammar_triggers;
    int n_grammar_triggers;
    /* An embedding model's request (engine_embd_dims() > 0): the prompt's
     * pooled, L2-normalised vector is written here (engine_embd_dims()
     * floats) before on_done; nothing is generated.  NULL for generation;
     * the other kind of request is refused by engine_submit. */
    float *embedding;
    void *user;
    /* Called on the engine thread.  on_text gets valid UTF-8 text (never
     * part of a stop string); on_token, if set, each sampled token. */
    void (*on_text)(gen_request *r, const char *text, size_t len);
    void (*on_token)(gen_request *r, const gen_token *t);
    void (*on_done)(gen_request *r, const gen_result *res);
    /* set from any thread to stop the request at the next step */
    atomic_bool cancel;
    /* engine bookkeeping */
    gen_request *next;
    uint64_t t_submit_ns;
};

typedef struct {
    int n_ctx;        /* positions per sequence */
    int n_seq;        /* parallel sequences */
    int n_batch;      /* rows per forward pass */
    int n_threads;
    int max_queue;    /* waiting requests beyond the slots; more are refused */
    int precision;    /* MATMUL_FAST or MATMUL_EXACT */
    int kv_type;      /* KV cache elements: TT_F32 (0, default) or TT_F16 */
} engine_params;

typedef struct engine engine;
struct engine_exec;

/* Builds an engine over a whole model (first == 0, last == n_layer) and its
 * tokenizer; both must outlive it. */
int  engine_new(const model *m, const tokenizer *tok, const engine_params *p, engine **out);
/* Builds an engine over an executor (exec.h; a pipeline across nodes), of
 * which it takes ownership (also on failure). */
int  engine_new_exec(struct engine_exec *x, const tokenizer *tok, int n_vocab,
                     const engine_params *p, engine **out);
void engine_free(engine *e);                     /* accepts NULL; pending
                                                    requests get on_done
                                                    with GEN_CANCELLED */

/* Queues a request (thread safe).  RC_ELIMIT when the queue is full,
 * RC_EINVAL for an empty prompt or one that does not fit the context (the
 * detail says by how much).  On error on_done is not called. */
int engine_submit(engine *e, gen_request *r);

/* Runs one batch if there is work.  Returns 1 if it did something, 0 if
 * idle, negative on an internal failure (requests in flight end with
 * GEN_ERROR).  Call from one thread only. */
int engine_step(engine *e);

/* Makes a step that waits for an executor's result look at the queue and
 * the cancel flags now (any thread). */
void engine_wake(engine *e);

/* Whether the executor broke for good (a pipeline lost a stage's node)
 * and could not be rebuilt: the model must be placed again.  Any thread. */
bool engine_broken(engine *e);

/* The fault (a lost node) after which a rebuild failed, or "" (any
 * thread): what a request gets told until the model is placed again. */
void engine_fault(engine *e, char *out, size_t cap);

/* Surviving a fault.  When the executor breaks with requests running, the
 * engine calls `rebuild` on its own thread (it may take long: a new plan,
 * weights to load); on success *out is a new executor for the same model
 * (another plan, maybe another number of groups) and every running request
 * is rebuilt on it: its prompt and the tokens it has generated so far are
 * evaluated again (batched like a prompt) and its sampler is made again
 * with the same seed, having seen those tokens and drawn as many times, so
 * the next tokens are the ones it would have got without the fault.  The
 * requests see only a pause.  A failing rebuild (the detail says why) ends
 * them with that error, and the engine is broken.  Without a rebuild
 * function a fault ends the running requests with an error. */
typedef int (*engine_rebuild_fn)(void *ud, const char *why, struct engine_exec **out);
void engine_set_rebuild(engine *e, engine_rebuild_fn fn, void *ud);

/* Runs steps until no request is queued or active (for the CLI). */
int engine_run_until_idle(engine *e);

/* Snapshot for metrics (thread safe). */
typedef struct {
    int n_active, n_queued, n_slots;
    uint64_t tokens_prompt, tokens_gen, tokens_cached;
    int kv_used, kv_total;     /* positions in use / available */
    /* recoveries (engine_set_rebuild): how many, and the last one */
    int n_recoveries, n_recoveries_failed;
    uint64_t tokens_replayed;  /* evaluated again by all recoveries */
    double last_recovery_at;   /* unix seconds; 0: none */
    double last_recovery_s;    /* fault to the new executor's first batch */
    int last_recovery_seqs;    /* sequences rebuilt */
    char last_recovery_why[200];
} engine_stats;
void engine_get_stats(engine *e, engine_stats *st);

const tokenizer *engine_tokenizer(const engine *e);
const model *engine_model(const engine *e);   /* NULL for a pipeline */
/* The width of the vectors an embedding model's engine makes; 0 for a
 * generation model (any thread). */
int engine_embd_dims(const engine *e);

#endif
