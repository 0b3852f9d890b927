/* metrics.h: the daemon's Prometheus counters and histograms (kept on the loop
 * thread) and their rendering in text exposition format 0.0.4, merged with a
 * snapshot of the engine's own counters. */
#ifndef DP_API_METRICS_H
#define DP_API_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define DP_HIST_MAX_BUCKETS 24
#define DP_METRICS_MAX_CODES 32

/* Connection deadlines (api/http.c's dp_http_deadline, counted by server.c). */
enum { DP_TIMEOUT_HEADER, DP_TIMEOUT_BODY, DP_TIMEOUT_IDLE, DP_TIMEOUT_KINDS };

typedef struct dp_hist {
    const double *bounds;  /* upper bounds, increasing; +Inf is implicit */
    int n_bounds;
    uint64_t counts[DP_HIST_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} dp_hist;

typedef struct dp_metrics {
    dp_hist ttft;          /* arrival -> first token, seconds */
    dp_hist itl;           /* mean gap between tokens of a request, seconds */
    dp_hist e2e;           /* arrival -> finish, seconds */
    uint64_t finished[5];  /* by dp_finish */
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    int n_codes;
    int codes[DP_METRICS_MAX_CODES];
    uint64_t code_counts[DP_METRICS_MAX_CODES];
    uint64_t conn_timeouts[DP_TIMEOUT_KINDS]; /* connections closed by a deadline */
    uint64_t request_timeouts;                /* completions cancelled by request_timeout */
    uint64_t auth_failures;                   /* 401s */
} dp_metrics;

void metrics_init(dp_metrics *m);
void hist_observe(dp_hist *h, double v);
void metrics_count_response(dp_metrics *m, int status);

typedef struct dp_metrics_info {
    const char *version;
    const char *model;
    const char *backend;
    const char *kernels; /* the CPU's instruction-set level, or the backend name */
    const char *matmul;  /* int8 | exact (CPU); f32 elsewhere */
    int draining;
    unsigned connections; /* open HTTP connections */
    int answering;        /* the status of the scrape's own response, counted once it is
                             queued: the text includes it already (0: none) */
} dp_metrics_info;

/* malloc'd exposition text; NULL on allocation failure. */
char *metrics_render(const dp_metrics *m, const dp_engine_stats *st, const dp_metrics_info *info,
                     size_t *len);

#endif
