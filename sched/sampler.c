/* sampler.c: candidate filtering and sampling over a logits row. Sorting is
 * limited to the candidates that survive top-k, so large vocabularies stay
 * cheap when top-k is set. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

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
    return s->cand && s->counts ? 0 : DP_ENOMEM;
}

void sampler_destroy(dp_sampler *s)
{
    free(s->cand);
    free(s->counts);
    s->cand = NULL;
    s->counts = NULL;
}

int32_t sampler_argmax(const float *logits, int32_t vocab)
{
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
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

/* The reference path: sort every candidate. Used when the fast path cannot
 * decide the truncation from the best few hundred candidates. */
static int32_t sample_sorted(struct dp_cand *c, int32_t n, const dp_sampling *sp, dp_rng *rng)
{
    qsort(c, (size_t)n, sizeof *c, cand_desc);
    if (sp->top_k > 0 && sp->top_k < n)
        n = sp->top_k;
    double sum = 0.0;
    float mx = c[0].logit;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)(c[i].p / sum);
    if (sp->min_p > 0.0f) {
        float floor_p = sp->min_p * c[0].p;
        int32_t k = 1;
        while (k < n && c[k].p >= floor_p)
            k++;
        n = k;
    }
    if (sp->top_p < 1.0f) {
        double cum = 0.0;
        int32_t k = 0;
        while (k < n) {
            cum += c[k].p;
            k++;
            if (cum >= sp->top_p)
                break;
        }
        n = k;
    }
    return draw(c, n, rng);
}

#define FAST_CANDIDATES 256

int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return sampler_argmax(logits, s->vocab);
    struct dp_cand *c = s->cand;
    int32_t n = 0;
    float mx = -INFINITY;
    for (int32_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i])) {
            float l = logits[i] / sp->temperature;
            c[n++] = (struct dp_cand){i, l, 0.0f};
            if (l > mx)
                mx = l;
        }
    if (n == 0)
        return sampler_argmax(logits, s->vocab);
    bool trunc_p = sp->min_p > 0.0f || sp->top_p < 1.0f;
    int32_t K = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
    if (!trunc_p) {
        /* No probability truncation: no order needed, only the top-k set. */
        if (K < n)
            select_top(c, n, K);
        for (int32_t i = 0; i < K; i++)
            c[i].p = expf(c[i].logit - mx);
        return draw(c, K, rng);
    }
    /* Probability truncation keeps a prefix of the sorted candidates, which
     * for real models is short: sort only the best M and fall back to the
     * full sort when the cut is not inside them. */
    if (K < n)
        select_top(c, n, K);
    int32_t M = K < FAST_CANDIDATES ? K : FAST_CANDIDATES;
    if (M < K)
        select_top(c, K, M);
    qsort(c, (size_t)M, sizeof *c, cand_desc);
    double total = 0.0;
    for (int32_t i = 0; i < K; i++)
        total += (c[i].p = expf(c[i].logit - mx));
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
    if (!decided)
        return sample_sorted(c, n, sp, rng);
    return draw(c, cut, rng);
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
