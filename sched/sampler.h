/* sampler.h: turns one row of logits into a token: greedy, or temperature
 * with top-k / top-p / min-p truncation, from a per-sequence seeded RNG so a
 * request's output does not depend on what else shares its batch. */
#ifndef DP_SCHED_SAMPLER_H
#define DP_SCHED_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/rng.h"

typedef struct dp_sampling {
    float temperature;  /* <= 0: greedy */
    int32_t top_k;      /* <= 0: off */
    float top_p;        /* >= 1: off */
    float min_p;        /* <= 0: off */
    float presence_penalty;   /* OpenAI semantics, on generated tokens; 0: off */
    float frequency_penalty;  /* 0: off */
    float repetition_penalty; /* llama.cpp/vLLM semantics, prompt + generated; 1: off */
    uint64_t seed;
} dp_sampling;

void sampling_default(dp_sampling *sp);
/* Sampling draws from the whole temperature-scaled row (greedy, or no
 * top_k / top_p / min_p truncation): then a draw restricted to a subset
 * afterwards has the subset's renormalized probabilities. */
bool sampling_exact_unmasked(const dp_sampling *sp, int32_t vocab);


typedef struct dp_sampler {
    int32_t vocab;
    int32_t *counts;       /* scratch for penalties, vocab entries, kept zeroed */
    /* Scratch of the full-row fallback (sampler.c): the weighted tokens
     * (id, weight, scaled logit, bucket), the same grouped by bucket, the
     * buckets' counts, offsets and masses, and one bucket sorted. */
    struct dp_cand *cand;
    int32_t *w_id;
    uint64_t *w_w;
    float *w_t;
    uint16_t *w_b;
    int32_t *b_id;
    uint64_t *b_w;
    int32_t *h_cnt, *h_off;
    uint64_t *h_mass;
} dp_sampler;

int sampler_init(dp_sampler *s, int32_t vocab);
void sampler_destroy(dp_sampler *s);

/* The largest logit's index in backend.h's logits_topk order (NaN as -inf,
 * lowest index on ties, +0 above -0): the greedy token, ids[0] of the
 * candidates. */
int32_t sampler_argmax(const float *logits, int32_t vocab);

/* Candidates the sampler computes for a row it holds (sampler_sample); any
 * count gives the same tokens, this one only sets how often the rest of the
 * row is walked. */
#define SAMPLER_CANDIDATES 64

/* Samples one token; logits are not modified. Greedy (temperature <= 0 or
 * top_k == 1) draws nothing; anything else draws exactly one uniform. */
int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits);

/* Sampling from candidates (backend.h logits_topk): ids/vals are a row's k
 * best logits in descending order, max and sum its max and weight sum at
 * sp->temperature. Returns the token sampler_sample would give for the row
 * (same token, same RNG use: zero or one draw), or DP_SAMPLE_UNDECIDED when
 * the candidates do not settle it: a top_p / min_p nucleus or top_k wider
 * than k, or a plain temperature draw that lands past the k-th candidate.
 * Then *pd holds the draw and the summary, and sampler_sample_rest on the
 * full row finishes without drawing again. */
#define DP_SAMPLE_UNDECIDED (-1)
typedef struct dp_sample_pending {
    double u;       /* the uniform already drawn */
    float max, sum; /* the summary the decision used */
} dp_sample_pending;
int32_t sampler_sample_candidates(const dp_sampling *sp, dp_rng *rng, const int32_t *ids,
                                  const float *vals, int32_t k, int32_t vocab, float max,
                                  float sum, dp_sample_pending *pd);
int32_t sampler_sample_rest(dp_sampler *s, const dp_sampling *sp, const dp_sample_pending *pd,
                            const float *logits);
/* The request changes logits before sampling (penalties): the row, not the
 * candidates, is what it samples from. (logit_bias is the request's, not
 * dp_sampling's: callers check it too.) */
bool sampling_needs_row(const dp_sampling *sp);

/* Adds bias[i] to logits[ids[i]] (ids outside the vocabulary are ignored). */
void sampler_apply_bias(float *logits, int32_t vocab, const int32_t *ids, const float *bias,
                        int32_t n);
/* Applies the penalties of sp in place: repetition over prompt and generated
 * tokens, presence and frequency over generated tokens only. */
void sampler_apply_penalties(dp_sampler *s, const dp_sampling *sp, float *logits,
                             const int32_t *prompt, int32_t n_prompt, const int32_t *gen,
                             int32_t n_gen);
/* Log-probability of token under softmax(logits), and the k most likely
 * tokens with theirs (k <= vocab, most likely first). */
float sampler_logprobs(dp_sampler *s, const float *logits, int32_t token, int32_t k,
                       int32_t *top_ids, float *top_lp);

#endif
