/* stats.h: growable sample vectors and their summaries (mean, percentiles with
 * numpy's default linear interpolation, max) plus goodput against SLOs. */
#ifndef DP_LOADTEST_STATS_H
#define DP_LOADTEST_STATS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/dp.h"

typedef struct lg_samples {
    double *v;
    size_t n, cap;
    bool sorted;
} lg_samples;

typedef struct lg_summary {
    size_t n;
    double mean, median, p90, p99, max, min, stddev;
} lg_summary;

void lg_samples_init(lg_samples *s);
void lg_samples_destroy(lg_samples *s);
int lg_samples_add(lg_samples *s, double x);
/* All fields 0 when empty. Sorts s. */
void lg_samples_summarize(lg_samples *s, lg_summary *out);
/* p in [0, 100]; linear interpolation between closest ranks (numpy "linear"). NAN when empty. */
double lg_samples_percentile(lg_samples *s, double p);

/* One request as the SLO check sees it; a negative value means "not measured". */
typedef struct lg_slo {
    double ttft_ms, tpot_ms, e2el_ms; /* <= 0: no limit */
} lg_slo;

bool lg_slo_active(const lg_slo *slo);
/* True when every limit that is set is met; a limit on an unmeasured value fails. */
bool lg_slo_met(const lg_slo *slo, double ttft_ms, double tpot_ms, double e2el_ms);

#endif
