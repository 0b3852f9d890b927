/* report.h: turns a run's records into the numbers users compare (throughput,
 * TTFT/TPOT/ITL/E2E percentiles, goodput, failures by reason) and writes them as a table, JSON or TSV. */
#ifndef DP_LOADTEST_REPORT_H
#define DP_LOADTEST_REPORT_H

#include <stdio.h>

#include "runner.h"
#include "stats.h"

#define LG_MAX_REASONS 32

typedef struct lg_reason_count {
    char reason[40];
    int count;
    char example[300];
} lg_reason_count;

typedef struct lg_report {
    size_t completed, failed, incomplete, warmup_requests;
    double duration;
    double request_throughput, input_throughput, output_throughput, total_token_throughput;
    /* Output tokens received per second, those of requests stopped at the time
     * limit included (streamed chunks, about one token each): what the server
     * produced, where output_throughput counts completed requests only. */
    double streamed_output_throughput;
    size_t incomplete_chunks;
    long long total_input_tokens, total_output_tokens;
    size_t with_usage, without_usage;  /* successful measured requests */
    /* Every request incl. warm-up and failed ones, as the server saw them. */
    size_t all_requests, all_without_usage;
    long long all_server_prompt_tokens, all_server_completion_tokens;
    lg_summary ttft, tpot, itl, e2el; /* milliseconds */
    size_t good;
    double goodput;
    int max_concurrency;
    lg_reason_count reasons[LG_MAX_REASONS];
    int n_reasons;
    int other_reasons; /* failures beyond LG_MAX_REASONS distinct reasons */
} lg_report;

/* What the run was; printed and stored with the numbers. */
typedef struct lg_report_meta {
    const char *label, *base_url, *endpoint, *model, *workload, *input_len, *output_len;
    bool stream, ignore_eos;
    int concurrency, num_requests, warmup, turns;
    double rate, burstiness, duration_limit, timeout;
    lg_slo slo;
    const char *metrics_before, *metrics_after; /* raw /metrics texts or NULL */
} lg_report_meta;

int lg_report_compute(const lg_run_result *rr, const lg_slo *slo, lg_report *rep);
void lg_report_print(FILE *f, const lg_report *rep, const lg_report_meta *m,
                     const lg_run_result *rr);
int lg_report_write_json(const char *path, const lg_report *rep, const lg_report_meta *m,
                         const lg_run_result *rr, char *err, size_t errsz);
/* One line per run (header written when the file is new) for scripts like bench.sh. */
int lg_report_append_tsv(const char *path, const lg_report *rep, const lg_report_meta *m,
                         char *err, size_t errsz);

/* ---- Prometheus text format ---- */

typedef struct lg_prom_sample {
    char *key;     /* name with its {labels}, as written */
    double value;
} lg_prom_sample;

typedef struct lg_prom {
    lg_prom_sample *s;
    size_t n, cap;
} lg_prom;

int lg_prom_parse(const char *text, lg_prom *out);
void lg_prom_destroy(lg_prom *p);
/* NULL when absent. */
const lg_prom_sample *lg_prom_find(const lg_prom *p, const char *key);
/* Counters worth showing: the metric name has "tokens" or "requests", not a histogram bucket. */
bool lg_prom_interesting(const char *key);

#endif
