/* cluster_query.h - GET /v1/cluster's query parameters, for clusters too
 * large to list whole in every answer (issue 22).
 *
 *   nodes=A,B,...   only these nodes: an id, its first 8+ hex digits, or a name
 *   state=up|down   only nodes in this state
 *   offset=K        skip the first K nodes (in id order) ...
 *   limit=N         ... and list at most N (1..10000)
 *   summary=1       no node or link list: counts per state and totals
 *
 * Without parameters the answer is what it always was.  With any, the
 * answer also says "nodes_total" (the nodes that matched, before paging)
 * and "next_offset" (the offset of the next page, or null); `links` keeps
 * only the links from a listed node.
 */
#ifndef RC_API_CLUSTER_QUERY_H
#define RC_API_CLUSTER_QUERY_H

#include <jansson.h>

/* Rewrites `body` (the JSON of GET /v1/cluster: "nodes", "links") for the
 * query string `query` (without '?'; NULL or "" leaves it as is).  Returns 0,
 * or RC_EINVAL with a detail naming the bad parameter (for a 400). */
int cluster_query_apply(json_t *body, const char *query);

#endif
