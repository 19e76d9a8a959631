/* sampler.h - picks the next token from a row of logits.
 *
 * One sampler serves one sequence.  Each call to sampler_sample runs the
 * chain of llama.cpp's default sampler, in this order:
 *
 *   logit bias -> penalties -> top-k -> top-p -> min-p -> temperature
 *   -> softmax -> one draw from the seeded generator (base/rng.h)
 *
 * With temperature <= 0 the chain stops after the penalties and the token
 * with the largest logit is taken (the lowest id among equal ones).
 *
 * Two histories feed the penalties:
 *   - the repeat window: the last repeat_last_n tokens, prompt and generated
 *     alike (as llama.cpp's server feeds its prompt into the sampler), used
 *     by repeat_penalty;
 *   - the generated counts: every token passed to sampler_accept since the
 *     last reset, used by presence_penalty and frequency_penalty (OpenAI
 *     counts the completion only, never the prompt).
 *
 * A token is a candidate while its logit is a number above -INFINITY; NaN
 * and -INFINITY logits are never drawn.  The work arrays are allocated once
 * by sampler_new (a few words per vocabulary entry); sampling allocates
 * nothing.  A sampler is not thread safe; use one per sequence.
 */
#ifndef RC_SAMPLER_H
#define RC_SAMPLER_H

#include <stdint.h>

/* A logit_bias value at or below this bans the token (as does -INFINITY),
 * following OpenAI's "-100 should result in a ban". */
#define SAMPLER_BAN_BIAS (-100.0f)

typedef struct {
    float temperature;        /* 0 (or less) = greedy */
    int   top_k;              /* keep the k most likely; 0 = off */
    float top_p;              /* keep the smallest prefix with mass >= top_p; 1 = off */
    float min_p;              /* keep p >= min_p * p_max; 0 = off */
    float repeat_penalty;     /* over the repeat window: l > 0 ? l / r : l * r; 1 = off */
    int   repeat_last_n;      /* repeat window in tokens; -1 = everything accepted, 0 = off */
    float presence_penalty;   /* l -= presence * (count > 0), generated tokens only */
    float frequency_penalty;  /* l -= frequency * count, generated tokens only */
    uint64_t seed;            /* 0 = choose one from the clock (see sampler_seed) */
    /* logit_bias: bias_values[i] is added to the logit of bias_ids[i]; a value
     * of -INFINITY or <= SAMPLER_BAN_BIAS bans the token.  sampler_new copies
     * the arrays; the caller may free them afterwards. */
    const int32_t *bias_ids;
    const float   *bias_values;
    int            n_bias;
} sampler_params;

/* Fills llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95,
 * min_p 0.05, repeat_penalty 1 (off), repeat_last_n 64, presence and
 * frequency 0, seed 0 (from the clock), no bias. */
void sampler_params_default(sampler_params *p);

typedef struct sampler sampler;

/* Checks the parameters and allocates a sampler for a vocabulary of n_vocab
 * tokens.  RC_EINVAL (detail names the field) for a value out of range: a
 * NaN, top_k < 0, top_p or min_p outside [0, 1], repeat_penalty <= 0,
 * repeat_last_n < -1, a bias id outside [0, n_vocab) or a NaN bias.
 * RC_ENOMEM on allocation failure.  On success *out owns everything. */
int  sampler_new(const sampler_params *p, int n_vocab, sampler **out);
void sampler_free(sampler *s);                   /* accepts NULL */

/* The seed in use: p->seed, or the one drawn from the clock when it was 0
 * (never 0, so passing it back as p->seed reproduces the run). */
uint64_t sampler_seed(const sampler *s);

/* `seed`, or for 0 the seed a sampler would choose (for a sampler made on
 * another node, whose seed the requester must report). */
uint64_t sampler_resolve_seed(uint64_t seed);

/* Records prompt tokens: they enter the repeat window only.  Ids outside
 * the vocabulary are ignored. */
void sampler_accept_prompt(sampler *s, const int32_t *tokens, int n_tokens);

/* Records a generated token (normally the one sampler_sample returned): it
 * enters the repeat window and the generated counts.  Ids outside the
 * vocabulary are ignored. */
void sampler_accept(sampler *s, int32_t token);

/* The state after having sampled `tokens` in turn: each accepted, and the
 * random stream moved past the one draw each cost (none when greedy).  A
 * sampler made again with the same seed, the same prompt and this replay
 * goes on as the first one would have. */
void sampler_replay(sampler *s, const int32_t *tokens, int n_tokens);

/* Forgets both histories and restarts the generator from the seed, so a
 * reset sampler repeats its earlier choices given the same logits. */
void sampler_reset(sampler *s);

/* Samples one token from logits[n_vocab].  On return logits holds the
 * biased and penalised values (truncation and temperature are applied to a
 * private copy), which is what sampler_logprobs expects.  Does not record
 * the token: call sampler_accept.  Returns the token id, or -1 when no token
 * is a candidate (all banned, -INFINITY or NaN).  Each non-greedy call
 * takes exactly one number from the generator. */
int32_t sampler_sample(sampler *s, float *logits);

/* The rest of the chain on a row that sampler_prepare has biased and
 * penalised (logits unchanged): what sampler_sample does after it.  A
 * grammar (sample_set.c) draws from a row, then, when the grammar refuses
 * the token, from the same row masked, without biasing it twice. */
int32_t sampler_sample_prepared(sampler *s, const float *logits);

/* Moves the random stream past one draw (none when greedy), as a sampling
 * call would: keeps the number of draws per token fixed when a second
 * draw was not needed, so that a replay (sampler_replay) can count them. */
void sampler_skip_draw(sampler *s);

/* The first two links of the chain: adds the logit bias and applies the
 * penalties to logits[n_vocab] in place, as sampler_sample does before it
 * draws.  Does not change s.  (A tensor-parallel shard that holds part of
 * the vocabulary ranks its part by these values to send shard 0 only the
 * tokens that can be drawn.) */
void sampler_prepare(const sampler *s, float *logits);

/* The k best of logits[col0, col0 + n) in the order sampler_sample ranks
 * them (the larger logit first, the lower id among equals), skipping those
 * it never draws (NaN, -INFINITY): their ids, best first, in ids[k] (heap:
 * k pairs of scratch).  Returns how many (fewer than k when fewer can be
 * drawn).  With the row prepared (sampler_prepare), a draw that keeps only
 * the top k can only pick one of these. */
typedef struct { float logit; int32_t id; float w; } sampler_cand;
int sampler_best(const float *logits, int col0, int n, int k, sampler_cand *heap, int32_t *ids);

/* The parameters the sampler was made with. */
const sampler_params *sampler_get_params(const sampler *s);

/* OpenAI logprobs: the log-softmax of logits (as sampler_sample left them:
 * biased and penalised, before truncation and temperature).  Writes the
 * chosen token's log-probability to *chosen_logprob (-INFINITY if it is not
 * a candidate) and the n_top most likely candidates, best first (lowest id
 * among equals), to top_ids / top_logprobs.  Returns how many were written
 * (fewer than n_top when fewer tokens are candidates), or RC_EINVAL for a
 * chosen id outside the vocabulary or n_top < 0.  Does not change s; safe
 * to call from several threads on one sampler. */
int sampler_logprobs(const sampler *s, const float *logits, int32_t chosen, int n_top,
                     int32_t *top_ids, float *top_logprobs, float *chosen_logprob);

#endif
