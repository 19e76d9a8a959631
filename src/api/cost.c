/* cost.c - the cost arithmetic of cost.h: pure functions, no I/O. */
#include "cost.h"

#include <string.h>

#define HOURS_PER_YEAR 8766.0     /* 365.25 days */

double cost_hw_per_hour(double price, double years)
{
    return price > 0 && years > 0 ? price / (years * HOURS_PER_YEAR) : 0;
}

cost_figures cost_compute(const cost_node *nodes, int n, double tokens_per_s, double price_kwh)
{
    cost_figures f = { .watts = 0, .tokens_per_s = tokens_per_s, .wh_per_1k = -1,
                       .cost_per_mtok = -1 };
    double per_hour = 0;
    bool priced = true;
    for (int i = 0; i < n; i++) {
        if (nodes[i].watts < 0) {
            f.watts = -1;
            return f;
        }
        double p = nodes[i].price_kwh >= 0 ? nodes[i].price_kwh : price_kwh;
        if (p < 0)
            priced = false;
        f.watts += nodes[i].watts;
        per_hour += nodes[i].watts / 1000.0 * (p > 0 ? p : 0) + nodes[i].hw_per_hour;
    }
    if (n < 1) {
        f.watts = -1;
        return f;
    }
    if (!(tokens_per_s > 0))
        return f;
    f.wh_per_1k = f.watts / tokens_per_s * 1000.0 / 3600.0;
    if (priced)
        f.cost_per_mtok = per_hour / (tokens_per_s * 3600.0) * 1e6;
    return f;
}

void cost_rate_add(cost_rate *r, uint64_t t_ns, uint64_t tokens_in, uint64_t tokens_out)
{
    r->s[r->head].t_ns = t_ns;
    r->s[r->head].tokens_in = tokens_in;
    r->s[r->head].tokens_out = tokens_out;
    r->head = (r->head + 1) % COST_SAMPLES;
    if (r->n < COST_SAMPLES)
        r->n++;
}

bool cost_rate_get(const cost_rate *r, double window_s, double *in_per_s, double *out_per_s)
{
    *in_per_s = *out_per_s = 0;
    if (r->n < 2)
        return false;
    int newest = (r->head + COST_SAMPLES - 1) % COST_SAMPLES, oldest = newest;
    uint64_t limit = (uint64_t)(window_s * 1e9);
    for (int k = 1; k < r->n; k++) {
        int i = (newest + COST_SAMPLES - k) % COST_SAMPLES;
        if (r->s[newest].t_ns - r->s[i].t_ns > limit)
            break;
        oldest = i;
    }
    if (oldest == newest || r->s[newest].t_ns <= r->s[oldest].t_ns)
        return false;
    double dt = (double)(r->s[newest].t_ns - r->s[oldest].t_ns) * 1e-9;
    /* counters restart at 0 when an instance is rebuilt: no negative rate */
    if (r->s[newest].tokens_in >= r->s[oldest].tokens_in)
        *in_per_s = (double)(r->s[newest].tokens_in - r->s[oldest].tokens_in) / dt;
    if (r->s[newest].tokens_out >= r->s[oldest].tokens_out)
        *out_per_s = (double)(r->s[newest].tokens_out - r->s[oldest].tokens_out) / dt;
    return true;
}
