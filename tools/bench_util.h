/* bench_util.h: what the engine benchmarks (dp-engine-bench,
 * dp-dualpath-bench) share: comma lists on the command line, a batch of
 * random-token requests submitted to an engine, and waiting for them. */
#ifndef DP_TOOLS_BENCH_UTIL_H
#define DP_TOOLS_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Parses "512,2048" into out (at most max values); returns the count. */
int bench_parse_list(const char *s, int *out, int max);

/* Submits n requests of plen tokens drawn from [0, vocab) by a generator
 * seeded with seed (the same prompts for the same seed), each with params
 * prm and sampling seed = its index. 0 or a DP_E* code (err filled). */
int bench_submit_random(dp_engine *e, int n, int plen, int32_t vocab, uint64_t seed,
                        const dp_request_params *prm, char *err, size_t errsz);

/* Waits until n requests have finished; returns their completion tokens.
 * poll (may be NULL) runs once per look at the engine's events. */
int64_t bench_wait(dp_engine *e, int n, void (*poll)(dp_engine *e, void *ud), void *ud);

#endif
