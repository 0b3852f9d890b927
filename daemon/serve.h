/* serve.h: `dualpathd` without --prompt: load the model, start the engine and
 * the HTTP API, serve until SIGTERM/SIGINT, drain, exit. */
#ifndef DP_DAEMON_SERVE_H
#define DP_DAEMON_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "api/server.h"
#include "engine/engine.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

typedef struct dp_serve_opts {
    const char *model;
    const char *device;
    int threads;
    bool cuda_graphs;        /* record and replay decode steps (default true) */
    bool exact_matmul;       /* CPU: f32 matmuls (no int8 activations) */
    bool verbose;
    int log_level;           /* DP_LOG_* */
    const char *model_name;  /* default: the file name without .gguf */
    const char *chat_template; /* NULL or "": the model's; else a file, or the Jinja text */
    double drain_timeout_s;  /* default 30 */
    bool watchdog;           /* answer systemd's watchdog (default true) */
    /* The HTTP API: address, limits, deadlines, keys, CORS (server_opts_default;
     * serve_run sets the model name, alias and backend). */
    dp_server_opts api;
    dp_engine_opts engine;
} dp_serve_opts;

void serve_opts_default(dp_serve_opts *o);
/* The chat template: conf (a file, or the Jinja text itself when it holds
 * "{%" or "{{") if set, else the model's tokenizer.chat_template, compiled
 * with the tokenizer's BOS/EOS texts. Logs which and the family. */
int serve_chat_template(dp_chat_template *ct, const char *conf, const dp_gguf *g,
                        const dp_tokenizer *tok, char *err, size_t errsz);
/* Returns a process exit status. */
int serve_run(const dp_serve_opts *o);

#endif
