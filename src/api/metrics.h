/* metrics.h - counters and histograms for GET /metrics (Prometheus text
 * format 0.0.4).
 *
 * Requests are counted by endpoint and status; finished generations add
 * their token counts per model and their time to first token, duration and
 * generation speed to histograms.  Live figures (queue depth, active
 * sequences, KV cache use) are read from the engines when rendering.
 * Thread safe (one mutex); updates are a few additions.
 */
#ifndef RC_API_METRICS_H
#define RC_API_METRICS_H

#include "buf.h"
#include "registry.h"

typedef struct api_metrics api_metrics;

int  metrics_new(api_metrics **out);
void metrics_free(api_metrics *m);                      /* accepts NULL */

/* One finished HTTP request: endpoint is a path such as "/v1/models" (an
 * unknown path counts as "other"). */
void metrics_request(api_metrics *m, const char *endpoint, int status);

/* One finished generation on `model`. */
void metrics_generation(api_metrics *m, const char *model, int n_prompt, int n_cached, int n_gen,
                        double ttft_s, double total_s, double gen_s);

/* model="NAME" with Prometheus' label escapes, and a metric's HELP and
 * TYPE lines (for the other files that add to the exposition). */
void metrics_label(strbuf *b, const char *name);
void metrics_help(strbuf *b, const char *name, const char *type, const char *text);

/* Appends the whole exposition to b. */
void metrics_render(api_metrics *m, api_registry *reg, strbuf *b);

#endif
