/* sampler.c - the sampling chain over one row of logits.
 *
 * Layout: parameters and construction; the two histories (repeat window as
 * a ring of token ids plus per-token counts, generated counts); the chain
 * itself (bias, penalties, selection of the best candidates, top-p, min-p,
 * temperature and the draw); logprobs.
 *
 * Candidates live in one array of (logit, id) pairs sized n_vocab at
 * construction.  "Better" is a total order: larger logit first, lower id
 * among equal logits, so every truncation is deterministic.  The k best are
 * kept in a min-heap of size k while the row is scanned (O(V log k), in
 * practice O(V)); top-p without top-k is a quickselect that tracks mass
 * (expected O(V)), so nothing sorts the whole vocabulary.
 */
#include "sampler.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "base/rng.h"
#include "tensor/attend.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* w: exp((logit - max) / T), set where a step needs it */
typedef sampler_cand cand;

struct sampler {
    sampler_params p;          /* bias pointers point at the copies below */
    int      n_vocab;
    uint64_t seed;             /* resolved, never 0 */
    rng_state rng;
    int32_t *bias_ids;         /* [n_bias] */
    float   *bias_values;      /* [n_bias] */
    int32_t *win_count;        /* [n_vocab] occurrences in the repeat window */
    int32_t *gen_count;        /* [n_vocab] occurrences among generated tokens */
    int32_t *ring;             /* [repeat_last_n] when repeat_last_n > 0 */
    int      ring_len, ring_head;
    cand    *cand;             /* [n_vocab] work array */
};

void sampler_params_default(sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
}

/* ---- construction ---------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A seed from the wall clock, the monotonic clock and an address (so two
 * samplers made in the same nanosecond still differ). */
static uint64_t seed_from_clock(const void *salt)
{
    struct timespec ts = {0, 0};
    uint64_t z;
    timespec_get(&ts, TIME_UTC);
    z = mix64((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    z = mix64(z ^ os_now_ns());
    z = mix64(z ^ (uint64_t)(uintptr_t)salt);
    return z ? z : 1;
}

uint64_t sampler_resolve_seed(uint64_t seed)
{
    static _Atomic uint64_t salt;
    return seed ? seed : seed_from_clock((const void *)(uintptr_t)++salt);
}

static int check_params(const sampler_params *p, int n_vocab)
{
    if (n_vocab <= 0)
        return rc_fail(RC_EINVAL, "sampler: n_vocab %d must be positive", n_vocab);
    if (isnan(p->temperature))
        return rc_fail(RC_EINVAL, "sampler: temperature is NaN");
    if (p->top_k < 0)
        return rc_fail(RC_EINVAL, "sampler: top_k %d is negative", p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return rc_fail(RC_EINVAL, "sampler: top_p %g outside [0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return rc_fail(RC_EINVAL, "sampler: min_p %g outside [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return rc_fail(RC_EINVAL, "sampler: repeat_penalty %g must be positive and finite",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return rc_fail(RC_EINVAL, "sampler: repeat_last_n %d below -1", p->repeat_last_n);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return rc_fail(RC_EINVAL, "sampler: presence/frequency penalty not finite");
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return rc_fail(RC_EINVAL, "sampler: logit_bias of %d entries without arrays", p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= n_vocab)
            return rc_fail(RC_EINVAL, "sampler: logit_bias token %d outside vocabulary of %d",
                           (int)p->bias_ids[i], n_vocab);
        if (isnan(p->bias_values[i]))
            return rc_fail(RC_EINVAL, "sampler: logit_bias of token %d is NaN",
                           (int)p->bias_ids[i]);
    }
    return 0;
}

int sampler_new(const sampler_params *p, int n_vocab, sampler **out)
{
    sampler *s;
    int rc;

    *out = NULL;
    if ((rc = check_params(p, n_vocab)) != 0)
        return rc;
    s = rc_calloc(1, sizeof *s);
    if (!s)
        return rc_fail(RC_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->win_count = rc_calloc((size_t)n_vocab, sizeof(int32_t));
    s->gen_count = rc_calloc((size_t)n_vocab, sizeof(int32_t));
    s->cand = rc_mallocarray((size_t)n_vocab, sizeof(cand));
    if (!s->win_count || !s->gen_count || !s->cand)
        goto fail;
    if (p->repeat_last_n > 0 && !(s->ring = rc_mallocarray((size_t)p->repeat_last_n, sizeof(int32_t))))
        goto fail;
    if (p->n_bias > 0) {
        s->bias_ids = rc_mallocarray((size_t)p->n_bias, sizeof(int32_t));
        s->bias_values = rc_mallocarray((size_t)p->n_bias, sizeof(float));
        if (!s->bias_ids || !s->bias_values)
            goto fail;
        memcpy(s->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof(int32_t));
        memcpy(s->bias_values, p->bias_values, (size_t)p->n_bias * sizeof(float));
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_values;
    s->seed = p->seed ? p->seed : seed_from_clock(s);
    rng_seed(&s->rng, s->seed);
    *out = s;
    return 0;

fail:
    sampler_free(s);
    return rc_fail(RC_ENOMEM, "sampler: out of memory for a vocabulary of %d", n_vocab);
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    rc_free(s->bias_ids);
    rc_free(s->bias_values);
    rc_free(s->win_count);
    rc_free(s->gen_count);
    rc_free(s->ring);
    rc_free(s->cand);
    rc_free(s);
}

uint64_t sampler_seed(const sampler *s) { return s->seed; }

/* ---- histories ------------------------------------------------------- */

static void count_inc(int32_t *c)
{
    if (*c < INT32_MAX)
        (*c)++;
}

static void window_push(sampler *s, int32_t tok)
{
    int n = s->p.repeat_last_n;
    if (n == 0)
        return;
    if (n > 0) {
        if (s->ring_len == n)
            s->win_count[s->ring[s->ring_head]]--;
        else
            s->ring_len++;
        s->ring[s->ring_head] = tok;
        s->ring_head = (s->ring_head + 1) % n;
    }
    count_inc(&s->win_count[tok]);
}

void sampler_accept_prompt(sampler *s, const int32_t *tokens, int n_tokens)
{
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] >= 0 && tokens[i] < s->n_vocab)
            window_push(s, tokens[i]);
}

void sampler_accept(sampler *s, int32_t token)
{
    if (token < 0 || token >= s->n_vocab)
        return;
    window_push(s, token);
    count_inc(&s->gen_count[token]);
}

void sampler_replay(sampler *s, const int32_t *tokens, int n_tokens)
{
    for (int i = 0; i < n_tokens; i++) {
        if (s->p.temperature > 0.0f)
            (void)rng_uniform(&s->rng);
        sampler_accept(s, tokens[i]);
    }
}

void sampler_reset(sampler *s)
{
    memset(s->win_count, 0, (size_t)s->n_vocab * sizeof(int32_t));
    memset(s->gen_count, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->ring_len = 0;
    s->ring_head = 0;
    rng_seed(&s->rng, s->seed);
}

/* ---- the chain ------------------------------------------------------- */

static void apply_bias(const sampler *s, float *logits)
{
    for (int i = 0; i < s->p.n_bias; i++) {
        float b = s->bias_values[i];
        float *l = &logits[s->bias_ids[i]];
        *l = (b <= SAMPLER_BAN_BIAS) ? -INFINITY : *l + b;   /* -INFINITY is <= too */
    }
}

static void apply_penalties(const sampler *s, float *logits)
{
    float rep = s->p.repeat_penalty;
    float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    int use_rep = rep != 1.0f && s->p.repeat_last_n != 0;
    int use_gen = pres != 0.0f || freq != 0.0f;

    if (!use_rep && !use_gen)
        return;
    /* One pass over the counts: O(V) like the rest of the chain, and it
     * visits each token once however often it repeats. */
    for (int i = 0; i < s->n_vocab; i++) {
        if (use_rep && s->win_count[i] > 0)
            logits[i] = logits[i] > 0.0f ? logits[i] / rep : logits[i] * rep;
        if (use_gen && s->gen_count[i] > 0)
            logits[i] -= freq * (float)s->gen_count[i] + pres;
    }
}

void sampler_prepare(const sampler *s, float *logits)
{
    apply_bias(s, logits);
    apply_penalties(s, logits);
}

const sampler_params *sampler_get_params(const sampler *s) { return &s->p; }

/* +INFINITY would make every difference NaN; the largest float keeps the
 * order and gives an infinite logit all the mass. */
static inline float finite_logit(float l)
{
    return l > FLT_MAX ? FLT_MAX : l;
}

static inline int better(cand a, cand b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static inline void swap_cand(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Min-heap by "better": the root is the worst of the heap. */
static void sift_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(h[w], h[l]))
            w = l;
        if (r < n && better(h[w], h[r]))
            w = r;
        if (w == i)
            return;
        swap_cand(&h[i], &h[w]);
        i = w;
    }
}

static void heapify(cand *h, int n)
{
    for (int i = n / 2 - 1; i >= 0; i--)
        sift_down(h, n, i);
}

/* Sorts a heap best first, in place. */
static void heap_sort_desc(cand *h, int n)
{
    for (int end = n - 1; end > 0; end--) {
        swap_cand(&h[0], &h[end]);
        sift_down(h, end, 0);
    }
}

int sampler_best(const float *logits, int col0, int n, int k, sampler_cand *h, int32_t *ids)
{
    int m = 0;
    for (int i = 0; i < n && k > 0; i++) {
        float l = logits[col0 + i];
        if (!(l > -INFINITY))
            continue;
        l = finite_logit(l);
        if (m == k) {
            if (l > h[0].logit) {
                h[0].logit = l;
                h[0].id = col0 + i;
                sift_down(h, k, 0);
            }
            continue;
        }
        h[m].logit = l;
        h[m].id = col0 + i;
        if (++m == k)
            heapify(h, k);
    }
    if (m < k)
        heapify(h, m);
    heap_sort_desc(h, m);
    for (int j = 0; j < m; j++)
        ids[j] = h[j].id;
    return m;
}

/* Sets w = exp((l - lmax) / T) on c[0..n) and returns the sum.  The
 * product is formed in double so a tiny temperature gives 0, never NaN. */
static double weigh(cand *c, int n, float lmax, double inv_t)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].w = expf((float)(((double)c[i].logit - (double)lmax) * inv_t));
        total += c[i].w;
    }
    return total;
}

/* Index of the median of c[a], c[b], c[d] in the "better" order. */
static int median3(const cand *c, int a, int b, int d)
{
    if (better(c[a], c[b])) {
        if (better(c[b], c[d]))
            return b;                            /* a > b > d */
        return better(c[a], c[d]) ? d : a;       /* a > b, d > b */
    }
    if (better(c[a], c[d]))
        return a;                                /* b > a > d */
    return better(c[b], c[d]) ? d : b;           /* b > a, d > a */
}

/* Top-p over unsorted candidates with weights set: moves the m best of
 * c[0..n) to c[0..m) (unsorted), for the smallest m whose weights reach
 * `want`; returns m >= 1.  A quickselect that tracks the mass on the better
 * side of each pivot: expected O(n).  Should pivots keep failing it sorts
 * what is left, so it is never worse than O(n log n). */
static int top_p_select(cand *c, int n, double want)
{
    int lo = 0, hi = n, budget = 8;
    if (!(want > 0.0)) {                     /* top_p 0: the best alone */
        int b = 0;
        for (int i = 1; i < n; i++)
            if (better(c[i], c[b]))
                b = i;
        swap_cand(&c[0], &c[b]);
        return 1;
    }
    for (int m = n; m > 1; m >>= 1)
        budget += 2;
    for (;;) {
        /* c[0..lo) is kept; the answer ends inside c[lo..hi), want > 0 */
        if (hi <= lo)
            return lo;
        if (hi - lo == 1)
            return lo + 1;
        if (--budget < 0) {
            double cum = 0.0;
            heapify(c + lo, hi - lo);
            heap_sort_desc(c + lo, hi - lo);
            for (int i = lo; i < hi; i++) {
                cum += c[i].w;
                if (cum >= want)
                    return i + 1;
            }
            return hi;
        }
        swap_cand(&c[median3(c, lo, lo + (hi - lo) / 2, hi - 1)], &c[hi - 1]);
        cand pivot = c[hi - 1];
        double mass = 0.0;
        int q = lo;
        for (int j = lo; j < hi - 1; j++)
            if (better(c[j], pivot)) {
                mass += c[j].w;
                swap_cand(&c[q++], &c[j]);
            }
        swap_cand(&c[q], &c[hi - 1]);
        if (mass >= want) {
            hi = q;
        } else if (mass + c[q].w >= want) {
            return q + 1;
        } else {
            want -= mass + c[q].w;
            lo = q + 1;
        }
    }
}

void sampler_skip_draw(sampler *s)
{
    if (s->p.temperature > 0.0f)
        (void)rng_uniform(&s->rng);
}

int32_t sampler_sample(sampler *s, float *logits)
{
    sampler_prepare(s, logits);
    return sampler_sample_prepared(s, logits);
}

int32_t sampler_sample_prepared(sampler *s, const float *logits)
{
    const sampler_params *p = &s->p;
    cand *c = s->cand;
    int n = 0, sorted = 0;
    float lmax = -INFINITY;

    if (!(p->temperature > 0.0f)) {
        int32_t best = -1;
        for (int i = 0; i < s->n_vocab; i++)
            if (logits[i] > -INFINITY && (best < 0 || logits[i] > logits[best]))
                best = i;
        return best;
    }

    double u = rng_uniform(&s->rng);

    /* Candidates, with top-k folded in: once k are held they form a heap
     * whose root is the worst, and a later token enters only by beating it
     * (ids come in ascending order, so an equal logit never does). */
    int k = p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k : 0;
    for (int i = 0; i < s->n_vocab; i++) {
        float l = logits[i];
        if (!(l > -INFINITY))                /* also skips NaN */
            continue;
        l = finite_logit(l);
        if (l > lmax)
            lmax = l;
        if (k && n == k) {
            if (l > c[0].logit) {
                c[0].logit = l;
                c[0].id = i;
                sift_down(c, k, 0);
            }
            continue;
        }
        c[n].logit = l;
        c[n].id = i;
        if (++n == k)
            heapify(c, k);
    }
    if (n == 0)
        return -1;
    if (k && n == k) {
        heap_sort_desc(c, k);
        sorted = 1;
    }

    /* top-p: the mass is measured at temperature 1 over what top-k left. */
    if (p->top_p < 1.0f && n > 1) {
        double total = weigh(c, n, lmax, 1.0), want = (double)p->top_p * total;
        if (sorted) {
            double cum = 0.0;
            for (int i = 0; i < n; i++) {
                cum += c[i].w;
                if (cum >= want) {
                    n = i + 1;
                    break;
                }
            }
        } else {
            /* Tokens lighter than half of (1 - p) / n of the mass hold less
             * than (1 - p) / 2 of it together, so the answer lies among the
             * others; on a real model's row that drops nearly all. */
            float thr = (float)(0.5 * (1.0 - (double)p->top_p) * total / n);
            int m = 0;
            for (int i = 0; i < n; i++) {
                c[m] = c[i];
                m += c[i].w >= thr;
            }
            n = top_p_select(c, m, want);
        }
    }

    /* min-p: p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p). */
    if (p->min_p > 0.0f && n > 1) {
        float thr = (float)((double)lmax + log((double)p->min_p));
        if (sorted) {
            int m = 1;
            while (m < n && c[m].logit >= thr)
                m++;
            n = m;
        } else {
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].logit >= thr)
                    c[m++] = c[i];
            n = m;                   /* the maximum always passes */
        }
    }

    /* temperature, softmax and the draw */
    double total = weigh(c, n, lmax, 1.0 / (double)p->temperature);
    double target = u * total, cum = 0.0;
    int32_t last = c[0].id;
    for (int i = 0; i < n; i++) {
        if (c[i].w <= 0.0f)
            continue;
        cum += c[i].w;
        last = c[i].id;
        if (cum > target)
            return c[i].id;
    }
    return last;                     /* rounding left target at the very end */
}

/* ---- logprobs -------------------------------------------------------- */

int sampler_logprobs(const sampler *s, const float *logits, int32_t chosen, int n_top,
                     int32_t *top_ids, float *top_logprobs, float *chosen_logprob)
{
    int n_vocab = s->n_vocab, n_out = 0;
    float lmax = -INFINITY;
    double sum = 0.0, lse;

    if (chosen < 0 || chosen >= n_vocab)
        return rc_fail(RC_EINVAL, "logprobs: token %d outside vocabulary of %d", (int)chosen, n_vocab);
    if (n_top < 0 || (n_top > 0 && (!top_ids || !top_logprobs)))
        return rc_fail(RC_EINVAL, "logprobs: n_top %d without arrays", n_top);

    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > -INFINITY && finite_logit(logits[i]) > lmax)
            lmax = finite_logit(logits[i]);
    if (lmax == -INFINITY) {
        if (chosen_logprob)
            *chosen_logprob = -INFINITY;
        return 0;
    }
    sum = tensor_sum_exp(logits, (size_t)n_vocab, lmax);
    lse = (double)lmax + log(sum);

    if (chosen_logprob)
        *chosen_logprob = logits[chosen] > -INFINITY
                        ? (float)((double)finite_logit(logits[chosen]) - lse) : -INFINITY;

    /* Insertion into the caller's arrays, kept sorted best first; ids come
     * in ascending order, so an equal logit goes after the earlier id.  The
     * logits are held in top_logprobs until the end. */
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float l = logits[i];
        if (!(l > -INFINITY))
            continue;
        l = finite_logit(l);
        if (n_out == n_top && !(l > top_logprobs[n_out - 1]))
            continue;
        int j = n_out < n_top ? n_out++ : n_top - 1;
        while (j > 0 && l > top_logprobs[j - 1]) {
            top_logprobs[j] = top_logprobs[j - 1];
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_logprobs[j] = l;
        top_ids[j] = i;
    }
    for (int j = 0; j < n_out; j++)
        top_logprobs[j] = (float)((double)top_logprobs[j] - lse);
    return n_out;
}
