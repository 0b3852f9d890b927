/* sampler.c: sampling a token from sorted candidates (what logits_topk
 * returns) or from a whole logits row, with one semantics for both: the row
 * path computes the same candidates on the host and only walks the rest of
 * the row when they do not settle the draw. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

#include "kernels/backend.h"
#include "kernels/topk.h"

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

/* Scratch of the full-row fallback: the row's weighted tokens, a histogram of
 * them by scaled logit, and one bucket sorted by key. */
#define HIST_BINS 4096
#define HIST_SCALE ((float)HIST_BINS / DP_TOPK_TCUT)

struct dp_cand {
    uint64_t key;
    uint64_t w;
};

int sampler_init(dp_sampler *s, int32_t vocab)
{
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    const size_t n = (size_t)vocab, ns = n + DP_TOPK_SLACK;
    s->counts = calloc(n, sizeof *s->counts);
    s->cand = malloc(n * sizeof *s->cand);
    s->w_id = malloc(ns * sizeof *s->w_id);
    s->w_w = malloc(ns * sizeof *s->w_w);
    s->w_t = malloc(ns * sizeof *s->w_t);
    s->w_b = malloc(n * sizeof *s->w_b);
    s->b_id = malloc(n * sizeof *s->b_id);
    s->b_w = malloc(n * sizeof *s->b_w);
    s->h_cnt = malloc(HIST_BINS * sizeof *s->h_cnt);
    s->h_off = malloc(HIST_BINS * sizeof *s->h_off);
    s->h_mass = malloc(HIST_BINS * sizeof *s->h_mass);
    return s->counts && s->cand && s->w_id && s->w_w && s->w_t && s->w_b && s->b_id && s->b_w &&
                   s->h_cnt && s->h_off && s->h_mass
               ? 0
               : DP_ENOMEM;
}

void sampler_destroy(dp_sampler *s)
{
    free(s->counts);
    free(s->cand);
    free(s->w_id);
    free(s->w_w);
    free(s->w_t);
    free(s->w_b);
    free(s->b_id);
    free(s->b_w);
    free(s->h_cnt);
    free(s->h_off);
    free(s->h_mass);
    memset(s, 0, sizeof *s);
}

int32_t sampler_argmax(const float *logits, int32_t vocab) { return dp_topk_argmax(logits, vocab); }

bool sampling_exact_unmasked(const dp_sampling *sp, int32_t vocab)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return true;
    return (sp->top_k <= 0 || sp->top_k >= vocab) && sp->top_p >= 1.0f && sp->min_p <= 0.0f;
}

bool sampling_needs_row(const dp_sampling *sp)
{
    const float rep = sp->repetition_penalty;
    return (rep > 0.0f && rep != 1.0f) || sp->presence_penalty != 0.0f ||
           sp->frequency_penalty != 0.0f;
}

/* ---- one sampling semantics -------------------------------------------------
 * Over the row in key order (kernels/topk.h: logit descending, lower id
 * first) with integer weights W_i (the max weighs 2^44, weights below e^-30
 * of it are 0) and prefix sums M(n) = W_0 + ... + W_{n-1}, exact:
 *   top_k:  the first K = top_k tokens (when 0 < top_k < vocab);
 *   min_p:  the tokens with x = (max - l) / T <= -log(min_p) (a prefix, and
 *           never less than the max);
 *   top_p:  the first n with M(n) >= ceil(top_p * base), within the two cuts
 *           above; base is M(K) with top_k, else the reported row sum S;
 *   draw:   one uniform u per sample; total is M(nucleus) when anything
 *           truncates, else S; the token is the first i with
 *           M(i + 1) > floor(u * total) (the nucleus' last if none: S may
 *           round above the exact sum).
 * Weighted tokens only: a zero weight is never drawn. Every quantity is an
 * exact integer or one IEEE operation on the same inputs, so the candidate
 * path (a sequential walk over a sorted prefix) and the fallback (buckets of
 * the whole row, one bucket sorted at a time) reach the same token, and the
 * answer does not depend on how many candidates there were. */

static uint64_t topp_target(float top_p, uint64_t base)
{
    const double v = ceil((double)top_p * (double)base);
    return v > 0.0 ? (uint64_t)v : 0;
}

static uint64_t draw_target(double u, uint64_t total) { return (uint64_t)(u * (double)total); }

/* -log(min_p) as the largest admitted x (never below 0: the max is always in). */
static float minp_xmax(float min_p) { return fmaxf(-logf(min_p), 0.0f); }

int32_t sampler_sample_candidates(const dp_sampling *sp, dp_rng *rng, const int32_t *ids,
                                  const float *vals, int32_t k, int32_t vocab, float max,
                                  float sum, dp_sample_pending *pd)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1 || !isfinite(max))
        return ids[0];
    const double u = rng_uniform(rng);
    pd->u = u;
    pd->max = max;
    pd->sum = sum;
    if (k > vocab)
        k = vocab;
    if (k > DP_TOPK_MAX)
        k = DP_TOPK_MAX; /* a prefix of the order is as good as the whole */
    const float inv_t = 1.0f / sp->temperature;
    const bool topk_on = sp->top_k > 0 && sp->top_k < vocab;
    const bool minp_on = sp->min_p > 0.0f, topp_on = sp->top_p < 1.0f;
    const float xmax = minp_on ? minp_xmax(sp->min_p) : INFINITY;
    uint64_t M[DP_TOPK_MAX + 1];
    M[0] = 0;
    int32_t P = 0, nm = -1; /* weighted candidates; the min_p cut when seen */
    for (; P < k; P++) {
        const float t = (vals[P] - max) * inv_t;
        if (!(t > -DP_TOPK_TCUT))
            break;
        if (nm < 0 && P > 0 && -t > xmax)
            nm = P;
        M[P + 1] = M[P] + dp_topk_weight(t);
    }
    if (P == 0)
        return ids[0]; /* no weight at all: a NaN or infinite 1/T */
    /* Complete: every weighted token of the row is a candidate. Otherwise a
     * cut not seen among the candidates lies beyond them (-1: unknown). */
    const bool complete = P < k || k >= vocab;
    int32_t nk = topk_on && sp->top_k <= P ? sp->top_k : complete ? P : -1;
    if (nm < 0 && (complete || !minp_on))
        nm = complete ? P : -1;
    int32_t n1 = nk < 0 ? nm : nm < 0 ? nk : nk < nm ? nk : nm;
    int32_t n = n1;
    if (topp_on) {
        if (topk_on && nk < 0)
            return DP_SAMPLE_UNDECIDED; /* top_k beyond the candidates: M(K) unknown */
        const uint64_t target = topp_target(sp->top_p, topk_on ? M[nk] : dp_topk_sum_units(sum));
        const int32_t lim = n1 >= 0 ? n1 : P;
        n = -1;
        for (int32_t i = 1; i <= lim; i++)
            if (M[i] >= target) {
                n = i;
                break;
            }
        const uint64_t s_units = dp_topk_sum_units(sum);
        if (n < 0 && n1 < 0 && !topk_on && !minp_on && target < s_units - (s_units >> 20) - 2) {
            /* The nucleus ends past the candidates, at some n with
             * target <= M(n) < target + W_{n-1} (the target is reached: it
             * is below the exact sum, which S matches to float precision),
             * and a token past the candidates weighs at most about W_{k-1}
             * (its logit is no larger; the polynomial's error is 2e-7, the
             * margin far more). If every total in that range puts the draw
             * on the same candidate, that is the token. */
            const uint64_t wk = M[P] - M[P - 1], bound = wk + (wk >> 10) + 2;
            const uint64_t lo = draw_target(u, target), hi = draw_target(u, target + bound - 1);
            for (int32_t i = 1; i <= P; i++)
                if (M[i] > lo)
                    return M[i] > hi ? ids[i - 1] : DP_SAMPLE_UNDECIDED;
            return DP_SAMPLE_UNDECIDED;
        }
        if (n < 0 && (n = n1) < 0)
            return DP_SAMPLE_UNDECIDED; /* the nucleus is wider than the candidates */
    }
    const bool truncated = topk_on || minp_on || topp_on;
    if (truncated && n < 0)
        return DP_SAMPLE_UNDECIDED;
    const uint64_t total = truncated ? M[n] : dp_topk_sum_units(sum);
    const uint64_t target = draw_target(u, total);
    const int32_t lim = n >= 0 ? n : P;
    for (int32_t i = 1; i <= lim; i++)
        if (M[i] > target)
            return ids[i - 1];
    /* Past the candidates: the draw lands in the tail (or past the exact
     * sum, which only the whole row can tell). */
    return n >= 0 ? ids[n - 1] : DP_SAMPLE_UNDECIDED;
}

/* ---- the fallback: the same walk over the whole row ---------------------- */

typedef struct rest_ctx {
    dp_sampler *s;
    const float *x;
    int32_t P;        /* weighted tokens */
    int32_t b_sorted; /* the bucket now sorted in s->cand (-1: none) */
} rest_ctx;

static int32_t bucket_of(float xv)
{
    const int32_t b = (int32_t)(xv * HIST_SCALE);
    return b < HIST_BINS ? b : HIST_BINS - 1;
}

static int cand_desc(const void *a, const void *b)
{
    const uint64_t x = ((const struct dp_cand *)a)->key, y = ((const struct dp_cand *)b)->key;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Bucket b's tokens in key order. x = -t is monotone along the key order and
 * so is its bucket: every token of an earlier bucket precedes every token of
 * a later one. */
static const struct dp_cand *bucket_sorted(rest_ctx *c, int32_t b)
{
    dp_sampler *s = c->s;
    if (c->b_sorted == b)
        return s->cand;
    const int32_t o = s->h_off[b], n = s->h_cnt[b];
    for (int32_t j = 0; j < n; j++) {
        const int32_t id = s->b_id[o + j];
        s->cand[j] = (struct dp_cand){dp_topk_key(c->x[id], id), s->b_w[o + j]};
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, cand_desc);
    c->b_sorted = b;
    return s->cand;
}

/* M(n). */
static uint64_t mass_prefix(rest_ctx *c, int32_t n)
{
    const int32_t *cnt = c->s->h_cnt;
    const uint64_t *mass = c->s->h_mass;
    int32_t acc = 0;
    uint64_t m = 0;
    for (int32_t b = 0; b < HIST_BINS && acc < n; b++) {
        if (acc + cnt[b] <= n) {
            acc += cnt[b];
            m += mass[b];
            continue;
        }
        const struct dp_cand *sc = bucket_sorted(c, b);
        for (int32_t j = 0; acc < n; j++, acc++)
            m += sc[j].w;
    }
    return m;
}

/* The smallest n in [1, lim] with M(n) >= target, or lim; *id: token n - 1. */
static int32_t first_reaching(rest_ctx *c, int32_t lim, uint64_t target, int32_t *id)
{
    const int32_t *cnt = c->s->h_cnt;
    const uint64_t *mass = c->s->h_mass;
    int32_t acc = 0;
    uint64_t m = 0;
    for (int32_t b = 0; b < HIST_BINS; b++) {
        if (!cnt[b])
            continue;
        if (acc + cnt[b] < lim && m + mass[b] < target) {
            acc += cnt[b];
            m += mass[b];
            continue;
        }
        const struct dp_cand *sc = bucket_sorted(c, b);
        for (int32_t j = 0; j < cnt[b]; j++) {
            m += sc[j].w;
            acc++;
            if (m >= target || acc == lim) {
                *id = dp_topk_key_id(sc[j].key);
                return acc;
            }
        }
    }
    return acc; /* lim > P: not reached by callers */
}

int32_t sampler_sample_rest(dp_sampler *s, const dp_sampling *sp, const dp_sample_pending *pd,
                            const float *logits)
{
    const float inv_t = 1.0f / sp->temperature;
    rest_ctx c = {s, logits, 0, -1};
    c.P = dp_topk_weights(logits, s->vocab, pd->max, inv_t, s->w_id, s->w_w, s->w_t);
    if (c.P == 0)
        return sampler_argmax(logits, s->vocab); /* not this row's summary */
    memset(s->h_cnt, 0, HIST_BINS * sizeof *s->h_cnt);
    memset(s->h_mass, 0, HIST_BINS * sizeof *s->h_mass);
    for (int32_t i = 0; i < c.P; i++) {
        const int32_t b = bucket_of(-s->w_t[i]);
        s->w_b[i] = (uint16_t)b;
        s->h_cnt[b]++;
        s->h_mass[b] += s->w_w[i];
    }
    /* Group the tokens by bucket (a counting sort), so that a bucket is a
     * slice to sort rather than a scan of the row. */
    for (int32_t b = 0, acc = 0; b < HIST_BINS; b++) {
        s->h_off[b] = acc;
        acc += s->h_cnt[b];
    }
    for (int32_t i = 0; i < c.P; i++) {
        const int32_t at = s->h_off[s->w_b[i]]++;
        s->b_id[at] = s->w_id[i];
        s->b_w[at] = s->w_w[i];
    }
    for (int32_t b = 0; b < HIST_BINS; b++)
        s->h_off[b] -= s->h_cnt[b];
    const bool topk_on = sp->top_k > 0 && sp->top_k < s->vocab;
    const bool minp_on = sp->min_p > 0.0f, topp_on = sp->top_p < 1.0f;
    const int32_t nk = topk_on && sp->top_k < c.P ? sp->top_k : c.P;
    int32_t nm = c.P;
    if (minp_on) {
        const float xmax = minp_xmax(sp->min_p);
        if (xmax < DP_TOPK_TCUT) { /* else every weighted token is in */
            const int32_t bx = bucket_of(xmax);
            nm = 0;
            for (int32_t b = 0; b < bx; b++)
                nm += s->h_cnt[b];
            for (int32_t i = 0; i < c.P; i++)
                nm += s->w_b[i] == bx && -s->w_t[i] <= xmax; /* a prefix of bucket bx */
            if (nm < 1)
                nm = 1;
        }
    }
    const int32_t n1 = nk < nm ? nk : nm;
    int32_t n = n1, id = -1;
    if (topp_on) {
        const uint64_t base = topk_on ? mass_prefix(&c, nk) : dp_topk_sum_units(pd->sum);
        n = first_reaching(&c, n1, topp_target(sp->top_p, base), &id);
    }
    const bool truncated = topk_on || minp_on || topp_on;
    const uint64_t total = truncated ? mass_prefix(&c, n) : dp_topk_sum_units(pd->sum);
    first_reaching(&c, n, draw_target(pd->u, total) + 1, &id);
    return id;
}

int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits)
{
    if (sp->temperature <= 0.0f || sp->top_k == 1)
        return sampler_argmax(logits, s->vocab);
    /* The candidates logits_topk would give (the CPU backend runs this very
     * function), then the same decision and, when they do not settle it, the
     * same fallback as the engine's device path. */
    int32_t ids[SAMPLER_CANDIDATES];
    float vals[SAMPLER_CANDIDATES], max, sum;
    const int32_t k = s->vocab < SAMPLER_CANDIDATES ? s->vocab : SAMPLER_CANDIDATES;
    dp_topk_row(logits, s->vocab, k, 1.0f / sp->temperature, ids, vals, &max, &sum);
    dp_sample_pending pd;
    const int32_t t = sampler_sample_candidates(sp, rng, ids, vals, k, s->vocab, max, sum, &pd);
    return t != DP_SAMPLE_UNDECIDED ? t : sampler_sample_rest(s, sp, &pd, logits);
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
