/* placed.h - where a model runs: on this node alone, or as a pipeline of
 * stages on several nodes of the cluster, as placement (cluster/placement.h)
 * decides from the model file's sizes and the cluster view. */
#ifndef RC_API_PLACED_H
#define RC_API_PLACED_H

#include <stdbool.h>

#include <jansson.h>

#include "registry.h"

/* For model m (whose lm is open without weights): places it.  Returns 0
 * with *eng NULL when it runs here alone (the caller loads it as usual), 0
 * with *eng set when a pipeline across nodes was set up (the engine owns
 * it), or a negative code: the model does not fit the cluster (the detail
 * says by how much and what would fit), or a stage failed to start.
 * *plan gets the placement as JSON in every case it was made. */
int placed_engine(const registry_config *cfg, api_model *m, engine **eng, json_t **plan);

/* Places model m as it would be placed now under `wish` (NULL: as
 * configured), without starting anything: *plan gets placement_to_json's
 * object (fits or not, stages, tokens_per_s, advice) and "runs_here".
 * RC_ESTATE without a cluster or for a file only another node has; the
 * file's errors otherwise. */
int placed_preview(const registry_config *cfg, const api_model *m, const place_wish *wish,
                   json_t **plan);

/* Whether model `name` (the file at path) would run on this node alone if it
 * were placed now (true without a cluster, and for a file it cannot read:
 * loading it here says why). */
bool placed_runs_here(const registry_config *cfg, const char *name, const char *path);

#endif
