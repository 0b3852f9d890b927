/* runner.h: one benchmark run on a libuv loop: arrivals (closed loop, Poisson or
 * gamma), warm-up, the time limit, per-request timeouts, and one record per request. */
#ifndef DP_LOADTEST_RUNNER_H
#define DP_LOADTEST_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dp.h"
#include "http_client.h"
#include "workload.h"

typedef struct lg_run_opts {
    lg_url url;
    const char *path;        /* endpoint, e.g. "/v1/completions" (appended to url.prefix) */
    const char *extra_headers; /* e.g. "Authorization: Bearer x\r\n", or NULL */
    bool stream;
    int num_requests;        /* measured requests; 0 = until the time limit */
    int turns;               /* chat workload: turns per session (new sessions = ceil(n / turns)) */
    int concurrency;         /* max in flight; 0 = unlimited */
    double rate;             /* arrivals per second; 0 = closed loop (as fast as concurrency allows) */
    double burstiness;       /* gamma shape of the gaps; 1 = Poisson */
    int warmup;              /* requests before the measurement, not counted */
    double duration_s;       /* time limit for the whole run incl. warm-up; 0 = none */
    double timeout_s;        /* per request */
    bool progress;
    uint64_t seed;
} lg_run_opts;

/* One request, measured or warm-up. Times in seconds; < 0 when not measured. */
typedef struct lg_result {
    uint64_t id;
    bool warmup;
    bool ok;
    int status;              /* HTTP status, 0 when none arrived */
    char reason[40];         /* failure category: "http_429", "timeout", "connect_ECONNREFUSED", ... */
    char *error;             /* failure detail (malloc'ed) or NULL */
    double start;            /* since the measured phase began (warm-up: negative) */
    double ttft, e2e, tpot;
    double *itl;             /* gaps between content chunks */
    size_t n_itl;
    int prompt_tokens;       /* server usage, or -1 */
    int completion_tokens;   /* server usage, or -1 */
    int chunks;              /* streamed content chunks (or 1 for a non-stream reply with text) */
    int prompt_words;        /* what we sent, ≈ tokens */
    int max_tokens;
    int64_t session;         /* chat workload: session id, else -1 */
    int turn;
} lg_result;

typedef struct lg_run_result {
    lg_result *res;
    size_t n, cap;
    double duration;         /* measured phase, seconds */
    double wall_start;       /* epoch seconds when the run began */
    size_t incomplete;       /* measured requests still in flight at the time limit */
    size_t incomplete_chunks; /* streamed text chunks (about one token each) they had received */
    bool time_limited, interrupted;
    int concurrency_seen;    /* max in flight */
    size_t retries;          /* requests resent after a kept-alive connection closed unused */
} lg_run_result;

/* Runs the whole thing; `w` provides the bodies. Returns 0 (failures of requests
 * are results, not errors) or < 0 when the run could not start. */
int lg_run_execute(const lg_run_opts *o, lg_workload *w, lg_run_result *out, char *err,
                   size_t errsz);
void lg_run_result_destroy(lg_run_result *r);

/* Token counts of a result: the server's when it sent usage, else ours (chunks / words). */
int lg_result_output_tokens(const lg_result *r);
int lg_result_input_tokens(const lg_result *r);

#endif
