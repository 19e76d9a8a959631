/* cost.h - what a token costs: energy and money per token of a running
 * model, from the power of the nodes its plan uses (racimo serve --watts or
 * RAPL, each node publishing its own), the electricity price and the
 * hardware's amortisation, and the model's measured tokens/s.
 *
 * The formula (README, "What a token costs"):
 *   node cost per hour  = W / 1000 * price_kwh + hw_price / (hw_years * 8766 h)
 *   tokens/s            = tokens generated over the last COST_WINDOW_S seconds
 *   energy / 1k tokens  = sum(W) / tokens/s * 1000 / 3600          (Wh)
 *   cost / 1M tokens    = sum(node cost per hour) / (tokens/s * 3600) * 1e6
 * Every node of the plan is charged whole (its idle power included) to the
 * model: the figure is what the instance costs while it runs at the rate it
 * was used, not a marginal cost.
 */
#ifndef RC_API_COST_H
#define RC_API_COST_H

#include <stdbool.h>
#include <stdint.h>

#define COST_WINDOW_S 60          /* tokens/s over this many seconds */
#define COST_SAMPLES 64           /* one a second: covers the window */

/* A node's figures as it publishes them ("power" in its cluster state). */
typedef struct {
    double watts;                 /* < 0: unknown */
    double price_kwh;             /* < 0: unknown (the asking node's price is used) */
    double hw_per_hour;           /* amortisation per hour (0: none) */
} cost_node;

typedef struct {
    double watts;                 /* sum over the nodes; < 0 when one is unknown */
    double tokens_per_s;          /* as given */
    double wh_per_1k;             /* < 0: unknown (no power, or no tokens) */
    double cost_per_mtok;         /* < 0: unknown (no power, no price, or no tokens) */
} cost_figures;

/* Amortisation per hour of hardware bought for `price` over `years`; 0
 * when either is not positive. */
double cost_hw_per_hour(double price, double years);

/* The figures of a model running on nodes[0..n) at tokens_per_s;
 * price_kwh: the price for nodes that publish none (< 0: none). */
cost_figures cost_compute(const cost_node *nodes, int n, double tokens_per_s, double price_kwh);

/* Token counters sampled over time, for tokens/s over a window. */
typedef struct {
    struct { uint64_t t_ns, tokens_in, tokens_out; } s[COST_SAMPLES];
    int n, head;                  /* samples held; next slot */
} cost_rate;

/* Adds a sample of the counters (cumulative) at t_ns. */
void cost_rate_add(cost_rate *r, uint64_t t_ns, uint64_t tokens_in, uint64_t tokens_out);

/* Tokens/s in and out between the newest sample and the oldest one at
 * most window_s older; false (both 0) with fewer than two samples. */
bool cost_rate_get(const cost_rate *r, double window_s, double *in_per_s, double *out_per_s);

#endif
