/* rng.h - a small deterministic random generator (xoshiro256**, seeded by
 * splitmix64).  Used for synthetic weights, test data and sampling; the same
 * seed gives the same stream on every platform. */
#ifndef RC_RNG_H
#define RC_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_state;

void     rng_seed(rng_state *r, uint64_t seed);
uint64_t rng_next(rng_state *r);
double   rng_uniform(rng_state *r);            /* [0, 1) with 53 bits */
float    rng_normal(rng_state *r);             /* mean 0, std 1 */

#endif
