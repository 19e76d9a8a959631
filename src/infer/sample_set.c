/* sample_set.c - one sampler per sequence slot, at the stage that makes
 * the logits (the last one), so that only token ids leave it; and each
 * slot's grammar, which those samplers obey. */
#include "exec.h"
#include "base/err.h"
#include "base/mem.h"
#include "grammar/grammar.h"

#include <math.h>
#include <string.h>

/* A slot's grammar.  A lazy one (triggers) has no match until a trigger
 * shows up in the generated text; until then `win` keeps the text's last
 * bytes, enough to find a trigger that a token completes. */
typedef struct {
    grammar *g;               /* NULL: no grammar */
    grammar_match *m;         /* NULL while lazy and waiting */
    char **trig;
    int n_trig;
    size_t max_trig;          /* longest trigger */
    char *win;                /* max_trig - 1 + tok_max_piece bytes */
    size_t n_win;
    int err;                  /* EXEC_GRAMMAR_*: what the next sample reports; 0 */
} slot_grammar;

struct sample_set {
    int n_seq, n_vocab;
    sampler **smp;
    int *n_logprobs;
    slot_grammar *gr;
    /* the vocabulary grammars match against (sample_set_use_*) */
    const tokenizer *tok;     /* borrowed, or own_tok */
    tokenizer *own_tok;
    const gguf_file *file;
    grammar_vocab *gv;
    char *piece;              /* one token's text (lazy triggers) */
    size_t piece_cap;
};

static void grammar_clear(slot_grammar *sg)
{
    grammar_match_free(sg->m);
    grammar_free(sg->g);
    for (int i = 0; i < sg->n_trig; i++)
        rc_free(sg->trig[i]);
    rc_free(sg->trig);
    rc_free(sg->win);
    memset(sg, 0, sizeof *sg);
}

int sample_set_new(int n_seq, int n_vocab, sample_set **out)
{
    *out = NULL;
    sample_set *s = rc_calloc(1, sizeof *s);
    if (!s || !(s->smp = rc_calloc((size_t)n_seq, sizeof *s->smp)) ||
        !(s->n_logprobs = rc_calloc((size_t)n_seq, sizeof(int))) ||
        !(s->gr = rc_calloc((size_t)n_seq, sizeof *s->gr))) {
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
    for (int i = 0; i < s->n_seq; i++) {
        if (s->smp)
            sampler_free(s->smp[i]);
        if (s->gr)
            grammar_clear(&s->gr[i]);
    }
    rc_free(s->smp);
    rc_free(s->n_logprobs);
    rc_free(s->gr);
    grammar_vocab_free(s->gv);
    tok_free(s->own_tok);
    rc_free(s->piece);
    rc_free(s);
}

void sample_set_use_tokenizer(sample_set *s, const tokenizer *tok) { s->tok = tok; }
void sample_set_use_file(sample_set *s, const gguf_file *f) { s->file = f; }

/* The grammar vocabulary, built the first time a grammar needs it: a stage
 * that never sees a grammar never pays for a tokenizer and a trie. */
static int need_vocab(sample_set *s)
{
    if (s->gv)
        return 0;
    int rc;
    if (!s->tok && !s->file)
        return rc_fail(RC_EUNSUPPORTED, "grammars are not available here: no tokenizer");
    if (!s->tok) {
        if ((rc = tok_load(s->file, &s->own_tok)))
            return rc_fail(rc, "loading the tokenizer for a grammar: %s", rc_errmsg());
        s->tok = s->own_tok;
    }
    if (tok_n_vocab(s->tok) > s->n_vocab)
        return rc_fail(RC_EINVAL, "the tokenizer has %d tokens, the model's output %d",
                       tok_n_vocab(s->tok), s->n_vocab);
    s->piece_cap = tok_max_piece(s->tok) + 1;
    if (!s->piece && !(s->piece = rc_malloc(s->piece_cap)))
        return rc_fail(RC_ENOMEM, "out of memory for a grammar");
    return grammar_vocab_new(s->tok, &s->gv);
}

/* The tokens after the tokenizer's (a model's output may be padded) are
 * never allowed either. */
static int mask(sample_set *s, grammar_match *m, float *logits)
{
    if (grammar_match_apply(m, logits))
        return EXEC_GRAMMAR_LIMIT;
    for (int i = grammar_vocab_n(s->gv); i < s->n_vocab; i++)
        logits[i] = -INFINITY;
    return 0;
}

static int grammar_code(int rc) { return rc == RC_ELIMIT ? EXEC_GRAMMAR_LIMIT : EXEC_GRAMMAR_BANNED; }

/* A lazy grammar waiting for its trigger: the token's text joins the
 * window, and the first trigger found there starts the match, fed the text
 * from the trigger's first byte on. */
static void watch_triggers(sample_set *s, slot_grammar *sg, int32_t token)
{
    int n = tok_piece(s->tok, token, true, s->piece, s->piece_cap);
    if (n <= 0)
        return;
    if ((size_t)n > s->piece_cap)
        n = (int)s->piece_cap;   /* cannot happen: the cap is the longest piece */
    memcpy(sg->win + sg->n_win, s->piece, (size_t)n);
    sg->n_win += (size_t)n;
    const char *first = NULL;
    for (int i = 0; i < sg->n_trig; i++) {
        size_t tl = strlen(sg->trig[i]);
        for (const char *p = sg->win; p + tl <= sg->win + sg->n_win && (!first || p < first); p++)
            if (!memcmp(p, sg->trig[i], tl)) {
                first = p;
                break;
            }
    }
    if (first) {
        int rc = grammar_match_new(sg->g, s->gv, &sg->m);
        if (rc)
            sg->err = EXEC_GRAMMAR_LIMIT;
        else if ((rc = grammar_match_accept_text(sg->m, first,
                                                 (size_t)(sg->win + sg->n_win - first))))
            sg->err = grammar_code(rc);
        sg->n_win = 0;
        return;
    }
    /* a trigger still to come may begin in the last max_trig - 1 bytes */
    size_t keep = sg->max_trig - 1;
    if (sg->n_win > keep) {
        memmove(sg->win, sg->win + sg->n_win - keep, keep);
        sg->n_win = keep;
    }
}

/* Records a token the slot generated in its grammar. */
static void grammar_advance(sample_set *s, slot_grammar *sg, int32_t token)
{
    if (!sg->g || sg->err)
        return;
    if (sg->m) {
        int rc = grammar_match_accept(sg->m, token);
        if (rc)
            sg->err = grammar_code(rc);
    } else {
        watch_triggers(s, sg, token);
    }
}

static int grammar_start(sample_set *s, const exec_start *st, slot_grammar *sg)
{
    if (st->grammar_len < 0 || st->n_triggers < 0 || st->n_triggers > EXEC_MAX_TRIGGERS)
        return rc_fail(RC_EINVAL, "a grammar has at most %d triggers", EXEC_MAX_TRIGGERS);
    int rc = need_vocab(s);
    if (rc)
        return rc;
    if ((rc = grammar_compile(st->grammar, (size_t)st->grammar_len, &sg->g)))
        return rc;   /* the message names the line and column */
    if (st->n_triggers == 0)
        return grammar_match_new(sg->g, s->gv, &sg->m);
    if (!(sg->trig = rc_calloc((size_t)st->n_triggers, sizeof *sg->trig)))
        return rc_fail(RC_ENOMEM, "out of memory for a grammar");
    for (int i = 0; i < st->n_triggers; i++) {
        size_t n = strlen(st->triggers[i]);
        if (n == 0 || n > EXEC_MAX_TRIGGER_LEN)
            return rc_fail(RC_EINVAL, "a grammar trigger has 1 to %d bytes, not %zu",
                           EXEC_MAX_TRIGGER_LEN, n);
        if (!(sg->trig[i] = rc_malloc(n + 1)))
            return rc_fail(RC_ENOMEM, "out of memory for a grammar");
        memcpy(sg->trig[i], st->triggers[i], n + 1);
        sg->n_trig = i + 1;
        if (n > sg->max_trig)
            sg->max_trig = n;
    }
    if (!(sg->win = rc_malloc(sg->max_trig + s->piece_cap)))
        return rc_fail(RC_ENOMEM, "out of memory for a grammar");
    return 0;
}

int sample_set_start(sample_set *s, const exec_start *st)
{
    if (st->seq < 0 || st->seq >= s->n_seq)
        return rc_fail(RC_EINVAL, "sequence slot %d outside 0..%d", st->seq, s->n_seq - 1);
    if (st->n_logprobs < 0 || st->n_logprobs > EXEC_MAX_TOP)
        return rc_fail(RC_EINVAL, "top logprobs must be between 0 and %d", EXEC_MAX_TOP);
    sampler *smp = NULL;
    slot_grammar sg = { 0 };
    int rc = sampler_new(&st->sp, s->n_vocab, &smp);
    if (!rc && st->grammar)
        rc = grammar_start(s, st, &sg);
    if (rc) {
        sampler_free(smp);
        grammar_clear(&sg);
        return rc;
    }
    sampler_accept_prompt(smp, st->prompt, st->n_prompt);
    /* the replay takes as many draws as sample_set_sample did */
    for (int i = 0; i < st->n_generated; i++) {
        if (sg.m)
            sampler_skip_draw(smp);
        sampler_replay(smp, &st->generated[i], 1);
        grammar_advance(s, &sg, st->generated[i]);
    }
    if (sg.err) {
        sampler_free(smp);
        grammar_clear(&sg);
        return rc_fail(RC_EINVAL, "the tokens generated before the restart do not match "
                       "the grammar");
    }
    sampler_free(s->smp[st->seq]);
    grammar_clear(&s->gr[st->seq]);
    s->smp[st->seq] = smp;
    s->gr[st->seq] = sg;
    s->n_logprobs[st->seq] = st->n_logprobs;
    return 0;
}

/* Draws a token that the grammar allows (see sample_set_sample in exec.h);
 * logits come biased and penalised. */
static int32_t sample_grammar(sample_set *s, sampler *smp, grammar_match *m, bool logprobs,
                              float *logits)
{
    if (!logprobs) {
        int32_t t = sampler_sample_prepared(smp, logits);
        if (t < 0)
            return EXEC_BANNED;
        if (grammar_match_allows(m, t)) {
            sampler_skip_draw(smp);
            return t;
        }
    }
    /* log-probabilities are those of the constrained choice: masked first */
    int rc = mask(s, m, logits);
    if (rc)
        return rc;
    if (logprobs)
        sampler_skip_draw(smp);
    int32_t t = sampler_sample_prepared(smp, logits);
    return t < 0 ? EXEC_GRAMMAR_BANNED : t;
}

int sample_set_sample(sample_set *s, int seq, float *logits, exec_sampled *out)
{
    if (seq < 0 || seq >= s->n_seq || !s->smp[seq])
        return rc_fail(RC_ESTATE, "sequence slot %d has no sampler", seq);
    sampler *smp = s->smp[seq];
    slot_grammar *sg = &s->gr[seq];
    int32_t t;
    out->n_top = 0;
    out->logprob = 0;
    if (sg->err) {
        t = sg->err;
    } else if (sg->m) {
        sampler_prepare(smp, logits);
        t = sample_grammar(s, smp, sg->m, s->n_logprobs[seq] > 0, logits);
    } else {
        t = sampler_sample(smp, logits);
        if (t < 0)
            t = EXEC_BANNED;
    }
    out->token = t;
    if (t < 0)
        return 0;
    sampler_accept(smp, t);
    grammar_advance(s, sg, t);
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
    if (seq >= 0 && seq < s->n_seq && s->smp[seq]) {
        sampler_accept(s->smp[seq], token);
        grammar_advance(s, &s->gr[seq], token);
    }
}

int sample_set_constrain(sample_set *s, int seq, float *logits)
{
    if (seq < 0 || seq >= s->n_seq || !s->gr[seq].m || s->gr[seq].err)
        return 0;
    int rc = mask(s, s->gr[seq].m, logits);
    return rc ? rc_fail(RC_ELIMIT, "the grammar is too ambiguous here") : 1;
}
