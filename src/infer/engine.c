/* engine.c - the continuous-batching scheduler over an executor (exec.h):
 * the local stage, or a pipeline of stages on several nodes.
 *
 * A slot is one sequence of the KV cache.  Its life: free (maybe holding a
 * finished conversation's tokens for prefix reuse) -> prefill (prompt rows
 * still to evaluate) -> decode (one row per step: the token sampled last
 * step) -> free.  Every step builds one batch: all decode rows first (they
 * are latency-bound, one token each), then prompt chunks while rows remain.
 * A row asks for logits only where a token must be sampled: a decode row, or
 * the last prompt row of a sequence.
 *
 * With an executor of several groups (a pipeline), slot i belongs to group
 * i % n_groups and each group has at most one batch in flight, so every
 * stage is busy with some group's micro-batch.  A slot's result may arrive
 * after the slot was cancelled and even given to a new request: rows carry
 * the slot's epoch, and a stale result is dropped.
 *
 * Locking: the queue and the counters are guarded by `mu`; slots are touched
 * only by the engine thread.
 */
#include "engine.h"
#include "exec.h"
#include "stop.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_LOGPROBS EXEC_MAX_TOP
/* how long a step waits for an executor's result before looking at the
 * queue and cancellations again */
#define COLLECT_WAIT_MS 50

typedef struct {
    int id;
    gen_request *req;
    int32_t *tokens;         /* [n_ctx] tokens whose K/V the cache holds */
    int n_tokens;
    /* What to evaluate before the next sample: the prompt, or after a
     * rebuild the prompt and the tokens generated so far (in `replay`). */
    const int32_t *feed;
    int n_feed;
    int n_fed;               /* of feed, evaluated (cached ones included) */
    int32_t *replay;         /* [n_ctx] */
    int32_t pending;         /* sampled token still to evaluate, or -1 */
    uint32_t epoch;          /* bumped when a request takes the slot */
    bool need_start;         /* the executor has not been told of this request */
    uint64_t seed;
    stop_matcher *stop;
    tok_stream ts;
    gen_result res;
    uint64_t t_start, t_prompt_done, last_used;
    int32_t top_ids[MAX_LOGPROBS];
    float top_lp[MAX_LOGPROBS];
} slot;

typedef struct {
    bool in_flight;
    int n_out;
    int *out_slot;           /* [n_seq] slot of each sampled row */
    uint32_t *out_epoch;     /* [n_seq] its epoch when sent */
} group;

struct engine {
    const model *m;          /* NULL for a pipeline */
    const tokenizer *tok;
    int n_vocab;
    int embd_dims;           /* an embedding model's vector width (its
                                executors' n_embd_out), or 0 */
    engine_params p;
    stage *st;               /* local executor's stage, or NULL */
    engine_exec *x;
    engine_rebuild_fn rebuild;
    void *rebuild_ud;
    bool dead;               /* a rebuild failed: broken for good */
    char dead_why[256];
    char fault_why[200];     /* the fault a failed rebuild followed */
    group *groups;
    slot *slots;
    /* the batch being built */
    int32_t *b_tok, *b_pos, *b_seq;
    int8_t *b_want;
    exec_start *starts;      /* [n_seq] */
    char *text;              /* stream decoder output */
    size_t text_cap;
    uint64_t clock;
    /* shared */
    pthread_mutex_t mu;
    gen_request *queue_head, *queue_tail;
    int n_queued;
    engine_stats stats;
};

const char *gen_finish_name(int finish)
{
    static const char *names[] = { "running", "stop", "length", "cancelled", "error" };
    return finish >= 0 && finish <= GEN_ERROR ? names[finish] : "unknown";
}

static int engine_init(engine *e, const tokenizer *tok, int n_vocab, const engine_params *p)
{
    e->tok = tok;
    e->n_vocab = n_vocab;
    e->p = *p;
    pthread_mutex_init(&e->mu, NULL);
    const size_t B = (size_t)p->n_batch, S = (size_t)p->n_seq;
    e->text_cap = TOK_STREAM_OUT_MAX(tok);
    e->slots = rc_calloc(S, sizeof *e->slots);
    e->b_tok = rc_calloc(B, sizeof(int32_t));
    e->b_pos = rc_calloc(B, sizeof(int32_t));
    e->b_seq = rc_calloc(B, sizeof(int32_t));
    e->b_want = rc_calloc(B, 1);
    e->starts = rc_calloc(S, sizeof *e->starts);
    e->text = rc_malloc(e->text_cap);
    if (!e->slots || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->starts ||
        !e->text)
        return rc_fail(RC_ENOMEM, "out of memory for the engine's buffers");
    for (int i = 0; i < p->n_seq; i++) {
        e->slots[i].id = i;
        e->slots[i].pending = -1;
        if (!(e->slots[i].tokens = rc_calloc((size_t)p->n_ctx, sizeof(int32_t))) ||
            !(e->slots[i].replay = rc_calloc((size_t)p->n_ctx, sizeof(int32_t))))
            return rc_fail(RC_ENOMEM, "out of memory for the engine's slots");
    }
    e->stats.n_slots = p->n_seq;
    e->stats.kv_total = p->n_ctx * p->n_seq;
    return 0;
}

static void free_groups(engine *e)
{
    if (e->groups && e->x)
        for (int g = 0; g < e->x->n_groups; g++) {
            rc_free(e->groups[g].out_slot);
            rc_free(e->groups[g].out_epoch);
        }
    rc_free(e->groups);
    e->groups = NULL;
}

static int engine_groups(engine *e)
{
    int G = e->x->n_groups;
    if (!(e->groups = rc_calloc((size_t)G, sizeof *e->groups)))
        return rc_fail(RC_ENOMEM, "out of memory for the engine's groups");
    for (int g = 0; g < G; g++)
        if (!(e->groups[g].out_slot = rc_calloc((size_t)e->p.n_seq, sizeof(int))) ||
            !(e->groups[g].out_epoch = rc_calloc((size_t)e->p.n_seq, sizeof(uint32_t))))
            return rc_fail(RC_ENOMEM, "out of memory for the engine's groups");
    return 0;
}

static int check_params(const engine_params *p)
{
    if (p->n_seq <= 0 || p->n_ctx <= 0 || p->n_batch <= 0)
        return rc_fail(RC_EINVAL, "engine: sequences, context and batch must be positive");
    return 0;
}

int engine_new(const model *m, const tokenizer *tok, const engine_params *p, engine **out)
{
    *out = NULL;
    if (m->first != 0 || m->last != m->hp.n_layer)
        return rc_fail(RC_EINVAL, "an engine needs the whole model, not layers [%d, %d)",
                       m->first, m->last);
    int rc = check_params(p);
    if (rc)
        return rc;
    engine *e = rc_calloc(1, sizeof *e);
    if (!e)
        return rc_fail(RC_ENOMEM, "out of memory creating an engine");
    e->m = m;
    stage_params sp = { .n_ctx = p->n_ctx, .n_seq = p->n_seq, .n_batch = p->n_batch,
                        .n_threads = p->n_threads, .precision = p->precision,
                        .kv_type = p->kv_type };
    if ((rc = engine_init(e, tok, m->hp.n_vocab, p)) || (rc = stage_new(m, &sp, &e->st)) ||
        (rc = exec_local_new(e->st, p->n_seq, &e->x)) || (rc = engine_groups(e)))
        goto fail;
    exec_local_use_tokenizer(e->x, tok);
    e->embd_dims = e->x->n_embd_out;
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc;
}

int engine_new_exec(engine_exec *x, const tokenizer *tok, int n_vocab, const engine_params *p,
                    engine **out)
{
    *out = NULL;
    int rc = check_params(p);
    if (rc) {
        x->free(x);
        return rc;
    }
    engine *e = rc_calloc(1, sizeof *e);
    if (!e) {
        x->free(x);
        return rc_fail(RC_ENOMEM, "out of memory creating an engine");
    }
    e->x = x;
    e->embd_dims = x->n_embd_out;
    if ((rc = engine_init(e, tok, n_vocab, p)) || (rc = engine_groups(e))) {
        engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

static void finish(engine *e, slot *s, int reason, const char *error);

void engine_free(engine *e)
{
    if (!e)
        return;
    if (e->slots)
        for (int i = 0; i < e->p.n_seq; i++) {
            if (e->slots[i].req)
                finish(e, &e->slots[i], GEN_CANCELLED, NULL);
            rc_free(e->slots[i].tokens);
            rc_free(e->slots[i].replay);
        }
    for (gen_request *r = e->queue_head, *next; r; r = next) {
        next = r->next;
        gen_result res = { .finish = GEN_CANCELLED, .n_prompt = r->n_prompt };
        r->on_done(r, &res);
    }
    free_groups(e);
    if (e->x)
        e->x->free(e->x);
    stage_free(e->st);
    rc_free(e->slots);
    rc_free(e->b_tok); rc_free(e->b_pos); rc_free(e->b_seq); rc_free(e->b_want);
    rc_free(e->starts); rc_free(e->text);
    pthread_mutex_destroy(&e->mu);
    rc_free(e);
}

int engine_submit(engine *e, gen_request *r)
{
    if (r->n_prompt <= 0)
        return rc_fail(RC_EINVAL, "the prompt is empty");
    const int embeds = e->embd_dims;
    if (embeds && !r->embedding)
        return rc_fail(RC_EINVAL, "this model makes embeddings; it does not generate text");
    if (!embeds && r->embedding)
        return rc_fail(RC_EINVAL, "this model generates text; it makes no embeddings");
    if (embeds && r->n_prompt > e->p.n_ctx)
        return rc_fail(RC_EINVAL, "the input has %d tokens; the context holds %d (%d too many)",
                       r->n_prompt, e->p.n_ctx, r->n_prompt - e->p.n_ctx);
    if (!embeds && r->n_prompt >= e->p.n_ctx)
        return rc_fail(RC_EINVAL, "the prompt has %d tokens; the context holds %d (%d too many, "
                       "leaving room for one generated token)",
                       r->n_prompt, e->p.n_ctx, r->n_prompt - e->p.n_ctx + 1);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->n_vocab)
            return rc_fail(RC_EINVAL, "prompt token %d has id %d, outside the vocabulary of %d",
                           i, r->prompt[i], e->n_vocab);
    if (r->n_logprobs < 0 || r->n_logprobs > MAX_LOGPROBS)
        return rc_fail(RC_EINVAL, "top logprobs must be between 0 and %d", MAX_LOGPROBS);
    pthread_mutex_lock(&e->mu);
    int free_slots = 0;
    for (int i = 0; i < e->p.n_seq; i++)
        free_slots += e->slots[i].req == NULL;
    if (e->n_queued >= e->p.max_queue + free_slots) {
        pthread_mutex_unlock(&e->mu);
        return rc_fail(RC_ELIMIT, "the server is busy: %d requests are waiting", e->n_queued);
    }
    r->next = NULL;
    r->t_submit_ns = os_now_ns();
    if (e->queue_tail)
        e->queue_tail->next = r;
    else
        e->queue_head = r;
    e->queue_tail = r;
    e->n_queued++;
    e->stats.n_queued = e->n_queued;
    e->x->wake(e->x);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* Other threads reach the executor under `mu`: a rebuild replaces it. */
void engine_wake(engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->x->wake(e->x);
    pthread_mutex_unlock(&e->mu);
}

bool engine_broken(engine *e)
{
    pthread_mutex_lock(&e->mu);
    bool b = e->dead || (!e->rebuild && e->x->broken && e->x->broken(e->x));
    pthread_mutex_unlock(&e->mu);
    return b;
}

void engine_fault(engine *e, char *out, size_t cap)
{
    pthread_mutex_lock(&e->mu);
    snprintf(out, cap, "%s", e->dead ? e->fault_why : "");
    pthread_mutex_unlock(&e->mu);
}

/* The executor while a rebuild runs, and after one failed: takes nothing. */
static int paused_submit(engine_exec *x, const exec_batch *b)
{
    (void)x; (void)b;
    return rc_fail(RC_ESTATE, "the instance is being rebuilt");
}
static int paused_collect(engine_exec *x, int timeout_ms, int *g, const exec_sampled **rows,
                          int *n)
{
    (void)x; (void)timeout_ms; (void)g; (void)rows; (void)n;
    return 0;
}
static void paused_wake(engine_exec *x) { (void)x; }
static bool paused_broken(engine_exec *x) { (void)x; return true; }
static void paused_free(engine_exec *x) { (void)x; }
static engine_exec paused_exec = { .n_groups = 1, .submit = paused_submit,
                                   .collect = paused_collect, .wake = paused_wake,
                                   .broken = paused_broken, .free = paused_free };

void engine_set_rebuild(engine *e, engine_rebuild_fn fn, void *ud)
{
    e->rebuild = fn;
    e->rebuild_ud = ud;
}

static void emit(slot *s, const char *text, size_t len)
{
    if (len && s->req->on_text)
        s->req->on_text(s->req, text, len);
}

/* Passes decoded text through the stop matcher; 1 if a stop string hit. */
static int push_text(slot *s, const char *text, size_t len)
{
    const char *out;
    size_t n;
    int hit = s->stop ? stop_push(s->stop, text, len, &out, &n) : 0;
    if (!s->stop) {
        out = text;
        n = len;
    }
    emit(s, out, n);
    return hit == 1;
}

static void finish(engine *e, slot *s, int reason, const char *error)
{
    gen_request *r = s->req;
    if (reason != GEN_ERROR && reason != GEN_CANCELLED && !(s->stop && stop_matched(s->stop) >= 0)) {
        int n = tok_stream_flush(&s->ts, e->text, e->text_cap);
        if (n > 0 && push_text(s, e->text, (size_t)n))
            reason = GEN_STOP;
        if (s->stop && stop_matched(s->stop) < 0) {
            const char *out;
            size_t len;
            stop_flush(s->stop, &out, &len);
            emit(s, out, len);
        }
    }
    uint64_t now = os_now_ns();
    s->res.finish = reason;
    if (error)
        snprintf(s->res.error, sizeof s->res.error, "%s", error);
    s->res.t_queue_s = (double)(s->t_start - r->t_submit_ns) * 1e-9;
    if (s->t_prompt_done) {
        s->res.t_prompt_s = (double)(s->t_prompt_done - s->t_start) * 1e-9;
        s->res.t_gen_s = (double)(now - s->t_prompt_done) * 1e-9;
    } else {
        s->res.t_prompt_s = (double)(now - s->t_start) * 1e-9;
    }
    s->res.seed = s->seed;
    stop_free(s->stop);
    s->stop = NULL;
    s->need_start = false;
    s->req = NULL;
    s->pending = -1;
    s->last_used = ++e->clock;
    pthread_mutex_lock(&e->mu);
    e->stats.n_active--;
    e->stats.tokens_gen += (uint64_t)s->res.n_gen;
    pthread_mutex_unlock(&e->mu);
    gen_result res = s->res;
    r->on_done(r, &res);
}

/* Longest common prefix of a slot's cached tokens and a prompt. */
static int common_prefix(const slot *s, const gen_request *r)
{
    int n = 0;
    while (n < s->n_tokens && n < r->n_prompt && s->tokens[n] == r->prompt[n])
        n++;
    return n;
}

/* Moves queued requests into free slots, best prefix match first. */
static void admit(engine *e)
{
    pthread_mutex_lock(&e->mu);
    while (e->queue_head) {
        gen_request *r = e->queue_head;
        slot *best = NULL;
        int best_len = -1;
        for (int i = 0; i < e->p.n_seq; i++) {
            slot *s = &e->slots[i];
            if (s->req)
                continue;
            int len = common_prefix(s, r);
            if (len > best_len || (len == best_len && s->last_used < best->last_used)) {
                best = s;
                best_len = len;
            }
        }
        if (!best)
            break;
        e->queue_head = r->next;
        if (!e->queue_head)
            e->queue_tail = NULL;
        e->n_queued--;
        /* Keep the shared prefix but always evaluate the prompt's last token:
         * its logits give the first generated token. */
        int keep = best_len < r->n_prompt ? best_len : r->n_prompt - 1;
        if (r->embedding)
            keep = 0;                /* pooling needs every row of the input */
        best->n_tokens = keep;
        best->feed = r->prompt;
        best->n_feed = r->n_prompt;
        best->n_fed = keep;
        best->pending = -1;
        best->req = r;
        memset(&best->res, 0, sizeof best->res);
        best->res.n_prompt = r->n_prompt;
        best->res.n_cached = keep;
        best->t_start = os_now_ns();
        best->t_prompt_done = 0;
        tok_stream_init(&best->ts);
        e->stats.n_active++;
        e->stats.tokens_prompt += (uint64_t)(r->n_prompt - keep);
        e->stats.tokens_cached += (uint64_t)keep;
        best->stop = NULL;
        best->epoch++;
        best->seed = sampler_resolve_seed(r->sampling.seed);
        best->need_start = true;
        pthread_mutex_unlock(&e->mu);
        int rc = r->n_stops > 0 ? stop_new(r->stops, r->n_stops, &best->stop) : 0;
        if (rc)
            finish(e, best, GEN_ERROR, rc_errmsg());
        pthread_mutex_lock(&e->mu);
    }
    e->stats.n_queued = e->n_queued;
    pthread_mutex_unlock(&e->mu);
}

/* Handles one sampled token of a slot; returns 1 when the slot finished. */
static int accept_token(engine *e, slot *s, const exec_sampled *x)
{
    gen_request *r = s->req;
    if (r->embedding) {
        if (!x->embd) {
            finish(e, s, GEN_ERROR, "the last stage sent a token for an embedding");
            return 1;
        }
        memcpy(r->embedding, x->embd, (size_t)e->embd_dims * sizeof(float));
        s->t_prompt_done = os_now_ns();
        finish(e, s, GEN_STOP, NULL);
        return 1;
    }
    int32_t t = x->token;
    if (t < 0) {
        finish(e, s, GEN_ERROR,
               t == EXEC_GRAMMAR_BANNED ? "the grammar allows no token here (logit_bias bans "
                                          "every token it allows, or the text after a lazy "
                                          "grammar's trigger does not match it)"
               : t == EXEC_GRAMMAR_LIMIT ? "the grammar is too ambiguous to follow here"
               : "every token is banned by logit_bias");
        return 1;
    }
    if (t >= e->n_vocab) {
        finish(e, s, GEN_ERROR, "the last stage sent a token outside the vocabulary");
        return 1;
    }
    if (!s->t_prompt_done)
        s->t_prompt_done = os_now_ns();
    if (r->on_token) {
        gen_token gt = { .id = t, .logprob = x->logprob, .n_top = x->n_top,
                         .top_ids = x->top_ids, .top_logprobs = x->top_lp };
        r->on_token(r, &gt);
    }
    /* a grammar decides where its text ends: it allows end-of-generation
     * only there, and only that when it can go no further */
    if ((!r->ignore_eos || r->grammar) && tok_is_eog(e->tok, t)) {
        finish(e, s, GEN_STOP, NULL);
        return 1;
    }
    s->res.n_gen++;
    bool special = false;
    for (int i = 0; i < r->n_text_tokens && !special; i++)
        special = r->text_tokens[i] == t;
    int n = tok_stream_push(e->tok, &s->ts, t, special, e->text, e->text_cap);
    if (n > 0 && push_text(s, e->text, (size_t)n)) {
        finish(e, s, GEN_STOP, NULL);
        return 1;
    }
    if ((r->max_tokens > 0 && s->res.n_gen >= r->max_tokens) || s->n_tokens >= e->p.n_ctx) {
        finish(e, s, GEN_LENGTH, NULL);
        return 1;
    }
    s->pending = t;
    return 0;
}

/* After a fault: every running request evaluates again its prompt and
 * what it has generated (the client has all of that already), on the new
 * executor, with a sampler made again as it was.  Results of the old
 * executor still on their way are dropped (new epochs). */
static int recover(engine *e, const char *why)
{
    uint64_t t0 = os_now_ns();
    int n_seqs = 0;
    uint64_t replayed = 0;
    rc_log(LOG_WARN, "engine: %s; rebuilding the running requests on a new plan", why);
    engine_exec *x = NULL;
    char reason[200];
    snprintf(reason, sizeof reason, "%s", why);
    /* The old executor goes first: its surviving stages let go of their
     * memory before the new plan loads. */
    free_groups(e);
    pthread_mutex_lock(&e->mu);
    engine_exec *old = e->x;
    e->x = &paused_exec;
    pthread_mutex_unlock(&e->mu);
    old->free(old);
    int rc = e->rebuild(e->rebuild_ud, reason, &x);
    if (!rc) {
        pthread_mutex_lock(&e->mu);
        e->x = x;
        pthread_mutex_unlock(&e->mu);
    }
    if (engine_groups(e)) {
        e->dead = true;
        snprintf(e->dead_why, sizeof e->dead_why, "out of memory rebuilding the instance");
    }
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s; and it cannot be rebuilt: %s", reason, rc_errmsg());
        pthread_mutex_lock(&e->mu);
        e->stats.n_recoveries_failed++;
        pthread_mutex_unlock(&e->mu);
        e->dead = true;
        snprintf(e->dead_why, sizeof e->dead_why, "%s", msg);
        snprintf(e->fault_why, sizeof e->fault_why, "%s", reason);
        for (int i = 0; i < e->p.n_seq; i++) {
            slot *s = &e->slots[i];
            s->n_tokens = 0;
            s->epoch++;
            if (s->req)
                finish(e, s, GEN_ERROR, msg);
        }
        return rc_fail(RC_EIO, "%s", msg);
    }
    for (int i = 0; i < e->p.n_seq; i++) {
        slot *s = &e->slots[i];
        s->epoch++;
        if (!s->req) {
            s->n_tokens = 0;             /* the new plan's caches are empty */
            continue;
        }
        /* the prompt, then what was generated: fed already, or sampled and
         * not fed yet (pending) */
        const gen_request *r = s->req;
        int n = 0;
        for (int k = 0; k < r->n_prompt; k++)
            s->replay[n++] = r->prompt[k];
        for (int k = r->n_prompt; k < s->n_tokens; k++)
            s->replay[n++] = s->tokens[k];
        if (s->pending >= 0 && s->n_fed >= s->n_feed)
            s->replay[n++] = s->pending;
        s->feed = s->replay;
        s->n_feed = n;
        s->n_fed = 0;
        s->n_tokens = 0;
        s->pending = -1;
        s->need_start = true;
        n_seqs++;
        replayed += (uint64_t)n;
    }
    pthread_mutex_lock(&e->mu);
    e->stats.n_recoveries++;
    e->stats.tokens_replayed += replayed;
    e->stats.last_recovery_at = (double)time(NULL);
    e->stats.last_recovery_s = (double)(os_now_ns() - t0) * 1e-9;
    e->stats.last_recovery_seqs = n_seqs;
    snprintf(e->stats.last_recovery_why, sizeof e->stats.last_recovery_why, "%s", reason);
    pthread_mutex_unlock(&e->mu);
    rc_log(LOG_INFO, "engine: rebuilt %d running request%s (%llu tokens to evaluate again) in "
           "%.1f s", n_seqs, n_seqs == 1 ? "" : "s", (unsigned long long)replayed,
           (double)(os_now_ns() - t0) * 1e-9);
    return 0;
}

/* Fails every request of a group whose batch was lost: what the stages
 * hold for them is unknown, so their caches are forgotten too.  When the
 * executor broke and can be rebuilt, every request is rebuilt instead. */
static void fail_group(engine *e, int g, const char *why)
{
    if (e->rebuild && !e->dead && e->x->broken && e->x->broken(e->x)) {
        recover(e, why);
        return;
    }
    if (e->dead)
        why = e->dead_why;
    char msg[300];
    snprintf(msg, sizeof msg, "forward pass failed: %s", why);
    rc_log(LOG_ERROR, "%s", msg);
    for (int i = g; i < e->p.n_seq; i += e->x->n_groups) {
        slot *s = &e->slots[i];
        s->n_tokens = 0;
        s->epoch++;
        if (s->req)
            finish(e, s, GEN_ERROR, msg);
        s->n_tokens = 0;
    }
}

/* Builds and submits the next batch of group g; 1 if one was sent. */
static int submit_group(engine *e, int g)
{
    group *gr = &e->groups[g];
    const int B = e->p.n_batch, G = e->x->n_groups;
    int n = 0, n_starts = 0;
    gr->n_out = 0;
    for (int i = g; i < e->p.n_seq && n < B; i += G) {
        slot *s = &e->slots[i];
        if (!s->req || s->pending < 0)
            continue;
        if (s->n_tokens >= e->p.n_ctx) {
            finish(e, s, GEN_LENGTH, NULL);
            continue;
        }
        e->b_tok[n] = s->pending;
        e->b_pos[n] = s->n_tokens;
        e->b_seq[n] = s->id;
        e->b_want[n] = 1;
        s->tokens[s->n_tokens++] = s->pending;
        s->pending = -1;
        gr->out_slot[gr->n_out] = s->id;
        gr->out_epoch[gr->n_out++] = s->epoch;
        n++;
    }
    for (int i = g; i < e->p.n_seq && n < B; i += G) {
        slot *s = &e->slots[i];
        if (!s->req || s->n_fed >= s->n_feed)
            continue;
        if (s->need_start) {
            gen_request *r = s->req;
            exec_start *st = &e->starts[n_starts++];
            st->seq = s->id;
            st->keep = s->n_fed;
            st->sp = r->sampling;
            st->sp.seed = s->seed;
            st->prompt = r->prompt;
            st->n_prompt = r->n_prompt;
            st->generated = s->feed + r->n_prompt;
            st->n_generated = s->n_feed - r->n_prompt;
            st->n_logprobs = r->n_logprobs;
            st->grammar = r->grammar;
            st->grammar_len = r->grammar ? (int)strlen(r->grammar) : 0;
            st->triggers = r->grammar_triggers;
            st->n_triggers = r->n_grammar_triggers;
            s->need_start = false;
        }
        int chunk = s->n_feed - s->n_fed;
        if (chunk > B - n)
            chunk = B - n;
        for (int k = 0; k < chunk; k++) {
            int32_t t = s->feed[s->n_fed];
            e->b_tok[n] = t;
            e->b_pos[n] = s->n_tokens;
            e->b_seq[n] = s->id;
            s->tokens[s->n_tokens++] = t;
            s->n_fed++;
            e->b_want[n] = s->n_fed == s->n_feed;
            if (e->b_want[n]) {
                gr->out_slot[gr->n_out] = s->id;
                gr->out_epoch[gr->n_out++] = s->epoch;
            }
            n++;
        }
    }
    if (n == 0)
        return 0;
    exec_batch b = { .group = g, .n_starts = n_starts, .starts = e->starts,
                     .rows = { .n_rows = n, .token = e->b_tok, .pos = e->b_pos, .seq = e->b_seq,
                               .logits = e->b_want } };
    gr->in_flight = true;
    if (e->x->submit(e->x, &b)) {
        gr->in_flight = false;
        fail_group(e, g, rc_errmsg());
    }
    return 1;
}

/* Takes one group's result; 1 if one came, 0 if none did in time. */
static int take_result(engine *e, int timeout_ms)
{
    int g = -1, n = 0;
    const exec_sampled *rows = NULL;
    int rc = e->x->collect(e->x, timeout_ms, &g, &rows, &n);
    if (rc == 0)
        return 0;
    if (g < 0 || g >= e->x->n_groups || !e->groups[g].in_flight)
        return 0;   /* an executor bug; nothing sane to do with it */
    group *gr = &e->groups[g];
    gr->in_flight = false;
    if (rc < 0) {
        fail_group(e, g, rc_errmsg());
        return 1;
    }
    if (n != gr->n_out) {
        char why[128];
        snprintf(why, sizeof why, "%d sampled rows came back, %d were asked for", n, gr->n_out);
        fail_group(e, g, why);
        return 1;
    }
    for (int k = 0; k < n; k++) {
        slot *s = &e->slots[gr->out_slot[k]];
        if (s->epoch != gr->out_epoch[k])
            continue;                        /* the slot went to another request */
        if (s->req)
            accept_token(e, s, &rows[k]);
    }
    return 1;
}

int engine_step(engine *e)
{
    /* Cancelled requests end here, before any more work is spent on them,
     * and before admitting, so their slots go to waiting requests now. */
    for (int i = 0; i < e->p.n_seq; i++) {
        slot *s = &e->slots[i];
        if (s->req && atomic_load(&s->req->cancel))
            finish(e, s, GEN_CANCELLED, NULL);
    }
    admit(e);
    /* (a rebuild may change the executor and its number of groups) */
    int sent = 0, flying = 0;
    for (int g = 0; g < e->x->n_groups; g++)
        if (!e->groups[g].in_flight)
            sent += submit_group(e, g);
    for (int g = 0; g < e->x->n_groups; g++)
        flying += e->groups[g].in_flight;
    if (!sent && !flying)
        return 0;
    /* One result at least (the local executor has it already); then
     * whatever else is ready, without waiting. */
    if (flying && take_result(e, COLLECT_WAIT_MS))
        while (take_result(e, 0)) {}
    pthread_mutex_lock(&e->mu);
    int used = 0;
    for (int i = 0; i < e->p.n_seq; i++)
        used += e->slots[i].n_tokens;
    e->stats.kv_used = used;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

int engine_run_until_idle(engine *e)
{
    int rc;
    while ((rc = engine_step(e)) > 0) {}
    return rc < 0 ? rc : 0;
}

void engine_get_stats(engine *e, engine_stats *st)
{
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    pthread_mutex_unlock(&e->mu);
}

const tokenizer *engine_tokenizer(const engine *e) { return e->tok; }
const model *engine_model(const engine *e) { return e->m; }

int engine_embd_dims(const engine *e) { return e->embd_dims; }
