/* test_sampler.c: greedy, temperature, top-k / top-p / min-p truncation,
 * penalties, logit bias, log-probabilities and seeded reproducibility. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/topk.h"
#include "sched/sampler.h"
#include "t.h"

#define V 8

/* ---- candidates vs the full row -------------------------------------------- */

static uint64_t trs = 88172645463325252ULL;
static uint64_t trand(void)
{
    trs ^= trs << 13;
    trs ^= trs >> 7;
    trs ^= trs << 17;
    return trs;
}
static float tunif(void) { return (float)(trand() >> 40) / 16777216.0f; } /* [0, 1) */

static const float *key_row;
static int key_cmp(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const uint64_t x = dp_topk_key(key_row[i], i), y = dp_topk_key(key_row[j], j);
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The semantics of sampler.c written plainly: the whole row sorted, weights
 * and prefix sums walked in order. */
static int32_t ref_sample(const float *x, int32_t nv, const dp_sampling *sp, dp_rng *rng)
{
    static int32_t ord[50000];
    static uint64_t M[50001];
    for (int32_t i = 0; i < nv; i++)
        ord[i] = i;
    key_row = x;
    qsort(ord, (size_t)nv, sizeof *ord, key_cmp);
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return ord[0];
    float m = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        if (x[i] > m)
            m = x[i];
    m += 0.0f;
    if (!isfinite(m))
        return ord[0];
    const double u = rng_uniform(rng);
    const float inv_t = 1.0f / sp->temperature;
    const float xmax = sp->min_p > 0.0f ? fmaxf(-logf(sp->min_p), 0.0f) : INFINITY;
    int32_t P = 0, nm = 0;
    M[0] = 0;
    for (; P < nv; P++) {
        const float t = (x[ord[P]] - m) * inv_t;
        if (!(t > -DP_TOPK_TCUT))
            break;
        nm += -t <= xmax;
        M[P + 1] = M[P] + dp_topk_weight(t);
    }
    const uint64_t S = dp_topk_sum_units(dp_topk_sum_float(M[P]));
    const bool topk_on = sp->top_k > 0 && sp->top_k < nv;
    const int32_t nk = topk_on && sp->top_k < P ? sp->top_k : P;
    if (sp->min_p <= 0.0f)
        nm = P;
    if (nm < 1)
        nm = 1;
    const int32_t n1 = nk < nm ? nk : nm;
    int32_t n = n1;
    if (sp->top_p < 1.0f) {
        const double target = ceil((double)sp->top_p * (double)(topk_on ? M[nk] : S));
        for (n = 1; n < n1 && (double)M[n] < target; n++)
            ;
    }
    const bool truncated = topk_on || sp->min_p > 0.0f || sp->top_p < 1.0f;
    const uint64_t total = truncated ? M[n] : S;
    const uint64_t td = (uint64_t)(u * (double)total);
    for (int32_t i = 1; i <= n; i++)
        if (M[i] > td)
            return ord[i - 1];
    return ord[n - 1];
}

/* Row shapes: peaked, flat, heavy ties, -inf/NaN holes, zeros at the top. */
static void make_row(float *x, int32_t nv, int shape)
{
    for (int32_t i = 0; i < nv; i++) {
        const float u = tunif();
        switch (shape) {
        case 0: x[i] = 3.0f * (u + tunif() + tunif() - 1.5f); break;
        case 1: x[i] = u; break;
        case 2: x[i] = (float)(int)(4.0f * u); break;
        case 3: x[i] = u < 0.3f ? -INFINITY : u < 0.35f ? NAN : 10.0f * u; break;
        case 4: x[i] = u < 0.5f ? (u < 0.25f ? -0.0f : 0.0f) : -20.0f * u; break;
        default: x[i] = 40.0f * u * u * u; break;
        }
    }
    if (shape == 0)
        x[trand() % (uint64_t)nv] = 12.0f; /* one clear favourite */
}

static void random_sampling(dp_sampling *sp)
{
    static const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.5f, 4.0f};
    static const int32_t topks[] = {0, 0, 0, 1, 5, 40, 64, 100, 300};
    static const float topps[] = {1.0f, 1.0f, 0.5f, 0.9f, 0.95f, 0.999f, 0.0f, 0.99999994f};
    static const float minps[] = {0.0f, 0.0f, 0.0f, 0.05f, 0.2f, 1e-9f};
    sampling_default(sp);
    sp->temperature = temps[trand() % 6];
    sp->top_k = topks[trand() % 9];
    sp->top_p = topps[trand() % 8];
    sp->min_p = minps[trand() % 6];
    sp->seed = trand();
}

/* sampler_sample, sampler_sample_candidates (+ the fallback) at several
 * candidate counts, and the plain reference: one token, one RNG state. */
static void check_paths(int rows, int32_t vmax)
{
    static float x[50000];
    static int32_t ids[DP_TOPK_MAX];
    static float vals[DP_TOPK_MAX];
    static const int32_t ks[] = {1, 2, 7, 64, 256};
    dp_sampler s;
    int64_t decided = 0, undecided = 0;
    for (int r = 0; r < rows; r++) {
        const int32_t nv = 1 + (int32_t)(trand() % (uint64_t)vmax);
        make_row(x, nv, (int)(trand() % 6));
        CHECK(sampler_init(&s, nv) == 0);
        for (int c = 0; c < 4; c++) {
            dp_sampling sp;
            random_sampling(&sp);
            dp_rng base;
            rng_seed(&base, sp.seed);
            dp_rng r_full = base, r_ref = base;
            const int32_t want = ref_sample(x, nv, &sp, &r_ref);
            const int32_t got = sampler_sample(&s, &sp, &r_full, x);
            CHECK_MSG(got == want, "row %d (nv=%d) T=%g top_k=%d top_p=%g min_p=%g: %d vs reference %d",
                      r, nv, sp.temperature, sp.top_k, sp.top_p, sp.min_p, got, want);
            CHECK(memcmp(&r_full, &r_ref, sizeof r_ref) == 0);
            for (int ki = 0; ki < 5; ki++) {
                const int32_t k = ks[ki] < nv ? ks[ki] : nv;
                const float T = sp.temperature > 0.0f ? sp.temperature : 1.0f;
                float mx, sum;
                dp_topk_row(x, nv, k, 1.0f / T, ids, vals, &mx, &sum);
                dp_rng r_c = base;
                dp_sample_pending pd;
                int32_t t = sampler_sample_candidates(&sp, &r_c, ids, vals, k, nv, mx, sum, &pd);
                if (t == DP_SAMPLE_UNDECIDED) {
                    undecided++;
                    t = sampler_sample_rest(&s, &sp, &pd, x);
                } else {
                    decided++;
                }
                CHECK_MSG(t == want, "row %d (nv=%d) k=%d T=%g top_k=%d top_p=%g min_p=%g: %d vs %d", r,
                          nv, k, sp.temperature, sp.top_k, sp.top_p, sp.min_p, t, want);
                CHECK(memcmp(&r_c, &r_ref, sizeof r_ref) == 0);
            }
        }
        sampler_destroy(&s);
    }
    /* Both outcomes must have been exercised. */
    CHECK(decided > 0 && undecided > 0);
    printf("sampler: %d rows up to %d tokens: candidates decided %lld, fell back %lld, all identical\n",
           rows, vmax, (long long)decided, (long long)undecided);
}

/* The level's weights, sum and argmax against their scalar definitions. */
static void check_topk_host(void)
{
    static float x[20000];
    static int32_t wid[20000 + DP_TOPK_SLACK];
    static uint64_t ww[20000 + DP_TOPK_SLACK];
    static float wt[20000 + DP_TOPK_SLACK];
    for (int r = 0; r < 200; r++) {
        const int32_t nv = 1 + (int32_t)(trand() % 20000);
        make_row(x, nv, r % 6);
        const float inv_t = 1.0f / (0.05f + 3.0f * tunif());
        int32_t ids[DP_TOPK_MAX];
        float vals[DP_TOPK_MAX], mx, sum;
        const int32_t k = nv < DP_TOPK_MAX ? nv : 1 + (int32_t)(trand() % DP_TOPK_MAX);
        dp_topk_row(x, nv, k, inv_t, ids, vals, &mx, &sum);
        CHECK_EQ_INT(sampler_argmax(x, nv), ids[0]);
        uint64_t s = 0;
        int32_t n = 0;
        for (int32_t i = 0; i < nv && isfinite(mx); i++) {
            const uint64_t w = dp_topk_weight((x[i] - mx) * inv_t);
            s += w;
            n += w != 0;
        }
        CHECK(sum == (isfinite(mx) ? dp_topk_sum_float(s) : 0.0f));
        if (isfinite(mx)) {
            CHECK_EQ_INT(dp_topk_weights(x, nv, mx, inv_t, wid, ww, wt), n);
            for (int32_t j = 0; j < n; j++) {
                CHECK(j == 0 || wid[j] > wid[j - 1]);
                CHECK(ww[j] == dp_topk_weight((x[wid[j]] - mx) * inv_t) && ww[j] > 0);
                CHECK(wt[j] == (x[wid[j]] - mx) * inv_t);
            }
        }
        /* Candidates: descending keys, and nothing left out beats the last. */
        for (int32_t j = 1; j < k; j++)
            CHECK(dp_topk_key(vals[j], ids[j]) < dp_topk_key(vals[j - 1], ids[j - 1]));
        int32_t above = 0;
        for (int32_t i = 0; i < nv; i++)
            above += dp_topk_key(x[i], i) > dp_topk_key(vals[k - 1], ids[k - 1]);
        CHECK_EQ_INT(above, k - 1);
    }
    /* Every weight of a sweep across the cut, at several temperatures, with
     * NaN and -inf among them: the level's vector weights are the scalar
     * definition's, lane for lane (and the tail past whole vectors). */
    for (int r = 0; r < 4; r++) {
        const int32_t nv = 19997;
        for (int32_t i = 0; i < nv; i++)
            x[i] = -35.0f + 35.0f * (float)i / (float)(nv - 1) + (float)r * 0.37f;
        x[101] = NAN;
        x[2003] = -INFINITY;
        const float inv_t = r == 0 ? 1.0f : 1.0f / (0.3f * (float)r), mx = x[nv - 1];
        int32_t n = 0, ids[1];
        uint64_t s = 0;
        for (int32_t i = 0; i < nv; i++) {
            s += dp_topk_weight((x[i] - mx) * inv_t);
            n += dp_topk_weight((x[i] - mx) * inv_t) != 0;
        }
        float vals[1], m2, sum;
        dp_topk_row(x, nv, 1, inv_t, ids, vals, &m2, &sum);
        CHECK(m2 == mx && ids[0] == nv - 1 && sum == dp_topk_sum_float(s));
        CHECK_EQ_INT(dp_topk_weights(x, nv, mx, inv_t, wid, ww, wt), n);
        for (int32_t j = 0; j < n; j++)
            CHECK(ww[j] == dp_topk_weight((x[wid[j]] - mx) * inv_t));
    }
    /* The scalar exp against libm over the whole range. */
    for (float t = -30.0f; t <= 0.0f; t += 0.001f)
        CHECK(fabs(dp_topk_exp(t) / exp((double)t) - 1.0) < 1e-6);
}

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

    /* One semantics, two sources of candidates. */
    check_topk_host();
    check_paths(3000, 300);
    check_paths(400, 5000);
    check_paths(12, 49152);
    dp_sampling np;
    sampling_default(&np);
    CHECK(!sampling_needs_row(&np));
    np.presence_penalty = 0.1f;
    CHECK(sampling_needs_row(&np));
    np.presence_penalty = 0.0f;
    np.repetition_penalty = 1.1f;
    CHECK(sampling_needs_row(&np));
    T_DONE("sampler");
}
