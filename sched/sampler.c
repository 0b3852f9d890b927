/* sampler.c: candidate filtering and sampling over a logits row. Sorting is
 * limited to the candidates that survive top-k, so large vocabularies stay
 * cheap when top-k is set. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

#include "kernels/simd.h"

struct dp_cand {
    int32_t id;
    float logit;
    float p;
};

void sampling_default(dp_sampling *sp)
{
    sp->temperature = 1.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    sp->presence_penalty = 0.0f;
    sp->frequency_penalty = 0.0f;
    sp->repetition_penalty = 1.0f;
    sp->seed = 0;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(dp_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
uint64_t rng_next(dp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double rng_uniform(dp_rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

int sampler_init(dp_sampler *s, int32_t vocab)
{
    s->vocab = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    return s->cand && s->counts && s->probs ? 0 : DP_ENOMEM;
}

void sampler_destroy(dp_sampler *s)
{
    free(s->cand);
    free(s->counts);
    free(s->probs);
    s->cand = NULL;
    s->counts = NULL;
    s->probs = NULL;
}

/* Largest finite value (-INFINITY when none). */
static float max_finite(const float *x, int32_t n)
{
    int32_t i = 0;
    float best = -INFINITY;
#ifdef __AVX512F__
    __m512 vb = _mm512_set1_ps(-INFINITY);
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        /* NaN and +inf compare false against +inf with LT_OQ: skipped. */
        __mmask16 ok = _mm512_cmp_ps_mask(v, inf, _CMP_LT_OQ);
        vb = _mm512_mask_max_ps(vb, ok, vb, v);
    }
    best = _mm512_reduce_max_ps(vb);
#endif
    for (; i < n; i++)
        if (isfinite(x[i]) && x[i] > best)
            best = x[i];
    return best;
}

int32_t sampler_argmax(const float *logits, int32_t vocab)
{
    float best = max_finite(logits, vocab);
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] == best)
            return i; /* lowest index on ties */
    return 0;
}

static int cand_desc(const void *a, const void *b)
{
    const struct dp_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id - y->id; /* deterministic order on ties */
}

static bool cand_better(const struct dp_cand *x, const struct dp_cand *y)
{
    return x->logit != y->logit ? x->logit > y->logit : x->id < y->id;
}

/* Partitions c[0..n) so that c[0..k) are the k best candidates (in cand_desc
 * order), in O(n) on average. */
static void select_top(struct dp_cand *c, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        struct dp_cand pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (cand_better(&c[i], &pivot))
                i++;
            while (cand_better(&pivot, &c[j]))
                j--;
            if (i <= j) {
                struct dp_cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Draws from c[0..n) with weights p (need not be normalized or sorted). */
static int32_t draw(const struct dp_cand *c, int32_t n, dp_rng *rng)
{
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += c[i].p;
    double u = rng_uniform(rng) * total, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id;
}

#define FAST_CANDIDATES 256

/* sum over finite x of exp((x - best) * inv_t): the softmax denominator.
 * With AVX-512 it uses a degree-6 polynomial exp (relative error ~2e-7),
 * about twenty times faster than a libm call per element. */
static double exp_sum(const float *x, int32_t n, float best, float inv_t)
{
    int32_t i = 0;
    double total = 0.0;
#ifdef __AVX512F__
    const __m512 vb = _mm512_set1_ps(best), vt = _mm512_set1_ps(inv_t);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        /* Non-finite logits (masked tokens) contribute nothing. */
        __mmask16 ok = _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
        __m512 e = simd_exp_neg(_mm512_mul_ps(_mm512_sub_ps(v, vb), vt));
        acc = _mm512_mask_add_ps(acc, ok, acc, e);
    }
    total = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++)
        if (isfinite(x[i]))
            total += expf((x[i] - best) * inv_t);
    return total;
}

/* The nucleus of a flat distribution without sorting it: probabilities
 * bucketed by log-ratio to the best (monotone, so every token of an earlier
 * bucket precedes every token of a later one in sorted order); only the
 * bucket where min_p or top_p cuts is sorted. Exactly the sorted-order
 * nucleus, in O(vocab). Returns -1 when there is nothing to draw from. */
#define HIST_BINS 4096
#define HIST_RANGE 30.0f

static int32_t sample_histogram(dp_sampler *s, const dp_sampling *sp, dp_rng *rng,
                                const float *logits, float best, float inv_t)
{
    static _Thread_local double mass[HIST_BINS];
    const int32_t V = s->vocab;
    const float scale = HIST_BINS / HIST_RANGE;
    float *p = s->probs;
    memset(mass, 0, sizeof mass);
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) {
        float x = (best - logits[i]) * inv_t; /* >= 0; NaN and -inf fail the test */
        if (x < HIST_RANGE) {
            p[i] = expf(-x);
            mass[(int32_t)(x * scale)] += p[i];
            total += p[i];
        } else {
            p[i] = 0.0f;
        }
    }
    /* min_p keeps p >= min_p * p_best (p_best = 1 here): a cut in x. */
    float x_min = sp->min_p > 0.0f ? -logf(sp->min_p) : HIST_RANGE;
    int32_t last = x_min < HIST_RANGE ? (int32_t)(x_min * scale) : HIST_BINS - 1;
    int32_t bb = last;
    double before = 0.0, target = sp->top_p < 1.0f ? sp->top_p * total : INFINITY;
    for (int32_t b = 0; b <= last; b++) {
        if (before + mass[b] >= target) {
            bb = b;
            break;
        }
        before += mass[b];
    }
    /* Tokens of earlier buckets are in; the boundary bucket is sorted. */
    struct dp_cand *c = s->cand;
    int32_t n_in = 0, n_edge = 0;
    for (int32_t i = 0; i < V; i++) {
        if (p[i] <= 0.0f)
            continue;
        int32_t b = (int32_t)((best - logits[i]) * inv_t * scale);
        if (b < bb)
            c[n_in++] = (struct dp_cand){i, logits[i] * inv_t, p[i]};
    }
    struct dp_cand *edge = c + n_in;
    for (int32_t i = 0; i < V; i++) {
        if (p[i] <= 0.0f)
            continue;
        int32_t b = (int32_t)((best - logits[i]) * inv_t * scale);
        if (b == bb)
            edge[n_edge++] = (struct dp_cand){i, logits[i] * inv_t, p[i]};
    }
    qsort(edge, (size_t)n_edge, sizeof *edge, cand_desc);
    int32_t take = 0;
    double cum = before;
    const float floor_p = sp->min_p > 0.0f ? sp->min_p : 0.0f;
    while (take < n_edge && edge[take].p >= floor_p) {
        cum += edge[take].p;
        take++;
        if (cum >= target)
            break;
    }
    int32_t n = n_in + take;
    if (n == 0)
        return -1;
    return draw(c, n, rng);
}

/* Candidates whose scaled logit is this far below the best carry a
 * probability ratio under e^-30 (1e-13): over any vocabulary their total mass
 * is below float32 resolution, so dropping them changes no draw, and it
 * spares an exp() for almost every token of the vocabulary. */
#define NEGLIGIBLE_LOGIT 30.0f

int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return sampler_argmax(logits, s->vocab);
    struct dp_cand *c = s->cand;
    float best = max_finite(logits, s->vocab);
    if (!isfinite(best))
        return sampler_argmax(logits, s->vocab);
    const float inv_t = 1.0f / sp->temperature, mx = best * inv_t;
    bool trunc_p = sp->min_p > 0.0f || sp->top_p < 1.0f;
    if (trunc_p && sp->top_k <= 0) {
        /* The common OpenAI case (top_p and/or min_p): the nucleus is decided
         * by the few tokens near the top. Collect those within `tier`
         * (in units of temperature) of the best, against the denominator
         * over the whole vocabulary; widen once if that is not enough. */
        double total = exp_sum(logits, s->vocab, best, inv_t);
        for (float tier = 6.0f; tier <= 6.0f; tier += 6.0f) {
            const float thr = best - tier * sp->temperature;
            int32_t m = 0;
            for (int32_t i = 0; i < s->vocab; i++)
                m += logits[i] >= thr;
            if (m > 2048)
                break; /* flat: sorting would cost more than the histogram */
            m = 0;
            for (int32_t i = 0; i < s->vocab; i++)
                if (logits[i] >= thr)
                    c[m++] = (struct dp_cand){i, logits[i] * inv_t, 0.0f};
            qsort(c, (size_t)m, sizeof *c, cand_desc);
            for (int32_t i = 0; i < m; i++)
                c[i].p = expf(c[i].logit - mx);
            /* Every uncollected token has p < e^-tier (relative to the best). */
            int32_t cut = m;
            bool decided = false;
            if (sp->min_p > 0.0f) {
                float floor_p = sp->min_p * c[0].p;
                for (int32_t i = 1; i < m; i++)
                    if (c[i].p < floor_p) {
                        cut = i;
                        decided = true;
                        break;
                    }
                if (!decided && floor_p >= expf(-tier))
                    decided = true; /* the floor lies below what was collected */
            }
            if (sp->top_p < 1.0f) {
                double cum = 0.0, target = sp->top_p * total;
                bool hit = false;
                for (int32_t i = 0; i < cut; i++) {
                    cum += c[i].p;
                    if (cum >= target) {
                        cut = i + 1;
                        hit = true;
                        break;
                    }
                }
                decided = hit || decided;
            }
            if (decided)
                return draw(c, cut, rng);
        }
        /* A wide nucleus: decide it by histogram instead of sorting. */
        int32_t t = sample_histogram(s, sp, rng, logits, best, inv_t);
        if (t >= 0)
            return t;
    }
    const float cutoff = best - NEGLIGIBLE_LOGIT * sp->temperature;
    int32_t n = 0;
    for (int32_t i = 0; i < s->vocab; i++)
        if (logits[i] >= cutoff)
            c[n++] = (struct dp_cand){i, logits[i] * inv_t, 0.0f};
    if (n == 0)
        return sampler_argmax(logits, s->vocab);
    int32_t K = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
    if (!trunc_p) {
        /* No probability truncation: no order needed, only the top-k set. */
        if (K < n)
            select_top(c, n, K);
        for (int32_t i = 0; i < K; i++)
            c[i].p = expf(c[i].logit - mx);
        return draw(c, K, rng);
    }
    /* Probability truncation keeps a prefix of the sorted candidates: sort
     * only the best M, and widen M (8x at a time) until the cut falls inside
     * it. Real nuclei are usually a few hundred tokens; a flat one costs a
     * few O(n) selections instead of a full sort. */
    if (K < n)
        select_top(c, n, K);
    double total = 0.0;
    for (int32_t i = 0; i < K; i++)
        total += (c[i].p = expf(c[i].logit - mx));
    for (int32_t M = K < FAST_CANDIDATES ? K : FAST_CANDIDATES;; M = M * 8 < K ? M * 8 : K) {
        if (M < K)
            select_top(c, K, M);
        qsort(c, (size_t)M, sizeof *c, cand_desc);
        int32_t cut = M;
        bool decided = M == K;
        if (sp->min_p > 0.0f) {
            float floor_p = sp->min_p * c[0].p;
            for (int32_t i = 1; i < M; i++)
                if (c[i].p < floor_p) {
                    cut = i;
                    decided = true;
                    break;
                }
        }
        if (sp->top_p < 1.0f) {
            double cum = 0.0, target = sp->top_p * total;
            for (int32_t i = 0; i < cut; i++) {
                cum += c[i].p;
                if (cum >= target) {
                    cut = i + 1;
                    decided = true;
                    break;
                }
            }
        }
        if (decided)
            return draw(c, cut, rng);
    }
}

void sampler_apply_bias(float *logits, int32_t vocab, const int32_t *ids, const float *bias,
                        int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < vocab)
            logits[ids[i]] += bias[i];
}

void sampler_apply_penalties(dp_sampler *s, const dp_sampling *sp, float *logits,
                             const int32_t *prompt, int32_t n_prompt, const int32_t *gen,
                             int32_t n_gen)
{
    const float rep = sp->repetition_penalty;
    const bool use_rep = rep > 0.0f && rep != 1.0f;
    const bool use_pf = sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
    if (!use_rep && !use_pf)
        return;
    /* counts[t]: bit 30 marks "seen anywhere" for the repetition penalty, the
     * low bits count generated occurrences. Reset afterwards by walking the
     * same lists, so the cost is O(tokens), not O(vocab). */
    const int32_t SEEN = 1 << 30;
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < s->vocab)
            s->counts[prompt[i]] |= SEEN;
    for (int32_t i = 0; i < n_gen; i++)
        if (gen[i] >= 0 && gen[i] < s->vocab)
            s->counts[gen[i]] = (s->counts[gen[i]] | SEEN) + 1;
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *list = pass ? gen : prompt;
        int32_t n = pass ? n_gen : n_prompt;
        for (int32_t i = 0; i < n; i++) {
            int32_t t = list[i];
            if (t < 0 || t >= s->vocab || s->counts[t] == 0)
                continue;
            int32_t c = s->counts[t] & (SEEN - 1);
            if (use_rep)
                logits[t] = logits[t] > 0 ? logits[t] / rep : logits[t] * rep;
            if (use_pf && c > 0)
                logits[t] -= sp->presence_penalty + sp->frequency_penalty * (float)c;
            s->counts[t] = 0; /* each distinct token once; also resets the scratch */
        }
    }
}

float sampler_logprobs(dp_sampler *s, const float *logits, int32_t token, int32_t k,
                       int32_t *top_ids, float *top_lp)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < s->vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0.0;
    for (int32_t i = 0; i < s->vocab; i++)
        sum += exp((double)logits[i] - mx);
    const float lse = mx + (float)log(sum);
    if (k > 0) {
        /* Insertion into a k-sized sorted list: k is at most 20. */
        int32_t n = 0;
        for (int32_t i = 0; i < s->vocab; i++) {
            float v = logits[i];
            if (n == k && v <= top_lp[n - 1])
                continue;
            int32_t j = n < k ? n++ : k - 1;
            while (j > 0 && top_lp[j - 1] < v) {
                top_lp[j] = top_lp[j - 1];
                top_ids[j] = top_ids[j - 1];
                j--;
            }
            top_lp[j] = v;
            top_ids[j] = i;
        }
        for (int32_t i = 0; i < n; i++)
            top_lp[i] -= lse;
    }
    float lp = logits[token] - lse;
    return lp > 0.0f ? 0.0f : lp;
}
