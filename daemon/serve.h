/* serve.h: `dualpathd` without --prompt: load the model, start the engine and
 * the HTTP API, serve until SIGTERM/SIGINT, drain, exit. */
#ifndef DP_DAEMON_SERVE_H
#define DP_DAEMON_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct dp_serve_opts {
    const char *model;
    const char *device;
    int threads;
    bool cuda_graphs;        /* record and replay decode steps (default true) */
    bool exact_matmul;       /* CPU: f32 matmuls (no int8 activations) */
    bool verbose;
    int log_level;           /* DP_LOG_* */
    const char *host;        /* default 127.0.0.1 */
    int port;                /* default 8080; 0: any free port */
    const char *model_name;  /* default: the file name without .gguf */
    double drain_timeout_s;  /* default 30 */
    size_t max_body;         /* 0: the server's default */
    unsigned conn_limit;     /* 0: the server's default */
    unsigned conn_timeout_s; /* 0: the server's default */
    int default_max_tokens;  /* 0: the rest of the context (chat), 16 (completions) */
    bool watchdog;           /* answer systemd's watchdog (default true) */
    dp_engine_opts engine;
} dp_serve_opts;

void serve_opts_default(dp_serve_opts *o);
/* Returns a process exit status. */
int serve_run(const dp_serve_opts *o);

#endif
