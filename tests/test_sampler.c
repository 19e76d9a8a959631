/* test_sampler.c - the sampling chain (sampler.h) and stop strings (stop.h).
 *
 * Distribution tests draw N samples with a fixed seed and compare each
 * token's frequency with its exact probability within 5 standard errors
 * (sqrt(p (1 - p) / N)); a token whose probability is 0 must never appear.
 * Penalty tests run greedy (which leaves the biased, penalised logits in
 * the row) and compare the numbers exactly.
 */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"
#include "infer/sampler.h"
#include "infer/stop.h"

#include <float.h>
#include <stdbool.h>

/* ---- helpers --------------------------------------------------------- */

/* Temperature 1, no truncation, no penalties: the plain softmax. */
static sampler_params plain(void)
{
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    return p;
}

static void draw_freq(const sampler_params *p, const float *logits, int n_vocab, int n_draw,
                      double *freq)
{
    sampler *s;
    float *row = malloc((size_t)n_vocab * sizeof *row);
    long *count = calloc((size_t)n_vocab, sizeof *count);
    CHECK(row && count);
    CHECK_OK(sampler_new(p, n_vocab, &s));
    for (int i = 0; i < n_draw; i++) {
        memcpy(row, logits, (size_t)n_vocab * sizeof *row);
        int32_t t = sampler_sample(s, row);
        CHECK_INT(t, >=, 0);
        CHECK_INT(t, <, n_vocab);
        count[t]++;
    }
    for (int i = 0; i < n_vocab; i++)
        freq[i] = (double)count[i] / n_draw;
    sampler_free(s);
    free(row);
    free(count);
}

static void check_freq(const double *freq, const double *want, int n, int n_draw)
{
    for (int i = 0; i < n; i++) {
        if (want[i] == 0.0) {
            if (freq[i] != 0.0)
                FAIL("token %d has probability 0 but frequency %g", i, freq[i]);
            continue;
        }
        double se = sqrt(want[i] * (1.0 - want[i]) / n_draw);
        if (fabs(freq[i] - want[i]) > 5.0 * se)
            FAIL("token %d: frequency %.5f, probability %.5f (5 se = %.5f)",
                 i, freq[i], want[i], 5.0 * se);
    }
}

/* Greedy run of one row: returns the token and leaves the processed logits. */
static int32_t greedy_row(sampler *s, float *row) { return sampler_sample(s, row); }

/* ---- parameters ------------------------------------------------------ */

TEST(sampler_params_and_validation)
{
    sampler_params p;
    sampler *s;
    int32_t id = 7;
    float v = 1.0f;

    sampler_params_default(&p);
    CHECK_NEAR(p.temperature, 0.8, 1e-7);
    CHECK_INT(p.top_k, ==, 40);
    CHECK_NEAR(p.top_p, 0.95, 1e-7);
    CHECK_NEAR(p.min_p, 0.05, 1e-7);
    CHECK_NEAR(p.repeat_penalty, 1.0, 0);
    CHECK_INT(p.repeat_last_n, ==, 64);
    CHECK_INT(p.seed, ==, 0);
    CHECK_INT(p.n_bias, ==, 0);

    CHECK_INT(sampler_new(&p, 0, &s), ==, RC_EINVAL);
    CHECK(s == NULL);
    p.top_p = 1.5f;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.min_p = -0.1f;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.repeat_penalty = 0.0f;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.top_k = -1;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.repeat_last_n = -2;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.temperature = NAN;
    CHECK_INT(sampler_new(&p, 10, &s), ==, RC_EINVAL);
    sampler_params_default(&p);
    p.bias_ids = &id;
    p.bias_values = &v;
    p.n_bias = 1;
    CHECK_INT(sampler_new(&p, 5, &s), ==, RC_EINVAL);          /* id 7 >= 5 */
    CHECK(strstr(rc_errmsg(), "7") != NULL);
    CHECK_OK(sampler_new(&p, 8, &s));
    sampler_free(s);
    sampler_free(NULL);
}

TEST(sampler_alloc_failure)
{
    sampler_params p;
    sampler *s;
    int32_t ids[2] = {1, 2};
    float vals[2] = {1.0f, -1.0f};
    int failed = 0;

    sampler_params_default(&p);
    p.bias_ids = ids;
    p.bias_values = vals;
    p.n_bias = 2;
    for (long n = 0; n < 20; n++) {
        rc_mem_fail_after(n);
        int rc = sampler_new(&p, 100, &s);
        rc_mem_fail_after(-1);
        if (rc == 0) {
            sampler_free(s);
            break;
        }
        CHECK_INT(rc, ==, RC_ENOMEM);
        CHECK(s == NULL);
        failed++;
    }
    CHECK_INT(failed, >=, 5);     /* sampler, counts, candidates, ring, bias */

    /* Sampling allocates nothing: it works with every allocation failing. */
    CHECK_OK(sampler_new(&p, 100, &s));
    float row[100];
    for (int i = 0; i < 100; i++)
        row[i] = (float)(i % 7);
    rc_mem_fail_after(0);
    int32_t t = sampler_sample(s, row);
    rc_mem_fail_after(-1);
    CHECK_INT(t, >=, 0);
    sampler_free(s);
}

/* ---- greedy ---------------------------------------------------------- */

TEST(sampler_greedy_ties_lowest_id)
{
    sampler_params p = plain();
    sampler *s;
    p.temperature = 0.0f;
    CHECK_OK(sampler_new(&p, 6, &s));

    float a[6] = {1, 3, 2, 3, -1, 3};
    CHECK_INT(greedy_row(s, a), ==, 1);
    float b[6] = {NAN, 0, 5, NAN, 5, 1};            /* NaN is never a candidate */
    CHECK_INT(greedy_row(s, b), ==, 2);
    float c[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_INT(greedy_row(s, c), ==, -1);
    float d[6] = {-INFINITY, -1e30f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_INT(greedy_row(s, d), ==, 1);
    sampler_free(s);

    /* Negative temperature is greedy too, and ignores truncation. */
    p.temperature = -1.0f;
    p.top_k = 1;
    CHECK_OK(sampler_new(&p, 6, &s));
    float e[6] = {0, 0, 9, 0, 9, 0};
    CHECK_INT(greedy_row(s, e), ==, 2);
    sampler_free(s);
}

/* ---- distributions --------------------------------------------------- */

TEST(sampler_softmax_distribution)
{
    enum { V = 5, N = 100000 };
    float logits[V];
    double freq[V], want[V];
    sampler_params p = plain();
    /* softmax([ln 1, ln 2, ... ln 5]) = [1..5] / 15 */
    for (int i = 0; i < V; i++) {
        logits[i] = logf((float)(i + 1));
        want[i] = (i + 1) / 15.0;
    }
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want, V, N);

    /* Shifting every logit changes nothing. */
    for (int i = 0; i < V; i++)
        logits[i] += 100.0f;
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want, V, N);
}

TEST(sampler_top_k)
{
    enum { V = 6, N = 100000 };
    float logits[V];
    double freq[V], want[V] = {0, 0, 0, 0, 5.0 / 11, 6.0 / 11};
    sampler_params p = plain();
    for (int i = 0; i < V; i++)
        logits[i] = logf((float)(i + 1));
    p.top_k = 2;
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want, V, N);

    /* The same with the ids shuffled: the selection follows the logits. */
    float shuf[V] = {logits[4], logits[0], logits[5], logits[2], logits[1], logits[3]};
    double want2[V] = {5.0 / 11, 0, 6.0 / 11, 0, 0, 0};
    draw_freq(&p, shuf, V, N, freq);
    check_freq(freq, want2, V, N);

    /* Ties at the cut keep the lowest ids. */
    float flat[V] = {0, 0, 0, 0, 0, 0};
    double want3[V] = {0.5, 0.5, 0, 0, 0, 0};
    draw_freq(&p, flat, V, 20000, freq);
    check_freq(freq, want3, V, 20000);

    /* top_k 1 is greedy; top_k >= V is no truncation. */
    p.top_k = 1;
    draw_freq(&p, shuf, V, 1000, freq);
    CHECK_NEAR(freq[2], 1.0, 0);
    p.top_k = 100;
    double want5[V];
    for (int i = 0; i < V; i++)
        want5[i] = (i + 1) / 21.0;
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want5, V, N);
}

/* Large vocabulary: every draw lies in the reference top-k / top-p set. */
static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

TEST(sampler_large_vocab_truncation)
{
    enum { V = 32000, N = 400 };
    float *logits = malloc(V * sizeof *logits), *sorted = malloc(V * sizeof *sorted);
    float *row = malloc(V * sizeof *row);
    rng_state r;
    sampler *s;
    sampler_params p = plain();

    CHECK(logits && sorted && row);
    rng_seed(&r, 99);
    for (int i = 0; i < V; i++)
        logits[i] = 3.0f * rng_normal(&r);
    memcpy(sorted, logits, V * sizeof *sorted);
    qsort(sorted, V, sizeof *sorted, cmp_desc);

    /* top-k 40: the drawn logit is at least the 40th largest. */
    p.top_k = 40;
    CHECK_OK(sampler_new(&p, V, &s));
    for (int i = 0; i < N; i++) {
        memcpy(row, logits, V * sizeof *row);
        int32_t t = sampler_sample(s, row);
        CHECK(t >= 0 && t < V);
        CHECK(logits[t] >= sorted[39]);
    }
    sampler_free(s);

    /* top-p 0.9 alone (the mass-tracking quickselect): the drawn token lies
     * in the smallest prefix of mass >= 0.9. */
    double total = 0.0, cum = 0.0;
    int keep = 0;
    for (int i = 0; i < V; i++)
        total += exp((double)sorted[i] - sorted[0]);
    while (cum < 0.9 * total)
        cum += exp((double)sorted[keep++] - sorted[0]);
    CHECK_INT(keep, >, 1000);      /* a wide cut, many partition rounds */
    p.top_k = 0;
    p.top_p = 0.9f;
    CHECK_OK(sampler_new(&p, V, &s));
    for (int i = 0; i < N; i++) {
        memcpy(row, logits, V * sizeof *row);
        int32_t t = sampler_sample(s, row);
        CHECK(t >= 0 && t < V);
        CHECK(logits[t] >= sorted[keep - 1]);
    }
    sampler_free(s);
    free(logits);
    free(sorted);
    free(row);
}

TEST(sampler_top_p)
{
    enum { V = 4, N = 100000 };
    /* probabilities 0.1 0.4 0.2 0.3 by id (not sorted) */
    float logits[V] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    double freq[V];
    sampler_params p = plain();

    /* 0.4 + 0.3 = 0.7 >= 0.65: keep two, in ratio 4:3. */
    p.top_p = 0.65f;
    double want1[V] = {0, 4.0 / 7, 0, 3.0 / 7};
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want1, V, N);

    /* 0.75 needs the third (0.9). */
    p.top_p = 0.75f;
    double want2[V] = {0, 4.0 / 9, 2.0 / 9, 3.0 / 9};
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want2, V, N);

    /* After top-k 3 the mass is renormalised over the three (as llama.cpp
     * does): 0.4/0.9 + 0.3/0.9 = 0.78 >= 0.75, so two remain. */
    p.top_k = 3;
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want1, V, N);

    /* top_p 0 keeps the single best. */
    p.top_k = 0;
    p.top_p = 0.0f;
    double want3[V] = {0, 1, 0, 0};
    draw_freq(&p, logits, V, 1000, freq);
    check_freq(freq, want3, V, 1000);

    /* Equal logits: exactly the first half by id for p = 0.5. */
    enum { F = 1000 };
    static float flat[F];
    static double ff[F];
    p.top_p = 0.5f;
    draw_freq(&p, flat, F, 20000, ff);
    for (int i = 0; i < F; i++)
        CHECK(i < F / 2 ? ff[i] > 0.0 : ff[i] == 0.0);
}

TEST(sampler_min_p)
{
    enum { V = 5, N = 100000 };
    /* probabilities 0.5 0.25 0.15 0.1 and a tiny one */
    float logits[V] = {logf(0.1f), logf(0.5f), logf(0.15f), logf(0.25f), logf(0.001f)};
    double freq[V];
    sampler_params p = plain();

    /* min_p 0.25: keep p >= 0.125, that is 0.5, 0.25, 0.15. */
    p.min_p = 0.25f;
    double want[V] = {0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9, 0};
    draw_freq(&p, logits, V, N, freq);         /* unsorted path */
    check_freq(freq, want, V, N);
    p.top_k = 4;                               /* sorted path, same result */
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want, V, N);

    /* min_p 1 keeps only the maximum. */
    p.top_k = 0;
    p.min_p = 1.0f;
    double want1[V] = {0, 1, 0, 0, 0};
    draw_freq(&p, logits, V, 1000, freq);
    check_freq(freq, want1, V, 1000);
}

TEST(sampler_temperature)
{
    enum { V = 2, N = 100000 };
    float logits[V] = {0.0f, logf(2.0f)};
    double freq[V];
    sampler_params p = plain();

    p.temperature = 1.0f;                      /* 1 : 2 */
    double w1[V] = {1.0 / 3, 2.0 / 3};
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, w1, V, N);

    p.temperature = 0.5f;                      /* 1 : 4, sharper */
    double w2[V] = {0.2, 0.8};
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, w2, V, N);

    p.temperature = 2.0f;                      /* 1 : sqrt 2, flatter */
    double w3[V] = {1.0 / (1.0 + sqrt(2.0)), sqrt(2.0) / (1.0 + sqrt(2.0))};
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, w3, V, N);

    /* Temperature comes after min-p: min_p 0.6 removes token 0 (0.5 < 0.6
     * of the max) even though at temperature 2 it would pass. */
    p.min_p = 0.6f;
    double w4[V] = {0, 1};
    draw_freq(&p, logits, V, 1000, freq);
    check_freq(freq, w4, V, 1000);
}

TEST(sampler_never_draws_banned)
{
    enum { V = 8, N = 20000 };
    float logits[V] = {-INFINITY, 0, NAN, 0, -INFINITY, 0, NAN, 0};
    double freq[V], want[V] = {0, 0.25, 0, 0.25, 0, 0.25, 0, 0.25};
    sampler_params p = plain();
    draw_freq(&p, logits, V, N, freq);
    check_freq(freq, want, V, N);

    /* An infinite logit takes all the mass. */
    float inf[V] = {0, 0, INFINITY, 0, 0, 0, 0, 0};
    double want_inf[V] = {0, 0, 1, 0, 0, 0, 0, 0};
    draw_freq(&p, inf, V, 1000, freq);
    check_freq(freq, want_inf, V, 1000);

    /* Nothing left: -1. */
    sampler *s;
    float none[V] = {-INFINITY, NAN, -INFINITY, NAN, -INFINITY, -INFINITY, NAN, -INFINITY};
    CHECK_OK(sampler_new(&p, V, &s));
    CHECK_INT(sampler_sample(s, none), ==, -1);
    sampler_free(s);
}

/* ---- penalties and bias ---------------------------------------------- */

TEST(sampler_repeat_penalty)
{
    enum { V = 5 };
    const float base[V] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    float row[V];
    sampler_params p = plain();
    sampler *s;
    int32_t prompt[2] = {0, 1};

    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, prompt, 2);       /* the prompt is in the window */
    sampler_accept(s, 3);
    sampler_accept(s, 3);                      /* counted once: a factor, not a power */
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 4);
    CHECK_NEAR(row[0], 1.0, 0);                /* 2 / 2 */
    CHECK_NEAR(row[1], -4.0, 0);               /* -2 * 2 */
    CHECK_NEAR(row[2], 1.0, 0);
    CHECK_NEAR(row[3], 0.25, 0);               /* 0.5 / 2 */
    CHECK_NEAR(row[4], 3.0, 0);

    sampler_reset(s);
    memcpy(row, base, sizeof row);
    sampler_sample(s, row);
    for (int i = 0; i < V; i++)
        CHECK_NEAR(row[i], base[i], 0);
    sampler_free(s);

    /* A window of 2 sees only the last two tokens. */
    int32_t many[5] = {0, 1, 2, 3, 2};
    p.repeat_last_n = 2;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, many, 4);         /* window: 2 3 */
    memcpy(row, base, sizeof row);
    sampler_sample(s, row);
    float want[V] = {2.0f, -2.0f, 0.5f, 0.25f, 3.0f};
    for (int i = 0; i < V; i++)
        CHECK_NEAR(row[i], want[i], 0);
    sampler_accept(s, 4);                      /* window: 3 4 */
    memcpy(row, base, sizeof row);
    sampler_sample(s, row);
    float want2[V] = {2.0f, -2.0f, 1.0f, 0.25f, 1.5f};
    for (int i = 0; i < V; i++)
        CHECK_NEAR(row[i], want2[i], 0);
    sampler_free(s);

    /* -1: the whole history; 0: off. */
    p.repeat_last_n = -1;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, many, 5);
    for (int i = 0; i < 200; i++)
        sampler_accept(s, 4);
    memcpy(row, base, sizeof row);
    sampler_sample(s, row);
    float want3[V] = {1.0f, -4.0f, 0.5f, 0.25f, 1.5f};
    for (int i = 0; i < V; i++)
        CHECK_NEAR(row[i], want3[i], 0);
    sampler_free(s);
    p.repeat_last_n = 0;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, many, 5);
    memcpy(row, base, sizeof row);
    sampler_sample(s, row);
    for (int i = 0; i < V; i++)
        CHECK_NEAR(row[i], base[i], 0);
    sampler_free(s);
}

TEST(sampler_presence_frequency)
{
    enum { V = 5 };
    const float base[V] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    float row[V];
    sampler_params p = plain();
    sampler *s;
    int32_t prompt[1] = {4};

    p.temperature = 0.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, prompt, 1);       /* prompt: not counted */
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    sampler_accept(s, -3);                     /* ignored */
    sampler_accept(s, V);                      /* ignored */
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 4);
    CHECK_NEAR(row[0], 2.0 - 2 * 0.25 - 0.5, 0);
    CHECK_NEAR(row[1], -2.0 - 0.25 - 0.5, 0);
    CHECK_NEAR(row[2], 1.0, 0);
    CHECK_NEAR(row[3], 0.5, 0);
    CHECK_NEAR(row[4], 3.0, 0);
    sampler_free(s);

    /* With a repeat penalty: the factor first, then the subtraction; the
     * prompt token 4 gets the factor only. */
    p.repeat_penalty = 2.0f;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept_prompt(s, prompt, 1);
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    sampler_accept(s, 1);
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 4);
    CHECK_NEAR(row[0], 2.0 / 2 - 1.0, 0);
    CHECK_NEAR(row[1], -2.0 * 2 - 0.75, 0);
    CHECK_NEAR(row[4], 1.5, 0);

    /* Negative penalties encourage repetition. */
    sampler_free(s);
    p.repeat_penalty = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 0.0f;
    CHECK_OK(sampler_new(&p, V, &s));
    sampler_accept(s, 2);
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 2);  /* 1 + 2 = 3 ties token 4, lower id wins */
    CHECK_NEAR(row[2], 3.0, 0);
    sampler_free(s);
}

TEST(sampler_logit_bias)
{
    enum { V = 5, N = 50000 };
    const float base[V] = {0.0f, 4.0f, 1.0f, 2.0f, 0.0f};
    int32_t ids[3] = {1, 3, 4};
    float vals[3] = {-100.0f, 3.0f, -INFINITY};
    float row[V];
    sampler_params p = plain();
    sampler *s;

    p.temperature = 0.0f;
    p.bias_ids = ids;
    p.bias_values = vals;
    p.n_bias = 3;
    CHECK_OK(sampler_new(&p, V, &s));
    ids[0] = 0;                                /* the sampler keeps its own copy */
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 3);  /* 2 + 3 = 5 beats the banned 4 */
    CHECK(row[1] == -INFINITY);
    CHECK(row[4] == -INFINITY);
    CHECK_NEAR(row[3], 5.0, 0);
    CHECK_NEAR(row[0], 0.0, 0);
    sampler_free(s);
    ids[0] = 1;

    /* Sampling: banned tokens never appear; the rest follow the biased
     * softmax over logits {0, -, 1, 5, -}. */
    p.temperature = 1.0f;
    double freq[V], z = 1.0 + exp(1.0) + exp(5.0);
    double want[V] = {1.0 / z, 0, exp(1.0) / z, exp(5.0) / z, 0};
    draw_freq(&p, base, V, N, freq);
    check_freq(freq, want, V, N);

    /* A small negative bias is a bias, not a ban. */
    float soft = -99.0f;
    int32_t one = 1;
    p.temperature = 0.0f;
    p.bias_ids = &one;
    p.bias_values = &soft;
    p.n_bias = 1;
    CHECK_OK(sampler_new(&p, V, &s));
    memcpy(row, base, sizeof row);
    CHECK_INT(sampler_sample(s, row), ==, 3);
    CHECK_NEAR(row[1], -95.0, 0);
    sampler_free(s);
}

/* ---- seeds ------------------------------------------------------------ */

static void run_sequence(sampler *s, int32_t *out, int n)
{
    enum { V = 50 };
    float row[V];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++)
            row[j] = (float)((j * 7 + i) % 11) * 0.3f;
        out[i] = sampler_sample(s, row);
        sampler_accept(s, out[i]);
    }
}

TEST(sampler_seed_determinism)
{
    enum { V = 50, N = 500 };
    int32_t a[N], b[N], c[N], d[N];
    sampler_params p;
    sampler *s1, *s2, *s3;

    sampler_params_default(&p);                /* top-k, top-p, min-p all on */
    p.repeat_penalty = 1.1f;
    p.seed = 42;
    CHECK_OK(sampler_new(&p, V, &s1));
    CHECK_OK(sampler_new(&p, V, &s2));
    p.seed = 43;
    CHECK_OK(sampler_new(&p, V, &s3));
    CHECK_INT(sampler_seed(s1), ==, 42);
    run_sequence(s1, a, N);
    run_sequence(s2, b, N);
    run_sequence(s3, c, N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* reset replays the same choices */
    sampler_reset(s1);
    run_sequence(s1, d, N);
    CHECK(memcmp(a, d, sizeof a) == 0);
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);

    /* seed 0: one is picked, reported, and reproduces the run */
    p.seed = 0;
    CHECK_OK(sampler_new(&p, V, &s1));
    CHECK_OK(sampler_new(&p, V, &s2));
    CHECK(sampler_seed(s1) != 0);
    CHECK(sampler_seed(s1) != sampler_seed(s2));
    p.seed = sampler_seed(s1);
    CHECK_OK(sampler_new(&p, V, &s3));
    run_sequence(s1, a, N);
    run_sequence(s3, b, N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
}

/* ---- logprobs --------------------------------------------------------- */

TEST(sampler_logprobs)
{
    enum { V = 6 };
    float logits[V] = {0.5f, 2.0f, -1.0f, 2.0f, -INFINITY, 1.0f};
    int32_t ids[V];
    float lp[V], chosen;
    sampler_params p = plain();
    sampler *s;
    double z = 0.0;

    CHECK_OK(sampler_new(&p, V, &s));
    for (int i = 0; i < V; i++)
        if (i != 4)
            z += exp(logits[i]);

    int n = sampler_logprobs(s, logits, 5, V, ids, lp, &chosen);
    CHECK_INT(n, ==, V - 1);                   /* the banned token is left out */
    CHECK_NEAR(chosen, 1.0 - log(z), 1e-6);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        sum += exp(lp[i]);
        CHECK_NEAR(lp[i], logits[ids[i]] - log(z), 1e-6);
        if (i > 0)
            CHECK(lp[i] <= lp[i - 1]);
    }
    CHECK_NEAR(sum, 1.0, 1e-6);
    CHECK_INT(ids[0], ==, 1);                  /* tie: lower id first */
    CHECK_INT(ids[1], ==, 3);
    CHECK_INT(ids[2], ==, 5);
    CHECK_INT(ids[3], ==, 0);
    CHECK_INT(ids[4], ==, 2);

    /* Two alternatives only; a banned chosen token is -inf. */
    n = sampler_logprobs(s, logits, 4, 2, ids, lp, &chosen);
    CHECK_INT(n, ==, 2);
    CHECK_INT(ids[0], ==, 1);
    CHECK_INT(ids[1], ==, 3);
    CHECK(chosen == -INFINITY);
    n = sampler_logprobs(s, logits, 2, 0, NULL, NULL, &chosen);
    CHECK_INT(n, ==, 0);
    CHECK_NEAR(chosen, -1.0 - log(z), 1e-6);
    CHECK_INT(sampler_logprobs(s, logits, V, 1, ids, lp, &chosen), ==, RC_EINVAL);
    CHECK_INT(sampler_logprobs(s, logits, -1, 1, ids, lp, &chosen), ==, RC_EINVAL);

    /* After sampling the row holds the biased logits, and logprobs uses
     * them (before temperature). */
    sampler_free(s);
    int32_t bid = 5;
    float bval = 1.0f;
    p.bias_ids = &bid;
    p.bias_values = &bval;
    p.n_bias = 1;
    p.temperature = 0.1f;
    CHECK_OK(sampler_new(&p, V, &s));
    int32_t t = sampler_sample(s, logits);
    CHECK(t == 1 || t == 3 || t == 5);
    n = sampler_logprobs(s, logits, t, 3, ids, lp, &chosen);
    CHECK_INT(n, ==, 3);
    CHECK_INT(ids[0], ==, 1);                  /* 2, 2, 2: by id */
    CHECK_INT(ids[1], ==, 3);
    CHECK_INT(ids[2], ==, 5);
    CHECK_NEAR(lp[0], lp[2], 1e-6);
    sampler_free(s);
}

/* ---- stop strings ----------------------------------------------------- */

/* Feeds pieces, collecting everything emitted (flushed at the end unless a
 * stop matched); returns 1 if a stop matched. */
static int feed(stop_matcher *m, const char *const *pieces, int n, char *out, size_t cap)
{
    const char *e;
    size_t el, len = 0;
    int stopped = 0;
    for (int i = 0; i < n && !stopped; i++) {
        int rc = stop_push(m, pieces[i], strlen(pieces[i]), &e, &el);
        CHECK(rc == 0 || rc == 1);
        CHECK(len + el < cap);
        memcpy(out + len, e, el);
        len += el;
        stopped = rc;
    }
    if (!stopped) {
        stop_flush(m, &e, &el);
        CHECK(len + el < cap);
        memcpy(out + len, e, el);
        len += el;
    }
    out[len] = 0;
    return stopped;
}

TEST(sampler_stop_split_pieces)
{
    const char *stops[] = {"</end>"};
    stop_matcher *m;
    const char *e;
    size_t el;

    CHECK_OK(stop_new(stops, 1, &m));
    CHECK_INT(stop_push(m, "Hello </", 8, &e, &el), ==, 0);
    CHECK_INT(el, ==, 6);
    CHECK(memcmp(e, "Hello ", 6) == 0);
    CHECK_INT(stop_push(m, "e", 1, &e, &el), ==, 0);
    CHECK_INT(el, ==, 0);
    CHECK_INT(stop_push(m, "n", 1, &e, &el), ==, 0);
    CHECK_INT(el, ==, 0);
    CHECK_INT(stop_push(m, "d> and more", 11, &e, &el), ==, 1);
    CHECK_INT(el, ==, 0);
    CHECK_INT(stop_matched(m), ==, 0);
    /* After the stop: nothing more, ever. */
    CHECK_INT(stop_push(m, "x", 1, &e, &el), ==, 1);
    CHECK_INT(el, ==, 0);
    stop_flush(m, &e, &el);
    CHECK_INT(el, ==, 0);

    /* Reuse after reset; text before the stop in the same piece. */
    char out[128];
    stop_reset(m);
    CHECK_INT(stop_matched(m), ==, -1);
    const char *p1[] = {"abc</end>def"};
    CHECK_INT(feed(m, p1, 1, out, sizeof out), ==, 1);
    CHECK_STR(out, "abc");
    stop_reset(m);
    const char *p2[] = {"<", "/", "e", "n", "d", ">"};
    CHECK_INT(feed(m, p2, 6, out, sizeof out), ==, 1);
    CHECK_STR(out, "");
    stop_free(m);
    stop_free(NULL);
}

TEST(sampler_stop_overlapping_prefixes)
{
    const char *abc[] = {"abc"};
    const char *aab[] = {"aab"};
    stop_matcher *m;
    const char *e;
    size_t el;
    char out[64];

    CHECK_OK(stop_new(abc, 1, &m));
    CHECK_INT(stop_push(m, "ab", 2, &e, &el), ==, 0);
    CHECK_INT(el, ==, 0);
    CHECK_INT(stop_push(m, "ab", 2, &e, &el), ==, 0);   /* "abab": release "ab" */
    CHECK_INT(el, ==, 2);
    CHECK(memcmp(e, "ab", 2) == 0);
    CHECK_INT(stop_push(m, "c", 1, &e, &el), ==, 1);
    CHECK_INT(el, ==, 0);
    stop_reset(m);
    const char *whole[] = {"ababc"};
    CHECK_INT(feed(m, whole, 1, out, sizeof out), ==, 1);
    CHECK_STR(out, "ab");
    stop_free(m);

    CHECK_OK(stop_new(aab, 1, &m));
    const char *bytes[] = {"a", "a", "a", "a", "b", "c"};
    CHECK_INT(feed(m, bytes, 6, out, sizeof out), ==, 1);
    CHECK_STR(out, "aa");
    stop_free(m);
}

TEST(sampler_stop_releases_broken_prefix)
{
    const char *stops[] = {"abc"};
    stop_matcher *m;
    const char *e;
    size_t el;
    char out[64];

    CHECK_OK(stop_new(stops, 1, &m));
    CHECK_INT(stop_push(m, "xab", 3, &e, &el), ==, 0);
    CHECK_INT(el, ==, 1);
    CHECK_INT(stop_push(m, "x", 1, &e, &el), ==, 0);    /* "abx" cannot start a stop */
    CHECK_INT(el, ==, 3);
    CHECK(memcmp(e, "abx", 3) == 0);
    stop_flush(m, &e, &el);
    CHECK_INT(el, ==, 0);

    /* A prefix still open at the end is released by the flush. */
    stop_reset(m);
    const char *tail[] = {"hello a", "b"};
    CHECK_INT(feed(m, tail, 2, out, sizeof out), ==, 0);
    CHECK_STR(out, "hello ab");
    stop_free(m);

    /* No stop strings (or only empty ones): everything passes at once. */
    const char *empty[] = {""};
    CHECK_OK(stop_new(empty, 1, &m));
    CHECK_INT(stop_push(m, "abc", 3, &e, &el), ==, 0);
    CHECK_INT(el, ==, 3);
    stop_free(m);
    CHECK_OK(stop_new(NULL, 0, &m));
    CHECK_INT(stop_push(m, "", 0, &e, &el), ==, 0);
    CHECK_INT(el, ==, 0);
    stop_free(m);
}

TEST(sampler_stop_multiple)
{
    const char *stops[] = {"\n\n", "User:", "###"};
    stop_matcher *m;
    char out[128];

    CHECK_OK(stop_new(stops, 3, &m));
    const char *p1[] = {"The answer is 4.", "\n", "Us", "er", ": more"};
    CHECK_INT(feed(m, p1, 5, out, sizeof out), ==, 1);
    CHECK_STR(out, "The answer is 4.\n");
    CHECK_INT(stop_matched(m), ==, 1);
    stop_reset(m);
    const char *p2[] = {"a #", "#", "#\n\n"};
    CHECK_INT(feed(m, p2, 3, out, sizeof out), ==, 1);
    CHECK_STR(out, "a ");
    CHECK_INT(stop_matched(m), ==, 2);
    stop_free(m);

    /* The stop that completes first wins, however the text is cut: "bc"
     * ends before "abcd" does. */
    const char *st2[] = {"abcd", "bc"};
    CHECK_OK(stop_new(st2, 2, &m));
    const char *whole[] = {"xabcdy"};
    CHECK_INT(feed(m, whole, 1, out, sizeof out), ==, 1);
    CHECK_STR(out, "xa");
    CHECK_INT(stop_matched(m), ==, 1);
    stop_reset(m);
    const char *bytes[] = {"x", "a", "b", "c", "d", "y"};
    CHECK_INT(feed(m, bytes, 6, out, sizeof out), ==, 1);
    CHECK_STR(out, "xa");
    stop_free(m);

    /* Limits and bad input. */
    const char *many[STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= STOP_MAX_STRINGS; i++)
        many[i] = "x";
    CHECK_INT(stop_new(many, STOP_MAX_STRINGS + 1, &m), ==, RC_ELIMIT);
    CHECK(m == NULL);
    static char big[STOP_MAX_BYTES + 2];
    memset(big, 'a', STOP_MAX_BYTES + 1);
    const char *bigs[] = {big};
    CHECK_INT(stop_new(bigs, 1, &m), ==, RC_ELIMIT);
    const char *nul[] = {"a", NULL};
    CHECK_INT(stop_new(nul, 2, &m), ==, RC_EINVAL);
    CHECK_OK(stop_new(many, STOP_MAX_STRINGS, &m));
    stop_free(m);
}

TEST(sampler_stop_utf8)
{
    /* "。" is E3 80 82, "、" is E3 80 81: they share two bytes. */
    const char *stops[] = {"\xe3\x80\x82", "\xf0\x9f\x98\x80"};   /* 。 and 😀 */
    stop_matcher *m;
    const char *e;
    size_t el;
    char out[128];

    CHECK_OK(stop_new(stops, 2, &m));
    const char *text = "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x81\xe5\x86\x8d\xe3\x80\x82\xe8\xa7\x81";
    /* 你好、再。见 fed byte by byte: stops at 。, keeps 、 */
    size_t len = 0;
    int rc = 0;
    for (size_t i = 0; text[i] && !rc; i++) {
        rc = stop_push(m, text + i, 1, &e, &el);
        memcpy(out + len, e, el);
        len += el;
    }
    out[len] = 0;
    CHECK_INT(rc, ==, 1);
    CHECK_STR(out, "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x81\xe5\x86\x8d");
    CHECK_INT(stop_matched(m), ==, 0);

    /* A 4-byte emoji split 1 + 3 across pieces. */
    stop_reset(m);
    const char *p[] = {"ok \xf0", "\x9f\x98\x80 rest"};
    CHECK_INT(feed(m, p, 2, out, sizeof out), ==, 1);
    CHECK_STR(out, "ok ");
    CHECK_INT(stop_matched(m), ==, 1);

    /* A different emoji with the same first three bytes is released. */
    stop_reset(m);
    const char *q[] = {"\xf0\x9f\x98", "\x81!"};
    CHECK_INT(feed(m, q, 2, out, sizeof out), ==, 0);
    CHECK_STR(out, "\xf0\x9f\x98\x81!");
    stop_free(m);
}

/* Random texts over a small alphabet, cut at random: the emitted text is
 * always the text up to the first completed stop (an oracle on the whole
 * text), whatever the cuts, and a held prefix never leaks. */
static size_t oracle(const char *text, size_t len, const char *const *stops, int n, int *stopped)
{
    for (size_t end = 1; end <= len; end++) {
        size_t best = (size_t)-1;
        for (int i = 0; i < n; i++) {
            size_t l = strlen(stops[i]);
            if (l <= end && memcmp(text + end - l, stops[i], l) == 0 && end - l < best)
                best = end - l;
        }
        if (best != (size_t)-1) {
            *stopped = 1;
            return best;
        }
    }
    *stopped = 0;
    return len;
}

TEST(sampler_stop_random_oracle)
{
    const char *stops[] = {"abca", "bb", "cab", "aaaa"};
    rng_state r;
    stop_matcher *m;
    char text[64], out[80];

    rng_seed(&r, 7);
    CHECK_OK(stop_new(stops, 4, &m));
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = 1 + rng_next(&r) % 40, got = 0;
        for (size_t i = 0; i < len; i++)
            text[i] = "abc"[rng_next(&r) % 3];
        int want_stop, stopped = 0;
        size_t want = oracle(text, len, stops, 4, &want_stop);

        stop_reset(m);
        size_t pos = 0;
        while (pos < len && !stopped) {
            size_t piece = 1 + rng_next(&r) % 5;
            if (piece > len - pos)
                piece = len - pos;
            const char *e;
            size_t el;
            stopped = stop_push(m, text + pos, piece, &e, &el);
            CHECK(stopped == 0 || stopped == 1);
            memcpy(out + got, e, el);
            got += el;
            pos += piece;
            /* Never ahead of the answer, and what was sent is its prefix. */
            if (got > want || memcmp(out, text, got) != 0)
                FAIL("iteration %d: emitted %zu bytes, answer %zu (\"%.*s\")",
                     iter, got, want, (int)len, text);
        }
        if (!stopped) {
            const char *e;
            size_t el;
            stop_flush(m, &e, &el);
            memcpy(out + got, e, el);
            got += el;
        }
        CHECK_INT(stopped, ==, want_stop);
        if (got != want)
            FAIL("iteration %d: emitted %zu bytes, answer %zu (\"%.*s\")",
                 iter, got, want, (int)len, text);
    }
    stop_free(m);
}

TEST(sampler_stop_alloc_failure)
{
    const char *stops[] = {"one", "two", "three"};
    stop_matcher *m;
    int failed = 0;
    for (long n = 0; n < 20; n++) {
        rc_mem_fail_after(n);
        int rc = stop_new(stops, 3, &m);
        rc_mem_fail_after(-1);
        if (rc == 0) {
            stop_free(m);
            break;
        }
        CHECK_INT(rc, ==, RC_ENOMEM);
        CHECK(m == NULL);
        failed++;
    }
    CHECK_INT(failed, >=, 4);

    /* A push that cannot grow the buffer fails without losing state. */
    const char *e;
    size_t el;
    char out[64];
    CHECK_OK(stop_new(stops, 3, &m));
    CHECK_INT(stop_push(m, "tw", 2, &e, &el), ==, 0);
    rc_mem_fail_after(0);
    static char big[1000];
    memset(big, 'x', sizeof big);
    CHECK_INT(stop_push(m, big, sizeof big, &e, &el), ==, RC_ENOMEM);
    rc_mem_fail_after(-1);
    const char *rest[] = {"o!"};
    CHECK_INT(feed(m, rest, 1, out, sizeof out), ==, 1);
    CHECK_STR(out, "");
    stop_free(m);
}

/* A tensor-parallel shard holding the upper part of the vocabulary sends
 * only its k best (sampler_best over its part after sampler_prepare) with
 * their raw logits: the draw from the rebuilt row (the lower part, those k,
 * the rest -INFINITY) is the draw from the whole row, greedy or top-k,
 * with bias, bans and penalties on both parts, with ties (logits on a grid
 * of 0.05), NaN and infinities. */
TEST(sampler_best_rebuilds_the_draw)
{
    enum { V = 1000, HALF = 500 };
    static float row[V], prep[V], rebuilt[V];
    rng_state rg;
    rng_seed(&rg, 5);
    for (int trial = 0; trial < 300; trial++) {
        sampler_params p;
        sampler_params_default(&p);
        p.temperature = trial % 4 == 0 ? 0.0f : 0.5f + (float)(trial % 3) * 0.5f;
        p.top_k = 1 + trial % 9;
        p.top_p = trial % 2 ? 0.9f : 1.0f;
        p.min_p = trial % 5 == 0 ? 0.1f : 0.0f;
        p.repeat_penalty = 1.3f;
        p.frequency_penalty = 0.7f;
        p.presence_penalty = 0.2f;
        p.seed = 100 + (uint64_t)trial;
        int32_t bid[3] = { 3, 600, (int32_t)(HALF + rng_next(&rg) % HALF) };
        float bv[3] = { -1000.0f, 2.5f, 1.0f };
        p.bias_ids = bid;
        p.bias_values = bv;
        p.n_bias = 3;
        sampler *whole, *parts;
        CHECK_OK(sampler_new(&p, V, &whole));
        CHECK_OK(sampler_new(&p, V, &parts));
        int32_t prompt[12];
        for (int i = 0; i < 12; i++)
            prompt[i] = (int32_t)(rng_next(&rg) % V);
        sampler_accept_prompt(whole, prompt, 12);
        sampler_accept_prompt(parts, prompt, 12);
        for (int j = 0; j < 8; j++) {
            int32_t t = (int32_t)(rng_next(&rg) % V);
            sampler_accept(whole, t);
            sampler_accept(parts, t);
        }
        for (int i = 0; i < V; i++)
            row[i] = (float)(int)(rng_next(&rg) % 400) * 0.05f - 10.0f;
        row[HALF + 7] = -INFINITY;
        row[HALF + 9] = NAN;
        if (trial % 7 == 0)
            row[HALF + 11] = INFINITY;
        memcpy(prep, row, sizeof row);
        sampler_prepare(parts, prep);
        sampler_cand heap[16];
        int32_t ids[16];
        int k = p.temperature > 0 ? p.top_k : 1;
        int m = sampler_best(prep, HALF, V - HALF, k, heap, ids);
        CHECK_INT(m, ==, k);
        for (int j = 0; j < m; j++) {
            CHECK(ids[j] >= HALF && ids[j] < V);
            if (j + 1 < m)
                CHECK(prep[ids[j]] > prep[ids[j + 1]] ||
                      (prep[ids[j]] == prep[ids[j + 1]] && ids[j] < ids[j + 1]));
        }
        /* nothing left out ranks above the last one kept */
        for (int i = HALF; i < V; i++) {
            bool kept = false;
            for (int j = 0; j < m; j++)
                kept = kept || ids[j] == i;
            float l = prep[i] > FLT_MAX ? FLT_MAX : prep[i], last = prep[ids[m - 1]];
            last = last > FLT_MAX ? FLT_MAX : last;
            if (!kept && prep[i] > -INFINITY)
                CHECK(l < last || (l == last && i > ids[m - 1]));
        }
        for (int i = 0; i < V; i++)
            rebuilt[i] = i < HALF ? row[i] : -INFINITY;
        for (int j = 0; j < m; j++)
            rebuilt[ids[j]] = row[ids[j]];
        CHECK_INT(sampler_sample(parts, rebuilt), ==, sampler_sample(whole, row));
        sampler_free(whole);
        sampler_free(parts);
    }
}

/* A sampler made again with the same seed and prompt, having replayed the
 * tokens the first one sampled, samples what the first samples next (the
 * engine's rebuild after a fault): random stream and penalties alike. */
TEST(sampler_replay_continues_the_stream)
{
    enum { V = 64, N = 24, CUT = 11 };
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.8f;
    p.top_k = 20;
    p.seed = 99;
    p.presence_penalty = 0.7f;
    p.frequency_penalty = 0.2f;
    p.repeat_penalty = 1.2f;
    const int32_t prompt[] = { 3, 5, 7, 5 };
    sampler *a, *b;
    CHECK_OK(sampler_new(&p, V, &a));
    sampler_accept_prompt(a, prompt, 4);
    float logits[V];
    int32_t got[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < V; i++)
            logits[i] = (float)((i * 37 + k * 11) % 29) * 0.1f;
        got[k] = sampler_sample(a, logits);
        sampler_accept(a, got[k]);
    }
    CHECK_OK(sampler_new(&p, V, &b));
    sampler_accept_prompt(b, prompt, 4);
    sampler_replay(b, got, CUT);
    for (int k = CUT; k < N; k++) {
        for (int i = 0; i < V; i++)
            logits[i] = (float)((i * 37 + k * 11) % 29) * 0.1f;
        int32_t t = sampler_sample(b, logits);
        CHECK_INT(t, ==, got[k]);
        sampler_accept(b, t);
    }
    sampler_free(a);
    sampler_free(b);
}
