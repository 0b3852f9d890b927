/* sampler.h: turns one row of logits into a token: greedy, or temperature
 * with top-k / top-p / min-p truncation, from a per-sequence seeded RNG so a
 * request's output does not depend on what else shares its batch. */
#ifndef DP_SCHED_SAMPLER_H
#define DP_SCHED_SAMPLER_H

#include <stdint.h>

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

typedef struct dp_rng {
    uint64_t s[4];
} dp_rng;

void rng_seed(dp_rng *r, uint64_t seed);
uint64_t rng_next(dp_rng *r);
/* Uniform in [0, 1). */
double rng_uniform(dp_rng *r);

typedef struct dp_sampler {
    int32_t vocab;
    struct dp_cand *cand;  /* scratch, vocab entries */
    int32_t *counts;       /* scratch for penalties, vocab entries, kept zeroed */
    float *probs;          /* scratch: unnormalized probabilities, vocab entries */
} dp_sampler;

int sampler_init(dp_sampler *s, int32_t vocab);
void sampler_destroy(dp_sampler *s);

/* Index of the largest logit (lowest index on ties). */
int32_t sampler_argmax(const float *logits, int32_t vocab);
/* Samples one token; logits are not modified. */
int32_t sampler_sample(dp_sampler *s, const dp_sampling *sp, dp_rng *rng, const float *logits);

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
