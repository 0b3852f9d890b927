/* test_sampler.c: greedy, temperature, top-k / top-p / min-p truncation,
 * penalties, logit bias, log-probabilities and seeded reproducibility. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sampler.h"
#include "t.h"

#define V 8

int main(void)
{
    dp_sampler s;
    CHECK(sampler_init(&s, V) == 0);
    float logits[V] = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f, -1.0f, 0.0f, 2.5f};
    dp_sampling sp;
    sampling_default(&sp);
    dp_rng r;
    rng_seed(&r, 1);

    /* Greedy: argmax, lowest index on ties. */
    sp.temperature = 0;
    CHECK_EQ_INT(sampler_sample(&s, &sp, &r, logits), 1);
    CHECK_EQ_INT(sampler_argmax(logits, V), 1);

    /* Temperature sampling follows softmax(logits / T). */
    sp.temperature = 0.7f;
    int counts[V] = {0};
    const int N = 200000;
    for (int i = 0; i < N; i++)
        counts[sampler_sample(&s, &sp, &r, logits)]++;
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp(logits[i] / 0.7);
    for (int i = 0; i < V; i++) {
        double p = exp(logits[i] / 0.7) / z;
        CHECK_NEAR((double)counts[i] / N, p, 4 * sqrt(p * (1 - p) / N) + 1e-4);
    }
    /* top-k = 2: only the two best (ids 1 and 4) ever appear. */
    sp.top_k = 2;
    for (int i = 0; i < 2000; i++) {
        int t = sampler_sample(&s, &sp, &r, logits);
        CHECK(t == 1 || t == 4);
    }
    /* top-p: the smallest set whose mass reaches p. */
    sp.top_k = 0;
    sp.top_p = 0.5f;
    for (int i = 0; i < 2000; i++) {
        int t = sampler_sample(&s, &sp, &r, logits);
        CHECK(t == 1 || t == 4);
    }
    /* min-p: tokens below min_p * p_max are dropped. */
    sp.top_p = 1.0f;
    sp.min_p = 0.5f; /* exp(2.5-3) = 0.61 stays, exp(2-3) = 0.37 goes */
    for (int i = 0; i < 2000; i++) {
        int t = sampler_sample(&s, &sp, &r, logits);
        CHECK(t == 1 || t == 4 || t == 7);
    }
    /* Seeded streams are reproducible and differ between seeds. */
    sp.min_p = 0;
    sp.temperature = 1.0f;
    dp_rng a, b, c;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 200; i++) {
        int ta = sampler_sample(&s, &sp, &a, logits), tb = sampler_sample(&s, &sp, &b, logits);
        CHECK_EQ_INT(ta, tb);
        same_c += ta == sampler_sample(&s, &sp, &c, logits);
    }
    CHECK(same_c < 200);

    /* Logit bias. */
    float l2[V];
    memcpy(l2, logits, sizeof l2);
    int32_t ids[2] = {5, 99};
    float bias[2] = {10.0f, 5.0f}; /* 99 is outside the vocabulary: ignored */
    sampler_apply_bias(l2, V, ids, bias, 2);
    CHECK_NEAR(l2[5], 9.0f, 1e-6);
    CHECK_EQ_INT(sampler_argmax(l2, V), 5);

    /* Penalties: repetition over prompt + output, presence/frequency over output. */
    memcpy(l2, logits, sizeof l2);
    dp_sampling pen;
    sampling_default(&pen);
    pen.repetition_penalty = 2.0f;
    pen.presence_penalty = 0.5f;
    pen.frequency_penalty = 0.25f;
    int32_t prompt[] = {1, 5, 1};
    int32_t gen[] = {4, 4, 4, 2};
    sampler_apply_penalties(&s, &pen, l2, prompt, 3, gen, 4);
    CHECK_NEAR(l2[1], 1.5f, 1e-6);                    /* 3 / 2, prompt only */
    CHECK_NEAR(l2[5], -2.0f, 1e-6);                   /* -1 * 2 */
    CHECK_NEAR(l2[4], 3.0f / 2 - 0.5f - 0.75f, 1e-6); /* rep, presence, 3 x frequency */
    CHECK_NEAR(l2[2], 2.0f / 2 - 0.5f - 0.25f, 1e-6);
    CHECK_NEAR(l2[0], 1.0f, 1e-6);                    /* untouched */
    for (int i = 0; i < V; i++)
        CHECK_EQ_INT(s.counts[i], 0); /* scratch left clean */

    /* Log-probabilities: normalized, <= 0, top list sorted. */
    int32_t top[3];
    float tlp[3];
    float lp = sampler_logprobs(&s, logits, 2, 3, top, tlp);
    double zz = 0;
    for (int i = 0; i < V; i++)
        zz += exp(logits[i]);
    CHECK_NEAR(lp, 2.0 - log(zz), 1e-5);
    CHECK_EQ_INT(top[0], 1);
    CHECK_EQ_INT(top[1], 4);
    CHECK_EQ_INT(top[2], 7);
    CHECK(tlp[0] >= tlp[1] && tlp[1] >= tlp[2] && tlp[0] <= 0);
    CHECK_NEAR(tlp[0], 3.0 - log(zz), 1e-5);
    sampler_destroy(&s);

    /* A large vocabulary: the fast path (partial selection) must keep exactly
     * the reference nucleus, for flat and peaked distributions alike. */
    enum { BIG = 5000 };
    CHECK(sampler_init(&s, BIG) == 0);
    static float lg[BIG];
    static int hits[BIG];
    for (int shape = 0; shape < 3; shape++) {
        uint64_t x = 12345 + (uint64_t)shape;
        for (int i = 0; i < BIG; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            float u = (float)((x >> 40) & 0xffffff) / 16777216.0f;
            lg[i] = shape == 0 ? u : shape == 1 ? 8.0f * u * u * u : 30.0f * u;
        }
        dp_sampling q;
        sampling_default(&q);
        q.temperature = 0.8f;
        q.top_p = shape == 0 ? 0.5f : 0.9f;
        q.min_p = shape == 2 ? 0.05f : 0.0f;
        /* Reference nucleus by brute force. */
        static int order[BIG];
        for (int i = 0; i < BIG; i++)
            order[i] = i;
        for (int i = 1; i < BIG; i++) { /* insertion sort by logit desc, id asc */
            int v = order[i], j = i - 1;
            while (j >= 0 && (lg[order[j]] < lg[v] || (lg[order[j]] == lg[v] && order[j] > v))) {
                order[j + 1] = order[j];
                j--;
            }
            order[j + 1] = v;
        }
        double zb = 0;
        for (int i = 0; i < BIG; i++)
            zb += exp((lg[i] - lg[order[0]]) / 0.8);
        static bool allowed[BIG];
        memset(allowed, 0, sizeof allowed);
        double cum = 0;
        double p0 = 1.0 / zb;
        for (int i = 0; i < BIG; i++) {
            double p = exp((lg[order[i]] - lg[order[0]]) / 0.8) / zb;
            if (q.min_p > 0 && p < q.min_p * p0)
                break;
            allowed[order[i]] = true;
            cum += p;
            if (cum >= q.top_p)
                break;
        }
        memset(hits, 0, sizeof hits);
        dp_rng rr;
        rng_seed(&rr, 5);
        for (int i = 0; i < 3000; i++) {
            int t = sampler_sample(&s, &q, &rr, lg);
            CHECK_MSG(allowed[t], "shape %d: token %d outside the nucleus", shape, t);
            hits[t]++;
        }
        int distinct = 0;
        for (int i = 0; i < BIG; i++)
            distinct += hits[i] > 0;
        CHECK(distinct > 1);
    }
    sampler_destroy(&s);
    T_DONE("sampler");
}
