/* oneshot.h: `dualpathd --prompt`: load the model, generate one completion to
 * stdout through the engine the daemon serves with, exit. */
#ifndef DP_DAEMON_ONESHOT_H
#define DP_DAEMON_ONESHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct dp_oneshot_opts {
    const char *model;
    const char *prompt;
    const char *device;
    int32_t max_tokens;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
    bool chat;
    const char *chat_template; /* as serve's: NULL or "": the model's */
    int threads;
    bool exact_matmul;
    bool cuda_graphs;            /* as serving's cuda_graphs */
    bool verbose;
    const dp_engine_opts *engine; /* the daemon's engine options (its configuration) */
} dp_oneshot_opts;

/* Returns a process exit status. */
int oneshot_run(const dp_oneshot_opts *o);

#endif
