/* test_stats.c: dp-loadgen's statistics (numpy-linear percentiles, mean, max,
 * goodput SLO checks), length specs and arrival gaps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/stats.h"
#include "loadtest/workload.h"

static int g_fail;
#define CHECK(c)                                                                    \
    do {                                                                            \
        if (!(c)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);   \
            g_fail++;                                                               \
        }                                                                           \
    } while (0)
#define NEAR(a, b) (fabs((a) - (b)) < 1e-9)

static void test_percentiles(void)
{
    lg_samples s;
    lg_samples_init(&s);
    for (int i = 100; i >= 1; i--) /* reversed: summarize must sort */
        CHECK(lg_samples_add(&s, i) == 0);
    lg_summary sm;
    lg_samples_summarize(&s, &sm);
    CHECK(sm.n == 100);
    CHECK(NEAR(sm.mean, 50.5));
    CHECK(NEAR(sm.median, 50.5));
    CHECK(NEAR(sm.p90, 90.1));
    CHECK(NEAR(sm.p99, 99.01));
    CHECK(NEAR(sm.max, 100) && NEAR(sm.min, 1));
    CHECK(NEAR(lg_samples_percentile(&s, 0), 1) && NEAR(lg_samples_percentile(&s, 100), 100));
    CHECK(NEAR(lg_samples_percentile(&s, 25), 25.75));
    lg_samples_destroy(&s);

    /* numpy.percentile([3, 1, 7, 15], [50, 90, 99]) = [5.0, 12.6, 14.76] */
    lg_samples_init(&s);
    double v[] = {3, 1, 7, 15};
    for (int i = 0; i < 4; i++)
        lg_samples_add(&s, v[i]);
    lg_samples_summarize(&s, &sm);
    CHECK(NEAR(sm.median, 5.0) && NEAR(sm.p90, 12.6) && NEAR(sm.p99, 14.76));
    CHECK(NEAR(sm.mean, 6.5) && NEAR(sm.max, 15));
    lg_samples_destroy(&s);

    lg_samples_init(&s);
    lg_samples_add(&s, 42);
    lg_samples_summarize(&s, &sm);
    CHECK(NEAR(sm.median, 42) && NEAR(sm.p99, 42) && NEAR(sm.stddev, 0));
    lg_samples_destroy(&s);

    lg_samples_init(&s);
    lg_samples_summarize(&s, &sm);
    CHECK(sm.n == 0 && sm.mean == 0);
    CHECK(isnan(lg_samples_percentile(&s, 50)));
    lg_samples_destroy(&s);
}

static void test_goodput(void)
{
    lg_slo none = {0};
    CHECK(!lg_slo_active(&none));
    CHECK(lg_slo_met(&none, 1e9, 1e9, 1e9));
    lg_slo slo = {.ttft_ms = 100, .tpot_ms = 20};
    CHECK(lg_slo_active(&slo));
    CHECK(lg_slo_met(&slo, 100, 20, 5000));  /* limits are inclusive */
    CHECK(!lg_slo_met(&slo, 100.1, 10, 0));
    CHECK(!lg_slo_met(&slo, 50, 20.5, 0));
    CHECK(!lg_slo_met(&slo, -1, 10, 0));     /* no TTFT measured: not good */
    CHECK(lg_slo_met(&slo, 50, 0, 0));       /* one-token reply: TPOT 0 */
    lg_slo e2e = {.e2el_ms = 1000};
    CHECK(lg_slo_met(&e2e, -1, -1, 999) && !lg_slo_met(&e2e, -1, -1, 1001));
    /* Goodput over a known set: 10 requests, TTFT 10..100 ms, SLO 55 ms → 5 good. */
    lg_slo t = {.ttft_ms = 55};
    int good = 0;
    for (int i = 1; i <= 10; i++)
        good += lg_slo_met(&t, i * 10.0, 1, 1);
    CHECK(good == 5);
}

static void test_lengths_and_arrivals(void)
{
    char err[128];
    lg_len_dist d;
    dp_rng r;
    rng_seed(&r, 7);
    CHECK(lg_len_dist_parse(&d, "256", err, sizeof err) == 0 && d.kind == LG_LEN_FIXED);
    CHECK(lg_len_dist_sample(&d, &r) == 256);
    lg_len_dist_destroy(&d);
    CHECK(lg_len_dist_parse(&d, "10:20", err, sizeof err) == 0 && d.kind == LG_LEN_UNIFORM);
    int lo = 1000, hi = 0;
    for (int i = 0; i < 2000; i++) {
        int x = lg_len_dist_sample(&d, &r);
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    CHECK(lo == 10 && hi == 20);
    lg_len_dist_destroy(&d);
    CHECK(lg_len_dist_parse(&d, "20:10", err, sizeof err) == DP_EINVAL);
    CHECK(lg_len_dist_parse(&d, "0", err, sizeof err) == DP_EINVAL);
    CHECK(lg_len_dist_parse(&d, "abc", err, sizeof err) == DP_EINVAL);
    CHECK(lg_len_dist_parse(&d, "@/nonexistent/file", err, sizeof err) == DP_EIO);
    char path[] = "/tmp/dp_lg_lens_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w");
        fputs("# lengths\n5\n7\n\n9\n", f);
        fclose(f);
        char spec[64];
        snprintf(spec, sizeof spec, "@%s", path);
        CHECK(lg_len_dist_parse(&d, spec, err, sizeof err) == 0 && d.n == 3);
        CHECK(NEAR(lg_len_dist_mean(&d), 7.0));
        for (int i = 0; i < 100; i++) {
            int x = lg_len_dist_sample(&d, &r);
            CHECK(x == 5 || x == 7 || x == 9);
        }
        lg_len_dist_destroy(&d);
        remove(path);
    }
    /* Poisson and gamma gaps keep the mean 1/rate; gamma with shape < 1 is burstier. */
    double rate = 20, sum = 0, sum_g = 0, var_p = 0, var_g = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double a = lg_rng_interarrival(&r, rate, 1.0), b = lg_rng_interarrival(&r, rate, 0.25);
        sum += a;
        sum_g += b;
        var_p += (a - 0.05) * (a - 0.05);
        var_g += (b - 0.05) * (b - 0.05);
    }
    CHECK(fabs(sum / n - 0.05) < 0.002 && fabs(sum_g / n - 0.05) < 0.002);
    CHECK(var_g > 2 * var_p); /* CV^2 is 1/shape: 4 vs 1 */
    CHECK(lg_rng_interarrival(&r, 0, 1) == 0);
    /* N random words are N words. */
    char *text;
    CHECK(lg_workload_random_text(&r, 300, &text) == 0);
    int words = 0;
    for (char *t = strtok(text, " "); t; t = strtok(NULL, " "))
        words++;
    CHECK(words == 300);
    free(text);
}

int main(void)
{
    test_percentiles();
    test_goodput();
    test_lengths_and_arrivals();
    if (g_fail) {
        fprintf(stderr, "test_stats: %d checks failed\n", g_fail);
        return 1;
    }
    printf("test_stats: ok\n");
    return 0;
}
