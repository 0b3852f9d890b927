/* rng.h: the project's seeded random numbers: xoshiro256**, seeded through
 * splitmix64. One generator for the sampler (per-request seeds) and the load
 * generator (reproducible workloads); it depends on nothing. */
#ifndef DP_COMMON_RNG_H
#define DP_COMMON_RNG_H

#include <stdint.h>

typedef struct dp_rng {
    uint64_t s[4];
} dp_rng;

void rng_seed(dp_rng *r, uint64_t seed);
uint64_t rng_next(dp_rng *r);
/* Uniform in [0, 1). */
double rng_uniform(dp_rng *r);

#endif
