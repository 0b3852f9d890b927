/* stats.c: summaries of latency samples for dp-loadgen. Percentiles match numpy's
 * default so that numbers compare with vLLM's benchmark_serving.py. */
#include "stats.h"

#include <math.h>
#include <stdlib.h>

void lg_samples_init(lg_samples *s)
{
    s->v = NULL;
    s->n = s->cap = 0;
    s->sorted = true;
}

void lg_samples_destroy(lg_samples *s)
{
    free(s->v);
    lg_samples_init(s);
}

int lg_samples_add(lg_samples *s, double x)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        double *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv)
            return DP_ENOMEM;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = x;
    s->sorted = false;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void samples_sort(lg_samples *s)
{
    if (!s->sorted && s->n > 1)
        qsort(s->v, s->n, sizeof *s->v, cmp_double);
    s->sorted = true;
}

double lg_samples_percentile(lg_samples *s, double p)
{
    if (s->n == 0)
        return NAN;
    samples_sort(s);
    if (p <= 0)
        return s->v[0];
    if (p >= 100)
        return s->v[s->n - 1];
    double idx = p / 100.0 * (double)(s->n - 1);
    size_t lo = (size_t)floor(idx);
    size_t hi = lo + 1 < s->n ? lo + 1 : lo;
    double frac = idx - (double)lo;
    return s->v[lo] + (s->v[hi] - s->v[lo]) * frac;
}

void lg_samples_summarize(lg_samples *s, lg_summary *out)
{
    *out = (lg_summary){0};
    if (s->n == 0)
        return;
    samples_sort(s);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    out->n = s->n;
    out->mean = sum / (double)s->n;
    double var = 0;
    for (size_t i = 0; i < s->n; i++)
        var += (s->v[i] - out->mean) * (s->v[i] - out->mean);
    out->stddev = sqrt(var / (double)s->n);
    out->median = lg_samples_percentile(s, 50);
    out->p90 = lg_samples_percentile(s, 90);
    out->p99 = lg_samples_percentile(s, 99);
    out->min = s->v[0];
    out->max = s->v[s->n - 1];
}

bool lg_slo_active(const lg_slo *slo)
{
    return slo->ttft_ms > 0 || slo->tpot_ms > 0 || slo->e2el_ms > 0;
}

bool lg_slo_met(const lg_slo *slo, double ttft_ms, double tpot_ms, double e2el_ms)
{
    if (slo->ttft_ms > 0 && !(ttft_ms >= 0 && ttft_ms <= slo->ttft_ms))
        return false;
    /* A one-token reply has no TPOT; vLLM counts it as 0, which meets any limit. */
    if (slo->tpot_ms > 0 && tpot_ms > slo->tpot_ms)
        return false;
    if (slo->e2el_ms > 0 && !(e2el_ms >= 0 && e2el_ms <= slo->e2el_ms))
        return false;
    return true;
}
